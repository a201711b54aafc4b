/* fp32 <-> bf16/fp16 conversions of zo/half.h against references built from
 * double arithmetic (the nearest representable value, ties to even), and
 * against the x86 F16C instructions where the CPU has them. */
#include <math.h>
#include <stdlib.h>

#include "zo/half.h"
#include "zo_test.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* Nearest of two neighbours lo < hi (as doubles) to x; ties go to the one
 * whose code is even. */
static uint32_t nearest(double x, double lo, double hi, uint32_t lo_code, uint32_t hi_code)
{
    double dl = x - lo, dh = hi - x;
    if (dl < dh)
        return lo_code;
    if (dh < dl)
        return hi_code;
    return (lo_code & 1) ? hi_code : lo_code;
}

/* bf16 reference: the bf16 values bracketing |x| are its truncation and the
 * next code up. */
static uint16_t ref_bf16(float f)
{
    uint32_t u = zo_f32_bits(f);
    if (isnan(f))
        return 0; /* checked separately */
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    uint32_t lo = a >> 16, hi = lo + 1;
    if (lo == 0x7f80)
        return (uint16_t)(sign | 0x7f80); /* infinity */
    /* Above the largest finite bf16 the next step up is 2^128 (infinity). */
    double lov = zo_bits_f32(lo << 16),
           hiv = lo == 0x7f7f ? 0x1p128 : (double)zo_bits_f32(hi << 16);
    return (uint16_t)(sign | nearest(zo_bits_f32(a), lov, hiv, lo, hi));
}

/* The value of a finite non-negative fp16 code. */
static double half_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f;
    double mant = (double)(h & 0x3ff) + (e ? 1024.0 : 0.0);
    return ldexp(mant, (e ? e : 1) - 25);
}

/* fp16 reference: binary search over the 31744 finite non-negative codes,
 * which are ordered like their values. */
static uint16_t ref_f16(float f)
{
    double x = fabs((double)f);
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    if (x >= 65520.0)
        return (uint16_t)(sign | 0x7c00);
    uint32_t lo = 0, hi = 0x7bff;
    if (x >= half_value(0x7bff))
        return (uint16_t)(sign | nearest(x, half_value(0x7bff), 65536.0, 0x7bff, 0x7c00));
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (half_value((uint16_t)mid) <= x)
            lo = mid;
        else
            hi = mid;
    }
    return (uint16_t)(sign |
                      nearest(x, half_value((uint16_t)lo), half_value((uint16_t)hi), lo, hi));
}

static float random_float(uint64_t *s)
{
    uint32_t u = (uint32_t)zo_test_rand(s);
    /* Half the draws land near the 16-bit rounding points (low bits 0x8000
     * or 0x1000 patterns) where ties and carries happen. */
    switch (u & 3) {
    case 0: u = (u & 0xffff0000u) | 0x8000u; break;
    case 1: u = (u & 0xffffe000u) | 0x1000u; break;
    default: break;
    }
    return zo_bits_f32(u);
}

static void test_bf16_rounding(void **state)
{
    uint64_t s = 1;
    for (int i = 0; i < 2000000; i++) {
        float f = random_float(&s);
        uint16_t h = zo_f32_to_bf16(f);
        if (isnan(f)) {
            assert_true(isnan(zo_bf16_to_f32(h)));
            assert_int_equal(h & 0x8000, (zo_f32_bits(f) >> 16) & 0x8000);
            continue;
        }
        if (h != ref_bf16(f))
            fail_msg("bf16(%a = 0x%08x) = 0x%04x, expected 0x%04x", f, zo_f32_bits(f), h,
                     ref_bf16(f));
    }
    /* A NaN whose payload lies only in the dropped bits stays NaN. */
    assert_true(isnan(zo_bf16_to_f32(zo_f32_to_bf16(zo_bits_f32(0x7f800001u)))));
    assert_true(isnan(zo_bf16_to_f32(zo_f32_to_bf16(zo_bits_f32(0xffffffffu)))));
    assert_int_equal(zo_f32_to_bf16(zo_bits_f32(0x7f7fffffu)), 0x7f80); /* FLT_MAX rounds to inf */
    assert_int_equal(zo_f32_to_bf16(zo_bits_f32(0x00000001u)),
                     0x0000); /* subnormal kept, rounds to 0 */
    assert_int_equal(zo_f32_to_bf16(zo_bits_f32(0x00018000u)), 0x0002); /* tie to even, subnormal */
}

static void test_bf16_exhaustive_round_trip(void **state)
{
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = zo_bf16_to_f32((uint16_t)h);
        assert_int_equal(zo_f32_bits(f), h << 16);
        uint16_t back = zo_f32_to_bf16(f);
        if (isnan(f))
            assert_int_equal(back, h | 0x40);
        else
            assert_int_equal(back, h);
    }
}

static void test_f16_rounding(void **state)
{
    uint64_t s = 2;
    for (int i = 0; i < 1000000; i++) {
        float f = random_float(&s);
        if ((i & 1) && isnormal(f))
            f = ldexpf(f, -ilogbf(f) + (int)(zo_test_rand(&s) % 48) - 30); /* fp16 range */
        uint16_t h = zo_f32_to_f16(f);
        if (isnan(f)) {
            assert_true(isnan(zo_f16_to_f32(h)));
            continue;
        }
        if (h != ref_f16(f))
            fail_msg("f16(%a) = 0x%04x, expected 0x%04x", f, h, ref_f16(f));
    }
}

static void test_f16_exhaustive_widening(void **state)
{
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = zo_f16_to_f32((uint16_t)h);
        uint32_t e = (h >> 10) & 0x1f;
        if (e == 0x1f) {
            assert_true((h & 0x3ff) ? isnan(f) : isinf(f));
        } else {
            double v = half_value((uint16_t)(h & 0x7fff));
            assert_true((double)fabsf(f) == v);
            assert_int_equal(signbit(f) != 0, (h & 0x8000) != 0);
            assert_int_equal(zo_f32_to_f16(f), h); /* exact round trip */
        }
    }
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) static uint16_t hw_f16(float f)
{
    return (uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0);
}
__attribute__((target("f16c"))) static float hw_f32(uint16_t h)
{
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}
#endif

/* F16C agrees bit for bit, NaNs included: the SIMD variants use it. */
static void test_f16_matches_f16c(void **state)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2")) {
        print_message("skipped: this CPU has no F16C\n");
        skip();
    }
    uint64_t s = 3;
    for (int i = 0; i < 1000000; i++) {
        float f = random_float(&s);
        if ((i & 1) && isnormal(f))
            f = ldexpf(f, -ilogbf(f) + (int)(zo_test_rand(&s) % 48) - 30);
        if (zo_f32_to_f16(f) != hw_f16(f))
            fail_msg("f16(0x%08x): 0x%04x, F16C 0x%04x", zo_f32_bits(f), zo_f32_to_f16(f),
                     hw_f16(f));
    }
    for (uint32_t h = 0; h < 0x10000; h++) {
        float a = zo_f16_to_f32((uint16_t)h), b = hw_f32((uint16_t)h);
        if (zo_f32_bits(a) != zo_f32_bits(b))
            fail_msg("widen 0x%04x: 0x%08x, F16C 0x%08x", h, zo_f32_bits(a), zo_f32_bits(b));
    }
#else
    print_message("skipped: F16C is x86 only\n");
    skip();
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_rounding),    cmocka_unit_test(test_bf16_exhaustive_round_trip),
        cmocka_unit_test(test_f16_rounding),     cmocka_unit_test(test_f16_exhaustive_widening),
        cmocka_unit_test(test_f16_matches_f16c),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
