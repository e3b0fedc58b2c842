/* cohort: status codes, thread-local error messages and check macros.
 *
 * Every fallible function returns ch_status (CH_OK == 0). On failure it sets
 * a thread-local message with context (what failed, the offending value;
 * the source file and line at COHORT_LOG_LEVEL=debug) through CH_ERROR; callers may add outer context with
 * ch_error_context() on the way up, PETSc-traceback style:
 *
 *     CH_TRY(ch_config_load(cfg, path));       // propagate
 *     if (n < 0) return CH_ERROR(CH_ERR_INVALID, "batch size %d < 0", n);
 *
 * A fatal error in a distributed run goes through ch_fatal(), which prints the
 * message prefixed by the rank, runs the registered abort hooks (the NCCL
 * process group registers ncclCommAbort) and calls MPI_Abort so that no other
 * rank hangs in a collective.
 */
#ifndef COHORT_STATUS_H
#define COHORT_STATUS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int ch_status;

enum {
    CH_OK = 0,
    CH_ERR_INVALID,     /* bad argument or value */
    CH_ERR_NOMEM,       /* allocation failed */
    CH_ERR_IO,          /* file system or stream error */
    CH_ERR_FORMAT,      /* malformed file contents */
    CH_ERR_CONFIG,      /* configuration error (unknown key, wrong type, range) */
    CH_ERR_RANGE,       /* value outside the accepted range */
    CH_ERR_UNSUPPORTED, /* feature not compiled in or not available */
    CH_ERR_MPI,         /* MPI call failed */
    CH_ERR_CUDA,        /* CUDA runtime call failed */
    CH_ERR_CUDNN,       /* cuDNN call failed */
    CH_ERR_CUBLAS,      /* cuBLAS call failed */
    CH_ERR_NCCL,        /* NCCL call failed */
    CH_ERR_DNNL,        /* oneDNN call failed */
    CH_ERR_PMI,         /* PMI2 call failed */
    CH_ERR_REMOTE,      /* another rank failed */
    CH_ERR_INTERNAL,    /* bug in cohort */
    CH_ERR_COUNT_
};

/* Longest message kept, in bytes including the terminating NUL. */
#define CH_ERROR_MAX 2048

/* Short name of a status code ("CH_ERR_IO"); never NULL. */
const char *ch_status_name(ch_status s);

/* Set the calling thread's error message to "<fmt...>" and return code (so
 * `return CH_ERROR(...)` works). At COHORT_LOG_LEVEL=debug (ch_log_get_level()
 * == CH_LOG_DEBUG) the message ends with the source location
 * " (FILE:LINE)"; user-facing messages carry none. code must not be CH_OK. */
ch_status ch_error_set(ch_status code, const char *file, int line,
                       const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Prepend "<fmt...>: " to the current message (outer context). Returns the
 * last code passed to ch_error_set so it can be used in a return. */
ch_status ch_error_context(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/* The calling thread's last error message ("" if none), valid until the next
 * ch_error_* call on this thread. */
const char *ch_error_message(void);

/* The code of the calling thread's last error (CH_OK if none). */
ch_status ch_error_code(void);

/* Forget the calling thread's error. */
void ch_error_clear(void);

/* Bytes from a file as text for an error message: printable ASCII kept,
 * every other byte (control characters, non-UTF-8, non-ASCII) written as
 * \xHH, so a message stays one readable line whatever the file held.
 * Writes at most len bytes including the NUL into buf (len >= 8; a longer
 * text ends in "..."). Returns buf. */
const char *ch_error_quote(const void *bytes, size_t n, char *buf, size_t len);

/* Copy another thread's message into this thread (used when a worker thread's
 * error is handed to the consumer). Returns code. */
ch_status ch_error_adopt(ch_status code, const char *message);

/* A hook run by ch_fatal before MPI_Abort (e.g. ncclCommAbort). At most
 * CH_FATAL_HOOKS_MAX hooks; returns CH_ERR_RANGE when full. */
#define CH_FATAL_HOOKS_MAX 16
typedef void (*ch_fatal_hook_fn)(void *arg);
ch_status ch_fatal_hook_add(ch_fatal_hook_fn fn, void *arg);
void ch_fatal_hook_remove(ch_fatal_hook_fn fn, void *arg);

/* Print "[rank R] fatal: <what>: <current message>" on stderr, run the fatal
 * hooks, then MPI_Abort(MPI_COMM_WORLD, exit_code) when MPI is initialised
 * (every rank of the job ends), else exit(exit_code). Never returns. */
void ch_fatal(const char *what, int exit_code) __attribute__((noreturn));

/* Convenience: if s != CH_OK, ch_fatal(what, 1). */
void ch_check_fatal(ch_status s, const char *what);

#define CH_ERROR(code, ...) ch_error_set((code), __FILE__, __LINE__, __VA_ARGS__)

/* Propagate a failing status unchanged. */
#define CH_TRY(expr)                                                         \
    do {                                                                     \
        ch_status ch_try_s_ = (expr);                                        \
        if (ch_try_s_ != CH_OK) return ch_try_s_;                            \
    } while (0)

/* Check that an argument holds; otherwise CH_ERR_INVALID naming it. */
#define CH_REQUIRE(cond, ...)                                                \
    do {                                                                     \
        if (!(cond)) return CH_ERROR(CH_ERR_INVALID, __VA_ARGS__);           \
    } while (0)

/* ---- check macros for foreign calls. Each expands only where used, so the
 * file using it must include the foreign header (mpi.h, cuda_runtime.h, ...).
 * On failure they set the message (call text, library's own error string)
 * and return the matching ch_status from the enclosing function. */

#define CH_CHECK_MPI(call)                                                   \
    do {                                                                     \
        int ch_e_ = (call);                                                  \
        if (ch_e_ != MPI_SUCCESS) {                                          \
            char ch_b_[MPI_MAX_ERROR_STRING]; int ch_l_ = 0;                 \
            ch_b_[0] = 0; MPI_Error_string(ch_e_, ch_b_, &ch_l_);            \
            return CH_ERROR(CH_ERR_MPI, "%s failed: %s", #call, ch_b_);      \
        }                                                                    \
    } while (0)

/* A failed runtime call also becomes the thread's "last error", which the
 * next CH_CUDA_CHECK_LAUNCH (cudaGetLastError after a kernel launch) would
 * report as a failed launch once the caller has handled this failure (an
 * OOM a caller falls back from, say): reset it here. Sticky errors stay. */
#define CH_CHECK_CUDA(call)                                                  \
    do {                                                                     \
        cudaError_t ch_e_ = (call);                                          \
        if (ch_e_ != cudaSuccess) {                                          \
            (void)cudaGetLastError();                                        \
            return CH_ERROR(CH_ERR_CUDA, "%s failed: %s (%s)", #call,        \
                            cudaGetErrorString(ch_e_), cudaGetErrorName(ch_e_)); \
        }                                                                    \
    } while (0)

#define CH_CHECK_CUDNN(call)                                                 \
    do {                                                                     \
        cudnnStatus_t ch_e_ = (call);                                        \
        if (ch_e_ != CUDNN_STATUS_SUCCESS)                                   \
            return CH_ERROR(CH_ERR_CUDNN, "%s failed: %s", #call,            \
                            cudnnGetErrorString(ch_e_));                     \
    } while (0)

#define CH_CHECK_CUBLAS(call)                                                \
    do {                                                                     \
        cublasStatus_t ch_e_ = (call);                                       \
        if (ch_e_ != CUBLAS_STATUS_SUCCESS)                                  \
            return CH_ERROR(CH_ERR_CUBLAS, "%s failed: %s", #call,           \
                            cublasGetStatusString(ch_e_));                   \
    } while (0)

#define CH_CHECK_NCCL(call)                                                  \
    do {                                                                     \
        ncclResult_t ch_e_ = (call);                                         \
        if (ch_e_ != ncclSuccess)                                            \
            return CH_ERROR(CH_ERR_NCCL, "%s failed: %s", #call,             \
                            ncclGetErrorString(ch_e_));                      \
    } while (0)

/* oneDNN 2.x has no status-to-string function in its C API. */
const char *ch_dnnl_status_string(int dnnl_status);
#define CH_CHECK_DNNL(call)                                                  \
    do {                                                                     \
        dnnl_status_t ch_e_ = (call);                                        \
        if (ch_e_ != dnnl_success)                                           \
            return CH_ERROR(CH_ERR_DNNL, "%s failed: %s", #call,             \
                            ch_dnnl_status_string((int)ch_e_));              \
    } while (0)

/* libconfig: cfg is a config_t*; reports file:line and the parser's text. */
#define CH_CHECK_LIBCONFIG(call, cfg, path)                                  \
    do {                                                                     \
        if ((call) != CONFIG_TRUE)                                           \
            return CH_ERROR(CH_ERR_CONFIG, "%s:%d: %s",                      \
                            config_error_file(cfg) ? config_error_file(cfg)  \
                                                   : (path),                 \
                            config_error_line(cfg), config_error_text(cfg)); \
    } while (0)

#define CH_CHECK_PMI2(call)                                                  \
    do {                                                                     \
        int ch_e_ = (call);                                                  \
        if (ch_e_ != PMI2_SUCCESS)                                           \
            return CH_ERROR(CH_ERR_PMI, "%s failed: PMI2 error %d", #call,   \
                            ch_e_);                                          \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif /* COHORT_STATUS_H */
