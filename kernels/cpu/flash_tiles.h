/* The fused attention's tile products on the cpu device (not installed).
 *
 * One small matrix product, C = op(A) B over fp32 tiles already in cache,
 * written once (flash_tiles_body.h) and compiled three times: the scalar
 * reference (flash_tiles.c, vectorization off) and with AVX2 and AVX-512
 * (flash_tiles_avx2.c, flash_tiles_avx512.c), chosen at run time by the
 * library's SIMD level as the row kernels are (cpu_rows.h).
 *
 * Why not OpenBLAS's sgemm per tile: at the attention's tile sizes (64 x 64
 * x head_dim) it packs both operands of every transposed product (the
 * backward's dk and dv), a fifth of its time in the op, and the backward
 * runs eight products per tile pair. Here B is read in place (the panels are
 * laid out for it: k and v also transposed, tile by tile) and A is broadcast
 * one element at a time, so nothing is packed.
 *
 * Same bits at every level and on every thread: each element of C is one
 * chain, acc = (accumulate ? C : 0), then acc = fma(A(r, p), B(p, c), acc)
 * for p ascending (one rounding per step: fmaf in the scalar reference, the
 * fused multiply-add instruction in the vector code; a separate multiply and
 * add ran at 80% of the speed), then C = acc * alpha. The vector code only
 * runs several chains side by side; test_flash_attention_threads_same_bits
 * holds every level to the reference. */
#ifndef ZO_FLASH_TILES_H
#define ZO_FLASH_TILES_H

#include <stddef.h>

/* A, m x k, is read as A(r, p) = a[r * ars + p * acs]: (lda, 1) for A as
 * stored, (1, lda) for its transpose. B is k x n with rows ldb apart, C
 * m x n with rows ldc apart. With accumulate, alpha must be 1. */
typedef struct zo_flash_mm_args {
    int m, n, k;
    const float *a;
    ptrdiff_t ars, acs;
    const float *b;
    ptrdiff_t ldb;
    float *c;
    ptrdiff_t ldc;
    float alpha;
    int accumulate;
} zo_flash_mm_args;

typedef struct zo_flash_tilek {
    const char *name;
    void (*mm)(const zo_flash_mm_args *x);
} zo_flash_tilek;

/* The kernels at the library's SIMD level (zo_cpu_simd_level). */
const zo_flash_tilek *zo_flash_tiles(void);
/* At a given level, or NULL where it is not built or not supported here. */
const zo_flash_tilek *zo_flash_tiles_at(int level);

extern const zo_flash_tilek zo_flash_tiles_scalar;
extern const zo_flash_tilek zo_flash_tiles_avx2;
extern const zo_flash_tilek zo_flash_tiles_avx512;

#endif
