#!/usr/bin/env python3
"""Write Fashion-MNIST as an ImageFolder tree of JPEG files.

Usage: make_fmnist_imagefolder.py OUT [--src /usr/share/datasets/fashion-mnist]
                                      [--split train|test] [--limit N] [--quality 95]
Makes OUT/<class name>/<index:05d>.jpg (grayscale JPEG, 28x28, PIL's encoder)
for the first N images of the split, class folders named after the
Fashion-MNIST classes (so sorted order = torchvision's class order is NOT the
label order: ImageFolder assigns indices by sorted folder name, as always).
Needs numpy and PIL (Debian: python3-numpy python3-pil).
"""
import argparse
import gzip
import os

import numpy as np
from PIL import Image

CLASSES = ["T-shirt_top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
           "Sneaker", "Bag", "Ankle_boot"]


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    nd = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(nd)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * nd).reshape(dims)


def find(src, name):
    for cand in (name, name + ".gz"):
        p = os.path.join(src, cand)
        if os.path.exists(p):
            return p
    raise FileNotFoundError(f"{src}: neither {name} nor {name}.gz")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--src", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--split", default="test", choices=["train", "test"])
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--quality", type=int, default=95)
    a = ap.parse_args()
    pre = "train" if a.split == "train" else "t10k"
    images = read_idx(find(a.src, f"{pre}-images-idx3-ubyte"))
    labels = read_idx(find(a.src, f"{pre}-labels-idx1-ubyte"))
    n = len(images) if a.limit <= 0 else min(a.limit, len(images))
    for c in CLASSES:
        os.makedirs(os.path.join(a.out, c), exist_ok=True)
    for i in range(n):
        Image.fromarray(images[i], mode="L").save(
            os.path.join(a.out, CLASSES[labels[i]], f"{i:05d}.jpg"), quality=a.quality)
    print(f"wrote {n} JPEG files under {a.out}")


if __name__ == "__main__":
    main()
