#!/usr/bin/env python3
"""Safetensors interop between PyTorch and cohort (used by tests/test_safetensors).

  safetensors_golden.py make OUTDIR
      Build torchvision's resnet18 with 1 input channel and 10 classes (seed 0),
      run one training-mode forward so BatchNorm buffers are not at their
      initial values (num_batches_tracked = 1, an int64 0-dim tensor), and write
        OUTDIR/torch_hand.safetensors  the state dict in state_dict() order,
                                       written by this script (format by hand)
        OUTDIR/torch_lib.safetensors   the same through safetensors.torch.save_file
                                       (only when the safetensors package is
                                       installed; it is not a Debian package)
        OUTDIR/manifest.json           per tensor: name, dtype, shape, zlib crc32
                                       of its bytes and the float64 sum, in
                                       state_dict() order; the metadata written
  safetensors_golden.py check FILE REF
      Read FILE (written by cohort) by hand -- and with safetensors.torch.load_file
      when available --, check its layout (8-byte length, header padded to a
      multiple of 8 with spaces, contiguous offsets), check every tensor is
      bitwise equal to REF's (a file written by `make`), load it into a fresh
      resnet18 with load_state_dict(strict=True) and check the logits on a fixed
      input equal those of the model loaded from REF. Prints what it compared.

Debian 12 has no python3-safetensors package, so the format is written and
read here with json + struct + torch.frombuffer; the real library is used as
well when `import safetensors` works (pip install safetensors).
Exit status: 0 ok, 1 mismatch or error.
"""
import json
import os
import struct
import sys
import zlib

import torch
import torch.nn as nn
import torchvision

DTYPES = {torch.float32: "F32", torch.int64: "I64"}
TORCH_DTYPES = {"F32": torch.float32, "I64": torch.int64}
META = {"format": "pt", "producer": "tests/golden/safetensors_golden.py"}


def model():
    m = torchvision.models.resnet18(num_classes=10)
    # cohort's in_channels=1 variant (Fashion-MNIST): only conv1 changes.
    m.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return m


def reference_model():
    torch.manual_seed(0)
    m = model()
    m.train()
    with torch.no_grad():
        m(torch.randn(4, 1, 28, 28))  # move BN running stats, num_batches_tracked = 1
    m.eval()
    return m


def tensor_bytes(t):
    return t.detach().contiguous().numpy().tobytes()


def write_by_hand(path, state, metadata):
    header = {"__metadata__": metadata}
    blobs, off = [], 0
    for name, t in state.items():
        b = tensor_bytes(t)
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_by_hand(path):
    """Returns (ordered dict name -> tensor in file order, metadata, header length)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} exceeds the file")
    header = json.loads(raw[8:8 + n].decode("utf-8"),
                        object_pairs_hook=lambda kv: _no_dups(path, kv))
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    entries = sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"]))
    out, pos = {}, 0
    for name, e in entries:
        b, end = e["data_offsets"]
        if b != pos:
            raise ValueError(f"{path}: tensor {name} starts at {b}, expected {pos}")
        dt = TORCH_DTYPES[e["dtype"]]
        buf = bytearray(data[b:end])  # writable copy: frombuffer warns on read-only
        t = torch.frombuffer(buf, dtype=dt) if len(buf) else torch.empty(0, dtype=dt)
        out[name] = t.reshape(e["shape"]).clone()
        pos = end
    if pos != len(data):
        raise ValueError(f"{path}: tensors cover {pos} of {len(data)} data bytes")
    return out, meta, n


def _no_dups(path, kv):
    keys = [k for k, _ in kv]
    if len(keys) != len(set(keys)):
        raise ValueError(f"{path}: duplicate key in header")
    return dict(kv)


def have_lib():
    try:
        import safetensors.torch  # noqa: F401
        return True
    except ImportError:
        return False


def cmd_make(outdir):
    os.makedirs(outdir, exist_ok=True)
    state = reference_model().state_dict()
    write_by_hand(os.path.join(outdir, "torch_hand.safetensors"), state, META)
    lib = have_lib()
    lib_path = os.path.join(outdir, "torch_lib.safetensors")
    if lib:
        import safetensors.torch
        safetensors.torch.save_file({k: v.contiguous() for k, v in state.items()}, lib_path, metadata=META)
    elif os.path.exists(lib_path):
        os.remove(lib_path)
    manifest = {
        "metadata": META,
        "have_safetensors_lib": lib,
        "tensors": [{"name": k, "dtype": DTYPES[v.dtype], "shape": list(v.shape),
                     "crc32": zlib.crc32(tensor_bytes(v)), "sum": float(v.double().sum())}
                    for k, v in state.items()],
    }
    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"wrote {len(state)} tensors to {outdir} (safetensors library: {'yes' if lib else 'no'})")
    return 0


def logits(state):
    m = model()
    m.load_state_dict(state, strict=True)
    m.eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        return m(torch.randn(2, 1, 28, 28, generator=g))


def cmd_check(path, ref_path):
    got, meta, n = read_by_hand(path)
    ref, _, _ = read_by_hand(ref_path)
    errors = []
    if (8 + n) % 8 != 0:
        errors.append(f"header length {n}: data area does not start at a multiple of 8")
    with open(path, "rb") as f:
        f.seek(8)
        hdr = f.read(n)
    if not hdr.startswith(b"{") or not hdr.rstrip(b" ").endswith(b"}"):
        errors.append("header is not a JSON object padded with spaces")
    if set(got) != set(ref):
        errors.append(f"tensor names differ: only in file {sorted(set(got) - set(ref))}, "
                      f"only in reference {sorted(set(ref) - set(got))}")
    for k in ref:
        if k in got and (got[k].dtype != ref[k].dtype or got[k].shape != ref[k].shape
                         or not torch.equal(got[k], ref[k])):
            errors.append(f"tensor {k} differs")
    if meta.get("format") != "pt":
        errors.append(f"metadata {meta} lacks format=pt")
    if not errors:
        a, b = logits(got), logits(ref)
        if not torch.equal(a, b):
            errors.append(f"logits differ: max abs diff {float((a - b).abs().max())}")
    checked = "by hand"
    if not errors and have_lib():
        import safetensors
        import safetensors.torch
        lib = safetensors.torch.load_file(path)
        with safetensors.safe_open(path, framework="pt") as f:
            lib_meta = f.metadata()
        if lib_meta != meta:
            errors.append(f"safetensors library reads metadata {lib_meta}, by hand {meta}")
        for k in ref:
            if not torch.equal(lib[k], ref[k]):
                errors.append(f"safetensors library: tensor {k} differs")
        checked += " and with the safetensors library"
    if errors:
        for e in errors[:20]:
            print(f"{path}: {e}", file=sys.stderr)
        return 1
    print(f"{path}: {len(got)} tensors equal to {ref_path} ({checked}); "
          f"load_state_dict(strict=True) ok; logits equal")
    return 0


def main(argv):
    torch.set_num_threads(1)
    if len(argv) == 3 and argv[1] == "make":
        return cmd_make(argv[2])
    if len(argv) == 4 and argv[1] == "check":
        return cmd_check(argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
