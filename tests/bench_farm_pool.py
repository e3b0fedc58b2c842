#!/usr/bin/env python3
"""Python references for cohort-farm's function tasks (docs/PERFORMANCE.md):
   bench_farm_pool.py seed RANGE [TASKS]  the seed's example: TASKS (8) tasks,
       task k sums sqrt(x*tanh(x)/log2(x)/log10(x)) for x in
       [2 + k*RANGE, 2 + (k+1)*RANGE), by multiprocessing.Pool(2).apply_async
   bench_farm_pool.py tiny N  N apply_async calls of a function returning
       its argument times 2, Pool(2): tasks/s
"""
import math
import multiprocessing as mp
import sys
import time


def seed_task(k, rng):
    s = 0.0
    for x in range(2 + k * rng, 2 + (k + 1) * rng):
        s += math.sqrt(x * math.tanh(x) / math.log2(x) / math.log10(x))
    return s


def tiny(x):
    return 2 * x


def main():
    mode = sys.argv[1]
    with mp.Pool(2) as pool:
        if mode == "seed":
            rng, n = int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 8
            t0 = time.perf_counter()
            res = [pool.apply_async(seed_task, (k, rng)) for k in range(n)]
            sums = [r.get() for r in res]
            el = time.perf_counter() - t0
            for k, s in enumerate(sums):
                print(f"task {k}: {s!r}")
            print(f"pool seed: {n} tasks x {rng} integers: {el:.3f} s")
        else:
            n = int(sys.argv[2])
            t0 = time.perf_counter()
            res = [pool.apply_async(tiny, (i,)) for i in range(n)]
            out = [r.get() for r in res]
            el = time.perf_counter() - t0
            assert out[-1] == 2 * (n - 1)
            print(f"pool tiny: {n} apply_async: {el:.3f} s, {n / el:.1f} tasks/s")


if __name__ == "__main__":
    main()
