"""Reference outputs of torchvision transforms on PIL images, for
tests/test_transforms.c.

Usage: transforms_golden.py OUT.bin
Binary records, little-endian:
  int32 n_ops; n_ops x (int32 kind, int32 a, int32 b);
  int32 h, w, c; int32 oh, ow; uint8 input[h*w*c] (H,W,C); float32 out[c*oh*ow]
kind: 3 Resize (a = shorter side if b == 0, else (a, b) = (h, w)),
      4 CenterCrop (a, b), 5 RandomResizedCrop(a, scale=(1,1), ratio=(1,1)),
      6 ToTensor + Normalize (mean/std: MEAN[c], STD[c] below).
Every pipeline is deterministic, so cohort must give the same floats.
"""
import struct
import sys

import numpy as np
import torch
from PIL import Image
from torchvision import transforms as T

torch.set_num_threads(1)
MEAN = {1: [0.2860], 3: [0.485, 0.456, 0.406]}
STD = {1: [0.3530], 3: [0.229, 0.224, 0.225]}


def build(ops, c):
    ts = []
    for kind, a, b in ops:
        if kind == 3:
            ts.append(T.Resize(a if b == 0 else (a, b), interpolation=T.InterpolationMode.BILINEAR))
        elif kind == 4:
            ts.append(T.CenterCrop((a, b)))
        elif kind == 5:
            ts.append(T.RandomResizedCrop(a, scale=(1.0, 1.0), ratio=(1.0, 1.0)))
        elif kind == 6:
            ts.append(T.ToTensor())
            ts.append(T.Normalize(MEAN[c], STD[c]))
    return T.Compose(ts)


def main():
    rng = np.random.default_rng(1234)
    cases = []
    for c in (1, 3):
        for (h, w) in ((28, 28), (37, 23), (300, 200), (17, 64)):
            cases.append((c, h, w, [(6, 0, 0)]))
            for s in (7, 20, 28, 32, 45, 64, 256):
                cases.append((c, h, w, [(3, s, 0), (4, s, s), (6, 0, 0)]))
            cases.append((c, h, w, [(3, 31, 19), (6, 0, 0)]))
            cases.append((c, h, w, [(3, 30, 0), (4, 24, 24), (6, 0, 0)]))
            cases.append((c, h, w, [(4, 40, 33), (6, 0, 0)]))  # pads when smaller
            cases.append((c, h, w, [(4, 9, 10), (3, 30, 0), (4, 29, 30), (6, 0, 0)]))
            cases.append((c, h, w, [(5, 24, 24), (6, 0, 0)]))
    with open(sys.argv[1], "wb") as f:
        for c, h, w, ops in cases:
            # smooth pattern plus noise: exercises rounding in both passes
            yy, xx = np.mgrid[0:h, 0:w]
            base = (127 + 100 * np.sin(yy / 3.1) * np.cos(xx / 4.7))[..., None]
            arr = np.clip(base + rng.integers(-40, 41, size=(h, w, c)), 0, 255).astype(np.uint8)
            img = Image.fromarray(arr[..., 0] if c == 1 else arr, mode="L" if c == 1 else "RGB")
            out = build(ops, c)(img).numpy().astype(np.float32)
            f.write(struct.pack("<i", len(ops)))
            for op in ops:
                f.write(struct.pack("<3i", *op))
            f.write(struct.pack("<5i", h, w, c, out.shape[1], out.shape[2]))
            f.write(arr.tobytes())
            f.write(out.tobytes())


if __name__ == "__main__":
    main()
