/* cohort test harness: cmocka tests printed as TAP, optionally under MPI.
 *
 * Each test is a cmocka unit test. The harness runs them one at a time with
 * cmocka's own chatter sent to stderr, and prints one TAP line per test on
 * stdout. Under MPI (ch_test_main_mpi) every rank runs every test; the
 * per-rank verdicts are all-reduced so a failure on any rank fails the test,
 * and only rank 0 prints TAP. A test that cannot run here calls
 * ch_test_skip("reason") and is reported as "ok N - name # SKIP reason".
 *
 * Include after <cmocka.h>'s prerequisites:
 *     #include <stdarg.h> <stddef.h> <stdint.h> <setjmp.h> then <cmocka.h>.
 */
#ifndef COHORT_TEST_HARNESS_H
#define COHORT_TEST_HARNESS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* Run tests in one process (no MPI). Returns the process exit code. */
int ch_test_main(int argc, char **argv, const struct CMUnitTest *tests, size_t n);

/* Initialise MPI (MPI_THREAD_MULTIPLE requested) if needed, run tests on every
 * rank with all-reduced verdicts, finalize MPI. Returns the exit code. */
int ch_test_main_mpi(int argc, char **argv, const struct CMUnitTest *tests, size_t n);

/* Mark the running test skipped with a reason shown in the TAP line. */
#define ch_test_skip(...)                                                    \
    do {                                                                     \
        ch_test_set_skip_reason(__VA_ARGS__);                                \
        skip();                                                              \
    } while (0)
void ch_test_set_skip_reason(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/* Rank and world size under ch_test_main_mpi (0 and 1 otherwise). */
int ch_test_rank(void);
int ch_test_world_size(void);

/* Directory of the source tree (COHORT_SRCDIR, else ".") and build tree
 * (COHORT_BUILDDIR, else "."), for finding data and helper programs. */
const char *ch_test_srcdir(void);
const char *ch_test_builddir(void);

/* assert that a ch_status is CH_OK, printing the error message if not. */
#define assert_ch_ok(expr)                                                   \
    do {                                                                     \
        ch_status ch_t_s_ = (expr);                                          \
        if (ch_t_s_ != CH_OK)                                                \
            fail_msg("%s -> %s: %s", #expr, ch_status_name(ch_t_s_),         \
                     ch_error_message());                                    \
    } while (0)

/* assert that expr fails with code and that the message contains needle. */
#define assert_ch_error(expr, code, needle)                                  \
    do {                                                                     \
        ch_error_clear();                                                    \
        ch_status ch_t_s_ = (expr);                                          \
        if (ch_t_s_ != (code))                                               \
            fail_msg("%s -> %s, expected %s (message: %s)", #expr,           \
                     ch_status_name(ch_t_s_), ch_status_name(code),          \
                     ch_error_message());                                    \
        if ((needle) && !strstr(ch_error_message(), (needle)))               \
            fail_msg("%s: message '%s' does not mention '%s'", #expr,        \
                     ch_error_message(), (needle));                          \
    } while (0)

#endif
