"""Helpers shared by cohort's nn golden scripts: write/read safetensors by hand.

Debian 12 has no python3-safetensors, so the format (8-byte little-endian
header length, JSON header padded with spaces to a multiple of 8, raw
little-endian C-contiguous data) is handled with json + struct here.
"""
import json
import struct

import torch

DTYPES = {torch.float32: "F32", torch.int64: "I64"}
TORCH_DTYPES = {"F32": torch.float32, "I64": torch.int64}


def save(path, tensors, metadata=None):
    """tensors: dict name -> tensor (float32 or int64), kept in dict order."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs, off = [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        b = t.numpy().tobytes()
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


def load(path):
    """Returns (dict name -> tensor in file order, metadata dict)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    items = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    out = {}
    for name, e in items:
        b, end = e["data_offsets"]
        dt = TORCH_DTYPES[e["dtype"]]
        buf = bytearray(raw[base + b: base + end])
        t = torch.frombuffer(buf, dtype=dt) if len(buf) else torch.empty(0, dtype=dt)
        out[name] = t.reshape(e["shape"]).clone()
    return out, meta
