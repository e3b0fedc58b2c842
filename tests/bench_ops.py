#!/usr/bin/env python3
"""PyTorch twin of tests/bench_ops.c: torchvision resnet18 (1 input channel,
10 classes) on 1x28x28 images, forward + cross-entropy + backward (all
parameter gradients, no optimizer step), training mode.

Usage: bench_ops.py [batch=64] [steps=20] [threads=1] [profile=0]
Prints the median step time and images/s; with profile=1 also the
self-CPU time per ATen op kind from torch.profiler (one profiled step run
after the timed ones, so the timing is not disturbed).
"""
import statistics
import sys
import time

import torch
import torch.nn as nn
import torchvision

batch = int(sys.argv[1]) if len(sys.argv) > 1 else 64
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
threads = int(sys.argv[3]) if len(sys.argv) > 3 else 1
profile = int(sys.argv[4]) if len(sys.argv) > 4 else 0
torch.set_num_threads(threads)
torch.manual_seed(0)

model = torchvision.models.resnet18(num_classes=10)
model.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
model.train()
x = torch.randn(batch, 1, 28, 28)
y = torch.arange(batch) % 10
loss_fn = nn.CrossEntropyLoss()


def step():
    for p in model.parameters():
        p.grad = None
    loss = loss_fn(model(x), y)
    loss.backward()
    return loss


for _ in range(3):
    step()
times, cpu = [], []
for _ in range(steps):
    t0, c0 = time.perf_counter(), time.process_time()
    loss = step()
    times.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
times.sort()
med = statistics.median(times)
print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads")
print(f"batch {batch}, {steps} steps, loss {loss.item():.4f}")
print(f"step median {med * 1e3:.2f} ms (min {times[0] * 1e3:.2f}, max {times[-1] * 1e3:.2f}): "
      f"{batch / med:.1f} images/s")
cm = statistics.median(cpu)
print(f"step cpu time median {cm * 1e3:.2f} ms: {batch / cm:.1f} images per cpu-second")
if profile:
    from torch.profiler import ProfilerActivity, profile as prof
    with prof(activities=[ProfilerActivity.CPU]) as p:
        step()
    rows = sorted(p.key_averages(), key=lambda e: -e.self_cpu_time_total)
    for e in rows[:14]:
        print(f"  {e.key:<40} {e.self_cpu_time_total / 1e3:8.2f} ms  x{e.count}")
