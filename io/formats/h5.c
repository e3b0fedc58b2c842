/* cohort: HDF5 dataset segments, see h5.h. */
#include "config.h"

#include "io/formats/h5.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#ifdef HAVE_HDF5
#include <hdf5.h>
#endif

int ch_h5_is_dataset_spec(const char *arg, size_t *file_len)
{
    static const char *const exts[] = {".h5", ".hdf5", ".he5"};
    const char *end = arg + strlen(arg);
    for (const char *c = strchr(arg, ':'); ; c = strchr(c + 1, ':')) {
        if (!c) c = end; /* a bare FILE.h5 last: ch_h5_open asks for the dataset path */
        size_t len = (size_t)(c - arg);
        for (int i = 0; i < 3; i++) {
            size_t el = strlen(exts[i]);
            if (len > el && strncasecmp(c - el, exts[i], el) == 0) {
                if (file_len) *file_len = len;
                return 1;
            }
        }
        if (c == end) break;
    }
    return 0;
}

#ifdef HAVE_HDF5

struct ch_h5_dataset {
    char *file;    /* FILE */
    const char *path; /* points after the ':' in file's allocation */
    hid_t fid, did, memtype;
    int ndim;
    hsize_t dims[CH_ARRAY_MAX_DIMS];
};

/* The innermost message of HDF5's error stack (the cause), for our errors. */
static herr_t first_error(unsigned n, const H5E_error2_t *e, void *arg)
{
    if (n == 0 && e->desc) snprintf(arg, 256, "%s", e->desc);
    return 0;
}

static const char *hdf5_cause(char *buf)
{
    snprintf(buf, 256, "no message");
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, first_error, buf);
    H5Eclear2(H5E_DEFAULT);
    return buf;
}

static const char *class_name(H5T_class_t c)
{
    switch (c) {
    case H5T_INTEGER: return "integer";
    case H5T_FLOAT: return "float";
    case H5T_TIME: return "time";
    case H5T_STRING: return "string";
    case H5T_BITFIELD: return "bitfield";
    case H5T_OPAQUE: return "opaque";
    case H5T_COMPOUND: return "compound";
    case H5T_REFERENCE: return "reference";
    case H5T_ENUM: return "enum (h5py stores bool as one)";
    case H5T_VLEN: return "variable-length";
    case H5T_ARRAY: return "array";
    default: return "unknown";
    }
}

/* Map the file type to a dtype and the native memory type HDF5 converts to. */
static ch_status map_type(const ch_h5_dataset_t *d, hid_t t, ch_array_dtype *dt, hid_t *mem)
{
    H5T_class_t cls = H5Tget_class(t);
    size_t size = H5Tget_size(t);
    if (cls == H5T_INTEGER && (size == 1 || size == 2 || size == 4 || size == 8)) {
        static const ch_array_dtype s[] = {CH_DT_INT8, CH_DT_INT16, CH_DT_INT32, CH_DT_INT64};
        static const ch_array_dtype u[] = {CH_DT_UINT8, CH_DT_UINT16, CH_DT_UINT32, CH_DT_UINT64};
        const hid_t sm[] = {H5T_NATIVE_INT8, H5T_NATIVE_INT16, H5T_NATIVE_INT32, H5T_NATIVE_INT64};
        const hid_t um[] = {H5T_NATIVE_UINT8, H5T_NATIVE_UINT16, H5T_NATIVE_UINT32, H5T_NATIVE_UINT64};
        int k = size == 1 ? 0 : size == 2 ? 1 : size == 4 ? 2 : 3;
        int sgn = H5Tget_sign(t) == H5T_SGN_2;
        *dt = sgn ? s[k] : u[k];
        *mem = sgn ? sm[k] : um[k];
        return CH_OK;
    }
    if (cls == H5T_FLOAT && (size == 4 || size == 8) && H5Tget_precision(t) == 8 * size) {
        *dt = size == 4 ? CH_DT_FLOAT32 : CH_DT_FLOAT64;
        *mem = size == 4 ? H5T_NATIVE_FLOAT : H5T_NATIVE_DOUBLE;
        return CH_OK;
    }
    return CH_ERROR(CH_ERR_UNSUPPORTED, "%s:%s: dataset type %s of %zu bytes is not supported "
                    "(integers of 1-8 bytes and float32/float64 are)", d->file, d->path,
                    class_name(cls), size);
}

/* For a chunked dataset, a dataset access list whose chunk cache holds one
 * row of chunks (all the chunks a C-order read of chunk_dims[0] rows
 * touches), at most CH_H5_CACHE_MAX bytes: ranks read C-order ranges, and
 * with HDF5's default 1 MiB cache a chunk cut by a read boundary would be
 * read and decompressed again. H5P_DEFAULT for other layouts. */
#define CH_H5_CACHE_MAX ((size_t)128 << 20)
static hid_t access_plist(hid_t did, int ndim, const hsize_t *dims, size_t itemsize)
{
    hid_t dcpl = H5Dget_create_plist(did), dapl = H5P_DEFAULT;
    hsize_t chunk[H5S_MAX_RANK];
    if (dcpl >= 0 && ndim > 0 && ndim <= H5S_MAX_RANK && H5Pget_layout(dcpl) == H5D_CHUNKED &&
        H5Pget_chunk(dcpl, ndim, chunk) == ndim) {
        double bytes = (double)itemsize, chunks = 1;
        for (int i = 0; i < ndim; i++) {
            double per = (double)((dims[i] + chunk[i] - 1) / chunk[i]);
            bytes *= (double)chunk[i] * (i == 0 ? 1 : per);
            chunks *= i == 0 ? 1 : per;
        }
        size_t nbytes = bytes < (double)CH_H5_CACHE_MAX ? (size_t)bytes : CH_H5_CACHE_MAX;
        /* slots: HDF5's advice, about 100 times the chunks that fit (odd) */
        size_t slots = (size_t)(chunks * 100 < 1e6 ? chunks * 100 : 1e6) | 1;
        if (nbytes > ((size_t)1 << 20) && (dapl = H5Pcreate(H5P_DATASET_ACCESS)) >= 0 &&
            H5Pset_chunk_cache(dapl, slots, nbytes, 1.0) < 0) {
            H5Pclose(dapl);
            dapl = H5P_DEFAULT;
        }
        if (dapl < 0) dapl = H5P_DEFAULT;
    }
    if (dcpl >= 0) H5Pclose(dcpl);
    return dapl;
}

ch_status ch_h5_open(const char *spec, ch_array_desc_t *desc, ch_h5_dataset_t **out)
{
    *out = NULL;
    size_t flen = 0;
    CH_REQUIRE(spec && desc, "ch_h5_open: NULL argument");
    if (!ch_h5_is_dataset_spec(spec, &flen) || spec[flen] != ':' || spec[flen + 1] == '\0')
        return CH_ERROR(CH_ERR_INVALID, "'%s': an HDF5 input is FILE.h5:/path/to/dataset (the "
                        "dataset path is missing)", spec);
    ch_h5_dataset_t *d = calloc(1, sizeof *d);
    char *file = d ? strdup(spec) : NULL;
    if (!file) {
        free(d);
        return CH_ERROR(CH_ERR_NOMEM, "HDF5 input %s", spec);
    }
    file[flen] = '\0';
    d->file = file;
    d->path = file + flen + 1;
    d->fid = d->did = H5I_INVALID_HID;
    char cause[256];
    ch_status s = CH_OK;
    struct stat sb;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* errors come back as ch_status, not on stderr */
    if (stat(d->file, &sb)) {
        s = CH_ERROR(CH_ERR_IO, "%s: cannot open: %s", d->file, strerror(errno));
    } else if ((d->fid = H5Fopen(d->file, H5F_ACC_RDONLY, H5P_DEFAULT)) < 0) {
        s = CH_ERROR(CH_ERR_FORMAT, "%s: cannot open as an HDF5 file: %s", d->file, hdf5_cause(cause));
    } else if ((d->did = H5Dopen2(d->fid, d->path, H5P_DEFAULT)) < 0) {
        s = CH_ERROR(CH_ERR_FORMAT, "%s: no dataset '%s' in this file: %s", d->file, d->path,
                     hdf5_cause(cause));
    }
    hid_t t = H5I_INVALID_HID, space = H5I_INVALID_HID;
    memset(desc, 0, sizeof *desc);
    if (s == CH_OK) {
        t = H5Dget_type(d->did);
        space = H5Dget_space(d->did);
        if (t < 0 || space < 0)
            s = CH_ERROR(CH_ERR_FORMAT, "%s:%s: cannot read the dataset's type or shape: %s", d->file,
                         d->path, hdf5_cause(cause));
    }
    if (s == CH_OK) s = map_type(d, t, &desc->dtype, &d->memtype);
    if (s == CH_OK) {
        d->ndim = H5Sget_simple_extent_ndims(space);
        if (d->ndim < 0)
            s = CH_ERROR(CH_ERR_FORMAT, "%s:%s: not a simple dataspace", d->file, d->path);
        else if (d->ndim > CH_ARRAY_MAX_DIMS)
            s = CH_ERROR(CH_ERR_RANGE, "%s:%s: %d dims, at most %d are supported", d->file, d->path,
                         d->ndim, CH_ARRAY_MAX_DIMS);
        else if (H5Sget_simple_extent_dims(space, d->dims, NULL) < 0)
            s = CH_ERROR(CH_ERR_FORMAT, "%s:%s: cannot read the shape: %s", d->file, d->path,
                         hdf5_cause(cause));
    }
    if (t >= 0) H5Tclose(t);
    if (space >= 0) H5Sclose(space);
    if (s != CH_OK) {
        ch_h5_close(d);
        return s;
    }
    /* reopen with a chunk cache fitted to the layout */
    hid_t dapl = access_plist(d->did, d->ndim, d->dims, ch_array_dtype_size(desc->dtype));
    if (dapl != H5P_DEFAULT) {
        hid_t did = H5Dopen2(d->fid, d->path, dapl);
        H5Pclose(dapl);
        if (did >= 0) {
            H5Dclose(d->did);
            d->did = did;
        }
    }
    desc->ndim = d->ndim;
    for (int i = 0; i < d->ndim; i++) desc->shape[i] = (int64_t)d->dims[i];
    *out = d;
    return CH_OK;
}

/* Read one box (start, count over all dims) of the dataset into *dst and
 * advance *dst past it. The memory space has the box's shape (C order,
 * the same bytes as a flat run): with a flat 1-d memory space HDF5 takes
 * its general scatter path, measured here at 0.44-0.54 s of read wait for
 * a chunked 4000x4000 float64 dataset against 0.07 s with this one. */
static herr_t read_box(const ch_h5_dataset_t *d, hid_t fspace, const hsize_t *start,
                       const hsize_t *count, char **dst)
{
    hsize_t n = 1;
    for (int j = 0; j < d->ndim; j++) n *= count[j];
    hid_t mspace = H5Screate_simple(d->ndim, count, NULL);
    herr_t rc = mspace < 0 ? -1 : H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL);
    if (rc >= 0) rc = H5Dread(d->did, d->memtype, mspace, fspace, H5P_DEFAULT, *dst);
    if (mspace >= 0) H5Sclose(mspace);
    *dst += n * H5Tget_size(d->memtype);
    return rc;
}

/* Read the elements [e0, e0+n) (C order) of the sub-array dims[k..] at the
 * fixed leading coordinates start[0..k-1] into *dst: a leading partial row,
 * a block of whole rows, a trailing partial row (at most 2 ndim - 1 boxes,
 * each one regular hyperslab read on its own). */
static herr_t read_range(const ch_h5_dataset_t *d, hid_t fspace, int k, hsize_t *start,
                         hsize_t *count, hsize_t e0, hsize_t n, char **dst)
{
    if (n == 0) return 0;
    hsize_t inner = 1;
    for (int j = k + 1; j < d->ndim; j++) inner *= d->dims[j];
    hsize_t r = e0 / inner, off = e0 % inner;
    herr_t rc = 0;
    if (off) {
        hsize_t m = n < inner - off ? n : inner - off;
        start[k] = r;
        count[k] = 1;
        rc = read_range(d, fspace, k + 1, start, count, off, m, dst);
        n -= m;
        r++;
    }
    if (rc >= 0 && n >= inner) {
        start[k] = r;
        count[k] = n / inner;
        for (int j = k + 1; j < d->ndim; j++) {
            start[j] = 0;
            count[j] = d->dims[j];
        }
        rc = read_box(d, fspace, start, count, dst);
        r += n / inner;
        n %= inner;
    }
    if (rc >= 0 && n) {
        start[k] = r;
        count[k] = 1;
        rc = read_range(d, fspace, k + 1, start, count, 0, n, dst);
    }
    return rc;
}

ch_status ch_h5_read(ch_h5_dataset_t *d, int64_t e0, int64_t n, void *dst)
{
    if (n <= 0) return CH_OK;
    char cause[256];
    hid_t fspace = H5Dget_space(d->did);
    herr_t rc = fspace < 0 ? -1 : 0;
    char *p = dst;
    if (rc >= 0 && d->ndim > 0) {
        hsize_t start[CH_ARRAY_MAX_DIMS], count[CH_ARRAY_MAX_DIMS];
        rc = read_range(d, fspace, 0, start, count, (hsize_t)e0, (hsize_t)n, &p);
    } else if (rc >= 0) { /* a 0-d (scalar) dataset: its one element */
        rc = H5Dread(d->did, d->memtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst);
    }
    ch_status s = CH_OK;
    if (rc < 0)
        s = CH_ERROR(CH_ERR_IO, "%s:%s: read of elements [%lld, %lld) failed: %s", d->file, d->path,
                     (long long)e0, (long long)(e0 + n), hdf5_cause(cause));
    if (fspace >= 0) H5Sclose(fspace);
    return s;
}

void ch_h5_close(ch_h5_dataset_t *d)
{
    if (!d) return;
    if (d->did >= 0) H5Dclose(d->did);
    if (d->fid >= 0) H5Fclose(d->fid);
    free(d->file);
    free(d);
}

#else /* !HAVE_HDF5 */

struct ch_h5_dataset {
    int unused;
};

ch_status ch_h5_open(const char *spec, ch_array_desc_t *desc, ch_h5_dataset_t **out)
{
    (void)desc;
    *out = NULL;
    return CH_ERROR(CH_ERR_UNSUPPORTED, "%s: this cohort was built without HDF5 (configure found "
                    "no libhdf5 or was given --without-hdf5; Debian: apt-get install libhdf5-dev, "
                    "then configure again)", spec);
}

ch_status ch_h5_read(ch_h5_dataset_t *d, int64_t e0, int64_t n, void *dst)
{
    (void)d; (void)e0; (void)n; (void)dst;
    return CH_ERROR(CH_ERR_UNSUPPORTED, "HDF5 read: this cohort was built without HDF5");
}

void ch_h5_close(ch_h5_dataset_t *d) { free(d); }

#endif
