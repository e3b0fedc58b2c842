/* Tests for framework/profiler and framework/signals. */
#include "config.h"

#include "tests/harness.h"

#include "framework/core/profiler.h"
#include "framework/launch/signals.h"

#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void test_phases_accumulate(void **state)
{
    const char *names[] = {"data", "forward"};
    ch_prof_t *p = NULL;
    assert_ch_ok(ch_prof_create(names, 2, &p));
    for (int i = 0; i < 3; i++) {
        ch_prof_begin(p, 1);
        sleep_s(0.01);
        ch_prof_end(p, 1);
    }
    ch_prof_add(p, 0, 0.5);
    assert_int_equal(ch_prof_calls(p, 1), 3);
    assert_true(ch_prof_seconds(p, 1) >= 0.029 && ch_prof_seconds(p, 1) < 1.0);
    assert_true(ch_prof_seconds(p, 0) == 0.5);
    assert_true(ch_prof_wall(p) >= 0.029);
    ch_prof_begin(p, 7); /* out of range: ignored */
    ch_prof_end(p, -1);
    ch_prof_destroy(p);
}

static void test_bad_create(void **state)
{
    const char *names[] = {"a-name-that-is-much-too-long-for-the-table"};
    ch_prof_t *p = NULL;
    assert_ch_error(ch_prof_create(names, 1, &p), CH_ERR_INVALID, "longer than");
    assert_ch_error(ch_prof_create(names, 0, &p), CH_ERR_INVALID, "phases");
}

/* ch_prof_report over the world into a string (malloc'd), then destroy p */
static char *report_and_destroy(ch_prof_t *p, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    assert_non_null(f);
    ch_status s = ch_prof_report(p, MPI_COMM_WORLD, f);
    fclose(f);
    ch_prof_destroy(p);
    assert_ch_ok(s);
    return buf;
}

static void test_report_over_ranks(void **state)
{
    const char *names[] = {"forward", "all-reduce wait", "gpu wait"};
    ch_prof_t *p = NULL;
    int rank = ch_test_rank(), size = ch_test_world_size();
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) ch_test_skip("no MPI");
    assert_ch_ok(ch_prof_create(names, 3, &p));
    ch_prof_add(p, 0, 1.0 + rank); /* rank r spent 1+r s */
    if (rank == size - 1) { /* entered on the last rank only: still a row */
        ch_prof_begin(p, 1);
        ch_prof_end(p, 1);
    }
    /* "gpu wait": entered on no rank, so no row */
    size_t len = 0;
    char *buf = report_and_destroy(p, &len);
    if (rank == 0) {
        char want[128];
        /* min 1, mean 1+(size-1)/2, max size */
        snprintf(want, sizeof want, "%10.3f %10.3f %10.3f", 1.0, 1.0 + (size - 1) / 2.0,
                 (double)size);
        if (!strstr(buf, want)) fail_msg("report lacks '%s':\n%s", want, buf);
        assert_non_null(strstr(buf, "all-reduce wait"));
        if (strstr(buf, "gpu wait")) fail_msg("a phase no rank entered has a row:\n%s", buf);
    } else {
        assert_int_equal(len, 0);
    }
    free(buf);
}

/* a job that failed in its setup entered no phase: no table at all */
static void test_report_nothing_entered(void **state)
{
    const char *names[] = {"read wait", "compute"};
    ch_prof_t *p = NULL;
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) ch_test_skip("no MPI");
    assert_ch_ok(ch_prof_create(names, 2, &p));
    size_t len = 0;
    char *buf = report_and_destroy(p, &len);
    if (len != 0) fail_msg("a profile with no phase entered printed:\n%s", buf);
    free(buf);
}

static void test_signal_flag(void **state)
{
    int sig = 0;
    assert_ch_ok(ch_signal_parse("SIGUSR2", &sig));
    assert_int_equal(sig, SIGUSR2);
    assert_ch_ok(ch_signal_parse("term", &sig));
    assert_int_equal(sig, SIGTERM);
    assert_ch_ok(ch_signal_parse("10", &sig));
    assert_int_equal(sig, 10);
    assert_ch_error(ch_signal_parse("BOGUS", &sig), CH_ERR_INVALID, "BOGUS");
    assert_ch_error(ch_preempt_install(SIGKILL), CH_ERR_INVALID, "cannot be caught");
    assert_ch_ok(ch_preempt_install(SIGUSR2));
    ch_preempt_clear();
    assert_int_equal(ch_preempt_pending(), 0);
    raise(SIGUSR2);
    assert_int_equal(ch_preempt_pending(), SIGUSR2);
    ch_preempt_clear();
    raise(SIGTERM);
    assert_int_equal(ch_preempt_pending(), SIGTERM);
    ch_preempt_clear();
    ch_preempt_uninstall();
}

/* Regression (SIGTERM to mpiexec aborted rank 0 with "corrupted size vs.
 * prev_size"): oneDNN's JIT sgemm runs with the stack pointer inside a
 * malloc'd buffer, and a preemption signal arriving then wrote its signal
 * frame into the heap. The handlers must run on their own stack: a thread
 * whose stack is a heap buffer receives SIGTERM, and the buffer must not
 * contain the frame (on x86-64 recognisable by the xsave magic "FPXS"). */
#define HEAP_STACK_BYTES ((size_t)1 << 20)

typedef struct {
    ch_status install;
    int pending, onstack, altstack_enabled;
} heap_stack_result_t;

static void *signal_on_heap_stack(void *arg)
{
    heap_stack_result_t *r = arg;
    r->install = ch_preempt_install(0);
    if (r->install != CH_OK) return NULL;
    struct sigaction cur;
    stack_t ss;
    sigaction(SIGTERM, NULL, &cur);
    r->onstack = (cur.sa_flags & SA_ONSTACK) != 0;
    r->altstack_enabled = sigaltstack(NULL, &ss) == 0 && !(ss.ss_flags & SS_DISABLE);
    ch_preempt_clear();
    raise(SIGTERM);
    r->pending = ch_preempt_pending();
    ch_preempt_clear();
    ch_preempt_uninstall();
    return NULL;
}

static void test_signal_frame_not_on_interrupted_stack(void **state)
{
    (void)state;
    void *stack = NULL;
    assert_int_equal(posix_memalign(&stack, 4096, HEAP_STACK_BYTES), 0);
    memset(stack, 0, HEAP_STACK_BYTES);
    pthread_attr_t attr;
    pthread_t th;
    heap_stack_result_t r;
    memset(&r, 0, sizeof r);
    assert_int_equal(pthread_attr_init(&attr), 0);
    assert_int_equal(pthread_attr_setstack(&attr, stack, HEAP_STACK_BYTES), 0);
    assert_int_equal(pthread_create(&th, &attr, signal_on_heap_stack, &r), 0);
    pthread_join(th, NULL);
    pthread_attr_destroy(&attr);
    int frames = 0;
#if defined(__x86_64__)
    /* FP_XSTATE_MAGIC1 of the kernel's x86-64 signal frame */
    const uint32_t magic = 0x46505853u;
    const unsigned char *b = stack;
    for (size_t off = 0; off + 4 <= HEAP_STACK_BYTES; off += 4) {
        uint32_t v;
        memcpy(&v, b + off, 4);
        if (v == magic) frames++;
    }
#endif
    free(stack);
    assert_ch_ok(r.install);
    assert_int_equal(r.pending, SIGTERM);
    if (frames) fail_msg("the SIGTERM handler's signal frame was written on the interrupted "
                         "(heap) stack");
    assert_true(r.onstack);
    assert_true(r.altstack_enabled);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_phases_accumulate),
        cmocka_unit_test(test_bad_create),
        cmocka_unit_test(test_report_over_ranks),
        cmocka_unit_test(test_report_nothing_entered),
        cmocka_unit_test(test_signal_flag),
        cmocka_unit_test(test_signal_frame_not_on_interrupted_stack),
    };
    return ch_test_main_mpi(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
