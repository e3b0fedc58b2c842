/* cohort: CPU channel ops (ops.h ch_op_mul_channel*, ch_op_concat_channels*):
 * squeeze-excitation's per-(n, c) scale and the channel concat of
 * Inception-style branches, plain C over the channel view of every layout
 * (cpu.h cpu_cview). Each (n, c) plane is done by one thread in h, w order,
 * and no sum is split across threads: bitwise the same for any thread count
 * (tests/test_nn_graph.c). */
#include "config.h"

#include "framework/ops/cpu/cpu.h"

#include <stdint.h>
#include <string.h>

static inline int64_t at(const cpu_cview *v, int64_t n, int64_t c, int64_t hw)
{
    return ((n * v->nb + c / v->B) * v->HW + hw) * v->B + c % v->B;
}

ch_status ch_cpu_mul_channel(void *st, const ch_tensor_t *x, const ch_tensor_t *s, ch_tensor_t *y)
{
    (void)st;
    const cpu_cview vx = ch_cpu_cview(x), vy = ch_cpu_cview(y);
    const float *xp = x->data, *sp = s->data; /* s: (N, C[, 1, 1]), element n*C + c */
    float *yp = y->data;
    const int64_t NC = vx.N * vx.C, HW = vx.HW;
#pragma omp parallel for schedule(static) if (2 * NC * HW >= CH_CPU_PAR_MIN)
    for (int64_t p = 0; p < NC; p++) {
        const int64_t n = p / vx.C, c = p % vx.C;
        const float g = sp[p];
        for (int64_t hw = 0; hw < HW; hw++) yp[at(&vy, n, c, hw)] = xp[at(&vx, n, c, hw)] * g;
    }
    return CH_OK;
}

ch_status ch_cpu_mul_channel_backward(void *st, const ch_tensor_t *x, const ch_tensor_t *s,
                                      const ch_tensor_t *dy, ch_tensor_t *dx, ch_tensor_t *ds)
{
    (void)st;
    const cpu_cview vx = ch_cpu_cview(x), vd = ch_cpu_cview(dy);
    const cpu_cview vdx = dx ? ch_cpu_cview(dx) : vx;
    const float *xp = x->data, *sp = s->data, *dyp = dy->data;
    float *dxp = dx ? dx->data : NULL, *dsp = ds ? ds->data : NULL;
    const int64_t NC = vx.N * vx.C, HW = vx.HW;
#pragma omp parallel for schedule(static) if (3 * NC * HW >= CH_CPU_PAR_MIN)
    for (int64_t p = 0; p < NC; p++) {
        const int64_t n = p / vx.C, c = p % vx.C;
        const float g = sp[p];
        float acc = 0.0f;
        for (int64_t hw = 0; hw < HW; hw++) {
            const float d = dyp[at(&vd, n, c, hw)];
            if (dxp) dxp[at(&vdx, n, c, hw)] = d * g;
            acc += d * xp[at(&vx, n, c, hw)];
        }
        if (dsp) dsp[p] = acc;
    }
    return CH_OK;
}

/* Copy the channels [c0, c0 + part's C) of `whole` to or from `part`. */
static void copy_slice(const ch_tensor_t *whole, const ch_tensor_t *part, int64_t c0, int to_part)
{
    const cpu_cview vw = ch_cpu_cview(whole), vp = ch_cpu_cview(part);
    float *wp = whole->data, *pp = part->data;
    const int64_t NC = vp.N * vp.C, HW = vp.HW;
#pragma omp parallel for schedule(static) if (2 * NC * HW >= CH_CPU_PAR_MIN)
    for (int64_t p = 0; p < NC; p++) {
        const int64_t n = p / vp.C, c = p % vp.C;
        for (int64_t hw = 0; hw < HW; hw++) {
            const int64_t iw = at(&vw, n, c0 + c, hw), ip = at(&vp, n, c, hw);
            if (to_part) pp[ip] = wp[iw];
            else wp[iw] = pp[ip];
        }
    }
}

ch_status ch_cpu_concat_channels(void *st, const ch_tensor_t *const *xs, int n, ch_tensor_t *y)
{
    (void)st;
    int64_t c0 = 0;
    for (int i = 0; i < n; i++) {
        copy_slice(y, xs[i], c0, 0);
        c0 += xs[i]->shape[1];
    }
    return CH_OK;
}

ch_status ch_cpu_split_channels(void *st, const ch_tensor_t *dy, ch_tensor_t *const *dxs, int n)
{
    (void)st;
    int64_t c0 = 0;
    for (int i = 0; i < n; i++) {
        copy_slice(dy, dxs[i], c0, 1);
        c0 += dxs[i]->shape[1];
    }
    return CH_OK;
}

/* ------------------------------------------------------------ graph ops */

/* b's element (n, c, hw) for a broadcast or full b: bn = 1 broadcasts over
 * N, bhw = 1 over H, W. */
static inline float bval(const float *bp, const cpu_cview *vb, int64_t n, int64_t c, int64_t hw)
{
    return bp[at(vb, vb->N == 1 ? 0 : n, c, vb->HW == 1 ? 0 : hw)];
}

ch_status ch_cpu_binary(void *st, int op, const ch_tensor_t *a, const ch_tensor_t *b,
                        ch_tensor_t *y)
{
    (void)st;
    const cpu_cview va = ch_cpu_cview(a), vb = ch_cpu_cview(b), vy = ch_cpu_cview(y);
    const float *ap = a->data, *bp = b->data;
    float *yp = y->data;
    const int64_t NC = va.N * va.C, HW = va.HW;
#pragma omp parallel for schedule(static) if (3 * NC * HW >= CH_CPU_PAR_MIN)
    for (int64_t p = 0; p < NC; p++) {
        const int64_t n = p / va.C, c = p % va.C;
        if (op == 0)
            for (int64_t hw = 0; hw < HW; hw++)
                yp[at(&vy, n, c, hw)] = ap[at(&va, n, c, hw)] + bval(bp, &vb, n, c, hw);
        else
            for (int64_t hw = 0; hw < HW; hw++)
                yp[at(&vy, n, c, hw)] = ap[at(&va, n, c, hw)] * bval(bp, &vb, n, c, hw);
    }
    return CH_OK;
}

ch_status ch_cpu_binary_backward(void *st, int op, const ch_tensor_t *a, const ch_tensor_t *b,
                                 const ch_tensor_t *dy, ch_tensor_t *da, ch_tensor_t *db)
{
    (void)st;
    const cpu_cview va = ch_cpu_cview(a), vb = ch_cpu_cview(b), vd = ch_cpu_cview(dy);
    const float *ap = a->data, *bp = b->data, *dyp = dy->data;
    const int64_t N = va.N, C = va.C, HW = va.HW;
    if (da) {
        const cpu_cview vda = ch_cpu_cview(da);
        float *dap = da->data;
#pragma omp parallel for schedule(static) if (3 * N * C * HW >= CH_CPU_PAR_MIN)
        for (int64_t p = 0; p < N * C; p++) {
            const int64_t n = p / C, c = p % C;
            for (int64_t hw = 0; hw < HW; hw++) {
                const float d = dyp[at(&vd, n, c, hw)];
                dap[at(&vda, n, c, hw)] = op == 0 ? d : d * bval(bp, &vb, n, c, hw);
            }
        }
    }
    if (!db) return CH_OK;
    const cpu_cview vdb = ch_cpu_cview(db);
    float *dbp = db->data;
    if (vb.HW != 1 || HW == 1) {
        if (vb.N == N) { /* same shape: elementwise */
#pragma omp parallel for schedule(static) if (3 * N * C * HW >= CH_CPU_PAR_MIN)
            for (int64_t p = 0; p < N * C; p++) {
                const int64_t n = p / C, c = p % C;
                for (int64_t hw = 0; hw < HW; hw++) {
                    const float d = dyp[at(&vd, n, c, hw)];
                    dbp[at(&vdb, n, c, hw)] = op == 0 ? d : d * ap[at(&va, n, c, hw)];
                }
            }
            return CH_OK;
        }
    }
    /* broadcast over H, W (and N when b's N is 1): per (n_b, c) a sum in
     * n, h, w order */
    const int64_t NB = vb.N;
#pragma omp parallel for schedule(static) if (2 * N * C * HW >= CH_CPU_PAR_MIN)
    for (int64_t p = 0; p < NB * C; p++) {
        const int64_t nb = p / C, c = p % C;
        const int64_t n0 = NB == 1 ? 0 : nb, n1 = NB == 1 ? N : nb + 1;
        float acc = 0.0f;
        for (int64_t n = n0; n < n1; n++)
            for (int64_t hw = 0; hw < HW; hw++) {
                const float d = dyp[at(&vd, n, c, hw)];
                acc += op == 0 ? d : d * ap[at(&va, n, c, hw)];
            }
        dbp[at(&vdb, nb, c, 0)] = acc;
    }
    return CH_OK;
}

ch_status ch_cpu_copy_channels(void *st, const ch_tensor_t *src, int64_t src_c0,
                               ch_tensor_t *dst, int64_t dst_c0, int64_t nc)
{
    (void)st;
    const cpu_cview vs = ch_cpu_cview(src), vd = ch_cpu_cview(dst);
    const float *sp = src->data;
    float *dp = dst->data;
    const int64_t NC = vs.N * nc, HW = vs.HW;
#pragma omp parallel for schedule(static) if (2 * NC * HW >= CH_CPU_PAR_MIN)
    for (int64_t p = 0; p < NC; p++) {
        const int64_t n = p / nc, c = p % nc;
        for (int64_t hw = 0; hw < HW; hw++)
            dp[at(&vd, n, dst_c0 + c, hw)] = sp[at(&vs, n, src_c0 + c, hw)];
    }
    return CH_OK;
}

ch_status ch_cpu_channel_shuffle(void *st, const ch_tensor_t *x, int groups, ch_tensor_t *y)
{
    (void)st;
    const cpu_cview vx = ch_cpu_cview(x), vy = ch_cpu_cview(y);
    const float *xp = x->data;
    float *yp = y->data;
    const int64_t C = vx.C, NC = vx.N * C, HW = vx.HW, cpg = C / groups;
#pragma omp parallel for schedule(static) if (2 * NC * HW >= CH_CPU_PAR_MIN)
    for (int64_t p = 0; p < NC; p++) {
        const int64_t n = p / C, j = p % C, src = (j % groups) * cpg + j / groups;
        for (int64_t hw = 0; hw < HW; hw++) yp[at(&vy, n, j, hw)] = xp[at(&vx, n, src, hw)];
    }
    return CH_OK;
}

ch_status ch_cpu_affine(void *st, const ch_tensor_t *x, float alpha, float beta, ch_tensor_t *y)
{
    (void)st;
    const cpu_cview vx = ch_cpu_cview(x), vy = ch_cpu_cview(y);
    const float *xp = x->data;
    float *yp = y->data;
    const int64_t NC = vx.N * vx.C, HW = vx.HW;
#pragma omp parallel for schedule(static) if (2 * NC * HW >= CH_CPU_PAR_MIN)
    for (int64_t p = 0; p < NC; p++) {
        const int64_t n = p / vx.C, c = p % vx.C;
        for (int64_t hw = 0; hw < HW; hw++)
            yp[at(&vy, n, c, hw)] = alpha * xp[at(&vx, n, c, hw)] + beta;
    }
    return CH_OK;
}
