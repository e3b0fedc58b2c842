#!/usr/bin/env python3
"""Reference tensors for tests/test_nn_act.c: PyTorch's activations and
ConvNeXt's LayerNorm2d, forward and autograd backward (CPU, float32).

Usage: act_golden.py OUT_DIR

Writes OUT_DIR/act.safetensors (tests/golden/nn_golden_util.py's format)
with, for every case <c> of CASES:
  op level      <c>.x (2,16,5,3) with the case's breakpoints in its first
                elements, <c>.dy, <c>.y = module(x), <c>.dx = autograd's
                input gradient (LayerNorm2d: <c>.dweight, <c>.dbias too)
  module level  a torch.nn.Sequential(Conv2d(16,16,1,bias=False) = identity,
                <module>, AdaptiveAvgPool2d(1), Flatten, Linear(16,5)) on
                <c>.x with labels <c>.labels: <c>.sd.<name> its state dict,
                <c>.act the module's output, <c>.loss (cross-entropy),
                <c>.grad.<name> every parameter's gradient.
(cohort's Linear flattens (N,C,1,1) itself: its model names the Linear "4"
and has no "3", so the state-dict names agree: 0.weight, [1.weight,
1.bias], 4.weight, 4.bias.)
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nn_golden_util as U  # noqa: E402

torch.set_num_threads(1)


class LayerNorm2d(nn.LayerNorm):
    """torchvision.models.convnext.LayerNorm2d (torchvision 0.14)."""

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


# name -> (module factory, breakpoints placed in x)
CASES = {
    "relu6": (lambda: nn.ReLU6(), [0.0, 6.0, -0.0, 5.999999, 6.000001]),
    "hardtanh": (lambda: nn.Hardtanh(-0.5, 1.25), [-0.5, 1.25, 0.0, -0.75, 2.0]),
    "hardtanh_default": (lambda: nn.Hardtanh(), [-1.0, 1.0, 0.0]),
    "leaky_relu": (lambda: nn.LeakyReLU(), [0.0, -0.0, 1e-30, -1e-30]),
    "leaky_relu_02": (lambda: nn.LeakyReLU(0.2), [0.0, -3.0, 3.0]),
    "silu": (lambda: nn.SiLU(), [0.0, -20.0, 20.0, -90.0, 90.0]),
    "sigmoid": (lambda: nn.Sigmoid(), [0.0, -20.0, 20.0, -90.0, 90.0]),
    "tanh": (lambda: nn.Tanh(), [0.0, -10.0, 10.0, 1e-4]),
    "gelu": (lambda: nn.GELU(), [0.0, -6.0, 6.0, -10.0, 10.0]),
    "gelu_tanh": (lambda: nn.GELU(approximate="tanh"), [0.0, -6.0, 6.0, -10.0, 10.0]),
    "hardswish": (lambda: nn.Hardswish(), [-3.0, 3.0, 0.0, -3.000001, 3.000001, 2.999999]),
    "hardsigmoid": (lambda: nn.Hardsigmoid(), [-3.0, 3.0, 0.0, -2.999999, 2.999999]),
    "layernorm2d": (lambda: LayerNorm2d(16, eps=1e-6), []),
}

SHAPE = (2, 16, 5, 3)


def main():
    out_dir = sys.argv[1]
    t = {}
    for ci, (name, (make, bps)) in enumerate(CASES.items()):
        g = torch.Generator().manual_seed(4321 + ci)
        x = torch.randn(SHAPE, generator=g) * 3.0
        flat = x.view(-1)
        for i, v in enumerate(bps):
            flat[i] = v
        dy = torch.randn(SHAPE, generator=g)
        mod = make()
        if isinstance(mod, nn.LayerNorm):
            with torch.no_grad():
                mod.weight.copy_(1.0 + 0.5 * torch.randn(16, generator=g))
                mod.bias.copy_(0.5 * torch.randn(16, generator=g))
        xr = x.clone().requires_grad_(True)
        y = mod(xr)
        y.backward(dy)
        t[name + ".x"] = x
        t[name + ".dy"] = dy
        t[name + ".y"] = y.detach()
        t[name + ".dx"] = xr.grad
        if isinstance(mod, nn.LayerNorm):
            t[name + ".dweight"] = mod.weight.grad.clone()
            t[name + ".dbias"] = mod.bias.grad.clone()
            mod.zero_grad()
        # module level
        conv = nn.Conv2d(16, 16, 1, bias=False)
        fc = nn.Linear(16, 5)
        with torch.no_grad():
            conv.weight.copy_(torch.eye(16).view(16, 16, 1, 1))
            fc.weight.copy_(torch.randn(5, 16, generator=g) * 0.3)
            fc.bias.copy_(torch.randn(5, generator=g) * 0.1)
        model = nn.Sequential(conv, mod, nn.AdaptiveAvgPool2d(1), nn.Flatten(), fc)
        labels = torch.randint(0, 5, (SHAPE[0],), generator=g)
        for k, v in model.state_dict().items():
            t[f"{name}.sd.{k}"] = v.clone()
        act = model[1](model[0](x))
        logits = model(x)
        loss = F.cross_entropy(logits, labels)
        loss.backward()
        t[name + ".labels"] = labels
        t[name + ".act"] = act.detach()
        t[name + ".loss"] = loss.detach().reshape(1)
        for k, p in model.named_parameters():
            t[f"{name}.grad.{k}"] = p.grad.clone()
    U.save(os.path.join(out_dir, "act.safetensors"), t)
    # the derivatives at the breakpoints that the C test relies on
    # Hardswish at 3: the vectorised CPU kernel (every element but a tail of
    # fewer than one vector, so element 1 of the golden x) gives dy, the
    # scalar tail 1.5 dy; cohort follows the vectorised one
    hs = torch.zeros(67)
    hs[0], hs[1], hs[65] = -3.0, 3.0, 3.0
    hs.requires_grad_(True)
    F.hardswish(hs).sum().backward()
    assert hs.grad[[0, 1]].tolist() == [-0.5, 1.0], hs.grad
    assert t["hardswish.dx"].view(-1)[1] == t["hardswish.dy"].view(-1)[1]
    r6 = torch.tensor([0.0, 6.0], requires_grad=True)
    F.relu6(r6).sum().backward()
    assert r6.grad.tolist() == [0.0, 0.0], r6.grad
    assert math.isclose(F.gelu(torch.tensor(1.0)).item(), 0.8413447, rel_tol=1e-6)


if __name__ == "__main__":
    main()
