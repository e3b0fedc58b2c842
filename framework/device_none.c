/* cohort: device queries in a build without the GPU backend. */
#include "config.h"

#include "framework/device.h"

#include <stdio.h>

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
