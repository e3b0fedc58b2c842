/* cohort: optimizers. SGD with momentum, dampening, weight decay and
 * Nesterov momentum, exactly torch.optim.SGD (PyTorch 1.13,
 * _single_tensor_sgd, maximize=False):
 *
 *     g = grad + weight_decay * p
 *     if momentum != 0:
 *         buf = g                                   on the first step
 *         buf = momentum * buf + (1 - dampening) * g  afterwards
 *         g   = g + momentum * buf   if nesterov, else  g = buf
 *     p -= lr * g
 *
 * Arithmetic is float32 per element (as PyTorch's CPU kernels), one fused
 * loop per parameter. Only the parameters given to the optimizer are updated
 * (frozen parameters are never added: SEMANTICS.md "Frozen parameters are not
 * in the optimizer"). The momentum buffers are exposed by parameter name so a
 * resume file can store and restore them.
 */
#ifndef COHORT_OPTIM_H
#define COHORT_OPTIM_H

#include <stddef.h>

#include "framework/core/configuration.h"
#include "framework/core/status.h"
#include "framework/tensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ch_model ch_model_t;
typedef struct ch_compute ch_compute_t;

typedef struct {
    double lr;           /* learning rate, >= 0 */
    double momentum;     /* >= 0 (0 = plain SGD, no buffers) */
    double dampening;    /* in [0, 1]; PyTorch default 0 */
    double weight_decay; /* L2 penalty added to the gradient, >= 0 */
    int nesterov;        /* nonzero: Nesterov momentum (needs momentum > 0, dampening 0) */
} ch_sgd_options_t;

typedef struct ch_sgd ch_sgd_t;

/* The optimizer's config keys (a job lists them as its "optimizer" table):
 *   optimizer.lr            float, base learning rate PER RANK (default
 *                           0.01, [0, 1e3]); the training job uses
 *                           lr x world size (linear scaling rule)
 *   optimizer.momentum      float (default 0.9, [0, 1e3])
 *   optimizer.dampening     float (default 0, [0, 1])
 *   optimizer.weight_decay  float (default 0.005, [0, 1e3])
 *   optimizer.nesterov      bool (default false)
 */
ch_config_table_t ch_sgd_config_table(void);

/* Options from those keys (PETSc's set-from-options); o->lr is the per-rank
 * optimizer.lr (scale it by the world size before ch_sgd_create).
 * Errors: CH_ERR_CONFIG for nesterov without momentum > 0 and dampening 0
 * (the message names optimizer.nesterov and both values), CH_ERR_INVALID
 * for a key missing from cfg's table. */
ch_status ch_sgd_options_from_config(const ch_config_t *cfg, ch_sgd_options_t *o);

/* Create an SGD optimizer with no parameters. CH_ERR_INVALID for values
 * PyTorch rejects (negative lr/momentum/weight_decay, nesterov with
 * momentum <= 0 or dampening != 0) and for non-finite values. */
ch_status ch_sgd_create(const ch_sgd_options_t *opts, ch_sgd_t **out);
void ch_sgd_destroy(ch_sgd_t *sgd);

/* Add one parameter: `numel` float32 values at `data`, gradient at `grad`
 * (read at each step; same length), under `name` (copied; used to find the
 * momentum buffer; must be unique). The momentum buffer (numel floats) is
 * allocated here, never in ch_sgd_step. */
ch_status ch_sgd_add_param(ch_sgd_t *sgd, const char *name, float *data,
                           const float *grad, size_t numel);

/* As ch_sgd_add_param for parameters living on (dev, dev_index): data and
 * grad are device pointers for CH_DEV_CUDA, and the momentum buffer is
 * allocated (zero-filled) in device memory of that GPU, with a host copy
 * for ch_sgd_buffer. All parameters of one optimizer must live on the same
 * device (CH_ERR_INVALID otherwise). */
ch_status ch_sgd_add_param_on(ch_sgd_t *sgd, const char *name, float *data, const float *grad,
                              size_t numel, ch_devkind_t dev, int dev_index);

/* Add every parameter of `model` whose requires_grad is set, in parameter
 * order (torch: SGD(filter(lambda p: p.requires_grad, model.parameters()))),
 * where the model computes (ch_model_device; dev_data/dev_grad): call after
 * freezing and after ch_model_to_device. */
ch_status ch_sgd_add_model(ch_sgd_t *sgd, ch_model_t *model);

/* The compute context a GPU optimizer queues its step on (not owned; must
 * outlive the optimizer's steps). Needed for parameters on CH_DEV_CUDA;
 * the CPU path ignores it. */
void ch_sgd_set_compute(ch_sgd_t *sgd, ch_compute_t *cx);

/* One update of every parameter from its current gradient. CPU: the loops
 * above, done on return. GPU: ONE fused ch_op_sgd_step (ops.h) over all
 * parameters, queued on the compute stream of ch_sgd_set_compute's context
 * (CH_ERR_INVALID without one); float32 arithmetic per element in the same
 * order. */
ch_status ch_sgd_step(ch_sgd_t *sgd);

/* Learning rate used by the next step (the LR schedule sets it per epoch). */
void ch_sgd_set_lr(ch_sgd_t *sgd, double lr);
double ch_sgd_get_lr(const ch_sgd_t *sgd);
const ch_sgd_options_t *ch_sgd_options(const ch_sgd_t *sgd);

/* Momentum buffers, for the resume file. Parameter i (0 <= i < count) in the
 * order added. *buf is NULL and *has_buf 0 when momentum is 0 or before the
 * first step (PyTorch's state then has no 'momentum_buffer'). A GPU
 * optimizer copies the device buffer into a host copy first (synchronous,
 * ch_device_memcpy) and returns that; errors CH_ERR_CUDA. */
int ch_sgd_num_params(const ch_sgd_t *sgd);
ch_status ch_sgd_buffer(const ch_sgd_t *sgd, int i, const char **name,
                        const float **buf, size_t *numel, int *has_buf);

/* Restore the momentum buffer of parameter `name` from `numel` host floats
 * (copied to the device for a GPU optimizer; marks it as started, so the
 * next step uses buf = momentum*buf + ...).
 * CH_ERR_INVALID for an unknown name, a length mismatch, or momentum == 0. */
ch_status ch_sgd_load_buffer(ch_sgd_t *sgd, const char *name, const float *data,
                             size_t numel);

/* Forget all momentum buffers (the next step starts them again with buf = g). */
void ch_sgd_reset(ch_sgd_t *sgd);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_OPTIM_H */
