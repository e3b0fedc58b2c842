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
safetensors files are written by hand (json header + raw little-endian
data), since Debian has no python3-safetensors.
"""
import argparse, gzip, json, os, socket, struct, sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torchvision


def read_idx(path):
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def save_safetensors(path, state):
    header, blobs, offset = {}, [], 0
    for name, t in state.items():
        t = t.detach().contiguous().cpu()
        if t.dtype == torch.float32:
            dtype, arr = "F32", t.numpy().astype("<f4")
        elif t.dtype == torch.int64:
            dtype, arr = "I64", t.numpy().astype("<i8")
        else:
            raise SystemExit(f"{name}: dtype {t.dtype} not supported")
        raw = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n, = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        dt = {"F32": np.float32, "I64": np.int64}[e["dtype"]]
        arr = np.frombuffer(data, dtype=dt, offset=8 + n + a, count=(b - a) // np.dtype(dt).itemsize)
        out[name] = torch.from_numpy(arr.copy()).reshape(e["shape"])
    return out


def make_model(args):
    m = torchvision.models.resnet18(num_classes=args.num_classes)
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
    opt = torch.optim.SGD([p for p in ddp.parameters() if p.requires_grad], lr=args.lr * world,
                          momentum=args.momentum, weight_decay=args.weight_decay)
    crit = torch.nn.CrossEntropyLoss()
    losses = []
    ddp.train()
    for step, (x, y) in enumerate(loader):
        if step >= args.steps:
            break
        if args.perturb_ulp:
            # every input element moved one float32 ulp up: PyTorch's own
            # sensitivity to rounding, the noise floor of the comparison
            x = torch.nextafter(x, torch.full_like(x, float("inf")))
        loss = crit(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        l = loss.detach().clone()
        dist.all_reduce(l)
        losses.append(l.item() / world)
    if rank == 0:
        with open(os.path.join(args.out, "losses.txt"), "w") as f:
            for l in losses:
                f.write("%.9g\n" % l)
        save_safetensors(os.path.join(args.out, "final.safetensors"), model.state_dict())
    dist.barrier()
    dist.destroy_process_group()


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
    ap.add_argument("--weight-decay", type=float, default=0.005)
    ap.add_argument("--num-classes", type=int, default=10)
    ap.add_argument("--in-channels", type=int, default=1)
    ap.add_argument("--sync-bn", action="store_true")
    ap.add_argument("--init-only", action="store_true")
    ap.add_argument("--perturb-ulp", action="store_true",
                    help="move every input element 1 ulp up (noise-floor reference run)")
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
