/* cohort: per-epoch training metrics as TensorBoard scalars plus a CSV twin.
 *
 * One ch_metrics_t writes, for every epoch logged:
 *   - one TensorBoard scalar per column (tag = column name, step = epoch)
 *     into a new event file in dir (framework/train/events.h);
 *   - one row of <dir>/<csv_name>:
 *       epoch,step,wall_time,<column 1>,<column 2>,...
 *     epoch and step (global optimizer step at the end of the epoch) as
 *     integers, wall_time in seconds since the Unix epoch (%.3f), values with
 *     9 significant digits (%.9g: float32 exact; "nan"/"inf" as printf
 *     writes them).
 * Both are flushed after each epoch, so a job killed later keeps them.
 * cohort-train's columns: loss, accuracy, learning_rate, images_per_sec.
 *
 * Resuming: opening with first_epoch = E keeps an existing CSV's rows of
 * epochs < E (same header required) and drops later rows and a torn last
 * line, so a resumed run continues the file without duplicates. A fresh run
 * (E = 0) starts the CSV anew. Event files are never rewritten: each run adds
 * one, which starts with a SessionLog START at step E, so TensorBoard (which
 * merges the files of a directory) drops the earlier runs' points of epochs
 * >= E the same way.
 *
 * Only rank 0 should create one. Not thread-safe.
 */
#ifndef COHORT_FRAMEWORK_METRICS_H
#define COHORT_FRAMEWORK_METRICS_H

#include "framework/core/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ch_metrics ch_metrics_t;

/* Most columns. */
#define CH_METRICS_MAX_COLUMNS 32

/* Open the metrics writers in dir (created if missing).
 * columns[0..ncolumns): names, non-empty, made of [A-Za-z0-9_./-] (so they
 *   are valid CSV fields and TensorBoard tags), 1 <= ncolumns <=
 *   CH_METRICS_MAX_COLUMNS, copied.
 * first_epoch: see "Resuming" above (>= 0).
 * Errors: CH_ERR_INVALID (bad columns), CH_ERR_IO naming dir or file,
 * CH_ERR_FORMAT when an existing CSV has another header or a malformed row
 * (message names file and line). */
ch_status ch_metrics_open(const char *dir, const char *csv_name,
                          const char *const *columns, size_t ncolumns, int64_t first_epoch, ch_metrics_t **out);

/* Log one epoch: values[0..ncolumns) in column order. Writes the scalars
 * and the CSV row, then flushes both. wall_time: seconds since the Unix
 * epoch (< 0: now). Errors: CH_ERR_IO naming the file. */
ch_status ch_metrics_log_epoch(ch_metrics_t *m, int64_t epoch, int64_t step, double wall_time,
                               const double *values);

/* Paths of the CSV file and of the event file. */
const char *ch_metrics_csv_path(const ch_metrics_t *m);
const char *ch_metrics_events_path(const ch_metrics_t *m);

/* Flush, close and free (NULL is a no-op). Errors: CH_ERR_IO. */
ch_status ch_metrics_destroy(ch_metrics_t *m);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_FRAMEWORK_METRICS_H */
