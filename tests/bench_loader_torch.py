#!/usr/bin/env python3
"""PyTorch's DataLoader on the same work as tests/bench_loader (images/s).

Usage: bench_loader_torch.py --dataset fmnist|imagefolder [--root DIR] [--workers N]
                             [--batch B] [--epochs E] [--limit N] [--pipeline train|val]
fmnist uses torchvision.datasets.FashionMNIST over the same IDX files
(gunzipped once into a cache folder, the layout torchvision expects);
imagefolder uses torchvision.datasets.ImageFolder with a grayscale loader
(Image.open(f).convert("L"), as cohort's channels=1). Train pipeline:
RandomCrop(28, padding=4), RandomHorizontalFlip(), ToTensor(),
Normalize((0.2860,), (0.3530,)). DistributedSampler(num_replicas=1, rank=0),
torch.set_num_threads(1) in the main process and every worker.
"""
import argparse
import gzip
import os
import shutil
import statistics
import time

import torch
from PIL import Image
from torch.utils.data import DataLoader, DistributedSampler, Subset
from torchvision import datasets, transforms as T


def fmnist_root(src, cache):
    raw = os.path.join(cache, "FashionMNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                 "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        dst = os.path.join(raw, name)
        if os.path.exists(dst):
            continue
        if os.path.exists(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), dst)
        else:
            with gzip.open(os.path.join(src, name + ".gz"), "rb") as f, open(dst, "wb") as g:
                shutil.copyfileobj(f, g)
    return cache


def gray_loader(path):
    with open(path, "rb") as f:
        return Image.open(f).convert("L")


def worker_init(_):
    torch.set_num_threads(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="fmnist")
    ap.add_argument("--root")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--pipeline", default="train")
    ap.add_argument("--cache", default="/tmp/cohort-fmnist-torch")
    a = ap.parse_args()
    torch.set_num_threads(1)
    ts = []
    if a.pipeline == "train":
        ts += [T.RandomCrop(28, padding=4), T.RandomHorizontalFlip()]
    ts += [T.ToTensor(), T.Normalize((0.2860,), (0.3530,))]
    tf = T.Compose(ts)
    if a.dataset == "fmnist":
        root = fmnist_root(a.root or "/usr/share/datasets/fashion-mnist", a.cache)
        ds = datasets.FashionMNIST(root, train=True, transform=tf, download=False)
    else:
        ds = datasets.ImageFolder(a.root, transform=tf, loader=gray_loader)
    if a.limit > 0 and a.limit < len(ds):
        ds = Subset(ds, range(a.limit))
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0)
    dl = DataLoader(ds, batch_size=a.batch, sampler=sampler, num_workers=a.workers,
                    worker_init_fn=worker_init if a.workers > 0 else None)
    rates = []
    for e in range(a.epochs):
        t0 = time.perf_counter()
        sampler.set_epoch(e)
        n = 0
        for x, y in dl:
            n += x.shape[0]
        dt = time.perf_counter() - t0
        rates.append(n / dt)
        print(f"epoch {e}: {n} images in {dt:.3f} s = {n / dt:.0f} images/s")
    print(f"pytorch {a.dataset} {a.pipeline} workers={a.workers} batch={a.batch} n={len(ds)}: "
          f"median {statistics.median(rates):.0f} images/s")


if __name__ == "__main__":
    main()
