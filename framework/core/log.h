/* cohort: rank-aware logging.
 *
 * ch_log_info prints on rank 0 only (unless ch_log_set_all_ranks(1)); warn
 * and error print on every rank. Every line a non-zero rank prints starts
 * with "[rank N] ". Lines go to stderr (warn/error/debug) or stdout (info).
 * The level comes from COHORT_LOG_LEVEL (error, warn, info, debug; default
 * info) or ch_log_set_level(). Thread-safe: each line is one write.
 */
#ifndef COHORT_LOG_H
#define COHORT_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CH_LOG_ERROR = 0,
    CH_LOG_WARN = 1,
    CH_LOG_INFO = 2,
    CH_LOG_DEBUG = 3,
} ch_log_level;

/* Tell the logger this process's rank and the world size (default 0 of 1). */
void ch_log_set_rank(int rank, int world_size);
int ch_log_rank(void);
void ch_log_set_level(ch_log_level level);
ch_log_level ch_log_get_level(void);
/* Nonzero: info lines print on every rank (prefixed), not only rank 0. */
void ch_log_set_all_ranks(int on);

void ch_log(ch_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define ch_log_error(...) ch_log(CH_LOG_ERROR, __VA_ARGS__)
#define ch_log_warn(...) ch_log(CH_LOG_WARN, __VA_ARGS__)
#define ch_log_info(...) ch_log(CH_LOG_INFO, __VA_ARGS__)
#define ch_log_debug(...) ch_log(CH_LOG_DEBUG, __VA_ARGS__)
/* A warning every rank would print alike (it follows from inputs all ranks
 * share: a weights file, the saved configuration): printed by rank 0 only,
 * so N ranks do not repeat one line N times. */
#define ch_log_warn_rank0(...)                                                   \
    do {                                                                         \
        if (ch_log_rank() == 0) ch_log(CH_LOG_WARN, __VA_ARGS__);                \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif /* COHORT_LOG_H */
