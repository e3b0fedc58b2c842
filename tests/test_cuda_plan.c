/* Tests for framework/ops/cuda/dense_plan (host side of the CUDA dense ops).
 *
 * Runs without a GPU: the planning helpers (compute-layout choice, workspace
 * carving, the algorithm cache and its keys) and the per-element index and
 * max-pooling code the CUDA kernels execute (dense_plan.h, compiled here for
 * the host) are checked against brute force and against the CPU backend's
 * ops (layout definition via ch_op_reorder, max pooling forward/backward
 * bitwise, including ties, -inf and NaN).
 */
#include "config.h"

#include "tests/harness.h"

#include "framework/ops/ops.h"
#include "framework/ops/cuda/dense_plan.h"
#include "framework/tensor/tensor.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_pick_layout(void **state)
{
    (void)state;
    assert_int_equal(ch_cd_pick_layout(CH_LAYOUT_NHWC, 10, CH_LAYOUT_NHWC, 99), CH_LAYOUT_NHWC);
    assert_int_equal(ch_cd_pick_layout(CH_LAYOUT_PLAIN, 10, CH_LAYOUT_PLAIN, 99),
                     CH_LAYOUT_PLAIN);
    /* the stem: 3-channel plain image in, 64-channel nhwc out -> nhwc */
    assert_int_equal(ch_cd_pick_layout(CH_LAYOUT_NHWC, 64 * 112 * 112, CH_LAYOUT_PLAIN,
                                       3 * 224 * 224),
                     CH_LAYOUT_NHWC);
    assert_int_equal(ch_cd_pick_layout(CH_LAYOUT_NHWC, 10, CH_LAYOUT_PLAIN, 11), CH_LAYOUT_PLAIN);
    /* ties go to the first */
    assert_int_equal(ch_cd_pick_layout(CH_LAYOUT_NHWC, 10, CH_LAYOUT_PLAIN, 10), CH_LAYOUT_NHWC);
    assert_int_equal(ch_cd_pick_layout(CH_LAYOUT_PLAIN, 10, CH_LAYOUT_NHWC, 10), CH_LAYOUT_PLAIN);
}

static void test_fits_int(void **state)
{
    (void)state;
    int64_t ok[3] = {0, 1, INT_MAX};
    int64_t big[2] = {1, (int64_t)INT_MAX + 1};
    int64_t neg[1] = {-1};
    assert_true(ch_cd_fits_int(ok, 3));
    assert_false(ch_cd_fits_int(big, 2));
    assert_false(ch_cd_fits_int(neg, 1));
}

static void test_carve(void **state)
{
    (void)state;
    ch_cd_carve_t c;
    ch_cd_carve_init(&c);
    int a = ch_cd_carve_add(&c, 100);
    int z = ch_cd_carve_add(&c, 0);
    int b = ch_cd_carve_add(&c, 1);
    int d = ch_cd_carve_add(&c, 512);
    assert_int_equal(a, 0);
    assert_int_equal(z, 1);
    assert_int_equal(b, 2);
    assert_int_equal(d, 3);
    assert_int_equal(c.off[a], 0);
    assert_int_equal(c.off[b], 256);
    assert_int_equal(c.off[d], 512);
    assert_int_equal(c.total, 1024);
    static char buf[1024];
    void *base = buf;
    assert_ptr_equal(ch_cd_carve_ptr(&c, base, a), base);
    assert_null(ch_cd_carve_ptr(&c, base, z));
    assert_ptr_equal(ch_cd_carve_ptr(&c, base, d), (char *)base + 512);
    assert_null(ch_cd_carve_ptr(&c, NULL, a));
    assert_null(ch_cd_carve_ptr(&c, base, 7));
    /* pieces never overlap and stay aligned */
    for (int i = 0; i < c.n; i++) {
        assert_int_equal(c.off[i] % CH_CD_ALIGN, 0);
        for (int j = i + 1; j < c.n; j++)
            if (c.len[i] && c.len[j]) assert_true(c.off[i] + c.len[i] <= c.off[j]);
        assert_true(c.off[i] + c.len[i] <= c.total);
    }
    /* only-empty carve needs no memory */
    ch_cd_carve_init(&c);
    ch_cd_carve_add(&c, 0);
    ch_cd_carve_add(&c, 0);
    assert_int_equal(c.total, 0);
    /* capacity */
    ch_cd_carve_init(&c);
    for (int i = 0; i < CH_CD_CARVE_MAX; i++) assert_int_equal(ch_cd_carve_add(&c, 8), i);
    assert_int_equal(ch_cd_carve_add(&c, 8), -1);
}

static int destroyed;
static void count_destroy(void *ctx, void *v)
{
    assert_ptr_equal(ctx, &destroyed);
    free(v);
    destroyed++;
}

static void test_cache(void **state)
{
    (void)state;
    ch_cd_cache_t c;
    memset(&c, 0, sizeof c);
    int64_t k[CH_CD_KEY_LEN] = {0};
    for (int i = 0; i < 100; i++) {
        k[0] = i;
        k[5] = i * 7;
        int *v = malloc(sizeof *v);
        assert_non_null(v);
        *v = i;
        assert_int_equal(ch_cd_cache_add(&c, k, v), 0);
    }
    assert_int_equal(c.n, 100);
    for (int i = 99; i >= 0; i--) {
        k[0] = i;
        k[5] = i * 7;
        int *v = ch_cd_cache_find(&c, k);
        assert_non_null(v);
        assert_int_equal(*v, i);
    }
    k[0] = 3;
    k[5] = 22; /* not stored */
    assert_null(ch_cd_cache_find(&c, k));
    destroyed = 0;
    ch_cd_cache_free(&c, count_destroy, &destroyed);
    assert_int_equal(destroyed, 100);
    assert_int_equal(c.n, 0);
    assert_null(c.e);
}

static void test_conv_key(void **state)
{
    (void)state;
    int64_t xs[4] = {8, 64, 56, 56}, ws[4] = {64, 64, 3, 3}, ys[4] = {8, 64, 56, 56};
    ch_conv2d_params_t p = {1, 1, 1, 1};
    int64_t a[CH_CD_KEY_LEN], b[CH_CD_KEY_LEN];
    ch_cd_conv_key(a, 1, xs, ws, ys, &p, CH_LAYOUT_NHWC, 0, 1, 0);
    ch_cd_conv_key(b, 1, xs, ws, ys, &p, CH_LAYOUT_NHWC, 0, 1, 0);
    assert_memory_equal(a, b, sizeof a);
    assert_int_equal(ch_cd_key_hash(a), ch_cd_key_hash(b));
    /* every field matters */
    ch_cd_conv_key(b, 2, xs, ws, ys, &p, CH_LAYOUT_NHWC, 0, 1, 0);
    assert_memory_not_equal(a, b, sizeof a);
    ch_cd_conv_key(b, 1, xs, ws, ys, &p, CH_LAYOUT_PLAIN, 0, 1, 0);
    assert_memory_not_equal(a, b, sizeof a);
    ch_cd_conv_key(b, 1, xs, ws, ys, &p, CH_LAYOUT_NHWC, 1, 1, 0);
    assert_memory_not_equal(a, b, sizeof a);
    ch_cd_conv_key(b, 1, xs, ws, ys, &p, CH_LAYOUT_NHWC, 0, 0, 0);
    assert_memory_not_equal(a, b, sizeof a);
    ch_cd_conv_key(b, 1, xs, ws, ys, &p, CH_LAYOUT_NHWC, 0, 1, 1);
    assert_memory_not_equal(a, b, sizeof a);
    ch_conv2d_params_t q = {2, 1, 1, 1};
    ch_cd_conv_key(b, 1, xs, ws, ys, &q, CH_LAYOUT_NHWC, 0, 1, 0);
    assert_memory_not_equal(a, b, sizeof a);
    int64_t ws2[4] = {64, 64, 1, 3};
    ch_cd_conv_key(b, 1, xs, ws2, ys, &p, CH_LAYOUT_NHWC, 0, 1, 0);
    assert_memory_not_equal(a, b, sizeof a);
    int64_t xs2[4] = {9, 64, 56, 56};
    ch_cd_conv_key(b, 1, xs2, ws, ys, &p, CH_LAYOUT_NHWC, 0, 1, 0);
    assert_memory_not_equal(a, b, sizeof a);
    /* TF32 does not split bf16 entries */
    ch_cd_conv_key(a, 1, xs, ws, ys, &p, CH_LAYOUT_NHWC, 1, 0, 0);
    ch_cd_conv_key(b, 1, xs, ws, ys, &p, CH_LAYOUT_NHWC, 1, 1, 0);
    assert_memory_equal(a, b, sizeof a);
}

/* off4 / idx4 / chan agree with each other and with tensor.h's NHWC, as the
 * CPU backend's reorder writes it. */
static void test_layout_index(void **state)
{
    (void)state;
    ch_compute_t *cx;
    assert_ch_ok(ch_compute_create(NULL, &cx));
    int64_t s[4] = {2, 5, 3, 4};
    int64_t n = 2 * 5 * 3 * 4;
    ch_tensor_t a, b;
    assert_ch_ok(ch_tensor_alloc(&a, CH_F32, 4, s, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&b, CH_F32, 4, s, CH_LAYOUT_NHWC, CH_DEV_CPU, 0));
    float *A = a.data, *B = b.data;
    for (int64_t i = 0; i < n; i++) A[i] = (float)i;
    assert_ch_ok(ch_op_reorder(cx, &a, &b));
    for (int nhwc = 0; nhwc < 2; nhwc++) {
        int seen[120] = {0};
        for (int64_t i = 0; i < n; i++) {
            int64_t q, c, h, w;
            ch_cd_idx4(nhwc, 5, 3, 4, i, &q, &c, &h, &w);
            assert_true(q >= 0 && q < 2 && c >= 0 && c < 5 && h >= 0 && h < 3 && w >= 0 && w < 4);
            assert_int_equal(ch_cd_off4(nhwc, 5, 3, 4, q, c, h, w), i);
            assert_int_equal(ch_cd_chan(nhwc, 5, 12, i), c);
            seen[ch_cd_off4(0, 5, 3, 4, q, c, h, w)]++;
            /* the value at plain offset i sits at NHWC offset off4(1, ...) */
            if (!nhwc) assert_true(B[ch_cd_off4(1, 5, 3, 4, q, c, h, w)] == A[i]);
        }
        for (int64_t i = 0; i < n; i++) assert_int_equal(seen[i], 1);
    }
    ch_tensor_free(&a);
    ch_tensor_free(&b);
    ch_compute_destroy(cx);
}

/* The transpose the layout kernels do reproduces the CPU reorder both ways
 * (narrow and wide sides). */
static void test_transpose(void **state)
{
    (void)state;
    ch_compute_t *cx;
    assert_ch_ok(ch_compute_create(NULL, &cx));
    const int64_t shapes[][4] = {{2, 3, 5, 7}, {3, 16, 4, 9}, {1, 40, 1, 33}, {2, 9, 8, 8}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t *s = shapes[k];
        int64_t C = s[1], HW = s[2] * s[3], n = s[0] * C * HW;
        ch_tensor_t a, b;
        assert_ch_ok(ch_tensor_alloc(&a, CH_F32, 4, s, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
        assert_ch_ok(ch_tensor_alloc(&b, CH_F32, 4, s, CH_LAYOUT_NHWC, CH_DEV_CPU, 0));
        float *A = a.data, *B = b.data;
        for (int64_t i = 0; i < n; i++) A[i] = (float)(i * 7 % 1009) - 500.0f;
        assert_ch_ok(ch_op_reorder(cx, &a, &b));
        int64_t R, S;
        ch_cd_transpose_dims(CH_LAYOUT_PLAIN, C, HW, &R, &S);
        for (int64_t i = 0; i < n; i++)
            if (B[i] != A[ch_cd_transpose_src(i, R, S)])
                fail_msg("plain->nhwc, shape %zu, element %lld", k, (long long)i);
        ch_cd_transpose_dims(CH_LAYOUT_NHWC, C, HW, &R, &S);
        for (int64_t i = 0; i < n; i++)
            if (A[i] != B[ch_cd_transpose_src(i, R, S)])
                fail_msg("nhwc->plain, shape %zu, element %lld", k, (long long)i);
        ch_tensor_free(&a);
        ch_tensor_free(&b);
    }
    ch_compute_destroy(cx);
}

/* [lo, hi] = exactly the outputs whose (unclipped) window holds row h. */
static void test_pool_cover(void **state)
{
    (void)state;
    for (int k = 1; k <= 5; k++)
        for (int s = 1; s <= 3; s++)
            for (int p = 0; p <= k / 2; p++)
                for (int64_t H = 1; H <= 9; H++) {
                    int64_t Ho = ch_conv_out_size(H, k, s, p);
                    if (Ho < 1) continue;
                    for (int64_t h = 0; h < H; h++) {
                        int64_t lo, hi;
                        ch_cd_pool_cover(h, k, s, p, Ho, &lo, &hi);
                        for (int64_t oh = 0; oh < Ho; oh++) {
                            int in = oh * s - p <= h && h < oh * s - p + k;
                            int got = oh >= lo && oh <= hi;
                            if (in != got)
                                fail_msg("k %d s %d p %d H %lld h %lld oh %lld: cover [%lld,%lld]",
                                         k, s, p, (long long)H, (long long)h, (long long)oh,
                                         (long long)lo, (long long)hi);
                        }
                    }
                }
}

/* Bitwise float equality (NaN == NaN with the same bits). */
static void assert_same_bits(const float *a, const float *b, int64_t n, const char *what)
{
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            fail_msg("%s: element %lld: %g vs CPU %g", what, (long long)i, (double)a[i],
                     (double)b[i]);
}

typedef struct {
    int64_t N, C, H, W;
    ch_pool2d_params_t p;
} pool_case;

static void run_pool_case(ch_compute_t *cx, const pool_case *pc, ch_layout_t layout,
                          unsigned seed)
{
    int64_t xs[4] = {pc->N, pc->C, pc->H, pc->W};
    int64_t Ho = ch_conv_out_size(pc->H, pc->p.kernel_h, pc->p.stride_h, pc->p.pad_h);
    int64_t Wo = ch_conv_out_size(pc->W, pc->p.kernel_w, pc->p.stride_w, pc->p.pad_w);
    int64_t ys[4] = {pc->N, pc->C, Ho, Wo};
    ch_tensor_t x, y, dy, dx;
    assert_ch_ok(ch_tensor_alloc(&x, CH_F32, 4, xs, layout, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&dx, CH_F32, 4, xs, layout, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&y, CH_F32, 4, ys, layout, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&dy, CH_F32, 4, ys, layout, CH_DEV_CPU, 0));
    int64_t nx = ch_tensor_numel(&x), ny = ch_tensor_numel(&y);
    float *X = x.data, *DY = dy.data;
    srand(seed);
    for (int64_t i = 0; i < nx; i++) {
        int r = rand() % 7; /* few distinct values: many ties */
        X[i] = (float)(r - 3);
        if (rand() % 53 == 0) X[i] = -INFINITY;
    }
    if (nx > 5) X[nx / 3] = NAN;
    if (nx > 9) X[nx / 2] = NAN;
    for (int64_t i = 0; i < ny; i++) DY[i] = (float)(rand() % 1000) / 64.0f - 7.0f;
    assert_ch_ok(ch_op_maxpool2d_forward(cx, &x, &pc->p, &y));
    assert_ch_ok(ch_op_maxpool2d_backward(cx, &x, &dy, &pc->p, &dx));

    ch_cd_pool_t g = {pc->C, pc->H, pc->W, Ho, Wo, pc->p.kernel_h, pc->p.kernel_w,
                      pc->p.stride_h, pc->p.stride_w, pc->p.pad_h, pc->p.pad_w,
                      layout == CH_LAYOUT_NHWC};
    float *gy = malloc((size_t)ny * sizeof(float)), *gdx = malloc((size_t)nx * sizeof(float));
    assert_non_null(gy);
    assert_non_null(gdx);
    /* what k_maxpool_fwd / k_maxpool_bwd compute, element by element */
    for (int64_t i = 0; i < ny; i++) {
        int64_t b, c, oh, ow;
        ch_cd_idx4(g.nhwc, g.C, g.Ho, g.Wo, i, &b, &c, &oh, &ow);
        gy[i] = ch_cd_maxpool_out(X, &g, b, c, oh, ow);
    }
    for (int64_t i = 0; i < nx; i++) {
        int64_t b, c, h, w;
        ch_cd_idx4(g.nhwc, g.C, g.H, g.W, i, &b, &c, &h, &w);
        gdx[i] = ch_cd_maxpool_grad(X, DY, &g, b, c, h, w);
    }
    /* two-pass variant: argmax per window, then the gather */
    int32_t *am = malloc((size_t)ny * sizeof(int32_t));
    float *gdx2 = malloc((size_t)nx * sizeof(float));
    assert_non_null(am);
    assert_non_null(gdx2);
    for (int64_t i = 0; i < ny; i++) {
        int64_t b, c, oh, ow;
        ch_cd_idx4(g.nhwc, g.C, g.Ho, g.Wo, i, &b, &c, &oh, &ow);
        am[i] = (int32_t)ch_cd_maxpool_argmax(X, &g, b, c, oh, ow);
    }
    for (int64_t i = 0; i < nx; i++) {
        int64_t b, c, h, w;
        ch_cd_idx4(g.nhwc, g.C, g.H, g.W, i, &b, &c, &h, &w);
        gdx2[i] = ch_cd_maxpool_grad_am(am, DY, &g, b, c, h, w);
    }
    char geo[128], what[160];
    snprintf(geo, sizeof geo, "%lldx%lldx%lldx%lld k%dx%d s%dx%d p%dx%d %s", (long long)pc->N,
             (long long)pc->C, (long long)pc->H, (long long)pc->W, pc->p.kernel_h,
             pc->p.kernel_w, pc->p.stride_h, pc->p.stride_w, pc->p.pad_h, pc->p.pad_w,
             ch_layout_name(layout));
    snprintf(what, sizeof what, "maxpool forward %s", geo);
    assert_same_bits(gy, y.data, ny, what);
    snprintf(what, sizeof what, "maxpool backward %s", geo);
    assert_same_bits(gdx, dx.data, nx, what);
    snprintf(what, sizeof what, "maxpool two-pass backward %s", geo);
    assert_same_bits(gdx2, dx.data, nx, what);
    free(am);
    free(gdx2);
    free(gy);
    free(gdx);
    ch_tensor_free(&x);
    ch_tensor_free(&y);
    ch_tensor_free(&dx);
    ch_tensor_free(&dy);
}

static void test_maxpool_matches_cpu(void **state)
{
    (void)state;
    ch_compute_t *cx;
    assert_ch_ok(ch_compute_create(NULL, &cx));
    const pool_case cases[] = {
        {2, 3, 9, 9, {3, 3, 2, 2, 1, 1}}, /* ResNet stem pool */
        {1, 8, 8, 8, {2, 2, 2, 2, 0, 0}},
        {2, 4, 7, 6, {3, 3, 1, 1, 1, 1}},
        {1, 5, 6, 7, {3, 2, 2, 1, 1, 0}},
        {3, 2, 5, 5, {5, 5, 3, 3, 2, 2}},
        {1, 16, 4, 4, {1, 1, 1, 1, 0, 0}},
        {2, 3, 10, 11, {4, 3, 3, 2, 2, 1}},
    };
    unsigned seed = 1;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_pool_case(cx, &cases[i], CH_LAYOUT_PLAIN, seed++);
        run_pool_case(cx, &cases[i], CH_LAYOUT_NHWC, seed++);
    }
    ch_compute_destroy(cx);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pick_layout),
        cmocka_unit_test(test_fits_int),
        cmocka_unit_test(test_carve),
        cmocka_unit_test(test_cache),
        cmocka_unit_test(test_conv_key),
        cmocka_unit_test(test_layout_index),
        cmocka_unit_test(test_transpose),
        cmocka_unit_test(test_pool_cover),
        cmocka_unit_test(test_maxpool_matches_cpu),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
