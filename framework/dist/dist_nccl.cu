/* cohort: the NCCL process-group backend (device buffers). See dist.h,
 * "NCCL ordering", for the stream rules. Compiled only when configure found
 * CUDA + NCCL (framework/dist/dist.am); framework/dist/dist_nccl_nocuda.c stands in
 * otherwise.
 *
 * Per group: one ncclComm_t on the group's GPU, one communication stream
 * (cudaStreamNonBlocking, so it never synchronises implicitly with the legacy
 * default stream), two reusable events for the compute<->comm hand-off, and
 * a small device + pinned-host scratch for the host-visible all-reduce behind
 * ch_pg_barrier / ch_pg_check_all when there is no MPI communicator. */
#include "config.h"

#include "framework/tensor/device.h"
#include "framework/dist/dist.h"
#include "framework/dist/dist_internal.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include "framework/launch/pmi2.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ch_pg_nccl {
    ncclComm_t comm;        /* NULL until ncclCommInitRank succeeded */
    cudaStream_t stream;    /* communication stream */
    cudaStream_t compute;   /* producer/consumer stream; NULL until set: collectives refused */
    cudaEvent_t ev_ready;   /* recorded on compute, waited on by the comm stream */
    cudaEvent_t ev_done;    /* recorded on the comm stream, waited on by compute */
    int64_t *dev_scratch;   /* 2 elements on the device */
    int64_t *host_scratch;  /* 2 elements, pinned */
    int device;
    int aborted;            /* ncclCommAbort done: only destroy remains */
    int hook_added;
    int pmi2_inited;        /* we called PMI2_Init, so we PMI2_Finalize */
};

static ncclDataType_t nccl_type(ch_dist_dtype dtype)
{
    switch (dtype) {
    case CH_DIST_FLOAT32: return ncclFloat32;
    case CH_DIST_FLOAT64: return ncclFloat64;
    case CH_DIST_INT32: return ncclInt32;
    case CH_DIST_INT64: return ncclInt64;
    default: return ncclUint8;
    }
}

static ncclRedOp_t nccl_op(ch_reduce_op op)
{
    switch (op) {
    case CH_REDUCE_AVG: return ncclAvg;
    case CH_REDUCE_MAX: return ncclMax;
    case CH_REDUCE_MIN: return ncclMin;
    default: return ncclSum;
    }
}

/* ch_fatal hook: abort the communicator so that peers blocked in an NCCL
 * kernel are released (together with MPI_Abort, which follows the hooks). */
static void abort_hook(void *arg)
{
    ch_pg_t *pg = (ch_pg_t *)arg;
    struct ch_pg_nccl *n = pg->nccl;
    if (n && n->comm && !n->aborted) {
        n->aborted = 1;
        ncclCommAbort(n->comm);
    }
}

static ch_status abort_comm(ch_pg_t *pg)
{
    struct ch_pg_nccl *n = pg->nccl;
    if (n->comm && !n->aborted) {
        n->aborted = 1;
        if (n->hook_added) {
            ch_fatal_hook_remove(abort_hook, pg);
            n->hook_added = 0;
        }
        ncclCommAbort(n->comm);
    }
    return CH_OK;
}

/* Make the group's GPU current for the calling thread (cheap when it is). */
static ch_status use_device(struct ch_pg_nccl *n)
{
    int cur = -1;
    CH_CHECK_CUDA(cudaGetDevice(&cur));
    if (cur != n->device) CH_CHECK_CUDA(cudaSetDevice(n->device));
    return CH_OK;
}

/* Report an asynchronous NCCL error (a peer died, a network failure) and
 * abort the communicator; also refuse work on an aborted communicator. */
static ch_status check_async(ch_pg_t *pg, const char *what)
{
    struct ch_pg_nccl *n = pg->nccl;
    if (n->aborted)
        return CH_ERROR(CH_ERR_NCCL, "%s: the NCCL communicator of rank %d was aborted "
                        "after an earlier error; destroy the group", what, pg->rank);
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(n->comm, &async);
    if (r != ncclSuccess)
        return CH_ERROR(CH_ERR_NCCL, "%s: ncclCommGetAsyncError failed on rank %d: %s",
                        what, pg->rank, ncclGetErrorString(r));
    if (async != ncclSuccess && async != ncclInProgress) {
        const char *last = ncclGetLastError(n->comm);
        char detail[512];
        snprintf(detail, sizeof detail, "%s", last ? last : "");
        abort_comm(pg);
        return CH_ERROR(CH_ERR_NCCL, "%s: asynchronous NCCL error on rank %d of %d: %s%s%s; "
                        "communicator aborted", what, pg->rank, pg->size,
                        ncclGetErrorString(async), detail[0] ? ": " : "", detail);
    }
    return CH_OK;
}

/* Before a collective: right device, no pending async error, and the comm
 * stream waits for what the compute stream queued so far. */
static ch_status prologue(ch_pg_t *pg, const char *what)
{
    struct ch_pg_nccl *n = pg->nccl;
    if (!n->compute)
        return CH_ERROR(CH_ERR_INVALID,
                        "%s: the NCCL process group (rank %d of %d, GPU %d) has no compute "
                        "stream: give it the compute context's (ch_pg_nccl_set_stream with "
                        "ch_compute_stream) first; on the legacy default stream the collective "
                        "would be unordered against the ops' non-blocking streams",
                        what, pg->rank, pg->size, n->device);
    CH_TRY(use_device(n));
    CH_TRY(check_async(pg, what));
    CH_CHECK_CUDA(cudaEventRecord(n->ev_ready, n->compute));
    CH_CHECK_CUDA(cudaStreamWaitEvent(n->stream, n->ev_ready, 0));
    return CH_OK;
}

/* After a collective: blocking -> the compute stream waits for it;
 * non-blocking -> the work's event marks it. */
static ch_status epilogue(ch_pg_t *pg, ch_work_t *work)
{
    struct ch_pg_nccl *n = pg->nccl;
    if (work) {
        CH_CHECK_CUDA(cudaEventRecord((cudaEvent_t)work->event, n->stream));
        return CH_OK;
    }
    CH_CHECK_CUDA(cudaEventRecord(n->ev_done, n->stream));
    CH_CHECK_CUDA(cudaStreamWaitEvent(n->compute, n->ev_done, 0));
    return CH_OK;
}

extern "C" ch_status ch_nccl_allreduce_(ch_pg_t *pg, const void *send, void *recv,
                                        int64_t count, ch_dist_dtype dtype,
                                        ch_reduce_op op, ch_work_t *work)
{
    struct ch_pg_nccl *n = pg->nccl;
    CH_TRY(prologue(pg, "ch_pg_allreduce"));
    if (count > 0)
        CH_CHECK_NCCL(ncclAllReduce(send, recv, (size_t)count, nccl_type(dtype),
                                    nccl_op(op), n->comm, n->stream));
    return epilogue(pg, work);
}

extern "C" ch_status ch_nccl_broadcast_(ch_pg_t *pg, void *buf, int64_t count,
                                        ch_dist_dtype dtype, int root)
{
    struct ch_pg_nccl *n = pg->nccl;
    CH_TRY(prologue(pg, "ch_pg_broadcast"));
    if (count > 0)
        CH_CHECK_NCCL(ncclBroadcast(buf, buf, (size_t)count, nccl_type(dtype), root,
                                    n->comm, n->stream));
    return epilogue(pg, NULL);
}

extern "C" ch_status ch_nccl_allgather_(ch_pg_t *pg, const void *send, void *recv,
                                        int64_t count, ch_dist_dtype dtype)
{
    struct ch_pg_nccl *n = pg->nccl;
    CH_TRY(prologue(pg, "ch_pg_allgather"));
    if (count > 0)
        CH_CHECK_NCCL(ncclAllGather(send, recv, (size_t)count, nccl_type(dtype), n->comm,
                                    n->stream));
    return epilogue(pg, NULL);
}

extern "C" ch_status ch_nccl_synchronize_(ch_pg_t *pg)
{
    struct ch_pg_nccl *n = pg->nccl;
    CH_TRY(use_device(n));
    for (;;) {
        cudaError_t e = cudaStreamQuery(n->stream);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) CH_CHECK_CUDA(e);
        CH_TRY(check_async(pg, "ch_pg_synchronize"));
        sched_yield();
    }
    return check_async(pg, "ch_pg_synchronize");
}

extern "C" ch_status ch_nccl_allreduce_host_i64_(ch_pg_t *pg, int64_t *v, int count)
{
    struct ch_pg_nccl *n = pg->nccl;
    if (count < 1 || count > 2)
        return CH_ERROR(CH_ERR_INTERNAL, "host all-reduce of %d elements (1 or 2 expected)",
                        count);
    CH_TRY(use_device(n));
    CH_TRY(check_async(pg, "ch_pg_barrier/ch_pg_check_all"));
    memcpy(n->host_scratch, v, (size_t)count * sizeof *v);
    CH_CHECK_CUDA(cudaMemcpyAsync(n->dev_scratch, n->host_scratch, (size_t)count * sizeof *v,
                                  cudaMemcpyHostToDevice, n->stream));
    CH_CHECK_NCCL(ncclAllReduce(n->dev_scratch, n->dev_scratch, (size_t)count, ncclInt64,
                                ncclMin, n->comm, n->stream));
    CH_CHECK_CUDA(cudaMemcpyAsync(n->host_scratch, n->dev_scratch, (size_t)count * sizeof *v,
                                  cudaMemcpyDeviceToHost, n->stream));
    CH_TRY(ch_nccl_synchronize_(pg));
    memcpy(v, n->host_scratch, (size_t)count * sizeof *v);
    return CH_OK;
}

extern "C" ch_status ch_nccl_work_init_(ch_work_t *work)
{
    struct ch_pg_nccl *n = work->pg->nccl;
    cudaEvent_t ev;
    CH_TRY(use_device(n));
    CH_CHECK_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    work->event = (void *)ev;
    return CH_OK;
}

extern "C" void ch_nccl_work_free_(ch_work_t *work)
{
    if (work->event) cudaEventDestroy((cudaEvent_t)work->event);
    work->event = NULL;
}

extern "C" ch_status ch_nccl_work_wait_(ch_work_t *work)
{
    ch_pg_t *pg = work->pg;
    struct ch_pg_nccl *n = pg->nccl;
    CH_TRY(use_device(n));
    CH_CHECK_CUDA(cudaStreamWaitEvent(n->compute, (cudaEvent_t)work->event, 0));
    return check_async(pg, "ch_work_wait");
}

extern "C" ch_status ch_nccl_work_test_(ch_work_t *work, int *done)
{
    ch_pg_t *pg = work->pg;
    *done = 0;
    CH_TRY(use_device(pg->nccl));
    cudaError_t e = cudaEventQuery((cudaEvent_t)work->event);
    if (e == cudaSuccess) {
        *done = 1;
        return check_async(pg, "ch_work_test");
    }
    if (e != cudaErrorNotReady) {
        *done = 1; /* the handle cannot complete any more; release it */
        CH_CHECK_CUDA(e);
    }
    ch_status s = check_async(pg, "ch_work_test");
    if (s != CH_OK) *done = 1;
    return s;
}

extern "C" ch_status ch_nccl_set_stream_(ch_pg_t *pg, void *stream)
{
    if (!stream)
        return CH_ERROR(CH_ERR_INVALID,
                        "ch_pg_nccl_set_stream: NULL (the legacy default stream) for the NCCL "
                        "process group of rank %d: give it the compute context's stream "
                        "(ch_compute_stream), which the ops run on", pg->rank);
    pg->nccl->compute = (cudaStream_t)stream;
    return CH_OK;
}

extern "C" void *ch_nccl_comm_stream_(const ch_pg_t *pg) { return (void *)pg->nccl->stream; }

extern "C" ch_status ch_nccl_stream_wait_(ch_pg_t *pg, void *stream)
{
    struct ch_pg_nccl *n = pg->nccl;
    CH_TRY(use_device(n));
    CH_CHECK_CUDA(cudaEventRecord(n->ev_done, n->stream));
    CH_CHECK_CUDA(cudaStreamWaitEvent((cudaStream_t)stream, n->ev_done, 0));
    return CH_OK;
}

extern "C" ch_status ch_nccl_allreduce_raw_(ch_pg_t *pg, const void *send, void *recv,
                                            int64_t count, ch_dist_dtype dtype,
                                            ch_reduce_op op)
{
    struct ch_pg_nccl *n = pg->nccl;
    if (count > 0)
        CH_CHECK_NCCL(ncclAllReduce(send, recv, (size_t)count, nccl_type(dtype), nccl_op(op),
                                    n->comm, n->stream));
    return CH_OK;
}

extern "C" ch_status ch_nccl_buffer_alloc_(ch_pg_t *pg, size_t bytes, void **ptr)
{
    CH_TRY(use_device(pg->nccl));
    cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 64);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* not left for the next launch check */
        *ptr = NULL;
        return CH_ERROR(CH_ERR_CUDA, "ch_pg_buffer_alloc: cudaMalloc of %zu bytes on GPU %d "
                        "(rank %d) failed: %s", bytes, pg->nccl->device, pg->rank,
                        cudaGetErrorString(e));
    }
    return CH_OK;
}

extern "C" void ch_nccl_buffer_free_(ch_pg_t *pg, void *ptr)
{
    if (use_device(pg->nccl) != CH_OK) ch_error_clear();
    cudaFree(ptr);
}

extern "C" ch_status ch_nccl_buffer_copy_(ch_pg_t *pg, void *dst, const void *src,
                                          size_t bytes, int to_device)
{
    struct ch_pg_nccl *n = pg->nccl;
    CH_TRY(use_device(n));
    CH_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes,
                                  to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                  n->compute));
    CH_CHECK_CUDA(cudaStreamSynchronize(n->compute));
    return CH_OK;
}

/* Tear down whatever part of the backend state exists (also used to undo a
 * half-built group). */
extern "C" void ch_nccl_destroy_(ch_pg_t *pg)
{
    struct ch_pg_nccl *n = pg->nccl;
    if (!n) return;
    if (n->hook_added) {
        ch_fatal_hook_remove(abort_hook, pg);
        n->hook_added = 0;
    }
    if (use_device(n) != CH_OK) ch_error_clear();
    if (n->comm && !n->aborted) {
        if (ch_nccl_synchronize_(pg) == CH_OK)
            ncclCommDestroy(n->comm);
        else
            abort_comm(pg); /* pending error: do not wait on dead peers */
    }
    if (n->ev_ready) cudaEventDestroy(n->ev_ready);
    if (n->ev_done) cudaEventDestroy(n->ev_done);
    if (n->stream) cudaStreamDestroy(n->stream);
    if (n->dev_scratch) cudaFree(n->dev_scratch);
    if (n->host_scratch) cudaFreeHost(n->host_scratch);
    ch_pmi2_finalize(n->pmi2_inited);
    free(n);
    pg->nccl = NULL;
}

/* Select the GPU and make the stream, events and scratch (local, before the
 * communicator exists). */
static ch_status prepare(ch_pg_t *pg, int device)
{
    struct ch_pg_nccl *n = pg->nccl;
    int count = 0;
    CH_TRY(ch_device_count(&count));
    if (device < 0 || device >= count)
        return CH_ERROR(CH_ERR_RANGE, "NCCL process group: rank %d asked for GPU %d but "
                        "%d are visible (CUDA_VISIBLE_DEVICES?)", pg->rank, device, count);
    n->device = device;
    CH_CHECK_CUDA(cudaSetDevice(device));
    CH_CHECK_CUDA(cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking));
    CH_CHECK_CUDA(cudaEventCreateWithFlags(&n->ev_ready, cudaEventDisableTiming));
    CH_CHECK_CUDA(cudaEventCreateWithFlags(&n->ev_done, cudaEventDisableTiming));
    CH_CHECK_CUDA(cudaMalloc((void **)&n->dev_scratch, 2 * sizeof(int64_t)));
    CH_CHECK_CUDA(cudaHostAlloc((void **)&n->host_scratch, 2 * sizeof(int64_t),
                                cudaHostAllocDefault));
    return CH_OK;
}

static ch_status new_group(int rank, int size, ch_pg_t **out)
{
    ch_pg_t *pg = (ch_pg_t *)calloc(1, sizeof *pg);
    struct ch_pg_nccl *n = (struct ch_pg_nccl *)calloc(1, sizeof *n);
    if (!pg || !n) {
        free(pg);
        free(n);
        return CH_ERROR(CH_ERR_NOMEM, "no memory for an NCCL process group");
    }
    pg->backend = CH_PG_NCCL;
    pg->rank = rank;
    pg->size = size;
    pg->comm = MPI_COMM_NULL;
    pg->nccl = n;
    n->device = -1;
    *out = pg;
    return CH_OK;
}

static ch_status init_comm(ch_pg_t *pg, const ncclUniqueId *id)
{
    struct ch_pg_nccl *n = pg->nccl;
    ncclResult_t r = ncclCommInitRank(&n->comm, pg->size, *id, pg->rank);
    if (r != ncclSuccess) {
        n->comm = NULL;
        return CH_ERROR(CH_ERR_NCCL, "ncclCommInitRank(rank %d of %d, GPU %d) failed: %s",
                        pg->rank, pg->size, n->device, ncclGetErrorString(r));
    }
    CH_TRY(ch_fatal_hook_add(abort_hook, pg));
    n->hook_added = 1;
    return CH_OK;
}

extern "C" ch_status ch_pg_create_nccl(ch_pg_t *mpi_pg, int device, ch_pg_t **out)
{
    CH_REQUIRE(out, "ch_pg_create_nccl: output pointer is NULL");
    *out = NULL;
    CH_REQUIRE(mpi_pg, "ch_pg_create_nccl: MPI process group is NULL");
    CH_REQUIRE(mpi_pg->backend == CH_PG_MPI && mpi_pg->comm != MPI_COMM_NULL,
               "ch_pg_create_nccl: the bootstrap group must be an MPI-backend group");
    ch_pg_t *pg = NULL;
    CH_TRY(new_group(mpi_pg->rank, mpi_pg->size, &pg));
    int rc = MPI_Comm_dup(mpi_pg->comm, &pg->comm);
    if (rc != MPI_SUCCESS) {
        pg->comm = MPI_COMM_NULL;
        ch_pg_destroy(pg);
        return CH_ERROR(CH_ERR_MPI, "ch_pg_create_nccl: MPI_Comm_dup failed (%d)", rc);
    }
    MPI_Comm_set_errhandler(pg->comm, MPI_ERRORS_RETURN);

    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ch_status s = prepare(pg, device);
    if (s == CH_OK && pg->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess)
            s = CH_ERROR(CH_ERR_NCCL, "ncclGetUniqueId failed on rank 0: %s",
                         ncclGetErrorString(r));
    }
    /* Agree on local failures before anyone enters ncclCommInitRank. */
    s = ch_pg_check_all(mpi_pg, s, NULL);
    if (s == CH_OK) {
        rc = MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, mpi_pg->comm);
        if (rc != MPI_SUCCESS)
            s = CH_ERROR(CH_ERR_MPI, "ch_pg_create_nccl: MPI_Bcast of the NCCL unique id "
                         "failed (%d)", rc);
    }
    if (s == CH_OK) s = init_comm(pg, &id);
    if (s != CH_OK) {
        char msg[CH_ERROR_MAX];
        snprintf(msg, sizeof msg, "%s", ch_error_message());
        ch_pg_destroy(pg);
        return ch_error_adopt(s, msg);
    }
    *out = pg;
    return CH_OK;
}

extern "C" ch_status ch_pg_create_nccl_pmi2(int rank, int size, int device, ch_pg_t **out)
{
    static int seq; /* same on every rank: creation is collective */
    CH_REQUIRE(out, "ch_pg_create_nccl_pmi2: output pointer is NULL");
    *out = NULL;
    CH_REQUIRE(size >= 1 && rank >= 0 && rank < size,
               "ch_pg_create_nccl_pmi2: rank %d of world size %d is not valid", rank, size);
    /* fails the same way on every task when there is no PMI2 job */
    int prank = -1, psize = -1, inited_here = 0;
    CH_TRY(ch_pmi2_init(&prank, &psize, &inited_here));
    /* From here on every failure goes through the exchange below, so that
     * all ranks learn of it and none waits in ncclCommInitRank. */
    ch_status s = CH_OK;
    if (psize != size || prank != rank)
        s = CH_ERROR(CH_ERR_INVALID, "ch_pg_create_nccl_pmi2: PMI2 says rank %d of %d "
                     "but the caller gave rank %d of %d", prank, psize, rank, size);
    ch_pg_t *pg = NULL;
    if (s == CH_OK) s = new_group(rank, size, &pg);
    if (pg) pg->nccl->pmi2_inited = inited_here;
    if (s == CH_OK) s = prepare(pg, device);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (prank == 0 && s == CH_OK) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess)
            s = CH_ERROR(CH_ERR_NCCL, "ncclGetUniqueId failed on rank 0: %s",
                         ncclGetErrorString(r));
    }
    char key[48];
    snprintf(key, sizeof key, "cohort-nccl-id-%d", seq++);
    char msg[CH_ERROR_MAX] = "";
    if (s != CH_OK) snprintf(msg, sizeof msg, "%s", ch_error_message());
    ch_status b = ch_pmi2_kvs_bcast(key, prank, psize, &id, sizeof id, s);
    if (s == CH_OK && b != CH_OK) {
        s = b;
        snprintf(msg, sizeof msg, "%s", ch_error_message());
    }
    if (s == CH_OK) {
        s = init_comm(pg, &id);
        if (s != CH_OK) snprintf(msg, sizeof msg, "%s", ch_error_message());
    }
    if (s != CH_OK) {
        if (pg) ch_pg_destroy(pg); /* PMI2_Finalize if we initialised it */
        else ch_pmi2_finalize(inited_here);
        return ch_error_adopt(s, msg);
    }
    *out = pg;
    return CH_OK;
}
