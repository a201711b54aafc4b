/* zoffload: crash-safe file replacement.
 *
 * A file is written under "<path>.tmp.<pid>", fsynced, renamed over <path>
 * and its directory fsynced, so that a crash at any moment leaves either the
 * old file or the complete new one under <path>, never a torn mix. Writes are
 * buffered (large ones go straight through), so a caller may stream a big
 * file in small pieces without holding it in memory.
 *
 * Errors name the file: ZO_ERR_NO_SPACE for ENOSPC/EDQUOT/EFBIG, ZO_ERR_IO
 * for EIO and other write/fsync failures, ZO_ERR_SYSTEM for open/rename
 * failures. After a failed write or commit the temporary file is removed by
 * zo_atomic_file_free and <path> is unchanged. */
#ifndef ZO_ATOMIC_FILE_H
#define ZO_ATOMIC_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "zo/api.h"
#include "zo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zo_atomic_file *zo_atomic_file_t;

/* Create "<path>.tmp.<pid>" (a stale one left by a crashed process with the
 * same pid is replaced) in path's directory, mode 0644. */
ZO_API zo_status zo_atomic_file_open(zo_atomic_file_t *out, const char *path);

/* Append n bytes. */
ZO_API zo_status zo_atomic_file_write(zo_atomic_file_t f, const void *data, size_t n);

/* Bytes appended so far. */
ZO_API uint64_t zo_atomic_file_size(zo_atomic_file_t f);

/* The temporary file's name (for messages and tests). */
ZO_API const char *zo_atomic_file_temp_path(zo_atomic_file_t f);

/* Flush, fsync, close, rename over the final path, fsync the directory.
 * Any later write fails with ZO_ERR_STATE. */
ZO_API zo_status zo_atomic_file_commit(zo_atomic_file_t f);

/* Close; an uncommitted file's temporary is unlinked. Accepts NULL. */
ZO_API void zo_atomic_file_free(zo_atomic_file_t f);

/* One call: write data to path atomically. */
ZO_API zo_status zo_atomic_write_file(const char *path, const void *data, size_t n);

/* fsync the directory holding path (after renames or creating files in it). */
ZO_API zo_status zo_fsync_parent_dir(const char *path);

#ifdef __cplusplus
}
#endif
#endif
