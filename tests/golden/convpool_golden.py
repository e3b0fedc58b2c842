"""Reference cases for the convolution and pooling variants of
tests/test_ops.c (grouped / depthwise / dilated / non-square Conv2d,
AvgPool2d, MaxPool2d with ceil_mode, AdaptiveAvgPool2d to (h, w)), added
to ops_golden.py's records by add(put, randn). PyTorch 1.13, CPU, float32,
one thread; the generator is seeded per case (torch.manual_seed(8234 + i)
and up).

Record names: "<op>/<case>/<tensor>"; "params" is an int64 vector:
  convx:    [sh, sw, ph, pw, dh, dw, groups, bias]
  avgpool2d, maxpoolx: [kh, kw, sh, sw, ph, pw, ceil_mode, count_include_pad]
  adaptive: [Ho, Wo]
"""
import torch
import torch.nn.functional as F

# (name, N, C, H, W, O, (kh, kw), (sh, sw), (ph, pw), (dh, dw), groups, bias)
CONVX = [
    ("depthwise", 2, 16, 9, 7, 16, (3, 3), (1, 1), (1, 1), (1, 1), 16, True),
    ("depthwise_s2", 1, 32, 8, 8, 32, (3, 3), (2, 2), (1, 1), (1, 1), 32, False),
    ("depthwise_mult2", 2, 8, 7, 5, 16, (3, 3), (1, 1), (1, 1), (1, 1), 8, True),
    ("groups2_nonsquare", 2, 6, 8, 7, 4, (3, 2), (2, 1), (1, 0), (1, 1), 2, True),
    ("groups4_c16", 2, 16, 6, 6, 32, (3, 3), (1, 1), (1, 1), (1, 1), 4, False),
    ("dilated2", 2, 3, 11, 9, 5, (3, 3), (1, 1), (2, 2), (2, 2), 1, True),
    ("dilated_dw", 1, 16, 10, 10, 16, (3, 3), (1, 1), (2, 2), (2, 2), 16, True),
    ("dilated_nonsquare", 2, 4, 9, 12, 8, (3, 5), (1, 2), (2, 2), (2, 1), 1, False),
    ("dilated_groups_s2", 1, 8, 13, 11, 8, (3, 3), (2, 2), (3, 1), (3, 2), 2, True),
]

# (name, shape, (kh, kw), (sh, sw), (ph, pw), ceil_mode, count_include_pad)
AVG = [
    ("k3s2p1_incl", (2, 3, 7, 9), (3, 3), (2, 2), (1, 1), 0, 1),
    ("k3s2p1_excl", (2, 3, 7, 9), (3, 3), (2, 2), (1, 1), 0, 0),
    ("k2_ceil_incl", (1, 5, 7, 7), (2, 2), (2, 2), (0, 0), 1, 1),
    ("k2_ceil_excl", (1, 5, 7, 7), (2, 2), (2, 2), (0, 0), 1, 0),
    # ceil_mode's last window runs past the right padding: the
    # count_include_pad divisor counts only up to H + pad
    ("ceil_past_pad_incl", (2, 4, 6, 6), (3, 3), (2, 2), (1, 1), 1, 1),
    ("ceil_past_pad_excl", (2, 4, 6, 6), (3, 3), (2, 2), (1, 1), 1, 0),
    # ceil_mode's extra window would start at H + pad: dropped
    ("ceil_drop", (1, 3, 5, 5), (2, 2), (2, 2), (1, 1), 1, 1),
    ("nonsquare", (2, 3, 8, 5), (3, 2), (2, 1), (1, 0), 0, 1),
    ("c16_ceil", (2, 16, 7, 7), (3, 3), (2, 2), (1, 1), 1, 1),
    ("c32_k2", (1, 32, 6, 6), (2, 2), (2, 2), (0, 0), 0, 1),
]

# MaxPool2d with ceil_mode / non-square windows (same parameter vector)
MAXX = [
    ("ceil_odd", (2, 3, 7, 7), (3, 3), (2, 2), (0, 0), 1),
    ("ceil_drop", (1, 3, 5, 5), (2, 2), (2, 2), (1, 1), 1),
    ("ceil_past_pad_c16", (2, 16, 6, 6), (3, 3), (2, 2), (1, 1), 1),
    ("nonsquare_ceil", (1, 4, 8, 5), (3, 2), (2, 1), (1, 0), 1),
]

# (name, shape, (Ho, Wo))
ADAPT = [
    ("7x9_to_3x4", (2, 3, 7, 9), (3, 4)),
    ("c16_5_to_2", (1, 16, 5, 5), (2, 2)),
    ("same", (2, 8, 4, 6), (4, 6)),
    ("up_3_to_5x4", (1, 5, 3, 3), (5, 4)),
    ("c16_to_1x1", (2, 16, 6, 6), (1, 1)),
    ("c8_14_to_3", (2, 8, 14, 14), (3, 3)),
]


def add(put, randn):
    seed = 8234
    for nm, N, C, H, W, O, k, s, p, d, g, bias in CONVX:
        torch.manual_seed(seed)
        seed += 1
        x = randn(N, C, H, W).requires_grad_()
        w = (randn(O, C // g, k[0], k[1]) * (2.0 / (C // g * k[0] * k[1])) ** 0.5).requires_grad_()
        b = randn(O).requires_grad_() if bias else None
        y = F.conv2d(x, w, b, stride=s, padding=p, dilation=d, groups=g)
        dy = randn(*y.shape)
        y.backward(dy)
        pre = f"convx/{nm}/"
        put(pre + "params", torch.tensor([s[0], s[1], p[0], p[1], d[0], d[1], g, int(bias)],
                                         dtype=torch.int64))
        put(pre + "x", x)
        put(pre + "w", w)
        if bias:
            put(pre + "b", b)
            put(pre + "db", b.grad)
        put(pre + "y", y)
        put(pre + "dy", dy)
        put(pre + "dx", x.grad)
        put(pre + "dw", w.grad)

    def pool(kind, cases):
        nonlocal seed
        for case in cases:
            nm, shape, k, s, p, ceil = case[:6]
            incl = case[6] if len(case) > 6 else 1
            torch.manual_seed(seed)
            seed += 1
            x = randn(*shape).requires_grad_()
            if kind == "avgpool2d":
                y = F.avg_pool2d(x, k, s, p, ceil_mode=bool(ceil), count_include_pad=bool(incl))
            else:
                y = F.max_pool2d(x, k, s, p, ceil_mode=bool(ceil))
            dy = randn(*y.shape)
            y.backward(dy)
            pre = f"{kind}/{nm}/"
            put(pre + "params", torch.tensor([k[0], k[1], s[0], s[1], p[0], p[1], ceil, incl],
                                             dtype=torch.int64))
            put(pre + "x", x)
            put(pre + "y", y)
            put(pre + "dy", dy)
            put(pre + "dx", x.grad)

    pool("avgpool2d", AVG)
    pool("maxpoolx", MAXX)

    for nm, shape, out in ADAPT:
        torch.manual_seed(seed)
        seed += 1
        x = randn(*shape).requires_grad_()
        y = F.adaptive_avg_pool2d(x, out)
        dy = randn(*y.shape)
        y.backward(dy)
        pre = f"adaptive/{nm}/"
        put(pre + "params", torch.tensor(list(out), dtype=torch.int64))
        put(pre + "x", x)
        put(pre + "y", y)
        put(pre + "dy", dy)
        put(pre + "dx", x.grad)
