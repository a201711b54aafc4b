/* zoffload: the engine's hook for tests and fault drills: NVMe faults armed
 * when the engine opens its swap stores, so that every error path of the
 * NVMe tier can be exercised through the engine. Not installed, and not in
 * libzoffload: test programs get it from the zo_engine_testing target
 * (offload/engine/CMakeLists.txt); the engine keeps only the faults it is
 * given (struct zo_engine's faults), which no shipped caller sets. */
#ifndef ZO_ENGINE_TESTING_H
#define ZO_ENGINE_TESTING_H

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
