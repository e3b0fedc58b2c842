#!/bin/sh
# cohort-bench on ch_job: a short run at 1 and 2 ranks keeps its table, the
# old short options still work, --help lists the keys, bad values and a
# singleton under an srun step of 4 tasks are refused with exit 2 and one
# message.
set -u
build=${COHORT_BUILDDIR:-.}
MPIEXEC=${MPIEXEC:-mpiexec}
BENCH="$build/jobs/cohort-bench"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cohort-bench-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
n=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
not_ok() { n=$((n + 1)); echo "not ok $n - $*"; }
show() { echo "---- $1" >&2; tail -n 30 "$1" >&2; }
# unset launcher variables of a surrounding allocation
unset SLURM_PROCID SLURM_NTASKS SLURM_STEP_NUM_TASKS SLURM_STEP_ID SLURM_STEPID SLURM_JOB_ID \
  RANK WORLD_SIZE LOCAL_RANK PMI_FD 2>/dev/null
echo "1..7"

# run NAME NP ARGS...: exit status in $rc, stdout in $tmp/NAME.out, stderr in $tmp/NAME.err
run() {
  local name=$1 np=$2; shift 2
  if [ "$np" = 0 ]; then "$BENCH" "$@"; else "$MPIEXEC" -n "$np" "$BENCH" "$@"; fi \
    > "$tmp/$name.out" 2> "$tmp/$name.err"
  rc=$?
}
rows() { grep -c '^ *[0-9]' "$1"; }

for np in 1 2; do
  run "np$np" "$np" -b 1K -e 16K -f 4 -n 5 --warmup 1 --place both --backend mpi
  if [ $rc = 0 ] && [ "$(rows "$tmp/np$np.out")" = 6 ] && [ ! -s "$tmp/np$np.err" ] &&
     grep -q "^# cohort-bench: all-reduce, float32, sum, $np rank$([ "$np" = 1 ] || echo s), backend mpi" \
       "$tmp/np$np.out" &&
     ! grep -q "rank(s)\|1 ranks" "$tmp/np$np.out" &&
     [ "$(grep -c '0.00e+00' "$tmp/np$np.out")" = 6 ]; then
    ok "$np rank(s): 6 rows (1K..16K x out/in), exact sums, header says $np rank$([ "$np" = 1 ] || echo s)"
  else
    show "$tmp/np$np.out"; show "$tmp/np$np.err"; not_ok "$np rank(s): table (exit $rc)"
  fi
done
# the long forms of the same run (and -f glued to its value)
run long 2 --min-bytes=1K --max-bytes 16K -f4 --iters=5 --warmup=1 --check=false --aa
if [ $rc = 0 ] && [ "$(rows "$tmp/long.out")" = 3 ] && grep -q "A/A CONTROL" "$tmp/long.out"; then
  ok "long options, bool flag alone (--aa), --check=false"
else
  show "$tmp/long.out"; show "$tmp/long.err"; not_ok "long options (exit $rc)"
fi
run help 2 --help
if [ $rc = 0 ] && head -n 1 "$tmp/help.out" | grep -q "^Usage: cohort-bench" &&
   grep -q -- "--min-bytes" "$tmp/help.out" && grep -q -- "--dist.device_rule" "$tmp/help.out" &&
   [ "$(grep -c '^Usage:' "$tmp/help.out")" = 1 ] && [ ! -s "$tmp/help.err" ]; then
  ok "--help: usage first, once, the bench keys and the runtime's"
else
  show "$tmp/help.out"; not_ok "--help (exit $rc)"
fi
run bad 2 -b 9Q
if [ $rc = 2 ] && [ "$(wc -l < "$tmp/bad.err")" = 1 ] && grep -q "min-bytes.*9Q" "$tmp/bad.err"; then
  ok "a bad size: exit 2, one line naming the key and value"
else
  show "$tmp/bad.err"; not_ok "bad size (exit $rc)"
fi
run unknown 2 --iter=5
if [ $rc = 2 ] && [ "$(wc -l < "$tmp/unknown.err")" = 1 ] && grep -q "iters" "$tmp/unknown.err"; then
  ok "an unknown option: exit 2, one line with the suggestion"
else
  show "$tmp/unknown.err"; not_ok "unknown option (exit $rc)"
fi
SLURM_PROCID=2 SLURM_NTASKS=4 SLURM_STEP_NUM_TASKS=4 run mismatch 0
if [ $rc = 2 ] && [ "$(wc -l < "$tmp/mismatch.err")" = 1 ] &&
   grep -q "world size 4" "$tmp/mismatch.err" && [ "$(rows "$tmp/mismatch.out")" = 0 ]; then
  ok "singleton under an srun step of 4 tasks: refused (exit 2), nothing measured"
else
  show "$tmp/mismatch.out"; show "$tmp/mismatch.err"; not_ok "launch mismatch (exit $rc)"
fi
