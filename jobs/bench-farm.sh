#!/bin/sh
# cohort-farm throughput benchmark (docs/PERFORMANCE.md, "cohort-farm"):
# N `true` shell tasks over 2 slots, side by side and alternating, REPS
# times each, medians printed at the end:
#   spawn     tests/bench_farm spawn N 2: posix_spawn + wait of `sh -c true`,
#             2 at a time (the machine's bare fork+exec rate)
#   farm      mpiexec -n 2 jobs/cohort-farm, 1 slot per rank (journal synced
#             in batches, the default)
#   farm-all  the same with farm.journal_sync=all (fdatasync per record)
#   farm-nosync  the same with farm.journal_sync=none (journal overhead)
#   parallel  GNU parallel -j2 over the same task file
# plus the MPI round trip (tests/bench_farm pingpong). Rates are tasks/s of
# the whole command (start-up included) and, for the farm, of its dispatch
# (the summary line). Usage: jobs/bench-farm.sh [N] [REPS] (default 2000 5).
#
# jobs/bench-farm.sh functions [RANGE] [REPS] (default 30000000 3): function
# tasks: ch_farm_map over 1,000,000 tiny tasks on 2 ranks (tests/bench_farm
# map) against multiprocessing.Pool(2).apply_async of 100,000
# (tests/bench_farm_pool.py tiny), and the seed's 8-task example
# (jobs/cohort-farm-example, 1 thread per rank, on 1 and 2 ranks) against
# Pool(2) (tests/bench_farm_pool.py seed).
set -u
if [ "${1:-}" = functions ]; then
  RANGE=${2:-30000000}
  REPS=${3:-3}
  build=${COHORT_BUILDDIR:-.}
  src=${COHORT_SRCDIR:-.}
  MPIEXEC=${MPIEXEC:-mpiexec}
  for r in $(seq 1 "$REPS"); do
    "$MPIEXEC" -n 2 "$build/tests/bench_farm" map 1000000
    python3 "$src/tests/bench_farm_pool.py" tiny 100000
    for np in 1 2; do
      "$MPIEXEC" -n $np "$build/jobs/cohort-farm-example" --example.range="$RANGE" \
        --example.threads=1 --example.check=false | tail -n 1
    done
    python3 "$src/tests/bench_farm_pool.py" seed "$RANGE" | tail -n 1
  done
  echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
  exit 0
fi
N=${1:-2000}
REPS=${2:-5}
build=${COHORT_BUILDDIR:-.}
MPIEXEC=${MPIEXEC:-mpiexec}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cohort-bench-farm.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
yes true | head -n "$N" > "$tmp/tasks"
now() { date +%s.%N; }
rate() { echo "$N $1 $2" | awk '{ printf "%.1f", $1 / ($3 - $2) }'; }
for r in $(seq 1 "$REPS"); do
  t0=$(now); "$build/tests/bench_farm" spawn "$N" 2 > /dev/null; t1=$(now)
  echo "spawn $(rate "$t0" "$t1")" >> "$tmp/res"
  for sync in batch all none; do
    rm -rf "$tmp/run"
    t0=$(now)
    "$MPIEXEC" -n 2 "$build/jobs/cohort-farm" --tasks "$tmp/tasks" --farm.dir="$tmp/run" \
      --farm.slots_per_rank=1 --farm.journal_sync=$sync > "$tmp/log" 2>&1 || cat "$tmp/log" >&2
    t1=$(now)
    d=$(sed -n 's/.* in \([0-9.]*\) s (.*/\1/p' "$tmp/log")
    name=farm; [ $sync = none ] && name=farm-nosync; [ $sync = all ] && name=farm-all
    echo "$name $(rate "$t0" "$t1")" >> "$tmp/res"
    echo "$name-dispatch $(echo "$N $d" | awk '{ printf "%.1f", $1 / $2 }')" >> "$tmp/res"
  done
  t0=$(now); parallel -j2 < "$tmp/tasks"; t1=$(now)
  echo "parallel $(rate "$t0" "$t1")" >> "$tmp/res"
  echo "round $r: $(tail -n 8 "$tmp/res" | tr '\n' ' ')"
done
echo "medians over $REPS runs of $N tasks (tasks/s), load $(cut -d' ' -f1-3 /proc/loadavg):"
for k in spawn farm farm-dispatch farm-all farm-all-dispatch farm-nosync farm-nosync-dispatch parallel; do
  awk -v k=$k '$1 == k { print $2 }' "$tmp/res" | sort -n | awk -v k=$k \
    '{ v[NR] = $1 } END { printf "  %-22s %s\n", k, v[int((NR + 1) / 2)] }'
done
"$MPIEXEC" -n 2 "$build/tests/bench_farm" pingpong 100000
