/* cohort: cohort-farm's slot supervisor (see supervisor.h). */
#define _GNU_SOURCE
#include "framework/farm/supervisor.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

enum { CMD_RUN = 1, CMD_KILL = 2, CMD_DROP = 3 };
typedef struct {
    int32_t type;
    int32_t attempt;
    int64_t id;
    double timeout;
} sup_cmd_t;

struct ch_supervisor {
    pid_t pid;
    int cmd_fd; /* write end */
    int msg_fd; /* read end */
};

/* ---------------------------------------------------------------- child side */

static volatile sig_atomic_t got_signal;
static void on_signal(int sig) { got_signal = sig; }

/* Without pidfd_open (Linux < 5.3), SIGCHLD wakes poll through this pipe. */
static int chld_pipe[2] = {-1, -1};
static void on_sigchld(int sig)
{
    (void)sig;
    int e = errno;
    char c = 0;
    (void)!write(chld_pipe[1], &c, 1);
    errno = e;
}

static int64_t now_ns(int clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static int read_all(int fd, void *p, size_t n)
{
    char *c = p;
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, c + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return got ? -1 : (r == 0 ? 0 : -1);
        got += (size_t)r;
    }
    return 1;
}

static void send_msg(int fd, int type, int64_t id, int attempt, const ch_journal_end_t *end,
                     const char *error)
{
    ch_sup_msg_t m;
    memset(&m, 0, sizeof m);
    m.type = type;
    m.started = 1;
    m.id = id;
    m.attempt = attempt;
    if (end) m.end = *end;
    if (error) snprintf(m.error, sizeof m.error, "%s", error);
    (void)write_all(fd, &m, sizeof m); /* the rank may be gone: EPIPE is fine */
}

/* One output stream of a task in merged mode: a pipe, and a line buffer. */
typedef struct {
    int fd;       /* read end of the task's pipe, -1 when closed */
    int file;     /* files mode: out/<shard>/<id>.out or .err, opened at the first byte */
    char buf[4096];
    size_t len;
    int64_t bytes;
} stream_t;

typedef struct {
    const ch_supervisor_options_t *o;
    int cmd_fd, msg_fd;
    ch_journal_t *journal;
    char host[CH_JOURNAL_HOST_MAX];
    uint64_t my_start;
    char **base_env; /* environ without launcher variables */
    int n_base;
    int merged_fd;   /* out/rank-R.log in merged mode */
    int devnull;
    /* the running task */
    pid_t pid;
    int pidfd;
    int64_t id;
    int attempt;
    int64_t start_ns;
    int64_t deadline; /* CLOCK_MONOTONIC ns, 0: none */
    int term_sent, timed_out, interrupted;
    stream_t out, err;  /* merged mode */
    int no_pidfd;
    sup_cmd_t queue[CH_SUP_QUEUE]; /* RUNs waiting for the running task */
    int nq;
} sup_t;

static int launcher_var(const char *e)
{
    static const char *const prefixes[] = {"PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_LOCALRANKID=",
                                           "MPI_LOCALNRANKS="};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
        if (strncmp(e, prefixes[i], strlen(prefixes[i])) == 0) return 1;
    return 0;
}

static int same_name(const char *a, const char *b)
{
    while (*a && *a != '=' && *a == *b) a++, b++;
    return (*a == '=' || !*a) && (*b == '=' || !*b);
}

/* Make folder path (one level; its parent exists). */
static int mkdir_one(const char *path) { return mkdir(path, 0777) == 0 || errno == EEXIST ? 0 : -1; }

static void child_fail(sup_t *s, const char *what)
{
    char msg[192];
    snprintf(msg, sizeof msg, "slot supervisor (rank %d slot %d): %s", s->o->rank, s->o->slot, what);
    fprintf(stderr, "%s\n", msg);
    send_msg(s->msg_fd, CH_SUP_ERROR, -1, 0, NULL, msg);
}

static void record_end(sup_t *s, int kind, int code, int64_t start_ns, int64_t out_b, int64_t err_b)
{
    ch_journal_end_t e;
    memset(&e, 0, sizeof e); /* padding too: the record goes down a pipe */
    e.id = s->id;
    e.attempt = s->attempt;
    e.rank = s->o->rank;
    e.slot = s->o->slot;
    e.kind = kind;
    e.code = code;
    e.start_ns = start_ns;
    e.end_ns = now_ns(CLOCK_REALTIME);
    e.out_bytes = out_b;
    e.err_bytes = err_b;
    ch_status st = ch_journal_write_end(s->journal, &e);
    if (st) fprintf(stderr, "%s\n", ch_error_message());
    send_msg(s->msg_fd, CH_SUP_DONE, s->id, s->attempt, &e, st ? ch_error_message() : NULL);
}

/* Files mode: path of task id's stdout (ext "out") or stderr ("err"). */
static void output_path(const sup_t *s, int64_t id, const char *ext, char *path, size_t n)
{
    snprintf(path, n, "%s/out/%03" PRId64 "/%" PRId64 ".%s", s->o->dir, id / 500, id, ext);
}

/* Files mode: write data to the stream's file, creating it (and its shard
 * folder) at the first byte, so that silent tasks leave no empty files. */
static void to_file(sup_t *s, stream_t *st, const char *ext, const char *data, size_t n)
{
    if (st->file < 0) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/out/%03" PRId64, s->o->dir, s->id / 500);
        mkdir_one(path);
        output_path(s, s->id, ext, path, sizeof path);
        st->file = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        if (st->file < 0) {
            fprintf(stderr, "task %" PRId64 ": %s: %s (output dropped)\n", s->id, path,
                    strerror(errno));
            st->file = -2; /* do not retry for this attempt */
        }
    }
    if (st->file >= 0 && write_all(st->file, data, n) != 0)
        fprintf(stderr, "task %" PRId64 ": write of its %s: %s\n", s->id, ext, strerror(errno));
}

/* Flush complete lines (or everything with force) of a merged stream. */
static void flush_stream(sup_t *s, stream_t *st, const char *tag, int force)
{
    size_t start = 0;
    for (;;) {
        char *nl = memchr(st->buf + start, '\n', st->len - start);
        size_t end = nl ? (size_t)(nl - st->buf) + 1 : st->len;
        if (!nl && !(force && end > start) && !(start == 0 && st->len == sizeof st->buf)) break;
        char line[sizeof st->buf + 64];
        int p = snprintf(line, 64, "%" PRId64 ".%d %s| ", s->id, s->attempt, tag);
        memcpy(line + p, st->buf + start, end - start);
        size_t n = (size_t)p + (end - start);
        if (line[n - 1] != '\n') line[n++] = '\n';
        (void)write_all(s->merged_fd, line, n);
        start = end;
        if (start == st->len) break;
    }
    memmove(st->buf, st->buf + start, st->len - start);
    st->len -= start;
}

static void read_stream(sup_t *s, stream_t *st, const char *tag)
{
    if (st->fd < 0) return;
    if (s->o->output == CH_FARM_OUTPUT_FILES) {
        char data[65536];
        ssize_t r = read(st->fd, data, sizeof data);
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) return;
        if (r <= 0) {
            close(st->fd);
            st->fd = -1;
            return;
        }
        st->bytes += r;
        to_file(s, st, tag, data, (size_t)r);
        return;
    }
    ssize_t r = read(st->fd, st->buf + st->len, sizeof st->buf - st->len);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (r <= 0) {
        flush_stream(s, st, tag, 1);
        close(st->fd);
        st->fd = -1;
        return;
    }
    st->len += (size_t)r;
    st->bytes += r;
    flush_stream(s, st, tag, 0);
}

static void start_task(sup_t *s, const sup_cmd_t *c)
{
    const ch_task_t *t = ch_taskfile_task(s->o->tasks, c->id);
    s->id = c->id;
    s->attempt = c->attempt;
    s->term_sent = s->timed_out = s->interrupted = 0;
    s->out.fd = s->err.fd = s->out.file = s->err.file = -1;
    s->out.len = s->err.len = 0;
    s->out.bytes = s->err.bytes = 0;
    int64_t t0 = now_ns(CLOCK_REALTIME);
    if (!t) {
        record_end(s, CH_END_SPAWN_FAILED, EINVAL, t0, 0, 0);
        return;
    }
    int child_out = s->devnull, child_err = s->devnull, rd[2] = {-1, -1};
    int e = 0;
    if (s->o->output == CH_FARM_OUTPUT_FILES && c->attempt > 1) {
        /* an earlier attempt's output must not pass for this one's */
        char path[PATH_MAX];
        output_path(s, c->id, "out", path, sizeof path);
        unlink(path);
        output_path(s, c->id, "err", path, sizeof path);
        unlink(path);
    }
    if (s->o->output != CH_FARM_OUTPUT_NONE) {
        int p1[2], p2[2];
        if (pipe2(p1, O_CLOEXEC) != 0) e = errno;
        else if (pipe2(p2, O_CLOEXEC) != 0) {
            e = errno;
            close(p1[0]);
            close(p1[1]);
        } else {
            s->out.fd = p1[0];
            s->err.fd = p2[0];
            child_out = rd[0] = p1[1];
            child_err = rd[1] = p2[1];
        }
    }
    /* environment: task file ENV, COHORT_*, then the base without those names */
    int n_task_env;
    const char *const *task_env = ch_taskfile_env(s->o->tasks, t->env, &n_task_env);
    char vars[7][PATH_MAX + 32];
    int nv = 0;
    snprintf(vars[nv++], sizeof vars[0], "COHORT_TASK_ID=%" PRId64, c->id);
    snprintf(vars[nv++], sizeof vars[0], "COHORT_TASK_ATTEMPT=%d", c->attempt);
    snprintf(vars[nv++], sizeof vars[0], "COHORT_TASK_LINE=%d", t->line);
    snprintf(vars[nv++], sizeof vars[0], "COHORT_RANK=%d", s->o->rank);
    snprintf(vars[nv++], sizeof vars[0], "COHORT_SLOT=%d", s->o->slot);
    snprintf(vars[nv++], sizeof vars[0], "COHORT_FARM_DIR=%s", s->o->dir);
    if (t->repeat_index != INT64_MIN)
        snprintf(vars[nv++], sizeof vars[0], "COHORT_REPEAT_INDEX=%" PRId64, t->repeat_index);
    char **envp = malloc(sizeof(char *) * (size_t)(n_task_env + nv + s->n_base + 1));
    int ne = 0;
    if (envp) {
        for (int i = 0; i < n_task_env; i++) envp[ne++] = (char *)task_env[i];
        for (int i = 0; i < nv; i++) envp[ne++] = vars[i];
        int fixed = ne;
        for (int i = 0; i < s->n_base; i++) {
            int dup = 0;
            for (int k = 0; k < fixed && !dup; k++) dup = same_name(s->base_env[i], envp[k]);
            if (!dup) envp[ne++] = s->base_env[i];
        }
        envp[ne] = NULL;
    } else if (!e) {
        e = ENOMEM;
    }
    pid_t pid = 0;
    if (!e) {
        posix_spawn_file_actions_t fa;
        posix_spawnattr_t at;
        posix_spawn_file_actions_init(&fa);
        posix_spawnattr_init(&at);
        posix_spawn_file_actions_adddup2(&fa, s->devnull, 0);
        posix_spawn_file_actions_adddup2(&fa, child_out, 1);
        posix_spawn_file_actions_adddup2(&fa, child_err, 2);
        if (t->cwd) posix_spawn_file_actions_addchdir_np(&fa, t->cwd);
        sigset_t none, def;
        sigemptyset(&none);
        sigemptyset(&def);
        int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGPIPE, SIGCHLD};
        for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++)
            if (sigs[i] != s->o->ignore_signal) sigaddset(&def, sigs[i]); /* it stays ignored */
        posix_spawnattr_setsigmask(&at, &none);
        posix_spawnattr_setsigdefault(&at, &def);
        posix_spawnattr_setpgroup(&at, 0);
        posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
                                          POSIX_SPAWN_SETPGROUP);
        char *argv[] = {"sh", "-c", (char *)t->command, NULL};
        e = posix_spawn(&pid, "/bin/sh", &fa, &at, argv, envp);
        posix_spawn_file_actions_destroy(&fa);
        posix_spawnattr_destroy(&at);
    }
    free(envp);
    if (rd[0] >= 0) close(rd[0]);
    if (rd[1] >= 0) close(rd[1]);
    if (e) {
        if (s->out.fd >= 0) close(s->out.fd);
        if (s->err.fd >= 0) close(s->err.fd);
        s->out.fd = s->err.fd = -1;
        record_end(s, CH_END_SPAWN_FAILED, e, t0, 0, 0);
        return;
    }
    s->pid = pid;
    s->start_ns = t0;
    /* COHORT_FARM_NO_PIDFD=1: the SIGCHLD path of old kernels (tests) */
    s->pidfd = s->no_pidfd ? -1 : (int)syscall(SYS_pidfd_open, pid, 0);
    ch_journal_start_t r = {
        .id = c->id, .attempt = c->attempt, .rank = s->o->rank, .slot = s->o->slot,
        .sup_pid = getpid(), .sup_start = s->my_start, .task_pid = pid,
        .task_start = ch_proc_start_time(pid), .start_ns = t0,
    };
    snprintf(r.host, sizeof r.host, "%s", s->host);
    if (ch_journal_write_start(s->journal, &r)) {
        fprintf(stderr, "%s\n", ch_error_message());
        send_msg(s->msg_fd, CH_SUP_ERROR, c->id, c->attempt, NULL, ch_error_message());
    }
    s->deadline = c->timeout > 0 ? now_ns(CLOCK_MONOTONIC) + (int64_t)(c->timeout * 1e9) : 0;
}

static void signal_task(sup_t *s, int sig)
{
    if (s->pid > 0) kill(-s->pid, sig);
}

/* The running task ended: reap it (reaped != 0: already reaped with status). */
static void finish_task(sup_t *s, int reaped, int status)
{
    pid_t w;
    if (!reaped) {
        do w = waitpid(s->pid, &status, 0);
        while (w < 0 && errno == EINTR);
    }
    /* whatever the shell left in the group dies with it only when we killed it */
    if (s->term_sent) kill(-s->pid, SIGKILL);
    if (s->pidfd >= 0) close(s->pidfd);
    s->pidfd = -1;
    s->pid = 0;
    int kind, code;
    if (WIFEXITED(status)) {
        kind = CH_END_EXIT;
        code = WEXITSTATUS(status);
    } else {
        kind = CH_END_SIGNAL;
        code = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    }
    if (s->interrupted) kind = CH_END_INTERRUPTED;
    else if (s->timed_out) kind = CH_END_TIMEOUT;
    else if (kind == CH_END_SIGNAL && got_signal) kind = CH_END_INTERRUPTED;
    int64_t ob = 0, eb = 0;
    if (s->o->output != CH_FARM_OUTPUT_NONE) {
        /* drain what the task wrote before it ended (the write ends may
         * still be held by its own children: read what is there now) */
        for (int k = 0; k < 2; k++) {
            stream_t *st = k ? &s->err : &s->out;
            const char *tag = k ? "err" : "out";
            if (st->fd >= 0) {
                int fl = fcntl(st->fd, F_GETFL);
                fcntl(st->fd, F_SETFL, fl | O_NONBLOCK);
                while (st->fd >= 0) {
                    int64_t before = st->bytes;
                    read_stream(s, st, tag);
                    if (st->fd >= 0 && st->bytes == before) {
                        if (s->o->output == CH_FARM_OUTPUT_MERGED) flush_stream(s, st, tag, 1);
                        close(st->fd);
                        st->fd = -1;
                    }
                }
            }
            if (st->file >= 0) close(st->file);
            st->file = -1;
        }
        ob = s->out.bytes;
        eb = s->err.bytes;
    }
    record_end(s, kind, code, s->start_ns, ob, eb);
}

static void child_main(sup_t *s) __attribute__((noreturn));
static void child_main(sup_t *s)
{
    int cmd_open = 1;
    s->pid = 0;
    s->pidfd = -1;
    for (;;) {
        if (!cmd_open && s->pid == 0) {
            ch_journal_close(s->journal); /* batch mode: the last fdatasync */
            _exit(0);
        }
        struct pollfd p[4];
        int np = 0, i_cmd = -1, i_pid = -1, i_out = -1, i_err = -1;
        if (cmd_open) p[i_cmd = np++] = (struct pollfd){s->cmd_fd, POLLIN, 0};
        /* the task's end: its pidfd, or (kernel < 5.3) the SIGCHLD self-pipe */
        if (s->pid > 0)
            p[i_pid = np++] = (struct pollfd){s->pidfd >= 0 ? s->pidfd : chld_pipe[0], POLLIN, 0};
        if (s->out.fd >= 0) p[i_out = np++] = (struct pollfd){s->out.fd, POLLIN, 0};
        if (s->err.fd >= 0) p[i_err = np++] = (struct pollfd){s->err.fd, POLLIN, 0};
        int timeout = -1;
        if (s->pid > 0 && s->deadline) {
            int64_t left = s->deadline - now_ns(CLOCK_MONOTONIC);
            timeout = left <= 0 ? 0 : (int)(left / 1000000 + 1);
        }
        int r = poll(p, (nfds_t)np, timeout);
        if (r < 0 && errno != EINTR) _exit(1);
        if (s->pid > 0 && s->deadline && now_ns(CLOCK_MONOTONIC) >= s->deadline) {
            if (!s->term_sent) {
                if (!s->interrupted) s->timed_out = 1;
                signal_task(s, SIGTERM);
                s->term_sent = 1;
                s->deadline = now_ns(CLOCK_MONOTONIC) + (int64_t)(s->o->kill_after * 1e9);
            } else {
                signal_task(s, SIGKILL);
                s->deadline = 0;
            }
        }
        if (r <= 0) continue;
        if (i_out >= 0 && p[i_out].revents) read_stream(s, &s->out, "out");
        if (i_err >= 0 && p[i_err].revents) read_stream(s, &s->err, "err");
        if (i_pid >= 0 && p[i_pid].revents) {
            if (s->pidfd >= 0) {
                finish_task(s, 0, 0);
            } else {
                char buf[64];
                while (read(chld_pipe[0], buf, sizeof buf) > 0) {}
                int status;
                if (waitpid(s->pid, &status, WNOHANG) == s->pid) finish_task(s, 1, status);
            }
        }
        if (i_cmd >= 0 && p[i_cmd].revents) {
            sup_cmd_t c;
            int got = read_all(s->cmd_fd, &c, sizeof c);
            if (got <= 0) {
                /* the rank is gone or done: queued tasks never start (the
                 * journal has no record of them, so a resume runs them) */
                cmd_open = 0;
                s->nq = 0;
                continue;
            }
            if (c.type == CMD_RUN) {
                if (s->nq == CH_SUP_QUEUE) {
                    child_fail(s, "RUN with a full queue (protocol error)");
                    continue;
                }
                s->queue[s->nq++] = c;
            } else if (c.type == CMD_KILL || c.type == CMD_DROP) {
                for (int q = 0; q < s->nq; q++) { /* never started: handed back */
                    ch_sup_msg_t m;
                    memset(&m, 0, sizeof m);
                    m.type = CH_SUP_DONE;
                    m.id = m.end.id = s->queue[q].id;
                    m.attempt = m.end.attempt = s->queue[q].attempt;
                    m.end.rank = s->o->rank;
                    m.end.slot = s->o->slot;
                    m.end.kind = CH_END_INTERRUPTED;
                    m.started = 0;
                    (void)write_all(s->msg_fd, &m, sizeof m);
                }
                s->nq = 0;
                if (c.type == CMD_KILL && s->pid > 0 && !s->term_sent) {
                    s->interrupted = 1;
                    signal_task(s, SIGTERM);
                    s->term_sent = 1;
                    s->deadline = now_ns(CLOCK_MONOTONIC) + (int64_t)(s->o->kill_after * 1e9);
                }
            }
        }
        /* start the next queued task (a spawn failure ends it at once) */
        while (s->pid == 0 && s->nq > 0) {
            sup_cmd_t c = s->queue[0];
            memmove(s->queue, s->queue + 1, sizeof *s->queue * (size_t)--s->nq);
            start_task(s, &c);
        }
    }
}

static void child_setup(sup_t *s) __attribute__((noreturn));
static void child_setup(sup_t *s)
{
    const ch_supervisor_options_t *o = s->o;
    s->out.fd = s->err.fd = s->out.file = s->err.file = -1;
    setsid();
    /* keep only the two pipes (moved to 3 and 4), close everything else */
    int c = fcntl(s->cmd_fd, F_DUPFD_CLOEXEC, 10), m = fcntl(s->msg_fd, F_DUPFD_CLOEXEC, 10);
    if (c < 0 || m < 0 || dup3(c, 3, O_CLOEXEC) < 0 || dup3(m, 4, O_CLOEXEC) < 0) _exit(1);
    s->cmd_fd = 3;
    s->msg_fd = 4;
    syscall(SYS_close_range, 5, ~0U, 0);
    int dn = open("/dev/null", O_RDWR);
    if (dn >= 0) {
        dup2(dn, 0);
        dup2(dn, 1);
        if (dn > 2) close(dn);
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/supervisors.log", o->dir);
    int lf = open(path, O_WRONLY | O_CREAT | O_APPEND, 0666);
    if (lf >= 0) {
        dup2(lf, 2);
        if (lf > 2) close(lf);
    }
    setvbuf(stderr, NULL, _IOLBF, 0);
    s->devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) sigaction(sigs[i], &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (pipe2(chld_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        child_fail(s, "pipe for SIGCHLD failed");
        _exit(1);
    }
    s->no_pidfd = getenv("COHORT_FARM_NO_PIDFD") && !strcmp(getenv("COHORT_FARM_NO_PIDFD"), "1");
    {
        struct sigaction sc;
        memset(&sc, 0, sizeof sc);
        sc.sa_handler = on_sigchld;
        sc.sa_flags = SA_RESTART | SA_NOCLDSTOP;
        sigemptyset(&sc.sa_mask);
        sigaction(SIGCHLD, &sc, NULL);
    }
    if (o->ignore_signal == SIGUSR1 || o->ignore_signal == SIGUSR2)
        signal(o->ignore_signal, SIG_IGN); /* inherited as ignored by the tasks */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (o->cpus && o->n_cpus > 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int i = 0; i < o->n_cpus; i++) CPU_SET(o->cpus[i], &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0)
            fprintf(stderr, "rank %d slot %d: sched_setaffinity: %s (running unbound)\n", o->rank,
                    o->slot, strerror(errno));
    }
    gethostname(s->host, sizeof s->host - 1);
    for (char *h = s->host; *h; h++)
        if (*h == ' ') *h = '_';
    s->my_start = ch_proc_start_time(getpid());
    int n = 0;
    while (environ[n]) n++;
    s->base_env = malloc(sizeof(char *) * (size_t)(n + 1));
    if (!s->base_env) {
        child_fail(s, "out of memory");
        _exit(1);
    }
    for (int i = 0; i < n; i++)
        if (!launcher_var(environ[i])) s->base_env[s->n_base++] = environ[i];
    snprintf(path, sizeof path, "%s/out", o->dir);
    if (o->output != CH_FARM_OUTPUT_NONE && mkdir_one(path) != 0) {
        char msg[PATH_MAX + 64];
        snprintf(msg, sizeof msg, "cannot create %s: %s", path, strerror(errno));
        child_fail(s, msg);
        _exit(1);
    }
    s->merged_fd = -1;
    if (o->output == CH_FARM_OUTPUT_MERGED) {
        snprintf(path, sizeof path, "%s/out/rank-%d.log", o->dir, o->rank);
        s->merged_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
        if (s->merged_fd < 0) {
            char msg[PATH_MAX + 64];
            snprintf(msg, sizeof msg, "cannot open %s: %s", path, strerror(errno));
            child_fail(s, msg);
            _exit(1);
        }
    }
    if (ch_journal_open(o->dir, ch_taskfile_checksum(o->tasks), ch_taskfile_count(o->tasks),
                        ch_taskfile_name(o->tasks), o->sync, &s->journal)) {
        child_fail(s, ch_error_message());
        _exit(1);
    }
    send_msg(s->msg_fd, CH_SUP_READY, -1, 0, NULL, NULL);
    child_main(s);
}

/* ---------------------------------------------------------------- rank side */

ch_status ch_supervisor_spawn(const ch_supervisor_options_t *o, ch_supervisor_t **out)
{
    CH_REQUIRE(o && o->tasks && o->dir && out, "ch_supervisor_spawn: NULL argument");
    *out = NULL;
    int cmd[2], msg[2];
    if (pipe2(cmd, O_CLOEXEC) != 0) return CH_ERROR(CH_ERR_IO, "pipe: %s", strerror(errno));
    if (pipe2(msg, O_CLOEXEC) != 0) {
        close(cmd[0]);
        close(cmd[1]);
        return CH_ERROR(CH_ERR_IO, "pipe: %s", strerror(errno));
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(cmd[0]), close(cmd[1]), close(msg[0]), close(msg[1]);
        return CH_ERROR(CH_ERR_IO, "fork of the slot supervisor: %s", strerror(e));
    }
    if (pid == 0) {
        static sup_t s;
        memset(&s, 0, sizeof s);
        s.o = o;
        s.cmd_fd = cmd[0];
        s.msg_fd = msg[1];
        child_setup(&s);
    }
    close(cmd[0]);
    close(msg[1]);
    ch_supervisor_t *s = calloc(1, sizeof *s);
    if (!s) {
        close(cmd[1]);
        close(msg[0]);
        waitpid(pid, NULL, 0);
        return CH_ERROR(CH_ERR_NOMEM, "out of memory");
    }
    s->pid = pid;
    s->cmd_fd = cmd[1];
    s->msg_fd = msg[0];
    ch_sup_msg_t m;
    ch_status st = ch_supervisor_read(s, &m);
    if (!st && m.type != CH_SUP_READY)
        st = CH_ERROR(CH_ERR_IO, "%s", m.type == CH_SUP_ERROR ? m.error : "protocol error");
    if (st) {
        ch_supervisor_close(s);
        return st;
    }
    *out = s;
    return CH_OK;
}

static ch_status send_cmd(ch_supervisor_t *s, const sup_cmd_t *c)
{
    if (write_all(s->cmd_fd, c, sizeof *c) != 0)
        return CH_ERROR(CH_ERR_IO, "slot supervisor %ld: write: %s", (long)s->pid, strerror(errno));
    return CH_OK;
}

ch_status ch_supervisor_run(ch_supervisor_t *s, int64_t id, int attempt, double timeout)
{
    sup_cmd_t c = {CMD_RUN, attempt, id, timeout};
    return send_cmd(s, &c);
}

ch_status ch_supervisor_interrupt(ch_supervisor_t *s)
{
    sup_cmd_t c = {CMD_KILL, 0, -1, 0};
    return send_cmd(s, &c);
}

ch_status ch_supervisor_drop_queued(ch_supervisor_t *s)
{
    sup_cmd_t c = {CMD_DROP, 0, -1, 0};
    return send_cmd(s, &c);
}

int ch_supervisor_fd(const ch_supervisor_t *s) { return s->msg_fd; }

pid_t ch_supervisor_pid(const ch_supervisor_t *s) { return s->pid; }

ch_status ch_supervisor_read(ch_supervisor_t *s, ch_sup_msg_t *m)
{
    int r = read_all(s->msg_fd, m, sizeof *m);
    if (r == 1) return CH_OK;
    int status = 0;
    pid_t w = waitpid(s->pid, &status, 0);
    char how[64] = "state unknown";
    if (w == s->pid && WIFEXITED(status)) snprintf(how, sizeof how, "exit status %d", WEXITSTATUS(status));
    else if (w == s->pid && WIFSIGNALED(status))
        snprintf(how, sizeof how, "killed by signal %d", WTERMSIG(status));
    if (w == s->pid) s->pid = -1;
    return CH_ERROR(CH_ERR_IO, "slot supervisor died without answering (%s); see supervisors.log "
                    "in the farm directory", how);
}

void ch_supervisor_close(ch_supervisor_t *s)
{
    if (!s) return;
    close(s->cmd_fd);
    close(s->msg_fd);
    if (s->pid > 0) {
        pid_t w;
        do w = waitpid(s->pid, NULL, 0);
        while (w < 0 && errno == EINTR);
    }
    free(s);
}
