/* cohort: CUDA batch norm and SyncBN pieces (own kernels; issue #7).
 *
 * Same numerics as the CPU op (framework/ops/cpu/batchnorm.c, PyTorch 1.13
 * batch_norm_cpu_*): statistics are two-pass (mean first, then the sum of
 * squared deviations from the float mean), per-channel totals in double,
 * invstd = 1/sqrt(var + eps) in double, the elementwise passes use float
 * per-channel coefficients computed in double exactly as the CPU op does.
 *
 * Per-channel reductions over the N*H*W values of a channel run in two
 * stages with no floating-point atomics, so every result is run-to-run
 * deterministic on a given device:
 *   1. partial sums: channel-first (NCHW) — one block per (channel, slice of
 *      the channel's N*HW values), 256 threads, double accumulators, warp
 *      shuffles then one warp combine in a fixed order; channel-last (NHWC,
 *      and 2-D (N,C)) — 32x8 tiles: 32 consecutive channels (one coalesced
 *      128-byte row segment per warp) by 8 row lanes, over a slice of the
 *      N*H*W rows, combined in shared memory in a fixed order.
 *      The slice count depends only on the shape and the GPU's SM count
 *      (chk_reduce_slices in kernel_index.h).
 *   2. one thread per channel adds its slices' partials in slice order
 *      (double) and finishes (mean, var, sums, gradients, coefficients).
 * Elementwise passes are grid-stride loops with a division-free channel
 * tracker (chk_chan_* in kernel_index.h); all indices are 64-bit.
 *
 * cuDNN's batch norm is not used: ops.c composes forward_train from
 * stats + apply (no single backend entry to map onto
 * cudnnBatchNormalizationForwardTraining), and keeping per-rank BN on the
 * same kernels as SyncBN keeps the two bit-identical (DESIGN.md: "CPU and
 * GPU paths that compute batch norm differently" is a weak spot to avoid).
 */
#include "config.h"

#include "framework/ops/cuda/kernels.h"

#include "framework/ops/cuda/kernel_index.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

namespace {

constexpr int RED_THREADS = 256;         /* channel-first reduction block */
constexpr int CL_TX = 32, CL_TY = 8;     /* channel-last reduction tile */
constexpr int EW_THREADS = 256;          /* elementwise kernels */
constexpr int VEC_THREADS = 256;         /* per-channel finishing kernels */
constexpr int64_t CF_MIN_WORK = 4096;    /* values per channel-first slice, at least */
constexpr int64_t CL_MIN_ROWS = 256;     /* rows per channel-last slice, at least */
constexpr int64_t MAX_SLICES = 1024;

/* Activation view: N, C, HW and whether channels are innermost. */
struct bn_view {
    int64_t N, C, HW;
    int chlast; /* NHWC, or HW == 1 (2-D (N,C) or 1x1 maps: same offsets) */
    int64_t numel() const { return N * C * HW; }
    int64_t count() const { return N * HW; }
};

ch_status view_of(const char *op, const char *arg, const ch_tensor_t *t, bn_view *v)
{
    if (t->ndim == 4 && t->layout != CH_LAYOUT_PLAIN && t->layout != CH_LAYOUT_NHWC)
        return CH_ERROR(CH_ERR_UNSUPPORTED,
                        "%s (cuda): %s is in layout %s; the GPU backend takes plain (NCHW) "
                        "or nhwc activations",
                        op, arg, ch_layout_name(t->layout));
    v->N = t->shape[0];
    v->C = t->ndim >= 2 ? t->shape[1] : 1;
    v->HW = t->ndim == 4 ? t->shape[2] * t->shape[3] : 1;
    v->chlast = (t->ndim == 4 && t->layout == CH_LAYOUT_NHWC) || v->HW == 1;
    return CH_OK;
}

const float *fp(const ch_tensor_t *t) { return t ? (const float *)t->data : nullptr; }
float *fpw(ch_tensor_t *t) { return t ? (float *)t->data : nullptr; }

/* ------------------------------------------------------- stage-1 functors
 * chan(c) gives the per-channel constant (the mean) once per block pass;
 * acc(off, m, a) adds element off's contribution to the K accumulators. */
struct f_sum {
    static constexpr int K = 1;
    const float *x;
    __device__ float chan(int64_t) const { return 0.0f; }
    __device__ void acc(int64_t off, float, double *a) const { a[0] += (double)x[off]; }
};

struct f_sqdev {
    static constexpr int K = 1;
    const float *x, *m;
    __device__ float chan(int64_t c) const { return m[c]; }
    __device__ void acc(int64_t off, float mc, double *a) const
    {
        float d = x[off] - mc;
        a[0] += (double)(d * d);
    }
};

struct f_bwd {
    static constexpr int K = 2;
    const float *x, *dy, *m;
    __device__ float chan(int64_t c) const { return m[c]; }
    __device__ void acc(int64_t off, float mc, double *a) const
    {
        float g = dy[off];
        a[0] += (double)g;
        a[1] += (double)(g * (x[off] - mc));
    }
};

/* Sum K doubles over the block (blockDim.x == RED_THREADS) in a fixed
 * order; the result is valid in thread 0. */
template <int K>
__device__ void block_sum(double *a)
{
    __shared__ double sh[K][RED_THREADS / 32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
    for (int k = 0; k < K; k++)
        for (int o = 16; o > 0; o >>= 1) a[k] += __shfl_down_sync(0xffffffffu, a[k], o);
    if (lane == 0)
#pragma unroll
        for (int k = 0; k < K; k++) sh[k][wid] = a[k];
    __syncthreads();
    if (wid == 0) {
#pragma unroll
        for (int k = 0; k < K; k++) {
            a[k] = lane < RED_THREADS / 32 ? sh[k][lane] : 0.0;
            for (int o = 16; o > 0; o >>= 1) a[k] += __shfl_down_sync(0xffffffffu, a[k], o);
        }
    }
    __syncthreads(); /* sh is reused by the next block pass */
}

/* Channel-first partials: part[k*S*C + s*C + c] = sum over values
 * [j0, j1) of channel c (slice s of S). Blocks loop over the C*S pairs. */
template <class F>
__global__ void __launch_bounds__(RED_THREADS)
    k_reduce_cf(F f, int64_t C, int64_t HW, int64_t count, int64_t S, double *part)
{
    const chk_plane_step_t ps = chk_plane_step(HW, C, RED_THREADS);
    for (int64_t b = blockIdx.x; b < C * S; b += gridDim.x) {
        const int64_t c = b / S, s = b % S;
        int64_t j0, j1;
        chk_split(count, S, s, &j0, &j1);
        double a[F::K];
#pragma unroll
        for (int k = 0; k < F::K; k++) a[k] = 0.0;
        const float mc = f.chan(c);
        int64_t j = j0 + threadIdx.x;
        if (j < j1) {
            chk_plane_t t = chk_plane_at(&ps, c, j);
            for (; j < j1; j += RED_THREADS) {
                f.acc(t.off, mc, a);
                chk_plane_next(&ps, &t);
            }
        }
        block_sum<F::K>(a);
        if (threadIdx.x == 0)
#pragma unroll
            for (int k = 0; k < F::K; k++) part[(k * S + s) * C + c] = a[k];
    }
}

/* Channel-last partials over rows [r0, r1) of slice s: tiles of 32
 * channels x 8 row lanes; blocks loop over the G*S (channel group, slice)
 * pairs, G = ceil(C/32). */
template <class F>
__global__ void __launch_bounds__(CL_TX *CL_TY)
    k_reduce_cl(F f, int64_t C, int64_t R, int64_t S, double *part)
{
    __shared__ double sh[F::K][CL_TY][CL_TX];
    const int64_t G = (C + CL_TX - 1) / CL_TX;
    const int tx = threadIdx.x, ty = threadIdx.y;
    for (int64_t b = blockIdx.x; b < G * S; b += gridDim.x) {
        const int64_t g = b % G, s = b / G, c = g * CL_TX + tx;
        int64_t r0, r1;
        chk_split(R, S, s, &r0, &r1);
        double a[F::K];
#pragma unroll
        for (int k = 0; k < F::K; k++) a[k] = 0.0;
        if (c < C) {
            const float mc = f.chan(c);
            for (int64_t r = r0 + ty; r < r1; r += CL_TY) f.acc(r * C + c, mc, a);
        }
#pragma unroll
        for (int k = 0; k < F::K; k++) sh[k][ty][tx] = a[k];
        __syncthreads();
        if (ty == 0 && c < C) {
#pragma unroll
            for (int k = 0; k < F::K; k++) {
                double t = 0.0;
                for (int y = 0; y < CL_TY; y++) t += sh[k][y][tx];
                part[(k * S + s) * C + c] = t;
            }
        }
        __syncthreads();
    }
}

/* Launch plan of one per-channel reduction. */
struct red_plan {
    int64_t S;       /* slices per channel (group) */
    unsigned blocks; /* grid size */
};

red_plan plan_reduce(void *st, const bn_view &v)
{
    red_plan p;
    const int64_t sms = ch_cuda_sm_count(st) > 0 ? ch_cuda_sm_count(st) : 1;
    const int64_t target = 8 * sms; /* 8 resident 256-thread blocks per SM */
    int64_t pairs;
    if (v.chlast) {
        const int64_t G = (v.C + CL_TX - 1) / CL_TX;
        p.S = chk_reduce_slices(G, v.count(), target, CL_MIN_ROWS, MAX_SLICES);
        pairs = G * p.S;
    } else {
        p.S = chk_reduce_slices(v.C, v.count(), target, CF_MIN_WORK, MAX_SLICES);
        pairs = v.C * p.S;
    }
    const int64_t cap = 64 * sms;
    p.blocks = (unsigned)(pairs < cap ? (pairs > 0 ? pairs : 1) : cap);
    return p;
}

/* Queue stage 1 for functor f: partials of K sums into part (K*S*C doubles). */
template <class F>
ch_status launch_reduce(void *st, const bn_view &v, const red_plan &p, F f, double *part)
{
    cudaStream_t s = ch_cuda_stream(st);
    if (v.chlast) {
        k_reduce_cl<F><<<p.blocks, dim3(CL_TX, CL_TY), 0, s>>>(f, v.C, v.count(), p.S, part);
    } else {
        k_reduce_cf<F><<<p.blocks, RED_THREADS, 0, s>>>(f, v.C, v.HW, v.count(), p.S, part);
    }
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

/* --------------------------------------------------------- stage-2 kernels */

/* sum of the S partials of channel c, sum k, in slice order */
__device__ double part_total(const double *part, int64_t k, int64_t S, int64_t C, int64_t c)
{
    double t = 0.0;
    for (int64_t s = 0; s < S; s++) t += part[(k * S + s) * C + c];
    return t;
}

/* out[c] = (float)(total / count) (mean, then biased var) */
__global__ void k_fin_div(const double *part, int64_t S, int64_t C, double count, float *out)
{
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C;
         c += (int64_t)gridDim.x * blockDim.x)
        out[c] = (float)(part_total(part, 0, S, C, c) / count);
}

/* invstd as the CPU op: 1 / sqrt((double)var + (double)eps) */
__device__ double invstd_of(float var, float eps)
{
    return 1.0 / sqrt((double)var + (double)eps);
}

/* dx = dy*a - (x-mean)*k + b coefficients from the (double) sums:
 * a = invstd*w, k = invstd^2*s2/total*a, b = -s1/total*a (batchnorm.c
 * elemt_coeffs). */
__device__ void elemt_coeff(int64_t c, const float *M, const float *VA, float eps, const float *W,
                            double s1, double s2, double total, float *A, float *Kc, float *B)
{
    (void)M;
    const double invstd = invstd_of(VA[c], eps);
    const double aa = invstd * (W ? (double)W[c] : 1.0);
    const double kk = invstd * invstd * s2 / total * aa;
    A[c] = (float)aa;
    Kc[c] = (float)kk;
    B[c] = (float)(-s1 / total * aa);
}

/* Finish the backward reduction: s1 = sum dy, s2 = sum dy*(x-mean).
 * Each output may be NULL: sum_dy/sum_dy_xmu (float sums), dweight =
 * s2*invstd, dbias = s1, and the elementwise coefficients A/Kc/B for
 * total (bn_backward). */
__global__ void k_fin_bwd(const double *part, int64_t S, int64_t C, float *sum_dy,
                          float *sum_dy_xmu, const float *VA, float eps, float *dweight,
                          float *dbias, const float *M, const float *W, double total, float *A,
                          float *Kc, float *B)
{
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C;
         c += (int64_t)gridDim.x * blockDim.x) {
        const double s1 = part_total(part, 0, S, C, c), s2 = part_total(part, 1, S, C, c);
        if (sum_dy) sum_dy[c] = (float)s1;
        if (sum_dy_xmu) sum_dy_xmu[c] = (float)s2;
        if (dweight) dweight[c] = (float)(s2 * invstd_of(VA[c], eps));
        if (dbias) dbias[c] = (float)s1;
        if (A) elemt_coeff(c, M, VA, eps, W, s1, s2, total, A, Kc, B);
    }
}

/* coefficients of the elementwise backward from float sums (SyncBN) */
__global__ void k_elemt_coeffs(int64_t C, const float *M, const float *VA, float eps,
                               const float *W, const float *S1, const float *S2, double total,
                               float *A, float *Kc, float *B)
{
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C;
         c += (int64_t)gridDim.x * blockDim.x)
        elemt_coeff(c, M, VA, eps, W, (double)S1[c], (double)S2[c], total, A, Kc, B);
}

/* apply coefficients (batchnorm.c ch_cpu_bn_apply): invstd rounded to
 * float, a = invstd*w, b = bias - mean*a, in float without contraction. */
__global__ void k_apply_coeffs(int64_t C, const float *M, const float *VA, const float *W,
                               const float *Bi, float eps, float *A, float *B)
{
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C;
         c += (int64_t)gridDim.x * blockDim.x) {
        const float invstd = (float)invstd_of(VA[c], eps);
        const float a = __fmul_rn(invstd, W ? W[c] : 1.0f);
        A[c] = a;
        B[c] = __fsub_rn(Bi ? Bi[c] : 0.0f, __fmul_rn(M[c], a));
    }
}

/* ------------------------------------------------------ elementwise kernels */

/* y = x*A[c] + B[c]; y may alias x (each element read before written). */
__global__ void k_apply(const float *x, float *y, const float *A, const float *B, int64_t n,
                        int64_t inner, int64_t C)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const chk_chan_step_t cs = chk_chan_step(inner, C, stride);
    chk_chan_t t = chk_chan_at(&cs, i);
    for (; i < n; i += stride) {
        y[i] = x[i] * A[t.c] + B[t.c];
        chk_chan_next(&cs, &t);
    }
}

/* dx = dy*A[c] - (x - mean[c])*Kc[c] + B[c]; dx may alias dy. */
__global__ void k_elemt(const float *x, const float *dy, float *dx, const float *M,
                        const float *A, const float *Kc, const float *B, int64_t n,
                        int64_t inner, int64_t C)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const chk_chan_step_t cs = chk_chan_step(inner, C, stride);
    chk_chan_t t = chk_chan_at(&cs, i);
    for (; i < n; i += stride) {
        const int64_t c = t.c;
        dx[i] = dy[i] * A[c] - (x[i] - M[c]) * Kc[c] + B[c];
        chk_chan_next(&cs, &t);
    }
}

/* float4 versions: quad q = elements 4q..4q+3. Channel-first with HW % 4
 * == 0: a quad lies in one channel (tracker over quads with inner HW/4,
 * C channels). Channel-last with C % 4 == 0: a quad holds channels
 * 4g..4g+3 (tracker with inner 1 over C/4 channel groups; the coefficient
 * vectors are read as float4). Needs every pointer 16-byte aligned. */
__device__ float4 coef4(const float *P, int64_t c, int chlast)
{
    if (chlast) return reinterpret_cast<const float4 *>(P)[c];
    const float v = P[c];
    return make_float4(v, v, v, v);
}

__global__ void k_apply4(const float4 *x, float4 *y, const float *A, const float *B, int64_t n4,
                         int64_t inner4, int64_t C4, int chlast)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    const chk_chan_step_t cs = chk_chan_step(inner4, C4, stride);
    chk_chan_t t = chk_chan_at(&cs, i);
    for (; i < n4; i += stride) {
        const float4 v = x[i], a = coef4(A, t.c, chlast), b = coef4(B, t.c, chlast);
        y[i] = make_float4(v.x * a.x + b.x, v.y * a.y + b.y, v.z * a.z + b.z, v.w * a.w + b.w);
        chk_chan_next(&cs, &t);
    }
}

__global__ void k_elemt4(const float4 *x, const float4 *dy, float4 *dx, const float *M,
                         const float *A, const float *Kc, const float *B, int64_t n4,
                         int64_t inner4, int64_t C4, int chlast)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    const chk_chan_step_t cs = chk_chan_step(inner4, C4, stride);
    chk_chan_t t = chk_chan_at(&cs, i);
    for (; i < n4; i += stride) {
        const float4 v = x[i], g = dy[i];
        const float4 m = coef4(M, t.c, chlast), a = coef4(A, t.c, chlast),
                     k = coef4(Kc, t.c, chlast), b = coef4(B, t.c, chlast);
        dx[i] = make_float4(g.x * a.x - (v.x - m.x) * k.x + b.x, g.y * a.y - (v.y - m.y) * k.y + b.y,
                            g.z * a.z - (v.z - m.z) * k.z + b.z, g.w * a.w - (v.w - m.w) * k.w + b.w);
        chk_chan_next(&cs, &t);
    }
}

/* running stats (batchnorm.c ch_cpu_bn_update_running), float arithmetic
 * without contraction so the GPU matches the CPU bit for bit */
__global__ void k_update_running(int64_t C, float *RM, float *RV, const float *M,
                                 const float *VA, double corr, float mom, float om)
{
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C;
         c += (int64_t)gridDim.x * blockDim.x) {
        RM[c] = __fadd_rn(__fmul_rn(mom, M[c]), __fmul_rn(om, RM[c]));
        const float uv = (float)__dmul_rn((double)VA[c], corr);
        RV[c] = __fadd_rn(__fmul_rn(mom, uv), __fmul_rn(om, RV[c]));
    }
}

/* Per-rank counts passed by value, as a kernel argument (copied at launch:
 * no staging buffer and no host wait), for up to BN_COUNTS_BY_VALUE ranks:
 * 2 KiB of the 4 KiB of kernel parameters every CUDA version allows. */
constexpr int BN_COUNTS_BY_VALUE = 256;
struct bn_counts_v {
    int64_t c[BN_COUNTS_BY_VALUE];
    __device__ int64_t operator[](int r) const { return c[r]; }
};
static_assert(sizeof(bn_counts_v) + 64 <= 4096, "kernel parameters over 4 KiB");

/* Chan et al.'s pairwise combine in double, ranks in order (batchnorm.c
 * ch_cpu_bn_gather_stats); counts a device array or a bn_counts_v. */
template <typename Counts>
__global__ void k_gather_stats(int64_t C, int R, const float *MS, const float *VS,
                               Counts counts, float *M, float *VA)
{
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C;
         c += (int64_t)gridDim.x * blockDim.x) {
        double n = 0.0, mu = 0.0, m2 = 0.0;
        for (int r = 0; r < R; r++) {
            if (counts[r] <= 0) continue;
            const double nr = (double)counts[r], mr = MS[(int64_t)r * C + c];
            const double vr = VS[(int64_t)r * C + c];
            const double tot = __dadd_rn(n, nr), delta = __dsub_rn(mr, mu);
            mu = __dadd_rn(mu, __ddiv_rn(__dmul_rn(delta, nr), tot));
            const double t2 =
                __ddiv_rn(__dmul_rn(__dmul_rn(__dmul_rn(delta, delta), n), nr), tot);
            m2 = __dadd_rn(m2, __dadd_rn(__dmul_rn(vr, nr), t2));
            n = tot;
        }
        M[c] = (float)mu;
        VA[c] = (float)__ddiv_rn(m2, n);
    }
}

unsigned vec_blocks(void *st, int64_t C) { return ch_cuda_blocks(st, C, VEC_THREADS); }

/* ------------------------------------------------------------ cache slot
 * gather_stats over more than BN_COUNTS_BY_VALUE ranks needs the host
 * counts on the device: a ring of BN_RING device copies, re-uploaded only
 * when the counts change (the resolution or the last batch), each through
 * its own page-locked staging buffer. A change takes the next ring entry
 * and waits only for that entry's previous copy, BN_RING changes ago (done
 * long since), not for the one just queued; a kernel still reading an old
 * device copy is ordered before the new copy into it on the same stream. */
constexpr int BN_RING = 4;
struct bn_slot {
    int64_t *dcounts[BN_RING]; /* device */
    int64_t *pinned[BN_RING];  /* page-locked staging */
    cudaEvent_t copied[BN_RING]; /* recorded after each staging copy */
    int copy_pending[BN_RING];
    int cur;                   /* ring entry holding `last` */
    int64_t *last;             /* host copy of what dcounts[cur] holds */
    int cap, nlast;
};

void bn_slot_destroy(void *st, void *p)
{
    (void)st;
    bn_slot *s = (bn_slot *)p;
    if (!s) return;
    for (int i = 0; i < BN_RING; i++) {
        if (s->dcounts[i]) cudaFree(s->dcounts[i]);
        if (s->pinned[i]) cudaFreeHost(s->pinned[i]);
        if (s->copied[i]) cudaEventDestroy(s->copied[i]);
    }
    free(s->last);
    free(s);
}

size_t bn_slot_entries(void *p)
{
    const bn_slot *s = (const bn_slot *)p;
    return s && s->dcounts[0] ? 1 : 0;
}

const ch_cuda_slot_ops_t bn_slot_ops = {bn_slot_destroy, bn_slot_entries};

ch_status bn_counts_on_device(void *st, const int64_t *counts, int R, const int64_t **dev)
{
    bn_slot *s = (bn_slot *)ch_cuda_slot(st, CH_CUDA_SLOT_BN);
    if (!s) {
        s = (bn_slot *)calloc(1, sizeof *s);
        if (!s) return CH_ERROR(CH_ERR_NOMEM, "batch norm (cuda): out of host memory");
        cudaError_t e = cudaSuccess;
        for (int i = 0; i < BN_RING && e == cudaSuccess; i++)
            e = cudaEventCreateWithFlags(&s->copied[i], cudaEventDisableTiming);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            bn_slot_destroy(st, s);
            return CH_ERROR(CH_ERR_CUDA, "batch norm (cuda): cudaEventCreateWithFlags failed: %s",
                            cudaGetErrorString(e));
        }
        ch_cuda_slot_set(st, CH_CUDA_SLOT_BN, s, &bn_slot_ops);
    }
    cudaStream_t stream = ch_cuda_stream(st);
    if (R > s->cap) {
        /* queued gather kernels may still read the old device copy */
        CH_CHECK_CUDA(cudaStreamSynchronize(stream));
        int cap = R < 64 ? 64 : R;
        for (int i = 0; i < BN_RING; i++) {
            if (s->dcounts[i]) cudaFree(s->dcounts[i]);
            if (s->pinned[i]) cudaFreeHost(s->pinned[i]);
            s->dcounts[i] = nullptr;
            s->pinned[i] = nullptr;
            s->copy_pending[i] = 0;
        }
        free(s->last);
        s->cap = 0;
        s->nlast = 0;
        s->last = (int64_t *)malloc((size_t)cap * sizeof(int64_t));
        if (!s->last) return CH_ERROR(CH_ERR_NOMEM, "batch norm (cuda): out of host memory");
        for (int i = 0; i < BN_RING; i++) {
            CH_CHECK_CUDA(cudaMalloc((void **)&s->dcounts[i], (size_t)cap * sizeof(int64_t)));
            CH_CHECK_CUDA(cudaMallocHost((void **)&s->pinned[i], (size_t)cap * sizeof(int64_t)));
        }
        s->cap = cap;
    }
    if (s->nlast != R || memcmp(s->last, counts, (size_t)R * sizeof(int64_t)) != 0) {
        const int k = (s->cur + 1) % BN_RING;
        /* the copy out of this staging buffer BN_RING changes ago */
        if (s->copy_pending[k]) CH_CHECK_CUDA(cudaEventSynchronize(s->copied[k]));
        memcpy(s->pinned[k], counts, (size_t)R * sizeof(int64_t));
        CH_CHECK_CUDA(cudaMemcpyAsync(s->dcounts[k], s->pinned[k], (size_t)R * sizeof(int64_t),
                                      cudaMemcpyHostToDevice, stream));
        CH_CHECK_CUDA(cudaEventRecord(s->copied[k], stream));
        s->copy_pending[k] = 1;
        s->cur = k;
        memcpy(s->last, counts, (size_t)R * sizeof(int64_t));
        s->nlast = R;
    }
    *dev = s->dcounts[s->cur];
    return CH_OK;
}

/* Workspace carving: doubles first (8-byte aligned), then floats. */
ch_status workspace(void *st, size_t ndouble, size_t nfloat, double **d, float **f)
{
    void *p = nullptr;
    CH_TRY(ch_cuda_workspace(st, ndouble * sizeof(double) + nfloat * sizeof(float), &p));
    *d = (double *)p;
    *f = (float *)((char *)p + ndouble * sizeof(double));
    return CH_OK;
}

unsigned ew_blocks(void *st, int64_t n) { return ch_cuda_blocks(st, n, EW_THREADS); }

int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Quad geometry for the float4 kernels, or 0 when they do not apply. */
int quads(const bn_view &v, int64_t *inner4, int64_t *C4)
{
    if (v.chlast && v.C % 4 == 0) {
        *inner4 = 1;
        *C4 = v.C / 4;
        return 1;
    }
    if (!v.chlast && v.HW % 4 == 0) {
        *inner4 = v.HW / 4;
        *C4 = v.C;
        return 1;
    }
    return 0;
}

ch_status launch_apply(void *st, const bn_view &v, const float *x, float *y, const float *A,
                       const float *B)
{
    cudaStream_t s = ch_cuda_stream(st);
    int64_t inner4, C4;
    if (quads(v, &inner4, &C4) && aligned16(x) && aligned16(y) && aligned16(A) && aligned16(B)) {
        const int64_t n4 = v.numel() / 4;
        k_apply4<<<ew_blocks(st, n4), EW_THREADS, 0, s>>>((const float4 *)x, (float4 *)y, A, B,
                                                          n4, inner4, C4, v.chlast);
    } else {
        k_apply<<<ew_blocks(st, v.numel()), EW_THREADS, 0, s>>>(x, y, A, B, v.numel(),
                                                               v.chlast ? 1 : v.HW, v.C);
    }
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

ch_status launch_elemt(void *st, const bn_view &v, const float *x, const float *dy, float *dx,
                       const float *M, const float *A, const float *Kc, const float *B)
{
    cudaStream_t s = ch_cuda_stream(st);
    int64_t inner4, C4;
    if (quads(v, &inner4, &C4) && aligned16(x) && aligned16(dy) && aligned16(dx) &&
        aligned16(M) && aligned16(A) && aligned16(Kc) && aligned16(B)) {
        const int64_t n4 = v.numel() / 4;
        k_elemt4<<<ew_blocks(st, n4), EW_THREADS, 0, s>>>((const float4 *)x, (const float4 *)dy,
                                                          (float4 *)dx, M, A, Kc, B, n4, inner4,
                                                          C4, v.chlast);
    } else {
        k_elemt<<<ew_blocks(st, v.numel()), EW_THREADS, 0, s>>>(
            x, dy, dx, M, A, Kc, B, v.numel(), v.chlast ? 1 : v.HW, v.C);
    }
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

} // namespace

/* ------------------------------------------------------------ entry points */

ch_status ch_cuda_bn_stats(void *st, const ch_tensor_t *x, ch_tensor_t *mean, ch_tensor_t *var)
{
    bn_view v{};
    CH_TRY(view_of("ch_op_batchnorm_stats", "x", x, &v));
    const red_plan p = plan_reduce(st, v);
    double *part = nullptr;
    float *unused = nullptr;
    CH_TRY(workspace(st, (size_t)(p.S * v.C), 0, &part, &unused));
    cudaStream_t s = ch_cuda_stream(st);
    const double cnt = (double)v.count();
    CH_TRY(launch_reduce(st, v, p, f_sum{fp(x)}, part));
    k_fin_div<<<vec_blocks(st, v.C), VEC_THREADS, 0, s>>>(part, p.S, v.C, cnt, fpw(mean));
    CH_CUDA_CHECK_LAUNCH();
    CH_TRY(launch_reduce(st, v, p, f_sqdev{fp(x), fp(mean)}, part));
    k_fin_div<<<vec_blocks(st, v.C), VEC_THREADS, 0, s>>>(part, p.S, v.C, cnt, fpw(var));
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

ch_status ch_cuda_bn_apply(void *st, const ch_tensor_t *x, const ch_tensor_t *mean,
                           const ch_tensor_t *var, const ch_tensor_t *weight,
                           const ch_tensor_t *bias, float eps, ch_tensor_t *y)
{
    bn_view v{};
    CH_TRY(view_of("ch_op_batchnorm_apply", "x", x, &v));
    if (v.numel() == 0) return CH_OK;
    double *unused = nullptr;
    float *coef = nullptr;
    CH_TRY(workspace(st, 0, (size_t)(2 * v.C), &unused, &coef));
    cudaStream_t s = ch_cuda_stream(st);
    k_apply_coeffs<<<vec_blocks(st, v.C), VEC_THREADS, 0, s>>>(
        v.C, fp(mean), fp(var), fp(weight), fp(bias), eps, coef, coef + v.C);
    CH_CUDA_CHECK_LAUNCH();
    return launch_apply(st, v, fp(x), fpw(y), coef, coef + v.C);
}

ch_status ch_cuda_bn_update_running(void *st, ch_tensor_t *rm, ch_tensor_t *rv,
                                    const ch_tensor_t *mean, const ch_tensor_t *var,
                                    int64_t count, float momentum)
{
    const int64_t C = rm->shape[0];
    if (C == 0) return CH_OK;
    const double corr = (double)count / (double)(count - 1);
    k_update_running<<<vec_blocks(st, C), VEC_THREADS, 0, ch_cuda_stream(st)>>>(
        C, fpw(rm), fpw(rv), fp(mean), fp(var), corr, momentum, 1.0f - momentum);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

ch_status ch_cuda_bn_gather_stats(void *st, const ch_tensor_t *means, const ch_tensor_t *vars,
                                  const int64_t *counts, int nranks, ch_tensor_t *mean,
                                  ch_tensor_t *var)
{
    const int64_t C = means->shape[1];
    if (C == 0) return CH_OK;
    if (nranks <= BN_COUNTS_BY_VALUE) {
        bn_counts_v cv;
        memset(&cv, 0, sizeof cv);
        memcpy(cv.c, counts, (size_t)nranks * sizeof(int64_t));
        k_gather_stats<bn_counts_v><<<vec_blocks(st, C), VEC_THREADS, 0, ch_cuda_stream(st)>>>(
            C, nranks, fp(means), fp(vars), cv, fpw(mean), fpw(var));
        CH_CUDA_CHECK_LAUNCH();
        return CH_OK;
    }
    const int64_t *dcounts = nullptr;
    CH_TRY(bn_counts_on_device(st, counts, nranks, &dcounts));
    k_gather_stats<const int64_t *><<<vec_blocks(st, C), VEC_THREADS, 0, ch_cuda_stream(st)>>>(
        C, nranks, fp(means), fp(vars), dcounts, fpw(mean), fpw(var));
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

ch_status ch_cuda_bn_backward_reduce(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                     const ch_tensor_t *mean, ch_tensor_t *sum_dy,
                                     ch_tensor_t *sum_dy_xmu)
{
    bn_view v{};
    CH_TRY(view_of("ch_op_batchnorm_backward_reduce", "x", x, &v));
    if (v.C == 0) return CH_OK;
    const red_plan p = plan_reduce(st, v);
    double *part = nullptr;
    float *unused = nullptr;
    CH_TRY(workspace(st, (size_t)(2 * p.S * v.C), 0, &part, &unused));
    /* N == 0: the partials are all zero, so both sums come out 0 */
    CH_TRY(launch_reduce(st, v, p, f_bwd{fp(x), fp(dy), fp(mean)}, part));
    k_fin_bwd<<<vec_blocks(st, v.C), VEC_THREADS, 0, ch_cuda_stream(st)>>>(
        part, p.S, v.C, fpw(sum_dy), fpw(sum_dy_xmu), nullptr, 0.0f, nullptr, nullptr, nullptr,
        nullptr, 1.0, nullptr, nullptr, nullptr);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

namespace {
/* dweight = (float)((double)S2 * invstd), dbias = S1 */
__global__ void k_param_grads(int64_t C, const float *S1, const float *S2, const float *VA,
                              float eps, float *dw, float *db)
{
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C;
         c += (int64_t)gridDim.x * blockDim.x) {
        if (dw) dw[c] = (float)((double)S2[c] * invstd_of(VA[c], eps));
        if (db) db[c] = S1[c];
    }
}
} // namespace

ch_status ch_cuda_bn_param_grads(void *st, const ch_tensor_t *sum_dy,
                                 const ch_tensor_t *sum_dy_xmu, const ch_tensor_t *var,
                                 float eps, ch_tensor_t *dweight, ch_tensor_t *dbias)
{
    const int64_t C = sum_dy->shape[0];
    if (C == 0 || (!dweight && !dbias)) return CH_OK;
    k_param_grads<<<vec_blocks(st, C), VEC_THREADS, 0, ch_cuda_stream(st)>>>(
        C, fp(sum_dy), fp(sum_dy_xmu), fp(var), eps, fpw(dweight), fpw(dbias));
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

ch_status ch_cuda_bn_backward_elemt(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                    const ch_tensor_t *mean, const ch_tensor_t *var, float eps,
                                    const ch_tensor_t *weight, const ch_tensor_t *sum_dy,
                                    const ch_tensor_t *sum_dy_xmu, int64_t total,
                                    ch_tensor_t *dx)
{
    bn_view v{};
    CH_TRY(view_of("ch_op_batchnorm_backward_elemt", "x", x, &v));
    if (v.numel() == 0) return CH_OK;
    double *unused = nullptr;
    float *coef = nullptr;
    CH_TRY(workspace(st, 0, (size_t)(3 * v.C), &unused, &coef));
    cudaStream_t s = ch_cuda_stream(st);
    float *A = coef, *Kc = coef + v.C, *B = coef + 2 * v.C;
    k_elemt_coeffs<<<vec_blocks(st, v.C), VEC_THREADS, 0, s>>>(
        v.C, fp(mean), fp(var), eps, fp(weight), fp(sum_dy), fp(sum_dy_xmu), (double)total, A,
        Kc, B);
    CH_CUDA_CHECK_LAUNCH();
    return launch_elemt(st, v, fp(x), fp(dy), fpw(dx), fp(mean), A, Kc, B);
}

ch_status ch_cuda_bn_backward(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                              const ch_tensor_t *mean, const ch_tensor_t *var, float eps,
                              const ch_tensor_t *weight, ch_tensor_t *dx, ch_tensor_t *dweight,
                              ch_tensor_t *dbias)
{
    bn_view v{};
    CH_TRY(view_of("ch_op_batchnorm_backward", "x", x, &v));
    if (v.C == 0 || (!dx && !dweight && !dbias)) return CH_OK;
    const red_plan p = plan_reduce(st, v);
    double *part = nullptr;
    float *coef = nullptr;
    CH_TRY(workspace(st, (size_t)(2 * p.S * v.C), dx ? (size_t)(3 * v.C) : 0, &part, &coef));
    cudaStream_t s = ch_cuda_stream(st);
    float *A = dx ? coef : nullptr, *Kc = dx ? coef + v.C : nullptr,
          *B = dx ? coef + 2 * v.C : nullptr;
    CH_TRY(launch_reduce(st, v, p, f_bwd{fp(x), fp(dy), fp(mean)}, part));
    /* the elementwise coefficients come from the double sums, as the CPU op */
    k_fin_bwd<<<vec_blocks(st, v.C), VEC_THREADS, 0, s>>>(
        part, p.S, v.C, nullptr, nullptr, fp(var), eps, fpw(dweight), fpw(dbias), fp(mean),
        fp(weight), (double)v.count(), A, Kc, B);
    CH_CUDA_CHECK_LAUNCH();
    if (!dx || v.numel() == 0) return CH_OK;
    return launch_elemt(st, v, fp(x), fp(dy), fpw(dx), fp(mean), A, Kc, B);
}
