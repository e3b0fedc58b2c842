/* cohort: torchvision-style ImageFolder datasets, see dataset.h.
 * Mirrors torchvision 0.14 datasets/folder.py: find_classes, make_dataset
 * (os.walk(followlinks=True), sorted), IMG_EXTENSIONS, pil_loader. */
#include "io/data/dataset.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const img_extensions[] = {".jpg", ".jpeg", ".png", ".ppm", ".bmp",
                                             ".pgm", ".tif", ".tiff", ".webp"};
#define N_EXT (sizeof img_extensions / sizeof img_extensions[0])
#define EXT_LIST ".jpg, .jpeg, .png, .ppm, .bmp, .pgm, .tif, .tiff, .webp"

struct strvec {
    char **v;
    size_t n, cap;
};

static int strvec_push(struct strvec *s, char *str)
{
    if (!str) return -1;
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 16;
        char **p = realloc(s->v, nc * sizeof *p);
        if (!p) {
            free(str);
            return -1;
        }
        s->v = p;
        s->cap = nc;
    }
    s->v[s->n++] = str;
    return 0;
}

static void strvec_free(struct strvec *s)
{
    for (size_t k = 0; k < s->n; k++) free(s->v[k]);
    free(s->v);
    memset(s, 0, sizeof *s);
}

static int has_image_extension(const char *name)
{
    size_t ln = strlen(name);
    for (size_t k = 0; k < N_EXT; k++) {
        size_t le = strlen(img_extensions[k]);
        if (ln < le) continue;
        size_t j = 0;
        while (j < le && tolower((unsigned char)name[ln - le + j]) == img_extensions[k][j]) j++;
        if (j == le) return 1;
    }
    return 0;
}

/* Is path/ent a directory, following symlinks (os.DirEntry.is_dir())? */
static int entry_is_dir(const char *dir, const struct dirent *e)
{
#ifdef DT_DIR
    if (e->d_type == DT_DIR) return 1;
    if (e->d_type != DT_LNK && e->d_type != DT_UNKNOWN) return 0;
#endif
    char *p = ch_dataset_path_join(dir, e->d_name);
    if (!p) return 0;
    struct stat sb;
    int r = stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
    free(p);
    return r;
}

/* Directories of the walk below `dir` (itself included), like
 * os.walk(dir, followlinks=True). A symlink back to a directory on the
 * current path (a loop) is not followed: os.walk would recurse until the
 * path is too long; cohort lists each directory of the loop once. */
#define WALK_MAX_DEPTH 256
struct walk_anc {
    dev_t dev;
    ino_t ino;
};

static int walk_dirs_rec(const char *dir, int depth, struct walk_anc *anc, struct strvec *dirs)
{
    struct stat sb;
    if (stat(dir, &sb) != 0) return 0;
    for (int k = 0; k < depth; k++)
        if (anc[k].dev == sb.st_dev && anc[k].ino == sb.st_ino) return 0; /* loop */
    if (depth >= WALK_MAX_DEPTH) return 0;
    anc[depth].dev = sb.st_dev;
    anc[depth].ino = sb.st_ino;
    char *copy = strdup(dir);
    if (strvec_push(dirs, copy)) return -1;
    DIR *d = opendir(dir);
    if (!d) return 0; /* os.walk ignores unreadable directories */
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (!entry_is_dir(dir, e)) continue;
        char *sub = ch_dataset_path_join(dir, e->d_name);
        if (!sub) {
            rc = -1;
            break;
        }
        rc = walk_dirs_rec(sub, depth + 1, anc, dirs);
        free(sub);
        if (rc) break;
    }
    closedir(d);
    return rc;
}

static int walk_dirs(const char *dir, struct strvec *dirs)
{
    struct walk_anc *anc = malloc(WALK_MAX_DEPTH * sizeof *anc);
    if (!anc) return -1;
    int rc = walk_dirs_rec(dir, 0, anc, dirs);
    free(anc);
    return rc;
}

struct folder_impl {
    char **paths;
    int64_t *labels;
};

static ch_status folder_get(const ch_dataset_t *ds, int64_t i, ch_image_t *img, int64_t *label)
{
    const struct folder_impl *f = ds->impl;
    ch_status st = ch_image_read_file(img, f->paths[i]);
    if (st == CH_OK) st = ch_image_decode(img->raw, img->raw_size, ds->channels, img, f->paths[i]);
    if (st != CH_OK) return ch_error_context("ImageFolder %s: sample %lld", ds->name, (long long)i);
    *label = f->labels[i];
    return CH_OK;
}

static const char *folder_path(const ch_dataset_t *ds, int64_t i)
{
    const struct folder_impl *f = ds->impl;
    return f->paths[i];
}

int64_t ch_dataset_imagefolder_label(const ch_dataset_t *ds, int64_t i)
{
    if (!ds || !ds->kind || strcmp(ds->kind, "imagefolder") || i < 0 || i >= ds->length) return -1;
    const struct folder_impl *f = ds->impl;
    return f->labels[i];
}

static void folder_destroy(ch_dataset_t *ds)
{
    struct folder_impl *f = ds->impl;
    if (!f) return;
    for (int64_t i = 0; i < ds->length; i++) free(f->paths[i]);
    free(f->paths);
    free(f->labels);
    free(f);
}

ch_status ch_dataset_imagefolder_open(const char *root, int channels, ch_dataset_t **out)
{
    *out = NULL;
    CH_REQUIRE(root != NULL, "ImageFolder: root is NULL");
    CH_REQUIRE(channels == 1 || channels == 3, "ImageFolder %s: channels %d (expected 1 or 3)", root,
               channels);
    struct stat sb;
    if (stat(root, &sb) != 0)
        return CH_ERROR(CH_ERR_IO, "ImageFolder root '%s': %s", root, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return CH_ERROR(CH_ERR_IO, "ImageFolder root '%s' is not a directory", root);
    DIR *d = opendir(root);
    if (!d) return CH_ERROR(CH_ERR_IO, "ImageFolder root '%s': %s", root, strerror(errno));
    struct strvec classes = {0}, files = {0}, dirs = {0}, names = {0};
    int64_t *labels = NULL;
    size_t lab_cap = 0, empty_len = 0;
    char *empty = NULL;
    ch_status st = CH_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (entry_is_dir(root, e) && strvec_push(&classes, strdup(e->d_name))) {
            closedir(d);
            st = CH_ERROR(CH_ERR_NOMEM, "ImageFolder %s: out of memory", root);
            goto fail;
        }
    }
    closedir(d);
    if (classes.n == 0) {
        st = CH_ERROR(CH_ERR_IO, "ImageFolder: Couldn't find any class folder in %s.", root);
        goto fail;
    }
    qsort(classes.v, classes.n, sizeof *classes.v, ch_dataset_cmp_str);
    for (size_t c = 0; c < classes.n; c++) {
        char *cdir = ch_dataset_path_join(root, classes.v[c]);
        if (!cdir || walk_dirs(cdir, &dirs)) {
            free(cdir);
            st = CH_ERROR(CH_ERR_NOMEM, "ImageFolder %s: out of memory", root);
            goto fail;
        }
        free(cdir);
        if (dirs.n > 1) qsort(dirs.v, dirs.n, sizeof *dirs.v, ch_dataset_cmp_str);
        size_t before = files.n;
        for (size_t k = 0; k < dirs.n; k++) {
            DIR *dd = opendir(dirs.v[k]);
            if (!dd) continue;
            while ((e = readdir(dd)) != NULL) {
                if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
                if (entry_is_dir(dirs.v[k], e) || !has_image_extension(e->d_name)) continue;
                if (strvec_push(&names, strdup(e->d_name))) {
                    closedir(dd);
                    st = CH_ERROR(CH_ERR_NOMEM, "ImageFolder %s: out of memory", root);
                    goto fail;
                }
            }
            closedir(dd);
            if (names.n > 1) qsort(names.v, names.n, sizeof *names.v, ch_dataset_cmp_str);
            for (size_t j = 0; j < names.n; j++) {
                if (strvec_push(&files, ch_dataset_path_join(dirs.v[k], names.v[j]))) {
                    st = CH_ERROR(CH_ERR_NOMEM, "ImageFolder %s: out of memory", root);
                    goto fail;
                }
            }
            strvec_free(&names);
        }
        strvec_free(&dirs);
        if (files.n > lab_cap) {
            size_t nc = files.cap;
            int64_t *p = realloc(labels, nc * sizeof *p);
            if (!p) {
                st = CH_ERROR(CH_ERR_NOMEM, "ImageFolder %s: out of memory", root);
                goto fail;
            }
            labels = p;
            lab_cap = nc;
        }
        for (size_t j = before; j < files.n; j++) labels[j] = (int64_t)c;
        if (files.n == before) { /* "Found no valid file for the classes ..." */
            size_t add = strlen(classes.v[c]) + 2;
            char *p = realloc(empty, empty_len + add + 1);
            if (!p) {
                st = CH_ERROR(CH_ERR_NOMEM, "ImageFolder %s: out of memory", root);
                goto fail;
            }
            empty = p;
            snprintf(empty + empty_len, add + 1, "%s%s", empty_len ? ", " : "", classes.v[c]);
            empty_len = strlen(empty);
        }
    }
    if (empty) {
        st = CH_ERROR(CH_ERR_FORMAT,
                      "ImageFolder %s: Found no valid file for the classes %s. Supported "
                      "extensions are: " EXT_LIST,
                      root, empty);
        goto fail;
    }
    ch_dataset_t *ds = calloc(1, sizeof *ds);
    struct folder_impl *fi = calloc(1, sizeof *fi);
    char *nm = strdup(root);
    if (!ds || !fi || !nm || classes.n > 0x7fffffff) {
        free(ds);
        free(fi);
        free(nm);
        st = CH_ERROR(CH_ERR_NOMEM, "ImageFolder %s: out of memory", root);
        goto fail;
    }
    fi->paths = files.v;
    fi->labels = labels;
    ds->kind = "imagefolder";
    ds->name = nm;
    ds->length = (int64_t)files.n;
    ds->num_classes = (int)classes.n;
    ds->channels = channels;
    ds->class_names = classes.v;
    ds->get = folder_get;
    ds->sample_path = folder_path;
    ds->destroy_impl = folder_destroy;
    ds->impl = fi;
    *out = ds;
    return CH_OK;
fail:
    strvec_free(&classes);
    strvec_free(&files);
    strvec_free(&dirs);
    strvec_free(&names);
    free(labels);
    free(empty);
    return st;
}
