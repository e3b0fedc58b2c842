/* cohort: the CPU dropout kernel (ops.h ch_op_dropout; the mask in
 * framework/ops/dropout_mask.h, shared with the CUDA kernel). Each element's
 * factor depends on its index alone, so the OpenMP split cannot change a
 * bit. */
#include "config.h"

#include "framework/ops/cpu/cpu.h"
#include "framework/ops/dropout_mask.h"

ch_status ch_cpu_dropout(void *st, const ch_tensor_t *x, float p, const ch_dropout_key_t *key,
                         ch_tensor_t *y)
{
    ch_cpu_threads(st);
    const float *X = x->data;
    float *Y = y->data;
    const int64_t n = ch_tensor_numel(x), N = x->shape[0], F = N ? n / N : 0;
    const uint64_t k = ch_dropout_key(key->seed, key->stream, key->epoch);
    const uint32_t thr = ch_dropout_threshold(p);
    const float scale = p >= 1.0f ? 0.0f : 1.0f / (float)(1.0 - (double)p);
    const int64_t base = key->sample_base, stride = key->sample_stride;
#pragma omp parallel for schedule(static) if (2 * n >= CH_CPU_PAR_MIN)
    for (int64_t s = 0; s < N; s++) {
        const uint64_t c0 = (uint64_t)(base + s * stride) * (uint64_t)F;
        const float *xs = X + s * F;
        float *ys = Y + s * F;
        for (int64_t i = 0; i < F; i++) ys[i] = xs[i] * ch_dropout_factor(k, c0 + (uint64_t)i, thr, scale);
    }
    return CH_OK;
}
