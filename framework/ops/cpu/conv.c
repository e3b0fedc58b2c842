/* cohort: CPU ops through oneDNN primitives — layout reorders and 2-D
 * convolution (forward, backward data, backward weights) — and linear layers
 * through oneDNN's sgemm.
 *
 * Primitives are created once per (op, shapes, layouts, parameters) and
 * cached (cpu.h). Activations are used in the layout their tensors carry;
 * the weights are plain OIHW for the caller and reordered into the format
 * the primitive chose (weights format "any") — once per data version for
 * versioned tensors (parameters, framework/tensor/tensor.h: the converted
 * copy is kept and reused while ch_tensor_data_version() is unchanged), on
 * every call otherwise; gradients are reordered back to OIHW. Scratchpads
 * are user-managed: one shared buffer.
 */
#include "config.h"

#include "framework/core/log.h"
#include "framework/ops/cpu/cpu.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* 1 for one group and no dilation; 0 for a grouped or dilated convolution
 * (ops.h), which runs oneDNN's grouped / dilated primitives on the whole
 * kernel: no cropping, no small-map GEMM, no Winograd, no C weight reorders
 * (oneDNN's 5-D grouped weight formats are not among weight_format's). */
static int conv_plain(const ch_conv2d_params_t *p)
{
    return ch_conv2d_groups(p) == 1 && ch_conv2d_dilation_h(p) == 1 &&
           ch_conv2d_dilation_w(p) == 1;
}

static conv_crop crop_of(const int64_t *in_hw, const int64_t *out_hw, const int64_t *wshape,
                         const ch_conv2d_params_t *p)
{
    conv_crop c;
    int64_t s[2] = {p->stride_h, p->stride_w}, pad[2] = {p->pad_h, p->pad_w};
    c.cropped = 0;
    if (!conv_plain(p)) {
        /* grouped or dilated: the whole kernel (no cropping) */
        for (int d = 0; d < 2; d++) {
            c.k0[d] = 0;
            c.kk[d] = wshape[2 + d];
            c.pl[d] = c.pr[d] = pad[d];
        }
        return c;
    }
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

/* Weight reorders in C for the square-tiled blocked formats oneDNN's
 * direct kernels pick: 16x16 channel tiles (AVX-512) and 8x8 (AVX2, AVX).
 * Plain OIHW (O,I,H,W) <-> blocked with BxB tiles, dims divisible by B:
 *   WF_OI_IO  ABcd<B>b<B>a  [O/B][I/B][h][w][B i][B o]  (forward, bwd weights)
 *   WF_OI_OI  ABcd<B>a<B>b  [O/B][I/B][h][w][B o][B i]  (backward data)
 *   WF_IO_OI  BAcd16a16b    [I/B][O/B][h][w][B o][B i]  (backward data, 1x1;
 *             oneDNN 2.6 has no 8-wide counterpart)
 * Whether this loop or oneDNN's reorder runs is decided per primitive by
 * timing both at creation (wreorder_pick): neither wins everywhere (oneDNN's
 * jit reorder is the faster plain -> blocked on this machine, the C loop the
 * faster 16x16 blocked -> plain; docs/perf-isa.md). */
enum { WF_NONE = 0, WF_OI_IO, WF_OI_OI, WF_IO_OI };

static int weight_format(const dnnl_memory_desc_t *md, const int64_t *d, int *block)
{
    static const struct { dnnl_format_tag_t tag; int wf, b; } tags[] = {
        {dnnl_ABcd16b16a, WF_OI_IO, 16}, {dnnl_ABcd16a16b, WF_OI_OI, 16},
        {dnnl_BAcd16a16b, WF_IO_OI, 16}, {dnnl_ABcd8b8a, WF_OI_IO, 8},
        {dnnl_ABcd8a8b, WF_OI_OI, 8}};
    dnnl_dims_t dd = {d[0], d[1], d[2], d[3]};
    for (size_t i = 0; i < sizeof tags / sizeof tags[0]; i++) {
        dnnl_memory_desc_t t;
        if (d[0] % tags[i].b || d[1] % tags[i].b) continue;
        if (dnnl_memory_desc_init_by_tag(&t, 4, dd, dnnl_f32, tags[i].tag) != dnnl_success)
            continue;
        if (dnnl_memory_desc_equal(&t, md)) {
            *block = tags[i].b;
            return tags[i].wf;
        }
    }
    return WF_NONE;
}

/* plain <-> blocked (to_plain selects the direction), tile width B; inlined
 * into weights_reorder with B a constant so the inner loops vectorise. */
static inline __attribute__((always_inline)) void
weights_reorder_b(float *plain, float *blk, const int64_t *d, int wf, int to_plain, const int B)
{
    int64_t O = d[0], I = d[1], HW = d[2] * d[3], nO = O / B, nI = I / B, BB = B * B;
    for (int64_t ob = 0; ob < nO; ob++)
        for (int64_t ib = 0; ib < nI; ib++) {
            int64_t tile = wf == WF_IO_OI ? ib * nO + ob : ob * nI + ib;
            float *bt = blk + tile * HW * BB;
            for (int64_t k = 0; k < HW; k++)
                for (int64_t r = 0; r < B; r++) {
                    /* row r of the BxB tile at tap k: i = r (OI_IO) or o = r */
                    float *row = bt + k * BB + r * B;
                    float *p0 = wf == WF_OI_IO ? plain + ((ob * B) * I + ib * B + r) * HW + k
                                               : plain + ((ob * B + r) * I + ib * B) * HW + k;
                    int64_t st = wf == WF_OI_IO ? I * HW : HW;
                    if (to_plain) {
                        for (int l = 0; l < B; l++) p0[l * st] = row[l];
                    } else {
                        float t[16];
                        for (int l = 0; l < B; l++) t[l] = p0[l * st];
                        for (int l = 0; l < B; l++) row[l] = t[l];
                    }
                }
        }
}

CH_CPU_SIMD static void weights_reorder(float *plain, float *blk, const int64_t *d, int wf,
                                        int block, int to_plain)
{
    if (block == 16) weights_reorder_b(plain, blk, d, wf, to_plain, 16);
    else weights_reorder_b(plain, blk, d, wf, to_plain, 8);
}

static double mono_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Choose between the C loop (format wf) and oneDNN's reorder e->wreorder for
 * this primitive's weights: run both 3 times, alternating, on a test pattern
 * (plain i -> i, or blocked for to_user), keep the faster of the best times
 * in e->wfmt (WF_NONE: oneDNN's). The two must produce the same bytes; a
 * difference is a bug in weights_reorder (CH_ERR_INTERNAL). */
static ch_status wreorder_pick(ch_cpu_t *c, cpu_prim *e, const dnnl_memory_desc_t *user, int wf,
                               int to_user)
{
    size_t bytes = e->wbytes, n = bytes / sizeof(float);
    float *plain = aligned_alloc(64, (bytes + 63) / 64 * 64);
    float *first = aligned_alloc(64, (bytes + 63) / 64 * 64);
    dnnl_memory_t pm = NULL;
    ch_status s = CH_OK;
    if (!plain || !first) s = CH_ERROR(CH_ERR_NOMEM, "conv: weights test buffers of %zu bytes", bytes);
    if (s == CH_OK) s = mem_create(c, user, plain, &pm);
    float *src = to_user ? e->wbuf : plain, *dst = to_user ? plain : e->wbuf;
    for (size_t i = 0; s == CH_OK && i < n; i++) src[i] = (float)i;
    double tc = 1e30, td = 1e30;
    dnnl_exec_arg_t a[2] = {{DNNL_ARG_FROM, to_user ? e->wprim_mem : pm},
                            {DNNL_ARG_TO, to_user ? pm : e->wprim_mem}};
    for (int r = 0; s == CH_OK && r < 3; r++) {
        double t0 = mono_s();
        weights_reorder(plain, e->wbuf, e->wdims, wf, e->wblock, to_user);
        double t1 = mono_s();
        if (t1 - t0 < tc) tc = t1 - t0;
        if (r == 0) memcpy(first, dst, bytes);
        memset(dst, 0, bytes);
        t0 = mono_s();
        s = exec(c, e->wreorder, 2, a);
        t1 = mono_s();
        if (t1 - t0 < td) td = t1 - t0;
        if (s == CH_OK && r == 0 && memcmp(first, dst, bytes) != 0)
            s = CH_ERROR(CH_ERR_INTERNAL,
                         "conv: C weights reorder (format %d, block %d, %s) differs from "
                         "oneDNN's for %lldx%lldx%lldx%lld weights",
                         wf, e->wblock, to_user ? "to plain" : "from plain",
                         (long long)e->wdims[0], (long long)e->wdims[1], (long long)e->wdims[2],
                         (long long)e->wdims[3]);
    }
    if (s == CH_OK) {
        e->wfmt = tc < td ? wf : WF_NONE;
        ch_log_debug("conv weights %lldx%lldx%lldx%lld %s, %dx%d tiles: C %.3f ms, oneDNN %.3f "
                     "ms: using %s",
                     (long long)e->wdims[0], (long long)e->wdims[1], (long long)e->wdims[2],
                     (long long)e->wdims[3], to_user ? "to plain" : "from plain", e->wblock,
                     e->wblock, 1e3 * tc, 1e3 * td, e->wfmt ? "C" : "oneDNN");
    }
    if (pm) dnnl_memory_destroy(pm);
    free(plain);
    free(first);
    return s;
}

/* Weights descriptor of the (cropped) kernel: (O, I, kh, kw) with tag
 * `plain` = dnnl_oihw or any; grouped (groups > 1, wshape[1] = I/G):
 * oneDNN's (G, O/G, I/G, kh, kw), tag goihw or any — the same bytes as
 * PyTorch's (O, I/G, kh, kw). */
static ch_status conv_weights_md(dnnl_memory_desc_t *md, const int64_t *wshape,
                                 const conv_crop *cr, int groups, dnnl_format_tag_t plain,
                                 dnnl_data_type_t dt)
{
    if (groups > 1) {
        dnnl_dims_t gd = {groups, wshape[0] / groups, wshape[1], cr->kk[0], cr->kk[1]};
        CH_CHECK_DNNL(dnnl_memory_desc_init_by_tag(md, 5, gd, dt,
                                                   plain == dnnl_oihw ? dnnl_goihw : plain));
        return CH_OK;
    }
    dnnl_dims_t wd = {wshape[0], wshape[1], cr->kk[0], cr->kk[1]};
    CH_CHECK_DNNL(dnnl_memory_desc_init_by_tag(md, 4, wd, dt, plain));
    return CH_OK;
}

/* Weights: the primitive wants prim_md; the caller holds plain OIHW (of
 * which the primitive may use only the cropped taps). When they differ,
 * allocate a buffer in the primitive's format and a reorder (user ->
 * primitive when to_user == 0, primitive -> user otherwise). */
static ch_status setup_weights(ch_cpu_t *c, cpu_prim *e, const dnnl_memory_desc_t *prim_md,
                               const int64_t *wshape, const conv_crop *cr, int groups,
                               int to_user)
{
    /* user side: the full plain OIHW weights, or (cropped) a compact plain
     * buffer of the kept taps that conv.c gathers / scatters itself (oneDNN's
     * reorders from a strided sub-memory are slow) */
    dnnl_memory_desc_t user;
    CH_TRY(conv_weights_md(&user, wshape, cr, groups, dnnl_oihw, dnnl_f32));
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
    for (int i = 0; i < 4; i++) e->wdims[i] = i < 2 ? wshape[i] : cr->kk[i - 2];
    int wf = weight_format(prim_md, e->wdims, &e->wblock);
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
    return wf == WF_NONE ? CH_OK : wreorder_pick(c, e, &user, wf, to_user);
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
 * primitive-format buffer blk; cropped primitives go through the compact
 * buffer. */
static ch_status run_wreorder(ch_cpu_t *c, cpu_prim *e, void *user_ptr, void *blk, int to_user)
{
    if (e->cropped && !to_user) crop_copy(e, user_ptr, 0);
    if (e->wfmt) {
        weights_reorder(e->cropped ? e->cbuf : (float *)user_ptr, blk, e->wdims, e->wfmt,
                        e->wblock, to_user);
    } else {
        if (!e->cropped) CH_TRY(set_handle(e->wuser_mem, user_ptr));
        CH_TRY(set_handle(e->wprim_mem, blk));
        dnnl_exec_arg_t a[2] = {
            {DNNL_ARG_FROM, to_user ? e->wprim_mem : e->wuser_mem},
            {DNNL_ARG_TO, to_user ? e->wuser_mem : e->wprim_mem},
        };
        CH_TRY(exec(c, e->wreorder, 2, a));
    }
    if (e->cropped && to_user) {
        int64_t n = e->wfull[0] * e->wfull[1] * e->wfull[2] * e->wfull[3];
        memset(user_ptr, 0, (size_t)n * sizeof(float)); /* taps never touching the input */
        crop_copy(e, user_ptr, 1);
    }
    return CH_OK;
}

/* ------------------------------------------- converted weights kept */

/* One conversion of plain OIHW weights into a kernel's format (written to
 * dst, `bytes` long): the direct convolution's reorder or the small-map
 * GEMM's dense matrix. */
typedef struct {
    ch_status (*run)(void *ctx, void *dst);
    void *ctx;
    size_t bytes;
    void *scratch; /* a buffer of `bytes` the check mode may overwrite */
} wconvert;

/* The kernel-format weights for w in *out: e's kept copy when w is versioned
 * (tensor.h) and e holds one made from the same data pointer at the current
 * data version, else a fresh conversion — kept in a slot (the same
 * pointer's, a free one, or the least recently used) when w is versioned,
 * into cv->scratch otherwise or with the cache off. In check mode
 * (COHORT_WEIGHT_CACHE=check) a reuse converts again into cv->scratch and
 * compares: a difference means the weights were written without
 * ch_tensor_data_changed() (CH_ERR_INTERNAL). */
static ch_status kept_weights(ch_cpu_t *c, cpu_prim *e, const ch_tensor_t *w,
                              const wconvert *cv, void **out)
{
    uint64_t ver = ch_tensor_data_version();
    cpu_wslot *sl = NULL;
    if (w->versioned && c->wcache_mode) {
        for (int i = 0; i < CPU_WSLOTS && !sl; i++)
            if (e->wslot[i].ptr == w->data) sl = &e->wslot[i];
        if (sl && sl->version == ver) {
            sl->used = ++c->wtick;
            if (c->wcache_mode == 2) {
                CH_TRY(cv->run(cv->ctx, cv->scratch));
                if (memcmp(cv->scratch, sl->buf, cv->bytes) != 0) {
                    char d[128];
                    return CH_ERROR(CH_ERR_INTERNAL,
                                    "conv: weights %s at %p were changed without "
                                    "ch_tensor_data_changed() (COHORT_WEIGHT_CACHE=check found "
                                    "the kept converted copy stale)",
                                    ch_tensor_describe(w, d, sizeof d), w->data);
                }
            }
            c->wreused++;
            *out = sl->buf;
            return CH_OK;
        }
        for (int i = 0; i < CPU_WSLOTS && !sl; i++)
            if (!e->wslot[i].ptr) sl = &e->wslot[i];
        if (!sl) { /* all taken: the least recently used */
            sl = &e->wslot[0];
            for (int i = 1; i < CPU_WSLOTS; i++)
                if (e->wslot[i].used < sl->used) sl = &e->wslot[i];
        }
        sl->ptr = NULL; /* until the conversion succeeded */
        if (!sl->buf) sl->buf = aligned_alloc(64, (cv->bytes + 63) / 64 * 64);
        if (!sl->buf)
            return CH_ERROR(CH_ERR_NOMEM, "conv: kept converted weights of %zu bytes", cv->bytes);
    }
    void *dst = sl ? sl->buf : cv->scratch;
    CH_TRY(cv->run(cv->ctx, dst));
    c->wconverted++;
    if (sl) {
        sl->ptr = w->data;
        sl->version = ver;
        sl->used = ++c->wtick;
    }
    *out = dst;
    return CH_OK;
}

typedef struct {
    ch_cpu_t *c;
    cpu_prim *e;
    void *w;
} direct_conv_ctx;

static ch_status direct_convert(void *ctx, void *dst)
{
    direct_conv_ctx *d = ctx;
    return run_wreorder(d->c, d->e, d->w, dst, 0);
}

/* Point the primitive's weights argument at w, converted when the kernel
 * wants another format (kept between calls, kept_weights). */
static ch_status bind_weights(ch_cpu_t *c, cpu_prim *e, const ch_tensor_t *w)
{
    if (!e->wreorder) return set_handle(e->wprim_mem, handle(w));
    direct_conv_ctx d = {c, e, handle(w)};
    wconvert cv = {direct_convert, &d, e->wbytes, e->wbuf};
    void *buf = NULL;
    CH_TRY(kept_weights(c, e, w, &cv, &buf));
    return set_handle(e->wprim_mem, buf);
}

/* compute.precision = bf16 asked for on an ISA without bf16 (a context a
 * job did not check: runtime/job.c refuses such a job at start). */
static ch_status bf16_refused(const char *op)
{
    return CH_ERROR(CH_ERR_UNSUPPORTED,
                    "%s: compute.precision = bf16: this CPU's oneDNN ISA is %s (no bf16 "
                    "instructions); use fp32",
                    op, ch_cpu_isa_name());
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
    k[20] = ch_conv2d_dilation_h(p);
    k[21] = ch_conv2d_dilation_w(p);
    k[22] = ch_conv2d_groups(p);
}

static const char *conv_op_name(int op)
{
    return op == CPU_OP_CONV_FWD        ? "forward"
           : op == CPU_OP_CONV_BWD_DATA ? "backward data"
                                        : "backward weights";
}

/* Primitive descriptor of one convolution op for activation descriptors amd
 * (a-side: src, or diff_src for BWD_DATA) and bmd (b-side: dst or diff_dst),
 * weights "any" with the cropped kernel. Backward ops also get their forward
 * hint, which the caller destroys after the primitive is created. */
static ch_status conv_pd(ch_cpu_t *c, int op, const dnnl_memory_desc_t *amd,
                         const dnnl_memory_desc_t *bmd, const int64_t *wshape,
                         const conv_crop *cr, int has_b, const ch_conv2d_params_t *p,
                         dnnl_alg_kind_t alg, dnnl_primitive_desc_t *pd,
                         dnnl_primitive_desc_t *hint)
{
    dnnl_memory_desc_t wts, bia;
    /* bf16 (c->bf16, see conv_side_dtype): bf16 weights for forward and
     * backward data, fp32 weight gradients; the forward descriptor (the op
     * itself or the backward ops' hint) has bf16 src and weights, fp32 dst */
    CH_TRY(conv_weights_md(&wts, wshape, cr, ch_conv2d_groups(p), dnnl_format_tag_any,
                           c->bf16 && op != CPU_OP_CONV_BWD_WEIGHTS ? dnnl_bf16 : dnnl_f32));
    dnnl_memory_desc_t fwts = wts, fsrc = *amd, fdst = *bmd;
    if (c->bf16) {
        fwts.data_type = dnnl_bf16;
        fsrc.data_type = dnnl_bf16;
        fdst.data_type = dnnl_f32;
    }
    dnnl_dims_t bd = {wshape[0]};
    CH_CHECK_DNNL(dnnl_memory_desc_init_by_tag(&bia, 1, bd, dnnl_f32, dnnl_x));
    dnnl_dims_t strides = {p->stride_h, p->stride_w};
    /* oneDNN's dilation counts the skipped taps: PyTorch's minus 1 */
    dnnl_dims_t dil = {ch_conv2d_dilation_h(p) - 1, ch_conv2d_dilation_w(p) - 1};
    dnnl_dims_t pl = {cr->pl[0], cr->pl[1]}, pr = {cr->pr[0], cr->pr[1]};
    dnnl_convolution_desc_t fd, cd;
    const dnnl_memory_desc_t *fb = has_b && op != CPU_OP_CONV_BWD_DATA ? &bia : NULL;
    CH_CHECK_DNNL(dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training, alg,
                                                             &fsrc, &fwts, fb, &fdst, strides,
                                                             dil, pl, pr));
    *pd = *hint = NULL;
    if (op == CPU_OP_CONV_FWD) {
        CH_CHECK_DNNL(dnnl_primitive_desc_create(pd, &fd, c->attr, c->engine, NULL));
        return CH_OK;
    }
    CH_CHECK_DNNL(dnnl_primitive_desc_create(hint, &fd, NULL, c->engine, NULL));
    dnnl_status_t ds;
    if (op == CPU_OP_CONV_BWD_DATA)
        ds = dnnl_dilated_convolution_backward_data_desc_init(&cd, alg, amd, &wts, bmd, strides,
                                                              dil, pl, pr);
    else
        ds = dnnl_dilated_convolution_backward_weights_desc_init(&cd, alg, amd, &wts, fb, bmd,
                                                                 strides, dil, pl, pr);
    if (ds == dnnl_success) ds = dnnl_primitive_desc_create(pd, &cd, c->attr, c->engine, *hint);
    if (ds != dnnl_success) {
        dnnl_primitive_desc_destroy(*hint);
        *hint = NULL;
        return CH_ERROR(CH_ERR_DNNL, "convolution %s primitive: %s", conv_op_name(op),
                        ch_dnnl_status_string((int)ds));
    }
    return CH_OK;
}

/* Activation formats tried, in this order, when the tensors' own layouts get
 * only a reference kernel (oneDNN 2.6: the 7x7/2 stem with one input channel
 * and nChw8c gradients on AVX2, backward weights; nChw8c/16c activations on
 * SSE4.1). nhwc has jit kernels from AVX2 up (measured fastest for that
 * stem: docs/perf-isa.md); plain nchw reaches the gemm-based kernels on every
 * ISA; "any" lets oneDNN choose. */
static const dnnl_format_tag_t conv_alt_tags[] = {dnnl_nhwc, dnnl_nchw, dnnl_format_tag_any};

/* Whether side s (0 = a, 1 = b) of op is written by the primitive. */
static int conv_side_is_output(int op, int s)
{
    return (op == CPU_OP_CONV_FWD && s == 1) || (op == CPU_OP_CONV_BWD_DATA && s == 0);
}

/* Data type the primitive sees on side s: fp32, or with bf16 on
 * (compute.precision = bf16) bf16 for the inputs (x, dy) and fp32 for the
 * outputs (y, dx), which the ops after a convolution (batch norm, ReLU, the
 * additions) read in fp32. The bf16 inputs are converted from the fp32
 * tensors by a oneDNN reorder at each call (conv_side_setup). */
static dnnl_data_type_t conv_side_dtype(const ch_cpu_t *c, int op, int s)
{
    return c->bf16 && !conv_side_is_output(op, s) ? dnnl_bf16 : dnnl_f32;
}

/* The primitive's activation descriptor of side s. */
static const dnnl_memory_desc_t *conv_side_md(const_dnnl_primitive_desc_t pd, int op, int s)
{
    dnnl_query_t q = s == 0 ? (op == CPU_OP_CONV_BWD_DATA ? dnnl_query_diff_src_md
                                                          : dnnl_query_src_md)
                            : (op == CPU_OP_CONV_FWD ? dnnl_query_dst_md
                                                     : dnnl_query_diff_dst_md);
    return dnnl_primitive_desc_query_md(pd, q, 0);
}

/* Memory objects of side s: mem[s] in the primitive's format pmd; where
 * that is not the tensor's format tmd, a buffer and a reorder between them. */
static ch_status conv_side_setup(ch_cpu_t *c, cpu_prim *e, int op, int s,
                                 const dnnl_memory_desc_t *tmd, const dnnl_memory_desc_t *pmd)
{
    if (dnnl_memory_desc_equal(tmd, pmd)) return mem_create(c, tmd, MEM_NONE, &e->mem[s]);
    size_t bytes = dnnl_memory_desc_get_size(pmd);
    e->xbuf[s] = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!e->xbuf[s])
        return CH_ERROR(CH_ERR_NOMEM, "conv: activation buffer of %zu bytes", bytes);
    CH_TRY(mem_create(c, pmd, e->xbuf[s], &e->mem[s]));
    int out = conv_side_is_output(op, s);
    dnnl_memory_desc_t t16 = *tmd;
    t16.data_type = dnnl_bf16;
    if (!out && tmd->data_type == dnnl_f32 && pmd->data_type == dnnl_bf16 &&
        dnnl_memory_desc_equal(&t16, pmd)) {
        /* the same format in bf16 (nhwc with compute.precision = bf16): a
         * streaming cast, cheaper than oneDNN's f32 -> bf16 reorder */
        e->xcast[s] = (int64_t)(bytes / sizeof(uint16_t));
        return CH_OK;
    }
    CH_TRY(mem_create(c, tmd, MEM_NONE, &e->xuser_mem[s]));
    dnnl_primitive_desc_t rpd;
    CH_CHECK_DNNL(dnnl_reorder_primitive_desc_create(&rpd, out ? pmd : tmd, c->engine,
                                                     out ? tmd : pmd, c->engine, NULL));
    dnnl_status_t ds = dnnl_primitive_create(&e->xreorder[s], rpd);
    dnnl_primitive_desc_destroy(rpd);
    CH_CHECK_DNNL(ds);
    return CH_OK;
}

/* Create (or fetch) the primitive for one of the three convolution ops.
 * For CONV_FWD: a = x, b = y. BWD_DATA: a = dx, b = dy. BWD_WEIGHTS: a = x,
 * b = dy. The activations are used in their tensors' layouts unless oneDNN
 * has only a reference kernel for those: then the formats of conv_alt_tags
 * are tried and the first with a real kernel is used, the activations being
 * reordered on the way in and out (run-time query of the implementation, so
 * it holds on every ISA and oneDNN build). Where every format gets a
 * reference kernel, one warning names the op, the shape and the ISA. */
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
    int64_t in_hw[2] = {a->shape[2], a->shape[3]}, out_hw[2] = {b->shape[2], b->shape[3]};
    conv_crop cr = crop_of(in_hw, out_hw, wshape, p);
    /* amd/bmd: what the primitive is asked for; tamd/tbmd: the tensors */
    dnnl_memory_desc_t amd, bmd, tamd, tbmd;
    ch_cpu_md_of(&tamd, a);
    ch_cpu_md_of(&tbmd, b);
    amd = tamd;
    bmd = tbmd;
    amd.data_type = conv_side_dtype(c, op, 0);
    bmd.data_type = conv_side_dtype(c, op, 1);
    if (c->bf16) {
        /* bf16 inputs go through a reorder anyway: nhwc, where oneDNN 2.6 has
         * its AMX (brgconv) kernels; measured 2x the blocked-format bf16
         * kernels at 3x224x224 (docs/PERFORMANCE.md) */
        dnnl_dims_t ad = {a->shape[0], a->shape[1], a->shape[2], a->shape[3]};
        dnnl_dims_t bd = {b->shape[0], b->shape[1], b->shape[2], b->shape[3]};
        dnnl_memory_desc_t t;
        if (amd.data_type == dnnl_bf16 &&
            dnnl_memory_desc_init_by_tag(&t, 4, ad, dnnl_bf16, dnnl_nhwc) == dnnl_success)
            amd = t;
        if (bmd.data_type == dnnl_bf16 &&
            dnnl_memory_desc_init_by_tag(&t, 4, bd, dnnl_bf16, dnnl_nhwc) == dnnl_success)
            bmd = t;
    }
    /* compute.cpu_conv_algorithm: a 3x3 stride-1 convolution (uncropped)
     * first asks for Winograd (or oneDNN's choice); where oneDNN has no such
     * kernel (any ISA below AVX-512, or a shape it does not cover) the
     * direct one is used, said once per context for WINOGRAD. */
    ch_status s = CH_ERR_UNSUPPORTED;
    int try_wino = c->conv_alg != CH_CPU_CONV_DIRECT && conv_plain(p) && cr.kk[0] == 3 &&
                   cr.kk[1] == 3 &&
                   p->stride_h == 1 && p->stride_w == 1;
    if (try_wino) {
        s = conv_pd(c, op, &amd, &bmd, wshape, &cr, has_b, p,
                    c->conv_alg == CH_CPU_CONV_AUTO ? dnnl_convolution_auto
                                                    : dnnl_convolution_winograd,
                    &pd, &hint);
        if (s != CH_OK) ch_error_clear();
        if (s != CH_OK && c->conv_alg == CH_CPU_CONV_WINOGRAD && !c->wino_missing_logged) {
            c->wino_missing_logged = 1;
            ch_log_info("cohort: compute.cpu_conv_algorithm = winograd: oneDNN has no Winograd "
                        "kernel for some 3x3 convolutions (the first: %s %lldx%lldx%lldx%lld -> "
                        "%lldx%lldx%lldx%lld, layout %s, ISA %s); those run the direct kernels "
                        "(oneDNN 2.x has Winograd only on AVX-512 CPUs and only for nChw16c "
                        "activations); said once",
                        conv_op_name(op), (long long)a->shape[0], (long long)a->shape[1],
                        (long long)a->shape[2], (long long)a->shape[3], (long long)b->shape[0],
                        (long long)b->shape[1], (long long)b->shape[2], (long long)b->shape[3],
                        ch_layout_name(a->layout), ch_cpu_isa_name());
        }
    }
    if (s != CH_OK)
        s = conv_pd(c, op, &amd, &bmd, wshape, &cr, has_b, p, dnnl_convolution_direct, &pd,
                    &hint);
    if (s == CH_OK && try_wino && ch_cpu_pd_is_winograd(pd)) c->nwinograd++;
    for (size_t i = 0; s == CH_OK && ch_cpu_pd_is_ref(pd) &&
                       i < sizeof conv_alt_tags / sizeof conv_alt_tags[0];
         i++) {
        dnnl_memory_desc_t aalt, balt;
        dnnl_dims_t ad = {a->shape[0], a->shape[1], a->shape[2], a->shape[3]};
        dnnl_dims_t bd = {b->shape[0], b->shape[1], b->shape[2], b->shape[3]};
        dnnl_primitive_desc_t pd2 = NULL, hint2 = NULL;
        if (dnnl_memory_desc_init_by_tag(&aalt, 4, ad, conv_side_dtype(c, op, 0),
                                         conv_alt_tags[i]) ||
            dnnl_memory_desc_init_by_tag(&balt, 4, bd, conv_side_dtype(c, op, 1),
                                         conv_alt_tags[i]))
            continue;
        if (conv_pd(c, op, &aalt, &balt, wshape, &cr, has_b, p, dnnl_convolution_direct, &pd2,
                    &hint2) != CH_OK) {
            ch_error_clear();
            continue;
        }
        if (ch_cpu_pd_is_ref(pd2)) {
            dnnl_primitive_desc_destroy(pd2);
            if (hint2) dnnl_primitive_desc_destroy(hint2);
            continue;
        }
        dnnl_primitive_desc_destroy(pd);
        if (hint) dnnl_primitive_desc_destroy(hint);
        pd = pd2;
        hint = hint2;
    }
    if (s == CH_OK && ch_cpu_pd_is_ref(pd))
        ch_log_warn("cohort: oneDNN has only a reference (slow) kernel for convolution %s "
                    "%lldx%lldx%lldx%lld -> %lldx%lldx%lldx%lld, weight %lldx%lldx%lldx%lld, "
                    "stride %lld, pad %lld, dilation %d, groups %d, %s, on ISA %s",
                    conv_op_name(op), (long long)a->shape[0], (long long)a->shape[1],
                    (long long)a->shape[2], (long long)a->shape[3], (long long)b->shape[0],
                    (long long)b->shape[1], (long long)b->shape[2], (long long)b->shape[3],
                    (long long)wshape[0], (long long)wshape[1], (long long)wshape[2],
                    (long long)wshape[3], (long long)p->stride_h, (long long)p->pad_h,
                    ch_conv2d_dilation_h(p), ch_conv2d_groups(p), c->bf16 ? "bf16" : "fp32",
                    ch_cpu_isa_name());
    if (s == CH_OK) {
        dnnl_query_t wq = op == CPU_OP_CONV_BWD_WEIGHTS ? dnnl_query_diff_weights_md
                                                        : dnnl_query_weights_md;
        const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, wq, 0);
        s = setup_weights(c, e, wmd, wshape, &cr, ch_conv2d_groups(p),
                          op == CPU_OP_CONV_BWD_WEIGHTS);
    }
    if (s == CH_OK) s = setup_scratch(c, pd, e);
    /* mem[0] = a-side activation, mem[1] = b-side activation, mem[2] = bias */
    if (s == CH_OK) s = conv_side_setup(c, e, op, 0, &tamd, conv_side_md(pd, op, 0));
    if (s == CH_OK) s = conv_side_setup(c, e, op, 1, &tbmd, conv_side_md(pd, op, 1));
    if (s == CH_OK && has_b) {
        dnnl_memory_desc_t bias_md;
        dnnl_dims_t bd = {wshape[0]};
        dnnl_memory_desc_init_by_tag(&bias_md, 1, bd, dnnl_f32, dnnl_x);
        s = mem_create(c, &bias_md, MEM_NONE, &e->mem[2]);
    }
    if (s == CH_OK) {
        dnnl_status_t ds = dnnl_primitive_create(&e->prim, pd);
        if (ds != dnnl_success)
            s = CH_ERROR(CH_ERR_DNNL, "convolution primitive: %s", ch_dnnl_status_string((int)ds));
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (hint) dnnl_primitive_desc_destroy(hint);
    if (s != CH_OK) {
        ch_cpu_prim_free(e);
        return ch_error_context("conv2d %s %lldx%lldx%lldx%lld, weight %lldx%lldx%lldx%lld",
                                conv_op_name(op), (long long)a->shape[0], (long long)a->shape[1],
                                (long long)a->shape[2], (long long)a->shape[3],
                                (long long)wshape[0], (long long)wshape[1],
                                (long long)wshape[2], (long long)wshape[3]);
    }
    CH_TRY(ch_cpu_cache_add(c, e));
    *out = e;
    return CH_OK;
}

/* Bind side s to the tensor data at ptr before the primitive runs: an
 * input in another format is reordered into the primitive's buffer now. */
static ch_status side_bind(ch_cpu_t *c, cpu_prim *e, int op, int s, void *ptr)
{
    if (e->xcast[s]) {
        ch_cpu_cast_bf16(c, ptr, e->xbuf[s], e->xcast[s]);
        return set_handle(e->mem[s], e->xbuf[s]);
    }
    if (!e->xreorder[s]) return set_handle(e->mem[s], ptr);
    CH_TRY(set_handle(e->xuser_mem[s], ptr));
    if (conv_side_is_output(op, s)) return CH_OK;
    dnnl_exec_arg_t a[2] = {{DNNL_ARG_FROM, e->xuser_mem[s]}, {DNNL_ARG_TO, e->mem[s]}};
    return exec(c, e->xreorder[s], 2, a);
}

/* After the primitive ran: an output in another format goes to the tensor. */
static ch_status side_finish(ch_cpu_t *c, cpu_prim *e, int op, int s)
{
    if (!e->xreorder[s] || !conv_side_is_output(op, s)) return CH_OK;
    dnnl_exec_arg_t a[2] = {{DNNL_ARG_FROM, e->mem[s]}, {DNNL_ARG_TO, e->xuser_mem[s]}};
    return exec(c, e->xreorder[s], 2, a);
}

/* Fill in the scratchpad argument (if any); returns the new arg count. */
static ch_status add_scratch(ch_cpu_t *c, cpu_prim *e, dnnl_exec_arg_t *args, int *n)
{
    if (!e->scratch_mem) return CH_OK;
    CH_TRY(set_handle(e->scratch_mem, c->scratch));
    args[(*n)++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, e->scratch_mem};
    return CH_OK;
}

/* ------------------------------ small maps: the convolution as a GEMM */

static ch_status bf16_matmul(ch_cpu_t *c, char ta, char tb, int64_t m, int64_t n, int64_t k,
                             const float *A, const float *B, const ch_tensor_t *wt,
                             const void *Bh, float *C);

/* When every output position's window covers the whole input map — along
 * each axis (Ho-1)*stride <= pad and H + pad <= kernel — the convolution is
 * one dense matrix product (resnet18 on 28x28 images: layer4's 3x3 on 1x1
 * maps and 3x3/2 from 2x2, layer3's 3x3 on 2x2 maps):
 *   Y = X Wd^T,  X (N, K = C*H*W), Y (N, M = O*Ho*Wo),
 *   Wd[py(o,oh,ow), px(c,h,w)] = W[o, c, h - oh*s + pad_h, w - ow*s + pad_w]
 * where px/py are the element offsets inside one sample's block in x's / y's
 * layout (each sample's block is contiguous in every layout). Every (output,
 * input) pair has a valid tap, so Wd has no structural zeros and the product
 * does exactly the non-padding work; taps that never touch the input are
 * skipped (their weight gradient is zero). Backward: dX = dY Wd;
 * dWd = dY^T X folded back onto the taps. oneDNN's direct kernels reach a
 * fraction of sgemm's rate on such shapes (docs/perf-ops.md). */
static int conv_is_gemm(const ch_cpu_t *c, const ch_tensor_t *x, const ch_tensor_t *y,
                        const int64_t *ws, const ch_conv2d_params_t *p)
{
    (void)c; /* bf16: the same shapes, as a oneDNN bf16 matmul (bf16_matmul) */
    if (!conv_plain(p)) return 0;
    if (!((y->shape[2] - 1) * p->stride_h <= p->pad_h &&
          (y->shape[3] - 1) * p->stride_w <= p->pad_w && x->shape[2] + p->pad_h <= ws[2] &&
          x->shape[3] + p->pad_w <= ws[3]))
        return 0;
    /* Wd has (Ho*Wo*H*W) entries per (o, c) against kh*kw weights: use it
     * only while it stays within twice the weights (large kernels on maps
     * of several pixels would repeat each weight many times) */
    return y->shape[2] * y->shape[3] * x->shape[2] * x->shape[3] <= 2 * ws[2] * ws[3];
}

/* Cached (M, K) buffer for the dense weights of this shape, and its cache
 * entry (whose weight slots keep converted dense weights, gemm_weights). */
static ch_status gemm_wbuf(ch_cpu_t *c, const ch_tensor_t *x, const ch_tensor_t *y,
                           const int64_t *ws, const ch_conv2d_params_t *p, float **buf,
                           cpu_prim **entry)
{
    int64_t key[CPU_KEY_LEN] = {0};
    key[0] = CPU_OP_CONV_GEMM;
    for (int i = 0; i < 4; i++) key[1 + i] = ws[i];
    key[5] = p->pad_h;
    key[6] = p->pad_w;
    key[7] = p->stride_h;
    key[8] = p->stride_w;
    key[9] = x->shape[2];
    key[10] = x->shape[3];
    key[11] = x->layout;
    key[12] = y->shape[2];
    key[13] = y->shape[3];
    key[14] = y->layout;
    cpu_prim *e = ch_cpu_cache_find(c, key);
    if (!e) {
        e = calloc(1, sizeof *e);
        if (!e) return CH_ERROR(CH_ERR_NOMEM, "conv: out of memory");
        memcpy(e->key, key, sizeof key);
        size_t n = (size_t)(ws[0] * y->shape[2] * y->shape[3]) *
                   (size_t)(ws[1] * x->shape[2] * x->shape[3]);
        /* bf16: the kept dense weights are bf16 (xbuf[0]: the scratch for
         * them), cbuf the fp32 matrix they are rounded from and the fp32
         * dWd of backward weights */
        e->wbytes = n * (c->bf16 ? sizeof(uint16_t) : sizeof(float));
        e->cbuf = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
        if (c->bf16 && e->cbuf) e->xbuf[0] = aligned_alloc(64, (e->wbytes + 63) / 64 * 64);
        if (!e->cbuf || (c->bf16 && !e->xbuf[0])) {
            ch_cpu_prim_free(e);
            return CH_ERROR(CH_ERR_NOMEM, "conv: %zu dense weights", n);
        }
        CH_TRY(ch_cpu_cache_add(c, e));
    }
    *buf = e->cbuf;
    if (entry) *entry = e;
    return CH_OK;
}

/* wd (M, K) from w (O,C,kh,kw), or (to_full) w = wd folded onto the taps
 * (summing the entries that share a tap; taps never used stay zero). */
static void dense_weights(float *w, float *wd, const ch_tensor_t *x, const ch_tensor_t *y,
                          const int64_t *ws, const ch_conv2d_params_t *p, int to_full)
{
    cpu_cview vx = ch_cpu_cview(x), vy = ch_cpu_cview(y);
    int64_t O = ws[0], C = ws[1], KK = ws[2] * ws[3], KW = ws[3];
    int64_t H = x->shape[2], W = x->shape[3], Ho = y->shape[2], Wo = y->shape[3];
    int64_t HW = H * W, HWo = Ho * Wo, K = C * HW, Bx = vx.B, By = vy.B;
    if (to_full) memset(w, 0, (size_t)(O * C * KK) * sizeof(float));
    for (int64_t o = 0; o < O; o++) {
        float *wo = w + o * C * KK;
        for (int64_t oh = 0; oh < Ho; oh++)
            for (int64_t ow = 0; ow < Wo; ow++) {
                int64_t py = (o / By) * By * HWo + (oh * Wo + ow) * By + o % By;
                float *row = wd + py * K;
                for (int64_t h = 0; h < H; h++)
                    for (int64_t ww = 0; ww < W; ww++) {
                        int64_t tap = (h - oh * p->stride_h + p->pad_h) * KW + ww -
                                      ow * p->stride_w + p->pad_w;
                        int64_t sp = h * W + ww;
                        for (int64_t cb = 0; cb < C / Bx; cb++) {
                            float *e = row + cb * Bx * HW + sp * Bx;
                            float *f = wo + cb * Bx * KK + tap;
                            if (to_full)
                                for (int64_t l = 0; l < Bx; l++) f[l * KK] += e[l];
                            else
                                for (int64_t l = 0; l < Bx; l++) e[l] = f[l * KK];
                        }
                    }
            }
    }
}

typedef struct {
    const ch_cpu_t *c;
    const ch_tensor_t *x, *y, *w;
    const ch_conv2d_params_t *p;
    float *f32; /* bf16: the fp32 dense matrix, rounded into dst */
} dense_conv_ctx;

/* Entries of the dense matrix: M * K. */
static int64_t gemm_n(const dense_conv_ctx *d)
{
    return d->w->shape[0] * d->y->shape[2] * d->y->shape[3] * d->w->shape[1] * d->x->shape[2] *
           d->x->shape[3];
}

static ch_status dense_convert(void *ctx, void *dst)
{
    dense_conv_ctx *d = ctx;
    if (!d->f32) {
        dense_weights(d->w->data, dst, d->x, d->y, d->w->shape, d->p, 0);
        return CH_OK;
    }
    dense_weights(d->w->data, d->f32, d->x, d->y, d->w->shape, d->p, 0);
    ch_cpu_cast_bf16(d->c, d->f32, dst, gemm_n(d));
    return CH_OK;
}

/* The dense (M, K) weights of w for the GEMM path (x / y: the a-side and
 * b-side activations), fp32, or bf16 with compute.precision = bf16; forward
 * and backward data share one entry, so one conversion serves both while
 * the weights are unchanged (kept_weights). */
static ch_status gemm_weights(ch_cpu_t *c, const ch_tensor_t *x, const ch_tensor_t *y,
                              const ch_tensor_t *w, const ch_conv2d_params_t *p, void **wd)
{
    cpu_prim *e;
    float *f32;
    CH_TRY(gemm_wbuf(c, x, y, w->shape, p, &f32, &e));
    dense_conv_ctx d = {c, x, y, w, p, c->bf16 ? f32 : NULL};
    wconvert cv = {dense_convert, &d, e->wbytes, c->bf16 ? e->xbuf[0] : (void *)f32};
    void *buf = NULL;
    CH_TRY(kept_weights(c, e, w, &cv, &buf));
    *wd = buf;
    return CH_OK;
}

static int64_t gemm_K(const ch_tensor_t *x) { return x->shape[1] * x->shape[2] * x->shape[3]; }

static ch_status gemm_forward(ch_cpu_t *c, const ch_tensor_t *x, const ch_tensor_t *w,
                              const ch_tensor_t *b, const ch_conv2d_params_t *p, ch_tensor_t *y)
{
    int64_t N = x->shape[0], K = gemm_K(x), M = gemm_K(y);
    void *wd;
    CH_TRY(gemm_weights(c, x, y, w, p, &wd));
    ch_cpu_threads(c);
    if (c->bf16) CH_TRY(bf16_matmul(c, 'N', 'T', N, M, K, x->data, NULL, NULL, wd, y->data));
    else CH_CHECK_DNNL(dnnl_sgemm('N', 'T', N, M, K, 1.0f, x->data, K, wd, K, 0.0f, y->data, M));
    if (b) {
        cpu_cview v = ch_cpu_cview(y);
        float *Y = y->data;
        const float *B = b->data;
        for (int64_t n = 0; n < N; n++)
            for (int64_t cb = 0; cb < v.nb; cb++)
                for (int64_t j = 0; j < v.HW; j++) {
                    float *q = Y + ((n * v.nb + cb) * v.HW + j) * v.B;
                    for (int64_t l = 0; l < v.B; l++) q[l] += B[cb * v.B + l];
                }
    }
    return CH_OK;
}

static ch_status gemm_backward_data(ch_cpu_t *c, const ch_tensor_t *dy, const ch_tensor_t *w,
                                    const ch_conv2d_params_t *p, ch_tensor_t *dx)
{
    int64_t N = dy->shape[0], K = gemm_K(dx), M = gemm_K(dy);
    void *wd;
    CH_TRY(gemm_weights(c, dx, dy, w, p, &wd));
    ch_cpu_threads(c);
    if (c->bf16) return bf16_matmul(c, 'N', 'N', N, K, M, dy->data, NULL, NULL, wd, dx->data);
    CH_CHECK_DNNL(dnnl_sgemm('N', 'N', N, K, M, 1.0f, dy->data, M, wd, K, 0.0f, dx->data, K));
    return CH_OK;
}

static ch_status gemm_backward_weights(ch_cpu_t *c, const ch_tensor_t *x, const ch_tensor_t *dy,
                                       const ch_conv2d_params_t *p, ch_tensor_t *dw,
                                       ch_tensor_t *db)
{
    int64_t N = x->shape[0], K = gemm_K(x), M = gemm_K(dy);
    float *wd;
    CH_TRY(gemm_wbuf(c, x, dy, dw->shape, p, &wd, NULL));
    ch_cpu_threads(c);
    if (c->bf16) CH_TRY(bf16_matmul(c, 'T', 'N', M, K, N, dy->data, x->data, NULL, NULL, wd));
    else CH_CHECK_DNNL(dnnl_sgemm('T', 'N', M, K, N, 1.0f, dy->data, M, x->data, K, 0.0f, wd, K));
    dense_weights(dw->data, wd, x, dy, dw->shape, p, 1);
    if (db) {
        cpu_cview v = ch_cpu_cview(dy);
        float *B = db->data;
        const float *D = dy->data;
        double *acc;
        CH_TRY(ch_cpu_dtmp(c, (size_t)v.C, &acc));
        memset(acc, 0, (size_t)v.C * sizeof *acc);
        for (int64_t n = 0; n < N; n++)
            for (int64_t cb = 0; cb < v.nb; cb++)
                for (int64_t j = 0; j < v.HW; j++) {
                    const float *q = D + ((n * v.nb + cb) * v.HW + j) * v.B;
                    for (int64_t l = 0; l < v.B; l++) acc[cb * v.B + l] += q[l];
                }
        for (int64_t o = 0; o < v.C; o++) B[o] = (float)acc[o];
    }
    return CH_OK;
}

ch_status ch_cpu_conv2d_forward(void *st, const ch_tensor_t *x, const ch_tensor_t *w,
                                const ch_tensor_t *b, const ch_conv2d_params_t *p,
                                ch_tensor_t *y)
{
    ch_cpu_t *c = st;
    cpu_prim *e;
    if (c->bf16_missing) return bf16_refused("conv2d forward");
    if (conv_is_gemm(c, x, y, w->shape, p)) return gemm_forward(c, x, w, b, p, y);
    CH_TRY(conv_prim(c, CPU_OP_CONV_FWD, x, w->shape, b != NULL, y, p, &e));
    CH_TRY(bind_weights(c, e, w));
    CH_TRY(side_bind(c, e, CPU_OP_CONV_FWD, 0, handle(x)));
    CH_TRY(side_bind(c, e, CPU_OP_CONV_FWD, 1, y->data));
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
    CH_TRY(exec(c, e->prim, n, a));
    return side_finish(c, e, CPU_OP_CONV_FWD, 1);
}

/* Backward data with primitive e; dyh, where not NULL, is dy already
 * converted into e's format (ch_cpu_conv2d_backward). */
static ch_status bwd_data_run(ch_cpu_t *c, cpu_prim *e, const ch_tensor_t *dy,
                              const ch_tensor_t *w, ch_tensor_t *dx, void *dyh)
{
    CH_TRY(bind_weights(c, e, w));
    CH_TRY(side_bind(c, e, CPU_OP_CONV_BWD_DATA, 0, dx->data));
    if (dyh) CH_TRY(set_handle(e->mem[1], dyh));
    else CH_TRY(side_bind(c, e, CPU_OP_CONV_BWD_DATA, 1, handle(dy)));
    dnnl_exec_arg_t a[4];
    int n = 0;
    a[n++] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_SRC, e->mem[0]};
    a[n++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, e->wprim_mem};
    a[n++] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_DST, e->mem[1]};
    CH_TRY(add_scratch(c, e, a, &n));
    CH_TRY(exec(c, e->prim, n, a));
    return side_finish(c, e, CPU_OP_CONV_BWD_DATA, 0);
}

ch_status ch_cpu_conv2d_backward_data(void *st, const ch_tensor_t *dy, const ch_tensor_t *w,
                                      const ch_conv2d_params_t *p, ch_tensor_t *dx)
{
    ch_cpu_t *c = st;
    cpu_prim *e;
    if (c->bf16_missing) return bf16_refused("conv2d backward data");
    if (conv_is_gemm(c, dx, dy, w->shape, p)) return gemm_backward_data(c, dy, w, p, dx);
    CH_TRY(conv_prim(c, CPU_OP_CONV_BWD_DATA, dx, w->shape, 0, dy, p, &e));
    return bwd_data_run(c, e, dy, w, dx, NULL);
}

/* Backward weights with primitive e; dyh as in bwd_data_run. */
static ch_status bwd_weights_run(ch_cpu_t *c, cpu_prim *e, const ch_tensor_t *x,
                                 const ch_tensor_t *dy, ch_tensor_t *dw, ch_tensor_t *db,
                                 void *dyh)
{
    if (!e->wreorder) CH_TRY(set_handle(e->wprim_mem, dw->data));
    CH_TRY(side_bind(c, e, CPU_OP_CONV_BWD_WEIGHTS, 0, handle(x)));
    if (dyh) CH_TRY(set_handle(e->mem[1], dyh));
    else CH_TRY(side_bind(c, e, CPU_OP_CONV_BWD_WEIGHTS, 1, handle(dy)));
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
    if (e->wreorder) CH_TRY(run_wreorder(c, e, dw->data, e->wbuf, 1));
    return CH_OK;
}

ch_status ch_cpu_conv2d_backward_weights(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                         const ch_conv2d_params_t *p, ch_tensor_t *dw,
                                         ch_tensor_t *db)
{
    ch_cpu_t *c = st;
    cpu_prim *e;
    if (c->bf16_missing) return bf16_refused("conv2d backward weights");
    if (conv_is_gemm(c, x, dy, dw->shape, p)) return gemm_backward_weights(c, x, dy, p, dw, db);
    CH_TRY(conv_prim(c, CPU_OP_CONV_BWD_WEIGHTS, x, dw->shape, db != NULL, dy, p, &e));
    return bwd_weights_run(c, e, x, dy, dw, db, NULL);
}

/* Whether side 1 (dy) of primitives a and b, made for the same dy tensor,
 * is a bf16 cast on both: then it is dy's own format in bf16 on both
 * (conv_side_setup), and one conversion serves both. */
static int same_dy_cast(const cpu_prim *a, const cpu_prim *b)
{
    return a->xcast[1] && a->xcast[1] == b->xcast[1];
}

ch_status ch_cpu_conv2d_backward(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                 const ch_tensor_t *w, const ch_conv2d_params_t *p,
                                 ch_tensor_t *dx, ch_tensor_t *dw, ch_tensor_t *db)
{
    ch_cpu_t *c = st;
    cpu_prim *ew, *ed;
    if (c->bf16_missing) return bf16_refused("conv2d backward");
    if (!c->bf16 || conv_is_gemm(c, x, dy, dw->shape, p)) {
        CH_TRY(ch_cpu_conv2d_backward_weights(st, x, dy, p, dw, db));
        return ch_cpu_conv2d_backward_data(st, dy, w, p, dx);
    }
    CH_TRY(conv_prim(c, CPU_OP_CONV_BWD_WEIGHTS, x, dw->shape, db != NULL, dy, p, &ew));
    CH_TRY(conv_prim(c, CPU_OP_CONV_BWD_DATA, dx, w->shape, 0, dy, p, &ed));
    void *dyh = NULL;
    if (same_dy_cast(ew, ed)) {
        /* dy rounded to bf16 once, into the backward-weights buffer */
        ch_cpu_cast_bf16(c, handle(dy), ew->xbuf[1], ew->xcast[1]);
        dyh = ew->xbuf[1];
    }
    CH_TRY(bwd_weights_run(c, ew, x, dy, dw, db, dyh));
    return bwd_data_run(c, ed, dy, w, dx, dyh);
}

/* -------------------------------------------------------------- linear */

/* ---- bf16 linear layers (compute.precision = bf16): oneDNN matmul with
 * bf16 operands and fp32 accumulation and output. C (m, n) = op(A) op(B),
 * A and B fp32 row-major as for sgemm (ta / tb 'N' or 'T': A stored (m, k)
 * or (k, m), B (k, n) or (n, k)), rounded to bf16 (round to nearest even,
 * as oneDNN's reorders and torch's .to(bfloat16)) into the primitive's
 * buffers; B from a versioned weight tensor wt is converted once per data
 * version (kept_weights); Bh, where not NULL, is B already in bf16 (the
 * small-map convolutions' kept dense weights) and B is not read. */


typedef struct {
    const ch_cpu_t *c;
    const float *src;
    int64_t n;
} bf16_conv_ctx;

static ch_status bf16_convert(void *ctx, void *dst)
{
    bf16_conv_ctx *d = ctx;
    ch_cpu_cast_bf16(d->c, d->src, dst, d->n);
    return CH_OK;
}

/* The matmul primitive for (m, n, k, ta, tb): mem[0] A, mem[1] B (bf16, over
 * xbuf[0] / xbuf[1] or the kept weights), mem[2] C (fp32). */
static ch_status bf16_matmul_prim(ch_cpu_t *c, int64_t m, int64_t n, int64_t k, char ta, char tb,
                                  cpu_prim **out)
{
    int64_t key[CPU_KEY_LEN] = {0};
    key[0] = CPU_OP_MATMUL_BF16;
    key[1] = m;
    key[2] = n;
    key[3] = k;
    key[4] = ta;
    key[5] = tb;
    cpu_prim *e = ch_cpu_cache_find(c, key);
    if (e) {
        *out = e;
        return CH_OK;
    }
    e = calloc(1, sizeof *e);
    if (!e) return CH_ERROR(CH_ERR_NOMEM, "linear: out of memory");
    memcpy(e->key, key, sizeof key);
    dnnl_memory_desc_t amd, bmd, cmd;
    dnnl_dims_t ad = {m, k}, bd = {k, n}, cd = {m, n};
    dnnl_dims_t as = {ta == 'N' ? k : 1, ta == 'N' ? 1 : m};
    dnnl_dims_t bs = {tb == 'N' ? n : 1, tb == 'N' ? 1 : k};
    dnnl_primitive_desc_t pd = NULL;
    dnnl_matmul_desc_t md;
    ch_status s = CH_OK;
    dnnl_status_t ds = dnnl_memory_desc_init_by_strides(&amd, 2, ad, dnnl_bf16, as);
    if (ds == dnnl_success) ds = dnnl_memory_desc_init_by_strides(&bmd, 2, bd, dnnl_bf16, bs);
    if (ds == dnnl_success) ds = dnnl_memory_desc_init_by_tag(&cmd, 2, cd, dnnl_f32, dnnl_ab);
    if (ds == dnnl_success) ds = dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd);
    if (ds == dnnl_success) ds = dnnl_primitive_desc_create(&pd, &md, c->attr, c->engine, NULL);
    if (ds == dnnl_success) ds = dnnl_primitive_create(&e->prim, pd);
    if (ds != dnnl_success)
        s = CH_ERROR(CH_ERR_DNNL, "bf16 matmul %lldx%lldx%lld (%c%c): %s", (long long)m,
                     (long long)n, (long long)k, ta, tb, ch_dnnl_status_string((int)ds));
    if (s == CH_OK && ch_cpu_pd_is_ref(pd))
        ch_log_warn("cohort: oneDNN has only a reference (slow) kernel for the bf16 matmul "
                    "%lldx%lldx%lld (%c%c) on ISA %s",
                    (long long)m, (long long)n, (long long)k, ta, tb, ch_cpu_isa_name());
    if (s == CH_OK) s = setup_scratch(c, pd, e);
    if (s == CH_OK) s = mem_create(c, &amd, MEM_NONE, &e->mem[0]);
    if (s == CH_OK) s = mem_create(c, &bmd, MEM_NONE, &e->mem[1]);
    if (s == CH_OK) s = mem_create(c, &cmd, MEM_NONE, &e->mem[2]);
    e->wbytes = (size_t)(k * n) * sizeof(uint16_t);
    size_t abytes = (size_t)(m * k) * sizeof(uint16_t);
    if (s == CH_OK) {
        e->xbuf[0] = aligned_alloc(64, (abytes + 63) / 64 * 64);
        e->xbuf[1] = aligned_alloc(64, (e->wbytes + 63) / 64 * 64);
        if (!e->xbuf[0] || !e->xbuf[1])
            s = CH_ERROR(CH_ERR_NOMEM, "linear: bf16 buffers of %zu and %zu bytes", abytes,
                         e->wbytes);
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (s != CH_OK) {
        ch_cpu_prim_free(e);
        return s;
    }
    CH_TRY(ch_cpu_cache_add(c, e));
    *out = e;
    return CH_OK;
}

static ch_status bf16_matmul(ch_cpu_t *c, char ta, char tb, int64_t m, int64_t n, int64_t k,
                             const float *A, const float *B, const ch_tensor_t *wt,
                             const void *Bh, float *C)
{
    cpu_prim *e;
    CH_TRY(bf16_matmul_prim(c, m, n, k, ta, tb, &e));
    ch_cpu_cast_bf16(c, A, e->xbuf[0], m * k);
    void *bb = e->xbuf[1];
    if (Bh) {
        bb = (void *)Bh;
    } else if (wt) {
        bf16_conv_ctx d = {c, B, k * n};
        wconvert cv = {bf16_convert, &d, e->wbytes, e->xbuf[1]};
        CH_TRY(kept_weights(c, e, wt, &cv, &bb));
    } else {
        ch_cpu_cast_bf16(c, B, bb, k * n);
    }
    CH_TRY(set_handle(e->mem[0], e->xbuf[0]));
    CH_TRY(set_handle(e->mem[1], bb));
    CH_TRY(set_handle(e->mem[2], C));
    dnnl_exec_arg_t a[4] = {{DNNL_ARG_SRC, e->mem[0]},
                            {DNNL_ARG_WEIGHTS, e->mem[1]},
                            {DNNL_ARG_DST, e->mem[2]}};
    int na = 3;
    CH_TRY(add_scratch(c, e, a, &na));
    return exec(c, e->prim, na, a);
}

ch_status ch_cpu_linear_forward(void *st, const ch_tensor_t *x, const ch_tensor_t *w,
                                const ch_tensor_t *b, ch_tensor_t *y)
{
    ch_cpu_t *c = st;
    ch_cpu_threads(c);
    int64_t N = x->shape[0], K = x->shape[1], M = w->shape[0];
    float *Y = y->data;
    if (c->bf16_missing) return bf16_refused("linear forward");
    if (N == 0 || M == 0) return CH_OK;
    if (K == 0) {
        memset(Y, 0, (size_t)(N * M) * sizeof(float));
    } else if (c->bf16) {
        CH_TRY(bf16_matmul(c, 'N', 'T', N, M, K, x->data, w->data, w, NULL, Y));
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
    ch_cpu_t *c = st;
    ch_cpu_threads(c);
    int64_t N = dy->shape[0], M = w->shape[0], K = w->shape[1];
    if (c->bf16_missing) return bf16_refused("linear backward data");
    if (N == 0 || K == 0) return CH_OK;
    if (M == 0) {
        memset(dx->data, 0, dx->nbytes);
        return CH_OK;
    }
    if (c->bf16) return bf16_matmul(c, 'N', 'N', N, K, M, dy->data, w->data, w, NULL, dx->data);
    CH_CHECK_DNNL(dnnl_sgemm('N', 'N', N, K, M, 1.0f, dy->data, M, w->data, K, 0.0f, dx->data, K));
    return CH_OK;
}

ch_status ch_cpu_linear_backward_weights(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                         ch_tensor_t *dw, ch_tensor_t *db)
{
    ch_cpu_t *c = st;
    ch_cpu_threads(c);
    int64_t N = x->shape[0], K = x->shape[1], M = dy->shape[1];
    if (c->bf16_missing) return bf16_refused("linear backward weights");
    if (N == 0 || M == 0 || K == 0) {
        if (dw->nbytes) memset(dw->data, 0, dw->nbytes);
    } else if (c->bf16) {
        CH_TRY(bf16_matmul(c, 'T', 'N', M, K, N, dy->data, x->data, NULL, NULL, dw->data));
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
