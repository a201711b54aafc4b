/* The cuda compute ops: the per-stream context (a cuBLAS handle bound to the
 * stream, a small reduction buffer), GEMM through cublasGemmStridedBatchedEx
 * with fp32 accumulation, and the backend table. One handle per stream, so
 * concurrent streams never share cuBLAS's workspace and each stream's GEMMs
 * are bitwise repeatable. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdlib.h>

#include "device_impl.h"
#include "ops_cuda.h"
#include "zo_cuda_check.h"

#define SUBSYS "ops"

typedef struct cuda_ops_ctx {
    zo_stream_ops_ctx hdr;
    cublasHandle_t blas;
    float *partials; /* ZO_CUDA_SUMSQ_PARTIALS floats; outside the device budget (1 KiB) */
} cuda_ops_ctx;

static void cuda_ctx_free(zo_stream_ops_ctx *c)
{
    cuda_ops_ctx *ctx = (cuda_ops_ctx *)c;
    if (ctx->blas && cublasDestroy(ctx->blas) != CUBLAS_STATUS_SUCCESS)
        ZO_LOGW(SUBSYS, "cublasDestroy failed while destroying a stream");
    if (ctx->partials && cudaFree(ctx->partials) != cudaSuccess) {
        (void)cudaGetLastError();
        ZO_LOGW(SUBSYS, "cudaFree of a stream's reduction buffer failed");
    }
    free(ctx);
}

static zo_status ctx_init(cuda_ops_ctx *ctx, zo_stream_t s)
{
    ZO_CUBLAS_CHECK(cublasCreate(&ctx->blas));
    ZO_CUBLAS_CHECK(cublasSetStream(ctx->blas, (cudaStream_t)zo_stream_native(s)));
    /* Plain fp32 math for fp32 GEMMs (no TF32), so f32 results match the cpu
     * reference closely; 16-bit inputs use tensor cores regardless. */
    ZO_CUBLAS_CHECK(cublasSetMathMode(ctx->blas, CUBLAS_DEFAULT_MATH));
    ZO_CUDA_CHECK(cudaMalloc((void **)&ctx->partials, ZO_CUDA_SUMSQ_PARTIALS * sizeof(float)));
    return ZO_OK;
}

static zo_status cuda_ctx_create(zo_stream_t s, void **out)
{
    cuda_ops_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating a stream's ops context");
    ctx->hdr.free_fn = cuda_ctx_free;
    zo_status st = ctx_init(ctx, s);
    if (st != ZO_OK) {
        cuda_ctx_free(&ctx->hdr);
        return st;
    }
    *out = ctx;
    return ZO_OK;
}

static cudaDataType_t cuda_type(zo_dtype dt)
{
    switch (dt) {
    case ZO_DTYPE_BF16: return CUDA_R_16BF;
    case ZO_DTYPE_F16: return CUDA_R_16F;
    default: return CUDA_R_32F;
    }
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the same
 * buffers with A and B swapped and m and n swapped. */
static zo_status cuda_gemm(const zo_ops_exec *x, const zo_gemm_desc *g)
{
    cuda_ops_ctx *ctx = x->ctx;
    ZO_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        ctx->blas, g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
        g->n, g->m, g->k, &g->alpha, g->b, cuda_type(g->b_type), (int)g->ldb, g->stride_b, g->a,
        cuda_type(g->a_type), (int)g->lda, g->stride_a, &g->beta, g->c, cuda_type(g->c_type),
        (int)g->ldc, g->stride_c, g->batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return ZO_OK;
}

static zo_status cuda_sumsq(const zo_ops_exec *x, const zo_sumsq_args *a)
{
    return zo_cuda_sumsq(x->native, ((cuda_ops_ctx *)x->ctx)->partials, a);
}

const zo_ops_backend zo_ops_cuda = {
    .name = "cuda",
    .version = ZO_OPS_BACKEND_VERSION,
    .caps = ZO_OPS_CAP_DETERMINISTIC, /* no atomics in reductions (ops_cuda.cu) */
    .ctx_create = cuda_ctx_create,
    .gemm = cuda_gemm,
    .embedding_fwd = zo_cuda_op_embedding_fwd,
    .embedding_bwd = zo_cuda_op_embedding_bwd,
    .rmsnorm_fwd = zo_cuda_op_rmsnorm_fwd,
    .rmsnorm_bwd = zo_cuda_op_rmsnorm_bwd,
    .rope_table = zo_cuda_op_rope_table,
    .rope = zo_cuda_op_rope,
    .softmax_fwd = zo_cuda_op_softmax_fwd,
    .softmax_bwd = zo_cuda_op_softmax_bwd,
    .swiglu_fwd = zo_cuda_op_swiglu_fwd,
    .swiglu_bwd = zo_cuda_op_swiglu_bwd,
    .cross_entropy = zo_cuda_op_cross_entropy,
    .xent_part_stats = zo_cuda_op_xent_part_stats,
    .xent_part = zo_cuda_op_xent_part,
    .elementwise = zo_cuda_op_elementwise,
    .sumsq = cuda_sumsq,
    .repeat_kv = zo_cuda_op_repeat_kv,
    .bias = zo_cuda_op_bias,
    .flash_fwd = zo_cuda_op_flash_fwd,
    .flash_bwd = zo_cuda_op_flash_bwd,
};
