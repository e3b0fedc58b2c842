/* cohort: CUDA backend — data motion (reorder, fill, copy, async uploads),
 * elementwise ops (ReLU, add, scale) and the conversion / reduction kernels
 * the other dense files share (dense_internal.h). Convolution is in conv.cu,
 * linear layers in linear.cu, pooling in pool.cu.
 *
 * Layouts on the GPU: PLAIN (NCHW) and NHWC; blocked layouts are rejected
 * with CH_ERR_UNSUPPORTED. All kernels are grid-stride loops with 64-bit
 * indices on the compute stream. Host synchronization happens only where a
 * host buffer is involved (reorders to / from host memory, wait_upload) or a
 * buffer grows.
 */
#include "config.h"

#include "framework/ops/cuda/dense_internal.h"
#include "framework/ops/cuda/order_plan.h"

#include <cuda_bf16.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ checks */

ch_status ch_cd_check_tensor(void *st, const char *op, const char *arg, const ch_tensor_t *t)
{
    if (t->layout != CH_LAYOUT_PLAIN && t->layout != CH_LAYOUT_NHWC) {
        char d[128];
        return CH_ERROR(CH_ERR_UNSUPPORTED,
                        "%s: %s %s is in layout %s; GPU ops take plain (NCHW) or nhwc "
                        "activations (reorder blocked CPU tensors to plain first)",
                        op, arg, ch_tensor_describe(t, d, sizeof d), ch_layout_name(t->layout));
    }
    if (t->dev == CH_DEV_CUDA && t->dev_index != ch_cuda_device(st)) {
        char d[128];
        return CH_ERROR(CH_ERR_INVALID,
                        "%s: %s %s is on GPU %d but the compute context runs on GPU %d",
                        op, arg, ch_tensor_describe(t, d, sizeof d), t->dev_index,
                        ch_cuda_device(st));
    }
    return CH_OK;
}

/* -------------------------------------------------------- element access */

static __device__ __forceinline__ float cd_ld(const float *p, int64_t i) { return p[i]; }
static __device__ __forceinline__ float cd_ld(const __nv_bfloat16 *p, int64_t i)
{
    return __bfloat162float(p[i]);
}
static __device__ __forceinline__ void cd_st(float *p, int64_t i, float v) { p[i] = v; }
static __device__ __forceinline__ void cd_st(__nv_bfloat16 *p, int64_t i, float v)
{
    p[i] = __float2bfloat16_rn(v);
}

#define GRID_STRIDE(i, n)                                                                    \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                \
         i += (int64_t)blockDim.x * gridDim.x)

template <typename Ti, typename To>
static __global__ void k_cast(const Ti *in, To *out, int64_t n)
{
    GRID_STRIDE(i, n) cd_st(out, i, cd_ld(in, i));
}

/* Batched transpose in[b][r][s] -> out[b][s][r] through 32x32 shared tiles
 * (coalesced reads and writes), converting the element type on the way.
 * Block (32, 8); grid-stride over tiles (the loop bound is uniform per
 * block, so the barriers are safe). */
template <typename Ti, typename To>
static __global__ void k_transpose(const Ti *in, To *out, int64_t B, int64_t R, int64_t S)
{
    __shared__ float tile[32][33];
    int64_t tr = (R + 31) / 32, ts = (S + 31) / 32, per = tr * ts;
    int64_t total = B * per;
    int tx = threadIdx.x, ty = threadIdx.y;
    for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
        int64_t b = t / per, rem = t % per;
        int64_t r0 = (rem / ts) * 32, s0 = (rem % ts) * 32;
        const Ti *ib = in + b * R * S;
        To *ob = out + b * R * S;
        for (int j = ty; j < 32; j += 8) {
            int64_t r = r0 + j, s = s0 + tx;
            if (r < R && s < S) tile[j][tx] = cd_ld(ib, r * S + s);
        }
        __syncthreads();
        for (int j = ty; j < 32; j += 8) {
            int64_t s = s0 + j, r = r0 + tx;
            if (r < R && s < S) cd_st(ob, s * R + r, tile[tx][j]);
        }
        __syncthreads();
    }
}

/* The same transpose element by element, indexed by the output: for a
 * narrow side (< 8, e.g. 3-channel images) tiles would leave most threads
 * idle, while here consecutive threads still read from a few contiguous
 * streams. */
template <typename Ti, typename To>
static __global__ void k_transpose_narrow(const Ti *in, To *out, int64_t B, int64_t R, int64_t S)
{
    GRID_STRIDE(i, B * R * S) cd_st(out, i, cd_ld(in, ch_cd_transpose_src(i, R, S)));
}

template <typename Ti, typename To>
static ch_status launch_convert(void *st, const Ti *in, To *out, int relayout, ch_layout_t sl,
                                int64_t N, int64_t C, int64_t HW)
{
    cudaStream_t s = ch_cuda_stream(st);
    int64_t n = N * C * HW;
    if (!relayout) {
        k_cast<Ti, To><<<ch_cuda_blocks(st, n, CH_CD_THREADS), CH_CD_THREADS, 0, s>>>(in, out, n);
        CH_CUDA_CHECK_LAUNCH();
        return CH_OK;
    }
    /* PLAIN [N][C][HW] -> NHWC [N][HW][C], or back */
    int64_t R, S;
    ch_cd_transpose_dims(sl, C, HW, &R, &S);
    if (R < 8 || S < 8) {
        k_transpose_narrow<Ti, To><<<ch_cuda_blocks(st, n, CH_CD_THREADS), CH_CD_THREADS, 0, s>>>(
            in, out, N, R, S);
        CH_CUDA_CHECK_LAUNCH();
        return CH_OK;
    }
    int64_t tiles = N * ((R + 31) / 32) * ((S + 31) / 32);
    dim3 blk(32, 8);
    k_transpose<Ti, To><<<ch_cuda_blocks(st, tiles, 1), blk, 0, s>>>(in, out, N, R, S);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

ch_status ch_cd_convert(void *st, const void *src, ch_cd_type stt, ch_layout_t sl, void *dst,
                        ch_cd_type dtt, ch_layout_t dl, int64_t N, int64_t C, int64_t HW)
{
    int64_t n = N * C * HW;
    if (n == 0) return CH_OK;
    if ((sl != CH_LAYOUT_PLAIN && sl != CH_LAYOUT_NHWC) ||
        (dl != CH_LAYOUT_PLAIN && dl != CH_LAYOUT_NHWC))
        return CH_ERROR(CH_ERR_UNSUPPORTED, "GPU layout conversion %s -> %s is not supported",
                        ch_layout_name(sl), ch_layout_name(dl));
    /* one channel or one pixel per image: both layouts are the same bytes */
    int relayout = sl != dl && C > 1 && HW > 1;
    if (!relayout && stt == dtt) {
        if (src != dst)
            CH_CHECK_CUDA(cudaMemcpyAsync(dst, src, (size_t)n * ch_cd_type_size(stt),
                                          cudaMemcpyDeviceToDevice, ch_cuda_stream(st)));
        return CH_OK;
    }
    if (stt == CH_CD_F32 && dtt == CH_CD_F32)
        return launch_convert(st, (const float *)src, (float *)dst, relayout, sl, N, C, HW);
    if (stt == CH_CD_F32 && dtt == CH_CD_BF16)
        return launch_convert(st, (const float *)src, (__nv_bfloat16 *)dst, relayout, sl, N, C,
                              HW);
    if (stt == CH_CD_BF16 && dtt == CH_CD_F32)
        return launch_convert(st, (const __nv_bfloat16 *)src, (float *)dst, relayout, sl, N, C,
                              HW);
    return launch_convert(st, (const __nv_bfloat16 *)src, (__nv_bfloat16 *)dst, relayout, sl, N,
                          C, HW);
}

/* ---------------------------------------------------------- bias, sums */

static __global__ void k_bias_add(float *y, const float *b, int64_t n, int64_t C, int64_t HW,
                                  int nhwc)
{
    GRID_STRIDE(i, n) y[i] += b[ch_cd_chan(nhwc, C, HW, i)];
}

ch_status ch_cd_bias_add(void *st, float *y, const float *b, ch_layout_t l, int64_t N, int64_t C,
                         int64_t HW)
{
    int64_t n = N * C * HW;
    if (n == 0) return CH_OK;
    k_bias_add<<<ch_cuda_blocks(st, n, CH_CD_THREADS), CH_CD_THREADS, 0, ch_cuda_stream(st)>>>(
        y, b, n, C, HW, l == CH_LAYOUT_NHWC);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

/* Two shapes of per-channel sums:
 *  column mode (NHWC, or HW == 1): a row-major matrix [R = N*HW][C]; P row
 *    slices, each summed by 32x8-thread blocks over 32 columns;
 *  plane mode (PLAIN with HW > 1): [N][C][HW]; P image slices, a block per
 *    (channel, slice) summing whole HW planes.
 * Both leave partial[p*C + c]; a last kernel adds the P partials in double. */
typedef struct {
    int column;
    int64_t P;
} chansum_plan;

static chansum_plan chansum_plan_of(int64_t N, int64_t C, int64_t HW, ch_layout_t l)
{
    chansum_plan p;
    (void)C;
    p.column = l == CH_LAYOUT_NHWC || HW == 1;
    if (p.column) {
        int64_t R = N * HW;
        p.P = (R + 511) / 512; /* about 64 rows per thread */
        if (p.P > 4096) p.P = 4096;
    } else {
        p.P = (N * HW + 8191) / 8192; /* about 8K values per block */
        if (p.P > N) p.P = N;
    }
    if (p.P < 1) p.P = 1;
    return p;
}

size_t ch_cd_chansum_scratch(void *st, int64_t N, int64_t C, int64_t HW, ch_layout_t l)
{
    (void)st;
    chansum_plan p = chansum_plan_of(N, C, HW, l);
    return (size_t)(p.P * C) * sizeof(float);
}

static __global__ void k_colsum(const float *x, int64_t R, int64_t C, int64_t P, float *partial)
{
    __shared__ float sh[8][33];
    int tx = threadIdx.x, ty = threadIdx.y;
    int64_t tiles = (C + 31) / 32, total = tiles * P;
    for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
        int64_t c = (t % tiles) * 32 + tx, p = t / tiles;
        float acc = 0.0f;
        if (c < C)
            for (int64_t r = p * 8 + ty; r < R; r += P * 8) acc += x[r * C + c];
        sh[ty][tx] = acc;
        __syncthreads();
        if (ty == 0 && c < C) {
            float s = 0.0f;
            for (int j = 0; j < 8; j++) s += sh[j][tx];
            partial[p * C + c] = s;
        }
        __syncthreads();
    }
}

static __global__ void k_planesum(const float *x, int64_t N, int64_t C, int64_t HW, int64_t P,
                                  float *partial)
{
    __shared__ float sh[CH_CD_THREADS];
    int tid = threadIdx.x;
    for (int64_t t = blockIdx.x; t < C * P; t += gridDim.x) {
        int64_t c = t % C, p = t / C;
        float acc = 0.0f;
        for (int64_t n = p; n < N; n += P) {
            const float *base = x + (n * C + c) * HW;
            for (int64_t j = tid; j < HW; j += CH_CD_THREADS) acc += base[j];
        }
        sh[tid] = acc;
        __syncthreads();
        for (int w = CH_CD_THREADS / 2; w > 0; w >>= 1) {
            if (tid < w) sh[tid] += sh[tid + w];
            __syncthreads();
        }
        if (tid == 0) partial[p * C + c] = sh[0];
        __syncthreads();
    }
}

static __global__ void k_partials(const float *partial, int64_t P, int64_t C, float *out)
{
    GRID_STRIDE(c, C)
    {
        double s = 0.0;
        for (int64_t p = 0; p < P; p++) s += partial[p * C + c];
        out[c] = (float)s;
    }
}

ch_status ch_cd_chansum(void *st, const float *x, ch_layout_t l, int64_t N, int64_t C, int64_t HW,
                        float *out, void *partial)
{
    cudaStream_t s = ch_cuda_stream(st);
    if (C == 0) return CH_OK;
    if (N * HW == 0) {
        CH_CHECK_CUDA(cudaMemsetAsync(out, 0, (size_t)C * sizeof(float), s));
        return CH_OK;
    }
    chansum_plan p = chansum_plan_of(N, C, HW, l);
    float *part = (float *)partial;
    if (p.column) {
        int64_t blocks = ((C + 31) / 32) * p.P;
        k_colsum<<<ch_cuda_blocks(st, blocks, 1), dim3(32, 8), 0, s>>>(x, N * HW, C, p.P, part);
    } else {
        k_planesum<<<ch_cuda_blocks(st, C * p.P, 1), CH_CD_THREADS, 0, s>>>(x, N, C, HW, p.P,
                                                                               part);
    }
    CH_CUDA_CHECK_LAUNCH();
    k_partials<<<ch_cuda_blocks(st, C, CH_CD_THREADS), CH_CD_THREADS, 0, s>>>(part, p.P, C, out);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

/* ------------------------------------------------------------ elementwise */

/* float4 paths when every pointer is 16-byte aligned (cudaMalloc'd tensors
 * and arena carvings are); the tail and unaligned views go scalar. */
static inline int al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static __global__ void k_fill(float *o, int64_t n, float v)
{
    GRID_STRIDE(i, n) o[i] = v;
}

/* y = x < 0 ? 0 : x keeps NaN and -0 (torch.relu, CPU kernels.c) */
static __device__ __forceinline__ float cd_relu(float x) { return x < 0.0f ? 0.0f : x; }
/* threshold_backward(dy, y, 0) */
static __device__ __forceinline__ float cd_relu_bwd(float y, float d)
{
    return y <= 0.0f ? 0.0f : d;
}

static __global__ void k_relu(const float *x, float *y, int64_t n, int vec)
{
    if (vec) {
        int64_t n4 = n / 4;
        GRID_STRIDE(i, n4)
        {
            float4 v = ((const float4 *)x)[i];
            v.x = cd_relu(v.x);
            v.y = cd_relu(v.y);
            v.z = cd_relu(v.z);
            v.w = cd_relu(v.w);
            ((float4 *)y)[i] = v;
        }
        GRID_STRIDE(j, n - n4 * 4) y[n4 * 4 + j] = cd_relu(x[n4 * 4 + j]);
        return;
    }
    GRID_STRIDE(i, n) y[i] = cd_relu(x[i]);
}

static __global__ void k_relu_bwd(const float *y, const float *dy, float *dx, int64_t n, int vec)
{
    if (vec) {
        int64_t n4 = n / 4;
        GRID_STRIDE(i, n4)
        {
            float4 a = ((const float4 *)y)[i], d = ((const float4 *)dy)[i];
            d.x = cd_relu_bwd(a.x, d.x);
            d.y = cd_relu_bwd(a.y, d.y);
            d.z = cd_relu_bwd(a.z, d.z);
            d.w = cd_relu_bwd(a.w, d.w);
            ((float4 *)dx)[i] = d;
        }
        GRID_STRIDE(j, n - n4 * 4)
        {
            int64_t k = n4 * 4 + j;
            dx[k] = cd_relu_bwd(y[k], dy[k]);
        }
        return;
    }
    GRID_STRIDE(i, n) dx[i] = cd_relu_bwd(y[i], dy[i]);
}

static __global__ void k_add(const float *a, const float *b, float *o, int64_t n, int vec)
{
    if (vec) {
        int64_t n4 = n / 4;
        GRID_STRIDE(i, n4)
        {
            float4 u = ((const float4 *)a)[i], v = ((const float4 *)b)[i];
            u.x += v.x;
            u.y += v.y;
            u.z += v.z;
            u.w += v.w;
            ((float4 *)o)[i] = u;
        }
        GRID_STRIDE(j, n - n4 * 4)
        {
            int64_t k = n4 * 4 + j;
            o[k] = a[k] + b[k];
        }
        return;
    }
    GRID_STRIDE(i, n) o[i] = a[i] + b[i];
}

static __global__ void k_scale(float *t, int64_t n, float s)
{
    GRID_STRIDE(i, n) t[i] *= s;
}

#define VEC_BLOCKS(st, n, vec) ch_cuda_blocks((st), (vec) ? ((n) + 3) / 4 : (n), CH_CD_THREADS)

static ch_status cd_fill(void *st, ch_tensor_t *t, float value)
{
    CH_TRY(ch_cd_check_tensor(st, "ch_op_fill", "t", t));
    if (!t->nbytes) return CH_OK;
    cudaStream_t s = ch_cuda_stream(st);
    if (value == 0.0f && !signbit(value)) {
        CH_CHECK_CUDA(cudaMemsetAsync(t->data, 0, t->nbytes, s));
        return CH_OK;
    }
    if (t->dtype != CH_F32)
        return CH_ERROR(CH_ERR_INVALID, "ch_op_fill: %s tensor can only be zero-filled",
                        ch_dtype_name(t->dtype));
    int64_t n = ch_tensor_numel(t);
    k_fill<<<ch_cuda_blocks(st, n, CH_CD_THREADS), CH_CD_THREADS, 0, s>>>((float *)t->data, n,
                                                                          value);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

static ch_status cd_copy(void *st, const ch_tensor_t *src, ch_tensor_t *dst)
{
    CH_TRY(ch_cd_check_tensor(st, "ch_op_copy", "src", src));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_copy", "dst", dst));
    if (src->nbytes && src->data != dst->data)
        CH_CHECK_CUDA(cudaMemcpyAsync(dst->data, src->data, src->nbytes, cudaMemcpyDeviceToDevice,
                                      ch_cuda_stream(st)));
    return CH_OK;
}

static ch_status cd_relu_forward(void *st, const ch_tensor_t *x, ch_tensor_t *y)
{
    CH_TRY(ch_cd_check_tensor(st, "ch_op_relu_forward", "x", x));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_relu_forward", "y", y));
    int64_t n = ch_tensor_numel(x);
    if (n == 0) return CH_OK;
    int vec = al16(x->data) && al16(y->data);
    k_relu<<<VEC_BLOCKS(st, n, vec), CH_CD_THREADS, 0, ch_cuda_stream(st)>>>(
        (const float *)x->data, (float *)y->data, n, vec);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

static ch_status cd_relu_backward(void *st, const ch_tensor_t *y, const ch_tensor_t *dy,
                                  ch_tensor_t *dx)
{
    CH_TRY(ch_cd_check_tensor(st, "ch_op_relu_backward", "y", y));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_relu_backward", "dy", dy));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_relu_backward", "dx", dx));
    int64_t n = ch_tensor_numel(y);
    if (n == 0) return CH_OK;
    int vec = al16(y->data) && al16(dy->data) && al16(dx->data);
    k_relu_bwd<<<VEC_BLOCKS(st, n, vec), CH_CD_THREADS, 0, ch_cuda_stream(st)>>>(
        (const float *)y->data, (const float *)dy->data, (float *)dx->data, n, vec);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

static ch_status cd_add(void *st, const ch_tensor_t *a, const ch_tensor_t *b, ch_tensor_t *out)
{
    CH_TRY(ch_cd_check_tensor(st, "ch_op_add", "a", a));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_add", "b", b));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_add", "out", out));
    int64_t n = ch_tensor_numel(a);
    if (n == 0) return CH_OK;
    int vec = al16(a->data) && al16(b->data) && al16(out->data);
    k_add<<<VEC_BLOCKS(st, n, vec), CH_CD_THREADS, 0, ch_cuda_stream(st)>>>(
        (const float *)a->data, (const float *)b->data, (float *)out->data, n, vec);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

static ch_status cd_scale(void *st, ch_tensor_t *t, float alpha)
{
    CH_TRY(ch_cd_check_tensor(st, "ch_op_scale", "t", t));
    int64_t n = ch_tensor_numel(t);
    if (n == 0) return CH_OK;
    k_scale<<<ch_cuda_blocks(st, n, CH_CD_THREADS), CH_CD_THREADS, 0, ch_cuda_stream(st)>>>(
        (float *)t->data, n, alpha);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

/* ---------------------------------------------------------------- reorder */

/* Checks shared by reorder and upload: both tensors usable here; a layout
 * change (*relayout = 1) only for float32 (int64 labels have one layout). */
static ch_status check_copy(void *st, const char *op, const ch_tensor_t *src,
                            const ch_tensor_t *dst, int *relayout)
{
    CH_TRY(ch_cd_check_tensor(st, op, "src", src));
    CH_TRY(ch_cd_check_tensor(st, op, "dst", dst));
    *relayout = src->layout != dst->layout;
    if (*relayout && src->dtype != CH_F32)
        return CH_ERROR(CH_ERR_INVALID, "%s: layouts of %s tensors are fixed", op,
                        ch_dtype_name(src->dtype));
    return CH_OK;
}

/* dst = src in dst's layout. Device <-> device: a copy or one layout kernel,
 * queued. Host <-> device: the copy (through a device temporary in the
 * workspace when the layout changes: host -> temp -> layout kernel -> dst,
 * or src -> layout kernel -> temp -> host) and then the host waits for the
 * compute stream, since the caller may reuse (host src) or read (host dst)
 * its buffer as soon as the call returns. Overlapped uploads are
 * ch_op_upload_async's business. */
static ch_status cd_reorder(void *st, const ch_tensor_t *src, ch_tensor_t *dst)
{
    const char *op = "ch_op_reorder";
    int relayout = 0;
    CH_TRY(check_copy(st, op, src, dst, &relayout));
    size_t bytes = src->nbytes;
    if (bytes == 0) return CH_OK;
    int64_t N, C, HW;
    ch_cd_nchw(src, &N, &C, &HW);
    cudaStream_t s = ch_cuda_stream(st);
    if (src->dev == CH_DEV_CUDA && dst->dev == CH_DEV_CUDA) {
        if (!relayout) {
            if (src->data != dst->data)
                CH_CHECK_CUDA(cudaMemcpyAsync(dst->data, src->data, bytes,
                                              cudaMemcpyDeviceToDevice, s));
            return CH_OK;
        }
        return ch_cd_convert(st, src->data, CH_CD_F32, src->layout, dst->data, CH_CD_F32,
                             dst->layout, N, C, HW);
    }
    void *tmp = NULL;
    if (relayout) CH_TRY(ch_cuda_workspace(st, bytes, &tmp));
    if (src->dev == CH_DEV_CPU) { /* host -> device */
        if (!relayout) {
            CH_CHECK_CUDA(cudaMemcpyAsync(dst->data, src->data, bytes, cudaMemcpyHostToDevice, s));
        } else {
            CH_CHECK_CUDA(cudaMemcpyAsync(tmp, src->data, bytes, cudaMemcpyHostToDevice, s));
            CH_TRY(ch_cd_convert(st, tmp, CH_CD_F32, src->layout, dst->data, CH_CD_F32,
                                 dst->layout, N, C, HW));
        }
    } else { /* device -> host */
        if (!relayout) {
            CH_CHECK_CUDA(cudaMemcpyAsync(dst->data, src->data, bytes, cudaMemcpyDeviceToHost, s));
        } else {
            CH_TRY(ch_cd_convert(st, src->data, CH_CD_F32, src->layout, tmp, CH_CD_F32,
                                 dst->layout, N, C, HW));
            CH_CHECK_CUDA(cudaMemcpyAsync(dst->data, tmp, bytes, cudaMemcpyDeviceToHost, s));
        }
    }
    CH_CHECK_CUDA(cudaStreamSynchronize(s));
    return CH_OK;
}

/* ------------------------------------------------------------ async upload */

/* Uploads (ch_op_upload_async) go on the copy stream; `copied` is recorded
 * after each one, so it marks the last. An upload whose layout changes lands
 * in a staging buffer owned here (it must outlive the op: the layout kernel
 * runs on the compute stream only at wait_upload); staging buffer i serves
 * the i-th layout-changing upload between two waits, and `freed[i]`, recorded
 * on the compute stream after its layout kernel, keeps the next upload into
 * it from overwriting data that kernel has not read yet. An upload in the
 * same layout writes its destination (a batch slot) directly: `track`
 * (order_plan.h) tells which of `dst_freed` (recorded on the compute stream
 * at the wait_upload after the one that handed the slot to the compute
 * stream, i.e. after the last step that read it) the copy stream waits on,
 * or whether it waits for everything the compute stream queued
 * (`compute_now`, a first upload or a slot reused without a wait). */
#define UP_MAX 8

typedef struct {
    cudaEvent_t copied;
    int pending; /* uploads queued since the last wait */
    int nstage;  /* layout-changing uploads among them */
    ch_tensor_t dst[UP_MAX];
    ch_layout_t src_layout[UP_MAX];
    void *stage[UP_MAX];
    size_t stage_bytes[UP_MAX];
    cudaEvent_t freed[UP_MAX];
    int freed_recorded[UP_MAX];
    ch_gp_upload_tracker_t track;
    cudaEvent_t dst_freed[CH_GP_UPLOAD_TRACK];
    cudaEvent_t compute_now;
} upload_slot;

static void upload_slot_destroy(void *st, void *p)
{
    upload_slot *u = (upload_slot *)p;
    if (!u) return;
    (void)cudaStreamSynchronize(ch_cuda_copy_stream(st));
    for (int i = 0; i < UP_MAX; i++) {
        if (u->stage[i]) (void)cudaFree(u->stage[i]);
        if (u->freed[i]) (void)cudaEventDestroy(u->freed[i]);
    }
    for (int i = 0; i < CH_GP_UPLOAD_TRACK; i++)
        if (u->dst_freed[i]) (void)cudaEventDestroy(u->dst_freed[i]);
    if (u->compute_now) (void)cudaEventDestroy(u->compute_now);
    if (u->copied) (void)cudaEventDestroy(u->copied);
    free(u);
}

static const ch_cuda_slot_ops_t upload_slot_ops = {upload_slot_destroy, NULL};

static ch_status upload_slot_get(void *st, upload_slot **out)
{
    upload_slot *u = (upload_slot *)ch_cuda_slot(st, CH_CUDA_SLOT_DENSE);
    if (!u) {
        u = (upload_slot *)calloc(1, sizeof *u);
        if (!u) return CH_ERROR(CH_ERR_NOMEM, "ch_op_upload_async: out of memory");
        /* register the slot only once its events exist: a half-built slot
         * would be found by the next call and record / wait on NULL events */
        cudaError_t e = cudaEventCreateWithFlags(&u->copied, cudaEventDisableTiming);
        for (int i = 0; e == cudaSuccess && i < UP_MAX; i++)
            e = cudaEventCreateWithFlags(&u->freed[i], cudaEventDisableTiming);
        for (int i = 0; e == cudaSuccess && i < CH_GP_UPLOAD_TRACK; i++)
            e = cudaEventCreateWithFlags(&u->dst_freed[i], cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&u->compute_now, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            upload_slot_destroy(st, u);
            return CH_ERROR(CH_ERR_CUDA, "ch_op_upload_async: cudaEventCreateWithFlags failed: %s",
                            cudaGetErrorString(e));
        }
        ch_cuda_slot_set(st, CH_CUDA_SLOT_DENSE, u, &upload_slot_ops);
    }
    *out = u;
    return CH_OK;
}

static ch_status cd_upload_async(void *st, const ch_tensor_t *src, ch_tensor_t *dst)
{
    const char *op = "ch_op_upload_async";
    int relayout = 0;
    CH_TRY(check_copy(st, op, src, dst, &relayout));
    size_t bytes = src->nbytes;
    if (bytes == 0) return CH_OK;
    upload_slot *u = NULL;
    CH_TRY(upload_slot_get(st, &u));
    cudaStream_t cs = ch_cuda_copy_stream(st);
    if (!relayout) {
        /* the compute stream's last reads of this slot come first */
        int k = -1;
        ch_gp_upload_wait w = ch_gp_upload_before(&u->track, dst->data, bytes, &k);
        if (w == CH_GP_WAIT_FREED) {
            CH_CHECK_CUDA(cudaStreamWaitEvent(cs, u->dst_freed[k], 0));
        } else if (w == CH_GP_WAIT_COMPUTE) {
            CH_CHECK_CUDA(cudaEventRecord(u->compute_now, ch_cuda_stream(st)));
            CH_CHECK_CUDA(cudaStreamWaitEvent(cs, u->compute_now, 0));
        }
        CH_CHECK_CUDA(cudaMemcpyAsync(dst->data, src->data, bytes, cudaMemcpyHostToDevice, cs));
    } else {
        int i = u->nstage;
        if (i >= UP_MAX)
            return CH_ERROR(CH_ERR_RANGE,
                            "%s: more than %d layout-changing uploads queued before "
                            "ch_compute_wait_upload", op, UP_MAX);
        if (u->stage_bytes[i] < bytes) {
            /* the last layout kernel that read this buffer must be done */
            if (u->freed_recorded[i]) CH_CHECK_CUDA(cudaEventSynchronize(u->freed[i]));
            if (u->stage[i]) CH_CHECK_CUDA(cudaFree(u->stage[i]));
            u->stage[i] = NULL;
            u->stage_bytes[i] = 0;
            cudaError_t e = cudaMalloc(&u->stage[i], bytes);
            if (e != cudaSuccess) {
                (void)cudaGetLastError();
                u->stage[i] = NULL;
                return CH_ERROR(CH_ERR_NOMEM, "%s: cannot allocate a %zu-byte staging buffer "
                                "on GPU %d: %s", op, bytes, ch_cuda_device(st),
                                cudaGetErrorString(e));
            }
            u->stage_bytes[i] = bytes;
        } else if (u->freed_recorded[i]) {
            CH_CHECK_CUDA(cudaStreamWaitEvent(cs, u->freed[i], 0));
        }
        CH_CHECK_CUDA(cudaMemcpyAsync(u->stage[i], src->data, bytes, cudaMemcpyHostToDevice, cs));
        u->dst[i] = *dst;
        u->src_layout[i] = src->layout;
        u->nstage++;
    }
    CH_CHECK_CUDA(cudaEventRecord(u->copied, cs));
    u->pending = 1;
    return CH_OK;
}

static ch_status cd_wait_upload(void *st)
{
    upload_slot *u = (upload_slot *)ch_cuda_slot(st, CH_CUDA_SLOT_DENSE);
    if (!u || !u->pending) return CH_OK;
    int n = u->nstage;
    u->pending = 0;
    u->nstage = 0;
    cudaStream_t s = ch_cuda_stream(st);
    /* what the compute stream queued so far ends the reads of the slots the
     * previous wait handed over: their freed events go here */
    int rec[CH_GP_UPLOAD_TRACK];
    int nrec = ch_gp_upload_at_wait(&u->track, rec);
    for (int i = 0; i < nrec; i++) CH_CHECK_CUDA(cudaEventRecord(u->dst_freed[rec[i]], s));
    CH_CHECK_CUDA(cudaStreamWaitEvent(s, u->copied, 0));
    for (int i = 0; i < n; i++) {
        const ch_tensor_t *d = &u->dst[i];
        int64_t N, C, HW;
        ch_cd_nchw(d, &N, &C, &HW);
        CH_TRY(ch_cd_convert(st, u->stage[i], CH_CD_F32, u->src_layout[i], d->data, CH_CD_F32,
                             d->layout, N, C, HW));
        CH_CHECK_CUDA(cudaEventRecord(u->freed[i], s));
        u->freed_recorded[i] = 1;
    }
    /* the host buffers the uploads read may be reused from here on */
    CH_CHECK_CUDA(cudaEventSynchronize(u->copied));
    return CH_OK;
}

/* ------------------------------------------------------------------ table */

void ch_cuda_table_dense(ch_ops_backend_t *t)
{
    t->reorder = cd_reorder;
    t->fill = cd_fill;
    t->copy = cd_copy;
    t->relu_forward = cd_relu_forward;
    t->relu_backward = cd_relu_backward;
    t->add = cd_add;
    t->scale = cd_scale;
    t->upload_async = cd_upload_async;
    t->wait_upload = cd_wait_upload;
    ch_cuda_table_conv(t);
    ch_cuda_table_linear(t);
    ch_cuda_table_pool(t);
    ch_cuda_table_eltwise(t);
    ch_cuda_table_channel(t);
    ch_cuda_table_dropout(t);
}
