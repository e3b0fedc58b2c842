/* cohort: the task file of cohort-farm — one shell command per line, with a
 * small directive set in the spirit of disBatch.
 *
 * Format (UTF-8 or any ASCII-compatible text, LF or CRLF line ends):
 *   - A blank line, or a line whose first non-blank character is '#' and
 *     whose first word does not start with "#COHORT" in any case, is skipped
 *     (a comment). A first word that starts with "#cohort" in any case but
 *     is not exactly "#COHORT" ("#COHORTX", "#cohort", "#Cohort") is an
 *     error naming FILE:LINE.
 *   - "#COHORT <DIRECTIVE> [ARGS]" lines change how the tasks after them are
 *     built (directive names are upper case; anything else is an error naming
 *     FILE:LINE and the accepted directives):
 *       #COHORT PREFIX text    text is put before every later task's command
 *                              (verbatim: include the space or ';' you want);
 *                              an empty text clears it
 *       #COHORT SUFFIX text    the same after the command
 *       #COHORT CWD dir        later tasks start in dir (relative paths are
 *                              relative to the farm's working directory);
 *                              no dir: back to the farm's working directory
 *       #COHORT ENV NAME=VALUE later tasks get NAME=VALUE in their
 *                              environment (repeatable; "ENV NAME=" sets
 *                              it empty, "ENV -NAME" stops setting it)
 *       #COHORT REPEAT N [start S] [step T] [command]
 *                              N tasks (N >= 1), task i with
 *                              COHORT_REPEAT_INDEX = S + i*T (default S 0,
 *                              T 1; the last index must fit in int64);
 *                              their command is PREFIX + command + SUFFIX
 *                              (without a command: PREFIX + SUFFIX, as
 *                              disBatch)
 *       #COHORT BARRIER        no task after it starts before every task
 *                              before it has ended (successfully or not)
 *   - Any other line is one task: PREFIX + line + SUFFIX, run by /bin/sh -c.
 *     (Leading blanks are kept; a trailing CR of a CRLF file is dropped.)
 *   - Limits, checked while parsing (CH_ERR_FORMAT naming FILE:LINE): at most
 *     CH_TASKFILE_MAX_TASKS tasks in all (a REPEAT count beyond it is refused
 *     before any task is built), and a task's full command (PREFIX + text +
 *     SUFFIX) at most CH_TASKFILE_MAX_COMMAND bytes.
 *
 * Task ids are 0-based, in file order, REPEAT counting N tasks; each task
 * also keeps the 1-based line it came from. The checksum of the task list
 * (FNV-1a 64 over every task's command, cwd, environment and repeat index)
 * is what the journal's header records, so a journal of another task list
 * is refused.
 */
#ifndef COHORT_FARM_TASKFILE_H
#define COHORT_FARM_TASKFILE_H

#include "framework/core/status.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* At most this many tasks in one task file (10^7). Rank 0 holds about 300
 * bytes per task (task list 40, journal state 216, dispatch state, commands):
 * 3 GB at the limit, which is also 2 hours of `true` tasks at the ~1,400
 * tasks/s the farm reaches (docs/PERFORMANCE.md). */
#define CH_TASKFILE_MAX_TASKS 10000000

/* At most this many bytes in a task's command (without its NUL): Linux's
 * MAX_ARG_STRLEN (32 pages of 4 KiB, with the NUL) on one argument of
 * execve, here the COMMAND of "/bin/sh -c COMMAND". */
#define CH_TASKFILE_MAX_COMMAND 131071

typedef struct {
    const char *command; /* full command (PREFIX + text + SUFFIX), NUL-terminated */
    const char *cwd;     /* working directory, NULL: the farm's own */
    int env;             /* index of the task's environment set (ch_taskfile_env) */
    int line;            /* 1-based line of the task file */
    int barrier;         /* number of BARRIER directives before this task */
    int64_t repeat_index;/* COHORT_REPEAT_INDEX, or INT64_MIN when not from REPEAT */
} ch_task_t;

typedef struct ch_taskfile ch_taskfile_t;

/* Parse the task file at path into *out. Errors (message names FILE:LINE):
 * CH_ERR_IO (cannot open/read: strerror), CH_ERR_FORMAT (unknown directive
 * or a "#cohort"-like first word, bad REPEAT arguments, ENV without
 * NAME=VALUE, a NUL byte, more than CH_TASKFILE_MAX_TASKS tasks, a command of
 * more than CH_TASKFILE_MAX_COMMAND bytes, no task at all: "FILE: no tasks
 * (N lines, all blank, comments or directives)"), CH_ERR_NOMEM. */
ch_status ch_taskfile_load(const char *path, ch_taskfile_t **out);

/* The same from a memory buffer of len bytes; name is used in messages. */
ch_status ch_taskfile_parse(const char *name, const char *text, size_t len,
                            ch_taskfile_t **out);

void ch_taskfile_destroy(ch_taskfile_t *tf);

/* Number of tasks, and task i (0 <= i < count; NULL otherwise). */
int64_t ch_taskfile_count(const ch_taskfile_t *tf);
const ch_task_t *ch_taskfile_task(const ch_taskfile_t *tf, int64_t i);

/* Number of BARRIER directives (tasks have barrier in 0..n). */
int ch_taskfile_barriers(const ch_taskfile_t *tf);

/* Environment set k: *n entries "NAME=VALUE" (NULL when *n == 0). */
const char *const *ch_taskfile_env(const ch_taskfile_t *tf, int k, int *n);

/* FNV-1a 64 checksum of the task list (see the file comment). */
uint64_t ch_taskfile_checksum(const ch_taskfile_t *tf);

/* The path or name the file was loaded from. */
const char *ch_taskfile_name(const ch_taskfile_t *tf);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_FARM_TASKFILE_H */
