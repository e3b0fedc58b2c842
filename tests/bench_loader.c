/* cohort: data loader throughput benchmark (images/s).
 *
 *   tests/bench_loader --dataset fmnist [--root DIR] | --dataset imagefolder --root DIR
 *                   | --dataset shards --root SHARDS (io/data/shards.h)
 *                   [--workers N] [--batch B] [--epochs E] [--limit N]
 *                   [--pipeline train|val|imagenet] [--channels C] [--prefetch P]
 *                   [--fast_decode 0|1]
 *
 * fmnist, train pipeline: RandomCrop(28, padding=4), RandomHorizontalFlip,
 * ToTensor + Normalize((0.2860,), (0.3530,)). imagefolder: the same on the
 * decoded JPEGs (channels 1, as the Fashion-MNIST pictures are gray).
 * val pipeline: Normalize only. imagenet pipeline: RandomResizedCrop(224),
 * RandomHorizontalFlip, ToTensor + Normalize (torchvision's ImageNet train
 * recipe). --fast_decode 1: the loader's opt-in partial / DCT-scaled JPEG
 * decode (data.fast_decode, transforms.h). Each epoch is timed from start_epoch to the
 * last batch (the consumer only touches every batch); one line per epoch
 * and the median, as images/s of wall time and as images per CPU second of
 * the process (all threads: the per-core rate, which holds up on a loaded
 * machine better than wall time). tests/bench_loader_torch.py does the same with
 * PyTorch's DataLoader.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "framework/core/log.h"
#include "io/data/dataset.h"
#include "io/data/loader.h"
#include "io/data/shards.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds of the whole process (all threads) */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_loader --dataset fmnist|imagefolder|shards [--root DIR] [--workers N] "
                    "[--batch B] [--epochs E] [--limit N] [--pipeline train|val|imagenet] [--channels C] "
                    "[--prefetch P] [--fast_decode 0|1]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *dataset = "fmnist", *root = NULL, *pipeline = "train";
    int workers = 1, epochs = 5, channels = 1, prefetch = 0, fast = 0;
    long long batch = 256, limit = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) usage();
        if (!strcmp(a, "--dataset")) dataset = argv[++i];
        else if (!strcmp(a, "--root")) root = argv[++i];
        else if (!strcmp(a, "--workers")) workers = atoi(argv[++i]);
        else if (!strcmp(a, "--batch")) batch = atoll(argv[++i]);
        else if (!strcmp(a, "--epochs")) epochs = atoi(argv[++i]);
        else if (!strcmp(a, "--limit")) limit = atoll(argv[++i]);
        else if (!strcmp(a, "--pipeline")) pipeline = argv[++i];
        else if (!strcmp(a, "--channels")) channels = atoi(argv[++i]);
        else if (!strcmp(a, "--prefetch")) prefetch = atoi(argv[++i]);
        else if (!strcmp(a, "--fast_decode")) fast = atoi(argv[++i]);
        else usage();
    }
    if (epochs < 1 || epochs > 1000) usage();
    ch_dataset_t *ds = NULL, *sub = NULL;
    ch_status st;
    if (!strcmp(dataset, "fmnist"))
        st = ch_dataset_fashion_mnist_open(root ? root : "/usr/share/datasets/fashion-mnist", 1, &ds);
    else if (!strcmp(dataset, "imagefolder") && root)
        st = ch_dataset_imagefolder_open(root, channels, &ds);
    else if (!strcmp(dataset, "shards") && root)
        st = ch_dataset_shards_open(root, channels, NULL, &ds);
    else
        usage();
    ch_check_fatal(st, "opening the dataset");
    ch_dataset_t *use = ds;
    if (limit > 0 && limit < ds->length) {
        int64_t *idx = malloc(sizeof *idx * (size_t)limit);
        for (long long k = 0; k < limit; k++) idx[k] = k;
        ch_check_fatal(ch_dataset_subset_create(ds, idx, limit, &sub), "subset");
        free(idx);
        use = sub;
    }
    static const float mean1[1] = {0.2860f}, std1[1] = {0.3530f};
    static const float mean3[3] = {0.2860f, 0.2860f, 0.2860f}, std3[3] = {0.3530f, 0.3530f, 0.3530f};
    ch_transform_t ops[3];
    int nops = 0;
    if (!strcmp(pipeline, "train")) {
        ops[nops++] = ch_tf_random_crop(28, 4);
        ops[nops++] = ch_tf_random_hflip(0.5);
    } else if (!strcmp(pipeline, "imagenet")) {
        ops[nops++] = ch_tf_random_resized_crop(224);
        ops[nops++] = ch_tf_random_hflip(0.5);
    } else if (strcmp(pipeline, "val") != 0) {
        usage();
    }
    ops[nops++] = ch_tf_normalize(use->channels, use->channels == 1 ? mean1 : mean3,
                                  use->channels == 1 ? std1 : std3);
    ch_loader_options_t cfg;
    ch_loader_options_default(&cfg);
    cfg.batch_size = batch;
    cfg.num_workers = workers;
    cfg.prefetch = prefetch;
    cfg.transforms = ops;
    cfg.n_transforms = nops;
    cfg.fast_decode = fast;
    ch_loader_t *l;
    ch_check_fatal(ch_loader_create(use, &cfg, &l), "creating the loader");
    double *rate = calloc((size_t)epochs, sizeof *rate);
    double *crate = calloc((size_t)epochs, sizeof *crate);
    double checksum = 0;
    for (int e = 0; e < epochs; e++) {
        double t0 = now_s(), c0 = cpu_s();
        ch_check_fatal(ch_loader_start_epoch(l, e), "start_epoch");
        int64_t n = 0;
        for (;;) {
            ch_batch_t *b;
            ch_check_fatal(ch_loader_next(l, &b), "next");
            if (!b) break;
            checksum += b->images[0] + (double)b->labels[b->n - 1];
            n += b->n;
            ch_loader_release(l, b);
        }
        double dt = now_s() - t0, dc = cpu_s() - c0;
        rate[e] = (double)n / dt;
        crate[e] = (double)n / dc;
        printf("epoch %d: %lld images in %.3f s = %.0f images/s; %.3f CPU s = %.0f images per "
               "CPU second\n", e, (long long)n, dt, rate[e], dc, crate[e]);
    }
    qsort(rate, (size_t)epochs, sizeof *rate, cmp_d);
    qsort(crate, (size_t)epochs, sizeof *crate, cmp_d);
    printf("cohort %s %s workers=%d prefetch=%d fast_decode=%d batch=%lld n=%lld: median %.0f "
           "images/s, %.0f images per CPU second (checksum %.3f)\n",
           dataset, pipeline, workers, prefetch, fast, batch, (long long)use->length, rate[epochs / 2],
           crate[epochs / 2], checksum);
    free(rate);
    free(crate);
    ch_loader_destroy(l);
    ch_dataset_destroy(sub);
    ch_dataset_destroy(ds);
    return 0;
}
