/* cohort: preemption signals (SEMANTICS.md "Preemption").
 *
 * ch_preempt_install() installs handlers for SIGTERM and the configured Slurm
 * warning signal (default SIGUSR2; NCCL may use SIGUSR1). A handler only
 * records the signal in a sig_atomic_t flag: no I/O, no allocation, no
 * collective. The job polls ch_preempt_pending() at step boundaries and
 * agrees on it collectively (all-reduce MAX) so that every rank stops at the
 * same step. */
#ifndef COHORT_SIGNALS_H
#define COHORT_SIGNALS_H

#include "framework/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Install handlers for SIGTERM and `warning_signal` (0: SIGTERM only).
 * The handlers run on an alternate signal stack (SA_ONSTACK; a 256 KiB
 * mmap'd stack set with sigaltstack on the calling thread, which should be
 * the thread that receives the signals, normally the main thread): code
 * such as oneDNN's JIT kernels may run with the stack pointer inside a heap
 * buffer, where a signal frame would corrupt the heap.
 * CH_ERR_INVALID for a signal that cannot be caught (SIGKILL, SIGSTOP);
 * CH_ERR_NOMEM if the signal stack cannot be mapped. */
ch_status ch_preempt_install(int warning_signal);

/* Restore the handlers (and the calling thread's alternate signal stack)
 * that were in place before ch_preempt_install. */
void ch_preempt_uninstall(void);

/* The number of the last preemption signal received, or 0 if none. */
int ch_preempt_pending(void);

/* Forget a received signal (tests). */
void ch_preempt_clear(void);

/* Parse a signal name ("USR2", "SIGUSR2", "TERM", "15") into its number;
 * CH_ERR_INVALID naming the text if unknown. */
ch_status ch_signal_parse(const char *text, int *signum);

#ifdef __cplusplus
}
#endif
#endif
