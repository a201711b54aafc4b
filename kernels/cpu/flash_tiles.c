/* The fused attention's tile product's scalar reference (flash_tiles.h:
 * built with vectorization off, so that it is the plain loop it reads as)
 * and the choice of variant by the library's SIMD level. */
#include "zo/cpu.h"

#define FT_NAME  zo_flash_tiles_scalar
#define FT_LABEL "scalar"
#define FT_W     1
#define FT_NV    4
#include "flash_tiles_body.h"

const zo_flash_tilek *zo_flash_tiles_at(int level)
{
    if (!zo_cpu_simd_supported((zo_simd_level)level))
        return NULL;
#if defined(__x86_64__)
    if (level >= ZO_SIMD_AVX512)
        return &zo_flash_tiles_avx512;
    if (level >= ZO_SIMD_AVX2)
        return &zo_flash_tiles_avx2;
#endif
    return &zo_flash_tiles_scalar;
}

const zo_flash_tilek *zo_flash_tiles(void)
{
    static const zo_flash_tilek *chosen; /* racy first reads all store the same value */
    const zo_flash_tilek *k = __atomic_load_n(&chosen, __ATOMIC_RELAXED);
    if (!k) {
        k = zo_flash_tiles_at(zo_cpu_simd_level());
        __atomic_store_n(&chosen, k, __ATOMIC_RELAXED);
    }
    return k;
}
