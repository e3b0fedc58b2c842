/* cohort: datasets — a length and "sample i -> image + label".
 *
 * Every dataset gives samples as uint8 images in H,W,C order (ch_image_t,
 * image.h) plus an int64 class label in [0, num_classes). get() is safe to
 * call from several threads at once as long as each thread passes its own
 * ch_image_t (datasets hold no mutable shared state: IDX and CIFAR are read
 * into memory once at open; ImageFolder reads and decodes the file on every
 * get into the caller's buffers).
 *
 * Kinds:
 *   - IDX (MNIST / Fashion-MNIST, http://yann.lecun.com/exdb/mnist/): an
 *     images file (magic 0x00000803, uint8, N x H x W) and a labels file
 *     (magic 0x00000801, uint8, N), gzip-compressed or raw. C = 1.
 *   - CIFAR-10 binary (https://www.cs.toronto.edu/~kriz/cifar.html): records
 *     of 1 label byte + 3072 bytes (R, G, B planes of 32x32); train =
 *     data_batch_1..5.bin, test = test_batch.bin. C = 3, 10 classes.
 *   - ImageFolder (torchvision.datasets.ImageFolder, torchvision 0.14
 *     datasets/folder.py): root/CLASS/[SUBDIR/...]FILE; classes are the
 *     sub-directories of root in sorted (byte) order, hidden ones included;
 *     files are found by os.walk(followlinks=True) over each class folder in
 *     sorted order of directory path, then file name, kept when the name ends
 *     (case-insensitively) in .jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp.
 *     If ANY class folder holds no such file the open fails, as torchvision's
 *     FileNotFoundError "Found no valid file for the classes X, Y. Supported
 *     extensions are: ..."; a root with no sub-directory fails with
 *     "Couldn't find any class folder in ROOT.". Only JPEG and PNG contents
 *     decode (image.h); other listed formats fail at get with
 *     CH_ERR_UNSUPPORTED naming the file. One deliberate difference: a
 *     symlink back to a directory already on the walk's path is not
 *     followed (torchvision lists the loop's files again at every level
 *     until the path no longer resolves).
 *   - Subset: a view of another dataset through an index list
 *     (torch.utils.data.Subset); ch_dataset_random_split is
 *     torch.utils.data.random_split.
 */
#ifndef COHORT_DATASET_H
#define COHORT_DATASET_H

#include <stdint.h>

#include "framework/core/status.h"
#include "io/data/image.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ch_dataset ch_dataset_t;

/* The dataset object. Fields are read-only for users; implementers fill them
 * in their open function. */
struct ch_dataset {
    const char *kind;   /* "idx", "cifar10", "imagefolder", "subset" */
    char *name;         /* path (or description) used in error messages */
    int64_t length;     /* number of samples */
    int num_classes;
    int channels;       /* C of every sample */
    int height, width;  /* H, W of every sample, or 0 when they vary */
    char **class_names; /* num_classes names (ImageFolder), else NULL */
    /* sample i -> img (reshaped to its size) and *label; thread-safe */
    ch_status (*get)(const ch_dataset_t *ds, int64_t i, ch_image_t *img, int64_t *label);
    /* the file a sample comes from, for messages (may be NULL) */
    const char *(*sample_path)(const ch_dataset_t *ds, int64_t i);
    void (*destroy_impl)(ch_dataset_t *ds);
    void *impl;
};

/* Sample i (0 <= i < length) into img (H,W,C uint8) and *label.
 * Errors: CH_ERR_RANGE for i out of range; dataset-specific errors (a bad
 * image file: CH_ERR_IO / CH_ERR_FORMAT / CH_ERR_UNSUPPORTED) whose message
 * names the file and the index i. */
ch_status ch_dataset_get(const ch_dataset_t *ds, int64_t i, ch_image_t *img, int64_t *label);

/* The file sample i comes from (ImageFolder, Subset of it), else the
 * dataset's name. Never NULL. */
const char *ch_dataset_sample_path(const ch_dataset_t *ds, int64_t i);

/* Free a dataset of any kind. NULL is a no-op. A Subset does not free its
 * base. */
void ch_dataset_destroy(ch_dataset_t *ds);

/* ---- IDX */

/* Open an IDX pair. Both files may be gzip (detected by content) or raw.
 * num_classes > 0: every label must be < num_classes; 0: num_classes =
 * largest label + 1. Errors (each naming the file): CH_ERR_IO (missing /
 * unreadable), CH_ERR_FORMAT (wrong magic, truncated data or gzip stream,
 * image/label count mismatch, label out of range with its index). */
ch_status ch_dataset_idx_open(const char *images_path,
                              const char *labels_path, int num_classes, ch_dataset_t **out);

/* Fashion-MNIST / MNIST in directory dir, as Debian's dataset-fashion-mnist
 * installs it (/usr/share/datasets/fashion-mnist): train = 1 opens
 * train-images-idx3-ubyte[.gz] + train-labels-idx1-ubyte[.gz], train = 0 the
 * t10k-* pair; the raw name is preferred when both exist. 10 classes.
 * Errors as ch_dataset_idx_open; CH_ERR_IO names the directory and the file
 * names tried. */
ch_status ch_dataset_fashion_mnist_open(const char *dir, int train, ch_dataset_t **out);

/* ---- CIFAR-10 */

/* Open CIFAR-10 binary batch files (npaths >= 1), concatenated in order.
 * Errors: CH_ERR_IO (missing file), CH_ERR_FORMAT (size not a multiple of
 * 3073 bytes: truncated; label >= 10, with file and record index). */
ch_status ch_dataset_cifar10_open_files(const char *const *paths, int npaths, ch_dataset_t **out);
/* dir/data_batch_{1..5}.bin (train = 1) or dir/test_batch.bin. */
ch_status ch_dataset_cifar10_open(const char *dir, int train, ch_dataset_t **out);

/* ---- ImageFolder */

/* Index root as torchvision's ImageFolder does (see above); images decode to
 * `channels` channels (3 = convert("RGB") as torchvision's loader, or 1).
 * Errors: CH_ERR_IO (root missing or not a directory; "Couldn't find any
 * class folder"), CH_ERR_FORMAT ("Found no valid file for the classes ..."),
 * CH_ERR_INVALID (channels), CH_ERR_NOMEM. */
ch_status ch_dataset_imagefolder_open(const char *root, int channels, ch_dataset_t **out);

/* The class index of ImageFolder sample i without reading its file (what
 * cohort-pack copies next to the file's bytes); -1 for another kind of
 * dataset or i out of range. */
int64_t ch_dataset_imagefolder_label(const ch_dataset_t *ds, int64_t i);

/* ---- Subset / split */

/* A view of base: sample k is base's sample indices[k]. The indices are
 * copied; base must outlive the subset. CH_ERR_RANGE for an index outside
 * base. */
ch_status ch_dataset_subset_create(ch_dataset_t *base,
                                   const int64_t *indices, int64_t n, ch_dataset_t **out);

/* torch.utils.data.random_split(base, [1 - val_fraction, val_fraction],
 * generator=torch.Generator().manual_seed(seed)): lengths floor(n * frac)
 * with the remainder added round-robin from the first split, then a
 * torch.randperm(n) cut in two, in that order. 0 <= val_fraction <= 1.
 * Use it when the data has no separate validation folder. */
ch_status ch_dataset_random_split(ch_dataset_t *base, double val_fraction, uint64_t seed,
                                  ch_dataset_t **train, ch_dataset_t **val);

/* ---- for implementers */

/* "dir/name" in a new malloc'd string (NULL when out of memory). */
char *ch_dataset_path_join(const char *dir, const char *name);

/* qsort comparator of char * elements (byte order, strcmp). */
int ch_dataset_cmp_str(const void *a, const void *b);

/* Read the whole file at path into a new malloc'd buffer (*buf, *len; free
 * it). CH_ERR_IO naming the path and strerror; CH_ERR_NOMEM. */
ch_status ch_dataset_read_file(const char *path, uint8_t **buf, size_t *len);

/* An in-memory dataset of n images of h x w x c (H,W,C uint8) and n labels;
 * *pixels (n*h*w*c bytes) and *labels (n int64) are for the caller to fill.
 * kind and name are copied (kind must be a string literal). */
ch_status ch_dataset_memory_create(const char *kind, const char *name,
                                   int64_t n, int h, int w, int c, int num_classes,
                                   uint8_t **pixels, int64_t **labels, ch_dataset_t **out);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_DATASET_H */
