/* cohort: backend-neutral ops — argument checks and dispatch by device
 * (see ops.h and ops/backend.h). Nothing here knows oneDNN or CUDA. */
#include "config.h"

#include "framework/ops/ops.h"
#include "framework/ops/backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ch_compute {
    ch_compute_options_t opts;
    const ch_ops_backend_t *be[2];
    void *state[2];
};

#define DESC(t, buf) ch_tensor_describe((t), (buf), sizeof(buf))

void ch_compute_options_default(ch_compute_options_t *o)
{
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->num_threads = 0;
    o->cpu_layout = -1;
    o->gpu_device = -1;
    o->allow_tf32 = 1;
    o->bf16 = 0;
    o->conv_search = 0;
    o->deterministic = 0;
    o->gpu_workspace_bytes = 0;
    o->cpu_conv_algorithm = CH_CPU_CONV_DIRECT;
}

ch_status ch_compute_create(const ch_compute_options_t *opts, ch_compute_t **out)
{
    CH_REQUIRE(out, "ch_compute_create: output pointer is NULL");
    *out = NULL;
    ch_compute_options_t o;
    ch_compute_options_default(&o);
    if (opts) o = *opts;
    CH_REQUIRE(o.num_threads >= 0, "ch_compute_create: num_threads %d < 0", o.num_threads);
    CH_REQUIRE(o.cpu_layout >= -1 && o.cpu_layout <= (int)CH_LAYOUT_NCHW16C,
               "ch_compute_create: cpu_layout %d is not -1 (auto) or a ch_layout_t",
               o.cpu_layout);
    CH_REQUIRE(o.gpu_device >= -1, "ch_compute_create: gpu_device %d, expected -1 or >= 0",
               o.gpu_device);
    CH_REQUIRE(o.allow_tf32 == 0 || o.allow_tf32 == 1,
               "ch_compute_create: allow_tf32 %d, expected 0 or 1", o.allow_tf32);
    CH_REQUIRE(o.bf16 == 0 || o.bf16 == 1, "ch_compute_create: bf16 %d, expected 0 or 1", o.bf16);
    CH_REQUIRE(o.conv_search == 0 || o.conv_search == 1,
               "ch_compute_create: conv_search %d, expected 0 (heuristics) or 1 (timed)",
               o.conv_search);
    CH_REQUIRE(o.deterministic == 0 || o.deterministic == 1,
               "ch_compute_create: deterministic %d, expected 0 or 1", o.deterministic);
    ch_compute_t *cx = calloc(1, sizeof *cx);
    if (!cx) return CH_ERROR(CH_ERR_NOMEM, "ch_compute_create: out of memory");
    cx->opts = o;
    cx->be[CH_DEV_CPU] = ch_ops_cpu_backend();
    cx->be[CH_DEV_CUDA] = ch_ops_cuda_backend();
    ch_status s = cx->be[CH_DEV_CPU]->create(&cx->state[CH_DEV_CPU], &o);
    if (s != CH_OK) {
        free(cx);
        return s;
    }
    *out = cx;
    return CH_OK;
}

void ch_compute_destroy(ch_compute_t *cx)
{
    if (!cx) return;
    for (int i = 0; i < 2; i++)
        if (cx->be[i] && cx->state[i]) cx->be[i]->destroy(cx->state[i]);
    free(cx);
}

ch_status ch_compute_set_num_threads(ch_compute_t *cx, int n)
{
    CH_REQUIRE(cx, "ch_compute_set_num_threads: context is NULL");
    CH_REQUIRE(n > 0, "ch_compute_set_num_threads: n = %d, expected > 0", n);
    cx->opts.num_threads = n;
    return cx->be[CH_DEV_CPU]->set_num_threads(cx->state[CH_DEV_CPU], n);
}

int ch_compute_num_threads(const ch_compute_t *cx)
{
    if (!cx) return 0;
    return cx->be[CH_DEV_CPU]->num_threads(cx->state[CH_DEV_CPU]);
}

ch_layout_t ch_compute_preferred_layout(const ch_compute_t *cx, ch_devkind_t dev,
                                        int64_t channels)
{
    if (!cx || dev < 0 || dev > 1 || !cx->be[dev] || !cx->state[dev]) {
        if (cx && dev == CH_DEV_CUDA) return CH_LAYOUT_PLAIN;
        return CH_LAYOUT_PLAIN;
    }
    return cx->be[dev]->preferred_layout(cx->state[dev], channels);
}

char *ch_compute_describe(const ch_compute_t *cx, char *buf, size_t len)
{
    if (!buf || !len) return buf;
    if (!cx) {
        buf[0] = 0;
        return buf;
    }
    size_t at = 0;
    if (cx->opts.gpu_device >= 0 && cx->be[CH_DEV_CUDA]) {
        /* a GPU rank: the GPU's line first. Its state is made here if no op
         * made it yet, as the first GPU op would (the context is the
         * caller's own mutable object; const only in this interface). */
        ch_compute_t *m = (ch_compute_t *)cx;
        if (!m->state[CH_DEV_CUDA] &&
            m->be[CH_DEV_CUDA]->create(&m->state[CH_DEV_CUDA], &m->opts) != CH_OK) {
            snprintf(buf, len, "GPU %d: backend not set up (%s)", m->opts.gpu_device,
                     ch_error_message());
            ch_error_clear();
        } else {
            m->be[CH_DEV_CUDA]->describe(m->state[CH_DEV_CUDA], buf, len);
        }
        at = strlen(buf);
        if (at + 8 < len) {
            memcpy(buf + at, "; host ", 8);
            at += 7;
        }
    }
    if (at < len) cx->be[CH_DEV_CPU]->describe(cx->state[CH_DEV_CPU], buf + at, len - at);
    return buf;
}

size_t ch_compute_cache_entries(const ch_compute_t *cx)
{
    size_t n = 0;
    if (!cx) return 0;
    for (int i = 0; i < 2; i++)
        if (cx->be[i] && cx->state[i]) n += cx->be[i]->cache_entries(cx->state[i]);
    return n;
}

void ch_compute_weight_conversions(const ch_compute_t *cx, int64_t *converted, int64_t *reused)
{
    int64_t c = 0, r = 0;
    for (int i = 0; cx && i < 2; i++)
        if (cx->be[i] && cx->state[i] && cx->be[i]->weight_conversions) {
            int64_t ci = 0, ri = 0;
            cx->be[i]->weight_conversions(cx->state[i], &ci, &ri);
            c += ci;
            r += ri;
        }
    if (converted) *converted = c;
    if (reused) *reused = r;
}

int64_t ch_compute_winograd_primitives(const ch_compute_t *cx)
{
    int64_t n = 0;
    for (int i = 0; cx && i < 2; i++)
        if (cx->be[i] && cx->state[i] && cx->be[i]->winograd_primitives)
            n += cx->be[i]->winograd_primitives(cx->state[i]);
    return n;
}

size_t ch_compute_scratchpad_bytes(const ch_compute_t *cx)
{
    size_t n = 0;
    if (!cx) return 0;
    for (int i = 0; i < 2; i++)
        if (cx->be[i] && cx->state[i]) n += cx->be[i]->scratchpad_bytes(cx->state[i]);
    return n;
}

ch_status ch_compute_sync(ch_compute_t *cx)
{
    CH_REQUIRE(cx, "ch_compute_sync: context is NULL");
    for (int i = 0; i < 2; i++)
        if (cx->be[i] && cx->state[i]) CH_TRY(cx->be[i]->sync(cx->state[i]));
    return CH_OK;
}

/* ------------------------------------------------------------ checking */

/* Backend and state for the device of t (all tensors must match it). */
static ch_status pick(ch_compute_t *cx, const char *op, const ch_tensor_t *t,
                      const ch_ops_backend_t **be, void **st)
{
    if (!cx) return CH_ERROR(CH_ERR_INVALID, "%s: compute context is NULL", op);
    if (!t) return CH_ERROR(CH_ERR_INVALID, "%s: tensor is NULL", op);
    int d = (int)t->dev;
    if (d != CH_DEV_CPU && d != CH_DEV_CUDA)
        return CH_ERROR(CH_ERR_INVALID, "%s: unknown device kind %d", op, d);
    if (!cx->be[d])
        return CH_ERROR(CH_ERR_UNSUPPORTED,
                        "%s: tensors are on the GPU but cohort was built without the "
                        "CUDA backend", op);
    if (!cx->state[d]) CH_TRY(cx->be[d]->create(&cx->state[d], &cx->opts));
    *be = cx->be[d];
    *st = cx->state[d];
    return CH_OK;
}

/* Every non-NULL tensor in ts on the same device as ref. */
static ch_status same_device(const char *op, const ch_tensor_t *ref,
                             const ch_tensor_t *const *ts, int n)
{
    for (int i = 0; i < n; i++) {
        if (!ts[i]) continue;
        if (ts[i]->dev != ref->dev || ts[i]->dev_index != ref->dev_index) {
            char a[128], b[128];
            return CH_ERROR(CH_ERR_INVALID, "%s: tensor %s is on another device than %s", op,
                            DESC(ts[i], a), DESC(ref, b));
        }
    }
    return CH_OK;
}
#define SAME_DEVICE(op, ref, ...)                                                      \
    do {                                                                               \
        const ch_tensor_t *const ts_[] = {__VA_ARGS__};                                \
        CH_TRY(same_device(op, ref, ts_, (int)(sizeof ts_ / sizeof ts_[0])));          \
    } while (0)

/* float32, ndim as given (0 = any 1..4), with storage. */
static ch_status need(const char *op, const char *arg, const ch_tensor_t *t, ch_dtype_t dt,
                      int ndim)
{
    char what[96];
    snprintf(what, sizeof what, "%s: %s", op, arg);
    return ch_tensor_check(t, what, dt, ndim);
}

static ch_status need_plain(const char *op, const char *arg, const ch_tensor_t *t)
{
    if (t->layout != CH_LAYOUT_PLAIN) {
        char a[128];
        return CH_ERROR(CH_ERR_INVALID, "%s: %s must be plain (PyTorch layout), got %s", op,
                        arg, DESC(t, a));
    }
    return CH_OK;
}

/* A plain float32 vector of length C (or NULL when optional). */
static ch_status need_vec(const char *op, const char *arg, const ch_tensor_t *t, int64_t C,
                          int optional)
{
    if (!t) {
        if (optional) return CH_OK;
        return CH_ERROR(CH_ERR_INVALID, "%s: %s is NULL", op, arg);
    }
    CH_TRY(need(op, arg, t, CH_F32, 1));
    CH_TRY(need_plain(op, arg, t));
    if (t->shape[0] != C) {
        char a[128];
        return CH_ERROR(CH_ERR_INVALID, "%s: %s must have %lld elements (one per channel), "
                        "got %s", op, arg, (long long)C, DESC(t, a));
    }
    return CH_OK;
}

static ch_status need_same_layout(const char *op, const char *an, const ch_tensor_t *a,
                                  const char *bn, const ch_tensor_t *b)
{
    if (a->layout != b->layout) {
        char x[128], y[128];
        return CH_ERROR(CH_ERR_INVALID, "%s: %s and %s must share one layout, got %s and %s",
                        op, an, bn, DESC(a, x), DESC(b, y));
    }
    return CH_OK;
}

static ch_status need_same_shape(const char *op, const char *an, const ch_tensor_t *a,
                                 const char *bn, const ch_tensor_t *b)
{
    if (!ch_tensor_same_shape(a, b)) {
        char x[128], y[128];
        return CH_ERROR(CH_ERR_INVALID, "%s: %s and %s must have the same shape, got %s and %s",
                        op, an, bn, DESC(a, x), DESC(b, y));
    }
    return CH_OK;
}

static ch_status need_shape4(const char *op, const char *arg, const ch_tensor_t *t,
                             int64_t n, int64_t c, int64_t h, int64_t w)
{
    int64_t s[4] = {n, c, h, w};
    char what[96];
    snprintf(what, sizeof what, "%s: %s", op, arg);
    return ch_tensor_check_shape(t, what, CH_F32, 4, s);
}

/* An op is about to write these outputs (any may be NULL): when one is a
 * versioned tensor (a parameter, tensor.h), cached copies derived from
 * parameters become stale. */
static void wrote(const ch_tensor_t *a, const ch_tensor_t *b, const ch_tensor_t *c)
{
    if ((a && a->versioned) || (b && b->versioned) || (c && c->versioned))
        ch_tensor_data_changed();
}

#define BE(t) const ch_ops_backend_t *be = NULL; void *st = NULL; CH_TRY(pick(cx, OP, (t), &be, &st))

/* ---------------------------------------------------------- data motion */

ch_status ch_op_reorder(ch_compute_t *cx, const ch_tensor_t *src, ch_tensor_t *dst)
{
#define OP "ch_op_reorder"
    CH_REQUIRE(src && dst, OP ": NULL tensor");
    CH_TRY(need(OP, "src", src, src->dtype, 0));
    CH_TRY(need(OP, "dst", dst, src->dtype, src->ndim));
    CH_TRY(need_same_shape(OP, "src", src, "dst", dst));
    const ch_tensor_t *dev = src->dev != CH_DEV_CPU ? src : dst;
    BE(dev);
    wrote(dst, NULL, NULL);
    return be->reorder(st, src, dst);
#undef OP
}

ch_status ch_tensor_to_plain(ch_compute_t *cx, const ch_tensor_t *src, ch_tensor_t *dst)
{
    CH_REQUIRE(dst, "ch_tensor_to_plain: dst is NULL");
    CH_TRY(need_plain("ch_tensor_to_plain", "dst", dst));
    return ch_op_reorder(cx, src, dst);
}

ch_status ch_op_zero(ch_compute_t *cx, ch_tensor_t *t)
{
#define OP "ch_op_zero"
    CH_REQUIRE(t, OP ": tensor is NULL");
    CH_TRY(need(OP, "t", t, t->dtype, 0));
    BE(t);
    wrote(t, NULL, NULL);
    return be->fill(st, t, 0.0f);
#undef OP
}

ch_status ch_op_fill(ch_compute_t *cx, ch_tensor_t *t, float value)
{
#define OP "ch_op_fill"
    CH_TRY(need(OP, "t", t, CH_F32, 0));
    BE(t);
    wrote(t, NULL, NULL);
    return be->fill(st, t, value);
#undef OP
}

ch_status ch_op_copy(ch_compute_t *cx, const ch_tensor_t *src, ch_tensor_t *dst)
{
#define OP "ch_op_copy"
    CH_REQUIRE(src && dst, OP ": NULL tensor");
    CH_TRY(need(OP, "src", src, src->dtype, 0));
    CH_TRY(need(OP, "dst", dst, src->dtype, src->ndim));
    CH_TRY(need_same_shape(OP, "src", src, "dst", dst));
    CH_TRY(need_same_layout(OP, "src", src, "dst", dst));
    SAME_DEVICE(OP, src, dst);
    BE(src);
    wrote(dst, NULL, NULL);
    return be->copy(st, src, dst);
#undef OP
}

/* ---------------------------------------------------------- convolution */

int64_t ch_conv_out_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad)
{
    if (stride < 1) return 0;
    int64_t span = in + 2 * pad - kernel;
    if (span < 0) return 0;
    return span / stride + 1;
}

int64_t ch_conv_out_size_dilated(int64_t in, int64_t kernel, int64_t stride, int64_t pad,
                                 int64_t dilation)
{
    if (dilation < 1) dilation = 1;
    return ch_conv_out_size(in, dilation * (kernel - 1) + 1, stride, pad);
}

static ch_status conv_check(const char *op, const ch_tensor_t *x, const ch_tensor_t *w,
                            const ch_tensor_t *b, const ch_conv2d_params_t *p,
                            const ch_tensor_t *y, int need_x_data, int need_y_data)
{
    CH_REQUIRE(p, "%s: params are NULL", op);
    CH_REQUIRE(p->stride_h >= 1 && p->stride_w >= 1, "%s: stride %dx%d, expected >= 1", op,
               p->stride_h, p->stride_w);
    CH_REQUIRE(p->pad_h >= 0 && p->pad_w >= 0, "%s: padding %dx%d, expected >= 0", op,
               p->pad_h, p->pad_w);
    CH_REQUIRE(p->dilation_h >= 0 && p->dilation_w >= 0 && p->groups >= 0,
               "%s: dilation %dx%d and groups %d, expected >= 1 (0 reads as 1)", op,
               p->dilation_h, p->dilation_w, p->groups);
    CH_REQUIRE(x && w && y, "%s: NULL tensor", op);
    (void)need_x_data;
    (void)need_y_data;
    CH_TRY(need(op, "input", x, CH_F32, 4));
    CH_TRY(need(op, "weight", w, CH_F32, 4));
    CH_TRY(need_plain(op, "weight (OIHW)", w));
    CH_TRY(need(op, "output", y, CH_F32, 4));
    char a[128], c[128];
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t O = w->shape[0], kh = w->shape[2], kw = w->shape[3];
    int64_t G = ch_conv2d_groups(p);
    if (C % G || O % G)
        return CH_ERROR(CH_ERR_INVALID,
                        "%s: groups %lld must divide the input channels of %s and the output "
                        "channels of weight %s",
                        op, (long long)G, DESC(x, c), DESC(w, a));
    if (w->shape[1] * G != C)
        return CH_ERROR(CH_ERR_INVALID,
                        "%s: weight %s expects %lld input channels (%lld per group, %lld "
                        "groups), input is %s",
                        op, DESC(w, a), (long long)(w->shape[1] * G), (long long)w->shape[1],
                        (long long)G, DESC(x, c));
    if (kh < 1 || kw < 1 || O < 1)
        return CH_ERROR(CH_ERR_INVALID, "%s: weight %s has an empty dimension", op, DESC(w, a));
    int64_t Ho = ch_conv_out_size_dilated(H, kh, p->stride_h, p->pad_h, ch_conv2d_dilation_h(p));
    int64_t Wo = ch_conv_out_size_dilated(W, kw, p->stride_w, p->pad_w, ch_conv2d_dilation_w(p));
    if (Ho < 1 || Wo < 1)
        return CH_ERROR(CH_ERR_INVALID,
                        "%s: kernel %lldx%lld with padding %dx%d, dilation %dx%d does not fit "
                        "input %s",
                        op, (long long)kh, (long long)kw, p->pad_h, p->pad_w,
                        ch_conv2d_dilation_h(p), ch_conv2d_dilation_w(p), DESC(x, a));
    CH_TRY(need_shape4(op, "output", y, N, O, Ho, Wo));
    if (b) CH_TRY(need_vec(op, "bias", b, O, 1));
    return CH_OK;
}

ch_status ch_op_conv2d_forward(ch_compute_t *cx, const ch_tensor_t *x, const ch_tensor_t *w,
                               const ch_tensor_t *b, const ch_conv2d_params_t *p,
                               ch_tensor_t *y)
{
#define OP "ch_op_conv2d_forward"
    CH_TRY(conv_check(OP, x, w, b, p, y, 1, 0));
    SAME_DEVICE(OP, x, w, b, y);
    BE(x);
    if (x->shape[0] == 0) return CH_OK;
    wrote(y, NULL, NULL);
    return be->conv2d_forward(st, x, w, b, p, y);
#undef OP
}

ch_status ch_op_conv2d_backward_data(ch_compute_t *cx, const ch_tensor_t *dy,
                                     const ch_tensor_t *w, const ch_conv2d_params_t *p,
                                     ch_tensor_t *dx)
{
#define OP "ch_op_conv2d_backward_data"
    CH_TRY(conv_check(OP, dx, w, NULL, p, dy, 0, 1));
    SAME_DEVICE(OP, dy, w, dx);
    BE(dy);
    if (dy->shape[0] == 0) return CH_OK;
    wrote(dx, NULL, NULL);
    return be->conv2d_backward_data(st, dy, w, p, dx);
#undef OP
}

ch_status ch_op_conv2d_backward_weights(ch_compute_t *cx, const ch_tensor_t *x,
                                        const ch_tensor_t *dy, const ch_conv2d_params_t *p,
                                        ch_tensor_t *dw, ch_tensor_t *db)
{
#define OP "ch_op_conv2d_backward_weights"
    CH_TRY(conv_check(OP, x, dw, db, p, dy, 1, 1));
    SAME_DEVICE(OP, x, dy, dw, db);
    BE(x);
    if (x->shape[0] == 0) {
        CH_TRY(be->fill(st, dw, 0.0f));
        if (db) CH_TRY(be->fill(st, db, 0.0f));
        return CH_OK;
    }
    wrote(dw, db, NULL);
    return be->conv2d_backward_weights(st, x, dy, p, dw, db);
#undef OP
}

ch_status ch_op_conv2d_backward(ch_compute_t *cx, const ch_tensor_t *x, const ch_tensor_t *dy,
                                const ch_tensor_t *w, const ch_conv2d_params_t *p,
                                ch_tensor_t *dx, ch_tensor_t *dw, ch_tensor_t *db)
{
#define OP "ch_op_conv2d_backward"
    CH_TRY(conv_check(OP, x, dw, db, p, dy, 1, 1));
    CH_TRY(conv_check(OP, dx, w, NULL, p, dy, 0, 1));
    SAME_DEVICE(OP, x, dy, w, dx);
    SAME_DEVICE(OP, x, dw, db);
    /* (an empty batch has no data: NULL pointers are not aliases) */
    if (dx->data && (dx->data == x->data || dx->data == dy->data || dx->data == w->data ||
                     dx->data == dw->data || (db && dx->data == db->data)))
        return CH_ERROR(CH_ERR_INVALID, OP ": dx aliases another argument");
    BE(x);
    if (!be->conv2d_backward || x->shape[0] == 0) {
        CH_TRY(ch_op_conv2d_backward_weights(cx, x, dy, p, dw, db));
        return ch_op_conv2d_backward_data(cx, dy, w, p, dx);
    }
    wrote(dw, db, NULL);
    wrote(dx, NULL, NULL);
    return be->conv2d_backward(st, x, dy, w, p, dx, dw, db);
#undef OP
}

/* ----------------------------------------------------------- batch norm */

/* x is (N,C,H,W) any layout or (N,C) plain; returns C and count. */
static ch_status bn_input(const char *op, const char *arg, const ch_tensor_t *x, int64_t *C,
                          int64_t *count)
{
    CH_REQUIRE(x, "%s: %s is NULL", op, arg);
    CH_TRY(need(op, arg, x, CH_F32, 0));
    if (x->ndim != 4 && x->ndim != 2) {
        char a[128];
        return CH_ERROR(CH_ERR_INVALID, "%s: %s must be (N,C,H,W) or (N,C), got %s", op, arg,
                        DESC(x, a));
    }
    *C = x->shape[1];
    *count = x->ndim == 4 ? x->shape[0] * x->shape[2] * x->shape[3] : x->shape[0];
    return CH_OK;
}

static ch_status bn_pair(const char *op, const char *an, const ch_tensor_t *a, const char *bn,
                         const ch_tensor_t *b)
{
    CH_REQUIRE(b, "%s: %s is NULL", op, bn);
    CH_TRY(need(op, bn, b, CH_F32, a->ndim));
    CH_TRY(need_same_shape(op, an, a, bn, b));
    CH_TRY(need_same_layout(op, an, a, bn, b));
    return CH_OK;
}

ch_status ch_op_batchnorm_stats(ch_compute_t *cx, const ch_tensor_t *x, ch_tensor_t *mean,
                                ch_tensor_t *var)
{
#define OP "ch_op_batchnorm_stats"
    int64_t C, cnt;
    CH_TRY(bn_input(OP, "x", x, &C, &cnt));
    CH_TRY(need_vec(OP, "mean", mean, C, 0));
    CH_TRY(need_vec(OP, "var", var, C, 0));
    CH_REQUIRE(cnt >= 1, OP ": no values per channel (N*H*W = 0) in %s",
               ch_tensor_describe(x, (char[128]){0}, 128));
    SAME_DEVICE(OP, x, mean, var);
    BE(x);
    wrote(mean, var, NULL);
    return be->bn_stats(st, x, mean, var);
#undef OP
}

static ch_status bn_apply_check(const char *op, const ch_tensor_t *x, const ch_tensor_t *mean,
                                const ch_tensor_t *var, const ch_tensor_t *weight,
                                const ch_tensor_t *bias, float eps, const ch_tensor_t *y)
{
    int64_t C, cnt;
    CH_TRY(bn_input(op, "x", x, &C, &cnt));
    CH_TRY(bn_pair(op, "x", x, "y", y));
    CH_TRY(need_vec(op, "mean", mean, C, 0));
    CH_TRY(need_vec(op, "var", var, C, 0));
    CH_TRY(need_vec(op, "weight", weight, C, 1));
    CH_TRY(need_vec(op, "bias", bias, C, 1));
    CH_REQUIRE(eps >= 0.0f, "%s: eps %g < 0", op, (double)eps);
    SAME_DEVICE(op, x, y, mean, var, weight, bias);
    return CH_OK;
}

ch_status ch_op_batchnorm_apply(ch_compute_t *cx, const ch_tensor_t *x, const ch_tensor_t *mean,
                                const ch_tensor_t *var, const ch_tensor_t *weight,
                                const ch_tensor_t *bias, float eps, ch_tensor_t *y)
{
#define OP "ch_op_batchnorm_apply"
    CH_TRY(bn_apply_check(OP, x, mean, var, weight, bias, eps, y));
    BE(x);
    wrote(y, NULL, NULL);
    return be->bn_apply(st, x, mean, var, weight, bias, eps, y);
#undef OP
}

ch_status ch_op_batchnorm_forward_eval(ch_compute_t *cx, const ch_tensor_t *x,
                                       const ch_tensor_t *weight, const ch_tensor_t *bias,
                                       const ch_tensor_t *running_mean,
                                       const ch_tensor_t *running_var, float eps, ch_tensor_t *y)
{
#define OP "ch_op_batchnorm_forward_eval"
    CH_TRY(bn_apply_check(OP, x, running_mean, running_var, weight, bias, eps, y));
    BE(x);
    wrote(y, NULL, NULL);
    return be->bn_apply(st, x, running_mean, running_var, weight, bias, eps, y);
#undef OP
}

ch_status ch_op_batchnorm_forward_train(ch_compute_t *cx, const ch_tensor_t *x,
                                        const ch_tensor_t *weight, const ch_tensor_t *bias,
                                        float eps, ch_tensor_t *y, ch_tensor_t *mean,
                                        ch_tensor_t *var)
{
#define OP "ch_op_batchnorm_forward_train"
    int64_t C, cnt;
    CH_TRY(bn_input(OP, "x", x, &C, &cnt));
    CH_TRY(bn_apply_check(OP, x, mean, var, weight, bias, eps, y));
    CH_REQUIRE(cnt > 1, OP ": expected more than 1 value per channel when training, got "
               "N*H*W = %lld", (long long)cnt);
    CH_REQUIRE(y->data != x->data, OP ": y must not alias x");
    BE(x);
    CH_TRY(be->bn_stats(st, x, mean, var));
    wrote(y, NULL, NULL);
    return be->bn_apply(st, x, mean, var, weight, bias, eps, y);
#undef OP
}

ch_status ch_op_batchnorm_update_running(ch_compute_t *cx, ch_tensor_t *running_mean,
                                         ch_tensor_t *running_var, const ch_tensor_t *mean,
                                         const ch_tensor_t *var, int64_t count, float momentum)
{
#define OP "ch_op_batchnorm_update_running"
    CH_REQUIRE(running_mean && running_var && mean && var, OP ": NULL tensor");
    int64_t C = running_mean->shape[0];
    CH_TRY(need_vec(OP, "running_mean", running_mean, C, 0));
    CH_TRY(need_vec(OP, "running_var", running_var, C, 0));
    CH_TRY(need_vec(OP, "mean", mean, C, 0));
    CH_TRY(need_vec(OP, "var", var, C, 0));
    CH_REQUIRE(count > 1, OP ": count %lld, expected > 1 (unbiased variance)",
               (long long)count);
    CH_REQUIRE(momentum >= 0.0f && momentum <= 1.0f, OP ": momentum %g outside [0,1]",
               (double)momentum);
    SAME_DEVICE(OP, running_mean, running_var, mean, var);
    BE(running_mean);
    wrote(running_mean, running_var, NULL);
    return be->bn_update_running(st, running_mean, running_var, mean, var, count, momentum);
#undef OP
}

ch_status ch_op_batchnorm_gather_stats(ch_compute_t *cx, const ch_tensor_t *means,
                                       const ch_tensor_t *vars, const int64_t *counts,
                                       int nranks, ch_tensor_t *mean, ch_tensor_t *var,
                                       int64_t *total)
{
#define OP "ch_op_batchnorm_gather_stats"
    CH_REQUIRE(means && vars && counts && mean && var && total, OP ": NULL argument");
    CH_REQUIRE(nranks >= 1, OP ": nranks %d < 1", nranks);
    CH_TRY(need(OP, "means", means, CH_F32, 2));
    CH_TRY(need_plain(OP, "means", means));
    int64_t C = means->shape[1];
    int64_t s[2] = {nranks, C};
    CH_TRY(ch_tensor_check_shape(means, OP ": means", CH_F32, 2, s));
    CH_TRY(ch_tensor_check_shape(vars, OP ": vars", CH_F32, 2, s));
    CH_TRY(need_plain(OP, "vars", vars));
    CH_TRY(need_vec(OP, "mean", mean, C, 0));
    CH_TRY(need_vec(OP, "var", var, C, 0));
    int64_t tot = 0;
    for (int r = 0; r < nranks; r++) {
        CH_REQUIRE(counts[r] >= 0, OP ": counts[%d] = %lld < 0", r, (long long)counts[r]);
        tot += counts[r];
    }
    CH_REQUIRE(tot >= 1, OP ": total count over %d ranks is 0", nranks);
    SAME_DEVICE(OP, means, vars, mean, var);
    BE(means);
    CH_TRY(be->bn_gather_stats(st, means, vars, counts, nranks, mean, var));
    *total = tot;
    return CH_OK;
#undef OP
}

ch_status ch_op_batchnorm_backward_reduce(ch_compute_t *cx, const ch_tensor_t *x,
                                          const ch_tensor_t *dy, const ch_tensor_t *mean,
                                          ch_tensor_t *sum_dy, ch_tensor_t *sum_dy_xmu)
{
#define OP "ch_op_batchnorm_backward_reduce"
    int64_t C, cnt;
    CH_TRY(bn_input(OP, "x", x, &C, &cnt));
    CH_TRY(bn_pair(OP, "x", x, "dy", dy));
    CH_TRY(need_vec(OP, "mean", mean, C, 0));
    CH_TRY(need_vec(OP, "sum_dy", sum_dy, C, 0));
    CH_TRY(need_vec(OP, "sum_dy_xmu", sum_dy_xmu, C, 0));
    SAME_DEVICE(OP, x, dy, mean, sum_dy, sum_dy_xmu);
    BE(x);
    wrote(sum_dy, sum_dy_xmu, NULL);
    return be->bn_backward_reduce(st, x, dy, mean, sum_dy, sum_dy_xmu);
#undef OP
}

ch_status ch_op_batchnorm_param_grads(ch_compute_t *cx, const ch_tensor_t *sum_dy,
                                      const ch_tensor_t *sum_dy_xmu, const ch_tensor_t *var,
                                      float eps, ch_tensor_t *dweight, ch_tensor_t *dbias)
{
#define OP "ch_op_batchnorm_param_grads"
    CH_REQUIRE(sum_dy, OP ": sum_dy is NULL");
    int64_t C = sum_dy->shape[0];
    CH_TRY(need_vec(OP, "sum_dy", sum_dy, C, 0));
    CH_TRY(need_vec(OP, "sum_dy_xmu", sum_dy_xmu, C, 0));
    CH_TRY(need_vec(OP, "var", var, C, 0));
    CH_TRY(need_vec(OP, "dweight", dweight, C, 1));
    CH_TRY(need_vec(OP, "dbias", dbias, C, 1));
    CH_REQUIRE(eps >= 0.0f, OP ": eps %g < 0", (double)eps);
    SAME_DEVICE(OP, sum_dy, sum_dy_xmu, var, dweight, dbias);
    BE(sum_dy);
    wrote(dweight, dbias, NULL);
    return be->bn_param_grads(st, sum_dy, sum_dy_xmu, var, eps, dweight, dbias);
#undef OP
}

static ch_status bn_elemt_check(const char *op, const ch_tensor_t *x, const ch_tensor_t *dy,
                                const ch_tensor_t *mean, const ch_tensor_t *var, float eps,
                                const ch_tensor_t *weight, const ch_tensor_t *dx, int64_t *C)
{
    int64_t cnt;
    CH_TRY(bn_input(op, "x", x, C, &cnt));
    CH_TRY(bn_pair(op, "x", x, "dy", dy));
    if (dx) CH_TRY(bn_pair(op, "x", x, "dx", dx));
    CH_TRY(need_vec(op, "mean", mean, *C, 0));
    CH_TRY(need_vec(op, "var", var, *C, 0));
    CH_TRY(need_vec(op, "weight", weight, *C, 1));
    CH_REQUIRE(eps >= 0.0f, "%s: eps %g < 0", op, (double)eps);
    SAME_DEVICE(op, x, dy, mean, var, weight, dx);
    return CH_OK;
}

ch_status ch_op_batchnorm_backward_elemt(ch_compute_t *cx, const ch_tensor_t *x,
                                         const ch_tensor_t *dy, const ch_tensor_t *mean,
                                         const ch_tensor_t *var, float eps,
                                         const ch_tensor_t *weight, const ch_tensor_t *sum_dy,
                                         const ch_tensor_t *sum_dy_xmu, int64_t total,
                                         ch_tensor_t *dx)
{
#define OP "ch_op_batchnorm_backward_elemt"
    int64_t C;
    CH_REQUIRE(dx, OP ": dx is NULL");
    CH_TRY(bn_elemt_check(OP, x, dy, mean, var, eps, weight, dx, &C));
    CH_TRY(need_vec(OP, "sum_dy", sum_dy, C, 0));
    CH_TRY(need_vec(OP, "sum_dy_xmu", sum_dy_xmu, C, 0));
    CH_REQUIRE(total >= 1, OP ": total count %lld < 1", (long long)total);
    SAME_DEVICE(OP, x, sum_dy, sum_dy_xmu);
    BE(x);
    wrote(dx, NULL, NULL);
    return be->bn_backward_elemt(st, x, dy, mean, var, eps, weight, sum_dy, sum_dy_xmu, total,
                                 dx);
#undef OP
}

ch_status ch_op_batchnorm_backward(ch_compute_t *cx, const ch_tensor_t *x,
                                   const ch_tensor_t *dy, const ch_tensor_t *mean,
                                   const ch_tensor_t *var, float eps, const ch_tensor_t *weight,
                                   ch_tensor_t *dx, ch_tensor_t *dweight, ch_tensor_t *dbias)
{
#define OP "ch_op_batchnorm_backward"
    int64_t C, cnt;
    CH_TRY(bn_elemt_check(OP, x, dy, mean, var, eps, weight, dx, &C));
    CH_TRY(need_vec(OP, "dweight", dweight, C, 1));
    CH_TRY(need_vec(OP, "dbias", dbias, C, 1));
    CH_TRY(bn_input(OP, "x", x, &C, &cnt));
    CH_REQUIRE(cnt >= 1, OP ": no values per channel (N*H*W = 0)");
    SAME_DEVICE(OP, x, dweight, dbias);
    BE(x);
    wrote(dx, dweight, dbias);
    return be->bn_backward(st, x, dy, mean, var, eps, weight, dx, dweight, dbias);
#undef OP
}

/* ----------------------------------------------------------------- relu */

ch_status ch_op_relu_forward(ch_compute_t *cx, const ch_tensor_t *x, ch_tensor_t *y)
{
#define OP "ch_op_relu_forward"
    CH_REQUIRE(x && y, OP ": NULL tensor");
    CH_TRY(need(OP, "x", x, CH_F32, 0));
    CH_TRY(bn_pair(OP, "x", x, "y", y));
    SAME_DEVICE(OP, x, y);
    BE(x);
    wrote(y, NULL, NULL);
    return be->relu_forward(st, x, y);
#undef OP
}

ch_status ch_op_relu_backward(ch_compute_t *cx, const ch_tensor_t *y, const ch_tensor_t *dy,
                              ch_tensor_t *dx)
{
#define OP "ch_op_relu_backward"
    CH_REQUIRE(y && dy && dx, OP ": NULL tensor");
    CH_TRY(need(OP, "y", y, CH_F32, 0));
    CH_TRY(bn_pair(OP, "y", y, "dy", dy));
    CH_TRY(bn_pair(OP, "y", y, "dx", dx));
    SAME_DEVICE(OP, y, dy, dx);
    BE(y);
    wrote(dx, NULL, NULL);
    return be->relu_backward(st, y, dy, dx);
#undef OP
}

/* -------------------------------------------------------------- pooling */

int64_t ch_pool_out_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int ceil_mode)
{
    if (stride < 1) return 0;
    int64_t span = in + 2 * pad - kernel;
    if (span < 0) return 0;
    int64_t out = (span + (ceil_mode ? stride - 1 : 0)) / stride + 1;
    /* torch pooling_output_shape: the last window must start inside the
     * input or the left padding */
    if (ceil_mode && (out - 1) * stride >= in + pad) out--;
    return out;
}

static ch_status pool_check(const char *op, const ch_tensor_t *x, const ch_pool2d_params_t *p,
                            const ch_tensor_t *y)
{
    CH_REQUIRE(p, "%s: params are NULL", op);
    CH_REQUIRE(p->kernel_h >= 1 && p->kernel_w >= 1, "%s: kernel %dx%d, expected >= 1", op,
               p->kernel_h, p->kernel_w);
    CH_REQUIRE(p->stride_h >= 1 && p->stride_w >= 1, "%s: stride %dx%d, expected >= 1", op,
               p->stride_h, p->stride_w);
    CH_REQUIRE(p->pad_h >= 0 && p->pad_w >= 0 && p->pad_h <= p->kernel_h / 2 &&
                   p->pad_w <= p->kernel_w / 2,
               "%s: padding %dx%d must be >= 0 and at most half the kernel %dx%d", op,
               p->pad_h, p->pad_w, p->kernel_h, p->kernel_w);
    CH_REQUIRE(x && y, "%s: NULL tensor", op);
    CH_TRY(need(op, "input", x, CH_F32, 4));
    CH_TRY(need(op, "output", y, CH_F32, 4));
    CH_TRY(need_same_layout(op, "input", x, "output", y));
    int64_t Ho = ch_pool_out_size(x->shape[2], p->kernel_h, p->stride_h, p->pad_h, p->ceil_mode);
    int64_t Wo = ch_pool_out_size(x->shape[3], p->kernel_w, p->stride_w, p->pad_w, p->ceil_mode);
    if (Ho < 1 || Wo < 1) {
        char a[128];
        return CH_ERROR(CH_ERR_INVALID, "%s: window %dx%d does not fit input %s", op,
                        p->kernel_h, p->kernel_w, DESC(x, a));
    }
    CH_TRY(need_shape4(op, "output", y, x->shape[0], x->shape[1], Ho, Wo));
    return CH_OK;
}

ch_status ch_op_maxpool2d_forward(ch_compute_t *cx, const ch_tensor_t *x,
                                  const ch_pool2d_params_t *p, ch_tensor_t *y)
{
#define OP "ch_op_maxpool2d_forward"
    CH_TRY(pool_check(OP, x, p, y));
    SAME_DEVICE(OP, x, y);
    BE(x);
    wrote(y, NULL, NULL);
    return be->maxpool_forward(st, x, p, y);
#undef OP
}

ch_status ch_op_maxpool2d_backward(ch_compute_t *cx, const ch_tensor_t *x,
                                   const ch_tensor_t *dy, const ch_pool2d_params_t *p,
                                   ch_tensor_t *dx)
{
#define OP "ch_op_maxpool2d_backward"
    CH_TRY(pool_check(OP, x, p, dy));
    CH_TRY(bn_pair(OP, "x", x, "dx", dx));
    SAME_DEVICE(OP, x, dy, dx);
    BE(x);
    wrote(dx, NULL, NULL);
    return be->maxpool_backward(st, x, dy, p, dx);
#undef OP
}

/* y is (N,C,1,1) any layout or (N,C) plain. */
static ch_status pooled_check(const char *op, const char *arg, const ch_tensor_t *y,
                              const ch_tensor_t *x)
{
    CH_REQUIRE(y, "%s: %s is NULL", op, arg);
    CH_TRY(need(op, arg, y, CH_F32, 0));
    int64_t N = x->shape[0], C = x->shape[1];
    if (y->ndim == 4) return need_shape4(op, arg, y, N, C, 1, 1);
    if (y->ndim == 2 && y->shape[0] == N && y->shape[1] == C) return need_plain(op, arg, y);
    char a[128], b[128];
    return CH_ERROR(CH_ERR_INVALID, "%s: %s must be (N,C,1,1) or (N,C) for input %s, got %s",
                    op, arg, DESC(x, b), DESC(y, a));
}

ch_status ch_op_avgpool_global_forward(ch_compute_t *cx, const ch_tensor_t *x, ch_tensor_t *y)
{
#define OP "ch_op_avgpool_global_forward"
    CH_REQUIRE(x, OP ": x is NULL");
    CH_TRY(need(OP, "x", x, CH_F32, 4));
    CH_TRY(pooled_check(OP, "y", y, x));
    SAME_DEVICE(OP, x, y);
    BE(x);
    wrote(y, NULL, NULL);
    return be->avgpool_global_forward(st, x, y);
#undef OP
}

ch_status ch_op_avgpool_global_backward(ch_compute_t *cx, const ch_tensor_t *dy,
                                        ch_tensor_t *dx)
{
#define OP "ch_op_avgpool_global_backward"
    CH_REQUIRE(dx, OP ": dx is NULL");
    CH_TRY(need(OP, "dx", dx, CH_F32, 4));
    CH_TRY(pooled_check(OP, "dy", dy, dx));
    SAME_DEVICE(OP, dx, dy);
    BE(dx);
    wrote(dx, NULL, NULL);
    return be->avgpool_global_backward(st, dy, dx);
#undef OP
}

ch_status ch_op_avgpool2d_forward(ch_compute_t *cx, const ch_tensor_t *x,
                                  const ch_pool2d_params_t *p, ch_tensor_t *y)
{
#define OP "ch_op_avgpool2d_forward"
    CH_TRY(pool_check(OP, x, p, y));
    SAME_DEVICE(OP, x, y);
    BE(x);
    if (!be->avgpool_forward)
        return CH_ERROR(CH_ERR_UNSUPPORTED, OP ": not implemented by the %s backend", be->name);
    wrote(y, NULL, NULL);
    return be->avgpool_forward(st, x, p, y);
#undef OP
}

ch_status ch_op_avgpool2d_backward(ch_compute_t *cx, const ch_tensor_t *dy,
                                   const ch_pool2d_params_t *p, ch_tensor_t *dx)
{
#define OP "ch_op_avgpool2d_backward"
    CH_REQUIRE(dx, OP ": dx is NULL");
    CH_TRY(pool_check(OP, dx, p, dy));
    SAME_DEVICE(OP, dy, dx);
    BE(dy);
    if (!be->avgpool_backward)
        return CH_ERROR(CH_ERR_UNSUPPORTED, OP ": not implemented by the %s backend", be->name);
    wrote(dx, NULL, NULL);
    return be->avgpool_backward(st, dy, p, dx);
#undef OP
}

/* x (N,C,H,W) and y (N,C,Ho,Wo), Ho, Wo >= 1, one layout. */
static ch_status adaptive_check(const char *op, const ch_tensor_t *x, const ch_tensor_t *y)
{
    CH_REQUIRE(x && y, "%s: NULL tensor", op);
    CH_TRY(need(op, "input", x, CH_F32, 4));
    CH_TRY(need(op, "output", y, CH_F32, 4));
    CH_TRY(need_same_layout(op, "input", x, "output", y));
    char a[128], b[128];
    if (y->shape[0] != x->shape[0] || y->shape[1] != x->shape[1] || y->shape[2] < 1 ||
        y->shape[3] < 1)
        return CH_ERROR(CH_ERR_INVALID,
                        "%s: output %s must be (N,C,Ho,Wo) with Ho, Wo >= 1 for input %s", op,
                        DESC(y, a), DESC(x, b));
    return CH_OK;
}

static int is_global(const ch_tensor_t *y)
{
    return y && (y->ndim == 2 || (y->ndim == 4 && y->shape[2] == 1 && y->shape[3] == 1));
}

ch_status ch_op_adaptive_avgpool2d_forward(ch_compute_t *cx, const ch_tensor_t *x,
                                           ch_tensor_t *y)
{
#define OP "ch_op_adaptive_avgpool2d_forward"
    if (is_global(y)) return ch_op_avgpool_global_forward(cx, x, y);
    CH_TRY(adaptive_check(OP, x, y));
    SAME_DEVICE(OP, x, y);
    BE(x);
    if (!be->adaptive_avgpool_forward)
        return CH_ERROR(CH_ERR_UNSUPPORTED, OP ": not implemented by the %s backend", be->name);
    wrote(y, NULL, NULL);
    return be->adaptive_avgpool_forward(st, x, y);
#undef OP
}

ch_status ch_op_adaptive_avgpool2d_backward(ch_compute_t *cx, const ch_tensor_t *dy,
                                            ch_tensor_t *dx)
{
#define OP "ch_op_adaptive_avgpool2d_backward"
    if (is_global(dy)) return ch_op_avgpool_global_backward(cx, dy, dx);
    CH_TRY(adaptive_check(OP, dx, dy));
    SAME_DEVICE(OP, dy, dx);
    BE(dy);
    if (!be->adaptive_avgpool_backward)
        return CH_ERROR(CH_ERR_UNSUPPORTED, OP ": not implemented by the %s backend", be->name);
    wrote(dx, NULL, NULL);
    return be->adaptive_avgpool_backward(st, dy, dx);
#undef OP
}

/* --------------------------------------------------------------- linear */

static ch_status mat(const char *op, const char *arg, const ch_tensor_t *t, int64_t r,
                     int64_t c)
{
    CH_REQUIRE(t, "%s: %s is NULL", op, arg);
    int64_t s[2] = {r, c};
    char what[96];
    snprintf(what, sizeof what, "%s: %s", op, arg);
    CH_TRY(ch_tensor_check_shape(t, what, CH_F32, 2, s));
    return need_plain(op, arg, t);
}

ch_status ch_op_linear_forward(ch_compute_t *cx, const ch_tensor_t *x, const ch_tensor_t *w,
                               const ch_tensor_t *b, ch_tensor_t *y)
{
#define OP "ch_op_linear_forward"
    CH_REQUIRE(x && w, OP ": NULL tensor");
    CH_TRY(need(OP, "x", x, CH_F32, 2));
    CH_TRY(need(OP, "weight", w, CH_F32, 2));
    int64_t N = x->shape[0], K = x->shape[1], M = w->shape[0];
    CH_TRY(mat(OP, "x", x, N, K));
    CH_TRY(mat(OP, "weight", w, M, K));
    CH_TRY(mat(OP, "y", y, N, M));
    CH_TRY(need_vec(OP, "bias", b, M, 1));
    SAME_DEVICE(OP, x, w, b, y);
    BE(x);
    wrote(y, NULL, NULL);
    return be->linear_forward(st, x, w, b, y);
#undef OP
}

ch_status ch_op_linear_backward_data(ch_compute_t *cx, const ch_tensor_t *dy,
                                     const ch_tensor_t *w, ch_tensor_t *dx)
{
#define OP "ch_op_linear_backward_data"
    CH_REQUIRE(dy && w, OP ": NULL tensor");
    CH_TRY(need(OP, "dy", dy, CH_F32, 2));
    CH_TRY(need(OP, "weight", w, CH_F32, 2));
    int64_t N = dy->shape[0], M = w->shape[0], K = w->shape[1];
    CH_TRY(mat(OP, "dy", dy, N, M));
    CH_TRY(mat(OP, "weight", w, M, K));
    CH_TRY(mat(OP, "dx", dx, N, K));
    SAME_DEVICE(OP, dy, w, dx);
    BE(dy);
    wrote(dx, NULL, NULL);
    return be->linear_backward_data(st, dy, w, dx);
#undef OP
}

ch_status ch_op_linear_backward_weights(ch_compute_t *cx, const ch_tensor_t *x,
                                        const ch_tensor_t *dy, ch_tensor_t *dw, ch_tensor_t *db)
{
#define OP "ch_op_linear_backward_weights"
    CH_REQUIRE(x && dy, OP ": NULL tensor");
    CH_TRY(need(OP, "x", x, CH_F32, 2));
    CH_TRY(need(OP, "dy", dy, CH_F32, 2));
    int64_t N = x->shape[0], K = x->shape[1], M = dy->shape[1];
    CH_TRY(mat(OP, "x", x, N, K));
    CH_TRY(mat(OP, "dy", dy, N, M));
    CH_TRY(mat(OP, "dweight", dw, M, K));
    CH_TRY(need_vec(OP, "dbias", db, M, 1));
    SAME_DEVICE(OP, x, dy, dw, db);
    BE(x);
    wrote(dw, db, NULL);
    return be->linear_backward_weights(st, x, dy, dw, db);
#undef OP
}

/* ---------------------------------------------------------- elementwise */

ch_status ch_op_add(ch_compute_t *cx, const ch_tensor_t *a, const ch_tensor_t *b,
                    ch_tensor_t *out)
{
#define OP "ch_op_add"
    CH_REQUIRE(a && b && out, OP ": NULL tensor");
    CH_TRY(need(OP, "a", a, CH_F32, 0));
    CH_TRY(bn_pair(OP, "a", a, "b", b));
    CH_TRY(bn_pair(OP, "a", a, "out", out));
    SAME_DEVICE(OP, a, b, out);
    BE(a);
    wrote(out, NULL, NULL);
    return be->add(st, a, b, out);
#undef OP
}

ch_status ch_op_add_inplace(ch_compute_t *cx, ch_tensor_t *acc, const ch_tensor_t *x)
{
#define OP "ch_op_add_inplace"
    CH_REQUIRE(acc && x, OP ": NULL tensor");
    CH_TRY(need(OP, "acc", acc, CH_F32, 0));
    CH_TRY(bn_pair(OP, "acc", acc, "x", x));
    SAME_DEVICE(OP, acc, x);
    BE(acc);
    wrote(acc, NULL, NULL);
    return be->add(st, acc, x, acc);
#undef OP
}

ch_status ch_op_scale(ch_compute_t *cx, ch_tensor_t *t, float alpha)
{
#define OP "ch_op_scale"
    CH_TRY(need(OP, "t", t, CH_F32, 0));
    BE(t);
    wrote(t, NULL, NULL);
    return be->scale(st, t, alpha);
#undef OP
}

/* ------------------------------------------------------------ channel ops */

/* x (N,C,H,W) and s (N,C) / (N,C,1,1), both float32 with storage. */
static ch_status need_channel_scale(const char *op, const ch_tensor_t *x, const ch_tensor_t *s)
{
    CH_TRY(need(op, "x", x, CH_F32, 4));
    CH_TRY(need(op, "s", s, CH_F32, 0));
    int ok = s->ndim >= 2 && s->shape[0] == x->shape[0] && s->shape[1] == x->shape[1] &&
             (s->ndim == 2 || (s->ndim == 4 && s->shape[2] == 1 && s->shape[3] == 1));
    if (!ok) {
        char b1[128], b2[128];
        return CH_ERROR(CH_ERR_INVALID, "%s: s is %s, expected (N, C) or (N, C, 1, 1) of x %s", op,
                        ch_tensor_describe(s, b1, sizeof b1), ch_tensor_describe(x, b2, sizeof b2));
    }
    return CH_OK;
}

ch_status ch_op_mul_channel(ch_compute_t *cx, const ch_tensor_t *x, const ch_tensor_t *s,
                            ch_tensor_t *y)
{
#define OP "ch_op_mul_channel"
    CH_REQUIRE(x && s && y, OP ": NULL tensor");
    CH_TRY(need_channel_scale(OP, x, s));
    CH_TRY(need(OP, "y", y, CH_F32, 4));
    CH_TRY(need_same_shape(OP, "x", x, "y", y));
    SAME_DEVICE(OP, x, s, y);
    BE(x);
    if (!be->mul_channel) return CH_ERROR(CH_ERR_UNSUPPORTED, OP ": not available on this device");
    wrote(y, NULL, NULL);
    return be->mul_channel(st, x, s, y);
#undef OP
}

ch_status ch_op_mul_channel_backward(ch_compute_t *cx, const ch_tensor_t *x, const ch_tensor_t *s,
                                     const ch_tensor_t *dy, ch_tensor_t *dx, ch_tensor_t *ds)
{
#define OP "ch_op_mul_channel_backward"
    CH_REQUIRE(x && s && dy, OP ": NULL tensor");
    CH_TRY(need_channel_scale(OP, x, s));
    CH_TRY(need(OP, "dy", dy, CH_F32, 4));
    CH_TRY(need_same_shape(OP, "x", x, "dy", dy));
    if (dx) {
        CH_TRY(need(OP, "dx", dx, CH_F32, 4));
        CH_TRY(need_same_shape(OP, "x", x, "dx", dx));
    }
    if (ds) {
        CH_TRY(need(OP, "ds", ds, CH_F32, s->ndim));
        CH_TRY(need_same_shape(OP, "s", s, "ds", ds));
    }
    CH_REQUIRE(!dx || (dx->data != x->data && dx->data != dy->data), OP ": dx must not alias x or dy");
    SAME_DEVICE(OP, x, s, dy, dx, ds);
    BE(x);
    if (!be->mul_channel_backward)
        return CH_ERROR(CH_ERR_UNSUPPORTED, OP ": not available on this device");
    wrote(dx, ds, NULL);
    return be->mul_channel_backward(st, x, s, dy, dx, ds);
#undef OP
}

/* parts[i] (N, C_i, H, W) of whole (N, sum C_i, H, W). */
static ch_status need_channel_parts(const char *op, const ch_tensor_t *whole,
                                    const ch_tensor_t *const *parts, int n)
{
    CH_REQUIRE(parts && n >= 1, "%s: needs at least one part (n = %d)", op, n);
    CH_TRY(need(op, "concatenation", whole, CH_F32, 4));
    int64_t c = 0;
    for (int i = 0; i < n; i++) {
        const ch_tensor_t *p = parts[i];
        CH_REQUIRE(p, "%s: part %d is NULL", op, i);
        CH_TRY(need(op, "part", p, CH_F32, 4));
        if (p->shape[0] != whole->shape[0] || p->shape[2] != whole->shape[2] ||
            p->shape[3] != whole->shape[3]) {
            char b1[128], b2[128];
            return CH_ERROR(CH_ERR_INVALID, "%s: part %d is %s, concatenation %s (N, H, W differ)",
                            op, i, ch_tensor_describe(p, b1, sizeof b1),
                            ch_tensor_describe(whole, b2, sizeof b2));
        }
        CH_TRY(same_device(op, whole, &parts[i], 1));
        CH_REQUIRE(p->data != whole->data || !whole->nbytes, "%s: part %d aliases the concatenation",
                   op, i);
        c += p->shape[1];
    }
    CH_REQUIRE(c == whole->shape[1], "%s: parts have %lld channels in all, concatenation %lld", op,
               (long long)c, (long long)whole->shape[1]);
    return CH_OK;
}

ch_status ch_op_concat_channels(ch_compute_t *cx, const ch_tensor_t *const *xs, int n,
                                ch_tensor_t *y)
{
#define OP "ch_op_concat_channels"
    CH_REQUIRE(y, OP ": NULL tensor");
    CH_TRY(need_channel_parts(OP, y, xs, n));
    BE(y);
    if (!be->concat_channels) return CH_ERROR(CH_ERR_UNSUPPORTED, OP ": not available on this device");
    wrote(y, NULL, NULL);
    return be->concat_channels(st, xs, n, y);
#undef OP
}

ch_status ch_op_split_channels(ch_compute_t *cx, const ch_tensor_t *dy, ch_tensor_t *const *dxs,
                               int n)
{
#define OP "ch_op_split_channels"
    CH_REQUIRE(dy, OP ": NULL tensor");
    CH_TRY(need_channel_parts(OP, dy, (const ch_tensor_t *const *)dxs, n));
    BE(dy);
    if (!be->split_channels) return CH_ERROR(CH_ERR_UNSUPPORTED, OP ": not available on this device");
    return be->split_channels(st, dy, dxs, n);
#undef OP
}

/* -------------------------------------------------------------- dropout */

ch_status ch_op_dropout(ch_compute_t *cx, const ch_tensor_t *x, float p,
                        const ch_dropout_key_t *key, ch_tensor_t *y)
{
#define OP "ch_op_dropout"
    CH_REQUIRE(x && y && key, OP ": NULL argument");
    CH_TRY(need(OP, "x", x, CH_F32, 0));
    CH_TRY(need(OP, "y", y, CH_F32, 0));
    CH_TRY(need_plain(OP, "x", x));
    CH_TRY(need_plain(OP, "y", y));
    CH_REQUIRE(x->ndim == 2 || x->ndim == 4, OP ": x must be (N, F) or (N, C, H, W), got %d-D",
               x->ndim);
    CH_REQUIRE(ch_tensor_same_shape(x, y), OP ": x and y differ in shape");
    CH_REQUIRE(p >= 0.0f && p <= 1.0f, OP ": p = %g, expected 0 <= p <= 1", (double)p);
    CH_REQUIRE(key->sample_base >= 0 && key->sample_stride >= 1,
               OP ": sample_base %lld (expected >= 0), sample_stride %lld (expected >= 1)",
               (long long)key->sample_base, (long long)key->sample_stride);
    SAME_DEVICE(OP, x, y);
    BE(x);
    CH_REQUIRE(be->dropout, OP ": not available on the %s backend", be->name);
    wrote(y, NULL, NULL);
    return be->dropout(st, x, p, key, y);
#undef OP
}

/* ----------------------------------------------------------------- loss */

static ch_status logits_labels(const char *op, const ch_tensor_t *logits,
                               const ch_tensor_t *labels)
{
    CH_REQUIRE(logits && labels, "%s: NULL tensor", op);
    CH_TRY(need(op, "logits", logits, CH_F32, 2));
    CH_TRY(need_plain(op, "logits", logits));
    CH_TRY(need(op, "labels", labels, CH_I64, 1));
    CH_TRY(need_plain(op, "labels", labels));
    if (labels->shape[0] != logits->shape[0]) {
        char a[128], b[128];
        return CH_ERROR(CH_ERR_INVALID, "%s: labels %s do not match logits %s (one per row)",
                        op, DESC(labels, a), DESC(logits, b));
    }
    SAME_DEVICE(op, logits, labels);
    return CH_OK;
}

/* The tensors of a cross-entropy op (logits, labels, loss, dlogits). */
static ch_status xent_args(const char *op, const ch_tensor_t *logits, const ch_tensor_t *labels,
                           const ch_tensor_t *loss, const ch_tensor_t *dlogits)
{
    CH_TRY(logits_labels(op, logits, labels));
    CH_REQUIRE(logits->shape[0] >= 1 && logits->shape[1] >= 1,
               "%s: logits need N >= 1 rows and K >= 1 classes", op);
    CH_REQUIRE(loss, "%s: loss is NULL", op);
    CH_TRY(need_vec(op, "loss", loss, 1, 0));
    if (dlogits) CH_TRY(mat(op, "dlogits", dlogits, logits->shape[0], logits->shape[1]));
    SAME_DEVICE(op, logits, loss, dlogits);
    return CH_OK;
}

ch_status ch_op_cross_entropy(ch_compute_t *cx, const ch_tensor_t *logits,
                              const ch_tensor_t *labels, ch_tensor_t *loss,
                              ch_tensor_t *dlogits)
{
#define OP "ch_op_cross_entropy"
    CH_TRY(xent_args(OP, logits, labels, loss, dlogits));
    BE(logits);
    wrote(loss, dlogits, NULL);
    return be->cross_entropy(st, logits, labels, loss, dlogits);
#undef OP
}

ch_status ch_op_cross_entropy_smooth(ch_compute_t *cx, const ch_tensor_t *logits,
                                     const ch_tensor_t *labels, double label_smoothing,
                                     ch_tensor_t *loss, ch_tensor_t *dlogits)
{
#define OP "ch_op_cross_entropy_smooth"
    CH_REQUIRE(label_smoothing >= 0.0 && label_smoothing <= 1.0,
               OP ": label_smoothing = %g, expected a value in [0, 1]", label_smoothing);
    if (label_smoothing == 0.0) return ch_op_cross_entropy(cx, logits, labels, loss, dlogits);
    CH_TRY(xent_args(OP, logits, labels, loss, dlogits));
    BE(logits);
    if (!be->cross_entropy_smooth)
        return CH_ERROR(CH_ERR_UNSUPPORTED, OP ": the %s backend has no label smoothing",
                        be->name);
    wrote(loss, dlogits, NULL);
    return be->cross_entropy_smooth(st, logits, labels, label_smoothing, loss, dlogits);
#undef OP
}

ch_status ch_op_argmax(ch_compute_t *cx, const ch_tensor_t *logits, ch_tensor_t *out)
{
#define OP "ch_op_argmax"
    CH_REQUIRE(logits && out, OP ": NULL tensor");
    CH_TRY(logits_labels(OP, logits, out));
    CH_REQUIRE(logits->shape[1] >= 1, OP ": logits need K >= 1 classes");
    BE(logits);
    wrote(out, NULL, NULL);
    return be->argmax(st, logits, out);
#undef OP
}

ch_status ch_op_count_correct(ch_compute_t *cx, const ch_tensor_t *logits,
                              const ch_tensor_t *labels, int64_t *correct)
{
#define OP "ch_op_count_correct"
    CH_REQUIRE(correct, OP ": correct is NULL");
    CH_TRY(logits_labels(OP, logits, labels));
    CH_REQUIRE(logits->shape[1] >= 1, OP ": logits need K >= 1 classes");
    BE(logits);
    return be->count_correct(st, logits, labels, correct);
#undef OP
}

/* ------------------------------------------------------- streams, uploads */

void *ch_compute_stream(ch_compute_t *cx, ch_devkind_t dev)
{
    if (!cx || dev != CH_DEV_CUDA || !cx->be[CH_DEV_CUDA]) return NULL;
    if (!cx->state[CH_DEV_CUDA] &&
        cx->be[CH_DEV_CUDA]->create(&cx->state[CH_DEV_CUDA], &cx->opts) != CH_OK)
        return NULL;
    return cx->be[CH_DEV_CUDA]->stream ? cx->be[CH_DEV_CUDA]->stream(cx->state[CH_DEV_CUDA])
                                       : NULL;
}

ch_status ch_op_upload_async(ch_compute_t *cx, const ch_tensor_t *src, ch_tensor_t *dst)
{
#define OP "ch_op_upload_async"
    CH_REQUIRE(src && dst, OP ": NULL tensor");
    CH_TRY(need(OP, "src", src, src->dtype, 0));
    CH_TRY(need(OP, "dst", dst, src->dtype, src->ndim));
    CH_TRY(need_same_shape(OP, "src", src, "dst", dst));
    if (src->dev != CH_DEV_CPU || dst->dev != CH_DEV_CUDA) {
        char a[128], b[128];
        return CH_ERROR(CH_ERR_INVALID, OP ": expected a host src and a GPU dst, got %s -> %s",
                        DESC(src, a), DESC(dst, b));
    }
    BE(dst);
    if (!be->upload_async)
        return CH_ERROR(CH_ERR_UNSUPPORTED, OP ": the %s backend has no async upload", be->name);
    wrote(dst, NULL, NULL);
    return be->upload_async(st, src, dst);
#undef OP
}

ch_status ch_compute_wait_upload(ch_compute_t *cx)
{
    CH_REQUIRE(cx, "ch_compute_wait_upload: context is NULL");
    const ch_ops_backend_t *be = cx->be[CH_DEV_CUDA];
    if (!be || !cx->state[CH_DEV_CUDA] || !be->wait_upload) return CH_OK;
    return be->wait_upload(cx->state[CH_DEV_CUDA]);
}

/* ------------------------------------------------------------- optimizer */

ch_status ch_op_sgd_step(ch_compute_t *cx, ch_devkind_t dev, int dev_index,
                         const ch_sgd_tensor_t *ts, int n, const ch_sgd_hparams_t *h)
{
#define OP "ch_op_sgd_step"
    CH_REQUIRE(cx || dev == CH_DEV_CPU, OP ": compute context is NULL");
    CH_REQUIRE(h, OP ": hyperparameters are NULL");
    CH_REQUIRE(n >= 0, OP ": %d tensors, expected >= 0", n);
    CH_REQUIRE(n == 0 || ts, OP ": tensor list is NULL");
    CH_REQUIRE(dev == CH_DEV_CPU || dev == CH_DEV_CUDA, OP ": unknown device kind %d", (int)dev);
    for (int i = 0; i < n; i++) {
        CH_REQUIRE(ts[i].numel >= 0, OP ": tensor %d has numel %lld", i, (long long)ts[i].numel);
        if (ts[i].numel == 0) continue;
        CH_REQUIRE(ts[i].param && ts[i].grad, OP ": tensor %d has a NULL param or grad", i);
        CH_REQUIRE(h->momentum == 0.0f || ts[i].momentum_buffer,
                   OP ": tensor %d has no momentum buffer but momentum is %g", i,
                   (double)h->momentum);
    }
    if (n == 0) return CH_OK;
    ch_tensor_data_changed(); /* parameters are written (tensor.h) */
    if (!cx) /* the CPU loop needs no context (optimizers without one) */
        return ch_ops_cpu_backend()->sgd_step(NULL, ts, n, h);
    ch_tensor_t probe;
    int64_t one = 1;
    CH_TRY(ch_tensor_wrap(&probe, ts[0].param, CH_F32, 1, &one, CH_LAYOUT_PLAIN, dev,
                          dev == CH_DEV_CUDA ? dev_index : 0));
    BE(&probe);
    if (!be->sgd_step)
        return CH_ERROR(CH_ERR_UNSUPPORTED, OP ": the %s backend has no fused SGD", be->name);
    return be->sgd_step(st, ts, n, h);
#undef OP
}

/* The arguments every fused optimizer step checks first. */
static ch_status optim_list(const char *op, const void *h, const void *ts, int n)
{
    CH_REQUIRE(h, "%s: hyperparameters are NULL", op);
    CH_REQUIRE(n >= 0, "%s: %d tensors, expected >= 0", op, n);
    CH_REQUIRE(n == 0 || ts, "%s: tensor list is NULL", op);
    return CH_OK;
}

/* The backend and state of a fused optimizer step whose pointers live on
 * (dev, dev_index); *be NULL with CH_OK for a CPU step without context. */
static ch_status optim_pick(ch_compute_t *cx, const char *op, ch_devkind_t dev, int dev_index,
                            float *param0, const ch_ops_backend_t **be, void **st)
{
    *be = NULL;
    *st = NULL;
    CH_REQUIRE(cx || dev == CH_DEV_CPU, "%s: compute context is NULL", op);
    CH_REQUIRE(dev == CH_DEV_CPU || dev == CH_DEV_CUDA, "%s: unknown device kind %d", op,
               (int)dev);
    ch_tensor_data_changed(); /* parameters are written (tensor.h) */
    if (!cx) {
        *be = ch_ops_cpu_backend();
        return CH_OK;
    }
    ch_tensor_t probe;
    int64_t one = 1;
    CH_TRY(ch_tensor_wrap(&probe, param0, CH_F32, 1, &one, CH_LAYOUT_PLAIN, dev,
                          dev == CH_DEV_CUDA ? dev_index : 0));
    return pick(cx, op, &probe, be, st);
}

ch_status ch_op_adamw_step(ch_compute_t *cx, ch_devkind_t dev, int dev_index,
                           const ch_adamw_tensor_t *ts, int n, const ch_adamw_hparams_t *h)
{
#define OP "ch_op_adamw_step"
    CH_TRY(optim_list(OP, h, ts, n));
    for (int i = 0; i < n; i++) {
        CH_REQUIRE(ts[i].numel >= 0, OP ": tensor %d has numel %lld", i, (long long)ts[i].numel);
        if (ts[i].numel == 0) continue;
        CH_REQUIRE(ts[i].param && ts[i].grad && ts[i].exp_avg && ts[i].exp_avg_sq,
                   OP ": tensor %d has a NULL param, grad, exp_avg or exp_avg_sq", i);
        CH_REQUIRE(!h->amsgrad || ts[i].max_exp_avg_sq,
                   OP ": tensor %d has no max_exp_avg_sq but amsgrad is on", i);
    }
    if (n == 0) return CH_OK;
    const ch_ops_backend_t *be;
    void *st;
    CH_TRY(optim_pick(cx, OP, dev, dev_index, ts[0].param, &be, &st));
    if (!be->adamw_step)
        return CH_ERROR(CH_ERR_UNSUPPORTED, OP ": the %s backend has no AdamW", be->name);
    return be->adamw_step(st, ts, n, h);
#undef OP
}

ch_status ch_op_rmsprop_step(ch_compute_t *cx, ch_devkind_t dev, int dev_index,
                             const ch_rmsprop_tensor_t *ts, int n, const ch_rmsprop_hparams_t *h)
{
#define OP "ch_op_rmsprop_step"
    CH_TRY(optim_list(OP, h, ts, n));
    for (int i = 0; i < n; i++) {
        CH_REQUIRE(ts[i].numel >= 0, OP ": tensor %d has numel %lld", i, (long long)ts[i].numel);
        if (ts[i].numel == 0) continue;
        CH_REQUIRE(ts[i].param && ts[i].grad && ts[i].square_avg,
                   OP ": tensor %d has a NULL param, grad or square_avg", i);
        CH_REQUIRE(!h->centered || ts[i].grad_avg,
                   OP ": tensor %d has no grad_avg but centered is on", i);
        CH_REQUIRE(!(h->momentum > 0.0f) || ts[i].momentum_buffer,
                   OP ": tensor %d has no momentum buffer but momentum is %g", i,
                   (double)h->momentum);
    }
    if (n == 0) return CH_OK;
    const ch_ops_backend_t *be;
    void *st;
    CH_TRY(optim_pick(cx, OP, dev, dev_index, ts[0].param, &be, &st));
    if (!be->rmsprop_step)
        return CH_ERROR(CH_ERR_UNSUPPORTED, OP ": the %s backend has no RMSprop", be->name);
    return be->rmsprop_step(st, ts, n, h);
#undef OP
}

/* ----------------------------------------------------------- activations */

const char *ch_act_name(ch_act_kind_t kind)
{
    switch (kind) {
    case CH_ACT_HARDTANH: return "Hardtanh";
    case CH_ACT_LEAKY_RELU: return "LeakyReLU";
    case CH_ACT_SILU: return "SiLU";
    case CH_ACT_SIGMOID: return "Sigmoid";
    case CH_ACT_TANH: return "Tanh";
    case CH_ACT_GELU_ERF: return "GELU";
    case CH_ACT_GELU_TANH: return "GELU(approximate='tanh')";
    case CH_ACT_HARDSWISH: return "Hardswish";
    case CH_ACT_HARDSIGMOID: return "Hardsigmoid";
    default: return "?";
    }
}

static ch_status act_params(const char *op, const ch_act_params_t *p)
{
    CH_REQUIRE(p, "%s: activation parameters are NULL", op);
    CH_REQUIRE((int)p->kind >= 0 && p->kind < CH_ACT_COUNT_, "%s: unknown activation kind %d", op,
               (int)p->kind);
    CH_REQUIRE(p->kind != CH_ACT_HARDTANH || p->alpha <= p->beta,
               "%s: Hardtanh min_val %g > max_val %g", op, (double)p->alpha, (double)p->beta);
    CH_REQUIRE(isfinite(p->alpha) && isfinite(p->beta), "%s: %s parameters %g, %g are not finite",
               op, ch_act_name(p->kind), (double)p->alpha, (double)p->beta);
    return CH_OK;
}

static ch_status no_entry(const char *op, const ch_ops_backend_t *be)
{
    return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: the %s backend does not implement it", op, be->name);
}

ch_status ch_op_act_forward(ch_compute_t *cx, const ch_act_params_t *p, const ch_tensor_t *x,
                            ch_tensor_t *y)
{
#define OP "ch_op_act_forward"
    CH_TRY(act_params(OP, p));
    CH_REQUIRE(x && y, OP ": NULL tensor");
    CH_TRY(need(OP, "x", x, CH_F32, 0));
    CH_TRY(bn_pair(OP, "x", x, "y", y));
    SAME_DEVICE(OP, x, y);
    BE(x);
    if (!be->act_forward) return no_entry(OP, be);
    wrote(y, NULL, NULL);
    return be->act_forward(st, p, x, y);
#undef OP
}

ch_status ch_op_act_backward(ch_compute_t *cx, const ch_act_params_t *p, const ch_tensor_t *x,
                             const ch_tensor_t *dy, ch_tensor_t *dx)
{
#define OP "ch_op_act_backward"
    CH_TRY(act_params(OP, p));
    CH_REQUIRE(x && dy && dx, OP ": NULL tensor");
    CH_TRY(need(OP, "x", x, CH_F32, 0));
    CH_TRY(bn_pair(OP, "x", x, "dy", dy));
    CH_TRY(bn_pair(OP, "x", x, "dx", dx));
    CH_REQUIRE(dx->data != x->data || !x->nbytes, OP ": dx must not alias the forward input x");
    SAME_DEVICE(OP, x, dy, dx);
    BE(x);
    if (!be->act_backward) return no_entry(OP, be);
    wrote(dx, NULL, NULL);
    return be->act_backward(st, p, x, dy, dx);
#undef OP
}

/* ------------------------------------------------------------ layer norm */

/* x (N,C,H,W) and the (N*H*W) plain position vectors v1, v2. */
static ch_status ln2d_common(const char *op, const ch_tensor_t *x, const ch_tensor_t *weight,
                             const ch_tensor_t *v1, const ch_tensor_t *v2)
{
    CH_REQUIRE(x, "%s: x is NULL", op);
    CH_TRY(need(op, "x", x, CH_F32, 4));
    const int64_t C = x->shape[1], P = x->shape[0] * x->shape[2] * x->shape[3];
    CH_TRY(need_vec(op, "weight", weight, C, 1));
    const ch_tensor_t *v[2] = {v1, v2};
    const char *nm[2] = {"mean", "rstd"};
    for (int i = 0; i < 2; i++) {
        CH_REQUIRE(v[i], "%s: %s is NULL", op, nm[i]);
        CH_TRY(need(op, nm[i], v[i], CH_F32, 1));
        CH_TRY(need_plain(op, nm[i], v[i]));
        if (v[i]->shape[0] != P) {
            char a[128];
            return CH_ERROR(CH_ERR_INVALID, "%s: %s must have N*H*W = %lld elements (one per "
                            "position), got %s", op, nm[i], (long long)P, DESC(v[i], a));
        }
    }
    SAME_DEVICE(op, x, weight, v1, v2);
    return CH_OK;
}

ch_status ch_op_layernorm2d_forward(ch_compute_t *cx, const ch_tensor_t *x,
                                    const ch_tensor_t *weight, const ch_tensor_t *bias,
                                    float eps, ch_tensor_t *y, ch_tensor_t *mean,
                                    ch_tensor_t *rstd)
{
#define OP "ch_op_layernorm2d_forward"
    CH_TRY(ln2d_common(OP, x, weight, mean, rstd));
    CH_TRY(need_vec(OP, "bias", bias, x->shape[1], 1));
    CH_TRY(bn_pair(OP, "x", x, "y", y));
    CH_REQUIRE(y->data != x->data || !x->nbytes, OP ": y must not alias x");
    CH_REQUIRE(eps > 0.0f && isfinite(eps), OP ": eps %g, expected > 0", (double)eps);
    SAME_DEVICE(OP, x, bias, y);
    BE(x);
    if (!be->ln2d_forward) return no_entry(OP, be);
    wrote(y, mean, rstd);
    return be->ln2d_forward(st, x, weight, bias, eps, y, mean, rstd);
#undef OP
}

ch_status ch_op_layernorm2d_backward(ch_compute_t *cx, const ch_tensor_t *x,
                                     const ch_tensor_t *dy, const ch_tensor_t *mean,
                                     const ch_tensor_t *rstd, const ch_tensor_t *weight,
                                     ch_tensor_t *dx, ch_tensor_t *dweight,
                                     ch_tensor_t *dbias)
{
#define OP "ch_op_layernorm2d_backward"
    CH_TRY(ln2d_common(OP, x, weight, mean, rstd));
    CH_TRY(bn_pair(OP, "x", x, "dy", dy));
    if (dx) CH_TRY(bn_pair(OP, "x", x, "dx", dx));
    CH_TRY(need_vec(OP, "dweight", dweight, x->shape[1], 1));
    CH_TRY(need_vec(OP, "dbias", dbias, x->shape[1], 1));
    CH_REQUIRE(!dx || dx->data != x->data || !x->nbytes, OP ": dx must not alias x");
    SAME_DEVICE(OP, x, dy, dx, dweight, dbias);
    BE(x);
    if (!be->ln2d_backward) return no_entry(OP, be);
    wrote(dx, dweight, dbias);
    return be->ln2d_backward(st, x, dy, mean, rstd, weight, dx, dweight, dbias);
#undef OP
}

/* ------------------------------------------------------------ graph ops */

/* b is a's shape or (N|1, C[, 1, 1]) for a (N, C, H, W). */
static ch_status need_binary(const char *op, const ch_tensor_t *a, const ch_tensor_t *b)
{
    CH_TRY(need(op, "a", a, CH_F32, 4));
    CH_TRY(need(op, "b", b, CH_F32, 0));
    int ok = ch_tensor_same_shape(a, b);
    if (!ok && b->ndim >= 2 && b->shape[1] == a->shape[1] &&
        (b->shape[0] == a->shape[0] || b->shape[0] == 1))
        ok = b->ndim == 2 || (b->ndim == 4 && b->shape[2] == 1 && b->shape[3] == 1);
    if (!ok) {
        char b1[128], b2[128];
        return CH_ERROR(CH_ERR_INVALID, "%s: b is %s, expected a's shape or (N or 1, C, 1, 1) "
                        "for a %s", op, DESC(b, b1), DESC(a, b2));
    }
    return CH_OK;
}

ch_status ch_op_binary(ch_compute_t *cx, ch_binary_op_t op, const ch_tensor_t *a,
                       const ch_tensor_t *b, ch_tensor_t *y)
{
#define OP "ch_op_binary"
    CH_REQUIRE(a && b && y, OP ": NULL tensor");
    CH_REQUIRE(op == CH_BINARY_ADD || op == CH_BINARY_MUL, OP ": unknown op %d", (int)op);
    CH_TRY(need_binary(OP, a, b));
    CH_TRY(need(OP, "y", y, CH_F32, 4));
    CH_TRY(need_same_shape(OP, "a", a, "y", y));
    CH_REQUIRE(y->data != b->data || !y->nbytes, OP ": y must not alias b");
    CH_REQUIRE(y->data != a->data || y->layout == a->layout,
               OP ": y may alias a only in a's layout");
    SAME_DEVICE(OP, a, b, y);
    BE(a);
    if (!be->binary) return CH_ERROR(CH_ERR_UNSUPPORTED, OP ": not available on this device");
    wrote(y, NULL, NULL);
    return be->binary(st, (int)op, a, b, y);
#undef OP
}

ch_status ch_op_binary_backward(ch_compute_t *cx, ch_binary_op_t op, const ch_tensor_t *a,
                                const ch_tensor_t *b, const ch_tensor_t *dy, ch_tensor_t *da,
                                ch_tensor_t *db)
{
#define OP "ch_op_binary_backward"
    CH_REQUIRE(a && b && dy, OP ": NULL tensor");
    CH_REQUIRE(op == CH_BINARY_ADD || op == CH_BINARY_MUL, OP ": unknown op %d", (int)op);
    CH_TRY(need_binary(OP, a, b));
    CH_TRY(need(OP, "dy", dy, CH_F32, 4));
    CH_TRY(need_same_shape(OP, "a", a, "dy", dy));
    if (da) {
        CH_TRY(need(OP, "da", da, CH_F32, 4));
        CH_TRY(need_same_shape(OP, "a", a, "da", da));
        CH_REQUIRE(!da->nbytes || (da->data != a->data && da->data != b->data &&
                                   da->data != dy->data), OP ": da must not alias a, b or dy");
    }
    if (db) {
        CH_TRY(need(OP, "db", db, CH_F32, b->ndim));
        CH_TRY(need_same_shape(OP, "b", b, "db", db));
        CH_REQUIRE(!db->nbytes || (db->data != a->data && db->data != b->data &&
                                   db->data != dy->data), OP ": db must not alias a, b or dy");
    }
    SAME_DEVICE(OP, a, b, dy, da, db);
    BE(a);
    if (!be->binary_backward)
        return CH_ERROR(CH_ERR_UNSUPPORTED, OP ": not available on this device");
    wrote(da, db, NULL);
    return be->binary_backward(st, (int)op, a, b, dy, da, db);
#undef OP
}

ch_status ch_op_copy_channels(ch_compute_t *cx, const ch_tensor_t *src, int64_t src_c0,
                              ch_tensor_t *dst, int64_t dst_c0, int64_t n)
{
#define OP "ch_op_copy_channels"
    CH_REQUIRE(src && dst, OP ": NULL tensor");
    CH_TRY(need(OP, "src", src, CH_F32, 4));
    CH_TRY(need(OP, "dst", dst, CH_F32, 4));
    char b1[128], b2[128];
    if (src->shape[0] != dst->shape[0] || src->shape[2] != dst->shape[2] ||
        src->shape[3] != dst->shape[3] || n < 0 || src_c0 < 0 || dst_c0 < 0 ||
        src_c0 + n > src->shape[1] || dst_c0 + n > dst->shape[1])
        return CH_ERROR(CH_ERR_INVALID, "%s: channels [%lld, %lld) of %s to [%lld, %lld) of %s: "
                        "expected ranges inside both and the same N, H, W", OP,
                        (long long)src_c0, (long long)(src_c0 + n), DESC(src, b1),
                        (long long)dst_c0, (long long)(dst_c0 + n), DESC(dst, b2));
    CH_REQUIRE(src->data != dst->data || !dst->nbytes, OP ": src and dst alias");
    SAME_DEVICE(OP, src, dst);
    BE(src);
    if (!be->copy_channels) return CH_ERROR(CH_ERR_UNSUPPORTED, OP ": not available on this device");
    wrote(dst, NULL, NULL);
    return be->copy_channels(st, src, src_c0, dst, dst_c0, n);
#undef OP
}

ch_status ch_op_channel_shuffle(ch_compute_t *cx, const ch_tensor_t *x, int groups,
                                ch_tensor_t *y)
{
#define OP "ch_op_channel_shuffle"
    CH_REQUIRE(x && y, OP ": NULL tensor");
    CH_TRY(need(OP, "x", x, CH_F32, 4));
    CH_TRY(need(OP, "y", y, CH_F32, 4));
    CH_TRY(need_same_shape(OP, "x", x, "y", y));
    CH_REQUIRE(groups >= 1 && x->shape[1] % groups == 0,
               OP ": groups = %d must be >= 1 and divide the %lld channels", groups,
               (long long)x->shape[1]);
    CH_REQUIRE(x->data != y->data || !y->nbytes, OP ": x and y alias");
    SAME_DEVICE(OP, x, y);
    BE(x);
    if (!be->channel_shuffle)
        return CH_ERROR(CH_ERR_UNSUPPORTED, OP ": not available on this device");
    wrote(y, NULL, NULL);
    return be->channel_shuffle(st, x, groups, y);
#undef OP
}

ch_status ch_op_affine(ch_compute_t *cx, const ch_tensor_t *x, float alpha, float beta,
                       ch_tensor_t *y)
{
#define OP "ch_op_affine"
    CH_REQUIRE(x && y, OP ": NULL tensor");
    CH_TRY(need(OP, "x", x, CH_F32, 0));
    CH_TRY(need(OP, "y", y, CH_F32, 0));
    CH_TRY(need_same_shape(OP, "x", x, "y", y));
    CH_REQUIRE(x->ndim == 2 || x->ndim == 4, OP ": x must be (N, F) or (N, C, H, W), got %d "
               "dimensions", x->ndim);
    CH_REQUIRE(x->data != y->data || x->layout == y->layout,
               OP ": y may alias x only in x's layout");
    SAME_DEVICE(OP, x, y);
    BE(x);
    if (!be->affine) return CH_ERROR(CH_ERR_UNSUPPORTED, OP ": not available on this device");
    wrote(y, NULL, NULL);
    return be->affine(st, x, alpha, beta, y);
#undef OP
}
