/* cohort: pixel differences of the opt-in fast JPEG decode (data.fast_decode).
 *
 *   tests/fast_decode_diff OUT.bin FILE.jpg... [--size S] [--seed N] [--time R]
 *
 * For each JPEG file (sample k of epoch 0): RandomResizedCrop(S) (default
 * 224) + Normalize(0, 1/255) through the default path (full decode) and
 * the fast path (crop decode + DCT scaling), both on the same crop box.
 * Prints per file the box, the DCT scale and the mean / max |difference|
 * in 0-255 units, then the totals; writes OUT.bin (per file: int32 top,
 * left, height, width, scale_num, then S*S*3 uint8 of the default and of
 * the fast output, H,W,C) for tests/fast_decode_torch.py, which compares
 * both with torchvision's resized_crop on the same boxes.
 *
 * --time R: then, one thread, files in memory, R rounds of four timed
 * passes over all files (CPU time of the thread; the best round of each):
 * full decode, fast decode, full decode + RandomResizedCrop(S) +
 * RandomHorizontalFlip + Normalize (the default path), fast decode + the
 * same; printed as images per CPU second.
 */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "framework/core/log.h"
#include "io/data/image.h"
#include "io/data/transforms.h"

static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The --time passes (see the top). */
static void time_passes(char **files, int nf, int size, uint64_t seed, int rounds)
{
    ch_image_t *raw = calloc((size_t)nf, sizeof *raw);
    for (int k = 0; k < nf; k++) {
        ch_image_init(&raw[k]);
        ch_check_fatal(ch_image_read_file(&raw[k], files[k]), "read");
    }
    static const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
    ch_transform_t ops[3] = {ch_tf_random_resized_crop(size), ch_tf_random_hflip(0.5),
                             ch_tf_normalize(3, mean, std)};
    ch_transforms_t *tf;
    ch_check_fatal(ch_transforms_create(ops, 3, 3, seed, &tf), "transforms");
    ch_transforms_scratch_t s;
    ch_transforms_scratch_init(&s);
    ch_image_t img;
    ch_image_init(&img);
    float *out = malloc((size_t)3 * (size_t)size * (size_t)size * sizeof *out);
    ch_transforms_roi_ctx_t ctx = {tf, 0, 0};
    img.roi_ctx = &ctx;
    static const char *const names[4] = {"full decode", "fast decode", "full decode + pipeline",
                                          "fast decode + pipeline"};
    double best[4] = {1e30, 1e30, 1e30, 1e30};
    for (int r = 0; r < rounds; r++)
        for (int v = 0; v < 4; v++) {
            img.roi_fn = (v & 1) ? ch_transforms_roi : NULL;
            double t0 = thread_cpu_s();
            for (int k = 0; k < nf; k++) {
                ctx.index = k;
                ch_check_fatal(ch_image_decode(raw[k].raw, raw[k].raw_size, 3, &img, files[k]),
                               "decode");
                if (v >= 2)
                    ch_check_fatal(ch_transforms_apply(tf, &img, 0, k, &s, out, size, size),
                                   "transforms");
            }
            double dt = thread_cpu_s() - t0;
            if (dt < best[v]) best[v] = dt;
        }
    for (int v = 0; v < 4; v++)
        printf("%-24s %6.0f images per CPU second (best of %d rounds of %d files)\n", names[v],
               nf / best[v], rounds, nf);
    img.roi_fn = NULL;
    ch_image_free(&img);
    for (int k = 0; k < nf; k++) ch_image_free(&raw[k]);
    free(raw);
    free(out);
    ch_transforms_scratch_free(&s);
    ch_transforms_destroy(tf);
}

static void to_u8(const float *chw, int s, uint8_t *hwc)
{
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < s * s; i++) hwc[(size_t)i * 3 + (size_t)c] = (uint8_t)lrintf(chw[(size_t)c * (size_t)(s * s) + (size_t)i]);
}

int main(int argc, char **argv)
{
    int size = 224, rounds = 0;
    unsigned long long seed = 0;
    const char *out_path = NULL;
    char **files = calloc((size_t)argc, sizeof *files);
    int nf = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--size") && i + 1 < argc) size = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--time") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!out_path) out_path = argv[i];
        else files[nf++] = argv[i];
    }
    if (!out_path || nf == 0 || size < 1) {
        fprintf(stderr, "usage: fast_decode_diff OUT.bin FILE.jpg... [--size S] [--seed N] "
                        "[--time R]\n");
        return 2;
    }
    static const float m0[3] = {0, 0, 0}, s255[3] = {1 / 255.f, 1 / 255.f, 1 / 255.f};
    ch_transform_t ops[2] = {ch_tf_random_resized_crop(size), ch_tf_normalize(3, m0, s255)};
    ch_transforms_t *tf;
    ch_check_fatal(ch_transforms_create(ops, 2, 3, seed, &tf), "transforms");
    size_t n = (size_t)3 * (size_t)size * (size_t)size;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    uint8_t *ua = malloc(n), *ub = malloc(n);
    ch_transforms_scratch_t sa, sb;
    ch_transforms_scratch_init(&sa);
    ch_transforms_scratch_init(&sb);
    ch_image_t full, part;
    ch_image_init(&full);
    ch_image_init(&part);
    ch_transforms_roi_ctx_t ctx = {tf, 0, 0};
    part.roi_fn = ch_transforms_roi;
    part.roi_ctx = &ctx;
    FILE *out = fopen(out_path, "wb");
    if (!out) {
        perror(out_path);
        return 1;
    }
    double tot = 0, tot_scaled = 0, mx_all = 0;
    int nscaled = 0;
    for (int k = 0; k < nf; k++) {
        ctx.index = k;
        ch_check_fatal(ch_image_read_file(&full, files[k]), "read");
        ch_check_fatal(ch_image_decode(full.raw, full.raw_size, 3, &full, files[k]), "decode");
        ch_check_fatal(ch_transforms_apply(tf, &full, 0, k, &sa, a, size, size), "default path");
        ch_check_fatal(ch_image_decode(full.raw, full.raw_size, 3, &part, files[k]), "fast decode");
        ch_check_fatal(ch_transforms_apply(tf, &part, 0, k, &sb, b, size, size), "fast path");
        double sum = 0, mx = 0;
        for (size_t i = 0; i < n; i++) {
            double d = fabs((double)a[i] - (double)b[i]);
            sum += d;
            mx = fmax(mx, d);
        }
        int32_t hdr[5] = {sa.rec.crop[0], sa.rec.crop[1], sa.rec.crop[2], sa.rec.crop[3],
                          sb.rec.scale_num};
        to_u8(a, size, ua);
        to_u8(b, size, ub);
        if (fwrite(hdr, sizeof hdr, 1, out) != 1 || fwrite(ua, 1, n, out) != n ||
            fwrite(ub, 1, n, out) != n) {
            perror(out_path);
            return 1;
        }
        printf("%s: box %dx%d at (%d, %d) of %dx%d, scale %d/8: mean |diff| %.3f, max %.0f\n",
               files[k], hdr[2], hdr[3], hdr[0], hdr[1], full.full_h, full.full_w, hdr[4],
               sum / (double)n, mx);
        tot += sum / (double)n;
        if (hdr[4] < 8) {
            tot_scaled += sum / (double)n;
            nscaled++;
        }
        mx_all = fmax(mx_all, mx);
    }
    printf("%d files, %d DCT-scaled: mean |diff| %.3f over all, %.3f over the scaled ones; max %.0f "
           "(0-255 units)\n",
           nf, nscaled, tot / nf, nscaled ? tot_scaled / nscaled : 0.0, mx_all);
    fclose(out);
    part.roi_fn = NULL;
    ch_image_free(&full);
    ch_image_free(&part);
    ch_transforms_scratch_free(&sa);
    ch_transforms_scratch_free(&sb);
    ch_transforms_destroy(tf);
    free(a);
    free(b);
    free(ua);
    free(ub);
    if (rounds > 0) time_passes(files, nf, size, seed, rounds);
    free(files);
    return 0;
}
