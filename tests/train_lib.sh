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
check() { local name=$1; shift; if "$@"; then ok "$name"; else not_ok "$name"; fi; }
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
