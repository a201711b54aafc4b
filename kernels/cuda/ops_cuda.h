/* The cuda compute ops: kernels in ops_cuda.cu, cuBLAS GEMM and the table in
 * ops_cuda.c (not installed). */
#ifndef ZO_OPS_CUDA_H
#define ZO_OPS_CUDA_H

#include "ops_impl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Partial sums zo_op_sumsq reduces through (a per-stream buffer). */
#define ZO_CUDA_SUMSQ_PARTIALS 256

zo_status zo_cuda_op_embedding_fwd(const zo_ops_exec *x, const zo_embed_args *a);
zo_status zo_cuda_op_embedding_bwd(const zo_ops_exec *x, const zo_embed_args *a);
zo_status zo_cuda_op_rmsnorm_fwd(const zo_ops_exec *x, const zo_rmsnorm_args *a);
zo_status zo_cuda_op_rmsnorm_bwd(const zo_ops_exec *x, const zo_rmsnorm_args *a);
zo_status zo_cuda_op_rope_table(const zo_ops_exec *x, const zo_rope_table_args *a);
zo_status zo_cuda_op_rope(const zo_ops_exec *x, const zo_rope_args *a);
zo_status zo_cuda_op_softmax_fwd(const zo_ops_exec *x, const zo_softmax_args *a);
zo_status zo_cuda_op_softmax_bwd(const zo_ops_exec *x, const zo_softmax_args *a);
zo_status zo_cuda_op_swiglu_fwd(const zo_ops_exec *x, const zo_swiglu_args *a);
zo_status zo_cuda_op_swiglu_bwd(const zo_ops_exec *x, const zo_swiglu_args *a);
zo_status zo_cuda_op_cross_entropy(const zo_ops_exec *x, const zo_xent_args *a);
zo_status zo_cuda_op_xent_part_stats(const zo_ops_exec *x, const zo_xent_part_args *a);
zo_status zo_cuda_op_xent_part(const zo_ops_exec *x, const zo_xent_part_args *a);
zo_status zo_cuda_op_elementwise(const zo_ops_exec *x, const zo_ew_args *a);
zo_status zo_cuda_op_repeat_kv(const zo_ops_exec *x, const zo_repeat_kv_args *a);
zo_status zo_cuda_op_bias(const zo_ops_exec *x, const zo_bias_args *a);
/* The fused attention (flash_cuda.cu). */
zo_status zo_cuda_op_flash_fwd(const zo_ops_exec *x, const zo_flash_args *a);
zo_status zo_cuda_op_flash_bwd(const zo_ops_exec *x, const zo_flash_args *a);
/* Its tensor-core kernels (flash_tc_cuda.cu): takes() says whether they take
 * a call (bwd: the backward's), the others launch them (the backward after
 * delta is computed). */
int zo_cuda_flash_tc_takes(const zo_flash_args *a, int bwd);
zo_status zo_cuda_flash_tc_fwd(const zo_ops_exec *x, const zo_flash_args *a);
zo_status zo_cuda_flash_tc_bwd(const zo_ops_exec *x, const zo_flash_args *a);
/* partials: ZO_CUDA_SUMSQ_PARTIALS floats of device memory owned by the stream. */
zo_status zo_cuda_sumsq(void *stream, float *partials, const zo_sumsq_args *a);

#ifdef __cplusplus
}
#endif
#endif
