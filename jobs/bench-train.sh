#!/bin/sh
# Training throughput of cohort-train vs PyTorch DDP on the same recipe,
# side by side in one session: Fashion-MNIST, batch 64 per rank, 2 ranks x 1
# thread, SGD momentum 0.9 / weight decay 0.005, no augmentation, SyncBN off
# on both (PyTorch 1.13's SyncBN is GPU-only), plus cohort with SyncBN on.
# Each configuration runs ROUNDS times, alternating; the figure is images/s
# over the steps after WARMUP (median over rounds).
#
#   jobs/bench-train.sh [ARCHS] [STEPS] [ROUNDS]     (run from the build tree)
#   defaults: "resnet18 resnet34" 60 3
set -u
archs=${1:-"resnet18 resnet34"}
steps=${2:-60}
rounds=${3:-3}
warmup=5
src=${COHORT_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}
py=${PYTHON3:-/usr/bin/python3}
tmp=$(mktemp -d /tmp/cohort-bench-train.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
subset=$((steps * 128))
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
# cohort's rate over steps warmup+1..steps from its cumulative progress lines
cohort_rate() {
  awk -v w=$warmup -v n=$steps '
    / step [0-9]+\/[0-9]+ / { split($4, s, "/"); for (i = 5; i < NF; i++) if ($(i + 1) == "img/s") ips[s[1]] = $i }
    END { tw = w * 128 / ips[w]; tn = n * 128 / ips[n]; printf "%.1f\n", (n - w) * 128 / (tn - tw) }' "$1"
}
share() {  # all-reduce wait mean / wall mean (and SyncBN's collectives), from the profile table
  awk '/all-reduce wait/ { a = $5 } /SyncBN comm/ { b += $6 } /total \(wall\)/ { w = $4 }
    END { printf "%.1f%%", 100 * a / w; if (b > 0) printf "+SyncBN-comm-%.1f%%", 100 * b / w; print "" }' "$1"
}
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "steps $steps (timed after $warmup), batch 64 x 2 ranks, rounds $rounds"
for arch in $archs; do
  : > "$tmp/pt" ; : > "$tmp/c" ; : > "$tmp/cs" ; : > "$tmp/share" ; : > "$tmp/shares"
  for r in $(seq "$rounds"); do
    "$py" "$src/tests/golden/ddp_pytorch.py" --out "$tmp/pt-$arch-$r" --world 2 --arch "$arch" \
      --steps "$steps" --batch 64 --subset "$subset" --lr 0.01 --warmup $warmup > "$tmp/pt.log" 2>&1
    sed -n 's/.*: \([0-9.]*\) images\/s.*/\1/p' "$tmp/pt.log" >> "$tmp/pt"
    for sb in false true; do
      mpiexec -n 2 jobs/cohort-train --model.arch="$arch" --data.train_subset="$subset" \
        --train.batch_size=64 --train.max_steps="$steps" --train.eval=false --schedule.epochs=1 \
        --model.sync_bn=$sb --train.log_every=1 --output.dir="$tmp/c$r" --data.workers=1 \
        --train.threads=1 > "$tmp/c.log" 2>&1
      if [ $sb = false ]; then cohort_rate "$tmp/c.log" >> "$tmp/c"; share "$tmp/c.log" >> "$tmp/share"
      else cohort_rate "$tmp/c.log" >> "$tmp/cs"; share "$tmp/c.log" >> "$tmp/shares"; fi
    done
  done
  p=$(median < "$tmp/pt"); c=$(median < "$tmp/c"); cs=$(median < "$tmp/cs")
  printf '%-9s PyTorch DDP %7.1f img/s [%s] | cohort %7.1f img/s [%s] ratio %.2f, all-reduce wait %s | cohort+SyncBN %7.1f img/s [%s] ratio %.2f, all-reduce wait %s\n' \
    "$arch" "$p" "$(tr '\n' ' ' < "$tmp/pt" | sed 's/ $//')" "$c" "$(tr '\n' ' ' < "$tmp/c" | sed 's/ $//')" \
    "$(awk -v a="$c" -v b="$p" 'BEGIN { print a / b }')" "$(median < "$tmp/share" 2>/dev/null | head -1)" \
    "$cs" "$(tr '\n' ' ' < "$tmp/cs" | sed 's/ $//')" "$(awk -v a="$cs" -v b="$p" 'BEGIN { print a / b }')" \
    "$(sort "$tmp/shares" | sed -n 2p)"
done
