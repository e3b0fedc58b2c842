#!/bin/sh
# cohort-train data.mean = auto / data.std = auto: the per-channel mean and
# population std (ddof 0) of the first N Fashion-MNIST training images as
# ToTensor values (x / 255), computed across the ranks (W = 1 and 2), logged
# once, against numpy on the same images.
. "${COHORT_SRCDIR:-.}/tests/train_lib.sh"
need_data
PY=${PYTHON3:-/usr/bin/python3}
if ! "$PY" -c 'import numpy' 2>/dev/null; then echo "1..0 # SKIP numpy not found for $PY"; exit 0; fi
echo "1..5"
N=2000
ref=$("$PY" - "$DATA/train-images-idx3-ubyte.gz" "$N" <<'PYEOF'
import gzip, sys
import numpy as np
raw = gzip.open(sys.argv[1]).read()
n = int(sys.argv[2])
x = np.frombuffer(raw, np.uint8, offset=16)[: n * 784].astype(np.float64) / 255.0
print("%.9g %.9g" % (np.float32(x.mean()), np.float32(x.std())))
PYEOF
)
small="--model.arch=smallcnn --data.train_subset=$N --train.eval=false --schedule.epochs=1 --train.max_steps=2"
for np_ in 1 2; do
  out="$tmp/auto$np_"
  if train "$np_" "$out" $small --data.mean=auto --data.std=auto; then
    ok "W=$np_: cohort-train runs with data.mean = data.std = auto"
  else
    show "$out.log"; not_ok "W=$np_: cohort-train runs with data.mean = data.std = auto"
  fi
done
line1=$(grep "Normalize mean/std per channel" "$tmp/auto1.log")
line2=$(grep "Normalize mean/std per channel" "$tmp/auto2.log")
got1=$(echo "$line1" | sed -n 's/.*per channel \([^ ]*\) (.*/\1/p' | tr / ' ')
got2=$(echo "$line2" | sed -n 's/.*per channel \([^ ]*\) (.*/\1/p' | tr / ' ')
echo "# numpy: $ref; W=1: $got1; W=2: $got2" >&2
check "logged once (W=1 and W=2)" test "$(echo "$line1" | wc -l)" = 1 -a "$(echo "$line2" | wc -l)" = 1
check "W=1 mean/std equal numpy's float32-rounded values on the first $N images" \
  test -n "$got1" -a "$got1" = "$ref"
check "W=2 gives the same values as W=1" test -n "$got2" -a "$got2" = "$got1"
