#!/usr/bin/env python3
"""cohort-reduce benchmark (docs/PERFORMANCE.md, cohort-reduce rows).

The issue's case: mean(axis=0) and var(axis=0) of a ROWSxCOLS float64 .npy
made with np.random.normal(10, 0.1, ...), warm page cache. Side by side in
one run, REPS rounds interleaved, medians reported:
  read-and-sum  tests/bench_reduce_read (W ranks pread + sum: the machine's
                read bandwidth as a plain program sees it)
  cohort fast / exact  mpiexec -n W jobs/cohort-reduce (end to end: MPI
                start included; "job" = the profile's total wall), with
                reduce.mmap true (the default: chunks memory-mapped) and
                false (pread into buffers); --mmap picks one or both
  mpi start     mpiexec -n W of a program that only does MPI_Init, one
                MPI_Allreduce and MPI_Finalize (tests/bench_reduce_read
                --init-only): the floor of any MPI job's end-to-end time
  numpy         np.load(mmap_mode='r').mean(0) / .var(0) (timed in the
                process; "whole command": python start, imports, load,
                reduction and save, as cohort's end to end)
  dask          da.from_array(mmap, chunks).mean(0).compute() (in process),
                chunks 1000x1000 and 5000x5000, if dask imports (and whole)
Usage: bench_reduce.py [--rows 20000] [--cols 20000] [--ranks 2] [--reps 5]
       [--file /tmp/cohort_bench_reduce.npy] [--python PYTHON_WITH_DASK]
       [--ops mean,var] [--mmap true,false] [--no-readsum]
Run from the build directory; MPIEXEC (environment) names the MPI launcher.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np

MPIEXEC = os.environ.get("MPIEXEC", "mpiexec")
ap = argparse.ArgumentParser()
ap.add_argument("--rows", type=int, default=20000)
ap.add_argument("--cols", type=int, default=20000)
ap.add_argument("--ranks", type=int, default=2)
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--file", default="/tmp/cohort_bench_reduce.npy")
ap.add_argument("--python", default=sys.executable, help="python for numpy/dask timings")
ap.add_argument("--ops", default="mean,var")
ap.add_argument("--mmap", default="true,false", help="reduce.mmap values to run")
ap.add_argument("--no-readsum", action="store_true", help="skip the read-and-sum reference")
a = ap.parse_args()

if not os.path.exists(a.file):
    x = np.lib.format.open_memmap(a.file + ".tmp", "w+", np.float64, (a.rows, a.cols))
    rng = np.random.default_rng(0)
    step = max(1, (1 << 27) // (8 * a.cols))
    for i in range(0, a.rows, step):
        x[i:i + step] = rng.normal(10, 0.1, (min(step, a.rows - i), a.cols))
    x.flush()
    del x
    os.rename(a.file + ".tmp", a.file)
nbytes = os.path.getsize(a.file)
subprocess.run(["cat", a.file], stdout=subprocess.DEVNULL, check=True)  # warm the page cache

INPROC = r"""
import sys, time, numpy as np
f, op, kind = sys.argv[1], sys.argv[2], sys.argv[3]
x = np.load(f, mmap_mode='r')
if kind == 'numpy':
    t = time.perf_counter(); r = getattr(x, op)(axis=0); dt = time.perf_counter() - t
else:
    import dask.array as da
    c = int(kind.split(':')[1])
    d = da.from_array(x, chunks=(c, c))
    t = time.perf_counter(); r = getattr(d, op)(axis=0).compute(); dt = time.perf_counter() - t
np.save(f + '.' + kind.replace(':', '') + '.' + op + '.npy', r)
print(dt)
"""


def inproc(op, kind):
    """(seconds of the reduction in the process, seconds of the whole command)"""
    t = time.perf_counter()
    p = subprocess.run([a.python, "-c", INPROC, a.file, op, kind], capture_output=True, text=True)
    whole = time.perf_counter() - t
    if p.returncode != 0:
        return None, None
    return float(p.stdout.split()[-1]), whole


def cohort(op, mode, mm):
    out = a.file + ".cohort_%s.%s.npy" % (mode, op)
    t = time.perf_counter()
    p = subprocess.run([MPIEXEC, "-n", str(a.ranks), "jobs/cohort-reduce", "--op", op, "--axis", "0",
                        "--mode", mode, "--mmap", mm, "--out", out, a.file],
                       capture_output=True, text=True)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit("cohort-reduce failed:\n" + p.stdout + p.stderr)
    m = re.search(r"total \(wall\)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", p.stdout + p.stderr)
    return dt, float(m.group(3)) if m else float("nan")


def readsum():
    p = subprocess.run([MPIEXEC, "-n", str(a.ranks), "tests/bench_reduce_read", a.file],
                       capture_output=True, text=True, check=True)
    return float(re.search(r"([\d.]+) s,", p.stdout).group(1))


def mpistart():
    t = time.perf_counter()
    subprocess.run([MPIEXEC, "-n", str(a.ranks), "tests/bench_reduce_read", "--init-only"],
                   capture_output=True, text=True, check=True)
    return time.perf_counter() - t


have_dask = subprocess.run([a.python, "-c", "import dask.array"], capture_output=True).returncode == 0
res = {}
mms = a.mmap.split(",")
for rep in range(a.reps):
    if not a.no_readsum:
        res.setdefault("read-and-sum", []).append(readsum())
    res.setdefault("mpi start (init+allreduce+finalize)", []).append(mpistart())
    for op in a.ops.split(","):
        for mm in mms:
            for mode in ("fast", "exact"):
                e2e, job = cohort(op, mode, mm)
                res.setdefault("cohort %s %s mmap=%s (end to end)" % (mode, op, mm), []).append(e2e)
                res.setdefault("cohort %s %s mmap=%s (job wall)" % (mode, op, mm), []).append(job)
        v, w = inproc(op, "numpy")
        res.setdefault("numpy %s" % op, []).append(v)
        res.setdefault("numpy %s (whole command)" % op, []).append(w)
        if have_dask:
            for c in (1000, 5000):
                v, w = inproc(op, "dask:%d" % c)
                if v is not None:
                    res.setdefault("dask %s chunks %d" % (op, c), []).append(v)
                    res.setdefault("dask %s chunks %d (whole command)" % (op, c), []).append(w)

print("# %s: %dx%d float64, %.2f GB, %d ranks, %d reps, medians; host %s, %d CPUs, load %s"
      % (a.file, a.rows, a.cols, nbytes / 1e9, a.ranks, a.reps, os.uname().nodename, os.cpu_count(),
         open("/proc/loadavg").read().split()[0]))
med = {k: statistics.median(v) for k, v in res.items() if None not in v}
for k, v in med.items():
    print("%-38s %8.3f s  %6.2f GB/s   runs %s" % (k, v, nbytes / v / 1e9,
                                                  " ".join("%.3f" % t for t in res[k])))
rs = med.get("read-and-sum")
for op in a.ops.split(","):
    np_t = med.get("numpy %s" % op)
    for mm in mms:
        for mode in ("fast", "exact"):
            c = med["cohort %s %s mmap=%s (end to end)" % (mode, op, mm)]
            print("ratio %s %s mmap=%s: numpy / cohort %.2fx (job wall %.2fx; whole commands %.2fx)%s" % (
                mode, op, mm, np_t / c, np_t / med["cohort %s %s mmap=%s (job wall)" % (mode, op, mm)],
                med["numpy %s (whole command)" % op] / c,
                ", read-and-sum / cohort %.2f" % (rs / c) if rs else ""))
            for ch in (1000, 5000):
                k = "dask %s chunks %d" % (op, ch)
                if k in med:
                    print("ratio %s %s mmap=%s vs %s: %.2fx" % (mode, op, mm, k, med[k] / c))
        print("ratio exact/fast %s mmap=%s: %.2f" % (op, mm, med["cohort fast %s mmap=%s (end to end)" % (op, mm)] /
                                                    med["cohort exact %s mmap=%s (end to end)" % (op, mm)]))
# exact-mode agreement with numpy (not bitwise: numpy is not exact)
for op in a.ops.split(","):
    ce = np.load(a.file + ".cohort_exact.%s.npy" % op)
    nu = np.load(a.file + ".numpy.%s.npy" % op)
    print("exact %s vs numpy: max |diff| %.3g, bitwise equal %.2f%%" % (
        op, float(np.max(np.abs(ce - nu))), 100.0 * float(np.mean(ce == nu))))
