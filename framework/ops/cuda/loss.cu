/* cohort: CUDA softmax cross-entropy, argmax and accuracy count (own
 * kernels; issue #7). Numerics of framework/ops/cpu/kernels.c:
 *  - cross_entropy: per row mx = max (float; a NaN in column 0 propagates
 *    as in the CPU loop), s = sum exp((double)x - mx) in double,
 *    lse = mx + log(s), row loss lse - x[label] in double; the mean over
 *    rows is a fixed-order double tree sum (deterministic), rounded to float
 *    once. dlogits = (float)(exp(x - lse) / N), minus (float)(1/N) at the
 *    label, as the CPU op.
 *  - argmax: first maximum, NaN counts as the maximum (torch.argmax; the
 *    order of chk_argmax_better in kernel_index.h, exact for any tree).
 * One warp per row, 64-bit indexing, integer atomics only (exact).
 *
 * Labels out of range: the cross-entropy kernel records the first bad
 * sample (atomicMin on its index: the lowest bad row, deterministic), writes
 * NaN into that row's loss term and dlogits row instead of reading out of
 * bounds, and a one-thread kernel stores that row and its label next to
 * the flag. The op does not wait for it: the two words are copied
 * asynchronously into page-locked memory behind an event, and the check
 * (ch_cuda_loss_check) runs at the next cross-entropy on the context
 * (before its own kernels; by then the step that queued the flag is usually
 * done, else the host waits for that earlier loss only) and at
 * ch_compute_sync, which ch_model_loss_value calls after reading the loss:
 * an out-of-range label is CH_ERR_RANGE naming the sample and its label, as
 * ops.h says, one call later than on the CPU. No host wait in the step.
 */
#include "config.h"

#include "framework/ops/cuda/kernels.h"

#include "framework/ops/cuda/kernel_index.h"

#include <math.h>
#include <stdlib.h>

namespace {

constexpr int ROW_THREADS = 256; /* 8 rows (warps) per block */
constexpr int SUM_THREADS = 256;
constexpr unsigned long long NO_BAD = ~0ull;

/* Host-visible results (page-locked) of the loss ops. */
struct loss_slot {
    unsigned long long *host; /* [0] correct count; [2] first bad row, [3] its label
                                 (the deferred label check) */
    cudaEvent_t flag_copied;  /* recorded after the copy into host[2..3] */
    int flag_pending;         /* a cross-entropy's flag not checked yet */
    int64_t flag_K;           /* its number of classes */
};

void loss_slot_destroy(void *st, void *p)
{
    (void)st;
    loss_slot *s = (loss_slot *)p;
    if (!s) return;
    if (s->flag_copied) cudaEventDestroy(s->flag_copied);
    if (s->host) cudaFreeHost(s->host);
    free(s);
}

const ch_cuda_slot_ops_t loss_slot_ops = {loss_slot_destroy, nullptr};

ch_status host_words(void *st, unsigned long long **h)
{
    loss_slot *s = (loss_slot *)ch_cuda_slot(st, CH_CUDA_SLOT_LOSS);
    if (!s) {
        s = (loss_slot *)calloc(1, sizeof *s);
        if (!s) return CH_ERROR(CH_ERR_NOMEM, "loss (cuda): out of host memory");
        cudaError_t e = cudaMallocHost((void **)&s->host, 4 * sizeof(unsigned long long));
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->flag_copied, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            if (s->host) cudaFreeHost(s->host);
            free(s);
            return CH_ERROR(CH_ERR_CUDA, "loss (cuda): page-locked words or event: %s",
                            cudaGetErrorString(e));
        }
        ch_cuda_slot_set(st, CH_CUDA_SLOT_LOSS, s, &loss_slot_ops);
    }
    *h = s->host;
    return CH_OK;
}

unsigned row_blocks(void *st, int64_t rows)
{
    return ch_cuda_blocks(st, rows * 32, ROW_THREADS);
}

/* Warp reductions (all 32 lanes take part; result in every lane). */
__device__ float warp_max_cpu(float m)
{
    /* the CPU's `r[k] > mx ? r[k] : mx` order: NaN never replaces a number,
     * a NaN start value is kept */
    for (int o = 16; o > 0; o >>= 1) {
        float v = __shfl_xor_sync(0xffffffffu, m, o);
        m = v > m ? v : m;
    }
    return m;
}

__device__ double warp_sum(double s)
{
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

/* logsumexp of row r (K values) by the warp, in every lane: mx = max in
 * float (the CPU loop's order), then mx + log(sum exp((double)x - mx)). */
__device__ double row_lse(const float *r, int64_t K, int lane)
{
    float mx = r[0];
    for (int64_t k = lane; k < K; k += 32) mx = r[k] > mx ? r[k] : mx;
    mx = warp_max_cpu(mx);
    double s = 0.0;
    for (int64_t k = lane; k < K; k += 32) s += exp((double)r[k] - (double)mx);
    s = warp_sum(s);
    return (double)mx + log(s);
}

/* A row with an out-of-range label: record it (the lowest such row wins),
 * NaN for its loss term and dlogits row instead of reading out of bounds. */
__device__ void mark_bad_row(int lane, int64_t n, int64_t K, float *d, double *rowloss,
                             unsigned long long *bad)
{
    if (lane == 0) {
        atomicMin(bad, (unsigned long long)n);
        rowloss[n] = nan("");
    }
    if (d)
        for (int64_t k = lane; k < K; k += 32) d[k] = nanf("");
}

/* bad[1] = the label of row bad[0] when a row was bad (one thread). */
__global__ void k_bad_label(const int64_t *lab, unsigned long long *bad)
{
    if (threadIdx.x == 0 && blockIdx.x == 0 && bad[0] != NO_BAD)
        bad[1] = (unsigned long long)lab[bad[0]];
}

/* Per-row loss terms (double) and optional dlogits. */
__global__ void __launch_bounds__(ROW_THREADS)
    k_xent_rows(const float *X, const int64_t *lab, int64_t N, int64_t K, float *D,
                double *rowloss, unsigned long long *bad)
{
    const int lane = threadIdx.x & 31;
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    const double dN = (double)N;
    const float invN = (float)(1.0 / dN);
    for (int64_t n = warp; n < N; n += nwarps) {
        const float *r = X + n * K;
        float *d = D ? D + n * K : nullptr;
        const int64_t L = lab[n];
        if (L < 0 || L >= K) {
            if (lane == 0) {
                atomicMin(bad, (unsigned long long)n);
                rowloss[n] = nan("");
            }
            if (d)
                for (int64_t k = lane; k < K; k += 32) d[k] = nanf("");
            continue;
        }
        float mx = r[0];
        for (int64_t k = lane; k < K; k += 32) mx = r[k] > mx ? r[k] : mx;
        mx = warp_max_cpu(mx);
        double s = 0.0;
        for (int64_t k = lane; k < K; k += 32) s += exp((double)r[k] - (double)mx);
        s = warp_sum(s);
        const double lse = (double)mx + log(s);
        if (lane == 0) rowloss[n] = lse - (double)r[L];
        if (d)
            for (int64_t k = lane; k < K; k += 32) {
                float v = (float)(exp((double)r[k] - lse) / dN);
                if (k == L) v -= invN;
                d[k] = v;
            }
    }
}

/* Label smoothing e (ch_op_cross_entropy_smooth; the CPU loop is
 * framework/ops/cpu/optim_kernels.c, whose sums run in another order: equal
 * to double rounding, not bit for bit): row term
 * (1 - e)(lse - x[label]) + (e/K) sum_k (lse - x_k) in double (per-lane
 * sums, then the warp butterfly), dlogits (float)((softmax - e/K - (1 - e)
 * [k == label]) / N). Out-of-range labels as k_xent_rows. */
__global__ void __launch_bounds__(ROW_THREADS)
    k_xent_smooth_rows(const float *X, const int64_t *lab, int64_t N, int64_t K, double e,
                       float *D, double *rowloss, unsigned long long *bad)
{
    const int lane = threadIdx.x & 31;
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    const double dN = (double)N, eK = e / (double)K, keep = 1.0 - e;
    for (int64_t n = warp; n < N; n += nwarps) {
        const float *r = X + n * K;
        float *d = D ? D + n * K : nullptr;
        const int64_t L = lab[n];
        if (L < 0 || L >= K) {
            mark_bad_row(lane, n, K, d, rowloss, bad);
            continue;
        }
        const double lse = row_lse(r, K, lane);
        double sm = 0.0;
        for (int64_t k = lane; k < K; k += 32) sm += lse - (double)r[k];
        sm = warp_sum(sm);
        if (lane == 0) rowloss[n] = keep * (lse - (double)r[L]) + eK * sm;
        if (d)
            for (int64_t k = lane; k < K; k += 32)
                d[k] = (float)((exp((double)r[k] - lse) - eK - (k == L ? keep : 0.0)) / dN);
    }
}

/* loss[0] = (float)(sum of row terms / N): one block, fixed order. */
__global__ void __launch_bounds__(SUM_THREADS)
    k_xent_mean(const double *rowloss, int64_t N, float *loss)
{
    __shared__ double sh[SUM_THREADS];
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < N; i += SUM_THREADS) s += rowloss[i];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int w = SUM_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) loss[0] = (float)(sh[0] / (double)N);
}

/* torch.argmax of one row by the warp (result in every lane). */
__device__ int64_t warp_argmax(const float *r, int64_t K, int lane)
{
    float bv = 0.0f;
    int64_t bk = -1; /* -1: this lane saw nothing */
    for (int64_t k = lane; k < K; k += 32) {
        const float v = r[k];
        if (bk < 0 || chk_argmax_better(v, k, bv, bk)) {
            bv = v;
            bk = k;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const long long ok = __shfl_xor_sync(0xffffffffu, (long long)bk, o);
        if (ok >= 0 && (bk < 0 || chk_argmax_better(ov, ok, bv, bk))) {
            bv = ov;
            bk = ok;
        }
    }
    return bk;
}

__global__ void __launch_bounds__(ROW_THREADS)
    k_argmax(const float *X, int64_t N, int64_t K, int64_t *out)
{
    const int lane = threadIdx.x & 31;
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t n = warp; n < N; n += nwarps) {
        const int64_t k = warp_argmax(X + n * K, K, lane);
        if (lane == 0) out[n] = k;
    }
}

__global__ void __launch_bounds__(ROW_THREADS)
    k_count_correct(const float *X, const int64_t *lab, int64_t N, int64_t K,
                    unsigned long long *count)
{
    const int lane = threadIdx.x & 31;
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    unsigned long long c = 0;
    for (int64_t n = warp; n < N; n += nwarps)
        c += warp_argmax(X + n * K, K, lane) == lab[n];
    if (lane == 0 && c) atomicAdd(count, c);
}

} // namespace

ch_status ch_cuda_loss_check(void *st)
{
    loss_slot *ls = (loss_slot *)ch_cuda_slot(st, CH_CUDA_SLOT_LOSS);
    if (!ls || !ls->flag_pending) return CH_OK;
    CH_CHECK_CUDA(cudaEventSynchronize(ls->flag_copied)); /* done already, as a rule */
    ls->flag_pending = 0;
    if (ls->host[2] == NO_BAD) return CH_OK;
    return CH_ERROR(CH_ERR_RANGE,
                    "ch_op_cross_entropy: label of sample %lld is %lld, expected 0..%lld (found "
                    "on the GPU after the op had returned; that loss is NaN)",
                    (long long)ls->host[2], (long long)(int64_t)ls->host[3],
                    (long long)(ls->flag_K - 1));
}

ch_status ch_cuda_cross_entropy(void *st, const ch_tensor_t *logits, const ch_tensor_t *labels,
                                ch_tensor_t *loss, ch_tensor_t *dlogits)
{
    const int64_t N = logits->shape[0], K = logits->shape[1];
    unsigned long long *host = nullptr;
    CH_TRY(host_words(st, &host));
    /* the previous call's labels, before its flag words are reused */
    CH_TRY(ch_cuda_loss_check(st));
    void *ws = nullptr;
    CH_TRY(ch_cuda_workspace(st, (size_t)N * sizeof(double) + 2 * sizeof(unsigned long long),
                             &ws));
    double *rowloss = (double *)ws;
    unsigned long long *bad = (unsigned long long *)(rowloss + N);
    cudaStream_t s = ch_cuda_stream(st);
    CH_CHECK_CUDA(cudaMemsetAsync(bad, 0xff, 2 * sizeof *bad, s)); /* NO_BAD */
    k_xent_rows<<<row_blocks(st, N), ROW_THREADS, 0, s>>>(
        (const float *)logits->data, (const int64_t *)labels->data, N, K,
        dlogits ? (float *)dlogits->data : nullptr, rowloss, bad);
    CH_CUDA_CHECK_LAUNCH();
    k_xent_mean<<<1, SUM_THREADS, 0, s>>>(rowloss, N, (float *)loss->data);
    CH_CUDA_CHECK_LAUNCH();
    /* label check, deferred (see the file comment): no host wait here */
    k_bad_label<<<1, 32, 0, s>>>((const int64_t *)labels->data, bad);
    CH_CUDA_CHECK_LAUNCH();
    loss_slot *ls = (loss_slot *)ch_cuda_slot(st, CH_CUDA_SLOT_LOSS);
    CH_CHECK_CUDA(cudaMemcpyAsync(host + 2, bad, 2 * sizeof *bad, cudaMemcpyDeviceToHost, s));
    CH_CHECK_CUDA(cudaEventRecord(ls->flag_copied, s));
    ls->flag_pending = 1;
    ls->flag_K = K;
    return CH_OK;
}

ch_status ch_cuda_argmax(void *st, const ch_tensor_t *logits, ch_tensor_t *out)
{
    const int64_t N = logits->shape[0], K = logits->shape[1];
    if (N == 0) return CH_OK;
    k_argmax<<<row_blocks(st, N), ROW_THREADS, 0, ch_cuda_stream(st)>>>(
        (const float *)logits->data, N, K, (int64_t *)out->data);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

ch_status ch_cuda_count_correct(void *st, const ch_tensor_t *logits, const ch_tensor_t *labels,
                                int64_t *correct)
{
    const int64_t N = logits->shape[0], K = logits->shape[1];
    *correct = 0;
    if (N == 0) return CH_OK;
    unsigned long long *host = nullptr;
    CH_TRY(host_words(st, &host));
    void *ws = nullptr;
    CH_TRY(ch_cuda_workspace(st, sizeof(unsigned long long), &ws));
    unsigned long long *count = (unsigned long long *)ws;
    cudaStream_t s = ch_cuda_stream(st);
    CH_CHECK_CUDA(cudaMemsetAsync(count, 0, sizeof *count, s));
    k_count_correct<<<row_blocks(st, N), ROW_THREADS, 0, s>>>(
        (const float *)logits->data, (const int64_t *)labels->data, N, K, count);
    CH_CUDA_CHECK_LAUNCH();
    CH_CHECK_CUDA(cudaMemcpyAsync(host, count, sizeof *count, cudaMemcpyDeviceToHost, s));
    CH_CHECK_CUDA(cudaStreamSynchronize(s));
    *correct = (int64_t)host[0];
    return CH_OK;
}

ch_status ch_cuda_cross_entropy_smooth(void *st, const ch_tensor_t *logits,
                                       const ch_tensor_t *labels, double e, ch_tensor_t *loss,
                                       ch_tensor_t *dlogits)
{
    /* ch_cuda_cross_entropy's launch sequence and deferred label check, with
     * the label-smoothing row kernel */
    const int64_t N = logits->shape[0], K = logits->shape[1];
    unsigned long long *host = nullptr;
    CH_TRY(host_words(st, &host));
    CH_TRY(ch_cuda_loss_check(st));
    void *ws = nullptr;
    CH_TRY(ch_cuda_workspace(st, (size_t)N * sizeof(double) + 2 * sizeof(unsigned long long),
                             &ws));
    double *rowloss = (double *)ws;
    unsigned long long *bad = (unsigned long long *)(rowloss + N);
    cudaStream_t s = ch_cuda_stream(st);
    CH_CHECK_CUDA(cudaMemsetAsync(bad, 0xff, 2 * sizeof *bad, s)); /* NO_BAD */
    k_xent_smooth_rows<<<row_blocks(st, N), ROW_THREADS, 0, s>>>(
        (const float *)logits->data, (const int64_t *)labels->data, N, K, e,
        dlogits ? (float *)dlogits->data : nullptr, rowloss, bad);
    CH_CUDA_CHECK_LAUNCH();
    k_xent_mean<<<1, SUM_THREADS, 0, s>>>(rowloss, N, (float *)loss->data);
    CH_CUDA_CHECK_LAUNCH();
    k_bad_label<<<1, 32, 0, s>>>((const int64_t *)labels->data, bad);
    CH_CUDA_CHECK_LAUNCH();
    loss_slot *ls = (loss_slot *)ch_cuda_slot(st, CH_CUDA_SLOT_LOSS);
    CH_CHECK_CUDA(cudaMemcpyAsync(host + 2, bad, 2 * sizeof *bad, cudaMemcpyDeviceToHost, s));
    CH_CHECK_CUDA(cudaEventRecord(ls->flag_copied, s));
    ls->flag_pending = 1;
    ls->flag_K = K;
    return CH_OK;
}
