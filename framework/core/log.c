/* cohort: rank-aware logging. */
#include "config.h"

#include "framework/core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static int log_rank;
static int log_world = 1;
static int log_all_ranks;
static int log_level = -1;

void ch_log_set_rank(int rank, int world_size)
{
    log_rank = rank;
    log_world = world_size;
}

int ch_log_rank(void) { return log_rank; }

void ch_log_set_level(ch_log_level level) { log_level = (int)level; }

ch_log_level ch_log_get_level(void)
{
    if (log_level < 0) {
        const char *e = getenv("COHORT_LOG_LEVEL");
        log_level = CH_LOG_INFO;
        if (e) {
            if (!strcasecmp(e, "error")) log_level = CH_LOG_ERROR;
            else if (!strcasecmp(e, "warn")) log_level = CH_LOG_WARN;
            else if (!strcasecmp(e, "debug")) log_level = CH_LOG_DEBUG;
        }
    }
    return (ch_log_level)log_level;
}

void ch_log_set_all_ranks(int on) { log_all_ranks = on; }

void ch_log(ch_log_level level, const char *fmt, ...)
{
    static const char *const tags[] = {"error: ", "warning: ", "", "debug: "};
    char line[4096];
    int n = 0;
    if ((int)level > (int)ch_log_get_level()) return;
    if (level == CH_LOG_INFO && log_rank != 0 && !log_all_ranks) return;
    if (log_rank != 0 || (log_world > 1 && level != CH_LOG_INFO))
        n = snprintf(line, sizeof line, "[rank %d] ", log_rank);
    n += snprintf(line + n, sizeof line - (size_t)n, "%s", tags[level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    if (m < 0) m = 0;
    n += m;
    if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
    if (n == 0 || line[n - 1] != '\n') line[n++] = '\n';
    int fd = level == CH_LOG_INFO ? STDOUT_FILENO : STDERR_FILENO;
    if (fd == STDOUT_FILENO) fflush(stdout);
    ssize_t w = write(fd, line, (size_t)n);
    (void)w;
}
