#!/usr/bin/env python3
"""A PyTorch DDP state dict for cohort's pretrained loader (tests/test_train_state).

  pretrained_golden.py OUTDIR
      Wrap the smallcnn twin (resnet_golden.smallcnn, 1 input channel, 10
      classes, seed 0, one training-mode forward so the BatchNorm buffers
      move) in torch.nn.parallel.DistributedDataParallel on a one-process
      gloo group, and write its state_dict() -- every key prefixed "module."
      -- to OUTDIR/ddp_smallcnn.safetensors (written by hand: Debian has no
      python3-safetensors; safetensors_golden.write_by_hand).
Exit status: 0 ok, 1 error.
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import resnet_golden  # noqa: E402
import safetensors_golden  # noqa: E402


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    m = resnet_golden.model("smallcnn", 1, 10)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method="file://" + os.path.join(tmp, "store"),
                                rank=0, world_size=1)
        ddp = torch.nn.parallel.DistributedDataParallel(m)
        ddp.train()
        with torch.no_grad():
            ddp(torch.randn(4, 1, 28, 28))
        state = ddp.state_dict()
        dist.destroy_process_group()
    assert all(k.startswith("module.") for k in state), list(state)
    safetensors_golden.write_by_hand(os.path.join(out, "ddp_smallcnn.safetensors"), state,
                                     {"format": "pt"})
    print(f"wrote {len(state)} tensors, first {next(iter(state))}")


if __name__ == "__main__":
    main()
