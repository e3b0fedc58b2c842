/* Tests for io/data/transforms and io/data/resample: deterministic pipelines against
 * torchvision on PIL images (tests/golden/transforms_golden.py), properties
 * of the random ones, determinism per (seed, epoch, index), bad input. */
#include "config.h"

#include "tests/harness.h"

#include "io/data/transforms.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_against_torchvision),
        cmocka_unit_test(test_random_crop_flip_properties),
        cmocka_unit_test(test_streams_are_per_epoch_and_index),
        cmocka_unit_test(test_bad_pipelines),
        cmocka_unit_test(test_parse),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
