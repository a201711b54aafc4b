/* The fused attention's tile product (flash_tiles.h), written once. A
 * variant's file defines FT_NAME (its table's name), FT_LABEL (its name as a
 * string), FT_W (floats per vector: 1 for the scalar reference) and FT_NV
 * (vectors per block row), then includes this file; its compile options
 * choose the instruction set and turn contraction off (-ffp-contract=off),
 * so that each element's chain of fused multiply-adds (ft_fma, and fmaf at
 * the tail) is the reference's at every width. */
#include <math.h>
#include <string.h>

#include "flash_tiles.h"

/* Rows of C per block: FT_R x FT_NV accumulators, FT_NV vectors of B and a
 * broadcast stay in registers (24 of AVX-512's 32, 11 of AVX2's 16). */
#define FT_R 4

#if FT_W == 1
typedef float ft_v;
static inline ft_v ft_fma(float a, ft_v b, ft_v c)
{
    return fmaf(a, b, c);
}
static inline ft_v ft_load(const float *p)
{
    return *p;
}
static inline void ft_store(float *p, ft_v v)
{
    *p = v;
}
#define ft_zero()      0.0f
#define ft_scale(v, s) ((v) * (s))
#else
/* The machine's own vector types and unaligned load and store intrinsics:
 * an under-aligned vector_size type loaded with memcpy made GCC bounce every
 * load of B through the stack (two 16-byte stores, then a 32-byte load that
 * store forwarding cannot serve), which ran the AVX2 variant at a quarter of
 * OpenBLAS's speed. */
#include <immintrin.h>
#if FT_W == 16
typedef __m512 ft_v;
#define ft_load(p)     _mm512_loadu_ps(p)
#define ft_store(p, v) _mm512_storeu_ps(p, v)
#define ft_zero()      _mm512_setzero_ps()
#define ft_scale(v, s) _mm512_mul_ps(v, _mm512_set1_ps(s))
static inline ft_v ft_fma(float a, ft_v b, ft_v c)
{
    return _mm512_fmadd_ps(_mm512_set1_ps(a), b, c);
}
#else
typedef __m256 ft_v;
#define ft_load(p)     _mm256_loadu_ps(p)
#define ft_store(p, v) _mm256_storeu_ps(p, v)
#define ft_zero()      _mm256_setzero_ps()
#define ft_scale(v, s) _mm256_mul_ps(v, _mm256_set1_ps(s))
static inline ft_v ft_fma(float a, ft_v b, ft_v c)
{
    return _mm256_fmadd_ps(_mm256_set1_ps(a), b, c);
}
#endif
#endif

/* Rows r0 .. r0 + nr - 1 by columns c0 .. c0 + nv * FT_W - 1 of C; inlined
 * with constant nr and nv, so that the accumulators become registers. */
static inline __attribute__((always_inline)) void ft_block(const zo_flash_mm_args *x, int r0,
                                                           int nr, int c0, int nv)
{
    ft_v acc[FT_R][FT_NV];
    const ft_v zero = ft_zero();
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++)
            acc[r][v] = x->accumulate ? ft_load(x->c + (r0 + r) * x->ldc + c0 + v * FT_W) : zero;
    const float *a = x->a + r0 * x->ars;
    for (int p = 0; p < x->k; p++) {
        ft_v bv[FT_NV];
        const float *b = x->b + p * x->ldb + c0;
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++)
            bv[v] = ft_load(b + v * FT_W);
#pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            float av = a[r * x->ars + p * x->acs];
#pragma GCC unroll 8
            for (int v = 0; v < nv; v++)
                acc[r][v] = ft_fma(av, bv[v], acc[r][v]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++)
            ft_store(x->c + (r0 + r) * x->ldc + c0 + v * FT_W, ft_scale(acc[r][v], x->alpha));
}

/* One element's chain: the columns past the last whole vector. */
static void ft_element(const zo_flash_mm_args *x, int r, int c)
{
    float acc = x->accumulate ? x->c[r * x->ldc + c] : 0.0f;
    for (int p = 0; p < x->k; p++)
        acc = fmaf(x->a[r * x->ars + p * x->acs], x->b[p * x->ldb + c], acc);
    x->c[r * x->ldc + c] = acc * x->alpha;
}

/* Rows r0 .. r0 + nr - 1 (nr is FT_R or 1) across all columns. */
static inline __attribute__((always_inline)) void ft_rows(const zo_flash_mm_args *x, int r0, int nr)
{
    int c = 0;
    for (; c + FT_NV * FT_W <= x->n; c += FT_NV * FT_W)
        ft_block(x, r0, nr, c, FT_NV);
    for (; c + FT_W <= x->n; c += FT_W)
        ft_block(x, r0, nr, c, 1);
    for (; c < x->n; c++)
        for (int r = r0; r < r0 + nr; r++)
            ft_element(x, r, c);
}

static void ft_mm(const zo_flash_mm_args *x)
{
    int r = 0;
    for (; r + FT_R <= x->m; r += FT_R)
        ft_rows(x, r, FT_R);
    for (; r < x->m; r++)
        ft_rows(x, r, 1);
}

const zo_flash_tilek FT_NAME = {.name = FT_LABEL, .mm = ft_mm};
