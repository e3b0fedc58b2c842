/* cohort: the reducer (state, kernels, cross-rank merge, result), see reduce.h. */
#include "config.h"

#include "framework/reduce/reduce.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --------------------------------------------------------------- op names */

static const char *const kind_names[CH_ROP_COUNT_] = {
    "sum", "mean", "var", "std", "min", "max", "argmin", "argmax", "nansum", "nanmean",
    "nanvar", "nanstd", "nanmin", "nanmax", "count_nonzero", "histogram",
};

const char *ch_reduce_kind_name(ch_reduce_kind k)
{
    return (unsigned)k < CH_ROP_COUNT_ ? kind_names[k] : "?";
}

ch_status ch_reduce_kind_from_name(const char *name, ch_reduce_kind *out)
{
    for (int i = 0; i < CH_ROP_COUNT_; i++)
        if (!strcmp(name, kind_names[i])) {
            *out = (ch_reduce_kind)i;
            return CH_OK;
        }
    return CH_ERROR(CH_ERR_INVALID,
                    "unknown operation '%s' (expected sum, mean, var, std, min, max, argmin, "
                    "argmax, nansum, nanmean, nanvar, nanstd, nanmin, nanmax, count_nonzero or "
                    "histogram)",
                    name);
}

void ch_reduce_spec_default(ch_reduce_spec_t *s)
{
    memset(s, 0, sizeof *s);
    s->op = CH_ROP_SUM;
    s->mode = CH_REDUCE_EXACT;
    s->naxes = -1;
    s->bins = 10;
}

ch_status ch_reduce_parse_axes(const char *text, ch_reduce_spec_t *s)
{
    const char *p = text;
    while (isspace((unsigned char)*p) || *p == '(' || *p == '[') p++;
    if (*p == 0 || !strncmp(p, "none", 4) || !strncmp(p, "None", 4)) {
        s->naxes = -1;
        return CH_OK;
    }
    int n = 0;
    while (*p && *p != ')' && *p != ']') {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < -CH_REDUCE_MAX_DIMS || v >= CH_REDUCE_MAX_DIMS)
            return CH_ERROR(CH_ERR_INVALID, "axis '%s': expected none, an integer or a tuple like 0,2",
                            text);
        if (n == CH_REDUCE_MAX_DIMS)
            return CH_ERROR(CH_ERR_INVALID, "axis '%s': more than %d axes", text, CH_REDUCE_MAX_DIMS);
        s->axes[n++] = (int)v;
        p = end;
        while (isspace((unsigned char)*p) || *p == ',') p++;
    }
    s->naxes = n;
    return n ? CH_OK
             : CH_ERROR(CH_ERR_INVALID, "axis '%s': an empty tuple (write none for all axes)", text);
}

/* ----------------------------------------------------------------- state */

/* SIMD kernels: one clone per ISA picked at load time (GCC function
 * multiversioning), vectorized at -O3 whatever the build's -O level. */
#define CH_SIMD_KERNEL \
    __attribute__((target_clones("avx512f", "avx2", "default"), optimize("O3")))

/* Elements converted at a time (the reducer's scratch). */
#define BLOCK 16384
/* Most elements one kernel call sees without conversion (bounds the adds
 * between two superaccumulator normalizations). */
#define MAX_DIRECT (1 << 23)

/* Value class of the converted elements. */
enum { VC_F64, VC_I64, VC_U64 };

/* How a state field merges across ranks. */
enum {
    M_NONE,   /* identical on every rank (means of pass 1) */
    M_XSUM,   /* superaccumulators: int64 SUM after normalize */
    M_F64SUM, /* float64 SUM (fast mode) */
    M_U64SUM, /* uint64 SUM, wrapping (integer sums, counts) */
    M_F64MIN, M_F64MAX, M_I64MIN, M_I64MAX, M_U64MIN, M_U64MAX,
    M_ARGIDX, /* int64 index: kept where this rank's value is the merged one, then MIN */
    M_I64MINIDX, /* int64 MIN (first NaN index) */
};

#define MAX_FIELDS 8

typedef struct {
    void *p;
    size_t elem; /* bytes per element */
    int64_t n;
    int merge;
    int pass_mask; /* bit p: merged at the end of pass p */
} field_t;

struct ch_reducer {
    ch_reduce_spec_t spec;
    ch_array_desc_t in;
    int reduced[CH_REDUCE_MAX_DIMS];
    int64_t ostride[CH_REDUCE_MAX_DIMS], qstride[CH_REDUCE_MAX_DIMS];
    int64_t nout, nred;
    int cls, passes, pass, need_q, is_nan_op;
    ch_array_dtype rtype;
    /* state */
    ch_xsum_t *xs;
    double *ds;
    uint64_t *us;  /* integer sums */
    int64_t *cnt;  /* non-NaN counts / count_nonzero / histogram bins */
    int64_t *nan;  /* NaN counts */
    double *dval;  /* min/max values (F64) */
    int64_t *ival; /* min/max values (I64, U64 as bits) */
    int64_t *idx, *nanidx;
    double *mean;  /* var pass 2: the means */
    double hrange[2]; /* histogram: data min, max (pass 0) then the range */
    double *edges;
    int64_t adds; /* superaccumulator adds since the last normalize (bound) */
    uint64_t *scratch; /* BLOCK converted values */
    field_t f[MAX_FIELDS];
    int nf;
    /* result */
    void *result;
    ch_array_desc_t rdesc;
    char warnings[256];
};

static int is_float(ch_array_dtype d) { return d >= CH_DT_FLOAT16; }
static int is_unsigned(ch_array_dtype d) { return d >= CH_DT_UINT8 && d <= CH_DT_UINT64; }

static int nan_op(ch_reduce_kind k) { return k >= CH_ROP_NANSUM && k <= CH_ROP_NANMAX; }

/* The plain operation behind a nan-variant (nanvar -> var). */
static ch_reduce_kind base_op(ch_reduce_kind k)
{
    static const ch_reduce_kind base[] = {CH_ROP_SUM, CH_ROP_MEAN, CH_ROP_VAR,
                                          CH_ROP_STD, CH_ROP_MIN,  CH_ROP_MAX};
    return nan_op(k) ? base[k - CH_ROP_NANSUM] : k;
}

static ch_array_dtype result_dtype(ch_reduce_kind k, ch_array_dtype in)
{
    switch (base_op(k)) {
    case CH_ROP_SUM:
        return is_float(in) ? in : is_unsigned(in) ? CH_DT_UINT64 : CH_DT_INT64;
    case CH_ROP_MEAN: case CH_ROP_VAR: case CH_ROP_STD:
        return is_float(in) ? in : CH_DT_FLOAT64;
    case CH_ROP_MIN: case CH_ROP_MAX:
        return in;
    default:
        return CH_DT_INT64;
    }
}

static ch_status add_field(ch_reducer_t *r, void **p, size_t elem, int64_t n, int merge, int mask)
{
    *p = calloc((size_t)(n ? n : 1), elem);
    if (!*p)
        return CH_ERROR(CH_ERR_NOMEM, "reduce state: %lld x %zu bytes", (long long)n, elem);
    r->f[r->nf++] = (field_t){*p, elem, n, merge, mask};
    return CH_OK;
}

static void fill_f64(double *p, int64_t n, double v)
{
    for (int64_t i = 0; i < n; i++) p[i] = v;
}

static void fill_i64(int64_t *p, int64_t n, int64_t v)
{
    for (int64_t i = 0; i < n; i++) p[i] = v;
}

/* Set min/max/arg state to the identity of the comparison. */
static void init_extremes(ch_reducer_t *r)
{
    ch_reduce_kind b = base_op(r->spec.op);
    int is_min = (b == CH_ROP_MIN || b == CH_ROP_ARGMIN);
    if (r->dval) fill_f64(r->dval, r->nout, is_min ? INFINITY : -INFINITY);
    if (r->ival) {
        int64_t v = r->cls == VC_U64 ? (is_min ? -1 /* UINT64_MAX */ : 0)
                                     : (is_min ? INT64_MAX : INT64_MIN);
        fill_i64(r->ival, r->nout, v);
    }
    if (r->idx) fill_i64(r->idx, r->nout, INT64_MAX);
    if (r->nanidx) fill_i64(r->nanidx, r->nout, INT64_MAX);
}

/* Histogram edges from hrange: numpy's _get_outer_edges (equal ends widened
 * by 0.5) and linspace(lo, hi, bins + 1) = i * step + lo, last = hi. */
static void set_edges(ch_reducer_t *r)
{
    if (r->hrange[0] == r->hrange[1]) {
        r->hrange[0] -= 0.5;
        r->hrange[1] += 0.5;
    }
    int64_t nb = r->spec.bins;
    double lo = r->hrange[0], hi = r->hrange[1], step = (hi - lo) / (double)nb;
    for (int64_t i = 0; i < nb; i++) r->edges[i] = (double)i * step + lo;
    r->edges[nb] = hi;
}

ch_status ch_reducer_create(const ch_reduce_spec_t *spec, const ch_array_desc_t *in,
                            ch_reducer_t **out)
{
    *out = NULL;
    CH_REQUIRE(spec && in, "ch_reducer_create: NULL argument");
    CH_REQUIRE((unsigned)spec->op < CH_ROP_COUNT_, "unknown reduce operation %d", (int)spec->op);
    CH_REQUIRE((unsigned)in->dtype < CH_DT_COUNT_, "unknown dtype %d", (int)in->dtype);
    CH_REQUIRE(in->ndim >= 0 && in->ndim <= CH_REDUCE_MAX_DIMS, "ndim %d outside 0..%d", in->ndim,
               CH_REDUCE_MAX_DIMS);
    for (int i = 0; i < in->ndim; i++)
        CH_REQUIRE(in->shape[i] >= 0, "shape[%d] = %lld < 0", i, (long long)in->shape[i]);
    ch_reduce_kind op = spec->op, b = base_op(op);
    int d = in->ndim;
    int reduced[CH_REDUCE_MAX_DIMS] = {0};
    if (spec->naxes < 0) {
        for (int i = 0; i < d; i++) reduced[i] = 1;
    } else {
        if (op == CH_ROP_HISTOGRAM)
            return CH_ERROR(CH_ERR_INVALID, "histogram reduces the whole array: give no axis");
        if ((b == CH_ROP_ARGMIN || b == CH_ROP_ARGMAX) && spec->naxes != 1)
            return CH_ERROR(CH_ERR_INVALID, "%s takes one axis or none, not %d axes",
                            ch_reduce_kind_name(op), spec->naxes);
        for (int i = 0; i < spec->naxes; i++) {
            int a = spec->axes[i];
            if (a < -d || a >= d)
                return CH_ERROR(CH_ERR_RANGE, "axis %d is out of bounds for array of dimension %d",
                                a, d);
            if (a < 0) a += d;
            if (reduced[a]) return CH_ERROR(CH_ERR_INVALID, "axis %d is repeated", a);
            reduced[a] = 1;
        }
    }
    int64_t nout = 1, nred = 1;
    for (int i = 0; i < d; i++) {
        if (reduced[i]) nred *= in->shape[i];
        else nout *= in->shape[i];
    }
    if (nred == 0 && nout > 0 &&
        (b == CH_ROP_MIN || b == CH_ROP_MAX || b == CH_ROP_ARGMIN || b == CH_ROP_ARGMAX))
        return CH_ERROR(CH_ERR_INVALID,
                        "zero-size array to reduction operation %s which has no identity",
                        ch_reduce_kind_name(op));
    if (op == CH_ROP_HISTOGRAM) {
        if (spec->bins < 1)
            return CH_ERROR(CH_ERR_INVALID, "histogram bins = %lld: must be >= 1",
                            (long long)spec->bins);
        if (spec->has_range && !(spec->range[0] <= spec->range[1]))
            return CH_ERROR(CH_ERR_INVALID, "histogram range [%g, %g]: max must be larger than min",
                            spec->range[0], spec->range[1]);
        if (spec->has_range && !(isfinite(spec->range[0]) && isfinite(spec->range[1])))
            return CH_ERROR(CH_ERR_INVALID, "histogram range [%g, %g] is not finite",
                            spec->range[0], spec->range[1]);
    }
    ch_reducer_t *r = calloc(1, sizeof *r);
    if (!r) return CH_ERROR(CH_ERR_NOMEM, "reducer");
    r->spec = *spec;
    r->in = *in;
    memcpy(r->reduced, reduced, sizeof reduced);
    r->nout = nout;
    r->nred = nred;
    r->rtype = result_dtype(op, in->dtype);
    r->is_nan_op = nan_op(op) && is_float(in->dtype);
    r->need_q = (b == CH_ROP_ARGMIN || b == CH_ROP_ARGMAX);
    int64_t os = 1, qs = 1;
    for (int i = d - 1; i >= 0; i--) {
        if (reduced[i]) {
            r->qstride[i] = qs;
            qs *= in->shape[i];
        } else {
            r->ostride[i] = os;
            os *= in->shape[i];
        }
    }
    int intop = (b == CH_ROP_SUM || b == CH_ROP_MIN || b == CH_ROP_MAX || b == CH_ROP_ARGMIN ||
                 b == CH_ROP_ARGMAX || op == CH_ROP_COUNT_NONZERO);
    r->cls = (is_float(in->dtype) || !intop) ? VC_F64 : is_unsigned(in->dtype) ? VC_U64 : VC_I64;
    r->passes = (b == CH_ROP_VAR || b == CH_ROP_STD || (op == CH_ROP_HISTOGRAM && !spec->has_range))
                    ? 2 : 1;
    int exact = spec->mode == CH_REDUCE_EXACT;
    ch_status s = CH_OK;
    void **pp;
#define FIELD(ptr, elem, n, merge, mask)                                                         \
    do {                                                                                         \
        pp = (void **)&(ptr);                                                                    \
        if (s == CH_OK) s = add_field(r, pp, (elem), (n), (merge), (mask));                      \
    } while (0)
    switch (b) {
    case CH_ROP_SUM: case CH_ROP_MEAN: case CH_ROP_VAR: case CH_ROP_STD:
        if (r->cls != VC_F64) {
            FIELD(r->us, 8, nout, M_U64SUM, 1);
        } else if (exact) {
            FIELD(r->xs, sizeof(ch_xsum_t), nout, M_XSUM, 3);
        } else {
            FIELD(r->ds, 8, nout, M_F64SUM, 3);
        }
        if (r->is_nan_op) FIELD(r->cnt, 8, nout, M_U64SUM, 1);
        if (r->passes == 2) FIELD(r->mean, 8, nout, M_NONE, 0);
        break;
    case CH_ROP_MIN: case CH_ROP_MAX: case CH_ROP_ARGMIN: case CH_ROP_ARGMAX: {
        int is_min = (b == CH_ROP_MIN || b == CH_ROP_ARGMIN);
        if (r->cls == VC_F64) {
            FIELD(r->dval, 8, nout, is_min ? M_F64MIN : M_F64MAX, 1);
            FIELD(r->nan, 8, nout, M_U64SUM, 1);
            FIELD(r->cnt, 8, nout, M_U64SUM, 1);
        } else {
            int m = r->cls == VC_U64 ? (is_min ? M_U64MIN : M_U64MAX) : (is_min ? M_I64MIN : M_I64MAX);
            FIELD(r->ival, 8, nout, m, 1);
        }
        if (r->need_q) {
            FIELD(r->idx, 8, nout, M_ARGIDX, 1);
            if (r->cls == VC_F64) FIELD(r->nanidx, 8, nout, M_I64MINIDX, 1);
        }
        break;
    }
    case CH_ROP_COUNT_NONZERO:
        FIELD(r->cnt, 8, nout, M_U64SUM, 1);
        break;
    default: /* histogram */
        FIELD(r->cnt, 8, spec->bins, M_U64SUM, r->passes == 2 ? 2 : 1);
        FIELD(r->edges, 8, spec->bins + 1, M_NONE, 0);
        if (r->passes == 2) FIELD(r->nan, 8, 1, M_U64SUM, 1);
        break;
    }
#undef FIELD
    r->scratch = malloc(BLOCK * sizeof *r->scratch);
    if (s == CH_OK && !r->scratch) s = CH_ERROR(CH_ERR_NOMEM, "reduce scratch");
    if (s != CH_OK) {
        ch_reducer_destroy(r);
        return s;
    }
    init_extremes(r);
    r->hrange[0] = spec->has_range ? spec->range[0] : INFINITY;
    r->hrange[1] = spec->has_range ? spec->range[1] : -INFINITY;
    if (op == CH_ROP_HISTOGRAM && spec->has_range) set_edges(r);
    *out = r;
    return CH_OK;
}

void ch_reducer_destroy(ch_reducer_t *r)
{
    if (!r) return;
    for (int i = 0; i < r->nf; i++) free(r->f[i].p);
    free(r->scratch);
    free(r->result);
    free(r);
}

int ch_reducer_passes(const ch_reducer_t *r) { return r->passes; }
int ch_reducer_pass(const ch_reducer_t *r) { return r->pass; }

/* -------------------------------------------------------------- conversion */


static uint16_t bswap16(uint16_t v) { return (uint16_t)((v >> 8) | (v << 8)); }

/* Convert n stored elements to the value class: doubles, int64 or uint64. */
static void convert(const unsigned char *raw, ch_array_dtype dt, int swap, int64_t n, int cls,
                    void *outp)
{
    double *od = outp;
    int64_t *oi = outp;
    uint64_t *ou = outp;
    size_t sz = ch_array_dtype_size(dt);
    for (int64_t i = 0; i < n; i++) {
        const unsigned char *p = raw + (size_t)i * sz;
        uint64_t u = 0;
        switch (sz) {
        case 1: u = p[0]; break;
        case 2: { uint16_t v; memcpy(&v, p, 2); u = swap ? bswap16(v) : v; break; }
        case 4: { uint32_t v; memcpy(&v, p, 4); u = swap ? __builtin_bswap32(v) : v; break; }
        default: { uint64_t v; memcpy(&v, p, 8); u = swap ? __builtin_bswap64(v) : v; break; }
        }
        int64_t sv = 0; /* signed value for integer dtypes */
        double dv = 0;
        switch (dt) {
        case CH_DT_BOOL: sv = u != 0; break;
        case CH_DT_INT8: sv = (int8_t)u; break;
        case CH_DT_INT16: sv = (int16_t)u; break;
        case CH_DT_INT32: sv = (int32_t)u; break;
        case CH_DT_INT64: sv = (int64_t)u; break;
        case CH_DT_FLOAT16: dv = ch_half_to_double((uint16_t)u); break;
        case CH_DT_FLOAT32: { uint32_t w = (uint32_t)u; float f; memcpy(&f, &w, 4); dv = f; break; }
        case CH_DT_FLOAT64: memcpy(&dv, &u, 8); break;
        default: break; /* unsigned: u */
        }
        if (cls == VC_F64) {
            od[i] = is_float(dt) ? dv : is_unsigned(dt) ? (double)u : (double)sv;
        } else if (cls == VC_I64) {
            oi[i] = sv;
        } else {
            ou[i] = u;
        }
    }
}

/* ----------------------------------------------------------------- kernels */

/* One run: elements x[0..len) of the fastest storage axis go to output
 * o + j*os with reduction index q + j*qs. */
typedef struct {
    int64_t o, os, q, qs;
} run_t;

static inline double two_prod_err(double a, double b, double p) { return fma(a, b, -p); }

/* Add x 2^k exactly (x finite, x 2^k inside the accumulator: its lowest
 * bit at or above 2^-1074, its highest below 2^1154). */
static void xsum_add_pow2(ch_xsum_t *a, double x, int k)
{
    if (x == 0) return;
    int e;
    double f = frexp(x, &e); /* x = f 2^e, 0.5 <= |f| < 1: f 2^53 is an integer */
    ch_xsum_add_scaled(a, (int64_t)ldexp(f, 53), e - 53 + k + 1074);
}

/* (x - m)^2 for finite x and m with |x - m| = |s| >= 2^480, where s^2 or
 * 2 s t may overflow float64. |s| >= 2^544: the square is at least 2^1088,
 * so the variance (divided by a count < 2^63) is above DBL_MAX: +inf, the
 * correctly rounded answer (also when x - m itself overflowed). Below, the
 * products are formed with s scaled by 2^-128 (exact) and added scaled back
 * by 2^256 and 2^128: the same exact terms as the plain path, which the
 * accumulator (up to 2^1165) holds. */
static void xsum_add_sqdev_big(ch_xsum_t *a, double x, double m, double s)
{
    if (!(fabs(s) < 0x1p544)) {
        ch_xsum_add(a, INFINITY);
        return;
    }
    double bb = s - x;
    double t = (x - (s - bb)) + (-m - bb);
    double u = ldexp(s, -128), p = u * u;
    xsum_add_pow2(a, p, 256);
    xsum_add_pow2(a, two_prod_err(u, u, p), 256);
    if (t != 0) {
        double u2 = 2 * u, p2 = u2 * t, p3 = t * t; /* |t| <= 2^-53 |s|: t^2 < 2^982 */
        xsum_add_pow2(a, p2, 128);
        xsum_add_pow2(a, two_prod_err(u2, t, p2), 128);
        ch_xsum_add(a, p3);
        ch_xsum_add(a, two_prod_err(t, t, p3));
    }
}

/* Add (x - m)^2 exactly: x - m = s + t (TwoSum), (s + t)^2 = s^2 + 2 s t + t^2,
 * each product as p + e (FMA). Non-finite x or m: NaN or inf as IEEE
 * arithmetic gives (numpy's); huge finite deviations: xsum_add_sqdev_big. */
static inline void xsum_add_sqdev(ch_xsum_t *a, double x, double m)
{
    double s = x - m;
    if (__builtin_expect(!(fabs(s) < 0x1p480), 0) && isfinite(x) && isfinite(m)) {
        xsum_add_sqdev_big(a, x, m, s);
        return;
    }
    double bb = s - x;
    double t = (x - (s - bb)) + (-m - bb);
    double p = s * s;
    ch_xsum_add(a, p);
    ch_xsum_add(a, two_prod_err(s, s, p));
    if (t != 0) {
        double s2 = 2 * s, p2 = s2 * t, p3 = t * t;
        ch_xsum_add(a, p2);
        ch_xsum_add(a, two_prod_err(s2, t, p2));
        ch_xsum_add(a, p3);
        ch_xsum_add(a, two_prod_err(t, t, p3));
    }
}

/* Fast sums, SIMD over the output elements (unit output stride). */
CH_SIMD_KERNEL
static void fast_add_contig(double *restrict acc, const double *restrict x, int64_t n)
{
    for (int64_t j = 0; j < n; j++) acc[j] += x[j];
}

/* Fast sum of a contiguous reduced run: 8 partial sums. */
CH_SIMD_KERNEL
static double fast_sum_run(const double *restrict x, int64_t n)
{
    double p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++) p[k] += x[j + k];
    double s = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
    for (; j < n; j++) s += x[j];
    return s;
}

static void run_f64(ch_reducer_t *r, const double *x, int64_t len, run_t u)
{
    ch_reduce_kind b = base_op(r->spec.op);
    int skip_nan = r->is_nan_op;
    int exact = r->spec.mode == CH_REDUCE_EXACT;
    int64_t o = u.o, q = u.q;
    switch (b) {
    case CH_ROP_SUM: case CH_ROP_MEAN: case CH_ROP_VAR: case CH_ROP_STD:
        if (r->pass == 1) { /* var: squared deviations */
            for (int64_t j = 0; j < len; j++, o += u.os) {
                if (skip_nan && isnan(x[j])) continue;
                if (exact) xsum_add_sqdev(&r->xs[o], x[j], r->mean[o]);
                else { double dv = x[j] - r->mean[o]; r->ds[o] += dv * dv; }
            }
            r->adds += 6 * len;
            break;
        }
        if (skip_nan) {
            for (int64_t j = 0; j < len; j++, o += u.os) {
                if (isnan(x[j])) continue;
                r->cnt[o]++;
                if (exact) ch_xsum_add(&r->xs[o], x[j]);
                else r->ds[o] += x[j];
            }
        } else if (exact) {
            if (u.os == 0 && len >= 4096) {
                /* one output: 4 accumulators so consecutive adds do not
                 * wait on each other's limbs, merged exactly at the end */
                ch_xsum_t part[4];
                for (int k = 0; k < 4; k++) ch_xsum_init(&part[k]);
                int64_t j = 0;
                for (; j + 4 <= len; j += 4)
                    for (int k = 0; k < 4; k++) ch_xsum_add(&part[k], x[j + k]);
                for (; j < len; j++) ch_xsum_add(&part[0], x[j]);
                for (int k = 0; k < 4; k++) {
                    ch_xsum_normalize(&part[k]);
                    for (int l = 0; l < CH_XSUM_WORDS; l++)
                        ((int64_t *)&r->xs[o])[l] += ((const int64_t *)&part[k])[l];
                }
            } else if (u.os == 0) {
                ch_xsum_t *a = &r->xs[o];
                for (int64_t j = 0; j < len; j++) ch_xsum_add(a, x[j]);
            } else {
                ch_xsum_t *a = r->xs + o;
                for (int64_t j = 0; j < len; j++, a += u.os) ch_xsum_add(a, x[j]);
            }
        } else if (u.os == 0) {
            r->ds[o] += fast_sum_run(x, len);
        } else if (u.os == 1) {
            fast_add_contig(r->ds + o, x, len);
        } else {
            for (int64_t j = 0; j < len; j++, o += u.os) r->ds[o] += x[j];
        }
        r->adds += len;
        break;
    case CH_ROP_MIN: case CH_ROP_MAX: case CH_ROP_ARGMIN: case CH_ROP_ARGMAX: {
        int is_min = (b == CH_ROP_MIN || b == CH_ROP_ARGMIN);
        for (int64_t j = 0; j < len; j++, o += u.os, q += u.qs) {
            double v = x[j];
            if (isnan(v)) {
                r->nan[o]++;
                if (r->nanidx && q < r->nanidx[o]) r->nanidx[o] = q;
                continue;
            }
            r->cnt[o]++;
            double cur = r->dval[o];
            if (r->idx) {
                if ((is_min ? v < cur : v > cur) || (v == cur && q < r->idx[o])) {
                    r->dval[o] = v;
                    r->idx[o] = q;
                }
            } else if (is_min ? v < cur : v > cur) {
                r->dval[o] = v;
            }
        }
        break;
    }
    case CH_ROP_COUNT_NONZERO:
        for (int64_t j = 0; j < len; j++, o += u.os) r->cnt[o] += (x[j] != 0);
        break;
    default: /* histogram */
        if (r->passes == 2 && r->pass == 0) {
            for (int64_t j = 0; j < len; j++) {
                double v = x[j];
                if (isnan(v)) { r->nan[0]++; continue; }
                if (v < r->hrange[0]) r->hrange[0] = v;
                if (v > r->hrange[1]) r->hrange[1] = v;
            }
        } else {
            double lo = r->hrange[0], hi = r->hrange[1];
            int64_t nb = r->spec.bins;
            double norm = (double)nb / (hi - lo);
            const double *e = r->edges;
            for (int64_t j = 0; j < len; j++) {
                double v = x[j];
                if (!(v >= lo && v <= hi)) continue;
                int64_t i = (int64_t)((v - lo) * norm);
                if (i >= nb) i = nb - 1;
                if (v < e[i]) i--;
                else if (i != nb - 1 && v >= e[i + 1]) i++;
                r->cnt[i]++;
            }
        }
        break;
    }
}

/* Exact sums of `rows` whole rows of `cols` values each, row i going to
 * outputs o + c*os, in blocks of TILE_COLS columns (a row of 20000 outputs
 * would touch 11 MB of accumulators per row) and TILE_ROWS rows.
 *
 * Pass 1 (sums) first tries a fixed-point window per column: with emax the
 * largest exponent field in the block's column, every value of exponent
 * emax or emax - 1 is an exact integer multiple of 2^(emax - 1076), and
 * TILE_ROWS = 128 of them (each < 2^54 units) sum without overflow in an
 * int64 (< 2^61), which is added to the superaccumulator once per block
 * (ch_xsum_add_scaled). Values outside the window (smaller exponents, zeros
 * are fine; inf/NaN) go through ch_xsum_add one by one. The result is the
 * same exact sum; the window only makes the common case (values of similar
 * magnitude in a column) cheap and vectorizable. */
#define TILE_COLS 256
#define TILE_ROWS 128

CH_SIMD_KERNEL
static void window_emax(const uint64_t *restrict row, int64_t n, int64_t *restrict emax)
{
    for (int64_t c = 0; c < n; c++) {
        int64_t e = (int64_t)((row[c] >> 52) & 0x7ff);
        emax[c] = e > emax[c] ? e : emax[c];
    }
}

/* The double with bits u on the window grid of bottom exponent field lo:
 * the signed integer v with x = v 2^(lo - 1075), and *ok = 1 when x is in
 * the window (exponent lo or lo + 1) or zero (v = 0), else 0 (v = 0). */
static inline int64_t window_value(uint64_t u, int64_t lo, int64_t *ok)
{
    int64_t e = (int64_t)((u >> 52) & 0x7ff);
    int64_t sh = e - lo; /* 0 or 1 inside the window */
    int64_t in = (sh >= 0) & (e != 0x7ff);
    uint64_t m = (u & ((1ULL << 52) - 1)) | (1ULL << 52);
    int64_t v = in ? (int64_t)(m << (sh & 1)) : 0;
    int64_t neg = (int64_t)u >> 63;
    *ok = in | ((u << 1) == 0);
    return (v ^ neg) - neg;
}

/* 1 when *x was taken by the window (in it or zero) of a column with
 * enabled != 0: the fallback loops add the others one by one. */
static int window_ok(const double *x, int64_t lo, int64_t enabled)
{
    uint64_t u;
    int64_t ok;
    memcpy(&u, x, 8);
    window_value(u, lo, &ok);
    return (int)(ok & enabled);
}

/* Adds the in-window values of row to acc; returns nonzero if some value
 * was outside (then the caller adds those one by one). */
CH_SIMD_KERNEL
static int64_t window_add(const uint64_t *restrict row, int64_t n, const int64_t *restrict lo,
                          int64_t *restrict acc)
{
    int64_t outside = 0;
    for (int64_t c = 0; c < n; c++) {
        int64_t ok;
        acc[c] += window_value(row[c], lo[c], &ok);
        outside |= !ok;
    }
    return outside;
}

/* var pass 2 in the window: x = vx 2^(lo-1075) and the column's mean
 * m = vm 2^(lo-1075) are integers on one grid, so (x - m)^2 = (vx - vm)^2
 * 2^(2 lo - 2150) exactly, summed in an unsigned 128-bit integer (< 2^117
 * for TILE_ROWS rows). Zeros are on the grid too; columns with en[c] == 0
 * and values outside the window are left to the caller. */
static int64_t window_sqdev(const uint64_t *restrict row, int64_t n, const int64_t *restrict lo,
                            const int64_t *restrict vm, const int64_t *restrict en,
                            unsigned __int128 *restrict acc)
{
    int64_t outside = 0;
    for (int64_t c = 0; c < n; c++) {
        int64_t ok;
        int64_t v = window_value(row[c], lo[c], &ok);
        int64_t use = ok & en[c];
        int64_t d = use ? v - vm[c] : 0;
        acc[c] += (unsigned __int128)((__int128)d * d);
        outside |= !use;
    }
    return outside;
}

/* One window setup for the var pass: per column lo (window bottom exponent
 * field), the mean on the window grid, and whether the column qualifies
 * (mean inside the window, the squares' grid inside the accumulator). */
static void sqdev_setup(const double *m, int64_t os, int64_t nc, const int64_t *emax, int64_t *lo,
                        int64_t *vm, int64_t *en)
{
    for (int64_t c = 0; c < nc; c++) {
        uint64_t u;
        memcpy(&u, m + c * os, 8);
        int64_t e = (int64_t)((u >> 52) & 0x7ff), l = emax[c] - 1;
        int64_t zero = (u << 1) == 0;
        en[c] = l >= 538 && l < 1578 && emax[c] != 0x7ff && (zero || (e >= l && e <= l + 1));
        lo[c] = l;
        int64_t v = zero ? 0 : (int64_t)(((u & ((1ULL << 52) - 1)) | (1ULL << 52)) << ((e - l) & 1));
        vm[c] = (u >> 63) ? -v : v;
    }
}

static void tile_f64(ch_reducer_t *r, const double *x, int64_t rows, int64_t cols, int64_t o,
                     int64_t os)
{
    int64_t vm[TILE_COLS], en[TILE_COLS];
    unsigned __int128 acc2[TILE_COLS];
    int64_t emax[TILE_COLS], lo[TILE_COLS], acc[TILE_COLS];
    for (int64_t c0 = 0; c0 < cols; c0 += TILE_COLS) {
        int64_t nc = c0 + TILE_COLS < cols ? TILE_COLS : cols - c0;
        for (int64_t r0 = 0; r0 < rows; r0 += TILE_ROWS) {
            int64_t nr = r0 + TILE_ROWS < rows ? TILE_ROWS : rows - r0;
            const double *blk = x + r0 * cols + c0;
            ch_xsum_t *a = r->xs + o + c0 * os;
            for (int64_t c = 0; c < nc; c++) emax[c] = 0;
            for (int64_t i = 0; i < nr; i++)
                window_emax((const uint64_t *)(blk + i * cols), nc, emax);
            if (r->pass == 1) {
                const double *m = r->mean + o + c0 * os;
                sqdev_setup(m, os, nc, emax, lo, vm, en);
                for (int64_t c = 0; c < nc; c++) acc2[c] = 0;
                int64_t out2 = 0;
                for (int64_t i = 0; i < nr; i++)
                    out2 |= window_sqdev((const uint64_t *)(blk + i * cols), nc, lo, vm, en, acc2);
                for (int64_t c = 0; c < nc; c++)
                    if (acc2[c]) ch_xsum_add_scaled_u128(a + c * os, acc2[c], 2 * (int)lo[c] - 1076);
                if (!out2) continue;
                for (int64_t i = 0; i < nr; i++)
                    for (int64_t c = 0; c < nc; c++)
                        if (!window_ok(blk + i * cols + c, lo[c], en[c]))
                            xsum_add_sqdev(a + c * os, blk[i * cols + c], m[c * os]);
                continue;
            }
            int64_t outside = 0;
            for (int64_t c = 0; c < nc; c++) {
                /* tiny columns (emax < 3) and zero columns: no window */
                lo[c] = emax[c] >= 3 ? emax[c] - 1 : 0x7ff;
                acc[c] = 0;
            }
            for (int64_t i = 0; i < nr; i++)
                outside |= window_add((const uint64_t *)(blk + i * cols), nc, lo, acc);
            for (int64_t c = 0; c < nc; c++)
                if (acc[c]) ch_xsum_add_scaled(a + c * os, acc[c], (int)lo[c] - 1);
            if (!outside) continue;
            for (int64_t i = 0; i < nr; i++)
                for (int64_t c = 0; c < nc; c++)
                    if (!window_ok(blk + i * cols + c, lo[c], 1))
                        ch_xsum_add(a + c * os, blk[i * cols + c]);
        }
    }
    r->adds += rows * cols * (r->pass == 1 ? 6 : 1);
}

#define RUN_INT(T, VALS)                                                                         \
    static void run_##T(ch_reducer_t *r, const T *x, int64_t len, run_t u)                       \
    {                                                                                            \
        ch_reduce_kind b = base_op(r->spec.op);                                                  \
        int64_t o = u.o, q = u.q;                                                                \
        T *val = (T *)VALS;                                                                      \
        if (b == CH_ROP_SUM) {                                                                   \
            for (int64_t j = 0; j < len; j++, o += u.os) r->us[o] += (uint64_t)x[j];             \
        } else if (r->spec.op == CH_ROP_COUNT_NONZERO) {                                         \
            for (int64_t j = 0; j < len; j++, o += u.os) r->cnt[o] += (x[j] != 0);               \
        } else {                                                                                 \
            int is_min = (b == CH_ROP_MIN || b == CH_ROP_ARGMIN);                                \
            for (int64_t j = 0; j < len; j++, o += u.os, q += u.qs) {                            \
                T v = x[j], cur = val[o];                                                        \
                if (r->idx) {                                                                    \
                    if ((is_min ? v < cur : v > cur) || (v == cur && q < r->idx[o])) {           \
                        val[o] = v;                                                              \
                        r->idx[o] = q;                                                           \
                    }                                                                            \
                } else if (is_min ? v < cur : v > cur) {                                         \
                    val[o] = v;                                                                  \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    }
RUN_INT(int64_t, r->ival)
RUN_INT(uint64_t, r->ival)

/* -------------------------------------------------------------------- feed */

typedef struct {
    int n;
    int64_t len[CH_REDUCE_MAX_DIMS], os[CH_REDUCE_MAX_DIMS], qs[CH_REDUCE_MAX_DIMS];
} dims_t;

/* Storage dims of a segment, slowest first, with length-1 dims dropped and
 * neighbours merged where one stride covers both. */
static void storage_dims(const ch_reducer_t *r, const ch_array_desc_t *seg, dims_t *dm)
{
    int d = seg->ndim;
    dm->n = 0;
    for (int k = 0; k < d; k++) {
        int a = seg->fortran ? d - 1 - k : k;
        int64_t len = seg->shape[a];
        if (len == 1) continue;
        int64_t os = r->reduced[a] ? 0 : r->ostride[a];
        int64_t qs = (r->reduced[a] && r->need_q) ? r->qstride[a] : 0;
        int i = dm->n;
        if (i > 0 && dm->os[i - 1] == os * len && dm->qs[i - 1] == qs * len) {
            dm->len[i - 1] *= len;
            dm->os[i - 1] = os;
            dm->qs[i - 1] = qs;
            continue;
        }
        dm->len[i] = len;
        dm->os[i] = os;
        dm->qs[i] = qs;
        dm->n++;
    }
    if (dm->n == 0) {
        dm->n = 1;
        dm->len[0] = 1;
        dm->os[0] = dm->qs[0] = 0;
    }
}

ch_status ch_reducer_feed(ch_reducer_t *r, const ch_array_desc_t *seg, int64_t row0, int64_t e0,
                          int64_t n, const void *raw)
{
    CH_REQUIRE(r && seg, "ch_reducer_feed: NULL argument");
    if (r->pass >= r->passes)
        return CH_ERROR(CH_ERR_INVALID, "ch_reducer_feed after the last pass");
    int ok = seg->dtype == r->in.dtype && seg->ndim == r->in.ndim && row0 >= 0;
    for (int i = 1; ok && i < seg->ndim; i++) ok = seg->shape[i] == r->in.shape[i];
    if (ok && seg->ndim > 0) ok = row0 + seg->shape[0] <= r->in.shape[0];
    if (!ok)
        return CH_ERROR(CH_ERR_INVALID, "segment (%s, %d dims, rows from %lld) does not fit the "
                        "reduced array (%s, %d dims)", ch_array_dtype_name(seg->dtype), seg->ndim,
                        (long long)row0, ch_array_dtype_name(r->in.dtype), r->in.ndim);
    int64_t count = ch_array_desc_count(seg);
    if (e0 < 0 || n < 0 || e0 + n > count)
        return CH_ERROR(CH_ERR_INVALID, "elements [%lld, %lld) outside the segment's %lld",
                        (long long)e0, (long long)(e0 + n), (long long)count);
    if (n == 0) return CH_OK;
    dims_t dm;
    storage_dims(r, seg, &dm);
    int64_t base_o = 0, base_q = 0;
    if (seg->ndim > 0) {
        if (r->reduced[0]) base_q = r->need_q ? row0 * r->qstride[0] : 0;
        else base_o = row0 * r->ostride[0];
    }
    int64_t idx[CH_REDUCE_MAX_DIMS];
    int64_t rem = e0;
    for (int k = dm.n - 1; k >= 0; k--) {
        idx[k] = rem % dm.len[k];
        rem /= dm.len[k];
    }
    int f = dm.n - 1;
    size_t sz = ch_array_dtype_size(r->in.dtype);
    int direct = (r->cls == VC_F64 && r->in.dtype == CH_DT_FLOAT64 && !seg->byteswap) ||
                 (r->cls == VC_I64 && r->in.dtype == CH_DT_INT64 && !seg->byteswap) ||
                 (r->cls == VC_U64 && r->in.dtype == CH_DT_UINT64 && !seg->byteswap);
    uint64_t *block = r->scratch;
    const unsigned char *src = raw;
    int tiles = r->xs && !r->is_nan_op && dm.n >= 2 && dm.os[f - 1] == 0 && dm.os[f] != 0;
    int64_t done = 0;
    while (done < n) {
        int64_t nb = n - done;
        const void *vals;
        if (direct) {
            if (nb > MAX_DIRECT) nb = MAX_DIRECT;
            vals = src + (size_t)done * sz; /* no copy: the data is already in value form */
        } else {
            if (nb > BLOCK) nb = BLOCK;
            convert(src + (size_t)done * sz, r->in.dtype, seg->byteswap, nb, r->cls, block);
            vals = block;
        }
        int64_t j = 0;
        while (j < nb) {
            int64_t rows = tiles && idx[f] == 0 ? (nb - j) / dm.len[f] : 0;
            if (rows > 0 && rows > dm.len[f - 1] - idx[f - 1]) rows = dm.len[f - 1] - idx[f - 1];
            if (rows >= 2) { /* whole rows over a reduced axis: column-blocked */
                int64_t o = base_o;
                for (int k = 0; k < dm.n; k++) o += idx[k] * dm.os[k];
                tile_f64(r, (const double *)vals + j, rows, dm.len[f], o, dm.os[f]);
                j += rows * dm.len[f];
                idx[f - 1] += rows;
                for (int k = f - 1; k > 0 && idx[k] == dm.len[k]; k--) {
                    idx[k] = 0;
                    idx[k - 1]++;
                }
                if (r->adds >= CH_XSUM_ADDS_BETWEEN_NORMALIZE - 6 * (int64_t)MAX_DIRECT) {
                    for (int64_t i = 0; i < r->nout; i++) ch_xsum_normalize(&r->xs[i]);
                    r->adds = 0;
                }
                continue;
            }
            int64_t len = dm.len[f] - idx[f];
            if (len > nb - j) len = nb - j;
            run_t u = {base_o, dm.os[f], base_q, dm.qs[f]};
            for (int k = 0; k < dm.n; k++) {
                u.o += idx[k] * dm.os[k];
                u.q += idx[k] * dm.qs[k];
            }
            if (r->cls == VC_F64) run_f64(r, (const double *)vals + j, len, u);
            else if (r->cls == VC_I64) run_int64_t(r, (const int64_t *)vals + j, len, u);
            else run_uint64_t(r, (const uint64_t *)vals + j, len, u);
            j += len;
            idx[f] += len;
            for (int k = f; k > 0 && idx[k] == dm.len[k]; k--) {
                idx[k] = 0;
                idx[k - 1]++;
            }
            /* keep superaccumulators far from overflow */
            if (r->xs && r->adds >= CH_XSUM_ADDS_BETWEEN_NORMALIZE - 6 * (int64_t)MAX_DIRECT) {
                for (int64_t i = 0; i < r->nout; i++) ch_xsum_normalize(&r->xs[i]);
                r->adds = 0;
            }
        }
        done += nb;
    }
    return CH_OK;
}

/* ------------------------------------------------------------------ merge */

static ch_status allreduce_i64(ch_pg_t *pg, void *p, int64_t n, ch_reduce_op op)
{
    if (!pg || ch_pg_size(pg) == 1) return CH_OK;
    return ch_pg_allreduce(pg, p, p, n, CH_DIST_INT64, op);
}

static ch_status allreduce_f64(ch_pg_t *pg, void *p, int64_t n, ch_reduce_op op)
{
    if (!pg || ch_pg_size(pg) == 1) return CH_OK;
    return ch_pg_allreduce(pg, p, p, n, CH_DIST_FLOAT64, op);
}

/* uint64 order as int64 order: flip the sign bit. */
static void flip_sign_bits(int64_t *p, int64_t n)
{
    for (int64_t i = 0; i < n; i++) p[i] = (int64_t)((uint64_t)p[i] ^ (1ULL << 63));
}

static ch_status merge_fields(ch_reducer_t *r, ch_pg_t *pg)
{
    if (!pg || ch_pg_size(pg) == 1) return CH_OK;
    int64_t *local = NULL; /* argmin/argmax: this rank's values before the merge */
    const void *vals = r->dval ? (const void *)r->dval : (const void *)r->ival;
    if (r->idx && r->pass == 0) {
        local = malloc((size_t)(r->nout ? r->nout : 1) * 8);
        if (!local) return CH_ERROR(CH_ERR_NOMEM, "argmin/argmax merge buffer");
        memcpy(local, vals, (size_t)r->nout * 8);
    }
    ch_status s = CH_OK;
    for (int i = 0; i < r->nf && s == CH_OK; i++) {
        field_t *f = &r->f[i];
        if (!(f->pass_mask & (1 << r->pass))) continue;
        switch (f->merge) {
        case M_XSUM:
            for (int64_t j = 0; j < f->n; j++) ch_xsum_normalize(&((ch_xsum_t *)f->p)[j]);
            s = allreduce_i64(pg, f->p, f->n * CH_XSUM_WORDS, CH_REDUCE_SUM);
            r->adds = 0;
            break;
        case M_F64SUM: s = allreduce_f64(pg, f->p, f->n, CH_REDUCE_SUM); break;
        case M_U64SUM: s = allreduce_i64(pg, f->p, f->n, CH_REDUCE_SUM); break;
        case M_F64MIN: s = allreduce_f64(pg, f->p, f->n, CH_REDUCE_MIN); break;
        case M_F64MAX: s = allreduce_f64(pg, f->p, f->n, CH_REDUCE_MAX); break;
        case M_I64MIN: case M_I64MINIDX: s = allreduce_i64(pg, f->p, f->n, CH_REDUCE_MIN); break;
        case M_I64MAX: s = allreduce_i64(pg, f->p, f->n, CH_REDUCE_MAX); break;
        case M_U64MIN: case M_U64MAX:
            flip_sign_bits(f->p, f->n);
            if (local) flip_sign_bits(local, f->n);
            s = allreduce_i64(pg, f->p, f->n, f->merge == M_U64MIN ? CH_REDUCE_MIN : CH_REDUCE_MAX);
            flip_sign_bits(f->p, f->n);
            if (local) flip_sign_bits(local, f->n);
            break;
        case M_ARGIDX: {
            /* keep the index only where this rank holds the winning value;
             * the smallest such index over ranks is the first occurrence */
            int64_t *idx = f->p;
            for (int64_t j = 0; j < f->n; j++) {
                int same = r->dval ? ((const double *)vals)[j] == ((const double *)local)[j]
                                   : ((const int64_t *)vals)[j] == local[j];
                if (!same) idx[j] = INT64_MAX;
            }
            s = allreduce_i64(pg, f->p, f->n, CH_REDUCE_MIN);
            break;
        }
        default: break;
        }
    }
    free(local);
    return s;
}

static int64_t count_of(const ch_reducer_t *r, int64_t o)
{
    return r->is_nan_op ? r->cnt[o] : r->nred;
}

static ch_xsum_format format_for(ch_array_dtype dt)
{
    return dt == CH_DT_FLOAT16 ? CH_XSUM_F16 : dt == CH_DT_FLOAT32 ? CH_XSUM_F32 : CH_XSUM_F64;
}

static void warn(ch_reducer_t *r, const char *text)
{
    if (strstr(r->warnings, text)) return;
    size_t len = strlen(r->warnings);
    snprintf(r->warnings + len, sizeof r->warnings - len, "%s%s", len ? "; " : "", text);
}

static void store_f(ch_reducer_t *r, int64_t i, double v)
{
    switch (r->rtype) {
    case CH_DT_FLOAT16: ((uint16_t *)r->result)[i] = ch_double_to_half(v); break;
    case CH_DT_FLOAT32: ((float *)r->result)[i] = (float)v; break;
    default: ((double *)r->result)[i] = v; break;
    }
}

static void store_int(ch_reducer_t *r, int64_t i, uint64_t v)
{
    unsigned char *p = (unsigned char *)r->result + (size_t)i * ch_array_dtype_size(r->rtype);
    switch (ch_array_dtype_size(r->rtype)) {
    case 1: *p = (unsigned char)v; break;
    case 2: { uint16_t w = (uint16_t)v; memcpy(p, &w, 2); break; }
    case 4: { uint32_t w = (uint32_t)v; memcpy(p, &w, 4); break; }
    default: memcpy(p, &v, 8); break;
    }
}

/* Round a float64 to the result dtype's precision (fast mode, std). */
static double to_rtype(const ch_reducer_t *r, double v)
{
    return r->rtype == CH_DT_FLOAT32 ? (double)(float)v
           : r->rtype == CH_DT_FLOAT16 ? ch_half_to_double(ch_double_to_half(v)) : v;
}

static ch_status make_result(ch_reducer_t *r)
{
    ch_reduce_kind op = r->spec.op, b = base_op(op);
    int64_t n = op == CH_ROP_HISTOGRAM ? r->spec.bins : r->nout;
    r->result = calloc((size_t)(n ? n : 1), ch_array_dtype_size(r->rtype));
    if (!r->result) return CH_ERROR(CH_ERR_NOMEM, "reduce result of %lld elements", (long long)n);
    ch_array_desc_t *d = &r->rdesc;
    memset(d, 0, sizeof *d);
    d->dtype = r->rtype;
    if (op == CH_ROP_HISTOGRAM) {
        d->ndim = 1;
        d->shape[0] = n;
    } else {
        for (int i = 0; i < r->in.ndim; i++) {
            if (!r->reduced[i]) d->shape[d->ndim++] = r->in.shape[i];
            else if (r->spec.keepdims) d->shape[d->ndim++] = 1;
        }
    }
    int exact = r->spec.mode == CH_REDUCE_EXACT;
    ch_xsum_format fmt = format_for(r->rtype);
    for (int64_t o = 0; o < n; o++) {
        switch (op == CH_ROP_HISTOGRAM || op == CH_ROP_COUNT_NONZERO ? op : b) {
        case CH_ROP_SUM:
            if (r->us) store_int(r, o, r->us[o]);
            else store_f(r, o, exact ? ch_xsum_round(&r->xs[o], fmt) : to_rtype(r, r->ds[o]));
            break;
        case CH_ROP_MEAN: {
            int64_t c = count_of(r, o);
            if (c == 0) warn(r, "Mean of empty slice");
            store_f(r, o, exact ? ch_xsum_div_round(&r->xs[o], (uint64_t)c, fmt)
                                : to_rtype(r, c ? r->ds[o] / (double)c : NAN));
            break;
        }
        case CH_ROP_VAR: case CH_ROP_STD: {
            int64_t c = count_of(r, o) - r->spec.ddof;
            double v;
            if (c <= 0) {
                warn(r, "Degrees of freedom <= 0 for slice");
                /* numpy divides by max(count - ddof, 0): x / 0 */
                double sum = exact ? ch_xsum_round(&r->xs[o], CH_XSUM_F64) : r->ds[o];
                v = sum / 0.0;
            } else {
                v = exact ? ch_xsum_div_round(&r->xs[o], (uint64_t)c, fmt)
                          : to_rtype(r, r->ds[o] / (double)c);
            }
            store_f(r, o, b == CH_ROP_STD ? to_rtype(r, sqrt(v)) : v);
            break;
        }
        case CH_ROP_MIN: case CH_ROP_MAX:
            if (r->cls != VC_F64) {
                store_int(r, o, (uint64_t)r->ival[o]);
            } else if (r->is_nan_op ? r->cnt[o] == 0 : r->nan[o] > 0) {
                if (r->is_nan_op) warn(r, "All-NaN slice encountered");
                store_f(r, o, NAN);
            } else {
                store_f(r, o, r->dval[o]);
            }
            break;
        case CH_ROP_ARGMIN: case CH_ROP_ARGMAX:
            store_int(r, o, (uint64_t)(r->nanidx && r->nanidx[o] != INT64_MAX ? r->nanidx[o]
                                                                               : r->idx[o]));
            break;
        default: /* count_nonzero, histogram */
            store_int(r, o, (uint64_t)r->cnt[o]);
            break;
        }
    }
    return CH_OK;
}

ch_status ch_reducer_end_pass(ch_reducer_t *r, ch_pg_t *pg)
{
    CH_REQUIRE(r, "ch_reducer_end_pass: NULL reducer");
    if (r->pass >= r->passes) return CH_ERROR(CH_ERR_INVALID, "ch_reducer_end_pass after the last pass");
    if (r->spec.op == CH_ROP_HISTOGRAM && r->passes == 2 && r->pass == 0) {
        /* the range: min and max over ranks, any NaN anywhere */
        double mn = r->hrange[0], mx = -r->hrange[1];
        CH_TRY(allreduce_f64(pg, &mn, 1, CH_REDUCE_MIN));
        CH_TRY(allreduce_f64(pg, &mx, 1, CH_REDUCE_MIN));
        CH_TRY(merge_fields(r, pg));
        mx = -mx;
        if (r->nan[0] > 0 || (mn <= mx && !(isfinite(mn) && isfinite(mx))))
            return CH_ERROR(CH_ERR_INVALID, "histogram: autodetected range of [%s, %s] is not "
                            "finite (give reduce.range)", r->nan[0] ? "nan" : "", r->nan[0] ? "nan" : "");
        if (mn > mx) { mn = 0; mx = 1; } /* empty array: numpy's default range */
        r->hrange[0] = mn;
        r->hrange[1] = mx;
        set_edges(r);
        r->pass = 1;
        return CH_OK;
    }
    CH_TRY(merge_fields(r, pg));
    if (r->passes == 2 && r->pass == 0) { /* var: the means, then sums restart */
        for (int64_t o = 0; o < r->nout; o++) {
            int64_t c = count_of(r, o);
            if (r->xs) {
                r->mean[o] = ch_xsum_div_round(&r->xs[o], (uint64_t)c, CH_XSUM_F64);
                ch_xsum_init(&r->xs[o]);
            } else {
                r->mean[o] = c ? r->ds[o] / (double)c : NAN;
                r->ds[o] = 0;
            }
        }
        r->adds = 0;
    }
    r->pass++;
    if (r->pass == r->passes) CH_TRY(make_result(r));
    return CH_OK;
}

ch_status ch_reducer_result(ch_reducer_t *r, ch_array_desc_t *desc, const void **data,
                            const double **edges, const char **warnings)
{
    CH_REQUIRE(r, "ch_reducer_result: NULL reducer");
    if (r->pass < r->passes || !r->result)
        return CH_ERROR(CH_ERR_INVALID, "reduce result asked after pass %d of %d", r->pass, r->passes);
    if (desc) *desc = r->rdesc;
    if (data) *data = r->result;
    if (edges) *edges = r->spec.op == CH_ROP_HISTOGRAM ? r->edges : NULL;
    if (warnings) *warnings = r->warnings;
    return CH_OK;
}

/* ------------------------------------------------------------ checkpoints */

typedef struct {
    char magic[8];
    int32_t op, mode, dtype, ndim, passes, pass, nf, keepdims;
    int64_t shape[CH_REDUCE_MAX_DIMS];
    int32_t reduced[CH_REDUCE_MAX_DIMS];
    int64_t nout, ddof, bins, adds;
    double hrange[2];
} state_header_t;

static const char state_magic[8] = {'C', 'H', 'R', 'E', 'D', 'S', 'T', '1'};

static void fill_header(const ch_reducer_t *r, state_header_t *h)
{
    memset(h, 0, sizeof *h);
    memcpy(h->magic, state_magic, 8);
    h->op = r->spec.op;
    h->mode = r->spec.mode;
    h->dtype = r->in.dtype;
    h->ndim = r->in.ndim;
    h->passes = r->passes;
    h->pass = r->pass;
    h->nf = r->nf;
    h->keepdims = r->spec.keepdims;
    for (int i = 0; i < r->in.ndim; i++) {
        h->shape[i] = r->in.shape[i];
        h->reduced[i] = r->reduced[i];
    }
    h->nout = r->nout;
    h->ddof = r->spec.ddof;
    h->bins = r->spec.bins;
    h->adds = r->adds;
    h->hrange[0] = r->hrange[0];
    h->hrange[1] = r->hrange[1];
}

size_t ch_reducer_state_size(const ch_reducer_t *r)
{
    size_t n = sizeof(state_header_t);
    for (int i = 0; i < r->nf; i++) n += r->f[i].elem * (size_t)r->f[i].n;
    return n;
}

void ch_reducer_state_save(const ch_reducer_t *r, void *buf)
{
    state_header_t h;
    fill_header(r, &h);
    unsigned char *p = buf;
    memcpy(p, &h, sizeof h);
    p += sizeof h;
    for (int i = 0; i < r->nf; i++) {
        size_t len = r->f[i].elem * (size_t)r->f[i].n;
        memcpy(p, r->f[i].p, len);
        p += len;
    }
}

ch_status ch_reducer_state_load(ch_reducer_t *r, const void *buf, size_t size)
{
    if (size != ch_reducer_state_size(r) || size < sizeof(state_header_t))
        return CH_ERROR(CH_ERR_FORMAT, "reduce state of %zu bytes, this reduction's is %zu "
                        "(another operation, shape or dtype)", size, ch_reducer_state_size(r));
    state_header_t h, mine;
    memcpy(&h, buf, sizeof h);
    fill_header(r, &mine);
    if (memcmp(h.magic, state_magic, 8))
        return CH_ERROR(CH_ERR_FORMAT, "not a cohort-reduce state (bad magic)");
    mine.pass = h.pass;
    mine.adds = h.adds;
    mine.hrange[0] = h.hrange[0];
    mine.hrange[1] = h.hrange[1];
    if (memcmp(&h, &mine, sizeof h))
        return CH_ERROR(CH_ERR_FORMAT, "reduce state was saved by another reduction (operation %s, "
                        "%d dims, dtype %s): it does not match this one's", ch_reduce_kind_name(h.op),
                        h.ndim, ch_array_dtype_name(h.dtype));
    if (h.pass < 0 || h.pass >= r->passes)
        return CH_ERROR(CH_ERR_FORMAT, "reduce state at pass %d of %d", h.pass, r->passes);
    const unsigned char *p = (const unsigned char *)buf + sizeof h;
    for (int i = 0; i < r->nf; i++) {
        size_t len = r->f[i].elem * (size_t)r->f[i].n;
        memcpy(r->f[i].p, p, len);
        p += len;
    }
    r->pass = h.pass;
    r->adds = h.adds;
    r->hrange[0] = h.hrange[0];
    r->hrange[1] = h.hrange[1];
    return CH_OK;
}
