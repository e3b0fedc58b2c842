#!/usr/bin/env python3
"""cohort-reduce: the memory-mapped read path (reduce.mmap, issue #23), TAP.

The mapped path (default) and the pread path (--mmap false) must give the
same bits for the same chunk layout, in fast and exact mode: dtypes, byte
orders, C/F order, shapes and axes, 1 and 2 ranks, chunk sizes that cut
pages and rows anywhere; raw input with an aligned offset (mapped) and an
odd one (read: the elements would not be aligned), shards, HDF5 (read)
where h5py imports. Checks that chunks are in fact mapped (the debug line),
that a stop + resume across the two modes gives the bits of one run, and
that resident memory stays bounded by a few chunks on a file larger than
the chunk buffers (max RSS from /usr/bin/time -f %M).

Environment: REDUCE_BIN (the program), MPIEXEC, TMPDIR.
"""
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reduce_tap as R  # noqa: E402
from reduce_tap import BIN, path, tap  # noqa: E402,F401

TMP = R.init("test_reduce_mmap.")
rng = np.random.default_rng(23)


def run(args, np_=1, env=None):
    return R.run(args, np_, check=False, env=env)


def same_bits(x, y):
    x, y = np.asarray(x), np.asarray(y)
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


DEBUG = dict(os.environ, COHORT_LOG_LEVEL="debug")


def both(inputs, op, axis, mode, chunk_mb, np_=1, extra=()):
    """(result with mmap, result without, mapped chunk count of the mmap run, texts)"""
    res, mapped, texts = [], None, []
    for mm in ("true", "false"):
        out = path("o_%s.npy" % mm)
        if os.path.exists(out):
            os.unlink(out)
        args = ["--op", op, "--mode", mode, "--chunk_mb", chunk_mb, "--mmap", mm,
                "--out", out] + list(extra) + list(inputs)
        if axis is not None:
            args += ["--axis", ",".join(str(a) for a in axis) if isinstance(axis, tuple) else str(axis)]
        p = run(args, np_, env=DEBUG)
        texts.append(p.stdout)
        if p.returncode != 0:
            return None, None, None, "exit %d\n%s" % (p.returncode, p.stdout)
        res.append(np.load(out))
        if mm == "true":
            m = re.search(r"(\d+) chunks memory-mapped", p.stdout)
            mapped = int(m.group(1)) if m else -1
    return res[0], res[1], mapped, "\n".join(t[-800:] for t in texts)


def case(name, inputs, ops, axes, np_=1, chunk_mb="0.003", expect_mapped=True, extra=()):
    bad = []
    for op in ops:
        for axis in axes:
            for mode in ("fast", "exact"):
                a, b, mapped, text = both(inputs, op, axis, mode, chunk_mb, np_, extra)
                if a is None:
                    bad.append("%s axis %s %s: %s" % (op, axis, mode, text))
                    continue
                if not same_bits(a, b):
                    bad.append("%s axis %s %s: mmap %r vs pread %r" % (op, axis, mode, a, b))
                if (mapped > 0) != expect_mapped:
                    bad.append("%s axis %s %s: %d chunks mapped on rank 0, expected %s\n%s" % (
                        op, axis, mode, mapped, "some" if expect_mapped else "none", text))
    tap(not bad, "mmap on/off same bits: %s" % name, "\n".join(bad))


def save(name, a, fortran=False):
    p = path(name)
    np.save(p, np.asfortranarray(a) if fortran else a)
    return p


# ------------------------------------------------ dtypes, orders, shapes, axes
x = rng.normal(3, 2, (301, 37))
case("float64 (301, 37) C", [save("f8.npy", x)], ["sum", "mean", "var"], [None, 0, 1])
case("float64 (301, 37) C, 2 ranks", [path("f8.npy")], ["mean", "std"], [0, None], np_=2)
case("float64 (301, 37) Fortran order", [save("f8f.npy", x, fortran=True)], ["mean", "var"], [0, 1])
case("float64 big-endian", [save("f8be.npy", x.astype(">f8"))], ["sum", "mean"], [0, None])
case("float32 (13, 7, 11)", [save("f4.npy", rng.normal(0, 1, (13, 7, 11)).astype(np.float32))],
     ["sum", "mean", "var"], [None, 0, (0, 2), -1])
case("float16 (500,)", [save("f2.npy", rng.normal(0, 1, 500).astype(np.float16))],
     ["sum", "mean"], [None])
case("int32 (200, 9)", [save("i4.npy", rng.integers(-1000, 1000, (200, 9)).astype(np.int32))],
     ["sum", "mean", "argmax", "min"], [0, 1])
case("uint64 (90, 5), 2 ranks", [save("u8.npy", rng.integers(0, 2**63, (90, 5), dtype=np.uint64))],
     ["sum", "max"], [0, None], np_=2)
case("bool (64, 3)", [save("b1.npy", rng.random((64, 3)) > 0.5)], ["sum", "count_nonzero"], [0])
case("float64 nan-ops and histogram", [save("nan.npy", np.where(rng.random((120, 8)) < 0.1, np.nan,
                                                                  rng.normal(0, 1, (120, 8))))],
     ["nanmean", "nanvar", "nanmax"], [0])
case("histogram", [path("f8.npy")], ["histogram"], [None], extra=("--bins", "17"))
case("chunk_mb 1 (one chunk per rank), 2 ranks", [path("f8.npy")], ["mean"], [0], np_=2, chunk_mb="1")

# shards (a C and a Fortran one, different byte orders)
s0 = save("s0.npy", x[:100])
s1 = save("s1.npy", x[100:].astype(">f8"), fortran=True)
case("shards", [s0, s1], ["mean", "var"], [0, None], np_=2)

# raw binary: offset 16 (aligned: mapped) and offset 3 (unaligned: read)
for off, mapped in ((16, True), (3, False)):
    raw = path("raw%d.bin" % off)
    with open(raw, "wb") as f:
        f.write(b"\0" * off)
        f.write(x.astype("<f8").tobytes())
    case("raw float64 offset %d (%s)" % (off, "mapped" if mapped else "read"), [raw], ["mean"], [0],
         expect_mapped=mapped, extra=("--dtype", "f8", "--shape", "301x37", "--offset", str(off)))

try:
    import h5py
    have_h5 = True
except ImportError:
    have_h5 = False
if have_h5:
    h5 = path("d.h5")
    with h5py.File(h5, "w") as f:
        f.create_dataset("x", data=x)
    probe = run(["--op", "sum", "--out", path("probe.npy"), h5 + ":/x"])
    if probe.returncode == 0:
        case("HDF5 dataset (read, not mapped)", [h5 + ":/x"], ["mean"], [0], expect_mapped=False)
    else:
        tap(True, "HDF5 dataset # SKIP built without HDF5")
else:
    tap(True, "HDF5 dataset # SKIP h5py not found")

# ---------------------------------------------- a stop + resume across the modes
big = save("big.npy", rng.normal(10, 0.1, (4000, 500)))
ref = run(["--op", "var", "--axis", "0", "--out", path("ref.npy"), big])
ref_a = np.load(path("ref.npy")) if ref.returncode == 0 else None
for first, second in (("true", "false"), ("false", "true")):
    out = path("res_%s.npy" % first)
    args = ["--op", "var", "--axis", "0", "--chunk_mb", "0.002", "--out", out, big]
    hold = path("hold_" + first)
    os.makedirs(hold, exist_ok=True)
    env = dict(os.environ, COHORT_TEST_HOLD="sync:1:" + hold)
    log = open(path("term_%s.log" % first), "w+")
    p = subprocess.Popen([BIN] + args + ["--mmap", first], stdout=log, stderr=subprocess.STDOUT, env=env)

    def hold_wait(name):
        deadline = time.time() + 60
        while time.time() < deadline and p.poll() is None and not os.path.exists(os.path.join(hold, name)):
            time.sleep(0.01)
    hold_wait("held.0")
    p.send_signal(signal.SIGTERM)
    hold_wait("signal.0")
    open(os.path.join(hold, "release"), "w").close()
    p.wait()
    r2 = run(args + ["--mmap", second, "--resume"]) if p.returncode == 3 else None
    got = np.load(out) if r2 is not None and r2.returncode == 0 else None
    log.seek(0)
    tap(p.returncode == 3 and got is not None and ref_a is not None and same_bits(got, ref_a),
        "stopped with mmap %s, resumed with mmap %s: the bits of one run" % (first, second),
        "exit %s\n%s\n%s" % (p.returncode, log.read()[-1500:], r2.stdout if r2 else ""))

# ---------------------------------------------- a file written in place during the run
# held after the first agreement, the input gets new bytes in place (the
# same inode: the open descriptor reads them): the run ends with exit 1
# naming the file, and writes no result (it would mix old and new data)
for mmf in ("true", "false"):
    victim = save("victim_%s.npy" % mmf, rng.normal(0, 1, (4000, 500)))
    out = path("victim_out_%s.npy" % mmf)
    hold = path("hold_victim_" + mmf)
    os.makedirs(hold, exist_ok=True)
    env = dict(os.environ, COHORT_TEST_HOLD="sync:1:" + hold)
    p = subprocess.Popen([BIN, "--op", "sum", "--axis", "0", "--chunk_mb", "0.002", "--mmap", mmf,
                          "--out", out, victim], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=env)
    deadline = time.time() + 60
    while time.time() < deadline and p.poll() is None and not os.path.exists(os.path.join(hold, "held.0")):
        time.sleep(0.01)
    with open(victim, "r+b") as f:  # in place: the last 8 bytes become 1.0
        f.seek(-8, os.SEEK_END)
        f.write(np.float64(1.0).tobytes())
    open(os.path.join(hold, "release"), "w").close()
    text = p.communicate(timeout=120)[0]
    tap(p.returncode == 1 and "was modified while it was being read" in text and victim in text
        and not os.path.exists(out),
        "an input written in place during the run (mmap %s): exit 1 naming it, no result" % mmf,
        "exit %s\n%s" % (p.returncode, text[-1500:]))

# the same, and a stop (SIGTERM) asked before the next agreement: no state of
# the mixed contents is saved for a --resume that would refuse it; exit 1
victim = save("victim_stop.npy", rng.normal(0, 1, (4000, 500)))
out = path("victim_stop_out.npy")
hold = path("hold_victim_stop")
os.makedirs(hold, exist_ok=True)
env = dict(os.environ, COHORT_TEST_HOLD="sync:1:" + hold)
p = subprocess.Popen([BIN, "--op", "var", "--axis", "0", "--chunk_mb", "0.002", "--out", out, victim],
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
deadline = time.time() + 60
while time.time() < deadline and p.poll() is None and not os.path.exists(os.path.join(hold, "held.0")):
    time.sleep(0.01)
with open(victim, "r+b") as f:
    f.seek(-8, os.SEEK_END)
    f.write(np.float64(1.0).tobytes())
p.send_signal(signal.SIGTERM)
deadline = time.time() + 60
while time.time() < deadline and p.poll() is None and not os.path.exists(os.path.join(hold, "signal.0")):
    time.sleep(0.01)
open(os.path.join(hold, "release"), "w").close()
text = p.communicate(timeout=120)[0]
tap(p.returncode == 1 and "was modified while it was being read" in text and "state saved" not in text
    and not os.path.exists(out + ".state"),
    "a stop after an in-place write: exit 1 naming the input, no state saved",
    "exit %s\n%s" % (p.returncode, text[-1500:]))

# ---------------------------------------------- resident memory stays bounded
# a 96 MiB file, 1 MiB chunks (3 in flight): the mapped pages are dropped
# after each chunk, so the max RSS is the program's own plus a few MiB, far
# below the file (the pages stay in the page cache, which RSS does not count
# once unmapped)
n_rows = 96 * 1024 * 1024 // (8 * 1024)
mem = path("mem.npy")
mm = np.lib.format.open_memmap(mem, "w+", np.float64, (n_rows, 1024))
for i in range(0, n_rows, 2048):
    mm[i:i + 2048] = 1.0
mm.flush()
del mm
for mmf in ("true", "false"):
    for mode in ("fast", "exact"):
        t = subprocess.run(["/usr/bin/time", "-f", "maxrss %M", BIN, "--op", "mean", "--axis", "0",
                            "--mode", mode, "--chunk_mb", "1", "--mmap", mmf,
                            "--out", path("mem_out.npy"), mem],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        m = re.search(r"maxrss (\d+)", t.stdout)
        kb = int(m.group(1)) if m else 1 << 30
        ok = t.returncode == 0 and np.all(np.load(path("mem_out.npy")) == 1.0)
        tap(ok and kb < 64 * 1024, "max RSS with mmap %s, %s mean of a 96 MiB file, 1 MiB chunks: "
            "%.1f MiB (< 64)" % (mmf, mode, kb / 1024.0), t.stdout[-1000:])

print("1..%d" % R.n_test)
if R.failed == 0:
    import shutil
    shutil.rmtree(TMP, ignore_errors=True)
sys.exit(1 if R.failed else 0)
