# shellcheck shell=bash
# cohort: shell helpers for the Slurm tests (sourced by tests/test_slurm*.sh).
# TAP output, skip rules, test clusters that are always torn down, and job
# polling through `scontrol show job` (sbatch --wait polls too slowly).

srcdir=${COHORT_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}
builddir=${COHORT_BUILDDIR:-$(pwd)}
testcluster=$srcdir/slurm/testcluster
rank_prog=$builddir/tests/test_slurm_rank

tap_n=0
tap_failed=0
clusters=()
workdirs=()

ok() {      # ok CONDITION-STATUS DESCRIPTION
    tap_n=$((tap_n + 1))
    if [ "$1" = 0 ]; then
        echo "ok $tap_n - $2"
    else
        echo "not ok $tap_n - $2"
        tap_failed=$((tap_failed + 1))
    fi
}
diag() { sed 's/^/# /'; }

# Print "1..0 # SKIP reason" and exit if Slurm cannot run here.
slurm_skip_unless_available() {
    local t missing=
    for t in slurmctld slurmd munged mungekey srun sbatch scontrol; do
        command -v "$t" >/dev/null 2>&1 || missing="$missing $t"
    done
    if [ -n "$missing" ]; then
        echo "1..0 # SKIP slurm not installed (missing:$missing; Debian: slurm-wlm munge)"
        exit 0
    fi
    if [ "$(id -u)" != 0 ]; then
        echo "1..0 # SKIP slurm test cluster needs root (slurmctld/slurmd run as SlurmUser=root)"
        exit 0
    fi
    if [ ! -x "$rank_prog" ]; then
        echo "Bail out! $rank_prog not built"
        exit 1
    fi
}

# After a failure, show a cluster's daemon logs before they are removed.
dump_logs() {
    local f
    [ "$tap_failed" != 0 ] || return 0
    for f in "$1"/log/*.log; do
        [ -f "$f" ] || continue
        echo "---- last lines of $f"
        tail -n 40 "$f"
    done | diag
}

cleanup() {
    local d
    for d in "${clusters[@]}"; do
        dump_logs "$d"
        "$testcluster" down "$d" >/dev/null 2>&1 || echo "# teardown of $d failed" >&2
    done
    clusters=()
    for d in "${workdirs[@]}"; do rm -rf -- "$d"; done
    workdirs=()
}
finish() {
    cleanup
    echo "1..$tap_n"
    [ "$tap_failed" = 0 ]
}
trap 'cleanup; exit 130' INT TERM
trap 'cleanup' EXIT

# cluster_up VAR ARGS...: bring up a cluster in a fresh short temp dir, export
# SLURM_CONF for it, store the dir in VAR. Returns the status of `up`.
cluster_up() {
    local var=$1 dir rc out
    shift
    dir=$(mktemp -d /tmp/chtc.XXXXXX) || return 1
    rmdir "$dir"              # `up` creates it (a name reserved for a moment)
    clusters+=("$dir")
    out=$("$testcluster" up "$dir" "$@" 2>"$dir.err")
    rc=$?
    diag <"$dir.err"
    rm -f "$dir.err"
    if [ $rc = 0 ]; then
        eval "$out"
    fi
    printf -v "$var" '%s' "$dir"
    return $rc
}

# cluster_down DIR: tear down now (and forget it for the trap).
cluster_down() {
    local d keep=()
    dump_logs "$1"
    "$testcluster" down "$1" >/dev/null
    local rc=$?
    for d in "${clusters[@]}"; do [ "$d" = "$1" ] || keep+=("$d"); done
    clusters=("${keep[@]}")
    return $rc
}

# make_workdir VAR: a fresh working directory for job scripts and output,
# removed at exit, stored in VAR.
make_workdir() {
    local d
    d=$(mktemp -d /tmp/chtw.XXXXXX) || exit 1
    workdirs+=("$d")
    printf -v "$1" '%s' "$d"
}

# job_field JOBID FIELD: one field of `scontrol show job` (e.g. JobState).
job_field() {
    scontrol -o show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

# wait_job_state JOBID SECONDS STATE...: poll until the job is in one of the
# states; returns 1 on timeout (the last state is in $job_state).
wait_job_state() {
    local id=$1 limit=$2 t0=$SECONDS s
    shift 2
    while :; do
        job_state=$(job_field "$id" JobState)
        for s in "$@"; do [ "$job_state" = "$s" ] && return 0; done
        [ $((SECONDS - t0)) -ge "$limit" ] && return 1
        sleep 0.2
    done
}

# wait_file_line FILE PATTERN SECONDS: poll until a line of FILE matches.
wait_file_line() {
    local t0=$SECONDS
    while ! grep -q -- "$2" "$1" 2>/dev/null; do
        [ $((SECONDS - t0)) -ge "$3" ] && return 1
        sleep 0.2
    done
}

# submit ARGS...: sbatch --parsable; prints the job id.
submit() {
    sbatch --parsable "$@" | cut -d';' -f1
}
