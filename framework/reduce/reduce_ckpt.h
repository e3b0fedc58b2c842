/* cohort: checkpoint files of a chunked reduction (cohort-reduce --resume).
 *
 * One file per rank, "<dir>/rank-<R>.state", written atomically
 * (io/state/atomic_file.h): a small header (magic "CHRDCK02", world size,
 * rank, chunk size in elements, the pass and step to resume at, the length
 * of the identity text), the identity text (what the state belongs to:
 * ch_reduce_ckpt_identity) and the reducer's state (ch_reducer_state_save).
 * Every rank saves at the same step (the caller agrees on when), so the
 * files of one run always match. Files of the first format ("CHRDCK01",
 * no identity) are refused: nothing tells which input they belong to.
 */
#ifndef COHORT_IO_REDUCE_CKPT_H
#define COHORT_IO_REDUCE_CKPT_H

#include "framework/core/status.h"
#include "framework/reduce/reduce.h"
#include "io/formats/npy.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int32_t world, rank;
    int64_t chunk_elems; /* the chunking the step numbers refer to */
    int32_t pass;        /* resume at (pass, step) */
    int64_t step;
    const char *identity; /* what the state belongs to (ch_reduce_ckpt_identity);
                             NULL: "" (not checked on load) */
} ch_reduce_ckpt_t;

/* The identity of a reduction for its state files: "name: value" lines,
 * one per line, of the operation, axes (normalized: sorted, non-negative),
 * keepdims, ddof, mode, the histogram's bins and range, the array's dtype
 * and shape, and for every input its name (the absolute path; HDF5 inputs
 * with their ":/dataset"), size in bytes and modification time (UTC, ns).
 * A state is resumed only by a run whose identity is the same text.
 * *out is malloc'd (the caller frees it). CH_ERR_IO naming an input that
 * cannot be stat'ed, CH_ERR_NOMEM. */
ch_status ch_reduce_ckpt_identity(const ch_reduce_spec_t *spec, const ch_file_source_t *src,
                                  char **out);

/* "<dir>/rank-<R>.state" into buf (cap bytes). */
void ch_reduce_ckpt_path(const char *dir, int rank, char *buf, size_t cap);

/* Save r's state with the cursor and identity *c to <dir>/rank-<c->rank>.state
 * (the directory is created when missing). CH_ERR_IO naming the path. */
ch_status ch_reduce_ckpt_save(const char *dir, const ch_reducer_t *r, const ch_reduce_ckpt_t *c);

/* Load this rank's file into r and *c (c->identity is NULL afterwards).
 * Checks, each a CH_ERR_FORMAT naming the file and both values (saved and
 * now): the same world size and chunking as `expect`, the same identity
 * text (the first line that differs, "saved ... vs now ..."), and that
 * the state fits r (ch_reducer_state_load). A file of the first format
 * (no identity) is refused (CH_ERR_FORMAT: remove the state directory).
 * CH_ERR_IO when the file is missing or unreadable. */
ch_status ch_reduce_ckpt_load(const char *dir, ch_reducer_t *r, const ch_reduce_ckpt_t *expect,
                              ch_reduce_ckpt_t *c);

/* Before the work: can this rank's state file be saved in dir? When dir
 * exists it must be a directory where <dir>/rank-<R>.state can be written;
 * when not, its parent must be a writable directory (dir itself is made
 * at the first save). A temporary file is made and removed. CH_ERR_IO or
 * CH_ERR_INVALID naming the path ("No such file or directory", "not a
 * directory", ...). */
ch_status ch_reduce_ckpt_check_dir(const char *dir, int rank);

/* Remove this rank's file (after a finished run); a missing file is fine.
 * The directory stays (rank 0 removes it once every rank is done). */
void ch_reduce_ckpt_remove(const char *dir, int rank);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_IO_REDUCE_CKPT_H */
