/* cohort: internal interface of the CUDA ops backend (framework/ops/cuda).
 *
 * Not installed. backend.cu owns the per-context GPU state (device, streams,
 * cuDNN/cuBLAS handles, workspace) and assembles the ch_ops_backend_t table;
 * the op files fill their entries through the ch_cuda_table_* functions.
 *
 * Streams (SEMANTICS.md / issue #7): one compute stream (every op below is
 * queued on it, in order), one copy stream (host->device batch uploads,
 * ordered against compute with events), and the communication stream lives
 * in the NCCL process group (framework/dist/dist.h). Ops never synchronize the
 * host except where a host value is returned (count_correct, gather_stats'
 * host counts) or a buffer must grow.
 *
 * Every entry point has the signature of its ch_ops_backend_t field; `st`
 * is the ch_cuda_state_t. Arguments were checked by framework/ops/ops.c.
 */
#ifndef COHORT_OPS_CUDA_INTERNAL_H
#define COHORT_OPS_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "framework/ops/backend.h"

typedef struct ch_cuda_state ch_cuda_state_t;

/* accessors (backend.cu) */
cudaStream_t ch_cuda_stream(void *st);      /* compute stream */
cudaStream_t ch_cuda_copy_stream(void *st); /* host->device uploads */
cudnnHandle_t ch_cuda_cudnn(void *st);      /* bound to the compute stream */
cublasHandle_t ch_cuda_cublas(void *st);    /* bound to the compute stream */
int ch_cuda_device(void *st);               /* CUDA ordinal */
const ch_compute_options_t *ch_cuda_opts(void *st);
int ch_cuda_sm_count(void *st);             /* multiprocessors, for grid sizing */

/* Scratch device memory of at least `bytes` for the duration of ONE op
 * (queued on the compute stream). Grows (never shrinks): growing waits for
 * the compute stream, frees the old block and allocates a new one, so a
 * pointer stays valid only until the next call. bytes == 0 gives NULL.
 * Errors: CH_ERR_NOMEM naming the size. */
ch_status ch_cuda_workspace(void *st, size_t bytes, void **ptr);

/* Bytes of the workspace now (for ch_compute_scratchpad_bytes). */
size_t ch_cuda_workspace_bytes(void *st);

/* Number of cached entries an op file holds (conv algorithms, descriptors);
 * each op file that caches registers its counter through this table. */
typedef size_t (*ch_cuda_cache_count_fn)(void *st);

/* Table fillers: each op file sets the entries it implements.
 *  ch_cuda_table_dense:   reorder, fill, copy, conv2d_*, linear_*, relu_*,
 *                         maxpool_*, avgpool_*, adaptive_avgpool_*,
 *                         avgpool_global_*, add, scale,
 *                         upload_async, wait_upload          (dense.cu, conv.cu, ...)
 *  ch_cuda_table_kernels: bn_*, cross_entropy, argmax, count_correct,
 *                         sgd_step                            (batchnorm.cu, loss.cu, sgd.cu)
 * Per-context caches of an op file hang off the state through
 * ch_cuda_slot(): a void* slot per file, destroyed by the destructor the
 * file registers with ch_cuda_slot_set. */
void ch_cuda_table_dense(ch_ops_backend_t *t);
void ch_cuda_table_kernels(ch_ops_backend_t *t);

typedef enum {
    CH_CUDA_SLOT_CONV = 0,
    CH_CUDA_SLOT_DENSE,
    CH_CUDA_SLOT_BN,
    CH_CUDA_SLOT_LOSS,
    CH_CUDA_SLOT_SGD,
    CH_CUDA_SLOT_COUNT_
} ch_cuda_slot_id;

typedef struct ch_cuda_slot_ops {
    void (*destroy)(void *st, void *slot); /* called at context destroy */
    size_t (*cache_entries)(void *slot);   /* may be NULL */
} ch_cuda_slot_ops_t;

void *ch_cuda_slot(void *st, ch_cuda_slot_id id);
void ch_cuda_slot_set(void *st, ch_cuda_slot_id id, void *slot, const ch_cuda_slot_ops_t *ops);

/* Launch-configuration helper: blocks of `threads` covering n elements,
 * capped at 32 blocks per SM (grid-stride loops cover the rest). */
static inline unsigned ch_cuda_blocks(void *st, long long n, int threads)
{
    long long b = (n + threads - 1) / threads;
    long long cap = 32LL * (ch_cuda_sm_count(st) > 0 ? ch_cuda_sm_count(st) : 1);
    if (b > cap) b = cap;
    if (b < 1) b = 1;
    return (unsigned)b;
}

/* Return CH_ERR_CUDA if the last kernel launch failed (bad configuration). */
#define CH_CUDA_CHECK_LAUNCH() CH_CHECK_CUDA(cudaGetLastError())

#endif /* COHORT_OPS_CUDA_INTERNAL_H */
