/* cohort: per-phase profile, see profiler.h. */
#include "config.h"

#include "framework/core/profiler.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

struct ch_prof {
    int n;
    char names[CH_PROF_MAX_PHASES][CH_PROF_NAME_MAX];
    double start[CH_PROF_MAX_PHASES];
    double total[CH_PROF_MAX_PHASES];
    long calls[CH_PROF_MAX_PHASES];
    double t0;
};

double ch_time_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

ch_status ch_prof_create(const char *const *names, int n, ch_prof_t **out)
{
    CH_REQUIRE(out && names, "ch_prof_create: NULL argument");
    CH_REQUIRE(n > 0 && n <= CH_PROF_MAX_PHASES, "ch_prof_create: %d phases, expected 1..%d",
               n, CH_PROF_MAX_PHASES);
    ch_prof_t *p = calloc(1, sizeof *p);
    if (!p) return CH_ERROR(CH_ERR_NOMEM, "ch_prof_create: out of memory");
    for (int i = 0; i < n; i++) {
        if (!names[i] || strlen(names[i]) >= CH_PROF_NAME_MAX) {
            free(p);
            return CH_ERROR(CH_ERR_INVALID, "ch_prof_create: phase %d name missing or longer "
                            "than %d characters", i, CH_PROF_NAME_MAX - 1);
        }
        strcpy(p->names[i], names[i]);
    }
    p->n = n;
    p->t0 = ch_time_now();
    *out = p;
    return CH_OK;
}

void ch_prof_destroy(ch_prof_t *p) { free(p); }

void ch_prof_begin(ch_prof_t *p, int phase)
{
    if (p && phase >= 0 && phase < p->n) p->start[phase] = ch_time_now();
}

void ch_prof_end(ch_prof_t *p, int phase)
{
    if (p && phase >= 0 && phase < p->n) {
        p->total[phase] += ch_time_now() - p->start[phase];
        p->calls[phase]++;
    }
}

void ch_prof_add(ch_prof_t *p, int phase, double seconds)
{
    if (p && phase >= 0 && phase < p->n) {
        p->total[phase] += seconds;
        p->calls[phase]++;
    }
}

double ch_prof_seconds(const ch_prof_t *p, int phase)
{
    return p && phase >= 0 && phase < p->n ? p->total[phase] : 0.0;
}

long ch_prof_calls(const ch_prof_t *p, int phase)
{
    return p && phase >= 0 && phase < p->n ? p->calls[phase] : 0;
}

double ch_prof_wall(const ch_prof_t *p) { return ch_time_now() - p->t0; }

static int unused_phase(long calls_max, double seconds_max)
{
    return calls_max == 0 && seconds_max == 0.0;
}

ch_status ch_prof_report(const ch_prof_t *p, MPI_Comm comm, FILE *out)
{
    CH_REQUIRE(p, "ch_prof_report: NULL profiler");
    double v[CH_PROF_MAX_PHASES + 1], mn[CH_PROF_MAX_PHASES + 1], mx[CH_PROF_MAX_PHASES + 1],
        sum[CH_PROF_MAX_PHASES + 1];
    int rank = 0, size = 1, n = p->n;
    CH_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    CH_CHECK_MPI(MPI_Comm_size(comm, &size));
    memcpy(v, p->total, (size_t)n * sizeof v[0]);
    v[n] = ch_prof_wall(p);
    CH_CHECK_MPI(MPI_Reduce(v, mn, n + 1, MPI_DOUBLE, MPI_MIN, 0, comm));
    CH_CHECK_MPI(MPI_Reduce(v, mx, n + 1, MPI_DOUBLE, MPI_MAX, 0, comm));
    CH_CHECK_MPI(MPI_Reduce(v, sum, n + 1, MPI_DOUBLE, MPI_SUM, 0, comm));
    long calls_max[CH_PROF_MAX_PHASES];
    CH_CHECK_MPI(MPI_Reduce(p->calls, calls_max, n, MPI_LONG, MPI_MAX, 0, comm));
    if (rank != 0 || !out) return CH_OK;
    /* a phase no rank entered (no call, no time: e.g. "gpu wait" on a CPU
     * run) is left out; when none was entered (a job that failed in its
     * setup) there is no table at all */
    int used = 0;
    for (int i = 0; i < n; i++) used += unused_phase(calls_max[i], mx[i]) ? 0 : 1;
    if (used == 0) return CH_OK;
    double wall = sum[n] / size;
    fprintf(out, "profile over %d rank%s (seconds; min / mean / max over ranks)\n", size,
            size == 1 ? "" : "s");
    fprintf(out, "  %-18s %9s %10s %10s %10s %7s\n", "phase", "calls", "min", "mean", "max",
            "%wall");
    for (int i = 0; i < n; i++)
        if (!unused_phase(calls_max[i], mx[i]))
            fprintf(out, "  %-18s %9ld %10.3f %10.3f %10.3f %6.1f%%\n", p->names[i], p->calls[i],
                mn[i], sum[i] / size, mx[i], wall > 0 ? 100.0 * sum[i] / size / wall : 0.0);
    fprintf(out, "  %-18s %9s %10.3f %10.3f %10.3f %6.1f%%\n", "total (wall)", "", mn[n], wall,
            mx[n], 100.0);
    fflush(out);
    return CH_OK;
}
