/* cohort: CUDA backend — activations (ops.h ch_op_act_*) and ConvNeXt's
 * LayerNorm2d (ch_op_layernorm2d_*), own kernels for PLAIN (NCHW) and NHWC
 * activations.
 *
 * Activations: one thread per element, the formulas of
 * framework/ops/act_math.h (the CPU's C loops; CUDA's expf / tanhf / erff
 * are within 2 ulp of libm's, so results agree with the CPU to a few ulp,
 * the breakpoints exactly).
 *
 * LayerNorm2d: forward and dx one thread per position (n, h, w), summing
 * the C channels in double in channel order as the CPU does; dweight and
 * dbias one block per channel, each thread summing a strided set of
 * positions in double, then a fixed shared-memory tree: no atomics, the
 * same result on every run.
 */
#include "config.h"

#include "framework/ops/act_math.h"
#include "framework/ops/cuda/dense_internal.h"

#define GRID_STRIDE(i, n)                                                                    \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                \
         i += (int64_t)blockDim.x * gridDim.x)

/* ------------------------------------------------------------ activations */

static __global__ void k_act_fwd(ch_act_params_t p, const float *x, float *y, int64_t n)
{
    GRID_STRIDE(i, n) y[i] = ch_act_fwd1(&p, x[i]);
}

static __global__ void k_act_bwd(ch_act_params_t p, const float *x, const float *dy, float *dx,
                                 int64_t n)
{
    GRID_STRIDE(i, n) dx[i] = ch_act_bwd1(&p, x[i], dy[i]);
}

static ch_status cd_act_forward(void *st, const ch_act_params_t *p, const ch_tensor_t *x,
                                ch_tensor_t *y)
{
    CH_TRY(ch_cd_check_tensor(st, "ch_op_act_forward", "x", x));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_act_forward", "y", y));
    int64_t n = ch_tensor_numel(x);
    if (n == 0) return CH_OK;
    k_act_fwd<<<ch_cuda_blocks(st, n, CH_CD_THREADS), CH_CD_THREADS, 0, ch_cuda_stream(st)>>>(
        *p, (const float *)x->data, (float *)y->data, n);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

static ch_status cd_act_backward(void *st, const ch_act_params_t *p, const ch_tensor_t *x,
                                 const ch_tensor_t *dy, ch_tensor_t *dx)
{
    CH_TRY(ch_cd_check_tensor(st, "ch_op_act_backward", "x", x));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_act_backward", "dy", dy));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_act_backward", "dx", dx));
    int64_t n = ch_tensor_numel(x);
    if (n == 0) return CH_OK;
    k_act_bwd<<<ch_cuda_blocks(st, n, CH_CD_THREADS), CH_CD_THREADS, 0, ch_cuda_stream(st)>>>(
        *p, (const float *)x->data, (const float *)dy->data, (float *)dx->data, n);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

/* ------------------------------------------------------------ layer norm */

/* element (n, c, hw) of an (N, C, HW) activation, PLAIN or NHWC */
struct ln_geo {
    int64_t C, HW, P;
    int nhwc;
};

static __device__ __forceinline__ int64_t ln_at(const ln_geo &g, int64_t p, int64_t c)
{
    const int64_t n = p / g.HW, hw = p % g.HW;
    return g.nhwc ? (n * g.HW + hw) * g.C + c : (n * g.C + c) * g.HW + hw;
}

static __global__ void k_ln_fwd(ln_geo g, const float *x, const float *w, const float *b,
                                float eps, float *y, float *mean, float *rstd)
{
    GRID_STRIDE(p, g.P)
    {
        double s = 0.0;
        for (int64_t c = 0; c < g.C; c++) s += x[ln_at(g, p, c)];
        const double mu = s / (double)g.C;
        double q = 0.0;
        for (int64_t c = 0; c < g.C; c++) {
            double d = x[ln_at(g, p, c)] - mu;
            q += d * d;
        }
        const float mf = (float)mu, rf = (float)(1.0 / sqrt(q / (double)g.C + (double)eps));
        mean[p] = mf;
        rstd[p] = rf;
        for (int64_t c = 0; c < g.C; c++) {
            const int64_t o = ln_at(g, p, c);
            float h = (x[o] - mf) * rf;
            y[o] = h * (w ? w[c] : 1.0f) + (b ? b[c] : 0.0f);
        }
    }
}

static __global__ void k_ln_bwd_dx(ln_geo g, const float *x, const float *dy, const float *mean,
                                   const float *rstd, const float *w, float *dx)
{
    GRID_STRIDE(p, g.P)
    {
        const float mf = mean[p], rf = rstd[p];
        double sg = 0.0, sgh = 0.0;
        for (int64_t c = 0; c < g.C; c++) {
            const int64_t o = ln_at(g, p, c);
            const double gg = (double)dy[o] * (w ? w[c] : 1.0f);
            sg += gg;
            sgh += gg * (double)((x[o] - mf) * rf);
        }
        const double a = sg / (double)g.C, bb = sgh / (double)g.C;
        for (int64_t c = 0; c < g.C; c++) {
            const int64_t o = ln_at(g, p, c);
            const double gg = (double)dy[o] * (w ? w[c] : 1.0f);
            const double h = (double)((x[o] - mf) * rf);
            dx[o] = (float)((double)rf * (gg - a - h * bb));
        }
    }
}

#define LN_RED_THREADS 256

/* block c: dweight[c] = sum_p dy * xhat, dbias[c] = sum_p dy */
static __global__ void k_ln_bwd_params(ln_geo g, const float *x, const float *dy,
                                       const float *mean, const float *rstd, float *dw, float *db)
{
    __shared__ double sw[LN_RED_THREADS], sb[LN_RED_THREADS];
    for (int64_t c = blockIdx.x; c < g.C; c += gridDim.x) {
        double aw = 0.0, ab = 0.0;
        for (int64_t p = threadIdx.x; p < g.P; p += LN_RED_THREADS) {
            const int64_t o = ln_at(g, p, c);
            const float h = (x[o] - mean[p]) * rstd[p];
            aw += (double)dy[o] * (double)h;
            ab += dy[o];
        }
        sw[threadIdx.x] = aw;
        sb[threadIdx.x] = ab;
        __syncthreads();
        for (int s = LN_RED_THREADS / 2; s > 0; s >>= 1) {
            if ((int)threadIdx.x < s) {
                sw[threadIdx.x] += sw[threadIdx.x + s];
                sb[threadIdx.x] += sb[threadIdx.x + s];
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            if (dw) dw[c] = (float)sw[0];
            if (db) db[c] = (float)sb[0];
        }
        __syncthreads();
    }
}

static ln_geo ln_geo_of(const ch_tensor_t *x)
{
    ln_geo g;
    int64_t N;
    ch_cd_nchw(x, &N, &g.C, &g.HW);
    g.P = N * g.HW;
    g.nhwc = x->layout == CH_LAYOUT_NHWC;
    return g;
}

static const float *fp(const ch_tensor_t *t) { return t ? (const float *)t->data : NULL; }

static ch_status cd_ln2d_forward(void *st, const ch_tensor_t *x, const ch_tensor_t *weight,
                                 const ch_tensor_t *bias, float eps, ch_tensor_t *y,
                                 ch_tensor_t *mean, ch_tensor_t *rstd)
{
    CH_TRY(ch_cd_check_tensor(st, "ch_op_layernorm2d_forward", "x", x));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_layernorm2d_forward", "y", y));
    ln_geo g = ln_geo_of(x);
    if (g.P == 0 || g.C == 0) return CH_OK;
    k_ln_fwd<<<ch_cuda_blocks(st, g.P, CH_CD_THREADS), CH_CD_THREADS, 0, ch_cuda_stream(st)>>>(
        g, (const float *)x->data, fp(weight), fp(bias), eps, (float *)y->data,
        (float *)mean->data, (float *)rstd->data);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

static ch_status cd_ln2d_backward(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                  const ch_tensor_t *mean, const ch_tensor_t *rstd,
                                  const ch_tensor_t *weight, ch_tensor_t *dx, ch_tensor_t *dweight,
                                  ch_tensor_t *dbias)
{
    CH_TRY(ch_cd_check_tensor(st, "ch_op_layernorm2d_backward", "x", x));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_layernorm2d_backward", "dy", dy));
    if (dx) CH_TRY(ch_cd_check_tensor(st, "ch_op_layernorm2d_backward", "dx", dx));
    ln_geo g = ln_geo_of(x);
    cudaStream_t s = ch_cuda_stream(st);
    /* parameter gradients first: dx may alias dy */
    if ((dweight || dbias) && g.C > 0) {
        unsigned blocks = (unsigned)(g.C < 65535 ? g.C : 65535);
        k_ln_bwd_params<<<blocks, LN_RED_THREADS, 0, s>>>(
            g, (const float *)x->data, (const float *)dy->data, (const float *)mean->data,
            (const float *)rstd->data, dweight ? (float *)dweight->data : NULL,
            dbias ? (float *)dbias->data : NULL);
        CH_CUDA_CHECK_LAUNCH();
    }
    if (!dx || g.P == 0 || g.C == 0) return CH_OK;
    k_ln_bwd_dx<<<ch_cuda_blocks(st, g.P, CH_CD_THREADS), CH_CD_THREADS, 0, s>>>(
        g, (const float *)x->data, (const float *)dy->data, (const float *)mean->data,
        (const float *)rstd->data, fp(weight), (float *)dx->data);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

void ch_cuda_table_eltwise(ch_ops_backend_t *t)
{
    t->act_forward = cd_act_forward;
    t->act_backward = cd_act_backward;
    t->ln2d_forward = cd_ln2d_forward;
    t->ln2d_backward = cd_ln2d_backward;
}
