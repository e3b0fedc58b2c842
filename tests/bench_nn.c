/* Benchmark: training steps (forward + loss + backward + SGD) and inference
 * of a cohort model on random data, one process. Prints per-step medians.
 *
 *   tests/bench_nn [--arch resnet18] [--batch 64] [--size 28] [--channels 1]
 *                  [--threads 1] [--steps 20] [--warmup 3] [--eval]
 *                  [--conv-algorithm direct|auto|winograd] [--precision fp32|bf16]
 *                  [--onnx FILE] [--layout auto|plain|nhwc|8c|16c]
 *
 * --onnx builds the model from an ONNX file (models/onnx_model.h, as
 * cohort-train's model.onnx) instead of --arch; --channels and --size must
 * be the file's input (tests/golden/onnx_zoo.py exports 3 x 64 x 64).
 * --conv-algorithm is compute.cpu_conv_algorithm (framework/ops/ops.h); the
 * output line then also counts the Winograd convolution primitives.
 * --precision is compute.precision (bf16: oneDNN's bf16 convolutions and
 * linear layers, on an ISA with bf16; exit 2 naming the ISA elsewhere).
 * --layout is the CPU context's activation layout (ch_compute_options_t's
 * cpu_layout; auto: the backend's choice, nhwc with bf16, else the ISA's
 * blocked layout), to compare layouts in one binary.
 *
 * The same work in PyTorch: tests/golden/bench_nn_torch.py (same options).
 */
#include "config.h"

#include "framework/nn/nn.h"
#include "framework/nn/nn_exec.h"
#include "framework/ops/ops.h"
#include "framework/train/optim.h"
#include "models/models.h"
#include "models/onnx_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double clock_s(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const char *arch = "resnet18", *onnx = NULL;
    int batch = 64, size = 28, channels = 1, threads = 1, steps = 20, warmup = 3, eval = 0;
    int conv_alg = CH_CPU_CONV_DIRECT, bf16 = 0, layout = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--eval")) { eval = 1; continue; }
        if (!v) { fprintf(stderr, "bench_nn: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "--arch")) arch = v;
        else if (!strcmp(a, "--onnx")) onnx = v;
        else if (!strcmp(a, "--batch")) batch = atoi(v);
        else if (!strcmp(a, "--size")) size = atoi(v);
        else if (!strcmp(a, "--channels")) channels = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--warmup")) warmup = atoi(v);
        else if (!strcmp(a, "--conv-algorithm")) {
            conv_alg = -1;
            for (int k = 0; k < 3; k++)
                if (!strcmp(v, ch_compute_cpu_conv_algorithm_names[k])) conv_alg = k;
            if (conv_alg < 0) {
                fprintf(stderr, "bench_nn: --conv-algorithm %s: expected direct, auto or winograd\n",
                        v);
                return 2;
            }
        } else if (!strcmp(a, "--precision")) {
            if (strcmp(v, "fp32") && strcmp(v, "bf16")) {
                fprintf(stderr, "bench_nn: --precision %s: expected fp32 or bf16\n", v);
                return 2;
            }
            bf16 = !strcmp(v, "bf16");
        } else if (!strcmp(a, "--layout")) {
            static const char *const names[] = {"plain", "nhwc", "8c", "16c"};
            layout = -2;
            if (!strcmp(v, "auto")) layout = -1;
            for (int k = 0; k < 4; k++)
                if (!strcmp(v, names[k])) layout = k;
            if (layout == -2) {
                fprintf(stderr, "bench_nn: --layout %s: expected auto, plain, nhwc, 8c or 16c\n", v);
                return 2;
            }
        } else { fprintf(stderr, "bench_nn: unknown option %s\n", a); return 2; }
        i++;
    }
    if (batch < 1 || size < 1 || channels < 1 || threads < 1 || steps < 1 || warmup < 0) {
        fprintf(stderr, "bench_nn: bad option value\n");
        return 2;
    }
    ch_compute_options_t co;
    ch_compute_options_default(&co);
    co.num_threads = threads;
    co.cpu_conv_algorithm = conv_alg;
    co.bf16 = bf16;
    co.cpu_layout = layout;
    if (bf16 && !ch_compute_cpu_has_bf16()) {
        fprintf(stderr, "bench_nn: compute.precision = bf16: this CPU's oneDNN ISA is %s (no bf16 "
                "instructions); use fp32\n", ch_compute_cpu_isa());
        return 2;
    }
    ch_compute_t *cx;
    ch_model_t *m;
    ch_sgd_t *sgd;
    ch_model_options_t mo;
    ch_model_options_default(&mo);
    mo.in_channels = channels;
    mo.num_classes = 10;
    ch_sgd_options_t so = {0.01, 0.9, 0.0, 0.005, 0};
    ch_tensor_t x, y;
    int64_t xs[4] = {batch, channels, size, size}, ys[1] = {batch};
    ch_onnx_map_options_t oo;
    ch_onnx_map_options_default(&oo);
    oo.num_classes = 10;
    if (onnx) {
        const char *slash = strrchr(onnx, '/');
        arch = slash ? slash + 1 : onnx;
    }
    if (ch_compute_create(&co, &cx) ||
        (onnx ? ch_onnx_model_load(onnx, xs, &oo, &m) : ch_model_create(arch, &mo, &m)) ||
        ch_sgd_create(&so, &sgd) ||
        ch_sgd_add_model(sgd, m) || ch_tensor_alloc_f32(&x, 4, xs) ||
        ch_tensor_alloc(&y, CH_I64, 1, ys, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0)) {
        fprintf(stderr, "bench_nn: %s\n", ch_error_message());
        return 1;
    }
    srand(1);
    for (int64_t i = 0; i < ch_tensor_numel(&x); i++) ch_tensor_f32(&x)[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < batch; i++) ch_tensor_i64(&y)[i] = rand() % 10;
    ch_model_train(m, !eval);
    double *t = calloc((size_t)steps, sizeof *t), *c = calloc((size_t)steps, sizeof *c);
    const ch_tensor_t *logits;
    float loss = 0;
    int64_t conv0 = 0, reuse0 = 0;
    for (int s = -warmup; s < steps; s++) {
        if (s == 0) ch_compute_weight_conversions(cx, &conv0, &reuse0);
        double t0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
        ch_status st = ch_model_forward(m, cx, &x, &logits);
        if (!st && !eval) {
            st = ch_model_loss(m, cx, &y, &loss);
            if (!st) st = ch_model_backward(m, cx, NULL);
            if (!st) st = ch_sgd_step(sgd);
        }
        if (st) {
            fprintf(stderr, "bench_nn: %s\n", ch_error_message());
            return 1;
        }
        if (s >= 0) {
            t[s] = clock_s(CLOCK_MONOTONIC) - t0;
            c[s] = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        }
    }
    int64_t conv1 = 0, reuse1 = 0;
    ch_compute_weight_conversions(cx, &conv1, &reuse1);
    qsort(t, (size_t)steps, sizeof *t, cmp);
    qsort(c, (size_t)steps, sizeof *c, cmp);
    double med = t[steps / 2], cmed = c[steps / 2];
    char desc[256], wino[64] = "";
    ch_compute_describe(cx, desc, sizeof desc);
    if (conv_alg != CH_CPU_CONV_DIRECT)
        snprintf(wino, sizeof wino, "; winograd primitives %lld",
                 (long long)ch_compute_winograd_primitives(cx));
    printf("cohort %s %s batch %d input %dx%dx%d threads %d: median %.2f ms/step (min %.2f, max %.2f), "
           "%.1f images/s; cpu median %.2f ms/step; arena %.1f MiB; loss %.4f; weight conversions "
           "%.1f/step (%.1f reused)%s\n  %s\n",
           arch, eval ? "inference" : "train-step", batch, channels, size, size, threads, 1e3 * med,
           1e3 * t[0], 1e3 * t[steps - 1], batch / med, 1e3 * cmed, ch_model_arena_bytes(m) / 1048576.0, loss,
           (double)(conv1 - conv0) / steps, (double)(reuse1 - reuse0) / steps, wino, desc);
    free(t);
    free(c);
    ch_tensor_free(&x);
    ch_tensor_free(&y);
    ch_sgd_destroy(sgd);
    ch_model_destroy(m);
    ch_compute_destroy(cx);
    return 0;
}
