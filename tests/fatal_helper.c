/* Helper for tests/test_fatal: run under mpiexec -n 2 (or more).
 *
 *   fatal_helper fatal        rank 1 calls ch_fatal while the other ranks sit
 *                             in a blocking ch_pg_allreduce that rank 1 never
 *                             joins; the whole job must end (MPI_Abort).
 *   fatal_helper fatal-iwait  same, the other ranks block in ch_work_wait.
 *   fatal_helper check        rank 1 fails locally; every rank calls
 *                             ch_pg_check_all and ends with ch_fatal on error
 *                             (the pattern jobs use between steps).
 *   fatal_helper ok           everyone succeeds: a collective, check_all, exit 0.
 *   fatal_helper hang         a real hang (rank 1 sleeps, nobody aborts): only
 *                             for checking test_fatal's own watchdog.
 *
 * Ranks that get past a collective they should never pass print
 * "UNEXPECTED" on stderr. */
#include "config.h"

#include "framework/dist/dist.h"
#include "framework/core/log.h"
#include "framework/core/status.h"

#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    int rank = 0, size = 1;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ch_log_set_rank(rank, size);
    ch_pg_t *pg = NULL;
    ch_check_fatal(ch_pg_create_mpi(MPI_COMM_WORLD, &pg), "creating the process group");
    float x[256];
    for (int i = 0; i < 256; i++) x[i] = 1.0f;
    /* one good collective first, so every rank is up and connected */
    ch_check_fatal(ch_pg_allreduce(pg, x, x, 256, CH_DIST_FLOAT32, CH_REDUCE_SUM),
                   "warm-up all-reduce");

    if (!strcmp(mode, "fatal") || !strcmp(mode, "fatal-iwait")) {
        if (rank == 1) {
            struct timespec ts = {0, 200 * 1000 * 1000}; /* let rank 0 block first */
            nanosleep(&ts, NULL);
            (void)CH_ERROR(CH_ERR_IO, "cannot read shard 7 of /data/train");
            ch_fatal("loading data", 3);
        }
        if (!strcmp(mode, "fatal")) {
            ch_status s = ch_pg_allreduce(pg, x, x, 256, CH_DIST_FLOAT32, CH_REDUCE_SUM);
            fprintf(stderr, "[rank %d] UNEXPECTED: passed the all-reduce (%s)\n", rank,
                    ch_status_name(s));
        } else {
            ch_work_t *w = NULL;
            ch_status s = ch_pg_iallreduce(pg, x, x, 256, CH_DIST_FLOAT32, CH_REDUCE_SUM, &w);
            if (s == CH_OK) s = ch_work_wait(&w);
            fprintf(stderr, "[rank %d] UNEXPECTED: passed ch_work_wait (%s)\n", rank,
                    ch_status_name(s));
        }
    } else if (!strcmp(mode, "check") || !strcmp(mode, "ok")) {
        ch_status s = CH_OK;
        if (rank == 1 && !strcmp(mode, "check"))
            s = CH_ERROR(CH_ERR_FORMAT, "record 12 of shard 3 is truncated");
        ch_check_fatal(ch_pg_check_all(pg, s, NULL), "step 5");
        ch_check_fatal(ch_pg_allreduce(pg, x, x, 256, CH_DIST_FLOAT32, CH_REDUCE_SUM),
                       "all-reduce after the check");
        if (!strcmp(mode, "check"))
            fprintf(stderr, "[rank %d] UNEXPECTED: passed the check\n", rank);
        else if (rank == 0)
            printf("ok: %g\n", (double)x[0]);
    } else if (!strcmp(mode, "hang")) {
        if (rank == 1) {
            struct timespec ts = {120, 0};
            nanosleep(&ts, NULL);
        }
        (void)ch_pg_allreduce(pg, x, x, 256, CH_DIST_FLOAT32, CH_REDUCE_SUM);
    } else {
        fprintf(stderr, "usage: fatal_helper fatal|fatal-iwait|check|ok|hang\n");
        ch_pg_destroy(pg);
        MPI_Finalize();
        return 2;
    }
    ch_pg_destroy(pg);
    MPI_Finalize();
    return 0;
}
