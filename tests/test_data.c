/* Tests for the objects' config keys and set-from-options functions:
 * io/data/data (data.*: defaults, mean/std parsing and channel checks, the
 * format choice, datasets + loaders built from a small CIFAR-10 directory
 * with subsets), framework/train/ddp (dist.bucket_mb,
 * dist.broadcast_buffers), optim (optimizer.*, nesterov check) and
 * lr_schedule (schedule.*); and io/data/batch_feed (the loader's batches as
 * step tensors: on the CPU always, on a GPU where one is visible). Single
 * process. */
#include "config.h"

#include "tests/harness.h"

#include "framework/core/configuration.h"
#include "framework/train/ddp.h"
#include "framework/train/lr_schedule.h"
#include "framework/train/optim.h"
#include "framework/ops/ops.h"
#include "framework/tensor/device.h"
#include "io/data/batch_feed.h"
#include "io/data/data.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Load argv (NULL-terminated, argv[0] the program) against the tables. */
static ch_status load_tables(const ch_config_table_t *t, int n, char **argv, ch_config_t **cfg)
{
    int argc = 0;
    while (argv[argc]) argc++;
    return ch_config_load_tables(t, n, NULL, argc, argv, cfg);
}

static ch_status load(ch_config_table_t t, char **argv, ch_config_t **cfg)
{
    return load_tables(&t, 1, argv, cfg);
}

static void test_data_defaults(void **state)
{
    (void)state;
    char *argv[] = {"prog", NULL};
    ch_config_t *cfg = NULL;
    assert_ch_ok(load(ch_data_config_table(), argv, &cfg));
    ch_data_options_t o;
    assert_ch_ok(ch_data_options_from_config(cfg, &o));
    assert_string_equal(o.path, "/usr/share/datasets/fashion-mnist");
    assert_int_equal(o.format, CH_DATA_IDX);
    assert_string_equal(o.format_name, "idx");
    assert_int_equal(o.workers, 2);
    assert_int_equal(o.prefetch, 4);
    assert_int_equal(o.n_mean, 1);
    assert_true(o.mean[0] == 0.2860f && o.std[0] == 0.3530f);
    assert_int_equal(o.hflip, 0);
    assert_int_equal(o.random_crop_padding, 0);
    assert_ch_ok(ch_data_options_check_channels(&o, 1));
    assert_ch_ok(ch_data_options_check_channels(&o, 3)); /* one value for every channel */
    ch_config_destroy(cfg);
}

static void test_data_options_errors(void **state)
{
    (void)state;
    ch_config_t *cfg = NULL;
    ch_data_options_t o;
    char *fmt[] = {"prog", "--data.format=lmdb", NULL};
    assert_ch_ok(load(ch_data_config_table(), fmt, &cfg));
    assert_ch_error(ch_data_options_from_config(cfg, &o), CH_ERR_CONFIG, "idx, cifar10, imagefolder");
    ch_config_destroy(cfg);
    char *nan_[] = {"prog", "--data.mean=0.5,x,0.5", NULL};
    assert_ch_ok(load(ch_data_config_table(), nan_, &cfg));
    assert_ch_error(ch_data_options_from_config(cfg, &o), CH_ERR_CONFIG, "data.mean: 'x' is not a number");
    ch_config_destroy(cfg);
    char *zero[] = {"prog", "--data.std=0.2,0", NULL};
    assert_ch_ok(load(ch_data_config_table(), zero, &cfg));
    assert_ch_error(ch_data_options_from_config(cfg, &o), CH_ERR_CONFIG,
                    "data.std: value 0 for channel 1 must be > 0");
    ch_config_destroy(cfg);
    char *two[] = {"prog", "--data.mean=0.4,0.5", "--data.std=0.2,0.3", NULL};
    assert_ch_ok(load(ch_data_config_table(), two, &cfg));
    assert_ch_ok(ch_data_options_from_config(cfg, &o));
    assert_ch_error(ch_data_options_check_channels(&o, 3), CH_ERR_CONFIG,
                    "data.mean: 2 values given, expected 1 or 3 (one per input channel, "
                    "model.in_channels = 3)");
    assert_ch_error(ch_data_options_check_channels(&o, 1), CH_ERR_CONFIG, "expected 1 (one per");
    assert_ch_error(ch_data_options_check_channels(&o, 4), CH_ERR_CONFIG, "1 to 3 channels");
    ch_config_destroy(cfg);
}

static void test_data_auto_stats(void **state)
{
    (void)state;
    ch_config_t *cfg = NULL;
    ch_data_options_t o;
    char *autos[] = {"prog", "--data.mean=auto", "--data.std=auto", NULL};
    assert_ch_ok(load(ch_data_config_table(), autos, &cfg));
    assert_ch_ok(ch_data_options_from_config(cfg, &o));
    assert_true(o.mean_auto && o.std_auto && o.n_mean == 0 && o.n_std == 0);
    assert_ch_ok(ch_data_options_check_channels(&o, 3)); /* any channel count */
    ch_config_destroy(cfg);
    char *mixed[] = {"prog", "--data.mean=auto,0.5", NULL};
    assert_ch_ok(load(ch_data_config_table(), mixed, &cfg));
    assert_ch_error(ch_data_options_from_config(cfg, &o), CH_ERR_CONFIG, "data.mean: 'auto' is not a number");
    ch_config_destroy(cfg);

    /* 5 images of 2x3 RGB: channel c of pixel k of image i is (i*6 + k)*(c+1) % 256;
     * reference: mean and population std of x/255 per channel, in double */
    ch_dataset_t *ds = NULL;
    uint8_t *px;
    int64_t *lab;
    const int n = 5, hw = 6;
    assert_ch_ok(ch_dataset_memory_create("idx", "mem", n, 2, 3, 3, 2, &px, &lab, &ds));
    double sum[3] = {0}, sq[3] = {0};
    for (int i = 0; i < n; i++) {
        lab[i] = i % 2;
        for (int k = 0; k < hw; k++)
            for (int c = 0; c < 3; c++) {
                px[(i * hw + k) * 3 + c] = (uint8_t)(((i * hw + k) * (c + 1) * 37) % 256);
                sum[c] += px[(i * hw + k) * 3 + c] / 255.0;
            }
    }
    float mean[3], std[3];
    assert_ch_ok(ch_data_channel_stats(ds, NULL, mean, std));
    for (int c = 0; c < 3; c++) {
        double m = sum[c] / (n * hw);
        for (int i = 0; i < n * hw; i++) {
            double d = px[i * 3 + c] / 255.0 - m;
            sq[c] += d * d;
        }
        assert_float_equal(mean[c], m, 1e-6);
        assert_float_equal(std[c], sqrt(sq[c] / (n * hw)), 1e-6);
    }
    assert_true(mean[0] != mean[1] && std[1] != std[2]); /* channels are not mixed up */
    ch_dataset_destroy(ds);
}

/* A CIFAR-10 directory: 5 train batches of `per` records and a test batch. */
static void write_cifar(const char *d, int per) /* d: < 1024 bytes */
{
    mkdir(d, 0755);
    for (int b = 0; b < 6; b++) {
        char p[1100];
        if (b < 5) snprintf(p, sizeof p, "%s/data_batch_%d.bin", d, b + 1);
        else snprintf(p, sizeof p, "%s/test_batch.bin", d);
        FILE *f = fopen(p, "wb");
        assert_non_null(f);
        for (int r = 0; r < per; r++) {
            unsigned char rec[3073];
            rec[0] = (unsigned char)((b * per + r) % 10);
            for (int k = 1; k < 3073; k++) rec[k] = (unsigned char)((k * 7 + r * 13 + b) & 0xff);
            assert_int_equal(fwrite(rec, 1, sizeof rec, f), sizeof rec);
        }
        fclose(f);
    }
}

static void remove_dir(const char *d)
{
    DIR *dd = opendir(d);
    struct dirent *e;
    if (!dd) return;
    while ((e = readdir(dd))) {
        char p[1400];
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", d, e->d_name);
        unlink(p);
    }
    closedir(dd);
    rmdir(d);
}

static void test_data_create_cifar(void **state)
{
    (void)state;
    char d[1024], opt[1100];
    snprintf(d, sizeof d, "%s/tests/tmp-data-%d", ch_test_builddir(), (int)getpid());
    write_cifar(d, 12); /* 60 train, 12 test images */
    snprintf(opt, sizeof opt, "--data.path=%s", d);
    char *argv[] = {"prog", opt, "--data.format=cifar10", "--data.train_subset=40",
                    "--data.mean=0.5,0.5,0.5", "--data.std=0.25", "--data.random_crop_padding=4",
                    "--data.hflip", "--data.workers=0", NULL};
    ch_config_t *cfg = NULL;
    assert_ch_ok(load(ch_data_config_table(), argv, &cfg));
    ch_data_options_t o;
    assert_ch_ok(ch_data_options_from_config(cfg, &o));
    ch_data_setup_t u = {.in_channels = 3, .num_classes = 10, .batch_size = 8, .seed = 1,
                         .rank = 0, .world_size = 2, .eval = 1};
    ch_data_t *data = NULL;
    assert_ch_ok(ch_data_create(&o, &u, &data));
    assert_int_equal(data->train->length, 40);
    assert_int_equal(data->test->length, 12);
    /* 40 samples over 2 ranks: 20 per rank, batches of 8, drop_last: 2 */
    assert_int_equal(ch_loader_num_batches(data->train_loader), 2);
    /* test: 6 per rank, no batch dropped: 1 */
    assert_non_null(data->test_loader);
    assert_int_equal(ch_loader_num_batches(data->test_loader), 1);
    assert_ch_ok(ch_loader_start_epoch(data->train_loader, 0));
    ch_batch_t *b = NULL;
    assert_ch_ok(ch_loader_next(data->train_loader, &b));
    assert_non_null(b);
    assert_int_equal(b->n, 8);
    assert_int_equal(b->c, 3);
    assert_int_equal(b->h, 32);
    ch_loader_release(data->train_loader, b);
    ch_data_destroy(data);
    /* the model's channels and classes are checked against the data */
    u.in_channels = 1;
    o.n_mean = o.n_std = 1;
    assert_ch_error(ch_data_create(&o, &u, &data), CH_ERR_CONFIG,
                    "model.in_channels is 1 but");
    assert_null(data);
    u.in_channels = 3;
    u.num_classes = 5;
    assert_ch_error(ch_data_create(&o, &u, &data), CH_ERR_CONFIG, "model.num_classes is 5 but");
    /* no eval: no test loader */
    u.num_classes = 10;
    u.eval = 0;
    assert_ch_ok(ch_data_create(&o, &u, &data));
    assert_null(data->test_loader);
    ch_data_destroy(data);
    /* a missing directory names it */
    o.path = "/nonexistent/cifar";
    assert_ch_error(ch_data_create(&o, &u, &data), CH_ERR_IO, "/nonexistent/cifar");
    ch_config_destroy(cfg);
    remove_dir(d);
}

/* The CIFAR data of test_data_create_cifar for the feed tests. */
static ch_data_t *cifar_data(char *d, size_t dlen, int eval)
{
    char opt[1100];
    snprintf(d, dlen, "%s/tests/tmp-feed-%d", ch_test_builddir(), (int)getpid());
    write_cifar(d, 12);
    snprintf(opt, sizeof opt, "--data.path=%s", d);
    char *argv[] = {"prog", opt, "--data.format=cifar10", "--data.workers=1",
                    "--data.random_crop_padding=2", NULL};
    ch_config_t *cfg = NULL;
    assert_ch_ok(load(ch_data_config_table(), argv, &cfg));
    ch_data_options_t o;
    assert_ch_ok(ch_data_options_from_config(cfg, &o));
    ch_data_setup_t u = {.in_channels = 3, .num_classes = 10, .batch_size = 8, .seed = 3,
                         .rank = 0, .world_size = 1, .eval = eval};
    ch_data_t *data = NULL;
    assert_ch_ok(ch_data_create(&o, &u, &data));
    ch_config_destroy(cfg);
    return data;
}

/* Copy of every batch of an epoch as the loader hands it out, for
 * comparison: images then labels of batch k at ref[k]. */
typedef struct {
    int n;
    float *x[16];
    int64_t *y[16];
    int64_t rows[16];
} epoch_copy_t;

static void copy_epoch(ch_loader_t *l, int64_t epoch, epoch_copy_t *e)
{
    memset(e, 0, sizeof *e);
    assert_ch_ok(ch_loader_start_epoch(l, epoch));
    for (;;) {
        ch_batch_t *b = NULL;
        assert_ch_ok(ch_loader_next(l, &b));
        if (!b) break;
        size_t nx = (size_t)(b->n * b->c * b->h * b->w);
        e->x[e->n] = malloc(nx * sizeof(float) + 1);
        e->y[e->n] = malloc((size_t)b->n * sizeof(int64_t) + 1);
        memcpy(e->x[e->n], b->images, nx * sizeof(float));
        memcpy(e->y[e->n], b->labels, (size_t)b->n * sizeof(int64_t));
        e->rows[e->n++] = b->n;
        ch_loader_release(l, b);
    }
}

static void free_epoch(epoch_copy_t *e)
{
    for (int k = 0; k < e->n; k++) {
        free(e->x[k]);
        free(e->y[k]);
    }
}

static void test_batch_feed_cpu(void **state)
{
    (void)state;
    char d[1024];
    ch_data_t *data = cifar_data(d, sizeof d, 1);
    ch_compute_t *cx = NULL;
    assert_ch_ok(ch_compute_create(NULL, &cx));
    ch_loader_t *loaders[2] = {data->train_loader, data->test_loader};
    ch_batch_feed_t *feed = NULL;
    assert_ch_ok(ch_batch_feed_create(cx, CH_DEV_CPU, 0, loaders, 2, &feed));
    epoch_copy_t ref;
    copy_epoch(data->train_loader, 1, &ref);
    assert_int_equal(ref.n, 7); /* 60 samples, batches of 8, drop_last */
    /* the feed hands out the loader's batches, in order, wrapped */
    assert_ch_ok(ch_loader_start_epoch(data->train_loader, 1));
    assert_ch_ok(ch_batch_feed_start(feed, data->train_loader, -1));
    int k = 0;
    for (;; k++) {
        ch_step_batch_t b;
        assert_ch_ok(ch_batch_feed_next(feed, &b));
        if (!b.x.data) break;
        assert_int_equal(b.x.dev, CH_DEV_CPU);
        assert_int_equal(b.x.ndim, 4);
        assert_int_equal(b.x.shape[0], ref.rows[k]);
        assert_int_equal(b.x.shape[1], 3);
        assert_int_equal(b.y.shape[0], ref.rows[k]);
        assert_memory_equal(b.x.data, ref.x[k], (size_t)ch_tensor_numel(&b.x) * sizeof(float));
        assert_memory_equal(b.y.data, ref.y[k], (size_t)ref.rows[k] * sizeof(int64_t));
        assert_ch_ok(ch_batch_feed_prefetch(feed)); /* nothing on the CPU */
    }
    assert_int_equal(k, ref.n);
    /* at most max_batches, from a later first batch; stop gives the held one back */
    assert_ch_ok(ch_loader_start_epoch_at(data->train_loader, 1, 2));
    assert_ch_ok(ch_batch_feed_start(feed, data->train_loader, 3));
    for (k = 0;; k++) {
        ch_step_batch_t b;
        assert_ch_ok(ch_batch_feed_next(feed, &b));
        if (!b.x.data) break;
        assert_memory_equal(b.x.data, ref.x[k + 2], (size_t)ch_tensor_numel(&b.x) * sizeof(float));
    }
    assert_int_equal(k, 3);
    assert_ch_ok(ch_batch_feed_stop(feed));
    /* the test loader through the same feed: padding counted in n_real */
    assert_ch_ok(ch_loader_start_epoch(data->test_loader, 0));
    assert_ch_ok(ch_batch_feed_start(feed, data->test_loader, -1));
    int64_t rows = 0, real = 0;
    for (;;) {
        ch_step_batch_t b;
        assert_ch_ok(ch_batch_feed_next(feed, &b));
        if (!b.x.data) break;
        rows += b.x.shape[0];
        real += b.n_real;
    }
    assert_int_equal(rows, 12);
    assert_int_equal(real, 12);
    /* an early stop mid-epoch, then a new epoch: nothing stays held */
    assert_ch_ok(ch_loader_start_epoch(data->train_loader, 2));
    assert_ch_ok(ch_batch_feed_start(feed, data->train_loader, -1));
    ch_step_batch_t b;
    assert_ch_ok(ch_batch_feed_next(feed, &b));
    assert_non_null(b.x.data);
    ch_batch_feed_destroy(feed);
    free_epoch(&ref);
    ch_compute_destroy(cx);
    ch_data_destroy(data);
    remove_dir(d);
}

static void test_batch_feed_gpu(void **state)
{
    (void)state;
    int ndev = 0;
    if (!ch_device_backend_compiled() || ch_device_count(&ndev) != CH_OK || ndev < 1) {
        ch_error_clear();
        ch_test_skip("%s", ch_device_backend_compiled() ? "no GPU visible" : "built without CUDA");
        return;
    }
    char d[1024];
    ch_data_t *data = cifar_data(d, sizeof d, 0);
    ch_compute_options_t co;
    ch_compute_options_default(&co);
    co.gpu_device = 0;
    ch_compute_t *cx = NULL;
    assert_ch_ok(ch_compute_create(&co, &cx));
    ch_batch_feed_t *feed = NULL;
    assert_ch_ok(ch_batch_feed_create(cx, CH_DEV_CUDA, 0, &data->train_loader, 1, &feed));
    epoch_copy_t ref;
    copy_epoch(data->train_loader, 0, &ref);
    /* double-buffered: prefetch after each next; every batch arrives intact */
    assert_ch_ok(ch_loader_start_epoch(data->train_loader, 0));
    assert_ch_ok(ch_batch_feed_start(feed, data->train_loader, -1));
    int k = 0;
    for (;; k++) {
        ch_step_batch_t b;
        assert_ch_ok(ch_batch_feed_next(feed, &b));
        if (!b.x.data) break;
        assert_int_equal(b.x.dev, CH_DEV_CUDA);
        assert_ch_ok(ch_batch_feed_prefetch(feed));
        size_t nx = (size_t)ch_tensor_numel(&b.x);
        float *hx = malloc(nx * sizeof(float));
        int64_t *hy = malloc((size_t)ref.rows[k] * sizeof(int64_t));
        assert_ch_ok(ch_compute_sync(cx));
        assert_ch_ok(ch_device_memcpy(0, hx, b.x.data, nx * sizeof(float), CH_MEMCPY_DEVICE_TO_HOST));
        assert_ch_ok(ch_device_memcpy(0, hy, b.y.data, (size_t)ref.rows[k] * sizeof(int64_t),
                                      CH_MEMCPY_DEVICE_TO_HOST));
        assert_memory_equal(hx, ref.x[k], nx * sizeof(float));
        assert_memory_equal(hy, ref.y[k], (size_t)ref.rows[k] * sizeof(int64_t));
        free(hx);
        free(hy);
    }
    assert_int_equal(k, ref.n);
    /* stop with a batch prefetched (preemption): it goes back to the loader */
    assert_ch_ok(ch_loader_start_epoch(data->train_loader, 0));
    assert_ch_ok(ch_batch_feed_start(feed, data->train_loader, -1));
    ch_step_batch_t b;
    assert_ch_ok(ch_batch_feed_next(feed, &b));
    assert_ch_ok(ch_batch_feed_prefetch(feed));
    assert_ch_ok(ch_batch_feed_stop(feed));
    ch_batch_feed_destroy(feed);
    free_epoch(&ref);
    ch_compute_destroy(cx);
    ch_data_destroy(data);
    remove_dir(d);
}

static void test_ddp_options(void **state)
{
    (void)state;
    ch_config_t *cfg = NULL;
    ch_ddp_options_t o;
    char *dflt[] = {"prog", NULL};
    assert_ch_ok(load(ch_ddp_config_table(), dflt, &cfg));
    assert_ch_ok(ch_ddp_options_from_config(cfg, &o));
    assert_int_equal(o.bucket_cap_bytes, (size_t)25 << 20);
    assert_int_equal(o.broadcast_buffers, 1);
    ch_config_destroy(cfg);
    char *set[] = {"prog", "--dist.bucket_mb=0.5", "--dist.broadcast_buffers=false", NULL};
    assert_ch_ok(load(ch_ddp_config_table(), set, &cfg));
    assert_ch_ok(ch_ddp_options_from_config(cfg, &o));
    assert_int_equal(o.bucket_cap_bytes, (size_t)1 << 19);
    assert_int_equal(o.broadcast_buffers, 0);
    ch_config_destroy(cfg);
    char *bad[] = {"prog", "--dist.bucket_mb=0", NULL};
    assert_ch_error(load(ch_ddp_config_table(), bad, &cfg), CH_ERR_CONFIG,
                    "dist.bucket_mb");
}

static void test_sgd_and_schedule_options(void **state)
{
    (void)state;
    const ch_config_table_t t[2] = {ch_sgd_config_table(), ch_lr_cosine_config_table()};
    assert_string_equal(t[0].title, "optimizer");
    assert_string_equal(t[1].title, "schedule");
    ch_config_t *cfg = NULL;
    ch_sgd_options_t o;
    ch_lr_cosine_t sch;
    char *dflt[] = {"prog", NULL};
    assert_ch_ok(load_tables(t, 2, dflt, &cfg));
    assert_ch_ok(ch_sgd_options_from_config(cfg, &o));
    assert_true(o.lr == 0.01 && o.momentum == 0.9 && o.dampening == 0 &&
                o.weight_decay == 0.005 && !o.nesterov);
    assert_ch_ok(ch_lr_cosine_from_config(cfg, 0.02, &sch));
    assert_int_equal(sch.epochs, 5);
    assert_true(sch.lrf == 0.1 && sch.base_lr == 0.02 && sch.epoch == 0);
    ch_config_destroy(cfg);
    char *nest[] = {"prog", "--optimizer.nesterov", "--optimizer.momentum=0", NULL};
    assert_ch_ok(load_tables(t, 2, nest, &cfg));
    assert_ch_error(ch_sgd_options_from_config(cfg, &o), CH_ERR_CONFIG,
                    "optimizer.nesterov needs momentum > 0 and dampening 0 (got momentum 0, "
                    "dampening 0)");
    ch_config_destroy(cfg);
    char *set[] = {"prog", "--optimizer.nesterov", "--schedule.epochs=90", "--schedule.lrf=0", NULL};
    assert_ch_ok(load_tables(t, 2, set, &cfg));
    assert_ch_ok(ch_sgd_options_from_config(cfg, &o));
    assert_int_equal(o.nesterov, 1);
    assert_ch_ok(ch_lr_cosine_from_config(cfg, 1.0, &sch));
    assert_int_equal(sch.epochs, 90);
    assert_true(sch.lrf == 0 && ch_lr_cosine_get(&sch) == 1.0);
    ch_config_destroy(cfg);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_data_defaults),
        cmocka_unit_test(test_data_options_errors),
        cmocka_unit_test(test_data_auto_stats),
        cmocka_unit_test(test_data_create_cifar),
        cmocka_unit_test(test_batch_feed_cpu),
        cmocka_unit_test(test_batch_feed_gpu),
        cmocka_unit_test(test_ddp_options),
        cmocka_unit_test(test_sgd_and_schedule_options),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
