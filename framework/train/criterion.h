/* cohort: the training criterion (loss) and its config keys.
 *
 * torch.nn.CrossEntropyLoss(label_smoothing=e) with mean reduction over the
 * local batch (PyTorch 1.13): loss = (1 - e) * nll + e * mean over classes
 * of -log_softmax (framework/ops/ops.h ch_op_cross_entropy_smooth has the
 * formula, its gradient and its numerics). e = 0 is the plain
 * ch_op_cross_entropy, bitwise.
 */
#ifndef COHORT_TRAIN_CRITERION_H
#define COHORT_TRAIN_CRITERION_H

#include "framework/core/configuration.h"
#include "framework/core/status.h"
#include "framework/ops/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    double label_smoothing; /* e in [0, 1]; 0 = no smoothing */
} ch_loss_options_t;

/* The loss's keys (a job lists them as its "loss" table):
 *   loss.label_smoothing  float (default 0, [0, 1])
 */
ch_config_table_t ch_loss_config_table(void);

/* Options from those keys. CH_ERR_INVALID for a key missing from cfg's table. */
ch_status ch_loss_options_from_config(const ch_config_t *cfg, ch_loss_options_t *o);

/* The loss (and dlogits, may be NULL) of one batch: logits (N,K) float32
 * PLAIN, labels (N) int64, loss (1) float32, as ch_op_cross_entropy_smooth
 * (o NULL: no smoothing). Errors: those of the op. */
ch_status ch_loss_cross_entropy(ch_compute_t *cx, const ch_loss_options_t *o,
                                const ch_tensor_t *logits, const ch_tensor_t *labels,
                                ch_tensor_t *loss, ch_tensor_t *dlogits);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_TRAIN_CRITERION_H */
