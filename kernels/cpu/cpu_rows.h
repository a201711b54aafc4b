/* The row kernels of the cpu device's ops (not installed): what the
 * normalization, activation, softmax, cross-entropy and elementwise ops do to
 * one row or one block of fp32 values, written once (cpu_rows_body.h) and
 * compiled three times: the scalar reference (cpu_rows.c, vectorization
 * off), AVX2 and AVX-512 (cpu_rows_avx2.c, cpu_rows_avx512.c), chosen at run
 * time by the library's SIMD level.
 *
 * Same bits at every level: every loop either works element by element
 * (fp32 operations with no contraction into fused multiply-adds, the same
 * at any vector width) or reduces into ZO_ROW_LANES running sums, element i
 * into lane i % ZO_ROW_LANES, added in lane order at the end, so the
 * reference's order is the vector code's. exp is the fused attention's
 * (cpu_exp.h): one algorithm whose scalar and AVX-512 forms agree. A test
 * (tests/kernels/test_cpu_rows.c) holds every level to the reference. */
#ifndef ZO_CPU_ROWS_H
#define ZO_CPU_ROWS_H

#include <stddef.h>

#include "zo/dtype.h"

/* Reductions run over this many lanes (two AVX-512 vectors of doubles). */
#define ZO_ROW_LANES 16
/* The elementwise ops work in blocks of this many elements. */
#define ZO_ROW_BLOCK 512

typedef struct zo_cpu_rowk {
    const char *name;
    /* dst[i] = src[off + i] as fp32 (exact), and back (round to nearest
     * even, as zo/half.h) for i < n. */
    void (*load)(float *dst, const void *src, zo_dtype dt, size_t off, size_t n);
    void (*store)(void *dst, zo_dtype dt, size_t off, const float *src, size_t n);
    /* The largest of x[0..n) (a NaN is passed over, as fmaxf does); -inf
     * when n is 0. */
    float (*max)(const float *x, size_t n);
    /* Sums in double: of x, of x * y (x * x: the sum of squares). */
    double (*sum)(const float *x, size_t n);
    double (*dot)(const float *x, const float *y, size_t n);
    /* x[i] = exp(x[i] - shift) (cpu_exp.h). */
    void (*exp_shifted)(float *x, size_t n, float shift);
    /* x[i] *= s. */
    void (*scale)(float *x, size_t n, float s);
    /* y = x * rs * w (RMSNorm's forward). */
    void (*rms_fwd)(float *y, const float *x, float rs, const float *w, size_t n);
    /* RMSNorm's backward of one row: dx = rs * (dy w - x rs mean) (+ dx when
     * accumulate), where mean is the row's sum of (dy w)(x rs), over n;
     * dw_acc[j] += dy[j] * x[j] * rs in double when dw_acc is not NULL. */
    void (*rms_bwd)(float *dx, const float *x, const float *dy, const float *w, float rs, size_t n,
                    int accumulate, double *dw_acc);
    /* SwiGLU: y = silu(g) u; and its backward: dg = d u silu'(g), du = d silu(g).
     * n <= ZO_ROW_BLOCK. */
    void (*swiglu_fwd)(float *y, const float *g, const float *u, size_t n);
    void (*swiglu_bwd)(float *dg, float *du, const float *g, const float *u, const float *d,
                       size_t n);
    /* Elementwise: y = a + b; y *= alpha; y += alpha a. */
    void (*add)(float *y, const float *a, const float *b, size_t n);
    void (*axpy)(float *y, float alpha, const float *a, size_t n);
    /* The softmax's backward: y = p (g - d). */
    void (*softmax_bwd)(float *y, const float *p, const float *g, float d, size_t n);
    /* RoPE on one head of 2 half values: y1 = x1 c - x2 s, y2 = x2 c + x1 s with
     * (c, s) = cs[2i], sgn * cs[2i + 1]. */
    void (*rope)(float *y, const float *x, const float *cs, float sgn, size_t half);
} zo_cpu_rowk;

/* The kernels at the library's SIMD level (zo_cpu_simd_level). */
const zo_cpu_rowk *zo_cpu_rows(void);
/* At a given level, or NULL where it is not built or not supported here. */
const zo_cpu_rowk *zo_cpu_rows_at(int level);

extern const zo_cpu_rowk zo_cpu_rows_scalar;
extern const zo_cpu_rowk zo_cpu_rows_avx2;
extern const zo_cpu_rowk zo_cpu_rows_avx512;

#endif
