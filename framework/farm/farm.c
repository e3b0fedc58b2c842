/* cohort: the task farm's entry (see farm.h for the design): options,
 * setup on every rank (CPU share, the open attempts of an earlier run, the
 * slot supervisors, then the streams), run (rank 0 dispatches, the others
 * work), destroy, and the agreement that gives every rank one status. The
 * pieces are listed in farm_internal.h. */
#define _GNU_SOURCE
#include "framework/farm/farm_internal.h"

#include "framework/core/log.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

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

/* Collective: every rank gets the lowest failing rank's status and message
 * ("rank R: " in front where the world has more than one rank). */
ch_status ch_farm_agree_(MPI_Comm comm, int rank, ch_status local)
{
    int mine = local ? rank : INT32_MAX, lowest, size = 1;
    MPI_Allreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, comm);
    if (lowest == INT32_MAX) return CH_OK;
    MPI_Comm_size(comm, &size);
    char msg[CH_ERROR_MAX];
    int code = local;
    if (rank == lowest && size > 1) snprintf(msg, sizeof msg, "rank %d: %s", rank, ch_error_message());
    else if (rank == lowest) snprintf(msg, sizeof msg, "%s", ch_error_message());
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
    CH_TRY(ch_farm_agree_(f->comm, f->rank, s));
    long long nb = n_open;
    MPI_Bcast(&nb, 1, MPI_LONG_LONG, 0, f->comm);
    if (nb == 0) return CH_OK;
    open = calloc((size_t)nb, sizeof *open);
    s = open ? CH_OK : CH_ERROR(CH_ERR_NOMEM, "out of memory");
    CH_TRY(ch_farm_agree_(f->comm, f->rank, s));
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
    return ch_farm_agree_(f->comm, f->rank, s);
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
    CH_TRY(ch_farm_agree_(comm, rank, s));
    f->o = *o;
    f->rank = rank;
    f->n_tasks = ch_taskfile_count(o->tasks);
    s = MPI_Comm_dup(comm, &f->comm) == MPI_SUCCESS ? CH_OK
                                                     : CH_ERROR(CH_ERR_MPI, "MPI_Comm_dup failed");
    if (s) {
        free(f);
        return ch_farm_agree_(comm, rank, s);
    }
    MPI_Comm_size(f->comm, &f->size);
    *out = f;
    s = ch_farm_cpu_share(f->comm, &f->cpus, &f->n_cpus);
    CH_TRY(ch_farm_agree_(f->comm, rank, s));
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
    CH_TRY(ch_farm_agree_(f->comm, rank, s));
    return ch_farm_connect_ranks_(f);
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

/* ------------------------------------------------------------ run */

ch_status ch_farm_run(ch_farm_t *f, ch_farm_summary_t *sum)
{
    CH_REQUIRE(f && sum, "ch_farm_run: NULL argument");
    memset(sum, 0, sizeof *sum);
    for (int i = 0; i < CH_FARM_SLOWEST; i++) sum->slowest_id[i] = -1;
    sum->total = f->n_tasks;
    sum->world_size = f->size;
    sum->slots_per_rank = f->slots;
    ch_status s = f->rank == 0 ? ch_farm_dispatcher_(f, sum) : ch_farm_worker_loop_(f);
    MPI_Bcast(sum, sizeof *sum, MPI_BYTE, 0, f->comm);
    return ch_farm_agree_(f->comm, f->rank, s);
}
