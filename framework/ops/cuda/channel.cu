/* cohort: CUDA backend — channel ops (ops.h ch_op_mul_channel*,
 * ch_op_concat_channels, ch_op_split_channels) for PLAIN (NCHW) and NHWC
 * activations: squeeze-excitation's per-(n, c) scale and the channel
 * concat of Inception-style branches.
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

void ch_cuda_table_channel(ch_ops_backend_t *t)
{
    t->mul_channel = cd_mul_channel;
    t->mul_channel_backward = cd_mul_channel_backward;
    t->concat_channels = cd_concat_channels;
    t->split_channels = cd_split_channels;
}
