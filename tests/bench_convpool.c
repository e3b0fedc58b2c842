/* bench_convpool: wall time of the convolution and pooling variants
 * (depthwise, grouped, dilated Conv2d; AvgPool2d with ceil_mode;
 * AdaptiveAvgPool2d to (h, w)), forward + backward, one line per case, for
 * comparison with tests/bench_convpool.py (the same shapes in PyTorch).
 * tests/test_cpu_isa.sh runs it under DNNL_VERBOSE=1 to check that no
 * reference oneDNN kernel is used.
 *
 * Usage: bench_convpool [--threads T=1] [--batch N=32] [--trials R=7]
 *                       [--only NAME]
 * Each figure: median over R trials of the wall time (ms) of one forward +
 * backward data + backward weights (convolutions: weights with bias) or
 * forward + backward (pooling), activations in the context's preferred
 * layout; one untimed warm-up call first. A benchmark, not a test
 * (docs/perf-ops.md). Prints the compute description first ("isa ...").
 */
#include "config.h"

#include "framework/ops/ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DIE(s)                                                                         \
    do {                                                                               \
        ch_status s_ = (s);                                                            \
        if (s_ != CH_OK) {                                                             \
            fprintf(stderr, "bench_convpool: %s\n", ch_error_message());               \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng = 88172645463325252ull;

static void fill(ch_tensor_t *t)
{
    float *p = t->data;
    for (int64_t i = 0; i < ch_tensor_numel(t); i++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        p[i] = (float)((double)(rng >> 11) / 9007199254740992.0 - 0.5);
    }
}

/* kind: 0 conv, 1 avgpool2d, 2 adaptive avgpool */
typedef struct {
    const char *name;
    int kind;
    int64_t C, H, O;
    int k, s, p, d, g;   /* conv; pooling: k, s, p, ceil in d; adaptive: output k x k */
} bcase;

static const bcase CASES[] = {
    {"dw3x3_c64_56", 0, 64, 56, 64, 3, 1, 1, 1, 64},
    {"dw3x3_s2_c64_56", 0, 64, 56, 64, 3, 2, 1, 1, 64},
    {"dw3x3_c256_14", 0, 256, 14, 256, 3, 1, 1, 1, 256},
    {"group4_3x3_c64_28", 0, 64, 28, 64, 3, 1, 1, 1, 4},
    {"dil2_3x3_c64_28", 0, 64, 28, 64, 3, 1, 2, 2, 1},
    {"dil2_dw3x3_c64_28", 0, 64, 28, 64, 3, 1, 2, 2, 64},
    {"avgpool3x3_s2_ceil_c64_28", 1, 64, 28, 64, 3, 2, 1, 1, 0},
    {"adaptive7_c64_28", 2, 64, 28, 64, 7, 0, 0, 0, 0},
};

int main(int argc, char **argv)
{
    int threads = 1, trials = 7;
    int64_t N = 32;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) N = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--trials") && i + 1 < argc) trials = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else {
            fprintf(stderr, "usage: bench_convpool [--threads T] [--batch N] [--trials R] "
                            "[--only NAME]\n");
            return 2;
        }
    }
    if (threads < 1 || trials < 1 || trials > 101 || N < 1) {
        fprintf(stderr, "bench_convpool: threads, batch >= 1 and 1 <= trials <= 101 expected\n");
        return 2;
    }
    ch_compute_t *cx = NULL;
    ch_compute_options_t o;
    ch_compute_options_default(&o);
    o.num_threads = threads;
    DIE(ch_compute_create(&o, &cx));
    char desc[256];
    printf("# %s\n", ch_compute_describe(cx, desc, sizeof desc));
    printf("# batch %lld, median of %d trials, ms per forward + backward\n", (long long)N, trials);
    for (size_t ci = 0; ci < sizeof CASES / sizeof CASES[0]; ci++) {
        const bcase *c = &CASES[ci];
        if (only && strcmp(only, c->name)) continue;
        ch_layout_t L = ch_compute_preferred_layout(cx, CH_DEV_CPU, c->C);
        ch_conv2d_params_t cp = {c->s, c->s, c->p, c->p, c->d, c->d, c->g};
        ch_pool2d_params_t pp = {c->k, c->k, c->s, c->s, c->p, c->p, c->d, 1};
        int64_t Ho;
        if (c->kind == 0) Ho = ch_conv_out_size_dilated(c->H, c->k, c->s, c->p, c->d);
        else if (c->kind == 1) Ho = ch_pool_out_size(c->H, c->k, c->s, c->p, c->d);
        else Ho = c->k;
        int64_t xs[4] = {N, c->C, c->H, c->H}, ys[4] = {N, c->O, Ho, Ho};
        int64_t ws[4] = {c->O, c->C / (c->g > 0 ? c->g : 1), c->k, c->k}, bs[1] = {c->O};
        ch_tensor_t x, y, dy, dx, w, dw, b, db;
        DIE(ch_tensor_alloc(&x, CH_F32, 4, xs, L, CH_DEV_CPU, 0));
        DIE(ch_tensor_alloc(&dx, CH_F32, 4, xs, L, CH_DEV_CPU, 0));
        DIE(ch_tensor_alloc(&y, CH_F32, 4, ys, L, CH_DEV_CPU, 0));
        DIE(ch_tensor_alloc(&dy, CH_F32, 4, ys, L, CH_DEV_CPU, 0));
        DIE(ch_tensor_alloc_f32(&w, 4, ws));
        DIE(ch_tensor_alloc_f32(&dw, 4, ws));
        DIE(ch_tensor_alloc_f32(&b, 1, bs));
        DIE(ch_tensor_alloc_f32(&db, 1, bs));
        fill(&x);
        fill(&dy);
        fill(&w);
        fill(&b);
        double t[101];
        for (int r = -1; r < trials; r++) {
            double t0 = now();
            if (c->kind == 0) {
                DIE(ch_op_conv2d_forward(cx, &x, &w, &b, &cp, &y));
                DIE(ch_op_conv2d_backward_data(cx, &dy, &w, &cp, &dx));
                DIE(ch_op_conv2d_backward_weights(cx, &x, &dy, &cp, &dw, &db));
            } else if (c->kind == 1) {
                DIE(ch_op_avgpool2d_forward(cx, &x, &pp, &y));
                DIE(ch_op_avgpool2d_backward(cx, &dy, &pp, &dx));
            } else {
                DIE(ch_op_adaptive_avgpool2d_forward(cx, &x, &y));
                DIE(ch_op_adaptive_avgpool2d_backward(cx, &dy, &dx));
            }
            double t1 = now();
            if (r >= 0) t[r] = t1 - t0;
        }
        qsort(t, (size_t)trials, sizeof t[0], cmp_d);
        printf("%-28s %-8s %9.3f ms\n", c->name, ch_layout_name(L), 1e3 * t[trials / 2]);
        ch_tensor_t *all[] = {&x, &y, &dy, &dx, &w, &dw, &b, &db};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ch_tensor_free(all[i]);
    }
    ch_compute_destroy(cx);
    return 0;
}
