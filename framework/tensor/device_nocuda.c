/* cohort: device queries in a build without the GPU backend. */
#include "config.h"

#include "framework/tensor/device.h"

#include <stdio.h>
#include <stdlib.h>

int ch_device_backend_compiled(void) { return 0; }

ch_status ch_device_count(int *count)
{
    CH_REQUIRE(count, "ch_device_count: count is NULL");
    *count = 0;
    return CH_OK;
}

ch_status ch_device_set(int device)
{
    return CH_ERROR(CH_ERR_UNSUPPORTED,
                    "cannot select GPU %d: cohort was built without CUDA "
                    "(configure --with-cuda)", device);
}

ch_status ch_device_name(int device, char *buf, size_t len)
{
    if (buf && len) snprintf(buf, len, "cpu");
    return CH_ERROR(CH_ERR_UNSUPPORTED, "no GPU %d: built without CUDA", device);
}

ch_status ch_host_alloc(void **ptr, size_t bytes, int want_pinned, int *is_pinned)
{
    CH_REQUIRE(ptr, "ch_host_alloc: ptr is NULL");
    (void)want_pinned;
    if (is_pinned) *is_pinned = 0;
    size_t rounded = (bytes + 63) / 64 * 64;
    *ptr = aligned_alloc(64, rounded ? rounded : 64);
    if (!*ptr) return CH_ERROR(CH_ERR_NOMEM, "cannot allocate %zu bytes of host memory", bytes);
    return CH_OK;
}

void ch_host_free(void *ptr, int is_pinned)
{
    (void)is_pinned;
    free(ptr);
}

ch_status ch_device_enable_tensors(void)
{
    return CH_ERROR(CH_ERR_UNSUPPORTED, "GPU tensors need a build with CUDA (configure --with-cuda)");
}

ch_status ch_device_memcpy(int device, void *dst, const void *src, size_t bytes,
                           ch_memcpy_kind kind)
{
    (void)dst;
    (void)src;
    (void)kind;
    if (bytes == 0) return CH_OK;
    return CH_ERROR(CH_ERR_UNSUPPORTED, "cannot copy %zu bytes to/from GPU %d: cohort was built "
                    "without CUDA", bytes, device);
}

ch_status ch_device_memzero(int device, void *ptr, size_t bytes)
{
    (void)ptr;
    if (bytes == 0) return CH_OK;
    return CH_ERROR(CH_ERR_UNSUPPORTED, "cannot clear %zu bytes on GPU %d: cohort was built "
                    "without CUDA", bytes, device);
}
