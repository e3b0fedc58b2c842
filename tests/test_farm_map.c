/* Tests of ch_farm_map (framework/farm/map.h): results in task order on
 * rank 0 for any chunk size and thread count, the lowest failing task's
 * error on every rank, bad arguments. Runs at 1, 2 and 4 ranks. */
#include "tests/harness.h"

#include "framework/farm/map.h"

#include <inttypes.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t i;
    int rank;
} rec_t;

static ch_status record(int64_t i, void *result, void *ctx)
{
    rec_t *r = result;
    r->i = i * 3 + 1;
    r->rank = *(int *)ctx;
    return CH_OK;
}

static void test_order_and_spread(void **state)
{
    (void)state;
    const int64_t ns[] = {0, 1, 7, 1000, 100003};
    const int64_t chunks[] = {0, 1, 3, 1000};
    int rank = ch_test_rank(), size = ch_test_world_size();
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) {
        for (size_t b = 0; b < sizeof chunks / sizeof *chunks; b++) {
            int64_t n = ns[a];
            rec_t *r = rank == 0 ? calloc((size_t)n + 1, sizeof *r) : NULL;
            ch_farm_map_options_t o = {(int)(b % 3), chunks[b]};
            assert_ch_ok(ch_farm_map(MPI_COMM_WORLD, &o, n, sizeof *r, record, &rank, r));
            if (rank == 0) {
                int seen[4] = {0};
                for (int64_t i = 0; i < n; i++) {
                    if (r[i].i != i * 3 + 1)
                        fail_msg("n %" PRId64 " chunk %" PRId64 ": result %" PRId64 " is %" PRId64,
                                 n, chunks[b], i, r[i].i);
                    seen[r[i].rank & 3] = 1;
                }
                /* enough chunks: every rank took part */
                if (n >= 1000 && chunks[b] == 1)
                    for (int k = 0; k < size && k < 4; k++) assert_true(seen[k]);
            }
            free(r);
        }
    }
}

static ch_status fail_some(int64_t i, void *result, void *ctx)
{
    (void)ctx;
    *(double *)result = 0;
    if (i == 77 || i == 500) return CH_ERROR(CH_ERR_RANGE, "value %" PRId64 " out of range", i);
    return CH_OK;
}

static void test_error_of_the_lowest_task(void **state)
{
    (void)state;
    double *r = ch_test_rank() == 0 ? malloc(1000 * sizeof *r) : NULL;
    ch_farm_map_options_t o = {2, 10};
    assert_ch_error(ch_farm_map(MPI_COMM_WORLD, &o, 1000, sizeof *r, fail_some, NULL, r),
                    CH_ERR_RANGE, "task 77 (rank ");
    assert_non_null(strstr(ch_error_message(), "value 77 out of range"));
    free(r);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    double x;
    assert_ch_error(ch_farm_map(MPI_COMM_WORLD, NULL, -1, sizeof x, fail_some, NULL, &x),
                    CH_ERR_INVALID, "n -1");
    assert_ch_error(ch_farm_map(MPI_COMM_WORLD, NULL, 5, sizeof x, NULL, NULL, &x), CH_ERR_INVALID,
                    "fn NULL");
    /* rank 0 without a results buffer: every rank fails */
    assert_ch_error(ch_farm_map(MPI_COMM_WORLD, NULL, 5, sizeof x, fail_some, NULL, NULL),
                    CH_ERR_INVALID, "rank 0 needs a results buffer");
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_and_spread),
        cmocka_unit_test(test_error_of_the_lowest_task),
        cmocka_unit_test(test_bad_arguments),
    };
    return ch_test_main_mpi(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
