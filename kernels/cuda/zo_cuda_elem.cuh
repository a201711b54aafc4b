// Element access shared by the cuda backend's kernels (ops_cuda.cu,
// flash_cuda.cu): a tensor element of a run-time dtype loaded as fp32 and
// stored rounded to nearest even, and a warp's sum in a fixed tree (the same
// bits every run).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "zo/dtype.h"

static __device__ __forceinline__ float zo_cuda_ld(const void *p, int dt, size_t i)
{
    if (dt == ZO_DTYPE_BF16)
        return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (dt == ZO_DTYPE_F16)
        return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}

static __device__ __forceinline__ void zo_cuda_st(void *p, int dt, size_t i, float v)
{
    if (dt == ZO_DTYPE_BF16)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else if (dt == ZO_DTYPE_F16)
        ((__half *)p)[i] = __float2half_rn(v);
    else
        ((float *)p)[i] = v;
}

static __device__ __forceinline__ float zo_cuda_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The fused attention's causal and window rules over query rows i0..i1-1
// and key rows j0..j1-1 (flash_cuda.cu, flash_tc_cuda.cu): 0 no pair is
// allowed, 1 every pair, 2 some (then each pair is tested).
static __device__ __forceinline__ int zo_cuda_flash_rules(int causal, int window, int i0, int i1,
                                                          int j0, int j1)
{
    int full = 1;
    if (causal) {
        if (j0 > i1 - 1)
            return 0;
        full &= j1 - 1 <= i0;
    }
    if (window > 0) {
        if (i0 - (j1 - 1) >= window)
            return 0;
        full &= (i1 - 1) - j0 < window;
    }
    return full ? 1 : 2;
}
