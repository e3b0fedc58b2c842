/* One training step of the same model on the CPU and on GPU 0 (or, with
 * COHORT_GPU_TESTS_ON_CPU=1, on the CPU again: tests/gpu/gpu_testutil.h),
 * shared by test_nn_act and test_nn_graph (not installed). */
#ifndef COHORT_TESTS_NN_GPU_STEP_H
#define COHORT_TESTS_NN_GPU_STEP_H

#include "tests/nn_testutil.h"
#include "tests/gpu/gpu_testutil.h"

/* mc, mg: the same model (same seed) on the CPU, both finalized; mg is
 * moved to the "GPU" here; both destroyed here. Input (N, C, H, W) =
 * xs, a fixed smooth pattern; labels (3 n + 1) % classes. Checks logits and
 * loss (relative L2 <= 1e-4, TF32 off) and every gradient (<= grad_tol).
 * The caller has done GT_NEED_GPU(). */
static inline void nt_gpu_step_vs_cpu(ch_model_t *mc, ch_model_t *mg, const int64_t xs[4],
                                      int64_t classes, double grad_tol)
{
    if (!gt_cpu_mode()) assert_ch_ok(ch_device_set(0));
    ch_compute_options_t o;
    ch_compute_options_default(&o);
    o.num_threads = 1;
    o.gpu_device = 0;
    o.allow_tf32 = 0;
    ch_compute_t *cc, *cg;
    assert_ch_ok(ch_compute_create(&o, &cc));
    assert_ch_ok(ch_compute_create(&o, &cg));
    assert_ch_ok(ch_model_to_device(mg, gt_dev(), 0));
    int64_t ls = xs[0], ks[2] = {xs[0], classes};
    ch_tensor_t x, lab, xd, labd, lg;
    assert_ch_ok(ch_tensor_alloc_f32(&x, 4, xs));
    assert_ch_ok(ch_tensor_alloc(&lab, CH_I64, 1, &ls, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    for (int64_t i = 0; i < ch_tensor_numel(&x); i++) ch_tensor_f32(&x)[i] = 2.0f * sinf(0.3f * (float)i);
    for (int64_t i = 0; i < ls; i++) ch_tensor_i64(&lab)[i] = (3 * i + 1) % classes;
    assert_ch_ok(ch_tensor_alloc(&xd, CH_F32, 4, xs, CH_LAYOUT_PLAIN, gt_dev(), 0));
    assert_ch_ok(ch_tensor_alloc(&labd, CH_I64, 1, &ls, CH_LAYOUT_PLAIN, gt_dev(), 0));
    gt_upload(cg, &x, &xd);
    gt_upload(cg, &lab, &labd);
    const ch_tensor_t *yc, *yg;
    float loss_c, loss_g;
    ch_model_train(mc, 1);
    ch_model_train(mg, 1);
    assert_ch_ok(ch_model_forward(mc, cc, &x, &yc));
    assert_ch_ok(ch_model_loss(mc, cc, &lab, &loss_c));
    assert_ch_ok(ch_model_forward(mg, cg, &xd, &yg));
    assert_ch_ok(ch_model_loss(mg, cg, &labd, &loss_g));
    assert_ch_ok(ch_tensor_alloc_f32(&lg, 2, ks));
    gt_download(cg, yg, &lg);
    GT_CHECK_REL("logits", ch_tensor_f32(&lg), ch_tensor_f32(yc), ks[0] * ks[1], 1e-4);
    if (!(fabs((double)loss_g - loss_c) <= 1e-4 * fabs((double)loss_c)))
        fail_msg("loss GPU %.8g vs CPU %.8g", (double)loss_g, (double)loss_c);
    assert_ch_ok(ch_model_backward(mc, cc, NULL));
    assert_ch_ok(ch_model_backward(mg, cg, NULL));
    assert_ch_ok(ch_compute_sync(cg));
    assert_ch_ok(ch_model_sync_to_host(mg));
    for (int i = 0; i < ch_model_num_params(mc); i++) {
        const ch_param_t *pc = ch_model_param(mc, i), *pg = ch_model_param(mg, i);
        char what[160];
        snprintf(what, sizeof what, "gradient of %s", pc->name);
        GT_CHECK_REL(what, pg->grad, pc->grad, (int64_t)pc->numel, grad_tol);
    }
    ch_tensor_t *all[] = {&x, &lab, &xd, &labd, &lg};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ch_tensor_free(all[i]);
    ch_model_destroy(mc);
    ch_model_destroy(mg);
    ch_compute_destroy(cc);
    ch_compute_destroy(cg);
}

#endif
