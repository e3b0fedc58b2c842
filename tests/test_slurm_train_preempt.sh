#!/bin/bash
# cohort: preemption, requeue and resume of jobs/cohort-train on a real local
# Slurm cluster (slurm/testcluster). The cpu-1node template runs the job with
# 2 tasks; `scancel -b -s USR2` (the warning signal of #SBATCH --signal=B:USR2)
# reaches the batch shell while the job trains; the template forwards it to
# the ranks, which agree to stop at one step boundary; rank 0 writes the
# resume file, the job exits 3, the template requeues it, and the rerun
# (output.resume=auto) continues from the resume point to final parameters
# bitwise equal to an uninterrupted run of the same length:
#  - mid-epoch (the signal while the ranks are held after global step 33:
#    they stop at step 1 of 32 of epoch 1), the log naming the resume point
#    and the learning rate at the start and after the resume;
#  - with one step per epoch, so that the stop is agreed at an epoch's last
#    step (held after global step 5: epoch 4): that epoch is finished and the
#    rerun starts at the next one.
# Prints TAP; SKIPs where Slurm is not installed or usable (not root) or the
# data set is missing. The cluster is always torn down. While the signal
# travels (scancel -> slurmd -> batch shell -> srun -> ranks), the ranks hold
# themselves at the step the test chose (COHORT_TEST_HOLD, see
# tests/slurm_train_lib.sh), so the stop lands there however fast or slow
# the machine is.
set -u
. "${COHORT_SRCDIR:-$(dirname "$0")/..}/tests/test_slurm_lib.sh"
. "$srcdir/tests/slurm_train_lib.sh"
slurm_skip_unless_available
train_skip_unless_ready

make_workdir w
cd "$w" || exit 1
write_cfg "$w/mid.cfg" 1024 200 3    # 2 ranks x 16 = 32 per step: 32 steps per epoch
write_cfg "$w/end.cfg" 32 32 30      # 1 step per epoch, 30 epochs

ref_run 2 "$w/mid.cfg" "$w/ref-mid"
ok $? "reference: uninterrupted mpiexec -n 2 run, 3 epochs of 32 steps"
ref_run 2 "$w/end.cfg" "$w/ref-end" --set output.save_every=0
ok $? "reference: uninterrupted mpiexec -n 2 run, 30 epochs of 1 step"

cluster_up c --nodes 1 --cpus 4
ok $? "1-node cluster (4 CPUs) comes up"

# preempt_run CONFIG STEP [OVERRIDES...]: submit cpu-1node with the job, its
# ranks held after global step STEP (before that step's stop check); once
# both hold, send USR2 to the batch shell (scancel -b), wait until the
# template's forwarding has brought USR2 to both ranks, and let them go on:
# they stop at that step. Then let the template requeue the job, release
# it, wait for the end. Sets jid, job_state, outfile, rundir.
preempt_run() {
    local cfg=$1 step=$2
    shift 2
    new_hold step "$step"
    jid=$(COHORT_TEST_HOLD=$hold_env COHORT_BIN=$train_prog submit "$srcdir/slurm/cpu-1node.sbatch" "$cfg" \
          --set train.log_every=1 "$@")
    outfile=$w/cohort-cpu-$jid.out
    rundir=$w/runs/cohort-cpu-$jid
    hold_wait held 90
    scancel -b -s USR2 "$jid"
    hold_wait signal 30
    hold_release
    wait_file_line "$outfile" '^warning signal received: requeueing' 60 \
        || echo "the template did not requeue the job" | diag
    # Requeued, the job waits for its old credential to expire (10 s on the
    # test cluster); release it sooner (now+2, not now: see slurm/README.md).
    wait_job_state "$jid" 30 PENDING && scontrol update JobId="$jid" StartTime=now+2
    wait_job_state "$jid" 180 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY
    grep -v '^ \|^epoch [0-9]* step ' "$outfile" 2>/dev/null | diag
}

# ---- mid-epoch
preempt_run "$w/mid.cfg" 33
stop=$(sed -n 's/^preemption signal [0-9]*: stopping at epoch \([0-9]*\) step \([0-9]*\) .*/\1 \2/p' "$outfile")
stop_end=$(sed -n 's/^preemption signal [0-9]* at the end of epoch \([0-9]*\) .*/\1/p' "$outfile")
echo "stopped at (epoch step): '$stop', at the end of epoch: '$stop_end'" | diag
[ "$stop" = "1 1" ] && [ -z "$stop_end" ] \
    && grep -q '^srun: error: .*Exited with exit code 3$' "$outfile" \
    && [ "$(grep -c "^warning signal received: requeueing job $jid" "$outfile")" = 1 ]
ok $? "USR2 to the batch shell: the ranks stop together at epoch 1 step 1, write the resume file, exit 3, and the template requeues (job $jid)"
[ "$job_state" = COMPLETED ] && [ "$(job_field "$jid" Restarts)" = 1 ] \
    && [ "$(job_field "$jid" ExitCode)" = 0:0 ] && grep -q "^job $jid (restart 1) on" "$outfile" \
    && [ "$(grep -c '^training finished: 3 epochs' "$outfile")" = 1 ]
ok $? "the requeued job reruns once and completes (job $jid, $job_state)"
# The resume point: where the ranks stopped, or, when they agreed at an
# epoch's last step (the second part below tests that case on
# purpose), step 0 of the next epoch.
if [ -n "$stop" ]; then
    set -- $stop
elif [ -n "$stop_end" ]; then
    set -- $((stop_end + 1)) 0
else
    set -- none none
fi
grep -q "^resumed from $rundir/resume.safetensors at epoch $1, step $2 of the epoch" "$outfile"
ok $? "the rerun's log shows the resume point: epoch $1, step $2"
# lr 0.01 x 2 ranks, cosine over 3 epochs with lrf 0.1, printed with %.8g
lrs=$(sed -n 's/^epoch \([0-9]*\): learning rate \(.*\)$/\1 \2/p' "$outfile" | tr '\n' ' ')
echo "learning rate lines: $lrs" | diag
set -- "$1" $lrs
[ $# = 5 ] && [ "$2 $3" = "0 0.02" ] && [ "$4" = "$1" ] && close_to "$5" "$(cosine_lr 0.02 "$1" 3 0.1)" 1e-7
ok $? "the learning rate is printed at the start (epoch 0: 0.02) and again after the resume (epoch ${4:-?}: ${5:-?})"
same_model "$rundir/model-2.safetensors" "$w/ref-mid/model-2.safetensors"
ok $? "preempted + requeued + resumed == uninterrupted (bitwise)"

# ---- stop agreed at an epoch's last step (one step per epoch)
preempt_run "$w/end.cfg" 5 --set output.save_every=0
stop_end=$(sed -n 's/^preemption signal [0-9]* at the end of epoch \([0-9]*\) .*/\1/p' "$outfile")
echo "stopped at the end of epoch '$stop_end'" | diag
[ "$stop_end" = 4 ] \
    && grep -q '^srun: error: .*Exited with exit code 3$' "$outfile" \
    && grep -q "^resumed from $rundir/resume.safetensors at epoch $((stop_end + 1)), step 0 of the epoch" "$outfile" \
    && [ "$job_state" = COMPLETED ] && [ "$(job_field "$jid" Restarts)" = 1 ] \
    && [ "$(grep -c '^training finished: 30 epochs' "$outfile")" = 1 ]
ok $? "stop at an epoch's last step: epoch ${stop_end:-?} finished, exit 3, requeued, resumed at the next epoch, completed (job $jid, $job_state)"
lrs=$(sed -n 's/^epoch \([0-9]*\): learning rate \(.*\)$/\1 \2/p' "$outfile" | tr '\n' ' ')
echo "learning rate lines: $lrs" | diag
set -- $lrs
[ $# = 4 ] && [ "$1 $2" = "0 0.02" ] && [ "$3" = "$((${stop_end:-0} + 1))" ] \
    && close_to "$4" "$(cosine_lr 0.02 "$3" 30 0.1)" 1e-7
ok $? "the learning rate after the resume at epoch ${3:-?} is the schedule's (${4:-?})"
same_model "$rundir/model-29.safetensors" "$w/ref-end/model-29.safetensors"
ok $? "stopped at an epoch's end + resumed == uninterrupted (bitwise)"

cd / || exit 1
cluster_down "$c"
ok $? "cluster goes down"

finish
