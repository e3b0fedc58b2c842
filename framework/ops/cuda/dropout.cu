/* cohort: the CUDA dropout kernel (ops.h ch_op_dropout). The mask is
 * framework/ops/dropout_mask.h's, the CPU kernel's bit for bit: each
 * element's factor depends on (key, sample, feature) only. */
#include "config.h"

#include "framework/ops/cuda/dense_internal.h"
#include "framework/ops/dropout_mask.h"

static __global__ void k_dropout(const float *x, float *y, int64_t n, int64_t F, uint64_t key,
                                 uint32_t thr, float scale, int64_t base, int64_t stride)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)blockDim.x * gridDim.x) {
        const int64_t s = i / F, k = i - s * F;
        const uint64_t c = (uint64_t)(base + s * stride) * (uint64_t)F + (uint64_t)k;
        y[i] = x[i] * ch_dropout_factor(key, c, thr, scale);
    }
}

static ch_status cd_dropout(void *st, const ch_tensor_t *x, float p, const ch_dropout_key_t *key,
                            ch_tensor_t *y)
{
    CH_TRY(ch_cd_check_tensor(st, "ch_op_dropout", "x", x));
    CH_TRY(ch_cd_check_tensor(st, "ch_op_dropout", "y", y));
    const int64_t n = ch_tensor_numel(x), N = x->shape[0];
    if (n == 0) return CH_OK;
    const float scale = p >= 1.0f ? 0.0f : 1.0f / (float)(1.0 - (double)p);
    k_dropout<<<ch_cuda_blocks(st, n, CH_CD_THREADS), CH_CD_THREADS, 0, ch_cuda_stream(st)>>>(
        (const float *)x->data, (float *)y->data, n, n / N,
        ch_dropout_key(key->seed, key->stream, key->epoch), ch_dropout_threshold(p), scale,
        key->sample_base, key->sample_stride);
    CH_CUDA_CHECK_LAUNCH();
    return CH_OK;
}

void ch_cuda_table_dropout(ch_ops_backend_t *t) { t->dropout = cd_dropout; }
