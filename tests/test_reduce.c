/* Tests for framework/reduce: the exact superaccumulator, the reducer on
 * in-memory buffers (numpy semantics) and the chunked pipeline over ranks
 * (same bits for every world size and chunk size), checkpoints. Runs alone
 * and under mpiexec -n 2 / -n 4. */
#include "config.h"

#include "tests/harness.h"

#include "framework/reduce/reduce.h"
#include "framework/reduce/xsum.h"
#include "io/formats/npy.h"

#include <float.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <signal.h>
#include <unistd.h>

static uint64_t bits(double x)
{
    uint64_t u;
    memcpy(&u, &x, 8);
    return u;
}

static double xsum_of(const double *x, int n, ch_xsum_format f)
{
    ch_xsum_t a;
    ch_xsum_init(&a);
    ch_xsum_add_array(&a, x, n, 1);
    return ch_xsum_round(&a, f);
}

/* xorshift64*: deterministic data on every rank */
static uint64_t rng_state = 88172645463325252ULL;
static uint64_t rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ULL;
}
/* doubles over a wide exponent range, both signs */
static double wild(void)
{
    double m = (double)(rnd() >> 11) / 9007199254740992.0;
    int e = (int)(rnd() % 200) - 100;
    return ldexp((rnd() & 1) ? -m : m, e);
}

/* A rows x cols float64 .npy file of wild() values from seed, in a fresh
 * directory under /tmp: *x gets the values (malloc'd), path its name
 * (the directory is dirname(path)). */
static void wild_npy(int rows, int cols, uint64_t seed, char *path, size_t len, double **x)
{
    char dir[] = "/tmp/test_reduce.XXXXXX";
    assert_non_null(mkdtemp(dir));
    snprintf(path, len, "%s/x.npy", dir);
    *x = malloc((size_t)rows * (size_t)cols * sizeof **x);
    rng_state = seed;
    for (int i = 0; i < rows * cols; i++) (*x)[i] = wild();
}

static void test_xsum_exact_cases(void **state)
{
    double a[] = {1e100, 1.0, -1e100};
    assert_true(xsum_of(a, 3, CH_XSUM_F64) == 1.0);
    double tie[] = {1.0, 0x1p-53};               /* exactly halfway: even (1.0) */
    assert_true(xsum_of(tie, 2, CH_XSUM_F64) == 1.0);
    double above[] = {1.0, 0x1p-53, 0x1p-160};  /* just above halfway: up */
    assert_true(xsum_of(above, 3, CH_XSUM_F64) == 1.0 + 0x1p-52);
    double odd[] = {1.0 + 0x1p-52, 0x1p-53};    /* halfway from an odd: up to even */
    assert_true(xsum_of(odd, 2, CH_XSUM_F64) == 1.0 + 0x1p-51);
    double sub[] = {0x1p-1074, 0x1p-1074, 0x1p-1073, -0x1p-1074};
    assert_true(xsum_of(sub, 4, CH_XSUM_F64) == 0x3p-1074);
    double big[] = {DBL_MAX, DBL_MAX, -DBL_MAX};
    assert_true(xsum_of(big, 3, CH_XSUM_F64) == DBL_MAX); /* no intermediate overflow */
    assert_true(xsum_of(big, 2, CH_XSUM_F64) == INFINITY);
    double neg[] = {-DBL_MAX, -DBL_MAX};
    assert_true(xsum_of(neg, 2, CH_XSUM_F64) == -INFINITY);
    double canc[] = {0.1, 0.2, -0.3};  /* the exact sum of the three doubles */
    assert_true(xsum_of(canc, 3, CH_XSUM_F64) == 0x1p-55); /* math.fsum([0.1, 0.2, -0.3]) */
    double inf[] = {1.0, INFINITY, 2.0};
    assert_true(xsum_of(inf, 3, CH_XSUM_F64) == INFINITY);
    double infs[] = {INFINITY, -INFINITY};
    assert_true(isnan(xsum_of(infs, 2, CH_XSUM_F64)));
    double nan[] = {1.0, NAN};
    assert_true(isnan(xsum_of(nan, 2, CH_XSUM_F64)));
    double zero[] = {5.0, -5.0};
    assert_true(bits(xsum_of(zero, 2, CH_XSUM_F64)) == 0);
    /* float32: the stall of numpy/numpy#22956 cannot happen */
    ch_xsum_t acc;
    ch_xsum_init(&acc);
    for (int i = 0; i < 20000000 / 1000; i++) ch_xsum_add(&acc, 1000.0f);
    assert_true(ch_xsum_div_round(&acc, 20000, CH_XSUM_F32) == 1000.0);
    double f32[] = {1.0, 0x1p-24};              /* halfway in float32: even */
    assert_true(xsum_of(f32, 2, CH_XSUM_F32) == 1.0);
    double f32b[] = {1.0, 0x1p-24, 0x1p-60};
    assert_true(xsum_of(f32b, 3, CH_XSUM_F32) == 1.0 + 0x1p-23);
    double f32o[] = {0x1.fffffep127, 0x1p103};  /* halfway to 2^128: overflows */
    assert_true(xsum_of(f32o, 2, CH_XSUM_F32) == INFINITY);
    double f32s[] = {0x1p-150, 0x1p-152};       /* above half of the smallest subnormal */
    assert_true(xsum_of(f32s, 2, CH_XSUM_F32) == 0x1p-149);
    double f16[] = {65504.0, 16.0};             /* 65520: halfway, rounds to inf */
    assert_true(xsum_of(f16, 2, CH_XSUM_F16) == INFINITY);
    double f16b[] = {65504.0, 15.0};
    assert_true(xsum_of(f16b, 2, CH_XSUM_F16) == 65504.0);
    double f16s[] = {0x1p-25, 0x1p-26};         /* 0.75 of 2^-24: rounds up */
    assert_true(xsum_of(f16s, 2, CH_XSUM_F16) == 0x1p-24);
    /* integers */
    ch_xsum_init(&acc);
    ch_xsum_add_i64(&acc, INT64_MIN);
    ch_xsum_add_u64(&acc, UINT64_MAX);
    ch_xsum_add(&acc, 0.5);
    assert_true(ch_xsum_round(&acc, CH_XSUM_F64) == 0x1p63); /* 2^63 - 0.5 rounds to 2^63 */
}

static void test_xsum_division_is_correctly_rounded(void **state)
{
    /* one term: sum / n must equal IEEE division (correctly rounded) */
    for (int i = 0; i < 20000; i++) {
        double x = wild();
        uint64_t n = 1 + rnd() % 1000003;
        ch_xsum_t a;
        ch_xsum_init(&a);
        ch_xsum_add(&a, x);
        double got = ch_xsum_div_round(&a, n, CH_XSUM_F64);
        if (bits(got) != bits(x / (double)n))
            fail_msg("%a / %llu: got %a, IEEE %a", x, (unsigned long long)n, got, x / (double)n);
    }
    /* subnormal quotient */
    ch_xsum_t a;
    ch_xsum_init(&a);
    ch_xsum_add(&a, 0x1p-1070);
    assert_true(ch_xsum_div_round(&a, 3, CH_XSUM_F64) == 0x1p-1070 / 3.0);
    assert_true(isnan(ch_xsum_div_round(&a, 0, CH_XSUM_F64)));
}

static void test_xsum_merge_order_independent(void **state)
{
    enum { N = 5000, PARTS = 7 };
    double *x = malloc(N * sizeof *x);
    for (int i = 0; i < N; i++) x[i] = wild();
    double ref = xsum_of(x, N, CH_XSUM_F64);
    for (int trial = 0; trial < 5; trial++) {
        ch_xsum_t part[PARTS], total;
        for (int p = 0; p < PARTS; p++) ch_xsum_init(&part[p]);
        for (int i = N - 1; i >= 0; i--) ch_xsum_add(&part[rnd() % PARTS], x[i]);
        ch_xsum_init(&total);
        for (int p = PARTS - 1; p >= 0; p--) ch_xsum_merge(&total, &part[(p + trial) % PARTS]);
        assert_true(bits(ch_xsum_round(&total, CH_XSUM_F64)) == bits(ref));
    }
    /* naive summation differs on such data; the exact one does not care */
    free(x);
}

/* ------------------------------------------------------------- reducer */

static ch_array_desc_t desc2(ch_array_dtype dt, int64_t a, int64_t b, int fortran)
{
    ch_array_desc_t d = {dt, 0, fortran, 2, {a, b}};
    return d;
}

/* Reduce buf (desc) with spec in one process, fed in pieces of feed_piece
 * elements (odd pieces cross row boundaries). */
static int64_t feed_piece = 5;
static ch_reducer_t *reduce_buf(const ch_reduce_spec_t *spec, const ch_array_desc_t *d,
                                const void *buf)
{
    ch_reducer_t *r = NULL;
    assert_ch_ok(ch_reducer_create(spec, d, &r));
    int64_t n = ch_array_desc_count(d);
    while (ch_reducer_pass(r) < ch_reducer_passes(r)) {
        for (int64_t e = 0; e < n; e += feed_piece)
            assert_ch_ok(ch_reducer_feed(r, d, 0, e, n - e < feed_piece ? n - e : feed_piece,
                                                                        (const char *)buf + e * (int64_t)ch_array_dtype_size(d->dtype)));
        assert_ch_ok(ch_reducer_end_pass(r, NULL));
    }
    return r;
}

static void test_reducer_axes_and_orders(void **state)
{
    enum { R = 7, C = 5 };
    double c[R * C], f[R * C];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) {
            double v = (double)((i * 31 + j * 17) % 23) - 11.0;
            c[i * C + j] = v;
            f[j * R + i] = v;
        }
    ch_reduce_spec_t sp;
    ch_reduce_spec_default(&sp);
    sp.op = CH_ROP_SUM;
    sp.naxes = 1;
    for (int axis = 0; axis < 2; axis++) {
        sp.axes[0] = axis;
        ch_array_desc_t dc = desc2(CH_DT_FLOAT64, R, C, 0), df = desc2(CH_DT_FLOAT64, R, C, 1);
        ch_reducer_t *rc = reduce_buf(&sp, &dc, c), *rf = reduce_buf(&sp, &df, f);
        ch_array_desc_t oc, of;
        const double *vc, *vf;
        assert_ch_ok(ch_reducer_result(rc, &oc, (const void **)&vc, NULL, NULL));
        assert_ch_ok(ch_reducer_result(rf, &of, (const void **)&vf, NULL, NULL));
        assert_int_equal(oc.ndim, 1);
        assert_int_equal(oc.shape[0], axis == 0 ? C : R);
        for (int k = 0; k < oc.shape[0]; k++) {
            double want = 0;
            for (int m = 0; m < (axis == 0 ? R : C); m++) want += axis == 0 ? c[m * C + k] : c[k * C + m];
            assert_true(vc[k] == want);
            assert_true(bits(vf[k]) == bits(vc[k]));
        }
        ch_reducer_destroy(rc);
        ch_reducer_destroy(rf);
    }
    /* argmax along axis 1 with ties and a NaN; F order gives the same */
    double t[2 * 4] = {1, 3, 3, 0, 2, NAN, 5, NAN};
    double tf[8] = {1, 2, 3, NAN, 3, 5, 0, NAN};
    sp.op = CH_ROP_ARGMAX;
    sp.axes[0] = 1;
    ch_array_desc_t dt = desc2(CH_DT_FLOAT64, 2, 4, 0), dtf = desc2(CH_DT_FLOAT64, 2, 4, 1);
    for (int pass = 0; pass < 2; pass++) {
        ch_reducer_t *r = reduce_buf(&sp, pass ? &dtf : &dt, pass ? tf : t);
        const int64_t *ix;
        assert_ch_ok(ch_reducer_result(r, NULL, (const void **)&ix, NULL, NULL));
        assert_int_equal(ix[0], 1); /* first of the two 3s */
        assert_int_equal(ix[1], 1); /* first NaN */
        ch_reducer_destroy(r);
    }
    /* errors of numpy's kind */
    ch_reducer_t *r = NULL;
    sp.op = CH_ROP_SUM;
    sp.axes[0] = 2;
    assert_ch_error(ch_reducer_create(&sp, &dt, &r), CH_ERR_RANGE,
                    "axis 2 is out of bounds for array of dimension 2");
    sp.axes[0] = -3;
    assert_ch_error(ch_reducer_create(&sp, &dt, &r), CH_ERR_RANGE, "out of bounds");
    ch_array_desc_t empty = desc2(CH_DT_FLOAT64, 0, 3, 0);
    sp.op = CH_ROP_MIN;
    sp.axes[0] = 0;
    assert_ch_error(ch_reducer_create(&sp, &empty, &r), CH_ERR_INVALID, "no identity");
    sp.op = CH_ROP_ARGMIN;
    sp.naxes = 2;
    sp.axes[1] = 1;
    assert_ch_error(ch_reducer_create(&sp, &dt, &r), CH_ERR_INVALID, "one axis");
    assert_ch_ok(ch_reduce_parse_axes("(0, -1)", &sp));
    assert_int_equal(sp.naxes, 2);
    assert_int_equal(sp.axes[1], -1);
    assert_ch_error(ch_reduce_parse_axes("x", &sp), CH_ERR_INVALID, "axis 'x'");
}

static void test_reducer_nan_empty_and_histogram(void **state)
{
    ch_reduce_spec_t sp;
    ch_reduce_spec_default(&sp);
    double x[6] = {1, NAN, 3, NAN, NAN, NAN};
    ch_array_desc_t d = desc2(CH_DT_FLOAT64, 3, 2, 0);
    sp.op = CH_ROP_NANMEAN;
    sp.naxes = 1;
    sp.axes[0] = 0;
    ch_reducer_t *r = reduce_buf(&sp, &d, x);
    const double *v;
    const char *w;
    assert_ch_ok(ch_reducer_result(r, NULL, (const void **)&v, NULL, &w));
    assert_true(v[0] == 2.0 && isnan(v[1]));
    assert_non_null(strstr(w, "Mean of empty slice"));
    ch_reducer_destroy(r);
    /* mean of an empty array: NaN and the warning */
    ch_array_desc_t e = desc2(CH_DT_FLOAT32, 0, 2, 0);
    sp.op = CH_ROP_MEAN;
    r = reduce_buf(&sp, &e, x);
    const float *vf;
    assert_ch_ok(ch_reducer_result(r, NULL, (const void **)&vf, NULL, &w));
    assert_true(isnan(vf[0]) && isnan(vf[1]));
    assert_non_null(strstr(w, "Mean of empty slice"));
    ch_reducer_destroy(r);
    /* histogram: the last bin is closed, values outside the range ignored */
    double h[8] = {0, 0.5, 1, 2, 2.5, 3, 4, -1};
    ch_array_desc_t dh = {CH_DT_FLOAT64, 0, 0, 1, {8}};
    sp.op = CH_ROP_HISTOGRAM;
    sp.naxes = -1;
    sp.bins = 4;
    sp.has_range = 1;
    sp.range[0] = 0;
    sp.range[1] = 3;
    r = reduce_buf(&sp, &dh, h);
    const int64_t *cnt;
    const double *edges;
    assert_ch_ok(ch_reducer_result(r, NULL, (const void **)&cnt, &edges, NULL));
    /* edges 0, .75, 1.5, 2.25, 3 */
    assert_true(edges[1] == 0.75 && edges[4] == 3.0);
    assert_int_equal(cnt[0], 2);
    assert_int_equal(cnt[1], 1);
    assert_int_equal(cnt[2], 1);
    assert_int_equal(cnt[3], 2); /* 2.5 and 3 (closed last bin) */
    ch_reducer_destroy(r);
    /* auto range over data with a NaN: an error at the end of pass 1 */
    sp.has_range = 0;
    assert_ch_ok(ch_reducer_create(&sp, &d, &r));
    assert_ch_ok(ch_reducer_feed(r, &d, 0, 0, 6, x));
    assert_ch_error(ch_reducer_end_pass(r, NULL), CH_ERR_INVALID, "not finite");
    ch_reducer_destroy(r);
}

/* var/std where (x - mean)^2 overflows float64 (issue #23): the exact
 * mode gives the correctly rounded answer, inf when the variance is above
 * DBL_MAX (was NaN: inf - inf of the square and its FMA error), and a
 * finite value where only the squares overflow (numpy and fast mode: inf). */
static void test_var_of_huge_values(void **state)
{
    ch_reduce_spec_t sp;
    ch_reduce_spec_default(&sp);
    const ch_reduce_kind ops[2] = {CH_ROP_VAR, CH_ROP_STD};
    /* 2 x 3, axis 0: columns (1e308, -1e308): var 1e616; (1.7e308, -1.7e308):
     * var 2.89e616; (1, 3): var 1 */
    double x[6] = {1e308, 1.7e308, 1.0, -1e308, -1.7e308, 3.0};
    ch_array_desc_t d = desc2(CH_DT_FLOAT64, 2, 3, 0);
    for (int mode = 0; mode < 2; mode++)
        for (int k = 0; k < 2; k++) {
            sp.op = ops[k];
            sp.mode = mode ? CH_REDUCE_FAST : CH_REDUCE_EXACT;
            sp.naxes = 1;
            sp.axes[0] = 0;
            ch_reducer_t *r = reduce_buf(&sp, &d, x);
            const double *v;
            assert_ch_ok(ch_reducer_result(r, NULL, (const void **)&v, NULL, NULL));
            if (!(v[0] == INFINITY && v[1] == INFINITY && v[2] == 1.0))
                fail_msg("%s %s: %g %g %g, expected inf inf 1", ch_reduce_kind_name(sp.op),
                         mode ? "fast" : "exact", v[0], v[1], v[2]);
            ch_reducer_destroy(r);
        }
    /* x - m itself overflows: (1.7e308, 1.7e308, -1.7e308), m = 5.67e307 */
    double y[3] = {1.7e308, 1.7e308, -1.7e308};
    ch_array_desc_t dy = {CH_DT_FLOAT64, 0, 0, 1, {3}};
    sp.op = CH_ROP_VAR;
    sp.mode = CH_REDUCE_EXACT;
    sp.naxes = -1;
    ch_reducer_t *r = reduce_buf(&sp, &dy, y);
    const double *v;
    assert_ch_ok(ch_reducer_result(r, NULL, (const void **)&v, NULL, NULL));
    assert_true(v[0] == INFINITY);
    ch_reducer_destroy(r);
    /* (2^515, 0 x 1023): mean 2^505 exactly, the squares overflow float64
     * but var = (1023^2 + 1023) 2^1010 / 1024 = 1023 2^1010 exactly */
    enum { N = 1024 };
    double *z = calloc(N, sizeof *z);
    z[0] = 0x1p515;
    ch_array_desc_t dz = {CH_DT_FLOAT64, 0, 0, 1, {N}};
    r = reduce_buf(&sp, &dz, z);
    assert_ch_ok(ch_reducer_result(r, NULL, (const void **)&v, NULL, NULL));
    if (v[0] != ldexp(1023, 1010)) fail_msg("var of (2^515, 0 x 1023): %a, expected %a", v[0], ldexp(1023, 1010));
    ch_reducer_destroy(r);
    sp.op = CH_ROP_STD;
    r = reduce_buf(&sp, &dz, z);
    assert_ch_ok(ch_reducer_result(r, NULL, (const void **)&v, NULL, NULL));
    assert_true(v[0] == sqrt(ldexp(1023, 1010)));
    ch_reducer_destroy(r);
    /* non-finite data stays numpy's: var(inf, 1) is NaN */
    double w[2] = {INFINITY, 1.0};
    ch_array_desc_t dw = {CH_DT_FLOAT64, 0, 0, 1, {2}};
    sp.op = CH_ROP_VAR;
    r = reduce_buf(&sp, &dw, w);
    assert_ch_ok(ch_reducer_result(r, NULL, (const void **)&v, NULL, NULL));
    assert_true(isnan(v[0]));
    ch_reducer_destroy(r);
    free(z);
}

/* ---------------------------------------------------- pipeline over ranks */

typedef struct {
    const unsigned char *data;
    size_t itemsize;
} mem_src_t;

static ch_status mem_read(void *ctx, int seg, int64_t e0, int64_t n, void *dst)
{
    mem_src_t *m = ctx;
    memcpy(dst, m->data + (size_t)e0 * m->itemsize, (size_t)n * m->itemsize);
    return CH_OK;
}

/* Run spec over a float64 R x C array through ch_reduce_run with chunk
 * `chunk` elements on the world; returns the result bits (malloc'd). */
static uint64_t *run_world(const ch_reduce_spec_t *sp, const double *x, int64_t rows, int64_t cols,
                           int64_t chunk, ch_pg_t *pg, int64_t *nres)
{
    ch_array_desc_t d = desc2(CH_DT_FLOAT64, rows, cols, 0);
    mem_src_t m = {(const unsigned char *)x, 8};
    int64_t row0 = 0;
    ch_array_source_t src = {d, 1, &d, &row0, mem_read, &m, NULL, NULL};
    ch_reducer_t *r;
    assert_ch_ok(ch_reducer_create(sp, &d, &r));
    ch_reduce_run_options_t o;
    ch_reduce_run_options_default(&o);
    o.chunk_bytes = chunk * 8;
    int stopped = 0;
    assert_ch_ok(ch_reduce_run(r, &src, pg, &o, &stopped));
    assert_int_equal(stopped, 0);
    ch_array_desc_t od;
    const void *v;
    assert_ch_ok(ch_reducer_result(r, &od, &v, NULL, NULL));
    *nres = ch_array_desc_count(&od);
    uint64_t *out = calloc((size_t)*nres, 8);
    memcpy(out, v, (size_t)*nres * ch_array_dtype_size(od.dtype));
    ch_reducer_destroy(r);
    return out;
}

static void test_pipeline_same_bits_any_world_and_chunk(void **state)
{
    ch_pg_t *pg = NULL;
    int inited = 0;
    MPI_Initialized(&inited);
    if (inited) assert_ch_ok(ch_pg_create_mpi(MPI_COMM_WORLD, &pg));
    enum { R = 101, C = 13 };
    double *x = malloc(R * C * sizeof *x);
    rng_state = 12345;
    for (int i = 0; i < R * C; i++) x[i] = wild();
    const ch_reduce_kind ops[] = {CH_ROP_SUM, CH_ROP_MEAN, CH_ROP_VAR, CH_ROP_ARGMIN};
    for (int k = 0; k < 4; k++)
        for (int axis = -1; axis < 2; axis++) {
            ch_reduce_spec_t sp;
            ch_reduce_spec_default(&sp);
            sp.op = ops[k];
            sp.naxes = axis < 0 ? -1 : 1;
            sp.axes[0] = axis;
            int64_t n1, n2;
            /* the reference: this process alone, one big chunk */
            uint64_t *ref = run_world(&sp, x, R, C, 1 << 20, NULL, &n1);
            const int64_t chunks[] = {3, 64, 1000, 1 << 20};
            for (int c = 0; c < 4; c++) {
                uint64_t *got = run_world(&sp, x, R, C, chunks[c], pg, &n2);
                assert_int_equal(n1, n2);
                for (int64_t i = 0; i < n1; i++)
                    if (got[i] != ref[i])
                        fail_msg("%s axis %d chunk %lld W=%d: element %lld differs (bits %llx vs %llx)",
                                 ch_reduce_kind_name(sp.op), axis, (long long)chunks[c],
                                 pg ? ch_pg_size(pg) : 1, (long long)i, (unsigned long long)got[i],
                                 (unsigned long long)ref[i]);
                free(got);
            }
            free(ref);
        }
    free(x);
    ch_pg_destroy(pg);
}

typedef struct {
    int stop_at;
} stop_hook_t;

static int stop_hook(void *arg, const ch_reduce_step_t *st)
{
    stop_hook_t *h = arg;
    return st->pass == 1 && st->step == h->stop_at;
}

/* A source that sleeps in every read (a slow file system). */
typedef struct {
    mem_src_t m;
    double sleep_s;
} slow_src_t;

static ch_status slow_read(void *ctx, int seg, int64_t e0, int64_t n, void *dst)
{
    slow_src_t *s = ctx;
    struct timespec ts = {0, (long)(s->sleep_s * 1e9)};
    nanosleep(&ts, NULL);
    return mem_read(&s->m, seg, e0, n, dst);
}

typedef struct {
    int calls, always_stop;
    int64_t last_step;
    int last_pass;
} count_hook_t;

static int count_hook(void *arg, const ch_reduce_step_t *st)
{
    count_hook_t *h = arg;
    h->calls++;
    h->last_step = st->step;
    h->last_pass = st->pass;
    return h->always_stop;
}

/* Issue #23: with sync_bytes far beyond the data the hook (the stop and
 * checkpoint decisions) still comes about every sync_seconds; the result
 * is the same bits; a stop after the last step of the last pass is not a
 * stop (the work is done: the result is made). */
static void test_pipeline_timed_agreement_and_final_stop(void **state)
{
    ch_pg_t *pg = NULL;
    int inited = 0;
    MPI_Initialized(&inited);
    if (inited) assert_ch_ok(ch_pg_create_mpi(MPI_COMM_WORLD, &pg));
    enum { R = 120, C = 7 };
    double *x = malloc(R * C * sizeof *x);
    rng_state = 2323;
    for (int i = 0; i < R * C; i++) x[i] = wild();
    ch_reduce_spec_t sp;
    ch_reduce_spec_default(&sp);
    sp.op = CH_ROP_VAR;
    sp.naxes = 1;
    sp.axes[0] = 0;
    int64_t n;
    uint64_t *ref = run_world(&sp, x, R, C, 1 << 20, NULL, &n);
    ch_array_desc_t d = desc2(CH_DT_FLOAT64, R, C, 0);
    slow_src_t ss = {{(const unsigned char *)x, 8}, 0.002};
    int64_t row0 = 0;
    ch_array_source_t src = {d, 1, &d, &row0, slow_read, &ss, NULL, NULL};
    ch_reduce_run_options_t o;
    ch_reduce_run_options_default(&o);
    o.chunk_bytes = 7 * 8;         /* 120 steps per pass (W = 1), 2 ms each */
    o.sync_bytes = 1LL << 40;      /* by bytes: only at the end of a pass */
    o.sync_seconds = 0.02;
    count_hook_t h = {0, 0, 0, 0};
    o.step_hook = count_hook;
    o.arg = &h;
    ch_reducer_t *r;
    assert_ch_ok(ch_reducer_create(&sp, &d, &r));
    int stopped = 0;
    assert_ch_ok(ch_reduce_run(r, &src, pg, &o, &stopped));
    assert_int_equal(stopped, 0);
    /* 2 passes of >= 120 / W steps x 2 ms: more than the 2 end-of-pass calls */
    if (h.calls < 6) fail_msg("hook called %d times in 2 passes with sync_seconds 0.02", h.calls);
    const uint64_t *v;
    assert_ch_ok(ch_reducer_result(r, NULL, (const void **)&v, NULL, NULL));
    for (int64_t i = 0; i < n; i++) assert_true(v[i] == ref[i]);
    ch_reducer_destroy(r);
    /* a hook that always asks to stop: it stops in pass 1 (resumable), and
     * the last call of the last pass is not a stop */
    ss.sleep_s = 0;
    o.sync_seconds = 0;
    h = (count_hook_t){0, 1, 0, 0};
    assert_ch_ok(ch_reducer_create(&sp, &d, &r));
    assert_ch_ok(ch_reduce_run(r, &src, pg, &o, &stopped));
    assert_int_equal(stopped, 1);
    assert_int_equal(h.last_pass, 0);
    assert_int_equal(ch_reducer_pass(r), 0);
    o.start_pass = 0;
    o.start_step = h.last_step + 1;
    h.calls = 0;
    assert_ch_ok(ch_reduce_run(r, &src, pg, &o, &stopped));
    /* resumed at the end of pass 0: pass 1's only call is its last step */
    assert_int_equal(stopped, 0);
    assert_int_equal(h.last_pass, 1);
    assert_ch_ok(ch_reducer_result(r, NULL, (const void **)&v, NULL, NULL));
    for (int64_t i = 0; i < n; i++) assert_true(v[i] == ref[i]);
    ch_reducer_destroy(r);
    free(ref);
    free(x);
    ch_pg_destroy(pg);
}

static void test_state_save_load_same_bits(void **state)
{
    enum { R = 200, C = 9 };
    double *x = malloc(R * C * sizeof *x);
    rng_state = 999;
    for (int i = 0; i < R * C; i++) x[i] = wild();
    ch_reduce_spec_t sp;
    ch_reduce_spec_default(&sp);
    sp.op = CH_ROP_STD;
    sp.naxes = 1;
    sp.axes[0] = 0;
    int64_t n;
    uint64_t *ref = run_world(&sp, x, R, C, 50, NULL, &n);
    ch_array_desc_t d = desc2(CH_DT_FLOAT64, R, C, 0);
    mem_src_t m = {(const unsigned char *)x, 8};
    int64_t row0 = 0;
    ch_array_source_t src = {d, 1, &d, &row0, mem_read, &m, NULL, NULL};
    ch_reducer_t *a, *b;
    assert_ch_ok(ch_reducer_create(&sp, &d, &a));
    ch_reduce_run_options_t o;
    ch_reduce_run_options_default(&o);
    o.chunk_bytes = 50 * 8;
    o.sync_bytes = 0; /* the hook after every step */
    stop_hook_t h = {3};
    o.step_hook = stop_hook;
    o.arg = &h;
    int stopped = 0;
    assert_ch_ok(ch_reduce_run(a, &src, NULL, &o, &stopped));
    assert_int_equal(stopped, 1);
    size_t sz = ch_reducer_state_size(a);
    void *buf = malloc(sz);
    ch_reducer_state_save(a, buf);
    ch_reducer_destroy(a);
    assert_ch_ok(ch_reducer_create(&sp, &d, &b));
    assert_ch_ok(ch_reducer_state_load(b, buf, sz));
    assert_ch_error(ch_reducer_state_load(b, buf, sz - 1), CH_ERR_FORMAT, "bytes");
    o.step_hook = NULL;
    o.start_pass = 1;
    o.start_step = 4;
    assert_ch_ok(ch_reduce_run(b, &src, NULL, &o, &stopped));
    const uint64_t *v;
    assert_ch_ok(ch_reducer_result(b, NULL, (const void **)&v, NULL, NULL));
    for (int64_t i = 0; i < n; i++) assert_true(v[i] == ref[i]);
    /* a state of another reduction is refused */
    ch_reducer_t *c;
    sp.op = CH_ROP_MEAN;
    assert_ch_ok(ch_reducer_create(&sp, &d, &c));
    assert_ch_error(ch_reducer_state_load(c, buf, sz), CH_ERR_FORMAT, "");
    ch_reducer_destroy(c);
    ch_reducer_destroy(b);
    free(buf);
    free(ref);
    free(x);
}

/* Mappings of path in /proc/self/maps (-1: cannot tell). */
static int mappings_of(const char *path)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, path)) n++;
    fclose(f);
    return n;
}

/* A reducer of op over axis 0 of d, and run options for a mapped run with
 * prefetch pieces ahead, chunks of chunk_bytes and the hook (hook, arg)
 * after every step. */
static ch_reducer_t *axis0_mapped_run(ch_reduce_kind op, const ch_array_desc_t *d,
                                      int64_t chunk_bytes, int prefetch,
                                      int (*hook)(void *, const ch_reduce_step_t *), void *arg,
                                      ch_reduce_run_options_t *o)
{
    ch_reduce_spec_t sp;
    ch_reduce_spec_default(&sp);
    sp.op = op;
    sp.naxes = 1;
    sp.axes[0] = 0;
    ch_reducer_t *r;
    assert_ch_ok(ch_reducer_create(&sp, d, &r));
    ch_reduce_run_options_default(o);
    o->chunk_bytes = chunk_bytes;
    o->prefetch = prefetch;
    o->sync_bytes = 0; /* the hook after every step */
    o->step_hook = hook;
    o->arg = arg;
    return r;
}

/* reduce.mmap (issue #23): a .npy file source mapped chunk by chunk gives
 * the bits of the pread path (fast and exact, odd chunk sizes that cut
 * pages and rows), every piece is mapped, and no mapping outlives the run,
 * also when a stop leaves pieces mapped ahead and never fed. */
static void test_pipeline_mmap_same_bits_and_unmapped(void **state)
{
    enum { R = 300, C = 37 };
    char file[64];
    double *x;
    wild_npy(R, C, 2323, file, sizeof file, &x);
    ch_array_desc_t d = desc2(CH_DT_FLOAT64, R, C, 0);
    assert_ch_ok(ch_npy_write(file, &d, x));
    ch_file_source_t *fs;
    const char *paths[1] = {file};
    assert_ch_ok(ch_npy_source_open(paths, 1, &fs));
    const ch_array_source_t *src = ch_file_source_get(fs);
    static const ch_reduce_kind ops[] = {CH_ROP_SUM, CH_ROP_MEAN, CH_ROP_VAR};
    for (int mode = 0; mode < 2; mode++) {
        for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
            for (int chunk = 0; chunk < 2; chunk++) {
                ch_reduce_spec_t sp;
                ch_reduce_spec_default(&sp);
                sp.op = ops[k];
                sp.mode = mode ? CH_REDUCE_FAST : CH_REDUCE_EXACT;
                sp.naxes = 1;
                sp.axes[0] = 0;
                const uint64_t *v[2];
                ch_reducer_t *r[2];
                for (int mm = 0; mm < 2; mm++) {
                    ch_reduce_run_options_t o;
                    ch_reduce_run_options_default(&o);
                    o.chunk_bytes = chunk ? 4099 * 8 : 333 * 8; /* across pages, not whole rows */
                    o.mmap = mm;
                    ch_reduce_step_t tot;
                    o.totals = &tot;
                    int stopped = 0;
                    assert_ch_ok(ch_reducer_create(&sp, &d, &r[mm]));
                    assert_ch_ok(ch_reduce_run(r[mm], src, NULL, &o, &stopped));
                    assert_int_equal(stopped, 0);
                    int64_t per_pass = (R * C + o.chunk_bytes / 8 - 1) / (o.chunk_bytes / 8);
                    assert_int_equal(tot.mapped, mm ? per_pass * ch_reducer_passes(r[mm]) : 0);
                    assert_ch_ok(ch_reducer_result(r[mm], NULL, (const void **)&v[mm], NULL, NULL));
                    assert_int_equal(mappings_of(file), 0);
                }
                assert_memory_equal(v[0], v[1], C * sizeof(double));
                ch_reducer_destroy(r[0]);
                ch_reducer_destroy(r[1]);
            }
        }
    }
    /* a stop with pieces mapped ahead: all unmapped */
    stop_hook_t h = {3};
    ch_reduce_run_options_t o;
    ch_reducer_t *r = axis0_mapped_run(CH_ROP_VAR, &d, 50 * 8, 4, stop_hook, &h, &o);
    int stopped = 0;
    assert_ch_ok(ch_reduce_run(r, src, NULL, &o, &stopped));
    assert_int_equal(stopped, 1);
    assert_int_equal(mappings_of(file), 0);
    ch_reducer_destroy(r);
    ch_file_source_destroy(fs);
    unlink(file);
    *strrchr(file, '/') = 0;
    rmdir(file);
    free(x);
}

/* A hook that cuts the file (truncate to 0 bytes) at a step, after giving
 * the reader thread time to map the next pieces. */
typedef struct {
    const char *path;
    int64_t at;
} cut_hook_t;

static volatile sig_atomic_t user_bus; /* SIGBUSes sent by kill that reached the test's handler */
static void count_user_bus(int sig) { (void)sig; user_bus++; }

static int cut_hook(void *arg, const ch_reduce_step_t *st)
{
    cut_hook_t *h = arg;
    if (st->step == h->at - 1) kill(getpid(), SIGBUS); /* a stray kill -BUS first */
    if (st->step == h->at) {
        usleep(300000);
        assert_int_equal(truncate(h->path, 0), 0);
    }
    return 0;
}

/* A file cut while pieces of it are mapped (reduce.mmap): the feed's load
 * from a lost page raises SIGBUS, which must become one CH_ERR_IO naming
 * the cut, not a dead rank; the pread path reports it as a short read. A
 * SIGBUS sent by kill a step before goes to the handler that was there
 * before the run (the test's, counting), and leaves the guard in place. */
static void test_pipeline_mmap_file_cut(void **state)
{
    struct sigaction counting, before;
    memset(&counting, 0, sizeof counting);
    counting.sa_handler = count_user_bus;
    sigemptyset(&counting.sa_mask);
    assert_int_equal(sigaction(SIGBUS, &counting, &before), 0);
    user_bus = 0;
    enum { R = 512, C = 256 }; /* 1 MiB of float64: 16 pieces of 64 KiB */
    char file[64];
    double *x;
    wild_npy(R, C, 77, file, sizeof file, &x);
    ch_array_desc_t d = desc2(CH_DT_FLOAT64, R, C, 0);
    for (int mm = 1; mm >= 0; mm--) {
        assert_ch_ok(ch_npy_write(file, &d, x));
        ch_file_source_t *fs;
        const char *paths[1] = {file};
        assert_ch_ok(ch_npy_source_open(paths, 1, &fs));
        cut_hook_t h = {file, 2};
        ch_reduce_run_options_t o;
        ch_reducer_t *r = axis0_mapped_run(CH_ROP_SUM, &d, 64 << 10, 4, cut_hook, &h, &o);
        o.sync_seconds = 0;
        o.mmap = mm;
        int stopped = 0;
        ch_status s = ch_reduce_run(r, ch_file_source_get(fs), NULL, &o, &stopped);
        assert_int_equal(s, CH_ERR_IO);
        if (mm) assert_non_null(strstr(ch_error_message(), "x.npy was cut (truncated) while"));
        else assert_non_null(strstr(ch_error_message(), "shrank"));
        assert_int_equal(user_bus, 2 - mm); /* one per run, through the guard or not */
        assert_int_equal(mappings_of(file), 0);
        ch_reducer_destroy(r);
        ch_file_source_destroy(fs);
    }
    unlink(file);
    *strrchr(file, '/') = 0;
    rmdir(file);
    free(x);
    sigaction(SIGBUS, &before, NULL);
}

/* The column-blocked fixed-point window (whole rows over a reduced axis)
 * must give the superaccumulator's bits for every kind of value: in the
 * window, below it, zeros, subnormals, inf, NaN, tiny columns. */
static void test_window_path_matches_plain_adds(void **state)
{
    enum { R = 300, C = 9 };
    double *x = malloc(R * C * sizeof *x);
    rng_state = 4242;
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) {
            double v = 10.0 + (double)(rnd() % 1000) / 997.0 * ((rnd() & 1) ? 1 : -1);
            switch (j) {
            case 1: v = (i % 7) ? v : ldexp(v, -40); break;    /* some far below the window */
            case 2: v = (i % 5) ? v : 0.0; break;              /* zeros */
            case 3: v = ldexp(v, -1070); break;                /* subnormals and tiny normals */
            case 4: v = i == 150 ? INFINITY : v; break;
            case 5: v = i == 3 ? NAN : v; break;
            case 6: v = ldexp(v, 1015); break;                 /* near the top of the range */
            case 7: v = -v; break;
            case 8: v = wild(); break;
            default: break;
            }
            x[i * C + j] = v;
        }
    ch_reduce_spec_t sp;
    ch_reduce_spec_default(&sp);
    sp.naxes = 1;
    sp.axes[0] = 0;
    ch_array_desc_t d = desc2(CH_DT_FLOAT64, R, C, 0);
    ch_reducer_t *r;
    assert_ch_ok(ch_reducer_create(&sp, &d, &r));
    assert_ch_ok(ch_reducer_feed(r, &d, 0, 0, R * C, x)); /* one feed: whole-row tiles */
    assert_ch_ok(ch_reducer_end_pass(r, NULL));
    const double *v;
    assert_ch_ok(ch_reducer_result(r, NULL, (const void **)&v, NULL, NULL));
    for (int j = 0; j < C; j++) {
        ch_xsum_t a;
        ch_xsum_init(&a);
        ch_xsum_add_array(&a, x + j, R, C);
        double want = ch_xsum_round(&a, CH_XSUM_F64);
        if (bits(v[j]) != bits(want) && !(isnan(v[j]) && isnan(want)))
            fail_msg("column %d: window %a, plain %a", j, v[j], want);
    }
    ch_reducer_destroy(r);
    /* var: the C array (window tiles) against its Fortran copy (per-value
     * path: the reduced axis is the contiguous one there) */
    double *xf = malloc(R * C * sizeof *xf);
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) xf[j * R + i] = x[i * C + j];
    ch_array_desc_t df = desc2(CH_DT_FLOAT64, R, C, 1);
    sp.op = CH_ROP_VAR;
    feed_piece = R * C;
    for (int col_mean_zero = 0; col_mean_zero < 2; col_mean_zero++) {
        if (col_mean_zero) /* column 0 symmetric around 0: mean 0, outside any window */
            for (int i = 0; i < R; i++) x[i * C] = xf[i] = (i % 2 ? 1.0 : -1.0) * (1 + i / 2);
        ch_reducer_t *rc = reduce_buf(&sp, &d, x), *rf = reduce_buf(&sp, &df, xf);
        const double *vc, *vf;
        assert_ch_ok(ch_reducer_result(rc, NULL, (const void **)&vc, NULL, NULL));
        assert_ch_ok(ch_reducer_result(rf, NULL, (const void **)&vf, NULL, NULL));
        for (int j = 0; j < C; j++)
            if (bits(vc[j]) != bits(vf[j]) && !(isnan(vc[j]) && isnan(vf[j])))
                fail_msg("var column %d: window %a, per-value %a", j, vc[j], vf[j]);
        ch_reducer_destroy(rc);
        ch_reducer_destroy(rf);
    }
    feed_piece = 5;
    free(xf);
    free(x);
}

/* cohort-train's data.mean/std = auto: per-channel mean and std of an
 * (N, C, H, W) uint8 array over N, H, W, across the ranks. */
static void test_channel_stats(void **state)
{
    ch_pg_t *pg = NULL;
    int inited = 0;
    MPI_Initialized(&inited);
    if (inited) assert_ch_ok(ch_pg_create_mpi(MPI_COMM_WORLD, &pg));
    enum { N = 7, C = 3, H = 4, W = 5 };
    uint8_t *x = malloc(N * C * H * W);
    rng_state = 77;
    for (int i = 0; i < N * C * H * W; i++) x[i] = (uint8_t)(rnd() % 256);
    ch_array_desc_t d = {CH_DT_UINT8, 0, 0, 4, {N, C, H, W}};
    mem_src_t m = {x, 1};
    int64_t row0 = 0;
    ch_array_source_t src = {d, 1, &d, &row0, mem_read, &m, NULL, NULL};
    double mean[C], sd[C];
    assert_ch_ok(ch_reduce_channel_stats(&src, 1, pg, mean, sd));
    for (int c = 0; c < C; c++) {
        long double s = 0, s2 = 0;
        int n = N * H * W;
        for (int i = 0; i < N; i++)
            for (int k = 0; k < H * W; k++) s += x[(i * C + c) * H * W + k];
        long double mu = s / n;
        for (int i = 0; i < N; i++)
            for (int k = 0; k < H * W; k++) {
                long double dv = x[(i * C + c) * H * W + k] - mu;
                s2 += dv * dv;
            }
        assert_true(mean[c] == (double)mu);
        assert_true(fabs(sd[c] - (double)sqrtl(s2 / n)) <= 1e-12 * sd[c]);
    }
    assert_ch_error(ch_reduce_channel_stats(&src, 4, pg, mean, sd), CH_ERR_RANGE, "out of bounds");
    free(x);
    ch_pg_destroy(pg);
}

static void test_half_conversion(void **state)
{
    for (uint32_t h = 0; h < 0x10000; h++) {
        double v = ch_half_to_double((uint16_t)h);
        if (isnan(v)) continue;
        assert_int_equal(ch_double_to_half(v), h);
    }
    assert_true(ch_half_to_double(0x3c00) == 1.0);
    assert_true(ch_half_to_double(0x0001) == 0x1p-24);
    assert_int_equal(ch_double_to_half(1.0 + 0x1p-11), 0x3c00);     /* tie: even */
    assert_int_equal(ch_double_to_half(1.0 + 0x3p-11), 0x3c02);     /* tie: even up */
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xsum_exact_cases),
        cmocka_unit_test(test_xsum_division_is_correctly_rounded),
        cmocka_unit_test(test_xsum_merge_order_independent),
        cmocka_unit_test(test_half_conversion),
        cmocka_unit_test(test_window_path_matches_plain_adds),
        cmocka_unit_test(test_reducer_axes_and_orders),
        cmocka_unit_test(test_reducer_nan_empty_and_histogram),
        cmocka_unit_test(test_pipeline_same_bits_any_world_and_chunk),
        cmocka_unit_test(test_state_save_load_same_bits),
        cmocka_unit_test(test_var_of_huge_values),
        cmocka_unit_test(test_pipeline_timed_agreement_and_final_stop),
        cmocka_unit_test(test_channel_stats),
        cmocka_unit_test(test_pipeline_mmap_same_bits_and_unmapped),
        cmocka_unit_test(test_pipeline_mmap_file_cut),
    };
    return ch_test_main_mpi(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
