/* cohort: per-sample image transforms (torchvision.transforms semantics).
 *
 * A pipeline is a list of ch_transform_t applied in order to a uint8 H,W,C
 * image (dataset.h), ending in float32 C,H,W written straight into a batch
 * slot. The ops, each as torchvision 0.14 defines it on PIL images:
 *   CH_TF_RANDOM_CROP        RandomCrop(size, padding, fill=0): pad every side
 *                            by `padding` with 0, then a uniformly placed
 *                            size[0] x size[1] window (error if the padded
 *                            image is smaller).
 *   CH_TF_RANDOM_HFLIP       RandomHorizontalFlip(p).
 *   CH_TF_RESIZE             Resize(size, BILINEAR): size[1] == 0 matches the
 *                            shorter side to size[0], the longer side
 *                            int(size[0] * long / short); else (h, w) =
 *                            size. PIL's bilinear filter (resample.h).
 *   CH_TF_CENTER_CROP        CenterCrop(size): pads with 0 when the image is
 *                            smaller, offsets int(round((H - h) / 2)) (round
 *                            half to even, as Python).
 *   CH_TF_RANDOM_RESIZED_CROP RandomResizedCrop(size, scale, ratio,
 *                            BILINEAR): up to 10 tries of area fraction
 *                            U(scale) and log-uniform aspect ratio, then the
 *                            central fallback, exactly as get_params; then
 *                            crop + resize.
 *   CH_TF_NORMALIZE          ToTensor + Normalize(mean, std): x = (v / 255 -
 *                            mean[c]) / std[c] in float32, same operation
 *                            order as torch (bit-identical). Must be last and
 *                            is required (use mean 0, std 1 for plain
 *                            ToTensor).
 * Randomness: every random draw of sample `index` in `epoch` comes from a
 * counter-based stream keyed by (seed, epoch, index) (SplitMix64 over a
 * hash of the three), so an epoch's result does not depend on the number of
 * worker threads, their timing, the world size, or the order of calls. The
 * draws are not torch's (torch's per-worker generator state cannot be
 * reproduced across worker counts); their distributions are the same.
 */
#ifndef COHORT_TRANSFORMS_H
#define COHORT_TRANSFORMS_H

#include <stdint.h>

#include "framework/core/status.h"
#include "io/data/image.h"
#include "io/data/resample.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CH_TF_RANDOM_CROP = 1,
    CH_TF_RANDOM_HFLIP,
    CH_TF_RESIZE,
    CH_TF_CENTER_CROP,
    CH_TF_RANDOM_RESIZED_CROP,
    CH_TF_NORMALIZE,
} ch_transform_kind;

#define CH_TRANSFORMS_MAX 16

typedef struct ch_transform {
    ch_transform_kind kind;
    int size[2];       /* (h, w) output of crops / resizes; see above for Resize */
    int padding;       /* RandomCrop: pixels of 0 added on every side */
    double p;          /* RandomHorizontalFlip: probability (torchvision 0.5) */
    double scale[2];   /* RandomResizedCrop: area range (0.08, 1.0) */
    double ratio[2];   /* RandomResizedCrop: aspect range (3/4, 4/3) */
    float mean[3], std[3]; /* Normalize, per channel */
} ch_transform_t;

/* Convenience constructors with torchvision's defaults. */
ch_transform_t ch_tf_random_crop(int size, int padding);
ch_transform_t ch_tf_random_hflip(double p);
ch_transform_t ch_tf_resize(int shorter_side);
ch_transform_t ch_tf_resize_hw(int h, int w);
ch_transform_t ch_tf_center_crop(int size);
ch_transform_t ch_tf_random_resized_crop(int size);
ch_transform_t ch_tf_normalize(int channels, const float *mean, const float *std);

/* Parse a transform list written torchvision-style, for config files:
 *   "random_crop(28, padding=4); random_horizontal_flip(0.5); to_tensor();
 *    normalize(mean=[0.2860], std=[0.3530])"
 * Ops (separated by ';', arguments positional or key=value, a size is N or
 * [H, W], lists in [] or ()):
 *   random_crop(size, padding=0)          random_horizontal_flip(p=0.5) (alias hflip)
 *   resize(size)                          center_crop(size)
 *   random_resized_crop(size, scale=[0.08, 1.0], ratio=[0.75, 1.3333333])
 *   to_tensor()                           normalize(mean=[...], std=[...])
 * to_tensor() must be followed by nothing or by normalize (to_tensor alone
 * is Normalize(mean 0, std 1)); mean/std take 1 value (used for every
 * channel) or `channels` values. Writes at most max_ops ops to ops and
 * their number to *n. Errors: CH_ERR_CONFIG naming the op / argument and
 * the character position in spec. */
ch_status ch_transforms_parse(const char *spec, int channels, ch_transform_t *ops, int max_ops,
                              int *n);

typedef struct ch_transforms ch_transforms_t;

/* Build a pipeline of n ops (1 <= n <= CH_TRANSFORMS_MAX) for images of
 * `channels` channels, drawing randomness from `seed`.
 * Errors: CH_ERR_INVALID (no final Normalize, Normalize not last, sizes <=
 * 0, p outside [0,1], std == 0, bad scale/ratio ranges), CH_ERR_NOMEM. */
ch_status ch_transforms_create(const ch_transform_t *ops, int n,
                               int channels, uint64_t seed, ch_transforms_t **out);
void ch_transforms_destroy(ch_transforms_t *tf);

/* Output (H, W) for inputs of in_h x in_w; 0 for a dimension that depends on
 * the input when in_h/in_w are 0 (varying sizes). */
void ch_transforms_output_size(const ch_transforms_t *tf, int in_h, int in_w, int *out_h,
                               int *out_w);

/* Per-thread working memory for ch_transforms_apply; zero-init (or
 * ch_transforms_scratch_init), free with ch_transforms_scratch_free. */
typedef struct ch_transforms_scratch {
    ch_image_t a, b;
    ch_resample_scratch_t rs;
    /* what the last ch_transforms_apply drew (for tests and debugging):
     * the last RandomResizedCrop box (top, left, height, width) in pixels of
     * its input, -1s when there was none; the number of horizontal flips;
     * the DCT scale n of a fast-decoded image (n / 8; 8: full size) */
    struct {
        int crop[4];
        int flip;
        int scale_num;
    } rec;
} ch_transforms_scratch_t;
void ch_transforms_scratch_init(ch_transforms_scratch_t *s);
void ch_transforms_scratch_free(ch_transforms_scratch_t *s);

/* Transform `in` (sample `index` of `epoch`) into out: float32 [C, out_h,
 * out_w] contiguous (C = the pipeline's channels). Thread-safe for distinct
 * scratches. `in` may be a partial decode made with ch_transforms_roi for
 * the same (epoch, index) (fast decode, below). Errors: CH_ERR_INVALID
 * (in's channels differ), CH_ERR_INTERNAL (a partial image that is not the
 * planned region), CH_ERR_RANGE
 * (crop larger than the image; the result's size is not out_h x out_w),
 * CH_ERR_NOMEM. Messages give the sizes; callers add the file / index. */
ch_status ch_transforms_apply(const ch_transforms_t *tf, const ch_image_t *in, int64_t epoch,
                              int64_t index, ch_transforms_scratch_t *scratch, float *out,
                              int out_h, int out_w);

/* ---- Opt-in fast JPEG decode (data.fast_decode)
 *
 * For a pipeline whose first op is RandomResizedCrop or Resize, the JPEG
 * decoder (image.h, ch_image_t.roi_fn) can decode only the part of the
 * image that op reads, and at a reduced size:
 *   1. ch_transforms_roi, called by the decoder with the file's size, draws
 *      the RandomResizedCrop box from the sample's stream exactly as
 *      ch_transforms_apply does (same draws: crop boxes, flips and every
 *      later draw are those of the default path);
 *   2. DCT scaling n/8 (libjpeg-turbo scale_num/scale_denom): the smallest
 *      n in 1..4 that keeps the scaled box at least the op's output size on
 *      both axes, used only when the op shrinks the box by 2x or more
 *      (otherwise n = 8: full resolution); the region of the scaled image
 *      that covers the box is decoded with jpeg_crop_scanline +
 *      jpeg_skip_scanlines;
 *   3. ch_transforms_apply, given the partial image, resizes the box, mapped
 *      into the scaled region (fractional at n < 8), to the op's output
 *      with the same PIL bilinear filter (ch_resample_bilinear_box), then
 *      runs the rest of the pipeline as usual.
 * At n = 8 the result is bit-identical to the default path (the region's
 * pixels are those of a full decode). At n < 8 it differs by the DCT
 * scaling's own low-pass: docs/perf-data.md gives the measured difference
 * vs the default path and vs torchvision. PNGs and other pipelines are
 * decoded in full. */

/* Whether tf can use fast decode (first op RandomResizedCrop or Resize). */
int ch_transforms_fast_decode_ok(const ch_transforms_t *tf);

/* ctx of ch_transforms_roi: the pipeline and the sample about to be decoded
 * (the same epoch and index must then be passed to ch_transforms_apply). */
typedef struct ch_transforms_roi_ctx {
    const ch_transforms_t *tf;
    int64_t epoch, index;
} ch_transforms_roi_ctx_t;

/* A ch_image_roi_fn (image.h): ctx is a ch_transforms_roi_ctx_t. Returns 0
 * (decode all) when the pipeline cannot use it or the region is the whole
 * image at full size. */
int ch_transforms_roi(void *ctx, int h, int w, ch_image_roi_t *roi);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_TRANSFORMS_H */
