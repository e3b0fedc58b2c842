/* cohort: CPU activations (ops.h ch_op_act_*): oneDNN eltwise primitives
 * where oneDNN 2.6 has the algorithm with PyTorch's formula and autograd's
 * derivative, plain C loops with PyTorch 1.13's formulas elsewhere.
 *
 *   kind          forward (oneDNN alg)          backward
 *   HARDTANH      clip_v2 (alpha, beta)         clip_v2 from x: alpha < x < beta
 *   LEAKY_RELU    relu (alpha)                  relu from x
 *   SILU          swish (alpha 1)               swish from x
 *   SIGMOID       logistic                      logistic from x
 *   TANH          tanh                          tanh from x
 *   GELU_ERF      gelu_erf                      gelu_erf from x
 *   GELU_TANH     gelu_tanh                     gelu_tanh from x
 *   HARDSWISH     hardswish                     C: oneDNN 2.6 gives 0 at x = -3,
 *                                               autograd -0.5 dy
 *   HARDSIGMOID   C (no oneDNN 2.6 algorithm)   C
 *
 * Every backward reads the forward input x only (the module's output may be
 * changed in place by a ReLU after it).
 * A primitive whose implementation would be one of oneDNN's reference
 * kernels (ch_cpu_pd_is_ref) is not used: the C loop runs instead (the
 * decision is cached with the primitive), so no activation ever runs a
 * reference kernel (tests/test_cpu_isa.sh). The C loops run on the OpenMP
 * team over contiguous element ranges (cpu.h); oneDNN's eltwise kernels
 * compute each element by the same instructions wherever it falls: both are
 * bitwise the same for any thread count (tests/test_nn_act.c).
 */
#include "config.h"

#include "framework/ops/act_math.h"
#include "framework/ops/cpu/cpu.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One loop per kind (the kind a constant in each, so the formula's switch
 * folds away and the piecewise-linear ones vectorise). */
#define ACT_KINDS(X)                                                                         \
    X(CH_ACT_HARDTANH) X(CH_ACT_LEAKY_RELU) X(CH_ACT_SILU) X(CH_ACT_SIGMOID) X(CH_ACT_TANH)  \
    X(CH_ACT_GELU_ERF) X(CH_ACT_GELU_TANH) X(CH_ACT_HARDSWISH) X(CH_ACT_HARDSIGMOID)

CH_CPU_SIMD static void k_act_fwd(const ch_act_params_t *p, float *y, const float *x, int64_t n)
{
    switch (p->kind) {
#define FWD_CASE(K)                                                                          \
    case K: {                                                                                \
        const ch_act_params_t q = {K, p->alpha, p->beta};                                    \
        for (int64_t i = 0; i < n; i++) y[i] = ch_act_fwd1(&q, x[i]);                        \
        break;                                                                               \
    }
        ACT_KINDS(FWD_CASE)
#undef FWD_CASE
    default: break;
    }
}

CH_CPU_SIMD static void k_act_bwd(const ch_act_params_t *p, float *dx, const float *x,
                                  const float *dy, int64_t n)
{
    switch (p->kind) {
#define BWD_CASE(K)                                                                          \
    case K: {                                                                                \
        const ch_act_params_t q = {K, p->alpha, p->beta};                                    \
        for (int64_t i = 0; i < n; i++) dx[i] = ch_act_bwd1(&q, x[i], dy[i]);                \
        break;                                                                               \
    }
        ACT_KINDS(BWD_CASE)
#undef BWD_CASE
    default: break;
    }
}

static void c_forward(const ch_act_params_t *p, const ch_tensor_t *x, ch_tensor_t *y)
{
    const float *X = x->data;
    float *Y = y->data;
    int64_t n = ch_tensor_numel(x);
#pragma omp parallel if (2 * n >= CH_CPU_PAR_MIN)
    {
        int64_t i0, i1;
        ch_cpu_split(n, &i0, &i1);
        k_act_fwd(p, Y + i0, X + i0, i1 - i0);
    }
}

static void c_backward(const ch_act_params_t *p, const ch_tensor_t *x, const ch_tensor_t *dy,
                       ch_tensor_t *dx)
{
    const float *X = x->data, *D = dy->data;
    float *O = dx->data;
    int64_t n = ch_tensor_numel(x);
#pragma omp parallel if (3 * n >= CH_CPU_PAR_MIN)
    {
        int64_t i0, i1;
        ch_cpu_split(n, &i0, &i1);
        k_act_bwd(p, O + i0, X + i0, D + i0, i1 - i0);
    }
}

/* ------------------------------------------------------------ oneDNN */

/* oneDNN's algorithm for kind (forward or backward; the backward reads the
 * forward input), 0 when the C loop computes it. */
static int dnnl_alg(ch_act_kind_t kind, int backward, float *alpha)
{
    switch (kind) {
    case CH_ACT_HARDTANH: return dnnl_eltwise_clip_v2;
    case CH_ACT_LEAKY_RELU: return dnnl_eltwise_relu;
    case CH_ACT_SILU: *alpha = 1.0f; return dnnl_eltwise_swish;
    case CH_ACT_SIGMOID: return dnnl_eltwise_logistic;
    case CH_ACT_TANH: return dnnl_eltwise_tanh;
    case CH_ACT_GELU_ERF: return dnnl_eltwise_gelu_erf;
    case CH_ACT_GELU_TANH: return dnnl_eltwise_gelu_tanh;
    case CH_ACT_HARDSWISH: return backward ? 0 : dnnl_eltwise_hardswish;
    default: return 0;
    }
}

/* The cached primitive for (direction, kind, alpha, beta, shape, layout);
 * e->prim NULL means "use the C loop" (no algorithm, or only a reference
 * kernel). */
static ch_status act_prim(ch_cpu_t *c, int backward, const ch_act_params_t *p,
                          const ch_tensor_t *x, cpu_prim **out)
{
    int64_t key[CPU_KEY_LEN] = {0};
    float a = p->alpha, b = p->beta;
    int alg = dnnl_alg(p->kind, backward, &a);
    key[0] = backward ? CPU_OP_ELTWISE_BWD : CPU_OP_ELTWISE_FWD;
    key[1] = p->kind;
    uint32_t ab[2];
    memcpy(&ab[0], &a, 4);
    memcpy(&ab[1], &b, 4);
    key[2] = ab[0];
    key[3] = ab[1];
    key[4] = x->ndim;
    for (int i = 0; i < x->ndim; i++) key[5 + i] = x->shape[i];
    key[9] = x->layout;
    cpu_prim *e = ch_cpu_cache_find(c, key);
    if (e) {
        *out = e;
        return CH_OK;
    }
    e = calloc(1, sizeof *e);
    if (!e) return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory", ch_act_name(p->kind));
    memcpy(e->key, key, sizeof key);
    if (alg) {
        dnnl_memory_desc_t md;
        ch_cpu_md_of(&md, x);
        dnnl_eltwise_desc_t fd, bd;
        dnnl_primitive_desc_t fpd = NULL, pd = NULL;
        dnnl_status_t ds = dnnl_eltwise_forward_desc_init(&fd, dnnl_forward_training,
                                                          (dnnl_alg_kind_t)alg, &md, a, b);
        if (ds == dnnl_success)
            ds = dnnl_primitive_desc_create(&fpd, &fd, c->attr, c->engine, NULL);
        if (ds == dnnl_success && backward) {
            ds = dnnl_eltwise_backward_desc_init(&bd, (dnnl_alg_kind_t)alg, &md, &md, a, b);
            if (ds == dnnl_success)
                ds = dnnl_primitive_desc_create(&pd, &bd, c->attr, c->engine, fpd);
        } else if (ds == dnnl_success) {
            pd = fpd;
            fpd = NULL;
        }
        ch_status s = CH_OK;
        if (ds == dnnl_success && !ch_cpu_pd_is_ref(pd)) {
            const dnnl_memory_desc_t *smd =
                dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
            size_t sz = smd ? dnnl_memory_desc_get_size(smd) : 0;
            ds = dnnl_primitive_create(&e->prim, pd);
            if (ds == dnnl_success) {
                int nm = backward ? 3 : 2;
                for (int i = 0; ds == dnnl_success && i < nm; i++)
                    ds = dnnl_memory_create(&e->mem[i], &md, c->engine, DNNL_MEMORY_NONE);
                if (ds == dnnl_success && sz) {
                    s = ch_cpu_scratch_reserve(c, sz);
                    if (s == CH_OK)
                        ds = dnnl_memory_create(&e->scratch_mem, smd, c->engine, DNNL_MEMORY_NONE);
                }
            }
            if (ds != dnnl_success && s == CH_OK)
                s = CH_ERROR(CH_ERR_DNNL, "%s %s: %s", ch_act_name(p->kind),
                             backward ? "backward" : "forward", ch_dnnl_status_string((int)ds));
        }
        /* no such primitive on this ISA or only a reference one: C loop */
        if (pd) dnnl_primitive_desc_destroy(pd);
        if (fpd) dnnl_primitive_desc_destroy(fpd);
        if (s != CH_OK) {
            ch_cpu_prim_free(e);
            return s;
        }
    }
    ch_status s = ch_cpu_cache_add(c, e);
    if (s != CH_OK) return s;
    *out = e;
    return CH_OK;
}

static ch_status run(ch_cpu_t *c, cpu_prim *e, int n, dnnl_exec_arg_t *a)
{
    if (e->scratch_mem) {
        CH_CHECK_DNNL(dnnl_memory_set_data_handle(e->scratch_mem, c->scratch));
        a[n].arg = DNNL_ARG_SCRATCHPAD;
        a[n].memory = e->scratch_mem;
        n++;
    }
    CH_CHECK_DNNL(dnnl_primitive_execute(e->prim, c->stream, n, a));
    return CH_OK;
}

ch_status ch_cpu_act_forward(void *st, const ch_act_params_t *p, const ch_tensor_t *x,
                             ch_tensor_t *y)
{
    ch_cpu_t *c = st;
    ch_cpu_threads(c);
    if (ch_tensor_numel(x) == 0) return CH_OK;
    cpu_prim *e;
    CH_TRY(act_prim(c, 0, p, x, &e));
    if (!e->prim) {
        c_forward(p, x, y);
        return CH_OK;
    }
    CH_CHECK_DNNL(dnnl_memory_set_data_handle(e->mem[0], x->data));
    CH_CHECK_DNNL(dnnl_memory_set_data_handle(e->mem[1], y->data));
    dnnl_exec_arg_t a[3] = {{DNNL_ARG_SRC, e->mem[0]}, {DNNL_ARG_DST, e->mem[1]}};
    return run(c, e, 2, a);
}

ch_status ch_cpu_act_backward(void *st, const ch_act_params_t *p, const ch_tensor_t *x,
                              const ch_tensor_t *dy, ch_tensor_t *dx)
{
    ch_cpu_t *c = st;
    ch_cpu_threads(c);
    if (ch_tensor_numel(x) == 0) return CH_OK;
    cpu_prim *e;
    CH_TRY(act_prim(c, 1, p, x, &e));
    if (!e->prim) {
        c_backward(p, x, dy, dx);
        return CH_OK;
    }
    CH_CHECK_DNNL(dnnl_memory_set_data_handle(e->mem[0], x->data));
    CH_CHECK_DNNL(dnnl_memory_set_data_handle(e->mem[1], dy->data));
    CH_CHECK_DNNL(dnnl_memory_set_data_handle(e->mem[2], dx->data));
    dnnl_exec_arg_t a[4] = {{DNNL_ARG_SRC, e->mem[0]},
                            {DNNL_ARG_DIFF_DST, e->mem[1]},
                            {DNNL_ARG_DIFF_SRC, e->mem[2]}};
    return run(c, e, 3, a);
}
