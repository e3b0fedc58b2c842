#!/bin/bash
# cohort: the installed package, used the way a cluster user uses it.
#
# make check: makes a clean source tree (make distdir), configures it with
# this build's configure options (without CUDA, see below) and a temporary
# --prefix, builds it and installs it three times: into that prefix, staged
# with DESTDIR (the two trees must hold the same files), and with
# `make install prefix=OTHER` from the same build. Then:
#   - each of the three trees names the directory it is used from (OTHER,
#     or the configured prefix for the other two) in cohort.pc, the
#     modulefile, the sbatch templates and cohort(7), and no other tree's;
#     the installed example compiles with `pkg-config --cflags --libs
#     cohort` against the tree and runs on 2 ranks; the installed programs
#     find the tree's libcohort without LD_LIBRARY_PATH (RUNPATH) and
#     cohort-train --help runs;
#   - the staged headers: only public ones (no config.h, no *_internal.h),
#     their includes rewritten to <cohort/...>, each compiles alone as C11
#     and as C++11 with only `pkg-config --define-prefix --cflags cohort`
#     (pkgconf relocates cohort.pc to the staged tree; MPICH's .pc stays);
#   - the man pages render with `man -l` without groff warnings, and every
#     key or option of --help is in its page;
#   - in a fresh login shell (env -i bash -l) with Lmod: module use/load,
#     cohort-train --help, man cohort-train, man 7 cohort, the installed
#     example built with `pkg-config --cflags --libs cohort` as C and as C++
#     and run under mpiexec -n 2 (sampler + all-reduce), module unload;
#   - the installed sbatch template runs the installed cohort-train on the
#     local Slurm test cluster (slurm/testcluster) from a shell whose PATH
#     has no cohort, to completion with a model file.
# make installcheck (and distcheck) runs the same checks on $(prefix)
# (COHORT_INSTALLED_PREFIX, no build, no DESTDIR or OTHER tree).
# Points that need Lmod, Slurm (as root) or the Fashion-MNIST data set SKIP
# visibly where those are missing. Prints TAP.
set -u
. "${COHORT_SRCDIR:-$(dirname "$0")/..}/tests/test_slurm_lib.sh"

make_cmd=${COHORT_MAKE:-make}
MPIEXEC=${MPIEXEC:-mpiexec}
san=${COHORT_SAN_CFLAGS:-}
skip() { tap_n=$((tap_n + 1)); echo "ok $tap_n - $1 # SKIP $2"; }
# quiet_run LOG CMD...: run CMD with output in LOG; on failure its tail goes
# to the TAP diagnostics.
quiet_run() {
    local log=$1 rc
    shift
    "$@" >"$log" 2>&1
    rc=$?
    [ $rc = 0 ] || { echo "$* failed ($rc), last lines of $log:"; tail -n 25 "$log"; } | diag
    return $rc
}
# make, niced, without the caller's jobserver (make check's MAKEFLAGS).
submake() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL nice $make_cmd "$@"; }

make_workdir T
if [ -n "${COHORT_INSTALLED_PREFIX:-}" ]; then
    prefix=$COHORT_INSTALLED_PREFIX
    libdir=${COHORT_INSTALLED_LIBDIR:-$prefix/lib}
    datadir=${COHORT_INSTALLED_DATADIR:-$prefix/share}
    stage=                       # the headers are checked in the prefix itself
    echo "# installcheck of the installation in $prefix"
else
    prefix=$T/prefix
    libdir=$prefix/lib
    datadir=$prefix/share
    stage=$T/stage
    quiet_run "$T/distdir.log" submake -C "$builddir" distdir distdir="$T/src"
    ok $? "make distdir: a clean source tree in $T/src"
    # this build's configure options, without its directories
    eval "set -- $("$builddir/config.status" --config)"
    # The GPU backend is left out unless COHORT_INSTALL_TEST_CUDA=1: nothing
    # checked here depends on it and nvcc would make this test slow; the
    # installcheck of distcheck checks the installation as configured.
    args=()
    for a in "$@"; do
        case $a in
        --prefix=* | --exec-prefix=* | --*dir=* | --cache-file=* | -C | --config-cache) ;;
        --with-cuda* | --without-cuda) [ "${COHORT_INSTALL_TEST_CUDA:-0}" = 1 ] && args+=("$a") ;;
        *) args+=("$a") ;;
        esac
    done
    [ "${COHORT_INSTALL_TEST_CUDA:-0}" = 1 ] || args+=(--without-cuda)
    mkdir -p "$T/build"
    (cd "$T/build" && quiet_run "$T/configure.log" "$T/src/configure" "${args[@]}" --prefix="$prefix")
    ok $? "configure ${args[*]} --prefix=$prefix"
    quiet_run "$T/make.log" submake -C "$T/build" -j2
    ok $? "make (the library, the programs, their man pages, the generated share files)"
    quiet_run "$T/install.log" submake -C "$T/build" install
    ok $? "make install into $prefix"
    quiet_run "$T/stage.log" submake -C "$T/build" install DESTDIR="$stage"
    ok $? "make install DESTDIR=$stage"
    [ "$(cd "$stage$prefix" && find . | sort)" = "$(cd "$prefix" && find . | sort)" ] &&
        diff -r "$stage$prefix" "$prefix" >/dev/null
    ok $? "the staged tree holds the same files, byte for byte, as the installed prefix"
    # the GNU idiom: the same build installed elsewhere (libcohort and the
    # programs are relinked for the new libdir, the path-bearing files remade)
    other=$T/other
    quiet_run "$T/install-other.log" submake -C "$T/build" install prefix="$other"
    ok $? "make install prefix=$other (the build configured with --prefix=$prefix)"
fi
pkgdatadir=$datadir/cohort
version=$(sed -n 's/^Version: *//p' "$libdir/pkgconfig/cohort.pc" 2>/dev/null)

# ---- layout
missing=
programs="cohort-train cohort-bench cohort-farm cohort-farm-example cohort-reduce cohort-pack"
for f in $(for p in $programs; do echo "$prefix/bin/$p $datadir/man/man1/$p.1"; done) \
    "$libdir/libcohort.so" "$pkgdatadir/farm.cfg" \
    "$libdir/pkgconfig/cohort.pc" "$pkgdatadir/train.cfg" "$pkgdatadir/slurm/README.md" \
    "$pkgdatadir/slurm/cpu-1node.sbatch" "$pkgdatadir/slurm/gpu-1node.sbatch" \
    "$pkgdatadir/slurm/multinode.sbatch" "$pkgdatadir/slurm/testcluster" \
    "$pkgdatadir/slurm/farm.sbatch" "$pkgdatadir/slurm/reduce.sbatch" \
    "$pkgdatadir/examples/sampler_allreduce.c" "$pkgdatadir/examples/Makefile" \
    "$pkgdatadir/examples/fmnist_cnn.c" "$prefix/include/cohort/trainer/trainer.h" \
    "$datadir/man/man1/cohort-train.1" "$datadir/man/man1/cohort-bench.1" \
    "$datadir/man/man7/cohort.7" "$datadir/modulefiles/cohort/$version.lua" \
    "$datadir/doc/cohort/SEMANTICS.md" \
    "$prefix/include/cohort/framework/dist/dist.h" "$prefix/include/cohort/io/data/sampler.h"; do
    [ -e "$f" ] || missing="$missing $f"
done
[ -z "$missing" ]
ok $? "installed: the 5 programs, library, cohort.pc, configs, templates, README, testcluster, examples, man pages, SEMANTICS.md, modulefile, headers${missing:+ (missing:$missing)}"

# ---- headers
inc=$stage$prefix/include
# The staged cohort.pc is relocated with pkgconf's --define-prefix (prefix
# from the .pc file's own location). PKG_CONFIG_SYSROOT_DIR would prefix
# MPICH's -I too; --define-prefix also moves the private requirements found
# in multiarch dirs (libpng: -I/usr/lib/include/libpng16), harmless here as
# no cohort header includes them. The real prefix needs no such help.
if [ -n "$stage" ]; then
    pc=(env PKG_CONFIG_PATH="$stage$libdir/pkgconfig" pkg-config --define-prefix)
else
    pc=(env PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config)
fi
headers=$(cd "$inc" && find cohort -name '*.h' | sort)
bad=$(cd "$inc" && { find cohort -name '*_internal.h' -o -name config.h;
    grep -l -E '^#[[:space:]]*include[[:space:]]*("|<)(config\.h|[^">]*_internal\.h)' $headers; } | sort -u)
[ -n "$headers" ] && [ -z "$bad" ]
ok $? "$(echo "$headers" | wc -l) public headers, none private or including config.h/*_internal.h${bad:+ (bad: $bad)}"
quoted=$(cd "$inc" && grep -n '^#[[:space:]]*include[[:space:]]*"' $headers)
unresolved=$(cd "$inc" && grep -h -o '^#[[:space:]]*include[[:space:]]*<cohort/[^>]*>' $headers |
    sed 's/.*<\(.*\)>/\1/' | sort -u | while read -r h; do [ -f "$h" ] || echo "$h"; done)
[ -z "$quoted" ] && [ -z "$unresolved" ]
ok $? "installed headers include each other as <cohort/...>, all installed${quoted:+ (quoted: $quoted)}${unresolved:+ (missing: $unresolved)}"
cflags=$("${pc[@]}" --cflags cohort)
ok $? "pkg-config --cflags cohort: $cflags"
case " $cflags " in *" -I$inc "* | *" -I$inc/ "*) r=0 ;; *) [ "$inc" = /usr/include ]; r=$? ;; esac
ok $r "the flags point at the installed include directory $inc"
# compile_each LANG COMPILER FLAGS...: every header alone
compile_each() {
    local lang=$1 cc=$2 h fails=
    shift 2
    for h in $headers; do
        printf '#include <%s>\nint cohort_header_test_%s;\n' "$h" "$(echo "$h" | tr -c 'a-z0-9\n' _)" >"$T/one.$lang"
        if ! $cc "$@" $cflags -fsyntax-only "$T/one.$lang" >"$T/one.err" 2>&1; then
            fails="$fails $h"
            { echo "$cc $h:"; head -n 5 "$T/one.err"; } | diag
        fi
    done
    [ -z "$fails" ] || echo "failed:$fails" | diag
    [ -z "$fails" ]
}
compile_each c gcc -x c -std=c11 -pedantic -Wall -Wextra -Werror
ok $? "every installed header compiles alone as C11 (gcc -std=c11 -pedantic -Werror)"
compile_each cc g++ -x c++ -std=c++11 -pedantic -Wall -Wextra -Werror
ok $? "every installed header compiles alone as C++11 (g++ -std=c++11 -pedantic -Werror)"

# ---- man pages
# man_text FILE: the page as man shows it (80 columns); groff's warnings in
# $T/man.err.
man_text() { MANWIDTH=80 man --warnings -l "$1" 2>"$T/man.err"; }
# every program in bin/ has a page; cohort(7)
pages=man7/cohort.7
for b in "$prefix"/bin/*; do pages="$pages man1/$(basename "$b").1"; done
for p in $pages; do
    f=$datadir/man/$p
    name=$(basename "$p" | sed 's/\.[0-9]$//')
    txt=$(man_text "$f")
    r=$?
    [ $r = 0 ] && [ ! -s "$T/man.err" ] && echo "$txt" | grep -q "^NAME" &&
        echo "$txt" | grep -A1 '^NAME' | grep -q "^ *$name - ." &&
        echo "$txt" | grep -q '^EXIT STATUS'
    ok $? "man -l $p renders (NAME '$name - ...', EXIT STATUS), groff silent"
    diag <"$T/man.err"
done
# every key (config programs: "  --KEY  (type, ...)" lines) or else every
# long option of PROG --help is in PROG(1)
for b in "$prefix"/bin/*; do
    name=$(basename "$b")
    help=$(env COHORT_LOG_LEVEL=warn "$b" --help 2>&1)
    what=keys
    names=$(echo "$help" | sed -n 's/^  \(--[A-Za-z0-9_.-]*\)  (.*/\1/p')
    if [ -z "$names" ]; then
        what=options
        names=$(echo "$help" | grep -o -E -e '(^|[ ,])--[a-z][a-z-]*' | sed 's/^[ ,]*//' | sort -u)
    fi
    page=$(man_text "$datadir/man/man1/$name.1")
    absent=$(for k in $names; do echo "$page" | grep -q -F -e "$k" || echo "$k"; done)
    [ -n "$names" ] && [ -z "$absent" ]
    ok $? "each of the $(echo "$names" | wc -w) $what of $name --help is in $name(1)${absent:+ (absent: $absent)}"
done

# ---- templates
tpl=$pkgdatadir/slurm/cpu-1node.sbatch
grep -q "^COHORT_DEFAULT_BIN=$prefix/bin/cohort-train\$" "$tpl" && bash -n "$tpl" &&
    grep -q "sbatch $pkgdatadir/slurm/cpu-1node.sbatch" "$tpl"
ok $? "installed cpu-1node.sbatch runs $prefix/bin/cohort-train by default and names its installed path"

# ---- each tree names the directory it is used from
# under DIR DIR2: DIR (a path under $prefix) under DIR2 instead.
under() { case $1 in "$prefix" | "$prefix"/*) echo "$2${1#"$prefix"}" ;; *) echo "$1" ;; esac; }
# check_tree HOW ROOT DIR WRONG...: the tree installed in ROOT (empty, or
# the DESTDIR) and used from DIR; WRONG: directories it must not name.
check_tree() {
    local how=$1 root=$2 dir=$3 lib data pkgdata f bad= missing= out r p tpl_ok=0
    shift 3
    lib=$(under "$libdir" "$dir")
    data=$(under "$datadir" "$dir")
    pkgdata=$data/cohort
    local pcfile=$root$lib/pkgconfig/cohort.pc lua=$root$data/modulefiles/cohort/$version.lua
    local man7=$root$data/man/man7/cohort.7 texts
    texts=$(cat "$pcfile" "$lua" "$root$pkgdata"/slurm/*.sbatch 2>/dev/null; sed 's/\\://g' "$man7")
    for w in "$@"; do echo "$texts" | grep -q -F -e "$w/" && bad="$bad $w"; done
    grep -q -x "prefix=$dir" "$pcfile" && grep -q -x "local prefix = \"$dir\"" "$lua" &&
        [ "$(grep -E '^(setenv|prepend_path)\(' "$lua" | grep '"/' | grep -c -v -F ", \"$dir")" = 0 ] &&
        grep -q -F "prepend_path(\"LD_LIBRARY_PATH\", \"$lib\")" "$lua" && [ -z "$bad" ]
    ok $? "$how: cohort.pc (prefix=$dir) and the modulefile name $dir${bad:+ (also named:$bad)}"
    for t in cpu-1node:train gpu-1node:train multinode:train farm:farm reduce:reduce; do
        f=$root$pkgdata/slurm/${t%%:*}.sbatch
        grep -q -x "COHORT_DEFAULT_BIN=$dir/bin/cohort-${t#*:}" "$f" && bash -n "$f" &&
            grep -q -F "sbatch $pkgdata/slurm/${t%%:*}.sbatch" "$f" || tpl_ok=1
    done
    ok $tpl_ok "$how: the sbatch templates run $dir/bin/cohort-train (farm.sbatch, reduce.sbatch: cohort-farm, cohort-reduce) and name $pkgdata/slurm/"
    sed 's/\\://g' "$man7" | grep -q -x ".I $dir/bin" &&
        sed 's/\\://g' "$man7" | grep -q -x ".I $lib/pkgconfig/cohort.pc" &&
        sed 's/\\://g' "$man7" | grep -q -x ".I $pkgdata/slurm/"
    ok $? "$how: cohort(7)'s FILES name $dir/bin, $lib/pkgconfig/cohort.pc, $pkgdata/slurm/"
    # the numerics page the installed headers cite, where cohort(7) says it is
    sed 's/\\://g' "$man7" | grep -q -x ".I $data/doc/cohort/SEMANTICS.md" &&
        grep -q "^# cohort: the numerics that match PyTorch" "$root$data/doc/cohort/SEMANTICS.md" &&
        grep -q "SEMANTICS.md" "$root$(under "$prefix/include" "$dir")/cohort/framework/nn/nn.h"
    ok $? "$how: SEMANTICS.md (cited by the headers) installed in $data/doc/cohort, named by cohort(7)"

    # pkg-config against the tree (a staged one relocated with --define-prefix)
    local pcs=(env PKG_CONFIG_PATH="$root$lib/pkgconfig" pkg-config)
    [ -n "$root" ] && pcs+=(--define-prefix)
    local ex=$T/ex-$(echo "$how" | tr -c 'a-zA-Z0-9\n' _) flags exlib
    mkdir -p "$ex"
    flags=$("${pcs[@]}" --cflags --libs cohort) && exlib=$("${pcs[@]}" --variable=libdir cohort) &&
        case " $flags " in *" -I$root$dir/include "*) ;; *) [ "$root$dir/include" = /usr/include ] ;; esac &&
        gcc -O2 -Wall -Wextra -Werror $san -o "$ex/sampler_allreduce" \
            "$root$pkgdata/examples/sampler_allreduce.c" $flags >"$ex/cc.log" 2>&1 &&
        out=$(env -u LD_LIBRARY_PATH LD_LIBRARY_PATH="$exlib" "$MPIEXEC" -n 2 "$ex/sampler_allreduce" 1000 2>&1)
    r=$?
    { echo "pkg-config --cflags --libs cohort: ${flags:-}"; cat "$ex/cc.log"; echo "${out:-}"; } | diag
    [ $r = 0 ] && [ "$exlib" = "$root$lib" ] &&
        echo "$out" | grep -q '^sampler_allreduce: 2 ranks, 1000 samples, 500 per rank, indices seen once: 1000 of 1000$'
    ok $? "$how: the installed example compiles with pkg-config --cflags --libs cohort (-I$root$dir/include) and runs on 2 ranks against $root$lib"

    # the programs: libcohort found through their RUNPATH, not LD_LIBRARY_PATH
    for p in $programs; do
        f=$root$dir/bin/$p
        echo "$p: $(readelf -d "$f" 2>&1 | grep -i -E 'rpath|runpath' | sed 's/.*: //')" | diag
        env -u LD_LIBRARY_PATH ldd "$f" 2>&1 | grep -q -F "libcohort.so.0 => $lib/libcohort.so.0 " ||
            missing="$missing $p"
    done
    out=$(env -u LD_LIBRARY_PATH COHORT_LOG_LEVEL=warn "$root$dir/bin/cohort-train" --help 2>&1 | head -n 1)
    [ -z "$missing" ] && echo "$out" | grep -q '^Usage: cohort-train '
    ok $? "$how: without LD_LIBRARY_PATH the 5 programs load $lib/libcohort.so.0 and cohort-train --help runs${missing:+ (not:$missing)}"
}
if [ -n "$stage" ]; then
    check_tree "configure --prefix=$prefix; make install" "" "$prefix" "$other" "$stage"
    check_tree "make install DESTDIR=$stage" "$stage" "$prefix" "$other" "$stage"
    check_tree "make install prefix=$other" "" "$other" "$prefix" "$stage"
else
    check_tree "installed" "" "$prefix"
fi

# ---- a fresh login shell with Lmod
# fresh SCRIPT: bash -l with an empty environment (only HOME, a system PATH
# and what /etc/profile gives), in $T/home.
mkdir -p "$T/home"
fresh() {
    env -i HOME="$T/home" PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 TERM=dumb \
        MPIEXEC="$MPIEXEC" SAN="$san" MODDIR="$datadir/modulefiles" PKGDATA="$pkgdatadir" \
        bash -l -c 'cd "$HOME" || exit 1
'"$1"
}
lmod_init=/usr/share/lmod/lmod/init/bash
if [ ! -r "$lmod_init" ]; then
    for d in "module load cohort" "cohort-train --help and man cohort-train after module load" \
        "the example built with pkg-config and run on 2 ranks" "module unload cohort"; do
        skip "$d" "Lmod not installed (Debian: lmod)"
    done
else
    out=$(fresh '. '"$lmod_init"' || exit 1
        command -v cohort-train && exit 1
        module use "$MODDIR" && module load cohort || exit 1
        module -t list 2>&1
        echo "train=$(command -v cohort-train)"
        echo "PKG_CONFIG_PATH=$PKG_CONFIG_PATH"; echo "MANPATH=$MANPATH"
        echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; echo "COHORT_SHARE=$COHORT_SHARE"' 2>&1)
    r=$?
    echo "$out" | diag
    [ $r = 0 ] && echo "$out" | grep -q "^cohort/$version\$" &&
        echo "$out" | grep -q "^train=$prefix/bin/cohort-train\$" &&
        echo "$out" | grep -q "^PKG_CONFIG_PATH=$libdir/pkgconfig" &&
        echo "$out" | grep -q "^MANPATH=$datadir/man" &&
        echo "$out" | grep -q "^LD_LIBRARY_PATH=$libdir" &&
        echo "$out" | grep -q "^COHORT_SHARE=$pkgdatadir\$"
    ok $? "fresh login shell: no cohort-train before; module use + module load cohort/$version set PATH, PKG_CONFIG_PATH, MANPATH, LD_LIBRARY_PATH, COHORT_SHARE"

    out=$(fresh '. '"$lmod_init"'; module use "$MODDIR"; module load cohort || exit 1
        COHORT_LOG_LEVEL=warn cohort-train --help | head -n 1 || exit 1
        MANWIDTH=80 man cohort-train | grep -A1 "^NAME" | tail -n 1
        MANWIDTH=80 man cohort-train | grep -c -e "--train\."
        MANWIDTH=80 man 7 cohort | grep -A1 "^NAME" | tail -n 1' 2>&1)
    r=$?
    echo "$out" | diag
    [ $r = 0 ] && echo "$out" | grep -q '^Usage: cohort-train ' &&
        echo "$out" | grep -q '^ *cohort-train - ' && echo "$out" | grep -q '^ *cohort - ' &&
        [ "$(echo "$out" | sed -n '3p')" -gt 0 ] 2>/dev/null
    ok $? "after module load: cohort-train --help, man cohort-train (its train.* keys), man 7 cohort"

    out=$(fresh '. '"$lmod_init"'; module use "$MODDIR"; module load cohort || exit 1
        cp -r "$PKGDATA/examples" ex && cd ex || exit 1
        make CFLAGS="-O2 -Wall -Wextra -Werror $SAN" LDFLAGS="$SAN" || exit 1
        c++ -x c++ -std=c++11 -Wall -Wextra -Werror $SAN -o sampler_allreduce_cxx sampler_allreduce.c \
            -x none $(pkg-config --cflags --libs cohort) || exit 1
        "$MPIEXEC" -n 2 ./sampler_allreduce 1000 || exit 1
        "$MPIEXEC" -n 2 ./sampler_allreduce_cxx 998 || exit 1
        "$MPIEXEC" -n 2 ./sampler_allreduce 999; echo "odd n: status $?"
        c++ -x c++ -std=c++11 -Wall -Wextra -Werror $SAN -o fmnist_cnn_cxx fmnist_cnn.c \
            -x none $(pkg-config --cflags --libs cohort) || exit 1
        ./fmnist_cnn --help | head -n 1; ./fmnist_cnn_cxx --help | grep -c "^ *--model.arch"' 2>&1)
    r=$?
    echo "$out" | diag
    [ $r = 0 ] &&
        echo "$out" | grep -q '^sampler_allreduce: 2 ranks, 1000 samples, 500 per rank, indices seen once: 1000 of 1000$' &&
        echo "$out" | grep -q '^sampler_allreduce: 2 ranks, 998 samples, 499 per rank, indices seen once: 998 of 998$' &&
        echo "$out" | grep -q '^odd n: status 2$' &&
        echo "$out" | grep -q '^Usage: fmnist_cnn '
    ok $? "the installed examples, built with pkg-config --cflags --libs cohort as C (their Makefile) and C++: sampler_allreduce on 2 ranks sees every index once; fmnist_cnn (its own CNN on the library's trainer) has cohort-train's command line"

    out=$(fresh '. '"$lmod_init"'; module use "$MODDIR"; module load cohort; module unload cohort
        command -v cohort-train; echo "PKG_CONFIG_PATH=${PKG_CONFIG_PATH:-}"' 2>&1)
    echo "$out" | diag
    ! echo "$out" | grep -q -e "$prefix"
    ok $? "module unload cohort takes $prefix off every path again"
fi

# ---- the installed template on the Slurm test cluster
data=/usr/share/datasets/fashion-mnist
why=
for t in slurmctld slurmd munged mungekey srun sbatch scontrol; do
    command -v "$t" >/dev/null 2>&1 || why="slurm not installed (missing $t; Debian: slurm-wlm munge)"
done
[ -z "$why" ] && [ "$(id -u)" != 0 ] && why="the slurm test cluster needs root"
[ -z "$why" ] && [ ! -r "$data/train-images-idx3-ubyte.gz" ] &&
    why="Fashion-MNIST not installed in $data (Debian: dataset-fashion-mnist)"
if [ -n "$why" ]; then
    skip "the installed cpu-1node.sbatch runs the installed cohort-train on the test cluster" "$why"
else
    cluster_up c --nodes 1 --cpus 4
    r=$?
    ok $r "1-node test cluster comes up (the installed testcluster's source, slurm/testcluster)"
    make_workdir w
    cat >"$w/tiny.cfg" <<EOF
# cohort-train on a small Fashion-MNIST subset (tests/test_install.sh)
model = { arch = "smallcnn"; };
data = { train_subset = 64; test_subset = 32; workers = 1; };
train = { batch_size = 16; };
schedule = { epochs = 1; };
EOF
    # submitted from a shell whose PATH has no cohort and no COHORT_BIN
    jid=$(cd "$w" && env -i HOME="$T/home" PATH=/usr/bin:/bin SLURM_CONF="$SLURM_CONF" \
        sbatch --parsable "$tpl" tiny.cfg --set data.path="$data" | cut -d';' -f1)
    wait_job_state "$jid" 180 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY
    outfile=$w/cohort-cpu-$jid.out
    grep -v '^ ' "$outfile" 2>/dev/null | diag
    [ "$job_state" = COMPLETED ] && [ "$(job_field "$jid" ExitCode)" = 0:0 ] &&
        ls "$w/runs/cohort-cpu-$jid"/model-*.safetensors >/dev/null 2>&1
    ok $? "sbatch $tpl (PATH without cohort): job $jid $job_state, 2 ranks of the installed cohort-train, a model file in runs/cohort-cpu-$jid"
fi
finish
