/* cohort: learning-rate schedules of torchvision's classification recipes
 * (references/classification/train.py), stepped once per epoch after
 * training, as there: lr(e) is the rate used during epoch e (0-based).
 *
 * Main schedules (torch.optim.lr_scheduler, PyTorch 1.13):
 *   cosine     the seed recipe's LambdaLR (framework/train/lr_schedule.h):
 *              lr(e) = base * (((1 + cos(e pi / E)) / 2) (1 - lrf) + lrf)
 *   step       StepLR(step_size, gamma): lr(e) = lr(e-1) * gamma when
 *              e % step_size == 0 (e > 0), else lr(e-1)
 *   multistep  MultiStepLR(milestones, gamma): lr(e) = lr(e-1) * gamma^c,
 *              c = how often e is in milestones
 *   cosine_annealing  CosineAnnealingLR(T_max = E, eta_min = lr_min),
 *              torchvision's "cosineannealinglr": lr(0) = base, then
 *              lr(e) = (1 + cos(pi e / E)) / (1 + cos(pi (e-1) / E))
 *                      * (lr(e-1) - lr_min) + lr_min,
 *              or lr(e-1) + (base - lr_min)(1 - cos(pi / E)) / 2 when
 *              (e - 1 - E) mod 2E == 0 (past the end the cosine goes up again)
 * StepLR, MultiStepLR and CosineAnnealingLR are recursive in PyTorch (get_lr
 * works on the group's current lr); cohort computes them the same way, one
 * epoch at a time in double from the start, so the rates are PyTorch's bit
 * for bit.
 *
 * Warmup (warmup_epochs W > 0), as train.py builds it:
 *   SequentialLR([warmup, main], milestones=[W]) with warmup
 *     linear    LinearLR(start_factor=f, total_iters=W):
 *               lr(0) = base * f, lr(e) = lr(e-1) * (1 + (1 - f) /
 *               (W f + (e - 1)(1 - f))) for 0 < e <= W
 *     constant  ConstantLR(factor=f, total_iters=W): lr(e) = base * f for e < W
 *   and the main schedule restarted at epoch W (its epoch e - W; at the
 *   hand-over SequentialLR calls main.step(0), which starts from base — for
 *   cosine_annealing from its closed form lr_min + (base - lr_min) * 2 / 2 —
 *   and for both cosines E is epochs - W, as train.py's
 *   T_max = epochs - lr_warmup_epochs).
 *   W = 0: the main schedule alone; cosine is then exactly ch_lr_cosine_at.
 */
#ifndef COHORT_SCHEDULE_H
#define COHORT_SCHEDULE_H

#include "framework/core/configuration.h"
#include "framework/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CH_LR_COSINE = 0,
    CH_LR_STEP,
    CH_LR_MULTISTEP,
    CH_LR_COSINE_ANNEALING
} ch_lr_schedule_kind_t;
typedef enum { CH_LR_WARMUP_LINEAR = 0, CH_LR_WARMUP_CONSTANT } ch_lr_warmup_method_t;

#define CH_LR_MAX_MILESTONES 32

typedef struct {
    ch_lr_schedule_kind_t kind;
    double base_lr;     /* after linear scaling by the world size, >= 0 */
    int epochs;         /* epochs trained (> 0); cosine spans epochs - warmup_epochs */
    double lrf;         /* cosine: final fraction of base_lr, [0, 1] */
    double lr_min;      /* cosine_annealing: eta_min, >= 0 */
    int step_size;      /* step: > 0 */
    double gamma;       /* step, multistep: > 0 */
    int milestones[CH_LR_MAX_MILESTONES]; /* multistep: epochs of the main schedule, > 0, */
    int n_milestones;                     /* non-decreasing (repeats multiply again) */
    int warmup_epochs;  /* >= 0, < epochs for cosine */
    ch_lr_warmup_method_t warmup_method;
    double warmup_factor; /* start factor (linear) or factor (constant), (0, 1] */
} ch_lr_schedule_options_t;

typedef struct {
    ch_lr_schedule_options_t o;
    int epoch; /* epochs stepped so far */
} ch_lr_schedule_t;

/* The keys beside ch_lr_cosine_config_table()'s schedule.epochs and
 * schedule.lrf (a job lists both tables):
 *   schedule.name            string cosine | step | multistep | cosine_annealing
 *                            (default cosine)
 *   schedule.warmup_epochs   int (default 0, [0, 1e6])
 *   schedule.warmup_method   string linear | constant (default constant, as
 *                            train.py's --lr-warmup-method)
 *   schedule.warmup_factor   float (default 0.01, (0, 1]; torchvision's lr_warmup_decay)
 *   schedule.step_size       int (default 30, [1, 1e6])
 *   schedule.gamma           float (default 0.1, [0, 1e3])
 *   schedule.milestones      list of epochs (default "", e.g. "30,60,80")
 *   schedule.lr_min          float (default 0, [0, 1e3]; torchvision's lr_min)
 */
ch_config_table_t ch_lr_schedule_config_table(void);

/* Options from both tables with base_lr. Errors: CH_ERR_CONFIG naming the
 * key for a milestone that is not an integer > 0 or decreasing, more than
 * CH_LR_MAX_MILESTONES, multistep without milestones; those of
 * ch_lr_schedule_init; CH_ERR_INVALID for a key missing from cfg's tables. */
ch_status ch_lr_schedule_options_from_config(const ch_config_t *cfg, double base_lr,
                                             ch_lr_schedule_options_t *o);

/* Initialise at epoch 0. CH_ERR_INVALID for values outside the ranges
 * above (each message names the field and value). */
ch_status ch_lr_schedule_init(ch_lr_schedule_t *s, const ch_lr_schedule_options_t *o);

/* lr(epoch) of the schedule (pure; epoch >= 0, may exceed epochs). */
double ch_lr_schedule_at(const ch_lr_schedule_options_t *o, int epoch);

/* Rate of the current epoch; advance one epoch (scheduler.step()) and
 * return the new rate; jump to an epoch (resume; CH_ERR_INVALID if < 0). */
double ch_lr_schedule_get(const ch_lr_schedule_t *s);
double ch_lr_schedule_step(ch_lr_schedule_t *s);
ch_status ch_lr_schedule_set_epoch(ch_lr_schedule_t *s, int epoch);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_SCHEDULE_H */
