/* cohort: the NCCL process-group backend in a build without CUDA/NCCL.
 * Creating an NCCL group fails with CH_ERR_UNSUPPORTED and a message saying
 * how to get one; since no NCCL group can exist, the internal entry points
 * are unreachable and only report the same error. */
#include "config.h"

#include "framework/dist/dist.h"
#include "framework/dist/dist_internal.h"

#define NO_NCCL(fn)                                                              \
    CH_ERROR(CH_ERR_UNSUPPORTED, "%s: cohort was built without CUDA/NCCL, so "   \
             "there is no NCCL backend (install CUDA + NCCL and configure "      \
             "--with-cuda; use ch_pg_create_mpi for host buffers)", fn)

ch_status ch_pg_create_nccl(ch_pg_t *mpi_pg, int device, ch_pg_t **pg)
{
    (void)mpi_pg;
    (void)device;
    if (pg) *pg = NULL;
    return NO_NCCL("ch_pg_create_nccl");
}

ch_status ch_pg_create_nccl_pmi2(int rank, int size, int device, ch_pg_t **pg)
{
    (void)rank;
    (void)size;
    (void)device;
    if (pg) *pg = NULL;
    return NO_NCCL("ch_pg_create_nccl_pmi2");
}

ch_status ch_nccl_allreduce_(ch_pg_t *pg, const void *send, void *recv, int64_t count,
                             ch_dist_dtype dtype, ch_reduce_op op, ch_work_t *work)
{
    return NO_NCCL("ch_pg_allreduce");
}

ch_status ch_nccl_broadcast_(ch_pg_t *pg, void *buf, int64_t count, ch_dist_dtype dtype,
                             int root)
{
    return NO_NCCL("ch_pg_broadcast");
}

ch_status ch_nccl_allgather_(ch_pg_t *pg, const void *send, void *recv, int64_t count,
                             ch_dist_dtype dtype)
{
    return NO_NCCL("ch_pg_allgather");
}

ch_status ch_nccl_allreduce_host_i64_(ch_pg_t *pg, int64_t *v, int n)
{
    return NO_NCCL("ch_pg_barrier/ch_pg_check_all");
}

ch_status ch_nccl_work_wait_(ch_work_t *work) { return NO_NCCL("ch_work_wait"); }

ch_status ch_nccl_work_test_(ch_work_t *work, int *done)
{
    *done = 1;
    return NO_NCCL("ch_work_test");
}

void ch_nccl_work_free_(ch_work_t *work) { (void)work; }

ch_status ch_nccl_work_init_(ch_work_t *work) { return NO_NCCL("ch_pg_iallreduce"); }

ch_status ch_nccl_set_stream_(ch_pg_t *pg, void *stream)
{
    return NO_NCCL("ch_pg_nccl_set_stream");
}

void *ch_nccl_comm_stream_(const ch_pg_t *pg) { return NULL; }

ch_status ch_nccl_stream_wait_(ch_pg_t *pg, void *stream)
{
    return NO_NCCL("ch_pg_stream_wait");
}

ch_status ch_nccl_synchronize_(ch_pg_t *pg) { return NO_NCCL("ch_pg_synchronize"); }

void ch_nccl_destroy_(ch_pg_t *pg) { (void)pg; }

ch_status ch_nccl_buffer_alloc_(ch_pg_t *pg, size_t bytes, void **ptr)
{
    return NO_NCCL("ch_pg_buffer_alloc");
}

void ch_nccl_buffer_free_(ch_pg_t *pg, void *ptr) { (void)ptr; }

ch_status ch_nccl_buffer_copy_(ch_pg_t *pg, void *dst, const void *src, size_t bytes,
                               int to_device)
{
    return NO_NCCL("ch_pg_buffer_read/write");
}

ch_status ch_nccl_allreduce_raw_(ch_pg_t *pg, const void *send, void *recv, int64_t count,
                                 ch_dist_dtype dtype, ch_reduce_op op)
{
    return NO_NCCL("ch_pg_nccl_allreduce_raw");
}
