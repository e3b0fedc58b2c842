import os, sys, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../tests/golden'))
from ddp_pytorch import load_safetensors, make_model
import argparse
torch.set_num_threads(2)
a=argparse.Namespace(num_classes=10,in_channels=1)
init=load_safetensors('init.safetensors'); b=load_safetensors('batch.safetensors')
c=load_safetensors('cact2.safetensors')
def pre_relu(dtype):
    m=make_model(a); m.load_state_dict(init); m.train(); m.to(dtype)
    P={}
    m.bn1.register_forward_hook(lambda mod,i,o: P.__setitem__('bn1',o.detach().clone()))
    for l in range(1,5):
        for bi in range(2):
            blk=getattr(m,f'layer{l}')[bi]; n=f'layer{l}.{bi}'
            blk.bn1.register_forward_hook(lambda mod,i,o,n=n: P.__setitem__(n+'.bn1',o.detach().clone()))
            # pre-relu of block output: bn2 out + identity; hook relu input: relu is shared in block (called twice)
            def rh(mod,i,o,n=n):
                k=n+'.bn1' if (n+'.bn1')+'#' not in P else n
                P[(n+'.bn1')+'#' if k.endswith('bn1') else n+'#']=1
                if not k.endswith('bn1'): P[n]=i[0].detach().clone()
            blk.relu.register_forward_pre_hook(lambda mod,i,n=n: rh(mod,i,None,n))
    m(b['x'].to(dtype)); return P
p32=pre_relu(torch.float32); p64=pre_relu(torch.float64)
for k in c:
    if k=='maxpool': continue
    cv=c[k]; a32=p32[k]; a64=p64[k]
    mc=cv>0; m32=a32>0; m64=a64>0
    d1=(mc!=m32).nonzero().tolist(); d2=(mc!=m64).nonzero().tolist(); d3=(m32!=m64).nonzero().tolist()
    print(f"{k:14s} flips cohort-vs-pt32 {len(d1)} cohort-vs-pt64 {len(d2)} pt32-vs-pt64 {len(d3)}")
    for idx in set(map(tuple,d1+d2+d3)):
        print('    ',idx,'cohort %.3e pt32 %.3e pt64 %.3e'%(cv[idx].item(),a32[idx].item(),a64[idx].item()))
