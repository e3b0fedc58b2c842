#!/usr/bin/env python3
"""PyTorch references for cohort's models (tests/test_models, tests/test_nn).

  resnet_golden.py OUTDIR keys
      OUTDIR/keys_<arch>.txt for resnet18, resnet34, resnet50 (1 input channel,
      10 classes) and smallcnn: one line per state_dict() entry, in order:
      "name dtype d0,d1,..." ("-" for a 0-dim shape). Also
      OUTDIR/params_<arch>.txt with named_parameters() names in order.
  resnet_golden.py OUTDIR initstats
      OUTDIR/initstats_resnet18.txt: torchvision's own fresh init (seed 0) of
      resnet18(1 channel, 10 classes), per entry "name numel mean std min max".
  resnet_golden.py OUTDIR step ARCH BATCH SIZE
      One training step of ARCH (resnet18 or smallcnn, 1 input channel, 10
      classes) from torchvision's initial weights (seed 0): writes
      OUTDIR/step_ARCH.safetensors with
        sd.<name>      the initial state dict (load this into cohort)
        x, y           the batch (BATCH, 1, SIZE, SIZE) and labels (int64)
        logits, loss   of a training-mode forward
        grad.<name>    every parameter's gradient after loss.backward()
        new.<name>     every entry (parameters and buffers) after one
                       torch.optim.SGD(lr=0.01, momentum=0.9,
                       weight_decay=0.005) step
        eval_logits    logits of the updated model in eval mode on x
  resnet_golden.py OUTDIR stepcheck ARCH
      Like step, but from cohort's own initial state dict
      (OUTDIR/ARCH_init.safetensors, loaded with strict=True) and batch
      (OUTDIR/ARCH_batch.safetensors: x, y); for models too big to dump whole
      (resnet50) it writes OUTDIR/ARCH_ref.safetensors with logits, loss and
      per-entry summaries (rms, sum, 16 samples) of gradients and updated
      entries, once in float32 and once in float64 (keys prefixed "64.").
  resnet_golden.py OUTDIR check ARCH FILE
      Load FILE (a state dict written by cohort, safetensors) into the torch
      model with strict=True, run eval-mode forward on the x of
      step_ARCH.safetensors, and compare with the logits cohort computed
      (tensor "cohort_logits" in FILE's sibling FILE.logits.safetensors).
      Exit 0 when they agree to 1e-4 relative.
"""
import collections
import os
import sys

import torch
import torch.nn as nn
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nn_golden_util as U  # noqa: E402

torch.set_num_threads(1)


def smallcnn(in_channels=1, num_classes=10):
    """Twin of cohort's "smallcnn" (models/models.c)."""
    return nn.Sequential(collections.OrderedDict([
        ("conv1", nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)),
        ("bn1", nn.BatchNorm2d(16)),
        ("relu", nn.ReLU(inplace=True)),
        ("conv2", nn.Conv2d(16, 32, 3, 2, 1, bias=False)),
        ("bn2", nn.BatchNorm2d(32)),
        ("relu2", nn.ReLU(inplace=True)),
        ("avgpool", nn.AdaptiveAvgPool2d((1, 1))),
        ("flatten", nn.Flatten(1)),
        ("fc", nn.Linear(32, num_classes)),
    ]))


def model(arch, in_channels=1, num_classes=10):
    if arch == "smallcnn":
        m = smallcnn(in_channels, num_classes)
        for mod in m.modules():  # torchvision's ResNet init scheme
            if isinstance(mod, nn.Conv2d):
                nn.init.kaiming_normal_(mod.weight, mode="fan_out", nonlinearity="relu")
        return m
    m = getattr(torchvision.models, arch)(num_classes=num_classes)
    # the seed recipe's 1-channel variant: only conv1 changes
    m.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    nn.init.kaiming_normal_(m.conv1.weight, mode="fan_out", nonlinearity="relu")
    return m


def dtname(t):
    return {torch.float32: "F32", torch.int64: "I64"}[t.dtype]


def keys(out):
    for arch in ("resnet18", "resnet34", "resnet50", "smallcnn"):
        m = model(arch)
        with open(os.path.join(out, "keys_%s.txt" % arch), "w") as f:
            for k, v in m.state_dict().items():
                shape = ",".join(str(d) for d in v.shape) or "-"
                f.write("%s %s %s\n" % (k, dtname(v), shape))
        with open(os.path.join(out, "params_%s.txt" % arch), "w") as f:
            for k, _ in m.named_parameters():
                f.write(k + "\n")


def initstats(out):
    torch.manual_seed(0)
    m = model("resnet18")
    with open(os.path.join(out, "initstats_resnet18.txt"), "w") as f:
        for k, v in m.state_dict().items():
            v = v.double().flatten()
            std = v.std(unbiased=False).item() if v.numel() > 1 else 0.0
            f.write("%s %d %.9g %.9g %.9g %.9g\n" % (k, v.numel(), v.mean().item(), std,
                                                    v.min().item(), v.max().item()))


def step(out, arch, batch, size):
    torch.manual_seed(0)
    m = model(arch)
    m.train()
    t = collections.OrderedDict()
    for k, v in m.state_dict().items():
        t["sd." + k] = v.clone()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 1, size, size, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    t["x"], t["y"] = x, y
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=0.005)
    opt.zero_grad()
    logits = m(x)
    loss = nn.functional.cross_entropy(logits, y)
    loss.backward()
    t["logits"], t["loss"] = logits.detach(), loss.detach().reshape(1)
    for k, p in m.named_parameters():
        t["grad." + k] = p.grad.clone()
    opt.step()
    for k, v in m.state_dict().items():
        t["new." + k] = v.clone()
    m.eval()
    with torch.no_grad():
        t["eval_logits"] = m(x)
    U.save(os.path.join(out, "step_%s.safetensors" % arch), t)


def check(out, arch, path):
    sd, _ = U.load(path)
    m = model(arch)
    m.load_state_dict(sd, strict=True)
    m.eval()
    ref, _ = U.load(os.path.join(out, "step_%s.safetensors" % arch))
    mine, _ = U.load(path + ".logits.safetensors")
    with torch.no_grad():
        logits = m(ref["x"])
    err = ((logits - mine["cohort_logits"]).abs().max() / logits.abs().max()).item()
    print("check %s: strict load ok, eval logits max relative error %.3g" % (path, err))
    return 0 if err <= 1e-4 else 1


def summary(t):
    """(rms, sum, 16 samples at k*n//16) of a tensor, as float32 (18)."""
    f = t.detach().double().flatten()
    n = f.numel()
    idx = torch.tensor([k * n // 16 for k in range(16)])
    rms = f.pow(2).mean().sqrt()
    return torch.cat([rms.reshape(1), f.sum().reshape(1), f[idx]]).float()


def stepcheck(out, arch):
    """Load cohort's state dict OUTDIR/<arch>_init.safetensors (strict) and the
    batch OUTDIR/<arch>_batch.safetensors (x, y), run one training step
    (SGD lr 0.01, momentum 0.9, weight decay 0.005) and write
    OUTDIR/<arch>_ref.safetensors: logits, loss, and per entry summaries
    grad.<name> / new.<name> = (rms, sum, 16 samples) of the gradient and of
    the updated value."""
    sd, _ = U.load(os.path.join(out, "%s_init.safetensors" % arch))
    b, _ = U.load(os.path.join(out, "%s_batch.safetensors" % arch))
    t = collections.OrderedDict()
    # the float32 run (the reference), then the same in float64 ("64." keys)
    # so the test can tell PyTorch's own float32 error from cohort's
    for prefix, dt in (("", torch.float32), ("64.", torch.float64)):
        m = model(arch)
        m.load_state_dict(sd, strict=True)
        m = m.to(dt)
        m.train()
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=0.005)
        opt.zero_grad()
        logits = m(b["x"].to(dt))
        loss = nn.functional.cross_entropy(logits, b["y"])
        loss.backward()
        t[prefix + "logits"], t[prefix + "loss"] = logits.detach().float(), loss.detach().reshape(1).float()
        for k, p in m.named_parameters():
            t[prefix + "grad." + k] = summary(p.grad)
        opt.step()
        for k, v in m.state_dict().items():
            t[prefix + "new." + k] = summary(v)
    U.save(os.path.join(out, "%s_ref.safetensors" % arch), t)


def main():
    out, cmd = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    if cmd == "keys":
        keys(out)
    elif cmd == "initstats":
        initstats(out)
    elif cmd == "step":
        step(out, sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif cmd == "stepcheck":
        stepcheck(out, sys.argv[3])
    elif cmd == "check":
        sys.exit(check(out, sys.argv[3], sys.argv[4]))
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main()
