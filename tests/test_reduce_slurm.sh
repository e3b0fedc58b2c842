#!/bin/bash
# cohort-reduce under slurm/reduce.sbatch on the local test cluster
# (slurm/testcluster, 2 simulated nodes): 2 nodes x 2 tasks give the same
# bits as one process, for an exact mean and var over axis 0. TAP; SKIPs
# where Slurm is not installed or not usable (not root), or without numpy.
set -u
. "${COHORT_SRCDIR:-$(dirname "$0")/..}/tests/test_slurm_lib.sh"
reduce_prog=$builddir/jobs/cohort-reduce
PYTHON3=${PYTHON3:-/usr/bin/python3}

bash -n "$srcdir/slurm/reduce.sbatch"
ok $? "slurm/reduce.sbatch passes bash -n"
"$PYTHON3" -c 'import numpy' 2>/dev/null || { echo "1..0 # SKIP numpy not found"; exit 0; }
slurm_skip_unless_available

cluster_up c --nodes 2 --cpus 16
ok $? "2-node cluster comes up"
make_workdir w
cd "$w" || exit 1
"$PYTHON3" -c 'import numpy as np; np.save("x.npy", np.random.default_rng(7).normal(10, 0.1, (3001, 257)))'

for op in mean var; do
    "$reduce_prog" --op $op --axis 0 --out ref_$op.npy x.npy >ref_$op.log 2>&1
    jid=$(COHORT_BIN=$reduce_prog submit --nodes=2 --ntasks-per-node=2 "$srcdir/slurm/reduce.sbatch" \
          --op $op --axis 0 --chunk_mb 0.05 --out "$w/slurm_$op.npy" "$w/x.npy")
    wait_job_state "$jid" 120 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY
    diag <"$w/cohort-reduce-$jid.out" 2>/dev/null
    [ "$job_state" = COMPLETED ] && grep -q "4 ranks" "$w/cohort-reduce-$jid.out" && cmp -s ref_$op.npy slurm_$op.npy
    ok $? "$op over 2 nodes x 2 tasks (job $jid: $job_state) has the bits of one process"
done
finish
