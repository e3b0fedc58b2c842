#!/bin/sh
# cohort-train: a resume compares the resume file's saved configuration with
# the new run's (issue 13):
#  - a key that changes the result (optimizer.lr, schedule.epochs) differs:
#    refused before any work (exit 2), each key named with both values;
#  - keys that do not change the result (train.log_every, data.workers,
#    train.threads) may differ: the run resumes (and the log lists them);
#  - an intended change listed with --resume-allow resumes, logged;
#  - --resume-allow naming a key that does not exist is refused.
. "${COHORT_SRCDIR:-.}/tests/train_lib.sh"
need_data
echo "1..5"
args="--model.arch=smallcnn --data.train_subset=256 --data.test_subset=64 --schedule.epochs=2 --train.batch_size=16 --train.eval=false"
run="$tmp/run"

train 1 "$run" $args --train.stop_after=1 || show "$run.log"
check "stop_after=1 leaves a resume file" test -f "$run/resume.safetensors"

train 1 "$run" $args --resume --optimizer.lr=0.02 --schedule.epochs=3
rc=$?
show "$run.log" 5
check "optimizer.lr and schedule.epochs changed: refused (exit $rc), both keys named with both values" \
  sh -c "[ $rc = 2 ] && grep -q 'differs from the saved one in keys that change the result: optimizer.lr (saved 0.01, now 0.02), schedule.epochs (saved 2, now 3); ' '$run.log' \
         && ! grep -q '^epoch 1' '$run.log' && [ ! -f '$run/model-1.safetensors' ]"

train 1 "$run" $args --resume --resume-allow=optimizer.nosuch --optimizer.lr=0.02
rc=$?
show "$run.log" 5
check "--resume-allow with an unknown key: refused (exit $rc) naming it" \
  sh -c "[ $rc = 2 ] && grep -q \"output.resume_allow: 'optimizer.nosuch' is not a configuration key\" '$run.log'"

cp -r "$run" "$run-allow"
train 1 "$run" $args --resume --train.log_every=1 --data.workers=2 --train.threads=2 \
  --compute.cpu_conv_algorithm=winograd
rc=$?
show "$run.log" 8
check "train.log_every, data.workers, train.threads, compute.cpu_conv_algorithm changed: resumed and finished (exit $rc)" \
  sh -c "[ $rc = 0 ] && grep -q 'resumed from .* at epoch 1, step 0' '$run.log' \
         && grep 'changed (does not change the result): ' '$run.log' | grep 'data.workers (saved 1, now 2)' \
            | grep 'train.log_every (saved 100, now 1)' | grep 'train.threads (saved 1, now 2)' \
            | grep -q 'compute.cpu_conv_algorithm (saved \"*direct\"*, now \"*winograd\"*)' \
         && [ -f '$run/model-1.safetensors' ]"

train 1 "$run-allow" $args --resume --resume-allow optimizer.lr --optimizer.lr=0.02
rc=$?
show "$run-allow.log" 8
check "--resume-allow optimizer.lr: the intended change resumes, logged (exit $rc)" \
  sh -c "[ $rc = 0 ] && grep -q 'changed as output.resume_allow permits: optimizer.lr (saved 0.01, now 0.02)' '$run-allow.log' \
         && [ -f '$run-allow/model-1.safetensors' ]"
