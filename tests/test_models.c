/* Tests for models/ (ResNets, small CNN, registry) and the state-dict side of
 * framework/nn: names and order against torchvision, initialisation
 * statistics, pretrained loading with the element-count filter, freezing. */
#include "config.h"

#include "tests/nn_testutil.h"

#include "framework/nn/nn.h"
#include "models/models.h"

static ch_model_t *make(const char *arch, int in_ch, int classes)
{
    ch_model_options_t o;
    ch_model_options_default(&o);
    o.in_channels = in_ch;
    o.num_classes = classes;
    ch_model_t *m = NULL;
    assert_ch_ok(ch_model_create(arch, &o, &m));
    return m;
}

static void test_registry(void **state)
{
    ch_model_t *m = NULL;
    assert_ch_error(ch_model_create("resnet19", NULL, &m), CH_ERR_INVALID, "resnet18, resnet34");
    assert_null(m);
    ch_model_options_t o;
    ch_model_options_default(&o);
    assert_int_equal(o.num_classes, 1000);
    assert_int_equal(o.in_channels, 3);
    o.num_classes = 0;
    assert_ch_error(ch_model_create("resnet18", &o, &m), CH_ERR_INVALID, "num_classes = 0");
    int n = 0;
    for (const char *const *p = ch_model_names(); *p; p++, n++) {
        m = make(*p, 3, 7);
        assert_string_equal(ch_model_arch(m), *p);
        ch_param_t *fc = ch_model_find(m, "fc.bias");
        assert_non_null(fc);
        assert_int_equal(fc->numel, 7);
        ch_model_destroy(m);
    }
    assert_int_equal(n, 4);
    /* resnet18 parameter count as torchvision (11,689,512 with 3 channels, 1000 classes) */
    m = make("resnet18", 3, 1000);
    assert_int_equal(ch_model_param_numel(m), 11689512);
    /* blocks: parameters, float buffers and counters are contiguous in order */
    size_t nb = 0, nc = 0, pos_b = 0, pos_c = 0, pos_p = 0;
    float *bb = ch_model_buffer_block(m, &nb);
    int64_t *cb = ch_model_counter_block(m, &nc);
    for (int i = 0; i < ch_model_num_entries(m); i++) {
        ch_param_t *p = ch_model_entry(m, i);
        if (!p->is_buffer) {
            assert_ptr_equal(p->data, ch_model_param_block(m) + pos_p);
            assert_ptr_equal(p->grad, ch_model_grad_block(m) + pos_p);
            pos_p += p->numel;
        } else if (p->dtype == CH_F32) {
            assert_ptr_equal(p->data, bb + pos_b);
            pos_b += p->numel;
        } else {
            assert_ptr_equal(p->data, cb + pos_c);
            pos_c += p->numel;
        }
    }
    assert_int_equal(pos_b, nb);
    assert_int_equal(pos_c, nc);
    assert_int_equal(nc, 20); /* resnet18 has 20 BatchNorm layers */
    assert_int_equal(pos_p, ch_model_param_numel(m));
    ch_model_destroy(m);
    m = make("resnet50", 3, 1000);
    assert_int_equal(ch_model_param_numel(m), 25557032);
    ch_model_destroy(m);
}

/* Entry names, dtypes, shapes and order equal torchvision's state_dict(). */
static void test_keys_match_torchvision(void **state)
{
    if (!nt_have_torch()) ch_test_skip("python3-torch not available (HAVE_TORCH != yes)");
    char dir[1024], path[1200], line[512];
    assert_int_equal(nt_run_golden("resnet_golden.py", "models", "keys", dir, sizeof dir), 0);
    const char *archs[] = {"resnet18", "resnet34", "resnet50", "smallcnn"};
    for (int a = 0; a < 4; a++) {
        ch_model_t *m = make(archs[a], 1, 10);
        snprintf(path, sizeof path, "%s/keys_%s.txt", dir, archs[a]);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        int i = 0;
        while (fgets(line, sizeof line, f)) {
            char name[256], dt[8], shape[128], mine[128];
            assert_int_equal(sscanf(line, "%255s %7s %127s", name, dt, shape), 3);
            ch_param_t *p = ch_model_entry(m, i);
            if (!p) fail_msg("%s: torch has entry %d '%s', cohort has only %d", archs[a], i, name, i);
            if (strcmp(p->name, name))
                fail_msg("%s: entry %d is '%s' in cohort, '%s' in torchvision", archs[a], i, p->name, name);
            assert_string_equal(dt, p->dtype == CH_F32 ? "F32" : "I64");
            size_t o = 0;
            mine[0] = 0;
            for (int d = 0; d < p->ndim; d++)
                o += (size_t)snprintf(mine + o, sizeof mine - o, "%s%lld", d ? "," : "", (long long)p->shape[d]);
            if (!p->ndim) snprintf(mine, sizeof mine, "-");
            if (strcmp(mine, shape)) fail_msg("%s: '%s' shape %s vs torch %s", archs[a], name, mine, shape);
            assert_int_equal(p->index, i);
            i++;
        }
        fclose(f);
        assert_int_equal(i, ch_model_num_entries(m));
        /* parameters() order */
        snprintf(path, sizeof path, "%s/params_%s.txt", dir, archs[a]);
        f = fopen(path, "r");
        assert_non_null(f);
        i = 0;
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = 0;
            ch_param_t *p = ch_model_param(m, i);
            assert_non_null(p);
            assert_string_equal(p->name, line);
            assert_int_equal(p->param_index, i);
            assert_false(p->is_buffer);
            i++;
        }
        fclose(f);
        assert_int_equal(i, ch_model_num_params(m));
        ch_model_destroy(m);
    }
}

/* Sample statistics of one initialised tensor against its distribution,
 * with tolerances from the sample count (5 standard errors). */
static void check_normal(const char *name, const float *x, size_t n, double sigma)
{
    double s = 0, s2 = 0;
    size_t within = 0;
    for (size_t i = 0; i < n; i++) {
        s += x[i];
        s2 += (double)x[i] * x[i];
        if (fabs(x[i]) <= sigma) within++;
    }
    double mean = s / n, var = s2 / n - mean * mean;
    double se_mean = sigma / sqrt((double)n), se_var = sqrt(2.0 / (n - 1));
    if (fabs(mean) > 5 * se_mean)
        fail_msg("%s: mean %.4g, expected 0 +- %.3g", name, mean, 5 * se_mean);
    if (fabs(var / (sigma * sigma) - 1) > 5 * se_var)
        fail_msg("%s: variance ratio %.4g, expected 1 +- %.3g (sigma %.4g)", name,
                 var / (sigma * sigma), 5 * se_var, sigma);
    const double p = 0.682689492137; /* P(|z| <= 1) of a normal */
    double frac = (double)within / n, se_p = sqrt(p * (1 - p) / n);
    if (fabs(frac - p) > 5 * se_p)
        fail_msg("%s: %.4f of values within 1 sigma, normal gives %.4f +- %.3g", name, frac, p, 5 * se_p);
}

static void check_uniform(const char *name, const float *x, size_t n, double b)
{
    double s = 0, s2 = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(fabs(x[i]) <= b)) fail_msg("%s: value %g outside +-%g", name, x[i], b);
        s += x[i];
        s2 += (double)x[i] * x[i];
        if (fabs(x[i]) > mx) mx = fabs(x[i]);
    }
    double mean = s / n, var = s2 / n;
    double sigma = b / sqrt(3.0), se_mean = sigma / sqrt((double)n), se_var = sqrt(0.8 / n);
    if (fabs(mean) > 5 * se_mean) fail_msg("%s: mean %.4g, expected 0 +- %.3g", name, mean, 5 * se_mean);
    if (fabs(var / (sigma * sigma) - 1) > 5 * se_var)
        fail_msg("%s: variance ratio %.4g, expected 1 +- %.3g", name, var / (sigma * sigma), 5 * se_var);
    double t = 20.0 / n < 1 ? 20.0 / n : 1; /* P(max < b(1-t)) = (1-t)^n < e^-20 */
    if (mx < b * (1 - t)) fail_msg("%s: largest |value| %g, expected near the bound %g", name, mx, b);
}

static void check_init(ch_model_t *m)
{
    for (int i = 0; i < ch_model_num_entries(m); i++) {
        ch_param_t *p = ch_model_entry(m, i);
        const float *x = p->data;
        ch_nn_kind_t k = ch_module_kind(p->module);
        if (k == CH_NN_CONV2D && !strcmp(p->local, "weight")) {
            double fan_out = (double)(p->shape[0] * p->shape[2] * p->shape[3]);
            check_normal(p->name, x, p->numel, sqrt(2.0 / fan_out));
        } else if (k == CH_NN_LINEAR) {
            ch_param_t *w = ch_model_find(m, "fc.weight");
            check_uniform(p->name, x, p->numel, 1.0 / sqrt((double)w->shape[1]));
        } else if (p->dtype == CH_I64) {
            assert_int_equal(*(int64_t *)p->data, 0);
        } else {
            float v = (!strcmp(p->local, "weight") || !strcmp(p->local, "running_var")) ? 1.0f : 0.0f;
            for (size_t j = 0; j < p->numel; j++)
                if (x[j] != v) fail_msg("%s[%zu] = %g, expected %g", p->name, j, x[j], v);
        }
    }
}

static void test_init_statistics(void **state)
{
    ch_model_t *m = make("resnet18", 1, 10);
    check_init(m);
    /* another seed gives other values, the same seed the same */
    ch_model_options_t o;
    ch_model_options_default(&o);
    o.in_channels = 1;
    o.num_classes = 10;
    ch_model_t *a, *b;
    o.seed = 7;
    assert_ch_ok(ch_model_create("resnet18", &o, &a));
    assert_ch_ok(ch_model_create("resnet18", &o, &b));
    check_init(a);
    assert_memory_equal(ch_model_param_block(a), ch_model_param_block(b),
                        ch_model_param_numel(a) * sizeof(float));
    assert_true(memcmp(ch_model_param_block(a), ch_model_param_block(m),
                       ch_model_param_numel(a) * sizeof(float)) != 0);
    ch_model_destroy(a);
    ch_model_destroy(b);
    ch_model_destroy(m);
    m = make("resnet50", 3, 1000);
    check_init(m);
    ch_model_destroy(m);
}

/* torchvision's own init passes the same statistical checks (so the checks
 * test the scheme, and cohort's scheme is torchvision's). */
static void test_torch_init_same_scheme(void **state)
{
    if (!nt_have_torch()) ch_test_skip("python3-torch not available (HAVE_TORCH != yes)");
    char dir[1024], path[1200], line[512];
    assert_int_equal(nt_run_golden("resnet_golden.py", "models", "initstats", dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/initstats_resnet18.txt", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    ch_model_t *m = make("resnet18", 1, 10);
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        char name[256];
        long long numel;
        double mean, std, mn, mx;
        assert_int_equal(sscanf(line, "%255s %lld %lf %lf %lf %lf", name, &numel, &mean, &std, &mn, &mx), 6);
        ch_param_t *p = ch_model_find(m, name);
        assert_non_null(p);
        assert_int_equal(p->numel, numel);
        const float *x = p->data;
        double s = 0, s2 = 0, lo = 1e30, hi = -1e30;
        for (size_t i = 0; i < p->numel; i++) {
            double v = p->dtype == CH_F32 ? x[i] : (double)((int64_t *)p->data)[i];
            s += v;
            s2 += v * v;
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        double mymean = s / p->numel, mystd = sqrt(fmax(0, s2 / p->numel - mymean * mymean));
        if (numel > 1 && std > 0) {
            /* two independent samples of the same distribution: std ratio
             * within 5 standard errors of 1 (se of a std ~ 1/sqrt(2n) each,
             * for uniform sqrt(0.2/n)) */
            double tol = 5 * sqrt(2.0) * sqrt(1.0 / (2.0 * numel));
            if (fabs(mystd / std - 1) > tol)
                fail_msg("%s: cohort std %.5g vs torchvision %.5g (tol %.3g)", name, mystd, std, tol);
            if (ch_module_kind(p->module) == CH_NN_LINEAR) {
                /* same bound: both maxima within the same +-1/sqrt(fan_in) */
                double b = 1.0 / sqrt(512.0);
                assert_true(fabs(mn) <= b && fabs(mx) <= b && fabs(lo) <= b && fabs(hi) <= b);
            }
        } else {
            /* constant entries: exactly the same values */
            assert_true(lo == mn && hi == mx);
        }
        n++;
    }
    fclose(f);
    assert_int_equal(n, ch_model_num_entries(m));
    ch_model_destroy(m);
}

typedef struct {
    char names[8][128];
    char reasons[8][256];
    int n;
} skips_t;

static void on_skip(void *arg, const char *name, const char *reason)
{
    skips_t *s = arg;
    if (s->n < 8) {
        snprintf(s->names[s->n], sizeof s->names[0], "%s", name);
        snprintf(s->reasons[s->n], sizeof s->reasons[0], "%s", reason);
    }
    s->n++;
}

/* Pretrained loading keeps entries whose name exists and whose element
 * count matches; fc of another class count is skipped and reported. */
static void test_pretrained_filter(void **state)
{
    ch_model_options_t o;
    ch_model_options_default(&o);
    o.in_channels = 1;
    o.num_classes = 1000;
    o.seed = 3;
    ch_model_t *src, *dst;
    assert_ch_ok(ch_model_create("resnet18", &o, &src));
    o.num_classes = 10;
    o.seed = 4;
    assert_ch_ok(ch_model_create("resnet18", &o, &dst));
    ch_param_t *bt = ch_model_find(src, "layer2.0.bn1.num_batches_tracked");
    *(int64_t *)bt->data = 42;
    int n = ch_model_num_entries(src);
    ch_nn_view_t *v = calloc((size_t)n + 1, sizeof *v);
    int cnt = 0;
    assert_ch_error(ch_model_state_dict(src, v, 3, &cnt), CH_ERR_RANGE, "room for 3");
    assert_ch_ok(ch_model_state_dict(src, v, n, &cnt));
    assert_int_equal(cnt, n);
    /* an extra entry that is not in the model */
    float extra[2] = {1, 2};
    v[n] = (ch_nn_view_t){"module.extra", CH_F32, 1, {2, 1, 1, 1}, 2, extra};
    skips_t sk = {0};
    int loaded = 0;
    float fc_before = ((float *)ch_model_find(dst, "fc.weight")->data)[0];
    /* strict fails and changes nothing */
    assert_ch_error(ch_model_load_state_dict(dst, v, n + 1, 1, on_skip, &sk, &loaded), CH_ERR_INVALID,
                    "size mismatch for 'fc.weight'");
    assert_ch_error(ch_model_load_state_dict(dst, v, n, 1, on_skip, &sk, &loaded), CH_ERR_INVALID,
                    "fc.weight");
    assert_int_equal(sk.n, 0);
    assert_true(((float *)ch_model_find(dst, "layer1.0.conv1.weight")->data)[0] !=
                ((float *)ch_model_find(src, "layer1.0.conv1.weight")->data)[0]);
    assert_ch_ok(ch_model_load_state_dict(dst, v, n + 1, 0, on_skip, &sk, &loaded));
    assert_int_equal(loaded, n - 2);
    assert_int_equal(sk.n, 3);
    assert_string_equal(sk.names[0], "fc.weight");
    assert_non_null(strstr(sk.reasons[0], "[1000, 512]"));
    assert_non_null(strstr(sk.reasons[0], "[10, 512]"));
    assert_string_equal(sk.names[1], "fc.bias");
    assert_string_equal(sk.names[2], "module.extra");
    assert_string_equal(sk.reasons[2], "not in model");
    assert_true(((float *)ch_model_find(dst, "fc.weight")->data)[0] == fc_before);
    for (int i = 0; i < n - 2; i++) {
        ch_param_t *p = ch_model_entry(dst, i);
        assert_memory_equal(p->data, v[i].data, p->numel * ch_dtype_size(p->dtype));
    }
    assert_int_equal(*(int64_t *)ch_model_find(dst, "layer2.0.bn1.num_batches_tracked")->data, 42);
    /* strict load of a matching state dict */
    ch_model_t *dst2;
    o.num_classes = 1000;
    assert_ch_ok(ch_model_create("resnet18", &o, &dst2));
    assert_ch_ok(ch_model_load_state_dict(dst2, v, n, 1, NULL, NULL, &loaded));
    assert_int_equal(loaded, n);
    assert_memory_equal(ch_model_param_block(dst2), ch_model_param_block(src),
                        ch_model_param_numel(src) * sizeof(float));
    /* unexpected and missing keys in strict mode */
    assert_ch_error(ch_model_load_state_dict(dst2, v, n + 1, 1, NULL, NULL, NULL), CH_ERR_INVALID,
                    "unexpected key 'module.extra'");
    assert_ch_error(ch_model_load_state_dict(dst2, v + 1, n - 1, 1, NULL, NULL, NULL), CH_ERR_INVALID,
                    "missing key 'conv1.weight'");
    /* duplicate names are malformed */
    v[1] = v[0];
    assert_ch_error(ch_model_load_state_dict(dst2, v, n, 0, NULL, NULL, NULL), CH_ERR_INVALID, "twice");
    free(v);
    ch_model_destroy(src);
    ch_model_destroy(dst);
    ch_model_destroy(dst2);
}

static void test_freeze(void **state)
{
    ch_model_t *m = make("resnet18", 1, 10);
    int nf = 0;
    size_t all = ch_model_trainable_numel(m);
    assert_int_equal(all, ch_model_param_numel(m));
    assert_ch_ok(ch_model_freeze(m, "fc", &nf));
    assert_int_equal(nf, ch_model_num_params(m) - 2);
    assert_int_equal(ch_model_trainable_numel(m), 10 * 512 + 10);
    for (int i = 0; i < ch_model_num_params(m); i++) {
        ch_param_t *p = ch_model_param(m, i);
        assert_int_equal(p->requires_grad, strstr(p->name, "fc") != NULL);
    }
    assert_ch_ok(ch_model_set_requires_grad(m, "conv1.weight", 1));
    assert_true(ch_model_find(m, "conv1.weight")->requires_grad);
    assert_ch_error(ch_model_set_requires_grad(m, "bn1.running_mean", 1), CH_ERR_INVALID, "bn1.running_mean");
    ch_model_destroy(m);
}

static void test_builder_errors(void **state)
{
    ch_model_t *m;
    ch_module_t *seq, *blk;
    assert_ch_ok(ch_model_new("t", &m));
    ch_module_t *root = ch_model_root(m);
    assert_ch_ok(ch_nn_conv2d(root, "conv", 1, 4, 3, 1, 1, 1, NULL));
    assert_ch_error(ch_nn_conv2d(root, "conv", 1, 4, 3, 1, 1, 1, NULL), CH_ERR_INVALID, "duplicate");
    assert_ch_error(ch_nn_conv2d(root, "c2", 0, 4, 3, 1, 1, 1, NULL), CH_ERR_INVALID, "in=0");
    assert_ch_error(ch_nn_linear(root, "a.b", 4, 4, 1, NULL), CH_ERR_INVALID, "contains a '.'");
    assert_ch_error(ch_nn_maxpool2d(root, "p", 3, 2, 2, NULL), CH_ERR_INVALID, "padding");
    assert_ch_ok(ch_nn_residual(root, "blk", &blk));
    assert_ch_ok(ch_nn_sequential(root, "seq", &seq));
    assert_ch_error(ch_model_finalize(m, 0), CH_ERR_INVALID, "no path");
    ch_module_t *conv;
    assert_ch_error(ch_nn_conv2d(ch_module_child(root, "conv"), "x", 1, 1, 1, 1, 0, 0, NULL),
                    CH_ERR_INVALID, "cannot hold children");
    assert_ch_ok(ch_nn_conv2d(blk, "c", 4, 4, 3, 1, 1, 0, &conv));
    assert_ch_error(ch_nn_residual_set_path(blk, &conv, 1, NULL, conv), CH_ERR_INVALID, "ReLU");
    ch_model_destroy(m);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_keys_match_torchvision),
        cmocka_unit_test(test_init_statistics),
        cmocka_unit_test(test_torch_init_same_scheme),
        cmocka_unit_test(test_pretrained_filter),
        cmocka_unit_test(test_freeze),
        cmocka_unit_test(test_builder_errors),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
