/* AVX-512 (F/BW/VL/CD + F16C) variant of the optimizer kernels. Compiled
 * with -mavx512f -mavx512bw -mavx512vl -mavx512cd -mfma -mf16c; with ZO_AVX512_NATIVE_BF16
 * defined (adam_avx512_bf16.c) the bf16 rounding uses VCVTNEPS2BF16. */
#if defined(__x86_64__)
#include <immintrin.h>

#include "optim_internal.h"

#define ZV_W 16
typedef __m512 zv;

static inline zv zv_set1(float x)
{
    return _mm512_set1_ps(x);
}
static inline zv zv_mul(zv a, zv b)
{
    return _mm512_mul_ps(a, b);
}
static inline zv zv_fma(zv a, zv b, zv c)
{
    return _mm512_fmadd_ps(a, b, c);
}
static inline zv zv_div(zv a, zv b)
{
    return _mm512_div_ps(a, b);
}
static inline zv zv_sqrt(zv a)
{
    return _mm512_sqrt_ps(a);
}
static inline zv zv_ld32(const float *p)
{
    return _mm512_loadu_ps(p);
}
static inline void zv_st32(float *p, zv x)
{
    _mm512_storeu_ps(p, x);
}

static inline zv zv_ldbf(const uint16_t *p)
{
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

#ifdef ZO_AVX512_NATIVE_BF16
/* VCVTNEPS2BF16 rounds to nearest even and quiets NaNs; it flushes fp32
 * subnormals to zero. */
static inline void zv_stbf(uint16_t *p, zv x)
{
    __m256bh h = _mm512_cvtneps_pbh(x);
    _mm256_storeu_si256((__m256i *)p, (__m256i)h);
}
#else
/* Round to nearest even by adding 0x7fff plus the kept lsb; NaNs are quieted
 * instead so that the carry cannot turn them into infinities. */
static inline void zv_stbf(uint16_t *p, zv x)
{
    __m512i u = _mm512_castps_si512(x);
    __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(r));
}
#endif

static inline zv zv_ldhf(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline void zv_sthf(uint16_t *p, zv x)
{
    _mm256_storeu_si256((__m256i *)p,
                        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

typedef struct {
    __m512d lo, hi;
} zacc;
static inline zacc zacc_zero(void)
{
    return (zacc){_mm512_setzero_pd(), _mm512_setzero_pd()};
}
static inline zacc zacc_add(zacc a, zv x)
{
    __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    return (zacc){_mm512_fmadd_pd(lo, lo, a.lo), _mm512_fmadd_pd(hi, hi, a.hi)};
}
static inline double zacc_sum(zacc a)
{
    double lanes[16];
    _mm512_storeu_pd(lanes, a.lo);
    _mm512_storeu_pd(lanes + 8, a.hi);
    double s = 0.0;
    for (int k = 0; k < 16; k++)
        s += lanes[k];
    return s;
}

typedef __m512i zr32;
typedef __m256i zr16;
static inline zr32 zr_ld32(const uint32_t *p)
{
    return _mm512_loadu_si512(p);
}
static inline void zr_st32(uint32_t *p, zr32 x)
{
    _mm512_storeu_si512(p, x);
}
static inline zr16 zr_ld16(const uint16_t *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}
static inline void zr_st16(uint16_t *p, zr16 x)
{
    _mm256_storeu_si256((__m256i *)p, x);
}
static inline zr16 zr_narrow(zr32 x)
{
    return _mm512_cvtepi32_epi16(x);
}
#define zr_opaque32(x) __asm__ volatile("" : "+v"(x))
#define zr_opaque16(x) __asm__ volatile("" : "+v"(x))

typedef __m512i zi;
static inline zi zi_set1(int32_t x)
{
    return _mm512_set1_epi32(x);
}
static inline zi zi_add(zi a, zi b)
{
    return _mm512_add_epi32(a, b);
}
static inline zi zi_sub(zi a, zi b)
{
    return _mm512_sub_epi32(a, b);
}
static inline zi zi_and(zi a, zi b)
{
    return _mm512_and_si512(a, b);
}
static inline zi zi_max(zi a, zi b)
{
    return _mm512_max_epi32(a, b);
}
static inline zi zi_min(zi a, zi b)
{
    return _mm512_min_epi32(a, b);
}
#define zi_srli(x, n) _mm512_srli_epi32(x, n)
static inline zi zi_bits(zv x)
{
    return _mm512_castps_si512(x);
}
static inline zv zv_bits(zi x)
{
    return _mm512_castsi512_ps(x);
}
static inline zi zi_inc_gt(zi d, zv a, zv b)
{
    return _mm512_mask_add_epi32(d, _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ), d, _mm512_set1_epi32(1));
}
static inline int32_t zi_hmax(zi x)
{
    return _mm512_reduce_max_epi32(x);
}
static inline zi zi_ld8(const uint8_t *p)
{
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}
static inline void zi_st8(uint8_t *p, zi x)
{
    _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8(x));
}
static inline zi zi_cvtt(zv x)
{
    return _mm512_cvttps_epi32(x);
}
static inline zv zv_from_int(zi x)
{
    return _mm512_cvtepi32_ps(x);
}
static inline zv zv_sub(zv a, zv b)
{
    return _mm512_sub_ps(a, b);
}
static inline zv zv_lut16(const float *t, zi idx)
{
    return _mm512_permutexvar_ps(idx, _mm512_loadu_ps(t));
}
static inline zi zi_lut16(const int32_t *t, zi idx)
{
    return _mm512_permutexvar_epi32(idx, _mm512_loadu_si512(t));
}
static inline zi zi_lut32(const int32_t *t, zi idx)
{
    return _mm512_permutex2var_epi32(_mm512_loadu_si512(t), idx, _mm512_loadu_si512(t + 16));
}
static inline zv zv_lut32(const float *t, zi idx)
{
    return _mm512_permutex2var_ps(_mm512_loadu_ps(t), idx, _mm512_loadu_ps(t + 16));
}
static inline zi zi_subs_u16(zi a, zi b)
{
    return _mm512_subs_epu16(a, b);
}
/* 32-entry lookups are single permutes here: the 8-bit encoder indexes a
 * negative moment's entries by level + 16 (zo_q8_map_tables). */
#define ZV_HAVE_LUT32 1
static inline zi zi_or_if_neg(zi d, zi bits, int32_t x)
{
    __mmask16 neg = _mm512_cmplt_epi32_mask(bits, _mm512_setzero_si512());
    return _mm512_mask_or_epi32(d, neg, d, _mm512_set1_epi32(x));
}
/* Codes 0..255 in 16-bit lanes, two packed vectors (in the packs' order,
 * which interleaves 128-bit lanes) to 64 bytes in lane order: one more
 * saturating pack, one permute puts the lanes back. */
static inline void zi_st8x4w(uint8_t *p, __m512i w, __m512i x)
{
    __m512i y = _mm512_packus_epi16(w, x);
    _mm512_storeu_si512(
        p, _mm512_permutexvar_epi32(
               _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), y));
}
/* The end of the 8-bit encoder for two vectors at once, in 16-bit lanes
 * (k and the entry index d of each, saturated to 16 bits by a pack: NaN's
 * INT_MIN becomes -32768, floored at 0 as before): the clamp to kmax and
 * the base from 32-entry word tables, one register each, in the packs'
 * order for zi_st8x4w. */
#define ZV_HAVE_Q8_W16 1
static inline __m512i zi_q8_finish2(const int16_t *kmax, const int16_t *base, zi k0, zi d0, zi k1,
                                    zi d1)
{
    __m512i k = _mm512_max_epi16(_mm512_packs_epi32(k0, k1), _mm512_setzero_si512());
    __m512i d = _mm512_packs_epi32(d0, d1);
    k = _mm512_min_epi16(k, _mm512_permutexvar_epi16(d, _mm512_loadu_si512(kmax)));
    return _mm512_add_epi16(k, _mm512_permutexvar_epi16(d, _mm512_loadu_si512(base)));
}
/* For the 8-bit decoder: a count of leading zeros per lane. */
#define ZV_HAVE_LZCNT 1
static inline zi zi_lzcnt(zi x)
{
    return _mm512_lzcnt_epi32(x);
}
static inline zi zi_srlv(zi x, zi n)
{
    return _mm512_srlv_epi32(x, n);
}
/* a ^ (b & c) */
static inline zi zi_xor_and(zi a, zi b, zi c)
{
    return _mm512_ternarylogic_epi32(a, b, c, 0x78);
}
#define zi_opaque(x) __asm__ volatile("" : "+v"(x))

#ifdef ZO_AVX512_NATIVE_BF16
/* The 8-bit decoder, 64 codes at a time, with VBMI's byte permutes: each
 * of a value's four bytes is a 256-entry byte table (zo_q8_tables'
 * map_bytes), looked up as two 128-entry halves (VPERMI2B) chosen by the
 * code's top bit; two rounds of unpacks put the bytes together. Unpacks
 * work within 128-bit lanes, so the codes are first put in the order that
 * leaves values in element order: byte 16L + 4g + r is code 16g + 4L + r.
 * The values are exactly the map's, as zv_q8_unit's are. */
#define ZV_HAVE_Q8_UNIT64 1
static const uint8_t zv_q8_unit64_order[64] __attribute__((aligned(64))) = {
    0,  1,  2,  3,  16, 17, 18, 19, 32, 33, 34, 35, 48, 49, 50, 51, 4,  5,  6,  7,  20, 21,
    22, 23, 36, 37, 38, 39, 52, 53, 54, 55, 8,  9,  10, 11, 24, 25, 26, 27, 40, 41, 42, 43,
    56, 57, 58, 59, 12, 13, 14, 15, 28, 29, 30, 31, 44, 45, 46, 47, 60, 61, 62, 63};

/* The level of the lower edge of a magnitude's pair of binades, from its
 * top byte (a 128-entry byte table: index bytes 1-3 are 0 and read entry
 * 0, level 0, so each lane holds the level). */
#define ZV_HAVE_Q8_BIBINADE 1
static inline zi zi_q8_bibinade_level(const uint8_t *tbl, zi a)
{
    return _mm512_permutex2var_epi8(_mm512_load_si512(tbl), _mm512_srli_epi32(a, 24),
                                    _mm512_load_si512(tbl + 64));
}

static inline __m512i zv_q8_byte_plane(const uint8_t *plane, __m512i codes, __mmask64 upper)
{
    __m512i lo =
        _mm512_permutex2var_epi8(_mm512_load_si512(plane), codes, _mm512_load_si512(plane + 64));
    __m512i hi = _mm512_permutex2var_epi8(_mm512_load_si512(plane + 128), codes,
                                          _mm512_load_si512(plane + 192));
    return _mm512_mask_blend_epi8(upper, lo, hi);
}

static inline void zv_q8_unit64(const uint8_t planes[4][256], const uint8_t *codes, zv out[4])
{
    __m512i c =
        _mm512_permutexvar_epi8(_mm512_load_si512(zv_q8_unit64_order), _mm512_loadu_si512(codes));
    __mmask64 upper = _mm512_movepi8_mask(c);
    __m512i b0 = zv_q8_byte_plane(planes[0], c, upper), b1 = zv_q8_byte_plane(planes[1], c, upper);
    __m512i b2 = zv_q8_byte_plane(planes[2], c, upper), b3 = zv_q8_byte_plane(planes[3], c, upper);
    __m512i l01 = _mm512_unpacklo_epi8(b0, b1), h01 = _mm512_unpackhi_epi8(b0, b1);
    __m512i l23 = _mm512_unpacklo_epi8(b2, b3), h23 = _mm512_unpackhi_epi8(b2, b3);
    out[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(l01, l23));
    out[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(l01, l23));
    out[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(h01, h23));
    out[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(h01, h23));
}
#endif

#ifdef ZO_AVX512_NATIVE_BF16
#define ZV_TABLE zo_optim_kernels_avx512_bf16
#define ZV_NAME  "avx512_bf16"
#else
#define ZV_TABLE zo_optim_kernels_avx512
#define ZV_NAME  "avx512"
#endif
#include "adam_simd.h"
#endif
