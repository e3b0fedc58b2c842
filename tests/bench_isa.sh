#!/bin/sh
# Benchmark (not a test): cohort (tests/bench_nn) against PyTorch
# (tests/golden/bench_nn_torch.py) under oneDNN ISA caps, side by side in one
# session, alternating cohort, PyTorch, cohort, ... for ROUNDS rounds; prints
# a markdown table of the medians (images/s) and the ratio cohort/PyTorch.
#
#   tests/bench_isa.sh [-r ROUNDS] [-t THREADS] [-i "AVX2 AVX512_CORE native"]
#                      [-b BASELINE_BENCH_NN] [-c] [CASE ...]
#
# CASE is arch:channels:size:batch:train|eval:steps (default: the cases of
# issue 12's table). PyTorch runs with the same ONEDNN_MAX_CPU_ISA and the
# matching ATEN_CPU_CAPABILITY (avx2 / avx512 / default below AVX2). With -b,
# a second cohort build (e.g. the previous commit's tests/bench_nn) runs in
# each round too, as the "before" column. Each run's figure is its median over
# the timed steps (after the warm-up steps: 2, or 1 when steps <= 3); the
# table shows the median of the ROUNDS run figures. Figures are images/s of
# wall time, or with -c images per CPU-second (batch / median process CPU
# time of a step: the fair figure on a loaded machine at 1 thread, where CPU
# time is the work done). docs/perf-isa.md.
set -u
build=${COHORT_BUILDDIR:-.}
src=${COHORT_SRCDIR:-.}
PY=${PYTHON3:-/usr/bin/python3}
rounds=3 threads=2 isas="AVX2 AVX512_CORE" base= cpu=0
while getopts r:t:i:b:c o; do
  case $o in
    r) rounds=$OPTARG ;; t) threads=$OPTARG ;; i) isas=$OPTARG ;; b) base=$OPTARG ;; c) cpu=1 ;;
    *) echo "usage: $0 [-r ROUNDS] [-t THREADS] [-i ISAS] [-b BASELINE] [-c] [CASE ...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
cases=${*:-"resnet18:1:28:64:train:5 resnet34:1:28:64:train:4 resnet18:3:32:64:train:5
resnet18:1:28:64:eval:8 resnet50:3:224:16:eval:3"}

# median of the numbers on stdin
median() { sort -g | awk '{a[NR]=$1} END{if(NR==0) print "nan"; else if(NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
# ips: images/s (or, -c, images per CPU-second) from a bench line on stdin
ips() {
  if [ "$cpu" = 1 ]; then
    sed -n 's/.*cpu median \([0-9.]*\) ms\/step.*/\1/p' | head -n 1 |
      awk -v b="$batch" '{printf "%.1f\n", b * 1000 / $1}'
  else
    sed -n 's/.*, \([0-9.]*\) images\/s.*/\1/p' | head -n 1
  fi
}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/cohort-bench-isa.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
unit="images/s"; [ "$cpu" = 1 ] && unit="images/CPU-s"
echo "$unit, $threads thread(s), median of $rounds alternating rounds"
echo
if [ -n "$base" ]; then
  echo "| ISA cap | case | cohort before | cohort | PyTorch | cohort/PyTorch | before/PyTorch |"
  echo "|---|---|--:|--:|--:|--:|--:|"
else
  echo "| ISA cap | case | cohort | PyTorch | cohort/PyTorch |"
  echo "|---|---|--:|--:|--:|"
fi
for isa in $isas; do
  case $isa in
    native) aten= ;; AVX512*) aten=avx512 ;; AVX2*) aten=avx2 ;; *) aten=default ;;
  esac
  for c in $cases; do
    IFS=: read -r arch ch size batch mode steps <<EOC
$c
EOC
    warm=2; [ "$steps" -le 3 ] && warm=1
    flag=; [ "$mode" = eval ] && flag=--eval
    args="--arch $arch --channels $ch --size $size --batch $batch --threads $threads --steps $steps --warmup $warm $flag"
    : > "$tmp/c"; : > "$tmp/t"; : > "$tmp/b"
    r=0
    while [ $r -lt "$rounds" ]; do
      if [ "$isa" = native ]; then
        set -- env -u ONEDNN_MAX_CPU_ISA -u ATEN_CPU_CAPABILITY
      else
        set -- env ONEDNN_MAX_CPU_ISA="$isa" ATEN_CPU_CAPABILITY="$aten"
      fi
      # shellcheck disable=SC2086
      "$@" "$build/tests/bench_nn" $args 2>/dev/null | ips >> "$tmp/c"
      # shellcheck disable=SC2086
      "$@" "$PY" "$src/tests/golden/bench_nn_torch.py" $args 2>/dev/null | ips >> "$tmp/t"
      # shellcheck disable=SC2086
      [ -n "$base" ] && "$@" "$base" $args 2>/dev/null | ips >> "$tmp/b"
      r=$((r + 1))
    done
    cm=$(median < "$tmp/c"); tm=$(median < "$tmp/t")
    name="$arch $mode ${ch}x${size}x${size} b$batch"
    if [ -n "$base" ]; then
      bm=$(median < "$tmp/b")
      echo "| $isa | $name | $bm | $cm | $tm | $(awk "BEGIN{printf \"%.2f\", $cm/$tm}") | $(awk "BEGIN{printf \"%.2f\", $bm/$tm}") |"
    else
      echo "| $isa | $name | $cm | $tm | $(awk "BEGIN{printf \"%.2f\", $cm/$tm}") |"
    fi
    echo "  runs: cohort $(tr '\n' ' ' < "$tmp/c")/ torch $(tr '\n' ' ' < "$tmp/t")${base:+/ before $(tr '\n' ' ' < "$tmp/b")}" >&2
  done
done
