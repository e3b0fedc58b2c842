#!/bin/bash
# cohort: Slurm launch behaviour on a real local cluster (slurm/testcluster):
# PMI2 ranks under srun, the --mpi=none mismatch, two simulated nodes, batch
# jobs, signals to the batch shell and requeue. Prints TAP; SKIPs visibly
# where Slurm is not installed or not usable (not root).
set -u
. "${COHORT_SRCDIR:-$(dirname "$0")/..}/tests/test_slurm_lib.sh"
slurm_skip_unless_available

# ---------------------------------------------------------------- one node
cluster_up c1 --nodes 1
ok $? "1-node cluster comes up (srun -n 2 true works)"
[ -n "${SLURM_CONF:-}" ] && [ "$SLURM_CONF" = "$c1/slurm.conf" ] && [ -f "$c1/env.sh" ]
ok $? "up exports SLURM_CONF=$c1/slurm.conf and writes env.sh"

out=$(srun -Q -n 2 --mpi=pmi2 -t 1 "$rank_prog" 2>&1 | sort)
echo "$out" | diag
[ "$(echo "$out" | cut -d' ' -f1-6)" = "rank 0 of 2 procid 0
rank 1 of 2 procid 1" ]
ok $? "srun -n 2 --mpi=pmi2: MPI ranks 0 and 1 of 2, equal to SLURM_PROCID"

out=$(srun -Q -n 2 --mpi=none -t 1 "$rank_prog" 2>&1 | sort)
echo "$out" | diag
[ "$(echo "$out" | cut -d' ' -f1-6)" = "rank 0 of 1 procid 0
rank 0 of 1 procid 1" ]
ok $? "srun -n 2 --mpi=none: two MPI singletons 'rank 0 of 1' (SLURM_PROCID 0 and 1): the mismatch a job must detect"

# The PMI2 KVS bootstrap of the NCCL unique id (framework/launch/pmi2.h), without
# MPI: rank 0's 128 bytes reach rank 1 through slurmd's key-value space.
kvs_prog=$builddir/tests/pmi2_kvs_helper
out=$(srun -Q -n 2 --mpi=pmi2 -t 1 "$kvs_prog" 2>&1 | sort)
echo "$out" | diag
id0=$(echo "$out" | sed -n 's/^kvs rank 0 of 2 id \([0-9a-f]*\) again same$/\1/p')
id1=$(echo "$out" | sed -n 's/^kvs rank 1 of 2 id \([0-9a-f]*\) again same$/\1/p')
[ ${#id0} -eq 256 ] && [ "$id0" = "$id1" ] && [ "$id0" != "$(printf 'ee%.0s' $(seq 128))" ]
ok $? "srun -n 2 --mpi=pmi2: PMI2 ranks 0 and 1 of 2; rank 0's 128-byte id reaches rank 1 through the KVS (twice, two keys)"

out=$(srun -Q -n 2 --mpi=pmi2 -t 1 "$kvs_prog" fail 2>&1 | sort)
echo "$out" | diag
echo "$out" | grep -q "^kvs rank 0 of 2 status CH_ERR_IO: rank 0 could not take part" &&
  echo "$out" | grep -q "^kvs rank 1 of 2 status CH_ERR_REMOTE: rank 0 failed before the exchange of 'cohort-test-fail' (CH_ERR_IO)"
ok $? "PMI2 KVS: a failure on rank 0 reaches rank 1 as CH_ERR_REMOTE naming it (no rank waits)"

out=$(srun -Q -n 1 --mpi=none -t 1 "$kvs_prog" 2>&1); rc=$?
echo "$out" | diag
[ $rc -eq 2 ] && echo "$out" | grep -q "not started by \`srun --mpi=pmi2\`"
ok $? "PMI2 KVS under srun --mpi=none: exit 2 with 'not started by srun --mpi=pmi2'"

out=$(timeout 20 "$kvs_prog" 2>&1); rc=$?
echo "$out" | diag
[ $rc -eq 2 ] && echo "$out" | grep -q "not started by"
ok $? "PMI2 KVS with no launcher (PMI2 singleton): exit 2, clear message, no hang"

# A batch job: completes, output file right.
make_workdir w
cat >"$w/batch.sh" <<EOF
#!/bin/bash
#SBATCH --job-name=cohort-batch
#SBATCH --ntasks=2
#SBATCH --time=1
echo "batch job \$SLURM_JOB_ID ntasks \$SLURM_NTASKS"
srun -Q "$rank_prog" | sort
echo "batch done"
EOF
jid=$(submit -D "$w" -o "$w/batch.out" "$w/batch.sh")
wait_job_state "$jid" 30 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL
diag <"$w/batch.out" 2>/dev/null
[ "$job_state" = COMPLETED ] && [ "$(job_field "$jid" ExitCode)" = 0:0 ] \
    && [ "$(cut -d' ' -f1-6 "$w/batch.out")" = "batch job $jid ntasks 2
rank 0 of 2 procid 0
rank 1 of 2 procid 1
batch done" ]
ok $? "sbatch job $jid completes (state $job_state) and writes the expected output file"

# scancel -b -s USR1 reaches the batch shell at once.
cat >"$w/sig.sh" <<'EOF'
#!/bin/bash
#SBATCH --time=1
got=
trap 'got=USR1' USR1
echo ready
for i in $(seq 300); do
    [ -n "$got" ] && break
    sleep 0.1
done
echo "batch shell got ${got:-nothing}"
EOF
jid=$(submit -D "$w" -o "$w/sig.out" "$w/sig.sh")
wait_file_line "$w/sig.out" '^ready' 30
scancel -b -s USR1 "$jid"
wait_job_state "$jid" 30 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL
diag <"$w/sig.out" 2>/dev/null
[ "$job_state" = COMPLETED ] && grep -qx 'batch shell got USR1' "$w/sig.out"
ok $? "scancel -b -s USR1 reaches the batch shell's trap (job $jid, state $job_state)"

# scontrol requeue + update StartTime=now+2 runs the job again, with
# SLURM_RESTART_COUNT incremented. Not StartTime=now: slurmd refuses a
# credential issued in the same second as the requeue revoked the old one
# ("Killing non-startable batch job: Job credential revoked") and the job
# FAILS; 2 s later is always safe.
cat >"$w/requeue.sh" <<'EOF'
#!/bin/bash
#SBATCH --time=1
#SBATCH --requeue
#SBATCH --open-mode=append
echo "start restart=${SLURM_RESTART_COUNT:-0}"
# First run: wait to be requeued (exec: no shell left to print after SIGTERM).
if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then exec sleep 60; fi
echo "end restart=${SLURM_RESTART_COUNT:-0}"
EOF
jid=$(submit -D "$w" -o "$w/requeue.out" "$w/requeue.sh")
wait_file_line "$w/requeue.out" '^start restart=0' 30
t0=$SECONDS
scontrol requeue "$jid"
wait_job_state "$jid" 10 PENDING && scontrol update JobId="$jid" StartTime=now+2
wait_job_state "$jid" 40 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL
diag <"$w/requeue.out" 2>/dev/null
echo "requeued job ran again within $((SECONDS - t0)) s" | diag
[ "$job_state" = COMPLETED ] && [ "$(job_field "$jid" Restarts)" = 1 ] \
    && [ "$(grep -E '^(start|end) ' "$w/requeue.out")" = "start restart=0
start restart=1
end restart=1" ]
ok $? "scontrol requeue + update StartTime=now+2 re-runs job $jid with SLURM_RESTART_COUNT=1 (state $job_state)"

cluster_down "$c1"
ok $? "1-node cluster goes down"
! [ -e "$c1" ]
ok $? "down removes $c1"

# ---------------------------------------------------------------- two nodes
cluster_up c2 --nodes 2
ok $? "2-node cluster comes up"

out=$(srun -Q -N 2 --ntasks-per-node=2 --mpi=pmi2 -t 1 "$rank_prog" 2>&1 | sort -k2,2n)
echo "$out" | diag
[ "$(echo "$out" | cut -d' ' -f1-8)" = "rank 0 of 4 procid 0 nodeid 0
rank 1 of 4 procid 1 nodeid 0
rank 2 of 4 procid 2 nodeid 1
rank 3 of 4 procid 3 nodeid 1" ]
ok $? "srun -N 2 --ntasks-per-node=2 --mpi=pmi2: ranks 0..3 of 4, SLURM_NODEID 0,0,1,1"

out=$(srun -Q -N 2 --ntasks-per-node=1 --mpi=pmi2 -t 1 "$rank_prog" 2>&1 | sort -k2,2n)
echo "$out" | diag
[ "$(echo "$out" | cut -d' ' -f1-10)" = "rank 0 of 2 procid 0 nodeid 0 localid 0
rank 1 of 2 procid 1 nodeid 1 localid 0" ]
ok $? "srun -N 2 --ntasks-per-node=1: ranks 0,1 of 2 on nodes 0,1, local id 0 on each"

out=$(srun -Q -N 2 --ntasks-per-node=1 --mpi=pmi2 -t 1 "$kvs_prog" 2>&1 | sort)
echo "$out" | diag
id0=$(echo "$out" | sed -n 's/^kvs rank 0 of 2 id \([0-9a-f]*\) again same$/\1/p')
id1=$(echo "$out" | sed -n 's/^kvs rank 1 of 2 id \([0-9a-f]*\) again same$/\1/p')
[ ${#id0} -eq 256 ] && [ "$id0" = "$id1" ]
ok $? "PMI2 KVS across two simulated nodes: rank 1 on node 1 gets rank 0's id"

out=$(timeout 60 srun -Q -N 2 -n 3 --mpi=pmi2 -t 1 "$kvs_prog" fail 2 2>&1 | sort)
echo "$out" | diag
echo "$out" | grep -q "^kvs rank 2 of 3 status CH_ERR_IO: rank 2 could not take part" &&
  [ "$(echo "$out" | grep -c "status CH_ERR_REMOTE: rank 2 failed before the exchange of 'cohort-test-fail' (CH_ERR_IO)")" = 2 ]
ok $? "PMI2 KVS: a failure on rank 2 of 3 (2 nodes) reaches ranks 0 and 1 as CH_ERR_REMOTE naming rank 2 (no rank waits)"

cluster_down "$c2"
ok $? "2-node cluster goes down"

finish
