/* Exclusive file locks that name their holder, shared by the swap store
 * (its swap files) and the directory locks (zo/dir_lock.h: zo-train's save
 * directories). Not installed. */
#ifndef ZO_FLOCK_H
#define ZO_FLOCK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Who holds a lock, as its holder recorded in the locked file. */
typedef struct zo_lock_owner {
    uint32_t pid;
    char host[64];
    uint64_t start; /* its start, in clock ticks after boot (/proc/PID/stat); 0: not recorded */
} zo_lock_owner;

/* This process as a lock holder (pid, gethostname). */
void zo_lock_owner_self(zo_lock_owner *o);

/* 1 when o names a process of this host that no longer exists: no such
 * pid, a zombie, or (where o->start is recorded) a pid that a later process
 * took over after the holder died. */
int zo_lock_owner_gone(const zo_lock_owner *o);

/* Reads the holder recorded in the file open as fd; 0 when the file names
 * none (empty, or not the caller's format). */
typedef int (*zo_lock_owner_fn)(int fd, zo_lock_owner *o);

/* Take the exclusive flock of fd without blocking: 1 when held, 0 when
 * another process holds it. A process that died with an io_uring open
 * keeps its files, and their locks, until the kernel tears the ring down, a
 * moment after the exit: a lock whose recorded holder is gone is waited for
 * (up to 5 s). */
int zo_flock_take(int fd, zo_lock_owner_fn read_owner);

#ifdef __cplusplus
}
#endif
#endif
