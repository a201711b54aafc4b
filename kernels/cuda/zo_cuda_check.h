/* One checking macro family for CUDA, cuBLAS and NCCL calls: on failure it
 * clears CUDA's sticky per-thread error, logs, records the last error with
 * the call's text, file and line, and returns a zo_status. Kernel launches
 * are checked with ZO_CUDA_CHECK_LAUNCH() right after the <<<>>>. */
#ifndef ZO_CUDA_CHECK_H
#define ZO_CUDA_CHECK_H

#include "zo_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* err is a cudaError_t, cublasStatus_t or ncclResult_t passed as int. */
zo_status zo_cuda_fail(int err, const char *call, const char *file, int line);
zo_status zo_cublas_fail(int err, const char *call, const char *file, int line);
zo_status zo_nccl_fail(int err, const char *call, const char *file, int line);

#ifdef __cplusplus
}
#endif

#define ZO_CUDA_CHECK(call)                                                                        \
    do {                                                                                           \
        int zo_cuda_e_ = (int)(call);                                                              \
        if (zo_cuda_e_ != 0)                                                                       \
            return zo_cuda_fail(zo_cuda_e_, #call, __FILE__, __LINE__);                            \
    } while (0)

#define ZO_CUDA_CHECK_LAUNCH() ZO_CUDA_CHECK(cudaGetLastError())

#define ZO_CUBLAS_CHECK(call)                                                                      \
    do {                                                                                           \
        int zo_cublas_e_ = (int)(call);                                                            \
        if (zo_cublas_e_ != 0)                                                                     \
            return zo_cublas_fail(zo_cublas_e_, #call, __FILE__, __LINE__);                        \
    } while (0)

#define ZO_NCCL_CHECK(call)                                                                        \
    do {                                                                                           \
        int zo_nccl_e_ = (int)(call);                                                              \
        if (zo_nccl_e_ != 0)                                                                       \
            return zo_nccl_fail(zo_nccl_e_, #call, __FILE__, __LINE__);                            \
    } while (0)

#endif
