/* Tests of cohort-farm's task file parser (framework/farm/taskfile.h). */
#include "tests/harness.h"

#include "framework/farm/taskfile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ch_taskfile_t *parse(const char *text)
{
    ch_taskfile_t *tf = NULL;
    assert_ch_ok(ch_taskfile_parse("tasks.txt", text, strlen(text), &tf));
    return tf;
}

static void test_plain_lines(void **state)
{
    (void)state;
    ch_taskfile_t *tf = parse("echo a\n\n   # a comment\n#another\necho b\r\n  echo c");
    assert_int_equal(ch_taskfile_count(tf), 3);
    assert_string_equal(ch_taskfile_task(tf, 0)->command, "echo a");
    assert_int_equal(ch_taskfile_task(tf, 0)->line, 1);
    assert_string_equal(ch_taskfile_task(tf, 1)->command, "echo b"); /* CR dropped */
    assert_int_equal(ch_taskfile_task(tf, 1)->line, 5);
    assert_string_equal(ch_taskfile_task(tf, 2)->command, "  echo c"); /* blanks kept, no final LF */
    assert_int_equal(ch_taskfile_task(tf, 2)->repeat_index, INT64_MIN);
    assert_null(ch_taskfile_task(tf, 3));
    assert_null(ch_taskfile_task(tf, -1));
    assert_null(ch_taskfile_task(tf, 0)->cwd);
    ch_taskfile_destroy(tf);
}

static void test_prefix_suffix(void **state)
{
    (void)state;
    ch_taskfile_t *tf = parse("#COHORT PREFIX cd /tmp && \n"
                              "#COHORT SUFFIX  > log.$COHORT_TASK_ID\n"
                              "run 1\n"
                              "#COHORT PREFIX\n"
                              "run 2\n"
                              "#COHORT SUFFIX\n"
                              "run 3\n");
    assert_int_equal(ch_taskfile_count(tf), 3);
    assert_string_equal(ch_taskfile_task(tf, 0)->command, "cd /tmp && run 1 > log.$COHORT_TASK_ID");
    assert_string_equal(ch_taskfile_task(tf, 1)->command, "run 2 > log.$COHORT_TASK_ID");
    assert_string_equal(ch_taskfile_task(tf, 2)->command, "run 3");
    ch_taskfile_destroy(tf);
}

static void test_repeat(void **state)
{
    (void)state;
    ch_taskfile_t *tf = parse("#COHORT PREFIX P=\n"
                              "#COHORT REPEAT 3 start 10 step 5 ./sim $COHORT_REPEAT_INDEX\n"
                              "#COHORT REPEAT 2\n"
                              "last\n");
    assert_int_equal(ch_taskfile_count(tf), 6);
    for (int i = 0; i < 3; i++) {
        assert_string_equal(ch_taskfile_task(tf, i)->command, "P=./sim $COHORT_REPEAT_INDEX");
        assert_int_equal(ch_taskfile_task(tf, i)->repeat_index, 10 + 5 * i);
        assert_int_equal(ch_taskfile_task(tf, i)->line, 2);
    }
    assert_string_equal(ch_taskfile_task(tf, 3)->command, "P="); /* PREFIX + SUFFIX only */
    assert_int_equal(ch_taskfile_task(tf, 4)->repeat_index, 1);
    assert_string_equal(ch_taskfile_task(tf, 5)->command, "P=last");
    ch_taskfile_destroy(tf);
}

static void test_barrier_cwd_env(void **state)
{
    (void)state;
    ch_taskfile_t *tf = parse("a\n#COHORT BARRIER\n#COHORT CWD /data/run 1\n"
                              "#COHORT ENV OMP_NUM_THREADS=4\n#COHORT ENV X=\nb\n"
                              "#COHORT ENV -X\n#COHORT ENV OMP_NUM_THREADS=2\n#COHORT CWD\n"
                              "#COHORT BARRIER\nc\n");
    assert_int_equal(ch_taskfile_count(tf), 3);
    assert_int_equal(ch_taskfile_barriers(tf), 2);
    const ch_task_t *a = ch_taskfile_task(tf, 0), *b = ch_taskfile_task(tf, 1),
                    *c = ch_taskfile_task(tf, 2);
    assert_int_equal(a->barrier, 0);
    assert_int_equal(b->barrier, 1);
    assert_int_equal(c->barrier, 2);
    assert_string_equal(b->cwd, "/data/run 1");
    assert_null(c->cwd);
    int n;
    assert_null(ch_taskfile_env(tf, a->env, &n));
    assert_int_equal(n, 0);
    const char *const *e = ch_taskfile_env(tf, b->env, &n);
    assert_int_equal(n, 2);
    assert_string_equal(e[0], "OMP_NUM_THREADS=4");
    assert_string_equal(e[1], "X=");
    e = ch_taskfile_env(tf, c->env, &n);
    assert_int_equal(n, 1);
    assert_string_equal(e[0], "OMP_NUM_THREADS=2");
    ch_taskfile_destroy(tf);
}

static void test_checksum(void **state)
{
    (void)state;
    ch_taskfile_t *a = parse("echo 1\necho 2\n"), *b = parse("# comment\necho 1\n\necho 2"),
                  *c = parse("echo 1\necho 3\n"), *d = parse("echo 1\n#COHORT BARRIER\necho 2\n"),
                  *e = parse("#COHORT ENV A=1\necho 1\necho 2\n");
    /* comments and blank lines do not change the task list; anything else does */
    assert_true(ch_taskfile_checksum(a) == ch_taskfile_checksum(b));
    assert_true(ch_taskfile_checksum(a) != ch_taskfile_checksum(c));
    assert_true(ch_taskfile_checksum(a) != ch_taskfile_checksum(d));
    assert_true(ch_taskfile_checksum(a) != ch_taskfile_checksum(e));
    ch_taskfile_destroy(a);
    ch_taskfile_destroy(b);
    ch_taskfile_destroy(c);
    ch_taskfile_destroy(d);
    ch_taskfile_destroy(e);
}

static void expect_error(const char *text, const char *needle)
{
    ch_taskfile_t *tf = (ch_taskfile_t *)1;
    assert_ch_error(ch_taskfile_parse("tasks.txt", text, strlen(text), &tf), CH_ERR_FORMAT, needle);
    assert_null(tf);
}

static void test_errors(void **state)
{
    (void)state;
    expect_error("echo\n#COHORT PERFIX x\n", "tasks.txt:2: unknown directive '#COHORT PERFIX'");
    expect_error("#COHORT\n", "tasks.txt:1: '#COHORT' without a directive");
    expect_error("#COHORT REPEAT 0 x\n", "tasks.txt:1: #COHORT REPEAT wants a count >= 1");
    expect_error("#COHORT REPEAT many\n", "tasks.txt:1: #COHORT REPEAT wants a count");
    expect_error("#COHORT REPEAT 2 start x\n", "'start' wants an integer");
    /* found by tests/fuzz/fuzz_taskfile: start + i*step overflowed int64 (UB) */
    expect_error("#COHORT REPEAT 2 start 9223372036854775807 echo\n",
                 "tasks.txt:1: #COHORT REPEAT 2 start 9223372036854775807 step 1: the last "
                 "COHORT_REPEAT_INDEX overflows");
    expect_error("#COHORT REPEAT 3 start -2 step -4611686018427387904\n", "overflows");
    expect_error("#COHORT REPEAT 4 step 4611686018427387904\n", "overflows");
    expect_error("a\n#COHORT ENV NOVALUE\n", "tasks.txt:2: #COHORT ENV wants NAME=VALUE");
    expect_error("#COHORT ENV 1A=2\n", "tasks.txt:1: #COHORT ENV");
    expect_error("#COHORT BARRIER now\n", "tasks.txt:1: #COHORT BARRIER takes no arguments");
    expect_error("", "tasks.txt: no tasks (0 lines");
    expect_error("\n# nothing\n#COHORT PREFIX x\n", "tasks.txt: no tasks (3 lines");
    const char nul[] = "echo a\nec\0ho\n";
    ch_taskfile_t *tf = NULL;
    assert_ch_error(ch_taskfile_parse("bin", nul, sizeof nul - 1, &tf), CH_ERR_FORMAT,
                    "bin:2: NUL byte");
}

/* #23: a REPEAT count or a task list beyond the limit is refused while
 * parsing, before any task is built (99999999999 tasks took 11.6 GB). */
static void test_task_limit(void **state)
{
    (void)state;
    expect_error("#COHORT REPEAT 99999999999 echo x\n",
                 "tasks.txt:1: #COHORT REPEAT 99999999999: more than the farm's limit of 10000000 tasks");
    char text[128];
    snprintf(text, sizeof text, "a\nb\n#COHORT REPEAT %d x\n", CH_TASKFILE_MAX_TASKS - 1);
    expect_error(text, "tasks.txt:3: #COHORT REPEAT 9999999: more than the farm's limit");
    expect_error("#COHORT REPEAT 9223372036854775807\n", "tasks.txt:1: #COHORT REPEAT");
}

/* #23: a command longer than one execve argument may be (MAX_ARG_STRLEN,
 * 128 KiB with its NUL) is refused at parse time, PREFIX and SUFFIX counted. */
static void test_command_limit(void **state)
{
    (void)state;
    size_t n = CH_TASKFILE_MAX_COMMAND;
    char *text = malloc(n + 64);
    assert_non_null(text);
    memset(text, 'x', n);
    strcpy(text + n, "\n");
    ch_taskfile_t *tf = parse(text); /* exactly at the limit */
    assert_int_equal(strlen(ch_taskfile_task(tf, 0)->command), n);
    ch_taskfile_destroy(tf);
    strcpy(text + n, "y\n");
    expect_error(text, "tasks.txt:1: the task's command (after PREFIX and SUFFIX) is 131072 bytes, "
                       "more than the kernel's limit of 131071 bytes");
    /* PREFIX + line at the limit + SUFFIX: the full command counts */
    const char *head = "echo\n#COHORT PREFIX a\n";
    size_t hl = strlen(head);
    memmove(text + hl, text, n);
    memcpy(text, head, hl);
    strcpy(text + hl + n, "\n");
    expect_error(text, "tasks.txt:3: the task's command (after PREFIX and SUFFIX) is 131072 bytes");
    strcpy(text, "#COHORT SUFFIX ");
    memset(text + 15, 'x', n);
    strcpy(text + 15 + n, "\n#COHORT REPEAT 2 y\n");
    expect_error(text, "tasks.txt:2: the task's command (after PREFIX and SUFFIX) is 131072 bytes");
    free(text);
}

/* #23: "#COHORTX" and "#cohort prefix" were silent comments. */
static void test_directive_case(void **state)
{
    (void)state;
    expect_error("a\n#COHORTX PREFIX x\n", "tasks.txt:2: '#COHORTX' is not a directive");
    expect_error("#cohort prefix x\na\n", "tasks.txt:1: '#cohort' is not a directive");
    expect_error("a\n  #Cohort\n", "tasks.txt:2: '#Cohort' is not a directive");
    expect_error("#cohorts of patients\na\n", "tasks.txt:1: '#cohorts' is not a directive");
    expect_error("#COHORT prefix x\na\n",
                 "tasks.txt:1: unknown directive '#COHORT prefix': directive names are upper case "
                 "('#COHORT PREFIX')");
    /* other comments stay comments */
    ch_taskfile_t *tf = parse("# COHORT PREFIX x\n#cohor\n#\n#!/bin/sh\na\n");
    assert_int_equal(ch_taskfile_count(tf), 1);
    assert_string_equal(ch_taskfile_task(tf, 0)->command, "a");
    ch_taskfile_destroy(tf);
}

static void test_load_file(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/tests/tmp-farm-tasks-%d.txt", ch_test_builddir(), (int)getpid());
    ch_taskfile_t *tf = NULL;
    const char *needle = path;
    assert_ch_error(ch_taskfile_load(path, &tf), CH_ERR_IO, needle);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 100000; i++) fprintf(f, "echo %d\n", i);
    fclose(f);
    assert_ch_ok(ch_taskfile_load(path, &tf));
    assert_int_equal(ch_taskfile_count(tf), 100000);
    assert_string_equal(ch_taskfile_task(tf, 99999)->command, "echo 99999");
    assert_string_equal(ch_taskfile_name(tf), path);
    ch_taskfile_destroy(tf);
    unlink(path);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_lines),     cmocka_unit_test(test_prefix_suffix),
        cmocka_unit_test(test_repeat),          cmocka_unit_test(test_barrier_cwd_env),
        cmocka_unit_test(test_checksum),        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_load_file),       cmocka_unit_test(test_task_limit),
        cmocka_unit_test(test_command_limit),   cmocka_unit_test(test_directive_case),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
