/* cohort: status codes and thread-local error messages. */
#include "config.h"

#include "framework/core/status.h"
#include "framework/core/log.h"

#include <dnnl.h>
#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static __thread char tl_message[CH_ERROR_MAX];
static __thread ch_status tl_code;

static const char *const status_names[CH_ERR_COUNT_] = {
    "CH_OK",           "CH_ERR_INVALID", "CH_ERR_NOMEM",  "CH_ERR_IO",
    "CH_ERR_FORMAT",   "CH_ERR_CONFIG",  "CH_ERR_RANGE",  "CH_ERR_UNSUPPORTED",
    "CH_ERR_MPI",      "CH_ERR_CUDA",    "CH_ERR_CUDNN",  "CH_ERR_CUBLAS",
    "CH_ERR_NCCL",     "CH_ERR_DNNL",    "CH_ERR_PMI",    "CH_ERR_REMOTE",
    "CH_ERR_INTERNAL",
};

const char *ch_status_name(ch_status s)
{
    if (s < 0 || s >= CH_ERR_COUNT_) return "CH_ERR_UNKNOWN";
    return status_names[s];
}

static const char *basename_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

ch_status ch_error_set(ch_status code, const char *file, int line,
                       const char *fmt, ...)
{
    char body[CH_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    /* The source location is for developers: only at COHORT_LOG_LEVEL=debug,
     * so a user's error line names the file, key or value and nothing else. */
    if (ch_log_get_level() >= CH_LOG_DEBUG)
        snprintf(tl_message, sizeof tl_message, "%.1900s (%.100s:%d)", body,
                 basename_of(file), line);
    else
        snprintf(tl_message, sizeof tl_message, "%.2000s", body);
    tl_code = code == CH_OK ? CH_ERR_INTERNAL : code;
    return tl_code;
}

ch_status ch_error_context(const char *fmt, ...)
{
    char prefix[CH_ERROR_MAX];
    char old[CH_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, tl_message, sizeof old);
    if (old[0])
        snprintf(tl_message, sizeof tl_message, "%.600s: %.1400s", prefix, old);
    else
        snprintf(tl_message, sizeof tl_message, "%s", prefix);
    if (tl_code == CH_OK) tl_code = CH_ERR_INTERNAL;
    return tl_code;
}

const char *ch_error_message(void) { return tl_message; }
ch_status ch_error_code(void) { return tl_code; }

void ch_error_clear(void)
{
    tl_message[0] = 0;
    tl_code = CH_OK;
}

ch_status ch_error_adopt(ch_status code, const char *message)
{
    snprintf(tl_message, sizeof tl_message, "%s", message ? message : "");
    tl_code = code == CH_OK ? CH_ERR_INTERNAL : code;
    return tl_code;
}

/* ---------------------------------------------------------------- fatal */

static pthread_mutex_t hooks_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    ch_fatal_hook_fn fn;
    void *arg;
} hooks[CH_FATAL_HOOKS_MAX];
static int n_hooks;

ch_status ch_fatal_hook_add(ch_fatal_hook_fn fn, void *arg)
{
    ch_status s = CH_OK;
    pthread_mutex_lock(&hooks_lock);
    if (n_hooks == CH_FATAL_HOOKS_MAX)
        s = CH_ERROR(CH_ERR_RANGE, "more than %d fatal hooks", CH_FATAL_HOOKS_MAX);
    else {
        hooks[n_hooks].fn = fn;
        hooks[n_hooks].arg = arg;
        n_hooks++;
    }
    pthread_mutex_unlock(&hooks_lock);
    return s;
}

void ch_fatal_hook_remove(ch_fatal_hook_fn fn, void *arg)
{
    pthread_mutex_lock(&hooks_lock);
    for (int i = 0; i < n_hooks; i++) {
        if (hooks[i].fn == fn && hooks[i].arg == arg) {
            memmove(&hooks[i], &hooks[i + 1], (size_t)(n_hooks - i - 1) * sizeof hooks[0]);
            n_hooks--;
            break;
        }
    }
    pthread_mutex_unlock(&hooks_lock);
}

void ch_fatal(const char *what, int exit_code)
{
    int inited = 0, finalized = 0;
    if (exit_code == 0) exit_code = 1;
    fflush(stdout);
    fprintf(stderr, "[rank %d] fatal: %s: %s\n", ch_log_rank(),
            what ? what : "error",
            tl_message[0] ? tl_message : ch_status_name(tl_code));
    fflush(stderr);
    /* Hooks run once, without the lock: a hook may itself fail fatally. */
    int n = n_hooks;
    n_hooks = 0;
    for (int i = n - 1; i >= 0; i--) hooks[i].fn(hooks[i].arg);
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
    exit(exit_code);
}

void ch_check_fatal(ch_status s, const char *what)
{
    if (s != CH_OK) ch_fatal(what, 1);
}

const char *ch_dnnl_status_string(int st)
{
    switch ((dnnl_status_t)st) {
    case dnnl_success: return "success";
    case dnnl_out_of_memory: return "out of memory";
    case dnnl_invalid_arguments: return "invalid arguments";
    case dnnl_unimplemented: return "unimplemented (no implementation for these shapes/formats)";
    case dnnl_iterator_ends: return "iterator ends";
    case dnnl_runtime_error: return "runtime error";
    case dnnl_not_required: return "not required";
    default: return "unknown oneDNN status";
    }
}

const char *ch_error_quote(const void *bytes, size_t n, char *buf, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *b = bytes;
    size_t k = 0;
    if (len < 8) {
        if (len) buf[0] = 0;
        return buf;
    }
    for (size_t i = 0; i < n; i++) {
        const int plain = b[i] >= 0x20 && b[i] < 0x7f && b[i] != '\\';
        const size_t w = plain ? 1 : 4;
        if (k + w + 4 > len) { /* room for "..." and the NUL */
            memcpy(buf + k, "...", 4);
            return buf;
        }
        if (plain) {
            buf[k++] = (char)b[i];
        } else {
            buf[k++] = '\\';
            buf[k++] = 'x';
            buf[k++] = hex[b[i] >> 4];
            buf[k++] = hex[b[i] & 15];
        }
    }
    buf[k] = 0;
    return buf;
}
