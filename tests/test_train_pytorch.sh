#!/bin/sh
# cohort-train vs PyTorch DDP (tests/golden/ddp_pytorch.py, gloo, 2
# processes): starting from PyTorch's initial resnet18 weights, a few steps
# of the same recipe on the same Fashion-MNIST subset give the same losses
# per step (1e-4 relative) and the same final parameters (1e-3, relative L2
# over all tensors). SyncBN is off on both sides: PyTorch 1.13's
# SyncBatchNorm is GPU-only; DDP broadcasts rank 0's buffers (default).
. "${COHORT_SRCDIR:-.}/tests/train_lib.sh"
need_data
if [ "${HAVE_TORCH:-no}" != yes ]; then
  echo "1..0 # SKIP python3-torch/torchvision not available (configure: HAVE_TORCH=no)"
  exit 0
fi
echo "1..3"
steps=4
ref="$tmp/torch"
"${PYTHON3:-/usr/bin/python3}" "$src/tests/golden/ddp_pytorch.py" --out "$ref" --world 2 \
  --steps $steps --batch 16 --subset 256 --lr 0.01 --momentum 0.9 --weight-decay 0.005 \
  > "$ref.log" 2>&1 || show "$ref.log"
train 2 "$tmp/cohort" --model.arch=resnet18 --model.weights="$ref/init.safetensors" \
  --model.sync_bn=false --data.train_subset=256 --train.batch_size=16 --optimizer.lr=0.01 \
  --optimizer.momentum=0.9 --optimizer.weight_decay=0.005 --train.max_steps=$steps \
  --train.eval=false --schedule.epochs=1 --train.log_every=1 || show "$tmp/cohort.log"
sed -n 's/^epoch 0 step [0-9]*\/[0-9]* .* loss \([0-9.e+-]*\) (mean.*/\1/p' "$tmp/cohort.log" \
  > "$tmp/cohort_losses.txt"
echo "# PyTorch losses: $(tr '\n' ' ' < "$ref/losses.txt")"
echo "# cohort losses:  $(tr '\n' ' ' < "$tmp/cohort_losses.txt")"
check "$steps per-step losses equal PyTorch DDP's (relative 1e-4)" \
  awk -v n=$steps 'NR == FNR { a[FNR] = $1; next }
    { d = $1 - a[FNR]; if (d < 0) d = -d; if (d > 1e-4 * (a[FNR] < 0 ? -a[FNR] : a[FNR])) bad = 1; m++ }
    END { exit (bad || m != n) }' "$ref/losses.txt" "$tmp/cohort_losses.txt"
check "final parameters and buffers equal PyTorch DDP's (relative L2 1e-3)" \
  "$STCMP" --norm --rtol 1e-3 "$tmp/cohort/model-0.safetensors" "$ref/final.safetensors"
check "cohort's model file loads into torchvision with strict=True" \
  "${PYTHON3:-/usr/bin/python3}" -c "
import sys; sys.path.insert(0, '$src/tests/golden')
from ddp_pytorch import load_safetensors, make_model
import argparse
m = make_model(argparse.Namespace(num_classes=10, in_channels=1))
m.load_state_dict(load_safetensors('$tmp/cohort/model-0.safetensors'), strict=True)
"
