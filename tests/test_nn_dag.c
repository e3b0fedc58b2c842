/* DAG graphs in the module tree (framework/nn CH_NN_GRAPH and its nodes
 * Add, Mul, Cat, Narrow, ChannelShuffle, Affine) on the CPU backend:
 *
 *  - golden (tests/golden/dag_golden.py, PyTorch 1.13): a DenseNet-style
 *    block (each layer reads the Cat of all earlier features), a
 *    ShuffleNetV2 unit (Narrow x2, branch, Cat, ChannelShuffle(2)), a
 *    MobileNetV2 inverted residual (Add, no final ReLU) with an SE gate
 *    Mul(x, sigmoid(...)), an Affine x * 0.5 + 1 and a value read by 3
 *    consumers, and the in-place ReLU rule (a ReLU whose input an Add also
 *    reads; Mul with the broadcast operand first): state-dict names and
 *    order equal torch's, strict load, one training step: logits, loss and
 *    every gradient to 1e-4 relative, each in a context preferring blocked
 *    layouts (automatic) and in one preferring plain;
 *  - the in-place rule seen from inside: the ReLU reading a shared value
 *    has an output of its own, the one after the Add works in place;
 *  - ch_nn_graph_set_output: nodes after the output run but do not change
 *    logits or gradients;
 *  - Add (both operand orders) and Mul of a plain and a blocked value vs
 *    the same nets in a plain context;
 *  - a named graph inside a Sequential (prefixed names, the graph's input
 *    gradient summed from two consumers) against central differences;
 *  - the gradient-ready hook: every trainable parameter once, in reverse
 *    parameter order; frozen parameters get no call;
 *  - trainer features on a graph model: ch_model_init_default,
 *    SyncBN conversion of the BN nodes (a world of one = plain BN),
 *    eval mode, and the model file (.pth) loading into the PyTorch
 *    module with strict=True;
 *  - graph ops in every layout against plain loops (bitwise), on 1 and 2
 *    threads;
 *  - errors: non-topological input, node never connected, wrong input
 *    count, Add shapes and Cat N/H/W mismatches at plan, naming both;
 *  - the four nets on a GPU model vs the CPU (the CUDA graph ops; SKIP
 *    without a GPU; COHORT_GPU_TESTS_ON_CPU=1 runs the "GPU" side on the
 *    CPU).
 */
#include "config.h"

#include "tests/nn_testutil.h"
#include "tests/gpu/gpu_testutil.h"
#include "tests/nn_gpu_step.h"

#include "framework/nn/nn.h"
#include "framework/nn/nn_exec.h"
#include "framework/ops/ops.h"
#include "io/state/train_state.h"

/* Connect node m (just added to g) to inputs; returns its value id. */
static int con(ch_module_t *g, ch_module_t *m, int n, const int *in)
{
    assert_ch_ok(ch_nn_graph_connect(g, m, in, n));
    return ch_module_num_children(g);
}
static int con1(ch_module_t *g, ch_module_t *m, int in) { return con(g, m, 1, &in); }
static int con2(ch_module_t *g, ch_module_t *m, int a, int b)
{
    int in[2] = {a, b};
    return con(g, m, 2, in);
}

static int conv(ch_module_t *g, const char *name, int in_c, int out_c, int k, int groups,
                int bias, int in)
{
    ch_conv2d_options_t o;
    ch_conv2d_options_default(&o, in_c, out_c, k);
    o.pad_h = o.pad_w = k / 2;
    o.groups = groups;
    o.bias = bias;
    ch_module_t *m;
    assert_ch_ok(ch_nn_conv2d_ex(g, name, &o, &m));
    return con1(g, m, in);
}

static int bn(ch_module_t *g, const char *name, int c, int in)
{
    ch_module_t *m;
    assert_ch_ok(ch_nn_batchnorm2d(g, name, c, &m));
    return con1(g, m, in);
}

static int relu(ch_module_t *g, const char *name, int in)
{
    ch_module_t *m;
    assert_ch_ok(ch_nn_relu(g, name, &m));
    return con1(g, m, in);
}

static int relu6(ch_module_t *g, const char *name, int in)
{
    ch_module_t *m;
    assert_ch_ok(ch_nn_relu6(g, name, &m));
    return con1(g, m, in);
}

/* global average pool, flatten, Linear(c, 5) named fc */
static void head(ch_module_t *g, int c, int in)
{
    ch_module_t *m;
    assert_ch_ok(ch_nn_adaptive_avgpool2d(g, "pool", &m));
    int v = con1(g, m, in);
    assert_ch_ok(ch_nn_flatten(g, "flatten", &m));
    v = con1(g, m, v);
    assert_ch_ok(ch_nn_linear(g, "fc", c, 5, 1, &m));
    con1(g, m, v);
}

static ch_model_t *new_graph(const char *arch, ch_module_t **g)
{
    ch_model_t *m = NULL;
    assert_ch_ok(ch_model_new(arch, &m));
    assert_ch_ok(ch_nn_graph(ch_model_root(m), "", g));
    return m;
}

static ch_model_t *build_dense(void)
{
    ch_module_t *g, *m;
    ch_model_t *M = new_graph("dense", &g);
    int feats[4], nf = 0;
    char name[64];
    feats[nf++] = conv(g, "conv0", 3, 8, 3, 1, 0, 0);
    for (int i = 0; i < 3; i++) {
        const int c = 8 + 4 * i;
        snprintf(name, sizeof name, "cat%d", i);
        assert_ch_ok(ch_nn_cat(g, name, &m));
        int v = con(g, m, nf, feats);
        snprintf(name, sizeof name, "block.%d.0", i);
        v = bn(g, name, c, v);
        snprintf(name, sizeof name, "block.%d.1", i);
        v = relu(g, name, v);
        snprintf(name, sizeof name, "block.%d.2", i);
        feats[nf++] = conv(g, name, c, 4, 3, 1, 0, v);
    }
    assert_ch_ok(ch_nn_cat(g, "cat_final", &m));
    int v = con(g, m, nf, feats);
    v = bn(g, "norm5", 20, v);
    v = relu(g, "relu5", v);
    head(g, 20, v);
    assert_ch_ok(ch_model_finalize(M, 1));
    return M;
}

static ch_model_t *build_shuffle(void)
{
    ch_module_t *g, *m;
    ch_model_t *M = new_graph("shuffle", &g);
    int v = conv(g, "conv1.0", 3, 16, 3, 1, 0, 0);
    v = bn(g, "conv1.1", 16, v);
    v = relu(g, "conv1.2", v);
    assert_ch_ok(ch_nn_narrow(g, "x1", 0, 8, &m));
    const int x1 = con1(g, m, v);
    assert_ch_ok(ch_nn_narrow(g, "x2", 8, 8, &m));
    int b = con1(g, m, v);
    b = conv(g, "branch2.0", 8, 8, 1, 1, 0, b);
    b = bn(g, "branch2.1", 8, b);
    b = relu(g, "branch2.2", b);
    b = conv(g, "branch2.3", 8, 8, 3, 8, 0, b);
    b = bn(g, "branch2.4", 8, b);
    b = conv(g, "branch2.5", 8, 8, 1, 1, 0, b);
    b = bn(g, "branch2.6", 8, b);
    b = relu(g, "branch2.7", b);
    assert_ch_ok(ch_nn_cat(g, "cat", &m));
    v = con2(g, m, x1, b);
    assert_ch_ok(ch_nn_channel_shuffle(g, "shuffle", 2, &m));
    v = con1(g, m, v);
    head(g, 16, v);
    assert_ch_ok(ch_model_finalize(M, 1));
    return M;
}

static ch_model_t *build_mbv2(void)
{
    ch_module_t *g, *m;
    ch_model_t *M = new_graph("mbv2", &g);
    int x = conv(g, "stem.0", 3, 16, 3, 1, 0, 0);
    x = bn(g, "stem.1", 16, x);
    x = relu6(g, "stem.2", x);
    int h = conv(g, "expand.0", 16, 32, 1, 1, 0, x);
    h = bn(g, "expand.1", 32, h);
    h = relu6(g, "expand.2", h);
    h = conv(g, "dw.0", 32, 32, 3, 32, 0, h);
    h = bn(g, "dw.1", 32, h);
    h = relu6(g, "dw.2", h);
    assert_ch_ok(ch_nn_adaptive_avgpool2d(g, "se_pool", &m));
    int s = con1(g, m, h);
    s = conv(g, "se_fc1", 32, 8, 1, 1, 1, s);
    s = relu(g, "se_relu", s);
    s = conv(g, "se_fc2", 8, 32, 1, 1, 1, s);
    assert_ch_ok(ch_nn_sigmoid(g, "se_sigmoid", &m));
    s = con1(g, m, s);
    assert_ch_ok(ch_nn_mul(g, "se_mul", &m));
    h = con2(g, m, h, s);
    int p = conv(g, "project.0", 32, 16, 1, 1, 0, h);
    p = bn(g, "project.1", 16, p);
    assert_ch_ok(ch_nn_add(g, "add", &m));
    int z = con2(g, m, p, x); /* over p in place: nothing else reads it */
    assert_ch_ok(ch_nn_affine(g, "affine", 0.5f, 1.0f, &m));
    z = con1(g, m, z);
    assert_ch_ok(ch_nn_cat(g, "cat", &m));
    int v = con2(g, m, z, x); /* x's third consumer */
    head(g, 32, v);
    assert_ch_ok(ch_model_finalize(M, 1));
    return M;
}

static ch_model_t *build_inplace(void)
{
    ch_module_t *g, *m;
    ch_model_t *M = new_graph("inplace", &g);
    int b = conv(g, "conv", 3, 8, 3, 1, 0, 0);
    b = bn(g, "bn", 8, b);
    const int r = relu(g, "r", b); /* b is also read by the Add: out of place */
    assert_ch_ok(ch_nn_add(g, "add", &m));
    const int a = con2(g, m, b, r);
    assert_ch_ok(ch_nn_adaptive_avgpool2d(g, "gpool", &m));
    int s = con1(g, m, a);
    s = conv(g, "gate", 8, 8, 1, 1, 1, s);
    assert_ch_ok(ch_nn_sigmoid(g, "gsig", &m));
    s = con1(g, m, s);
    assert_ch_ok(ch_nn_mul(g, "mul", &m));
    int v = con2(g, m, s, a); /* the broadcast operand first */
    v = relu(g, "relu2", v);  /* the Mul's output, read by nothing else: in place */
    head(g, 8, v);
    assert_ch_ok(ch_model_finalize(M, 1));
    return M;
}

static ch_compute_t *make_cx(int plain)
{
    ch_compute_options_t o;
    ch_compute_options_default(&o);
    o.num_threads = 1;
    if (plain) o.cpu_layout = CH_LAYOUT_PLAIN;
    ch_compute_t *cx = NULL;
    assert_ch_ok(ch_compute_create(&o, &cx));
    return cx;
}

/* One training step of net `name` against the golden file. */
static void golden(const char *name, ch_model_t *(*build)(void), int plain)
{
    if (!nt_have_torch()) ch_test_skip("python3-torch not available (HAVE_TORCH != yes)");
    char dir[1024], path[1200], what[200];
    assert_int_equal(nt_run_golden("dag_golden.py", "dag", "", dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, name);
    ch_safetensors_t *st;
    assert_ch_ok(ch_safetensors_open(path, &st));
    ch_model_t *m = build();
    int n = 0;
    ch_nn_view_t *views = nt_golden_sd(st, 128, &n);
    assert_int_equal(n, ch_model_num_entries(m)); /* torch's names in torch's order */
    for (int i = 0; i < n; i++) assert_string_equal(ch_model_entry(m, i)->name, views[i].name);
    assert_ch_ok(ch_model_load_state_dict(m, views, n, 1, NULL, NULL, NULL));
    nt_golden_sd_free(views, n);
    ch_compute_t *cx = make_cx(plain);
    ch_tensor_t x, y;
    nt_golden_batch(st, &x, &y);
    nt_golden_forward_loss(st, m, cx, &x, &y);
    assert_ch_ok(ch_model_backward(m, cx, NULL));
    /* relative to the tensor's largest value, with a floor of 1e-3 of the
     * largest gradient of the net: a BatchNorm whose output feeds a 1x1
     * convolution and another BatchNorm has a bias gradient that is 0 up
     * to rounding (sum over the batch of the next BN's dx), in torch too */
    double gmax = 0.0;
    for (int i = 0; i < ch_model_num_params(m); i++) {
        const ch_param_t *p = ch_model_param(m, i);
        snprintf(what, sizeof what, "grad.%s", p->name);
        float *ref = nt_read_f32(st, what, NULL);
        for (size_t k = 0; k < p->numel; k++) gmax = fmax(gmax, fabs(ref[k]));
        free(ref);
    }
    for (int i = 0; i < ch_model_num_params(m); i++) {
        const ch_param_t *p = ch_model_param(m, i);
        size_t k = 0;
        snprintf(what, sizeof what, "grad.%s", p->name);
        float *ref = nt_read_f32(st, what, &k);
        assert_int_equal(k, p->numel);
        snprintf(what, sizeof what, "%s (%s context): gradient of %s", name,
                 plain ? "plain" : "preferred", p->name);
        double e = nt_rel_err(p->grad, ref, p->numel, 1e-3 * gmax);
        if (!(e <= 1e-4)) fail_msg("%s: relative error %.3g > 1e-4", what, e);
        free(ref);
    }
    ch_tensor_free(&x);
    ch_tensor_free(&y);
    ch_compute_destroy(cx);
    ch_model_destroy(m);
    ch_safetensors_destroy(st);
}

static void test_dense(void **s) { (void)s; golden("dense", build_dense, 0); golden("dense", build_dense, 1); }
static void test_shuffle(void **s) { (void)s; golden("shuffle", build_shuffle, 0); golden("shuffle", build_shuffle, 1); }
static void test_mbv2(void **s) { (void)s; golden("mbv2", build_mbv2, 0); golden("mbv2", build_mbv2, 1); }
static void test_inplace(void **s) { (void)s; golden("inplace", build_inplace, 0); golden("inplace", build_inplace, 1); }

/* The in-place rule from inside: "r" reads bn's output, which the Add
 * reads too: r has a tensor of its own and bn's output keeps its values;
 * relu2 works in place on the Mul's output. */
static void test_inplace_rule(void **state)
{
    (void)state;
    ch_model_t *m = build_inplace();
    ch_compute_t *cx = make_cx(0);
    ch_tensor_t x;
    int64_t s[4] = {2, 3, 6, 5};
    assert_ch_ok(ch_tensor_alloc_f32(&x, 4, s));
    float *xp = x.data;
    for (int64_t i = 0; i < ch_tensor_numel(&x); i++) xp[i] = (float)((i * 37) % 23) / 11.0f - 1.0f;
    const ch_tensor_t *lg;
    assert_ch_ok(ch_model_forward(m, cx, &x, &lg));
    const ch_tensor_t *b = ch_model_activation(m, "bn"), *r = ch_model_activation(m, "r");
    const ch_tensor_t *a = ch_model_activation(m, "mul"), *r2 = ch_model_activation(m, "relu2");
    assert_non_null(b);
    assert_non_null(r);
    assert_true(b->data != r->data);
    assert_true(a->data == r2->data);
    ch_tensor_t bp;
    nt_relayout(cx, b, CH_LAYOUT_PLAIN, &bp);
    int neg = 0;
    for (int64_t i = 0; i < ch_tensor_numel(&bp); i++) neg += ch_tensor_f32(&bp)[i] < 0.0f;
    assert_true(neg > 0); /* not clobbered by the ReLU */
    ch_tensor_free(&bp);
    ch_tensor_free(&x);
    ch_compute_destroy(cx);
    ch_model_destroy(m);
}

/* ch_nn_graph_set_output: nodes after the output (here a ReLU and a
 * Narrow on the conv's output, which a ReLU in place would clobber) run
 * but get no gradient; logits and gradients are those of the graph
 * without them, bitwise. */
static ch_model_t *build_out(int extra)
{
    ch_module_t *g, *m;
    ch_model_t *M = new_graph("out", &g);
    int v = conv(g, "conv", 3, 8, 3, 1, 1, 0);
    v = bn(g, "bn", 8, v);
    head(g, 8, v);
    const int out = ch_module_num_children(g);
    if (extra) {
        relu(g, "dead_relu", v);
        assert_ch_ok(ch_nn_narrow(g, "dead_narrow", 2, 3, &m));
        con1(g, m, v);
        assert_ch_ok(ch_nn_graph_set_output(g, out));
    }
    assert_ch_ok(ch_model_finalize(M, 1));
    return M;
}

static void test_set_output(void **state)
{
    (void)state;
    ch_model_t *a = build_out(0), *b = build_out(1);
    ch_compute_t *cx = make_cx(0);
    ch_tensor_t x, y;
    int64_t s[4] = {2, 3, 5, 4}, ns = 2;
    assert_ch_ok(ch_tensor_alloc_f32(&x, 4, s));
    assert_ch_ok(ch_tensor_alloc(&y, CH_I64, 1, &ns, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    for (int64_t i = 0; i < ch_tensor_numel(&x); i++) ch_tensor_f32(&x)[i] = cosf(0.9f * (float)i);
    ((int64_t *)y.data)[0] = 3;
    ((int64_t *)y.data)[1] = 0;
    const ch_tensor_t *la, *lb;
    assert_ch_ok(ch_model_forward(a, cx, &x, &la));
    assert_ch_ok(ch_model_loss(a, cx, &y, NULL));
    assert_ch_ok(ch_model_backward(a, cx, NULL));
    assert_ch_ok(ch_model_forward(b, cx, &x, &lb));
    assert_ch_ok(ch_model_loss(b, cx, &y, NULL));
    assert_ch_ok(ch_model_backward(b, cx, NULL));
    assert_memory_equal(la->data, lb->data, la->nbytes);
    assert_memory_equal(ch_model_grad_block(a), ch_model_grad_block(b),
                        ch_model_param_numel(a) * sizeof(float));
    /* the dead ReLU did not run in place over bn's output (2 readers) */
    assert_true(ch_model_activation(b, "dead_relu")->data != ch_model_activation(b, "bn")->data);
    ch_tensor_free(&x);
    ch_tensor_free(&y);
    ch_compute_destroy(cx);
    ch_model_destroy(a);
    ch_model_destroy(b);
}

/* A named graph inside the root Sequential (entry names prefixed with the
 * graph's, dots in node names) between two layers: x -> stem -> graph
 * blk {y = x + tanh(conv(x)), x the graph's input} -> pool -> fc. The
 * gradient of stem.weight (through the graph's input gradient, which sums
 * the Add's and the conv's contributions) against central differences. */
static ch_model_t *build_nested(void)
{
    ch_model_t *M = NULL;
    ch_module_t *g, *m, *r;
    assert_ch_ok(ch_model_new("nested", &M));
    r = ch_model_root(M);
    assert_ch_ok(ch_nn_conv2d(r, "stem", 2, 4, 3, 1, 1, 1, NULL));
    assert_ch_ok(ch_nn_graph(r, "blk", &g));
    int v = conv(g, "a.0", 4, 4, 3, 1, 1, 0);
    assert_ch_ok(ch_nn_tanh(g, "a.1", &m)); /* smooth: central differences hold */
    v = con1(g, m, v);
    assert_ch_ok(ch_nn_add(g, "add", &m));
    con2(g, m, 0, v);
    assert_ch_ok(ch_nn_adaptive_avgpool2d(r, "pool", NULL));
    assert_ch_ok(ch_nn_linear(r, "fc", 4, 3, 1, NULL));
    assert_ch_ok(ch_model_finalize(M, 7));
    return M;
}

static double nested_loss(ch_model_t *m, ch_compute_t *cx, const ch_tensor_t *x,
                          const ch_tensor_t *y)
{
    const ch_tensor_t *lg;
    float loss;
    assert_ch_ok(ch_model_forward(m, cx, x, &lg));
    assert_ch_ok(ch_model_loss(m, cx, y, &loss));
    return loss;
}

static void test_nested_graph(void **state)
{
    (void)state;
    ch_model_t *m = build_nested();
    assert_non_null(ch_model_find(m, "blk.a.0.weight"));
    assert_string_equal(ch_model_entry(m, 2)->name, "blk.a.0.weight");
    ch_compute_t *cx = make_cx(1);
    ch_tensor_t x, y;
    int64_t s[4] = {2, 2, 5, 5}, ns = 2;
    assert_ch_ok(ch_tensor_alloc_f32(&x, 4, s));
    assert_ch_ok(ch_tensor_alloc(&y, CH_I64, 1, &ns, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    for (int64_t i = 0; i < ch_tensor_numel(&x); i++) ch_tensor_f32(&x)[i] = sinf(1.3f * (float)i);
    ((int64_t *)y.data)[0] = 2;
    ((int64_t *)y.data)[1] = 1;
    nested_loss(m, cx, &x, &y);
    assert_ch_ok(ch_model_backward(m, cx, NULL));
    ch_param_t *p = ch_model_find(m, "stem.weight");
    float *w = p->data;
    double gmax = 0.0;
    for (size_t i = 0; i < p->numel; i++) gmax = fmax(gmax, fabs(p->grad[i]));
    assert_true(gmax > 1e-4);
    for (size_t i = 0; i < p->numel; i += 7) {
        const float w0 = w[i], h = 1e-2f;
        const double g = p->grad[i];
        ch_model_find(m, "stem.weight"); /* a write of the parameters (nn.h) */
        w[i] = w0 + h;
        const double lp = nested_loss(m, cx, &x, &y);
        ch_model_find(m, "stem.weight");
        w[i] = w0 - h;
        const double lm = nested_loss(m, cx, &x, &y);
        ch_model_find(m, "stem.weight");
        w[i] = w0;
        const double fd = (lp - lm) / (2.0 * h);
        if (fabs(fd - g) > 2e-3 * gmax + 1e-3 * fabs(g))
            fail_msg("stem.weight[%zu]: gradient %.6g, central difference %.6g", i, g, fd);
    }
    ch_tensor_free(&x);
    ch_tensor_free(&y);
    ch_compute_destroy(cx);
    ch_model_destroy(m);
}

/* Add and Mul with operands in different layouts: the model input x
 * (N, 16, H, W) stays plain, conv(x) takes the context's preferred layout
 * (blocked on AVX2 / AVX-512), so add(x, conv(x)), add(conv(x), x) and
 * mul(x, conv(x)) mix layouts there; the same nets in a plain context mix
 * nothing. Logits and gradients agree (to rounding: oneDNN's kernels
 * differ between layouts). */
static ch_model_t *build_mixed(int order)
{
    ch_module_t *g, *m;
    ch_model_t *M = new_graph("mixed", &g);
    const int c = conv(g, "c", 16, 16, 3, 1, 1, 0);
    if (order == 2) assert_ch_ok(ch_nn_mul(g, "join", &m));
    else assert_ch_ok(ch_nn_add(g, "join", &m));
    const int v = order == 1 ? con2(g, m, c, 0) : con2(g, m, 0, c);
    head(g, 16, v);
    assert_ch_ok(ch_model_finalize(M, 3));
    return M;
}

static void test_mixed_layouts(void **state)
{
    (void)state;
    ch_compute_t *cb = make_cx(0), *cp = make_cx(1);
    ch_tensor_t x, y;
    int64_t s[4] = {2, 16, 5, 4}, ns = 2;
    assert_ch_ok(ch_tensor_alloc_f32(&x, 4, s));
    assert_ch_ok(ch_tensor_alloc(&y, CH_I64, 1, &ns, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    for (int64_t i = 0; i < ch_tensor_numel(&x); i++) ch_tensor_f32(&x)[i] = sinf(0.37f * (float)i);
    ((int64_t *)y.data)[0] = 4;
    ((int64_t *)y.data)[1] = 2;
    for (int order = 0; order < 3; order++) {
        ch_model_t *a = build_mixed(order), *b = build_mixed(order);
        const ch_tensor_t *la, *lb;
        assert_ch_ok(ch_model_forward(a, cb, &x, &la));
        assert_ch_ok(ch_model_loss(a, cb, &y, NULL));
        assert_ch_ok(ch_model_backward(a, cb, NULL));
        if (ch_model_activation(a, "c")->layout == CH_LAYOUT_PLAIN) {
            ch_model_destroy(a);
            ch_model_destroy(b);
            ch_tensor_free(&x);
            ch_tensor_free(&y);
            ch_compute_destroy(cb);
            ch_compute_destroy(cp);
            ch_test_skip("this CPU prefers plain activations: no mixed layouts to test");
        }
        assert_ch_ok(ch_model_forward(b, cp, &x, &lb));
        assert_ch_ok(ch_model_loss(b, cp, &y, NULL));
        assert_ch_ok(ch_model_backward(b, cp, NULL));
        nt_assert_close(ch_tensor_f32(la), ch_tensor_f32(lb), (size_t)ch_tensor_numel(la), 1e-5,
                        "logits, mixed vs plain layouts");
        nt_assert_close(ch_model_grad_block(a), ch_model_grad_block(b), ch_model_param_numel(a),
                        1e-5, "gradients, mixed vs plain layouts");
        ch_model_destroy(a);
        ch_model_destroy(b);
    }
    ch_tensor_free(&x);
    ch_tensor_free(&y);
    ch_compute_destroy(cb);
    ch_compute_destroy(cp);
}

/* ------------------------------------------------------------ hook */

typedef struct {
    ch_model_t *m;
    int next; /* parameter index expected next (descending) */
    int calls;
} hook_t;

static ch_status hook(void *arg, ch_param_t *p)
{
    hook_t *h = arg;
    while (h->next >= 0 && !ch_model_param(h->m, h->next)->requires_grad) h->next--;
    if (p->param_index != h->next)
        return CH_ERROR(CH_ERR_INTERNAL, "hook for %s (parameter %d), expected parameter %d",
                        p->name, p->param_index, h->next);
    h->next--;
    h->calls++;
    return CH_OK;
}

static void test_hook_order(void **state)
{
    (void)state;
    ch_model_t *m = build_mbv2();
    assert_ch_ok(ch_model_set_requires_grad(m, "stem.0.weight", 0));
    assert_ch_ok(ch_model_set_requires_grad(m, "se_fc1.bias", 0));
    ch_compute_t *cx = make_cx(0);
    ch_tensor_t x, y;
    int64_t s[4] = {2, 3, 6, 5}, ns = 2;
    assert_ch_ok(ch_tensor_alloc_f32(&x, 4, s));
    assert_ch_ok(ch_tensor_alloc(&y, CH_I64, 1, &ns, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    float *xp = x.data;
    for (int64_t i = 0; i < ch_tensor_numel(&x); i++) xp[i] = (float)((i * 29) % 17) / 8.0f - 1.0f;
    ((int64_t *)y.data)[0] = 1;
    ((int64_t *)y.data)[1] = 4;
    hook_t h = {m, ch_model_num_params(m) - 1, 0};
    ch_model_set_grad_hook(m, hook, &h);
    const ch_tensor_t *lg;
    assert_ch_ok(ch_model_forward(m, cx, &x, &lg));
    assert_ch_ok(ch_model_loss(m, cx, &y, NULL));
    assert_ch_ok(ch_model_backward(m, cx, NULL));
    assert_int_equal(h.calls, ch_model_num_params(m) - 2);
    const ch_param_t *f = ch_model_find(m, "stem.0.weight");
    for (size_t i = 0; i < f->numel; i++) assert_true(f->grad[i] == 0.0f);
    ch_tensor_free(&x);
    ch_tensor_free(&y);
    ch_compute_destroy(cx);
    ch_model_destroy(m);
}

/* ------------------------------------------------------------ trainer */

static ch_status ar_identity(void *ctx, float *d, size_t n)
{
    (void)d;
    (void)n;
    (*(int *)ctx)++;
    return CH_OK;
}

static void test_trainer_features(void **state)
{
    (void)state;
    ch_model_t *a = build_mbv2(), *b = build_mbv2();
    assert_ch_ok(ch_model_init_default(a, 5));
    assert_ch_ok(ch_model_init_default(b, 5));
    int calls = 0, nconv = 0;
    ch_nn_sync_t sync = {ar_identity, NULL, &calls, 0, 1, NULL, NULL, NULL};
    assert_ch_ok(ch_model_convert_sync_bn(b, &sync, &nconv));
    assert_int_equal(nconv, 4);
    assert_int_equal(ch_module_kind(ch_model_find(b, "dw.1.weight")->module), CH_NN_SYNC_BATCHNORM);
    ch_compute_t *cx = make_cx(0);
    ch_tensor_t x, y;
    int64_t s[4] = {3, 3, 6, 5}, ns = 3;
    assert_ch_ok(ch_tensor_alloc_f32(&x, 4, s));
    assert_ch_ok(ch_tensor_alloc(&y, CH_I64, 1, &ns, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    for (int64_t i = 0; i < ch_tensor_numel(&x); i++) ch_tensor_f32(&x)[i] = sinf(0.7f * (float)i);
    for (int i = 0; i < 3; i++) ((int64_t *)y.data)[i] = (2 * i + 1) % 5;
    const ch_tensor_t *la, *lb;
    assert_ch_ok(ch_model_forward(a, cx, &x, &la));
    assert_ch_ok(ch_model_loss(a, cx, &y, NULL));
    assert_ch_ok(ch_model_backward(a, cx, NULL));
    assert_ch_ok(ch_model_forward(b, cx, &x, &lb));
    assert_ch_ok(ch_model_loss(b, cx, &y, NULL));
    assert_ch_ok(ch_model_backward(b, cx, NULL));
    assert_int_equal(calls, 4 + 4); /* a gather per BN forward, a sum per BN backward */
    nt_assert_close(ch_tensor_f32(lb), ch_tensor_f32(la), (size_t)ch_tensor_numel(la), 1e-5, "logits");
    nt_assert_close(ch_model_grad_block(b), ch_model_grad_block(a), ch_model_param_numel(a), 1e-4,
                    "gradients");
    /* eval mode: running statistics, no gathers */
    ch_model_train(b, 0);
    assert_ch_ok(ch_model_forward(b, cx, &x, &lb));
    assert_int_equal(calls, 8);
    for (int64_t i = 0; i < ch_tensor_numel(lb); i++) assert_true(isfinite(ch_tensor_f32(lb)[i]));
    assert_int_equal(*(int64_t *)ch_model_find(b, "stem.1.num_batches_tracked")->data, 1);
    /* the model file loads into torch's module (strict) */
    if (nt_have_torch()) {
        char path[1200], dir[1024];
        assert_int_equal(nt_run_golden("dag_golden.py", "dag", "", dir, sizeof dir), 0);
        snprintf(path, sizeof path, "%s/mbv2_cohort.pth", dir);
        assert_ch_ok(ch_train_state_write_model(b, path));
        assert_int_equal(nt_run_golden("dag_golden.py", "dag", "load-mbv2 mbv2_cohort.pth", dir,
                                       sizeof dir), 0);
    }
    ch_tensor_free(&x);
    ch_tensor_free(&y);
    ch_compute_destroy(cx);
    ch_model_destroy(a);
    ch_model_destroy(b);
}

/* ------------------------------------------------------------ ops */

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

static void same_bits(ch_compute_t *cx, const char *what, const ch_tensor_t *a,
                      const ch_tensor_t *ref)
{
    ch_tensor_t p;
    nt_relayout(cx, a, CH_LAYOUT_PLAIN, &p);
    assert_int_equal(p.nbytes, ref->nbytes);
    if (memcmp(p.data, ref->data, ref->nbytes)) fail_msg("%s differs from the reference", what);
    ch_tensor_free(&p);
}

/* Every graph op with tensors in layout l against plain loops. */
static void ops_case(ch_compute_t *cx, ch_layout_t l, int N, int C, int H, int W)
{
    const int64_t HW = (int64_t)H * W;
    ch_tensor_t a, b, s1, dy, al, bl, dyl;
    fill(&a, N, C, H, W, 1);
    fill(&b, N, C, H, W, 2);
    fill(&s1, 1, C, 1, 1, 3); /* (1, C, 1, 1): broadcast over N, H, W */
    fill(&dy, N, C, H, W, 4);
    nt_relayout(cx, &a, l, &al);
    nt_relayout(cx, &b, l, &bl);
    nt_relayout(cx, &dy, l, &dyl);
    const float *ap = a.data, *bp = b.data, *sp = s1.data, *dp = dy.data;
    ch_tensor_t y, ref, da, db, ds, rs;
    assert_ch_ok(ch_tensor_alloc(&y, CH_F32, 4, a.shape, l, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&da, CH_F32, 4, a.shape, l, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&db, CH_F32, 4, a.shape, l, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc_f32(&ref, 4, a.shape));
    assert_ch_ok(ch_tensor_alloc_f32(&ds, 4, s1.shape));
    assert_ch_ok(ch_tensor_alloc_f32(&rs, 4, s1.shape));
    float *rp = ref.data, *rsp = rs.data;
    /* mul of one shape (a plain, b in l) and its backward */
    assert_ch_ok(ch_op_binary(cx, CH_BINARY_MUL, &a, &bl, &y));
    for (int64_t i = 0; i < ch_tensor_numel(&a); i++) rp[i] = ap[i] * bp[i];
    same_bits(cx, "mul", &y, &ref);
    assert_ch_ok(ch_op_binary_backward(cx, CH_BINARY_MUL, &al, &bl, &dyl, &da, &db));
    for (int64_t i = 0; i < ch_tensor_numel(&a); i++) rp[i] = dp[i] * bp[i];
    same_bits(cx, "mul da", &da, &ref);
    for (int64_t i = 0; i < ch_tensor_numel(&a); i++) rp[i] = dp[i] * ap[i];
    same_bits(cx, "mul db", &db, &ref);
    /* add / mul with a (1, C, 1, 1) operand */
    for (int op = 0; op < 2; op++) {
        assert_ch_ok(ch_op_binary(cx, (ch_binary_op_t)op, &al, &s1, &y));
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++)
                for (int64_t i = 0; i < HW; i++) {
                    const int64_t k = (n * C + c) * HW + i;
                    rp[k] = op ? ap[k] * sp[c] : ap[k] + sp[c];
                }
        same_bits(cx, op ? "mul (1,C,1,1)" : "add (1,C,1,1)", &y, &ref);
        assert_ch_ok(ch_op_binary_backward(cx, (ch_binary_op_t)op, &al, &s1, &dyl, NULL, &ds));
        for (int64_t c = 0; c < C; c++) {
            float acc = 0.0f;
            for (int64_t n = 0; n < N; n++)
                for (int64_t i = 0; i < HW; i++) {
                    const int64_t k = (n * C + c) * HW + i;
                    acc += op ? dp[k] * ap[k] : dp[k];
                }
            rsp[c] = acc;
        }
        assert_memory_equal(ds.data, rs.data, rs.nbytes);
    }
    /* channel shuffle with 2 groups and back */
    assert_ch_ok(ch_op_channel_shuffle(cx, &al, 2, &y));
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < C; j++)
            for (int64_t i = 0; i < HW; i++)
                rp[(n * C + j) * HW + i] = ap[(n * C + (j % 2) * (C / 2) + j / 2) * HW + i];
    same_bits(cx, "channel_shuffle", &y, &ref);
    assert_ch_ok(ch_op_channel_shuffle(cx, &y, C / 2, &da));
    same_bits(cx, "channel_shuffle inverse", &da, &a);
    /* affine */
    assert_ch_ok(ch_op_affine(cx, &al, 0.5f, 1.0f, &y));
    for (int64_t i = 0; i < ch_tensor_numel(&a); i++) rp[i] = 0.5f * ap[i] + 1.0f;
    same_bits(cx, "affine", &y, &ref);
    /* narrow: channels [C/2, C) of a into a (N, C/2) plain tensor */
    ch_tensor_t half;
    int64_t hs[4] = {N, C / 2, H, W};
    assert_ch_ok(ch_tensor_alloc_f32(&half, 4, hs));
    assert_ch_ok(ch_op_copy_channels(cx, &al, C / 2, &half, 0, C / 2));
    for (int64_t n = 0; n < N; n++)
        assert_memory_equal(ch_tensor_f32(&half) + n * (C / 2) * HW, ap + (n * C + C / 2) * HW,
                            (size_t)(C / 2 * HW) * sizeof(float));
    ch_tensor_t *all[] = {&a, &b, &s1, &dy, &al, &bl, &dyl, &y, &ref, &da, &db, &ds, &rs, &half};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ch_tensor_free(all[i]);
}

static void test_ops_layouts(void **state)
{
    (void)state;
    const ch_layout_t L[4] = {CH_LAYOUT_PLAIN, CH_LAYOUT_NHWC, CH_LAYOUT_NCHW8C, CH_LAYOUT_NCHW16C};
    ch_compute_t *cx = nt_make_cx(1);
    for (int i = 0; i < 4; i++) ops_case(cx, L[i], 2, 32, 5, 3);
    ch_compute_destroy(cx);
}

/* The ops on 1 and 2 threads on tensors above the parallel threshold:
 * bitwise the plain reference on both (each (n, c) plane or channel sum is
 * one thread's). */
static void test_threads_bitwise(void **state)
{
    (void)state;
    ch_compute_t *c1 = nt_make_cx(1), *c2 = nt_make_cx(2);
    ops_case(c1, CH_LAYOUT_NCHW16C, 4, 64, 32, 32);
    ops_case(c2, CH_LAYOUT_NCHW16C, 4, 64, 32, 32);
    ops_case(c2, CH_LAYOUT_PLAIN, 4, 64, 32, 32);
    ch_compute_destroy(c1);
    ch_compute_destroy(c2);
}

/* ------------------------------------------------------------ errors */

static void test_errors(void **state)
{
    (void)state;
    ch_model_t *M;
    ch_module_t *g, *m, *c;
    /* an input id >= the node's own id */
    M = new_graph("err", &g);
    assert_ch_ok(ch_nn_relu(g, "a", &m));
    int bad = 1;
    assert_ch_error(ch_nn_graph_connect(g, m, &bad, 1), CH_ERR_INVALID, "reads value 1");
    /* wrong input counts */
    assert_ch_ok(ch_nn_graph_connect(g, m, (int[]){0}, 1));
    assert_ch_ok(ch_nn_add(g, "add", &m));
    assert_ch_error(ch_nn_graph_connect(g, m, (int[]){0}, 1), CH_ERR_INVALID, "takes 2 inputs");
    assert_ch_ok(ch_nn_relu(g, "b", &c));
    assert_ch_error(ch_nn_graph_connect(g, c, (int[]){0, 1}, 2), CH_ERR_INVALID, "takes 1 input");
    /* a node never connected (add) */
    assert_ch_ok(ch_nn_graph_connect(g, c, (int[]){1}, 1));
    assert_ch_error(ch_model_finalize(M, 1), CH_ERR_INVALID, "'add' (value 2) is never connected");
    ch_model_destroy(M);
    /* Add and Cat outside a graph */
    assert_ch_ok(ch_model_new("err", &M));
    assert_ch_error(ch_nn_add(ch_model_root(M), "add", NULL), CH_ERR_INVALID, "needs a graph");
    /* "" only for a graph under the root */
    assert_ch_error(ch_nn_relu(ch_model_root(M), "", NULL), CH_ERR_INVALID, "non-empty name");
    ch_model_destroy(M);
    /* shape mismatches at plan */
    ch_compute_t *cx = nt_make_cx(1);
    int64_t s[4] = {2, 3, 6, 6};
    for (int k = 0; k < 2; k++) {
        M = new_graph("err", &g);
        int a = conv(g, "c1", 3, 8, 3, 1, 0, 0);
        ch_conv2d_options_t o;
        ch_conv2d_options_default(&o, 3, k ? 4 : 6, 3);
        o.stride_h = o.stride_w = 2;
        assert_ch_ok(ch_nn_conv2d_ex(g, "c2", &o, &m));
        int b = con1(g, m, 0);
        if (k == 0) assert_ch_ok(ch_nn_add(g, "join", &m));
        else assert_ch_ok(ch_nn_cat(g, "join", &m));
        con2(g, m, a, b);
        head(g, k ? 12 : 8, ch_module_num_children(g));
        assert_ch_ok(ch_model_finalize(M, 1));
        assert_ch_error(ch_model_plan(M, cx, s, CH_LAYOUT_PLAIN, NULL), CH_ERR_INVALID,
                        k ? "Cat 'join': input 1 (value 2) is [2, 4, 2, 2]"
                          : "Add 'join': operands [2, 8, 6, 6]");
        if (k == 0) assert_non_null(strstr(ch_error_message(), "[2, 6, 2, 2]"));
        else assert_non_null(strstr(ch_error_message(), "[2, 8, 6, 6]"));
        ch_model_destroy(M);
    }
    ch_compute_destroy(cx);
    /* an empty dotted component */
    M = new_graph("err", &g);
    assert_ch_error(ch_nn_relu(g, "a..b", NULL), CH_ERR_INVALID, "empty dotted component");
    ch_model_destroy(M);
}

static void test_model_gpu(void **state)
{
    (void)state;
    GT_NEED_GPU();
    const int64_t xs[4] = {4, 3, 9, 7};
    ch_model_t *(*nets[4])(void) = {build_dense, build_shuffle, build_mbv2, build_inplace};
    for (int i = 0; i < 4; i++) nt_gpu_step_vs_cpu(nets[i](), nets[i](), xs, 5, 1e-4);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense),
        cmocka_unit_test(test_shuffle),
        cmocka_unit_test(test_mbv2),
        cmocka_unit_test(test_inplace),
        cmocka_unit_test(test_inplace_rule),
        cmocka_unit_test(test_set_output),
        cmocka_unit_test(test_nested_graph),
        cmocka_unit_test(test_mixed_layouts),
        cmocka_unit_test(test_hook_order),
        cmocka_unit_test(test_trainer_features),
        cmocka_unit_test(test_ops_layouts),
        cmocka_unit_test(test_threads_bitwise),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_model_gpu),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
