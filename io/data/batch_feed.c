/* cohort: a loader's batches as step tensors on the compute device. */
#include "config.h"

#include "io/data/batch_feed.h"

#include <stdlib.h>
#include <string.h>

struct ch_batch_feed {
    ch_compute_t *cx;
    ch_devkind_t dev;
    int dev_index;
    ch_tensor_t x_slot[2], y_slot[2]; /* GPU: device input slots */
    int64_t slot_floats, slot_labels;
    ch_loader_t *loader;              /* the run in progress, NULL when stopped */
    int64_t max_batches, fetched;
    ch_batch_t *held;                 /* CPU: the batch of the current step */
    ch_batch_t *pending;              /* GPU: fetched, copy queued into slot `pending_slot` */
    int pending_slot, next_slot;
    ch_step_batch_t pending_views;
};

ch_status ch_batch_feed_create(ch_compute_t *cx, ch_devkind_t dev, int dev_index,
                               ch_loader_t *const *loaders, int n_loaders,
                               ch_batch_feed_t **out)
{
    CH_REQUIRE(cx && out && loaders && n_loaders > 0, "ch_batch_feed_create: bad argument");
    CH_REQUIRE(dev == CH_DEV_CPU || dev == CH_DEV_CUDA, "ch_batch_feed_create: unknown device %d",
               (int)dev);
    *out = NULL;
    ch_batch_feed_t *f = calloc(1, sizeof *f);
    if (!f) return CH_ERROR(CH_ERR_NOMEM, "batch feed");
    f->cx = cx;
    f->dev = dev;
    f->dev_index = dev == CH_DEV_CPU ? 0 : dev_index;
    for (int i = 0; i < n_loaders; i++) {
        if (!loaders[i]) continue;
        int c, h, w;
        ch_loader_sample_shape(loaders[i], &c, &h, &w);
        int64_t bs = ch_loader_batch_size(loaders[i]);
        if (bs * c * h * w > f->slot_floats) f->slot_floats = bs * c * h * w;
        if (bs > f->slot_labels) f->slot_labels = bs;
    }
    ch_status s = CH_OK;
    for (int k = 0; dev == CH_DEV_CUDA && k < 2 && s == CH_OK; k++) {
        s = ch_tensor_alloc(&f->x_slot[k], CH_F32, 1, &f->slot_floats, CH_LAYOUT_PLAIN, dev,
                            dev_index);
        if (s == CH_OK)
            s = ch_tensor_alloc(&f->y_slot[k], CH_I64, 1, &f->slot_labels, CH_LAYOUT_PLAIN, dev,
                                dev_index);
    }
    if (s != CH_OK) {
        ch_error_context("device input slots for batches of %lld floats",
                         (long long)f->slot_floats);
        ch_batch_feed_destroy(f);
        return s;
    }
    *out = f;
    return CH_OK;
}

void ch_batch_feed_destroy(ch_batch_feed_t *f)
{
    if (!f) return;
    if (ch_batch_feed_stop(f) != CH_OK) ch_error_clear();
    for (int k = 0; k < 2; k++) {
        ch_tensor_free(&f->x_slot[k]);
        ch_tensor_free(&f->y_slot[k]);
    }
    free(f);
}

/* Views of batch b: the host batch itself (CPU) or device slot `slot`. */
static ch_status views(ch_batch_feed_t *f, const ch_batch_t *b, int slot, ch_step_batch_t *v)
{
    int64_t xs[4] = {b->n, b->c, b->h, b->w}, ys[1] = {b->n};
    v->n_real = b->n_real;
    if (f->dev == CH_DEV_CPU) {
        CH_TRY(ch_tensor_wrap(&v->x, b->images, CH_F32, 4, xs, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0));
        return ch_tensor_wrap(&v->y, b->labels, CH_I64, 1, ys, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0);
    }
    if (b->n * b->c * b->h * b->w > f->slot_floats || b->n > f->slot_labels)
        return CH_ERROR(CH_ERR_INVALID, "batch of %lld x %dx%dx%d does not fit the device input "
                        "slot of %lld floats (a loader not given to ch_batch_feed_create?)",
                        (long long)b->n, b->c, b->h, b->w, (long long)f->slot_floats);
    CH_TRY(ch_tensor_wrap(&v->x, f->x_slot[slot].data, CH_F32, 4, xs, CH_LAYOUT_PLAIN, f->dev,
                          f->dev_index));
    return ch_tensor_wrap(&v->y, f->y_slot[slot].data, CH_I64, 1, ys, CH_LAYOUT_PLAIN, f->dev,
                          f->dev_index);
}

/* Take the next batch from the loader (NULL at the end) and, on a GPU,
 * queue its copy into the next slot. */
static ch_status fetch(ch_batch_feed_t *f, ch_batch_t **out)
{
    *out = NULL;
    if (!f->loader || (f->max_batches >= 0 && f->fetched >= f->max_batches)) return CH_OK;
    ch_batch_t *b = NULL;
    CH_TRY(ch_loader_next(f->loader, &b));
    if (!b) {
        f->max_batches = f->fetched; /* the epoch ended: no more fetches */
        return CH_OK;
    }
    f->fetched++;
    if (f->dev == CH_DEV_CUDA) {
        ch_step_batch_t *v = &f->pending_views;
        ch_status s = views(f, b, f->next_slot, v);
        if (s == CH_OK && b->n > 0) {
            ch_tensor_t hx, hy;
            int64_t xs[4] = {b->n, b->c, b->h, b->w}, ys[1] = {b->n};
            s = ch_tensor_wrap(&hx, b->images, CH_F32, 4, xs, CH_LAYOUT_PLAIN, CH_DEV_CPU, 0);
            if (s == CH_OK) s = ch_tensor_wrap(&hy, b->labels, CH_I64, 1, ys, CH_LAYOUT_PLAIN,
                                               CH_DEV_CPU, 0);
            if (s == CH_OK) s = ch_op_upload_async(f->cx, &hx, &v->x);
            if (s == CH_OK) s = ch_op_upload_async(f->cx, &hy, &v->y);
        }
        f->pending = b;
        f->pending_slot = f->next_slot;
        f->next_slot ^= 1;
        if (s != CH_OK) return ch_error_context("batch upload");
    }
    *out = b;
    return CH_OK;
}

ch_status ch_batch_feed_start(ch_batch_feed_t *f, ch_loader_t *loader, int64_t max_batches)
{
    CH_REQUIRE(f && loader, "ch_batch_feed_start: NULL argument");
    CH_TRY(ch_batch_feed_stop(f));
    f->loader = loader;
    f->max_batches = max_batches;
    f->fetched = 0;
    if (f->dev == CH_DEV_CPU) return CH_OK;
    ch_batch_t *b;
    return fetch(f, &b);
}

ch_status ch_batch_feed_next(ch_batch_feed_t *f, ch_step_batch_t *v)
{
    CH_REQUIRE(f && v, "ch_batch_feed_next: NULL argument");
    memset(v, 0, sizeof *v);
    if (f->dev == CH_DEV_CPU) {
        if (f->held) ch_loader_release(f->loader, f->held);
        f->held = NULL;
        CH_TRY(fetch(f, &f->held));
        return f->held ? views(f, f->held, 0, v) : CH_OK;
    }
    if (!f->pending) {
        ch_batch_t *b;
        CH_TRY(fetch(f, &b));
        if (!b) return CH_OK;
    }
    /* the compute stream waits for the copy, the host for the reads of the
     * page-locked slot, which then goes back to the loader */
    ch_status s = ch_compute_wait_upload(f->cx);
    ch_loader_release(f->loader, f->pending);
    f->pending = NULL;
    if (s != CH_OK) return ch_error_context("batch upload");
    *v = f->pending_views;
    return CH_OK;
}

ch_status ch_batch_feed_prefetch(ch_batch_feed_t *f)
{
    CH_REQUIRE(f, "ch_batch_feed_prefetch: NULL feed");
    if (f->dev == CH_DEV_CPU || f->pending) return CH_OK;
    ch_batch_t *b;
    return fetch(f, &b);
}

ch_status ch_batch_feed_stop(ch_batch_feed_t *f)
{
    ch_status s = CH_OK;
    if (!f || !f->loader) return CH_OK;
    if (f->held) ch_loader_release(f->loader, f->held);
    if (f->pending) {
        /* fetched and uploading but not used: let the copy finish reading
         * the slot before it goes back */
        s = ch_compute_wait_upload(f->cx);
        ch_loader_release(f->loader, f->pending);
    }
    f->held = f->pending = NULL;
    f->loader = NULL;
    return s;
}
