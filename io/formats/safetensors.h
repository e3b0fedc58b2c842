/* cohort: state dicts in the safetensors format.
 *
 * File layout (https://github.com/huggingface/safetensors, "Format"):
 *
 *   8 bytes   N, unsigned little-endian: length of the header in bytes
 *   N bytes   header: a UTF-8 JSON object
 *               { "__metadata__": {"key": "value", ...},          (optional)
 *                 "<tensor name>": {"dtype": "F32",
 *                                   "shape": [d0, d1, ...],
 *                                   "data_offsets": [begin, end]}, ... }
 *             padded with spaces (0x20) so that 8 + N is a multiple of 8
 *   rest      the data area; tensor bytes are at [begin, end) relative to
 *             the start of the data area, C-contiguous (row-major),
 *             little-endian.
 *
 * cohort reads and writes the two dtypes of a PyTorch state dict: "F32"
 * (parameters, running_mean/var, momentum buffers) and "I64" (BatchNorm's
 * num_batches_tracked, a 0-dim tensor: "shape": []). Any other dtype is an
 * error that names the tensor and the dtype.
 *
 * The reader validates like the reference implementation (safetensors'
 * Rust crate, Metadata::validate) and a little more: header length >= 2,
 * <= the file size - 8 and <= 100,000,000 bytes; the JSON is well formed
 * and an object; no key appears twice (JSON_REJECT_DUPLICATES); each entry
 * has dtype (string), shape (array of at most CH_ST_MAX_DIMS non-negative
 * integers) and data_offsets (two non-negative integers, begin <= end);
 * shape product x dtype size == end - begin, computed with overflow checks;
 * the tensors, sorted by offset, cover the data area exactly (no overlap, no
 * hole, nothing after the last tensor); "__metadata__" is an object of
 * strings. Unknown extra fields inside a tensor entry are ignored (as the
 * reference does). Every error message starts with the file name (or the
 * label given for a memory buffer) and says what is wrong.
 *
 * The writer produces what safetensors' Python library (save_file) writes:
 * compact JSON, "__metadata__" first, each entry as dtype, shape,
 * data_offsets, the header padded with spaces to a multiple of 8 bytes.
 * Unlike save_file (which sorts by dtype, then name) it keeps the caller's
 * order, so a state dict is stored in state-dict order; readers do not care.
 *
 * This module works on ch_st_view_t, a plain description of one named
 * tensor, so it does not depend on cohort's tensor type; framework/nn
 * converts its state dict to and from arrays of views.
 */
#ifndef COHORT_IO_SAFETENSORS_H
#define COHORT_IO_SAFETENSORS_H

#include "framework/core/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Most dimensions of a tensor cohort reads or writes. */
#define CH_ST_MAX_DIMS 8
/* Largest header accepted (bytes), as the reference implementation. */
#define CH_ST_MAX_HEADER 100000000u

/* Element types. */
typedef enum {
    CH_ST_F32 = 0, /* "F32": IEEE float32, 4 bytes */
    CH_ST_I64 = 1, /* "I64": two's complement int64, 8 bytes */
} ch_st_dtype_t;

/* One named tensor: where its bytes are and what they mean.
 * data: nbytes bytes, C-contiguous, little-endian. Views returned by the
 * reader point into the loaded file's buffer (valid until
 * ch_safetensors_destroy); that data is NOT necessarily aligned to the element
 * size (files written by other tools need not align it): copy it with
 * memcpy or ch_safetensors_read_into before using it as float/int64_t. */
typedef struct {
    const char *name;               /* UTF-8, unique in a file, not "__metadata__" */
    ch_st_dtype_t dtype;
    int ndim;                       /* 0 (scalar) .. CH_ST_MAX_DIMS */
    int64_t shape[CH_ST_MAX_DIMS];  /* shape[0..ndim-1], each >= 0 */
    const void *data;
    size_t nbytes;                  /* = product(shape) * ch_st_dtype_size(dtype) */
} ch_st_view_t;

/* One "__metadata__" entry (both UTF-8 strings). */
typedef struct {
    const char *key;
    const char *value;
} ch_st_meta_t;

/* A loaded safetensors file (or memory buffer), validated. */
typedef struct ch_safetensors ch_safetensors_t;

/* Bytes per element of dtype (4 or 8); 0 for a value outside the enum. */
size_t ch_st_dtype_size(ch_st_dtype_t dtype);
/* "F32" / "I64" (the header spelling); "?" for a value outside the enum. */
const char *ch_st_dtype_name(ch_st_dtype_t dtype);

/* Number of elements of a view (product of its shape; 1 for ndim 0). */
int64_t ch_st_view_numel(const ch_st_view_t *v);

/* Open and validate the safetensors file at path. The file is mapped
 * read-only (mmap, MAP_PRIVATE): opening costs the header parse only, and
 * tensor pages are read from the page cache when used (a copy out of them,
 * e.g. ch_safetensors_read_into, is the only copy). Where mmap fails the
 * file is read into a 64-byte-aligned buffer instead; setting the
 * environment variable COHORT_SAFETENSORS_NO_MMAP=1 always reads (for file
 * systems where mapping is slow or unsafe). As with any mmap
 * reader (safetensors' own library maps files too), a file truncated by
 * another program WHILE it is open makes later accesses fault; cohort's
 * writers never change a file in place (they rename a new one over it), so
 * an open file stays valid while cohort rewrites the same path. A file that
 * is malformed or truncated when opened is an error, never a crash.
 * Errors: CH_ERR_IO (cannot open/read; message names the path and errno
 * text), CH_ERR_FORMAT (malformed: message names the path, the tensor if any
 * and what is wrong), CH_ERR_UNSUPPORTED (dtype other than F32/I64, or more
 * than CH_ST_MAX_DIMS dimensions: names tensor and dtype), CH_ERR_NOMEM. */
ch_status ch_safetensors_open(const char *path, ch_safetensors_t **out);

/* Same from a memory buffer holding a whole file. label names the buffer in
 * error messages (e.g. "<broadcast state dict>"). copy != 0: the buffer is
 * copied (the caller may free it at once); copy == 0: views point into buf,
 * which must stay valid and unchanged until ch_safetensors_destroy. */
ch_status ch_safetensors_from_memory(const void *buf,
                                     size_t size, const char *label, int copy, ch_safetensors_t **out);

/* Free everything (NULL is a no-op). Views and strings obtained from st
 * become invalid. */
void ch_safetensors_destroy(ch_safetensors_t *st);

/* The path or label given when opening. */
const char *ch_safetensors_source(const ch_safetensors_t *st);

/* Number of tensors. */
size_t ch_safetensors_count(const ch_safetensors_t *st);

/* The i-th tensor in file order (increasing data offset), i < count; NULL
 * when i is out of range. */
const ch_st_view_t *ch_safetensors_at(const ch_safetensors_t *st, size_t i);

/* The tensor called name, or NULL when the file has none (O(log n)). */
const ch_st_view_t *ch_safetensors_find(const ch_safetensors_t *st, const char *name);

/* Like find, but a missing tensor is an error (CH_ERR_INVALID naming the
 * file and the tensor). */
ch_status ch_safetensors_get(const ch_safetensors_t *st, const char *name,
                             const ch_st_view_t **out);

/* Copy the tensor called name into dst (nbytes bytes, any alignment) after
 * checking that it exists, has dtype and exactly the shape (ndim, shape);
 * a mismatch is CH_ERR_INVALID naming the file, the tensor, and both shapes
 * or dtypes. */
ch_status ch_safetensors_read_into(const ch_safetensors_t *st, const char *name,
                                   ch_st_dtype_t dtype, int ndim,
                                   const int64_t *shape, void *dst, size_t nbytes);

/* "__metadata__": number of entries, the i-th entry (in header order; NULL
 * out of range), and lookup by key (NULL when absent). */
size_t ch_safetensors_meta_count(const ch_safetensors_t *st);
const ch_st_meta_t *ch_safetensors_meta_at(const ch_safetensors_t *st, size_t i);
const char *ch_safetensors_meta_get(const ch_safetensors_t *st, const char *key);

/* Serialize views[0..n) (in that order) and meta[0..nmeta) (NULL/0 for
 * none: then no "__metadata__" is written) into a new malloc'd buffer
 * (*out, *size; free with free()). Checks each view: name non-empty, valid
 * UTF-8, unique, not "__metadata__"; dtype known; 0 <= ndim <=
 * CH_ST_MAX_DIMS; shape >= 0; nbytes == numel x dtype size; data non-NULL
 * when nbytes > 0; metadata keys unique. Errors: CH_ERR_INVALID naming the
 * tensor or key, CH_ERR_NOMEM. Host memory only. */
ch_status ch_safetensors_serialize(const ch_st_view_t *views, size_t n,
                                   const ch_st_meta_t *meta, size_t nmeta,
                                   void **out, size_t *size);

/* Write views/meta (same checks and layout as ch_safetensors_serialize) to
 * path atomically: a temporary file in the same directory is written,
 * fsync'ed and renamed over path, then the directory is fsync'ed
 * (io/state/atomic_file.h). On any error path is untouched, the temporary file is
 * removed, and the message names the path. Tensor data is streamed from the
 * views (no copy of the whole state dict is made). */
ch_status ch_safetensors_write(const char *path, const ch_st_view_t *views, size_t n,
                               const ch_st_meta_t *meta, size_t nmeta);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_IO_SAFETENSORS_H */
