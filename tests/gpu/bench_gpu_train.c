/* bench_gpu_train: ResNet training throughput of cohort on one GPU.
 *
 *   tests/gpu/bench_gpu_train [--models resnet18,resnet34,resnet50]
 *       [--precisions fp32,tf32,bf16] [--batch 128] [--image-size 224]
 *       [--classes 1000] [--warmup 10] [--steps 30] [--device 0]
 *       [--conv-search 0|1] [--csv FILE]
 *
 * --device -1 runs the same loop on the CPU backend (fp32 only), to try the
 * program on a machine without a GPU; it is not the benchmark.
 * For each model (models/ registry, torchvision's structure) and precision:
 * the model on GPU `device` (ch_model_to_device), train mode, SGD (lr 0.1,
 * momentum 0.9, weight decay 1e-4) stepping on the device (one fused
 * ch_op_sgd_step, ch_sgd_set_compute), a synthetic batch of `batch` random
 * 3 x size x size images and labels already on the device. One step =
 * ch_model_forward + ch_model_loss + ch_model_backward + ch_sgd_step.
 * `warmup` untimed steps (plan, allocations, cuDNN algorithm choice), then
 * `steps` timed steps with one ch_compute_sync at the end:
 *   images/s = steps * batch / seconds (wall clock, CLOCK_MONOTONIC).
 * Precisions: fp32 = allow_tf32 0, bf16 0; tf32 = allow_tf32 1 (cuDNN
 * convolutions on TF32 tensor cores, PyTorch's default); bf16 = bf16
 * autocast of convolutions and linear layers (fp32 master weights and BN).
 * tests/gpu/bench_gpu_train.py does the same work in PyTorch.
 *
 * Prints one line per run and, with --csv, rows
 *   framework,model,precision,batch,steps,seconds,images_per_s
 * Exit status 77 when no GPU is visible, 1 on an error, 0 otherwise.
 */
#include "config.h"

#include "framework/tensor/device.h"
#include "framework/nn/nn.h"
#include "framework/nn/nn_exec.h"
#include "framework/ops/ops.h"
#include "framework/train/optim.h"
#include "framework/core/status.h"
#include "framework/tensor/tensor.h"
#include "models/models.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    char models[256];
    char precisions[64];
    int batch, image_size, classes, warmup, steps, device, conv_search;
    const char *csv;
} opts_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || !end || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: bench_gpu_train [options]\n"
            "  --models LIST       comma-separated (default resnet18,resnet34,resnet50)\n"
            "  --precisions LIST   fp32, tf32, bf16 (default all three)\n"
            "  --batch N           images per step (default 128)\n"
            "  --image-size N      input height = width (default 224)\n"
            "  --classes N         fc outputs (default 1000)\n"
            "  --warmup N          untimed steps (default 10)\n"
            "  --steps N           timed steps (default 30)\n"
            "  --device N          GPU ordinal (default 0; -1: the CPU backend, fp32 only)\n"
            "  --conv-search 0|1   cuDNN heuristics (0, default) or timed search\n"
            "  --csv FILE          write the results as CSV\n");
}

/* One model at one precision; *ips receives images/s. */
static ch_status run_one(const opts_t *o, const char *arch, const char *prec, double *ips,
                         double *secs, float *last_loss)
{
    ch_status s = CH_OK;
    ch_compute_t *cx = NULL;
    ch_model_t *m = NULL;
    ch_sgd_t *sgd = NULL;
    ch_tensor_t xh, yh, xd, yd;
    memset(&xh, 0, sizeof xh);
    memset(&yh, 0, sizeof yh);
    memset(&xd, 0, sizeof xd);
    memset(&yd, 0, sizeof yd);

    ch_compute_options_t co;
    ch_compute_options_default(&co);
    co.gpu_device = o->device;
    co.conv_search = o->conv_search;
    co.allow_tf32 = !strcmp(prec, "tf32");
    co.bf16 = !strcmp(prec, "bf16");
    ch_model_options_t mo;
    ch_model_options_default(&mo);
    mo.num_classes = o->classes;
    mo.in_channels = 3;
    mo.seed = 0;
    ch_sgd_options_t so = {0.1, 0.9, 0.0, 1e-4, 0};
    int64_t xs[4] = {o->batch, 3, o->image_size, o->image_size}, ys[1] = {o->batch};

#define T(expr)                                                                \
    do {                                                                       \
        s = (expr);                                                            \
        if (s != CH_OK) goto out;                                              \
    } while (0)
    const int gpu = o->device >= 0;
    const ch_devkind_t dk = gpu ? CH_DEV_CUDA : CH_DEV_CPU;
    const int di = gpu ? o->device : 0;
    if (!gpu) co.gpu_device = -1;
    T(ch_compute_create(&co, &cx));
    T(ch_model_create(arch, &mo, &m));
    if (gpu) T(ch_model_to_device(m, CH_DEV_CUDA, o->device));
    ch_model_train(m, 1);
    T(ch_sgd_create(&so, &sgd));
    T(ch_sgd_add_model(sgd, m));
    ch_sgd_set_compute(sgd, cx);

    /* the synthetic batch: uniform [-1, 1) images, labels spread over the classes */
    T(ch_tensor_alloc(&xh, CH_F32, 4, xs, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    T(ch_tensor_alloc(&yh, CH_I64, 1, ys, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    uint64_t r = 0x9E3779B97F4A7C15ull;
    float *x = ch_tensor_f32(&xh);
    for (int64_t i = 0; i < ch_tensor_numel(&xh); i++) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        x[i] = (float)((double)(r >> 11) * (2.0 / 9007199254740992.0) - 1.0);
    }
    for (int64_t i = 0; i < o->batch; i++) ch_tensor_i64(&yh)[i] = (i * 7919) % o->classes;
    T(ch_tensor_alloc(&xd, CH_F32, 4, xs, CH_LAYOUT_PLAIN, dk, di));
    T(ch_tensor_alloc(&yd, CH_I64, 1, ys, CH_LAYOUT_PLAIN, dk, di));
    T(ch_op_reorder(cx, &xh, &xd));
    T(ch_op_reorder(cx, &yh, &yd));
    T(ch_compute_sync(cx));

    const ch_tensor_t *logits = NULL;
    for (int i = 0; i < o->warmup + o->steps; i++) {
        if (i == o->warmup) {
            T(ch_compute_sync(cx));
            *secs = now_s();
        }
        T(ch_model_forward(m, cx, &xd, &logits));
        T(ch_model_loss(m, cx, &yd, NULL));
        T(ch_model_backward(m, cx, NULL));
        T(ch_sgd_step(sgd));
    }
    T(ch_compute_sync(cx));
    *secs = now_s() - *secs;
    *ips = (double)o->steps * (double)o->batch / *secs;
    T(ch_model_loss_value(m, cx, last_loss));
#undef T
out:
    ch_tensor_free(&xh);
    ch_tensor_free(&yh);
    ch_tensor_free(&xd);
    ch_tensor_free(&yd);
    ch_sgd_destroy(sgd);
    ch_model_destroy(m);
    ch_compute_destroy(cx);
    return s;
}

int main(int argc, char **argv)
{
    opts_t o = {"resnet18,resnet34,resnet50", "fp32,tf32,bf16", 128, 224, 1000, 10, 30, 0, 0, NULL};
    static const struct option lo[] = {
        {"models", required_argument, 0, 'm'},  {"precisions", required_argument, 0, 'p'},
        {"batch", required_argument, 0, 'b'},   {"image-size", required_argument, 0, 's'},
        {"classes", required_argument, 0, 'k'}, {"warmup", required_argument, 0, 'w'},
        {"steps", required_argument, 0, 'n'},   {"device", required_argument, 0, 'd'},
        {"conv-search", required_argument, 0, 'c'}, {"csv", required_argument, 0, 'o'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'm': bad = snprintf(o.models, sizeof o.models, "%s", optarg) >= (int)sizeof o.models; break;
        case 'p': bad = snprintf(o.precisions, sizeof o.precisions, "%s", optarg) >= (int)sizeof o.precisions; break;
        case 'b': bad = parse_int(optarg, 1, 1 << 20, &o.batch); break;
        case 's': bad = parse_int(optarg, 32, 4096, &o.image_size); break;
        case 'k': bad = parse_int(optarg, 1, 1 << 20, &o.classes); break;
        case 'w': bad = parse_int(optarg, 0, 1000000, &o.warmup); break;
        case 'n': bad = parse_int(optarg, 1, 1000000, &o.steps); break;
        case 'd': bad = parse_int(optarg, -1, 1023, &o.device); break;
        case 'c': bad = parse_int(optarg, 0, 1, &o.conv_search); break;
        case 'o': o.csv = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            const char *on = "?";
            for (int i = 0; lo[i].name; i++)
                if (lo[i].val == c) on = lo[i].name;
            fprintf(stderr, "bench_gpu_train: bad value '%s' for --%s\n", optarg, on);
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "bench_gpu_train: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    int ndev = 0;
    if (o.device >= 0 && (ch_device_count(&ndev) != CH_OK || ndev == 0)) {
        printf("bench_gpu_train: no GPU visible (ch_device_count() = %d%s): nothing to measure\n",
               ndev, ch_device_backend_compiled() ? "" : "; built without the CUDA backend");
        return 77;
    }
    if (o.device >= 0 && o.device >= ndev) {
        fprintf(stderr, "bench_gpu_train: --device %d but %d GPU(s) visible\n", o.device, ndev);
        return 2;
    }
    char name[256] = "CPU backend (not the benchmark)";
    if (o.device >= 0) ch_device_name(o.device, name, sizeof name);
    printf("bench_gpu_train: device %d %s, batch %d, %dx%d, %d classes, %d warm-up + %d timed steps\n",
           o.device, name, o.batch, o.image_size, o.image_size, o.classes, o.warmup, o.steps);
    fflush(stdout);
    FILE *csv = NULL;
    if (o.csv) {
        csv = fopen(o.csv, "w");
        if (!csv) {
            fprintf(stderr, "bench_gpu_train: cannot write %s: %s\n", o.csv, strerror(errno));
            return 1;
        }
        fprintf(csv, "framework,model,precision,batch,steps,seconds,images_per_s\n");
        fflush(csv);
    }
    int rc = 0;
    char models[256], precs[64];
    snprintf(models, sizeof models, "%s", o.models);
    char *sm = NULL;
    for (char *arch = strtok_r(models, ",", &sm); arch; arch = strtok_r(NULL, ",", &sm)) {
        snprintf(precs, sizeof precs, "%s", o.precisions);
        char *sp = NULL;
        for (char *prec = strtok_r(precs, ",", &sp); prec; prec = strtok_r(NULL, ",", &sp)) {
            if (strcmp(prec, "fp32") && strcmp(prec, "tf32") && strcmp(prec, "bf16")) {
                fprintf(stderr, "bench_gpu_train: unknown precision '%s' (fp32, tf32, bf16)\n", prec);
                rc = 2;
                continue;
            }
            double ips = 0, secs = 0;
            float loss = 0;
            ch_status s = run_one(&o, arch, prec, &ips, &secs, &loss);
            if (s != CH_OK) {
                fprintf(stderr, "bench_gpu_train: %s %s: %s: %s\n", arch, prec, ch_status_name(s),
                        ch_error_message());
                if (csv) {
                    fprintf(csv, "cohort,%s,%s,%d,%d,,\n", arch, prec, o.batch, o.steps);
                    fflush(csv);
                }
                rc = 1;
                continue;
            }
            printf("cohort  %-9s %-5s batch %d: %d steps in %.3f s = %8.1f images/s (last loss %.3f)\n",
                   arch, prec, o.batch, o.steps, secs, ips, (double)loss);
            fflush(stdout);
            if (csv) { /* row by row: a run stopped by a timeout keeps what it measured */
                fprintf(csv, "cohort,%s,%s,%d,%d,%.6f,%.1f\n", arch, prec, o.batch, o.steps, secs, ips);
                fflush(csv);
            }
        }
    }
    if (csv) fclose(csv);
    return rc;
}
