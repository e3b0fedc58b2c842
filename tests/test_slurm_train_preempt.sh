#!/bin/bash
# cohort: preemption, requeue and resume of jobs/cohort-train on a real local
# Slurm cluster (slurm/testcluster). The cpu-1node template runs the job with
# 2 tasks; `scancel -b -s USR2` (the warning signal of #SBATCH --signal=B:USR2)
# reaches the batch shell while the job trains; the template forwards it to
# the ranks, which agree to stop at one step boundary; rank 0 writes the
# resume file, the job exits 3, the template requeues it, and the rerun
# (output.resume=auto) continues from the resume point to final parameters
# bitwise equal to an uninterrupted run of the same length:
#  - mid-epoch (16 steps per epoch), the log naming the resume point and the
#    learning rate at the start and after the resume;
#  - with one step per epoch, so that the stop is agreed at an epoch's last
#    step: that epoch is finished and the rerun starts at the next one.
# Prints TAP; SKIPs where Slurm is not installed or usable (not root) or the
# data set is missing. The cluster is always torn down.
set -u
. "${COHORT_SRCDIR:-$(dirname "$0")/..}/tests/test_slurm_lib.sh"
. "$srcdir/tests/slurm_train_lib.sh"
slurm_skip_unless_available
train_skip_unless_ready

make_workdir w
cd "$w" || exit 1
write_cfg "$w/mid.cfg" 512 200 2     # 2 ranks x 16 = 32 per step: 16 steps per epoch
write_cfg "$w/end.cfg" 32 32 30      # 1 step per epoch, 30 epochs

ref_run 2 "$w/mid.cfg" "$w/ref-mid"
ok $? "reference: uninterrupted mpiexec -n 2 run, 2 epochs of 16 steps"
ref_run 2 "$w/end.cfg" "$w/ref-end" --set output.save_every=0
ok $? "reference: uninterrupted mpiexec -n 2 run, 30 epochs of 1 step"

cluster_up c --nodes 1 --cpus 4
ok $? "1-node cluster (4 CPUs) comes up"

# preempt_run CONFIG WAIT_PATTERN [OVERRIDES...]: submit cpu-1node with the
# job, send USR2 to the batch shell once the output shows WAIT_PATTERN, let
# the template requeue the job, release it, wait for the end. Sets jid,
# job_state, outfile, rundir.
preempt_run() {
    local cfg=$1 pattern=$2
    shift 2
    jid=$(COHORT_BIN=$train_prog submit "$srcdir/slurm/cpu-1node.sbatch" "$cfg" \
          --set train.log_every=1 "$@")
    outfile=$w/cohort-cpu-$jid.out
    rundir=$w/runs/cohort-cpu-$jid
    wait_file_line "$outfile" "$pattern" 90 || echo "no line '$pattern' in $outfile" | diag
    scancel -b -s USR2 "$jid"
    wait_file_line "$outfile" '^warning signal received: requeueing' 60 \
        || echo "the template did not requeue the job" | diag
    # Requeued, the job waits for its old credential to expire (10 s on the
    # test cluster); release it sooner (now+2, not now: see slurm/README.md).
    wait_job_state "$jid" 30 PENDING && scontrol update JobId="$jid" StartTime=now+2
    wait_job_state "$jid" 180 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY
    grep -v '^ \|^epoch [0-9]* step ' "$outfile" 2>/dev/null | diag
}

# ---- mid-epoch
preempt_run "$w/mid.cfg" '^epoch 0 step 3/16'
stop=$(sed -n 's/^preemption signal [0-9]*: stopping at epoch \([0-9]*\) step \([0-9]*\) .*/\1 \2/p' "$outfile")
stop_end=$(sed -n 's/^preemption signal [0-9]* at the end of epoch \([0-9]*\) .*/\1/p' "$outfile")
echo "stopped at (epoch step): '$stop', at the end of epoch: '$stop_end'" | diag
{ [ -n "$stop" ] || [ -n "$stop_end" ]; } \
    && grep -q '^srun: error: .*Exited with exit code 3$' "$outfile" \
    && [ "$(grep -c "^warning signal received: requeueing job $jid" "$outfile")" = 1 ]
ok $? "USR2 to the batch shell: the ranks stop together, write the resume file, exit 3, and the template requeues (job $jid)"
[ "$job_state" = COMPLETED ] && [ "$(job_field "$jid" Restarts)" = 1 ] \
    && [ "$(job_field "$jid" ExitCode)" = 0:0 ] && grep -q "^job $jid (restart 1) on" "$outfile" \
    && [ "$(grep -c '^training finished: 2 epochs' "$outfile")" = 1 ]
ok $? "the requeued job reruns once and completes (job $jid, $job_state)"
if [ -n "$stop" ]; then
    set -- $stop
    grep -q "^resumed from $rundir/resume.safetensors at epoch $1, step $2 of the epoch" "$outfile"
    ok $? "the rerun's log shows the resume point: epoch $1, step $2"
    # lr 0.01 x 2 ranks, cosine over 2 epochs with lrf 0.1: 0.02, then 0.011
    [ "$(grep '^epoch [0-9]*: learning rate' "$outfile" | tr '\n' ' ')" = "epoch 0: learning rate 0.02 epoch $1: learning rate $([ "$1" = 0 ] && echo 0.02 || echo 0.011) " ]
    ok $? "the learning rate is printed at the start and again after the resume at epoch $1"
else
    # The flag was agreed at the epoch's last step (1 in 16): the epoch was
    # completed and the rerun starts at the next one; the second part below
    # tests that case on purpose.
    grep -q "^resumed from $rundir/resume.safetensors at epoch $((stop_end + 1)), step 0 of the epoch" "$outfile"
    ok $? "the rerun's log shows the resume point: epoch $((stop_end + 1)), step 0 (stopped at the end of epoch $stop_end)"
    [ "$(grep '^epoch [0-9]*: learning rate' "$outfile" | tr '\n' ' ')" = "epoch 0: learning rate 0.02 epoch 1: learning rate 0.011 " ]
    ok $? "the learning rate is printed at the start and again after the resume at epoch 1"
fi
same_model "$rundir/model-1.safetensors" "$w/ref-mid/model-1.safetensors"
ok $? "preempted + requeued + resumed == uninterrupted (bitwise)"

# ---- stop agreed at an epoch's last step (one step per epoch)
preempt_run "$w/end.cfg" '^epoch 2 step 1/1' --set output.save_every=0
stop_end=$(sed -n 's/^preemption signal [0-9]* at the end of epoch \([0-9]*\) .*/\1/p' "$outfile")
echo "stopped at the end of epoch '$stop_end'" | diag
[ -n "$stop_end" ] && [ "$stop_end" -lt 29 ] \
    && grep -q '^srun: error: .*Exited with exit code 3$' "$outfile" \
    && grep -q "^resumed from $rundir/resume.safetensors at epoch $((stop_end + 1)), step 0 of the epoch" "$outfile" \
    && [ "$job_state" = COMPLETED ] && [ "$(job_field "$jid" Restarts)" = 1 ] \
    && [ "$(grep -c '^training finished: 30 epochs' "$outfile")" = 1 ]
ok $? "stop at an epoch's last step: epoch ${stop_end:-?} finished, exit 3, requeued, resumed at the next epoch, completed (job $jid, $job_state)"
same_model "$rundir/model-29.safetensors" "$w/ref-end/model-29.safetensors"
ok $? "stopped at an epoch's end + resumed == uninterrupted (bitwise)"

cd / || exit 1
cluster_down "$c"
ok $? "cluster goes down"

finish
