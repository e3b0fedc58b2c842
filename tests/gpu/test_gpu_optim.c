/* GPU AdamW / RMSprop steps (framework/ops/cuda/adamw_rmsprop.cu, through
 * ch_optimizer_t) against the CPU ones, bit for bit (the kernels perform
 * the CPU loop's float32 operations with round-to-nearest intrinsics), the
 * GPU state read back for resume files, and cross-entropy with label
 * smoothing (loss.cu) against the CPU op (double sums in another
 * order: relative 1e-6 / 1e-5). SKIPs without a GPU; COHORT_GPU_TESTS_ON_CPU=1
 * runs it CPU against CPU (a self-check of the test). */
#include "config.h"

#include "tests/gpu/gpu_testutil.h"

#include "framework/train/optimizer.h"

static ch_compute_t *cx;

static void context(void)
{
    GT_NEED_GPU();
    if (cx) return;
    if (!gt_cpu_mode()) assert_ch_ok(ch_device_set(0));
    ch_compute_options_t o;
    ch_compute_options_default(&o);
    o.gpu_device = 0;
    o.allow_tf32 = 0;
    o.bf16 = 0;
    assert_ch_ok(ch_compute_create(&o, &cx));
}

enum { NT = 4, STEPS = 4 };
static const int64_t sizes[NT] = {1, 1000, 70001, 262147};

static void check_bitwise(const char *what, const ch_tensor_t *dev, const float *ref, int64_t n)
{
    ch_tensor_t g;
    assert_ch_ok(ch_tensor_alloc(&g, CH_F32, 1, &n, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    gt_download(cx, dev, &g);
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&ch_tensor_f32(&g)[i], &ref[i], sizeof(float)))
            fail_msg("%s: element %lld: GPU %.9g, CPU %.9g", what, (long long)i,
                     (double)ch_tensor_f32(&g)[i], (double)ref[i]);
    ch_tensor_free(&g);
}

static void run_case(const ch_optimizer_options_t *o, const char *name)
{
    gt_pair_t p[NT], g[NT];
    ch_optimizer_t *oc, *og;
    assert_ch_ok(ch_optimizer_create(o, &oc));
    assert_ch_ok(ch_optimizer_create(o, &og));
    ch_optimizer_set_compute(og, cx);
    for (int i = 0; i < NT; i++) {
        char pn[16];
        snprintf(pn, sizeof pn, "p%d", i);
        gt_pair_rand(cx, &p[i], 1, &sizes[i], CH_LAYOUT_PLAIN, 211 + i, -1, 1);
        gt_pair_rand(cx, &g[i], 1, &sizes[i], CH_LAYOUT_PLAIN, 221 + i, -1, 1);
        assert_ch_ok(ch_optimizer_add_param(oc, pn, ch_tensor_f32(&p[i].h),
                                            ch_tensor_f32(&g[i].h), (size_t)sizes[i]));
        assert_ch_ok(ch_optimizer_add_param_on(og, pn, ch_tensor_f32(&p[i].d),
                                               ch_tensor_f32(&g[i].d), (size_t)sizes[i],
                                               gt_dev(), 0));
    }
    for (int s = 0; s < STEPS; s++) {
        ch_optimizer_set_lr(oc, 0.01 / (s + 1));
        ch_optimizer_set_lr(og, 0.01 / (s + 1));
        assert_ch_ok(ch_optimizer_step(oc));
        assert_ch_ok(ch_optimizer_step(og));
        for (int i = 0; i < NT; i++) { /* a new gradient, the same on both sides */
            gt_fill(ch_tensor_f32(&g[i].h), sizes[i], 231 + 10 * s + i, -1, 1);
            gt_upload(cx, &g[i].h, &g[i].d);
        }
    }
    assert_ch_ok(ch_compute_sync(cx));
    for (int i = 0; i < NT; i++) {
        char what[128];
        snprintf(what, sizeof what, "%s tensor %d (numel %lld): param", name, i,
                 (long long)sizes[i]);
        check_bitwise(what, &p[i].d, ch_tensor_f32(&p[i].h), sizes[i]);
        for (int j = 0; j < ch_optimizer_num_state(og); j++) {
            const float *a, *b;
            size_t n;
            int has;
            assert_ch_ok(ch_optimizer_state(oc, i, j, &a, &n, &has));
            assert_true(has);
            assert_ch_ok(ch_optimizer_state(og, i, j, &b, &n, &has)); /* read back from the GPU */
            assert_true(has);
            if (memcmp(a, b, n * sizeof(float)))
                fail_msg("%s tensor %d: %s differs between GPU and CPU", name, i,
                         ch_optimizer_state_name(og, j));
        }
        gt_pair_free(&p[i]);
        gt_pair_free(&g[i]);
    }
    ch_optimizer_destroy(oc);
    ch_optimizer_destroy(og);
}

static void test_adamw_rmsprop(void **state)
{
    context();
    ch_optimizer_options_t o;
    ch_optimizer_options_default(CH_OPTIM_ADAMW, &o);
    run_case(&o, "adamw");
    o.amsgrad = 1;
    o.weight_decay = 0.1;
    run_case(&o, "adamw amsgrad");
    ch_optimizer_options_default(CH_OPTIM_RMSPROP, &o);
    run_case(&o, "rmsprop");
    o.momentum = 0.9;
    o.centered = 1;
    o.weight_decay = 0.01;
    run_case(&o, "rmsprop centered momentum");
}

/* The op, then (GPU: the deferred label check) a sync. */
static ch_status smooth_then_sync(const ch_tensor_t *logits, const ch_tensor_t *labels,
                                  ch_tensor_t *loss)
{
    ch_status s = ch_op_cross_entropy_smooth(cx, logits, labels, 0.1, loss, NULL);
    return s != CH_OK ? s : ch_compute_sync(cx);
}

static void test_label_smoothing(void **state)
{
    context();
    const int64_t NK[3][2] = {{37, 1000}, {128, 10}, {1, 7}};
    for (int c = 0; c < 3; c++) {
        int64_t N = NK[c][0], K = NK[c][1], ls[2] = {N, K}, one[1] = {1}, nl[1] = {N};
        gt_pair_t lg, loss, dl;
        ch_tensor_t yh, yd;
        gt_pair_rand(cx, &lg, 2, ls, CH_LAYOUT_PLAIN, 301 + c, -6, 6);
        assert_ch_ok(ch_tensor_alloc(&yh, CH_I64, 1, nl, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
        assert_ch_ok(ch_tensor_alloc(&yd, CH_I64, 1, nl, CH_LAYOUT_PLAIN, gt_dev(), 0));
        uint64_t st = 311 + (uint64_t)c;
        for (int64_t i = 0; i < N; i++) ch_tensor_i64(&yh)[i] = (int64_t)(gt_next(&st) % (uint64_t)K);
        gt_upload(cx, &yh, &yd);
        gt_pair_out(cx, &loss, 1, one, CH_LAYOUT_PLAIN);
        gt_pair_out(cx, &dl, 2, ls, CH_LAYOUT_PLAIN);
        assert_ch_ok(ch_op_cross_entropy_smooth(cx, &lg.h, &yh, 0.1, &loss.h, &dl.h));
        assert_ch_ok(ch_op_cross_entropy_smooth(cx, &lg.d, &yd, 0.1, &loss.d, &dl.d));
        gt_compare(cx, "cross_entropy_smooth: loss", &loss, 1e-6);
        gt_compare(cx, "cross_entropy_smooth: dlogits", &dl, 1e-5);
        /* a bad label is reported with its sample (on the GPU by the deferred
         * check at the next sync, loss.cu) */
        ch_tensor_i64(&yh)[N - 1] = K;
        gt_upload(cx, &yh, &yd);
        assert_ch_error(smooth_then_sync(&lg.d, &yd, &loss.d), CH_ERR_RANGE, "expected 0..");
        gt_pair_free(&lg);
        gt_pair_free(&loss);
        gt_pair_free(&dl);
        ch_tensor_free(&yh);
        ch_tensor_free(&yd);
    }
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_rmsprop),
        cmocka_unit_test(test_label_smoothing),
    };
    int rc = ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
    ch_compute_destroy(cx);
    return rc;
}
