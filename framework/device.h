/* cohort: compute devices (GPUs) visible to this process.
 *
 * Compiled against CUDA when configure found it (framework/device_cuda.cu),
 * otherwise a CPU-only build where no GPU is ever visible
 * (framework/device_none.c). Callers never #ifdef on the backend.
 */
#ifndef COHORT_DEVICE_H
#define COHORT_DEVICE_H

#include "framework/status.h"

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

#ifdef __cplusplus
}
#endif
#endif /* COHORT_DEVICE_H */
