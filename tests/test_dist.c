/* Tests for framework/dist: every collective, op and dtype against values
 * computed by hand, odd and zero sizes, in place and out of place,
 * non-blocking all-reduce completed out of order, failure agreement, bad
 * arguments, and the NCCL backend where a GPU is visible.
 * Runs alone and as .np2 / .np4; assertions come after the collectives. */
#include "config.h"

#include "tests/harness.h"

#include "framework/tensor/device.h"
#include "framework/dist/dist.h"
#include "framework/dist/dist_internal.h" /* work-pool size, for the no-malloc check */
#include "framework/core/status.h"
#include "framework/ops/ops.h" /* a compute context's stream for the NCCL group */

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const int64_t sizes[] = {0, 1, 7, 1023, 65537};
#define N_SIZES ((int)(sizeof sizes / sizeof sizes[0]))
static const ch_dist_dtype dtypes[] = {CH_DIST_FLOAT32, CH_DIST_FLOAT64, CH_DIST_INT32,
                                       CH_DIST_INT64, CH_DIST_UINT8};
#define N_DTYPES 5

/* Input of rank r at index i: (r + 1) * v(i) * scale(dtype), with v(i) in
 * -6..6 (0..12 for uint8). Every value and every sum is exact in the dtype. */
static int64_t base_v(ch_dist_dtype dt, int64_t i)
{
    return dt == CH_DIST_UINT8 ? i % 13 : i % 13 - 6;
}

static double scale_of(ch_dist_dtype dt)
{
    switch (dt) {
    case CH_DIST_FLOAT32: return 0.25;
    case CH_DIST_FLOAT64: return 0.125;
    case CH_DIST_INT64: return 8589934592.0; /* 2^33: exercises the high word */
    default: return 1.0;
    }
}

static void put(void *buf, ch_dist_dtype dt, int64_t i, double x)
{
    switch (dt) {
    case CH_DIST_FLOAT32: ((float *)buf)[i] = (float)x; break;
    case CH_DIST_FLOAT64: ((double *)buf)[i] = x; break;
    case CH_DIST_INT32: ((int32_t *)buf)[i] = (int32_t)x; break;
    case CH_DIST_INT64: ((int64_t *)buf)[i] = (int64_t)x; break;
    default: ((uint8_t *)buf)[i] = (uint8_t)x; break;
    }
}

static double get(const void *buf, ch_dist_dtype dt, int64_t i)
{
    switch (dt) {
    case CH_DIST_FLOAT32: return ((const float *)buf)[i];
    case CH_DIST_FLOAT64: return ((const double *)buf)[i];
    case CH_DIST_INT32: return ((const int32_t *)buf)[i];
    case CH_DIST_INT64: return (double)((const int64_t *)buf)[i];
    default: return ((const uint8_t *)buf)[i];
    }
}

static double input_of(ch_dist_dtype dt, int rank, int64_t i)
{
    return (double)(rank + 1) * (double)base_v(dt, i) * scale_of(dt);
}

/* Closed forms over ranks r = 0..W-1 of (r + 1) * v * s, s > 0. */
static double expected_reduce(ch_dist_dtype dt, ch_reduce_op op, int w, int64_t i)
{
    double v = (double)base_v(dt, i) * scale_of(dt);
    switch (op) {
    case CH_REDUCE_SUM: return v * w * (w + 1) / 2.0;
    case CH_REDUCE_AVG: return v * (w + 1) / 2.0;
    case CH_REDUCE_MAX: return v >= 0 ? v * w : v;
    default: return v >= 0 ? v : v * w;
    }
}

static ch_pg_t *world_pg(void)
{
    ch_pg_t *pg = NULL;
    assert_ch_ok(ch_pg_create_mpi(MPI_COMM_WORLD, &pg));
    assert_non_null(pg);
    return pg;
}

/* ------------------------------------------------------------------ tests */

static void test_create_and_accessors(void **state)
{
    int rank, size, cmp = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ch_pg_t *pg = world_pg();
    assert_int_equal(ch_pg_rank(pg), rank);
    assert_int_equal(ch_pg_size(pg), size);
    assert_int_equal(ch_pg_backend_of(pg), CH_PG_MPI);
    assert_null(ch_pg_nccl_comm_stream(pg));
    MPI_Comm_compare(ch_pg_mpi_comm(pg), MPI_COMM_WORLD, &cmp);
    assert_int_equal(cmp, MPI_CONGRUENT); /* a duplicate, not the caller's comm */
    ch_pg_destroy(pg);
    ch_pg_destroy(NULL);
    assert_int_equal(ch_pg_rank(NULL), -1);
    assert_int_equal(ch_pg_size(NULL), 0);

    assert_ch_error(ch_pg_create_mpi(MPI_COMM_NULL, &pg), CH_ERR_INVALID, "MPI_COMM_NULL");
    assert_null(pg);
    assert_ch_error(ch_pg_create_mpi(MPI_COMM_WORLD, NULL), CH_ERR_INVALID, "NULL");
    assert_int_equal(ch_dist_dtype_size(CH_DIST_INT64), 8);
    assert_int_equal(ch_dist_dtype_size((ch_dist_dtype)99), 0);
    assert_string_equal(ch_dist_dtype_name(CH_DIST_UINT8), "uint8");
    assert_string_equal(ch_reduce_op_name(CH_REDUCE_AVG), "avg");
}

/* Every op x dtype x size, in place and out of place. */
static void test_allreduce_every_op_dtype_size(void **state)
{
    ch_pg_t *pg = world_pg();
    int rank = ch_pg_rank(pg), w = ch_pg_size(pg);
    const int64_t maxn = 65537;
    void *send = malloc((size_t)maxn * 8), *recv = malloc((size_t)maxn * 8);
    assert_non_null(send);
    assert_non_null(recv);
    long bad = 0, calls = 0;
    char first[512] = "";
    ch_status fail = CH_OK;
    for (int d = 0; d < N_DTYPES; d++) {
        ch_dist_dtype dt = dtypes[d];
        int floating = dt == CH_DIST_FLOAT32 || dt == CH_DIST_FLOAT64;
        for (int op = 0; op < CH_REDUCE_OP_COUNT_; op++) {
            if (op == CH_REDUCE_AVG && !floating) continue;
            for (int si = 0; si < N_SIZES; si++) {
                int64_t n = sizes[si];
                for (int inplace = 0; inplace < 2; inplace++) {
                    for (int64_t i = 0; i < n; i++) {
                        put(send, dt, i, input_of(dt, rank, i));
                        put(recv, dt, i, inplace ? input_of(dt, rank, i) : 77.0);
                    }
                    ch_status s = ch_pg_allreduce(pg, inplace ? recv : send, recv, n, dt,
                                                  (ch_reduce_op)op);
                    calls++;
                    if (s != CH_OK && fail == CH_OK) {
                        fail = s;
                        snprintf(first, sizeof first, "%s", ch_error_message());
                    }
                    for (int64_t i = 0; i < n; i++) {
                        double want = expected_reduce(dt, (ch_reduce_op)op, w, i);
                        double got = get(recv, dt, i);
                        int ok = floating ? fabs(got - want) <= 1e-6 * fabs(want) : got == want;
                        if (!inplace && get(send, dt, i) != input_of(dt, rank, i)) ok = 0;
                        if (!ok && bad++ == 0)
                            snprintf(first, sizeof first,
                                     "%s %s n=%lld %s: [%lld] = %g, want %g",
                                     ch_dist_dtype_name(dt), ch_reduce_op_name(op),
                                     (long long)n, inplace ? "in place" : "out of place",
                                     (long long)i, got, want);
                    }
                }
            }
        }
    }
    free(send);
    free(recv);
    ch_pg_destroy(pg);
    if (fail != CH_OK) fail_msg("all-reduce failed: %s", first);
    if (bad) fail_msg("%ld wrong elements over %ld all-reduces; first: %s", bad, calls, first);
    assert_int_equal(calls, (long)(2 * N_SIZES * (2 * 4 + 3 * 3)));
}

static void test_avg_rejected_for_integers(void **state)
{
    ch_pg_t *pg = world_pg();
    int32_t a[3] = {1, 2, 3};
    int64_t b[3] = {1, 2, 3};
    ch_work_t *work = NULL;
    assert_ch_error(ch_pg_allreduce(pg, a, a, 3, CH_DIST_INT32, CH_REDUCE_AVG),
                    CH_ERR_INVALID, "AVG");
    assert_ch_error(ch_pg_allreduce(pg, b, b, 3, CH_DIST_INT64, CH_REDUCE_AVG),
                    CH_ERR_INVALID, "int64");
    assert_ch_error(ch_pg_iallreduce(pg, a, a, 3, CH_DIST_UINT8, CH_REDUCE_AVG, &work),
                    CH_ERR_INVALID, "uint8");
    assert_null(work);
    /* the buffers are untouched */
    assert_int_equal(a[2], 3);
    assert_int_equal(b[2], 3);
    ch_pg_destroy(pg);
}

static void test_broadcast_from_each_root(void **state)
{
    ch_pg_t *pg = world_pg();
    int rank = ch_pg_rank(pg), w = ch_pg_size(pg);
    void *buf = malloc(65537 * 8);
    assert_non_null(buf);
    long bad = 0;
    char first[256] = "";
    ch_status fail = CH_OK;
    for (int root = w - 1; root >= 0; root--) { /* a non-zero root first */
        for (int d = 0; d < N_DTYPES; d++) {
            ch_dist_dtype dt = dtypes[d];
            for (int si = 0; si < N_SIZES; si++) {
                int64_t n = sizes[si];
                for (int64_t i = 0; i < n; i++)
                    put(buf, dt, i, rank == root ? input_of(dt, root, i) : 99.0);
                ch_status s = ch_pg_broadcast(pg, buf, n, dt, root);
                if (s != CH_OK && fail == CH_OK) {
                    fail = s;
                    snprintf(first, sizeof first, "%s", ch_error_message());
                }
                for (int64_t i = 0; i < n; i++)
                    if (get(buf, dt, i) != input_of(dt, root, i) && bad++ == 0)
                        snprintf(first, sizeof first, "root %d %s n=%lld [%lld] = %g",
                                 root, ch_dist_dtype_name(dt), (long long)n, (long long)i,
                                 get(buf, dt, i));
            }
        }
    }
    free(buf);
    ch_pg_destroy(pg);
    if (fail != CH_OK) fail_msg("broadcast failed: %s", first);
    if (bad) fail_msg("%ld wrong elements; first: %s", bad, first);
}

/* ch_pg_allgather and ch_pg_iallgather (completed by ch_work_wait, or by
 * polling ch_work_test), in place and out of place. */
static void test_allgather(void **state)
{
    ch_pg_t *pg = world_pg();
    int rank = ch_pg_rank(pg), w = ch_pg_size(pg);
    const int64_t ns[] = {0, 1, 7, 1023};
    void *send = malloc(1023 * 8), *recv = malloc((size_t)w * 1023 * 8);
    assert_non_null(send);
    assert_non_null(recv);
    long bad = 0;
    char first[256] = "";
    ch_status fail = CH_OK;
    for (int d = 0; d < N_DTYPES; d++) {
        ch_dist_dtype dt = dtypes[d];
        size_t es = ch_dist_dtype_size(dt);
        for (int k = 0; k < 4; k++) {
            int64_t n = ns[k];
            for (int mode = 0; mode < 6; mode++) {
                /* mode / 2: blocking, iallgather + wait, iallgather + test */
                int inplace = mode % 2, nb = mode / 2;
                for (int64_t i = 0; i < (int64_t)w * n; i++) put(recv, dt, i, 55.0);
                void *own = (char *)recv + (size_t)rank * (size_t)n * es;
                void *src = inplace ? own : send;
                for (int64_t i = 0; i < n; i++) put(src, dt, i, input_of(dt, rank, i));
                ch_status s;
                if (nb == 0) {
                    s = ch_pg_allgather(pg, src, recv, n, dt);
                } else {
                    ch_work_t *work = NULL;
                    s = ch_pg_iallgather(pg, src, recv, n, dt, &work);
                    if (s == CH_OK && nb == 1) s = ch_work_wait(&work);
                    for (int done = 0; s == CH_OK && nb == 2 && !done;)
                        s = ch_work_test(&work, &done);
                    if (s == CH_OK && work) s = CH_ERROR(CH_ERR_INTERNAL, "handle left");
                }
                if (s != CH_OK && fail == CH_OK) {
                    fail = s;
                    snprintf(first, sizeof first, "%s", ch_error_message());
                }
                for (int r = 0; r < w; r++)
                    for (int64_t i = 0; i < n; i++)
                        if (get(recv, dt, (int64_t)r * n + i) != input_of(dt, r, i) &&
                            bad++ == 0)
                            snprintf(first, sizeof first, "%s n=%lld %s %s: block %d [%lld]",
                                     ch_dist_dtype_name(dt), (long long)n,
                                     nb ? "iallgather" : "allgather",
                                     inplace ? "in place" : "out of place", r, (long long)i);
            }
        }
    }
    free(send);
    free(recv);
    ch_pg_destroy(pg);
    if (fail != CH_OK) fail_msg("all-gather failed: %s", first);
    if (bad) fail_msg("%ld wrong elements; first: %s", bad, first);
}

/* Several outstanding non-blocking all-reduces, completed out of order, with
 * wait, test and waitall; then the handle pool must not grow any more. */
static void test_iallreduce_out_of_order(void **state)
{
    ch_pg_t *pg = world_pg();
    int rank = ch_pg_rank(pg), w = ch_pg_size(pg);
    enum { K = 5 };
    const int64_t n[K] = {65537, 1, 0, 1023, 7};
    const ch_reduce_op ops[K] = {CH_REDUCE_SUM, CH_REDUCE_MAX, CH_REDUCE_SUM, CH_REDUCE_AVG,
                                 CH_REDUCE_MIN};
    const ch_dist_dtype dts[K] = {CH_DIST_FLOAT32, CH_DIST_INT64, CH_DIST_INT32,
                                  CH_DIST_FLOAT64, CH_DIST_INT32};
    void *bufs[K];
    for (int k = 0; k < K; k++) {
        bufs[k] = malloc((size_t)(n[k] ? n[k] : 1) * 8);
        assert_non_null(bufs[k]);
    }
    long bad = 0;
    ch_status fail = CH_OK;
    char first[256] = "";
    int pool_after_first = -1;
    for (int round = 0; round < 20; round++) {
        ch_work_t *work[K];
        for (int k = 0; k < K; k++) {
            for (int64_t i = 0; i < n[k]; i++) put(bufs[k], dts[k], i, input_of(dts[k], rank, i));
            ch_status s = ch_pg_iallreduce(pg, bufs[k], bufs[k], n[k], dts[k], ops[k], &work[k]);
            if (s != CH_OK && fail == CH_OK) {
                fail = s;
                snprintf(first, sizeof first, "%s", ch_error_message());
            }
        }
        /* complete: 3 by wait, 1 by a test loop, then the rest with waitall */
        ch_status s = ch_work_wait(&work[3]);
        if (s == CH_OK) s = ch_work_wait(&work[0]);
        int done = 0;
        while (s == CH_OK && !done) s = ch_work_test(&work[4], &done);
        if (s == CH_OK && work[4] != NULL) s = CH_ERROR(CH_ERR_INTERNAL, "test left the handle");
        if (s == CH_OK) s = ch_work_waitall(work, K); /* 1, 2 outstanding; 0,3,4 NULL */
        if (s != CH_OK && fail == CH_OK) {
            fail = s;
            snprintf(first, sizeof first, "%s", ch_error_message());
        }
        for (int k = 0; k < K; k++) {
            if (work[k] != NULL) bad++;
            for (int64_t i = 0; i < n[k]; i++) {
                double want = expected_reduce(dts[k], ops[k], w, i);
                double got = get(bufs[k], dts[k], i);
                if (fabs(got - want) > 1e-6 * fabs(want) && bad++ == 0)
                    snprintf(first, sizeof first, "round %d handle %d [%lld] = %g, want %g",
                             round, k, (long long)i, got, want);
            }
        }
        if (round == 0) pool_after_first = pg->n_works;
    }
    int pool_after_all = pg->n_works;
    /* Waiting on a completed (NULL) handle is a no-op; a stale copy is caught. */
    ch_work_t *none = NULL;
    assert_ch_ok(ch_work_wait(&none));
    ch_work_t *h = NULL, *stale;
    int32_t one = 1;
    assert_ch_ok(ch_pg_iallreduce(pg, &one, &one, 1, CH_DIST_INT32, CH_REDUCE_SUM, &h));
    stale = h;
    assert_ch_ok(ch_work_wait(&h));
    assert_null(h);
    assert_ch_error(ch_work_wait(&stale), CH_ERR_INVALID, "already completed");
    assert_int_equal(one, w);
    for (int k = 0; k < K; k++) free(bufs[k]);
    ch_pg_destroy(pg);
    if (fail != CH_OK) fail_msg("non-blocking all-reduce failed: %s", first);
    if (bad) fail_msg("%ld wrong results; first: %s", bad, first);
    assert_int_equal(pool_after_first, K);
    assert_int_equal(pool_after_all, K); /* no allocation in steady state */
}

/* destroy with handles still outstanding finishes them first */
static void test_destroy_with_outstanding_work(void **state)
{
    ch_pg_t *pg = world_pg();
    float x[1000];
    for (int i = 0; i < 1000; i++) x[i] = 1.0f;
    ch_work_t *h = NULL;
    assert_ch_ok(ch_pg_iallreduce(pg, x, x, 1000, CH_DIST_FLOAT32, CH_REDUCE_SUM, &h));
    ch_pg_destroy(pg);
    assert_true(x[999] == (float)ch_test_world_size());
}

static void test_barrier(void **state)
{
    ch_pg_t *pg = world_pg();
    int rank = ch_pg_rank(pg), w = ch_pg_size(pg);
    if (rank == 0) {
        struct timespec ts = {0, 300 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    double t0 = MPI_Wtime();
    ch_status s = ch_pg_barrier(pg);
    double waited = MPI_Wtime() - t0;
    ch_pg_destroy(pg);
    assert_int_equal(s, CH_OK);
    /* every other rank must have waited for rank 0's sleep */
    if (rank != 0 && w > 1) assert_true(waited > 0.15);
    assert_ch_error(ch_pg_barrier(NULL), CH_ERR_INVALID, "NULL");
}

static void test_bad_arguments(void **state)
{
    ch_pg_t *pg = world_pg();
    float a[4] = {0}, b[4] = {0};
    ch_work_t *work = (ch_work_t *)(void *)a; /* must be reset to NULL */
    int done = 7;
    assert_ch_error(ch_pg_allreduce(NULL, a, b, 4, CH_DIST_FLOAT32, CH_REDUCE_SUM),
                    CH_ERR_INVALID, "process group is NULL");
    assert_ch_error(ch_pg_allreduce(pg, NULL, b, 4, CH_DIST_FLOAT32, CH_REDUCE_SUM),
                    CH_ERR_INVALID, "send buffer is NULL");
    assert_ch_error(ch_pg_allreduce(pg, a, NULL, 4, CH_DIST_FLOAT32, CH_REDUCE_SUM),
                    CH_ERR_INVALID, "recv buffer is NULL");
    assert_ch_error(ch_pg_allreduce(pg, a, b, -1, CH_DIST_FLOAT32, CH_REDUCE_SUM),
                    CH_ERR_INVALID, "count -1 < 0");
    assert_ch_error(ch_pg_allreduce(pg, a, b, 4, (ch_dist_dtype)17, CH_REDUCE_SUM),
                    CH_ERR_INVALID, "unknown dtype 17");
    assert_ch_error(ch_pg_allreduce(pg, a, b, 4, CH_DIST_FLOAT32, (ch_reduce_op)-2),
                    CH_ERR_INVALID, "unknown reduce op -2");
    assert_ch_error(ch_pg_broadcast(pg, a, 4, CH_DIST_FLOAT32, -1), CH_ERR_INVALID,
                    "root -1");
    assert_ch_error(ch_pg_broadcast(pg, a, 4, CH_DIST_FLOAT32, ch_pg_size(pg)),
                    CH_ERR_INVALID, "root");
    assert_ch_error(ch_pg_broadcast(pg, NULL, 4, CH_DIST_FLOAT32, 0), CH_ERR_INVALID, "NULL");
    assert_ch_error(ch_pg_broadcast(pg, a, -5, CH_DIST_FLOAT32, 0), CH_ERR_INVALID, "-5");
    assert_ch_error(ch_pg_allgather(pg, a, NULL, 1, CH_DIST_FLOAT32), CH_ERR_INVALID, "NULL");
    assert_ch_error(ch_pg_allgather(pg, a, b, -3, CH_DIST_INT32), CH_ERR_INVALID, "-3");
    assert_ch_error(ch_pg_allgather(NULL, a, b, 1, CH_DIST_INT32), CH_ERR_INVALID, "NULL");
    assert_ch_error(ch_pg_iallgather(pg, a, b, 1, CH_DIST_INT32, NULL), CH_ERR_INVALID,
                    "work pointer is NULL");
    assert_ch_error(ch_pg_iallgather(pg, a, NULL, 1, CH_DIST_FLOAT32, &work), CH_ERR_INVALID,
                    "NULL");
    assert_null(work);
    work = (ch_work_t *)(void *)a;
    assert_ch_error(ch_pg_iallreduce(pg, a, b, 4, CH_DIST_FLOAT32, CH_REDUCE_SUM, NULL),
                    CH_ERR_INVALID, "work pointer is NULL");
    assert_ch_error(ch_pg_iallreduce(pg, a, b, -4, CH_DIST_FLOAT32, CH_REDUCE_SUM, &work),
                    CH_ERR_INVALID, "count -4");
    assert_null(work);
    assert_ch_error(ch_work_wait(NULL), CH_ERR_INVALID, "NULL");
    assert_ch_error(ch_work_test(&work, NULL), CH_ERR_INVALID, "done is NULL");
    assert_ch_error(ch_work_test(NULL, &done), CH_ERR_INVALID, "NULL");
    assert_ch_error(ch_work_waitall(NULL, 2), CH_ERR_INVALID, "NULL");
    assert_ch_error(ch_pg_check_all(NULL, CH_OK, NULL), CH_ERR_INVALID, "NULL");
    /* NULL buffers with zero count are fine (and still collective) */
    assert_ch_ok(ch_pg_allreduce(pg, NULL, NULL, 0, CH_DIST_FLOAT64, CH_REDUCE_MAX));
    assert_ch_ok(ch_pg_broadcast(pg, NULL, 0, CH_DIST_INT64, 0));
    assert_ch_ok(ch_pg_iallreduce(pg, NULL, NULL, 0, CH_DIST_FLOAT32, CH_REDUCE_AVG, &work));
    assert_ch_ok(ch_work_wait(&work));
    /* ordering helpers are valid no-ops on an MPI group */
    assert_ch_ok(ch_pg_synchronize(pg));
    assert_ch_ok(ch_pg_stream_wait(pg, NULL));
    assert_ch_ok(ch_pg_nccl_set_stream(pg, NULL));
    ch_pg_destroy(pg);
}

/* a group over a sub-communicator reduces over its own ranks only */
static void test_subgroup(void **state)
{
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
    ch_pg_t *pg = NULL;
    ch_status s = ch_pg_create_mpi(half, &pg);
    int64_t v[2] = {rank, 1};
    if (s == CH_OK) s = ch_pg_allreduce(pg, v, v, 2, CH_DIST_INT64, CH_REDUCE_SUM);
    int sub_rank = ch_pg_rank(pg), sub_size = ch_pg_size(pg);
    ch_pg_destroy(pg);
    MPI_Comm_free(&half);
    assert_int_equal(s, CH_OK);
    /* members: world ranks of this parity */
    int64_t want_sum = 0, want_n = 0;
    for (int r = rank % 2; r < size; r += 2) {
        want_sum += r;
        want_n++;
    }
    assert_int_equal(v[0], want_sum);
    assert_int_equal(v[1], want_n);
    assert_int_equal(sub_size, want_n);
    assert_int_equal(sub_rank, rank / 2);
}

/* backend buffers on the MPI backend are host memory */
static void test_buffers_mpi(void **state)
{
    ch_pg_t *pg = world_pg();
    void *buf = NULL, *empty = NULL;
    double in[5] = {1, 2, 3, 4, 5}, out[5] = {0};
    assert_ch_ok(ch_pg_buffer_alloc(pg, sizeof in, &buf));
    assert_true(((uintptr_t)buf & 63) == 0);
    assert_ch_ok(ch_pg_buffer_alloc(pg, 0, &empty));
    assert_non_null(empty);
    assert_ch_ok(ch_pg_buffer_write(pg, buf, in, sizeof in));
    assert_ch_ok(ch_pg_allreduce(pg, buf, buf, 5, CH_DIST_FLOAT64, CH_REDUCE_AVG));
    assert_ch_ok(ch_pg_buffer_read(pg, out, buf, sizeof out));
    assert_true(out[4] == 5.0 && out[0] == 1.0);
    assert_ch_error(ch_pg_buffer_write(pg, NULL, in, 8), CH_ERR_INVALID, "NULL");
    assert_ch_error(ch_pg_buffer_read(pg, out, NULL, 8), CH_ERR_INVALID, "NULL");
    void *other = in;
    assert_ch_error(ch_pg_buffer_alloc(NULL, 8, &other), CH_ERR_INVALID, "NULL");
    assert_null(other);
    assert_ch_error(ch_pg_nccl_allreduce_raw(pg, in, in, 5, CH_DIST_FLOAT64, CH_REDUCE_SUM),
                    CH_ERR_INVALID, "not an NCCL group");
    ch_pg_buffer_free(pg, empty);
    ch_pg_buffer_free(pg, buf);
    ch_pg_destroy(pg);
}

/* ch_pg_check_all: every rank learns about another's failure. */
static void test_check_all(void **state)
{
    ch_pg_t *pg = world_pg();
    int rank = ch_pg_rank(pg), w = ch_pg_size(pg);
    int failed = 99;
    ch_status s_ok = ch_pg_check_all(pg, CH_OK, &failed);
    int failed_ok = failed;

    /* the last rank fails */
    ch_status local = CH_OK;
    if (rank == w - 1) local = CH_ERROR(CH_ERR_IO, "disk full writing /tmp/x.bin");
    else ch_error_clear();
    ch_status s1 = ch_pg_check_all(pg, local, &failed);
    int failed1 = failed;
    char msg1[CH_ERROR_MAX];
    snprintf(msg1, sizeof msg1, "%s", ch_error_message());

    /* ranks 1..w-1 fail (several) */
    local = rank >= 1 ? CH_ERROR(CH_ERR_FORMAT, "bad record on rank %d", rank) : CH_OK;
    ch_status s2 = ch_pg_check_all(pg, local, &failed);
    int failed2 = failed;
    char msg2[CH_ERROR_MAX];
    snprintf(msg2, sizeof msg2, "%s", ch_error_message());
    ch_pg_destroy(pg);

    assert_int_equal(s_ok, CH_OK);
    assert_int_equal(failed_ok, -1);
    assert_int_equal(failed1, w - 1);
    if (rank == w - 1) {
        assert_int_equal(s1, CH_ERR_IO); /* own status and message kept */
        assert_non_null(strstr(msg1, "disk full writing /tmp/x.bin"));
    } else {
        assert_int_equal(s1, CH_ERR_REMOTE);
        char want[64];
        snprintf(want, sizeof want, "rank %d failed: CH_ERR_IO", w - 1);
        if (!strstr(msg1, want)) fail_msg("'%s' lacks '%s'", msg1, want);
        assert_non_null(strstr(msg1, "disk full writing /tmp/x.bin"));
    }
    if (w == 1) {
        assert_int_equal(s2, CH_OK);
        assert_int_equal(failed2, -1);
    } else if (rank == 0) {
        assert_int_equal(s2, CH_ERR_REMOTE);
        assert_int_equal(failed2, 1);
        assert_non_null(strstr(msg2, "bad record on rank 1"));
        if (w > 2) {
            char want[64];
            snprintf(want, sizeof want, "ranks 1 to %d failed", w - 1);
            if (!strstr(msg2, want)) fail_msg("'%s' lacks '%s'", msg2, want);
        }
    } else {
        assert_int_equal(s2, CH_ERR_FORMAT);
        assert_int_equal(failed2, 1);
    }
}

/* NCCL: SKIP without GPUs (after checking that creation fails cleanly and
 * collectively); else 1-rank, or multi-rank over as many ranks as GPUs. */
static void test_nccl(void **state)
{
    int ndev = 0;
    assert_ch_ok(ch_device_count(&ndev));
    ch_pg_t *mpi = world_pg();
    int rank = ch_pg_rank(mpi);
    if (ndev == 0) {
        ch_pg_t *nc = (ch_pg_t *)(void *)&ndev;
        ch_status s = ch_pg_create_nccl(mpi, 0, &nc);
        char msg[CH_ERROR_MAX];
        snprintf(msg, sizeof msg, "%s", ch_error_message());
        ch_pg_t *nc2 = NULL;
        ch_status s2 = ch_pg_create_nccl(NULL, 0, &nc2);
        ch_pg_destroy(mpi);
        assert_null(nc);
        if (ch_device_backend_compiled()) {
            /* every rank fails the same way: no rank waits in ncclCommInitRank */
            assert_int_equal(s, CH_ERR_RANGE);
            assert_non_null(strstr(msg, "GPU 0"));
            assert_int_equal(s2, CH_ERR_INVALID);
        } else {
            assert_int_equal(s, CH_ERR_UNSUPPORTED);
            assert_non_null(strstr(msg, "without CUDA"));
        }
        ch_test_skip("%s: NCCL collectives not run; creation failed cleanly with %s",
                     ch_device_backend_compiled() ? "no GPU visible (ch_device_count() = 0)"
                                                  : "built without CUDA",
                     ch_status_name(s));
    }
    /* ranks 0..ndev-1 each get their own GPU; the others sit this out */
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, rank < ndev ? 0 : MPI_UNDEFINED, rank, &sub);
    long bad = 0;
    ch_status fail = CH_OK;
    char first[CH_ERROR_MAX] = "";
    int w = 0;
    if (sub != MPI_COMM_NULL) {
        enum { N = 1023 };
        const size_t bytes = N * sizeof(float);
        ch_pg_t *sp = NULL, *nc = NULL;
        ch_compute_t *cx = NULL;
        float *host = malloc((size_t)ndev * bytes);
        void *dev = NULL, *gath = NULL;
        ch_status s = host ? ch_pg_create_mpi(sub, &sp) : CH_ERR_NOMEM;
        if (s == CH_OK) s = ch_pg_create_nccl(sp, rank, &nc);
        if (s == CH_OK) {
            w = ch_pg_size(nc);
            assert_int_equal(ch_pg_backend_of(nc), CH_PG_NCCL);
            s = ch_pg_buffer_alloc(nc, bytes, &dev);
        }
        /* without a compute stream a collective is refused (it would be
         * unordered against the ops' non-blocking streams), as is NULL */
        if (s == CH_OK) {
            ch_status r0 = ch_pg_allreduce(nc, dev, dev, N, CH_DIST_FLOAT32, CH_REDUCE_SUM);
            if (r0 != CH_ERR_INVALID || !strstr(ch_error_message(), "compute stream"))
                s = CH_ERROR(CH_ERR_INTERNAL, "all-reduce without a compute stream gave %s: %s",
                             ch_status_name(r0), ch_error_message());
        }
        if (s == CH_OK && ch_pg_nccl_set_stream(nc, NULL) != CH_ERR_INVALID)
            s = CH_ERROR(CH_ERR_INTERNAL, "ch_pg_nccl_set_stream(NULL) was accepted");
        if (s == CH_OK) {
            ch_error_clear();
            ch_compute_options_t co;
            ch_compute_options_default(&co);
            co.gpu_device = rank;
            s = ch_compute_create(&co, &cx);
        }
        if (s == CH_OK) {
            void *stream = ch_compute_stream(cx, CH_DEV_CUDA);
            s = stream ? ch_pg_nccl_set_stream(nc, stream)
                       : CH_ERROR(CH_ERR_CUDA, "no GPU stream for GPU %d", rank);
        }
        if (s == CH_OK) s = ch_pg_buffer_alloc(nc, (size_t)w * bytes, &gath);
        int r = ch_pg_rank(nc);
        /* blocking SUM, in place */
        if (s == CH_OK) {
            for (int i = 0; i < N; i++) host[i] = (float)input_of(CH_DIST_FLOAT32, r, i);
            s = ch_pg_buffer_write(nc, dev, host, bytes);
        }
        if (s == CH_OK) s = ch_pg_allreduce(nc, dev, dev, N, CH_DIST_FLOAT32, CH_REDUCE_SUM);
        if (s == CH_OK) s = ch_pg_buffer_read(nc, host, dev, bytes);
        if (s == CH_OK) {
            for (int i = 0; i < N; i++)
                if (host[i] != (float)expected_reduce(CH_DIST_FLOAT32, CH_REDUCE_SUM, w, i) &&
                    bad++ == 0)
                    snprintf(first, sizeof first, "sum [%d] = %g", i, host[i]);
            for (int i = 0; i < N; i++) host[i] = (float)input_of(CH_DIST_FLOAT32, r, i);
            s = ch_pg_buffer_write(nc, dev, host, bytes);
        }
        /* non-blocking AVG, waited through the compute stream */
        ch_work_t *h = NULL;
        if (s == CH_OK) s = ch_pg_iallreduce(nc, dev, dev, N, CH_DIST_FLOAT32, CH_REDUCE_AVG, &h);
        if (s == CH_OK) s = ch_work_wait(&h);
        if (s == CH_OK) s = ch_pg_buffer_read(nc, host, dev, bytes);
        if (s == CH_OK) {
            for (int i = 0; i < N; i++)
                if (fabsf(host[i] - (float)expected_reduce(CH_DIST_FLOAT32, CH_REDUCE_AVG, w, i)) >
                        1e-6f && bad++ == 0)
                    snprintf(first, sizeof first, "avg [%d] = %g", i, host[i]);
            /* broadcast from the last rank, then all-gather */
            for (int i = 0; i < N; i++) host[i] = (float)(r == w - 1 ? i : -1);
            s = ch_pg_buffer_write(nc, dev, host, bytes);
        }
        if (s == CH_OK) s = ch_pg_broadcast(nc, dev, N, CH_DIST_FLOAT32, w - 1);
        if (s == CH_OK) s = ch_pg_allgather(nc, dev, gath, N, CH_DIST_FLOAT32);
        if (s == CH_OK) s = ch_pg_barrier(nc);
        if (s == CH_OK) s = ch_pg_check_all(nc, CH_OK, NULL);
        if (s == CH_OK) s = ch_pg_synchronize(nc);
        if (s == CH_OK) s = ch_pg_buffer_read(nc, host, gath, (size_t)w * bytes);
        if (s == CH_OK) {
            for (int i = 0; i < w * N; i++)
                if (host[i] != (float)(i % N) && bad++ == 0)
                    snprintf(first, sizeof first, "bcast+allgather [%d] = %g", i, host[i]);
        }
        if (s != CH_OK) {
            fail = s;
            snprintf(first, sizeof first, "%s", ch_error_message());
        }
        ch_pg_buffer_free(nc, dev);
        ch_pg_buffer_free(nc, gath);
        ch_pg_destroy(nc);
        ch_compute_destroy(cx);
        ch_pg_destroy(sp);
        free(host);
        MPI_Comm_free(&sub);
    }
    ch_pg_destroy(mpi);
    if (fail != CH_OK) fail_msg("NCCL on rank %d: %s: %s", rank, ch_status_name(fail), first);
    if (bad) fail_msg("NCCL on rank %d (%d ranks): %ld wrong; first: %s", rank, w, bad, first);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_and_accessors),
        cmocka_unit_test(test_allreduce_every_op_dtype_size),
        cmocka_unit_test(test_avg_rejected_for_integers),
        cmocka_unit_test(test_broadcast_from_each_root),
        cmocka_unit_test(test_allgather),
        cmocka_unit_test(test_iallreduce_out_of_order),
        cmocka_unit_test(test_destroy_with_outstanding_work),
        cmocka_unit_test(test_barrier),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_subgroup),
        cmocka_unit_test(test_buffers_mpi),
        cmocka_unit_test(test_check_all),
        cmocka_unit_test(test_nccl),
    };
    return ch_test_main_mpi(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
