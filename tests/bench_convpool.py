#!/usr/bin/env python3
"""PyTorch twin of tests/bench_convpool.c: wall time of forward + backward of
the same convolution and pooling cases, same names, same batch.

Usage: bench_convpool.py [threads=1] [batch=32] [trials=7]
Contiguous NCHW tensors (PyTorch's default CPU path); convolutions time
F.conv2d forward + autograd backward (input, weight and bias gradients),
pooling forward + backward; median of `trials` after one warm-up, in ms.
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
N = int(sys.argv[2]) if len(sys.argv) > 2 else 32
trials = int(sys.argv[3]) if len(sys.argv) > 3 else 7
torch.set_num_threads(threads)
torch.manual_seed(0)
print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, batch {N}")

# (name, kind, C, H, O, k, s, p, d, g) as bench_convpool.c
CASES = [
    ("dw3x3_c64_56", 0, 64, 56, 64, 3, 1, 1, 1, 64),
    ("dw3x3_s2_c64_56", 0, 64, 56, 64, 3, 2, 1, 1, 64),
    ("dw3x3_c256_14", 0, 256, 14, 256, 3, 1, 1, 1, 256),
    ("group4_3x3_c64_28", 0, 64, 28, 64, 3, 1, 1, 1, 4),
    ("dil2_3x3_c64_28", 0, 64, 28, 64, 3, 1, 2, 2, 1),
    ("dil2_dw3x3_c64_28", 0, 64, 28, 64, 3, 1, 2, 2, 64),
    ("avgpool3x3_s2_ceil_c64_28", 1, 64, 28, 64, 3, 2, 1, 1, 0),
    ("adaptive7_c64_28", 2, 64, 28, 64, 7, 0, 0, 0, 0),
]

for name, kind, C, H, O, k, s, p, d, g in CASES:
    x = torch.randn(N, C, H, H, requires_grad=True)
    if kind == 0:
        w = torch.randn(O, C // g, k, k, requires_grad=True)
        b = torch.randn(O, requires_grad=True)
        fn = lambda: F.conv2d(x, w, b, stride=s, padding=p, dilation=d, groups=g)  # noqa: E731
    elif kind == 1:
        fn = lambda: F.avg_pool2d(x, k, s, p, ceil_mode=bool(d))  # noqa: E731
    else:
        fn = lambda: F.adaptive_avg_pool2d(x, k)  # noqa: E731
    dy = torch.randn(*fn().shape)
    ts = []
    for r in range(trials + 1):
        t0 = time.perf_counter()
        fn().backward(dy)
        t1 = time.perf_counter()
        if r:
            ts.append(t1 - t0)
    print(f"{name:28s} {'nchw':8s} {1e3 * statistics.median(ts):9.3f} ms")
