/* The portable variant: the shared loops with one-lane "vectors", so each
 * type combination still gets its own loop with the conversions inlined. */
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

#define ZV_TABLE zo_optim_kernels_scalar
#define ZV_NAME  "scalar"
#include "adam_simd.h"
