/* Where a fault drill attaches to zo_atomic_file (the tests' hooks in
 * testing/formats_testing.c set it). */
#ifndef ZO_ATOMIC_INTERNAL_H
#define ZO_ATOMIC_INTERNAL_H

/* 1 when the fsync about to run fails with EIO; NULL: none does. */
extern int (*zo_atomic_fsync_drill)(void);

#endif
