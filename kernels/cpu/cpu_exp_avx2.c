/* exp of shifted scores with AVX2 and FMA (cpu_exp.h): the scalar
 * reference's steps, eight lanes at a time, the tail through the reference
 * itself. Without it an AVX2 machine ran the reference, whose fmaf is a
 * call into libm per operation: 17% of a small-preset step. */
#include <immintrin.h>

#include "cpu_exp.h"

void zo_cpu_exp_shifted_avx2(float *x, int n, float shift)
{
    const __m256 sh = _mm256_set1_ps(shift), lo = _mm256_set1_ps(ZO_EXP_LO);
    const __m256 magic = _mm256_set1_ps(ZO_EXP_MAGIC), log2e = _mm256_set1_ps(ZO_EXP_LOG2E);
    const __m256 c1 = _mm256_set1_ps(-ZO_EXP_C1), c2 = _mm256_set1_ps(-ZO_EXP_C2);
    const __m256 one = _mm256_set1_ps(1.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_sub_ps(_mm256_loadu_ps(x + i), sh);
        __m256 under = _mm256_cmp_ps(v, lo, _CMP_LT_OQ);
        __m256 t = _mm256_mul_ps(v, log2e);
        __m256 nn = _mm256_sub_ps(_mm256_add_ps(t, magic), magic);
        __m256 r = _mm256_fmadd_ps(nn, c1, v);
        r = _mm256_fmadd_ps(nn, c2, r);
        __m256 p = _mm256_set1_ps(ZO_EXP_P0);
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ZO_EXP_P1));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ZO_EXP_P2));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ZO_EXP_P3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ZO_EXP_P4));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ZO_EXP_P5));
        __m256 z = _mm256_mul_ps(r, r);
        __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, z, r), one);
        __m256i e = _mm256_cvtps_epi32(nn);
        __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23);
        __m256 res = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
        _mm256_storeu_ps(x + i, _mm256_blendv_ps(res, _mm256_setzero_ps(), under));
    }
    for (; i < n; i++)
        x[i] = zo_exp_shifted1(x[i], shift);
}
