# shellcheck shell=bash
# cohort: helpers for the tests that run jobs/cohort-train on the local Slurm
# test cluster (sourced by tests/test_slurm_train*.sh after
# tests/test_slurm_lib.sh). Reference runs use mpiexec on this machine, outside
# Slurm; results are compared with tests/st_compare.

train_prog=$builddir/jobs/cohort-train
stcmp=$builddir/tests/st_compare
train_data=/usr/share/datasets/fashion-mnist
MPIEXEC=${MPIEXEC:-mpiexec}

# SKIP (visibly) without the data set; bail out if the programs are missing.
train_skip_unless_ready() {
    if [ ! -r "$train_data/train-images-idx3-ubyte.gz" ]; then
        echo "1..0 # SKIP Fashion-MNIST not installed in $train_data (Debian: dataset-fashion-mnist)"
        exit 0
    fi
    if [ ! -x "$train_prog" ] || [ ! -x "$stcmp" ]; then
        echo "Bail out! $train_prog or $stcmp not built"
        exit 1
    fi
}

# write_cfg FILE TRAIN_SUBSET TEST_SUBSET EPOCHS: a cohort-train config for
# the fast test model on a Fashion-MNIST subset, batch 16 per rank.
write_cfg() {
    cat >"$1" <<EOF
# cohort-train on a small Fashion-MNIST subset (tests/test_slurm_train*.sh)
model = { arch = "smallcnn"; };
data = { train_subset = $2; test_subset = $3; workers = 1; };
train = { batch_size = 16; };
schedule = { epochs = $4; };
EOF
}

# ref_run NP CONFIG OUTDIR [overrides...]: the same job with mpiexec on this
# machine, one thread per rank as the templates give it; log in OUTDIR.log.
ref_run() {
    local np=$1 cfg=$2 out=$3
    shift 3
    "$MPIEXEC" -n "$np" "$train_prog" --config "$cfg" --set train.threads=1 \
        --set output.dir="$out" "$@" >"$out.log" 2>&1
    local rc=$?
    [ $rc = 0 ] || { echo "reference run $out failed ($rc):"; tail -n 20 "$out.log"; } | diag
    return $rc
}

# same_model A B: the two safetensors files hold bit-identical tensors.
same_model() {
    local out rc
    out=$("$stcmp" --bitwise "$1" "$2" 2>&1)
    rc=$?
    echo "st_compare --bitwise $1 $2: $out" | diag
    return $rc
}

# run_train_template TEMPLATE CONFIG [SBATCH OPTIONS...] [-- JOB OVERRIDES...]:
# submit a template with cohort-train as COHORT_BIN from the current
# directory and wait (<= 180 s) for the end. Sets jid, job_state, outfile and
# rundir (the template's RUN_DIR).
run_train_template() {
    local t=$1 cfg=$2 opts=() name
    shift 2
    while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    jid=$(COHORT_BIN=$train_prog COHORT_LOG_LEVEL=debug \
          submit "${opts[@]}" "$srcdir/slurm/$t.sbatch" "$cfg" "$@")
    wait_job_state "$jid" 180 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY
    name=$(job_field "$jid" JobName)
    outfile=$PWD/$name-$jid.out
    rundir=$PWD/runs/$name-$jid
    grep -v '^ ' "$outfile" 2>/dev/null | diag
}

# identities FILE: from cohort-train's debug identity lines, one line per
# rank "RANK of WORLD on NODE procid P ntasks N", sorted by rank.
identities() {
    sed -n 's/.*debug: identity: MPI: rank \([0-9]*\) of \([0-9]*\),.*; node \([^;]*\); SLURM_PROCID \([0-9-]*\), SLURM_NTASKS \([0-9-]*\)$/\1 of \2 on \3 procid \4 ntasks \5/p' "$1" |
        sort -n
}

# cosine_lr BASE EPOCH EPOCHS LRF: the learning rate of the seed recipe's
# LambdaLR, BASE * ((1 - cos(pi * e / E)) / 2 * (lrf - 1) + 1).
cosine_lr() {
    awk -v b="$1" -v e="$2" -v n="$3" -v f="$4" \
        'BEGIN { printf "%.10g\n", b * ((1 - cos(3.141592653589793 * e / n)) / 2 * (f - 1) + 1) }'
}

# close_to X Y RTOL: |X - Y| <= RTOL * |Y|
close_to() {
    awk -v x="$1" -v y="$2" -v r="$3" \
        'BEGIN { d = x - y; if (d < 0) d = -d; a = y < 0 ? -y : y; exit !(d <= r * a) }'
}

# Holding a job where a case needs it (COHORT_TEST_HOLD, see ch_job_test_hold
# in framework/runtime/job.h): the ranks themselves wait at a named point
# (cohort-train: "step:G", after global step G, before that step's stop
# check; "epoch:E", after epoch E's model and resume files), so "the job is
# still running there" holds however fast the machine, and a signal that
# arrives during the hold is acted on at the point's next stop check.
#
# new_hold KIND N: a fresh hold directory; sets hold (its path) and
# hold_env (COHORT_TEST_HOLD's value) for the job's environment.
hold_seq=0
new_hold() {
    hold_seq=$((hold_seq + 1))
    hold=$PWD/hold-$hold_seq
    rm -rf "$hold" && mkdir -p "$hold"
    hold_env=$1:$2:$hold
}

# hold_wait WHAT SECONDS: wait until both ranks have written $hold/WHAT.0
# and $hold/WHAT.1 (WHAT: held, or signal for a preemption signal received
# while held); 1 (and a diag line) after SECONDS.
hold_wait() {
    local t0=$SECONDS
    until [ -e "$hold/$1.0" ] && [ -e "$hold/$1.1" ]; do
        if [ $((SECONDS - t0)) -ge "$2" ]; then
            echo "no $1.0 and $1.1 in $hold after $2 s: $(ls "$hold" | tr '\n' ' ')" | diag
            return 1
        fi
        sleep 0.05
    done
    [ "$1" = signal ] && echo "signal received while held: rank 0 $(cat "$hold/signal.0"), rank 1 $(cat "$hold/signal.1")" | diag
    return 0
}

# hold_release: let the held ranks go on.
hold_release() {
    : >"$hold/release"
}

# epochs_once CSV EPOCHS: the metrics file has exactly one row for each epoch
# 0..EPOCHS-1, in order.
epochs_once() {
    [ "$(cut -d, -f1 "$1" 2>/dev/null | tail -n +2 | tr '\n' ' ')" = "$(seq -s ' ' 0 $(($2 - 1))) " ]
}

# tensorboard_once RUNDIR: TensorBoard (EventAccumulator, as `tensorboard
# --logdir` merges a directory's event files) shows one point per epoch for
# every column of RUNDIR/metrics.csv, with the CSV's values (to 1e-6 relative:
# the CSV's decimal text of a float may round 1 float32 ulp off). Exit 77 when the
# tensorboard package is missing.
tensorboard_once() {
    "${PYTHON3:-/usr/bin/python3}" - "$1" <<'PY'
import csv, struct, sys
try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError:
    sys.exit(77)
rows = list(csv.DictReader(open(sys.argv[1] + "/metrics.csv")))
ea = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
ea.Reload()
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
bad = 0
for col in [c for c in rows[0] if c not in ("epoch", "step", "wall_time")]:
    got = [(e.step, e.value) for e in ea.Scalars(col)]
    want = [(int(r["epoch"]), f32(float(r[col]))) for r in rows]
    if [s for s, _ in got] != [s for s, _ in want] or any(
            not (abs(a - b) <= 1e-6 * max(abs(a), abs(b)) or (a != a and b != b))
            for (_, a), (_, b) in zip(got, want)):
        print(f"{col}: TensorBoard {got} vs metrics.csv {want}")
        bad = 1
sys.exit(bad)
PY
}
