#!/usr/bin/env python3
"""PyTorch references for cohort's Flatten, Dropout and Identity (tests/test_nn_vocab).

  vocab_golden.py OUTDIR step
      Two networks, "cnn" and "mlp". cnn: the issue's user CNN as one nn.Sequential with PyTorch's automatic child
      names (conv-BN-ReLU-maxpool twice, Flatten, Dropout(0.5), Linear-ReLU-
      Identity-Linear), 1 input channel, 10 classes, torch's own default init
      (seed 0). Dropout draws cohort's mask (framework/ops/dropout_mask.h,
      re-implemented below: seed 7, epoch 3, sample_base 5, stride 2, layer 0),
      so forward and backward are comparable element for element. Writes
      OUTDIR/vocab_step.safetensors with
        sd.<name>     the initial state dict (strict-load it into cohort)
        x, y          the batch (6, 1, 12, 12) and labels
        logits, loss  of a training-mode forward
        grad.<name>   every parameter's gradient after loss.backward()
        eval_logits   eval-mode logits afterwards (Dropout is the identity)
      and OUTDIR/vocab_<net>_keys.txt: the state_dict() names in order.
  vocab_golden.py OUTDIR initstats
      OUTDIR/vocab_initstats.txt: PyTorch's own default init of the cnn,
      10 draws (seeds 0..9), per entry "name max|v| std" over the draws.
"""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nn_golden_util as U  # noqa: E402

torch.set_num_threads(1)
M64 = (1 << 64) - 1


def mix(z):
    """SplitMix64's finalizer, as ch_dropout_mix."""
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def cohort_mask(shape, p, seed, stream, epoch, base, stride):
    """The 0/1 keep mask cohort draws for a (N, F...) tensor."""
    key = mix(mix(mix(seed) ^ stream) ^ epoch)
    thr = min(int(p * 4294967296.0), 0xFFFFFFFF)
    n, f = shape[0], 1
    for d in shape[1:]:
        f *= d
    keep = [1.0 if (mix(key ^ ((base + s * stride) * f + k)) >> 32) >= thr else 0.0
            for s in range(n) for k in range(f)]
    return torch.tensor(keep, dtype=torch.float32).reshape(shape)


class CohortDropout(nn.Module):
    """nn.Dropout(p) with cohort's mask instead of torch's generator."""

    def __init__(self, p, **key):
        super().__init__()
        self.p, self.key = p, key

    def forward(self, x):
        if not self.training:
            return x
        scale = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(1.0 - self.p,
                                                                     dtype=torch.float32)
        return x * (cohort_mask(x.shape, self.p, **self.key) * scale)


def net(dropout):
    """The example network (share/examples/fmnist_cnn.c) at 12x12."""
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), dropout, nn.Linear(16 * 3 * 3, 32), nn.ReLU(), nn.Identity(),
        nn.Linear(32, 10))


def mlp(dropout):
    return nn.Sequential(nn.Flatten(), nn.Linear(144, 32), nn.ReLU(), dropout, nn.Linear(32, 10))


def step(out, name, m):
    with open(os.path.join(out, "vocab_%s_keys.txt" % name), "w") as f:
        for k in m.state_dict():
            f.write(k + "\n")
    t = {"sd." + k: v.clone() for k, v in m.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 1, 12, 12, generator=g)
    y = torch.randint(0, 10, (6,), generator=g)
    m.train()
    logits = m(x)
    loss = nn.functional.cross_entropy(logits, y)
    loss.backward()
    t.update({"x": x, "y": y, "logits": logits, "loss": loss.reshape(1)})
    for k, p in m.named_parameters():
        t["grad." + k] = p.grad
    m.eval()
    with torch.no_grad():
        t["eval_logits"] = m(x)
    U.save(os.path.join(out, "vocab_%s.safetensors" % name), t)


def main():
    out, what = sys.argv[1], sys.argv[2]
    if what == "step":
        torch.manual_seed(0)
        step(out, "cnn", net(CohortDropout(0.5, seed=7, stream=0, epoch=3, base=5, stride=2)))
        torch.manual_seed(0)
        step(out, "mlp", mlp(CohortDropout(0.25, seed=7, stream=0, epoch=3, base=5, stride=2)))
    elif what == "initstats":
        draws = {}
        for seed in range(10):
            torch.manual_seed(seed)
            for k, v in net(nn.Dropout(0.5)).state_dict().items():
                draws.setdefault(k, []).append(v.double().flatten())
        with open(os.path.join(out, "vocab_initstats.txt"), "w") as f:
            for k, vs in draws.items():
                v = torch.cat(vs)
                f.write("%s %.9g %.9g\n" % (k, v.abs().max().item(), v.std().item()))
    else:
        sys.exit("unknown mode " + what)


if __name__ == "__main__":
    main()
