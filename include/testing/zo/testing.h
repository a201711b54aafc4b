/* zoffload: hooks for tests and fault drills. They make chosen operations
 * fail as they would on a real machine (a full GPU, a refused pin, a failed
 * asynchronous kernel, a failed NVMe request) so that every error path can
 * be exercised. Not installed: tests and tools get it from the
 * zoffload_testing target, and link the library's static parts, where these
 * functions live (libzoffload.so does not export them). */
#ifndef ZO_TESTING_H
#define ZO_TESTING_H

#include "zo/device.h"
#include "zo/engine.h"
#include "zo/swap.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum zo_device_fault {
    ZO_FAULT_DEVICE_MALLOC = 0, /* zo_device_malloc fails with out of device memory */
    ZO_FAULT_HOST_REGISTER = 1, /* zo_device_host_register fails with ZO_ERR_PIN */
    ZO_FAULT_STREAM_TASK = 2,   /* the next enqueued task fails asynchronously */
    ZO_FAULT_COUNT_ = 3
} zo_device_fault;

/* Make the next `count` operations of that kind fail (0 disarms). */
zo_status zo_device_inject_fault(zo_device_t dev, zo_device_fault kind, int count);

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
