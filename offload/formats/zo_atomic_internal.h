/* Internal fault drills for zo_atomic_file (tests include this). */
#ifndef ZO_ATOMIC_INTERNAL_H
#define ZO_ATOMIC_INTERNAL_H

/* After `skip` more fsync calls of zo_atomic_file succeed, make the next
 * `count` fail with EIO (count 0 disarms). */
void zo_atomic_inject_fsync_faults(int skip, int count);

#endif
