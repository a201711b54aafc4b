/* Internal fault drills for zo_atomic_file (tests include this). */
#ifndef ZO_ATOMIC_INTERNAL_H
#define ZO_ATOMIC_INTERNAL_H

/* Make the next n fsync calls of zo_atomic_file fail with EIO. */
void zo_atomic_inject_fsync_faults(int n);

#endif
