#!/usr/bin/env python3
"""The installed example's checkpoint in PyTorch (tests/test_example_train.sh).

  example_check.py MODEL.safetensors
      Builds share/examples/fmnist_cnn.c's network as the plain nn.Sequential
      its comment gives (automatic child names, nothing hand-chosen), loads the
      file with load_state_dict(strict=True) and runs an eval forward of one
      (2, 1, 28, 28) batch; exit 0 when the load is strict and the logits are
      finite, printing the key count.
"""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nn_golden_util as U  # noqa: E402

net = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                    nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64),
                    nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(0.25),
                    nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
sd, _ = U.load(sys.argv[1])
net.load_state_dict(sd, strict=True)
net.eval()
with torch.no_grad():
    y = net(torch.randn(2, 1, 28, 28))
assert torch.isfinite(y).all()
print("strict load: %d entries" % len(sd))
