/* AVX2 + FMA + F16C variant of the optimizer kernels (compiled with
 * -mavx2 -mfma -mf16c). */
#if defined(__x86_64__)
#include <immintrin.h>

#include "optim_internal.h"

#define ZV_W 8
typedef __m256 zv;

static inline zv zv_set1(float x)
{
    return _mm256_set1_ps(x);
}
static inline zv zv_mul(zv a, zv b)
{
    return _mm256_mul_ps(a, b);
}
static inline zv zv_fma(zv a, zv b, zv c)
{
    return _mm256_fmadd_ps(a, b, c);
}
static inline zv zv_div(zv a, zv b)
{
    return _mm256_div_ps(a, b);
}
static inline zv zv_sqrt(zv a)
{
    return _mm256_sqrt_ps(a);
}
static inline zv zv_ld32(const float *p)
{
    return _mm256_loadu_ps(p);
}
static inline void zv_st32(float *p, zv x)
{
    _mm256_storeu_ps(p, x);
}

/* Eight 32-bit values that each fit in 16 bits, packed in order. */
static inline __m128i pack_low16(__m256i r)
{
    __m256i p = _mm256_packus_epi32(r, r); /* per 128-bit lane: r0-3 r0-3 | r4-7 r4-7 */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08));
}

static inline zv zv_ldbf(const uint16_t *p)
{
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* Round to nearest even; NaNs are quieted instead of rounded. */
static inline void zv_stbf(uint16_t *p, zv x)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    __m256i q = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, q, nan);
    _mm_storeu_si128((__m128i *)p, pack_low16(r));
}

static inline zv zv_ldhf(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline void zv_sthf(uint16_t *p, zv x)
{
    _mm_storeu_si128((__m128i *)p,
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

typedef struct {
    __m256d lo, hi;
} zacc;
static inline zacc zacc_zero(void)
{
    return (zacc){_mm256_setzero_pd(), _mm256_setzero_pd()};
}
static inline zacc zacc_add(zacc a, zv x)
{
    __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    return (zacc){_mm256_fmadd_pd(lo, lo, a.lo), _mm256_fmadd_pd(hi, hi, a.hi)};
}
static inline double zacc_sum(zacc a)
{
    double lanes[8];
    _mm256_storeu_pd(lanes, a.lo);
    _mm256_storeu_pd(lanes + 4, a.hi);
    double s = 0.0;
    for (int k = 0; k < 8; k++)
        s += lanes[k];
    return s;
}

typedef __m256i zr32;
typedef __m128i zr16;
static inline zr32 zr_ld32(const uint32_t *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}
static inline void zr_st32(uint32_t *p, zr32 x)
{
    _mm256_storeu_si256((__m256i *)p, x);
}
static inline zr16 zr_ld16(const uint16_t *p)
{
    return _mm_loadu_si128((const __m128i *)p);
}
static inline void zr_st16(uint16_t *p, zr16 x)
{
    _mm_storeu_si128((__m128i *)p, x);
}
static inline zr16 zr_narrow(zr32 x)
{
    return pack_low16(_mm256_and_si256(x, _mm256_set1_epi32(0xffff)));
}
#define zr_opaque32(x) __asm__ volatile("" : "+x"(x))
#define zr_opaque16(x) __asm__ volatile("" : "+x"(x))

typedef __m256i zi;
static inline zi zi_set1(int32_t x)
{
    return _mm256_set1_epi32(x);
}
static inline zi zi_add(zi a, zi b)
{
    return _mm256_add_epi32(a, b);
}
static inline zi zi_sub(zi a, zi b)
{
    return _mm256_sub_epi32(a, b);
}
static inline zi zi_and(zi a, zi b)
{
    return _mm256_and_si256(a, b);
}
static inline zi zi_max(zi a, zi b)
{
    return _mm256_max_epi32(a, b);
}
static inline zi zi_min(zi a, zi b)
{
    return _mm256_min_epi32(a, b);
}
#define zi_srli(x, n) _mm256_srli_epi32(x, n)
static inline zi zi_bits(zv x)
{
    return _mm256_castps_si256(x);
}
static inline zv zv_bits(zi x)
{
    return _mm256_castsi256_ps(x);
}
static inline zi zi_inc_gt(zi d, zv a, zv b)
{
    return _mm256_sub_epi32(d, _mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_GT_OQ)));
}
static inline int32_t zi_hmax(zi x)
{
    __m128i m = _mm_max_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0x4e));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0xb1));
    return _mm_cvtsi128_si32(m);
}
static inline zi zi_ld8(const uint8_t *p)
{
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
static inline void zi_st8(uint8_t *p, zi x)
{
    __m128i w = pack_low16(x); /* lanes are 0..255 */
    _mm_storel_epi64((__m128i *)p, _mm_packus_epi16(w, w));
}
static inline zi zi_cvtt(zv x)
{
    return _mm256_cvttps_epi32(x);
}
static inline zv zv_from_int(zi x)
{
    return _mm256_cvtepi32_ps(x);
}
static inline zv zv_sub(zv a, zv b)
{
    return _mm256_sub_ps(a, b);
}
/* Two 8-entry permutes, chosen by bit 3 of the index (moved to the sign). */
static inline zv zv_lut16(const float *t, zi idx)
{
    zv lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(t), idx);
    zv hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(t + 8), idx);
    return _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}
static inline zi zi_lut16(const int32_t *t, zi idx)
{
    return _mm256_castps_si256(zv_lut16((const float *)t, idx));
}
/* Four 8-entry permutes and two selections (bits 3 and 4): no gather. */
static inline zi zi_lut32(const int32_t *t, zi idx)
{
    __m256 lo = _mm256_castsi256_ps(zi_lut16(t, idx)),
           hi = _mm256_castsi256_ps(zi_lut16(t + 16, idx));
    return _mm256_castps_si256(
        _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 27))));
}
static inline zi zi_subs_u16(zi a, zi b)
{
    return _mm256_subs_epu16(a, b);
}
/* d + x where bits is negative and d is not 0 (d >= 0). */
static inline zi zi_add_if_neg_nz(zi d, zi bits, int32_t x)
{
    __m256i m = _mm256_and_si256(_mm256_srai_epi32(bits, 31),
                                 _mm256_cmpgt_epi32(d, _mm256_setzero_si256()));
    return _mm256_add_epi32(d, _mm256_and_si256(m, _mm256_set1_epi32(x)));
}
/* Four vectors of codes 0..255 (after zi_max with 0) to 32 bytes in lane
 * order: two saturating packs interleave the 128-bit lanes, one permute
 * puts them back. */
static inline void zi_st8x4(uint8_t *p, zi a, zi b, zi c, zi d)
{
    __m256i w = _mm256_packs_epi32(a, b), x = _mm256_packs_epi32(c, d);
    __m256i y = _mm256_packus_epi16(w, x);
    _mm256_storeu_si256((__m256i *)p,
                        _mm256_permutevar8x32_epi32(y, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}
#define zi_opaque(x) __asm__ volatile("" : "+x"(x))

#define ZV_TABLE zo_optim_kernels_avx2
#define ZV_NAME  "avx2"
#include "adam_simd.h"
#endif
