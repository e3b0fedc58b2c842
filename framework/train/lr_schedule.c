/* cohort: cosine LambdaLR schedule of the seed recipe. */
#include "config.h"

#include "framework/train/lr_schedule.h"

#include <math.h>

double ch_lr_cosine_at(double base_lr, double lrf, int epochs, int epoch)
{
    double lf = ((1.0 + cos((double)epoch * M_PI / (double)epochs)) / 2.0) * (1.0 - lrf) + lrf;
    return base_lr * lf;
}

static const ch_config_key_t ch_lr_cosine_config_keys[] = {
    {"schedule.epochs", CH_CFG_INT, "5", 1, 1e6, "Epochs to train."},
    {"schedule.lrf", CH_CFG_FLOAT, "0.1", 0, 1, "Cosine schedule's final learning-rate fraction."},
};

ch_config_table_t ch_lr_cosine_config_table(void)
{
    ch_config_table_t t = {"schedule", ch_lr_cosine_config_keys, (int)(sizeof ch_lr_cosine_config_keys / sizeof ch_lr_cosine_config_keys[0])};
    return t;
}

ch_status ch_lr_cosine_from_config(const ch_config_t *cfg, double base_lr, ch_lr_cosine_t *s)
{
    int epochs;
    double lrf;
    CH_TRY(ch_config_get_int(cfg, "schedule.epochs", &epochs));
    CH_TRY(ch_config_get_double(cfg, "schedule.lrf", &lrf));
    return ch_lr_cosine_init(s, base_lr, lrf, epochs);
}

ch_status ch_lr_cosine_init(ch_lr_cosine_t *s, double base_lr, double lrf, int epochs)
{
    CH_REQUIRE(s, "ch_lr_cosine_init: schedule is NULL");
    CH_REQUIRE(epochs > 0, "cosine schedule: epochs = %d, expected > 0", epochs);
    CH_REQUIRE(isfinite(base_lr) && base_lr >= 0.0,
               "cosine schedule: base lr = %g, expected a finite value >= 0", base_lr);
    CH_REQUIRE(isfinite(lrf) && lrf >= 0.0 && lrf <= 1.0,
               "cosine schedule: lrf = %g, expected a value in [0, 1]", lrf);
    s->base_lr = base_lr;
    s->lrf = lrf;
    s->epochs = epochs;
    s->epoch = 0;
    return CH_OK;
}

double ch_lr_cosine_get(const ch_lr_cosine_t *s)
{
    return ch_lr_cosine_at(s->base_lr, s->lrf, s->epochs, s->epoch);
}

double ch_lr_cosine_step(ch_lr_cosine_t *s)
{
    s->epoch++;
    return ch_lr_cosine_get(s);
}

ch_status ch_lr_cosine_set_epoch(ch_lr_cosine_t *s, int epoch)
{
    CH_REQUIRE(epoch >= 0, "cosine schedule: epoch = %d, expected >= 0", epoch);
    s->epoch = epoch;
    return CH_OK;
}
