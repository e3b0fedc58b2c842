/* cohort: the task farm over MPI ranks (see farm.h for the design). */
#define _GNU_SOURCE
#include "framework/farm/farm.h"

#include "framework/core/log.h"
#include "io/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { TAG_RESULT = 1, TAG_TICK = 2, TAG_ERROR = 3, TAG_ASSIGN = 4, TAG_CTRL = 5 };
enum { CTRL_FINISH = 1, CTRL_KILL = 2 };

typedef struct {
    int64_t id;
    int32_t attempt;
    int32_t pad;
    double timeout;
} assign_t;

typedef struct {
    int64_t id; /* task whose slot failed, -1 if none */
    int32_t attempt;
    int32_t slot_dead;
    char msg[240];
} error_msg_t;

/* Task states on rank 0. */
enum { T_PENDING = 0, T_RUNNING, T_RETRY, T_DONE, T_SKIPPED, T_FAILED };

struct ch_farm {
    ch_farm_options_t o;
    MPI_Comm comm;
    int rank, size, slots;
    ch_supervisor_t **sup;
    int *slot_busy, *slot_dead;
    int64_t *slot_task;
    int *cpus, n_cpus;
    pthread_mutex_t mu;
    int wake[2];
    volatile int stop_poll;
    pthread_t poll_thread;
    int poll_started;
    int64_t n_tasks;
    /* rank 0 */
    ch_journal_state_t *js;
    int64_t waited, rerun_lost;
};

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void ch_farm_options_default(ch_farm_options_t *o)
{
    memset(o, 0, sizeof *o);
    o->cores_per_task = 1;
    o->bind = 1;
    o->output = CH_FARM_OUTPUT_FILES;
    o->sync = CH_JOURNAL_SYNC_ALL;
    o->retry_backoff = 1.0;
    o->kill_after = 5.0;
    o->preempt_grace = 60.0;
}

int ch_farm_slots(const ch_farm_t *f) { return f->slots; }

/* ------------------------------------------------------------ agreement */

/* Collective: every rank gets the lowest failing rank's status and message. */
static ch_status agree(MPI_Comm comm, int rank, ch_status local)
{
    int mine = local ? rank : INT32_MAX, lowest;
    MPI_Allreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, comm);
    if (lowest == INT32_MAX) return CH_OK;
    char msg[CH_ERROR_MAX];
    int code = local;
    if (rank == lowest) snprintf(msg, sizeof msg, "rank %d: %s", rank, ch_error_message());
    MPI_Bcast(msg, sizeof msg, MPI_CHAR, lowest, comm);
    MPI_Bcast(&code, 1, MPI_INT, lowest, comm);
    msg[sizeof msg - 1] = 0;
    return ch_error_adopt(code, msg);
}

/* ------------------------------------------------------------ setup */

/* This rank's share of the CPUs: its affinity mask, split between the ranks
 * of the node when they all have the same mask (no binding by the launcher). */
static ch_status cpu_share(ch_farm_t *f)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return CH_ERROR(CH_ERR_IO, "sched_getaffinity: %s", strerror(errno));
    int all[CPU_SETSIZE], n = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set)) all[n++] = c;
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < n; i++) h = (h ^ (uint64_t)all[i]) * 1099511628211ULL;
    MPI_Comm node;
    MPI_Comm_split_type(f->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int lrank, lsize;
    MPI_Comm_rank(node, &lrank);
    MPI_Comm_size(node, &lsize);
    unsigned long long hv = h, hmin, hmax;
    MPI_Allreduce(&hv, &hmin, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, node);
    MPI_Allreduce(&hv, &hmax, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, node);
    MPI_Comm_free(&node);
    int first = 0, count = n;
    if (hmin == hmax && lsize > 1) {
        /* same mask everywhere: contiguous chunks, the remainder to the first ranks */
        int base = n / lsize, extra = n % lsize;
        count = base + (lrank < extra);
        first = lrank * base + (lrank < extra ? lrank : extra);
        if (count == 0) { /* more ranks than CPUs: share them round-robin */
            count = 1;
            first = lrank % n;
        }
    }
    f->cpus = malloc(sizeof(int) * (size_t)count);
    if (!f->cpus) return CH_ERROR(CH_ERR_NOMEM, "out of memory");
    for (int i = 0; i < count; i++) f->cpus[i] = all[first + i];
    f->n_cpus = count;
    return CH_OK;
}

/* Rank 0: read the journal; others: nothing. Then wait, on every rank, for
 * the open attempts whose processes still run on this rank's host. */
static ch_status wait_for_open_attempts(ch_farm_t *f)
{
    ch_status s = CH_OK;
    const ch_taskfile_t *tf = f->o.tasks;
    int64_t n_open = 0;
    ch_journal_start_t *open = NULL;
    if (f->rank == 0) {
        s = ch_journal_scan(f->o.dir, ch_taskfile_checksum(tf), f->n_tasks, &f->js);
        if (!s && f->js->n_files > 0 && !f->o.resume)
            s = CH_ERROR(CH_ERR_CONFIG, "%s/journal holds the journal of an earlier run (%d "
                         "files): pass --resume to continue it, or choose a new farm.dir",
                         f->o.dir, f->js->n_files);
        if (!s && f->js->torn) ch_log_warn("%s", f->js->torn);
        if (!s)
            for (int64_t i = 0; i < f->n_tasks; i++) n_open += f->js->tasks[i].open;
    }
    CH_TRY(agree(f->comm, f->rank, s));
    long long nb = n_open;
    MPI_Bcast(&nb, 1, MPI_LONG_LONG, 0, f->comm);
    if (nb == 0) return CH_OK;
    open = calloc((size_t)nb, sizeof *open);
    s = open ? CH_OK : CH_ERROR(CH_ERR_NOMEM, "out of memory");
    CH_TRY(agree(f->comm, f->rank, s));
    if (f->rank == 0) {
        int64_t k = 0;
        for (int64_t i = 0; i < f->n_tasks; i++)
            if (f->js->tasks[i].open) open[k++] = f->js->tasks[i].last_start;
    }
    MPI_Bcast(open, (int)(nb * (long long)sizeof *open), MPI_BYTE, 0, f->comm);
    char host[CH_JOURNAL_HOST_MAX] = "";
    gethostname(host, sizeof host - 1);
    for (char *c = host; *c; c++)
        if (*c == ' ') *c = '_';
    long long waited = 0;
    for (long long i = 0; i < nb; i++) {
        const ch_journal_start_t *r = &open[i];
        if (strcmp(r->host, host) != 0) continue;
        int64_t pids[2] = {r->sup_pid, r->task_pid};
        uint64_t starts[2] = {r->sup_start, r->task_start};
        int was_alive = 0;
        for (int k = 0; k < 2; k++) {
            if (pids[k] <= 0 || starts[k] == 0 || ch_proc_start_time(pids[k]) != starts[k]) continue;
            int pfd = (int)syscall(SYS_pidfd_open, (pid_t)pids[k], 0);
            if (f->rank == 0 || !was_alive)
                ch_log_info("task %" PRId64 " attempt %d (pid %" PRId64 ") of an earlier run is "
                            "still running: waiting for it to end", r->id, r->attempt, r->task_pid);
            was_alive = 1;
            while (ch_proc_start_time(pids[k]) == starts[k]) {
                if (pfd >= 0) {
                    struct pollfd p = {pfd, POLLIN, 0};
                    poll(&p, 1, 1000);
                } else {
                    usleep(20000);
                }
            }
            if (pfd >= 0) close(pfd);
        }
        waited += was_alive;
    }
    free(open);
    long long total_waited = 0;
    MPI_Reduce(&waited, &total_waited, 1, MPI_LONG_LONG, MPI_MAX, 0, f->comm);
    MPI_Barrier(f->comm);
    if (f->rank == 0) {
        f->waited = total_waited;
        ch_journal_state_destroy(f->js);
        f->js = NULL;
        s = ch_journal_scan(f->o.dir, ch_taskfile_checksum(tf), f->n_tasks, &f->js);
    }
    return agree(f->comm, f->rank, s);
}

static void *poll_main(void *arg);

ch_status ch_farm_create(const ch_farm_options_t *o, MPI_Comm comm, ch_farm_t **out)
{
    CH_REQUIRE(o && o->tasks && o->dir && out, "ch_farm_create: NULL argument");
    *out = NULL;
    int rank, provided;
    MPI_Comm_rank(comm, &rank);
    MPI_Query_thread(&provided);
    ch_status s = CH_OK;
    if (provided < MPI_THREAD_MULTIPLE)
        s = CH_ERROR(CH_ERR_MPI, "the task farm needs MPI_THREAD_MULTIPLE (MPI gave level %d)",
                     provided);
    else if (o->cores_per_task < 1 || o->retries < 0 || o->slots_per_rank < 0 ||
             o->kill_after < 0 || o->timeout < 0 || o->preempt_grace < 0)
        s = CH_ERROR(CH_ERR_INVALID, "ch_farm_create: bad option (cores_per_task %d, retries %d, "
                     "slots %d)", o->cores_per_task, o->retries, o->slots_per_rank);
    ch_farm_t *f = s ? NULL : calloc(1, sizeof *f);
    if (!s && !f) s = CH_ERROR(CH_ERR_NOMEM, "out of memory");
    CH_TRY(agree(comm, rank, s));
    f->o = *o;
    f->rank = rank;
    f->wake[0] = f->wake[1] = -1;
    f->n_tasks = ch_taskfile_count(o->tasks);
    pthread_mutex_init(&f->mu, NULL);
    s = MPI_Comm_dup(comm, &f->comm) == MPI_SUCCESS ? CH_OK
                                                     : CH_ERROR(CH_ERR_MPI, "MPI_Comm_dup failed");
    if (s) {
        free(f);
        return agree(comm, rank, s);
    }
    MPI_Comm_size(f->comm, &f->size);
    *out = f;
    s = cpu_share(f);
    CH_TRY(agree(f->comm, rank, s));
    CH_TRY(wait_for_open_attempts(f));
    f->slots = o->slots_per_rank ? o->slots_per_rank : f->n_cpus / o->cores_per_task;
    if (f->slots < 1) f->slots = 1;
    f->sup = calloc((size_t)f->slots, sizeof *f->sup);
    f->slot_busy = calloc((size_t)f->slots, sizeof(int));
    f->slot_dead = calloc((size_t)f->slots, sizeof(int));
    f->slot_task = calloc((size_t)f->slots, sizeof(int64_t));
    s = f->sup && f->slot_busy && f->slot_dead && f->slot_task ? CH_OK
                                                              : CH_ERROR(CH_ERR_NOMEM, "out of memory");
    if (!s && pipe2(f->wake, O_CLOEXEC) != 0) s = CH_ERROR(CH_ERR_IO, "pipe: %s", strerror(errno));
    /* one options struct per slot (the child reads its copy after fork) */
    ch_supervisor_options_t so = {
        .tasks = o->tasks, .dir = o->dir, .rank = rank, .output = o->output,
        .kill_after = o->kill_after, .sync = o->sync,
    };
    int bind_cpus[CPU_SETSIZE];
    for (int k = 0; !s && k < f->slots; k++) {
        so.slot = k;
        so.cpus = NULL;
        so.n_cpus = 0;
        if (o->bind && f->n_cpus > 1) {
            int c = o->cores_per_task < f->n_cpus ? o->cores_per_task : f->n_cpus;
            for (int i = 0; i < c; i++) bind_cpus[i] = f->cpus[(k * c + i) % f->n_cpus];
            so.cpus = bind_cpus;
            so.n_cpus = c;
        }
        s = ch_supervisor_spawn(&so, &f->sup[k]);
    }
    if (!s) {
        if (pthread_create(&f->poll_thread, NULL, poll_main, f) != 0)
            s = CH_ERROR(CH_ERR_IO, "pthread_create failed");
        else
            f->poll_started = 1;
    }
    return agree(f->comm, rank, s);
}

static void stop_poll_thread(ch_farm_t *f)
{
    if (!f->poll_started) return;
    f->stop_poll = 1;
    char c = 1;
    (void)!write(f->wake[1], &c, 1);
    pthread_join(f->poll_thread, NULL);
    f->poll_started = 0;
}

void ch_farm_destroy(ch_farm_t *f)
{
    if (!f) return;
    stop_poll_thread(f);
    for (int k = 0; f->sup && k < f->slots; k++) ch_supervisor_close(f->sup[k]);
    free(f->sup);
    free(f->slot_busy);
    free(f->slot_dead);
    free(f->slot_task);
    free(f->cpus);
    if (f->wake[0] >= 0) close(f->wake[0]);
    if (f->wake[1] >= 0) close(f->wake[1]);
    ch_journal_state_destroy(f->js);
    pthread_mutex_destroy(&f->mu);
    if (f->comm != MPI_COMM_NULL && f->comm) MPI_Comm_free(&f->comm);
    free(f);
}

/* ------------------------------------------------------------ rank side */

/* The poll thread: supervisor messages -> results to rank 0; on rank 0 also
 * the once-a-second tick. */
static void *poll_main(void *arg)
{
    ch_farm_t *f = arg;
    int n = f->slots;
    struct pollfd *p = calloc((size_t)n + 1, sizeof *p);
    ch_journal_end_t *res = calloc((size_t)n, sizeof *res);
    if (!p || !res) {
        error_msg_t e = {-1, 0, 0, "rank's poll thread: out of memory"};
        MPI_Send(&e, sizeof e, MPI_BYTE, 0, TAG_ERROR, f->comm);
        free(p);
        free(res);
        return NULL;
    }
    while (!f->stop_poll) {
        p[0] = (struct pollfd){f->wake[0], POLLIN, 0};
        for (int k = 0; k < n; k++)
            p[k + 1] = (struct pollfd){f->slot_dead[k] ? -1 : ch_supervisor_fd(f->sup[k]), POLLIN, 0};
        int r = poll(p, (nfds_t)n + 1, f->rank == 0 ? 1000 : -1);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) {
            MPI_Send(NULL, 0, MPI_BYTE, 0, TAG_TICK, f->comm);
            continue;
        }
        if (p[0].revents) {
            char buf[64];
            (void)!read(f->wake[0], buf, sizeof buf);
            continue;
        }
        int nr = 0;
        for (int k = 0; k < n; k++) {
            if (!p[k + 1].revents) continue;
            ch_sup_msg_t m;
            ch_status s = ch_supervisor_read(f->sup[k], &m);
            if (s || m.type == CH_SUP_ERROR || (m.type == CH_SUP_DONE && m.error[0])) {
                error_msg_t e = {-1, 0, 0, ""};
                pthread_mutex_lock(&f->mu);
                if (s) {
                    f->slot_dead[k] = 1;
                    e.slot_dead = 1;
                    e.id = f->slot_busy[k] ? f->slot_task[k] : -1;
                }
                pthread_mutex_unlock(&f->mu);
                snprintf(e.msg, sizeof e.msg, "rank %d slot %d: %s", f->rank, k,
                         s ? ch_error_message() : m.error);
                MPI_Send(&e, sizeof e, MPI_BYTE, 0, TAG_ERROR, f->comm);
                if (s) continue;
            }
            if (m.type == CH_SUP_DONE) {
                pthread_mutex_lock(&f->mu);
                f->slot_busy[k] = 0;
                pthread_mutex_unlock(&f->mu);
                res[nr++] = m.end;
            }
        }
        if (nr)
            MPI_Send(res, nr * (int)sizeof *res, MPI_BYTE, 0, TAG_RESULT, f->comm);
    }
    free(p);
    free(res);
    return NULL;
}

/* Hand n assignments to this rank's free slots. */
static void run_local(ch_farm_t *f, const assign_t *a, int n)
{
    for (int i = 0; i < n; i++) {
        int k;
        pthread_mutex_lock(&f->mu);
        for (k = 0; k < f->slots; k++)
            if (!f->slot_busy[k] && !f->slot_dead[k]) break;
        if (k < f->slots) {
            f->slot_busy[k] = 1;
            f->slot_task[k] = a[i].id;
        }
        pthread_mutex_unlock(&f->mu);
        ch_status s = k < f->slots ? ch_supervisor_run(f->sup[k], a[i].id, a[i].attempt, a[i].timeout)
                                   : CH_ERROR(CH_ERR_INTERNAL, "no free slot for task %" PRId64,
                                              a[i].id);
        if (s) {
            error_msg_t e = {a[i].id, a[i].attempt, 1, ""};
            snprintf(e.msg, sizeof e.msg, "rank %d: %s", f->rank, ch_error_message());
            if (k < f->slots) {
                pthread_mutex_lock(&f->mu);
                f->slot_dead[k] = 1;
                pthread_mutex_unlock(&f->mu);
            }
            MPI_Send(&e, sizeof e, MPI_BYTE, 0, TAG_ERROR, f->comm);
        }
    }
}

static void interrupt_local(ch_farm_t *f)
{
    pthread_mutex_lock(&f->mu);
    for (int k = 0; k < f->slots; k++)
        if (f->slot_busy[k] && !f->slot_dead[k]) (void)ch_supervisor_interrupt(f->sup[k]);
    pthread_mutex_unlock(&f->mu);
}

static ch_status worker_loop(ch_farm_t *f)
{
    assign_t *a = malloc(sizeof *a * (size_t)f->slots);
    if (!a) return CH_ERROR(CH_ERR_NOMEM, "out of memory");
    for (;;) {
        MPI_Status st;
        int count;
        MPI_Probe(0, MPI_ANY_TAG, f->comm, &st);
        MPI_Get_count(&st, MPI_BYTE, &count);
        if (st.MPI_TAG == TAG_ASSIGN) {
            if (count > (int)(sizeof *a * (size_t)f->slots)) {
                free(a);
                return CH_ERROR(CH_ERR_INTERNAL, "assignment of %d bytes for %d slots", count,
                                f->slots);
            }
            MPI_Recv(a, count, MPI_BYTE, 0, TAG_ASSIGN, f->comm, MPI_STATUS_IGNORE);
            run_local(f, a, count / (int)sizeof *a);
        } else {
            int ctrl = 0;
            MPI_Recv(&ctrl, 1, MPI_INT, 0, st.MPI_TAG, f->comm, MPI_STATUS_IGNORE);
            if (ctrl == CTRL_KILL) interrupt_local(f);
            if (ctrl == CTRL_FINISH) break;
        }
    }
    free(a);
    return CH_OK;
}

/* ------------------------------------------------------------ rank 0 */

typedef struct {
    int64_t id;
    int64_t due; /* mono ns */
} retry_t;

typedef struct {
    ch_farm_t *f;
    int64_t n;
    unsigned char *state;
    int *attempt, *failures;
    int64_t *unresolved; /* per barrier epoch */
    int open_epoch, n_epochs;
    int64_t cursor;
    retry_t *retry;
    int64_t n_retry;
    int *free_slots;
    int64_t in_flight, final_failed_run, ended_run;
    double *dur;
    int64_t n_dur, dur_cap;
    double median;
    int64_t median_at;
    int stopping, killed, halted, error;
    int64_t grace_deadline;
    char error_msg[CH_ERROR_MAX];
    ch_farm_summary_t *sum;
} disp_t;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double task_timeout(disp_t *d)
{
    const ch_farm_options_t *o = &d->f->o;
    double t = o->timeout;
    if (o->timeout_median > 0 && d->n_dur >= 5) {
        if (d->n_dur >= 2 * d->median_at || d->median_at == 0) {
            double *c = malloc(sizeof *c * (size_t)d->n_dur);
            if (c) {
                memcpy(c, d->dur, sizeof *c * (size_t)d->n_dur);
                qsort(c, (size_t)d->n_dur, sizeof *c, cmp_double);
                d->median = c[d->n_dur / 2];
                d->median_at = d->n_dur;
                free(c);
            }
        }
        double tm = o->timeout_median * d->median;
        if (tm < 0.001) tm = 0.001;
        t = t > 0 && t < tm ? t : tm;
    }
    return t;
}

static void resolve(disp_t *d, int64_t id, int state)
{
    d->state[id] = (unsigned char)state;
    int e = ch_taskfile_task(d->f->o.tasks, id)->barrier;
    d->unresolved[e]--;
    while (d->open_epoch < d->n_epochs && d->unresolved[d->open_epoch] == 0) d->open_epoch++;
}

/* Next task to start, or -1. */
static int64_t next_task(disp_t *d, int64_t now)
{
    for (int64_t i = 0; i < d->n_retry; i++) {
        if (d->retry[i].due <= now) {
            int64_t id = d->retry[i].id;
            d->retry[i] = d->retry[--d->n_retry];
            return id;
        }
    }
    const ch_taskfile_t *tf = d->f->o.tasks;
    while (d->cursor < d->n && d->state[d->cursor] != T_PENDING) d->cursor++;
    if (d->cursor < d->n && ch_taskfile_task(tf, d->cursor)->barrier <= d->open_epoch)
        return d->cursor++;
    return -1;
}

static void dispatch(disp_t *d, assign_t *buf)
{
    ch_farm_t *f = d->f;
    int64_t now = mono_ns();
    for (int w0 = 0; w0 < f->size; w0++) {
        int w = w0;
        int n = 0;
        while (d->free_slots[w] > 0) {
            int64_t id = next_task(d, now);
            if (id < 0) break;
            d->state[id] = T_RUNNING;
            if (d->failures[id] > 0) d->sum->retried++;
            buf[n++] = (assign_t){id, ++d->attempt[id], 0, task_timeout(d)};
            d->free_slots[w]--;
            d->in_flight++;
            d->sum->attempts++;
        }
        if (!n) continue;
        if (w == 0)
            run_local(f, buf, n);
        else
            MPI_Send(buf, n * (int)sizeof *buf, MPI_BYTE, w, TAG_ASSIGN, f->comm);
    }
}

static void broadcast_ctrl(disp_t *d, int ctrl)
{
    for (int w = 1; w < d->f->size; w++) MPI_Send(&ctrl, 1, MPI_INT, w, TAG_CTRL, d->f->comm);
    if (ctrl == CTRL_KILL) interrupt_local(d->f);
}

static void add_slowest(ch_farm_summary_t *s, int64_t id, double sec)
{
    for (int i = 0; i < CH_FARM_SLOWEST; i++) {
        if (s->slowest_id[i] < 0 || sec > s->slowest_s[i]) {
            for (int k = CH_FARM_SLOWEST - 1; k > i; k--) {
                s->slowest_id[k] = s->slowest_id[k - 1];
                s->slowest_s[k] = s->slowest_s[k - 1];
            }
            s->slowest_id[i] = id;
            s->slowest_s[i] = sec;
            return;
        }
    }
}

static void halt(disp_t *d)
{
    if (d->halted) return;
    d->halted = 1;
    ch_log_warn("farm.halt: %" PRId64 " tasks failed (of %" PRId64 " ended): no new tasks start%s",
                d->final_failed_run, d->ended_run,
                d->f->o.halt_now ? "; running tasks are stopped" : "; running tasks finish");
    if (d->f->o.halt_now && !d->killed) {
        d->killed = 1;
        broadcast_ctrl(d, CTRL_KILL);
    }
}

static void on_result(disp_t *d, const ch_journal_end_t *r)
{
    ch_farm_summary_t *s = d->sum;
    const ch_farm_options_t *o = &d->f->o;
    int64_t id = r->id;
    d->in_flight--;
    d->free_slots[r->rank]++;
    double sec = (double)(r->end_ns - r->start_ns) / 1e9;
    if (r->kind == CH_END_EXIT) s->exit_codes[r->code & 255]++;
    else if (r->kind == CH_END_SIGNAL || r->kind == CH_END_TIMEOUT) s->exit_codes[256]++;
    add_slowest(s, id, sec);
    if (r->kind == CH_END_EXIT && r->code == 0) {
        d->ended_run++;
        resolve(d, id, T_DONE);
        if (d->n_dur == d->dur_cap) {
            int64_t cap = d->dur_cap ? 2 * d->dur_cap : 1024;
            double *p = realloc(d->dur, sizeof *p * (size_t)cap);
            if (p) {
                d->dur = p;
                d->dur_cap = cap;
            }
        }
        if (d->n_dur < d->dur_cap) d->dur[d->n_dur++] = sec;
        return;
    }
    if (r->kind == CH_END_INTERRUPTED) {
        s->interrupted++;
        /* not a failure: run it again (now, unless the farm is stopping) */
        d->state[id] = T_RETRY;
        d->retry[d->n_retry++] = (retry_t){id, 0};
        return;
    }
    if (r->kind == CH_END_TIMEOUT) s->timed_out++;
    d->failures[id]++;
    if (d->failures[id] <= o->retries) {
        double b = o->retry_backoff * pow(2.0, d->failures[id] - 1);
        if (b > 300) b = 300;
        d->state[id] = T_RETRY;
        d->retry[d->n_retry++] = (retry_t){id, mono_ns() + (int64_t)(b * 1e9)};
        return;
    }
    d->ended_run++;
    d->final_failed_run++;
    resolve(d, id, T_FAILED);
    if ((o->halt_after > 0 && d->final_failed_run >= o->halt_after) ||
        (o->halt_fraction > 0 && d->ended_run >= 10 &&
         (double)d->final_failed_run >= o->halt_fraction * (double)d->ended_run))
        halt(d);
}

static void progress(disp_t *d, int force, int64_t t0, int64_t *last)
{
    const ch_farm_options_t *o = &d->f->o;
    if (!o->progress) return;
    int64_t now = mono_ns();
    if (!force && now - *last < 500000000) return; /* at most two redraws a second */
    *last = now;
    int64_t ended = 0, failed = 0;
    for (int64_t i = 0; i < d->n; i++) {
        ended += d->state[i] >= T_DONE;
        failed += d->state[i] == T_FAILED;
    }
    double el = (double)(now - t0) / 1e9;
    double rate = el > 0 ? (double)d->ended_run / el : 0;
    char text[160];
    if (rate > 0 && ended < d->n)
        snprintf(text, sizeof text, "%.1f tasks/s, ETA %.0f s, %" PRId64 " failed", rate,
                 (double)(d->n - ended) / rate, failed);
    else
        snprintf(text, sizeof text, "%.1f tasks/s, %" PRId64 " failed", rate, failed);
    o->progress(o->cb_arg, ended, d->n, text);
}

static ch_status dispatcher(ch_farm_t *f, ch_farm_summary_t *sum)
{
    const ch_farm_options_t *o = &f->o;
    disp_t d;
    memset(&d, 0, sizeof d);
    d.f = f;
    d.sum = sum;
    d.n = f->n_tasks;
    d.n_epochs = ch_taskfile_barriers(o->tasks) + 1;
    d.state = calloc((size_t)d.n, 1);
    d.attempt = calloc((size_t)d.n, sizeof(int));
    d.failures = calloc((size_t)d.n, sizeof(int));
    d.unresolved = calloc((size_t)d.n_epochs, sizeof(int64_t));
    d.retry = calloc((size_t)d.n, sizeof(retry_t));
    d.free_slots = calloc((size_t)f->size, sizeof(int));
    size_t msg_cap = sizeof(ch_journal_end_t) * (size_t)f->slots * 64 + sizeof(error_msg_t);
    void *msg = malloc(msg_cap);
    assign_t *abuf = malloc(sizeof *abuf * (size_t)f->slots);
    ch_status st = CH_OK;
    if (!d.state || !d.attempt || !d.failures || !d.unresolved || !d.retry || !d.free_slots ||
        !msg || !abuf) {
        st = CH_ERROR(CH_ERR_NOMEM, "out of memory for %" PRId64 " tasks", d.n);
        d.error = 1;
        snprintf(d.error_msg, sizeof d.error_msg, "%s", ch_error_message());
        goto finish;
    }
    for (int w = 0; w < f->size; w++) d.free_slots[w] = f->slots;
    for (int64_t i = 0; i < d.n; i++) d.unresolved[ch_taskfile_task(o->tasks, i)->barrier]++;
    /* the journal of earlier runs */
    for (int64_t i = 0; i < d.n; i++) {
        const ch_journal_task_t *t = &f->js->tasks[i];
        d.attempt[i] = t->attempts;
        d.failures[i] = t->failures;
        if (t->done) {
            resolve(&d, i, T_SKIPPED);
            sum->skipped++;
        } else if (t->open) {
            f->rerun_lost++;
        } else if (t->has_end && ch_end_is_failure(t->last_end.kind, t->last_end.code) &&
                   t->failures > o->retries) {
            if (o->resume_failed) d.failures[i] = 0;
            else resolve(&d, i, T_FAILED);
        }
    }
    sum->waited = f->waited;
    sum->rerun_lost = f->rerun_lost;
    if (f->rerun_lost)
        ch_log_warn("%" PRId64 " tasks were running when an earlier run died and their processes "
                    "are gone without an end record: they run again (their effects may be partial)",
                    f->rerun_lost);
    while (d.open_epoch < d.n_epochs && d.unresolved[d.open_epoch] == 0) d.open_epoch++;
    int64_t t0 = mono_ns(), last_progress = 0, since_check = 0;
    for (;;) {
        if (!d.stopping && !d.halted && !d.error) dispatch(&d, abuf);
        int all_resolved = d.open_epoch >= d.n_epochs;
        if (d.in_flight == 0 && (d.stopping || d.halted || d.error || all_resolved)) break;
        if (d.in_flight == 0 && d.n_retry == 0 && next_task(&d, mono_ns()) < 0) {
            /* cannot happen: nothing runs, nothing waits, yet tasks are unresolved */
            d.error = 1;
            snprintf(d.error_msg, sizeof d.error_msg, "dispatcher stalled with %" PRId64
                     " unresolved tasks (bug)", d.unresolved[d.open_epoch]);
            break;
        }
        MPI_Status ms;
        int count;
        MPI_Probe(MPI_ANY_SOURCE, MPI_ANY_TAG, f->comm, &ms);
        MPI_Get_count(&ms, MPI_BYTE, &count);
        if ((size_t)count > msg_cap) {
            void *p = realloc(msg, (size_t)count);
            if (!p) {
                st = CH_ERROR(CH_ERR_NOMEM, "out of memory for a message of %d bytes", count);
                break;
            }
            msg = p;
            msg_cap = (size_t)count;
        }
        MPI_Recv(msg, count, MPI_BYTE, ms.MPI_SOURCE, ms.MPI_TAG, f->comm, MPI_STATUS_IGNORE);
        int check = 0;
        if (ms.MPI_TAG == TAG_RESULT) {
            const ch_journal_end_t *r = msg;
            int nr = count / (int)sizeof *r;
            for (int i = 0; i < nr; i++) {
                on_result(&d, &r[i]);
                if (r[i].kind == CH_END_INTERRUPTED) check = 1; /* a signal reached the tasks */
            }
            since_check += nr;
            if (since_check >= 64) check = 1;
            progress(&d, 0, t0, &last_progress);
        } else if (ms.MPI_TAG == TAG_ERROR) {
            const error_msg_t *e = msg;
            ch_log_error("%s", e->msg);
            if (!d.error) snprintf(d.error_msg, sizeof d.error_msg, "%s", e->msg);
            d.error = 1;
            if (e->slot_dead && e->id >= 0) {
                d.in_flight--;
                d.state[e->id] = T_PENDING; /* the journal decides on resume */
            }
        } else if (ms.MPI_TAG == TAG_TICK) {
            check = 1;
            progress(&d, 0, t0, &last_progress);
        }
        if (check) {
            since_check = 0;
            if (!d.stopping && o->should_stop && o->should_stop(o->cb_arg)) {
                d.stopping = 1;
                d.grace_deadline = mono_ns() + (int64_t)(o->preempt_grace * 1e9);
                ch_log_warn("stop requested: no new tasks start; %" PRId64 " running tasks get "
                            "%.0f s to finish", d.in_flight, o->preempt_grace);
            }
            if (d.stopping && !d.killed && d.in_flight > 0 && mono_ns() >= d.grace_deadline) {
                ch_log_warn("grace time over: stopping %" PRId64 " running tasks (recorded as "
                            "interrupted; they run again on resume)", d.in_flight);
                d.killed = 1;
                broadcast_ctrl(&d, CTRL_KILL);
            }
        }
    }
    progress(&d, 1, t0, &last_progress);
    sum->seconds = (double)(mono_ns() - t0) / 1e9;
    for (int64_t i = 0; i < d.n; i++) {
        sum->done += d.state[i] == T_DONE || d.state[i] == T_SKIPPED;
        sum->failed += d.state[i] == T_FAILED;
        sum->not_run += d.state[i] < T_DONE;
    }
    sum->stop = d.stopping ? CH_FARM_PREEMPTED : d.halted ? CH_FARM_HALTED : CH_FARM_FINISHED;
finish:
    broadcast_ctrl(&d, CTRL_FINISH);
    free(d.state);
    free(d.attempt);
    free(d.failures);
    free(d.unresolved);
    free(d.retry);
    free(d.free_slots);
    free(d.dur);
    free(msg);
    free(abuf);
    if (!st && d.error) st = ch_error_adopt(CH_ERR_IO, d.error_msg);
    return st;
}

ch_status ch_farm_run(ch_farm_t *f, ch_farm_summary_t *sum)
{
    CH_REQUIRE(f && sum, "ch_farm_run: NULL argument");
    memset(sum, 0, sizeof *sum);
    for (int i = 0; i < CH_FARM_SLOWEST; i++) sum->slowest_id[i] = -1;
    sum->total = f->n_tasks;
    sum->world_size = f->size;
    sum->slots_per_rank = f->slots;
    ch_status s = f->rank == 0 ? dispatcher(f, sum) : worker_loop(f);
    /* every rank waits until its own slots are idle and stops polling */
    for (;;) {
        int busy = 0;
        pthread_mutex_lock(&f->mu);
        for (int k = 0; k < f->slots; k++) busy += f->slot_busy[k] && !f->slot_dead[k];
        pthread_mutex_unlock(&f->mu);
        if (!busy) break;
        usleep(1000); /* only after an error: the dispatcher ends with nothing running */
    }
    stop_poll_thread(f);
    if (f->rank == 0) {
        /* ticks the poll thread sent after the dispatcher's last receive */
        int flag;
        MPI_Status ms;
        for (;;) {
            MPI_Iprobe(0, TAG_TICK, f->comm, &flag, &ms);
            if (!flag) break;
            MPI_Recv(NULL, 0, MPI_BYTE, 0, TAG_TICK, f->comm, MPI_STATUS_IGNORE);
        }
    }
    MPI_Bcast(sum, sizeof *sum, MPI_BYTE, 0, f->comm);
    return agree(f->comm, f->rank, s);
}

/* ------------------------------------------------------------ reporting */

static int cmp_end(const void *a, const void *b)
{
    const ch_journal_end_t *x = a, *y = b;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return (x->attempt > y->attempt) - (x->attempt < y->attempt);
}

static int cmp_start(const void *a, const void *b)
{
    const ch_journal_start_t *x = a, *y = b;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return (x->attempt > y->attempt) - (x->attempt < y->attempt);
}

ch_status ch_farm_write_status(ch_farm_t *f)
{
    if (f->rank != 0) return CH_OK;
    ch_journal_state_t *js;
    CH_TRY(ch_journal_scan(f->o.dir, ch_taskfile_checksum(f->o.tasks), f->n_tasks, &js));
    qsort(js->ends, (size_t)js->n_ends, sizeof *js->ends, cmp_end);
    size_t pl = strlen(f->o.dir) + 16;
    char *path = malloc(pl);
    if (!path) {
        ch_journal_state_destroy(js);
        return CH_ERROR(CH_ERR_NOMEM, "out of memory");
    }
    snprintf(path, pl, "%s/status.tsv", f->o.dir);
    ch_atomic_file_t *af;
    ch_status s = ch_atomic_file_open(&af, path);
    if (s) {
        free(path);
        ch_journal_state_destroy(js);
        return s;
    }
    qsort(js->starts, (size_t)js->n_starts, sizeof *js->starts, cmp_start);
    char line[8192], cmd[4001];
    int n = snprintf(line, sizeof line, "id\tattempt\trank\tslot\thost\tstart\tend\tseconds\t"
                     "status\tcode\tstdout_bytes\tstderr_bytes\tline\tcommand\n");
    s = ch_atomic_file_write(af, line, (size_t)n);
    int64_t k = 0;
    for (int64_t i = 0; !s && i < js->n_ends; i++) {
        const ch_journal_end_t *e = &js->ends[i];
        /* both lists are sorted by (id, attempt): walk them together */
        while (k < js->n_starts && (js->starts[k].id < e->id ||
                                    (js->starts[k].id == e->id && js->starts[k].attempt < e->attempt)))
            k++;
        const char *host = k < js->n_starts && js->starts[k].id == e->id &&
                                   js->starts[k].attempt == e->attempt
                               ? js->starts[k].host
                               : "-";
        const ch_task_t *t = ch_taskfile_task(f->o.tasks, e->id);
        snprintf(cmd, sizeof cmd, "%s", t->command);
        for (char *c = cmd; *c; c++)
            if (*c == '\t' || *c == '\n' || *c == '\r') *c = ' ';
        n = snprintf(line, sizeof line,
                     "%" PRId64 "\t%d\t%d\t%d\t%s\t%.3f\t%.3f\t%.3f\t%s\t%d\t%" PRId64 "\t%" PRId64
                     "\t%d\t%s\n", e->id, e->attempt, e->rank, e->slot, host,
                     (double)e->start_ns / 1e9, (double)e->end_ns / 1e9,
                     (double)(e->end_ns - e->start_ns) / 1e9, ch_end_kind_name(e->kind), e->code,
                     e->out_bytes, e->err_bytes, t->line, cmd);
        s = ch_atomic_file_write(af, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    }
    if (!s) s = ch_atomic_file_commit(af);
    else ch_atomic_file_abort(af);
    free(path);
    ch_journal_state_destroy(js);
    return s;
}

void ch_farm_print_summary(const ch_farm_t *f, const ch_farm_summary_t *s, FILE *out)
{
    if (f->rank != 0) return;
    static const char *const how[] = {"finished", "stopped (preemption or stop request)",
                                      "halted (farm.halt)"};
    fprintf(out, "cohort-farm: %s: %" PRId64 " tasks, %" PRId64 " done (%" PRId64 " already done "
            "before), %" PRId64 " failed, %" PRId64 " not run\n", how[s->stop], s->total, s->done,
            s->skipped, s->failed, s->not_run);
    fprintf(out, "  this run: %" PRId64 " attempts on %d ranks x %d slots in %.2f s (%.1f "
            "tasks/s), %" PRId64 " retries, %" PRId64 " timed out, %" PRId64 " interrupted\n",
            s->attempts, s->world_size, s->slots_per_rank, s->seconds,
            s->seconds > 0 ? (double)s->attempts / s->seconds : 0.0, s->retried, s->timed_out,
            s->interrupted);
    if (s->waited || s->rerun_lost)
        fprintf(out, "  earlier run: %" PRId64 " running tasks waited for, %" PRId64 " lost ones "
                "run again\n", s->waited, s->rerun_lost);
    int any = 0;
    for (int c = 0; c < 257; c++) {
        if (!s->exit_codes[c]) continue;
        if (!any) fprintf(out, "  exit codes:");
        any = 1;
        if (c == 256) fprintf(out, " signal x%" PRId64, s->exit_codes[c]);
        else fprintf(out, " %d x%" PRId64, c, s->exit_codes[c]);
    }
    if (any) fprintf(out, "\n");
    if (s->slowest_id[0] >= 0) {
        fprintf(out, "  slowest:");
        for (int i = 0; i < CH_FARM_SLOWEST && s->slowest_id[i] >= 0; i++)
            fprintf(out, " task %" PRId64 " %.3f s%s", s->slowest_id[i], s->slowest_s[i],
                    i + 1 < CH_FARM_SLOWEST && s->slowest_id[i + 1] >= 0 ? "," : "");
        fprintf(out, "\n");
    }
    fprintf(out, "  status table: %s/status.tsv\n", f->o.dir);
}
