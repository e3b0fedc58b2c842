"""WebDataset tar shards made by Python's tarfile, and torch's sampler order
over their samples, for tests/test_shards.c.

Usage:
  shards_golden.py idx SRC OUTDIR N PER
      The first N Fashion-MNIST training images of SRC (IDX, gzip) as
      OUTDIR/fm-000000.tar, ... with PER samples each: members KEY.png
      (PIL's PNG of the 28x28 grayscale image, lossless) and KEY.cls (the
      label as decimal text); KEY = %06d of the sample index, except sample
      5 whose key is longer than ustar's 100-byte name field (a pax header).
  shards_golden.py folder ROOT OUTDIR PER
      torchvision.datasets.ImageFolder(ROOT).samples in order, the files'
      bytes unchanged, as OUTDIR/if-000000.tar, ...: KEY.EXT + KEY.cls with
      KEY = CLASS/STEM.
  shards_golden.py order OUTDIR WORLD EPOCHS OUT
      The samples of OUTDIR/*.tar (sorted names; WebDataset grouping of
      adjacent KEY.* members) as a list; for every epoch e < EPOCHS and rank
      r < WORLD one line "e r KEY KEY ..." of
      DistributedSampler(samples, WORLD, r, shuffle=True, seed=0) after
      set_epoch(e).
"""
import gzip
import io
import os
import sys
import tarfile


def add(tar, name, data):
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.mtime = 0
    ti.mode = 0o644
    tar.addfile(ti, io.BytesIO(data))


def write_shards(outdir, prefix, samples, per):
    """samples: (key, ext, bytes, label) in order."""
    os.makedirs(outdir, exist_ok=True)
    for s in range(0, len(samples), per):
        with tarfile.open(os.path.join(outdir, "%s-%06d.tar" % (prefix, s // per)), "w",
                          format=tarfile.PAX_FORMAT) as tar:
            for key, ext, data, label in samples[s:s + per]:
                add(tar, key + "." + ext, data)
                add(tar, key + ".cls", b"%d" % label)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    nd = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(nd)]
    return data[4 + 4 * nd:], dims


def main():
    mode = sys.argv[1]
    if mode == "idx":
        from PIL import Image
        src, outdir, n, per = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        px, dims = read_idx(os.path.join(src, "train-images-idx3-ubyte.gz"))
        lab, _ = read_idx(os.path.join(src, "train-labels-idx1-ubyte.gz"))
        h, w = dims[1], dims[2]
        samples = []
        for i in range(n):
            img = Image.frombytes("L", (w, h), px[i * h * w:(i + 1) * h * w])
            b = io.BytesIO()
            img.save(b, "PNG")
            key = "%06d" % i if i != 5 else "long/" + "x" * 110 + "/%06d" % i
            samples.append((key, "png", b.getvalue(), lab[i]))
        write_shards(outdir, "fm", samples, per)
    elif mode == "folder":
        from torchvision.datasets import ImageFolder
        root, outdir, per = sys.argv[2], sys.argv[3], int(sys.argv[4])
        ds = ImageFolder(root)
        samples = []
        for path, label in ds.samples:
            rel = os.path.relpath(path, root)
            stem, ext = os.path.splitext(rel)
            with open(path, "rb") as f:
                samples.append((stem, ext[1:], f.read(), label))
        write_shards(outdir, "if", samples, per)
    elif mode == "order":
        import torch
        from torch.utils.data import DistributedSampler
        outdir, world, epochs, out = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
        keys = []
        for name in sorted(os.listdir(outdir)):
            if not name.endswith(".tar") or name.startswith("."):
                continue
            with tarfile.open(os.path.join(outdir, name)) as tar:
                for m in tar.getmembers():
                    base = m.name.rsplit("/", 1)[-1]
                    if "." not in base:
                        continue
                    key = m.name[:len(m.name) - len(base)] + base.split(".", 1)[0]
                    if not keys or keys[-1] != key:
                        keys.append(key)
        with open(out, "w") as f:
            for e in range(epochs):
                for r in range(world):
                    s = DistributedSampler(keys, num_replicas=world, rank=r, shuffle=True, seed=0)
                    s.set_epoch(e)
                    f.write("%d %d %s\n" % (e, r, " ".join(keys[i] for i in s)))
        del torch
    else:
        sys.exit("unknown mode " + mode)


if __name__ == "__main__":
    main()
