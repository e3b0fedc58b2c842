#!/bin/bash
# cohort: jobs/cohort-farm on a real local Slurm cluster (slurm/testcluster,
# 2 simulated nodes) through slurm/farm.sbatch: one rank per node, a task
# file of `sleep 1; echo id`; `scancel -b -s USR2` (the warning signal of
# #SBATCH --signal=B:USR2) mid-run: the template forwards it to the ranks, no
# new task starts, the running ones finish (farm.grace), cohort-farm exits 3,
# the template requeues the job, and the rerun (SLURM_RESTART_COUNT > 0:
# automatic resume) completes every task exactly once. srun passes USR2 to
# every process of the step, tasks included: they start with it ignored, so
# they finish in the grace time.
# Prints TAP; SKIPs where Slurm is not installed or usable (not root).
set -u
. "${COHORT_SRCDIR:-$(dirname "$0")/..}/tests/test_slurm_lib.sh"
slurm_skip_unless_available
farm_prog=$builddir/jobs/cohort-farm
[ -x "$farm_prog" ] || { echo "Bail out! $farm_prog not built"; exit 1; }

make_workdir w
cd "$w" || exit 1
N=30
for i in $(seq 1 $N); do echo 'sleep 1; echo $COHORT_TASK_ID >> "$COHORT_FARM_DIR/../ids"'; done > tasks.txt

cluster_up c --nodes 2 --cpus 2
ok $? "2-node cluster comes up"

jid=$(COHORT_BIN=$farm_prog GRACE=30 submit --nodes=2 --cpus-per-task=2 \
      "$srcdir/slurm/farm.sbatch" "$w/tasks.txt")
outfile=$w/cohort-farm-$jid.out
wait_file_line "$w/runs/ids" . 120 && while [ "$(wc -l < "$w/runs/ids")" -lt 4 ]; do sleep 0.2; done
n_before=$(wc -l < "$w/runs/ids")
scancel -b -s USR2 "$jid"
wait_file_line "$outfile" '^warning signal received: requeueing' 90
ok $? "USR2 to the batch shell: the farm stops, exits 3, the template requeues (job $jid, $n_before ids before the signal)"
# requeued, the job waits for its old credential to expire; release it sooner
wait_job_state "$jid" 30 PENDING && scontrol update JobId="$jid" StartTime=now+2
wait_job_state "$jid" 240 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY
grep -v '^tasks ' "$outfile" 2>/dev/null | diag
[ "$job_state" = COMPLETED ] && [ "$(job_field "$jid" Restarts)" = 1 ] \
    && grep -q "^job $jid (restart 1) on" "$outfile" \
    && grep -q "finished: $N tasks, $N done" "$outfile"
ok $? "the requeued job resumes and completes (job $jid, $job_state)"
bad=$(seq 0 $((N - 1)) | cat - "$w/runs/ids" | sort -n | uniq -c | awk '$1 != 2' | head -3)
[ -z "$bad" ] && [ "$(wc -l < "$w/runs/ids")" = $N ]
ok $? "every task ran exactly once over the two runs ($(wc -l < "$w/runs/ids") ids${bad:+; not once: $bad})"
! grep -q interrupted "$w/runs/cohort-farm-$jid/status.tsv"
ok $? "the running tasks finished in the grace time: srun's USR2 reached them too, and they ignore it"
ranks=$(awk -F'\t' 'NR > 1 { print $3 }' "$w/runs/cohort-farm-$jid/status.tsv" | sort -u | tr '\n' ' ')
[ "$ranks" = "0 1 " ]
ok $? "tasks ran on both nodes' ranks (ranks: $ranks)"
finish
