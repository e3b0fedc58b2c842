/* cohort: rank 0's dispatcher (farm_internal.h): every task's state, tasks
 * to the free slots of any rank as they free up, retries and their backoff,
 * timeouts, barriers, halt rules, the preemption stop and its grace time,
 * progress, and the counts of the summary. */
#define _GNU_SOURCE
#include "framework/farm/farm_internal.h"

#include "framework/core/log.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Task states on rank 0. */
enum { T_PENDING = 0, T_RUNNING, T_RETRY, T_DONE, T_SKIPPED, T_FAILED };

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
    int *held;                 /* [w * slots + k]: tasks slot k of rank w holds (0..depth) */
    unsigned char *reclaiming; /* [w * slots + k]: asked to hand back its queue, no answer yet */
    int *reserved;             /* [w * slots + k]: 1 + the slot whose queue this slot waits
                                  for (taken back for it: take_back), 0: none */
    int64_t *head_since;       /* [w * slots + k]: when its running task started, as rank 0
                                  knows it (mono ns): its queue has waited that long */
    double recent[64];         /* the last ended attempts' durations (s), a ring */
    int64_t n_recent;
    int recent_new;
    int64_t stuck_ns;          /* a queue is stuck behind a running task that has run this
                                  long: 2 x the median of recent (take_back) */
    unsigned char *gone;       /* [w]: rank w's stream ended */
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
    d->gone[w] = 1;
    error_msg_t e = {.id = -1};
    snprintf(e.msg, sizeof e.msg, "rank %d is gone (its stream to rank 0 ended) with %" PRId64
             " running tasks: their supervisors finish and record them; the farm stops, "
             "resume it to run the rest", w, lost);
    on_error(d, &e);
}

static int *held_at(disp_t *d, int w, int k) { return &d->held[w * d->f->slots + k]; }

/* Ask slot k of rank w to hand back its queued tasks (they come back as
 * unstarted results and go to the idle slots). */
static void reclaim(disp_t *d, int w, int k)
{
    ch_farm_t *f = d->f;
    d->reclaiming[w * f->slots + k] = 1;
    if (w == 0) {
        ch_farm_drop_queued_local_(f, k);
        return;
    }
    int32_t c[2] = {CTRL_DROP_SLOT, k};
    if (ch_farm_write_frame_(f->conns[w].fd, MSG_CTRL, c, sizeof c)) lost_rank(d, w);
}

/* Is a task ready to start (a retry due, or the next pending task with its
 * barrier open)? As next_task, without taking it. */
static int startable(disp_t *d, int64_t now)
{
    for (int64_t i = 0; i < d->n_retry; i++)
        if (d->retry[i].due <= now) return 1;
    while (d->cursor < d->n && d->state[d->cursor] != T_PENDING) d->cursor++;
    return d->cursor < d->n && ch_taskfile_task(d->f->o.tasks, d->cursor)->barrier <= d->open_epoch;
}

/* Hand n assignments to rank w (its slots as in buf). */
static void send_assign(disp_t *d, int w, assign_t *buf, int n)
{
    ch_farm_t *f = d->f;
    if (w == 0) {
        error_msg_t e = {.id = -1};
        ch_farm_run_local_(f, buf, n, &e);
        if (e.msg[0]) on_error(d, &e);
    } else if (ch_farm_write_frame_(f->conns[w].fd, MSG_ASSIGN, buf, (size_t)n * sizeof *buf)) {
        lost_rank(d, w);
    }
}

/* A slot with room asks for work (it is idle, or its running task just
 * ended and its queued one started). While a task waits queued behind a
 * running one elsewhere, it should go to this slot: with farm.prefetch=0 it
 * would have. Rank 0 takes it back (reclaim: the supervisor hands its queue
 * back unstarted, unless the queued task has started in the meantime, its
 * running one having ended: the supervisor alone decides, so a task is
 * started once or handed back, never both) and the asking slot waits for
 * that answer, one round trip, instead of taking a new task; a task handed
 * back goes to it (handle). Which queues: any, for an idle slot with
 * nothing else to start (the tail of a run, a barrier, a retry's backoff);
 * else those whose running task has run 2 x the median of the recent
 * attempts (stuck_ns) while the asking slot's own is younger than that: a
 * queue behind a task of the usual length starts soon anyway, and taking
 * it back would only cost messages (`true` tasks). */
static void take_back(disp_t *d, int64_t now)
{
    ch_farm_t *f = d->f;
    int ns = f->size * f->slots, queues = 0;
    for (int i = 0; i < ns; i++) {
        int v = d->reserved[i] - 1; /* answered, or its rank gone: free again */
        if (v >= 0 && (!d->reclaiming[v] || d->gone[v / f->slots])) d->reserved[i] = 0;
        queues += !d->gone[i / f->slots] && d->held[i] > 1 && !d->reclaiming[i];
    }
    if (!queues || d->n_recent == 0) return; /* nothing queued, or nothing has ended yet */
    if (d->recent_new) {
        double c[64];
        int n = d->n_recent < 64 ? (int)d->n_recent : 64;
        memcpy(c, d->recent, sizeof *c * (size_t)n);
        qsort(c, (size_t)n, sizeof *c, cmp_double);
        d->stuck_ns = (int64_t)(2e9 * c[n / 2]);
        d->recent_new = 0;
    }
    int idle_ready = -1; /* idle slots that a due retry or handed-back task serves first */
    for (int a = 0; a < ns && queues > 0; a++) {
        if (d->gone[a / f->slots] || d->held[a] >= f->depth || d->reserved[a]) continue;
        int64_t need = d->stuck_ns; /* how long the victim's running task must have run */
        if (d->held[a] == 0) {
            if (idle_ready < 0) {
                idle_ready = 0;
                for (int64_t i = 0; i < d->n_retry; i++) idle_ready += d->retry[i].due <= now;
            }
            if (idle_ready > 0) {
                idle_ready--;
                continue;
            }
            if (!startable(d, now)) need = 0;
        } else if (now - d->head_since[a] >= d->stuck_ns) {
            continue; /* its own running task is no shorter */
        }
        int v = -1;
        for (int i = 0; i < ns; i++)
            if (i != a && !d->gone[i / f->slots] && d->held[i] > 1 && !d->reclaiming[i] &&
                now - d->head_since[i] >= need && (v < 0 || d->head_since[i] < d->head_since[v]))
                v = i;
        if (v < 0) {
            if (need == 0) break; /* no queue anywhere */
            continue;
        }
        reclaim(d, v / f->slots, v % f->slots);
        d->reserved[a] = v + 1;
        queues--;
    }
}

/* Fill free capacity level by level: first every idle slot of every rank
 * (so that a few tasks spread over the ranks), then one queued task per
 * busy slot (farm.prefetch), and so on: a task is queued behind a running
 * one only when no slot anywhere is idle; and a slot with room first takes
 * back a task stuck in a queue elsewhere (take_back). */
static void dispatch(disp_t *d, assign_t *buf)
{
    ch_farm_t *f = d->f;
    int64_t now = ch_farm_mono_ns_();
    int starved = 0;
    take_back(d, now);
    for (int level = 0; level < f->depth && !starved; level++) {
        for (int w = 0; w < f->size && !starved; w++) {
            if (d->gone[w]) continue;
            int n = 0;
            for (int k = 0; k < f->slots; k++) {
                if (*held_at(d, w, k) > level || d->reserved[w * f->slots + k]) continue;
                int64_t id = next_task(d, now);
                if (id < 0) {
                    starved = 1;
                    break;
                }
                d->state[id] = T_RUNNING;
                d->where[id] = w;
                if (d->failures[id] > 0) d->sum->retried++;
                buf[n++] = (assign_t){id, ++d->attempt[id], k, task_timeout(d)};
                if (*held_at(d, w, k) == 0) d->head_since[w * f->slots + k] = now;
                (*held_at(d, w, k))++;
                d->in_flight++;
                d->sum->attempts++;
            }
            if (n) send_assign(d, w, buf, n);
        }
    }
}

static void broadcast_ctrl(disp_t *d, int ctrl)
{
    int32_t c = ctrl;
    for (int w = 1; w < d->f->size; w++)
        if (d->f->conns[w].fd >= 0) (void)ch_farm_write_frame_(d->f->conns[w].fd, MSG_CTRL, &c, sizeof c);
    if (ctrl == CTRL_KILL) ch_farm_interrupt_local_(d->f);
    if (ctrl == CTRL_DROP) ch_farm_drop_queued_local_(d->f, -1);
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
    } else if (!d->killed) {
        broadcast_ctrl(d, CTRL_DROP); /* the prefetched tasks come back unstarted */
    }
}

/* An attempt ended (started) or came back unstarted: its slot holds one
 * task less; after an end, its next queued task has started. Any answer
 * of the slot ends a take-back: what it still holds has started or is
 * queued anew. */
static void slot_freed(disp_t *d, const ch_journal_end_t *r, int started)
{
    ch_farm_t *f = d->f;
    int w = d->where[r->id], k = r->slot;
    if (k < 0 || k >= f->slots) return;
    if (*held_at(d, w, k) > 0) (*held_at(d, w, k))--;
    if (started) d->head_since[w * f->slots + k] = ch_farm_mono_ns_();
    d->reclaiming[w * f->slots + k] = 0;
}

static void on_result(disp_t *d, const ch_journal_end_t *r)
{
    ch_farm_summary_t *s = d->sum;
    const ch_farm_options_t *o = &d->f->o;
    int64_t id = r->id;
    d->in_flight--;
    slot_freed(d, r, 1);
    double sec = (double)(r->end_ns - r->start_ns) / 1e9;
    if (r->kind == CH_END_EXIT) s->exit_codes[r->code & 255]++;
    else if (r->kind == CH_END_SIGNAL) s->exit_codes[256]++;
    else if (r->kind == CH_END_SPAWN_FAILED) s->spawn_failed++;
    add_slowest(s, id, sec);
    d->recent[d->n_recent++ % 64] = sec;
    d->recent_new = 1;
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
        d->retry[d->n_retry++] = (retry_t){id, ch_farm_mono_ns_() + (int64_t)(b * 1e9)};
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
    int64_t now = ch_farm_mono_ns_();
    if (!force && now - *last < 500000000) return; /* at most two redraws a second */
    *last = now;
    int64_t ended = 0, failed = 0;
    for (int64_t i = 0; i < d->n; i++) {
        ended += d->state[i] >= T_DONE;
        failed += d->state[i] == T_FAILED;
    }
    double el = (double)(now - t0) / 1e9;
    double rate = el > 0 ? (double)d->ended_run / el : 0;
    char text[160]; /* the ETA is the progress line's own (ch_job_progress) */
    snprintf(text, sizeof text, "%.1f tasks/s, %" PRId64 " failed", rate, failed);
    o->progress(o->cb_arg, ended, d->n, text);
}

/* One ended attempt; returns 1 when the stop flag should be checked now
 * (an interrupted attempt: a signal reached the tasks). */
static int handle(disp_t *d, const result_t *res)
{
    const ch_journal_end_t *r = &res->end;
    if (r->id < 0 || r->id >= d->n || d->state[r->id] != T_RUNNING) return 0;
    if (!res->started) { /* handed back unstarted (a take-back, a stop): as if never dispatched */
        ch_farm_t *f = d->f;
        int v = d->where[r->id] * f->slots + r->slot, a = -1;
        for (int i = 0; r->slot >= 0 && r->slot < f->slots && i < f->size * f->slots; i++)
            if (d->reserved[i] == v + 1 && d->held[i] < f->depth) a = i;
        slot_freed(d, r, 0);
        if (a >= 0 && !d->stopping && !d->halted && !d->error) {
            /* taken back for slot a: the same attempt, there (it never started) */
            int w = a / f->slots, k = a % f->slots;
            assign_t as = {r->id, d->attempt[r->id], k, task_timeout(d)};
            d->reserved[a] = 0;
            d->where[r->id] = w;
            if (d->held[a]++ == 0) d->head_since[a] = ch_farm_mono_ns_();
            send_assign(d, w, &as, 1);
            return 0;
        }
        d->in_flight--;
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

ch_status ch_farm_dispatcher_(ch_farm_t *f, ch_farm_summary_t *sum)
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
    d.held = calloc((size_t)f->size * (size_t)f->slots, sizeof(int));
    d.reclaiming = calloc((size_t)f->size * (size_t)f->slots, 1);
    d.reserved = calloc((size_t)f->size * (size_t)f->slots, sizeof(int));
    d.head_since = calloc((size_t)f->size * (size_t)f->slots, sizeof(int64_t));
    d.gone = calloc((size_t)f->size, 1);
    struct pollfd *pfd = calloc((size_t)(f->slots + f->size), sizeof *pfd);
    result_t *res = calloc((size_t)f->slots * (CH_SUP_QUEUE + 1), sizeof *res);
    assign_t *abuf = malloc(sizeof *abuf * (size_t)f->slots * (size_t)f->depth);
    ch_status st = CH_OK;
    if (!d.state || !d.where || !d.attempt || !d.failures || !d.unresolved || !d.retry || !d.held ||
        !d.reclaiming || !d.reserved || !d.head_since || !d.gone ||
        !pfd || !res || !abuf) {
        st = CH_ERROR(CH_ERR_NOMEM, "out of memory for %" PRId64 " tasks", d.n);
        d.error = 1;
        snprintf(d.error_msg, sizeof d.error_msg, "%s", ch_error_message());
        goto finish;
    }
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
    int64_t t0 = ch_farm_mono_ns_(), last_progress = 0, last_check = t0;
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
        ch_farm_slot_pollfds_(f, pfd);
        for (int w = 1; w < f->size; w++)
            pfd[f->slots + w - 1] = (struct pollfd){f->conns[w].fd, POLLIN, 0};
        int timeout = 1000;
        int64_t now = ch_farm_mono_ns_();
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
            int nr = ch_farm_collect_(f, pfd, res, &e);
            if (e.msg[0]) on_error(&d, &e);
            for (int i = 0; i < nr; i++) check |= handle(&d, &res[i]);
            for (int w = 1; w < f->size; w++) {
                conn_t *c = &f->conns[w];
                if (c->fd < 0 || !pfd[f->slots + w - 1].revents) continue;
                if (ch_farm_conn_read_(c) <= 0) {
                    lost_rank(&d, w);
                    continue;
                }
                size_t off = 0;
                frame_t h;
                const char *body;
                while (ch_farm_conn_frame_(c, &off, &h, &body)) {
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
                ch_farm_conn_consumed_(c, off);
            }
        }
        if (ch_farm_mono_ns_() - last_check >= 250000000) check = 1; /* a few times a second at most */
        progress(&d, 0, t0, &last_progress);
        if (check) {
            last_check = ch_farm_mono_ns_();
            if (!d.stopping && o->should_stop && o->should_stop(o->cb_arg)) {
                d.stopping = 1;
                d.grace_deadline = ch_farm_mono_ns_() + (int64_t)(o->preempt_grace * 1e9);
                ch_log_warn("stop requested: no new tasks start; %" PRId64 " running tasks get "
                            "%.0f s to finish", d.in_flight, o->preempt_grace);
                if (!d.killed) broadcast_ctrl(&d, CTRL_DROP); /* the queued ones do not start */
            }
            if (d.stopping && !d.killed && d.in_flight > 0 && ch_farm_mono_ns_() >= d.grace_deadline) {
                ch_log_warn("grace time over: stopping %" PRId64 " running tasks (recorded as "
                            "interrupted; they run again on resume)", d.in_flight);
                d.killed = 1;
                broadcast_ctrl(&d, CTRL_KILL);
            }
        }
    }
    progress(&d, 1, t0, &last_progress);
    sum->seconds = (double)(ch_farm_mono_ns_() - t0) / 1e9;
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
    free(d.held);
    free(d.reclaiming);
    free(d.reserved);
    free(d.head_since);
    free(d.gone);
    free(d.dur);
    free(pfd);
    free(res);
    free(abuf);
    if (!st && d.error) st = ch_error_adopt(CH_ERR_IO, d.error_msg);
    return st;
}
