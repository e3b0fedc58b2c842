#!/bin/bash
# cohort-pack (jobs/cohort-pack.c): the shards are the same bytes for any
# number of ranks; a pack killed mid-run and run again gives the same bytes;
# a plan for other input is refused; GNU tar reads the shards; training on
# packed Fashion-MNIST (data.format = shards) gives a bitwise-identical model
# to training on the IDX files (same order, same pixels). Prints TAP.
. "${COHORT_SRCDIR:-.}/tests/train_lib.sh"
need_data
PACK="$build/jobs/cohort-pack"
echo "1..22"
pack() { # pack NP OUT [options...]
  local np=$1 out=$2; shift 2
  "$MPIEXEC" -n "$np" "$PACK" --format idx "$DATA" --out "$out" --limit 2000 \
    --shard_bytes 300000 "$@" > "$out.log" 2>&1
}
same_shards() { # same_shards DIR1 DIR2: the same .tar files, byte for byte (the
  # indexes differ: they hold the files' mtimes)
  local a=$1 b=$2 f
  [ "$(cd "$a" && ls ./*.tar)" = "$(cd "$b" && ls ./*.tar)" ] || return 1
  for f in "$a"/*.tar; do cmp "$f" "$b/${f##*/}" || return 1; done
}

pack 1 "$tmp/p1" || show "$tmp/p1.log"
pack 3 "$tmp/p3" || show "$tmp/p3.log"
check "1 rank and 3 ranks write the same shards, byte for byte ($(ls "$tmp/p1" | grep -c '\.tar$') shards)" \
  same_shards "$tmp/p1" "$tmp/p3"
n=$(for f in "$tmp"/p1/*.tar; do tar -tf "$f"; done | wc -l)
check "GNU tar lists every member (2 x 2000, got $n)" test "$n" = 4000

# killed (SIGKILL, every rank) after the first round of shards, then run again
out="$tmp/kill"
new_hold round 1
COHORT_TEST_HOLD=$hold_env "$MPIEXEC" -n 2 "$PACK" --format idx "$DATA" --out "$out" --limit 2000 \
  --shard_bytes 300000 > "$out.log" 2>&1 &
pid=$!
hold_wait held 2 $pid
pgrep -f -- "--out $out " | while read -r p; do
  case "$(cat /proc/"$p"/comm 2>/dev/null)" in cohort-pack|lt-cohort-pack) kill -9 "$p" ;; esac
done
wait $pid
rc=$?
check "the killed pack left no index and 2 complete shards (exit $rc)" \
  test "$rc" != 0 -a ! -e "$out/cohort-shards.index" -a "$(ls "$out" | grep -c '\.tar$')" = 2
: > "$out/.shard-000003.tar.tmp.AbC123" # what a writer killed mid-shard leaves
pack 2 "$out" || show "$out.log"
check "run again, it keeps the 2 shards and writes the rest" grep -q "(14 written, 2 kept from an earlier run)" "$out.log"
check "killed + resumed == uninterrupted, byte for byte; no temp file left" \
  eval 'same_shards "$tmp/p1" "$out" && test ! -e "$out/.shard-000003.tar.tmp.AbC123"'
# a kept shard changed since it was written (bytes flipped in place, the
# index deleted as its stale-index message says): the next run writes it
# again instead of keeping it, and says nothing of success before
python3 -c "f=open('$out/shard-000000.tar','r+b');f.seek(512);b=f.read(8);f.seek(512);f.write(bytes(x^255 for x in b))"
rm -f "$out/cohort-shards.index"
pack 2 "$out" || show "$out.log"
check "a shard changed after it was written is written again (1 written, 15 kept)" \
  grep -q "(1 written, 15 kept from an earlier run)" "$out.log"
check "... and the shards are the uninterrupted pack's again, byte for byte" same_shards "$tmp/p1" "$out"
pack 1 "$out" --shard_bytes 400000
rc=$?
check "another plan into the same directory is refused (exit $rc == 2)" \
  eval 'test "$rc" = 2 && grep -q "holds shards of another pack" "$out.log"'

# an ImageFolder file that is neither JPEG nor PNG: exit 2 naming it, before any shard
mkdir -p "$tmp/badif/a" "$tmp/badif/b"
printf '\377\330\377\340' > "$tmp/badif/a/x.jpg"
printf 'BM......' > "$tmp/badif/b/y.bmp"
"$MPIEXEC" -n 2 "$PACK" "$tmp/badif" --out "$tmp/badout" > "$tmp/badout.log" 2>&1
rc=$?
check "a BMP in the ImageFolder: exit $rc == 2, one line naming it, no output directory" \
  eval 'test "$rc" = 2 && grep -q "b/y.bmp: neither JPEG nor PNG" "$tmp/badout.log" && test ! -e "$tmp/badout"'

# training: IDX (first 2000) vs the same samples packed
"$MPIEXEC" -n 1 "$PACK" --format idx --split test "$DATA" --out "$tmp/val" --limit 200 \
  > "$tmp/val.log" 2>&1 || show "$tmp/val.log"
args="--model.arch=smallcnn --train.eval=false --schedule.epochs=1 --train.batch_size=16"
train 2 "$tmp/t_idx" $args --data.train_subset=2000 || show "$tmp/t_idx.log"
train 2 "$tmp/t_sh" $args --data.format=shards --data.path="$tmp/p1" --data.val_path="$tmp/val" \
  || show "$tmp/t_sh.log"
check "training on the shards runs (2 ranks)" test -f "$tmp/t_sh/model-0.safetensors"
check "trained on packed Fashion-MNIST == trained on IDX (bitwise)" \
  "$STCMP" --bitwise "$tmp/t_sh/model-0.safetensors" "$tmp/t_idx/model-0.safetensors"
grep -q "built the index" "$tmp/t_sh.log" && not_ok "the training run found the pack's index" \
  || ok "the training run found the pack's index (no rebuild)"
# data.stage: the same model from the node-local copies, reused by a second run
train 2 "$tmp/t_st" $args --data.format=shards --data.path="$tmp/p1" --data.val_path="$tmp/val" \
  --data.stage="$tmp/stage" --data.stage_keep=true || show "$tmp/t_st.log"
check "staged (data.stage) == read in place (bitwise)" \
  "$STCMP" --bitwise "$tmp/t_st/model-0.safetensors" "$tmp/t_sh/model-0.safetensors"
check "data.stage_keep: the completed run left its copies, the staging time is in the profile" \
  eval 'ls "$tmp"/stage/p1-*/shard-000000.tar >/dev/null && grep -q "^  data staging " "$tmp/t_st.log"'
# another job holding the copies (a shared lock on the directory, as every
# staging rank takes): a completed run keeps them; once free, it removes them
lock=$(ls "$tmp"/stage/p1-*/.cohort-stage.lock)
flock -s -o "$lock" sleep 300 & holder=$! # -o: flock itself holds it, not the sleep
train 2 "$tmp/t_st2" $args --data.format=shards --data.path="$tmp/p1" --data.val_path="$tmp/val" \
  --data.stage="$tmp/stage" || show "$tmp/t_st2.log"
check "a second job on the node reuses the staged copies (0 MB copied)" \
  grep -q "data.stage: $tmp/p1 -> .*: 17 files, 0.0 MB copied" "$tmp/t_st2.log"
check "... and, another job holding them, keeps them at its end" \
  eval 'grep -q "is in use by another job: the staged copies are kept" "$tmp/t_st2.log" && ls "$tmp"/stage/p1-*/shard-000000.tar >/dev/null'
pkill -P "$holder" sleep 2>/dev/null; kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null
train 2 "$tmp/t_st3" $args --data.format=shards --data.path="$tmp/p1" --data.val_path="$tmp/val" \
  --data.stage="$tmp/stage" || show "$tmp/t_st3.log"
check "a completed run removes the staged copies when no job holds them" \
  eval 'grep -q "data.stage: removed the staged copies in .*(17 files" "$tmp/t_st3.log" && ! ls -d "$tmp"/stage/p1-* 2>/dev/null'
# data.order = shard_window: runs, and the same model for any number of loader workers
train 2 "$tmp/t_w1" $args --data.format=shards --data.path="$tmp/p1" --data.val_path="$tmp/val" \
  --data.order=shard_window --data.shard_window=2 || show "$tmp/t_w1.log"
"$MPIEXEC" -n 2 "$TRAIN" --output.dir="$tmp/t_w2" --data.workers=2 --train.threads=1 $args \
  --data.format=shards --data.path="$tmp/p1" --data.val_path="$tmp/val" --data.order=shard_window \
  --data.shard_window=2 > "$tmp/t_w2.log" 2>&1 || show "$tmp/t_w2.log"
check "shard_window order: the same model with 1 and 2 loader workers (bitwise), another than sampler order" \
  eval '"$STCMP" --bitwise "$tmp/t_w1/model-0.safetensors" "$tmp/t_w2/model-0.safetensors" && \
    ! "$STCMP" --bitwise "$tmp/t_w1/model-0.safetensors" "$tmp/t_sh/model-0.safetensors"'
"$MPIEXEC" -n 1 "$TRAIN" --output.dir="$tmp/t_bad" $args --data.order=shard_window > "$tmp/t_bad.log" 2>&1
rc=$?
check "data.order = shard_window with data.format = idx is a config error (exit $rc == 2)" \
  eval 'test "$rc" = 2 && grep -q "shard_window needs data.format = shards" "$tmp/t_bad.log"'
"$MPIEXEC" -n 1 "$TRAIN" --output.dir="$tmp/t_bad2" $args --data.stage_keep=true > "$tmp/t_bad2.log" 2>&1
rc=$?
check "data.stage_keep without data.stage is a config error (exit $rc == 2)" \
  eval 'test "$rc" = 2 && grep -q "data.stage_keep is set but data.stage is not" "$tmp/t_bad2.log"'


# ImageFolder (JPEG files, bytes copied unchanged) packed == unpacked, in training
py=${PYTHON3:-/usr/bin/python3}
if "$py" -c 'import PIL, numpy' 2>/dev/null; then
  "$py" "$src/tests/make_fmnist_imagefolder.py" "$tmp/if" --limit 300 > /dev/null
  "$MPIEXEC" -n 2 "$PACK" "$tmp/if" --out "$tmp/ifsh" --shard_bytes 100000 > "$tmp/ifsh.log" 2>&1 \
    || show "$tmp/ifsh.log"
  n=$(for f in "$tmp"/ifsh/*.tar; do tar -tf "$f"; done | grep -c '\.jpg$')
  check "the ImageFolder's 300 JPEG files are in the shards ($n)" test "$n" = 300
  args="--model.arch=smallcnn --train.eval=false --schedule.epochs=1 --train.batch_size=16 --data.image_size=28"
  train 2 "$tmp/t_if" $args --data.format=imagefolder --data.path="$tmp/if" --data.val_path="$tmp/if" \
    || show "$tmp/t_if.log"
  train 2 "$tmp/t_ifsh" $args --data.format=shards --data.path="$tmp/ifsh" --data.val_path="$tmp/ifsh" \
    || show "$tmp/t_ifsh.log"
  check "trained on the packed ImageFolder == trained on the ImageFolder (bitwise)" \
    "$STCMP" --bitwise "$tmp/t_ifsh/model-0.safetensors" "$tmp/t_if/model-0.safetensors"
else
  skip "ImageFolder packed" "no PIL/numpy for tests/make_fmnist_imagefolder.py"
  skip "ImageFolder packed == unpacked" "no PIL/numpy"
fi
