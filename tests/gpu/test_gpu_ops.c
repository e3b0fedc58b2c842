/* GPU backend (framework/ops/cuda) against the CPU backend, op by op.
 *
 * Every test draws random inputs on the host, runs the op on the CPU
 * (CH_DEV_CPU tensors, PLAIN) and on the GPU (CH_DEV_CUDA tensors; the
 * activations once PLAIN and once NHWC, the GPU's preferred layout), copies
 * the GPU result back and compares (tests/gpu/gpu_testutil.h):
 *   fp32, allow_tf32 = 0:  relative L2 <= 1e-4 forward, <= 1e-3 gradients
 *   bf16 (opts.bf16 = 1):  conv / linear <= 1e-2 forward, <= 2e-2 gradients
 *                          (two bf16 roundings per product in backward), and
 *                          the result must differ from fp32 (else the option
 *                          was ignored)
 *   integer results (argmax, count_correct, gather_stats' total): exact
 *   data motion (reorder, copy, fill, uploads): bit-exact
 * Device outputs are poisoned with NaN first, so an element the GPU op does
 * not write fails the comparison.
 *
 * Without a visible GPU (or in a build without the CUDA backend) every GPU
 * test SKIPs with the reason; the error-path test runs everywhere.
 * COHORT_GPU_TESTS_ON_CPU=1 runs the comparisons CPU vs CPU to check the test
 * code itself on a machine without a GPU (gpu_testutil.h).
 */
#include "config.h"

#include "tests/gpu/gpu_testutil.h"

#include "framework/tensor/device.h"
#include "framework/ops/ops.h"
#include "framework/tensor/tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL_FWD 1e-4
#define TOL_BWD 1e-3
#define TOL_BF16_FWD 1e-2
#define TOL_BF16_BWD 2e-2
#define TOL_SGD 1e-5

static const ch_layout_t LAYOUTS[2] = {CH_LAYOUT_PLAIN, CH_LAYOUT_NHWC};

/* cx32: CPU reference and GPU fp32 with TF32 off; cxbf: GPU bf16 autocast. */
static ch_compute_t *cx32, *cxbf;

static void contexts(void)
{
    GT_NEED_GPU();
    if (cx32) return;
    if (!gt_cpu_mode()) assert_ch_ok(ch_device_set(0));
    ch_compute_options_t o;
    ch_compute_options_default(&o);
    o.gpu_device = 0;
    o.allow_tf32 = 0;
    o.bf16 = 0;
    assert_ch_ok(ch_compute_create(&o, &cx32));
    o.bf16 = 1;
    assert_ch_ok(ch_compute_create(&o, &cxbf));
}

static const char *lname(ch_layout_t l) { return ch_layout_name(l); }

/* ------------------------------------------------------------ data motion */

static void check_exact(ch_compute_t *cx, const char *what, const ch_tensor_t *dev,
                        const ch_tensor_t *ref)
{
    ch_tensor_t g;
    assert_ch_ok(ch_tensor_alloc(&g, ref->dtype, ref->ndim, ref->shape, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    gt_download(cx, dev, &g);
    if (memcmp(g.data, ref->data, ref->nbytes) != 0) {
        int64_t n = ch_tensor_numel(ref), bad = -1;
        size_t es = ch_dtype_size(ref->dtype);
        for (int64_t i = 0; i < n && bad < 0; i++)
            if (memcmp((char *)g.data + i * es, (char *)ref->data + i * es, es)) bad = i;
        ch_tensor_free(&g);
        fail_msg("%s: device data differs from the host data (first at element %lld)", what,
                 (long long)bad);
    }
    ch_tensor_free(&g);
}

static void test_reorder(void **state)
{
    contexts();
    ch_compute_t *cx = cx32;
    int64_t s[4] = {3, 16, 7, 5};
    ch_tensor_t h, hn, dp, dn, dp2, dn2, back;
    assert_ch_ok(ch_tensor_alloc(&h, CH_F32, 4, s, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    gt_fill(ch_tensor_f32(&h), ch_tensor_numel(&h), 1, -3, 3);
    assert_ch_ok(ch_tensor_alloc(&hn, CH_F32, 4, s, CH_LAYOUT_NHWC, CH_DEV_CPU, 0));
    assert_ch_ok(ch_op_reorder(cx, &h, &hn)); /* CPU: the NHWC bytes expected */
    assert_ch_ok(ch_tensor_alloc(&dp, CH_F32, 4, s, CH_LAYOUT_PLAIN, gt_dev(), 0));
    assert_ch_ok(ch_tensor_alloc(&dn, CH_F32, 4, s, CH_LAYOUT_NHWC, gt_dev(), 0));
    assert_ch_ok(ch_tensor_alloc(&dp2, CH_F32, 4, s, CH_LAYOUT_PLAIN, gt_dev(), 0));
    assert_ch_ok(ch_tensor_alloc(&dn2, CH_F32, 4, s, CH_LAYOUT_NHWC, gt_dev(), 0));
    assert_ch_ok(ch_tensor_alloc(&back, CH_F32, 4, s, CH_LAYOUT_NHWC, CH_DEV_CPU, 0));

    /* host plain -> device plain, and back */
    assert_ch_ok(ch_op_reorder(cx, &h, &dp));
    check_exact(cx, "H2D plain->plain", &dp, &h);
    /* host plain -> device NHWC (layout change on the way) */
    assert_ch_ok(ch_op_reorder(cx, &h, &dn));
    assert_ch_ok(ch_compute_sync(cx));
    assert_ch_ok(ch_op_reorder(cx, &dn, &back)); /* D2H NHWC->NHWC: raw bytes */
    assert_ch_ok(ch_compute_sync(cx));
    assert_memory_equal(back.data, hn.data, hn.nbytes);
    check_exact(cx, "H2D plain->NHWC", &dn, &h);
    /* device NHWC -> device plain and device plain -> device NHWC */
    assert_ch_ok(ch_op_fill(cx, &dp2, NAN));
    assert_ch_ok(ch_op_reorder(cx, &dn, &dp2));
    check_exact(cx, "D2D NHWC->plain", &dp2, &h);
    assert_ch_ok(ch_op_fill(cx, &dn2, NAN));
    assert_ch_ok(ch_op_reorder(cx, &dp, &dn2));
    check_exact(cx, "D2D plain->NHWC", &dn2, &h);
    /* device NHWC -> host plain directly */
    ch_tensor_t hp2;
    assert_ch_ok(ch_tensor_alloc(&hp2, CH_F32, 4, s, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_compute_sync(cx));
    assert_ch_ok(ch_op_reorder(cx, &dn2, &hp2));
    assert_ch_ok(ch_compute_sync(cx));
    assert_memory_equal(hp2.data, h.data, h.nbytes);
    /* host NHWC -> device plain */
    assert_ch_ok(ch_op_fill(cx, &dp2, NAN));
    assert_ch_ok(ch_compute_sync(cx));
    assert_ch_ok(ch_op_reorder(cx, &hn, &dp2));
    check_exact(cx, "H2D NHWC->plain", &dp2, &h);
    /* int64 plain round trip (labels) */
    int64_t ls[1] = {1001};
    ch_tensor_t li, ld;
    assert_ch_ok(ch_tensor_alloc(&li, CH_I64, 1, ls, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    for (int i = 0; i < 1001; i++) ch_tensor_i64(&li)[i] = (int64_t)i * 1000003 - 7;
    assert_ch_ok(ch_tensor_alloc(&ld, CH_I64, 1, ls, CH_LAYOUT_PLAIN, gt_dev(), 0));
    assert_ch_ok(ch_op_reorder(cx, &li, &ld));
    check_exact(cx, "H2D int64", &ld, &li);
    ch_tensor_free(&li);
    ch_tensor_free(&ld);
    ch_tensor_free(&hp2);
    ch_tensor_free(&h);
    ch_tensor_free(&hn);
    ch_tensor_free(&dp);
    ch_tensor_free(&dn);
    ch_tensor_free(&dp2);
    ch_tensor_free(&dn2);
    ch_tensor_free(&back);
}

static void test_fill_copy_zero(void **state)
{
    contexts();
    ch_compute_t *cx = cx32;
    for (int li = 0; li < 2; li++) {
        int64_t s[4] = {2, 24, 9, 11};
        gt_pair_t a, b;
        gt_pair_rand(cx, &a, 4, s, LAYOUTS[li], 2, -1, 1);
        gt_pair_out(cx, &b, 4, s, LAYOUTS[li]);
        assert_ch_ok(ch_op_copy(cx, &a.d, &b.d));
        check_exact(cx, "copy", &b.d, &a.h);
        assert_ch_ok(ch_op_fill(cx, &b.d, 2.5f));
        for (int64_t i = 0; i < ch_tensor_numel(&b.h); i++) ch_tensor_f32(&b.h)[i] = 2.5f;
        check_exact(cx, "fill 2.5", &b.d, &b.h);
        assert_ch_ok(ch_op_zero(cx, &b.d));
        memset(b.h.data, 0, b.h.nbytes);
        check_exact(cx, "zero", &b.d, &b.h);
        gt_pair_free(&a);
        gt_pair_free(&b);
    }
    /* zero on int64 */
    int64_t ls[1] = {77};
    ch_tensor_t li, ld;
    assert_ch_ok(ch_tensor_alloc(&li, CH_I64, 1, ls, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    for (int i = 0; i < 77; i++) ch_tensor_i64(&li)[i] = i + 1;
    assert_ch_ok(ch_tensor_alloc(&ld, CH_I64, 1, ls, CH_LAYOUT_PLAIN, gt_dev(), 0));
    gt_upload(cx, &li, &ld);
    assert_ch_ok(ch_op_zero(cx, &ld));
    memset(li.data, 0, li.nbytes);
    check_exact(cx, "zero int64", &ld, &li);
    ch_tensor_free(&li);
    ch_tensor_free(&ld);
}

/* ------------------------------------------------------------ convolution */

typedef struct {
    const char *name;
    int64_t N, C, H, W, O;
    int k, s, p;
    int d, g; /* dilation, groups; 0 = 1 */
    int kw;   /* kernel width when not k (non-square); 0 = k */
} conv_case_t;

static const conv_case_t CONVS[] = {
    {"resnet stem 7x7/2 pad 3", 2, 3, 32, 32, 64, 7, 2, 3},
    {"3x3/1 pad 1", 2, 16, 14, 14, 32, 3, 1, 1},
    {"3x3/2 pad 1 (odd input)", 2, 16, 15, 15, 32, 3, 2, 1},
    {"1x1/2 downsample", 3, 32, 14, 14, 64, 1, 2, 0},
    {"3x3/1 pad 1, 64->64 (resnet layer1)", 4, 64, 8, 8, 64, 3, 1, 1},
};

/* Grouped, depthwise, dilated, non-square (cudnnSetConvolutionGroupCount,
 * cuDNN dilation) against oneDNN's grouped / dilated primitives. */
static const conv_case_t CONVX[] = {
    {"depthwise 3x3/1 pad 1", 2, 32, 14, 14, 32, 3, 1, 1, 1, 32, 0},
    {"depthwise 3x3/2 pad 1 (odd input)", 2, 16, 15, 15, 16, 3, 2, 1, 1, 16, 0},
    {"depthwise x2 multiplier", 2, 8, 9, 9, 16, 3, 1, 1, 1, 8, 0},
    {"groups 4 3x3", 2, 16, 10, 10, 32, 3, 1, 1, 1, 4, 0},
    {"dilation 2 pad 2", 2, 8, 13, 11, 16, 3, 1, 2, 2, 1, 0},
    {"dilated depthwise", 2, 16, 12, 12, 16, 3, 1, 2, 2, 16, 0},
    {"non-square 3x5 pad 2", 2, 6, 11, 9, 8, 3, 1, 2, 1, 2, 5},
};

static void conv_run(const conv_case_t *c, int bias, ch_layout_t L, ch_compute_t *gcx, int bf16)
{
    char what[256];
    int d = c->d > 1 ? c->d : 1, G = c->g > 1 ? c->g : 1, kw = c->kw > 0 ? c->kw : c->k;
    ch_conv2d_params_t p = {c->s, c->s, c->p, c->p, d, d, G};
    int64_t Ho = ch_conv_out_size_dilated(c->H, c->k, c->s, c->p, d);
    int64_t Wo = ch_conv_out_size_dilated(c->W, kw, c->s, c->p, d);
    int64_t xs[4] = {c->N, c->C, c->H, c->W}, ws[4] = {c->O, c->C / G, c->k, kw};
    int64_t bs[1] = {c->O}, ys[4] = {c->N, c->O, Ho, Wo};
    float wb = 1.0f / sqrtf((float)(c->C / G * c->k * kw));
    gt_pair_t x, w, b, y, dy, dx, dw, db;
    gt_pair_rand(gcx, &x, 4, xs, L, 11, -1, 1);
    gt_pair_rand(gcx, &w, 4, ws, CH_LAYOUT_PLAIN, 12, -wb, wb);
    gt_pair_rand(gcx, &b, 1, bs, CH_LAYOUT_PLAIN, 13, -1, 1);
    gt_pair_rand(gcx, &dy, 4, ys, L, 14, -1, 1);
    gt_pair_out(gcx, &y, 4, ys, L);
    gt_pair_out(gcx, &dx, 4, xs, L);
    gt_pair_out(gcx, &dw, 4, ws, CH_LAYOUT_PLAIN);
    gt_pair_out(gcx, &db, 1, bs, CH_LAYOUT_PLAIN);
    const ch_tensor_t *bh = bias ? &b.h : NULL, *bd = bias ? &b.d : NULL;
    ch_tensor_t *dbh = bias ? &db.h : NULL, *dbd = bias ? &db.d : NULL;

    assert_ch_ok(ch_op_conv2d_forward(cx32, &x.h, &w.h, bh, &p, &y.h));
    assert_ch_ok(ch_op_conv2d_backward_data(cx32, &dy.h, &w.h, &p, &dx.h));
    assert_ch_ok(ch_op_conv2d_backward_weights(cx32, &x.h, &dy.h, &p, &dw.h, dbh));

    assert_ch_ok(ch_op_conv2d_forward(gcx, &x.d, &w.d, bd, &p, &y.d));
    assert_ch_ok(ch_op_conv2d_backward_data(gcx, &dy.d, &w.d, &p, &dx.d));
    assert_ch_ok(ch_op_conv2d_backward_weights(gcx, &x.d, &dy.d, &p, &dw.d, dbd));

    double tf = bf16 ? TOL_BF16_FWD : TOL_FWD, tb = bf16 ? TOL_BF16_BWD : TOL_BWD;
    const char *pr = bf16 ? "bf16" : "fp32";
    snprintf(what, sizeof what, "conv %s %s%s %s: y", c->name, lname(L), bias ? " +bias" : "", pr);
    gt_compare(gcx, what, &y, tf);
    snprintf(what, sizeof what, "conv %s %s %s: dx", c->name, lname(L), pr);
    gt_compare(gcx, what, &dx, tb);
    snprintf(what, sizeof what, "conv %s %s %s: dw", c->name, lname(L), pr);
    gt_compare(gcx, what, &dw, tb);
    if (bias) {
        snprintf(what, sizeof what, "conv %s %s %s: db", c->name, lname(L), pr);
        gt_compare(gcx, what, &db, tb);
    }
    if (bf16) {
        /* autocast must actually round to bf16: fp32-exact means it was ignored */
        ch_tensor_t g;
        assert_ch_ok(ch_tensor_alloc(&g, CH_F32, 4, ys, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
        gt_download(gcx, &y.d, &g);
        double e = gt_rel_l2(ch_tensor_f32(&g), ch_tensor_f32(&y.h), ch_tensor_numel(&g));
        ch_tensor_free(&g);
        if (!(e > 1e-5))
            fail_msg("conv %s %s bf16: result equals fp32 (rel %.3g): opts.bf16 ignored?", c->name,
                     lname(L), e);
    }
    gt_pair_free(&x);
    gt_pair_free(&w);
    gt_pair_free(&b);
    gt_pair_free(&y);
    gt_pair_free(&dy);
    gt_pair_free(&dx);
    gt_pair_free(&dw);
    gt_pair_free(&db);
}

static void test_conv_fp32(void **state)
{
    contexts();
    for (size_t i = 0; i < sizeof CONVS / sizeof CONVS[0]; i++)
        for (int li = 0; li < 2; li++)
            for (int bias = 0; bias < 2; bias++) conv_run(&CONVS[i], bias, LAYOUTS[li], cx32, 0);
}

static void test_conv_bf16(void **state)
{
    GT_NEED_REAL_GPU();
    contexts();
    for (size_t i = 0; i < sizeof CONVS / sizeof CONVS[0]; i++)
        for (int li = 0; li < 2; li++)
            for (int bias = 0; bias < 2; bias++) conv_run(&CONVS[i], bias, LAYOUTS[li], cxbf, 1);
}

static void test_conv_variants(void **state)
{
    contexts();
    for (size_t i = 0; i < sizeof CONVX / sizeof CONVX[0]; i++)
        for (int li = 0; li < 2; li++)
            for (int bias = 0; bias < 2; bias++) conv_run(&CONVX[i], bias, LAYOUTS[li], cx32, 0);
}

static void test_conv_variants_bf16(void **state)
{
    GT_NEED_REAL_GPU();
    contexts();
    for (size_t i = 0; i < sizeof CONVX / sizeof CONVX[0]; i++)
        for (int li = 0; li < 2; li++) conv_run(&CONVX[i], 1, LAYOUTS[li], cxbf, 1);
}

/* Timed algorithm search (conv_search = 1) and a small workspace cap give
 * the same results. */
/* A GPU context with TF32 off and the timed algorithm search. */
static ch_compute_t *search_context(int deterministic, size_t workspace)
{
    ch_compute_options_t o;
    ch_compute_options_default(&o);
    o.gpu_device = 0;
    o.allow_tf32 = 0;
    o.conv_search = 1;
    o.deterministic = deterministic;
    o.gpu_workspace_bytes = workspace;
    ch_compute_t *cs = NULL;
    assert_ch_ok(ch_compute_create(&o, &cs));
    return cs;
}

static void test_conv_search(void **state)
{
    contexts();
    ch_compute_t *cs = search_context(0, (size_t)8 << 20);
    for (int li = 0; li < 2; li++) {
        conv_run(&CONVS[0], 0, LAYOUTS[li], cs, 0);
        conv_run(&CONVS[2], 1, LAYOUTS[li], cs, 0);
    }
    /* the second time a shape is seen, nothing is added to the cache */
    size_t n1 = ch_compute_cache_entries(cs);
    conv_run(&CONVS[2], 1, CH_LAYOUT_NHWC, cs, 0);
    assert_int_equal(ch_compute_cache_entries(cs), n1);
    ch_compute_destroy(cs);
}

/* compute.deterministic with a timed search (where cuDNN's fastest
 * backward-filter algorithms are the non-deterministic ones): every conv
 * still matches the CPU, and the weight and data gradients come out
 * bitwise the same on every run. */
static void test_conv_deterministic(void **state)
{
    contexts();
    ch_compute_t *cd = search_context(1, 0);
    for (size_t ci = 0; ci < sizeof CONVS / sizeof CONVS[0]; ci++)
        conv_run(&CONVS[ci], 1, CH_LAYOUT_NHWC, cd, 0);
    const conv_case_t *c = &CONVS[4];
    ch_conv2d_params_t p = {c->s, c->s, c->p, c->p};
    int64_t Ho = ch_conv_out_size(c->H, c->k, c->s, c->p);
    int64_t xs[4] = {c->N, c->C, c->H, c->W}, ws[4] = {c->O, c->C, c->k, c->k};
    int64_t ys[4] = {c->N, c->O, Ho, Ho};
    gt_pair_t x, w, dy, dw, dx;
    gt_pair_rand(cd, &x, 4, xs, CH_LAYOUT_NHWC, 15, -1, 1);
    gt_pair_rand(cd, &w, 4, ws, CH_LAYOUT_PLAIN, 16, -0.1f, 0.1f);
    gt_pair_rand(cd, &dy, 4, ys, CH_LAYOUT_NHWC, 17, -1, 1);
    gt_pair_out(cd, &dw, 4, ws, CH_LAYOUT_PLAIN);
    gt_pair_out(cd, &dx, 4, xs, CH_LAYOUT_NHWC);
    ch_tensor_t first_w, again_w, first_x, again_x;
    assert_ch_ok(ch_tensor_alloc(&first_w, CH_F32, 4, ws, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&again_w, CH_F32, 4, ws, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&first_x, CH_F32, 4, xs, CH_LAYOUT_NHWC, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&again_x, CH_F32, 4, xs, CH_LAYOUT_NHWC, CH_DEV_CPU, 0));
    for (int run = 0; run < 4; run++) {
        assert_ch_ok(ch_op_conv2d_backward_weights(cd, &x.d, &dy.d, &p, &dw.d, NULL));
        assert_ch_ok(ch_op_conv2d_backward_data(cd, &dy.d, &w.d, &p, &dx.d));
        gt_download(cd, &dw.d, run ? &again_w : &first_w);
        gt_download(cd, &dx.d, run ? &again_x : &first_x);
        if (run && memcmp(first_w.data, again_w.data, first_w.nbytes) != 0)
            fail_msg("compute.deterministic: dw of run %d differs from run 0", run);
        if (run && memcmp(first_x.data, again_x.data, first_x.nbytes) != 0)
            fail_msg("compute.deterministic: dx of run %d differs from run 0", run);
    }
    ch_tensor_free(&first_w);
    ch_tensor_free(&again_w);
    ch_tensor_free(&first_x);
    ch_tensor_free(&again_x);
    gt_pair_free(&x);
    gt_pair_free(&w);
    gt_pair_free(&dy);
    gt_pair_free(&dw);
    gt_pair_free(&dx);
    ch_compute_destroy(cd);
}

/* ------------------------------------------------------------- batch norm */

static void vec_rand(ch_compute_t *cx, gt_pair_t *p, int64_t C, uint64_t seed, float lo, float hi)
{
    int64_t s[1] = {C};
    gt_pair_rand(cx, p, 1, s, CH_LAYOUT_PLAIN, seed, lo, hi);
}

static void vec_out(ch_compute_t *cx, gt_pair_t *p, int64_t C)
{
    int64_t s[1] = {C};
    gt_pair_out(cx, p, 1, s, CH_LAYOUT_PLAIN);
}

typedef struct {
    int64_t N, C, H, W;
} bn_shape_t;

static const bn_shape_t BNS[] = {{4, 16, 5, 5}, {3, 24, 7, 3}, {2, 64, 14, 14}};

static void test_bn_forward(void **state)
{
    contexts();
    ch_compute_t *cx = cx32;
    const float eps = 1e-5f;
    char what[160];
    for (size_t si = 0; si < sizeof BNS / sizeof BNS[0]; si++) {
        const bn_shape_t *S = &BNS[si];
        int64_t xs[4] = {S->N, S->C, S->H, S->W};
        int64_t C = S->C;
        for (int li = 0; li < 2; li++) {
            ch_layout_t L = LAYOUTS[li];
            gt_pair_t x, w, b, rm, rv, y, mean, var, y2, m2, v2, ya, yn;
            /* an offset so mean and variance both matter */
            gt_pair_rand(cx, &x, 4, xs, L, 21 + si, -0.5f, 2.5f);
            vec_rand(cx, &w, C, 22, 0.5f, 1.5f);
            vec_rand(cx, &b, C, 23, -0.5f, 0.5f);
            vec_rand(cx, &rm, C, 24, -0.5f, 0.5f);
            vec_rand(cx, &rv, C, 25, 0.5f, 2.0f);
            gt_pair_out(cx, &y, 4, xs, L);
            gt_pair_out(cx, &ya, 4, xs, L);
            gt_pair_out(cx, &yn, 4, xs, L);
            vec_out(cx, &mean, C);
            vec_out(cx, &var, C);
            gt_pair_out(cx, &y2, 4, xs, L);
            vec_out(cx, &m2, C);
            vec_out(cx, &v2, C);

            /* stats */
            assert_ch_ok(ch_op_batchnorm_stats(cx, &x.h, &mean.h, &var.h));
            assert_ch_ok(ch_op_batchnorm_stats(cx, &x.d, &mean.d, &var.d));
            snprintf(what, sizeof what, "bn stats %s C=%lld: mean", lname(L), (long long)C);
            gt_compare(cx, what, &mean, TOL_FWD);
            snprintf(what, sizeof what, "bn stats %s C=%lld: var", lname(L), (long long)C);
            gt_compare(cx, what, &var, TOL_FWD);
            /* forward_train */
            assert_ch_ok(ch_op_batchnorm_forward_train(cx, &x.h, &w.h, &b.h, eps, &y2.h, &m2.h, &v2.h));
            assert_ch_ok(ch_op_batchnorm_forward_train(cx, &x.d, &w.d, &b.d, eps, &y2.d, &m2.d, &v2.d));
            snprintf(what, sizeof what, "bn forward_train %s C=%lld: y", lname(L), (long long)C);
            gt_compare(cx, what, &y2, TOL_FWD);
            gt_compare(cx, "bn forward_train: mean", &m2, TOL_FWD);
            gt_compare(cx, "bn forward_train: var", &v2, TOL_FWD);
            /* apply with running stats (eval), with and without affine */
            assert_ch_ok(ch_op_batchnorm_apply(cx, &x.h, &rm.h, &rv.h, &w.h, &b.h, eps, &ya.h));
            assert_ch_ok(ch_op_batchnorm_apply(cx, &x.d, &rm.d, &rv.d, &w.d, &b.d, eps, &ya.d));
            snprintf(what, sizeof what, "bn apply %s C=%lld", lname(L), (long long)C);
            gt_compare(cx, what, &ya, TOL_FWD);
            assert_ch_ok(ch_op_batchnorm_apply(cx, &x.h, &rm.h, &rv.h, NULL, NULL, eps, &yn.h));
            assert_ch_ok(ch_op_batchnorm_apply(cx, &x.d, &rm.d, &rv.d, NULL, NULL, eps, &yn.d));
            gt_compare(cx, "bn apply, affine=False", &yn, TOL_FWD);
            assert_ch_ok(ch_op_batchnorm_forward_eval(cx, &x.h, &w.h, &b.h, &rm.h, &rv.h, eps, &y.h));
            assert_ch_ok(ch_op_batchnorm_forward_eval(cx, &x.d, &w.d, &b.d, &rm.d, &rv.d, eps, &y.d));
            gt_compare(cx, "bn forward_eval", &y, TOL_FWD);
            /* apply in place (y aliases x) */
            assert_ch_ok(ch_op_batchnorm_apply(cx, &x.h, &rm.h, &rv.h, &w.h, &b.h, eps, &x.h));
            assert_ch_ok(ch_op_batchnorm_apply(cx, &x.d, &rm.d, &rv.d, &w.d, &b.d, eps, &x.d));
            gt_compare(cx, "bn apply in place", &x, TOL_FWD);
            /* running-stat update */
            assert_ch_ok(ch_op_batchnorm_update_running(cx, &rm.h, &rv.h, &mean.h, &var.h,
                                                        S->N * S->H * S->W, 0.1f));
            /* the device mean/var equal the host ones to 1e-4; use the host's */
            gt_upload(cx, &mean.h, &mean.d);
            gt_upload(cx, &var.h, &var.d);
            assert_ch_ok(ch_op_batchnorm_update_running(cx, &rm.d, &rv.d, &mean.d, &var.d,
                                                        S->N * S->H * S->W, 0.1f));
            gt_compare(cx, "bn update_running: running_mean", &rm, TOL_FWD);
            gt_compare(cx, "bn update_running: running_var", &rv, TOL_FWD);

            gt_pair_t *all[] = {&x, &w, &b, &rm, &rv, &y, &mean, &var, &y2, &m2, &v2, &ya, &yn};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) gt_pair_free(all[i]);
        }
    }
}

static void test_bn_gather_stats(void **state)
{
    contexts();
    ch_compute_t *cx = cx32;
    const int R = 4;
    const int64_t C = 40;
    int64_t counts[4] = {100, 0, 37, 1};
    int64_t rc[2] = {R, C};
    gt_pair_t means, vars, mean, var;
    gt_pair_rand(cx, &means, 2, rc, CH_LAYOUT_PLAIN, 31, -2, 2);
    gt_pair_rand(cx, &vars, 2, rc, CH_LAYOUT_PLAIN, 32, 0.1f, 3);
    vec_out(cx, &mean, C);
    vec_out(cx, &var, C);
    int64_t th = -1, td = -1;
    assert_ch_ok(ch_op_batchnorm_gather_stats(cx, &means.h, &vars.h, counts, R, &mean.h, &var.h, &th));
    assert_ch_ok(ch_op_batchnorm_gather_stats(cx, &means.d, &vars.d, counts, R, &mean.d, &var.d, &td));
    assert_int_equal(th, 138);
    assert_int_equal(td, th);
    gt_compare(cx, "bn gather_stats: mean", &mean, TOL_FWD);
    gt_compare(cx, "bn gather_stats: var", &var, TOL_FWD);
    gt_pair_free(&means);
    gt_pair_free(&vars);
    gt_pair_free(&mean);
    gt_pair_free(&var);
}

/* SyncBN over many ranks: counts by value up to 256 ranks, through the
 * device ring beyond; the counts change at every call (the last batch, a
 * new resolution), more often than the ring is long, and each result must
 * be that call's. */
static void test_bn_gather_stats_many_ranks(void **state)
{
    contexts();
    ch_compute_t *cx = cx32;
    const int64_t C = 24;
    const int Rs[3] = {256, 257, 300};
    char what[96];
    for (int ri = 0; ri < 3; ri++) {
        const int R = Rs[ri];
        int64_t rc[2] = {R, C};
        int64_t *counts = malloc((size_t)R * sizeof *counts);
        assert_non_null(counts);
        gt_pair_t means, vars, mean, var;
        gt_pair_rand(cx, &means, 2, rc, CH_LAYOUT_PLAIN, 33 + ri, -2, 2);
        gt_pair_rand(cx, &vars, 2, rc, CH_LAYOUT_PLAIN, 34 + ri, 0.1f, 3);
        vec_out(cx, &mean, C);
        vec_out(cx, &var, C);
        for (int call = 0; call < 7; call++) {
            int64_t want = 0;
            for (int r = 0; r < R; r++) {
                counts[r] = (r * 7 + call * 13) % 5 == 0 ? 0 : 1 + (r + call) % 9;
                want += counts[r];
            }
            int64_t th = -1, td = -1;
            assert_ch_ok(ch_op_batchnorm_gather_stats(cx, &means.h, &vars.h, counts, R, &mean.h,
                                                      &var.h, &th));
            assert_ch_ok(ch_op_batchnorm_gather_stats(cx, &means.d, &vars.d, counts, R, &mean.d,
                                                      &var.d, &td));
            assert_int_equal(th, want);
            assert_int_equal(td, th);
            snprintf(what, sizeof what, "bn gather_stats %d ranks, call %d: mean", R, call);
            gt_compare(cx, what, &mean, TOL_FWD);
            snprintf(what, sizeof what, "bn gather_stats %d ranks, call %d: var", R, call);
            gt_compare(cx, what, &var, TOL_FWD);
        }
        gt_pair_free(&means);
        gt_pair_free(&vars);
        gt_pair_free(&mean);
        gt_pair_free(&var);
        free(counts);
    }
}

static void test_bn_backward(void **state)
{
    contexts();
    ch_compute_t *cx = cx32;
    const float eps = 1e-5f;
    char what[160];
    for (size_t si = 0; si < sizeof BNS / sizeof BNS[0]; si++) {
        const bn_shape_t *S = &BNS[si];
        int64_t xs[4] = {S->N, S->C, S->H, S->W};
        int64_t C = S->C, cnt = S->N * S->H * S->W;
        for (int li = 0; li < 2; li++) {
            ch_layout_t L = LAYOUTS[li];
            gt_pair_t x, dy, w, mean, var, sdy, sdx, dwt, dbs, dx, dx2, dw2, db2, dxn, gsd, gsx;
            gt_pair_rand(cx, &x, 4, xs, L, 41 + si, -0.5f, 2.5f);
            gt_pair_rand(cx, &dy, 4, xs, L, 42 + si, -1, 1);
            vec_rand(cx, &w, C, 43, 0.5f, 1.5f);
            vec_out(cx, &mean, C);
            vec_out(cx, &var, C);
            /* the statistics the forward produced (host), on both sides */
            assert_ch_ok(ch_op_batchnorm_stats(cx, &x.h, &mean.h, &var.h));
            gt_upload(cx, &mean.h, &mean.d);
            gt_upload(cx, &var.h, &var.d);
            vec_out(cx, &sdy, C);
            vec_out(cx, &sdx, C);
            vec_out(cx, &dwt, C);
            vec_out(cx, &dbs, C);
            gt_pair_out(cx, &dx, 4, xs, L);
            gt_pair_out(cx, &dxn, 4, xs, L);
            gt_pair_out(cx, &dx2, 4, xs, L);
            vec_out(cx, &dw2, C);
            vec_out(cx, &db2, C);

            /* backward_reduce */
            assert_ch_ok(ch_op_batchnorm_backward_reduce(cx, &x.h, &dy.h, &mean.h, &sdy.h, &sdx.h));
            assert_ch_ok(ch_op_batchnorm_backward_reduce(cx, &x.d, &dy.d, &mean.d, &sdy.d, &sdx.d));
            snprintf(what, sizeof what, "bn backward_reduce %s C=%lld: sum_dy", lname(L), (long long)C);
            gt_compare(cx, what, &sdy, TOL_BWD);
            snprintf(what, sizeof what, "bn backward_reduce %s C=%lld: sum_dy_xmu", lname(L), (long long)C);
            gt_compare(cx, what, &sdx, TOL_BWD);

            /* the elementwise part and param_grads from the same (host) sums,
             * scaled as if all-reduced over 3 ranks */
            vec_rand(cx, &gsd, C, 44, -5, 5);
            vec_rand(cx, &gsx, C, 45, -5, 5);
            assert_ch_ok(ch_op_batchnorm_param_grads(cx, &gsd.h, &gsx.h, &var.h, eps, &dwt.h, &dbs.h));
            assert_ch_ok(ch_op_batchnorm_param_grads(cx, &gsd.d, &gsx.d, &var.d, eps, &dwt.d, &dbs.d));
            gt_compare(cx, "bn param_grads: dweight", &dwt, TOL_BWD);
            gt_compare(cx, "bn param_grads: dbias", &dbs, TOL_BWD);
            assert_ch_ok(ch_op_fill(cx, &dbs.d, NAN));
            assert_ch_ok(ch_op_batchnorm_param_grads(cx, &gsd.d, &gsx.d, &var.d, eps, NULL, &dbs.d));
            gt_compare(cx, "bn param_grads (dweight NULL): dbias", &dbs, TOL_BWD);

            assert_ch_ok(ch_op_batchnorm_backward_elemt(cx, &x.h, &dy.h, &mean.h, &var.h, eps, &w.h,
                                                        &gsd.h, &gsx.h, 3 * cnt, &dx.h));
            assert_ch_ok(ch_op_batchnorm_backward_elemt(cx, &x.d, &dy.d, &mean.d, &var.d, eps, &w.d,
                                                        &gsd.d, &gsx.d, 3 * cnt, &dx.d));
            snprintf(what, sizeof what, "bn backward_elemt %s C=%lld", lname(L), (long long)C);
            gt_compare(cx, what, &dx, TOL_BWD);
            assert_ch_ok(ch_op_batchnorm_backward_elemt(cx, &x.h, &dy.h, &mean.h, &var.h, eps, NULL,
                                                        &gsd.h, &gsx.h, 3 * cnt, &dxn.h));
            assert_ch_ok(ch_op_batchnorm_backward_elemt(cx, &x.d, &dy.d, &mean.d, &var.d, eps, NULL,
                                                        &gsd.d, &gsx.d, 3 * cnt, &dxn.d));
            gt_compare(cx, "bn backward_elemt, weight NULL", &dxn, TOL_BWD);

            /* full local backward */
            assert_ch_ok(ch_op_batchnorm_backward(cx, &x.h, &dy.h, &mean.h, &var.h, eps, &w.h,
                                                  &dx2.h, &dw2.h, &db2.h));
            assert_ch_ok(ch_op_batchnorm_backward(cx, &x.d, &dy.d, &mean.d, &var.d, eps, &w.d,
                                                  &dx2.d, &dw2.d, &db2.d));
            snprintf(what, sizeof what, "bn backward %s C=%lld: dx", lname(L), (long long)C);
            gt_compare(cx, what, &dx2, TOL_BWD);
            gt_compare(cx, "bn backward: dweight", &dw2, TOL_BWD);
            gt_compare(cx, "bn backward: dbias", &db2, TOL_BWD);
            /* without dx, and dx aliasing dy */
            assert_ch_ok(ch_op_fill(cx, &dw2.d, NAN));
            assert_ch_ok(ch_op_batchnorm_backward(cx, &x.d, &dy.d, &mean.d, &var.d, eps, &w.d,
                                                  NULL, &dw2.d, NULL));
            gt_compare(cx, "bn backward (dx, dbias NULL): dweight", &dw2, TOL_BWD);
            assert_ch_ok(ch_op_batchnorm_backward(cx, &x.d, &dy.d, &mean.d, &var.d, eps, &w.d,
                                                  &dy.d, NULL, NULL));
            gt_compare(cx, "bn backward, dx aliasing dy", &(gt_pair_t){dx2.h, dy.d}, TOL_BWD);

            gt_pair_t *all[] = {&x, &dy, &w, &mean, &var, &sdy, &sdx, &dwt, &dbs,
                                &dx, &dx2, &dw2, &db2, &dxn, &gsd, &gsx};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) gt_pair_free(all[i]);
        }
    }
}

/* ----------------------------------------------------- relu, pool, add ... */

static void test_relu(void **state)
{
    contexts();
    ch_compute_t *cx = cx32;
    for (int li = 0; li < 2; li++) {
        ch_layout_t L = LAYOUTS[li];
        int64_t s[4] = {3, 32, 9, 7};
        gt_pair_t x, y, dy, dx;
        gt_pair_rand(cx, &x, 4, s, L, 51, -1, 1);
        gt_pair_rand(cx, &dy, 4, s, L, 52, -1, 1);
        gt_pair_out(cx, &y, 4, s, L);
        gt_pair_out(cx, &dx, 4, s, L);
        assert_ch_ok(ch_op_relu_forward(cx, &x.h, &y.h));
        assert_ch_ok(ch_op_relu_forward(cx, &x.d, &y.d));
        gt_compare(cx, "relu forward", &y, 0);
        assert_ch_ok(ch_op_relu_backward(cx, &y.h, &dy.h, &dx.h));
        assert_ch_ok(ch_op_relu_backward(cx, &y.d, &dy.d, &dx.d));
        gt_compare(cx, "relu backward", &dx, 0);
        /* in place forward, and dx aliasing dy */
        assert_ch_ok(ch_op_relu_forward(cx, &x.h, &x.h));
        assert_ch_ok(ch_op_relu_forward(cx, &x.d, &x.d));
        gt_compare(cx, "relu forward in place", &x, 0);
        assert_ch_ok(ch_op_relu_backward(cx, &x.h, &dy.h, &dy.h));
        assert_ch_ok(ch_op_relu_backward(cx, &x.d, &dy.d, &dy.d));
        gt_compare(cx, "relu backward in place", &dy, 0);
        gt_pair_free(&x);
        gt_pair_free(&y);
        gt_pair_free(&dy);
        gt_pair_free(&dx);
    }
}

/* Every activation (ops.h) on the GPU vs the CPU backend, with the
 * breakpoints (-3, 0, 3, 6, Hardtanh's bounds) among the inputs; the
 * piecewise-linear kinds exactly, the others within TOL_FWD / TOL_BWD. */
static void test_activations(void **state)
{
    contexts();
    ch_compute_t *cx = cx32;
    static const ch_act_params_t kinds[] = {
        {CH_ACT_HARDTANH, 0.0f, 6.0f},  {CH_ACT_HARDTANH, -0.5f, 1.25f},
        {CH_ACT_LEAKY_RELU, 0.01f, 0}, {CH_ACT_SILU, 0, 0},
        {CH_ACT_SIGMOID, 0, 0},        {CH_ACT_TANH, 0, 0},
        {CH_ACT_GELU_ERF, 0, 0},       {CH_ACT_GELU_TANH, 0, 0},
        {CH_ACT_HARDSWISH, 0, 0},      {CH_ACT_HARDSIGMOID, 0, 0}};
    static const float bps[] = {-3.0f, 3.0f, 0.0f, 6.0f, -0.5f, 1.25f, -6.0f, 20.0f, -20.0f};
    char what[160];
    for (int li = 0; li < 2; li++) {
        ch_layout_t L = LAYOUTS[li];
        int64_t s[4] = {3, 32, 9, 7};
        gt_pair_t x, dy, y, dx;
        assert_ch_ok(ch_tensor_alloc(&x.h, CH_F32, 4, s, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
        assert_ch_ok(ch_tensor_alloc(&x.d, CH_F32, 4, s, L, gt_dev(), 0));
        gt_fill(ch_tensor_f32(&x.h), ch_tensor_numel(&x.h), 151, -8, 8);
        for (size_t i = 0; i < 9 * 50; i++) ch_tensor_f32(&x.h)[i * 11] = bps[i % 9];
        gt_upload(cx, &x.h, &x.d);
        gt_pair_rand(cx, &dy, 4, s, L, 152, -1, 1);
        for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
            const ch_act_params_t *p = &kinds[k];
            int exact = p->kind == CH_ACT_HARDTANH || p->kind == CH_ACT_LEAKY_RELU;
            gt_pair_out(cx, &y, 4, s, L);
            gt_pair_out(cx, &dx, 4, s, L);
            assert_ch_ok(ch_op_act_forward(cx, p, &x.h, &y.h));
            assert_ch_ok(ch_op_act_forward(cx, p, &x.d, &y.d));
            snprintf(what, sizeof what, "%s(%g, %g) forward %s", ch_act_name(p->kind),
                     (double)p->alpha, (double)p->beta, lname(L));
            gt_compare(cx, what, &y, exact ? 0 : TOL_FWD);
            assert_ch_ok(ch_op_act_backward(cx, p, &x.h, &dy.h, &dx.h));
            assert_ch_ok(ch_op_act_backward(cx, p, &x.d, &dy.d, &dx.d));
            snprintf(what, sizeof what, "%s(%g, %g) backward %s", ch_act_name(p->kind),
                     (double)p->alpha, (double)p->beta, lname(L));
            gt_compare(cx, what, &dx, exact ? 0 : TOL_BWD);
            gt_pair_free(&y);
            gt_pair_free(&dx);
        }
        gt_pair_free(&x);
        gt_pair_free(&dy);
    }
}

/* LayerNorm2d (ConvNeXt) forward and backward on the GPU vs the CPU. */
static void test_layernorm2d(void **state)
{
    contexts();
    ch_compute_t *cx = cx32;
    for (int li = 0; li < 2; li++) {
        ch_layout_t L = LAYOUTS[li];
        int64_t s[4] = {3, 48, 9, 7}, C = 48, P = 3 * 9 * 7;
        gt_pair_t x, w, b, dy, y, mean, rstd, dx, dw, db;
        gt_pair_rand(cx, &x, 4, s, L, 161, -2, 3);
        gt_pair_rand(cx, &w, 1, &C, CH_LAYOUT_PLAIN, 162, 0.5f, 1.5f);
        gt_pair_rand(cx, &b, 1, &C, CH_LAYOUT_PLAIN, 163, -0.5f, 0.5f);
        gt_pair_rand(cx, &dy, 4, s, L, 164, -1, 1);
        gt_pair_out(cx, &y, 4, s, L);
        gt_pair_out(cx, &dx, 4, s, L);
        gt_pair_out(cx, &mean, 1, &P, CH_LAYOUT_PLAIN);
        gt_pair_out(cx, &rstd, 1, &P, CH_LAYOUT_PLAIN);
        gt_pair_out(cx, &dw, 1, &C, CH_LAYOUT_PLAIN);
        gt_pair_out(cx, &db, 1, &C, CH_LAYOUT_PLAIN);
        assert_ch_ok(ch_op_layernorm2d_forward(cx, &x.h, &w.h, &b.h, 1e-6f, &y.h, &mean.h, &rstd.h));
        assert_ch_ok(ch_op_layernorm2d_forward(cx, &x.d, &w.d, &b.d, 1e-6f, &y.d, &mean.d, &rstd.d));
        gt_compare(cx, "layernorm2d forward", &y, TOL_FWD);
        gt_compare(cx, "layernorm2d mean", &mean, TOL_FWD);
        gt_compare(cx, "layernorm2d rstd", &rstd, TOL_FWD);
        assert_ch_ok(ch_op_layernorm2d_backward(cx, &x.h, &dy.h, &mean.h, &rstd.h, &w.h, &dx.h,
                                                &dw.h, &db.h));
        assert_ch_ok(ch_op_layernorm2d_backward(cx, &x.d, &dy.d, &mean.d, &rstd.d, &w.d, &dx.d,
                                                &dw.d, &db.d));
        gt_compare(cx, "layernorm2d dx", &dx, TOL_BWD);
        gt_compare(cx, "layernorm2d dweight", &dw, TOL_BWD);
        gt_compare(cx, "layernorm2d dbias", &db, TOL_BWD);
        gt_pair_t *all[] = {&x, &w, &b, &dy, &y, &mean, &rstd, &dx, &dw, &db};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) gt_pair_free(all[i]);
    }
}

/* Dropout: the CUDA kernel draws the CPU kernel's mask, bit for bit. */
static void test_dropout(void **state)
{
    contexts();
    ch_compute_t *cx = cx32;
    int64_t s4[4] = {6, 16, 5, 7}, s2[2] = {37, 301};
    for (int v = 0; v < 2; v++) {
        const int nd = v ? 2 : 4;
        const int64_t *s = v ? s2 : s4;
        gt_pair_t x, y;
        gt_pair_rand(cx, &x, nd, s, CH_LAYOUT_PLAIN, 61 + v, -1, 1);
        gt_pair_out(cx, &y, nd, s, CH_LAYOUT_PLAIN);
        const float ps[] = {0.0f, 0.3f, 0.5f, 1.0f};
        for (int k = 0; k < 4; k++) {
            ch_dropout_key_t key = {123, (uint64_t)k, 7, 3, 2};
            assert_ch_ok(ch_op_dropout(cx, &x.h, ps[k], &key, &y.h));
            assert_ch_ok(ch_op_dropout(cx, &x.d, ps[k], &key, &y.d));
            gt_compare(cx, "dropout", &y, 0);
        }
        gt_pair_free(&x);
        gt_pair_free(&y);
    }
}

static void test_maxpool(void **state)
{
    contexts();
    ch_compute_t *cx = cx32;
    const ch_pool2d_params_t p = {3, 3, 2, 2, 1, 1}; /* the ResNet stem's */
    const int64_t HW[3][2] = {{13, 13}, {16, 16}, {112, 9}};
    for (int hi = 0; hi < 3; hi++)
        for (int li = 0; li < 2; li++) {
            ch_layout_t L = LAYOUTS[li];
            int64_t H = HW[hi][0], W = HW[hi][1];
            int64_t xs[4] = {2, 16, H, W};
            int64_t ys[4] = {2, 16, ch_conv_out_size(H, 3, 2, 1), ch_conv_out_size(W, 3, 2, 1)};
            gt_pair_t x, y, dy, dx;
            char what[128];
            gt_pair_rand(cx, &x, 4, xs, L, 61 + hi, -1, 1);
            gt_pair_rand(cx, &dy, 4, ys, L, 62 + hi, -1, 1);
            gt_pair_out(cx, &y, 4, ys, L);
            gt_pair_out(cx, &dx, 4, xs, L);
            assert_ch_ok(ch_op_maxpool2d_forward(cx, &x.h, &p, &y.h));
            assert_ch_ok(ch_op_maxpool2d_forward(cx, &x.d, &p, &y.d));
            snprintf(what, sizeof what, "maxpool 3x3/2 pad 1 %lldx%lld %s forward", (long long)H,
                     (long long)W, lname(L));
            gt_compare(cx, what, &y, 0);
            assert_ch_ok(ch_op_maxpool2d_backward(cx, &x.h, &dy.h, &p, &dx.h));
            assert_ch_ok(ch_op_maxpool2d_backward(cx, &x.d, &dy.d, &p, &dx.d));
            snprintf(what, sizeof what, "maxpool 3x3/2 pad 1 %lldx%lld %s backward", (long long)H,
                     (long long)W, lname(L));
            gt_compare(cx, what, &dx, TOL_BWD);
            gt_pair_free(&x);
            gt_pair_free(&y);
            gt_pair_free(&dy);
            gt_pair_free(&dx);
        }
}

static void test_avgpool(void **state)
{
    contexts();
    ch_compute_t *cx = cx32;
    for (int li = 0; li < 2; li++) {
        ch_layout_t L = LAYOUTS[li];
        int64_t xs[4] = {5, 64, 7, 7}, y4[4] = {5, 64, 1, 1}, y2[2] = {5, 64};
        gt_pair_t x, ya, yb, dya, dyb, dxa, dxb;
        gt_pair_rand(cx, &x, 4, xs, L, 71, -1, 1);
        gt_pair_rand(cx, &dya, 2, y2, CH_LAYOUT_PLAIN, 72, -1, 1);
        gt_pair_rand(cx, &dyb, 4, y4, L, 73, -1, 1);
        gt_pair_out(cx, &ya, 2, y2, CH_LAYOUT_PLAIN);
        gt_pair_out(cx, &yb, 4, y4, L);
        gt_pair_out(cx, &dxa, 4, xs, L);
        gt_pair_out(cx, &dxb, 4, xs, L);
        assert_ch_ok(ch_op_avgpool_global_forward(cx, &x.h, &ya.h));
        assert_ch_ok(ch_op_avgpool_global_forward(cx, &x.d, &ya.d));
        gt_compare(cx, "global avgpool forward -> (N,C)", &ya, TOL_FWD);
        assert_ch_ok(ch_op_avgpool_global_forward(cx, &x.h, &yb.h));
        assert_ch_ok(ch_op_avgpool_global_forward(cx, &x.d, &yb.d));
        gt_compare(cx, "global avgpool forward -> (N,C,1,1)", &yb, TOL_FWD);
        assert_ch_ok(ch_op_avgpool_global_backward(cx, &dya.h, &dxa.h));
        assert_ch_ok(ch_op_avgpool_global_backward(cx, &dya.d, &dxa.d));
        gt_compare(cx, "global avgpool backward from (N,C)", &dxa, TOL_BWD);
        assert_ch_ok(ch_op_avgpool_global_backward(cx, &dyb.h, &dxb.h));
        assert_ch_ok(ch_op_avgpool_global_backward(cx, &dyb.d, &dxb.d));
        gt_compare(cx, "global avgpool backward from (N,C,1,1)", &dxb, TOL_BWD);
        gt_pair_t *all[] = {&x, &ya, &yb, &dya, &dyb, &dxa, &dxb};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) gt_pair_free(all[i]);
    }
}

/* AvgPool2d (count_include_pad both ways, ceil_mode, a window past the
 * right padding, non-square), MaxPool2d with ceil_mode and
 * AdaptiveAvgPool2d to (h, w): GPU == CPU bitwise forward (same summation
 * order), backward within TOL_BWD (the gather adds in the CPU's order too). */
static void test_pool_variants(void **state)
{
    contexts();
    ch_compute_t *cx = cx32;
    /* kind 0 avg, 1 max, 2 adaptive (Ho, Wo in kernel_h / kernel_w) */
    static const struct {
        int kind;
        int64_t H, W;
        ch_pool2d_params_t p;
    } cases[] = {
        {0, 7, 9, {3, 3, 2, 2, 1, 1, 0, 1}},
        {0, 7, 9, {3, 3, 2, 2, 1, 1, 0, 0}},
        {0, 6, 6, {3, 3, 2, 2, 1, 1, 1, 1}},
        {0, 6, 6, {3, 3, 2, 2, 1, 1, 1, 0}},
        {0, 5, 5, {2, 2, 2, 2, 1, 1, 1, 1}},
        {0, 8, 5, {3, 2, 2, 1, 1, 0, 0, 1}},
        {1, 7, 7, {3, 3, 2, 2, 0, 0, 1, 0}},
        {1, 5, 5, {2, 2, 2, 2, 1, 1, 1, 0}},
        {2, 7, 9, {3, 4}},
        {2, 3, 3, {5, 4}},
        {2, 14, 14, {3, 3}},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int li = 0; li < 2; li++) {
            ch_layout_t L = LAYOUTS[li];
            const ch_pool2d_params_t *p = &cases[ci].p;
            int kind = cases[ci].kind;
            int64_t H = cases[ci].H, W = cases[ci].W;
            int64_t xs[4] = {2, 16, H, W}, ys[4] = {2, 16, p->kernel_h, p->kernel_w};
            if (kind != 2) {
                ys[2] = ch_pool_out_size(H, p->kernel_h, p->stride_h, p->pad_h, p->ceil_mode);
                ys[3] = ch_pool_out_size(W, p->kernel_w, p->stride_w, p->pad_w, p->ceil_mode);
            }
            gt_pair_t x, y, dy, dx;
            char what[160];
            gt_pair_rand(cx, &x, 4, xs, L, 91 + (int)ci, -1, 1);
            gt_pair_rand(cx, &dy, 4, ys, L, 92 + (int)ci, -1, 1);
            gt_pair_out(cx, &y, 4, ys, L);
            gt_pair_out(cx, &dx, 4, xs, L);
            for (int side = 0; side < 2; side++) {
                ch_tensor_t *xt = side ? &x.d : &x.h, *yt = side ? &y.d : &y.h;
                ch_tensor_t *dyt = side ? &dy.d : &dy.h, *dxt = side ? &dx.d : &dx.h;
                if (kind == 0) {
                    assert_ch_ok(ch_op_avgpool2d_forward(cx, xt, p, yt));
                    assert_ch_ok(ch_op_avgpool2d_backward(cx, dyt, p, dxt));
                } else if (kind == 1) {
                    assert_ch_ok(ch_op_maxpool2d_forward(cx, xt, p, yt));
                    assert_ch_ok(ch_op_maxpool2d_backward(cx, xt, dyt, p, dxt));
                } else {
                    assert_ch_ok(ch_op_adaptive_avgpool2d_forward(cx, xt, yt));
                    assert_ch_ok(ch_op_adaptive_avgpool2d_backward(cx, dyt, dxt));
                }
            }
            snprintf(what, sizeof what, "%s case %zu %lldx%lld %s forward",
                     kind == 0 ? "avgpool2d" : kind == 1 ? "maxpool2d" : "adaptive avgpool",
                     ci, (long long)H, (long long)W, lname(L));
            gt_compare(cx, what, &y, 0);
            snprintf(what, sizeof what, "pool case %zu %s backward", ci, lname(L));
            gt_compare(cx, what, &dx, TOL_BWD);
            gt_pair_free(&x);
            gt_pair_free(&y);
            gt_pair_free(&dy);
            gt_pair_free(&dx);
        }
}

static void linear_run(ch_compute_t *gcx, int bf16, int bias, int64_t N, int64_t K, int64_t M)
{
    int64_t xs[2] = {N, K}, ws[2] = {M, K}, bs[1] = {M}, ys[2] = {N, M};
    float wb = 1.0f / sqrtf((float)K);
    gt_pair_t x, w, b, y, dy, dx, dw, db;
    char what[160];
    gt_pair_rand(gcx, &x, 2, xs, CH_LAYOUT_PLAIN, 81, -1, 1);
    gt_pair_rand(gcx, &w, 2, ws, CH_LAYOUT_PLAIN, 82, -wb, wb);
    gt_pair_rand(gcx, &b, 1, bs, CH_LAYOUT_PLAIN, 83, -wb, wb);
    gt_pair_rand(gcx, &dy, 2, ys, CH_LAYOUT_PLAIN, 84, -1, 1);
    gt_pair_out(gcx, &y, 2, ys, CH_LAYOUT_PLAIN);
    gt_pair_out(gcx, &dx, 2, xs, CH_LAYOUT_PLAIN);
    gt_pair_out(gcx, &dw, 2, ws, CH_LAYOUT_PLAIN);
    gt_pair_out(gcx, &db, 1, bs, CH_LAYOUT_PLAIN);
    assert_ch_ok(ch_op_linear_forward(cx32, &x.h, &w.h, bias ? &b.h : NULL, &y.h));
    assert_ch_ok(ch_op_linear_forward(gcx, &x.d, &w.d, bias ? &b.d : NULL, &y.d));
    assert_ch_ok(ch_op_linear_backward_data(cx32, &dy.h, &w.h, &dx.h));
    assert_ch_ok(ch_op_linear_backward_data(gcx, &dy.d, &w.d, &dx.d));
    assert_ch_ok(ch_op_linear_backward_weights(cx32, &x.h, &dy.h, &dw.h, bias ? &db.h : NULL));
    assert_ch_ok(ch_op_linear_backward_weights(gcx, &x.d, &dy.d, &dw.d, bias ? &db.d : NULL));
    double tf = bf16 ? TOL_BF16_FWD : TOL_FWD, tb = bf16 ? TOL_BF16_BWD : TOL_BWD;
    const char *pr = bf16 ? "bf16" : "fp32";
    snprintf(what, sizeof what, "linear %lldx%lld->%lld%s %s: y", (long long)N, (long long)K,
             (long long)M, bias ? " +bias" : "", pr);
    gt_compare(gcx, what, &y, tf);
    snprintf(what, sizeof what, "linear %s: dx", pr);
    gt_compare(gcx, what, &dx, tb);
    snprintf(what, sizeof what, "linear %s: dw", pr);
    gt_compare(gcx, what, &dw, tb);
    if (bias) {
        snprintf(what, sizeof what, "linear %s: db", pr);
        gt_compare(gcx, what, &db, tb);
    }
    if (bf16) {
        ch_tensor_t g;
        assert_ch_ok(ch_tensor_alloc(&g, CH_F32, 2, ys, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
        gt_download(gcx, &y.d, &g);
        double e = gt_rel_l2(ch_tensor_f32(&g), ch_tensor_f32(&y.h), ch_tensor_numel(&g));
        ch_tensor_free(&g);
        if (!(e > 1e-5)) fail_msg("linear bf16: result equals fp32 (rel %.3g): opts.bf16 ignored?", e);
    }
    gt_pair_t *all[] = {&x, &w, &b, &y, &dy, &dx, &dw, &db};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) gt_pair_free(all[i]);
}

static void test_linear(void **state)
{
    contexts();
    for (int bias = 0; bias < 2; bias++) {
        linear_run(cx32, 0, bias, 37, 512, 1000); /* resnet18's fc */
        linear_run(cx32, 0, bias, 8, 2048, 10);
        if (gt_cpu_mode()) continue; /* bf16 needs the GPU backend */
        linear_run(cxbf, 1, bias, 37, 512, 1000);
        linear_run(cxbf, 1, bias, 8, 2048, 10);
    }
}

static void test_add_scale(void **state)
{
    contexts();
    ch_compute_t *cx = cx32;
    for (int li = 0; li < 2; li++) {
        ch_layout_t L = LAYOUTS[li];
        int64_t s[4] = {2, 64, 7, 9};
        gt_pair_t a, b, o;
        gt_pair_rand(cx, &a, 4, s, L, 91, -1, 1);
        gt_pair_rand(cx, &b, 4, s, L, 92, -1, 1);
        gt_pair_out(cx, &o, 4, s, L);
        assert_ch_ok(ch_op_add(cx, &a.h, &b.h, &o.h));
        assert_ch_ok(ch_op_add(cx, &a.d, &b.d, &o.d));
        gt_compare(cx, "add", &o, 0);
        assert_ch_ok(ch_op_add(cx, &a.h, &b.h, &a.h)); /* out aliases a */
        assert_ch_ok(ch_op_add(cx, &a.d, &b.d, &a.d));
        gt_compare(cx, "add, out aliasing a", &a, 0);
        assert_ch_ok(ch_op_add_inplace(cx, &b.h, &a.h));
        assert_ch_ok(ch_op_add_inplace(cx, &b.d, &a.d));
        gt_compare(cx, "add_inplace", &b, 0);
        assert_ch_ok(ch_op_scale(cx, &b.h, 0.37f));
        assert_ch_ok(ch_op_scale(cx, &b.d, 0.37f));
        gt_compare(cx, "scale", &b, 0);
        gt_pair_free(&a);
        gt_pair_free(&b);
        gt_pair_free(&o);
    }
    /* 2-D plain (gradient accumulation of fc weights) */
    int64_t s2[2] = {1000, 513};
    gt_pair_t a, b;
    gt_pair_rand(cx, &a, 2, s2, CH_LAYOUT_PLAIN, 93, -1, 1);
    gt_pair_rand(cx, &b, 2, s2, CH_LAYOUT_PLAIN, 94, -1, 1);
    assert_ch_ok(ch_op_add_inplace(cx, &a.h, &b.h));
    assert_ch_ok(ch_op_add_inplace(cx, &a.d, &b.d));
    gt_compare(cx, "add_inplace (1000,513)", &a, 0);
    gt_pair_free(&a);
    gt_pair_free(&b);
}

/* Squeeze-excitation scale and channel concat (ops.h ch_op_mul_channel*,
 * ch_op_concat_channels / ch_op_split_channels), PLAIN and NHWC: the scale
 * and copies exactly the CPU's, ds (a float sum over H*W in h, w order on
 * both) to rounding. */
static void test_channel_ops(void **state)
{
    contexts();
    ch_compute_t *cx = cx32;
    for (int li = 0; li < 2; li++) {
        ch_layout_t L = LAYOUTS[li];
        int64_t xs[4] = {3, 24, 7, 5}, ss[4] = {3, 24, 1, 1}, x2s[4] = {3, 8, 7, 5};
        int64_t cs[4] = {3, 32, 7, 5};
        gt_pair_t x, sc, dy, x2, y, dx, ds, cat, p0, p1;
        gt_pair_rand(cx, &x, 4, xs, L, 191, -1, 1);
        gt_pair_rand(cx, &sc, 4, ss, CH_LAYOUT_PLAIN, 192, 0, 1);
        gt_pair_rand(cx, &dy, 4, xs, L, 193, -1, 1);
        gt_pair_rand(cx, &x2, 4, x2s, L, 194, -1, 1);
        gt_pair_out(cx, &y, 4, xs, L);
        gt_pair_out(cx, &dx, 4, xs, L);
        gt_pair_out(cx, &ds, 4, ss, CH_LAYOUT_PLAIN);
        gt_pair_out(cx, &cat, 4, cs, L);
        gt_pair_out(cx, &p0, 4, xs, L);
        gt_pair_out(cx, &p1, 4, x2s, L);
        assert_ch_ok(ch_op_mul_channel(cx, &x.h, &sc.h, &y.h));
        assert_ch_ok(ch_op_mul_channel(cx, &x.d, &sc.d, &y.d));
        gt_compare(cx, "mul_channel", &y, 0);
        assert_ch_ok(ch_op_mul_channel_backward(cx, &x.h, &sc.h, &dy.h, &dx.h, &ds.h));
        assert_ch_ok(ch_op_mul_channel_backward(cx, &x.d, &sc.d, &dy.d, &dx.d, &ds.d));
        gt_compare(cx, "mul_channel_backward dx", &dx, 0);
        gt_compare(cx, "mul_channel_backward ds", &ds, 1e-6);
        const ch_tensor_t *ph[2] = {&x.h, &x2.h}, *pd[2] = {&x.d, &x2.d};
        assert_ch_ok(ch_op_concat_channels(cx, ph, 2, &cat.h));
        assert_ch_ok(ch_op_concat_channels(cx, pd, 2, &cat.d));
        gt_compare(cx, "concat_channels", &cat, 0);
        ch_tensor_t *qh[2] = {&p0.h, &p1.h}, *qd[2] = {&p0.d, &p1.d};
        assert_ch_ok(ch_op_split_channels(cx, &cat.h, qh, 2));
        assert_ch_ok(ch_op_split_channels(cx, &cat.d, qd, 2));
        gt_compare(cx, "split_channels part 0", &p0, 0);
        gt_compare(cx, "split_channels part 1", &p1, 0);
        gt_compare(cx, "split part 0 = x", &(gt_pair_t){x.h, p0.d}, 0);
        gt_pair_t *all[] = {&x, &sc, &dy, &x2, &y, &dx, &ds, &cat, &p0, &p1};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) gt_pair_free(all[i]);
    }
}

/* The ONNX graphs' own ops (ops.h): Add / Mul with torch broadcasting
 * (ch_op_binary and its backward), narrow on dim 1 (ch_op_copy_channels),
 * channel shuffle and y = alpha x + beta (ch_op_affine), PLAIN and NHWC on
 * the device against the CPU: the copies and the elementwise results
 * exactly the CPU's (one rounding each), the broadcast gradients (sums over
 * h, w, n) to rounding. */
static void test_graph_ops(void **state)
{
    contexts();
    ch_compute_t *cx = cx32;
    for (int li = 0; li < 2; li++) {
        ch_layout_t L = LAYOUTS[li];
        int64_t xs[4] = {3, 24, 7, 5}, bc[4] = {3, 24, 1, 1}, b1[4] = {1, 24, 1, 1};
        const int64_t *bshapes[3] = {xs, bc, b1};
        for (int bi = 0; bi < 3; bi++) {
            for (int op = 0; op < 2; op++) {
                ch_binary_op_t bop = op ? CH_BINARY_MUL : CH_BINARY_ADD;
                ch_layout_t bl = bi == 0 ? L : CH_LAYOUT_PLAIN;
                gt_pair_t a, b, dy, y, da, db;
                gt_pair_rand(cx, &a, 4, xs, L, 301 + (uint64_t)bi, -1, 1);
                gt_pair_rand(cx, &b, 4, bshapes[bi], bl, 311 + (uint64_t)bi, -1, 1);
                gt_pair_rand(cx, &dy, 4, xs, L, 321 + (uint64_t)bi, -1, 1);
                gt_pair_out(cx, &y, 4, xs, L);
                gt_pair_out(cx, &da, 4, xs, L);
                gt_pair_out(cx, &db, 4, bshapes[bi], bl);
                char what[96];
                snprintf(what, sizeof what, "binary %s, b of shape %d (%s)", op ? "mul" : "add", bi,
                         lname(L));
                assert_ch_ok(ch_op_binary(cx, bop, &a.h, &b.h, &y.h));
                assert_ch_ok(ch_op_binary(cx, bop, &a.d, &b.d, &y.d));
                gt_compare(cx, what, &y, 0);
                assert_ch_ok(ch_op_binary_backward(cx, bop, &a.h, &b.h, &dy.h, &da.h, &db.h));
                assert_ch_ok(ch_op_binary_backward(cx, bop, &a.d, &b.d, &dy.d, &da.d, &db.d));
                snprintf(what, sizeof what, "binary %s backward da, b of shape %d (%s)",
                         op ? "mul" : "add", bi, lname(L));
                gt_compare(cx, what, &da, 0);
                snprintf(what, sizeof what, "binary %s backward db, b of shape %d (%s)",
                         op ? "mul" : "add", bi, lname(L));
                gt_compare(cx, what, &db, bi == 0 ? 0 : 1e-6);
                gt_pair_t *all[] = {&a, &b, &dy, &y, &da, &db};
                for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) gt_pair_free(all[i]);
            }
        }
        /* narrow: channels [5, 5 + 11) of x into [2, 13) of a y that keeps
         * its other channels (filled alike on both sides first) */
        gt_pair_t x, y, sh, af;
        gt_pair_rand(cx, &x, 4, xs, L, 331, -1, 1);
        gt_pair_rand(cx, &y, 4, xs, L, 332, -1, 1);
        assert_ch_ok(ch_op_copy_channels(cx, &x.h, 5, &y.h, 2, 11));
        assert_ch_ok(ch_op_copy_channels(cx, &x.d, 5, &y.d, 2, 11));
        gt_compare(cx, "copy_channels", &y, 0);
        /* shufflenet's channel shuffle, 2 and 3 groups */
        for (int g = 2; g <= 3; g++) {
            gt_pair_out(cx, &sh, 4, xs, L);
            assert_ch_ok(ch_op_channel_shuffle(cx, &x.h, g, &sh.h));
            assert_ch_ok(ch_op_channel_shuffle(cx, &x.d, g, &sh.d));
            gt_compare(cx, g == 2 ? "channel_shuffle 2 groups" : "channel_shuffle 3 groups", &sh, 0);
            gt_pair_free(&sh);
        }
        gt_pair_out(cx, &af, 4, xs, L);
        assert_ch_ok(ch_op_affine(cx, &x.h, 0.75f, -0.25f, &af.h));
        assert_ch_ok(ch_op_affine(cx, &x.d, 0.75f, -0.25f, &af.d));
        gt_compare(cx, "affine", &af, 1e-7);
        gt_pair_free(&x);
        gt_pair_free(&y);
        gt_pair_free(&af);
    }
}

/* --------------------------------------------------------- loss, accuracy */

static void labels_pair(ch_compute_t *cx, ch_tensor_t *h, ch_tensor_t *d, int64_t N, int64_t K,
                        uint64_t seed)
{
    int64_t s[1] = {N};
    assert_ch_ok(ch_tensor_alloc(h, CH_I64, 1, s, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(d, CH_I64, 1, s, CH_LAYOUT_PLAIN, gt_dev(), 0));
    uint64_t st = seed;
    for (int64_t i = 0; i < N; i++) ch_tensor_i64(h)[i] = (int64_t)(gt_next(&st) % (uint64_t)K);
    gt_upload(cx, h, d);
}

static void test_cross_entropy(void **state)
{
    contexts();
    ch_compute_t *cx = cx32;
    const int64_t NK[3][2] = {{37, 1000}, {128, 10}, {1, 7}};
    for (int c = 0; c < 3; c++) {
        int64_t N = NK[c][0], K = NK[c][1], ls[2] = {N, K}, one[1] = {1};
        gt_pair_t lg, loss, dl, loss2;
        ch_tensor_t yh, yd;
        char what[128];
        gt_pair_rand(cx, &lg, 2, ls, CH_LAYOUT_PLAIN, 101 + c, -6, 6);
        labels_pair(cx, &yh, &yd, N, K, 102 + c);
        gt_pair_out(cx, &loss, 1, one, CH_LAYOUT_PLAIN);
        gt_pair_out(cx, &loss2, 1, one, CH_LAYOUT_PLAIN);
        gt_pair_out(cx, &dl, 2, ls, CH_LAYOUT_PLAIN);
        assert_ch_ok(ch_op_cross_entropy(cx, &lg.h, &yh, &loss.h, &dl.h));
        assert_ch_ok(ch_op_cross_entropy(cx, &lg.d, &yd, &loss.d, &dl.d));
        snprintf(what, sizeof what, "cross_entropy N=%lld K=%lld: loss", (long long)N, (long long)K);
        gt_compare(cx, what, &loss, TOL_FWD);
        snprintf(what, sizeof what, "cross_entropy N=%lld K=%lld: dlogits", (long long)N, (long long)K);
        gt_compare(cx, what, &dl, TOL_BWD);
        assert_ch_ok(ch_op_cross_entropy(cx, &lg.h, &yh, &loss2.h, NULL));
        assert_ch_ok(ch_op_cross_entropy(cx, &lg.d, &yd, &loss2.d, NULL));
        gt_compare(cx, "cross_entropy without dlogits: loss", &loss2, TOL_FWD);
        gt_pair_free(&lg);
        gt_pair_free(&loss);
        gt_pair_free(&loss2);
        gt_pair_free(&dl);
        ch_tensor_free(&yh);
        ch_tensor_free(&yd);
    }
}

/* An out-of-range label: CH_ERR_RANGE naming the sample and the label, on
 * the CPU from the op, on the GPU (deferred, no host wait in the op) from
 * ch_compute_sync or the next cross-entropy; that loss is NaN, and a good
 * call afterwards is clean again. */
static void test_cross_entropy_bad_label(void **state)
{
    contexts();
    ch_compute_t *cx = cx32;
    const int64_t N = 9, K = 10;
    int64_t ls[2] = {N, K}, one[1] = {1};
    gt_pair_t lg, loss;
    ch_tensor_t yh, yd;
    gt_pair_rand(cx, &lg, 2, ls, CH_LAYOUT_PLAIN, 131, -3, 3);
    labels_pair(cx, &yh, &yd, N, K, 132);
    gt_pair_out(cx, &loss, 1, one, CH_LAYOUT_PLAIN);
    for (int how = 0; how < 2; how++) { /* found by the sync, by the next call */
        ch_tensor_i64(&yh)[3] = K + 2;
        ch_tensor_i64(&yh)[7] = -1;
        gt_upload(cx, &yh, &yd);
        ch_status s = ch_op_cross_entropy(cx, &lg.d, &yd, &loss.d, NULL);
        if (s == CH_OK) {
            if (how == 0) {
                s = ch_compute_sync(cx);
            } else {
                ch_tensor_i64(&yh)[3] = 1;
                ch_tensor_i64(&yh)[7] = 2;
                gt_upload(cx, &yh, &yd);
                s = ch_op_cross_entropy(cx, &lg.d, &yd, &loss.d, NULL);
            }
        }
        assert_int_equal(s, CH_ERR_RANGE);
        assert_non_null(strstr(ch_error_message(), "label of sample 3 is 12, expected 0..9"));
        ch_error_clear();
        /* good labels: clean, and the sync reports nothing old */
        ch_tensor_i64(&yh)[3] = 1;
        ch_tensor_i64(&yh)[7] = 2;
        gt_upload(cx, &yh, &yd);
        assert_ch_ok(ch_op_cross_entropy(cx, &lg.d, &yd, &loss.d, NULL));
        assert_ch_ok(ch_compute_sync(cx));
        assert_ch_ok(ch_op_cross_entropy(cx, &lg.h, &yh, &loss.h, NULL));
        gt_compare(cx, "cross_entropy after a bad label: loss", &loss, TOL_FWD);
    }
    gt_pair_free(&lg);
    gt_pair_free(&loss);
    ch_tensor_free(&yh);
    ch_tensor_free(&yd);
}

static void test_argmax_count_correct(void **state)
{
    contexts();
    ch_compute_t *cx = cx32;
    const int64_t N = 300, K = 1000;
    int64_t ls[2] = {N, K}, ns[1] = {N};
    gt_pair_t lg;
    assert_ch_ok(ch_tensor_alloc(&lg.h, CH_F32, 2, ls, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&lg.d, CH_F32, 2, ls, CH_LAYOUT_PLAIN, gt_dev(), 0));
    float *l = ch_tensor_f32(&lg.h);
    gt_fill(l, N * K, 111, -5, 5);
    /* ties: the first maximum wins (torch.argmax / ops.h) */
    for (int64_t n = 0; n < N; n += 3) {
        int64_t a = (n * 7) % K, b = (a + 1 + n % 500) % K;
        l[n * K + a] = l[n * K + b] = 9.0f;
    }
    for (int64_t n = 1; n < N; n += 7) l[n * K + K - 1] = 8.0f; /* maximum at the end */
    for (int64_t n = 2; n < N; n += 11) l[n * K] = 8.5f;        /* maximum at the start */
    gt_upload(cx, &lg.h, &lg.d);
    ch_tensor_t ah, ad, ag, yh, yd;
    assert_ch_ok(ch_tensor_alloc(&ah, CH_I64, 1, ns, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&ag, CH_I64, 1, ns, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&ad, CH_I64, 1, ns, CH_LAYOUT_PLAIN, gt_dev(), 0));
    assert_ch_ok(ch_op_argmax(cx, &lg.h, &ah));
    assert_ch_ok(ch_op_argmax(cx, &lg.d, &ad));
    gt_download(cx, &ad, &ag);
    for (int64_t n = 0; n < N; n++)
        if (ch_tensor_i64(&ag)[n] != ch_tensor_i64(&ah)[n])
            fail_msg("argmax row %lld: GPU %lld, CPU %lld", (long long)n,
                     (long long)ch_tensor_i64(&ag)[n], (long long)ch_tensor_i64(&ah)[n]);
    /* labels: the argmax on even rows, something else on odd rows */
    assert_ch_ok(ch_tensor_alloc(&yh, CH_I64, 1, ns, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&yd, CH_I64, 1, ns, CH_LAYOUT_PLAIN, gt_dev(), 0));
    for (int64_t n = 0; n < N; n++)
        ch_tensor_i64(&yh)[n] = n % 2 ? (ch_tensor_i64(&ah)[n] + 1 + n) % K : ch_tensor_i64(&ah)[n];
    gt_upload(cx, &yh, &yd);
    int64_t ch = -1, cg = -1;
    assert_ch_ok(ch_op_count_correct(cx, &lg.h, &yh, &ch));
    assert_ch_ok(ch_op_count_correct(cx, &lg.d, &yd, &cg));
    assert_int_equal(ch, N / 2);
    assert_int_equal(cg, ch);
    gt_pair_free(&lg);
    ch_tensor_free(&ah);
    ch_tensor_free(&ad);
    ch_tensor_free(&ag);
    ch_tensor_free(&yh);
    ch_tensor_free(&yd);
}

/* --------------------------------------------------------------- optimizer */

/* torch.optim.SGD (PyTorch 1.13 _single_tensor_sgd), float32 per element. */
static void sgd_ref(float *p, const float *g, float *buf, int64_t n, int started,
                    const ch_sgd_hparams_t *h)
{
    for (int64_t i = 0; i < n; i++) {
        float d = g[i];
        if (h->weight_decay != 0.0f) d = d + h->weight_decay * p[i];
        if (h->momentum != 0.0f) {
            buf[i] = started ? h->momentum * buf[i] + (1.0f - h->dampening) * d : d;
            d = h->nesterov ? d + h->momentum * buf[i] : buf[i];
        }
        p[i] = p[i] - h->lr * d;
    }
}

static void test_sgd_step(void **state)
{
    contexts();
    ch_compute_t *cx = cx32;
    enum { NT = 5 };
    const int64_t sizes[NT] = {1, 1000, 70001, 3, 262147};
    const ch_sgd_hparams_t H[3] = {
        {0.1f, 0.9f, 0.0f, 1e-4f, 0},
        {0.05f, 0.9f, 0.0f, 5e-4f, 1},
        {0.2f, 0.0f, 0.0f, 0.0f, 0},
    };
    for (int hc = 0; hc < 3; hc++) {
        gt_pair_t p[NT], g[NT], b[NT];
        ch_sgd_tensor_t ts[NT];
        for (int i = 0; i < NT; i++) {
            gt_pair_rand(cx, &p[i], 1, &sizes[i], CH_LAYOUT_PLAIN, 121 + i, -1, 1);
            gt_pair_rand(cx, &g[i], 1, &sizes[i], CH_LAYOUT_PLAIN, 131 + i, -1, 1);
            gt_pair_rand(cx, &b[i], 1, &sizes[i], CH_LAYOUT_PLAIN, 141 + i, -1, 1);
            ts[i].param = ch_tensor_f32(&p[i].d);
            ts[i].grad = ch_tensor_f32(&g[i].d);
            ts[i].momentum_buffer = H[hc].momentum != 0.0f ? ch_tensor_f32(&b[i].d) : NULL;
            ts[i].numel = sizes[i];
            ts[i].buffer_started = 0;
        }
        for (int step = 0; step < 3; step++) {
            for (int i = 0; i < NT; i++) {
                ts[i].buffer_started = step > 0;
                sgd_ref(ch_tensor_f32(&p[i].h), ch_tensor_f32(&g[i].h), ch_tensor_f32(&b[i].h),
                        sizes[i], step > 0, &H[hc]);
            }
            assert_ch_ok(ch_op_sgd_step(cx, gt_dev(), 0, ts, NT, &H[hc]));
            /* a new gradient for the next step, same on both sides */
            for (int i = 0; i < NT; i++) {
                gt_fill(ch_tensor_f32(&g[i].h), sizes[i], 151 + 10 * step + i, -1, 1);
                gt_upload(cx, &g[i].h, &g[i].d);
            }
        }
        for (int i = 0; i < NT; i++) {
            char what[128];
            snprintf(what, sizeof what, "sgd (config %d) tensor %d numel %lld: param", hc, i,
                     (long long)sizes[i]);
            gt_compare(cx, what, &p[i], TOL_SGD);
            if (H[hc].momentum != 0.0f) {
                snprintf(what, sizeof what, "sgd (config %d) tensor %d: momentum buffer", hc, i);
                gt_compare(cx, what, &b[i], TOL_SGD);
            }
            gt_pair_free(&p[i]);
            gt_pair_free(&g[i]);
            gt_pair_free(&b[i]);
        }
    }
}

/* ------------------------------------------------------------------ uploads */

/* Two batch slots alternating as io/data/batch_feed.c uses them, with no
 * host wait but the uploads' own: each step's reads of its slot (256 copies
 * of 16 MiB, a few ms) are still queued on the compute stream, behind the
 * step before, when the upload two batches later into the same slot is
 * issued on the copy stream. Each step's result must be its own batch
 * (dense.cu's freed events), checked once at the end. */
static void test_upload_slot_reuse(void **state)
{
    GT_NEED_REAL_GPU();
    contexts();
    ch_compute_t *cx = cx32;
    enum { BATCHES = 6, READS = 256 };
    const int64_t n = (int64_t)4 << 20;
    const size_t bytes = (size_t)n * sizeof(float);
    void *m = NULL;
    int pin = 0;
    assert_ch_ok(ch_host_alloc(&m, bytes, 1, &pin));
    ch_tensor_t h, slot[2], c[BATCHES], ref[BATCHES];
    assert_ch_ok(ch_tensor_wrap(&h, m, CH_F32, 1, &n, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    for (int k = 0; k < 2; k++)
        assert_ch_ok(ch_tensor_alloc(&slot[k], CH_F32, 1, &n, CH_LAYOUT_PLAIN, CH_DEV_CUDA, 0));
    for (int b = 0; b < BATCHES; b++) {
        assert_ch_ok(ch_tensor_alloc(&c[b], CH_F32, 1, &n, CH_LAYOUT_PLAIN, CH_DEV_CUDA, 0));
        assert_ch_ok(ch_tensor_alloc(&ref[b], CH_F32, 1, &n, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    }
    assert_ch_ok(ch_compute_sync(cx));
    for (int b = 0; b < BATCHES; b++) {
        gt_fill(m, n, 200 + b, -1, 1);
        memcpy(ref[b].data, m, bytes);
        assert_ch_ok(ch_op_upload_async(cx, &h, &slot[b % 2]));
        assert_ch_ok(ch_compute_wait_upload(cx)); /* the host buffer is free again */
        for (int r = 0; r < READS; r++) assert_ch_ok(ch_op_copy(cx, &slot[b % 2], &c[b]));
    }
    char what[96];
    for (int b = 0; b < BATCHES; b++) {
        snprintf(what, sizeof what, "step %d's reads of slot %d (next upload queued behind)", b,
                 b % 2);
        check_exact(cx, what, &c[b], &ref[b]);
    }
    for (int k = 0; k < 2; k++) ch_tensor_free(&slot[k]);
    for (int b = 0; b < BATCHES; b++) {
        ch_tensor_free(&c[b]);
        ch_tensor_free(&ref[b]);
    }
    ch_host_free(m, pin);
}

static void test_upload_async(void **state)
{
    GT_NEED_REAL_GPU();
    contexts();
    ch_compute_t *cx = cx32;
    int64_t s1[4] = {8, 3, 32, 32}, s2[4] = {4, 16, 9, 9};
    size_t b1 = 8 * 3 * 32 * 32 * sizeof(float), b2 = 4 * 16 * 9 * 9 * sizeof(float);
    void *m1 = NULL, *m2 = NULL;
    int pin1 = 0, pin2 = 0;
    assert_ch_ok(ch_host_alloc(&m1, b1, 1, &pin1));
    assert_ch_ok(ch_host_alloc(&m2, b2, 1, &pin2));
    assert_true(pin1 && pin2); /* a GPU is visible: page-locked memory */
    ch_tensor_t h1, h2, d1, d2, d2n, r1, r2;
    assert_ch_ok(ch_tensor_wrap(&h1, m1, CH_F32, 4, s1, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_wrap(&h2, m2, CH_F32, 4, s2, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    gt_fill(m1, ch_tensor_numel(&h1), 161, -1, 1);
    gt_fill(m2, ch_tensor_numel(&h2), 162, -1, 1);
    assert_ch_ok(ch_tensor_alloc(&r1, CH_F32, 4, s1, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&r2, CH_F32, 4, s2, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    memcpy(r1.data, m1, b1);
    memcpy(r2.data, m2, b2);
    assert_ch_ok(ch_tensor_alloc(&d1, CH_F32, 4, s1, CH_LAYOUT_PLAIN, gt_dev(), 0));
    assert_ch_ok(ch_tensor_alloc(&d2, CH_F32, 4, s2, CH_LAYOUT_PLAIN, gt_dev(), 0));
    assert_ch_ok(ch_tensor_alloc(&d2n, CH_F32, 4, s2, CH_LAYOUT_NHWC, gt_dev(), 0));
    for (int round = 0; round < 3; round++) {
        assert_ch_ok(ch_op_fill(cx, &d1, NAN));
        assert_ch_ok(ch_op_fill(cx, &d2, NAN));
        assert_ch_ok(ch_op_fill(cx, &d2n, NAN));
        assert_ch_ok(ch_compute_sync(cx)); /* the fills done before the copies land */
        /* three uploads queued, one wait (a loader batch: images, and more) */
        assert_ch_ok(ch_op_upload_async(cx, &h1, &d1));
        assert_ch_ok(ch_op_upload_async(cx, &h2, &d2));
        assert_ch_ok(ch_op_upload_async(cx, &h2, &d2n)); /* with a layout change */
        assert_ch_ok(ch_compute_wait_upload(cx));
        /* the host buffers may be reused now: scribble, the device keeps the batch */
        memset(m1, 0xff, b1);
        memset(m2, 0xff, b2);
        /* work queued on the compute stream after the wait sees the data */
        ch_tensor_t c1;
        assert_ch_ok(ch_tensor_alloc(&c1, CH_F32, 4, s1, CH_LAYOUT_PLAIN, gt_dev(), 0));
        assert_ch_ok(ch_op_copy(cx, &d1, &c1));
        check_exact(cx, "upload_async (8,3,32,32) plain, copied after the wait", &c1, &r1);
        ch_tensor_free(&c1);
        check_exact(cx, "upload_async (4,16,9,9) plain", &d2, &r2);
        check_exact(cx, "upload_async (4,16,9,9) plain -> NHWC", &d2n, &r2);
        /* next batch */
        gt_fill(m1, ch_tensor_numel(&h1), 170 + round, -1, 1);
        gt_fill(m2, ch_tensor_numel(&h2), 180 + round, -1, 1);
        memcpy(r1.data, m1, b1);
        memcpy(r2.data, m2, b2);
    }
    /* nothing queued: the wait is a no-op */
    assert_ch_ok(ch_compute_wait_upload(cx));
    ch_tensor_free(&d1);
    ch_tensor_free(&d2);
    ch_tensor_free(&d2n);
    ch_tensor_free(&r1);
    ch_tensor_free(&r2);
    ch_host_free(m1, pin1);
    ch_host_free(m2, pin2);
}

/* Blocked layouts never appear on the GPU: rejected, naming the layout. */
static void test_blocked_layout_rejected(void **state)
{
    GT_NEED_REAL_GPU();
    contexts();
    int64_t s[4] = {2, 16, 4, 4};
    ch_tensor_t x, y;
    assert_ch_ok(ch_tensor_alloc(&x, CH_F32, 4, s, CH_LAYOUT_NCHW8C, CH_DEV_CUDA, 0));
    assert_ch_ok(ch_tensor_alloc(&y, CH_F32, 4, s, CH_LAYOUT_NCHW8C, CH_DEV_CUDA, 0));
    assert_ch_error(ch_op_relu_forward(cx32, &x, &y), CH_ERR_UNSUPPORTED, "nChw8c");
    ch_tensor_free(&x);
    ch_tensor_free(&y);
}

/* ------------------------------------------- error paths (no GPU needed) */

/* ch_compute_describe on a GPU context names the GPU backend first and the
 * host's after; on a CPU context only the host. Runs everywhere: without a
 * GPU, a CUDA build says the GPU backend is not set up (and why). */
static void test_describe(void **state)
{
    (void)state;
    char line[512];
    ch_compute_options_t o;
    ch_compute_options_default(&o);
    o.num_threads = 1;
    ch_compute_t *cpu = NULL, *gpu = NULL;
    assert_ch_ok(ch_compute_create(&o, &cpu));
    ch_compute_describe(cpu, line, sizeof line);
    assert_non_null(strstr(line, "oneDNN"));
    assert_null(strstr(line, "GPU"));
    o.gpu_device = 0;
    o.deterministic = 1;
    assert_ch_ok(ch_compute_create(&o, &gpu));
    ch_compute_describe(gpu, line, sizeof line);
    print_message("# compute: %s\n", line);
    int ndev = 0;
    if (ch_device_count(&ndev) != CH_OK) ch_error_clear();
    if (!ch_device_backend_compiled()) {
        assert_null(strstr(line, "GPU")); /* no GPU backend: the host line only */
    } else if (ndev > 0) {
        assert_true(strncmp(line, "CUDA GPU 0 ", 11) == 0);
        assert_non_null(strstr(line, "cuDNN"));
        assert_non_null(strstr(line, "(deterministic only)"));
        assert_non_null(strstr(line, "; host oneDNN"));
    } else {
        assert_true(strncmp(line, "GPU 0: backend not set up (", 27) == 0);
        assert_non_null(strstr(line, "; host oneDNN"));
    }
    /* a short buffer: truncated, terminated */
    char small[24];
    ch_compute_describe(gpu, small, sizeof small);
    assert_int_equal(strlen(small), sizeof small - 1);
    ch_compute_destroy(cpu);
    ch_compute_destroy(gpu);
}

static void test_errors(void **state)
{
    ch_compute_t *cx = NULL;
    ch_compute_options_t o;
    ch_compute_options_default(&o);
    o.num_threads = 1;
    assert_ch_ok(ch_compute_create(&o, &cx));
    int64_t s[4] = {2, 3, 4, 4};
    float host[96];
    memset(host, 0, sizeof host);
    /* a device tensor header over a pointer nothing dereferences: every call
     * below must fail in argument checking, before any backend work */
    static float fake_dev[1];
    ch_tensor_t h, h2, g, g2;
    assert_ch_ok(ch_tensor_wrap(&h, host, CH_F32, 4, s, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_wrap(&h2, host, CH_F32, 4, s, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_wrap(&g, fake_dev, CH_F32, 4, s, CH_LAYOUT_PLAIN, CH_DEV_CUDA, 0));
    assert_ch_ok(ch_tensor_wrap(&g2, fake_dev, CH_F32, 4, s, CH_LAYOUT_PLAIN, CH_DEV_CUDA, 0));

    assert_ch_error(ch_op_upload_async(cx, &g, &g2), CH_ERR_INVALID, "host src");
    assert_ch_error(ch_op_upload_async(cx, &h, &h2), CH_ERR_INVALID, "GPU dst");
    assert_ch_error(ch_op_upload_async(cx, NULL, &g), CH_ERR_INVALID, "NULL");
    int64_t s2[4] = {2, 3, 4, 5};
    ch_tensor_t g3;
    assert_ch_ok(ch_tensor_wrap(&g3, fake_dev, CH_F32, 4, s2, CH_LAYOUT_PLAIN, CH_DEV_CUDA, 0));
    assert_ch_error(ch_op_upload_async(cx, &h, &g3), CH_ERR_INVALID, ""); /* shape */
    assert_ch_error(ch_op_copy(cx, &h, &g), CH_ERR_INVALID, "another device");
    assert_ch_error(ch_op_add(cx, &h, &g, &h2), CH_ERR_INVALID, "");
    assert_ch_ok(ch_compute_wait_upload(cx)); /* nothing queued */
    assert_null(ch_compute_stream(cx, CH_DEV_CPU));

    ch_sgd_hparams_t hp = {0.1f, 0.9f, 0.0f, 0.0f, 0};
    float pp[4] = {0}, gg[4] = {0};
    ch_sgd_tensor_t t = {pp, gg, NULL, 4, 0};
    assert_ch_error(ch_op_sgd_step(cx, CH_DEV_CUDA, 0, &t, -1, &hp), CH_ERR_INVALID, "");
    assert_ch_error(ch_op_sgd_step(cx, CH_DEV_CUDA, 0, &t, 1, &hp), CH_ERR_INVALID,
                    "momentum buffer");
    assert_ch_error(ch_op_sgd_step(cx, CH_DEV_CUDA, 0, &t, 1, NULL), CH_ERR_INVALID, "");
    assert_ch_error(ch_op_sgd_step(cx, (ch_devkind_t)7, 0, &t, 1, &hp), CH_ERR_INVALID, "");
    assert_ch_ok(ch_op_sgd_step(cx, CH_DEV_CUDA, 0, &t, 0, &hp)); /* nothing to do */

    if (gt_no_gpu_reason()[0]) {
        /* no GPU: GPU work is refused (no backend, or no device) */
        ch_tensor_t g4;
        assert_ch_ok(ch_tensor_wrap(&g4, fake_dev, CH_F32, 4, s, CH_LAYOUT_PLAIN, CH_DEV_CUDA, 0));
        assert_ch_error(ch_op_relu_forward(cx, &g, &g4), CH_ERR_UNSUPPORTED, "");
        hp.momentum = 0.0f;
        t.param = fake_dev;
        t.grad = fake_dev;
        t.numel = 1;
        assert_ch_error(ch_op_sgd_step(cx, CH_DEV_CUDA, 0, &t, 1, &hp), CH_ERR_UNSUPPORTED, "");
        assert_ch_error(ch_op_upload_async(cx, &h, &g), CH_ERR_UNSUPPORTED, "");
        assert_null(ch_compute_stream(cx, CH_DEV_CUDA));
        int n = -1;
        assert_ch_ok(ch_device_count(&n));
        assert_int_equal(n, 0);
        void *pm = NULL;
        int pinned = 1;
        assert_ch_ok(ch_host_alloc(&pm, 4096, 1, &pinned)); /* falls back to plain memory */
        assert_non_null(pm);
        assert_int_equal(pinned, 0);
        ch_host_free(pm, pinned);
    }
    ch_compute_destroy(cx);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_describe),
        cmocka_unit_test(test_reorder),
        cmocka_unit_test(test_fill_copy_zero),
        cmocka_unit_test(test_upload_async),
        cmocka_unit_test(test_upload_slot_reuse),
        cmocka_unit_test(test_blocked_layout_rejected),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_conv_fp32),
        cmocka_unit_test(test_conv_bf16),
        cmocka_unit_test(test_conv_search),
        cmocka_unit_test(test_conv_deterministic),
        cmocka_unit_test(test_bn_forward),
        cmocka_unit_test(test_bn_gather_stats),
        cmocka_unit_test(test_bn_gather_stats_many_ranks),
        cmocka_unit_test(test_bn_backward),
        cmocka_unit_test(test_relu),
        cmocka_unit_test(test_activations),
        cmocka_unit_test(test_layernorm2d),
        cmocka_unit_test(test_graph_ops),
        cmocka_unit_test(test_maxpool),
        cmocka_unit_test(test_conv_variants),
        cmocka_unit_test(test_conv_variants_bf16),
        cmocka_unit_test(test_pool_variants),
        cmocka_unit_test(test_avgpool),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_add_scale),
        cmocka_unit_test(test_channel_ops),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_cross_entropy_bad_label),
        cmocka_unit_test(test_argmax_count_correct),
        cmocka_unit_test(test_sgd_step),
    };
    int rc = ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
    ch_compute_destroy(cxbf);
    ch_compute_destroy(cx32);
    return rc;
}
