/* Benchmark (a program, not a test): where an OpenMP parallel region pays
 * for itself on this machine, the figure behind CH_CPU_PAR_MIN
 * (framework/ops/cpu/cpu.h). For n = 512 .. 2^20 floats it times a ReLU
 * loop (the CPU backend's elementwise loop shape: chunks of 16 lanes) over n
 * floats on the calling thread and split over THREADS threads in a parallel
 * region (pieces aligned to 64 floats, as ch_cpu_split), and prints the
 * medians of 301 timings per size, microseconds per call, against the floats
 * touched (2n: read x, write y).
 *
 *   tests/bench_omp_fork [THREADS]     (default 2)
 *
 * docs/perf-isa.md, "Threaded batch-norm, ReLU, pooling and add loops".
 */
#include "config.h"

#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define V 16

__attribute__((noinline)) static void relu(float *y, const float *x, int64_t n)
{
    int64_t i = 0;
    for (; i + V <= n; i += V) {
        float t[V];
        for (int l = 0; l < V; l++) t[l] = x[i + l] < 0.0f ? 0.0f : x[i + l];
        for (int l = 0; l < V; l++) y[i + l] = t[l];
    }
    for (; i < n; i++) y[i] = x[i] < 0.0f ? 0.0f : x[i];
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    if (threads < 1) {
        fprintf(stderr, "usage: %s [THREADS >= 1]\n", argv[0]);
        return 2;
    }
    enum { R = 301 };
    const int64_t nmax = (int64_t)1 << 20;
    float *x = aligned_alloc(64, (size_t)nmax * sizeof *x);
    float *y = aligned_alloc(64, (size_t)nmax * sizeof *y);
    static double ts[R], tp[R];
    if (!x || !y) {
        fprintf(stderr, "%s: out of memory\n", argv[0]);
        return 1;
    }
    for (int64_t i = 0; i < nmax; i++) x[i] = (float)(i % 7) - 3.0f;
    omp_set_num_threads(threads);
#pragma omp parallel
    y[omp_get_thread_num()] = 0.0f; /* start the team */
    printf("%d threads; floats touched, serial us, parallel us (medians of %d)\n", threads, R);
    for (int64_t n = 512; n <= nmax; n *= 2) {
        int reps = (int)(2000000 / n) + 1;
        for (int r = 0; r < R; r++) {
            double t0 = now();
            for (int k = 0; k < reps; k++) relu(y, x, n);
            double t1 = now();
            for (int k = 0; k < reps; k++) {
#pragma omp parallel
                {
                    int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
                    int64_t units = (n + 63) / 64, per = units / nt, extra = units % nt;
                    int64_t u0 = t * per + (t < extra ? t : extra), u1 = u0 + per + (t < extra);
                    int64_t i0 = u0 * 64 < n ? u0 * 64 : n, i1 = u1 * 64 < n ? u1 * 64 : n;
                    relu(y + i0, x + i0, i1 - i0);
                }
            }
            double t2 = now();
            ts[r] = (t1 - t0) / reps * 1e6;
            tp[r] = (t2 - t1) / reps * 1e6;
        }
        qsort(ts, R, sizeof *ts, cmp);
        qsort(tp, R, sizeof *tp, cmp);
        printf("%8lld %9.2f %9.2f\n", (long long)(2 * n), ts[R / 2], tp[R / 2]);
    }
    free(x);
    free(y);
    return 0;
}
