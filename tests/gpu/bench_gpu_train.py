#!/usr/bin/env python3
"""PyTorch twin of tests/gpu/bench_gpu_train.c: ResNet training images/s on one GPU.

Same work as cohort's benchmark: torchvision resnet18/34/50 (1000 classes),
synthetic 3x224x224 input (channels_last, like cohort's NHWC activations),
batch 128, CrossEntropyLoss, SGD(lr 0.1, momentum 0.9, weight_decay 1e-4);
each step = forward + loss + backward + optimizer step. `--warmup` untimed
steps, then `--steps` timed steps with one torch.cuda.synchronize() at the
end: images/s = steps * batch / seconds.

Precisions (the names cohort's benchmark uses):
  fp32  torch.backends.cudnn.allow_tf32 = False (full fp32 convolutions)
  tf32  torch.backends.cudnn.allow_tf32 = True (PyTorch's default for convs)
  bf16  torch.autocast("cuda", dtype=torch.bfloat16), fp32 master weights
Linear layers stay fp32 in fp32/tf32 (torch.backends.cuda.matmul.allow_tf32
= False, PyTorch's default), as in cohort.

Exit status 77 (and a line saying so) when no GPU is visible.
"""
import argparse
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,resnet34,resnet50")
    ap.add_argument("--precisions", default="fp32,tf32,bf16")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--csv", default="")
    ap.add_argument("--device", default="cuda",
                    help="cuda (default); cpu only to try the script on a machine without a GPU")
    a = ap.parse_args()

    import torch
    import torchvision

    print("torch %s (CUDA %s, cuDNN %s), torchvision %s" % (
        torch.__version__, torch.version.cuda,
        torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        torchvision.__version__), flush=True)
    if a.device == "cuda":
        if not torch.cuda.is_available():
            print("bench_gpu_train.py: no GPU visible (torch.cuda.is_available() is False): "
                  "nothing to measure")
            return 77
        dev = torch.device("cuda", 0)
        print("GPU: %s" % torch.cuda.get_device_name(dev), flush=True)
        sync = torch.cuda.synchronize
    else:
        dev = torch.device(a.device)
        sync = lambda: None  # noqa: E731
    kind = dev.type
    torch.backends.cudnn.benchmark = False          # cohort's default: cuDNN heuristics
    torch.backends.cuda.matmul.allow_tf32 = False   # PyTorch's default; cohort's linear is fp32
    csv = open(a.csv, "w") if a.csv else None
    if csv:  # row by row: a run stopped by a timeout keeps what it measured
        csv.write("framework,model,precision,batch,steps,seconds,images_per_s\n")
        csv.flush()
    g = torch.Generator(device="cpu").manual_seed(0)
    for name in a.models.split(","):
        for prec in a.precisions.split(","):
            if prec not in ("fp32", "tf32", "bf16"):
                print("unknown precision %r (fp32, tf32, bf16)" % prec, file=sys.stderr)
                return 2
            torch.backends.cudnn.allow_tf32 = prec == "tf32"
            model = getattr(torchvision.models, name)(num_classes=a.classes)
            model = model.to(dev).to(memory_format=torch.channels_last).train()
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
            crit = torch.nn.CrossEntropyLoss()
            x = torch.randn(a.batch, 3, a.image_size, a.image_size, generator=g)
            x = x.to(dev).contiguous(memory_format=torch.channels_last)
            y = torch.randint(0, a.classes, (a.batch,), generator=g).to(dev)

            def step():
                opt.zero_grad(set_to_none=True)
                if prec == "bf16":
                    with torch.autocast(kind, dtype=torch.bfloat16):
                        loss = crit(model(x), y)
                else:
                    loss = crit(model(x), y)
                loss.backward()
                opt.step()
                return loss

            for _ in range(a.warmup):
                step()
            sync()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                loss = step()
            sync()
            sec = time.perf_counter() - t0
            ips = a.steps * a.batch / sec
            lv = float(loss)
            print("pytorch %-9s %-5s batch %d: %d steps in %.3f s = %8.1f images/s (last loss %.3f)" % (
                name, prec, a.batch, a.steps, sec, ips, lv), flush=True)
            if csv:
                csv.write("pytorch,%s,%s,%d,%d,%.6f,%.1f\n" % (name, prec, a.batch, a.steps, sec, ips))
                csv.flush()
            del model, opt, x, y, loss
            if kind == "cuda":
                torch.cuda.empty_cache()
    if csv:
        csv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
