#!/bin/sh
# tests/gpu/device-check.sh without a GPU (issue #25): the script parses;
# its run stages come in the order the device time is spent best (the GPU
# tests, then NCCL, then the reduced benchmark resnet18 + resnet50, then
# the training tests and cohort-train, the rest of the benchmark last);
# every GPU test is rerun with CUDA_LAUNCH_BLOCKING=1 when it fails; the
# command line refuses a missing bundle with one line. TAP.
src=${COHORT_SRCDIR:-.}
dc="$src/tests/gpu/device-check.sh"
n=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
not_ok() { n=$((n + 1)); echo "not ok $n - $*"; }
check() { name=$1; shift; if "$@" >&2; then ok "$name"; else not_ok "$name"; fi; }
echo "1..6"
check "device-check.sh parses (bash -n)" bash -n "$dc"

# the stage names of the run, in the order the script runs them
order=$(awk '/^run_all\(\)/ { on = 1 } on && /^}/ { exit }
  on && match($0, /(stage|bench_pair) [A-Za-z0-9_-]+/) {
    w = substr($0, RSTART, RLENGTH); sub(/^[a-z_]+ /, "", w); print w }' "$dc" | tr '\n' ' ')
echo "# stages: $order" >&2
want="test_gpu_ops test_gpu_nccl test_gpu_nccl-np2 nccl bench test_gpu_train test_gpu_train_job cohort-train bench-34"
in_order() {
  rest=" $order "
  for w in $want; do
    case "$rest" in *" $w "*) rest=" ${rest#*" $w "}" ;; *) echo "stage $w missing or out of order" >&2; return 1 ;; esac
  done
}
check "stages: GPU tests, NCCL, reduced benchmark, training tests, the rest ($want)" in_order
check "the reduced benchmark is resnet18 and resnet50, the rest resnet34" \
  grep -qE 'bench_pair bench resnet18,resnet50 [0-9]+' "$dc"
reruns() {
  for t in test_gpu_ops test_gpu_nccl test_gpu_train test_cuda_kernels; do
    grep -qE "rerun_blocking $t " "$dc" || { echo "$t has no CUDA_LAUNCH_BLOCKING rerun" >&2; return 1; }
  done
  grep -q 'CUDA_LAUNCH_BLOCKING=1 "\$@"' "$dc"
}
check "a failing GPU test is rerun with CUDA_LAUNCH_BLOCKING=1" reruns
out=$(bash "$dc" run /nonexistent/bundle 2>&1); rc=$?
check "run without a bundle: exit 1 and one line saying how to make one" \
  sh -c '[ "$1" = 1 ] && printf "%s\n" "$2" | grep -q "no bundle at /nonexistent/bundle (make one with: tests/gpu/device-check.sh prepare)"' _ "$rc" "$out"
check "--help prints the usage" sh -c 'bash "$1" --help | grep -q "tests/gpu/device-check.sh prepare"' _ "$dc"
