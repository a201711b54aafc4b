/* The portable variant: the shared loops with one-lane "vectors", so each
 * type combination still gets its own loop with the conversions inlined. */
#include "adam_scalar_elem.h"
#include "optim_internal.h"
#include "zo/half.h"

#include <math.h>

#define ZV_W 1
typedef float zv;

static inline zv zv_set1(float x)
{
    return x;
}
static inline zv zv_mul(zv a, zv b)
{
    return a * b;
}
static inline zv zv_fma(zv a, zv b, zv c)
{
    return fmaf(a, b, c);
}
static inline zv zv_div(zv a, zv b)
{
    return a / b;
}
static inline zv zv_sqrt(zv a)
{
    return sqrtf(a);
}
static inline zv zv_ld32(const float *p)
{
    return *p;
}
static inline void zv_st32(float *p, zv x)
{
    *p = x;
}
static inline zv zv_ldbf(const uint16_t *p)
{
    return zo_bf16_to_f32(*p);
}
static inline void zv_stbf(uint16_t *p, zv x)
{
    *p = zo_f32_to_bf16(x);
}
static inline zv zv_ldhf(const uint16_t *p)
{
    return zo_f16_to_f32(*p);
}
static inline void zv_sthf(uint16_t *p, zv x)
{
    *p = zo_f32_to_f16(x);
}

typedef double zacc;
static inline zacc zacc_zero(void)
{
    return 0.0;
}
static inline zacc zacc_add(zacc a, zv x)
{
    return a + (double)x * (double)x;
}
static inline double zacc_sum(zacc a)
{
    return a;
}

typedef uint32_t zr32;
typedef uint16_t zr16;
static inline zr32 zr_ld32(const uint32_t *p)
{
    return *p;
}
static inline void zr_st32(uint32_t *p, zr32 x)
{
    *p = x;
}
static inline zr16 zr_ld16(const uint16_t *p)
{
    return *p;
}
static inline void zr_st16(uint16_t *p, zr16 x)
{
    *p = x;
}
static inline zr16 zr_narrow(zr32 x)
{
    return (zr16)x;
}
#define zr_opaque32(x) __asm__ volatile("" : "+r"(x))
#define zr_opaque16(x) __asm__ volatile("" : "+r"(x))

typedef int32_t zi;
static inline zi zi_set1(int32_t x)
{
    return x;
}
static inline zi zi_add(zi a, zi b)
{
    return (zi)((uint32_t)a + (uint32_t)b);
}
static inline zi zi_sub(zi a, zi b)
{
    return (zi)((uint32_t)a - (uint32_t)b);
}
static inline zi zi_and(zi a, zi b)
{
    return a & b;
}
static inline zi zi_max(zi a, zi b)
{
    return a > b ? a : b;
}
static inline zi zi_min(zi a, zi b)
{
    return a < b ? a : b;
}
#define zi_srli(x, n) ((zi)((uint32_t)(x) >> (n)))
static inline zi zi_bits(zv x)
{
    return (zi)zo_f32_bits(x);
}
static inline zv zv_bits(zi x)
{
    return zo_bits_f32((uint32_t)x);
}
static inline zi zi_inc_gt(zi d, zv a, zv b)
{
    return a > b ? d + 1 : d;
}
static inline int32_t zi_hmax(zi x)
{
    return x;
}
static inline zi zi_ld8(const uint8_t *p)
{
    return *p;
}
static inline void zi_st8(uint8_t *p, zi x)
{
    *p = (uint8_t)x;
}
static inline zi zi_cvtt(zv x)
{
    return zs_cvtt(x);
}
static inline zv zv_from_int(zi x)
{
    return (float)x;
}
static inline zv zv_sub(zv a, zv b)
{
    return a - b;
}
static inline zv zv_lut16(const float *t, zi idx)
{
    return t[idx];
}
static inline zi zi_lut16(const int32_t *t, zi idx)
{
    return t[idx];
}
/* As a vector permute: the index's low 5 bits. */
static inline zi zi_lut32(const int32_t *t, zi idx)
{
    return t[idx & 31];
}
/* Each 16-bit half minus b's, floored at 0. */
static inline zi zi_subs_u16(zi a, zi b)
{
    uint32_t ua = (uint32_t)a, ub = (uint32_t)b;
    uint32_t lo = (ua & 0xffffu) > (ub & 0xffffu) ? (ua & 0xffffu) - (ub & 0xffffu) : 0u;
    uint32_t hi = (ua >> 16) > (ub >> 16) ? (ua >> 16) - (ub >> 16) : 0u;
    return (zi)(lo | hi << 16);
}
static inline zi zi_add_if_neg_nz(zi d, zi bits, int32_t x)
{
    return bits < 0 && d != 0 ? d + x : d;
}
static inline void zi_st8x4(uint8_t *p, zi a, zi b, zi c, zi d)
{
    p[0] = (uint8_t)a;
    p[1] = (uint8_t)b;
    p[2] = (uint8_t)c;
    p[3] = (uint8_t)d;
}
#define zi_opaque(x) __asm__ volatile("" : "+r"(x))

#define ZV_TABLE zo_optim_kernels_scalar
#define ZV_NAME  "scalar"
#include "adam_simd.h"
