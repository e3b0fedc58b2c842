/* cohort: IDX datasets (MNIST / Fashion-MNIST), see idx.h and dataset.h. */
#include "io/data/idx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <zlib.h>

/* Largest inflated IDX file accepted from disk (bytes). */
#define IDX_MAX_FILE ((size_t)1 << 34)

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

ch_status ch_idx_parse(const uint8_t *buf, size_t len, uint32_t magic, const char *name,
                       ch_idx_t *out)
{
    memset(out, 0, sizeof *out);
    if (len < 4)
        return CH_ERROR(CH_ERR_FORMAT, "%s: truncated IDX file (%zu bytes, no magic number)",
                        name, len);
    uint32_t m = be32(buf);
    if (m != magic)
        return CH_ERROR(CH_ERR_FORMAT, "%s: wrong magic number 0x%08x (expected 0x%08x, IDX %s)",
                        name, m, magic, magic == CH_IDX_MAGIC_IMAGES ? "images" : "labels");
    int nd = (int)(magic & 0xff);
    size_t hdr = 4 + 4 * (size_t)nd;
    if (len < hdr)
        return CH_ERROR(CH_ERR_FORMAT, "%s: truncated IDX header (%zu bytes, %zu expected)", name,
                        len, hdr);
    uint64_t total = 1;
    out->ndims = nd;
    for (int d = 0; d < nd; d++) {
        out->dims[d] = be32(buf + 4 + 4 * d);
        if (out->dims[d] == 0 && d > 0)
            return CH_ERROR(CH_ERR_FORMAT, "%s: IDX dimension %d is 0", name, d);
        total *= (uint64_t)out->dims[d];
        if (total > ((uint64_t)1 << 40))
            return CH_ERROR(CH_ERR_FORMAT, "%s: IDX sizes too large", name);
    }
    if (len - hdr < total)
        return CH_ERROR(CH_ERR_FORMAT,
                        "%s: truncated: %llu bytes of data expected after the %zu-byte header, "
                        "%zu present",
                        name, (unsigned long long)total, hdr, len - hdr);
    if (len - hdr > total)
        return CH_ERROR(CH_ERR_FORMAT,
                        "%s: %zu unexpected bytes after the %llu bytes of data the header gives",
                        name, len - hdr - (size_t)total, (unsigned long long)total);
    out->data = buf + hdr;
    out->size = (size_t)total;
    return CH_OK;
}

ch_status ch_idx_gunzip(const uint8_t *buf, size_t len, size_t max_out, const char *name,
                        uint8_t **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    if (len < 2 || buf[0] != 0x1f || buf[1] != 0x8b) return CH_OK; /* raw */
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 15 + 32) != Z_OK)
        return CH_ERROR(CH_ERR_NOMEM, "%s: inflateInit2 failed", name);
    /* the gzip trailer's ISIZE (size mod 2^32) is a good first guess */
    size_t cap = len >= 8 ? (size_t)(buf[len - 4] | buf[len - 3] << 8 | buf[len - 2] << 16 |
                                     (uint32_t)buf[len - 1] << 24)
                          : 0;
    if (cap < len) cap = len * 4;
    if (cap / 1032 > len) cap = len * 1032; /* deflate's largest ratio */
    if (cap > max_out) cap = max_out;
    if (cap < 64) cap = 64;
    uint8_t *dst = malloc(cap);
    if (!dst) {
        inflateEnd(&z);
        return CH_ERROR(CH_ERR_NOMEM, "%s: out of memory (%zu bytes)", name, cap);
    }
    size_t used = 0, in_pos = 0;
    ch_status st = CH_OK;
    for (;;) {
        if (used == cap) {
            if (cap >= max_out) {
                st = CH_ERROR(CH_ERR_FORMAT, "%s: inflates to more than %zu bytes", name, max_out);
                break;
            }
            size_t ncap = cap * 2 > max_out ? max_out : cap * 2;
            uint8_t *p = realloc(dst, ncap);
            if (!p) {
                st = CH_ERROR(CH_ERR_NOMEM, "%s: out of memory (%zu bytes)", name, ncap);
                break;
            }
            dst = p;
            cap = ncap;
        }
        size_t in_avail = len - in_pos;
        z.next_in = (Bytef *)(buf + in_pos);
        z.avail_in = in_avail > 0x40000000u ? 0x40000000u : (uInt)in_avail;
        size_t out_avail = cap - used;
        z.next_out = dst + used;
        z.avail_out = out_avail > 0x40000000u ? 0x40000000u : (uInt)out_avail;
        uInt ai = z.avail_in, ao = z.avail_out;
        int r = inflate(&z, Z_NO_FLUSH);
        in_pos += ai - z.avail_in;
        used += ao - z.avail_out;
        if (r == Z_STREAM_END) {
            /* another gzip member follows? (as gzip -d and gzread accept) */
            if (len - in_pos >= 2 && buf[in_pos] == 0x1f && buf[in_pos + 1] == 0x8b) {
                inflateReset(&z);
                continue;
            }
            break;
        }
        if (r == Z_BUF_ERROR && in_pos == len) {
            st = CH_ERROR(CH_ERR_FORMAT, "%s: gzip stream is truncated (%zu bytes inflated)", name,
                          used);
            break;
        }
        if (r != Z_OK && r != Z_BUF_ERROR) {
            st = CH_ERROR(CH_ERR_FORMAT, "%s: corrupt gzip data: %s", name,
                          z.msg ? z.msg : zError(r));
            break;
        }
        if (in_pos == len && z.avail_out > 0 && r == Z_OK && ai == 0) {
            st = CH_ERROR(CH_ERR_FORMAT, "%s: gzip stream is truncated", name);
            break;
        }
    }
    inflateEnd(&z);
    if (st != CH_OK) {
        free(dst);
        return st;
    }
    *out = dst;
    *out_len = used;
    return CH_OK;
}

ch_status ch_dataset_idx_from_memory(const uint8_t *images, size_t images_len,
                                     const char *images_name, const uint8_t *labels,
                                     size_t labels_len, const char *labels_name, int num_classes, ch_dataset_t **out)
{
    *out = NULL;
    CH_REQUIRE(num_classes >= 0, "IDX dataset: num_classes %d < 0", num_classes);
    uint8_t *img_raw = NULL, *lbl_raw = NULL;
    size_t img_raw_len = 0, lbl_raw_len = 0;
    ch_status st = ch_idx_gunzip(images, images_len, IDX_MAX_FILE, images_name, &img_raw, &img_raw_len);
    if (st == CH_OK)
        st = ch_idx_gunzip(labels, labels_len, IDX_MAX_FILE, labels_name, &lbl_raw, &lbl_raw_len);
    if (st != CH_OK) goto done;
    ch_idx_t im, lb;
    st = ch_idx_parse(img_raw ? img_raw : images, img_raw ? img_raw_len : images_len,
                      CH_IDX_MAGIC_IMAGES, images_name, &im);
    if (st == CH_OK)
        st = ch_idx_parse(lbl_raw ? lbl_raw : labels, lbl_raw ? lbl_raw_len : labels_len,
                          CH_IDX_MAGIC_LABELS, labels_name, &lb);
    if (st != CH_OK) goto done;
    if (im.dims[0] != lb.dims[0]) {
        st = CH_ERROR(CH_ERR_FORMAT, "image/label count mismatch: %s has %lld images but %s has %lld labels",
                      images_name, (long long)im.dims[0], labels_name, (long long)lb.dims[0]);
        goto done;
    }
    if (im.dims[1] > CH_IMAGE_MAX_SIDE || im.dims[2] > CH_IMAGE_MAX_SIDE ||
        im.dims[1] * im.dims[2] > CH_IMAGE_MAX_PIXELS) {
        st = CH_ERROR(CH_ERR_FORMAT, "%s: image size %lldx%lld too large", images_name,
                      (long long)im.dims[1], (long long)im.dims[2]);
        goto done;
    }
    int maxl = -1;
    for (size_t k = 0; k < lb.size; k++) {
        if (num_classes > 0 && lb.data[k] >= num_classes) {
            st = CH_ERROR(CH_ERR_FORMAT, "%s: label %d at index %zu is out of range for %d classes",
                          labels_name, lb.data[k], k, num_classes);
            goto done;
        }
        if (lb.data[k] > maxl) maxl = lb.data[k];
    }
    uint8_t *px;
    int64_t *lab;
    size_t nl = strlen(images_name) + strlen(labels_name) + 4;
    char *name = malloc(nl);
    if (!name) {
        st = CH_ERROR(CH_ERR_NOMEM, "out of memory");
        goto done;
    }
    snprintf(name, nl, "%s", images_name);
    st = ch_dataset_memory_create("idx", name, im.dims[0], (int)im.dims[1], (int)im.dims[2], 1,
                                  num_classes > 0 ? num_classes : maxl + 1, &px, &lab, out);
    free(name);
    if (st != CH_OK) goto done;
    memcpy(px, im.data, im.size);
    for (size_t k = 0; k < lb.size; k++) lab[k] = lb.data[k];
done:
    free(img_raw);
    free(lbl_raw);
    return st;
}

ch_status ch_dataset_idx_open(const char *images_path,
                              const char *labels_path, int num_classes, ch_dataset_t **out)
{
    *out = NULL;
    uint8_t *ib = NULL, *lb = NULL;
    size_t il = 0, ll = 0;
    ch_status st = ch_dataset_read_file(images_path, &ib, &il);
    if (st == CH_OK) st = ch_dataset_read_file(labels_path, &lb, &ll);
    if (st == CH_OK)
        st = ch_dataset_idx_from_memory(ib, il, images_path, lb, ll, labels_path, num_classes, out);
    free(ib);
    free(lb);
    return st;
}

static int file_exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

ch_status ch_dataset_fashion_mnist_open(const char *dir, int train, ch_dataset_t **out)
{
    *out = NULL;
    CH_REQUIRE(dir != NULL, "ch_dataset_fashion_mnist_open: dir is NULL");
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return CH_ERROR(CH_ERR_IO, "Fashion-MNIST directory '%s' does not exist or is not a directory",
                        dir);
    const char *pre = train ? "train" : "t10k";
    char paths[2][4096];
    const char *kinds[2] = {"images-idx3-ubyte", "labels-idx1-ubyte"};
    for (int k = 0; k < 2; k++) {
        snprintf(paths[k], sizeof paths[k], "%s/%s-%s", dir, pre, kinds[k]);
        if (!file_exists(paths[k])) {
            snprintf(paths[k], sizeof paths[k], "%s/%s-%s.gz", dir, pre, kinds[k]);
            if (!file_exists(paths[k]))
                return CH_ERROR(CH_ERR_IO, "'%s' holds neither %s-%s nor %s-%s.gz", dir, pre,
                                kinds[k], pre, kinds[k]);
        }
    }
    return ch_dataset_idx_open(paths[0], paths[1], 10, out);
}
