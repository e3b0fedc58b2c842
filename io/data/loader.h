/* cohort: the data loader — worker threads fill a ring of batch slots.
 *
 * torch.utils.data.DataLoader(dataset, batch_size, sampler=
 * DistributedSampler(...), drop_last, num_workers, pin_memory) in C:
 *   - the order is the DistributedSampler + BatchSampler order (sampler.h),
 *     whatever the number of workers: batch b of the epoch is always handed
 *     out b-th;
 *   - a batch is float32 images [N, C, H, W] contiguous (NCHW) and int64
 *     labels [N], in one of `prefetch` slots allocated once at create
 *     (page-locked with cudaHostAlloc when pinned is asked and a GPU is
 *     visible, 64-byte aligned host memory otherwise: device.h);
 *   - workers are a framework thread pool (threadpool.h) of num_workers
 *     threads; each batch is one job that reads, decodes and transforms its
 *     samples straight into the slot (num_workers = 0: the batch is loaded
 *     by ch_loader_next in the calling thread, like DataLoader's
 *     num_workers=0);
 *   - augmentation randomness is per (transform seed, epoch, dataset index)
 *     (transforms.h), so results do not depend on num_workers or timing;
 *   - an error in a worker (unreadable or undecodable file, bad crop) makes
 *     ch_loader_next return it with the file, the dataset index and the
 *     batch; the epoch stops cleanly (jobs in flight finish or are
 *     cancelled, nothing more is queued) and every later next() of that
 *     epoch returns the same error until ch_loader_start_epoch;
 *   - ch_loader_destroy cancels queued work and joins every thread.
 *
 * Usage per epoch:
 *     CH_TRY(ch_loader_start_epoch(l, epoch));     // sampler.set_epoch(epoch)
 *     for (;;) {
 *         ch_batch_t *b;
 *         CH_TRY(ch_loader_next(l, &b));
 *         if (!b) break;                           // end of epoch
 *         ... use b->images, b->labels, b->n ...
 *         ch_loader_release(l, b);                 // slot goes back to the workers
 *     }
 * No allocation happens in next/release once the workers' scratch buffers
 * have grown to the largest image (ImageFolder) — immediately for IDX/CIFAR.
 */
#ifndef COHORT_LOADER_H
#define COHORT_LOADER_H

#include <stdint.h>

#include "framework/core/status.h"
#include "io/data/dataset.h"
#include "io/data/sampler.h"
#include "io/data/transforms.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ch_loader_options {
    int64_t batch_size;      /* per rank (DataLoader batch_size), >= 1 */
    int drop_last;           /* DataLoader drop_last: drop the partial last batch */
    int num_workers;         /* worker threads, 0 = load in ch_loader_next */
    int prefetch;            /* batch slots in the ring, >= 1 (0: 2 * max(1, num_workers)) */
    int pinned;              /* want page-locked slots (the batches go to a GPU) */
    size_t pinned_max_bytes; /* cap on the page-locked bytes of all slots together
                                (0: CH_LOADER_PINNED_MAX_DEFAULT); the slots past
                                it are pageable (ch_loader_pinned_slots) */
    int world_size, rank;    /* DistributedSampler num_replicas / rank */
    int shuffle;             /* DistributedSampler shuffle */
    uint64_t seed;           /* DistributedSampler seed (also keys the transforms) */
    int sampler_drop_last;   /* DistributedSampler drop_last */
    const ch_transform_t *transforms; /* ops, ending with Normalize (transforms.h) */
    int n_transforms;
    int shard_window;          /* > 0: data.order = shard_window over the shards below
                                  (ch_sampler_set_shard_window; not DistributedSampler
                                  order); 0: off */
    const int64_t *shard_first; /* n_shards + 1 sample offsets (read at create) */
    int n_shards;
    int fast_decode;           /* data.fast_decode: JPEGs decoded partially / DCT-scaled
                                  for a pipeline starting with RandomResizedCrop or Resize
                                  (transforms.h "fast JPEG decode"; not bit-identical);
                                  0: full decode (default) */
} ch_loader_options_t;

/* Defaults: batch_size 32, drop_last 0, num_workers 2, prefetch 0 (auto),
 * pinned 0, pinned_max_bytes 0 (1 GiB), world_size 1, rank 0, shuffle 1,
 * seed 0, sampler_drop_last 0, no transforms (must be set), fast_decode 0. */
void ch_loader_options_default(ch_loader_options_t *cfg);

typedef struct ch_batch {
    float *images;          /* [n, c, h, w] float32, NCHW contiguous */
    int64_t *labels;        /* [n] int64 */
    const int64_t *indices; /* [n] dataset indices, sampler order */
    int64_t n;              /* samples in this batch (batch_size or fewer for the last) */
    int64_t n_real;         /* of which not DistributedSampler padding (the first n_real) */
    int c, h, w;
    int64_t epoch, index;   /* epoch and batch number within it */
    int pinned;             /* slot memory is page-locked */
} ch_batch_t;

typedef struct ch_loader ch_loader_t;

/* Build a loader over ds (which must outlive it). Allocates every slot.
 * Errors: CH_ERR_INVALID (bad config: batch_size, workers, rank/world size,
 * transforms; channels of ds and transforms; output size not fixed),
 * CH_ERR_RANGE (the configuration gives this rank no batch at all, e.g. a
 * dataset smaller than the world size with sampler_drop_last, or fewer
 * samples per rank than batch_size with drop_last: the message gives n, the
 * world size, samples per rank and batch size), CH_ERR_NOMEM / CH_ERR_CUDA
 * (slot allocation), CH_ERR_INTERNAL (threads). A dataset smaller than the
 * world size without sampler_drop_last is allowed (PyTorch pads by
 * repeating samples) and logged as a warning. */
ch_status ch_loader_create(ch_dataset_t *ds, const ch_loader_options_t *cfg, ch_loader_t **out);

/* Stop any epoch in progress, set the sampler's epoch and queue the first
 * batches. Batches of the previous epoch must not be used afterwards. */
ch_status ch_loader_start_epoch(ch_loader_t *l, int64_t epoch);

/* As ch_loader_start_epoch, but the first batch handed out is first_batch
 * (0 <= first_batch <= num_batches): resuming a preempted epoch at a step
 * boundary gives exactly the batches an uninterrupted epoch would have
 * given from there, without loading the skipped ones. CH_ERR_RANGE for
 * first_batch out of range. */
ch_status ch_loader_start_epoch_at(ch_loader_t *l, int64_t epoch, int64_t first_batch);

/* Next batch of the epoch in sampler order, waiting for the workers when
 * needed; *batch = NULL (CH_OK) at the end of the epoch. At most `prefetch`
 * batches may be held (not released) at once: CH_ERR_INVALID beyond.
 * Errors: a worker's error (message names the file, dataset index and
 * batch); CH_ERR_INVALID when no epoch was started. */
ch_status ch_loader_next(ch_loader_t *l, ch_batch_t **batch);

/* Give a batch from ch_loader_next back; its slot is refilled with a later
 * batch. */
void ch_loader_release(ch_loader_t *l, ch_batch_t *batch);

/* Batches per epoch for this rank (BatchSampler length). */
int64_t ch_loader_num_batches(const ch_loader_t *l);
/* The loader's sampler (read-only use: num_samples, total_size, padding). */
const ch_sampler_t *ch_loader_sampler(const ch_loader_t *l);
/* Samples per batch (the configured batch_size; the last batch of an epoch
 * may hold fewer). */
int64_t ch_loader_batch_size(const ch_loader_t *l);
/* Output sample shape (C, H, W). */
void ch_loader_sample_shape(const ch_loader_t *l, int *c, int *h, int *w);
/* Default cap on a loader's page-locked slot memory: 1 GiB. 2 x workers
 * slots of an ImageNet batch of 256 (154 MB each) would page-lock ~2.5 GB
 * per rank with 8 workers, 20 GB on an 8-GPU node; page-locked memory is
 * taken from what the OS can swap or cache, and cudaHostAlloc of that much
 * may fail under a memlock limit. The slots past the cap are pageable:
 * their uploads are staged by the driver (slower, still correct). */
#define CH_LOADER_PINNED_MAX_DEFAULT ((size_t)1 << 30)

/* Of the loader's slots: *asked = how many fit the page-locked cap (the
 * first ones, images + labels each; 0 when pinned was not asked), *pinned =
 * how many are page-locked now (fewer where no GPU is visible or
 * cudaHostAlloc refused: device.h, ch_host_alloc). Either may be NULL. */
void ch_loader_pinned_slots(const ch_loader_t *l, int *asked, int *pinned);

/* Seconds ch_loader_next spent waiting for workers since create. */
double ch_loader_wait_seconds(const ch_loader_t *l);

/* Cancel queued work, join every worker thread, free the slots. NULL is a
 * no-op. */
void ch_loader_destroy(ch_loader_t *l);

/* Fashion-MNIST mean and std of the training pixels (after ToTensor). */
#define CH_FASHION_MNIST_MEAN 0.2860f
#define CH_FASHION_MNIST_STD 0.3530f

/* One call for the training job: open Fashion-MNIST in dir (train = 1: the
 * 60000 training images, 0: the 10000 test images; ch_dataset_fashion_mnist_open)
 * and build a loader over it with cfg (batch_size, drop_last, num_workers,
 * prefetch, pinned, world_size, rank, shuffle, seed, sampler_drop_last as
 * given). When cfg->transforms is NULL the standard pipeline is used:
 * train: RandomCrop(28, padding=4), RandomHorizontalFlip(0.5),
 * ToTensor + Normalize((0.2860,), (0.3530,)); test: ToTensor + Normalize.
 * On success the caller owns both: ch_loader_destroy(*loader) then
 * ch_dataset_destroy(*dataset). Errors as ch_dataset_fashion_mnist_open and
 * ch_loader_create; nothing is left allocated on error. */
ch_status ch_loader_fashion_mnist_create(const char *dir, int train,
                                         const ch_loader_options_t *cfg, ch_loader_t **loader, ch_dataset_t **dataset);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_LOADER_H */
