/* cohort: CPU backend state — oneDNN engine and stream, primitive cache,
 * shared scratchpad, threads, and the backend table. */
#include "config.h"

#include "framework/ops/cpu/cpu.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ch_layout_t auto_layout(void)
{
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    if ((isa & (unsigned)dnnl_cpu_isa_avx512_core) == (unsigned)dnnl_cpu_isa_avx512_core)
        return CH_LAYOUT_NCHW16C;
    if ((isa & (unsigned)dnnl_cpu_isa_avx2) == (unsigned)dnnl_cpu_isa_avx2)
        return CH_LAYOUT_NCHW8C;
    return CH_LAYOUT_PLAIN;
}

static void cpu_destroy(void *state);

static ch_status cpu_create(void **state, const ch_compute_options_t *o)
{
    ch_cpu_t *c = calloc(1, sizeof *c);
    if (!c) return CH_ERROR(CH_ERR_NOMEM, "cpu backend: out of memory");
    *state = c;
    ch_status s = CH_OK;
#define TRYD(call)                                                                    \
    do {                                                                              \
        dnnl_status_t e_ = (call);                                                    \
        if (e_ != dnnl_success) {                                                     \
            s = CH_ERROR(CH_ERR_DNNL, "%s failed: %s", #call,                         \
                         ch_dnnl_status_string((int)e_));                             \
            goto fail;                                                                \
        }                                                                             \
    } while (0)
    TRYD(dnnl_engine_create(&c->engine, dnnl_cpu, 0));
    TRYD(dnnl_stream_create(&c->stream, c->engine, dnnl_stream_default_flags));
    TRYD(dnnl_primitive_attr_create(&c->attr));
    TRYD(dnnl_primitive_attr_set_scratchpad_mode(c->attr, dnnl_scratchpad_mode_user));
#undef TRYD
    c->nthreads = o->num_threads;
    if (o->cpu_conv_algorithm < CH_CPU_CONV_DIRECT || o->cpu_conv_algorithm > CH_CPU_CONV_WINOGRAD) {
        s = CH_ERROR(CH_ERR_INVALID,
                     "cpu backend: cpu_conv_algorithm %d: expected CH_CPU_CONV_DIRECT (0), "
                     "CH_CPU_CONV_AUTO (1) or CH_CPU_CONV_WINOGRAD (2)",
                     o->cpu_conv_algorithm);
        goto fail;
    }
    c->conv_alg = o->cpu_conv_algorithm;
    /* compute.precision = bf16: on where the ISA has bf16; else the first
     * CPU convolution or linear layer fails (a GPU rank's context asks for
     * bf16 too; the CPU ranks' jobs refuse it at start, runtime/job.c) */
    c->bf16 = o->bf16 && ch_compute_cpu_has_bf16();
    c->bf16_missing = o->bf16 && !c->bf16;
    c->layout = o->cpu_layout >= 0 ? (ch_layout_t)o->cpu_layout
                : c->bf16           ? CH_LAYOUT_NHWC
                                    : auto_layout();
    {
        const char *wc = getenv("COHORT_WEIGHT_CACHE");
        c->wcache_mode = 1;
        if (wc && (!strcmp(wc, "0") || !strcmp(wc, "off"))) c->wcache_mode = 0;
        else if (wc && !strcmp(wc, "check")) c->wcache_mode = 2;
        else if (wc && *wc && strcmp(wc, "1") && strcmp(wc, "on")) {
            s = CH_ERROR(CH_ERR_INVALID,
                         "COHORT_WEIGHT_CACHE=%s: expected 1/on (default), 0/off or check", wc);
            goto fail;
        }
    }
    if (o->num_threads > 0) omp_set_num_threads(o->num_threads);
    return CH_OK;
fail:
    cpu_destroy(c);
    *state = NULL;
    return s;
}

void ch_cpu_prim_free(cpu_prim *p)
{
    if (!p) return;
    if (p->prim) dnnl_primitive_destroy(p->prim);
    if (p->wreorder) dnnl_primitive_destroy(p->wreorder);
    for (int i = 0; i < CPU_MAX_MEM; i++)
        if (p->mem[i]) dnnl_memory_destroy(p->mem[i]);
    if (p->scratch_mem) dnnl_memory_destroy(p->scratch_mem);
    if (p->wuser_mem) dnnl_memory_destroy(p->wuser_mem);
    if (p->wprim_mem) dnnl_memory_destroy(p->wprim_mem);
    for (int i = 0; i < 2; i++) {
        if (p->xreorder[i]) dnnl_primitive_destroy(p->xreorder[i]);
        if (p->xuser_mem[i]) dnnl_memory_destroy(p->xuser_mem[i]);
        free(p->xbuf[i]);
    }
    free(p->wbuf);
    free(p->cbuf);
    for (int i = 0; i < CPU_WSLOTS; i++) free(p->wslot[i].buf);
    free(p);
}

static void cpu_destroy(void *state)
{
    ch_cpu_t *c = state;
    if (!c) return;
    for (size_t i = 0; i < c->ncache; i++) ch_cpu_prim_free(c->cache[i]);
    free(c->cache);
    free(c->scratch);
    free(c->dtmp);
    free(c->ftmp);
    if (c->attr) dnnl_primitive_attr_destroy(c->attr);
    if (c->stream) dnnl_stream_destroy(c->stream);
    if (c->engine) dnnl_engine_destroy(c->engine);
    free(c);
}

void ch_cpu_threads(const ch_cpu_t *c)
{
    if (c->nthreads > 0 && omp_get_max_threads() != c->nthreads) omp_set_num_threads(c->nthreads);
}

static ch_status cpu_set_num_threads(void *state, int n)
{
    ((ch_cpu_t *)state)->nthreads = n;
    omp_set_num_threads(n);
    return CH_OK;
}

static int cpu_num_threads(const void *state)
{
    (void)state;
    return omp_get_max_threads();
}

/* The context's layout where its block divides the channels; with nChw16c,
 * nChw8c for channel counts that are multiples of 8 only (24, 40, 56, ...:
 * oneDNN's jit kernels instead of the gemm-based ones plain NCHW gets, and
 * the 8-lane vector loops of the C ops: shufflenet_v2's 24-channel stage,
 * docs/PERFORMANCE.md "Networks from ONNX"); else plain. */
static ch_layout_t cpu_preferred_layout(const void *state, int64_t channels)
{
    const ch_cpu_t *c = state;
    int b = ch_layout_block(c->layout);
    if (channels <= 0) return CH_LAYOUT_PLAIN;
    if (b == 16 && channels % 16 != 0 && channels % 8 == 0) return CH_LAYOUT_NCHW8C;
    if (b && channels % b != 0) return CH_LAYOUT_PLAIN;
    return c->layout;
}

static const char *isa_name(dnnl_cpu_isa_t isa)
{
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
    }
}

const char *ch_cpu_isa_name(void) { return isa_name(dnnl_get_effective_cpu_isa()); }

const char *ch_compute_cpu_isa(void) { return ch_cpu_isa_name(); }

int ch_compute_cpu_has_bf16(void)
{
    /* oneDNN's ISA values are bit sets, each containing the ones below it */
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    return (isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) ==
           (unsigned)dnnl_cpu_isa_avx512_core_bf16;
}

/* pd's implementation name (dnnl_query_impl_info_str), "" if unknown. */
static const char *pd_impl(const_dnnl_primitive_desc_t pd)
{
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success ||
        !impl)
        return "";
    return impl;
}

int ch_cpu_pd_is_ref(const_dnnl_primitive_desc_t pd) { return strncmp(pd_impl(pd), "ref", 3) == 0; }

int ch_cpu_pd_is_winograd(const_dnnl_primitive_desc_t pd)
{
    return strstr(pd_impl(pd), "wino") != NULL;
}

static const char *runtime_name(unsigned r)
{
    switch (r) {
    case DNNL_RUNTIME_SEQ: return "sequential";
    case DNNL_RUNTIME_OMP: return "OpenMP";
    case DNNL_RUNTIME_TBB: return "TBB";
    case DNNL_RUNTIME_THREADPOOL: return "threadpool";
    default: return "other";
    }
}

static void cpu_describe(const void *state, char *buf, size_t len)
{
    const ch_cpu_t *c = state;
    const dnnl_version_t *v = dnnl_version();
    int n = snprintf(buf, len, "oneDNN %d.%d.%d (cpu runtime %s, isa %s), %d threads, layout %s",
                     v->major, v->minor, v->patch, runtime_name(v->cpu_runtime),
                     ch_cpu_isa_name(), omp_get_max_threads(), ch_layout_name(c->layout));
    if (c->bf16 && n >= 0 && (size_t)n < len) {
        int m = snprintf(buf + n, len - (size_t)n, ", bf16 convolutions and linear layers");
        if (m > 0) n += m;
    }
    if (c->conv_alg != CH_CPU_CONV_DIRECT && n >= 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, ", 3x3 convolutions %s%s",
                 ch_compute_cpu_conv_algorithm_names[c->conv_alg],
                 strncmp(ch_cpu_isa_name(), "avx512_core", 11) == 0
                     ? ""
                     : " (none on this ISA: direct)");
}

static size_t cpu_cache_entries(const void *state) { return ((const ch_cpu_t *)state)->ncache; }

static void cpu_weight_conversions(const void *state, int64_t *converted, int64_t *reused)
{
    const ch_cpu_t *c = state;
    *converted = c->wconverted;
    *reused = c->wreused;
}

static int64_t cpu_winograd_primitives(const void *state)
{
    return ((const ch_cpu_t *)state)->nwinograd;
}

static size_t cpu_scratchpad_bytes(const void *state)
{
    return ((const ch_cpu_t *)state)->scratch_bytes;
}

static ch_status cpu_sync(void *state)
{
    ch_cpu_t *c = state;
    CH_CHECK_DNNL(dnnl_stream_wait(c->stream));
    return CH_OK;
}

/* ---------------------------------------------------------------- cache */

static uint64_t key_hash(const int64_t *k)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < CPU_KEY_LEN; i++) {
        h ^= (uint64_t)k[i];
        h *= 1099511628211ull;
    }
    return h;
}

cpu_prim *ch_cpu_cache_find(ch_cpu_t *c, const int64_t *key)
{
    uint64_t h = key_hash(key);
    for (size_t i = 0; i < c->ncache; i++) {
        cpu_prim *p = c->cache[i];
        if (p->hash == h && memcmp(p->key, key, sizeof p->key) == 0) {
            /* move to front half: recently used entries are found sooner */
            if (i > 0) {
                cpu_prim *t = c->cache[i - 1];
                c->cache[i - 1] = p;
                c->cache[i] = t;
            }
            return p;
        }
    }
    return NULL;
}

ch_status ch_cpu_cache_add(ch_cpu_t *c, cpu_prim *p)
{
    if (c->ncache == c->capcache) {
        size_t nc = c->capcache ? c->capcache * 2 : 64;
        cpu_prim **n = realloc(c->cache, nc * sizeof *n);
        if (!n) {
            ch_cpu_prim_free(p);
            return CH_ERROR(CH_ERR_NOMEM, "cpu backend: primitive cache cannot grow");
        }
        c->cache = n;
        c->capcache = nc;
    }
    p->hash = key_hash(p->key);
    c->cache[c->ncache++] = p;
    return CH_OK;
}

ch_status ch_cpu_scratch_reserve(ch_cpu_t *c, size_t bytes)
{
    if (bytes <= c->scratch_bytes) return CH_OK;
    size_t rounded = (bytes + 4095) / 4096 * 4096;
    void *n = aligned_alloc(64, rounded);
    if (!n) return CH_ERROR(CH_ERR_NOMEM, "cpu backend: scratchpad of %zu bytes", rounded);
    free(c->scratch);
    c->scratch = n;
    c->scratch_bytes = rounded;
    return CH_OK;
}

ch_status ch_cpu_dtmp(ch_cpu_t *c, size_t n, double **out)
{
    if (n > c->dtmp_n) {
        size_t nn = n < 4096 ? 4096 : n;
        double *d = realloc(c->dtmp, nn * sizeof *d);
        if (!d) return CH_ERROR(CH_ERR_NOMEM, "cpu backend: %zu per-channel temporaries", n);
        c->dtmp = d;
        c->dtmp_n = nn;
    }
    *out = c->dtmp;
    return CH_OK;
}

ch_status ch_cpu_ftmp(ch_cpu_t *c, size_t n, float **out)
{
    if (n > c->ftmp_n) {
        size_t nn = n < 8192 ? 8192 : n;
        float *d = realloc(c->ftmp, nn * sizeof *d);
        if (!d) return CH_ERROR(CH_ERR_NOMEM, "cpu backend: %zu per-channel temporaries", n);
        c->ftmp = d;
        c->ftmp_n = nn;
    }
    *out = c->ftmp;
    return CH_OK;
}

void ch_cpu_md_of(dnnl_memory_desc_t *md, const ch_tensor_t *t)
{
    dnnl_dims_t d;
    for (int i = 0; i < t->ndim; i++) d[i] = t->shape[i];
    dnnl_format_tag_t tag = dnnl_a;
    if (t->ndim == 4) {
        switch (t->layout) {
        case CH_LAYOUT_NHWC: tag = dnnl_nhwc; break;
        case CH_LAYOUT_NCHW8C: tag = dnnl_nChw8c; break;
        case CH_LAYOUT_NCHW16C: tag = dnnl_nChw16c; break;
        default: tag = dnnl_nchw; break;
        }
    } else if (t->ndim == 3) {
        tag = dnnl_abc;
    } else if (t->ndim == 2) {
        tag = dnnl_ab;
    }
    dnnl_memory_desc_init_by_tag(md, t->ndim, d, dnnl_f32, tag);
}

void ch_cpu_split(int64_t n, int64_t *i0, int64_t *i1)
{
    int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    int64_t units = (n + CH_CPU_PAR_ALIGN - 1) / CH_CPU_PAR_ALIGN;
    int64_t per = units / nt, extra = units % nt;
    int64_t u0 = t * per + (t < extra ? t : extra), u1 = u0 + per + (t < extra);
    *i0 = u0 * CH_CPU_PAR_ALIGN < n ? u0 * CH_CPU_PAR_ALIGN : n;
    *i1 = u1 * CH_CPU_PAR_ALIGN < n ? u1 * CH_CPU_PAR_ALIGN : n;
}

cpu_cview ch_cpu_cview(const ch_tensor_t *t)
{
    cpu_cview v;
    v.N = t->shape[0];
    v.C = t->ndim >= 2 ? t->shape[1] : 1;
    v.HW = t->ndim == 4 ? t->shape[2] * t->shape[3] : 1;
    switch (t->ndim == 4 ? t->layout : CH_LAYOUT_PLAIN) {
    case CH_LAYOUT_NHWC: v.B = v.C; break;
    case CH_LAYOUT_NCHW8C: v.B = 8; break;
    case CH_LAYOUT_NCHW16C: v.B = 16; break;
    default: v.B = 1; break;
    }
    if (v.B < 1) v.B = 1;
    v.nb = v.C / v.B;
    return v;
}

/* ---------------------------------------------------------------- table */

static const ch_ops_backend_t cpu_backend = {
    .name = "cpu",
    .create = cpu_create,
    .destroy = cpu_destroy,
    .set_num_threads = cpu_set_num_threads,
    .num_threads = cpu_num_threads,
    .preferred_layout = cpu_preferred_layout,
    .describe = cpu_describe,
    .cache_entries = cpu_cache_entries,
    .weight_conversions = cpu_weight_conversions,
    .winograd_primitives = cpu_winograd_primitives,
    .scratchpad_bytes = cpu_scratchpad_bytes,
    .sync = cpu_sync,
    .reorder = ch_cpu_reorder,
    .fill = ch_cpu_fill,
    .copy = ch_cpu_copy,
    .conv2d_forward = ch_cpu_conv2d_forward,
    .conv2d_backward_data = ch_cpu_conv2d_backward_data,
    .conv2d_backward_weights = ch_cpu_conv2d_backward_weights,
    .conv2d_backward = ch_cpu_conv2d_backward,
    .bn_stats = ch_cpu_bn_stats,
    .bn_apply = ch_cpu_bn_apply,
    .bn_update_running = ch_cpu_bn_update_running,
    .bn_gather_stats = ch_cpu_bn_gather_stats,
    .bn_backward_reduce = ch_cpu_bn_backward_reduce,
    .bn_param_grads = ch_cpu_bn_param_grads,
    .bn_backward_elemt = ch_cpu_bn_backward_elemt,
    .bn_backward = ch_cpu_bn_backward,
    .relu_forward = ch_cpu_relu_forward,
    .relu_backward = ch_cpu_relu_backward,
    .act_forward = ch_cpu_act_forward,
    .act_backward = ch_cpu_act_backward,
    .ln2d_forward = ch_cpu_ln2d_forward,
    .ln2d_backward = ch_cpu_ln2d_backward,
    .maxpool_forward = ch_cpu_maxpool_forward,
    .maxpool_backward = ch_cpu_maxpool_backward,
    .avgpool_global_forward = ch_cpu_avgpool_global_forward,
    .avgpool_global_backward = ch_cpu_avgpool_global_backward,
    .avgpool_forward = ch_cpu_avgpool_forward,
    .avgpool_backward = ch_cpu_avgpool_backward,
    .adaptive_avgpool_forward = ch_cpu_adaptive_avgpool_forward,
    .adaptive_avgpool_backward = ch_cpu_adaptive_avgpool_backward,
    .linear_forward = ch_cpu_linear_forward,
    .linear_backward_data = ch_cpu_linear_backward_data,
    .linear_backward_weights = ch_cpu_linear_backward_weights,
    .add = ch_cpu_add,
    .scale = ch_cpu_scale,
    .cross_entropy = ch_cpu_cross_entropy,
    .argmax = ch_cpu_argmax,
    .count_correct = ch_cpu_count_correct,
    .sgd_step = ch_cpu_sgd_step,
    .dropout = ch_cpu_dropout,
    .mul_channel = ch_cpu_mul_channel,
    .mul_channel_backward = ch_cpu_mul_channel_backward,
    .concat_channels = ch_cpu_concat_channels,
    .split_channels = ch_cpu_split_channels,
    .binary = ch_cpu_binary,
    .binary_backward = ch_cpu_binary_backward,
    .copy_channels = ch_cpu_copy_channels,
    .channel_shuffle = ch_cpu_channel_shuffle,
    .affine = ch_cpu_affine,
    .adamw_step = ch_cpu_adamw_step,
    .rmsprop_step = ch_cpu_rmsprop_step,
    .cross_entropy_smooth = ch_cpu_cross_entropy_smooth,
};

const ch_ops_backend_t *ch_ops_cpu_backend(void) { return &cpu_backend; }
