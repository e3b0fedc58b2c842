#!/usr/bin/env python3
"""mpi4py.futures reference for cohort-farm's function tasks
(docs/PERFORMANCE.md): N submit() calls of a function returning its argument
times 2, and map() with chunksize 100, on the workers of
`mpiexec -n 2 python3 -m mpi4py.futures tests/bench_farm_mpi4py.py N`
(rank 0 is the client, rank 1 the worker: 2 ranks as in the farm's runs)."""
import sys
import time

from mpi4py.futures import MPIPoolExecutor


def tiny(x):
    return 2 * x


def main():
    n = int(sys.argv[1])
    with MPIPoolExecutor() as ex:
        ex.submit(tiny, 0).result()  # workers up
        t0 = time.perf_counter()
        fs = [ex.submit(tiny, i) for i in range(n)]
        out = [f.result() for f in fs]
        el = time.perf_counter() - t0
        assert out[-1] == 2 * (n - 1)
        print(f"mpi4py submit: {n} tasks: {el:.3f} s, {n / el:.1f} tasks/s")
        t0 = time.perf_counter()
        out = list(ex.map(tiny, range(n), chunksize=100))
        el = time.perf_counter() - t0
        print(f"mpi4py map chunksize=100: {n} tasks: {el:.3f} s, {n / el:.1f} tasks/s")


if __name__ == "__main__":
    main()
