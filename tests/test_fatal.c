/* A rank's fatal error must end the whole MPI job quickly, never hang.
 *
 * Plain (non-MPI) test: runs `$MPIEXEC -n 2 tests/fatal_helper MODE` in its
 * own process group with a hard timeout (TIMEOUT_S; past it the group is
 * killed and the test fails) and checks the exit status and stderr.
 * MPIEXEC comes from the Makefile (framework/dist/dist.am adds it to
 * AM_TESTS_ENVIRONMENT from configure's MPIEXEC); "mpiexec" otherwise. */
#include "config.h"

#include "tests/harness.h"

#include "framework/core/status.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TIMEOUT_S 30.0 /* hard limit: past it the job is killed, test fails */
#define QUICK_S 15.0   /* "within a few seconds" incl. mpiexec start-up on a busy VM */

typedef struct {
    int exited;      /* 1: exited normally, code in status */
    int code;        /* exit code, or signal number when !exited */
    int timed_out;
    double seconds;
    char err[16384]; /* stderr + stdout of the job */
} job_result;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run_job(const char *mode, double timeout_s, job_result *r)
{
    const char *mpiexec = getenv("MPIEXEC");
    if (!mpiexec || !*mpiexec) mpiexec = "mpiexec";
    char helper[4096], out_path[] = "/tmp/cohort-test-fatal-XXXXXX";
    snprintf(helper, sizeof helper, "%s/tests/fatal_helper", ch_test_builddir());
    memset(r, 0, sizeof *r);
    int fd = mkstemp(out_path);
    assert_true(fd >= 0);
    double t0 = now();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0); /* own process group: the timeout kills all of it */
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        execlp(mpiexec, mpiexec, "-n", "2", helper, mode, (char *)NULL);
        fprintf(stderr, "cannot run %s: %s\n", mpiexec, strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid);
    int status = 0;
    for (;;) {
        /* WNOWAIT: notice the exit but leave mpiexec a zombie, so that its
         * process group id cannot be reused before we kill the group */
        siginfo_t info;
        memset(&info, 0, sizeof info);
        if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
            info.si_pid == pid)
            break;
        if (now() - t0 > timeout_s) {
            r->timed_out = 1;
            break;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    r->seconds = now() - t0;
    /* end whatever is left of the job (all of it on a timeout), then reap */
    kill(-pid, SIGKILL);
    waitpid(pid, &status, 0);
    r->exited = WIFEXITED(status);
    r->code = r->exited ? WEXITSTATUS(status) : (WIFSIGNALED(status) ? WTERMSIG(status) : -1);
    lseek(fd, 0, SEEK_SET);
    ssize_t n = read(fd, r->err, sizeof r->err - 1);
    r->err[n > 0 ? n : 0] = 0;
    close(fd);
    unlink(out_path);
    fprintf(stderr, "--- %s: %s %d after %.2f s%s; output:\n%s---\n", mode,
            r->exited ? "exit" : "signal", r->code, r->seconds,
            r->timed_out ? " (TIMED OUT, killed)" : "", r->err);
}

static void expect_killed_quickly(const job_result *r)
{
    if (r->timed_out) fail_msg("the job hung: killed after %.0f s", TIMEOUT_S);
    if (r->exited && r->code == 0) fail_msg("the job exited 0 although a rank failed");
    if (r->seconds > QUICK_S) fail_msg("the job took %.1f s to end (limit %.0f s)", r->seconds, QUICK_S);
    if (strstr(r->err, "UNEXPECTED")) fail_msg("a rank got past a collective it cannot pass");
}

static void test_control_run_succeeds(void **state)
{
    job_result r;
    run_job("ok", TIMEOUT_S, &r);
    assert_false(r.timed_out);
    assert_true(r.exited);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.err, "ok: 4"));
}

static void test_fatal_ends_blocked_allreduce(void **state)
{
    job_result r;
    run_job("fatal", TIMEOUT_S, &r);
    expect_killed_quickly(&r);
    if (!strstr(r.err, "[rank 1] fatal: loading data: cannot read shard 7 of /data/train"))
        fail_msg("stderr lacks \"[rank 1] fatal: loading data: cannot read shard 7 ...\"");
}

static void test_fatal_ends_blocked_work_wait(void **state)
{
    job_result r;
    run_job("fatal-iwait", TIMEOUT_S, &r);
    expect_killed_quickly(&r);
    if (!strstr(r.err, "[rank 1] fatal: loading data: cannot read shard 7"))
        fail_msg("stderr lacks \"[rank 1] fatal: loading data: ...\"");
}

static void test_check_all_then_fatal(void **state)
{
    job_result r;
    run_job("check", TIMEOUT_S, &r);
    expect_killed_quickly(&r);
    /* the failing rank reports its own error; rank 0 learns about it */
    if (!strstr(r.err, "[rank 1] fatal: step 5: record 12 of shard 3 is truncated"))
        fail_msg("stderr lacks rank 1's own error");
    if (!strstr(r.err, "[rank 0] fatal: step 5: rank 1 failed: CH_ERR_FORMAT: record 12"))
        fail_msg("stderr lacks rank 0's report that rank 1 failed (CH_ERR_REMOTE)");
}

/* The watchdog itself: a job that really hangs (rank 1 sleeps, rank 0 waits
 * in an all-reduce, nobody aborts) must be detected and killed, leaving no
 * process behind. */
static void test_watchdog_catches_a_hang(void **state)
{
    job_result r;
    run_job("hang", 3.0, &r);
    assert_true(r.timed_out);
    assert_false(r.exited && r.code == 0);
    /* nothing of that job may survive the kill */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "pgrep -f 'fatal_helper[ ]hang' >/dev/null");
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    assert_int_not_equal(system(cmd), 0);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_control_run_succeeds),
        cmocka_unit_test(test_fatal_ends_blocked_allreduce),
        cmocka_unit_test(test_fatal_ends_blocked_work_wait),
        cmocka_unit_test(test_check_all_then_fatal),
        cmocka_unit_test(test_watchdog_catches_a_hang),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
