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
    /* data.order = shard_window (ch_sampler_set_shard_window); window 0: off */
    int window, nshards;
    int64_t *shard_first; /* nshards + 1 */
    int64_t *shard_perm;  /* nshards */
    int64_t n_own;        /* this epoch: the rank's samples before padding / cutting */
};

/* Fisher-Yates over a[0..m) with randperm_cpu's draws (ATen
 * TensorFactories.cpp, PyTorch 1.13: MT19937, 32-bit draws). */
static void shuffle_segment(int64_t *a, int64_t m, uint64_t seed)
{
    ch_mt19937_t g;
    ch_mt19937_seed(&g, seed);
    for (int64_t i = 0; i + 1 < m; i++) {
        int64_t z = (int64_t)(ch_mt19937_next(&g) % (uint64_t)(m - i));
        int64_t t = a[i];
        a[i] = a[i + z];
        a[i + z] = t;
    }
}

void ch_randperm(int64_t n, uint64_t seed, int64_t *perm)
{
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    shuffle_segment(perm, n, seed);
}

ch_status ch_sampler_create(int64_t n, int world_size, int rank,
                            int shuffle, uint64_t seed, int drop_last, ch_sampler_t **out)
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
    free(s->shard_first);
    free(s->shard_perm);
    free(s);
}

/* The window seed of (seed + epoch, rank, window g): a 64-bit mix folded to
 * the 32 bits MT19937's init uses. */
static uint32_t window_seed(uint64_t se, int rank, int64_t g)
{
    uint64_t x = se * 0x9E3779B97F4A7C15ull ^ ((uint64_t)(uint32_t)rank << 32) ^ (uint64_t)g;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (uint32_t)(x ^ (x >> 32));
}

/* The rank's list of one epoch in shard_window order (see sampler.h). */
static void window_order(ch_sampler_t *s)
{
    uint64_t se = s->seed + (uint64_t)s->epoch;
    ch_randperm(s->nshards, se, s->shard_perm);
    int64_t m = 0, g = 0, w = 0, seg0 = 0;
    for (int64_t t = s->rank; t < s->nshards; t += s->world_size) {
        int64_t sh = s->shard_perm[t];
        for (int64_t i = s->shard_first[sh]; i < s->shard_first[sh + 1]; i++) s->perm[m++] = i;
        if (++w == s->window || t + s->world_size >= s->nshards) {
            shuffle_segment(s->perm + seg0, m - seg0, window_seed(se, s->rank, g++));
            seg0 = m;
            w = 0;
        }
    }
    s->n_own = m;
    for (int64_t k = 0; k < s->num_samples; k++) s->indices[k] = m ? s->perm[k % m] : 0;
}

ch_status ch_sampler_set_shard_window(ch_sampler_t *s, const int64_t *first, int nshards,
                                      int window)
{
    CH_REQUIRE(s && first && window >= 1 && nshards >= 1,
               "ch_sampler_set_shard_window: bad arguments (window %d, %d shards)", window, nshards);
    if (first[0] != 0 || first[nshards] != s->n)
        return CH_ERROR(CH_ERR_INVALID, "data.order = shard_window: the shards hold %lld samples, "
                        "the sampler's dataset %lld", (long long)(first[nshards] - first[0]),
                        (long long)s->n);
    if (nshards < s->world_size)
        return CH_ERROR(CH_ERR_INVALID, "data.order = shard_window: %d shards for world size %d "
                        "(each rank reads shards of its own: pack more, smaller shards)", nshards,
                        s->world_size);
    int64_t *f = malloc((size_t)(nshards + 1) * sizeof *f), *p = malloc((size_t)nshards * sizeof *p);
    if (!f || !p) {
        free(f);
        free(p);
        return CH_ERROR(CH_ERR_NOMEM, "sampler: out of memory");
    }
    for (int k = 0; k <= nshards; k++) f[k] = first[k];
    free(s->shard_first);
    free(s->shard_perm);
    s->shard_first = f;
    s->shard_perm = p;
    s->nshards = nshards;
    s->window = window;
    return ch_sampler_set_epoch(s, s->epoch);
}

ch_status ch_sampler_set_epoch(ch_sampler_t *s, int64_t epoch)
{
    CH_REQUIRE(s != NULL, "ch_sampler_set_epoch: sampler is NULL");
    CH_REQUIRE(epoch >= 0, "sampler: epoch %lld < 0", (long long)epoch);
    s->epoch = epoch;
    if (s->window) {
        window_order(s);
        return CH_OK;
    }
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
    if (s->window) return k >= s->n_own;
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
