/* zoffload: the optimizer's hooks for tests. Not installed, and not in
 * libzoffload: test programs get them from the zo_optim_testing target
 * (optim/CMakeLists.txt). */
#ifndef ZO_OPTIM_TESTING_H
#define ZO_OPTIM_TESTING_H

#include <stddef.h>
#include <stdint.h>

#include "zo/optim.h"
#include "zo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The 8-bit Adam step's encoder of SIMD level simd_level (-1: the
 * library's) on n values already divided by their block's absmax: the codes
 * the step would store (zo/optim.h's maps; is_signed: m's). */
zo_status zo_test_adam_q8_encode(int simd_level, const float *x, size_t n, int is_signed,
                                 uint8_t *codes);

/* zo_adam_step through the state format's codec and the fp32 kernel, block
 * by block, as for a format the kernels do not update in place (fused 0),
 * whatever the format of b. */
zo_status zo_test_adam_step_unfused(const zo_adam_params *p, const zo_adam_buffers *b);

#ifdef __cplusplus
}
#endif
#endif
