/* Tests for io/data/image, io/data/dataset (IDX, CIFAR-10, ImageFolder, Subset,
 * random_split): real Fashion-MNIST, torchvision's ImageFolder as golden
 * reference, and every kind of bad input. */
#include "config.h"

#include "tests/harness.h"

#include "io/data/cifar.h"
#include "io/data/dataset.h"
#include "io/data/idx.h"
#include "io/data/image.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jpeglib.h>
#include <png.h>
#include <zlib.h>

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"

static char tmp_root[1024];

static const char *tmp_path(const char *rel)
{
    static __thread char buf[8][4096];
    static __thread int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp_root, rel);
    return buf[k];
}

static void mkdirs(const char *path)
{
    char p[4096];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(p, 0755);
            *s = '/';
        }
    mkdir(p, 0755);
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void write_gz(const char *path, const void *data, size_t n)
{
    gzFile g = gzopen(path, "wb");
    assert_non_null(g);
    assert_int_equal(gzwrite(g, data, (unsigned)n), (int)n);
    gzclose(g);
}

/* IDX buffer: magic, dims, data filled with (i * 7 + 3) & 0xff (or labels i % 10) */
static size_t make_idx(uint8_t *buf, uint32_t magic, int nd, const uint32_t *dims, int labels)
{
    size_t p = 0, total = 1;
    for (int s = 24; s >= 0; s -= 8) buf[p++] = (uint8_t)(magic >> s);
    for (int d = 0; d < nd; d++) {
        for (int s = 24; s >= 0; s -= 8) buf[p++] = (uint8_t)(dims[d] >> s);
        total *= dims[d];
    }
    for (size_t i = 0; i < total; i++) buf[p++] = labels ? (uint8_t)(i % 10) : (uint8_t)(i * 7 + 3);
    return p;
}

static void write_jpeg(const char *path, int w, int h, int c, const uint8_t *px)
{
    struct jpeg_compress_struct ci;
    struct jpeg_error_mgr jerr;
    ci.err = jpeg_std_error(&jerr);
    jpeg_create_compress(&ci);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    jpeg_stdio_dest(&ci, f);
    ci.image_width = (JDIMENSION)w;
    ci.image_height = (JDIMENSION)h;
    ci.input_components = c;
    ci.in_color_space = c == 3 ? JCS_RGB : JCS_GRAYSCALE;
    jpeg_set_defaults(&ci);
    jpeg_set_quality(&ci, 90, TRUE);
    jpeg_start_compress(&ci, TRUE);
    while (ci.next_scanline < ci.image_height) {
        JSAMPROW row = (JSAMPROW)(px + (size_t)ci.next_scanline * (size_t)(w * c));
        jpeg_write_scanlines(&ci, &row, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    fclose(f);
}

/* color_type PNG_COLOR_TYPE_{GRAY,RGB,RGBA,PALETTE}; px holds w*h*channels bytes
 * (palette: indices into a 4-entry palette) */
static void write_png_il(const char *path, int w, int h, int color_type, const uint8_t *px,
                         int interlace)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8, color_type,
                 interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    int ch = color_type == PNG_COLOR_TYPE_RGB ? 3 : color_type == PNG_COLOR_TYPE_RGBA ? 4 : 1;
    if (color_type == PNG_COLOR_TYPE_PALETTE) {
        png_color pal[4] = {{10, 20, 30}, {200, 100, 50}, {0, 255, 0}, {255, 255, 255}};
        png_set_PLTE(png, info, pal, 4);
    }
    png_write_info(png, info);
    int passes = png_set_interlace_handling(png);
    for (int p = 0; p < passes; p++)
        for (int y = 0; y < h; y++)
            png_write_row(png, (png_const_bytep)(px + (size_t)y * (size_t)(w * ch)));
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    fclose(f);
}

static void write_png(const char *path, int w, int h, int color_type, const uint8_t *px)
{
    write_png_il(path, w, h, color_type, px, 0);
}

static void pattern(uint8_t *px, size_t n, int seed, int mod)
{
    for (size_t i = 0; i < n; i++) px[i] = (uint8_t)(((i * 37 + (size_t)seed * 101) ^ (i >> 3)) % (size_t)mod);
}

static int setup(void **state)
{
    snprintf(tmp_root, sizeof tmp_root, "%.900s/tests/tmp_dataset.%d", ch_test_builddir(), (int)getpid());
    mkdirs(tmp_root);
    return 0;
}

static int teardown(void **state)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_root);
    return system(cmd) == 0 ? 0 : -1;
}

/* ------------------------------------------------------------ IDX */

static void test_fashion_mnist_real(void **state)
{
    struct stat sb;
    if (stat(FMNIST_DIR, &sb) != 0) ch_test_skip("%s not installed (dataset-fashion-mnist)", FMNIST_DIR);
    ch_dataset_t *tr, *te;
    assert_ch_ok(ch_dataset_fashion_mnist_open(FMNIST_DIR, 1, &tr));
    assert_ch_ok(ch_dataset_fashion_mnist_open(FMNIST_DIR, 0, &te));
    assert_int_equal(tr->length, 60000);
    assert_int_equal(te->length, 10000);
    assert_int_equal(tr->num_classes, 10);
    assert_int_equal(tr->channels, 1);
    assert_int_equal(tr->height, 28);
    assert_int_equal(tr->width, 28);
    ch_image_t img;
    ch_image_init(&img);
    int64_t label;
    /* first training sample is an ankle boot (9), the second a T-shirt (0) */
    assert_ch_ok(ch_dataset_get(tr, 0, &img, &label));
    assert_int_equal(label, 9);
    assert_int_equal(img.h * img.w * img.c, 784);
    assert_ch_ok(ch_dataset_get(tr, 1, &img, &label));
    assert_int_equal(label, 0);
    assert_ch_ok(ch_dataset_get(te, 0, &img, &label));
    assert_int_equal(label, 9);
    int64_t counts[10] = {0};
    for (int64_t i = 0; i < tr->length; i++) {
        assert_ch_ok(ch_dataset_get(tr, i, &img, &label));
        counts[label]++;
    }
    for (int k = 0; k < 10; k++) assert_int_equal(counts[k], 6000);
    assert_ch_error(ch_dataset_get(tr, 60000, &img, &label), CH_ERR_RANGE, "60000");

    /* the same files uncompressed give the same dataset */
    uint8_t *gz, *raw;
    size_t gzl, rawl;
    char p[4096];
    snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte.gz", FMNIST_DIR);
    assert_ch_ok(ch_dataset_read_file(p, &gz, &gzl));
    assert_ch_ok(ch_idx_gunzip(gz, gzl, (size_t)1 << 30, p, &raw, &rawl));
    assert_int_equal(rawl, 16 + 10000 * 784);
    mkdirs(tmp_path("fm"));
    write_bytes(tmp_path("fm/t10k-images-idx3-ubyte"), raw, rawl);
    free(gz);
    free(raw);
    snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte.gz", FMNIST_DIR);
    assert_ch_ok(ch_dataset_read_file(p, &gz, &gzl));
    write_bytes(tmp_path("fm/t10k-labels-idx1-ubyte.gz"), gz, gzl);
    free(gz);
    ch_dataset_t *te2;
    assert_ch_ok(ch_dataset_fashion_mnist_open(tmp_path("fm"), 0, &te2));
    ch_image_t img2;
    ch_image_init(&img2);
    for (int64_t i = 0; i < te->length; i += 97) {
        int64_t l1, l2;
        assert_ch_ok(ch_dataset_get(te, i, &img, &l1));
        assert_ch_ok(ch_dataset_get(te2, i, &img2, &l2));
        assert_int_equal(l1, l2);
        assert_memory_equal(img.data, img2.data, 784);
    }
    ch_image_free(&img);
    ch_image_free(&img2);
    ch_dataset_destroy(tr);
    ch_dataset_destroy(te);
    ch_dataset_destroy(te2);
}

static void test_idx_bad_inputs(void **state)
{
    static uint8_t im[16 + 5 * 4 * 3], lb[8 + 5], tmp[200];
    uint32_t idims[3] = {5, 4, 3}, ldims[1] = {5};
    size_t iml = make_idx(im, CH_IDX_MAGIC_IMAGES, 3, idims, 0);
    size_t lbl = make_idx(lb, CH_IDX_MAGIC_LABELS, 1, ldims, 1);
    mkdirs(tmp_path("idx"));
    write_bytes(tmp_path("idx/im"), im, iml);
    write_gz(tmp_path("idx/lb.gz"), lb, lbl);
    ch_dataset_t *ds = NULL;
    assert_ch_ok(ch_dataset_idx_open(tmp_path("idx/im"), tmp_path("idx/lb.gz"), 10, &ds));
    assert_int_equal(ds->length, 5);
    assert_int_equal(ds->height, 4);
    assert_int_equal(ds->width, 3);
    ch_image_t img;
    ch_image_init(&img);
    int64_t label;
    assert_ch_ok(ch_dataset_get(ds, 2, &img, &label));
    assert_int_equal(label, 2);
    assert_int_equal(img.data[0], (uint8_t)(24 * 7 + 3));
    ch_image_free(&img);
    ch_dataset_destroy(ds);

    /* missing file / directory */
    assert_ch_error(ch_dataset_idx_open(tmp_path("idx/nope"), tmp_path("idx/lb.gz"), 10, &ds),
                    CH_ERR_IO, "idx/nope");
    assert_null(ds);
    assert_ch_error(ch_dataset_fashion_mnist_open(tmp_path("no-such-dir"), 1, &ds), CH_ERR_IO,
                    "no-such-dir");
    assert_ch_error(ch_dataset_fashion_mnist_open(tmp_path("idx"), 1, &ds), CH_ERR_IO,
                    "train-images-idx3-ubyte.gz");
    /* wrong magic: labels file given as images */
    assert_ch_error(ch_dataset_idx_open(tmp_path("idx/lb.gz"), tmp_path("idx/lb.gz"), 10, &ds),
                    CH_ERR_FORMAT, "wrong magic number 0x00000801 (expected 0x00000803");
    /* truncated raw and truncated gzip */
    write_bytes(tmp_path("idx/im_trunc"), im, iml - 5);
    assert_ch_error(ch_dataset_idx_open(tmp_path("idx/im_trunc"), tmp_path("idx/lb.gz"), 10, &ds),
                    CH_ERR_FORMAT, "im_trunc: truncated: 60 bytes of data expected");
    write_bytes(tmp_path("idx/im_hdr"), im, 10);
    assert_ch_error(ch_dataset_idx_open(tmp_path("idx/im_hdr"), tmp_path("idx/lb.gz"), 10, &ds),
                    CH_ERR_FORMAT, "truncated IDX header");
    write_gz(tmp_path("idx/im.gz"), im, iml);
    uint8_t *gz;
    size_t gzl;
    assert_ch_ok(ch_dataset_read_file(tmp_path("idx/im.gz"), &gz, &gzl));
    write_bytes(tmp_path("idx/im_gztrunc.gz"), gz, gzl / 2);
    assert_ch_error(ch_dataset_idx_open(tmp_path("idx/im_gztrunc.gz"), tmp_path("idx/lb.gz"), 10, &ds),
                    CH_ERR_FORMAT, "im_gztrunc.gz: gzip stream is truncated");
    gz[gzl / 2] ^= 0x55;
    gz[gzl / 2 + 1] ^= 0xff;
    write_bytes(tmp_path("idx/im_gzbad.gz"), gz, gzl);
    ch_error_clear();
    assert_int_equal(ch_dataset_idx_open(tmp_path("idx/im_gzbad.gz"), tmp_path("idx/lb.gz"), 10, &ds),
                     CH_ERR_FORMAT);
    assert_non_null(strstr(ch_error_message(), "im_gzbad.gz"));
    free(gz);
    /* count mismatch */
    ldims[0] = 4;
    lbl = make_idx(tmp, CH_IDX_MAGIC_LABELS, 1, ldims, 1);
    write_bytes(tmp_path("idx/lb4"), tmp, lbl);
    assert_ch_error(ch_dataset_idx_open(tmp_path("idx/im"), tmp_path("idx/lb4"), 10, &ds),
                    CH_ERR_FORMAT, "has 5 images but");
    /* label out of range */
    assert_ch_error(ch_dataset_idx_open(tmp_path("idx/im"), tmp_path("idx/lb.gz"), 4, &ds),
                    CH_ERR_FORMAT, "label 4 at index 4 is out of range for 4 classes");
    /* extra bytes */
    memcpy(tmp, im, iml);
    write_bytes(tmp_path("idx/im_long"), tmp, iml + 3);
    assert_ch_error(ch_dataset_idx_open(tmp_path("idx/im_long"), tmp_path("idx/lb.gz"), 10, &ds),
                    CH_ERR_FORMAT, "3 unexpected bytes");
    /* a directory where a file should be */
    assert_ch_error(ch_dataset_idx_open(tmp_path("idx"), tmp_path("idx/lb.gz"), 10, &ds), CH_ERR_IO,
                    "is a directory");
    /* empty file */
    write_bytes(tmp_path("idx/empty"), im, 0);
    assert_ch_error(ch_dataset_idx_open(tmp_path("idx/empty"), tmp_path("idx/lb.gz"), 10, &ds),
                    CH_ERR_FORMAT, "empty");
    assert_null(ds);
}

/* ------------------------------------------------------------ CIFAR */

static void test_cifar(void **state)
{
    enum { R = CH_CIFAR_RECORD };
    static uint8_t buf[3 * R];
    for (int r = 0; r < 3; r++) {
        buf[r * R] = (uint8_t)(r * 4);
        for (int p = 0; p < 3072; p++) buf[r * R + 1 + p] = (uint8_t)(p / 1024 * 100 + r);
    }
    mkdirs(tmp_path("cifar"));
    write_bytes(tmp_path("cifar/test_batch.bin"), buf, 3 * R);
    ch_dataset_t *ds;
    assert_ch_ok(ch_dataset_cifar10_open(tmp_path("cifar"), 0, &ds));
    assert_int_equal(ds->length, 3);
    assert_int_equal(ds->channels, 3);
    assert_int_equal(ds->num_classes, 10);
    ch_image_t img;
    ch_image_init(&img);
    int64_t label;
    assert_ch_ok(ch_dataset_get(ds, 2, &img, &label));
    assert_int_equal(label, 8);
    /* H,W,C: pixel (0,0) = (R,G,B) planes */
    assert_int_equal(img.data[0], 2);
    assert_int_equal(img.data[1], 102);
    assert_int_equal(img.data[2], 202);
    assert_int_equal(img.data[3 * 1023 + 2], 202);
    ch_image_free(&img);
    ch_dataset_destroy(ds);
    /* missing train files */
    assert_ch_error(ch_dataset_cifar10_open(tmp_path("cifar"), 1, &ds), CH_ERR_IO, "data_batch_1.bin");
    /* truncated */
    write_bytes(tmp_path("cifar/trunc.bin"), buf, 2 * R - 1);
    const char *p1[1] = {tmp_path("cifar/trunc.bin")};
    assert_ch_error(ch_dataset_cifar10_open_files(p1, 1, &ds), CH_ERR_FORMAT, "trunc.bin: size 6145");
    /* label out of range */
    buf[R] = 10;
    write_bytes(tmp_path("cifar/badlabel.bin"), buf, 3 * R);
    const char *p2[1] = {tmp_path("cifar/badlabel.bin")};
    assert_ch_error(ch_dataset_cifar10_open_files(p2, 1, &ds), CH_ERR_FORMAT,
                    "label 10 of record 1 is out of range");
}

/* ------------------------------------------------------------ ImageFolder */

/* A small tree with every decoder path: returns its root. */
static const char *make_folder(void)
{
    static uint8_t px[64 * 48 * 4];
    mkdirs(tmp_path("folder/cat/sub"));
    mkdirs(tmp_path("folder/dog"));
    mkdirs(tmp_path("folder/.hidden"));
    mkdirs(tmp_path("folder/Zebra"));
    pattern(px, sizeof px, 1, 256);
    write_jpeg(tmp_path("folder/cat/a.jpg"), 40, 30, 3, px);
    pattern(px, sizeof px, 2, 256);
    write_jpeg(tmp_path("folder/cat/B.JPEG"), 33, 17, 1, px);
    pattern(px, sizeof px, 3, 256);
    write_png(tmp_path("folder/cat/sub/c.png"), 20, 25, PNG_COLOR_TYPE_RGB, px);
    write_bytes(tmp_path("folder/cat/notes.txt"), "hello", 5);
    pattern(px, sizeof px, 4, 256);
    write_png(tmp_path("folder/dog/d.png"), 31, 9, PNG_COLOR_TYPE_GRAY, px);
    pattern(px, sizeof px, 5, 4);
    write_png(tmp_path("folder/dog/e.png"), 12, 10, PNG_COLOR_TYPE_PALETTE, px);
    pattern(px, sizeof px, 6, 256);
    write_png(tmp_path("folder/dog/f.png"), 16, 16, PNG_COLOR_TYPE_RGBA, px);
    pattern(px, sizeof px, 8, 256);
    write_png_il(tmp_path("folder/dog/h_interlaced.png"), 23, 19, PNG_COLOR_TYPE_RGB, px, 1);
    pattern(px, sizeof px, 7, 256);
    write_jpeg(tmp_path("folder/.hidden/g.jpg"), 64, 48, 3, px);
    write_png(tmp_path("folder/Zebra/.h.png"), 8, 8, PNG_COLOR_TYPE_GRAY, px);
    write_bytes(tmp_path("folder/readme.jpg"), "x", 1); /* a file in root: not a class */
    return tmp_path("folder");
}

static uint64_t fnv1a64(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static void test_imagefolder_layout(void **state)
{
    const char *root = make_folder();
    /* a symlink loop inside a class folder: its directories are listed once
     * (torchvision would list cat/sub/loop/sub/loop/... until ELOOP) */
    assert_int_equal(symlink("..", tmp_path("folder/cat/sub/loop")), 0);
    ch_dataset_t *ds;
    assert_ch_ok(ch_dataset_imagefolder_open(root, 3, &ds));
    assert_int_equal(ds->num_classes, 4);
    assert_string_equal(ds->class_names[0], ".hidden");
    assert_string_equal(ds->class_names[1], "Zebra");
    assert_string_equal(ds->class_names[2], "cat");
    assert_string_equal(ds->class_names[3], "dog");
    assert_int_equal(ds->length, 9);
    /* cat: B.JPEG < a.jpg (byte order), then sub/c.png; notes.txt ignored */
    assert_non_null(strstr(ch_dataset_sample_path(ds, 2), "cat/B.JPEG"));
    assert_non_null(strstr(ch_dataset_sample_path(ds, 3), "cat/a.jpg"));
    assert_non_null(strstr(ch_dataset_sample_path(ds, 4), "cat/sub/c.png"));
    ch_image_t img;
    ch_image_init(&img);
    int64_t label;
    assert_ch_ok(ch_dataset_get(ds, 2, &img, &label));
    assert_int_equal(label, 2);
    assert_int_equal(img.h, 17);
    assert_int_equal(img.w, 33);
    assert_int_equal(img.c, 3);
    assert_int_equal(img.data[0], img.data[1]); /* gray replicated */
    for (int64_t i = 0; i < ds->length; i++) assert_ch_ok(ch_dataset_get(ds, i, &img, &label));
    ch_image_free(&img);
    ch_dataset_destroy(ds);
}

static void check_golden_folder(const char *root, int channels)
{
    const char *py = getenv("PYTHON3") ? getenv("PYTHON3") : "python3";
    char out[4096], cmd[16384];
    snprintf(out, sizeof out, "%s/golden_%d.txt", tmp_root, channels);
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/golden/imagefolder_golden.py' '%s' %d '%s'", py,
             ch_test_srcdir(), root, channels, out);
    assert_int_equal(system(cmd), 0);
    FILE *f = fopen(out, "r");
    assert_non_null(f);
    ch_dataset_t *ds;
    assert_ch_ok(ch_dataset_imagefolder_open(root, channels, &ds));
    char line[8192];
    assert_non_null(fgets(line, sizeof line, f));
    int nc;
    assert_int_equal(sscanf(line, "classes %d", &nc), 1);
    assert_int_equal(nc, ds->num_classes);
    ch_image_t img;
    ch_image_init(&img);
    int64_t i = 0;
    while (fgets(line, sizeof line, f)) {
        long long lab;
        unsigned long long hash;
        int h, w;
        char path[4096];
        assert_int_equal(sscanf(line, "%lld %llu %d %d %4095s", &lab, &hash, &h, &w, path), 5);
        assert_true(i < ds->length);
        assert_string_equal(ch_dataset_sample_path(ds, i), path);
        int64_t label;
        assert_ch_ok(ch_dataset_get(ds, i, &img, &label));
        assert_int_equal(label, lab);
        assert_int_equal(img.h, h);
        assert_int_equal(img.w, w);
        assert_int_equal(img.c, channels);
        if (fnv1a64(img.data, (size_t)h * (size_t)w * (size_t)channels) != hash)
            fail_msg("%s: decoded pixels differ from PIL's (channels %d)", path, channels);
        i++;
    }
    assert_int_equal(i, ds->length);
    fclose(f);
    ch_image_free(&img);
    ch_dataset_destroy(ds);
}

static void test_imagefolder_golden_torchvision(void **state)
{
    const char *have = getenv("HAVE_TORCH");
    if (!have || strcmp(have, "yes") != 0) ch_test_skip("HAVE_TORCH != yes");
    const char *root = make_folder();
    check_golden_folder(root, 3);
    check_golden_folder(root, 1);
}

static void test_imagefolder_bad_inputs(void **state)
{
    const char *root = make_folder();
    ch_dataset_t *ds = NULL;
    /* missing directory, a file as root, no class folder */
    assert_ch_error(ch_dataset_imagefolder_open(tmp_path("nowhere"), 3, &ds), CH_ERR_IO, "nowhere");
    assert_ch_error(ch_dataset_imagefolder_open(tmp_path("folder/readme.jpg"), 3, &ds), CH_ERR_IO,
                    "is not a directory");
    assert_ch_error(ch_dataset_imagefolder_open(tmp_path("folder/cat/sub"), 3, &ds), CH_ERR_IO,
                    "Couldn't find any class folder in");
    /* a class folder with no images: torchvision raises for the whole dataset */
    mkdirs(tmp_path("folder/empty1"));
    mkdirs(tmp_path("folder/aempty"));
    write_bytes(tmp_path("folder/aempty/x.txt"), "x", 1);
    assert_ch_error(ch_dataset_imagefolder_open(root, 3, &ds), CH_ERR_FORMAT,
                    "Found no valid file for the classes aempty, empty1. Supported extensions are: "
                    ".jpg, .jpeg");
    assert_null(ds);
    rmdir(tmp_path("folder/empty1"));
    unlink(tmp_path("folder/aempty/x.txt"));
    rmdir(tmp_path("folder/aempty"));

    /* undecodable files: each error names the file and the index */
    mkdirs(tmp_path("bad/k"));
    static const uint8_t jpeg_garbage[] = {0xff, 0xd8, 0xff, 0xe0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    static const uint8_t png_garbage[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13,
                                          'I', 'H', 'D', 'R', 9, 9};
    write_bytes(tmp_path("bad/k/0_empty.png"), "", 0);
    write_bytes(tmp_path("bad/k/1_garbage.jpg"), jpeg_garbage, sizeof jpeg_garbage);
    write_bytes(tmp_path("bad/k/2_garbage.png"), png_garbage, sizeof png_garbage);
    write_bytes(tmp_path("bad/k/3_text.jpg"), "just text", 9);
    write_bytes(tmp_path("bad/k/4_bitmap.bmp"), "BM......", 8);
    uint8_t *jp;
    size_t jl;
    assert_ch_ok(ch_dataset_read_file(tmp_path("folder/cat/a.jpg"), &jp, &jl));
    write_bytes(tmp_path("bad/k/5_truncated.jpg"), jp, jl * 2 / 3);
    free(jp);
    assert_ch_ok(ch_dataset_read_file(tmp_path("folder/cat/sub/c.png"), &jp, &jl));
    write_bytes(tmp_path("bad/k/6_truncated.png"), jp, jl - 20);
    free(jp);
    assert_ch_ok(ch_dataset_imagefolder_open(tmp_path("bad"), 3, &ds));
    assert_int_equal(ds->length, 7);
    ch_image_t img;
    ch_image_init(&img);
    int64_t label;
    struct {
        ch_status code;
        const char *needle;
    } want[7] = {
        {CH_ERR_FORMAT, "sample 0: "},
        {CH_ERR_FORMAT, "1_garbage.jpg: cannot decode JPEG"},
        {CH_ERR_FORMAT, "2_garbage.png: cannot decode PNG"},
        {CH_ERR_FORMAT, "3_text.jpg: not a JPEG or PNG file"},
        {CH_ERR_UNSUPPORTED, "4_bitmap.bmp: image format not supported"},
        {CH_ERR_FORMAT, "5_truncated.jpg: JPEG file is truncated"},
        {CH_ERR_FORMAT, "6_truncated.png: cannot decode PNG"},
    };
    for (int i = 0; i < 7; i++) {
        char idx[64];
        snprintf(idx, sizeof idx, "sample %d", i);
        assert_ch_error(ch_dataset_get(ds, i, &img, &label), want[i].code, want[i].needle);
        assert_non_null(strstr(ch_error_message(), idx));
    }
    assert_ch_error(ch_dataset_get(ds, 0, &img, &label), CH_ERR_FORMAT, "0_empty.png: empty file");
    /* a file that disappeared after indexing */
    unlink(tmp_path("bad/k/3_text.jpg"));
    assert_ch_error(ch_dataset_get(ds, 3, &img, &label), CH_ERR_IO, "3_text.jpg");
    ch_image_free(&img);
    ch_dataset_destroy(ds);
}

/* ------------------------------------------------------------ subset / split */

static void test_subset_and_split(void **state)
{
    uint8_t *px;
    int64_t *lab;
    ch_dataset_t *base, *a, *b;
    assert_ch_ok(ch_dataset_memory_create("idx", "mem", 103, 2, 2, 1, 103, &px, &lab, &base));
    for (int i = 0; i < 103; i++) {
        lab[i] = i;
        memset(px + 4 * i, i, 4);
    }
    int64_t idx[3] = {5, 0, 102};
    assert_ch_ok(ch_dataset_subset_create(base, idx, 3, &a));
    ch_image_t img;
    ch_image_init(&img);
    int64_t label;
    assert_ch_ok(ch_dataset_get(a, 2, &img, &label));
    assert_int_equal(label, 102);
    assert_ch_error(ch_dataset_get(a, 3, &img, &label), CH_ERR_RANGE, "subset");
    ch_dataset_destroy(a);
    idx[1] = 103;
    assert_ch_error(ch_dataset_subset_create(base, idx, 3, &a), CH_ERR_RANGE, "index 103 at position 1");

    assert_ch_ok(ch_dataset_random_split(base, 0.2, 42, &a, &b));
    assert_int_equal(a->length + b->length, 103);
    const char *have = getenv("HAVE_TORCH");
    if (have && strcmp(have, "yes") == 0) {
        const char *py = getenv("PYTHON3") ? getenv("PYTHON3") : "python3";
        char out[4096], cmd[8192];
        snprintf(out, sizeof out, "%s/split.txt", tmp_root);
        snprintf(cmd, sizeof cmd, "'%s' '%s/tests/golden/imagefolder_golden.py' --split 103 0.2 42 '%s'",
                 py, ch_test_srcdir(), out);
        assert_int_equal(system(cmd), 0);
        FILE *f = fopen(out, "r");
        assert_non_null(f);
        ch_dataset_t *parts[2] = {a, b};
        for (int p = 0; p < 2; p++) {
            for (int64_t k = 0; k < parts[p]->length; k++) {
                long long v;
                assert_int_equal(fscanf(f, "%lld", &v), 1);
                assert_ch_ok(ch_dataset_get(parts[p], k, &img, &label));
                assert_int_equal(label, v);
            }
        }
        long long extra;
        assert_int_equal(fscanf(f, "%lld", &extra), EOF);
        fclose(f);
    }
    ch_image_free(&img);
    ch_dataset_destroy(a);
    ch_dataset_destroy(b);
    ch_dataset_destroy(base);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fashion_mnist_real, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idx_bad_inputs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cifar, setup, teardown),
        cmocka_unit_test_setup_teardown(test_imagefolder_layout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_imagefolder_golden_torchvision, setup, teardown),
        cmocka_unit_test_setup_teardown(test_imagefolder_bad_inputs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_subset_and_split, setup, teardown),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
