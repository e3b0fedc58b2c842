#!/usr/bin/env python3
"""A user's own CNN (not torchvision) exported to ONNX for cohort-train
--model.onnx, and its PyTorch DDP reference run (tests/test_onnx_user_cnn.sh).

Usage:
  onnx_user_cnn.py OUT_DIR export
      OUT_DIR/user_cnn.onnx: UserCNN (torch.manual_seed(0)) exported as a user
      would (issue 28):
        torch.onnx.export(model, torch.zeros(1, 1, 28, 28), path,
                          training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False)
      (opset 14, the exporter's default in torch 1.13; batch 1 in the file,
      cohort builds for the data's batch). OUT_DIR/init.safetensors: the
      state dict the file holds (the export's trace ran one training-mode
      forward on zeros, so its BatchNorm running stats are the traced ones;
      num_batches_tracked, which the file lacks, 0).
  onnx_user_cnn.py OUT_DIR ddp [--world 2] [--epochs E] [--subset N] [--batch B]
      PyTorch DDP (gloo, --world processes started here with RANK /
      WORLD_SIZE / MASTER_ADDR / MASTER_PORT, since torchrun crashes under
      Debian's torch 1.13 + Python 3.11) from init.safetensors on
      cohort-train's recipe (jobs/train.cfg, as tests/golden/ddp_pytorch.py:
      Fashion-MNIST, Normalize(0.2860, 0.3530), DistributedSampler(seed 0)
      + BatchSampler(drop_last), CrossEntropyLoss, SGD(lr 0.01 x world,
      momentum 0.9, weight_decay 0.005), LambdaLR cosine with lrf 0.1, eval
      after every epoch with all-reduced counts). ddp_pytorch.full_recipe is
      reused; it prints one "pytorch-ddp epoch E: loss L accuracy A (exact B)
      ..." line per epoch (the last one is the result).
      Dropout keeps p = 0.25 here: its masks are PyTorch's, cohort draws its
      own, so only the accuracy is compared (docs/onnx.md).
  onnx_user_cnn.py OUT_DIR bad
      Bad inputs for cohort-train --model.onnx (issue 28 item 5), made from
      user_cnn.onnx with python3-onnx: bad_op.onnx (a Softplus node: an op
      cohort does not map), bad_missing.onnx (conv1.weight's initializer
      removed), bad_opset.onnx (opset 9), bad_outputs.onnx (a second graph
      output), bad_int_output.onnx (the output declared int64), bad_channels.onnx
      (UserCNN taking 3 channels), and
      bad_truncated.onnx (the first half of the file), bad_text.onnx (not
      ONNX at all).
  onnx_user_cnn.py OUT_DIR check FILE
      Load the cohort state dict FILE (safetensors) into UserCNN with
      strict=True; exit 1 if that fails.
"""
import argparse
import os
import sys
import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nn_golden_util as U  # noqa: E402
import ddp_pytorch as D  # noqa: E402  (read_idx, full_recipe, free_port)


class UserCNN(nn.Module):
    """conv-bn-relu, conv-bn + residual add, relu, maxpool, conv-relu,
    maxpool, dropout, a view(x.size(0), -1) flatten, linear. The exporter
    traces x.size(0) as the constant 1 (no dynamic_axes): the file says
    Reshape(x, Concat(Unsqueeze(1), Unsqueeze(-1))), i.e. (1, -1), which
    cohort reads as a flatten over the data's batch."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(2)
        self.conv3 = nn.Conv2d(16, 32, 3, padding=1)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(32 * 7 * 7, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)) + x)
        x = self.pool(x)
        x = self.pool(F.relu(self.conv3(x)))
        x = self.drop(x)
        return self.fc(x.view(x.size(0), -1))


def export(out):
    import onnx  # python3-onnx
    from onnx import numpy_helper
    torch.manual_seed(0)
    m = UserCNN()
    path = os.path.join(out, "user_cnn.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, torch.zeros(1, 1, 28, 28), path,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    onnx.checker.check_model(path)
    g = onnx.load(path).graph
    inits = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in g.initializer}
    sd = UserCNN().state_dict()
    for k in sd:
        if k in inits:
            sd[k] = inits[k].to(sd[k].dtype)
        elif k.endswith("num_batches_tracked"):
            sd[k] = torch.zeros((), dtype=torch.int64)
        else:
            raise SystemExit("user_cnn.onnx lacks %s" % k)
    U.save(os.path.join(out, "init.safetensors"), sd, {"format": "pt"})
    ops = sorted({n.op_type for n in g.node})
    print("user_cnn.onnx: %d nodes, ops %s" % (len(g.node), " ".join(ops)))


class SharedConv(nn.Module):
    """One Conv2d applied twice (tied weights: not mappable)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, padding=1)
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 28 * 28, 10)

    def forward(self, x):
        x = torch.relu(self.conv(torch.relu(self.conv(self.stem(x)))))
        return self.fc(torch.flatten(x, 1))


class ConvLSTM(nn.Module):
    """A conv layer whose 28 rows are a sequence for an LSTM (not mappable)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.lstm = nn.LSTM(4 * 28, 32, batch_first=True)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        f = torch.relu(self.conv(x))  # (N, 4, 28, 28)
        seq = f.permute(0, 2, 1, 3).reshape(x.size(0), 28, 4 * 28)
        h, _ = self.lstm(seq)
        return self.fc(h[:, -1])


def bad(out):
    import onnx
    from onnx import helper, TensorProto
    src = os.path.join(out, "user_cnn.onnx")
    if not os.path.exists(src):
        export(out)

    def fresh():
        return onnx.load(src)

    m = fresh()  # Softplus after the first Relu
    g = m.graph
    k = next(i for i, n in enumerate(g.node) if n.op_type == "Relu")
    relu = g.node[k]
    old = relu.output[0]
    relu.output[0] = old + "_pre"
    g.node.insert(k + 1, helper.make_node("Softplus", [old + "_pre"], [old], name="my_softplus"))
    onnx.save(m, os.path.join(out, "bad_op.onnx"))
    m = fresh()
    g = m.graph
    keep = [i for i in g.initializer if i.name != "conv1.weight"]
    del g.initializer[:]
    g.initializer.extend(keep)
    onnx.save(m, os.path.join(out, "bad_missing.onnx"))
    m = fresh()
    m.opset_import[0].version = 9
    onnx.save(m, os.path.join(out, "bad_opset.onnx"))
    m = fresh()
    relu_out = next(n for n in m.graph.node if n.op_type == "Relu").output[0]
    m.graph.output.append(helper.make_tensor_value_info(relu_out, TensorProto.FLOAT, None))
    onnx.save(m, os.path.join(out, "bad_outputs.onnx"))
    m = fresh()
    m.graph.output[0].type.tensor_type.elem_type = TensorProto.INT64
    onnx.save(m, os.path.join(out, "bad_int_output.onnx"))
    m3 = UserCNN()  # 3 input channels: does not fit Fashion-MNIST's 1
    m3.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m3, torch.zeros(1, 3, 28, 28), os.path.join(out, "bad_channels.onnx"),
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    # a CNN whose feature rows go through an LSTM: the exporter writes Shape,
    # Gather, Transpose ... before the LSTM node, which is what must be named
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(SharedConv(), torch.zeros(1, 1, 28, 28),
                          os.path.join(out, "bad_shared.onnx"),
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
        torch.onnx.export(ConvLSTM(), torch.zeros(1, 1, 28, 28), os.path.join(out, "bad_lstm.onnx"),
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    raw = open(src, "rb").read()
    open(os.path.join(out, "bad_truncated.onnx"), "wb").write(raw[: len(raw) // 2])
    open(os.path.join(out, "bad_text.onnx"), "w").write("this is not an ONNX file\n")
    print("bad files in %s" % out)


def worker(rank, args):
    torch.set_num_threads(1)
    torch.manual_seed(1000 + rank)  # this rank's dropout masks, the same every run
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(args.world)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(args.port)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    images = D.read_idx(os.path.join(args.data, "train-images-idx3-ubyte.gz"))
    labels = D.read_idx(os.path.join(args.data, "train-labels-idx1-ubyte.gz"))
    if args.subset:
        images, labels = images[: args.subset], labels[: args.subset]
    x_all = torch.from_numpy(images.copy()).unsqueeze(1).float().div(255).sub(0.2860).div(0.3530)
    y_all = torch.from_numpy(labels.astype(np.int64))
    ds = torch.utils.data.TensorDataset(x_all, y_all)
    model = UserCNN()
    model.load_state_dict(U.load(os.path.join(args.out, "init.safetensors"))[0], strict=True)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr * world, momentum=0.9, weight_decay=0.005)
    crit = torch.nn.CrossEntropyLoss()
    D.full_recipe(rank, world, args, ddp, model, opt, crit, ds)
    if rank == 0:
        U.save(os.path.join(args.out, "pytorch_final.safetensors"), model.state_dict(),
               {"format": "pt"})
    dist.barrier()
    dist.destroy_process_group()


def main():
    if len(sys.argv) < 3:
        raise SystemExit("usage: onnx_user_cnn.py OUT_DIR export | ddp [...] | check FILE")
    out, cmd = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    if cmd == "export":
        export(out)
        return 0
    if cmd == "bad":
        bad(out)
        return 0
    if cmd == "check":
        sd, _ = U.load(sys.argv[3])
        UserCNN().load_state_dict(sd, strict=True)
        print("check: %s loads into UserCNN with strict=True (%d entries)" % (sys.argv[3], len(sd)))
        return 0
    if cmd != "ddp":
        raise SystemExit("onnx_user_cnn.py: unknown command '%s'" % cmd)
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--subset", type=int, default=0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--lrf", type=float, default=0.1)
    args = ap.parse_args(sys.argv[3:])
    args.out = out
    if not os.path.exists(os.path.join(out, "init.safetensors")):
        export(out)
    args.port = D.free_port()
    mp.spawn(worker, args=(args,), nprocs=args.world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
