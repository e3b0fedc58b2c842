#!/usr/bin/env python3
"""One training step of a small network made of the convolution and pooling
variants (tests/test_nn.c test_golden_convpool_modules), with PyTorch 1.13.

Usage: convpool_nn_golden.py OUTDIR
Writes OUTDIR/convpool_step.safetensors: sd.<name> (the initial state
dict, PyTorch's default init, seed 4321), x (8,1,13,11), y (8) labels,
logits, loss (cross-entropy, mean), grad.<param> (after backward, training
mode: BatchNorm uses batch statistics).

The network, `features` a Sequential (children "0".."8") then `fc`:
  Conv2d(1, 8, 3, padding=1, bias=False) (a bias before BatchNorm has a zero
  gradient up to rounding: nothing to compare); BatchNorm2d(8); ReLU;
  Conv2d(8, 8, 3, padding=1, groups=8)                 depthwise, bias
  Conv2d(8, 16, (3, 2), stride=(2, 1), padding=(2, 1), dilation=(2, 1),
         groups=2, bias=False)                         grouped, dilated, non-square
  MaxPool2d(3, 2, 1, ceil_mode=True)
  AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False)
  AdaptiveAvgPool2d((3, 2)); AdaptiveAvgPool2d((1, 1))
  fc = Linear(16, 10) on the flattened (N, 16)
"""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nn_golden_util as U  # noqa: E402

torch.set_num_threads(1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(inplace=True),
            nn.Conv2d(8, 8, 3, padding=1, groups=8),
            nn.Conv2d(8, 16, (3, 2), stride=(2, 1), padding=(2, 1), dilation=(2, 1), groups=2,
                      bias=False),
            nn.MaxPool2d(3, 2, 1, ceil_mode=True),
            nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
            nn.AdaptiveAvgPool2d((3, 2)),
            nn.AdaptiveAvgPool2d((1, 1)),
        )
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


torch.manual_seed(4321)
net = Net()
out = {}
for k, v in net.state_dict().items():
    out["sd." + k] = v.clone()
x = torch.randn(8, 1, 13, 11)
y = torch.arange(8, dtype=torch.int64) * 3 % 10
net.train()
logits = net(x)
loss = nn.functional.cross_entropy(logits, y)
loss.backward()
out["x"] = x
out["y"] = y
out["logits"] = logits
out["loss"] = loss.reshape(1)
for k, p in net.named_parameters():
    out["grad." + k] = p.grad
U.save(os.path.join(sys.argv[1], "convpool_step.safetensors"), out)
print(f"convpool step: logits {tuple(logits.shape)}, loss {loss.item():.6f}")
