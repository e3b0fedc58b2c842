#!/usr/bin/env python3
"""Reference tensors for tests/test_ops.c, made with PyTorch (CPU, float32).

Usage: ops_golden.py OUTPUT_FILE

Output format ("CHG1"): the 4-byte magic b"CHG1", then records until EOF:
  u32 name_len, name bytes (UTF-8), u32 dtype (0 float32, 1 int64),
  u32 ndim, ndim x i64 dims, then the data (little-endian, row-major =
  PyTorch's contiguous layout: NCHW, OIHW, (N,K)).

Every case is named "<op>/<case>/<tensor>". Inputs come from a seeded
generator (torch.manual_seed(1234 + case index)); outputs and gradients are
PyTorch's own (torch.nn.functional.*, autograd).
"""
import struct
import sys

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
records = []


def put(name, t):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.float32:
        code = 0
    elif t.dtype == torch.int64:
        code = 1
    else:
        raise SystemExit(f"{name}: unsupported dtype {t.dtype}")
    records.append((name, code, list(t.shape), t.numpy().tobytes()))


def randn(*shape):
    return torch.randn(*shape, dtype=torch.float32)


# ---------------------------------------------------------------- conv2d
# (name, N, C, H, W, O, k, stride, pad, bias)
CONV = [
    ("odd_bias", 2, 3, 9, 7, 5, 3, 1, 1, True),
    ("s2_nobias", 1, 4, 10, 11, 6, 3, 2, 1, False),
    ("down1x1", 2, 16, 7, 7, 32, 1, 2, 0, False),
    ("stem", 2, 1, 28, 28, 16, 7, 2, 3, False),
    ("c16_bias", 2, 16, 5, 5, 16, 3, 1, 1, True),
    ("c32_s2", 1, 32, 4, 4, 32, 3, 2, 1, False),
    ("spatial1", 2, 32, 1, 1, 16, 3, 1, 1, False),
    ("s2_to1", 2, 16, 2, 2, 32, 3, 2, 1, True),
    ("row1", 1, 8, 1, 5, 8, 3, 1, 1, True),
    ("k5_p2_s2", 2, 3, 3, 6, 4, 5, 2, 2, False),
    ("spatial1_bias", 3, 16, 1, 1, 32, 3, 1, 1, True),
    ("k1_s2_on1", 2, 16, 1, 1, 16, 1, 2, 0, True),
    ("win2_odd", 2, 5, 2, 2, 7, 3, 2, 1, True),
    ("win3_valid", 2, 8, 3, 3, 16, 3, 1, 0, False),
    ("map2_bias", 2, 16, 2, 2, 32, 3, 1, 1, True),
    ("map2x3_odd", 1, 5, 2, 3, 6, 3, 1, 1, True),
    ("map3_k5", 2, 8, 3, 3, 8, 5, 1, 2, False),
]
for i, (nm, N, C, H, W, O, k, s, p, bias) in enumerate(CONV):
    torch.manual_seed(1234 + i)
    x = randn(N, C, H, W).requires_grad_()
    w = (randn(O, C, k, k) * (2.0 / (C * k * k)) ** 0.5).requires_grad_()
    b = randn(O).requires_grad_() if bias else None
    y = F.conv2d(x, w, b, stride=s, padding=p)
    dy = randn(*y.shape)
    y.backward(dy)
    pre = f"conv/{nm}/"
    put(pre + "params", torch.tensor([s, p, 1 if bias else 0], dtype=torch.int64))
    put(pre + "x", x)
    put(pre + "w", w)
    if bias:
        put(pre + "b", b)
        put(pre + "db", b.grad)
    put(pre + "y", y)
    put(pre + "dy", dy)
    put(pre + "dx", x.grad)
    put(pre + "dw", w.grad)

# ------------------------------------------------------------ batch norm
# (name, shape); training forward + backward, running-stat update, eval.
BN = [
    ("odd", (2, 3, 5, 7)),
    ("c16", (1, 16, 4, 4)),
    ("c32", (3, 32, 3, 3)),
    ("flat", (4, 5)),
    ("b1", (1, 16, 1, 2)),
]
for i, (nm, shape) in enumerate(BN):
    torch.manual_seed(2234 + i)
    C = shape[1]
    x = (randn(*shape) * 2.0 + 0.5).requires_grad_()
    w = (randn(C) * 0.5 + 1.0).requires_grad_()
    b = randn(C).requires_grad_()
    rm0 = randn(C) * 0.1
    rv0 = torch.rand(C) + 0.5
    rm, rv = rm0.clone(), rv0.clone()
    y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
    dy = randn(*shape)
    y.backward(dy)
    dims = [0] + list(range(2, len(shape)))
    pre = f"bn/{nm}/"
    put(pre + "x", x)
    put(pre + "w", w)
    put(pre + "b", b)
    put(pre + "rm0", rm0)
    put(pre + "rv0", rv0)
    put(pre + "y", y)
    put(pre + "mean", x.detach().mean(dim=dims))
    put(pre + "var", x.detach().var(dim=dims, unbiased=False))
    put(pre + "rm", rm)
    put(pre + "rv", rv)
    put(pre + "dy", dy)
    put(pre + "dx", x.grad)
    put(pre + "dw", w.grad)
    put(pre + "db", b.grad)
    with torch.no_grad():
        ye = F.batch_norm(x, rm0, rv0, w, b, training=False, eps=1e-5)
    put(pre + "y_eval", ye)

# ------------------------------------------------------------------ relu
for i, (nm, shape) in enumerate([("odd", (2, 3, 5, 7)), ("c16", (2, 16, 3, 3))]):
    torch.manual_seed(3234 + i)
    x = randn(*shape).requires_grad_()
    y = torch.relu(x)
    dy = randn(*shape)
    y.backward(dy)
    pre = f"relu/{nm}/"
    put(pre + "x", x)
    put(pre + "y", y)
    put(pre + "dy", dy)
    put(pre + "dx", x.grad)

# --------------------------------------------------------------- maxpool
# (name, shape, k, stride, pad)
MP = [
    ("stem", (2, 16, 14, 14), 3, 2, 1),
    ("odd", (1, 3, 7, 9), 3, 2, 1),
    ("k2", (2, 16, 5, 5), 2, 2, 0),
    ("tiny", (1, 32, 1, 1), 3, 2, 1),
]
for i, (nm, shape, k, s, p) in enumerate(MP):
    torch.manual_seed(4234 + i)
    x = randn(*shape).requires_grad_()
    y = F.max_pool2d(x, k, s, p)
    dy = randn(*y.shape)
    y.backward(dy)
    pre = f"maxpool/{nm}/"
    put(pre + "params", torch.tensor([k, s, p], dtype=torch.int64))
    put(pre + "x", x)
    put(pre + "y", y)
    put(pre + "dy", dy)
    put(pre + "dx", x.grad)

# ------------------------------------------------------- global avg pool
for i, (nm, shape) in enumerate([("c16", (2, 16, 3, 3)), ("odd", (1, 5, 4, 7)),
                                 ("one", (3, 32, 1, 1))]):
    torch.manual_seed(5234 + i)
    x = randn(*shape).requires_grad_()
    y = F.adaptive_avg_pool2d(x, (1, 1))
    dy = randn(*y.shape)
    y.backward(dy)
    pre = f"avgpool/{nm}/"
    put(pre + "x", x)
    put(pre + "y", y)
    put(pre + "dy", dy)
    put(pre + "dx", x.grad)

# ---------------------------------------------------------------- linear
for i, (nm, N, K, M, bias) in enumerate([("small", 2, 7, 5, True), ("fc", 3, 512, 10, True),
                                        ("nobias", 1, 4, 3, False)]):
    torch.manual_seed(6234 + i)
    x = randn(N, K).requires_grad_()
    w = (randn(M, K) / K ** 0.5).requires_grad_()
    b = randn(M).requires_grad_() if bias else None
    y = F.linear(x, w, b)
    dy = randn(N, M)
    y.backward(dy)
    pre = f"linear/{nm}/"
    put(pre + "x", x)
    put(pre + "w", w)
    if bias:
        put(pre + "b", b)
        put(pre + "db", b.grad)
    put(pre + "y", y)
    put(pre + "dy", dy)
    put(pre + "dx", x.grad)
    put(pre + "dw", w.grad)

# ---------------------------------------------------- cross entropy, argmax
for i, (nm, N, K) in enumerate([("b4", 4, 10), ("b1", 1, 3), ("b64", 64, 10)]):
    torch.manual_seed(7234 + i)
    x = (randn(N, K) * 3.0).requires_grad_()
    lab = torch.randint(0, K, (N,), dtype=torch.int64)
    loss = F.cross_entropy(x, lab)
    loss.backward()
    pre = f"ce/{nm}/"
    put(pre + "logits", x)
    put(pre + "labels", lab)
    put(pre + "loss", loss.reshape(1))
    put(pre + "dlogits", x.grad)
    am = x.detach().argmax(dim=1)
    put(pre + "argmax", am)
    put(pre + "correct", (am == lab).sum().reshape(1))

# ------------------- convolution and pooling variants (convpool_golden.py)
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
import convpool_golden  # noqa: E402

convpool_golden.add(put, randn)

with open(sys.argv[1], "wb") as f:
    f.write(b"CHG1")
    for name, code, shape, data in records:
        nb = name.encode()
        f.write(struct.pack("<I", len(nb)))
        f.write(nb)
        f.write(struct.pack("<II", code, len(shape)))
        f.write(struct.pack(f"<{len(shape)}q", *shape))
        f.write(data)
print(f"wrote {len(records)} tensors to {sys.argv[1]}")
