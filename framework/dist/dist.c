/* cohort: process groups, MPI backend, argument checks and the work-handle
 * pool shared with the NCCL backend. See dist.h.
 *
 * The blocking MPI collectives are deliberately thin: a few branch checks,
 * then exactly the MPI call a user would write (MPI_IN_PLACE when send ==
 * recv), so the cost over raw MPI is a handful of instructions per call
 * (measured in docs/perf-dist.md with jobs/cohort-bench). */
#include "config.h"

#include "framework/dist/dist.h"
#include "framework/dist/dist_internal.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- tables */

size_t ch_dist_dtype_size(ch_dist_dtype dtype)
{
    switch (dtype) {
    case CH_DIST_FLOAT32: return 4;
    case CH_DIST_FLOAT64: return 8;
    case CH_DIST_INT32: return 4;
    case CH_DIST_INT64: return 8;
    case CH_DIST_UINT8: return 1;
    default: return 0;
    }
}

const char *ch_dist_dtype_name(ch_dist_dtype dtype)
{
    switch (dtype) {
    case CH_DIST_FLOAT32: return "float32";
    case CH_DIST_FLOAT64: return "float64";
    case CH_DIST_INT32: return "int32";
    case CH_DIST_INT64: return "int64";
    case CH_DIST_UINT8: return "uint8";
    default: return "?";
    }
}

const char *ch_reduce_op_name(ch_reduce_op op)
{
    switch (op) {
    case CH_REDUCE_SUM: return "sum";
    case CH_REDUCE_AVG: return "avg";
    case CH_REDUCE_MAX: return "max";
    case CH_REDUCE_MIN: return "min";
    default: return "?";
    }
}

static inline MPI_Datatype mpi_type(ch_dist_dtype dtype)
{
    switch (dtype) {
    case CH_DIST_FLOAT32: return MPI_FLOAT;
    case CH_DIST_FLOAT64: return MPI_DOUBLE;
    case CH_DIST_INT32: return MPI_INT32_T;
    case CH_DIST_INT64: return MPI_INT64_T;
    default: return MPI_UINT8_T;
    }
}

static inline MPI_Op mpi_op(ch_reduce_op op)
{
    switch (op) {
    case CH_REDUCE_MAX: return MPI_MAX;
    case CH_REDUCE_MIN: return MPI_MIN;
    default: return MPI_SUM; /* SUM, and AVG = SUM then divide */
    }
}

static inline int is_floating(ch_dist_dtype dtype)
{
    return dtype == CH_DIST_FLOAT32 || dtype == CH_DIST_FLOAT64;
}

void ch_dist_divide_(void *buf, int64_t count, ch_dist_dtype dtype, int w)
{
    if (dtype == CH_DIST_FLOAT32) {
        float *p = buf;
        const float d = (float)w;
        for (int64_t i = 0; i < count; i++) p[i] /= d;
    } else if (dtype == CH_DIST_FLOAT64) {
        double *p = buf;
        const double d = (double)w;
        for (int64_t i = 0; i < count; i++) p[i] /= d;
    }
}

static ch_status mpi_fail(int rc, const char *call, const ch_pg_t *pg,
                          int64_t count, ch_dist_dtype dtype)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    msg[0] = 0;
    MPI_Error_string(rc, msg, &len);
    return CH_ERROR(CH_ERR_MPI, "%s of %lld %s elements on rank %d of %d failed: %s",
                    call, (long long)count, ch_dist_dtype_name(dtype), pg->rank,
                    pg->size, msg);
}

/* ---------------------------------------------------------- argument checks */

static ch_status check_buffers(const char *fn, const ch_pg_t *pg, const void *send,
                               const void *recv, int64_t count, ch_dist_dtype dtype)
{
    if (!pg) return CH_ERROR(CH_ERR_INVALID, "%s: process group is NULL", fn);
    if ((unsigned)dtype >= (unsigned)CH_DIST_DTYPE_COUNT_)
        return CH_ERROR(CH_ERR_INVALID, "%s: unknown dtype %d (expected 0..%d)", fn,
                        (int)dtype, CH_DIST_DTYPE_COUNT_ - 1);
    if (count < 0)
        return CH_ERROR(CH_ERR_INVALID, "%s: count %lld < 0", fn, (long long)count);
    if (count > 0 && (!send || !recv))
        return CH_ERROR(CH_ERR_INVALID, "%s: %s buffer is NULL with count %lld", fn,
                        !send ? "send" : "recv", (long long)count);
    return CH_OK;
}

static inline ch_status check_reduce(const char *fn, const ch_pg_t *pg, const void *send,
                                     const void *recv, int64_t count,
                                     ch_dist_dtype dtype, ch_reduce_op op)
{
    ch_status s = check_buffers(fn, pg, send, recv, count, dtype);
    if (__builtin_expect(s != CH_OK, 0)) return s;
    if ((unsigned)op >= (unsigned)CH_REDUCE_OP_COUNT_)
        return CH_ERROR(CH_ERR_INVALID, "%s: unknown reduce op %d (expected 0..%d)", fn,
                        (int)op, CH_REDUCE_OP_COUNT_ - 1);
    if (op == CH_REDUCE_AVG && !is_floating(dtype))
        return CH_ERROR(CH_ERR_INVALID,
                        "%s: AVG is defined for float32/float64 only, not %s "
                        "(as torch ReduceOp.AVG); use SUM and divide", fn,
                        ch_dist_dtype_name(dtype));
    return CH_OK;
}

/* ---------------------------------------------------------------- lifecycle */

/* ch_fatal prints "[rank R] fatal: ..." and then MPI_Abort()s. Under MPICH's
 * hydra (and other launchers that forward each rank's stderr through a
 * pipe) the abort tears the job down before the launcher has forwarded what
 * the ranks wrote last, so the message that explains the failure is often
 * lost (measured: 4 of 12 aborted 2-rank runs showed nothing). This hook,
 * registered once by the first multi-rank group and run by ch_fatal after
 * the message and after any later-registered hooks (ncclCommAbort), gives
 * the launcher COHORT_FATAL_FLUSH_MS milliseconds (default 300) to forward
 * it. */
static void fatal_flush_hook(void *arg)
{
    (void)arg;
    long ms = 300;
    const char *e = getenv("COHORT_FATAL_FLUSH_MS");
    if (e && *e) {
        char *end = NULL;
        long v = strtol(e, &end, 10);
        if (end && !*end && v >= 0 && v <= 10000) ms = v;
    }
    fflush(stdout);
    fflush(stderr);
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static void register_fatal_flush(void)
{
    static int registered; /* creation is not thread-safe anyway (collective) */
    if (registered) return;
    if (ch_fatal_hook_add(fatal_flush_hook, NULL) == CH_OK)
        registered = 1;
    else
        ch_error_clear(); /* hooks full: only the flush delay is lost */
}

ch_status ch_pg_create_mpi(MPI_Comm comm, ch_pg_t **out)
{
    int inited = 0, finalized = 0;
    CH_REQUIRE(out, "ch_pg_create_mpi: output pointer is NULL");
    *out = NULL;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized)
        return CH_ERROR(CH_ERR_INVALID, "ch_pg_create_mpi: MPI is %s",
                        finalized ? "already finalized" : "not initialised (call MPI_Init first)");
    CH_REQUIRE(comm != MPI_COMM_NULL, "ch_pg_create_mpi: communicator is MPI_COMM_NULL");
    ch_pg_t *pg = calloc(1, sizeof *pg);
    if (!pg) return CH_ERROR(CH_ERR_NOMEM, "ch_pg_create_mpi: no memory for the group");
    pg->backend = CH_PG_MPI;
    pg->comm = MPI_COMM_NULL;
    int rc = MPI_Comm_dup(comm, &pg->comm);
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        msg[0] = 0;
        MPI_Error_string(rc, msg, &len);
        free(pg);
        return CH_ERROR(CH_ERR_MPI, "ch_pg_create_mpi: MPI_Comm_dup failed: %s", msg);
    }
    MPI_Comm_set_errhandler(pg->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(pg->comm, &pg->rank);
    MPI_Comm_size(pg->comm, &pg->size);
    if (pg->size > 1) register_fatal_flush();
    *out = pg;
    return CH_OK;
}

int ch_pg_rank(const ch_pg_t *pg) { return pg ? pg->rank : -1; }
int ch_pg_size(const ch_pg_t *pg) { return pg ? pg->size : 0; }
ch_pg_backend ch_pg_backend_of(const ch_pg_t *pg) { return pg ? pg->backend : CH_PG_MPI; }
MPI_Comm ch_pg_mpi_comm(const ch_pg_t *pg) { return pg ? pg->comm : MPI_COMM_NULL; }

void ch_pg_destroy(ch_pg_t *pg)
{
    if (!pg) return;
    /* Outstanding handles: finish them so MPI/NCCL no longer touch buffers. */
    for (ch_work_t *w = pg->all_works; w; w = w->next_all) {
        if (!w->active) continue;
        if (pg->backend == CH_PG_MPI) MPI_Wait(&w->req, MPI_STATUS_IGNORE);
        w->active = 0;
    }
    if (pg->backend == CH_PG_NCCL) ch_nccl_destroy_(pg); /* drains the stream */
    ch_work_t *w = pg->all_works;
    while (w) {
        ch_work_t *next = w->next_all;
        if (pg->backend == CH_PG_NCCL) ch_nccl_work_free_(w);
        free(w);
        w = next;
    }
    if (pg->comm != MPI_COMM_NULL) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Comm_free(&pg->comm);
    }
    free(pg);
}

/* ---------------------------------------------------------------- work pool */

ch_status ch_pg_work_get_(ch_pg_t *pg, ch_work_t **out)
{
    ch_work_t *w = pg->free_works;
    if (w) {
        pg->free_works = w->next_free;
    } else {
        w = calloc(1, sizeof *w);
        if (!w)
            return CH_ERROR(CH_ERR_NOMEM, "no memory for work handle %d", pg->n_works + 1);
        w->pg = pg;
        w->req = MPI_REQUEST_NULL;
        if (pg->backend == CH_PG_NCCL) {
            ch_status s = ch_nccl_work_init_(w);
            if (s != CH_OK) {
                free(w);
                return s;
            }
        }
        w->next_all = pg->all_works;
        pg->all_works = w;
        pg->n_works++;
    }
    w->next_free = NULL;
    w->active = 1;
    w->avg_buf = NULL;
    *out = w;
    return CH_OK;
}

void ch_pg_work_put_(ch_work_t *w)
{
    w->active = 0;
    w->avg_buf = NULL;
    w->next_free = w->pg->free_works;
    w->pg->free_works = w;
}

/* -------------------------------------------------------------- collectives */

ch_status ch_pg_allreduce(ch_pg_t *pg, const void *send, void *recv, int64_t count,
                          ch_dist_dtype dtype, ch_reduce_op op)
{
    ch_status s = check_reduce("ch_pg_allreduce", pg, send, recv, count, dtype, op);
    if (__builtin_expect(s != CH_OK, 0)) return s;
    if (pg->backend == CH_PG_NCCL)
        return ch_nccl_allreduce_(pg, send, recv, count, dtype, op, NULL);
    const void *sb = send == recv ? MPI_IN_PLACE : send;
    int rc;
    if (__builtin_expect(count <= INT_MAX, 1))
        rc = MPI_Allreduce(sb, recv, (int)count, mpi_type(dtype), mpi_op(op), pg->comm);
    else
        rc = MPI_Allreduce_c(sb, recv, (MPI_Count)count, mpi_type(dtype), mpi_op(op),
                             pg->comm);
    if (__builtin_expect(rc != MPI_SUCCESS, 0))
        return mpi_fail(rc, "MPI_Allreduce", pg, count, dtype);
    if (op == CH_REDUCE_AVG) ch_dist_divide_(recv, count, dtype, pg->size);
    return CH_OK;
}

ch_status ch_pg_broadcast(ch_pg_t *pg, void *buf, int64_t count, ch_dist_dtype dtype,
                          int root)
{
    CH_TRY(check_buffers("ch_pg_broadcast", pg, buf, buf, count, dtype));
    if (root < 0 || root >= pg->size)
        return CH_ERROR(CH_ERR_INVALID, "ch_pg_broadcast: root %d outside 0..%d", root,
                        pg->size - 1);
    if (pg->backend == CH_PG_NCCL) return ch_nccl_broadcast_(pg, buf, count, dtype, root);
    int rc;
    if (count <= INT_MAX)
        rc = MPI_Bcast(buf, (int)count, mpi_type(dtype), root, pg->comm);
    else
        rc = MPI_Bcast_c(buf, (MPI_Count)count, mpi_type(dtype), root, pg->comm);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Bcast", pg, count, dtype);
    return CH_OK;
}

ch_status ch_pg_allgather(ch_pg_t *pg, const void *send, void *recv, int64_t count,
                          ch_dist_dtype dtype)
{
    CH_TRY(check_buffers("ch_pg_allgather", pg, send, recv, count, dtype));
    if (count > 0 && count > INT64_MAX / pg->size)
        return CH_ERROR(CH_ERR_INVALID, "ch_pg_allgather: %lld elements x %d ranks overflows",
                        (long long)count, pg->size);
    if (pg->backend == CH_PG_NCCL) return ch_nccl_allgather_(pg, send, recv, count, dtype);
    const char *own = (const char *)recv + (size_t)pg->rank * (size_t)count *
                                               ch_dist_dtype_size(dtype);
    const void *sb = (count > 0 && send == (const void *)own) ? MPI_IN_PLACE : send;
    int rc;
    if (count <= INT_MAX)
        rc = MPI_Allgather(sb, (int)count, mpi_type(dtype), recv, (int)count,
                           mpi_type(dtype), pg->comm);
    else
        rc = MPI_Allgather_c(sb, (MPI_Count)count, mpi_type(dtype), recv,
                             (MPI_Count)count, mpi_type(dtype), pg->comm);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Allgather", pg, count, dtype);
    return CH_OK;
}

ch_status ch_pg_barrier(ch_pg_t *pg)
{
    CH_REQUIRE(pg, "ch_pg_barrier: process group is NULL");
    if (pg->comm == MPI_COMM_NULL) {
        int64_t v = 0;
        return ch_nccl_allreduce_host_i64_(pg, &v, 1);
    }
    int rc = MPI_Barrier(pg->comm);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Barrier", pg, 0, CH_DIST_UINT8);
    return CH_OK;
}

ch_status ch_pg_iallreduce(ch_pg_t *pg, const void *send, void *recv, int64_t count,
                           ch_dist_dtype dtype, ch_reduce_op op, ch_work_t **work)
{
    if (!work) return CH_ERROR(CH_ERR_INVALID, "ch_pg_iallreduce: work pointer is NULL");
    *work = NULL;
    ch_status s = check_reduce("ch_pg_iallreduce", pg, send, recv, count, dtype, op);
    if (__builtin_expect(s != CH_OK, 0)) return s;
    ch_work_t *w;
    CH_TRY(ch_pg_work_get_(pg, &w));
    if (pg->backend == CH_PG_NCCL) {
        s = ch_nccl_allreduce_(pg, send, recv, count, dtype, op, w);
        if (s != CH_OK) {
            ch_pg_work_put_(w);
            return s;
        }
        *work = w;
        return CH_OK;
    }
    const void *sb = send == recv ? MPI_IN_PLACE : send;
    int rc;
    if (count <= INT_MAX)
        rc = MPI_Iallreduce(sb, recv, (int)count, mpi_type(dtype), mpi_op(op), pg->comm,
                            &w->req);
    else
        rc = MPI_Iallreduce_c(sb, recv, (MPI_Count)count, mpi_type(dtype), mpi_op(op),
                              pg->comm, &w->req);
    if (rc != MPI_SUCCESS) {
        ch_pg_work_put_(w);
        return mpi_fail(rc, "MPI_Iallreduce", pg, count, dtype);
    }
    if (op == CH_REDUCE_AVG) {
        w->avg_buf = recv;
        w->avg_count = count;
        w->dtype = dtype;
    }
    *work = w;
    return CH_OK;
}

ch_status ch_pg_iallgather(ch_pg_t *pg, const void *send, void *recv, int64_t count,
                           ch_dist_dtype dtype, ch_work_t **work)
{
    if (!work) return CH_ERROR(CH_ERR_INVALID, "ch_pg_iallgather: work pointer is NULL");
    *work = NULL;
    CH_TRY(check_buffers("ch_pg_iallgather", pg, send, recv, count, dtype));
    if (pg->backend == CH_PG_NCCL)
        return CH_ERROR(CH_ERR_INVALID, "ch_pg_iallgather: not available on an NCCL group "
                        "(use ch_pg_allgather)");
    if (count > 0 && count > INT64_MAX / pg->size)
        return CH_ERROR(CH_ERR_INVALID, "ch_pg_iallgather: %lld elements x %d ranks overflows",
                        (long long)count, pg->size);
    ch_work_t *w;
    CH_TRY(ch_pg_work_get_(pg, &w));
    const char *own = (const char *)recv + (size_t)pg->rank * (size_t)count *
                                               ch_dist_dtype_size(dtype);
    const void *sb = (count > 0 && send == (const void *)own) ? MPI_IN_PLACE : send;
    int rc;
    if (count <= INT_MAX)
        rc = MPI_Iallgather(sb, (int)count, mpi_type(dtype), recv, (int)count, mpi_type(dtype),
                            pg->comm, &w->req);
    else
        rc = MPI_Iallgather_c(sb, (MPI_Count)count, mpi_type(dtype), recv, (MPI_Count)count,
                              mpi_type(dtype), pg->comm, &w->req);
    if (rc != MPI_SUCCESS) {
        ch_pg_work_put_(w);
        return mpi_fail(rc, "MPI_Iallgather", pg, count, dtype);
    }
    *work = w;
    return CH_OK;
}

static ch_status check_work(const char *fn, ch_work_t **work)
{
    if (!work) return CH_ERROR(CH_ERR_INVALID, "%s: work pointer is NULL", fn);
    if (*work && !(*work)->active)
        return CH_ERROR(CH_ERR_INVALID,
                        "%s: work handle %p was already completed (a stale copy?)", fn,
                        (void *)*work);
    return CH_OK;
}

ch_status ch_work_wait(ch_work_t **work)
{
    CH_TRY(check_work("ch_work_wait", work));
    ch_work_t *w = *work;
    if (!w) return CH_OK;
    *work = NULL;
    ch_pg_t *pg = w->pg;
    ch_status s = CH_OK;
    if (pg->backend == CH_PG_NCCL) {
        s = ch_nccl_work_wait_(w);
    } else {
        int rc = MPI_Wait(&w->req, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            s = mpi_fail(rc, "MPI_Wait (all-reduce)", pg, w->avg_count, w->dtype);
        else if (w->avg_buf)
            ch_dist_divide_(w->avg_buf, w->avg_count, w->dtype, pg->size);
    }
    ch_pg_work_put_(w);
    return s;
}

ch_status ch_work_waitall(ch_work_t **works, int n)
{
    CH_REQUIRE(works || n == 0, "ch_work_waitall: works is NULL with n = %d", n);
    CH_REQUIRE(n >= 0, "ch_work_waitall: n = %d < 0", n);
    for (int i = 0; i < n; i++) CH_TRY(ch_work_wait(&works[i]));
    return CH_OK;
}

ch_status ch_work_test(ch_work_t **work, int *done)
{
    CH_REQUIRE(done, "ch_work_test: done is NULL");
    *done = 0;
    CH_TRY(check_work("ch_work_test", work));
    ch_work_t *w = *work;
    if (!w) {
        *done = 1;
        return CH_OK;
    }
    ch_pg_t *pg = w->pg;
    ch_status s = CH_OK;
    int flag = 0;
    if (pg->backend == CH_PG_NCCL) {
        s = ch_nccl_work_test_(w, &flag);
    } else {
        int rc = MPI_Test(&w->req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            s = mpi_fail(rc, "MPI_Test (all-reduce)", pg, w->avg_count, w->dtype);
            flag = 1; /* the request is gone either way */
        } else if (flag && w->avg_buf) {
            ch_dist_divide_(w->avg_buf, w->avg_count, w->dtype, pg->size);
        }
    }
    if (flag) {
        *work = NULL;
        *done = 1;
        ch_pg_work_put_(w);
    }
    return s;
}

/* ----------------------------------------------------------- backend buffers */

ch_status ch_pg_buffer_alloc(ch_pg_t *pg, size_t bytes, void **ptr)
{
    CH_REQUIRE(ptr, "ch_pg_buffer_alloc: ptr is NULL");
    *ptr = NULL;
    CH_REQUIRE(pg, "ch_pg_buffer_alloc: process group is NULL");
    if (pg->backend == CH_PG_NCCL) return ch_nccl_buffer_alloc_(pg, bytes, ptr);
    if (bytes > SIZE_MAX - 64)
        return CH_ERROR(CH_ERR_NOMEM, "ch_pg_buffer_alloc: %zu bytes is too large", bytes);
    size_t rounded = bytes ? (bytes + 63) / 64 * 64 : 64;
    *ptr = aligned_alloc(64, rounded);
    if (!*ptr)
        return CH_ERROR(CH_ERR_NOMEM, "ch_pg_buffer_alloc: cannot allocate %zu bytes of host "
                        "memory on rank %d", bytes, pg->rank);
    return CH_OK;
}

void ch_pg_buffer_free(ch_pg_t *pg, void *ptr)
{
    if (!pg || !ptr) return;
    if (pg->backend == CH_PG_NCCL) ch_nccl_buffer_free_(pg, ptr);
    else free(ptr);
}

ch_status ch_pg_buffer_write(ch_pg_t *pg, void *dst, const void *host_src, size_t bytes)
{
    CH_REQUIRE(pg, "ch_pg_buffer_write: process group is NULL");
    CH_REQUIRE(bytes == 0 || (dst && host_src), "ch_pg_buffer_write: NULL %s with %zu bytes",
               dst ? "source" : "destination", bytes);
    if (!bytes) return CH_OK;
    if (pg->backend == CH_PG_NCCL) return ch_nccl_buffer_copy_(pg, dst, host_src, bytes, 1);
    memcpy(dst, host_src, bytes);
    return CH_OK;
}

ch_status ch_pg_buffer_read(ch_pg_t *pg, void *host_dst, const void *src, size_t bytes)
{
    CH_REQUIRE(pg, "ch_pg_buffer_read: process group is NULL");
    CH_REQUIRE(bytes == 0 || (host_dst && src), "ch_pg_buffer_read: NULL %s with %zu bytes",
               src ? "destination" : "source", bytes);
    if (!bytes) return CH_OK;
    if (pg->backend == CH_PG_NCCL) return ch_nccl_buffer_copy_(pg, host_dst, src, bytes, 0);
    memcpy(host_dst, src, bytes);
    return CH_OK;
}

ch_status ch_pg_nccl_allreduce_raw(ch_pg_t *pg, const void *send, void *recv, int64_t count,
                                   ch_dist_dtype dtype, ch_reduce_op op)
{
    CH_TRY(check_reduce("ch_pg_nccl_allreduce_raw", pg, send, recv, count, dtype, op));
    if (pg->backend != CH_PG_NCCL)
        return CH_ERROR(CH_ERR_INVALID, "ch_pg_nccl_allreduce_raw: not an NCCL group (use "
                        "MPI_Allreduce on ch_pg_mpi_comm for the MPI reference)");
    return ch_nccl_allreduce_raw_(pg, send, recv, count, dtype, op);
}

/* ---------------------------------------------------------- failure agreement */

ch_status ch_pg_check_all(ch_pg_t *pg, ch_status local, int *failed_rank)
{
    if (failed_rank) *failed_rank = -1;
    CH_REQUIRE(pg, "ch_pg_check_all: process group is NULL");
    /* v[0]: (rank << 32 | code) of a failing rank, MIN -> the lowest one.
     * v[1]: -rank of a failing rank, MIN -> minus the highest one. */
    int64_t v[2] = {INT64_MAX, INT64_MAX};
    if (local != CH_OK) {
        v[0] = ((int64_t)pg->rank << 32) | (int64_t)(uint32_t)local;
        v[1] = -(int64_t)pg->rank;
    }
    char saved[CH_ERROR_MAX];
    saved[0] = 0;
    if (local != CH_OK) snprintf(saved, sizeof saved, "%s", ch_error_message());
    if (pg->comm != MPI_COMM_NULL) {
        int rc = MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_INT64_T, MPI_MIN, pg->comm);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "ch_pg_check_all: MPI_Allreduce", pg, 2, CH_DIST_INT64);
    } else {
        CH_TRY(ch_nccl_allreduce_host_i64_(pg, v, 2));
    }
    if (v[0] == INT64_MAX) return CH_OK;
    int lo = (int)(v[0] >> 32);
    ch_status code = (ch_status)(uint32_t)(v[0] & 0xffffffff);
    int hi = (int)-v[1];
    if (failed_rank) *failed_rank = lo;
    /* The lowest failing rank tells the others its message. */
    char msg[512];
    msg[0] = 0;
    if (pg->comm != MPI_COMM_NULL) {
        if (pg->rank == lo) snprintf(msg, sizeof msg, "%s", saved);
        int rc = MPI_Bcast(msg, (int)sizeof msg, MPI_CHAR, lo, pg->comm);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "ch_pg_check_all: MPI_Bcast", pg, 512, CH_DIST_UINT8);
        msg[sizeof msg - 1] = 0;
    }
    if (local != CH_OK) return ch_error_adopt(local, saved);
    if (hi != lo)
        return CH_ERROR(CH_ERR_REMOTE, "ranks %d to %d failed (some of them); rank %d: %s: %s",
                        lo, hi, lo, ch_status_name(code), msg[0] ? msg : "(no message)");
    return CH_ERROR(CH_ERR_REMOTE, "rank %d failed: %s: %s", lo, ch_status_name(code),
                    msg[0] ? msg : "(no message)");
}

/* ------------------------------------------------------------- NCCL ordering */

ch_status ch_pg_nccl_set_stream(ch_pg_t *pg, void *cuda_stream)
{
    CH_REQUIRE(pg, "ch_pg_nccl_set_stream: process group is NULL");
    if (pg->backend != CH_PG_NCCL) return CH_OK;
    return ch_nccl_set_stream_(pg, cuda_stream);
}

void *ch_pg_nccl_comm_stream(const ch_pg_t *pg)
{
    if (!pg || pg->backend != CH_PG_NCCL) return NULL;
    return ch_nccl_comm_stream_(pg);
}

ch_status ch_pg_stream_wait(ch_pg_t *pg, void *cuda_stream)
{
    CH_REQUIRE(pg, "ch_pg_stream_wait: process group is NULL");
    if (pg->backend != CH_PG_NCCL) return CH_OK;
    return ch_nccl_stream_wait_(pg, cuda_stream);
}

ch_status ch_pg_synchronize(ch_pg_t *pg)
{
    CH_REQUIRE(pg, "ch_pg_synchronize: process group is NULL");
    if (pg->backend != CH_PG_NCCL) return CH_OK;
    return ch_nccl_synchronize_(pg);
}
