/* cohort: forward / backward through the module tree, SyncBN (nn_exec.h). */
#include "config.h"

#include "framework/nn/nn_internal.h"

#include "framework/tensor/device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    int ndim;
    int64_t s[4];
    ch_layout_t layout;
} shp_t;

static char *shp_str(const shp_t *x, char *buf, size_t len)
{
    if (x->ndim == 2)
        snprintf(buf, len, "[%lld, %lld]", (long long)x->s[0], (long long)x->s[1]);
    else
        snprintf(buf, len, "[%lld, %lld, %lld, %lld] %s", (long long)x->s[0], (long long)x->s[1],
                 (long long)x->s[2], (long long)x->s[3], ch_layout_name(x->layout));
    return buf;
}

static ch_status reserve(ch_model_t *M, ch_tensor_t *t, const shp_t *x)
{
    CH_TRY(ch_tensor_init(t, CH_F32, x->ndim, x->s, x->layout, M->dev, M->dev_index));
    return ch_arena_reserve_tensor(M->arena, t);
}

static ch_status plan_graph(ch_model_t *M, ch_compute_t *cx, ch_module_t *g, const shp_t *in,
                            shp_t *out);

/* Plan module m for input shape `in`, giving its output shape. */
static ch_status plan_module(ch_model_t *M, ch_compute_t *cx, ch_module_t *m, const shp_t *in,
                             shp_t *out)
{
    char b1[96];
    if (ch_nn_is_activation(m->kind)) { /* own output (inplace=False) and input gradient */
        *out = *in;
        CH_TRY(reserve(M, &m->y, out));
        return reserve(M, &m->dx, in);
    }
    switch (m->kind) {
    case CH_NN_SEQUENTIAL: {
        shp_t cur = *in, nxt;
        for (int i = 0; i < m->nchild; i++) {
            CH_TRY(plan_module(M, cx, m->child[i], &cur, &nxt));
            cur = nxt;
        }
        *out = cur;
        return CH_OK;
    }
    case CH_NN_RESIDUAL: {
        shp_t cur = *in, nxt, sc = *in;
        CH_REQUIRE(m->main[0]->kind != CH_NN_RELU, "nn: residual block '%s' must not start with ReLU",
                   m->path);
        for (int i = 0; i < m->nmain; i++) {
            CH_TRY(plan_module(M, cx, m->main[i], &cur, &nxt));
            cur = nxt;
        }
        if (m->shortcut) CH_TRY(plan_module(M, cx, m->shortcut, in, &sc));
        int same = cur.ndim == sc.ndim && cur.layout == sc.layout;
        for (int d = 0; same && d < cur.ndim; d++) same = cur.s[d] == sc.s[d];
        if (!same) {
            char b2[96];
            return CH_ERROR(CH_ERR_INVALID, "nn: residual block '%s': main path gives %s, shortcut %s",
                            m->path, shp_str(&cur, b1, sizeof b1), shp_str(&sc, b2, sizeof b2));
        }
        *out = cur;
        return CH_OK;
    }
    case CH_NN_SQUEEZE_EXCITATION: {
        CH_REQUIRE(in->ndim == 4, "nn: SqueezeExcitation '%s' expects (N,C,H,W), got %s", m->path,
                   shp_str(in, b1, sizeof b1));
        CH_REQUIRE(m->nchild > 0, "nn: SqueezeExcitation '%s' has no gate (add its children)",
                   m->path);
        ch_module_t *first = m->child[0];
        CH_REQUIRE(first->kind != CH_NN_RELU,
                   "nn: SqueezeExcitation '%s': the gate must not start with ReLU (in place, it "
                   "would change the input)", m->path);
        /* AdaptiveAvgPool2d(1) keeps (N, C, 1, 1) for the 1x1 convolutions */
        if (first->kind == CH_NN_ADAPTIVE_AVGPOOL2D && first->out_h == 0)
            first->out_h = first->out_w = 1;
        shp_t cur = *in, nxt;
        for (int i = 0; i < m->nchild; i++) {
            CH_TRY(plan_module(M, cx, m->child[i], &cur, &nxt));
            cur = nxt;
        }
        int ok = cur.s[0] == in->s[0] && cur.s[1] == in->s[1] &&
                 (cur.ndim == 2 || (cur.ndim == 4 && cur.s[2] == 1 && cur.s[3] == 1));
        if (!ok) {
            char b2[96];
            return CH_ERROR(CH_ERR_INVALID, "nn: SqueezeExcitation '%s': gate gives %s, expected "
                            "(N, C, 1, 1) for input %s", m->path, shp_str(&cur, b2, sizeof b2),
                            shp_str(in, b1, sizeof b1));
        }
        CH_TRY(reserve(M, &m->se_ds, &cur));
        *out = *in;
        CH_TRY(reserve(M, &m->y, out));
        return reserve(M, &m->dx, in);
    }
    case CH_NN_CONCAT: {
        CH_REQUIRE(in->ndim == 4, "nn: Concat '%s' expects (N,C,H,W), got %s", m->path,
                   shp_str(in, b1, sizeof b1));
        CH_REQUIRE(m->nchild > 0, "nn: Concat '%s' has no branch (add its children)", m->path);
        free(m->part_out);
        free(m->part_dy);
        free(m->part_dyp);
        m->part_out = calloc((size_t)m->nchild, sizeof *m->part_out);
        m->part_dy = calloc((size_t)m->nchild, sizeof *m->part_dy);
        m->part_dyp = calloc((size_t)m->nchild, sizeof *m->part_dyp);
        if (!m->part_out || !m->part_dy || !m->part_dyp)
            return CH_ERROR(CH_ERR_NOMEM, "nn: out of memory planning Concat '%s'", m->path);
        int64_t c = 0;
        shp_t o0 = *in;
        for (int i = 0; i < m->nchild; i++) {
            shp_t o;
            CH_REQUIRE(m->child[i]->kind != CH_NN_RELU,
                       "nn: Concat '%s': branch '%s' must not start with ReLU (in place, it would "
                       "change the other branches' input)", m->path, m->child[i]->local);
            CH_TRY(plan_module(M, cx, m->child[i], in, &o));
            if (i == 0) o0 = o;
            if (o.ndim != 4 || o.s[0] != in->s[0] || o.s[2] != o0.s[2] || o.s[3] != o0.s[3]) {
                char b2[96];
                return CH_ERROR(CH_ERR_INVALID, "nn: Concat '%s': branch '%s' gives %s, expected "
                                "(N, C_i, H, W) with the N, H, W of the other branches", m->path,
                                m->child[i]->local, shp_str(&o, b2, sizeof b2));
            }
            CH_TRY(reserve(M, &m->part_dy[i], &o));
            m->part_dyp[i] = &m->part_dy[i];
            c += o.s[1];
        }
        *out = (shp_t){4, {in->s[0], c, o0.s[2], o0.s[3]},
                       ch_compute_preferred_layout(cx, M->dev, c)};
        CH_TRY(reserve(M, &m->y, out));
        return reserve(M, &m->dx, in);
    }
    case CH_NN_CONV2D: {
        CH_REQUIRE(in->ndim == 4 && in->s[1] == m->in_c,
                   "nn: Conv2d '%s' expects %d input channels, got input %s", m->path, m->in_c,
                   shp_str(in, b1, sizeof b1));
        int64_t ho = ch_conv_out_size_dilated(in->s[2], m->kernel_h, m->conv.stride_h,
                                              m->conv.pad_h, ch_conv2d_dilation_h(&m->conv));
        int64_t wo = ch_conv_out_size_dilated(in->s[3], m->kernel_w, m->conv.stride_w,
                                              m->conv.pad_w, ch_conv2d_dilation_w(&m->conv));
        CH_REQUIRE(ho > 0 && wo > 0,
                   "nn: Conv2d '%s': input %s too small for kernel %dx%d (dilation %dx%d)",
                   m->path, shp_str(in, b1, sizeof b1), m->kernel_h, m->kernel_w,
                   ch_conv2d_dilation_h(&m->conv), ch_conv2d_dilation_w(&m->conv));
        *out = (shp_t){4, {in->s[0], m->out_c, ho, wo},
                       ch_compute_preferred_layout(cx, M->dev, m->out_c)};
        CH_TRY(reserve(M, &m->y, out));
        return reserve(M, &m->dx, in);
    }
    case CH_NN_BATCHNORM2D:
    case CH_NN_SYNC_BATCHNORM:
        CH_REQUIRE(in->ndim == 4 && in->s[1] == m->channels,
                   "nn: BatchNorm2d '%s' expects %d channels, got input %s", m->path, m->channels,
                   shp_str(in, b1, sizeof b1));
        *out = *in;
        CH_TRY(reserve(M, &m->y, out));
        return reserve(M, &m->dx, in);
    case CH_NN_RELU:
        *out = *in;
        /* out of place inside a graph (the in-place rule, plan_graph) */
        return m->relu_copy ? reserve(M, &m->y, out) : CH_OK;
    case CH_NN_GRAPH:
        return plan_graph(M, cx, m, in, out);
    case CH_NN_NARROW:
        CH_REQUIRE(in->ndim == 4 && (int64_t)m->narrow_start + m->narrow_len <= in->s[1],
                   "nn: Narrow '%s': channels [%d, %d) of input %s, expected (N, C, H, W) with "
                   "C >= %d", m->path, m->narrow_start, m->narrow_start + m->narrow_len,
                   shp_str(in, b1, sizeof b1), m->narrow_start + m->narrow_len);
        *out = (shp_t){4, {in->s[0], m->narrow_len, in->s[2], in->s[3]},
                       ch_compute_preferred_layout(cx, M->dev, m->narrow_len)};
        CH_TRY(reserve(M, &m->y, out));
        return reserve(M, &m->dx, in);
    case CH_NN_CHANNEL_SHUFFLE:
        CH_REQUIRE(in->ndim == 4 && in->s[1] % m->groups == 0,
                   "nn: ChannelShuffle '%s': groups %d must divide the channels of input %s",
                   m->path, m->groups, shp_str(in, b1, sizeof b1));
        *out = *in;
        CH_TRY(reserve(M, &m->y, out));
        return reserve(M, &m->dx, in);
    case CH_NN_AFFINE: /* backward scales dy in place */
        *out = *in;
        return reserve(M, &m->y, out);
    case CH_NN_ADD:
    case CH_NN_MUL:
    case CH_NN_CAT:
        return CH_ERROR(CH_ERR_INVALID, "nn: %s '%s' is not a node of a graph",
                        m->kind == CH_NN_CAT ? "Cat" : m->kind == CH_NN_ADD ? "Add" : "Mul",
                        m->path);
    case CH_NN_LAYERNORM2D: {
        /* (N, C) runs as (N, C, 1, 1): nn.LayerNorm over the features */
        CH_REQUIRE((in->ndim == 4 || in->ndim == 2) && in->s[1] == m->channels,
                   "nn: LayerNorm2d '%s' expects (N, %d, H, W) or (N, %d), got input %s", m->path,
                   m->channels, m->channels, shp_str(in, b1, sizeof b1));
        shp_t pos = {1, {in->s[0] * (in->ndim == 4 ? in->s[2] * in->s[3] : 1)}, CH_LAYOUT_PLAIN};
        *out = *in;
        CH_TRY(reserve(M, &m->y, out));
        CH_TRY(reserve(M, &m->dx, in));
        CH_TRY(reserve(M, &m->ln_mean, &pos));
        return reserve(M, &m->ln_rstd, &pos);
    }
    case CH_NN_MAXPOOL2D:
    case CH_NN_AVGPOOL2D: {
        const char *what = m->kind == CH_NN_MAXPOOL2D ? "MaxPool2d" : "AvgPool2d";
        CH_REQUIRE(in->ndim == 4, "nn: %s '%s' expects (N,C,H,W), got %s", what, m->path,
                   shp_str(in, b1, sizeof b1));
        int64_t ho = ch_pool_out_size(in->s[2], m->pool.kernel_h, m->pool.stride_h,
                                      m->pool.pad_h, m->pool.ceil_mode);
        int64_t wo = ch_pool_out_size(in->s[3], m->pool.kernel_w, m->pool.stride_w,
                                      m->pool.pad_w, m->pool.ceil_mode);
        CH_REQUIRE(ho > 0 && wo > 0, "nn: %s '%s': input %s too small", what, m->path,
                   shp_str(in, b1, sizeof b1));
        *out = (shp_t){4, {in->s[0], in->s[1], ho, wo}, in->layout};
        CH_TRY(reserve(M, &m->y, out));
        return reserve(M, &m->dx, in);
    }
    case CH_NN_ADAPTIVE_AVGPOOL2D:
        CH_REQUIRE(in->ndim == 4, "nn: AdaptiveAvgPool2d '%s' expects (N,C,H,W), got %s", m->path,
                   shp_str(in, b1, sizeof b1));
        if (m->out_h > 0) { /* (h, w) bins; (1, 1) keeps the global path below */
            *out = (shp_t){4, {in->s[0], in->s[1], m->out_h, m->out_w}, in->layout};
            CH_TRY(reserve(M, &m->y, out));
            return reserve(M, &m->dx, in);
        }
        *out = (shp_t){2, {in->s[0], in->s[1], 1, 1}, CH_LAYOUT_PLAIN};
        CH_TRY(reserve(M, &m->y, out));
        return reserve(M, &m->dx, in);
    case CH_NN_LINEAR: {
        int ok = (in->ndim == 2 && in->s[1] == m->in_c) ||
                 (in->ndim == 4 && in->s[1] == m->in_c && in->s[2] == 1 && in->s[3] == 1);
        CH_REQUIRE(ok, "nn: Linear '%s' expects (N, %d) or (N, %d, 1, 1), got %s", m->path, m->in_c,
                   m->in_c, shp_str(in, b1, sizeof b1));
        *out = (shp_t){2, {in->s[0], m->out_c, 1, 1}, CH_LAYOUT_PLAIN};
        CH_TRY(reserve(M, &m->y, out));
        return reserve(M, &m->dx, in);
    }
    case CH_NN_IDENTITY:
        *out = *in;
        return CH_OK;
    case CH_NN_FLATTEN:
    case CH_NN_DROPOUT: {
        /* a non-plain input is reordered to plain (m->y) on the way in and
         * the gradient back into the input's layout (m->dx) */
        const int reorder = in->layout != CH_LAYOUT_PLAIN;
        *out = *in;
        out->layout = CH_LAYOUT_PLAIN;
        if (m->kind == CH_NN_DROPOUT || reorder) CH_TRY(reserve(M, &m->y, out));
        if (reorder) CH_TRY(reserve(M, &m->dx, in));
        if (m->kind == CH_NN_FLATTEN && in->ndim == 4)
            *out = (shp_t){2, {in->s[0], in->s[1] * in->s[2] * in->s[3], 1, 1}, CH_LAYOUT_PLAIN};
        return CH_OK;
    }
    default:
        return CH_ERROR(CH_ERR_INTERNAL, "nn: unknown module kind %d", (int)m->kind);
    }
}

/* ------------------------------------------------------------ graphs */

/* Producers whose output is a fresh tensor that their own backward does not
 * read: a ReLU may then run in place on it (nn.h, in-place rule). */
static int fresh_output(ch_nn_kind_t k)
{
    if (ch_nn_is_activation(k)) return 1;
    switch (k) {
    case CH_NN_CONV2D: case CH_NN_BATCHNORM2D: case CH_NN_SYNC_BATCHNORM: case CH_NN_LAYERNORM2D:
    case CH_NN_MAXPOOL2D: case CH_NN_AVGPOOL2D: case CH_NN_ADAPTIVE_AVGPOOL2D: case CH_NN_LINEAR:
    case CH_NN_ADD: case CH_NN_MUL: case CH_NN_CAT: case CH_NN_NARROW: case CH_NN_CHANNEL_SHUFFLE:
    case CH_NN_AFFINE: case CH_NN_SQUEEZE_EXCITATION: case CH_NN_CONCAT:
        return 1;
    default:
        return 0;
    }
}

/* Nodes whose backward only reads dy (and returns a gradient of their own):
 * two values may then share one gradient tensor (Add's two operands). */
static int dy_readonly(ch_nn_kind_t k)
{
    if (ch_nn_is_activation(k)) return 1;
    switch (k) {
    case CH_NN_CONV2D: case CH_NN_BATCHNORM2D: case CH_NN_SYNC_BATCHNORM: case CH_NN_LAYERNORM2D:
    case CH_NN_MAXPOOL2D: case CH_NN_AVGPOOL2D: case CH_NN_ADAPTIVE_AVGPOOL2D: case CH_NN_LINEAR:
    case CH_NN_MUL: case CH_NN_CAT: case CH_NN_NARROW: case CH_NN_CHANNEL_SHUFFLE:
    case CH_NN_SQUEEZE_EXCITATION: case CH_NN_CONCAT:
        return 1;
    default:
        return 0;
    }
}

/* The in-place rule for the first layer of a container node: a leading
 * ReLU (after pass-through layers) runs in place only when `ok`. */
static void first_relu_rule(ch_module_t *m, int ok)
{
    if (m->kind == CH_NN_RELU) {
        m->relu_copy = !ok;
        return;
    }
    if (m->kind != CH_NN_SEQUENTIAL) return;
    for (int i = 0; i < m->nchild; i++) {
        ch_module_t *c = m->child[i];
        if (c->kind == CH_NN_RELU || c->kind == CH_NN_SEQUENTIAL) {
            first_relu_rule(c, ok);
            return;
        }
        if (c->kind != CH_NN_IDENTITY && c->kind != CH_NN_FLATTEN && c->kind != CH_NN_DROPOUT)
            return;
    }
}

static int same_shp(const shp_t *a, const shp_t *b)
{
    if (a->ndim != b->ndim) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->s[d] != b->s[d]) return 0;
    return 1;
}

/* b broadcast to a: (N|1, C, 1, 1) or (N|1, C) for a (N, C, H, W). */
static int bcast_of(const shp_t *b, const shp_t *a)
{
    return a->ndim == 4 && b->s[1] == a->s[1] && (b->s[0] == a->s[0] || b->s[0] == 1) &&
           (b->ndim == 2 || (b->ndim == 4 && b->s[2] == 1 && b->s[3] == 1));
}

/* Plan a multi-input node (Add, Mul, Cat) of graph g for input shapes
 * vs[m->g_in[i]]. */
static ch_status plan_multi(ch_model_t *M, ch_compute_t *cx, ch_module_t *g, ch_module_t *m,
                            const shp_t *vs, const unsigned char *writable, shp_t *out)
{
    char b1[96], b2[96];
    const shp_t *a = &vs[m->g_in[0]];
    if (m->kind == CH_NN_CAT) {
        int64_t c = 0;
        for (int i = 0; i < m->g_nin; i++) {
            const shp_t *x = &vs[m->g_in[i]];
            if (x->ndim != 4 || a->ndim != 4 || x->s[0] != a->s[0] || x->s[2] != a->s[2] ||
                x->s[3] != a->s[3])
                return CH_ERROR(CH_ERR_INVALID, "nn: graph '%s': Cat '%s': input %d (value %d) "
                                "is %s, input 0 (value %d) %s: expected (N, C_i, H, W) with one "
                                "N, H, W", g->path, m->local, i, m->g_in[i],
                                shp_str(x, b1, sizeof b1), m->g_in[0], shp_str(a, b2, sizeof b2));
            CH_TRY(reserve(M, &m->g_dx[i], x));
            m->g_dxp[i] = &m->g_dx[i];
            c += x->s[1];
        }
        *out = (shp_t){4, {a->s[0], c, a->s[2], a->s[3]},
                       ch_compute_preferred_layout(cx, M->dev, c)};
        return reserve(M, &m->y, out);
    }
    const shp_t *b = &vs[m->g_in[1]];
    const char *what = m->kind == CH_NN_ADD ? "Add" : "Mul";
    m->g_bcast = m->g_swap = m->g_reorder = 0;
    if (same_shp(a, b) && (a->ndim == 4 || (a->ndim == 2 && m->kind == CH_NN_ADD))) {
        m->g_reorder = a->layout != b->layout;
    } else if (bcast_of(b, a)) {
        m->g_bcast = 1;
    } else if (bcast_of(a, b)) {
        m->g_bcast = m->g_swap = 1;
    } else {
        return CH_ERROR(CH_ERR_INVALID, "nn: graph '%s': %s '%s': operands %s (value %d) and %s "
                        "(value %d) do not match: expected one shape or one of them (N or 1, C, "
                        "1, 1) broadcast", g->path, what, m->local, shp_str(a, b1, sizeof b1),
                        m->g_in[0], shp_str(b, b2, sizeof b2), m->g_in[1]);
    }
    const int bi = m->g_swap ? 0 : 1, ai = 1 - bi;
    const shp_t *big = &vs[m->g_in[ai]], *small = &vs[m->g_in[bi]];
    *out = *big;
    /* Add over its full operand when nothing else reads that value (the
     * in-place rule, as the tree's residual add) */
    m->g_inplace = m->kind == CH_NN_ADD && writable[m->g_in[ai]] && m->g_in[0] != m->g_in[1];
    if (!m->g_inplace) CH_TRY(reserve(M, &m->y, out));
    if (m->kind == CH_NN_MUL) {
        CH_TRY(reserve(M, &m->g_dx[ai], big));
        CH_TRY(reserve(M, &m->g_dx[bi], small));
        m->g_dxp[ai] = &m->g_dx[ai];
        m->g_dxp[bi] = &m->g_dx[bi];
    } else if (m->g_bcast || m->g_reorder) {
        CH_TRY(reserve(M, &m->g_dx[bi], small));
        if (m->g_reorder) {
            shp_t t = *small;
            t.layout = big->layout;
            CH_TRY(reserve(M, &m->g_tmp, &t));
        }
    }
    return CH_OK;
}

static ch_status plan_graph(ch_model_t *M, ch_compute_t *cx, ch_module_t *g, const shp_t *in,
                            shp_t *out)
{
    const int n = g->nchild, nv = n + 1;
    free(g->g_val);
    free(g->g_grad);
    free(g->g_acc);
    free(g->g_nacc);
    free(g->g_live);
    free(g->g_need);
    free(g->g_have);
    free(g->g_useacc);
    g->g_val = calloc((size_t)nv, sizeof *g->g_val);
    g->g_grad = calloc((size_t)nv, sizeof *g->g_grad);
    g->g_acc = calloc((size_t)nv, sizeof *g->g_acc);
    g->g_nacc = calloc((size_t)nv, sizeof *g->g_nacc);
    g->g_live = calloc((size_t)nv, 1);
    g->g_need = calloc((size_t)nv, 1);
    g->g_have = calloc((size_t)nv, 1);
    g->g_useacc = calloc((size_t)nv, 1);
    shp_t *vs = calloc((size_t)nv, sizeof *vs);
    int *ncons = calloc((size_t)nv, sizeof *ncons);
    unsigned char *writable = calloc((size_t)nv, 1);
    ch_status s = CH_OK;
    if (!g->g_val || !g->g_grad || !g->g_acc || !g->g_nacc || !g->g_live || !g->g_need ||
        !g->g_have || !g->g_useacc || !vs || !ncons || !writable) {
        s = CH_ERROR(CH_ERR_NOMEM, "nn: out of memory planning graph '%s'", g->path);
        goto done;
    }
    /* consumers (all) and live nodes (those leading to the output) */
    for (int k = 1; k <= n; k++)
        for (int i = 0; i < g->child[k - 1]->g_nin; i++) ncons[g->child[k - 1]->g_in[i]]++;
    g->g_live[g->g_out] = 1;
    for (int k = n; k >= 1; k--) {
        const ch_module_t *m = g->child[k - 1];
        if (!g->g_live[k]) continue;
        for (int i = 0; i < m->g_nin; i++) {
            g->g_live[m->g_in[i]] = 1;
            g->g_nacc[m->g_in[i]]++; /* gradient contributions */
        }
    }
    /* the in-place rule: values only their one consumer reads, from
     * producers writing fresh tensors their backward does not read */
    for (int v = 1; v <= n; v++)
        writable[v] = ncons[v] == 1 && fresh_output(g->child[v - 1]->kind);
    vs[0] = *in;
    for (int k = 1; k <= n && s == CH_OK; k++) {
        ch_module_t *m = g->child[k - 1];
        const int v = m->g_in[0];
        first_relu_rule(m, writable[v]);
        /* AdaptiveAvgPool2d(1) keeps (N, C, 1, 1) in a graph, as torch's
         * (Linear and Flatten take it; 1x1 convolutions need it) */
        if (m->kind == CH_NN_ADAPTIVE_AVGPOOL2D && m->out_h == 0) m->out_h = m->out_w = 1;
        if (m->kind == CH_NN_ADD || m->kind == CH_NN_MUL || m->kind == CH_NN_CAT)
            s = plan_multi(M, cx, g, m, vs, writable, &vs[k]);
        else
            s = plan_module(M, cx, m, &vs[v], &vs[k]);
    }
    if (s != CH_OK) goto done;
    for (int v = 0; v <= n; v++) g->g_useacc[v] = g->g_nacc[v] > 1;
    /* Add of one shape hands dy to both operands: each must then only read
     * it, or take its own gradient tensor */
    for (int k = 1; k <= n; k++) {
        const ch_module_t *m = g->child[k - 1];
        if (m->kind != CH_NN_ADD || !g->g_live[k] || m->g_bcast) continue;
        for (int i = 0; i < 2; i++) {
            const int v = m->g_in[i];
            if (m->g_reorder && i == 1) continue; /* its own reordered copy */
            if (v == 0 || !dy_readonly(g->child[v - 1]->kind)) g->g_useacc[v] = 1;
        }
    }
    for (int v = 0; v <= n && s == CH_OK; v++)
        if (g->g_useacc[v]) s = reserve(M, &g->g_acc[v], &vs[v]);
    *out = vs[g->g_out];
done:
    free(vs);
    free(ncons);
    free(writable);
    return s;
}

size_t ch_model_arena_bytes(const ch_model_t *M) { return M->arena ? ch_arena_bytes(M->arena) : 0; }

ch_status ch_model_plan(ch_model_t *M, ch_compute_t *cx, const int64_t shape[4], ch_layout_t layout,
                        size_t *arena_bytes)
{
    CH_REQUIRE(M && M->finalized && cx && shape, "ch_model_plan: NULL argument or model not finalized");
    for (int d = 0; d < 4; d++)
        CH_REQUIRE(shape[d] >= 0, "nn: input dimension %d is %lld", d, (long long)shape[d]);
    if (M->planned && M->plan_layout == layout && !memcmp(M->plan_shape, shape, sizeof M->plan_shape)) {
        if (arena_bytes) *arena_bytes = ch_arena_bytes(M->arena);
        return CH_OK;
    }
    if (M->dev != CH_DEV_CPU && !ch_compute_stream(cx, M->dev))
        return CH_ERROR(CH_ERR_UNSUPPORTED, "nn: '%s' is on GPU %d but the compute context has no "
                        "GPU backend state (build without CUDA, or GPU set-up failed)", M->arch,
                        M->dev_index);
    if (!M->arena) CH_TRY(ch_arena_create(M->dev, M->dev_index, &M->arena));
    ch_arena_reset(M->arena);
    M->planned = 0;
    M->have_forward = M->have_loss = M->have_loss_value = 0;
    shp_t in = {4, {shape[0], shape[1], shape[2], shape[3]}, layout}, out;
    ch_status s = plan_module(M, cx, M->root, &in, &out);
    if (s == CH_OK && out.ndim != 2) {
        char b[96];
        s = CH_ERROR(CH_ERR_INVALID, "nn: model '%s' ends in %s, expected logits (N, classes)", M->arch,
                     shp_str(&out, b, sizeof b));
    }
    if (s == CH_OK) s = reserve(M, &M->dlogits, &out);
    if (s == CH_OK) {
        int64_t one = 1;
        s = ch_tensor_init(&M->loss, CH_F32, 1, &one, CH_LAYOUT_PLAIN, M->dev, M->dev_index);
        if (s == CH_OK) s = ch_arena_reserve_tensor(M->arena, &M->loss);
    }
    if (s == CH_OK) s = ch_arena_commit(M->arena);
    if (s != CH_OK) {
        ch_arena_reset(M->arena);
        return ch_error_context("planning '%s' for input [%lld, %lld, %lld, %lld]", M->arch,
                                (long long)shape[0], (long long)shape[1], (long long)shape[2],
                                (long long)shape[3]);
    }
    memcpy(M->plan_shape, shape, sizeof M->plan_shape);
    M->plan_layout = layout;
    M->planned = 1;
    if (arena_bytes) *arena_bytes = ch_arena_bytes(M->arena);
    return CH_OK;
}

/* ------------------------------------------------------------ SyncBN */

ch_status ch_nn_sync_storage(ch_model_t *M, ch_module_t *m)
{
    const int64_t R = M->sync.world_size, C = m->channels, row = 2 * C + 1;
    int64_t rc[2] = {R, C};
    free(m->gather);
    free(m->g_counts);
    m->gather = NULL;
    ch_tensor_free(&m->g_dev);
    m->g_counts = calloc((size_t)R, sizeof(int64_t));
    if (!m->g_counts) return CH_ERROR(CH_ERR_NOMEM, "SyncBN: out of memory for '%s'", m->path);
    if (M->dev != CH_DEV_CPU) {
        /* [means R*C | vars R*C] on the device; rank r's row of each is
         * written by batchnorm_stats and all-gathered in place */
        int64_t n2 = 2 * R * C;
        CH_TRY(ch_tensor_alloc(&m->g_dev, CH_F32, 1, &n2, CH_LAYOUT_PLAIN, M->dev, M->dev_index));
        float *g = m->g_dev.data;
        CH_TRY(ch_tensor_wrap(&m->g_means, g, CH_F32, 2, rc, CH_LAYOUT_PLAIN, M->dev, M->dev_index));
        CH_TRY(ch_tensor_wrap(&m->g_vars, g + R * C, CH_F32, 2, rc, CH_LAYOUT_PLAIN, M->dev,
                              M->dev_index));
        return CH_OK;
    }
    /* [packed means R*C | vars R*C | counts R] [received R*row] [send row] */
    m->gather = calloc((size_t)(2 * R * row + row), sizeof(float));
    if (!m->gather) return CH_ERROR(CH_ERR_NOMEM, "SyncBN: out of memory for '%s'", m->path);
    CH_TRY(ch_tensor_wrap(&m->g_means, m->gather, CH_F32, 2, rc, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    CH_TRY(ch_tensor_wrap(&m->g_vars, m->gather + R * C, CH_F32, 2, rc, CH_LAYOUT_PLAIN,
                          CH_DEV_CPU, 0));
    return CH_OK;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

double ch_model_sync_bn_seconds(const ch_model_t *M)
{
    return M ? M->sync_seconds : 0.0;
}

ch_status ch_model_set_sync_count_gather(ch_model_t *M, ch_nn_count_gather_fn fn, void *ctx)
{
    CH_REQUIRE(M, "ch_model_set_sync_count_gather: model is NULL");
    M->count_gather = fn;
    M->count_gather_ctx = ctx;
    return CH_OK;
}

/* SyncBN forward after the per-rank statistics have been gathered into
 * g_means / g_vars / g_counts (R ranks): global mean and biased var,
 * running statistics with the global count, and y = normalize(x). */
static ch_status sync_bn_combine(ch_compute_t *cx, ch_module_t *m, const ch_tensor_t *x, int64_t R,
                                 int64_t count)
{
    int64_t total = 0;
    CH_TRY(ch_op_batchnorm_gather_stats(cx, &m->g_means, &m->g_vars, m->g_counts, (int)R, &m->mean,
                                        &m->var, &total));
    CH_TRY(ch_op_batchnorm_update_running(cx, &m->rmean, &m->rvar, &m->mean, &m->var, total,
                                          NN_BN_MOMENTUM_OF(m)));
    (*m->nbt)++;
    m->count_total = total;
    if (count > 0)
        CH_TRY(ch_op_batchnorm_apply(cx, x, &m->mean, &m->var, &m->w, &m->b, NN_BN_EPS_OF(m), &m->y));
    return CH_OK;
}

/* SyncBN training forward on a GPU model: statistics stay on the device
 * (this rank's rows of g_means / g_vars, all-gathered in place by the
 * process group, whose collectives are ordered against the compute stream);
 * only the per-rank counts travel on the host. */
static ch_status syncbn_forward_train_dev(ch_model_t *M, ch_compute_t *cx, ch_module_t *m,
                                          const ch_tensor_t *x)
{
    const ch_nn_sync_t *g = &M->sync;
    const int64_t R = g->world_size, C = m->channels;
    const int64_t count = x->shape[0] * x->shape[2] * x->shape[3];
    float *gm = m->g_dev.data, *gv = gm + R * C;
    ch_tensor_t mean_r, var_r;
    CH_TRY(ch_tensor_wrap(&mean_r, gm + g->rank * C, CH_F32, 1, &C, CH_LAYOUT_PLAIN, M->dev,
                          M->dev_index));
    CH_TRY(ch_tensor_wrap(&var_r, gv + g->rank * C, CH_F32, 1, &C, CH_LAYOUT_PLAIN, M->dev,
                          M->dev_index));
    if (!g->allgather) CH_TRY(ch_op_zero(cx, &m->g_dev));
    if (count > 0) {
        CH_TRY(ch_op_batchnorm_stats(cx, x, &mean_r, &var_r));
    } else {
        CH_TRY(ch_op_zero(cx, &mean_r));
        CH_TRY(ch_op_zero(cx, &var_r));
    }
    double t0 = now_s();
    if (g->allgather) {
        ch_status s = g->allgather(g->ctx, gm + g->rank * C, gm, (size_t)C);
        if (s == CH_OK) s = g->allgather(g->ctx, gv + g->rank * C, gv, (size_t)C);
        if (s) return ch_error_context("SyncBN '%s': all-gather of statistics", m->path);
    } else {
        ch_status s = g->allreduce_sum(g->ctx, gm, (size_t)(2 * R * C));
        if (s) return ch_error_context("SyncBN '%s': all-reduce of statistics", m->path);
    }
    if (R == 1) {
        m->g_counts[0] = count;
    } else {
        if (!M->count_gather)
            return CH_ERROR(CH_ERR_INVALID, "SyncBN '%s' on GPU %d needs a host gather of the "
                            "per-rank counts (ch_model_set_sync_count_gather)", m->path,
                            M->dev_index);
        ch_status s = M->count_gather(M->count_gather_ctx, count, m->g_counts);
        if (s) return ch_error_context("SyncBN '%s': all-gather of counts", m->path);
    }
    M->sync_seconds += now_s() - t0;
    return sync_bn_combine(cx, m, x, R, count);
}

ch_status ch_model_convert_sync_bn(ch_model_t *M, const ch_nn_sync_t *sync, int *n_converted)
{
    CH_REQUIRE(M && M->finalized && sync, "ch_model_convert_sync_bn: NULL argument or model not finalized");
    CH_REQUIRE(sync->allreduce_sum, "SyncBN: the process group has no allreduce_sum");
    CH_REQUIRE(sync->world_size >= 1 && sync->rank >= 0 && sync->rank < sync->world_size,
               "SyncBN: rank %d outside world of size %d", sync->rank, sync->world_size);
    CH_REQUIRE(!(sync->iallreduce_sum || sync->iallgather) == !sync->wait,
               "SyncBN: the process group needs wait exactly when it has iallreduce_sum or "
               "iallgather");
    CH_REQUIRE(!sync->iallgather || sync->allgather,
               "SyncBN: the process group has iallgather but no allgather");
    M->sync = *sync;
    M->has_sync = 1;
    int n = 0;
    for (int i = 0; i < M->nentries; i++) {
        ch_module_t *m = M->entries[i]->module;
        if (strcmp(M->entries[i]->local, "weight") ||
            (m->kind != CH_NN_BATCHNORM2D && m->kind != CH_NN_SYNC_BATCHNORM))
            continue;
        CH_TRY(ch_nn_sync_storage(M, m));
        m->kind = CH_NN_SYNC_BATCHNORM;
        n++;
    }
    if (n_converted) *n_converted = n;
    return CH_OK;
}

static ch_status syncbn_forward_train(ch_model_t *M, ch_compute_t *cx, ch_module_t *m,
                                      const ch_tensor_t *x)
{
    if (M->dev != CH_DEV_CPU) return syncbn_forward_train_dev(M, cx, m, x);
    const ch_nn_sync_t *g = &M->sync;
    const int64_t R = g->world_size, C = m->channels, row = 2 * C + 1;
    const int64_t count = x->shape[0] * x->shape[2] * x->shape[3];
    float *mean = ch_tensor_f32(&m->mean), *var = ch_tensor_f32(&m->var);
    if (count > 0) {
        CH_TRY(ch_op_batchnorm_stats(cx, x, &m->mean, &m->var));
    } else {
        memset(mean, 0, (size_t)C * sizeof(float));
        memset(var, 0, (size_t)C * sizeof(float));
    }
    float *packed = m->gather, *recv = m->gather + R * row, *send = recv + R * row;
    double t0 = now_s();
    if (g->allgather) {
        memcpy(send, mean, (size_t)C * sizeof(float));
        memcpy(send + C, var, (size_t)C * sizeof(float));
        send[2 * C] = (float)count;
        ch_status s;
        if (g->iallgather) {
            void *req = NULL;
            s = g->iallgather(g->ctx, send, recv, (size_t)row, &req);
            if (!s) s = g->wait(g->ctx, &req);
        } else {
            s = g->allgather(g->ctx, send, recv, (size_t)row);
        }
        if (s) return ch_error_context("SyncBN '%s': all-gather of statistics", m->path);
        M->sync_seconds += now_s() - t0;
        for (int64_t r = 0; r < R; r++) {
            memcpy(packed + r * C, recv + r * row, (size_t)C * sizeof(float));
            memcpy(packed + R * C + r * C, recv + r * row + C, (size_t)C * sizeof(float));
            packed[2 * R * C + r] = recv[r * row + 2 * C];
        }
    } else {
        memset(packed, 0, (size_t)(R * row) * sizeof(float));
        memcpy(packed + g->rank * C, mean, (size_t)C * sizeof(float));
        memcpy(packed + R * C + g->rank * C, var, (size_t)C * sizeof(float));
        packed[2 * R * C + g->rank] = (float)count;
        ch_status s;
        if (g->iallreduce_sum) {
            void *req = NULL;
            s = g->iallreduce_sum(g->ctx, packed, (size_t)(R * row), &req);
            if (!s) s = g->wait(g->ctx, &req);
        } else {
            s = g->allreduce_sum(g->ctx, packed, (size_t)(R * row));
        }
        if (s) return ch_error_context("SyncBN '%s': all-reduce of statistics", m->path);
        M->sync_seconds += now_s() - t0;
    }
    for (int64_t r = 0; r < R; r++) m->g_counts[r] = (int64_t)packed[2 * R * C + r];
    return sync_bn_combine(cx, m, x, R, count);
}

/* ------------------------------------------------------------ forward */

static ch_status fwd(ch_model_t *M, ch_compute_t *cx, ch_module_t *m, const ch_tensor_t *x,
                     const ch_tensor_t **y)
{
    m->in = x;
    m->forward_training = M->training;
    if (ch_nn_is_activation(m->kind)) {
        CH_TRY(ch_op_act_forward(cx, &m->act, x, &m->y));
        *y = m->out = &m->y;
        return CH_OK;
    }
    switch (m->kind) {
    case CH_NN_SEQUENTIAL: {
        const ch_tensor_t *cur = x;
        for (int i = 0; i < m->nchild; i++) CH_TRY(fwd(M, cx, m->child[i], cur, &cur));
        *y = cur;
        break;
    }
    case CH_NN_RESIDUAL: {
        const ch_tensor_t *cur = x, *sc = x;
        for (int i = 0; i < m->nmain; i++) {
            CH_TRY(fwd(M, cx, m->main[i], cur, &cur));
            m->step_out[i] = cur;
        }
        if (m->shortcut) CH_TRY(fwd(M, cx, m->shortcut, x, &sc));
        /* cur is the last main module's own output: add and ReLU in place */
        ch_tensor_t *acc = (ch_tensor_t *)cur;
        CH_TRY(ch_op_add(cx, acc, sc, acc));
        CH_TRY(ch_op_relu_forward(cx, acc, acc));
        m->final_relu->out = acc;
        *y = acc;
        break;
    }
    case CH_NN_SQUEEZE_EXCITATION: {
        const ch_tensor_t *gate = x;
        for (int i = 0; i < m->nchild; i++) CH_TRY(fwd(M, cx, m->child[i], gate, &gate));
        CH_TRY(ch_op_mul_channel(cx, x, gate, &m->y));
        *y = &m->y;
        break;
    }
    case CH_NN_CONCAT:
        for (int i = 0; i < m->nchild; i++) CH_TRY(fwd(M, cx, m->child[i], x, &m->part_out[i]));
        CH_TRY(ch_op_concat_channels(cx, m->part_out, m->nchild, &m->y));
        *y = &m->y;
        break;
    case CH_NN_CONV2D:
        CH_TRY(ch_op_conv2d_forward(cx, x, &m->w, m->has_bias ? &m->b : NULL, &m->conv, &m->y));
        *y = &m->y;
        break;
    case CH_NN_BATCHNORM2D:
        if (M->training) {
            const int64_t count = x->shape[0] * x->shape[2] * x->shape[3];
            CH_TRY(ch_op_batchnorm_forward_train(cx, x, &m->w, &m->b, NN_BN_EPS_OF(m), &m->y, &m->mean,
                                                 &m->var));
            CH_TRY(ch_op_batchnorm_update_running(cx, &m->rmean, &m->rvar, &m->mean, &m->var, count,
                                                  NN_BN_MOMENTUM_OF(m)));
            (*m->nbt)++;
            m->count_total = count;
        } else {
            CH_TRY(ch_op_batchnorm_forward_eval(cx, x, &m->w, &m->b, &m->rmean, &m->rvar, NN_BN_EPS_OF(m),
                                                &m->y));
        }
        *y = &m->y;
        break;
    case CH_NN_SYNC_BATCHNORM:
        if (M->training) {
            CH_TRY(syncbn_forward_train(M, cx, m, x));
        } else {
            CH_TRY(ch_op_batchnorm_forward_eval(cx, x, &m->w, &m->b, &m->rmean, &m->rvar, NN_BN_EPS_OF(m),
                                                &m->y));
        }
        *y = &m->y;
        break;
    case CH_NN_RELU: {
        if (m->relu_copy) { /* a graph's in-place rule said no */
            CH_TRY(ch_op_relu_forward(cx, x, &m->y));
            *y = &m->y;
            break;
        }
        ch_tensor_t *t = (ch_tensor_t *)x; /* in place (ReLU(inplace=True)) */
        CH_TRY(ch_op_relu_forward(cx, t, t));
        *y = t;
        break;
    }
    case CH_NN_GRAPH: {
        const ch_tensor_t **val = m->g_val;
        val[0] = x;
        for (int k = 1; k <= m->nchild; k++) {
            ch_module_t *c = m->child[k - 1];
            for (int i = 0; i < c->g_nin; i++) c->g_x[i] = val[c->g_in[i]];
            CH_TRY(fwd(M, cx, c, c->g_x[0], &val[k]));
        }
        *y = val[m->g_out];
        break;
    }
    case CH_NN_ADD:
    case CH_NN_MUL: {
        const int bi = m->g_swap ? 0 : 1, ai = 1 - bi;
        const ch_tensor_t *a = m->g_x[ai], *b = m->g_x[bi];
        /* in place over a when the in-place rule allows (plan_multi) */
        ch_tensor_t *out = m->g_inplace ? (ch_tensor_t *)a : &m->y;
        if (m->kind == CH_NN_MUL || m->g_bcast) {
            CH_TRY(ch_op_binary(cx, m->kind == CH_NN_ADD ? CH_BINARY_ADD : CH_BINARY_MUL, a, b,
                                out));
        } else {
            if (m->g_reorder) {
                CH_TRY(ch_op_reorder(cx, b, &m->g_tmp));
                b = &m->g_tmp;
            }
            CH_TRY(ch_op_add(cx, a, b, out));
        }
        *y = out;
        break;
    }
    case CH_NN_CAT:
        CH_TRY(ch_op_concat_channels(cx, m->g_x, m->g_nin, &m->y));
        *y = &m->y;
        break;
    case CH_NN_NARROW:
        CH_TRY(ch_op_copy_channels(cx, x, m->narrow_start, &m->y, 0, m->narrow_len));
        *y = &m->y;
        break;
    case CH_NN_CHANNEL_SHUFFLE:
        CH_TRY(ch_op_channel_shuffle(cx, x, m->groups, &m->y));
        *y = &m->y;
        break;
    case CH_NN_AFFINE:
        CH_TRY(ch_op_affine(cx, x, m->alpha, m->beta, &m->y));
        *y = &m->y;
        break;
    case CH_NN_LAYERNORM2D:
        if (x->ndim == 2) { /* (N, C) as (N, C, 1, 1): plain views of x and y */
            int64_t s4[4] = {x->shape[0], x->shape[1], 1, 1};
            CH_TRY(ch_tensor_view(&m->xview, x, 4, s4));
            CH_TRY(ch_tensor_view(&m->flat, &m->y, 4, s4));
            CH_TRY(ch_op_layernorm2d_forward(cx, &m->xview, &m->w, &m->b, m->ln_eps, &m->flat,
                                             &m->ln_mean, &m->ln_rstd));
        } else {
            CH_TRY(ch_op_layernorm2d_forward(cx, x, &m->w, &m->b, m->ln_eps, &m->y, &m->ln_mean,
                                             &m->ln_rstd));
        }
        *y = &m->y;
        break;
    case CH_NN_MAXPOOL2D:
        CH_TRY(ch_op_maxpool2d_forward(cx, x, &m->pool, &m->y));
        *y = &m->y;
        break;
    case CH_NN_ADAPTIVE_AVGPOOL2D:
        if (m->out_h > 0) CH_TRY(ch_op_adaptive_avgpool2d_forward(cx, x, &m->y));
        else CH_TRY(ch_op_avgpool_global_forward(cx, x, &m->y));
        *y = &m->y;
        break;
    case CH_NN_AVGPOOL2D:
        CH_TRY(ch_op_avgpool2d_forward(cx, x, &m->pool, &m->y));
        *y = &m->y;
        break;
    case CH_NN_LINEAR: {
        const ch_tensor_t *xin = x;
        if (x->ndim == 4) {
            int64_t s2[2] = {x->shape[0], x->shape[1]};
            CH_TRY(ch_tensor_view(&m->xview, x, 2, s2));
            xin = &m->xview;
        }
        m->in = xin;
        CH_TRY(ch_op_linear_forward(cx, xin, &m->w, m->has_bias ? &m->b : NULL, &m->y));
        *y = &m->y;
        break;
    }
    case CH_NN_IDENTITY:
        *y = x;
        break;
    case CH_NN_FLATTEN: {
        const ch_tensor_t *src = x;
        if (x->layout != CH_LAYOUT_PLAIN) {
            CH_TRY(ch_op_reorder(cx, x, &m->y));
            src = &m->y;
        }
        if (x->ndim == 4) {
            int64_t s2[2] = {x->shape[0], x->shape[1] * x->shape[2] * x->shape[3]};
            CH_TRY(ch_tensor_view(&m->flat, src, 2, s2));
            src = &m->flat;
        }
        *y = src;
        break;
    }
    case CH_NN_DROPOUT: {
        const ch_tensor_t *src = x;
        if (x->layout != CH_LAYOUT_PLAIN) {
            CH_TRY(ch_op_reorder(cx, x, &m->y));
            src = &m->y;
        }
        if (M->training) {
            ch_dropout_key_t k = M->drop_key;
            k.stream = m->drop_stream;
            CH_TRY(ch_op_dropout(cx, src, m->drop_p, &k, &m->y));
            src = &m->y;
        }
        *y = src;
        break;
    }
    default:
        return CH_ERROR(CH_ERR_INTERNAL, "nn: unknown module kind %d", (int)m->kind);
    }
    m->out = *y;
    return CH_OK;
}

ch_status ch_model_forward(ch_model_t *M, ch_compute_t *cx, const ch_tensor_t *x,
                           const ch_tensor_t **logits)
{
    CH_REQUIRE(M && cx && x && logits, "ch_model_forward: NULL argument");
    CH_REQUIRE(x->ndim == 4 && x->dtype == CH_F32 && (x->data || ch_tensor_numel(x) == 0),
               "nn: model input must be a float32 (N,C,H,W) tensor with storage");
    if (x->dev != M->dev || (M->dev != CH_DEV_CPU && x->dev_index != M->dev_index)) {
        char b[128];
        return CH_ERROR(CH_ERR_INVALID, "nn: input %s of '%s' is not on the model's device (%s %d)",
                        ch_tensor_describe(x, b, sizeof b), M->arch,
                        M->dev == CH_DEV_CPU ? "cpu" : "cuda", M->dev_index);
    }
    CH_TRY(ch_model_plan(M, cx, x->shape, x->layout, NULL));
    M->have_forward = M->have_loss = M->have_loss_value = 0;
    const ch_tensor_t *y = NULL;
    ch_status s = fwd(M, cx, M->root, x, &y);
    if (s) return ch_error_context("forward of '%s'", M->arch);
    M->logits = y;
    M->have_forward = 1;
    *logits = y;
    return CH_OK;
}

ch_status ch_model_loss(ch_model_t *M, ch_compute_t *cx, const ch_tensor_t *labels, float *loss)
{
    CH_REQUIRE(M && cx && labels, "ch_model_loss: NULL argument");
    CH_REQUIRE(M->have_forward, "nn: ch_model_loss without a forward");
    ch_status s = ch_op_cross_entropy_smooth(cx, M->logits, labels, M->label_smoothing, &M->loss,
                                             &M->dlogits);
    if (s) return ch_error_context("loss of '%s'", M->arch);
    M->have_loss = 1;
    M->have_loss_value = 1;
    if (loss) return ch_model_loss_value(M, cx, loss);
    return CH_OK;
}

ch_status ch_model_set_label_smoothing(ch_model_t *M, double e)
{
    CH_REQUIRE(M, "ch_model_set_label_smoothing: NULL model");
    CH_REQUIRE(e >= 0.0 && e <= 1.0, "loss.label_smoothing = %g: expected a value in [0, 1]", e);
    M->label_smoothing = e;
    return CH_OK;
}

ch_status ch_model_loss_value(ch_model_t *M, ch_compute_t *cx, float *loss)
{
    CH_REQUIRE(M && cx && loss, "ch_model_loss_value: NULL argument");
    CH_REQUIRE(M->have_loss_value, "nn: ch_model_loss_value of '%s' without ch_model_loss since "
               "the last forward", M->arch);
    if (M->dev == CH_DEV_CPU) {
        *loss = ch_tensor_f32(&M->loss)[0];
        return CH_OK;
    }
    ch_status s = ch_device_memcpy(M->dev_index, &M->loss_host, M->loss.data, sizeof(float),
                                   CH_MEMCPY_DEVICE_TO_HOST);
    if (s) return ch_error_context("reading the loss of '%s' from GPU %d", M->arch, M->dev_index);
    /* the GPU's label check is deferred to here (ch_op_cross_entropy) */
    s = ch_compute_sync(cx);
    if (s) return ch_error_context("loss of '%s'", M->arch);
    *loss = M->loss_host;
    return CH_OK;
}

/* ------------------------------------------------------------ backward */

static int own_trainable(const ch_module_t *m)
{
    for (int i = 0; i < m->nent; i++)
        if (!m->ent[i].is_buffer && m->ent[i].requires_grad) return 1;
    return 0;
}

/* Forward-order walk: needs_dx = some module before this one trains. */
static int grad_flags(ch_module_t *m, int upstream)
{
    m->needs_dx = upstream;
    switch (m->kind) {
    case CH_NN_SEQUENTIAL: {
        int u = upstream, t = 0;
        for (int i = 0; i < m->nchild; i++) {
            u = grad_flags(m->child[i], u);
            t |= m->child[i]->trainable;
        }
        m->trainable = t;
        return u;
    }
    case CH_NN_RESIDUAL: {
        int u = upstream, t = 0;
        for (int i = 0; i < m->nmain; i++) {
            u = grad_flags(m->main[i], u);
            t |= m->main[i]->trainable;
        }
        int us = upstream;
        if (m->shortcut) {
            us = grad_flags(m->shortcut, upstream);
            t |= m->shortcut->trainable;
        }
        m->trainable = t;
        return u || us;
    }
    case CH_NN_SQUEEZE_EXCITATION: { /* the gate runs on x as a Sequential */
        int u = upstream, t = 0;
        for (int i = 0; i < m->nchild; i++) {
            u = grad_flags(m->child[i], u);
            t |= m->child[i]->trainable;
        }
        m->trainable = t;
        return upstream || t;
    }
    case CH_NN_GRAPH: { /* a node needs dx when one of its inputs does */
        int t = 0;
        m->g_need[0] = (unsigned char)upstream;
        for (int k = 1; k <= m->nchild; k++) {
            ch_module_t *c = m->child[k - 1];
            int u = 0;
            for (int i = 0; i < c->g_nin; i++) u |= m->g_need[c->g_in[i]];
            m->g_need[k] = (unsigned char)grad_flags(c, u);
            t |= c->trainable;
        }
        m->trainable = t;
        return m->g_need[m->g_out];
    }
    case CH_NN_CONCAT: { /* every branch runs on x */
        int u = upstream, t = 0;
        for (int i = 0; i < m->nchild; i++) {
            u |= grad_flags(m->child[i], upstream);
            t |= m->child[i]->trainable;
        }
        m->trainable = t;
        return u;
    }
    default:
        m->trainable = own_trainable(m);
        return upstream || m->trainable;
    }
}

static ch_status fire(ch_model_t *M, ch_module_t *m)
{
    if (!M->hook) return CH_OK;
    for (int i = m->nent - 1; i >= 0; i--) {
        ch_param_t *p = &m->ent[i];
        if (p->is_buffer || !p->requires_grad) continue;
        ch_status s = M->hook(M->hook_arg, p);
        if (s) return ch_error_context("gradient hook for '%s'", p->name);
    }
    return CH_OK;
}

static ch_param_t *entry_of(ch_module_t *m, const char *local)
{
    for (int i = 0; i < m->nent; i++)
        if (!strcmp(m->ent[i].local, local)) return &m->ent[i];
    return NULL;
}

/* Weight (and bias) gradient of convolution m for the gradient dy of its
 * output, then its gradient-ready hooks. */
static ch_status conv_weight_grad(ch_model_t *M, ch_compute_t *cx, ch_module_t *m,
                                  const ch_tensor_t *dy)
{
    CH_TRY(ch_op_conv2d_backward_weights(cx, m->in, dy, &m->conv, &m->dw,
                                         m->has_bias ? &m->db : NULL));
    return fire(M, m);
}

/* Run the deferred convolution weight gradient, if any. */
static ch_status flush_deferred(ch_model_t *M, ch_compute_t *cx)
{
    ch_module_t *c = M->deferred_conv;
    if (!c) return CH_OK;
    M->deferred_conv = NULL;
    return conv_weight_grad(M, cx, c, M->deferred_dy);
}

/* SyncBN backward overlaps its gradient-sum all-reduce with the weight
 * gradient of the convolution after it (nn_exec.h, iallreduce_sum): host
 * models whose process group can start an all-reduce without waiting. */
static int sync_overlaps(const ch_model_t *M)
{
    return M->has_sync && M->sync.iallreduce_sum && M->dev == CH_DEV_CPU;
}

/* The all-reduce of the SyncBN backward's (sum_dy, sum_dy_xmu) of module m,
 * with the deferred convolution weight gradient computed while it is in
 * flight when the process group allows. */
static ch_status sync_bn_reduce_sums(ch_model_t *M, ch_compute_t *cx, ch_module_t *m)
{
    const ch_nn_sync_t *g = &M->sync;
    float *sums = ch_tensor_f32(&m->sums);
    size_t n = (size_t)(2 * m->channels);
    double t0 = now_s();
    if (!sync_overlaps(M)) {
        ch_status s = g->allreduce_sum(g->ctx, sums, n);
        if (s) return ch_error_context("SyncBN '%s': all-reduce of gradient sums", m->path);
        M->sync_seconds += now_s() - t0;
        return CH_OK;
    }
    void *req = NULL;
    if (g->iallreduce_sum(g->ctx, sums, n, &req))
        return ch_error_context("SyncBN '%s': start of the all-reduce of gradient sums", m->path);
    double t1 = now_s();
    M->sync_seconds += t1 - t0;
    ch_status s = flush_deferred(M, cx);
    double t2 = now_s();
    /* complete the request even when the deferred work failed */
    ch_status w = g->wait(g->ctx, &req);
    M->sync_seconds += now_s() - t2;
    if (s) return s;
    if (w) return ch_error_context("SyncBN '%s': all-reduce of gradient sums", m->path);
    return CH_OK;
}

/* Graph g's gradient contribution d (from node c) to value v (nn.h): a
 * value with one contribution takes d itself; an accumulating value holds
 * the first d while it is not c's own tensor (pending, read only), adopts
 * c's own dx as its accumulator, or copies into its accumulation tensor. */
static int own_dx(const ch_module_t *c, const ch_tensor_t *d)
{
    if (d == &c->dx) return 1;
    for (int i = 0; i < c->g_nin; i++)
        if (d == &c->g_dx[i]) return 1;
    return 0;
}

static ch_status settle(ch_compute_t *cx, ch_module_t *g, int v)
{
    if (g->g_have[v] != 1) return CH_OK;
    ch_tensor_t *acc = &g->g_acc[v];
    const ch_tensor_t *p = g->g_grad[v];
    if (p->layout == acc->layout) CH_TRY(ch_op_copy(cx, p, acc));
    else CH_TRY(ch_op_reorder(cx, p, acc));
    g->g_grad[v] = acc;
    g->g_have[v] = 2;
    return CH_OK;
}

static ch_status contribute(ch_compute_t *cx, ch_module_t *g, const ch_module_t *c, int v,
                            ch_tensor_t *d)
{
    if (!d) return CH_OK;
    if (!g->g_useacc[v]) {
        g->g_grad[v] = d;
        return CH_OK;
    }
    if (d->layout != g->g_acc[v].layout)
        return CH_ERROR(CH_ERR_INTERNAL, "nn: graph '%s': gradient of value %d from '%s' is %s, "
                        "the value %s", g->path, v, c->local, ch_layout_name(d->layout),
                        ch_layout_name(g->g_acc[v].layout));
    switch (g->g_have[v]) {
    case 0:
        g->g_grad[v] = d;
        g->g_have[v] = own_dx(c, d) ? 2 : 1;
        return CH_OK;
    case 1:
        if (own_dx(c, d)) {
            CH_TRY(ch_op_add_inplace(cx, d, g->g_grad[v]));
            g->g_grad[v] = d;
            g->g_have[v] = 2;
            return CH_OK;
        }
        CH_TRY(settle(cx, g, v));
        return ch_op_add_inplace(cx, g->g_grad[v], d);
    default:
        return ch_op_add_inplace(cx, g->g_grad[v], d);
    }
}

static ch_status bwd(ch_model_t *M, ch_compute_t *cx, ch_module_t *m, ch_tensor_t *dy,
                     ch_tensor_t **dx)
{
    *dx = NULL;
    if (!m->trainable && !m->needs_dx) return CH_OK;
    if (ch_nn_is_activation(m->kind)) {
        CH_TRY(ch_op_act_backward(cx, &m->act, m->in, dy, &m->dx));
        *dx = &m->dx;
        return CH_OK;
    }
    ch_param_t *pw = entry_of(m, "weight"), *pb = entry_of(m, "bias");
    int tw = pw && pw->requires_grad, tb = pb && pb->requires_grad;
    switch (m->kind) {
    case CH_NN_SEQUENTIAL: {
        ch_tensor_t *d = dy;
        for (int i = m->nchild - 1; i >= 0 && d; i--) CH_TRY(bwd(M, cx, m->child[i], d, &d));
        *dx = d;
        return CH_OK;
    }
    case CH_NN_RESIDUAL: {
        /* dy -> d(sum) in place through the final ReLU */
        CH_TRY(ch_op_relu_backward(cx, m->final_relu->out, dy, dy));
        ch_tensor_t *ds = dy, *dm = dy;
        /* shortcut first: its parameters come last in parameter order */
        if (m->shortcut) CH_TRY(bwd(M, cx, m->shortcut, dy, &ds));
        for (int i = m->nmain - 1; i >= 0 && dm; i--) {
            ch_module_t *c = m->main[i];
            if (c->kind == CH_NN_RELU) {
                CH_TRY(ch_op_relu_backward(cx, m->step_out[i], dm, dm));
            } else {
                CH_TRY(bwd(M, cx, c, dm, &dm));
            }
        }
        if (m->needs_dx) {
            if (!dm || !ds)
                return CH_ERROR(CH_ERR_INTERNAL, "nn: residual block '%s' lost its input gradient", m->path);
            CH_TRY(ch_op_add_inplace(cx, dm, ds));
            *dx = dm;
        }
        return CH_OK;
    }
    case CH_NN_SQUEEZE_EXCITATION: {
        /* dx = dy * s + gate backward of ds = sum_hw(dy * x) */
        const ch_tensor_t *gate = m->child[m->nchild - 1]->out;
        CH_TRY(ch_op_mul_channel_backward(cx, m->in, gate, dy, m->needs_dx ? &m->dx : NULL,
                                          &m->se_ds));
        ch_tensor_t *d = &m->se_ds;
        for (int i = m->nchild - 1; i >= 0 && d; i--) CH_TRY(bwd(M, cx, m->child[i], d, &d));
        if (m->needs_dx) {
            if (!d)
                return CH_ERROR(CH_ERR_INTERNAL, "nn: SqueezeExcitation '%s' lost its gate's "
                                "input gradient", m->path);
            CH_TRY(ch_op_add_inplace(cx, &m->dx, d));
            *dx = &m->dx;
        }
        return CH_OK;
    }
    case CH_NN_CONCAT: {
        CH_TRY(ch_op_split_channels(cx, dy, m->part_dyp, m->nchild));
        int have = 0;
        /* last branch first: its parameters come last in parameter order */
        for (int i = m->nchild - 1; i >= 0; i--) {
            ch_tensor_t *d = NULL;
            CH_TRY(bwd(M, cx, m->child[i], &m->part_dy[i], &d));
            if (!m->needs_dx) continue;
            if (!d)
                return CH_ERROR(CH_ERR_INTERNAL, "nn: Concat '%s': branch '%s' lost its input "
                                "gradient", m->path, m->child[i]->local);
            if (have) CH_TRY(ch_op_add_inplace(cx, &m->dx, d));
            else CH_TRY(ch_op_reorder(cx, d, &m->dx));
            have = 1;
        }
        if (m->needs_dx) *dx = &m->dx;
        return CH_OK;
    }
    case CH_NN_CONV2D:
        if ((tw || tb) && m->needs_dx && dy == M->last_sync_dx && sync_overlaps(M)) {
            /* dy is the dx of the SyncBN just done, which nothing writes
             * until the next backward; m->in is a forward activation, read
             * only in backward: the weight gradient can wait for the next
             * SyncBN's all-reduce (sync_bn_reduce_sums) or the end */
            CH_TRY(flush_deferred(M, cx));
            CH_TRY(ch_op_conv2d_backward_data(cx, dy, &m->w, &m->conv, &m->dx));
            M->deferred_conv = m;
            M->deferred_dy = dy;
            *dx = &m->dx;
            return CH_OK;
        }
        if ((tw || tb) && m->needs_dx) {
            /* both at once: a backend may share work (bf16: dy converted
             * once); the hooks fire after both */
            CH_TRY(ch_op_conv2d_backward(cx, m->in, dy, &m->w, &m->conv, &m->dx, &m->dw,
                                         m->has_bias ? &m->db : NULL));
            CH_TRY(fire(M, m));
            *dx = &m->dx;
            return CH_OK;
        }
        if (tw || tb) CH_TRY(conv_weight_grad(M, cx, m, dy));
        if (m->needs_dx) {
            CH_TRY(ch_op_conv2d_backward_data(cx, dy, &m->w, &m->conv, &m->dx));
            *dx = &m->dx;
        }
        return CH_OK;
    case CH_NN_BATCHNORM2D:
        CH_TRY(ch_op_batchnorm_backward(cx, m->in, dy, &m->mean, &m->var, NN_BN_EPS_OF(m), &m->w,
                                        m->needs_dx ? &m->dx : NULL, tw ? &m->dw : NULL,
                                        tb ? &m->db : NULL));
        CH_TRY(fire(M, m));
        if (m->needs_dx) *dx = &m->dx;
        return CH_OK;
    case CH_NN_SYNC_BATCHNORM: {
        const int64_t count = m->in->shape[0] * m->in->shape[2] * m->in->shape[3];
        if (count > 0) {
            CH_TRY(ch_op_batchnorm_backward_reduce(cx, m->in, dy, &m->mean, &m->sum_dy, &m->sum_dy_xmu));
        } else if (M->dev != CH_DEV_CPU) {
            CH_TRY(ch_op_zero(cx, &m->sums));
        } else {
            memset(m->sums.data, 0, m->sums.nbytes);
        }
        /* weight/bias gradients from the LOCAL sums (torch SyncBatchNorm) */
        if (tw || tb) {
            CH_TRY(ch_op_batchnorm_param_grads(cx, &m->sum_dy, &m->sum_dy_xmu, &m->var, NN_BN_EPS_OF(m),
                                               tw ? &m->dw : NULL, tb ? &m->db : NULL));
            CH_TRY(fire(M, m));
        }
        if (m->needs_dx) {
            CH_TRY(sync_bn_reduce_sums(M, cx, m));
            M->last_sync_dx = &m->dx;
            if (count > 0)
                CH_TRY(ch_op_batchnorm_backward_elemt(cx, m->in, dy, &m->mean, &m->var, NN_BN_EPS_OF(m),
                                                      &m->w, &m->sum_dy, &m->sum_dy_xmu,
                                                      m->count_total, &m->dx));
            *dx = &m->dx;
        }
        return CH_OK;
    }
    case CH_NN_RELU: /* in place on dy (its own gradient) either way */
        CH_TRY(ch_op_relu_backward(cx, m->out, dy, dy));
        *dx = dy;
        return CH_OK;
    case CH_NN_GRAPH: {
        const int n = m->nchild;
        memset(m->g_grad, 0, (size_t)(n + 1) * sizeof *m->g_grad);
        memset(m->g_have, 0, (size_t)(n + 1));
        m->g_grad[m->g_out] = dy;
        if (m->g_useacc[m->g_out]) m->g_have[m->g_out] = 2; /* the caller's: ours to change */
        for (int k = n; k >= 1; k--) {
            ch_module_t *c = m->child[k - 1];
            if (!m->g_live[k] || !m->g_grad[k]) continue;
            /* the value's gradient is final: make it writable for c */
            CH_TRY(settle(cx, m, k));
            for (int i = 0; i < c->g_nin; i++) c->g_dxp[i] = NULL;
            ch_tensor_t *d = NULL;
            ch_status st = bwd(M, cx, c, m->g_grad[k], &d);
            if (st) return ch_error_context("graph '%s', node '%s' (value %d)", m->path, c->local, k);
            if (c->kind == CH_NN_ADD || c->kind == CH_NN_MUL || c->kind == CH_NN_CAT) {
                for (int i = 0; i < c->g_nin; i++)
                    CH_TRY(contribute(cx, m, c, c->g_in[i], c->g_dxp[i]));
            } else {
                CH_TRY(contribute(cx, m, c, c->g_in[0], d));
            }
        }
        if (m->needs_dx) {
            CH_TRY(settle(cx, m, 0));
            *dx = m->g_grad[0];
        }
        return CH_OK;
    }
    case CH_NN_ADD:
    case CH_NN_MUL: {
        if (!m->needs_dx) return CH_OK;
        const int bi = m->g_swap ? 0 : 1, ai = 1 - bi;
        const ch_tensor_t *a = m->g_x[ai], *b = m->g_x[bi];
        if (m->kind == CH_NN_MUL) {
            CH_TRY(ch_op_binary_backward(cx, CH_BINARY_MUL, a, b, dy, &m->g_dx[ai], &m->g_dx[bi]));
            m->g_dxp[ai] = &m->g_dx[ai];
            m->g_dxp[bi] = &m->g_dx[bi];
        } else {
            m->g_dxp[ai] = dy; /* d(a + b)/da = 1 */
            if (m->g_bcast) {
                CH_TRY(ch_op_binary_backward(cx, CH_BINARY_ADD, a, b, dy, NULL, &m->g_dx[bi]));
                m->g_dxp[bi] = &m->g_dx[bi];
            } else if (m->g_reorder) {
                CH_TRY(ch_op_reorder(cx, dy, &m->g_dx[bi]));
                m->g_dxp[bi] = &m->g_dx[bi];
            } else {
                m->g_dxp[bi] = dy;
            }
        }
        *dx = m->g_dxp[0];
        return CH_OK;
    }
    case CH_NN_CAT:
        if (!m->needs_dx) return CH_OK;
        for (int i = 0; i < m->g_nin; i++) m->g_dxp[i] = &m->g_dx[i];
        CH_TRY(ch_op_split_channels(cx, dy, m->g_dxp, m->g_nin));
        *dx = m->g_dxp[0];
        return CH_OK;
    case CH_NN_NARROW:
        if (!m->needs_dx) return CH_OK;
        CH_TRY(ch_op_zero(cx, &m->dx));
        CH_TRY(ch_op_copy_channels(cx, dy, 0, &m->dx, m->narrow_start, m->narrow_len));
        *dx = &m->dx;
        return CH_OK;
    case CH_NN_CHANNEL_SHUFFLE:
        if (!m->needs_dx) return CH_OK;
        CH_TRY(ch_op_channel_shuffle(cx, dy, (int)(dy->shape[1] / m->groups), &m->dx));
        *dx = &m->dx;
        return CH_OK;
    case CH_NN_AFFINE:
        if (!m->needs_dx) return CH_OK;
        CH_TRY(ch_op_scale(cx, dy, m->alpha));
        *dx = dy;
        return CH_OK;
    case CH_NN_LAYERNORM2D:
        if (m->in->ndim == 2) { /* the forward's (N, C, 1, 1) views; dy and dx viewed alike */
            int64_t s4[4] = {m->in->shape[0], m->in->shape[1], 1, 1};
            CH_TRY(ch_tensor_view(&m->xview, m->in, 4, s4));
            CH_TRY(ch_tensor_view(&m->dyview, dy, 4, s4));
            if (m->needs_dx) CH_TRY(ch_tensor_view(&m->flat, &m->dx, 4, s4));
            CH_TRY(ch_op_layernorm2d_backward(cx, &m->xview, &m->dyview, &m->ln_mean, &m->ln_rstd,
                                              &m->w, m->needs_dx ? &m->flat : NULL,
                                              tw ? &m->dw : NULL, tb ? &m->db : NULL));
        } else {
            CH_TRY(ch_op_layernorm2d_backward(cx, m->in, dy, &m->ln_mean, &m->ln_rstd, &m->w,
                                              m->needs_dx ? &m->dx : NULL, tw ? &m->dw : NULL,
                                              tb ? &m->db : NULL));
        }
        CH_TRY(fire(M, m));
        if (m->needs_dx) *dx = &m->dx;
        return CH_OK;
    case CH_NN_MAXPOOL2D:
        CH_TRY(ch_op_maxpool2d_backward(cx, m->in, dy, &m->pool, &m->dx));
        *dx = &m->dx;
        return CH_OK;
    case CH_NN_ADAPTIVE_AVGPOOL2D:
        if (m->out_h > 0) CH_TRY(ch_op_adaptive_avgpool2d_backward(cx, dy, &m->dx));
        else CH_TRY(ch_op_avgpool_global_backward(cx, dy, &m->dx));
        *dx = &m->dx;
        return CH_OK;
    case CH_NN_AVGPOOL2D:
        CH_TRY(ch_op_avgpool2d_backward(cx, dy, &m->pool, &m->dx));
        *dx = &m->dx;
        return CH_OK;
    case CH_NN_LINEAR:
        if (tw || tb) {
            CH_TRY(ch_op_linear_backward_weights(cx, m->in, dy, &m->dw, m->has_bias ? &m->db : NULL));
            CH_TRY(fire(M, m));
        }
        if (m->needs_dx) {
            ch_tensor_t *d = &m->dx;
            if (m->dx.ndim == 4) {
                int64_t s2[2] = {m->dx.shape[0], m->dx.shape[1]};
                CH_TRY(ch_tensor_view(&m->xview, &m->dx, 2, s2));
                d = &m->xview;
            }
            CH_TRY(ch_op_linear_backward_data(cx, dy, &m->w, d));
            *dx = &m->dx;
        }
        return CH_OK;
    case CH_NN_IDENTITY:
        *dx = dy;
        return CH_OK;
    case CH_NN_FLATTEN:
    case CH_NN_DROPOUT: {
        if (!m->needs_dx) return CH_OK;
        ch_tensor_t *d = dy;
        if (m->kind == CH_NN_DROPOUT) {
            /* the forward's mask, in place on dy (the key is the forward's) */
            ch_dropout_key_t k = M->drop_key;
            k.stream = m->drop_stream;
            CH_TRY(ch_op_dropout(cx, dy, m->drop_p, &k, dy));
        } else if (m->in->ndim == 4) {
            CH_TRY(ch_tensor_view(&m->dyview, dy, 4, m->in->shape));
            d = &m->dyview;
        }
        if (m->in->layout != CH_LAYOUT_PLAIN) {
            CH_TRY(ch_op_reorder(cx, d, &m->dx));
            d = &m->dx;
        }
        *dx = d;
        return CH_OK;
    }
    default:
        return CH_ERROR(CH_ERR_INTERNAL, "nn: unknown module kind %d", (int)m->kind);
    }
}

ch_status ch_model_backward(ch_model_t *M, ch_compute_t *cx, const ch_tensor_t *dlogits)
{
    CH_REQUIRE(M && cx, "ch_model_backward: NULL argument");
    CH_REQUIRE(M->have_forward, "nn: backward of '%s' without a forward", M->arch);
    CH_REQUIRE(M->root->forward_training,
               "nn: backward of '%s' needs a forward in training mode (ch_model_train(model, 1))",
               M->arch);
    if (dlogits) {
        CH_TRY(ch_tensor_check_shape(dlogits, "dlogits", CH_F32, 2, M->dlogits.shape));
        CH_REQUIRE(dlogits->layout == CH_LAYOUT_PLAIN && dlogits->dev == M->dev &&
                       (M->dev == CH_DEV_CPU || dlogits->dev_index == M->dev_index) &&
                       (dlogits->data || !M->dlogits.nbytes),
                   "nn: dlogits must be a plain tensor on the model's device");
        if (M->dev != CH_DEV_CPU) {
            if (M->dlogits.nbytes) CH_TRY(ch_op_copy(cx, dlogits, &M->dlogits));
        } else if (M->dlogits.nbytes) {
            memcpy(M->dlogits.data, dlogits->data, M->dlogits.nbytes);
        }
    } else {
        CH_REQUIRE(M->have_loss, "nn: backward of '%s' without dlogits needs ch_model_loss first",
                   M->arch);
    }
    grad_flags(M->root, 0);
    ch_tensor_t *dx = NULL;
    M->deferred_conv = NULL;
    M->last_sync_dx = NULL;
    ch_status s = bwd(M, cx, M->root, &M->dlogits, &dx);
    if (s == CH_OK) s = flush_deferred(M, cx);
    M->deferred_conv = NULL;
    M->last_sync_dx = NULL;
    if (s) return ch_error_context("backward of '%s'", M->arch);
    /* a second backward needs a new loss: dlogits was consumed */
    M->have_loss = 0;
    return CH_OK;
}

void ch_model_set_grad_hook(ch_model_t *M, ch_nn_grad_hook_fn fn, void *arg)
{
    M->hook = fn;
    M->hook_arg = arg;
}

static ch_module_t *find_module(ch_module_t *m, const char *path)
{
    if (m->path && !strcmp(m->path, path)) return m;
    for (int i = 0; i < m->nchild; i++) {
        ch_module_t *r = find_module(m->child[i], path);
        if (r) return r;
    }
    return NULL;
}

const ch_tensor_t *ch_model_activation(ch_model_t *M, const char *path)
{
    if (!M || !path || !M->have_forward) return NULL;
    ch_module_t *m = find_module(M->root, path);
    return m ? m->out : NULL;
}
