/* cohort: atomic replacement of a file (write to a temporary, fsync, rename).
 *
 * Protocol (the usual POSIX recipe; see rename(2) and fsync(2)):
 *   open:   mkstemp("<dir>/.<name>.tmp.XXXXXX") in the directory of the
 *           target, so the rename below never crosses file systems; mode is
 *           0666 & ~umask like a file made by open(O_CREAT).
 *   write:  buffered writes (1 MiB buffer) to the temporary file.
 *   commit: flush the buffer, fsync the file, close it, rename it over the
 *           target, fsync the directory so the rename itself is durable.
 *   abort:  close and unlink the temporary file.
 * On any error in write or commit the temporary file is removed and the
 * target is left as it was: readers see either the old complete file or
 * the new complete file, never a mix. A writer killed by a signal (SIGKILL,
 * power loss) can leave a stale ".<name>.tmp.XXXXXX" beside the target (the
 * target itself is intact); ch_atomic_file_remove_stale deletes those.
 *
 * An object is used by one thread; messages name the target path.
 */
#ifndef COHORT_IO_ATOMIC_FILE_H
#define COHORT_IO_ATOMIC_FILE_H

#include "framework/core/status.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ch_atomic_file ch_atomic_file_t;

/* Start writing a replacement for path (which need not exist). The
 * directory must exist and be writable. Errors: CH_ERR_INVALID (empty path,
 * path naming a directory), CH_ERR_IO naming the directory/path and the
 * errno text (e.g. "Permission denied", "No such file or directory"),
 * CH_ERR_NOMEM. */
ch_status ch_atomic_file_open(const char *path, ch_atomic_file_t **out);

/* Append size bytes. On error (CH_ERR_IO naming the path and errno text,
 * e.g. "No space left on device") the temporary file has already been
 * removed and f freed: do not call commit/abort afterwards. */
ch_status ch_atomic_file_write(ch_atomic_file_t *f, const void *buf, size_t size);

/* Bytes appended so far. */
size_t ch_atomic_file_size(const ch_atomic_file_t *f);

/* The temporary file's path (for tests and messages). */
const char *ch_atomic_file_temp_path(const ch_atomic_file_t *f);

/* Flush, fsync, rename over the target, fsync the directory; frees f in all
 * cases. On error (CH_ERR_IO naming the path) the temporary file is removed
 * and the target is untouched (an error in the final directory fsync is
 * reported although the rename has happened). */
ch_status ch_atomic_file_commit(ch_atomic_file_t *f);

/* Give up: remove the temporary file, free f (NULL is a no-op). */
void ch_atomic_file_abort(ch_atomic_file_t *f);

/* Remove stale temporary files of path (".<name>.tmp.XXXXXX" in its
 * directory) left by killed writers. Only call it when no other process is
 * writing path. *removed (may be NULL) gets the number removed. Errors:
 * CH_ERR_IO when the directory cannot be read or a file not removed. */
ch_status ch_atomic_file_remove_stale(const char *path, int *removed);

/* Whole-file convenience: atomically replace path with size bytes of buf. */
ch_status ch_atomic_file_write_all(const char *path, const void *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_IO_ATOMIC_FILE_H */
