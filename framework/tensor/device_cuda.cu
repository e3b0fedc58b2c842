/* cohort: device queries through the CUDA runtime. */
#include "config.h"

#include "framework/tensor/device.h"
#include "framework/tensor/tensor.h"
#include "framework/core/log.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" int ch_device_backend_compiled(void) { return 1; }

extern "C" ch_status ch_device_count(int *count)
{
    CH_REQUIRE(count, "ch_device_count: count is NULL");
    *count = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorNoDevice) {
        (void)cudaGetLastError(); /* a driver but no GPU: a CPU machine */
        return CH_OK;
    }
    if (e == cudaErrorInsufficientDriver) {
        (void)cudaGetLastError();
        /* no driver, or one older than this runtime: a CPU machine with the
         * toolkit installed, unless a GPU is there (a cluster node whose
         * driver lags the toolkit), which must not train on its CPU */
        char what[512];
        if (!ch_device_gpu_present(what, sizeof what)) return CH_OK;
        int drv = 0, rt = 0;
        if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = 0;
        if (cudaRuntimeGetVersion(&rt) != cudaSuccess) rt = CUDART_VERSION;
        (void)cudaGetLastError();
        return ch_device_driver_error(drv, rt, what);
    }
    CH_CHECK_CUDA(e);
    *count = n;
    return CH_OK;
}

extern "C" ch_status ch_device_set(int device)
{
    int n = 0;
    CH_TRY(ch_device_count(&n));
    if (device < 0 || device >= n)
        return CH_ERROR(CH_ERR_RANGE, "GPU %d requested but %d visible "
                        "(CUDA_VISIBLE_DEVICES?)", device, n);
    CH_CHECK_CUDA(cudaSetDevice(device));
    return ch_device_enable_tensors();
}

/* CH_DEV_CUDA tensor storage: zero-filled cudaMalloc on the tensor's GPU. */
static ch_status cuda_tensor_alloc(void *ctx, int dev_index, size_t bytes, void **ptr)
{
    (void)ctx;
    *ptr = NULL;
    int prev = -1;
    CH_CHECK_CUDA(cudaGetDevice(&prev));
    if (prev != dev_index) CH_CHECK_CUDA(cudaSetDevice(dev_index));
    cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 1);
    if (e == cudaSuccess) e = cudaMemset(*ptr, 0, bytes);
    /* cudaMemset on device memory is queued on the legacy default stream and
     * returns before it runs; the ops' streams are non-blocking, so without
     * this wait a kernel writing the fresh storage (an activation of a new
     * arena) could run before the zeroing and be overwritten by it */
    if (e == cudaSuccess) e = cudaStreamSynchronize(0);
    if (prev != dev_index) (void)cudaSetDevice(prev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (*ptr) cudaFree(*ptr);
        *ptr = NULL;
        return CH_ERROR(CH_ERR_NOMEM, "GPU %d: cannot allocate %zu bytes: %s", dev_index, bytes,
                        cudaGetErrorString(e));
    }
    return CH_OK;
}

/* cudaFree "may perform implicit synchronization" (cuda_runtime_api.h) but
 * does not promise it, while storage is freed with kernels possibly still
 * queued on the ops' non-blocking streams (an arena re-planned for a new
 * batch shape, a model moved between devices, a tensor freed right after
 * the op that used it). Wait for the device first, as the ops' own
 * workspace regrowth does; frees are rare (plans, teardown). */
static void cuda_tensor_free(void *ctx, int dev_index, void *ptr)
{
    (void)ctx;
    if (!ptr) return;
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    if (prev != dev_index) (void)cudaSetDevice(dev_index);
    (void)cudaDeviceSynchronize();
    (void)cudaFree(ptr);
    (void)cudaGetLastError(); /* a teardown after an error must not poison later checks */
    if (prev >= 0 && prev != dev_index) (void)cudaSetDevice(prev);
}

extern "C" ch_status ch_device_enable_tensors(void)
{
    static int done;
    if (done) return CH_OK;
    ch_device_allocator_t a;
    a.alloc = cuda_tensor_alloc;
    a.free = cuda_tensor_free;
    a.ctx = NULL;
    CH_TRY(ch_tensor_set_device_allocator(CH_DEV_CUDA, &a));
    done = 1;
    return CH_OK;
}

extern "C" ch_status ch_device_name(int device, char *buf, size_t len)
{
    cudaDeviceProp prop;
    CH_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
    if (buf && len) snprintf(buf, len, "%s", prop.name);
    return CH_OK;
}

extern "C" ch_status ch_host_alloc(void **ptr, size_t bytes, int want_pinned, int *is_pinned)
{
    CH_REQUIRE(ptr, "ch_host_alloc: ptr is NULL");
    int n = 0;
    if (is_pinned) *is_pinned = 0;
    size_t rounded = (bytes + 63) / 64 * 64;
    if (!rounded) rounded = 64;
    if (want_pinned && ch_device_count(&n) != CH_OK) {
        ch_error_clear(); /* no usable GPU: plain memory, as on a CPU machine */
        n = 0;
    }
    if (want_pinned && n > 0) {
        cudaError_t e = cudaHostAlloc(ptr, rounded, cudaHostAllocPortable);
        if (e == cudaSuccess) {
            if (is_pinned) *is_pinned = 1;
            return CH_OK;
        }
        /* page-locking is limited (ulimit -l, cgroups, the driver): copies
         * from pageable memory are slower but correct */
        (void)cudaGetLastError();
        *ptr = NULL;
        ch_log_warn("page-locked host memory: cudaHostAlloc of %zu bytes failed (%s); using "
                    "pageable memory for this buffer (slower uploads)", rounded,
                    cudaGetErrorString(e));
    }
    *ptr = aligned_alloc(64, rounded);
    if (!*ptr) return CH_ERROR(CH_ERR_NOMEM, "cannot allocate %zu bytes of host memory", bytes);
    return CH_OK;
}

extern "C" void ch_host_free(void *ptr, int is_pinned)
{
    if (!ptr) return;
    if (is_pinned) cudaFreeHost(ptr);
    else free(ptr);
}

/* Select `device` for the calling thread, remembering the previous one. */
static ch_status enter_device(int device, int *prev)
{
    int n = 0;
    *prev = -1;
    CH_TRY(ch_device_count(&n));
    if (device < 0 || device >= n)
        return CH_ERROR(CH_ERR_RANGE, "GPU %d requested but %d visible", device, n);
    CH_CHECK_CUDA(cudaGetDevice(prev));
    if (*prev != device) CH_CHECK_CUDA(cudaSetDevice(device));
    return CH_OK;
}

static ch_status sync_copy(int device, void *dst, const void *src, size_t bytes,
                           enum cudaMemcpyKind k)
{
    CH_CHECK_CUDA(cudaDeviceSynchronize());
    if (dst)
        CH_CHECK_CUDA(cudaMemcpy(dst, src, bytes, k));
    else
        CH_CHECK_CUDA(cudaMemset((void *)src, 0, bytes));
    CH_CHECK_CUDA(cudaDeviceSynchronize());
    (void)device;
    return CH_OK;
}

extern "C" ch_status ch_device_memcpy(int device, void *dst, const void *src, size_t bytes,
                                      ch_memcpy_kind kind)
{
    if (bytes == 0) return CH_OK;
    CH_REQUIRE(dst && src, "ch_device_memcpy: NULL pointer for %zu bytes", bytes);
    enum cudaMemcpyKind k;
    switch (kind) {
    case CH_MEMCPY_HOST_TO_DEVICE: k = cudaMemcpyHostToDevice; break;
    case CH_MEMCPY_DEVICE_TO_HOST: k = cudaMemcpyDeviceToHost; break;
    case CH_MEMCPY_DEVICE_TO_DEVICE: k = cudaMemcpyDeviceToDevice; break;
    default: return CH_ERROR(CH_ERR_INVALID, "ch_device_memcpy: unknown kind %d", (int)kind);
    }
    int prev = -1;
    CH_TRY(enter_device(device, &prev));
    ch_status s = sync_copy(device, dst, src, bytes, k);
    if (prev >= 0 && prev != device) (void)cudaSetDevice(prev);
    return s;
}

extern "C" ch_status ch_device_memzero(int device, void *ptr, size_t bytes)
{
    if (bytes == 0) return CH_OK;
    CH_REQUIRE(ptr, "ch_device_memzero: NULL pointer for %zu bytes", bytes);
    int prev = -1;
    CH_TRY(enter_device(device, &prev));
    ch_status s = sync_copy(device, NULL, ptr, bytes, cudaMemcpyDefault);
    if (prev >= 0 && prev != device) (void)cudaSetDevice(prev);
    return s;
}
