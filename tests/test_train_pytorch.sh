#!/bin/sh
# cohort-train vs PyTorch DDP (tests/golden/ddp_pytorch.py, gloo, 2
# processes): starting from PyTorch's initial resnet18 weights, a few steps
# of the same recipe on the same Fashion-MNIST subset. SyncBN is off on both
# sides (PyTorch 1.13's SyncBatchNorm is GPU-only); DDP broadcasts rank 0's
# buffers (its default).
#
# Tolerances. Step 1's loss depends only on the forward pass: 1e-5. Later
# steps and the final parameters inherit the gradients of step 1, and on real
# 28x28 data a few ReLU inputs sit within ~1e-6 of zero, where float32
# rounding decides the mask (docs/parity-real-data.md): PyTorch itself moves
# as far when its input moves by one ulp. So the bound for steps >= 2 is
# max(1e-4 relative, 2 x PyTorch's own largest move when its input moves one
# ulp up or down), and for the parameters max(1e-3 relative L2, 2 x that).
. "${COHORT_SRCDIR:-.}/tests/train_lib.sh"
need_data
if [ "${HAVE_TORCH:-no}" != yes ]; then
  echo "1..0 # SKIP python3-torch/torchvision not available (configure: HAVE_TORCH=no)"
  exit 0
fi
echo "1..6"
steps=3
py=${PYTHON3:-/usr/bin/python3}
ref="$tmp/torch" ulp="$tmp/torch_ulp" dn="$tmp/torch_down"
common="--world 2 --steps $steps --batch 16 --subset 256 --lr 0.001 --momentum 0.9 --weight-decay 0.005"
"$py" "$src/tests/golden/ddp_pytorch.py" --out "$ref" $common > "$ref.log" 2>&1 || show "$ref.log"
for d in "$ulp" "$dn"; do mkdir -p "$d" && cp "$ref/init.safetensors" "$d/"; done
"$py" "$src/tests/golden/ddp_pytorch.py" --out "$ulp" $common --perturb-ulp up > "$ulp.log" 2>&1 \
  || show "$ulp.log"
"$py" "$src/tests/golden/ddp_pytorch.py" --out "$dn" $common --perturb-ulp down > "$dn.log" 2>&1 \
  || show "$dn.log"
# cohort_steps NAME [overrides...]: cohort-train's twin of those steps in
# $tmp/NAME from PyTorch's initial weights; its losses in $tmp/NAME_losses.txt
cohort_steps() {
  local name=$1; shift
  train 2 "$tmp/$name" --model.arch=resnet18 --model.weights="$ref/init.safetensors" \
    --model.sync_bn=false --data.train_subset=256 --train.batch_size=16 --train.max_steps=$steps \
    --train.eval=false --schedule.epochs=1 --train.log_every=1 "$@" || show "$tmp/$name.log"
  sed -n 's/^epoch 0 step [0-9]*\/[0-9]* .* loss \([0-9.e+-]*\) (mean.*/\1/p' "$tmp/$name.log" \
    > "$tmp/${name}_losses.txt"
}
cohort_steps cohort --optimizer.lr=0.001 --optimizer.momentum=0.9 --optimizer.weight_decay=0.005
echo "# PyTorch losses:        $(tr '\n' ' ' < "$ref/losses.txt")" >&2
echo "# PyTorch, input +1ulp:  $(tr '\n' ' ' < "$ulp/losses.txt")" >&2
echo "# PyTorch, input -1ulp:  $(tr '\n' ' ' < "$dn/losses.txt")" >&2
echo "# cohort losses:         $(tr '\n' ' ' < "$tmp/cohort_losses.txt")" >&2
paste "$ref/losses.txt" "$ulp/losses.txt" "$tmp/cohort_losses.txt" "$dn/losses.txt" \
  > "$tmp/losses.tsv"
check "step 1 loss equals PyTorch DDP's (relative 1e-5: same weights, same batch)" \
  awk 'NR == 1 { d = $3 - $1; if (d < 0) d = -d; exit !(NF == 4 && d <= 1e-5 * $1) }' \
  "$tmp/losses.tsv"
check "steps 2..$steps: losses within max(1e-4, 2 x PyTorch's 1-ulp spread) of PyTorch DDP's" \
  awk -v n=$steps '{ d = $3 - $1; if (d < 0) d = -d; s = $2 - $1; if (s < 0) s = -s;
      t = $4 - $1; if (t < 0) t = -t; if (t > s) s = t;
      tol = 1e-4 * $1; if (2 * s > tol) tol = 2 * s; if (NF != 4 || d > tol) bad = 1; m++ }
      END { exit (bad || m != n) }' "$tmp/losses.tsv"
l2() { "$STCMP" --norm "$1" "$2" | sed -n 's/.*relative L2 error \([0-9.e+-]*\),.*/\1/p'; }
spread=$(printf '%s\n%s\n' "$(l2 "$ulp/final.safetensors" "$ref/final.safetensors")" \
  "$(l2 "$dn/final.safetensors" "$ref/final.safetensors")" | sort -g | tail -n 1)
tol=$(awk -v s="$spread" 'BEGIN { t = 2 * s; if (t < 1e-3) t = 1e-3; print t }')
echo "# parameters: PyTorch's largest 1-ulp spread (relative L2) $spread, tolerance $tol" >&2
check "final parameters and buffers within $tol (relative L2) of PyTorch DDP's" \
  "$STCMP" --norm --rtol "$tol" "$tmp/cohort/model-0.safetensors" "$ref/final.safetensors"
check "cohort's model file loads into torchvision with strict=True" \
  "$py" -c "
import sys; sys.path.insert(0, '$src/tests/golden')
from ddp_pytorch import load_safetensors, make_model
import argparse
m = make_model(argparse.Namespace(num_classes=10, in_channels=1))
m.load_state_dict(load_safetensors('$tmp/cohort/model-0.safetensors'), strict=True)
"

# AdamW + label smoothing (optimizer.name, loss.label_smoothing) against
# torch.optim.AdamW + CrossEntropyLoss(label_smoothing): step 1's loss is the
# forward's (1e-5), step 2's follows one AdamW update (1e-4). AdamW
# normalises each element's update (its first step is about +-lr for every
# element, however small its gradient), so rounding is amplified: PyTorch's
# own step-3 loss moves by 5.3e-4 (2.6e-4 relative) when its input moves one
# ulp up or down (measured), and cohort's is 7e-4 relative off; step 3's
# bound is 2e-3 relative.
aw="$tmp/torch_adamw"
"$py" "$src/tests/golden/ddp_pytorch.py" --out "$aw" --world 2 --steps $steps --batch 16 \
  --subset 256 --lr 0.0005 --weight-decay 0.01 --optimizer adamw --label-smoothing 0.1 \
  > "$aw.log" 2>&1 || show "$aw.log"
cohort_steps cohort_adamw --optimizer.name=adamw --optimizer.lr=0.0005 --loss.label_smoothing=0.1
echo "# PyTorch AdamW losses:  $(tr '\n' ' ' < "$aw/losses.txt")" >&2
echo "# cohort AdamW losses:   $(tr '\n' ' ' < "$tmp/cohort_adamw_losses.txt")" >&2
paste "$aw/losses.txt" "$tmp/cohort_adamw_losses.txt" > "$tmp/adamw.tsv"
check "adamw + label smoothing 0.1: step 1 loss equals PyTorch's (relative 1e-5)" \
  awk 'NR == 1 { d = $2 - $1; if (d < 0) d = -d; exit !(NF == 2 && d <= 1e-5 * $1) }' \
  "$tmp/adamw.tsv"
check "adamw + label smoothing 0.1: step 2 within 1e-4, step 3 within 2e-3 (relative) of PyTorch's" \
  awk -v n=$steps '{ d = $2 - $1; if (d < 0) d = -d; tol = NR <= 2 ? 1e-4 : 2e-3;
      if (NF != 2 || d > tol * $1) bad = 1; m++ } END { exit (bad || m != n) }' "$tmp/adamw.tsv"
