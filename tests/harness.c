/* cohort test harness: see harness.h. */
#include "config.h"

#include "tests/harness.h"

#include "framework/core/log.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char skip_reason[512];
static int skipped;
static int h_rank, h_world = 1;

void ch_test_set_skip_reason(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(skip_reason, sizeof skip_reason, fmt, ap);
    va_end(ap);
    skipped = 1;
}

int ch_test_rank(void) { return h_rank; }
int ch_test_world_size(void) { return h_world; }

const char *ch_test_srcdir(void)
{
    const char *d = getenv("COHORT_SRCDIR");
    return d && *d ? d : ".";
}

const char *ch_test_builddir(void)
{
    const char *d = getenv("COHORT_BUILDDIR");
    return d && *d ? d : ".";
}

/* Run one cmocka test with stdout pointed at stderr; returns 1 if failed. */
static int run_one(const struct CMUnitTest *t)
{
    int saved;
    int failed;
    fflush(stdout);
    saved = dup(STDOUT_FILENO);
    dup2(STDERR_FILENO, STDOUT_FILENO);
    skipped = 0;
    skip_reason[0] = 0;
    failed = _cmocka_run_group_tests(t->name, t, 1, NULL, NULL) != 0;
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    return failed;
}

static int run_all(const struct CMUnitTest *tests, size_t n, int use_mpi)
{
    cmocka_set_message_output(CM_OUTPUT_STDOUT);
    if (h_rank == 0) {
        printf("1..%zu\n", n);
        fflush(stdout);
    }
    for (size_t i = 0; i < n; i++) {
        int v[2], r[2];
        v[0] = run_one(&tests[i]);
        v[1] = skipped;
        r[0] = v[0];
        r[1] = v[1];
        if (use_mpi) MPI_Allreduce(v, r, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (h_rank == 0) {
            if (r[0])
                printf("not ok %zu - %s%s\n", i + 1, tests[i].name,
                       h_world > 1 ? " (failed on at least one rank, see log)" : "");
            else if (r[1])
                printf("ok %zu - %s # SKIP %s\n", i + 1, tests[i].name,
                       skip_reason[0] ? skip_reason : "skipped on some rank");
            else
                printf("ok %zu - %s\n", i + 1, tests[i].name);
            fflush(stdout);
        }
    }
    return 0;
}

int ch_test_main(int argc, char **argv, const struct CMUnitTest *tests, size_t n)
{
    (void)argc;
    (void)argv;
    h_rank = 0;
    h_world = 1;
    return run_all(tests, n, 0);
}

int ch_test_main_mpi(int argc, char **argv, const struct CMUnitTest *tests, size_t n)
{
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited) MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &h_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &h_world);
    ch_log_set_rank(h_rank, h_world);
    int rc = run_all(tests, n, 1);
    MPI_Finalize();
    return rc;
}
