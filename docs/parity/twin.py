import sys, os, torch, numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../tests/golden'))
from ddp_pytorch import load_safetensors, save_safetensors, make_model, read_idx
import argparse
torch.set_num_threads(int(os.environ.get('T','1')))
mode=sys.argv[1]; out=sys.argv[2]
a=argparse.Namespace(num_classes=10,in_channels=1)
D='/usr/share/datasets/fashion-mnist'
x_all=torch.from_numpy(read_idx(D+'/train-images-idx3-ubyte.gz')[:192].copy()).unsqueeze(1).float().div(255).sub(0.2860).div(0.3530)
y_all=torch.from_numpy(read_idx(D+'/train-labels-idx1-ubyte.gz')[:192].astype(np.int64))
ds=torch.utils.data.TensorDataset(x_all,y_all)
s=torch.utils.data.distributed.DistributedSampler(ds,num_replicas=1,rank=0,shuffle=True,seed=0); s.set_epoch(0)
L=torch.utils.data.DataLoader(ds,batch_sampler=torch.utils.data.BatchSampler(s,64,drop_last=True))
m=make_model(a); m.load_state_dict(load_safetensors(sys.argv[3] if len(sys.argv) > 3 else 'init.safetensors')); m.train()
if mode=='f64': m.double()
opt=torch.optim.SGD(m.parameters(),lr=0.002,momentum=0,weight_decay=0)
hk=None
if mode=='nudge':
    def _h(mod,i,o):
        d=torch.zeros_like(o); d[54,240,1,1]=2e-6; return o+d
    hk=m.layer3[1].bn2.register_forward_hook(_h)
for st,(x,y) in enumerate(L):
    if st==1 and hk is not None: hk.remove()
    if mode=='ulp': x=torch.nextafter(x,torch.full_like(x,float('inf')))
    if mode=='ulpdown': x=torch.nextafter(x,torch.full_like(x,float('-inf')))
    if mode=='w1ulp' and st==0:
        with torch.no_grad(): w=m.fc.bias; w[0]=torch.nextafter(w[0],torch.tensor(1.0))
    if mode=='f64': x=x.double()
    loss=torch.nn.functional.cross_entropy(m(x),y); opt.zero_grad(); loss.backward(); opt.step()
    print('%.9g'%loss.item())
save_safetensors(out,{k:v.float() if v.is_floating_point() else v for k,v in m.state_dict().items()})
