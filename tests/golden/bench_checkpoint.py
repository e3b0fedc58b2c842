#!/usr/bin/env python3
"""PyTorch side of tests/bench_checkpoint: the same state dict written and read
the same number of times, timed in-process (median and min, ms).

  bench_checkpoint.py STATE.safetensors OUTDIR REPS

  torch.save   torch.save(state) to a file + flush + os.fsync (durable like cohort's writer)
  torch.load   torch.load of that file, then copy_ into preallocated tensors
               (what load_state_dict does)
  st.save      safetensors.torch.save_file + os.fsync (only with the safetensors package)
  st.load      safetensors.torch.load_file, then copy_ into preallocated tensors
The state dict is read with the by-hand reader of safetensors_golden.py.
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_golden import read_by_hand  # noqa: E402


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def bench(name, fn, reps, mb):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    med = ts[len(ts) // 2]
    print(f"{name:<10} {mb:9.1f} MB  median {med * 1e3:8.2f} ms  min {ts[0] * 1e3:8.2f} ms  "
          f"({mb / med:7.0f} MB/s at the median)")


def main(state_path, outdir, reps):
    torch.set_num_threads(1)
    state, _, _ = read_by_hand(state_path)
    mb = sum(t.numel() * t.element_size() for t in state.values()) / 1e6
    pt = os.path.join(outdir, "bench-torch.pt")
    dst = {k: torch.zeros_like(v) for k, v in state.items()}  # preallocated and touched

    def copy_in(loaded):
        with torch.no_grad():
            for k, v in loaded.items():
                dst[k].copy_(v)

    def save_pt():
        with open(pt, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())

    bench("torch.save", save_pt, reps, mb)
    bench("torch.load", lambda: copy_in(torch.load(pt)), reps, mb)
    os.remove(pt)
    try:
        import safetensors.torch as st
    except ImportError:
        print("safetensors package not installed: no figures for it")
        return 0
    sf = os.path.join(outdir, "bench-st.safetensors")

    def save_st():
        st.save_file(state, sf)
        fsync_path(sf)

    bench("st.save", save_st, reps, mb)
    bench("st.load", lambda: copy_in(st.load_file(sf)), reps, mb)
    os.remove(sf)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
