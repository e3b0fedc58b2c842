#!/bin/sh
# cohort-train reports bad input before training starts: unwritable output
# directory, missing data, bad config (unknown key, wrong type, out of
# range), a mismatched pretrained file, and the "rank 0 of 1" launch
# mismatch. Each exits non-zero with a message naming the culprit and
# without a single training step.
. "${COHORT_SRCDIR:-.}/tests/train_lib.sh"
need_data
echo "1..16"
small="--model.arch=smallcnn --data.train_subset=256 --train.eval=false --schedule.epochs=1"

# expect_error NAME NEEDLE NP ARGS...: non-zero exit, NEEDLE in the output, no step run
expect_error() {
  local name=$1 needle=$2 np=$3; shift 3
  local out="$tmp/e$((tap_n + 1))"
  "$MPIEXEC" -n "$np" "$TRAIN" --output.dir="$out" "$@" > "$out.log" 2>&1
  local rc=$?
  if [ "$rc" != 0 ] && grep -q -- "$needle" "$out.log" && ! grep -q "^epoch 0" "$out.log"; then
    ok "$name (exit $rc)"
  else
    show "$out.log"
    not_ok "$name (exit $rc, wanted a message with '$needle')"
  fi
}

expect_error "unwritable output directory" "output.dir" 2 $small --output.dir=/proc/cohort-no-such-dir
expect_error "missing data directory names the path" "/nonexistent/fmnist" 2 $small \
  --data.path=/nonexistent/fmnist
cat > "$tmp/typo.cfg" <<'CFG'
optimizer: {
  lr = 0.01;
  momentun = 0.9;
};
CFG
expect_error "unknown key in the config file names file, line and key" "typo.cfg:3" 2 \
  --config "$tmp/typo.cfg" $small
check "... in one line" test "$(grep -c 'momentun' "$tmp/e3.log")" = 1
cat > "$tmp/type.cfg" <<'CFG'
train: { batch_size = "sixty-four"; };
CFG
expect_error "wrong type names the key" "train.batch_size" 2 --config "$tmp/type.cfg" $small
expect_error "out-of-range override names the key and range" "schedule.lrf" 2 $small \
  --schedule.lrf=1.5
# bf16 on a CPU rank whose oneDNN ISA has none (capped to AVX2; the older
# key compute.bf16 means compute.precision = bf16), an unknown algorithm search
export ONEDNN_MAX_CPU_ISA=AVX2
expect_error "compute.bf16 on a CPU rank without bf16 names compute.precision and the ISA" \
  "compute.precision = bf16: this CPU's oneDNN ISA is avx2" 2 $small --compute.bf16=true
unset ONEDNN_MAX_CPU_ISA
expect_error "unknown compute.conv_search names the key and the choices" "heuristics, timed" 2 \
  $small --compute.conv_search=fast
# a smallcnn state dict is not a resnet18 one
train 2 "$tmp/small" $small --data.fast_decode=true || show "$tmp/small.log"
check "data.fast_decode with IDX data: one warning line (rank 0 only) that it has no effect" \
  test "$(grep -c 'data.fast_decode = true has no effect with data.format = idx' "$tmp/small.log")" = 1
expect_error "mismatched pretrained file is reported" "no tensor matching" 2 \
  --model.arch=resnet18 --model.weights="$tmp/small/model-0.safetensors" \
  --data.train_subset=256 --train.eval=false
expect_error "garbage pretrained file names the file" "$tmp/typo.cfg" 2 $small \
  --model.weights="$tmp/typo.cfg"
# bad input found after the run directory was made: the directory the run
# made (holding only its lock) is removed again, not left behind
left=$(for d in "$tmp"/e[0-9]*; do [ -d "$d" ] && echo "${d##*/}"; done)
check "no run directory left behind by a bad-input exit${left:+ (left: $left)}" test -z "$left"
# user-facing lines carry no source location; COHORT_LOG_LEVEL=debug adds it
check "error lines name no source file (file.c:line)" \
  sh -c "! grep -E '[a-z_]+\.(c|cu):[0-9]+\)' '$tmp/e11.log' '$tmp/e10.log' '$tmp/e3.log' '$tmp/e2.log'"
COHORT_LOG_LEVEL=debug "$MPIEXEC" -n 1 "$TRAIN" --output.dir="$tmp/dbg" $small \
  --model.weights="$tmp/typo.cfg" > "$tmp/dbg.log" 2>&1
check "... at COHORT_LOG_LEVEL=debug they do" grep -q -E '\.c:[0-9]+\)' "$tmp/dbg.log"
# srun --mpi=none: every process believes it is rank 0 of 1
SLURM_PROCID=1 SLURM_NTASKS=4 SLURM_STEP_NUM_TASKS=4 SLURM_LOCALID=1 "$TRAIN" $small \
  --output.dir="$tmp/mm" > "$tmp/mm.log" 2>&1
rc=$?
if [ "$rc" != 0 ] && grep -q "4" "$tmp/mm.log" && grep -qi "mpi" "$tmp/mm.log"; then
  ok "launcher says 4 tasks, MPI says 1: stops at once naming both (exit $rc)"
else
  show "$tmp/mm.log"; not_ok "launch mismatch (exit $rc)"
fi
# a diverging run: every rank stops at the same step with the step named
out="$tmp/nan"
"$MPIEXEC" -n 2 "$TRAIN" --output.dir="$out" --model.arch=smallcnn --data.train_subset=512 \
  --train.batch_size=16 --optimizer.lr=1000 --train.eval=false --schedule.epochs=1 \
  --data.workers=1 > "$out.log" 2>&1
rc=$?
if [ "$rc" = 1 ] && grep -q "non-finite loss .* at epoch 0, step [0-9]* of 16" "$out.log"; then
  ok "a non-finite loss stops every rank, naming epoch and step (exit $rc)"
else
  show "$out.log"; not_ok "non-finite loss (exit $rc)"
fi
