/* NVTX ranges on CUDA builds (nvtx3 is header-only and ships with the CUDA
 * toolkit; it finds Nsight's injection library at run time), nothing
 * elsewhere. See zo/nvtx.h. */
#include "zo/nvtx.h"

#if defined(ZO_HAVE_CUDA) && defined(__has_include)
#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define ZO_NVTX_ENABLED 1
#endif
#endif

void zo_nvtx_push(const char *name)
{
#ifdef ZO_NVTX_ENABLED
    nvtxRangePushA(name);
#else
    (void)name;
#endif
}

void zo_nvtx_pop(void)
{
#ifdef ZO_NVTX_ENABLED
    nvtxRangePop();
#endif
}

int zo_nvtx_available(void)
{
#ifdef ZO_NVTX_ENABLED
    return 1;
#else
    return 0;
#endif
}
