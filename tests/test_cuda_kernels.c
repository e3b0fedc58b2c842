/* GPU tests of the CUDA "kernels" ops (framework/ops/cuda/{batchnorm,loss,
 * sgd}.cu) against the CPU backend on the same inputs: batch norm statistics,
 * apply, running-stat update, full and SyncBN backward pieces, gather_stats,
 * cross-entropy, argmax, count_correct and the fused SGD step. Covers the
 * kernels' own paths: channel-first and channel-last reductions with one and
 * many slices, float4 and scalar elementwise kernels (a misaligned view
 * forces the scalar one), run-to-run determinism (bitwise), the bad-label
 * error, blocked layouts rejected, and the SGD table cache.
 *
 * Data moves with cudaMemcpy (this program is built only with CUDA), so it
 * depends on nothing but the ops under test. Where no GPU is visible every
 * test runs its plumbing with CPU tensors on both sides (CPU against CPU)
 * and reports SKIP with that reason.
 *
 * Tolerances: statistics and sums 1e-5 relative (both sides accumulate in
 * double), elementwise results 1e-5 relative to the largest value (the GPU
 * may fuse multiply-adds); running stats and SGD bit for bit (the GPU
 * kernels round every operation like the CPU loops). */
#include "config.h"

#include "tests/harness.h"

#include "framework/tensor/device.h"
#include "framework/ops/ops.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ch_devkind_t DEV = CH_DEV_CPU; /* where the "GPU" side lives */
static ch_compute_t *cx;

static void need_dev(void)
{
    int n = 0;
    assert_ch_ok(ch_device_count(&n));
    DEV = n > 0 ? CH_DEV_CUDA : CH_DEV_CPU;
    if (DEV == CH_DEV_CUDA) assert_ch_ok(ch_device_set(0));
}

static void done(void)
{
    if (DEV == CH_DEV_CPU)
        ch_test_skip("no GPU visible (ch_device_count() = 0): ran the test plumbing CPU against "
                     "CPU only");
}

/* ------------------------------------------------------------- helpers */

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static float urand(void) /* [-1, 1) */
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)((double)(rs >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void h2d_bytes(void *d, const void *h, size_t n)
{
    if (DEV == CH_DEV_CUDA) {
        assert_int_equal(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice), cudaSuccess);
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    } else {
        memcpy(d, h, n);
    }
}

static void d2h_bytes(void *h, const void *d, size_t n)
{
    assert_ch_ok(ch_compute_sync(cx)); /* ops run on the context's own stream */
    if (DEV == CH_DEV_CUDA)
        assert_int_equal(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost), cudaSuccess);
    else
        memcpy(h, d, n);
}

/* device twin of a host tensor (same dtype, shape, layout), filled from it */
static void up(const ch_tensor_t *h, ch_tensor_t *d)
{
    assert_ch_ok(ch_tensor_alloc(d, h->dtype, h->ndim, h->shape, h->layout, DEV, 0));
    if (h->nbytes) h2d_bytes(d->data, h->data, h->nbytes);
}

/* empty device tensor like a host one */
static void dlike(const ch_tensor_t *h, ch_tensor_t *d)
{
    assert_ch_ok(ch_tensor_alloc(d, h->dtype, h->ndim, h->shape, h->layout, DEV, 0));
}

/* host copy of a device tensor (same layout) */
static void down(const ch_tensor_t *d, ch_tensor_t *h)
{
    assert_ch_ok(ch_tensor_alloc(h, d->dtype, d->ndim, d->shape, d->layout, CH_DEV_CPU, 0));
    if (d->nbytes) d2h_bytes(h->data, d->data, d->nbytes);
}

static void hvec(ch_tensor_t *t, int64_t C, float lo, float hi)
{
    assert_ch_ok(ch_tensor_alloc(t, CH_F32, 1, &C, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    float *p = t->data;
    for (int64_t i = 0; i < C; i++) p[i] = lo + (hi - lo) * 0.5f * (urand() + 1.0f);
}

/* max |got - want| / max(max |want|, floor) <= tol, else fail naming what */
static void close_to(const ch_tensor_t *dev_got, const ch_tensor_t *want, double tol,
                     double fl, const char *what, const char *ctx)
{
    ch_tensor_t got;
    down(dev_got, &got);
    const float *a = got.data, *b = want->data;
    int64_t n = ch_tensor_numel(want), worst = -1;
    double mx = 0.0, mref = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= mx)) {
            mx = d;
            worst = i;
        }
        if (fabs((double)b[i]) > mref) mref = fabs((double)b[i]);
    }
    double e = mx / (mref > fl ? mref : fl);
    if (!(e <= tol))
        fail_msg("%s (%s): relative error %.3g > %.1g at element %lld (GPU %.9g, CPU %.9g)", what,
                 ctx, e, tol, (long long)worst, worst >= 0 ? (double)a[worst] : 0.0,
                 worst >= 0 ? (double)b[worst] : 0.0);
    ch_tensor_free(&got);
}

static void bits_equal(const ch_tensor_t *dev_got, const ch_tensor_t *want, const char *what,
                       const char *ctx)
{
    ch_tensor_t got;
    down(dev_got, &got);
    if (memcmp(got.data, want->data, want->nbytes) != 0) {
        const float *a = got.data, *b = want->data;
        int64_t i = 0;
        while (a[i] == b[i] || (a[i] != a[i] && b[i] != b[i])) i++;
        fail_msg("%s (%s): not bit-identical at element %lld (GPU %.9g, CPU %.9g)", what, ctx,
                 (long long)i, (double)a[i], (double)b[i]);
    }
    ch_tensor_free(&got);
}

/* two device tensors hold the same bytes (determinism) */
static void same_bytes(const ch_tensor_t *d1, const ch_tensor_t *d2, const char *what,
                       const char *ctx)
{
    ch_tensor_t a, b;
    down(d1, &a);
    down(d2, &b);
    if (memcmp(a.data, b.data, a.nbytes) != 0)
        fail_msg("%s (%s): two runs on the same input differ", what, ctx);
    ch_tensor_free(&a);
    ch_tensor_free(&b);
}

static void frees(ch_tensor_t *ts, int n)
{
    for (int i = 0; i < n; i++) ch_tensor_free(&ts[i]);
}

/* ------------------------------------------------------------ batch norm */

typedef struct {
    int ndim;
    int64_t N, C, H, W;
    ch_layout_t layout;
    int misalign; /* 1: the device x/y/dy/dx start 4 bytes into their block */
} bn_case;

/* Device tensor over a block allocated one float longer when misaligned
 * (ch_tensor_wrap; *blk owns the storage). */
static void up_maybe_off(const ch_tensor_t *h, int off, ch_tensor_t *blk, ch_tensor_t *d)
{
    if (!off) {
        up(h, d);
        blk->data = NULL;
        blk->owns = 0;
        return;
    }
    int64_t n = ch_tensor_numel(h) + 1;
    assert_ch_ok(ch_tensor_alloc(blk, CH_F32, 1, &n, CH_LAYOUT_PLAIN, DEV, 0));
    assert_ch_ok(ch_tensor_wrap(d, (float *)blk->data + 1, h->dtype, h->ndim, h->shape,
                                h->layout, DEV, 0));
    if (h->nbytes) h2d_bytes(d->data, h->data, h->nbytes);
}

static void bn_one(const bn_case *k)
{
    char ctx[160];
    snprintf(ctx, sizeof ctx, "%s x (%lld,%lld,%lld,%lld) %s%s", k->ndim == 2 ? "2-D" : "4-D",
             (long long)k->N, (long long)k->C, (long long)k->H, (long long)k->W,
             ch_layout_name(k->layout), k->misalign ? " misaligned" : "");
    const int64_t C = k->C;
    const int64_t shape4[4] = {k->N, k->C, k->H, k->W}, shape2[2] = {k->N, k->C};
    const int64_t *shape = k->ndim == 4 ? shape4 : shape2;
    const int64_t count = k->ndim == 4 ? k->N * k->H * k->W : k->N;
    const float eps = 1e-5f;

    /* host inputs in the case's layout: x with an offset mean per channel */
    ch_tensor_t xp, x, dyp, dy;
    assert_ch_ok(ch_tensor_alloc(&xp, CH_F32, k->ndim, shape, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&dyp, CH_F32, k->ndim, shape, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    const int64_t HW = k->ndim == 4 ? k->H * k->W : 1;
    for (int64_t i = 0; i < ch_tensor_numel(&xp); i++) {
        int64_t c = (i / HW) % C;
        ((float *)xp.data)[i] = 3.0f + 0.25f * (float)c + urand();
        ((float *)dyp.data)[i] = urand();
    }
    assert_ch_ok(ch_tensor_alloc(&x, CH_F32, k->ndim, shape, k->layout, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&dy, CH_F32, k->ndim, shape, k->layout, CH_DEV_CPU, 0));
    assert_ch_ok(ch_op_reorder(cx, &xp, &x));
    assert_ch_ok(ch_op_reorder(cx, &dyp, &dy));
    ch_tensor_t w, b, rm, rv;
    hvec(&w, C, 0.5f, 1.5f);
    hvec(&b, C, -0.5f, 0.5f);
    hvec(&rm, C, -1.0f, 1.0f);
    hvec(&rv, C, 0.5f, 2.0f);

    /* CPU reference */
    ch_tensor_t y, mean, var, dx, dw, db, s1, s2, dxe, rm_c, rv_c;
    assert_ch_ok(ch_tensor_alloc(&y, CH_F32, k->ndim, shape, k->layout, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&dx, CH_F32, k->ndim, shape, k->layout, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&dxe, CH_F32, k->ndim, shape, k->layout, CH_DEV_CPU, 0));
    hvec(&mean, C, 0, 0);
    hvec(&var, C, 0, 0);
    hvec(&dw, C, 0, 0);
    hvec(&db, C, 0, 0);
    hvec(&s1, C, 0, 0);
    hvec(&s2, C, 0, 0);
    assert_ch_ok(ch_tensor_alloc(&rm_c, CH_F32, 1, &C, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&rv_c, CH_F32, 1, &C, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    memcpy(rm_c.data, rm.data, rm.nbytes);
    memcpy(rv_c.data, rv.data, rv.nbytes);
    assert_ch_ok(ch_op_batchnorm_forward_train(cx, &x, &w, &b, eps, &y, &mean, &var));
    assert_ch_ok(ch_op_batchnorm_update_running(cx, &rm_c, &rv_c, &mean, &var, count, 0.1f));
    assert_ch_ok(ch_op_batchnorm_backward(cx, &x, &dy, &mean, &var, eps, &w, &dx, &dw, &db));
    assert_ch_ok(ch_op_batchnorm_backward_reduce(cx, &x, &dy, &mean, &s1, &s2));
    const int64_t total = 3 * count; /* as if two more ranks held data */
    assert_ch_ok(ch_op_batchnorm_backward_elemt(cx, &x, &dy, &mean, &var, eps, &w, &s1, &s2,
                                                total, &dxe));
    ch_tensor_t pdw, pdb;
    hvec(&pdw, C, 0, 0);
    hvec(&pdb, C, 0, 0);
    assert_ch_ok(ch_op_batchnorm_param_grads(cx, &s1, &s2, &var, eps, &pdw, &pdb));

    /* device side */
    ch_tensor_t xb, yb, dyb, dxb, Dx, Dy, Ddy, Ddx;
    up_maybe_off(&x, k->misalign, &xb, &Dx);
    up_maybe_off(&y, k->misalign, &yb, &Dy);
    up_maybe_off(&dy, k->misalign, &dyb, &Ddy);
    up_maybe_off(&dx, k->misalign, &dxb, &Ddx);
    ch_tensor_t Dw, Db, Dm, Dv, Dm2, Dv2, Drm, Drv, Ddw, Ddb, Ds1, Ds2, Dmc, Dvc, Dy2;
    up(&w, &Dw);
    up(&b, &Db);
    dlike(&mean, &Dm);
    dlike(&var, &Dv);
    dlike(&mean, &Dm2);
    dlike(&var, &Dv2);
    up(&rm, &Drm);
    up(&rv, &Drv);
    dlike(&dw, &Ddw);
    dlike(&db, &Ddb);
    dlike(&s1, &Ds1);
    dlike(&s2, &Ds2);
    up(&mean, &Dmc); /* the CPU statistics, so backward compares like with like */
    up(&var, &Dvc);
    dlike(&y, &Dy2);

    assert_ch_ok(ch_op_batchnorm_forward_train(cx, &Dx, &Dw, &Db, eps, &Dy, &Dm, &Dv));
    close_to(&Dm, &mean, 1e-5, 1e-3, "mean", ctx);
    close_to(&Dv, &var, 1e-5, 1e-3, "var", ctx);
    close_to(&Dy, &y, 1e-5, 1e-3, "y", ctx);
    /* determinism: the same input gives the same bits */
    assert_ch_ok(ch_op_batchnorm_forward_train(cx, &Dx, &Dw, &Db, eps, &Dy2, &Dm2, &Dv2));
    same_bytes(&Dm, &Dm2, "mean", ctx);
    same_bytes(&Dv, &Dv2, "var", ctx);
    same_bytes(&Dy, &Dy2, "y", ctx);
    /* eval-style apply in place (y aliases x) with the CPU statistics */
    {
        ch_tensor_t ya, Dxa;
        assert_ch_ok(ch_tensor_alloc(&ya, CH_F32, k->ndim, shape, k->layout, CH_DEV_CPU, 0));
        assert_ch_ok(ch_op_batchnorm_apply(cx, &x, &mean, &var, &w, &b, eps, &ya));
        up(&x, &Dxa);
        assert_ch_ok(ch_op_batchnorm_apply(cx, &Dxa, &Dmc, &Dvc, &Dw,
                                           &Db, eps, &Dxa));
        close_to(&Dxa, &ya, 1e-5, 1e-3, "apply in place", ctx);
        ch_tensor_free(&Dxa);
        ch_tensor_free(&ya);
    }

    assert_ch_ok(ch_op_batchnorm_update_running(cx, &Drm, &Drv, &Dmc, &Dvc, count, 0.1f));
    bits_equal(&Drm, &rm_c, "running_mean", ctx);
    bits_equal(&Drv, &rv_c, "running_var", ctx);

    assert_ch_ok(ch_op_batchnorm_backward(cx, &Dx, &Ddy, &Dmc, &Dvc, eps, &Dw, &Ddx, &Ddw, &Ddb));
    close_to(&Ddx, &dx, 1e-5, 1e-3, "dx", ctx);
    close_to(&Ddw, &dw, 1e-5, 1e-3, "dweight", ctx);
    close_to(&Ddb, &db, 1e-5, 1e-3, "dbias", ctx);
    /* only the parameter gradients (dx NULL) */
    assert_ch_ok(ch_op_batchnorm_backward(cx, &Dx, &Ddy, &Dmc, &Dvc, eps, &Dw, NULL, &Ddw, NULL));
    close_to(&Ddw, &dw, 1e-5, 1e-3, "dweight (dx NULL)", ctx);

    assert_ch_ok(ch_op_batchnorm_backward_reduce(cx, &Dx, &Ddy, &Dmc, &Ds1, &Ds2));
    close_to(&Ds1, &s1, 1e-5, 1e-3, "sum_dy", ctx);
    close_to(&Ds2, &s2, 1e-5, 1e-3, "sum_dy_xmu", ctx);
    /* elementwise backward from the CPU sums, dx aliasing dy */
    {
        ch_tensor_t Ds1c, Ds2c;
        up(&s1, &Ds1c);
        up(&s2, &Ds2c);
        assert_ch_ok(ch_op_batchnorm_backward_elemt(cx, &Dx, &Ddy, &Dmc, &Dvc, eps, &Dw, &Ds1c,
                                                    &Ds2c, total, &Ddy));
        close_to(&Ddy, &dxe, 1e-5, 1e-3, "dx (backward_elemt, in place)", ctx);
        assert_ch_ok(ch_op_batchnorm_param_grads(cx, &Ds1c, &Ds2c, &Dvc, eps, &Ddw, &Ddb));
        bits_equal(&Ddw, &pdw, "param_grads dweight", ctx);
        bits_equal(&Ddb, &pdb, "param_grads dbias", ctx);
        ch_tensor_free(&Ds1c);
        ch_tensor_free(&Ds2c);
    }

    ch_tensor_t all[] = {xp, x, dyp, dy, w, b, rm, rv, y, mean, var, dx, dw, db, s1, s2, dxe,
                         rm_c, rv_c, pdw, pdb, Dw, Db, Dm, Dv, Dm2, Dv2, Drm, Drv, Ddw, Ddb,
                         Ds1, Ds2, Dmc, Dvc, Dy2};
    frees(all, (int)(sizeof all / sizeof all[0]));
    if (k->misalign) {
        ch_tensor_free(&xb);
        ch_tensor_free(&yb);
        ch_tensor_free(&dyb);
        ch_tensor_free(&dxb);
    } else {
        ch_tensor_free(&Dx);
        ch_tensor_free(&Dy);
        ch_tensor_free(&Ddy);
        ch_tensor_free(&Ddx);
    }
}

static void test_batchnorm(void **state)
{
    (void)state;
    need_dev();
    static const bn_case cases[] = {
        {4, 4, 3, 5, 7, CH_LAYOUT_PLAIN, 0},     /* scalar channel-first */
        {4, 8, 16, 8, 8, CH_LAYOUT_PLAIN, 0},    /* float4 channel-first */
        {4, 32, 4, 56, 56, CH_LAYOUT_PLAIN, 0},  /* many slices per channel */
        {4, 8, 64, 7, 7, CH_LAYOUT_NHWC, 0},     /* float4 channel-last */
        {4, 64, 32, 28, 28, CH_LAYOUT_NHWC, 0},  /* many row slices */
        {4, 5, 6, 3, 3, CH_LAYOUT_NHWC, 0},      /* C % 4 != 0: scalar */
        {4, 6, 40, 5, 5, CH_LAYOUT_NHWC, 1},     /* misaligned: scalar */
        {4, 6, 16, 4, 4, CH_LAYOUT_PLAIN, 1},    /* misaligned: scalar */
        {4, 16, 48, 1, 1, CH_LAYOUT_PLAIN, 0},   /* HW 1: channel-last view */
        {2, 64, 12, 1, 1, CH_LAYOUT_PLAIN, 0},   /* BatchNorm1d (N,C) */
        {2, 33, 7, 1, 1, CH_LAYOUT_PLAIN, 0},
        {4, 2, 520, 2, 2, CH_LAYOUT_NHWC, 0},    /* C > 512: several channel groups */
    };
    assert_ch_ok(ch_compute_create(NULL, &cx));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) bn_one(&cases[i]);
    if (DEV == CH_DEV_CUDA) {
        /* blocked layouts never reach the GPU kernels */
        ch_tensor_t xb, m, v;
        int64_t s[4] = {2, 16, 3, 3}, C = 16;
        assert_ch_ok(ch_tensor_alloc(&xb, CH_F32, 4, s, CH_LAYOUT_NCHW16C, DEV, 0));
        assert_ch_ok(ch_tensor_alloc(&m, CH_F32, 1, &C, CH_LAYOUT_PLAIN, DEV, 0));
        assert_ch_ok(ch_tensor_alloc(&v, CH_F32, 1, &C, CH_LAYOUT_PLAIN, DEV, 0));
        assert_ch_error(ch_op_batchnorm_stats(cx, &xb, &m, &v), CH_ERR_UNSUPPORTED, "nChw16c");
        ch_tensor_free(&xb);
        ch_tensor_free(&m);
        ch_tensor_free(&v);
    }
    ch_compute_destroy(cx);
    cx = NULL;
    done();
}

static void test_gather_stats(void **state)
{
    (void)state;
    need_dev();
    assert_ch_ok(ch_compute_create(NULL, &cx));
    const int R = 4;
    const int64_t C = 37, s[2] = {R, C};
    int64_t counts[2][4] = {{5, 0, 7, 1}, {100, 3, 0, 9}};
    ch_tensor_t ms, vs, m, v;
    assert_ch_ok(ch_tensor_alloc(&ms, CH_F32, 2, s, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&vs, CH_F32, 2, s, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    for (int64_t i = 0; i < R * C; i++) {
        ((float *)ms.data)[i] = 2.0f + urand();
        ((float *)vs.data)[i] = 1.0f + urand() * 0.5f;
    }
    hvec(&m, C, 0, 0);
    hvec(&v, C, 0, 0);
    ch_tensor_t Dms, Dvs, Dm, Dv;
    up(&ms, &Dms);
    up(&vs, &Dvs);
    dlike(&m, &Dm);
    dlike(&v, &Dv);
    for (int t = 0; t < 2; t++) { /* the second call changes the counts (re-upload) */
        int64_t tot = 0, dtot = 0;
        assert_ch_ok(ch_op_batchnorm_gather_stats(cx, &ms, &vs, counts[t], R, &m, &v, &tot));
        assert_ch_ok(ch_op_batchnorm_gather_stats(cx, &Dms, &Dvs, counts[t], R, &Dm, &Dv, &dtot));
        assert_int_equal(tot, dtot);
        close_to(&Dm, &m, 1e-6, 1e-3, "gathered mean", t ? "counts 100,3,0,9" : "counts 5,0,7,1");
        close_to(&Dv, &v, 1e-6, 1e-3, "gathered var", t ? "counts 100,3,0,9" : "counts 5,0,7,1");
    }
    ch_tensor_t all[] = {ms, vs, m, v, Dms, Dvs, Dm, Dv};
    frees(all, 8);
    ch_compute_destroy(cx);
    cx = NULL;
    done();
}

/* ------------------------------------------------------------------- loss */

static void test_loss(void **state)
{
    (void)state;
    need_dev();
    assert_ch_ok(ch_compute_create(NULL, &cx));
    const int64_t shapes[][2] = {{64, 10}, {3, 1000}, {7, 1}, {33, 37}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t N = shapes[si][0], K = shapes[si][1], s[2] = {N, K}, one = 1;
        char ctx[64];
        snprintf(ctx, sizeof ctx, "logits (%lld,%lld)", (long long)N, (long long)K);
        ch_tensor_t lg, lab, loss, dl, am;
        assert_ch_ok(ch_tensor_alloc(&lg, CH_F32, 2, s, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
        assert_ch_ok(ch_tensor_alloc(&lab, CH_I64, 1, &N, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
        assert_ch_ok(ch_tensor_alloc(&loss, CH_F32, 1, &one, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
        assert_ch_ok(ch_tensor_alloc(&dl, CH_F32, 2, s, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
        assert_ch_ok(ch_tensor_alloc(&am, CH_I64, 1, &N, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
        float *L = lg.data;
        for (int64_t i = 0; i < N * K; i++) /* coarse values: ties for argmax */
            L[i] = 4.0f * (float)(int)(urand() * 3.0f) + (si == 3 ? 0.0f : urand());
        if (N > 5 && K > 4) {
            L[5 * K + 3] = NAN; /* NaN is the maximum (torch.argmax) */
            L[4 * K + 1] = INFINITY;
        }
        for (int64_t n = 0; n < N; n++)
            ((int64_t *)lab.data)[n] = (int64_t)((urand() + 1.0f) * 0.5f * (float)K) % K;
        ch_tensor_t Dlg, Dlab, Dloss, Ddl, Dam;
        up(&lg, &Dlg);
        up(&lab, &Dlab);
        dlike(&loss, &Dloss);
        dlike(&dl, &Ddl);
        dlike(&am, &Dam);
        assert_ch_ok(ch_op_argmax(cx, &lg, &am));
        assert_ch_ok(ch_op_argmax(cx, &Dlg, &Dam));
        {
            ch_tensor_t got;
            down(&Dam, &got);
            if (memcmp(got.data, am.data, am.nbytes) != 0) fail_msg("argmax (%s) differs", ctx);
            ch_tensor_free(&got);
        }
        int64_t c1 = -1, c2 = -2;
        assert_ch_ok(ch_op_count_correct(cx, &lg, &lab, &c1));
        assert_ch_ok(ch_op_count_correct(cx, &Dlg, &Dlab, &c2));
        assert_int_equal(c1, c2);
        /* the loss is finite only without the planted NaN */
        if (!(N > 5 && K > 4)) {
            assert_ch_ok(ch_op_cross_entropy(cx, &lg, &lab, &loss, &dl));
            assert_ch_ok(ch_op_cross_entropy(cx, &Dlg, &Dlab, &Dloss, &Ddl));
            close_to(&Dloss, &loss, 1e-6, 1e-6, "loss", ctx);
            close_to(&Ddl, &dl, 1e-6, 1e-9, "dlogits", ctx);
            assert_ch_ok(ch_op_cross_entropy(cx, &Dlg, &Dlab, &Dloss, NULL));
            close_to(&Dloss, &loss, 1e-6, 1e-6, "loss (no dlogits)", ctx);
        } else {
            L[5 * K + 3] = 0.5f;
            L[4 * K + 1] = 1.0f;
            h2d_bytes(Dlg.data, lg.data, lg.nbytes);
            assert_ch_ok(ch_op_cross_entropy(cx, &lg, &lab, &loss, &dl));
            assert_ch_ok(ch_op_cross_entropy(cx, &Dlg, &Dlab, &Dloss, &Ddl));
            close_to(&Dloss, &loss, 1e-6, 1e-6, "loss", ctx);
            close_to(&Ddl, &dl, 1e-6, 1e-9, "dlogits", ctx);
            /* a label out of range names the first bad sample */
            ((int64_t *)lab.data)[2] = K;
            ((int64_t *)lab.data)[4] = -1;
            h2d_bytes(Dlab.data, lab.data, lab.nbytes);
            assert_ch_error(ch_op_cross_entropy(cx, &Dlg, &Dlab, &Dloss, &Ddl), CH_ERR_RANGE,
                            "label of sample 2 is");
        }
        ch_tensor_t all[] = {lg, lab, loss, dl, am, Dlg, Dlab, Dloss, Ddl, Dam};
        frees(all, 10);
    }
    ch_compute_destroy(cx);
    cx = NULL;
    done();
}

/* -------------------------------------------------------------------- sgd */

static void test_sgd(void **state)
{
    (void)state;
    need_dev();
    assert_ch_ok(ch_compute_create(NULL, &cx));
    enum { NP = 4 };
    const int64_t sizes[NP] = {1, 5000, 0, 40000}; /* 40000: several chunks */
    const ch_sgd_hparams_t hs[] = {
        {0.1f, 0.0f, 0.0f, 1e-4f, 0},
        {0.1f, 0.9f, 0.0f, 5e-4f, 0},
        {0.05f, 0.9f, 0.0f, 1e-4f, 1},
        {0.2f, 0.8f, 0.25f, 0.0f, 0},
    };
    for (size_t hi = 0; hi < sizeof hs / sizeof hs[0]; hi++) {
        char ctx[64];
        snprintf(ctx, sizeof ctx, "momentum %g nesterov %d dampening %g", (double)hs[hi].momentum,
                 hs[hi].nesterov, (double)hs[hi].dampening);
        ch_tensor_t hp[NP], hg[NP], hb[NP], dp[NP], dg[NP], db[NP];
        ch_sgd_tensor_t th[NP], td[NP];
        for (int i = 0; i < NP; i++) {
            int64_t n = sizes[i];
            hvec(&hp[i], n, -1.0f, 1.0f);
            hvec(&hg[i], n, -1.0f, 1.0f);
            hvec(&hb[i], n, 7.0f, 7.0f); /* garbage the first step overwrites */
            up(&hp[i], &dp[i]);
            up(&hg[i], &dg[i]);
            up(&hb[i], &db[i]);
            th[i] = (ch_sgd_tensor_t){hp[i].data, hg[i].data, hb[i].data, n, 0};
            td[i] = (ch_sgd_tensor_t){dp[i].data, dg[i].data, db[i].data, n, 0};
        }
        size_t entries = 0;
        for (int step = 0; step < 3; step++) {
            for (int i = 0; i < NP; i++) {
                th[i].buffer_started = td[i].buffer_started = step > 0;
                if (step == 2 && i == 1) th[i].buffer_started = td[i].buffer_started = 0;
            }
            assert_ch_ok(ch_op_sgd_step(cx, CH_DEV_CPU, 0, th, NP, &hs[hi]));
            assert_ch_ok(ch_op_sgd_step(cx, DEV, 0, td, NP, &hs[hi]));
            for (int i = 0; i < NP; i++) {
                if (!sizes[i]) continue;
                bits_equal(&dp[i], &hp[i], "param", ctx);
                if (hs[hi].momentum != 0.0f) bits_equal(&db[i], &hb[i], "momentum buffer", ctx);
            }
            /* the tensor list is cached: no new entries after the first step */
            if (step == 0) entries = ch_compute_cache_entries(cx);
            else assert_int_equal(ch_compute_cache_entries(cx), entries);
            for (int i = 0; i < NP; i++) { /* new gradients for the next step */
                float *g = hg[i].data;
                for (int64_t e = 0; e < sizes[i]; e++) g[e] = urand();
                if (sizes[i]) h2d_bytes(dg[i].data, hg[i].data, hg[i].nbytes);
            }
        }
        for (int i = 0; i < NP; i++) {
            ch_tensor_t all[] = {hp[i], hg[i], hb[i], dp[i], dg[i], db[i]};
            frees(all, 6);
        }
    }
    ch_compute_destroy(cx);
    cx = NULL;
    done();
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batchnorm),
        cmocka_unit_test(test_gather_stats),
        cmocka_unit_test(test_loss),
        cmocka_unit_test(test_sgd),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
