/* Test helper for the 8-bit encoder: each SIMD level's codes against the
 * scalar level's, through the optimizer's test hook. */
#ifndef ZO_TEST_Q8_CODES_H
#define ZO_TEST_Q8_CODES_H

#include "adam_ref.h"
#include "zo/cpu.h"
#include "zo/optim_testing.h"

/* Codes of x[0..n) at each level in levels (those this CPU runs) equal
 * the scalar level's; returns the scalar's in want. */
static inline void codes_equal_scalar(const float *x, size_t n, int is_signed,
                                      const zo_simd_level *levels, int nlevels, uint8_t *want)
{
    uint8_t *got = xcalloc(n, 1);
    ZO_ASSERT_OK(zo_test_adam_q8_encode(ZO_SIMD_SCALAR, x, n, is_signed, want));
    for (int k = 0; k < nlevels; k++) {
        if (!zo_cpu_simd_supported(levels[k]))
            continue;
        ZO_ASSERT_OK(zo_test_adam_q8_encode((int)levels[k], x, n, is_signed, got));
        for (size_t i = 0; i < n; i++)
            if (got[i] != want[i])
                fail_msg("%s %s: %a encoded as %u, scalar %u", zo_simd_level_name(levels[k]),
                         is_signed ? "signed" : "unsigned", (double)x[i], got[i], want[i]);
    }
    free(got);
}

#endif
