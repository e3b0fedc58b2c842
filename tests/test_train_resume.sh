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
echo "1..12"
args="--model.arch=smallcnn --data.train_subset=512 --data.test_subset=200 --schedule.epochs=2 --train.batch_size=16"

train 2 "$tmp/straight" $args || show "$tmp/straight.log"
train 2 "$tmp/split" $args --train.stop_after=1 || show "$tmp/split.log"
check "stop_after=1 stops after epoch 0 and leaves a resume file" \
  test -f "$tmp/split/resume.safetensors" -a ! -f "$tmp/split/model-1.safetensors"
train 2 "$tmp/split" $args --resume || show "$tmp/split.log"
grep -q "resumed from .* at epoch 1, step 0" "$tmp/split.log" || show "$tmp/split.log"
check "2 epochs straight == 1 epoch + --resume + 1 epoch (bitwise)" \
  "$STCMP" --bitwise "$tmp/split/model-1.safetensors" "$tmp/straight/model-1.safetensors"

# preemption mid-epoch: SIGUSR2 to every rank of the run while the ranks
# hold after global step 6 (COHORT_TEST_HOLD): they stop at epoch 0 step 6
# however fast or slow the machine is (1536 steps per epoch)
pargs="--model.arch=smallcnn --data.train_subset=24576 --data.test_subset=200 --schedule.epochs=2 --train.batch_size=8"
train 2 "$tmp/straight2" $pargs || show "$tmp/straight2.log"
out="$tmp/pre"
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
rc=$?
grep -q "preemption signal" "$out.log" || show "$out.log"
check "a preemption signal stops every rank at one step boundary with exit 3 (got $rc)" \
  test "$rc" = 3 -a -f "$out/resume.safetensors"
check "the stop is at the held step: epoch 0 step 6 (global step 6)" \
  grep -q "^preemption signal [0-9]*: stopping at epoch 0 step 6 (global step 6); writing " "$out.log"
"$MPIEXEC" -n 2 "$TRAIN" --output.dir="$out" --data.workers=1 --train.threads=1 $pargs \
  --resume >> "$out.log" 2>&1
rc=$?
check "the resumed run finishes (exit $rc) and names its resume point" \
  grep -q "resumed from .* at epoch [01], step [0-9]" "$out.log"
check "preempted + resumed == uninterrupted (bitwise)" \
  "$STCMP" --bitwise "$out/model-1.safetensors" "$tmp/straight2/model-1.safetensors"

# a rank dies (SIGKILL) in the middle of epoch 1 (the ranks held after its
# step 3, global step 1539): the job ends non-zero within 60 s, and the
# checkpoint of epoch 0 still loads.
out="$tmp/kill"
new_hold step 1539
COHORT_TEST_HOLD=$hold_env "$MPIEXEC" -n 2 "$TRAIN" --output.dir="$out" --data.workers=1 --train.threads=1 $pargs \
  --schedule.epochs=3 --train.log_every=1 > "$out.log" 2>&1 &
pid=$!
hold_wait held 2 $pid
victim=$(rank_pids "$out" | tail -n 1)
t1=$(date +%s)
[ -n "$victim" ] && kill -9 "$victim"  # it dies mid-run, not after it
hold_release
wait $pid
rc=$?
dt=$(($(date +%s) - t1))
check "a killed rank ends the job non-zero (exit $rc) within 60 s (took ${dt} s)" \
  test -n "$victim" -a "$rc" != 0 -a "$dt" -le 60
check "the last good checkpoint still loads" \
  "$STCMP" --bitwise "$out/model-0.safetensors" "$out/model-0.safetensors"

# a run started afresh (no --resume) into the killed run's directory: the
# killed run's resume file is kept as resume-earlier.safetensors, not lost
cp "$out/resume.safetensors" "$tmp/killed-resume.safetensors"
train 2 "$out" $args || show "$out.log"
check "a fresh run into a stopped run's directory keeps its resume file (resume-earlier), saying so" \
  eval 'cmp -s "$out/resume-earlier.safetensors" "$tmp/killed-resume.safetensors" && grep -q "that file is kept as $out/resume-earlier.safetensors" "$out.log"'
# once more: the next kept file gets the next name, the first is not replaced
train 2 "$out" $args || show "$out.log"
check "... and a second fresh run keeps the next one as resume-earlier-2, the first unchanged" \
  eval 'test -f "$out/resume-earlier-2.safetensors" && cmp -s "$out/resume-earlier.safetensors" "$tmp/killed-resume.safetensors"'

# TensorBoard itself reads the run's event files (scalars by epoch as in
# metrics.csv); SKIP when the tensorboard package is not installed.
py=${PYTHON3:-/usr/bin/python3}
if "$py" -c 'import tensorboard' 2>/dev/null; then
  "$py" - "$tmp/straight" > "$tmp/expected.json" <<'PY'
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1] + "/metrics.csv")))
cols = [c for c in rows[0] if c not in ("epoch", "step", "wall_time")]
scalars = {c: [[int(r["epoch"]), float(r[c])] for r in rows] for c in cols}
# file_version, session start, then one scalar per column per epoch
print(json.dumps({"events_total": 2 + len(rows) * len(cols), "scalars": scalars}))
PY
  check "TensorBoard reads loss, accuracy, learning_rate, images_per_sec by epoch" \
    "$py" "$src/tests/golden/tensorboard_check.py" "$tmp/straight" "$tmp/expected.json"
  check "the CSV twin has one row per epoch with those columns" \
    grep -q "^epoch,step,wall_time,loss,accuracy,accuracy_exact,learning_rate,images_per_sec,seconds" \
    "$tmp/straight/metrics.csv"
else
  skip "TensorBoard reads the event files" "tensorboard not installed for $py (.ci/pip-packages)"
  skip "the CSV twin" "checked with the TensorBoard test"
fi
