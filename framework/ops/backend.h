/* cohort: internal interface between framework/ops/ops.c (backend-neutral
 * argument checking and dispatch) and the backends under framework/ops/.
 *
 * Not installed. ops.c validates every argument (shapes, dtypes, devices,
 * layouts) before calling a backend, so backend functions may assume valid
 * input. A backend fills a ch_ops_backend_t; ops.c picks the table by the
 * device of the op's tensors. The CPU table is ch_ops_cpu_backend()
 * (framework/ops/cpu/); the GPU one is ch_ops_cuda_backend(), which a build
 * without CUDA defines to return NULL (framework/ops/cuda_nocuda.c).
 */
#ifndef COHORT_OPS_BACKEND_H
#define COHORT_OPS_BACKEND_H

#include "framework/ops/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ch_ops_backend {
    const char *name;
    ch_status (*create)(void **state, const ch_compute_options_t *opts);
    void (*destroy)(void *state);
    ch_status (*set_num_threads)(void *state, int n);
    int (*num_threads)(const void *state);
    ch_layout_t (*preferred_layout)(const void *state, int64_t channels);
    void (*describe)(const void *state, char *buf, size_t len);
    size_t (*cache_entries)(const void *state);
    size_t (*scratchpad_bytes)(const void *state);
    /* ch_compute_weight_conversions' counters; NULL when the backend never
     * converts weights (both count 0) */
    void (*weight_conversions)(const void *state, int64_t *converted, int64_t *reused);
    /* ch_compute_winograd_primitives' count; NULL when the backend never
     * picks a Winograd kernel itself. */
    int64_t (*winograd_primitives)(const void *state);
    ch_status (*sync)(void *state);

    ch_status (*reorder)(void *st, const ch_tensor_t *src, ch_tensor_t *dst);
    ch_status (*fill)(void *st, ch_tensor_t *t, float value); /* value 0 for any dtype */
    ch_status (*copy)(void *st, const ch_tensor_t *src, ch_tensor_t *dst);

    ch_status (*conv2d_forward)(void *st, const ch_tensor_t *x, const ch_tensor_t *w,
                                const ch_tensor_t *b, const ch_conv2d_params_t *p,
                                ch_tensor_t *y);
    ch_status (*conv2d_backward_data)(void *st, const ch_tensor_t *dy, const ch_tensor_t *w,
                                      const ch_conv2d_params_t *p, ch_tensor_t *dx);
    ch_status (*conv2d_backward_weights)(void *st, const ch_tensor_t *x,
                                         const ch_tensor_t *dy,
                                         const ch_conv2d_params_t *p, ch_tensor_t *dw,
                                         ch_tensor_t *db);
    /* optional (NULL: ops.c runs backward weights, then backward data) */
    ch_status (*conv2d_backward)(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                 const ch_tensor_t *w, const ch_conv2d_params_t *p,
                                 ch_tensor_t *dx, ch_tensor_t *dw, ch_tensor_t *db);

    ch_status (*bn_stats)(void *st, const ch_tensor_t *x, ch_tensor_t *mean, ch_tensor_t *var);
    ch_status (*bn_apply)(void *st, const ch_tensor_t *x, const ch_tensor_t *mean,
                          const ch_tensor_t *var, const ch_tensor_t *weight,
                          const ch_tensor_t *bias, float eps, ch_tensor_t *y);
    ch_status (*bn_update_running)(void *st, ch_tensor_t *rm, ch_tensor_t *rv,
                                   const ch_tensor_t *mean, const ch_tensor_t *var,
                                   int64_t count, float momentum);
    ch_status (*bn_gather_stats)(void *st, const ch_tensor_t *means, const ch_tensor_t *vars,
                                 const int64_t *counts, int nranks, ch_tensor_t *mean,
                                 ch_tensor_t *var);
    ch_status (*bn_backward_reduce)(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                    const ch_tensor_t *mean, ch_tensor_t *sum_dy,
                                    ch_tensor_t *sum_dy_xmu);
    ch_status (*bn_param_grads)(void *st, const ch_tensor_t *sum_dy,
                                const ch_tensor_t *sum_dy_xmu, const ch_tensor_t *var,
                                float eps, ch_tensor_t *dweight, ch_tensor_t *dbias);
    ch_status (*bn_backward_elemt)(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                   const ch_tensor_t *mean, const ch_tensor_t *var, float eps,
                                   const ch_tensor_t *weight, const ch_tensor_t *sum_dy,
                                   const ch_tensor_t *sum_dy_xmu, int64_t total,
                                   ch_tensor_t *dx);
    /* full local backward; dx, dweight, dbias each may be NULL */
    ch_status (*bn_backward)(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                             const ch_tensor_t *mean, const ch_tensor_t *var, float eps,
                             const ch_tensor_t *weight, ch_tensor_t *dx, ch_tensor_t *dweight,
                             ch_tensor_t *dbias);

    ch_status (*relu_forward)(void *st, const ch_tensor_t *x, ch_tensor_t *y);
    ch_status (*relu_backward)(void *st, const ch_tensor_t *y, const ch_tensor_t *dy,
                               ch_tensor_t *dx);

    ch_status (*maxpool_forward)(void *st, const ch_tensor_t *x, const ch_pool2d_params_t *p,
                                 ch_tensor_t *y);
    ch_status (*maxpool_backward)(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                                  const ch_pool2d_params_t *p, ch_tensor_t *dx);
    ch_status (*avgpool_global_forward)(void *st, const ch_tensor_t *x, ch_tensor_t *y);
    ch_status (*avgpool_global_backward)(void *st, const ch_tensor_t *dy, ch_tensor_t *dx);

    ch_status (*linear_forward)(void *st, const ch_tensor_t *x, const ch_tensor_t *w,
                                const ch_tensor_t *b, ch_tensor_t *y);
    ch_status (*linear_backward_data)(void *st, const ch_tensor_t *dy, const ch_tensor_t *w,
                                      ch_tensor_t *dx);
    ch_status (*linear_backward_weights)(void *st, const ch_tensor_t *x,
                                         const ch_tensor_t *dy, ch_tensor_t *dw,
                                         ch_tensor_t *db);

    ch_status (*add)(void *st, const ch_tensor_t *a, const ch_tensor_t *b, ch_tensor_t *out);
    ch_status (*scale)(void *st, ch_tensor_t *t, float alpha);

    ch_status (*cross_entropy)(void *st, const ch_tensor_t *logits, const ch_tensor_t *labels,
                               ch_tensor_t *loss, ch_tensor_t *dlogits);
    ch_status (*argmax)(void *st, const ch_tensor_t *logits, ch_tensor_t *out);
    ch_status (*count_correct)(void *st, const ch_tensor_t *logits, const ch_tensor_t *labels,
                               int64_t *correct);

    /* fused SGD over n parameters (ops.h ch_op_sgd_step; arguments checked) */
    ch_status (*sgd_step)(void *st, const ch_sgd_tensor_t *ts, int n,
                          const ch_sgd_hparams_t *h);
    /* fused AdamW / RMSprop over n parameters (ops.h; arguments checked) */
    ch_status (*adamw_step)(void *st, const ch_adamw_tensor_t *ts, int n,
                            const ch_adamw_hparams_t *h);
    ch_status (*rmsprop_step)(void *st, const ch_rmsprop_tensor_t *ts, int n,
                              const ch_rmsprop_hparams_t *h);
    /* cross-entropy with label smoothing e in (0, 1] (ops.h ch_op_cross_entropy_smooth) */
    ch_status (*cross_entropy_smooth)(void *st, const ch_tensor_t *logits,
                                      const ch_tensor_t *labels, double e, ch_tensor_t *loss,
                                      ch_tensor_t *dlogits);
    /* average pooling (ops.h ch_op_avgpool2d_*) and adaptive average pooling
     * to y's (Ho, Wo) (ch_op_adaptive_avgpool2d_*, never 1x1: ops.c sends
     * that to avgpool_global_*); NULL: CH_ERR_UNSUPPORTED */
    ch_status (*avgpool_forward)(void *st, const ch_tensor_t *x, const ch_pool2d_params_t *p,
                                 ch_tensor_t *y);
    ch_status (*avgpool_backward)(void *st, const ch_tensor_t *dy, const ch_pool2d_params_t *p,
                                  ch_tensor_t *dx);
    ch_status (*adaptive_avgpool_forward)(void *st, const ch_tensor_t *x, ch_tensor_t *y);
    ch_status (*adaptive_avgpool_backward)(void *st, const ch_tensor_t *dy, ch_tensor_t *dx);
    /* compute stream (cudaStream_t) or NULL (CPU) */
    void *(*stream)(void *st);
    /* async host->device copy on the copy stream and the wait for it
     * (ops.h ch_op_upload_async / ch_compute_wait_upload); NULL for the CPU */
    ch_status (*upload_async)(void *st, const ch_tensor_t *src, ch_tensor_t *dst);
    ch_status (*wait_upload)(void *st);

    /* activations and LayerNorm2d (ops.h ch_op_act_*, ch_op_layernorm2d_*;
     * arguments checked) */
    ch_status (*act_forward)(void *st, const ch_act_params_t *p, const ch_tensor_t *x,
                             ch_tensor_t *y);
    ch_status (*act_backward)(void *st, const ch_act_params_t *p, const ch_tensor_t *x,
                              const ch_tensor_t *dy, ch_tensor_t *dx);
    ch_status (*ln2d_forward)(void *st, const ch_tensor_t *x, const ch_tensor_t *weight,
                              const ch_tensor_t *bias, float eps, ch_tensor_t *y,
                              ch_tensor_t *mean, ch_tensor_t *rstd);
    ch_status (*ln2d_backward)(void *st, const ch_tensor_t *x, const ch_tensor_t *dy,
                               const ch_tensor_t *mean, const ch_tensor_t *rstd,
                               const ch_tensor_t *weight, ch_tensor_t *dx, ch_tensor_t *dweight,
                               ch_tensor_t *dbias);
    /* ops.h ch_op_dropout (arguments checked); NULL: not available */
    ch_status (*dropout)(void *st, const ch_tensor_t *x, float p, const ch_dropout_key_t *key,
                         ch_tensor_t *y);
    /* channel ops (ops.h ch_op_mul_channel*, ch_op_concat_channels,
     * ch_op_split_channels; arguments checked); NULL: CH_ERR_UNSUPPORTED */
    ch_status (*mul_channel)(void *st, const ch_tensor_t *x, const ch_tensor_t *s, ch_tensor_t *y);
    ch_status (*mul_channel_backward)(void *st, const ch_tensor_t *x, const ch_tensor_t *s,
                                      const ch_tensor_t *dy, ch_tensor_t *dx, ch_tensor_t *ds);
    ch_status (*concat_channels)(void *st, const ch_tensor_t *const *xs, int n, ch_tensor_t *y);
    ch_status (*split_channels)(void *st, const ch_tensor_t *dy, ch_tensor_t *const *dxs, int n);
    /* graph ops (ops.h ch_op_binary*, ch_op_copy_channels, ch_op_channel_shuffle,
     * ch_op_affine; arguments checked); NULL: CH_ERR_UNSUPPORTED */
    ch_status (*binary)(void *st, int op, const ch_tensor_t *a, const ch_tensor_t *b,
                        ch_tensor_t *y);
    ch_status (*binary_backward)(void *st, int op, const ch_tensor_t *a, const ch_tensor_t *b,
                                 const ch_tensor_t *dy, ch_tensor_t *da, ch_tensor_t *db);
    ch_status (*copy_channels)(void *st, const ch_tensor_t *src, int64_t src_c0, ch_tensor_t *dst,
                               int64_t dst_c0, int64_t n);
    ch_status (*channel_shuffle)(void *st, const ch_tensor_t *x, int groups, ch_tensor_t *y);
    ch_status (*affine)(void *st, const ch_tensor_t *x, float alpha, float beta, ch_tensor_t *y);
} ch_ops_backend_t;

/* The CPU backend (always built). */
const ch_ops_backend_t *ch_ops_cpu_backend(void);

/* The GPU backend, or NULL when cohort was built without CUDA. */
const ch_ops_backend_t *ch_ops_cuda_backend(void);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_OPS_BACKEND_H */
