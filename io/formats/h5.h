/* cohort: HDF5 datasets as array segments for the reducer's file sources
 * (io/formats/npy.h: an input "FILE.h5:/path/to/dataset" among the .npy shards).
 *
 * Through the HDF5 library (serial HDF5, Debian's libhdf5-dev; parallel
 * HDF5 / MPI-IO is not used: each rank opens the file read-only and reads
 * its own element ranges). Dataset types: HDF5 integer classes of 1, 2, 4
 * and 8 bytes (signed or not) and IEEE floats of 4 and 8 bytes, in either
 * byte order (HDF5 converts to this host's); compound, string, enum (h5py's
 * bool), array, opaque, reference, time, bitfield and other float sizes are
 * refused. Elements are read in C order (HDF5 stores row-major), a flat
 * element range [e0, e0+n) as a union of hyperslabs (H5Sselect_hyperslab,
 * H5Dread into the caller's buffer). Built without HDF5 (configure's
 * summary line "HDF5 (serial) no"), every open is CH_ERR_UNSUPPORTED.
 */
#ifndef COHORT_IO_H5_H
#define COHORT_IO_H5_H

#include "framework/core/status.h"
#include "io/formats/array.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when arg names an HDF5 dataset: "FILE:/PATH" with FILE ending in .h5,
 * .hdf5 or .he5 (case-insensitive), or such a FILE alone (which ch_h5_open
 * then refuses: the dataset path is missing); *file_len then gets
 * strlen(FILE). 0 otherwise (a .npy or raw file name). */
int ch_h5_is_dataset_spec(const char *arg, size_t *file_len);

typedef struct ch_h5_dataset ch_h5_dataset_t;

/* Open the dataset named by spec ("FILE.h5:/path") read-only and describe
 * it in *desc (dtype, ndim, shape; C order, byteswap 0). Errors:
 * CH_ERR_IO for a file that cannot be opened (names the file and errno
 * text), CH_ERR_FORMAT for a file that is not HDF5 or a path that is not a
 * dataset in it (names both), CH_ERR_INVALID for a spec without a
 * dataset path, CH_ERR_UNSUPPORTED for a dataset type above
 * that is refused (names file, path and the HDF5 type class and size) or a
 * build without HDF5, CH_ERR_RANGE for more than CH_ARRAY_MAX_DIMS dims. */
ch_status ch_h5_open(const char *spec, ch_array_desc_t *desc, ch_h5_dataset_t **out);

/* Copy elements [e0, e0+n) of the dataset (C order) into dst
 * (n * itemsize bytes, this host's byte order). CH_ERR_IO naming the file,
 * path and range when HDF5 fails (a file cut short, a filter missing). */
ch_status ch_h5_read(ch_h5_dataset_t *d, int64_t e0, int64_t n, void *dst);

void ch_h5_close(ch_h5_dataset_t *d);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_IO_H5_H */
