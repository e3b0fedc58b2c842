# Shared helpers for the cohort-train tests (sourced; prints TAP).
set -u
build=${COHORT_BUILDDIR:-.}
src=${COHORT_SRCDIR:-.}
MPIEXEC=${MPIEXEC:-mpiexec}
TRAIN="$build/jobs/cohort-train"
STCMP="$build/tests/st_compare"
DATA=/usr/share/datasets/fashion-mnist
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cohort-train-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
tap_n=0
ok() { tap_n=$((tap_n + 1)); echo "ok $tap_n - $*"; }
not_ok() { tap_n=$((tap_n + 1)); echo "not ok $tap_n - $*"; }
skip() { tap_n=$((tap_n + 1)); echo "ok $tap_n - $1 # SKIP $2"; }
# check NAME CMD...: a test point that passes when CMD succeeds
check() { local name=$1; shift; if "$@" >&2; then ok "$name"; else not_ok "$name"; fi; }
need_data() {
  if [ ! -r "$DATA/train-images-idx3-ubyte.gz" ]; then
    echo "1..0 # SKIP Fashion-MNIST not installed in $DATA (apt-get install dataset-fashion-mnist)"
    exit 0
  fi
}
# train NP OUTDIR [overrides...]: run cohort-train on NP ranks, log in OUTDIR.log
train() {
  local np=$1 out=$2; shift 2
  "$MPIEXEC" -n "$np" "$TRAIN" --output.dir="$out" --data.workers=1 --train.threads=1 "$@" \
    > "$out.log" 2>&1
}
# show the tail of a log on stderr (goes to the test's .log, not to TAP)
show() { echo "---- $1" >&2; tail -n "${2:-25}" "$1" >&2; }
# rank_pids OUTDIR: PIDs of the cohort-train ranks (not mpiexec or the hydra
# proxy) of the run writing OUTDIR
rank_pids() {
  pgrep -f -- "--output.dir=$1 " | while read -r p; do
    case "$(cat /proc/"$p"/comm 2>/dev/null)" in cohort-train|lt-cohort-train) echo "$p" ;; esac
  done
}
# Holding the ranks at a chosen step (COHORT_TEST_HOLD, ch_job_test_hold in
# framework/runtime/job.h; cohort-train "step:G": after global step G,
# before that step's stop check), so that a case meets the running job there
# however fast or slow the machine is.
# new_hold KIND N: a fresh hold directory; sets hold (its path) and hold_env
# (the variable's value; pass it as COHORT_TEST_HOLD=$hold_env).
hold_seq=0
new_hold() {
  hold_seq=$((hold_seq + 1))
  hold=$tmp/hold-$hold_seq
  mkdir -p "$hold"
  hold_env=$1:$2:$hold
}
# hold_wait WHAT NP PID: wait (<= 120 s, while PID lives) until ranks 0..NP-1
# have written $hold/WHAT.RANK (WHAT: held; signal: a preemption signal
# received while held)
hold_wait() {
  local t0 r; t0=$(date +%s)
  for r in $(seq 0 $(($2 - 1))); do
    while [ ! -e "$hold/$1.$r" ]; do
      [ $(($(date +%s) - t0)) -gt 120 ] && { echo "no $hold/$1.$r after 120 s" >&2; return 1; }
      kill -0 "$3" 2>/dev/null || { echo "no $hold/$1.$r: the run ended" >&2; return 1; }
      sleep 0.05
    done
  done
}
# hold_release: let the held ranks go on
hold_release() { : > "$hold/release"; }
# wait_line FILE REGEX PID: wait (<= 120 s) for a line in FILE while PID lives
wait_line() {
  local t0; t0=$(date +%s)
  while ! grep -q "$2" "$1" 2>/dev/null; do
    [ $(($(date +%s) - t0)) -gt 120 ] && return 1
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.05
  done
}
# stop_file_run STEP OUTDIR [overrides...]: a 2-rank run that a STOP file in
# OUTDIR stops while the ranks hold after global step STEP; log in
# OUTDIR.log; sets rc (its exit status, 3 for the stop)
stop_file_run() {
  local at=$1 out=$2 pid; shift 2
  new_hold step "$at"
  COHORT_TEST_HOLD=$hold_env "$MPIEXEC" -n 2 "$TRAIN" --output.dir="$out" --data.workers=1 \
    --train.threads=1 "$@" > "$out.log" 2>&1 &
  pid=$!
  hold_wait held 2 $pid
  : > "$out/STOP"
  hold_release
  wait $pid
  rc=$?
}
