/* zoffload: named ranges for NVIDIA Nsight Systems (NVTX), so that a
 * profile of a CUDA run shows the training steps, the layers and the
 * engine's phases beside the kernels and copies. In builds without CUDA
 * these do nothing. Ranges belong to the calling thread: push and pop on the
 * same one. */
#ifndef ZO_NVTX_H
#define ZO_NVTX_H

#include "zo/api.h"

#ifdef __cplusplus
extern "C" {
#endif

ZO_API void zo_nvtx_push(const char *name);
ZO_API void zo_nvtx_pop(void);
/* 1 when the library was built with NVTX (CUDA), else 0. */
ZO_API int zo_nvtx_available(void);

#ifdef __cplusplus
}
#endif
#endif
