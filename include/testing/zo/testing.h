/* zoffload: the engine's hook for tests and fault drills: NVMe faults armed
 * when the engine opens its swap stores, so that every error path of the
 * NVMe tier can be exercised through the engine. Not installed: test
 * programs get it from the zoffload_testing target. The other parts keep
 * their hooks in headers of their own (zo/device_testing.h in
 * kernels/device/testing, zo/optim_testing.h in optim/testing); this one
 * joins the engine's folder when the engine's files are next rearranged. */
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

#ifdef __cplusplus
}
#endif
#endif
