/* Benchmark: the built-in resnet18 (a tree of Residual containers) against
 * the same network built as one DAG graph (ch_nn_graph with Add nodes and
 * dotted node names, so its state dict has the same names), forward +
 * loss + backward per step, the two models alternating step by step on
 * the same data. Checks first that both give the same logits and
 * gradients (weights copied with ch_model_copy). Prints per-step medians.
 *
 *   tests/bench_nn_dag [--batch 32] [--size 32] [--threads 1] [--steps 10]
 *
 * Numbers of the DAG work (issue 28): docs/nn-numerics.md, "DAG graphs".
 */
#include "config.h"

#include "framework/nn/nn.h"
#include "framework/nn/nn_exec.h"
#include "framework/ops/ops.h"
#include "models/models.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TRY(x)                                                                       \
    do {                                                                             \
        if ((x) != CH_OK) {                                                          \
            fprintf(stderr, "bench_nn_dag: %s: %s\n", #x, ch_error_message());       \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static ch_module_t *g_;

static int node(ch_module_t *m, int in)
{
    TRY(ch_nn_graph_connect(g_, m, &in, 1));
    return ch_module_num_children(g_);
}

static int conv(const char *name, int i, int o, int k, int s, int p, int in)
{
    ch_module_t *m;
    TRY(ch_nn_conv2d(g_, name, i, o, k, s, p, 0, &m));
    return node(m, in);
}

static int bn(const char *name, int c, int in)
{
    ch_module_t *m;
    TRY(ch_nn_batchnorm2d(g_, name, c, &m));
    return node(m, in);
}

static int relu(const char *name, int in)
{
    ch_module_t *m;
    TRY(ch_nn_relu(g_, name, &m));
    return node(m, in);
}

/* torchvision resnet18 as one graph, torchvision's entry names */
static ch_model_t *resnet18_graph(int classes)
{
    ch_model_t *M;
    TRY(ch_model_new("resnet18-graph", &M));
    TRY(ch_nn_graph(ch_model_root(M), "", &g_));
    int v = conv("conv1", 3, 64, 7, 2, 3, 0);
    v = relu("relu", bn("bn1", 64, v));
    ch_module_t *m;
    TRY(ch_nn_maxpool2d(g_, "maxpool", 3, 2, 1, &m));
    v = node(m, v);
    int inpl = 64;
    char n[64];
    for (int l = 0; l < 4; l++) {
        const int planes = 64 << l;
        for (int b = 0; b < 2; b++) {
            const int s = l > 0 && b == 0 ? 2 : 1;
            snprintf(n, sizeof n, "layer%d.%d.conv1", l + 1, b);
            int h = conv(n, inpl, planes, 3, s, 1, v);
            snprintf(n, sizeof n, "layer%d.%d.bn1", l + 1, b);
            h = bn(n, planes, h);
            snprintf(n, sizeof n, "layer%d.%d.relu", l + 1, b);
            h = relu(n, h);
            snprintf(n, sizeof n, "layer%d.%d.conv2", l + 1, b);
            h = conv(n, planes, planes, 3, 1, 1, h);
            snprintf(n, sizeof n, "layer%d.%d.bn2", l + 1, b);
            h = bn(n, planes, h);
            int sc = v;
            if (s != 1 || inpl != planes) {
                snprintf(n, sizeof n, "layer%d.%d.downsample.0", l + 1, b);
                sc = conv(n, inpl, planes, 1, s, 0, v);
                snprintf(n, sizeof n, "layer%d.%d.downsample.1", l + 1, b);
                sc = bn(n, planes, sc);
            }
            snprintf(n, sizeof n, "layer%d.%d.add", l + 1, b);
            TRY(ch_nn_add(g_, n, &m));
            int in2[2] = {h, sc};
            TRY(ch_nn_graph_connect(g_, m, in2, 2));
            snprintf(n, sizeof n, "layer%d.%d.relu_out", l + 1, b);
            v = relu(n, ch_module_num_children(g_));
            inpl = planes;
        }
    }
    TRY(ch_nn_adaptive_avgpool2d(g_, "avgpool", &m));
    v = node(m, v);
    TRY(ch_nn_linear(g_, "fc", 512, classes, 1, &m));
    node(m, v);
    TRY(ch_model_finalize(M, 1));
    return M;
}

static double step(ch_model_t *m, ch_compute_t *cx, const ch_tensor_t *x, const ch_tensor_t *y)
{
    const ch_tensor_t *lg;
    double t0 = now();
    TRY(ch_model_forward(m, cx, x, &lg));
    TRY(ch_model_loss(m, cx, y, NULL));
    TRY(ch_model_backward(m, cx, NULL));
    return now() - t0;
}

static double rel(const float *a, const float *b, size_t n)
{
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs((double)a[i] - b[i]));
        mb = fmax(mb, fabs((double)b[i]));
    }
    return md / (mb + 1e-30);
}

int main(int argc, char **argv)
{
    int batch = 32, size = 32, threads = 1, steps = 10;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--batch")) batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--size")) size = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench_nn_dag: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (batch < 1 || size < 8 || threads < 1 || steps < 1) {
        fprintf(stderr, "bench_nn_dag: bad option value\n");
        return 2;
    }
    ch_compute_options_t co;
    ch_compute_options_default(&co);
    co.num_threads = threads;
    ch_compute_t *cx;
    TRY(ch_compute_create(&co, &cx));
    ch_model_options_t mo;
    ch_model_options_default(&mo);
    mo.num_classes = 10;
    ch_model_t *tree, *graph = resnet18_graph(10);
    TRY(ch_model_create("resnet18", &mo, &tree));
    TRY(ch_model_copy(graph, tree)); /* same names in the same order */
    ch_tensor_t x, y;
    int64_t xs[4] = {batch, 3, size, size}, ys = batch;
    TRY(ch_tensor_alloc_f32(&x, 4, xs));
    TRY(ch_tensor_alloc(&y, CH_I64, 1, &ys, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    srand(1);
    for (int64_t i = 0; i < ch_tensor_numel(&x); i++) ch_tensor_f32(&x)[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < batch; i++) ch_tensor_i64(&y)[i] = rand() % 10;
    /* the same step on both (each one forward in training mode) */
    step(tree, cx, &x, &y);
    step(graph, cx, &x, &y);
    double eg = rel(ch_model_grad_block(graph), ch_model_grad_block(tree), ch_model_param_numel(tree));
    double *tt = calloc((size_t)steps, sizeof *tt), *tg = calloc((size_t)steps, sizeof *tg);
    for (int s = 0; s < steps; s++) {
        tt[s] = step(tree, cx, &x, &y);
        tg[s] = step(graph, cx, &x, &y);
    }
    qsort(tt, (size_t)steps, sizeof *tt, cmp);
    qsort(tg, (size_t)steps, sizeof *tg, cmp);
    printf("resnet18 batch %d input 3x%dx%d threads %d, forward+loss+backward median of %d: tree "
           "%.1f ms (min %.1f), graph %.1f ms (min %.1f), graph/tree %.3f; arena tree %.1f MiB, "
           "graph %.1f MiB; first-step gradients graph vs tree: max rel %.2g\n",
           batch, size, size, threads, steps, 1e3 * tt[steps / 2], 1e3 * tt[0], 1e3 * tg[steps / 2],
           1e3 * tg[0], tg[steps / 2] / tt[steps / 2], ch_model_arena_bytes(tree) / 1048576.0,
           ch_model_arena_bytes(graph) / 1048576.0, eg);
    free(tt);
    free(tg);
    ch_tensor_free(&x);
    ch_tensor_free(&y);
    ch_model_destroy(tree);
    ch_model_destroy(graph);
    ch_compute_destroy(cx);
    return eg <= 1e-4 ? 0 : 1;
}
