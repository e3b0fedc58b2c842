/* Tests for io/data/sampler and io/data/mt19937: index lists against PyTorch's own
 * DistributedSampler + BatchSampler (tests/golden/sampler_golden.py). */
#include "config.h"

#include "tests/harness.h"

#include "io/data/mt19937.h"
#include "io/data/sampler.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_mt19937_reference_outputs(void **state)
{
    /* Reference: mt19937ar.c and C++ std::mt19937 (10000th output of the
     * default seed 5489 is 4123659995). */
    ch_mt19937_t g;
    ch_mt19937_seed(&g, 5489);
    assert_int_equal(ch_mt19937_next(&g), 3499211612u);
    assert_int_equal(ch_mt19937_next(&g), 581869302u);
    ch_mt19937_seed(&g, 5489);
    uint32_t v = 0;
    for (int i = 0; i < 10000; i++) v = ch_mt19937_next(&g);
    assert_int_equal(v, 4123659995u);
    /* only the low 32 bits of the seed count (torch's manual_seed) */
    ch_mt19937_t h;
    ch_mt19937_seed(&g, 7);
    ch_mt19937_seed(&h, 7 + (UINT64_C(1) << 32));
    assert_int_equal(ch_mt19937_next(&g), ch_mt19937_next(&h));
}

static void test_invalid_arguments(void **state)
{
    ch_sampler_t *s = NULL;
    assert_ch_error(ch_sampler_create(10, 2, 2, 1, 0, 0, &s), CH_ERR_INVALID, "invalid rank 2");
    assert_null(s);
    assert_ch_error(ch_sampler_create(10, 0, 0, 1, 0, 0, &s), CH_ERR_INVALID, "world size 0");
    assert_ch_error(ch_sampler_create(-1, 1, 0, 1, 0, 0, &s), CH_ERR_INVALID, "length -1");
    assert_ch_ok(ch_sampler_create(10, 2, 1, 1, 0, 0, &s));
    assert_ch_error(ch_sampler_set_epoch(s, -1), CH_ERR_INVALID, "epoch -1");
    const int64_t *first;
    int64_t count;
    assert_ch_error(ch_sampler_batch(s, 2, 0, 3, &first, &count), CH_ERR_RANGE, "batch 3");
    assert_ch_ok(ch_sampler_batch(s, 2, 0, 2, &first, &count));
    assert_int_equal(count, 1);
    ch_sampler_destroy(s);
}

/* A dataset smaller than the world size: PyTorch pads every rank with
 * repeats (no drop_last) or gives every rank nothing (drop_last). */
static void test_dataset_smaller_than_world_size(void **state)
{
    ch_sampler_t *s;
    assert_ch_ok(ch_sampler_create(3, 8, 6, 0, 0, 0, &s));
    assert_int_equal(ch_sampler_num_samples(s), 1);
    assert_int_equal(ch_sampler_total_size(s), 8);
    assert_int_equal(ch_sampler_indices(s)[0], 0); /* position 6 -> 6 % 3 */
    assert_true(ch_sampler_is_padding(s, 0));
    ch_sampler_destroy(s);
    assert_ch_ok(ch_sampler_create(3, 8, 2, 0, 0, 0, &s));
    assert_false(ch_sampler_is_padding(s, 0));
    ch_sampler_destroy(s);
    assert_ch_ok(ch_sampler_create(3, 8, 0, 1, 0, 1, &s));
    assert_int_equal(ch_sampler_num_samples(s), 0);
    assert_int_equal(ch_sampler_num_batches(s, 1, 0), 0);
    ch_sampler_destroy(s);
}

static void test_epochs_repeat_and_differ(void **state)
{
    ch_sampler_t *s;
    int64_t a[100], b[100];
    assert_ch_ok(ch_sampler_create(200, 2, 1, 1, 3, 0, &s));
    assert_ch_ok(ch_sampler_set_epoch(s, 4));
    memcpy(a, ch_sampler_indices(s), sizeof a);
    assert_ch_ok(ch_sampler_set_epoch(s, 5));
    memcpy(b, ch_sampler_indices(s), sizeof b);
    assert_memory_not_equal(a, b, sizeof a);
    assert_ch_ok(ch_sampler_set_epoch(s, 4));
    assert_memory_equal(a, ch_sampler_indices(s), sizeof a);
    assert_int_equal(ch_sampler_epoch(s), 4);
    ch_sampler_destroy(s);
}

static int64_t parse_list(char **p, int64_t *out, int64_t cap)
{
    int64_t k = 0;
    for (;;) {
        while (**p == ' ') (*p)++;
        if (**p < '0' || **p > '9') break;
        int64_t v = strtoll(*p, p, 10);
        if (k < cap) out[k] = v;
        k++;
    }
    return k;
}

static void test_golden_against_pytorch(void **state)
{
    const char *have = getenv("HAVE_TORCH");
    if (!have || strcmp(have, "yes") != 0) ch_test_skip("HAVE_TORCH != yes");
    const char *py = getenv("PYTHON3") ? getenv("PYTHON3") : "python3";
    char out[4096], cmd[8192];
    snprintf(out, sizeof out, "%s/tests/sampler_golden.txt", ch_test_builddir());
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/golden/sampler_golden.py' '%s'", py,
             ch_test_srcdir(), out);
    assert_int_equal(system(cmd), 0);
    FILE *f = fopen(out, "r");
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0;
    int64_t *want = malloc(70000 * sizeof *want), *got = malloc(70000 * sizeof *got);
    int lines = 0, perms = 0;
    while (getline(&line, &cap, f) > 0) {
        char *p = strchr(line, ':');
        assert_non_null(p);
        p++;
        if (strncmp(line, "randperm", 8) == 0) {
            long long n;
            unsigned long long seed;
            assert_int_equal(sscanf(line, "randperm %lld %llu", &n, &seed), 2);
            assert_true(n <= 70000);
            assert_int_equal(parse_list(&p, want, 70000), n);
            ch_randperm(n, seed, got);
            assert_memory_equal(got, want, (size_t)n * sizeof *got);
            perms++;
            continue;
        }
        long long n, seed, epoch, bs;
        int W, rank, drop_last, shuffle, bdl;
        assert_int_equal(sscanf(line, "%lld %d %d %lld %lld %d %d %lld %d", &n, &W, &rank, &seed,
                                &epoch, &drop_last, &shuffle, &bs, &bdl),
                         9);
        int64_t k = parse_list(&p, want, 70000);
        ch_sampler_t *s;
        assert_ch_ok(ch_sampler_create(n, W, rank, shuffle, (uint64_t)seed, drop_last, &s));
        assert_ch_ok(ch_sampler_set_epoch(s, epoch));
        if (ch_sampler_num_samples(s) != k)
            fail_msg("n=%lld W=%d rank=%d drop_last=%d: num_samples %lld, torch %lld", n, W,
                     rank, drop_last, (long long)ch_sampler_num_samples(s), (long long)k);
        if (k && memcmp(ch_sampler_indices(s), want, (size_t)k * sizeof *want) != 0)
            fail_msg("n=%lld W=%d rank=%d seed=%lld epoch=%lld drop_last=%d: order differs", n,
                     W, rank, seed, epoch, drop_last);
        /* batch lengths */
        p = strchr(p, '|');
        assert_non_null(p);
        p++;
        int64_t nb = parse_list(&p, got, 70000);
        assert_int_equal(ch_sampler_num_batches(s, bs, bdl), nb);
        for (int64_t b = 0; b < nb; b++) {
            const int64_t *first;
            int64_t count;
            assert_ch_ok(ch_sampler_batch(s, bs, bdl, b, &first, &count));
            assert_int_equal(count, got[b]);
            assert_ptr_equal(first, ch_sampler_indices(s) + b * bs);
        }
        ch_sampler_destroy(s);
        lines++;
    }
    free(line);
    free(want);
    free(got);
    fclose(f);
    assert_true(lines > 5000);
    assert_int_equal(perms, 6);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mt19937_reference_outputs),
        cmocka_unit_test(test_invalid_arguments),
        cmocka_unit_test(test_dataset_smaller_than_world_size),
        cmocka_unit_test(test_epochs_repeat_and_differ),
        cmocka_unit_test(test_golden_against_pytorch),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
