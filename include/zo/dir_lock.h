/* zoffload: a directory held by one process at a time.
 *
 * A run that writes into a directory (zo-train's --save) locks it first, so
 * that a second run given the same directory refuses instead of mixing its
 * files with the first's. The lock is an exclusive flock on DIR/.zoffload.lock,
 * which records the holder's pid and host; the kernel drops it when the
 * holder exits, however it exits, so a crashed run never leaves the
 * directory locked. The file itself stays (removing it would race a process
 * about to lock it). The swap store locks its swap files the same way
 * (the same code). */
#ifndef ZO_DIR_LOCK_H
#define ZO_DIR_LOCK_H

#include "zo/api.h"
#include "zo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ZO_DIR_LOCK_FILE ".zoffload.lock"

typedef struct zo_dir_lock *zo_dir_lock_t;

/* Lock dir (which must exist) for this process. Held by another process:
 * ZO_ERR_EXISTS, the message naming its pid and host and `what` (the
 * directory's role for the user: "save directory"). */
ZO_API zo_status zo_dir_lock(zo_dir_lock_t *out, const char *dir, const char *what);

/* Release the lock. Accepts NULL. */
ZO_API void zo_dir_unlock(zo_dir_lock_t l);

#ifdef __cplusplus
}
#endif
#endif
