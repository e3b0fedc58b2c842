/* cohort: the dropout mask, shared by the CPU (framework/ops/cpu/dropout.c)
 * and CUDA (framework/ops/cuda/dropout.cu) kernels so both draw the same
 * bits. Not installed.
 *
 * Counter-based: element k (0 <= k < F, row-major order of one sample's
 * features) of the sample with global index g keeps its value, scaled by
 * 1/(1-p), when the high 32 bits of mix(key ^ (g * F + k)) are >= the
 * threshold floor(p * 2^32); key = mix(mix(mix(seed) ^ stream) ^ epoch).
 * mix is SplitMix64's finalizer (Steele, Lea, Flood, "Fast splittable
 * pseudorandom number generators", OOPSLA 2014). Every element's draw is a
 * function of (seed, stream, epoch, g, k) alone: the same for any thread
 * count, block size, device, and for any world size when g is the sample's
 * position in the epoch's global order. Not PyTorch's generator. */
#ifndef COHORT_OPS_DROPOUT_MASK_H
#define COHORT_OPS_DROPOUT_MASK_H

#include <stdint.h>

#ifdef __CUDACC__
#define CH_DROPOUT_FN static __host__ __device__ __forceinline__
#else
#define CH_DROPOUT_FN static inline
#endif

CH_DROPOUT_FN uint64_t ch_dropout_mix(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

CH_DROPOUT_FN uint64_t ch_dropout_key(uint64_t seed, uint64_t stream, uint64_t epoch)
{
    return ch_dropout_mix(ch_dropout_mix(ch_dropout_mix(seed) ^ stream) ^ epoch);
}

/* floor(p * 2^32) for 0 <= p < 1 */
CH_DROPOUT_FN uint32_t ch_dropout_threshold(double p)
{
    double t = p * 4294967296.0;
    return t >= 4294967295.0 ? 0xFFFFFFFFu : (uint32_t)t;
}

/* The factor of element `counter` (= g * F + k): scale or 0. */
CH_DROPOUT_FN float ch_dropout_factor(uint64_t key, uint64_t counter, uint32_t threshold,
                                      float scale)
{
    return (uint32_t)(ch_dropout_mix(key ^ counter) >> 32) >= threshold ? scale : 0.0f;
}

#endif /* COHORT_OPS_DROPOUT_MASK_H */
