/* Tests for framework/tensor, framework/arena and framework/ops (CPU backend).
 *
 * Golden tests compare every op, forward and backward, against PyTorch:
 * tests/golden/ops_golden.py writes reference tensors into the build tree
 * (tests/ops_golden.bin) when this program starts; without python3-torch
 * (HAVE_TORCH != yes) those tests SKIP. Each activation op is run in every
 * layout the shape allows (plain NCHW, NHWC, nChw8c, nChw16c): inputs are
 * reordered from PyTorch's NCHW into the layout, outputs back to NCHW.
 *
 * Error measure: rel = max_i |got_i - ref_i| / max(max_i |ref_i|, 1e-6)
 * (the largest absolute error relative to the tensor's largest magnitude,
 * robust to elements near zero). Limits: 1e-4 forward, 1e-3 gradients.
 */
#include "config.h"

#include "tests/harness.h"

#include "framework/tensor/arena.h"
#include "framework/ops/ops.h"
#include "framework/tensor/tensor.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TOL_FWD 1e-4
#define TOL_BWD 1e-3

/* ------------------------------------------------------------ golden file */

typedef struct {
    char name[96];
    int dtype;
    int ndim;
    int64_t shape[4];
    const void *data;
    size_t bytes;
} grec;

static unsigned char *g_buf;
static grec *g_recs;
static size_t g_nrec;
static int g_state; /* 0 not tried, 1 loaded, -1 unavailable */
static char g_why[4096];

static void golden_free(void)
{
    free(g_buf);
    free(g_recs);
    g_buf = NULL;
    g_recs = NULL;
}

static int golden_parse(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(g_why, sizeof g_why, "cannot open %s", path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    g_buf = malloc((size_t)sz);
    if (!g_buf || fread(g_buf, 1, (size_t)sz, f) != (size_t)sz) {
        fclose(f);
        snprintf(g_why, sizeof g_why, "cannot read %s", path);
        return -1;
    }
    fclose(f);
    if (sz < 4 || memcmp(g_buf, "CHG1", 4) != 0) {
        snprintf(g_why, sizeof g_why, "%s: bad magic", path);
        return -1;
    }
    size_t cap = 256, o = 4;
    g_recs = calloc(cap, sizeof *g_recs);
    while (o < (size_t)sz) {
        uint32_t nl, dt, nd;
        if (o + 4 > (size_t)sz) break;
        memcpy(&nl, g_buf + o, 4);
        o += 4;
        if (nl >= sizeof g_recs[0].name || o + nl + 8 > (size_t)sz) goto bad;
        if (g_nrec == cap) {
            cap *= 2;
            g_recs = realloc(g_recs, cap * sizeof *g_recs);
        }
        grec *r = &g_recs[g_nrec];
        memset(r, 0, sizeof *r);
        memcpy(r->name, g_buf + o, nl);
        o += nl;
        memcpy(&dt, g_buf + o, 4);
        memcpy(&nd, g_buf + o + 4, 4);
        o += 8;
        if (nd < 1 || nd > 4 || dt > 1 || o + 8 * nd > (size_t)sz) goto bad;
        r->dtype = (int)dt;
        r->ndim = (int)nd;
        size_t n = 1;
        for (uint32_t i = 0; i < nd; i++) {
            memcpy(&r->shape[i], g_buf + o, 8);
            o += 8;
            n *= (size_t)r->shape[i];
        }
        r->bytes = n * (dt == 0 ? 4 : 8);
        if (o + r->bytes > (size_t)sz) goto bad;
        r->data = g_buf + o;
        o += r->bytes;
        g_nrec++;
    }
    return 1;
bad:
    snprintf(g_why, sizeof g_why, "%s: truncated or malformed record %zu", path, g_nrec);
    return -1;
}

/* Generate (once per process) and load the reference file, or skip. */
static void need_golden(void)
{
    if (g_state == 0) {
        const char *ht = getenv("HAVE_TORCH");
        if (!ht || strcmp(ht, "yes") != 0) {
            g_state = -1;
            snprintf(g_why, sizeof g_why, "python3-torch not available (HAVE_TORCH=%s)",
                     ht ? ht : "unset");
        } else {
            const char *py = getenv("PYTHON3");
            char path[1024], cmd[3072];
            snprintf(path, sizeof path, "%s/tests/ops_golden.bin", ch_test_builddir());
            snprintf(cmd, sizeof cmd, "'%s' '%s/tests/golden/ops_golden.py' '%s' >&2",
                     py && *py ? py : "python3", ch_test_srcdir(), path);
            int rc = system(cmd);
            if (rc != 0) {
                g_state = -2; /* a failure, not a skip */
                snprintf(g_why, sizeof g_why, "%s failed with status %d", cmd, rc);
            } else {
                g_state = golden_parse(path);
                if (g_state < 0) g_state = -2;
            }
        }
    }
    if (g_state == -1) ch_test_skip("%s", g_why);
    if (g_state == -2) fail_msg("golden reference: %s", g_why);
}

static const grec *find(const char *name)
{
    for (size_t i = 0; i < g_nrec; i++)
        if (strcmp(g_recs[i].name, name) == 0) return &g_recs[i];
    return NULL;
}

static int has(const char *pre, const char *what)
{
    char n[128];
    snprintf(n, sizeof n, "%s%s", pre, what);
    return find(n) != NULL;
}

/* Owned plain host copy of a golden tensor. */
static void load(ch_tensor_t *t, const char *pre, const char *what)
{
    char n[128];
    snprintf(n, sizeof n, "%s%s", pre, what);
    const grec *r = find(n);
    if (!r) fail_msg("golden tensor %s missing", n);
    assert_ch_ok(ch_tensor_alloc(t, r->dtype ? CH_I64 : CH_F32, r->ndim, r->shape,
                                 CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    memcpy(t->data, r->data, r->bytes);
}

static ch_compute_t *new_cx(void)
{
    ch_compute_t *cx = NULL;
    ch_compute_options_t o;
    ch_compute_options_default(&o);
    o.num_threads = 1;
    assert_ch_ok(ch_compute_create(&o, &cx));
    return cx;
}

/* t (plain) converted into a new tensor of layout l. */
static void to_layout(ch_compute_t *cx, const ch_tensor_t *t, ch_layout_t l, ch_tensor_t *out)
{
    assert_ch_ok(ch_tensor_alloc(out, CH_F32, t->ndim, t->shape, l, CH_DEV_CPU, 0));
    assert_ch_ok(ch_op_reorder(cx, t, out));
}

/* An uninitialised-looking (NaN-filled) tensor like ref's shape in layout l. */
static void like(const ch_tensor_t *ref, ch_layout_t l, ch_tensor_t *out)
{
    assert_ch_ok(ch_tensor_alloc(out, CH_F32, ref->ndim, ref->shape, l, CH_DEV_CPU, 0));
    float *p = out->data;
    for (int64_t i = 0; i < ch_tensor_numel(out); i++) p[i] = NAN;
}

static double rel_err(const float *a, const float *b, int64_t n)
{
    double mx = 0.0, mref = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= mx)) mx = d; /* NaN propagates */
        if (fabs((double)b[i]) > mref) mref = fabs((double)b[i]);
    }
    return mx / (mref > 1e-6 ? mref : 1e-6);
}

/* Compare got (any layout) against golden pre+what. */
static void check(ch_compute_t *cx, const ch_tensor_t *got, const char *pre, const char *what,
                  double tol, const char *ctx)
{
    ch_tensor_t ref, plain;
    load(&ref, pre, what);
    if (!ch_tensor_same_shape(&ref, got)) {
        char a[128], b[128];
        fail_msg("%s%s (%s): shape %s, reference %s", pre, what, ctx,
                 ch_tensor_describe(got, a, sizeof a), ch_tensor_describe(&ref, b, sizeof b));
    }
    assert_ch_ok(ch_tensor_alloc(&plain, CH_F32, got->ndim, got->shape, CH_LAYOUT_PLAIN,
                                 CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_to_plain(cx, got, &plain));
    double e = rel_err(plain.data, ref.data, ch_tensor_numel(&ref));
    if (!(e <= tol))
        fail_msg("%s%s (%s): relative error %.3g > %.1g", pre, what, ctx, e, tol);
    ch_tensor_free(&plain);
    ch_tensor_free(&ref);
}

/* Layouts a 4-D activation with C channels can take. */
static int layouts_for(int64_t C, ch_layout_t *out)
{
    int n = 0;
    out[n++] = CH_LAYOUT_PLAIN;
    out[n++] = CH_LAYOUT_NHWC;
    if (C % 8 == 0) out[n++] = CH_LAYOUT_NCHW8C;
    if (C % 16 == 0) out[n++] = CH_LAYOUT_NCHW16C;
    return n;
}

/* ----------------------------------------------------------- non-golden */

static void test_tensor_basics(void **state)
{
    (void)state;
    ch_tensor_t t;
    int64_t s4[4] = {2, 16, 3, 5};
    assert_ch_ok(ch_tensor_alloc(&t, CH_F32, 4, s4, CH_LAYOUT_NCHW16C, CH_DEV_CPU, 0));
    assert_int_equal(ch_tensor_numel(&t), 2 * 16 * 3 * 5);
    assert_int_equal(t.nbytes, 2 * 16 * 3 * 5 * 4);
    assert_int_equal((uintptr_t)t.data % 64, 0);
    assert_int_equal(t.owns, 1);
    char d[128];
    assert_string_equal(ch_tensor_describe(&t, d, sizeof d), "float32[2,16,3,5] nChw16c cpu");
    ch_tensor_free(&t);
    assert_null(t.data);

    int64_t bad[4] = {2, 3, 4, 4};
    assert_ch_error(ch_tensor_init(&t, CH_F32, 4, bad, CH_LAYOUT_NCHW16C, CH_DEV_CPU, 0),
                    CH_ERR_INVALID, "divisible by 16");
    int64_t neg[2] = {2, -1};
    assert_ch_error(ch_tensor_init(&t, CH_F32, 2, neg, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0),
                    CH_ERR_INVALID, "shape[1] = -1");
    assert_ch_error(ch_tensor_init(&t, CH_F32, 5, s4, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0),
                    CH_ERR_INVALID, "ndim 5");
    assert_ch_error(ch_tensor_init(&t, CH_F32, 2, s4, CH_LAYOUT_NHWC, CH_DEV_CPU, 0),
                    CH_ERR_INVALID, "needs 4 dimensions");
    assert_ch_error(ch_tensor_init(&t, CH_I64, 4, s4, CH_LAYOUT_NHWC, CH_DEV_CPU, 0),
                    CH_ERR_INVALID, "needs float32");

    /* plain strides and NHWC strides */
    assert_ch_ok(ch_tensor_init(&t, CH_F32, 4, s4, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_int_equal(t.strides[0], 16 * 15);
    assert_int_equal(t.strides[1], 15);
    assert_int_equal(t.strides[3], 1);
    assert_ch_ok(ch_tensor_init(&t, CH_F32, 4, s4, CH_LAYOUT_NHWC, CH_DEV_CPU, 0));
    assert_int_equal(t.strides[1], 1);
    assert_int_equal(t.strides[3], 16);

    /* views: any reshape of plain; (N,C,1,1) of any layout to (N,C) */
    ch_tensor_t a, v;
    int64_t p4[4] = {4, 32, 1, 1}, p2[2] = {4, 32}, p3[2] = {4, 31};
    assert_ch_ok(ch_tensor_alloc(&a, CH_F32, 4, p4, CH_LAYOUT_NCHW16C, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_view(&v, &a, 2, p2));
    assert_ptr_equal(v.data, a.data);
    assert_int_equal(v.owns, 0);
    assert_ch_error(ch_tensor_view(&v, &a, 2, p3), CH_ERR_INVALID, "elements");
    ch_tensor_free(&a);
    assert_ch_ok(ch_tensor_alloc(&a, CH_F32, 4, s4, CH_LAYOUT_NCHW16C, CH_DEV_CPU, 0));
    int64_t f2[2] = {2, 240};
    assert_ch_error(ch_tensor_view(&v, &a, 2, f2), CH_ERR_INVALID, "cannot view");
    ch_tensor_free(&a);

    /* device storage without a GPU backend */
    assert_ch_error(ch_tensor_alloc(&t, CH_F32, 4, s4, CH_LAYOUT_PLAIN, CH_DEV_CUDA, 0),
                    CH_ERR_UNSUPPORTED, "no allocator");
    size_t bytes = 0;
    assert_ch_ok(ch_tensor_bytes_for(CH_I64, 1, s4, CH_LAYOUT_PLAIN, &bytes));
    assert_int_equal(bytes, 16);
}

static void test_arena(void **state)
{
    (void)state;
    ch_arena_t *a = NULL;
    assert_ch_ok(ch_arena_create(CH_DEV_CPU, 0, &a));
    ch_tensor_t t1, t2;
    int64_t s1[4] = {2, 16, 3, 3}, s2[1] = {5};
    assert_ch_ok(ch_tensor_init(&t1, CH_F32, 4, s1, CH_LAYOUT_NCHW16C, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_init(&t2, CH_F32, 1, s2, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    void *ws = (void *)1;
    assert_ch_ok(ch_arena_reserve_tensor(a, &t1));
    assert_ch_ok(ch_arena_reserve(a, 100, &ws));
    assert_null(ws);
    assert_ch_ok(ch_arena_reserve_tensor(a, &t2));
    /* 1152 bytes, then 100 -> 128, then 20 -> 64 */
    assert_int_equal(ch_arena_planned_bytes(a), 1152 + 128 + 64);
    assert_null(t1.data);
    assert_ch_error(ch_arena_reserve_tensor(a, &t1), CH_ERR_INVALID, "already reserved");
    assert_ch_ok(ch_arena_commit(a));
    assert_true(ch_arena_committed(a));
    assert_int_equal(ch_arena_bytes(a), 1152 + 128 + 64);
    assert_non_null(t1.data);
    assert_ptr_equal((char *)ws, (char *)t1.data + 1152);
    assert_ptr_equal((char *)t2.data, (char *)t1.data + 1152 + 128);
    assert_int_equal((uintptr_t)ws % CH_ARENA_ALIGN, 0);
    /* storage is usable and zeroed */
    assert_true(((float *)t2.data)[4] == 0.0f);
    ((float *)t2.data)[4] = 1.0f;
    ch_tensor_t t3;
    assert_ch_ok(ch_tensor_init(&t3, CH_F32, 1, s2, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_error(ch_arena_reserve_tensor(a, &t3), CH_ERR_INVALID, "after commit");
    assert_ch_error(ch_arena_commit(a), CH_ERR_INVALID, "already committed");
    ch_tensor_t gpu;
    ch_arena_reset(a);
    assert_null(t1.data);
    assert_null(ws);
    assert_int_equal(ch_arena_planned_bytes(a), 0);
    assert_ch_ok(ch_tensor_init(&gpu, CH_F32, 1, s2, CH_LAYOUT_PLAIN, CH_DEV_CUDA, 0));
    assert_ch_error(ch_arena_reserve_tensor(a, &gpu), CH_ERR_INVALID, "device");
    /* plan again with a different size */
    assert_ch_ok(ch_arena_reserve_tensor(a, &t3));
    assert_ch_ok(ch_arena_commit(a));
    assert_non_null(t3.data);
    ch_arena_destroy(a);
    assert_null(t3.data);
}

static void fill_seq(ch_tensor_t *t, float scale)
{
    float *p = t->data;
    for (int64_t i = 0; i < ch_tensor_numel(t); i++)
        p[i] = scale * (float)((i * 7919) % 101 - 50);
}

static void test_reorder_roundtrip(void **state)
{
    (void)state;
    ch_compute_t *cx = new_cx();
    ch_tensor_t p, a, b, c, back;
    int64_t s[4] = {3, 32, 5, 7};
    assert_ch_ok(ch_tensor_alloc_f32(&p, 4, s));
    fill_seq(&p, 0.25f);
    to_layout(cx, &p, CH_LAYOUT_NCHW16C, &a);
    /* nChw16c offset formula from tensor.h */
    float *A = a.data, *P = p.data;
    int64_t n = 2, ch = 21, h = 3, w = 6, C = 32, H = 5, W = 7;
    assert_true(A[((n * C / 16 + ch / 16) * H * W + h * W + w) * 16 + ch % 16] ==
                P[((n * C + ch) * H + h) * W + w]);
    to_layout(cx, &a, CH_LAYOUT_NHWC, &b);
    assert_true(((float *)b.data)[((n * H + h) * W + w) * C + ch] ==
                P[((n * C + ch) * H + h) * W + w]);
    to_layout(cx, &b, CH_LAYOUT_NCHW8C, &c);
    assert_ch_ok(ch_tensor_alloc_f32(&back, 4, s));
    assert_ch_ok(ch_tensor_to_plain(cx, &c, &back));
    assert_memory_equal(back.data, p.data, p.nbytes);
    /* copy needs equal layouts; to_plain needs a plain destination */
    assert_ch_error(ch_op_copy(cx, &a, &b), CH_ERR_INVALID, "one layout");
    assert_ch_error(ch_tensor_to_plain(cx, &a, &b), CH_ERR_INVALID, "must be plain");
    ch_tensor_free(&p);
    ch_tensor_free(&a);
    ch_tensor_free(&b);
    ch_tensor_free(&c);
    ch_tensor_free(&back);
    ch_compute_destroy(cx);
}

static void test_shape_errors(void **state)
{
    (void)state;
    ch_compute_t *cx = new_cx();
    ch_tensor_t x, w, y, yb, lg, lab, loss, v;
    int64_t sx[4] = {2, 3, 8, 8}, sw[4] = {4, 3, 3, 3}, sy[4] = {2, 4, 8, 8},
            sbad[4] = {2, 4, 7, 8};
    assert_ch_ok(ch_tensor_alloc_f32(&x, 4, sx));
    assert_ch_ok(ch_tensor_alloc_f32(&w, 4, sw));
    assert_ch_ok(ch_tensor_alloc_f32(&y, 4, sy));
    assert_ch_ok(ch_tensor_alloc_f32(&yb, 4, sbad));
    ch_conv2d_params_t p = {1, 1, 1, 1};
    assert_ch_ok(ch_op_conv2d_forward(cx, &x, &w, NULL, &p, &y));
    assert_ch_error(ch_op_conv2d_forward(cx, &x, &w, NULL, &p, &yb), CH_ERR_INVALID,
                    "output: expected shape [2,4,8,8], got float32[2,4,7,8]");
    assert_ch_error(ch_op_conv2d_forward(cx, &x, &y, NULL, &p, &y), CH_ERR_INVALID,
                    "input channels");
    ch_conv2d_params_t bad = {0, 1, 1, 1};
    assert_ch_error(ch_op_conv2d_forward(cx, &x, &w, NULL, &bad, &y), CH_ERR_INVALID, "stride");
    assert_ch_error(ch_op_conv2d_forward(NULL, &x, &w, NULL, &p, &y), CH_ERR_INVALID,
                    "context is NULL");
    assert_ch_error(ch_op_relu_forward(cx, &x, &y), CH_ERR_INVALID, "same shape");
    int64_t s1[1] = {4};
    assert_ch_ok(ch_tensor_alloc_f32(&v, 1, s1));
    assert_ch_error(ch_op_batchnorm_stats(cx, &x, &v, &v), CH_ERR_INVALID,
                    "one per channel");
    /* a weight in a blocked layout is refused */
    ch_tensor_t wb;
    int64_t sw16[4] = {16, 3, 3, 3};
    assert_ch_ok(ch_tensor_alloc(&wb, CH_F32, 4, sw16, CH_LAYOUT_NHWC, CH_DEV_CPU, 0));
    assert_ch_error(ch_op_conv2d_forward(cx, &x, &wb, NULL, &p, &y), CH_ERR_INVALID,
                    "must be plain");
    /* labels out of range */
    int64_t sl[2] = {2, 3}, sn[1] = {2}, s1b[1] = {1};
    assert_ch_ok(ch_tensor_alloc_f32(&lg, 2, sl));
    assert_ch_ok(ch_tensor_alloc(&lab, CH_I64, 1, sn, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc_f32(&loss, 1, s1b));
    ((int64_t *)lab.data)[1] = 3;
    assert_ch_error(ch_op_cross_entropy(cx, &lg, &lab, &loss, NULL), CH_ERR_RANGE,
                    "label of sample 1 is 3");
    assert_ch_error(ch_op_cross_entropy(cx, &lg, &x, &loss, NULL), CH_ERR_INVALID, "labels");
    /* tensors on a device this build has no backend for */
    ch_tensor_t g;
    assert_ch_ok(ch_tensor_wrap(&g, x.data, CH_F32, 4, sx, CH_LAYOUT_PLAIN, CH_DEV_CUDA, 0));
    assert_ch_error(ch_op_relu_forward(cx, &g, &g), CH_ERR_UNSUPPORTED, "GPU");
    assert_ch_error(ch_op_add(cx, &x, &g, &x), CH_ERR_INVALID, "another device");
    ch_tensor_free(&x);
    ch_tensor_free(&w);
    ch_tensor_free(&y);
    ch_tensor_free(&yb);
    ch_tensor_free(&wb);
    ch_tensor_free(&v);
    ch_tensor_free(&lg);
    ch_tensor_free(&lab);
    ch_tensor_free(&loss);
    ch_compute_destroy(cx);
}

static void test_cache_and_elementwise(void **state)
{
    (void)state;
    ch_compute_t *cx = new_cx();
    char d[256];
    ch_compute_describe(cx, d, sizeof d);
    assert_non_null(strstr(d, "oneDNN"));
    assert_int_equal(ch_compute_num_threads(cx), 1);
    ch_layout_t L = ch_compute_preferred_layout(cx, CH_DEV_CPU, 64);
    assert_int_equal(ch_compute_preferred_layout(cx, CH_DEV_CPU, 1), CH_LAYOUT_PLAIN);
    ch_tensor_t x, w, y, a, b, o;
    int64_t sx[4] = {4, 16, 6, 6}, sw[4] = {32, 16, 3, 3}, sy[4] = {4, 32, 3, 3};
    assert_ch_ok(ch_tensor_alloc(&x, CH_F32, 4, sx, ch_compute_preferred_layout(cx, CH_DEV_CPU, 16),
                                 CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc_f32(&w, 4, sw));
    assert_ch_ok(ch_tensor_alloc(&y, CH_F32, 4, sy, L, CH_DEV_CPU, 0));
    fill_seq(&x, 0.01f);
    fill_seq(&w, 0.02f);
    ch_conv2d_params_t p = {2, 2, 1, 1};
    assert_ch_ok(ch_op_conv2d_forward(cx, &x, &w, NULL, &p, &y));
    size_t n1 = ch_compute_cache_entries(cx), s1 = ch_compute_scratchpad_bytes(cx);
    assert_true(n1 >= 1);
    for (int i = 0; i < 3; i++) assert_ch_ok(ch_op_conv2d_forward(cx, &x, &w, NULL, &p, &y));
    assert_int_equal(ch_compute_cache_entries(cx), n1);
    assert_int_equal(ch_compute_scratchpad_bytes(cx), s1);

    /* add / add_inplace / scale / fill against plain loops */
    int64_t se[1] = {37};
    assert_ch_ok(ch_tensor_alloc_f32(&a, 1, se));
    assert_ch_ok(ch_tensor_alloc_f32(&b, 1, se));
    assert_ch_ok(ch_tensor_alloc_f32(&o, 1, se));
    fill_seq(&a, 1.0f);
    fill_seq(&b, 0.5f);
    assert_ch_ok(ch_op_add(cx, &a, &b, &o));
    for (int i = 0; i < 37; i++)
        assert_true(((float *)o.data)[i] == ((float *)a.data)[i] + ((float *)b.data)[i]);
    assert_ch_ok(ch_op_add_inplace(cx, &o, &a));
    assert_ch_ok(ch_op_scale(cx, &o, 0.5f));
    for (int i = 0; i < 37; i++)
        assert_true(((float *)o.data)[i] ==
                    (((float *)a.data)[i] + ((float *)b.data)[i] + ((float *)a.data)[i]) * 0.5f);
    assert_ch_ok(ch_op_fill(cx, &o, 3.0f));
    assert_true(((float *)o.data)[36] == 3.0f);
    assert_ch_ok(ch_op_zero(cx, &o));
    assert_true(((float *)o.data)[36] == 0.0f);
    assert_ch_ok(ch_compute_sync(cx));
    ch_tensor_free(&x);
    ch_tensor_free(&w);
    ch_tensor_free(&y);
    ch_tensor_free(&a);
    ch_tensor_free(&b);
    ch_tensor_free(&o);
    ch_compute_destroy(cx);
}

/* The thread count of the context holds for ops called from another thread
 * (OpenMP's setting is per thread). */
typedef struct {
    ch_compute_t *cx;
    int threads_after;
    ch_status st;
} thr_arg;

static void *thr_fn(void *p)
{
    thr_arg *a = p;
    ch_tensor_t x, w, y;
    int64_t sx[4] = {1, 16, 4, 4}, sw[4] = {16, 16, 3, 3};
    a->st = ch_tensor_alloc_f32(&x, 4, sx);
    if (a->st == CH_OK) a->st = ch_tensor_alloc_f32(&w, 4, sw);
    if (a->st == CH_OK) a->st = ch_tensor_alloc_f32(&y, 4, sx);
    ch_conv2d_params_t p1 = {1, 1, 1, 1};
    if (a->st == CH_OK) a->st = ch_op_conv2d_forward(a->cx, &x, &w, NULL, &p1, &y);
    a->threads_after = ch_compute_num_threads(a->cx);
    ch_tensor_free(&x);
    ch_tensor_free(&w);
    ch_tensor_free(&y);
    return NULL;
}

static void test_threads_other_thread(void **state)
{
    (void)state;
    ch_compute_t *cx = new_cx(); /* num_threads = 1 */
    thr_arg a = {cx, -1, CH_OK};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, thr_fn, &a), 0);
    pthread_join(t, NULL);
    assert_ch_ok(a.st);
    assert_int_equal(a.threads_after, 1);
    assert_ch_error(ch_compute_set_num_threads(cx, 0), CH_ERR_INVALID, "expected > 0");
    ch_compute_destroy(cx);
}

/* A rank with no samples (SyncBN, uneven last batch) runs every op on N = 0
 * tensors without storage: all succeed, weight gradients are zero. */
static void test_empty_batch(void **state)
{
    (void)state;
    ch_compute_t *cx = new_cx();
    ch_layout_t L = ch_compute_preferred_layout(cx, CH_DEV_CPU, 16);
    int64_t sx[4] = {0, 16, 5, 5}, sy[4] = {0, 16, 3, 3}, sw[4] = {16, 16, 3, 3}, s1[1] = {16},
            s2[2] = {0, 16}, sl[2] = {0, 4}, sf[2] = {4, 16}, sn[1] = {0};
    ch_tensor_t x, dx, y, dy, w, dw, b, v1, v2, v3, p2, l2, fw, fdw, lab;
    assert_ch_ok(ch_tensor_init(&x, CH_F32, 4, sx, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_init(&dx, CH_F32, 4, sx, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_init(&y, CH_F32, 4, sy, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_init(&dy, CH_F32, 4, sy, L, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_init(&p2, CH_F32, 2, s2, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_init(&l2, CH_F32, 2, sl, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_init(&lab, CH_I64, 1, sn, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc_f32(&w, 4, sw));
    assert_ch_ok(ch_tensor_alloc_f32(&dw, 4, sw));
    assert_ch_ok(ch_tensor_alloc_f32(&b, 1, s1));
    assert_ch_ok(ch_tensor_alloc_f32(&v1, 1, s1));
    assert_ch_ok(ch_tensor_alloc_f32(&v2, 1, s1));
    assert_ch_ok(ch_tensor_alloc_f32(&v3, 1, s1));
    assert_ch_ok(ch_tensor_alloc_f32(&fw, 2, sf));
    assert_ch_ok(ch_tensor_alloc_f32(&fdw, 2, sf));
    assert_ch_ok(ch_op_fill(cx, &dw, 7.0f));
    assert_ch_ok(ch_op_fill(cx, &fdw, 7.0f));
    assert_ch_ok(ch_op_fill(cx, &b, 7.0f));
    ch_conv2d_params_t cp = {2, 2, 1, 1};
    assert_ch_ok(ch_op_conv2d_forward(cx, &x, &w, NULL, &cp, &y));
    assert_ch_ok(ch_op_conv2d_backward_data(cx, &dy, &w, &cp, &dx));
    assert_ch_ok(ch_op_conv2d_backward_weights(cx, &x, &dy, &cp, &dw, &b));
    assert_true(((float *)dw.data)[5] == 0.0f && ((float *)b.data)[3] == 0.0f);
    assert_ch_ok(ch_op_fill(cx, &v3, 1.0f));
    assert_ch_ok(ch_op_batchnorm_apply(cx, &x, &v1, &v3, NULL, NULL, 1e-5f, &dx));
    assert_ch_ok(ch_op_fill(cx, &v1, 7.0f));
    assert_ch_ok(ch_op_batchnorm_backward_reduce(cx, &x, &dx, &v3, &v1, &v2));
    assert_true(((float *)v1.data)[0] == 0.0f && ((float *)v2.data)[15] == 0.0f);
    assert_ch_ok(ch_op_batchnorm_backward_elemt(cx, &x, &dx, &v3, &v3, 1e-5f, NULL, &v1, &v2,
                                                10, &dx));
    assert_ch_error(ch_op_batchnorm_stats(cx, &x, &v1, &v2), CH_ERR_INVALID, "N*H*W = 0");
    assert_ch_ok(ch_op_relu_forward(cx, &x, &x));
    assert_ch_ok(ch_op_relu_backward(cx, &x, &dx, &dx));
    ch_pool2d_params_t pp = {3, 3, 2, 2, 1, 1};
    assert_ch_ok(ch_op_maxpool2d_forward(cx, &x, &pp, &y));
    assert_ch_ok(ch_op_maxpool2d_backward(cx, &x, &dy, &pp, &dx));
    assert_ch_ok(ch_op_avgpool_global_forward(cx, &x, &p2));
    assert_ch_ok(ch_op_avgpool_global_backward(cx, &p2, &dx));
    assert_ch_ok(ch_op_linear_forward(cx, &p2, &fw, NULL, &l2));
    assert_ch_ok(ch_op_linear_backward_data(cx, &l2, &fw, &p2));
    assert_ch_ok(ch_op_linear_backward_weights(cx, &p2, &l2, &fdw, NULL));
    assert_true(((float *)fdw.data)[9] == 0.0f);
    int64_t correct = -1;
    assert_ch_ok(ch_op_count_correct(cx, &l2, &lab, &correct));
    assert_int_equal(correct, 0);
    ch_tensor_t loss;
    assert_ch_ok(ch_tensor_alloc_f32(&loss, 1, (int64_t[1]){1}));
    assert_ch_error(ch_op_cross_entropy(cx, &l2, &lab, &loss, NULL), CH_ERR_INVALID, "N >= 1");
    ch_tensor_free(&loss);
    ch_tensor_free(&w);
    ch_tensor_free(&dw);
    ch_tensor_free(&b);
    ch_tensor_free(&v1);
    ch_tensor_free(&v2);
    ch_tensor_free(&v3);
    ch_tensor_free(&fw);
    ch_tensor_free(&fdw);
    ch_compute_destroy(cx);
}

/* SyncBN statistics combination with an empty rank. */
static void test_bn_gather_stats(void **state)
{
    (void)state;
    ch_compute_t *cx = new_cx();
    /* channel values: rank0 {1,2,3}, rank1 {}, rank2 {10, 20} */
    float ms[6] = {2.0f, 0, 0, 0, 15.0f, 0}, vs[6] = {2.0f / 3.0f, 0, 0, 0, 25.0f, 0};
    int64_t counts[3] = {3, 0, 2}, tot = 0;
    int64_t s2[2] = {3, 2}, s1[1] = {2};
    ch_tensor_t M, Vt, m, v;
    assert_ch_ok(ch_tensor_wrap(&M, ms, CH_F32, 2, s2, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_wrap(&Vt, vs, CH_F32, 2, s2, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc_f32(&m, 1, s1));
    assert_ch_ok(ch_tensor_alloc_f32(&v, 1, s1));
    assert_ch_ok(ch_op_batchnorm_gather_stats(cx, &M, &Vt, counts, 3, &m, &v, &tot));
    assert_int_equal(tot, 5);
    /* {1,2,3,10,20}: mean 7.2, biased var 102.8 - 7.2^2 = 50.96 */
    assert_true(fabs(((float *)m.data)[0] - 7.2) < 1e-5);
    assert_true(fabs(((float *)v.data)[0] - 50.96) < 1e-4);
    int64_t zero[3] = {0, 0, 0};
    assert_ch_error(ch_op_batchnorm_gather_stats(cx, &M, &Vt, zero, 3, &m, &v, &tot),
                    CH_ERR_INVALID, "total count");
    ch_tensor_free(&m);
    ch_tensor_free(&v);
    ch_compute_destroy(cx);
}

/* compute.cpu_conv_algorithm: a 3x3 stride-1 convolution (2x32x12x12 ->
 * 2x32x12x12, pad 1, bias) in the context's preferred layout and in plain
 * layout, forward, backward data and backward weights, with AUTO and
 * WINOGRAD against DIRECT: relative differences within 1e-4 (forward,
 * backward data) and 1e-3 (weights and bias, sums over 288 products per
 * sample and position), and on an AVX-512 ISA Winograd kernels are used
 * (ch_compute_winograd_primitives) while DIRECT never uses one; below
 * AVX-512 oneDNN has none and the results are the direct ones. A bad value
 * is refused at creation. */
static void test_conv_algorithms(void **state)
{
    (void)state;
    ch_compute_t *cxs[3] = {NULL, NULL, NULL};
    for (int a = 0; a < 3; a++) {
        ch_compute_options_t o;
        ch_compute_options_default(&o);
        o.num_threads = 1;
        o.cpu_conv_algorithm = a;
        assert_ch_ok(ch_compute_create(&o, &cxs[a]));
    }
    char desc[256];
    ch_compute_describe(cxs[0], desc, sizeof desc);
    int avx512 = strstr(desc, "isa avx512") != NULL;
    int64_t xs[4] = {2, 32, 12, 12}, ws[4] = {32, 32, 3, 3}, bs[1] = {32};
    ch_tensor_t x, w, b, dy;
    assert_ch_ok(ch_tensor_alloc(&x, CH_F32, 4, xs, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&dy, CH_F32, 4, xs, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&w, CH_F32, 4, ws, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&b, CH_F32, 1, bs, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    uint32_t r = 12345u;
    ch_tensor_t *all[4] = {&x, &dy, &w, &b};
    for (int t = 0; t < 4; t++) {
        float *p = all[t]->data;
        for (int64_t i = 0; i < ch_tensor_numel(all[t]); i++) {
            r = r * 1664525u + 1013904223u;
            p[i] = (float)((double)(r >> 8) / 16777216.0 - 0.5);
        }
    }
    ch_conv2d_params_t cp = {1, 1, 1, 1};
    ch_layout_t layouts[2] = {ch_compute_preferred_layout(cxs[0], CH_DEV_CPU, 32),
                              CH_LAYOUT_PLAIN};
    for (int li = 0; li < 2; li++) {
        ch_tensor_t y[3], dx[3], dw[3], db[3];
        for (int a = 0; a < 3; a++) {
            ch_tensor_t xl, dyl;
            to_layout(cxs[a], &x, layouts[li], &xl);
            to_layout(cxs[a], &dy, layouts[li], &dyl);
            like(&xl, layouts[li], &y[a]);
            like(&xl, layouts[li], &dx[a]);
            like(&w, CH_LAYOUT_PLAIN, &dw[a]);
            like(&b, CH_LAYOUT_PLAIN, &db[a]);
            assert_ch_ok(ch_op_conv2d_forward(cxs[a], &xl, &w, &b, &cp, &y[a]));
            assert_ch_ok(ch_op_conv2d_backward_data(cxs[a], &dyl, &w, &cp, &dx[a]));
            assert_ch_ok(ch_op_conv2d_backward_weights(cxs[a], &xl, &dyl, &cp, &dw[a], &db[a]));
            ch_tensor_free(&xl);
            ch_tensor_free(&dyl);
        }
        for (int a = 1; a < 3; a++) {
            ch_tensor_t p0, p1;
            const ch_tensor_t *pairs[2][2] = {{&y[0], &y[a]}, {&dx[0], &dx[a]}};
            const char *what[2] = {"y", "dx"};
            for (int k = 0; k < 2; k++) {
                assert_ch_ok(ch_tensor_alloc(&p0, CH_F32, 4, xs, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
                assert_ch_ok(ch_tensor_alloc(&p1, CH_F32, 4, xs, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
                assert_ch_ok(ch_tensor_to_plain(cxs[0], pairs[k][0], &p0));
                assert_ch_ok(ch_tensor_to_plain(cxs[0], pairs[k][1], &p1));
                double e = rel_err(p1.data, p0.data, ch_tensor_numel(&p0));
                print_message("conv %s vs direct, %s, %s: relative difference %.2g\n",
                              ch_compute_cpu_conv_algorithm_names[a], ch_layout_name(layouts[li]),
                              what[k], e);
                if (!(e <= 1e-4))
                    fail_msg("%s %s (%s): relative difference to direct %.3g > 1e-4",
                             ch_compute_cpu_conv_algorithm_names[a], what[k],
                             ch_layout_name(layouts[li]), e);
                ch_tensor_free(&p0);
                ch_tensor_free(&p1);
            }
            double ew = rel_err(dw[a].data, dw[0].data, ch_tensor_numel(&w));
            double eb = rel_err(db[a].data, db[0].data, 32);
            print_message("conv %s vs direct, %s, dw / db: relative difference %.2g / %.2g\n",
                          ch_compute_cpu_conv_algorithm_names[a], ch_layout_name(layouts[li]), ew,
                          eb);
            if (!(ew <= 1e-3) || !(eb <= 1e-3))
                fail_msg("%s dw/db (%s): relative difference to direct %.3g / %.3g > 1e-3",
                         ch_compute_cpu_conv_algorithm_names[a], ch_layout_name(layouts[li]), ew,
                         eb);
        }
        for (int a = 0; a < 3; a++) {
            ch_tensor_free(&y[a]);
            ch_tensor_free(&dx[a]);
            ch_tensor_free(&dw[a]);
            ch_tensor_free(&db[a]);
        }
    }
    assert_int_equal(ch_compute_winograd_primitives(cxs[0]), 0);
    if (avx512) {
        /* nChw16c: forward, backward data, backward weights */
        if (ch_compute_winograd_primitives(cxs[2]) < 3)
            fail_msg("winograd on %s: %lld Winograd primitives, expected >= 3", desc,
                     (long long)ch_compute_winograd_primitives(cxs[2]));
        ch_compute_describe(cxs[2], desc, sizeof desc);
        assert_non_null(strstr(desc, "3x3 convolutions winograd"));
    } else {
        assert_int_equal(ch_compute_winograd_primitives(cxs[1]), 0);
        assert_int_equal(ch_compute_winograd_primitives(cxs[2]), 0);
    }
    for (int a = 0; a < 3; a++) ch_compute_destroy(cxs[a]);
    assert_int_equal(ch_compute_winograd_primitives(NULL), 0);
    ch_tensor_free(&x);
    ch_tensor_free(&dy);
    ch_tensor_free(&w);
    ch_tensor_free(&b);

    ch_compute_options_t o;
    ch_compute_options_default(&o);
    o.cpu_conv_algorithm = 3;
    ch_compute_t *bad = NULL;
    assert_ch_error(ch_compute_create(&o, &bad), CH_ERR_INVALID, "cpu_conv_algorithm 3");
    assert_null(bad);
}

/* ---------------------------------------------------------------- golden */

static const char *CONV_CASES[] = {"odd_bias", "s2_nobias", "down1x1", "stem",  "c16_bias",
                                   "c32_s2",   "spatial1",  "s2_to1",  "row1", "k5_p2_s2",
                                   "spatial1_bias", "k1_s2_on1", "win2_odd", "win3_valid",
                                   "map2_bias", "map2x3_odd", "map3_k5"};

/* One golden convolution case pre ("conv/<name>/"): forward, backward data
 * and backward weights in every input layout with the same output layout
 * where allowed, plus plain input -> every output layout (the stem case). */
static void golden_conv_case(ch_compute_t *cx, const char *pre, const ch_conv2d_params_t *pp,
                             int hb)
{
    ch_conv2d_params_t p = *pp;
    ch_tensor_t x, w, b, dy, yref;
    load(&x, pre, "x");
    load(&w, pre, "w");
    if (hb) load(&b, pre, "b");
    load(&dy, pre, "dy");
    load(&yref, pre, "y");
    ch_layout_t lx[4], ly[4];
    int nx = layouts_for(x.shape[1], lx), ny = layouts_for(yref.shape[1], ly);
    for (int i = 0; i < nx + ny; i++) {
        ch_layout_t la = i < nx ? lx[i] : CH_LAYOUT_PLAIN;
        ch_layout_t lb = i < nx ? la : ly[i - nx];
        if (i < nx) {
            int ok = 0;
            for (int j = 0; j < ny; j++) ok |= ly[j] == lb;
            if (!ok) continue;
        }
        char ctx[96];
        snprintf(ctx, sizeof ctx, "x %s, y %s", ch_layout_name(la), ch_layout_name(lb));
        ch_tensor_t xl, yl, dyl, dxl, dw, db;
        to_layout(cx, &x, la, &xl);
        to_layout(cx, &dy, lb, &dyl);
        like(&yref, lb, &yl);
        like(&x, la, &dxl);
        like(&w, CH_LAYOUT_PLAIN, &dw);
        if (hb) like(&b, CH_LAYOUT_PLAIN, &db);
        assert_ch_ok(ch_op_conv2d_forward(cx, &xl, &w, hb ? &b : NULL, &p, &yl));
        check(cx, &yl, pre, "y", TOL_FWD, ctx);
        assert_ch_ok(ch_op_conv2d_backward_data(cx, &dyl, &w, &p, &dxl));
        check(cx, &dxl, pre, "dx", TOL_BWD, ctx);
        assert_ch_ok(ch_op_conv2d_backward_weights(cx, &xl, &dyl, &p, &dw, hb ? &db : NULL));
        check(cx, &dw, pre, "dw", TOL_BWD, ctx);
        if (hb) check(cx, &db, pre, "db", TOL_BWD, ctx);
        ch_tensor_free(&xl);
        ch_tensor_free(&yl);
        ch_tensor_free(&dyl);
        ch_tensor_free(&dxl);
        ch_tensor_free(&dw);
        if (hb) ch_tensor_free(&db);
    }
    ch_tensor_free(&x);
    ch_tensor_free(&w);
    if (hb) ch_tensor_free(&b);
    ch_tensor_free(&dy);
    ch_tensor_free(&yref);
}

static void test_golden_conv(void **state)
{
    (void)state;
    need_golden();
    ch_compute_t *cx = new_cx();
    for (size_t ci = 0; ci < sizeof CONV_CASES / sizeof *CONV_CASES; ci++) {
        char pre[64];
        snprintf(pre, sizeof pre, "conv/%s/", CONV_CASES[ci]);
        ch_tensor_t prm;
        load(&prm, pre, "params");
        int64_t *P = prm.data;
        ch_conv2d_params_t p = {(int)P[0], (int)P[0], (int)P[1], (int)P[1]};
        golden_conv_case(cx, pre, &p, (int)P[2]);
        ch_tensor_free(&prm);
    }
    ch_compute_destroy(cx);
}

static const char *BN_CASES[] = {"odd", "c16", "c32", "flat", "b1"};

static void vec_like(int64_t C, ch_tensor_t *t)
{
    int64_t s[1] = {C};
    assert_ch_ok(ch_tensor_alloc_f32(t, 1, s));
}

static void test_golden_batchnorm(void **state)
{
    (void)state;
    need_golden();
    ch_compute_t *cx = new_cx();
    const float eps = 1e-5f;
    for (size_t ci = 0; ci < sizeof BN_CASES / sizeof *BN_CASES; ci++) {
        char pre[64];
        snprintf(pre, sizeof pre, "bn/%s/", BN_CASES[ci]);
        ch_tensor_t x, w, b, rm, rv, dy;
        load(&x, pre, "x");
        load(&w, pre, "w");
        load(&b, pre, "b");
        load(&dy, pre, "dy");
        int64_t C = x.shape[1];
        int64_t count = x.ndim == 4 ? x.shape[0] * x.shape[2] * x.shape[3] : x.shape[0];
        ch_layout_t ls[4];
        int nl = x.ndim == 4 ? layouts_for(C, ls) : (ls[0] = CH_LAYOUT_PLAIN, 1);
        for (int li = 0; li < nl; li++) {
            char ctx[64];
            snprintf(ctx, sizeof ctx, "layout %s", ch_layout_name(ls[li]));
            ch_tensor_t xl, dyl, yl, dxl, mean, var, dw, db;
            to_layout(cx, &x, ls[li], &xl);
            to_layout(cx, &dy, ls[li], &dyl);
            like(&x, ls[li], &yl);
            like(&x, ls[li], &dxl);
            vec_like(C, &mean);
            vec_like(C, &var);
            vec_like(C, &dw);
            vec_like(C, &db);
            assert_ch_ok(ch_op_batchnorm_forward_train(cx, &xl, &w, &b, eps, &yl, &mean, &var));
            check(cx, &yl, pre, "y", TOL_FWD, ctx);
            check(cx, &mean, pre, "mean", TOL_FWD, ctx);
            check(cx, &var, pre, "var", TOL_FWD, ctx);
            load(&rm, pre, "rm0");
            load(&rv, pre, "rv0");
            assert_ch_ok(ch_op_batchnorm_update_running(cx, &rm, &rv, &mean, &var, count, 0.1f));
            check(cx, &rm, pre, "rm", TOL_FWD, ctx);
            check(cx, &rv, pre, "rv", TOL_FWD, ctx);
            ch_tensor_free(&rm);
            ch_tensor_free(&rv);
            assert_ch_ok(ch_op_batchnorm_backward(cx, &xl, &dyl, &mean, &var, eps, &w, &dxl,
                                                  &dw, &db));
            check(cx, &dxl, pre, "dx", TOL_BWD, ctx);
            check(cx, &dw, pre, "dw", TOL_BWD, ctx);
            check(cx, &db, pre, "db", TOL_BWD, ctx);
            /* in-place dx over dy */
            assert_ch_ok(ch_op_batchnorm_backward(cx, &xl, &dyl, &mean, &var, eps, &w, &dyl,
                                                  NULL, NULL));
            check(cx, &dyl, pre, "dx", TOL_BWD, ctx);
            /* eval mode with the initial running stats */
            load(&rm, pre, "rm0");
            load(&rv, pre, "rv0");
            assert_ch_ok(ch_op_batchnorm_forward_eval(cx, &xl, &w, &b, &rm, &rv, eps, &yl));
            check(cx, &yl, pre, "y_eval", TOL_FWD, ctx);
            ch_tensor_free(&rm);
            ch_tensor_free(&rv);
            ch_tensor_free(&xl);
            ch_tensor_free(&dyl);
            ch_tensor_free(&yl);
            ch_tensor_free(&dxl);
            ch_tensor_free(&mean);
            ch_tensor_free(&var);
            ch_tensor_free(&dw);
            ch_tensor_free(&db);
        }
        ch_tensor_free(&x);
        ch_tensor_free(&w);
        ch_tensor_free(&b);
        ch_tensor_free(&dy);
    }
    ch_compute_destroy(cx);
}

/* SyncBN composition: split the batch into "ranks" along N (one possibly
 * empty), run the per-rank pieces with the reductions done here in place of
 * the collectives, and compare with PyTorch's full-batch BN. */
static void test_golden_syncbn_pieces(void **state)
{
    (void)state;
    need_golden();
    ch_compute_t *cx = new_cx();
    const float eps = 1e-5f;
    const char *cases[] = {"odd", "c32"};
    for (size_t ci = 0; ci < 2; ci++) {
        char pre[64];
        snprintf(pre, sizeof pre, "bn/%s/", cases[ci]);
        ch_tensor_t x, w, b, dy;
        load(&x, pre, "x");
        load(&w, pre, "w");
        load(&b, pre, "b");
        load(&dy, pre, "dy");
        int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
        ch_layout_t L = ch_compute_preferred_layout(cx, CH_DEV_CPU, C);
        enum { R = 3 };
        int64_t nr[R] = {N - 1, 0, 1}; /* rank 1 holds no samples */
        ch_tensor_t xr[R], dyr[R], yr[R], dxr[R];
        int64_t counts[R];
        ch_tensor_t means, vars, mean, var, sdy, sdx, acc1, acc2;
        int64_t s2[2] = {R, C};
        assert_ch_ok(ch_tensor_alloc_f32(&means, 2, s2));
        assert_ch_ok(ch_tensor_alloc_f32(&vars, 2, s2));
        vec_like(C, &mean);
        vec_like(C, &var);
        vec_like(C, &sdy);
        vec_like(C, &sdx);
        vec_like(C, &acc1);
        vec_like(C, &acc2);
        int64_t off = 0;
        size_t per = (size_t)(C * H * W);
        for (int r = 0; r < R; r++) {
            int64_t s4[4] = {nr[r], C, H, W};
            ch_tensor_t px, pdy;
            assert_ch_ok(ch_tensor_wrap(&px, (float *)x.data + off * per, CH_F32, 4, s4,
                                        CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
            assert_ch_ok(ch_tensor_wrap(&pdy, (float *)dy.data + off * per, CH_F32, 4, s4,
                                        CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
            to_layout(cx, &px, L, &xr[r]);
            to_layout(cx, &pdy, L, &dyr[r]);
            like(&px, L, &yr[r]);
            like(&px, L, &dxr[r]);
            counts[r] = nr[r] * H * W;
            off += nr[r];
            /* per-rank local stats into row r ("all-gather") */
            ch_tensor_t mrow, vrow;
            int64_t s1[1] = {C};
            assert_ch_ok(ch_tensor_wrap(&mrow, (float *)means.data + r * C, CH_F32, 1, s1,
                                        CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
            assert_ch_ok(ch_tensor_wrap(&vrow, (float *)vars.data + r * C, CH_F32, 1, s1,
                                        CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
            if (counts[r] > 0) assert_ch_ok(ch_op_batchnorm_stats(cx, &xr[r], &mrow, &vrow));
        }
        int64_t total = 0;
        assert_ch_ok(ch_op_batchnorm_gather_stats(cx, &means, &vars, counts, R, &mean, &var,
                                                  &total));
        assert_int_equal(total, N * H * W);
        check(cx, &mean, pre, "mean", TOL_FWD, "syncbn");
        check(cx, &var, pre, "var", TOL_FWD, "syncbn");
        assert_ch_ok(ch_op_zero(cx, &acc1));
        assert_ch_ok(ch_op_zero(cx, &acc2));
        for (int r = 0; r < R; r++) {
            assert_ch_ok(ch_op_batchnorm_apply(cx, &xr[r], &mean, &var, &w, &b, eps, &yr[r]));
            assert_ch_ok(ch_op_batchnorm_backward_reduce(cx, &xr[r], &dyr[r], &mean, &sdy, &sdx));
            assert_ch_ok(ch_op_add_inplace(cx, &acc1, &sdy)); /* "all-reduce" */
            assert_ch_ok(ch_op_add_inplace(cx, &acc2, &sdx));
        }
        ch_tensor_t dw, db;
        vec_like(C, &dw);
        vec_like(C, &db);
        assert_ch_ok(ch_op_batchnorm_param_grads(cx, &acc1, &acc2, &var, eps, &dw, &db));
        check(cx, &dw, pre, "dw", TOL_BWD, "syncbn");
        check(cx, &db, pre, "db", TOL_BWD, "syncbn");
        /* reassemble y and dx over the ranks and compare */
        ch_tensor_t yall, dxall;
        like(&x, CH_LAYOUT_PLAIN, &yall);
        like(&x, CH_LAYOUT_PLAIN, &dxall);
        off = 0;
        for (int r = 0; r < R; r++) {
            assert_ch_ok(ch_op_batchnorm_backward_elemt(cx, &xr[r], &dyr[r], &mean, &var, eps,
                                                        &w, &acc1, &acc2, total, &dxr[r]));
            int64_t s4[4] = {nr[r], C, H, W};
            ch_tensor_t py, pdx;
            assert_ch_ok(ch_tensor_wrap(&py, (float *)yall.data + off * per, CH_F32, 4, s4,
                                        CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
            assert_ch_ok(ch_tensor_wrap(&pdx, (float *)dxall.data + off * per, CH_F32, 4, s4,
                                        CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
            assert_ch_ok(ch_op_reorder(cx, &yr[r], &py));
            assert_ch_ok(ch_op_reorder(cx, &dxr[r], &pdx));
            off += nr[r];
        }
        check(cx, &yall, pre, "y", TOL_FWD, "syncbn");
        check(cx, &dxall, pre, "dx", TOL_BWD, "syncbn");
        for (int r = 0; r < R; r++) {
            ch_tensor_free(&xr[r]);
            ch_tensor_free(&dyr[r]);
            ch_tensor_free(&yr[r]);
            ch_tensor_free(&dxr[r]);
        }
        ch_tensor_free(&yall);
        ch_tensor_free(&dxall);
        ch_tensor_free(&means);
        ch_tensor_free(&vars);
        ch_tensor_free(&mean);
        ch_tensor_free(&var);
        ch_tensor_free(&sdy);
        ch_tensor_free(&sdx);
        ch_tensor_free(&acc1);
        ch_tensor_free(&acc2);
        ch_tensor_free(&dw);
        ch_tensor_free(&db);
        ch_tensor_free(&x);
        ch_tensor_free(&w);
        ch_tensor_free(&b);
        ch_tensor_free(&dy);
    }
    ch_compute_destroy(cx);
}

static void test_golden_relu(void **state)
{
    (void)state;
    need_golden();
    ch_compute_t *cx = new_cx();
    const char *cases[] = {"odd", "c16"};
    for (size_t ci = 0; ci < 2; ci++) {
        char pre[64];
        snprintf(pre, sizeof pre, "relu/%s/", cases[ci]);
        ch_tensor_t x, dy;
        load(&x, pre, "x");
        load(&dy, pre, "dy");
        ch_layout_t ls[4];
        int nl = layouts_for(x.shape[1], ls);
        for (int li = 0; li < nl; li++) {
            ch_tensor_t xl, dyl, yl;
            to_layout(cx, &x, ls[li], &xl);
            to_layout(cx, &dy, ls[li], &dyl);
            like(&x, ls[li], &yl);
            assert_ch_ok(ch_op_relu_forward(cx, &xl, &yl));
            check(cx, &yl, pre, "y", TOL_FWD, ch_layout_name(ls[li]));
            assert_ch_ok(ch_op_relu_forward(cx, &xl, &xl)); /* in place */
            check(cx, &xl, pre, "y", TOL_FWD, ch_layout_name(ls[li]));
            assert_ch_ok(ch_op_relu_backward(cx, &xl, &dyl, &dyl)); /* in place */
            check(cx, &dyl, pre, "dx", TOL_BWD, ch_layout_name(ls[li]));
            ch_tensor_free(&xl);
            ch_tensor_free(&dyl);
            ch_tensor_free(&yl);
        }
        ch_tensor_free(&x);
        ch_tensor_free(&dy);
    }
    ch_compute_destroy(cx);
}

enum { POOL_AVG, POOL_MAX, POOL_ADAPTIVE };

/* One pooling case of kind `kind` in every layout: forward y and input
 * gradient dx against PyTorch. */
static void golden_pool_case(ch_compute_t *cx, const char *pre, int kind,
                             const ch_pool2d_params_t *pp)
{
    ch_tensor_t x, dy, yref;
    ch_pool2d_params_t p = *pp;
    load(&x, pre, "x");
    load(&dy, pre, "dy");
    load(&yref, pre, "y");
    ch_layout_t ls[4];
    int nl = layouts_for(x.shape[1], ls);
    for (int li = 0; li < nl; li++) {
        const char *ctx = ch_layout_name(ls[li]);
        ch_tensor_t xl, dyl, yl, dxl;
        to_layout(cx, &x, ls[li], &xl);
        to_layout(cx, &dy, ls[li], &dyl);
        like(&yref, ls[li], &yl);
        like(&x, ls[li], &dxl);
        if (kind == POOL_AVG) {
            assert_ch_ok(ch_op_avgpool2d_forward(cx, &xl, &p, &yl));
            check(cx, &yl, pre, "y", TOL_FWD, ctx);
            assert_ch_ok(ch_op_avgpool2d_backward(cx, &dyl, &p, &dxl));
        } else if (kind == POOL_MAX) {
            assert_ch_ok(ch_op_maxpool2d_forward(cx, &xl, &p, &yl));
            check(cx, &yl, pre, "y", TOL_FWD, ctx);
            assert_ch_ok(ch_op_maxpool2d_backward(cx, &xl, &dyl, &p, &dxl));
        } else {
            assert_ch_ok(ch_op_adaptive_avgpool2d_forward(cx, &xl, &yl));
            check(cx, &yl, pre, "y", TOL_FWD, ctx);
            assert_ch_ok(ch_op_adaptive_avgpool2d_backward(cx, &dyl, &dxl));
        }
        check(cx, &dxl, pre, "dx", TOL_BWD, ctx);
        ch_tensor_free(&xl);
        ch_tensor_free(&dyl);
        ch_tensor_free(&yl);
        ch_tensor_free(&dxl);
    }
    ch_tensor_free(&x);
    ch_tensor_free(&dy);
    ch_tensor_free(&yref);
}

static void test_golden_pooling(void **state)
{
    (void)state;
    need_golden();
    ch_compute_t *cx = new_cx();
    const char *mp[] = {"stem", "odd", "k2", "tiny"};
    for (size_t ci = 0; ci < 4; ci++) {
        char pre[64];
        snprintf(pre, sizeof pre, "maxpool/%s/", mp[ci]);
        ch_tensor_t prm;
        load(&prm, pre, "params");
        int64_t *P = prm.data;
        ch_pool2d_params_t p = {(int)P[0], (int)P[0], (int)P[1], (int)P[1], (int)P[2], (int)P[2]};
        ch_tensor_free(&prm);
        golden_pool_case(cx, pre, POOL_MAX, &p);
    }
    const char *ap[] = {"c16", "odd", "one"};
    for (size_t ci = 0; ci < 3; ci++) {
        char pre[64];
        snprintf(pre, sizeof pre, "avgpool/%s/", ap[ci]);
        ch_tensor_t x, dy, yref;
        load(&x, pre, "x");
        load(&dy, pre, "dy");
        load(&yref, pre, "y");
        ch_layout_t ls[4];
        int nl = layouts_for(x.shape[1], ls);
        for (int li = 0; li < nl; li++) {
            const char *ctx = ch_layout_name(ls[li]);
            ch_tensor_t xl, dyl, yl, dxl, y2, dy2;
            to_layout(cx, &x, ls[li], &xl);
            to_layout(cx, &dy, ls[li], &dyl);
            like(&yref, ls[li], &yl);
            like(&x, ls[li], &dxl);
            assert_ch_ok(ch_op_avgpool_global_forward(cx, &xl, &yl));
            check(cx, &yl, pre, "y", TOL_FWD, ctx);
            assert_ch_ok(ch_op_avgpool_global_backward(cx, &dyl, &dxl));
            check(cx, &dxl, pre, "dx", TOL_BWD, ctx);
            /* (N,C) plain output / gradient, as fed to linear */
            int64_t s2[2] = {x.shape[0], x.shape[1]};
            assert_ch_ok(ch_tensor_alloc_f32(&y2, 2, s2));
            assert_ch_ok(ch_op_avgpool_global_forward(cx, &xl, &y2));
            assert_true(rel_err(y2.data, yref.data, ch_tensor_numel(&y2)) <= TOL_FWD);
            assert_ch_ok(ch_tensor_view(&dy2, &dy, 2, s2));
            assert_ch_ok(ch_op_avgpool_global_backward(cx, &dy2, &dxl));
            check(cx, &dxl, pre, "dx", TOL_BWD, ctx);
            ch_tensor_free(&y2);
            ch_tensor_free(&xl);
            ch_tensor_free(&dyl);
            ch_tensor_free(&yl);
            ch_tensor_free(&dxl);
        }
        ch_tensor_free(&x);
        ch_tensor_free(&dy);
        ch_tensor_free(&yref);
    }
    ch_compute_destroy(cx);
}

static void test_golden_linear(void **state)
{
    (void)state;
    need_golden();
    ch_compute_t *cx = new_cx();
    const char *cases[] = {"small", "fc", "nobias"};
    for (size_t ci = 0; ci < 3; ci++) {
        char pre[64];
        snprintf(pre, sizeof pre, "linear/%s/", cases[ci]);
        int hb = has(pre, "b");
        ch_tensor_t x, w, b, dy, yref, y, dx, dw, db;
        load(&x, pre, "x");
        load(&w, pre, "w");
        if (hb) load(&b, pre, "b");
        load(&dy, pre, "dy");
        load(&yref, pre, "y");
        like(&yref, CH_LAYOUT_PLAIN, &y);
        like(&x, CH_LAYOUT_PLAIN, &dx);
        like(&w, CH_LAYOUT_PLAIN, &dw);
        assert_ch_ok(ch_op_linear_forward(cx, &x, &w, hb ? &b : NULL, &y));
        check(cx, &y, pre, "y", TOL_FWD, "linear");
        assert_ch_ok(ch_op_linear_backward_data(cx, &dy, &w, &dx));
        check(cx, &dx, pre, "dx", TOL_BWD, "linear");
        if (hb) like(&b, CH_LAYOUT_PLAIN, &db);
        assert_ch_ok(ch_op_linear_backward_weights(cx, &x, &dy, &dw, hb ? &db : NULL));
        check(cx, &dw, pre, "dw", TOL_BWD, "linear");
        if (hb) {
            check(cx, &db, pre, "db", TOL_BWD, "linear");
            ch_tensor_free(&db);
            ch_tensor_free(&b);
        }
        ch_tensor_free(&x);
        ch_tensor_free(&w);
        ch_tensor_free(&dy);
        ch_tensor_free(&yref);
        ch_tensor_free(&y);
        ch_tensor_free(&dx);
        ch_tensor_free(&dw);
    }
    ch_compute_destroy(cx);
}

static void test_golden_cross_entropy(void **state)
{
    (void)state;
    need_golden();
    ch_compute_t *cx = new_cx();
    const char *cases[] = {"b4", "b1", "b64"};
    for (size_t ci = 0; ci < 3; ci++) {
        char pre[64];
        snprintf(pre, sizeof pre, "ce/%s/", cases[ci]);
        ch_tensor_t lg, lab, loss, dl, am, amref, cref;
        load(&lg, pre, "logits");
        load(&lab, pre, "labels");
        load(&amref, pre, "argmax");
        load(&cref, pre, "correct");
        int64_t s1[1] = {1};
        assert_ch_ok(ch_tensor_alloc_f32(&loss, 1, s1));
        like(&lg, CH_LAYOUT_PLAIN, &dl);
        assert_ch_ok(ch_op_cross_entropy(cx, &lg, &lab, &loss, &dl));
        check(cx, &loss, pre, "loss", TOL_FWD, "ce");
        check(cx, &dl, pre, "dlogits", TOL_BWD, "ce");
        assert_ch_ok(ch_op_cross_entropy(cx, &lg, &lab, &loss, NULL));
        check(cx, &loss, pre, "loss", TOL_FWD, "ce without gradient");
        assert_ch_ok(ch_tensor_alloc(&am, CH_I64, 1, lab.shape, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
        assert_ch_ok(ch_op_argmax(cx, &lg, &am));
        assert_memory_equal(am.data, amref.data, am.nbytes);
        int64_t correct = -1;
        assert_ch_ok(ch_op_count_correct(cx, &lg, &lab, &correct));
        assert_int_equal(correct, ((int64_t *)cref.data)[0]);
        ch_tensor_free(&lg);
        ch_tensor_free(&lab);
        ch_tensor_free(&loss);
        ch_tensor_free(&dl);
        ch_tensor_free(&am);
        ch_tensor_free(&amref);
        ch_tensor_free(&cref);
    }
    ch_compute_destroy(cx);
}

/* ------------------------------------ convolution and pooling variants */

/* tests/golden/convpool_golden.py's case lists (same order). */
static const char *CONVX_CASES[] = {"depthwise",         "depthwise_s2",  "depthwise_mult2",
                                    "groups2_nonsquare", "groups4_c16",   "dilated2",
                                    "dilated_dw",        "dilated_nonsquare",
                                    "dilated_groups_s2"};
static const char *AVG_CASES[] = {"k3s2p1_incl",        "k3s2p1_excl",        "k2_ceil_incl",
                                  "k2_ceil_excl",       "ceil_past_pad_incl", "ceil_past_pad_excl",
                                  "ceil_drop",          "nonsquare",          "c16_ceil",
                                  "c32_k2"};
static const char *MAXX_CASES[] = {"ceil_odd", "ceil_drop", "ceil_past_pad_c16",
                                   "nonsquare_ceil"};
static const char *ADAPT_CASES[] = {"7x9_to_3x4", "c16_5_to_2", "same",
                                    "up_3_to_5x4", "c16_to_1x1", "c8_14_to_3"};

/* Grouped, depthwise, dilated and non-square convolutions (oneDNN's
 * grouped / dilated primitives) vs torch.nn.functional.conv2d, every
 * layout; limits as the plain convolutions (1e-4 forward, 1e-3 gradients). */
static void test_golden_conv_variants(void **state)
{
    (void)state;
    need_golden();
    ch_compute_t *cx = new_cx();
    for (size_t ci = 0; ci < sizeof CONVX_CASES / sizeof *CONVX_CASES; ci++) {
        char pre[64];
        snprintf(pre, sizeof pre, "convx/%s/", CONVX_CASES[ci]);
        ch_tensor_t prm;
        load(&prm, pre, "params");
        int64_t *P = prm.data;
        ch_conv2d_params_t p = {(int)P[0], (int)P[1], (int)P[2], (int)P[3],
                                (int)P[4], (int)P[5], (int)P[6]};
        golden_conv_case(cx, pre, &p, (int)P[7]);
        ch_tensor_free(&prm);
    }
    ch_compute_destroy(cx);
}

/* The pooling parameters of a golden case: [kh, kw, sh, sw, ph, pw,
 * ceil_mode, count_include_pad] (convpool_golden.py). */
static ch_pool2d_params_t golden_pool_params(const char *pre)
{
    ch_tensor_t prm;
    load(&prm, pre, "params");
    int64_t *P = prm.data;
    ch_pool2d_params_t p = {(int)P[0], (int)P[1], (int)P[2], (int)P[3],
                            (int)P[4], (int)P[5], (int)P[6], (int)P[7]};
    ch_tensor_free(&prm);
    return p;
}

/* AvgPool2d (padding, ceil_mode, count_include_pad, non-square), MaxPool2d
 * with ceil_mode and AdaptiveAvgPool2d to (h, w) vs PyTorch; the
 * ceil_mode cases include a last window that runs past the right padding
 * and one that PyTorch drops. Output shapes follow ch_pool_out_size, which
 * must give PyTorch's. */
static void test_golden_pool_variants(void **state)
{
    (void)state;
    need_golden();
    ch_compute_t *cx = new_cx();
    char pre[64];
    for (size_t ci = 0; ci < sizeof AVG_CASES / sizeof *AVG_CASES; ci++) {
        snprintf(pre, sizeof pre, "avgpool2d/%s/", AVG_CASES[ci]);
        ch_pool2d_params_t p = golden_pool_params(pre);
        golden_pool_case(cx, pre, POOL_AVG, &p);
    }
    for (size_t ci = 0; ci < sizeof MAXX_CASES / sizeof *MAXX_CASES; ci++) {
        snprintf(pre, sizeof pre, "maxpoolx/%s/", MAXX_CASES[ci]);
        ch_pool2d_params_t p = golden_pool_params(pre);
        golden_pool_case(cx, pre, POOL_MAX, &p);
    }
    for (size_t ci = 0; ci < sizeof ADAPT_CASES / sizeof *ADAPT_CASES; ci++) {
        snprintf(pre, sizeof pre, "adaptive/%s/", ADAPT_CASES[ci]);
        const ch_pool2d_params_t none = {0};
        golden_pool_case(cx, pre, POOL_ADAPTIVE, &none);
    }
    ch_compute_destroy(cx);
}

/* PyTorch's pooling output sizes (pooling_output_shape), including the
 * ceil_mode drop rule, and the errors for bad groups / dilation. */
static void test_pool_conv_sizes(void **state)
{
    (void)state;
    /* floor: (7 + 0 - 2) / 2 + 1 = 3; ceil: 4 */
    assert_int_equal(ch_pool_out_size(7, 2, 2, 0, 0), 3);
    assert_int_equal(ch_pool_out_size(7, 2, 2, 0, 1), 4);
    /* ceil would give 4 whose window starts at 6 >= 5 + 1: dropped */
    assert_int_equal(ch_pool_out_size(5, 2, 2, 1, 1), 3);
    assert_int_equal(ch_pool_out_size(6, 3, 2, 1, 1), 4);
    assert_int_equal(ch_pool_out_size(2, 3, 1, 0, 1), 0);
    assert_int_equal(ch_conv_out_size_dilated(11, 3, 1, 2, 2), 11);
    assert_int_equal(ch_conv_out_size_dilated(4, 3, 1, 0, 3), 0);
    ch_compute_t *cx = new_cx();
    int64_t sx[4] = {1, 6, 5, 5}, sw[4] = {4, 3, 3, 3}, sy[4] = {1, 4, 3, 3};
    ch_tensor_t x, w, y;
    assert_ch_ok(ch_tensor_alloc_f32(&x, 4, sx));
    assert_ch_ok(ch_tensor_alloc_f32(&w, 4, sw));
    assert_ch_ok(ch_tensor_alloc_f32(&y, 4, sy));
    ch_conv2d_params_t ok = {1, 1, 0, 0, 1, 1, 2};
    assert_ch_ok(ch_op_conv2d_forward(cx, &x, &w, NULL, &ok, &y));
    ch_conv2d_params_t bad = {1, 1, 0, 0, 1, 1, 4}; /* 4 does not divide 6 */
    assert_int_equal(ch_op_conv2d_forward(cx, &x, &w, NULL, &bad, &y), CH_ERR_INVALID);
    assert_non_null(strstr(ch_error_message(), "groups 4"));
    ch_conv2d_params_t g3 = {1, 1, 0, 0, 1, 1, 3}; /* 6/3 = 2 per group, weight has 3 */
    assert_int_equal(ch_op_conv2d_forward(cx, &x, &w, NULL, &g3, &y), CH_ERR_INVALID);
    ch_conv2d_params_t dil = {1, 1, 0, 0, 3, 3, 2}; /* dilated 3x3 spans 7 > 5 */
    assert_int_equal(ch_op_conv2d_forward(cx, &x, &w, NULL, &dil, &y), CH_ERR_INVALID);
    ch_error_clear();
    ch_tensor_free(&x);
    ch_tensor_free(&w);
    ch_tensor_free(&y);
    ch_compute_destroy(cx);
}

/* The weight cache (conv.c kept_weights) with a depthwise convolution in
 * nChw16c, whose kernel wants oneDNN's grouped blocked weights (G, O/G,
 * I/G, kh, kw) = Goihw16g: the first forward converts, the second reuses
 * the kept copy with the same result; after ch_tensor_data_changed() the
 * next forward converts again and sees the new weights. */
static void test_grouped_weight_cache(void **state)
{
    (void)state;
    ch_compute_t *cx = new_cx();
    int64_t sx[4] = {2, 16, 9, 9}, sw[4] = {16, 1, 3, 3};
    ch_tensor_t x, xl, w, y1, y2;
    assert_ch_ok(ch_tensor_alloc_f32(&x, 4, sx));
    for (int64_t i = 0; i < ch_tensor_numel(&x); i++) ch_tensor_f32(&x)[i] = sinf(0.1f * i);
    to_layout(cx, &x, CH_LAYOUT_NCHW16C, &xl);
    assert_ch_ok(ch_tensor_alloc_f32(&w, 4, sw));
    for (int64_t i = 0; i < ch_tensor_numel(&w); i++) ch_tensor_f32(&w)[i] = cosf(0.3f * i);
    w.versioned = 1;
    assert_ch_ok(ch_tensor_alloc(&y1, CH_F32, 4, sx, CH_LAYOUT_NCHW16C, CH_DEV_CPU, 0));
    assert_ch_ok(ch_tensor_alloc(&y2, CH_F32, 4, sx, CH_LAYOUT_NCHW16C, CH_DEV_CPU, 0));
    ch_conv2d_params_t p = {1, 1, 1, 1, 1, 1, 16};
    int64_t c0, r0, c1, r1, c2, r2;
    ch_tensor_data_changed();
    ch_compute_weight_conversions(cx, &c0, &r0);
    assert_ch_ok(ch_op_conv2d_forward(cx, &xl, &w, NULL, &p, &y1));
    assert_ch_ok(ch_op_conv2d_forward(cx, &xl, &w, NULL, &p, &y2));
    ch_compute_weight_conversions(cx, &c1, &r1);
    if (c1 - c0 == 0) ch_test_skip("this ISA's depthwise kernel takes plain weights");
    assert_int_equal(c1 - c0, 1);
    assert_int_equal(r1 - r0, 1);
    assert_memory_equal(y1.data, y2.data, y1.nbytes);
    for (int64_t i = 0; i < ch_tensor_numel(&w); i++) ch_tensor_f32(&w)[i] *= 2.0f;
    ch_tensor_data_changed();
    assert_ch_ok(ch_op_conv2d_forward(cx, &xl, &w, NULL, &p, &y2));
    ch_compute_weight_conversions(cx, &c2, &r2);
    assert_int_equal(c2 - c1, 1);
    for (int64_t i = 0; i < ch_tensor_numel(&y1); i++)
        assert_true(ch_tensor_f32(&y2)[i] == 2.0f * ch_tensor_f32(&y1)[i]);
    ch_tensor_t *all[] = {&x, &xl, &w, &y1, &y2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ch_tensor_free(all[i]);
    ch_compute_destroy(cx);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tensor_basics),
        cmocka_unit_test(test_arena),
        cmocka_unit_test(test_reorder_roundtrip),
        cmocka_unit_test(test_shape_errors),
        cmocka_unit_test(test_cache_and_elementwise),
        cmocka_unit_test(test_conv_algorithms),
        cmocka_unit_test(test_bn_gather_stats),
        cmocka_unit_test(test_threads_other_thread),
        cmocka_unit_test(test_empty_batch),
        cmocka_unit_test(test_golden_conv),
        cmocka_unit_test(test_golden_batchnorm),
        cmocka_unit_test(test_golden_syncbn_pieces),
        cmocka_unit_test(test_golden_relu),
        cmocka_unit_test(test_golden_pooling),
        cmocka_unit_test(test_golden_linear),
        cmocka_unit_test(test_golden_cross_entropy),
        cmocka_unit_test(test_golden_conv_variants),
        cmocka_unit_test(test_golden_pool_variants),
        cmocka_unit_test(test_pool_conv_sizes),
        cmocka_unit_test(test_grouped_weight_cache),
    };
    int rc = ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
    golden_free();
    return rc;
}
