/* The update pipeline's schedule (see zo_swap_pipeline_run in zo/swap.h),
 * shared by the engine's NVMe update and the benchmarks that time it. */
#include <stdio.h>

#include "zo/swap.h"
#include "zo_internal.h"

typedef struct first_failure {
    zo_status st;
    char msg[1024];
} first_failure;

/* Keep the first failure and its message (later drains overwrite the
 * thread's last error). */
static void keep(first_failure *f, zo_status st)
{
    if (st >= 0 || f->st < 0)
        return;
    f->st = st;
    snprintf(f->msg, sizeof f->msg, "%s", zo_last_error());
}

zo_status zo_swap_pipeline_run(uint32_t n, unsigned stages, const zo_swap_pipeline_ops *ops,
                               void *user)
{
    if (!ops || !ops->read || !ops->update || !ops->drain || stages < 2)
        return ZO_FAIL(
            ZO_ERR_INVALID_ARG, "swap",
            "zo_swap_pipeline_run: needs read, update and drain callbacks and at least 2 stages "
            "(got %u)",
            stages);
    first_failure f = {ZO_OK, ""};
    const uint32_t ahead = stages - 1;
    for (uint32_t i = 0; i < ahead && i < n && f.st == ZO_OK; i++)
        keep(&f, ops->read(user, i, i % stages));
    for (uint32_t i = 0; i < n && f.st == ZO_OK; i++) {
        keep(&f, ops->update(user, i, i % stages));
        if (f.st < 0 || i + ahead >= n)
            continue;
        unsigned s = (i + ahead) % stages; /* item i - 1's stage: its writes must land first */
        keep(&f, ops->drain(user, s));
        if (f.st == ZO_OK)
            keep(&f, ops->read(user, i + ahead, s));
    }
    for (unsigned s = 0; s < stages; s++)
        keep(&f, ops->drain(user, s));
    if (f.st < 0)
        zo_restore_error(f.st, f.msg);
    return f.st;
}
