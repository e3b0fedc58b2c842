/* cohort: what the pieces of the task farm share (framework/farm/farm*.c):
 * the frames of the rank-0 <-> worker streams, a stream end, struct ch_farm,
 * and the functions one piece calls in another. Not installed; nothing
 * outside framework/farm includes it.
 *
 *   farm.c          entry: options, setup (CPU share, open attempts of an
 *                   earlier run, slot supervisors), run, destroy, and the
 *                   agreement of every rank on one status
 *   farm_wire.c     the wire protocol: framed TCP streams, connecting the ranks
 *   farm_worker.c   a rank's side: its slots, the worker loop
 *   farm_dispatch.c rank 0's dispatcher
 *   farm_report.c   status.tsv and the end-of-run summary
 *   farm_config.c   the farm.* keys and the options from them
 */
#ifndef COHORT_FARM_INTERNAL_H
#define COHORT_FARM_INTERNAL_H

#include "framework/farm/farm.h"

#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Frames on the rank-0 <-> worker streams: a header, then len bytes. */
enum { MSG_RESULT = 1, MSG_ERROR = 2, MSG_ASSIGN = 3, MSG_CTRL = 4 };
/* CTRL frames: one int32; CTRL_DROP_SLOT is followed by an int32 slot.
 * DROP: every slot hands back its queued tasks; DROP_SLOT: that slot does. */
enum { CTRL_FINISH = 1, CTRL_KILL = 2, CTRL_DROP = 3, CTRL_DROP_SLOT = 4 };
typedef struct {
    uint32_t type, len;
} frame_t;

typedef struct {
    int64_t id;
    int32_t attempt;
    int32_t slot; /* the slot rank 0 chose (the least loaded live one if that is dead) */
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

static inline int64_t ch_farm_mono_ns_(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* farm.c. Collective: every rank gets the lowest failing rank's status and message. */
ch_status ch_farm_agree_(MPI_Comm comm, int rank, ch_status local);

/* farm_wire.c. One frame (header, then len bytes of p) on stream fd. CH_ERR_IO. */
ch_status ch_farm_write_frame_(int fd, int type, const void *p, size_t len);
/* Read what is there into c->in. Returns 1 on data, 0 at end of stream, -1 on error. */
int ch_farm_conn_read_(conn_t *c);
/* The next complete frame in c->in from *off (header in *h, body at *body;
 * *off moves past it), or 0. */
int ch_farm_conn_frame_(conn_t *c, size_t *off, frame_t *h, const char **body);
/* Drop the first off bytes of c->in (the frames read). */
void ch_farm_conn_consumed_(conn_t *c, size_t off);
/* Collective: rank 0 listens on a TCP port of its host, every worker
 * connects and says its rank (f->conns). Same status on every rank. */
ch_status ch_farm_connect_ranks_(ch_farm_t *f);

/* farm_worker.c. Hand n assignments to this rank's free slots. A failure is
 * returned as an error message for rank 0 in *e (e->msg[0] != 0). */
void ch_farm_run_local_(ch_farm_t *f, const assign_t *a, int n, error_msg_t *e);
/* Interrupt the running tasks of this rank's live slots. */
void ch_farm_interrupt_local_(ch_farm_t *f);
/* Have this rank's live slots (slot < 0: all; else that one) hand back
 * their queued (prefetched) tasks. */
void ch_farm_drop_queued_local_(ch_farm_t *f, int slot);
/* Read what the supervisors whose fds are ready in p[0..slots) say: ended
 * attempts into res (returns their count); a failure into *e. */
int ch_farm_collect_(ch_farm_t *f, const struct pollfd *p, result_t *res, error_msg_t *e);
/* p[0..slots): the live slots' supervisor fds (POLLIN), -1 for dead ones. */
void ch_farm_slot_pollfds_(ch_farm_t *f, struct pollfd *p);
/* A worker rank's whole run: tasks from rank 0's stream to the slots,
 * results back, until CTRL_FINISH. */
ch_status ch_farm_worker_loop_(ch_farm_t *f);

/* farm_dispatch.c. Rank 0's whole run: dispatch every task, fill *sum. */
ch_status ch_farm_dispatcher_(ch_farm_t *f, ch_farm_summary_t *sum);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_FARM_INTERNAL_H */
