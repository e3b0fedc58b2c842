/* CPU bf16 (compute.precision = bf16, ch_compute_options_t.bf16): the
 * convolutions and linear layers run oneDNN's bf16 kernels with bf16
 * inputs and weights, fp32 accumulation and fp32 outputs.
 *
 * Tolerances, and why:
 *  - Against a double-precision reference computed on the bf16-rounded
 *    operands (round to nearest even, as oneDNN's and torch's conversions):
 *    the products of two bf16 numbers are exact in fp32, so what is left is
 *    fp32 summation over K terms: max |err| <= 1e-4 * max |ref| (K <= 512,
 *    K * 2^-24 = 3e-5). This is what shows the kernels take bf16 operands
 *    and accumulate in fp32 (a bf16 accumulator would miss it by ~1e-2).
 *  - Against the fp32 op on the unrounded operands: each operand carries a
 *    relative rounding error up to 2^-9, so a dot product of K terms is off
 *    by up to 2^-8 * sum |x w| (worst case); with random signs the output
 *    error is about 2^-9 * sqrt(K) * typical term, well under
 *    1e-2 * max |y|, the bound used (PyTorch's autocast tests use rtol
 *    1.6e-2 for bf16). The difference must also exceed 1e-5 * max |y|:
 *    an fp32 kernel would be within ~1e-6 (so the test fails when bf16 is
 *    silently not used).
 *  - A train step (1x28x28, batch 8, fresh initialisation): smallcnn's
 *    loss within 1e-2 relative, its gradient block within 5e-2 relative L2
 *    of the fp32 one, every parameter's gradient at cosine >= 0.99
 *    (measured 1.8e-2 and 0.997). resnet18: loss within 1e-2, gradients
 *    within 0.6 relative L2, cosine >= 0.85 (measured 0.34 and 0.91): at
 *    initialisation its gradients are dominated by the batch norms of small
 *    maps (layer4 normalises 8 values per channel at 28x28, batch 8), which
 *    amplify the inputs' rounding; PyTorch 1.13's autocast differs from its
 *    own fp32 step by as much on the same model and batch (torchvision
 *    resnet18, conv1 1-channel, random input: gradient relative L2 0.44 at
 *    batch 8, 0.34 at batch 32, 0.36 at 3x64x64 batch 8).
 * All points skip on a CPU whose effective oneDNN ISA has no bf16.
 */
#include "config.h"

#include "tests/harness.h"

#include "framework/nn/nn.h"
#include "framework/nn/nn_exec.h"
#include "framework/ops/ops.h"
#include "framework/tensor/tensor.h"
#include "models/models.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* xorshift64*: uniform in [-1, 1) */
static float urand(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    uint64_t r = *s * 2685821657736338717ull;
    return (float)((double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void fill(ch_tensor_t *t, uint64_t seed, float scale)
{
    uint64_t s = seed * 7919u + 1u;
    float *p = t->data;
    for (int64_t i = 0; i < ch_tensor_numel(t); i++) p[i] = scale * urand(&s);
}

/* fp32 -> bf16 -> fp32, round to nearest even (no NaNs here) */
static double bf(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    float r;
    memcpy(&r, &u, sizeof r);
    return r;
}

static ch_compute_t *ctx(int bf16)
{
    ch_compute_options_t o;
    ch_compute_options_default(&o);
    o.bf16 = bf16;
    o.num_threads = 2;
    ch_compute_t *cx = NULL;
    assert_ch_ok(ch_compute_create(&o, &cx));
    return cx;
}

static int skip_without_bf16(void)
{
    if (ch_compute_cpu_has_bf16()) return 0;
    return 1;
}

#define NEED_BF16()                                                                       \
    do {                                                                                  \
        if (skip_without_bf16())                                                          \
            ch_test_skip("this CPU's oneDNN ISA is %s (no bf16)", ch_compute_cpu_isa()); \
    } while (0)

/* max |a - ref| / max |ref| over n */
static double rel_max(const float *a, const double *ref, int64_t n)
{
    double m = 0, d = 0;
    for (int64_t i = 0; i < n; i++) {
        if (fabs(ref[i]) > m) m = fabs(ref[i]);
        if (fabs(a[i] - ref[i]) > d) d = fabs(a[i] - ref[i]);
    }
    return m > 0 ? d / m : d;
}

static double rel_max_f(const float *a, const float *b, int64_t n)
{
    double m = 0, d = 0;
    for (int64_t i = 0; i < n; i++) {
        if (fabs(b[i]) > m) m = fabs(b[i]);
        if (fabs((double)a[i] - b[i]) > d) d = fabs((double)a[i] - b[i]);
    }
    return m > 0 ? d / m : d;
}

/* Both checks of the header on one output: a (bf16 op), r (double reference
 * on bf16-rounded operands), f (fp32 op). */
static void check_out(const char *what, const float *a, const double *r, const float *f,
                      int64_t n)
{
    double er = rel_max(a, r, n), ef = rel_max_f(a, f, n);
    print_message("# %s: vs bf16-operand reference %.2e, vs fp32 %.2e (of max |y|)\n", what, er,
                  ef);
    if (er > 1e-4) fail_msg("%s: %.3e from the bf16-operand reference (> 1e-4)", what, er);
    if (ef > 1e-2) fail_msg("%s: %.3e from fp32 (> 1e-2)", what, ef);
    if (ef < 1e-5) fail_msg("%s: %.3e from fp32: bf16 not in use?", what, ef);
}

/* ------------------------------------------------------------ convolution */

enum { KH = 3, KW = 3 };

/* One convolution case: x (n,c,h,w), w (o,c,3,3), stride 1 pad 1. */
typedef struct {
    int64_t n, c, o, h, w;
} conv_case;

/* y, dx, dw of case s on the bf16-rounded operands, in double */
static void conv_ref(const conv_case *s, const float *x, const float *w, double *y, double *dx,
                     double *dw, const float *dy)
{
    const int64_t N = s->n, C = s->c, O = s->o, H = s->h, W = s->w;
    for (int64_t i = 0; i < N * O * H * W; i++) y[i] = 0;
    for (int64_t i = 0; i < N * C * H * W; i++) dx[i] = 0;
    for (int64_t i = 0; i < O * C * KH * KW; i++) dw[i] = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t ww = 0; ww < W; ww++)
                    for (int64_t c = 0; c < C; c++)
                        for (int kh = 0; kh < KH; kh++)
                            for (int kw = 0; kw < KW; kw++) {
                                int64_t ih = h + kh - 1, iw = ww + kw - 1;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                size_t xi = (size_t)(((n * C + c) * H + ih) * W + iw);
                                size_t wi = (size_t)(((o * C + c) * KH + kh) * KW + kw);
                                size_t yi = (size_t)(((n * O + o) * H + h) * W + ww);
                                y[yi] += bf(x[xi]) * bf(w[wi]);
                                dx[xi] += bf(dy[yi]) * bf(w[wi]);
                                dw[wi] += bf(dy[yi]) * bf(x[xi]);
                            }
}

/* The three convolution ops of case s in layout L (x, y, dy, dx in L; w
 * plain). */
static void conv_run(const conv_case *s, ch_compute_t *cx, ch_layout_t L, const ch_tensor_t *x,
                     const ch_tensor_t *w, const ch_tensor_t *dy, ch_tensor_t *y, ch_tensor_t *dx,
                     ch_tensor_t *dw)
{
    ch_conv2d_params_t p;
    memset(&p, 0, sizeof p);
    p.stride_h = p.stride_w = 1;
    p.pad_h = p.pad_w = 1;
    int64_t xs[4] = {s->n, s->c, s->h, s->w}, ys[4] = {s->n, s->o, s->h, s->w};
    ch_tensor_t xl, yl, dyl, dxl;
    assert_ch_ok(ch_tensor_alloc(&xl, CH_F32, 4, xs, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&dxl, CH_F32, 4, xs, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&yl, CH_F32, 4, ys, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&dyl, CH_F32, 4, ys, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_op_reorder(cx, x, &xl));
    assert_ch_ok(ch_op_reorder(cx, dy, &dyl));
    assert_ch_ok(ch_op_conv2d_forward(cx, &xl, w, NULL, &p, &yl));
    assert_ch_ok(ch_op_conv2d_backward_data(cx, &dyl, w, &p, &dxl));
    assert_ch_ok(ch_op_conv2d_backward_weights(cx, &xl, &dyl, &p, dw, NULL));
    assert_ch_ok(ch_op_reorder(cx, &yl, y));
    assert_ch_ok(ch_op_reorder(cx, &dxl, dx));
    ch_tensor_free(&xl);
    ch_tensor_free(&dxl);
    ch_tensor_free(&yl);
    ch_tensor_free(&dyl);
}

/* The three ops of case s in bf16 against the bf16-operand reference and
 * fp32 (check_out), in plain, the fp32 context's preferred layout (the
 * ISA's blocked one; a bf16 context prefers nhwc) and nhwc; tag names the
 * case in the messages. */
static void conv_check(const conv_case *s, const char *tag)
{
    ch_compute_t *c32 = ctx(0), *c16 = ctx(1);
    int64_t xs[4] = {s->n, s->c, s->h, s->w}, ys[4] = {s->n, s->o, s->h, s->w},
            ws[4] = {s->o, s->c, KH, KW};
    ch_tensor_t x, w, dy, y16, dx16, dw16, y32, dx32, dw32;
    assert_ch_ok(ch_tensor_alloc_f32(&x, 4, xs));
    assert_ch_ok(ch_tensor_alloc_f32(&dy, 4, ys));
    assert_ch_ok(ch_tensor_alloc_f32(&w, 4, ws));
    assert_ch_ok(ch_tensor_alloc_f32(&y16, 4, ys));
    assert_ch_ok(ch_tensor_alloc_f32(&y32, 4, ys));
    assert_ch_ok(ch_tensor_alloc_f32(&dx16, 4, xs));
    assert_ch_ok(ch_tensor_alloc_f32(&dx32, 4, xs));
    assert_ch_ok(ch_tensor_alloc_f32(&dw16, 4, ws));
    assert_ch_ok(ch_tensor_alloc_f32(&dw32, 4, ws));
    fill(&x, 1, 1.0f);
    fill(&dy, 2, 1.0f);
    fill(&w, 3, 0.1f);
    size_t ny = (size_t)(s->n * s->o * s->h * s->w), nx = (size_t)(s->n * s->c * s->h * s->w),
           nw = (size_t)(s->o * s->c * KH * KW);
    double *ry = malloc(ny * sizeof(double)), *rdx = malloc(nx * sizeof(double)),
           *rdw = malloc(nw * sizeof(double));
    assert_non_null(ry);
    assert_non_null(rdx);
    assert_non_null(rdw);
    conv_ref(s, x.data, w.data, ry, rdx, rdw, dy.data);
    ch_layout_t layouts[3] = {CH_LAYOUT_PLAIN, ch_compute_preferred_layout(c32, CH_DEV_CPU, s->c),
                              CH_LAYOUT_NHWC};
    for (int l = 0; l < 3; l++) {
        char what[128];
        conv_run(s, c32, layouts[l], &x, &w, &dy, &y32, &dx32, &dw32);
        conv_run(s, c16, layouts[l], &x, &w, &dy, &y16, &dx16, &dw16);
        snprintf(what, sizeof what, "%sconv forward (%s)", tag, ch_layout_name(layouts[l]));
        check_out(what, y16.data, ry, y32.data, (int64_t)ny);
        snprintf(what, sizeof what, "%sconv backward data (%s)", tag, ch_layout_name(layouts[l]));
        check_out(what, dx16.data, rdx, dx32.data, (int64_t)nx);
        snprintf(what, sizeof what, "%sconv backward weights (%s)", tag,
                 ch_layout_name(layouts[l]));
        check_out(what, dw16.data, rdw, dw32.data, (int64_t)nw);
    }
    free(ry);
    free(rdx);
    free(rdw);
    ch_tensor_t *ts[] = {&x, &w, &dy, &y16, &dx16, &dw16, &y32, &dx32, &dw32};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ch_tensor_free(ts[i]);
    ch_compute_destroy(c32);
    ch_compute_destroy(c16);
}

static void test_conv(void **state)
{
    (void)state;
    NEED_BF16();
    conv_case s = {2, 32, 48, 9, 9};
    conv_check(&s, "");
}

/* Small maps (resnet18's last stages at 28x28: 3x3 on 2x2 and 1x1 maps),
 * which both precisions compute as one matrix product (conv.c's GEMM path:
 * sgemm in fp32, a oneDNN bf16 matmul on bf16-rounded x / dy and dense
 * weights in bf16): the same bounds as the direct kernels. */
static void test_conv_small_map(void **state)
{
    (void)state;
    NEED_BF16();
    conv_case s2 = {8, 64, 64, 2, 2}, s1 = {8, 64, 64, 1, 1};
    conv_check(&s2, "small-map 2x2 ");
    conv_check(&s1, "small-map 1x1 ");
}

/* ----------------------------------------------------------------- linear */

enum { LN = 16, LK = 300, LM = 40 };

static void test_linear(void **state)
{
    (void)state;
    NEED_BF16();
    ch_compute_t *c32 = ctx(0), *c16 = ctx(1);
    int64_t xs[2] = {LN, LK}, ws[2] = {LM, LK}, ys[2] = {LN, LM}, bs[1] = {LM};
    ch_tensor_t x, w, b, dy, y16, y32, dx16, dx32, dw16, dw32, db16, db32;
    assert_ch_ok(ch_tensor_alloc_f32(&x, 2, xs));
    assert_ch_ok(ch_tensor_alloc_f32(&w, 2, ws));
    assert_ch_ok(ch_tensor_alloc_f32(&b, 1, bs));
    assert_ch_ok(ch_tensor_alloc_f32(&dy, 2, ys));
    assert_ch_ok(ch_tensor_alloc_f32(&y16, 2, ys));
    assert_ch_ok(ch_tensor_alloc_f32(&y32, 2, ys));
    assert_ch_ok(ch_tensor_alloc_f32(&dx16, 2, xs));
    assert_ch_ok(ch_tensor_alloc_f32(&dx32, 2, xs));
    assert_ch_ok(ch_tensor_alloc_f32(&dw16, 2, ws));
    assert_ch_ok(ch_tensor_alloc_f32(&dw32, 2, ws));
    assert_ch_ok(ch_tensor_alloc_f32(&db16, 1, bs));
    assert_ch_ok(ch_tensor_alloc_f32(&db32, 1, bs));
    fill(&x, 11, 1.0f);
    fill(&w, 12, 0.1f);
    fill(&b, 13, 0.1f);
    fill(&dy, 14, 1.0f);
    const float *X = x.data, *Wt = w.data, *B = b.data, *D = dy.data;
    double *ry = calloc(LN * LM, sizeof(double)), *rdx = calloc(LN * LK, sizeof(double)),
           *rdw = calloc(LM * LK, sizeof(double)), *rdb = calloc(LM, sizeof(double));
    assert_non_null(ry);
    assert_non_null(rdx);
    assert_non_null(rdw);
    assert_non_null(rdb);
    for (int n = 0; n < LN; n++)
        for (int m = 0; m < LM; m++) {
            ry[n * LM + m] = B[m]; /* the bias is added in fp32 */
            rdb[m] += D[n * LM + m];
            for (int k = 0; k < LK; k++) {
                ry[n * LM + m] += bf(X[n * LK + k]) * bf(Wt[m * LK + k]);
                rdx[n * LK + k] += bf(D[n * LM + m]) * bf(Wt[m * LK + k]);
                rdw[m * LK + k] += bf(D[n * LM + m]) * bf(X[n * LK + k]);
            }
        }
    w.versioned = 1;
    ch_tensor_data_changed();
    for (int i = 0; i < 2; i++) {
        ch_compute_t *cx = i ? c16 : c32;
        ch_tensor_t *y = i ? &y16 : &y32, *dx = i ? &dx16 : &dx32, *dw = i ? &dw16 : &dw32,
                    *db = i ? &db16 : &db32;
        assert_ch_ok(ch_op_linear_forward(cx, &x, &w, &b, y));
        assert_ch_ok(ch_op_linear_backward_data(cx, &dy, &w, dx));
        assert_ch_ok(ch_op_linear_backward_weights(cx, &x, &dy, dw, db));
    }
    check_out("linear forward", y16.data, ry, y32.data, LN * LM);
    check_out("linear backward data", dx16.data, rdx, dx32.data, LN * LK);
    check_out("linear backward weights", dw16.data, rdw, dw32.data, LM * LK);
    /* db: a plain fp32 sum of dy (no bf16) */
    assert_true(rel_max(db16.data, rdb, LM) < 1e-5);

    /* the bf16 weights are kept: a second forward converts nothing; after
     * the weights change (and ch_tensor_data_changed) the result follows */
    int64_t conv0, reuse0, conv1, reuse1;
    ch_compute_weight_conversions(c16, &conv0, &reuse0);
    assert_ch_ok(ch_op_linear_forward(c16, &x, &w, &b, &y16));
    ch_compute_weight_conversions(c16, &conv1, &reuse1);
    assert_int_equal(conv1, conv0);
    assert_int_equal(reuse1, reuse0 + 1);
    float *Wm = w.data;
    for (int i = 0; i < LM * LK; i++) Wm[i] = -Wm[i];
    ch_tensor_data_changed();
    assert_ch_ok(ch_op_linear_forward(c16, &x, &w, &b, &y16));
    ch_compute_weight_conversions(c16, &conv1, &reuse1);
    assert_int_equal(conv1, conv0 + 1);
    for (int n = 0; n < LN; n++)
        for (int m = 0; m < LM; m++) ry[n * LM + m] = 2.0 * B[m] - ry[n * LM + m];
    assert_true(rel_max(y16.data, ry, LN * LM) < 1e-4);

    free(ry);
    free(rdx);
    free(rdw);
    free(rdb);
    ch_tensor_t *ts[] = {&x, &w, &b, &dy, &y16, &y32, &dx16, &dx32, &dw16, &dw32, &db16, &db32};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ch_tensor_free(ts[i]);
    ch_compute_destroy(c32);
    ch_compute_destroy(c16);
}

/* -------------------------------------------------------- a train step */

/* One train step of arch (1x28x28, batch 8) in fp32 and in bf16: loss
 * within loss_tol (relative), gradient block within grad_tol (relative L2),
 * every parameter's gradient at cosine >= cos_min. */
static void train_step(const char *arch, double loss_tol, double grad_tol, double cos_min)
{
    ch_compute_t *cx[2] = {ctx(0), ctx(1)};
    ch_model_t *m[2];
    float loss[2] = {0, 0};
    int64_t xs[4] = {8, 1, 28, 28}, ls[1] = {8};
    ch_tensor_t x, lab;
    assert_ch_ok(ch_tensor_alloc_f32(&x, 4, xs));
    assert_ch_ok(ch_tensor_alloc(&lab, CH_I64, 1, ls, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    fill(&x, 21, 1.0f);
    for (int i = 0; i < 8; i++) ch_tensor_i64(&lab)[i] = (i * 7) % 10;
    for (int i = 0; i < 2; i++) {
        ch_model_options_t mo;
        ch_model_options_default(&mo);
        mo.in_channels = 1;
        mo.num_classes = 10;
        mo.seed = 5;
        assert_ch_ok(ch_model_create(arch, &mo, &m[i]));
        ch_model_train(m[i], 1);
        const ch_tensor_t *logits;
        assert_ch_ok(ch_model_forward(m[i], cx[i], &x, &logits));
        assert_ch_ok(ch_model_loss(m[i], cx[i], &lab, &loss[i]));
        assert_ch_ok(ch_model_backward(m[i], cx[i], NULL));
    }
    double el = fabs((double)loss[1] - loss[0]) / fabs(loss[0]);
    const float *g32 = ch_model_grad_block(m[0]), *g16 = ch_model_grad_block(m[1]);
    double dd = 0, nn = 0, worst_cos = 1;
    const char *worst = "";
    for (int i = 0; i < ch_model_num_params(m[0]); i++) {
        ch_param_t *pa = ch_model_param(m[0], i);
        int64_t off = pa->grad - ch_model_grad_block(m[0]), n = (int64_t)pa->numel;
        double ab = 0, aa = 0, bb = 0;
        for (int64_t k = off; k < off + n; k++) {
            double d = (double)g16[k] - g32[k];
            dd += d * d;
            nn += (double)g32[k] * g32[k];
            ab += (double)g16[k] * g32[k];
            aa += (double)g16[k] * g16[k];
            bb += (double)g32[k] * g32[k];
        }
        double cs = aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : 1;
        if (cs < worst_cos) {
            worst_cos = cs;
            worst = pa->name;
        }
    }
    double eg = sqrt(dd / nn);
    print_message("# %s step: loss fp32 %.6f bf16 %.6f (rel %.2e); gradients rel L2 "
                  "%.2e; lowest cosine %.5f (%s)\n",
                  arch, loss[0], loss[1], el, eg, worst_cos, worst);
    if (el > loss_tol) fail_msg("loss %.3e from fp32 (> %.1e)", el, loss_tol);
    if (eg > grad_tol) fail_msg("gradients %.3e from fp32 (rel L2, > %.1e)", eg, grad_tol);
    if (worst_cos < cos_min)
        fail_msg("gradient of %s: cosine %.5f (< %.2f)", worst, worst_cos, cos_min);
    if (eg < 1e-5) fail_msg("gradients %.3e from fp32: bf16 not in use?", eg);
    for (int i = 0; i < 2; i++) {
        ch_model_destroy(m[i]);
        ch_compute_destroy(cx[i]);
    }
    ch_tensor_free(&x);
    ch_tensor_free(&lab);
}

static void test_smallcnn_step(void **state)
{
    (void)state;
    NEED_BF16();
    train_step("smallcnn", 1e-2, 5e-2, 0.99);
}

static void test_resnet18_step(void **state)
{
    (void)state;
    NEED_BF16();
    train_step("resnet18", 1e-2, 0.6, 0.85);
}

/* ------------------------------------------------------- without bf16 */

/* The ISA query agrees with what the backend reports, and on an ISA
 * without bf16 (ONEDNN_MAX_CPU_ISA=AVX2, tests/test_cpu_isa.sh runs this
 * program so too) a bf16 context refuses its first convolution, naming the
 * ISA. */
static void test_refusal(void **state)
{
    (void)state;
    const char *isa = ch_compute_cpu_isa();
    int has = strcmp(isa, "avx512_core_bf16") == 0 || strcmp(isa, "avx512_core_amx") == 0;
    assert_int_equal(ch_compute_cpu_has_bf16(), has);
    if (has) ch_test_skip("this CPU's oneDNN ISA %s has bf16 (run with ONEDNN_MAX_CPU_ISA=AVX2)",
                          isa);
    ch_compute_t *cx = ctx(1);
    int64_t xs[4] = {1, 16, 4, 4}, ws[4] = {16, 16, 3, 3};
    ch_conv2d_params_t p;
    memset(&p, 0, sizeof p);
    p.stride_h = p.stride_w = 1;
    p.pad_h = p.pad_w = 1;
    ch_tensor_t x, w, y;
    assert_ch_ok(ch_tensor_alloc_f32(&x, 4, xs));
    assert_ch_ok(ch_tensor_alloc_f32(&w, 4, ws));
    assert_ch_ok(ch_tensor_alloc_f32(&y, 4, xs));
    char needle[96];
    snprintf(needle, sizeof needle, "oneDNN ISA is %s (no bf16 instructions)", isa);
    ch_error_clear();
    assert_int_equal(ch_op_conv2d_forward(cx, &x, &w, NULL, &p, &y), CH_ERR_UNSUPPORTED);
    if (!strstr(ch_error_message(), needle))
        fail_msg("message \"%s\" does not say \"%s\"", ch_error_message(), needle);
    ch_tensor_free(&x);
    ch_tensor_free(&w);
    ch_tensor_free(&y);
    ch_compute_destroy(cx);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv),
        cmocka_unit_test(test_conv_small_map),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_smallcnn_step),
        cmocka_unit_test(test_resnet18_step),
        cmocka_unit_test(test_refusal),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
