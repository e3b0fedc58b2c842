/* cohort: a rank's side of the task farm (farm_internal.h): its slots
 * (assignments to the least loaded supervisor, their results, interrupts),
 * used by rank 0 for its own slots too, and the worker loop of the other
 * ranks: one thread in poll(2) on the supervisors' pipes and the stream from
 * rank 0. */
#define _GNU_SOURCE
#include "framework/farm/farm_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

/* Hand n assignments to this rank's free slots. A failure is returned as an
 * error message for rank 0 in *e (e->msg[0] != 0). */
void ch_farm_run_local_(ch_farm_t *f, const assign_t *a, int n, error_msg_t *e)
{
    for (int i = 0; i < n; i++) {
        int k = a[i].slot; /* rank 0's choice, else the least loaded live slot with room */
        if (k < 0 || k >= f->slots || f->slot_dead[k] || f->slot_busy[k] >= f->depth) {
            k = f->slots;
            for (int j = 0; j < f->slots; j++)
                if (!f->slot_dead[j] && f->slot_busy[j] < f->depth &&
                    (k == f->slots || f->slot_busy[j] < f->slot_busy[k]))
                    k = j;
        }
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

void ch_farm_interrupt_local_(ch_farm_t *f)
{
    for (int k = 0; k < f->slots; k++)
        if (f->slot_busy[k] && !f->slot_dead[k]) (void)ch_supervisor_interrupt(f->sup[k]);
}

void ch_farm_drop_queued_local_(ch_farm_t *f, int slot)
{
    for (int k = 0; k < f->slots; k++)
        if ((slot < 0 || k == slot) && f->slot_busy[k] > 1 && !f->slot_dead[k])
            (void)ch_supervisor_drop_queued(f->sup[k]);
}

/* Read what the supervisors whose fds are ready in p[0..slots) say: ended
 * attempts into res (returns their count); a failure into *e. */
int ch_farm_collect_(ch_farm_t *f, const struct pollfd *p, result_t *res, error_msg_t *e)
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

void ch_farm_slot_pollfds_(ch_farm_t *f, struct pollfd *p)
{
    for (int k = 0; k < f->slots; k++)
        p[k] = (struct pollfd){f->slot_dead[k] ? -1 : ch_supervisor_fd(f->sup[k]), POLLIN, 0};
}

ch_status ch_farm_worker_loop_(ch_farm_t *f)
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
        ch_farm_slot_pollfds_(f, p);
        p[f->slots] = (struct pollfd){c->fd, POLLIN, 0};
        if (poll(p, (nfds_t)f->slots + 1, -1) < 0) {
            if (errno == EINTR) continue;
            s = CH_ERROR(CH_ERR_IO, "poll: %s", strerror(errno));
            break;
        }
        error_msg_t e = {.id = -1};
        int nr = ch_farm_collect_(f, p, res, &e);
        if (p[f->slots].revents) {
            int r = ch_farm_conn_read_(c);
            if (r <= 0) {
                s = CH_ERROR(CH_ERR_IO, "rank %d: the stream from rank 0 %s: rank 0 is gone; "
                             "running tasks are finished and recorded by their supervisors",
                             f->rank, r ? strerror(errno) : "ended");
                break;
            }
            size_t off = 0;
            frame_t h;
            const char *body;
            while (ch_farm_conn_frame_(c, &off, &h, &body)) {
                if (h.type == MSG_ASSIGN)
                    ch_farm_run_local_(f, (const assign_t *)(const void *)body, (int)(h.len / sizeof(assign_t)), &e);
                else if (h.type == MSG_CTRL && h.len >= sizeof(int32_t)) {
                    int32_t ctrl[2] = {0, -1};
                    memcpy(ctrl, body, h.len >= sizeof ctrl ? sizeof ctrl : sizeof ctrl[0]);
                    if (ctrl[0] == CTRL_KILL) ch_farm_interrupt_local_(f);
                    if (ctrl[0] == CTRL_DROP) ch_farm_drop_queued_local_(f, -1);
                    if (ctrl[0] == CTRL_DROP_SLOT && h.len == sizeof ctrl && ctrl[1] >= 0)
                        ch_farm_drop_queued_local_(f, ctrl[1]);
                    if (ctrl[0] == CTRL_FINISH) finished = 1;
                }
            }
            ch_farm_conn_consumed_(c, off);
        }
        if (e.msg[0]) s = ch_farm_write_frame_(c->fd, MSG_ERROR, &e, sizeof e);
        if (!s && nr) s = ch_farm_write_frame_(c->fd, MSG_RESULT, res, (size_t)nr * sizeof *res);
    }
    free(p);
    free(res);
    return s;
}
