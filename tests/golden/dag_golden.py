#!/usr/bin/env python3
"""Reference tensors for tests/test_nn_dag.c: DAG graphs (framework/nn
CH_NN_GRAPH) against PyTorch 1.13 (CPU, float32), one training step each.

Usage: dag_golden.py OUT_DIR
       dag_golden.py OUT_DIR load-mbv2 FILE.pth   (FILE in OUT_DIR; exit 0 when torch loads
           cohort's checkpoint of the mbv2 graph into MBV2 with strict=True
           and its BatchNorm buffers and parameters match FILE's count)

Four nets, each written to OUT_DIR/<net>.safetensors
(tests/golden/nn_golden_util.py's format):
  dense    a DenseNet-style block: each layer (BN, ReLU, Conv) reads the
           concatenation of all earlier features (torchvision densenet)
  shuffle  a ShuffleNetV2 unit: chunk into 2, branch conv-bn-relu-dw-bn-
           conv-bn-relu on the second half, cat, channel_shuffle(2)
  mbv2     a MobileNetV2 inverted residual (Add, no final ReLU) with an SE
           gate x * sigmoid(...), an affine x * 0.5 + 1 and a value read by
           3 consumers (the block input: expand conv, the add, a final cat)
  inplace  a ReLU whose input is also read by an Add (b + relu(b): a ReLU
           run in place on b would give 2 relu(b)), a gate multiplied with
           the broadcast operand first, and a ReLU after the Mul (in place)
Each file holds:
  sd.<name>    the state dict (names in torch's order)
  x, y         the batch and its labels
  logits, loss the training-mode forward and cross-entropy
  grad.<name>  every parameter's gradient
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nn_golden_util as U  # noqa: E402

torch.set_num_threads(1)


def channel_shuffle(x, groups):
    # torchvision.models.shufflenetv2.channel_shuffle
    n, c, h, w = x.size()
    x = x.view(n, groups, c // groups, h, w)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(n, -1, h, w)


class Dense(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv0 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.block = nn.ModuleList()
        for i in range(3):
            c = 8 + 4 * i
            self.block.append(nn.Sequential(
                nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.Conv2d(c, 4, 3, padding=1, bias=False)))
        self.norm5 = nn.BatchNorm2d(20)
        self.fc = nn.Linear(20, 5)

    def forward(self, x):
        feats = [self.conv0(x)]
        for layer in self.block:
            feats.append(layer(torch.cat(feats, 1)))
        y = F.relu(self.norm5(torch.cat(feats, 1)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class Shuffle(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16),
                                   nn.ReLU(inplace=True))
        b = 8
        self.branch2 = nn.Sequential(
            nn.Conv2d(b, b, 1, bias=False), nn.BatchNorm2d(b), nn.ReLU(inplace=True),
            nn.Conv2d(b, b, 3, padding=1, groups=b, bias=False), nn.BatchNorm2d(b),
            nn.Conv2d(b, b, 1, bias=False), nn.BatchNorm2d(b), nn.ReLU(inplace=True))
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        x = self.conv1(x)
        x1, x2 = x.chunk(2, dim=1)
        out = channel_shuffle(torch.cat((x1, self.branch2(x2)), dim=1), 2)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))


class MBV2(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU6(inplace=True))
        self.expand = nn.Sequential(nn.Conv2d(16, 32, 1, bias=False), nn.BatchNorm2d(32),
                                    nn.ReLU6(inplace=True))
        self.dw = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False),
                                nn.BatchNorm2d(32), nn.ReLU6(inplace=True))
        self.se_fc1 = nn.Conv2d(32, 8, 1)
        self.se_fc2 = nn.Conv2d(8, 32, 1)
        self.project = nn.Sequential(nn.Conv2d(32, 16, 1, bias=False), nn.BatchNorm2d(16))
        self.fc = nn.Linear(32, 5)

    def forward(self, x):
        x = self.stem(x)
        h = self.dw(self.expand(x))
        s = torch.sigmoid(self.se_fc2(F.relu(self.se_fc1(F.adaptive_avg_pool2d(h, 1)))))
        h = h * s
        z = (x + self.project(h)) * 0.5 + 1.0
        out = torch.cat((z, x), 1)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))


class Inplace(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.gate = nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        b = self.bn(self.conv(x))
        a = b + F.relu(b)
        g = torch.sigmoid(self.gate(F.adaptive_avg_pool2d(a, 1)))
        y = F.relu(g * a)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


def run(net, name, shape, out_dir, seed):
    torch.manual_seed(seed)
    with torch.no_grad():  # non-trivial BN affine so its gradients matter
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(1.0 + 0.3 * torch.randn(m.num_features))
                m.bias.copy_(0.2 * torch.randn(m.num_features))
    x = torch.randn(*shape)
    y = torch.randint(0, 5, (shape[0],))
    t = {}
    for k, v in net.state_dict().items():
        t["sd." + k] = v.clone()
    net.train()
    logits = net(x)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    t["x"], t["y"] = x, y
    t["logits"], t["loss"] = logits.detach(), loss.detach().reshape(1)
    for k, p in net.named_parameters():
        t["grad." + k] = p.grad.clone()
    U.save(os.path.join(out_dir, name + ".safetensors"), t)


def main():
    out = sys.argv[1]
    if len(sys.argv) == 4 and sys.argv[2] == "load-mbv2":
        net = MBV2()
        sd = torch.load(os.path.join(out, sys.argv[3]))
        net.load_state_dict(sd, strict=True)
        assert list(sd.keys()) == list(net.state_dict().keys()), "state-dict order differs"
        print("dag_golden: loaded %d entries into MBV2 (strict)" % len(sd))
        return
    torch.manual_seed(1357)
    run(Dense(), "dense", (2, 3, 6, 5), out, 1)
    run(Shuffle(), "shuffle", (2, 3, 6, 5), out, 2)
    run(MBV2(), "mbv2", (2, 3, 6, 5), out, 3)
    run(Inplace(), "inplace", (2, 3, 6, 5), out, 4)


if __name__ == "__main__":
    main()
