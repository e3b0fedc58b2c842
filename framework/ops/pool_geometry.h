/* cohort: the window geometry of average pooling, shared by the CPU backend
 * (framework/ops/cpu/kernels.c) and the CUDA backend (framework/ops/cuda/
 * pool.cu) so both compute the same ranges and divisors. Not installed.
 *
 * Output o along an axis averages inputs [a, b) and has divisor factor d;
 * the output element's divisor is dh * dw (integers, as PyTorch's
 * AvgPoolKernel.cpp / AdaptiveAvgPoolKernel.cpp):
 *  - windows (torch.nn.AvgPool2d): [o*s - p, o*s - p + k) clipped to the
 *    input; d = the window clipped to [-p, n + p) with count_include_pad,
 *    else b - a;
 *  - adaptive bins (torch.nn.AdaptiveAvgPool2d): [floor(o*n/no),
 *    ceil((o+1)*n/no)), d = b - a.
 */
#ifndef COHORT_OPS_POOL_GEOMETRY_H
#define COHORT_OPS_POOL_GEOMETRY_H

#include <stdint.h>

#include "framework/ops/ops.h"

#ifdef __CUDACC__
#define CH_POOL_HD __host__ __device__
#else
#define CH_POOL_HD
#endif

typedef struct {
    int64_t H, W, Ho, Wo;      /* input and output extents */
    int adaptive;              /* 1: adaptive bins, 0: windows */
    int kh, kw, sh, sw, ph, pw, include_pad;
} ch_avg_geo_t;

static inline CH_POOL_HD void ch_avg_range(const ch_avg_geo_t *g, int axis, int64_t o,
                                           int64_t *a, int64_t *b, int64_t *d)
{
    int64_t n = axis ? g->W : g->H, no = axis ? g->Wo : g->Ho;
    if (g->adaptive) {
        *a = (o * n) / no;
        *b = ((o + 1) * n + no - 1) / no;
        *d = *b - *a;
        return;
    }
    int64_t k = axis ? g->kw : g->kh, s = axis ? g->sw : g->sh, p = axis ? g->pw : g->ph;
    int64_t lo = o * s - p, hi = lo + k;
    if (hi > n + p) hi = n + p;
    int64_t full = hi - lo;
    if (lo < 0) lo = 0;
    if (hi > n) hi = n;
    *a = lo;
    *b = hi > lo ? hi : lo;
    *d = g->include_pad ? full : *b - *a;
}

/* The geometry of x (N,C,H,W) -> y (N,C,Ho,Wo) for window pooling p, or
 * adaptive bins when p is NULL. */
static inline ch_avg_geo_t ch_avg_geo_of(const ch_tensor_t *x, const ch_tensor_t *y,
                                         const ch_pool2d_params_t *p)
{
    ch_avg_geo_t g = {x->shape[2], x->shape[3], y->shape[2], y->shape[3], p == NULL, 0, 0, 0, 0,
                      0, 0, 0};
    if (p) {
        g.kh = p->kernel_h;
        g.kw = p->kernel_w;
        g.sh = p->stride_h;
        g.sw = p->stride_w;
        g.ph = p->pad_h;
        g.pw = p->pad_w;
        g.include_pad = p->count_include_pad;
    }
    return g;
}

#endif /* COHORT_OPS_POOL_GEOMETRY_H */
