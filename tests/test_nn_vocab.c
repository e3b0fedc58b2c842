/* Tests for Flatten, Dropout and Identity (framework/nn), PyTorch's default
 * init (ch_model_init_default), automatic Sequential names and the model
 * registry (models.h): a training step of the example CNN and of an MLP
 * against PyTorch with cohort's dropout mask re-implemented in the golden
 * script (tests/golden/vocab_golden.py), the mask's statistics and its
 * independence of threads and world size, init distributions vs torch's. */
#include "config.h"

#include "tests/nn_testutil.h"

#include "framework/nn/nn.h"
#include "framework/nn/nn_exec.h"
#include "framework/ops/ops.h"
#include "models/models.h"

/* The twins of vocab_golden.py's net() and mlp(), every name automatic. */
static ch_status build_cnn(ch_module_t *r, const ch_model_options_t *o, void *arg)
{
    (void)arg;
    for (int i = 0, c = o->in_channels; i < 2; i++, c = 8) {
        CH_TRY(ch_nn_conv2d(r, NULL, c, 8 << i, 3, 1, 1, 1, NULL));
        CH_TRY(ch_nn_batchnorm2d(r, NULL, 8 << i, NULL));
        CH_TRY(ch_nn_relu(r, NULL, NULL));
        CH_TRY(ch_nn_maxpool2d(r, NULL, 2, 2, 0, NULL));
    }
    CH_TRY(ch_nn_flatten(r, NULL, NULL));
    CH_TRY(ch_nn_dropout(r, NULL, 0.5f, NULL));
    CH_TRY(ch_nn_linear(r, NULL, 16 * 3 * 3, 32, 1, NULL));
    CH_TRY(ch_nn_relu(r, NULL, NULL));
    CH_TRY(ch_nn_identity(r, NULL, NULL));
    return ch_nn_linear(r, NULL, 32, o->num_classes, 1, NULL);
}

static ch_status build_mlp(ch_module_t *r, const ch_model_options_t *o, void *arg)
{
    (void)arg;
    CH_TRY(ch_nn_flatten(r, NULL, NULL));
    CH_TRY(ch_nn_linear(r, NULL, 144, 32, 1, NULL));
    CH_TRY(ch_nn_relu(r, NULL, NULL));
    CH_TRY(ch_nn_dropout(r, NULL, 0.25f, NULL));
    return ch_nn_linear(r, NULL, 32, o->num_classes, 1, NULL);
}

static void register_once(void)
{
    static int done;
    if (done) return;
    assert_ch_ok(ch_model_register("t_cnn", build_cnn, NULL));
    assert_ch_ok(ch_model_register("t_mlp", build_mlp, NULL));
    done = 1;
}

static ch_model_t *make(const char *arch, uint64_t seed)
{
    register_once();
    return nt_model_1x10(arch, seed);
}

/* One training step of net (cnn / mlp) vs PyTorch with the same mask. */
static void golden(const char *net)
{
    if (!nt_have_torch()) ch_test_skip("python3-torch not available (HAVE_TORCH != yes)");
    char dir[1024], path[1200], line[256];
    assert_int_equal(nt_run_golden("vocab_golden.py", "vocab", "step", dir, sizeof dir), 0);
    char arch[32];
    snprintf(arch, sizeof arch, "t_%s", net);
    ch_model_t *m = make(arch, 3);
    /* automatic names: exactly nn.Sequential's state_dict() keys, in order */
    snprintf(path, sizeof path, "%s/vocab_%s_keys.txt", dir, net);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int i = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        assert_true(i < ch_model_num_entries(m));
        assert_string_equal(ch_model_entry(m, i)->name, line);
        i++;
    }
    fclose(f);
    assert_int_equal(i, ch_model_num_entries(m));

    snprintf(path, sizeof path, "%s/vocab_%s.safetensors", dir, net);
    ch_safetensors_t *st;
    assert_ch_ok(ch_safetensors_open(path, &st));
    int k = 0;
    ch_nn_view_t *views = nt_golden_sd(st, ch_model_num_entries(m), &k);
    assert_ch_ok(ch_model_load_state_dict(m, views, k, 1, NULL, NULL, NULL));
    nt_golden_sd_free(views, k);
    ch_tensor_t x, y;
    nt_golden_batch(st, &x, &y);
    ch_compute_t *cx = nt_make_cx(1);
    const ch_tensor_t *logits;
    assert_ch_ok(ch_model_set_dropout_key(m, 7, 3, 5, 2));
    nt_golden_forward_loss(st, m, cx, &x, &y);
    assert_ch_ok(ch_model_backward(m, cx, NULL));
    for (int j = 0; j < ch_model_num_params(m); j++) {
        ch_param_t *p = ch_model_param(m, j);
        char name[300], what[300];
        snprintf(name, sizeof name, "grad.%s", p->name);
        snprintf(what, sizeof what, "%s: gradient of %s", net, p->name);
        float *gr = nt_read_f32(st, name, NULL);
        if (ch_module_kind(p->module) == CH_NN_CONV2D && !strcmp(p->local, "bias")) {
            /* a conv bias before BatchNorm: gradient 0 up to rounding in both */
            for (size_t q = 0; q < p->numel; q++)
                if (!(fabsf(p->grad[q]) < 1e-6f && fabsf(gr[q]) < 1e-6f))
                    fail_msg("%s: %g (torch %g), expected ~0", what, (double)p->grad[q], (double)gr[q]);
        } else {
            nt_assert_close(p->grad, gr, p->numel, 1e-3, what);
        }
        free(gr);
    }
    ch_model_train(m, 0);
    assert_ch_ok(ch_model_forward(m, cx, &x, &logits));
    float *ref = nt_read_f32(st, "eval_logits", NULL);
    nt_assert_close(ch_tensor_f32(logits), ref, (size_t)ch_tensor_numel(logits), 1e-4,
                    "eval logits (Dropout the identity)");
    free(ref);
    ch_compute_destroy(cx);
    ch_tensor_free(&x);
    ch_tensor_free(&y);
    ch_safetensors_destroy(st);
    ch_model_destroy(m);
}

static void test_golden_cnn(void **state) { golden("cnn"); }
static void test_golden_mlp(void **state) { golden("mlp"); }

/* ch_op_dropout: statistics, exact scaling, p = 0 / 1, thread counts,
 * world size (two "ranks" with stride 2 draw the rows of one), keys. */
static void test_dropout_op(void **state)
{
    enum { N = 64, F = 4096 };
    int64_t sh[2] = {N, F};
    ch_tensor_t x, y, z;
    assert_ch_ok(ch_tensor_alloc_f32(&x, 2, sh));
    assert_ch_ok(ch_tensor_alloc_f32(&y, 2, sh));
    assert_ch_ok(ch_tensor_alloc_f32(&z, 2, sh));
    float *X = ch_tensor_f32(&x), *Y = ch_tensor_f32(&y), *Z = ch_tensor_f32(&z);
    for (int64_t i = 0; i < (int64_t)N * F; i++) X[i] = 0.5f + sinf(0.001f * (float)i);
    ch_compute_t *cx1 = nt_make_cx(1), *cx3 = nt_make_cx(3);
    const float ps[] = {0.1f, 0.5f, 0.9f};
    for (int t = 0; t < 3; t++) {
        const float p = ps[t], scale = 1.0f / (float)(1.0 - (double)p);
        ch_dropout_key_t k = {11, 2, 4, 0, 1};
        assert_ch_ok(ch_op_dropout(cx1, &x, p, &k, &y));
        double zeros = 0;
        for (int64_t i = 0; i < (int64_t)N * F; i++) {
            if (Y[i] == 0.0f) zeros++;
            else if (Y[i] != X[i] * scale) fail_msg("p %g: kept value %g != %g * %g", (double)p, (double)Y[i], (double)X[i], (double)scale);
        }
        const double n = (double)N * F, frac = zeros / n, sd = sqrt(p * (1 - p) / n);
        if (fabs(frac - p) > 5 * sd) fail_msg("p %g: dropped fraction %.5f (5 sigma %.5f)", (double)p, frac, 5 * sd);
        /* 3 threads: the same bits */
        assert_ch_ok(ch_op_dropout(cx3, &x, p, &k, &z));
        assert_memory_equal(Y, Z, (size_t)N * F * sizeof(float));
        /* world size 2: rank r's local row i is global sample r + 2 i */
        for (int r = 0; r < 2; r++) {
            int64_t hs[2] = {N / 2, F};
            ch_tensor_t xr, yr;
            assert_ch_ok(ch_tensor_alloc_f32(&xr, 2, hs));
            assert_ch_ok(ch_tensor_alloc_f32(&yr, 2, hs));
            for (int i = 0; i < N / 2; i++)
                memcpy(ch_tensor_f32(&xr) + (int64_t)i * F, X + (int64_t)(r + 2 * i) * F, F * sizeof(float));
            ch_dropout_key_t kr = {11, 2, 4, r, 2};
            assert_ch_ok(ch_op_dropout(cx1, &xr, p, &kr, &yr));
            for (int i = 0; i < N / 2; i++)
                assert_memory_equal(ch_tensor_f32(&yr) + (int64_t)i * F, Y + (int64_t)(r + 2 * i) * F,
                                    F * sizeof(float));
            ch_tensor_free(&xr);
            ch_tensor_free(&yr);
        }
        /* another epoch or layer: another mask */
        ch_dropout_key_t k2 = k;
        k2.epoch = 5;
        assert_ch_ok(ch_op_dropout(cx1, &x, p, &k2, &z));
        assert_true(memcmp(Y, Z, (size_t)N * F * sizeof(float)) != 0);
        k2 = k;
        k2.stream = 3;
        assert_ch_ok(ch_op_dropout(cx1, &x, p, &k2, &z));
        assert_true(memcmp(Y, Z, (size_t)N * F * sizeof(float)) != 0);
    }
    ch_dropout_key_t k = {1, 0, 0, 0, 1};
    assert_ch_ok(ch_op_dropout(cx1, &x, 0.0f, &k, &y));
    assert_memory_equal(X, Y, (size_t)N * F * sizeof(float));
    assert_ch_ok(ch_op_dropout(cx1, &x, 1.0f, &k, &y));
    for (int64_t i = 0; i < (int64_t)N * F; i++) assert_true(Y[i] == 0.0f);
    assert_ch_error(ch_op_dropout(cx1, &x, 1.5f, &k, &y), CH_ERR_INVALID, "p = 1.5");
    k.sample_stride = 0;
    assert_ch_error(ch_op_dropout(cx1, &x, 0.5f, &k, &y), CH_ERR_INVALID, "sample_stride 0");
    ch_compute_destroy(cx1);
    ch_compute_destroy(cx3);
    ch_tensor_free(&x);
    ch_tensor_free(&y);
    ch_tensor_free(&z);
}

/* The Dropout module: backward zeroes exactly the forward's dropped
 * elements and scales the rest; eval mode is the identity. */
static void test_dropout_module(void **state)
{
    ch_model_t *m = NULL;
    assert_ch_ok(ch_model_new("drop", &m));
    ch_module_t *r = ch_model_root(m);
    assert_ch_ok(ch_nn_flatten(r, NULL, NULL));
    assert_ch_ok(ch_nn_linear(r, NULL, 64, 256, 1, NULL));
    assert_ch_ok(ch_nn_dropout(r, NULL, 0.3f, NULL));
    assert_ch_ok(ch_nn_linear(r, NULL, 256, 5, 1, NULL));
    assert_ch_error(ch_nn_dropout(r, "x", -0.1f, NULL), CH_ERR_INVALID, "p = -0.1");
    assert_ch_ok(ch_model_finalize_init(m, CH_NN_INIT_DEFAULT, 1));
    int64_t xs[4] = {8, 1, 8, 8}, ys[1] = {8};
    ch_tensor_t x, y;
    assert_ch_ok(ch_tensor_alloc_f32(&x, 4, xs));
    assert_ch_ok(ch_tensor_alloc(&y, CH_I64, 1, ys, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    for (int i = 0; i < 8 * 64; i++) ch_tensor_f32(&x)[i] = cosf(0.3f * (float)i);
    for (int i = 0; i < 8; i++) ch_tensor_i64(&y)[i] = i % 5;
    ch_compute_t *cx = nt_make_cx(1);
    const ch_tensor_t *logits;
    ch_model_train(m, 1);
    assert_ch_ok(ch_model_set_dropout_key(m, 9, 1, 0, 1));
    assert_ch_ok(ch_model_forward(m, cx, &x, &logits));
    const ch_tensor_t *h = ch_model_activation(m, "1"), *d = ch_model_activation(m, "2");
    assert_non_null(h);
    assert_non_null(d);
    int dropped = 0;
    for (int64_t i = 0; i < 8 * 256; i++) {
        float a = ch_tensor_f32(h)[i], b = ch_tensor_f32(d)[i];
        if (b == 0.0f && a != 0.0f) dropped++;
        else assert_true(b == a * (1.0f / (float)(1.0 - (double)0.3f)));
    }
    assert_true(dropped > 8 * 256 / 5 && dropped < 8 * 256 * 2 / 5);
    assert_ch_ok(ch_model_loss(m, cx, &y, NULL));
    assert_ch_ok(ch_model_backward(m, cx, NULL));
    /* the last Linear's weight gradient sees the dropped inputs as 0: a
     * column of zeros for every hidden unit dropped in all 8 samples is too
     * rare to test; instead the first Linear's bias gradient is the sum of
     * the masked upstream gradient: recompute it from fc2's weight */
    ch_param_t *w2 = ch_model_find(m, "3.weight"), *b1 = ch_model_find(m, "1.bias");
    ch_param_t *b2 = ch_model_find(m, "3.bias");
    assert_non_null(w2);
    assert_non_null(b1);
    float dl[8 * 5];
    /* dlogits = (softmax - onehot) / N: rebuild from the logits */
    for (int s = 0; s < 8; s++) {
        double mx = -1e30, sum = 0;
        for (int c = 0; c < 5; c++) mx = fmax(mx, ch_tensor_f32(logits)[s * 5 + c]);
        for (int c = 0; c < 5; c++) sum += exp(ch_tensor_f32(logits)[s * 5 + c] - mx);
        for (int c = 0; c < 5; c++)
            dl[s * 5 + c] = (float)((exp(ch_tensor_f32(logits)[s * 5 + c] - mx) / sum -
                                     (c == s % 5)) / 8.0);
    }
    for (int c = 0; c < 5; c++) {
        double g = 0;
        for (int s = 0; s < 8; s++) g += dl[s * 5 + c];
        assert_true(fabs(g - b2->grad[c]) < 1e-5);
    }
    for (int u = 0; u < 256; u++) {
        double g = 0;
        for (int s = 0; s < 8; s++) {
            double dh = 0;
            for (int c = 0; c < 5; c++) dh += dl[s * 5 + c] * ((float *)w2->data)[c * 256 + u];
            float a = ch_tensor_f32(h)[s * 256 + u], b = ch_tensor_f32(d)[s * 256 + u];
            g += (b == 0.0f && a != 0.0f) ? 0.0 : dh / 0.7;
        }
        if (fabs(g - b1->grad[u]) > 1e-5) fail_msg("1.bias grad[%d] %g vs the mask's %g", u, (double)b1->grad[u], g);
    }
    /* eval: the identity */
    ch_model_train(m, 0);
    assert_ch_ok(ch_model_forward(m, cx, &x, &logits));
    h = ch_model_activation(m, "1");
    d = ch_model_activation(m, "2");
    assert_memory_equal(ch_tensor_f32(h), ch_tensor_f32(d), 8 * 256 * sizeof(float));
    assert_ch_error(ch_model_set_dropout_key(m, 0, 0, -1, 1), CH_ERR_INVALID, "sample_base -1");
    ch_compute_destroy(cx);
    ch_tensor_free(&x);
    ch_tensor_free(&y);
    ch_model_destroy(m);
}

/* PyTorch's default init: bounds and spread as torch's own draws
 * (vocab_golden.py initstats), BN 1/0, the same bits for the same seed. */
static void test_default_init(void **state)
{
    ch_model_t *a = make("t_cnn", 5), *b = make("t_cnn", 5), *c = make("t_cnn", 6);
    assert_memory_equal(ch_model_param_block(a), ch_model_param_block(b),
                        ch_model_param_numel(a) * sizeof(float));
    assert_true(memcmp(ch_model_param_block(a), ch_model_param_block(c),
                       ch_model_param_numel(a) * sizeof(float)) != 0);
    for (int i = 0; i < ch_model_num_entries(a); i++) {
        ch_param_t *p = ch_model_entry(a, i);
        if (p->dtype != CH_F32) continue;
        const float *v = p->data;
        double bound = 0;
        if (ch_module_kind(p->module) == CH_NN_CONV2D || ch_module_kind(p->module) == CH_NN_LINEAR) {
            ch_param_t *w = ch_model_entry(a, p->index - (strstr(p->name, "bias") ? 1 : 0));
            size_t fan_in = w->numel / (size_t)w->shape[0];
            bound = 1.0 / sqrt((double)fan_in);
            double s2 = 0;
            for (size_t k = 0; k < p->numel; k++) {
                assert_true(fabs(v[k]) <= bound);
                s2 += (double)v[k] * v[k];
            }
            /* U(-b, b): std b / sqrt(3) */
            double sd = sqrt(s2 / (double)p->numel), want = bound / sqrt(3.0);
            double tol = 4 * want / sqrt(2.0 * (double)p->numel) + 0.02 * want;
            if (fabs(sd - want) > tol) fail_msg("%s: std %g, expected %g", p->name, sd, want);
        } else {
            float want = strstr(p->name, "weight") || strstr(p->name, "running_var") ? 1.0f : 0.0f;
            for (size_t k = 0; k < p->numel; k++) assert_true(v[k] == want);
        }
    }
    if (nt_have_torch()) {
        char dir[1024], path[1200], name[200];
        assert_int_equal(nt_run_golden("vocab_golden.py", "vocab", "initstats", dir, sizeof dir), 0);
        snprintf(path, sizeof path, "%s/vocab_initstats.txt", dir);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        double mx, sd;
        int n = 0;
        while (fscanf(f, "%199s %lf %lf", name, &mx, &sd) == 3) {
            ch_param_t *p = ch_model_find(a, name);
            assert_non_null(p);
            n++;
            if (p->dtype != CH_F32 || sd == 0) continue;
            /* torch's largest |v| over 10 draws is just below the bound */
            size_t fan = p->numel;
            ch_param_t *w = ch_model_entry(a, p->index - (strstr(p->name, "bias") ? 1 : 0));
            fan = w->numel / (size_t)w->shape[0];
            if (fabs(mx - 1.0 / sqrt((double)fan)) > 0.02 / sqrt((double)fan))
                fail_msg("%s: torch's max %g vs bound 1/sqrt(%zu)", name, mx, fan);
            if (fabs(sd - 1.0 / sqrt(3.0 * (double)fan)) > 0.1 / sqrt((double)fan))
                fail_msg("%s: torch's std %g vs ours 1/sqrt(3 * %zu)", name, sd, fan);
        }
        fclose(f);
        assert_int_equal(n, ch_model_num_entries(a));
    }
    /* the built-in networks keep torchvision's ResNet init (normal conv weights) */
    ch_model_t *r = make("smallcnn", 0);
    ch_param_t *w = ch_model_find(r, "conv2.weight");
    double bound = 1.0 / sqrt(16.0 * 9.0), beyond = 0;
    for (size_t k = 0; k < w->numel; k++) beyond += fabs(((float *)w->data)[k]) > bound;
    assert_true(beyond > 0);
    ch_model_destroy(r);
    ch_model_destroy(a);
    ch_model_destroy(b);
    ch_model_destroy(c);
}

static ch_status build_fail(ch_module_t *r, const ch_model_options_t *o, void *arg)
{
    (void)o;
    (void)arg;
    return ch_nn_linear(r, NULL, 0, 3, 1, NULL);
}

/* The registry: names, errors. */
static void test_registry(void **state)
{
    register_once();
    int seen = 0;
    for (const char *const *p = ch_model_names(); *p; p++) seen += !strcmp(*p, "t_cnn");
    assert_int_equal(seen, 1);
    assert_ch_error(ch_model_register("t_cnn", build_cnn, NULL), CH_ERR_INVALID, "already taken");
    assert_ch_error(ch_model_register("resnet18", build_cnn, NULL), CH_ERR_INVALID, "already taken");
    assert_ch_error(ch_model_register("a b", build_cnn, NULL), CH_ERR_INVALID, "'a b'");
    assert_ch_error(ch_model_register("x", NULL, NULL), CH_ERR_INVALID, "builder");
    assert_ch_ok(ch_model_register("t_fail", build_fail, NULL));
    ch_model_t *m = NULL;
    assert_ch_error(ch_model_create("t_fail", NULL, &m), CH_ERR_INVALID, "t_fail");
    assert_null(m);
    assert_ch_error(ch_model_create("nope", NULL, &m), CH_ERR_INVALID, "t_cnn");
    m = make("t_cnn", 0);
    assert_string_equal(ch_model_arch(m), "t_cnn");
    assert_non_null(ch_model_find(m, "13.bias"));
    ch_model_destroy(m);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_cnn),   cmocka_unit_test(test_golden_mlp),
        cmocka_unit_test(test_dropout_op),   cmocka_unit_test(test_dropout_module),
        cmocka_unit_test(test_default_init), cmocka_unit_test(test_registry),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
