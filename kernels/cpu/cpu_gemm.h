/* The cpu device's GEMM paths (not installed).
 *
 * bf16 x bf16 runs oneDNN's matmul, whose avx512_bf16 kernels multiply bf16
 * directly (about 3.5x OpenBLAS's sgemm on converted inputs); fp32 and fp16
 * run OpenBLAS sgemm (fp16 converted to fp32 first). Either way the work is
 * split over the compute pool (cpu_pool.h) into parts fixed by the shape
 * alone, each part a single-threaded library call, so the result is the same
 * bits run to run and at any thread count. */
#ifndef ZO_CPU_GEMM_H
#define ZO_CPU_GEMM_H

#include "zo/ops.h"

/* Whether bf16 GEMMs go to oneDNN: ZO_CPU_GEMM=onednn or openblas picks; the
 * default is oneDNN where it runs bf16 natively (avx512_bf16 or AMX). Where
 * oneDNN has no bf16 matmul at all (below AVX-512), OpenBLAS even when asked
 * for oneDNN, with a warning. */
int zo_cpu_gemm_uses_onednn(const zo_gemm_desc *g);

/* C = alpha op(A) op(B) + beta C for bf16 A and B, C fp32 or bf16, over the
 * pool. */
zo_status zo_cpu_gemm_onednn(const zo_gemm_desc *g);

/* One fp32 sgemm (row-major, no batch) split over the pool's threads. */
void zo_cpu_sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                  int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* The same on the calling thread alone (a pool task's own small GEMM, as the
 * fused attention's tiles). */
void zo_cpu_sgemm_here(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                       int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

#endif
