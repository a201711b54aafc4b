/* The fused attention's exp on the cpu device (cpu_exp.h): exp(x - shift)
 * against exp in double within 2 ulp over the arguments the softmax gives
 * it (scores minus their row's maximum or log-sum-exp: -100..0, and a
 * little above 0 from rounding), exactly 0 below ln FLT_MIN and at -inf, a
 * NaN kept; and the AVX2 and AVX-512 variants bit for bit the scalar
 * reference, at every length (the tail runs the reference), where the CPU
 * has them. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_exp.h"
#include "zo/cpu.h"
#include "zo_test.h"

#define N 4099 /* not a multiple of 16 */

static double uniform(uint64_t *rng)
{
    return (double)(zo_test_rand(rng) >> 11) / 9007199254740992.0;
}

static void fill(float *x, int n, uint64_t *rng)
{
    for (int i = 0; i < n; i++) /* -100..+0.5, dense near 0 */
        x[i] = (float)(-100.0 * pow(uniform(rng), 3.0) + 0.5 * uniform(rng));
}

static double ulps(float got, double want)
{
    double ulp = ldexp(1.0, ilogb((float)want) - 23);
    return fabs((double)got - want) / ulp;
}

static void test_exp_within_2_ulp(void **state)
{
    uint64_t rng = 5;
    float x[N], y[N];
    fill(x, N, &rng);
    memcpy(y, x, sizeof x);
    const float shift = 0.25f;
    zo_cpu_exp_shifted_at(ZO_SIMD_SCALAR, y, N, shift);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        float arg = x[i] - shift;
        double want = exp((double)arg);
        if (arg < ZO_EXP_LO) {
            if (y[i] != 0.0f)
                fail_msg("exp(%.9g) = %.9g, expected 0 below ln FLT_MIN", (double)arg,
                         (double)y[i]);
            continue;
        }
        double e = ulps(y[i], want);
        if (!(e <= 2.0))
            fail_msg("exp(%.9g) = %.9g, exp in double %.17g: %.2f ulp", (double)arg, (double)y[i],
                     want, e);
        worst = e > worst ? e : worst;
    }
    printf("exp: %.2f ulp at most over %d arguments\n", worst, N);
    float special[3] = {-INFINITY, NAN, 0.0f};
    zo_cpu_exp_shifted_at(ZO_SIMD_SCALAR, special, 3, 0.0f);
    assert_true(special[0] == 0.0f && !signbit(special[0]));
    assert_true(isnan(special[1]));
    assert_true(special[2] == 1.0f);
}

/* The variant at `level` bit for bit the scalar reference at every tail
 * length and a long row, -inf, NaN and the underflow edge included. */
static void check_level_equals_reference(int level, const char *name)
{
    if (!zo_cpu_simd_supported((zo_simd_level)level)) {
        printf("skipped: this CPU has no %s\n", name);
        skip();
    }
    uint64_t rng = 9;
    float x[N], a[N], b[N];
    fill(x, N, &rng);
    x[3] = -INFINITY, x[20] = NAN, x[33] = -87.0f, x[34] = -88.0f;
    for (int n = 0; n <= 40; n++) { /* every tail length, then a long row */
        int len = n <= 33 ? n : N - (40 - n);
        memcpy(a, x, sizeof x);
        memcpy(b, x, sizeof x);
        zo_cpu_exp_shifted_at(ZO_SIMD_SCALAR, a, len, 1.5f);
        zo_cpu_exp_shifted_at(level, b, len, 1.5f);
        if (memcmp(a, b, sizeof a) != 0)
            fail_msg("%s and scalar bits differ at length %d", name, len);
    }
}

static void test_avx2_equals_the_reference(void **state)
{
    check_level_equals_reference(ZO_SIMD_AVX2, "AVX2");
}

static void test_avx512_equals_the_reference(void **state)
{
    check_level_equals_reference(ZO_SIMD_AVX512, "AVX-512");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exp_within_2_ulp),
        cmocka_unit_test(test_avx2_equals_the_reference),
        cmocka_unit_test(test_avx512_equals_the_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
