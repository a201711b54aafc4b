/* zoffload: CUDA kernels callable from C. `stream` is the native stream of a
 * cuda-backend zo_stream_t (zo_stream_native). Only present in builds with
 * CUDA (zo_device_cuda_built()). */
#ifndef ZO_KERNELS_CUDA_H
#define ZO_KERNELS_CUDA_H

#include <stddef.h>

#include "zo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

zo_status zo_cuda_fill_f32(void *stream, float *dst, float value, size_t n);
/* y += a * x */
zo_status zo_cuda_axpy_f32(void *stream, float *y, const float *x, float a, size_t n);

#ifdef __cplusplus
}
#endif
#endif
