#!/bin/sh
# cohort-train equivalence: W ranks with SyncBN and batch B per rank give the
# same parameters as 1 rank with batch W*B and lr W*base (same global
# batches, SEMANTICS.md); without SyncBN they differ by the per-rank batch
# statistics (the documented difference).
. "${COHORT_SRCDIR:-.}/tests/train_lib.sh"
need_data
echo "1..5"
small="--model.arch=smallcnn --data.train_subset=256 --train.eval=false --schedule.epochs=2"

# reference: 1 rank, global batch 32, lr 0.04 (= 0.01 x 4 ranks)
train 1 "$tmp/w1" $small --train.batch_size=32 --optimizer.lr=0.04 || show "$tmp/w1.log"
train 2 "$tmp/w2" $small --train.batch_size=16 --optimizer.lr=0.02 || show "$tmp/w2.log"
train 4 "$tmp/w4" $small --train.batch_size=8 --optimizer.lr=0.01 || show "$tmp/w4.log"
check "smallcnn SyncBN: 2 ranks x 16 == 1 rank x 32 after 16 steps (rtol 1e-4)" \
  "$STCMP" "$tmp/w2/model-1.safetensors" "$tmp/w1/model-1.safetensors" --rtol 1e-4
check "smallcnn SyncBN: 4 ranks x 8 == 1 rank x 32 after 16 steps (rtol 1e-4)" \
  "$STCMP" "$tmp/w4/model-1.safetensors" "$tmp/w1/model-1.safetensors" --rtol 1e-4

# without SyncBN each rank normalises with its own batch statistics: the
# result must differ from the 1-rank run (else SyncBN would be untested).
train 2 "$tmp/w2n" $small --train.batch_size=16 --optimizer.lr=0.02 --model.sync_bn=false \
  || show "$tmp/w2n.log"
"$STCMP" "$tmp/w2n/model-1.safetensors" "$tmp/w1/model-1.safetensors" --rtol 1e-3
rc=$?  # 1: compared and differs; 0: equal; 2: unreadable
if [ "$rc" = 1 ]; then
  ok "smallcnn without SyncBN differs from the 1-rank run (per-rank BN statistics)"
else
  not_ok "smallcnn without SyncBN differs from the 1-rank run (st_compare exit $rc)"
fi

# resnet18 (torchvision structure), a few steps
r18="--model.arch=resnet18 --data.train_subset=48 --train.eval=false --schedule.epochs=1"
train 1 "$tmp/r1" $r18 --train.batch_size=16 --optimizer.lr=0.02 || show "$tmp/r1.log"
train 2 "$tmp/r2" $r18 --train.batch_size=8 --optimizer.lr=0.01 || show "$tmp/r2.log"
check "resnet18 SyncBN: 2 ranks x 8 == 1 rank x 16 after 3 steps (rtol 1e-4)" \
  "$STCMP" "$tmp/r2/model-0.safetensors" "$tmp/r1/model-0.safetensors" --rtol 1e-4
check "running statistics and num_batches_tracked equal too" \
  "$STCMP" "$tmp/r2/model-0.safetensors" "$tmp/r1/model-0.safetensors" --rtol 1e-4 \
  --only-prefix layer4.1.bn2
