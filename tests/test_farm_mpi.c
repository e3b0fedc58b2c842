/* Tests of the task farm over MPI ranks (framework/farm/farm.h): every task
 * runs exactly once, retries, timeouts, barriers, halts, resume, outputs.
 * Runs at 1, 2 and 4 ranks (tests.am: -np2.mpi / -np4.mpi). */
#define _GNU_SOURCE /* dladdr */
#include "tests/farm_testutil.h"

#include "framework/farm/farm.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <mpi.h>
#include <netinet/in.h>
#include <sched.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[512];

/* A fresh run directory, the same on every rank. */
static int setup(void **state)
{
    (void)state;
    if (ch_test_rank() == 0) {
        snprintf(dir, sizeof dir, "%s/tests/tmp-farm-mpi-%d", ch_test_builddir(), (int)getpid());
        farm_rm_rf(dir);
        mkdir(dir, 0777);
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    MPI_Barrier(MPI_COMM_WORLD);
    if (ch_test_rank() == 0 && !getenv("KEEP")) farm_rm_rf(dir);
    return 0;
}

static ch_taskfile_t *tasks_from(const char *text)
{
    ch_taskfile_t *tf = NULL;
    assert_ch_ok(ch_taskfile_parse("test-tasks", text, strlen(text), &tf));
    return tf;
}

/* n lines "echo $COHORT_TASK_ID >> DIR/ids" (plus `extra` before each). */
static char *id_tasks(int n, const char *extra)
{
    size_t cap = (size_t)n * (strlen(dir) + strlen(extra) + 64) + 1;
    char *t = malloc(cap), *p = t;
    for (int i = 0; i < n; i++)
        p += sprintf(p, "%secho $COHORT_TASK_ID >> %s/ids\n", extra, dir);
    return t;
}

/* Count of each id in DIR/ids (rank 0). */
static void count_ids(int n, int *counts)
{
    memset(counts, 0, sizeof(int) * (size_t)n);
    char path[600];
    snprintf(path, sizeof path, "%s/ids", dir);
    FILE *f = fopen(path, "r");
    if (!f) return;
    int id;
    while (fscanf(f, "%d", &id) == 1)
        if (id >= 0 && id < n) counts[id]++;
    fclose(f);
}

static ch_status run_farm(const ch_farm_options_t *o, ch_farm_summary_t *sum)
{
    ch_farm_t *f = NULL;
    ch_status s = ch_farm_create(o, MPI_COMM_WORLD, &f);
    if (!s) s = ch_farm_run(f, sum);
    if (!s) s = ch_farm_write_status(f);
    ch_farm_destroy(f);
    return s;
}

static void options(ch_farm_options_t *o, const ch_taskfile_t *tf)
{
    ch_farm_options_default(o);
    o->tasks = tf;
    o->dir = dir;
    o->slots_per_rank = 2;
    o->kill_after = 0.5;
}

static void test_every_task_once(void **state)
{
    (void)state;
    const int n = 200;
    char *text = id_tasks(n, "");
    ch_taskfile_t *tf = tasks_from(text);
    free(text);
    ch_farm_options_t o;
    options(&o, tf);
    ch_farm_summary_t sum;
    assert_ch_ok(run_farm(&o, &sum));
    assert_int_equal(sum.done, n);
    assert_int_equal(sum.failed, 0);
    assert_int_equal(sum.attempts, n);
    assert_int_equal(sum.stop, CH_FARM_FINISHED);
    assert_int_equal(sum.exit_codes[0], n);
    if (ch_test_rank() == 0) {
        int counts[200];
        count_ids(n, counts);
        for (int i = 0; i < n; i++)
            if (counts[i] != 1) fail_msg("task %d ran %d times", i, counts[i]);
        /* the status table: a header and one line per attempt */
        char path[600], line[4096];
        snprintf(path, sizeof path, "%s/status.tsv", dir);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        int lines = 0;
        while (fgets(line, sizeof line, f)) lines++;
        fclose(f);
        assert_int_equal(lines, n + 1);
    }
    /* again without resume: refused; with resume: nothing to do */
    ch_farm_t *f = NULL;
    assert_ch_error(ch_farm_create(&o, MPI_COMM_WORLD, &f), CH_ERR_CONFIG, "pass --resume");
    ch_farm_destroy(f);
    o.resume = 1;
    assert_ch_ok(run_farm(&o, &sum));
    assert_int_equal(sum.skipped, n);
    assert_int_equal(sum.done, n);
    assert_int_equal(sum.attempts, 0);
    ch_taskfile_destroy(tf);
}

static void test_env_output_and_cwd(void **state)
{
    (void)state;
    char text[2048];
    snprintf(text, sizeof text,
             "#COHORT ENV GREETING=hello\n"
             "echo $GREETING $COHORT_TASK_ID $COHORT_TASK_ATTEMPT $COHORT_TASK_LINE; echo oops >&2\n"
             "#COHORT CWD %s\n"
             "#COHORT REPEAT 2 start 7 step 3 pwd; echo r$COHORT_REPEAT_INDEX; "
             "test -z \"$PMI_RANK$PMI_FD\" && echo no-pmi\n", dir);
    ch_taskfile_t *tf = tasks_from(text);
    ch_farm_options_t o;
    options(&o, tf);
    ch_farm_summary_t sum;
    assert_ch_ok(run_farm(&o, &sum));
    assert_int_equal(sum.done, 3);
    if (ch_test_rank() == 0) {
        char path[700], buf[1024];
        snprintf(path, sizeof path, "%s/out/000/0.out", dir);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        assert_non_null(fgets(buf, sizeof buf, f));
        fclose(f);
        assert_string_equal(buf, "hello 0 1 2\n");
        snprintf(path, sizeof path, "%s/out/000/0.err", dir);
        f = fopen(path, "r");
        assert_non_null(f);
        assert_non_null(fgets(buf, sizeof buf, f));
        fclose(f);
        assert_string_equal(buf, "oops\n");
        snprintf(path, sizeof path, "%s/out/000/2.out", dir);
        farm_read_text(path, 0, buf, sizeof buf);
        char want[1024], *abs = realpath(dir, NULL);
        assert_non_null(abs);
        snprintf(want, sizeof want, "%s\nr10\nno-pmi\n", abs);
        free(abs);
        assert_string_equal(buf, want);
    }
    ch_taskfile_destroy(tf);
}

static void test_merged_output(void **state)
{
    (void)state;
    ch_taskfile_t *tf = tasks_from("printf 'a\\nb\\n'\nprintf 'no newline'; echo e >&2\n");
    ch_farm_options_t o;
    options(&o, tf);
    o.output = CH_FARM_OUTPUT_MERGED;
    ch_farm_summary_t sum;
    assert_ch_ok(run_farm(&o, &sum));
    assert_int_equal(sum.done, 2);
    if (ch_test_rank() == 0) {
        /* gather every rank's merged file */
        char cmd[1400], buf[4096];
        snprintf(cmd, sizeof cmd, "cat %s/out/rank-*.log | sort", dir);
        farm_read_text(cmd, 1, buf, sizeof buf);
        assert_string_equal(buf, "0.1 out| a\n0.1 out| b\n1.1 err| e\n1.1 out| no newline\n");
    }
    ch_taskfile_destroy(tf);
}

static void test_retries_and_failures(void **state)
{
    (void)state;
    /* task 0 fails on its first attempt only, task 1 always (exit 3), task 2 works */
    ch_taskfile_t *tf = tasks_from("test $COHORT_TASK_ATTEMPT -ge 2\nexit 3\ntrue\n");
    ch_farm_options_t o;
    options(&o, tf);
    o.retries = 2;
    o.retry_backoff = 0.01;
    ch_farm_summary_t sum;
    assert_ch_ok(run_farm(&o, &sum));
    assert_int_equal(sum.done, 2);
    assert_int_equal(sum.failed, 1);
    assert_int_equal(sum.attempts, 2 + 3 + 1);
    assert_int_equal(sum.retried, 1 + 2);
    assert_int_equal(sum.exit_codes[3], 3);
    assert_int_equal(sum.exit_codes[1], 1);
    /* resume: the failed task is not run again, unless resume_failed */
    o.resume = 1;
    assert_ch_ok(run_farm(&o, &sum));
    assert_int_equal(sum.attempts, 0);
    assert_int_equal(sum.failed, 1);
    o.resume_failed = 1;
    o.retries = 0;
    assert_ch_ok(run_farm(&o, &sum));
    assert_int_equal(sum.attempts, 1);
    assert_int_equal(sum.failed, 1);
    ch_taskfile_destroy(tf);
}

static void test_timeout(void **state)
{
    (void)state;
    /* the shell traps TERM: the KILL after kill_after ends it */
    ch_taskfile_t *tf = tasks_from("sleep 30\ntrap '' TERM; sleep 30\ntrue\n");
    ch_farm_options_t o;
    options(&o, tf);
    o.timeout = 0.3;
    o.kill_after = 0.3;
    double t0 = MPI_Wtime();
    ch_farm_summary_t sum;
    assert_ch_ok(run_farm(&o, &sum));
    double el = MPI_Wtime() - t0;
    assert_int_equal(sum.timed_out, 2);
    assert_int_equal(sum.failed, 2);
    assert_int_equal(sum.done, 1);
    if (el > 10) fail_msg("timeouts took %.1f s", el);
    ch_taskfile_destroy(tf);
}

static void test_barrier(void **state)
{
    (void)state;
    char text[4096];
    snprintf(text, sizeof text,
             "sleep 0.2; echo a >> %s/order\nsleep 0.1; echo a >> %s/order\necho a >> %s/order\n"
             "#COHORT BARRIER\necho b >> %s/order\necho b >> %s/order\n", dir, dir, dir, dir, dir);
    ch_taskfile_t *tf = tasks_from(text);
    ch_farm_options_t o;
    options(&o, tf);
    ch_farm_summary_t sum;
    assert_ch_ok(run_farm(&o, &sum));
    assert_int_equal(sum.done, 5);
    if (ch_test_rank() == 0) {
        char path[700], buf[64];
        snprintf(path, sizeof path, "%s/order", dir);
        farm_read_text(path, 0, buf, sizeof buf);
        assert_string_equal(buf, "a\na\na\nb\nb\n");
    }
    ch_taskfile_destroy(tf);
}

static void test_halt(void **state)
{
    (void)state;
    char text[60 * 20 + 1] = "";
    for (int i = 0; i < 60; i++) strcat(text, "sleep 0.05; false\n");
    ch_taskfile_t *tf = tasks_from(text);
    ch_farm_options_t o;
    options(&o, tf);
    o.halt_after = 3;
    ch_farm_summary_t sum;
    assert_ch_ok(run_farm(&o, &sum));
    if (sum.stop != CH_FARM_HALTED)
        fail_msg("stop %d, failed %" PRId64 ", not run %" PRId64, sum.stop, sum.failed, sum.not_run);
    assert_true(sum.failed >= 3);
    assert_true(sum.not_run > 0);
    assert_int_equal(sum.failed + sum.not_run, 60);
    ch_taskfile_destroy(tf);
}

/* #23: a halt hands back what the slots hold queued (farm.prefetch): no task
 * starts after the halt decision. Task 0 fails at once; the others sleep.
 * Every slot of every rank gets one running and one queued task; the one
 * queued behind task 0 starts before rank 0 hears of the failure; every
 * other queued task comes back unstarted (before: they ran after the halt). */
static void test_halt_drops_queued(void **state)
{
    (void)state;
    int w = ch_test_world_size(), n = 4 * w + 4;
    char text[40 * 24] = "false\n";
    for (int i = 1; i < n; i++) strcat(text, "sleep 1\n");
    ch_taskfile_t *tf = tasks_from(text);
    ch_farm_options_t o;
    options(&o, tf);
    o.halt_after = 1;
    ch_farm_summary_t sum;
    assert_ch_ok(run_farm(&o, &sum));
    assert_int_equal(sum.stop, CH_FARM_HALTED);
    if (sum.attempts != 2 * w + 1)
        fail_msg("%" PRId64 " attempts after a halt at the first failure, wanted %d (the %d running "
                 "and the one queued behind the failed task)", sum.attempts, 2 * w + 1, 2 * w);
    assert_int_equal(sum.failed, 1);
    assert_int_equal(sum.done, 2 * w);
    assert_int_equal(sum.not_run, n - 2 * w - 1);
    ch_taskfile_destroy(tf);
}

/* #23: the progress text leaves the ETA to the progress line
 * (ch_job_progress prints its own: it was there twice). */
typedef struct {
    int calls, midway, eta;
} progress_rec_t;

static void record_progress(void *arg, int64_t ended, int64_t total, const char *text)
{
    progress_rec_t *r = arg;
    r->calls++;
    r->midway += ended > 0 && ended < total;
    r->eta += strstr(text, "ETA") != NULL;
}

static void test_progress_text(void **state)
{
    (void)state;
    char text[24 * 12 + 1] = "";
    for (int i = 0; i < 24; i++) strcat(text, "sleep 0.15\n");
    ch_taskfile_t *tf = tasks_from(text);
    ch_farm_options_t o;
    options(&o, tf);
    o.slots_per_rank = 1;
    progress_rec_t r = {0, 0, 0};
    o.progress = record_progress;
    o.cb_arg = &r;
    ch_farm_summary_t sum;
    assert_ch_ok(run_farm(&o, &sum));
    assert_int_equal(sum.done, 24);
    if (ch_test_rank() == 0) {
        assert_true(r.calls >= 2);
        if (ch_test_world_size() == 1) assert_true(r.midway >= 1); /* 3.6 s: redraws midway */
        assert_int_equal(r.eta, 0);
    }
    ch_taskfile_destroy(tf);
}

/* #23: the summary's exit codes count a timeout as a timeout (not a signal)
 * and a task that could not start as spawn-failed. */
static void test_summary_ends(void **state)
{
    (void)state;
    ch_taskfile_t *tf = tasks_from("sleep 30\nkill -9 $$\n#COHORT CWD /nonexistent-cohort-dir\ntrue\n");
    ch_farm_options_t o;
    options(&o, tf);
    o.timeout = 0.5;
    ch_farm_summary_t sum;
    assert_ch_ok(run_farm(&o, &sum));
    assert_int_equal(sum.timed_out, 1);
    assert_int_equal(sum.exit_codes[256], 1); /* kill -9 only */
    assert_int_equal(sum.spawn_failed, 1);
    assert_int_equal(sum.failed, 3);
    ch_taskfile_destroy(tf);
}

/* #23: prefetch leaves no slot idle while a task waits behind a running
 * one. Two long tasks (sleep 1.5) and short ones on 2 slots in all (2 ranks
 * x 1 slot, or 1 rank x 2): the second long task is queued behind the
 * first; once the short ones are done the idle slot must get it (before:
 * both long ones ran back to back on one slot, 3+ s instead of 1.5). */
static void test_prefetch_balance(void **state)
{
    (void)state;
    int w = ch_test_world_size();
    ch_taskfile_t *tf = tasks_from("sleep 1.5\nsleep 0.05\nsleep 1.5\nsleep 0.05\nsleep 0.05\n"
                                   "sleep 0.05\n");
    ch_farm_options_t o;
    options(&o, tf);
    o.slots_per_rank = w == 1 ? 2 : 1;
    assert_int_equal(o.prefetch, 1); /* the default */
    double t0 = MPI_Wtime();
    ch_farm_summary_t sum;
    assert_ch_ok(run_farm(&o, &sum));
    double el = MPI_Wtime() - t0;
    assert_int_equal(sum.done, 6);
    if (ch_test_rank() == 0) {
        /* where the long tasks ran: status.tsv columns id, attempt, rank, slot */
        char path[700], buf[4096];
        snprintf(path, sizeof path, "%s/status.tsv", dir);
        farm_read_text(path, 0, buf, sizeof buf);
        int where[6] = {-1, -1, -1, -1, -1, -1};
        for (char *line = strchr(buf, '\n'); line && line[1]; line = strchr(line + 1, '\n')) {
            int id, att, rank, slot;
            if (sscanf(line + 1, "%d\t%d\t%d\t%d", &id, &att, &rank, &slot) == 4 && id >= 0 && id < 6)
                where[id] = rank * 16 + slot;
        }
        if (where[0] < 0 || where[0] == where[2])
            fail_msg("both long tasks ran on rank %d slot %d, one after the other (%.2f s)",
                     where[0] / 16, where[0] % 16, el);
        if (el > 2.9) fail_msg("the sweep took %.2f s (the long tasks side by side: ~1.6 s)", el);
    }
    ch_taskfile_destroy(tf);
}

/* ---- strangers at rank 0's door (#23 item 9) */

/* Armed on one rank: the farm's connect to rank 0 (this test interposes
 * connect(2); only a call from the farm's code counts) is preceded by
 * three strangers' connections to the same address and port: one sends
 * garbage, one nothing, one a hello with rank 1 and a wrong secret; and by
 * a probe of the same port on the host's first address that is not
 * loopback (rank 0 should listen on loopback only: every rank is on its host). */
static int stranger_armed;
static int stranger_fd[3] = {-1, -1, -1};
static int outside_probe = -1; /* -1 not tried, 0 refused, 1 connected */
static char farm_addr[INET6_ADDRSTRLEN];

static int raw_connect(int fd, const struct sockaddr *a, socklen_t l)
{
    return (int)syscall(SYS_connect, fd, a, l);
}

static int stranger(const struct sockaddr *a, socklen_t l, const void *msg, size_t n)
{
    int fd = socket(a->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (raw_connect(fd, a, l) != 0) {
        close(fd);
        return -1;
    }
    if (n) (void)send(fd, msg, n, MSG_NOSIGNAL);
    return fd;
}

static void probe_outside(const struct sockaddr *a)
{
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) return;
    int port = ntohs(a->sa_family == AF_INET ? ((const struct sockaddr_in *)(const void *)a)->sin_port
                                             : ((const struct sockaddr_in6 *)(const void *)a)->sin6_port);
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        struct sockaddr_in o = *(struct sockaddr_in *)(void *)i->ifa_addr;
        if ((ntohl(o.sin_addr.s_addr) >> 24) == 127) continue;
        o.sin_port = htons((uint16_t)port);
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) break;
        outside_probe = raw_connect(fd, (struct sockaddr *)&o, sizeof o) == 0;
        close(fd);
        break;
    }
    freeifaddrs(ifs);
}

int connect(int fd, const struct sockaddr *a, socklen_t l);
int connect(int fd, const struct sockaddr *a, socklen_t l)
{
    Dl_info info;
    if (stranger_armed && (a->sa_family == AF_INET || a->sa_family == AF_INET6) &&
        dladdr(__builtin_return_address(0), &info) && info.dli_sname &&
        strncmp(info.dli_sname, "ch_farm", 7) == 0) {
        stranger_armed = 0;
        if (a->sa_family == AF_INET)
            inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)a)->sin_addr, farm_addr,
                      sizeof farm_addr);
        else
            inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)a)->sin6_addr, farm_addr,
                      sizeof farm_addr);
        static const char junk[] = "GET / HTTP/1.0\r\nHost: farm\r\n\r\n0123456789abcdef0123456789";
        stranger_fd[0] = stranger(a, l, junk, sizeof junk - 1);
        stranger_fd[1] = stranger(a, l, NULL, 0);
        int32_t hello[10] = {0x4d524643, 1}; /* the right form, a wrong (zero) secret */
        stranger_fd[2] = stranger(a, l, hello, sizeof hello);
        probe_outside(a);
    }
    return raw_connect(fd, a, l);
}

/* 1 when rank 0 closed the stranger's connection (within 15 s). */
static int closed_by_peer(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 15000) != 1) return 0;
    char b[64];
    ssize_t r = recv(fd, b, sizeof b, 0);
    return r == 0 || (r < 0 && errno == ECONNRESET);
}

static void test_strangers_refused(void **state)
{
    (void)state;
    int n = 40;
    char *text = id_tasks(n, "");
    ch_taskfile_t *tf = tasks_from(text);
    free(text);
    ch_farm_options_t o;
    options(&o, tf);
    stranger_armed = ch_test_rank() == 1;
    ch_farm_summary_t sum;
    assert_ch_ok(run_farm(&o, &sum));
    assert_int_equal(sum.done, n);
    if (ch_test_rank() == 0) {
        int counts[40];
        count_ids(n, counts);
        for (int i = 0; i < n; i++)
            if (counts[i] != 1) fail_msg("task %d ran %d times", i, counts[i]);
    }
    if (ch_test_rank() == 1) {
        assert_int_equal(stranger_armed, 0); /* the farm did connect through connect(2) */
        assert_string_equal(farm_addr, "127.0.0.1");
        for (int i = 0; i < 3; i++) {
            if (stranger_fd[i] < 0) fail_msg("stranger %d could not connect", i);
            if (!closed_by_peer(stranger_fd[i])) fail_msg("stranger %d was not shown the door", i);
            close(stranger_fd[i]);
            stranger_fd[i] = -1;
        }
        if (outside_probe == 1) fail_msg("rank 0 took a connection on a non-loopback address");
    }
    ch_taskfile_destroy(tf);
}

static void test_timeout_median(void **state)
{
    (void)state;
    /* 10 tasks of ~0.05 s, then (after a barrier, so the median exists) one
     * that would take 30 s: killed after 5 x the median */
    char text[1024] = "";
    for (int i = 0; i < 10; i++) strcat(text, "sleep 0.05\n");
    strcat(text, "#COHORT BARRIER\nsleep 30\n");
    ch_taskfile_t *tf = tasks_from(text);
    ch_farm_options_t o;
    options(&o, tf);
    o.timeout_median = 5;
    double t0 = MPI_Wtime();
    ch_farm_summary_t sum;
    assert_ch_ok(run_farm(&o, &sum));
    double el = MPI_Wtime() - t0;
    assert_int_equal(sum.done, 10);
    assert_int_equal(sum.timed_out, 1);
    assert_int_equal(sum.failed, 1);
    if (el > 10) fail_msg("the median timeout took %.1f s", el);
    ch_taskfile_destroy(tf);
}

/* Files mode: does out/000/<id>.<ext> exist? */
static int output_exists(int id, const char *ext)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/out/000/%d.%s", dir, id, ext);
    return access(path, F_OK) == 0;
}

static void test_output_files_only_when_written(void **state)
{
    (void)state;
    /* task 0 is silent; task 1 writes on attempt 1 and fails, is silent on attempt 2 */
    ch_taskfile_t *tf = tasks_from("true\n"
                                   "if [ $COHORT_TASK_ATTEMPT = 1 ]; then echo first; exit 1; fi\n");
    ch_farm_options_t o;
    options(&o, tf);
    o.retries = 1;
    o.retry_backoff = 0;
    ch_farm_summary_t sum;
    assert_ch_ok(run_farm(&o, &sum));
    assert_int_equal(sum.done, 2);
    if (ch_test_rank() == 0) {
        assert_false(output_exists(0, "out"));
        assert_false(output_exists(0, "err"));
        /* the first attempt's output does not pass for the second's */
        assert_false(output_exists(1, "out"));
    }
    ch_taskfile_destroy(tf);
}

static void test_without_pidfd(void **state)
{
    (void)state;
    /* the SIGCHLD self-pipe path of kernels without pidfd_open */
    setenv("COHORT_FARM_NO_PIDFD", "1", 1);
    char *text = id_tasks(50, "");
    size_t len = strlen(text);
    text = realloc(text, len + 32);
    strcpy(text + len, "sleep 30\n");
    ch_taskfile_t *tf = tasks_from(text);
    free(text);
    ch_farm_options_t o;
    options(&o, tf);
    o.timeout = 1;
    o.kill_after = 0.2;
    double t0 = MPI_Wtime();
    ch_farm_summary_t sum;
    ch_status s = run_farm(&o, &sum);
    unsetenv("COHORT_FARM_NO_PIDFD");
    assert_ch_ok(s);
    assert_int_equal(sum.done, 50);
    assert_int_equal(sum.timed_out, 1);
    if (MPI_Wtime() - t0 > 15) fail_msg("took %.1f s", MPI_Wtime() - t0);
    if (ch_test_rank() == 0) {
        int counts[50];
        count_ids(50, counts);
        for (int i = 0; i < 50; i++)
            if (counts[i] != 1) fail_msg("task %d ran %d times", i, counts[i]);
    }
    ch_taskfile_destroy(tf);
}

static void test_cpu_binding(void **state)
{
    (void)state;
    /* one rank with 2 slots and >= 2 CPUs it may run on: each slot has its
     * own CPU (the affinity mask, not the machine: under `taskset -c 0` the
     * farm has one CPU to give, and both slots share it) */
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    int ncpu = sched_getaffinity(0, sizeof allowed, &allowed) == 0 ? CPU_COUNT(&allowed) : 0;
    if (ch_test_world_size() != 1 || ncpu < 2)
        ch_test_skip("needs 1 rank and 2 allowed CPUs (this run: %d ranks, %d CPUs)",
                     ch_test_world_size(), ncpu);
    ch_taskfile_t *tf = tasks_from("sleep 0.3; grep Cpus_allowed_list /proc/self/status\n"
                                   "sleep 0.3; grep Cpus_allowed_list /proc/self/status\n");
    ch_farm_options_t o;
    options(&o, tf);
    ch_farm_summary_t sum;
    assert_ch_ok(run_farm(&o, &sum));
    assert_int_equal(sum.done, 2);
    char lists[2][128];
    for (int i = 0; i < 2; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/out/000/%d.out", dir, i);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        assert_non_null(fgets(lists[i], sizeof lists[i], f));
        fclose(f);
        /* one CPU: "Cpus_allowed_list:\tN" without ',' or '-' */
        if (strchr(lists[i], ',') || strchr(lists[i], '-')) fail_msg("task %d: %s", i, lists[i]);
    }
    if (!strcmp(lists[0], lists[1])) fail_msg("both slots on %s", lists[0]);
    ch_taskfile_destroy(tf);
}

static int stop_now(void *arg)
{
    (*(int *)arg)++;
    return 1;
}

static void test_stop_request_interrupts(void **state)
{
    (void)state;
    ch_taskfile_t *tf = tasks_from("sleep 30\nsleep 30\nsleep 30\nsleep 30\nsleep 30\n"
                                   "sleep 30\nsleep 30\nsleep 30\nsleep 30\n");
    ch_farm_options_t o;
    options(&o, tf);
    o.preempt_grace = 0.2;
    int calls = 0;
    o.cb_arg = &calls;
    o.should_stop = stop_now; /* asked at the first tick, within a second */
    double t0 = MPI_Wtime();
    ch_farm_summary_t sum;
    assert_ch_ok(run_farm(&o, &sum));
    double el = MPI_Wtime() - t0;
    int started = 2 * ch_test_world_size() < 9 ? 2 * ch_test_world_size() : 9;
    assert_int_equal(sum.stop, CH_FARM_PREEMPTED);
    assert_int_equal(sum.attempts, started);
    assert_int_equal(sum.interrupted, started);
    assert_int_equal(sum.failed, 0);
    assert_int_equal(sum.not_run, 9);
    if (el > 8) fail_msg("the stop took %.1f s", el);
    if (ch_test_rank() == 0) assert_true(calls >= 1);
    /* the journal says interrupted: a resume runs them (quickly, as `true`) */
    ch_taskfile_destroy(tf);
}

/* The farm's keys (ch_farm_config_table): their defaults are
 * ch_farm_options_default's, the choices map to the enums, a bad choice is
 * one error naming the key. */
static void test_config_keys(void **state)
{
    (void)state;
    const ch_config_table_t tables[] = {ch_farm_config_table()};
    assert_string_equal(tables[0].title, "farm");
    char *argv[] = {(char *)"cohort-farm", (char *)"--farm.tasks=t.txt", NULL};
    ch_config_t *cfg = NULL;
    ch_farm_options_t o, def;
    ch_farm_options_default(&def);
    assert_ch_ok(ch_config_load_tables(tables, 1, NULL, 2, argv, &cfg));
    assert_ch_ok(ch_farm_options_from_config(cfg, &o));
    assert_memory_equal(&o, &def, sizeof o);
    ch_config_destroy(cfg);

    char *set[] = {(char *)"cohort-farm", (char *)"--farm.tasks=t.txt", (char *)"--farm.output=merged",
                   (char *)"--farm.journal_sync=end", (char *)"--farm.halt_mode=now",
                   (char *)"--farm.retries=3", (char *)"--farm.grace=7.5", (char *)"--farm.resume", NULL};
    assert_ch_ok(ch_config_load_tables(tables, 1, NULL, 8, set, &cfg));
    assert_ch_ok(ch_farm_options_from_config(cfg, &o));
    assert_int_equal(o.output, CH_FARM_OUTPUT_MERGED);
    assert_int_equal(o.sync, CH_JOURNAL_SYNC_END);
    assert_int_equal(o.halt_now, 1);
    assert_int_equal(o.retries, 3);
    assert_true(o.preempt_grace == 7.5);
    assert_int_equal(o.resume, 1);
    assert_null(o.tasks);
    assert_null(o.dir);
    ch_config_destroy(cfg);

    char *bad[] = {(char *)"cohort-farm", (char *)"--farm.tasks=t.txt", (char *)"--farm.output=all", NULL};
    assert_ch_ok(ch_config_load_tables(tables, 1, NULL, 3, bad, &cfg));
    assert_ch_error(ch_farm_options_from_config(cfg, &o), CH_ERR_CONFIG, "farm.output");
    ch_config_destroy(cfg);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_every_task_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_env_output_and_cwd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_merged_output, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retries_and_failures, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_barrier, setup, teardown),
        cmocka_unit_test_setup_teardown(test_halt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_halt_drops_queued, setup, teardown),
        cmocka_unit_test_setup_teardown(test_progress_text, setup, teardown),
        cmocka_unit_test_setup_teardown(test_strangers_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prefetch_balance, setup, teardown),
        cmocka_unit_test_setup_teardown(test_summary_ends, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_request_interrupts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timeout_median, setup, teardown),
        cmocka_unit_test_setup_teardown(test_output_files_only_when_written, setup, teardown),
        cmocka_unit_test_setup_teardown(test_without_pidfd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cpu_binding, setup, teardown),
        cmocka_unit_test(test_config_keys),
    };
    return ch_test_main_mpi(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
