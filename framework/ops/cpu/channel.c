/* cohort: CPU channel ops (ops.h ch_op_mul_channel*, ch_op_concat_channels*):
 * squeeze-excitation's per-(n, c) scale and the channel concat of
 * Inception-style branches, plain C over the channel view of every layout
 * (cpu.h cpu_cview). Each (n, c) plane is done by one thread in h, w order,
 * and no sum is split across threads: bitwise the same for any thread count
 * (tests/test_nn_graph.c).
 *
 * The pure copies (concat, split, narrow, channel shuffle) move runs of
 * channels that are contiguous in one channel block of both tensors: whole
 * blocks of one blocking at once (memcpy), else per pixel a run of 16, 8 or
 * fewer lanes (vector moves), the shuffle a gather of up to 16 lanes per
 * pixel. They run over samples (or (sample, block) pairs) on the rank's
 * threads above CH_CPU_PAR_MIN; a copy is the same bits on any thread count
 * (tests/test_channel_copy.c). */
#include "config.h"

#include "framework/ops/cpu/cpu.h"

#include <stdint.h>
#include <stdlib.h>
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

/* HW pixels of r channel lanes: d[hw * ds + l] = s[hw * ss + l], l < r (ds,
 * ss: the pixel strides, the channel blocks of the two tensors). */
CH_CPU_SIMD static void copy_run(float *d, int64_t ds, const float *s, int64_t ss, int64_t r,
                                 int64_t HW)
{
    if (r == ds && r == ss) {
        memcpy(d, s, (size_t)(HW * r) * sizeof *d);
    } else if (r == 16) {
        for (int64_t hw = 0; hw < HW; hw++)
            for (int l = 0; l < 16; l++) d[hw * ds + l] = s[hw * ss + l];
    } else if (r == 8) {
        for (int64_t hw = 0; hw < HW; hw++)
            for (int l = 0; l < 8; l++) d[hw * ds + l] = s[hw * ss + l];
    } else if (r == 1) {
        for (int64_t hw = 0; hw < HW; hw++) d[hw * ds] = s[hw * ss];
    } else {
        for (int64_t hw = 0; hw < HW; hw++)
            for (int64_t l = 0; l < r; l++) d[hw * ds + l] = s[hw * ss + l];
    }
}

/* dst[:, dc0 + c] = src[:, sc0 + c] for c in [0, nc), any two layouts. */
static void copy_ch(const ch_tensor_t *src, int64_t sc0, ch_tensor_t *dst, int64_t dc0,
                    int64_t nc)
{
    const cpu_cview vs = ch_cpu_cview(src), vd = ch_cpu_cview(dst);
    const float *sp = src->data;
    float *dp = dst->data;
    const int64_t N = vs.N, HW = vs.HW, Bs = vs.B, Bd = vd.B;
    if (nc <= 0 || N <= 0 || HW <= 0) return;
    const int par = 2 * N * nc * HW >= CH_CPU_PAR_MIN;
    if (Bs == Bd && sc0 % Bs == 0 && dc0 % Bd == 0 && nc % Bs == 0) {
        /* whole blocks of one blocking: a sample's part is one run */
        const size_t bytes = (size_t)(nc * HW) * sizeof *dp;
#pragma omp parallel for schedule(static) if (par)
        for (int64_t n = 0; n < N; n++)
            memcpy(dp + (n * vd.nb + dc0 / Bd) * HW * Bd, sp + (n * vs.nb + sc0 / Bs) * HW * Bs,
                   bytes);
        return;
    }
#pragma omp parallel for schedule(static) if (par)
    for (int64_t n = 0; n < N; n++) {
        int64_t r;
        for (int64_t c = 0; c < nc; c += r) {
            const int64_t cs = sc0 + c, cd = dc0 + c;
            r = nc - c;
            if (Bs - cs % Bs < r) r = Bs - cs % Bs;
            if (Bd - cd % Bd < r) r = Bd - cd % Bd;
            copy_run(dp + (n * vd.nb + cd / Bd) * HW * Bd + cd % Bd, Bd,
                     sp + (n * vs.nb + cs / Bs) * HW * Bs + cs % Bs, Bs, r, HW);
        }
    }
}

ch_status ch_cpu_concat_channels(void *st, const ch_tensor_t *const *xs, int n, ch_tensor_t *y)
{
    ch_cpu_threads(st);
    int64_t c0 = 0;
    for (int i = 0; i < n; i++) {
        copy_ch(xs[i], 0, y, c0, xs[i]->shape[1]);
        c0 += xs[i]->shape[1];
    }
    return CH_OK;
}

ch_status ch_cpu_split_channels(void *st, const ch_tensor_t *dy, ch_tensor_t *const *dxs, int n)
{
    ch_cpu_threads(st);
    int64_t c0 = 0;
    for (int i = 0; i < n; i++) {
        copy_ch(dy, c0, dxs[i], 0, dxs[i]->shape[1]);
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
    ch_cpu_threads(st);
    copy_ch(src, src_c0, dst, dst_c0, nc);
    return CH_OK;
}

/* HW pixels of L lanes gathered from L source channels: d[hw * ds + l] =
 * s[hw * ss + off[l]] (ss: the source's channel block, off[l]: the source
 * lane's offset from s). */
CH_CPU_SIMD static void gather_run(float *d, int64_t ds, const float *s, int64_t ss,
                                   const int64_t *off, int64_t L, int64_t HW)
{
    if (L == 16) {
        for (int64_t hw = 0; hw < HW; hw++)
            for (int l = 0; l < 16; l++) d[hw * ds + l] = s[hw * ss + off[l]];
    } else if (L == 8) {
        for (int64_t hw = 0; hw < HW; hw++)
            for (int l = 0; l < 8; l++) d[hw * ds + l] = s[hw * ss + off[l]];
    } else if (L == 1 && ds == 1 && ss == 1) {
        memcpy(d, s + off[0], (size_t)HW * sizeof *d);
    } else {
        for (int64_t hw = 0; hw < HW; hw++)
            for (int64_t l = 0; l < L; l++) d[hw * ds + l] = s[hw * ss + off[l]];
    }
}

/* Offset of channel c from its sample's start in view v, pixel 0. */
static inline int64_t chan_off(const cpu_cview *v, int64_t c)
{
    return (c / v->B) * v->HW * v->B + c % v->B;
}

ch_status ch_cpu_channel_shuffle(void *st, const ch_tensor_t *x, int groups, ch_tensor_t *y)
{
    ch_cpu_threads(st);
    const cpu_cview vx = ch_cpu_cview(x), vy = ch_cpu_cview(y);
    const float *xp = x->data;
    float *yp = y->data;
    const int64_t C = vx.C, N = vx.N, HW = vx.HW, cpg = C / groups, Bx = vx.B, By = vy.B;
    const int64_t nbl = vy.nb; /* y's channel blocks per sample */
    /* source offsets of y's channels, the same for every sample (computed
     * per lane chunk below where the table cannot be had) */
    int64_t *tab = malloc((size_t)C * sizeof *tab);
    if (tab)
        for (int64_t j = 0; j < C; j++) tab[j] = chan_off(&vx, (j % groups) * cpg + j / groups);
#pragma omp parallel for schedule(static) if (2 * N * C * HW >= CH_CPU_PAR_MIN)
    for (int64_t p = 0; p < N * nbl; p++) {
        const int64_t n = p / nbl, jb = p % nbl;
        const float *xn = xp + n * vx.nb * HW * Bx;
        float *yb = yp + (n * nbl + jb) * HW * By;
        for (int64_t l0 = 0; l0 < By; l0 += 16) {
            const int64_t L = By - l0 < 16 ? By - l0 : 16;
            int64_t own[16];
            const int64_t *off = tab ? tab + jb * By + l0 : own;
            if (!tab)
                for (int64_t l = 0; l < L; l++) {
                    const int64_t j = jb * By + l0 + l;
                    own[l] = chan_off(&vx, (j % groups) * cpg + j / groups);
                }
            gather_run(yb + l0, By, xn, Bx, off, L, HW);
        }
    }
    free(tab);
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
