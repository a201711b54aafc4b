/* The file formats' test hooks (zo/formats_testing.h): fsync failures
 * counted down, attached to zo_atomic_file's drill. */
#include "zo/formats_testing.h"
#include "zo_atomic_internal.h"

static _Atomic int fsync_skip, fsync_faults;

static int fsync_fails(void)
{
    if (fsync_faults <= 0)
        return 0;
    if (fsync_skip > 0) {
        fsync_skip--;
        return 0;
    }
    fsync_faults--;
    return 1;
}

void zo_atomic_inject_fsync_faults(int skip, int count)
{
    fsync_skip = skip;
    fsync_faults = count;
    zo_atomic_fsync_drill = fsync_fails;
}
