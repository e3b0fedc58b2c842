/* cohort: N-d arrays as stored in files, and the sources that read them.
 *
 * The description of an array (numpy dtype, byte order, memory order,
 * shape) and a source of its elements (segments stacked along axis 0, read
 * through a callback). io/formats/npy.h makes sources for .npy files,
 * shards of them and raw binaries, io/formats/h5.h for HDF5 datasets;
 * framework/reduce reduces any source. Types only need the core layer, so
 * readers of array files do not depend on the engines that use them.
 */
#ifndef COHORT_IO_FORMATS_ARRAY_H
#define COHORT_IO_FORMATS_ARRAY_H

#include "framework/core/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Most dimensions of an array (numpy 1.x allows 32). */
#define CH_ARRAY_MAX_DIMS 32

/* Element types (numpy names). */
typedef enum {
    CH_DT_BOOL = 0,
    CH_DT_INT8, CH_DT_INT16, CH_DT_INT32, CH_DT_INT64,
    CH_DT_UINT8, CH_DT_UINT16, CH_DT_UINT32, CH_DT_UINT64,
    CH_DT_FLOAT16, CH_DT_FLOAT32, CH_DT_FLOAT64,
    CH_DT_COUNT_
} ch_array_dtype;

/* Bytes per element (0 for an unknown dtype); inline: the reducer's
 * kernels ask per element. */
static inline size_t ch_array_dtype_size(ch_array_dtype dt)
{
    /* in the enum's order (no designated initializers: C++ includes this) */
    static const unsigned char size[CH_DT_COUNT_] = {
        1,          /* bool */
        1, 2, 4, 8, /* int8 .. int64 */
        1, 2, 4, 8, /* uint8 .. uint64 */
        2, 4, 8,    /* float16, float32, float64 */
    };
    return (unsigned)dt < CH_DT_COUNT_ ? size[dt] : 0;
}
/* The numpy name ("float32"; "?" for an unknown dtype). */
const char *ch_array_dtype_name(ch_array_dtype dt);
/* From a numpy name ("float32", "f4", "int64", "bool", ...). CH_ERR_INVALID
 * naming the text and the accepted names. */
ch_status ch_array_dtype_from_name(const char *name, ch_array_dtype *out);

/* float16 <-> float64 (IEEE binary16; the conversion to half rounds to
 * nearest even). */
double ch_half_to_double(uint16_t h);
uint16_t ch_double_to_half(double x);

/* An N-d array as stored: dtype, byte order, memory order, shape. */
typedef struct {
    ch_array_dtype dtype;
    int byteswap; /* 1: elements are in the other byte order than this host's */
    int fortran;  /* 1: Fortran (column-major) order, else C order */
    int ndim;     /* 0 (a scalar) .. CH_ARRAY_MAX_DIMS */
    int64_t shape[CH_ARRAY_MAX_DIMS];
} ch_array_desc_t;

/* Number of elements (product of the shape; 1 for ndim 0). */
int64_t ch_array_desc_count(const ch_array_desc_t *d);

/* A mapped range of a source (ch_array_source_t.map): the elements at
 * data; base and len are the mapping's own (for unmap). */
typedef struct ch_array_view {
    const void *data;
    void *base;
    size_t len;
} ch_array_view_t;

/* A (possibly sharded) array: segments stacked along axis 0, each with its
 * own order and byte order. read() copies elements [e0, e0+n) of segment
 * seg (storage order) into dst (n * itemsize bytes); it may be called from a
 * reader thread (ch_reduce_run's), one call at a time. */
typedef struct {
    ch_array_desc_t desc;         /* the whole array (shape[0] = all rows) */
    int nseg;
    const ch_array_desc_t *seg;   /* nseg segment descriptions */
    const int64_t *seg_row0;      /* first row of each segment */
    ch_status (*read)(void *ctx, int seg, int64_t e0, int64_t n, void *dst);
    void *ctx;
    /* Optional zero-copy view (NULL: none; io/formats/npy.h gives one for
     * .npy and raw files): map elements [e0, e0+n) of segment seg (storage
     * order, the segment's byte order) so that view->data points at them,
     * aligned to the element size, until unmap(ctx, view). A nonzero
     * return means "not this range" (any code, no message kept): the
     * caller reads it with read() instead. Called like read(), from one
     * thread at a time; unmap may be called from another thread. */
    ch_status (*map)(void *ctx, int seg, int64_t e0, int64_t n, struct ch_array_view *view);
    void (*unmap)(void *ctx, struct ch_array_view *view);
    /* Optional (NULL: none): nseg names (file paths) for messages. */
    const char *const *seg_names;
} ch_array_source_t;

#ifdef __cplusplus
}
#endif

#endif
