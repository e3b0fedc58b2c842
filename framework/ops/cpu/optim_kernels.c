/* cohort: CPU AdamW and RMSprop steps and cross-entropy with label
 * smoothing (ops.h ch_op_adamw_step, ch_op_rmsprop_step,
 * ch_op_cross_entropy_smooth).
 *
 * The optimizer loops follow PyTorch 1.13's single-tensor CPU path operation
 * for operation (ops.h gives the order). ATen's add_(x, alpha) and
 * addcmul_ run as vec::fmadd (one rounding) in its AVX2 kernels, so those
 * steps use fmaf() here; every other step is one float32 operation with
 * its own rounding. The loops are compiled per ISA (CH_CPU_SIMD) with
 * floating-point contraction off, so the compiler never fuses the plain
 * products and sums: the result does not depend on the CPU. Elementwise
 * loops are split over the OpenMP threads in contiguous element ranges:
 * bitwise the same for any thread count.
 */
#include "config.h"

#include "framework/ops/cpu/cpu.h"

#include <math.h>
#include <stdint.h>

/* torch.maximum: a NaN in either operand is the result. */
static inline float nan_max(float a, float b)
{
    if (a != a) return a;
    return (b > a || b != b) ? b : a;
}

/* The loops over [i0, i1) are compiled per ISA like the other hot loops
 * (CH_CPU_SIMD), with contraction off: only the explicit fmaf calls fuse
 * (one instruction where the CPU has FMA, glibc's correctly rounded fmaf
 * elsewhere), so every clone gives the same bits. */
#define OPT_LOOP CH_CPU_SIMD __attribute__((optimize("fp-contract=off")))
/* Run CALL over [i0_, i1_) pieces of OPT_PIECE elements of [0, n), on the
 * OpenMP threads when n is large (contiguous pieces: any thread count gives
 * the same bits). */
#define OPT_PIECE 16384
#define OPT_PIECES(n, CALL)                                                            \
    do {                                                                               \
        const int64_t n_ = (n), pieces_ = (n_ + OPT_PIECE - 1) / OPT_PIECE;            \
        _Pragma("omp parallel for schedule(static) if (n_ >= CH_CPU_PAR_MIN / 4)")     \
        for (int64_t q_ = 0; q_ < pieces_; q_++) {                                     \
            const int64_t i0_ = q_ * OPT_PIECE, i1_ = q_ + 1 < pieces_ ? i0_ + OPT_PIECE : n_; \
            CALL;                                                                      \
        }                                                                              \
    } while (0)

OPT_LOOP static void adamw_range(const ch_adamw_tensor_t *t, const ch_adamw_hparams_t *h,
                                 int64_t i0, int64_t i1)
{
    float *restrict p = t->param, *restrict m = t->exp_avg, *restrict v = t->exp_avg_sq;
    float *restrict vmax = t->max_exp_avg_sq;
    const float *restrict g = t->grad;
    const float decay = h->decay, b1 = h->beta1, c1 = h->one_minus_beta1, b2 = h->beta2,
                c2 = h->one_minus_beta2, bc2 = h->bias_correction2_sqrt,
                nss = h->neg_step_size, eps = h->eps;
    if (h->amsgrad) {
        for (int64_t i = i0; i < i1; i++) {
            const float gi = g[i];
            const float pi = p[i] * decay;
            const float mi = fmaf(gi, c1, m[i] * b1);
            const float vi = fmaf(c2 * gi, gi, v[i] * b2);
            const float u = nan_max(vmax[i], vi);
            m[i] = mi;
            v[i] = vi;
            vmax[i] = u;
            p[i] = pi + (nss * mi) / (sqrtf(u) / bc2 + eps);
        }
        return;
    }
    for (int64_t i = i0; i < i1; i++) {
        const float gi = g[i];
        const float pi = p[i] * decay;
        const float mi = fmaf(gi, c1, m[i] * b1);
        const float vi = fmaf(c2 * gi, gi, v[i] * b2);
        m[i] = mi;
        v[i] = vi;
        p[i] = pi + (nss * mi) / (sqrtf(vi) / bc2 + eps);
    }
}

static void adamw_one(const ch_adamw_tensor_t *t, const ch_adamw_hparams_t *h)
{
    OPT_PIECES(t->numel, adamw_range(t, h, i0_, i1_));
}

ch_status ch_cpu_adamw_step(void *st, const ch_adamw_tensor_t *ts, int n,
                            const ch_adamw_hparams_t *h)
{
    if (st) ch_cpu_threads(st);
    for (int k = 0; k < n; k++)
        if (ts[k].numel > 0) adamw_one(&ts[k], h);
    return CH_OK;
}

OPT_LOOP static void rmsprop_range(const ch_rmsprop_tensor_t *t, const ch_rmsprop_hparams_t *h,
                                   int64_t i0, int64_t i1)
{
    float *restrict p = t->param, *restrict v = t->square_avg, *restrict ga = t->grad_avg;
    float *restrict buf = t->momentum_buffer;
    const float *restrict g = t->grad;
    const float nlr = h->neg_lr, a = h->alpha, c = h->one_minus_alpha, eps = h->eps,
                wd = h->weight_decay, mom = h->momentum;
    const int centered = h->centered, use_mom = mom > 0.0f, use_wd = wd != 0.0f;
    for (int64_t i = i0; i < i1; i++) {
        const float pi = p[i];
        const float gi = use_wd ? fmaf(pi, wd, g[i]) : g[i];
        const float vi = fmaf(c * gi, gi, v[i] * a);
        v[i] = vi;
        float avg;
        if (centered) {
            const float gai = fmaf(gi, c, ga[i] * a);
            ga[i] = gai;
            avg = sqrtf(fmaf(-gai, gai, vi));
        } else {
            avg = sqrtf(vi);
        }
        avg = avg + eps;
        if (use_mom) {
            const float bi = buf[i] * mom + gi / avg;
            buf[i] = bi;
            p[i] = fmaf(bi, nlr, pi);
        } else {
            p[i] = pi + (nlr * gi) / avg;
        }
    }
}

static void rmsprop_one(const ch_rmsprop_tensor_t *t, const ch_rmsprop_hparams_t *h)
{
    OPT_PIECES(t->numel, rmsprop_range(t, h, i0_, i1_));
}

ch_status ch_cpu_rmsprop_step(void *st, const ch_rmsprop_tensor_t *ts, int n,
                              const ch_rmsprop_hparams_t *h)
{
    if (st) ch_cpu_threads(st);
    for (int k = 0; k < n; k++)
        if (ts[k].numel > 0) rmsprop_one(&ts[k], h);
    return CH_OK;
}

ch_status ch_cpu_cross_entropy_smooth(void *st, const ch_tensor_t *logits,
                                      const ch_tensor_t *labels, double e, ch_tensor_t *loss,
                                      ch_tensor_t *dlogits)
{
    (void)st;
    const int64_t N = logits->shape[0], K = logits->shape[1];
    const float *X = logits->data;
    const int64_t *lab = labels->data;
    for (int64_t n = 0; n < N; n++)
        if (lab[n] < 0 || lab[n] >= K)
            return CH_ERROR(CH_ERR_RANGE,
                            "ch_op_cross_entropy_smooth: label of sample %lld is %lld, expected 0..%lld",
                            (long long)n, (long long)lab[n], (long long)(K - 1));
    const double eK = e / (double)K, keep = 1.0 - e, dN = (double)N;
    float *D = dlogits ? (float *)dlogits->data : NULL;
    double total = 0.0;
    for (int64_t n = 0; n < N; n++) {
        const float *r = X + n * K;
        float mx = r[0];
        for (int64_t k = 1; k < K; k++) mx = r[k] > mx ? r[k] : mx;
        double s = 0.0, smooth = 0.0;
        for (int64_t k = 0; k < K; k++) s += exp((double)r[k] - (double)mx);
        const double lse = (double)mx + log(s);
        for (int64_t k = 0; k < K; k++) smooth += lse - (double)r[k];
        total += keep * (lse - (double)r[lab[n]]) + eK * smooth;
        if (D) {
            float *d = D + n * K;
            for (int64_t k = 0; k < K; k++) {
                double q = exp((double)r[k] - lse) - eK - (k == lab[n] ? keep : 0.0);
                d[k] = (float)(q / dN);
            }
        }
    }
    ((float *)loss->data)[0] = (float)(total / dN);
    return CH_OK;
}
