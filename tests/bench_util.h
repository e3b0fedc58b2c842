/* cohort benchmarks: a monotonic clock and a comparator for medians. */
#ifndef COHORT_TESTS_BENCH_UTIL_H
#define COHORT_TESTS_BENCH_UTIL_H
#include <time.h>

/* Seconds on CLOCK_MONOTONIC. */
static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* qsort comparator of doubles (ascending). */
static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
#endif
