/* cohort: process-group internals shared by framework/dist/dist.c (MPI backend,
 * argument checks, work-handle pool) and the NCCL backend
 * (framework/dist/dist_nccl.cu, or framework/dist/dist_nccl_nocuda.c in a build without
 * CUDA). Not installed; nothing outside framework/dist* includes it. */
#ifndef COHORT_DIST_INTERNAL_H
#define COHORT_DIST_INTERNAL_H

#include "framework/dist/dist.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ch_pg_nccl; /* backend state, defined in dist_nccl.cu */

struct ch_work {
    ch_work_t *next_free; /* free-list link */
    ch_work_t *next_all;  /* every handle the group ever made (for destroy) */
    ch_pg_t *pg;
    int active;           /* 1 between start and completion */
    /* MPI backend */
    MPI_Request req;
    void *avg_buf;        /* non-NULL: divide avg_count elements by W when done */
    int64_t avg_count;
    ch_dist_dtype dtype;
    /* NCCL backend: cudaEvent_t recorded on the comm stream after the call,
     * created once with the handle and reused. */
    void *event;
};

struct ch_pg {
    ch_pg_backend backend;
    int rank, size;
    MPI_Comm comm;        /* owned duplicate, or MPI_COMM_NULL (PMI2 NCCL) */
    ch_work_t *free_works;
    ch_work_t *all_works;
    int n_works;          /* handles ever made */
    struct ch_pg_nccl *nccl;
};

/* Take a handle from the group's free list (allocating one only when the
 * list is empty) / give it back. */
ch_status ch_pg_work_get_(ch_pg_t *pg, ch_work_t **work);
void ch_pg_work_put_(ch_work_t *work);

/* Divide count elements of a floating dtype by w in place (AVG). */
void ch_dist_divide_(void *buf, int64_t count, ch_dist_dtype dtype, int w);

/* NCCL backend entry points, called by dist.c after the common argument
 * checks (buffers non-NULL when count > 0, count >= 0, dtype/op/root valid,
 * AVG only on floating dtypes). */
ch_status ch_nccl_allreduce_(ch_pg_t *pg, const void *send, void *recv,
                             int64_t count, ch_dist_dtype dtype, ch_reduce_op op,
                             ch_work_t *work /* NULL: blocking */);
ch_status ch_nccl_broadcast_(ch_pg_t *pg, void *buf, int64_t count,
                             ch_dist_dtype dtype, int root);
ch_status ch_nccl_allgather_(ch_pg_t *pg, const void *send, void *recv,
                             int64_t count, ch_dist_dtype dtype);
/* 1-element device all-reduce of v (MIN) followed by a host wait. */
ch_status ch_nccl_allreduce_host_i64_(ch_pg_t *pg, int64_t *v, int n);
ch_status ch_nccl_work_wait_(ch_work_t *work);
ch_status ch_nccl_work_test_(ch_work_t *work, int *done);
void ch_nccl_work_free_(ch_work_t *work); /* destroys the event */
ch_status ch_nccl_work_init_(ch_work_t *work); /* creates the event */
ch_status ch_nccl_set_stream_(ch_pg_t *pg, void *stream);
void *ch_nccl_comm_stream_(const ch_pg_t *pg);
ch_status ch_nccl_stream_wait_(ch_pg_t *pg, void *stream);
ch_status ch_nccl_synchronize_(ch_pg_t *pg);
void ch_nccl_destroy_(ch_pg_t *pg);
ch_status ch_nccl_buffer_alloc_(ch_pg_t *pg, size_t bytes, void **ptr);
void ch_nccl_buffer_free_(ch_pg_t *pg, void *ptr);
/* to_device != 0: host -> device */
ch_status ch_nccl_buffer_copy_(ch_pg_t *pg, void *dst, const void *src, size_t bytes,
                               int to_device);
ch_status ch_nccl_allreduce_raw_(ch_pg_t *pg, const void *send, void *recv, int64_t count,
                                 ch_dist_dtype dtype, ch_reduce_op op);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_DIST_INTERNAL_H */
