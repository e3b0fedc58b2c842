/* cohort example: a program outside the cohort tree that links libcohort.
 *
 * Every rank takes its share of a data set's indices from cohort's
 * DistributedSampler (io/data/sampler.h: the same order as PyTorch's
 * torch.utils.data.DistributedSampler) and counts them in a histogram; one
 * all-reduce (framework/dist/dist.h, MPI backend) sums the histograms. With
 * a data set of n samples, no padding (n divisible by the world size) and
 * no drop_last, every index must then have been seen exactly once.
 *
 * Build and run with the installed cohort (after `module load cohort`, or
 * with PKG_CONFIG_PATH pointing at <prefix>/lib/pkgconfig):
 *
 *     cc -o sampler_allreduce sampler_allreduce.c $(pkg-config --cflags --libs cohort)
 *     mpiexec -n 2 ./sampler_allreduce 1000
 *
 * The file is also valid C++ (c++ -x c++ ...): the headers declare
 * extern "C" linkage. Exit status 0 when every index was seen once, 1 on an
 * error, 2 for a bad argument. */
#include <cohort/framework/core/status.h>
#include <cohort/framework/dist/dist.h>
#include <cohort/io/data/sampler.h>

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Count this rank's indices of epoch 3, sum over ranks, check each is 1. */
static ch_status run(ch_pg_t *pg, int64_t n, int *bad)
{
    int rank = ch_pg_rank(pg), world = ch_pg_size(pg);
    ch_sampler_t *sampler = NULL;
    ch_status s = ch_sampler_create(n, world, rank, 1, 0, 0, &sampler);
    if (s == CH_OK) s = ch_sampler_set_epoch(sampler, 3);
    int32_t *seen = (int32_t *)calloc((size_t)n, sizeof *seen);
    if (s == CH_OK && !seen)
        s = CH_ERROR(CH_ERR_NOMEM, "histogram of %lld counts", (long long)n);
    if (s == CH_OK) {
        const int64_t *idx = ch_sampler_indices(sampler);
        for (int64_t k = 0; k < ch_sampler_num_samples(sampler); k++) seen[idx[k]]++;
        s = ch_pg_allreduce(pg, seen, seen, n, CH_DIST_INT32, CH_REDUCE_SUM);
    }
    *bad = 0;
    for (int64_t i = 0; s == CH_OK && i < n; i++)
        if (seen[i] != 1) (*bad)++;
    if (s == CH_OK && rank == 0)
        printf("sampler_allreduce: %d ranks, %lld samples, %lld per rank, indices seen "
               "once: %lld of %lld\n",
               world, (long long)n, (long long)ch_sampler_num_samples(sampler),
               (long long)(n - *bad), (long long)n);
    free(seen);
    ch_sampler_destroy(sampler);
    return s;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    long long n = argc > 1 ? strtoll(argv[1], NULL, 10) : 1000;
    if (n < 1 || n % world != 0) {
        fprintf(stderr, "usage: mpiexec -n W sampler_allreduce N (N > 0, a multiple of W)\n");
        MPI_Finalize();
        return 2;
    }
    ch_pg_t *pg = NULL;
    int bad = 0;
    ch_status s = ch_pg_create_mpi(MPI_COMM_WORLD, &pg);
    if (s == CH_OK) s = run(pg, (int64_t)n, &bad);
    if (s != CH_OK) fprintf(stderr, "sampler_allreduce: %s\n", ch_error_message());
    ch_pg_destroy(pg);
    MPI_Finalize();
    return s != CH_OK ? 1 : bad != 0;
}
