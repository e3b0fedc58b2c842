/* cohort: the IDX file format of MNIST / Fashion-MNIST, from memory.
 *
 * Format (http://yann.lecun.com/exdb/mnist/): big-endian magic
 * 0x00 0x00 <type> <ndims>, then ndims big-endian uint32 sizes, then the
 * data. cohort reads type 0x08 (unsigned byte) only: images 0x00000803
 * (N x H x W), labels 0x00000801 (N). ch_dataset_idx_open (dataset.h) is
 * the file-level entry point; these memory functions are what it and the
 * fuzz target use.
 */
#ifndef COHORT_IDX_H
#define COHORT_IDX_H

#include <stddef.h>
#include <stdint.h>

#include "framework/core/status.h"
#include "io/data/dataset.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CH_IDX_MAGIC_IMAGES 0x00000803u
#define CH_IDX_MAGIC_LABELS 0x00000801u

typedef struct ch_idx {
    int ndims;
    int64_t dims[3];
    const uint8_t *data; /* points into the parsed buffer */
    size_t size;         /* bytes of data = product of dims */
} ch_idx_t;

/* Parse an uncompressed IDX buffer whose magic must be `magic`
 * (CH_IDX_MAGIC_IMAGES or CH_IDX_MAGIC_LABELS). Extra bytes after the data
 * are an error, as is missing data. `name` goes in messages.
 * Errors: CH_ERR_FORMAT ("wrong magic 0x... (expected 0x...)", "truncated:
 * N bytes of data expected after the header, M present", zero size). */
ch_status ch_idx_parse(const uint8_t *buf, size_t len, uint32_t magic, const char *name,
                       ch_idx_t *out);

/* If buf holds gzip (or zlib) data, inflate it into a new malloc'd buffer
 * (*out, *out_len; free() it), concatenated members included; at most
 * max_out bytes (CH_ERR_FORMAT beyond). Otherwise *out = NULL (the input is
 * raw). Errors: CH_ERR_FORMAT (corrupt or truncated stream, with zlib's
 * message), CH_ERR_NOMEM. */
ch_status ch_idx_gunzip(const uint8_t *buf, size_t len, size_t max_out, const char *name,
                        uint8_t **out, size_t *out_len);

/* Build an IDX dataset from the (raw or gzip) bytes of an images and a
 * labels file; the names are used in messages. The buffers are not kept.
 * Errors as ch_dataset_idx_open. */
ch_status ch_dataset_idx_from_memory(const uint8_t *images, size_t images_len,
                                     const char *images_name, const uint8_t *labels,
                                     size_t labels_len, const char *labels_name, int num_classes, ch_dataset_t **out);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_IDX_H */
