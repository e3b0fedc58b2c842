#!/bin/bash
# cohort: jobs/cohort-train itself on a real local Slurm cluster
# (slurm/testcluster, 2 simulated nodes), on a 512-image Fashion-MNIST subset
# with the small CNN:
#  - the templates run it to completion: cpu-1node (2 tasks on one node),
#    multinode with 2 nodes x 1 task and 2 nodes x 2 tasks; the final model
#    is bitwise equal to the same job run with mpiexec -n 2 / -n 4 on one
#    node (same world size and batch: same data order, same collectives);
#  - srun --mpi=pmi2 -n 2: the ranks agree with SLURM_PROCID / SLURM_NTASKS;
#    srun --mpi=none -n 2 fails within seconds, naming both counts;
#  - the effective learning rate (base lr x world size, cosine schedule) is
#    printed at the start and after each resume: base lr 0.001, 4 ranks,
#    30 epochs, lrf 0.1 gives 0.004 at epoch 0, 0.0031 at epoch 10 and
#    0.00040986 at epoch 29.
# Prints TAP; SKIPs where Slurm is not installed or usable (not root) or the
# data set is missing. The cluster is always torn down.
set -u
. "${COHORT_SRCDIR:-$(dirname "$0")/..}/tests/test_slurm_lib.sh"
. "$srcdir/tests/slurm_train_lib.sh"
slurm_skip_unless_available
train_skip_unless_ready

make_workdir w
cd "$w" || exit 1
write_cfg "$w/train.cfg" 512 200 2

# ---- references: the same job with mpiexec on one node
ref_run 2 "$w/train.cfg" "$w/ref2"
ok $? "reference: mpiexec -n 2 cohort-train (2 epochs) finishes"
ref_run 4 "$w/train.cfg" "$w/ref4"
ok $? "reference: mpiexec -n 4 cohort-train (2 epochs) finishes"

cluster_up c --nodes 2 --cpus 4
ok $? "2-node cluster (4 CPUs per node) comes up"

# ---- cpu-1node: 2 tasks on one node
run_train_template cpu-1node "$w/train.cfg"
[ "$job_state" = COMPLETED ] && [ "$(job_field "$jid" ExitCode)" = 0:0 ] \
    && grep -q '^training finished: 2 epochs' "$outfile"
ok $? "cpu-1node.sbatch runs cohort-train with 2 tasks to completion (job $jid, $job_state)"
[ "$(identities "$outfile")" = "0 of 2 on n1 procid 0 ntasks 2
1 of 2 on n1 procid 1 ntasks 2" ]
ok $? "cpu-1node: ranks 0 and 1 of 2 on n1, equal to SLURM_PROCID and SLURM_NTASKS"
same_model "$rundir/model-1.safetensors" "$w/ref2/model-1.safetensors"
ok $? "cpu-1node result == mpiexec -n 2 result (bitwise)"

# ---- multinode: 2 nodes x 1 task
run_train_template multinode "$w/train.cfg" --ntasks-per-node=1
[ "$job_state" = COMPLETED ] && [ "$(job_field "$jid" ExitCode)" = 0:0 ] \
    && grep -q '^training finished: 2 epochs' "$outfile"
ok $? "multinode.sbatch --ntasks-per-node=1 runs cohort-train to completion (job $jid, $job_state)"
[ "$(identities "$outfile")" = "0 of 2 on n1 procid 0 ntasks 2
1 of 2 on n2 procid 1 ntasks 2" ]
ok $? "multinode 2x1: rank 0 on n1, rank 1 on n2, equal to SLURM_PROCID and SLURM_NTASKS"
same_model "$rundir/model-1.safetensors" "$w/ref2/model-1.safetensors"
ok $? "multinode 2 nodes x 1 task result == mpiexec -n 2 result on one node (bitwise)"

# ---- multinode: 2 nodes x 2 tasks
run_train_template multinode "$w/train.cfg"
[ "$job_state" = COMPLETED ] && [ "$(job_field "$jid" ExitCode)" = 0:0 ] \
    && grep -q '^training finished: 2 epochs' "$outfile"
ok $? "multinode.sbatch (2 nodes x 2 tasks) runs cohort-train to completion (job $jid, $job_state)"
[ "$(identities "$outfile")" = "0 of 4 on n1 procid 0 ntasks 4
1 of 4 on n1 procid 1 ntasks 4
2 of 4 on n2 procid 2 ntasks 4
3 of 4 on n2 procid 3 ntasks 4" ]
ok $? "multinode 2x2: ranks 0,1 on n1 and 2,3 on n2, equal to SLURM_PROCID and SLURM_NTASKS"
same_model "$rundir/model-1.safetensors" "$w/ref4/model-1.safetensors"
ok $? "multinode 2 nodes x 2 tasks result == mpiexec -n 4 result on one node (bitwise)"

# ---- srun --mpi=pmi2 -n 2: MPI ranks agree with Slurm's
short="--set schedule.epochs=1 --set train.max_steps=2 --set train.eval=false --set train.threads=1"
out=$(COHORT_LOG_LEVEL=debug srun -Q -N 1 -n 2 --mpi=pmi2 -t 2 "$train_prog" \
      --config "$w/train.cfg" $short --set output.dir="$w/pmi2" 2>&1)
rc=$?
echo "$out" | grep -v '^ ' | diag
[ $rc = 0 ] && [ "$(identities <(echo "$out"))" = "0 of 2 on n1 procid 0 ntasks 2
1 of 2 on n1 procid 1 ntasks 2" ] && echo "$out" | grep -q '^cohort-train: smallcnn, 2 ranks'
ok $? "srun --mpi=pmi2 -n 2 cohort-train: ranks 0 and 1 of 2 = SLURM_PROCID 0, 1 of SLURM_NTASKS 2 (exit $rc)"

# ---- srun --mpi=pmi2 -n 1: one task (MPI has used PMI_FD; no second PMI2_Init)
out=$(timeout 60 srun -Q -N 1 -n 1 --mpi=pmi2 -t 2 "$train_prog" --config "$w/train.cfg" $short \
      --set output.dir="$w/pmi2-1" 2>&1)
rc=$?
echo "$out" | grep -v '^ ' | diag
[ $rc = 0 ] && echo "$out" | grep -q '^cohort-train: smallcnn, 1 rank' \
    && [ -e "$w/pmi2-1/model-0.safetensors" ]
ok $? "srun --mpi=pmi2 -n 1 cohort-train: one rank trains and exits 0 (exit $rc; no hang)"

# ---- srun --mpi=none -n 2: every task an MPI singleton; stops at once
t0=$SECONDS
out=$(srun -Q -N 1 -n 2 --mpi=none -t 2 "$train_prog" --config "$w/train.cfg" $short \
      --set output.dir="$w/none" 2>&1)
rc=$?
dt=$((SECONDS - t0))
echo "$out" | diag
[ $rc != 0 ] && [ $dt -le 15 ] \
    && [ "$(echo "$out" | grep -c 'MPI world size is 1 but the slurm launcher says world size 2 (this is rank [01]).*srun --mpi=none')" = 2 ] \
    && [ ! -e "$w/none/model-0.safetensors" ]
ok $? "srun --mpi=none -n 2 cohort-train fails (exit $rc) in ${dt} s naming MPI world size 1 and launcher world size 2 and the cause"

# ---- effective learning rate at the start and after a resume: base lr
# 0.001 x 4 ranks, cosine over 30 epochs, lrf 0.1. One step per epoch; the
# run stops after epoch 9 and after epoch 28 and is resumed each time.
lr="$w/lr"
lrargs="--set optimizer.lr=0.001 --set schedule.epochs=30 --set schedule.lrf=0.1
        --set train.max_steps=1 --set train.eval=false --set output.save_every=0
        --set train.threads=1 --set output.dir=$lr --set output.resume=auto"
lrrun() {
    srun -Q -N 2 -n 4 --mpi=pmi2 -t 3 "$train_prog" --config "$w/train.cfg" $lrargs "$@" >>"$lr.log" 2>&1
}
lrrun --set train.stop_after=10 && lrrun --set train.stop_after=19 && lrrun
rc=$?
grep -v '^ ' "$lr.log" | diag
[ $rc = 0 ] && [ "$(grep -c '^training finished: 30 epochs' "$lr.log")" = 1 ] \
    && [ "$(grep -c '^stopping after' "$lr.log")" = 2 ] && [ -f "$lr/model-29.safetensors" ] \
    && [ "$(grep -c '^resumed from .* at epoch 10, step 0 ' "$lr.log")" = 1 ] \
    && [ "$(grep -c '^resumed from .* at epoch 29, step 0 ' "$lr.log")" = 1 ]
ok $? "4 ranks (srun, 2 nodes), 30 epochs in three runs: resumed at epochs 10 and 29, finished (exit $rc)"
starts=$(sed -n 's/^epoch \([0-9]*\): learning rate \(.*\)$/\1 \2/p' "$lr.log" | tr '\n' ' ')
echo "learning rate lines: $starts" | diag
[ "$starts" = "0 0.004 10 0.0031 29 0.00040986059 " ]
ok $? "learning rate printed at the start (epoch 0: 0.004) and after each resume (epoch 10: 0.0031, epoch 29: 0.00040986059)"
bad=0 n=0
while read -r e x; do
    n=$((n + 1))
    want=$(cosine_lr 0.004 "$e" 30 0.1)
    close_to "$x" "$want" 1e-5 || { echo "epoch $e: lr $x, expected $want" | diag; bad=1; }
done < <(sed -n 's/^epoch \([0-9]*\): loss .*  lr \([0-9.e-]*\)  .*/\1 \2/p' "$lr.log")
[ $bad = 0 ] && [ $n = 30 ]
ok $? "every epoch's lr (30 lines) = 0.004 x ((1 - cos(pi e / 30)) / 2 x (0.1 - 1) + 1) within 1e-5"

cd / || exit 1
cluster_down "$c"
ok $? "cluster goes down"

finish
