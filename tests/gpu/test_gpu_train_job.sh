#!/bin/sh
# cohort-train on a GPU (issue #7), end to end: the same job on the CPU
# (CUDA_VISIBLE_DEVICES= hides the GPU) and on GPU 0 with TF32 off, 1 rank,
# resnet18 on a synthetic CIFAR-10-format dataset (160 train / 40 test
# images, so the last evaluation batch is partial), batch 16, 2 epochs of 10
# steps, evaluation every epoch. Checks:
#   - the GPU run trains on the GPU and exits 0;
#   - its final model file equals the CPU run's to relative L2 1e-3 (all
#     tensors together, st_compare --norm; fp32 cuDNN vs oneDNN rounding
#     over 20 SGD steps), and so do the epoch losses; the test accuracy
#     differs by at most one sample;
#   - stop after epoch 0 + --resume on the GPU == 2 epochs straight on the
#     GPU (relative L2 1e-4: host mirror, momentum export/import);
#   - compute.bf16 = true trains to finite losses and parameters within 2e-2
#     of the fp32 run;
#   - optimizer.name = adamw with loss.label_smoothing and a multistep
#     schedule after a warmup trains on the GPU (device AdamW state), and
#     stop after epoch 0 + --resume == 2 epochs straight (relative L2 1e-4,
#     as SGD's: the AdamW state's export/import through the resume file).
# SKIPs (visibly) without nvidia-smi listing a GPU, in a build without CUDA,
# or without python3 (it writes the dataset).
. "${COHORT_SRCDIR:-.}/tests/train_lib.sh"
PY=${PYTHON3:-python3}
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${ngpu:-0}" -lt 1 ]; then
  echo "1..0 # SKIP no GPU (nvidia-smi lists none): cohort-train on the GPU needs one"
  exit 0
fi
if ! grep -q "define HAVE_CUDA 1" "$build/config.h" 2>/dev/null; then
  echo "1..0 # SKIP cohort was built without CUDA (configure --without-cuda or no toolkit)"
  exit 0
fi
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "1..0 # SKIP no $PY to write the synthetic dataset"
  exit 0
fi
echo "1..9"

# CIFAR-10 binary records: 1 label byte + 3x32x32 pixel bytes, the pixels
# biased by class so that training learns something
"$PY" - "$tmp/cifar" <<'EOF'
import os, random, sys
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
r = random.Random(0)
def batch(path, n):
    with open(path, "wb") as f:
        for i in range(n):
            lab = (i * 7) % 10
            f.write(bytes([lab]))
            f.write(bytes((r.randrange(0, 160) + lab * 9) % 256 for _ in range(3072)))
for k in range(1, 6):
    batch(os.path.join(d, "data_batch_%d.bin" % k), 32)
batch(os.path.join(d, "test_batch.bin"), 40)
EOF

job="--data.format=cifar10 --data.path=$tmp/cifar --model.arch=resnet18 --model.in_channels=3
  --data.mean=0.5 --data.std=0.25 --train.batch_size=16 --schedule.epochs=2 --optimizer.lr=0.01
  --compute.allow_tf32=false"
# epoch_field LOG EPOCH FIELD: "loss" or "accuracy" of an epoch's summary line
epoch_field() {
  sed -n "s/.*epoch $2: .*$3 \([0-9.eE+-]*\).*/\1/p" "$1" | head -n 1
}
# close A B TOL: |A - B| <= TOL * max(|B|, 1e-12) (A, B non-empty numbers)
close() {
  [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN {
    d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; if (m < 1e-12) m = 1e-12;
    exit !(d <= t * m) }'
}

# shellcheck disable=SC2086
(CUDA_VISIBLE_DEVICES= && export CUDA_VISIBLE_DEVICES && train 1 "$tmp/cpu" $job) ||
  show "$tmp/cpu.log"
# shellcheck disable=SC2086
train 1 "$tmp/gpu" $job
rc=$?
if [ "$rc" = 0 ] && grep -q "GPU: rank 0 on device 0" "$tmp/gpu.log" &&
   [ -r "$tmp/gpu/model-1.safetensors" ]; then
  ok "cohort-train trains resnet18 on GPU 0 and exits 0"
else
  show "$tmp/gpu.log" 40; not_ok "cohort-train on GPU 0 (exit $rc)"
fi
check "final model: GPU (fp32, no TF32) == CPU to relative L2 1e-3" \
  "$STCMP" --norm --rtol 1e-3 "$tmp/gpu/model-1.safetensors" "$tmp/cpu/model-1.safetensors"
lc0=$(epoch_field "$tmp/cpu.log" 0 loss) lg0=$(epoch_field "$tmp/gpu.log" 0 loss)
lc1=$(epoch_field "$tmp/cpu.log" 1 loss) lg1=$(epoch_field "$tmp/gpu.log" 1 loss)
echo "# epoch losses: CPU $lc0 $lc1, GPU $lg0 $lg1" >&2
if close "$lg0" "$lc0" 1e-3 && close "$lg1" "$lc1" 1e-3; then
  ok "epoch losses: GPU == CPU to 1e-3 ($lg0, $lg1)"
else
  not_ok "epoch losses: GPU $lg0 $lg1 vs CPU $lc0 $lc1"
fi
ac=$(epoch_field "$tmp/cpu.log" 1 accuracy) ag=$(epoch_field "$tmp/gpu.log" 1 accuracy)
# 40 test samples: one sample is 0.025
if [ -n "$ac" ] && [ -n "$ag" ] &&
   awk -v a="$ag" -v b="$ac" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.0251) }'; then
  ok "test accuracy on the GPU (count_correct on the device) == CPU's within one sample ($ag vs $ac)"
else
  not_ok "test accuracy: GPU '$ag' vs CPU '$ac'"
fi

# resume on the GPU: epoch 0, stop, --resume, epoch 1
# shellcheck disable=SC2086
train 1 "$tmp/res" $job --train.stop_after=1 || show "$tmp/res.log"
# shellcheck disable=SC2086
train 1 "$tmp/res" $job --resume || show "$tmp/res.log"
check "GPU: 1 epoch + --resume + 1 epoch == 2 epochs straight (relative L2 1e-4)" \
  "$STCMP" --norm --rtol 1e-4 "$tmp/res/model-1.safetensors" "$tmp/gpu/model-1.safetensors"

# bf16 autocast
# shellcheck disable=SC2086
train 1 "$tmp/bf16" $job --compute.bf16=true
rc=$?
lb1=$(epoch_field "$tmp/bf16.log" 1 loss)
if [ "$rc" = 0 ] && [ -n "$lb1" ] && awk -v a="$lb1" 'BEGIN { exit !(a == a + 0 && a < 1e30) }'; then
  ok "compute.bf16: trains on the GPU to finite losses (epoch 1 loss $lb1)"
else
  show "$tmp/bf16.log" 40; not_ok "compute.bf16 run (exit $rc, loss '$lb1')"
fi
check "compute.bf16: final model within 2e-2 (relative L2) of the fp32 CPU run" \
  "$STCMP" --norm --rtol 2e-2 "$tmp/bf16/model-1.safetensors" "$tmp/cpu/model-1.safetensors"

# AdamW (device state) + label smoothing + multistep with warmup, and its resume
aw="$job --optimizer.name=adamw --optimizer.lr=0.0005 --loss.label_smoothing=0.1
  --schedule.name=multistep --schedule.milestones=1 --schedule.warmup_epochs=1
  --schedule.warmup_method=linear --schedule.warmup_factor=0.5 --schedule.epochs=3"
# shellcheck disable=SC2086
train 1 "$tmp/aw" $aw
rc=$?
la2=$(epoch_field "$tmp/aw.log" 2 loss)
if [ "$rc" = 0 ] && grep -q "optimizer: AdamW" "$tmp/aw.log" && [ -n "$la2" ] &&
   awk -v a="$la2" 'BEGIN { exit !(a == a + 0 && a < 1e30) }'; then
  ok "optimizer.name = adamw + label smoothing + multistep: trains on the GPU (epoch 2 loss $la2)"
else
  show "$tmp/aw.log" 40; not_ok "adamw run on the GPU (exit $rc, loss '$la2')"
fi
# shellcheck disable=SC2086
train 1 "$tmp/awres" $aw --train.stop_after=1 || show "$tmp/awres.log"
# shellcheck disable=SC2086
train 1 "$tmp/awres" $aw --resume || show "$tmp/awres.log"
check "GPU adamw: 1 epoch + --resume + 2 epochs == 3 epochs straight (relative L2 1e-4)" \
  "$STCMP" --norm --rtol 1e-4 "$tmp/awres/model-2.safetensors" "$tmp/aw/model-2.safetensors"
