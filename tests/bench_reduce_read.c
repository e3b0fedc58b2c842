/* Reference for docs/PERFORMANCE.md (cohort-reduce rows): the machine's
 * read bandwidth as a plain program sees it. Each of W MPI ranks pread()s
 * its 1/W share of a float64 .npy's data in 64 MiB pieces and sums the
 * values (one float64 accumulator per lane, no checks, no threads), then
 * the sums are all-reduced. Prints seconds and GB/s of the slowest rank.
 *
 *   mpiexec -n 2 tests/bench_reduce_read FILE.npy
 *   mpiexec -n 2 tests/bench_reduce_read --init-only   (MPI start + finalize only)
 */
#include "config.h"

#include "io/formats/npy.h"

#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

__attribute__((target_clones("avx512f", "avx2", "default"), optimize("O3")))
static void add_block(double *restrict acc, const double *restrict x, size_t n)
{
    for (size_t i = 0; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += x[i + k];
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc == 2 && !strcmp(argv[1], "--init-only")) {
        /* the floor of any MPI job here: start, one all-reduce, finalize */
        double x = 1, y = 0;
        MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        MPI_Finalize();
        return 0;
    }
    ch_npy_header_t h;
    if (argc != 2 || ch_npy_read_header(argv[1], &h) != CH_OK || h.desc.dtype != CH_DT_FLOAT64) {
        if (rank == 0) fprintf(stderr, "usage: bench_reduce_read FLOAT64.npy (%s)\n", ch_error_message());
        MPI_Finalize();
        return 2;
    }
    int64_t n = ch_array_desc_count(&h.desc), lo = n * rank / size, hi = n * (rank + 1) / size;
    size_t piece = (64u << 20) / 8;
    double *buf = malloc(piece * 8), acc[8] = {0};
    int fd = open(argv[1], O_RDONLY);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    for (int64_t e = lo; e < hi; e += (int64_t)piece) {
        size_t m = (size_t)(hi - e < (int64_t)piece ? hi - e : (int64_t)piece), got = 0;
        while (got < m * 8) {
            ssize_t k = pread(fd, (char *)buf + got, m * 8 - got, h.data_offset + e * 8 + (off_t)got);
            if (k <= 0) { perror("pread"); MPI_Abort(MPI_COMM_WORLD, 1); }
            got += (size_t)k;
        }
        add_block(acc, buf, m & ~(size_t)7);
        for (size_t i = m & ~(size_t)7; i < m; i++) acc[0] += buf[i];
    }
    double s = 0, total;
    for (int k = 0; k < 8; k++) s += acc[k];
    MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    double dt = now() - t0;
    MPI_Allreduce(&dt, &total, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0)
        printf("read-and-sum: %d ranks, %.3f s, %.2f GB/s (sum %.17g)\n", size, total,
               (double)n * 8 / total / 1e9, s);
    close(fd);
    free(buf);
    MPI_Finalize();
    return 0;
}
