/* cohort: DistributedDataParallel gradient buckets, see ddp.h. */
#include "config.h"

#include "framework/train/ddp.h"

#include "framework/nn/nn_exec.h"
#include "framework/ops/ops.h"
#include "framework/core/profiler.h"
#include "framework/tensor/tensor.h"

#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int first, last;  /* parameter indices, first <= last */
    float *data;      /* start of the slice of the gradient block */
    size_t numel;
    int n_params;     /* trainable parameters in the bucket */
    int pending;      /* parameters not yet ready in this backward */
    ch_work_t *work;  /* in-flight all-reduce or NULL */
    int launched;
    ch_tensor_t view; /* GPU: the slice as a (numel) tensor, for the averaging */
} bucket_t;

struct ch_ddp {
    ch_model_t *model;
    ch_pg_t *pg;
    ch_ddp_options_t opts;
    int world;
    int n_buckets;
    bucket_t *buckets;
    int *bucket_of;   /* parameter index -> bucket, -1 if frozen */
    int *ready;       /* parameter index -> got a gradient this backward */
    int armed;
    /* where the gradients live (ch_model_device at create) */
    ch_devkind_t dev;
    int dev_index;
    ch_compute_t *cx; /* GPU: averaging kernels (ch_ddp_set_compute) */
    int poll;         /* MPI backend: test in-flight work from the hook */
    /* packed buffers for broadcast_buffers */
    float *fbuf;
    size_t fbuf_n;
    int64_t *ibuf;
    size_t ibuf_n;
};

void ch_ddp_options_default(ch_ddp_options_t *o)
{
    o->bucket_cap_bytes = (size_t)25 << 20;
    o->broadcast_buffers = 1;
}

static const ch_config_key_t ch_ddp_config_keys[] = {
    {"dist.bucket_mb", CH_CFG_FLOAT, "25", 0.001, 1e6, "DDP gradient bucket size in MiB."},
    {"dist.broadcast_buffers", CH_CFG_BOOL, "true", CH_CFG_NO_RANGE,
     "Broadcast rank 0's BN buffers before each forward (when SyncBN is off)."},
};

ch_config_table_t ch_ddp_config_table(void)
{
    ch_config_table_t t = {"ddp", ch_ddp_config_keys, (int)(sizeof ch_ddp_config_keys / sizeof ch_ddp_config_keys[0])};
    return t;
}

static ch_status sync_allreduce(void *pg, float *data, size_t n)
{
    return ch_pg_allreduce(pg, data, data, (int64_t)n, CH_DIST_FLOAT32, CH_REDUCE_SUM);
}

static ch_status sync_allgather(void *pg, const float *in, float *out, size_t n)
{
    return ch_pg_allgather(pg, in, out, (int64_t)n, CH_DIST_FLOAT32);
}

static ch_status sync_iallreduce(void *pg, float *data, size_t n, void **req)
{
    ch_work_t *w = NULL;
    ch_status s = ch_pg_iallreduce(pg, data, data, (int64_t)n, CH_DIST_FLOAT32, CH_REDUCE_SUM, &w);
    *req = w;
    return s;
}

static ch_status sync_iallgather(void *pg, const float *in, float *out, size_t n, void **req)
{
    ch_work_t *w = NULL;
    ch_status s = ch_pg_iallgather(pg, in, out, (int64_t)n, CH_DIST_FLOAT32, &w);
    *req = w;
    return s;
}

/* Poll, yielding the core between tests: MPI's blocking wait spins, and on
 * a node with more runnable threads than cores (two ranks per core, loader
 * threads, other jobs) the spinning rank takes CPU time from the rank it
 * waits for, at every SyncBN layer. sched_yield returns at once when
 * nothing else is runnable, so a dedicated core loses nothing. */
static ch_status sync_wait(void *pg, void **req)
{
    (void)pg;
    ch_work_t *w = *req;
    ch_status s = CH_OK;
    for (int done = 0; !done && s == CH_OK;) {
        s = ch_work_test(&w, &done);
        if (s == CH_OK && !done) sched_yield();
    }
    if (w) { /* only after an error that left the handle: complete it anyway */
        ch_status s2 = ch_work_wait(&w);
        if (s == CH_OK) s = s2;
    }
    *req = NULL;
    return s;
}

/* SyncBN on a GPU: the per-rank element counts travel on the host. */
static ch_status sync_count_gather(void *pg, int64_t local, int64_t *all)
{
    return ch_pg_allgather(pg, &local, all, 1, CH_DIST_INT64);
}

ch_status ch_ddp_convert_sync_bn(ch_model_t *model, ch_pg_t *pg, ch_pg_t *host_pg,
                                 int *n_converted)
{
    CH_REQUIRE(model && pg && host_pg, "ch_ddp_convert_sync_bn: NULL argument");
    int dev_index;
    ch_nn_sync_t sync = {sync_allreduce, sync_allgather, pg, ch_pg_rank(pg), ch_pg_size(pg),
                         sync_iallreduce, NULL, sync_wait};
    /* the non-blocking forms are used on the CPU only (nn_exec.h);
     * ch_pg_iallgather is MPI-only */
    if (ch_pg_backend_of(pg) == CH_PG_MPI) sync.iallgather = sync_iallgather;
    CH_TRY(ch_model_convert_sync_bn(model, &sync, n_converted));
    if (ch_model_device(model, &dev_index) == CH_DEV_CUDA)
        CH_TRY(ch_model_set_sync_count_gather(model, sync_count_gather, host_pg));
    return CH_OK;
}

ch_status ch_ddp_options_from_config(const ch_config_t *cfg, ch_ddp_options_t *o)
{
    double mb;
    ch_ddp_options_default(o);
    CH_TRY(ch_config_get_double(cfg, "dist.bucket_mb", &mb));
    CH_TRY(ch_config_get_bool(cfg, "dist.broadcast_buffers", &o->broadcast_buffers));
    o->bucket_cap_bytes = (size_t)(mb * 1048576.0);
    return CH_OK;
}

static ch_status launch(ch_ddp_t *d, bucket_t *b)
{
    b->launched = 1;
    if (d->world == 1 || b->numel == 0) return CH_OK;
    return ch_pg_iallreduce(d->pg, b->data, b->data, (int64_t)b->numel, CH_DIST_FLOAT32,
                            CH_REDUCE_SUM, &b->work);
}

static ch_status grad_ready(void *arg, ch_param_t *p)
{
    ch_ddp_t *d = arg;
    int i = p->param_index;
    if (!d->armed)
        return CH_ERROR(CH_ERR_INTERNAL, "DDP: backward ran without ch_ddp_before_forward");
    if (i < 0 || i >= ch_model_num_params(d->model) || d->bucket_of[i] < 0) return CH_OK;
    if (d->ready[i])
        return CH_ERROR(CH_ERR_INTERNAL, "DDP: gradient of '%s' marked ready twice in one "
                        "backward", p->name);
    d->ready[i] = 1;
    bucket_t *b = &d->buckets[d->bucket_of[i]];
    if (--b->pending == 0) CH_TRY(launch(d, b));
    /* Drive progress of the all-reduces in flight (MPI has no progress
     * thread by default; NCCL needs none). */
    for (int k = 0; d->poll && k < d->n_buckets; k++) {
        if (d->buckets[k].work) {
            int done = 0;
            CH_TRY(ch_work_test(&d->buckets[k].work, &done));
        }
    }
    return CH_OK;
}

ch_status ch_ddp_create(ch_model_t *model, ch_pg_t *pg, const ch_ddp_options_t *opts,
                        ch_ddp_t **out)
{
    CH_REQUIRE(model && pg && out, "ch_ddp_create: NULL argument");
    {
        int di = 0;
        ch_devkind_t dev = ch_model_device(model, &di);
        if (dev != CH_DEV_CPU && ch_pg_size(pg) > 1 && ch_pg_backend_of(pg) != CH_PG_NCCL)
            return CH_ERROR(CH_ERR_INVALID, "DDP: model '%s' is on GPU %d, so its gradients need "
                            "an NCCL process group (ch_pg_create_nccl), not an MPI one",
                            ch_model_arch(model), di);
        if (dev == CH_DEV_CPU && ch_pg_size(pg) > 1 && ch_pg_backend_of(pg) != CH_PG_MPI)
            return CH_ERROR(CH_ERR_INVALID, "DDP: model '%s' is on the CPU, so its gradients need "
                            "an MPI process group, not an NCCL one", ch_model_arch(model));
    }
    ch_ddp_t *d = calloc(1, sizeof *d);
    if (!d) return CH_ERROR(CH_ERR_NOMEM, "ch_ddp_create: out of memory");
    d->model = model;
    d->pg = pg;
    if (opts) d->opts = *opts;
    else ch_ddp_options_default(&d->opts);
    if (d->opts.bucket_cap_bytes == 0) d->opts.bucket_cap_bytes = (size_t)25 << 20;
    d->world = ch_pg_size(pg);
    d->dev = ch_model_device(model, &d->dev_index);
    d->poll = ch_pg_backend_of(pg) == CH_PG_MPI;
    int np = ch_model_num_params(model);
    d->bucket_of = malloc((size_t)(np ? np : 1) * sizeof *d->bucket_of);
    d->ready = calloc((size_t)(np ? np : 1), sizeof *d->ready);
    d->buckets = calloc((size_t)(np ? np : 1), sizeof *d->buckets);
    if (!d->bucket_of || !d->ready || !d->buckets) {
        ch_ddp_destroy(d);
        return CH_ERROR(CH_ERR_NOMEM, "ch_ddp_create: out of memory");
    }
    size_t cap = d->opts.bucket_cap_bytes / sizeof(float);
    bucket_t *cur = NULL;
    for (int i = np - 1; i >= 0; i--) {
        ch_param_t *p = ch_model_param(model, i);
        float *grad = p->dev_grad; /* == p->grad on the CPU */
        d->bucket_of[i] = -1;
        if (!p->requires_grad || !grad) {
            cur = NULL; /* split at a frozen parameter */
            continue;
        }
        /* contiguous with the bucket's current start (reverse order: the new
         * parameter must end where the bucket begins) */
        int fits = cur && cur->numel + p->numel <= cap && grad + p->numel == cur->data;
        if (!fits) {
            cur = &d->buckets[d->n_buckets++];
            cur->last = i;
            cur->numel = 0;
            cur->data = grad + p->numel;
        }
        cur->first = i;
        cur->data = grad;
        cur->numel += p->numel;
        cur->n_params++;
        d->bucket_of[i] = (int)(cur - d->buckets);
    }
    if (d->n_buckets == 0) {
        ch_ddp_destroy(d);
        return CH_ERROR(CH_ERR_INVALID, "DDP: model '%s' has no trainable parameters",
                        ch_model_arch(model));
    }
    for (int k = 0; d->dev != CH_DEV_CPU && k < d->n_buckets; k++) {
        bucket_t *b = &d->buckets[k];
        int64_t n = (int64_t)b->numel;
        ch_status s = ch_tensor_wrap(&b->view, b->data, CH_F32, 1, &n, CH_LAYOUT_PLAIN, d->dev,
                                     d->dev_index);
        if (s) {
            ch_ddp_destroy(d);
            return s;
        }
    }
    /* staging for broadcast_buffers */
    int ne = ch_model_num_entries(model);
    for (int i = 0; i < ne; i++) {
        ch_param_t *e = ch_model_entry(model, i);
        if (!e->is_buffer) continue;
        if (e->dtype == CH_I64) d->ibuf_n += e->numel;
        else d->fbuf_n += e->numel;
    }
    d->fbuf = malloc((d->fbuf_n ? d->fbuf_n : 1) * sizeof *d->fbuf);
    d->ibuf = malloc((d->ibuf_n ? d->ibuf_n : 1) * sizeof *d->ibuf);
    if (!d->fbuf || !d->ibuf) {
        ch_ddp_destroy(d);
        return CH_ERROR(CH_ERR_NOMEM, "ch_ddp_create: out of memory");
    }
    ch_model_set_grad_hook(model, grad_ready, d);
    *out = d;
    return CH_OK;
}

void ch_ddp_destroy(ch_ddp_t *d)
{
    if (!d) return;
    if (d->buckets)
        for (int k = 0; k < d->n_buckets; k++)
            if (d->buckets[k].work) (void)ch_work_wait(&d->buckets[k].work);
    if (d->model && d->bucket_of && d->buckets && d->n_buckets)
        ch_model_set_grad_hook(d->model, NULL, NULL);
    free(d->bucket_of);
    free(d->ready);
    free(d->buckets);
    free(d->fbuf);
    free(d->ibuf);
    free(d);
}

/* Copy buffers into (to_stage=1) or out of the staging arrays. */
static void stage_buffers(ch_ddp_t *d, int to_stage)
{
    size_t fo = 0, io = 0;
    int ne = ch_model_num_entries(d->model);
    for (int i = 0; i < ne; i++) {
        ch_param_t *e = ch_model_entry(d->model, i);
        if (!e->is_buffer) continue;
        if (e->dtype == CH_I64) {
            if (to_stage) memcpy(d->ibuf + io, e->data, e->numel * sizeof(int64_t));
            else memcpy(e->data, d->ibuf + io, e->numel * sizeof(int64_t));
            io += e->numel;
        } else {
            if (to_stage) memcpy(d->fbuf + fo, e->data, e->numel * sizeof(float));
            else memcpy(e->data, d->fbuf + fo, e->numel * sizeof(float));
            fo += e->numel;
        }
    }
}

static ch_status broadcast_buffers(ch_ddp_t *d)
{
    if (d->world == 1) return CH_OK;
    if (d->dev != CH_DEV_CPU) {
        /* the float buffers in place on the device (one contiguous block);
         * the int64 counters are host values that every rank advances
         * identically (one per training forward) */
        size_t n = 0;
        float *buf = ch_model_device_buffer_block(d->model, &n);
        if (n) CH_TRY(ch_pg_broadcast(d->pg, buf, (int64_t)n, CH_DIST_FLOAT32, 0));
        return CH_OK;
    }
    stage_buffers(d, 1);
    if (d->fbuf_n)
        CH_TRY(ch_pg_broadcast(d->pg, d->fbuf, (int64_t)d->fbuf_n, CH_DIST_FLOAT32, 0));
    if (d->ibuf_n)
        CH_TRY(ch_pg_broadcast(d->pg, d->ibuf, (int64_t)d->ibuf_n, CH_DIST_INT64, 0));
    stage_buffers(d, 0);
    return CH_OK;
}

ch_status ch_ddp_broadcast_state(ch_ddp_t *d)
{
    CH_REQUIRE(d, "ch_ddp_broadcast_state: NULL DDP");
    if (d->world == 1) return CH_OK;
    size_t n = ch_model_param_numel(d->model);
    if (n) {
        CH_TRY(ch_pg_broadcast(d->pg, ch_model_device_param_block(d->model), (int64_t)n,
                               CH_DIST_FLOAT32, 0));
        ch_tensor_data_changed(); /* rank 0's parameters arrived (framework/tensor/tensor.h) */
    }
    return broadcast_buffers(d);
}

ch_status ch_ddp_before_forward(ch_ddp_t *d)
{
    CH_REQUIRE(d, "ch_ddp_before_forward: NULL DDP");
    for (int k = 0; k < d->n_buckets; k++)
        if (d->buckets[k].work)
            return CH_ERROR(CH_ERR_INTERNAL, "DDP: forward started while bucket %d is still "
                            "being all-reduced (missing ch_ddp_finish)", k);
    if (d->opts.broadcast_buffers) CH_TRY(broadcast_buffers(d));
    int np = ch_model_num_params(d->model);
    memset(d->ready, 0, (size_t)np * sizeof *d->ready);
    for (int k = 0; k < d->n_buckets; k++) {
        d->buckets[k].pending = d->buckets[k].n_params;
        d->buckets[k].launched = 0;
    }
    d->armed = 1;
    return CH_OK;
}

ch_status ch_ddp_finish(ch_ddp_t *d, double *wait_seconds)
{
    CH_REQUIRE(d, "ch_ddp_finish: NULL DDP");
    double t0 = ch_time_now();
    ch_status s = CH_OK;
    if (!d->armed) return CH_ERROR(CH_ERR_INTERNAL, "DDP: ch_ddp_finish without a backward");
    for (int k = 0; k < d->n_buckets; k++) {
        bucket_t *b = &d->buckets[k];
        if (!b->launched && s == CH_OK) {
            int missing = -1;
            for (int i = b->first; i <= b->last && missing < 0; i++)
                if (d->bucket_of[i] == k && !d->ready[i]) missing = i;
            s = CH_ERROR(CH_ERR_INTERNAL, "DDP: parameter '%s' received no gradient in this "
                         "backward, so its bucket was never all-reduced",
                         missing >= 0 ? ch_model_param(d->model, missing)->name : "?");
        }
    }
    /* Wait for everything launched, even after an error, so nothing is left
     * in flight. */
    for (int k = 0; k < d->n_buckets; k++) {
        if (d->buckets[k].work) {
            ch_status w = ch_work_wait(&d->buckets[k].work);
            if (s == CH_OK) s = w;
        }
    }
    d->armed = 0;
    if (wait_seconds) *wait_seconds = ch_time_now() - t0;
    if (s != CH_OK || d->world == 1) return s;
    const float scale = 1.0f / (float)d->world;
    if (d->dev != CH_DEV_CPU) {
        /* queued on the compute stream, which ch_work_wait made wait for the
         * all-reduces: the host does not block */
        if (!d->cx)
            return CH_ERROR(CH_ERR_INVALID, "DDP: gradients on GPU %d need a compute context for "
                            "the averaging (ch_ddp_set_compute)", d->dev_index);
        for (int k = 0; k < d->n_buckets; k++)
            if (d->buckets[k].numel) CH_TRY(ch_op_scale(d->cx, &d->buckets[k].view, scale));
        return CH_OK;
    }
    for (int k = 0; k < d->n_buckets; k++) {
        float *g = d->buckets[k].data;
        size_t n = d->buckets[k].numel;
        for (size_t j = 0; j < n; j++) g[j] *= scale;
    }
    return CH_OK;
}

ch_status ch_ddp_set_compute(ch_ddp_t *d, ch_compute_t *cx)
{
    CH_REQUIRE(d && cx, "ch_ddp_set_compute: NULL argument");
    d->cx = cx;
    if (d->dev == CH_DEV_CPU || ch_pg_backend_of(d->pg) != CH_PG_NCCL) return CH_OK;
    void *stream = ch_compute_stream(cx, CH_DEV_CUDA);
    if (!stream)
        return CH_ERROR(CH_ERR_UNSUPPORTED, "DDP: the compute context has no GPU stream for GPU %d",
                        d->dev_index);
    return ch_pg_nccl_set_stream(d->pg, stream);
}

int ch_ddp_num_buckets(const ch_ddp_t *d) { return d ? d->n_buckets : 0; }

ch_status ch_ddp_bucket_info(const ch_ddp_t *d, int b, int *first, int *last, size_t *numel)
{
    CH_REQUIRE(d && b >= 0 && b < d->n_buckets, "ch_ddp_bucket_info: bucket %d of %d", b,
               d ? d->n_buckets : 0);
    if (first) *first = d->buckets[b].first;
    if (last) *last = d->buckets[b].last;
    if (numel) *numel = d->buckets[b].numel;
    return CH_OK;
}
