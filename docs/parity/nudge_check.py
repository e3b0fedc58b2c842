import os, sys, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../tests/golden'))
from ddp_pytorch import load_safetensors, make_model
import argparse
torch.set_num_threads(2)
a=argparse.Namespace(num_classes=10,in_channels=1)
init=load_safetensors('init.safetensors'); b=load_safetensors('batch.safetensors')
cg=load_safetensors('cgrads.safetensors'); pg=load_safetensors('grads.safetensors')
def err(g1,g2):
    best=(0,None)
    for k in g2:
        e=((g1[k]-g2[k]).abs().max()/g2[k].abs().max()).item()
        if e>best[0]: best=(e,k)
    l2=(sum(((g1[k]-g2[k])**2).sum() for k in g2)/sum((g2[k]**2).sum() for k in g2)).sqrt().item()
    return 'max per-tensor rel %.3e (%s), global L2 rel %.3e'%(best[0],best[1],l2)
def run(nudge):
    m=make_model(a); m.load_state_dict(init); m.train()
    def add(idx,eps):
        def h(mod,i,o):
            o=o.clone(); 
            with torch.no_grad(): pass
            d=torch.zeros_like(o); d[idx]=eps; return o+d
        return h
    pre={}
    if nudge:
        m.layer3[1].bn1.register_forward_hook(add((48,75,1,0),1e-6))
        m.layer4[1].bn2.register_forward_hook(add((31,372,0,0),3e-6))
    m.layer3[1].relu.register_forward_pre_hook(lambda mod,i: (pre.setdefault('l3', i[0][48,75,1,0].item()), None)[1])
    out=m(b['x']); loss=torch.nn.functional.cross_entropy(out,b['y']); loss.backward()
    print('   pre-relu layer3.1.bn1[48,75,1,0] = %.3e'%pre['l3'])
    return {k:p.grad for k,p in m.named_parameters()}
g0=run(False); print('cohort vs pytorch:                    ', err(cg,g0))
g1=run(True);  print('cohort vs pytorch with 2 ReLUs nudged:', err(cg,g1)); print('pytorch nudged vs pytorch:            ', err(g1,g0))
