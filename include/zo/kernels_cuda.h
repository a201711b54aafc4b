/* zoffload: CUDA kernels callable from C, queued on a cuda-backend stream
 * (a cpu-backend stream fails with ZO_ERR_INVALID_ARG). They take the
 * library's zo_stream_t, not a cudaStream_t, so a caller needs neither the
 * CUDA headers nor a cast from zo_stream_native. Only present in builds with
 * CUDA (zo_device_cuda_built()). */
#ifndef ZO_KERNELS_CUDA_H
#define ZO_KERNELS_CUDA_H

#include <stddef.h>

#include "zo/api.h"
#include "zo/device.h"
#include "zo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

ZO_API zo_status zo_cuda_fill_f32(zo_stream_t s, float *dst, float value, size_t n);
/* y += a * x */
ZO_API zo_status zo_cuda_axpy_f32(zo_stream_t s, float *y, const float *x, float a, size_t n);

#ifdef __cplusplus
}
#endif
#endif
