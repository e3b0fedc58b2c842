#!/usr/bin/env python3
"""PyTorch twin of tests/bench_nn: training steps (zero_grad, forward,
cross-entropy, backward, SGD step) or inference of a torchvision model on
random data; prints the median step time (wall and process CPU) and the CPU
capability of PyTorch's own kernels. Runs under Debian's torch 1.13 and
torch 2.x (tests/bench_torch_venv.sh). Same options as bench_nn:
  bench_nn_torch.py [--arch resnet18|TORCHVISION_MODEL] [--batch 64] [--size 28] [--channels 1]
                    [--threads 1] [--steps 20] [--warmup 3] [--eval]
                    [--precision fp32|bf16]
--precision bf16 runs the forward under torch.autocast("cpu",
dtype=torch.bfloat16) (bench_nn's --precision bf16, compute.precision).
"""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import resnet_golden  # noqa: E402


def cpu_capability():
    """The ISA of PyTorch's own (ATen) kernels, as ATEN_CPU_CAPABILITY caps it:
    torch.backends.cpu.get_cpu_capability() from torch 2.0, else the line of
    torch.__config__.show() that reports it (torch 1.13)."""
    try:
        import torch.backends.cpu as backends_cpu
        return backends_cpu.get_cpu_capability()
    except (ImportError, AttributeError):
        for line in torch.__config__.show().splitlines():
            if "CPU capability usage:" in line:
                return line.split(":", 1)[1].strip().replace(" ", "_")
    return "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="resnet18")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=28)
    ap.add_argument("--channels", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--eval", action="store_true")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.arch in ("resnet18", "resnet34", "resnet50", "smallcnn"):
        m = resnet_golden.model(a.arch, a.channels, 10)
    else:  # any other torchvision model (bench_nn --onnx of onnx_zoo.py's export)
        import torchvision
        torch.manual_seed(0)
        m = getattr(torchvision.models, a.arch)(num_classes=10)
        for mod in m.modules():  # as onnx_zoo.py: dropout and stochastic depth off
            if isinstance(mod, nn.Dropout):
                mod.p = 0.0
            elif isinstance(mod, torchvision.ops.StochasticDepth):
                mod.p = 0.0
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=0.005)
    x = torch.rand(a.batch, a.channels, a.size, a.size) - 0.5
    y = torch.randint(0, 10, (a.batch,))
    m.train(not a.eval)
    times, cpu = [], []
    loss = torch.zeros(())
    for s in range(-a.warmup, a.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        ac = torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16")
        if a.eval:
            with torch.no_grad(), ac:
                m(x)
        else:
            opt.zero_grad()
            with ac:
                out = m(x)
            loss = nn.functional.cross_entropy(out.float(), y)
            loss.backward()
            opt.step()
        if s >= 0:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    times.sort()
    cpu.sort()
    med = times[len(times) // 2]
    print("torch %s %s %s %s batch %d input %dx%dx%d threads %d: median %.2f ms/step (min %.2f, max %.2f), "
          "%.1f images/s; cpu median %.2f ms/step; loss %.4f; cpu capability %s"
          % (torch.__version__, a.precision, a.arch, "inference" if a.eval else "train-step",
             a.batch, a.channels, a.size, a.size, a.threads, 1e3 * med,
             1e3 * times[0], 1e3 * times[-1], a.batch / med,
             1e3 * cpu[len(cpu) // 2], loss.item(), cpu_capability()))


if __name__ == "__main__":
    main()
