/* cohort: in-process function tasks over the ranks and their threads — the
 * C counterpart of Python's multiprocessing.Pool.map / mpi4py.futures.
 *
 *     static ch_status square(int64_t i, void *result, void *ctx)
 *     { *(double *)result = (double)i * i; return CH_OK; }
 *     double *r = rank == 0 ? malloc(n * sizeof *r) : NULL;
 *     CH_TRY(ch_farm_map(MPI_COMM_WORLD, NULL, n, sizeof *r, square, NULL, r));
 *     // rank 0: r[i] = i*i for every i, in task order (like Pool.map)
 *
 * Every rank calls it with the same n, result_size and function (SPMD: the
 * task's argument is its index i; ctx is this rank's own pointer). Tasks are
 * cut into chunks of `chunk` consecutive indices; chunk c belongs to rank
 * c mod world_size (no messages while tasks run), and a rank's threads take
 * its chunks one by one from an atomic counter (dynamic balancing between
 * the threads of a rank). The results are gathered to rank 0 at the end
 * (MPI_Gatherv) and put in task order.
 *
 * Not provided: results as they complete, the journal/resume of shell tasks
 * (framework/farm/farm.h) for function tasks, balancing across ranks.
 */
#ifndef COHORT_FARM_MAP_H
#define COHORT_FARM_MAP_H

#include "framework/core/status.h"

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One task: write result_size bytes of task i's result to result. Called
 * from the rank's threads at once (must be thread-safe). A non-OK status
 * (with its message) fails the map. */
typedef ch_status (*ch_farm_map_fn)(int64_t i, void *result, void *ctx);

typedef struct {
    int threads;   /* threads per rank (>= 1); 0: the rank's CPUs (affinity mask) */
    int64_t chunk; /* tasks per chunk (>= 1); 0: n / (16 x all threads), at least 1 */
} ch_farm_map_options_t;

/* Run fn(i, result_i, ctx) for i in [0, n) over every rank of comm and its
 * threads (collective; o may be NULL for the defaults). Rank 0 gets the n
 * results in task order in results (n * result_size bytes; ignored on other
 * ranks, may be NULL there). Every rank returns the same status: on a
 * failure, the message of the failing task with the lowest index, naming it
 * and its rank. Errors: CH_ERR_INVALID (n < 0, result_size 0 or over 1 MiB,
 * no fn, results NULL on rank 0), CH_ERR_NOMEM, the task's own error. */
ch_status ch_farm_map(MPI_Comm comm, const ch_farm_map_options_t *o, int64_t n, size_t result_size,
                      ch_farm_map_fn fn, void *ctx, void *results);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_FARM_MAP_H */
