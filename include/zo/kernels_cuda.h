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
#include "zo/dtype.h"
#include "zo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

ZO_API zo_status zo_cuda_fill_f32(zo_stream_t s, float *dst, float value, size_t n);
/* y += a * x */
ZO_API zo_status zo_cuda_axpy_f32(zo_stream_t s, float *y, const float *x, float a, size_t n);

/* One Adam/AdamW step over n elements (zo_op_adam's kernel; call that, which
 * checks the arguments and makes these constants as zo_adam_step does).
 * Per element, in fp32, each operation rounded once (no contraction):
 *   g = grad * grad_scale; if (l2 != 0) g = fma(l2, w, g)
 *   m = fma(beta1, m, one_minus_beta1 * g); v = fma(beta2, v, (one_minus_beta2 * g) * g)
 *   w = fma(-step_size, m / fma(sqrt(v), inv_sqrt_bc2, eps), w * decay)
 * m and v are fp32 or bf16 (state_type), out bf16, fp16, fp32 or none. */
typedef struct zo_cuda_adam_args {
    size_t n;
    const void *grad;
    zo_dtype grad_type;
    float *master;
    void *m, *v;
    zo_dtype state_type;
    void *out;
    zo_dtype out_type;
    float beta1, beta2, one_minus_beta1, one_minus_beta2;
    float step_size, inv_sqrt_bc2, eps, decay, l2, grad_scale;
} zo_cuda_adam_args;

ZO_API zo_status zo_cuda_adam(zo_stream_t s, const zo_cuda_adam_args *a);

#ifdef __cplusplus
}
#endif
#endif
