/* Host tests of the CUDA kernels' index arithmetic
 * (framework/ops/cuda/kernel_index.h), which the GPU kernels in
 * framework/ops/cuda/{batchnorm,loss,sgd}.cu use unchanged: the
 * division-free channel trackers of the elementwise and reduction loops,
 * the work split of the two-stage reductions, and the argmax order, the
 * latter against the CPU op (ch_op_argmax) through an emulated warp
 * butterfly. Runs everywhere (no GPU needed). */
#include "config.h"

#include "tests/harness.h"

#include "framework/ops/ops.h"
#include "framework/ops/cuda/kernel_index.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Grid-stride loops over n elements with `stride` threads: each thread's
 * tracked (p, c) equals the direct formula at every visited index. */
static void test_chan_tracker(void **state)
{
    (void)state;
    const int64_t shapes[][3] = {/* N, C, inner */
                                 {2, 3, 5},   {4, 64, 49}, {3, 7, 1},   {5, 256, 1},
                                 {1, 1, 1},   {2, 1, 300}, {3, 5, 257}, {7, 3, 2}};
    const int64_t strides[] = {1, 2, 3, 31, 32, 64, 256, 1000, 4096, 65536};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t N = shapes[si][0], C = shapes[si][1], inner = shapes[si][2];
        const int64_t n = N * C * inner;
        for (size_t ti = 0; ti < sizeof strides / sizeof strides[0]; ti++) {
            const int64_t stride = strides[ti];
            const chk_chan_step_t cs = chk_chan_step(inner, C, stride);
            int64_t visited = 0;
            for (int64_t i0 = 0; i0 < stride && i0 < n; i0++) {
                chk_chan_t t = chk_chan_at(&cs, i0);
                for (int64_t i = i0; i < n; i += stride) {
                    if (t.p != i % inner || t.c != (i / inner) % C)
                        fail_msg("N=%lld C=%lld inner=%lld stride=%lld i=%lld: got (p %lld, c "
                                 "%lld)",
                                 (long long)N, (long long)C, (long long)inner,
                                 (long long)stride, (long long)i, (long long)t.p,
                                 (long long)t.c);
                    visited++;
                    chk_chan_next(&cs, &t);
                }
            }
            assert_int_equal(visited, n);
        }
    }
}

/* One channel's N*HW values of a channel-first tensor, walked in steps of
 * `step` from each start in a slice: offsets equal n*C*HW + c*HW + p. */
static void test_plane_tracker(void **state)
{
    (void)state;
    const int64_t shapes[][3] = {/* N, C, HW */
                                 {2, 3, 5}, {4, 8, 49}, {3, 2, 1}, {1, 4, 300}, {5, 3, 256},
                                 {2, 2, 257}};
    const int64_t steps[] = {1, 3, 32, 256, 1000};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t N = shapes[si][0], C = shapes[si][1], HW = shapes[si][2];
        const int64_t count = N * HW;
        for (size_t ti = 0; ti < sizeof steps / sizeof steps[0]; ti++) {
            const chk_plane_step_t ps = chk_plane_step(HW, C, steps[ti]);
            for (int64_t c = 0; c < C; c++) {
                /* every value of the channel is visited once (slices of 3) */
                char *seen = calloc((size_t)(N * C * HW), 1);
                assert_non_null(seen);
                for (int64_t s = 0; s < 3; s++) {
                    int64_t j0, j1;
                    chk_split(count, 3, s, &j0, &j1);
                    for (int64_t tid = 0; tid < steps[ti]; tid++) {
                        int64_t j = j0 + tid;
                        if (j >= j1) break;
                        chk_plane_t t = chk_plane_at(&ps, c, j);
                        for (; j < j1; j += steps[ti]) {
                            int64_t want = (j / HW) * C * HW + c * HW + j % HW;
                            if (t.off != want)
                                fail_msg("N=%lld C=%lld HW=%lld step=%lld c=%lld j=%lld: off "
                                         "%lld, expected %lld",
                                         (long long)N, (long long)C, (long long)HW,
                                         (long long)steps[ti], (long long)c, (long long)j,
                                         (long long)t.off, (long long)want);
                            seen[t.off]++;
                            chk_plane_next(&ps, &t);
                        }
                    }
                }
                for (int64_t i = 0; i < N * C * HW; i++)
                    assert_int_equal(seen[i], (i / HW) % C == c ? 1 : 0);
                free(seen);
            }
        }
    }
}

static void test_split_and_slices(void **state)
{
    (void)state;
    const int64_t totals[] = {0, 1, 2, 7, 100, 4096, 100003};
    const int64_t parts[] = {1, 2, 3, 8, 64, 1000};
    for (size_t a = 0; a < sizeof totals / sizeof totals[0]; a++)
        for (size_t b = 0; b < sizeof parts / sizeof parts[0]; b++) {
            int64_t covered = 0, prev_end = 0;
            for (int64_t s = 0; s < parts[b]; s++) {
                int64_t lo, hi;
                chk_split(totals[a], parts[b], s, &lo, &hi);
                assert_true(lo == prev_end && lo <= hi && hi <= totals[a]);
                covered += hi - lo;
                prev_end = hi;
            }
            assert_int_equal(covered, totals[a]);
        }
    /* slices: at least 1, at most max, no slice below min_work when possible */
    assert_int_equal(chk_reduce_slices(64, 128 * 12544, 1056, 4096, 1024), 17);
    assert_int_equal(chk_reduce_slices(2048, 128 * 49, 1056, 4096, 1024), 1);
    assert_int_equal(chk_reduce_slices(1, 0, 1056, 4096, 1024), 1);
    assert_int_equal(chk_reduce_slices(1, 1 << 30, 1056, 4096, 1024), 1024);
    assert_int_equal(chk_reduce_slices(2, 100000, 1056, 256, 1024), 391);
}

/* CPU reference: framework/ops/cpu/kernels.c row_argmax through the op. */
static int64_t cpu_argmax(ch_compute_t *cx, float *row, int64_t K)
{
    ch_tensor_t l, o;
    int64_t s[2] = {1, K}, one = 1, out = -7;
    assert_ch_ok(ch_tensor_wrap(&l, row, CH_F32, 2, s, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_wrap(&o, &out, CH_I64, 1, &one, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_op_argmax(cx, &l, &o));
    return out;
}

/* loss.cu warp_argmax: lanes scan k = lane, lane+32, ..., then an xor
 * butterfly; every lane must end with the CPU answer. */
static int64_t warp_argmax_emulated(const float *r, int64_t K)
{
    float bv[32];
    int64_t bk[32];
    for (int lane = 0; lane < 32; lane++) {
        bv[lane] = 0.0f;
        bk[lane] = -1;
        for (int64_t k = lane; k < K; k += 32)
            if (bk[lane] < 0 || chk_argmax_better(r[k], k, bv[lane], bk[lane])) {
                bv[lane] = r[k];
                bk[lane] = k;
            }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float nv[32];
        int64_t nk[32];
        for (int lane = 0; lane < 32; lane++) {
            float ov = bv[lane ^ o];
            int64_t ok = bk[lane ^ o];
            nv[lane] = bv[lane];
            nk[lane] = bk[lane];
            if (ok >= 0 && (bk[lane] < 0 || chk_argmax_better(ov, ok, bv[lane], bk[lane]))) {
                nv[lane] = ov;
                nk[lane] = ok;
            }
        }
        memcpy(bv, nv, sizeof bv);
        memcpy(bk, nk, sizeof bk);
    }
    for (int lane = 1; lane < 32; lane++) assert_int_equal(bk[lane], bk[0]);
    return bk[0];
}

static void test_argmax_order(void **state)
{
    (void)state;
    ch_compute_t *cx = NULL;
    assert_ch_ok(ch_compute_create(NULL, &cx));
    uint64_t x = 12345;
    const int64_t Ks[] = {1, 2, 5, 31, 32, 33, 100, 1000};
    int nontrivial = 0;
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
        const int64_t K = Ks[ki];
        float *r = malloc((size_t)K * sizeof *r);
        assert_non_null(r);
        for (int trial = 0; trial < 200; trial++) {
            for (int64_t k = 0; k < K; k++) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                unsigned v = (unsigned)(x >> 33) % 16;
                /* few distinct values: many ties; sometimes NaN, +-0, +-inf */
                r[k] = v == 0 ? NAN : v == 1 ? -0.0f : v == 2 ? 0.0f
                     : v == 3 ? INFINITY : v == 4 ? -INFINITY : (float)(v % 5);
                if (trial % 3 == 0 && v == 0) r[k] = 1.0f; /* rows without NaN too */
            }
            int64_t want = cpu_argmax(cx, r, K), got = warp_argmax_emulated(r, K);
            if (got != want) fail_msg("K=%lld trial %d: warp argmax %lld, CPU %lld", (long long)K,
                                      trial, (long long)got, (long long)want);
            nontrivial += want > 0;
        }
        free(r);
    }
    assert_true(nontrivial > 100);
    ch_compute_destroy(cx);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chan_tracker),
        cmocka_unit_test(test_plane_tracker),
        cmocka_unit_test(test_split_and_slices),
        cmocka_unit_test(test_argmax_order),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
