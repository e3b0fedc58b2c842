#!/bin/sh
# No oneDNN reference kernel on any ISA: one train step and one eval step of
# resnet18/34/50 (batch 2) at each input users run (1x28x28, 3x32x32,
# 3x224x224) under ONEDNN_MAX_CPU_ISA = SSE41, AVX2, AVX512_CORE and the
# native ISA, with DNNL_VERBOSE=1; a test point fails when any primitive the
# step runs is a reference implementation ("ref:" in the verbose line),
# naming it, or when cohort warned that it found none but a reference one.
# An ISA the machine lacks is a SKIP. (resnet34's convolutions are resnet18's
# shapes, repeated; it runs at 1x28x28 only, the quick start's input.)
# One more point per ISA: resnet18 at 3x56x56 with --conv-algorithm winograd
# (compute.cpu_conv_algorithm) runs oneDNN's Winograd kernels on AVX-512 and,
# below it, says once that there are none and runs the direct ones; no
# reference kernel either way.
# bf16 (compute.precision = bf16, bench_nn --precision bf16) under
# ONEDNN_MAX_CPU_ISA = AVX2, AVX512_CORE_BF16, AVX512_CORE_AMX and native:
# where the effective ISA has bf16, a resnet18 (1x28x28, 3x32x32,
# 3x224x224) and resnet50 (1x28x28) train and eval step run bf16
# convolutions (src_bf16 in DNNL_VERBOSE's lines) and no reference kernel
# (reorders and the bf16 matmul included); where it has none (AVX2),
# bench_nn refuses with exit 2 naming the ISA and tests/test_ops_bf16's
# refusal point passes (the context's first convolution fails, naming it).
# One more point per ISA: the activations and LayerNorm2d (tests/act_step:
# every activation as an op in each CPU layout and as a module in a train
# and an eval step) run oneDNN's eltwise kernels for all 8 algorithms cohort
# maps onto oneDNN (clip_v2, relu, swish, logistic, tanh, gelu_erf,
# gelu_tanh, hardswish), none of them a reference kernel (cohort would fall
# back to its C loop then, so a missing algorithm fails the point too).
. "${COHORT_SRCDIR:-.}/tests/train_lib.sh"   # TAP helpers (ok, not_ok, skip), $tmp, $build
BENCH="$build/tests/bench_nn"
ACT="$build/tests/act_step"
act_algs="clip_v2 relu swish logistic tanh gelu_erf gelu_tanh hardswish"
CONVPOOL="$build/tests/bench_convpool"
# And one per ISA for the convolution variants (tests/bench_convpool: depthwise,
# strided depthwise, grouped, dilated, dilated depthwise convolutions forward,
# backward data and backward weights, and the pooling variants, which are
# cohort's own C loops): no reference kernel. (oneDNN 2.6.3 here: jit
# kernels from AVX2 up, jit_dw for the depthwise ones; on SSE4.1, with plain
# activations, the gemm-based ones.)

cases="resnet18:1:28 resnet18:3:32 resnet18:3:224 resnet34:1:28 resnet50:1:28 resnet50:3:32
resnet50:3:224"
ncases=$(echo $cases | wc -w)
isas="SSE41 AVX2 AVX512_CORE native"
bf16_cases="resnet18:1:28 resnet18:3:32 resnet18:3:224 resnet50:1:28"
bf16_isas="AVX2 AVX512_CORE_BF16 AVX512_CORE_AMX native"
echo "1..$((4 * (2 * ncases + 4) + 4 * 9))"

# One test point from a DNNL_VERBOSE=1 run: exit status $1, name $2, log $3,
# program $4. Fails on a non-zero exit, on no convolution in the log (nothing
# checked), on a reference kernel ("ref" implementation) or on cohort's
# "only a reference" warning.
no_ref_kernel() {
  nconv=$(grep -c '^onednn_verbose,exec,cpu,convolution,' "$3")
  refs=$(grep '^onednn_verbose,exec,' "$3" | awk -F, '$5 ~ /^ref/' | cut -d, -f4-10 | sort -u)
  if [ "$1" != 0 ]; then
    tail -n 20 "$3" >&2
    not_ok "$2: $4 exit $1"
  elif [ "$nconv" = 0 ]; then
    not_ok "$2: no convolution in DNNL_VERBOSE's output (cannot check)"
  elif [ -n "$refs" ] || grep -q 'only a reference' "$3"; then
    echo "$refs" >&2
    grep 'only a reference' "$3" >&2
    not_ok "$2: reference kernel: $(echo "$refs" | head -n 1)"
  else
    ok "$2: $nconv convolutions, no reference kernel"
  fi
}

# effective ISA under a cap, as cohort reports it ("isa avx2")
effective() {
  if [ "$1" = native ]; then env -u ONEDNN_MAX_CPU_ISA "$BENCH" --batch 1 --steps 1 --warmup 0 --eval
  else ONEDNN_MAX_CPU_ISA=$1 "$BENCH" --batch 1 --steps 1 --warmup 0 --eval; fi 2>/dev/null |
    sed -n 's/.*(cpu runtime [^,]*, isa \([a-z0-9_]*\)).*/\1/p'
}

for isa in $isas; do
  eff=$(effective "$isa")
  want=$(echo "$isa" | tr 'A-Z' 'a-z')
  if [ -z "$eff" ]; then
    not_ok "$isa: bench_nn runs and reports its ISA"
    for c in $cases; do not_ok "$isa $c train: not run"; not_ok "$isa $c eval: not run"; done
    not_ok "$isa winograd: not run"
    not_ok "$isa activations: not run"
    not_ok "$isa convolution variants: not run"
    continue
  fi
  if [ "$isa" != native ] && [ "$eff" != "$want" ]; then
    skip "$isa: the machine's ISA is $eff" "no $isa on this CPU"
    for c in $cases; do skip "$isa $c train" "no $isa"; skip "$isa $c eval" "no $isa"; done
    skip "$isa winograd" "no $isa"
    skip "$isa activations" "no $isa"
    skip "$isa convolution variants" "no $isa"
    continue
  fi
  ok "$isa: oneDNN runs at ISA $eff"
  for c in $cases; do
    arch=${c%%:*}; rest=${c#*:}; ch=${rest%%:*}; size=${rest#*:}
    for mode in train eval; do
      flag=; [ "$mode" = eval ] && flag=--eval
      log="$tmp/$isa-$arch-$ch-$size-$mode.log"
      if [ "$isa" = native ]; then
        env -u ONEDNN_MAX_CPU_ISA DNNL_VERBOSE=1 "$BENCH" --arch "$arch" --channels "$ch" \
          --size "$size" --batch 2 --threads 2 --steps 1 --warmup 0 $flag > "$log" 2>&1
      else
        ONEDNN_MAX_CPU_ISA=$isa DNNL_VERBOSE=1 "$BENCH" --arch "$arch" --channels "$ch" \
          --size "$size" --batch 2 --threads 2 --steps 1 --warmup 0 $flag > "$log" 2>&1
      fi
      no_ref_kernel $? "$isa $arch ${ch}x${size}x${size} $mode" "$log" bench_nn
    done
  done
  log="$tmp/$isa-winograd.log"
  if [ "$isa" = native ]; then
    env -u ONEDNN_MAX_CPU_ISA DNNL_VERBOSE=1 "$BENCH" --arch resnet18 --channels 3 --size 56 \
      --batch 2 --threads 2 --steps 1 --warmup 0 --conv-algorithm winograd > "$log" 2>&1
  else
    ONEDNN_MAX_CPU_ISA=$isa DNNL_VERBOSE=1 "$BENCH" --arch resnet18 --channels 3 --size 56 \
      --batch 2 --threads 2 --steps 1 --warmup 0 --conv-algorithm winograd > "$log" 2>&1
  fi
  rc=$?
  nwino=$(grep '^onednn_verbose,exec,cpu,convolution,' "$log" | awk -F, '$5 ~ /wino/' | wc -l)
  said=$(sed -n 's/.*winograd primitives \([0-9]*\).*/\1/p' "$log")
  refs=$(grep '^onednn_verbose,exec,' "$log" | awk -F, '$5 ~ /^ref/' | cut -d, -f4-10 | sort -u)
  name="$isa resnet18 3x56x56 train, --conv-algorithm winograd"
  case $eff in avx512*) wants=yes ;; *) wants=no ;; esac
  if [ "$rc" != 0 ]; then
    tail -n 20 "$log" >&2
    not_ok "$name: bench_nn exit $rc"
  elif [ -n "$refs" ]; then
    not_ok "$name: reference kernel: $(echo "$refs" | head -n 1)"
  elif [ "$wants" = yes ] && { [ "$nwino" = 0 ] || [ "${said:-0}" = 0 ]; }; then
    not_ok "$name: no Winograd kernel ran on $eff ($nwino verbose lines, ${said:-?} counted)"
  elif [ "$wants" = no ] && { [ "$nwino" != 0 ] || [ "$(grep -c 'has no Winograd kernel' "$log")" != 1 ]; }; then
    not_ok "$name: on $eff expected the direct kernels and exactly one 'has no Winograd kernel' line ($(grep -c 'has no Winograd kernel' "$log"))"
  elif [ "$wants" = yes ]; then
    ok "$name: $nwino Winograd convolutions ($said primitives)"
  else
    ok "$name: no Winograd kernel on $eff, said so, direct kernels ran"
  fi
  log="$tmp/$isa-act.log"
  if [ "$isa" = native ]; then
    env -u ONEDNN_MAX_CPU_ISA DNNL_VERBOSE=1 "$ACT" > "$log" 2>&1
  else
    ONEDNN_MAX_CPU_ISA=$isa DNNL_VERBOSE=1 "$ACT" > "$log" 2>&1
  fi
  rc=$?
  name="$isa activations and LayerNorm2d"
  elt=$(grep '^onednn_verbose,exec,cpu,eltwise,' "$log")
  refs=$(grep '^onednn_verbose,exec,' "$log" | awk -F, '$5 ~ /^ref/' | cut -d, -f4-10 | sort -u)
  missing=
  for a in $act_algs; do
    echo "$elt" | grep -q ",alg:eltwise_$a " || missing="$missing $a"
  done
  if [ "$rc" != 0 ]; then
    tail -n 20 "$log" >&2
    not_ok "$name: act_step exit $rc"
  elif [ -n "$refs" ]; then
    not_ok "$name: reference kernel: $(echo "$refs" | head -n 1)"
  elif [ -n "$missing" ]; then
    not_ok "$name: no oneDNN eltwise kernel for:$missing (C fallback?)"
  else
    ok "$name: $(echo "$elt" | wc -l) oneDNN eltwise runs ($(echo "$elt" | cut -d, -f5 | sort -u | tr '\n' ' ')), no reference kernel"
  fi
  log="$tmp/$isa-convpool.log"
  if [ "$isa" = native ]; then
    env -u ONEDNN_MAX_CPU_ISA DNNL_VERBOSE=1 "$CONVPOOL" --batch 2 --threads 2 --trials 1 \
      > "$log" 2>&1
  else
    ONEDNN_MAX_CPU_ISA=$isa DNNL_VERBOSE=1 "$CONVPOOL" --batch 2 --threads 2 --trials 1 \
      > "$log" 2>&1
  fi
  no_ref_kernel $? "$isa convolution variants (depthwise, grouped, dilated) and pooling variants" \
    "$log" bench_convpool
done

for isa in $bf16_isas; do
  if [ "$isa" = native ]; then run() { env -u ONEDNN_MAX_CPU_ISA "$@"; }
  else run() { env ONEDNN_MAX_CPU_ISA=$isa "$@"; }; fi
  eff=$(effective "$isa")
  want=$(echo "$isa" | tr 'A-Z' 'a-z')
  if [ "$isa" != native ] && [ "$eff" != "$want" ]; then
    for n in 1 2 3 4 5 6 7 8 9; do skip "bf16 $isa point $n" "the machine's ISA is $eff"; done
    continue
  fi
  case $eff in
  avx512_core_bf16|avx512_core_amx)
    for c in $bf16_cases; do
      arch=${c%%:*}; rest=${c#*:}; ch=${rest%%:*}; size=${rest#*:}
      for mode in train eval; do
        flag=; [ "$mode" = eval ] && flag=--eval
        log="$tmp/bf16-$isa-$arch-$ch-$size-$mode.log"
        run DNNL_VERBOSE=1 "$BENCH" --arch "$arch" --channels "$ch" --size "$size" --batch 2 \
          --threads 2 --steps 1 --warmup 0 --precision bf16 $flag > "$log" 2>&1
        rc=$?
        name="bf16 $isa ($eff) $arch ${ch}x${size}x${size} $mode"
        if [ "$rc" = 0 ] && ! grep '^onednn_verbose,exec,cpu,convolution,' "$log" | grep -q 'src_bf16'; then
          not_ok "$name: no bf16 convolution in DNNL_VERBOSE's output"
        else
          no_ref_kernel $rc "$name" "$log" bench_nn
        fi
      done
    done
    skip "bf16 $isa refusal" "$eff has bf16"
    ;;
  *)
    log="$tmp/bf16-$isa-refuse.log"
    run "$BENCH" --batch 1 --steps 1 --warmup 0 --precision bf16 > "$log" 2>&1
    rc=$?
    if [ "$rc" = 2 ] && grep -q "compute.precision = bf16: this CPU's oneDNN ISA is $eff (no bf16 instructions); use fp32" "$log"; then
      ok "bf16 $isa: bench_nn --precision bf16 refused, exit 2, naming $eff"
    else
      cat "$log" >&2
      not_ok "bf16 $isa: bench_nn --precision bf16: exit $rc, expected 2 and the ISA line"
    fi
    run "$build/tests/test_ops_bf16" > "$tmp/bf16-$isa-ops.log" 2>&1
    rc=$?
    if [ "$rc" = 0 ] && grep -q '^ok [0-9]* - test_refusal$' "$tmp/bf16-$isa-ops.log"; then
      ok "bf16 $isa: a bf16 context's first convolution fails naming $eff (test_ops_bf16)"
    else
      cat "$tmp/bf16-$isa-ops.log" >&2
      not_ok "bf16 $isa: test_ops_bf16's refusal point (exit $rc)"
    fi
    for n in 3 4 5 6 7 8 9; do skip "bf16 $isa point $n" "$eff has no bf16"; done
    ;;
  esac
done
