/* cohort: entry points of the CUDA "kernels" half of the GPU ops backend
 * (batch norm / SyncBN pieces, softmax cross-entropy, argmax, accuracy,
 * fused SGD). Not installed. Each function has the signature of its
 * ch_ops_backend_t field (framework/ops/backend.h) and the contract of the
 * matching ch_op_* in framework/ops/ops.h; arguments were validated by
 * framework/ops/ops.c. ch_cuda_table_kernels (kernels.cu) puts them in the table.
 *
 * Layouts: activations PLAIN (NCHW, or 2-D (N,C)) or NHWC; the blocked
 * oneDNN layouts give CH_ERR_UNSUPPORTED naming the layout.
 * All work is queued on the compute stream (ch_cuda_stream); the host
 * waits only in count_correct (host result); cross_entropy's label check
 * is deferred (loss.cu).
 */
#ifndef COHORT_OPS_CUDA_KERNELS_H
#define COHORT_OPS_CUDA_KERNELS_H

#include "framework/ops/cuda/cuda_internal.h"

/* batchnorm.cu */
ch_status ch_cuda_bn_stats(void *st, const ch_tensor_t *x, ch_tensor_t *mean, ch_tensor_t *var);
ch_status ch_cuda_bn_apply(void *st, const ch_tensor_t *x, const ch_tensor_t *mean,
                           const ch_tensor_t *var, const ch_tensor_t *weight,
                           const ch_tensor_t *bias, float eps, ch_tensor_t *y);
ch_status ch_cuda_bn_update_running(void *st, ch_tensor_t *rm, ch_tensor_t *rv,
                                    const ch_tensor_t *mean, const ch_tensor_t *var,
                                    int64_t count, float momentum);
ch_status ch_cuda_bn_gather_stats(void *st, const ch_tensor_t *means, const ch_tensor_t *vars,
                                  const int64_t *counts, int nranks, ch_tensor_t *mean,
                                  ch_tensor_t *var);
ch_status ch_cuda_bn_backward_reduce(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                     const ch_tensor_t *mean, ch_tensor_t *sum_dy,
                                     ch_tensor_t *sum_dy_xmu);
ch_status ch_cuda_bn_param_grads(void *st, const ch_tensor_t *sum_dy,
                                 const ch_tensor_t *sum_dy_xmu, const ch_tensor_t *var,
                                 float eps, ch_tensor_t *dweight, ch_tensor_t *dbias);
ch_status ch_cuda_bn_backward_elemt(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                    const ch_tensor_t *mean, const ch_tensor_t *var, float eps,
                                    const ch_tensor_t *weight, const ch_tensor_t *sum_dy,
                                    const ch_tensor_t *sum_dy_xmu, int64_t total,
                                    ch_tensor_t *dx);
ch_status ch_cuda_bn_backward(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                              const ch_tensor_t *mean, const ch_tensor_t *var, float eps,
                              const ch_tensor_t *weight, ch_tensor_t *dx, ch_tensor_t *dweight,
                              ch_tensor_t *dbias);

/* loss.cu */
ch_status ch_cuda_cross_entropy(void *st, const ch_tensor_t *logits, const ch_tensor_t *labels,
                                ch_tensor_t *loss, ch_tensor_t *dlogits);
/* The deferred label check of the last ch_cuda_cross_entropy on st (see
 * loss.cu): CH_ERR_RANGE naming the sample and label when one was out of
 * range, else CH_OK; waits for that op's flag copy only. Run by the next
 * cross-entropy and by the backend's sync (ch_compute_sync). */
ch_status ch_cuda_loss_check(void *st);
ch_status ch_cuda_argmax(void *st, const ch_tensor_t *logits, ch_tensor_t *out);
ch_status ch_cuda_count_correct(void *st, const ch_tensor_t *logits, const ch_tensor_t *labels,
                                int64_t *correct);

/* sgd.cu */
ch_status ch_cuda_sgd_step(void *st, const ch_sgd_tensor_t *ts, int n,
                           const ch_sgd_hparams_t *h);

/* adamw_rmsprop.cu: AdamW, RMSprop (one launch per parameter) */
ch_status ch_cuda_adamw_step(void *st, const ch_adamw_tensor_t *ts, int n,
                             const ch_adamw_hparams_t *h);
ch_status ch_cuda_rmsprop_step(void *st, const ch_rmsprop_tensor_t *ts, int n,
                               const ch_rmsprop_hparams_t *h);
/* loss.cu: cross-entropy with label smoothing */
ch_status ch_cuda_cross_entropy_smooth(void *st, const ch_tensor_t *logits,
                                       const ch_tensor_t *labels, double e, ch_tensor_t *loss,
                                       ch_tensor_t *dlogits);

#endif /* COHORT_OPS_CUDA_KERNELS_H */
