/* Tests for framework/status and framework/log. Runs alone and under MPI. */
#include "config.h"

#include "tests/harness.h"

#include "framework/core/log.h"
#include "framework/core/status.h"

#include <mpi.h>
#include <pthread.h>
#include <string.h>

static ch_status inner(int v)
{
    if (v < 0) return CH_ERROR(CH_ERR_RANGE, "value %d below 0", v);
    return CH_OK;
}

static ch_status outer(int v)
{
    ch_status s = inner(v);
    if (s) return ch_error_context("loading 'job.cfg'");
    return CH_OK;
}

static void test_error_message_and_context(void **state)
{
    assert_ch_ok(outer(1));
    ch_error_clear();
    assert_int_equal(outer(-3), CH_ERR_RANGE);
    assert_int_equal(ch_error_code(), CH_ERR_RANGE);
    assert_non_null(strstr(ch_error_message(), "loading 'job.cfg': value -3 below 0"));
    /* users see no source location (issue 27 item 5) */
    assert_null(strstr(ch_error_message(), "test_status.c:"));
    assert_string_equal(ch_error_message(), "loading 'job.cfg': value -3 below 0");
    /* developers get it at COHORT_LOG_LEVEL=debug */
    ch_log_level old = ch_log_get_level();
    ch_log_set_level(CH_LOG_DEBUG);
    assert_int_equal(outer(-3), CH_ERR_RANGE);
    assert_non_null(strstr(ch_error_message(), "value -3 below 0 (test_status.c:"));
    ch_log_set_level(old);
    ch_error_clear();
    assert_string_equal(ch_error_message(), "");
    assert_int_equal(ch_error_code(), CH_OK);
}

static void *thread_fn(void *arg)
{
    (void)CH_ERROR(CH_ERR_IO, "thread error");
    *(int *)arg = strstr(ch_error_message(), "thread error") != NULL;
    return NULL;
}

static void test_message_is_thread_local(void **state)
{
    pthread_t t;
    int ok = 0;
    ch_error_clear();
    (void)CH_ERROR(CH_ERR_FORMAT, "main error");
    pthread_create(&t, NULL, thread_fn, &ok);
    pthread_join(t, NULL);
    assert_true(ok);
    assert_non_null(strstr(ch_error_message(), "main error"));
    assert_int_equal(ch_error_code(), CH_ERR_FORMAT);
    ch_error_adopt(CH_ERR_IO, "from worker: bad file x.idx");
    assert_string_equal(ch_error_message(), "from worker: bad file x.idx");
}

static void test_status_names(void **state)
{
    assert_string_equal(ch_status_name(CH_OK), "CH_OK");
    assert_string_equal(ch_status_name(CH_ERR_NCCL), "CH_ERR_NCCL");
    assert_string_equal(ch_status_name(-1), "CH_ERR_UNKNOWN");
    assert_string_equal(ch_status_name(CH_ERR_COUNT_), "CH_ERR_UNKNOWN");
}

static ch_status mpi_fail(void)
{
    /* An invalid communicator makes MPI return an error once errors return. */
    int size = 0;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    CH_CHECK_MPI(MPI_Comm_size(MPI_COMM_NULL, &size));
    return CH_OK;
}

static void test_check_mpi_macro(void **state)
{
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) ch_test_skip("MPI not initialised in this run");
    assert_int_equal(mpi_fail(), CH_ERR_MPI);
    assert_non_null(strstr(ch_error_message(), "MPI_Comm_size(MPI_COMM_NULL, &size) failed"));
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
}

static int hook_calls;
static void hook(void *arg) { hook_calls += *(int *)arg; }

static void test_fatal_hooks_register(void **state)
{
    int one = 1;
    for (int i = 0; i < CH_FATAL_HOOKS_MAX; i++) assert_ch_ok(ch_fatal_hook_add(hook, &one));
    assert_ch_error(ch_fatal_hook_add(hook, &one), CH_ERR_RANGE, "fatal hooks");
    for (int i = 0; i < CH_FATAL_HOOKS_MAX; i++) ch_fatal_hook_remove(hook, &one);
    assert_ch_ok(ch_fatal_hook_add(hook, &one));
    ch_fatal_hook_remove(hook, &one);
    assert_int_equal(hook_calls, 0);
}

static void test_dnnl_strings(void **state)
{
    assert_string_equal(ch_dnnl_status_string(0), "success");
    assert_string_equal(ch_dnnl_status_string(12345), "unknown oneDNN status");
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_message_and_context),
        cmocka_unit_test(test_message_is_thread_local),
        cmocka_unit_test(test_status_names),
        cmocka_unit_test(test_check_mpi_macro),
        cmocka_unit_test(test_fatal_hooks_register),
        cmocka_unit_test(test_dnnl_strings),
    };
    if (argc > 1 && !strcmp(argv[1], "--no-mpi"))
        return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
    return ch_test_main_mpi(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
