/* The optimizer's test hooks (zo/optim_testing.h): the 8-bit encoder of
 * each SIMD variant, on its own, for the tests that hold every variant to
 * the scalar one; the step through a state format's codec. */
#include "zo/optim_testing.h"
#include "optim_internal.h"
#include "zo_internal.h"

zo_status zo_test_adam_q8_encode(int simd_level, const float *x, size_t n, int is_signed,
                                 uint8_t *codes)
{
    const zo_optim_kernels *k;
    ZO_TRY(zo_optim_kernels_get(simd_level, &k));
    if (n && (!x || !codes))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim", "zo_test_adam_q8_encode: %s is NULL",
                       !x ? "x" : "codes");
    k->q8_encode(x, n, is_signed != 0, codes);
    return ZO_OK;
}

zo_status zo_test_adam_step_unfused(const zo_adam_params *p, const zo_adam_buffers *b)
{
    zo_adam_consts c;
    const zo_optim_kernels *k;
    ZO_TRY(zo_adam_consts_make(p, &c));
    ZO_TRY(zo_adam_buffers_check(b));
    ZO_TRY(zo_optim_kernels_get(p->simd_level, &k));
    zo_adam_run_unfused(k, &c, b, 0, b->n);
    return ZO_OK;
}
