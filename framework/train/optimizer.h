/* cohort: one optimizer interface over SGD, AdamW and RMSprop, with
 * PyTorch 1.13's update formulas (docs/train-numerics.md, "Optimizers").
 *
 *  sgd      torch.optim.SGD: the existing ch_sgd_t (framework/train/optim.h),
 *           wrapped; its steps and resume files are bitwise what ch_sgd_*
 *           gives.
 *  adamw    torch.optim.AdamW(lr, betas=(b1, b2), eps, weight_decay,
 *           amsgrad), _single_tensor_adamw: at step t (1, 2, ...)
 *             p *= 1 - lr * wd                          (decoupled decay first)
 *             m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 *             amsgrad: vmax = max(vmax, v), v' = vmax; else v' = v
 *             p -= (lr / (1 - b1^t)) * m / (sqrt(v') / sqrt(1 - b2^t) + eps)
 *  rmsprop  torch.optim.RMSprop(lr, alpha, eps, weight_decay, momentum,
 *           centered), _single_tensor_rmsprop:
 *             g += wd p;  v = alpha v + (1 - alpha) g^2
 *             centered: ga = alpha ga + (1 - alpha) g; avg = sqrt(v - ga^2) + eps
 *             else avg = sqrt(v) + eps
 *             momentum > 0: buf = momentum buf + g / avg; p -= lr buf
 *             else p -= lr g / avg
 * The exact float32 order of operations (incl. which steps are fused
 * multiply-adds, as ATen's CPU kernels do them) is in framework/ops/ops.h
 * (ch_op_adamw_step, ch_op_rmsprop_step); the scalars (bias corrections,
 * step size) are computed in double as PyTorch's Python code does and
 * rounded to float once.
 *
 * Parameters: as ch_sgd_t — host or device blocks (ch_model_t's dev_data /
 * dev_grad), only those that require a gradient (frozen parameters are not
 * in the optimizer), all on one device. GPU steps are queued on the compute
 * stream of ch_optimizer_set_compute's context; CPU steps are threaded over
 * elements and bitwise the same for any thread count; CPU and GPU AdamW /
 * RMSprop steps are bitwise equal. The state is allocated when a parameter
 * is added, never in a step. All parameters step together, so the one step
 * counter is every parameter's state['step'].
 *
 * State, by PyTorch's optimizer.state_dict() names, per parameter:
 *   sgd      momentum_buffer (momentum != 0; exists after the first step)
 *   adamw    exp_avg, exp_avg_sq, max_exp_avg_sq (amsgrad)
 *   rmsprop  square_avg, momentum_buffer (momentum > 0), grad_avg (centered)
 * plus "step" (ch_optimizer_steps). Before the first step (or after
 * ch_optimizer_reset) no parameter has state, as in PyTorch.
 */
#ifndef COHORT_OPTIMIZER_H
#define COHORT_OPTIMIZER_H

#include <stddef.h>
#include <stdint.h>

#include "framework/core/configuration.h"
#include "framework/core/status.h"
#include "framework/tensor/tensor.h"
#include "framework/train/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { CH_OPTIM_SGD = 0, CH_OPTIM_ADAMW, CH_OPTIM_RMSPROP } ch_optimizer_kind_t;

typedef struct {
    ch_optimizer_kind_t kind;
    double lr;           /* learning rate, >= 0 */
    double weight_decay; /* >= 0: L2 added to g (sgd, rmsprop), decoupled (adamw) */
    double momentum;     /* sgd, rmsprop; >= 0 */
    double dampening;    /* sgd */
    int nesterov;        /* sgd */
    double beta1, beta2; /* adamw, each in [0, 1) */
    int amsgrad;         /* adamw */
    double eps;          /* adamw, rmsprop; >= 0 */
    double alpha;        /* rmsprop smoothing constant, >= 0 */
    int centered;        /* rmsprop */
} ch_optimizer_options_t;

/* PyTorch's defaults for kind: sgd lr 0.01 (torch has none), momentum 0,
 * dampening 0, weight_decay 0; adamw lr 1e-3, betas (0.9, 0.999), eps 1e-8,
 * weight_decay 0.01; rmsprop lr 0.01, alpha 0.99, eps 1e-8, weight_decay 0,
 * momentum 0, not centered. */
void ch_optimizer_options_default(ch_optimizer_kind_t kind, ch_optimizer_options_t *o);

/* "sgd", "adamw", "rmsprop" (NULL for another value). */
const char *ch_optimizer_kind_name(ch_optimizer_kind_t kind);

/* The keys beside ch_sgd_config_table()'s optimizer.lr / momentum /
 * dampening / weight_decay / nesterov (a job lists both tables):
 *   optimizer.name      string sgd | adamw | rmsprop (default sgd)
 *   optimizer.betas     list of two floats in [0, 1) (default "0.9,0.999"; adamw)
 *   optimizer.eps       float (default 1e-8, [0, 1]; adamw, rmsprop)
 *   optimizer.alpha     float (default 0.99, [0, 1]; rmsprop)
 *   optimizer.centered  bool (default false; rmsprop)
 *   optimizer.amsgrad   bool (default false; adamw)
 */
ch_config_table_t ch_optimizer_config_table(void);

/* Options from both tables (PETSc's set-from-options). optimizer.lr is
 * per rank (scale it by the world size before create). For adamw and
 * rmsprop, optimizer.momentum and optimizer.weight_decay left at their
 * (SGD) defaults take PyTorch's default of that optimizer instead (adamw
 * weight_decay 0.01, rmsprop momentum 0 and weight_decay 0): a PyTorch user
 * writing optimizer.name = "adamw" gets torch.optim.AdamW(lr=...).
 * (A value set in a file or on the command line is used as given, also
 * for these two: jobs/train.cfg's weight_decay = 0.005 applies to adamw.)
 * Errors: CH_ERR_CONFIG naming the key for a key set to a value other than
 * its default that the chosen optimizer does not use (e.g. optimizer.betas
 * with sgd, optimizer.nesterov = true with adamw; a file repeating the
 * default is fine), for a betas list that is not two numbers in [0, 1), and
 * those of ch_sgd_options_from_config; CH_ERR_INVALID for a key missing
 * from cfg's tables. */
ch_status ch_optimizer_options_from_config(const ch_config_t *cfg, ch_optimizer_options_t *o);

typedef struct ch_optimizer ch_optimizer_t;

/* Create an optimizer with no parameters. CH_ERR_INVALID for values
 * PyTorch rejects (negative lr, eps, weight_decay, momentum, alpha; betas
 * outside [0, 1); sgd's nesterov rules), or not finite. */
ch_status ch_optimizer_create(const ch_optimizer_options_t *o, ch_optimizer_t **out);
void ch_optimizer_destroy(ch_optimizer_t *opt);

/* Add a parameter: numel float32 values at data (updated), gradient at grad
 * (read at each step), under a unique name (copied); host memory. The
 * state buffers are allocated (zero-filled) here. Errors: CH_ERR_INVALID
 * (NULL, duplicate name), CH_ERR_NOMEM. */
ch_status ch_optimizer_add_param(ch_optimizer_t *opt, const char *name, float *data,
                                 const float *grad, size_t numel);

/* As ch_optimizer_add_param on (dev, dev_index): device pointers and
 * device state for CH_DEV_CUDA. All parameters on one device
 * (CH_ERR_INVALID otherwise); CH_ERR_CUDA / CH_ERR_UNSUPPORTED from the
 * allocation. */
ch_status ch_optimizer_add_param_on(ch_optimizer_t *opt, const char *name, float *data,
                                    const float *grad, size_t numel, ch_devkind_t dev,
                                    int dev_index);

/* Every parameter of model with requires_grad, in parameter order, where the
 * model computes (call after freezing and ch_model_to_device). */
ch_status ch_optimizer_add_model(ch_optimizer_t *opt, ch_model_t *model);

/* The compute context GPU steps are queued on (not owned); CPU steps with a
 * context use its thread count. */
void ch_optimizer_set_compute(ch_optimizer_t *opt, ch_compute_t *cx);

/* One update of every parameter from its gradient with the current lr;
 * increments the step counter. GPU: queued, no wait. Errors: those of
 * ch_op_sgd_step / ch_op_adamw_step / ch_op_rmsprop_step (CH_ERR_INVALID
 * for GPU parameters without a compute context). */
ch_status ch_optimizer_step(ch_optimizer_t *opt);

/* Learning rate of the next steps (the LR schedule sets it per epoch). */
void ch_optimizer_set_lr(ch_optimizer_t *opt, double lr);
double ch_optimizer_get_lr(const ch_optimizer_t *opt);
const ch_optimizer_options_t *ch_optimizer_options(const ch_optimizer_t *opt);

/* The wrapped SGD optimizer of kind sgd (NULL for other kinds), for code
 * that still takes a ch_sgd_t (io/state's resume functions). */
ch_sgd_t *ch_optimizer_sgd(ch_optimizer_t *opt);

/* Steps taken (PyTorch's state['step']); set on resume (>= 0, CH_ERR_INVALID
 * otherwise). Setting it does not mark any state as present. */
int64_t ch_optimizer_steps(const ch_optimizer_t *opt);
ch_status ch_optimizer_set_steps(ch_optimizer_t *opt, int64_t steps);

/* Parameters (order added) and the state names this optimizer keeps per
 * parameter (as listed above, in that order; "step" is not among them). */
int ch_optimizer_num_params(const ch_optimizer_t *opt);
const char *ch_optimizer_param_name(const ch_optimizer_t *opt, int i);
int ch_optimizer_num_state(const ch_optimizer_t *opt);
const char *ch_optimizer_state_name(const ch_optimizer_t *opt, int j);

/* State j of parameter i as host floats (*numel of them, the parameter's
 * element count). *has 0 and *buf NULL while the parameter has no state
 * (before the first step). A GPU optimizer copies the device buffer to a
 * host copy first (synchronous). Errors: CH_ERR_INVALID for an index out of
 * range, CH_ERR_CUDA. */
ch_status ch_optimizer_state(const ch_optimizer_t *opt, int i, int j, const float **buf,
                             size_t *numel, int *has);

/* Restore state `state_name` of parameter `param_name` from numel host
 * floats; the parameter then has state (the next step continues from it).
 * Errors: CH_ERR_INVALID naming the parameter or state for an unknown name,
 * a state this configuration does not keep, or another length; CH_ERR_CUDA. */
ch_status ch_optimizer_load_state(ch_optimizer_t *opt, const char *param_name,
                                  const char *state_name, const float *data, size_t numel);

/* Forget all state (zero it; the step counter becomes 0). */
ch_status ch_optimizer_reset(ch_optimizer_t *opt);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_OPTIMIZER_H */
