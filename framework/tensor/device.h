/* cohort: compute devices (GPUs) visible to this process.
 *
 * Compiled against CUDA when configure found it (framework/tensor/device_cuda.cu),
 * otherwise a CPU-only build where no GPU is ever visible
 * (framework/tensor/device_nocuda.c). Callers never #ifdef on the backend.
 */
#ifndef COHORT_DEVICE_H
#define COHORT_DEVICE_H

#include "framework/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the GPU backend is compiled in, else 0. */
int ch_device_backend_compiled(void);

/* Number of GPUs this process can see (after CUDA_VISIBLE_DEVICES). A build
 * without CUDA, or a machine with no driver/GPU, gives 0 and CH_OK. */
ch_status ch_device_count(int *count);

/* Make GPU `device` (0 <= device < count) current for the calling thread.
 * CH_ERR_RANGE when out of range, CH_ERR_UNSUPPORTED without CUDA. */
ch_status ch_device_set(int device);

/* Human-readable name of GPU `device` into buf (e.g. "NVIDIA H200"). */
ch_status ch_device_name(int device, char *buf, size_t len);

/* Register the CUDA allocator for CH_DEV_CUDA tensors and arenas
 * (ch_tensor_set_device_allocator: cudaMalloc + cudaMemset on the tensor's
 * dev_index, cudaFree). Idempotent; called by ch_device_set and by the GPU
 * ops backend, so callers rarely need it. CH_ERR_UNSUPPORTED without CUDA. */
ch_status ch_device_enable_tensors(void);

/* Host memory for batch slots and staging buffers, `bytes` long and 64-byte
 * aligned. With want_pinned != 0 and a GPU visible it is page-locked
 * (cudaHostAlloc, so H2D copies can be asynchronous); otherwise plain aligned
 * memory. *is_pinned (may be NULL) tells which one was given; pass it back to
 * ch_host_free. CH_ERR_NOMEM / CH_ERR_CUDA on failure. */
ch_status ch_host_alloc(void **ptr, size_t bytes, int want_pinned, int *is_pinned);
void ch_host_free(void *ptr, int is_pinned);

/* Directions of ch_device_memcpy. */
typedef enum {
    CH_MEMCPY_HOST_TO_DEVICE = 0,
    CH_MEMCPY_DEVICE_TO_HOST = 1,
    CH_MEMCPY_DEVICE_TO_DEVICE = 2
} ch_memcpy_kind;

/* Synchronous copy of `bytes` bytes between host memory and memory of GPU
 * `device` (or within it), for set-up and checkpoints, never the step loop:
 * first waits for every kernel and copy queued on ANY stream of that GPU
 * (cudaDeviceSynchronize: so a device -> host copy sees the results of all
 * queued compute and collectives), then cudaMemcpy, then waits again (so the
 * data is in place, in either direction, when it returns, whatever stream
 * later work runs on). bytes == 0 does nothing. Errors: CH_ERR_INVALID (NULL
 * pointer with bytes > 0, bad kind), CH_ERR_RANGE (bad device), CH_ERR_CUDA;
 * CH_ERR_UNSUPPORTED in a build without CUDA. */
ch_status ch_device_memcpy(int device, void *dst, const void *src, size_t bytes,
                           ch_memcpy_kind kind);

/* Zero `bytes` bytes of memory of GPU `device`, synchronously, with the same
 * ordering as ch_device_memcpy (waits for all queued work first and for the
 * memset after). Errors as ch_device_memcpy. */
ch_status ch_device_memzero(int device, void *ptr, size_t bytes);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_DEVICE_H */
