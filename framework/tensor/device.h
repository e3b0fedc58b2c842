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
 * without CUDA, or a machine with no GPU (cudaErrorNoDevice, or no usable
 * driver and no sign of a GPU: ch_device_gpu_present), gives 0 and CH_OK.
 * A machine that has a GPU but whose driver is missing or older than the
 * CUDA runtime (cudaErrorInsufficientDriver) is CH_ERR_CUDA naming the
 * driver's and the runtime's CUDA versions (ch_device_driver_error), so a
 * GPU node never trains on its CPU silently. */
ch_status ch_device_count(int *count);

/* Signs of an NVIDIA GPU on this machine that do not need the CUDA runtime:
 * a device node <root>/dev/nvidia<N>, an entry of
 * <root>/proc/driver/nvidia/gpus, or an executable nvidia-smi in one of the
 * ':'-separated folders of `path` (found, never run). root NULL or "" is
 * "/"; path NULL is getenv("PATH"). Returns 1 and the first sign found in
 * what (len bytes, may be NULL), else 0 and "". For tests: the other
 * functions use ch_device_gpu_present. */
int ch_device_gpu_evidence(const char *root, const char *path, char *what, size_t len);

/* ch_device_gpu_evidence(NULL, NULL, ...) for this machine, probed once per
 * process (thread-safe). */
int ch_device_gpu_present(char *what, size_t len);

/* The error of a GPU machine without a usable driver: CH_ERR_CUDA with the
 * driver's CUDA version (driver_version as cudaDriverGetVersion gives it,
 * 1000 * major + 10 * minor; <= 0: no driver could be loaded), the
 * runtime's (cudaRuntimeGetVersion) and `evidence` (what
 * ch_device_gpu_present found) in the message. Always returns CH_ERR_CUDA. */
ch_status ch_device_driver_error(int driver_version, int runtime_version, const char *evidence);

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
 * aligned. With want_pinned != 0 and a GPU visible it is page-locked (when
 * cudaHostAlloc refuses, e.g. under a memlock limit, a warning and
 * pageable memory instead: *is_pinned 0, still CH_OK)
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
