/* The engine's test hook (zo/engine_testing.h): NVMe faults handed to an
 * engine before finalize, armed by its tiers when they open the swap stores.
 * In the zo_engine_testing target, which only test programs link. */
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "zo/engine_testing.h"

zo_status zo_engine_set_swap_faults(zo_engine_t e, const zo_swap_fault *faults, size_t n)
{
    if (!e || (n && !faults))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "NULL argument");
    if (e->finalized)
        return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS, "swap faults: the engine is already finalized");
    zo_swap_fault *copy = n ? malloc(n * sizeof *copy) : NULL;
    if (n && !copy)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "copying %zu swap faults", n);
    if (n)
        memcpy(copy, faults, n * sizeof *copy);
    free(e->own.faults);
    e->own.faults = copy;
    e->own.n_faults = n;
    return ZO_OK;
}
