/* Scalar fp32 <-> bf16/fp16 conversions shared by the public helpers and the
 * cpu ops (inline, so the per-element paths stay cheap). Round to nearest
 * even; NaN stays NaN with its sign (quieted); overflow goes to infinity. */
#ifndef ZO_DTYPE_CONV_H
#define ZO_DTYPE_CONV_H

#include <stdint.h>
#include <string.h>

static inline uint32_t zo_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float zo_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t zo_conv_f32_to_bf16(float f)
{
    uint32_t u = zo_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float zo_conv_bf16_to_f32(uint16_t h) { return zo_bits_f32((uint32_t)h << 16); }

static inline uint16_t zo_conv_f32_to_f16(float f)
{
    uint32_t x = zo_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu)); /* NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {
        /* Below fp16's smallest normal: adding 0.5 puts the value's fp16
         * subnormal bits at the bottom of the float mantissa, and the FPU's
         * own round-to-nearest-even does the rounding. */
        float r = zo_bits_f32(ax) + 0.5f;
        return (uint16_t)(sign | (zo_f32_bits(r) - 0x3f000000u));
    }
    uint32_t odd = (ax >> 13) & 1u;
    ax += 0xc8000000u /* rebias exponent by (15 - 127) << 23 */ + 0xfffu + odd;
    return (uint16_t)(sign | (ax >> 13));
}

static inline float zo_conv_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float v = (float)m * 0x1p-24f; /* zero or subnormal: exact */
        return zo_bits_f32(zo_f32_bits(v) | sign);
    }
    if (e == 31) return zo_bits_f32(sign | 0x7f800000u | (m << 13));
    return zo_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

#endif
