/* Tests for io/data/transforms and io/data/resample: deterministic pipelines against
 * torchvision on PIL images (tests/golden/transforms_golden.py), properties
 * of the random ones, determinism per (seed, epoch, index), bad input, and
 * the opt-in fast JPEG decode (data.fast_decode) against the default path. */
#include "config.h"

#include "tests/harness.h"

#include "io/data/transforms.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

static const float MEAN1[1] = {0.2860f}, STD1[1] = {0.3530f};
static const float MEAN3[3] = {0.485f, 0.456f, 0.406f}, STD3[3] = {0.229f, 0.224f, 0.225f};

static int read_i32(FILE *f, int32_t *v) { return fread(v, 4, 1, f) == 1; }

static void test_golden_against_torchvision(void **state)
{
    const char *have = getenv("HAVE_TORCH");
    if (!have || strcmp(have, "yes") != 0) ch_test_skip("HAVE_TORCH != yes");
    const char *py = getenv("PYTHON3") ? getenv("PYTHON3") : "python3";
    char out[4096], cmd[8192];
    snprintf(out, sizeof out, "%.3000s/tests/transforms_golden.bin", ch_test_builddir());
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/golden/transforms_golden.py' '%s'", py,
             ch_test_srcdir(), out);
    assert_int_equal(system(cmd), 0);
    FILE *f = fopen(out, "rb");
    assert_non_null(f);
    ch_transforms_scratch_t s;
    ch_transforms_scratch_init(&s);
    ch_image_t img;
    ch_image_init(&img);
    int cases = 0, exact = 0;
    int32_t nops;
    while (read_i32(f, &nops)) {
        ch_transform_t ops[8];
        assert_true(nops >= 1 && nops <= 8);
        int32_t c = 0, h, w, oh, ow;
        for (int k = 0; k < nops; k++) {
            int32_t kind, a, b;
            assert_true(read_i32(f, &kind) && read_i32(f, &a) && read_i32(f, &b));
            memset(&ops[k], 0, sizeof ops[k]);
            ops[k].kind = (ch_transform_kind)kind;
            ops[k].size[0] = a;
            ops[k].size[1] = b;
            if (kind == CH_TF_RANDOM_RESIZED_CROP) {
                ops[k] = ch_tf_random_resized_crop(a);
                ops[k].scale[0] = ops[k].scale[1] = 1.0;
                ops[k].ratio[0] = ops[k].ratio[1] = 1.0;
            }
        }
        assert_true(read_i32(f, &h) && read_i32(f, &w) && read_i32(f, &c) && read_i32(f, &oh) &&
                    read_i32(f, &ow));
        ops[nops - 1] = ch_tf_normalize(c, c == 1 ? MEAN1 : MEAN3, c == 1 ? STD1 : STD3);
        assert_ch_ok(ch_image_reshape(&img, h, w, c));
        assert_int_equal(fread(img.data, 1, (size_t)(h * w * c), f), (size_t)(h * w * c));
        size_t n = (size_t)c * (size_t)oh * (size_t)ow;
        float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
        assert_int_equal(fread(want, sizeof *want, n, f), n);
        ch_transforms_t *tf;
        assert_ch_ok(ch_transforms_create(ops, nops, c, 0, &tf));
        int eh, ew;
        ch_transforms_output_size(tf, h, w, &eh, &ew);
        assert_int_equal(eh, oh);
        assert_int_equal(ew, ow);
        assert_ch_ok(ch_transforms_apply(tf, &img, 0, 0, &s, got, oh, ow));
        double maxd = 0;
        for (size_t i = 0; i < n; i++) maxd = fmax(maxd, fabs((double)got[i] - (double)want[i]));
        if (maxd != 0)
            fail_msg("case %d (%dx%dx%d, %d ops, first op %d %d,%d): max |diff| %g", cases, h, w, c,
                     nops, ops[0].kind, ops[0].size[0], ops[0].size[1], maxd);
        exact++;
        ch_transforms_destroy(tf);
        free(want);
        free(got);
        cases++;
    }
    fclose(f);
    assert_int_equal(cases, 2 * 4 * 13);
    assert_int_equal(exact, cases);
    ch_image_free(&img);
    ch_transforms_scratch_free(&s);
}

/* RandomCrop(28, padding=4) + flip(0.5) on 28x28: every output is a crop of
 * the zero-padded (and maybe flipped) image; all offsets and both flips
 * occur with about the right frequency. */
static void test_random_crop_flip_properties(void **state)
{
    ch_image_t img;
    ch_image_init(&img);
    assert_ch_ok(ch_image_reshape(&img, 28, 28, 1));
    for (int i = 0; i < 784; i++) img.data[i] = (uint8_t)(1 + (i * 7919) % 251);
    ch_transform_t ops[3] = {ch_tf_random_crop(28, 4), ch_tf_random_hflip(0.5),
                             ch_tf_normalize(1, NULL, NULL)};
    ch_transforms_t *tf;
    assert_ch_ok(ch_transforms_create(ops, 3, 1, 99, &tf));
    ch_transforms_scratch_t s;
    ch_transforms_scratch_init(&s);
    static int seen[9][9][2];
    float out[784];
    const int N = 4000;
    for (int idx = 0; idx < N; idx++) {
        assert_ch_ok(ch_transforms_apply(tf, &img, 3, idx, &s, out, 28, 28));
        int found = 0;
        for (int fl = 0; fl < 2 && !found; fl++)
            for (int i = 0; i < 9 && !found; i++)
                for (int j = 0; j < 9 && !found; j++) {
                    int ok = 1;
                    for (int y = 0; y < 28 && ok; y++)
                        for (int x = 0; x < 28 && ok; x++) {
                            int xx = fl ? 27 - x : x; /* flip after crop */
                            int sy = y + i - 4, sx = xx + j - 4;
                            uint8_t v = (sy >= 0 && sy < 28 && sx >= 0 && sx < 28) ? img.data[sy * 28 + sx] : 0;
                            ok = out[y * 28 + x] == (float)v / 255.0f;
                        }
                    if (ok) {
                        seen[i][j][fl]++;
                        found = 1;
                    }
                }
        if (!found) fail_msg("sample %d is not a flipped/unflipped crop of the padded image", idx);
    }
    int flips = 0;
    for (int i = 0; i < 9; i++)
        for (int j = 0; j < 9; j++) {
            assert_true(seen[i][j][0] + seen[i][j][1] > 0);
            flips += seen[i][j][1];
        }
    assert_true(flips > N * 0.45 && flips < N * 0.55);
    ch_transforms_destroy(tf);
    ch_transforms_scratch_free(&s);
    ch_image_free(&img);
}

static void test_streams_are_per_epoch_and_index(void **state)
{
    ch_image_t img;
    ch_image_init(&img);
    assert_ch_ok(ch_image_reshape(&img, 50, 70, 3));
    for (int i = 0; i < 50 * 70 * 3; i++) img.data[i] = (uint8_t)(i * 31 % 256);
    ch_transform_t ops[3] = {ch_tf_random_resized_crop(32), ch_tf_random_hflip(0.5),
                             ch_tf_normalize(3, MEAN3, STD3)};
    ch_transforms_t *tf;
    assert_ch_ok(ch_transforms_create(ops, 3, 3, 7, &tf));
    ch_transforms_scratch_t s;
    ch_transforms_scratch_init(&s);
    enum { N = 16, SZ = 3 * 32 * 32 };
    static float fwd[N][SZ], rev[N][SZ], other[SZ];
    for (int i = 0; i < N; i++) assert_ch_ok(ch_transforms_apply(tf, &img, 2, i, &s, fwd[i], 32, 32));
    for (int i = N - 1; i >= 0; i--) assert_ch_ok(ch_transforms_apply(tf, &img, 2, i, &s, rev[i], 32, 32));
    assert_memory_equal(fwd, rev, sizeof fwd);
    int differ = 0;
    for (int i = 0; i < N; i++) {
        assert_ch_ok(ch_transforms_apply(tf, &img, 3, i, &s, other, 32, 32));
        differ += memcmp(other, fwd[i], sizeof other) != 0;
        for (int k = 0; k < SZ; k++) assert_true(isfinite(fwd[i][k]));
    }
    assert_true(differ >= N - 1);
    differ = 0;
    for (int i = 1; i < N; i++) differ += memcmp(fwd[0], fwd[i], sizeof fwd[0]) != 0;
    assert_true(differ >= N - 2);
    ch_transforms_destroy(tf);
    ch_transforms_scratch_free(&s);
    ch_image_free(&img);
}

static void test_bad_pipelines(void **state)
{
    ch_transforms_t *tf = NULL;
    ch_transform_t ops[3] = {ch_tf_normalize(1, NULL, NULL), ch_tf_random_hflip(0.5),
                             ch_tf_normalize(1, NULL, NULL)};
    assert_ch_error(ch_transforms_create(ops, 3, 1, 0, &tf), CH_ERR_INVALID, "must be the last op");
    assert_ch_error(ch_transforms_create(ops + 1, 1, 1, 0, &tf), CH_ERR_INVALID, "must end with Normalize");
    ops[1].p = 1.5;
    assert_ch_error(ch_transforms_create(ops + 1, 2, 1, 0, &tf), CH_ERR_INVALID, "p=1.5");
    float zero = 0.0f;
    ops[0] = ch_tf_normalize(1, NULL, &zero);
    assert_ch_error(ch_transforms_create(ops, 1, 1, 0, &tf), CH_ERR_INVALID, "std[0] is 0");
    assert_null(tf);
    /* crop larger than the padded image; result of the wrong size */
    ops[0] = ch_tf_random_crop(40, 4);
    ops[1] = ch_tf_normalize(1, NULL, NULL);
    assert_ch_ok(ch_transforms_create(ops, 2, 1, 0, &tf));
    ch_image_t img;
    ch_image_init(&img);
    assert_ch_ok(ch_image_reshape(&img, 28, 28, 1));
    memset(img.data, 5, 784);
    ch_transforms_scratch_t s;
    ch_transforms_scratch_init(&s);
    static float out[40 * 40 * 3];
    assert_ch_error(ch_transforms_apply(tf, &img, 0, 0, &s, out, 40, 40), CH_ERR_RANGE,
                    "required crop size (40, 40) is larger than the padded image size (36, 36)");
    ch_transforms_destroy(tf);
    ops[0] = ch_tf_resize(30);
    assert_ch_ok(ch_transforms_create(ops, 2, 1, 0, &tf));
    assert_ch_error(ch_transforms_apply(tf, &img, 0, 0, &s, out, 28, 28), CH_ERR_RANGE,
                    "result is 30x30, the batch expects 28x28");
    int oh, ow;
    ch_transforms_output_size(tf, 0, 0, &oh, &ow);
    assert_int_equal(oh, 0); /* depends on the input */
    ch_transforms_output_size(tf, 20, 40, &oh, &ow);
    assert_int_equal(oh, 30);
    assert_int_equal(ow, 60);
    /* 3-channel image through a 1-channel pipeline */
    ch_image_t rgb;
    ch_image_init(&rgb);
    assert_ch_ok(ch_image_reshape(&rgb, 30, 30, 3));
    assert_ch_error(ch_transforms_apply(tf, &rgb, 0, 0, &s, out, 30, 30), CH_ERR_INVALID, "3 channels");
    ch_transforms_destroy(tf);
    ch_transforms_scratch_free(&s);
    ch_image_free(&img);
    ch_image_free(&rgb);
}

static void test_parse(void **state)
{
    ch_transform_t ops[CH_TRANSFORMS_MAX];
    int n = 0;
    assert_ch_ok(ch_transforms_parse("random_crop(28, padding=4); random_horizontal_flip(); "
                                     "to_tensor(); normalize(mean=[0.2860], std=(0.3530))",
                                     1, ops, CH_TRANSFORMS_MAX, &n));
    assert_int_equal(n, 3);
    assert_int_equal(ops[0].kind, CH_TF_RANDOM_CROP);
    assert_int_equal(ops[0].size[0], 28);
    assert_int_equal(ops[0].size[1], 28);
    assert_int_equal(ops[0].padding, 4);
    assert_int_equal(ops[1].kind, CH_TF_RANDOM_HFLIP);
    assert_true(ops[1].p == 0.5);
    assert_int_equal(ops[2].kind, CH_TF_NORMALIZE);
    assert_true(ops[2].mean[0] == 0.2860f && ops[2].std[0] == 0.3530f);
    ch_transforms_t *tf;
    assert_ch_ok(ch_transforms_create(ops, n, 1, 0, &tf));
    ch_transforms_destroy(tf);

    assert_ch_ok(ch_transforms_parse("Resize(256);center_crop([224,200]);to_tensor()", 3, ops,
                                     CH_TRANSFORMS_MAX, &n));
    assert_int_equal(n, 3);
    assert_int_equal(ops[0].kind, CH_TF_RESIZE);
    assert_int_equal(ops[0].size[0], 256);
    assert_int_equal(ops[0].size[1], 0); /* shorter side */
    assert_int_equal(ops[1].size[0], 224);
    assert_int_equal(ops[1].size[1], 200);
    assert_true(ops[2].mean[2] == 0.0f && ops[2].std[2] == 1.0f);
    assert_ch_ok(ch_transforms_parse("random_resized_crop(224, scale=[0.5, 1]); hflip(p=0.25); "
                                     "normalize(mean=[0.485, 0.456, 0.406], std=[0.229,0.224,0.225])",
                                     3, ops, CH_TRANSFORMS_MAX, &n));
    assert_int_equal(n, 3);
    assert_true(ops[0].scale[0] == 0.5 && ops[0].ratio[0] == 0.75);
    assert_true(ops[1].p == 0.25);
    assert_true(ops[2].std[1] == 0.224f);

    assert_ch_error(ch_transforms_parse("random_crop(28); blur(3); to_tensor()", 1, ops, 8, &n),
                    CH_ERR_CONFIG, "unknown transform 'blur'");
    assert_ch_error(ch_transforms_parse("random_crop(padding=4); to_tensor()", 1, ops, 8, &n),
                    CH_ERR_CONFIG, "random_crop: size is required");
    assert_ch_error(ch_transforms_parse("random_crop(28, pad=4); to_tensor()", 1, ops, 8, &n),
                    CH_ERR_CONFIG, "unknown argument 'pad'");
    assert_ch_error(ch_transforms_parse("random_crop(28)", 1, ops, 8, &n), CH_ERR_CONFIG,
                    "must end with to_tensor() or normalize");
    assert_ch_error(ch_transforms_parse("to_tensor(); hflip()", 1, ops, 8, &n), CH_ERR_CONFIG,
                    "hflip after to_tensor()");
    assert_ch_error(ch_transforms_parse("normalize(mean=[1,2], std=[1])", 3, ops, 8, &n),
                    CH_ERR_CONFIG, "mean takes 1 or 3 values, got 2");
    assert_ch_error(ch_transforms_parse("resize(28 to_tensor()", 1, ops, 8, &n), CH_ERR_CONFIG,
                    "at character");
}

/* ------------------------------------------------ fast decode (data.fast_decode) */

/* A photo-like h x w x c image (smooth shapes + noise) as a JPEG in memory
 * (libjpeg quality 90: 4:2:0 for colour; progressive when asked). */
static uint8_t *make_jpeg(int h, int w, int c, int progressive, unsigned seed, size_t *len)
{
    uint8_t *px = malloc((size_t)h * (size_t)w * (size_t)c);
    assert_non_null(px);
    unsigned r = seed * 2654435761u + 1;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int k = 0; k < c; k++) {
                r = r * 1103515245u + 12345u;
                double v = 128 + 60 * sin(x * (0.02 + 0.01 * k) + seed) * cos(y * 0.031 - k) +
                           40 * ((x / 37 + y / 23 + k) % 3 - 1) + (double)((r >> 16) % 41) - 20;
                px[((size_t)y * (size_t)w + (size_t)x) * (size_t)c + (size_t)k] =
                    (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
    struct jpeg_compress_struct ci;
    struct jpeg_error_mgr jerr;
    ci.err = jpeg_std_error(&jerr);
    jpeg_create_compress(&ci);
    unsigned char *out = NULL;
    unsigned long olen = 0;
    jpeg_mem_dest(&ci, &out, &olen);
    ci.image_width = (JDIMENSION)w;
    ci.image_height = (JDIMENSION)h;
    ci.input_components = c;
    ci.in_color_space = c == 3 ? JCS_RGB : JCS_GRAYSCALE;
    jpeg_set_defaults(&ci);
    jpeg_set_quality(&ci, 90, TRUE);
    if (progressive) jpeg_simple_progression(&ci);
    jpeg_start_compress(&ci, TRUE);
    for (int y = 0; y < h; y++) {
        JSAMPROW row = px + (size_t)y * (size_t)w * (size_t)c;
        jpeg_write_scanlines(&ci, &row, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    free(px);
    *len = olen;
    return out;
}

/* Bound on the fast path's difference from the default path where DCT
 * scaling is used, in 0-255 units of the (un-normalized) output pixels:
 * the mean over a sample's pixels and the largest single pixel. Measured
 * over the cases below: mean <= 2.61, max <= 29 (docs/perf-data.md gives
 * the figures on photo-like 500x375 JPEGs). */
#define FAST_MEAN_BOUND 3.0
#define FAST_MAX_BOUND 48.0

/* Fast decode vs default: same crop boxes and flips for every sample; the
 * output bit-identical where no DCT scaling is used, within the bounds
 * above where it is; a full decode whatever roi_fn says for a pipeline
 * that does not start with RandomResizedCrop / Resize. */
static void test_fast_decode_matches_default(void **state)
{
    struct {
        int h, w, c, prog, out;
    } cases[] = {{375, 500, 3, 0, 224}, {500, 375, 3, 0, 64}, {251, 333, 3, 1, 96},
                 {375, 500, 1, 0, 112}, {375, 500, 3, 0, 32}, {97, 131, 3, 0, 32}};
    int scaled = 0, exact = 0;
    double worst_mean = 0, worst_max = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int c = cases[ci].c, out = cases[ci].out;
        size_t len;
        uint8_t *jpg = make_jpeg(cases[ci].h, cases[ci].w, c, cases[ci].prog, (unsigned)ci, &len);
        for (int variant = 0; variant < 2; variant++) {
            ch_transform_t ops[3];
            int nops = 0;
            if (variant == 0) {
                ops[nops++] = ch_tf_random_resized_crop(out);
                ops[nops++] = ch_tf_random_hflip(0.5);
            } else {
                ops[nops++] = ch_tf_resize(out);
                ops[nops++] = ch_tf_center_crop(out);
            }
            /* mean 0, std 1/255: the output is the uint8 pixel value */
            static const float m0[3] = {0, 0, 0}, s255[3] = {1 / 255.f, 1 / 255.f, 1 / 255.f};
            ops[nops++] = ch_tf_normalize(c, m0, s255);
            ch_transforms_t *tf;
            assert_ch_ok(ch_transforms_create(ops, nops, c, 7, &tf));
            assert_true(ch_transforms_fast_decode_ok(tf));
            size_t n = (size_t)c * (size_t)out * (size_t)out;
            float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
            ch_transforms_scratch_t sa, sb;
            ch_transforms_scratch_init(&sa);
            ch_transforms_scratch_init(&sb);
            ch_image_t full, part;
            ch_image_init(&full);
            ch_image_init(&part);
            ch_transforms_roi_ctx_t ctx = {tf, 3, 0};
            part.roi_fn = ch_transforms_roi;
            part.roi_ctx = &ctx;
            for (int64_t idx = 0; idx < (variant ? 1 : 60); idx++) {
                ctx.index = idx;
                assert_ch_ok(ch_image_decode(jpg, len, c, &full, "full"));
                assert_true(ch_image_is_full(&full));
                assert_ch_ok(ch_transforms_apply(tf, &full, 3, idx, &sa, a, out, out));
                assert_ch_ok(ch_image_decode(jpg, len, c, &part, "part"));
                assert_ch_ok(ch_transforms_apply(tf, &part, 3, idx, &sb, b, out, out));
                /* the augmentation parameters are those of the default path */
                assert_memory_equal(sa.rec.crop, sb.rec.crop, sizeof sa.rec.crop);
                assert_int_equal(sa.rec.flip, sb.rec.flip);
                assert_int_equal(sa.rec.scale_num, 8);
                if (sb.rec.scale_num == 8) {
                    if (memcmp(a, b, n * sizeof *a) != 0)
                        fail_msg("case %zu variant %d sample %lld: not bit-identical at scale 8/8",
                                 ci, variant, (long long)idx);
                    exact++;
                    continue;
                }
                double sum = 0, mx = 0;
                for (size_t i = 0; i < n; i++) {
                    double d = fabs((double)a[i] - (double)b[i]);
                    sum += d;
                    mx = fmax(mx, d);
                }
                worst_mean = fmax(worst_mean, sum / (double)n);
                worst_max = fmax(worst_max, mx);
                scaled++;
            }
            ch_image_free(&full);
            part.roi_fn = NULL;
            ch_image_free(&part);
            ch_transforms_scratch_free(&sa);
            ch_transforms_scratch_free(&sb);
            free(a);
            free(b);
            ch_transforms_destroy(tf);
        }
        free(jpg);
    }
    print_message("fast decode: %d samples bit-identical (scale 8/8), %d DCT-scaled: worst mean "
                  "|diff| %.3f, worst max %.0f (0-255 units)\n",
                  exact, scaled, worst_mean, worst_max);
    assert_true(exact > 50 && scaled > 50);
    assert_true(worst_mean <= FAST_MEAN_BOUND);
    assert_true(worst_max <= FAST_MAX_BOUND);

    /* a pipeline that cannot use it: roi_fn declines, full decode, same result */
    size_t len;
    uint8_t *jpg = make_jpeg(40, 50, 3, 0, 9, &len);
    ch_transform_t ops[3] = {ch_tf_random_crop(32, 2), ch_tf_random_hflip(0.5),
                             ch_tf_normalize(3, MEAN3, STD3)};
    ch_transforms_t *tf;
    assert_ch_ok(ch_transforms_create(ops, 3, 3, 1, &tf));
    assert_false(ch_transforms_fast_decode_ok(tf));
    ch_transforms_roi_ctx_t ctx = {tf, 0, 5};
    ch_image_t img;
    ch_image_init(&img);
    img.roi_fn = ch_transforms_roi;
    img.roi_ctx = &ctx;
    assert_ch_ok(ch_image_decode(jpg, len, 3, &img, "x"));
    assert_true(ch_image_is_full(&img));
    assert_int_equal(img.h, 40);
    ch_image_free(&img);
    ch_transforms_destroy(tf);
    free(jpg);
}

/* A truncated or corrupt JPEG gives the same error with and without fast
 * decode; a partial image handed to the wrong pipeline is refused. */
static void test_fast_decode_errors(void **state)
{
    size_t len;
    uint8_t *jpg = make_jpeg(375, 500, 3, 0, 3, &len);
    ch_transform_t ops[2] = {ch_tf_random_resized_crop(64), ch_tf_normalize(3, MEAN3, STD3)};
    ch_transforms_t *tf;
    assert_ch_ok(ch_transforms_create(ops, 2, 3, 11, &tf));
    ch_transforms_roi_ctx_t ctx = {tf, 0, 0};
    ch_image_t full, part;
    ch_image_init(&full);
    ch_image_init(&part);
    part.roi_fn = ch_transforms_roi;
    part.roi_ctx = &ctx;
    char want[1024];
    /* cut at several places (in the scan data: below, inside and above
     * the crop rows), and a file whose entropy data is overwritten */
    size_t cuts[] = {len - 2, len * 9 / 10, len / 2, len / 5, 400, 20};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++)
        for (int64_t idx = 0; idx < 8; idx++) {
            ctx.index = idx;
            ch_status a = ch_image_decode(jpg, cuts[k], 3, &full, "f.jpg");
            assert_int_not_equal(a, CH_OK);
            snprintf(want, sizeof want, "%s", ch_error_message());
            ch_status b = ch_image_decode(jpg, cuts[k], 3, &part, "f.jpg");
            assert_int_equal(a, b);
            assert_string_equal(want, ch_error_message());
            if (idx == 0 && k == 0) assert_non_null(strstr(want, "JPEG file is truncated"));
        }
    uint8_t *bad = malloc(len);
    memcpy(bad, jpg, len);
    size_t sof = 2;
    while (sof + 4 < len && !(bad[sof] == 0xff && bad[sof + 1] == 0xc0)) sof++;
    assert_true(sof + 4 < len);
    bad[sof + 4] = 7; /* SOF0's sample precision: corrupt header */
    ch_status a = ch_image_decode(bad, len, 3, &full, "g.jpg");
    snprintf(want, sizeof want, "%s", ch_error_message());
    assert_int_equal(a, CH_ERR_FORMAT);
    assert_int_equal(ch_image_decode(bad, len, 3, &part, "g.jpg"), CH_ERR_FORMAT);
    assert_string_equal(want, ch_error_message());
    free(bad);

    /* a region decoded for one sample, transformed as another: refused */
    ctx.index = 1;
    int64_t other = -1;
    assert_ch_ok(ch_image_decode(jpg, len, 3, &part, "f.jpg"));
    assert_false(ch_image_is_full(&part));
    ch_transforms_scratch_t s;
    ch_transforms_scratch_init(&s);
    float *out = malloc(3 * 64 * 64 * sizeof *out);
    for (int64_t idx = 2; idx < 50 && other < 0; idx++) { /* a sample with another box */
        ch_status st = ch_transforms_apply(tf, &part, 0, idx, &s, out, 64, 64);
        if (st != CH_OK) {
            assert_int_equal(st, CH_ERR_INTERNAL);
            assert_non_null(strstr(ch_error_message(), "not the one planned"));
            other = idx;
        }
    }
    assert_true(other >= 0);
    free(out);
    ch_transforms_scratch_free(&s);
    ch_image_free(&full);
    part.roi_fn = NULL;
    ch_image_free(&part);
    ch_transforms_destroy(tf);
    free(jpg);
}

/* ch_resample_bilinear_box over the whole image is ch_resample_bilinear;
 * a box outside the image is refused. */
static void test_resample_box(void **state)
{
    uint8_t src[17 * 23 * 3], a[9 * 11 * 3], b[9 * 11 * 3];
    for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)((i * 2654435761u) >> 24);
    ch_resample_scratch_t rs;
    memset(&rs, 0, sizeof rs);
    assert_ch_ok(ch_resample_bilinear(src, 17, 23, 3, 23 * 3, a, 9, 11, &rs));
    const double box[4] = {0, 0, 23, 17};
    assert_ch_ok(ch_resample_bilinear_box(src, 17, 23, 3, 23 * 3, box, b, 9, 11, &rs));
    assert_memory_equal(a, b, sizeof a);
    const double bad[4] = {0, 0, 24, 17};
    assert_ch_error(ch_resample_bilinear_box(src, 17, 23, 3, 23 * 3, bad, b, 9, 11, &rs),
                    CH_ERR_INVALID, "outside");
    ch_resample_scratch_free(&rs);
}

/* The horizontal pass for 3 and 4 channels (int32 x 4 vectors, one per
 * pixel) gives the bytes of the one-channel scalar pass on each channel
 * alone: random sizes (shrinks and enlargements), random boxes, strided
 * source rows, 200 cases. */
static void test_resample_channels_same_bytes(void **state)
{
    (void)state;
    ch_resample_scratch_t rs;
    memset(&rs, 0, sizeof rs);
    uint32_t r = 12345;
#define NEXT() (r = r * 1664525u + 1013904223u, r >> 8)
    for (int t = 0; t < 200; t++) {
        int c = 3 + (int)(NEXT() % 2);
        int sh = 1 + (int)(NEXT() % 90), sw = 1 + (int)(NEXT() % 90);
        int dh = 1 + (int)(NEXT() % 60), dw = 1 + (int)(NEXT() % 60);
        size_t stride = (size_t)sw * (size_t)c + NEXT() % 5;
        double x0 = (double)(NEXT() % (unsigned)sw) * 0.5, y0 = (double)(NEXT() % (unsigned)sh) * 0.5;
        double box[4] = {x0 < sw - 0.25 ? x0 : 0, y0 < sh - 0.25 ? y0 : 0, 0, 0};
        box[2] = box[0] + (sw - box[0]) * (0.25 + 0.75 * (double)(NEXT() % 1000) / 1000.0);
        box[3] = box[1] + (sh - box[1]) * (0.25 + 0.75 * (double)(NEXT() % 1000) / 1000.0);
        uint8_t *src = malloc(stride * (size_t)sh), *one = malloc((size_t)sh * (size_t)sw);
        uint8_t *out = malloc((size_t)dh * (size_t)dw * (size_t)c), *ref = malloc((size_t)dh * (size_t)dw);
        for (size_t i = 0; i < stride * (size_t)sh; i++) src[i] = (uint8_t)NEXT();
        assert_ch_ok(ch_resample_bilinear_box(src, sh, sw, c, stride, box, out, dh, dw, &rs));
        for (int ch = 0; ch < c; ch++) {
            for (int y = 0; y < sh; y++)
                for (int x = 0; x < sw; x++)
                    one[(size_t)y * (size_t)sw + (size_t)x] = src[(size_t)y * stride + (size_t)x * (size_t)c + (size_t)ch];
            assert_ch_ok(ch_resample_bilinear_box(one, sh, sw, 1, (size_t)sw, box, ref, dh, dw, &rs));
            for (size_t i = 0; i < (size_t)dh * (size_t)dw; i++)
                if (out[i * (size_t)c + (size_t)ch] != ref[i])
                    fail_msg("case %d: %dx%dx%d box (%g %g %g %g) -> %dx%d: channel %d pixel %zu: %d, "
                             "one channel alone gives %d", t, sh, sw, c, box[0], box[1], box[2], box[3],
                             dh, dw, ch, i, out[i * (size_t)c + (size_t)ch], ref[i]);
        }
        free(src);
        free(one);
        free(out);
        free(ref);
    }
#undef NEXT
    ch_resample_scratch_free(&rs);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_against_torchvision),
        cmocka_unit_test(test_random_crop_flip_properties),
        cmocka_unit_test(test_streams_are_per_epoch_and_index),
        cmocka_unit_test(test_bad_pipelines),
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_fast_decode_matches_default),
        cmocka_unit_test(test_fast_decode_errors),
        cmocka_unit_test(test_resample_box),
        cmocka_unit_test(test_resample_channels_same_bytes),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
