/* cohort: chunked reductions of N-d arrays (sum, mean, var, min, argmax,
 * histogram, ...) over the ranks of a job, reproducible for any number of
 * ranks.
 *
 * Three layers, usable on their own:
 *
 *   ch_reducer_t   the state of one reduction (numpy semantics) fed with
 *                  pieces of the array in any order: ch_reducer_feed takes
 *                  raw elements [e0, e0+n) of a segment in its storage order
 *                  (C or Fortran, either byte order). ch_reducer_end_pass
 *                  merges the partial states of all ranks (collective), and
 *                  ch_reducer_result gives the numpy-typed result.
 *   ch_array_source_t  where the elements come from (io/formats/array.h: a
 *                  callback that reads elements of a segment; io/formats/npy.h
 *                  makes them for .npy files, shards and raw binary).
 *   ch_reduce_run  the chunked pipeline over a source: each rank takes an
 *                  equal share of the elements (in storage order), reads it
 *                  in chunks of opt->chunk_bytes with a reader thread
 *                  opt->prefetch chunks ahead, feeds the reducer, and calls
 *                  the job's step hook after each chunk (collectively: every
 *                  rank makes the same number of steps).
 *
 * Numerics (mode):
 *   CH_REDUCE_EXACT  sums go into a ch_xsum_t superaccumulator per output
 *                  element (xsum.h): sum and mean are the exact sum of the
 *                  inputs rounded once to the result dtype (mean: the exact
 *                  sum divided by the count, rounded once), identical bits
 *                  for every world size, chunk size, memory order and file
 *                  layout. var/std: two passes; pass 2 sums (x - m)^2
 *                  exactly (TwoSum and FMA TwoProduct terms), with m the
 *                  correctly rounded float64 mean, then divides by
 *                  (count - ddof) with one rounding (std = sqrt of that).
 *   CH_REDUCE_FAST   float64 accumulators (SIMD over the output elements,
 *                  8 partial sums along a contiguous reduced run). Error of
 *                  a sum of n terms: |err| <= (n - 1) u sum|x_i|, u = 2^-53
 *                  (Higham, Accuracy and Stability, eq. 4.4: recursive
 *                  summation), plus one rounding to the result dtype. Not
 *                  reproducible across world sizes or chunk sizes.
 *   Integer sums (sum, nansum of bool and int dtypes) are int64 / uint64
 *   with wrap-around, as numpy's, in both modes (exact and associative).
 *   min, max, argmin, argmax, count_nonzero and histogram are exact in both
 *   modes.
 *
 * Result dtypes (numpy 1.24 rules):
 *   sum, nansum               bool, int8..int64 -> int64; uint8..64 -> uint64;
 *                             float16/32/64 -> same
 *   mean, var, std, nan*      bool, ints -> float64; floats -> same
 *   min, max, nanmin, nanmax  same as the input
 *   argmin, argmax, count_nonzero, histogram counts   int64
 * NaN rules (numpy): sum/mean/var/min/max propagate NaN; argmin/argmax
 * give the index of the first NaN; the nan-variants skip NaN (an all-NaN
 * slice gives NaN and a warning; nansum gives 0); count_nonzero counts NaN.
 * Empty reductions: sum 0, mean/var NaN with a warning; min/max/argmin/argmax
 * of an empty slice are errors (numpy raises ValueError).
 * histogram: the whole array (axis none); `bins` equal bins over `range`
 * (default: [min, max] of the data, [v-0.5, v+0.5] when they are equal;
 * non-finite data with no range is an error), half-open bins except the
 * last, closed; values outside the range are not counted; the edges are
 * numpy.linspace(lo, hi, bins + 1).
 */
#ifndef COHORT_REDUCE_H
#define COHORT_REDUCE_H

#include "framework/core/configuration.h"
#include "framework/core/status.h"
#include "framework/dist/dist.h"
#include "framework/reduce/xsum.h"
#include "io/formats/array.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CH_REDUCE_MAX_DIMS CH_ARRAY_MAX_DIMS


typedef enum {
    CH_ROP_SUM = 0, CH_ROP_MEAN, CH_ROP_VAR, CH_ROP_STD, CH_ROP_MIN, CH_ROP_MAX,
    CH_ROP_ARGMIN, CH_ROP_ARGMAX,
    CH_ROP_NANSUM, CH_ROP_NANMEAN, CH_ROP_NANVAR, CH_ROP_NANSTD, CH_ROP_NANMIN, CH_ROP_NANMAX,
    CH_ROP_COUNT_NONZERO, CH_ROP_HISTOGRAM,
    CH_ROP_COUNT_
} ch_reduce_kind;

/* "sum", "nanmean", "count_nonzero", ... ("?" if unknown), and back
 * (CH_ERR_INVALID listing the operations). */
const char *ch_reduce_kind_name(ch_reduce_kind k);
ch_status ch_reduce_kind_from_name(const char *name, ch_reduce_kind *out);

typedef enum { CH_REDUCE_EXACT = 0, CH_REDUCE_FAST = 1 } ch_reduce_mode;

typedef struct {
    ch_reduce_kind op;
    ch_reduce_mode mode;
    int naxes;                    /* -1: all axes (numpy axis=None) */
    int axes[CH_REDUCE_MAX_DIMS]; /* negative values count from the end */
    int keepdims;
    int64_t ddof;                 /* var/std: divisor count - ddof */
    int64_t bins;                 /* histogram: number of equal bins (>= 1) */
    int has_range;                /* histogram: range given */
    double range[2];
} ch_reduce_spec_t;

/* sum over all axes, exact, ddof 0, 10 bins, no range. */
void ch_reduce_spec_default(ch_reduce_spec_t *s);

/* Parse an axis text: "none" / "" (all axes), "0", "-1", "0,2" or "(0, 2)".
 * CH_ERR_INVALID naming the text. */
ch_status ch_reduce_parse_axes(const char *text, ch_reduce_spec_t *s);

typedef struct ch_reducer ch_reducer_t;

/* A reducer for the array `in` (its global shape; dtype; byteswap and order
 * of `in` are not used: each feed names its segment's). Checks (numpy's
 * errors): an axis out of range ("axis 2 is out of bounds for array of
 * dimension 2", CH_ERR_RANGE), a repeated axis, argmin/argmax with several
 * axes, histogram with an axis, min/max/argmin/argmax of an empty slice,
 * bins < 1, a bad range (CH_ERR_INVALID). Memory: per output element, 560 B
 * (exact sums) or 8-24 B; CH_ERR_NOMEM. */
ch_status ch_reducer_create(const ch_reduce_spec_t *spec, const ch_array_desc_t *in,
                            ch_reducer_t **out);
void ch_reducer_destroy(ch_reducer_t *r);

/* Passes over the data this reduction needs (1, or 2 for var/std/nanvar/
 * nanstd and histogram without a range). */
int ch_reducer_passes(const ch_reducer_t *r);
/* The pass the next feed belongs to (0-based; == passes when done). */
int ch_reducer_pass(const ch_reducer_t *r);

/* Feed elements [e0, e0 + n) (in seg's storage order) of a segment: an
 * array with the same dtype and trailing shape as the reducer's input and
 * seg->shape[0] rows starting at row row0 of axis 0 (a shard). raw holds
 * the n elements as stored (seg->byteswap says the byte order). Any order
 * of feeds gives the same exact-mode result. CH_ERR_INVALID for a segment
 * that does not fit. */
ch_status ch_reducer_feed(ch_reducer_t *r, const ch_array_desc_t *seg, int64_t row0, int64_t e0,
                          int64_t n, const void *raw);

/* End the current pass: merge the partial states of every rank of pg
 * (collective; pg NULL: this process holds everything) and prepare the
 * next pass (var: the means; histogram: the range). After the last pass
 * the result is ready. CH_ERR_INVALID for non-finite data where histogram
 * must find its range; CH_ERR_MPI. */
ch_status ch_reducer_end_pass(ch_reducer_t *r, ch_pg_t *pg);

/* The result (after the last pass): dtype, shape (keepdims applied;
 * ndim 0 for a scalar), C order, this host's byte order, and the data
 * (valid until destroy). For histogram also the bins + 1 float64 edges
 * (NULL otherwise). warnings: numpy's RuntimeWarnings ("Mean of empty
 * slice", "All-NaN slice encountered", "Degrees of freedom <= 0 for
 * slice"), "" if none. CH_ERR_INVALID before the last pass. */
ch_status ch_reducer_result(ch_reducer_t *r, ch_array_desc_t *desc, const void **data,
                            const double **edges, const char **warnings);

/* Partial state for checkpoints: the bytes of the current pass's state and
 * the things it depends on (means of pass 1, the histogram range), so that
 * a reducer created with the same spec and input and then loaded continues
 * to the identical result. ch_reducer_state_size gives the byte count;
 * save writes exactly that many; load checks them (CH_ERR_FORMAT naming what
 * differs: a state of another operation, shape or pass layout). */
size_t ch_reducer_state_size(const ch_reducer_t *r);
void ch_reducer_state_save(const ch_reducer_t *r, void *buf);
ch_status ch_reducer_state_load(ch_reducer_t *r, const void *buf, size_t size);

/* ------------------------------------------------------------ sources */


/* What a step hook sees after each chunk. */
typedef struct {
    int pass, passes;
    int64_t step, steps;        /* completed step (0-based) of this pass */
    int64_t bytes_done;         /* this rank, this pass, so far */
    int64_t bytes_total;        /* this rank, this pass */
    double read_wait_s;         /* seconds the compute thread waited for data */
    double compute_s;           /* seconds in ch_reducer_feed */
    double combine_s;           /* seconds merging ranks (ch_reducer_end_pass), all passes */
    int64_t mapped;             /* totals only: pieces memory-mapped (not read), all passes */
} ch_reduce_step_t;

typedef struct {
    int64_t chunk_bytes; /* read size (rounded down to whole elements, >= 1) */
    int prefetch;        /* chunks read ahead by the reader thread, 1..8 */
    int start_pass;      /* resume: first pass and step to run (0, 0) */
    int64_t start_step;
    int64_t sync_bytes;  /* the ranks agree (errors, the hook) every
                            max(1, sync_bytes / chunk_bytes) steps and at the
                            end of a pass */
    double sync_seconds; /* > 0: also about every this many seconds: rank 0
                            times the steps and broadcasts the number of
                            steps to the next agreement (at most the
                            sync_bytes interval; the first after one step).
                            Where the agreements fall changes no result
                            bit. 0: by sync_bytes only */
    /* Called on every rank at every agreement point (same steps on all ranks);
     * return nonzero on every rank to stop (ch_reduce_run then returns with
     * *stopped = 1, the reducer holding everything up to this step: resume
     * at (st->pass, st->step + 1)). At the last step of the last pass the
     * work is done and a nonzero return is ignored: the run finishes with
     * *stopped = 0 and the result ready. NULL: never stop. */
    int (*step_hook)(void *arg, const ch_reduce_step_t *st);
    void *arg;
    ch_reduce_step_t *totals; /* if not NULL: the seconds of all passes at the end */
    int mmap;            /* 1 (default): pieces are memory-mapped where the
                            source can (src->map: .npy and raw files), so the
                            feed reads the page cache with no copy; the
                            reader thread maps prefetch pieces ahead and each
                            is unmapped when fed. A piece that cannot be
                            mapped is read. 0: always src->read. The same
                            pieces either way: the same bits */
} ch_reduce_run_options_t;

/* 16 MiB chunks (measured here: faster than 64 MiB, whose buffers stream
 * through memory between the read and the sum, and than 4 MiB, too few rows
 * per exact-sum block; docs/PERFORMANCE.md), 2 ahead, agree every 256 MiB
 * and about every second, start at the beginning, no hook, chunks
 * memory-mapped where the source can. */
void ch_reduce_run_options_default(ch_reduce_run_options_t *o);

/* The chunked, multi-rank reduction of src into r (collective over pg, or
 * pg NULL for one process). Each pass: every rank reads its share
 * (elements [r E / W, (r+1) E / W) of the segments' storage order), feeds
 * r, then ch_reducer_end_pass. Resident memory: (prefetch + 1) chunks
 * (buffers, or with opt->mmap the mapped pages of the pieces in flight)
 * plus the reducer state. Errors: the source's read errors (on the
 * rank that read; every rank then fails with CH_ERR_REMOTE naming it), the
 * reducer's, CH_ERR_NOMEM. */
ch_status ch_reduce_run(ch_reducer_t *r, const ch_array_source_t *src, ch_pg_t *pg,
                        const ch_reduce_run_options_t *opt, int *stopped);

/* Per-channel statistics for data normalisation (cohort-train's
 * data.mean = auto / data.std = auto): for each index c of axis
 * channel_axis (negative counts from the end), the mean and the std (ddof 0,
 * exact mode, numpy's x.mean(axes) / x.std(axes) over every other axis) of
 * src, across the ranks of pg (collective; three passes over the data).
 * mean and std get shape[channel_axis] values, rounded to the input's
 * float dtype (float64 for integer inputs: uint8 images give float64).
 * CH_ERR_RANGE for a bad axis, CH_ERR_INVALID for a 1-d source. */
ch_status ch_reduce_channel_stats(const ch_array_source_t *src, int channel_axis, ch_pg_t *pg,
                                  double *mean, double *std);

/* The reduction's config keys (a job lists them as its "reduce" table;
 * --help groups them under "reduce"): reduce.op, axis, keepdims, ddof,
 * mode, bins, range, chunk_mb, prefetch, sync_mb, checkpoint_seconds,
 * sync_seconds, mmap. */
ch_config_table_t ch_reduce_config_table(void);

/* Options from those keys (PETSc's set-from-options): *spec and *run get
 * their defaults, then the keys' values (op, axes, keepdims, ddof, mode,
 * bins, range; chunk and sync sizes in bytes = MiB * 2^20, prefetch,
 * sync_seconds, mmap);
 * *checkpoint_seconds = reduce.checkpoint_seconds (0: only on preemption).
 * cfg must have been loaded with ch_reduce_config_table among its tables.
 * Errors: CH_ERR_CONFIG/INVALID naming the key and value. */
ch_status ch_reduce_options_from_config(const ch_config_t *cfg, ch_reduce_spec_t *spec,
                                        ch_reduce_run_options_t *run, double *checkpoint_seconds);

/* Collective checkpoint clock: 1 on every rank when `seconds` (> 0) have
 * passed on rank 0 since *last (rank 0's ch_time_now() value, updated
 * then), else 0. One broadcast; none when seconds <= 0 (then 0: seconds
 * must be the same on every rank). */
int ch_reduce_checkpoint_due(ch_pg_t *pg, double *last, double seconds);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_REDUCE_H */
