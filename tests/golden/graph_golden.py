#!/usr/bin/env python3
"""Reference tensors for tests/test_nn_graph.c: a small CNN with a
squeeze-excitation block (torchvision.ops.SqueezeExcitation) and a
two-branch channel concat (torch.cat(dim=1), Inception style), one
training step in PyTorch (CPU, float32).

Usage: graph_golden.py OUT_DIR

Writes OUT_DIR/graph.safetensors (tests/golden/nn_golden_util.py's format):
  sd.<name>    the model's state dict (strict-load reference)
  x, y         the batch (2, 3, 6, 5) and its labels
  se_out       the SE block's output, mix_out the concat's output
  logits, loss the training-mode forward and cross-entropy
  grad.<name>  every parameter's gradient
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision.ops import SqueezeExcitation

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nn_golden_util as U  # noqa: E402

torch.set_num_threads(1)


class Concat(nn.Module):
    """Branches "0", "1", ... on the same input, outputs concatenated on C."""

    def __init__(self, *branches):
        super().__init__()
        for i, b in enumerate(branches):
            self.add_module(str(i), b)

    def forward(self, x):
        return torch.cat([b(x) for b in self.children()], dim=1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.se = SqueezeExcitation(16, 8)
        self.mix = Concat(nn.Conv2d(16, 8, 1),
                          nn.Sequential(nn.Conv2d(16, 8, 3, padding=1), nn.ReLU(inplace=True)))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        s = self.se(x)
        m = self.mix(s)
        self.se_out, self.mix_out = s.detach().clone(), m.detach().clone()
        return self.fc(torch.flatten(self.pool(m), 1))


def main():
    torch.manual_seed(2468)
    net = Net()
    with torch.no_grad():  # non-trivial BN affine so its gradients matter
        net.bn1.weight.copy_(1.0 + 0.3 * torch.randn(16))
        net.bn1.bias.copy_(0.2 * torch.randn(16))
    x = torch.randn(2, 3, 6, 5)
    y = torch.tensor([1, 3])
    t = {}
    for k, v in net.state_dict().items():
        t["sd." + k] = v.clone()
    net.train()
    logits = net(x)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    t["x"], t["y"] = x, y
    t["se_out"], t["mix_out"] = net.se_out, net.mix_out
    t["logits"], t["loss"] = logits.detach(), loss.detach().reshape(1)
    for k, p in net.named_parameters():
        t["grad." + k] = p.grad.clone()
    U.save(os.path.join(sys.argv[1], "graph.safetensors"), t)


if __name__ == "__main__":
    main()
