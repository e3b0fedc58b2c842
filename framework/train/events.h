/* cohort: TensorBoard event files (scalars), written without TensorFlow.
 *
 * An event file is a sequence of TFRecords (tensorflow/core/lib/io/record_writer.cc):
 *   uint64  length of data, little-endian
 *   uint32  masked CRC32C of those 8 length bytes
 *   bytes   data: one serialized tensorflow.Event protobuf
 *   uint32  masked CRC32C of data
 * with masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (crc32c.h of
 * TensorFlow/LevelDB) and CRC32C the Castagnoli CRC (polynomial 0x1EDC6F41,
 * reflected 0x82F63B78, init and final xor 0xffffffff).
 *
 * The Event protobuf (tensorflow/core/util/event.proto) is encoded by hand:
 *   double wall_time = 1;  int64 step = 2;  string file_version = 3;
 *   Summary summary = 5;   Summary { repeated Value value = 1; }
 *   Value { string tag = 1; float simple_value = 2; }
 *   SessionLog session_log = 7;  SessionLog { SessionStatus status = 1; } START = 1
 * The first record holds file_version "brain.Event:2", as TensorFlow and
 * torch.utils.tensorboard write it; each scalar is one further Event.
 *
 * The file is named like tensorboard's own EventFileWriter names it:
 *   <logdir>/events.out.tfevents.<unix seconds, 10 digits>.<hostname>.<pid>.<n>
 * with n a per-process counter. TensorBoard (EventAccumulator, `tensorboard
 * --logdir`) reads these files; tests/golden/tensorboard_check.py checks that.
 */
#ifndef COHORT_FRAMEWORK_EVENTS_H
#define COHORT_FRAMEWORK_EVENTS_H

#include "framework/core/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ch_events ch_events_t;

/* CRC32C (Castagnoli) of data[0..size), continuing from crc (0 to start):
 * ch_crc32c(0, "123456789", 9) == 0xE3069283. Table driven. */
uint32_t ch_crc32c(uint32_t crc, const void *data, size_t size);

/* The masked form stored in TFRecords (see above). */
uint32_t ch_crc32c_mask(uint32_t crc);

/* Create logdir (and missing parents, mode 0777 & ~umask) and a new event
 * file in it holding the file_version record (flushed). Errors: CH_ERR_IO
 * naming the directory or file and the errno text; CH_ERR_NOMEM. */
ch_status ch_events_open(const char *logdir, ch_events_t **out);

/* Path of the event file. */
const char *ch_events_path(const ch_events_t *ev);

/* Append one scalar event: tag (non-empty UTF-8, e.g. "loss"), value, step
 * (the x axis, e.g. the epoch), wall_time in seconds since the Unix epoch
 * (< 0: now). Buffered: call ch_events_flush to make it visible. Errors:
 * CH_ERR_INVALID (empty tag), CH_ERR_IO naming the file. */
ch_status ch_events_add_scalar(ch_events_t *ev, const char *tag, float value, int64_t step,
                               double wall_time);

/* Append Event{step, session_log{status: START}}: the (re)start of a run
 * at step. TensorBoard (EventAccumulator, purge_orphaned_data) then drops
 * the events of earlier files of the directory with a step >= this step, as
 * after TensorFlow's own restarts: a resumed run that redoes epochs from
 * step replaces their points instead of duplicating them. wall_time as for
 * scalars. Errors: CH_ERR_IO naming the file. */
ch_status ch_events_add_session_start(ch_events_t *ev, int64_t step, double wall_time);

/* Write buffered events to the file (fflush): TensorBoard sees them. */
ch_status ch_events_flush(ch_events_t *ev);

/* Flush, fsync and close; frees ev in all cases (NULL is a no-op).
 * Errors: CH_ERR_IO naming the file. */
ch_status ch_events_destroy(ch_events_t *ev);

/* Seconds since the Unix epoch (CLOCK_REALTIME), the wall_time of events. */
double ch_events_now(void);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_FRAMEWORK_EVENTS_H */
