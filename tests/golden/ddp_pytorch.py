#!/usr/bin/env python3
"""PyTorch DDP reference for cohort-train (tests/test_train_pytorch.sh).

Writes, into --out:
  init.safetensors   torchvision resnet18 (conv1 with --in-channels inputs,
                     --num-classes outputs) as initialised by PyTorch (seed 0)
  final.safetensors  its state dict after --steps DDP steps
  losses.txt         the all-reduced mean loss of every step, one per line

The recipe is cohort-train's: Fashion-MNIST (first --subset training
samples), ToTensor + Normalize(0.2860, 0.3530), DistributedSampler(seed 0,
shuffle) + BatchSampler(drop_last=True), CrossEntropyLoss, SGD(lr x world
size, momentum, weight_decay), DDP over gloo with --world processes started
here (torchrun crashes under Debian's Python 3.11), 1 thread each.
safetensors files are written by hand (nn_golden_util: json header + raw
little-endian data), since Debian has no python3-safetensors.
"""
import argparse, gzip, json, os, socket, struct, sys, time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nn_golden_util as U  # noqa: E402  (safetensors by hand)


def read_idx(path):
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def save_safetensors(path, state):
    """state dict -> safetensors (format "pt"), by hand: nn_golden_util."""
    U.save(path, state, {"format": "pt"})


def load_safetensors(path):
    return U.load(path)[0]


def make_model(args):
    m = getattr(torchvision.models, getattr(args, "arch", "resnet18"))(num_classes=args.num_classes)
    m.conv1 = torch.nn.Conv2d(args.in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    torch.nn.init.kaiming_normal_(m.conv1.weight, mode="fan_out", nonlinearity="relu")
    return m


def worker(rank, args):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    world = args.world
    images = read_idx(os.path.join(args.data, "train-images-idx3-ubyte.gz"))[: args.subset]
    labels = read_idx(os.path.join(args.data, "train-labels-idx1-ubyte.gz"))[: args.subset]
    x_all = torch.from_numpy(images.copy()).unsqueeze(1).float().div(255)
    x_all = x_all.sub(0.2860).div(0.3530)
    y_all = torch.from_numpy(labels.astype(np.int64))
    ds = torch.utils.data.TensorDataset(x_all, y_all)
    sampler = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=world, rank=rank,
                                                              shuffle=True, seed=0)
    sampler.set_epoch(0)
    batches = torch.utils.data.BatchSampler(sampler, args.batch, drop_last=True)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=batches, num_workers=0)

    model = make_model(args)
    model.load_state_dict(load_safetensors(os.path.join(args.out, "init.safetensors")))
    if args.sync_bn:
        raise SystemExit("PyTorch 1.13's SyncBatchNorm is GPU-only")
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    params = [p for p in ddp.parameters() if p.requires_grad]
    if args.optimizer == "adamw":  # cohort's optimizer.name = adamw (betas, eps defaults)
        opt = torch.optim.AdamW(params, lr=args.lr * world, weight_decay=args.weight_decay)
    else:
        opt = torch.optim.SGD(params, lr=args.lr * world, momentum=args.momentum,
                              weight_decay=args.weight_decay)
    crit = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    losses = []
    ddp.train()
    t_first = None
    for step, (x, y) in enumerate(loader):
        if step == args.warmup:
            dist.barrier()
            t_first = time.perf_counter()
        if step >= args.steps:
            break
        if args.perturb_ulp:
            # every input element moved one float32 ulp up or down: PyTorch's
            # own sensitivity to rounding, the noise floor of the comparison
            to = float("inf") if args.perturb_ulp == "up" else float("-inf")
            x = torch.nextafter(x, torch.full_like(x, to))
        loss = crit(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        l = loss.detach().clone()
        dist.all_reduce(l)
        losses.append(l.item() / world)
    if args.epochs > 0:
        full_recipe(rank, world, args, ddp, model, opt, crit, ds)
    dist.barrier()
    if rank == 0 and t_first is not None:
        timed = len(losses) - args.warmup
        dt = time.perf_counter() - t_first
        print("pytorch-ddp: %d ranks, %d timed steps of %d images: %.1f images/s (%.3f s/step)"
              % (world, timed, args.batch * world, timed * args.batch * world / dt, dt / timed),
              flush=True)
    if rank == 0:
        with open(os.path.join(args.out, "losses.txt"), "w") as f:
            for l in losses:
                f.write("%.9g\n" % l)
        save_safetensors(os.path.join(args.out, "final.safetensors"), model.state_dict())
    dist.barrier()
    dist.destroy_process_group()


def full_recipe(rank, world, args, ddp, model, opt, crit, train_ds):
    """--epochs E: the whole seed recipe after the --steps steps above (use
    --steps 0): per epoch set_epoch, train, LambdaLR cosine step, evaluation
    with all-reduced correct counts (over total_size, padding included, and
    exactly over the real samples). Rank 0 prints one line per epoch."""
    import math
    images = read_idx(os.path.join(args.data, "t10k-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(args.data, "t10k-labels-idx1-ubyte.gz"))
    xt = torch.from_numpy(images.copy()).unsqueeze(1).float().div(255).sub(0.2860).div(0.3530)
    yt = torch.from_numpy(labels.astype(np.int64))
    test_ds = torch.utils.data.TensorDataset(xt, yt)
    test_sampler = torch.utils.data.distributed.DistributedSampler(test_ds, num_replicas=world,
                                                                   rank=rank, shuffle=False)
    test_loader = torch.utils.data.DataLoader(test_ds, batch_size=args.batch, sampler=test_sampler)
    sampler = torch.utils.data.distributed.DistributedSampler(train_ds, num_replicas=world,
                                                              rank=rank, shuffle=True, seed=0)
    batches = torch.utils.data.BatchSampler(sampler, args.batch, drop_last=True)
    loader = torch.utils.data.DataLoader(train_ds, batch_sampler=batches, num_workers=0)
    lf = lambda e: ((1 + math.cos(e * math.pi / args.epochs)) / 2) * (1 - args.lrf) + args.lrf
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda=lf)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        ddp.train()
        t0 = time.perf_counter()
        total, n = 0.0, 0
        lr = opt.param_groups[0]["lr"]
        for x, y in loader:
            loss = crit(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            l = loss.detach().clone()
            dist.all_reduce(l)
            total += l.item() / world
            n += 1
        dt = time.perf_counter() - t0
        sched.step()
        model.eval()
        correct = torch.zeros(2)
        offset = 0
        with torch.no_grad():
            for x, y in test_loader:
                pred = model(x).argmax(1)
                ok = (pred == y)
                # positions of this rank's samples in the padded list: the
                # ones at position >= n are padding (shuffle=False)
                pos = torch.arange(offset, offset + len(y)) * world + rank
                correct[0] += ok.sum()
                correct[1] += ok[pos < len(test_ds)].sum()
                offset += len(y)
        dist.all_reduce(correct)
        if rank == 0:
            print("pytorch-ddp epoch %d: loss %.4f accuracy %.4f (exact %.4f) lr %.6g "
                  "%.0f images/s %.1f s" % (epoch, total / max(n, 1),
                  correct[0].item() / test_sampler.total_size, correct[1].item() / len(test_ds),
                  lr, n * args.batch * world / dt, dt), flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--subset", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw"])
    ap.add_argument("--label-smoothing", type=float, default=0.0)
    ap.add_argument("--weight-decay", type=float, default=0.005)
    ap.add_argument("--num-classes", type=int, default=10)
    ap.add_argument("--in-channels", type=int, default=1)
    ap.add_argument("--sync-bn", action="store_true")
    ap.add_argument("--init-only", action="store_true")
    ap.add_argument("--epochs", type=int, default=0,
                    help="after --steps, run the full recipe for this many epochs with eval")
    ap.add_argument("--lrf", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=1,
                    help="steps before the timed ones (images/s is printed)")
    ap.add_argument("--arch", default="resnet18", choices=["resnet18", "resnet34", "resnet50"])
    ap.add_argument("--perturb-ulp", choices=["up", "down"],
                    help="move every input element 1 ulp up/down (noise-floor reference run)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    init = os.path.join(args.out, "init.safetensors")
    if not os.path.exists(init):
        save_safetensors(init, make_model(args).state_dict())
    if args.init_only:
        return
    args.port = free_port()
    mp.spawn(worker, args=(args,), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
