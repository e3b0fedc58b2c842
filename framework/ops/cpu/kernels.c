/* cohort: CPU ops in plain C — fill/copy/add/scale, ReLU, max pooling,
 * average pooling (windows and adaptive bins), global average pooling,
 * softmax cross-entropy, argmax, fused SGD step.
 *
 * Activations may be in any layout (cpu.h's channel view covers all of them);
 * the loops run over contiguous blocks of B channels so that the blocked
 * layouts (B = 8 or 16) vectorise over the channel lanes. Hot loops are
 * compiled per ISA (CH_CPU_SIMD). Elementwise ops, ReLU and the pooling ops
 * run on the rank's OpenMP threads (cpu.h, CH_CPU_PAR_MIN): elementwise
 * loops over contiguous element ranges, pooling over whole (sample, channel
 * block) planes, so every output element is computed by the same operations
 * in the same order for any thread count.
 */
#include "config.h"

#include "framework/ops/cpu/cpu.h"
#include "framework/ops/pool_geometry.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define V 16 /* lanes per chunk: fixed trip counts let -O2 vectorise */

/* ------------------------------------------------------------ elementwise */

CH_CPU_SIMD static void k_fill(float *o, int64_t n, float v)
{
    int64_t i = 0;
    for (; i + V <= n; i += V)
        for (int l = 0; l < V; l++) o[i + l] = v;
    for (; i < n; i++) o[i] = v;
}

ch_status ch_cpu_fill(void *st, ch_tensor_t *t, float value)
{
    (void)st;
    if (!t->nbytes) return CH_OK;
    if (value == 0.0f && !signbit(value)) {
        memset(t->data, 0, t->nbytes);
        return CH_OK;
    }
    k_fill(t->data, ch_tensor_numel(t), value);
    return CH_OK;
}

ch_status ch_cpu_copy(void *st, const ch_tensor_t *src, ch_tensor_t *dst)
{
    (void)st;
    if (src->nbytes && src->data != dst->data) memmove(dst->data, src->data, src->nbytes);
    return CH_OK;
}

CH_CPU_SIMD static void k_add(float *o, const float *a, const float *b, int64_t n)
{
    int64_t i = 0;
    for (; i + V <= n; i += V) {
        float t[V];
        for (int l = 0; l < V; l++) t[l] = a[i + l] + b[i + l];
        for (int l = 0; l < V; l++) o[i + l] = t[l];
    }
    for (; i < n; i++) o[i] = a[i] + b[i];
}

/* o = k(a, b) over n floats, split over the threads (ch_cpu_split). */
typedef void (*binary_kernel)(float *o, const float *a, const float *b, int64_t n);
static void run_binary(binary_kernel k, float *o, const float *a, const float *b, int64_t n)
{
#pragma omp parallel if (3 * n >= CH_CPU_PAR_MIN)
    {
        int64_t i0, i1;
        ch_cpu_split(n, &i0, &i1);
        k(o + i0, a + i0, b + i0, i1 - i0);
    }
}

/* fp32 -> bf16, round to nearest even; NaN stays a (quiet) NaN. Branch-free
 * over chunks of V so that it vectorises. */
static inline uint16_t bf16_of_bits(uint32_t u)
{
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

CH_CPU_SIMD static void k_to_bf16(const float *x, uint16_t *y, int64_t n)
{
    int64_t i = 0;
    for (; i + V <= n; i += V) {
        uint32_t u[V];
        memcpy(u, x + i, sizeof u);
        for (int l = 0; l < V; l++) y[i + l] = bf16_of_bits(u[l]);
    }
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        y[i] = bf16_of_bits(u);
    }
}

void ch_cpu_cast_bf16(const ch_cpu_t *c, const float *x, uint16_t *y, int64_t n)
{
    ch_cpu_threads(c);
#pragma omp parallel if (3 * n >= CH_CPU_PAR_MIN)
    {
        int64_t i0, i1;
        ch_cpu_split(n, &i0, &i1);
        k_to_bf16(x + i0, y + i0, i1 - i0);
    }
}

ch_status ch_cpu_add(void *st, const ch_tensor_t *a, const ch_tensor_t *b, ch_tensor_t *out)
{
    ch_cpu_threads(st);
    run_binary(k_add, out->data, a->data, b->data, ch_tensor_numel(a));
    return CH_OK;
}

CH_CPU_SIMD static void k_scale(float *o, int64_t n, float s)
{
    int64_t i = 0;
    for (; i + V <= n; i += V)
        for (int l = 0; l < V; l++) o[i + l] *= s;
    for (; i < n; i++) o[i] *= s;
}

ch_status ch_cpu_scale(void *st, ch_tensor_t *t, float alpha)
{
    ch_cpu_threads(st);
    float *T = t->data;
    int64_t n = ch_tensor_numel(t);
#pragma omp parallel if (2 * n >= CH_CPU_PAR_MIN)
    {
        int64_t i0, i1;
        ch_cpu_split(n, &i0, &i1);
        k_scale(T + i0, i1 - i0, alpha);
    }
    return CH_OK;
}

/* ------------------------------------------------------------------ relu */

/* y = x < 0 ? 0 : x keeps NaN (as torch.relu / clamp_min). */
CH_CPU_SIMD static void k_relu(float *y, const float *x, int64_t n)
{
    int64_t i = 0;
    for (; i + V <= n; i += V) {
        float t[V];
        for (int l = 0; l < V; l++) t[l] = x[i + l] < 0.0f ? 0.0f : x[i + l];
        for (int l = 0; l < V; l++) y[i + l] = t[l];
    }
    for (; i < n; i++) y[i] = x[i] < 0.0f ? 0.0f : x[i];
}

/* dx = y <= 0 ? 0 : dy (threshold_backward). */
CH_CPU_SIMD static void k_relu_bwd(float *dx, const float *y, const float *dy, int64_t n)
{
    int64_t i = 0;
    for (; i + V <= n; i += V) {
        float t[V];
        for (int l = 0; l < V; l++) {
            float d = dy[i + l]; /* unconditional load: lets the compiler use a blend */
            t[l] = y[i + l] <= 0.0f ? 0.0f : d;
        }
        for (int l = 0; l < V; l++) dx[i + l] = t[l];
    }
    for (; i < n; i++) dx[i] = y[i] <= 0.0f ? 0.0f : dy[i];
}

ch_status ch_cpu_relu_forward(void *st, const ch_tensor_t *x, ch_tensor_t *y)
{
    ch_cpu_threads(st);
    float *Y = y->data;
    const float *X = x->data;
    int64_t n = ch_tensor_numel(x);
#pragma omp parallel if (2 * n >= CH_CPU_PAR_MIN)
    {
        int64_t i0, i1;
        ch_cpu_split(n, &i0, &i1);
        k_relu(Y + i0, X + i0, i1 - i0);
    }
    return CH_OK;
}

ch_status ch_cpu_relu_backward(void *st, const ch_tensor_t *y, const ch_tensor_t *dy,
                               ch_tensor_t *dx)
{
    ch_cpu_threads(st);
    run_binary(k_relu_bwd, dx->data, y->data, dy->data, ch_tensor_numel(y));
    return CH_OK;
}

/* -------------------------------------------------------------- max pool */

typedef struct {
    int64_t H, W, Ho, Wo;
    int kh, kw, sh, sw, ph, pw;
} pool_geo;

static pool_geo geo_of(const ch_tensor_t *x, const ch_tensor_t *y, const ch_pool2d_params_t *p)
{
    pool_geo g = {x->shape[2], x->shape[3], y->shape[2], y->shape[3],
                  p->kernel_h, p->kernel_w, p->stride_h, p->stride_w, p->pad_h, p->pad_w};
    return g;
}

static void window(const pool_geo *g, int64_t oh, int64_t ow, int64_t *h0, int64_t *h1,
                   int64_t *w0, int64_t *w1)
{
    int64_t hs = oh * g->sh - g->ph, ws = ow * g->sw - g->pw;
    *h1 = hs + g->kh < g->H ? hs + g->kh : g->H;
    *w1 = ws + g->kw < g->W ? ws + g->kw : g->W;
    *h0 = hs > 0 ? hs : 0;
    *w0 = ws > 0 ? ws : 0;
}

/* The max of one window [h0, h1) x [w0, w1) over the lanes [c0, c0 + L) of
 * a (sample, channel block) plane xb (pixel stride B) into out[c0 ..]: taps
 * in h, w order, a NaN wins. L is a constant (16 or 8: whole vectors) where
 * the callers inline it, so the lanes vectorise. */
static inline __attribute__((always_inline)) void
mp_fwd_lanes(const float *xb, float *out, const pool_geo *g, int64_t B, int64_t c0, int64_t L,
             int64_t h0, int64_t h1, int64_t w0, int64_t w1)
{
    float best[V];
    for (int64_t l = 0; l < L; l++) best[l] = -INFINITY;
    for (int64_t h = h0; h < h1; h++)
        for (int64_t w = w0; w < w1; w++) {
            const float *p = xb + (h * g->W + w) * B + c0;
            for (int64_t l = 0; l < L; l++) {
                float v = p[l];
                best[l] = (v > best[l] || v != v) ? v : best[l];
            }
        }
    for (int64_t l = 0; l < L; l++) out[c0 + l] = best[l];
}

/* One (sample, channel block) plane of B channel lanes: every output
 * (oh, ow), in chunks of 16, then 8, then single lanes. */
CH_CPU_SIMD static void k_maxpool_fwd(const float *xb, float *yb, const pool_geo *g, int64_t B)
{
    for (int64_t oh = 0; oh < g->Ho; oh++) {
        for (int64_t ow = 0; ow < g->Wo; ow++) {
            int64_t h0, h1, w0, w1;
            window(g, oh, ow, &h0, &h1, &w0, &w1);
            float *out = yb + (oh * g->Wo + ow) * B;
            int64_t c0 = 0;
            for (; c0 + 16 <= B; c0 += 16) mp_fwd_lanes(xb, out, g, B, c0, 16, h0, h1, w0, w1);
            for (; c0 + 8 <= B; c0 += 8) mp_fwd_lanes(xb, out, g, B, c0, 8, h0, h1, w0, w1);
            for (; c0 < B; c0++) mp_fwd_lanes(xb, out, g, B, c0, 1, h0, h1, w0, w1);
        }
    }
}

/* Backward of one window over lanes [c0, c0 + L): each lane's first maximum
 * (h, w order; a NaN wins) gets dy added. L constant as mp_fwd_lanes. */
static inline __attribute__((always_inline)) void
mp_bwd_lanes(const float *xb, const float *d, float *dxb, const pool_geo *g, int64_t B,
             int64_t c0, int64_t L, int64_t h0, int64_t h1, int64_t w0, int64_t w1)
{
    float best[V];
    int32_t idx[V];
    for (int64_t l = 0; l < L; l++) {
        best[l] = -INFINITY;
        idx[l] = (int32_t)(h0 * g->W + w0);
    }
    for (int64_t h = h0; h < h1; h++) {
        for (int64_t w = w0; w < w1; w++) {
            int32_t pos = (int32_t)(h * g->W + w);
            const float *p = xb + pos * B + c0;
            /* branch-free so the lanes vectorise */
            for (int64_t l = 0; l < L; l++) {
                float v = p[l];
                int up = (v > best[l]) | (v != v);
                best[l] = up ? v : best[l];
                idx[l] = up ? pos : idx[l];
            }
        }
    }
    for (int64_t l = 0; l < L; l++) dxb[idx[l] * B + c0 + l] += d[c0 + l];
}

CH_CPU_SIMD static void k_maxpool_bwd(const float *xb, const float *dyb, float *dxb,
                                      const pool_geo *g, int64_t B)
{
    for (int64_t oh = 0; oh < g->Ho; oh++) {
        for (int64_t ow = 0; ow < g->Wo; ow++) {
            int64_t h0, h1, w0, w1;
            window(g, oh, ow, &h0, &h1, &w0, &w1);
            const float *d = dyb + (oh * g->Wo + ow) * B;
            int64_t c0 = 0;
            for (; c0 + 16 <= B; c0 += 16) mp_bwd_lanes(xb, d, dxb, g, B, c0, 16, h0, h1, w0, w1);
            for (; c0 + 8 <= B; c0 += 8) mp_bwd_lanes(xb, d, dxb, g, B, c0, 8, h0, h1, w0, w1);
            for (; c0 < B; c0++) mp_bwd_lanes(xb, d, dxb, g, B, c0, 1, h0, h1, w0, w1);
        }
    }
}

/* Pooling runs over whole (sample, channel block) planes in parallel: a
 * plane's outputs (and, backward, its scatter-adds into dx) stay on one
 * thread in the 1-thread order. */
ch_status ch_cpu_maxpool_forward(void *st, const ch_tensor_t *x, const ch_pool2d_params_t *p,
                                 ch_tensor_t *y)
{
    ch_cpu_threads(st);
    cpu_cview v = ch_cpu_cview(x);
    pool_geo g = geo_of(x, y, p);
    const float *X = x->data;
    float *Y = y->data;
    int64_t xs = g.H * g.W * v.B, ys = g.Ho * g.Wo * v.B, nblk = v.N * v.nb;
#pragma omp parallel for schedule(static) if (nblk * (xs + ys) >= CH_CPU_PAR_MIN)
    for (int64_t blk = 0; blk < nblk; blk++)
        k_maxpool_fwd(X + blk * xs, Y + blk * ys, &g, v.B);
    return CH_OK;
}

ch_status ch_cpu_maxpool_backward(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                  const ch_pool2d_params_t *p, ch_tensor_t *dx)
{
    ch_cpu_threads(st);
    cpu_cview v = ch_cpu_cview(x);
    pool_geo g = geo_of(x, dy, p);
    const float *X = x->data, *DY = dy->data;
    float *DX = dx->data;
    int64_t xs = g.H * g.W * v.B, ys = g.Ho * g.Wo * v.B, nblk = v.N * v.nb;
#pragma omp parallel for schedule(static) if (nblk * (2 * xs + ys) >= CH_CPU_PAR_MIN)
    for (int64_t blk = 0; blk < nblk; blk++) {
        memset(DX + blk * xs, 0, (size_t)xs * sizeof *DX);
        k_maxpool_bwd(X + blk * xs, DY + blk * ys, DX + blk * xs, &g, v.B);
    }
    return CH_OK;
}

/* ------------------------------------------------ average pooling (k, s, p)
 * and adaptive average pooling (bins). Both are one kernel: each output row
 * oh has an input row range [h0, h1) and a divisor factor dh, each output
 * column the same along w, and y = sum over the range / (dh * dw)
 * (framework/ops/pool_geometry.h, shared with the CUDA backend). */

CH_CPU_SIMD static void k_avgpool_fwd(const float *xb, float *yb, const ch_avg_geo_t *g,
                                      int64_t B)
{
    for (int64_t oh = 0; oh < g->Ho; oh++) {
        int64_t h0, h1, dh;
        ch_avg_range(g, 0, oh, &h0, &h1, &dh);
        for (int64_t ow = 0; ow < g->Wo; ow++) {
            int64_t w0, w1, dw;
            ch_avg_range(g, 1, ow, &w0, &w1, &dw);
            float *out = yb + (oh * g->Wo + ow) * B;
            int64_t div = dh * dw;
            for (int64_t c0 = 0; c0 < B; c0 += V) {
                int64_t L = B - c0 < V ? B - c0 : V;
                float acc[V] = {0};
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t w = w0; w < w1; w++) {
                        const float *q = xb + (h * g->W + w) * B + c0;
                        if (L == V)
                            for (int l = 0; l < V; l++) acc[l] += q[l];
                        else
                            for (int64_t l = 0; l < L; l++) acc[l] += q[l];
                    }
                /* an empty window (only padding) gives 0, as PyTorch */
                for (int64_t l = 0; l < L; l++)
                    out[c0 + l] = div > 0 && h1 > h0 && w1 > w0 ? acc[l] / (float)div : 0.0f;
            }
        }
    }
}

CH_CPU_SIMD static void k_avgpool_bwd(const float *dyb, float *dxb, const ch_avg_geo_t *g,
                                      int64_t B)
{
    for (int64_t oh = 0; oh < g->Ho; oh++) {
        int64_t h0, h1, dh;
        ch_avg_range(g, 0, oh, &h0, &h1, &dh);
        for (int64_t ow = 0; ow < g->Wo; ow++) {
            int64_t w0, w1, dw;
            ch_avg_range(g, 1, ow, &w0, &w1, &dw);
            int64_t div = dh * dw;
            if (div <= 0) continue;
            const float *d = dyb + (oh * g->Wo + ow) * B;
            for (int64_t c0 = 0; c0 < B; c0 += V) {
                int64_t L = B - c0 < V ? B - c0 : V;
                float gv[V];
                for (int64_t l = 0; l < L; l++) gv[l] = d[c0 + l] / (float)div;
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t w = w0; w < w1; w++) {
                        float *q = dxb + (h * g->W + w) * B + c0;
                        if (L == V)
                            for (int l = 0; l < V; l++) q[l] += gv[l];
                        else
                            for (int64_t l = 0; l < L; l++) q[l] += gv[l];
                    }
            }
        }
    }
}

/* Over whole (sample, channel block) planes in parallel, as max pooling. */
static void avg_forward(const ch_tensor_t *x, const ch_avg_geo_t *g, ch_tensor_t *y)
{
    cpu_cview v = ch_cpu_cview(x);
    const float *X = x->data;
    float *Y = y->data;
    int64_t xs = g->H * g->W * v.B, ys = g->Ho * g->Wo * v.B, nblk = v.N * v.nb;
#pragma omp parallel for schedule(static) if (nblk * (xs + ys) >= CH_CPU_PAR_MIN)
    for (int64_t blk = 0; blk < nblk; blk++) k_avgpool_fwd(X + blk * xs, Y + blk * ys, g, v.B);
}

static void avg_backward(const ch_tensor_t *dy, const ch_avg_geo_t *g, ch_tensor_t *dx)
{
    cpu_cview v = ch_cpu_cview(dx);
    const float *DY = dy->data;
    float *DX = dx->data;
    int64_t xs = g->H * g->W * v.B, ys = g->Ho * g->Wo * v.B, nblk = v.N * v.nb;
#pragma omp parallel for schedule(static) if (nblk * (xs + ys) >= CH_CPU_PAR_MIN)
    for (int64_t blk = 0; blk < nblk; blk++) {
        memset(DX + blk * xs, 0, (size_t)xs * sizeof *DX);
        k_avgpool_bwd(DY + blk * ys, DX + blk * xs, g, v.B);
    }
}

ch_status ch_cpu_avgpool_forward(void *st, const ch_tensor_t *x, const ch_pool2d_params_t *p,
                                 ch_tensor_t *y)
{
    ch_cpu_threads(st);
    ch_avg_geo_t g = ch_avg_geo_of(x, y, p);
    avg_forward(x, &g, y);
    return CH_OK;
}

ch_status ch_cpu_avgpool_backward(void *st, const ch_tensor_t *dy, const ch_pool2d_params_t *p,
                                  ch_tensor_t *dx)
{
    ch_cpu_threads(st);
    ch_avg_geo_t g = ch_avg_geo_of(dx, dy, p);
    avg_backward(dy, &g, dx);
    return CH_OK;
}

ch_status ch_cpu_adaptive_avgpool_forward(void *st, const ch_tensor_t *x, ch_tensor_t *y)
{
    ch_cpu_threads(st);
    ch_avg_geo_t g = ch_avg_geo_of(x, y, NULL);
    avg_forward(x, &g, y);
    return CH_OK;
}

ch_status ch_cpu_adaptive_avgpool_backward(void *st, const ch_tensor_t *dy, ch_tensor_t *dx)
{
    ch_cpu_threads(st);
    ch_avg_geo_t g = ch_avg_geo_of(dx, dy, NULL);
    avg_backward(dy, &g, dx);
    return CH_OK;
}

/* ------------------------------------------------------- global avg pool */

/* y[c] (B lanes) = mean over HW of the block. */
CH_CPU_SIMD static void k_gap_fwd(const float *xb, float *y, int64_t HW, int64_t B)
{
    if (B == 1) {
        double s = 0.0;
        for (int64_t j = 0; j < HW; j++) s += xb[j];
        y[0] = (float)(s / (double)HW);
        return;
    }
    for (int64_t c0 = 0; c0 < B; c0 += V) {
        int64_t L = B - c0 < V ? B - c0 : V;
        float acc[V] = {0};
        for (int64_t j = 0; j < HW; j++) {
            const float *p = xb + j * B + c0;
            if (L == V)
                for (int l = 0; l < V; l++) acc[l] += p[l];
            else
                for (int64_t l = 0; l < L; l++) acc[l] += p[l];
        }
        for (int64_t l = 0; l < L; l++) y[c0 + l] = acc[l] / (float)HW;
    }
}

CH_CPU_SIMD static void k_gap_bwd(const float *dy, float *dxb, int64_t HW, int64_t B)
{
    float inv = 1.0f / (float)HW;
    for (int64_t j = 0; j < HW; j++)
        for (int64_t l = 0; l < B; l++) dxb[j * B + l] = dy[l] * inv;
}

ch_status ch_cpu_avgpool_global_forward(void *st, const ch_tensor_t *x, ch_tensor_t *y)
{
    ch_cpu_threads(st);
    cpu_cview v = ch_cpu_cview(x);
    const float *X = x->data;
    float *Y = y->data; /* (N,C,1,1) in any layout == (N,C) plain */
    if (v.HW == 0) {
        if (y->nbytes) memset(Y, 0, y->nbytes);
        return CH_OK;
    }
    int64_t nblk = v.N * v.nb;
#pragma omp parallel for schedule(static) if (nblk * v.HW * v.B >= CH_CPU_PAR_MIN)
    for (int64_t blk = 0; blk < nblk; blk++)
        k_gap_fwd(X + blk * v.HW * v.B, Y + blk * v.B, v.HW, v.B);
    return CH_OK;
}

ch_status ch_cpu_avgpool_global_backward(void *st, const ch_tensor_t *dy, ch_tensor_t *dx)
{
    ch_cpu_threads(st);
    cpu_cview v = ch_cpu_cview(dx);
    const float *DY = dy->data;
    float *DX = dx->data;
    int64_t nblk = v.N * v.nb;
#pragma omp parallel for schedule(static) if (nblk * v.HW * v.B >= CH_CPU_PAR_MIN)
    for (int64_t blk = 0; blk < nblk; blk++)
        k_gap_bwd(DY + blk * v.B, DX + blk * v.HW * v.B, v.HW, v.B);
    return CH_OK;
}

/* ------------------------------------------------------------------ loss */

ch_status ch_cpu_cross_entropy(void *st, const ch_tensor_t *logits, const ch_tensor_t *labels,
                               ch_tensor_t *loss, ch_tensor_t *dlogits)
{
    (void)st;
    int64_t N = logits->shape[0], K = logits->shape[1];
    const float *X = logits->data;
    const int64_t *lab = labels->data;
    for (int64_t n = 0; n < N; n++)
        if (lab[n] < 0 || lab[n] >= K)
            return CH_ERROR(CH_ERR_RANGE,
                            "ch_op_cross_entropy: label of sample %lld is %lld, expected 0..%lld",
                            (long long)n, (long long)lab[n], (long long)(K - 1));
    double total = 0.0;
    float *D = dlogits ? (float *)dlogits->data : NULL;
    for (int64_t n = 0; n < N; n++) {
        const float *r = X + n * K;
        float mx = r[0];
        for (int64_t k = 1; k < K; k++) mx = r[k] > mx ? r[k] : mx;
        double s = 0.0;
        for (int64_t k = 0; k < K; k++) s += exp((double)r[k] - (double)mx);
        double lse = (double)mx + log(s);
        total += lse - (double)r[lab[n]];
        if (D) {
            float *d = D + n * K;
            for (int64_t k = 0; k < K; k++)
                d[k] = (float)(exp((double)r[k] - lse) / (double)N);
            d[lab[n]] -= (float)(1.0 / (double)N);
        }
    }
    ((float *)loss->data)[0] = (float)(total / (double)N);
    return CH_OK;
}

static int64_t row_argmax(const float *r, int64_t K)
{
    int64_t best = 0;
    for (int64_t k = 1; k < K; k++) {
        if (r[best] != r[best]) break; /* NaN is the maximum (torch.argmax) */
        if (r[k] > r[best] || r[k] != r[k]) best = k;
    }
    return best;
}

ch_status ch_cpu_argmax(void *st, const ch_tensor_t *logits, ch_tensor_t *out)
{
    (void)st;
    int64_t N = logits->shape[0], K = logits->shape[1];
    const float *X = logits->data;
    int64_t *O = out->data;
    for (int64_t n = 0; n < N; n++) O[n] = row_argmax(X + n * K, K);
    return CH_OK;
}

ch_status ch_cpu_count_correct(void *st, const ch_tensor_t *logits, const ch_tensor_t *labels,
                               int64_t *correct)
{
    (void)st;
    int64_t N = logits->shape[0], K = logits->shape[1], c = 0;
    const float *X = logits->data;
    const int64_t *L = labels->data;
    for (int64_t n = 0; n < N; n++) c += row_argmax(X + n * K, K) == L[n];
    *correct = c;
    return CH_OK;
}

/* ------------------------------------------------------------- optimizer */

/* Momentum update of one parameter: framework/train/optim.c step_momentum,
 * operation for operation (float32; no target clones here, so no FMA
 * contraction either: the result equals ch_sgd_step bit for bit). */
static void sgd_momentum(float *restrict w, const float *restrict g, float *restrict b, size_t n,
                         float lr, float wd, float mom, float damp1, int first, int nesterov)
{
    if (first) {
        if (nesterov) {
            for (size_t i = 0; i < n; i++) {
                float d = g[i] + wd * w[i];
                b[i] = d;
                w[i] = w[i] - lr * (d + mom * d);
            }
        } else {
            for (size_t i = 0; i < n; i++) {
                float d = g[i] + wd * w[i];
                b[i] = d;
                w[i] = w[i] - lr * d;
            }
        }
    } else if (nesterov) {
        for (size_t i = 0; i < n; i++) {
            float d = g[i] + wd * w[i];
            float nb = mom * b[i] + damp1 * d;
            b[i] = nb;
            w[i] = w[i] - lr * (d + mom * nb);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            float d = g[i] + wd * w[i];
            float nb = mom * b[i] + damp1 * d;
            b[i] = nb;
            w[i] = w[i] - lr * nb;
        }
    }
}

ch_status ch_cpu_sgd_step(void *st, const ch_sgd_tensor_t *ts, int n, const ch_sgd_hparams_t *h)
{
    (void)st;
    const float lr = h->lr, wd = h->weight_decay, mom = h->momentum;
    const float damp1 = (float)(1.0 - (double)h->dampening); /* as optim.c */
    for (int k = 0; k < n; k++) {
        const ch_sgd_tensor_t *t = &ts[k];
        if (t->numel == 0) continue;
        float *restrict w = t->param;
        const float *restrict g = t->grad;
        size_t m = (size_t)t->numel;
        if (mom == 0.0f) { /* torch: no momentum buffer at all */
            for (size_t i = 0; i < m; i++) w[i] = w[i] - lr * (g[i] + wd * w[i]);
            continue;
        }
        sgd_momentum(w, g, t->momentum_buffer, m, lr, wd, mom, damp1, !t->buffer_started,
                     h->nesterov);
    }
    return CH_OK;
}
