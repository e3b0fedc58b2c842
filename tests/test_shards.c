/* Tests for io/formats/shards and io/data/shards: WebDataset tar shards made
 * by Python's tarfile (tests/golden/shards_golden.py) read by index give the
 * same samples in the same order as the IDX and ImageFolder originals, the
 * DistributedSampler order over them is torch's, and every kind of bad
 * shard or stale index is one clear error before any sample is read. Under
 * MPI (-np2) the ranks build the index together. */
#include "config.h"

#include "tests/harness.h"

#include "framework/dist/dist.h"
#include "io/data/data.h"
#include "io/data/dataset.h"
#include "io/data/sampler.h"
#include "io/data/shards.h"
#include "io/data/stage.h"
#include "io/formats/shards.h"

#include <mpi.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"
#define N_FM 2000
#define PER_SHARD 500

static char tmp_root[1024];
static ch_pg_t *g_pg; /* the MPI world (NULL when 1 process) */

static const char *tmp_path(const char *rel)
{
    static __thread char buf[8][1200];
    static __thread int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp_root, rel);
    return buf[k];
}

static const char *py(void)
{
    return getenv("PYTHON3") ? getenv("PYTHON3") : "python3";
}

static int have_torch(void)
{
    const char *h = getenv("HAVE_TORCH");
    return h && !strcmp(h, "yes");
}

static void barrier(void)
{
    if (ch_test_world_size() > 1) MPI_Barrier(MPI_COMM_WORLD);
}

/* Rank 0 runs cmd; every rank learns its result. */
static int run0(const char *cmd)
{
    int rc = 0;
    if (ch_test_rank() == 0) rc = system(cmd);
    if (ch_test_world_size() > 1) MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return rc;
}

/* The Fashion-MNIST shards (made once per run, by rank 0). */
static const char *fm_shards(void)
{
    static int made;
    static char dir[1200];
    snprintf(dir, sizeof dir, "%s", tmp_path("fm"));
    if (!made) {
        char cmd[16384];
        snprintf(cmd, sizeof cmd, "rm -rf '%s' && '%s' '%s/tests/golden/shards_golden.py' idx '%s' '%s' %d %d",
                 dir, py(), ch_test_srcdir(), FMNIST_DIR, dir, N_FM, PER_SHARD);
        assert_int_equal(run0(cmd), 0);
        made = 1;
    }
    return dir;
}

static void copy_dir(const char *from, const char *to)
{
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s' && cp -p '%s'/*.tar '%s'/", to, to, from, to);
    assert_int_equal(run0(cmd), 0);
}

static void assert_same_samples(const ch_dataset_t *a, const ch_dataset_t *b)
{
    assert_int_equal(a->length, b->length);
    ch_image_t x, y;
    ch_image_init(&x);
    ch_image_init(&y);
    for (int64_t i = 0; i < a->length; i++) {
        int64_t la, lb;
        assert_ch_ok(ch_dataset_get(a, i, &x, &la));
        assert_ch_ok(ch_dataset_get(b, i, &y, &lb));
        assert_int_equal(la, lb);
        assert_int_equal(x.h, y.h);
        assert_int_equal(x.w, y.w);
        assert_int_equal(x.c, y.c);
        assert_memory_equal(x.data, y.data, (size_t)x.h * x.w * x.c);
    }
    ch_image_free(&x);
    ch_image_free(&y);
}

/* Packed Fashion-MNIST (PNG, lossless) == IDX, sample for sample, and the
 * index is built once, then read; one open per shard however many epochs. */
static void test_fmnist_shards_equal_idx(void **state)
{
    (void)state;
    if (access(FMNIST_DIR, R_OK) != 0) ch_test_skip("no %s", FMNIST_DIR);
    const char *dir = fm_shards();
    ch_dataset_t *idx = NULL, *sub = NULL, *sh = NULL;
    assert_ch_ok(ch_dataset_fashion_mnist_open(FMNIST_DIR, 1, &idx));
    int64_t *first = malloc(N_FM * sizeof *first);
    for (int64_t i = 0; i < N_FM; i++) first[i] = i;
    assert_ch_ok(ch_dataset_subset_create(idx, first, N_FM, &sub));
    free(first);
    assert_ch_ok(ch_dataset_shards_open(dir, 1, g_pg, &sh));
    assert_string_equal(sh->kind, "shards");
    assert_int_equal(sh->num_classes, 10);
    assert_int_equal(access(tmp_path("fm/cohort-shards.index"), R_OK), 0);
    assert_int_equal(ch_dataset_shards_files_opened(sh), 0);
    assert_same_samples(sub, sh);
    assert_int_equal(ch_dataset_shards_files_opened(sh), N_FM / PER_SHARD);
    ch_image_t img;
    ch_image_init(&img);
    int64_t lab;
    for (int epoch = 0; epoch < 2; epoch++) /* more epochs: no more opens */
        for (int64_t i = sh->length - 1; i >= 0; i -= 7) assert_ch_ok(ch_dataset_get(sh, i, &img, &lab));
    assert_int_equal(ch_dataset_shards_files_opened(sh), N_FM / PER_SHARD);
    const ch_shard_index_t *ix = ch_dataset_shards_index(sh);
    assert_int_equal(ix->nshards, N_FM / PER_SHARD);
    assert_int_equal(ch_shard_index_find(ix, PER_SHARD), 1);
    assert_int_equal(ch_shard_index_find(ix, PER_SHARD - 1), 0);
    assert_int_equal(ch_shard_index_find(ix, N_FM - 1), N_FM / PER_SHARD - 1);
    /* the pax-named sample */
    const ch_shard_sample_t *s5 = &ix->shards[0].samples[5];
    assert_true(s5->key_len > 100);
    assert_memory_equal(ix->shards[0].keys + s5->key_off, "long/x", 6);
    ch_dataset_destroy(sh);
    barrier();
    /* reopened: the index is read (its mtime stays), same samples */
    struct stat before, after;
    assert_int_equal(stat(tmp_path("fm/cohort-shards.index"), &before), 0);
    barrier();
    assert_ch_ok(ch_dataset_shards_open(dir, 1, g_pg, &sh));
    assert_int_equal(stat(tmp_path("fm/cohort-shards.index"), &after), 0);
    assert_int_equal(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
    assert_int_equal(before.st_ino, after.st_ino);
    assert_same_samples(sub, sh);
    ch_image_free(&img);
    ch_dataset_destroy(sh);
    ch_dataset_destroy(sub);
    ch_dataset_destroy(idx);
    barrier();
    /* the index the ranks built together (each scanned every world-th
     * shard and shared its records) is the bytes one process builds */
    if (ch_test_rank() == 0) {
        uint8_t *together = NULL, *alone = NULL;
        size_t n_together = 0, n_alone = 0;
        assert_ch_ok(ch_dataset_read_file(tmp_path("fm/cohort-shards.index"), &together, &n_together));
        assert_int_equal(unlink(tmp_path("fm/cohort-shards.index")), 0);
        assert_ch_ok(ch_dataset_shards_open(dir, 1, NULL, &sh));
        ch_dataset_destroy(sh);
        assert_ch_ok(ch_dataset_read_file(tmp_path("fm/cohort-shards.index"), &alone, &n_alone));
        assert_int_equal(n_together, n_alone);
        assert_memory_equal(together, alone, n_alone);
        free(together);
        free(alone);
    }
    barrier();
}

/* A brace pattern and a single file name the same shards. */
static void test_pattern_and_file(void **state)
{
    (void)state;
    if (access(FMNIST_DIR, R_OK) != 0) ch_test_skip("no %s", FMNIST_DIR);
    const char *dir = fm_shards();
    char pat[4096];
    snprintf(pat, sizeof pat, "%s/fm-{000001..000003}.tar", dir);
    char **paths;
    int n;
    char *d;
    assert_ch_ok(ch_shards_list(pat, &paths, &n, &d));
    assert_int_equal(n, 3);
    assert_string_equal(paths[0], tmp_path("fm/fm-000001.tar"));
    assert_string_equal(paths[2], tmp_path("fm/fm-000003.tar"));
    assert_string_equal(d, dir);
    ch_shards_paths_free(paths, n);
    free(d);
    char *ip = ch_shards_index_path(pat);
    assert_string_equal(ip, tmp_path("fm/fm-{000001..000003}.tar.index"));
    free(ip);
    ch_dataset_t *sh;
    assert_ch_ok(ch_dataset_shards_open(pat, 1, g_pg, &sh));
    assert_int_equal(sh->length, 3 * PER_SHARD);
    ch_dataset_destroy(sh);
    assert_ch_ok(ch_dataset_shards_open(tmp_path("fm/fm-000002.tar"), 1, g_pg, &sh));
    assert_int_equal(sh->length, PER_SHARD);
    ch_dataset_destroy(sh);
    snprintf(pat, sizeof pat, "%s/fm-{000001..000004}.tar", dir); /* one too many */
    assert_ch_error(ch_dataset_shards_open(pat, 1, g_pg, &sh), CH_ERR_IO, "fm-000004.tar is missing");
    snprintf(pat, sizeof pat, "%s/fm-{000001-000004}.tar", dir);
    assert_ch_error(ch_dataset_shards_open(pat, 1, g_pg, &sh), CH_ERR_CONFIG, "{A..B}");
    barrier();
}

/* ImageFolder (JPEG files) packed with its bytes unchanged == ImageFolder. */
static void test_imagefolder_packed_equal(void **state)
{
    (void)state;
    if (access(FMNIST_DIR, R_OK) != 0) ch_test_skip("no %s", FMNIST_DIR);
    if (!have_torch()) ch_test_skip("HAVE_TORCH != yes (torchvision orders the ImageFolder)");
    char cmd[16384];
    snprintf(cmd, sizeof cmd,
             "rm -rf '%s' '%s' && '%s' '%s/tests/make_fmnist_imagefolder.py' '%s' --limit 300 "
             "> /dev/null && '%s' '%s/tests/golden/shards_golden.py' folder '%s' '%s' 128",
             tmp_path("if"), tmp_path("ifsh"), py(), ch_test_srcdir(), tmp_path("if"), py(),
             ch_test_srcdir(), tmp_path("if"), tmp_path("ifsh"));
    assert_int_equal(run0(cmd), 0);
    for (int c = 1; c <= 3; c += 2) {
        ch_dataset_t *f, *sh;
        assert_ch_ok(ch_dataset_imagefolder_open(tmp_path("if"), c, &f));
        assert_ch_ok(ch_dataset_shards_open(tmp_path("ifsh"), c, g_pg, &sh));
        assert_int_equal(sh->num_classes, f->num_classes);
        assert_same_samples(f, sh);
        ch_dataset_destroy(sh);
        ch_dataset_destroy(f);
    }
    barrier();
}

static int64_t key_index(const ch_shard_index_t *ix, const char *key)
{
    for (int s = 0; s < ix->nshards; s++)
        for (int64_t i = 0; i < ix->shards[s].n; i++) {
            const ch_shard_sample_t *x = &ix->shards[s].samples[i];
            if (strlen(key) == x->key_len && !memcmp(key, ix->shards[s].keys + x->key_off, x->key_len))
                return ix->first[s] + i;
        }
    return -1;
}

/* torch's DistributedSampler over the shard samples (keys from Python's
 * tarfile grouping) == cohort's sampler over the shard dataset. */
static void test_order_vs_torch_sampler(void **state)
{
    (void)state;
    if (access(FMNIST_DIR, R_OK) != 0) ch_test_skip("no %s", FMNIST_DIR);
    if (!have_torch()) ch_test_skip("HAVE_TORCH != yes");
    const char *dir = fm_shards();
    char cmd[16384];
    const char *out = tmp_path("order.txt");
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/golden/shards_golden.py' order '%s' 3 2 '%s'", py(),
             ch_test_srcdir(), dir, out);
    assert_int_equal(run0(cmd), 0);
    ch_dataset_t *sh;
    assert_ch_ok(ch_dataset_shards_open(dir, 1, g_pg, &sh));
    const ch_shard_index_t *ix = ch_dataset_shards_index(sh);
    FILE *f = fopen(out, "r");
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0;
    int lines = 0;
    while (getline(&line, &cap, f) > 0) {
        int e, r, pos;
        assert_int_equal(sscanf(line, "%d %d %n", &e, &r, &pos), 2);
        ch_sampler_t *smp;
        assert_ch_ok(ch_sampler_create(sh->length, 3, r, 1, 0, 0, &smp));
        assert_ch_ok(ch_sampler_set_epoch(smp, e));
        const int64_t *ind = ch_sampler_indices(smp);
        int64_t k = 0;
        for (char *tok = strtok(line + pos, " \n"); tok; tok = strtok(NULL, " \n"), k++) {
            assert_true(k < ch_sampler_num_samples(smp));
            if (k < 40 || k % 97 == 0) assert_int_equal(ind[k], key_index(ix, tok));
        }
        assert_int_equal(k, ch_sampler_num_samples(smp));
        ch_sampler_destroy(smp);
        lines++;
    }
    assert_int_equal(lines, 6);
    free(line);
    fclose(f);
    ch_dataset_destroy(sh);
    barrier();
}

/* data.format = shards through the data.* keys builds the loaders. */
static void test_data_format_shards(void **state)
{
    (void)state;
    if (access(FMNIST_DIR, R_OK) != 0) ch_test_skip("no %s", FMNIST_DIR);
    const char *dir = fm_shards();
    ch_data_options_t o;
    memset(&o, 0, sizeof o);
    o.path = dir;
    o.format = CH_DATA_SHARDS;
    o.format_name = "shards";
    o.val_path = "";
    o.val_fraction = 0.25;
    o.workers = 1;
    o.prefetch = 2;
    o.n_mean = o.n_std = 1;
    o.mean[0] = 0.286f;
    o.std[0] = 0.353f;
    ch_data_setup_t u = {.in_channels = 1, .num_classes = 10, .batch_size = 16, .seed = 1,
                         .rank = ch_test_rank(), .world_size = ch_test_world_size(), .eval = 1,
                         .pg = g_pg};
    ch_data_t *d;
    assert_ch_ok(ch_data_create(&o, &u, &d));
    assert_int_equal(d->train->length + d->test->length, N_FM);
    assert_int_equal(d->test->length, N_FM / 4);
    ch_data_destroy(d);
    /* the ImageNet recipe: RandomResizedCrop(24) + flip; test Resize(27) + CenterCrop(24) */
    o.random_resized_crop = 24;
    o.hflip = 1;
    assert_ch_ok(ch_data_create(&o, &u, &d));
    int c, h, w;
    ch_loader_sample_shape(d->train_loader, &c, &h, &w);
    assert_int_equal(c * 1000000 + h * 1000 + w, 1024024);
    ch_loader_sample_shape(d->test_loader, &c, &h, &w);
    assert_int_equal(c * 1000000 + h * 1000 + w, 1024024);
    ch_batch_t *b;
    assert_ch_ok(ch_loader_start_epoch(d->train_loader, 0));
    assert_ch_ok(ch_loader_next(d->train_loader, &b));
    assert_non_null(b);
    assert_int_equal(b->n, 16);
    float lo = 1e9f, hi = -1e9f; /* normalized pixels, not all one value */
    for (int64_t k = 0; k < 16 * 24 * 24; k++) {
        lo = b->images[k] < lo ? b->images[k] : lo;
        hi = b->images[k] > hi ? b->images[k] : hi;
    }
    assert_true(hi - lo > 1.0f);
    ch_loader_release(d->train_loader, b);
    ch_data_destroy(d);
    barrier();
}

/* ---- bad shards: one clear error at open, naming the shard */

static void write_tar(const char *path, const char *const *names, const char *const *datas, int n,
                      int end)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t h[512], zero[512] = {0};
    for (int k = 0; k < n; k++) {
        size_t len = strlen(datas[k]);
        assert_ch_ok(ch_tar_header(h, names[k], len, 0));
        assert_int_equal(fwrite(h, 1, 512, f), 512);
        assert_int_equal(fwrite(datas[k], 1, len, f), len);
        size_t pad = (512 - len % 512) % 512;
        if (pad) assert_int_equal(fwrite(zero, 1, pad, f), pad);
    }
    for (int k = 0; k < end; k++) assert_int_equal(fwrite(zero, 1, 512, f), 512);
    fclose(f);
}

static void flip_byte(const char *path, long off)
{
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, off, SEEK_SET), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, off, SEEK_SET), 0);
    fputc(c ^ 0x5a, f);
    fclose(f);
}

/* A shard's scan error is raised on the rank that scanned it (shard 0:
 * rank 0); the others get CH_ERR_REMOTE from the agreement. */
#define assert_open_error(expr, code, needle)                                      \
    do {                                                                           \
        if (ch_test_rank() == 0) {                                                 \
            assert_ch_error(expr, code, needle);                                   \
        } else {                                                                   \
            ch_status st_ = (expr);                                                \
            assert_true(st_ == CH_ERR_REMOTE || st_ == (code));                    \
        }                                                                          \
    } while (0)

static void test_bad_shards(void **state)
{
    (void)state;
    ch_dataset_t *ds;
    char d[1200]; /* tmp_path's buffers rotate */
    snprintf(d, sizeof d, "%s", tmp_path("bad"));
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", d, d);
    assert_int_equal(run0(cmd), 0);
    const char *good_n[] = {"a.png", "a.cls", "b.png", "b.cls"};
    const char *good_d[] = {"xx", "1", "yy", " 2\n"};
    const char *reord_n[] = {"a.png", "b.png", "a.cls", "b.cls"};
    const char *reord_d[] = {"xx", "yy", "1", "2"};
    const char *nocls_n[] = {"a.png", "a.cls", "b.png", "c.png", "c.cls"};
    const char *nocls_d[] = {"xx", "1", "yy", "zz", "3"};
    const char *badcls_d[] = {"xx", "on\xff" "e\n", "yy", "2"}; /* a non-UTF-8 byte, a newline */
    if (ch_test_rank() == 0) {
        write_tar(tmp_path("bad/good.tar"), good_n, good_d, 4, 2);
        write_tar(tmp_path("bad/reordered.tar"), reord_n, reord_d, 4, 2);
        write_tar(tmp_path("bad/nocls.tar"), nocls_n, nocls_d, 5, 2);
        write_tar(tmp_path("bad/badcls.tar"), good_n, badcls_d, 4, 2);
        write_tar(tmp_path("bad/noend.tar"), good_n, good_d, 4, 0);
        write_tar(tmp_path("bad/corrupt.tar"), good_n, good_d, 4, 2);
        flip_byte(tmp_path("bad/corrupt.tar"), 1024 + 3); /* a.cls's header name */
        write_tar(tmp_path("bad/trunc.tar"), good_n, good_d, 4, 2);
        assert_int_equal(truncate(tmp_path("bad/trunc.tar"), 2048 + 512 + 1), 0); /* inside b.png's header+ */
        write_tar(tmp_path("bad/trunc2.tar"), good_n, good_d, 4, 2);
        assert_int_equal(truncate(tmp_path("bad/trunc2.tar"), 512 + 1), 0); /* inside a.png's data */
        write_tar(tmp_path("bad/notar.tar"), good_n, good_d, 0, 0);
        FILE *f = fopen(tmp_path("bad/notar.tar"), "wb");
        for (int k = 0; k < 600; k++) fputc('A' + k % 26, f);
        fclose(f);
    }
    barrier();
    /* the good one reads, labels and all; no end blocks is accepted */
    assert_ch_ok(ch_dataset_shards_open(tmp_path("bad/good.tar"), 1, g_pg, &ds));
    assert_int_equal(ds->length, 2);
    assert_int_equal(ds->num_classes, 3);
    assert_int_equal(ch_dataset_shards_index(ds)->shards[0].samples[1].label, 2);
    /* an image that does not decode is an error at get naming shard and key */
    ch_image_t img;
    ch_image_init(&img);
    int64_t lab;
    assert_ch_error(ch_dataset_get(ds, 1, &img, &lab), CH_ERR_FORMAT, "good.tar:b.png");
    ch_image_free(&img);
    ch_dataset_destroy(ds);
    /* a shard that stops after a member (no end-of-archive blocks) is a cut-short
     * copy: refused, so the samples after the cut are not silently lost */
    assert_open_error(ch_dataset_shards_open(tmp_path("bad/noend.tar"), 1, g_pg, &ds),
                      CH_ERR_FORMAT, "without the two zero blocks that end a tar file");
    assert_open_error(ch_dataset_shards_open(tmp_path("bad/reordered.tar"), 1, g_pg, &ds),
                    CH_ERR_FORMAT, "'a' are not adjacent");
    assert_open_error(ch_dataset_shards_open(tmp_path("bad/nocls.tar"), 1, g_pg, &ds), CH_ERR_FORMAT,
                    "sample 'b' has no .cls member (its image data at byte 2560");
    assert_open_error(ch_dataset_shards_open(tmp_path("bad/badcls.tar"), 1, g_pg, &ds), CH_ERR_FORMAT,
                    "'on\\xffe\\x0a' is not a class index"); /* quoted: one readable line */
    assert_open_error(ch_dataset_shards_open(tmp_path("bad/corrupt.tar"), 1, g_pg, &ds), CH_ERR_FORMAT,
                    "corrupt: the tar header at byte 1024 has a bad checksum");
    assert_open_error(ch_dataset_shards_open(tmp_path("bad/trunc.tar"), 1, g_pg, &ds), CH_ERR_FORMAT,
                    "trunc.tar: truncated");
    assert_open_error(ch_dataset_shards_open(tmp_path("bad/trunc2.tar"), 1, g_pg, &ds), CH_ERR_FORMAT,
                    "truncated: member at byte 0 has 2 data bytes");
    assert_open_error(ch_dataset_shards_open(tmp_path("bad/notar.tar"), 1, g_pg, &ds), CH_ERR_FORMAT,
                    "bad checksum");
    assert_ch_error(ch_dataset_shards_open(tmp_path("bad/none.tar"), 1, g_pg, &ds), CH_ERR_IO,
                    "none.tar");
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/empty'", d);
    assert_int_equal(run0(cmd), 0);
    assert_ch_error(ch_dataset_shards_open(tmp_path("bad/empty"), 1, g_pg, &ds), CH_ERR_IO,
                    "holds no .tar file");
    /* nothing half-written: no index beside a failed build */
    assert_int_equal(access(tmp_path("bad/reordered.tar.index"), F_OK), -1);
    barrier();
}

/* A stale or damaged index: shards modified, removed, renamed or added. */
static void test_stale_index(void **state)
{
    (void)state;
    if (access(FMNIST_DIR, R_OK) != 0) ch_test_skip("no %s", FMNIST_DIR);
    char d[1200];
    snprintf(d, sizeof d, "%s", tmp_path("stale"));
    copy_dir(fm_shards(), d);
    ch_dataset_t *ds;
    assert_ch_ok(ch_dataset_shards_open(d, 1, g_pg, &ds));
    ch_dataset_destroy(ds);
    barrier();
    char cmd[16384];
    /* modified (same size, new mtime) */
    snprintf(cmd, sizeof cmd, "touch -d '2001-01-01' '%s/fm-000001.tar'", d);
    assert_int_equal(run0(cmd), 0);
    assert_open_error(ch_dataset_shards_open(d, 1, g_pg, &ds), CH_ERR_FORMAT,
                      "fm-000001.tar was modified (mtime) since it was built");
    /* removed: rebuild, then take one away */
    snprintf(cmd, sizeof cmd, "rm '%s/cohort-shards.index'", d);
    assert_int_equal(run0(cmd), 0);
    assert_ch_ok(ch_dataset_shards_open(d, 1, g_pg, &ds));
    ch_dataset_destroy(ds);
    barrier();
    snprintf(cmd, sizeof cmd, "mv '%s/fm-000003.tar' '%s/x.tmp'", d, d);
    assert_int_equal(run0(cmd), 0);
    assert_open_error(ch_dataset_shards_open(d, 1, g_pg, &ds), CH_ERR_FORMAT, "it lists 4 shards, 3");
    /* swapped names (reordered shards) */
    snprintf(cmd, sizeof cmd, "mv '%s/x.tmp' '%s/fm-000003.tar' && mv '%s/fm-000001.tar' '%s/x.tmp' && "
             "mv '%s/fm-000002.tar' '%s/fm-000001.tar' && mv '%s/x.tmp' '%s/fm-000002.tar'",
             d, d, d, d, d, d, d, d);
    assert_int_equal(run0(cmd), 0);
    assert_open_error(ch_dataset_shards_open(d, 1, g_pg, &ds), CH_ERR_FORMAT, "changed size");
    /* a damaged index */
    if (ch_test_rank() == 0) flip_byte(tmp_path("stale/cohort-shards.index"), 40);
    barrier();
    assert_ch_error(ch_dataset_shards_open(d, 1, g_pg, &ds), CH_ERR_FORMAT, "CRC-32 mismatch");
    barrier();
}

/* The index file round-trips and every truncation of it is an error. */
static void test_index_file_round_trip(void **state)
{
    (void)state;
    if (access(FMNIST_DIR, R_OK) != 0) ch_test_skip("no %s", FMNIST_DIR);
    ch_dataset_t *ds;
    assert_ch_ok(ch_dataset_shards_open(fm_shards(), 1, g_pg, &ds));
    uint8_t *buf;
    size_t len;
    assert_ch_ok(ch_shard_index_encode(ch_dataset_shards_index(ds), &buf, &len));
    uint8_t *file;
    size_t flen;
    assert_ch_ok(ch_dataset_read_file(tmp_path("fm/cohort-shards.index"), &file, &flen));
    assert_int_equal(flen, len);
    assert_memory_equal(file, buf, len);
    ch_shard_index_t ix;
    for (size_t cut = 0; cut < len; cut += 1 + cut / 3)
        assert_ch_error(ch_shard_index_parse(buf, cut, "x.index", &ix), CH_ERR_FORMAT, "x.index");
    assert_ch_ok(ch_shard_index_parse(buf, len, "x.index", &ix));
    assert_int_equal(ix.total, N_FM);
    ch_shard_index_free(&ix);
    free(buf);
    free(file);
    ch_dataset_destroy(ds);
    barrier();
}

static int64_t dir_bytes(const char *dir, const char *suffix)
{
    char **paths;
    int n;
    char *d;
    assert_ch_ok(ch_shards_list(dir, &paths, &n, &d));
    int64_t b = 0;
    struct stat sb;
    for (int k = 0; k < n; k++) {
        assert_int_equal(stat(paths[k], &sb), 0);
        b += sb.st_size;
    }
    char p[2048];
    snprintf(p, sizeof p, "%s/%s", dir, suffix);
    if (stat(p, &sb) == 0) b += sb.st_size;
    ch_shards_paths_free(paths, n);
    free(d);
    return b;
}

/* data.stage: the ranks of a node copy the shards and the index once
 * (together), the copies read the same; a later stage reuses them, and a
 * damaged copy is found by its CRC-32 and copied again. */
static void test_stage(void **state)
{
    (void)state;
    if (access(FMNIST_DIR, R_OK) != 0) ch_test_skip("no %s", FMNIST_DIR);
    const char *src = fm_shards();
    char sdir[1200];
    snprintf(sdir, sizeof sdir, "%s", tmp_path("stage"));
    ch_dataset_t *a, *b;
    assert_ch_ok(ch_dataset_shards_open(src, 1, g_pg, &a)); /* the index exists */
    const int64_t total = dir_bytes(src, "cohort-shards.index");
    char *staged;
    ch_stage_stats_t st;
    assert_ch_ok(ch_shards_stage(src, sdir, g_pg, &staged, &st));
    assert_int_equal(st.files, N_FM / PER_SHARD + 1);
    assert_int_equal(st.bytes_copied, total); /* once, whatever the ranks on the node */
    assert_int_equal(st.bytes_reused, 0);
    assert_true(strncmp(staged, sdir, strlen(sdir)) == 0);
    assert_int_equal(dir_bytes(staged, "cohort-shards.index"), total);
    assert_ch_ok(ch_dataset_shards_open(staged, 1, g_pg, &b)); /* the copied index is valid */
    assert_same_samples(a, b);
    ch_dataset_destroy(b);
    barrier();
    free(staged);
    /* a requeued job: everything reused */
    assert_ch_ok(ch_shards_stage(src, sdir, g_pg, &staged, &st));
    assert_int_equal(st.bytes_copied, 0);
    assert_int_equal(st.bytes_reused, total);
    /* a damaged copy (same size and mtime): copied again */
    char victim[2048];
    snprintf(victim, sizeof victim, "%s/fm-000002.tar", staged);
    struct stat vs;
    assert_int_equal(stat(victim, &vs), 0);
    barrier();
    if (ch_test_rank() == 0) {
        int fd = open(victim, O_WRONLY);
        assert_true(fd >= 0);
        assert_int_equal(pwrite(fd, "Z", 1, 1000), 1);
        close(fd);
        struct timespec ts[2] = {vs.st_atim, vs.st_mtim};
        assert_int_equal(utimensat(AT_FDCWD, victim, ts, 0), 0);
    }
    barrier();
    free(staged);
    assert_ch_ok(ch_shards_stage(src, sdir, g_pg, &staged, &st));
    assert_int_equal(st.bytes_copied, vs.st_size);
    assert_int_equal(st.files_copied, 1);
    assert_ch_ok(ch_dataset_shards_open(staged, 1, g_pg, &b));
    assert_same_samples(a, b);
    ch_dataset_destroy(b);
    ch_dataset_destroy(a);
    free(staged);
    /* a pattern is staged as the pattern inside the staging directory */
    char pat[1300];
    snprintf(pat, sizeof pat, "%s/fm-{000000..000001}.tar", src);
    assert_ch_ok(ch_shards_stage(pat, sdir, g_pg, &staged, &st));
    assert_true(strstr(staged, "/fm-{000000..000001}.tar") != NULL);
    assert_ch_ok(ch_dataset_shards_open(staged, 1, g_pg, &b));
    assert_int_equal(b->length, 2 * PER_SHARD);
    ch_dataset_destroy(b);
    free(staged);
    barrier();
}

static int shard_of(const int64_t *first, int ns, int64_t i)
{
    int k = 0;
    while (k + 1 < ns && first[k + 1] <= i) k++;
    return k;
}

/* data.order = shard_window: per epoch, each shard read by one rank only,
 * a rank's windows hold `window` of its shards each, every sample of the
 * rank's shards once (then cut / padded to num_samples), deterministic. */
static void test_shard_window_order(void **state)
{
    (void)state;
    const int64_t first[] = {0, 30, 70, 100, 125, 160, 200, 230, 260}; /* 8 unequal shards */
    const int ns = 8, W = 2, window = 2;
    const int64_t n = first[ns];
    for (int64_t epoch = 0; epoch < 3; epoch++) {
        int owner[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
        int64_t seen[260] = {0};
        for (int r = 0; r < W; r++) {
            ch_sampler_t *smp;
            assert_ch_ok(ch_sampler_create(n, W, r, 1, 7, 0, &smp));
            assert_ch_ok(ch_sampler_set_shard_window(smp, first, ns, window));
            assert_ch_ok(ch_sampler_set_epoch(smp, epoch));
            const int64_t *ind = ch_sampler_indices(smp);
            int64_t m = ch_sampler_num_samples(smp);
            assert_int_equal(m, n / W);
            int64_t own = 0;
            while (own < m && !ch_sampler_is_padding(smp, own)) own++;
            for (int64_t k = own; k < m; k++) assert_true(ch_sampler_is_padding(smp, k));
            int win_shards[8], nw = 0, in_win = 0;
            int64_t win_len = 0;
            for (int64_t k = 0; k < own; k++) {
                int sh = shard_of(first, ns, ind[k]);
                if (owner[sh] == -1) owner[sh] = r;
                assert_int_equal(owner[sh], r); /* one rank per shard */
                seen[ind[k]]++;
                /* windows: the samples of `window` shards, then the next window */
                int known = 0;
                for (int j = 0; j < nw; j++) known |= win_shards[j] == sh;
                if (!known) {
                    if (nw == window) { /* a new window starts only after the last one is done */
                        assert_int_equal(in_win, win_len);
                        nw = 0;
                        in_win = 0;
                        win_len = 0;
                    }
                    win_shards[nw++] = sh;
                    win_len += first[sh + 1] - first[sh];
                }
                in_win++;
            }
            /* the epoch's list is a function of (seed, epoch, rank) */
            ch_sampler_t *again;
            assert_ch_ok(ch_sampler_create(n, W, r, 1, 7, 0, &again));
            assert_ch_ok(ch_sampler_set_shard_window(again, first, ns, window));
            assert_ch_ok(ch_sampler_set_epoch(again, epoch));
            assert_memory_equal(ch_sampler_indices(again), ind, (size_t)m * sizeof *ind);
            ch_sampler_destroy(again);
            ch_sampler_destroy(smp);
        }
        /* a sample is seen at most once, and all are seen but those cut */
        int64_t total = 0;
        for (int64_t i = 0; i < n; i++) {
            assert_true(seen[i] <= 1);
            total += seen[i];
        }
        assert_true(total >= n - 60 && total <= n);
    }
    ch_sampler_t *smp;
    assert_ch_ok(ch_sampler_create(n, 16, 0, 1, 7, 0, &smp));
    assert_ch_error(ch_sampler_set_shard_window(smp, first, ns, 1), CH_ERR_INVALID, "8 shards for world size 16");
    ch_sampler_destroy(smp);
    assert_ch_ok(ch_sampler_create(n + 1, 2, 0, 1, 7, 0, &smp));
    assert_ch_error(ch_sampler_set_shard_window(smp, first, ns, 1), CH_ERR_INVALID, "hold 260 samples");
    ch_sampler_destroy(smp);
}

static int setup_all(void **state)
{
    (void)state;
    if (ch_test_world_size() > 1 && !g_pg) {
        if (ch_pg_create_mpi(MPI_COMM_WORLD, &g_pg) != CH_OK) return -1;
    }
    snprintf(tmp_root, sizeof tmp_root, "%s/tests/shards-tmp-np%d", ch_test_builddir(),
             ch_test_world_size());
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", tmp_root, tmp_root);
    return run0(cmd) == 0 ? 0 : -1;
}

/* After the last test: the scratch tree goes (the shards are a few MB). */
static int teardown_all(void **state)
{
    (void)state;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_root);
    barrier();
    return run0(cmd) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_fmnist_shards_equal_idx, setup_all),
        cmocka_unit_test(test_pattern_and_file),
        cmocka_unit_test(test_imagefolder_packed_equal),
        cmocka_unit_test(test_order_vs_torch_sampler),
        cmocka_unit_test(test_data_format_shards),
        cmocka_unit_test(test_bad_shards),
        cmocka_unit_test(test_stale_index),
        cmocka_unit_test(test_index_file_round_trip),
        cmocka_unit_test(test_stage),
        cmocka_unit_test_teardown(test_shard_window_order, teardown_all),
    };
    return ch_test_main_mpi(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
