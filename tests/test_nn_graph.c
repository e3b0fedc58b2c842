/* Squeeze-excitation (x * gate(x)) and channel-concat containers and their
 * ops (ch_op_mul_channel*, ch_op_concat_channels / ch_op_split_channels)
 * on the CPU backend:
 *
 *  - golden: a small CNN (conv, BN, ReLU, torchvision SqueezeExcitation(16, 8),
 *    a 2-branch concat of Conv2d 1x1 and Conv2d 3x3 + ReLU, pool, Linear)
 *    loaded strictly from PyTorch 1.13's state dict (tests/golden/
 *    graph_golden.py; names and order as torch's), one training step: SE
 *    and concat outputs, logits, loss and every parameter gradient
 *    (relative error <= 1e-4 of the tensor's largest value);
 *  - ops in every layout (plain, nhwc, nChw8c, nChw16c) for x, y, dy, dx
 *    against plain loops written here: bitwise equal (the ops multiply,
 *    copy and sum over h, w in order);
 *  - threads: every op bitwise the same on 1 and 2 threads (tensors large
 *    enough for the parallel regions);
 *  - errors: a gate of the wrong shape, a gate or branch starting with an
 *    in-place ReLU, branches of different H, W, no branch, op arguments;
 *  - the golden net on a GPU model vs the CPU (SKIP without a GPU;
 *    COHORT_GPU_TESTS_ON_CPU=1 runs the "GPU" side on the CPU).
 */
#include "config.h"

#include "tests/nn_testutil.h"
#include "tests/gpu/gpu_testutil.h"
#include "tests/nn_gpu_step.h"

#include "framework/nn/nn.h"
#include "framework/nn/nn_exec.h"
#include "framework/ops/ops.h"

static const ch_layout_t LAYOUTS[4] = {CH_LAYOUT_PLAIN, CH_LAYOUT_NHWC, CH_LAYOUT_NCHW8C,
                                       CH_LAYOUT_NCHW16C};

/* A plain (N, C, H, W) tensor of values from a small LCG (exact in float). */
static void fill(ch_tensor_t *t, int n, int c, int h, int w, uint32_t seed)
{
    int64_t s[4] = {n, c, h, w};
    assert_ch_ok(ch_tensor_alloc_f32(t, 4, s));
    float *p = t->data;
    for (int64_t i = 0; i < ch_tensor_numel(t); i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)((int)(seed >> 20) - 2048) / 1024.0f;
    }
}

/* a (any layout) bitwise equal to b (plain). */
static void same_bits(ch_compute_t *cx, const char *what, const ch_tensor_t *a, const ch_tensor_t *b)
{
    ch_tensor_t p;
    nt_relayout(cx, a, CH_LAYOUT_PLAIN, &p);
    assert_int_equal(p.nbytes, b->nbytes);
    if (memcmp(p.data, b->data, b->nbytes)) fail_msg("%s differs from the reference", what);
    ch_tensor_free(&p);
}

/* ------------------------------------------------------------ golden net */

static ch_model_t *build_net(void)
{
    ch_model_t *m = NULL;
    assert_ch_ok(ch_model_new("se_concat", &m));
    ch_module_t *r = ch_model_root(m), *se = NULL, *mix = NULL, *b1 = NULL;
    assert_ch_ok(ch_nn_conv2d(r, "conv1", 3, 16, 3, 1, 1, 0, NULL));
    assert_ch_ok(ch_nn_batchnorm2d(r, "bn1", 16, NULL));
    assert_ch_ok(ch_nn_relu(r, "relu", NULL));
    assert_ch_ok(ch_nn_squeeze_excitation(r, "se", &se));
    assert_ch_ok(ch_nn_adaptive_avgpool2d(se, "avgpool", NULL));
    assert_ch_ok(ch_nn_conv2d(se, "fc1", 16, 8, 1, 1, 0, 1, NULL));
    assert_ch_ok(ch_nn_relu(se, "activation", NULL));
    assert_ch_ok(ch_nn_conv2d(se, "fc2", 8, 16, 1, 1, 0, 1, NULL));
    assert_ch_ok(ch_nn_sigmoid(se, "scale_activation", NULL));
    assert_ch_ok(ch_nn_concat(r, "mix", &mix));
    assert_ch_ok(ch_nn_conv2d(mix, NULL, 16, 8, 1, 1, 0, 1, NULL));
    assert_ch_ok(ch_nn_sequential(mix, NULL, &b1));
    assert_ch_ok(ch_nn_conv2d(b1, NULL, 16, 8, 3, 1, 1, 1, NULL));
    assert_ch_ok(ch_nn_relu(b1, NULL, NULL));
    assert_ch_ok(ch_nn_adaptive_avgpool2d(r, "pool", NULL));
    assert_ch_ok(ch_nn_linear(r, "fc", 16, 5, 1, NULL));
    assert_ch_ok(ch_model_finalize(m, 11));
    return m;
}

static void test_golden(void **state)
{
    (void)state;
    if (!nt_have_torch()) ch_test_skip("python3-torch not available (HAVE_TORCH != yes)");
    char dir[1024], path[1200], name[200];
    assert_int_equal(nt_run_golden("graph_golden.py", "graph", "", dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/graph.safetensors", dir);
    ch_safetensors_t *st;
    assert_ch_ok(ch_safetensors_open(path, &st));
    ch_model_t *m = build_net();
    int n = 0;
    ch_nn_view_t *views = nt_golden_sd(st, 64, &n);
    /* the same names in torch's state_dict() order */
    assert_int_equal(n, ch_model_num_entries(m));
    for (int i = 0; i < n; i++) assert_string_equal(ch_model_entry(m, i)->name, views[i].name);
    assert_non_null(ch_model_find(m, "se.fc1.weight"));
    assert_non_null(ch_model_find(m, "mix.1.0.bias"));
    assert_ch_ok(ch_model_load_state_dict(m, views, n, 1, NULL, NULL, NULL));
    nt_golden_sd_free(views, n);
    ch_compute_t *cx = nt_make_cx(1);
    ch_tensor_t x, y;
    nt_golden_batch(st, &x, &y);
    nt_golden_forward_loss(st, m, cx, &x, &y);
    const char *acts[2][2] = {{"se", "se_out"}, {"mix", "mix_out"}};
    for (int a = 0; a < 2; a++) {
        ch_tensor_t p;
        const ch_tensor_t *t = ch_model_activation(m, acts[a][0]);
        assert_non_null(t);
        nt_relayout(cx, t, CH_LAYOUT_PLAIN, &p);
        float *ref = nt_read_f32(st, acts[a][1], NULL);
        snprintf(name, sizeof name, "output of %s", acts[a][0]);
        nt_assert_close(ch_tensor_f32(&p), ref, (size_t)ch_tensor_numel(&p), 1e-5, name);
        free(ref);
        ch_tensor_free(&p);
    }
    assert_ch_ok(ch_model_backward(m, cx, NULL));
    for (int i = 0; i < ch_model_num_params(m); i++) {
        const ch_param_t *p = ch_model_param(m, i);
        size_t k = 0;
        snprintf(name, sizeof name, "grad.%s", p->name);
        float *ref = nt_read_f32(st, name, &k);
        assert_int_equal(k, p->numel);
        snprintf(name, sizeof name, "gradient of %s", p->name);
        nt_assert_close(p->grad, ref, p->numel, 1e-4, name);
        free(ref);
    }
    ch_tensor_free(&x);
    ch_tensor_free(&y);
    ch_compute_destroy(cx);
    ch_model_destroy(m);
    ch_safetensors_destroy(st);
}

/* ------------------------------------------------------------ ops */

/* Reference of all four ops on plain tensors: y = x * s, dx = dy * s,
 * ds = sum_hw dy * x (in h, w order), cat = [x | x2], parts of dcat. */
static void reference(const ch_tensor_t *x, const ch_tensor_t *s, const ch_tensor_t *dy,
                      ch_tensor_t *y, ch_tensor_t *dx, ch_tensor_t *ds)
{
    const int64_t N = x->shape[0], C = x->shape[1], HW = x->shape[2] * x->shape[3];
    const float *xp = x->data, *sp = s->data, *dp = dy->data;
    float *yp = y->data, *dxp = dx->data, *dsp = ds->data;
    for (int64_t p = 0; p < N * C; p++) {
        float acc = 0.0f;
        for (int64_t i = 0; i < HW; i++) {
            yp[p * HW + i] = xp[p * HW + i] * sp[p];
            dxp[p * HW + i] = dp[p * HW + i] * sp[p];
            acc += dp[p * HW + i] * xp[p * HW + i];
        }
        dsp[p] = acc;
    }
}

/* Every op with x/dy/outputs in layout l (s, ds plain (N, C, 1, 1)), outputs
 * returned plain in out[0..4]: y, dx, ds, cat, part 1 of split(cat). */
static void run_ops(ch_compute_t *cx, ch_layout_t l, const ch_tensor_t *x, const ch_tensor_t *s,
                    const ch_tensor_t *dy, const ch_tensor_t *x2, ch_tensor_t out[5])
{
    ch_tensor_t xl, dyl, x2l, y, dx, ds, cat, p0, p1;
    nt_relayout(cx, x, l, &xl);
    nt_relayout(cx, dy, l, &dyl);
    nt_relayout(cx, x2, l, &x2l);
    assert_ch_ok(ch_tensor_alloc(&y, CH_F32, 4, x->shape, l, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&dx, CH_F32, 4, x->shape, l, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc_f32(&ds, 4, s->shape));
    assert_ch_ok(ch_op_mul_channel(cx, &xl, s, &y));
    assert_ch_ok(ch_op_mul_channel_backward(cx, &xl, s, &dyl, &dx, &ds));
    int64_t cs[4] = {x->shape[0], x->shape[1] + x2->shape[1], x->shape[2], x->shape[3]};
    assert_ch_ok(ch_tensor_alloc(&cat, CH_F32, 4, cs, l, CH_DEV_CPU, 0));
    const ch_tensor_t *parts[2] = {&xl, &x2l};
    assert_ch_ok(ch_op_concat_channels(cx, parts, 2, &cat));
    assert_ch_ok(ch_tensor_alloc(&p0, CH_F32, 4, x->shape, l, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&p1, CH_F32, 4, x2->shape, l, CH_DEV_CPU, 0));
    ch_tensor_t *dparts[2] = {&p0, &p1};
    assert_ch_ok(ch_op_split_channels(cx, &cat, dparts, 2));
    same_bits(cx, "split part 0", &p0, x);
    nt_relayout(cx, &y, CH_LAYOUT_PLAIN, &out[0]);
    nt_relayout(cx, &dx, CH_LAYOUT_PLAIN, &out[1]);
    out[2] = ds;
    nt_relayout(cx, &cat, CH_LAYOUT_PLAIN, &out[3]);
    nt_relayout(cx, &p1, CH_LAYOUT_PLAIN, &out[4]);
    ch_tensor_t *tmp[] = {&xl, &dyl, &x2l, &y, &dx, &cat, &p0, &p1};
    for (size_t i = 0; i < sizeof tmp / sizeof tmp[0]; i++) ch_tensor_free(tmp[i]);
}

static void ops_case(ch_compute_t *cx, int N, int C, int C2, int H, int W)
{
    ch_tensor_t x, s, dy, x2, y, dx, ds;
    fill(&x, N, C, H, W, 1);
    fill(&s, N, C, 1, 1, 2);
    fill(&dy, N, C, H, W, 3);
    fill(&x2, N, C2, H, W, 4);
    assert_ch_ok(ch_tensor_alloc_f32(&y, 4, x.shape));
    assert_ch_ok(ch_tensor_alloc_f32(&dx, 4, x.shape));
    assert_ch_ok(ch_tensor_alloc_f32(&ds, 4, s.shape));
    reference(&x, &s, &dy, &y, &dx, &ds);
    for (int li = 0; li < 4; li++) {
        ch_tensor_t out[5];
        run_ops(cx, LAYOUTS[li], &x, &s, &dy, &x2, out);
        char what[96];
        snprintf(what, sizeof what, "mul_channel y (%s)", ch_layout_name(LAYOUTS[li]));
        assert_memory_equal(out[0].data, y.data, y.nbytes);
        assert_memory_equal(out[1].data, dx.data, dx.nbytes);
        assert_memory_equal(out[2].data, ds.data, ds.nbytes);
        /* cat = [x | x2] per sample */
        const int64_t a = (int64_t)C * H * W, b = (int64_t)C2 * H * W;
        for (int n = 0; n < N; n++) {
            assert_memory_equal(ch_tensor_f32(&out[3]) + n * (a + b), ch_tensor_f32(&x) + n * a,
                                (size_t)a * sizeof(float));
            assert_memory_equal(ch_tensor_f32(&out[3]) + n * (a + b) + a,
                                ch_tensor_f32(&x2) + n * b, (size_t)b * sizeof(float));
        }
        assert_memory_equal(out[4].data, x2.data, x2.nbytes);
        for (int i = 0; i < 5; i++) ch_tensor_free(&out[i]);
    }
    ch_tensor_t *all[] = {&x, &s, &dy, &x2, &y, &dx, &ds};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ch_tensor_free(all[i]);
}

static void test_ops_layouts(void **state)
{
    (void)state;
    ch_compute_t *cx = nt_make_cx(1);
    ops_case(cx, 2, 16, 32, 5, 3);
    ops_case(cx, 3, 32, 16, 1, 1);
    ch_compute_destroy(cx);
}

/* The ops on 1 and 2 threads on tensors above the parallel threshold:
 * bitwise the same (and as the plain reference). */
static void test_threads_bitwise(void **state)
{
    (void)state;
    ch_compute_t *c1 = nt_make_cx(1), *c2 = nt_make_cx(2);
    ops_case(c1, 4, 64, 16, 32, 32);
    ops_case(c2, 4, 64, 16, 32, 32);
    ch_compute_destroy(c1);
    ch_compute_destroy(c2);
}

/* ------------------------------------------------------------ errors */

static void plan_error(void (*add)(ch_module_t *r), const char *msg)
{
    ch_model_t *m = NULL;
    assert_ch_ok(ch_model_new("errors", &m));
    add(ch_model_root(m));
    assert_ch_ok(ch_model_finalize(m, 1));
    ch_compute_t *cx = nt_make_cx(1);
    int64_t s[4] = {2, 16, 6, 6};
    assert_ch_error(ch_model_plan(m, cx, s, CH_LAYOUT_PLAIN, NULL), CH_ERR_INVALID, msg);
    ch_compute_destroy(cx);
    ch_model_destroy(m);
}

static void head(ch_module_t *r, int c)
{
    assert_ch_ok(ch_nn_adaptive_avgpool2d(r, "pool", NULL));
    assert_ch_ok(ch_nn_linear(r, "fc", c, 2, 1, NULL));
}

static void se_wrong_gate(ch_module_t *r)
{
    ch_module_t *se;
    assert_ch_ok(ch_nn_squeeze_excitation(r, "se", &se));
    assert_ch_ok(ch_nn_adaptive_avgpool2d(se, "avgpool", NULL));
    assert_ch_ok(ch_nn_conv2d(se, "fc1", 16, 8, 1, 1, 0, 1, NULL));
    head(r, 16);
}

static void se_relu_first(ch_module_t *r)
{
    ch_module_t *se;
    assert_ch_ok(ch_nn_squeeze_excitation(r, "se", &se));
    assert_ch_ok(ch_nn_relu(se, "r", NULL));
    head(r, 16);
}

static void se_empty(ch_module_t *r)
{
    assert_ch_ok(ch_nn_squeeze_excitation(r, "se", NULL));
    head(r, 16);
}

static void concat_mismatch(ch_module_t *r)
{
    ch_module_t *mix;
    assert_ch_ok(ch_nn_concat(r, "mix", &mix));
    assert_ch_ok(ch_nn_conv2d(mix, NULL, 16, 8, 1, 1, 0, 1, NULL));
    assert_ch_ok(ch_nn_conv2d(mix, NULL, 16, 8, 1, 2, 0, 1, NULL)); /* stride 2 */
    head(r, 16);
}

static void concat_relu_first(ch_module_t *r)
{
    ch_module_t *mix;
    assert_ch_ok(ch_nn_concat(r, "mix", &mix));
    assert_ch_ok(ch_nn_relu(mix, NULL, NULL));
    head(r, 16);
}

static void concat_empty(ch_module_t *r)
{
    assert_ch_ok(ch_nn_concat(r, "mix", NULL));
    head(r, 16);
}

static void test_errors(void **state)
{
    (void)state;
    plan_error(se_wrong_gate, "SqueezeExcitation 'se': gate gives [2, 8, 1, 1]");
    plan_error(se_relu_first, "must not start with ReLU");
    plan_error(se_empty, "SqueezeExcitation 'se' has no gate");
    plan_error(concat_mismatch, "Concat 'mix': branch '1' gives [2, 8, 3, 3]");
    plan_error(concat_relu_first, "branch '0' must not start with ReLU");
    plan_error(concat_empty, "Concat 'mix' has no branch");
    /* op-level argument checks */
    ch_compute_t *cx = nt_make_cx(1);
    ch_tensor_t x, s, bad, y, x2;
    fill(&x, 2, 4, 3, 3, 1);
    fill(&s, 2, 4, 1, 1, 2);
    fill(&bad, 2, 4, 2, 1, 3);
    fill(&y, 2, 4, 3, 3, 4);
    fill(&x2, 2, 4, 2, 3, 5);
    assert_ch_error(ch_op_mul_channel(cx, &x, &bad, &y), CH_ERR_INVALID, "expected (N, C) or (N, C, 1, 1)");
    assert_ch_error(ch_op_mul_channel_backward(cx, &x, &s, &y, &x, NULL), CH_ERR_INVALID, "alias");
    const ch_tensor_t *parts[2] = {&x, &x2};
    int64_t cs[4] = {2, 8, 3, 3};
    ch_tensor_t cat;
    assert_ch_ok(ch_tensor_alloc_f32(&cat, 4, cs));
    assert_ch_error(ch_op_concat_channels(cx, parts, 2, &cat), CH_ERR_INVALID, "part 1");
    parts[1] = &y;
    assert_ch_error(ch_op_concat_channels(cx, parts, 1, &cat), CH_ERR_INVALID, "4 channels in all, concatenation 8");
    assert_ch_ok(ch_op_concat_channels(cx, parts, 2, &cat));
    ch_tensor_t *all[] = {&x, &s, &bad, &y, &x2, &cat};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ch_tensor_free(all[i]);
    ch_compute_destroy(cx);
}

/* One training step of the golden net on a GPU model vs the CPU: logits,
 * loss and every gradient (relative L2 error <= 1e-4 with TF32 off). */
static void test_model_gpu(void **state)
{
    (void)state;
    GT_NEED_GPU();
    const int64_t xs[4] = {4, 3, 9, 7};
    nt_gpu_step_vs_cpu(build_net(), build_net(), xs, 5, 1e-4);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_ops_layouts),
        cmocka_unit_test(test_threads_bitwise),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_model_gpu),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
