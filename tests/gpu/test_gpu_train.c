/* GPU training step against the CPU backend (issue #7):
 *
 *   one resnet18 (10 classes, 3x64x64 input, batch 8) built twice from the
 *   same seed; one copy stays on the CPU, the other moves to GPU 0
 *   (ch_model_to_device); both run forward, cross-entropy loss, backward and
 *   one SGD step (momentum 0.9, weight decay 5e-4; CPU loops vs the fused
 *   ch_op_sgd_step) on the same batch (uploaded with ch_op_upload_async);
 *   logits, loss, every gradient, every updated parameter, the running
 *   statistics and the momentum buffers are compared by relative L2 error
 *   ||gpu - cpu|| / ||cpu||:
 *     fp32 with TF32 off: forward (logits, loss, running stats, parameters)
 *                         <= 1e-4, gradients and momentum buffers <= 1e-3;
 *     (per tensor);
 *     bf16 autocast:      forward <= 2e-2, gradients <= 5e-2 (bf16 keeps 8
 *                         bits of mantissa: ~4e-3 per rounding, accumulated
 *                         over 20 layers), gradients, parameters and buffers
 *                         over all tensors together.
 *   The fp32 comparison again with SyncBatchNorm over a world of one (the
 *   device SyncBN path: statistics gathered in place on the device, counts
 *   on the host). The fp32 comparison again for a user's CNN from the
 *   registry with Flatten, Dropout (the same mask on both) and Identity.
 *   Also: host mirror round trips (to device, sync back, to the CPU) are
 *   exact, and the device API's errors on a machine without a GPU.
 *
 * The comparisons SKIP with a visible reason where ch_device_count() is 0
 * (a CPU machine or a build without CUDA); the error tests always run.
 */
#include "config.h"

#include "tests/harness.h"

#include "framework/tensor/device.h"
#include "framework/nn/nn.h"
#include "framework/nn/nn_exec.h"
#include "framework/ops/ops.h"
#include "framework/train/optim.h"
#include "framework/tensor/tensor.h"
#include "models/models.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N = 8, C = 3, H = 64, W = 64, K = 10 };

static int gpu_count(void)
{
    int n = 0;
    if (ch_device_count(&n) != CH_OK) return 0;
    return n;
}

static double rel_l2(const float *a, const float *ref, size_t n)
{
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - (double)ref[i];
        d += e * e;
        r += (double)ref[i] * (double)ref[i];
    }
    if (!isfinite(d)) return INFINITY;
    return r > 0 ? sqrt(d / r) : sqrt(d); /* an all-zero reference: absolute */
}

static void fill_batch(float *x, int64_t *y)
{
    uint64_t st = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < (size_t)N * C * H * W; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(st >> 11) / 9007199254740992.0 * 4.0 - 2.0);
    }
    for (int i = 0; i < N; i++) y[i] = (int64_t)((i * 7 + 3) % K);
}

/* The network compare_step trains: resnet18, or test_step_vocab's CNN. */
static const char *step_arch = "resnet18";

/* A user's CNN through the registry (PyTorch default init, automatic
 * names): conv-BN-ReLU-maxpool twice, Flatten (of the GPU's channels-last
 * activation), Dropout, Linear-ReLU-Identity-Linear. */
static ch_status vocab_cnn(ch_module_t *r, const ch_model_options_t *o, void *arg)
{
    (void)arg;
    for (int i = 0, c = o->in_channels; i < 2; c = 16 << i, i++) {
        /* no conv bias: before BN its gradient is rounding noise only */
        CH_TRY(ch_nn_conv2d(r, NULL, c, 16 << i, 3, 1, 1, 0, NULL));
        CH_TRY(ch_nn_batchnorm2d(r, NULL, 16 << i, NULL));
        CH_TRY(ch_nn_relu(r, NULL, NULL));
        CH_TRY(ch_nn_maxpool2d(r, NULL, 2, 2, 0, NULL));
    }
    CH_TRY(ch_nn_flatten(r, NULL, NULL));
    CH_TRY(ch_nn_dropout(r, NULL, 0.5f, NULL));
    CH_TRY(ch_nn_linear(r, NULL, 32 * (H / 4) * (W / 4), 64, 1, NULL));
    CH_TRY(ch_nn_relu(r, NULL, NULL));
    CH_TRY(ch_nn_identity(r, NULL, NULL));
    return ch_nn_linear(r, NULL, 64, o->num_classes, 1, NULL);
}

static ch_model_t *make_resnet18(void)
{
    ch_model_options_t o;
    ch_model_options_default(&o);
    o.num_classes = K;
    o.in_channels = C;
    o.seed = 1234;
    ch_model_t *m = NULL;
    assert_ch_ok(ch_model_create(step_arch, &o, &m));
    /* the same dropout masks on both devices */
    assert_ch_ok(ch_model_set_dropout_key(m, 5, 2, 3, 2));
    return m;
}

static ch_sgd_t *make_sgd(ch_model_t *m, ch_compute_t *cx)
{
    ch_sgd_options_t so = {.lr = 0.1, .momentum = 0.9, .dampening = 0, .weight_decay = 5e-4,
                           .nesterov = 0};
    ch_sgd_t *s = NULL;
    assert_ch_ok(ch_sgd_create(&so, &s));
    ch_sgd_set_compute(s, cx);
    assert_ch_ok(ch_sgd_add_model(s, m));
    return s;
}

/* The worst per-tensor relative error over entries selected by `what` (0
 * parameters' data, 1 gradients, 2 float buffers), the name of the worst in
 * worst, and in *global the relative L2 error over all of them together. */
static double worst_entries(ch_model_t *g, ch_model_t *c, int what, char *worst, size_t len,
                            double *global)
{
    double w = 0, d2 = 0, r2 = 0;
    snprintf(worst, len, "-");
    for (int i = 0; i < ch_model_num_entries(c); i++) {
        ch_param_t *pc = ch_model_entry(c, i), *pg = ch_model_entry(g, i);
        if (pc->dtype != CH_F32) continue;
        if ((what == 2) != (pc->is_buffer != 0)) continue;
        const float *a = what == 1 ? pg->grad : pg->data;
        const float *b = what == 1 ? pc->grad : pc->data;
        double e = rel_l2(a, b, pc->numel);
        if (e > w || !isfinite(e)) {
            w = e;
            snprintf(worst, len, "%s", pc->name);
        }
        for (size_t k = 0; k < pc->numel; k++) {
            double t = (double)a[k] - (double)b[k];
            d2 += t * t;
            r2 += (double)b[k] * (double)b[k];
        }
    }
    *global = !isfinite(d2) ? INFINITY : r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
    return w;
}

/* A world of one for SyncBN: the all-reduce is the identity and the
 * all-gather a copy (in place on the GPU path, so nothing is touched there;
 * a host copy on the CPU path). */
static ch_status one_sum(void *ctx, float *d, size_t n)
{
    (void)ctx;
    (void)d;
    (void)n;
    return CH_OK;
}

static ch_status one_gather(void *ctx, const float *in, float *out, size_t n)
{
    (void)ctx;
    if (in != out) memcpy(out, in, n * sizeof(float));
    return CH_OK;
}

/* One training step on both models and the comparisons. per_tensor: the
 * tolerances bound every tensor's own relative L2 error (fp32); else they
 * bound the error over all gradients / parameters / buffers together (bf16:
 * a small tensor whose gradient nearly cancels, e.g. a deep BN bias, has a
 * large relative error of its own without anything being wrong). */
static void compare_step(int bf16, double tol_fwd, double tol_grad, int per_tensor, int syncbn)
{
    if (gpu_count() == 0) {
        ch_test_skip("no GPU visible (ch_device_count = 0%s): the CPU vs GPU resnet18 training "
                     "step runs only on a GPU machine (tests/gpu/device-check.sh)",
                     ch_device_backend_compiled() ? "" : ", built without CUDA");
        return;
    }
    assert_ch_ok(ch_device_set(0));
    ch_compute_t *ccpu = NULL, *cgpu = NULL;
    ch_compute_options_t o;
    ch_compute_options_default(&o);
    assert_ch_ok(ch_compute_create(&o, &ccpu));
    o.gpu_device = 0;
    o.allow_tf32 = 0; /* full fp32 convolutions for the 1e-4 comparison */
    o.bf16 = bf16;
    assert_ch_ok(ch_compute_create(&o, &cgpu));

    ch_model_t *mc = make_resnet18(), *mg = make_resnet18();
    assert_ch_ok(ch_model_copy(mg, mc)); /* same state, whatever the seeds did */
    assert_ch_ok(ch_model_to_device(mg, CH_DEV_CUDA, 0));
    if (syncbn) {
        /* SyncBN over a world of one on both: the GPU model's statistics
         * take the device path (in-place gather rows, host counts) */
        ch_nn_sync_t one = {one_sum, one_gather, NULL, 0, 1, NULL, NULL, NULL};
        int nc = 0, ng = 0;
        assert_ch_ok(ch_model_convert_sync_bn(mc, &one, &nc));
        assert_ch_ok(ch_model_convert_sync_bn(mg, &one, &ng));
        assert_int_equal(nc, ng);
        assert_true(ng > 0);
    }
    int di = -1;
    assert_int_equal(ch_model_device(mg, &di), CH_DEV_CUDA);
    assert_int_equal(di, 0);
    ch_model_train(mc, 1);
    ch_model_train(mg, 1);
    ch_sgd_t *sc = make_sgd(mc, ccpu), *sg = make_sgd(mg, cgpu);

    /* the batch: host (pinned when possible) and its device copy */
    float *hx = NULL;
    int64_t *hy = NULL;
    int px = 0, py = 0;
    assert_ch_ok(ch_host_alloc((void **)&hx, sizeof(float) * N * C * H * W, 1, &px));
    assert_ch_ok(ch_host_alloc((void **)&hy, sizeof(int64_t) * N, 1, &py));
    fill_batch(hx, hy);
    int64_t xs[4] = {N, C, H, W}, ys[1] = {N};
    ch_tensor_t x, y, dx, dy;
    assert_ch_ok(ch_tensor_wrap(&x, hx, CH_F32, 4, xs, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_wrap(&y, hy, CH_I64, 1, ys, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&dx, CH_F32, 4, xs, CH_LAYOUT_PLAIN, CH_DEV_CUDA, 0));
    assert_ch_ok(ch_tensor_alloc(&dy, CH_I64, 1, ys, CH_LAYOUT_PLAIN, CH_DEV_CUDA, 0));
    assert_ch_ok(ch_op_upload_async(cgpu, &x, &dx));
    assert_ch_ok(ch_op_upload_async(cgpu, &y, &dy));
    assert_ch_ok(ch_compute_wait_upload(cgpu));

    /* forward + loss */
    const ch_tensor_t *lc = NULL, *lg = NULL;
    float loss_c = 0, loss_g = 0;
    assert_ch_ok(ch_model_forward(mc, ccpu, &x, &lc));
    assert_ch_ok(ch_model_loss(mc, ccpu, &y, &loss_c));
    assert_ch_ok(ch_model_forward(mg, cgpu, &dx, &lg));
    assert_int_equal(lg->dev, CH_DEV_CUDA);
    assert_ch_ok(ch_model_loss(mg, cgpu, &dy, NULL));
    float logits_g[N * K];
    assert_ch_ok(ch_device_memcpy(0, logits_g, lg->data, sizeof logits_g, CH_MEMCPY_DEVICE_TO_HOST));
    double e_logits = rel_l2(logits_g, ch_tensor_f32(lc), N * K);

    /* backward; gradients through the host mirror */
    assert_ch_ok(ch_model_backward(mc, ccpu, NULL));
    assert_ch_ok(ch_model_backward(mg, cgpu, NULL));
    assert_ch_ok(ch_model_loss_value(mg, cgpu, &loss_g)); /* still the forward's loss */
    double e_loss = fabs((double)loss_g - loss_c) / fabs((double)loss_c);
    assert_ch_ok(ch_model_sync_to_host(mg));
    char wg[CH_NN_NAME_MAX], wb[CH_NN_NAME_MAX], wp[CH_NN_NAME_MAX];
    double g_grad = 0, g_buf = 0, g_param = 0;
    double e_grad = worst_entries(mg, mc, 1, wg, sizeof wg, &g_grad);
    double e_buf = worst_entries(mg, mc, 2, wb, sizeof wb, &g_buf);

    /* optimizer step; parameters and momentum buffers */
    assert_ch_ok(ch_sgd_step(sc));
    assert_ch_ok(ch_sgd_step(sg));
    assert_ch_ok(ch_model_sync_to_host(mg));
    double e_param = worst_entries(mg, mc, 0, wp, sizeof wp, &g_param);
    double e_mom = 0, md2 = 0, mr2 = 0;
    for (int i = 0; i < ch_sgd_num_params(sc); i++) {
        const char *nc = NULL, *ng = NULL;
        const float *bc = NULL, *bg = NULL;
        size_t n1 = 0, n2 = 0;
        int h1 = 0, h2 = 0;
        assert_ch_ok(ch_sgd_buffer(sc, i, &nc, &bc, &n1, &h1));
        assert_ch_ok(ch_sgd_buffer(sg, i, &ng, &bg, &n2, &h2));
        assert_string_equal(nc, ng);
        assert_true(h1 && h2 && n1 == n2);
        double e = rel_l2(bg, bc, n1);
        if (e > e_mom || !isfinite(e)) e_mom = e;
        for (size_t k = 0; k < n1; k++) {
            double t = (double)bg[k] - (double)bc[k];
            md2 += t * t;
            mr2 += (double)bc[k] * (double)bc[k];
        }
    }
    double g_mom = !isfinite(md2) ? INFINITY : mr2 > 0 ? sqrt(md2 / mr2) : sqrt(md2);
    /* counters are host values on both */
    const ch_param_t *nbt_c = ch_model_find(mc, "bn1.num_batches_tracked");
    const ch_param_t *nbt_g = ch_model_find(mg, "bn1.num_batches_tracked");
    assert_non_null(nbt_c);
    assert_non_null(nbt_g);
    assert_int_equal(*(const int64_t *)nbt_c->data, *(const int64_t *)nbt_g->data);

    printf("# %s%s: relative L2 logits %.3g, loss %.3g; worst tensor (all together): running "
           "stats %.3g %s (%.3g), gradients %.3g %s (%.3g), parameters %.3g %s (%.3g), momentum "
           "%.3g (%.3g)\n",
           bf16 ? "bf16" : "fp32 (no TF32)", syncbn ? ", SyncBN" : "", e_logits, e_loss, e_buf, wb, g_buf, e_grad, wg, g_grad,
           e_param, wp, g_param, e_mom, g_mom);
    fflush(stdout);

    ch_tensor_free(&dx);
    ch_tensor_free(&dy);
    ch_host_free(hx, px);
    ch_host_free(hy, py);
    ch_sgd_destroy(sc);
    ch_sgd_destroy(sg);
    ch_model_destroy(mc);
    ch_model_destroy(mg);
    ch_compute_destroy(ccpu);
    ch_compute_destroy(cgpu);

    if (!per_tensor) {
        e_buf = g_buf;
        e_grad = g_grad;
        e_param = g_param;
        e_mom = g_mom;
        snprintf(wb, sizeof wb, "(all)");
        snprintf(wg, sizeof wg, "(all)");
        snprintf(wp, sizeof wp, "(all)");
    }
    if (!(e_logits <= tol_fwd)) fail_msg("logits: relative L2 %.3g > %.3g", e_logits, tol_fwd);
    if (!(e_loss <= tol_fwd)) fail_msg("loss: relative error %.3g > %.3g", e_loss, tol_fwd);
    if (!(e_buf <= tol_fwd)) fail_msg("running stats: %s relative L2 %.3g > %.3g", wb, e_buf, tol_fwd);
    if (!(e_grad <= tol_grad)) fail_msg("gradient of %s: relative L2 %.3g > %.3g", wg, e_grad, tol_grad);
    if (!(e_param <= tol_fwd)) fail_msg("updated %s: relative L2 %.3g > %.3g", wp, e_param, tol_fwd);
    if (!(e_mom <= tol_grad)) fail_msg("momentum buffers: relative L2 %.3g > %.3g", e_mom, tol_grad);
}

/* Flatten, Dropout (the CUDA kernel draws the CPU's mask) and Identity in
 * a training step on the GPU vs the CPU. */
static void test_step_vocab(void **state)
{
    (void)state;
    static int registered;
    if (!registered) assert_ch_ok(ch_model_register("gpu_vocab_cnn", vocab_cnn, NULL));
    registered = 1;
    step_arch = "gpu_vocab_cnn";
    compare_step(0, 1e-4, 1e-3, 1, 0);
    step_arch = "resnet18";
}

static void test_step_fp32(void **state)
{
    (void)state;
    compare_step(0, 1e-4, 1e-3, 1, 0);
}

static void test_step_syncbn(void **state)
{
    (void)state;
    compare_step(0, 1e-4, 1e-3, 1, 1);
}

static void test_step_bf16(void **state)
{
    (void)state;
    compare_step(1, 2e-2, 5e-2, 0, 0);
}

/* to the device, clobber the mirror, sync back: the same bits; and back to
 * the CPU, where the model computes again. */
static void test_mirror_round_trip(void **state)
{
    (void)state;
    if (gpu_count() == 0) {
        ch_test_skip("no GPU visible (ch_device_count = 0): device round trip needs one");
        return;
    }
    assert_ch_ok(ch_device_set(0));
    ch_model_t *a = make_resnet18(), *b = make_resnet18();
    size_t np = ch_model_param_numel(a), nb = 0;
    (void)ch_model_buffer_block(a, &nb);
    assert_ch_ok(ch_model_to_device(b, CH_DEV_CUDA, 0));
    memset(ch_model_param_block(b), 0, np * sizeof(float));
    memset(ch_model_buffer_block(b, NULL), 0, nb * sizeof(float));
    assert_ch_ok(ch_model_sync_to_host(b));
    assert_memory_equal(ch_model_param_block(a), ch_model_param_block(b), np * sizeof(float));
    assert_memory_equal(ch_model_buffer_block(a, NULL), ch_model_buffer_block(b, NULL),
                        nb * sizeof(float));
    /* mirror -> device -> mirror after a change */
    ch_model_param_block(b)[0] = 42.0f;
    assert_ch_ok(ch_model_sync_to_device(b));
    ch_model_param_block(b)[0] = 0.0f;
    assert_ch_ok(ch_model_sync_to_host(b));
    assert_true(ch_model_param_block(b)[0] == 42.0f);
    ch_model_param_block(b)[0] = ch_model_param_block(a)[0];
    assert_ch_ok(ch_model_sync_to_device(b));
    assert_ch_ok(ch_model_to_device(b, CH_DEV_CPU, 0));
    assert_int_equal(ch_model_device(b, NULL), CH_DEV_CPU);
    assert_true(ch_model_device_param_block(b) == ch_model_param_block(b));
    assert_memory_equal(ch_model_param_block(a), ch_model_param_block(b), np * sizeof(float));
    ch_model_destroy(a);
    ch_model_destroy(b);
}

/* Runs everywhere: the CPU side of the device API, and its errors where
 * there is no GPU. */
static void test_device_api_cpu(void **state)
{
    (void)state;
    ch_model_t *m = make_resnet18();
    int di = -1;
    assert_int_equal(ch_model_device(m, &di), CH_DEV_CPU);
    assert_int_equal(di, 0);
    assert_true(ch_model_device_param_block(m) == ch_model_param_block(m));
    assert_true(ch_model_device_grad_block(m) == ch_model_grad_block(m));
    assert_true(ch_model_device_buffer_block(m, NULL) == ch_model_buffer_block(m, NULL));
    for (int i = 0; i < ch_model_num_entries(m); i++) {
        ch_param_t *p = ch_model_entry(m, i);
        assert_true(p->dev_data == p->data);
        assert_true(p->dev_grad == p->grad);
    }
    assert_ch_ok(ch_model_sync_to_host(m));
    assert_ch_ok(ch_model_sync_to_device(m));
    assert_ch_ok(ch_model_to_device(m, CH_DEV_CPU, 0));
    assert_ch_error(ch_model_to_device(m, CH_DEV_CUDA, -1), CH_ERR_INVALID, "index");
    ch_status s = ch_model_to_device(m, CH_DEV_CUDA, 1000);
    assert_true(s == CH_ERR_RANGE || s == CH_ERR_UNSUPPORTED);
    assert_int_equal(ch_model_device(m, NULL), CH_DEV_CPU);

    /* a GPU optimizer without a compute context is an error, not a crash
     * (momentum 0: nothing is allocated; the pointers are never touched) */
    ch_sgd_options_t so = {.lr = 0.1};
    ch_sgd_t *sgd = NULL;
    float fake[4];
    assert_ch_ok(ch_sgd_create(&so, &sgd));
    assert_ch_ok(ch_sgd_add_param_on(sgd, "w", fake, fake, 4, CH_DEV_CUDA, 0));
    assert_ch_error(ch_sgd_add_param_on(sgd, "v", fake, fake, 4, CH_DEV_CPU, 0), CH_ERR_INVALID,
                    "optimizer's parameters are on cuda");
    assert_ch_error(ch_sgd_step(sgd), CH_ERR_INVALID, "ch_sgd_set_compute");
    if (gpu_count() == 0) {
        /* with a context, the op itself refuses: no GPU backend or no GPU */
        ch_compute_t *cx = NULL;
        assert_ch_ok(ch_compute_create(NULL, &cx));
        ch_sgd_set_compute(sgd, cx);
        s = ch_sgd_step(sgd);
        assert_true(s == CH_ERR_UNSUPPORTED || s == CH_ERR_RANGE || s == CH_ERR_CUDA);
        ch_compute_destroy(cx);
    }
    ch_sgd_destroy(sgd);

    /* a host input to a host model is fine; a "device" input is refused
     * before anything runs */
    ch_compute_t *cx = NULL;
    assert_ch_ok(ch_compute_create(NULL, &cx));
    int64_t xs[4] = {2, C, 32, 32};
    ch_tensor_t xd;
    assert_ch_ok(ch_tensor_wrap(&xd, fake, CH_F32, 4, xs, CH_LAYOUT_PLAIN, CH_DEV_CUDA, 0));
    const ch_tensor_t *logits = NULL;
    assert_ch_error(ch_model_forward(m, cx, &xd, &logits), CH_ERR_INVALID, "model's device");
    ch_compute_destroy(cx);
    ch_model_destroy(m);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_api_cpu),
        cmocka_unit_test(test_mirror_round_trip),
        cmocka_unit_test(test_step_fp32),
        cmocka_unit_test(test_step_vocab),
        cmocka_unit_test(test_step_syncbn),
        cmocka_unit_test(test_step_bf16),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
