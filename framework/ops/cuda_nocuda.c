/* cohort: ops in a build without the GPU backend: no CUDA table, so ops on
 * CH_DEV_CUDA tensors fail with CH_ERR_UNSUPPORTED (see framework/ops/ops.c). */
#include "config.h"

#include "framework/ops/backend.h"

#include <stddef.h>

const ch_ops_backend_t *ch_ops_cuda_backend(void) { return NULL; }
