/* zoffload: hooks for tests and fault drills (the device's are in
 * zo/device_testing.h, kernels/device/testing). Not installed: tests and
 * tools get it from the zoffload_testing target, and link the library's
 * static parts, where these functions live (libzoffload.so does not export
 * them). */
#ifndef ZO_TESTING_H
#define ZO_TESTING_H

#include "zo/engine.h"
#include "zo/swap.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Faults armed when the engine opens its swap stores (arming any, even one
 * far in the future, lets zo_swap_set_faults re-arm later). Call between
 * zo_engine_init and zo_engine_finalize; the array is copied. */
zo_status zo_engine_set_swap_faults(zo_engine_t e, const zo_swap_fault *faults, size_t n);

/* The 8-bit Adam step's encoder of SIMD level simd_level (-1: the
 * library's) on n values already divided by their block's absmax: the codes
 * the step would store (zo/optim.h's maps; is_signed: m's). */
zo_status zo_test_adam_q8_encode(int simd_level, const float *x, size_t n, int is_signed,
                                 uint8_t *codes);

#ifdef __cplusplus
}
#endif
#endif
