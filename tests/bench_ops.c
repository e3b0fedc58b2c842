/* bench_ops: time cohort's CPU ops on a resnet18-shaped network
 * (torchvision resnet18 with 1 input channel and 10 classes) on 1x28x28
 * images: forward + loss + backward (all parameter gradients; no optimizer),
 * built directly from ch_op_* calls, activations in the preferred layout.
 * Its PyTorch twin is tests/bench_ops.py (same network, same work).
 *
 * Usage: bench_ops [batch=64] [steps=20] [threads=1] [layout=auto|plain|nhwc|8c|16c]
 * Prints the median step time (wall and process CPU time), images/s and the
 * median CPU time per op kind.
 * This is a benchmark program, not a test (see docs/perf-ops.md).
 */
#include "config.h"

#include "framework/ops/ops.h"

#include <oneapi/dnnl/dnnl.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DIE(s)                                                                      \
    do {                                                                            \
        ch_status s_ = (s);                                                         \
        if (s_ != CH_OK) {                                                          \
            fprintf(stderr, "bench_ops: %s:%d: %s\n", __FILE__, __LINE__,           \
                    ch_error_message());                                            \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

enum { K_CONV_F, K_CONV_BD, K_CONV_BW, K_BN_F, K_BN_B, K_RELU_F, K_RELU_B, K_POOL_F,
       K_POOL_B, K_ADD, K_FC, K_LOSS, K_REORDER, K_N };
static const char *KN[K_N] = {"conv fwd",  "conv bwd data", "conv bwd weights", "bn fwd",
                              "bn bwd",    "relu fwd",      "relu bwd",         "pool fwd",
                              "pool bwd",  "add",           "fc (fwd+bwd)",     "loss",
                              "reorder"};
static double g_t[K_N];

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define T(k, call)                                                                  \
    do {                                                                            \
        double t0_ = cpu_now();                                                     \
        DIE(call);                                                                  \
        g_t[k] += cpu_now() - t0_;                                                  \
    } while (0)

static ch_compute_t *cx;
static int64_t NB;

static void act(ch_tensor_t *t, int64_t C, int64_t H, int64_t W)
{
    int64_t s[4] = {NB, C, H, W};
    DIE(ch_tensor_alloc(t, CH_F32, 4, s, ch_compute_preferred_layout(cx, CH_DEV_CPU, C),
                        CH_DEV_CPU, 0));
}

static void vec(ch_tensor_t *t, int64_t n, float v)
{
    int64_t s[1] = {n};
    DIE(ch_tensor_alloc_f32(t, 1, s));
    DIE(ch_op_fill(cx, t, v));
}

static uint64_t rng = 88172645463325252ull;
static float urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

typedef struct {
    ch_tensor_t w, dw;
    ch_conv2d_params_t p;
} conv_t;
typedef struct {
    ch_tensor_t w, b, dw, db, mean, var, rm, rv;
} bn_t;

static void conv_init(conv_t *c, int64_t O, int64_t C, int k, int s, int p)
{
    int64_t sh[4] = {O, C, k, k};
    DIE(ch_tensor_alloc_f32(&c->w, 4, sh));
    DIE(ch_tensor_alloc_f32(&c->dw, 4, sh));
    float sd = sqrtf(2.0f / (float)(O * k * k)) * 1.7f;
    float *w = c->w.data;
    for (int64_t i = 0; i < ch_tensor_numel(&c->w); i++) w[i] = urand() * sd;
    c->p = (ch_conv2d_params_t){s, s, p, p};
}

static void bn_init(bn_t *b, int64_t C)
{
    vec(&b->w, C, 1.0f);
    vec(&b->b, C, 0.0f);
    vec(&b->dw, C, 0.0f);
    vec(&b->db, C, 0.0f);
    vec(&b->mean, C, 0.0f);
    vec(&b->var, C, 1.0f);
    vec(&b->rm, C, 0.0f);
    vec(&b->rv, C, 1.0f);
}

static void bn_fwd(bn_t *b, const ch_tensor_t *x, ch_tensor_t *y)
{
    T(K_BN_F, ch_op_batchnorm_forward_train(cx, x, &b->w, &b->b, 1e-5f, y, &b->mean, &b->var));
    int64_t cnt = x->shape[0] * x->shape[2] * x->shape[3];
    T(K_BN_F, ch_op_batchnorm_update_running(cx, &b->rm, &b->rv, &b->mean, &b->var, cnt, 0.1f));
}

static void bn_bwd(bn_t *b, const ch_tensor_t *x, ch_tensor_t *dy, ch_tensor_t *dx)
{
    T(K_BN_B, ch_op_batchnorm_backward(cx, x, dy, &b->mean, &b->var, 1e-5f, &b->w, dx, &b->dw,
                                       &b->db));
}

typedef struct {
    conv_t c1, c2, cd;
    bn_t b1, b2, bd;
    int ds;
    /* activations: input x is the previous block's out */
    ch_tensor_t t1, u1, t2, u2, d, e, out;
    /* gradients */
    ch_tensor_t g_out, g_t1, g_u1, g_t2, g_d, g_x2;
} block_t;

static void block_init(block_t *b, int64_t Cin, int64_t C, int s, int64_t Hin)
{
    int64_t H = (Hin + 2 - 3) / s + 1;
    conv_init(&b->c1, C, Cin, 3, s, 1);
    conv_init(&b->c2, C, C, 3, 1, 1);
    bn_init(&b->b1, C);
    bn_init(&b->b2, C);
    b->ds = s != 1 || Cin != C;
    if (b->ds) {
        conv_init(&b->cd, C, Cin, 1, s, 0);
        bn_init(&b->bd, C);
        act(&b->d, C, H, H);
        act(&b->e, C, H, H);
        act(&b->g_d, C, H, H);
        act(&b->g_x2, Cin, Hin, Hin);
    }
    act(&b->t1, C, H, H);
    act(&b->u1, C, H, H);
    act(&b->t2, C, H, H);
    act(&b->u2, C, H, H);
    act(&b->out, C, H, H);
    act(&b->g_out, C, H, H);
    act(&b->g_t1, C, H, H);
    act(&b->g_u1, C, H, H);
    act(&b->g_t2, C, H, H);
}

static void block_fwd(block_t *b, const ch_tensor_t *x)
{
    T(K_CONV_F, ch_op_conv2d_forward(cx, x, &b->c1.w, NULL, &b->c1.p, &b->t1));
    bn_fwd(&b->b1, &b->t1, &b->u1);
    T(K_RELU_F, ch_op_relu_forward(cx, &b->u1, &b->u1));
    T(K_CONV_F, ch_op_conv2d_forward(cx, &b->u1, &b->c2.w, NULL, &b->c2.p, &b->t2));
    bn_fwd(&b->b2, &b->t2, &b->u2);
    if (b->ds) {
        T(K_CONV_F, ch_op_conv2d_forward(cx, x, &b->cd.w, NULL, &b->cd.p, &b->d));
        bn_fwd(&b->bd, &b->d, &b->e);
        T(K_ADD, ch_op_add(cx, &b->u2, &b->e, &b->out));
    } else {
        T(K_ADD, ch_op_add(cx, &b->u2, x, &b->out));
    }
    T(K_RELU_F, ch_op_relu_forward(cx, &b->out, &b->out));
}

/* g_out holds d(loss)/d(out); writes d(loss)/d(x) into gx. */
static void block_bwd(block_t *b, const ch_tensor_t *x, ch_tensor_t *gx)
{
    T(K_RELU_B, ch_op_relu_backward(cx, &b->out, &b->g_out, &b->g_out));
    /* main path */
    bn_bwd(&b->b2, &b->t2, &b->g_out, &b->g_t2);
    T(K_CONV_BW, ch_op_conv2d_backward_weights(cx, &b->u1, &b->g_t2, &b->c2.p, &b->c2.dw, NULL));
    T(K_CONV_BD, ch_op_conv2d_backward_data(cx, &b->g_t2, &b->c2.w, &b->c2.p, &b->g_u1));
    T(K_RELU_B, ch_op_relu_backward(cx, &b->u1, &b->g_u1, &b->g_u1));
    bn_bwd(&b->b1, &b->t1, &b->g_u1, &b->g_t1);
    T(K_CONV_BW, ch_op_conv2d_backward_weights(cx, x, &b->g_t1, &b->c1.p, &b->c1.dw, NULL));
    if (gx) T(K_CONV_BD, ch_op_conv2d_backward_data(cx, &b->g_t1, &b->c1.w, &b->c1.p, gx));
    /* shortcut */
    if (b->ds) {
        bn_bwd(&b->bd, &b->d, &b->g_out, &b->g_d);
        T(K_CONV_BW, ch_op_conv2d_backward_weights(cx, x, &b->g_d, &b->cd.p, &b->cd.dw, NULL));
        if (gx) {
            T(K_CONV_BD, ch_op_conv2d_backward_data(cx, &b->g_d, &b->cd.w, &b->cd.p, &b->g_x2));
            T(K_ADD, ch_op_add_inplace(cx, gx, &b->g_x2));
        }
    } else if (gx) {
        T(K_ADD, ch_op_add_inplace(cx, gx, &b->g_out));
    }
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    NB = argc > 1 ? atoll(argv[1]) : 64;
    int steps = argc > 2 ? atoi(argv[2]) : 20;
    int threads = argc > 3 ? atoi(argv[3]) : 1;
    const char *lay = argc > 4 ? argv[4] : "auto";
    ch_compute_options_t o;
    ch_compute_options_default(&o);
    o.num_threads = threads;
    if (!strcmp(lay, "plain")) o.cpu_layout = CH_LAYOUT_PLAIN;
    else if (!strcmp(lay, "nhwc")) o.cpu_layout = CH_LAYOUT_NHWC;
    else if (!strcmp(lay, "8c")) o.cpu_layout = CH_LAYOUT_NCHW8C;
    else if (!strcmp(lay, "16c")) o.cpu_layout = CH_LAYOUT_NCHW16C;
    DIE(ch_compute_create(&o, &cx));
    char desc[256];
    printf("# %s\n", ch_compute_describe(cx, desc, sizeof desc));

    /* network */
    conv_t stem;
    bn_t bn1;
    conv_init(&stem, 64, 1, 7, 2, 3);
    bn_init(&bn1, 64);
    ch_tensor_t img, c1, a1, p1, g_c1, g_a1, g_p1;
    int64_t si[4] = {NB, 1, 28, 28};
    DIE(ch_tensor_alloc_f32(&img, 4, si));
    for (int64_t i = 0; i < ch_tensor_numel(&img); i++) ((float *)img.data)[i] = urand();
    act(&c1, 64, 14, 14);
    act(&a1, 64, 14, 14);
    act(&p1, 64, 7, 7);
    act(&g_c1, 64, 14, 14);
    act(&g_a1, 64, 14, 14);
    act(&g_p1, 64, 7, 7);
    block_t blk[8];
    int64_t chans[4] = {64, 128, 256, 512}, H = 7, Cin = 64;
    for (int l = 0; l < 4; l++) {
        for (int i = 0; i < 2; i++) {
            int s = (l > 0 && i == 0) ? 2 : 1;
            block_init(&blk[l * 2 + i], Cin, chans[l], s, H);
            H = (H + 2 - 3) / s + 1;
            Cin = chans[l];
        }
    }
    ch_tensor_t pooled, fcw, fcb, dfcw, dfcb, logits, dlogits, gpool, labels, loss;
    int64_t sp[2] = {NB, 512}, sw[2] = {10, 512}, sl[2] = {NB, 10}, sn[1] = {NB}, s1[1] = {1};
    DIE(ch_tensor_alloc_f32(&pooled, 2, sp));
    DIE(ch_tensor_alloc_f32(&gpool, 2, sp));
    DIE(ch_tensor_alloc_f32(&fcw, 2, sw));
    DIE(ch_tensor_alloc_f32(&dfcw, 2, sw));
    for (int64_t i = 0; i < 5120; i++) ((float *)fcw.data)[i] = urand() * 0.044f;
    vec(&fcb, 10, 0.0f);
    vec(&dfcb, 10, 0.0f);
    DIE(ch_tensor_alloc_f32(&logits, 2, sl));
    DIE(ch_tensor_alloc_f32(&dlogits, 2, sl));
    DIE(ch_tensor_alloc(&labels, CH_I64, 1, sn, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    for (int64_t i = 0; i < NB; i++) ((int64_t *)labels.data)[i] = i % 10;
    DIE(ch_tensor_alloc_f32(&loss, 1, s1));
    ch_pool2d_params_t mp = {3, 3, 2, 2, 1, 1};

    int warm = 3;
    double *st = calloc((size_t)steps, sizeof *st);
    double *cpu = calloc((size_t)steps, sizeof *cpu);
    double *per = calloc((size_t)steps * K_N, sizeof *per);
    float lossv = 0.0f;
    for (int it = -warm; it < steps; it++) {
        memset(g_t, 0, sizeof g_t);
        double t0 = now(), c0 = cpu_now();
        /* forward */
        T(K_CONV_F, ch_op_conv2d_forward(cx, &img, &stem.w, NULL, &stem.p, &c1));
        bn_fwd(&bn1, &c1, &a1);
        T(K_RELU_F, ch_op_relu_forward(cx, &a1, &a1));
        T(K_POOL_F, ch_op_maxpool2d_forward(cx, &a1, &mp, &p1));
        const ch_tensor_t *x = &p1;
        for (int i = 0; i < 8; i++) {
            block_fwd(&blk[i], x);
            x = &blk[i].out;
        }
        T(K_POOL_F, ch_op_avgpool_global_forward(cx, x, &pooled));
        T(K_FC, ch_op_linear_forward(cx, &pooled, &fcw, &fcb, &logits));
        T(K_LOSS, ch_op_cross_entropy(cx, &logits, &labels, &loss, &dlogits));
        lossv = ((float *)loss.data)[0];
        /* backward */
        T(K_FC, ch_op_linear_backward_weights(cx, &pooled, &dlogits, &dfcw, &dfcb));
        T(K_FC, ch_op_linear_backward_data(cx, &dlogits, &fcw, &gpool));
        T(K_POOL_B, ch_op_avgpool_global_backward(cx, &gpool, &blk[7].g_out));
        for (int i = 7; i >= 0; i--) {
            const ch_tensor_t *xin = i ? &blk[i - 1].out : &p1;
            ch_tensor_t *gx = i ? &blk[i - 1].g_out : &g_p1;
            block_bwd(&blk[i], xin, gx);
        }
        T(K_POOL_B, ch_op_maxpool2d_backward(cx, &a1, &g_p1, &mp, &g_a1));
        T(K_RELU_B, ch_op_relu_backward(cx, &a1, &g_a1, &g_a1));
        bn_bwd(&bn1, &c1, &g_a1, &g_c1);
        T(K_CONV_BW, ch_op_conv2d_backward_weights(cx, &img, &g_c1, &stem.p, &stem.dw, NULL));
        double dt = now() - t0;
        if (it >= 0) {
            st[it] = dt;
            cpu[it] = cpu_now() - c0;
            for (int k = 0; k < K_N; k++) per[(size_t)k * steps + it] = g_t[k];
        }
    }
    qsort(st, (size_t)steps, sizeof *st, cmp_d);
    double med = st[steps / 2];
    printf("batch %lld, %d steps, loss %.4f\n", (long long)NB, steps, (double)lossv);
    qsort(cpu, (size_t)steps, sizeof *cpu, cmp_d);
    printf("step median %.2f ms (min %.2f, max %.2f): %.1f images/s\n", med * 1e3, st[0] * 1e3,
           st[steps - 1] * 1e3, (double)NB / med);
    printf("step cpu time median %.2f ms: %.1f images per cpu-second\n", cpu[steps / 2] * 1e3,
           (double)NB / cpu[steps / 2]);
    for (int k = 0; k < K_N; k++) {
        qsort(per + (size_t)k * steps, (size_t)steps, sizeof *per, cmp_d);
        double m = per[(size_t)k * steps + steps / 2];
        if (m > 0) printf("  %-18s %8.2f ms\n", KN[k], m * 1e3);
    }
    printf("  cached primitives %zu, scratchpad %zu bytes\n", ch_compute_cache_entries(cx),
           ch_compute_scratchpad_bytes(cx));
    /* reference: single-precision matrix-product rate on this machine
     * (dnnl_sgemm 1024^3, same thread count), median of 5, CPU time */
    {
        int64_t n = 1024;
        float *A = calloc((size_t)(n * n), sizeof *A), *Bm = calloc((size_t)(n * n), sizeof *Bm),
              *Cm = calloc((size_t)(n * n), sizeof *Cm);
        double r[5];
        for (int64_t i = 0; i < n * n; i++) {
            A[i] = urand();
            Bm[i] = urand();
        }
        DIE(dnnl_sgemm('N', 'N', n, n, n, 1.0f, A, n, Bm, n, 0.0f, Cm, n) == dnnl_success
                ? CH_OK
                : CH_ERROR(CH_ERR_DNNL, "sgemm"));
        for (int i = 0; i < 5; i++) {
            double c0 = cpu_now();
            dnnl_sgemm('N', 'N', n, n, n, 1.0f, A, n, Bm, n, 0.0f, Cm, n);
            r[i] = cpu_now() - c0;
        }
        qsort(r, 5, sizeof *r, cmp_d);
        double peak = 2.0 * (double)(n * n * n) / r[2] / 1e9;
        /* resnet18 on 1x28x28 at batch 64, forward + backward data + backward
         * weights of every convolution (stem without backward data): 12.60
         * GFLOP per step with the nominal kernels, 8.42 GFLOP actually
         * executed (conv.c skips kernel taps that only see padding and runs
         * the small-map layers as dense GEMMs); scaled linearly by batch */
        double nominal = 12.60e9 * (double)NB / 64.0, executed = 8.42e9 * (double)NB / 64.0;
        double c = cpu[steps / 2];
        printf("sgemm 1024^3: %.1f GFLOP/s per cpu-second\n", peak);
        printf("network: %.1f GFLOP/s nominal (%.0f%% of sgemm), %.1f GFLOP/s executed "
               "(%.0f%% of sgemm), per cpu-second\n",
               nominal / c / 1e9, 100.0 * nominal / c / 1e9 / peak, executed / c / 1e9,
               100.0 * executed / c / 1e9 / peak);
        free(A);
        free(Bm);
        free(Cm);
    }
    /* cleanup */
    free(st);
    free(cpu);
    free(per);
    ch_compute_destroy(cx);
    return 0;
}
