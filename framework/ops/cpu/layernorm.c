/* cohort: CPU LayerNorm over channels of an (N,C,H,W) activation (ops.h
 * ch_op_layernorm2d_*; ConvNeXt's LayerNorm2d), plain C in any layout
 * through cpu.h's channel view.
 *
 * Forward and the input gradient work per position (n, h, w): the sums over
 * C run in double, by one thread, in channel order. The parameter gradients
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

ch_status ch_cpu_ln2d_forward(void *st, const ch_tensor_t *x, const ch_tensor_t *weight,
                              const ch_tensor_t *bias, float eps, ch_tensor_t *y,
                              ch_tensor_t *mean, ch_tensor_t *rstd)
{
    ch_cpu_threads(st);
    const cpu_cview v = ch_cpu_cview(x);
    const int64_t P = v.N * v.HW, C = v.C;
    if (P == 0 || C == 0) return CH_OK;
    const float *X = x->data, *W = weight ? weight->data : NULL, *B = bias ? bias->data : NULL;
    float *Y = y->data, *M = mean->data, *R = rstd->data;
#pragma omp parallel if (3 * P * C >= CH_CPU_PAR_MIN)
    {
        int64_t p0, p1;
        ch_cpu_split(P, &p0, &p1);
        for (int64_t p = p0; p < p1; p++) {
            const int64_t n = p / v.HW, hw = p % v.HW;
            double s = 0.0;
            for (int64_t c = 0; c < C; c++) s += X[at(&v, n, c, hw)];
            const double mu = s / (double)C;
            double q = 0.0;
            for (int64_t c = 0; c < C; c++) {
                double d = X[at(&v, n, c, hw)] - mu;
                q += d * d;
            }
            const float mf = (float)mu, rf = (float)(1.0 / sqrt(q / (double)C + (double)eps));
            M[p] = mf;
            R[p] = rf;
            for (int64_t c = 0; c < C; c++) {
                const int64_t o = at(&v, n, c, hw);
                float h = (X[o] - mf) * rf;
                Y[o] = h * (W ? W[c] : 1.0f) + (B ? B[c] : 0.0f);
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
#pragma omp parallel if (3 * P * C >= CH_CPU_PAR_MIN)
    {
        int64_t p0, p1;
        ch_cpu_split(P, &p0, &p1);
        for (int64_t p = p0; p < p1; p++) {
            const int64_t n = p / v.HW, hw = p % v.HW;
            const float mf = M[p], rf = R[p];
            double sg = 0.0, sgh = 0.0;
            for (int64_t c = 0; c < C; c++) {
                const int64_t o = at(&v, n, c, hw);
                const double g = (double)D[o] * (W ? W[c] : 1.0f);
                sg += g;
                sgh += g * (double)((X[o] - mf) * rf);
            }
            const double a = sg / (double)C, b = sgh / (double)C;
            for (int64_t c = 0; c < C; c++) {
                const int64_t o = at(&v, n, c, hw);
                const double g = (double)D[o] * (W ? W[c] : 1.0f);
                const double h = (double)((X[o] - mf) * rf);
                O[o] = (float)((double)rf * (g - a - h * b));
            }
        }
    }
    return CH_OK;
}
