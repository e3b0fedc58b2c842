/* cohort: in-process function tasks over ranks and threads (see map.h). */
#include "framework/farm/map.h"

#include "framework/farm/farm.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t n, chunk, my_chunks;
    int rank, size;
    size_t rs;
    ch_farm_map_fn fn;
    void *ctx;
    char *local;  /* results of this rank's chunks, in chunk order */
    int64_t next; /* next chunk of this rank (atomic) */
    int stop;     /* atomic: a task failed */
    pthread_mutex_t mu;
    int64_t err_i; /* lowest failing index here (INT64_MAX: none) */
    ch_status err;
    char msg[CH_ERROR_MAX];
} map_t;

static void *map_thread(void *arg)
{
    map_t *m = arg;
    for (;;) {
        int64_t j = __atomic_fetch_add(&m->next, 1, __ATOMIC_RELAXED);
        if (j >= m->my_chunks || __atomic_load_n(&m->stop, __ATOMIC_RELAXED)) break;
        int64_t c = m->rank + j * m->size, lo = c * m->chunk;
        int64_t hi = lo + m->chunk < m->n ? lo + m->chunk : m->n;
        char *out = m->local + (size_t)(j * m->chunk) * m->rs;
        for (int64_t i = lo; i < hi; i++, out += m->rs) {
            ch_status s = m->fn(i, out, m->ctx);
            if (!s) continue;
            pthread_mutex_lock(&m->mu);
            if (i < m->err_i) {
                m->err_i = i;
                m->err = s;
                snprintf(m->msg, sizeof m->msg, "task %" PRId64 " (rank %d): %s", i, m->rank,
                         ch_error_message());
            }
            pthread_mutex_unlock(&m->mu);
            __atomic_store_n(&m->stop, 1, __ATOMIC_RELAXED);
            break;
        }
    }
    return NULL;
}

/* Collective: the lowest failing task's status and message on every rank. */
static ch_status agree_first(MPI_Comm comm, const map_t *m, int64_t err_i, ch_status err,
                             const char *msg)
{
    long long mine = err_i, lowest;
    MPI_Allreduce(&mine, &lowest, 1, MPI_LONG_LONG, MPI_MIN, comm);
    if (lowest == INT64_MAX) return CH_OK;
    int owner_mine = mine == lowest ? m->rank : m->size, owner;
    MPI_Allreduce(&owner_mine, &owner, 1, MPI_INT, MPI_MIN, comm);
    char buf[CH_ERROR_MAX];
    int code = err;
    snprintf(buf, sizeof buf, "%s", msg);
    MPI_Bcast(buf, sizeof buf, MPI_CHAR, owner, comm);
    MPI_Bcast(&code, 1, MPI_INT, owner, comm);
    return ch_error_adopt(code, buf);
}

ch_status ch_farm_map(MPI_Comm comm, const ch_farm_map_options_t *o, int64_t n, size_t result_size,
                      ch_farm_map_fn fn, void *ctx, void *results)
{
    map_t m;
    memset(&m, 0, sizeof m);
    MPI_Comm_rank(comm, &m.rank);
    MPI_Comm_size(comm, &m.size);
    /* argument checks: every rank sees the same n, result_size and fn */
    ch_status s = CH_OK;
    if (n < 0 || result_size == 0 || result_size > (1u << 20) || !fn)
        s = CH_ERROR(CH_ERR_INVALID, "ch_farm_map: n %" PRId64 ", result_size %zu, fn %s", n,
                     result_size, fn ? "set" : "NULL");
    else if (m.rank == 0 && !results && n > 0)
        s = CH_ERROR(CH_ERR_INVALID, "ch_farm_map: rank 0 needs a results buffer");
    int threads = o ? o->threads : 0;
    if (threads <= 0) { /* collective: every rank with the same options gets here */
        int *cpus = NULL, n_cpus = 1;
        ch_status s2 = ch_farm_cpu_share(comm, &cpus, &n_cpus);
        if (!s) s = s2;
        free(cpus);
        threads = n_cpus > 0 ? n_cpus : 1;
    }
    int total_threads = 0;
    MPI_Allreduce(&threads, &total_threads, 1, MPI_INT, MPI_SUM, comm);
    m.n = n;
    m.rs = result_size;
    m.fn = fn;
    m.ctx = ctx;
    m.chunk = o && o->chunk > 0 ? o->chunk : n / (16 * (int64_t)total_threads);
    if (m.chunk < 1) m.chunk = 1;
    int64_t nchunks = (n + m.chunk - 1) / m.chunk;
    m.my_chunks = nchunks > m.rank ? (nchunks - m.rank + m.size - 1) / m.size : 0;
    int64_t my_items = 0;
    for (int64_t j = 0; j < m.my_chunks; j++) {
        int64_t lo = (m.rank + j * m.size) * m.chunk;
        my_items += (lo + m.chunk < n ? m.chunk : n - lo);
    }
    if (!s && (double)my_items * (double)result_size > 2147483647.0)
        s = CH_ERROR(CH_ERR_INVALID, "ch_farm_map: %" PRId64 " results of %zu bytes on rank %d: "
                     "over 2 GiB per rank (use more ranks or smaller results)", my_items,
                     result_size, m.rank);
    m.local = s ? NULL : malloc(my_items ? (size_t)my_items * result_size : 1);
    if (!s && !m.local) s = CH_ERROR(CH_ERR_NOMEM, "ch_farm_map: out of memory for the results");
    m.err_i = INT64_MAX;
    /* a bad argument anywhere: every rank fails with it (as "task -1") */
    ch_status st = agree_first(comm, &m, s ? -1 : INT64_MAX, s, ch_error_message());
    if (st) {
        free(m.local);
        return st;
    }
    pthread_mutex_init(&m.mu, NULL);
    pthread_t *tid = malloc(sizeof *tid * (size_t)threads);
    int started = 0;
    for (int t = 0; tid && t < threads - 1; t++, started++)
        if (pthread_create(&tid[t], NULL, map_thread, &m) != 0) break;
    map_thread(&m); /* the calling thread works too */
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
    free(tid);
    pthread_mutex_destroy(&m.mu);
    st = agree_first(comm, &m, m.err_i, m.err, m.msg);
    if (st) {
        free(m.local);
        return st;
    }
    /* gather to rank 0, then chunk c of rank r goes to indices [c*chunk, ...) */
    int count = (int)((size_t)my_items * result_size);
    int *counts = NULL, *displs = NULL;
    char *all = NULL;
    if (m.rank == 0) {
        counts = malloc(sizeof(int) * (size_t)m.size);
        displs = malloc(sizeof(int) * (size_t)m.size);
        all = malloc(n ? (size_t)n * result_size : 1);
    }
    int ok = m.rank != 0 || (counts && displs && all);
    int all_ok;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
    if (!all_ok) {
        free(counts);
        free(displs);
        free(all);
        free(m.local);
        return CH_ERROR(CH_ERR_NOMEM, "ch_farm_map: out of memory on rank 0 for %" PRId64
                        " results", n);
    }
    MPI_Gather(&count, 1, MPI_INT, counts, 1, MPI_INT, 0, comm);
    if (m.rank == 0) {
        int64_t off = 0;
        for (int r = 0; r < m.size; r++) {
            displs[r] = (int)off;
            off += counts[r];
        }
    }
    MPI_Gatherv(m.local, count, MPI_BYTE, all, counts, displs, MPI_BYTE, 0, comm);
    if (m.rank == 0) {
        for (int r = 0; r < m.size; r++) {
            const char *src = all + displs[r];
            for (int64_t c = r; c < nchunks; c += m.size) {
                int64_t lo = c * m.chunk, k = lo + m.chunk < n ? m.chunk : n - lo;
                memcpy((char *)results + (size_t)lo * result_size, src, (size_t)k * result_size);
                src += (size_t)k * result_size;
            }
        }
    }
    free(counts);
    free(displs);
    free(all);
    free(m.local);
    return CH_OK;
}
