/* cohort: preemption signal flag, see signals.h. */
#include "config.h"

#include "framework/launch/signals.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>

static volatile sig_atomic_t pending_signal;
static struct sigaction old_term, old_warn;
static int installed_warn;

/* The handlers run on an alternate signal stack (SA_ONSTACK), never on the
 * interrupted code's stack: oneDNN's JIT sgemm kernels point rsp into a
 * malloc'd workspace while they run, so a signal frame pushed there (about
 * 3 KiB with the AVX-512 state) overwrote heap chunks and glibc aborted
 * later ("corrupted size vs. prev_size while consolidating"). The stack is
 * mmap'd (not from the heap), kept for the life of the process, and set on
 * the thread that calls ch_preempt_install. */
#define ALT_STACK_BYTES ((size_t)256 << 10)
static void *alt_stack;
static stack_t old_alt;
static int alt_installed;

static ch_status install_alt_stack(void)
{
    if (alt_installed) return CH_OK;
    if (!alt_stack) {
        void *p = mmap(NULL, ALT_STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
        if (p == MAP_FAILED)
            return CH_ERROR(CH_ERR_NOMEM, "preemption handlers: cannot map a %zu-byte signal "
                            "stack", ALT_STACK_BYTES);
        alt_stack = p;
    }
    stack_t ss;
    memset(&ss, 0, sizeof ss);
    ss.ss_sp = alt_stack;
    ss.ss_size = ALT_STACK_BYTES;
    if (sigaltstack(&ss, &old_alt))
        return CH_ERROR(CH_ERR_INVALID, "preemption handlers: sigaltstack failed");
    alt_installed = 1;
    return CH_OK;
}

static void on_signal(int sig) { pending_signal = sig; }

ch_status ch_preempt_install(int warning_signal)
{
    struct sigaction sa;
    if (warning_signal == SIGKILL || warning_signal == SIGSTOP || warning_signal < 0 ||
        warning_signal >= NSIG)
        return CH_ERROR(CH_ERR_INVALID, "preemption signal %d cannot be caught", warning_signal);
    CH_TRY(install_alt_stack());
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_ONSTACK;
    if (sigaction(SIGTERM, &sa, &old_term))
        return CH_ERROR(CH_ERR_INVALID, "sigaction(SIGTERM) failed");
    installed_warn = 0;
    if (warning_signal && warning_signal != SIGTERM) {
        if (sigaction(warning_signal, &sa, &old_warn))
            return CH_ERROR(CH_ERR_INVALID, "sigaction(%d) failed", warning_signal);
        installed_warn = warning_signal;
    }
    return CH_OK;
}

void ch_preempt_uninstall(void)
{
    sigaction(SIGTERM, &old_term, NULL);
    if (installed_warn) sigaction(installed_warn, &old_warn, NULL);
    installed_warn = 0;
    /* restore the previous alternate stack; ours stays mapped for reuse */
    if (alt_installed) {
        if (old_alt.ss_flags & SS_DISABLE) {
            stack_t off;
            memset(&off, 0, sizeof off);
            off.ss_flags = SS_DISABLE;
            sigaltstack(&off, NULL);
        } else {
            old_alt.ss_flags = 0;
            sigaltstack(&old_alt, NULL);
        }
        alt_installed = 0;
    }
}

int ch_preempt_pending(void) { return (int)pending_signal; }

void ch_preempt_clear(void) { pending_signal = 0; }

ch_status ch_signal_parse(const char *text, int *signum)
{
    static const struct {
        const char *name;
        int num;
    } table[] = {{"TERM", SIGTERM}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"INT", SIGINT},
                 {"HUP", SIGHUP},   {"QUIT", SIGQUIT}, {"CONT", SIGCONT}, {"XCPU", SIGXCPU}};
    CH_REQUIRE(text && signum, "ch_signal_parse: NULL argument");
    const char *t = strncasecmp(text, "SIG", 3) ? text : text + 3;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcasecmp(t, table[i].name)) {
            *signum = table[i].num;
            return CH_OK;
        }
    char *end;
    long v = strtol(text, &end, 10);
    if (*text && !*end && v > 0 && v < NSIG && v != SIGKILL && v != SIGSTOP) {
        *signum = (int)v;
        return CH_OK;
    }
    return CH_ERROR(CH_ERR_INVALID, "unknown signal '%s' (expected e.g. USR2, TERM, or a number)",
                    text);
}
