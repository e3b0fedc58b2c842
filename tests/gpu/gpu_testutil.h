/* Helpers shared by the GPU tests (tests/gpu/test_gpu_*.c; not installed):
 * skipping without a GPU, random host data, moving tensors between host and
 * device through cohort's own ops, and the relative L2 error.
 *
 * Moving data: upload = host PLAIN -> (CPU reorder to the target layout on
 * the host) -> ch_op_reorder host -> device in the SAME layout; download is
 * the reverse. So a test of one op depends only on the cross-device copy,
 * not on the device-side layout conversions (those are tested on their own
 * in test_gpu_ops's reorder test). Every upload/download synchronizes the
 * context it used, so tensors may then be used from another context (whose
 * compute stream would otherwise not be ordered after the copy).
 */
#ifndef COHORT_TESTS_GPU_TESTUTIL_H
#define COHORT_TESTS_GPU_TESTUTIL_H

#include "tests/harness.h"

#include "framework/tensor/device.h"
#include "framework/ops/ops.h"
#include "framework/tensor/tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Why GPU tests skip here ("" when a GPU is visible). */
static inline const char *gt_no_gpu_reason(void)
{
    static char why[256];
    static int done;
    if (!done) {
        int n = 0;
        ch_status s = ch_device_count(&n);
        if (!ch_device_backend_compiled())
            snprintf(why, sizeof why, "cohort was built without the CUDA backend (configure found no nvcc/cuDNN/cuBLAS/NCCL)");
        else if (s != CH_OK)
            snprintf(why, sizeof why, "ch_device_count failed: %s", ch_error_message());
        else if (n == 0)
            snprintf(why, sizeof why, "no GPU visible (ch_device_count() = 0)");
        else
            why[0] = 0;
        done = 1;
    }
    return why;
}

/* Self-check of the tests on a machine without a GPU: with
 * COHORT_GPU_TESTS_ON_CPU=1 the "device" side of every comparison is the CPU
 * backend too (CPU vs CPU; NCCL replaced by the MPI group), so shapes,
 * arguments and comparisons of the test code itself are exercised before
 * GPU time is spent. Tests that need a real GPU (bf16, async uploads, blocked
 * layouts) still SKIP. Not a mode make check uses. */
static inline int gt_cpu_mode(void)
{
    const char *e = getenv("COHORT_GPU_TESTS_ON_CPU");
    return e && !strcmp(e, "1");
}

/* Where the "device" tensors of a comparison live. */
static inline ch_devkind_t gt_dev(void) { return gt_cpu_mode() ? CH_DEV_CPU : CH_DEV_CUDA; }

/* Skip the running test (before it allocates anything) when no GPU is
 * visible (unless in the CPU self-check mode). */
#define GT_NEED_GPU()                                                         \
    do {                                                                      \
        if (!gt_cpu_mode() && gt_no_gpu_reason()[0])                          \
            ch_test_skip("%s", gt_no_gpu_reason());                           \
    } while (0)

/* Skip unless a real GPU is there (also in the CPU self-check mode). */
#define GT_NEED_REAL_GPU()                                                    \
    do {                                                                      \
        if (gt_cpu_mode()) ch_test_skip("COHORT_GPU_TESTS_ON_CPU=1: needs a real GPU"); \
        GT_NEED_GPU();                                                        \
    } while (0)

/* Deterministic uniform floats in [lo, hi) (splitmix64). */
static inline uint64_t gt_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline void gt_fill(float *d, int64_t n, uint64_t seed, float lo, float hi)
{
    uint64_t s = seed * 7919u + 1;
    for (int64_t i = 0; i < n; i++)
        d[i] = lo + (hi - lo) * (float)((gt_next(&s) >> 40) * (1.0 / 16777216.0));
}

/* ||got - ref||_2 / ||ref||_2 (denominator at least 1e-30); NaN anywhere
 * gives NaN, which every "<= tol" check rejects. */
static inline double gt_rel_l2(const float *got, const float *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
        if (isnan(got[i]) || isnan(ref[i])) return NAN;
    }
    return sqrt(num) / (den > 1e-60 ? sqrt(den) : 1e-30);
}

#define GT_CHECK_REL(what, got, ref, n, tol)                                  \
    do {                                                                      \
        double e_ = gt_rel_l2((got), (ref), (n));                             \
        if (!(e_ <= (tol)))                                                   \
            fail_msg("%s: relative L2 error %.3g > %.1g", (what), e_, (double)(tol)); \
    } while (0)

/* Upload host PLAIN tensor h into device tensor d (any layout, same shape
 * and dtype), then wait for cx. Status-returning form for code between
 * collectives (which must not stop on an assertion); gt_upload asserts. */
static inline ch_status gt_upload_s(ch_compute_t *cx, const ch_tensor_t *h, ch_tensor_t *d)
{
    if (d->layout == CH_LAYOUT_PLAIN) {
        CH_TRY(ch_op_reorder(cx, h, d));
    } else {
        ch_tensor_t t;
        CH_TRY(ch_tensor_alloc(&t, h->dtype, h->ndim, h->shape, d->layout, CH_DEV_CPU, 0));
        ch_status s = ch_op_reorder(cx, h, &t);
        if (s == CH_OK) s = ch_op_reorder(cx, &t, d);
        if (s == CH_OK) s = ch_compute_sync(cx);
        ch_tensor_free(&t);
        CH_TRY(s);
    }
    return ch_compute_sync(cx);
}

/* Download device tensor d (any layout) into host PLAIN tensor h. Waits for
 * cx before (work queued on it) and after. */
static inline ch_status gt_download_s(ch_compute_t *cx, const ch_tensor_t *d, ch_tensor_t *h)
{
    CH_TRY(ch_compute_sync(cx));
    if (d->layout == CH_LAYOUT_PLAIN) {
        CH_TRY(ch_op_reorder(cx, d, h));
    } else {
        ch_tensor_t t;
        CH_TRY(ch_tensor_alloc(&t, d->dtype, d->ndim, d->shape, d->layout, CH_DEV_CPU, 0));
        ch_status s = ch_op_reorder(cx, d, &t);
        if (s == CH_OK) s = ch_compute_sync(cx);
        if (s == CH_OK) s = ch_op_reorder(cx, &t, h);
        ch_tensor_free(&t);
        CH_TRY(s);
    }
    return ch_compute_sync(cx);
}

static inline void gt_upload(ch_compute_t *cx, const ch_tensor_t *h, ch_tensor_t *d)
{
    assert_ch_ok(gt_upload_s(cx, h, d));
}

static inline void gt_download(ch_compute_t *cx, const ch_tensor_t *d, ch_tensor_t *h)
{
    assert_ch_ok(gt_download_s(cx, d, h));
}

/* A host PLAIN tensor and its device twin. */
typedef struct {
    ch_tensor_t h, d;
} gt_pair_t;

/* Random values in [lo, hi) on the host, the same on the device (layout dl). */
static inline void gt_pair_rand(ch_compute_t *cx, gt_pair_t *p, int nd, const int64_t *shape,
                                ch_layout_t dl, uint64_t seed, float lo, float hi)
{
    assert_ch_ok(ch_tensor_alloc(&p->h, CH_F32, nd, shape, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&p->d, CH_F32, nd, shape, dl, gt_dev(), 0));
    gt_fill(ch_tensor_f32(&p->h), ch_tensor_numel(&p->h), seed, lo, hi);
    gt_upload(cx, &p->h, &p->d);
}

/* An output: zero host tensor, device tensor poisoned with NaN so an
 * element the op does not write shows up in the comparison. */
static inline void gt_pair_out(ch_compute_t *cx, gt_pair_t *p, int nd, const int64_t *shape,
                               ch_layout_t dl)
{
    assert_ch_ok(ch_tensor_alloc(&p->h, CH_F32, nd, shape, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&p->d, CH_F32, nd, shape, dl, gt_dev(), 0));
    assert_ch_ok(ch_op_fill(cx, &p->d, NAN));
    assert_ch_ok(ch_compute_sync(cx));
}

static inline void gt_pair_free(gt_pair_t *p)
{
    ch_tensor_free(&p->h);
    ch_tensor_free(&p->d);
}

/* Download p->d and compare with p->h (the CPU result) within tol. */
static inline void gt_compare(ch_compute_t *cx, const char *what, const gt_pair_t *p, double tol)
{
    ch_tensor_t g;
    assert_ch_ok(ch_tensor_alloc(&g, CH_F32, p->h.ndim, p->h.shape, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    gt_download(cx, &p->d, &g);
    double e = gt_rel_l2(ch_tensor_f32(&g), ch_tensor_f32(&p->h), ch_tensor_numel(&g));
    ch_tensor_free(&g);
    if (!(e <= tol)) fail_msg("%s: GPU vs CPU relative L2 error %.3g > %.1g", what, e, tol);
}

#endif
