/* cohort: torchvision-recipe LR schedules (see schedule.h). */
#include "config.h"

#include "framework/train/schedule.h"

#include "framework/train/lr_schedule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const schedule_names[] = {"cosine", "step", "multistep", "cosine_annealing"};
static const char *const warmup_names[] = {"linear", "constant"}; /* ch_lr_warmup_method_t */

static const ch_config_key_t schedule_keys[] = {
    {"schedule.name", CH_CFG_STRING, "cosine", CH_CFG_NO_RANGE,
     "LR schedule: cosine (LambdaLR), step (StepLR), multistep (MultiStepLR) or "
     "cosine_annealing (CosineAnnealingLR)."},
    {"schedule.warmup_epochs", CH_CFG_INT, "0", 0, 1e6,
     "Warmup epochs before the main schedule (SequentialLR), 0 = none."},
    {"schedule.warmup_method", CH_CFG_STRING, "constant", CH_CFG_NO_RANGE,
     "Warmup: linear (LinearLR) or constant (ConstantLR; torchvision's default)."},
    {"schedule.warmup_factor", CH_CFG_FLOAT, "0.01", 0, 1,
     "Warmup start factor (linear) or factor (constant) of the base lr."},
    {"schedule.step_size", CH_CFG_INT, "30", 1, 1e6, "StepLR: epochs between decays."},
    {"schedule.gamma", CH_CFG_FLOAT, "0.1", 0, 1e3, "StepLR / MultiStepLR decay factor."},
    {"schedule.milestones", CH_CFG_STRLIST, "", CH_CFG_NO_RANGE,
     "MultiStepLR: epochs of the main schedule at which lr *= gamma, e.g. 30,60,80."},
    {"schedule.lr_min", CH_CFG_FLOAT, "0", 0, 1e3, "CosineAnnealingLR's eta_min."},
};

ch_config_table_t ch_lr_schedule_config_table(void)
{
    ch_config_table_t t = {"schedule", schedule_keys,
                           (int)(sizeof schedule_keys / sizeof schedule_keys[0])};
    return t;
}

ch_status ch_lr_schedule_options_from_config(const ch_config_t *cfg, double base_lr,
                                             ch_lr_schedule_options_t *o)
{
    memset(o, 0, sizeof *o);
    int kind, wm;
    CH_TRY(ch_config_get_choice(cfg, "schedule.name", schedule_names, 4, &kind));
    CH_TRY(ch_config_get_choice(cfg, "schedule.warmup_method", warmup_names, 2, &wm));
    o->kind = (ch_lr_schedule_kind_t)kind;
    o->warmup_method = (ch_lr_warmup_method_t)wm;
    o->base_lr = base_lr;
    CH_TRY(ch_config_get_int(cfg, "schedule.epochs", &o->epochs));
    CH_TRY(ch_config_get_double(cfg, "schedule.lrf", &o->lrf));
    CH_TRY(ch_config_get_int(cfg, "schedule.warmup_epochs", &o->warmup_epochs));
    CH_TRY(ch_config_get_double(cfg, "schedule.warmup_factor", &o->warmup_factor));
    CH_TRY(ch_config_get_int(cfg, "schedule.step_size", &o->step_size));
    CH_TRY(ch_config_get_double(cfg, "schedule.gamma", &o->gamma));
    CH_TRY(ch_config_get_double(cfg, "schedule.lr_min", &o->lr_min));
    const char *const *ms;
    int n;
    CH_TRY(ch_config_get_strlist(cfg, "schedule.milestones", &ms, &n));
    const char *src = ch_config_source(cfg, "schedule.milestones");
    if (n > CH_LR_MAX_MILESTONES)
        return CH_ERROR(CH_ERR_CONFIG, "schedule.milestones (%s): %d milestones, at most %d", src,
                        n, CH_LR_MAX_MILESTONES);
    for (int i = 0; i < n; i++) {
        char *end;
        long v = strtol(ms[i], &end, 10);
        if (end == ms[i] || *end || v <= 0 || v > 1000000 ||
            (i > 0 && v < o->milestones[i - 1]))
            return CH_ERROR(CH_ERR_CONFIG, "schedule.milestones (%s): '%s' is not an epoch > 0 "
                            "at or after the one before", src, ms[i]);
        o->milestones[i] = (int)v;
    }
    o->n_milestones = n;
    if (o->kind == CH_LR_MULTISTEP && n == 0)
        return CH_ERROR(CH_ERR_CONFIG, "schedule.name = multistep needs schedule.milestones "
                        "(e.g. \"30,60,80\")");
    ch_lr_schedule_t s;
    return ch_lr_schedule_init(&s, o);
}

ch_status ch_lr_schedule_init(ch_lr_schedule_t *s, const ch_lr_schedule_options_t *o)
{
    CH_REQUIRE(s && o, "ch_lr_schedule_init: NULL argument");
    CH_REQUIRE((unsigned)o->kind < 4, "LR schedule: unknown kind %d", (int)o->kind);
    CH_REQUIRE(isfinite(o->base_lr) && o->base_lr >= 0.0,
               "LR schedule: base lr = %g, expected a finite value >= 0", o->base_lr);
    CH_REQUIRE(o->epochs > 0, "LR schedule: epochs = %d, expected > 0", o->epochs);
    CH_REQUIRE(o->warmup_epochs >= 0, "LR schedule: warmup_epochs = %d, expected >= 0",
               o->warmup_epochs);
    CH_REQUIRE(o->warmup_epochs == 0 ||
                   (o->warmup_factor > 0.0 && o->warmup_factor <= 1.0 &&
                    (unsigned)o->warmup_method < 2),
               "LR schedule: warmup_factor = %g, expected a value in (0, 1]", o->warmup_factor);
    if (o->kind == CH_LR_COSINE || o->kind == CH_LR_COSINE_ANNEALING)
        CH_REQUIRE(o->warmup_epochs < o->epochs,
                   "cosine schedule: warmup_epochs = %d leaves no epochs of %d for the cosine",
                   o->warmup_epochs, o->epochs);
    CH_REQUIRE(o->kind != CH_LR_COSINE_ANNEALING || (isfinite(o->lr_min) && o->lr_min >= 0.0),
               "cosine_annealing schedule: lr_min = %g, expected a finite value >= 0",
               o->lr_min);
    if (o->kind == CH_LR_COSINE) {
        CH_REQUIRE(isfinite(o->lrf) && o->lrf >= 0.0 && o->lrf <= 1.0,
                   "cosine schedule: lrf = %g, expected a value in [0, 1]", o->lrf);
    }
    CH_REQUIRE(o->kind != CH_LR_STEP || o->step_size > 0,
               "step schedule: step_size = %d, expected > 0", o->step_size);
    CH_REQUIRE(o->kind == CH_LR_COSINE || o->kind == CH_LR_COSINE_ANNEALING ||
                   (isfinite(o->gamma) && o->gamma > 0.0),
               "LR schedule: gamma = %g, expected > 0", o->gamma);
    CH_REQUIRE(o->n_milestones >= 0 && o->n_milestones <= CH_LR_MAX_MILESTONES,
               "multistep schedule: %d milestones, expected 0..%d", o->n_milestones,
               CH_LR_MAX_MILESTONES);
    for (int i = 0; i < o->n_milestones; i++)
        CH_REQUIRE(o->milestones[i] > 0 && (i == 0 || o->milestones[i] >= o->milestones[i - 1]),
                   "multistep schedule: milestone %d = %d, expected > 0 and not below the one "
                   "before", i, o->milestones[i]);
    s->o = *o;
    s->epoch = 0;
    return CH_OK;
}

/* CosineAnnealingLR at its own epoch m (PyTorch 1.13 get_lr, recursive;
 * the Python expressions in their order of evaluation). */
static double cosine_annealing_at(const ch_lr_schedule_options_t *o, int m)
{
    const int T = o->epochs - o->warmup_epochs;
    const double base = o->base_lr, eta = o->lr_min, dT = (double)T;
    /* alone: last_epoch 0 keeps group['lr']; after warmup SequentialLR's
     * main.step(0) takes _get_closed_form_lr at epoch 0 */
    double lr = o->warmup_epochs > 0 ? eta + (base - eta) * (1.0 + cos(M_PI * 0.0 / dT)) / 2.0
                                     : base;
    for (int k = 1; k <= m; k++) {
        const long r = ((long)k - 1 - T) % (2L * T);
        if (r == 0) /* Python's % of a negative number is >= 0: only r == 0 matters */
            lr = lr + (base - eta) * (1.0 - cos(M_PI / dT)) / 2.0;
        else
            lr = (1.0 + cos(M_PI * (double)k / dT)) / (1.0 + cos(M_PI * (double)(k - 1) / dT)) *
                     (lr - eta) +
                 eta;
    }
    return lr;
}

double ch_lr_schedule_at(const ch_lr_schedule_options_t *o, int epoch)
{
    const int W = o->warmup_epochs;
    const double base = o->base_lr, f = o->warmup_factor;
    if (epoch < W) {
        double lr = base * f; /* last_epoch 0: group['lr'] * start_factor */
        if (o->warmup_method == CH_LR_WARMUP_CONSTANT) return lr;
        for (int k = 1; k <= epoch; k++) /* LinearLR.get_lr, recursive */
            lr = lr * (1.0 + (1.0 - f) / ((double)W * f + (double)(k - 1) * (1.0 - f)));
        return lr;
    }
    const int m = epoch - W; /* the main schedule's own epoch */
    if (o->kind == CH_LR_COSINE) return ch_lr_cosine_at(base, o->lrf, o->epochs - W, m);
    if (o->kind == CH_LR_COSINE_ANNEALING) return cosine_annealing_at(o, m);
    double lr = base;
    for (int k = 1; k <= m; k++) {
        if (o->kind == CH_LR_STEP) {
            if (k % o->step_size == 0) lr = lr * o->gamma;
            continue;
        }
        int c = 0;
        for (int i = 0; i < o->n_milestones; i++) c += o->milestones[i] == k;
        if (c) lr = lr * pow(o->gamma, (double)c);
    }
    return lr;
}

double ch_lr_schedule_get(const ch_lr_schedule_t *s) { return ch_lr_schedule_at(&s->o, s->epoch); }

double ch_lr_schedule_step(ch_lr_schedule_t *s)
{
    s->epoch++;
    return ch_lr_schedule_get(s);
}

ch_status ch_lr_schedule_set_epoch(ch_lr_schedule_t *s, int epoch)
{
    CH_REQUIRE(s && epoch >= 0, "LR schedule: epoch = %d, expected >= 0", epoch);
    s->epoch = epoch;
    return CH_OK;
}
