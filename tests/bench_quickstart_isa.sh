#!/bin/sh
# Benchmark (not a test): the README's quick start (mpiexec -n 2
# jobs/cohort-train --config jobs/train.cfg, resnet18 on Fashion-MNIST)
# natively and under ONEDNN_MAX_CPU_ISA caps, alternating native, cap, native,
# cap, ... for ROUNDS rounds; prints each run's wall time, the medians and the
# ratio capped/native (issue 12's goal: AVX2 within 1.5x of native).
#
#   tests/bench_quickstart_isa.sh [-r ROUNDS] [-i "ISA ..."] [-s STEPS]
#                                 [-e EPOCHS] [-n RANKS] [-o LOG_DIR]
#                                 [-- COHORT_TRAIN_OPTION ...]
#
#   -r  rounds (default 3)
#   -i  caps to compare with the native run (default "AVX2")
#   -s  training steps per epoch, --train.max_steps (default 100; the full
#       quick start runs 468 per epoch: 60,000 images / (64 x 2 ranks))
#   -e  epochs, --schedule.epochs (default 1; the quick start runs 5)
#   -n  MPI ranks (default 2, as the README)
#   -o  keep each run's output in LOG_DIR (default: removed at the end)
# The test set is cut to --data.test_subset = STEPS x 64 x RANKS / 6 images,
# so evaluation keeps the quick start's share of the work (10,000 test images
# per 60,000 trained). Each run writes its checkpoints into a fresh temporary
# output.dir. Options after -- go to every cohort-train run (e.g.
# --train.threads=2). The wall time is the whole mpiexec command (start,
# data loading, training, evaluation, checkpoints), from date +%s.%N.
# docs/perf-isa.md.
set -u
build=${COHORT_BUILDDIR:-.}
src=${COHORT_SRCDIR:-.}
rounds=3 isas=AVX2 steps=100 epochs=1 np=2 logdir=
while getopts r:i:s:e:n:o: o; do
  case $o in
    r) rounds=$OPTARG ;; i) isas=$OPTARG ;; s) steps=$OPTARG ;; e) epochs=$OPTARG ;;
    n) np=$OPTARG ;; o) logdir=$OPTARG ;;
    *) echo "usage: $0 [-r ROUNDS] [-i ISAS] [-s STEPS] [-e EPOCHS] [-n RANKS] [-o LOG_DIR] [-- OPTION ...]" >&2
       exit 2 ;;
  esac
done
shift $((OPTIND - 1))
for v in "$rounds" "$steps" "$epochs" "$np"; do
  case $v in '' | *[!0-9]* | 0) echo "$0: -r, -s, -e and -n want positive integers, got '$v'" >&2; exit 2 ;; esac
done
[ -x "$build/jobs/cohort-train" ] || { echo "$0: $build/jobs/cohort-train is not built" >&2; exit 1; }
subset=$((steps * 64 * np / 6))

tmp=$(mktemp -d "${TMPDIR:-/tmp}/cohort-bench-quickstart.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if [ -n "$logdir" ]; then mkdir -p "$logdir" || exit 1; else logdir=$tmp; fi

median() {
  sort -g | awk '{a[NR]=$1} END{if(NR==0) print "n/a"; else if(NR%2) print a[(NR+1)/2]; else printf "%.1f\n", (a[NR/2]+a[NR/2+1])/2}'
}
now() { date +%s.%N; }

cmd="mpiexec -n $np $build/jobs/cohort-train --config $src/jobs/train.cfg --schedule.epochs $epochs"
cmd="$cmd --train.max_steps $steps --data.test_subset $subset"
echo "quick start: $cmd${*:+ $*} --output.dir TMP (each run)"
echo "rounds $rounds, alternating native and $isas; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo
all="native $isas"
for a in $all; do : > "$tmp/w.$a"; : > "$tmp/i.$a"; done
r=1
while [ $r -le "$rounds" ]; do
  for a in $all; do
    if [ "$a" = native ]; then e="env -u ONEDNN_MAX_CPU_ISA -u DNNL_MAX_CPU_ISA"; else e="env ONEDNN_MAX_CPU_ISA=$a"; fi
    f=$logdir/quickstart.$a.r$r.log
    out=$tmp/run.$a.$r
    t0=$(now)
    # shellcheck disable=SC2086
    $e $cmd "$@" --output.dir "$out" > "$f" 2>&1
    rc=$?
    t1=$(now)
    rm -rf "$out"
    if [ $rc -ne 0 ]; then
      echo "round $r $a: cohort-train failed (exit $rc); its last lines:" >&2
      tail -n 5 "$f" >&2
      exit 1
    fi
    w=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b - a}')
    # the last epoch line's training throughput ("... 74 images/s  8.6 s")
    ips=$(sed -n 's/^epoch [0-9]*: .* \([0-9.]*\) images\/s .*/\1/p' "$f" | tail -n 1)
    # the ISA oneDNN runs at, from cohort-train's "compute: oneDNN ... isa avx2" line
    eff=$(sed -n 's/^compute: .*[ (]isa \([a-z0-9_]*\).*/\1/p' "$f" | head -n 1)
    echo "$w" >> "$tmp/w.$a"; echo "${ips:-n/a}" >> "$tmp/i.$a"
    echo "round $r $a: wall $w s, training ${ips:-n/a} images/s, oneDNN isa ${eff:-?} (load $(cut -d' ' -f1 /proc/loadavg))"
  done
  r=$((r + 1))
done
echo
nw=$(median < "$tmp/w.native")
echo "| ISA cap | wall s (median) | training images/s (median) | wall / native | per round, wall s |"
echo "|---|--:|--:|--:|---|"
for a in $all; do
  m=$(median < "$tmp/w.$a")
  echo "| $a | $m | $(grep -E '^[0-9.]+$' "$tmp/i.$a" | median) | $(awk -v x="$m" -v y="$nw" 'BEGIN{printf "%.2f", x / y}') | $(tr '\n' ' ' < "$tmp/w.$a" | sed 's/ $//') |"
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
