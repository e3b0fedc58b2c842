/* cohort: AdamW and RMSprop steps on the GPU (ch_op_adamw_step,
 * ch_op_rmsprop_step; ops.h gives the formulas and their PyTorch source).
 *
 * One grid-stride kernel launch per parameter tensor, queued on the compute
 * stream (a ResNet-50 has 161 parameter tensors: well under a millisecond
 * of launches per step; the SGD step's multi-tensor chunk table, sgd.cu,
 * is the model for fusing these too). Each element is updated by the
 * operations of framework/ops/cpu/optim_kernels.c in the same order with
 * round-to-nearest intrinsics (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn,
 * __fmaf_rn) so nvcc cannot contract or approximate: the GPU update equals
 * the CPU update bit for bit, given equal inputs.
 */
#include "config.h"

#include "framework/ops/cuda/kernels.h"

namespace {

constexpr int OPT_THREADS = 256;

__device__ __forceinline__ float nan_max(float a, float b)
{
    if (a != a) return a;
    return (b > a || b != b) ? b : a;
}

__global__ void __launch_bounds__(OPT_THREADS)
    k_adamw(float *p, const float *g, float *m, float *v, float *vmax, int64_t n,
            ch_adamw_hparams_t h)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float gi = g[i];
        const float pi = __fmul_rn(p[i], h.decay);
        const float mi = __fmaf_rn(gi, h.one_minus_beta1, __fmul_rn(m[i], h.beta1));
        const float vi = __fmaf_rn(__fmul_rn(h.one_minus_beta2, gi), gi, __fmul_rn(v[i], h.beta2));
        m[i] = mi;
        v[i] = vi;
        float u = vi;
        if (h.amsgrad) {
            u = nan_max(vmax[i], vi);
            vmax[i] = u;
        }
        const float d = __fadd_rn(__fdiv_rn(__fsqrt_rn(u), h.bias_correction2_sqrt), h.eps);
        p[i] = __fadd_rn(pi, __fdiv_rn(__fmul_rn(h.neg_step_size, mi), d));
    }
}

__global__ void __launch_bounds__(OPT_THREADS)
    k_rmsprop(float *p, const float *g, float *v, float *ga, float *buf, int64_t n,
              ch_rmsprop_hparams_t h)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int use_mom = h.momentum > 0.0f, use_wd = h.weight_decay != 0.0f;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float pi = p[i];
        const float gi = use_wd ? __fmaf_rn(pi, h.weight_decay, g[i]) : g[i];
        const float vi = __fmaf_rn(__fmul_rn(h.one_minus_alpha, gi), gi, __fmul_rn(v[i], h.alpha));
        v[i] = vi;
        float avg;
        if (h.centered) {
            const float gai = __fmaf_rn(gi, h.one_minus_alpha, __fmul_rn(ga[i], h.alpha));
            ga[i] = gai;
            avg = __fsqrt_rn(__fmaf_rn(-gai, gai, vi));
        } else {
            avg = __fsqrt_rn(vi);
        }
        avg = __fadd_rn(avg, h.eps);
        if (use_mom) {
            const float bi = __fadd_rn(__fmul_rn(buf[i], h.momentum), __fdiv_rn(gi, avg));
            buf[i] = bi;
            p[i] = __fmaf_rn(bi, h.neg_lr, pi);
        } else {
            p[i] = __fadd_rn(pi, __fdiv_rn(__fmul_rn(h.neg_lr, gi), avg));
        }
    }
}

} // namespace

ch_status ch_cuda_adamw_step(void *st, const ch_adamw_tensor_t *ts, int n,
                             const ch_adamw_hparams_t *h)
{
    cudaStream_t s = ch_cuda_stream(st);
    for (int k = 0; k < n; k++) {
        const ch_adamw_tensor_t *t = &ts[k];
        if (t->numel == 0) continue;
        k_adamw<<<ch_cuda_blocks(st, t->numel, OPT_THREADS), OPT_THREADS, 0, s>>>(
            t->param, t->grad, t->exp_avg, t->exp_avg_sq, t->max_exp_avg_sq, t->numel, *h);
        CH_CUDA_CHECK_LAUNCH();
    }
    return CH_OK;
}

ch_status ch_cuda_rmsprop_step(void *st, const ch_rmsprop_tensor_t *ts, int n,
                               const ch_rmsprop_hparams_t *h)
{
    cudaStream_t s = ch_cuda_stream(st);
    for (int k = 0; k < n; k++) {
        const ch_rmsprop_tensor_t *t = &ts[k];
        if (t->numel == 0) continue;
        k_rmsprop<<<ch_cuda_blocks(st, t->numel, OPT_THREADS), OPT_THREADS, 0, s>>>(
            t->param, t->grad, t->square_avg, t->grad_avg, t->momentum_buffer, t->numel, *h);
        CH_CUDA_CHECK_LAUNCH();
    }
    return CH_OK;
}
