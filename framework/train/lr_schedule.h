/* cohort: learning-rate schedules.
 *
 * The seed recipe's cosine schedule, a torch.optim.lr_scheduler.LambdaLR with
 *     lf(e) = ((1 + cos(e * pi / epochs)) / 2) * (1 - lrf) + lrf
 * so that lr(e) = base_lr * lf(e): base_lr at epoch 0, base_lr * lrf at
 * epoch == epochs. LambdaLR is stepped once per epoch after training, so the
 * lr used during epoch e (0-based) is lr(e).
 */
#ifndef COHORT_LR_SCHEDULE_H
#define COHORT_LR_SCHEDULE_H

#include "framework/core/configuration.h"
#include "framework/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    double base_lr; /* learning rate at epoch 0 (after linear scaling by world size) */
    double lrf;     /* final fraction of base_lr, in [0, 1] */
    int epochs;     /* schedule length, > 0 */
    int epoch;      /* epochs stepped so far (LambdaLR's last_epoch) */
} ch_lr_cosine_t;

/* The schedule's config keys (a job lists them as its "schedule" table):
 *   schedule.epochs  int, schedule length and epochs to train (default 5,
 *                    [1, 1e6])
 *   schedule.lrf     float, final learning-rate fraction (default 0.1, [0, 1])
 */
ch_config_table_t ch_lr_cosine_config_table(void);

/* Initialise *s at epoch 0 from those keys with base_lr (the optimizer's lr
 * after linear scaling). Errors: as ch_lr_cosine_init; CH_ERR_INVALID for a
 * key missing from cfg's table. */
ch_status ch_lr_cosine_from_config(const ch_config_t *cfg, double base_lr, ch_lr_cosine_t *s);

/* lr(e) = base_lr * (((1 + cos(e * pi / epochs)) / 2) * (1 - lrf) + lrf).
 * Pure function; e may exceed epochs (the cosine continues, as in PyTorch). */
double ch_lr_cosine_at(double base_lr, double lrf, int epochs, int epoch);

/* Initialise at epoch 0. CH_ERR_INVALID when epochs <= 0, base_lr < 0 or
 * lrf outside [0, 1] (or not finite). */
ch_status ch_lr_cosine_init(ch_lr_cosine_t *s, double base_lr, double lrf, int epochs);

/* The learning rate for the current epoch (s->epoch). */
double ch_lr_cosine_get(const ch_lr_cosine_t *s);

/* Advance one epoch (scheduler.step()) and return the new learning rate. */
double ch_lr_cosine_step(ch_lr_cosine_t *s);

/* Jump to epoch e (resume). CH_ERR_INVALID when e < 0. */
ch_status ch_lr_cosine_set_epoch(ch_lr_cosine_t *s, int epoch);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_LR_SCHEDULE_H */
