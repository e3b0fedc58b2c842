/* cohort: CPU ops through oneDNN primitives — layout reorders and 2-D
 * convolution (forward, backward data, backward weights) — and linear layers
 * through oneDNN's sgemm.
 *
 * Primitives are created once per (op, shapes, layouts, parameters) and
 * cached (cpu.h). Activations are used in the layout their tensors carry;
 * the weights are plain OIHW for the caller and reordered into the format
 * the primitive chose (weights format "any") on every call — gradients are
 * reordered back to OIHW. Scratchpads are user-managed: one shared buffer.
 */
#include "config.h"

#include "framework/ops/cpu/cpu.h"

#include <stdlib.h>
#include <string.h>

#define MEM_NONE DNNL_MEMORY_NONE

static void *handle(const ch_tensor_t *t) { return (void *)t->data; }

static ch_status mem_create(ch_cpu_t *c, const dnnl_memory_desc_t *md, void *h,
                            dnnl_memory_t *m)
{
    CH_CHECK_DNNL(dnnl_memory_create(m, md, c->engine, h));
    return CH_OK;
}

static ch_status set_handle(dnnl_memory_t m, void *h)
{
    CH_CHECK_DNNL(dnnl_memory_set_data_handle(m, h));
    return CH_OK;
}

static ch_status exec(ch_cpu_t *c, dnnl_primitive_t p, int n, const dnnl_exec_arg_t *args)
{
    ch_cpu_threads(c);
    CH_CHECK_DNNL(dnnl_primitive_execute(p, c->stream, n, args));
    return CH_OK;
}

/* Scratchpad of pd (user mode): a memory object over the shared buffer. */
static ch_status setup_scratch(ch_cpu_t *c, const_dnnl_primitive_desc_t pd, cpu_prim *e)
{
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t sz = smd ? dnnl_memory_desc_get_size(smd) : 0;
    if (sz == 0) return CH_OK;
    CH_TRY(ch_cpu_scratch_reserve(c, sz));
    return mem_create(c, smd, MEM_NONE, &e->scratch_mem);
}

/* Kernel taps that can touch valid input (all others only ever see zero
 * padding, contribute nothing to y or dx, and get a zero weight gradient).
 * Along one axis with input extent n, output extent no, kernel k, stride s,
 * padding p: taps k0..k1 with k0 = max(0, p - (no-1)*s), k1 = min(k-1, n-1+p).
 * The cropped convolution has kernel k1-k0+1 and padding left p-k0, right
 * p-(k-1-k1), and the same output size; it is exactly the same computation.
 * This matters for ResNets on small images: layer4 of resnet18 on 28x28
 * inputs runs 3x3 convolutions on 1x1 maps, where only the centre tap acts. */
typedef struct {
    int64_t k0[2], kk[2];   /* first tap and cropped extent, (h, w) */
    int64_t pl[2], pr[2];   /* cropped padding */
    int cropped;
} conv_crop;

static conv_crop crop_of(const int64_t *in_hw, const int64_t *out_hw, const int64_t *wshape,
                         const ch_conv2d_params_t *p)
{
    conv_crop c;
    int64_t s[2] = {p->stride_h, p->stride_w}, pad[2] = {p->pad_h, p->pad_w};
    c.cropped = 0;
    for (int d = 0; d < 2; d++) {
        int64_t k = wshape[2 + d], n = in_hw[d], no = out_hw[d];
        int64_t k0 = pad[d] - (no - 1) * s[d];
        int64_t k1 = n - 1 + pad[d];
        if (k0 < 0) k0 = 0;
        if (k1 > k - 1) k1 = k - 1;
        if (k1 < k0) { /* cannot happen for a valid shape; keep the full kernel */
            k0 = 0;
            k1 = k - 1;
        }
        c.k0[d] = k0;
        c.kk[d] = k1 - k0 + 1;
        c.pl[d] = pad[d] - k0;
        c.pr[d] = pad[d] - (k - 1 - k1);
        if (c.kk[d] != k) c.cropped = 1;
    }
    return c;
}

/* Weights: the primitive wants prim_md; the caller holds plain OIHW (of
 * which the primitive may use only the cropped taps). When they differ,
 * allocate a buffer in the primitive's format and a reorder (user ->
 * primitive when to_user == 0, primitive -> user otherwise). */
static ch_status setup_weights(ch_cpu_t *c, cpu_prim *e, const dnnl_memory_desc_t *prim_md,
                               const int64_t *wshape, const conv_crop *cr, int to_user)
{
    /* user side: the full plain OIHW weights, or (cropped) a compact plain
     * buffer of the kept taps that conv.c gathers / scatters itself (oneDNN's
     * reorders from a strided sub-memory are slow) */
    dnnl_memory_desc_t user;
    dnnl_dims_t wd = {wshape[0], wshape[1], cr->kk[0], cr->kk[1]};
    CH_CHECK_DNNL(dnnl_memory_desc_init_by_tag(&user, 4, wd, dnnl_f32, dnnl_oihw));
    if (!cr->cropped && dnnl_memory_desc_equal(prim_md, &user))
        return mem_create(c, prim_md, MEM_NONE, &e->wprim_mem);
    if (cr->cropped) {
        e->cropped = 1;
        for (int i = 0; i < 4; i++) e->wfull[i] = wshape[i];
        for (int d = 0; d < 2; d++) {
            e->k0[d] = cr->k0[d];
            e->kk[d] = cr->kk[d];
        }
        size_t n = (size_t)(wshape[0] * wshape[1] * cr->kk[0] * cr->kk[1]);
        e->cbuf = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
        if (!e->cbuf) return CH_ERROR(CH_ERR_NOMEM, "conv: cropped weights of %zu floats", n);
    }
    e->wbytes = dnnl_memory_desc_get_size(prim_md);
    e->wbuf = aligned_alloc(64, (e->wbytes + 63) / 64 * 64);
    if (!e->wbuf) return CH_ERROR(CH_ERR_NOMEM, "conv: weights buffer of %zu bytes", e->wbytes);
    CH_TRY(mem_create(c, prim_md, e->wbuf, &e->wprim_mem));
    CH_TRY(mem_create(c, &user, e->cbuf ? (void *)e->cbuf : MEM_NONE, &e->wuser_mem));
    dnnl_primitive_desc_t rpd;
    if (to_user)
        CH_CHECK_DNNL(dnnl_reorder_primitive_desc_create(&rpd, prim_md, c->engine, &user,
                                                         c->engine, NULL));
    else
        CH_CHECK_DNNL(dnnl_reorder_primitive_desc_create(&rpd, &user, c->engine, prim_md,
                                                         c->engine, NULL));
    dnnl_status_t st = dnnl_primitive_create(&e->wreorder, rpd);
    dnnl_primitive_desc_destroy(rpd);
    CH_CHECK_DNNL(st);
    return CH_OK;
}

/* Copy the kept taps between full OIHW weights and the compact buffer. */
static void crop_copy(const cpu_prim *e, float *full, int to_full)
{
    int64_t OC = e->wfull[0] * e->wfull[1], KH = e->wfull[2], KW = e->wfull[3];
    int64_t kh = e->kk[0], kw = e->kk[1], h0 = e->k0[0], w0 = e->k0[1];
    float *cb = e->cbuf;
    for (int64_t oc = 0; oc < OC; oc++)
        for (int64_t h = 0; h < kh; h++)
            for (int64_t w = 0; w < kw; w++) {
                float *f = full + (oc * KH + h + h0) * KW + w + w0;
                float *q = cb + (oc * kh + h) * kw + w;
                if (to_full) *f = *q;
                else *q = *f;
            }
}

/* Run the weights reorder between user pointer w (full plain OIHW) and the
 * primitive buffer; cropped primitives go through the compact buffer. */
static ch_status run_wreorder(ch_cpu_t *c, cpu_prim *e, void *user_ptr, int to_user)
{
    if (e->cropped && !to_user) crop_copy(e, user_ptr, 0);
    if (!e->cropped) CH_TRY(set_handle(e->wuser_mem, user_ptr));
    dnnl_exec_arg_t a[2] = {
        {DNNL_ARG_FROM, to_user ? e->wprim_mem : e->wuser_mem},
        {DNNL_ARG_TO, to_user ? e->wuser_mem : e->wprim_mem},
    };
    CH_TRY(exec(c, e->wreorder, 2, a));
    if (e->cropped && to_user) {
        int64_t n = e->wfull[0] * e->wfull[1] * e->wfull[2] * e->wfull[3];
        memset(user_ptr, 0, (size_t)n * sizeof(float)); /* taps never touching the input */
        crop_copy(e, user_ptr, 1);
    }
    return CH_OK;
}

/* ------------------------------------------------------------- reorder */

ch_status ch_cpu_reorder(void *st, const ch_tensor_t *src, ch_tensor_t *dst)
{
    ch_cpu_t *c = st;
    if (src->layout == dst->layout || src->dtype != CH_F32) {
        if (src->layout != dst->layout)
            return CH_ERROR(CH_ERR_INVALID, "ch_op_reorder: layouts of %s tensors are fixed",
                            ch_dtype_name(src->dtype));
        if (dst->data != src->data && src->nbytes) memcpy(dst->data, src->data, src->nbytes);
        return CH_OK;
    }
    if (ch_tensor_numel(src) == 0) return CH_OK;
    int64_t key[CPU_KEY_LEN] = {0};
    key[0] = CPU_OP_REORDER;
    key[1] = src->ndim;
    for (int i = 0; i < src->ndim; i++) key[2 + i] = src->shape[i];
    key[6] = src->layout;
    key[7] = dst->layout;
    cpu_prim *e = ch_cpu_cache_find(c, key);
    if (!e) {
        e = calloc(1, sizeof *e);
        if (!e) return CH_ERROR(CH_ERR_NOMEM, "reorder: out of memory");
        memcpy(e->key, key, sizeof key);
        dnnl_memory_desc_t smd, dmd;
        ch_cpu_md_of(&smd, src);
        ch_cpu_md_of(&dmd, dst);
        dnnl_primitive_desc_t pd = NULL;
        ch_status s = CH_OK;
        dnnl_status_t ds = dnnl_reorder_primitive_desc_create(&pd, &smd, c->engine, &dmd,
                                                              c->engine, NULL);
        if (ds == dnnl_success) ds = dnnl_primitive_create(&e->prim, pd);
        if (pd) dnnl_primitive_desc_destroy(pd);
        if (ds != dnnl_success)
            s = CH_ERROR(CH_ERR_DNNL, "reorder %s -> %s: %s", ch_layout_name(src->layout),
                         ch_layout_name(dst->layout), ch_dnnl_status_string((int)ds));
        if (s == CH_OK) s = mem_create(c, &smd, MEM_NONE, &e->mem[0]);
        if (s == CH_OK) s = mem_create(c, &dmd, MEM_NONE, &e->mem[1]);
        if (s != CH_OK) {
            ch_cpu_prim_free(e);
            return s;
        }
        CH_TRY(ch_cpu_cache_add(c, e));
    }
    CH_TRY(set_handle(e->mem[0], handle(src)));
    CH_TRY(set_handle(e->mem[1], dst->data));
    dnnl_exec_arg_t a[2] = {{DNNL_ARG_FROM, e->mem[0]}, {DNNL_ARG_TO, e->mem[1]}};
    return exec(c, e->prim, 2, a);
}

/* --------------------------------------------------------- convolution */

static void conv_key(int64_t *k, int op, const ch_tensor_t *x, const int64_t *wshape,
                     int has_b, const ch_tensor_t *y, const ch_conv2d_params_t *p)
{
    memset(k, 0, CPU_KEY_LEN * sizeof *k);
    k[0] = op;
    for (int i = 0; i < 4; i++) {
        k[1 + i] = x->shape[i];
        k[6 + i] = wshape[i];
        k[11 + i] = y->shape[i];
    }
    k[5] = x->layout;
    k[10] = has_b;
    k[15] = y->layout;
    k[16] = p->stride_h;
    k[17] = p->stride_w;
    k[18] = p->pad_h;
    k[19] = p->pad_w;
}

/* Convolution descriptors: src = x, dst = y (activations in their layouts),
 * weights "any" with the cropped kernel, bias x. */
static ch_status conv_mds(const ch_tensor_t *x, const int64_t *wshape, const conv_crop *cr,
                          const ch_tensor_t *y, dnnl_memory_desc_t *src,
                          dnnl_memory_desc_t *wts, dnnl_memory_desc_t *bia,
                          dnnl_memory_desc_t *dst)
{
    ch_cpu_md_of(src, x);
    ch_cpu_md_of(dst, y);
    dnnl_dims_t wd = {wshape[0], wshape[1], cr->kk[0], cr->kk[1]};
    CH_CHECK_DNNL(dnnl_memory_desc_init_by_tag(wts, 4, wd, dnnl_f32, dnnl_format_tag_any));
    dnnl_dims_t bd = {wshape[0]};
    CH_CHECK_DNNL(dnnl_memory_desc_init_by_tag(bia, 1, bd, dnnl_f32, dnnl_x));
    return CH_OK;
}

static ch_status conv_fwd_pd(ch_cpu_t *c, const ch_tensor_t *x, const int64_t *wshape,
                             const conv_crop *cr, int has_b, const ch_tensor_t *y,
                             const ch_conv2d_params_t *p, const_dnnl_primitive_attr_t attr,
                             dnnl_primitive_desc_t *pd)
{
    dnnl_memory_desc_t src, wts, bia, dst;
    CH_TRY(conv_mds(x, wshape, cr, y, &src, &wts, &bia, &dst));
    dnnl_dims_t strides = {p->stride_h, p->stride_w};
    dnnl_dims_t pl = {cr->pl[0], cr->pl[1]}, pr = {cr->pr[0], cr->pr[1]};
    dnnl_convolution_desc_t cd;
    CH_CHECK_DNNL(dnnl_convolution_forward_desc_init(&cd, dnnl_forward_training,
                                                     dnnl_convolution_direct, &src, &wts,
                                                     has_b ? &bia : NULL, &dst, strides, pl,
                                                     pr));
    CH_CHECK_DNNL(dnnl_primitive_desc_create(pd, &cd, attr, c->engine, NULL));
    return CH_OK;
}

/* Create (or fetch) the primitive for one of the three convolution ops.
 * For CONV_FWD: a = x, b = y. BWD_DATA: a = dx, b = dy. BWD_WEIGHTS: a = x,
 * b = dy. */
static ch_status conv_prim(ch_cpu_t *c, int op, const ch_tensor_t *a, const int64_t *wshape,
                           int has_b, const ch_tensor_t *b, const ch_conv2d_params_t *p,
                           cpu_prim **out)
{
    int64_t key[CPU_KEY_LEN];
    conv_key(key, op, a, wshape, has_b, b, p);
    cpu_prim *e = ch_cpu_cache_find(c, key);
    if (e) {
        *out = e;
        return CH_OK;
    }
    e = calloc(1, sizeof *e);
    if (!e) return CH_ERROR(CH_ERR_NOMEM, "conv: out of memory");
    memcpy(e->key, key, sizeof key);
    dnnl_primitive_desc_t pd = NULL, hint = NULL;
    ch_status s = CH_OK;
    dnnl_memory_desc_t src, wts, bia, dst;
    int64_t in_hw[2] = {a->shape[2], a->shape[3]}, out_hw[2] = {b->shape[2], b->shape[3]};
    conv_crop cr = crop_of(in_hw, out_hw, wshape, p);
    dnnl_dims_t strides = {p->stride_h, p->stride_w};
    dnnl_dims_t pl = {cr.pl[0], cr.pl[1]}, pr = {cr.pr[0], cr.pr[1]};
    dnnl_convolution_desc_t cd;
    dnnl_status_t ds = dnnl_success;
    if (op == CPU_OP_CONV_FWD) {
        s = conv_fwd_pd(c, a, wshape, &cr, has_b, b, p, c->attr, &pd);
    } else {
        s = conv_fwd_pd(c, a, wshape, &cr, has_b, b, p, NULL, &hint);
        if (s == CH_OK) s = conv_mds(a, wshape, &cr, b, &src, &wts, &bia, &dst);
        if (s == CH_OK) {
            if (op == CPU_OP_CONV_BWD_DATA)
                ds = dnnl_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct,
                                                              &src, &wts, &dst, strides, pl,
                                                              pr);
            else
                ds = dnnl_convolution_backward_weights_desc_init(
                    &cd, dnnl_convolution_direct, &src, &wts, has_b ? &bia : NULL, &dst,
                    strides, pl, pr);
            if (ds == dnnl_success)
                ds = dnnl_primitive_desc_create(&pd, &cd, c->attr, c->engine, hint);
            if (ds != dnnl_success)
                s = CH_ERROR(CH_ERR_DNNL, "convolution backward primitive: %s",
                             ch_dnnl_status_string((int)ds));
        }
    }
    if (s == CH_OK) {
        dnnl_query_t wq = op == CPU_OP_CONV_BWD_WEIGHTS ? dnnl_query_diff_weights_md
                                                        : dnnl_query_weights_md;
        const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, wq, 0);
        s = setup_weights(c, e, wmd, wshape, &cr, op == CPU_OP_CONV_BWD_WEIGHTS);
    }
    if (s == CH_OK) s = setup_scratch(c, pd, e);
    if (s == CH_OK) {
        /* mem[0] = a-side activation, mem[1] = b-side activation, mem[2] = bias */
        dnnl_memory_desc_t amd, bmd, bias_md;
        ch_cpu_md_of(&amd, a);
        ch_cpu_md_of(&bmd, b);
        dnnl_dims_t bd = {wshape[0]};
        dnnl_memory_desc_init_by_tag(&bias_md, 1, bd, dnnl_f32, dnnl_x);
        s = mem_create(c, &amd, MEM_NONE, &e->mem[0]);
        if (s == CH_OK) s = mem_create(c, &bmd, MEM_NONE, &e->mem[1]);
        if (s == CH_OK && has_b) s = mem_create(c, &bias_md, MEM_NONE, &e->mem[2]);
    }
    if (s == CH_OK) {
        ds = dnnl_primitive_create(&e->prim, pd);
        if (ds != dnnl_success)
            s = CH_ERROR(CH_ERR_DNNL, "convolution primitive: %s", ch_dnnl_status_string((int)ds));
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (hint) dnnl_primitive_desc_destroy(hint);
    if (s != CH_OK) {
        ch_cpu_prim_free(e);
        return ch_error_context("conv2d %s %lldx%lldx%lldx%lld, weight %lldx%lldx%lldx%lld",
                                op == CPU_OP_CONV_FWD ? "forward"
                                : op == CPU_OP_CONV_BWD_DATA ? "backward data"
                                                             : "backward weights",
                                (long long)a->shape[0], (long long)a->shape[1],
                                (long long)a->shape[2], (long long)a->shape[3],
                                (long long)wshape[0], (long long)wshape[1],
                                (long long)wshape[2], (long long)wshape[3]);
    }
    CH_TRY(ch_cpu_cache_add(c, e));
    *out = e;
    return CH_OK;
}

/* Fill in the scratchpad argument (if any); returns the new arg count. */
static ch_status add_scratch(ch_cpu_t *c, cpu_prim *e, dnnl_exec_arg_t *args, int *n)
{
    if (!e->scratch_mem) return CH_OK;
    CH_TRY(set_handle(e->scratch_mem, c->scratch));
    args[(*n)++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, e->scratch_mem};
    return CH_OK;
}

ch_status ch_cpu_conv2d_forward(void *st, const ch_tensor_t *x, const ch_tensor_t *w,
                                const ch_tensor_t *b, const ch_conv2d_params_t *p,
                                ch_tensor_t *y)
{
    ch_cpu_t *c = st;
    cpu_prim *e;
    CH_TRY(conv_prim(c, CPU_OP_CONV_FWD, x, w->shape, b != NULL, y, p, &e));
    if (e->wreorder) CH_TRY(run_wreorder(c, e, handle(w), 0));
    else CH_TRY(set_handle(e->wprim_mem, handle(w)));
    CH_TRY(set_handle(e->mem[0], handle(x)));
    CH_TRY(set_handle(e->mem[1], y->data));
    dnnl_exec_arg_t a[5];
    int n = 0;
    a[n++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, e->mem[0]};
    a[n++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, e->wprim_mem};
    a[n++] = (dnnl_exec_arg_t){DNNL_ARG_DST, e->mem[1]};
    if (b) {
        CH_TRY(set_handle(e->mem[2], handle(b)));
        a[n++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, e->mem[2]};
    }
    CH_TRY(add_scratch(c, e, a, &n));
    return exec(c, e->prim, n, a);
}

ch_status ch_cpu_conv2d_backward_data(void *st, const ch_tensor_t *dy, const ch_tensor_t *w,
                                      const ch_conv2d_params_t *p, ch_tensor_t *dx)
{
    ch_cpu_t *c = st;
    cpu_prim *e;
    CH_TRY(conv_prim(c, CPU_OP_CONV_BWD_DATA, dx, w->shape, 0, dy, p, &e));
    if (e->wreorder) CH_TRY(run_wreorder(c, e, handle(w), 0));
    else CH_TRY(set_handle(e->wprim_mem, handle(w)));
    CH_TRY(set_handle(e->mem[0], dx->data));
    CH_TRY(set_handle(e->mem[1], handle(dy)));
    dnnl_exec_arg_t a[4];
    int n = 0;
    a[n++] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_SRC, e->mem[0]};
    a[n++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, e->wprim_mem};
    a[n++] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_DST, e->mem[1]};
    CH_TRY(add_scratch(c, e, a, &n));
    return exec(c, e->prim, n, a);
}

ch_status ch_cpu_conv2d_backward_weights(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                         const ch_conv2d_params_t *p, ch_tensor_t *dw,
                                         ch_tensor_t *db)
{
    ch_cpu_t *c = st;
    cpu_prim *e;
    CH_TRY(conv_prim(c, CPU_OP_CONV_BWD_WEIGHTS, x, dw->shape, db != NULL, dy, p, &e));
    if (!e->wreorder) CH_TRY(set_handle(e->wprim_mem, dw->data));
    CH_TRY(set_handle(e->mem[0], handle(x)));
    CH_TRY(set_handle(e->mem[1], handle(dy)));
    dnnl_exec_arg_t a[5];
    int n = 0;
    a[n++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, e->mem[0]};
    a[n++] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_DST, e->mem[1]};
    a[n++] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_WEIGHTS, e->wprim_mem};
    if (db) {
        CH_TRY(set_handle(e->mem[2], db->data));
        a[n++] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_BIAS, e->mem[2]};
    }
    CH_TRY(add_scratch(c, e, a, &n));
    CH_TRY(exec(c, e->prim, n, a));
    if (e->wreorder) CH_TRY(run_wreorder(c, e, dw->data, 1));
    return CH_OK;
}

/* -------------------------------------------------------------- linear */

ch_status ch_cpu_linear_forward(void *st, const ch_tensor_t *x, const ch_tensor_t *w,
                                const ch_tensor_t *b, ch_tensor_t *y)
{
    ch_cpu_threads(st);
    int64_t N = x->shape[0], K = x->shape[1], M = w->shape[0];
    float *Y = y->data;
    if (N == 0 || M == 0) return CH_OK;
    if (K == 0) {
        memset(Y, 0, (size_t)(N * M) * sizeof(float));
    } else {
        CH_CHECK_DNNL(dnnl_sgemm('N', 'T', N, M, K, 1.0f, x->data, K, w->data, K, 0.0f, Y, M));
    }
    if (b) {
        const float *B = b->data;
        for (int64_t n = 0; n < N; n++)
            for (int64_t m = 0; m < M; m++) Y[n * M + m] += B[m];
    }
    return CH_OK;
}

ch_status ch_cpu_linear_backward_data(void *st, const ch_tensor_t *dy, const ch_tensor_t *w,
                                      ch_tensor_t *dx)
{
    ch_cpu_threads(st);
    int64_t N = dy->shape[0], M = w->shape[0], K = w->shape[1];
    if (N == 0 || K == 0) return CH_OK;
    if (M == 0) {
        memset(dx->data, 0, dx->nbytes);
        return CH_OK;
    }
    CH_CHECK_DNNL(dnnl_sgemm('N', 'N', N, K, M, 1.0f, dy->data, M, w->data, K, 0.0f, dx->data, K));
    return CH_OK;
}

ch_status ch_cpu_linear_backward_weights(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                         ch_tensor_t *dw, ch_tensor_t *db)
{
    ch_cpu_threads(st);
    int64_t N = x->shape[0], K = x->shape[1], M = dy->shape[1];
    if (N == 0 || M == 0 || K == 0) {
        if (dw->nbytes) memset(dw->data, 0, dw->nbytes);
    } else {
        CH_CHECK_DNNL(dnnl_sgemm('T', 'N', M, K, N, 1.0f, dy->data, M, x->data, K, 0.0f,
                                 dw->data, K));
    }
    if (db) {
        float *B = db->data;
        const float *D = dy->data;
        for (int64_t m = 0; m < M; m++) {
            double s = 0.0;
            for (int64_t n = 0; n < N; n++) s += D[n * M + m];
            B[m] = (float)s;
        }
    }
    return CH_OK;
}
