/* zoffload: CPU feature detection for the SIMD code paths. */
#ifndef ZO_CPU_H
#define ZO_CPU_H

#include "zo/api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* SIMD levels, ordered: a higher level implies the lower x86 ones. */
typedef enum zo_simd_level {
    ZO_SIMD_SCALAR = 0,
    ZO_SIMD_NEON = 1,        /* aarch64 Advanced SIMD */
    ZO_SIMD_AVX2 = 2,        /* AVX2 + FMA + F16C */
    ZO_SIMD_AVX512 = 3,      /* AVX-512 F/BW/VL/CD (+ F16C) */
    ZO_SIMD_AVX512_BF16 = 4, /* AVX-512 with native bf16 conversion and VBMI */
} zo_simd_level;

/* What this CPU and OS support. */
ZO_API zo_simd_level zo_cpu_simd_detected(void);
/* The level the library uses: the detected one, lowered by ZO_SIMD
 * (scalar|neon|avx2|avx512|avx512_bf16) when set; never above detected. */
ZO_API zo_simd_level zo_cpu_simd_level(void);
ZO_API const char *zo_simd_level_name(zo_simd_level level);
/* Whether a level can run here. */
ZO_API int zo_cpu_simd_supported(zo_simd_level level);

#ifdef __cplusplus
}
#endif
#endif
