/* Fuzz target: cohort-farm's task file parser (framework/farm/taskfile.c) on
 * arbitrary bytes (ch_taskfile_parse; #COHORT directives, REPEAT, ENV, ...).
 * A failure must come with a message naming the file; a task list that
 * parses must be consistent: count >= 1, every task's command a string,
 * 1 <= line <= the lines of the input and non-decreasing, barrier in
 * 0..ch_taskfile_barriers and non-decreasing, the environment set in range
 * with "NAME=VALUE" entries and no NAME twice, a repeat index only on REPEAT
 * tasks, and the checksum the same when the same bytes parse again. */
#include "config.h"

#include "framework/farm/taskfile.h"
#include "tests/fuzz/fuzz.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* REPEAT N makes N tasks: a valid file of REPEAT 1000000000 takes memory in
 * proportion, which is not a bug. Skip inputs whose REPEAT counts add up to
 * more than this (parsed as the reader does: strtoll after the word). */
#define MAX_REPEAT_TASKS 4096

static int too_many_repeats(const char *text)
{
    long long total = 0;
    for (const char *p = strstr(text, "REPEAT"); p; p = strstr(p + 1, "REPEAT")) {
        long long n = strtoll(p + 6, NULL, 10);
        if (n > MAX_REPEAT_TASKS || (total += n > 0 ? n : 0) > MAX_REPEAT_TASKS) return 1;
    }
    return 0;
}

static void check(const ch_taskfile_t *tf, const char *text, size_t size)
{
    int64_t n = ch_taskfile_count(tf);
    if (n < 1 || ch_taskfile_task(tf, n) || ch_taskfile_task(tf, -1)) abort();
    int lines = 1;
    for (size_t i = 0; i < size; i++) lines += text[i] == '\n';
    int barriers = ch_taskfile_barriers(tf), last_line = 0, last_barrier = 0;
    if (barriers < 0) abort();
    volatile size_t sink = 0;
    for (int64_t i = 0; i < n; i++) {
        const ch_task_t *t = ch_taskfile_task(tf, i);
        if (!t || !t->command) abort();
        sink += strlen(t->command);
        if (t->cwd) sink += strlen(t->cwd);
        if (t->line < 1 || t->line > lines || t->line < last_line) abort();
        if (t->barrier < last_barrier || t->barrier > barriers) abort();
        last_line = t->line;
        last_barrier = t->barrier;
        int ne = -1;
        const char *const *env = ch_taskfile_env(tf, t->env, &ne);
        if (ne < 0 || (ne > 0) != (env != NULL)) abort();
        for (int k = 0; k < ne; k++) {
            const char *eq = strchr(env[k], '=');
            if (!eq || eq == env[k]) abort();
            for (int m = 0; m < k; m++)
                if (!strncmp(env[m], env[k], (size_t)(eq - env[k]) + 1)) abort();
        }
        if (t->repeat_index != INT64_MIN && !strstr(text, "REPEAT")) abort();
    }
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 16) return 0;
    /* a NUL-terminated copy for the REPEAT scan and the checks (the parser
     * itself gets the exact bytes) */
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    for (size_t i = 0; i < size; i++)
        if (!text[i]) text[i] = ' ';
    if (too_many_repeats(text)) {
        free(text);
        return 0;
    }
    ch_taskfile_t *tf = NULL;
    if (ch_taskfile_parse("tasks.txt", (const char *)data, size, &tf) != CH_OK) {
        if (tf || !strstr(ch_error_message(), "tasks.txt")) abort();
        ch_error_clear();
        free(text);
        return 0;
    }
    check(tf, text, size);
    ch_taskfile_t *again = NULL;
    if (ch_taskfile_parse("tasks.txt", (const char *)data, size, &again) != CH_OK ||
        ch_taskfile_checksum(again) != ch_taskfile_checksum(tf) ||
        ch_taskfile_count(again) != ch_taskfile_count(tf))
        abort();
    ch_taskfile_destroy(again);
    ch_taskfile_destroy(tf);
    free(text);
    return 0;
}
