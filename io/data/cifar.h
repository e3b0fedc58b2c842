/* cohort: CIFAR-10 binary batches, from memory.
 *
 * Format (https://www.cs.toronto.edu/~kriz/cifar.html): records of
 * 1 + 3072 bytes: the label (0..9), then the 32x32 red plane, green plane and
 * blue plane, rows top to bottom. ch_dataset_cifar10_open (dataset.h) reads
 * the files; this is the memory entry point it and the fuzz target use.
 */
#ifndef COHORT_CIFAR_H
#define COHORT_CIFAR_H

#include <stddef.h>
#include <stdint.h>

#include "framework/core/status.h"
#include "io/data/dataset.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CH_CIFAR_SIDE 32
#define CH_CIFAR_RECORD (1 + 3 * 32 * 32)

/* Build a CIFAR-10 dataset from nbufs in-memory batch files (concatenated in
 * order); names[k] is used in messages. The buffers are not kept.
 * Errors: CH_ERR_FORMAT (size 0 or not a multiple of 3073 bytes; label
 * >= 10 naming the file and record), CH_ERR_NOMEM. */
ch_status ch_dataset_cifar10_from_memory(const uint8_t *const *bufs,
                                         const size_t *lens, const char *const *names, int nbufs, ch_dataset_t **out);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_CIFAR_H */
