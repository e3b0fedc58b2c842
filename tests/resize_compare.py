#!/usr/bin/env python3
"""How far torchvision's tensor Resize is from its PIL Resize (which cohort
reproduces bit for bit, tests/test_transforms.c), on Fashion-MNIST images.

Usage: resize_compare.py [N]   (first N test images, default 2000)
Prints, per output size, the max and mean |difference| in uint8 levels
between PIL bilinear and F.resize on uint8 tensors with antialias=False
(torchvision 0.14's default for tensors) and antialias=True.
"""
import gzip
import sys

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import functional as F

torch.set_num_threads(1)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
with gzip.open("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz", "rb") as f:
    data = f.read()
imgs = np.frombuffer(data, np.uint8, offset=16).reshape(-1, 28, 28)[:n]
print("size  tensor(antialias=False): max mean   tensor(antialias=True): max mean")
for size in (14, 20, 24, 32, 56, 224):
    res = {False: [], True: []}
    for a in imgs:
        pil = np.asarray(Image.fromarray(a, "L").resize((size, size), Image.BILINEAR), np.int16)
        t = torch.from_numpy(a.copy())[None]
        for aa in (False, True):
            out = F.resize(t, [size, size], interpolation=F.InterpolationMode.BILINEAR,
                           antialias=aa)[0].numpy().astype(np.int16)
            res[aa].append(np.abs(out - pil))
    line = f"{size:4d}"
    for aa in (False, True):
        d = np.stack(res[aa])
        line += f"   {d.max():3d} {d.mean():.4f}            "
    print(line)
