# Shared helpers for the cohort-farm tests (sourced; prints TAP). The TAP
# helpers (ok, not_ok, check, show) come from train_lib.sh.
. "${COHORT_SRCDIR:-.}/tests/train_lib.sh"
FARM="$build/jobs/cohort-farm"

# id_tasks FILE N [CMD]: N tasks "CMD; echo $COHORT_TASK_ID >> ids" (run in the farm's cwd)
id_tasks() {
  local i=0
  : > "$1"
  while [ "$i" -lt "$2" ]; do
    echo "${3:+$3; }echo \$COHORT_TASK_ID >> \"\$COHORT_FARM_DIR/../ids\"" >> "$1"
    i=$((i + 1))
  done
}

# farm NP DIR [args...]: run cohort-farm on NP ranks with run directory DIR,
# output in DIR.log; returns its exit status
farm() {
  local np=$1 dir=$2; shift 2
  "$MPIEXEC" -n "$np" "$FARM" --farm.dir="$dir" "$@" >> "$dir.log" 2>&1
}

# exactly_once IDS N: every id 0..N-1 appears exactly once in the file IDS
exactly_once() {
  local bad
  bad=$(seq 0 $(($2 - 1)) | cat - "$1" | sort -n | uniq -c | awk '$1 != 2 { print $2 " x" $1 - 1 }' \
        | head -5)
  if [ -n "$bad" ]; then echo "ids not seen exactly once: $bad" >&2; return 1; fi
  [ "$(wc -l < "$1")" -eq "$2" ]
}

# farm_ranks / farm_proxies MPIEXEC_PID: pids of the ranks / hydra proxies of
# that run (mpiexec -> hydra
# proxy -> ranks; the ranks' children are the slot supervisors)
farm_ranks() {
  local p
  for p in $(pgrep -P "$1"); do pgrep -P "$p"; done
}
farm_proxies() { pgrep -P "$1"; }
# farm_tree PID: PID and all its descendants
farm_tree() {
  local p
  echo "$1"
  for p in $(pgrep -P "$1"); do farm_tree "$p"; done
}

# wait_lines FILE N PID: wait (<= 60 s) until FILE has >= N lines while PID lives
wait_lines() {
  local t0; t0=$(date +%s)
  while [ "$(cat "$1" 2>/dev/null | wc -l)" -lt "$2" ]; do
    [ $(($(date +%s) - t0)) -gt 60 ] && return 1
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.1
  done
}
