#!/usr/bin/env python3
"""Compare cohort's default and fast-decode RandomResizedCrop outputs with torchvision.

Usage: fast_decode_torch.py OUT.bin FILE.jpg... [--size 224]
OUT.bin is what tests/fast_decode_diff wrote for the same FILEs in the same
order (per file: int32 top, left, height, width, scale_num, then the default
and the fast output as SIZE x SIZE x 3 uint8). For each file, torchvision's
F.resized_crop(pil_loader(FILE), top, left, height, width, SIZE) (PIL
bilinear, what RandomResizedCrop does with that box) is compared with both;
prints the mean / max |difference| in 0-255 units, over all files and over
those the fast path DCT-scaled. Needs Debian's python3-torchvision.
"""
import argparse
import struct

import numpy as np
from PIL import Image
from torchvision.transforms import functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--size", type=int, default=224)
    a = ap.parse_args()
    n = a.size * a.size * 3
    rows = []
    with open(a.bin, "rb") as f:
        for path in a.files:
            top, left, h, w, scale = struct.unpack("<5i", f.read(20))
            dflt = np.frombuffer(f.read(n), np.uint8).reshape(a.size, a.size, 3).astype(np.int32)
            fast = np.frombuffer(f.read(n), np.uint8).reshape(a.size, a.size, 3).astype(np.int32)
            with open(path, "rb") as g:
                img = Image.open(g).convert("RGB")
            ref = np.asarray(F.resized_crop(img, top, left, h, w, [a.size, a.size],
                                            F.InterpolationMode.BILINEAR), np.int32)
            rows.append((scale, np.abs(dflt - ref), np.abs(fast - ref), np.abs(fast - dflt)))
    for label, sel in (("all", rows), ("DCT-scaled", [r for r in rows if r[0] < 8]),
                       ("scale 8/8", [r for r in rows if r[0] == 8])):
        if not sel:
            continue
        def stat(k):
            return (np.mean([r[k].mean() for r in sel]), max(int(r[k].max()) for r in sel))
        d, fa, ff = stat(1), stat(2), stat(3)
        print(f"{label} ({len(sel)} files): default vs torchvision mean {d[0]:.3f} max {d[1]}; "
              f"fast vs torchvision mean {fa[0]:.3f} max {fa[1]}; "
              f"fast vs default mean {ff[0]:.3f} max {ff[1]}")


if __name__ == "__main__":
    main()
