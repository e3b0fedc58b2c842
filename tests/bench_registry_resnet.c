/* Benchmark (not a test): resnet18 written by a user with the public nn
 * builders and handed to the trainer through the model registry, vs the
 * built-in resnet18 of cohort-train (issue 27's goal "a resnet18 built
 * through the registry runs at the built-in path's speed").
 *
 *   tests/bench_registry_resnet --model.arch user_resnet18 [any cohort-train key]...
 *
 * The network is torchvision's resnet18 (BasicBlock [2, 2, 2, 2], conv1
 * Conv2d(in_channels, 64, 7, 2, 3, bias=False)), the same modules and
 * state-dict names as the built-in one; only the init differs (PyTorch's
 * per-module default here, torchvision's ResNet init there), which does
 * not change the work per step. Compare with farm-bench --vs against
 * `jobs/cohort-train --model.arch resnet18` with the same keys
 * (docs/PERFORMANCE.md, "A user's network"). */
#include "models/models.h"
#include "trainer/trainer.h"

#include <stdio.h>

/* BasicBlock(in, out, stride): conv1 3x3/stride, bn1, relu, conv2 3x3, bn2,
 * downsample (1x1 conv/stride + bn) when the shape changes, relu(out + x). */
static ch_status basic_block(ch_module_t *layer, const char *name, int in, int out, int stride)
{
    ch_module_t *b, *c1, *bn1, *relu, *c2, *bn2, *ds = NULL;
    CH_TRY(ch_nn_residual(layer, name, &b));
    CH_TRY(ch_nn_conv2d(b, "conv1", in, out, 3, stride, 1, 0, &c1));
    CH_TRY(ch_nn_batchnorm2d(b, "bn1", out, &bn1));
    CH_TRY(ch_nn_relu(b, "relu", &relu));
    CH_TRY(ch_nn_conv2d(b, "conv2", out, out, 3, 1, 1, 0, &c2));
    CH_TRY(ch_nn_batchnorm2d(b, "bn2", out, &bn2));
    if (stride != 1 || in != out) {
        CH_TRY(ch_nn_sequential(b, "downsample", &ds));
        CH_TRY(ch_nn_conv2d(ds, NULL, in, out, 1, stride, 0, 0, NULL));
        CH_TRY(ch_nn_batchnorm2d(ds, NULL, out, NULL));
    }
    ch_module_t *const path[] = {c1, bn1, relu, c2, bn2};
    return ch_nn_residual_set_path(b, path, 5, ds, relu);
}

static ch_status user_resnet18(ch_module_t *net, const ch_model_options_t *o, void *arg)
{
    (void)arg;
    CH_TRY(ch_nn_conv2d(net, "conv1", o->in_channels, 64, 7, 2, 3, 0, NULL));
    CH_TRY(ch_nn_batchnorm2d(net, "bn1", 64, NULL));
    CH_TRY(ch_nn_relu(net, "relu", NULL));
    CH_TRY(ch_nn_maxpool2d(net, "maxpool", 3, 2, 1, NULL));
    int in = 64;
    for (int l = 0; l < 4; l++) {
        const int width = 64 << l;
        char name[16];
        ch_module_t *layer;
        snprintf(name, sizeof name, "layer%d", l + 1);
        CH_TRY(ch_nn_sequential(net, name, &layer));
        CH_TRY(basic_block(layer, "0", in, width, l == 0 ? 1 : 2));
        CH_TRY(basic_block(layer, "1", width, width, 1));
        in = width;
    }
    CH_TRY(ch_nn_adaptive_avgpool2d(net, "avgpool", NULL));
    return ch_nn_linear(net, "fc", 512, o->num_classes, 1, NULL);
}

int main(int argc, char **argv)
{
    ch_trainer_main_options_t o;
    ch_trainer_main_options_default(&o);
    o.name = "bench_registry_resnet";
    o.summary = "resnet18 built with the public nn builders, through the model registry";
    o.default_arch = "user_resnet18";
    if (ch_model_register("user_resnet18", user_resnet18, NULL)) return 1;
    return ch_trainer_main(argc, argv, &o);
}
