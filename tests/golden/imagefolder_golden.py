"""torchvision's view of an ImageFolder tree, for tests/test_dataset.c.

Usage: imagefolder_golden.py ROOT CHANNELS OUT.txt
  Writes "classes <n> <name>..." then one line per sample:
  "<label> <fnv1a64 of the decoded pixels, H,W,C uint8> <h> <w> <path>",
  the pixels being pil_loader(path) (convert("RGB")), then .convert("L")
  when CHANNELS is 1.
Usage: imagefolder_golden.py --split N FRAC SEED OUT.txt
  Writes the two index lists of torch.utils.data.random_split(range(N),
  [1 - FRAC, FRAC], generator=torch.Generator().manual_seed(SEED)).
"""
import sys

import numpy as np


def fnv1a64(b):
    h = 0xcbf29ce484222325
    for x in b:
        h ^= x
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    if sys.argv[1] == "--split":
        import torch
        from torch.utils.data import random_split
        n, frac, seed, out = int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
        a, b = random_split(range(n), [1 - frac, frac], generator=torch.Generator().manual_seed(seed))
        with open(out, "w") as f:
            f.write(" ".join(map(str, a.indices)) + "\n")
            f.write(" ".join(map(str, b.indices)) + "\n")
        return
    from torchvision.datasets import ImageFolder
    root, channels, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    ds = ImageFolder(root)
    with open(out, "w") as f:
        f.write(f"classes {len(ds.classes)} {' '.join(ds.classes)}\n")
        for path, label in ds.samples:
            img = ds.loader(path)
            if channels == 1:
                img = img.convert("L")
            a = np.asarray(img, dtype=np.uint8)
            h, w = a.shape[0], a.shape[1]
            f.write(f"{label} {fnv1a64(a.tobytes())} {h} {w} {path}\n")


if __name__ == "__main__":
    main()
