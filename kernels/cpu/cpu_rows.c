/* The row kernels' scalar reference (cpu_rows.h: built with vectorization
 * off, so that it is the plain loop it reads as) and the choice of variant
 * by the library's SIMD level. */
#include "zo/cpu.h"

#define ZR_NAME             zo_cpu_rows_scalar
#define ZR_LABEL            "scalar"
#define ZR_EXP(x, n, shift) zo_cpu_exp_shifted_at(0, x, n, shift)
#include "cpu_rows_body.h"

const zo_cpu_rowk *zo_cpu_rows_at(int level)
{
    if (!zo_cpu_simd_supported((zo_simd_level)level))
        return NULL;
#if defined(__x86_64__)
    if (level >= ZO_SIMD_AVX512)
        return &zo_cpu_rows_avx512;
    if (level >= ZO_SIMD_AVX2)
        return &zo_cpu_rows_avx2;
#endif
    return &zo_cpu_rows_scalar;
}

const zo_cpu_rowk *zo_cpu_rows(void)
{
    static const zo_cpu_rowk *chosen; /* racy first reads all store the same value */
    const zo_cpu_rowk *k = __atomic_load_n(&chosen, __ATOMIC_RELAXED);
    if (!k) {
        k = zo_cpu_rows_at(zo_cpu_simd_level());
        __atomic_store_n(&chosen, k, __ATOMIC_RELAXED);
    }
    return k;
}
