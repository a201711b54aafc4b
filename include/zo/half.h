/* zoffload: scalar reference conversions between fp32 and the 16-bit
 * floating-point formats (bf16 and IEEE binary16). Header-only so kernels,
 * the engine and tests share one definition; the SIMD optimizer variants are
 * tested bit for bit against these. */
#ifndef ZO_HALF_H
#define ZO_HALF_H

#include <stdint.h>
#include <string.h>

#include "zo/api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Host functions, and device functions too in CUDA code (the cuda Adam
 * kernel rounds with these very lines, so both give the same bits). */
#ifdef __CUDACC__
#define ZO_HALF_FN static inline __host__ __device__
#else
#define ZO_HALF_FN static inline
#endif

ZO_HALF_FN uint32_t zo_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

ZO_HALF_FN float zo_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* fp32 -> bf16, rounding to nearest even. A NaN stays a NaN (its quiet bit
 * is set so that a payload living only in the dropped low bits cannot turn it
 * into an infinity); subnormals are kept (no flush to zero). */
ZO_HALF_FN uint16_t zo_f32_to_bf16(float f)
{
    uint32_t u = zo_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

ZO_HALF_FN float zo_bf16_to_f32(uint16_t h)
{
    return zo_bits_f32((uint32_t)h << 16);
}

/* The split fp32 master (zo_engine_config.master_split): an fp32 value u
 * whose bf16 rounding p is kept anyway is stored as its low 16 bits lo and
 * one bit, up ("rounded up"), and rebuilt as (p - up) << 16 | lo. Rounding to
 * nearest even adds 1 to the high half hi when lo > 0x8000, or lo == 0x8000
 * (the tie) with hi odd, else keeps hi; the carry runs into the exponent
 * (0x7f7f + 1 is the infinity 0x7f80) and never into the sign (hi = 0x7fff
 * or 0xffff are NaNs), so for every value but a NaN p - hi (mod 2^16) is 0
 * or 1. A NaN becomes hi | 0x40 (0 or 0x40 above hi), and a kernel that
 * flushes subnormals to zero (AVX512-BF16) gives p = 0 for hi up to 0x7f:
 * zo_master_split returns 0 for such an element, and the engine then stores
 * that chunk's full master. tests/optim/test_master_split checks the claim
 * over all 2^32 patterns, with this rounding and with the kernels'. */
static inline int zo_master_split(uint32_t u, uint16_t p, uint16_t *lo, unsigned *up)
{
    uint16_t d = (uint16_t)(p - (uint16_t)(u >> 16));
    *lo = (uint16_t)u;
    *up = d;
    return d <= 1u;
}

static inline uint32_t zo_master_join(uint16_t p, uint16_t lo, unsigned up)
{
    return (uint32_t)(uint16_t)(p - up) << 16 | lo;
}

/* fp32 -> IEEE binary16, rounding to nearest even, with subnormals,
 * overflow to infinity and NaN kept quiet (the x86 F16C convention: the top
 * ten payload bits are kept and the quiet bit set). */
ZO_HALF_FN uint16_t zo_f32_to_f16(float f)
{
    uint32_t u = zo_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {                 /* below 2^-14: subnormal or zero */
        if (a < 0x33000000u)
            return sign; /* below half the smallest subnormal */
        uint32_t mant = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(a >> 23); /* 14..24: aligns the value to units of 2^-24 */
        uint32_t q = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    /* Normal: rebias the exponent (127 -> 15) and round the mantissa. */
    uint32_t r = a - 0x38000000u;
    r += 0x0fffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

/* IEEE binary16 -> fp32, exact (subnormals and inf included); a NaN comes
 * back quiet with its payload, as F16C does. */
ZO_HALF_FN float zo_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1fu)
        return zo_bits_f32(sign | 0x7f800000u | (mant ? 0x00400000u : 0u) | (mant << 13));
    if (exp == 0) {
        /* Subnormal (or zero): mant * 2^-24, exact in fp32. */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    return zo_bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

#ifdef __cplusplus
}
#endif
#endif
