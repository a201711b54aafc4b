/* zoffload: the file formats' hooks for tests and fault drills. Not
 * installed, and not in libzoffload: test programs get them from the
 * zo_formats_testing target (offload/formats/CMakeLists.txt). */
#ifndef ZO_FORMATS_TESTING_H
#define ZO_FORMATS_TESTING_H

#ifdef __cplusplus
extern "C" {
#endif

/* After `skip` more fsync calls of zo_atomic_file succeed, make the next
 * `count` fail with EIO (count 0 disarms). */
void zo_atomic_inject_fsync_faults(int skip, int count);

#ifdef __cplusplus
}
#endif
#endif
