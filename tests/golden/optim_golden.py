#!/usr/bin/env python3
"""SGD and cosine-LR references from PyTorch for tests/test_optim.

  optim_golden.py OUTDIR  writes OUTDIR/sgd.safetensors:
    init.p0 (1000), init.p1 (7, 3)       initial parameters
    grad.<s>.p0, grad.<s>.p1             the gradient given at step s (0..4)
    lr                                   (5) learning rate per step
    c<k>.final.p<i>                      parameters after 5 torch.optim.SGD steps
    c<k>.buf.p<i>                        momentum_buffer after those steps
  for every option combination k of COMBOS (same table in test_optim.c), and
    cosine                               (21) LambdaLR lr for epochs 0..20 of a
                                         20-epoch schedule, base 0.02, lrf 0.01
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nn_golden_util as U  # noqa: E402

# (momentum, dampening, weight_decay, nesterov)
COMBOS = [
    (0.0, 0.0, 0.0, False),
    (0.0, 0.0, 0.005, False),
    (0.9, 0.0, 0.0, False),
    (0.9, 0.0, 0.005, False),
    (0.9, 0.1, 0.005, False),
    (0.9, 0.0, 0.005, True),
    (0.5, 0.3, 0.01, False),
    (0.9, 0.0, 0.0, True),
]
LRS = [0.1, 0.05, 0.02, 0.1, 0.01]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(1234)
    init = [torch.randn(1000), torch.randn(7, 3)]
    grads = [[torch.randn_like(p) for p in init] for _ in LRS]
    t = {"init.p0": init[0], "init.p1": init[1], "lr": torch.tensor(LRS, dtype=torch.float32)}
    for s, g in enumerate(grads):
        t["grad.%d.p0" % s] = g[0]
        t["grad.%d.p1" % s] = g[1]
    for k, (mom, damp, wd, nest) in enumerate(COMBOS):
        params = [p.clone().requires_grad_(True) for p in init]
        opt = torch.optim.SGD(params, lr=LRS[0], momentum=mom, dampening=damp,
                              weight_decay=wd, nesterov=nest)
        for s, lr in enumerate(LRS):
            for group in opt.param_groups:
                group["lr"] = lr
            for p, g in zip(params, grads[s]):
                p.grad = g.clone()
            opt.step()
        for i, p in enumerate(params):
            t["c%d.final.p%d" % (k, i)] = p.detach()
            st = opt.state[p]
            if "momentum_buffer" in st and st["momentum_buffer"] is not None:
                t["c%d.buf.p%d" % (k, i)] = st["momentum_buffer"]
    # cosine LambdaLR of the seed recipe
    epochs, lrf, base = 20, 0.01, 0.02
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=base)
    lf = lambda e: ((1 + math.cos(e * math.pi / epochs)) / 2) * (1 - lrf) + lrf  # noqa: E731
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda=lf)
    lrs = []
    for e in range(epochs + 1):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    t["cosine"] = torch.tensor(lrs, dtype=torch.float64).float()
    U.save(os.path.join(out, "sgd.safetensors"), t)
    # exact double values for the schedule, as text
    with open(os.path.join(out, "cosine.txt"), "w") as f:
        for v in lrs:
            f.write("%.17g\n" % v)


if __name__ == "__main__":
    main()
