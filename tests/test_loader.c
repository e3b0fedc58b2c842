/* Tests for io/data/loader: sampler order whatever the worker count, identical
 * augmentation across worker counts, padding counts, errors from workers,
 * shutdown, and (under MPI) that the ranks' batches cover the dataset. */
#include "config.h"

#include "tests/harness.h"

#include "io/data/dataset.h"
#include "io/data/loader.h"
#include "framework/tensor/device.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jpeglib.h>

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"

/* n images 28x28x1, pixel (y, x) of image i = (i * 13 + y * 28 + x) % 256,
 * label i % 10 */
static ch_dataset_t *synthetic(int64_t n)
{
    ch_dataset_t *ds;
    uint8_t *px;
    int64_t *lab;
    assert_ch_ok(ch_dataset_memory_create("idx", "synthetic", n, 28, 28, 1, 10, &px, &lab, &ds));
    for (int64_t i = 0; i < n; i++) {
        lab[i] = i % 10;
        for (int p = 0; p < 784; p++) px[i * 784 + p] = (uint8_t)((i * 13 + p) % 256);
    }
    return ds;
}

static const float MEAN1[1] = {0.2860f}, STD1[1] = {0.3530f};

static void train_config(ch_loader_options_t *cfg, ch_transform_t *ops)
{
    ops[0] = ch_tf_random_crop(28, 4);
    ops[1] = ch_tf_random_hflip(0.5);
    ops[2] = ch_tf_normalize(1, MEAN1, STD1);
    ch_loader_options_default(cfg);
    cfg->transforms = ops;
    cfg->n_transforms = 3;
    cfg->batch_size = 16;
    cfg->seed = 5;
}

/* Run one epoch; copy images/labels/indices of every batch into the arrays. */
static int64_t run_epoch(ch_loader_t *l, int64_t epoch, float *images, int64_t *labels,
                         int64_t *indices)
{
    assert_ch_ok(ch_loader_start_epoch(l, epoch));
    int64_t k = 0, nb = 0;
    for (;;) {
        ch_batch_t *b;
        assert_ch_ok(ch_loader_next(l, &b));
        if (!b) break;
        assert_int_equal(b->index, nb);
        assert_int_equal(b->epoch, epoch);
        size_t chw = (size_t)b->c * (size_t)b->h * (size_t)b->w;
        memcpy(images + (size_t)k * chw, b->images, (size_t)b->n * chw * sizeof(float));
        memcpy(labels + k, b->labels, (size_t)b->n * sizeof(int64_t));
        memcpy(indices + k, b->indices, (size_t)b->n * sizeof(int64_t));
        k += b->n;
        nb++;
        ch_loader_release(l, b);
    }
    assert_int_equal(nb, ch_loader_num_batches(l));
    return k;
}

static void test_order_and_content_independent_of_workers(void **state)
{
    enum { N = 1000 };
    ch_dataset_t *ds = synthetic(N);
    ch_transform_t ops[3];
    ch_loader_options_t cfg;
    train_config(&cfg, ops);
    cfg.world_size = 3;
    cfg.rank = 1;
    static float img[5][N * 784];
    static int64_t lab[5][N], idx[5][N];
    const int workers[5] = {0, 1, 2, 4, 3};
    const int prefetch[5] = {0, 1, 0, 3, 8};
    int64_t count = 0;
    for (int t = 0; t < 5; t++) {
        cfg.num_workers = workers[t];
        cfg.prefetch = prefetch[t];
        ch_loader_t *l;
        assert_ch_ok(ch_loader_create(ds, &cfg, &l));
        assert_int_equal(ch_loader_num_batches(l), (334 + 15) / 16);
        int64_t k = run_epoch(l, 2, img[t], lab[t], idx[t]);
        assert_int_equal(k, 334);
        /* the sampler's order, the dataset's labels */
        const ch_sampler_t *s = ch_loader_sampler(l);
        assert_memory_equal(idx[t], ch_sampler_indices(s), (size_t)k * sizeof(int64_t));
        for (int64_t i = 0; i < k; i++) assert_int_equal(lab[t][i], idx[t][i] % 10);
        if (t > 0) {
            assert_memory_equal(img[t], img[0], (size_t)k * 784 * sizeof(float));
            assert_memory_equal(idx[t], idx[0], (size_t)k * sizeof(int64_t));
        }
        count = k;
        ch_loader_destroy(l);
    }
    /* the same epoch again gives the same batches; another epoch differs */
    cfg.num_workers = 2;
    cfg.prefetch = 0;
    ch_loader_t *l;
    assert_ch_ok(ch_loader_create(ds, &cfg, &l));
    run_epoch(l, 3, img[1], lab[1], idx[1]);
    run_epoch(l, 2, img[2], lab[2], idx[2]);
    assert_memory_equal(img[2], img[0], (size_t)count * 784 * sizeof(float));
    assert_memory_not_equal(idx[1], idx[0], (size_t)count * sizeof(int64_t));
    /* resuming epoch 2 at batch 5 gives the same batches from there */
    assert_ch_error(ch_loader_start_epoch_at(l, 2, 23), CH_ERR_RANGE, "first batch 23");
    assert_ch_ok(ch_loader_start_epoch_at(l, 2, 5));
    int64_t k = 5 * 16, nb = 5;
    ch_batch_t *b;
    while (ch_loader_next(l, &b) == CH_OK && b) {
        assert_int_equal(b->index, nb);
        assert_memory_equal(b->images, img[0] + (size_t)k * 784, (size_t)b->n * 784 * sizeof(float));
        assert_memory_equal(b->indices, idx[0] + k, (size_t)b->n * sizeof(int64_t));
        k += b->n;
        nb++;
        ch_loader_release(l, b);
    }
    assert_int_equal(k, count);
    ch_loader_destroy(l);
    ch_dataset_destroy(ds);
}

static void test_padding_and_partial_batches(void **state)
{
    ch_dataset_t *ds = synthetic(10);
    ch_transform_t ops[1] = {ch_tf_normalize(1, NULL, NULL)};
    ch_loader_options_t cfg;
    ch_loader_options_default(&cfg);
    cfg.transforms = ops;
    cfg.n_transforms = 1;
    cfg.world_size = 4;
    cfg.rank = 3;
    cfg.batch_size = 2;
    cfg.num_workers = 1;
    ch_loader_t *l;
    assert_ch_ok(ch_loader_create(ds, &cfg, &l));
    assert_int_equal(ch_loader_num_batches(l), 2); /* 3 samples: 2 + 1 */
    assert_ch_ok(ch_loader_start_epoch(l, 0));
    ch_batch_t *b;
    assert_ch_ok(ch_loader_next(l, &b));
    assert_int_equal(b->n, 2);
    assert_int_equal(b->n_real, 2);
    /* ToTensor only: pixel 0 of sample i is ((i*13) % 256) / 255 */
    assert_true(b->images[0] == (float)((b->indices[0] * 13) % 256) / 255.0f);
    ch_loader_release(l, b);
    assert_ch_ok(ch_loader_next(l, &b));
    assert_int_equal(b->n, 1);
    assert_int_equal(b->n_real, 0); /* global position 11 >= 10: padding */
    ch_loader_release(l, b);
    assert_ch_ok(ch_loader_next(l, &b));
    assert_null(b);
    ch_loader_destroy(l);

    /* smaller than the world size: padded without drop_last, error with it */
    ch_dataset_t *tiny = synthetic(3);
    cfg.world_size = 8;
    cfg.rank = 7;
    cfg.batch_size = 4;
    assert_ch_ok(ch_loader_create(tiny, &cfg, &l));
    assert_ch_ok(ch_loader_start_epoch(l, 0));
    assert_ch_ok(ch_loader_next(l, &b));
    assert_int_equal(b->n, 1);
    assert_int_equal(b->n_real, 0);
    ch_loader_release(l, b);
    ch_loader_destroy(l);
    cfg.sampler_drop_last = 1;
    l = NULL;
    assert_ch_error(ch_loader_create(tiny, &cfg, &l), CH_ERR_RANGE,
                    "has 3 samples; with world size 8 (sampler drop_last 1) rank 7 gets 0 samples");
    assert_null(l);
    cfg.sampler_drop_last = 0;
    cfg.drop_last = 1;
    cfg.world_size = 1;
    cfg.rank = 0;
    assert_ch_error(ch_loader_create(tiny, &cfg, &l), CH_ERR_RANGE, "make no batch of 4");
    ch_dataset_destroy(tiny);
    ch_dataset_destroy(ds);
}

static void test_bad_configs_and_holding(void **state)
{
    ch_dataset_t *ds = synthetic(100);
    ch_transform_t ops[2] = {ch_tf_resize(30), ch_tf_normalize(3, NULL, NULL)};
    ch_loader_options_t cfg;
    ch_loader_options_default(&cfg);
    ch_loader_t *l = NULL;
    assert_ch_error(ch_loader_create(ds, &cfg, &l), CH_ERR_INVALID, "no transforms");
    cfg.transforms = ops + 1;
    cfg.n_transforms = 1;
    cfg.batch_size = 0;
    assert_ch_error(ch_loader_create(ds, &cfg, &l), CH_ERR_INVALID, "batch size 0");
    cfg.batch_size = 8;
    cfg.rank = 1;
    assert_ch_error(ch_loader_create(ds, &cfg, &l), CH_ERR_INVALID, "invalid rank 1");
    cfg.rank = 0;
    cfg.prefetch = 2;
    assert_ch_ok(ch_loader_create(ds, &cfg, &l));
    ch_batch_t *b1, *b2, *b3;
    assert_ch_error(ch_loader_next(l, &b1), CH_ERR_INVALID, "before ch_loader_start_epoch");
    assert_ch_ok(ch_loader_start_epoch(l, 0));
    assert_ch_ok(ch_loader_next(l, &b1));
    assert_ch_ok(ch_loader_next(l, &b2));
    assert_ch_error(ch_loader_next(l, &b3), CH_ERR_INVALID, "2 batches held");
    ch_loader_release(l, b2); /* out of order is fine */
    ch_loader_release(l, b1);
    assert_ch_ok(ch_loader_next(l, &b3));
    assert_int_equal(b3->index, 2);
    /* destroy in the middle of an epoch, batches queued */
    ch_loader_destroy(l);
    l = NULL;
    ch_dataset_destroy(ds);
}

/* ImageFolder with one undecodable file: the error reaches the consumer with
 * the file and index, the epoch stops, the next epoch runs again. */
static void test_worker_error_reaches_consumer(void **state)
{
    char dir[2048], p[4096];
    snprintf(dir, sizeof dir, "%.1900s/tests/tmp_loader.%d", ch_test_builddir(), (int)getpid());
    snprintf(p, sizeof p, "%s/cls", dir);
    mkdir(dir, 0755);
    mkdir(p, 0755);
    /* 39 valid 1x1 grayscale PNGs (pixel 0) and, as sample 27, a JPEG
     * header followed by garbage */
    static const uint8_t png1x1[] = {
        0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44,
        0x52, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x00, 0x00, 0x00, 0x00, 0x3a,
        0x7e, 0x9b, 0x55, 0x00, 0x00, 0x00, 0x0a, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0x60,
        0x00, 0x00, 0x00, 0x02, 0x00, 0x01, 0x48, 0xaf, 0xa4, 0x71, 0x00, 0x00, 0x00, 0x00, 0x49,
        0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82};
    for (int i = 0; i < 40; i++) {
        snprintf(p, sizeof p, "%s/cls/img%02d.%s", dir, i, i == 27 ? "jpg" : "png");
        FILE *f = fopen(p, "wb");
        assert_non_null(f);
        if (i == 27)
            fwrite("\xff\xd8\xff\xe0garbage", 1, 11, f);
        else
            fwrite(png1x1, 1, sizeof png1x1, f);
        fclose(f);
    }
    ch_dataset_t *ds;
    assert_ch_ok(ch_dataset_imagefolder_open(dir, 1, &ds));
    assert_int_equal(ds->length, 40);
    ch_transform_t ops[2] = {ch_tf_resize(4), ch_tf_normalize(1, NULL, NULL)};
    ch_loader_options_t cfg;
    ch_loader_options_default(&cfg);
    cfg.transforms = ops;
    cfg.n_transforms = 2;
    cfg.batch_size = 4;
    cfg.shuffle = 0;
    /* Resize(4) of varying sizes is not fixed: rejected */
    ch_loader_t *l = NULL;
    assert_ch_error(ch_loader_create(ds, &cfg, &l), CH_ERR_INVALID, "varying size");
    ops[0] = ch_tf_resize_hw(4, 4);
    for (int run = 0; run <= 5; run++) { /* workers 0..2, without and with fast_decode */
        int workers = run % 3;
        cfg.num_workers = workers;
        cfg.fast_decode = run >= 3; /* the same error from the partial JPEG decode */
        assert_ch_ok(ch_loader_create(ds, &cfg, &l));
        for (int epoch = 0; epoch < 2; epoch++) {
            assert_ch_ok(ch_loader_start_epoch(l, epoch));
            int good = 0;
            ch_status st;
            ch_batch_t *b;
            while ((st = ch_loader_next(l, &b)) == CH_OK && b) {
                assert_int_equal(b->h, 4);
                assert_float_equal(b->images[0], 0.0f, 0.0f);
                good++;
                ch_loader_release(l, b);
            }
            assert_int_equal(st, CH_ERR_FORMAT);
            assert_int_equal(good, 6); /* batches 0..5 fine, batch 6 holds sample 27 */
            assert_non_null(strstr(ch_error_message(), "img27.jpg"));
            assert_non_null(strstr(ch_error_message(), "sample 27"));
            assert_non_null(strstr(ch_error_message(), "batch 6"));
            assert_ch_error(ch_loader_next(l, &b), CH_ERR_FORMAT, "img27.jpg");
            assert_null(b);
        }
        ch_loader_destroy(l);
    }
    ch_dataset_destroy(ds);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* data.fast_decode through the loader: 12 RGB JPEGs of 120x90 (written
 * with libjpeg), RandomResizedCrop(24) + flip: epoch 1's batches with
 * fast decode (1 and 2 workers) are within the fast path's bound of the
 * default ones (DCT scaling is used for crops >= 48 px on both axes), and
 * at least some samples (no DCT scaling) are bit-identical. */
static void test_fast_decode_loader(void **state)
{
    char dir[2048], p[4096];
    snprintf(dir, sizeof dir, "%.1900s/tests/tmp_loader_fast.%d", ch_test_builddir(), (int)getpid());
    snprintf(p, sizeof p, "%s/cls", dir);
    mkdir(dir, 0755);
    mkdir(p, 0755);
    const int W = 120, H = 90, N = 12; /* smooth photo-like gradients */
    uint8_t *px = malloc((size_t)W * H * 3);
    for (int i = 0; i < N; i++) {
        for (int k = 0; k < W * H * 3; k++)
            px[k] = (uint8_t)lrint(127.5 + 120 * sin((k / 3) % W * (0.05 + 0.01 * (i % 4)) +
                                                   (k / 3) / W * 0.08 + (k % 3) + i));
        snprintf(p, sizeof p, "%s/cls/%02d.jpg", dir, i);
        FILE *f = fopen(p, "wb");
        assert_non_null(f);
        struct jpeg_compress_struct ci;
        struct jpeg_error_mgr jerr;
        ci.err = jpeg_std_error(&jerr);
        jpeg_create_compress(&ci);
        jpeg_stdio_dest(&ci, f);
        ci.image_width = (JDIMENSION)W;
        ci.image_height = (JDIMENSION)H;
        ci.input_components = 3;
        ci.in_color_space = JCS_RGB;
        jpeg_set_defaults(&ci);
        jpeg_set_quality(&ci, 90, TRUE);
        jpeg_start_compress(&ci, TRUE);
        for (int y = 0; y < H; y++) {
            JSAMPROW row = px + (size_t)y * W * 3;
            jpeg_write_scanlines(&ci, &row, 1);
        }
        jpeg_finish_compress(&ci);
        jpeg_destroy_compress(&ci);
        fclose(f);
    }
    free(px);
    ch_dataset_t *ds;
    assert_ch_ok(ch_dataset_imagefolder_open(dir, 3, &ds));
    static const float m0[3] = {0, 0, 0}, s255[3] = {1 / 255.f, 1 / 255.f, 1 / 255.f};
    ch_transform_t ops[3] = {ch_tf_random_resized_crop(24), ch_tf_random_hflip(0.5),
                             ch_tf_normalize(3, m0, s255)};
    size_t chw = 3 * 24 * 24;
    float *ref = malloc((size_t)N * chw * sizeof(float)), *got = malloc((size_t)N * chw * sizeof(float));
    int64_t lab[12], idx[12], lab2[12], idx2[12];
    int identical = 0;
    for (int run = 0; run < 3; run++) {
        ch_loader_options_t cfg;
        ch_loader_options_default(&cfg);
        cfg.transforms = ops;
        cfg.n_transforms = 3;
        cfg.batch_size = 4;
        cfg.seed = 3;
        cfg.num_workers = run == 0 ? 1 : run;
        cfg.fast_decode = run > 0;
        ch_loader_t *l;
        assert_ch_ok(ch_loader_create(ds, &cfg, &l));
        if (run == 0) { /* the default path: the reference */
            assert_int_equal(run_epoch(l, 1, ref, lab, idx), N);
        } else {
            assert_int_equal(run_epoch(l, 1, got, lab2, idx2), N);
            assert_memory_equal(idx, idx2, sizeof idx);
            assert_memory_equal(lab, lab2, sizeof lab);
            for (int i = 0; i < N; i++) {
                double sum = 0;
                for (size_t k = 0; k < chw; k++)
                    sum += fabs((double)ref[(size_t)i * chw + k] - (double)got[(size_t)i * chw + k]);
                if (sum == 0) identical++;
                assert_true(sum / (double)chw < 3.0); /* tests/test_transforms.c's bound */
            }
        }
        ch_loader_destroy(l);
    }
    assert_true(identical > 0 && identical < 2 * N); /* both kinds occur */
    free(ref);
    free(got);
    ch_dataset_destroy(ds);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_fashion_mnist_epoch(void **state)
{
    struct stat sb;
    if (stat(FMNIST_DIR, &sb) != 0) ch_test_skip("%s not installed", FMNIST_DIR);
    ch_dataset_t *ds;
    assert_ch_ok(ch_dataset_fashion_mnist_open(FMNIST_DIR, 0, &ds));
    ch_transform_t ops[1] = {ch_tf_normalize(1, MEAN1, STD1)};
    ch_loader_options_t cfg;
    ch_loader_options_default(&cfg);
    cfg.transforms = ops;
    cfg.n_transforms = 1;
    cfg.batch_size = 256;
    cfg.shuffle = 0;
    cfg.pinned = 1;
    ch_loader_t *l;
    assert_ch_ok(ch_loader_create(ds, &cfg, &l));
    assert_int_equal(ch_loader_num_batches(l), 40);
    assert_ch_ok(ch_loader_start_epoch(l, 0));
    int64_t counts[10] = {0}, seen = 0;
    ch_batch_t *b;
    ch_image_t img;
    ch_image_init(&img);
    while (ch_loader_next(l, &b) == CH_OK && b) {
        for (int64_t k = 0; k < b->n; k++) {
            counts[b->labels[k]]++;
            int64_t label;
            assert_ch_ok(ch_dataset_get(ds, b->indices[k], &img, &label));
            assert_int_equal(label, b->labels[k]);
            float want = ((float)img.data[100] / 255.0f - MEAN1[0]) / STD1[0];
            assert_true(b->images[k * 784 + 100] == want);
        }
        seen += b->n;
        ch_loader_release(l, b);
    }
    assert_int_equal(seen, 10000);
    for (int k = 0; k < 10; k++) assert_int_equal(counts[k], 1000);
    ch_image_free(&img);
    ch_loader_destroy(l);
    ch_dataset_destroy(ds);
}

static void test_fashion_mnist_helper(void **state)
{
    ch_loader_options_t cfg;
    ch_loader_options_default(&cfg);
    cfg.batch_size = 128;
    cfg.drop_last = 1;
    cfg.world_size = 4;
    cfg.rank = 3;
    ch_loader_t *l = NULL;
    ch_dataset_t *ds = NULL;
    assert_ch_error(ch_loader_fashion_mnist_create("/nonexistent/fmnist", 1, &cfg, &l, &ds),
                    CH_ERR_IO, "/nonexistent/fmnist");
    assert_null(l);
    assert_null(ds);
    struct stat sb;
    if (stat(FMNIST_DIR, &sb) != 0) ch_test_skip("%s not installed", FMNIST_DIR);
    assert_ch_ok(ch_loader_fashion_mnist_create(FMNIST_DIR, 1, &cfg, &l, &ds));
    assert_int_equal(ch_loader_num_batches(l), 15000 / 128);
    int c, h, w;
    ch_loader_sample_shape(l, &c, &h, &w);
    assert_int_equal(c * h * w, 784);
    assert_ch_ok(ch_loader_start_epoch(l, 1));
    ch_batch_t *b;
    assert_ch_ok(ch_loader_next(l, &b));
    assert_int_equal(b->n, 128);
    /* RandomCrop padding shows up as Normalize(0) in some images */
    const float pad = (0.0f - CH_FASHION_MNIST_MEAN) / CH_FASHION_MNIST_STD;
    int64_t pads = 0;
    for (int64_t i = 0; i < 128 * 784; i++) pads += b->images[i] == pad;
    assert_true(pads > 0);
    ch_loader_release(l, b);
    ch_loader_destroy(l);
    ch_dataset_destroy(ds);
}

/* Every rank of the MPI world loads its share; together they cover the
 * dataset exactly once (n divisible by the world size). */
static void test_ranks_cover_dataset(void **state)
{
    int W = ch_test_world_size(), r = ch_test_rank();
    enum { N = 240 };
    ch_dataset_t *ds = synthetic(N);
    ch_transform_t ops[1] = {ch_tf_normalize(1, NULL, NULL)};
    ch_loader_options_t cfg;
    ch_loader_options_default(&cfg);
    cfg.transforms = ops;
    cfg.n_transforms = 1;
    cfg.batch_size = 7;
    cfg.world_size = W;
    cfg.rank = r;
    ch_loader_t *l;
    ch_status st = ch_loader_create(ds, &cfg, &l);
    int64_t mine[N], all[N];
    int64_t k = 0;
    if (st == CH_OK && ch_loader_start_epoch(l, 1) == CH_OK) {
        ch_batch_t *b;
        while (ch_loader_next(l, &b) == CH_OK && b) {
            for (int64_t i = 0; i < b->n && k < N; i++) mine[k++] = b->indices[i];
            ch_loader_release(l, b);
        }
        ch_loader_destroy(l);
    }
    int64_t per = N / W;
    for (int64_t i = k; i < per; i++) mine[i] = -1;
    MPI_Allgather(mine, (int)per, MPI_INT64_T, all, (int)per, MPI_INT64_T, MPI_COMM_WORLD);
    assert_int_equal(st, CH_OK);
    assert_int_equal(k, per);
    static int hits[N];
    memset(hits, 0, sizeof hits);
    for (int64_t i = 0; i < per * W; i++) {
        assert_true(all[i] >= 0 && all[i] < N);
        hits[all[i]]++;
    }
    for (int i = 0; i < N; i++) assert_int_equal(hits[i], 1);
    ch_dataset_destroy(ds);
}

/* The page-locked cap: the first slots that fit are asked to be pinned,
 * the others pageable; a batch through a pageable slot equals one through a
 * pinned slot (the same epoch as with no pinning at all). Without a GPU no
 * slot is page-locked, whatever is asked. */
static void test_pinned_cap(void **state)
{
    (void)state;
    ch_dataset_t *ds = synthetic(200);
    ch_transform_t ops[3];
    ch_loader_options_t cfg;
    train_config(&cfg, ops);
    cfg.num_workers = 2;
    cfg.prefetch = 6;
    const size_t slot = (size_t)cfg.batch_size * 784 * sizeof(float) +
                        (size_t)cfg.batch_size * sizeof(int64_t);
    const struct { int pinned; size_t cap; int asked; } cases[] = {
        {0, 0, 0},                 /* not asked */
        {1, 0, 6},                 /* default cap (1 GiB): every slot */
        {1, 2 * slot + slot / 2, 2}, /* 2.5 slots: the first two */
        {1, 2 * slot, 2},          /* exactly two */
        {1, slot - 1, 0},          /* not even one */
    };
    float *img[2];
    int64_t *lab[2], *idx[2], n[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        img[k] = malloc(200 * 784 * sizeof(float));
        lab[k] = malloc(200 * sizeof(int64_t));
        idx[k] = malloc(200 * sizeof(int64_t));
        assert_true(img[k] && lab[k] && idx[k]);
    }
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        cfg.pinned = cases[c].pinned;
        cfg.pinned_max_bytes = cases[c].cap;
        ch_loader_t *l;
        assert_ch_ok(ch_loader_create(ds, &cfg, &l));
        int asked = -1, got = -1;
        ch_loader_pinned_slots(l, &asked, &got);
        assert_int_equal(asked, cases[c].asked);
        assert_true(got >= 0 && got <= asked);
        int ndev = 0;
        if (ch_device_count(&ndev) != CH_OK) ch_error_clear();
        if (ndev == 0) assert_int_equal(got, 0);
        int k = c == 0 ? 0 : 1;
        n[k] = run_epoch(l, 1, img[k], lab[k], idx[k]);
        if (k == 1) {
            assert_int_equal(n[1], n[0]);
            assert_memory_equal(img[1], img[0], (size_t)n[0] * 784 * sizeof(float));
            assert_memory_equal(lab[1], lab[0], (size_t)n[0] * sizeof(int64_t));
        }
        ch_loader_destroy(l);
    }
    for (int k = 0; k < 2; k++) {
        free(img[k]);
        free(lab[k]);
        free(idx[k]);
    }
    ch_dataset_destroy(ds);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_and_content_independent_of_workers),
        cmocka_unit_test(test_padding_and_partial_batches),
        cmocka_unit_test(test_bad_configs_and_holding),
        cmocka_unit_test(test_worker_error_reaches_consumer),
        cmocka_unit_test(test_fast_decode_loader),
        cmocka_unit_test(test_fashion_mnist_epoch),
        cmocka_unit_test(test_fashion_mnist_helper),
        cmocka_unit_test(test_ranks_cover_dataset),
        cmocka_unit_test(test_pinned_cap),
    };
    return ch_test_main_mpi(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
