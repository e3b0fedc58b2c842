/* cohort: CUDA backend — the "kernels" half of the GPU ops table: batch
 * norm / SyncBN pieces (batchnorm.cu), softmax cross-entropy, argmax and
 * accuracy (loss.cu), fused multi-tensor SGD (sgd.cu). See kernels.h. */
#include "config.h"

#include "framework/ops/cuda/kernels.h"

void ch_cuda_table_kernels(ch_ops_backend_t *t)
{
    t->bn_stats = ch_cuda_bn_stats;
    t->bn_apply = ch_cuda_bn_apply;
    t->bn_update_running = ch_cuda_bn_update_running;
    t->bn_gather_stats = ch_cuda_bn_gather_stats;
    t->bn_backward_reduce = ch_cuda_bn_backward_reduce;
    t->bn_param_grads = ch_cuda_bn_param_grads;
    t->bn_backward_elemt = ch_cuda_bn_backward_elemt;
    t->bn_backward = ch_cuda_bn_backward;
    t->cross_entropy = ch_cuda_cross_entropy;
    t->argmax = ch_cuda_argmax;
    t->count_correct = ch_cuda_count_correct;
    t->sgd_step = ch_cuda_sgd_step;
    t->adamw_step = ch_cuda_adamw_step;
    t->rmsprop_step = ch_cuda_rmsprop_step;
    t->cross_entropy_smooth = ch_cuda_cross_entropy_smooth;
}
