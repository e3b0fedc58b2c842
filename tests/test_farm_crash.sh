#!/bin/sh
# cohort-farm exactly once across crashes and stops: the farm's MPI processes
# (mpiexec, the hydra proxy and the ranks; not the slot supervisors or the
# tasks) are killed mid-run with SIGKILL, or sent SIGTERM as Slurm does at
# preemption; the resumed farm runs every task exactly once, judged by the
# tasks' side effect (each appends its id to a file).
. "${COHORT_SRCDIR:-.}/tests/farm_lib.sh"
echo "1..10"
N=24

# start NAME ARGS...: a 2-rank farm in the background (4 slots) over N tasks
# of `sleep $SLEEP; echo id` (SLEEP default 1); sets d, pid
start() {
  d=$tmp/$1; shift; mkdir -p "$d"; id_tasks "$d/tasks" $N "sleep ${SLEEP:-1}"
  "$MPIEXEC" -n 2 "$FARM" --farm.dir="$d/run" --tasks "$d/tasks" --farm.slots_per_rank=2 "$@" \
    > "$d/run.log" 2>&1 &
  pid=$!
}
resume() {
  farm 2 "$d/run" --tasks "$d/tasks" --farm.slots_per_rank=2 --resume
}

# 1. SIGKILL mpiexec, the proxy and both ranks while tasks run; resume at
#    once: the tasks still running are waited for, not started again
N=12 SLEEP=4 # long enough to outlive the resume's start-up
start kill
wait_lines "$d/ids" 4 "$pid" || show "$d/run.log"
ranks=$(farm_ranks "$pid"); proxies=$(farm_proxies "$pid")
kill -KILL "$pid" $proxies $ranks; wait "$pid" 2>/dev/null
resume; rc=$?
check "SIGKILL of mpiexec and the ranks, --resume: exit 0 (exit $rc)" test "$rc" = 0
check "... the tasks that outlived the ranks were waited for, not started again" \
  grep -q "earlier run: [1-9][0-9]* running tasks waited for" "$d/run.log" || show "$d/run.log"
check "... every task ran exactly once" exactly_once "$d/ids" $N

N=24 SLEEP=1

# 2. SIGKILL of one rank only: the launcher ends the job; the survivors'
#    and the dead rank's supervisors record their tasks
start kill1
wait_lines "$d/ids" 4 "$pid" || show "$d/run.log"
kill -KILL $(farm_ranks "$pid" | tail -n 1); wait "$pid"; rc1=$?
resume; rc=$?
check "SIGKILL of rank 1: the run ends (exit $rc1), --resume exits 0 (exit $rc)" \
  sh -c "[ $rc1 != 0 ] && [ $rc = 0 ]"
check "... every task ran exactly once" exactly_once "$d/ids" $N

# 3. SIGTERM to the ranks (the batch script forwarding Slurm's warning
#    signal): no new task starts, running ones finish in the grace time,
#    exit 3 (preempted); the resume runs the rest
start term --farm.grace=30
wait_lines "$d/ids" 4 "$pid" || show "$d/run.log"
kill -TERM $(farm_ranks "$pid"); wait "$pid"; rc1=$?
n1=$(wc -l < "$d/ids")
check "SIGTERM to the ranks: exit 3 after the running tasks finished ($n1 of $N done)" \
  sh -c "[ $rc1 = 3 ] && [ $n1 -lt $N ] && grep -q 'stopped (preemption' '$d/run.log' && \
         ! grep -q interrupted '$d/run/status.tsv'"
resume; rc=$?
check "... --resume: exit 0 (exit $rc)" test "$rc" = 0
check "... every task ran exactly once" exactly_once "$d/ids" $N

# 4. SIGTERM to every process of the ranks, tasks included (`scancel -s TERM`
#    signals all tasks of the job's steps and their children): with no grace
#    the killed tasks are recorded as interrupted, not failed, and run again
#    on resume. mpiexec and its proxy are left out: when hydra itself is
#    signalled at the same moment as its proxy it loses the ranks' exit codes
#    and may exit 0 (measured: 2 of 5 runs), which is the launcher's, not the
#    farm's, behaviour.
start termall --farm.grace=0
wait_lines "$d/ids" 4 "$pid" || show "$d/run.log"
kill -TERM $(for r in $(farm_ranks "$pid"); do farm_tree "$r"; done) 2>/dev/null
wait "$pid"; rc1=$?
termall_ok() {
  [ "$rc1" = 3 ] && grep -q interrupted "$d/run/status.tsv" && ! grep -q 'signal' "$d/run/status.tsv" \
    && return 0
  show "$d/run/status.tsv" 40; show "$d/run.log" 40  # what a failure looked like (on the test log)
  return 1
}
check "SIGTERM to all (tasks too): exit 3, killed tasks recorded as interrupted (exit $rc1)" termall_ok
resume; rc=$?
check "... --resume: exit 0 (exit $rc), every task ran exactly once" \
  sh -c "[ $rc = 0 ] && [ \$(sort -n '$d/ids' | uniq | wc -l) = $N ] && [ \$(wc -l < '$d/ids') = $N ]"
