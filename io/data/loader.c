/* cohort: the threaded data loader, see loader.h. */
#include "io/data/loader.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "framework/tensor/device.h"
#include "framework/core/log.h"
#include "framework/core/threadpool.h"

enum { SLOT_FREE = 0, SLOT_QUEUED, SLOT_HELD };

struct slot {
    ch_loader_t *l;
    ch_batch_t batch;
    int64_t b;               /* batch number it holds or is being filled with */
    int state;
    int img_pinned, lab_pinned;
    int pin_asked;           /* within the loader's page-locked cap */
    ch_threadpool_group_t *group;
    ch_image_t img;          /* worker scratch: decoded sample */
    ch_transforms_scratch_t scratch;
    ch_transforms_roi_ctx_t roi; /* fast decode: the sample being decoded */
};

struct ch_loader {
    ch_dataset_t *ds;
    ch_sampler_t *sampler;
    ch_transforms_t *tf;
    ch_threadpool_t *pool;   /* NULL with num_workers = 0 */
    struct slot *slots;
    int depth;
    int c, h, w;
    int64_t batch_size;
    int drop_last;
    int64_t nb;
    int started;
    int64_t epoch, next_out;
    atomic_int stop;
    ch_status failed;
    char fail_msg[CH_ERROR_MAX];
    double wait_s;
};

void ch_loader_options_default(ch_loader_options_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->batch_size = 32;
    cfg->num_workers = 2;
    cfg->world_size = 1;
    cfg->shuffle = 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Fill slot s with batch s->b (a worker job, or inline with no workers). */
static ch_status fill_slot(void *arg)
{
    struct slot *s = arg;
    ch_loader_t *l = s->l;
    const int64_t *first;
    int64_t count;
    CH_TRY(ch_sampler_batch(l->sampler, l->batch_size, l->drop_last, s->b, &first, &count));
    ch_batch_t *bt = &s->batch;
    bt->indices = first;
    bt->n = count;
    bt->index = s->b;
    bt->epoch = l->epoch;
    int64_t real = 0, pos0 = s->b * l->batch_size;
    for (int64_t k = 0; k < count; k++) real += !ch_sampler_is_padding(l->sampler, pos0 + k);
    bt->n_real = real;
    size_t chw = (size_t)l->c * (size_t)l->h * (size_t)l->w;
    for (int64_t k = 0; k < count; k++) {
        if (atomic_load_explicit(&l->stop, memory_order_relaxed)) return CH_OK;
        int64_t idx = first[k];
        s->roi.epoch = l->epoch; /* read by img.roi_fn (fast decode) */
        s->roi.index = idx;
        ch_status st = ch_dataset_get(l->ds, idx, &s->img, &bt->labels[k]);
        if (st == CH_OK)
            st = ch_transforms_apply(l->tf, &s->img, l->epoch, idx, &s->scratch,
                                     bt->images + (size_t)k * chw, l->h, l->w);
        if (st != CH_OK)
            return ch_error_context("data loader: sample %lld (%s), batch %lld of epoch %lld",
                                    (long long)idx, ch_dataset_sample_path(l->ds, idx),
                                    (long long)s->b, (long long)l->epoch);
    }
    return CH_OK;
}

static ch_status submit(ch_loader_t *l, struct slot *s, int64_t b)
{
    s->b = b;
    s->state = SLOT_QUEUED;
    if (!l->pool) return CH_OK; /* filled by next() */
    ch_status st = ch_threadpool_submit_group(l->pool, s->group, fill_slot, s);
    if (st != CH_OK) s->state = SLOT_FREE;
    return st;
}

/* Cancel and wait for every job; all slots free. */
static void drain(ch_loader_t *l)
{
    atomic_store(&l->stop, 1);
    for (int k = 0; k < l->depth; k++) {
        if (l->pool && l->slots[k].group) (void)ch_threadpool_group_wait(l->slots[k].group);
        l->slots[k].state = SLOT_FREE;
    }
    atomic_store(&l->stop, 0);
}

ch_status ch_loader_create(ch_dataset_t *ds, const ch_loader_options_t *cfg, ch_loader_t **out)
{
    CH_REQUIRE(out != NULL && ds != NULL && cfg != NULL, "ch_loader_create: NULL argument");
    *out = NULL;
    CH_REQUIRE(cfg->batch_size >= 1, "data loader: batch size %lld < 1", (long long)cfg->batch_size);
    CH_REQUIRE(cfg->num_workers >= 0 && cfg->num_workers <= CH_THREADPOOL_MAX_WORKERS,
               "data loader: num_workers %d outside [0, %d]", cfg->num_workers,
               CH_THREADPOOL_MAX_WORKERS);
    CH_REQUIRE(cfg->prefetch >= 0 && cfg->prefetch <= 4096, "data loader: prefetch %d outside [0, 4096]",
               cfg->prefetch);
    CH_REQUIRE(cfg->transforms != NULL && cfg->n_transforms >= 1,
               "data loader: no transforms (the list must end with Normalize)");
    ch_loader_t *l = calloc(1, sizeof *l);
    if (!l) return CH_ERROR(CH_ERR_NOMEM, "data loader: out of memory");
    ch_status st;
    l->ds = ds;
    l->batch_size = cfg->batch_size;
    l->drop_last = cfg->drop_last != 0;
    atomic_init(&l->stop, 0);
    st = ch_sampler_create(ds->length, cfg->world_size, cfg->rank, cfg->shuffle,
                           cfg->seed, cfg->sampler_drop_last, &l->sampler);
    if (st == CH_OK && cfg->shard_window > 0)
        st = ch_sampler_set_shard_window(l->sampler, cfg->shard_first, cfg->n_shards,
                                         cfg->shard_window);
    if (st) goto fail;
    st = ch_transforms_create(cfg->transforms, cfg->n_transforms, ds->channels, cfg->seed, &l->tf);
    if (st) goto fail;
    l->c = ds->channels;
    ch_transforms_output_size(l->tf, ds->height, ds->width, &l->h, &l->w);
    if (l->h <= 0 || l->w <= 0) {
        st = CH_ERROR(CH_ERR_INVALID,
                      "data loader: %s has images of varying size and the transforms do not "
                      "make them one size (end with CenterCrop, RandomCrop, RandomResizedCrop "
                      "or Resize(h, w))",
                      ds->name);
        goto fail;
    }
    l->nb = ch_sampler_num_batches(l->sampler, l->batch_size, l->drop_last);
    if (l->nb == 0) {
        st = CH_ERROR(CH_ERR_RANGE,
                      "data loader: %s has %lld samples; with world size %d (sampler drop_last %d) "
                      "rank %d gets %lld samples, which make no batch of %lld (drop_last %d)",
                      ds->name, (long long)ds->length, cfg->world_size, cfg->sampler_drop_last,
                      cfg->rank, (long long)ch_sampler_num_samples(l->sampler),
                      (long long)l->batch_size, cfg->drop_last);
        goto fail;
    }
    if (ds->length < cfg->world_size)
        ch_log_warn("data loader: %s has %lld samples, fewer than the world size %d: ranks get "
                    "repeated samples (DistributedSampler padding)",
                    ds->name, (long long)ds->length, cfg->world_size);
    l->depth = cfg->prefetch ? cfg->prefetch : 2 * (cfg->num_workers > 0 ? cfg->num_workers : 1);
    if (cfg->num_workers == 0) l->depth = 1;
    l->slots = calloc((size_t)l->depth, sizeof *l->slots);
    if (!l->slots) {
        st = CH_ERROR(CH_ERR_NOMEM, "data loader: out of memory");
        goto fail;
    }
    size_t img_bytes = (size_t)l->batch_size * (size_t)l->c * (size_t)l->h * (size_t)l->w * sizeof(float);
    size_t lab_bytes = (size_t)l->batch_size * sizeof(int64_t);
    const size_t pin_cap = cfg->pinned_max_bytes ? cfg->pinned_max_bytes : CH_LOADER_PINNED_MAX_DEFAULT;
    size_t pin_total = 0;
    for (int k = 0; k < l->depth; k++) {
        struct slot *s = &l->slots[k];
        s->l = l;
        ch_image_init(&s->img);
        ch_transforms_scratch_init(&s->scratch);
        if (cfg->fast_decode && ch_transforms_fast_decode_ok(l->tf)) {
            s->roi.tf = l->tf;
            s->img.roi_fn = ch_transforms_roi;
            s->img.roi_ctx = &s->roi;
        }
        /* the first slots that fit the cap are page-locked, the rest pageable */
        s->pin_asked = cfg->pinned && img_bytes + lab_bytes <= pin_cap - pin_total;
        if (s->pin_asked) pin_total += img_bytes + lab_bytes;
        void *p = NULL;
        st = ch_host_alloc(&p, img_bytes, s->pin_asked, &s->img_pinned);
        if (st) goto fail;
        s->batch.images = p;
        p = NULL;
        st = ch_host_alloc(&p, lab_bytes, s->pin_asked, &s->lab_pinned);
        if (st) goto fail;
        s->batch.labels = p;
        s->batch.c = l->c;
        s->batch.h = l->h;
        s->batch.w = l->w;
        s->batch.pinned = s->img_pinned;
        st = ch_threadpool_group_create(&s->group);
        if (st) goto fail;
    }
    if (cfg->pinned) {
        int asked = 0, got = 0;
        ch_loader_pinned_slots(l, &asked, &got);
        if (asked < l->depth)
            ch_log_info("data loader: %d of %d batch slots page-locked (%.1f MiB each, cap %.0f "
                        "MiB: data.pinned_mb); the others pageable", asked, l->depth,
                        (double)(img_bytes + lab_bytes) / 1048576.0, (double)pin_cap / 1048576.0);
    }
    if (cfg->num_workers > 0) {
        st = ch_threadpool_create(cfg->num_workers, &l->pool);
        if (st) goto fail;
    }
    *out = l;
    return CH_OK;
fail:
    /* keep the message: destroy must not clobber it */
    {
        char msg[CH_ERROR_MAX];
        snprintf(msg, sizeof msg, "%s", ch_error_message());
        ch_loader_destroy(l);
        return ch_error_adopt(st, msg);
    }
}

ch_status ch_loader_start_epoch(ch_loader_t *l, int64_t epoch)
{
    return ch_loader_start_epoch_at(l, epoch, 0);
}

ch_status ch_loader_start_epoch_at(ch_loader_t *l, int64_t epoch, int64_t first_batch)
{
    CH_REQUIRE(l != NULL, "ch_loader_start_epoch: loader is NULL");
    if (first_batch < 0 || first_batch > l->nb)
        return CH_ERROR(CH_ERR_RANGE, "data loader: first batch %lld outside [0, %lld]",
                        (long long)first_batch, (long long)l->nb);
    drain(l);
    CH_TRY(ch_sampler_set_epoch(l->sampler, epoch));
    l->epoch = epoch;
    l->next_out = first_batch;
    l->failed = CH_OK;
    l->fail_msg[0] = 0;
    l->started = 1;
    for (int64_t b = first_batch; b < l->nb && b < first_batch + l->depth; b++) {
        ch_status st = submit(l, &l->slots[b % l->depth], b);
        if (st) {
            l->started = 0;
            drain(l);
            return st;
        }
    }
    return CH_OK;
}

ch_status ch_loader_next(ch_loader_t *l, ch_batch_t **batch)
{
    CH_REQUIRE(l != NULL && batch != NULL, "ch_loader_next: NULL argument");
    *batch = NULL;
    if (!l->started)
        return CH_ERROR(CH_ERR_INVALID, "data loader: ch_loader_next before ch_loader_start_epoch");
    if (l->failed) return ch_error_adopt(l->failed, l->fail_msg);
    if (l->next_out >= l->nb) return CH_OK;
    struct slot *s = &l->slots[l->next_out % l->depth];
    if (s->state == SLOT_HELD)
        return CH_ERROR(CH_ERR_INVALID,
                        "data loader: %d batches held without ch_loader_release (prefetch %d)",
                        l->depth, l->depth);
    if (s->state != SLOT_QUEUED || s->b != l->next_out)
        return CH_ERROR(CH_ERR_INTERNAL, "data loader: slot for batch %lld not queued",
                        (long long)l->next_out);
    ch_status st;
    double t0 = now_s();
    if (l->pool) {
        st = ch_threadpool_group_wait(s->group);
    } else {
        ch_error_clear();
        st = fill_slot(s);
    }
    l->wait_s += now_s() - t0;
    if (st != CH_OK) {
        /* stop the epoch: keep the message, cancel the others, report */
        snprintf(l->fail_msg, sizeof l->fail_msg, "%s", ch_error_message());
        l->failed = st;
        drain(l);
        return ch_error_adopt(st, l->fail_msg);
    }
    s->state = SLOT_HELD;
    l->next_out++;
    *batch = &s->batch;
    return CH_OK;
}

void ch_loader_release(ch_loader_t *l, ch_batch_t *batch)
{
    if (!l || !batch) return;
    struct slot *s = (struct slot *)(void *)((char *)batch - offsetof(struct slot, batch));
    if (s < l->slots || s >= l->slots + l->depth || s->state != SLOT_HELD) return;
    s->state = SLOT_FREE;
    int64_t b = s->b + l->depth;
    if (l->failed || b >= l->nb) return;
    if (submit(l, s, b) != CH_OK) {
        snprintf(l->fail_msg, sizeof l->fail_msg, "%s", ch_error_message());
        l->failed = ch_error_code() ? ch_error_code() : CH_ERR_INTERNAL;
    }
}

int64_t ch_loader_num_batches(const ch_loader_t *l) { return l->nb; }
const ch_sampler_t *ch_loader_sampler(const ch_loader_t *l) { return l->sampler; }
void ch_loader_pinned_slots(const ch_loader_t *l, int *asked, int *pinned)
{
    int a = 0, p = 0;
    for (int k = 0; l && l->slots && k < l->depth; k++) {
        a += l->slots[k].pin_asked;
        p += l->slots[k].img_pinned && l->slots[k].lab_pinned;
    }
    if (asked) *asked = a;
    if (pinned) *pinned = p;
}

double ch_loader_wait_seconds(const ch_loader_t *l) { return l->wait_s; }

int64_t ch_loader_batch_size(const ch_loader_t *l) { return l->batch_size; }

void ch_loader_sample_shape(const ch_loader_t *l, int *c, int *h, int *w)
{
    *c = l->c;
    *h = l->h;
    *w = l->w;
}

void ch_loader_destroy(ch_loader_t *l)
{
    if (!l) return;
    atomic_store(&l->stop, 1);
    ch_threadpool_destroy(l->pool); /* drops queued jobs, joins the threads */
    for (int k = 0; l->slots && k < l->depth; k++) {
        struct slot *s = &l->slots[k];
        ch_threadpool_group_destroy(s->group);
        ch_host_free(s->batch.images, s->img_pinned);
        ch_host_free(s->batch.labels, s->lab_pinned);
        ch_image_free(&s->img);
        ch_transforms_scratch_free(&s->scratch);
    }
    free(l->slots);
    ch_transforms_destroy(l->tf);
    ch_sampler_destroy(l->sampler);
    free(l);
}

ch_status ch_loader_fashion_mnist_create(const char *dir, int train,
                                         const ch_loader_options_t *cfg, ch_loader_t **loader, ch_dataset_t **dataset)
{
    CH_REQUIRE(loader != NULL && dataset != NULL && cfg != NULL,
               "ch_loader_fashion_mnist_create: NULL argument");
    *loader = NULL;
    *dataset = NULL;
    CH_TRY(ch_dataset_fashion_mnist_open(dir, train, dataset));
    static const float mean[1] = {CH_FASHION_MNIST_MEAN}, std[1] = {CH_FASHION_MNIST_STD};
    ch_transform_t ops[3];
    int n = 0;
    if (train) {
        ops[n++] = ch_tf_random_crop(28, 4);
        ops[n++] = ch_tf_random_hflip(0.5);
    }
    ops[n++] = ch_tf_normalize(1, mean, std);
    ch_loader_options_t c = *cfg;
    if (!c.transforms) {
        c.transforms = ops;
        c.n_transforms = n;
    }
    ch_status st = ch_loader_create(*dataset, &c, loader);
    if (st != CH_OK) {
        char msg[CH_ERROR_MAX];
        snprintf(msg, sizeof msg, "%s", ch_error_message());
        ch_dataset_destroy(*dataset);
        *dataset = NULL;
        return ch_error_adopt(st, msg);
    }
    return CH_OK;
}
