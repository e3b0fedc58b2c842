/* cohort: the batch feed — a loader's batches as step tensors on the
 * compute device, so that one epoch loop serves CPU and GPU ranks.
 *
 *     ch_batch_feed_t *feed;
 *     CH_TRY(ch_batch_feed_create(cx, dev, dev_index, loaders, 2, &feed));
 *     CH_TRY(ch_loader_start_epoch(loader, epoch));
 *     CH_TRY(ch_batch_feed_start(feed, loader, steps));
 *     for (;;) {
 *         ch_step_batch_t b;
 *         CH_TRY(ch_batch_feed_next(feed, &b));
 *         if (!b.x) break;                       // end of the epoch / steps
 *         ... queue the step on b.x (N,C,H,W) and b.y (N) ...
 *         CH_TRY(ch_batch_feed_prefetch(feed)); // GPU: next batch's copy now
 *         ... wait for the step (e.g. read its loss) ...
 *     }
 *     ch_batch_feed_stop(feed);                 // also after an early break
 *
 * CPU (dev CH_DEV_CPU): b.x / b.y wrap the loader's host batch (no copy);
 * the batch goes back to the loader at the next ch_batch_feed_next or at
 * ch_batch_feed_stop. ch_batch_feed_prefetch does nothing (the loader's
 * workers already prefetch).
 *
 * GPU (CH_DEV_CUDA): two device input slots, each sized for the largest
 * batch of the loaders given at create (batch_size x C x H x W floats and
 * batch_size labels). A batch is fetched from the loader and its copy from
 * the page-locked loader slot queued on the compute context's copy stream
 * (ch_op_upload_async) into one device slot; ch_batch_feed_next makes the
 * compute stream wait for that copy (ch_compute_wait_upload), gives the
 * host batch back to the loader and returns views of the device slot.
 * ch_batch_feed_prefetch fetches the following batch into the OTHER slot
 * while the current step's kernels run. Its copy is not ordered after
 * queued compute work (ops.h), so the caller must have waited for every
 * step that read that other slot, i.e. the step before the current one:
 * a loop that ends each step with a host wait (ch_model_loss_value,
 * ch_op_count_correct) satisfies it. Without a prefetch, next fetches
 * itself (and waits for the copy).
 *
 * A batch of 0 samples (a rank without test samples) gives 0-row tensors
 * and no copy. Not thread-safe; one feed per compute context.
 */
#ifndef COHORT_IO_BATCH_FEED_H
#define COHORT_IO_BATCH_FEED_H

#include "framework/core/status.h"
#include "framework/ops/ops.h"
#include "framework/tensor/tensor.h"
#include "io/data/loader.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ch_batch_feed ch_batch_feed_t;

/* One step's input: x (N, C, H, W) float32 PLAIN and y (N) int64 on the
 * feed's device; x.data == NULL at the end. n_real: of the N samples, the
 * first n_real are not DistributedSampler padding. Valid until the next
 * ch_batch_feed_next / ch_batch_feed_stop. */
typedef struct {
    ch_tensor_t x, y;
    int64_t n_real;
} ch_step_batch_t;

/* A feed onto (dev, dev_index) through cx (not owned; must outlive the
 * feed), for batches of any of loaders[0..n_loaders) (GPU: the device slots
 * are sized for the largest). Errors: CH_ERR_INVALID (NULL or bad
 * arguments), CH_ERR_NOMEM / CH_ERR_CUDA allocating the slots,
 * CH_ERR_UNSUPPORTED for CH_DEV_CUDA in a build without CUDA. */
ch_status ch_batch_feed_create(ch_compute_t *cx, ch_devkind_t dev, int dev_index,
                               ch_loader_t *const *loaders, int n_loaders,
                               ch_batch_feed_t **out);

/* Stop (ch_batch_feed_stop) and free the slots. NULL is a no-op. */
void ch_batch_feed_destroy(ch_batch_feed_t *f);

/* Hand out the batches of loader, whose epoch the caller has started
 * (ch_loader_start_epoch / _at), at most max_batches of them (< 0: to the
 * end of the epoch). Stops a previous run first. GPU: fetches the first
 * batch and queues its copy. Errors: the loader's (a worker's read error),
 * CH_ERR_INVALID for a loader whose batches do not fit the slots, upload
 * errors. */
ch_status ch_batch_feed_start(ch_batch_feed_t *f, ch_loader_t *loader, int64_t max_batches);

/* The next step's tensors into *b (b->x.data NULL at the end: the loader's
 * epoch ended or max_batches were handed out). Errors as start. */
ch_status ch_batch_feed_next(ch_batch_feed_t *f, ch_step_batch_t *b);

/* GPU: fetch the batch after the current one and queue its copy into the
 * other slot (see the top of this file for when that is safe); nothing at
 * the end or when already fetched. CPU: nothing. Errors as start. */
ch_status ch_batch_feed_prefetch(ch_batch_feed_t *f);

/* Give every batch still held back to the loader (GPU: after its copy has
 * finished reading it). Idempotent. Errors: the wait for the copy
 * (CH_ERR_CUDA); the batch is given back anyway. */
ch_status ch_batch_feed_stop(ch_batch_feed_t *f);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_IO_BATCH_FEED_H */
