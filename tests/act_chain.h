/* The model tests/act_step.c and tests/test_nn_act.c run every activation
 * and LayerNorm2d in (not installed):
 *   Conv2d(3,16,3,pad 1) LayerNorm2d ReLU6 Hardtanh(-2,2) LeakyReLU SiLU
 *   Sigmoid Tanh GELU GELU(tanh) Hardswish Hardsigmoid LayerNorm2d(eps 1e-5)
 *   AdaptiveAvgPool2d Linear(16,10)
 * for (N, 3, H, W) inputs, finalized with `seed`. */
#ifndef COHORT_TESTS_ACT_CHAIN_H
#define COHORT_TESTS_ACT_CHAIN_H

#include "framework/nn/nn.h"

static inline ch_status act_chain_add(ch_module_t *r)
{
    CH_TRY(ch_nn_conv2d(r, "0", 3, 16, 3, 1, 1, 1, NULL));
    CH_TRY(ch_nn_layernorm2d(r, "1", 16, CH_NN_LAYERNORM2D_EPS, NULL));
    CH_TRY(ch_nn_relu6(r, "2", NULL));
    CH_TRY(ch_nn_hardtanh(r, "3", -2.0f, 2.0f, NULL));
    CH_TRY(ch_nn_leaky_relu(r, "4", CH_NN_LEAKY_RELU_SLOPE, NULL));
    CH_TRY(ch_nn_silu(r, "5", NULL));
    CH_TRY(ch_nn_sigmoid(r, "6", NULL));
    CH_TRY(ch_nn_tanh(r, "7", NULL));
    CH_TRY(ch_nn_gelu(r, "8", "none", NULL));
    CH_TRY(ch_nn_gelu(r, "9", "tanh", NULL));
    CH_TRY(ch_nn_hardswish(r, "10", NULL));
    CH_TRY(ch_nn_hardsigmoid(r, "11", NULL));
    CH_TRY(ch_nn_layernorm2d(r, "12", 16, 1e-5f, NULL));
    CH_TRY(ch_nn_adaptive_avgpool2d(r, "13", NULL));
    return ch_nn_linear(r, "14", 16, 10, 1, NULL);
}

static inline ch_status act_chain(uint64_t seed, ch_model_t **out)
{
    ch_model_t *m = NULL;
    *out = NULL;
    CH_TRY(ch_model_new("act_chain", &m));
    ch_status s = act_chain_add(ch_model_root(m));
    if (s == CH_OK) s = ch_model_finalize(m, seed);
    if (s != CH_OK) {
        ch_model_destroy(m);
        return s;
    }
    *out = m;
    return CH_OK;
}

#endif
