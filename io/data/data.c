/* cohort: a training job's datasets and loaders from the data.* keys. */
#include "config.h"

#include "io/data/data.h"

#include "framework/core/log.h"

#include "framework/reduce/reduce.h"
#include "io/data/shards.h"
#include "io/data/stage.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const ch_config_key_t ch_data_config_keys[] = {
    {"data.path", CH_CFG_STRING, "/usr/share/datasets/fashion-mnist", CH_CFG_NO_RANGE,
     "Dataset directory (IDX files for idx, data_batch_*.bin for cifar10, class folders "
     "for imagefolder); for shards a directory of *.tar, a pattern name-{000000..000099}.tar "
     "or one .tar file."},
    {"data.format", CH_CFG_STRING, "idx", CH_CFG_NO_RANGE,
     "Dataset format: idx (MNIST/Fashion-MNIST), cifar10, imagefolder, or shards "
     "(WebDataset tar shards read by index, io/data/shards.h)."},
    {"data.val_path", CH_CFG_STRING, "", CH_CFG_NO_RANGE,
     "imagefolder and shards: validation folder (shards); empty splits data.path by "
     "data.val_fraction."},
    {"data.val_fraction", CH_CFG_FLOAT, "0.2", 0, 1,
     "imagefolder or shards without val_path: fraction held out for validation (random_split)."},
    {"data.image_size", CH_CFG_INT, "0", 0, 4096,
     "Resize + center crop images to this size (0: keep the dataset's size)."},
    {"data.train_subset", CH_CFG_INT64, "0", 0, 1e12,
     "Use only the first N training samples (0: all)."},
    {"data.test_subset", CH_CFG_INT64, "0", 0, 1e12,
     "Use only the first N test samples (0: all)."},
    {"data.workers", CH_CFG_INT, "2", 0, 256, "Loader worker threads per rank (0: load in the "
                                              "training thread)."},
    {"data.prefetch", CH_CFG_INT, "4", 1, 1024, "Batch slots in the loader's ring."},
    {"data.pinned_mb", CH_CFG_INT, "1024", 0, 1048576,
     "GPU ranks: cap in MiB on the page-locked memory of a loader's batch slots (the first "
     "slots that fit are page-locked, the others pageable, which uploads more slowly); 0: "
     "none page-locked. CPU ranks never page-lock."},
    {"data.mean", CH_CFG_STRLIST, "0.2860", CH_CFG_NO_RANGE,
     "Normalize mean per channel (one value or one per channel), or auto: the training "
     "set's per-channel mean of ToTensor values (computed across the ranks)."},
    {"data.std", CH_CFG_STRLIST, "0.3530", CH_CFG_NO_RANGE,
     "Normalize std per channel (one value or one per channel), or auto: the training "
     "set's per-channel population std (ddof 0) of ToTensor values."},
    {"data.random_crop_padding", CH_CFG_INT, "0", 0, 1024,
     "Train augmentation: RandomCrop(size, padding=P); 0 turns it off."},
    {"data.hflip", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE,
     "Train augmentation: RandomHorizontalFlip(0.5)."},
    {"data.random_resized_crop", CH_CFG_INT, "0", 0, 4096,
     "The ImageNet recipe at this size S (0: off): train RandomResizedCrop(S, scale=(0.08, 1), "
     "ratio=(3/4, 4/3)) [+ data.hflip], test Resize(int(S / 0.875)) + CenterCrop(S); "
     "instead of data.image_size and data.random_crop_padding."},
    {"data.fast_decode", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE,
     "Faster JPEG decode for pipelines that start with RandomResizedCrop "
     "(data.random_resized_crop) or Resize (data.image_size, the test pipeline): decode only "
     "the rows and columns the crop reads (libjpeg-turbo crop decode) and, where the crop "
     "is shrunk 2x or more, at 1/2, 3/8, 1/4 or 1/8 size (DCT scaling). Same crop boxes and "
     "flips; pixels bit-identical to the default unless DCT scaling is used "
     "(docs/perf-data.md gives the differences). false: full decode, PIL's pixels."},
    {"data.order", CH_CFG_STRING, "sampler", CH_CFG_NO_RANGE,
     "Training order: sampler (torch's DistributedSampler, exact) or shard_window (shards "
     "only, NOT DistributedSampler order: each rank reads its own shards, data.shard_window "
     "at a time, shuffled within; for disk-based file systems; docs/shards.md)."},
    {"data.shard_window", CH_CFG_INT, "4", 1, 1e6,
     "data.order = shard_window: shards per rank whose samples are shuffled together."},
    {"data.stage", CH_CFG_STRING, "", CH_CFG_NO_RANGE,
     "shards only: node-local directory (e.g. $SLURM_TMPDIR, /dev/shm/USER) each node copies "
     "the shards and their index into before the first epoch, verified by CRC-32, reused by a "
     "later job on the node; empty: read data.path in place. The copies are removed when "
     "the run completes (kept when it stops for preemption, for the requeue) unless "
     "data.stage_keep."},
    {"data.stage_keep", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE,
     "Keep the staged copies in data.stage after a completed run (for a next job on the same "
     "nodes)."},
};

ch_config_table_t ch_data_config_table(void)
{
    ch_config_table_t t = {"data", ch_data_config_keys, (int)(sizeof ch_data_config_keys / sizeof ch_data_config_keys[0])};
    return t;
}

/* A strlist key of 1..3 numbers into out[], *n values; the one word
 * "auto" sets *is_auto (and *n = 0: the values come from the data). */
static ch_status read_floats(const ch_config_t *cfg, const char *key, float out[3], int *n,
                             int *is_auto)
{
    const char *const *items;
    CH_TRY(ch_config_get_strlist(cfg, key, &items, n));
    *is_auto = *n == 1 && strcmp(items[0], "auto") == 0;
    if (*is_auto) {
        *n = 0;
        return CH_OK;
    }
    if (*n < 1 || *n > 3)
        return CH_ERROR(CH_ERR_CONFIG, "%s: %d values given, expected 1 to 3 (one per input "
                        "channel)", key, *n);
    for (int c = 0; c < *n; c++) {
        char *end;
        errno = 0;
        double v = strtod(items[c], &end);
        if (errno || *end || end == items[c] || !isfinite(v))
            return CH_ERROR(CH_ERR_CONFIG, "%s: '%s' is not a number (or give auto)", key, items[c]);
        out[c] = (float)v;
    }
    return CH_OK;
}

ch_status ch_data_options_from_config(const ch_config_t *cfg, ch_data_options_t *o)
{
    static const char *const formats[] = {"idx", "cifar10", "imagefolder", "shards"};
    int format;
    memset(o, 0, sizeof *o);
    CH_TRY(ch_config_get_string(cfg, "data.path", &o->path));
    CH_TRY(ch_config_get_choice(cfg, "data.format", formats, 4, &format));
    o->format = (ch_data_format_t)format;
    o->format_name = formats[format];
    CH_TRY(ch_config_get_string(cfg, "data.val_path", &o->val_path));
    CH_TRY(ch_config_get_double(cfg, "data.val_fraction", &o->val_fraction));
    CH_TRY(ch_config_get_int(cfg, "data.image_size", &o->image_size));
    CH_TRY(ch_config_get_int64(cfg, "data.train_subset", &o->train_subset));
    CH_TRY(ch_config_get_int64(cfg, "data.test_subset", &o->test_subset));
    CH_TRY(ch_config_get_int(cfg, "data.workers", &o->workers));
    CH_TRY(ch_config_get_int(cfg, "data.prefetch", &o->prefetch));
    CH_TRY(ch_config_get_int(cfg, "data.pinned_mb", &o->pinned_mb));
    CH_TRY(ch_config_get_int(cfg, "data.random_crop_padding", &o->random_crop_padding));
    CH_TRY(ch_config_get_bool(cfg, "data.hflip", &o->hflip));
    CH_TRY(ch_config_get_string(cfg, "data.stage", &o->stage));
    CH_TRY(ch_config_get_bool(cfg, "data.stage_keep", &o->stage_keep));
    CH_TRY(ch_config_get_int(cfg, "data.random_resized_crop", &o->random_resized_crop));
    CH_TRY(ch_config_get_bool(cfg, "data.fast_decode", &o->fast_decode));
    if (o->random_resized_crop > 0 && (o->image_size > 0 || o->random_crop_padding > 0))
        return CH_ERROR(CH_ERR_CONFIG, "data.random_resized_crop = %d sets the image size: leave "
                        "data.image_size and data.random_crop_padding at 0", o->random_resized_crop);
    static const char *const orders[] = {"sampler", "shard_window"};
    int order;
    CH_TRY(ch_config_get_choice(cfg, "data.order", orders, 2, &order));
    CH_TRY(ch_config_get_int(cfg, "data.shard_window", &o->shard_window));
    if (order == 0) o->shard_window = 0;
    if (order == 1 && o->format != CH_DATA_SHARDS)
        return CH_ERROR(CH_ERR_CONFIG, "data.order = shard_window needs data.format = shards "
                        "(data.format is %s)", o->format_name);
    if (o->stage_keep && !o->stage[0])
        return CH_ERROR(CH_ERR_CONFIG, "data.stage_keep is set but data.stage is not: there are no "
                        "staged copies to keep");
    if (o->stage[0] && o->format != CH_DATA_SHARDS)
        return CH_ERROR(CH_ERR_CONFIG, "data.stage is set but data.format is %s: staging copies "
                        "shards (data.format = shards)", o->format_name);
    CH_TRY(read_floats(cfg, "data.mean", o->mean, &o->n_mean, &o->mean_auto));
    CH_TRY(read_floats(cfg, "data.std", o->std, &o->n_std, &o->std_auto));
    for (int c = 0; c < o->n_std; c++)
        if (!(o->std[c] > 0))
            return CH_ERROR(CH_ERR_CONFIG, "data.std: value %g for channel %d must be > 0",
                            (double)o->std[c], c);
    return CH_OK;
}

ch_status ch_data_options_check_channels(const ch_data_options_t *o, int channels)
{
    if (channels < 1 || channels > 3)
        return CH_ERROR(CH_ERR_CONFIG, "model.in_channels = %d: Normalize (data.mean, data.std) "
                        "takes 1 to 3 channels", channels);
    const char *keys[2] = {"data.mean", "data.std"};
    const int n[2] = {o->n_mean, o->n_std}, is_auto[2] = {o->mean_auto, o->std_auto};
    for (int k = 0; k < 2; k++)
        if (!is_auto[k] && n[k] != 1 && n[k] != channels)
            return CH_ERROR(CH_ERR_CONFIG, "%s: %d values given, expected %s%d (one per input "
                            "channel, model.in_channels = %d)", keys[k], n[k],
                            channels > 1 ? "1 or " : "", channels, channels);
    return CH_OK;
}

/* The first n samples of base (NULL when n is 0 or covers it all). */
static ch_status first_n_subset(ch_dataset_t *base, long long n, ch_dataset_t **out)
{
    *out = NULL;
    if (n <= 0 || n >= base->length) return CH_OK;
    int64_t *idx = malloc((size_t)n * sizeof *idx);
    if (!idx) return CH_ERROR(CH_ERR_NOMEM, "subset of %lld samples", n);
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    ch_status s = ch_dataset_subset_create(base, idx, n, out);
    free(idx);
    return s;
}

/* Shards in place, or staged to node-local storage first (data.stage). */
static ch_status open_shards(const char *spec, const char *stage, const ch_data_setup_t *u,
                             ch_data_t *d, ch_dataset_t **out)
{
    if (!stage || !stage[0]) return ch_dataset_shards_open(spec, u->in_channels, u->pg, out);
    char **slot = d->staged_[0] ? &d->staged_[1] : &d->staged_[0];
    ch_stage_stats_t st;
    CH_TRY(ch_shards_stage(spec, stage, u->pg, slot, &st));
    d->stage_stats.files += st.files;
    d->stage_stats.bytes_copied += st.bytes_copied;
    d->stage_stats.bytes_reused += st.bytes_reused;
    d->stage_stats.files_copied += st.files_copied;
    d->stage_stats.seconds += st.seconds;
    return ch_dataset_shards_open(*slot, u->in_channels, u->pg, out);
}

ch_status ch_data_unstage(ch_data_t *d, ch_pg_t *pg)
{
    ch_status s = CH_OK;
    for (int i = 0; d && i < 2; i++) {
        if (!d->staged_[i]) continue;
        /* the same directory for train and val: removed once */
        if (i == 1 && d->staged_[0] && !strcmp(d->staged_[0], d->staged_[1])) continue;
        ch_status r = ch_shards_unstage(d->staged_[i], pg, NULL);
        if (s == CH_OK) s = r;
    }
    return s;
}

static ch_status open_datasets(const ch_data_options_t *o, const ch_data_setup_t *u, ch_data_t *d)
{
    switch (o->format) {
    case CH_DATA_IDX:
        CH_TRY(ch_dataset_fashion_mnist_open(o->path, 1, &d->train_base_));
        CH_TRY(ch_dataset_fashion_mnist_open(o->path, 0, &d->test_base_));
        break;
    case CH_DATA_CIFAR10:
        CH_TRY(ch_dataset_cifar10_open(o->path, 1, &d->train_base_));
        CH_TRY(ch_dataset_cifar10_open(o->path, 0, &d->test_base_));
        break;
    case CH_DATA_IMAGEFOLDER:
        CH_TRY(ch_dataset_imagefolder_open(o->path, u->in_channels, &d->train_base_));
        if (o->val_path[0])
            CH_TRY(ch_dataset_imagefolder_open(o->val_path, u->in_channels, &d->test_base_));
        else
            CH_TRY(ch_dataset_random_split(d->train_base_, o->val_fraction, u->seed, &d->train,
                                           &d->test));
        break;
    case CH_DATA_SHARDS:
        CH_TRY(open_shards(o->path, o->stage, u, d, &d->train_base_));
        if (o->val_path[0])
            CH_TRY(open_shards(o->val_path, o->stage, u, d, &d->test_base_));
        else
            CH_TRY(ch_dataset_random_split(d->train_base_, o->val_fraction, u->seed, &d->train,
                                           &d->test));
        break;
    }
    if (!d->train) {
        CH_TRY(first_n_subset(d->train_base_, o->train_subset, &d->train));
        if (!d->train) d->train = d->train_base_;
    }
    if (!d->test) {
        CH_TRY(first_n_subset(d->test_base_, o->test_subset, &d->test));
        if (!d->test) d->test = d->test_base_;
    }
    if (d->train->channels != u->in_channels)
        return CH_ERROR(CH_ERR_CONFIG, "model.in_channels is %d but %s has %d-channel images",
                        u->in_channels, o->path, d->train->channels);
    if (d->train->num_classes > u->num_classes)
        return CH_ERROR(CH_ERR_CONFIG, "model.num_classes is %d but %s has %d classes",
                        u->num_classes, o->path, d->train->num_classes);
    return CH_OK;
}

/* The training images as a uint8 array (N, H, W, C) for the reducer: element
 * ranges are cut from the decoded samples (one get per image touched). */
typedef struct {
    const ch_dataset_t *ds;
    ch_image_t img;
    int64_t img_bytes;
} image_source_t;

static ch_status image_read(void *ctx, int seg, int64_t e0, int64_t n, void *dst)
{
    image_source_t *is = ctx;
    const ch_dataset_t *ds = is->ds;
    (void)seg;
    uint8_t *out = dst;
    while (n > 0) {
        int64_t i = e0 / is->img_bytes, off = e0 % is->img_bytes, label;
        CH_TRY(ch_dataset_get(ds, i, &is->img, &label));
        if (is->img.h != ds->height || is->img.w != ds->width || is->img.c != ds->channels)
            return CH_ERROR(CH_ERR_FORMAT, "%s: sample %lld is %dx%dx%d, not the dataset's %dx%dx%d "
                            "(data.mean/std = auto)", ds->name, (long long)i, is->img.h, is->img.w,
                            is->img.c, ds->height, ds->width, ds->channels);
        int64_t m = is->img_bytes - off < n ? is->img_bytes - off : n;
        memcpy(out, is->img.data + off, (size_t)m);
        out += m;
        e0 += m;
        n -= m;
    }
    return CH_OK;
}

ch_status ch_data_channel_stats(const ch_dataset_t *ds, ch_pg_t *pg, float *mean, float *std)
{
    CH_REQUIRE(ds && mean && std, "ch_data_channel_stats: NULL argument");
    if (ds->height <= 0 || ds->width <= 0)
        return CH_ERROR(CH_ERR_UNSUPPORTED, "data.mean/std = auto: the images of %s vary in size; "
                        "give data.mean and data.std values", ds->name);
    if (ds->length < 1)
        return CH_ERROR(CH_ERR_INVALID, "data.mean/std = auto: %s has no training samples", ds->name);
    if (ds->channels < 1 || ds->channels > 3)
        return CH_ERROR(CH_ERR_UNSUPPORTED, "data.mean/std = auto: %s has %d channels (1 to 3 are "
                        "supported)", ds->name, ds->channels);
    image_source_t is = {.ds = ds,
                         .img_bytes = (int64_t)ds->height * ds->width * ds->channels};
    ch_image_init(&is.img);
    ch_array_desc_t desc;
    memset(&desc, 0, sizeof desc);
    desc.dtype = CH_DT_UINT8;
    desc.ndim = 4;
    desc.shape[0] = ds->length;
    desc.shape[1] = ds->height;
    desc.shape[2] = ds->width;
    desc.shape[3] = ds->channels;
    const int64_t row0 = 0;
    ch_array_source_t src = {.desc = desc, .nseg = 1, .seg = &desc, .seg_row0 = &row0,
                             .read = image_read, .ctx = &is};
    double m[3], sd[3];
    ch_status s = ch_reduce_channel_stats(&src, -1, pg, m, sd);
    ch_image_free(&is.img);
    CH_TRY(s);
    for (int c = 0; c < ds->channels; c++) { /* ToTensor: x / 255 */
        mean[c] = (float)(m[c] / 255.0);
        std[c] = (float)(sd[c] / 255.0);
    }
    return CH_OK;
}

static ch_status make_loaders(const ch_data_options_t *o, const ch_data_setup_t *u, ch_data_t *d)
{
    ch_transform_t train_tf[CH_TRANSFORMS_MAX], test_tf[CH_TRANSFORMS_MAX];
    int ntr = 0, nte = 0, h = d->train->height, w = d->train->width;
    memset(train_tf, 0, sizeof train_tf);
    memset(test_tf, 0, sizeof test_tf);
    if (o->fast_decode && (o->format == CH_DATA_IDX || o->format == CH_DATA_CIFAR10))
        ch_log_warn_rank0("data.fast_decode = true has no effect with data.format = %s: its "
                          "samples are raw pixels, not JPEG files", o->format_name);
    else if (o->fast_decode && o->image_size <= 0 && o->random_resized_crop <= 0)
        ch_log_warn_rank0("data.fast_decode = true has no effect: it speeds up a pipeline that "
                          "starts with data.random_resized_crop or data.image_size (Resize), "
                          "and both are 0");
    if (o->image_size > 0) {
        ch_transform_t r = {.kind = CH_TF_RESIZE, .size = {o->image_size, 0}};
        ch_transform_t cc = {.kind = CH_TF_CENTER_CROP, .size = {o->image_size, o->image_size}};
        train_tf[ntr++] = r;
        train_tf[ntr++] = cc;
        test_tf[nte++] = r;
        test_tf[nte++] = cc;
        h = w = o->image_size;
    }
    if (o->random_resized_crop > 0) { /* torchvision's ImageNet recipe (references/classification) */
        int sz = o->random_resized_crop;
        train_tf[ntr++] = ch_tf_random_resized_crop(sz);
        test_tf[nte++] = ch_tf_resize((int)(sz / 0.875));
        test_tf[nte++] = ch_tf_center_crop(sz);
        h = w = sz;
    }
    if (o->random_crop_padding > 0) {
        ch_transform_t rc = {.kind = CH_TF_RANDOM_CROP, .size = {h, w},
                             .padding = o->random_crop_padding};
        train_tf[ntr++] = rc;
    }
    if (o->hflip) {
        ch_transform_t f = {.kind = CH_TF_RANDOM_HFLIP, .p = 0.5};
        train_tf[ntr++] = f;
    }
    ch_transform_t norm = {.kind = CH_TF_NORMALIZE};
    for (int c = 0; c < u->in_channels; c++) {
        norm.mean[c] = d->mean[c];
        norm.std[c] = d->std[c];
    }
    train_tf[ntr++] = norm;
    test_tf[nte++] = norm;

    ch_loader_options_t lc;
    ch_loader_options_default(&lc);
    lc.batch_size = u->batch_size;
    lc.num_workers = o->workers;
    lc.prefetch = o->prefetch;
    lc.pinned = u->pinned && o->pinned_mb > 0;
    lc.pinned_max_bytes = (size_t)o->pinned_mb << 20;
    lc.world_size = u->world_size;
    lc.rank = u->rank;
    lc.seed = u->seed;
    lc.fast_decode = o->fast_decode;
    /* seed recipe: BatchSampler(DistributedSampler(train), drop_last=True) */
    lc.shuffle = 1;
    lc.drop_last = 1;
    lc.sampler_drop_last = 0;
    lc.transforms = train_tf;
    lc.n_transforms = ntr;
    if (o->shard_window > 0) { /* the whole shard dataset, in its own index order */
        const ch_shard_index_t *ix = ch_dataset_shards_index(d->train);
        if (!ix)
            return CH_ERROR(CH_ERR_CONFIG, "data.order = shard_window reads whole shards: give "
                            "data.val_path (no random_split) and no data.train_subset");
        lc.shard_window = o->shard_window;
        lc.shard_first = ix->first;
        lc.n_shards = ix->nshards;
    }
    CH_TRY(ch_loader_create(d->train, &lc, &d->train_loader));
    lc.shard_window = 0;
    if (u->eval) {
        lc.shuffle = 0;
        lc.drop_last = 0;
        lc.transforms = test_tf;
        lc.n_transforms = nte;
        CH_TRY(ch_loader_create(d->test, &lc, &d->test_loader));
    }
    return CH_OK;
}

ch_status ch_data_create(const ch_data_options_t *o, const ch_data_setup_t *setup,
                         ch_data_t **out)
{
    CH_REQUIRE(o && setup && out, "ch_data_create: NULL argument");
    *out = NULL;
    CH_TRY(ch_data_options_check_channels(o, setup->in_channels));
    ch_data_t *d = calloc(1, sizeof *d);
    if (!d) return CH_ERROR(CH_ERR_NOMEM, "data");
    ch_status s = open_datasets(o, setup, d);
    ch_data_options_t oo = *o; /* with the auto statistics filled in */
    if (s == CH_OK && (o->mean_auto || o->std_auto)) {
        float m[3], sd[3];
        s = ch_data_channel_stats(d->train, setup->pg, m, sd);
        for (int c = 0; s == CH_OK && c < d->train->channels; c++) {
            if (o->mean_auto) oo.mean[c] = m[c];
            if (o->std_auto) oo.std[c] = sd[c];
            if (o->std_auto && !(sd[c] > 0))
                s = CH_ERROR(CH_ERR_INVALID, "data.std = auto: channel %d of %s is constant (std 0)",
                             c, o->path);
        }
        if (o->mean_auto) oo.n_mean = d->train->channels;
        if (o->std_auto) oo.n_std = d->train->channels;
    }
    for (int c = 0; c < setup->in_channels; c++) {
        d->mean[c] = oo.mean[oo.n_mean == 1 ? 0 : c];
        d->std[c] = oo.std[oo.n_std == 1 ? 0 : c];
    }
    if (s == CH_OK) s = make_loaders(&oo, setup, d);
    if (s != CH_OK) {
        ch_data_destroy(d);
        return s;
    }
    *out = d;
    return CH_OK;
}

void ch_data_destroy(ch_data_t *d)
{
    if (!d) return;
    ch_loader_destroy(d->train_loader);
    ch_loader_destroy(d->test_loader);
    if (d->train != d->train_base_) ch_dataset_destroy(d->train);
    if (d->test != d->test_base_) ch_dataset_destroy(d->test);
    ch_dataset_destroy(d->train_base_);
    ch_dataset_destroy(d->test_base_);
    free(d->staged_[0]);
    free(d->staged_[1]);
    free(d);
}
