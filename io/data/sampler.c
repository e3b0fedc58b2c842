/* cohort: DistributedSampler + BatchSampler, see sampler.h. */
#include "io/data/sampler.h"

#include <stdlib.h>

#include "io/data/mt19937.h"

struct ch_sampler {
    int64_t n;
    int world_size, rank;
    int shuffle, drop_last;
    uint64_t seed;
    int64_t epoch;
    int64_t num_samples, total_size;
    int64_t *perm;    /* n */
    int64_t *indices; /* num_samples */
};

void ch_randperm(int64_t n, uint64_t seed, int64_t *perm)
{
    ch_mt19937_t g;
    ch_mt19937_seed(&g, seed);
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    /* randperm_cpu (ATen TensorFactories.cpp, PyTorch 1.13): 32-bit draws. */
    for (int64_t i = 0; i + 1 < n; i++) {
        int64_t z = (int64_t)(ch_mt19937_next(&g) % (uint64_t)(n - i));
        int64_t t = perm[i];
        perm[i] = perm[i + z];
        perm[i + z] = t;
    }
}

ch_status ch_sampler_create(ch_sampler_t **out, int64_t n, int world_size, int rank,
                            int shuffle, uint64_t seed, int drop_last)
{
    CH_REQUIRE(out != NULL, "ch_sampler_create: out is NULL");
    *out = NULL;
    CH_REQUIRE(n >= 0, "sampler: dataset length %lld < 0", (long long)n);
    CH_REQUIRE(world_size >= 1, "sampler: world size %d < 1", world_size);
    CH_REQUIRE(rank >= 0 && rank < world_size,
               "sampler: invalid rank %d, rank should be in the interval [0, %d]", rank,
               world_size - 1);
    ch_sampler_t *s = calloc(1, sizeof *s);
    if (!s) return CH_ERROR(CH_ERR_NOMEM, "sampler: out of memory");
    s->n = n;
    s->world_size = world_size;
    s->rank = rank;
    s->shuffle = shuffle != 0;
    s->drop_last = drop_last != 0;
    s->seed = seed;
    int64_t W = world_size;
    if (s->drop_last && n % W != 0) {
        /* math.ceil((n - W) / W): for n < W the quotient is in (-1, 0) -> 0 */
        int64_t a = n - W;
        s->num_samples = a <= 0 ? 0 : (a + W - 1) / W;
    } else {
        s->num_samples = (n + W - 1) / W;
    }
    s->total_size = s->num_samples * W;
    s->perm = malloc((size_t)(n > 0 ? n : 1) * sizeof *s->perm);
    s->indices = malloc((size_t)(s->num_samples > 0 ? s->num_samples : 1) * sizeof *s->indices);
    if (!s->perm || !s->indices) {
        ch_sampler_destroy(s);
        return CH_ERROR(CH_ERR_NOMEM, "sampler: out of memory for %lld indices", (long long)n);
    }
    ch_status st = ch_sampler_set_epoch(s, 0);
    if (st != CH_OK) {
        ch_sampler_destroy(s);
        return st;
    }
    *out = s;
    return CH_OK;
}

void ch_sampler_destroy(ch_sampler_t *s)
{
    if (!s) return;
    free(s->perm);
    free(s->indices);
    free(s);
}

ch_status ch_sampler_set_epoch(ch_sampler_t *s, int64_t epoch)
{
    CH_REQUIRE(s != NULL, "ch_sampler_set_epoch: sampler is NULL");
    CH_REQUIRE(epoch >= 0, "sampler: epoch %lld < 0", (long long)epoch);
    s->epoch = epoch;
    if (s->shuffle) {
        ch_randperm(s->n, s->seed + (uint64_t)epoch, s->perm);
    } else {
        for (int64_t i = 0; i < s->n; i++) s->perm[i] = i;
    }
    /* Global position g of the padded/truncated list is perm[g % n]: padding
     * appends the head again, repeating the whole list when needed. */
    for (int64_t k = 0; k < s->num_samples; k++) {
        int64_t g = s->rank + k * (int64_t)s->world_size;
        s->indices[k] = s->perm[g % s->n];
    }
    return CH_OK;
}

int64_t ch_sampler_epoch(const ch_sampler_t *s) { return s->epoch; }
int64_t ch_sampler_num_samples(const ch_sampler_t *s) { return s->num_samples; }
int64_t ch_sampler_total_size(const ch_sampler_t *s) { return s->total_size; }
int64_t ch_sampler_dataset_length(const ch_sampler_t *s) { return s->n; }
int ch_sampler_world_size(const ch_sampler_t *s) { return s->world_size; }
int ch_sampler_rank(const ch_sampler_t *s) { return s->rank; }
const int64_t *ch_sampler_indices(const ch_sampler_t *s) { return s->indices; }

int ch_sampler_is_padding(const ch_sampler_t *s, int64_t k)
{
    return s->rank + k * (int64_t)s->world_size >= s->n;
}

int64_t ch_sampler_num_batches(const ch_sampler_t *s, int64_t batch_size, int drop_last)
{
    if (batch_size <= 0) return 0;
    return drop_last ? s->num_samples / batch_size
                     : (s->num_samples + batch_size - 1) / batch_size;
}

ch_status ch_sampler_batch(const ch_sampler_t *s, int64_t batch_size, int drop_last,
                           int64_t b, const int64_t **first, int64_t *count)
{
    CH_REQUIRE(batch_size > 0, "sampler: batch size %lld <= 0", (long long)batch_size);
    int64_t nb = ch_sampler_num_batches(s, batch_size, drop_last);
    if (b < 0 || b >= nb)
        return CH_ERROR(CH_ERR_RANGE, "sampler: batch %lld out of range [0, %lld)",
                        (long long)b, (long long)nb);
    int64_t start = b * batch_size;
    int64_t c = s->num_samples - start;
    if (c > batch_size) c = batch_size;
    *first = s->indices + start;
    *count = c;
    return CH_OK;
}
