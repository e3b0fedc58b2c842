#!/bin/bash
# cohort: production Slurm settings (issue 13) on the local test cluster
# (slurm/testcluster --preempt-grace G [--preempt-user-signal]: the default
# partition preemptable with PreemptMode=REQUEUE by jobs of partition
# `high`). jobs/cohort-train under the cpu-1node template (2 tasks):
#  - preemption by a `high` job (4 tasks on the 4 CPUs) while the job
#    trains, under each of
#      GraceTime=10 without preempt_send_user_signal (SIGTERM to the ranks
#        only: the template requeues after exit 3),
#      GraceTime=10 with preempt_send_user_signal (USR2 to the batch shell,
#        forwarded: the template requeues after exit 3),
#      GraceTime=0 (SIGTERM to the whole job: Slurm requeues it);
#    each ends COMPLETED, restarted once, with the final model bitwise equal
#    to an uninterrupted mpiexec run, metrics.csv with one row per epoch and
#    TensorBoard (when installed) showing one point per epoch;
#  - a second job submitted into the run directory of a running one is
#    refused at once (exit 2, naming the holder), the first one unharmed;
#  - the warning signal arriving after the last epoch's model file (training
#    done): the job ends COMPLETED and is not requeued;
#  - scancel while the job trains: CANCELLED, not requeued.
# The ranks hold themselves where a case needs them (COHORT_TEST_HOLD, see
# tests/slurm_train_lib.sh) while a signal travels or a second job is
# submitted, so that each case meets a running job at one chosen step
# however fast or slow the machine is. Prints TAP; SKIPs where Slurm is
# not installed or usable (not root) or the data set is missing.
set -u
. "${COHORT_SRCDIR:-$(dirname "$0")/..}/tests/test_slurm_lib.sh"
. "$srcdir/tests/slurm_train_lib.sh"
slurm_skip_unless_available
train_skip_unless_ready

make_workdir w
cd "$w" || exit 1
write_cfg "$w/mid.cfg" 1024 200 3    # 2 ranks x 16 = 32 per step: 32 steps per epoch
ref_run 2 "$w/mid.cfg" "$w/ref"
ok $? "reference: uninterrupted mpiexec -n 2 run, 3 epochs of 32 steps"
ended="COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY PREEMPTED"

# submit_train [OVERRIDES...]: cpu-1node with cohort-train, held as
# $hold_env says (new_hold; empty: no hold); sets jid, outfile, rundir.
hold_env=
submit_train() {
    jid=$(COHORT_TEST_HOLD=$hold_env COHORT_BIN=$train_prog submit "$srcdir/slurm/cpu-1node.sbatch" "$w/mid.cfg" \
          --set train.log_every=1 "$@")
    outfile=$PWD/cohort-cpu-$jid.out
    rundir=$PWD/runs/cohort-cpu-$jid
}

# new_cluster ARGS...: a fresh submit directory (job ids start again with
# each cluster: their output files and run directories must not meet) and a
# cluster.
new_cluster() {
    make_workdir submit_dir
    cd "$submit_dir" || exit 1
    cluster_up c --nodes 1 --cpus 4 "$@"
}

# release_requeued: a requeued job waits for its old credential (10 s here);
# let it start sooner (now+2, see slurm/README.md), then wait for the end.
release_requeued() {
    wait_job_state "$jid" 60 PENDING && scontrol update JobId="$jid" StartTime=now+2
    wait_job_state "$jid" 180 $ended
    grep -v '^ \|^epoch [0-9]* step ' "$outfile" 2>/dev/null | diag
}

# consistent WHAT: the job completed after one restart, its final model is
# the uninterrupted run's, its history one row / point per epoch.
consistent() {
    [ "$job_state" = COMPLETED ] && [ "$(job_field "$jid" Restarts)" = 1 ] \
        && [ "$(job_field "$jid" ExitCode)" = 0:0 ] \
        && grep -q "^resumed from $rundir/resume.safetensors at epoch" "$outfile" \
        && [ "$(grep -c '^training finished: 3 epochs' "$outfile")" = 1 ]
    ok $? "$1: COMPLETED after one requeue, resumed from its resume file (job $jid, $job_state)"
    same_model "$rundir/model-2.safetensors" "$w/ref/model-2.safetensors"
    ok $? "$1: preempted + requeued + resumed == uninterrupted (bitwise)"
    echo "metrics.csv epoch,step: $(cut -d, -f1,2 "$rundir/metrics.csv" 2>/dev/null | tr '\n' ' ')" | diag
    epochs_once "$rundir/metrics.csv" 3 \
        && [ "$(cut -d, -f2 "$rundir/metrics.csv" | tail -n +2 | tr '\n' ' ')" = "32 64 96 " ]
    ok $? "$1: metrics.csv has one row per epoch 0, 1, 2 (global steps 32, 64, 96)"
    local out rc
    out=$(tensorboard_once "$rundir" 2>&1)
    rc=$?
    echo "$out" | diag
    if [ $rc = 77 ]; then
        ok 0 "$1: TensorBoard shows one point per epoch # SKIP tensorboard not installed (.ci/pip-packages)"
    else
        ok $rc "$1: TensorBoard merges the runs' event files into one point per epoch, the CSV's values"
    fi
}

# preempt_case WHAT SIGNAL LINE: submit, the ranks held after global step 33
# (epoch 1, step 1 of 32: epoch 0's model file written), submit a `high` job
# that needs every CPU (Slurm preempts this one), wait until the preemption
# signal has reached both held ranks, let them go (they stop at that step),
# wait for the end. SIGNAL: the signal the ranks must report; LINE: the
# template's line expected in the output ("" for none).
preempt_case() {
    local what=$1 sig=$2 line=$3 hj said
    new_hold step 33
    submit_train
    hold_wait held 90
    hj=$(submit -p high -n 4 -o /dev/null --wrap 'sleep 1')
    hold_wait signal 30
    hold_release
    hold_env=
    release_requeued
    wait_job_state "$hj" 60 COMPLETED FAILED CANCELLED
    sed -n 's/^\(preemption signal [0-9]*[^;]*\).*/\1/p' "$outfile" | diag
    said="Slurm requeues (the template does not)"
    [ -n "$line" ] && said="the template says '$line' and requeues"
    grep -q "^preemption signal $(kill -l "$sig"): stopping at epoch 1 step 1 (global step 33); writing $rundir/resume.safetensors\$" "$outfile" \
        && grep -q '^srun: error: .*Exited with exit code 3$' "$outfile" \
        && if [ -n "$line" ]; then [ "$(grep -c "^$line: requeueing job $jid to resume from $rundir\$" "$outfile")" = 1 ]
           else ! grep -q ': requeueing job' "$outfile"; fi
    ok $? "$what: the ranks stop on SIG$sig at epoch 1 step 1, write the resume file, exit 3; $said (job $jid)"
    consistent "$what"
}

# ---- GraceTime=10, no user signal
new_cluster --preempt-grace 10
ok $? "cluster: GraceTime=10, PreemptMode=REQUEUE, without preempt_send_user_signal"
preempt_case "GraceTime=10 without the user signal" TERM "preempted (SIGTERM to the ranks only)"

# ---- two jobs, one run directory: the second refused at once
new_hold step 33
submit_train
hold_env=
a_jid=$jid a_out=$outfile a_dir=$rundir
hold_wait held 90
jid=$(RUN_DIR=$a_dir COHORT_BIN=$train_prog submit "$srcdir/slurm/cpu-1node.sbatch" "$w/mid.cfg" \
      --set optimizer.lr=0.02)
wait_job_state "$jid" 60 $ended
diag <"$PWD/cohort-cpu-$jid.out"
[ "$job_state" = FAILED ] && [ "$(job_field "$jid" ExitCode)" = 2:0 ] \
    && [ "$(job_field "$jid" Restarts)" = 0 ] \
    && grep -q "^cohort-train: rank 0: output directory: output.dir: '$a_dir' is in use by another run: host=[^ ]* job=$a_jid pid=[0-9]* holds its lock $a_dir/cohort.lock" "$PWD/cohort-cpu-$jid.out"
ok $? "a second job into the run directory of job $a_jid is refused at once, naming the holder (job $jid, $job_state)"
hold_release
jid=$a_jid outfile=$a_out rundir=$a_dir
wait_job_state "$jid" 180 $ended
[ "$job_state" = COMPLETED ] && [ "$(job_field "$jid" Restarts)" = 0 ] \
    && same_model "$rundir/model-2.safetensors" "$w/ref/model-2.safetensors" && epochs_once "$rundir/metrics.csv" 3
ok $? "the first job is unharmed: COMPLETED, its model the uninterrupted run's, one metrics row per epoch (job $jid)"

# ---- the warning after the last epoch: not requeued
new_hold epoch 2    # the last epoch's model and resume files written
submit_train
hold_env=
hold_wait held 90
scancel -b -s USR2 "$jid"
hold_wait signal 30
hold_release
wait_job_state "$jid" 120 $ended
sleep 1
grep -v '^ \|^epoch [0-9]* step ' "$outfile" 2>/dev/null | diag
[ "$job_state" = COMPLETED ] && [ "$(job_field "$jid" Restarts)" = 0 ] \
    && [ "$(job_field "$jid" ExitCode)" = 0:0 ] && grep -q '^training finished: 3 epochs' "$outfile" \
    && ! grep -q 'requeueing' "$outfile" && [ "$(job_field "$jid" JobState)" = COMPLETED ]
ok $? "the warning signal after training finished: exit 0, COMPLETED, not requeued (job $jid, $job_state)"
# ---- scancel while training: the batch shell gets SIGTERM too, no requeue
new_hold step 33
submit_train
hold_env=
hold_wait held 90
scancel "$jid"
hold_wait signal 30
hold_release
wait_job_state "$jid" 60 $ended
sleep 3    # a requeue would show now as PENDING and Restarts=1
grep -v '^ \|^epoch [0-9]* step ' "$outfile" 2>/dev/null | diag
[ "$(job_field "$jid" JobState)" = CANCELLED ] && [ "$(job_field "$jid" Restarts)" = 0 ] \
    && ! grep -q 'requeueing' "$outfile"
ok $? "scancel while the job trains: CANCELLED, not requeued (job $jid, $job_state)"
cluster_down "$c"
ok $? "cluster goes down"

# ---- GraceTime=10 with preempt_send_user_signal
new_cluster --preempt-grace 10 --preempt-user-signal
ok $? "cluster: GraceTime=10, PreemptMode=REQUEUE, preempt_send_user_signal"
preempt_case "GraceTime=10 with the user signal" USR2 "warning signal received"
cluster_down "$c"
ok $? "cluster goes down"

# ---- GraceTime=0
new_cluster --preempt-grace 0
ok $? "cluster: GraceTime=0, PreemptMode=REQUEUE"
preempt_case "GraceTime=0" TERM ""
cd / || exit 1
cluster_down "$c"
ok $? "cluster goes down"

finish
