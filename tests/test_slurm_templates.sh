#!/bin/bash
# cohort: the sbatch templates in slurm/ on a real local cluster
# (slurm/testcluster, 2 simulated nodes with 16 CPUs and 4 stand-in GPUs
# each): they parse, sbatch accepts them, and they run to completion with the
# MPI rank printer (tests/test_slurm_rank) in place of cohort-train (COHORT_BIN),
# passing it the config, the overrides, the thread count and the run
# directory; the warning signal reaches the ranks and the job requeues itself
# (the stand-in exits 3 after it, as cohort-train does after a preemption
# stop) and runs again with the same run directory; a --time close to the
# warning lead is warned about. Prints TAP; SKIPs where Slurm
# is not installed or not usable (not root).
set -u
. "${COHORT_SRCDIR:-$(dirname "$0")/..}/tests/test_slurm_lib.sh"

templates="cpu-1node gpu-1node multinode"
for t in $templates; do
    bash -n "$srcdir/slurm/$t.sbatch"
    ok $? "slurm/$t.sbatch passes bash -n"
done

slurm_skip_unless_available

cluster_up c --nodes 2 --cpus 16 --gpus 4
ok $? "2-node cluster (16 CPUs, gpu:4 per node) comes up"

make_workdir w
cd "$w" || exit 1
echo '# stand-in config' >"$w/test.cfg"

for t in $templates; do
    out=$(sbatch --test-only "$srcdir/slurm/$t.sbatch" test.cfg 2>&1)
    rc=$?
    echo "$out" | diag
    [ $rc = 0 ] && echo "$out" | grep -q 'to start at'
    ok $? "sbatch --test-only accepts slurm/$t.sbatch"
done

# run_template TEMPLATE [SBATCH OPTIONS...]: submit from $w with the rank
# printer as COHORT_BIN, wait for the end; sets jid, job_state and outfile.
run_template() {
    local t=$1 name
    shift
    jid=$(COHORT_BIN=$rank_prog submit "$@" "$srcdir/slurm/$t.sbatch" test.cfg --set train.epochs=1)
    wait_job_state "$jid" 60 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY
    name=$(job_field "$jid" JobName)
    outfile=$w/$name-$jid.out
    diag <"$outfile" 2>/dev/null
}

# expected_args NAME DEVICE THREADS: the arguments a template passes.
expected_args() {
    echo "args --config test.cfg --set train.threads=$3" \
         "--set output.dir=$w/runs/$1-$jid --set output.resume=auto --set dist.warning_signal=USR2 --set train.epochs=1"
}

# ---- one node, CPU tasks: runs to completion
run_template cpu-1node
exp="rank 0 of 2 procid 0 nodeid 0 localid 0 threads 1 gpus - restart - $(expected_args cohort-cpu cpu 1)
rank 1 of 2 procid 1 nodeid 0 localid 1 threads 1 gpus - restart - $(expected_args cohort-cpu cpu 1)"
[ "$job_state" = COMPLETED ] && [ "$(job_field "$jid" ExitCode)" = 0:0 ] \
    && [ "$(grep '^rank' "$outfile" | sort)" = "$exp" ] \
    && grep -q "^job $jid (restart 0) on n1: 2 ranks x 1 threads; run dir $w/runs/cohort-cpu-$jid" "$outfile" \
    && [ -d "$w/runs/cohort-cpu-$jid" ]
ok $? "cpu-1node.sbatch runs 2 ranks to completion with config, overrides, thread count and run dir (job $jid, $job_state)"

grep -q "^job $jid (restart 0) on" "$outfile" && ! grep -q '^warning: the time limit' "$outfile"
ok $? "cpu-1node.sbatch: no time-limit warning with --time=01:00:00 and the 120 s warning lead (job $jid)"

# ---- --time close to the warning lead: a warning at the start
run_template cpu-1node --time=5
[ "$job_state" = COMPLETED ] \
    && grep -q '^warning: the time limit 5:00 (300 s) leaves less than 3 x the warning lead (120 s, --signal=B:USR2@120) for work: every run is warned after at most 180 s' "$outfile"
ok $? "sbatch --time=5: the template warns that 300 s leave less than 3 x the 120 s lead (job $jid, $job_state)"
run_template cpu-1node --time=1-0
[ "$job_state" = COMPLETED ] && grep -q "^job $jid (restart 0) on" "$outfile" \
    && ! grep -q '^warning: the time limit' "$outfile"
ok $? "sbatch --time=1-0 (a day): no warning (job $jid, $job_state)"

# ---- --cpus-per-task feeds the thread count
run_template cpu-1node --cpus-per-task=3
[ "$job_state" = COMPLETED ] && [ "$(grep -c "^rank [01] of 2 .* threads 3 .*--set train.threads=3 " "$outfile")" = 2 ]
ok $? "sbatch --cpus-per-task=3: OMP_NUM_THREADS=3 and train.threads=3 on both ranks (job $jid, $job_state)"

# ---- one node, GPUs: every rank sees the node's 4 GPUs
run_template gpu-1node
[ "$job_state" = COMPLETED ] \
    && [ "$(grep -c "^rank [0-3] of 4 procid [0-3] nodeid 0 localid [0-3] threads 4 gpus 0,1,2,3 restart - $(expected_args cohort-gpu cuda 4)\$" "$outfile")" = 4 ]
ok $? "gpu-1node.sbatch runs 4 ranks, 4 threads each, CUDA_VISIBLE_DEVICES=0,1,2,3 (job $jid, $job_state)"

# ---- several nodes: 2 nodes x 2 ranks, block placement
run_template multinode
exp=""
for r in 0 1 2 3; do
    exp+="rank $r of 4 procid $r nodeid $((r / 2)) localid $((r % 2)) threads 1 gpus - restart - $(expected_args cohort-multi cpu 1)"$'\n'
done
[ "$job_state" = COMPLETED ] && [ "$(grep '^rank' "$outfile" | sort -k2,2n)" = "${exp%$'\n'}" ]
ok $? "multinode.sbatch runs ranks 0..3 of 4 on nodes 0,0,1,1 (job $jid, $job_state)"

run_template multinode --ntasks-per-node=1
[ "$job_state" = COMPLETED ] && [ "$(grep '^rank' "$outfile" | cut -d' ' -f1-8 | sort -k2,2n)" = "rank 0 of 2 procid 0 nodeid 0
rank 1 of 2 procid 1 nodeid 1" ]
ok $? "multinode.sbatch --ntasks-per-node=1: ranks 0,1 of 2 on nodes 0,1 (job $jid, $job_state)"

# ---- warning signal forwarded to the ranks; the job requeues itself and
# runs again in the same run directory.
jid=$(COHORT_BIN=$rank_prog COHORT_STANDIN_WAIT_SIGNAL=30 submit "$srcdir/slurm/cpu-1node.sbatch" test.cfg --set train.epochs=1)
outfile=$w/cohort-cpu-$jid.out
t0=$SECONDS
# Both ranks are up (and have their handlers) once they printed their line.
while [ "$(grep -c '^rank [01] of 2' "$outfile" 2>/dev/null)" != 2 ] && [ $((SECONDS - t0)) -lt 30 ]; do sleep 0.2; done
scancel -b -s USR2 "$jid"
wait_file_line "$outfile" '^warning signal received: requeueing' 30
# Requeued, it waits for its old credential to expire (10 s here); release
# it sooner (now+2, not now: see tests/test_slurm.sh).
wait_job_state "$jid" 20 PENDING && scontrol update JobId="$jid" StartTime=now+2
wait_job_state "$jid" 60 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL
diag <"$outfile" 2>/dev/null
[ "$(grep -c '^rank [01] got signal USR2$' "$outfile")" = 2 ] \
    && grep -q "^warning signal received: requeueing job $jid to resume from $w/runs/cohort-cpu-$jid\$" "$outfile"
ok $? "scancel -b -s USR2 to the batch shell reaches both ranks through the template's forwarding (job $jid)"
[ "$job_state" = COMPLETED ] && [ "$(job_field "$jid" Restarts)" = 1 ] \
    && [ "$(grep -c "^rank [01] of 2 .* restart 1 .*--set output.dir=$w/runs/cohort-cpu-$jid " "$outfile")" = 2 ] \
    && grep -q "^job $jid (restart 1) on n1" "$outfile"
ok $? "after the warning the job requeues itself and reruns with SLURM_RESTART_COUNT=1 and the same run dir (job $jid, $job_state)"

cd / || exit 1
cluster_down "$c"
ok $? "cluster goes down"

finish
