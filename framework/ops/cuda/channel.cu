/* cohort: CUDA backend — channel ops (ops.h ch_op_mul_channel*,
 * ch_op_concat_channels, ch_op_split_channels, and the graph ops
 * ch_op_binary*, ch_op_copy_channels, ch_op_channel_shuffle, ch_op_affine)
 * for PLAIN (NCHW) and NHWC activations: squeeze-excitation's per-(n, c)
 * scale, the channel concat of Inception-style branches, and the nodes of
 * DAG graphs (framework/nn CH_NN_GRAPH).
 *
 * Scale and copies: one thread per element. ds[n, c] = sum over h, w of
 * dy * x: one thread per (n, c) summing in h, w order in float, as the CPU
 * loop (framework/ops/cpu/channel.c) does: no atomics, the same result on
 * every run, and the CPU's to the rounding of fused multiply-adds.
 */
#include "config.h"

#include "framework/ops/cuda/dense_internal.h"

#define GRID_STRIDE(i, n)                                                                    \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                \
         i += (int64_t)blockDim.x * gridDim.x)

/* Element (n, c, hw) of a (N, C, H, W) tensor: PLAIN or NHWC. */
typedef struct {
    int64_t N, C, HW;
    int nhwc;
} ch_geo;

static ch_geo geo_of(const ch_tensor_t *t)
{
    ch_geo g;
    ch_cd_nchw(t, &g.N, &g.C, &g.HW);
    g.nhwc = t->layout == CH_LAYOUT_NHWC;
    return g;
}

static __device__ __forceinline__ int64_t at(ch_geo g, int64_t n, int64_t c, int64_t hw)
{
    return g.nhwc ? (n * g.HW + hw) * g.C + c : (n * g.C + c) * g.HW + hw;
}

/* i runs over x's logical NCHW order */
static __global__ void k_mul(ch_geo gx, ch_geo gy, const float *x, const float *s, float *y,
                             int64_t n)
{
    GRID_STRIDE(i, n) {
        const int64_t hw = i % gx.HW, p = i / gx.HW, c = p % gx.C, b = p / gx.C;
        y[at(gy, b, c, hw)] = x[at(gx, b, c, hw)] * s[p];
    }
}

static __global__ void k_mul_dx(ch_geo gd, ch_geo gdx, const float *dy, const float *s, float *dx,
                                int64_t n)
{
    GRID_STRIDE(i, n) {
        const int64_t hw = i % gd.HW, p = i / gd.HW, c = p % gd.C, b = p / gd.C;
        dx[at(gdx, b, c, hw)] = dy[at(gd, b, c, hw)] * s[p];
    }
}

static __global__ void k_mul_ds(ch_geo gx, ch_geo gd, const float *x, const float *dy, float *ds,
                                int64_t nc)
{
    GRID_STRIDE(p, nc) {
        const int64_t c = p % gx.C, b = p / gx.C;
        float acc = 0.0f;
        for (int64_t hw = 0; hw < gx.HW; hw++)
            acc = __fadd_rn(acc, __fmul_rn(dy[at(gd, b, c, hw)], x[at(gx, b, c, hw)]));
        ds[p] = acc;
    }
}

/* part (N, Cp, H, W) <-> channels [c0, c0 + Cp) of whole */
static __global__ void k_slice(ch_geo gw, ch_geo gp, int64_t c0, float *whole, float *part,
                               int to_part, int64_t n)
{
    GRID_STRIDE(i, n) {
        const int64_t hw = i % gp.HW, p = i / gp.HW, c = p % gp.C, b = p / gp.C;
        const int64_t iw = at(gw, b, c0 + c, hw), ip = at(gp, b, c, hw);
        if (to_part) part[ip] = whole[iw];
        else whole[iw] = part[ip];
    }
}

static ch_status cd_mul_channel(void *st, const ch_tensor_t *x, const ch_tensor_t *s,
                                ch_tensor_t *y)
{
    CH_TRY(ch_cd_check_tensor(st, "ch_op_mul_channel", "x", x));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_mul_channel", "s", s));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_mul_channel", "y", y));
    int64_t n = ch_tensor_numel(x);
    if (n == 0) return CH_OK;
    k_mul<<<ch_cuda_blocks(st, n, CH_CD_THREADS), CH_CD_THREADS, 0, ch_cuda_stream(st)>>>(
        geo_of(x), geo_of(y), (const float *)x->data, (const float *)s->data, (float *)y->data, n);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

static ch_status cd_mul_channel_backward(void *st, const ch_tensor_t *x, const ch_tensor_t *s,
                                         const ch_tensor_t *dy, ch_tensor_t *dx, ch_tensor_t *ds)
{
    const char *op = "ch_op_mul_channel_backward";
    CH_TRY(ch_cd_check_tensor(st, op, "x", x));
    CH_TRY(ch_cd_check_tensor(st, op, "s", s));
    CH_TRY(ch_cd_check_tensor(st, op, "dy", dy));
    if (dx) CH_TRY(ch_cd_check_tensor(st, op, "dx", dx));
    if (ds) CH_TRY(ch_cd_check_tensor(st, op, "ds", ds));
    int64_t n = ch_tensor_numel(x), nc = x->shape[0] * x->shape[1];
    cudaStream_t cs = ch_cuda_stream(st);
    if (ds && nc > 0) {
        k_mul_ds<<<ch_cuda_blocks(st, nc, CH_CD_THREADS), CH_CD_THREADS, 0, cs>>>(
            geo_of(x), geo_of(dy), (const float *)x->data, (const float *)dy->data,
            (float *)ds->data, nc);
        CH_CUDA_CHECK_LAUNCH();
    }
    if (dx && n > 0) {
        k_mul_dx<<<ch_cuda_blocks(st, n, CH_CD_THREADS), CH_CD_THREADS, 0, cs>>>(
            geo_of(dy), geo_of(dx), (const float *)dy->data, (const float *)s->data,
            (float *)dx->data, n);
        CH_CUDA_CHECK_LAUNCH();
    }
    return CH_OK;
}

static ch_status slices(void *st, const char *op, const ch_tensor_t *whole,
                        const ch_tensor_t *const *parts, int n, int to_part)
{
    CH_TRY(ch_cd_check_tensor(st, op, "concatenation", whole));
    int64_t c0 = 0;
    for (int i = 0; i < n; i++) {
        CH_TRY(ch_cd_check_tensor(st, op, "part", parts[i]));
        int64_t k = ch_tensor_numel(parts[i]);
        if (k > 0) {
            k_slice<<<ch_cuda_blocks(st, k, CH_CD_THREADS), CH_CD_THREADS, 0, ch_cuda_stream(st)>>>(
                geo_of(whole), geo_of(parts[i]), c0, (float *)whole->data, (float *)parts[i]->data,
                to_part, k);
            CH_CUDA_CHECK_LAUNCH();
        }
        c0 += parts[i]->shape[1];
    }
    return CH_OK;
}

static ch_status cd_concat_channels(void *st, const ch_tensor_t *const *xs, int n, ch_tensor_t *y)
{
    return slices(st, "ch_op_concat_channels", y, xs, n, 0);
}

static ch_status cd_split_channels(void *st, const ch_tensor_t *dy, ch_tensor_t *const *dxs, int n)
{
    return slices(st, "ch_op_split_channels", dy, (const ch_tensor_t *const *)dxs, n, 1);
}

/* ------------------------------------------------------------ graph ops */

/* b's element for a full or broadcast b (N 1: over N; HW 1: over H, W) */
static __device__ __forceinline__ int64_t at_b(ch_geo g, int64_t n, int64_t c, int64_t hw)
{
    return at(g, g.N == 1 ? 0 : n, c, g.HW == 1 ? 0 : hw);
}

static __global__ void k_binary(int op, ch_geo ga, ch_geo gb, ch_geo gy, const float *a,
                                const float *b, float *y, int64_t n)
{
    GRID_STRIDE(i, n) {
        const int64_t hw = i % ga.HW, p = i / ga.HW, c = p % ga.C, m = p / ga.C;
        const float u = a[at(ga, m, c, hw)], v = b[at_b(gb, m, c, hw)];
        y[at(gy, m, c, hw)] = op == 0 ? __fadd_rn(u, v) : __fmul_rn(u, v);
    }
}

/* da = dy (add) or dy * b (mul); full db likewise with a */
static __global__ void k_binary_d(int op, ch_geo gd, ch_geo go, ch_geo gx, const float *dy,
                                  const float *other, float *dx, int64_t n)
{
    GRID_STRIDE(i, n) {
        const int64_t hw = i % gd.HW, p = i / gd.HW, c = p % gd.C, m = p / gd.C;
        const float d = dy[at(gd, m, c, hw)];
        dx[at(gx, m, c, hw)] = op == 0 ? d : __fmul_rn(d, other[at_b(go, m, c, hw)]);
    }
}

/* broadcast db: one thread per (n_b, c), the sum in n, h, w order */
static __global__ void k_binary_db(int op, ch_geo ga, ch_geo gd, ch_geo gdb, const float *a,
                                   const float *dy, float *db, int64_t nbc)
{
    GRID_STRIDE(p, nbc) {
        const int64_t c = p % ga.C, nb = p / ga.C;
        const int64_t n0 = gdb.N == 1 ? 0 : nb, n1 = gdb.N == 1 ? ga.N : nb + 1;
        float acc = 0.0f;
        for (int64_t m = n0; m < n1; m++)
            for (int64_t hw = 0; hw < ga.HW; hw++) {
                const float d = dy[at(gd, m, c, hw)];
                acc = __fadd_rn(acc, op == 0 ? d : __fmul_rn(d, a[at(ga, m, c, hw)]));
            }
        db[at(gdb, nb, c, 0)] = acc;
    }
}

static ch_status cd_binary(void *st, int op, const ch_tensor_t *a, const ch_tensor_t *b,
                           ch_tensor_t *y)
{
    CH_TRY(ch_cd_check_tensor(st, "ch_op_binary", "a", a));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_binary", "b", b));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_binary", "y", y));
    int64_t n = ch_tensor_numel(a);
    if (n == 0) return CH_OK;
    k_binary<<<ch_cuda_blocks(st, n, CH_CD_THREADS), CH_CD_THREADS, 0, ch_cuda_stream(st)>>>(
        op, geo_of(a), geo_of(b), geo_of(y), (const float *)a->data, (const float *)b->data,
        (float *)y->data, n);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

static ch_status cd_binary_backward(void *st, int op, const ch_tensor_t *a, const ch_tensor_t *b,
                                    const ch_tensor_t *dy, ch_tensor_t *da, ch_tensor_t *db)
{
    const char *name = "ch_op_binary_backward";
    CH_TRY(ch_cd_check_tensor(st, name, "a", a));
    CH_TRY(ch_cd_check_tensor(st, name, "b", b));
    CH_TRY(ch_cd_check_tensor(st, name, "dy", dy));
    if (da) CH_TRY(ch_cd_check_tensor(st, name, "da", da));
    if (db) CH_TRY(ch_cd_check_tensor(st, name, "db", db));
    const int64_t n = ch_tensor_numel(a);
    cudaStream_t cs = ch_cuda_stream(st);
    if (da && n > 0) {
        k_binary_d<<<ch_cuda_blocks(st, n, CH_CD_THREADS), CH_CD_THREADS, 0, cs>>>(
            op, geo_of(dy), geo_of(b), geo_of(da), (const float *)dy->data,
            (const float *)b->data, (float *)da->data, n);
        CH_CUDA_CHECK_LAUNCH();
    }
    if (!db) return CH_OK;
    const ch_geo ga = geo_of(a), gb = geo_of(b);
    if (gb.N == ga.N && gb.HW == ga.HW) { /* one shape */
        if (n == 0) return CH_OK;
        k_binary_d<<<ch_cuda_blocks(st, n, CH_CD_THREADS), CH_CD_THREADS, 0, cs>>>(
            op, geo_of(dy), ga, geo_of(db), (const float *)dy->data, (const float *)a->data,
            (float *)db->data, n);
        CH_CUDA_CHECK_LAUNCH();
        return CH_OK;
    }
    const int64_t nbc = gb.N * gb.C;
    if (nbc == 0) return CH_OK;
    k_binary_db<<<ch_cuda_blocks(st, nbc, CH_CD_THREADS), CH_CD_THREADS, 0, cs>>>(
        op, ga, geo_of(dy), geo_of(db), (const float *)a->data, (const float *)dy->data,
        (float *)db->data, nbc);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

static __global__ void k_copy_ch(ch_geo gs, ch_geo gd, int64_t s0, int64_t d0, int64_t nc,
                                 const float *src, float *dst, int64_t n)
{
    GRID_STRIDE(i, n) {
        const int64_t hw = i % gs.HW, p = i / gs.HW, c = p % nc, m = p / nc;
        dst[at(gd, m, d0 + c, hw)] = src[at(gs, m, s0 + c, hw)];
    }
}

static ch_status cd_copy_channels(void *st, const ch_tensor_t *src, int64_t src_c0,
                                  ch_tensor_t *dst, int64_t dst_c0, int64_t nc)
{
    CH_TRY(ch_cd_check_tensor(st, "ch_op_copy_channels", "src", src));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_copy_channels", "dst", dst));
    const ch_geo gs = geo_of(src);
    const int64_t n = gs.N * nc * gs.HW;
    if (n == 0) return CH_OK;
    k_copy_ch<<<ch_cuda_blocks(st, n, CH_CD_THREADS), CH_CD_THREADS, 0, ch_cuda_stream(st)>>>(
        gs, geo_of(dst), src_c0, dst_c0, nc, (const float *)src->data, (float *)dst->data, n);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

static __global__ void k_shuffle(ch_geo gx, ch_geo gy, int64_t groups, const float *x, float *y,
                                 int64_t n)
{
    GRID_STRIDE(i, n) {
        const int64_t hw = i % gy.HW, p = i / gy.HW, j = p % gy.C, m = p / gy.C;
        const int64_t src = (j % groups) * (gy.C / groups) + j / groups;
        y[at(gy, m, j, hw)] = x[at(gx, m, src, hw)];
    }
}

static ch_status cd_channel_shuffle(void *st, const ch_tensor_t *x, int groups, ch_tensor_t *y)
{
    CH_TRY(ch_cd_check_tensor(st, "ch_op_channel_shuffle", "x", x));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_channel_shuffle", "y", y));
    const int64_t n = ch_tensor_numel(x);
    if (n == 0) return CH_OK;
    k_shuffle<<<ch_cuda_blocks(st, n, CH_CD_THREADS), CH_CD_THREADS, 0, ch_cuda_stream(st)>>>(
        geo_of(x), geo_of(y), groups, (const float *)x->data, (float *)y->data, n);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

static __global__ void k_affine(ch_geo gx, ch_geo gy, float alpha, float beta, const float *x,
                                float *y, int64_t n)
{
    GRID_STRIDE(i, n) {
        const int64_t hw = i % gx.HW, p = i / gx.HW, c = p % gx.C, m = p / gx.C;
        y[at(gy, m, c, hw)] = __fadd_rn(__fmul_rn(alpha, x[at(gx, m, c, hw)]), beta);
    }
}

static ch_status cd_affine(void *st, const ch_tensor_t *x, float alpha, float beta, ch_tensor_t *y)
{
    CH_TRY(ch_cd_check_tensor(st, "ch_op_affine", "x", x));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_affine", "y", y));
    const int64_t n = ch_tensor_numel(x);
    if (n == 0) return CH_OK;
    k_affine<<<ch_cuda_blocks(st, n, CH_CD_THREADS), CH_CD_THREADS, 0, ch_cuda_stream(st)>>>(
        geo_of(x), geo_of(y), alpha, beta, (const float *)x->data, (float *)y->data, n);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

void ch_cuda_table_channel(ch_ops_backend_t *t)
{
    t->mul_channel = cd_mul_channel;
    t->mul_channel_backward = cd_mul_channel_backward;
    t->concat_channels = cd_concat_channels;
    t->split_channels = cd_split_channels;
    t->binary = cd_binary;
    t->binary_backward = cd_binary_backward;
    t->copy_channels = cd_copy_channels;
    t->channel_shuffle = cd_channel_shuffle;
    t->affine = cd_affine;
}
