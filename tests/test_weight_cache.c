/* Tests for the converted-weight cache of the CPU convolution
 * (framework/ops/cpu/conv.c, the data version of framework/tensor/tensor.h):
 * forward calls with unchanged weights reuse one conversion and give the
 * same bytes; every path that writes parameters (ch_op_fill/copy, raw writes
 * followed by ch_tensor_data_changed, SGD steps, state-dict loading, model
 * copy, model files and resume files) makes the next forward use the new
 * weights, compared bit for bit with a context whose cache is off
 * (COHORT_WEIGHT_CACHE=0: converts on every call with the same kernels).
 * A missing bump on any of these paths makes the cached forward reuse the
 * old conversion and fail the comparison. */
#include "config.h"

#include "tests/nn_testutil.h"

#include "framework/core/log.h"
#include "framework/nn/nn.h"
#include "framework/nn/nn_exec.h"
#include "framework/ops/ops.h"
#include "framework/train/optim.h"
#include "io/state/train_state.h"
#include "models/models.h"

#include <unistd.h>

/* A one-thread context with the cache in `mode` ("1", "0", "check"). */
static ch_compute_t *cx_mode(const char *mode)
{
    assert_int_equal(setenv("COHORT_WEIGHT_CACHE", mode, 1), 0);
    ch_compute_options_t o;
    ch_compute_options_default(&o);
    o.num_threads = 1;
    ch_compute_t *cx = NULL;
    assert_ch_ok(ch_compute_create(&o, &cx));
    assert_int_equal(unsetenv("COHORT_WEIGHT_CACHE"), 0);
    return cx;
}

static void fill_pattern(ch_tensor_t *t, float scale, int phase)
{
    float *d = t->data;
    int64_t n = ch_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) d[i] = scale * (float)((i * 7 + phase) % 23 - 11);
}

static int64_t conversions(const ch_compute_t *cx, int64_t *reused)
{
    int64_t c = 0;
    ch_compute_weight_conversions(cx, &c, reused);
    return c;
}

/* y = conv(x, w) in a fresh context with the cache off, into ref. */
static void conv_ref(const ch_tensor_t *x, const ch_tensor_t *w, const ch_conv2d_params_t *p,
                     ch_tensor_t *ref)
{
    ch_compute_t *r = cx_mode("0");
    assert_ch_ok(ch_op_conv2d_forward(r, x, w, NULL, p, ref));
    int64_t reused = -1;
    assert_true(conversions(r, &reused) >= 0);
    assert_int_equal(reused, 0);
    ch_compute_destroy(r);
}

static void assert_same(const ch_tensor_t *a, const ch_tensor_t *b, const char *what)
{
    assert_int_equal(a->nbytes, b->nbytes);
    if (memcmp(a->data, b->data, a->nbytes) != 0) fail_msg("%s: outputs differ", what);
}

/* One convolution shape through the ops API: `gemm` picks a 3x3 kernel on
 * 1x1 maps (the dense-matrix path), otherwise 3x3 on 8x8 maps in the
 * context's preferred layout (oneDNN's direct kernel with blocked weights
 * from AVX2 up, or plain weights without conversion below). */
static void ops_case(int gemm)
{
    ch_compute_t *cx = cx_mode("1");
    int64_t hw = gemm ? 1 : 8;
    int64_t sx[4] = {4, 32, hw, hw}, sw[4] = {32, 32, 3, 3};
    ch_layout_t L = ch_compute_preferred_layout(cx, CH_DEV_CPU, 32);
    ch_tensor_t x, w, w2, wu, y, y2, ref, dx;
    assert_ch_ok(ch_tensor_alloc(&x, CH_F32, 4, sx, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&y, CH_F32, 4, sx, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&y2, CH_F32, 4, sx, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&ref, CH_F32, 4, sx, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&dx, CH_F32, 4, sx, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc_f32(&w, 4, sw));
    assert_ch_ok(ch_tensor_alloc_f32(&w2, 4, sw));
    fill_pattern(&x, 0.01f, 0);
    fill_pattern(&w, 0.02f, 1);
    fill_pattern(&w2, 0.03f, 5);
    w.versioned = 1; /* as framework/nn marks module weights */
    w2.versioned = 1;
    ch_conv2d_params_t p = {1, 1, 1, 1};

    /* (a) the same weights twice: one conversion, reused, same bytes */
    int64_t r0, r1, r2;
    int64_t c0 = conversions(cx, &r0);
    assert_ch_ok(ch_op_conv2d_forward(cx, &x, &w, NULL, &p, &y));
    int64_t c1 = conversions(cx, &r1);
    int converts = c1 > c0; /* 0: this ISA's kernel takes plain OIHW weights */
    if (gemm) assert_true(converts);
    assert_ch_ok(ch_op_conv2d_forward(cx, &x, &w, NULL, &p, &y2));
    int64_t c2 = conversions(cx, &r2);
    assert_int_equal(c2, c1);
    if (converts) assert_int_equal(r2, r1 + 1);
    assert_same(&y, &y2, "forward twice");
    conv_ref(&x, &w, &p, &ref);
    assert_same(&y, &ref, "reused forward vs cache off");

    /* an unversioned header over the same data is never served from the cache */
    wu = w;
    wu.versioned = 0;
    assert_ch_ok(ch_op_conv2d_forward(cx, &x, &wu, NULL, &p, &y2));
    assert_int_equal(conversions(cx, &r2), c1 + (converts ? 1 : 0));
    assert_same(&y2, &ref, "unversioned weights");

    /* two weight tensors through one primitive: each kept in its own slot */
    ch_tensor_t ref2;
    assert_ch_ok(ch_tensor_alloc(&ref2, CH_F32, 4, sx, L, CH_DEV_CPU, 0));
    conv_ref(&x, &w2, &p, &ref2);
    int64_t ca = conversions(cx, NULL);
    for (int k = 0; k < 3; k++) {
        assert_ch_ok(ch_op_conv2d_forward(cx, &x, &w2, NULL, &p, &y2));
        assert_same(&y2, &ref2, "second weight tensor");
        assert_ch_ok(ch_op_conv2d_forward(cx, &x, &w, NULL, &p, &y2));
        assert_same(&y2, &ref, "first weight tensor after the second");
    }
    int64_t cw = conversions(cx, NULL);
    assert_int_equal(cw, ca + (converts ? 1 : 0)); /* w2 once, w kept */

    /* backward data: converted once (or, on the GEMM path, the forward's
     * dense matrix reused), then reused */
    assert_ch_ok(ch_op_conv2d_backward_data(cx, &y, &w, &p, &dx));
    int64_t cb = conversions(cx, NULL);
    if (gemm) assert_int_equal(cb, cw); /* one dense matrix serves both */
    assert_ch_ok(ch_op_conv2d_backward_data(cx, &y, &w, &p, &y2));
    assert_int_equal(conversions(cx, NULL), cb);
    assert_same(&dx, &y2, "backward data twice");

    /* (b) writes through ops: the next forward sees the new weights */
    assert_ch_ok(ch_op_fill(cx, &w, 0.125f));
    assert_ch_ok(ch_op_conv2d_forward(cx, &x, &w, NULL, &p, &y));
    conv_ref(&x, &w, &p, &ref);
    assert_same(&y, &ref, "after ch_op_fill");
    assert_ch_ok(ch_op_copy(cx, &w2, &w));
    assert_ch_ok(ch_op_conv2d_forward(cx, &x, &w, NULL, &p, &y));
    conv_ref(&x, &w, &p, &ref);
    assert_same(&y, &ref, "after ch_op_copy");
    assert_ch_ok(ch_op_scale(cx, &w, -2.0f));
    assert_ch_ok(ch_op_conv2d_forward(cx, &x, &w, NULL, &p, &y));
    conv_ref(&x, &w, &p, &ref);
    assert_same(&y, &ref, "after ch_op_scale");
    assert_ch_ok(ch_op_zero(cx, &w));
    assert_ch_ok(ch_op_conv2d_forward(cx, &x, &w, NULL, &p, &y));
    conv_ref(&x, &w, &p, &ref);
    assert_same(&y, &ref, "after ch_op_zero");

    /* a raw write followed by ch_tensor_data_changed */
    fill_pattern(&w, 0.05f, 3);
    ch_tensor_data_changed();
    assert_ch_ok(ch_op_conv2d_forward(cx, &x, &w, NULL, &p, &y));
    conv_ref(&x, &w, &p, &ref);
    assert_same(&y, &ref, "after a raw write and ch_tensor_data_changed");

    if (converts) {
        /* the rule matters: a raw write without the call is not seen ... */
        fill_pattern(&w, 0.07f, 9);
        assert_ch_ok(ch_op_conv2d_forward(cx, &x, &w, NULL, &p, &y2));
        assert_same(&y2, &y, "a raw write without the call (kept copy reused)");
        /* ... and the check mode reports it */
        ch_compute_t *ck = cx_mode("check");
        assert_ch_ok(ch_op_conv2d_forward(ck, &x, &w, NULL, &p, &y));
        assert_ch_ok(ch_op_conv2d_forward(ck, &x, &w, NULL, &p, &y)); /* unchanged: fine */
        fill_pattern(&w, 0.09f, 2);
        assert_ch_error(ch_op_conv2d_forward(ck, &x, &w, NULL, &p, &y), CH_ERR_INTERNAL,
                        "ch_tensor_data_changed");
        ch_compute_destroy(ck);
    }

    /* the cache off: every call converts */
    ch_compute_t *off = cx_mode("0");
    for (int k = 0; k < 2; k++) assert_ch_ok(ch_op_conv2d_forward(off, &x, &w, NULL, &p, &y));
    assert_int_equal(conversions(off, &r2), converts ? 2 : 0);
    assert_int_equal(r2, 0);
    ch_compute_destroy(off);

    ch_tensor_t *all[] = {&x, &w, &w2, &y, &y2, &ref, &ref2, &dx};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ch_tensor_free(all[i]);
    ch_compute_destroy(cx);
}

static void test_ops_direct(void **state)
{
    (void)state;
    ops_case(0);
}

static void test_ops_gemm(void **state)
{
    (void)state;
    ops_case(1);
}

/* More weight tensors through one primitive than it keeps copies of
 * (CPU_WSLOTS = 32): the least recently used copy is replaced, and every
 * output stays right. */
static void test_slots_evict(void **state)
{
    (void)state;
    enum { NW = 33 };
    ch_compute_t *cx = cx_mode("1"), *off = cx_mode("0");
    int64_t sx[4] = {1, 16, 4, 4}, sw[4] = {16, 16, 3, 3};
    ch_layout_t L = ch_compute_preferred_layout(cx, CH_DEV_CPU, 16);
    ch_tensor_t x, y, ref, w[NW];
    assert_ch_ok(ch_tensor_alloc(&x, CH_F32, 4, sx, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&y, CH_F32, 4, sx, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&ref, CH_F32, 4, sx, L, CH_DEV_CPU, 0));
    fill_pattern(&x, 0.01f, 0);
    for (int i = 0; i < NW; i++) {
        assert_ch_ok(ch_tensor_alloc_f32(&w[i], 4, sw));
        fill_pattern(&w[i], 0.01f * (float)(i + 1), i);
        w[i].versioned = 1;
    }
    ch_conv2d_params_t p = {1, 1, 1, 1};
    /* run weight i; return the conversions it made, checking the output */
#define RUN(i, made)                                                                 do {                                                                                 int64_t c0_ = conversions(cx, NULL);                                             assert_ch_ok(ch_op_conv2d_forward(cx, &x, &w[i], NULL, &p, &y));                 (made) = conversions(cx, NULL) - c0_;                                            assert_ch_ok(ch_op_conv2d_forward(off, &x, &w[i], NULL, &p, &ref));              assert_same(&y, &ref, "weight tensor through a shared primitive");           } while (0)
    int64_t made;
    RUN(0, made);
    int skip = made == 0; /* this ISA's kernel takes plain weights: nothing kept */
    if (skip) goto done;
    for (int i = 1; i < NW - 1; i++) {
        RUN(i, made);
        assert_int_equal(made, 1);
    }
    for (int i = 0; i < NW - 1; i++) { /* all 32 kept: nothing converted */
        RUN(i, made);
        assert_int_equal(made, 0);
    }
    RUN(NW - 1, made); /* the 33rd replaces the least recently used, w[0] */
    assert_int_equal(made, 1);
    RUN(1, made);
    assert_int_equal(made, 0);
    RUN(0, made);
    assert_int_equal(made, 1);
#undef RUN
done:
    for (int i = 0; i < NW; i++) ch_tensor_free(&w[i]);
    ch_tensor_free(&x);
    ch_tensor_free(&y);
    ch_tensor_free(&ref);
    ch_compute_destroy(cx);
    ch_compute_destroy(off);
    if (skip) ch_test_skip("no weight conversion on this ISA");
}

static void test_bad_mode(void **state)
{
    (void)state;
    assert_int_equal(setenv("COHORT_WEIGHT_CACHE", "sometimes", 1), 0);
    ch_compute_t *cx = NULL;
    assert_ch_error(ch_compute_create(NULL, &cx), CH_ERR_INVALID, "COHORT_WEIGHT_CACHE=sometimes");
    assert_null(cx);
    assert_int_equal(unsetenv("COHORT_WEIGHT_CACHE"), 0);
}

/* ------------------------------------------------------------ models */

static ch_model_t *make(uint64_t seed)
{
    ch_model_options_t o;
    ch_model_options_default(&o);
    o.in_channels = 1;
    o.num_classes = 10;
    o.seed = seed;
    ch_model_t *m = NULL;
    assert_ch_ok(ch_model_create("resnet18", &o, &m));
    return m;
}

typedef struct {
    ch_compute_t *cx;
    ch_tensor_t x, labels;
    float *got, *want;
    size_t n;
} fixture;

/* Eval forward of m with f->cx into f->got; the same with a fresh context
 * whose cache is off into f->want; they must be equal bit for bit. Returns
 * the conversions the cached forward made. */
static int64_t check_forward(fixture *f, ch_model_t *m, const char *what)
{
    const ch_tensor_t *lg;
    ch_model_train(m, 0);
    int64_t c0 = conversions(f->cx, NULL);
    assert_ch_ok(ch_model_forward(m, f->cx, &f->x, &lg));
    int64_t made = conversions(f->cx, NULL) - c0;
    f->n = (size_t)ch_tensor_numel(lg);
    memcpy(f->got, lg->data, f->n * sizeof(float));
    ch_compute_t *r = cx_mode("0");
    assert_ch_ok(ch_model_forward(m, r, &f->x, &lg));
    memcpy(f->want, lg->data, f->n * sizeof(float));
    ch_compute_destroy(r);
    if (memcmp(f->got, f->want, f->n * sizeof(float)) != 0)
        fail_msg("%s: logits differ from a forward with the cache off (stale weights?)", what);
    return made;
}

static void test_model_paths(void **state)
{
    (void)state;
    fixture f;
    memset(&f, 0, sizeof f);
    f.cx = cx_mode("1");
    int64_t sx[4] = {2, 1, 28, 28}, sl[1] = {2};
    assert_ch_ok(ch_tensor_alloc_f32(&f.x, 4, sx));
    fill_pattern(&f.x, 0.1f, 0);
    assert_ch_ok(ch_tensor_alloc(&f.labels, CH_I64, 1, sl, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    ((int64_t *)f.labels.data)[0] = 3;
    ((int64_t *)f.labels.data)[1] = 7;
    f.got = malloc(64 * sizeof(float));
    f.want = malloc(64 * sizeof(float));
    float *prev = malloc(64 * sizeof(float));
    assert_non_null(f.got);
    assert_non_null(f.want);
    assert_non_null(prev);
    ch_model_t *a = make(1), *b = make(2), *c = make(3);
    int ne = ch_model_num_entries(b);
    ch_nn_view_t *views = calloc((size_t)ne, sizeof *views);
    assert_non_null(views);
    assert_ch_ok(ch_model_state_dict(b, views, ne, NULL));
    char dir[1024], model_path[1200], resume_path[1200];
    snprintf(dir, sizeof dir, "%s/tests/tmp-weight-cache-%d", ch_test_builddir(), (int)getpid());
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(model_path, sizeof model_path, "%s/model.safetensors", dir);
    snprintf(resume_path, sizeof resume_path, "%s/resume.safetensors", dir);
    assert_ch_ok(ch_train_state_write_model(c, model_path));
    ch_sgd_options_t so = {0.05, 0.9, 0.0, 0.0, 0};
    ch_sgd_t *sgd;
    assert_ch_ok(ch_sgd_create(&so, &sgd));
    assert_ch_ok(ch_sgd_add_model(sgd, a));

    /* (a) evaluation: the second forward converts nothing */
    int64_t first = check_forward(&f, a, "first forward");
    int64_t r0, r1;
    conversions(f.cx, &r0);
    memcpy(prev, f.got, f.n * sizeof(float));
    int64_t second = check_forward(&f, a, "second forward");
    conversions(f.cx, &r1);
    assert_int_equal(second, 0);
    if (first > 0) assert_true(r1 > r0);
    assert_memory_equal(prev, f.got, f.n * sizeof(float));
    ch_log_info("resnet18 1x28x28 eval: %lld conversions in the first forward, %lld in the "
                "second (%lld reused)",
                (long long)first, (long long)second, (long long)(r1 - r0));

    /* (b) each path that writes the parameters */
    ch_model_zero_grad(a);
    const ch_tensor_t *lg;
    float loss;
    ch_model_train(a, 1);
    int64_t ct = conversions(f.cx, NULL);
    assert_ch_ok(ch_model_forward(a, f.cx, &f.x, &lg));
    assert_int_equal(conversions(f.cx, NULL), ct); /* weights unchanged since the eval */
    assert_ch_ok(ch_model_loss(a, f.cx, &f.labels, &loss));
    assert_ch_ok(ch_model_backward(a, f.cx, NULL));
    memcpy(prev, f.got, f.n * sizeof(float));
    assert_ch_ok(ch_sgd_step(sgd));
    assert_true(check_forward(&f, a, "after an SGD step") == first);
    assert_true(memcmp(prev, f.got, f.n * sizeof(float)) != 0);

    assert_ch_ok(ch_model_load_state_dict(a, views, ne, 1, NULL, NULL, NULL));
    check_forward(&f, a, "after ch_model_load_state_dict");
    assert_true(memcmp(prev, f.got, f.n * sizeof(float)) != 0);
    memcpy(prev, f.got, f.n * sizeof(float));

    assert_ch_ok(ch_train_state_load_pretrained(a, model_path, NULL, NULL));
    check_forward(&f, a, "after ch_train_state_load_pretrained");
    assert_true(memcmp(prev, f.got, f.n * sizeof(float)) != 0);
    memcpy(prev, f.got, f.n * sizeof(float));

    ch_train_progress_t pg = {
        .epoch = 1, .global_step = 5, .epoch_step = 1, .epoch_steps = 4, .seed = 1, .world_size = 1};
    assert_ch_ok(ch_train_state_write_resume(b, sgd, resume_path, &pg, ""));
    assert_ch_ok(ch_train_state_read_resume(a, NULL, resume_path, &pg));
    check_forward(&f, a, "after ch_train_state_read_resume");
    assert_true(memcmp(prev, f.got, f.n * sizeof(float)) != 0);
    memcpy(prev, f.got, f.n * sizeof(float));

    assert_ch_ok(ch_model_copy(a, c));
    check_forward(&f, a, "after ch_model_copy");
    assert_true(memcmp(prev, f.got, f.n * sizeof(float)) != 0);
    memcpy(prev, f.got, f.n * sizeof(float));

    assert_ch_ok(ch_model_init(a, 77));
    check_forward(&f, a, "after ch_model_init");
    assert_true(memcmp(prev, f.got, f.n * sizeof(float)) != 0);
    memcpy(prev, f.got, f.n * sizeof(float));

    /* a pointer kept from ch_model_find, written later, then the call */
    float *w = ch_model_find(a, "layer1.0.conv1.weight")->data;
    check_forward(&f, a, "before the raw write");
    memcpy(prev, f.got, f.n * sizeof(float));
    for (int k = 0; k < 64 * 9; k++) w[k] *= -3.0f;
    ch_tensor_data_changed();
    check_forward(&f, a, "after a raw write and ch_tensor_data_changed");
    assert_true(memcmp(prev, f.got, f.n * sizeof(float)) != 0);

    remove(model_path);
    remove(resume_path);
    rmdir(dir);
    ch_sgd_destroy(sgd);
    free(views);
    ch_model_destroy(a);
    ch_model_destroy(b);
    ch_model_destroy(c);
    ch_tensor_free(&f.x);
    ch_tensor_free(&f.labels);
    free(f.got);
    free(f.want);
    free(prev);
    ch_compute_destroy(f.cx);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops_direct),
        cmocka_unit_test(test_ops_gemm),
        cmocka_unit_test(test_slots_evict),
        cmocka_unit_test(test_bad_mode),
        cmocka_unit_test(test_model_paths),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
