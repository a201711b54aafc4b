/* ZeRO with ranks accumulating two micro-batches each (rank r the step's
 * micro-batches r and N + r): equal to one rank with 2N bitwise in the global
 * reduction order, in every stage, placement and mode (no fp32
 * accumulators), and within rounding in the rank order (rank r the
 * micro-batches 2r and 2r + 1). Under mpirun with 1, 2 and 4 ranks. */
#include "zero_harness.h"

static void accumulating_as(int stage, zo_tier ph, zo_tier oh, float max_norm, int poison_step,
                            zo_optim_mode mode)
{
    zcfg z = {ph, oh, stage, max_norm, poison_step, 2, 0,
              0,  0,  0,     mode,     0,           0, ZO_REDUCE_ORDER_GLOBAL};
    expect_exact_as(z);
}

static void accumulating_stages_host(void **state)
{
    (void)state;
    accumulating_as(1, ZO_TIER_HOST, ZO_TIER_HOST, 0.0f, -1, ZO_OPTIM_SYNC);
    accumulating_as(2, ZO_TIER_HOST, ZO_TIER_HOST, 0.0f, -1, ZO_OPTIM_SYNC);
    accumulating_as(3, ZO_TIER_HOST, ZO_TIER_HOST, 0.0f, -1, ZO_OPTIM_SYNC);
}

static void accumulating_nvme_device_clipping(void **state)
{
    (void)state;
    accumulating_as(2, ZO_TIER_HOST, ZO_TIER_NVME, 0.05f, 2, ZO_OPTIM_SYNC);
    accumulating_as(3, ZO_TIER_HOST, ZO_TIER_NVME, 0.0f, -1, ZO_OPTIM_SYNC);
    accumulating_as(2, ZO_TIER_DEVICE, ZO_TIER_DEVICE, 0.0f, -1, ZO_OPTIM_SYNC);
    if (n_ranks > 1) /* 16-bit parameters on NVMe (one rank keeps them in host memory) */
        accumulating_as(3, ZO_TIER_NVME, ZO_TIER_NVME, 0.0f, -1, ZO_OPTIM_SYNC);
}

static void accumulating_overlap_dpu(void **state)
{
    (void)state;
    accumulating_as(1, ZO_TIER_HOST, ZO_TIER_HOST, 0.05f, 1, ZO_OPTIM_OVERLAP);
    accumulating_as(3, ZO_TIER_HOST, ZO_TIER_NVME, 0.05f, 2, ZO_OPTIM_OVERLAP);
    accumulating_as(2, ZO_TIER_HOST, ZO_TIER_NVME, 0.05f, 2, ZO_OPTIM_DPU);
    accumulating_as(3, ZO_TIER_HOST, ZO_TIER_HOST, 0.0f, -1, ZO_OPTIM_DPU);
}

/* Two micro-batches on each rank in the rank order: each rank's sum first,
 * then the ranks' in rank order, against one rank summing all 2N in order:
 * equal within rounding (the same order for every placement and stage). */
static void accumulating_ranks_agree_within_rounding(void **state)
{
    (void)state;
    zcfg z = {ZO_TIER_HOST,        ZO_TIER_NVME, 2, 0.0f, -1, 2, 0, 0, 0, 0, ZO_OPTIM_SYNC, 0, 0,
              ZO_REDUCE_ORDER_RANK},
         ref = z;
    ref.stage = 0;
    zrun a, b;
    train(&z, &a);
    train(&ref, &b);
    for (int s = 0; s < STEPS; s++)
        if (fabs(a.losses[s] - b.losses[s]) > 1e-6 * fabs(b.losses[s]))
            fail_msg("loss of step %d: %.17g, one rank %.17g", s, a.losses[s], b.losses[s]);
    for (int k = 0; k < TM_T; k++) {
        if (zo_engine_tensor_owner(a.eng, a.ids[k]) != me)
            continue;
        size_t n = tm_numel(k);
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
        ZO_ASSERT_OK(zo_engine_read_master(a.eng, a.ids[k], x));
        ZO_ASSERT_OK(zo_engine_read_master(b.eng, b.ids[k], y));
        for (size_t i = 0; i < n; i++)
            if (fabsf(x[i] - y[i]) > 1e-4f)
                fail_msg("tensor %d element %zu: %.9g, one rank %.9g", k, i, x[i], y[i]);
        free(x);
        free(y);
    }
    close_run(&a);
    close_run(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(accumulating_ranks_agree_within_rounding),
        cmocka_unit_test(accumulating_stages_host),
        cmocka_unit_test(accumulating_nvme_device_clipping),
        cmocka_unit_test(accumulating_overlap_dpu),
    };
    return zero_run_tests("test_engine_zero_accum", tests, sizeof tests / sizeof tests[0]);
}
