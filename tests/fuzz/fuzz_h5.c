/* Fuzz target: the HDF5 input spec "FILE.h5:/path" (io/formats/h5.c).
 * The input is a spec (up to its first NUL). ch_h5_is_dataset_spec must
 * agree with a plain reference (FILE is the shortest prefix ending at a ':'
 * or at the end whose name ends in .h5, .hdf5 or .he5, any case; *file_len
 * untouched otherwise). A spec it accepts is opened with ch_h5_open,
 * relative to a directory holding one valid file, d.h5 (made here through
 * the HDF5 library: datasets /g/d float64 2x3, /c chunked float32 8, /s a
 * uint8 scalar, /i big-endian int16 4, /e an enum, /t a string, and the
 * group /g): a spec without a dataset path is CH_ERR_INVALID, any other
 * failure has a message, and a success describes a dataset (ndim in range,
 * no negative dim, a known dtype) whose every element reads.
 *
 * The bytes of the HDF5 file itself are not fuzzed: libhdf5 1.10.8 (Debian
 * 12) crashes on corrupted files (a SIGSEGV in H5T_copy under H5Dopen2 within
 * seconds of mutating a valid file), which is the library's to fix and would
 * make this target fail in make check whatever cohort does.
 * Never a crash, leak or hang. */
#include "config.h"

#include "io/formats/h5.h"
#include "tests/fuzz/fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#ifdef HAVE_HDF5
#include <hdf5.h>
#endif

static char dir[64];

static int ends_with_ext(const char *s, size_t len)
{
    static const char *const exts[] = {".h5", ".hdf5", ".he5"};
    for (int i = 0; i < 3; i++) {
        size_t el = strlen(exts[i]);
        if (len > el && !strncasecmp(s + len - el, exts[i], el)) return 1;
    }
    return 0;
}

/* The reference: length of FILE, or -1 when spec names no HDF5 file. */
static size_t ref_file_len(const char *spec)
{
    size_t len = strlen(spec);
    for (size_t i = 0; i <= len; i++)
        if ((spec[i] == ':' || spec[i] == 0) && ends_with_ext(spec, i)) return i;
    return (size_t)-1;
}

#ifdef HAVE_HDF5
static void put(hid_t f, const char *name, hid_t type, int ndim, const hsize_t *dims,
                hid_t memtype, const void *data, hid_t dcpl)
{
    hid_t sp = ndim ? H5Screate_simple(ndim, dims, NULL) : H5Screate(H5S_SCALAR);
    hid_t d = H5Dcreate2(f, name, type, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (d < 0 || H5Dwrite(d, memtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) abort();
    H5Dclose(d);
    H5Sclose(sp);
}

static void make_file(const char *path)
{
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) abort();
    hid_t g = H5Gcreate2(f, "/g", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Gclose(g);
    const double d6[6] = {1, 2, 3, 4, 5, 6};
    const float f8[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    const unsigned char u1 = 7;
    const short i4[4] = {1, -2, 300, -32768};
    hsize_t dims2[2] = {2, 3}, dims1[1] = {8}, chunk[1] = {4}, dims4[1] = {4};
    put(f, "/g/d", H5T_IEEE_F64LE, 2, dims2, H5T_NATIVE_DOUBLE, d6, H5P_DEFAULT);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, chunk);
    put(f, "/c", H5T_IEEE_F32LE, 1, dims1, H5T_NATIVE_FLOAT, f8, dcpl);
    H5Pclose(dcpl);
    put(f, "/s", H5T_STD_U8LE, 0, NULL, H5T_NATIVE_UCHAR, &u1, H5P_DEFAULT);
    put(f, "/i", H5T_STD_I16BE, 1, dims4, H5T_NATIVE_SHORT, i4, H5P_DEFAULT);
    hid_t en = H5Tenum_create(H5T_NATIVE_SCHAR);
    signed char v0 = 0, v1 = 1, e4[4] = {0, 1, 1, 0};
    H5Tenum_insert(en, "FALSE", &v0);
    H5Tenum_insert(en, "TRUE", &v1);
    put(f, "/e", en, 1, dims4, en, e4, H5P_DEFAULT);
    H5Tclose(en);
    hid_t st = H5Tcopy(H5T_C_S1);
    H5Tset_size(st, 4);
    put(f, "/t", st, 1, dims1, st, "abcdefghijklmnopqrstuvwxyz012345", H5P_DEFAULT);
    H5Tclose(st);
    H5Fclose(f);
}
#endif

static char h5_path[96];

static void cleanup(void)
{
    unlink(h5_path);
    rmdir(dir);
}

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/cohort-fuzz-h5-%d", (int)getpid());
    snprintf(h5_path, sizeof h5_path, "%s/d.h5", dir);
    mkdir(dir, 0777);
    atexit(cleanup);
#ifdef HAVE_HDF5
    make_file(h5_path);
#endif
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) setup();
    if (size > 4096) return 0;
    char *spec = malloc(size + 1);
    if (!spec) return 0;
    memcpy(spec, data, size);
    spec[size] = 0;
    size_t len = strlen(spec), want = ref_file_len(spec);
    size_t flen = (size_t)-2;
    int is = ch_h5_is_dataset_spec(spec, &flen);
    if (is != (want != (size_t)-1) || (is && flen != want) || (!is && flen != (size_t)-2)) {
        fprintf(stderr, "ch_h5_is_dataset_spec('%s') = %d, file_len %zu; expected %zd\n", spec,
                is, flen, (ssize_t)want);
        abort();
    }
    if (!is || spec[0] == '/') { /* relative to dir only */
        free(spec);
        return 0;
    }
    char *p = malloc(strlen(dir) + len + 2);
    if (!p) abort();
    sprintf(p, "%s/%s", dir, spec);
    ch_array_desc_t desc;
    ch_h5_dataset_t *d = (ch_h5_dataset_t *)1;
    ch_status s = ch_h5_open(p, &desc, &d);
    /* (the directory in front may end FILE earlier: "x.h5:/a.h5:" alone has no path) */
    size_t pw = ref_file_len(p);
    int no_path = pw == (size_t)-1 || p[pw] != ':' || p[pw + 1] == 0;
    if (s != CH_OK) {
        if (d || !ch_error_message()[0] || (no_path && s != CH_ERR_INVALID)) {
            fprintf(stderr, "ch_h5_open('%s') = %d: %s\n", p, (int)s, ch_error_message());
            abort();
        }
        ch_error_clear();
    } else {
        if (no_path || !d) abort();
        if (desc.ndim < 0 || desc.ndim > CH_ARRAY_MAX_DIMS) abort();
        if ((int)desc.dtype < 0 || desc.dtype >= CH_DT_COUNT_) abort();
        int64_t n = 1;
        for (int i = 0; i < desc.ndim; i++) {
            if (desc.shape[i] < 0 || desc.shape[i] > 64) abort(); /* d.h5's are small */
            n *= desc.shape[i];
        }
        size_t isz = ch_array_dtype_size(desc.dtype);
        void *buf = malloc((size_t)n * isz + 1);
        if (!buf) abort();
        /* all at once, then element by element: the same bytes */
        if (ch_h5_read(d, 0, n, buf) != CH_OK) abort();
        unsigned char one[8];
        for (int64_t e = 0; e < n; e++)
            if (ch_h5_read(d, e, 1, one) != CH_OK || memcmp(one, (char *)buf + e * isz, isz)) abort();
        free(buf);
        ch_h5_close(d);
    }
    free(p);
    free(spec);
    return 0;
}
