#!/bin/sh
# Benchmark (not a test): cohort (tests/bench_nn) against PyTorch
# (tests/golden/bench_nn_torch.py) under oneDNN ISA caps, side by side in one
# session: in each of ROUNDS rounds it runs cohort, PyTorch (Debian's 1.13),
# the second PyTorch (-p, e.g. torch 2.x from PyPI in a venv) and the
# baseline cohort build (-b), one after the other, for each ISA cap x thread
# count x case. Prints two markdown tables of the medians (wall images/s and
# images per CPU-second) with the ratios cohort/PyTorch, the per-round
# figures, and the load average before and after each ISA block.
#
#   tests/bench_isa.sh [-M] [-r ROUNDS] [-t "THREADS ..."] [-i "ISA ..."]
#                      [-p TORCH2_PYTHON] [-b BASELINE_BENCH_NN] [-a ALGORITHM]
#                      [-o LOG_DIR] [-n] [CASE ...]
#
#   -M  issue 12's matrix: -i "AVX2 AVX512_CORE native" -t "1 2" and the
#       cases resnet18/34/50 x (1x28x28 batch 64, 3x224x224 batch 16) x
#       (train, eval), with few timed steps at 224x224; the other options,
#       wherever they stand, override the preset's.
#   -r  rounds (default 3); the tables show the median of the run figures.
#   -t  thread counts, a list (default "2"); each is --threads of every run.
#   -i  ISA caps (default "AVX2 AVX512_CORE"): ONEDNN_MAX_CPU_ISA values, or
#       "native" (no cap). PyTorch gets the same ONEDNN_MAX_CPU_ISA and the
#       matching ATEN_CPU_CAPABILITY (avx512 / avx2 / default below AVX2,
#       unset for native) and MKL_ENABLE_INSTRUCTIONS (torch 2.x from PyPI
#       calls MKL for its matrix products; Debian's 1.13 has no MKL).
#   -p  a second PyTorch's python, e.g. /work/venv-torch2/bin/python made by
#       tests/bench_torch_venv.sh; adds its column and the cohort/torch ratio.
#   -b  a second cohort build's tests/bench_nn (e.g. the previous commit's),
#       the "before" column.
#   -a  also run cohort with --conv-algorithm ALGORITHM (auto, winograd or direct:
#       compute.cpu_conv_algorithm), its own column and ratios; the plain
#       cohort column stays the default (direct).
#   -o  keep every run's output in LOG_DIR (default: a temporary folder,
#       removed at the end).
#   -n  print the plan and the estimated time, run nothing.
#   -c  accepted for older command lines; both tables are always printed.
#   -z  ONNX_DIR: a case whose arch is NAME.onnx runs cohort on the model of
#       ONNX_DIR/NAME.onnx (bench_nn --onnx; cohort-train's model.onnx) and
#       PyTorch on torchvision's NAME with dropout and stochastic depth at
#       p = 0, the module tests/golden/onnx_zoo.py exports (issue 28's
#       goals: onnx_zoo.py DIR mobilenet_v2 ... writes the files, 3x64x64).
#
# CASE is arch:channels:size:batch:train|eval:steps[:warmup] (default: the
# cases of issue 12's first table). Warm-up steps default to 2, or 1 when
# steps <= 3. Each run's figure is its median over the timed steps: wall
# images/s (batch / median wall time of a step) and images per CPU-second
# (batch / median process CPU time of a step; at 1 thread on a loaded machine
# the fair figure, since CPU time is the work done; at 2 threads it measures
# efficiency, not speed).
#
# At the start of each ISA block one short DNNL_VERBOSE run of each program
# (resnet18 1x28x28 batch 2, one eval step) prints the convolution kernels
# oneDNN picked, so the table shows that the cap reached every program
# (torch 2.x links its own oneDNN 3.x, which reads the same variable).
# The expected total time is printed first (a rough FLOP model, see est()),
# and after each case the elapsed time and the projected end. docs/perf-isa.md.
set -u
build=${COHORT_BUILDDIR:-.}
src=${COHORT_SRCDIR:-.}
PY=${PYTHON3:-/usr/bin/python3}

default_cases="resnet18:1:28:64:train:5 resnet34:1:28:64:train:4 resnet18:3:32:64:train:5
resnet18:1:28:64:eval:8 resnet50:3:224:16:eval:3"
matrix_cases="resnet18:1:28:64:train:5 resnet34:1:28:64:train:4 resnet50:1:28:64:train:3
resnet18:1:28:64:eval:8 resnet34:1:28:64:eval:6 resnet50:1:28:64:eval:5
resnet18:3:224:16:train:2 resnet34:3:224:16:train:2 resnet50:3:224:16:train:2
resnet18:3:224:16:eval:3 resnet34:3:224:16:eval:2 resnet50:3:224:16:eval:2"

usage="usage: $0 [-M] [-r ROUNDS] [-t THREADS] [-i ISAS] [-p TORCH2_PYTHON] [-b BASELINE] [-a ALGORITHM] [-o LOG_DIR] [-z ONNX_DIR] [-n] [CASE ...]"
rounds=3 threads=2 isas="AVX2 AVX512_CORE" py2='' base='' alg='' logdir='' dry=0 preset=0 zoo=''
o_r='' o_t='' o_i=''
while getopts Mr:t:i:p:b:a:o:z:nc o; do
  case $o in
    M) preset=1 ;; r) o_r=$OPTARG ;; t) o_t=$OPTARG ;; i) o_i=$OPTARG ;;
    p) py2=$OPTARG ;; b) base=$OPTARG ;; a) alg=$OPTARG ;; o) logdir=$OPTARG ;; n) dry=1 ;; c) ;;
    z) zoo=$OPTARG ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
cases=$default_cases
if [ "$preset" = 1 ]; then
  isas="AVX2 AVX512_CORE native" threads="1 2" cases=$matrix_cases
fi
[ -n "$o_r" ] && rounds=$o_r
[ -n "$o_t" ] && threads=$o_t
[ -n "$o_i" ] && isas=$o_i
[ $# -gt 0 ] && cases=$*
case $alg in '' | direct | auto | winograd) ;; *) echo "$0: -a wants direct, auto or winograd, got '$alg'" >&2; exit 2 ;; esac
case $rounds in '' | *[!0-9]* | 0) echo "$0: -r wants a positive integer, got '$rounds'" >&2; exit 2 ;; esac
for t in $threads; do
  case $t in *[!0-9]* | 0) echo "$0: -t wants positive integers, got '$t'" >&2; exit 2 ;; esac
done
for c in $cases; do
  case $c in
    resnet*:*:*:*:train:* | resnet*:*:*:*:eval:*) ;;
    *.onnx:*:*:*:train:* | *.onnx:*:*:*:eval:*)
      [ -n "$zoo" ] && [ -f "$zoo/${c%%:*}" ] ||
        { echo "$0: case '$c': no ${c%%:*} in the -z folder '$zoo'" >&2; exit 2; } ;;
    *) echo "$0: case '$c' is not arch:channels:size:batch:train|eval:steps[:warmup]" >&2; exit 2 ;;
  esac
done
if [ "$dry" = 0 ]; then
  for p in "$build/tests/bench_nn" ${base:+"$base"}; do
    [ -x "$p" ] || { echo "$0: $p is not built (make tests/bench_nn)" >&2; exit 1; }
  done
  for p in "$PY" ${py2:+"$py2"}; do
    "$p" -c 'import torch, torchvision' 2>/dev/null ||
      { echo "$0: $p cannot import torch and torchvision" >&2; exit 1; }
  done
fi

# split a case into arch ch size batch mode steps warm
parse_case() {
  IFS=: read -r arch ch size batch mode steps warm <<EOC
$1
EOC
  [ -n "$warm" ] || { warm=2; [ "$steps" -le 3 ] && warm=1; }
}
# est THREADS: rough seconds for one round of the current case, all programs.
# Forward GFLOP per image at 224x224 (torchvision's 1.82/3.67/4.11 GMAC x 2),
# scaled by (size/224)^2, x3 for a training step; at the 1-thread AVX2 rates
# measured in docs/perf-isa.md section 3 (cohort about 75 GFLOP/s; PyTorch
# 1.13 about 30 at 28x28 and 60 at 224x224), x1.7 at 2 threads and more, plus
# 1 s start per cohort run and 4 s per PyTorch run (import torch). A quiet
# machine; at load 4-16 expect 2-5x (5x measured at load 13-16). The second
# PyTorch is counted at the first one's rate.
est() {
  awk -v a="$arch" -v s="$size" -v b="$batch" -v m="$mode" -v n=$((steps + warm)) -v t="$1" \
      -v np="$n_torch" -v nc="$n_cohort" 'BEGIN {
    g = (a == "resnet18") ? 3.64 : (a == "resnet34") ? 7.34 : 8.22
    g *= (s / 224) * (s / 224) * (m == "train" ? 3 : 1) * b * n
    sp = (t > 1) ? 1.7 : 1
    tr = (s <= 64) ? 30 : 60
    printf "%.0f\n", nc * (1 + g / (75 * sp)) + np * (4 + g / (tr * sp)) }'
}
n_torch=1 n_cohort=1
[ -n "$py2" ] && n_torch=2
[ -n "$base" ] && n_cohort=2
[ -n "$alg" ] && n_cohort=$((n_cohort + 1))
total_est=0
for isa in $isas; do
  for t in $threads; do
    for c in $cases; do
      parse_case "$c"
      total_est=$((total_est + rounds * $(est "$t")))
    done
  done
done
n_isa=$(echo $isas | wc -w) n_t=$(echo $threads | wc -w) n_c=$(echo $cases | wc -w)
hms() { awk -v s="$1" 'BEGIN{printf "%dh%02dm%02ds", s / 3600, (s % 3600) / 60, s % 60}'; }
echo "bench_isa: $n_isa ISA cap(s) ($isas) x $n_t thread count(s) ($threads) x $n_c case(s) x $rounds round(s);" \
     "programs: cohort, torch ($PY)${py2:+, torch ($py2)}${base:+, cohort before ($base)}${alg:+, cohort $alg}" >&2
echo "bench_isa: expected time about $(hms $total_est) on a quiet machine (rough FLOP model; 2-5x that at load 4-16)" >&2
if [ "$dry" = 1 ]; then
  for c in $cases; do
    parse_case "$c"
    echo "  $c: warm-up $warm, one round ~$(est 1) s at 1 thread" >&2
  done
  exit 0
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/cohort-bench-isa.XXXXXX")
if [ -n "$logdir" ]; then mkdir -p "$logdir" || exit 1; else logdir=$tmp/logs; mkdir "$logdir"; fi
trap 'rm -rf "$tmp"' EXIT
trap 'echo "bench_isa: interrupted; the cases measured so far:" >&2; report; exit 130' INT TERM

# median of the numbers on stdin (lines that are not numbers are skipped)
median() {
  grep -E '^[0-9.]+$' | sort -g |
    awk '{a[NR]=$1} END{if(NR==0) print "n/a"; else if(NR%2) print a[(NR+1)/2]; else printf "%.1f\n", (a[NR/2]+a[NR/2+1])/2}'
}
ratio() { awk -v x="$1" -v y="$2" 'BEGIN{if (x + 0 > 0 && y + 0 > 0) printf "%.2f", x / y; else print "n/a"}'; }
# wall images/s and images per CPU-second of a bench output file, or "fail"
figures() {
  w=$(sed -n 's/.*, \([0-9.]*\) images\/s.*/\1/p' "$1" | head -n 1)
  cp=$(sed -n 's/.*cpu median \([0-9.]*\) ms\/step.*/\1/p' "$1" | head -n 1)
  if [ -n "$w" ] && [ -n "$cp" ]; then
    echo "$w $(awk -v b="$batch" -v c="$cp" 'BEGIN{printf "%.1f", b * 1000 / c}')"
  else
    echo "fail fail"
  fi
}
# the distinct convolution implementations in oneDNN verbose lines on stdin
conv_impls() {
  awk -F, '/exec/ { for (i = 1; i < NF; i++) if ($i == "convolution") { print $(i + 1); break } }' |
    sort -u | tr '\n' ' '
}
torch_version() { "$1" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null; }
v1=$(torch_version "$PY") v2=
[ -n "$py2" ] && v2=$(torch_version "$py2")

progs="cohort torch1"
[ -n "$py2" ] && progs="$progs torch2"
[ -n "$base" ] && progs="$progs before"
[ -n "$alg" ] && progs="$progs alg"
# run PROG ARGS...: one program under the current cap environment ("$@" of envcmd)
run_prog() {
  p=$1; shift
  # an ONNX case (-z): cohort builds the model from ZOO_DIR/NAME.onnx, PyTorch
  # builds torchvision's NAME (onnx_zoo.py's export of the same module)
  if [ "$1" = --arch ] && [ "${2%.onnx}" != "$2" ]; then
    a=$2; shift 2
    case $p in
      cohort | before | alg) set -- --onnx "$zoo/$a" "$@" ;;
      *) set -- --arch "${a%.onnx}" "$@" ;;
    esac
  fi
  case $p in
    cohort) $envcmd "$build/tests/bench_nn" "$@" ;;
    torch1) $envcmd "$PY" "$src/tests/golden/bench_nn_torch.py" "$@" ;;
    torch2) $envcmd "$py2" "$src/tests/golden/bench_nn_torch.py" "$@" ;;
    before) $envcmd "$base" "$@" ;;
    alg) $envcmd "$build/tests/bench_nn" --conv-algorithm "$alg" "$@" ;;
  esac
}

: > "$tmp/rows"
: > "$tmp/rounds"
: > "$tmp/loads"
: > "$tmp/isacheck"
report() {
  h_t1="torch $v1" h_t2="torch $v2"
  for kind in wall cpu; do
    if [ $kind = wall ]; then
      echo "### wall clock, images/s (median of $rounds alternating rounds)"
    else
      echo "### images per CPU-second (batch / median process CPU time of a step; median of $rounds rounds)"
    fi
    echo
    hdr="| ISA cap | threads | case |" sep="|---|--:|---|"
    [ -n "$base" ] && { hdr="$hdr cohort before |"; sep="$sep--:|"; }
    hdr="$hdr cohort |" sep="$sep--:|"
    [ -n "$alg" ] && { hdr="$hdr cohort $alg |"; sep="$sep--:|"; }
    hdr="$hdr $h_t1 |" sep="$sep--:|"
    [ -n "$py2" ] && { hdr="$hdr $h_t2 |"; sep="$sep--:|"; }
    hdr="$hdr cohort/$h_t1 |" sep="$sep--:|"
    [ -n "$py2" ] && { hdr="$hdr cohort/$h_t2 |"; sep="$sep--:|"; }
    [ -n "$alg" ] && { hdr="$hdr $alg/$h_t1 |"; sep="$sep--:|"; }
    [ -n "$alg" ] && [ -n "$py2" ] && { hdr="$hdr $alg/$h_t2 |"; sep="$sep--:|"; }
    [ -n "$base" ] && { hdr="$hdr before/$h_t1 |"; sep="$sep--:|"; }
    echo "$hdr"
    echo "$sep"
    # rows: isa threads name then, per program in $progs order, wall cpu medians
    while IFS='|' read -r isa t name meds; do
      set -- $meds
      cw=$1 cc=$2 tw=$3 tc=$4; shift 4
      t2w='' t2c='' bw='' bc='' aw='' ac=''
      [ -n "$py2" ] && { t2w=$1 t2c=$2; shift 2; }
      [ -n "$base" ] && { bw=$1 bc=$2; shift 2; }
      [ -n "$alg" ] && { aw=$1 ac=$2; }
      if [ $kind = wall ]; then c=$cw x=$tw x2=$t2w b=$bw a=$aw; else c=$cc x=$tc x2=$t2c b=$bc a=$ac; fi
      line="| $isa | $t | $name |"
      [ -n "$base" ] && line="$line $b |"
      line="$line $c |"
      [ -n "$alg" ] && line="$line $a |"
      line="$line $x |"
      [ -n "$py2" ] && line="$line $x2 |"
      line="$line $(ratio "$c" "$x") |"
      [ -n "$py2" ] && line="$line $(ratio "$c" "$x2") |"
      [ -n "$alg" ] && line="$line $(ratio "$a" "$x") |"
      [ -n "$alg" ] && [ -n "$py2" ] && line="$line $(ratio "$a" "$x2") |"
      [ -n "$base" ] && line="$line $(ratio "$b" "$x") |"
      echo "$line"
    done < "$tmp/rows"
    echo
  done
  echo "Per-round figures, wall images/s then [images per CPU-second], in table order:"
  echo
  sed 's/^/    /' "$tmp/rounds"
  echo
  echo "Load average (1, 5, 15 min) before and after each ISA block:"
  echo
  sed 's/^/    /' "$tmp/loads"
  echo
  echo "Convolution kernels oneDNN picked under each cap (DNNL_VERBOSE, resnet18 1x28x28 b2 eval):"
  echo
  sed 's/^/    /' "$tmp/isacheck"
}

start=$(date +%s) done_est=0
for isa in $isas; do
  case $isa in
    native) aten='' mkl='' ;; AVX512*) aten=avx512 mkl=AVX512 ;; AVX2*) aten=avx2 mkl=AVX2 ;;
    AVX) aten=default mkl=AVX ;; *) aten=default mkl=SSE4_2 ;;
  esac
  if [ "$isa" = native ]; then
    envcmd="env -u ONEDNN_MAX_CPU_ISA -u DNNL_MAX_CPU_ISA -u ATEN_CPU_CAPABILITY -u MKL_ENABLE_INSTRUCTIONS"
  else
    envcmd="env ONEDNN_MAX_CPU_ISA=$isa ATEN_CPU_CAPABILITY=$aten MKL_ENABLE_INSTRUCTIONS=$mkl"
  fi
  load_before=$(cut -d' ' -f1-3 /proc/loadavg)
  line="$isa:" plain_env=$envcmd envcmd="$plain_env DNNL_VERBOSE=1 ONEDNN_VERBOSE=1"
  for p in $progs; do
    f=$logdir/$isa.verbose.$p
    run_prog $p --arch resnet18 --channels 1 --size 28 --batch 2 --threads 1 --steps 1 --warmup 0 --eval > "$f" 2>&1
    k=$(conv_impls < "$f")
    # the ISA oneDNN reports it runs at ("onednn_verbose,...,info,cpu,isa:Intel AVX2")
    v=$(sed -n 's/.*,info,cpu,isa:\([^,]*\).*/\1/p' "$f" | head -n 1)
    k="${k:-none }[${v:-no oneDNN verbose output}]"
    # PyTorch's own kernels (ATEN_CPU_CAPABILITY), from bench_nn_torch.py's line
    cap=$(sed -n 's/.*; cpu capability \([A-Za-z0-9_]*\).*/ (ATen \1)/p' "$f" | head -n 1)
    lab=$p; [ "$p" = alg ] && lab="cohort-$alg"
    line="$line $lab $k"
    line="${line%" "}$cap;"
  done
  envcmd=$plain_env line=${line%";"}
  echo "$line" >> "$tmp/isacheck"
  echo "bench_isa: $line" >&2
  for t in $threads; do
    for c in $cases; do
      parse_case "$c"
      flag=; [ "$mode" = eval ] && flag=--eval
      args="--arch $arch --channels $ch --size $size --batch $batch --threads $t --steps $steps --warmup $warm $flag"
      name="$arch $mode ${ch}x${size}x${size} b$batch"
      for p in $progs; do : > "$tmp/w.$p"; : > "$tmp/c.$p"; done
      r=1
      while [ $r -le "$rounds" ]; do
        for p in $progs; do
          f=$logdir/$isa.t$t.$arch.$mode.${ch}x$size.b$batch.$p.r$r
          # shellcheck disable=SC2086
          run_prog $p $args > "$f" 2>&1
          # shellcheck disable=SC2046
          set -- $(figures "$f")
          [ "$1" = fail ] && { echo "bench_isa: $p failed ($f); its last lines:" >&2; tail -n 3 "$f" >&2; }
          echo "$1" >> "$tmp/w.$p"; echo "$2" >> "$tmp/c.$p"
        done
        r=$((r + 1))
      done
      meds='' rl="$isa t$t $name:"
      for p in $progs; do
        meds="$meds $(median < "$tmp/w.$p") $(median < "$tmp/c.$p")"
        case $p in torch1) lab="torch $v1" ;; torch2) lab="torch $v2" ;; alg) lab="cohort $alg" ;; *) lab=$p ;; esac
        rl="$rl $lab $(tr '\n' ' ' < "$tmp/w.$p")[$(tr '\n' ' ' < "$tmp/c.$p" | sed 's/ $//')] /"
      done
      echo "$isa|$t|$name|$meds" >> "$tmp/rows"
      rl="${rl%" /"}; load $(cut -d' ' -f1 /proc/loadavg)"
      echo "$rl" >> "$tmp/rounds"
      done_est=$((done_est + rounds * $(est "$t")))
      now=$(date +%s) el=$((now - start))
      left=$(awk -v e="$el" -v d="$done_est" -v T="$total_est" 'BEGIN{printf "%.0f", (d > 0) ? e * (T - d) / d : 0}')
      echo "bench_isa: $rl  [elapsed $(hms $el), about $(hms "$left") left]" >&2
    done
  done
  echo "$isa: before $load_before, after $(cut -d' ' -f1-3 /proc/loadavg)" >> "$tmp/loads"
done
report
