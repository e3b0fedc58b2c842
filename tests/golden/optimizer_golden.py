#!/usr/bin/env python3
"""AdamW, RMSprop, LR-schedule and label-smoothing references from PyTorch
for tests/test_optimizer (torch 1.13, CPU, single-tensor optimizer path).

  optimizer_golden.py OUTDIR  writes
  OUTDIR/optimizer.safetensors:
    init.p0 (1000), init.p1 (7, 3)      initial parameters
    grad.<s>.p0, grad.<s>.p1            gradient given at step s (0..5)
    lr                                  (6) learning rate of each step
    adamw<k>.final.p<i>, adamw<k>.<state>.p<i>      after 6 AdamW steps
    rmsprop<k>.final.p<i>, rmsprop<k>.<state>.p<i>  after 6 RMSprop steps
      (<state> as optimizer.state_dict(): exp_avg, exp_avg_sq,
       max_exp_avg_sq, square_avg, momentum_buffer, grad_avg)
    ls.logits (N, K), ls.labels (N) I64, ls<k>.loss (1), ls<k>.grad (N, K)
                                        CrossEntropyLoss(label_smoothing=LS[k])
  OUTDIR/schedules.txt: one line per schedule of SCHEDULES, the lr of
    epochs 0..epochs+3 as %.17g (SequentialLR(LinearLR|ConstantLR, main) as
    torchvision's references/classification/train.py builds it).
The tables below are repeated in test_optimizer.c.
"""
import math
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nn_golden_util as U  # noqa: E402

LRS = [0.01, 0.005, 0.02, 0.001, 0.01, 0.003]
# (beta1, beta2, eps, weight_decay, amsgrad)
ADAMW = [
    (0.9, 0.999, 1e-8, 0.01, False),
    (0.9, 0.999, 1e-8, 0.0, True),
    (0.8, 0.99, 1e-6, 0.1, True),
    (0.5, 0.9, 1e-8, 0.05, False),
]
# (alpha, eps, weight_decay, momentum, centered)
RMSPROP = [
    (0.99, 1e-8, 0.0, 0.0, False),
    (0.9, 1e-8, 0.01, 0.0, False),
    (0.99, 1e-8, 0.0, 0.9, False),
    (0.95, 1e-6, 0.005, 0.0, True),
    (0.99, 1e-8, 0.01, 0.5, True),
]
LS = [0.1, 0.25, 1.0]
# (name, base, epochs, lrf or lr_min, step_size, gamma, milestones, warmup, method, factor)
SCHEDULES = [
    ("cosine", 0.1, 10, 0.01, 0, 0.0, [], 0, "linear", 0.0),
    ("cosine", 0.1, 12, 0.05, 0, 0.0, [], 3, "linear", 0.01),
    ("step", 0.2, 15, 0.0, 3, 0.1, [], 0, "linear", 0.0),
    ("step", 0.2, 15, 0.0, 4, 0.3, [], 2, "constant", 0.1),
    ("multistep", 0.05, 14, 0.0, 0, 0.5, [3, 5, 5, 9], 4, "linear", 0.001),
    ("multistep", 0.05, 10, 0.0, 0, 0.1, [2, 6], 0, "linear", 0.0),
    ("cosine_annealing", 0.1, 10, 0.0, 0, 0.0, [], 0, "linear", 0.0),
    ("cosine_annealing", 0.5, 20, 1e-4, 0, 0.0, [], 5, "linear", 0.01),
    ("cosine_annealing", 0.5, 8, 0.02, 0, 0.0, [], 2, "constant", 0.25),
]
EXTRA_EPOCHS = 3  # evaluated past the end too (cosine_annealing rises again)


def run(make, init, grads, prefix, t):
    params = [p.clone().requires_grad_(True) for p in init]
    frozen = torch.randn(5, requires_grad=False)  # not in the optimizer
    opt = make(params)
    for s, lr in enumerate(LRS):
        for group in opt.param_groups:
            group["lr"] = lr
        for p, g in zip(params, grads[s]):
            p.grad = g.clone()
        opt.step()
    for i, p in enumerate(params):
        t["%s.final.p%d" % (prefix, i)] = p.detach()
        for name, v in opt.state[p].items():
            if name != "step":
                t["%s.%s.p%d" % (prefix, name, i)] = v
    assert not opt.state.get(frozen)


def schedule_lrs(name, base, epochs, lrf, step_size, gamma, milestones, warmup, method, factor):
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=base)
    main_epochs = epochs - warmup
    if name == "cosine":
        lf = lambda e: ((1 + math.cos(e * math.pi / main_epochs)) / 2) * (1 - lrf) + lrf  # noqa: E731
        main = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda=lf)
    elif name == "cosine_annealing":
        main = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=main_epochs, eta_min=lrf)
    elif name == "step":
        main = torch.optim.lr_scheduler.StepLR(opt, step_size=step_size, gamma=gamma)
    else:
        main = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=gamma)
    sched = main
    if warmup > 0:
        if method == "linear":
            w = torch.optim.lr_scheduler.LinearLR(opt, start_factor=factor, total_iters=warmup)
        else:
            w = torch.optim.lr_scheduler.ConstantLR(opt, factor=factor, total_iters=warmup)
        sched = torch.optim.lr_scheduler.SequentialLR(opt, schedulers=[w, main],
                                                      milestones=[warmup])
    lrs = []
    for _ in range(epochs + 1 + EXTRA_EPOCHS):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    warnings.simplefilter("ignore")  # SequentialLR's step(0) deprecation warning
    torch.manual_seed(4321)
    init = [torch.randn(1000), torch.randn(7, 3)]
    grads = [[torch.randn_like(p) for p in init] for _ in LRS]
    t = {"init.p0": init[0], "init.p1": init[1], "lr": torch.tensor(LRS, dtype=torch.float32)}
    for s, g in enumerate(grads):
        t["grad.%d.p0" % s] = g[0]
        t["grad.%d.p1" % s] = g[1]
    for k, (b1, b2, eps, wd, ams) in enumerate(ADAMW):
        run(lambda ps: torch.optim.AdamW(ps, lr=LRS[0], betas=(b1, b2), eps=eps,
                                         weight_decay=wd, amsgrad=ams, foreach=False),
            init, grads, "adamw%d" % k, t)
    for k, (alpha, eps, wd, mom, cen) in enumerate(RMSPROP):
        run(lambda ps: torch.optim.RMSprop(ps, lr=LRS[0], alpha=alpha, eps=eps,
                                           weight_decay=wd, momentum=mom, centered=cen,
                                           foreach=False),
            init, grads, "rmsprop%d" % k, t)
    logits = (torch.randn(9, 6) * 3).requires_grad_(True)
    labels = torch.randint(0, 6, (9,))
    t["ls.logits"] = logits.detach().clone()
    t["ls.labels"] = labels
    for k, e in enumerate(LS):
        if logits.grad is not None:
            logits.grad = None
        loss = torch.nn.CrossEntropyLoss(label_smoothing=e)(logits, labels)
        loss.backward()
        t["ls%d.loss" % k] = loss.detach().reshape(1)
        t["ls%d.grad" % k] = logits.grad.clone()
    U.save(os.path.join(out, "optimizer.safetensors"), t)
    with open(os.path.join(out, "schedules.txt"), "w") as f:
        for s in SCHEDULES:
            f.write(" ".join("%.17g" % v for v in schedule_lrs(*s)) + "\n")


if __name__ == "__main__":
    main()
