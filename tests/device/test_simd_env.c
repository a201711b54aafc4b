/* ZO_SIMD lowers the SIMD level the library uses (run with ZO_SIMD=scalar
 * in the environment; an earlier version deadlocked on first use). */
#include <stdlib.h>
#include <string.h>

#include "zo/cpu.h"
#include "zo_test.h"

static void test_env_lowers_level(void **state)
{
    (void)state;
    const char *want = getenv("ZO_SIMD");
    assert_non_null(want);
    assert_string_equal(zo_simd_level_name(zo_cpu_simd_level()), want);
    assert_true(zo_cpu_simd_detected() >= zo_cpu_simd_level());
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_env_lowers_level)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
