/* cohort: batch normalization on the CPU in plain C, split into the pieces
 * SyncBN needs (statistics, apply, backward reductions, elementwise
 * backward); plain BatchNorm2d composes the same pieces, so per-rank and
 * synchronized BN compute identically.
 *
 * Formulas: PyTorch 1.13 aten/src/ATen/native/Normalization.cpp
 * (batch_norm_cpu_collect_stats: two-pass mean then sum of squared
 * deviations; transform_input: y = x*alpha + beta with alpha = invstd*w,
 * beta = b - mean*alpha; backward: SEMANTICS.md). Per-block partial sums are
 * float lanes, totals per channel are double.
 *
 * Threads (cpu.h, CH_CPU_PAR_MIN): the reductions (statistics, backward
 * sums) run in parallel over lane groups -- one channel (plain), or up to V
 * channel lanes of one channel block -- and each group's sum runs over the
 * samples in order on one thread, exactly as on one thread; the elementwise
 * passes run in parallel over (sample, channel block) planes. Results are
 * bitwise independent of the thread count.
 */
#include "config.h"

#include "framework/ops/cpu/cpu.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#define V 16
/* Most lanes one reduction unit sums side by side (GMAX chunks of V). */
#define GMAX 8

/* Lanes per reduction unit: V, or in a wide block (nhwc: B = C channels per
 * pixel) up to GMAX * V adjacent lanes while every thread still gets a
 * unit, so that a unit reads whole runs of each pixel's channels instead of
 * one cache line per pixel. Each lane's sum runs over the same elements in
 * the same order whatever the width, so results do not depend on it. */
static int64_t lane_width(const cpu_cview *v)
{
    int64_t g = (v->B + V - 1) / V, t = omp_get_max_threads();
    int64_t k = t > 0 ? g / t : g;
    if (k < 1) k = 1;
    if (k > GMAX) k = GMAX;
    return k * V;
}

/* Lane groups of a channel view: the reductions' unit of parallel work.
 * Group u covers lanes [c0, c0 + L), L <= lane_width, of channel block
 * u / groups (B == 1: the whole single-lane block). */
static int64_t lane_groups(const cpu_cview *v, int64_t lw)
{
    return v->B == 1 ? 1 : (v->B + lw - 1) / lw;
}

/* acc[c] += sum over HW of xb[j*B + c] for lanes c in [c0, c0 + lw) ∩ [0, B)
 * (B == 1: c0 = 0, the one lane). */
CH_CPU_SIMD static void k_sum(const float *xb, int64_t HW, int64_t B, int64_t c0, int64_t lw,
                              double *acc)
{
    if (B == 1) {
        float a[V] = {0};
        int64_t j = 0;
        for (; j + V <= HW; j += V)
            for (int l = 0; l < V; l++) a[l] += xb[j + l];
        double s = 0.0;
        for (; j < HW; j++) s += xb[j];
        for (int l = 0; l < V; l++) s += a[l];
        acc[0] += s;
        return;
    }
    int64_t L = B - c0 < lw ? B - c0 : lw;
    float a[GMAX * V] = {0};
    for (int64_t j = 0; j < HW; j++) {
        const float *p = xb + j * B + c0;
        int64_t g = 0;
        for (; g + V <= L; g += V)
            for (int l = 0; l < V; l++) a[g + l] += p[g + l];
        if (g + 8 <= L) { /* an 8-lane run (nChw8c, nhwc remainders): vectorised too */
            for (int l = 0; l < 8; l++) a[g + l] += p[g + l];
            g += 8;
        }
        for (; g < L; g++) a[g] += p[g];
    }
    for (int64_t l = 0; l < L; l++) acc[c0 + l] += a[l];
}

/* acc[c] += sum over HW of (x - m[c])^2, lanes as k_sum. */
CH_CPU_SIMD static void k_sqdev(const float *xb, int64_t HW, int64_t B, int64_t c0,
                                int64_t lw, const float *m, double *acc)
{
    if (B == 1) {
        float a[V] = {0}, mm = m[0];
        int64_t j = 0;
        for (; j + V <= HW; j += V)
            for (int l = 0; l < V; l++) {
                float d = xb[j + l] - mm;
                a[l] += d * d;
            }
        double s = 0.0;
        for (; j < HW; j++) {
            float d = xb[j] - mm;
            s += d * d;
        }
        for (int l = 0; l < V; l++) s += a[l];
        acc[0] += s;
        return;
    }
    int64_t L = B - c0 < lw ? B - c0 : lw;
    float a[GMAX * V] = {0}, mm[GMAX * V] = {0};
    for (int64_t l = 0; l < L; l++) mm[l] = m[c0 + l];
    for (int64_t j = 0; j < HW; j++) {
        const float *p = xb + j * B + c0;
        int64_t g = 0;
        for (; g + V <= L; g += V)
            for (int l = 0; l < V; l++) {
                float d = p[g + l] - mm[g + l];
                a[g + l] += d * d;
            }
        if (g + 8 <= L) {
            for (int l = 0; l < 8; l++) {
                float d = p[g + l] - mm[g + l];
                a[g + l] += d * d;
            }
            g += 8;
        }
        for (; g < L; g++) {
            float d = p[g] - mm[g];
            a[g] += d * d;
        }
    }
    for (int64_t l = 0; l < L; l++) acc[c0 + l] += a[l];
}

/* y = x*a[c] + b[c]. */
CH_CPU_SIMD static void k_affine(const float *xb, float *yb, int64_t HW, int64_t B,
                                 const float *a, const float *b)
{
    if (B == 1) {
        float aa = a[0], bb = b[0];
        int64_t j = 0;
        for (; j + V <= HW; j += V) {
            float t[V];
            for (int l = 0; l < V; l++) t[l] = xb[j + l] * aa + bb;
            for (int l = 0; l < V; l++) yb[j + l] = t[l];
        }
        for (; j < HW; j++) yb[j] = xb[j] * aa + bb;
        return;
    }
    for (int64_t j = 0; j < HW; j++) {
        const float *p = xb + j * B;
        float *q = yb + j * B;
        for (int64_t c0 = 0; c0 < B; c0 += V) {
            int64_t L = B - c0 < V ? B - c0 : V;
            if (L == V) {
                float t[V];
                for (int l = 0; l < V; l++) t[l] = p[c0 + l] * a[c0 + l] + b[c0 + l];
                for (int l = 0; l < V; l++) q[c0 + l] = t[l];
            } else if (L == 8) {
                float t[8];
                for (int l = 0; l < 8; l++) t[l] = p[c0 + l] * a[c0 + l] + b[c0 + l];
                for (int l = 0; l < 8; l++) q[c0 + l] = t[l];
            } else {
                for (int64_t l = 0; l < L; l++) q[c0 + l] = p[c0 + l] * a[c0 + l] + b[c0 + l];
            }
        }
    }
}

/* s1[c] += sum dy, s2[c] += sum dy*(x-m[c]), lanes as k_sum. */
CH_CPU_SIMD static void k_bwd_reduce(const float *xb, const float *dyb, int64_t HW, int64_t B,
                                     int64_t c0, int64_t lw, const float *m, double *s1,
                                     double *s2)
{
    if (B == 1) {
        float a[V] = {0}, b[V] = {0}, mm = m[0];
        int64_t j = 0;
        for (; j + V <= HW; j += V)
            for (int l = 0; l < V; l++) {
                a[l] += dyb[j + l];
                b[l] += dyb[j + l] * (xb[j + l] - mm);
            }
        double sa = 0.0, sb = 0.0;
        for (; j < HW; j++) {
            sa += dyb[j];
            sb += dyb[j] * (xb[j] - mm);
        }
        for (int l = 0; l < V; l++) {
            sa += a[l];
            sb += b[l];
        }
        s1[0] += sa;
        s2[0] += sb;
        return;
    }
    int64_t L = B - c0 < lw ? B - c0 : lw;
    float a[GMAX * V] = {0}, b[GMAX * V] = {0}, mm[GMAX * V] = {0};
    for (int64_t l = 0; l < L; l++) mm[l] = m[c0 + l];
    for (int64_t j = 0; j < HW; j++) {
        const float *p = xb + j * B + c0, *d = dyb + j * B + c0;
        int64_t g = 0;
        for (; g + V <= L; g += V)
            for (int l = 0; l < V; l++) {
                a[g + l] += d[g + l];
                b[g + l] += d[g + l] * (p[g + l] - mm[g + l]);
            }
        if (g + 8 <= L) {
            for (int l = 0; l < 8; l++) {
                a[g + l] += d[g + l];
                b[g + l] += d[g + l] * (p[g + l] - mm[g + l]);
            }
            g += 8;
        }
        for (; g < L; g++) {
            a[g] += d[g];
            b[g] += d[g] * (p[g] - mm[g]);
        }
    }
    for (int64_t l = 0; l < L; l++) {
        s1[c0 + l] += a[l];
        s2[c0 + l] += b[l];
    }
}

/* dx = dy*a[c] - (x-m[c])*k[c] + b[c]. dx may alias dy. */
CH_CPU_SIMD static void k_bwd_elemt(const float *xb, const float *dyb, float *dxb, int64_t HW,
                                    int64_t B, const float *m, const float *a, const float *k,
                                    const float *b)
{
    if (B == 1) {
        float aa = a[0], kk = k[0], bb = b[0], mm = m[0];
        int64_t j = 0;
        for (; j + V <= HW; j += V) {
            float t[V];
            for (int l = 0; l < V; l++) t[l] = dyb[j + l] * aa - (xb[j + l] - mm) * kk + bb;
            for (int l = 0; l < V; l++) dxb[j + l] = t[l];
        }
        for (; j < HW; j++) dxb[j] = dyb[j] * aa - (xb[j] - mm) * kk + bb;
        return;
    }
    for (int64_t j = 0; j < HW; j++) {
        const float *p = xb + j * B, *d = dyb + j * B;
        float *q = dxb + j * B;
        for (int64_t c0 = 0; c0 < B; c0 += V) {
            int64_t L = B - c0 < V ? B - c0 : V;
            if (L == V) {
                float t[V];
                for (int l = 0; l < V; l++)
                    t[l] = d[c0 + l] * a[c0 + l] - (p[c0 + l] - m[c0 + l]) * k[c0 + l] +
                           b[c0 + l];
                for (int l = 0; l < V; l++) q[c0 + l] = t[l];
            } else if (L == 8) {
                float t[8];
                for (int l = 0; l < 8; l++)
                    t[l] = d[c0 + l] * a[c0 + l] - (p[c0 + l] - m[c0 + l]) * k[c0 + l] +
                           b[c0 + l];
                for (int l = 0; l < 8; l++) q[c0 + l] = t[l];
            } else {
                for (int64_t l = 0; l < L; l++)
                    q[c0 + l] = d[c0 + l] * a[c0 + l] - (p[c0 + l] - m[c0 + l]) * k[c0 + l] +
                                b[c0 + l];
            }
        }
    }
}

static size_t blk_off(const cpu_cview *v, int64_t n, int64_t cb)
{
    return (size_t)((n * v->nb + cb) * v->HW * v->B);
}

/* Whether a loop touching `floats` floats is worth the thread team. */
static int par(double floats) { return floats >= (double)CH_CPU_PAR_MIN; }

/* The two per-channel sums of one pass (which: 0 = sum x, 1 = sum of
 * (x - m)^2, 2 = sum dy and sum dy*(x - m) into acc and acc2), in parallel
 * over lane groups, each group's sum over the samples in order. */
static void reduce_pass(const cpu_cview *v, int which, const float *X, const float *DY,
                        const float *M, double *acc, double *acc2)
{
    int64_t lw = lane_width(v), G = lane_groups(v, lw), units = v->nb * G;
#pragma omp parallel for schedule(static) if (par((double)v->N * v->HW * v->C * (which == 2 ? 2 : 1)))
    for (int64_t u = 0; u < units; u++) {
        int64_t cb = u / G, c0 = (u % G) * lw, o = cb * v->B;
        for (int64_t n = 0; n < v->N; n++) {
            size_t off = blk_off(v, n, cb);
            if (which == 0)
                k_sum(X + off, v->HW, v->B, c0, lw, acc + o);
            else if (which == 1)
                k_sqdev(X + off, v->HW, v->B, c0, lw, M + o, acc + o);
            else
                k_bwd_reduce(X + off, DY + off, v->HW, v->B, c0, lw, M + o, acc + o, acc2 + o);
        }
    }
}

ch_status ch_cpu_bn_stats(void *st, const ch_tensor_t *x, ch_tensor_t *mean, ch_tensor_t *var)
{
    ch_cpu_t *c = st;
    ch_cpu_threads(c);
    cpu_cview v = ch_cpu_cview(x);
    int64_t C = v.C;
    double cnt = (double)(v.N * v.HW);
    double *acc;
    CH_TRY(ch_cpu_dtmp(c, (size_t)C, &acc));
    const float *X = x->data;
    float *M = mean->data, *VA = var->data;
    memset(acc, 0, (size_t)C * sizeof *acc);
    reduce_pass(&v, 0, X, NULL, NULL, acc, NULL);
    for (int64_t ch = 0; ch < C; ch++) M[ch] = (float)(acc[ch] / cnt);
    memset(acc, 0, (size_t)C * sizeof *acc);
    reduce_pass(&v, 1, X, NULL, M, acc, NULL);
    for (int64_t ch = 0; ch < C; ch++) VA[ch] = (float)(acc[ch] / cnt);
    return CH_OK;
}

ch_status ch_cpu_bn_apply(void *st, const ch_tensor_t *x, const ch_tensor_t *mean,
                          const ch_tensor_t *var, const ch_tensor_t *weight,
                          const ch_tensor_t *bias, float eps, ch_tensor_t *y)
{
    ch_cpu_t *c = st;
    ch_cpu_threads(c);
    cpu_cview v = ch_cpu_cview(x);
    int64_t C = v.C;
    float *t;
    CH_TRY(ch_cpu_ftmp(c, (size_t)(2 * C), &t));
    float *a = t, *b = t + C;
    const float *M = mean->data, *VA = var->data;
    const float *W = weight ? (const float *)weight->data : NULL;
    const float *Bi = bias ? (const float *)bias->data : NULL;
    for (int64_t ch = 0; ch < C; ch++) {
        float invstd = (float)(1.0 / sqrt((double)VA[ch] + (double)eps));
        a[ch] = invstd * (W ? W[ch] : 1.0f);
        b[ch] = (Bi ? Bi[ch] : 0.0f) - M[ch] * a[ch];
    }
    const float *X = x->data;
    float *Y = y->data;
    int64_t nblk = v.N * v.nb;
#pragma omp parallel for schedule(static) if (par(2.0 * (double)nblk * v.HW * v.B))
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t cb = blk % v.nb;
        size_t o = (size_t)(blk * v.HW * v.B);
        k_affine(X + o, Y + o, v.HW, v.B, a + cb * v.B, b + cb * v.B);
    }
    return CH_OK;
}

ch_status ch_cpu_bn_update_running(void *st, ch_tensor_t *rm, ch_tensor_t *rv,
                                   const ch_tensor_t *mean, const ch_tensor_t *var,
                                   int64_t count, float momentum)
{
    (void)st;
    int64_t C = rm->shape[0];
    float *RM = rm->data, *RV = rv->data;
    const float *M = mean->data, *VA = var->data;
    double corr = (double)count / (double)(count - 1);
    for (int64_t ch = 0; ch < C; ch++) {
        RM[ch] = momentum * M[ch] + (1.0f - momentum) * RM[ch];
        RV[ch] = momentum * (float)((double)VA[ch] * corr) + (1.0f - momentum) * RV[ch];
    }
    return CH_OK;
}

ch_status ch_cpu_bn_gather_stats(void *st, const ch_tensor_t *means, const ch_tensor_t *vars,
                                 const int64_t *counts, int nranks, ch_tensor_t *mean,
                                 ch_tensor_t *var)
{
    (void)st;
    int64_t C = means->shape[1];
    const float *MS = means->data, *VS = vars->data;
    float *M = mean->data, *VA = var->data;
    for (int64_t ch = 0; ch < C; ch++) {
        double n = 0.0, mu = 0.0, m2 = 0.0;
        for (int r = 0; r < nranks; r++) {
            if (counts[r] <= 0) continue;
            double nr = (double)counts[r], mr = MS[(int64_t)r * C + ch];
            double vr = VS[(int64_t)r * C + ch];
            double tot = n + nr, delta = mr - mu;
            mu += delta * nr / tot;
            m2 += vr * nr + delta * delta * n * nr / tot;
            n = tot;
        }
        M[ch] = (float)mu;
        VA[ch] = (float)(m2 / n);
    }
    return CH_OK;
}

ch_status ch_cpu_bn_backward_reduce(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                    const ch_tensor_t *mean, ch_tensor_t *sum_dy,
                                    ch_tensor_t *sum_dy_xmu)
{
    ch_cpu_t *c = st;
    ch_cpu_threads(c);
    cpu_cview v = ch_cpu_cview(x);
    int64_t C = v.C;
    double *acc;
    CH_TRY(ch_cpu_dtmp(c, (size_t)(2 * C), &acc));
    memset(acc, 0, (size_t)(2 * C) * sizeof *acc);
    const float *X = x->data, *DY = dy->data, *M = mean->data;
    reduce_pass(&v, 2, X, DY, M, acc, acc + C);
    float *S1 = sum_dy->data, *S2 = sum_dy_xmu->data;
    for (int64_t ch = 0; ch < C; ch++) {
        S1[ch] = (float)acc[ch];
        S2[ch] = (float)acc[C + ch];
    }
    return CH_OK;
}

ch_status ch_cpu_bn_param_grads(void *st, const ch_tensor_t *sum_dy,
                                const ch_tensor_t *sum_dy_xmu, const ch_tensor_t *var,
                                float eps, ch_tensor_t *dweight, ch_tensor_t *dbias)
{
    (void)st;
    int64_t C = sum_dy->shape[0];
    const float *S1 = sum_dy->data, *S2 = sum_dy_xmu->data, *VA = var->data;
    for (int64_t ch = 0; ch < C; ch++) {
        double invstd = 1.0 / sqrt((double)VA[ch] + (double)eps);
        if (dweight) ((float *)dweight->data)[ch] = (float)((double)S2[ch] * invstd);
        if (dbias) ((float *)dbias->data)[ch] = S1[ch];
    }
    return CH_OK;
}

/* dx = (dy - s1/total - (x-mean)*invstd^2*s2/total) * invstd * w
 *    = dy*a - (x-mean)*k + b with a = invstd*w, k = invstd^2*s2/total*a,
 *      b = -s1/total*a. */
static void elemt_coeffs(int64_t C, const float *M, const float *VA, float eps, const float *W,
                         const double *s1, const double *s2, double total, float *a, float *k,
                         float *b)
{
    for (int64_t ch = 0; ch < C; ch++) {
        double invstd = 1.0 / sqrt((double)VA[ch] + (double)eps);
        double aa = invstd * (W ? (double)W[ch] : 1.0);
        double kk = invstd * invstd * s2[ch] / total * aa;
        a[ch] = (float)aa;
        k[ch] = (float)kk;
        b[ch] = (float)(-s1[ch] / total * aa);
    }
}

static void elemt_run(const cpu_cview *v, const float *X, const float *DY, float *DX,
                      const float *M, const float *a, const float *k, const float *b)
{
    int64_t nblk = v->N * v->nb;
#pragma omp parallel for schedule(static) if (par(3.0 * (double)nblk * v->HW * v->B))
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t cb = blk % v->nb;
        size_t o = (size_t)(blk * v->HW * v->B);
        k_bwd_elemt(X + o, DY + o, DX + o, v->HW, v->B, M + cb * v->B, a + cb * v->B,
                    k + cb * v->B, b + cb * v->B);
    }
}

ch_status ch_cpu_bn_backward_elemt(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                   const ch_tensor_t *mean, const ch_tensor_t *var, float eps,
                                   const ch_tensor_t *weight, const ch_tensor_t *sum_dy,
                                   const ch_tensor_t *sum_dy_xmu, int64_t total,
                                   ch_tensor_t *dx)
{
    ch_cpu_t *c = st;
    ch_cpu_threads(c);
    cpu_cview v = ch_cpu_cview(x);
    int64_t C = v.C;
    double *s;
    float *t;
    CH_TRY(ch_cpu_dtmp(c, (size_t)(2 * C), &s));
    CH_TRY(ch_cpu_ftmp(c, (size_t)(3 * C), &t));
    const float *S1 = sum_dy->data, *S2 = sum_dy_xmu->data;
    for (int64_t ch = 0; ch < C; ch++) {
        s[ch] = S1[ch];
        s[C + ch] = S2[ch];
    }
    elemt_coeffs(C, mean->data, var->data, eps, weight ? (const float *)weight->data : NULL, s,
                 s + C, (double)total, t, t + C, t + 2 * C);
    elemt_run(&v, x->data, dy->data, dx->data, mean->data, t, t + C, t + 2 * C);
    return CH_OK;
}

ch_status ch_cpu_bn_backward(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                             const ch_tensor_t *mean, const ch_tensor_t *var, float eps,
                             const ch_tensor_t *weight, ch_tensor_t *dx, ch_tensor_t *dweight,
                             ch_tensor_t *dbias)
{
    ch_cpu_t *c = st;
    ch_cpu_threads(c);
    cpu_cview v = ch_cpu_cview(x);
    int64_t C = v.C;
    double *s;
    float *t;
    CH_TRY(ch_cpu_dtmp(c, (size_t)(2 * C), &s));
    CH_TRY(ch_cpu_ftmp(c, (size_t)(3 * C), &t));
    memset(s, 0, (size_t)(2 * C) * sizeof *s);
    const float *X = x->data, *DY = dy->data, *M = mean->data, *VA = var->data;
    reduce_pass(&v, 2, X, DY, M, s, s + C);
    for (int64_t ch = 0; ch < C; ch++) {
        double invstd = 1.0 / sqrt((double)VA[ch] + (double)eps);
        if (dweight) ((float *)dweight->data)[ch] = (float)(s[C + ch] * invstd);
        if (dbias) ((float *)dbias->data)[ch] = (float)s[ch];
    }
    if (!dx) return CH_OK;
    elemt_coeffs(C, M, VA, eps, weight ? (const float *)weight->data : NULL, s, s + C,
                 (double)(v.N * v.HW), t, t + C, t + 2 * C);
    elemt_run(&v, X, DY, dx->data, M, t, t + C, t + 2 * C);
    return CH_OK;
}
