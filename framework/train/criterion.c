/* cohort: the training loss (see criterion.h). */
#include "config.h"

#include "framework/train/criterion.h"

static const ch_config_key_t loss_keys[] = {
    {"loss.label_smoothing", CH_CFG_FLOAT, "0", 0, 1,
     "Cross-entropy label smoothing (torch.nn.CrossEntropyLoss(label_smoothing))."},
};

ch_config_table_t ch_loss_config_table(void)
{
    ch_config_table_t t = {"loss", loss_keys, (int)(sizeof loss_keys / sizeof loss_keys[0])};
    return t;
}

ch_status ch_loss_options_from_config(const ch_config_t *cfg, ch_loss_options_t *o)
{
    return ch_config_get_double(cfg, "loss.label_smoothing", &o->label_smoothing);
}

ch_status ch_loss_cross_entropy(ch_compute_t *cx, const ch_loss_options_t *o,
                                const ch_tensor_t *logits, const ch_tensor_t *labels,
                                ch_tensor_t *loss, ch_tensor_t *dlogits)
{
    return ch_op_cross_entropy_smooth(cx, logits, labels, o ? o->label_smoothing : 0.0, loss,
                                      dlogits);
}
