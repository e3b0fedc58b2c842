/* cohort: the chunked multi-rank pipeline over an array source (reader
 * thread ahead of the compute thread), see reduce.h. */
#include "config.h"

#include "framework/reduce/reduce.h"
#include "framework/core/profiler.h"

#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ch_reduce_run_options_default(ch_reduce_run_options_t *o)
{
    memset(o, 0, sizeof *o);
    o->chunk_bytes = 16LL << 20;
    o->prefetch = 2;
    o->sync_bytes = 256LL << 20;
    o->sync_seconds = 1.0;
    o->mmap = 1;
}

/* The steps until the next agreement (timed cadence): rank 0 measures the
 * seconds per step since the last agreement and aims at sync_seconds, at
 * most 8 times the last interval (one slow or fast step is no estimate)
 * and within 1..max_steps; the others get its number (one broadcast), so
 * every rank agrees at the same steps. */
static ch_status plan_interval(ch_pg_t *pg, double sync_seconds, double dt, int64_t last,
                               int64_t max_steps, int64_t *interval)
{
    int64_t n = max_steps;
    if (!pg || ch_pg_rank(pg) == 0) {
        double per = dt / (double)(last > 0 ? last : 1);
        double want = per > 0 ? sync_seconds / per : (double)max_steps;
        double cap = 8.0 * (double)(last > 0 ? last : 1);
        if (want > cap) want = cap;
        n = want >= (double)max_steps ? max_steps : want < 1 ? 1 : (int64_t)want;
    }
    if (pg && ch_pg_size(pg) > 1) CH_TRY(ch_pg_broadcast(pg, &n, 1, CH_DIST_INT64, 0));
    *interval = n;
    return CH_OK;
}

typedef struct {
    int seg;
    int64_t e0, n;
} piece_t;

/* Pieces of rank `rank`'s share: elements [E r / W, E (r+1) / W) of the
 * segments' concatenated storage order, cut at segment ends and every
 * chunk_elems. Returns the count; fills out when not NULL. */
static int64_t rank_pieces(const ch_array_source_t *src, int rank, int world, int64_t chunk_elems,
                           piece_t *out)
{
    int64_t total = 0;
    for (int s = 0; s < src->nseg; s++) total += ch_array_desc_count(&src->seg[s]);
    int64_t lo = (int64_t)((__int128)total * rank / world);
    int64_t hi = (int64_t)((__int128)total * (rank + 1) / world);
    int64_t np = 0, start = 0;
    for (int s = 0; s < src->nseg; s++) {
        int64_t cnt = ch_array_desc_count(&src->seg[s]);
        int64_t a = lo > start ? lo : start, b = hi < start + cnt ? hi : start + cnt;
        for (int64_t e = a; e < b; e += chunk_elems) {
            if (out) out[np] = (piece_t){s, e - start, (b - e < chunk_elems ? b - e : chunk_elems)};
            np++;
        }
        start += cnt;
    }
    return np;
}

/* ------------------------------------------------------- SIGBUS on a mapping */

/* A file cut (truncated) while a piece of it is mapped turns the feed's
 * next load from the lost pages into SIGBUS, which would kill the rank with
 * no word on why. While the compute thread feeds a mapped piece it arms
 * this guard: a SIGBUS whose address lies in that piece jumps back to the
 * feed's caller, which fails with one CH_ERR_IO line; any other fault
 * gets the previous disposition (the handler puts it back and returns, so
 * the faulting load repeats under it), and a SIGBUS sent by a process
 * (kill) what the previous disposition does with it, the guard staying.
 * The state is thread-local and initial-exec: read from the handler
 * without allocating. */
static __thread sigjmp_buf *bus_jmp __attribute__((tls_model("initial-exec")));
static __thread const unsigned char *bus_lo __attribute__((tls_model("initial-exec")));
static __thread const unsigned char *bus_hi __attribute__((tls_model("initial-exec")));
static struct sigaction bus_prev;
static pthread_mutex_t bus_mu = PTHREAD_MUTEX_INITIALIZER;
static int bus_users;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    /* a fault the kernel raised (si_code > 0: BUS_ADRERR, ...) at an
     * address in the armed piece: the cut file */
    const int fault = si && si->si_code > 0;
    const unsigned char *a = fault ? (const unsigned char *)si->si_addr : NULL;
    if (bus_jmp && a && a >= bus_lo && a < bus_hi) siglongjmp(*bus_jmp, 1);
    if (fault) { /* another fault: the previous disposition, as the load repeats */
        sigaction(sig, &bus_prev, NULL);
        return;
    }
    /* sent by a process (kill -BUS): what the previous disposition does,
     * with the guard kept for the rest of the run */
    if (bus_prev.sa_flags & SA_SIGINFO) {
        if (bus_prev.sa_sigaction) bus_prev.sa_sigaction(sig, si, uc);
    } else if (bus_prev.sa_handler == SIG_DFL) {
        sigaction(sig, &bus_prev, NULL);
        raise(sig); /* the default action: the process ends as without the guard */
    } else if (bus_prev.sa_handler != SIG_IGN) {
        bus_prev.sa_handler(sig);
    }
}

/* The handler is installed for the length of a run that maps (not once
 * for good: a test harness or the application may set its own between
 * runs), and the previous disposition put back after the last such run. */
static void bus_guard(int on)
{
    pthread_mutex_lock(&bus_mu);
    if (on && bus_users++ == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, &bus_prev);
    } else if (!on && --bus_users == 0) {
        sigaction(SIGBUS, &bus_prev, NULL);
    }
    pthread_mutex_unlock(&bus_mu);
}

/* ch_reducer_feed over a mapped piece (view) under the guard. */
static ch_status feed_mapped(ch_reducer_t *r, const ch_array_source_t *src, int seg, int64_t e0,
                             int64_t n, const ch_array_view_t *view)
{
    sigjmp_buf jb;
    if (sigsetjmp(jb, 1) != 0) {
        bus_jmp = NULL;
        char name[32];
        snprintf(name, sizeof name, "input file %d", seg);
        return CH_ERROR(CH_ERR_IO, "%s was cut (truncated) while its elements [%lld, %lld) "
                        "were being read from its memory mapping (SIGBUS); nothing is "
                        "written: run again on the complete file",
                        src->seg_names ? src->seg_names[seg] : name, (long long)e0,
                        (long long)(e0 + n));
    }
    bus_lo = view->base;
    bus_hi = (const unsigned char *)view->base + view->len;
    bus_jmp = &jb;
    ch_status s = ch_reducer_feed(r, &src->seg[seg], src->seg_row0[seg], e0, n, view->data);
    bus_jmp = NULL;
    return s;
}

/* ------------------------------------------------------------ reader thread */

typedef struct {
    const ch_array_source_t *src;
    const piece_t *pieces;
    int64_t first, npieces;
    int nbuf;
    unsigned char **buf;
    ch_array_view_t *view;      /* per slot: the mapped piece (base NULL: read into buf) */
    const unsigned char **data; /* per slot: where the piece's elements are */
    int use_map;
    int64_t mapped;             /* pieces mapped (not read) */
    size_t itemsize;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t produced; /* pieces [first, produced) are in their buffers */
    int64_t consumed; /* pieces [first, consumed) were released */
    int stop;
    ch_status err;
    char msg[CH_ERROR_MAX];
} reader_t;

static void *reader_main(void *arg)
{
    reader_t *rd = arg;
    for (int64_t k = rd->first; k < rd->npieces; k++) {
        pthread_mutex_lock(&rd->mu);
        while (k - rd->consumed >= rd->nbuf && !rd->stop) pthread_cond_wait(&rd->cv, &rd->mu);
        int stop = rd->stop;
        pthread_mutex_unlock(&rd->mu);
        if (stop) break;
        const piece_t *p = &rd->pieces[k];
        int slot = (int)(k % rd->nbuf);
        ch_status s = CH_OK;
        /* the mapping instead of the read where the source can (a failed
         * map is no error: the piece is read) */
        if (rd->use_map && rd->src->map(rd->src->ctx, p->seg, p->e0, p->n, &rd->view[slot]) == CH_OK) {
            rd->data[slot] = rd->view[slot].data;
            rd->mapped++;
        } else {
            memset(&rd->view[slot], 0, sizeof rd->view[slot]);
            s = rd->src->read(rd->src->ctx, p->seg, p->e0, p->n, rd->buf[slot]);
            rd->data[slot] = rd->buf[slot];
        }
        pthread_mutex_lock(&rd->mu);
        if (s != CH_OK) {
            rd->err = s;
            snprintf(rd->msg, sizeof rd->msg, "%s", ch_error_message());
        } else {
            rd->produced = k + 1;
        }
        pthread_cond_broadcast(&rd->cv);
        pthread_mutex_unlock(&rd->mu);
        if (s != CH_OK) break;
    }
    return NULL;
}

/* Wait until piece k is in its buffer (or the reader failed). */
static ch_status reader_wait(reader_t *rd, int64_t k, const unsigned char **data)
{
    pthread_mutex_lock(&rd->mu);
    while (rd->produced <= k && rd->err == CH_OK) pthread_cond_wait(&rd->cv, &rd->mu);
    ch_status s = rd->produced > k ? CH_OK : rd->err;
    pthread_mutex_unlock(&rd->mu);
    if (s != CH_OK) return ch_error_adopt(s, rd->msg);
    *data = rd->data[k % rd->nbuf];
    return CH_OK;
}

static void unmap_slot(reader_t *rd, int slot)
{
    if (rd->view[slot].base) rd->src->unmap(rd->src->ctx, &rd->view[slot]);
    memset(&rd->view[slot], 0, sizeof rd->view[slot]);
}

/* Piece k is done with: its mapping goes (resident memory stays a few
 * pieces), its slot is free for the reader. */
static void reader_release(reader_t *rd, int64_t k)
{
    int slot = (int)(k % rd->nbuf);
    unmap_slot(rd, slot); /* (a piece whose wait failed has none) */
    pthread_mutex_lock(&rd->mu);
    rd->consumed = k + 1;
    pthread_cond_broadcast(&rd->cv);
    pthread_mutex_unlock(&rd->mu);
}

static void reader_stop(reader_t *rd, pthread_t th)
{
    pthread_mutex_lock(&rd->mu);
    rd->stop = 1;
    pthread_cond_broadcast(&rd->cv);
    pthread_mutex_unlock(&rd->mu);
    pthread_join(th, NULL);
    for (int i = 0; i < rd->nbuf; i++) unmap_slot(rd, i); /* pieces read ahead, never used */
}

/* ----------------------------------------------------------------- the run */

ch_status ch_reduce_run(ch_reducer_t *r, const ch_array_source_t *src, ch_pg_t *pg,
                        const ch_reduce_run_options_t *opt, int *stopped)
{
    CH_REQUIRE(r && src && opt && stopped, "ch_reduce_run: NULL argument");
    CH_REQUIRE(opt->prefetch >= 1 && opt->prefetch <= 8, "reduce prefetch %d outside 1..8",
               opt->prefetch);
    *stopped = 0;
    int rank = pg ? ch_pg_rank(pg) : 0, world = pg ? ch_pg_size(pg) : 1;
    size_t itemsize = ch_array_dtype_size(src->desc.dtype);
    int64_t chunk_elems = opt->chunk_bytes / (int64_t)itemsize;
    if (chunk_elems < 1) chunk_elems = 1;
    /* every rank makes as many steps as the rank with the most pieces */
    int64_t steps = 0;
    for (int q = 0; q < world; q++) {
        int64_t np = rank_pieces(src, q, world, chunk_elems, NULL);
        if (np > steps) steps = np;
    }
    int64_t npieces = rank_pieces(src, rank, world, chunk_elems, NULL);
    int64_t my_bytes = 0;
    piece_t *pieces = malloc((size_t)(npieces ? npieces : 1) * sizeof *pieces);
    reader_t rd;
    memset(&rd, 0, sizeof rd);
    rd.nbuf = opt->prefetch + 1;
    rd.buf = calloc((size_t)rd.nbuf, sizeof *rd.buf);
    rd.view = calloc((size_t)rd.nbuf, sizeof *rd.view);
    rd.data = calloc((size_t)rd.nbuf, sizeof *rd.data);
    rd.src = src;
    rd.use_map = opt->mmap && src->map && src->unmap;
    if (rd.use_map) bus_guard(1);
    ch_status s = (pieces && rd.buf && rd.view && rd.data) ? CH_OK : CH_ERROR(CH_ERR_NOMEM, "reduce pieces");
    if (s == CH_OK) {
        rank_pieces(src, rank, world, chunk_elems, pieces);
        int64_t biggest = 0;
        for (int64_t k = 0; k < npieces; k++) {
            my_bytes += pieces[k].n * (int64_t)itemsize;
            if (pieces[k].n > biggest) biggest = pieces[k].n;
        }
        /* (with mapping on, the buffers are only touched for a piece that
         * could not be mapped: untouched, they cost address space only) */
        for (int i = 0; i < rd.nbuf && s == CH_OK && biggest > 0; i++) {
            rd.buf[i] = malloc((size_t)biggest * itemsize);
            if (!rd.buf[i])
                s = CH_ERROR(CH_ERR_NOMEM, "reduce chunk buffer of %lld bytes",
                             (long long)(biggest * (int64_t)itemsize));
        }
    }
    /* agree on the allocation before any collective work */
    if (pg) s = ch_pg_check_all(pg, s, NULL);
    ch_reduce_step_t sum = {0};
    pthread_mutex_init(&rd.mu, NULL);
    pthread_cond_init(&rd.cv, NULL);
    for (int pass = opt->start_pass; s == CH_OK && pass < ch_reducer_passes(r); pass++) {
        int64_t step0 = pass == opt->start_pass ? opt->start_step : 0;
        rd.src = src;
        rd.pieces = pieces;
        rd.first = step0 < npieces ? step0 : npieces;
        rd.npieces = npieces;
        rd.produced = rd.consumed = rd.first;
        rd.stop = 0;
        rd.err = CH_OK;
        rd.itemsize = itemsize;
        pthread_t th;
        if (pthread_create(&th, NULL, reader_main, &rd) != 0) {
            s = CH_ERROR(CH_ERR_INTERNAL, "cannot start the reduce reader thread");
            if (pg) s = ch_pg_check_all(pg, s, NULL);
            break;
        }
        ch_reduce_step_t st = {pass, ch_reducer_passes(r), 0, steps, 0, my_bytes, 0, 0, 0, 0};
        for (int64_t k = 0; k < rd.first; k++) st.bytes_done += pieces[k].n * (int64_t)itemsize;
        /* Collectives only every sync_every steps (and at the last): a
         * rank whose read or feed failed keeps stepping without data until
         * then, so nobody waits in a collective another rank never enters;
         * on oversubscribed nodes each collective costs a scheduler slice. */
        int64_t sync_every = opt->sync_bytes > opt->chunk_bytes ? opt->sync_bytes / opt->chunk_bytes : 1;
        /* With sync_seconds also by the clock: the first agreement after one
         * step, then every interval steps (plan_interval), at most
         * sync_every; the agreement points change nothing in the sums. */
        int timed = opt->sync_seconds > 0;
        int64_t next_sync = step0, interval = 1;
        double t_sync = ch_time_now();
        ch_status local = CH_OK;
        for (int64_t step = step0; step < steps; step++) {
            if (step < npieces && local == CH_OK) {
                const unsigned char *data = NULL;
                double t0 = ch_time_now();
                local = reader_wait(&rd, step, &data);
                double t1 = ch_time_now();
                st.read_wait_s += t1 - t0;
                if (local == CH_OK) {
                    const piece_t *p = &pieces[step];
                    const ch_array_view_t *view = &rd.view[step % rd.nbuf];
                    if (view->base)
                        local = feed_mapped(r, src, p->seg, p->e0, p->n, view);
                    else
                        local = ch_reducer_feed(r, &src->seg[p->seg], src->seg_row0[p->seg], p->e0,
                                                p->n, data);
                    st.compute_s += ch_time_now() - t1;
                    st.bytes_done += p->n * (int64_t)itemsize;
                }
                reader_release(&rd, step);
            }
            int due = timed ? step >= next_sync : (step + 1) % sync_every == 0;
            if (!due && step + 1 != steps) continue;
            s = pg ? ch_pg_check_all(pg, local, NULL) : local;
            if (s != CH_OK) break;
            st.step = step;
            /* a stop after the last step of the last pass: nothing is left
             * to save for; the run finishes (the result is one merge away) */
            int last = pass + 1 == ch_reducer_passes(r) && step + 1 == steps;
            if (opt->step_hook && opt->step_hook(opt->arg, &st) && !last) {
                *stopped = 1;
                break;
            }
            if (timed && step + 1 < steps) {
                double now = ch_time_now();
                s = plan_interval(pg, opt->sync_seconds, now - t_sync, interval, sync_every, &interval);
                if (s != CH_OK) break;
                next_sync = step + interval;
                t_sync = now;
            }
        }
        reader_stop(&rd, th);
        sum.read_wait_s += st.read_wait_s;
        sum.compute_s += st.compute_s;
        sum.bytes_done += st.bytes_done;
        sum.mapped += rd.mapped;
        rd.mapped = 0;
        if (s != CH_OK || *stopped) break;
        double t0 = ch_time_now();
        s = ch_reducer_end_pass(r, pg);
        if (pg) s = ch_pg_check_all(pg, s, NULL);
        sum.combine_s += ch_time_now() - t0;
    }
    if (opt->totals) *opt->totals = sum;
    if (rd.use_map) bus_guard(0);
    pthread_cond_destroy(&rd.cv);
    pthread_mutex_destroy(&rd.mu);
    for (int i = 0; rd.buf && i < rd.nbuf; i++) free(rd.buf[i]);
    free(rd.buf);
    free(rd.view);
    free(rd.data);
    free(pieces);
    return s;
}

/* ------------------------------------------------------------- helpers */

static ch_status stats_pass(const ch_array_source_t *src, int channel_axis, ch_pg_t *pg,
                            ch_reduce_kind op, double *out)
{
    ch_reduce_spec_t spec;
    ch_reduce_spec_default(&spec);
    spec.op = op;
    spec.naxes = 0;
    for (int a = 0; a < src->desc.ndim; a++)
        if (a != channel_axis) spec.axes[spec.naxes++] = a;
    if (spec.naxes == 0)
        return CH_ERROR(CH_ERR_INVALID, "channel statistics of a 1-d array: nothing to reduce");
    ch_reducer_t *r;
    CH_TRY(ch_reducer_create(&spec, &src->desc, &r));
    ch_reduce_run_options_t o;
    ch_reduce_run_options_default(&o);
    int stopped = 0;
    ch_status s = ch_reduce_run(r, src, pg, &o, &stopped);
    ch_array_desc_t d;
    const void *data;
    if (s == CH_OK) s = ch_reducer_result(r, &d, &data, NULL, NULL);
    if (s == CH_OK) {
        int64_t n = src->desc.shape[channel_axis];
        for (int64_t c = 0; c < n; c++)
            out[c] = d.dtype == CH_DT_FLOAT32   ? ((const float *)data)[c]
                     : d.dtype == CH_DT_FLOAT16 ? ch_half_to_double(((const uint16_t *)data)[c])
                                                : ((const double *)data)[c];
    }
    ch_reducer_destroy(r);
    return s;
}

ch_status ch_reduce_channel_stats(const ch_array_source_t *src, int channel_axis, ch_pg_t *pg,
                                  double *mean, double *std)
{
    CH_REQUIRE(src && mean && std, "ch_reduce_channel_stats: NULL argument");
    int d = src->desc.ndim;
    if (channel_axis < 0) channel_axis += d;
    if (channel_axis < 0 || channel_axis >= d)
        return CH_ERROR(CH_ERR_RANGE, "channel axis %d is out of bounds for array of dimension %d",
                        channel_axis, d);
    CH_TRY(stats_pass(src, channel_axis, pg, CH_ROP_MEAN, mean));
    return stats_pass(src, channel_axis, pg, CH_ROP_STD, std);
}

int ch_reduce_checkpoint_due(ch_pg_t *pg, double *last, double seconds)
{
    int32_t due = 0;
    /* no clock (the same key on every rank): nothing to agree on, no broadcast */
    if (seconds <= 0) return 0;
    double now = ch_time_now();
    if ((!pg || ch_pg_rank(pg) == 0) && seconds > 0 && now - *last >= seconds) due = 1;
    if (pg && ch_pg_size(pg) > 1 && ch_pg_broadcast(pg, &due, 1, CH_DIST_INT32, 0) != CH_OK) due = 0;
    if (due) *last = now;
    return due;
}

/* ------------------------------------------------------------- config keys */

static const ch_config_key_t reduce_keys[] = {
    {"reduce.op", CH_CFG_STRING, "sum", CH_CFG_NO_RANGE,
     "Operation: sum mean var std min max argmin argmax nansum nanmean nanvar nanstd nanmin "
     "nanmax count_nonzero histogram.", "--op"},
    {"reduce.axis", CH_CFG_STRING, "none", CH_CFG_NO_RANGE,
     "Axis to reduce: none (all axes), an integer (negative counts from the end), or a tuple like 0,2.", "--axis"},
    {"reduce.keepdims", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE,
     "Keep reduced axes as length 1 (numpy keepdims).", "--keepdims"},
    {"reduce.ddof", CH_CFG_INT64, "0", 0, 1e18, "var/std: divide by count - ddof.", "--ddof"},
    {"reduce.mode", CH_CFG_STRING, "exact", CH_CFG_NO_RANGE,
     "exact (correctly rounded, same bits for any ranks and chunks) or fast (SIMD float64).", "--mode"},
    {"reduce.bins", CH_CFG_INT64, "10", 1, 1e9, "histogram: number of equal bins.", "--bins"},
    {"reduce.range", CH_CFG_STRING, "", CH_CFG_NO_RANGE,
     "histogram: LO,HI (default: the data's min,max).", "--range"},
    {"reduce.chunk_mb", CH_CFG_FLOAT, "16", 1e-6, 1e6,
     "Read size per chunk in MiB (resident: (prefetch + 1) chunks plus the state).", "--chunk_mb"},
    {"reduce.prefetch", CH_CFG_INT, "2", 1, 8, "Chunks the reader thread reads ahead.", "--prefetch"},
    {"reduce.sync_mb", CH_CFG_FLOAT, "256", 0, 1e9,
     "The ranks agree (errors, stop, checkpoint, progress) every this many MiB per rank.", "--sync_mb"},
    {"reduce.checkpoint_seconds", CH_CFG_FLOAT, "0", 0, 1e9,
     "Save the partial state every this many seconds (0: only when preempted).", "--checkpoint_seconds"},
    {"reduce.sync_seconds", CH_CFG_FLOAT, "1", 0, 1e9,
     "The ranks also agree (stop, checkpoint, progress) about every this many seconds (0: only by sync_mb).",
     "--sync_seconds"},
    {"reduce.mmap", CH_CFG_BOOL, "true", CH_CFG_NO_RANGE,
     "Memory-map each chunk of a .npy or raw input (no copy; pages mapped ahead by the reader "
     "thread, unmapped after the chunk) instead of reading it into a buffer; false: always pread. "
     "Where a chunk cannot be mapped (HDF5, an unaligned raw offset, mmap refused) it is read. "
     "Same bits either way.", "--mmap"},
};
ch_config_table_t ch_reduce_config_table(void)
{
    ch_config_table_t t = {"reduce", reduce_keys, (int)(sizeof reduce_keys / sizeof reduce_keys[0])};
    return t;
}

ch_status ch_reduce_options_from_config(const ch_config_t *cfg, ch_reduce_spec_t *spec,
                                        ch_reduce_run_options_t *run, double *checkpoint_seconds)
{
    static const char *const modes[] = {"exact", "fast"};
    const char *op, *axis, *range;
    int mode;
    double mb;
    ch_reduce_spec_default(spec);
    ch_reduce_run_options_default(run);
    CH_TRY(ch_config_get_string(cfg, "reduce.op", &op));
    if (ch_reduce_kind_from_name(op, &spec->op) != CH_OK)
        return ch_error_context("reduce.op (%s)", ch_config_source(cfg, "reduce.op"));
    CH_TRY(ch_config_get_string(cfg, "reduce.axis", &axis));
    if (ch_reduce_parse_axes(axis, spec) != CH_OK)
        return ch_error_context("reduce.axis (%s)", ch_config_source(cfg, "reduce.axis"));
    CH_TRY(ch_config_get_bool(cfg, "reduce.keepdims", &spec->keepdims));
    long long ll;
    CH_TRY(ch_config_get_int64(cfg, "reduce.ddof", &ll));
    spec->ddof = ll;
    CH_TRY(ch_config_get_choice(cfg, "reduce.mode", modes, 2, &mode));
    spec->mode = mode ? CH_REDUCE_FAST : CH_REDUCE_EXACT;
    CH_TRY(ch_config_get_int64(cfg, "reduce.bins", &ll));
    spec->bins = ll;
    CH_TRY(ch_config_get_string(cfg, "reduce.range", &range));
    if (*range) {
        char tail = 0;
        if (sscanf(range, " %lf , %lf %c", &spec->range[0], &spec->range[1], &tail) != 2)
            return CH_ERROR(CH_ERR_CONFIG, "reduce.range = '%s' (%s): expected LO,HI", range,
                            ch_config_source(cfg, "reduce.range"));
        spec->has_range = 1;
    }
    CH_TRY(ch_config_get_double(cfg, "reduce.chunk_mb", &mb));
    run->chunk_bytes = (int64_t)(mb * 1048576.0);
    CH_TRY(ch_config_get_int(cfg, "reduce.prefetch", &run->prefetch));
    CH_TRY(ch_config_get_double(cfg, "reduce.sync_mb", &mb));
    run->sync_bytes = (int64_t)(mb * 1048576.0);
    CH_TRY(ch_config_get_double(cfg, "reduce.sync_seconds", &run->sync_seconds));
    CH_TRY(ch_config_get_bool(cfg, "reduce.mmap", &run->mmap));
    return ch_config_get_double(cfg, "reduce.checkpoint_seconds", checkpoint_seconds);
}
