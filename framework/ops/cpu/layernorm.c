/* cohort: CPU LayerNorm over channels of an (N,C,H,W) activation (ops.h
 * ch_op_layernorm2d_*; ConvNeXt's LayerNorm2d), plain C in any layout
 * through cpu.h's channel view.
 *
 * Forward and the input gradient work per position (n, h, w), in tiles of
 * consecutive positions: the sums over C run in double, by one thread, in
 * channel order. The parameter gradients
 * are sums over positions per channel: each channel is summed in double by
 * one thread in position order. Threads split positions (forward, dx) or
 * channels (dweight, dbias) into contiguous ranges, so every result is
 * bitwise the same for any thread count.
 */
#include "config.h"

#include "framework/ops/cpu/cpu.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* offset of element (n, c, hw) in the view v */
static inline int64_t at(const cpu_cview *v, int64_t n, int64_t c, int64_t hw)
{
    return ((n * v->nb + c / v->B) * v->HW + hw) * v->B + c % v->B;
}

/* Positions go in tiles of up to LN_T consecutive (h, w) of one sample, one
 * lane each: element (n, c, hw + t) lies t * B after (n, c, hw), so the
 * channel loops run over all lanes at once (contiguous lanes in PLAIN).
 * Each lane sums its own channels in channel order, as one position alone
 * would. */
#define LN_T 16

/* the tile starting at position p, at most until p1: sample n, (h, w)
 * index hw, lanes *T */
static inline void ln_tile(const cpu_cview *v, int64_t p, int64_t p1, int64_t *n, int64_t *hw,
                           int64_t *T)
{
    *n = p / v->HW;
    *hw = p % v->HW;
    int64_t t = LN_T;
    if (t > p1 - p) t = p1 - p;
    if (t > v->HW - *hw) t = v->HW - *hw;
    *T = t;
}

ch_status ch_cpu_ln2d_forward(void *st, const ch_tensor_t *x, const ch_tensor_t *weight,
                              const ch_tensor_t *bias, float eps, ch_tensor_t *y,
                              ch_tensor_t *mean, ch_tensor_t *rstd)
{
    ch_cpu_threads(st);
    const cpu_cview v = ch_cpu_cview(x);
    const int64_t P = v.N * v.HW, C = v.C, B = v.B;
    if (P == 0 || C == 0) return CH_OK;
    const float *X = x->data, *W = weight ? weight->data : NULL, *Bi = bias ? bias->data : NULL;
    float *Y = y->data, *M = mean->data, *R = rstd->data;
#pragma omp parallel if (3 * P * C >= CH_CPU_PAR_MIN)
    {
        int64_t p0, p1, n, hw, T;
        ch_cpu_split(P, &p0, &p1);
        for (int64_t p = p0; p < p1; p += T) {
            ln_tile(&v, p, p1, &n, &hw, &T);
            double s[LN_T] = {0}, q[LN_T] = {0}, mu[LN_T];
            float mf[LN_T], rf[LN_T];
            for (int64_t c = 0; c < C; c++) {
                const float *xc = X + at(&v, n, c, hw);
                for (int64_t t = 0; t < T; t++) s[t] += xc[t * B];
            }
            for (int64_t t = 0; t < T; t++) mu[t] = s[t] / (double)C;
            for (int64_t c = 0; c < C; c++) {
                const float *xc = X + at(&v, n, c, hw);
                for (int64_t t = 0; t < T; t++) {
                    double d = xc[t * B] - mu[t];
                    q[t] += d * d;
                }
            }
            for (int64_t t = 0; t < T; t++) {
                mf[t] = (float)mu[t];
                rf[t] = (float)(1.0 / sqrt(q[t] / (double)C + (double)eps));
                M[p + t] = mf[t];
                R[p + t] = rf[t];
            }
            for (int64_t c = 0; c < C; c++) {
                const int64_t o = at(&v, n, c, hw);
                const float wc = W ? W[c] : 1.0f, bc = Bi ? Bi[c] : 0.0f;
                for (int64_t t = 0; t < T; t++)
                    Y[o + t * B] = (X[o + t * B] - mf[t]) * rf[t] * wc + bc;
            }
        }
    }
    return CH_OK;
}

ch_status ch_cpu_ln2d_backward(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                               const ch_tensor_t *mean, const ch_tensor_t *rstd,
                               const ch_tensor_t *weight, ch_tensor_t *dx, ch_tensor_t *dweight,
                               ch_tensor_t *dbias)
{
    ch_cpu_threads(st);
    const cpu_cview v = ch_cpu_cview(x);
    const int64_t P = v.N * v.HW, C = v.C;
    const float *X = x->data, *D = dy->data, *M = mean->data, *R = rstd->data;
    const float *W = weight ? weight->data : NULL;
    /* parameter gradients first: dx may alias dy */
    if (dweight || dbias) {
        float *DW = dweight ? dweight->data : NULL, *DB = dbias ? dbias->data : NULL;
#pragma omp parallel if (2 * P * C >= CH_CPU_PAR_MIN)
        {
            int64_t c0, c1;
            ch_cpu_split(C, &c0, &c1);
            for (int64_t c = c0; c < c1; c++) {
                double sw = 0.0, sb = 0.0;
                for (int64_t p = 0; p < P; p++) {
                    const int64_t o = at(&v, p / v.HW, c, p % v.HW);
                    const float h = (X[o] - M[p]) * R[p];
                    sw += (double)D[o] * (double)h;
                    sb += D[o];
                }
                if (DW) DW[c] = (float)sw;
                if (DB) DB[c] = (float)sb;
            }
        }
    }
    if (!dx || P == 0 || C == 0) return CH_OK;
    float *O = dx->data;
    const int64_t B = v.B;
#pragma omp parallel if (3 * P * C >= CH_CPU_PAR_MIN)
    {
        int64_t p0, p1, n, hw, T;
        ch_cpu_split(P, &p0, &p1);
        for (int64_t p = p0; p < p1; p += T) {
            ln_tile(&v, p, p1, &n, &hw, &T);
            double sg[LN_T] = {0}, sgh[LN_T] = {0}, a[LN_T], b[LN_T];
            for (int64_t c = 0; c < C; c++) {
                const int64_t o = at(&v, n, c, hw);
                const double wc = W ? W[c] : 1.0f;
                for (int64_t t = 0; t < T; t++) {
                    const double g = (double)D[o + t * B] * wc;
                    sg[t] += g;
                    sgh[t] += g * (double)((X[o + t * B] - M[p + t]) * R[p + t]);
                }
            }
            for (int64_t t = 0; t < T; t++) {
                a[t] = sg[t] / (double)C;
                b[t] = sgh[t] / (double)C;
            }
            for (int64_t c = 0; c < C; c++) {
                const int64_t o = at(&v, n, c, hw);
                const double wc = W ? W[c] : 1.0f;
                for (int64_t t = 0; t < T; t++) {
                    const double g = (double)D[o + t * B] * wc;
                    const double h = (double)((X[o + t * B] - M[p + t]) * R[p + t]);
                    O[o + t * B] = (float)((double)R[p + t] * (g - a[t] - h * b[t]));
                }
            }
        }
    }
    return CH_OK;
}
