/* cohort example: a CNN of your own, trained data-parallel on Fashion-MNIST
 * by cohort's trainer, with cohort-train's whole command line (--help lists
 * every key; checkpoints, resume, metrics, SyncBN, GPUs as cohort-train):
 *
 *     cc -o fmnist_cnn fmnist_cnn.c $(pkg-config --cflags --libs cohort)
 *     mpiexec -n 2 ./fmnist_cnn --output.dir runs/cnn    # data.path: Fashion-MNIST
 *
 * The network is PyTorch's
 *     nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
 *                   nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64),
 *                   nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(0.25),
 *                   nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
 * with PyTorch's default init and names ("0.weight", "1.running_mean", ...):
 * runs/cnn/model-4.safetensors loads into it with load_state_dict(strict=True). */
#include <cohort/models/models.h>
#include <cohort/trainer/trainer.h>

static ch_status fmnist_cnn(ch_module_t *net, const ch_model_options_t *o, void *arg)
{
    int in = o->in_channels;
    (void)arg;
    for (int width = 32; width <= 64; in = width, width *= 2) { /* conv-BN-ReLU-maxpool, twice */
        CH_TRY(ch_nn_conv2d(net, NULL, in, width, 3, 1, 1, 1, NULL));
        CH_TRY(ch_nn_batchnorm2d(net, NULL, width, NULL));
        CH_TRY(ch_nn_relu(net, NULL, NULL));
        CH_TRY(ch_nn_maxpool2d(net, NULL, 2, 2, 0, NULL));
    }
    CH_TRY(ch_nn_flatten(net, NULL, NULL));
    CH_TRY(ch_nn_dropout(net, NULL, 0.25f, NULL));
    CH_TRY(ch_nn_linear(net, NULL, 64 * 7 * 7, 128, 1, NULL)); /* 28x28 images */
    CH_TRY(ch_nn_relu(net, NULL, NULL));
    return ch_nn_linear(net, NULL, 128, o->num_classes, 1, NULL);
}

int main(int argc, char **argv)
{
    ch_trainer_main_options_t o;
    ch_trainer_main_options_default(&o);
    o.name = "fmnist_cnn";
    o.summary = "a CNN of its own trained data-parallel on Fashion-MNIST";
    o.default_arch = "fmnist_cnn"; /* --model.arch fmnist_cnn without saying so */
    if (ch_model_register("fmnist_cnn", fmnist_cnn, NULL)) return 1;
    return ch_trainer_main(argc, argv, &o);
}
