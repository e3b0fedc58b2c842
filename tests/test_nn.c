/* Tests for framework/nn forward/backward against PyTorch: one full training
 * step of smallcnn and resnet18 (1 channel, 10 classes, batch 8) from
 * torchvision's initial weights; state-dict interop both ways; gradient-ready
 * hook order; freezing; no growth of memory after the first step. */
#include "config.h"

#include "tests/nn_testutil.h"

#include "framework/nn/nn.h"
#include "framework/nn/nn_exec.h"
#include "framework/nn/nn_rng.h"
#include "framework/ops/ops.h"
#include "framework/train/optim.h"
#include "models/models.h"

static ch_compute_t *make_cx(void)
{
    ch_compute_options_t o;
    ch_compute_options_default(&o);
    o.num_threads = 1;
    ch_compute_t *cx = NULL;
    assert_ch_ok(ch_compute_create(&o, &cx));
    return cx;
}

static ch_model_t *make(const char *arch, uint64_t seed) { return nt_model_1x10(arch, seed); }

/* A deterministic batch (N,1,H,W) and labels. */
static void make_batch(ch_tensor_t *x, ch_tensor_t *y, int n, int hw, unsigned seed)
{
    int64_t xs[4] = {n, 1, hw, hw}, ys[1] = {n};
    assert_ch_ok(ch_tensor_alloc_f32(x, 4, xs));
    assert_ch_ok(ch_tensor_alloc(y, CH_I64, 1, ys, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    float *xd = ch_tensor_f32(x);
    for (int64_t i = 0; i < ch_tensor_numel(x); i++)
        xd[i] = sinf(0.37f * (float)(i + seed)) + 0.5f * cosf(0.011f * (float)(i * (seed + 3)));
    for (int i = 0; i < n; i++) ch_tensor_i64(y)[i] = (i * 7 + seed) % 10;
}

/* ---------------------------------------------------------------- golden */

typedef struct {
    ch_safetensors_t *st;
    ch_nn_view_t *views;
    int n;
} golden_sd_t;

/* Views of the "sd.<name>" tensors of a golden file (copied, aligned). */
static void golden_sd(ch_safetensors_t *st, ch_model_t *m, golden_sd_t *g)
{
    g->st = st;
    g->views = nt_golden_sd(st, ch_model_num_entries(m), &g->n);
}

static void golden_sd_free(golden_sd_t *g) { nt_golden_sd_free(g->views, g->n); }

static void write_state_dict(ch_model_t *m, const char *path)
{
    int n = ch_model_num_entries(m);
    ch_nn_view_t *v = calloc((size_t)n, sizeof *v);
    ch_st_view_t *s = calloc((size_t)n, sizeof *s);
    assert_ch_ok(ch_model_state_dict(m, v, n, NULL));
    for (int i = 0; i < n; i++) {
        s[i].name = v[i].name;
        s[i].dtype = v[i].dtype == CH_F32 ? CH_ST_F32 : CH_ST_I64;
        s[i].ndim = v[i].ndim;
        for (int d = 0; d < v[i].ndim; d++) s[i].shape[d] = v[i].shape[d];
        s[i].data = v[i].data;
        s[i].nbytes = v[i].numel * ch_dtype_size(v[i].dtype);
    }
    ch_st_meta_t meta[1] = {{"format", "pt"}};
    assert_ch_ok(ch_safetensors_write(path, s, (size_t)n, meta, 1));
    free(v);
    free(s);
}

static void check_entry(const char *what, const ch_param_t *p, const ch_st_view_t *v, double tol)
{
    char msg[256];
    if (!v) fail_msg("%s: golden lacks %s", what, p->name);
    assert_int_equal(ch_st_view_numel(v), p->numel);
    if (p->dtype == CH_I64) {
        int64_t ref;
        memcpy(&ref, v->data, 8);
        if (ref != *(int64_t *)p->data)
            fail_msg("%s %s: %lld vs torch %lld", what, p->name, (long long)*(int64_t *)p->data,
                     (long long)ref);
        return;
    }
    float *ref = malloc(v->nbytes);
    memcpy(ref, v->data, v->nbytes);
    snprintf(msg, sizeof msg, "%s %s", what, p->name);
    nt_assert_close((const float *)p->data, ref, p->numel, tol, msg);
    free(ref);
}

/* The golden batch x, y of st, a training forward and backward of m on
 * it, compared with PyTorch's logits and loss (1e-4) and every parameter
 * gradient (1e-3). x, y stay allocated for the caller. */
static void golden_fwd_bwd(ch_model_t *m, ch_compute_t *cx, ch_safetensors_t *st, ch_tensor_t *x,
                           ch_tensor_t *y)
{
    nt_golden_batch(st, x, y);
    nt_golden_forward_loss(st, m, cx, x, y);
    assert_ch_ok(ch_model_backward(m, cx, NULL));
    for (int i = 0; i < ch_model_num_params(m); i++) {
        ch_param_t *p = ch_model_param(m, i);
        char name[300], what[300];
        snprintf(name, sizeof name, "grad.%s", p->name);
        float *gr = nt_read_f32(st, name, NULL);
        snprintf(what, sizeof what, "gradient of %s", p->name);
        nt_assert_close(p->grad, gr, p->numel, 1e-3, what);
        free(gr);
    }
}

/* One step of `arch` vs PyTorch, then interop of the updated state dict. */
static void golden_step(const char *arch, int batch, int size)
{
    if (!nt_have_torch()) ch_test_skip("python3-torch not available (HAVE_TORCH != yes)");
    char dir[1024], args[256], path[1200];
    snprintf(args, sizeof args, "step %s %d %d", arch, batch, size);
    assert_int_equal(nt_run_golden("resnet_golden.py", "nn", args, dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/step_%s.safetensors", dir, arch);
    ch_safetensors_t *st;
    assert_ch_ok(ch_safetensors_open(path, &st));
    ch_model_t *m = make(arch, 99);
    golden_sd_t g;
    golden_sd(st, m, &g);
    int loaded = 0;
    assert_ch_ok(ch_model_load_state_dict(m, g.views, g.n, 1, NULL, NULL, &loaded));
    assert_int_equal(loaded, ch_model_num_entries(m));
    /* keep the initial parameters to compare updates */
    size_t pn = ch_model_param_numel(m);
    float *p0 = malloc(pn * sizeof(float));
    memcpy(p0, ch_model_param_block(m), pn * sizeof(float));

    ch_tensor_t x, y;
    ch_compute_t *cx = make_cx();
    ch_sgd_options_t so = {0.01, 0.9, 0.0, 0.005, 0};
    ch_sgd_t *sgd;
    assert_ch_ok(ch_sgd_create(&so, &sgd));
    assert_ch_ok(ch_sgd_add_model(sgd, m));
    const ch_tensor_t *logits;
    float *ref;
    golden_fwd_bwd(m, cx, st, &x, &y);
    char name[300];
    assert_ch_ok(ch_sgd_step(sgd));
    for (int i = 0; i < ch_model_num_entries(m); i++) {
        ch_param_t *p = ch_model_entry(m, i);
        snprintf(name, sizeof name, "new.%s", p->name);
        check_entry("updated", p, ch_safetensors_find(st, name), 1e-3);
        if (!p->is_buffer) { /* the update itself, p_new - p_old */
            size_t off = (size_t)((float *)p->data - ch_model_param_block(m));
            float *rn = nt_read_f32(st, name, NULL);
            for (size_t k = 0; k < p->numel; k++) {
                rn[k] -= p0[off + k];
                p0[off + k] = ((float *)p->data)[k] - p0[off + k];
            }
            char what[300];
            snprintf(what, sizeof what, "update of %s", p->name);
            nt_assert_close(p0 + off, rn, p->numel, 1e-3, what);
            free(rn);
        }
    }
    /* eval mode with the updated weights and running stats */
    ch_model_train(m, 0);
    assert_ch_ok(ch_model_forward(m, cx, &x, &logits));
    ref = nt_read_f32(st, "eval_logits", NULL);
    nt_assert_close(ch_tensor_f32(logits), ref, (size_t)ch_tensor_numel(logits), 1e-4, "eval logits");
    free(ref);
    assert_ch_error(ch_model_backward(m, cx, NULL), CH_ERR_INVALID, "training mode");

    /* interop cohort -> torch: strict load and same eval logits */
    char sdpath[1300], lpath[1400], cmd[4096];
    snprintf(sdpath, sizeof sdpath, "%s/cohort_%s.safetensors", dir, arch);
    snprintf(lpath, sizeof lpath, "%s.logits.safetensors", sdpath);
    write_state_dict(m, sdpath);
    ch_st_view_t lv = {"cohort_logits", CH_ST_F32, 2, {logits->shape[0], logits->shape[1]},
                       logits->data, logits->nbytes};
    assert_ch_ok(ch_safetensors_write(lpath, &lv, 1, NULL, 0));
    const char *py = getenv("PYTHON3");
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/golden/resnet_golden.py' '%s' check %s '%s'",
             py ? py : "python3", ch_test_srcdir(), dir, arch, sdpath);
    int rc = system(cmd);
    assert_int_equal(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, 0);

    ch_sgd_destroy(sgd);
    ch_compute_destroy(cx);
    ch_tensor_free(&x);
    ch_tensor_free(&y);
    free(p0);
    golden_sd_free(&g);
    ch_safetensors_destroy(st);
    ch_model_destroy(m);
}

/* A network of the convolution and pooling variants (depthwise, grouped +
 * dilated + non-square Conv2d, MaxPool2d / AvgPool2d with ceil_mode,
 * AdaptiveAvgPool2d (3, 2) and (1, 1)) built with the ch_nn_*_ex builders:
 * PyTorch's state dict loads strictly (same names and shapes), and one
 * training forward + backward gives PyTorch's logits (1e-4), loss and every
 * parameter gradient (1e-3); tests/golden/convpool_nn_golden.py. */
static void test_golden_convpool_modules(void **state)
{
    (void)state;
    if (!nt_have_torch()) ch_test_skip("python3-torch not available (HAVE_TORCH != yes)");
    char dir[1024], path[1200];
    assert_int_equal(nt_run_golden("convpool_nn_golden.py", "convpool", "", dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/convpool_step.safetensors", dir);
    ch_safetensors_t *st;
    assert_ch_ok(ch_safetensors_open(path, &st));

    ch_model_t *m = NULL;
    assert_ch_ok(ch_model_new("convpool", &m));
    ch_module_t *f;
    assert_ch_ok(ch_nn_sequential(ch_model_root(m), "features", &f));
    ch_conv2d_options_t co;
    ch_conv2d_options_default(&co, 1, 8, 3);
    co.pad_h = co.pad_w = 1;
    co.bias = 0;
    assert_ch_ok(ch_nn_conv2d_ex(f, "0", &co, NULL));
    assert_ch_ok(ch_nn_batchnorm2d(f, "1", 8, NULL));
    assert_ch_ok(ch_nn_relu(f, "2", NULL));
    ch_conv2d_options_default(&co, 8, 8, 3);
    co.pad_h = co.pad_w = 1;
    co.groups = 8;
    assert_ch_ok(ch_nn_conv2d_ex(f, "3", &co, NULL));
    ch_conv2d_options_default(&co, 8, 16, 3);
    co.kernel_w = 2;
    co.stride_h = 2;
    co.pad_h = 2;
    co.pad_w = 1;
    co.dilation_h = 2;
    co.groups = 2;
    co.bias = 0;
    assert_ch_ok(ch_nn_conv2d_ex(f, "4", &co, NULL));
    ch_pool2d_options_t po;
    ch_pool2d_options_default(&po, 3);
    po.stride_h = po.stride_w = 2;
    po.pad_h = po.pad_w = 1;
    po.ceil_mode = 1;
    assert_ch_ok(ch_nn_maxpool2d_ex(f, "5", &po, NULL));
    po.count_include_pad = 0;
    assert_ch_ok(ch_nn_avgpool2d(f, "6", &po, NULL));
    assert_ch_ok(ch_nn_adaptive_avgpool2d_hw(f, "7", 3, 2, NULL));
    assert_ch_ok(ch_nn_adaptive_avgpool2d_hw(f, "8", 1, 1, NULL));
    assert_ch_ok(ch_nn_linear(ch_model_root(m), "fc", 16, 10, 1, NULL));
    assert_ch_ok(ch_model_finalize(m, 1));
    /* PyTorch's default init bound for the grouped conv: 1/sqrt(fan_in),
     * fan_in = in/groups * kh * kw = 4 * 3 * 2 (torchvision's init for
     * conv weights: normal with std sqrt(2 / (16 * 3 * 2))) */
    assert_int_equal(ch_model_find(m, "features.4.weight")->shape[1], 4);

    golden_sd_t g;
    golden_sd(st, m, &g);
    int loaded = 0;
    assert_ch_ok(ch_model_load_state_dict(m, g.views, g.n, 1, NULL, NULL, &loaded));
    assert_int_equal(loaded, ch_model_num_entries(m));
    ch_tensor_t x, y;
    ch_compute_t *cx = make_cx();
    golden_fwd_bwd(m, cx, st, &x, &y);
    ch_compute_destroy(cx);
    ch_tensor_free(&x);
    ch_tensor_free(&y);
    golden_sd_free(&g);
    ch_safetensors_destroy(st);
    ch_model_destroy(m);
}

static void test_golden_smallcnn(void **state) { golden_step("smallcnn", 8, 16); }
static void test_golden_resnet18(void **state) { golden_step("resnet18", 8, 28); }

/* resnet50 (Bottleneck blocks) is too big to dump whole: cohort's own
 * initial state dict goes to PyTorch (strict load), which returns logits,
 * loss and per-entry summaries (rms, sum, 16 samples) after one step. */
static void summarize(const ch_param_t *p, const float *vals, double out[18])
{
    size_t n = p->numel;
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) {
        double v = p->dtype == CH_I64 ? (double)((const int64_t *)p->data)[i] : (double)vals[i];
        s += v;
        s2 += v * v;
    }
    out[0] = sqrt(s2 / (double)n);
    out[1] = s;
    for (int k = 0; k < 16; k++) {
        size_t i = (size_t)k * n / 16;
        out[2 + k] = p->dtype == CH_I64 ? (double)((const int64_t *)p->data)[i] : (double)vals[i];
    }
}

/* Largest error measure of summary a against reference r (rms relative,
 * sum and samples relative to the tensor's rms). */
static double summary_err(const double *a, const float *r, size_t numel)
{
    double rms = r[0] > 0 ? r[0] : 1e-30, e = fabs(a[0] - r[0]) / rms;
    double es = fabs(a[1] - r[1]) / (fabs(r[1]) + rms * sqrt((double)numel));
    if (es > e) e = es;
    for (int k = 0; k < 16; k++) {
        double ek = fabs(a[2 + k] - r[2 + k]) / (fabs(r[2 + k]) + rms);
        if (ek > e) e = ek;
    }
    return e;
}

/* cohort's summary against PyTorch's float64 run must be within 1e-3, or
 * no worse than 3x PyTorch's own float32 run (deep nets with small-batch
 * BatchNorm amplify rounding; float32 PyTorch is then off by as much). */
static void check_summary(const char *what, const ch_param_t *p, const double mine[18],
                          const ch_safetensors_t *st, const char *key, double *worst_ratio)
{
    char k64[320];
    snprintf(k64, sizeof k64, "64.%s", key);
    size_t n;
    float *r32 = nt_read_f32(st, key, &n), *r64 = nt_read_f32(st, k64, NULL);
    assert_int_equal(n, 18);
    double t32[18];
    for (int i = 0; i < 18; i++) t32[i] = r32[i];
    double ec = summary_err(mine, r64, p->numel), et = summary_err(t32, r64, p->numel);
    double tol = fmax(1e-3, 3 * et);
    if (getenv("NT_VERBOSE"))
        fprintf(stderr, "%s %s: cohort err %.2e, torch float32 err %.2e\n", what, p->name, ec, et);
    if (!(ec <= tol))
        fail_msg("%s %s: error vs float64 %.3g, PyTorch float32's %.3g (tolerance %.3g)", what, p->name,
                 ec, et, tol);
    if (et > 0 && ec / et > *worst_ratio) *worst_ratio = ec / et;
    free(r32);
    free(r64);
}

static void test_golden_resnet50_summary(void **state)
{
    if (!nt_have_torch()) ch_test_skip("python3-torch not available (HAVE_TORCH != yes)");
    char dir[1024], path[1200], cmd[1400];
    snprintf(dir, sizeof dir, "%s/tests/golden-out/nn50", ch_test_builddir());
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    assert_int_equal(system(cmd), 0);
    ch_model_t *m = make("resnet50", 5);
    snprintf(path, sizeof path, "%s/resnet50_init.safetensors", dir);
    write_state_dict(m, path);
    ch_tensor_t x, y;
    make_batch(&x, &y, 16, 64, 9);
    {   /* unstructured input: N(0, 1) */
        ch_nn_rng_t r;
        ch_nn_rng_seed(&r, 42);
        ch_nn_rng_fill_normal(&r, ch_tensor_f32(&x), (size_t)ch_tensor_numel(&x), 1.0);
    }
    ch_st_view_t bv[2] = {{"x", CH_ST_F32, 4, {16, 1, 64, 64}, x.data, x.nbytes},
                          {"y", CH_ST_I64, 1, {16}, y.data, y.nbytes}};
    snprintf(path, sizeof path, "%s/resnet50_batch.safetensors", dir);
    assert_ch_ok(ch_safetensors_write(path, bv, 2, NULL, 0));
    assert_int_equal(nt_run_golden("resnet_golden.py", "nn50", "stepcheck resnet50", dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/resnet50_ref.safetensors", dir);
    ch_safetensors_t *st;
    assert_ch_ok(ch_safetensors_open(path, &st));

    ch_compute_t *cx = make_cx();
    ch_sgd_options_t so = {0.01, 0.9, 0.0, 0.005, 0};
    ch_sgd_t *sgd;
    assert_ch_ok(ch_sgd_create(&so, &sgd));
    assert_ch_ok(ch_sgd_add_model(sgd, m));
    nt_golden_forward_loss(st, m, cx, &x, &y);
    assert_ch_ok(ch_model_backward(m, cx, NULL));
    char key[300];
    double sm[18], worst = 0;
    for (int i = 0; i < ch_model_num_params(m); i++) {
        ch_param_t *p = ch_model_param(m, i);
        summarize(p, p->grad, sm);
        snprintf(key, sizeof key, "grad.%s", p->name);
        check_summary("gradient", p, sm, st, key, &worst);
    }
    assert_ch_ok(ch_sgd_step(sgd));
    for (int i = 0; i < ch_model_num_entries(m); i++) {
        ch_param_t *p = ch_model_entry(m, i);
        summarize(p, p->data, sm);
        snprintf(key, sizeof key, "new.%s", p->name);
        check_summary("updated", p, sm, st, key, &worst);
    }
    if (getenv("NT_VERBOSE")) fprintf(stderr, "worst cohort/torch32 error ratio %.2f\n", worst);
    snprintf(path, sizeof path, "%s/resnet50_init.safetensors", dir);
    remove(path); /* 94 MB */
    ch_sgd_destroy(sgd);
    ch_compute_destroy(cx);
    ch_tensor_free(&x);
    ch_tensor_free(&y);
    ch_safetensors_destroy(st);
    ch_model_destroy(m);
}

/* ---------------------------------------------------------------- hooks */

typedef struct {
    ch_param_t *order[256];
    int n;
    int fail_at;
} hook_log_t;

static ch_status hook(void *arg, ch_param_t *p)
{
    hook_log_t *h = arg;
    if (h->n == h->fail_at) return CH_ERROR(CH_ERR_MPI, "bucket all-reduce failed (test)");
    h->order[h->n++] = p;
    /* the gradient is final: finite and not the sentinel */
    for (size_t i = 0; i < p->numel; i++)
        if (!isfinite(p->grad[i])) return CH_ERROR(CH_ERR_INTERNAL, "%s not final", p->name);
    return CH_OK;
}

static void test_grad_hook_order(void **state)
{
    ch_compute_t *cx = make_cx();
    const char *archs[] = {"resnet18", "smallcnn"};
    for (int a = 0; a < 2; a++) {
        ch_model_t *m = make(archs[a], 1);
        ch_tensor_t x, y;
        make_batch(&x, &y, 4, 28, 1);
        hook_log_t h = {.n = 0, .fail_at = -1};
        ch_model_set_grad_hook(m, hook, &h);
        const ch_tensor_t *logits;
        float *gb = ch_model_grad_block(m);
        for (size_t i = 0; i < ch_model_param_numel(m); i++) gb[i] = NAN;
        assert_ch_ok(ch_model_forward(m, cx, &x, &logits));
        assert_ch_ok(ch_model_loss(m, cx, &y, NULL));
        assert_ch_ok(ch_model_backward(m, cx, NULL));
        int np = ch_model_num_params(m);
        assert_int_equal(h.n, np);
        for (int i = 0; i < np; i++) /* exactly reverse parameter order */
            assert_ptr_equal(h.order[i], ch_model_param(m, np - 1 - i));

        /* frozen: only fc gets gradients and hooks; earlier layers do nothing */
        assert_ch_ok(ch_model_freeze(m, "fc", NULL));
        for (size_t i = 0; i < ch_model_param_numel(m); i++) gb[i] = NAN;
        h.n = 0;
        assert_ch_ok(ch_model_forward(m, cx, &x, &logits));
        assert_ch_ok(ch_model_loss(m, cx, &y, NULL));
        assert_ch_ok(ch_model_backward(m, cx, NULL));
        assert_int_equal(h.n, 2);
        assert_string_equal(h.order[0]->name, "fc.bias");
        assert_string_equal(h.order[1]->name, "fc.weight");
        assert_true(isnan(ch_model_find(m, "conv1.weight")->grad[0]));
        assert_true(isnan(ch_model_find(m, "bn1.bias")->grad[0]));
        assert_true(isfinite(ch_model_find(m, "fc.weight")->grad[0]));

        /* a failing hook stops backward with its error */
        h.n = 0;
        h.fail_at = 1;
        assert_ch_ok(ch_model_forward(m, cx, &x, &logits));
        assert_ch_ok(ch_model_loss(m, cx, &y, NULL));
        assert_ch_error(ch_model_backward(m, cx, NULL), CH_ERR_MPI, "bucket all-reduce failed");
        assert_non_null(strstr(ch_error_message(), "fc.weight"));
        ch_tensor_free(&x);
        ch_tensor_free(&y);
        ch_model_destroy(m);
    }
    ch_compute_destroy(cx);
}

/* Frozen backbone: fc's gradient equals the unfrozen model's fc gradient. */
static void test_freeze_same_fc_grad(void **state)
{
    ch_compute_t *cx = make_cx();
    ch_model_t *a = make("smallcnn", 5), *b = make("smallcnn", 5);
    ch_tensor_t x, y;
    make_batch(&x, &y, 6, 12, 2);
    const ch_tensor_t *l;
    assert_ch_ok(ch_model_freeze(b, "fc", NULL));
    ch_model_t *ms[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        assert_ch_ok(ch_model_forward(ms[i], cx, &x, &l));
        assert_ch_ok(ch_model_loss(ms[i], cx, &y, NULL));
        assert_ch_ok(ch_model_backward(ms[i], cx, NULL));
    }
    ch_param_t *fa = ch_model_find(a, "fc.weight"), *fb = ch_model_find(b, "fc.weight");
    assert_memory_equal(fa->grad, fb->grad, fa->numel * sizeof(float));
    /* and the optimizer only holds fc */
    ch_sgd_options_t so = {0.1, 0.9, 0, 0, 0};
    ch_sgd_t *s;
    assert_ch_ok(ch_sgd_create(&so, &s));
    assert_ch_ok(ch_sgd_add_model(s, b));
    assert_int_equal(ch_sgd_num_params(s), 2);
    ch_sgd_destroy(s);
    ch_tensor_free(&x);
    ch_tensor_free(&y);
    ch_model_destroy(a);
    ch_model_destroy(b);
    ch_compute_destroy(cx);
}

/* Train/eval semantics of BN buffers and the plan cache. */
static void test_modes_and_memory(void **state)
{
    ch_compute_t *cx = make_cx();
    ch_model_t *m = make("resnet18", 2);
    ch_tensor_t x, y, x2, y2;
    make_batch(&x, &y, 4, 28, 3);
    make_batch(&x2, &y2, 3, 28, 4);
    const ch_tensor_t *logits;
    ch_sgd_options_t so = {0.01, 0.9, 0, 0.005, 0};
    ch_sgd_t *sgd;
    assert_ch_ok(ch_sgd_create(&so, &sgd));
    assert_ch_ok(ch_sgd_add_model(sgd, m));
    int64_t *nbt = ch_model_find(m, "layer3.1.bn2.num_batches_tracked")->data;
    size_t arena = 0, cache = 0, scratch = 0;
    for (int step = 0; step < 3; step++) {
        assert_ch_ok(ch_model_forward(m, cx, &x, &logits));
        assert_ch_ok(ch_model_loss(m, cx, &y, NULL));
        assert_ch_ok(ch_model_backward(m, cx, NULL));
        assert_ch_ok(ch_sgd_step(sgd));
        if (step == 0) {
            arena = ch_model_arena_bytes(m);
            cache = ch_compute_cache_entries(cx);
            scratch = ch_compute_scratchpad_bytes(cx);
            assert_true(arena > 0);
        } else { /* nothing grows after the first step */
            assert_int_equal(ch_model_arena_bytes(m), arena);
            assert_int_equal(ch_compute_cache_entries(cx), cache);
            assert_int_equal(ch_compute_scratchpad_bytes(cx), scratch);
        }
    }
    assert_int_equal(*nbt, 3);
    assert_ptr_equal(ch_model_activation(m, "fc"), logits);
    const ch_tensor_t *l1 = ch_model_activation(m, "layer1");
    assert_non_null(l1);
    assert_int_equal(l1->shape[1], 64);
    assert_int_equal(l1->shape[2], 7);
    assert_null(ch_model_activation(m, "layer9"));
    /* eval: buffers untouched, deterministic logits, no backward */
    ch_model_train(m, 0);
    float *rm = ch_model_find(m, "bn1.running_mean")->data;
    float rm0 = rm[5];
    assert_ch_ok(ch_model_forward(m, cx, &x, &logits));
    float l0 = ch_tensor_f32(logits)[3];
    /* a different batch size replans; then the first one gives the same */
    assert_ch_ok(ch_model_forward(m, cx, &x2, &logits));
    assert_int_equal(logits->shape[0], 3);
    assert_ch_ok(ch_model_forward(m, cx, &x, &logits));
    assert_true(ch_tensor_f32(logits)[3] == l0);
    assert_true(rm[5] == rm0);
    assert_int_equal(*nbt, 3);
    assert_ch_error(ch_model_backward(m, cx, NULL), CH_ERR_INVALID, "training mode");
    ch_model_train(m, 1);
    assert_ch_error(ch_model_backward(m, cx, NULL), CH_ERR_INVALID, "training mode");
    /* bad inputs */
    ch_tensor_t bad;
    int64_t bs[4] = {2, 3, 28, 28};
    assert_ch_ok(ch_tensor_alloc_f32(&bad, 4, bs));
    assert_ch_error(ch_model_forward(m, cx, &bad, &logits), CH_ERR_INVALID, "expects 1 input channels");
    ch_tensor_free(&bad);
    int64_t ls[1] = {4};
    assert_ch_ok(ch_model_forward(m, cx, &x, &logits));
    ch_tensor_i64(&y)[2] = 10;
    assert_ch_error(ch_model_loss(m, cx, &y, NULL), CH_ERR_RANGE, "");
    (void)ls;
    ch_sgd_destroy(sgd);
    ch_tensor_free(&x);
    ch_tensor_free(&y);
    ch_tensor_free(&x2);
    ch_tensor_free(&y2);
    ch_model_destroy(m);
    ch_compute_destroy(cx);
}

/* SyncBN in a world of one is plain BatchNorm. */
static ch_status ar_identity(void *ctx, float *d, size_t n)
{
    (*(int *)ctx)++;
    return CH_OK;
}

/* non-blocking forms for the argument checks (never called there) */
static ch_status nb_start(void *ctx, float *d, size_t n, void **req)
{
    *req = ctx;
    return CH_OK;
}

static ch_status nb_gather(void *ctx, const float *in, float *out, size_t n, void **req)
{
    *req = ctx;
    return CH_OK;
}

static ch_status nb_wait(void *ctx, void **req)
{
    *req = NULL;
    return CH_OK;
}

static void test_syncbn_world_of_one(void **state)
{
    ch_compute_t *cx = make_cx();
    ch_model_t *a = make("smallcnn", 8), *b = make("smallcnn", 8);
    int calls = 0, nconv = 0;
    ch_nn_sync_t sync = {ar_identity, NULL, &calls, 0, 1, NULL, NULL, NULL};
    assert_ch_ok(ch_model_convert_sync_bn(b, &sync, &nconv));
    assert_int_equal(nconv, 2);
    assert_int_equal(ch_module_kind(ch_model_find(b, "bn1.weight")->module), CH_NN_SYNC_BATCHNORM);
    ch_tensor_t x, y;
    make_batch(&x, &y, 5, 10, 5);
    const ch_tensor_t *la, *lb;
    assert_ch_ok(ch_model_forward(a, cx, &x, &la));
    assert_ch_ok(ch_model_loss(a, cx, &y, NULL));
    assert_ch_ok(ch_model_backward(a, cx, NULL));
    assert_ch_ok(ch_model_forward(b, cx, &x, &lb));
    assert_ch_ok(ch_model_loss(b, cx, &y, NULL));
    assert_ch_ok(ch_model_backward(b, cx, NULL));
    assert_int_equal(calls, 2 + 2); /* 2 forward gathers, 2 backward sums (conv1 trains, so bn1 needs dx) */
    nt_assert_close(ch_tensor_f32(lb), ch_tensor_f32(la), (size_t)ch_tensor_numel(la), 1e-5, "logits");
    nt_assert_close(ch_model_grad_block(b), ch_model_grad_block(a), ch_model_param_numel(a), 1e-4,
                    "gradients");
    for (int i = 0; i < ch_model_num_entries(a); i++) {
        ch_param_t *p = ch_model_entry(a, i), *q = ch_model_entry(b, i);
        if (p->dtype == CH_F32)
            nt_assert_close((float *)q->data, (float *)p->data, p->numel, 1e-5, p->name);
        else
            assert_int_equal(*(int64_t *)q->data, *(int64_t *)p->data);
    }
    ch_nn_sync_t bad = {NULL, NULL, NULL, 0, 1, NULL, NULL, NULL};
    assert_ch_error(ch_model_convert_sync_bn(b, &bad, NULL), CH_ERR_INVALID, "allreduce_sum");
    bad = (ch_nn_sync_t){ar_identity, NULL, NULL, 2, 2, NULL, NULL, NULL};
    assert_ch_error(ch_model_convert_sync_bn(b, &bad, NULL), CH_ERR_INVALID, "rank 2");
    bad = (ch_nn_sync_t){ar_identity, NULL, NULL, 0, 1, nb_start, NULL, NULL};
    assert_ch_error(ch_model_convert_sync_bn(b, &bad, NULL), CH_ERR_INVALID, "needs wait");
    bad = (ch_nn_sync_t){ar_identity, NULL, NULL, 0, 1, NULL, NULL, nb_wait};
    assert_ch_error(ch_model_convert_sync_bn(b, &bad, NULL), CH_ERR_INVALID, "needs wait");
    bad = (ch_nn_sync_t){ar_identity, NULL, NULL, 0, 1, NULL, nb_gather, nb_wait};
    assert_ch_error(ch_model_convert_sync_bn(b, &bad, NULL), CH_ERR_INVALID, "no allgather");
    ch_tensor_free(&x);
    ch_tensor_free(&y);
    ch_model_destroy(a);
    ch_model_destroy(b);
    ch_compute_destroy(cx);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_smallcnn),
        cmocka_unit_test(test_golden_convpool_modules),
        cmocka_unit_test(test_golden_resnet18),
        cmocka_unit_test(test_golden_resnet50_summary),
        cmocka_unit_test(test_grad_hook_order),
        cmocka_unit_test(test_freeze_same_fc_grad),
        cmocka_unit_test(test_modes_and_memory),
        cmocka_unit_test(test_syncbn_world_of_one),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
