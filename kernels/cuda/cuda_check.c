/* Conversion of CUDA, cuBLAS and NCCL errors into zo_status. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#ifdef ZO_HAVE_NCCL
#include <nccl.h>
#endif

#include "zo_cuda_check.h"

#define SUBSYS "cuda"

zo_status zo_cuda_fail(int err, const char *call, const char *file, int line)
{
    cudaError_t e = (cudaError_t)err;
    (void)cudaGetLastError(); /* clear the sticky per-thread error */
    zo_status st = (e == cudaErrorMemoryAllocation) ? ZO_ERR_OUT_OF_DEVICE_MEMORY
                   : (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) ? ZO_ERR_NO_DEVICE
                                                                                  : ZO_ERR_CUDA;
    zo_set_error_at(st, SUBSYS, file, line, "%s failed: %s (%s)", call, cudaGetErrorName(e),
                    cudaGetErrorString(e));
    zo_log(ZO_LOG_ERROR, SUBSYS, "%s", zo_last_error());
    return st;
}

zo_status zo_cublas_fail(int err, const char *call, const char *file, int line)
{
    (void)cudaGetLastError();
    zo_set_error_at(ZO_ERR_CUBLAS, SUBSYS, file, line, "%s failed: %s", call,
                    cublasGetStatusString((cublasStatus_t)err));
    zo_log(ZO_LOG_ERROR, SUBSYS, "%s", zo_last_error());
    return ZO_ERR_CUBLAS;
}

zo_status zo_nccl_fail(int err, const char *call, const char *file, int line)
{
    (void)cudaGetLastError();
#ifdef ZO_HAVE_NCCL
    const char *what = ncclGetErrorString((ncclResult_t)err);
#else
    const char *what = "NCCL not built in";
#endif
    zo_set_error_at(ZO_ERR_NCCL, SUBSYS, file, line, "%s failed: %s", call, what);
    zo_log(ZO_LOG_ERROR, SUBSYS, "%s", zo_last_error());
    return ZO_ERR_NCCL;
}
