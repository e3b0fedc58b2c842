#!/bin/bash
# cohort device check (issue #7): build the GPU backend on a machine with one
# GPU, run the GPU tests, a few cohort-train steps, the training benchmark
# next to PyTorch and the NCCL 1-GPU all-reduce, and print a table last.
#
# Two phases (docs/gpu.md):
#
#   tests/gpu/device-check.sh prepare [OUTDIR]     on a Debian 12 machine with apt
#       OUTDIR (default .devcheck/bundle in the repository) receives:
#       debs/           the Debian 12 .debs the build and run need that the GPU
#                       machine lacks (MPICH + mpiexec, libconfig, zlib, jansson,
#                       libjpeg-turbo, libpng, oneDNN, cmocka, pkgconf, make),
#                       fetched with apt-get download
#       autogen.tar.gz  configure, Makefile.in & co. made here by autoreconf (the
#                       GPU machine has no autotools), with autogen.sum, the
#                       checksum of configure.ac and every *.am they came from
#       fashion-mnist/  a subset of Debian's dataset-fashion-mnist (the first
#                       10000 training and 2000 test images, same IDX format)
#                       for a few cohort-train steps, when the dataset is installed
#       MANIFEST        package versions and sizes
#     It fails when the bundle plus the repository's tracked files exceed 64 MiB
#     (what the device machine accepts).
#
#   tests/gpu/device-check.sh run [BUNDLE]         on the GPU machine, in the repo root
#       BUNDLE defaults to .devcheck/bundle. Unpacks the .debs with dpkg -x into
#       .devcheck/run/prefix, finds CUDA (nvcc on PATH or /usr/local/cuda) and
#       cuDNN / cuBLAS / NCCL (the toolkit, /usr, or PyTorch's pip packages
#       nvidia/*), configures out of tree in .devcheck/run/build against the
#       prefix only, builds libcohort, the GPU tests, cohort-train, cohort-bench
#       and the benchmark with -j$(nproc), then runs, most wanted first (a run
#       cut short by the budget loses the least):
#         tests/test_cuda_kernels, tests/gpu/test_gpu_ops (every op vs the CPU,
#         fp32 / TF32 / bf16), tests/gpu/test_gpu_nccl (1 rank, mpiexec -n 2);
#         cohort-bench --backend nccl (1 GPU all-reduce, sizes 1M..256M);
#         the reduced benchmark: tests/gpu/bench_gpu_train (cohort) and
#         tests/gpu/bench_gpu_train.py (PyTorch) for resnet18 and resnet50,
#         batch 128, 224x224, fp32 / TF32 / bf16;
#         tests/gpu/test_gpu_train (a resnet18 step GPU vs CPU),
#         tests/gpu/test_gpu_train_job.sh (cohort-train GPU vs CPU, resume, bf16),
#         cohort-train on the Fashion-MNIST subset (a few steps);
#         the rest of the benchmark (resnet34).
#       A GPU test that fails is run again at once with CUDA_LAUNCH_BLOCKING=1
#       (stage NAME-blocking), so a kernel fault is reported by the launch
#       that made it. Every stage has a timeout fitted into a total of
#       DEVCHECK_BUDGET seconds (default 470: with the machine's start, a
#       rerun still fits the 15 device minutes); a failing stage prints the
#       end of its log at once; the table comes last. Logs go to
#       .devcheck/run/logs, and to $OUT/devcheck-logs.tar.gz when $OUT is set.
#       DEVCHECK_ONLY="STAGE ..." runs only those test/benchmark stages
#       (test_cuda_kernels test_gpu_ops test_gpu_nccl test_gpu_nccl-np2 nccl
#       bench test_gpu_train test_gpu_train_job cohort-train bench-34),
#       reusing the configured build a previous run left on a warm machine.
#       Exit status: 0 when every stage that ran passed, 1 otherwise.
#
# The device machine (tool `run`) takes the working tree plus at most 8
# carried ignored paths, 64 MiB in all:
#   run(command="bash tests/gpu/device-check.sh run", carry=[".devcheck/bundle"],
#       timeout_s=510)
# and, after a fix, on the still warm machine:
#   run(command="DEVCHECK_ONLY='test_gpu_ops' bash tests/gpu/device-check.sh run",
#       carry=[".devcheck/bundle"], timeout_s=240)
set -u -o pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LIMIT_BYTES=$((64 * 1024 * 1024))

# Debian 12 packages: runtime libraries, their -dev packages and tools.
# libmpich12 needs libhwloc15 and libucx0 (libucp/libucs/libuct/libucm, which
# need libnuma1); mpiexec.hydra (package mpich) needs libslurm38; oneDNN needs
# libgomp1 and an OpenCL loader. libudev1, libgomp1, zlib1g, libnuma1 and the
# OpenCL loader are dropped again at run time when the machine has its own.
DEBS_RUNTIME="libmpich12 mpich libhwloc15 libucx0 libnuma1 libudev1 libslurm38
  ocl-icd-libopencl1 libconfig9 zlib1g libjansson4 libjpeg62-turbo libpng16-16
  libdnnl2 libgomp1 libcmocka0"
DEBS_DEV="libmpich-dev libconfig-dev zlib1g-dev libjansson-dev libjpeg62-turbo-dev
  libpng-dev libdnnl-dev libcmocka-dev"
DEBS_TOOLS="pkgconf pkgconf-bin libpkgconf3 make"
# sonames the machine's own copy is preferred for (ABI-stable, often newer)
SYSTEM_FIRST="libudev.so.1 libgomp.so.1 libz.so.1 libnuma.so.1 libOpenCL.so.1"

die() { echo "device-check: error: $*" >&2; FAILED=1; exit 1; }
note() { echo "device-check: $*" >&2; }

usage() {
    awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"
}

# checksum of what the generated autotools files depend on
autogen_sum() {
    (cd "$1" && { echo configure.ac; find . -name '*.am' -not -path './.devcheck/*' \
        -not -path './.git/*' | sed 's|^\./||' | LC_ALL=C sort; } |
        while read -r f; do printf '%s\n' "$f"; cat "$f"; done | sha256sum | cut -d' ' -f1)
}

tree_bytes() {
    if git -C "$SRC" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        # tracked files and untracked files git does not ignore: what travels
        (cd "$SRC" && git ls-files -z --cached --others --exclude-standard |
            xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
    else
        du -sb --exclude=.devcheck "$SRC" | cut -f1
    fi
}

# ======================================================================= prepare
prepare() {
    local out=${1:-$SRC/.devcheck/bundle}
    for t in apt-get dpkg-deb python3 autoreconf sha256sum; do
        command -v "$t" >/dev/null || die "prepare needs $t (run it on a Debian 12 machine with apt)"
    done
    grep -q 'VERSION_ID="12"' /etc/os-release 2>/dev/null ||
        note "warning: this is not Debian 12; the .debs fetched are this distribution's"
    mkdir -p "$out" || die "cannot create $out"
    out=$(cd "$out" && pwd)
    rm -rf "$out/debs" "$out/fashion-mnist" "$out/autogen.tar.gz" "$out/autogen.sum" "$out/MANIFEST"
    mkdir -p "$out/debs"

    note "fetching .debs into $out/debs"
    # shellcheck disable=SC2086
    (cd "$out/debs" && apt-get download $DEBS_RUNTIME $DEBS_DEV $DEBS_TOOLS) \
        >"$out/apt.log" 2>&1 || { cat "$out/apt.log" >&2; die "apt-get download failed (log above)"; }
    local missing=""
    for p in $DEBS_RUNTIME $DEBS_DEV $DEBS_TOOLS; do
        ls "$out/debs/${p}_"*.deb >/dev/null 2>&1 || missing="$missing $p"
    done
    [ -z "$missing" ] || die "packages not downloaded:$missing"
    rm -f "$out/apt.log"

    note "generating configure / Makefile.in (autoreconf) from a clean copy"
    local tmp
    tmp=$(mktemp -d /tmp/devcheck-autogen.XXXXXX) || die "mktemp failed"
    if git -C "$SRC" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        (cd "$SRC" && git ls-files -z --cached --others --exclude-standard |
            xargs -0 cp --parents -t "$tmp") || die "copying the tree to $tmp failed"
    else
        (cd "$SRC" && tar --exclude=./.devcheck -cf - .) | (cd "$tmp" && tar xf -) ||
            die "copying the tree to $tmp failed"
    fi
    (cd "$tmp" && ./autogen.sh) >"$tmp/autogen.log" 2>&1 ||
        { tail -30 "$tmp/autogen.log" >&2; die "autogen.sh failed"; }
    (cd "$tmp" && find . -name Makefile.in -o -name configure -o -name aclocal.m4 \
        -o -name config.h.in | grep -v autom4te.cache | sed 's|^\./||' >"$tmp/.gen" &&
        ls build-aux/* m4/* >>"$tmp/.gen" &&
        tar czf "$out/autogen.tar.gz" -T "$tmp/.gen") || die "packing the generated files failed"
    autogen_sum "$tmp" >"$out/autogen.sum"
    rm -rf "$tmp"

    local fm=/usr/share/datasets/fashion-mnist
    if [ -f "$fm/train-images-idx3-ubyte.gz" ]; then
        note "writing a Fashion-MNIST subset (10000 train / 2000 test images) from $fm"
        mkdir -p "$out/fashion-mnist"
        python3 - "$fm" "$out/fashion-mnist" <<'PY' || die "making the Fashion-MNIST subset failed"
import gzip, struct, sys
src, dst = sys.argv[1], sys.argv[2]
for prefix, n in (("train", 10000), ("t10k", 2000)):
    for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
        name = "%s-%s.gz" % (prefix, kind)
        with gzip.open("%s/%s" % (src, name), "rb") as f:
            data = f.read()
        magic, count = struct.unpack(">II", data[:8])
        ndim = magic & 0xFF
        dims = struct.unpack(">%dI" % (ndim - 1), data[8:4 + 4 * ndim]) if ndim > 1 else ()
        item = 1
        for d in dims:
            item *= d
        head = 4 + 4 * ndim
        assert count >= n, (name, count)
        out = struct.pack(">II", magic, n) + data[8:head] + data[head:head + n * item]
        with gzip.open("%s/%s" % (dst, name), "wb", compresslevel=9) as f:
            f.write(out)
PY
    else
        note "no $fm (Debian package dataset-fashion-mnist): the cohort-train stage will be skipped"
    fi

    {
        echo "# cohort device-check bundle, made $(date -u +%FT%TZ) on $(. /etc/os-release; echo "$PRETTY_NAME")"
        echo "# package version bytes"
        for f in "$out"/debs/*.deb; do
            echo "$(dpkg-deb -f "$f" Package) $(dpkg-deb -f "$f" Version) $(stat -c %s "$f")"
        done
    } >"$out/MANIFEST"

    local bb tb
    bb=$(du -sb "$out" | cut -f1)
    tb=$(tree_bytes)
    awk -v o="$out" -v b="$bb" -v d="$(du -sb "$out/debs" | cut -f1)" -v t="$tb" 'BEGIN {
        printf "device-check: bundle %s: %.1f MiB (debs %.1f MiB); repository files %.1f MiB; together %.1f MiB of 64 MiB\n",
            o, b / 1048576, d / 1048576, t / 1048576, (b + t) / 1048576 }'
    [ $((bb + tb)) -lt $LIMIT_BYTES ] || die "bundle + repository exceed 64 MiB"
    case "$out" in
    "$SRC"/*) local rel=${out#"$SRC"/}
        git -C "$SRC" check-ignore -q "$rel" 2>/dev/null ||
            note "warning: $rel is not ignored by git; it must be ignored to be passed in carry"
        echo "device-check: on the GPU machine: run(command=\"bash tests/gpu/device-check.sh run $rel\", carry=[\"$rel\"], timeout_s=510)" ;;
    *) note "the bundle is outside the repository: copy it to an ignored folder in it (e.g. .devcheck/bundle) to carry it" ;;
    esac
}

# =========================================================================== run
T0=$(date +%s)
BUDGET=${DEVCHECK_BUDGET:-470}
RESULTS=()   # "stage|status|seconds|detail"
FAILED=0
LOGDIR=""

left() { echo $((BUDGET - ($(date +%s) - T0))); }

# stage NAME CAP_SECONDS COMMAND...: run with a timeout of min(CAP, time left - 15),
# log to $LOGDIR/NAME.log, record the result. Returns the command's status.
stage() {
    local name=$1 cap=$2
    shift 2
    local l t rc t1 t2
    l=$(left)
    t=$((l - 15 < cap ? l - 15 : cap))
    if [ "$t" -lt 10 ]; then
        # the caller records the stage; record() replaces its detail
        NO_TIME=1
        STAGE_SECS=0
        : >"$LOGDIR/$name.log"
        return 99
    fi
    note "== $name (timeout ${t}s, ${l}s left)"
    t1=$(date +%s)
    if [ "$(type -t "$1")" = function ]; then
        # a function of this script: a child bash gets it through export -f
        timeout -k 10 "$t" bash -c '"$@"' _ "$@" >"$LOGDIR/$name.log" 2>&1
    else
        timeout -k 10 "$t" "$@" >"$LOGDIR/$name.log" 2>&1
    fi
    rc=$?
    t2=$(date +%s)
    STAGE_SECS=$((t2 - t1))
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        note "!! $name TIMED OUT after ${t}s; end of $LOGDIR/$name.log:"
        tail -25 "$LOGDIR/$name.log" | sed 's/^/   | /' >&2
    elif [ $rc -ne 0 ]; then
        note "!! $name FAILED (exit $rc); end of $LOGDIR/$name.log:"
        tail -40 "$LOGDIR/$name.log" | sed 's/^/   | /' >&2
    fi
    return $rc
}

NO_TIME=0
LAST_VERDICT=ok
record() {
    if [ "$NO_TIME" = 1 ]; then
        NO_TIME=0
        RESULTS+=("$1|SKIP|0|no time left (budget ${BUDGET}s)")
        return
    fi
    RESULTS+=("$1|$2|$3|$4")
    case "$2" in FAIL|TIMEOUT) FAILED=1 ;; esac
}

# status word for a stage's exit code
verdict_of() {
    case "$1" in 0) echo ok ;; 124|137) echo TIMEOUT ;; 99|77) echo SKIP ;; *) echo FAIL ;; esac
}

# record a TAP test stage; on a machine with a GPU a skipped GPU test is a failure
# (unless the name says it may skip, as the 2-rank run with one GPU)
record_tests() {
    local name=$1 rc=$2 label=$3 may_skip=${4:-0}
    local v sum
    v=$(verdict_of "$rc")
    LAST_VERDICT=$v # the program's own verdict (rerun_blocking)
    sum=$(tap_summary "$LOGDIR/$name.log")
    if [ "$v" = ok ] && [ -n "${GPU_NAME:-}" ] && [ "$may_skip" = 0 ] &&
        grep -qE '^ok [0-9]+.*# SKIP' "$LOGDIR/$name.log"; then
        v=FAIL
        sum="$sum: GPU present but tests skipped"
    fi
    if [ "$v" = ok ] && grep -qE '^1\.\.0 # SKIP' "$LOGDIR/$name.log"; then
        # the whole program skipped (plan 1..0)
        sum=$(grep -m1 -E '^1\.\.0 # SKIP' "$LOGDIR/$name.log" | sed 's/^1\.\.0 # SKIP *//')
        v=SKIP
        if [ -n "${GPU_NAME:-}" ] && [ "$may_skip" = 0 ]; then v=FAIL; sum="GPU present but skipped: $sum"; fi
    elif [ "$v" = ok ] && ! grep -qE '^ok [0-9]+' "$LOGDIR/$name.log"; then
        v=FAIL
        sum="no TAP output"
    fi
    record "$name" "$v" "$STAGE_SECS" "$label$sum"
    grep -E '^not ok|# SKIP' "$LOGDIR/$name.log" | head -12 >&2
}

# python3 with torch (the machine's PyTorch), else the first python3
pick_python() {
    local c
    for c in ${DEVCHECK_PYTHON:-} python3 /usr/bin/python3; do
        command -v "$c" >/dev/null && "$c" -c 'import torch, torchvision' >/dev/null 2>&1 &&
            { command -v "$c"; return; }
    done
    command -v python3 || echo python3
}

# "N ok, M skip, K FAIL" from a TAP log (only rank 0 prints TAP)
tap_summary() {
    local f=$1 ok sk nk
    ok=$(grep -cE '^ok [0-9]+' "$f")
    sk=$(grep -cE '^ok [0-9]+.*# SKIP' "$f")
    nk=$(grep -cE '^not ok [0-9]+' "$f")
    echo "$((ok - sk)) pass, $sk skip, $nk fail"
}

print_table() {
    local now
    now=$(date +%s)
    echo
    echo "=================================================================================="
    echo " cohort device check  $(date -u +%FT%TZ)  total $((now - T0)) s (budget $BUDGET s)"
    [ -n "${GPU_NAME:-}" ] && echo " GPU: $GPU_NAME"
    echo "=================================================================================="
    printf ' %-18s %-8s %6s  %s\n' stage status secs detail
    printf ' %-18s %-8s %6s  %s\n' ------------------ -------- ------ ------------------------------------------
    local r
    for r in "${RESULTS[@]}"; do
        IFS='|' read -r a b c d <<<"$r"
        printf ' %-18s %-8s %6s  %s\n' "$a" "$b" "$c" "$d"
    done
    if [ -s "$LOGDIR/bench_table.txt" ]; then
        echo
        echo " training images/s (batch 128, 3x224x224, 1000 classes, fwd+loss+bwd+SGD step;"
        echo " ${DEVCHECK_STEPS:-30} timed steps after ${DEVCHECK_WARMUP:-10} warm-up steps, one device sync at the end)"
        cat "$LOGDIR/bench_table.txt"
    fi
    if [ -s "$LOGDIR/nccl_table.txt" ]; then
        echo
        echo " NCCL all-reduce, 1 GPU (cohort-bench --backend nccl; busbw = algbw*2(W-1)/W is 0 for W = 1)"
        cat "$LOGDIR/nccl_table.txt"
    fi
    echo "=================================================================================="
    echo " result: $([ $FAILED -eq 0 ] && echo 'every stage that ran passed' || echo 'FAILURES above')"
}

finish() {
    print_table | tee "$LOGDIR/table.txt"
    if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
        tar czf "$OUT/devcheck-logs.tar.gz" -C "$(dirname "$LOGDIR")" "$(basename "$LOGDIR")" 2>/dev/null
        cp "$LOGDIR/table.txt" "$OUT/devcheck-table.txt" 2>/dev/null
    fi
    exit $FAILED
}

# find FILE under the given roots; print the first directory holding it
find_dir_of() {
    local name=$1
    shift
    local r f
    for r in "$@"; do
        [ -d "$r" ] || continue
        # (test -f, not find's -type f, which may trust the directory entry)
        while IFS= read -r f; do
            [ -f "$f" ] && [ -s "$f" ] && { dirname "$f"; return 0; }
        done < <(find -L "$r" -maxdepth 6 -name "$name" 2>/dev/null)
    done
    return 1
}

run_deps() {
    local bundle=$1 p=$2
    rm -rf "$p"
    mkdir -p "$p"
    local f n=0
    for f in "$bundle"/debs/*.deb; do
        if command -v dpkg >/dev/null; then
            dpkg -x "$f" "$p" || { echo "dpkg -x $f failed"; return 1; }
        else
            # no dpkg: a .deb is an ar archive holding data.tar.*
            local d
            d=$(mktemp -d) && (cd "$d" && ar x "$f") &&
                tar xf "$d"/data.tar.* -C "$p" || { echo "unpacking $f failed"; return 1; }
            rm -rf "$d"
        fi
        n=$((n + 1))
    done
    echo "unpacked $n .debs into $p"
    local lib=$p/usr/lib/x86_64-linux-gnu
    # prefer the machine's own copy of ABI-stable system libraries
    local so sys
    for so in $SYSTEM_FIRST; do
        sys=$(ldconfig -p 2>/dev/null | awk -v s="$so" '$1 == s { print $NF; exit }')
        if [ -n "$sys" ]; then
            for f in "$lib/$so"* "$p/lib/x86_64-linux-gnu/$so"*; do [ -e "$f" ] && rm -f "$f"; done
            echo "using the machine's $sys instead of the bundled $so"
        fi
    done
    # absolute symlinks (zlib1g-dev's libz.so -> /lib/...): into the prefix when
    # the target is there; development links left dangling: to the machine's library
    local tgt
    while IFS= read -r f; do
        tgt=$(readlink "$f")
        [ -e "$p$tgt" ] && ln -sf "$p$tgt" "$f"
    done < <(find "$p" -type l -lname '/*' 2>/dev/null)
    for f in "$lib"/*.so; do
        if [ -L "$f" ] && [ ! -e "$f" ]; then
            local base
            base=$(basename "$f")
            sys=$(ldconfig -p 2>/dev/null | awk -v s="$base" 'index($1, s ".") == 1 { print $NF; exit }')
            if [ -n "$sys" ]; then ln -sf "$sys" "$f"; echo "$base -> $sys"; else rm -f "$f"; fi
        fi
    done
    # UCX transport plugins for InfiniBand need libibverbs, which is not bundled
    rm -f "$lib"/ucx/libuct_ib.so* "$lib"/ucx/libuct_rdmacm.so*
    # Debian's alternatives are not set up by dpkg -x
    ln -sf mpiexec.hydra "$p/usr/bin/mpiexec"
    [ -e "$p/usr/bin/mpicc.mpich" ] && ln -sf mpicc.mpich "$p/usr/bin/mpicc"
    [ -e "$p/usr/bin/pkgconf" ] && ln -sf pkgconf "$p/usr/bin/pkg-config"
    # .pc files: /usr -> the prefix
    for f in "$lib"/pkgconfig/*.pc "$p"/usr/share/pkgconfig/*.pc; do
        [ -e "$f" ] || continue
        [ -L "$f" ] && { local t; t=$(readlink -f "$f"); rm -f "$f"; cp "$t" "$f" 2>/dev/null || continue; }
        sed -i "s|=/usr|=$p/usr|g; s|-I/usr|-I$p/usr|g; s|-L/usr|-L$p/usr|g" "$f"
    done
    local must
    for must in usr/include/x86_64-linux-gnu/mpich/mpi.h usr/include/dnnl.h usr/include/cmocka.h \
        usr/include/libconfig.h usr/include/jansson.h usr/bin/mpiexec.hydra usr/bin/hydra_pmi_proxy; do
        [ -e "$p/$must" ] || { echo "missing after unpacking: $must"; return 1; }
    done
    echo "prefix ready: $(du -sh "$p" | cut -f1)"
}

run_cuda_probe() {
    # nvcc
    NVCC_BIN=$(command -v nvcc || true)
    [ -z "$NVCC_BIN" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC_BIN=/usr/local/cuda/bin/nvcc
    [ -n "$NVCC_BIN" ] || { echo "no nvcc on PATH or in /usr/local/cuda/bin"; return 1; }
    NVCC_BIN=$(readlink -f "$NVCC_BIN")
    CUDA_DIR=$(dirname "$(dirname "$NVCC_BIN")")
    echo "nvcc: $NVCC_BIN ($("$NVCC_BIN" --version | tail -2 | head -1))"
    echo "CUDA dir: $CUDA_DIR"
    # Python site-packages (PyTorch's nvidia/* wheels)
    local sites=""
    if command -v python3 >/dev/null; then
        sites=$(python3 - <<'PY' 2>/dev/null
import site, sys, os
roots = set(site.getsitepackages() + [site.getusersitepackages()])
try:
    import torch
    roots.add(os.path.dirname(os.path.dirname(torch.__file__)))
except Exception:
    pass
print(" ".join(sorted(r for r in roots if os.path.isdir(r))))
PY
)
    fi
    # DEVCHECK_SITE_PACKAGES: more folders holding nvidia/<pkg>/{include,lib}
    sites="${DEVCHECK_SITE_PACKAGES:-} $sites"
    echo "python site-packages searched: ${sites:-none}"
    local roots_inc="$CUDA_DIR/include /usr/local/cuda/include /usr/include /usr/include/x86_64-linux-gnu"
    local roots_lib="$CUDA_DIR/lib64 $CUDA_DIR/lib /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu"
    local s
    for s in $sites; do roots_inc="$roots_inc $s/nvidia"; roots_lib="$roots_lib $s/nvidia"; done
    CUDA_INC_DIRS=""
    CUDA_LIB_DIRS=""
    LINKS=$WORK/cudalinks
    rm -rf "$LINKS"
    mkdir -p "$LINKS"
    local hdr libbase d l missing=""
    for pair in cuda_runtime.h:libcudart cudnn.h:libcudnn cublas_v2.h:libcublas nccl.h:libnccl; do
        hdr=${pair%%:*}
        libbase=${pair##*:}
        # shellcheck disable=SC2086
        d=$(find_dir_of "$hdr" $roots_inc) || { missing="$missing $hdr"; d=""; }
        [ -n "$d" ] && { echo "$hdr: $d"; case " $CUDA_INC_DIRS " in *" $d "*) ;; *) CUDA_INC_DIRS="$CUDA_INC_DIRS $d" ;; esac; }
        # shellcheck disable=SC2086
        l=$(find_dir_of "$libbase.so*" $roots_lib) || { missing="$missing $libbase.so"; l=""; }
        if [ -n "$l" ]; then
            local real
            real=$(ls "$l/$libbase".so* 2>/dev/null | head -1)
            echo "$libbase: $real"
            # an unversioned name for the linker (pip wheels ship only libX.so.N)
            [ -e "$l/$libbase.so" ] || ln -sf "$real" "$LINKS/$libbase.so"
            case " $CUDA_LIB_DIRS " in *" $l "*) ;; *) CUDA_LIB_DIRS="$CUDA_LIB_DIRS $l" ;; esac
        fi
    done
    [ -z "$missing" ] || { echo "NOT FOUND:$missing (searched $roots_inc / $roots_lib)"; return 1; }
    echo "include dirs:$CUDA_INC_DIRS"
    echo "library dirs:$CUDA_LIB_DIRS"
    local vh vc vn
    vh=$(find_dir_of cudnn_version.h $CUDA_INC_DIRS) && vc=$(awk '/#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) / { v = v (v ? "." : "") $3 } END { print v }' "$vh/cudnn_version.h")
    vh=$(find_dir_of nccl.h $CUDA_INC_DIRS) && vn=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH) / { v = v (v ? "." : "") $3 } END { print v }' "$vh/nccl.h")
    echo "versions: cuDNN ${vc:-?} NCCL ${vn:-?}"
    # for the calling shell (this runs in a child under timeout)
    declare -p NVCC_BIN CUDA_DIR CUDA_INC_DIRS CUDA_LIB_DIRS LINKS >"$WORK/cuda.env"
    # the pip cuDNN loads its engine libraries by soname from its own folder: LD_LIBRARY_PATH
}

run_autogen() {
    local bundle=$1
    local want have
    have=$(autogen_sum "$SRC")
    if [ -f "$bundle/autogen.tar.gz" ] && [ "$(cat "$bundle/autogen.sum" 2>/dev/null)" = "$have" ]; then
        tar xzf "$bundle/autogen.tar.gz" -C "$SRC" || return 1
        # make's rebuild rules (automake, autoconf: not on this machine) must
        # not fire: the inputs get an old time, the generated files times in
        # dependency order (m4 -> aclocal.m4 -> configure -> Makefile.in,
        # config.h.in), none in the future (configure's sanity check)
        local now f
        now=$(date +%s)
        (cd "$SRC" && find . \( -name '*.am' -o -name configure.ac \) -not -path './.devcheck/*' \
            -exec touch -d @1000000000 {} +) || return 1
        (cd "$SRC" && tar tzf "$bundle/autogen.tar.gz" | while read -r f; do
            case $f in
            m4/*|build-aux/*) touch -d "@$((now - 3))" "$f" ;;
            aclocal.m4) touch -d "@$((now - 2))" "$f" ;;
            configure) touch -d "@$((now - 1))" "$f" ;;
            *) touch -d "@$now" "$f" ;;
            esac
        done) || return 1
        echo "generated files unpacked from the bundle (checksum $have matches)"
        return 0
    fi
    want=$(cat "$bundle/autogen.sum" 2>/dev/null || echo none)
    echo "configure.ac / *.am changed since prepare (bundle $want, tree $have)"
    if autoreconf --version >/dev/null 2>&1 && libtoolize --version >/dev/null 2>&1; then
        echo "running ./autogen.sh here"
        (cd "$SRC" && ./autogen.sh) && return 0
        echo "autogen.sh failed: run 'tests/gpu/device-check.sh prepare' again with the current tree"
        return 1
    else
        echo "no autotools on this machine: run 'tests/gpu/device-check.sh prepare' again on the"
        echo "Debian machine with the current tree, then carry the new bundle"
        return 1
    fi
}

run_configure() {
    local p=$1 build=$2
    local lib=$p/usr/lib/x86_64-linux-gnu
    local cpp="-I$p/usr/include -I$p/usr/include/x86_64-linux-gnu" ldf="-L$lib -Wl,-rpath-link,$lib -L$LINKS" d
    # the compiler's own directories stay implicit (-I/usr/include would break
    # the C++ headers' #include_next under nvcc)
    for d in $CUDA_INC_DIRS; do
        case $d in /usr/include|/usr/include/x86_64-linux-gnu) ;; *) cpp="$cpp -I$d" ;; esac
    done
    for d in $CUDA_LIB_DIRS; do
        case $d in /usr/lib/x86_64-linux-gnu|/lib/x86_64-linux-gnu|/usr/lib|/lib) ;; *) ldf="$ldf -L$d -Wl,-rpath,$d" ;; esac
    done
    mkdir -p "$build"
    cd "$build" || return 1
    # Only the prefix's .pc files; tools from the prefix first. -Werror off:
    # the machine's compiler may be newer than Debian 12's gcc 12 and warn
    # about more (warnings are counted in the table); nvcc's host compiler too.
    env PKG_CONFIG="$(command -v pkg-config || echo "$p/usr/bin/pkgconf")" \
        PKG_CONFIG_LIBDIR="$lib/pkgconfig:$p/usr/share/pkgconfig" PKG_CONFIG_PATH= \
        "$SRC/configure" --with-cuda="$CUDA_DIR" --without-pmi2 --disable-werror \
        NVCC="$NVCC_BIN" NVCCFLAGS="-Xcompiler=-Wno-error" \
        CPPFLAGS="$cpp" LDFLAGS="$ldf" MPIEXEC="$p/usr/bin/mpiexec.hydra" \
        PYTHON3="$(pick_python)"
    local rc=$?
    [ $rc -eq 0 ] || return $rc
    grep -q '^#define HAVE_CUDA 1' config.h || { echo "configure did not enable the CUDA backend"; return 1; }
}

run_all() {
    local bundle=${1:-$SRC/.devcheck/bundle}
    [ -d "$bundle/debs" ] || die "no bundle at $bundle (make one with: tests/gpu/device-check.sh prepare)"
    bundle=$(cd "$bundle" && pwd)
    WORK=$SRC/.devcheck/run
    LOGDIR=$WORK/logs
    local p=$WORK/prefix build=$WORK/build
    rm -rf "$LOGDIR"
    mkdir -p "$LOGDIR" || die "cannot create $LOGDIR"
    [ -e "$SRC/config.status" ] && die "$SRC is configured in place (config.status): the check builds out of tree; use a clean copy or 'make distclean'"
    trap finish EXIT
    trap 'note "interrupted"; FAILED=1; exit 1' TERM INT
    export SRC WORK LOGDIR SYSTEM_FIRST
    export -f run_deps run_cuda_probe run_autogen run_configure find_dir_of autogen_sum note pick_python

    # ---- machine
    {
        echo "uname: $(uname -a)"
        echo "os: $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}")"
        echo "glibc: $(ldd --version 2>/dev/null | head -1)"
        echo "cc: $(cc --version 2>/dev/null | head -1)"
        echo "cores: $(nproc)"
        nvidia-smi -L 2>&1
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1
        "$(pick_python)" -c 'import torch, torchvision; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "torchvision", torchvision.__version__, "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")' 2>&1
        echo "make: $(command -v make || echo none)  pkg-config: $(command -v pkg-config || echo none)  dpkg: $(command -v dpkg || echo none)"
    } >"$LOGDIR/machine.log" 2>&1
    GPU_NAME=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
    cat "$LOGDIR/machine.log" >&2
    local rc

    stage deps 90 run_deps "$bundle" "$p"
    rc=$?
    record deps "$(verdict_of $rc)" "$STAGE_SECS" "$(tail -1 "$LOGDIR/deps.log")"
    [ $rc -eq 0 ] || { FAILED=1; exit 1; }

    stage cuda 60 run_cuda_probe
    rc=$?
    if [ $rc -eq 0 ]; then
        # shellcheck disable=SC1091
        . "$WORK/cuda.env"
        record cuda ok "$STAGE_SECS" "nvcc $("$NVCC_BIN" --version | grep -o 'release [0-9.]*' | head -1 | cut -d' ' -f2); $(grep -m1 '^versions:' "$LOGDIR/cuda.log" | cut -d' ' -f2-); cuBLAS found"
    else
        record cuda "$(verdict_of $rc)" "$STAGE_SECS" "$(grep -m1 -E 'NOT FOUND|no nvcc' "$LOGDIR/cuda.log")"
        FAILED=1
        exit 1
    fi

    stage autogen 60 run_autogen "$bundle"
    rc=$?
    record autogen "$(verdict_of $rc)" "$STAGE_SECS" "$(tail -1 "$LOGDIR/autogen.log")"
    [ $rc -eq 0 ] || { FAILED=1; exit 1; }

    local lib=$p/usr/lib/x86_64-linux-gnu ldp="" d
    lib="$lib:$p/lib/x86_64-linux-gnu"
    for d in $CUDA_LIB_DIRS; do ldp="$ldp:$d"; done
    ORIG_LDP=${LD_LIBRARY_PATH-__unset__}
    export NVCC_BIN CUDA_DIR CUDA_INC_DIRS CUDA_LIB_DIRS LINKS
    export LD_LIBRARY_PATH="$lib$ldp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PATH="$p/usr/bin:$PATH"

    if [ -n "${DEVCHECK_ONLY:-}" ] && [ -f "$build/config.status" ] && [ -f "$build/.devcheck-configured" ] &&
        [ "$(cat "$build/.devcheck-configured")" = "$(autogen_sum "$SRC")" ]; then
        # a rerun on a warm machine: same configure inputs, make rebuilds what changed
        record configure ok 0 "reused $build (DEVCHECK_ONLY rerun)"
    else
        rm -f "$build/.devcheck-configured"
        stage configure 150 run_configure "$p" "$build"
        rc=$?
        record configure "$(verdict_of $rc)" "$STAGE_SECS" "$(awk '/^  (MPI \(required\)|oneDNN|CUDA|cuDNN|cuBLAS|NCCL) / { sub(/ \(required\)/, ""); printf "%s %s; ", $1, $2 }' "$LOGDIR/configure.log")"
        [ $rc -eq 0 ] || { FAILED=1; exit 1; }
        autogen_sum "$SRC" >"$build/.devcheck-configured"
    fi
    cd "$build" || exit 1

    local jobs
    jobs=$(nproc)
    local MAKE=make
    command -v make >/dev/null || MAKE="$p/usr/bin/make"
    local targets="libcohort.la tests/libharness.la tests/gpu/test_gpu_ops tests/gpu/test_gpu_nccl jobs/cohort-train jobs/cohort-bench"
    grep -q '^tests/gpu/test_gpu_train\$(EXEEXT):' Makefile && targets="$targets tests/gpu/test_gpu_train"
    grep -q '^tests/st_compare\$(EXEEXT):' Makefile && targets="$targets tests/st_compare"
    grep -q '^tests/test_cuda_kernels\$(EXEEXT):' Makefile && targets="$targets tests/test_cuda_kernels"
    # shellcheck disable=SC2086
    stage build 300 "$MAKE" -j"$jobs" $targets
    rc=$?
    record build "$(verdict_of $rc)" "$STAGE_SECS" "-j$jobs; $(grep -c 'warning:' "$LOGDIR/build.log") compiler warnings (build.log)"
    [ $rc -eq 0 ] || { FAILED=1; exit 1; }
    # every library resolves, the bundled ones from the prefix
    {
        for b in .libs/libcohort.so tests/gpu/.libs/test_gpu_ops jobs/.libs/cohort-train \
            "$p/usr/bin/mpiexec.hydra" "$p/usr/bin/hydra_pmi_proxy"; do
            echo "== $b"
            # (libtool's wrapper scripts add the build's .libs the same way)
            LD_LIBRARY_PATH="$build/.libs:$build/tests/.libs:$LD_LIBRARY_PATH" ldd "$b"
        done
    } >"$LOGDIR/ldd.log" 2>&1
    if grep -q 'not found' "$LOGDIR/ldd.log"; then
        record libraries FAIL 0 "$(grep 'not found' "$LOGDIR/ldd.log" | sort -u | tr -s ' \t' ' ' | tr '\n' ';')"
        note "!! libraries missing at run time (ldd.log):"
        grep 'not found' "$LOGDIR/ldd.log" >&2
    else
        record libraries ok 0 "$(grep -cF "$p/" "$LOGDIR/ldd.log") from the bundle; libmpich: $(awk '/libmpich.so/ { print $3; exit }' "$LOGDIR/ldd.log")"
    fi
    # the benchmark on its own, so the tests run even if it does not build
    stage build-bench 120 "$MAKE" -j"$jobs" tests/gpu/bench_gpu_train
    rc=$?
    record build-bench "$(verdict_of $rc)" "$STAGE_SECS" "tests/gpu/bench_gpu_train$([ $rc -ne 0 ] && echo ': not built, see build-bench.log')"

    # the test environment of Makefile.am (AM_TESTS_ENVIRONMENT)
    export COHORT_SRCDIR="$SRC" COHORT_BUILDDIR="$build" PYTHON3=no HAVE_TORCH=no \
        MPIEXEC="$p/usr/bin/mpiexec.hydra" MPIEXEC_TIMEOUT=120

    # Stage order (most wanted first, so that a run cut short by the budget
    # has lost the least): the GPU tests, NCCL, a reduced benchmark (resnet18
    # and resnet50 in the three precisions, cohort then PyTorch), the
    # training tests and cohort-train on the GPU, the rest of the benchmark
    # (resnet34). A failing GPU test is run again at once with
    # CUDA_LAUNCH_BLOCKING=1 (every launch synchronous), so that a kernel
    # fault is reported by the launch that made it, not by a later call.
    # DEVCHECK_ONLY="NAME ..." runs only those of these stages (a rerun on a
    # warm machine after a fix: the configured build is reused).
    if [ -x tests/test_cuda_kernels ]; then
        want test_cuda_kernels && {
            stage test_cuda_kernels 90 ./tests/test_cuda_kernels
            record_tests test_cuda_kernels $? ""
            rerun_blocking test_cuda_kernels ./tests/test_cuda_kernels
        }
    fi
    want test_gpu_ops && {
        stage test_gpu_ops 150 ./tests/gpu/test_gpu_ops
        record_tests test_gpu_ops $? ""
        rerun_blocking test_gpu_ops ./tests/gpu/test_gpu_ops
    }
    want test_gpu_nccl && {
        stage test_gpu_nccl 90 ./tests/gpu/test_gpu_nccl
        record_tests test_gpu_nccl $? "1 rank: "
        rerun_blocking test_gpu_nccl ./tests/gpu/test_gpu_nccl
    }
    want test_gpu_nccl-np2 && {
        stage test_gpu_nccl-np2 90 "$p/usr/bin/mpiexec.hydra" -n 2 ./tests/gpu/test_gpu_nccl
        record_tests test_gpu_nccl-np2 $? "2 ranks: " 1
    }

    # ---- NCCL, 1 GPU
    if want nccl; then
        if [ -z "${GPU_NAME:-}" ]; then
            record nccl SKIP 0 "no GPU (nvidia-smi found none)"
        else
            stage nccl 60 ./jobs/cohort-bench --backend nccl -b 1M -e 256M -f 4 -n 20 --place both
            rc=$?
            record nccl "$(verdict_of $rc)" "$STAGE_SECS" "cohort-bench --backend nccl, 1 rank"
            grep -E '^#[[:space:]]+(bytes|\(float\))|^[[:space:]]+[0-9]' "$LOGDIR/nccl.log" |
                sed 's/^#/ /' >"$LOGDIR/nccl_table.txt"
        fi
    fi

    # ---- benchmark, reduced: resnet18 and resnet50 (cohort, then PyTorch)
    want bench && bench_pair bench resnet18,resnet50 150

    # ---- the training tests
    if want test_gpu_train; then
        if [ -x tests/gpu/test_gpu_train ]; then
            stage test_gpu_train 120 ./tests/gpu/test_gpu_train
            record_tests test_gpu_train $? ""
            rerun_blocking test_gpu_train ./tests/gpu/test_gpu_train
        else
            record test_gpu_train SKIP 0 "not in this tree (needs the device training API)"
        fi
    fi
    # gpu-train's end-to-end job test: cohort-train on the GPU vs the CPU,
    # resume, bf16 (a TAP shell script; it writes its own small dataset)
    if want test_gpu_train_job; then
        if [ -f "$SRC/tests/gpu/test_gpu_train_job.sh" ] && [ -x tests/st_compare ]; then
            stage test_gpu_train_job 150 env PYTHON3="$(command -v python3 || echo python3)" \
                sh "$SRC/tests/gpu/test_gpu_train_job.sh"
            record_tests test_gpu_train_job $? ""
        else
            record test_gpu_train_job SKIP 0 "not in this tree"
        fi
    fi

    # ---- a few cohort-train steps on the GPU
    local fm=""
    [ -f "$bundle/fashion-mnist/train-images-idx3-ubyte.gz" ] && fm=$bundle/fashion-mnist
    [ -z "$fm" ] && [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] &&
        fm=/usr/share/datasets/fashion-mnist
    if ! want cohort-train; then
        :
    elif [ -n "$fm" ]; then
        rm -rf "$WORK/runs"
        stage cohort-train 90 ./jobs/cohort-train --data.path="$fm" --schedule.epochs=1 \
            --train.batch_size=256 --train.max_steps="${DEVCHECK_TRAIN_STEPS:-30}" --train.log_every=10 --train.threads=4 \
            --data.test_subset=2000 --output.dir="$WORK/runs" --data.workers=4
        rc=$?
        record cohort-train "$(verdict_of $rc)" "$STAGE_SECS" "$(grep -m1 '^cohort-train:' "$LOGDIR/cohort-train.log" | sed 's/ (distributed[^)]*))//' | cut -c15-60); $(grep -E '^epoch [0-9]+: loss' "$LOGDIR/cohort-train.log" | tail -1 | cut -c1-75)"
    else
        record cohort-train SKIP 0 "no Fashion-MNIST (bundle or /usr/share/datasets)"
    fi

    # ---- benchmark, the rest: resnet34
    want bench-34 && bench_pair bench-34 resnet34 100
    exit $FAILED
}

# want NAME: whether stage NAME runs (DEVCHECK_ONLY unset: all of them)
want() {
    [ -z "${DEVCHECK_ONLY:-}" ] && return 0
    case " $DEVCHECK_ONLY " in *" $1 "*) return 0 ;; esac
    return 1
}

# rerun_blocking NAME COMMAND...: after a GPU test stage NAME that failed on a
# machine with a GPU, run it again with CUDA_LAUNCH_BLOCKING=1 as stage
# NAME-blocking (its log names the op whose launch faulted)
rerun_blocking() {
    local name=$1
    shift
    [ "$LAST_VERDICT" = FAIL ] || [ "$LAST_VERDICT" = TIMEOUT ] || return 0
    [ -n "${GPU_NAME:-}" ] || return 0
    stage "$name-blocking" 120 env CUDA_LAUNCH_BLOCKING=1 "$@"
    local rc=$?
    if [ "$NO_TIME" = 1 ]; then record "$name-blocking" SKIP 0 ""; return 0; fi
    # informative: the failure is already counted
    RESULTS+=("$name-blocking|$(verdict_of $rc)|$STAGE_SECS|CUDA_LAUNCH_BLOCKING=1: $(grep -m1 -E '^not ok|failed|error' "$LOGDIR/$name-blocking.log" | cut -c1-90)")
}

# bench_pair NAME MODELS CAP: the cohort benchmark (stage NAME-cohort) and
# PyTorch's (NAME-pytorch) for MODELS at batch 128, CSVs $LOGDIR/NAME_*.csv
bench_pair() {
    local name=$1 models=$2 cap=$3 rc
    local steps=${DEVCHECK_STEPS:-30} warm=${DEVCHECK_WARMUP:-10}
    if [ -x tests/gpu/bench_gpu_train ]; then
        stage "$name-cohort" "$cap" ./tests/gpu/bench_gpu_train --models "$models" \
            --batch 128 --warmup "$warm" --steps "$steps" --csv "$LOGDIR/${name}_cohort.csv"
        rc=$?
        record "$name-cohort" "$(verdict_of $rc)" "$STAGE_SECS" "$(grep -m1 'no GPU' "$LOGDIR/$name-cohort.log" || echo "$models: $(grep -c '^cohort,' "$LOGDIR/${name}_cohort.csv" 2>/dev/null || echo 0) runs")"
    else
        record "$name-cohort" SKIP 0 "bench_gpu_train not built"
    fi
    # PyTorch with the machine's own library path (not the bundle's)
    local pyenv=(env -u LD_LIBRARY_PATH)
    [ "$ORIG_LDP" != __unset__ ] && pyenv=(env LD_LIBRARY_PATH="$ORIG_LDP")
    stage "$name-pytorch" "$cap" "${pyenv[@]}" "$(pick_python)" "$SRC/tests/gpu/bench_gpu_train.py" --models "$models" \
        --batch 128 --warmup "$warm" --steps "$steps" --csv "$LOGDIR/${name}_pytorch.csv"
    rc=$?
    record "$name-pytorch" "$(verdict_of $rc)" "$STAGE_SECS" "$(grep -m1 'no GPU' "$LOGDIR/$name-pytorch.log" || { [ $rc -eq 0 ] && grep -m1 '^torch ' "$LOGDIR/$name-pytorch.log"; } || tail -1 "$LOGDIR/$name-pytorch.log" | cut -c1-90)"
    bench_table >"$LOGDIR/bench_table.txt" 2>>"$LOGDIR/$name-pytorch.log"
}

# the images/s table from every benchmark CSV so far
bench_table() {
    python3 - "$LOGDIR" <<'PY'
import csv, glob, os, sys
def load(pattern):
    d = {}
    for p in sorted(glob.glob(os.path.join(sys.argv[1], pattern))):
        for r in csv.DictReader(open(p)):
            d[(r["model"], r["precision"])] = r
    return d
c, t = load("*_cohort.csv"), load("*_pytorch.csv")
order = ["fp32", "tf32", "bf16"]
keys = sorted(set(c) | set(t), key=lambda k: (k[0], order.index(k[1]) if k[1] in order else 9))
if keys:
    print(" %-9s %-5s %12s %12s %8s" % ("model", "prec", "cohort", "PyTorch", "ratio"))
for k in keys:
    # None: not run; 0.0: the run failed (an empty value in its row)
    a = float(c[k]["images_per_s"] or 0) if k in c else None
    b = float(t[k]["images_per_s"] or 0) if k in t else None
    fmt = lambda v: "%12.1f" % v if v else "%12s" % ("-" if v is None else "fail")
    print(" %-9s %-5s %s %s %8s" % (k[0], k[1], fmt(a), fmt(b), "%.2f" % (a / b) if a and b else "-"))
PY
}

case "${1:-}" in
prepare) shift; prepare "$@" ;;
run) shift; run_all "$@" ;;
-h|--help|help) usage ;;
*) usage >&2; exit 2 ;;
esac
