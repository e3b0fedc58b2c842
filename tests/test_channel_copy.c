/* The CPU backend's channel copies (framework/ops/cpu/channel.c:
 * ch_op_copy_channels, ch_op_concat_channels, ch_op_split_channels,
 * ch_op_channel_shuffle) against plain loops, bitwise, for every pair of
 * source and destination layouts (plain NCHW, NHWC, nChw8c, nChw16c where
 * the block divides the channels): the paths of the copy are a whole-sample
 * memcpy (one blocking, aligned offsets), runs of 16 or 8 lanes or single
 * lanes per pixel (blockings or offsets that differ, e.g. a 24-channel
 * nChw8c half of a 48-channel nChw16c tensor), and the shuffle's per-pixel
 * gather of 16, 8 or fewer lanes (NHWC with 40 channels: 16 + 16 + 8). Each
 * case runs on a small tensor (the calling thread only) and on one above
 * CH_CPU_PAR_MIN, on 1 and on 2 threads. The values include -0.0 and a NaN
 * with a payload: a copy moves bits. Channels of the destination outside
 * the copied range keep their values.
 */
#include "config.h"

#include "tests/harness.h"
#include "tests/nn_testutil.h"

#include "framework/ops/cpu/cpu.h"
#include "framework/ops/ops.h"
#include "framework/tensor/tensor.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const ch_layout_t LAYOUTS[4] = {CH_LAYOUT_PLAIN, CH_LAYOUT_NHWC, CH_LAYOUT_NCHW8C,
                                       CH_LAYOUT_NCHW16C};


static int fits(ch_layout_t l, int64_t C)
{
    int b = ch_layout_block(l);
    return !b || C % b == 0;
}

/* A plain (N, C, H, W) tensor of distinct values (seed apart), with -0.0
 * and a NaN carrying a payload among them. */
static void fill(ch_tensor_t *t, int64_t N, int64_t C, int64_t H, int64_t W, uint32_t seed)
{
    int64_t s[4] = {N, C, H, W};
    assert_ch_ok(ch_tensor_alloc_f32(t, 4, s));
    float *p = ch_tensor_f32(t);
    int64_t n = ch_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) p[i] = (float)(seed * 100000u + (uint32_t)i) * 0.25f + 0.125f;
    p[n / 3] = -0.0f;
    uint32_t nan = 0x7fc01234u;
    memcpy(&p[n / 2], &nan, sizeof nan);
}

/* t in layout l (oneDNN reorder: a copy). */
static void relayout(ch_compute_t *cx, const ch_tensor_t *t, ch_layout_t l, ch_tensor_t *out)
{
    assert_ch_ok(ch_tensor_alloc(out, CH_F32, 4, t->shape, l, CH_DEV_CPU, 0));
    assert_ch_ok(ch_op_reorder(cx, t, out));
}

static void same_bits(ch_compute_t *cx, const ch_tensor_t *a, const ch_tensor_t *ref,
                      const char *what, ch_layout_t ls, ch_layout_t ld, int64_t N)
{
    ch_tensor_t p;
    relayout(cx, a, CH_LAYOUT_PLAIN, &p);
    assert_int_equal(p.nbytes, ref->nbytes);
    if (memcmp(p.data, ref->data, ref->nbytes))
        fail_msg("%s, %s -> %s, N %lld: differs from the plain loops", what,
                 ch_layout_name(ls), ch_layout_name(ld), (long long)N);
    ch_tensor_free(&p);
}

/* dst[:, dc0 + c] = src[:, sc0 + c], c < nc, on plain tensors. */
static void ref_copy(const ch_tensor_t *src, int64_t sc0, ch_tensor_t *dst, int64_t dc0,
                     int64_t nc)
{
    const int64_t N = src->shape[0], Cs = src->shape[1], Cd = dst->shape[1],
                  HW = src->shape[2] * src->shape[3];
    const float *s = src->data;
    float *d = dst->data;
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < nc; c++)
            memcpy(d + (n * Cd + dc0 + c) * HW, s + (n * Cs + sc0 + c) * HW,
                   (size_t)HW * sizeof *d);
}

/* copy_channels from a Cs-channel source to a Cd-channel destination
 * (prefilled, its other channels kept) in every layout pair. */
static void copy_case(ch_compute_t *cx, int64_t N, int64_t H, int64_t W, int64_t Cs,
                      int64_t sc0, int64_t Cd, int64_t dc0, int64_t nc)
{
    ch_tensor_t src, dst0, ref;
    fill(&src, N, Cs, H, W, 1);
    fill(&dst0, N, Cd, H, W, 2);
    fill(&ref, N, Cd, H, W, 2);
    ref_copy(&src, sc0, &ref, dc0, nc);
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            if (!fits(LAYOUTS[a], Cs) || !fits(LAYOUTS[b], Cd)) continue;
            ch_tensor_t sl, dl;
            relayout(cx, &src, LAYOUTS[a], &sl);
            relayout(cx, &dst0, LAYOUTS[b], &dl);
            assert_ch_ok(ch_op_copy_channels(cx, &sl, sc0, &dl, dc0, nc));
            char what[96];
            snprintf(what, sizeof what, "copy_channels C %lld [%lld, +%lld) -> C %lld at %lld",
                     (long long)Cs, (long long)sc0, (long long)nc, (long long)Cd,
                     (long long)dc0);
            same_bits(cx, &dl, &ref, what, LAYOUTS[a], LAYOUTS[b], N);
            ch_tensor_free(&sl);
            ch_tensor_free(&dl);
        }
    ch_tensor_free(&src);
    ch_tensor_free(&dst0);
    ch_tensor_free(&ref);
}

/* concat of parts C0 + C1 and split back, the parts in layout a, the whole
 * in layout b. */
static void cat_case(ch_compute_t *cx, int64_t N, int64_t H, int64_t W, int64_t C0, int64_t C1)
{
    ch_tensor_t p0, p1, ref;
    fill(&p0, N, C0, H, W, 3);
    fill(&p1, N, C1, H, W, 4);
    fill(&ref, N, C0 + C1, H, W, 5);
    ref_copy(&p0, 0, &ref, 0, C0);
    ref_copy(&p1, 0, &ref, C0, C1);
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            if (!fits(LAYOUTS[a], C0) || !fits(LAYOUTS[a], C1) || !fits(LAYOUTS[b], C0 + C1))
                continue;
            ch_tensor_t l0, l1, cat, d0, d1;
            relayout(cx, &p0, LAYOUTS[a], &l0);
            relayout(cx, &p1, LAYOUTS[a], &l1);
            assert_ch_ok(ch_tensor_alloc(&cat, CH_F32, 4, ref.shape, LAYOUTS[b], CH_DEV_CPU, 0));
            const ch_tensor_t *parts[2] = {&l0, &l1};
            assert_ch_ok(ch_op_concat_channels(cx, parts, 2, &cat));
            same_bits(cx, &cat, &ref, "concat", LAYOUTS[a], LAYOUTS[b], N);
            assert_ch_ok(ch_tensor_alloc(&d0, CH_F32, 4, p0.shape, LAYOUTS[a], CH_DEV_CPU, 0));
            assert_ch_ok(ch_tensor_alloc(&d1, CH_F32, 4, p1.shape, LAYOUTS[a], CH_DEV_CPU, 0));
            ch_tensor_t *dparts[2] = {&d0, &d1};
            assert_ch_ok(ch_op_split_channels(cx, &cat, dparts, 2));
            same_bits(cx, &d0, &p0, "split part 0", LAYOUTS[b], LAYOUTS[a], N);
            same_bits(cx, &d1, &p1, "split part 1", LAYOUTS[b], LAYOUTS[a], N);
            ch_tensor_t *tmp[] = {&l0, &l1, &cat, &d0, &d1};
            for (size_t i = 0; i < sizeof tmp / sizeof tmp[0]; i++) ch_tensor_free(tmp[i]);
        }
    ch_tensor_free(&p0);
    ch_tensor_free(&p1);
    ch_tensor_free(&ref);
}

/* channel_shuffle(x, g) with x in layout a, y in layout b, and its inverse
 * (groups C / g) back to x. */
static void shuffle_case(ch_compute_t *cx, int64_t N, int64_t H, int64_t W, int64_t C, int g)
{
    ch_tensor_t x, ref;
    fill(&x, N, C, H, W, 6);
    fill(&ref, N, C, H, W, 7);
    const int64_t HW = H * W, cpg = C / g;
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < C; j++)
            memcpy(ch_tensor_f32(&ref) + (n * C + j) * HW,
                   ch_tensor_f32(&x) + (n * C + (j % g) * cpg + j / g) * HW,
                   (size_t)HW * sizeof(float));
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            if (!fits(LAYOUTS[a], C) || !fits(LAYOUTS[b], C)) continue;
            ch_tensor_t xl, y, back;
            relayout(cx, &x, LAYOUTS[a], &xl);
            assert_ch_ok(ch_tensor_alloc(&y, CH_F32, 4, x.shape, LAYOUTS[b], CH_DEV_CPU, 0));
            assert_ch_ok(ch_op_channel_shuffle(cx, &xl, g, &y));
            char what[64];
            snprintf(what, sizeof what, "channel_shuffle C %lld groups %d", (long long)C, g);
            same_bits(cx, &y, &ref, what, LAYOUTS[a], LAYOUTS[b], N);
            assert_ch_ok(ch_tensor_alloc(&back, CH_F32, 4, x.shape, LAYOUTS[a], CH_DEV_CPU, 0));
            assert_ch_ok(ch_op_channel_shuffle(cx, &y, (int)cpg, &back));
            same_bits(cx, &back, &x, "channel_shuffle inverse", LAYOUTS[b], LAYOUTS[a], N);
            ch_tensor_free(&xl);
            ch_tensor_free(&y);
            ch_tensor_free(&back);
        }
    ch_tensor_free(&x);
    ch_tensor_free(&ref);
}

/* Every case at (N, H, W) on cx. */
static void all_cases(ch_compute_t *cx, int64_t N, int64_t H, int64_t W)
{
    /* aligned halves (whole-sample memcpy where the layouts agree) */
    copy_case(cx, N, H, W, 48, 24, 24, 0, 24);
    copy_case(cx, N, H, W, 48, 0, 48, 0, 48);
    copy_case(cx, N, H, W, 48, 16, 32, 16, 16);
    /* offsets and counts off every block */
    copy_case(cx, N, H, W, 48, 3, 40, 7, 29);
    copy_case(cx, N, H, W, 48, 8, 40, 24, 16);
    copy_case(cx, N, H, W, 16, 5, 16, 5, 0);
    /* shufflenet: 24 + 24 (nChw8c halves into nChw16c), and 16 + 32, 8 + 40 */
    cat_case(cx, N, H, W, 24, 24);
    cat_case(cx, N, H, W, 16, 32);
    cat_case(cx, N, H, W, 8, 40);
    cat_case(cx, N, H, W, 3, 5);
    shuffle_case(cx, N, H, W, 48, 2);
    shuffle_case(cx, N, H, W, 48, 3);
    shuffle_case(cx, N, H, W, 40, 2);
    shuffle_case(cx, N, H, W, 24, 4);
    shuffle_case(cx, N, H, W, 6, 3);
}

static void test_small(void **state)
{
    (void)state;
    for (int t = 1; t <= 2; t++) {
        ch_compute_t *cx = nt_make_cx(t);
        all_cases(cx, 2, 3, 5);
        all_cases(cx, 1, 1, 1);
        ch_compute_destroy(cx);
    }
}

/* Above CH_CPU_PAR_MIN (2 * N * C * HW floats for the narrowest copy, 16
 * channels: 2 * 33 * 16 * 130 > 131072), 33 samples (no even split). */
static void test_threaded(void **state)
{
    (void)state;
    assert_true(2 * 33 * 16 * 10 * 13 >= CH_CPU_PAR_MIN);
    for (int t = 1; t <= 2; t++) {
        ch_compute_t *cx = nt_make_cx(t);
        all_cases(cx, 33, 10, 13);
        ch_compute_destroy(cx);
    }
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small),
        cmocka_unit_test(test_threaded),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
