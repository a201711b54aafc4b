/* ZeRO in the overlap and dpu modes, every stage, states on the host and on
 * NVMe, with clipping and an overflow: bitwise one rank accumulating in the
 * same mode. Under mpirun with 1, 2 and 4 ranks. */
#include "zero_harness.h"

static void overlap_as(int stage, zo_tier oh, float max_norm, int poison_step)
{
    zcfg z = {ZO_TIER_HOST,
              oh,
              stage,
              max_norm,
              poison_step,
              1,
              0,
              0,
              0,
              0,
              ZO_OPTIM_OVERLAP,
              0,
              0,
              ZO_REDUCE_ORDER_GLOBAL};
    expect_exact_as(z);
}

static void overlap_stage1_host(void **state)
{
    (void)state;
    overlap_as(1, ZO_TIER_HOST, 0.0f, -1);
}

static void overlap_stage2_clipping_and_overflow(void **state)
{
    (void)state;
    overlap_as(2, ZO_TIER_NVME, 0.05f, 2);
}

static void overlap_stage3_host(void **state)
{
    (void)state;
    overlap_as(3, ZO_TIER_HOST, 0.05f, 1);
}

static void overlap_stage3_nvme(void **state)
{
    (void)state;
    overlap_as(3, ZO_TIER_NVME, 0.0f, -1);
}

/* dpu mode: each step's reduced gradients by parity, the delayed update on
 * the owners, their broadcast from its thread while the next step runs. */
static void dpu_as(int stage, zo_tier oh, float max_norm, int poison_step)
{
    zcfg z = {
        ZO_TIER_HOST,          oh, stage, max_norm, poison_step, 1, 0, 0, 0, 0, ZO_OPTIM_DPU, 0, 0,
        ZO_REDUCE_ORDER_GLOBAL};
    expect_exact_as(z);
}

static void dpu_stage1_host(void **state)
{
    (void)state;
    dpu_as(1, ZO_TIER_HOST, 0.0f, -1);
}

static void dpu_stage2_clipping_and_overflow(void **state)
{
    (void)state;
    dpu_as(2, ZO_TIER_NVME, 0.05f, 2);
}

static void dpu_stage3_host(void **state)
{
    (void)state;
    dpu_as(3, ZO_TIER_HOST, 0.05f, 1);
}

static void dpu_stage3_nvme(void **state)
{
    (void)state;
    dpu_as(3, ZO_TIER_NVME, 0.0f, -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(overlap_stage1_host),
        cmocka_unit_test(overlap_stage2_clipping_and_overflow),
        cmocka_unit_test(overlap_stage3_host),
        cmocka_unit_test(overlap_stage3_nvme),
        cmocka_unit_test(dpu_stage1_host),
        cmocka_unit_test(dpu_stage2_clipping_and_overflow),
        cmocka_unit_test(dpu_stage3_host),
        cmocka_unit_test(dpu_stage3_nvme),
    };
    return zero_run_tests("test_engine_zero_modes", tests, sizeof tests / sizeof tests[0]);
}
