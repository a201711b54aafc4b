/* exp of shifted scores with AVX-512 (cpu_exp.h): the scalar reference's
 * steps, sixteen lanes at a time, the tail through the reference itself. */
#include <immintrin.h>

#include "cpu_exp.h"

void zo_cpu_exp_shifted_avx512(float *x, int n, float shift)
{
    const __m512 sh = _mm512_set1_ps(shift), lo = _mm512_set1_ps(ZO_EXP_LO);
    const __m512 magic = _mm512_set1_ps(ZO_EXP_MAGIC), log2e = _mm512_set1_ps(ZO_EXP_LOG2E);
    const __m512 c1 = _mm512_set1_ps(-ZO_EXP_C1), c2 = _mm512_set1_ps(-ZO_EXP_C2);
    const __m512 one = _mm512_set1_ps(1.0f);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_sub_ps(_mm512_loadu_ps(x + i), sh);
        __mmask16 under = _mm512_cmp_ps_mask(v, lo, _CMP_LT_OQ);
        __m512 t = _mm512_mul_ps(v, log2e);
        __m512 nn = _mm512_sub_ps(_mm512_add_ps(t, magic), magic);
        __m512 r = _mm512_fmadd_ps(nn, c1, v);
        r = _mm512_fmadd_ps(nn, c2, r);
        __m512 p = _mm512_set1_ps(ZO_EXP_P0);
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ZO_EXP_P1));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ZO_EXP_P2));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ZO_EXP_P3));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ZO_EXP_P4));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ZO_EXP_P5));
        __m512 z = _mm512_mul_ps(r, r);
        __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, z, r), one);
        __m512i e = _mm512_cvtps_epi32(nn);
        __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(127)), 23);
        __m512 res = _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
        _mm512_storeu_ps(x + i, _mm512_mask_blend_ps(under, res, _mm512_setzero_ps()));
    }
    for (; i < n; i++)
        x[i] = zo_exp_shifted1(x[i], shift);
}
