/* cohort: CPU backend internals (oneDNN engine/stream, primitive cache,
 * scratch buffers). Not installed; see framework/ops/backend.h. */
#ifndef COHORT_OPS_CPU_H
#define COHORT_OPS_CPU_H

#include <oneapi/dnnl/dnnl.h>

#include "framework/ops/backend.h"

/* Hot C loops are compiled for AVX-512, AVX2+FMA and baseline x86-64 and
 * picked at load time (GCC function multiversioning). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CH_CPU_SIMD __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CH_CPU_SIMD
#endif

#define CPU_KEY_LEN 28
#define CPU_MAX_MEM 8

typedef enum {
    CPU_OP_REORDER = 1,
    CPU_OP_CONV_FWD,
    CPU_OP_CONV_BWD_DATA,
    CPU_OP_CONV_BWD_WEIGHTS,
    CPU_OP_CONV_GEMM,
    CPU_OP_ELTWISE_FWD, /* eltwise.c: activations */
    CPU_OP_ELTWISE_BWD,
    CPU_OP_MATMUL_BF16 /* conv.c: bf16 linear layers */
} cpu_op_kind;

/* Converted weights kept between calls (conv.c): the kernel-format copy of
 * the versioned weight tensor at `ptr` as it was at data version `version`
 * (framework/tensor/tensor.h). A primitive serves every layer of its shape,
 * so it keeps up to CPU_WSLOTS of them (resnet50's layer3 has 6 blocks of
 * one shape), least recently used replaced first. */
#define CPU_WSLOTS 32
typedef struct {
    const void *ptr;             /* the plain weights' data pointer, NULL = free */
    uint64_t version;            /* ch_tensor_data_version() at conversion */
    uint64_t used;               /* ch_cpu_t.wtick at last use */
    void *buf;                   /* the converted weights (wbytes) */
} cpu_wslot;

/* One cached primitive with its memory objects (handles set per call). */
typedef struct cpu_prim {
    int64_t key[CPU_KEY_LEN];
    uint64_t hash;
    dnnl_primitive_t prim;
    dnnl_primitive_t wreorder;   /* weights reorder (user<->primitive format) or NULL */
    dnnl_memory_t mem[CPU_MAX_MEM];
    dnnl_memory_t scratch_mem;   /* NULL when the primitive needs no scratchpad */
    dnnl_memory_t wuser_mem;     /* plain OIHW weights (user side of the reorder) */
    dnnl_memory_t wprim_mem;     /* weights in the primitive's format, over wbuf */
    void *wbuf;
    size_t wbytes;
    int cropped;                 /* primitive uses only some kernel taps (conv.c) */
    int64_t wfull[4];            /* full OIHW weight shape (cropped case) */
    int64_t k0[2], kk[2];        /* first tap and extent kept, (h, w) */
    float *cbuf;                 /* compact plain copy of the kept taps */
    int wfmt;                    /* weights reorder done in C (conv.c), 0 = oneDNN's */
    int wblock;                  /* its channel tile width (8 or 16) */
    int64_t wdims[4];            /* weights dims the primitive sees (cropped) */
    cpu_wslot wslot[CPU_WSLOTS]; /* converted weights kept (forward, backward data) */
    /* Activations in another format than their tensors' layouts (conv.c: the
     * tensors' own layouts got only a reference kernel). Per side s (0 = the
     * a-side activation, 1 = the b-side, see conv.c's conv_prim): mem[s]
     * lies over xbuf[s] in the primitive's format, xuser_mem[s] over the
     * tensor, xreorder[s] converts between them (tensor -> primitive for
     * inputs, primitive -> tensor for outputs); NULL where the formats
     * agree. */
    dnnl_primitive_t xreorder[2];
    dnnl_memory_t xuser_mem[2];
    void *xbuf[2];
    /* bf16 inputs whose tensor has the primitive's format in fp32 (nhwc,
     * compute.precision = bf16): xcast[s] = element count, converted into
     * xbuf[s] by ch_cpu_cast_bf16 instead of a reorder; 0 elsewhere */
    int64_t xcast[2];
} cpu_prim;

typedef struct ch_cpu {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    dnnl_primitive_attr_t attr; /* user-managed scratchpad */
    ch_layout_t layout;         /* preferred activation layout */
    int nthreads;               /* requested OpenMP threads, 0 = runtime default */
    int conv_alg;               /* CH_CPU_CONV_* of the 3x3 stride-1 convolutions (conv.c) */
    int bf16;                   /* compute.precision = bf16 on a bf16 ISA (conv.c) */
    int bf16_missing;           /* bf16 asked for, the ISA has none: conv/linear fail */
    int wino_missing_logged;    /* conv_alg WINOGRAD found no Winograd kernel: said once */
    int64_t nwinograd;          /* convolution primitives created with a Winograd kernel */
    cpu_prim **cache;
    size_t ncache, capcache;
    void *scratch;              /* shared scratchpad, grown at primitive creation */
    size_t scratch_bytes;
    double *dtmp;               /* per-channel temporaries for C kernels */
    size_t dtmp_n;
    float *ftmp;
    size_t ftmp_n;
    /* weight conversion cache (conv.c): mode from COHORT_WEIGHT_CACHE at
     * creation (0 off, 1 on, 2 check every reuse), use clock, counters of
     * ch_compute_weight_conversions */
    int wcache_mode;
    uint64_t wtick;
    int64_t wconverted, wreused;
} ch_cpu_t;

/* ---- cache and scratch (backend.c) */
/* Apply the context's thread count to the calling thread (OpenMP's setting
 * is per thread; ops may be called from another thread than the creator). */
void ch_cpu_threads(const ch_cpu_t *c);
cpu_prim *ch_cpu_cache_find(ch_cpu_t *c, const int64_t *key);
ch_status ch_cpu_cache_add(ch_cpu_t *c, cpu_prim *p); /* takes ownership */
void ch_cpu_prim_free(cpu_prim *p);
/* make the shared scratchpad at least `bytes` long */
ch_status ch_cpu_scratch_reserve(ch_cpu_t *c, size_t bytes);
/* per-channel double temporaries: at least n doubles */
ch_status ch_cpu_dtmp(ch_cpu_t *c, size_t n, double **out);
ch_status ch_cpu_ftmp(ch_cpu_t *c, size_t n, float **out);
void ch_cpu_md_of(dnnl_memory_desc_t *md, const ch_tensor_t *t);
/* oneDNN's effective instruction set (after ONEDNN_MAX_CPU_ISA), lower
 * case: "sse41", "avx", "avx2", "avx512_core", ...; "other" if unknown. */
const char *ch_cpu_isa_name(void);
/* Nonzero when pd is one of oneDNN's reference implementations
 * (dnnl_query_impl_info_str starts with "ref"): correct but often 10-1000x
 * slower than the jit/gemm ones. */
int ch_cpu_pd_is_ref(const_dnnl_primitive_desc_t pd);
/* Nonzero when pd is a Winograd implementation (impl name "jit_wino_..."). */
int ch_cpu_pd_is_winograd(const_dnnl_primitive_desc_t pd);

/* ---- oneDNN ops (conv.c) */
ch_status ch_cpu_reorder(void *st, const ch_tensor_t *src, ch_tensor_t *dst);
ch_status ch_cpu_conv2d_forward(void *st, const ch_tensor_t *x, const ch_tensor_t *w,
                                const ch_tensor_t *b, const ch_conv2d_params_t *p,
                                ch_tensor_t *y);
ch_status ch_cpu_conv2d_backward_data(void *st, const ch_tensor_t *dy, const ch_tensor_t *w,
                                      const ch_conv2d_params_t *p, ch_tensor_t *dx);
ch_status ch_cpu_conv2d_backward_weights(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                         const ch_conv2d_params_t *p, ch_tensor_t *dw,
                                         ch_tensor_t *db);
/* Both backward ops of one convolution (ops.h ch_op_conv2d_backward): with
 * bf16 nhwc activations dy is rounded to bf16 once for both. */
ch_status ch_cpu_conv2d_backward(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                 const ch_tensor_t *w, const ch_conv2d_params_t *p,
                                 ch_tensor_t *dx, ch_tensor_t *dw, ch_tensor_t *db);
ch_status ch_cpu_linear_forward(void *st, const ch_tensor_t *x, const ch_tensor_t *w,
                                const ch_tensor_t *b, ch_tensor_t *y);
ch_status ch_cpu_linear_backward_data(void *st, const ch_tensor_t *dy, const ch_tensor_t *w,
                                      ch_tensor_t *dx);
ch_status ch_cpu_linear_backward_weights(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                         ch_tensor_t *dw, ch_tensor_t *db);

/* ---- plain C kernels (kernels.c, batchnorm.c) */
ch_status ch_cpu_fill(void *st, ch_tensor_t *t, float value);
ch_status ch_cpu_copy(void *st, const ch_tensor_t *src, ch_tensor_t *dst);
ch_status ch_cpu_add(void *st, const ch_tensor_t *a, const ch_tensor_t *b, ch_tensor_t *out);
ch_status ch_cpu_scale(void *st, ch_tensor_t *t, float alpha);
/* dropout.c: ops.h ch_op_dropout */
ch_status ch_cpu_dropout(void *st, const ch_tensor_t *x, float p, const ch_dropout_key_t *key,
                         ch_tensor_t *y);
ch_status ch_cpu_relu_forward(void *st, const ch_tensor_t *x, ch_tensor_t *y);
ch_status ch_cpu_relu_backward(void *st, const ch_tensor_t *y, const ch_tensor_t *dy,
                               ch_tensor_t *dx);
ch_status ch_cpu_maxpool_forward(void *st, const ch_tensor_t *x, const ch_pool2d_params_t *p,
                                 ch_tensor_t *y);
ch_status ch_cpu_maxpool_backward(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                  const ch_pool2d_params_t *p, ch_tensor_t *dx);
ch_status ch_cpu_avgpool_forward(void *st, const ch_tensor_t *x, const ch_pool2d_params_t *p,
                                 ch_tensor_t *y);
ch_status ch_cpu_avgpool_backward(void *st, const ch_tensor_t *dy, const ch_pool2d_params_t *p,
                                  ch_tensor_t *dx);
ch_status ch_cpu_adaptive_avgpool_forward(void *st, const ch_tensor_t *x, ch_tensor_t *y);
ch_status ch_cpu_adaptive_avgpool_backward(void *st, const ch_tensor_t *dy, ch_tensor_t *dx);
ch_status ch_cpu_avgpool_global_forward(void *st, const ch_tensor_t *x, ch_tensor_t *y);
ch_status ch_cpu_avgpool_global_backward(void *st, const ch_tensor_t *dy, ch_tensor_t *dx);
ch_status ch_cpu_cross_entropy(void *st, const ch_tensor_t *logits, const ch_tensor_t *labels,
                               ch_tensor_t *loss, ch_tensor_t *dlogits);
ch_status ch_cpu_argmax(void *st, const ch_tensor_t *logits, ch_tensor_t *out);
ch_status ch_cpu_count_correct(void *st, const ch_tensor_t *logits, const ch_tensor_t *labels,
                               int64_t *correct);
/* fused SGD (ops.h ch_op_sgd_step): framework/train/optim.c's per-element float
 * arithmetic, one loop per parameter */
ch_status ch_cpu_sgd_step(void *st, const ch_sgd_tensor_t *ts, int n, const ch_sgd_hparams_t *h);
/* optim_kernels.c: AdamW, RMSprop (ops.h order of float32 operations) and
 * cross-entropy with label smoothing */
ch_status ch_cpu_adamw_step(void *st, const ch_adamw_tensor_t *ts, int n,
                            const ch_adamw_hparams_t *h);
ch_status ch_cpu_rmsprop_step(void *st, const ch_rmsprop_tensor_t *ts, int n,
                              const ch_rmsprop_hparams_t *h);
ch_status ch_cpu_cross_entropy_smooth(void *st, const ch_tensor_t *logits,
                                      const ch_tensor_t *labels, double e, ch_tensor_t *loss,
                                      ch_tensor_t *dlogits);

ch_status ch_cpu_bn_stats(void *st, const ch_tensor_t *x, ch_tensor_t *mean, ch_tensor_t *var);
ch_status ch_cpu_bn_apply(void *st, const ch_tensor_t *x, const ch_tensor_t *mean,
                          const ch_tensor_t *var, const ch_tensor_t *weight,
                          const ch_tensor_t *bias, float eps, ch_tensor_t *y);
ch_status ch_cpu_bn_update_running(void *st, ch_tensor_t *rm, ch_tensor_t *rv,
                                   const ch_tensor_t *mean, const ch_tensor_t *var,
                                   int64_t count, float momentum);
ch_status ch_cpu_bn_gather_stats(void *st, const ch_tensor_t *means, const ch_tensor_t *vars,
                                 const int64_t *counts, int nranks, ch_tensor_t *mean,
                                 ch_tensor_t *var);
ch_status ch_cpu_bn_backward_reduce(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                    const ch_tensor_t *mean, ch_tensor_t *sum_dy,
                                    ch_tensor_t *sum_dy_xmu);
ch_status ch_cpu_bn_param_grads(void *st, const ch_tensor_t *sum_dy,
                                const ch_tensor_t *sum_dy_xmu, const ch_tensor_t *var,
                                float eps, ch_tensor_t *dweight, ch_tensor_t *dbias);
ch_status ch_cpu_bn_backward_elemt(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                   const ch_tensor_t *mean, const ch_tensor_t *var, float eps,
                                   const ch_tensor_t *weight, const ch_tensor_t *sum_dy,
                                   const ch_tensor_t *sum_dy_xmu, int64_t total,
                                   ch_tensor_t *dx);
ch_status ch_cpu_bn_backward(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                             const ch_tensor_t *mean, const ch_tensor_t *var, float eps,
                             const ch_tensor_t *weight, ch_tensor_t *dx, ch_tensor_t *dweight,
                             ch_tensor_t *dbias);

/* ---- activations (eltwise.c: oneDNN eltwise or C) and LayerNorm2d
 * (layernorm.c); ops.h ch_op_act_*, ch_op_layernorm2d_* */
ch_status ch_cpu_act_forward(void *st, const ch_act_params_t *p, const ch_tensor_t *x,
                             ch_tensor_t *y);
ch_status ch_cpu_act_backward(void *st, const ch_act_params_t *p, const ch_tensor_t *x,
                              const ch_tensor_t *dy, ch_tensor_t *dx);
ch_status ch_cpu_ln2d_forward(void *st, const ch_tensor_t *x, const ch_tensor_t *weight,
                              const ch_tensor_t *bias, float eps, ch_tensor_t *y,
                              ch_tensor_t *mean, ch_tensor_t *rstd);
ch_status ch_cpu_ln2d_backward(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                               const ch_tensor_t *mean, const ch_tensor_t *rstd,
                               const ch_tensor_t *weight, ch_tensor_t *dx, ch_tensor_t *dweight,
                               ch_tensor_t *dbias);

/* ---- threads for the plain C loops (kernels.c, batchnorm.c)
 * The loops run in OpenMP parallel regions, the same thread team as oneDNN's
 * primitives (ch_cpu_threads sets its size). Work is split into contiguous
 * pieces (blocks of channels, samples, or element ranges) and no sum is ever
 * split across threads, so results are bitwise the same for any thread count
 * (tests/test_ops_threads.c). Below CH_CPU_PAR_MIN floats touched by one op
 * the loop stays on the calling thread: waking the team costs more than the
 * work there: on 2 threads the break-even lies between 65536 and 131072
 * floats (tests/bench_omp_fork; docs/perf-isa.md, "Threaded batch-norm,
 * ReLU, pooling and add loops"). */
#define CH_CPU_PAR_MIN 131072
/* Elementwise pieces start at multiples of this many floats (a multiple of
 * every kernel's vector chunk and of the 64-byte cache line). */
#define CH_CPU_PAR_ALIGN 64
/* Called inside a parallel region: the calling thread's piece [*i0, *i1) of
 * [0, n), pieces in thread order, each starting at a multiple of
 * CH_CPU_PAR_ALIGN; outside a region the whole range. */
void ch_cpu_split(int64_t n, int64_t *i0, int64_t *i1);

/* y = x rounded to bf16 (round to nearest even, as oneDNN's reorders and
 * torch's .to(torch.bfloat16); a NaN stays a quiet NaN), n elements, on the
 * context's threads (kernels.c). Each element's result is independent of
 * the thread split. */
void ch_cpu_cast_bf16(const ch_cpu_t *c, const float *x, uint16_t *y, int64_t n);

/* Channel view of an activation for per-channel loops: element (n,c,hw) is at
 * ((n*nb + c/B)*HW + hw)*B + c%B, which covers every layout (PLAIN: B=1;
 * NHWC: B=C; nChw8c/16c: B=8/16). 2-D (N,C) plain: HW=1, B=1. */
typedef struct {
    int64_t N, C, HW, B, nb;
} cpu_cview;
cpu_cview ch_cpu_cview(const ch_tensor_t *t);

/* channel ops (channel.c; ops.h ch_op_mul_channel*, ch_op_concat_channels*) */
ch_status ch_cpu_mul_channel(void *st, const ch_tensor_t *x, const ch_tensor_t *s, ch_tensor_t *y);
ch_status ch_cpu_mul_channel_backward(void *st, const ch_tensor_t *x, const ch_tensor_t *s,
                                      const ch_tensor_t *dy, ch_tensor_t *dx, ch_tensor_t *ds);
ch_status ch_cpu_concat_channels(void *st, const ch_tensor_t *const *xs, int n, ch_tensor_t *y);
ch_status ch_cpu_split_channels(void *st, const ch_tensor_t *dy, ch_tensor_t *const *dxs, int n);
/* graph ops (channel.c; ops.h ch_op_binary*, ch_op_copy_channels, ...) */
ch_status ch_cpu_binary(void *st, int op, const ch_tensor_t *a, const ch_tensor_t *b,
                        ch_tensor_t *y);
ch_status ch_cpu_binary_backward(void *st, int op, const ch_tensor_t *a, const ch_tensor_t *b,
                                 const ch_tensor_t *dy, ch_tensor_t *da, ch_tensor_t *db);
ch_status ch_cpu_copy_channels(void *st, const ch_tensor_t *src, int64_t src_c0,
                               ch_tensor_t *dst, int64_t dst_c0, int64_t n);
ch_status ch_cpu_channel_shuffle(void *st, const ch_tensor_t *x, int groups, ch_tensor_t *y);
ch_status ch_cpu_affine(void *st, const ch_tensor_t *x, float alpha, float beta, ch_tensor_t *y);

#endif /* COHORT_OPS_CPU_H */
