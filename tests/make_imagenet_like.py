#!/usr/bin/env python3
"""Write photo-like ImageNet-size JPEGs (500x375 RGB, ~110 KB) as an ImageFolder.

Usage: make_imagenet_like.py OUT [--src /usr/share/datasets/fashion-mnist]
                                 [--n 200] [--quality 90] [--noise 24] [--seed 0]
                                 [--width 500] [--height 375]
Image i is Fashion-MNIST training image i upscaled (bicubic) to 500x375
(--width x --height; every 4th one portrait, 375x500), coloured with a random
two-colour palette, plus texture that makes it compress like a photograph:
smooth low-frequency colour noise and per-pixel Gaussian noise (sigma
--noise). Saved by PIL's encoder (quality 90, 4:2:0, baseline), the kind of
file ImageNet's training set holds (average ~500x400, ~110 KB). Files go to
OUT/<class name>/<i:05d>.jpg. Used by tests/bench_loader --fast_decode
(docs/perf-data.md). Needs numpy and PIL (Debian: python3-numpy python3-pil).
"""
import argparse
import os

import numpy as np
from PIL import Image

from make_fmnist_imagefolder import CLASSES, find, read_idx


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--src", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--noise", type=float, default=24.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--width", type=int, default=500)
    ap.add_argument("--height", type=int, default=375)
    a = ap.parse_args()
    images = read_idx(find(a.src, "train-images-idx3-ubyte"))
    labels = read_idx(find(a.src, "train-labels-idx1-ubyte"))
    rng = np.random.default_rng(a.seed)
    for c in CLASSES:
        os.makedirs(os.path.join(a.out, c), exist_ok=True)
    total = 0
    for i in range(min(a.n, len(images))):
        w, h = (a.height, a.width) if i % 4 == 3 else (a.width, a.height)
        base = Image.fromarray(images[i], mode="L").resize((w, h), Image.BICUBIC)
        t = np.asarray(base, dtype=np.float32)[..., None] / 255.0
        c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
        img = c0 * (1 - t) + c1 * t
        low = rng.normal(0, 40, (h // 25 + 2, w // 25 + 2, 3)).astype(np.float32)
        low = np.stack([np.asarray(Image.fromarray(low[..., k]).resize((w, h), Image.BICUBIC))
                        for k in range(3)], axis=-1)
        img = img + low + rng.normal(0, a.noise, (h, w, 3))
        out = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), mode="RGB")
        p = os.path.join(a.out, CLASSES[labels[i]], f"{i:05d}.jpg")
        out.save(p, quality=a.quality)
        total += os.path.getsize(p)
    n = min(a.n, len(images))
    print(f"wrote {n} JPEG files under {a.out}, mean {total / n / 1000:.0f} KB")


if __name__ == "__main__":
    main()
