/* bench_ops_each: CPU time of single ch_op_* calls on resnet18 shapes
 * (batch 64, 1x28x28 input), one line per op, for comparison with
 * tests/bench_ops_each.py (the same ops in PyTorch, same shapes).
 *
 * Usage: bench_ops_each [threads=1] [trials=7]
 * Each figure: median over `trials` of (process CPU time of R calls) / R,
 * in milliseconds, activations in the preferred layout. A benchmark, not a
 * test (docs/perf-ops.md).
 */
#include "config.h"

#include "framework/ops/ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DIE(s)                                                                      \
    do {                                                                            \
        ch_status s_ = (s);                                                         \
        if (s_ != CH_OK) {                                                          \
            fprintf(stderr, "bench_ops_each: %s:%d: %s\n", __FILE__, __LINE__,      \
                    ch_error_message());                                            \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static ch_compute_t *cx;
static int trials = 7;
static uint64_t rng = 88172645463325252ull;

static float urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static void rnd(ch_tensor_t *t)
{
    float *p = t->data;
    for (int64_t i = 0; i < ch_tensor_numel(t); i++) p[i] = urand();
}

static void act(ch_tensor_t *t, int64_t N, int64_t C, int64_t H, int64_t W)
{
    int64_t s[4] = {N, C, H, W};
    DIE(ch_tensor_alloc(t, CH_F32, 4, s, ch_compute_preferred_layout(cx, CH_DEV_CPU, C),
                        CH_DEV_CPU, 0));
    rnd(t);
}

static void plain(ch_tensor_t *t, int nd, const int64_t *s)
{
    DIE(ch_tensor_alloc_f32(t, nd, s));
    rnd(t);
}

typedef ch_status (*op_fn)(void *);

static void timeit(const char *name, op_fn f, void *arg)
{
    DIE(f(arg)); /* warm-up: creates and caches the primitive */
    double t0 = cpu_now();
    DIE(f(arg));
    double one = cpu_now() - t0;
    int reps = one > 0 ? (int)(0.05 / one) : 100; /* ~50 ms per trial */
    if (reps < 1) reps = 1;
    if (reps > 1000) reps = 1000;
    double r[64];
    for (int t = 0; t < trials; t++) {
        double c0 = cpu_now();
        for (int i = 0; i < reps; i++) DIE(f(arg));
        r[t] = (cpu_now() - c0) / reps;
    }
    qsort(r, (size_t)trials, sizeof r[0], cmp_d);
    printf("%-34s %9.3f ms\n", name, r[trials / 2] * 1e3);
    fflush(stdout);
}

/* ---- convolution */
typedef struct {
    ch_tensor_t x, w, y, dy, dx, dw;
    ch_conv2d_params_t p;
} conv_case;

static void conv_setup(conv_case *c, int64_t N, int64_t C, int64_t H, int64_t O, int k, int s,
                       int pad)
{
    int64_t Ho = ch_conv_out_size(H, k, s, pad);
    act(&c->x, N, C, H, H);
    act(&c->dx, N, C, H, H);
    act(&c->y, N, O, Ho, Ho);
    act(&c->dy, N, O, Ho, Ho);
    int64_t ws[4] = {O, C, k, k};
    plain(&c->w, 4, ws);
    plain(&c->dw, 4, ws);
    c->p = (ch_conv2d_params_t){s, s, pad, pad};
}

static ch_status conv_f(void *a)
{
    conv_case *c = a;
    return ch_op_conv2d_forward(cx, &c->x, &c->w, NULL, &c->p, &c->y);
}
static ch_status conv_bd(void *a)
{
    conv_case *c = a;
    return ch_op_conv2d_backward_data(cx, &c->dy, &c->w, &c->p, &c->dx);
}
static ch_status conv_bw(void *a)
{
    conv_case *c = a;
    return ch_op_conv2d_backward_weights(cx, &c->x, &c->dy, &c->p, &c->dw, NULL);
}

static void conv_free(conv_case *c)
{
    ch_tensor_free(&c->x);
    ch_tensor_free(&c->w);
    ch_tensor_free(&c->y);
    ch_tensor_free(&c->dy);
    ch_tensor_free(&c->dx);
    ch_tensor_free(&c->dw);
}

/* ---- activations: bn, relu, pool */
typedef struct {
    ch_tensor_t x, y, dy, dx, w, b, mean, var, dw, db, py, pdy;
    ch_pool2d_params_t pp;
} act_case;

static ch_status bn_f(void *a)
{
    act_case *c = a;
    return ch_op_batchnorm_forward_train(cx, &c->x, &c->w, &c->b, 1e-5f, &c->y, &c->mean, &c->var);
}
static ch_status bn_b(void *a)
{
    act_case *c = a;
    return ch_op_batchnorm_backward(cx, &c->x, &c->dy, &c->mean, &c->var, 1e-5f, &c->w, &c->dx,
                                    &c->dw, &c->db);
}
static ch_status relu_f(void *a)
{
    act_case *c = a;
    return ch_op_relu_forward(cx, &c->x, &c->y);
}
static ch_status relu_b(void *a)
{
    act_case *c = a;
    return ch_op_relu_backward(cx, &c->y, &c->dy, &c->dx);
}
static ch_status pool_f(void *a)
{
    act_case *c = a;
    return ch_op_maxpool2d_forward(cx, &c->x, &c->pp, &c->py);
}
static ch_status pool_b(void *a)
{
    act_case *c = a;
    return ch_op_maxpool2d_backward(cx, &c->x, &c->pdy, &c->pp, &c->dx);
}

/* ---- head: avgpool, linear, loss */
typedef struct {
    ch_tensor_t x, dx, pooled, dpooled, w, b, dw, db, logits, dlogits, labels, loss;
} head_case;

static ch_status gap_f(void *a)
{
    head_case *c = a;
    return ch_op_avgpool_global_forward(cx, &c->x, &c->pooled);
}
static ch_status gap_b(void *a)
{
    head_case *c = a;
    return ch_op_avgpool_global_backward(cx, &c->dpooled, &c->dx);
}
static ch_status fc_f(void *a)
{
    head_case *c = a;
    return ch_op_linear_forward(cx, &c->pooled, &c->w, &c->b, &c->logits);
}
static ch_status fc_b(void *a)
{
    head_case *c = a;
    CH_TRY(ch_op_linear_backward_data(cx, &c->dlogits, &c->w, &c->dpooled));
    return ch_op_linear_backward_weights(cx, &c->pooled, &c->dlogits, &c->dw, &c->db);
}
static ch_status ce(void *a)
{
    head_case *c = a;
    return ch_op_cross_entropy(cx, &c->logits, &c->labels, &c->loss, &c->dlogits);
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    trials = argc > 2 ? atoi(argv[2]) : 7;
    if (trials < 1 || trials > 64) trials = 7;
    ch_compute_options_t o;
    ch_compute_options_default(&o);
    o.num_threads = threads;
    DIE(ch_compute_create(&o, &cx));
    char d[256];
    printf("# %s\n", ch_compute_describe(cx, d, sizeof d));

    struct {
        const char *name;
        int64_t C, H, O;
        int k, s, p;
    } convs[] = {
        {"conv stem 1->64 7x7/2 28", 1, 28, 64, 7, 2, 3},
        {"conv 64->64 3x3 7x7", 64, 7, 64, 3, 1, 1},
        {"conv 128->128 3x3 4x4", 128, 4, 128, 3, 1, 1},
        {"conv 128->256 3x3/2 4x4", 128, 4, 256, 3, 2, 1},
        {"conv 256->256 3x3 2x2", 256, 2, 256, 3, 1, 1},
        {"conv 512->512 3x3 1x1", 512, 1, 512, 3, 1, 1},
    };
    for (size_t i = 0; i < sizeof convs / sizeof convs[0]; i++) {
        conv_case c;
        char n[96];
        conv_setup(&c, 64, convs[i].C, convs[i].H, convs[i].O, convs[i].k, convs[i].s,
                   convs[i].p);
        snprintf(n, sizeof n, "%s fwd", convs[i].name);
        timeit(n, conv_f, &c);
        if (convs[i].C > 1) {
            snprintf(n, sizeof n, "%s bwd data", convs[i].name);
            timeit(n, conv_bd, &c);
        }
        snprintf(n, sizeof n, "%s bwd weights", convs[i].name);
        timeit(n, conv_bw, &c);
        conv_free(&c);
    }

    act_case a;
    act(&a.x, 64, 64, 14, 14);
    act(&a.y, 64, 64, 14, 14);
    act(&a.dy, 64, 64, 14, 14);
    act(&a.dx, 64, 64, 14, 14);
    act(&a.py, 64, 64, 7, 7);
    act(&a.pdy, 64, 64, 7, 7);
    int64_t s64[1] = {64};
    plain(&a.w, 1, s64);
    plain(&a.b, 1, s64);
    plain(&a.mean, 1, s64);
    plain(&a.var, 1, s64);
    plain(&a.dw, 1, s64);
    plain(&a.db, 1, s64);
    a.pp = (ch_pool2d_params_t){3, 3, 2, 2, 1, 1};
    timeit("batchnorm train fwd 64x64x14x14", bn_f, &a);
    timeit("batchnorm bwd 64x64x14x14", bn_b, &a);
    timeit("relu fwd 64x64x14x14", relu_f, &a);
    timeit("relu bwd 64x64x14x14", relu_b, &a);
    timeit("maxpool 3x3/2 fwd 64x64x14x14", pool_f, &a);
    timeit("maxpool 3x3/2 bwd 64x64x14x14", pool_b, &a);
    ch_tensor_t *at[] = {&a.x, &a.y, &a.dy, &a.dx, &a.py, &a.pdy, &a.w, &a.b, &a.mean,
                         &a.var, &a.dw, &a.db};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) ch_tensor_free(at[i]);

    head_case h;
    act(&h.x, 64, 512, 1, 1);
    act(&h.dx, 64, 512, 1, 1);
    int64_t sp[2] = {64, 512}, sw[2] = {10, 512}, sl[2] = {64, 10}, s10[1] = {10}, sn[1] = {64},
            s1[1] = {1};
    plain(&h.pooled, 2, sp);
    plain(&h.dpooled, 2, sp);
    plain(&h.w, 2, sw);
    plain(&h.dw, 2, sw);
    plain(&h.b, 1, s10);
    plain(&h.db, 1, s10);
    plain(&h.logits, 2, sl);
    plain(&h.dlogits, 2, sl);
    plain(&h.loss, 1, s1);
    DIE(ch_tensor_alloc(&h.labels, CH_I64, 1, sn, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    for (int i = 0; i < 64; i++) ((int64_t *)h.labels.data)[i] = i % 10;
    timeit("avgpool global fwd 64x512x1x1", gap_f, &h);
    timeit("avgpool global bwd 64x512x1x1", gap_b, &h);
    timeit("linear 512->10 fwd", fc_f, &h);
    timeit("linear 512->10 bwd (data+weights)", fc_b, &h);
    timeit("cross entropy fwd+grad 64x10", ce, &h);
    ch_tensor_t *ht[] = {&h.x, &h.dx, &h.pooled, &h.dpooled, &h.w, &h.dw, &h.b,
                         &h.db, &h.logits, &h.dlogits, &h.loss, &h.labels};
    for (size_t i = 0; i < sizeof ht / sizeof ht[0]; i++) ch_tensor_free(ht[i]);
    ch_compute_destroy(cx);
    return 0;
}
