/* cohort: CUDA backend — max pooling (ceil_mode through the output size),
 * average pooling (torch.nn.AvgPool2d), adaptive average pooling to (h, w)
 * and global average pooling, own kernels for PLAIN (NCHW) and NHWC
 * activations (cuDNN's pooling has no ceil_mode and counts the whole
 * window with count_include_pad where PyTorch clips it at H + pad).
 *
 * Max pooling follows framework/ops/cpu/kernels.c exactly (dense_plan.h
 * holds the per-element code both are checked against): forward takes the
 * max with NaN propagating; backward gives each input element the sum of dy
 * over the windows whose FIRST maximum (row-major window order) it is,
 * recomputing the argmax from x (one argmax per window into the workspace,
 * then one thread per input element gathers from the (at most ceil(k/s)^2)
 * windows covering it), so no atomics are needed and the sum runs in the
 * CPU's order (bitwise equal results).
 */
#include "config.h"

#include "framework/ops/cuda/dense_internal.h"
#include "framework/ops/pool_geometry.h"

#include <string.h>

#define GRID_STRIDE(i, n)                                                                    \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                \
         i += (int64_t)blockDim.x * gridDim.x)

static ch_cd_pool_t pool_geo(const ch_tensor_t *x, const ch_tensor_t *y,
                             const ch_pool2d_params_t *p)
{
    ch_cd_pool_t g;
    g.C = x->shape[1];
    g.H = x->shape[2];
    g.W = x->shape[3];
    g.Ho = y->shape[2];
    g.Wo = y->shape[3];
    g.kh = p->kernel_h;
    g.kw = p->kernel_w;
    g.sh = p->stride_h;
    g.sw = p->stride_w;
    g.ph = p->pad_h;
    g.pw = p->pad_w;
    g.nhwc = x->layout == CH_LAYOUT_NHWC;
    return g;
}

static __global__ void k_maxpool_fwd(const float *x, float *y, ch_cd_pool_t g, int64_t n)
{
    GRID_STRIDE(i, n)
    {
        int64_t b, c, oh, ow;
        ch_cd_idx4(g.nhwc, g.C, g.Ho, g.Wo, i, &b, &c, &oh, &ow);
        y[i] = ch_cd_maxpool_out(x, &g, b, c, oh, ow);
    }
}

static __global__ void k_maxpool_bwd(const float *x, const float *dy, float *dx, ch_cd_pool_t g,
                                     int64_t n)
{
    GRID_STRIDE(i, n)
    {
        int64_t b, c, h, w;
        ch_cd_idx4(g.nhwc, g.C, g.H, g.W, i, &b, &c, &h, &w);
        dx[i] = ch_cd_maxpool_grad(x, dy, &g, b, c, h, w);
    }
}

static ch_status cd_maxpool_forward(void *st, const ch_tensor_t *x, const ch_pool2d_params_t *p,
                                    ch_tensor_t *y)
{
    CH_TRY(ch_cd_check_tensor(st, "ch_op_maxpool2d_forward", "x", x));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_maxpool2d_forward", "y", y));
    int64_t n = ch_tensor_numel(y);
    if (n == 0) return CH_OK;
    ch_cd_pool_t g = pool_geo(x, y, p);
    k_maxpool_fwd<<<ch_cuda_blocks(st, n, CH_CD_THREADS), CH_CD_THREADS, 0, ch_cuda_stream(st)>>>(
        (const float *)x->data, (float *)y->data, g, n);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

/* pass 1 of the two-pass backward: the argmax position of every window */
static __global__ void k_maxpool_argmax(const float *x, int32_t *am, ch_cd_pool_t g, int64_t n)
{
    GRID_STRIDE(i, n)
    {
        int64_t b, c, oh, ow;
        ch_cd_idx4(g.nhwc, g.C, g.Ho, g.Wo, i, &b, &c, &oh, &ow);
        am[i] = (int32_t)ch_cd_maxpool_argmax(x, &g, b, c, oh, ow);
    }
}

/* pass 2: each input element gathers dy from the windows that chose it */
static __global__ void k_maxpool_bwd_am(const int32_t *am, const float *dy, float *dx,
                                        ch_cd_pool_t g, int64_t n)
{
    GRID_STRIDE(i, n)
    {
        int64_t b, c, h, w;
        ch_cd_idx4(g.nhwc, g.C, g.H, g.W, i, &b, &c, &h, &w);
        dx[i] = ch_cd_maxpool_grad_am(am, dy, &g, b, c, h, w);
    }
}

/* Two passes (argmax per window into the workspace, then a gather per input
 * element) when positions fit int32; otherwise one pass that recomputes the
 * argmax of every covering window. Both give the CPU backend's result. */
static ch_status cd_maxpool_backward(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                     const ch_pool2d_params_t *p, ch_tensor_t *dx)
{
    CH_TRY(ch_cd_check_tensor(st, "ch_op_maxpool2d_backward", "x", x));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_maxpool2d_backward", "dy", dy));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_maxpool2d_backward", "dx", dx));
    int64_t n = ch_tensor_numel(dx), no = ch_tensor_numel(dy);
    if (n == 0) return CH_OK;
    ch_cd_pool_t g = pool_geo(x, dy, p);
    cudaStream_t s = ch_cuda_stream(st);
    if (g.H * g.W <= INT32_MAX) {
        void *am = NULL;
        CH_TRY(ch_cuda_workspace(st, (size_t)no * sizeof(int32_t), &am));
        k_maxpool_argmax<<<ch_cuda_blocks(st, no, CH_CD_THREADS), CH_CD_THREADS, 0, s>>>(
            (const float *)x->data, (int32_t *)am, g, no);
        CH_CUDA_CHECK_LAUNCH();
        k_maxpool_bwd_am<<<ch_cuda_blocks(st, n, CH_CD_THREADS), CH_CD_THREADS, 0, s>>>(
            (const int32_t *)am, (const float *)dy->data, (float *)dx->data, g, n);
        CH_CUDA_CHECK_LAUNCH();
        return CH_OK;
    }
    k_maxpool_bwd<<<ch_cuda_blocks(st, n, CH_CD_THREADS), CH_CD_THREADS, 0, s>>>(
        (const float *)x->data, (const float *)dy->data, (float *)dx->data, g, n);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

/* ------------------------------------------------------- global avg pool */

/* PLAIN: one warp per (n,c) plane of HW contiguous values. */
static __global__ void k_gap_plain(const float *x, float *y, int64_t NC, int64_t HW)
{
    int lane = threadIdx.x & 31;
    int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int64_t nwarps = ((int64_t)blockDim.x * gridDim.x) >> 5;
    for (int64_t q = warp; q < NC; q += nwarps) {
        const float *p = x + q * HW;
        float s = 0.0f;
        for (int64_t j = lane; j < HW; j += 32) s += p[j];
        for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
        if (lane == 0) y[q] = s / (float)HW;
    }
}

/* NHWC: one thread per (n,c), reading consecutive channels (coalesced). */
static __global__ void k_gap_nhwc(const float *x, float *y, int64_t N, int64_t C, int64_t HW)
{
    GRID_STRIDE(i, N * C)
    {
        int64_t n = i / C, c = i % C;
        const float *p = x + n * HW * C + c;
        float s = 0.0f;
        for (int64_t j = 0; j < HW; j++) s += p[j * C];
        y[i] = s / (float)HW;
    }
}

/* dx[n,c,hw] = dy[n,c] * (1/HW) (same expression as the CPU backend). */
static __global__ void k_gap_bwd(const float *dy, float *dx, int64_t n, int64_t C, int64_t HW,
                                 int nhwc, float inv)
{
    GRID_STRIDE(i, n)
    {
        int64_t c = ch_cd_chan(nhwc, C, HW, i);
        int64_t b = nhwc ? i / (HW * C) : i / (C * HW);
        dx[i] = dy[b * C + c] * inv;
    }
}

/* y (N,C,1,1) in any layout and (N,C) plain are the same bytes: y[n*C + c]. */
static ch_status cd_gap_forward(void *st, const ch_tensor_t *x, ch_tensor_t *y)
{
    CH_TRY(ch_cd_check_tensor(st, "ch_op_avgpool_global_forward", "x", x));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_avgpool_global_forward", "y", y));
    int64_t N = x->shape[0], C = x->shape[1], HW = x->shape[2] * x->shape[3];
    cudaStream_t s = ch_cuda_stream(st);
    if (N * C == 0) return CH_OK;
    if (HW == 0) { /* as the CPU backend: an empty map averages to 0 */
        CH_CHECK_CUDA(cudaMemsetAsync(y->data, 0, y->nbytes, s));
        return CH_OK;
    }
    if (x->layout == CH_LAYOUT_NHWC && C > 1)
        k_gap_nhwc<<<ch_cuda_blocks(st, N * C, CH_CD_THREADS), CH_CD_THREADS, 0, s>>>(
            (const float *)x->data, (float *)y->data, N, C, HW);
    else
        k_gap_plain<<<ch_cuda_blocks(st, N * C * 32, CH_CD_THREADS), CH_CD_THREADS, 0, s>>>(
            (const float *)x->data, (float *)y->data, N * C, HW);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

static ch_status cd_gap_backward(void *st, const ch_tensor_t *dy, ch_tensor_t *dx)
{
    CH_TRY(ch_cd_check_tensor(st, "ch_op_avgpool_global_backward", "dy", dy));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_avgpool_global_backward", "dx", dx));
    int64_t C = dx->shape[1], HW = dx->shape[2] * dx->shape[3];
    int64_t n = ch_tensor_numel(dx);
    if (n == 0) return CH_OK;
    float inv = 1.0f / (float)HW;
    k_gap_bwd<<<ch_cuda_blocks(st, n, CH_CD_THREADS), CH_CD_THREADS, 0, ch_cuda_stream(st)>>>(
        (const float *)dy->data, (float *)dx->data, n, C, HW, dx->layout == CH_LAYOUT_NHWC, inv);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

/* ------------------------------------ average pooling and adaptive bins
 *
 * The geometry of framework/ops/pool_geometry.h (as the CPU backend): output o along
 * an axis averages inputs [a, b) with divisor factor d; y = sum / (dh*dw)
 * summed in row-major window order, as the CPU backend does, so forward
 * results are bitwise the CPU's. Backward: one thread per input element
 * gathers dy/divisor over the windows (bins) containing it in (oh, ow)
 * order, the CPU's accumulation order; no atomics. */

typedef struct {
    ch_avg_geo_t a; /* ranges and divisors (pool_geometry.h) */
    int64_t C;
    int nhwc;
} cd_avg_t;

/* Outputs along one axis whose range may contain input i: [*lo, *hi]
 * (candidates; the caller checks containment). */
static __device__ inline void cd_avg_cover(const ch_avg_geo_t *g, int axis, int64_t i, int64_t *lo,
                                           int64_t *hi)
{
    int64_t n = axis ? g->W : g->H, no = axis ? g->Wo : g->Ho;
    if (g->adaptive) {
        *lo = (i * no) / n - 1;
        *hi = ((i + 1) * no + n - 1) / n;
    } else {
        int64_t k = axis ? g->kw : g->kh, s = axis ? g->sw : g->sh, p = axis ? g->pw : g->ph;
        int64_t a = i + p - k + 1;
        *lo = a <= 0 ? 0 : (a + s - 1) / s;
        *hi = (i + p) / s;
    }
    if (*lo < 0) *lo = 0;
    if (*hi > no - 1) *hi = no - 1;
}

static __global__ void k_avgpool_fwd(const float *x, float *y, cd_avg_t g, int64_t n)
{
    GRID_STRIDE(i, n)
    {
        int64_t b, c, oh, ow, h0, h1, dh, w0, w1, dw;
        ch_cd_idx4(g.nhwc, g.C, g.a.Ho, g.a.Wo, i, &b, &c, &oh, &ow);
        ch_avg_range(&g.a, 0, oh, &h0, &h1, &dh);
        ch_avg_range(&g.a, 1, ow, &w0, &w1, &dw);
        float s = 0.0f;
        for (int64_t h = h0; h < h1; h++)
            for (int64_t w = w0; w < w1; w++)
                s += x[ch_cd_off4(g.nhwc, g.C, g.a.H, g.a.W, b, c, h, w)];
        int64_t div = dh * dw;
        y[i] = div > 0 && h1 > h0 && w1 > w0 ? s / (float)div : 0.0f;
    }
}

static __global__ void k_avgpool_bwd(const float *dy, float *dx, cd_avg_t g, int64_t n)
{
    GRID_STRIDE(i, n)
    {
        int64_t b, c, h, w, olo, ohi, wlo, whi;
        ch_cd_idx4(g.nhwc, g.C, g.a.H, g.a.W, i, &b, &c, &h, &w);
        cd_avg_cover(&g.a, 0, h, &olo, &ohi);
        cd_avg_cover(&g.a, 1, w, &wlo, &whi);
        float s = 0.0f;
        for (int64_t oh = olo; oh <= ohi; oh++) {
            int64_t h0, h1, dh;
            ch_avg_range(&g.a, 0, oh, &h0, &h1, &dh);
            if (h < h0 || h >= h1) continue;
            for (int64_t ow = wlo; ow <= whi; ow++) {
                int64_t w0, w1, dw;
                ch_avg_range(&g.a, 1, ow, &w0, &w1, &dw);
                if (w < w0 || w >= w1 || dh * dw <= 0) continue;
                s += dy[ch_cd_off4(g.nhwc, g.C, g.a.Ho, g.a.Wo, b, c, oh, ow)] / (float)(dh * dw);
            }
        }
        dx[i] = s;
    }
}

static cd_avg_t avg_geo(const ch_tensor_t *x, const ch_tensor_t *y, const ch_pool2d_params_t *p)
{
    cd_avg_t g;
    memset(&g, 0, sizeof g);
    g.a = ch_avg_geo_of(x, y, p);
    g.C = x->shape[1];
    g.nhwc = x->layout == CH_LAYOUT_NHWC;
    return g;
}

/* Forward (in = x, out = y) or backward (in = dy, out = dx): one thread
 * per element of out. p NULL: adaptive bins. */
static ch_status cd_avg_run(void *st, const char *op, int backward, const ch_tensor_t *in,
                            const ch_pool2d_params_t *p, ch_tensor_t *out)
{
    CH_TRY(ch_cd_check_tensor(st, op, backward ? "dy" : "x", in));
    CH_TRY(ch_cd_check_tensor(st, op, backward ? "dx" : "y", out));
    int64_t n = ch_tensor_numel(out);
    if (n == 0) return CH_OK;
    cd_avg_t g = backward ? avg_geo(out, in, p) : avg_geo(in, out, p);
    int nb = ch_cuda_blocks(st, n, CH_CD_THREADS);
    cudaStream_t s = ch_cuda_stream(st);
    if (backward)
        k_avgpool_bwd<<<nb, CH_CD_THREADS, 0, s>>>((const float *)in->data, (float *)out->data, g,
                                                   n);
    else
        k_avgpool_fwd<<<nb, CH_CD_THREADS, 0, s>>>((const float *)in->data, (float *)out->data, g,
                                                   n);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

static ch_status cd_avgpool_forward(void *st, const ch_tensor_t *x, const ch_pool2d_params_t *p,
                                    ch_tensor_t *y)
{
    return cd_avg_run(st, "ch_op_avgpool2d_forward", 0, x, p, y);
}

static ch_status cd_avgpool_backward(void *st, const ch_tensor_t *dy,
                                     const ch_pool2d_params_t *p, ch_tensor_t *dx)
{
    return cd_avg_run(st, "ch_op_avgpool2d_backward", 1, dy, p, dx);
}

static ch_status cd_adaptive_forward(void *st, const ch_tensor_t *x, ch_tensor_t *y)
{
    return cd_avg_run(st, "ch_op_adaptive_avgpool2d_forward", 0, x, NULL, y);
}

static ch_status cd_adaptive_backward(void *st, const ch_tensor_t *dy, ch_tensor_t *dx)
{
    return cd_avg_run(st, "ch_op_adaptive_avgpool2d_backward", 1, dy, NULL, dx);
}

void ch_cuda_table_pool(ch_ops_backend_t *t)
{
    t->avgpool_forward = cd_avgpool_forward;
    t->avgpool_backward = cd_avgpool_backward;
    t->adaptive_avgpool_forward = cd_adaptive_forward;
    t->adaptive_avgpool_backward = cd_adaptive_backward;
    t->maxpool_forward = cd_maxpool_forward;
    t->maxpool_backward = cd_maxpool_backward;
    t->avgpool_global_forward = cd_gap_forward;
    t->avgpool_global_backward = cd_gap_backward;
}
