/* cohort: a training job's data — the train and test datasets and their
 * loaders, built from the data.* config keys.
 *
 * What it builds (the seed recipe, SEMANTICS.md "Data order"):
 *   datasets   data.format idx (MNIST/Fashion-MNIST IDX files), cifar10
 *              (CIFAR-10 binary batches), imagefolder (class folders) or
 *              shards (WebDataset tar shards, io/data/shards.h; the index
 *              is built collectively over setup->pg on first use); for
 *              the last two the test set is data.val_path, or a random_split of
 *              data.path by data.val_fraction seeded with the job's seed
 *              (shards are first copied to data.stage on every node when
 *              it is set, io/data/stage.h),
 *              cut to the first data.train_subset / data.test_subset
 *              samples when those are > 0 (not for a random_split);
 *   transforms train: [Resize + CenterCrop(data.image_size)] or
 *              [RandomResizedCrop(data.random_resized_crop)] (test then
 *              Resize(int(S / 0.875)) + CenterCrop(S), torchvision's
 *              ImageNet recipe),
 *              [RandomCrop(size, padding=data.random_crop_padding)],
 *              [RandomHorizontalFlip(0.5) with data.hflip],
 *              ToTensor + Normalize(data.mean, data.std);
 *              test: [Resize + CenterCrop], ToTensor + Normalize;
 *              data.fast_decode (opt-in): JPEGs decoded partially / DCT-
 *              scaled for the first op (transforms.h "fast JPEG decode");
 *   loaders    train: BatchSampler(DistributedSampler(train, shuffle, seed),
 *              batch_size, drop_last=True) (or, opt-in, data.order =
 *              shard_window: ch_sampler_set_shard_window, not that order); test (when asked):
 *              DataLoader(test, batch_size, sampler=DistributedSampler(test,
 *              shuffle=False)): padded to a multiple of the world size, no
 *              batch dropped. data.workers threads and data.prefetch slots
 *              each (io/data/loader.h).
 */
#ifndef COHORT_IO_DATA_H
#define COHORT_IO_DATA_H

#include "framework/core/configuration.h"
#include "framework/core/status.h"
#include "framework/dist/dist.h"
#include "io/data/dataset.h"
#include "io/data/loader.h"
#include "io/data/stage.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* data.format */
typedef enum {
    CH_DATA_IDX = 0,
    CH_DATA_CIFAR10 = 1,
    CH_DATA_IMAGEFOLDER = 2,
    CH_DATA_SHARDS = 3 /* WebDataset tar shards read by index (io/data/shards.h) */
} ch_data_format_t;

typedef struct {
    const char *path;          /* data.path (strings point into the config) */
    ch_data_format_t format;   /* data.format */
    const char *format_name;   /* its text: "idx", "cifar10", "imagefolder", "shards" */
    const char *val_path;      /* data.val_path ("" = split data.path) */
    double val_fraction;       /* data.val_fraction, [0, 1] */
    int image_size;            /* data.image_size (0: the dataset's size) */
    long long train_subset;    /* data.train_subset (0: all) */
    long long test_subset;     /* data.test_subset (0: all) */
    int workers;               /* data.workers */
    int prefetch;              /* data.prefetch */
    int pinned_mb;             /* data.pinned_mb: page-locked slot cap, MiB (0: none) */
    int n_mean, n_std;         /* values given for data.mean / data.std (1..3; 0 for auto) */
    float mean[3], std[3];     /* data.mean, data.std (std > 0) */
    int mean_auto, std_auto;   /* data.mean / data.std = auto: from the training set */
    int random_crop_padding;   /* data.random_crop_padding (0: off) */
    int hflip;                 /* data.hflip */
    const char *stage;         /* data.stage ("" = read in place; shards only, io/data/stage.h) */
    int stage_keep;            /* data.stage_keep: ch_data_unstage is the caller's to skip */
    int shard_window;          /* data.order = shard_window: data.shard_window; 0: sampler order */
    int random_resized_crop;   /* data.random_resized_crop (0: off) */
    int fast_decode;           /* data.fast_decode: partial / DCT-scaled JPEG decode */
} ch_data_options_t;

/* The data.* keys (a job lists them as its "data" table). */
ch_config_table_t ch_data_config_table(void);

/* Options from those keys (PETSc's set-from-options). Errors: CH_ERR_CONFIG
 * naming the source (file:line or option) for data.format not one of idx,
 * cifar10, imagefolder, shards; naming the key for a data.mean / data.std value that
 * is not a finite number (nor the one word auto), more than 3 values, or a std value <= 0;
 * CH_ERR_INVALID for a key missing from cfg's table. */
ch_status ch_data_options_from_config(const ch_config_t *cfg, ch_data_options_t *o);

/* Check data.mean / data.std against the model's input channels: each has
 * 1 value or `channels` values. CH_ERR_CONFIG naming the key, the count and
 * model.in_channels otherwise. */
ch_status ch_data_options_check_channels(const ch_data_options_t *o, int channels);

/* What the job decides (not data.* keys). */
typedef struct {
    int in_channels;    /* the model's input channels (must equal the data's) */
    int num_classes;    /* the model's classes (>= the data's) */
    int64_t batch_size; /* per rank */
    uint64_t seed;      /* sampler, augmentation and random_split seed */
    int rank, world_size;
    int pinned;         /* page-locked batch slots (batches go to a GPU) */
    int eval;           /* build the test loader */
    ch_pg_t *pg;        /* the ranks that share data.mean/std = auto and build a shard
                           index together (collective in
                           ch_data_create); NULL: this process alone */
} ch_data_setup_t;

/* The datasets and loaders. train / test are what the loaders read (the
 * subset or split when one applies); test_loader is NULL without eval. */
typedef struct {
    ch_dataset_t *train, *test;
    ch_loader_t *train_loader, *test_loader;
    float mean[3], std[3]; /* Normalize per channel (in_channels values), auto or given */
    ch_stage_stats_t stage_stats; /* data.stage: files, bytes and seconds (train + val); 0s without */
    ch_dataset_t *train_base_, *test_base_; /* private: the opened datasets */
    char *staged_[2];             /* private: the staged specs (train, val) */
} ch_data_t;

/* Per-channel statistics of ds (data.mean = auto / data.std = auto), as
 * torchvision's ToTensor would give them: every uint8 value x of every
 * sample (H, W, C as stored, before resize, crop or augmentation) taken as
 * x / 255, mean and population std (ddof 0, numpy's x.std(); torch's
 * Tensor.std() defaults to ddof 1) over samples, rows and columns, one
 * value per channel into mean[] and std[] (ds->channels each). Exact
 * (framework/reduce: ch_reduce_channel_stats over a uint8 (N, H, W, C)
 * view, each rank of pg reading its share of the images; collective; pg
 * NULL: this process reads all), divided by 255 and rounded to float.
 * CH_ERR_UNSUPPORTED when the images vary in size (height/width 0) or
 * have more than 3 channels,
 * CH_ERR_FORMAT for a sample of another size, CH_ERR_INVALID for an empty
 * set, the dataset's read errors. */
ch_status ch_data_channel_stats(const ch_dataset_t *ds, ch_pg_t *pg, float *mean, float *std);

/* Open the datasets and build the loaders (see the top of this file).
 * Errors: those of the dataset readers (CH_ERR_IO naming the missing or
 * unreadable path, CH_ERR_FORMAT), of ch_loader_create, and CH_ERR_CONFIG
 * when the images' channel count differs from setup->in_channels or the
 * dataset has more classes than setup->num_classes (naming model.in_channels
 * / model.num_classes and data.path), or mean/std do not fit the channels
 * (ch_data_options_check_channels). Nothing stays allocated on error
 * (*out is NULL). */
ch_status ch_data_create(const ch_data_options_t *o, const ch_data_setup_t *setup,
                         ch_data_t **out);

/* Remove the copies data.stage made (io/data/stage.h ch_shards_unstage:
 * collective over pg; a directory another job still uses is kept). The
 * trainer calls it when a run completes and data.stage_keep is false; a
 * no-op without staging. Call it before ch_data_destroy, with the loaders
 * idle. Errors: CH_ERR_MPI. */
ch_status ch_data_unstage(ch_data_t *d, ch_pg_t *pg);

/* Join the loaders' threads and free everything. NULL is a no-op. */
void ch_data_destroy(ch_data_t *d);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_IO_DATA_H */
