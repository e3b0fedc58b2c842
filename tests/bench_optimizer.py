#!/usr/bin/env python3
"""PyTorch twin of tests/bench_optimizer: one CPU step of torch.optim.SGD(momentum 0.9) /
AdamW / RMSprop (defaults, foreach=False) over 25557032 floats, 1 thread, mean of 5."""
import time, torch
torch.set_num_threads(1)
n = 25557032
for name, make in [("sgd", lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, foreach=False)),
                   ("adamw", lambda ps: torch.optim.AdamW(ps, foreach=False)),
                   ("rmsprop", lambda ps: torch.optim.RMSprop(ps, foreach=False))]:
    p = torch.nn.Parameter(torch.arange(n, dtype=torch.float32) % 97 * 0.01)
    p.grad = torch.arange(n, dtype=torch.float32) % 89 * 0.001 - 0.04
    opt = make([p]); opt.step()
    t0 = time.perf_counter()
    for _ in range(5): opt.step()
    t = (time.perf_counter() - t0) / 5
    print("%-8s torch 1 thread  %8.1f ms/step  %6.1f Mparam/s" % (name, t * 1e3, n / t / 1e6))
