#!/bin/sh
# cohort-train resumed with another world size:
#  - at an epoch boundary (2 ranks, train.stop_after=1, resume file at epoch
#    1 step 0) 1 rank continues: the log names both world sizes and the
#    rescaled learning rate, epoch 1 runs 1 rank's steps at lr x 1, and two
#    such continuations agree bitwise;
#  - mid-epoch (a preemption signal inside epoch 0) resuming with 1 rank is
#    refused before training (exit 2) with the reason, printed once.
. "${COHORT_SRCDIR:-.}/tests/train_lib.sh"
need_data
echo "1..5"
args="--model.arch=smallcnn --data.train_subset=512 --data.test_subset=200 --schedule.epochs=2 --train.batch_size=16"

train 2 "$tmp/two" $args --train.stop_after=1 || show "$tmp/two.log"
cp -r "$tmp/two" "$tmp/two-b"
train 1 "$tmp/two" $args --resume
rc=$?
check "epoch-boundary resume with 1 rank of a 2-rank file finishes (exit $rc)" \
  test "$rc" = 0 -a -f "$tmp/two/model-1.safetensors"
grep -q "written by 2 ranks, this run has 1: .*rescaled to the new world (0.01 x 1 = 0.01, was 0.02)" \
  "$tmp/two.log" || show "$tmp/two.log"
check "the log names both world sizes and the rescaled learning rate" \
  grep -q "written by 2 ranks, this run has 1: .*rescaled" "$tmp/two.log"
# epoch 1 on 1 rank: lr 0.01 x 1 x lf(1) = 0.0055 (2 ranks had 0.011)
check "epoch 1 runs at the 1-rank learning rate 0.01 x lf(1) = 0.0055" \
  grep -q "^epoch 1: loss .* lr 0.0055 " "$tmp/two.log"
train 1 "$tmp/two-b" $args --resume || show "$tmp/two-b.log"
check "two such continuations agree (bitwise)" \
  "$STCMP" --bitwise "$tmp/two/model-1.safetensors" "$tmp/two-b/model-1.safetensors"

# mid-epoch: stop 2 ranks inside epoch 0 with the warning signal, sent while
# they hold after global step 6 (COHORT_TEST_HOLD): the stop is at step 6
# however fast or slow the machine is
pargs="--model.arch=smallcnn --data.train_subset=24576 --data.test_subset=200 --schedule.epochs=2 --train.batch_size=8"  # 1536 steps per epoch
out="$tmp/mid"
new_hold step 6
COHORT_TEST_HOLD=$hold_env "$MPIEXEC" -n 2 "$TRAIN" --output.dir="$out" --data.workers=1 --train.threads=1 $pargs \
  --train.log_every=1 > "$out.log" 2>&1 &
pid=$!
hold_wait held 2 $pid
pids=$(rank_pids "$out")
[ -n "$pids" ] && kill -USR2 $pids
hold_wait signal 2 $pid
hold_release
wait $pid
prc=$?
"$MPIEXEC" -n 1 "$TRAIN" --output.dir="$out" --data.workers=1 --train.threads=1 $pargs \
  --resume > "$out.resume.log" 2>&1
rc=$?
if ! grep -q "stopping at epoch 0 step 6 (global step 6)" "$out.log"; then
  show "$out.log"; not_ok "the held ranks stop at epoch 0 step 6 on the warning signal (exit $prc)"
elif [ "$rc" = 2 ] && [ "$(grep -c 'written mid-epoch (epoch 0, step [0-9]*) by 2 ranks; resuming it with 1 rank' "$out.resume.log")" = 1 ] \
    && ! grep -q "^epoch " "$out.resume.log"; then
  ok "a mid-epoch file is refused with 1 rank, once, with the reason (exit $rc)"
else
  show "$out.resume.log"; not_ok "mid-epoch resume with another world size (exit $rc)"
fi
