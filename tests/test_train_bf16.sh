#!/bin/sh
# cohort-train with compute.precision = bf16 on CPU (issue 26):
#  - bf16 runs oneDNN's bf16 kernels (the compute line says so);
#  - 2 epochs straight == 1 epoch, stop, --resume, 1 more epoch, all in bf16
#    (bitwise: the checkpoint is fp32, the bf16 weight copies are remade);
#  - compute.bf16 = true (the older key) means the same (bitwise);
#  - bf16 and fp32 runs differ (bf16 is in use) and reach test accuracies
#    within 5 points of each other (smallcnn, 2 epochs on 4096 samples);
#  - DDP: 2 ranks x 16 == 1 rank x 32 (SyncBN, lr x ranks) to relative 1e-2;
#  - ONEDNN_MAX_CPU_ISA=AVX2: refused at job start, exit 2, one line naming
#    the ISA; compute.precision = fp16: exit 2 naming the key.
# Without a bf16 ISA on this CPU the bf16 points skip (the refusal runs).
. "${COHORT_SRCDIR:-.}/tests/train_lib.sh"
need_data
echo "1..8"

# accuracy of the last epoch in a log ("accuracy 0.8125")
acc() { sed -n 's/^epoch [0-9]*: .* accuracy \([0-9.]*\) .*/\1/p' "$1" | tail -n 1; }
# |a - b| <= d (awk floats)
within() { awk -v a="$1" -v b="$2" -v d="$3" 'BEGIN { x = a - b; if (x < 0) x = -x; exit !(a != "" && b != "" && x <= d) }'; }

out="$tmp/refuse"
ONEDNN_MAX_CPU_ISA=AVX2 "$MPIEXEC" -n 1 "$TRAIN" --output.dir="$out" --data.workers=1 \
  --model.arch=smallcnn --data.train_subset=64 --compute.precision=bf16 > "$out.log" 2>&1
rc=$?
check "ONEDNN_MAX_CPU_ISA=AVX2: compute.precision = bf16 refused at start, exit 2 (got $rc)" \
  sh -c "test $rc = 2 && grep -q 'compute.precision = bf16: this CPU.s oneDNN ISA is avx2 (no bf16 instructions); use fp32' '$out.log'"
out="$tmp/badval"
"$MPIEXEC" -n 1 "$TRAIN" --output.dir="$out" --data.workers=1 --model.arch=smallcnn \
  --data.train_subset=64 --compute.precision=fp16 > "$out.log" 2>&1
rc=$?
check "compute.precision = fp16: exit 2 naming the key and the choices (got $rc)" \
  sh -c "test $rc = 2 && grep -q \"compute.precision = 'fp16' is not one of: fp32, bf16\" '$out.log'"

if ! "$build/tests/bench_nn" --batch 1 --steps 1 --warmup 0 --eval --precision bf16 > /dev/null 2>&1; then
  why="this CPU's oneDNN ISA has no bf16"
  for n in 3 4 5 6 7 8; do skip "bf16 point $n" "$why"; done
  exit 0
fi

args="--model.arch=smallcnn --data.train_subset=512 --data.test_subset=200 --schedule.epochs=2 --train.batch_size=16"
train 1 "$tmp/straight" $args --compute.precision=bf16 || show "$tmp/straight.log"
check "bf16: the compute line names the bf16 kernels" \
  grep -q "^compute: .*bf16 convolutions and linear layers" "$tmp/straight.log"
train 1 "$tmp/split" $args --compute.precision=bf16 --train.stop_after=1 || show "$tmp/split.log"
train 1 "$tmp/split" $args --compute.precision=bf16 --resume || show "$tmp/split.log"
grep -q "resumed from .* at epoch 1, step 0" "$tmp/split.log" || show "$tmp/split.log"
check "bf16: 2 epochs straight == 1 epoch + --resume + 1 epoch (bitwise)" \
  "$STCMP" --bitwise "$tmp/split/model-1.safetensors" "$tmp/straight/model-1.safetensors"
train 1 "$tmp/alias" $args --compute.bf16=true || show "$tmp/alias.log"
check "compute.bf16 = true == compute.precision = bf16 (bitwise)" \
  "$STCMP" --bitwise "$tmp/alias/model-1.safetensors" "$tmp/straight/model-1.safetensors"
train 1 "$tmp/fp32" $args || show "$tmp/fp32.log"
check "bf16 and fp32 runs differ (bf16 is in use)" \
  sh -c "! '$STCMP' --bitwise '$tmp/fp32/model-1.safetensors' '$tmp/straight/model-1.safetensors' 2>/dev/null"

aargs="--model.arch=smallcnn --data.train_subset=4096 --data.test_subset=1000 --schedule.epochs=2"
train 1 "$tmp/acc32" $aargs --train.batch_size=32 || show "$tmp/acc32.log"
train 1 "$tmp/acc16" $aargs --train.batch_size=32 --compute.precision=bf16 || show "$tmp/acc16.log"
a32=$(acc "$tmp/acc32.log"); a16=$(acc "$tmp/acc16.log")
check "test accuracy bf16 $a16 within 0.05 of fp32 $a32" within "$a16" "$a32" 0.05
# DDP (test_train_equiv.sh's setup: SyncBN, lr x ranks): 2 ranks x 16 ==
# 1 rank x 32 in bf16 to relative 1e-2 (L2 over all tensors; fp32 reaches
# 1e-4 there: the bf16 roundings of values that differ in their last fp32
# bits may go either way)
small="--model.arch=smallcnn --data.train_subset=256 --train.eval=false --schedule.epochs=2 --compute.precision=bf16"
train 1 "$tmp/w1" $small --train.batch_size=32 --optimizer.lr=0.004 || show "$tmp/w1.log"
train 2 "$tmp/w2" $small --train.batch_size=16 --optimizer.lr=0.002 || show "$tmp/w2.log"
"$STCMP" --norm "$tmp/w2/model-1.safetensors" "$tmp/w1/model-1.safetensors" >&2
check "bf16 smallcnn SyncBN: 2 ranks x 16 == 1 rank x 32 after 16 steps (relative 1e-2)" \
  "$STCMP" --norm --rtol 1e-2 "$tmp/w2/model-1.safetensors" "$tmp/w1/model-1.safetensors"
