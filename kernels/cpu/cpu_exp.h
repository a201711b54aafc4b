/* exp of shifted scores for the fused attention's softmax on the cpu device:
 * x[i] = exp(x[i] - shift), one algorithm (Cephes' expf: n = round(x log2 e),
 * a two-part ln 2 reduction and a degree-5 polynomial, each step one fp32
 * operation or one fused multiply-add) written three times, as the scalar
 * reference below, with AVX2 (cpu_exp_avx2.c) and with AVX-512
 * (cpu_exp_avx512.c), so all give the same bits, element for element, on any thread and at any SIMD
 * level. Arguments below -87.33 (where exp falls under FLT_MIN), -inf included, give 0; the largest
 * error is 2 ulp against exp in double (tested). */
#ifndef ZO_CPU_EXP_H
#define ZO_CPU_EXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define ZO_EXP_LO    -87.33654475f /* ln FLT_MIN */
#define ZO_EXP_MAGIC 12582912.0f   /* 1.5 * 2^23: adding it rounds to an integer */
#define ZO_EXP_LOG2E 1.44269504088896341f
#define ZO_EXP_C1    0.693359375f /* ln 2 = C1 - C2, C1 with 9 bits */
#define ZO_EXP_C2    -2.12194440e-4f
#define ZO_EXP_P0    1.9875691500e-4f
#define ZO_EXP_P1    1.3981999507e-3f
#define ZO_EXP_P2    8.3334519073e-3f
#define ZO_EXP_P3    4.1665795894e-2f
#define ZO_EXP_P4    1.6666665459e-1f
#define ZO_EXP_P5    5.0000001201e-1f

/* exp(a - shift), the scalar reference. */
static inline float zo_exp_shifted1(float a, float shift)
{
    float x = a - shift;
    if (x < ZO_EXP_LO)
        return 0.0f;
    float t = x * ZO_EXP_LOG2E;
    float n = (t + ZO_EXP_MAGIC) - ZO_EXP_MAGIC;
    float r = fmaf(n, -ZO_EXP_C1, x);
    r = fmaf(n, -ZO_EXP_C2, r);
    float p = ZO_EXP_P0;
    p = fmaf(p, r, ZO_EXP_P1);
    p = fmaf(p, r, ZO_EXP_P2);
    p = fmaf(p, r, ZO_EXP_P3);
    p = fmaf(p, r, ZO_EXP_P4);
    p = fmaf(p, r, ZO_EXP_P5);
    float z = r * r;
    float y = fmaf(p, z, r) + 1.0f;
    /* what cvtps2dq makes of a NaN or an out-of-range n (garbage in: NaN out) */
    int32_t e = n >= -2147483648.0f && n < 2147483648.0f ? (int32_t)n : INT32_MIN;
    uint32_t bits = (uint32_t)(e + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

/* x[i] = exp(x[i] - shift) for i < n, at the library's SIMD level. */
void zo_cpu_exp_shifted(float *x, int n, float shift);
/* The same at a given level (a zo_simd_level; tests): the scalar loop, or
 * the widest of AVX2 and AVX-512 at or below it (the caller checks the CPU
 * supports it). */
void zo_cpu_exp_shifted_at(int level, float *x, int n, float shift);
void zo_cpu_exp_shifted_avx2(float *x, int n, float shift);
void zo_cpu_exp_shifted_avx512(float *x, int n, float shift);

#endif
