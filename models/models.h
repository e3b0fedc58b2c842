/* cohort: model zoo — torchvision ResNets and a small CNN, by name.
 *
 *   ch_model_options_t o;
 *   ch_model_options_default(&o);       // 1000 classes, 3 input channels, seed 0
 *   o.num_classes = 10; o.in_channels = 1;
 *   ch_model_t *model;
 *   CH_TRY(ch_model_create("resnet18", &o, &model));
 *   ...
 *   ch_model_destroy(model);
 *
 * Architectures (structure, entry names and order identical to torchvision
 * 0.14's models.resnetXX(num_classes=K) with conv1 replaced by
 * nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)):
 *   "resnet18"  BasicBlock [2, 2, 2, 2]
 *   "resnet34"  BasicBlock [3, 4, 6, 3]
 *   "resnet50"  Bottleneck [3, 4, 6, 3] (stride on the 3x3 conv, v1.5)
 *   "smallcnn"  a fast test network: conv1 3x3 (in->16), bn1, relu,
 *               conv2 3x3 stride 2 (16->32), bn2, relu2, avgpool, fc(32->K);
 *               PyTorch twin in tests/golden/resnet_golden.py.
 * Initialisation: ch_model_init (nn.h) with opts->seed.
 */
#ifndef COHORT_MODELS_H
#define COHORT_MODELS_H

#include <stdint.h>

#include "framework/nn/nn.h"
#include "framework/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int num_classes; /* fc outputs, >= 1 (default 1000) */
    int in_channels; /* conv1 input channels, >= 1 (default 3; 1 for Fashion-MNIST) */
    uint64_t seed;   /* initialisation seed (default 0) */
} ch_model_options_t;

void ch_model_options_default(ch_model_options_t *o);

/* Build, name, allocate and initialise the model `name` (see above). opts
 * may be NULL (defaults). CH_ERR_INVALID for an unknown name (the message
 * lists the known ones) or bad options. */
ch_status ch_model_create(const char *name, const ch_model_options_t *opts, ch_model_t **out);

/* Known architecture names, NULL-terminated. */
const char *const *ch_model_names(void);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_MODELS_H */
