/* cohort: CUDA dense ops — host-side planning helpers and the per-element
 * index arithmetic shared by the kernels (framework/ops/cuda/dense.cu,
 * conv.cu, linear.cu, pool.cu).
 *
 * Not installed. Plain C (no CUDA headers) so that tests/test_cuda_plan.c
 * can check it on a machine without a GPU: the functions marked CH_CD_HD
 * are compiled both for the host and (inside nvcc) for the device, and the
 * kernels call exactly these.
 *
 * Activation offsets (4-D, logical (N,C,H,W)):
 *   PLAIN (NCHW)  ((n*C + c)*H + h)*W + w
 *   NHWC          ((n*H + h)*W + w)*C + c
 * Blocked layouts never reach the GPU (ops reject them first).
 */
#ifndef COHORT_OPS_CUDA_DENSE_PLAN_H
#define COHORT_OPS_CUDA_DENSE_PLAN_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "framework/ops/ops.h"

#ifdef __CUDACC__
#define CH_CD_HD __host__ __device__
#else
#define CH_CD_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ layouts */

/* Offset of (n,c,h,w) in a (N,C,H,W) tensor; nhwc != 0 for channels-last. */
CH_CD_HD static inline int64_t ch_cd_off4(int nhwc, int64_t C, int64_t H, int64_t W, int64_t n,
                                          int64_t c, int64_t h, int64_t w)
{
    return nhwc ? ((n * H + h) * W + w) * C + c : ((n * C + c) * H + h) * W + w;
}

/* Inverse of ch_cd_off4 for the element at linear offset i. */
CH_CD_HD static inline void ch_cd_idx4(int nhwc, int64_t C, int64_t H, int64_t W, int64_t i,
                                       int64_t *n, int64_t *c, int64_t *h, int64_t *w)
{
    if (nhwc) {
        *c = i % C;
        i /= C;
        *w = i % W;
        i /= W;
        *h = i % H;
        *n = i / H;
    } else {
        *w = i % W;
        i /= W;
        *h = i % H;
        i /= H;
        *c = i % C;
        *n = i / C;
    }
}

/* Channel of the element at offset i of an (N,C,HW) activation. */
CH_CD_HD static inline int64_t ch_cd_chan(int nhwc, int64_t C, int64_t HW, int64_t i)
{
    return nhwc ? i % C : (i / HW) % C;
}

/* Layout change PLAIN <-> NHWC as a batched transpose in[b][r][s] ->
 * out[b][s][r]: PLAIN [N][C][HW] -> NHWC has R = C, S = HW; NHWC
 * [N][HW][C] -> PLAIN has R = HW, S = C (sl is the source layout). */
static inline void ch_cd_transpose_dims(ch_layout_t sl, int64_t C, int64_t HW, int64_t *R,
                                        int64_t *S)
{
    *R = sl == CH_LAYOUT_PLAIN ? C : HW;
    *S = sl == CH_LAYOUT_PLAIN ? HW : C;
}

/* Source offset of output element i of that transpose. */
CH_CD_HD static inline int64_t ch_cd_transpose_src(int64_t i, int64_t R, int64_t S)
{
    int64_t r = i % R, s = (i / R) % S, b = i / (R * S);
    return (b * R + r) * S + s;
}

/* The layout two activations of one conv call are computed in: their common
 * layout, else the layout of the one with more elements (converting the
 * smaller one costs less); `a` wins ties. */
ch_layout_t ch_cd_pick_layout(ch_layout_t la, int64_t numel_a, ch_layout_t lb, int64_t numel_b);

/* 1 when every value fits a C int (cuDNN / cuBLAS take int sizes). */
int ch_cd_fits_int(const int64_t *v, int n);

/* ---------------------------------------------------------- workspace */

/* One op's scratch carved out of the single ch_cuda_workspace block:
 * offsets aligned to 256 bytes (cuDNN / vector loads). */
#define CH_CD_CARVE_MAX 8
#define CH_CD_ALIGN 256
typedef struct {
    size_t off[CH_CD_CARVE_MAX];
    size_t len[CH_CD_CARVE_MAX];
    size_t total;
    int n;
} ch_cd_carve_t;

void ch_cd_carve_init(ch_cd_carve_t *c);
/* Reserve `bytes` (0 allowed: a zero-length piece); returns its index, or -1
 * when CH_CD_CARVE_MAX pieces are already taken. */
int ch_cd_carve_add(ch_cd_carve_t *c, size_t bytes);
/* Address of piece i within base (NULL for a zero-length piece). */
void *ch_cd_carve_ptr(const ch_cd_carve_t *c, void *base, int i);

/* ------------------------------------------------------------ key cache */

/* Small cache of (int64 key -> void *value), looked up by hash then key.
 * Values are destroyed by the callback given to ch_cd_cache_free. */
#define CH_CD_KEY_LEN 24
typedef struct {
    int64_t key[CH_CD_KEY_LEN];
    uint64_t hash;
    void *value;
} ch_cd_cache_entry;

typedef struct {
    ch_cd_cache_entry *e;
    size_t n, cap;
} ch_cd_cache_t;

uint64_t ch_cd_key_hash(const int64_t *key);
void *ch_cd_cache_find(const ch_cd_cache_t *c, const int64_t *key);
/* Returns 0, or -1 when out of memory (value not taken). */
int ch_cd_cache_add(ch_cd_cache_t *c, const int64_t *key, void *value);
void ch_cd_cache_free(ch_cd_cache_t *c, void (*destroy)(void *ctx, void *value), void *ctx);

/* Convolution problem key: op (1 fwd, 2 bwd data, 3 bwd filter), x shape
 * (N,C,H,W), weight (O,C/groups,kh,kw), y (N,O,Ho,Wo), stride/pad, compute
 * layout, element type (0 fp32, 1 bf16), TF32 allowed, timed search,
 * dilation, groups (CH_CD_KEY_LEN entries in all). */
void ch_cd_conv_key(int64_t key[CH_CD_KEY_LEN], int op, const int64_t xs[4],
                    const int64_t ws[4], const int64_t ys[4], const ch_conv2d_params_t *p,
                    ch_layout_t layout, int bf16, int tf32, int search);

/* ------------------------------------------------------------- pooling */

typedef struct {
    int64_t C, H, W, Ho, Wo;
    int kh, kw, sh, sw, ph, pw;
    int nhwc;
} ch_cd_pool_t;

/* Window of output (oh, ow) clipped to the input: rows [h0,h1), cols [w0,w1). */
CH_CD_HD static inline void ch_cd_pool_window(const ch_cd_pool_t *g, int64_t oh, int64_t ow,
                                              int64_t *h0, int64_t *h1, int64_t *w0,
                                              int64_t *w1)
{
    int64_t hs = oh * g->sh - g->ph, ws = ow * g->sw - g->pw;
    *h1 = hs + g->kh < g->H ? hs + g->kh : g->H;
    *w1 = ws + g->kw < g->W ? ws + g->kw : g->W;
    *h0 = hs > 0 ? hs : 0;
    *w0 = ws > 0 ? ws : 0;
}

/* Max over the window of output (n,c,oh,ow) of x (torch.nn.MaxPool2d: padding
 * is -inf, NaN propagates), as framework/ops/cpu/kernels.c. */
CH_CD_HD static inline float ch_cd_maxpool_out(const float *x, const ch_cd_pool_t *g, int64_t n,
                                               int64_t c, int64_t oh, int64_t ow)
{
    int64_t h0, h1, w0, w1;
    ch_cd_pool_window(g, oh, ow, &h0, &h1, &w0, &w1);
    float best = -INFINITY;
    for (int64_t h = h0; h < h1; h++)
        for (int64_t w = w0; w < w1; w++) {
            float v = x[ch_cd_off4(g->nhwc, g->C, g->H, g->W, n, c, h, w)];
            best = (v > best || v != v) ? v : best;
        }
    return best;
}

/* Position h*W + w of the element the CPU backend routes the gradient of
 * output (n,c,oh,ow) to: the first maximum in row-major window order, a NaN
 * replacing any earlier candidate (kernels.c k_maxpool_bwd). */
CH_CD_HD static inline int64_t ch_cd_maxpool_argmax(const float *x, const ch_cd_pool_t *g,
                                                    int64_t n, int64_t c, int64_t oh,
                                                    int64_t ow)
{
    int64_t h0, h1, w0, w1;
    ch_cd_pool_window(g, oh, ow, &h0, &h1, &w0, &w1);
    float best = -INFINITY;
    int64_t idx = h0 * g->W + w0;
    for (int64_t h = h0; h < h1; h++)
        for (int64_t w = w0; w < w1; w++) {
            float v = x[ch_cd_off4(g->nhwc, g->C, g->H, g->W, n, c, h, w)];
            if (v > best || v != v) {
                best = v;
                idx = h * g->W + w;
            }
        }
    return idx;
}

/* Output rows whose window contains input row h: [lo, hi] (empty when lo > hi). */
CH_CD_HD static inline void ch_cd_pool_cover(int64_t h, int k, int s, int p, int64_t out,
                                             int64_t *lo, int64_t *hi)
{
    int64_t a = h + p - k + 1; /* oh*s >= a */
    *lo = a <= 0 ? 0 : (a + s - 1) / s;
    *hi = (h + p) / s;
    if (*hi > out - 1) *hi = out - 1;
}

/* dx at input (n,c,h,w): the sum of dy over the windows whose argmax is this
 * element, added in (oh, ow) row-major order — the order the CPU backend
 * accumulates in, so the result is bitwise the CPU's. dy is (N,C,Ho,Wo) in
 * the same layout as x. No atomics: each input element is one thread. */
CH_CD_HD static inline float ch_cd_maxpool_grad(const float *x, const float *dy,
                                                const ch_cd_pool_t *g, int64_t n, int64_t c,
                                                int64_t h, int64_t w)
{
    int64_t olo, ohi, wlo, whi;
    ch_cd_pool_cover(h, g->kh, g->sh, g->ph, g->Ho, &olo, &ohi);
    ch_cd_pool_cover(w, g->kw, g->sw, g->pw, g->Wo, &wlo, &whi);
    int64_t pos = h * g->W + w;
    float s = 0.0f;
    for (int64_t oh = olo; oh <= ohi; oh++)
        for (int64_t ow = wlo; ow <= whi; ow++)
            if (ch_cd_maxpool_argmax(x, g, n, c, oh, ow) == pos)
                s += dy[ch_cd_off4(g->nhwc, g->C, g->Ho, g->Wo, n, c, oh, ow)];
    return s;
}

/* The same sum from precomputed argmax positions: am[off4(n,c,oh,ow)] =
 * ch_cd_maxpool_argmax(n,c,oh,ow) for every output, laid out like dy. Used by
 * the GPU's two-pass backward (one argmax per window instead of one per
 * covering input element). */
CH_CD_HD static inline float ch_cd_maxpool_grad_am(const int32_t *am, const float *dy,
                                                   const ch_cd_pool_t *g, int64_t n, int64_t c,
                                                   int64_t h, int64_t w)
{
    int64_t olo, ohi, wlo, whi;
    ch_cd_pool_cover(h, g->kh, g->sh, g->ph, g->Ho, &olo, &ohi);
    ch_cd_pool_cover(w, g->kw, g->sw, g->pw, g->Wo, &wlo, &whi);
    int32_t pos = (int32_t)(h * g->W + w);
    float s = 0.0f;
    for (int64_t oh = olo; oh <= ohi; oh++)
        for (int64_t ow = wlo; ow <= whi; ow++) {
            int64_t o = ch_cd_off4(g->nhwc, g->C, g->Ho, g->Wo, n, c, oh, ow);
            if (am[o] == pos) s += dy[o];
        }
    return s;
}

#ifdef __cplusplus
}
#endif
#endif /* COHORT_OPS_CUDA_DENSE_PLAN_H */
