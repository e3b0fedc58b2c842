/* Helpers shared by the cohort-farm test programs (tests/test_farm_*.c). */
#ifndef COHORT_TESTS_FARM_TESTUTIL_H
#define COHORT_TESTS_FARM_TESTUTIL_H

#include "tests/harness.h"

#include <stdio.h>
#include <stdlib.h>

/* rm -rf path (a test directory under the build tree). */
static inline void farm_rm_rf(const char *path)
{
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fail_msg("%s failed", cmd);
}

/* The whole text of a file, or of a command's output with popen = 1, into
 * buf (NUL-terminated; fails the test when it cannot be read). */
static inline void farm_read_text(const char *path_or_cmd, int popen_it, char *buf, size_t n)
{
    FILE *f = popen_it ? popen(path_or_cmd, "r") : fopen(path_or_cmd, "r");
    if (!f) fail_msg("cannot read %s", path_or_cmd);
    size_t got = fread(buf, 1, n - 1, f);
    buf[got] = 0;
    if (popen_it) pclose(f);
    else fclose(f);
}

#endif
