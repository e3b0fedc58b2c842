/* cohort: NumPy .npy files (format versions 1.0, 2.0, 3.0) and raw binary
 * arrays as array sources for the reducer (framework/reduce/reduce.h).
 *
 * Format (numpy/lib/format.py, NEP 1): the magic "\x93NUMPY", a major and a
 * minor version byte, the header length (uint16 little-endian for 1.0,
 * uint32 for 2.0 and 3.0; 3.0 allows UTF-8 in the header), then a Python
 * dict literal {'descr': '<f8', 'fortran_order': False, 'shape': (3, 4), }
 * padded with spaces and a newline, then the raw elements (C or Fortran
 * order, byte order from descr). Supported descr: b1, i1..i8, u1..u8,
 * f2, f4, f8 with '<', '>', '|' or '='. Object ('O'), structured (a list
 * descr), complex, string and datetime dtypes are refused.
 *
 * A source reads element ranges with pread(2) (any thread may read while
 * the others compute) and, for .npy and raw files (not HDF5 datasets),
 * also maps them (ch_array_source_t.map: mmap of the range's pages, no
 * copy; framework/reduce uses it unless reduce.mmap = false).
 */
#ifndef COHORT_IO_NPY_H
#define COHORT_IO_NPY_H

#include "framework/core/configuration.h"
#include "framework/core/status.h"
#include "io/formats/array.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    ch_array_desc_t desc; /* dtype, byteswap (vs this host), fortran, shape */
    int major, minor;     /* format version */
    int64_t data_offset;  /* bytes before the first element */
} ch_npy_header_t;

/* Parse the header of the .npy file at path and check the file size:
 * CH_ERR_IO (cannot open/read: names the file and errno text),
 * CH_ERR_FORMAT naming the file and what was expected (no magic, version
 * other than 1-3, a header cut short or not a dict with descr /
 * fortran_order / shape, a file shorter than the header says: "truncated",
 * or longer: "extra bytes"; a shape whose nonzero dims make more than
 * 2^63 - 1 bytes, as numpy's "array is too big", even with a zero dim),
 * CH_ERR_UNSUPPORTED for object, structured and other non-numeric dtypes. */
ch_status ch_npy_read_header(const char *path, ch_npy_header_t *out);

/* Write data (ch_array_desc_count(desc) elements of desc->dtype, this
 * host's byte order, C order unless desc->fortran) as a version 1.0 .npy
 * (2.0 when the header needs more than 65535 bytes), atomically
 * (io/state/atomic_file.h: a killed writer leaves no partial file). */
ch_status ch_npy_write(const char *path, const ch_array_desc_t *desc, const void *data);

/* An array source over files. */
typedef struct ch_file_source ch_file_source_t;

/* .npy files stacked along axis 0 (one file: the array itself). A path
 * with glob characters (*?[) expands to its matches in sorted order. A
 * path "FILE.h5:/path/to/dataset" (also .hdf5, .he5) is an HDF5 dataset
 * (io/formats/h5.h; not globbed), a segment like a .npy file, with ch_h5_open's
 * errors (CH_ERR_UNSUPPORTED in a build without HDF5).
 * Every file after the first must have the first's dtype, ndim and
 * trailing shape (CH_ERR_FORMAT naming both files and what differs; order
 * and byte order may differ). A 0-d file cannot be one of several shards.
 * Errors of ch_npy_read_header, CH_ERR_IO for a pattern with no match. */
ch_status ch_npy_source_open(const char *const *paths, int n, ch_file_source_t **out);

/* A raw binary file: ndim dims of shape, dtype, byte order (byteswap: 1
 * when the file's is not this host's), C or Fortran order, starting at
 * byte offset. CH_ERR_FORMAT when the file's size is not offset + the
 * array's bytes (naming both), or when the shape's nonzero dims make more
 * than 2^63 - 1 bytes. */
ch_status ch_raw_source_open(const char *path, const ch_array_desc_t *desc, int64_t offset,
                             ch_file_source_t **out);

/* The reducer's view (valid until destroy). */
const ch_array_source_t *ch_file_source_get(const ch_file_source_t *s);
/* Name of segment i ("FILE"), for messages. */
const char *ch_file_source_path(const ch_file_source_t *s, int i);
/* Whether every file of s is still as it was opened: the open file's
 * size and modification time (fstat, to the nanosecond) unchanged. A file
 * written in place during a run (the same inode) makes a result that
 * mixes old and new contents: CH_ERR_IO naming the first such file and
 * what changed. A file replaced by rename is not a change here (the open
 * descriptor still reads the old one, whole); HDF5 datasets are not
 * checked. */
ch_status ch_file_source_check_unchanged(const ch_file_source_t *s);
void ch_file_source_destroy(ch_file_source_t *s);

/* Config keys of an array input (a job lists them as its "input" table;
 * --help groups them under "input"): input.files, and for raw binary
 * input.dtype, shape, order, byteorder, offset. */
ch_config_table_t ch_file_source_config_table(void);

/* The source those keys describe (cfg loaded with
 * ch_file_source_config_table among its tables): .npy files/globs when
 * input.dtype is empty, else one raw file. Errors of the openers above,
 * CH_ERR_CONFIG for bad key values. */
ch_status ch_file_source_from_config(const ch_config_t *cfg, ch_file_source_t **out);

/* Parse a dims text "20000x20000", "3,4" or "(3, 4)" into shape. */
ch_status ch_npy_parse_shape(const char *text, int *ndim, int64_t *shape);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_IO_NPY_H */
