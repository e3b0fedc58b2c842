/* cohort: the task farm over MPI ranks (see farm.h for the design). */
#define _GNU_SOURCE
#include "framework/farm/farm.h"

#include "framework/core/log.h"
#include "io/state/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Frames on the rank-0 <-> worker streams: a header, then len bytes. */
enum { MSG_RESULT = 1, MSG_ERROR = 2, MSG_ASSIGN = 3, MSG_CTRL = 4 };
enum { CTRL_FINISH = 1, CTRL_KILL = 2 };
typedef struct {
    uint32_t type, len;
} frame_t;

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
    int32_t n_lost, pad; /* slot_dead: the tasks the slot held */
    int64_t lost[CH_SUP_QUEUE + 1];
    char msg[240];
} error_msg_t;

/* An ended attempt as sent to rank 0 (started 0: a queued task handed back). */
typedef struct {
    ch_journal_end_t end;
    int32_t started, pad;
} result_t;

/* Task states on rank 0. */
enum { T_PENDING = 0, T_RUNNING, T_RETRY, T_DONE, T_SKIPPED, T_FAILED };

/* One end of a stream with its input buffer. */
typedef struct {
    int fd;
    char *in;
    size_t len, cap;
} conn_t;

struct ch_farm {
    ch_farm_options_t o;
    MPI_Comm comm;
    int rank, size, slots;
    ch_supervisor_t **sup;
    int depth;      /* tasks a slot holds: 1 running + farm.prefetch queued */
    int *slot_busy; /* tasks held by slot k (0..depth) */
    int *slot_dead;
    int64_t *slot_task; /* [k * (CH_SUP_QUEUE + 1) + j]: the ids slot k holds, in order */
    int *cpus, n_cpus;
    conn_t *conns; /* rank 0: one per worker rank (index = rank); worker: conns[0] to rank 0 */
    int n_conns;
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
    o->prefetch = 1;
    o->output = CH_FARM_OUTPUT_FILES;
    o->sync = CH_JOURNAL_SYNC_BATCH;
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

ch_status ch_farm_cpu_share(MPI_Comm comm, int **out, int *n_out)
{
    *out = NULL;
    *n_out = 0;
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
    MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
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
    int *cpus = malloc(sizeof(int) * (size_t)count);
    if (!cpus) return CH_ERROR(CH_ERR_NOMEM, "out of memory");
    for (int i = 0; i < count; i++) cpus[i] = all[first + i];
    *out = cpus;
    *n_out = count;
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
        if (mkdir(f->o.dir, 0777) != 0 && errno != EEXIST)
            s = CH_ERROR(CH_ERR_IO, "cannot create the farm directory %s: %s", f->o.dir,
                         strerror(errno));
        if (!s) s = ch_journal_scan(f->o.dir, ch_taskfile_checksum(tf), f->n_tasks, &f->js);
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
    /* ranks of other hosts may wait for hours: a barrier that does not spin */
    MPI_Request req;
    MPI_Ibarrier(f->comm, &req);
    for (int done = 0;;) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (done) break;
        usleep(50000);
    }
    long long total_waited = 0;
    MPI_Reduce(&waited, &total_waited, 1, MPI_LONG_LONG, MPI_MAX, 0, f->comm);
    if (f->rank == 0) {
        f->waited = total_waited;
        ch_journal_state_destroy(f->js);
        f->js = NULL;
        s = ch_journal_scan(f->o.dir, ch_taskfile_checksum(tf), f->n_tasks, &f->js);
    }
    return agree(f->comm, f->rank, s);
}

/* ------------------------------------------------------------ streams */

static ch_status send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return CH_ERROR(CH_ERR_IO, "farm stream: send: %s", strerror(errno));
        c += w;
        n -= (size_t)w;
    }
    return CH_OK;
}

static ch_status write_frame(int fd, int type, const void *p, size_t len)
{
    frame_t h = {(uint32_t)type, (uint32_t)len};
    char buf[4096];
    if (len + sizeof h > sizeof buf) { /* large: header, then body */
        CH_TRY(send_all(fd, &h, sizeof h));
        return send_all(fd, p, len);
    }
    memcpy(buf, &h, sizeof h);
    if (len) memcpy(buf + sizeof h, p, len);
    return send_all(fd, buf, len + sizeof h);
}

/* Read what is there into c->in. Returns 1 on data, 0 at end of stream, -1 on error. */
static int conn_read(conn_t *c)
{
    if (c->cap - c->len < 65536) {
        size_t cap = c->cap ? 2 * c->cap : 131072;
        char *p = realloc(c->in, cap);
        if (!p) return -1;
        c->in = p;
        c->cap = cap;
    }
    ssize_t r;
    do r = recv(c->fd, c->in + c->len, c->cap - c->len, 0);
    while (r < 0 && errno == EINTR);
    if (r < 0) return -1;
    if (r == 0) return 0;
    c->len += (size_t)r;
    return 1;
}

/* The next complete frame in c->in (header in *h, body at *body), or 0. */
static int conn_frame(conn_t *c, size_t *off, frame_t *h, const char **body)
{
    if (c->len - *off < sizeof *h) return 0;
    memcpy(h, c->in + *off, sizeof *h);
    if (c->len - *off - sizeof *h < h->len) return 0;
    *body = c->in + *off + sizeof *h;
    *off += sizeof *h + h->len;
    return 1;
}

static void conn_consumed(conn_t *c, size_t off)
{
    memmove(c->in, c->in + off, c->len - off);
    c->len -= off;
}

static void nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Rank 0 listens on a TCP port of its host; every worker connects and says
 * its rank. (MPI carries only setup and the final summary: a blocking MPI
 * receive spins a core in MPICH, which would take it from the tasks.) */
static ch_status connect_ranks(ch_farm_t *f)
{
    char host[256] = "";
    int port = 0, lfd = -1;
    ch_status s = CH_OK;
    f->n_conns = f->rank == 0 ? f->size : 1;
    f->conns = calloc((size_t)f->n_conns, sizeof *f->conns);
    if (!f->conns) s = CH_ERROR(CH_ERR_NOMEM, "out of memory");
    for (int i = 0; f->conns && i < f->n_conns; i++) f->conns[i].fd = -1;
    if (!s && f->rank == 0 && f->size > 1) {
        /* IPv6 (dual stack: IPv4 clients too), or IPv4 where IPv6 is off */
        struct sockaddr_in6 a6;
        struct sockaddr_in a4;
        memset(&a6, 0, sizeof a6);
        memset(&a4, 0, sizeof a4);
        a6.sin6_family = AF_INET6;
        a6.sin6_addr = in6addr_any;
        a4.sin_family = AF_INET;
        a4.sin_addr.s_addr = htonl(INADDR_ANY);
        lfd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int v6 = lfd >= 0;
        if (!v6) lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr *a = v6 ? (struct sockaddr *)&a6 : (struct sockaddr *)&a4;
        socklen_t al = v6 ? sizeof a6 : sizeof a4;
        if (lfd < 0 || bind(lfd, a, al) != 0 || listen(lfd, f->size) != 0 ||
            getsockname(lfd, a, &al) != 0)
            s = CH_ERROR(CH_ERR_IO, "farm: rank 0 cannot listen on a TCP port: %s", strerror(errno));
        port = ntohs(v6 ? a6.sin6_port : a4.sin_port);
        gethostname(host, sizeof host - 1);
    }
    CH_TRY(agree(f->comm, f->rank, s));
    if (f->size == 1) return CH_OK;
    MPI_Bcast(host, sizeof host, MPI_CHAR, 0, f->comm);
    MPI_Bcast(&port, 1, MPI_INT, 0, f->comm);
    if (f->rank != 0) {
        char mine[256] = "", ps[16];
        gethostname(mine, sizeof mine - 1);
        snprintf(ps, sizeof ps, "%d", port);
        struct addrinfo hints, *res = NULL, *ai;
        memset(&hints, 0, sizeof hints);
        hints.ai_socktype = SOCK_STREAM;
        const char *target = strcmp(mine, host) == 0 ? "localhost" : host;
        int e = getaddrinfo(target, ps, &hints, &res);
        int fd = -1;
        for (ai = e ? NULL : res; ai; ai = ai->ai_next) {
            fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
            if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
            if (fd >= 0) close(fd);
            fd = -1;
        }
        if (res) freeaddrinfo(res);
        if (fd < 0)
            s = CH_ERROR(CH_ERR_IO, "farm: cannot connect to rank 0 at %s port %d: %s", target,
                         port, e ? gai_strerror(e) : strerror(errno));
        else {
            nodelay(fd);
            int32_t r = f->rank;
            if (send(fd, &r, sizeof r, MSG_NOSIGNAL) != (ssize_t)sizeof r)
                s = CH_ERROR(CH_ERR_IO, "farm: send to rank 0: %s", strerror(errno));
            f->conns[0].fd = fd;
        }
    } else {
        for (int i = 1; !s && i < f->size; i++) {
            struct pollfd p = {lfd, POLLIN, 0};
            if (poll(&p, 1, 60000) != 1) {
                s = CH_ERROR(CH_ERR_IO, "farm: only %d of %d ranks connected to rank 0 (port %d) "
                             "within 60 s", i - 1, f->size - 1, port);
                break;
            }
            int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
            int32_t r = -1;
            if (fd < 0 || recv(fd, &r, sizeof r, MSG_WAITALL) != (ssize_t)sizeof r || r < 1 ||
                r >= f->size || f->conns[r].fd >= 0) {
                s = CH_ERROR(CH_ERR_IO, "farm: bad connection to rank 0 (rank %d)", (int)r);
                if (fd >= 0) close(fd);
                break;
            }
            nodelay(fd);
            f->conns[r].fd = fd;
        }
    }
    if (lfd >= 0) close(lfd);
    return agree(f->comm, f->rank, s);
}

ch_status ch_farm_create(const ch_farm_options_t *o, MPI_Comm comm, ch_farm_t **out)
{
    CH_REQUIRE(o && o->tasks && o->dir && out, "ch_farm_create: NULL argument");
    *out = NULL;
    int rank;
    MPI_Comm_rank(comm, &rank);
    ch_status s = CH_OK;
    if (o->cores_per_task < 1 || o->retries < 0 || o->slots_per_rank < 0 || o->kill_after < 0 ||
        o->timeout < 0 || o->preempt_grace < 0)
        s = CH_ERROR(CH_ERR_INVALID, "ch_farm_create: bad option (cores_per_task %d, retries %d, "
                     "slots %d)", o->cores_per_task, o->retries, o->slots_per_rank);
    ch_farm_t *f = s ? NULL : calloc(1, sizeof *f);
    if (!s && !f) s = CH_ERROR(CH_ERR_NOMEM, "out of memory");
    CH_TRY(agree(comm, rank, s));
    f->o = *o;
    f->rank = rank;
    f->n_tasks = ch_taskfile_count(o->tasks);
    s = MPI_Comm_dup(comm, &f->comm) == MPI_SUCCESS ? CH_OK
                                                     : CH_ERROR(CH_ERR_MPI, "MPI_Comm_dup failed");
    if (s) {
        free(f);
        return agree(comm, rank, s);
    }
    MPI_Comm_size(f->comm, &f->size);
    *out = f;
    s = ch_farm_cpu_share(f->comm, &f->cpus, &f->n_cpus);
    CH_TRY(agree(f->comm, rank, s));
    CH_TRY(wait_for_open_attempts(f));
    f->slots = o->slots_per_rank ? o->slots_per_rank : f->n_cpus / o->cores_per_task;
    if (f->slots < 1) f->slots = 1;
    f->sup = calloc((size_t)f->slots, sizeof *f->sup);
    f->slot_busy = calloc((size_t)f->slots, sizeof(int));
    f->slot_dead = calloc((size_t)f->slots, sizeof(int));
    f->slot_task = calloc((size_t)f->slots * (CH_SUP_QUEUE + 1), sizeof(int64_t));
    f->depth = 1 + (o->prefetch < 0 ? 0 : o->prefetch > CH_SUP_QUEUE ? CH_SUP_QUEUE : o->prefetch);
    s = f->sup && f->slot_busy && f->slot_dead && f->slot_task ? CH_OK
                                                              : CH_ERROR(CH_ERR_NOMEM, "out of memory");
    /* the supervisors are forked before any socket exists, so none inherits one */
    ch_supervisor_options_t so = {
        .tasks = o->tasks, .dir = o->dir, .rank = rank, .output = o->output,
        .kill_after = o->kill_after, .sync = o->sync, .ignore_signal = o->ignore_signal,
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
    CH_TRY(agree(f->comm, rank, s));
    return connect_ranks(f);
}

void ch_farm_destroy(ch_farm_t *f)
{
    if (!f) return;
    for (int i = 0; f->conns && i < f->n_conns; i++) {
        if (f->conns[i].fd >= 0) close(f->conns[i].fd);
        free(f->conns[i].in);
    }
    free(f->conns);
    for (int k = 0; f->sup && k < f->slots; k++) ch_supervisor_close(f->sup[k]);
    free(f->sup);
    free(f->slot_busy);
    free(f->slot_dead);
    free(f->slot_task);
    free(f->cpus);
    ch_journal_state_destroy(f->js);
    if (f->comm != MPI_COMM_NULL && f->comm) MPI_Comm_free(&f->comm);
    free(f);
}

/* ------------------------------------------------------------ rank side */

/* Hand n assignments to this rank's free slots. A failure is returned as an
 * error message for rank 0 in *e (e->msg[0] != 0). */
static void run_local(ch_farm_t *f, const assign_t *a, int n, error_msg_t *e)
{
    for (int i = 0; i < n; i++) {
        int k = f->slots; /* the least loaded live slot with room */
        for (int j = 0; j < f->slots; j++)
            if (!f->slot_dead[j] && f->slot_busy[j] < f->depth &&
                (k == f->slots || f->slot_busy[j] < f->slot_busy[k]))
                k = j;
        ch_status s = k < f->slots ? ch_supervisor_run(f->sup[k], a[i].id, a[i].attempt, a[i].timeout)
                                   : CH_ERROR(CH_ERR_INTERNAL, "no free slot for task %" PRId64,
                                              a[i].id);
        if (!s) {
            f->slot_task[k * (CH_SUP_QUEUE + 1) + f->slot_busy[k]++] = a[i].id;
            continue;
        }
        if (k < f->slots) f->slot_dead[k] = 1;
        *e = (error_msg_t){.id = a[i].id, .attempt = a[i].attempt, .slot_dead = 1, .n_lost = 1, .lost = {a[i].id}};
        snprintf(e->msg, sizeof e->msg, "rank %d: %s", f->rank, ch_error_message());
    }
}

static void interrupt_local(ch_farm_t *f)
{
    for (int k = 0; k < f->slots; k++)
        if (f->slot_busy[k] && !f->slot_dead[k]) (void)ch_supervisor_interrupt(f->sup[k]);
}

/* Read what the supervisors whose fds are ready in p[0..slots) say: ended
 * attempts into res (returns their count); a failure into *e. */
static int collect(ch_farm_t *f, const struct pollfd *p, result_t *res, error_msg_t *e)
{
    int nr = 0;
    for (int k = 0; k < f->slots; k++) {
        if (p[k].fd < 0 || !p[k].revents) continue;
        ch_sup_msg_t m;
        ch_status s = ch_supervisor_read(f->sup[k], &m);
        if (s || m.type == CH_SUP_ERROR || (m.type == CH_SUP_DONE && m.error[0])) {
            *e = (error_msg_t){.id = -1};
            if (s) {
                f->slot_dead[k] = 1;
                e->slot_dead = 1;
                /* rank 0 re-counts what the slot held (the journal decides on resume) */
                e->id = f->slot_busy[k] ? f->slot_task[k * (CH_SUP_QUEUE + 1)] : -1;
                e->n_lost = f->slot_busy[k];
                memcpy(e->lost, f->slot_task + k * (CH_SUP_QUEUE + 1), sizeof e->lost);
            }
            snprintf(e->msg, sizeof e->msg, "rank %d slot %d: %s", f->rank, k,
                     s ? ch_error_message() : m.error);
            if (s) continue;
        }
        if (m.type == CH_SUP_DONE) {
            int64_t *ids = f->slot_task + k * (CH_SUP_QUEUE + 1);
            for (int j = 0; j < f->slot_busy[k]; j++)
                if (ids[j] == m.id) {
                    memmove(ids + j, ids + j + 1, sizeof *ids * (size_t)(f->slot_busy[k] - j - 1));
                    f->slot_busy[k]--;
                    break;
                }
            res[nr++] = (result_t){m.end, m.started, 0};
        }
    }
    return nr;
}

static void slot_pollfds(ch_farm_t *f, struct pollfd *p)
{
    for (int k = 0; k < f->slots; k++)
        p[k] = (struct pollfd){f->slot_dead[k] ? -1 : ch_supervisor_fd(f->sup[k]), POLLIN, 0};
}

static ch_status worker_loop(ch_farm_t *f)
{
    struct pollfd *p = calloc((size_t)f->slots + 1, sizeof *p);
    result_t *res = calloc((size_t)f->slots * (CH_SUP_QUEUE + 1), sizeof *res);
    if (!p || !res) {
        free(p);
        free(res);
        return CH_ERROR(CH_ERR_NOMEM, "out of memory");
    }
    conn_t *c = &f->conns[0];
    ch_status s = CH_OK;
    for (int finished = 0; !finished && !s;) {
        slot_pollfds(f, p);
        p[f->slots] = (struct pollfd){c->fd, POLLIN, 0};
        if (poll(p, (nfds_t)f->slots + 1, -1) < 0) {
            if (errno == EINTR) continue;
            s = CH_ERROR(CH_ERR_IO, "poll: %s", strerror(errno));
            break;
        }
        error_msg_t e = {.id = -1};
        int nr = collect(f, p, res, &e);
        if (p[f->slots].revents) {
            int r = conn_read(c);
            if (r <= 0) {
                s = CH_ERROR(CH_ERR_IO, "rank %d: the stream from rank 0 %s: rank 0 is gone; "
                             "running tasks are finished and recorded by their supervisors",
                             f->rank, r ? strerror(errno) : "ended");
                break;
            }
            size_t off = 0;
            frame_t h;
            const char *body;
            while (conn_frame(c, &off, &h, &body)) {
                if (h.type == MSG_ASSIGN)
                    run_local(f, (const assign_t *)(const void *)body, (int)(h.len / sizeof(assign_t)), &e);
                else if (h.type == MSG_CTRL && h.len == sizeof(int32_t)) {
                    int32_t ctrl;
                    memcpy(&ctrl, body, sizeof ctrl);
                    if (ctrl == CTRL_KILL) interrupt_local(f);
                    if (ctrl == CTRL_FINISH) finished = 1;
                }
            }
            conn_consumed(c, off);
        }
        if (e.msg[0]) s = write_frame(c->fd, MSG_ERROR, &e, sizeof e);
        if (!s && nr) s = write_frame(c->fd, MSG_RESULT, res, (size_t)nr * sizeof *res);
    }
    free(p);
    free(res);
    return s;
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
    int *where; /* rank running the task */
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

static void on_error(disp_t *d, const error_msg_t *e)
{
    ch_log_error("%s", e->msg);
    if (!d->error) snprintf(d->error_msg, sizeof d->error_msg, "%s", e->msg);
    d->error = 1;
    for (int j = 0; e->slot_dead && j < e->n_lost && j <= CH_SUP_QUEUE; j++) {
        int64_t id = e->lost[j];
        if (id < 0 || id >= d->n || d->state[id] != T_RUNNING) continue;
        d->in_flight--;
        d->state[id] = T_PENDING; /* not run again in this run: the journal decides on resume */
    }
}

/* A worker's stream ended: the rank died. Its supervisors finish and record
 * its running tasks (so they are not given to another rank: that could run
 * them twice); the farm stops dispatching and ends. */
static void lost_rank(disp_t *d, int w)
{
    ch_farm_t *f = d->f;
    if (f->conns[w].fd < 0) return;
    close(f->conns[w].fd);
    f->conns[w].fd = -1;
    int64_t lost = 0;
    for (int64_t i = 0; i < d->n; i++)
        if (d->state[i] == T_RUNNING && d->where[i] == w) {
            d->state[i] = T_PENDING;
            lost++;
        }
    d->in_flight -= lost;
    d->free_slots[w] = 0;
    error_msg_t e = {.id = -1};
    snprintf(e.msg, sizeof e.msg, "rank %d is gone (its stream to rank 0 ended) with %" PRId64
             " running tasks: their supervisors finish and record them; the farm stops, "
             "resume it to run the rest", w, lost);
    on_error(d, &e);
}

/* Fill free capacity: first every idle slot of every rank (so that a few
 * tasks spread over the ranks), then the prefetch queues. */
static void dispatch(disp_t *d, assign_t *buf)
{
    ch_farm_t *f = d->f;
    int64_t now = mono_ns();
    int cap = f->slots * f->depth;
    for (int pass = 0; pass < 2; pass++) {
        for (int w = 0; w < f->size; w++) {
            int n = 0;
            int floor = pass == 0 ? cap - f->slots : 0; /* pass 0: leave the queues empty */
            while (d->free_slots[w] > floor) {
                int64_t id = next_task(d, now);
                if (id < 0) break;
                d->state[id] = T_RUNNING;
                d->where[id] = w;
                if (d->failures[id] > 0) d->sum->retried++;
                buf[n++] = (assign_t){id, ++d->attempt[id], 0, task_timeout(d)};
                d->free_slots[w]--;
                d->in_flight++;
                d->sum->attempts++;
            }
            if (!n) continue;
            if (w == 0) {
                error_msg_t e = {.id = -1};
                run_local(f, buf, n, &e);
                if (e.msg[0]) on_error(d, &e);
            } else if (write_frame(f->conns[w].fd, MSG_ASSIGN, buf, (size_t)n * sizeof *buf)) {
                lost_rank(d, w);
            }
        }
    }
}

static void broadcast_ctrl(disp_t *d, int ctrl)
{
    int32_t c = ctrl;
    for (int w = 1; w < d->f->size; w++)
        if (d->f->conns[w].fd >= 0) (void)write_frame(d->f->conns[w].fd, MSG_CTRL, &c, sizeof c);
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

/* One ended attempt; returns 1 when the stop flag should be checked now
 * (an interrupted attempt: a signal reached the tasks). */
static int handle(disp_t *d, const result_t *res)
{
    const ch_journal_end_t *r = &res->end;
    if (r->id < 0 || r->id >= d->n || d->state[r->id] != T_RUNNING) return 0;
    if (!res->started) { /* handed back unstarted (a stop): as if never dispatched */
        d->in_flight--;
        d->free_slots[d->where[r->id]]++;
        d->attempt[r->id]--;
        d->sum->attempts--;
        if (d->failures[r->id] > 0) d->sum->retried--;
        d->state[r->id] = T_RETRY;
        d->retry[d->n_retry++] = (retry_t){r->id, 0};
        return 0;
    }
    on_result(d, r);
    return r->kind == CH_END_INTERRUPTED;
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
    d.where = calloc((size_t)d.n, sizeof(int));
    d.attempt = calloc((size_t)d.n, sizeof(int));
    d.failures = calloc((size_t)d.n, sizeof(int));
    d.unresolved = calloc((size_t)d.n_epochs, sizeof(int64_t));
    d.retry = calloc((size_t)d.n, sizeof(retry_t));
    d.free_slots = calloc((size_t)f->size, sizeof(int));
    struct pollfd *pfd = calloc((size_t)(f->slots + f->size), sizeof *pfd);
    result_t *res = calloc((size_t)f->slots * (CH_SUP_QUEUE + 1), sizeof *res);
    assign_t *abuf = malloc(sizeof *abuf * (size_t)f->slots * (size_t)f->depth);
    ch_status st = CH_OK;
    if (!d.state || !d.where || !d.attempt || !d.failures || !d.unresolved || !d.retry || !d.free_slots ||
        !pfd || !res || !abuf) {
        st = CH_ERROR(CH_ERR_NOMEM, "out of memory for %" PRId64 " tasks", d.n);
        d.error = 1;
        snprintf(d.error_msg, sizeof d.error_msg, "%s", ch_error_message());
        goto finish;
    }
    for (int w = 0; w < f->size; w++) d.free_slots[w] = f->slots * f->depth;
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
    int64_t t0 = mono_ns(), last_progress = 0, last_check = t0;
    for (;;) {
        if (!d.stopping && !d.halted && !d.error) dispatch(&d, abuf);
        int all_resolved = d.open_epoch >= d.n_epochs;
        if (d.in_flight == 0 && (d.stopping || d.halted || d.error || all_resolved)) break;
        if (d.in_flight == 0 && d.n_retry == 0) {
            /* cannot happen: nothing runs, nothing waits, yet tasks are unresolved */
            d.error = 1;
            snprintf(d.error_msg, sizeof d.error_msg, "dispatcher stalled with %" PRId64
                     " unresolved tasks (bug)", d.unresolved[d.open_epoch]);
            break;
        }
        /* wait for supervisors (rank 0's slots) and worker streams; wake at
         * least once a second (stop requests, retry backoff, grace time) */
        slot_pollfds(f, pfd);
        for (int w = 1; w < f->size; w++)
            pfd[f->slots + w - 1] = (struct pollfd){f->conns[w].fd, POLLIN, 0};
        int timeout = 1000;
        int64_t now = mono_ns();
        for (int64_t i = 0; i < d.n_retry; i++) {
            int64_t left = (d.retry[i].due - now) / 1000000 + 1;
            if (left < timeout) timeout = left < 0 ? 0 : (int)left;
        }
        int pr = poll(pfd, (nfds_t)(f->slots + f->size - 1), timeout);
        if (pr < 0 && errno != EINTR) {
            st = CH_ERROR(CH_ERR_IO, "poll: %s", strerror(errno));
            break;
        }
        int check = pr == 0;
        if (pr > 0) {
            error_msg_t e = {.id = -1};
            int nr = collect(f, pfd, res, &e);
            if (e.msg[0]) on_error(&d, &e);
            for (int i = 0; i < nr; i++) check |= handle(&d, &res[i]);
            for (int w = 1; w < f->size; w++) {
                conn_t *c = &f->conns[w];
                if (c->fd < 0 || !pfd[f->slots + w - 1].revents) continue;
                if (conn_read(c) <= 0) {
                    lost_rank(&d, w);
                    continue;
                }
                size_t off = 0;
                frame_t h;
                const char *body;
                while (conn_frame(c, &off, &h, &body)) {
                    if (h.type == MSG_RESULT) {
                        int n = (int)(h.len / sizeof(result_t));
                        for (int i = 0; i < n; i++) {
                            result_t r;
                            memcpy(&r, body + (size_t)i * sizeof r, sizeof r);
                            check |= handle(&d, &r);
                        }
                    } else if (h.type == MSG_ERROR && h.len == sizeof(error_msg_t)) {
                        error_msg_t em;
                        memcpy(&em, body, sizeof em);
                        on_error(&d, &em);
                    }
                }
                conn_consumed(c, off);
            }
        }
        if (mono_ns() - last_check >= 250000000) check = 1; /* a few times a second at most */
        progress(&d, 0, t0, &last_progress);
        if (check) {
            last_check = mono_ns();
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
    free(d.where);
    free(d.attempt);
    free(d.failures);
    free(d.unresolved);
    free(d.retry);
    free(d.free_slots);
    free(d.dur);
    free(pfd);
    free(res);
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
