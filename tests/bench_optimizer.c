/* Benchmark (a program, not a test): one CPU optimizer step of
 * ch_optimizer_t (sgd with momentum, adamw, rmsprop: PyTorch defaults) over
 * one parameter of N float32 values (default 25557032, resnet50's
 * parameter count), mean of 5 steps after one warm-up step.
 *   tests/bench_optimizer [threads [N]]
 * The PyTorch twin is the command in docs/PERFORMANCE.md ("Optimizer step"). */
#include "config.h"

#include "framework/ops/ops.h"
#include "framework/train/optimizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    const int threads = argc > 1 ? atoi(argv[1]) : 1;
    const size_t n = argc > 2 ? (size_t)atoll(argv[2]) : 25557032;
    float *p = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
    if (!p || !g) return 1;
    for (size_t i = 0; i < n; i++) {
        p[i] = (float)(i % 97) * 0.01f;
        g[i] = (float)(i % 89) * 0.001f - 0.04f;
    }
    ch_compute_options_t co;
    ch_compute_options_default(&co);
    co.num_threads = threads;
    ch_compute_t *cx;
    if (ch_compute_create(&co, &cx)) return 1;
    for (int k = 0; k < 3; k++) {
        ch_optimizer_options_t o;
        ch_optimizer_options_default((ch_optimizer_kind_t)k, &o);
        if (k == CH_OPTIM_SGD) o.momentum = 0.9;
        ch_optimizer_t *opt;
        if (ch_optimizer_create(&o, &opt) || ch_optimizer_add_param(opt, "w", p, g, n)) {
            fprintf(stderr, "%s\n", ch_error_message());
            return 1;
        }
        ch_optimizer_set_compute(opt, cx);
        ch_status st = ch_optimizer_step(opt);
        const double t0 = now();
        for (int s = 0; s < 5 && st == CH_OK; s++) st = ch_optimizer_step(opt);
        const double t = (now() - t0) / 5;
        if (st) {
            fprintf(stderr, "%s\n", ch_error_message());
            return 1;
        }
        printf("%-8s threads %d  N %zu  %8.1f ms/step  %6.1f Mparam/s\n",
               ch_optimizer_kind_name((ch_optimizer_kind_t)k), threads, n, t * 1e3,
               (double)n / t / 1e6);
        ch_optimizer_destroy(opt);
    }
    ch_compute_destroy(cx);
    free(p);
    free(g);
    return 0;
}
