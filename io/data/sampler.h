/* cohort: torch.utils.data.DistributedSampler + BatchSampler, index for index.
 *
 * For a dataset of n samples, world size W and rank r (SEMANTICS.md, "Data
 * order"):
 *   - num_samples = ceil(n / W); with drop_last and n % W != 0,
 *     num_samples = ceil((n - W) / W) (0 when n < W); total_size = num_samples * W.
 *   - shuffle: p = torch.randperm(n, generator=torch.Generator().manual_seed(
 *     seed + epoch)) (MT19937; for i in 0..n-2: z = next32() % (n - i),
 *     swap(p[i], p[i + z])); without shuffle p = 0..n-1.
 *   - no drop_last: p is padded with its own head (repeated if needed) to
 *     total_size; drop_last: p is truncated to total_size.
 *   - rank r takes p[r], p[r + W], p[r + 2W], ...
 * A BatchSampler over the rank's list groups consecutive indices into
 * batches of batch_size; with its drop_last the partial last batch is dropped.
 *
 * Source: torch/utils/data/distributed.py, torch/utils/data/sampler.py and
 * aten/src/ATen/native/TensorFactories.cpp (randperm_cpu) of PyTorch 1.13;
 * tests/test_sampler.c compares with the installed PyTorch.
 */
#ifndef COHORT_SAMPLER_H
#define COHORT_SAMPLER_H

#include <stdint.h>

#include "framework/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ch_sampler ch_sampler_t;

/* Create the sampler of rank `rank` of `world_size` over n samples.
 * shuffle: nonzero to permute (DistributedSampler's default is 1).
 * seed: DistributedSampler's seed (default 0). drop_last: the sampler's
 * drop_last (not the batch sampler's). The epoch starts at 0; call
 * ch_sampler_set_epoch before every epoch.
 * Errors: CH_ERR_INVALID for n < 0, world_size < 1, rank outside
 * [0, world_size - 1] (message names the values); CH_ERR_NOMEM. */
ch_status ch_sampler_create(int64_t n, int world_size, int rank,
                            int shuffle, uint64_t seed, int drop_last, ch_sampler_t **out);
void ch_sampler_destroy(ch_sampler_t *s);

/* Fix the order for `epoch` (DistributedSampler.set_epoch); recomputes the
 * rank's index list (O(n), allocation-free). epoch >= 0. */
ch_status ch_sampler_set_epoch(ch_sampler_t *s, int64_t epoch);
int64_t ch_sampler_epoch(const ch_sampler_t *s);

/* DistributedSampler.num_samples (indices per rank) and total_size. */
int64_t ch_sampler_num_samples(const ch_sampler_t *s);
int64_t ch_sampler_total_size(const ch_sampler_t *s);
int64_t ch_sampler_dataset_length(const ch_sampler_t *s);
int ch_sampler_world_size(const ch_sampler_t *s);
int ch_sampler_rank(const ch_sampler_t *s);

/* The rank's num_samples dataset indices for the current epoch, in order.
 * Valid until the next set_epoch / destroy. */
const int64_t *ch_sampler_indices(const ch_sampler_t *s);

/* Whether position k of the rank's list (0 <= k < num_samples) is padding,
 * i.e. a repeat of an index already given to some rank this epoch
 * (global position r + k*W >= n). Used to count exact validation accuracy
 * over the n real samples. */
int ch_sampler_is_padding(const ch_sampler_t *s, int64_t k);

/* BatchSampler(sampler, batch_size, drop_last): number of batches per epoch,
 * floor(num_samples / batch_size) with drop_last, else ceil(...). */
int64_t ch_sampler_num_batches(const ch_sampler_t *s, int64_t batch_size, int drop_last);

/* Batch b (0-based) of the BatchSampler: *first points into
 * ch_sampler_indices, *count is its length (batch_size, or less for the last
 * batch without drop_last). CH_ERR_RANGE if b is out of range. */
ch_status ch_sampler_batch(const ch_sampler_t *s, int64_t batch_size, int drop_last,
                           int64_t b, const int64_t **first, int64_t *count);

/* torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on CPU
 * (PyTorch 1.13) into perm[0..n-1]. */
void ch_randperm(int64_t n, uint64_t seed, int64_t *perm);

/* data.order = shard_window, an opt-in order for disk-based file systems
 * that is NOT DistributedSampler's: the dataset's samples lie in nshards
 * consecutive ranges (shard k = [first[k], first[k+1]), first[0] = 0,
 * first[nshards] = n, e.g. ch_shard_index_t.first). Each epoch e: the
 * shards are permuted (torch.randperm(nshards) seeded with seed + e, as
 * DistributedSampler permutes samples); rank r takes the shards at
 * positions r, r + W, r + 2W, ... of that permutation, in that order, in
 * windows of `window` shards; the samples of each window are shuffled
 * among themselves (MT19937 seeded from seed + e, r and the window number).
 * So a rank reads at most `window` shards at a time, each shard by one rank
 * per epoch. Every rank's list is then cut or padded (repeating its own
 * head; ch_sampler_is_padding tells which) to num_samples, so a rank whose
 * shards hold more samples skips its last ones that epoch: with unequal
 * shards a few samples per epoch are skipped or seen twice. Deterministic
 * for a given seed, epoch and world size, whatever the loader's workers.
 * Errors: CH_ERR_INVALID when first[nshards] != n or nshards < world size,
 * CH_ERR_NOMEM. Recomputes the current epoch's list. */
ch_status ch_sampler_set_shard_window(ch_sampler_t *s, const int64_t *first, int nshards,
                                      int window);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_SAMPLER_H */
