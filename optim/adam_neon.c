/* aarch64 Advanced SIMD (NEON) variant of the optimizer kernels. Every
 * aarch64 CPU has it, so no extra flags are needed; fp16 conversion uses the
 * FCVTL/FCVTN instructions (round to nearest even, subnormals kept). */
#if defined(__aarch64__)
#include <arm_neon.h>
#include <string.h>

#include "optim_internal.h"

#define ZV_W 4
typedef float32x4_t zv;

static inline zv zv_set1(float x)
{
    return vdupq_n_f32(x);
}
static inline zv zv_mul(zv a, zv b)
{
    return vmulq_f32(a, b);
}
static inline zv zv_fma(zv a, zv b, zv c)
{
    return vfmaq_f32(c, a, b);
}
static inline zv zv_div(zv a, zv b)
{
    return vdivq_f32(a, b);
}
static inline zv zv_sqrt(zv a)
{
    return vsqrtq_f32(a);
}
static inline zv zv_ld32(const float *p)
{
    return vld1q_f32(p);
}
static inline void zv_st32(float *p, zv x)
{
    vst1q_f32(p, x);
}

static inline zv zv_ldbf(const uint16_t *p)
{
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}

/* Round to nearest even; NaNs are quieted instead of rounded. */
static inline void zv_stbf(uint16_t *p, zv x)
{
    uint32x4_t u = vreinterpretq_u32_f32(x);
    uint32x4_t hi = vshrq_n_u32(u, 16);
    uint32x4_t lsb = vandq_u32(hi, vdupq_n_u32(1));
    uint32x4_t r = vshrq_n_u32(vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7fff)), lsb), 16);
    uint32x4_t q = vorrq_u32(hi, vdupq_n_u32(0x40));
    uint32x4_t ordered = vceqq_f32(x, x);
    vst1_u16(p, vmovn_u32(vbslq_u32(ordered, r, q)));
}

static inline zv zv_ldhf(const uint16_t *p)
{
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}
static inline void zv_sthf(uint16_t *p, zv x)
{
    vst1_u16(p, vreinterpret_u16_f16(vcvt_f16_f32(x)));
}

typedef struct {
    float64x2_t lo, hi;
} zacc;
static inline zacc zacc_zero(void)
{
    return (zacc){vdupq_n_f64(0.0), vdupq_n_f64(0.0)};
}
static inline zacc zacc_add(zacc a, zv x)
{
    float64x2_t lo = vcvt_f64_f32(vget_low_f32(x));
    float64x2_t hi = vcvt_high_f64_f32(x);
    return (zacc){vfmaq_f64(a.lo, lo, lo), vfmaq_f64(a.hi, hi, hi)};
}
static inline double zacc_sum(zacc a)
{
    return ((vgetq_lane_f64(a.lo, 0) + vgetq_lane_f64(a.lo, 1)) + vgetq_lane_f64(a.hi, 0)) +
           vgetq_lane_f64(a.hi, 1);
}

typedef uint32x4_t zr32;
typedef uint16x4_t zr16;
static inline zr32 zr_ld32(const uint32_t *p)
{
    return vld1q_u32(p);
}
static inline void zr_st32(uint32_t *p, zr32 x)
{
    vst1q_u32(p, x);
}
static inline zr16 zr_ld16(const uint16_t *p)
{
    return vld1_u16(p);
}
static inline void zr_st16(uint16_t *p, zr16 x)
{
    vst1_u16(p, x);
}
static inline zr16 zr_narrow(zr32 x)
{
    return vmovn_u32(x);
}
#define zr_opaque32(x) __asm__ volatile("" : "+w"(x))
#define zr_opaque16(x) __asm__ volatile("" : "+w"(x))

typedef int32x4_t zi;
static inline zi zi_set1(int32_t x)
{
    return vdupq_n_s32(x);
}
static inline zi zi_add(zi a, zi b)
{
    return vaddq_s32(a, b);
}
static inline zi zi_sub(zi a, zi b)
{
    return vsubq_s32(a, b);
}
static inline zi zi_and(zi a, zi b)
{
    return vandq_s32(a, b);
}
static inline zi zi_max(zi a, zi b)
{
    return vmaxq_s32(a, b);
}
static inline zi zi_min(zi a, zi b)
{
    return vminq_s32(a, b);
}
#define zi_srli(x, n) vreinterpretq_s32_u32(vshrq_n_u32(vreinterpretq_u32_s32(x), n))
static inline zi zi_bits(zv x)
{
    return vreinterpretq_s32_f32(x);
}
static inline zv zv_bits(zi x)
{
    return vreinterpretq_f32_s32(x);
}
static inline zi zi_inc_gt(zi d, zv a, zv b)
{
    return vsubq_s32(d, vreinterpretq_s32_u32(vcgtq_f32(a, b)));
}
static inline int32_t zi_hmax(zi x)
{
    return vmaxvq_s32(x);
}
static inline zi zi_ld8(const uint8_t *p)
{
    uint32_t w;
    memcpy(&w, p, sizeof w);
    uint16x8_t h = vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(w)));
    return vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(h)));
}
static inline void zi_st8(uint8_t *p, zi x)
{
    uint16x4_t h = vmovn_u32(vreinterpretq_u32_s32(x));
    uint32_t w = vget_lane_u32(vreinterpret_u32_u8(vmovn_u16(vcombine_u16(h, h))), 0);
    memcpy(p, &w, sizeof w);
}
/* As zs_cvtt (x86's CVTTPS2DQ): INT32_MIN for NaN and |x| >= 2^31. FCVTZS
 * alone saturates (+inf gives INT32_MAX, NaN 0), which the encoder's clamp
 * would turn into kmax instead of 0, so out-of-range lanes are replaced. */
static inline zi zi_cvtt(zv x)
{
    uint32x4_t in_range = vcaltq_f32(x, vdupq_n_f32(2147483648.0f)); /* |x| < 2^31, not NaN */
    return vbslq_s32(in_range, vcvtq_s32_f32(x), vdupq_n_s32(INT32_MIN));
}
static inline zv zv_from_int(zi x)
{
    return vcvtq_f32_s32(x);
}
static inline zv zv_sub(zv a, zv b)
{
    return vsubq_f32(a, b);
}
/* Small tables, one lane at a time. */
static inline zv zv_lut16(const float *t, zi idx)
{
    float32x4_t r = vdupq_n_f32(t[vgetq_lane_s32(idx, 0)]);
    r = vsetq_lane_f32(t[vgetq_lane_s32(idx, 1)], r, 1);
    r = vsetq_lane_f32(t[vgetq_lane_s32(idx, 2)], r, 2);
    return vsetq_lane_f32(t[vgetq_lane_s32(idx, 3)], r, 3);
}
static inline zi zi_lut16(const int32_t *t, zi idx)
{
    int32x4_t r = vdupq_n_s32(t[vgetq_lane_s32(idx, 0)]);
    r = vsetq_lane_s32(t[vgetq_lane_s32(idx, 1)], r, 1);
    r = vsetq_lane_s32(t[vgetq_lane_s32(idx, 2)], r, 2);
    return vsetq_lane_s32(t[vgetq_lane_s32(idx, 3)], r, 3);
}
static inline zi zi_lut32(const int32_t *t, zi idx)
{
    return zi_lut16(t, vandq_s32(idx, vdupq_n_s32(31))); /* a permute's 5 index bits */
}
static inline zi zi_subs_u16(zi a, zi b)
{
    return vreinterpretq_s32_u16(vqsubq_u16(vreinterpretq_u16_s32(a), vreinterpretq_u16_s32(b)));
}
/* d + x where bits is negative and d is not 0 (d >= 0). */
static inline zi zi_add_if_neg_nz(zi d, zi bits, int32_t x)
{
    int32x4_t m =
        vandq_s32(vshrq_n_s32(bits, 31), vreinterpretq_s32_u32(vcgtq_s32(d, vdupq_n_s32(0))));
    return vaddq_s32(d, vandq_s32(m, vdupq_n_s32(x)));
}
static inline void zi_st8x4(uint8_t *p, zi a, zi b, zi c, zi d)
{
    int16x8_t w = vcombine_s16(vqmovn_s32(a), vqmovn_s32(b));
    int16x8_t x = vcombine_s16(vqmovn_s32(c), vqmovn_s32(d));
    vst1q_u8(p, vcombine_u8(vqmovun_s16(w), vqmovun_s16(x)));
}
#define zi_opaque(x) __asm__ volatile("" : "+w"(x))

#define ZV_TABLE zo_optim_kernels_neon
#define ZV_NAME  "neon"
#include "adam_simd.h"
#endif
