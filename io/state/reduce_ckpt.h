/* cohort: checkpoint files of a chunked reduction (cohort-reduce --resume).
 *
 * One file per rank, "<dir>/rank-<R>.state", written atomically
 * (io/state/atomic_file.h): a small header (magic "CHRDCK01", world size, rank,
 * chunk size in elements, the pass and step to resume at) followed by the
 * reducer's state (ch_reducer_state_save). Every rank saves at the same
 * step (the caller agrees on when), so the files of one run always match.
 */
#ifndef COHORT_IO_REDUCE_CKPT_H
#define COHORT_IO_REDUCE_CKPT_H

#include "framework/core/status.h"
#include "framework/reduce/reduce.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int32_t world, rank;
    int64_t chunk_elems; /* the chunking the step numbers refer to */
    int32_t pass;        /* resume at (pass, step) */
    int64_t step;
} ch_reduce_ckpt_t;

/* "<dir>/rank-<R>.state" into buf (cap bytes). */
void ch_reduce_ckpt_path(const char *dir, int rank, char *buf, size_t cap);

/* Save r's state with the cursor *c to <dir>/rank-<c->rank>.state (the
 * directory is created when missing). CH_ERR_IO naming the path. */
ch_status ch_reduce_ckpt_save(const char *dir, const ch_reducer_t *r, const ch_reduce_ckpt_t *c);

/* Load this rank's file into r and *c. Checks that it was written with
 * the same world size and chunking as `expect` (CH_ERR_FORMAT naming the
 * file and both values) and that the state fits r (ch_reducer_state_load).
 * CH_ERR_IO when the file is missing or unreadable. */
ch_status ch_reduce_ckpt_load(const char *dir, ch_reducer_t *r, const ch_reduce_ckpt_t *expect,
                              ch_reduce_ckpt_t *c);

/* Remove this rank's file (after a finished run); a missing file is fine.
 * The directory stays (rank 0 removes it once every rank is done). */
void ch_reduce_ckpt_remove(const char *dir, int rank);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_IO_REDUCE_CKPT_H */
