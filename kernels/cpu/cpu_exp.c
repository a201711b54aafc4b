/* exp of shifted scores (cpu_exp.h): the scalar loop and the choice of
 * variant by the library's SIMD level. */
#include "cpu_exp.h"

#include "zo/cpu.h"

static void exp_scalar(float *x, int n, float shift)
{
    for (int i = 0; i < n; i++)
        x[i] = zo_exp_shifted1(x[i], shift);
}

void zo_cpu_exp_shifted_at(int level, float *x, int n, float shift)
{
#if defined(__x86_64__)
    if (level >= ZO_SIMD_AVX512) {
        zo_cpu_exp_shifted_avx512(x, n, shift);
        return;
    }
    if (level >= ZO_SIMD_AVX2) {
        zo_cpu_exp_shifted_avx2(x, n, shift);
        return;
    }
#endif
    exp_scalar(x, n, shift);
}

void zo_cpu_exp_shifted(float *x, int n, float shift)
{
    static int level = -1; /* racy first reads all store the same value */
    int l = __atomic_load_n(&level, __ATOMIC_RELAXED);
    if (l < 0) {
        l = (int)zo_cpu_simd_level();
        __atomic_store_n(&level, l, __ATOMIC_RELAXED);
    }
    zo_cpu_exp_shifted_at(l, x, n, shift);
}
