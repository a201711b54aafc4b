// Elementwise utility kernels on the CUDA backend, exposed to C.
#include <cuda_runtime.h>

#include "zo/kernels_cuda.h"
#include "zo_cuda_check.h"

namespace
{

__global__ void fill_f32_kernel(float *dst, float value, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = value;
}

__global__ void axpy_f32_kernel(float *y, const float *x, float a, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] += a * x[i];
}

unsigned grid_for(size_t n, unsigned block)
{
    size_t g = (n + block - 1) / block;
    return (unsigned)(g > 65535 * 8 ? 65535 * 8 : (g ? g : 1));
}

// The stream's cudaStream_t; a cpu-backend stream (no native handle) is refused.
zo_status native_of(zo_stream_t s, const char *op, cudaStream_t *out)
{
    *out = s ? (cudaStream_t)zo_stream_native(s) : NULL;
    if (!*out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "cuda", "%s: the stream is not a cuda-backend stream",
                       op);
    return ZO_OK;
}

} // namespace

extern "C" zo_status zo_cuda_fill_f32(zo_stream_t s, float *dst, float value, size_t n)
{
    cudaStream_t stream;
    ZO_TRY(native_of(s, "zo_cuda_fill_f32", &stream));
    if (n == 0)
        return ZO_OK;
    fill_f32_kernel<<<grid_for(n, 256), 256, 0, stream>>>(dst, value, n);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}

extern "C" zo_status zo_cuda_axpy_f32(zo_stream_t s, float *y, const float *x, float a, size_t n)
{
    cudaStream_t stream;
    ZO_TRY(native_of(s, "zo_cuda_axpy_f32", &stream));
    if (n == 0)
        return ZO_OK;
    axpy_f32_kernel<<<grid_for(n, 256), 256, 0, stream>>>(y, x, a, n);
    ZO_CUDA_CHECK_LAUNCH();
    return ZO_OK;
}
