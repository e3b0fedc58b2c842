/* The CPU backend's own C loops (framework/ops/cpu/kernels.c, batchnorm.c)
 * give bitwise the same results on 1, 2 and 3 OpenMP threads.
 *
 * Each op runs on tensors large enough to take the parallel path (the work
 * is checked against CH_CPU_PAR_MIN), in every layout: plain NCHW, NHWC,
 * nChw8c and nChw16c, with 48 channels (whole 16-lane groups) and with 24
 * (an 8-lane remainder group in NHWC), and with 9 and 11 samples (no
 * even split). The inputs make the per-channel reductions (batch-norm mean,
 * sum dy, sum dy*(x - mean)) cancel large terms (fill_cancelling), so they
 * round differently whenever their terms are added in another order or
 * grouping: a sum split across threads and recombined fails the bitwise
 * comparison.
 */
#include "config.h"

#include "tests/harness.h"

#include "framework/ops/cpu/cpu.h"
#include "framework/ops/ops.h"
#include "framework/tensor/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAXOUT = 40 };

/* The outputs of one run of every op, copied out (plain bytes). */
typedef struct {
    int n;
    const char *name[MAXOUT];
    void *data[MAXOUT];
    size_t bytes[MAXOUT];
} outputs;

static void keep(outputs *o, const char *name, const ch_tensor_t *t)
{
    assert_true(o->n < MAXOUT);
    o->name[o->n] = name;
    o->bytes[o->n] = t->nbytes;
    o->data[o->n] = malloc(t->nbytes ? t->nbytes : 1);
    assert_non_null(o->data[o->n]);
    memcpy(o->data[o->n], t->data, t->nbytes);
    o->n++;
}

static void outputs_free(outputs *o)
{
    for (int i = 0; i < o->n; i++) free(o->data[i]);
    o->n = 0;
}

/* xorshift64*: uniform in [-1, 1) */
static float urand(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    uint64_t r = *s * 2685821657736338717ull;
    return (float)((double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* x and dy (same shape and layout; the sample index n is outermost in every
 * layout) built so that the per-channel sums over the samples cancel: sample
 * 0 and sample N-1 have the same x and opposite dy of magnitude 1e12,
 * samples 1 and N-2 opposite x of magnitude 1e12 and the same dy; the other
 * samples are O(1). Added in order 0..N-1, every term between a pair is
 * rounded to the grid of the large partial sum, so summing in another order
 * or grouping (a sum split over threads and recombined) changes the float
 * result of sum x (the mean), sum dy and sum dy*(x - mean). */
static void fill_cancelling(ch_tensor_t *x, ch_tensor_t *dy, uint64_t seed)
{
    int64_t N = x->shape[0], per = ch_tensor_numel(x) / N;
    float *X = x->data, *D = dy->data;
    uint64_t s = seed;
    assert_true(N >= 4);
    for (int64_t i = 0; i < N * per; i++) {
        X[i] = urand(&s) + 0.25f;
        D[i] = urand(&s) - 0.125f;
    }
    for (int64_t i = 0; i < per; i++) {
        D[i] *= 1e12f;
        X[(N - 1) * per + i] = X[i];
        D[(N - 1) * per + i] = -D[i];
        X[per + i] *= 1e12f;
        X[(N - 2) * per + i] = -X[per + i];
        D[(N - 2) * per + i] = D[per + i];
    }
}

static void fill_uniform(ch_tensor_t *t, uint64_t seed, float lo)
{
    uint64_t s = seed;
    float *d = t->data;
    for (int64_t i = 0; i < ch_tensor_numel(t); i++) d[i] = lo + urand(&s) * 0.5f + 0.5f;
}

/* The convolution and pooling variants on x (N,C,H,W): AvgPool2d with
 * ceil_mode (2x2/2, padding 1, the last window dropped for odd H) and
 * count_include_pad, AdaptiveAvgPool2d to (5, 4), and oneDNN's depthwise
 * and dilated grouped convolutions (forward, backward data, backward
 * weights). */
static void run_convpool_ops(ch_compute_t *cx, const ch_tensor_t *x, outputs *o)
{
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    ch_layout_t L = x->layout;
    const ch_pool2d_params_t ap = {2, 2, 2, 2, 1, 1, 1, 1};
    int64_t sa[4] = {N, C, ch_pool_out_size(H, 2, 2, 1, 1), ch_pool_out_size(W, 2, 2, 1, 1)};
    int64_t sd[4] = {N, C, 5, 4}, sw[4] = {C, 1, 3, 3}, sw2[4] = {C, 8, 3, 3}, sc[1] = {C};
    ch_tensor_t ay, ady, adx, dy5, y5, dx5, cy, cdx, w, w2, cdw, cdw2, cdb;
    ch_tensor_t *a4[] = {&ay, &ady};
    for (int i = 0; i < 2; i++)
        assert_ch_ok(ch_tensor_alloc(a4[i], CH_F32, 4, sa, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&y5, CH_F32, 4, sd, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&dy5, CH_F32, 4, sd, L, CH_DEV_CPU, 0));
    ch_tensor_t *xs[] = {&adx, &dx5, &cy, &cdx};
    for (int i = 0; i < 4; i++)
        assert_ch_ok(ch_tensor_alloc(xs[i], CH_F32, 4, x->shape, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc_f32(&w, 4, sw));
    assert_ch_ok(ch_tensor_alloc_f32(&cdw, 4, sw));
    assert_ch_ok(ch_tensor_alloc_f32(&w2, 4, sw2));
    assert_ch_ok(ch_tensor_alloc_f32(&cdw2, 4, sw2));
    assert_ch_ok(ch_tensor_alloc_f32(&cdb, 1, sc));
    fill_uniform(&ady, 21, -1.0f);
    fill_uniform(&dy5, 22, -1.0f);
    fill_uniform(&w, 23, -1.0f);
    fill_uniform(&w2, 24, -1.0f);

    assert_ch_ok(ch_op_avgpool2d_forward(cx, x, &ap, &ay));
    keep(o, "avgpool2d_forward", &ay);
    assert_ch_ok(ch_op_avgpool2d_backward(cx, &ady, &ap, &adx));
    keep(o, "avgpool2d_backward", &adx);
    assert_ch_ok(ch_op_adaptive_avgpool2d_forward(cx, x, &y5));
    keep(o, "adaptive_avgpool2d_forward", &y5);
    assert_ch_ok(ch_op_adaptive_avgpool2d_backward(cx, &dy5, &dx5));
    keep(o, "adaptive_avgpool2d_backward", &dx5);
    /* depthwise 3x3, padding 1 (same size); then dilation 2, padding 2,
     * groups C/8 (8 channels a group); x itself serves as the same-sized dy.
     * Not groups C/2: with 2 channels a group oneDNN 2.6 below AVX-512 runs
     * the dilated grouped forward as gemm:jit in nhwc, whose result changes
     * with the thread count (docs/perf-ops.md, "thread-count determinism") */
    const ch_conv2d_params_t dw3 = {1, 1, 1, 1, 1, 1, (int)C};
    const ch_conv2d_params_t dil = {1, 1, 2, 2, 2, 2, (int)(C / 8)};
    assert_ch_ok(ch_op_conv2d_forward(cx, x, &w, NULL, &dw3, &cy));
    keep(o, "depthwise conv forward", &cy);
    assert_ch_ok(ch_op_conv2d_backward_data(cx, x, &w, &dw3, &cdx));
    keep(o, "depthwise conv backward data", &cdx);
    assert_ch_ok(ch_op_conv2d_backward_weights(cx, x, &cy, &dw3, &cdw, &cdb));
    keep(o, "depthwise conv backward weights", &cdw);
    keep(o, "depthwise conv backward bias", &cdb);
    assert_ch_ok(ch_op_conv2d_forward(cx, x, &w2, NULL, &dil, &cy));
    keep(o, "dilated grouped conv forward", &cy);
    assert_ch_ok(ch_op_conv2d_backward_data(cx, x, &w2, &dil, &cdx));
    keep(o, "dilated grouped conv backward data", &cdx);
    assert_ch_ok(ch_op_conv2d_backward_weights(cx, x, &cy, &dil, &cdw2, NULL));
    keep(o, "dilated grouped conv backward weights", &cdw2);

    ch_tensor_t *all[] = {&ay, &ady, &adx, &dy5, &y5, &dx5, &cy, &cdx, &w, &w2, &cdw, &cdw2, &cdb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ch_tensor_free(all[i]);
}

/* Every parallelised op once, on cx's current thread count. */
static void run_ops(ch_compute_t *cx, ch_layout_t L, int64_t N, int64_t C, int64_t H, int64_t W,
                    outputs *o)
{
    const ch_pool2d_params_t pp = {3, 3, 2, 2, 1, 1};
    int64_t Ho = (H + 2 - 3) / 2 + 1, Wo = (W + 2 - 3) / 2 + 1;
    int64_t sx[4] = {N, C, H, W}, sp[4] = {N, C, Ho, Wo}, sg[2] = {N, C}, sc[1] = {C};
    ch_tensor_t x, dy, y, dx, t, py, pdy, pdx, g, gdx, w, b, mean, var, s1, s2, dw, db;
    ch_tensor_t *act[] = {&x, &dy, &y, &dx, &t};
    for (size_t i = 0; i < sizeof act / sizeof act[0]; i++)
        assert_ch_ok(ch_tensor_alloc(act[i], CH_F32, 4, sx, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&py, CH_F32, 4, sp, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&pdy, CH_F32, 4, sp, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&pdx, CH_F32, 4, sx, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&gdx, CH_F32, 4, sx, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc_f32(&g, 2, sg));
    ch_tensor_t *vec[] = {&w, &b, &mean, &var, &s1, &s2, &dw, &db};
    for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++)
        assert_ch_ok(ch_tensor_alloc_f32(vec[i], 1, sc));
    /* the smallest op's work must reach the parallel path */
    assert_true(ch_tensor_numel(&x) >= CH_CPU_PAR_MIN);
    fill_cancelling(&x, &dy, 0x9e3779b97f4a7c15ull + (uint64_t)C);
    fill_uniform(&pdy, 0x8cb92ba72f3d8dd7ull, -1.0f);
    fill_uniform(&w, 11, 0.5f);
    fill_uniform(&b, 12, -0.5f);
    const float eps = 1e-5f;

    assert_ch_ok(ch_op_relu_forward(cx, &x, &y));
    keep(o, "relu_forward", &y);
    assert_ch_ok(ch_op_relu_backward(cx, &y, &dy, &dx));
    keep(o, "relu_backward", &dx);
    assert_ch_ok(ch_op_add(cx, &x, &dy, &t));
    keep(o, "add", &t);
    assert_ch_ok(ch_op_add_inplace(cx, &t, &x));
    keep(o, "add_inplace", &t);
    assert_ch_ok(ch_op_scale(cx, &t, 0.37f));
    keep(o, "scale", &t);
    assert_ch_ok(ch_op_maxpool2d_forward(cx, &x, &pp, &py));
    keep(o, "maxpool_forward", &py);
    assert_ch_ok(ch_op_maxpool2d_backward(cx, &x, &pdy, &pp, &pdx));
    keep(o, "maxpool_backward", &pdx);
    assert_ch_ok(ch_op_avgpool_global_forward(cx, &x, &g));
    keep(o, "avgpool_global_forward", &g);
    assert_ch_ok(ch_op_avgpool_global_backward(cx, &g, &gdx));
    keep(o, "avgpool_global_backward", &gdx);
    assert_ch_ok(ch_op_batchnorm_stats(cx, &x, &mean, &var));
    keep(o, "bn_stats mean", &mean);
    keep(o, "bn_stats var", &var);
    assert_ch_ok(ch_op_batchnorm_apply(cx, &x, &mean, &var, &w, &b, eps, &y));
    keep(o, "bn_apply", &y);
    assert_ch_ok(ch_op_batchnorm_forward_train(cx, &x, &w, &b, eps, &t, &mean, &var));
    keep(o, "bn_forward_train", &t);
    assert_ch_ok(ch_op_batchnorm_backward_reduce(cx, &x, &dy, &mean, &s1, &s2));
    keep(o, "bn_backward_reduce sum_dy", &s1);
    keep(o, "bn_backward_reduce sum_dy_xmu", &s2);
    assert_ch_ok(ch_op_batchnorm_backward_elemt(cx, &x, &dy, &mean, &var, eps, &w, &s1, &s2,
                                                N * H * W, &dx));
    keep(o, "bn_backward_elemt", &dx);
    assert_ch_ok(ch_op_batchnorm_backward(cx, &x, &dy, &mean, &var, eps, &w, &dx, &dw, &db));
    keep(o, "bn_backward dx", &dx);
    keep(o, "bn_backward dweight", &dw);
    keep(o, "bn_backward dbias", &db);
    run_convpool_ops(cx, &x, o);
    assert_ch_ok(ch_compute_sync(cx));

    for (size_t i = 0; i < sizeof act / sizeof act[0]; i++) ch_tensor_free(act[i]);
    ch_tensor_free(&py);
    ch_tensor_free(&pdy);
    ch_tensor_free(&pdx);
    ch_tensor_free(&gdx);
    ch_tensor_free(&g);
    for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++) ch_tensor_free(vec[i]);
}

static void check_layout(ch_layout_t L)
{
    ch_compute_t *cx = NULL;
    ch_compute_options_t opt;
    ch_compute_options_default(&opt);
    opt.num_threads = 1;
    assert_ch_ok(ch_compute_create(&opt, &cx));
    const int64_t shapes[][4] = {{9, 48, 19, 17}, {11, 24, 23, 23}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t *s = shapes[si];
        int blk = ch_layout_block(L);
        if (blk && s[1] % blk) continue; /* 24 channels: no nChw16c */
        outputs ref = {0};
        assert_ch_ok(ch_compute_set_num_threads(cx, 1));
        run_ops(cx, L, s[0], s[1], s[2], s[3], &ref);
        for (int nt = 2; nt <= 3; nt++) {
            outputs got = {0};
            assert_ch_ok(ch_compute_set_num_threads(cx, nt));
            assert_int_equal(ch_compute_num_threads(cx), nt);
            run_ops(cx, L, s[0], s[1], s[2], s[3], &got);
            assert_int_equal(got.n, ref.n);
            for (int i = 0; i < ref.n; i++) {
                assert_true(got.bytes[i] == ref.bytes[i]);
                if (memcmp(got.data[i], ref.data[i], ref.bytes[i]) != 0)
                    fail_msg("%s, layout %s, shape %lldx%lldx%lldx%lld: %d threads differ "
                             "from 1 thread",
                             ref.name[i], ch_layout_name(L), (long long)s[0], (long long)s[1],
                             (long long)s[2], (long long)s[3], nt);
            }
            outputs_free(&got);
        }
        outputs_free(&ref);
    }
    ch_compute_destroy(cx);
}

static void test_plain(void **state)
{
    (void)state;
    check_layout(CH_LAYOUT_PLAIN);
}

static void test_nhwc(void **state)
{
    (void)state;
    check_layout(CH_LAYOUT_NHWC);
}

static void test_nchw8c(void **state)
{
    (void)state;
    check_layout(CH_LAYOUT_NCHW8C);
}

static void test_nchw16c(void **state)
{
    (void)state;
    check_layout(CH_LAYOUT_NCHW16C);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain),
        cmocka_unit_test(test_nhwc),
        cmocka_unit_test(test_nchw8c),
        cmocka_unit_test(test_nchw16c),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
