// zo_op_adam's kernel on cuda (optim/adam_op.c checks the arguments and makes
// the constants): the per-element update of optim/adam_scalar_elem.h
// (zs_adam_math), operation for operation, each one rounded to nearest with
// an explicit intrinsic so nvcc cannot contract or reorder it, and the 16-bit
// loads and stores through zo/half.h's own conversions. The cpu device's
// zo_adam_step and this kernel therefore give the same bits
// (tests/kernels/test_ops_cuda.c, test_adam_op).
#include <cuda_runtime.h>
#include <string.h>

#include "zo/half.h"
#include "zo/kernels_cuda.h"
#include "zo_cuda_check.h"

namespace
{

__device__ __forceinline__ float load_elem(const void *base, zo_dtype t, size_t i)
{
    if (t == ZO_DTYPE_F16)
        return zo_f16_to_f32(((const uint16_t *)base)[i]);
    if (t == ZO_DTYPE_BF16)
        return zo_bf16_to_f32(((const uint16_t *)base)[i]);
    return ((const float *)base)[i];
}

__device__ __forceinline__ void store_elem(void *base, zo_dtype t, size_t i, float x)
{
    if (t == ZO_DTYPE_F16)
        ((uint16_t *)base)[i] = zo_f32_to_f16(x);
    else if (t == ZO_DTYPE_BF16)
        ((uint16_t *)base)[i] = zo_f32_to_bf16(x);
    else if (t == ZO_DTYPE_F32)
        ((float *)base)[i] = x;
}

__global__ void adam_kernel(zo_cuda_adam_args a)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride) {
        float p = a.master[i];
        float g = __fmul_rn(load_elem(a.grad, a.grad_type, i), a.grad_scale);
        if (a.l2 != 0.0f)
            g = __fmaf_rn(a.l2, p, g);
        float m0 = load_elem(a.m, a.state_type, i), v0 = load_elem(a.v, a.state_type, i);
        float m = __fmaf_rn(a.beta1, m0, __fmul_rn(a.one_minus_beta1, g));
        float v = __fmaf_rn(a.beta2, v0, __fmul_rn(__fmul_rn(a.one_minus_beta2, g), g));
        float denom = __fmaf_rn(__fsqrt_rn(v), a.inv_sqrt_bc2, a.eps);
        p = __fmaf_rn(-a.step_size, __fdiv_rn(m, denom), __fmul_rn(p, a.decay));
        a.master[i] = p;
        store_elem(a.m, a.state_type, i, m);
        store_elem(a.v, a.state_type, i, v);
        if (a.out)
            store_elem(a.out, a.out_type, i, p);
    }
}

} // namespace

extern "C" zo_status zo_cuda_adam(zo_stream_t s, const zo_cuda_adam_args *a)
{
    if (!a)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "cuda", "zo_cuda_adam: the arguments are NULL");
    /* By the backend, not the handle: a wrapped legacy default stream is NULL. */
    if (!s || strcmp(zo_device_backend(zo_stream_device(s)), "cuda") != 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "cuda",
                       "zo_cuda_adam: the stream is not a cuda-backend stream");
    cudaStream_t stream = (cudaStream_t)zo_stream_native(s);
    if (a->state_type != ZO_DTYPE_F32 && a->state_type != ZO_DTYPE_BF16)
        return ZO_FAIL(ZO_ERR_UNSUPPORTED, "cuda",
                       "zo_cuda_adam: moments of type %s; the kernel has fp32 and bf16",
                       zo_dtype_name(a->state_type));
    if (a->n == 0)
        return ZO_OK;
    const unsigned block = 256;
    size_t g = (a->n + block - 1) / block;
    unsigned grid = (unsigned)(g > 65535u * 8u ? 65535u * 8u : g);
    adam_kernel<<<grid, block, 0, stream>>>(*a);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}
