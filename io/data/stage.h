/* cohort: staging shards to node-local storage (data.stage).
 *
 * Before the first epoch, every node copies the shards named by a spec
 * (io/data/shards.h: a directory, a {A..B} pattern or one .tar) and their
 * index into DIR (e.g. $SLURM_TMPDIR, /dev/shm/$USER, a node-local NVMe),
 * once per node: the ranks on a node (MPI_COMM_TYPE_SHARED) share the
 * files, file j by local rank j mod (ranks on the node). Layout:
 * DIR/NAME-HASH/ holding the files under their own names, NAME the base name
 * of the shards' directory and HASH 8 hex digits of FNV-1a of its path
 * (two data sets never share a staging directory).
 *
 * Each copy is atomic (temp file + rename), keeps the source's mtime (so
 * the copied index stays valid: it checks sizes and mtimes), and is
 * verified: the CRC-32 of the bytes read from the source must equal the
 * CRC-32 of the copy read back; then a sidecar .FILE.crc32 records the
 * source's size, mtime and the CRC-32. A later job on the same node (a
 * requeue) reuses a copy whose sidecar matches the source's size and mtime
 * and whose bytes still have the recorded CRC-32 (read back again), and
 * copies the rest. Each process staging holds a shared lock (flock) on
 * DIR/NAME-HASH/.cohort-stage.lock while it uses the copies;
 * ch_shards_unstage removes them when no process of any job holds it. The
 * trainer does that when a run completes (not when it stops for preemption
 * or train.stop_after: a requeue reuses them) unless data.stage_keep
 * (docs/shards.md). */
#ifndef COHORT_IO_DATA_STAGE_H
#define COHORT_IO_DATA_STAGE_H

#include <stdint.h>

#include "framework/core/status.h"
#include "framework/dist/dist.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int64_t files;          /* files on this node's list (shards + index) */
    int64_t bytes_copied;   /* summed over all ranks of pg (every node's copies) */
    int64_t bytes_reused;   /* summed over all ranks: copies found valid */
    int64_t files_copied;   /* summed over all ranks */
    double seconds;         /* wall time of the stage, the slowest rank */
} ch_stage_stats_t;

/* Stage the shards named by spec into stage_dir (made if missing) and give
 * the spec that names the copies (*staged, malloc'd: pass it to
 * ch_dataset_shards_open). Collective over pg (NULL: this process alone,
 * one node). stats may be NULL. Errors (every rank fails together):
 * ch_shards_list's; CH_ERR_IO naming the file for a read, write, space or
 * mkdir failure; CH_ERR_FORMAT when a copy reads back with another CRC-32
 * than its source (naming both); CH_ERR_NOMEM. */
ch_status ch_shards_stage(const char *spec, const char *stage_dir, ch_pg_t *pg, char **staged,
                          ch_stage_stats_t *stats);

/* Remove the staged copies named by `staged` (the spec ch_shards_stage
 * returned): collective over pg (NULL: this process alone). Every rank
 * drops its shared lock; then the first rank of each node takes the lock
 * exclusively without waiting and, if it gets it, unlinks the files
 * staging wrote there (shard copies, the index, the .crc32 sidecars, temp
 * files) and the directory (left, with a line, when other files are in
 * it). A directory another job still uses (its lock held) is kept, with an
 * info line. *removed (may be NULL): copies removed over all nodes (the
 * sidecars not counted). Errors:
 * CH_ERR_MPI; failures to remove are logged, not errors. */
ch_status ch_shards_unstage(const char *staged, ch_pg_t *pg, int *removed);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_IO_DATA_STAGE_H */
