#!/usr/bin/env python3
"""PyTorch twin of tests/bench_ops_each.c: CPU time of single ATen calls on
resnet18 shapes (batch 64, 1x28x28 input), one line per op, same names.

Usage: bench_ops_each.py [threads=1] [trials=7]
Tensors are contiguous NCHW (PyTorch's default); each figure is the median
over `trials` of (process CPU time of R calls) / R, in milliseconds.
Backward ops are the ATen kernels autograd calls (convolution_backward,
native_batch_norm_backward, threshold_backward,
max_pool2d_with_indices_backward, mm).
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
trials = int(sys.argv[2]) if len(sys.argv) > 2 else 7
torch.set_num_threads(threads)
torch.manual_seed(0)
aten = torch.ops.aten
print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads")


def timeit(name, fn):
    fn()
    t0 = time.process_time()
    fn()
    one = time.process_time() - t0
    reps = max(1, min(1000, int(0.05 / one) if one > 0 else 100))
    r = []
    for _ in range(trials):
        c0 = time.process_time()
        for _ in range(reps):
            fn()
        r.append((time.process_time() - c0) / reps)
    print(f"{name:<34} {statistics.median(r) * 1e3:9.3f} ms", flush=True)


with torch.no_grad():
    for name, C, H, O, k, s, p in [
        ("conv stem 1->64 7x7/2 28", 1, 28, 64, 7, 2, 3),
        ("conv 64->64 3x3 7x7", 64, 7, 64, 3, 1, 1),
        ("conv 128->128 3x3 4x4", 128, 4, 128, 3, 1, 1),
        ("conv 128->256 3x3/2 4x4", 128, 4, 256, 3, 2, 1),
        ("conv 256->256 3x3 2x2", 256, 2, 256, 3, 1, 1),
        ("conv 512->512 3x3 1x1", 512, 1, 512, 3, 1, 1),
    ]:
        x = torch.randn(64, C, H, H)
        w = torch.randn(O, C, k, k)
        y = F.conv2d(x, w, None, s, p)
        dy = torch.randn_like(y)
        timeit(f"{name} fwd", lambda: F.conv2d(x, w, None, s, p))
        if C > 1:
            timeit(f"{name} bwd data", lambda: aten.convolution_backward(
                dy, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, [True, False, False]))
        timeit(f"{name} bwd weights", lambda: aten.convolution_backward(
            dy, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, [False, True, False]))

    x = torch.randn(64, 64, 14, 14)
    dy = torch.randn_like(x)
    w, b = torch.randn(64), torch.randn(64)
    rm, rv = torch.zeros(64), torch.ones(64)
    out, sm, sinv = aten.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)
    timeit("batchnorm train fwd 64x64x14x14",
           lambda: aten.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5))
    timeit("batchnorm bwd 64x64x14x14", lambda: aten.native_batch_norm_backward(
        dy, x, w, rm, rv, sm, sinv, True, 1e-5, [True, True, True]))
    y = torch.relu(x)
    timeit("relu fwd 64x64x14x14", lambda: torch.relu(x))
    timeit("relu bwd 64x64x14x14", lambda: aten.threshold_backward(dy, y, 0))
    py, idx = aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
    pdy = torch.randn_like(py)
    timeit("maxpool 3x3/2 fwd 64x64x14x14",
           lambda: aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1]))
    timeit("maxpool 3x3/2 bwd 64x64x14x14", lambda: aten.max_pool2d_with_indices_backward(
        pdy, x, [3, 3], [2, 2], [1, 1], [1, 1], False, idx))

    x = torch.randn(64, 512, 1, 1)
    dp = torch.randn(64, 512, 1, 1)
    pooled = torch.randn(64, 512)
    fw, fb = torch.randn(10, 512), torch.randn(10)
    dl = torch.randn(64, 10)
    timeit("avgpool global fwd 64x512x1x1", lambda: F.adaptive_avg_pool2d(x, (1, 1)))
    timeit("avgpool global bwd 64x512x1x1",
           lambda: aten._adaptive_avg_pool2d_backward(dp, x))
    timeit("linear 512->10 fwd", lambda: F.linear(pooled, fw, fb))
    timeit("linear 512->10 bwd (data+weights)",
           lambda: (dl.mm(fw), dl.t().mm(pooled), dl.sum(0)))

logits = torch.randn(64, 10, requires_grad=True)
labels = torch.arange(64) % 10


def ce():
    loss = F.cross_entropy(logits, labels)
    return torch.autograd.grad(loss, logits)


timeit("cross entropy fwd+grad 64x10", ce)
