/* cohort: per-phase wall-clock profile of a job, summarised over ranks.
 *
 * A job times its phases (data wait, forward, backward, all-reduce wait,
 * optimizer, eval, checkpoint, ...) with ch_prof_begin / ch_prof_end around
 * each region; times accumulate per phase (seconds, CLOCK_MONOTONIC) with a
 * call count. At the end ch_prof_report all-reduces the totals and rank 0
 * prints one table with min / mean / max over ranks and the share of the
 * total wall time, in the spirit of PETSc's -log_view. No allocation after
 * ch_prof_create; begin/end cost two clock_gettime calls.
 */
#ifndef COHORT_PROFILER_H
#define COHORT_PROFILER_H

#include "framework/core/status.h"

#include <mpi.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CH_PROF_MAX_PHASES 32
#define CH_PROF_NAME_MAX 32

typedef struct ch_prof ch_prof_t;

/* Create a profiler with n phases named names[0..n-1] (n <= CH_PROF_MAX_PHASES,
 * names shorter than CH_PROF_NAME_MAX). The wall clock of the profile starts
 * now. CH_ERR_INVALID for bad n or names. */
ch_status ch_prof_create(const char *const *names, int n, ch_prof_t **out);
void ch_prof_destroy(ch_prof_t *p);

/* Start / stop timing phase `phase` (0 <= phase < n). Phases may nest or
 * interleave; each begin must be matched by one end of the same phase. */
void ch_prof_begin(ch_prof_t *p, int phase);
void ch_prof_end(ch_prof_t *p, int phase);

/* Add `seconds` to a phase directly (e.g. a duration measured elsewhere). */
void ch_prof_add(ch_prof_t *p, int phase, double seconds);

/* Accumulated seconds and call count of a phase on this rank. */
double ch_prof_seconds(const ch_prof_t *p, int phase);
long ch_prof_calls(const ch_prof_t *p, int phase);

/* Seconds since ch_prof_create on this rank. */
double ch_prof_wall(const ch_prof_t *p);

/* Collective over comm: gather per-phase min/mean/max seconds over ranks and
 * print the table on rank 0 to `out` (ignored on other ranks). Columns:
 * phase, calls (rank 0), min s, mean s, max s, % of wall (mean). A phase that
 * no rank entered (0 calls and 0 s on every rank) is left out; when no phase
 * was entered nothing is printed. MPI errors as CH_ERR_MPI. */
ch_status ch_prof_report(const ch_prof_t *p, MPI_Comm comm, FILE *out);

/* Monotonic time in seconds (CLOCK_MONOTONIC). */
double ch_time_now(void);

#ifdef __cplusplus
}
#endif
#endif
