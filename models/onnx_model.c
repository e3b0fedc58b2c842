/* cohort: ONNX graph -> a DAG of cohort modules (onnx_model.h). */
#include "models/onnx_model.h"

#include "framework/core/log.h"
#include "framework/ops/ops.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char CH_ONNX_SUPPORTED_OPS[] =
    "Add, AveragePool, BatchNormalization, Cast, Clip, Concat, Constant, ConstantOfShape, Conv, "
    "Div, Dropout, Erf (in GELU's erf form), Flatten, Gather, Gelu, Gemm, GlobalAveragePool, "
    "HardSigmoid, HardSwish, Identity, LayerNormalization (channels-last or (N, F)), LeakyRelu, "
    "MatMul, MaxPool, Mul, Pad (zeros, before AveragePool), Pow (in LayerNorm's decomposed "
    "form), ReduceMean, Relu, Reshape, Shape, Sigmoid, Slice, Split, Sqrt (in LayerNorm's "
    "decomposed form), Squeeze, Sub, Tanh, Transpose (channel shuffle, channels-last LayerNorm), "
    "Unsqueeze";

void ch_onnx_map_options_default(ch_onnx_map_options_t *o)
{
    o->what = NULL;
    o->num_classes = 0;
}

/* ------------------------------------------------------------ values */

enum {
    V_NONE = 0, /* not produced yet */
    V_CONST,    /* a constant known at load (initializer, Constant, folded) */
    V_RUN,      /* a graph value computed at run time: id, shape rn / rd */
    V_SHUF5,    /* Reshape (N, g, C/g, H, W) of value id (channel shuffle, step 1) */
    V_SHUF5T,   /* ... then Transpose (0, 2, 1, 3, 4) (step 2) */
    V_PAD       /* Pad of value id by (pad_h, pad_w) zeros, waiting for its AveragePool */
};

typedef struct {
    const char *name;
    int kind;
    /* V_CONST */
    ch_dtype_t dtype;
    int ndim;
    int64_t dims[CH_ONNX_MAX_DIMS];
    size_t numel;
    const float *f;
    const int64_t *i;
    void *own;
    const ch_onnx_tensor_t *init; /* the initializer it is, or NULL */
    const void *tsrc;             /* a folded 2-D Transpose: the val_t it transposes */
    /* V_RUN and the pending patterns */
    int id;
    int rn;
    int64_t rd[4];
    int groups, pad_h, pad_w;
    /* consumers */
    int uses, last_use;
} val_t;

typedef struct {
    char name[CH_NN_NAME_MAX];
    const void *src;
    size_t numel;
    int64_t rows, cols; /* rows > 0: src is (rows, cols), the entry its transpose */
} load_t;

typedef struct {
    const ch_onnx_model_t *g;
    const char *what;
    ch_model_t *M;
    ch_module_t *graph;
    int nadded;
    val_t *v;
    int nv;
    int *hash;
    size_t hcap;
    load_t *ld;
    int nld, capld;
    char *skip;
    const ch_onnx_node_t *n;
    int ni;
    int64_t N, file_batch;
    int n_renamed;
} mp_t;

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static val_t *val_get(mp_t *p, const char *name)
{
    if (!name || !name[0]) return NULL;
    size_t m = p->hcap - 1;
    for (size_t k = hash_str(name) & m;; k = (k + 1) & m) {
        if (p->hash[k] < 0) return NULL;
        if (!strcmp(p->v[p->hash[k]].name, name)) return &p->v[p->hash[k]];
    }
}

static void val_add(mp_t *p, const char *name)
{
    if (!name || !name[0] || val_get(p, name)) return;
    size_t m = p->hcap - 1, k = hash_str(name) & m;
    while (p->hash[k] >= 0) k = (k + 1) & m;
    p->hash[k] = p->nv;
    memset(&p->v[p->nv], 0, sizeof p->v[0]);
    p->v[p->nv].name = name;
    p->v[p->nv].last_use = -1;
    p->nv++;
}

#define NODE_ERR(code, ...) node_err(p, code, __VA_ARGS__)

static ch_status node_err(mp_t *p, ch_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ch_status node_err(mp_t *p, ch_status code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return CH_ERROR(code, "%s: node '%s' (%s, opset %lld): %s", p->what, p->n->name,
                    p->n->op_type, (long long)p->g->opset, msg);
}

/* input k of the current node (NULL when absent or ""), checked known */
static ch_status in_val(mp_t *p, int k, val_t **out)
{
    *out = NULL;
    if (k >= p->n->n_in || !p->n->in[k][0]) return CH_OK;
    val_t *v = val_get(p, p->n->in[k]);
    if (!v || v->kind == V_NONE)
        return NODE_ERR(CH_ERR_FORMAT, "input '%s' is neither an initializer nor computed "
                        "(missing initializer?)", p->n->in[k]);
    *out = v;
    return CH_OK;
}

static val_t *out_val(mp_t *p, int k)
{
    return k < p->n->n_out ? val_get(p, p->n->out[k]) : NULL;
}

static const char *shape_str(const val_t *v, char *buf, size_t len)
{
    int n = v->kind == V_CONST ? v->ndim : v->rn;
    const int64_t *d = v->kind == V_CONST ? v->dims : v->rd;
    size_t at = 0;
    at += (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < n && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%lld", i ? ", " : "", (long long)d[i]);
    if (at < len) snprintf(buf + at, len - at, ")");
    return buf;
}

static int64_t attr_i(const ch_onnx_node_t *n, const char *name, int64_t def)
{
    const ch_onnx_attr_t *a = ch_onnx_node_attr(n, name);
    return a && a->type == CH_ONNX_ATTR_INT ? a->i : def;
}

static float attr_f(const ch_onnx_node_t *n, const char *name, float def)
{
    const ch_onnx_attr_t *a = ch_onnx_node_attr(n, name);
    return a && a->type == CH_ONNX_ATTR_FLOAT ? a->f : def;
}

static const int64_t *attr_ints(const ch_onnx_node_t *n, const char *name, int *count)
{
    const ch_onnx_attr_t *a = ch_onnx_node_attr(n, name);
    if (!a || a->type != CH_ONNX_ATTR_INTS) {
        *count = 0;
        return NULL;
    }
    *count = a->n;
    return a->ints;
}

/* ------------------------------------------------------------ constants */

static ch_status const_new(mp_t *p, val_t *v, ch_dtype_t dt, int ndim, const int64_t *dims)
{
    size_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (dims[d] < 0 || dims[d] > ((int64_t)1 << 40))
            return NODE_ERR(CH_ERR_UNSUPPORTED, "constant with dimension %lld", (long long)dims[d]);
        numel *= (size_t)dims[d];
    }
    if (numel > ((size_t)1 << 28))
        return NODE_ERR(CH_ERR_UNSUPPORTED, "constant of %zu elements", numel);
    free(v->own);
    v->own = calloc(numel ? numel : 1, 8);
    if (!v->own) return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory", p->what);
    v->kind = V_CONST;
    v->dtype = dt;
    v->ndim = ndim;
    for (int d = 0; d < ndim; d++) v->dims[d] = dims[d];
    v->numel = numel;
    v->f = dt == CH_F32 ? v->own : NULL;
    v->i = dt == CH_I64 ? v->own : NULL;
    return CH_OK;
}

static void const_ref(val_t *v, const ch_onnx_tensor_t *t)
{
    v->kind = V_CONST;
    v->dtype = t->dtype;
    v->ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) v->dims[d] = t->dims[d];
    v->numel = t->numel;
    v->f = t->dtype == CH_F32 ? t->data : NULL;
    v->i = t->dtype == CH_I64 ? t->data : NULL;
}

static double cget(const val_t *v, size_t k)
{
    return v->dtype == CH_F32 ? (double)v->f[k] : (double)v->i[k];
}

static int64_t cgeti(const val_t *v, size_t k)
{
    return v->dtype == CH_F32 ? (int64_t)v->f[k] : v->i[k];
}

static void cset(val_t *v, size_t k, double x)
{
    if (v->dtype == CH_F32) ((float *)v->own)[k] = (float)x;
    else ((int64_t *)v->own)[k] = (int64_t)x;
}

/* the scalar value of a constant with one element */
static int const_scalar(const val_t *v, double *x)
{
    if (!v || v->kind != V_CONST || v->numel != 1) return 0;
    *x = cget(v, 0);
    return 1;
}

/* a 1-D (or scalar) int64 constant into ints[0..*n) */
static ch_status const_ints(mp_t *p, const val_t *v, const char *what, int64_t *ints, int cap, int *n)
{
    if (!v || v->kind != V_CONST || v->ndim > 1 || v->numel > (size_t)cap)
        return NODE_ERR(CH_ERR_UNSUPPORTED, "%s must be a constant list of at most %d integers "
                        "known at load", what, cap);
    for (size_t k = 0; k < v->numel; k++) ints[k] = cgeti(v, k);
    *n = (int)v->numel;
    return CH_OK;
}

static int is_fold_op(const char *op)
{
    static const char *const ops[] = {"Shape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Cast",
                                      "Add", "Sub", "Mul", "Div", "Reshape", "Slice",
                                      "ConstantOfShape", "Identity", NULL};
    for (int k = 0; ops[k]; k++)
        if (!strcmp(op, ops[k])) return 1;
    return 0;
}

/* Fold the current node, whose inputs are all constants (Shape: any). */
static ch_status fold(mp_t *p)
{
    const ch_onnx_node_t *n = p->n;
    const char *op = n->op_type;
    val_t *a, *b, *y = out_val(p, 0);
    CH_TRY(in_val(p, 0, &a));
    CH_TRY(in_val(p, 1, &b));
    if (!y) return NODE_ERR(CH_ERR_FORMAT, "no output");
    if (!strcmp(op, "Shape")) {
        int nd = a->kind == V_CONST ? a->ndim : a->rn;
        const int64_t *d = a->kind == V_CONST ? a->dims : a->rd;
        int64_t st = attr_i(n, "start", 0), en = attr_i(n, "end", nd);
        if (st < 0) st += nd;
        if (en < 0) en += nd;
        st = st < 0 ? 0 : st > nd ? nd : st;
        en = en < st ? st : en > nd ? nd : en;
        int64_t len = en - st;
        CH_TRY(const_new(p, y, CH_I64, 1, &len));
        for (int64_t k = 0; k < len; k++) cset(y, (size_t)k, (double)d[st + k]);
        return CH_OK;
    }
    if (!a || a->kind != V_CONST) return NODE_ERR(CH_ERR_UNSUPPORTED, "first input not a constant");
    if (!strcmp(op, "Identity")) {
        CH_TRY(const_new(p, y, a->dtype, a->ndim, a->dims));
        memcpy(y->own, a->dtype == CH_F32 ? (const void *)a->f : (const void *)a->i,
               a->numel * (a->dtype == CH_F32 ? 4 : 8));
        return CH_OK;
    }
    if (!strcmp(op, "Cast")) {
        int64_t to = attr_i(n, "to", 1);
        ch_dtype_t dt = (to == 1 || to == 10 || to == 11 || to == 16) ? CH_F32 : CH_I64;
        CH_TRY(const_new(p, y, dt, a->ndim, a->dims));
        for (size_t k = 0; k < a->numel; k++) cset(y, k, cget(a, k));
        return CH_OK;
    }
    if (!strcmp(op, "ConstantOfShape")) {
        int64_t dims[CH_ONNX_MAX_DIMS];
        int nd;
        CH_TRY(const_ints(p, a, "the shape", dims, CH_ONNX_MAX_DIMS, &nd));
        const ch_onnx_attr_t *va = ch_onnx_node_attr(n, "value");
        const ch_onnx_tensor_t *t = va && va->type == CH_ONNX_ATTR_TENSOR ? va->t : NULL;
        CH_TRY(const_new(p, y, t ? t->dtype : CH_F32, nd, dims));
        double x = 0;
        if (t && t->numel == 1) x = t->dtype == CH_F32 ? ((const float *)t->data)[0]
                                                       : (double)((const int64_t *)t->data)[0];
        for (size_t k = 0; k < y->numel; k++) cset(y, k, x);
        return CH_OK;
    }
    if (!strcmp(op, "Unsqueeze") || !strcmp(op, "Squeeze")) {
        int64_t axes[CH_ONNX_MAX_DIMS];
        int na = 0;
        if (b) CH_TRY(const_ints(p, b, "axes", axes, CH_ONNX_MAX_DIMS, &na));
        else {
            int c;
            const int64_t *ax = attr_ints(n, "axes", &c);
            if (c > CH_ONNX_MAX_DIMS) return NODE_ERR(CH_ERR_UNSUPPORTED, "%d axes", c);
            for (int k = 0; k < c; k++) axes[k] = ax[k];
            na = c;
        }
        int64_t dims[CH_ONNX_MAX_DIMS];
        int nd = 0;
        if (op[0] == 'U') {
            int out_nd = a->ndim + na, src = 0;
            if (out_nd > CH_ONNX_MAX_DIMS) return NODE_ERR(CH_ERR_UNSUPPORTED, "rank %d", out_nd);
            for (int d = 0; d < out_nd; d++) {
                int ins = 0;
                for (int k = 0; k < na; k++)
                    if ((axes[k] < 0 ? axes[k] + out_nd : axes[k]) == d) ins = 1;
                dims[nd++] = ins ? 1 : a->dims[src++];
            }
            if (src != a->ndim) return NODE_ERR(CH_ERR_INVALID, "bad axes");
        } else {
            for (int d = 0; d < a->ndim; d++) {
                int rm = na == 0 && a->dims[d] == 1;
                for (int k = 0; k < na; k++)
                    if ((axes[k] < 0 ? axes[k] + a->ndim : axes[k]) == d) rm = 1;
                if (!rm) dims[nd++] = a->dims[d];
            }
        }
        CH_TRY(const_new(p, y, a->dtype, nd, dims));
        for (size_t k = 0; k < a->numel; k++) cset(y, k, cget(a, k));
        return CH_OK;
    }
    if (!strcmp(op, "Gather")) {
        int64_t axis = attr_i(n, "axis", 0);
        if (a->ndim != 1 || (axis != 0 && axis != -1) || !b || b->kind != V_CONST || b->ndim > 1)
            return NODE_ERR(CH_ERR_UNSUPPORTED, "Gather of constants: only a 1-D list indexed "
                            "by a scalar or a 1-D list");
        CH_TRY(const_new(p, y, a->dtype, b->ndim, b->dims));
        for (size_t k = 0; k < b->numel; k++) {
            int64_t ix = cgeti(b, k);
            if (ix < 0) ix += (int64_t)a->numel;
            if (ix < 0 || ix >= (int64_t)a->numel)
                return NODE_ERR(CH_ERR_INVALID, "index %lld out of range", (long long)ix);
            cset(y, k, cget(a, (size_t)ix));
        }
        return CH_OK;
    }
    if (!strcmp(op, "Concat")) {
        size_t total = 0;
        ch_dtype_t dt = a->dtype;
        for (int k = 0; k < n->n_in; k++) {
            val_t *c;
            CH_TRY(in_val(p, k, &c));
            if (!c || c->kind != V_CONST || c->ndim > 1 || c->dtype != dt)
                return NODE_ERR(CH_ERR_UNSUPPORTED, "Concat of constants: only 1-D lists of one "
                                "type");
            total += c->numel;
        }
        int64_t len = (int64_t)total;
        CH_TRY(const_new(p, y, dt, 1, &len));
        size_t at = 0;
        for (int k = 0; k < n->n_in; k++) {
            val_t *c;
            CH_TRY(in_val(p, k, &c));
            for (size_t e = 0; e < c->numel; e++) cset(y, at++, cget(c, e));
        }
        return CH_OK;
    }
    if (!strcmp(op, "Reshape")) {
        int64_t t[CH_ONNX_MAX_DIMS];
        int nt, infer = -1;
        CH_TRY(const_ints(p, b, "the shape", t, CH_ONNX_MAX_DIMS, &nt));
        size_t known = 1;
        for (int d = 0; d < nt; d++) {
            if (t[d] == 0 && d < a->ndim) t[d] = a->dims[d];
            if (t[d] == -1) infer = d;
            else known *= (size_t)(t[d] > 0 ? t[d] : 0);
        }
        if (infer >= 0) t[infer] = known ? (int64_t)(a->numel / known) : 0;
        CH_TRY(const_new(p, y, a->dtype, nt, t));
        if (y->numel != a->numel) return NODE_ERR(CH_ERR_INVALID, "Reshape changes the size");
        for (size_t k = 0; k < a->numel; k++) cset(y, k, cget(a, k));
        return CH_OK;
    }
    if (!strcmp(op, "Slice")) {
        int64_t st[1], en[1], ax[1] = {0}, stp[1] = {1};
        int c;
        val_t *vs, *ve, *va, *vp;
        CH_TRY(in_val(p, 1, &vs));
        CH_TRY(in_val(p, 2, &ve));
        CH_TRY(in_val(p, 3, &va));
        CH_TRY(in_val(p, 4, &vp));
        if (a->ndim != 1) return NODE_ERR(CH_ERR_UNSUPPORTED, "Slice of a constant: 1-D only");
        CH_TRY(const_ints(p, vs, "starts", st, 1, &c));
        CH_TRY(const_ints(p, ve, "ends", en, 1, &c));
        if (va) CH_TRY(const_ints(p, va, "axes", ax, 1, &c));
        if (vp) CH_TRY(const_ints(p, vp, "steps", stp, 1, &c));
        if (stp[0] != 1 || (ax[0] != 0 && ax[0] != -1))
            return NODE_ERR(CH_ERR_UNSUPPORTED, "Slice of a constant: axis 0, step 1 only");
        int64_t len = (int64_t)a->numel, s0 = st[0] < 0 ? st[0] + len : st[0],
                e0 = en[0] < 0 ? en[0] + len : en[0];
        s0 = s0 < 0 ? 0 : s0 > len ? len : s0;
        e0 = e0 < s0 ? s0 : e0 > len ? len : e0;
        int64_t m = e0 - s0;
        CH_TRY(const_new(p, y, a->dtype, 1, &m));
        for (int64_t k = 0; k < m; k++) cset(y, (size_t)k, cget(a, (size_t)(s0 + k)));
        return CH_OK;
    }
    /* Add, Sub, Mul, Div: same shape or a scalar operand */
    if (!b || b->kind != V_CONST) return NODE_ERR(CH_ERR_UNSUPPORTED, "second input not a constant");
    const val_t *big = a->numel >= b->numel ? a : b;
    if (a->numel != b->numel && a->numel != 1 && b->numel != 1)
        return NODE_ERR(CH_ERR_UNSUPPORTED, "constant arithmetic: shapes must match or one be "
                        "a scalar");
    CH_TRY(const_new(p, y, a->dtype == CH_F32 || b->dtype == CH_F32 ? CH_F32 : CH_I64, big->ndim,
                     big->dims));
    for (size_t k = 0; k < big->numel; k++) {
        double x = cget(a, a->numel == 1 ? 0 : k), z = cget(b, b->numel == 1 ? 0 : k), r;
        switch (op[0]) {
        case 'A': r = x + z; break;
        case 'S': r = x - z; break;
        case 'M': r = x * z; break;
        default:
            if (z == 0) return NODE_ERR(CH_ERR_INVALID, "division by zero");
            r = y->dtype == CH_I64 ? trunc(x / z) : x / z;
            break;
        }
        cset(y, k, r);
    }
    return CH_OK;
}

/* ------------------------------------------------------------ modules */

static ch_status add_load(mp_t *p, const char *entry, const val_t *src, int64_t rows, int64_t cols)
{
    if (!src || src->kind != V_CONST || src->dtype != CH_F32)
        return NODE_ERR(CH_ERR_UNSUPPORTED, "weights for '%s' are not float constants", entry);
    if (p->nld == p->capld) {
        int cap = p->capld ? 2 * p->capld : 64;
        load_t *nl = realloc(p->ld, (size_t)cap * sizeof *nl);
        if (!nl) return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory", p->what);
        p->ld = nl;
        p->capld = cap;
    }
    load_t *l = &p->ld[p->nld++];
    snprintf(l->name, sizeof l->name, "%s", entry);
    l->src = src->f;
    l->numel = src->numel;
    l->rows = rows;
    l->cols = cols;
    return CH_OK;
}

/* The module name of a node with weights: the prefix that the initializer
 * names share ("features.0" of "features.0.weight", ...). locals[k] is the
 * suffix expected of vals[k] (NULL entries are skipped). When the names do
 * not fit (an exporter's renaming), a name of the node's own is used and a
 * warning names the initializers. */
static ch_status weight_prefix(mp_t *p, const val_t *const *vals, const char *const *locals,
                               int n, char *out, size_t len)
{
    const char *ref = NULL;
    size_t plen = 0;
    int ok = 1;
    for (int k = 0; k < n && ok; k++) {
        if (!vals[k]) continue;
        const char *nm = vals[k]->name;
        size_t ln = strlen(nm), ls = strlen(locals[k]);
        if (!vals[k]->init || ln <= ls + 1 || nm[ln - ls - 1] != '.' ||
            strcmp(nm + ln - ls, locals[k])) {
            ok = 0;
            break;
        }
        if (!ref) {
            ref = nm;
            plen = ln - ls - 1;
        } else if (ln - ls - 1 != plen || strncmp(nm, ref, plen)) {
            ok = 0;
        }
    }
    if (ok && ref && plen < len) {
        memcpy(out, ref, plen);
        out[plen] = 0;
        if (ch_module_child(p->graph, out))
            return NODE_ERR(CH_ERR_UNSUPPORTED, "its weights (%s) are already used by an earlier "
                            "node: a module applied twice (shared weights) is not supported; give "
                            "each use a module of its own", ref);
        return CH_OK;
    }
    snprintf(out, len, "onnx_%d_%s", p->ni, p->n->op_type);
    p->n_renamed++;
    const int folded = vals[0] && !strncmp(vals[0]->name, "onnx::", 6);
    ch_log_warn_rank0("%s: node '%s' (%s): initializer names (%s%s%s) are not a module's "
                      "state-dict names; its entries are named %s.*%s", p->what, p->n->name,
                      p->n->op_type, vals[0] ? vals[0]->name : "", n > 1 && vals[1] ? ", " : "",
                      n > 1 && vals[1] ? vals[1]->name : "", out,
                      folded ? " (onnx:: names come from an eval-mode or constant-folded export, "
                               "which folds BatchNorm into the convolutions: re-export with "
                               "training=torch.onnx.TrainingMode.TRAINING, "
                               "do_constant_folding=False)" : "");
    return CH_OK;
}

static void auto_name(mp_t *p, char *out, size_t len)
{
    snprintf(out, len, "n%d_%s", p->ni, p->n->op_type);
    for (char *c = out; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9')))
            *c = '_';
}

/* connect the module just added to the given inputs; y becomes its output */
static ch_status connect(mp_t *p, ch_module_t *m, const int *ids, int n, val_t *y, int rn,
                         const int64_t *rd)
{
    CH_TRY(ch_nn_graph_connect(p->graph, m, ids, n));
    p->nadded++;
    if (y) {
        y->kind = V_RUN;
        y->id = p->nadded;
        y->rn = rn;
        for (int d = 0; d < rn; d++) y->rd[d] = rd[d];
    }
    return CH_OK;
}

static void alias(val_t *y, const val_t *x)
{
    y->kind = x->kind;
    y->id = x->id;
    y->rn = x->rn;
    for (int d = 0; d < 4; d++) y->rd[d] = x->rd[d];
    y->groups = x->groups;
    y->pad_h = x->pad_h;
    y->pad_w = x->pad_w;
}

static ch_status need_run4(mp_t *p, const val_t *x)
{
    char b[96];
    if (!x || x->kind != V_RUN || x->rn != 4)
        return NODE_ERR(CH_ERR_UNSUPPORTED, "expects an (N, C, H, W) value computed at run "
                        "time, got %s", x ? shape_str(x, b, sizeof b) : "nothing");
    return CH_OK;
}

/* 2-D spatial attributes: kernel, strides, symmetric pads, dilations */
typedef struct {
    int64_t kh, kw, sh, sw, ph, pw, dh, dw;
} win_t;

static ch_status window(mp_t *p, int64_t kh, int64_t kw, win_t *w)
{
    int c;
    const int64_t *k = attr_ints(p->n, "kernel_shape", &c);
    w->kh = kh;
    w->kw = kw;
    if (k) {
        if (c != 2) return NODE_ERR(CH_ERR_UNSUPPORTED, "kernel_shape of %d dims (2-D only)", c);
        w->kh = k[0];
        w->kw = k[1];
    }
    const int64_t *s = attr_ints(p->n, "strides", &c);
    w->sh = s && c == 2 ? s[0] : 1;
    w->sw = s && c == 2 ? s[1] : 1;
    const int64_t *d = attr_ints(p->n, "dilations", &c);
    w->dh = d && c == 2 ? d[0] : 1;
    w->dw = d && c == 2 ? d[1] : 1;
    const int64_t *pd = attr_ints(p->n, "pads", &c);
    w->ph = w->pw = 0;
    if (pd) {
        if (c != 4) return NODE_ERR(CH_ERR_UNSUPPORTED, "pads of %d values (4 expected)", c);
        if (pd[0] != pd[2] || pd[1] != pd[3])
            return NODE_ERR(CH_ERR_UNSUPPORTED, "asymmetric pads (%lld, %lld, %lld, %lld): "
                            "cohort pads both sides alike", (long long)pd[0], (long long)pd[1],
                            (long long)pd[2], (long long)pd[3]);
        w->ph = pd[0];
        w->pw = pd[1];
    }
    const ch_onnx_attr_t *ap = ch_onnx_node_attr(p->n, "auto_pad");
    if (ap && ap->type == CH_ONNX_ATTR_STRING && strcmp(ap->s, "NOTSET") &&
        !(strcmp(ap->s, "VALID") == 0 && w->ph == 0 && w->pw == 0))
        return NODE_ERR(CH_ERR_UNSUPPORTED, "auto_pad %s (export with explicit pads)", ap->s);
    if (w->kh <= 0 || w->kw <= 0 || w->sh <= 0 || w->sw <= 0 || w->dh <= 0 || w->dw <= 0 ||
        w->ph < 0 || w->pw < 0 || w->kh > 4096 || w->kw > 4096 || w->sh > 4096 || w->sw > 4096 ||
        w->ph > 4096 || w->pw > 4096 || w->dh > 4096 || w->dw > 4096)
        return NODE_ERR(CH_ERR_INVALID, "kernel, strides, pads or dilations out of range");
    return CH_OK;
}

static ch_status map_conv(mp_t *p)
{
    val_t *x, *w, *b;
    CH_TRY(in_val(p, 0, &x));
    CH_TRY(in_val(p, 1, &w));
    CH_TRY(in_val(p, 2, &b));
    CH_TRY(need_run4(p, x));
    if (!w || w->kind != V_CONST || w->ndim != 4)
        return NODE_ERR(CH_ERR_UNSUPPORTED, "weight must be a 4-D initializer (2-D convolution)");
    int64_t group = attr_i(p->n, "group", 1);
    win_t wn;
    CH_TRY(window(p, w->dims[2], w->dims[3], &wn));
    if (wn.kh != w->dims[2] || wn.kw != w->dims[3])
        return NODE_ERR(CH_ERR_INVALID, "kernel_shape differs from the weight's");
    if (group < 1 || x->rd[1] % group || x->rd[1] / group != w->dims[1] || w->dims[0] % group)
        return NODE_ERR(CH_ERR_INVALID, "input %lld channels, group %lld and weight (%lld, %lld, "
                        "...) do not fit", (long long)x->rd[1], (long long)group,
                        (long long)w->dims[0], (long long)w->dims[1]);
    if (b && (b->kind != V_CONST || b->numel != (size_t)w->dims[0]))
        return NODE_ERR(CH_ERR_INVALID, "bias must be a constant of %lld values",
                        (long long)w->dims[0]);
    ch_conv2d_options_t o;
    ch_conv2d_options_default(&o, (int)x->rd[1], (int)w->dims[0], (int)wn.kh);
    o.kernel_w = (int)wn.kw;
    o.stride_h = (int)wn.sh;
    o.stride_w = (int)wn.sw;
    o.pad_h = (int)wn.ph;
    o.pad_w = (int)wn.pw;
    o.dilation_h = (int)wn.dh;
    o.dilation_w = (int)wn.dw;
    o.groups = (int)group;
    o.bias = b != NULL;
    char name[CH_NN_NAME_MAX], ent[CH_NN_NAME_MAX + 8];
    const val_t *vals[2] = {w, b};
    const char *locals[2] = {"weight", "bias"};
    CH_TRY(weight_prefix(p, vals, locals, 2, name, sizeof name));
    ch_module_t *m;
    CH_TRY(ch_nn_conv2d_ex(p->graph, name, &o, &m));
    snprintf(ent, sizeof ent, "%s.weight", name);
    CH_TRY(add_load(p, ent, w, 0, 0));
    if (b) {
        snprintf(ent, sizeof ent, "%s.bias", name);
        CH_TRY(add_load(p, ent, b, 0, 0));
    }
    int64_t ho = ch_conv_out_size_dilated(x->rd[2], wn.kh, wn.sh, wn.ph, wn.dh);
    int64_t wo = ch_conv_out_size_dilated(x->rd[3], wn.kw, wn.sw, wn.pw, wn.dw);
    if (ho <= 0 || wo <= 0) return NODE_ERR(CH_ERR_INVALID, "input too small for the kernel");
    int64_t rd[4] = {x->rd[0], w->dims[0], ho, wo};
    return connect(p, m, &x->id, 1, out_val(p, 0), 4, rd);
}

static ch_status map_bn(mp_t *p)
{
    val_t *x, *v[4];
    CH_TRY(in_val(p, 0, &x));
    for (int k = 0; k < 4; k++) CH_TRY(in_val(p, k + 1, &v[k]));
    CH_TRY(need_run4(p, x));
    for (int k = 0; k < 4; k++)
        if (!v[k] || v[k]->kind != V_CONST || v[k]->numel != (size_t)x->rd[1])
            return NODE_ERR(CH_ERR_INVALID, "scale, B, mean and var must be constants of %lld "
                            "values", (long long)x->rd[1]);
    /* ONNX momentum is torch's 1 - momentum (running = running * momentum +
     * mean * (1 - momentum)) */
    float eps = attr_f(p->n, "epsilon", 1e-5f), mom = attr_f(p->n, "momentum", 0.9f);
    if (!(eps > 0.0f && eps < 1.0f) || !(mom >= 0.0f && mom < 1.0f))
        return NODE_ERR(CH_ERR_UNSUPPORTED, "epsilon %g, momentum %g: expected 0 < epsilon < 1 "
                        "and 0 <= momentum < 1", (double)eps, (double)mom);
    float tmom = 1.0f - mom;
    if (fabsf(tmom - 0.1f) < 1e-6f) tmom = 0.1f;      /* 1 - 0.9f rounds to 0.100000024 */
    else if (fabsf(tmom - 0.01f) < 1e-6f) tmom = 0.01f; /* mobilenet_v3's */
    for (int k = 1; k < p->n->n_out; k++) {
        val_t *o = out_val(p, k);
        if (o && o->uses)
            return NODE_ERR(CH_ERR_UNSUPPORTED, "output %d (%s) is read by another node; only "
                            "Y can be", k, o->name);
    }
    char name[CH_NN_NAME_MAX], ent[CH_NN_NAME_MAX + 24];
    const val_t *vals[4] = {v[0], v[1], v[2], v[3]};
    const char *locals[4] = {"weight", "bias", "running_mean", "running_var"};
    CH_TRY(weight_prefix(p, vals, locals, 4, name, sizeof name));
    ch_module_t *m;
    CH_TRY(ch_nn_batchnorm2d_ex(p->graph, name, (int)x->rd[1], eps, tmom, &m));
    for (int k = 0; k < 4; k++) {
        snprintf(ent, sizeof ent, "%s.%s", name, locals[k]);
        CH_TRY(add_load(p, ent, v[k], 0, 0));
    }
    return connect(p, m, &x->id, 1, out_val(p, 0), 4, x->rd);
}

static ch_status map_pool(mp_t *p, int is_max)
{
    val_t *x;
    CH_TRY(in_val(p, 0, &x));
    int64_t extra_h = 0, extra_w = 0;
    if (x && x->kind == V_PAD && !is_max) {
        extra_h = x->pad_h;
        extra_w = x->pad_w;
    } else {
        CH_TRY(need_run4(p, x));
    }
    win_t w;
    CH_TRY(window(p, 0, 0, &w));
    if (w.dh != 1 || w.dw != 1) return NODE_ERR(CH_ERR_UNSUPPORTED, "dilated pooling");
    if (is_max && attr_i(p->n, "storage_order", 0) != 0)
        return NODE_ERR(CH_ERR_UNSUPPORTED, "storage_order 1");
    val_t *ix = out_val(p, 1);
    if (ix && ix->uses) return NODE_ERR(CH_ERR_UNSUPPORTED, "the Indices output is read");
    ch_pool2d_options_t o;
    ch_pool2d_options_default(&o, (int)w.kh);
    o.kernel_w = (int)w.kw;
    o.stride_h = (int)w.sh;
    o.stride_w = (int)w.sw;
    o.pad_h = (int)(w.ph + extra_h);
    o.pad_w = (int)(w.pw + extra_w);
    o.ceil_mode = (int)attr_i(p->n, "ceil_mode", 0);
    /* a Pad before it (zeros): torch's count_include_pad=True export */
    o.count_include_pad = extra_h || extra_w ? 1 : (int)attr_i(p->n, "count_include_pad", 0);
    if ((extra_h || extra_w) && (w.ph || w.pw))
        return NODE_ERR(CH_ERR_UNSUPPORTED, "pads on both a Pad and the AveragePool");
    if (o.kernel_h == 1 && o.kernel_w == 1 && o.stride_h == 1 && o.stride_w == 1 && !o.pad_h &&
        !o.pad_w) { /* a 1 x 1 window: the identity (vgg's AdaptiveAvgPool2d(7) at 7 x 7) */
        alias(out_val(p, 0), x);
        return CH_OK;
    }
    char name[64];
    auto_name(p, name, sizeof name);
    ch_module_t *m;
    if (is_max) CH_TRY(ch_nn_maxpool2d_ex(p->graph, name, &o, &m));
    else CH_TRY(ch_nn_avgpool2d(p->graph, name, &o, &m));
    int64_t ho = ch_pool_out_size(x->rd[2], o.kernel_h, o.stride_h, o.pad_h, o.ceil_mode);
    int64_t wo = ch_pool_out_size(x->rd[3], o.kernel_w, o.stride_w, o.pad_w, o.ceil_mode);
    if (ho <= 0 || wo <= 0) return NODE_ERR(CH_ERR_INVALID, "input too small for the window");
    int64_t rd[4] = {x->rd[0], x->rd[1], ho, wo};
    return connect(p, m, &x->id, 1, out_val(p, 0), 4, rd);
}

/* average over the whole (H, W) map: (N, C, 1, 1) with keep, else (N, C) */
static ch_status map_global_avg(mp_t *p, val_t *x, int keep)
{
    CH_TRY(need_run4(p, x));
    val_t *y = out_val(p, 0);
    char name[64];
    auto_name(p, name, sizeof name);
    ch_module_t *m;
    if (keep) {
        if (x->rd[2] == 1 && x->rd[3] == 1) {
            alias(y, x);
            return CH_OK;
        }
        ch_pool2d_options_t o;
        ch_pool2d_options_default(&o, (int)x->rd[2]);
        o.kernel_w = o.stride_w = (int)x->rd[3];
        o.stride_h = (int)x->rd[2];
        CH_TRY(ch_nn_avgpool2d(p->graph, name, &o, &m));
        int64_t rd[4] = {x->rd[0], x->rd[1], 1, 1};
        return connect(p, m, &x->id, 1, y, 4, rd);
    }
    int64_t rd[2] = {x->rd[0], x->rd[1]};
    if (x->rd[2] == 1 && x->rd[3] == 1) { /* a mean over 1 x 1: a Flatten */
        CH_TRY(ch_nn_flatten(p->graph, name, &m));
        return connect(p, m, &x->id, 1, y, 2, rd);
    }
    CH_TRY(ch_nn_adaptive_avgpool2d(p->graph, name, &m));
    return connect(p, m, &x->id, 1, y, 2, rd);
}

static ch_status map_reduce_mean(mp_t *p)
{
    val_t *x, *ax;
    CH_TRY(in_val(p, 0, &x));
    CH_TRY(in_val(p, 1, &ax));
    int64_t axes[8];
    int na = 0;
    if (ax) CH_TRY(const_ints(p, ax, "axes", axes, 8, &na));
    else {
        const int64_t *a = attr_ints(p->n, "axes", &na);
        for (int k = 0; k < na && k < 8; k++) axes[k] = a[k];
    }
    int h = 0, w = 0;
    for (int k = 0; k < na; k++) {
        int64_t a = axes[k] < 0 ? axes[k] + 4 : axes[k];
        h |= a == 2;
        w |= a == 3;
    }
    if (na != 2 || !h || !w)
        return NODE_ERR(CH_ERR_UNSUPPORTED, "ReduceMean over axes other than (2, 3)");
    return map_global_avg(p, x, (int)attr_i(p->n, "keepdims", 1));
}

static ch_status map_act(mp_t *p, const char *op)
{
    val_t *x, *y = out_val(p, 0);
    CH_TRY(in_val(p, 0, &x));
    if (!x || x->kind != V_RUN) return NODE_ERR(CH_ERR_UNSUPPORTED, "input not computed at run time");
    char name[64];
    auto_name(p, name, sizeof name);
    ch_module_t *m = NULL;
    /* x * sigmoid(x) -> SiLU, x * hardsigmoid(x) -> Hardswish */
    int fuse = -1;
    if ((!strcmp(op, "Sigmoid") || !strcmp(op, "HardSigmoid")) && y->uses == 1) {
        const ch_onnx_node_t *c = &p->g->nodes[y->last_use];
        if (!strcmp(c->op_type, "Mul") && !c->domain[0] && c->n_in == 2 &&
            ((!strcmp(c->in[0], x->name) && !strcmp(c->in[1], y->name)) ||
             (!strcmp(c->in[1], x->name) && !strcmp(c->in[0], y->name))))
            fuse = y->last_use;
    }
    if (!strcmp(op, "Relu")) CH_TRY(ch_nn_relu(p->graph, name, &m));
    else if (!strcmp(op, "Sigmoid")) {
        if (fuse >= 0) CH_TRY(ch_nn_silu(p->graph, name, &m));
        else CH_TRY(ch_nn_sigmoid(p->graph, name, &m));
    } else if (!strcmp(op, "Tanh")) CH_TRY(ch_nn_tanh(p->graph, name, &m));
    else if (!strcmp(op, "HardSwish")) CH_TRY(ch_nn_hardswish(p->graph, name, &m));
    else if (!strcmp(op, "LeakyRelu"))
        CH_TRY(ch_nn_leaky_relu(p->graph, name, attr_f(p->n, "alpha", 0.01f), &m));
    else if (!strcmp(op, "HardSigmoid")) {
        float a = attr_f(p->n, "alpha", 0.2f), b = attr_f(p->n, "beta", 0.5f);
        if (fabsf(a - 1.0f / 6.0f) > 1e-6f || fabsf(b - 0.5f) > 1e-6f)
            return NODE_ERR(CH_ERR_UNSUPPORTED, "alpha %g, beta %g: cohort's Hardsigmoid is "
                            "torch's (alpha 1/6, beta 0.5)", (double)a, (double)b);
        if (fuse >= 0) CH_TRY(ch_nn_hardswish(p->graph, name, &m));
        else CH_TRY(ch_nn_hardsigmoid(p->graph, name, &m));
    } else if (!strcmp(op, "Gelu")) {
        const ch_onnx_attr_t *a = ch_onnx_node_attr(p->n, "approximate");
        CH_TRY(ch_nn_gelu(p->graph, name, a && a->type == CH_ONNX_ATTR_STRING ? a->s : "none", &m));
    } else { /* Clip */
        val_t *lo, *hi;
        CH_TRY(in_val(p, 1, &lo));
        CH_TRY(in_val(p, 2, &hi));
        double mn = -INFINITY, mx = INFINITY;
        if (lo && !const_scalar(lo, &mn)) return NODE_ERR(CH_ERR_UNSUPPORTED, "min not a constant");
        if (hi && !const_scalar(hi, &mx)) return NODE_ERR(CH_ERR_UNSUPPORTED, "max not a constant");
        if (!lo && !hi && p->n->n_in == 1) { /* opset < 11: attributes */
            mn = attr_f(p->n, "min", -INFINITY);
            mx = attr_f(p->n, "max", INFINITY);
        }
        if (mn == 0 && mx == 6) CH_TRY(ch_nn_relu6(p->graph, name, &m));
        else if (mn == 0 && isinf(mx) && mx > 0) CH_TRY(ch_nn_relu(p->graph, name, &m));
        else if (isfinite(mn) && isfinite(mx) && mn <= mx)
            CH_TRY(ch_nn_hardtanh(p->graph, name, (float)mn, (float)mx, &m));
        else
            return NODE_ERR(CH_ERR_UNSUPPORTED, "Clip(%g, %g): ReLU6, ReLU or a finite range only",
                            mn, mx);
    }
    if (fuse >= 0) {
        p->skip[fuse] = 1;
        y = val_get(p, p->g->nodes[fuse].out[0]);
    }
    return connect(p, m, &x->id, 1, y, x->rn, x->rd);
}

/* GELU's erf form at Div(x, sqrt 2): Erf, Add 1, Mul x, Mul 0.5. 1 when matched. */
static int match_erf_gelu(mp_t *p, const val_t *x, const val_t *d, int *nodes, val_t **yout)
{
    const ch_onnx_model_t *g = p->g;
    const val_t *cur = d;
    static const char *const seq[4] = {"Erf", "Add", "Mul", "Mul"};
    for (int k = 0; k < 4; k++) {
        if (cur->uses != 1 || cur->last_use < 0) return 0;
        const ch_onnx_node_t *c = &g->nodes[cur->last_use];
        if (strcmp(c->op_type, seq[k]) || c->domain[0] || c->n_out < 1) return 0;
        if (k > 0) {
            if (c->n_in != 2) return 0;
            const char *other = !strcmp(c->in[0], cur->name) ? c->in[1] : c->in[0];
            val_t *o = val_get(p, other);
            double s;
            if (k == 1 && !(const_scalar(o, &s) && fabs(s - 1.0) < 1e-6)) return 0;
            if (k == 2 && o != x) return 0;
            if (k == 3 && !(const_scalar(o, &s) && fabs(s - 0.5) < 1e-6)) return 0;
        }
        nodes[k] = cur->last_use;
        cur = val_get(p, c->out[0]);
        if (!cur) return 0;
    }
    *yout = (val_t *)cur;
    return 1;
}

static ch_status map_binary(mp_t *p, const char *op)
{
    val_t *a, *b, *y = out_val(p, 0);
    CH_TRY(in_val(p, 0, &a));
    CH_TRY(in_val(p, 1, &b));
    if (!a || !b) return NODE_ERR(CH_ERR_FORMAT, "two inputs expected");
    char name[64], b1[96], b2[96];
    auto_name(p, name, sizeof name);
    ch_module_t *m;
    if (a->kind == V_RUN && b->kind == V_RUN) {
        if (strcmp(op, "Add") && strcmp(op, "Mul"))
            return NODE_ERR(CH_ERR_UNSUPPORTED, "%s of two computed values (Add and Mul only)", op);
        const val_t *big = a, *small = b;
        int same = a->rn == b->rn;
        for (int d = 0; same && d < a->rn; d++) same = a->rd[d] == b->rd[d];
        if (!same) {
            if (a->rn == 4 && b->rn == 4 && a->rd[2] * a->rd[3] < b->rd[2] * b->rd[3]) {
                big = b;
                small = a;
            }
            int bc = big->rn == 4 && small->rn == 4 && small->rd[1] == big->rd[1] &&
                     small->rd[2] == 1 && small->rd[3] == 1 &&
                     (small->rd[0] == big->rd[0] || small->rd[0] == 1);
            if (!bc)
                return NODE_ERR(CH_ERR_UNSUPPORTED, "operands %s and %s: same shape or (N, C, 1, 1) "
                                "broadcast only", shape_str(a, b1, sizeof b1),
                                shape_str(b, b2, sizeof b2));
        }
        if (op[0] == 'A') CH_TRY(ch_nn_add(p->graph, name, &m));
        else CH_TRY(ch_nn_mul(p->graph, name, &m));
        int ids[2] = {a->id, b->id};
        return connect(p, m, ids, 2, y, big->rn, big->rd);
    }
    /* one computed value and a scalar constant: affine */
    const val_t *x = a->kind == V_RUN ? a : b, *c = a->kind == V_RUN ? b : a;
    double s;
    if (x->kind != V_RUN || !const_scalar(c, &s))
        return NODE_ERR(CH_ERR_UNSUPPORTED, "%s of %s and %s: two computed values, or one and a "
                        "scalar constant", op, shape_str(a, b1, sizeof b1),
                        shape_str(b, b2, sizeof b2));
    int x_first = x == a;
    /* x / sqrt(2) starting GELU's erf form */
    if (!strcmp(op, "Div") && x_first && fabs(s - 1.4142135623730951) < 1e-5) {
        int nodes[4];
        val_t *gy;
        if (match_erf_gelu(p, x, y, nodes, &gy)) {
            for (int k = 0; k < 4; k++) p->skip[nodes[k]] = 1;
            CH_TRY(ch_nn_gelu(p->graph, name, "none", &m));
            return connect(p, m, &x->id, 1, gy, x->rn, x->rd);
        }
    }
    double alpha, beta;
    switch (op[0]) {
    case 'A': alpha = 1; beta = s; break;
    case 'S': alpha = x_first ? 1 : -1; beta = x_first ? -s : s; break;
    case 'M': alpha = s; beta = 0; break;
    default:
        if (!x_first || s == 0)
            return NODE_ERR(CH_ERR_UNSUPPORTED, "Div by a computed value or by 0");
        alpha = 1.0 / s;
        beta = 0;
        break;
    }
    if (alpha == 1 && beta == 0) {
        alias(y, x);
        return CH_OK;
    }
    CH_TRY(ch_nn_affine(p->graph, name, (float)alpha, (float)beta, &m));
    return connect(p, m, &x->id, 1, y, x->rn, x->rd);
}

static ch_status map_linear(mp_t *p, int gemm)
{
    val_t *x, *w, *c = NULL, *y = out_val(p, 0);
    CH_TRY(in_val(p, 0, &x));
    CH_TRY(in_val(p, 1, &w));
    if (gemm) CH_TRY(in_val(p, 2, &c));
    char b1[96];
    if (!x || x->kind != V_RUN ||
        !(x->rn == 2 || (x->rn == 4 && x->rd[2] == 1 && x->rd[3] == 1)))
        return NODE_ERR(CH_ERR_UNSUPPORTED, "input must be a computed (N, F) value, got %s",
                        x ? shape_str(x, b1, sizeof b1) : "nothing");
    if (!w || w->kind != V_CONST || w->ndim != 2)
        return NODE_ERR(CH_ERR_UNSUPPORTED, "weight must be a 2-D constant");
    int trans = 0; /* 1: the file's matrix is (F, out), the entry its transpose */
    if (gemm) {
        if (attr_i(p->n, "transA", 0) != 0 || attr_f(p->n, "alpha", 1) != 1.0f ||
            attr_f(p->n, "beta", 1) != 1.0f)
            return NODE_ERR(CH_ERR_UNSUPPORTED, "transA 1, or alpha / beta other than 1");
        trans = attr_i(p->n, "transB", 0) == 0;
    } else {
        trans = 1;
    }
    if (w->tsrc && ((const val_t *)w->tsrc)->kind == V_CONST &&
        ((const val_t *)w->tsrc)->init) { /* MatMul(x, Transpose(W)): W itself, named */
        w = (val_t *)w->tsrc;
        trans = !trans;
    }
    int64_t F = trans ? w->dims[0] : w->dims[1], O = trans ? w->dims[1] : w->dims[0];
    if (F != x->rd[1])
        return NODE_ERR(CH_ERR_INVALID, "input %s vs weight of %lld input features",
                        shape_str(x, b1, sizeof b1), (long long)F);
    int fused = -1;
    if (!gemm && y->uses == 1) { /* MatMul + Add(bias) */
        const ch_onnx_node_t *an = &p->g->nodes[y->last_use];
        if (!strcmp(an->op_type, "Add") && an->n_in == 2) {
            val_t *o = val_get(p, !strcmp(an->in[0], y->name) ? an->in[1] : an->in[0]);
            if (o && o->kind == V_CONST && o->numel == (size_t)O && o->dtype == CH_F32) {
                c = o;
                fused = y->last_use;
            }
        }
    }
    if (c && (c->kind != V_CONST || c->numel != (size_t)O))
        return NODE_ERR(CH_ERR_UNSUPPORTED, "bias C must be a constant of %lld values", (long long)O);
    char name[CH_NN_NAME_MAX], ent[CH_NN_NAME_MAX + 8];
    const val_t *vals[2] = {w, c};
    const char *locals[2] = {"weight", "bias"};
    if (trans && !w->init) vals[0] = NULL; /* a transposed copy: the bias names the module */
    if (!vals[0] && !vals[1]) {
        vals[0] = w;
    }
    CH_TRY(weight_prefix(p, vals, locals, 2, name, sizeof name));
    ch_module_t *m;
    CH_TRY(ch_nn_linear(p->graph, name, (int)F, (int)O, c != NULL, &m));
    snprintf(ent, sizeof ent, "%s.weight", name);
    CH_TRY(add_load(p, ent, w, trans ? w->dims[0] : 0, trans ? w->dims[1] : 0));
    if (c) {
        snprintf(ent, sizeof ent, "%s.bias", name);
        CH_TRY(add_load(p, ent, c, 0, 0));
    }
    if (fused >= 0) {
        p->skip[fused] = 1;
        y = val_get(p, p->g->nodes[fused].out[0]);
    }
    int64_t rd[2] = {x->rd[0], O};
    return connect(p, m, &x->id, 1, y, 2, rd);
}

static ch_status map_narrow(mp_t *p, const val_t *x, int64_t start, int64_t len, val_t *y)
{
    char name[64];
    snprintf(name, sizeof name, "n%d_%s_%lld", p->ni, p->n->op_type, (long long)start);
    ch_module_t *m;
    CH_TRY(ch_nn_narrow(p->graph, name, (int)start, (int)len, &m));
    int64_t rd[4] = {x->rd[0], len, x->rd[2], x->rd[3]};
    return connect(p, m, &x->id, 1, y, 4, rd);
}

static int64_t axis1(int64_t a, int rank) { return a < 0 ? a + rank : a; }

static ch_status map_split(mp_t *p)
{
    val_t *x, *sv;
    CH_TRY(in_val(p, 0, &x));
    CH_TRY(in_val(p, 1, &sv));
    CH_TRY(need_run4(p, x));
    if (axis1(attr_i(p->n, "axis", 0), 4) != 1)
        return NODE_ERR(CH_ERR_UNSUPPORTED, "Split on an axis other than 1 (channels)");
    int64_t sizes[64];
    int ns = p->n->n_out;
    if (ns > 64) return NODE_ERR(CH_ERR_UNSUPPORTED, "more than 64 outputs");
    if (sv) {
        int c;
        CH_TRY(const_ints(p, sv, "split", sizes, 64, &c));
        if (c != ns) return NODE_ERR(CH_ERR_INVALID, "%d split sizes for %d outputs", c, ns);
    } else {
        int c;
        const int64_t *s = attr_ints(p->n, "split", &c);
        if (s && c == ns) for (int k = 0; k < ns; k++) sizes[k] = s[k];
        else {
            int64_t each = (x->rd[1] + ns - 1) / ns; /* opset 18: the last may be smaller */
            for (int k = 0; k < ns; k++)
                sizes[k] = k < ns - 1 ? each : x->rd[1] - each * (ns - 1);
        }
    }
    int64_t at = 0;
    for (int k = 0; k < ns; k++) {
        if (sizes[k] < 1 || at + sizes[k] > x->rd[1])
            return NODE_ERR(CH_ERR_INVALID, "split sizes do not fit %lld channels",
                            (long long)x->rd[1]);
        val_t *y = out_val(p, k);
        if (y && y->uses) CH_TRY(map_narrow(p, x, at, sizes[k], y));
        at += sizes[k];
    }
    return CH_OK;
}

static ch_status map_slice(mp_t *p)
{
    val_t *x, *vs, *ve, *va, *vp;
    CH_TRY(in_val(p, 0, &x));
    CH_TRY(in_val(p, 1, &vs));
    CH_TRY(in_val(p, 2, &ve));
    CH_TRY(in_val(p, 3, &va));
    CH_TRY(in_val(p, 4, &vp));
    CH_TRY(need_run4(p, x));
    int64_t st[4], en[4], ax[4] = {0, 1, 2, 3}, sp[4] = {1, 1, 1, 1};
    int n, c;
    if (vs) {
        CH_TRY(const_ints(p, vs, "starts", st, 4, &n));
        CH_TRY(const_ints(p, ve, "ends", en, 4, &c));
        if (va) CH_TRY(const_ints(p, va, "axes", ax, 4, &c));
        if (vp) CH_TRY(const_ints(p, vp, "steps", sp, 4, &c));
    } else { /* opset < 10 attributes */
        const int64_t *a = attr_ints(p->n, "starts", &n), *b = attr_ints(p->n, "ends", &c);
        if (!a || !b || n != c || n > 4) return NODE_ERR(CH_ERR_INVALID, "starts / ends");
        for (int k = 0; k < n; k++) st[k] = a[k], en[k] = b[k];
    }
    if (n != 1 || axis1(ax[0], 4) != 1 || sp[0] != 1)
        return NODE_ERR(CH_ERR_UNSUPPORTED, "Slice other than one range of channels (axis 1, step 1)");
    int64_t C = x->rd[1], s0 = st[0] < 0 ? st[0] + C : st[0], e0 = en[0] < 0 ? en[0] + C : en[0];
    s0 = s0 < 0 ? 0 : s0 > C ? C : s0;
    e0 = e0 < s0 ? s0 : e0 > C ? C : e0;
    if (e0 <= s0) return NODE_ERR(CH_ERR_INVALID, "empty channel range");
    val_t *y = out_val(p, 0);
    if (s0 == 0 && e0 == C) {
        alias(y, x);
        return CH_OK;
    }
    return map_narrow(p, x, s0, e0 - s0, y);
}

static ch_status map_reshape(mp_t *p)
{
    val_t *x, *sv, *y = out_val(p, 0);
    CH_TRY(in_val(p, 0, &x));
    CH_TRY(in_val(p, 1, &sv));
    int64_t t[8];
    int nt;
    CH_TRY(const_ints(p, sv, "the target shape", t, 8, &nt));
    char b1[96];
    const int64_t *d = x->rd;
    int batch_ok = nt > 0 && (t[0] == d[0] || t[0] == p->file_batch || t[0] == 0 || t[0] == -1);
    if (x->kind == V_RUN && x->rn == 4) {
        int64_t chw = d[1] * d[2] * d[3];
        if (nt == 2 && ((batch_ok && t[0] != -1 && (t[1] == -1 || t[1] == chw)) ||
                        (t[0] == -1 && t[1] == chw))) {
            char name[64];
            auto_name(p, name, sizeof name);
            ch_module_t *m;
            CH_TRY(ch_nn_flatten(p->graph, name, &m));
            int64_t rd[2] = {d[0], chw};
            return connect(p, m, &x->id, 1, y, 2, rd);
        }
        if (nt == 4 && batch_ok && (t[1] == d[1] || t[1] == -1) && t[2] == d[2] && t[3] == d[3]) {
            alias(y, x);
            return CH_OK;
        }
        if (nt == 5 && batch_ok && t[3] == d[2] && t[4] == d[3]) {
            int64_t g = t[1], cg = t[2];
            if (g == -1 && cg > 0) g = d[1] / cg;
            if (cg == -1 && g > 0) cg = d[1] / g;
            if (g > 0 && cg > 0 && g * cg == d[1]) {
                alias(y, x);
                y->kind = V_SHUF5;
                y->groups = (int)g;
                return CH_OK;
            }
        }
    } else if (x->kind == V_RUN && x->rn == 2) {
        if (nt == 2 && batch_ok && (t[1] == -1 || t[1] == d[1])) {
            alias(y, x);
            return CH_OK;
        }
    } else if (x->kind == V_SHUF5T) {
        if (nt == 4 && batch_ok && (t[1] == d[1] || t[1] == -1) && t[2] == d[2] && t[3] == d[3]) {
            char name[64];
            auto_name(p, name, sizeof name);
            ch_module_t *m;
            CH_TRY(ch_nn_channel_shuffle(p->graph, name, x->groups, &m));
            return connect(p, m, &x->id, 1, y, 4, d);
        }
    }
    char tb[160];
    size_t at = 0;
    for (int k = 0; k < nt && at < sizeof tb; k++)
        at += (size_t)snprintf(tb + at, sizeof tb - at, "%s%lld", k ? ", " : "", (long long)t[k]);
    return NODE_ERR(CH_ERR_UNSUPPORTED, "Reshape of %s to (%s): only a flatten to (N, -1) or a "
                    "channel shuffle", x->kind == V_RUN ? shape_str(x, b1, sizeof b1) : "a 5-D value",
                    tb);
}

/* 1 if op is one of CH_ONNX_SUPPORTED_OPS's names (each entry of that list
 * starts with the op's name, at the start or after ", "). */
static int op_listed(const char *op)
{
    size_t len = strlen(op);
    for (const char *s = CH_ONNX_SUPPORTED_OPS; (s = strstr(s, op)) != NULL; s += len) {
        int start = s == CH_ONNX_SUPPORTED_OPS || (s >= CH_ONNX_SUPPORTED_OPS + 2 && s[-2] == ',' &&
                                                   s[-1] == ' ');
        if (start && (s[len] == ',' || s[len] == ' ' || s[len] == 0)) return 1;
    }
    return 0;
}

/* Refuse a graph with ops cohort has no mapping for at all, before any node
 * is mapped: the first such node (shape plumbing such as Expand only when
 * nothing else is unsupported: a CNN + LSTM export names its LSTM) is
 * named, with the other unsupported op types of the graph, rather than an
 * earlier Gather or Transpose that cannot be placed only because of what
 * follows it. */
/* Ops the exporter writes around a layer to build shapes and masks
 * (the Expand of an LSTM's initial state, ...): an unsupported one is named
 * only when the graph has no other unsupported op, which says more. */
static int shape_plumbing(const char *op)
{
    static const char *const ops[] = {"Expand", "ConstantOfShape", "Range", "Where", "Equal",
                                      "Less", "Greater", "Not", "And", "Or", "Tile", "NonZero",
                                      "ScatterND", "Cast", "Size", "CastLike"};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (!strcmp(op, ops[i])) return 1;
    return 0;
}

static ch_status check_ops(mp_t *p)
{
    int first = -1;
    char others[512] = "";
    size_t len = 0;
    /* the node named: the first unsupported one that is not shape plumbing,
     * else the first unsupported one */
    for (int pass = 0; pass < 2 && first < 0; pass++)
        for (int k = 0; k < p->g->n_nodes && first < 0; k++) {
            const ch_onnx_node_t *n = &p->g->nodes[k];
            int foreign = n->domain[0] && strcmp(n->domain, "ai.onnx");
            if (!foreign && op_listed(n->op_type)) continue;
            if (pass == 0 && !foreign && shape_plumbing(n->op_type)) continue;
            first = k;
        }
    for (int k = 0; first >= 0 && k < p->g->n_nodes; k++) {
        const ch_onnx_node_t *n = &p->g->nodes[k];
        int foreign = n->domain[0] && strcmp(n->domain, "ai.onnx");
        if (k == first || (!foreign && op_listed(n->op_type))) continue;
        const ch_onnx_node_t *f = &p->g->nodes[first];
        if (!strcmp(n->op_type, f->op_type) || strstr(others, n->op_type)) continue;
        int w = snprintf(others + len, sizeof others - len, "%s%s (node '%s')", len ? ", " : "",
                         n->op_type, n->name);
        if (w > 0 && (size_t)w < sizeof others - len) len += (size_t)w;
        else others[len] = 0; /* full: the list stops here */
    }
    if (first < 0) return CH_OK;
    p->n = &p->g->nodes[first];
    p->ni = first;
    if (p->n->domain[0] && strcmp(p->n->domain, "ai.onnx"))
        return NODE_ERR(CH_ERR_UNSUPPORTED, "domain '%s': the default domain only%s%s "
                        "(supported: %s)", p->n->domain, len ? "; also unsupported here: " : "",
                        others, CH_ONNX_SUPPORTED_OPS);
    return NODE_ERR(CH_ERR_UNSUPPORTED, "op not supported%s%s (supported: %s)",
                    len ? "; also unsupported here: " : "", others, CH_ONNX_SUPPORTED_OPS);
}

/* ------------------------------------------------------------ LayerNorm */

/* A LayerNorm over the last axis of a value (ln_match / ln_node /
 * ln_decomposed): the nodes it spans, its epsilon, weight and bias, its
 * output, and the node that names the module when the initializer names
 * do not (weight_prefix). */
typedef struct {
    int nodes[12];
    int nn;
    float eps;
    val_t *w, *b, *y;
    int name_ni;
} ln_match_t;

/* node index of the one reader of v with op type op, or -1 */
static int only_reader(mp_t *p, const val_t *v, const char *op)
{
    if (!v || v->uses != 1 || v->last_use < 0) return -1;
    const ch_onnx_node_t *c = &p->g->nodes[v->last_use];
    return strcmp(c->op_type, op) || c->domain[0] || c->n_out < 1 ? -1 : v->last_use;
}

/* the other input of a binary node c that reads v (NULL if c does not read
 * v as one of exactly two inputs) */
static val_t *other_in(mp_t *p, const ch_onnx_node_t *c, const val_t *v)
{
    if (c->n_in != 2) return NULL;
    if (!strcmp(c->in[0], v->name)) return val_get(p, c->in[1]);
    if (!strcmp(c->in[1], v->name)) return val_get(p, c->in[0]);
    return NULL;
}

/* 1 when node c is a ReduceMean over exactly the last axis of a rank-`rank`
 * value, keepdims 1 (axes an attribute, or an input from opset 18) */
static int reduce_last(mp_t *p, const ch_onnx_node_t *c, int rank)
{
    int64_t axes[2];
    int na = 0;
    if (c->n_in > 1 && c->in[1][0]) {
        const val_t *a = val_get(p, c->in[1]);
        if (!a || a->kind != V_CONST || a->numel != 1 || a->ndim > 1) return 0;
        axes[0] = cgeti(a, 0);
        na = 1;
    } else {
        const int64_t *a = attr_ints(c, "axes", &na);
        if (na != 1) return 0;
        axes[0] = a[0];
    }
    return na == 1 && axis1(axes[0], rank) == rank - 1 && attr_i(c, "keepdims", 1) == 1;
}

/* a float constant of C values (a LayerNorm's weight or bias) */
static int is_vec(const val_t *v, int64_t C)
{
    return v && v->kind == V_CONST && v->dtype == CH_F32 && v->numel == (size_t)C &&
           v->ndim == 1;
}

#define LN_WHY(...) (snprintf(why, wl, __VA_ARGS__), 0)

/* node ni, a LayerNormalization of value t (rank `rank`, C values on its
 * last axis) over that last axis with weight and bias: 1 and *lm, or 0 and
 * why */
static int ln_node(mp_t *p, int ni, const val_t *t, int rank, int64_t C, ln_match_t *lm, char *why,
                   size_t wl)
{
    const ch_onnx_node_t *c = &p->g->nodes[ni];
    if (strcmp(c->op_type, "LayerNormalization") || c->domain[0] || c->n_in < 1 ||
        strcmp(c->in[0], t->name))
        return LN_WHY("read by '%s' (%s), not by a LayerNormalization", c->name, c->op_type);
    int64_t axis = attr_i(c, "axis", -1);
    float eps = attr_f(c, "epsilon", 1e-5f);
    if (axis1(axis, rank) != rank - 1)
        return LN_WHY("LayerNormalization '%s' over axis %lld of a rank-%d value: only over the "
                      "last axis (normalized_shape = (C,))", c->name, (long long)axis, rank);
    if (!(eps > 0.0f && isfinite(eps)))
        return LN_WHY("LayerNormalization '%s': epsilon %g, expected > 0", c->name, (double)eps);
    val_t *w = c->n_in > 1 ? val_get(p, c->in[1]) : NULL, *b = c->n_in > 2 ? val_get(p, c->in[2]) : NULL;
    if (!is_vec(w, C) || !is_vec(b, C))
        return LN_WHY("LayerNormalization '%s': Scale and B must be float constants of %lld values "
                      "(nn.LayerNorm with elementwise_affine and bias)", c->name, (long long)C);
    for (int k = 1; k < c->n_out; k++) {
        const val_t *o = val_get(p, c->out[k]);
        if (o && o->uses)
            return LN_WHY("LayerNormalization '%s': output %d (Mean / InvStdDev) is read by "
                          "another node; only Y can be", c->name, k);
    }
    lm->nodes[lm->nn++] = ni;
    lm->eps = eps;
    lm->w = w;
    lm->b = b;
    lm->y = val_get(p, c->out[0]);
    lm->name_ni = ni;
    return 1;
}

/* torch's decomposed LayerNorm (opset < 17) of value t from its ReduceMean
 * node r1: ReduceMean(t) -> Sub(t, mean) -> Pow(2) -> ReduceMean -> Add eps
 * -> Sqrt -> Div(Sub, Sqrt) -> Mul weight -> Add bias, each intermediate
 * read only inside the pattern: 1 and *lm, or 0 and why */
static int ln_decomposed(mp_t *p, int r1, const val_t *t, int rank, int64_t C, ln_match_t *lm,
                         char *why, size_t wl)
{
    const ch_onnx_node_t *g = p->g->nodes;
    const char *form = "not nn.LayerNorm's decomposed form (ReduceMean, Sub, Pow 2, ReduceMean, "
                       "Add eps, Sqrt, Div, Mul weight, Add bias over the last axis)";
    if (!reduce_last(p, &g[r1], rank) || strcmp(g[r1].in[0], t->name))
        return LN_WHY("ReduceMean '%s' %s", g[r1].name, form);
    val_t *mean = val_get(p, g[r1].out[0]);
    int s = only_reader(p, mean, "Sub");
    if (s < 0 || g[s].n_in != 2 || strcmp(g[s].in[0], t->name) || strcmp(g[s].in[1], mean->name))
        return LN_WHY("ReduceMean '%s': %s", g[r1].name, form);
    val_t *xc = val_get(p, g[s].out[0]);
    int pw = -1, dv = -1;
    if (xc && xc->uses == 2)
        for (int k = s + 1; k <= xc->last_use; k++)
            if (g[k].n_in == 2 && !strcmp(g[k].in[0], xc->name) && !g[k].domain[0]) {
                if (!strcmp(g[k].op_type, "Pow")) pw = k;
                else if (!strcmp(g[k].op_type, "Div")) dv = k;
            }
    double two, eps;
    if (pw < 0 || dv < 0 || !const_scalar(val_get(p, g[pw].in[1]), &two) || two != 2.0)
        return LN_WHY("Sub '%s': %s", g[s].name, form);
    val_t *sq = val_get(p, g[pw].out[0]);
    int r2 = only_reader(p, sq, "ReduceMean");
    if (r2 < 0 || !reduce_last(p, &g[r2], rank) || strcmp(g[r2].in[0], sq->name))
        return LN_WHY("Pow '%s': %s", g[pw].name, form);
    val_t *var = val_get(p, g[r2].out[0]);
    int ae = only_reader(p, var, "Add");
    if (ae < 0 || !const_scalar(other_in(p, &g[ae], var), &eps) || !(eps > 0 && eps < 1))
        return LN_WHY("ReduceMean '%s': %s", g[r2].name, form);
    val_t *ve = val_get(p, g[ae].out[0]);
    int sr = only_reader(p, ve, "Sqrt");
    val_t *sd = sr >= 0 ? val_get(p, g[sr].out[0]) : NULL;
    if (sr < 0 || only_reader(p, sd, "Div") != dv || strcmp(g[dv].in[1], sd->name))
        return LN_WHY("Add '%s': %s", g[ae].name, form);
    val_t *xh = val_get(p, g[dv].out[0]);
    int mu = only_reader(p, xh, "Mul");
    val_t *w = mu >= 0 ? other_in(p, &g[mu], xh) : NULL;
    val_t *xw = mu >= 0 ? val_get(p, g[mu].out[0]) : NULL;
    int ab = only_reader(p, xw, "Add");
    val_t *b = ab >= 0 ? other_in(p, &g[ab], xw) : NULL;
    if (!is_vec(w, C) || !is_vec(b, C))
        return LN_WHY("Div '%s': no Mul by a weight and Add of a bias of %lld values after it "
                      "(nn.LayerNorm with elementwise_affine and bias)", g[dv].name, (long long)C);
    const int nodes[9] = {r1, s, pw, r2, ae, sr, dv, mu, ab};
    for (int k = 0; k < 9; k++) lm->nodes[lm->nn++] = nodes[k];
    lm->eps = (float)eps;
    lm->w = w;
    lm->b = b;
    lm->y = val_get(p, g[ab].out[0]);
    lm->name_ni = mu;
    return 1;
}

/* the module for a matched LayerNorm of the run-time value x (N, C, H, W)
 * or (N, C): LayerNorm2d, named by its initializers; y its output */
static ch_status ln_build(mp_t *p, const val_t *x, const ln_match_t *lm, val_t *y)
{
    const ch_onnx_node_t *n0 = p->n;
    const int ni0 = p->ni;
    p->n = &p->g->nodes[lm->name_ni]; /* a renamed module is named after this node */
    p->ni = lm->name_ni;
    char name[CH_NN_NAME_MAX], ent[CH_NN_NAME_MAX + 8];
    const val_t *vals[2] = {lm->w, lm->b};
    const char *locals[2] = {"weight", "bias"};
    ch_status st = weight_prefix(p, vals, locals, 2, name, sizeof name);
    p->n = n0;
    p->ni = ni0;
    CH_TRY(st); /* a LayerNorm applied twice: named like a shared Conv's */
    ch_module_t *m;
    CH_TRY(ch_nn_layernorm2d(p->graph, name, (int)x->rd[1], lm->eps, &m));
    snprintf(ent, sizeof ent, "%s.weight", name);
    CH_TRY(add_load(p, ent, lm->w, 0, 0));
    snprintf(ent, sizeof ent, "%s.bias", name);
    CH_TRY(add_load(p, ent, lm->b, 0, 0));
    for (int k = 0; k < lm->nn; k++) p->skip[lm->nodes[k]] = 1;
    return connect(p, m, &x->id, 1, y, x->rn, x->rd);
}

/* Transpose (0, 2, 3, 1) of x (N, C, H, W) into t: ConvNeXt's channels-last
 * LayerNorm (x.permute(0, 2, 3, 1), nn.LayerNorm(C), .permute(0, 3, 1, 2);
 * torchvision's LayerNorm2d): t read only by a LayerNormalization over its
 * last axis or by the decomposed form, whose output is read only by a
 * Transpose (0, 3, 1, 2). -> LayerNorm2d on x. */
static ch_status map_channels_last_ln(mp_t *p, const val_t *x, val_t *t)
{
    const ch_onnx_node_t *g = p->g->nodes;
    char why[512] = "";
    const size_t wl = sizeof why;
    ln_match_t lm;
    memset(&lm, 0, sizeof lm);
    int ok = 0;
    if (t->uses == 1 && t->last_use >= 0) {
        ok = ln_node(p, t->last_use, t, 4, x->rd[1], &lm, why, wl);
    } else if (t->uses == 2) {
        int r1 = -1;
        for (int k = p->ni + 1; k <= t->last_use; k++)
            if (!strcmp(g[k].op_type, "ReduceMean") && g[k].n_in >= 1 && !strcmp(g[k].in[0], t->name))
                r1 = k;
        if (r1 >= 0) ok = ln_decomposed(p, r1, t, 4, x->rd[1], &lm, why, wl);
        else snprintf(why, wl, "its output is read by 2 nodes, none a ReduceMean");
    } else {
        snprintf(why, wl, "its output is read by %d nodes", t->uses);
    }
    int tb = -1;
    if (ok) {
        tb = only_reader(p, lm.y, "Transpose");
        int c = 0;
        const int64_t *perm = tb >= 0 ? attr_ints(&g[tb], "perm", &c) : NULL;
        if (!perm || c != 4 || perm[0] != 0 || perm[1] != 3 || perm[2] != 1 || perm[3] != 2) {
            const int nu = lm.y ? lm.y->uses : 0;
            const char *rd = nu == 1 ? g[lm.y->last_use].op_type : NULL;
            snprintf(why, wl, "the LayerNorm's output goes to %s%s%s, not to a Transpose (0, 3, 1, "
                     "2) back to (N, C, H, W) (cohort has no channels-last ops after it)",
                     rd ? "a " : "", rd ? rd : nu ? "several nodes" : "nothing",
                     rd && !strcmp(rd, "Transpose") ? " of another perm" : "");
            ok = 0;
        }
    }
    if (!ok)
        return NODE_ERR(CH_ERR_UNSUPPORTED, "Transpose (0, 2, 3, 1) other than a channels-last "
                        "LayerNorm (Transpose (0, 2, 3, 1), LayerNormalization over the last axis "
                        "or its decomposed form, Transpose (0, 3, 1, 2)): %s", why);
    lm.nodes[lm.nn++] = tb;
    return ln_build(p, x, &lm, val_get(p, g[tb].out[0]));
}

/* a LayerNormalization the patterns did not take: over the features of an
 * (N, F) value, else refused */
static ch_status map_layernorm(mp_t *p)
{
    val_t *x;
    char why[512], b1[96];
    CH_TRY(in_val(p, 0, &x));
    if (x && x->kind == V_RUN && x->rn == 2) {
        ln_match_t lm;
        memset(&lm, 0, sizeof lm);
        if (!ln_node(p, p->ni, x, 2, x->rd[1], &lm, why, sizeof why))
            return NODE_ERR(CH_ERR_UNSUPPORTED, "%s", why);
        return ln_build(p, x, &lm, lm.y);
    }
    return NODE_ERR(CH_ERR_UNSUPPORTED, "LayerNormalization of %s over axis %lld: cohort maps "
                    "LayerNorm over the features of an (N, F) value, or over the channels of "
                    "(N, C, H, W) between Transpose (0, 2, 3, 1) and Transpose (0, 3, 1, 2) "
                    "(ConvNeXt's channels-last LayerNorm, torchvision's LayerNorm2d)",
                    x && (x->kind == V_RUN || x->kind == V_CONST) ? shape_str(x, b1, sizeof b1)
                                                                   : "a pending pattern",
                    (long long)attr_i(p->n, "axis", -1));
}

static ch_status map_node(mp_t *p)
{
    const ch_onnx_node_t *n = p->n;
    const char *op = n->op_type;
    val_t *x, *y = out_val(p, 0);
    if (n->domain[0] && strcmp(n->domain, "ai.onnx"))
        return NODE_ERR(CH_ERR_UNSUPPORTED, "domain '%s': the default domain only (supported: %s)",
                        n->domain, CH_ONNX_SUPPORTED_OPS);
    if (!strcmp(op, "Constant")) {
        const ch_onnx_attr_t *a = n->n_attr ? &n->attr[0] : NULL;
        if (!y || !a) return NODE_ERR(CH_ERR_FORMAT, "no value");
        int64_t one = 1;
        if (a->type == CH_ONNX_ATTR_TENSOR && a->t) const_ref(y, a->t);
        else if (a->type == CH_ONNX_ATTR_FLOAT) {
            CH_TRY(const_new(p, y, CH_F32, 0, NULL));
            cset(y, 0, a->f);
        } else if (a->type == CH_ONNX_ATTR_INT) {
            CH_TRY(const_new(p, y, CH_I64, 0, NULL));
            cset(y, 0, (double)a->i);
        } else if (a->type == CH_ONNX_ATTR_FLOATS || a->type == CH_ONNX_ATTR_INTS) {
            one = a->n;
            CH_TRY(const_new(p, y, a->type == CH_ONNX_ATTR_FLOATS ? CH_F32 : CH_I64, 1, &one));
            for (int k = 0; k < a->n; k++)
                cset(y, (size_t)k, a->type == CH_ONNX_ATTR_FLOATS ? a->floats[k] : (double)a->ints[k]);
        } else {
            return NODE_ERR(CH_ERR_UNSUPPORTED, "attribute '%s' (sparse or string constants)",
                            a->name);
        }
        return CH_OK;
    }
    /* every input a constant (Shape: any input): fold at load */
    int all_const = n->n_in > 0;
    for (int k = 0; k < n->n_in; k++) {
        val_t *v;
        CH_TRY(in_val(p, k, &v));
        if (v && v->kind != V_CONST) all_const = 0;
    }
    if (is_fold_op(op) && (all_const || !strcmp(op, "Shape"))) {
        CH_TRY(in_val(p, 0, &x));
        if (!strcmp(op, "Shape") && x->kind != V_RUN && x->kind != V_CONST)
            return NODE_ERR(CH_ERR_UNSUPPORTED, "Shape of a 5-D intermediate");
        return fold(p);
    }
    CH_TRY(in_val(p, 0, &x));
    if (!y) return NODE_ERR(CH_ERR_FORMAT, "no output");
    if (!strcmp(op, "Conv")) return map_conv(p);
    if (!strcmp(op, "BatchNormalization")) return map_bn(p);
    if (!strcmp(op, "Relu") || !strcmp(op, "Sigmoid") || !strcmp(op, "Tanh") ||
        !strcmp(op, "HardSwish") || !strcmp(op, "HardSigmoid") || !strcmp(op, "LeakyRelu") ||
        !strcmp(op, "Gelu") || !strcmp(op, "Clip"))
        return map_act(p, op);
    if (!strcmp(op, "Add") || !strcmp(op, "Mul") || !strcmp(op, "Sub") || !strcmp(op, "Div"))
        return map_binary(p, op);
    if (!strcmp(op, "MaxPool")) return map_pool(p, 1);
    if (!strcmp(op, "AveragePool")) return map_pool(p, 0);
    if (!strcmp(op, "GlobalAveragePool")) return map_global_avg(p, x, 1);
    if (!strcmp(op, "ReduceMean")) {
        if (x && x->kind == V_RUN && x->rn == 2) { /* nn.LayerNorm decomposed (opset < 17) */
            char why[512];
            ln_match_t lm;
            memset(&lm, 0, sizeof lm);
            if (!ln_decomposed(p, p->ni, x, 2, x->rd[1], &lm, why, sizeof why))
                return NODE_ERR(CH_ERR_UNSUPPORTED, "ReduceMean of an (N, F) value: %s", why);
            return ln_build(p, x, &lm, lm.y);
        }
        return map_reduce_mean(p);
    }
    if (!strcmp(op, "LayerNormalization")) return map_layernorm(p);
    if (!strcmp(op, "Gemm")) return map_linear(p, 1);
    if (!strcmp(op, "MatMul")) return map_linear(p, 0);
    if (!strcmp(op, "Split")) return map_split(p);
    if (!strcmp(op, "Slice")) return map_slice(p);
    if (!strcmp(op, "Reshape")) return map_reshape(p);
    if (!strcmp(op, "Concat")) {
        if (axis1(attr_i(n, "axis", 1), 4) != 1)
            return NODE_ERR(CH_ERR_UNSUPPORTED, "Concat of computed values on an axis other than 1");
        int ids[256];
        int64_t C = 0;
        if (n->n_in > 256) return NODE_ERR(CH_ERR_UNSUPPORTED, "more than 256 inputs");
        for (int k = 0; k < n->n_in; k++) {
            val_t *v;
            CH_TRY(in_val(p, k, &v));
            CH_TRY(need_run4(p, v));
            if (v->rd[2] != x->rd[2] || v->rd[3] != x->rd[3])
                return NODE_ERR(CH_ERR_INVALID, "inputs of different H, W");
            ids[k] = v->id;
            C += v->rd[1];
        }
        char name[64];
        auto_name(p, name, sizeof name);
        ch_module_t *m;
        CH_TRY(ch_nn_cat(p->graph, name, &m));
        int64_t rd[4] = {x->rd[0], C, x->rd[2], x->rd[3]};
        return connect(p, m, ids, n->n_in, y, 4, rd);
    }
    if (!strcmp(op, "Flatten")) {
        if (attr_i(n, "axis", 1) != 1) return NODE_ERR(CH_ERR_UNSUPPORTED, "axis other than 1");
        if (x->kind == V_RUN && x->rn == 2) {
            alias(y, x);
            return CH_OK;
        }
        CH_TRY(need_run4(p, x));
        char name[64];
        auto_name(p, name, sizeof name);
        ch_module_t *m;
        CH_TRY(ch_nn_flatten(p->graph, name, &m));
        int64_t rd[2] = {x->rd[0], x->rd[1] * x->rd[2] * x->rd[3]};
        return connect(p, m, &x->id, 1, y, 2, rd);
    }
    if (!strcmp(op, "Dropout")) {
        val_t *r, *mask = out_val(p, 1);
        CH_TRY(in_val(p, 1, &r));
        double ratio = attr_f(n, "ratio", 0.5f);
        if (r && !const_scalar(r, &ratio)) return NODE_ERR(CH_ERR_UNSUPPORTED, "ratio not a constant");
        if (mask && mask->uses) return NODE_ERR(CH_ERR_UNSUPPORTED, "the mask output is read");
        if (!(ratio >= 0 && ratio < 1)) return NODE_ERR(CH_ERR_INVALID, "ratio %g", ratio);
        if (x->kind != V_RUN) return NODE_ERR(CH_ERR_UNSUPPORTED, "input not computed at run time");
        char name[64];
        auto_name(p, name, sizeof name);
        ch_module_t *m;
        CH_TRY(ch_nn_dropout(p->graph, name, (float)ratio, &m));
        return connect(p, m, &x->id, 1, y, x->rn, x->rd);
    }
    if (!strcmp(op, "Identity")) {
        if (x->kind != V_RUN) return NODE_ERR(CH_ERR_UNSUPPORTED, "Identity of a pending pattern");
        alias(y, x);
        return CH_OK;
    }
    if (!strcmp(op, "Squeeze") || !strcmp(op, "Unsqueeze")) {
        return NODE_ERR(CH_ERR_UNSUPPORTED, "%s of a computed value (Flatten or Reshape(N, -1) "
                        "instead)", op);
    }
    if (!strcmp(op, "Transpose")) {
        int c;
        const int64_t *perm = attr_ints(n, "perm", &c);
        if (x->kind == V_SHUF5 && perm && c == 5 && perm[0] == 0 && perm[1] == 2 && perm[2] == 1 &&
            perm[3] == 3 && perm[4] == 4) {
            alias(y, x);
            y->kind = V_SHUF5T;
            return CH_OK;
        }
        if (x->kind == V_RUN && x->rn == 4 && perm && c == 4 && perm[0] == 0 && perm[1] == 2 &&
            perm[2] == 3 && perm[3] == 1)
            return map_channels_last_ln(p, x, y);
        if (x->kind == V_CONST && x->ndim == 2 &&
            (!perm || (c == 2 && perm[0] == 1 && perm[1] == 0))) {
            /* a constant matrix transposed (nn.Linear(bias=False) exports
             * MatMul(x, Transpose(fc.weight))): folded; MatMul takes the
             * original, under its name */
            int64_t d[2] = {x->dims[1], x->dims[0]};
            const val_t src = *x;
            CH_TRY(const_new(p, y, x->dtype, 2, d));
            for (int64_t r = 0; r < d[0]; r++)
                for (int64_t q = 0; q < d[1]; q++)
                    cset(y, (size_t)(r * d[1] + q), cget(&src, (size_t)(q * d[0] + r)));
            y->tsrc = x;
            return CH_OK;
        }
        return NODE_ERR(CH_ERR_UNSUPPORTED, "Transpose other than a channel shuffle's "
                        "(Reshape (N, g, C/g, H, W), Transpose (0, 2, 1, 3, 4), Reshape (N, C, H, W)) "
                        "or a channels-last LayerNorm's (Transpose (0, 2, 3, 1), LayerNormalization, "
                        "Transpose (0, 3, 1, 2))");
    }
    if (!strcmp(op, "Pad")) {
        val_t *pv, *cv;
        CH_TRY(in_val(p, 1, &pv));
        CH_TRY(in_val(p, 2, &cv));
        const ch_onnx_attr_t *mode = ch_onnx_node_attr(n, "mode");
        int64_t pads[8] = {0};
        int np = 0;
        if (pv) CH_TRY(const_ints(p, pv, "pads", pads, 8, &np));
        else {
            const int64_t *a = attr_ints(n, "pads", &np);
            for (int k = 0; k < np && k < 8; k++) pads[k] = a[k];
        }
        double cval = 0;
        if (cv && !const_scalar(cv, &cval)) return NODE_ERR(CH_ERR_UNSUPPORTED, "value not a constant");
        CH_TRY(need_run4(p, x));
        int zero = 1;
        for (int k = 0; k < np; k++) zero = zero && pads[k] == 0;
        if (zero) {
            alias(y, x);
            return CH_OK;
        }
        if ((mode && mode->type == CH_ONNX_ATTR_STRING && strcmp(mode->s, "constant")) ||
            cval != 0 || np != 8 || pads[0] || pads[1] || pads[4] || pads[5] || pads[2] != pads[6] ||
            pads[3] != pads[7] || y->uses != 1 ||
            strcmp(p->g->nodes[y->last_use].op_type, "AveragePool"))
            return NODE_ERR(CH_ERR_UNSUPPORTED, "Pad other than symmetric zeros on H, W before an "
                            "AveragePool");
        alias(y, x);
        y->kind = V_PAD;
        y->pad_h = (int)pads[2];
        y->pad_w = (int)pads[3];
        return CH_OK;
    }
    return NODE_ERR(CH_ERR_UNSUPPORTED, "op not supported (supported: %s)", CH_ONNX_SUPPORTED_OPS);
}

/* ------------------------------------------------------------ the model */

static ch_status load_values(mp_t *p)
{
    ch_model_t *M = p->M;
    int ne = ch_model_num_entries(M);
    char *done = calloc((size_t)ne + 1, 1);
    if (!done) return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory", p->what);
    ch_status s = CH_OK;
    for (int k = 0; k < p->nld && s == CH_OK; k++) {
        const load_t *l = &p->ld[k];
        ch_param_t *e = ch_model_find(M, l->name);
        if (!e || e->dtype != CH_F32 || e->numel != l->numel) {
            s = CH_ERROR(CH_ERR_INVALID, "%s: entry '%s' (%zu values in the file) does not fit the "
                         "model", p->what, l->name, l->numel);
            break;
        }
        float *dst = e->data;
        const float *src = l->src;
        if (l->rows > 0)
            for (int64_t r = 0; r < l->rows; r++)
                for (int64_t c = 0; c < l->cols; c++) dst[c * l->rows + r] = src[r * l->cols + c];
        else memcpy(dst, src, l->numel * sizeof(float));
        done[e->index] = 1;
    }
    for (int i = 0; i < ne && s == CH_OK; i++) {
        ch_param_t *e = ch_model_entry(M, i);
        if (done[i]) continue;
        if (e->dtype == CH_I64 && !strcmp(e->local, "num_batches_tracked")) {
            const ch_onnx_tensor_t *t = ch_onnx_find_init(p->g, e->name);
            int64_t v = t && t->numel == 1 && t->dtype == CH_I64 ? ((const int64_t *)t->data)[0] : 0;
            for (size_t k = 0; k < e->numel; k++) ((int64_t *)e->data)[k] = v;
            continue;
        }
        s = CH_ERROR(CH_ERR_INVALID, "%s: no value in the file for entry '%s'", p->what, e->name);
    }
    free(done);
    return s;
}

static ch_status build(mp_t *p, const int64_t in_shape[4], const ch_onnx_map_options_t *o)
{
    const ch_onnx_model_t *g = p->g;
    char b1[96];
    /* the input */
    if (g->n_inputs != 1)
        return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: the graph has %d inputs (not initializers), "
                        "expected exactly one image batch (N, C, H, W)", p->what, g->n_inputs);
    const ch_onnx_value_info_t *gi = &g->inputs[0];
    if (gi->elem_type != 1 || gi->ndim != 4)
        return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: input '%s' is %s of rank %d, expected a float "
                        "(N, C, H, W) batch", p->what, gi->name, ch_onnx_type_name(gi->elem_type),
                        gi->ndim);
    for (int d = 1; d < 4; d++)
        if (gi->dims[d] >= 0 && gi->dims[d] != in_shape[d])
            return CH_ERROR(CH_ERR_INVALID, "%s: input '%s' is (%lld, %lld, %lld, %lld) but the "
                            "data gives (%lld, %lld, %lld, %lld): %s differ (channels: "
                            "model.in_channels / data; size: data.image_size)", p->what, gi->name,
                            (long long)gi->dims[0], (long long)gi->dims[1], (long long)gi->dims[2],
                            (long long)gi->dims[3], (long long)in_shape[0], (long long)in_shape[1],
                            (long long)in_shape[2], (long long)in_shape[3],
                            d == 1 ? "the channels" : "the image sizes");
    p->file_batch = gi->dims[0];
    if (g->n_outputs != 1)
        return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: the graph has %d outputs, expected exactly one "
                        "(the logits, float (N, classes))", p->what, g->n_outputs);
    if (g->outputs[0].elem_type != 1)
        return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: output '%s' is %s, expected float logits (N, "
                        "classes)", p->what, g->outputs[0].name,
                        ch_onnx_type_name(g->outputs[0].elem_type));
    CH_TRY(check_ops(p));
    /* the value table: every name, then consumers */
    size_t nnames = (size_t)g->n_init + 1;
    for (int k = 0; k < g->n_nodes; k++) nnames += (size_t)g->nodes[k].n_out;
    p->hcap = 16;
    while (p->hcap < 2 * nnames) p->hcap *= 2;
    p->hash = malloc(p->hcap * sizeof *p->hash);
    p->v = calloc(nnames, sizeof *p->v);
    p->skip = calloc((size_t)g->n_nodes + 1, 1);
    if (!p->hash || !p->v || !p->skip) return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory", p->what);
    for (size_t k = 0; k < p->hcap; k++) p->hash[k] = -1;
    val_add(p, gi->name);
    for (int k = 0; k < g->n_init; k++) val_add(p, g->init[k].name);
    for (int k = 0; k < g->n_nodes; k++)
        for (int j = 0; j < g->nodes[k].n_out; j++) val_add(p, g->nodes[k].out[j]);
    for (int k = 0; k < g->n_nodes; k++)
        for (int j = 0; j < g->nodes[k].n_in; j++) {
            val_t *v = val_get(p, g->nodes[k].in[j]);
            if (v) {
                v->uses++;
                v->last_use = k;
            }
        }
    val_t *gout = val_get(p, g->outputs[0].name);
    if (gout) gout->uses += 2; /* never swallowed by a pattern */
    for (int k = 0; k < g->n_init; k++) {
        val_t *v = val_get(p, g->init[k].name);
        const_ref(v, &g->init[k]);
        v->init = &g->init[k];
    }
    val_t *vin = val_get(p, gi->name);
    vin->kind = V_RUN;
    vin->id = 0;
    vin->rn = 4;
    for (int d = 0; d < 4; d++) vin->rd[d] = in_shape[d];
    p->N = in_shape[0];
    /* the modules */
    CH_TRY(ch_model_new("onnx", &p->M));
    CH_TRY(ch_nn_graph(ch_model_root(p->M), "", &p->graph));
    /* Constant nodes first (they read nothing), so the patterns that look
     * ahead (GELU's erf form, MatMul + Add, the decomposed LayerNorm) see
     * the constants after them */
    for (int k = 0; k < g->n_nodes; k++) {
        if (strcmp(g->nodes[k].op_type, "Constant") || g->nodes[k].domain[0]) continue;
        p->n = &g->nodes[k];
        p->ni = k;
        CH_TRY(map_node(p));
        p->skip[k] = 1;
    }
    for (int k = 0; k < g->n_nodes; k++) {
        if (p->skip[k]) continue;
        p->n = &g->nodes[k];
        p->ni = k;
        CH_TRY(map_node(p));
    }
    if (!gout || gout->kind != V_RUN || gout->rn != 2)
        return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: output '%s' is %s, expected the logits (N, "
                        "classes)", p->what, g->outputs[0].name,
                        !gout || gout->kind == V_NONE ? "not computed"
                        : gout->kind == V_CONST ? "a constant"
                        : gout->kind == V_RUN ? shape_str(gout, b1, sizeof b1) : "not (N, classes)");
    if (o->num_classes > 0 && gout->rd[1] != o->num_classes)
        return CH_ERROR(CH_ERR_INVALID, "%s: output '%s' has %lld classes, model.num_classes is %d",
                        p->what, gout->name, (long long)gout->rd[1], o->num_classes);
    if (gout->id == 0)
        return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: the output is the input", p->what);
    CH_TRY(ch_nn_graph_set_output(p->graph, gout->id));
    CH_TRY(ch_model_finalize_init(p->M, CH_NN_INIT_DEFAULT, 0));
    CH_TRY(load_values(p));
    if (p->n_renamed)
        ch_log_warn_rank0("%s: %d module%s renamed (see above): a checkpoint's names differ from the "
                          "PyTorch module's there", p->what, p->n_renamed, p->n_renamed == 1 ? "" : "s");
    return CH_OK;
}

ch_status ch_onnx_to_model(const ch_onnx_model_t *g, const int64_t input_shape[4],
                           const ch_onnx_map_options_t *opts, ch_model_t **out)
{
    CH_REQUIRE(g && input_shape && out, "ch_onnx_to_model: NULL argument");
    *out = NULL;
    ch_onnx_map_options_t o;
    if (opts) o = *opts;
    else ch_onnx_map_options_default(&o);
    for (int d = 0; d < 4; d++)
        CH_REQUIRE(input_shape[d] > 0 && input_shape[d] <= (1 << 24),
                   "ch_onnx_to_model: input shape dimension %d = %lld", d, (long long)input_shape[d]);
    mp_t p;
    memset(&p, 0, sizeof p);
    p.g = g;
    p.what = o.what ? o.what : "ONNX model";
    ch_status s = build(&p, input_shape, &o);
    for (int k = 0; k < p.nv; k++) free(p.v[k].own);
    free(p.v);
    free(p.hash);
    free(p.ld);
    free(p.skip);
    if (s != CH_OK) {
        ch_model_destroy(p.M);
        return s;
    }
    *out = p.M;
    return CH_OK;
}

ch_status ch_onnx_model_load(const char *path, const int64_t input_shape[4],
                             const ch_onnx_map_options_t *opts, ch_model_t **out)
{
    CH_REQUIRE(path && out, "ch_onnx_model_load: NULL argument");
    *out = NULL;
    ch_onnx_map_options_t o;
    if (opts) o = *opts;
    else ch_onnx_map_options_default(&o);
    if (!o.what) o.what = path;
    ch_onnx_model_t *g;
    CH_TRY(ch_onnx_load(path, &g));
    ch_status s = ch_onnx_to_model(g, input_shape, &o, out);
    ch_onnx_free(g);
    return s;
}
