/* Shared helpers for zoffload's CMocka tests. */
#ifndef ZO_TEST_H
#define ZO_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
/* cmocka.h needs the headers above first. */
#include <cmocka.h>

#include "zo/status.h"

/* The exit code ctest reads as "skipped" (SKIP_RETURN_CODE). */
#define ZO_TEST_SKIP 77

/* Assert a zoffload call returns st; prints the last error on failure. */
#define ZO_ASSERT_ST(call, st)                                                                     \
    do {                                                                                           \
        zo_status zo_t_st_ = (call);                                                               \
        if (zo_t_st_ != (st))                                                                      \
            fail_msg("%s returned %d (%s), expected %d: %s", #call, (int)zo_t_st_,                 \
                     zo_status_str(zo_t_st_), (int)(st), zo_last_error());                         \
    } while (0)

#define ZO_ASSERT_OK(call) ZO_ASSERT_ST(call, ZO_OK)

/* A small deterministic generator (splitmix64) for reproducible tests. */
static inline uint64_t zo_test_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#endif
