/* The activations (ReLU6/Hardtanh, LeakyReLU, SiLU, Sigmoid, Tanh, GELU erf
 * and tanh, Hardswish, Hardsigmoid) and ConvNeXt's LayerNorm2d against
 * PyTorch 1.13 (tests/golden/act_golden.py), on the CPU backend:
 *
 *  - ops: ch_op_act_* / ch_op_layernorm2d_* on the golden input (with each
 *    function's breakpoints in it) in every CPU layout (plain, nhwc,
 *    nChw8c, nChw16c) vs PyTorch's output and autograd's gradients,
 *    element by element: |cohort - torch| <= ATOL + RTOL * |torch| with
 *    ATOL 1e-6, RTOL 1e-5 for the activations (oneDNN's vectorised exp,
 *    tanh and erf are within a few ulp of libm / Sleef; a wrong derivative
 *    at a breakpoint is off by |dy| / 2 or more), ATOL 2e-5, RTOL 1e-4 for
 *    LayerNorm2d (double sums here, float Welford in PyTorch);
 *  - modules: Sequential(Conv2d 1x1 = identity, <module>, AdaptiveAvgPool2d,
 *    [Flatten,] Linear) loaded strictly from PyTorch's state dict (LayerNorm2d's
 *    "1.weight", "1.bias"), one training step: the module's output, the
 *    loss and every parameter gradient (relative error <= 1e-4 of the
 *    tensor's largest value, as test_nn's golden steps);
 *  - threads: every op bitwise the same on 1 and 2 threads (tensors large
 *    enough for the C loops' parallel regions);
 *  - builder errors; an activation between Linear layers ((N, C) input);
 *  - the same modules on a GPU model vs the CPU (SKIP without a GPU).
 */
#include "config.h"

#include "tests/nn_testutil.h"
#include "tests/gpu/gpu_testutil.h"
#include "tests/nn_gpu_step.h"
#include "tests/act_chain.h"

#include "framework/nn/nn.h"
#include "framework/nn/nn_exec.h"
#include "framework/ops/ops.h"

typedef struct {
    const char *name;
    int is_ln;
    ch_act_params_t p;
} act_case_t;

static const act_case_t CASES[] = {
    {"relu6", 0, {CH_ACT_HARDTANH, 0.0f, 6.0f}},
    {"hardtanh", 0, {CH_ACT_HARDTANH, -0.5f, 1.25f}},
    {"hardtanh_default", 0, {CH_ACT_HARDTANH, -1.0f, 1.0f}},
    {"leaky_relu", 0, {CH_ACT_LEAKY_RELU, 0.01f, 0.0f}},
    {"leaky_relu_02", 0, {CH_ACT_LEAKY_RELU, 0.2f, 0.0f}},
    {"silu", 0, {CH_ACT_SILU, 0, 0}},
    {"sigmoid", 0, {CH_ACT_SIGMOID, 0, 0}},
    {"tanh", 0, {CH_ACT_TANH, 0, 0}},
    {"gelu", 0, {CH_ACT_GELU_ERF, 0, 0}},
    {"gelu_tanh", 0, {CH_ACT_GELU_TANH, 0, 0}},
    {"hardswish", 0, {CH_ACT_HARDSWISH, 0, 0}},
    {"hardsigmoid", 0, {CH_ACT_HARDSIGMOID, 0, 0}},
    {"layernorm2d", 1, {0, 0, 0}},
};
#define NCASES (sizeof CASES / sizeof CASES[0])
#define LN_EPS 1e-6f

static const ch_layout_t LAYOUTS[4] = {CH_LAYOUT_PLAIN, CH_LAYOUT_NHWC, CH_LAYOUT_NCHW8C,
                                       CH_LAYOUT_NCHW16C};

static ch_safetensors_t *golden(void)
{
    if (!nt_have_torch()) return NULL;
    char dir[1024], path[1200];
    assert_int_equal(nt_run_golden("act_golden.py", "act", "", dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/act.safetensors", dir);
    ch_safetensors_t *st;
    assert_ch_ok(ch_safetensors_open(path, &st));
    return st;
}

/* A plain CPU tensor holding the golden tensor `name`. */
static void load(const ch_safetensors_t *st, const char *c, const char *t, ch_tensor_t *out)
{
    char name[160];
    snprintf(name, sizeof name, "%s.%s", c, t);
    const ch_st_view_t *v = ch_safetensors_find(st, name);
    if (!v) fail_msg("golden file lacks '%s'", name);
    assert_ch_ok(ch_tensor_alloc(out, v->dtype == CH_ST_F32 ? CH_F32 : CH_I64, v->ndim, v->shape,
                                 CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    memcpy(out->data, v->data, v->nbytes);
}

/* Element-wise |a - b| <= atol + rtol |b| with a in any layout, b plain. */
static void check(ch_compute_t *cx, const char *what, const ch_tensor_t *a, const ch_tensor_t *b,
                  double atol, double rtol)
{
    ch_tensor_t p;
    nt_relayout(cx, a, CH_LAYOUT_PLAIN, &p);
    const float *x = p.data, *y = b->data;
    assert_int_equal(ch_tensor_numel(&p), ch_tensor_numel(b));
    for (int64_t i = 0; i < ch_tensor_numel(b); i++) {
        double d = fabs((double)x[i] - (double)y[i]);
        if (!(d <= atol + rtol * fabs((double)y[i])))
            fail_msg("%s: element %lld is %.9g, PyTorch %.9g (|diff| %.3g > %.3g)", what,
                     (long long)i, (double)x[i], (double)y[i], d, atol + rtol * fabs((double)y[i]));
    }
    ch_tensor_free(&p);
}

static void test_ops_golden(void **state)
{
    (void)state;
    ch_safetensors_t *st = golden();
    if (!st) ch_test_skip("python3-torch not available (HAVE_TORCH != yes)");
    ch_compute_t *cx = nt_make_cx(1);
    char what[200];
    for (size_t ci = 0; ci < NCASES; ci++) {
        const act_case_t *k = &CASES[ci];
        ch_tensor_t x0, dy0, y0, dx0, dw0, db0, w, b;
        load(st, k->name, "x", &x0);
        load(st, k->name, "dy", &dy0);
        load(st, k->name, "y", &y0);
        load(st, k->name, "dx", &dx0);
        if (k->is_ln) {
            load(st, k->name, "dweight", &dw0);
            load(st, k->name, "dbias", &db0);
            load(st, k->name, "sd.1.weight", &w);
            load(st, k->name, "sd.1.bias", &b);
        }
        const double atol = k->is_ln ? 2e-5 : 1e-6, rtol = k->is_ln ? 1e-4 : 1e-5;
        for (int li = 0; li < 4; li++) {
            ch_tensor_t x, dy, y, dx;
            nt_relayout(cx, &x0, LAYOUTS[li], &x);
            nt_relayout(cx, &dy0, LAYOUTS[li], &dy);
            assert_ch_ok(ch_tensor_alloc(&y, CH_F32, 4, x0.shape, LAYOUTS[li], CH_DEV_CPU, 0));
            assert_ch_ok(ch_tensor_alloc(&dx, CH_F32, 4, x0.shape, LAYOUTS[li], CH_DEV_CPU, 0));
            const char *ln = ch_layout_name(LAYOUTS[li]);
            if (!k->is_ln) {
                assert_ch_ok(ch_op_act_forward(cx, &k->p, &x, &y));
                snprintf(what, sizeof what, "%s forward (%s)", k->name, ln);
                check(cx, what, &y, &y0, atol, rtol);
                assert_ch_ok(ch_op_act_backward(cx, &k->p, &x, &dy, &dx));
                snprintf(what, sizeof what, "%s input gradient (%s)", k->name, ln);
                check(cx, what, &dx, &dx0, atol, rtol);
                /* dx in place of dy, y in place of x */
                assert_ch_ok(ch_op_act_backward(cx, &k->p, &x, &dy, &dy));
                snprintf(what, sizeof what, "%s input gradient into dy (%s)", k->name, ln);
                check(cx, what, &dy, &dx0, atol, rtol);
                assert_ch_ok(ch_op_act_forward(cx, &k->p, &x, &x));
                snprintf(what, sizeof what, "%s forward in place (%s)", k->name, ln);
                check(cx, what, &x, &y0, atol, rtol);
            } else {
                int64_t P = x0.shape[0] * x0.shape[2] * x0.shape[3], C = x0.shape[1];
                ch_tensor_t mean, rstd, dw, db;
                assert_ch_ok(ch_tensor_alloc_f32(&mean, 1, &P));
                assert_ch_ok(ch_tensor_alloc_f32(&rstd, 1, &P));
                assert_ch_ok(ch_tensor_alloc_f32(&dw, 1, &C));
                assert_ch_ok(ch_tensor_alloc_f32(&db, 1, &C));
                assert_ch_ok(ch_op_layernorm2d_forward(cx, &x, &w, &b, LN_EPS, &y, &mean, &rstd));
                snprintf(what, sizeof what, "%s forward (%s)", k->name, ln);
                check(cx, what, &y, &y0, atol, rtol);
                assert_ch_ok(ch_op_layernorm2d_backward(cx, &x, &dy, &mean, &rstd, &w, &dx, &dw,
                                                        &db));
                snprintf(what, sizeof what, "%s input gradient (%s)", k->name, ln);
                check(cx, what, &dx, &dx0, atol, rtol);
                snprintf(what, sizeof what, "%s weight gradient (%s)", k->name, ln);
                check(cx, what, &dw, &dw0, atol, rtol);
                snprintf(what, sizeof what, "%s bias gradient (%s)", k->name, ln);
                check(cx, what, &db, &db0, atol, rtol);
                /* dx into dy, parameter gradients not wanted */
                assert_ch_ok(ch_op_layernorm2d_backward(cx, &x, &dy, &mean, &rstd, &w, &dy, NULL,
                                                        NULL));
                snprintf(what, sizeof what, "%s input gradient into dy (%s)", k->name, ln);
                check(cx, what, &dy, &dx0, atol, rtol);
                ch_tensor_free(&mean);
                ch_tensor_free(&rstd);
                ch_tensor_free(&dw);
                ch_tensor_free(&db);
            }
            ch_tensor_free(&x);
            ch_tensor_free(&dy);
            ch_tensor_free(&y);
            ch_tensor_free(&dx);
        }
        ch_tensor_free(&x0);
        ch_tensor_free(&dy0);
        ch_tensor_free(&y0);
        ch_tensor_free(&dx0);
        if (k->is_ln) {
            ch_tensor_free(&dw0);
            ch_tensor_free(&db0);
            ch_tensor_free(&w);
            ch_tensor_free(&b);
        }
    }
    ch_compute_destroy(cx);
    ch_safetensors_destroy(st);
}

/* Sequential(Conv2d(16,16,1,bias=False), <case>, AdaptiveAvgPool2d, -, Linear(16,5)). */
static ch_model_t *build(const act_case_t *k)
{
    ch_model_t *m = NULL;
    assert_ch_ok(ch_model_new(k->name, &m));
    ch_module_t *r = ch_model_root(m), *a = NULL;
    assert_ch_ok(ch_nn_conv2d(r, "0", 16, 16, 1, 1, 0, 0, NULL));
    const ch_act_params_t *p = &k->p;
    if (k->is_ln) {
        assert_ch_ok(ch_nn_layernorm2d(r, "1", 16, CH_NN_LAYERNORM2D_EPS, &a));
    } else if (!strcmp(k->name, "relu6")) {
        assert_ch_ok(ch_nn_relu6(r, "1", &a));
    } else {
        switch (p->kind) {
        case CH_ACT_HARDTANH: assert_ch_ok(ch_nn_hardtanh(r, "1", p->alpha, p->beta, &a)); break;
        case CH_ACT_LEAKY_RELU: assert_ch_ok(ch_nn_leaky_relu(r, "1", p->alpha, &a)); break;
        case CH_ACT_SILU: assert_ch_ok(ch_nn_silu(r, "1", &a)); break;
        case CH_ACT_SIGMOID: assert_ch_ok(ch_nn_sigmoid(r, "1", &a)); break;
        case CH_ACT_TANH: assert_ch_ok(ch_nn_tanh(r, "1", &a)); break;
        case CH_ACT_GELU_ERF: assert_ch_ok(ch_nn_gelu(r, "1", NULL, &a)); break;
        case CH_ACT_GELU_TANH: assert_ch_ok(ch_nn_gelu(r, "1", "tanh", &a)); break;
        case CH_ACT_HARDSWISH: assert_ch_ok(ch_nn_hardswish(r, "1", &a)); break;
        case CH_ACT_HARDSIGMOID: assert_ch_ok(ch_nn_hardsigmoid(r, "1", &a)); break;
        default: fail_msg("no builder for %s", k->name);
        }
        ch_act_params_t q;
        assert_ch_ok(ch_module_activation(a, &q));
        assert_int_equal(q.kind, p->kind);
        assert_true(q.alpha == p->alpha && (p->kind != CH_ACT_HARDTANH || q.beta == p->beta));
    }
    assert_ch_ok(ch_nn_adaptive_avgpool2d(r, "2", NULL));
    /* PyTorch's index 3 is the Flatten, which cohort's Linear does itself */
    assert_ch_ok(ch_nn_linear(r, "4", 16, 5, 1, NULL));
    assert_ch_ok(ch_model_finalize(m, 7));
    return m;
}

static void test_modules_golden(void **state)
{
    (void)state;
    ch_safetensors_t *st = golden();
    if (!st) ch_test_skip("python3-torch not available (HAVE_TORCH != yes)");
    ch_compute_t *cx = nt_make_cx(1);
    char name[200];
    for (size_t ci = 0; ci < NCASES; ci++) {
        const act_case_t *k = &CASES[ci];
        ch_model_t *m = build(k);
        if (k->is_ln) { /* LayerNorm.reset_parameters */
            const float *w = ch_model_find(m, "1.weight")->data, *b = ch_model_find(m, "1.bias")->data;
            for (int c = 0; c < 16; c++) assert_true(w[c] == 1.0f && b[c] == 0.0f);
        }
        /* PyTorch's state dict, strictly: same names, shapes and count */
        int n = ch_model_num_entries(m);
        ch_nn_view_t *views = calloc((size_t)n, sizeof *views);
        ch_tensor_t *held = calloc((size_t)n, sizeof *held);
        for (int i = 0; i < n; i++) {
            const ch_param_t *p = ch_model_entry(m, i);
            snprintf(name, sizeof name, "sd.%s", p->name);
            load(st, k->name, name, &held[i]);
            views[i] = (ch_nn_view_t){p->name, CH_F32, held[i].ndim, {0}, (size_t)ch_tensor_numel(&held[i]),
                                      held[i].data};
            for (int d = 0; d < held[i].ndim; d++) views[i].shape[d] = held[i].shape[d];
        }
        assert_ch_ok(ch_model_load_state_dict(m, views, n, 1, NULL, NULL, NULL));
        ch_tensor_t x, labels, act, loss;
        load(st, k->name, "x", &x);
        load(st, k->name, "labels", &labels);
        load(st, k->name, "act", &act);
        load(st, k->name, "loss", &loss);
        ch_model_train(m, 1);
        const ch_tensor_t *logits;
        float l;
        assert_ch_ok(ch_model_forward(m, cx, &x, &logits));
        assert_ch_ok(ch_model_loss(m, cx, &labels, &l));
        const ch_tensor_t *a = ch_model_activation(m, "1");
        assert_non_null(a);
        ch_tensor_t ap;
        nt_relayout(cx, a, CH_LAYOUT_PLAIN, &ap);
        snprintf(name, sizeof name, "%s module output", k->name);
        nt_assert_close(ch_tensor_f32(&ap), ch_tensor_f32(&act), (size_t)ch_tensor_numel(&act), 1e-5,
                        name);
        if (fabs(l - ch_tensor_f32(&loss)[0]) > 1e-5 * fabs(ch_tensor_f32(&loss)[0]))
            fail_msg("%s: loss %.8g vs PyTorch %.8g", k->name, l, ch_tensor_f32(&loss)[0]);
        assert_ch_ok(ch_model_backward(m, cx, NULL));
        for (int i = 0; i < ch_model_num_params(m); i++) {
            const ch_param_t *p = ch_model_param(m, i);
            ch_tensor_t g;
            snprintf(name, sizeof name, "grad.%s", p->name);
            load(st, k->name, name, &g);
            snprintf(name, sizeof name, "%s: gradient of %s", k->name, p->name);
            nt_assert_close(p->grad, ch_tensor_f32(&g), p->numel, 1e-4, name);
            ch_tensor_free(&g);
        }
        /* eval mode gives the same output (no state in these modules) */
        ch_model_train(m, 0);
        assert_ch_ok(ch_model_forward(m, cx, &x, &logits));
        ch_tensor_t ap2;
        nt_relayout(cx, ch_model_activation(m, "1"), CH_LAYOUT_PLAIN, &ap2);
        assert_memory_equal(ap.data, ap2.data, ap.nbytes);
        ch_tensor_free(&ap);
        ch_tensor_free(&ap2);
        for (int i = 0; i < n; i++) ch_tensor_free(&held[i]);
        free(held);
        free(views);
        ch_tensor_free(&x);
        ch_tensor_free(&labels);
        ch_tensor_free(&act);
        ch_tensor_free(&loss);
        ch_model_destroy(m);
    }
    ch_compute_destroy(cx);
    ch_safetensors_destroy(st);
}

/* One op of case k on (x, dy) into fresh outputs: out[0] y, out[1] dx
 * (LayerNorm2d: out[2] dweight, out[3] dbias), plain copies. */
static void run_case(ch_compute_t *cx, const act_case_t *k, const ch_tensor_t *x,
                     const ch_tensor_t *dy, const ch_tensor_t *w, const ch_tensor_t *b,
                     ch_tensor_t out[4])
{
    ch_tensor_t y, dx;
    assert_ch_ok(ch_tensor_alloc(&y, CH_F32, 4, x->shape, x->layout, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&dx, CH_F32, 4, x->shape, x->layout, CH_DEV_CPU, 0));
    if (!k->is_ln) {
        assert_ch_ok(ch_op_act_forward(cx, &k->p, x, &y));
        assert_ch_ok(ch_op_act_backward(cx, &k->p, x, dy, &dx));
    } else {
        int64_t P = x->shape[0] * x->shape[2] * x->shape[3], C = x->shape[1];
        ch_tensor_t mean, rstd;
        assert_ch_ok(ch_tensor_alloc_f32(&mean, 1, &P));
        assert_ch_ok(ch_tensor_alloc_f32(&rstd, 1, &P));
        assert_ch_ok(ch_tensor_alloc_f32(&out[2], 1, &C));
        assert_ch_ok(ch_tensor_alloc_f32(&out[3], 1, &C));
        assert_ch_ok(ch_op_layernorm2d_forward(cx, x, w, b, LN_EPS, &y, &mean, &rstd));
        assert_ch_ok(ch_op_layernorm2d_backward(cx, x, dy, &mean, &rstd, w, &dx, &out[2], &out[3]));
        ch_tensor_free(&mean);
        ch_tensor_free(&rstd);
    }
    nt_relayout(cx, &y, CH_LAYOUT_PLAIN, &out[0]);
    nt_relayout(cx, &dx, CH_LAYOUT_PLAIN, &out[1]);
    ch_tensor_free(&y);
    ch_tensor_free(&dx);
}

static void test_threads_bitwise(void **state)
{
    (void)state;
    ch_compute_t *cx = nt_make_cx(1);
    /* 4*32*33*31 = 130944 floats: above the C loops' parallel threshold */
    int64_t s[4] = {4, 32, 33, 31}, C = 32;
    ch_tensor_t x0, dy0, w, b;
    assert_ch_ok(ch_tensor_alloc_f32(&x0, 4, s));
    assert_ch_ok(ch_tensor_alloc_f32(&dy0, 4, s));
    assert_ch_ok(ch_tensor_alloc_f32(&w, 1, &C));
    assert_ch_ok(ch_tensor_alloc_f32(&b, 1, &C));
    float *xd = x0.data, *dd = dy0.data;
    for (int64_t i = 0; i < ch_tensor_numel(&x0); i++) {
        xd[i] = 5.0f * sinf(0.7311f * (float)i) + (i % 97 == 0 ? 0.0f : 0.001f * (float)(i % 13));
        dd[i] = cosf(0.173f * (float)i);
    }
    for (int i = 0; i < 200; i++) xd[i * 613] = (float)(i % 7) - 3.0f; /* breakpoints */
    for (int c = 0; c < C; c++) {
        ch_tensor_f32(&w)[c] = 1.0f + 0.1f * (float)c;
        ch_tensor_f32(&b)[c] = 0.01f * (float)c;
    }
    const ch_layout_t ls[2] = {CH_LAYOUT_PLAIN, CH_LAYOUT_NCHW16C};
    for (size_t ci = 0; ci < NCASES; ci++) {
        const act_case_t *k = &CASES[ci];
        for (int li = 0; li < 2; li++) {
            ch_tensor_t x, dy, r1[4], r2[4];
            nt_relayout(cx, &x0, ls[li], &x);
            nt_relayout(cx, &dy0, ls[li], &dy);
            assert_ch_ok(ch_compute_set_num_threads(cx, 1));
            run_case(cx, k, &x, &dy, &w, &b, r1);
            assert_ch_ok(ch_compute_set_num_threads(cx, 2));
            assert_int_equal(ch_compute_num_threads(cx), 2);
            run_case(cx, k, &x, &dy, &w, &b, r2);
            int nout = k->is_ln ? 4 : 2;
            for (int o = 0; o < nout; o++) {
                if (memcmp(r1[o].data, r2[o].data, r1[o].nbytes))
                    fail_msg("%s (%s): output %d differs between 1 and 2 threads", k->name,
                             ch_layout_name(ls[li]), o);
                ch_tensor_free(&r1[o]);
                ch_tensor_free(&r2[o]);
            }
            ch_tensor_free(&x);
            ch_tensor_free(&dy);
        }
    }
    ch_tensor_free(&x0);
    ch_tensor_free(&dy0);
    ch_tensor_free(&w);
    ch_tensor_free(&b);
    ch_compute_destroy(cx);
}

static void test_errors(void **state)
{
    (void)state;
    ch_model_t *m = NULL;
    assert_ch_ok(ch_model_new("errors", &m));
    ch_module_t *r = ch_model_root(m), *c = NULL;
    assert_ch_error(ch_nn_gelu(r, "g", "fast", NULL), CH_ERR_INVALID, "'none' or 'tanh'");
    assert_ch_error(ch_nn_hardtanh(r, "h", 2.0f, 1.0f, NULL), CH_ERR_INVALID, "min_val");
    assert_ch_error(ch_nn_layernorm2d(r, "ln", 8, 0.0f, NULL), CH_ERR_INVALID, "eps");
    assert_ch_error(ch_nn_leaky_relu(r, "l", NAN, NULL), CH_ERR_INVALID, "negative_slope");
    assert_ch_ok(ch_nn_conv2d(r, "0", 3, 8, 3, 1, 1, 0, &c));
    ch_act_params_t q;
    assert_ch_error(ch_module_activation(c, &q), CH_ERR_INVALID, "not an activation");
    assert_ch_ok(ch_nn_layernorm2d(r, "1", 4, CH_NN_LAYERNORM2D_EPS, NULL)); /* 8 channels come */
    assert_ch_ok(ch_nn_adaptive_avgpool2d(r, "2", NULL));
    assert_ch_ok(ch_nn_linear(r, "3", 8, 2, 1, NULL));
    assert_ch_ok(ch_model_finalize(m, 1));
    assert_non_null(ch_model_find(m, "1.weight"));
    assert_non_null(ch_model_find(m, "1.bias"));
    assert_int_equal(ch_model_num_entries(m), 5);
    ch_compute_t *cx = nt_make_cx(1);
    int64_t s[4] = {2, 3, 6, 6};
    assert_ch_error(ch_model_plan(m, cx, s, CH_LAYOUT_PLAIN, NULL), CH_ERR_INVALID,
                    "LayerNorm2d '1' expects (N, 4, H, W)");
    /* op-level argument checks */
    ch_tensor_t x, y;
    assert_ch_ok(ch_tensor_alloc_f32(&x, 4, s));
    assert_ch_ok(ch_tensor_alloc_f32(&y, 4, s));
    ch_act_params_t bad = {CH_ACT_HARDTANH, 1.0f, -1.0f};
    assert_ch_error(ch_op_act_forward(cx, &bad, &x, &y), CH_ERR_INVALID, "min_val");
    bad = (ch_act_params_t){CH_ACT_COUNT_, 0, 0};
    assert_ch_error(ch_op_act_forward(cx, &bad, &x, &y), CH_ERR_INVALID, "unknown activation");
    ch_act_params_t ok = {CH_ACT_SILU, 0, 0};
    assert_ch_error(ch_op_act_backward(cx, &ok, &x, &y, &x), CH_ERR_INVALID, "alias");
    int64_t P = 72;
    ch_tensor_t mean, rstd;
    assert_ch_ok(ch_tensor_alloc_f32(&mean, 1, &P));
    P = 71;
    assert_ch_ok(ch_tensor_alloc_f32(&rstd, 1, &P));
    assert_ch_error(ch_op_layernorm2d_forward(cx, &x, NULL, NULL, 1e-6f, &y, &mean, &rstd),
                    CH_ERR_INVALID, "rstd must have N*H*W = 72");
    assert_ch_error(ch_op_layernorm2d_forward(cx, &x, NULL, NULL, 1e-6f, &x, &mean, &mean),
                    CH_ERR_INVALID, "alias");
    ch_tensor_free(&x);
    ch_tensor_free(&y);
    ch_tensor_free(&mean);
    ch_tensor_free(&rstd);
    ch_compute_destroy(cx);
    ch_model_destroy(m);
}

/* Activations between Linear layers (2-D (N, C) activations, an MLP head):
 * forward output = the op on the Linear's output, backward runs. */
static void test_after_linear(void **state)
{
    (void)state;
    ch_model_t *m = NULL;
    assert_ch_ok(ch_model_new("mlp", &m));
    ch_module_t *r = ch_model_root(m), *g = NULL;
    assert_ch_ok(ch_nn_adaptive_avgpool2d(r, "0", NULL));
    assert_ch_ok(ch_nn_linear(r, "1", 4, 8, 1, NULL));
    assert_ch_ok(ch_nn_gelu(r, "2", "tanh", &g));
    assert_ch_ok(ch_nn_linear(r, "3", 8, 3, 1, NULL));
    assert_ch_ok(ch_model_finalize(m, 5));
    ch_compute_t *cx = nt_make_cx(1);
    int64_t xs[4] = {6, 4, 3, 3}, ls = 6;
    ch_tensor_t x, labels, ref;
    assert_ch_ok(ch_tensor_alloc_f32(&x, 4, xs));
    assert_ch_ok(ch_tensor_alloc(&labels, CH_I64, 1, &ls, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    for (int64_t i = 0; i < ch_tensor_numel(&x); i++) ch_tensor_f32(&x)[i] = 2.0f * sinf((float)i);
    for (int i = 0; i < 6; i++) ch_tensor_i64(&labels)[i] = i % 3;
    const ch_tensor_t *logits;
    float loss;
    assert_ch_ok(ch_model_forward(m, cx, &x, &logits));
    assert_ch_ok(ch_model_loss(m, cx, &labels, &loss));
    assert_ch_ok(ch_model_backward(m, cx, NULL));
    const ch_tensor_t *h = ch_model_activation(m, "1"), *a = ch_model_activation(m, "2");
    assert_int_equal(a->ndim, 2);
    assert_ch_ok(ch_tensor_alloc_f32(&ref, 2, h->shape));
    ch_act_params_t p;
    assert_ch_ok(ch_module_activation(g, &p));
    assert_ch_ok(ch_op_act_forward(cx, &p, h, &ref));
    assert_memory_equal(ref.data, a->data, ref.nbytes);
    const ch_param_t *w1 = ch_model_find(m, "1.weight");
    double s = 0;
    for (size_t i = 0; i < w1->numel; i++) s += fabs(w1->grad[i]);
    assert_true(s > 0 && isfinite(s)); /* the gradient went through the GELU */
    ch_tensor_free(&x);
    ch_tensor_free(&labels);
    ch_tensor_free(&ref);
    ch_compute_destroy(cx);
    ch_model_destroy(m);
}

/* tests/act_chain.h's model (every activation, LayerNorm2d): the same model (same seed) on the CPU and on GPU 0, one
 * training step; logits and loss (relative L2 <= 1e-4) and every gradient
 * (<= 1e-3), as tests/gpu/test_gpu_train. SKIPs without a GPU;
 * COHORT_GPU_TESTS_ON_CPU=1 runs the "GPU" side on the CPU
 * (tests/gpu/gpu_testutil.h). */
static void test_modules_gpu(void **state)
{
    (void)state;
    GT_NEED_GPU();
    ch_model_t *mc = NULL, *mg = NULL;
    assert_ch_ok(act_chain(11, &mc));
    assert_ch_ok(act_chain(11, &mg));
    const int64_t xs[4] = {4, 3, 12, 12};
    nt_gpu_step_vs_cpu(mc, mg, xs, 10, 1e-3);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops_golden),
        cmocka_unit_test(test_modules_golden),
        cmocka_unit_test(test_threads_bitwise),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_after_linear),
        cmocka_unit_test(test_modules_gpu),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
