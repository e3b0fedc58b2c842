import os, sys, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../tests/golden'))
from ddp_pytorch import load_safetensors, make_model
import argparse
torch.set_num_threads(2)
a=argparse.Namespace(num_classes=10,in_channels=1)
init=load_safetensors('init.safetensors'); b=load_safetensors('batch.safetensors')
cg=load_safetensors('cgrads.safetensors')
def run(x, init=init, dtype=torch.float32):
    m=make_model(a); m.load_state_dict(init); m.train(); m.to(dtype)
    out=m(x.to(dtype)); loss=torch.nn.functional.cross_entropy(out,b['y']); loss.backward()
    return loss.item(), {k:p.grad.float() for k,p in m.named_parameters()}
def err(g1,g2):
    best=(0,None)
    for k in g2:
        e=((g1[k]-g2[k]).abs().max()/g2[k].abs().max()).item()
        if e>best[0]: best=(e,k)
    l2=(sum(((g1[k]-g2[k])**2).sum() for k in g2)/sum((g2[k]**2).sum() for k in g2)).sqrt().item()
    return 'max per-tensor rel %.3e (%s), global L2 rel %.3e'%(best[0],best[1],l2)
x=b['x']
l0,g0=run(x); l64,g64=run(x,dtype=torch.float64)
print('cohort   vs pt32:', err(cg,g0)); print('cohort   vs pt64:', err(cg,g64)); print('pt32     vs pt64:', err(g0,g64))
xu=torch.nextafter(x, torch.full_like(x, float('inf')))
l1,g1=run(xu); print('pt32(x+1ulp all pixels) vs pt32: loss %.8f vs %.8f;'%(l1,l0), err(g1,g0))
torch.set_num_threads(1); l2,g2=run(x); print('pt32 1 thread vs 2 threads:', err(g2,g0)); torch.set_num_threads(2)
# 1-ulp change of a single weight
i2=dict(init); w=i2['layer4.1.conv2.weight'].clone(); w.view(-1)[0]=torch.nextafter(w.view(-1)[0],torch.tensor(1.0)); i2['layer4.1.conv2.weight']=w
l3,g3=run(x,i2); print('pt32 layer4.1.conv2.weight[0] +1ulp vs pt32:', err(g3,g0))
i3=dict(init); w=i3['conv1.weight'].clone(); w.view(-1)[0]=torch.nextafter(w.view(-1)[0],torch.tensor(1.0)); i3['conv1.weight']=w
l4,g4=run(x,i3); print('pt32 conv1.weight[0] +1ulp vs pt32:', err(g4,g0))
