/* cohort: the activations' formulas, one element at a time (ops.h
 * "activations"), shared by the CPU C loops (framework/ops/cpu/eltwise.c)
 * and the CUDA kernels (framework/ops/cuda/eltwise.cu). PyTorch 1.13's CPU
 * kernels (aten/src/ATen/native/cpu/Activation.cpp: GeluKernelImpl,
 * GeluBackwardKernelImpl, hardswish/hardsigmoid(_backward)_kernel,
 * leaky_relu(_backward); UnaryOpsKernel.cpp sigmoid; BinaryOpsKernel.cpp
 * sigmoid_backward, tanh_backward, silu(_backward)) in float arithmetic,
 * their constants rounded to float as PyTorch's opmath does. Not installed.
 */
#ifndef COHORT_OPS_ACT_MATH_H
#define COHORT_OPS_ACT_MATH_H

#include <math.h>

#include "framework/ops/ops.h"

/* Inlined into every per-kind loop (eltwise.c), so each kind's switch
 * folds and the piecewise-linear loops vectorise. */
#ifdef __CUDACC__
#define CH_ACT_HD __host__ __device__ /* "static inline" already: nvcc refuses __forceinline__ with it */
#elif defined(__GNUC__)
#define CH_ACT_HD __attribute__((always_inline))
#else
#define CH_ACT_HD
#endif

/* sqrt(2 / pi) (M_SQRT2 * M_2_SQRTPI * 0.5), 1 / sqrt(2), 1 / sqrt(2 pi)
 * (M_2_SQRTPI * M_SQRT1_2 * 0.5), as float */
#define CH_ACT_K_BETA 0.7978845608028654f
#define CH_ACT_SQRT1_2 0.7071067811865476f
#define CH_ACT_K_ALPHA 0.3989422804014327f
#define CH_ACT_K_KAPPA 0.044715f

/* min(max(t, 0), 6) keeping NaN (as torch.clamp); vectorises */
static inline CH_ACT_HD float ch_act_relu6(float t)
{
    t = t < 0.0f ? 0.0f : t;
    return t > 6.0f ? 6.0f : t;
}

/* y = f(x) */
static inline CH_ACT_HD float ch_act_fwd1(const ch_act_params_t *p, float x)
{
    switch (p->kind) {
    case CH_ACT_HARDTANH: return x < p->alpha ? p->alpha : x > p->beta ? p->beta : x;
    case CH_ACT_LEAKY_RELU: return x > 0.0f ? x : x * p->alpha;
    case CH_ACT_SILU: return x / (1.0f + expf(-x));
    case CH_ACT_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case CH_ACT_TANH: return tanhf(x);
    case CH_ACT_GELU_ERF: return x * 0.5f * (1.0f + erff(x * CH_ACT_SQRT1_2));
    case CH_ACT_GELU_TANH:
        return 0.5f * x * (1.0f + tanhf(CH_ACT_K_BETA * (x + CH_ACT_K_KAPPA * x * x * x)));
    case CH_ACT_HARDSWISH: return x * ch_act_relu6(x + 3.0f) / 6.0f;
    case CH_ACT_HARDSIGMOID: return ch_act_relu6(x + 3.0f) / 6.0f;
    default: return x;
    }
}

/* dx = dy * f'(x) from the forward input x (Sigmoid and Tanh recompute y) */
static inline CH_ACT_HD float ch_act_bwd1(const ch_act_params_t *p, float x, float d)
{
    switch (p->kind) {
    case CH_ACT_HARDTANH: return (x <= p->alpha || x >= p->beta) ? 0.0f : d;
    case CH_ACT_LEAKY_RELU: return x > 0.0f ? d : d * p->alpha;
    case CH_ACT_SILU: {
        float s = 1.0f / (1.0f + expf(-x));
        return d * s * (1.0f + x * (1.0f - s));
    }
    case CH_ACT_SIGMOID: {
        float y = 1.0f / (1.0f + expf(-x));
        return d * (1.0f - y) * y;
    }
    case CH_ACT_TANH: {
        float y = tanhf(x);
        return d * (1.0f - y * y);
    }
    case CH_ACT_GELU_ERF: {
        float cdf = 0.5f * (1.0f + erff(x * CH_ACT_SQRT1_2));
        float pdf = CH_ACT_K_ALPHA * expf(-0.5f * x * x);
        return d * (cdf + x * pdf);
    }
    case CH_ACT_GELU_TANH: {
        float x2 = x * x, t = tanhf(CH_ACT_K_BETA * (x + CH_ACT_K_KAPPA * x2 * x));
        float left = 0.5f * x, right = 1.0f + t;
        float dl = 0.5f * right;
        float dr = left * (1.0f - t * t) * CH_ACT_K_BETA * (1.0f + 3.0f * CH_ACT_K_KAPPA * x2);
        return d * (dl + dr);
    }
    case CH_ACT_HARDSWISH: /* the vectorised kernel's breakpoints (ops.h) */
        return x < -3.0f ? 0.0f : x < 3.0f ? d * (x / 3.0f + 0.5f) : d;
    case CH_ACT_HARDSIGMOID: return (x > -3.0f && x < 3.0f) ? d * (1.0f / 6.0f) : 0.0f;
    default: return d;
    }
}

#endif /* COHORT_OPS_ACT_MATH_H */
