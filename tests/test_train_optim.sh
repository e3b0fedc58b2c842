#!/bin/sh
# cohort-train with the optimizers, schedules and loss beside SGD/cosine
# (optimizer.name, schedule.name + warmup, loss.label_smoothing):
#  - adamw and rmsprop: 1 epoch + train.stop_after + --resume + 1 epoch, and
#    a STOP file mid-epoch + --resume, give the model files of an
#    uninterrupted run (bitwise: the optimizer state is in the resume file);
#  - a resume file of one optimizer refuses a run with another;
#  - 2 ranks, adamw + label smoothing + multistep with linear warmup: the
#    loss is finite and falls, and metrics.csv's learning_rate column is
#    torch.optim.lr_scheduler's SequentialLR(LinearLR, MultiStepLR) sequence
#    (closed form without python3-torch).
. "${COHORT_SRCDIR:-.}/tests/train_lib.sh"
need_data
echo "1..11"
base="--model.arch=smallcnn --data.train_subset=512 --data.test_subset=100 --schedule.epochs=2 --train.batch_size=16"

for opt in adamw rmsprop; do
  args="$base --optimizer.name=$opt --optimizer.lr=0.001"
  train 2 "$tmp/$opt-straight" $args || show "$tmp/$opt-straight.log"
  train 2 "$tmp/$opt-split" $args --train.stop_after=1 || show "$tmp/$opt-split.log"
  train 2 "$tmp/$opt-split" $args --resume || show "$tmp/$opt-split.log"
  grep -q "resumed from .* at epoch 1, step 0" "$tmp/$opt-split.log" || show "$tmp/$opt-split.log"
  check "$opt: 1 epoch + stop_after + --resume + 1 epoch == 2 epochs straight (bitwise)" \
    "$STCMP" --bitwise "$tmp/$opt-split/model-1.safetensors" "$tmp/$opt-straight/model-1.safetensors"

  # a STOP file at a held step of epoch 0 (16 steps per epoch): mid-epoch state
  out="$tmp/$opt-stop"
  stop_file_run 5 "$out" $args
  check "$opt: a STOP file mid-epoch stops with exit 3 (got $rc) and a resume file" \
    test "$rc" = 3 -a -f "$out/resume.safetensors"
  train 2 "$out" $args --resume || show "$out.log"
  check "$opt: STOP mid-epoch + --resume == uninterrupted (bitwise)" \
    "$STCMP" --bitwise "$out/model-1.safetensors" "$tmp/$opt-straight/model-1.safetensors"
done

# the adamw resume file does not continue an rmsprop (or sgd) run
train 2 "$tmp/adamw-split" $base --optimizer.name=rmsprop --optimizer.lr=0.001 --resume
rc=$?
check "an adamw resume file refuses optimizer.name = rmsprop (exit $rc)" \
  sh -c "test $rc = 2 && grep -q 'optimizer.name (saved \"adamw\", now \"rmsprop\")' '$tmp/adamw-split.log'"
train 2 "$tmp/adamw-split" $base --optimizer.lr=0.001 --resume
rc=$?
check "an adamw resume file refuses the default sgd (exit $rc)" \
  sh -c "test $rc = 2 && grep -q 'optimizer.name (saved \"adamw\", now \"sgd\")' '$tmp/adamw-split.log'"

# 2 ranks: adamw + label smoothing + multistep after a linear warmup
out="$tmp/recipe"
train 2 "$out" --model.arch=smallcnn --data.train_subset=1024 --data.test_subset=100 \
  --train.batch_size=16 --optimizer.name=adamw --optimizer.lr=0.0005 --loss.label_smoothing=0.1 \
  --schedule.name=multistep --schedule.milestones=2,3 --schedule.gamma=0.5 \
  --schedule.warmup_epochs=1 --schedule.warmup_method=linear --schedule.warmup_factor=0.2 \
  --schedule.epochs=5 || show "$out.log"
check "adamw + label smoothing + multistep + warmup on 2 ranks: the loss is finite and falls" \
  awk -F, 'NR > 1 { if ($4 != $4 + 0 || $4 == "nan" || $4 == "inf") exit 1; l[NR] = $4; n = NR }
           END { if (n != 6) exit 1; for (i = 3; i <= n; i++) if (l[i] >= l[i - 1]) exit 1 }' \
  "$out/metrics.csv"
awk -F, 'NR > 1 { print $7 }' "$out/metrics.csv" > "$tmp/lr.got"
py=${PYTHON3:-/usr/bin/python3}
if "$py" -c 'import torch' 2>/dev/null; then
  "$py" - > "$tmp/lr.want" <<'PY'
import warnings
import torch
warnings.simplefilter("ignore")
p = torch.nn.Parameter(torch.zeros(1))
opt = torch.optim.AdamW([p], lr=0.0005 * 2)  # x world size
warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.2, total_iters=1)
main = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[2, 3], gamma=0.5)
s = torch.optim.lr_scheduler.SequentialLR(opt, [warm, main], milestones=[1])
for e in range(5):
    print("%.9g" % opt.param_groups[0]["lr"])
    opt.step()
    s.step()
PY
  how="torch's SequentialLR(LinearLR, MultiStepLR)"
else
  printf '%s\n' 0.0002 0.001 0.001 0.0005 0.00025 > "$tmp/lr.want"
  how="the closed form (no python3-torch)"
fi
check "metrics.csv learning_rate follows $how" cmp "$tmp/lr.got" "$tmp/lr.want"
grep -q "optimizer: AdamW" "$out.log" || show "$out.log"
check "the run describes its optimizer, schedule and loss" \
  sh -c "grep -q 'optimizer: AdamW' '$out.log' && grep -q 'multistep' '$out.log' && grep -q 'label smoothing 0.1' '$out.log'"
