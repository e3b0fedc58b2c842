/* A program (not a test) for tests/test_cpu_isa.sh: runs every activation
 * and LayerNorm2d on the CPU backend, as ops in each CPU layout (plain,
 * nhwc, nChw8c, nChw16c; forward and backward) and as modules in one
 * training step and one eval forward of tests/act_chain.h's model on a
 * (2,3,12,12) batch, then prints the compute context's line
 * ("... (cpu runtime OpenMP, isa avx2) ..."). Run it with DNNL_VERBOSE=1
 * to see which oneDNN kernels the activations use. Exit 0 on success. */
#include "config.h"

#include "framework/nn/nn.h"
#include "tests/act_chain.h"
#include "framework/nn/nn_exec.h"
#include "framework/ops/ops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define TRY(x)                                                                          \
    do {                                                                                \
        if ((x) != CH_OK) {                                                             \
            fprintf(stderr, "act_step: %s\n", ch_error_message());                     \
            return 1;                                                                   \
        }                                                                               \
    } while (0)

static const ch_act_params_t KINDS[] = {
    {CH_ACT_HARDTANH, 0.0f, 6.0f}, {CH_ACT_LEAKY_RELU, 0.01f, 0}, {CH_ACT_SILU, 0, 0},
    {CH_ACT_SIGMOID, 0, 0},        {CH_ACT_TANH, 0, 0},           {CH_ACT_GELU_ERF, 0, 0},
    {CH_ACT_GELU_TANH, 0, 0},      {CH_ACT_HARDSWISH, 0, 0},      {CH_ACT_HARDSIGMOID, 0, 0}};

static int ops(ch_compute_t *cx)
{
    const ch_layout_t ls[4] = {CH_LAYOUT_PLAIN, CH_LAYOUT_NHWC, CH_LAYOUT_NCHW8C,
                               CH_LAYOUT_NCHW16C};
    int64_t s[4] = {2, 16, 7, 7}, P = 2 * 7 * 7, C = 16;
    for (int li = 0; li < 4; li++) {
        ch_tensor_t x, dy, y, dx, mean, rstd, dw, db;
        TRY(ch_tensor_alloc(&x, CH_F32, 4, s, ls[li], CH_DEV_CPU, 0));
        TRY(ch_tensor_alloc(&dy, CH_F32, 4, s, ls[li], CH_DEV_CPU, 0));
        TRY(ch_tensor_alloc(&y, CH_F32, 4, s, ls[li], CH_DEV_CPU, 0));
        TRY(ch_tensor_alloc(&dx, CH_F32, 4, s, ls[li], CH_DEV_CPU, 0));
        TRY(ch_tensor_alloc_f32(&mean, 1, &P));
        TRY(ch_tensor_alloc_f32(&rstd, 1, &P));
        TRY(ch_tensor_alloc_f32(&dw, 1, &C));
        TRY(ch_tensor_alloc_f32(&db, 1, &C));
        for (int64_t i = 0; i < ch_tensor_numel(&x); i++) {
            ch_tensor_f32(&x)[i] = 4.0f * sinf(0.37f * (float)i);
            ch_tensor_f32(&dy)[i] = cosf(0.11f * (float)i);
        }
        for (size_t k = 0; k < sizeof KINDS / sizeof KINDS[0]; k++) {
            TRY(ch_op_act_forward(cx, &KINDS[k], &x, &y));
            TRY(ch_op_act_backward(cx, &KINDS[k], &x, &dy, &dx));
        }
        TRY(ch_op_layernorm2d_forward(cx, &x, NULL, NULL, 1e-6f, &y, &mean, &rstd));
        TRY(ch_op_layernorm2d_backward(cx, &x, &dy, &mean, &rstd, NULL, &dx, &dw, &db));
        ch_tensor_t *all[] = {&x, &dy, &y, &dx, &mean, &rstd, &dw, &db};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ch_tensor_free(all[i]);
    }
    return 0;
}

static int step(ch_compute_t *cx)
{
    ch_model_t *m;
    TRY(act_chain(1, &m));
    int64_t xs[4] = {2, 3, 12, 12}, ls = 2;
    ch_tensor_t x, labels;
    TRY(ch_tensor_alloc_f32(&x, 4, xs));
    TRY(ch_tensor_alloc(&labels, CH_I64, 1, &ls, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    for (int64_t i = 0; i < ch_tensor_numel(&x); i++) ch_tensor_f32(&x)[i] = sinf(0.1f * (float)i);
    ch_tensor_i64(&labels)[0] = 3;
    ch_tensor_i64(&labels)[1] = 7;
    const ch_tensor_t *logits;
    float loss;
    ch_model_train(m, 1);
    TRY(ch_model_forward(m, cx, &x, &logits));
    TRY(ch_model_loss(m, cx, &labels, &loss));
    TRY(ch_model_backward(m, cx, NULL));
    ch_model_train(m, 0);
    TRY(ch_model_forward(m, cx, &x, &logits));
    if (!isfinite(loss)) {
        fprintf(stderr, "act_step: loss %g\n", (double)loss);
        return 1;
    }
    ch_tensor_free(&x);
    ch_tensor_free(&labels);
    ch_model_destroy(m);
    return 0;
}

int main(void)
{
    ch_compute_options_t o;
    ch_compute_options_default(&o);
    o.num_threads = 2;
    ch_compute_t *cx;
    TRY(ch_compute_create(&o, &cx));
    int rc = ops(cx) || step(cx);
    char line[256];
    printf("act_step: %s\n", ch_compute_describe(cx, line, sizeof line));
    ch_compute_destroy(cx);
    return rc;
}
