#!/usr/bin/env python3
"""torch.load's twin of tests/bench_pth (not a test).

  bench_pth_torch.py ARCH CLASSES WEIGHTS.pth [REPS]
      Median and min in ms over REPS (default 9) runs, page cache warm, one
      thread: torch.load(map_location="cpu") alone, with weights_only=True,
      and torch.load + model.load_state_dict (the twin of
      ch_train_state_load_pretrained).
"""
import statistics
import sys
import time

import torch
import torchvision


def main():
    arch, classes, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    reps = int(sys.argv[4]) if len(sys.argv) > 4 else 9
    torch.set_num_threads(1)
    m = getattr(torchvision.models, arch)(num_classes=classes)
    torch.load(path, map_location="cpu")
    runs = {"torch.load": lambda: torch.load(path, map_location="cpu"),
            "torch.load(weights_only=True)": lambda: torch.load(path, map_location="cpu",
                                                                 weights_only=True),
            "torch.load + load_state_dict": lambda: m.load_state_dict(
                torch.load(path, map_location="cpu"))}
    for name, fn in runs.items():
        t = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            t.append(time.perf_counter() - t0)
        print(f"{name:34s} median {1e3 * statistics.median(t):8.2f} ms   min {1e3 * min(t):8.2f} ms")


if __name__ == "__main__":
    sys.exit(main())
