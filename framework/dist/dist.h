/* cohort: process groups and collectives (all-reduce, broadcast, all-gather,
 * barrier) over two backends behind one API.
 *
 *   MPI backend  (ch_pg_create_mpi)        host buffers, MPI_Allreduce & co.
 *   NCCL backend (ch_pg_create_nccl[_pmi2]) device buffers, enqueued on a
 *                                           dedicated CUDA stream.
 *
 * The same ch_pg_* calls serve both; the backend is fixed when the group is
 * created, and buffers must live where the backend expects them (host memory
 * for MPI, device memory of the group's GPU for NCCL). Nothing checks where a
 * pointer lives.
 *
 * Counts are numbers of ELEMENTS of the given dtype (not bytes), int64_t so a
 * negative count is caught as an error instead of wrapping. Zero is valid and
 * does nothing but still takes part in the collective's ordering (every rank
 * must make the same sequence of calls with the same counts). Counts above
 * INT_MAX use the MPI-4 large-count entry points (MPI_Allreduce_c, ...).
 *
 * Semantics follow torch.distributed:
 *   - all-reduce ops SUM, MAX, MIN for every dtype; AVG (= SUM then divided by
 *     the world size W, like torch ReduceOp.AVG / NCCL ncclAvg) only for the
 *     floating dtypes: AVG on an integer dtype is rejected with
 *     CH_ERR_INVALID (torch also defines AVG for floating types only; use SUM
 *     and divide yourself if you want integer division).
 *     MPI backend: sum with MPI_SUM, then each element x is replaced by x / W
 *     computed in the dtype's own precision. NCCL backend: ncclAvg.
 *   - in place: pass the same pointer as send and recv (MPI_IN_PLACE is used).
 *   - all-gather: every rank contributes `count` elements; recv holds
 *     W * count elements, rank r's block at recv + r * count (torch
 *     all_gather_into_tensor). In place when send == recv + rank * count.
 *
 * Errors: every function returns ch_status and sets the thread-local message
 * (status.h). Bad arguments (NULL group or buffer with count > 0, negative
 * count, unknown dtype/op, root out of range, AVG on an integer dtype) give
 * CH_ERR_INVALID and touch nothing. A failed MPI call gives CH_ERR_MPI, a
 * failed CUDA/NCCL call CH_ERR_CUDA/CH_ERR_NCCL. After a failed collective
 * the group's state across ranks is undefined: the caller should end the job
 * with ch_fatal() (which aborts NCCL communicators, then MPI_Abort, so no
 * rank hangs), or, for errors outside collectives, use ch_pg_check_all() so
 * every rank learns about it before the next collective.
 *
 * Threads: a group is used by one thread at a time (the caller serialises).
 * Different groups may be used from different threads when MPI was
 * initialised with MPI_THREAD_MULTIPLE.
 */
#ifndef COHORT_DIST_H
#define COHORT_DIST_H

#include "framework/core/status.h"

#include <mpi.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of collective buffers. */
typedef enum {
    CH_DIST_FLOAT32 = 0, /* float,   MPI_FLOAT,   ncclFloat32 */
    CH_DIST_FLOAT64,     /* double,  MPI_DOUBLE,  ncclFloat64 */
    CH_DIST_INT32,       /* int32_t, MPI_INT32_T, ncclInt32 */
    CH_DIST_INT64,       /* int64_t, MPI_INT64_T, ncclInt64 */
    CH_DIST_UINT8,       /* uint8_t, MPI_UINT8_T, ncclUint8 (raw bytes) */
    CH_DIST_DTYPE_COUNT_
} ch_dist_dtype;

/* Reduction operators (torch.distributed.ReduceOp names). */
typedef enum {
    CH_REDUCE_SUM = 0,
    CH_REDUCE_AVG, /* SUM / world size; floating dtypes only */
    CH_REDUCE_MAX,
    CH_REDUCE_MIN,
    CH_REDUCE_OP_COUNT_
} ch_reduce_op;

typedef enum {
    CH_PG_MPI = 0,
    CH_PG_NCCL = 1,
} ch_pg_backend;

typedef struct ch_pg ch_pg_t;     /* a process group */
typedef struct ch_work ch_work_t; /* handle of a non-blocking collective */

/* Size in bytes of one element of dtype (0 for an unknown dtype). */
size_t ch_dist_dtype_size(ch_dist_dtype dtype);
/* "float32", "int64", ... ("?" for an unknown dtype). */
const char *ch_dist_dtype_name(ch_dist_dtype dtype);
/* "sum", "avg", "max", "min" ("?" for an unknown op). */
const char *ch_reduce_op_name(ch_reduce_op op);

/* ------------------------------------------------------------ lifecycle */

/* A process group over the ranks of `comm` (MPI backend, host buffers).
 * The communicator is duplicated (MPI_Comm_dup, so cohort's traffic never
 * matches the caller's messages) and set to MPI_ERRORS_RETURN. MPI must be
 * initialised. Collective over comm. CH_ERR_INVALID for MPI_COMM_NULL or
 * MPI not initialised, CH_ERR_MPI if the duplication fails.
 * The first group of more than one rank also registers a ch_fatal hook that
 * waits COHORT_FATAL_FLUSH_MS milliseconds (default 300, 0..10000) after the
 * "[rank N] fatal:" message and before MPI_Abort: without it MPICH's hydra
 * often tears the job down before forwarding that last message. */
ch_status ch_pg_create_mpi(MPI_Comm comm, ch_pg_t **pg);

/* A process group with an NCCL communicator over the same ranks as mpi_pg
 * (which must be an MPI-backend group; it stays owned by the caller and may
 * be destroyed afterwards). Rank 0 makes the ncclUniqueId and broadcasts it
 * over mpi_pg; every rank selects GPU `device` (0 <= device <
 * ch_device_count), creates a non-blocking communication stream and calls
 * ncclCommInitRank. ncclCommAbort is registered as a ch_fatal hook so a
 * fatal error on this process aborts the communicator before MPI_Abort.
 * Collective over mpi_pg. Errors: CH_ERR_UNSUPPORTED in a build without
 * CUDA/NCCL, CH_ERR_RANGE for a bad device, CH_ERR_CUDA/CH_ERR_NCCL. Peers may
 * be blocked inside ncclCommInitRank when one rank fails, so treat an error
 * here as fatal (ch_check_fatal). */
ch_status ch_pg_create_nccl(ch_pg_t *mpi_pg, int device, ch_pg_t **pg);

/* Same without an MPI world: the unique id travels through Slurm's PMI2 KVS
 * (rank 0 PMI2_KVS_Put of the id in hex, PMI2_KVS_Fence on every rank, the
 * others PMI2_KVS_Get). rank/size are the launcher's (SLURM_PROCID /
 * SLURM_NTASKS); PMI2_Init is called if nobody did (and then PMI2_Finalize at
 * destroy), and its rank/size must agree with the given ones. Collective
 * over the whole PMI2 job. CH_ERR_UNSUPPORTED when built without PMI2 or
 * CUDA; CH_ERR_PMI when a PMI2 call fails. */
ch_status ch_pg_create_nccl_pmi2(int rank, int size, int device, ch_pg_t **pg);

/* Free the group: waits for its outstanding work handles, destroys the NCCL
 * communicator (ncclCommDestroy, after the comm stream drained), frees the
 * duplicated communicator. Collective (MPI_Comm_free). NULL is a no-op. */
void ch_pg_destroy(ch_pg_t *pg);

/* Rank of this process in the group (0..size-1) and the world size W.
 * A NULL group gives -1 and 0. */
int ch_pg_rank(const ch_pg_t *pg);
int ch_pg_size(const ch_pg_t *pg);
ch_pg_backend ch_pg_backend_of(const ch_pg_t *pg);
/* The group's own (duplicated) MPI communicator; MPI_COMM_NULL for an NCCL
 * group bootstrapped through PMI2. Do not free it. */
MPI_Comm ch_pg_mpi_comm(const ch_pg_t *pg);

/* ---------------------------------------------------------- collectives */

/* recv[i] = op over ranks of send[i], i < count, on every rank. send == recv
 * is in place. MPI backend: blocking (returns when recv holds the result).
 * NCCL backend: see "NCCL ordering" below. */
ch_status ch_pg_allreduce(ch_pg_t *pg, const void *send, void *recv,
                          int64_t count, ch_dist_dtype dtype, ch_reduce_op op);

/* buf[0..count) of rank `root` copied to buf on every rank.
 * CH_ERR_INVALID when root is not in 0..size-1. */
ch_status ch_pg_broadcast(ch_pg_t *pg, void *buf, int64_t count,
                          ch_dist_dtype dtype, int root);

/* recv[r*count .. (r+1)*count) = send of rank r, for every r; recv holds
 * size*count elements. In place when send == recv + rank*count elements. */
ch_status ch_pg_allgather(ch_pg_t *pg, const void *send, void *recv,
                          int64_t count, ch_dist_dtype dtype);

/* Returns when every rank has entered it. NCCL backend: over the MPI
 * communicator when there is one, else a 1-element NCCL all-reduce followed
 * by a host wait on the comm stream. */
ch_status ch_pg_barrier(ch_pg_t *pg);

/* Non-blocking all-reduce (what DDP buckets use). Same arguments and checks
 * as ch_pg_allreduce; *work receives a handle to pass to ch_work_wait or
 * ch_work_test. Zero-copy: the buffers are used in place by MPI_Iallreduce /
 * NCCL, so they must stay valid and untouched until the work completes.
 * Handles come from a per-group free list: after the first few calls (as
 * many as are ever outstanding at once) no call allocates memory.
 * Any number may be outstanding and they may be completed in any order, but
 * every rank must START them in the same order (MPI/NCCL collective rule).
 * AVG is finished (division by W) inside wait/test on the MPI backend. */
ch_status ch_pg_iallreduce(ch_pg_t *pg, const void *send, void *recv,
                           int64_t count, ch_dist_dtype dtype, ch_reduce_op op,
                           ch_work_t **work);

/* Non-blocking all-gather (MPI_Iallgather): same arguments, checks and
 * in-place rule as ch_pg_allgather, completed like ch_pg_iallreduce's work
 * (ch_work_wait / ch_work_test; recv is valid after completion). MPI backend
 * only: CH_ERR_INVALID on an NCCL group. */
ch_status ch_pg_iallgather(ch_pg_t *pg, const void *send, void *recv,
                           int64_t count, ch_dist_dtype dtype, ch_work_t **work);

/* Complete *work and return its handle to the group; sets *work = NULL.
 * *work == NULL (already completed) returns CH_OK at once, like
 * MPI_REQUEST_NULL. MPI backend: blocks until recv holds the result.
 * NCCL backend: does NOT block the host; makes the group's compute stream
 * (ch_pg_nccl_set_stream) wait for the collective (cudaStreamWaitEvent on
 * an event recorded on the comm stream after it), like torch's Work.wait()
 * for NCCL, and checks ncclCommGetAsyncError. */
ch_status ch_work_wait(ch_work_t **work);

/* Wait for n handles (NULL entries are skipped); stops at the first error
 * but still releases every handle it waited on. */
ch_status ch_work_waitall(ch_work_t **works, int n);

/* Poll *work without blocking: *done = 1 when it finished (the handle is
 * then released and *work set to NULL, as ch_work_wait would), else 0.
 * NCCL backend: done means the collective finished on the GPU (event
 * query); an asynchronous NCCL error is returned as CH_ERR_NCCL. */
ch_status ch_work_test(ch_work_t **work, int *done);

/* ------------------------------------------------------ backend buffers */

/* Memory where the group's backend wants collective buffers: host memory
 * (64-byte aligned) for MPI, device memory on the group's GPU (cudaMalloc)
 * for NCCL. bytes == 0 gives a valid, freeable pointer. Meant for set-up
 * (benchmarks, tests, staging), not for a hot loop. CH_ERR_NOMEM /
 * CH_ERR_CUDA on failure. */
ch_status ch_pg_buffer_alloc(ch_pg_t *pg, size_t bytes, void **ptr);
void ch_pg_buffer_free(ch_pg_t *pg, void *ptr);

/* Copy bytes between host memory and a group buffer (an address inside one
 * from ch_pg_buffer_alloc, or any memory of the backend's kind). MPI:
 * memcpy. NCCL: cudaMemcpyAsync on the group's compute stream followed by a
 * wait for that stream, so it is ordered after blocking collectives and
 * waited work handles (see "NCCL ordering"). Returns when the copy is done. */
ch_status ch_pg_buffer_write(ch_pg_t *pg, void *dst, const void *host_src, size_t bytes);
ch_status ch_pg_buffer_read(ch_pg_t *pg, void *host_dst, const void *src, size_t bytes);

/* Benchmark reference for the NCCL backend: ncclAllReduce straight onto the
 * comm stream, with none of cohort's checks, stream hand-off or error
 * polling (what a program calling NCCL itself would do). Wait with
 * ch_pg_synchronize. CH_ERR_INVALID on an MPI group (call MPI_Allreduce on
 * ch_pg_mpi_comm or MPI_COMM_WORLD yourself). */
ch_status ch_pg_nccl_allreduce_raw(ch_pg_t *pg, const void *send, void *recv, int64_t count,
                                   ch_dist_dtype dtype, ch_reduce_op op);

/* ------------------------------------------------------ failure agreement */

/* Every rank passes its local status; all-reduces it so that all ranks learn
 * whether some rank failed, before going on to the next collective.
 * Returns CH_OK when every rank passed CH_OK. On a rank whose own status is
 * not CH_OK it returns that status unchanged (the message is kept). On the
 * other ranks it returns CH_ERR_REMOTE with a message naming the lowest
 * failing rank and its status code (and the highest, when several failed).
 * failed_rank (may be NULL) receives the lowest failing rank or -1.
 * Collective (one small all-reduce). */
ch_status ch_pg_check_all(ch_pg_t *pg, ch_status local, int *failed_rank);

/* ------------------------------------------------------- NCCL ordering
 *
 * An NCCL group has its own communication stream (cudaStreamNonBlocking)
 * and a "compute stream" that produces the inputs and consumes the outputs:
 * the compute context's (ch_compute_stream), given with
 * ch_pg_nccl_set_stream before the first collective. Until then every
 * collective is CH_ERR_INVALID naming the group: on the legacy default
 * stream it would be unordered against the ops' non-blocking streams. The
 * buffer helpers (ch_pg_buffer_*) and ch_pg_barrier / ch_pg_check_all work
 * without it. Every collective:
 *   1. makes the comm stream wait for the work already queued on the compute
 *      stream (event recorded on the compute stream),
 *   2. enqueues the NCCL call on the comm stream,
 *   3. blocking calls (allreduce, broadcast, allgather): makes the compute
 *      stream wait for the comm stream, so later kernels on the compute stream
 *      see the result. The HOST does not wait: a blocking call returns as soon
 *      as the work is enqueued. Non-blocking calls (iallreduce) record an
 *      event instead, which ch_work_wait makes the compute stream wait on.
 * Use ch_pg_synchronize to wait on the host (e.g. before copying results
 * with a synchronous cudaMemcpy from another stream, or before exit).
 * On the MPI backend these functions are valid no-ops. */

/* Set the compute stream (a cudaStream_t passed as void *, the compute
 * context's ch_compute_stream) of an NCCL group; NULL (the legacy default
 * stream) is CH_ERR_INVALID. MPI group: ignored, CH_OK. */
ch_status ch_pg_nccl_set_stream(ch_pg_t *pg, void *cuda_stream);

/* The comm stream (cudaStream_t as void *) of an NCCL group; NULL for MPI. */
void *ch_pg_nccl_comm_stream(const ch_pg_t *pg);

/* Make `cuda_stream` (cudaStream_t as void *, NULL = legacy default)
 * wait, on the device, for everything enqueued so far on the comm stream. */
ch_status ch_pg_stream_wait(ch_pg_t *pg, void *cuda_stream);

/* Host wait until the comm stream is idle, polling ncclCommGetAsyncError so
 * that a failure of a peer is reported (CH_ERR_NCCL) instead of hanging;
 * on such an error the communicator is aborted (ncclCommAbort) and the group
 * can only be destroyed. MPI backend: CH_OK at once. */
ch_status ch_pg_synchronize(ch_pg_t *pg);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_DIST_H */
