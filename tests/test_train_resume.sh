#!/bin/sh
# cohort-train resume and failure handling:
#  - 2 epochs straight == 1 epoch, stop, --resume, 1 more epoch (bitwise);
#  - a preemption signal mid-epoch: all ranks stop at the same step, rank 0
#    writes the resume file, exit 3; --resume continues to the same result
#    as an uninterrupted run (bitwise);
#  - a rank killed mid-run ends the job non-zero within 60 s and the last
#    good checkpoint still loads.
. "${COHORT_SRCDIR:-.}/tests/train_lib.sh"
need_data
echo "1..7"
args="--model.arch=smallcnn --data.train_subset=512 --data.test_subset=200 --schedule.epochs=2 --train.batch_size=16"

train 2 "$tmp/straight" $args || show "$tmp/straight.log"
train 2 "$tmp/split" $args --train.stop_after=1 || show "$tmp/split.log"
check "stop_after=1 stops after epoch 0 and leaves a resume file" \
  test -f "$tmp/split/resume.safetensors" -a ! -f "$tmp/split/model-1.safetensors"
train 2 "$tmp/split" $args --resume || show "$tmp/split.log"
grep -q "resumed from .* at epoch 1, step 0" "$tmp/split.log" || show "$tmp/split.log"
check "2 epochs straight == 1 epoch + --resume + 1 epoch (bitwise)" \
  "$STCMP" --bitwise "$tmp/split/model-1.safetensors" "$tmp/straight/model-1.safetensors" >&2

# preemption mid-epoch: SIGUSR2 to every rank of the run
out="$tmp/pre"
"$MPIEXEC" -n 2 "$TRAIN" --output.dir="$out" --data.workers=1 --train.threads=1 $args \
  --train.log_every=1 > "$out.log" 2>&1 &
pid=$!
t0=$(date +%s)
while ! grep -q "epoch 0 step 6/" "$out.log" 2>/dev/null; do
  [ $(($(date +%s) - t0)) -gt 120 ] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.2
done
pkill -USR2 -f -- "--output.dir=$out " 2>/dev/null
wait $pid
rc=$?
grep -q "preemption signal" "$out.log" || show "$out.log"
check "a preemption signal stops every rank at one step boundary with exit 3 (got $rc)" \
  test "$rc" = 3 -a -f "$out/resume.safetensors"
"$MPIEXEC" -n 2 "$TRAIN" --output.dir="$out" --data.workers=1 --train.threads=1 $args \
  --resume >> "$out.log" 2>&1
rc=$?
check "the resumed run finishes (exit $rc) and names its resume point" \
  grep -q "resumed from .* at epoch 0, step [1-9]" "$out.log"
check "preempted + resumed == uninterrupted (bitwise)" \
  "$STCMP" --bitwise "$out/model-1.safetensors" "$tmp/straight/model-1.safetensors" >&2

# a rank dies (SIGKILL) in the middle of epoch 1: the job ends non-zero
# within 60 s, and the checkpoint of epoch 0 still loads.
out="$tmp/kill"
"$MPIEXEC" -n 2 "$TRAIN" --output.dir="$out" --data.workers=1 --train.threads=1 $args \
  --schedule.epochs=3 --train.log_every=1 > "$out.log" 2>&1 &
pid=$!
t0=$(date +%s)
while ! grep -q "epoch 1 step 3/" "$out.log" 2>/dev/null; do
  [ $(($(date +%s) - t0)) -gt 120 ] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.2
done
victim=$(pgrep -f -- "--output.dir=$out " | while read p; do
  # a rank, not mpiexec or the hydra proxy
  case "$(cat /proc/$p/comm 2>/dev/null)" in cohort-train|lt-cohort-train) echo $p ;; esac
done | tail -n 1)
t1=$(date +%s)
[ -n "$victim" ] && kill -9 "$victim"
wait $pid
rc=$?
dt=$(($(date +%s) - t1))
check "a killed rank ends the job non-zero (exit $rc) within 60 s (took ${dt} s)" \
  test -n "$victim" -a "$rc" != 0 -a "$dt" -le 60
check "the last good checkpoint still loads" \
  "$STCMP" --bitwise "$out/model-0.safetensors" "$out/model-0.safetensors" >&2
