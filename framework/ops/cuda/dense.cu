/* cohort: CUDA backend — data motion, convolution, linear, ReLU, pooling,
 * add/scale, uploads. (Being written: issue #7.) */
#include "config.h"

#include "framework/ops/cuda/cuda_internal.h"

void ch_cuda_table_dense(ch_ops_backend_t *t) { (void)t; }
