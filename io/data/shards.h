/* cohort: the shard dataset — WebDataset-layout tar shards read by index.
 *
 * data.format = shards. The shards are named by one string (data.path, or
 * data.val_path for the validation set):
 *   - a directory: every regular file in it whose name ends in ".tar" and
 *     does not start with '.', in byte order of the names;
 *   - a brace pattern "DIR/name-{000000..000123}.tar" (WebDataset's and
 *     braceexpand's notation, one {A..B} group of decimal numbers in the
 *     file name, zero-padded to the width of A): every name must exist;
 *   - one .tar file.
 * Samples are those of the shard member scan (io/formats/shards.h: KEY.jpg /
 * .jpeg / .png + KEY.cls, adjacent), in shard order then member order; that
 * index order is the dataset order, so torch's DistributedSampler over the
 * dataset (io/data/sampler.h) picks exactly the samples it would pick from
 * `wds` samples enumerated in the same order, mid-epoch resume and a world
 * size change at an epoch boundary behave as for every other dataset, and a
 * dataset packed from IDX/ImageFolder (cohort-pack) gives the same samples
 * in the same order as the original.
 *
 * The index (sample -> shard, offset, size, label, key) is the file
 * DIR/cohort-shards.index for a directory, else the pattern or file name
 * with ".index" appended (train-{000000..000009}.tar.index). If it exists,
 * rank 0 reads it (one read, the bytes broadcast to the other ranks, which
 * parse them) and checks it against every shard's current size and mtime
 * (the other ranks check each shard by fstat when they first open it); a
 * shard that changed, is missing, or was not in the index (and an index
 * that does not parse) is one CH_ERR_FORMAT error naming the shard and the
 * index and saying how to rebuild (delete the index). If it does not exist,
 * the ranks build it together (rank r scans shards r, r + W, ...; each
 * shard's records are broadcast from the rank that scanned it), rank 0
 * writes it atomically (temp file + rename; a directory that cannot be
 * written is a warning, the index then lives in memory for this run only),
 * and every rank holds the same index.
 *
 * Reading: a shard's file is opened on the first sample read from it and
 * kept open (one open per shard per rank for the whole run, whatever the
 * number of epochs; it is checked by fstat against the index at that open);
 * a sample is one pread of its image bytes, then decoded as ImageFolder
 * decodes (io/data/image.h), so packed JPEG/PNG bytes give the same pixels
 * as the original files. get() is thread-safe. num_classes = largest label
 * + 1; height/width are the images' size when every image header in the
 * index gives the same one, else 0 (sizes vary: the transforms must make
 * them one size).
 */
#ifndef COHORT_IO_DATA_SHARDS_H
#define COHORT_IO_DATA_SHARDS_H

#include <stdint.h>

#include "framework/core/status.h"
#include "framework/dist/dist.h"
#include "io/data/dataset.h"
#include "io/formats/shards.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The shard files named by spec (see above) as full paths, sorted
 * (*paths[0..*n), each malloc'd, and the array; free with
 * ch_shards_paths_free). *dir gets their directory (malloc'd).
 * Errors: CH_ERR_IO naming spec (or the shard of a pattern) that does not
 * exist or a directory without .tar files; CH_ERR_CONFIG for a pattern
 * whose braces are not one {A..B} of decimal numbers with A <= B in the
 * file name; CH_ERR_NOMEM. */
ch_status ch_shards_list(const char *spec, char ***paths, int *n, char **dir);
void ch_shards_paths_free(char **paths, int n);

/* The index file's default path for spec (malloc'd string, see above);
 * NULL on out of memory. */
char *ch_shards_index_path(const char *spec);

/* Open the shard dataset named by spec with images decoded to `channels`
 * (1 or 3) channels. Collective over pg (all ranks pass the same spec);
 * pg NULL: this process alone. Errors: ch_shards_list's; CH_ERR_FORMAT for
 * a stale or unreadable index and for every scan error of
 * io/formats/shards.h (each naming the shard); CH_ERR_REMOTE on the other
 * ranks when one rank failed (ch_pg_check_all), so all ranks fail
 * together; CH_ERR_INVALID for channels; CH_ERR_NOMEM. */
ch_status ch_dataset_shards_open(const char *spec, int channels, ch_pg_t *pg, ch_dataset_t **out);

/* Shard files this dataset has opened so far (a count, for the "files
 * opened per epoch" measurement); 0 for another kind of dataset. */
int64_t ch_dataset_shards_files_opened(const ch_dataset_t *ds);

/* The dataset's index (read-only; NULL for another kind of dataset). */
const ch_shard_index_t *ch_dataset_shards_index(const ch_dataset_t *ds);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_IO_DATA_SHARDS_H */
