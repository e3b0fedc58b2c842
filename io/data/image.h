/* cohort: 8-bit images in host memory and the JPEG / PNG decoders.
 *
 * A ch_image_t holds one image as uint8 in H,W,C order (interleaved, the
 * layout decoders and PIL produce), c = 1 (grayscale "L") or 3 (RGB). It owns
 * a growable pixel buffer and a growable byte buffer for the encoded file, so
 * a loader worker that keeps one ch_image_t allocates only when an image
 * larger than any before arrives.
 *
 * Decoding follows what torchvision's ImageFolder gets from PIL 9 (pil_loader:
 * Image.open(f).convert("RGB")), so that pixels match PIL's bit for bit:
 *   - JPEG through libjpeg(-turbo) with its defaults (islow IDCT, fancy
 *     upsampling), as PIL's JpegDecoder; YCbCr/RGB/grayscale JPEGs; CMYK/YCCK
 *     are rejected (CH_ERR_UNSUPPORTED). A JPEG that ends early is an error
 *     (PIL: "image file is truncated").
 *   - PNG through libpng: palette expanded to RGB, 1/2/4-bit grayscale
 *     scaled to 8 bits, alpha (and tRNS) ignored as convert("RGB") does,
 *     16-bit samples reduced to their high byte (PIL keeps 16-bit grayscale
 *     as mode "I;16" and clips on convert: such files differ from PIL).
 *   - channels = 3: grayscale is replicated to R=G=B (PIL "L" -> "RGB").
 *     channels = 1: colour is converted with PIL's "L" rule
 *     L = (19595 R + 38470 G + 7471 B + 0x8000) >> 16 (ITU-R 601-2 luma,
 *     Pillow's Convert.c), grayscale files are kept as they are.
 */
#ifndef COHORT_IMAGE_H
#define COHORT_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "framework/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest image accepted from a file, in pixels (w * h), and per side.
 * Larger headers are rejected before anything is allocated. */
#define CH_IMAGE_MAX_PIXELS (1L << 26)
#define CH_IMAGE_MAX_SIDE 65535

/* Partial JPEG decoding (opt-in: data.fast_decode, transforms.h
 * ch_transforms_roi). A region of the image as decoded with libjpeg-turbo's
 * DCT scaling at scale_num / 8 (1..8; the scaled image is
 * ceil(W * scale_num / 8) x ceil(H * scale_num / 8) pixels): rows
 * [y, y + h) and columns [x, x + w) of it. */
typedef struct ch_image_roi {
    int x, y, w, h;
    int scale_num;
} ch_image_roi_t;

/* Asked by the JPEG decoder once the file's size (h, w) is known: fill
 * *roi (inside the scaled image) and return 1 to decode only that region,
 * or return 0 for the ordinary full decode. Must not fail. */
typedef int (*ch_image_roi_fn)(void *ctx, int h, int w, ch_image_roi_t *roi);

typedef struct ch_image {
    uint8_t *data;   /* h * w * c bytes, H,W,C order */
    int c, h, w;
    size_t capacity; /* bytes allocated at data */
    uint8_t *raw;    /* scratch for the encoded file (used by datasets) */
    size_t raw_capacity;
    size_t raw_size;
    /* Partial decoding: roi_fn (NULL: always decode all) is set by the
     * caller and left alone by the decoders. After any decode, full_h x
     * full_w is the file's size, scale_num (1..8) the DCT scale and
     * (off_y, off_x) where pixel (0, 0) of data lies in the image scaled by
     * scale_num / 8; a full decode gives h x w = full_h x full_w,
     * scale_num 8 and offset 0. */
    ch_image_roi_fn roi_fn;
    void *roi_ctx;
    int full_h, full_w;
    int scale_num;
    int off_y, off_x;
} ch_image_t;

/* 1 when img holds the whole image at full resolution: after a full
 * decode or ch_image_reshape, and for an image filled in by hand that left
 * full_h at 0; 0 after a partial decode. */
static inline int ch_image_is_full(const ch_image_t *img)
{
    return img->full_h == 0 ||
           (img->scale_num == 8 && img->h == img->full_h && img->w == img->full_w);
}

/* An empty image (no allocation). */
void ch_image_init(ch_image_t *img);
/* Free both buffers and reset to empty. */
void ch_image_free(ch_image_t *img);

/* Set dimensions to (h, w, c) and make data hold at least h*w*c bytes
 * (contents undefined). CH_ERR_INVALID for non-positive or oversized
 * dimensions, CH_ERR_NOMEM. */
ch_status ch_image_reshape(ch_image_t *img, int h, int w, int c);

/* Make raw hold at least `bytes` bytes. CH_ERR_NOMEM. */
ch_status ch_image_reserve_raw(ch_image_t *img, size_t bytes);

/* Read the whole file at path into img->raw (img->raw_size bytes).
 * CH_ERR_IO naming the path and strerror. */
ch_status ch_image_read_file(ch_image_t *img, const char *path);

/* Decode a JPEG or PNG held in buf[0..len) (format sniffed from its first
 * bytes) into img with `channels` (1 or 3) channels. `name` (a path, may be
 * NULL) is put in error messages. buf must not alias img->data.
 * Errors: CH_ERR_FORMAT (empty, unknown format, corrupt or truncated data,
 * the decoder's own message), CH_ERR_UNSUPPORTED (CMYK JPEG, other image
 * formats such as BMP/TIFF/WebP), CH_ERR_INVALID (channels), CH_ERR_NOMEM.
 *
 * With img->roi_fn set, a JPEG whose region the callback asks for is
 * decoded with libjpeg-turbo's DCT scaling (scale_num / 8) and partial
 * decompression (jpeg_crop_scanline, jpeg_skip_scanlines) into exactly that
 * region (img->h x img->w = roi h x w; see the fields above). Its pixels
 * equal the same region of a full decode at that scale (the columns are
 * decoded with a margin so that libjpeg-turbo's edge handling of fancy
 * upsampling does not reach them). The rows below the region are still
 * entropy-decoded (the last row is decoded) so that a truncated or corrupt
 * file fails with the same error as a full decode. PNGs ignore roi_fn. */
ch_status ch_image_decode(const uint8_t *buf, size_t len, int channels, ch_image_t *img,
                          const char *name);

/* Encode img (c = 1: grayscale, 3: RGB; 8-bit) as a PNG (lossless: decoding
 * it gives img's pixels back) into *out (malloc'd, *len bytes; free it).
 * libpng with fixed settings (zlib level 6, default filters, no time or
 * text chunks), so the bytes depend only on the pixels (and the libpng/zlib
 * build). Errors: CH_ERR_INVALID (no pixels, c not 1 or 3), CH_ERR_FORMAT
 * (libpng's message), CH_ERR_NOMEM. Thread-safe. */
ch_status ch_image_encode_png(const ch_image_t *img, uint8_t **out, size_t *len);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_IMAGE_H */
