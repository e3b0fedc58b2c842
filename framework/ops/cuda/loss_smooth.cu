/* cohort: CUDA cross-entropy with label smoothing
 * (ch_op_cross_entropy_smooth; formula in ops.h). One warp per row as
 * loss.cu's plain cross-entropy: row max in float, sum exp((double)x - mx)
 * and sum (lse - x) in double per lane then a fixed butterfly over the warp,
 * row term (1 - e)(lse - x[label]) + (e/K) sum (lse - x) in double; the mean
 * over rows a fixed-order double tree in one block, rounded to float once.
 * dlogits = (float)((exp(x - lse) - e/K - (1 - e)[k == label]) / N).
 * Deterministic (no float atomics); equal to the CPU loop to double
 * rounding (the sums run in another order), not bit for bit.
 * Labels out of range: the lowest bad row is recorded (atomicMin), its
 * terms are NaN, and the op returns CH_ERR_RANGE naming it after waiting
 * for the stream (one small synchronous copy per call, as loss.cu).
 */
#include "config.h"

#include "framework/ops/cuda/kernels.h"

#include <math.h>

namespace {

constexpr int ROWS_THREADS = 256;
constexpr int MEAN_THREADS = 256;
constexpr unsigned long long NONE_BAD = ~0ull;

__device__ double warp_dsum(double s)
{
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

__device__ float warp_fmax(float m)
{
    for (int o = 16; o > 0; o >>= 1) {
        float v = __shfl_xor_sync(0xffffffffu, m, o);
        m = v > m ? v : m;
    }
    return m;
}

__global__ void __launch_bounds__(ROWS_THREADS)
    k_smooth_rows(const float *X, const int64_t *lab, int64_t N, int64_t K, double e, float *D,
                  double *rowloss, unsigned long long *bad)
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
        mx = warp_fmax(mx);
        double s = 0.0;
        for (int64_t k = lane; k < K; k += 32) s += exp((double)r[k] - (double)mx);
        s = warp_dsum(s);
        const double lse = (double)mx + log(s);
        double sm = 0.0;
        for (int64_t k = lane; k < K; k += 32) sm += lse - (double)r[k];
        sm = warp_dsum(sm);
        if (lane == 0) rowloss[n] = keep * (lse - (double)r[L]) + eK * sm;
        if (d)
            for (int64_t k = lane; k < K; k += 32)
                d[k] = (float)((exp((double)r[k] - lse) - eK - (k == L ? keep : 0.0)) / dN);
    }
}

__global__ void __launch_bounds__(MEAN_THREADS)
    k_smooth_mean(const double *rowloss, int64_t N, float *loss)
{
    __shared__ double sh[MEAN_THREADS];
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < N; i += MEAN_THREADS) s += rowloss[i];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int w = MEAN_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) loss[0] = (float)(sh[0] / (double)N);
}

} // namespace

ch_status ch_cuda_cross_entropy_smooth(void *st, const ch_tensor_t *logits,
                                       const ch_tensor_t *labels, double e, ch_tensor_t *loss,
                                       ch_tensor_t *dlogits)
{
    const int64_t N = logits->shape[0], K = logits->shape[1];
    void *ws = nullptr;
    CH_TRY(ch_cuda_workspace(st, (size_t)N * sizeof(double) + sizeof(unsigned long long), &ws));
    double *rowloss = (double *)ws;
    unsigned long long *bad = (unsigned long long *)(rowloss + N);
    cudaStream_t s = ch_cuda_stream(st);
    CH_CHECK_CUDA(cudaMemsetAsync(bad, 0xff, sizeof *bad, s));
    k_smooth_rows<<<ch_cuda_blocks(st, N * 32, ROWS_THREADS), ROWS_THREADS, 0, s>>>(
        (const float *)logits->data, (const int64_t *)labels->data, N, K, e,
        dlogits ? (float *)dlogits->data : nullptr, rowloss, bad);
    CH_CUDA_CHECK_LAUNCH();
    k_smooth_mean<<<1, MEAN_THREADS, 0, s>>>(rowloss, N, (float *)loss->data);
    CH_CUDA_CHECK_LAUNCH();
    unsigned long long first = NONE_BAD;
    long long label = 0;
    CH_CHECK_CUDA(cudaMemcpyAsync(&first, bad, sizeof first, cudaMemcpyDeviceToHost, s));
    CH_CHECK_CUDA(cudaStreamSynchronize(s));
    if (first == NONE_BAD) return CH_OK;
    CH_CHECK_CUDA(cudaMemcpyAsync(&label, (const int64_t *)labels->data + first, sizeof label,
                                  cudaMemcpyDeviceToHost, s));
    CH_CHECK_CUDA(cudaStreamSynchronize(s));
    return CH_ERROR(CH_ERR_RANGE,
                    "ch_op_cross_entropy_smooth: label of sample %lld is %lld, expected 0..%lld",
                    (long long)first, label, (long long)(K - 1));
}
