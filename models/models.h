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
 *
 * Registry: a program adds its own network under a name of its own
 * (ch_model_register); ch_model_create, cohort-train's model.arch and the
 * trainer (trainer/trainer.h) then build it like a built-in one:
 *
 *   static ch_status mycnn(ch_module_t *root, const ch_model_options_t *o, void *arg)
 *   {   // nn.Sequential(Conv2d(o->in_channels, 16, 3, padding=1), ReLU(), ...)
 *       CH_TRY(ch_nn_conv2d(root, NULL, o->in_channels, 16, 3, 1, 1, 1, NULL)); // "0"
 *       CH_TRY(ch_nn_relu(root, NULL, NULL));                                   // "1"
 *       ...
 *   }
 *   ch_model_register("mycnn", mycnn, NULL);
 *
 * A registered network starts from PyTorch's default init of each module
 * (ch_model_init_default: Conv2d/Linear reset_parameters, BN 1/0), seeded
 * by opts->seed and the same on every rank.
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

/* Known architecture names, NULL-terminated: the built-in ones, then the
 * registered ones in registration order. Valid until the next
 * ch_model_register. */
const char *const *ch_model_names(void);

/* A network builder: add the layers to `root` (the model's root
 * Sequential, still empty) with the ch_nn_* builders of nn.h, sized by
 * opts (num_classes, in_channels; seed is applied afterwards by the
 * registry). Return CH_OK or the error of the failing builder. `arg` is
 * the pointer given to ch_model_register. */
typedef ch_status (*ch_model_builder_fn)(ch_module_t *root, const ch_model_options_t *opts,
                                         void *arg);

/* Register `builder` under `name` (copied; letters, digits, '_', '-', '.'),
 * so that ch_model_create(name, ...) builds it: a new model labelled name,
 * the builder, ch_model_finalize_init with CH_NN_INIT_DEFAULT (PyTorch's
 * reset_parameters) and opts->seed. Call before ch_model_create /
 * ch_trainer_main, from one thread (the registry is not locked). Errors:
 * CH_ERR_INVALID for a NULL builder, a bad name or one already known
 * (built-in names included), CH_ERR_RANGE past CH_MODEL_MAX_REGISTERED
 * entries. */
#define CH_MODEL_MAX_REGISTERED 64
ch_status ch_model_register(const char *name, ch_model_builder_fn builder, void *arg);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_MODELS_H */
