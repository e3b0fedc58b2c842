/* cohort: CUDA backend — 2-D convolution (forward, backward data, backward
 * filter) through cuDNN 9's legacy convolution API.
 *
 * Compute layout. cuDNN runs each call with ONE activation layout L (NCHW or
 * NHWC) for both activations and the filter in the matching format (NCHW ->
 * OIHW, NHWC -> OHWI, cuDNN's KRSC), which is what its tensor-core kernels
 * are written for (PyTorch's channels_last convolution converts the weight
 * the same way). L is the layout the call's two activations share; when
 * they differ (the stem: plain 3-channel images in, nhwc out), L is the
 * layout of the bigger one and the smaller one is converted through the
 * workspace. Weights stay PLAIN OIHW for the caller: with L = NHWC (and a
 * kernel bigger than 1x1) they are transposed into the workspace on every
 * call (a few hundred KB to a few MB per layer), and dw comes back OIHW.
 * Should cuDNN offer no usable algorithm in L for a shape (say bf16 NHWC
 * with 3 input channels), the other layout is tried once, and used for that
 * shape from then on with a warning on stderr (entry_for).
 *
 * Precision (ch_compute_options_t):
 *  - fp32, allow_tf32 = 0: x, w, y, dx, dw all fp32; cuDNN math
 *    CUDNN_FMA_MATH for the query and for every run (no tensor cores; PyTorch
 *    asserts the same for torch.backends.cudnn.allow_tf32 = False).
 *  - fp32, allow_tf32 = 1 (default): same tensors, CUDNN_TENSOR_OP_MATH:
 *    cuDNN may round inputs to TF32 inside tensor-core kernels
 *    (torch.backends.cudnn.allow_tf32 = True). Accumulation fp32.
 *  - bf16 = 1 (autocast): x (fwd, bwd filter), dy (bwd data, bwd filter)
 *    and w are rounded to bf16 (round-to-nearest-even) into the workspace;
 *    cuDNN runs with bf16 tensors and an fp32 compute type (PSEUDO_BFLOAT16
 *    config), TENSOR_OP math; its bf16 output (y, dx or dw) is widened back
 *    into the caller's fp32 tensor. So y, dx and dw carry bf16-rounded
 *    values in fp32 storage, as PyTorch's autocast gives (there the weight
 *    gradient is the bf16 gradient of the bf16 weight copy, cast to fp32).
 *    The bias is added in fp32 after the cast; db is summed in fp32 from
 *    the fp32 dy.
 * Bias: own kernels (y += b per channel; db = dy summed over N,H,W with
 * fp32 partials combined in double, deterministic).
 *
 * Algorithms: conv_search 0 -> cudnnGetConvolution*Algorithm_v7 (cuDNN's
 * heuristics, best first), 1 -> cudnnFindConvolution*Algorithm (timed
 * runs, fastest first); the first result that succeeded, that
 * cudnnGet*WorkspaceSize accepts with the math type it will run with and
 * whose workspace fits gpu_workspace_bytes wins (the error lists why each
 * candidate was refused). compute.deterministic passes over every entry
 * that is not CUDNN_DETERMINISTIC, and a timed search that will run FMA
 * math (fp32, TF32 off) over entries timed with another math type
 * (order_plan.h); COHORT_LOG_LEVEL=debug logs each choice (algorithm,
 * determinism, math, workspace, time). Descriptors, algorithm and workspace size are
 * cached per (op, shapes, stride/pad, layout, precision, search) in the
 * CH_CUDA_SLOT_CONV slot; one op takes its cuDNN workspace and conversion
 * buffers from one ch_cuda_workspace block.
 */
#include "config.h"

#include "framework/ops/cuda/dense_internal.h"
#include "framework/ops/cuda/order_plan.h"

#include "framework/core/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { OP_FWD = 1, OP_BWD_DATA = 2, OP_BWD_FILTER = 3 };

typedef struct {
    cudnnTensorDescriptor_t xd, yd; /* forward input / output in layout L */
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    int algo;                       /* the op's cudnnConvolution*Algo_t */
    size_t ws_bytes;
    ch_layout_t L;                  /* compute layout the descriptors describe */
} conv_entry;

typedef struct {
    ch_cd_cache_t cache;
} conv_slot;

static void conv_entry_free(void *ctx, void *v)
{
    (void)ctx;
    conv_entry *e = (conv_entry *)v;
    if (!e) return;
    if (e->xd) cudnnDestroyTensorDescriptor(e->xd);
    if (e->yd) cudnnDestroyTensorDescriptor(e->yd);
    if (e->wd) cudnnDestroyFilterDescriptor(e->wd);
    if (e->cd) cudnnDestroyConvolutionDescriptor(e->cd);
    free(e);
}

static void conv_slot_destroy(void *st, void *p)
{
    (void)st;
    conv_slot *s = (conv_slot *)p;
    if (!s) return;
    ch_cd_cache_free(&s->cache, conv_entry_free, NULL);
    free(s);
}

static size_t conv_slot_entries(void *p) { return p ? ((conv_slot *)p)->cache.n : 0; }

static const ch_cuda_slot_ops_t conv_slot_ops = {conv_slot_destroy, conv_slot_entries};

static ch_status conv_slot_get(void *st, conv_slot **out)
{
    conv_slot *s = (conv_slot *)ch_cuda_slot(st, CH_CUDA_SLOT_CONV);
    if (!s) {
        s = (conv_slot *)calloc(1, sizeof *s);
        if (!s) return CH_ERROR(CH_ERR_NOMEM, "conv: out of memory for the algorithm cache");
        ch_cuda_slot_set(st, CH_CUDA_SLOT_CONV, s, &conv_slot_ops);
    }
    *out = s;
    return CH_OK;
}

/* ----------------------------------------------------------- the problem */

typedef struct {
    int op;
    int64_t xs[4], ws[4], ys[4]; /* forward x (N,C,H,W), w (O,C,kh,kw), y (N,O,Ho,Wo) */
    ch_conv2d_params_t p;
    ch_layout_t L;
    int bf16, tf32, search;
} conv_problem;

static const char *op_name(int op)
{
    return op == OP_FWD ? "ch_op_conv2d_forward"
           : op == OP_BWD_DATA ? "ch_op_conv2d_backward_data"
                               : "ch_op_conv2d_backward_weights";
}

static void describe_problem(const conv_problem *q, char *buf, size_t len)
{
    snprintf(buf, len,
             "x (%lld,%lld,%lld,%lld) w (%lld,%lld,%lld,%lld) y (%lld,%lld,%lld,%lld) "
             "stride %dx%d pad %dx%d dilation %dx%d groups %d, %s, %s",
             (long long)q->xs[0], (long long)q->xs[1], (long long)q->xs[2], (long long)q->xs[3],
             (long long)q->ws[0], (long long)q->ws[1], (long long)q->ws[2], (long long)q->ws[3],
             (long long)q->ys[0], (long long)q->ys[1], (long long)q->ys[2], (long long)q->ys[3],
             q->p.stride_h, q->p.stride_w, q->p.pad_h, q->p.pad_w, ch_conv2d_dilation_h(&q->p),
             ch_conv2d_dilation_w(&q->p), ch_conv2d_groups(&q->p), ch_layout_name(q->L),
             q->bf16 ? "bf16" : (q->tf32 ? "fp32 (TF32 allowed)" : "fp32 (no TF32)"));
}

/* The math type an algorithm runs with: the one cuDNN reported for it
 * (PyTorch sets perf.mathType before running, since cuDNN 7.4 needs algo
 * and math type together), except that fp32 without TF32 is always pinned
 * to CUDNN_FMA_MATH (no tensor cores), whatever the report says. */
static cudnnMathType_t run_math(const conv_problem *q, cudnnMathType_t reported)
{
    if (!q->bf16 && !q->tf32) return CUDNN_FMA_MATH;
    return reported;
}

static ch_status make_descriptors(conv_entry *e, const conv_problem *q)
{
    int64_t dims[12] = {q->xs[0], q->xs[1], q->xs[2], q->xs[3], q->ws[0], q->ws[2],
                        q->ws[3], q->ys[2], q->ys[3],
                        q->xs[0] * q->xs[1] * q->xs[2] * q->xs[3],
                        q->ys[0] * q->ys[1] * q->ys[2] * q->ys[3],
                        q->ws[0] * q->ws[1] * q->ws[2] * q->ws[3]};
    if (!ch_cd_fits_int(dims, 12)) {
        char d[256];
        describe_problem(q, d, sizeof d);
        return CH_ERROR(CH_ERR_UNSUPPORTED,
                        "%s: %s: a tensor has 2^31 or more elements, beyond cuDNN's 32-bit "
                        "sizes (split the batch)", op_name(q->op), d);
    }
    cudnnDataType_t dt = q->bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    cudnnTensorFormat_t fmt = q->L == CH_LAYOUT_NHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    CH_CHECK_CUDNN(cudnnCreateTensorDescriptor(&e->xd));
    CH_CHECK_CUDNN(cudnnCreateTensorDescriptor(&e->yd));
    CH_CHECK_CUDNN(cudnnCreateFilterDescriptor(&e->wd));
    CH_CHECK_CUDNN(cudnnCreateConvolutionDescriptor(&e->cd));
    CH_CHECK_CUDNN(cudnnSetTensor4dDescriptor(e->xd, fmt, dt, (int)q->xs[0], (int)q->xs[1],
                                              (int)q->xs[2], (int)q->xs[3]));
    CH_CHECK_CUDNN(cudnnSetTensor4dDescriptor(e->yd, fmt, dt, (int)q->ys[0], (int)q->ys[1],
                                              (int)q->ys[2], (int)q->ys[3]));
    CH_CHECK_CUDNN(cudnnSetFilter4dDescriptor(e->wd, dt, fmt, (int)q->ws[0], (int)q->ws[1],
                                              (int)q->ws[2], (int)q->ws[3]));
    /* cuDNN's dilation is PyTorch's (1 = adjacent taps); groups as PyTorch:
     * the filter descriptor is (O, C/groups, kh, kw), the weight's shape */
    CH_CHECK_CUDNN(cudnnSetConvolution2dDescriptor(
        e->cd, q->p.pad_h, q->p.pad_w, q->p.stride_h, q->p.stride_w, ch_conv2d_dilation_h(&q->p),
        ch_conv2d_dilation_w(&q->p), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CH_CHECK_CUDNN(cudnnSetConvolutionGroupCount(e->cd, ch_conv2d_groups(&q->p)));
    cudnnMathType_t math = (q->bf16 || q->tf32) ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
    CH_CHECK_CUDNN(cudnnSetConvolutionMathType(e->cd, math));
    int n, c, h, w;
    CH_CHECK_CUDNN(cudnnGetConvolution2dForwardOutputDim(e->cd, e->xd, e->wd, &n, &c, &h, &w));
    if (n != q->ys[0] || c != q->ys[1] || h != q->ys[2] || w != q->ys[3]) {
        char d[256];
        describe_problem(q, d, sizeof d);
        return CH_ERROR(CH_ERR_INTERNAL, "%s: %s: cuDNN computes output (%d,%d,%d,%d)",
                        op_name(q->op), d, n, c, h, w);
    }
    return CH_OK;
}

#define MAX_ALGOS 16

/* Run the query (heuristics or timed) of one op kind and take the first
 * usable result. T is the op's perf struct type. */
template <typename Perf>
static ch_status choose(void *st, conv_entry *e, const conv_problem *q, const Perf *perf, int got)
{
    cudnnHandle_t h = ch_cuda_cudnn(st);
    size_t cap = ch_cuda_opts(st)->gpu_workspace_bytes;
    char why[512];
    size_t wl = 0;
    why[0] = 0;
    for (int i = 0; i < got; i++) {
        const Perf *r = &perf[i];
        if (r->status != CUDNN_STATUS_SUCCESS) {
            if (wl < sizeof why - 64)
                wl += (size_t)snprintf(why + wl, sizeof why - wl, " algo %d: %s;", (int)r->algo,
                                       cudnnGetErrorString(r->status));
            continue;
        }
        const char *refused = ch_gp_conv_algo_refusal(
            ch_cuda_opts(st)->deterministic, r->determinism == CUDNN_DETERMINISTIC, q->search,
            !q->bf16 && !q->tf32, r->mathType == CUDNN_FMA_MATH);
        if (refused) {
            if (wl < sizeof why - 64)
                wl += (size_t)snprintf(why + wl, sizeof why - wl, " algo %d: %s;", (int)r->algo,
                                       refused);
            continue;
        }
        CH_CHECK_CUDNN(cudnnSetConvolutionMathType(e->cd, run_math(q, r->mathType)));
        size_t bytes = 0;
        cudnnStatus_t s;
        if (q->op == OP_FWD)
            s = cudnnGetConvolutionForwardWorkspaceSize(h, e->xd, e->wd, e->cd, e->yd,
                                                        (cudnnConvolutionFwdAlgo_t)r->algo,
                                                        &bytes);
        else if (q->op == OP_BWD_DATA)
            s = cudnnGetConvolutionBackwardDataWorkspaceSize(
                h, e->wd, e->yd, e->cd, e->xd, (cudnnConvolutionBwdDataAlgo_t)r->algo, &bytes);
        else
            s = cudnnGetConvolutionBackwardFilterWorkspaceSize(
                h, e->xd, e->yd, e->cd, e->wd, (cudnnConvolutionBwdFilterAlgo_t)r->algo, &bytes);
        if (s != CUDNN_STATUS_SUCCESS || bytes > cap) {
            if (wl < sizeof why - 64)
                wl += (size_t)snprintf(why + wl, sizeof why - wl, " algo %d: %s;", (int)r->algo,
                                       s != CUDNN_STATUS_SUCCESS ? cudnnGetErrorString(s)
                                                                 : "workspace over the cap");
            continue;
        }
        e->algo = (int)r->algo;
        e->ws_bytes = bytes;
        if (ch_log_get_level() >= CH_LOG_DEBUG) {
            char d[256];
            describe_problem(q, d, sizeof d);
            ch_log_debug("%s: %s: cuDNN algo %d (%s, %s math, %zu-byte workspace%s%.3f ms), "
                         "candidate %d of %d by %s%s", op_name(q->op), d, e->algo,
                         r->determinism == CUDNN_DETERMINISTIC ? "deterministic"
                                                               : "non-deterministic",
                         run_math(q, r->mathType) == CUDNN_FMA_MATH ? "FMA" : "tensor-op", bytes,
                         q->search ? ", timed " : "", q->search ? (double)r->time : 0.0, i + 1,
                         got, q->search ? "timed search" : "heuristics",
                         why[0] ? "; passed over:" : "");
            if (why[0]) ch_log_debug("  %s", why);
        }
        return CH_OK;
    }
    char d[256];
    describe_problem(q, d, sizeof d);
    return CH_ERROR(CH_ERR_CUDNN,
                    "%s: %s: no cuDNN algorithm among %d candidates is usable within the "
                    "%zu-byte workspace cap (gpu_workspace_bytes)%s%s%s",
                    op_name(q->op), d, got, cap,
                    ch_cuda_opts(st)->deterministic ? " and deterministic (compute.deterministic)"
                                                    : "",
                    why[0] ? ":" : "", why);
}

static ch_status select_algo(void *st, conv_entry *e, const conv_problem *q)
{
    cudnnHandle_t h = ch_cuda_cudnn(st);
    int max = 0, got = 0;
    if (q->op == OP_FWD) {
        cudnnConvolutionFwdAlgoPerf_t perf[MAX_ALGOS];
        CH_CHECK_CUDNN(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max));
        if (max > MAX_ALGOS) max = MAX_ALGOS;
        if (q->search)
            CH_CHECK_CUDNN(cudnnFindConvolutionForwardAlgorithm(h, e->xd, e->wd, e->cd, e->yd,
                                                                max, &got, perf));
        else
            CH_CHECK_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7(h, e->xd, e->wd, e->cd, e->yd,
                                                                  max, &got, perf));
        return choose(st, e, q, perf, got);
    }
    if (q->op == OP_BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t perf[MAX_ALGOS];
        CH_CHECK_CUDNN(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max));
        if (max > MAX_ALGOS) max = MAX_ALGOS;
        if (q->search)
            CH_CHECK_CUDNN(cudnnFindConvolutionBackwardDataAlgorithm(h, e->wd, e->yd, e->cd,
                                                                     e->xd, max, &got, perf));
        else
            CH_CHECK_CUDNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, e->wd, e->yd, e->cd,
                                                                       e->xd, max, &got, perf));
        return choose(st, e, q, perf, got);
    }
    cudnnConvolutionBwdFilterAlgoPerf_t perf[MAX_ALGOS];
    CH_CHECK_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max));
    if (max > MAX_ALGOS) max = MAX_ALGOS;
    if (q->search)
        CH_CHECK_CUDNN(cudnnFindConvolutionBackwardFilterAlgorithm(h, e->xd, e->yd, e->cd, e->wd,
                                                                   max, &got, perf));
    else
        CH_CHECK_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, e->xd, e->yd, e->cd,
                                                                     e->wd, max, &got, perf));
    return choose(st, e, q, perf, got);
}

/* Descriptors and algorithm for q in layout q->L, or an error. */
static ch_status entry_make(void *st, const conv_problem *q, conv_entry **out)
{
    *out = NULL;
    conv_entry *e = (conv_entry *)calloc(1, sizeof *e);
    if (!e) return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory", op_name(q->op));
    e->L = q->L;
    ch_status r = make_descriptors(e, q);
    if (r == CH_OK) r = select_algo(st, e, q);
    if (r != CH_OK) {
        conv_entry_free(NULL, e);
        return r;
    }
    *out = e;
    return CH_OK;
}

/* Cached entry for q, created (descriptors + algorithm) on first use. When
 * cuDNN has no algorithm for the problem in the chosen layout (e.g. bf16
 * NHWC with few channels), the other layout is tried and, if it works, used
 * for this shape from then on, with a warning; the activations are then
 * converted through the workspace. The entry's L is the layout it runs. */
static ch_status entry_for(void *st, const conv_problem *q, conv_entry **out)
{
    conv_slot *s = NULL;
    CH_TRY(conv_slot_get(st, &s));
    int64_t key[CH_CD_KEY_LEN];
    ch_cd_conv_key(key, q->op, q->xs, q->ws, q->ys, &q->p, q->L, q->bf16, q->tf32, q->search);
    conv_entry *e = (conv_entry *)ch_cd_cache_find(&s->cache, key);
    if (e) {
        *out = e;
        return CH_OK;
    }
    ch_status r = entry_make(st, q, &e);
    if (r == CH_ERR_CUDNN) {
        char first[CH_ERROR_MAX];
        snprintf(first, sizeof first, "%s", ch_error_message());
        conv_problem q2 = *q;
        q2.L = q->L == CH_LAYOUT_NHWC ? CH_LAYOUT_PLAIN : CH_LAYOUT_NHWC;
        ch_status r2 = entry_make(st, &q2, &e);
        if (r2 != CH_OK) {
            char second[CH_ERROR_MAX];
            snprintf(second, sizeof second, "%s", ch_error_message());
            return CH_ERROR(r, "%s | in %s instead: %s", first, ch_layout_name(q2.L), second);
        }
        char d[256];
        describe_problem(q, d, sizeof d);
        ch_log_warn("%s: %s: no usable cuDNN algorithm in %s; running this shape in %s "
                    "with layout conversions (%s)",
                    op_name(q->op), d, ch_layout_name(q->L), ch_layout_name(q2.L), first);
        ch_error_clear();
        r = CH_OK;
    }
    if (r != CH_OK) return r;
    if (ch_cd_cache_add(&s->cache, key, e) != 0) {
        conv_entry_free(NULL, e);
        return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory for the algorithm cache",
                        op_name(q->op));
    }
    *out = e;
    return CH_OK;
}

static void problem_init(void *st, conv_problem *q, int op, const ch_tensor_t *x,
                         const int64_t *wshape, const ch_tensor_t *y,
                         const ch_conv2d_params_t *p, ch_layout_t L)
{
    const ch_compute_options_t *o = ch_cuda_opts(st);
    q->op = op;
    for (int i = 0; i < 4; i++) {
        q->xs[i] = x->shape[i];
        q->ws[i] = wshape[i];
        q->ys[i] = y->shape[i];
    }
    q->p = *p;
    q->L = L;
    q->bf16 = o->bf16 != 0;
    q->tf32 = o->allow_tf32 != 0;
    q->search = o->conv_search != 0;
}

/* Does activation t need a converted copy to be used in layout L / type?
 * With one channel or a 1x1 map both layouts are the same bytes. */
static int needs_copy(const ch_tensor_t *t, ch_layout_t L, int bf16)
{
    if (bf16) return 1;
    if (t->layout == L) return 0;
    return !(t->shape[1] == 1 || t->shape[2] * t->shape[3] == 1);
}

/* The weights need a copy for an NHWC conv unless 1x1 (OIHW == OHWI then). */
static int weight_needs_copy(const int64_t *ws, ch_layout_t L, int bf16)
{
    return bf16 || (L == CH_LAYOUT_NHWC && ws[2] * ws[3] > 1);
}

static ch_status check4(void *st, int op, const char *arg, const ch_tensor_t *t)
{
    return ch_cd_check_tensor(st, op_name(op), arg, t);
}

/* ---------------------------------------------------------------- forward */

static ch_status cd_conv_forward(void *st, const ch_tensor_t *x, const ch_tensor_t *w,
                                 const ch_tensor_t *b, const ch_conv2d_params_t *p,
                                 ch_tensor_t *y)
{
    CH_TRY(check4(st, OP_FWD, "x", x));
    CH_TRY(check4(st, OP_FWD, "weight", w));
    CH_TRY(check4(st, OP_FWD, "y", y));
    if (b) CH_TRY(check4(st, OP_FWD, "bias", b));
    ch_layout_t L = ch_cd_pick_layout(y->layout, ch_tensor_numel(y), x->layout,
                                      ch_tensor_numel(x));
    conv_problem q;
    problem_init(st, &q, OP_FWD, x, w->shape, y, p, L);
    conv_entry *e = NULL;
    CH_TRY(entry_for(st, &q, &e));
    L = e->L;
    ch_cd_type ty = q.bf16 ? CH_CD_BF16 : CH_CD_F32;
    size_t es = ch_cd_type_size(ty);
    int cx = needs_copy(x, L, q.bf16), cw = weight_needs_copy(q.ws, L, q.bf16),
        cy = needs_copy(y, L, q.bf16);
    ch_cd_carve_t cv;
    ch_cd_carve_init(&cv);
    int iws = ch_cd_carve_add(&cv, e->ws_bytes);
    int ix = ch_cd_carve_add(&cv, cx ? (size_t)ch_tensor_numel(x) * es : 0);
    int iw = ch_cd_carve_add(&cv, cw ? (size_t)ch_tensor_numel(w) * es : 0);
    int iy = ch_cd_carve_add(&cv, cy ? (size_t)ch_tensor_numel(y) * es : 0);
    void *base = NULL;
    CH_TRY(ch_cuda_workspace(st, cv.total, &base));
    void *xin = cx ? ch_cd_carve_ptr(&cv, base, ix) : x->data;
    void *win = cw ? ch_cd_carve_ptr(&cv, base, iw) : w->data;
    void *yout = cy ? ch_cd_carve_ptr(&cv, base, iy) : y->data;
    int64_t N = q.xs[0], C = q.xs[1], O = q.ws[0];
    if (cx)
        CH_TRY(ch_cd_convert(st, x->data, CH_CD_F32, x->layout, xin, ty, L, N, C,
                             q.xs[2] * q.xs[3]));
    if (cw)
        CH_TRY(ch_cd_convert(st, w->data, CH_CD_F32, CH_LAYOUT_PLAIN, win, ty, L, O, C,
                             q.ws[2] * q.ws[3]));
    const float one = 1.0f, zero = 0.0f;
    CH_CHECK_CUDNN(cudnnConvolutionForward(ch_cuda_cudnn(st), &one, e->xd, xin, e->wd, win, e->cd,
                                           (cudnnConvolutionFwdAlgo_t)e->algo,
                                           ch_cd_carve_ptr(&cv, base, iws), e->ws_bytes, &zero,
                                           e->yd, yout));
    int64_t HWo = q.ys[2] * q.ys[3];
    if (cy) CH_TRY(ch_cd_convert(st, yout, ty, L, y->data, CH_CD_F32, y->layout, N, O, HWo));
    if (b)
        CH_TRY(ch_cd_bias_add(st, (float *)y->data, (const float *)b->data, y->layout, N, O, HWo));
    return CH_OK;
}

/* ---------------------------------------------------------- backward data */

static ch_status cd_conv_backward_data(void *st, const ch_tensor_t *dy, const ch_tensor_t *w,
                                       const ch_conv2d_params_t *p, ch_tensor_t *dx)
{
    CH_TRY(check4(st, OP_BWD_DATA, "dy", dy));
    CH_TRY(check4(st, OP_BWD_DATA, "weight", w));
    CH_TRY(check4(st, OP_BWD_DATA, "dx", dx));
    ch_layout_t L = ch_cd_pick_layout(dx->layout, ch_tensor_numel(dx), dy->layout,
                                      ch_tensor_numel(dy));
    conv_problem q;
    problem_init(st, &q, OP_BWD_DATA, dx, w->shape, dy, p, L);
    conv_entry *e = NULL;
    CH_TRY(entry_for(st, &q, &e));
    L = e->L;
    ch_cd_type ty = q.bf16 ? CH_CD_BF16 : CH_CD_F32;
    size_t es = ch_cd_type_size(ty);
    int cdy = needs_copy(dy, L, q.bf16), cw = weight_needs_copy(q.ws, L, q.bf16),
        cdx = needs_copy(dx, L, q.bf16);
    ch_cd_carve_t cv;
    ch_cd_carve_init(&cv);
    int iws = ch_cd_carve_add(&cv, e->ws_bytes);
    int idy = ch_cd_carve_add(&cv, cdy ? (size_t)ch_tensor_numel(dy) * es : 0);
    int iw = ch_cd_carve_add(&cv, cw ? (size_t)ch_tensor_numel(w) * es : 0);
    int idx = ch_cd_carve_add(&cv, cdx ? (size_t)ch_tensor_numel(dx) * es : 0);
    void *base = NULL;
    CH_TRY(ch_cuda_workspace(st, cv.total, &base));
    void *dyin = cdy ? ch_cd_carve_ptr(&cv, base, idy) : dy->data;
    void *win = cw ? ch_cd_carve_ptr(&cv, base, iw) : w->data;
    void *dxout = cdx ? ch_cd_carve_ptr(&cv, base, idx) : dx->data;
    int64_t N = q.xs[0], C = q.xs[1], O = q.ws[0];
    if (cdy)
        CH_TRY(ch_cd_convert(st, dy->data, CH_CD_F32, dy->layout, dyin, ty, L, N, O,
                             q.ys[2] * q.ys[3]));
    if (cw)
        CH_TRY(ch_cd_convert(st, w->data, CH_CD_F32, CH_LAYOUT_PLAIN, win, ty, L, O, C,
                             q.ws[2] * q.ws[3]));
    const float one = 1.0f, zero = 0.0f;
    CH_CHECK_CUDNN(cudnnConvolutionBackwardData(ch_cuda_cudnn(st), &one, e->wd, win, e->yd, dyin,
                                                e->cd, (cudnnConvolutionBwdDataAlgo_t)e->algo,
                                                ch_cd_carve_ptr(&cv, base, iws), e->ws_bytes,
                                                &zero, e->xd, dxout));
    if (cdx)
        CH_TRY(ch_cd_convert(st, dxout, ty, L, dx->data, CH_CD_F32, dx->layout, N, C,
                             q.xs[2] * q.xs[3]));
    return CH_OK;
}

/* -------------------------------------------------------- backward filter */

static ch_status cd_conv_backward_weights(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                          const ch_conv2d_params_t *p, ch_tensor_t *dw,
                                          ch_tensor_t *db)
{
    CH_TRY(check4(st, OP_BWD_FILTER, "x", x));
    CH_TRY(check4(st, OP_BWD_FILTER, "dy", dy));
    CH_TRY(check4(st, OP_BWD_FILTER, "dweight", dw));
    if (db) CH_TRY(check4(st, OP_BWD_FILTER, "dbias", db));
    ch_layout_t L = ch_cd_pick_layout(dy->layout, ch_tensor_numel(dy), x->layout,
                                      ch_tensor_numel(x));
    conv_problem q;
    problem_init(st, &q, OP_BWD_FILTER, x, dw->shape, dy, p, L);
    conv_entry *e = NULL;
    CH_TRY(entry_for(st, &q, &e));
    L = e->L;
    ch_cd_type ty = q.bf16 ? CH_CD_BF16 : CH_CD_F32;
    size_t es = ch_cd_type_size(ty);
    int64_t N = q.xs[0], C = q.xs[1], O = q.ws[0], HWo = q.ys[2] * q.ys[3];
    int cx = needs_copy(x, L, q.bf16), cdy = needs_copy(dy, L, q.bf16),
        cw = weight_needs_copy(q.ws, L, q.bf16);
    ch_cd_carve_t cv;
    ch_cd_carve_init(&cv);
    int iws = ch_cd_carve_add(&cv, e->ws_bytes);
    int ix = ch_cd_carve_add(&cv, cx ? (size_t)ch_tensor_numel(x) * es : 0);
    int idy = ch_cd_carve_add(&cv, cdy ? (size_t)ch_tensor_numel(dy) * es : 0);
    int iw = ch_cd_carve_add(&cv, cw ? (size_t)ch_tensor_numel(dw) * es : 0);
    int ib = ch_cd_carve_add(&cv, db ? ch_cd_chansum_scratch(st, N, O, HWo, dy->layout) : 0);
    void *base = NULL;
    CH_TRY(ch_cuda_workspace(st, cv.total, &base));
    void *xin = cx ? ch_cd_carve_ptr(&cv, base, ix) : x->data;
    void *dyin = cdy ? ch_cd_carve_ptr(&cv, base, idy) : dy->data;
    void *dwout = cw ? ch_cd_carve_ptr(&cv, base, iw) : dw->data;
    if (cx)
        CH_TRY(ch_cd_convert(st, x->data, CH_CD_F32, x->layout, xin, ty, L, N, C,
                             q.xs[2] * q.xs[3]));
    if (cdy) CH_TRY(ch_cd_convert(st, dy->data, CH_CD_F32, dy->layout, dyin, ty, L, N, O, HWo));
    const float one = 1.0f, zero = 0.0f;
    CH_CHECK_CUDNN(cudnnConvolutionBackwardFilter(ch_cuda_cudnn(st), &one, e->xd, xin, e->yd,
                                                  dyin, e->cd,
                                                  (cudnnConvolutionBwdFilterAlgo_t)e->algo,
                                                  ch_cd_carve_ptr(&cv, base, iws), e->ws_bytes,
                                                  &zero, e->wd, dwout));
    if (cw)
        CH_TRY(ch_cd_convert(st, dwout, ty, L, dw->data, CH_CD_F32, CH_LAYOUT_PLAIN, O, C,
                             q.ws[2] * q.ws[3]));
    if (db)
        CH_TRY(ch_cd_chansum(st, (const float *)dy->data, dy->layout, N, O, HWo,
                             (float *)db->data, ch_cd_carve_ptr(&cv, base, ib)));
    return CH_OK;
}

void ch_cuda_table_conv(ch_ops_backend_t *t)
{
    t->conv2d_forward = cd_conv_forward;
    t->conv2d_backward_data = cd_conv_backward_data;
    t->conv2d_backward_weights = cd_conv_backward_weights;
}
