#!/bin/sh
# The installed example share/examples/fmnist_cnn.c (a network of its own on
# the library's trainer, built here as tests/fmnist_cnn), on 2 ranks with a
# few steps:
#  - --help is cohort-train's, with model.arch defaulting to fmnist_cnn;
#  - its model file loads into the equivalent PyTorch nn.Sequential with
#    strict=True (automatic names "0", "1", ...);
#  - a STOP file mid-epoch: exit 3, and --resume ends with the same model
#    file as an uninterrupted run (bitwise).
. "${COHORT_SRCDIR:-.}/tests/train_lib.sh"
need_data
echo "1..5"
TRAIN="$build/tests/fmnist_cnn"
args="--data.train_subset=512 --data.test_subset=200 --schedule.epochs=2 --train.batch_size=16"

out=$("$TRAIN" --help 2>&1)
echo "$out" | grep -q "^Usage: fmnist_cnn " && echo "$out" | grep -q "model.arch.*fmnist_cnn" &&
  echo "$out" | grep -q "train.stop_after"
check "--help: cohort-train's keys, model.arch defaulting to fmnist_cnn" test $? = 0

train 2 "$tmp/straight" $args || show "$tmp/straight.log"
check "2 ranks, 2 epochs: model files written" test -f "$tmp/straight/model-1.safetensors"
grep -q "fmnist_cnn: fmnist_cnn, 2 ranks, CPU" "$tmp/straight.log" || show "$tmp/straight.log"

py=${PYTHON3:-/usr/bin/python3}
if [ "${HAVE_TORCH:-no}" = yes ] || "$py" -c 'import torch' 2>/dev/null; then
  "$py" "$src/tests/golden/example_check.py" "$tmp/straight/model-1.safetensors" >&2
  check "model-1.safetensors loads into the PyTorch twin with strict=True" test $? = 0
else
  skip "model-1.safetensors loads into the PyTorch twin with strict=True" "no python3-torch"
fi

# STOP at a held step of epoch 0 (16 steps per epoch): exit 3, then resume
out="$tmp/stop"
stop_file_run 5 "$out" $args
check "a STOP file stops both ranks with exit 3 (got $rc) and a resume file" \
  test "$rc" = 3 -a -f "$out/resume.safetensors"
train 2 "$out" $args --resume || show "$out.log"
check "STOP + --resume == uninterrupted (bitwise)" \
  "$STCMP" --bitwise "$out/model-1.safetensors" "$tmp/straight/model-1.safetensors"
