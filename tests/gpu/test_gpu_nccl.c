/* NCCL process group (framework/dist/dist.h ch_pg_create_nccl over the MPI
 * world) and SyncBN's pieces on the GPU.
 *
 * Runs alone and as -np2.mpi. Each rank uses GPU `rank` (one node), so the
 * tests SKIP (with the counts) when there are fewer GPUs than ranks: NCCL
 * cannot put two ranks of one communicator on one device. Without any GPU
 * they SKIP with the reason.
 *
 *  - collectives: all-reduce SUM and AVG (in place and out of place, up to
 *    64 MiB), broadcast from the first and the last rank, all-gather, with
 *    values whose sums are exact in float32; and a collective ordered
 *    against a compute context's stream (fill -> all-reduce -> scale, no
 *    host wait in between); DDP's pattern of four non-blocking all-reduces
 *    (25 MiB down to 7 floats) waited in reverse order on the device.
 *  - SyncBN: stats -> all-gather (NCCL) -> gather_stats -> update_running ->
 *    apply -> backward_reduce -> all-reduce (NCCL) -> backward_elemt ->
 *    param_grads on GPU tensors equals the same sequence on the CPU backend
 *    with MPI collectives on host tensors (relative L2 1e-4 forward, 1e-3
 *    gradients), activations PLAIN and NHWC, uneven per-rank batches.
 *
 * Nothing asserts between collectives: each phase records its status, the
 * ranks agree (MPI) before the next collective, and assertions come last.
 */
#include "config.h"

#include "tests/gpu/gpu_testutil.h"

#include "framework/tensor/device.h"
#include "framework/dist/dist.h"
#include "framework/ops/ops.h"
#include "framework/core/status.h"
#include "framework/tensor/tensor.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Skip unless every rank has its own GPU. Same decision on every rank
 * (ranks share the node, so they see the same device count). */
static void need_gpu_per_rank(int *ndev_out)
{
    GT_NEED_GPU();
    int ndev = 0, W = ch_test_world_size();
    if (gt_cpu_mode()) {
        *ndev_out = W; /* every rank "its own device": the CPU */
        return;
    }
    assert_ch_ok(ch_device_count(&ndev));
    int mn = ndev;
    MPI_Allreduce(&ndev, &mn, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (mn < W)
        ch_test_skip("%d ranks but %d GPU%s visible: NCCL needs one device per rank", W, mn,
                     mn == 1 ? "" : "s");
    *ndev_out = mn;
}

/* All ranks agree whether every rank is still fine (MPI, host). */
static int all_ok(ch_status s)
{
    int ok = s == CH_OK, all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all;
}

/* The NCCL group over mpi on GPU dev; in the CPU self-check mode
 * (COHORT_GPU_TESTS_ON_CPU=1, gpu_testutil.h) the MPI group itself. */
static ch_status make_nccl(ch_pg_t *mpi, int dev, ch_pg_t **nc)
{
    if (gt_cpu_mode()) {
        *nc = mpi;
        return CH_OK;
    }
    return ch_pg_create_nccl(mpi, dev, nc);
}

static void destroy_groups(ch_pg_t *nc, ch_pg_t *mpi)
{
    if (nc != mpi) ch_pg_destroy(nc);
    ch_pg_destroy(mpi);
}

static ch_status set_device(int dev) { return gt_cpu_mode() ? CH_OK : ch_device_set(dev); }

/* The compute stream for the NCCL group (NULL, the MPI group's no-op, in
 * the CPU self-check mode); an error when a GPU context has none. */
static ch_status compute_stream(ch_compute_t *cx, void **stream)
{
    *stream = ch_compute_stream(cx, CH_DEV_CUDA);
    if (!*stream && !gt_cpu_mode())
        return CH_ERROR(CH_ERR_CUDA, "ch_compute_stream gave NULL for a GPU context");
    return CH_OK;
}

typedef struct {
    ch_status st;
    char msg[CH_ERROR_MAX + 256];
    long bad;
    char first[256];
} outcome_t;

#define STEP(o, expr)                                                                  \
    do {                                                                               \
        if ((o)->st == CH_OK) {                                                        \
            ch_status s_ = (expr);                                                     \
            if (s_ != CH_OK) {                                                         \
                (o)->st = s_;                                                          \
                snprintf((o)->msg, sizeof (o)->msg, "%s: %s", #expr, ch_error_message()); \
            }                                                                          \
        }                                                                              \
    } while (0)

/* The verdict of every rank: fails on all ranks if any rank failed. */
static void verdict(const char *what, const outcome_t *o)
{
    int mine = o->st == CH_OK && o->bad == 0, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (o->st != CH_OK) fail_msg("%s (rank %d): %s", what, ch_test_rank(), o->msg);
    if (o->bad) fail_msg("%s (rank %d): %ld wrong values; first: %s", what, ch_test_rank(), o->bad, o->first);
    if (!all) fail_msg("%s: another rank failed", what);
}

static float val(int r, int64_t i) { return (float)(r + 1) * (float)(i % 13 - 6) * 0.25f; }

/* ------------------------------------------------------------ collectives */

static void test_nccl_collectives(void **state)
{
    int ndev = 0;
    need_gpu_per_rank(&ndev);
    const int64_t sizes[] = {1, 1000003, (int64_t)16 * 1024 * 1024 + 5};
    outcome_t o;
    memset(&o, 0, sizeof o);
    ch_pg_t *mpi = NULL, *nc = NULL;
    ch_compute_t *cx = NULL;
    int rank = ch_test_rank(), W = ch_test_world_size();
    ch_compute_options_t co;
    ch_compute_options_default(&co);
    co.gpu_device = rank % ndev;
    STEP(&o, set_device(rank % ndev));
    STEP(&o, ch_compute_create(&co, &cx));
    STEP(&o, ch_pg_create_mpi(MPI_COMM_WORLD, &mpi));
    if (all_ok(o.st)) STEP(&o, make_nccl(mpi, rank % ndev, &nc));
    void *stream = NULL;
    STEP(&o, compute_stream(cx, &stream));
    const int64_t maxn = sizes[2];
    float *host = malloc((size_t)(maxn * W) * sizeof(float));
    void *a = NULL, *b = NULL, *g = NULL;
    if (!host) STEP(&o, CH_ERROR(CH_ERR_NOMEM, "host buffer"));
    STEP(&o, ch_pg_buffer_alloc(nc, (size_t)maxn * sizeof(float), &a));
    STEP(&o, ch_pg_buffer_alloc(nc, (size_t)maxn * sizeof(float), &b));
    STEP(&o, ch_pg_buffer_alloc(nc, (size_t)(maxn * W) * sizeof(float), &g));
    if (!gt_cpu_mode() && o.st == CH_OK) {
        /* a new group refuses collectives until it has a compute stream */
        ch_status r0 = ch_pg_allreduce(nc, a, a, 1, CH_DIST_FLOAT32, CH_REDUCE_SUM);
        if (r0 != CH_ERR_INVALID || !strstr(ch_error_message(), "no compute stream"))
            STEP(&o, CH_ERROR(CH_ERR_INTERNAL, "a collective without a compute stream gave %s",
                              ch_status_name(r0)));
        ch_error_clear();
    }
    STEP(&o, ch_pg_nccl_set_stream(nc, stream));
    for (int si = 0; si < 3 && all_ok(o.st); si++) {
        int64_t n = sizes[si];
        size_t bytes = (size_t)n * sizeof(float);
        for (int op = 0; op < 2; op++)
            for (int inplace = 0; inplace < 2; inplace++) {
                for (int64_t i = 0; i < n; i++) host[i] = val(rank, i);
                STEP(&o, ch_pg_buffer_write(nc, a, host, bytes));
                if (!all_ok(o.st)) goto done;
                ch_reduce_op rop = op ? CH_REDUCE_AVG : CH_REDUCE_SUM;
                STEP(&o, ch_pg_allreduce(nc, a, inplace ? a : b, n, CH_DIST_FLOAT32, rop));
                STEP(&o, ch_pg_synchronize(nc));
                STEP(&o, ch_pg_buffer_read(nc, host, inplace ? a : b, bytes));
                if (o.st != CH_OK) continue;
                for (int64_t i = 0; i < n; i++) {
                    float e = (float)(i % 13 - 6) * 0.25f * (float)(W * (W + 1) / 2);
                    if (op) e = (float)(i % 13 - 6) * 0.25f * (float)(W + 1) / 2.0f;
                    if (fabsf(host[i] - e) > (op ? 1e-6f * fabsf(e) : 0.0f) && o.bad++ == 0)
                        snprintf(o.first, sizeof o.first, "%s %s n=%lld [%lld] = %g, expected %g",
                                 op ? "avg" : "sum", inplace ? "in place" : "out of place",
                                 (long long)n, (long long)i, host[i], e);
                }
            }
        /* broadcast from the first and the last rank */
        for (int root = 0; root < W; root += (W > 1 ? W - 1 : 1)) {
            for (int64_t i = 0; i < n; i++) host[i] = rank == root ? val(root, i) : NAN;
            STEP(&o, ch_pg_buffer_write(nc, a, host, bytes));
            if (!all_ok(o.st)) goto done;
            STEP(&o, ch_pg_broadcast(nc, a, n, CH_DIST_FLOAT32, root));
            STEP(&o, ch_pg_synchronize(nc));
            STEP(&o, ch_pg_buffer_read(nc, host, a, bytes));
            if (o.st != CH_OK) continue;
            for (int64_t i = 0; i < n; i++)
                if (host[i] != val(root, i) && o.bad++ == 0)
                    snprintf(o.first, sizeof o.first, "broadcast root %d n=%lld [%lld] = %g", root,
                             (long long)n, (long long)i, host[i]);
        }
        /* all-gather, out of place and in place */
        for (int inplace = 0; inplace < 2; inplace++) {
            for (int64_t i = 0; i < n; i++) host[i] = val(rank, i);
            float *send = inplace ? (float *)g + (size_t)rank * (size_t)n : (float *)a;
            STEP(&o, ch_pg_buffer_write(nc, send, host, bytes));
            if (!all_ok(o.st)) goto done;
            STEP(&o, ch_pg_allgather(nc, send, g, n, CH_DIST_FLOAT32));
            STEP(&o, ch_pg_synchronize(nc));
            STEP(&o, ch_pg_buffer_read(nc, host, g, bytes * (size_t)W));
            if (o.st != CH_OK) continue;
            for (int r = 0; r < W; r++)
                for (int64_t i = 0; i < n; i++)
                    if (host[(size_t)r * (size_t)n + (size_t)i] != val(r, i) && o.bad++ == 0)
                        snprintf(o.first, sizeof o.first, "allgather%s n=%lld block %d [%lld]",
                                 inplace ? " in place" : "", (long long)n, r, (long long)i);
        }
    }
done:
    ch_pg_buffer_free(nc, a);
    ch_pg_buffer_free(nc, b);
    ch_pg_buffer_free(nc, g);
    free(host);
    destroy_groups(nc, mpi);
    ch_compute_destroy(cx);
    verdict("NCCL collectives", &o);
}

/* fill (compute stream) -> all-reduce (comm stream) -> scale (compute
 * stream) with no host wait: the group's stream hand-off orders them. */
static void test_nccl_compute_stream_order(void **state)
{
    int ndev = 0;
    need_gpu_per_rank(&ndev);
    outcome_t o;
    memset(&o, 0, sizeof o);
    int rank = ch_test_rank(), W = ch_test_world_size();
    ch_pg_t *mpi = NULL, *nc = NULL;
    ch_compute_t *cx = NULL;
    ch_compute_options_t co;
    ch_compute_options_default(&co);
    co.gpu_device = rank % ndev;
    STEP(&o, set_device(rank % ndev));
    STEP(&o, ch_compute_create(&co, &cx));
    STEP(&o, ch_pg_create_mpi(MPI_COMM_WORLD, &mpi));
    if (all_ok(o.st)) STEP(&o, make_nccl(mpi, rank % ndev, &nc));
    void *stream = NULL;
    STEP(&o, compute_stream(cx, &stream));
    STEP(&o, ch_pg_nccl_set_stream(nc, stream));
    const int64_t n = 8 * 1024 * 1024 + 1;
    ch_tensor_t d, h;
    memset(&d, 0, sizeof d);
    memset(&h, 0, sizeof h);
    STEP(&o, ch_tensor_alloc(&d, CH_F32, 1, &n, CH_LAYOUT_PLAIN, gt_dev(),
                             gt_cpu_mode() ? 0 : rank % ndev));
    STEP(&o, ch_tensor_alloc(&h, CH_F32, 1, &n, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    for (int round = 0; round < 3 && all_ok(o.st); round++) {
        STEP(&o, ch_op_fill(cx, &d, (float)(rank + 1 + round)));
        STEP(&o, ch_pg_allreduce(nc, d.data, d.data, n, CH_DIST_FLOAT32, CH_REDUCE_SUM));
        STEP(&o, ch_op_scale(cx, &d, 2.0f));
        STEP(&o, gt_download_s(cx, &d, &h));
        if (o.st != CH_OK) break;
        float e = 2.0f * (float)(W * (W + 1) / 2 + W * round);
        for (int64_t i = 0; i < n; i++)
            if (ch_tensor_f32(&h)[i] != e && o.bad++ == 0)
                snprintf(o.first, sizeof o.first, "round %d [%lld] = %g, expected %g", round,
                         (long long)i, ch_tensor_f32(&h)[i], e);
    }
    STEP(&o, ch_pg_synchronize(nc));
    ch_tensor_free(&d);
    ch_tensor_free(&h);
    destroy_groups(nc, mpi);
    ch_compute_destroy(cx);
    verdict("NCCL ordered against the compute stream", &o);
}

/* DDP's pattern: several non-blocking all-reduces (buckets) started after
 * kernels on the compute stream, completed in another order with
 * ch_work_wait (device-side waits), then consumed by kernels on the compute
 * stream; the host waits only at the end. */
static void test_nccl_buckets(void **state)
{
    int ndev = 0;
    need_gpu_per_rank(&ndev);
    outcome_t o;
    memset(&o, 0, sizeof o);
    int rank = ch_test_rank(), W = ch_test_world_size(), dev = rank % ndev;
    enum { NB = 4 };
    const int64_t n[NB] = {(int64_t)25 * 1024 * 1024 / 4, 1000001, 7, 3 * 1024 * 1024};
    const ch_reduce_op op[NB] = {CH_REDUCE_AVG, CH_REDUCE_SUM, CH_REDUCE_SUM, CH_REDUCE_AVG};
    ch_pg_t *mpi = NULL, *nc = NULL;
    ch_compute_t *cx = NULL;
    ch_compute_options_t co;
    ch_compute_options_default(&co);
    co.gpu_device = dev;
    STEP(&o, set_device(dev));
    STEP(&o, ch_compute_create(&co, &cx));
    STEP(&o, ch_pg_create_mpi(MPI_COMM_WORLD, &mpi));
    if (all_ok(o.st)) STEP(&o, make_nccl(mpi, dev, &nc));
    void *stream = NULL;
    STEP(&o, compute_stream(cx, &stream));
    STEP(&o, ch_pg_nccl_set_stream(nc, stream));
    ch_tensor_t d[NB], h;
    memset(d, 0, sizeof d);
    memset(&h, 0, sizeof h);
    for (int b = 0; b < NB; b++)
        STEP(&o, ch_tensor_alloc(&d[b], CH_F32, 1, &n[b], CH_LAYOUT_PLAIN, gt_dev(),
                                 gt_cpu_mode() ? 0 : dev));
    STEP(&o, ch_tensor_alloc(&h, CH_F32, 1, &n[0], CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
    for (int round = 0; round < 2 && all_ok(o.st); round++) {
        ch_work_t *w[NB] = {NULL};
        for (int b = 0; b < NB; b++)
            STEP(&o, ch_op_fill(cx, &d[b], (float)((rank + 1) * (b + 1 + round))));
        if (!all_ok(o.st)) break; /* every rank starts the collectives, or none */
        for (int b = 0; b < NB; b++)
            STEP(&o, ch_pg_iallreduce(nc, d[b].data, d[b].data, n[b], CH_DIST_FLOAT32, op[b], &w[b]));
        for (int b = NB - 1; b >= 0; b--) STEP(&o, ch_work_wait(&w[b]));
        for (int b = 0; b < NB; b++) STEP(&o, ch_op_scale(cx, &d[b], 0.5f));
        for (int b = 0; b < NB && o.st == CH_OK; b++) {
            ch_tensor_t hv;
            STEP(&o, ch_tensor_wrap(&hv, h.data, CH_F32, 1, &n[b], CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
            STEP(&o, gt_download_s(cx, &d[b], &hv));
            if (o.st != CH_OK) break;
            float sum = (float)(b + 1 + round) * (float)(W * (W + 1) / 2);
            float e = 0.5f * (op[b] == CH_REDUCE_AVG ? sum / (float)W : sum);
            for (int64_t i = 0; i < n[b]; i++)
                if (fabsf(ch_tensor_f32(&h)[i] - e) > 1e-6f * e && o.bad++ == 0)
                    snprintf(o.first, sizeof o.first, "round %d bucket %d [%lld] = %g, expected %g",
                             round, b, (long long)i, ch_tensor_f32(&h)[i], e);
        }
        /* a handle left over (on an error above) must still be completed */
        for (int b = 0; b < NB; b++)
            if (w[b]) (void)ch_work_wait(&w[b]);
    }
    STEP(&o, ch_pg_synchronize(nc));
    for (int b = 0; b < NB; b++) ch_tensor_free(&d[b]);
    ch_tensor_free(&h);
    destroy_groups(nc, mpi);
    ch_compute_destroy(cx);
    verdict("NCCL buckets (iallreduce, out-of-order waits)", &o);
}

/* ------------------------------------------------------------------ SyncBN */

typedef struct {
    ch_tensor_t x, dy, w, b, rm, rv;      /* inputs */
    ch_tensor_t mean_r, var_r, means, vars, mean, var, y, sdy, sdx, dx, dw, db;
} bn_set_t;

static ch_status bn_alloc(bn_set_t *s, const int64_t *xs, int W, ch_layout_t L, ch_devkind_t dev,
                          int di)
{
    int64_t C = xs[1], c1[1] = {C}, wc[2] = {W, C};
    memset(s, 0, sizeof *s);
    ch_tensor_t *vecs[] = {&s->w, &s->b, &s->rm, &s->rv, &s->mean_r, &s->var_r, &s->mean,
                           &s->var, &s->sdy, &s->sdx, &s->dw, &s->db};
    CH_TRY(ch_tensor_alloc(&s->x, CH_F32, 4, xs, L, dev, di));
    CH_TRY(ch_tensor_alloc(&s->dy, CH_F32, 4, xs, L, dev, di));
    CH_TRY(ch_tensor_alloc(&s->y, CH_F32, 4, xs, L, dev, di));
    CH_TRY(ch_tensor_alloc(&s->dx, CH_F32, 4, xs, L, dev, di));
    CH_TRY(ch_tensor_alloc(&s->means, CH_F32, 2, wc, CH_LAYOUT_PLAIN, dev, di));
    CH_TRY(ch_tensor_alloc(&s->vars, CH_F32, 2, wc, CH_LAYOUT_PLAIN, dev, di));
    for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++)
        CH_TRY(ch_tensor_alloc(vecs[i], CH_F32, 1, c1, CH_LAYOUT_PLAIN, dev, di));
    return CH_OK;
}

static void bn_free(bn_set_t *s)
{
    ch_tensor_t *all[] = {&s->x, &s->dy, &s->w, &s->b, &s->rm, &s->rv, &s->mean_r, &s->var_r,
                          &s->means, &s->vars, &s->mean, &s->var, &s->y, &s->sdy, &s->sdx,
                          &s->dx, &s->dw, &s->db};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ch_tensor_free(all[i]);
}

/* Collectives of one SyncBN path: MPI on host buffers or NCCL on device ones. */
typedef struct {
    ch_pg_t *pg;
} coll_t;

static ch_status coll_gather(coll_t *c, const ch_tensor_t *in, ch_tensor_t *out, int64_t C)
{
    return ch_pg_allgather(c->pg, in->data, out->data, C, CH_DIST_FLOAT32);
}

static ch_status coll_sum(coll_t *c, ch_tensor_t *t, int64_t C)
{
    return ch_pg_allreduce(c->pg, t->data, t->data, C, CH_DIST_FLOAT32, CH_REDUCE_SUM);
}

/* One SyncBN training step (forward with running stats, backward) on the
 * device of s, SEMANTICS.md's order. counts: per-rank N*H*W (host). */
static ch_status syncbn_step(ch_compute_t *cx, coll_t *c, bn_set_t *s, const int64_t *counts,
                             int W, float eps, int64_t *total)
{
    int64_t C = s->x.shape[1];
    CH_TRY(ch_op_batchnorm_stats(cx, &s->x, &s->mean_r, &s->var_r));
    CH_TRY(coll_gather(c, &s->mean_r, &s->means, C));
    CH_TRY(coll_gather(c, &s->var_r, &s->vars, C));
    CH_TRY(ch_op_batchnorm_gather_stats(cx, &s->means, &s->vars, counts, W, &s->mean, &s->var,
                                        total));
    CH_TRY(ch_op_batchnorm_update_running(cx, &s->rm, &s->rv, &s->mean, &s->var, *total, 0.1f));
    CH_TRY(ch_op_batchnorm_apply(cx, &s->x, &s->mean, &s->var, &s->w, &s->b, eps, &s->y));
    CH_TRY(ch_op_batchnorm_backward_reduce(cx, &s->x, &s->dy, &s->mean, &s->sdy, &s->sdx));
    CH_TRY(coll_sum(c, &s->sdy, C));
    CH_TRY(coll_sum(c, &s->sdx, C));
    CH_TRY(ch_op_batchnorm_backward_elemt(cx, &s->x, &s->dy, &s->mean, &s->var, eps, &s->w,
                                          &s->sdy, &s->sdx, *total, &s->dx));
    CH_TRY(ch_op_batchnorm_param_grads(cx, &s->sdy, &s->sdx, &s->var, eps, &s->dw, &s->db));
    return ch_compute_sync(cx);
}

static void compare_into(outcome_t *o, ch_compute_t *cx, const char *what, const ch_tensor_t *dev,
                         const ch_tensor_t *ref, double tol)
{
    if (o->st != CH_OK) return;
    ch_tensor_t g;
    ch_status s = ch_tensor_alloc(&g, CH_F32, ref->ndim, ref->shape, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0);
    ch_tensor_t plain_ref;
    memset(&plain_ref, 0, sizeof plain_ref);
    if (s == CH_OK) s = gt_download_s(cx, dev, &g);
    const ch_tensor_t *r = ref;
    if (s == CH_OK && ref->layout != CH_LAYOUT_PLAIN) {
        s = ch_tensor_alloc(&plain_ref, CH_F32, ref->ndim, ref->shape, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0);
        if (s == CH_OK) s = ch_op_reorder(cx, ref, &plain_ref);
        r = &plain_ref;
    }
    if (s != CH_OK) {
        STEP(o, s);
    } else {
        double e = gt_rel_l2(ch_tensor_f32(&g), ch_tensor_f32(r), ch_tensor_numel(&g));
        if (!(e <= tol) && o->bad++ == 0)
            snprintf(o->first, sizeof o->first, "%s: GPU vs CPU relative L2 %.3g > %.1g", what, e, tol);
    }
    ch_tensor_free(&g);
    ch_tensor_free(&plain_ref);
}

static void test_syncbn_gpu_vs_cpu(void **state)
{
    int ndev = 0;
    need_gpu_per_rank(&ndev);
    outcome_t o;
    memset(&o, 0, sizeof o);
    int rank = ch_test_rank(), W = ch_test_world_size(), dev = rank % ndev;
    const float eps = 1e-5f;
    ch_pg_t *mpi = NULL, *nc = NULL;
    ch_compute_t *cx = NULL;
    ch_compute_options_t co;
    ch_compute_options_default(&co);
    co.gpu_device = dev;
    co.allow_tf32 = 0;
    STEP(&o, set_device(dev));
    STEP(&o, ch_compute_create(&co, &cx));
    STEP(&o, ch_pg_create_mpi(MPI_COMM_WORLD, &mpi));
    if (all_ok(o.st)) STEP(&o, make_nccl(mpi, dev, &nc));
    void *stream = NULL;
    STEP(&o, compute_stream(cx, &stream));
    STEP(&o, ch_pg_nccl_set_stream(nc, stream));
    for (int li = 0; li < 2 && all_ok(o.st); li++) {
        ch_layout_t L = li ? CH_LAYOUT_NHWC : CH_LAYOUT_PLAIN;
        const int64_t C = 32, H = 6, Wd = 5;
        int64_t counts[64];
        for (int r = 0; r < W && r < 64; r++) counts[r] = (3 + r) * H * Wd; /* uneven batches */
        int64_t xs[4] = {3 + rank, C, H, Wd};
        bn_set_t hs, ds;
        memset(&hs, 0, sizeof hs);
        memset(&ds, 0, sizeof ds);
        STEP(&o, bn_alloc(&hs, xs, W, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
        STEP(&o, bn_alloc(&ds, xs, W, L, gt_dev(), gt_cpu_mode() ? 0 : dev));
        if (o.st == CH_OK) {
            gt_fill(ch_tensor_f32(&hs.x), ch_tensor_numel(&hs.x), 200 + rank, -0.5f + rank, 2.5f);
            gt_fill(ch_tensor_f32(&hs.dy), ch_tensor_numel(&hs.dy), 300 + rank, -1, 1);
            gt_fill(ch_tensor_f32(&hs.w), C, 400, 0.5f, 1.5f);
            gt_fill(ch_tensor_f32(&hs.b), C, 401, -0.5f, 0.5f);
            gt_fill(ch_tensor_f32(&hs.rm), C, 402, -0.5f, 0.5f);
            gt_fill(ch_tensor_f32(&hs.rv), C, 403, 0.5f, 2.0f);
        }
        STEP(&o, gt_upload_s(cx, &hs.x, &ds.x));
        STEP(&o, gt_upload_s(cx, &hs.dy, &ds.dy));
        STEP(&o, gt_upload_s(cx, &hs.w, &ds.w));
        STEP(&o, gt_upload_s(cx, &hs.b, &ds.b));
        STEP(&o, gt_upload_s(cx, &hs.rm, &ds.rm));
        STEP(&o, gt_upload_s(cx, &hs.rv, &ds.rv));
        int64_t th = -1, td = -1;
        if (all_ok(o.st)) {
            coll_t cm = {mpi};
            STEP(&o, syncbn_step(cx, &cm, &hs, counts, W, eps, &th));
        }
        if (all_ok(o.st)) {
            coll_t cn = {nc};
            STEP(&o, syncbn_step(cx, &cn, &ds, counts, W, eps, &td));
            STEP(&o, ch_pg_synchronize(nc));
        }
        if (o.st == CH_OK && (th != td || th != (int64_t)(3 * W + W * (W - 1) / 2) * H * Wd) &&
            o.bad++ == 0)
            snprintf(o.first, sizeof o.first, "total count: GPU %lld, CPU %lld", (long long)td,
                     (long long)th);
        const char *ln = ch_layout_name(L);
        char what[96];
#define CMP(field, tol)                                                                 \
        do {                                                                            \
            snprintf(what, sizeof what, "SyncBN %s: " #field, ln);                      \
            compare_into(&o, cx, what, &ds.field, &hs.field, tol);                      \
        } while (0)
        CMP(mean_r, 1e-4);
        CMP(var_r, 1e-4);
        CMP(means, 1e-4);
        CMP(mean, 1e-4);
        CMP(var, 1e-4);
        CMP(rm, 1e-4);
        CMP(rv, 1e-4);
        CMP(y, 1e-4);
        CMP(sdy, 1e-3);
        CMP(sdx, 1e-3);
        CMP(dx, 1e-3);
        CMP(dw, 1e-3);
        CMP(db, 1e-3);
#undef CMP
        bn_free(&hs);
        bn_free(&ds);
    }
    destroy_groups(nc, mpi);
    ch_compute_destroy(cx);
    verdict("SyncBN GPU+NCCL vs CPU+MPI", &o);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nccl_collectives),
        cmocka_unit_test(test_nccl_compute_stream_order),
        cmocka_unit_test(test_nccl_buckets),
        cmocka_unit_test(test_syncbn_gpu_vs_cpu),
    };
    return ch_test_main_mpi(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
