/* ZeRO stages 1, 2 and 3 against one rank accumulating the ranks'
 * micro-batches, bitwise (losses, gradient norm, each owner's master weights),
 * with the optimizer states on the host, on NVMe and on the device, with
 * gradient clipping and an overflow injected on the last rank, a tight host
 * budget (gradients spilled), device caps over each rank's own chunks and
 * small chunks that persist whole; each rank's footprint holds the states of
 * its own chunks only, and no rank keeps 16-bit gradients beyond the pinned
 * ring; what ZeRO does not run yet is refused naming what works. Under mpirun
 * with 1, 2 and 4 ranks (label mpi). */
#include "zero_harness.h"

static void stage1_host(void **state)
{
    (void)state;
    expect_exact(ZO_TIER_HOST, ZO_TIER_HOST, 1, 0.0f, -1);
}

static void stage2_host(void **state)
{
    (void)state;
    expect_exact(ZO_TIER_HOST, ZO_TIER_HOST, 2, 0.0f, -1);
}

static void stage1_nvme(void **state)
{
    (void)state;
    expect_exact(ZO_TIER_HOST, ZO_TIER_NVME, 1, 0.0f, -1);
}

static void stage2_nvme(void **state)
{
    (void)state;
    expect_exact(ZO_TIER_HOST, ZO_TIER_NVME, 2, 0.0f, -1);
}

static void stage2_device(void **state)
{
    (void)state;
    expect_exact(ZO_TIER_DEVICE, ZO_TIER_DEVICE, 2, 0.0f, -1);
}

/* The norm from the owners' partials decides clipping on every rank alike;
 * an infinity on the last rank skips the update everywhere. */
static void stage2_clipping_and_overflow(void **state)
{
    (void)state;
    expect_exact(ZO_TIER_HOST, ZO_TIER_NVME, 2, 0.05f, 2);
}

/* A host budget of exactly the footprint: no rank's gradients wait for the
 * update (the host job reduces them to the owner as they come down), so
 * nothing spills and the budget holds. */
static void stage2_tight_host_budget(void **state)
{
    (void)state;
    zcfg z = {ZO_TIER_HOST,          ZO_TIER_NVME, 2, 0.0f, -1, 1, 0, 0, 0, 0, ZO_OPTIM_SYNC, 0, 0,
              ZO_REDUCE_ORDER_GLOBAL};
    zrun a;
    train(&z, &a);
    z.host_bytes = a.fp.pinned + a.fp.bytes[ZO_TIER_HOST] - a.fp.grad_host;
    close_run(&a);
    expect_exact_as(z);
}

/* Two micro-batches on each rank in the global order: round j's chain adds
 * the N ranks' j-th onto the running sum at the owner, bitwise one rank
 * summing all 2N in order, in every stage, placement and mode. */
static void stage3_host(void **state)
{
    (void)state;
    expect_exact(ZO_TIER_HOST, ZO_TIER_HOST, 3, 0.0f, -1);
}

static void stage3_nvme(void **state)
{
    (void)state;
    expect_exact(ZO_TIER_HOST, ZO_TIER_NVME, 3, 0.0f, -1);
}

static void stage3_device(void **state)
{
    (void)state;
    expect_exact(ZO_TIER_DEVICE, ZO_TIER_DEVICE, 3, 0.0f, -1);
}

/* param_caps.device over each rank's own chunks: its first three resident on
 * the device, the rest of its own in host memory, the others' gathered. */
static void stage3_device_cap_split(void **state)
{
    (void)state;
    zcfg z = {ZO_TIER_HOST,
              ZO_TIER_NVME,
              3,
              0.0f,
              -1,
              1,
              0,
              3 * CHUNK,
              0,
              0,
              ZO_OPTIM_SYNC,
              0,
              0,
              ZO_REDUCE_ORDER_GLOBAL};
    expect_exact_as(z);
}

/* Stages 1 and 2 with param_caps.device: every rank holds every chunk, the
 * first three resident on its device, reloaded after the owners' broadcasts. */
static void stage2_device_cap_split(void **state)
{
    (void)state;
    zcfg z = {ZO_TIER_HOST,
              ZO_TIER_NVME,
              2,
              0.05f,
              2,
              1,
              0,
              3 * CHUNK,
              0,
              0,
              ZO_OPTIM_SYNC,
              0,
              0,
              ZO_REDUCE_ORDER_GLOBAL};
    expect_exact_as(z);
    z.stage = 1;
    z.mode = ZO_OPTIM_OVERLAP;
    expect_exact_as(z);
}

static void stage3_clipping_and_overflow(void **state)
{
    (void)state;
    expect_exact(ZO_TIER_HOST, ZO_TIER_NVME, 3, 0.05f, 2);
}

/* The biases' chunks (64 elements) persist whole on every rank, the owner
 * broadcasting their updates; the weights' are gathered. Lookahead 0: each
 * fetch gathers its own layer only. */
static void stage3_small_chunks_persist(void **state)
{
    (void)state;
    zcfg z = {
        ZO_TIER_HOST,          ZO_TIER_HOST, 3, 0.05f, -1, 1, 0, 0, TM_D, 1, ZO_OPTIM_SYNC, 0, 0,
        ZO_REDUCE_ORDER_GLOBAL};
    expect_exact_as(z);
}

/* Stage 3 with param_home device: a rank's device holds its own chunks for
 * good and, beyond them, slots for (lookahead + 1) layers of gathered ones:
 * measured by the device's allocator, about 1/N of the model plus those
 * (one rank: the whole model). */
static void stage3_device_params_are_a_share(void **state)
{
    (void)state;
    zcfg z = {ZO_TIER_DEVICE,        ZO_TIER_HOST, 3, 0.0f, -1, 1, 0, 0, 0, 1, ZO_OPTIM_SYNC, 0, 0,
              ZO_REDUCE_ORDER_GLOBAL};
    zrun a;
    train(&z, &a);
    uint64_t n = a.fp.n_chunks, K = a.fp.max_chunks_per_layer;
    uint64_t owned = n / (uint64_t)n_ranks + ((uint64_t)me < n % (uint64_t)n_ranks);
    uint64_t params = a.device_bytes - K * CHUNK; /* less the gradient slots */
    uint64_t want = n_ranks == 1 ? n : owned + K < n ? owned + K : n;
    assert_int_equal(params, want * CHUNK);
    assert_int_equal(a.fp.device_param_slots, want);
    if (n_ranks > 1)
        assert_true(params <= (n + n_ranks - 1) / n_ranks * CHUNK + K * CHUNK);
    if (n_ranks == 4)
        assert_true(params < n * CHUNK); /* 2 + 2 of 8 chunks */
    uint32_t homes[ZO_TIER_MAX];
    ZO_ASSERT_OK(zo_engine_homes(a.eng, homes, NULL));
    assert_int_equal(homes[ZO_TIER_DEVICE], n_ranks == 1 ? n : owned);
    close_run(&a);
}

/* Overlap mode: each owner updates its chunks speculatively on their reduced
 * gradients as they arrive; clipping and the overflow roll them back and
 * redo them on every owner alike. */
static void refused(zo_optim_mode mode, int stage, zo_tier ph, zo_status want, const char *names)
{
    zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
    c.device = dev;
    c.rank = me;
    c.world_size = 2;
    c.zero_stage = stage;
    c.mode = mode;
    c.param_home = ph;
    c.optim_home = ph == ZO_TIER_NVME ? ZO_TIER_NVME : ZO_TIER_HOST;
    c.comm = world;
    zo_engine_t e = NULL;
    assert_int_equal(zo_engine_init(&e, &c), want);
    assert_null(e);
    if (!strstr(zo_last_error(), names))
        fail_msg("expected \"%s\" in: %s", names, zo_last_error());
}

static void what_is_not_run_is_refused(void **state)
{
    (void)state;
    if (me > 1)
        return; /* the configs say world size 2 */
    refused(ZO_OPTIM_SYNC, 0, ZO_TIER_HOST, ZO_ERR_UNSUPPORTED, "use zero_stage 1, 2 or 3");
    /* the global order with layer-major groups, which sum on the device */
    zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
    c.device = dev;
    c.rank = me;
    c.world_size = 2;
    c.zero_stage = 2;
    c.comm = world;
    c.grad_accum_steps = 4;
    c.micro_group = 2;
    zo_engine_t e = NULL;
    assert_int_equal(zo_engine_init(&e, &c), ZO_ERR_UNSUPPORTED);
    assert_null(e);
    assert_non_null(strstr(zo_last_error(), "use micro_group 1"));
    assert_non_null(strstr(zo_last_error(), "reduce_order rank"));
    c.reduce_order = ZO_REDUCE_ORDER_RANK; /* the rank order keeps the groups */
    ZO_ASSERT_OK(zo_engine_init(&e, &c));
    zo_engine_free(e);
    c.reduce_order = (zo_reduce_order)7;
    assert_int_equal(zo_engine_init(&e, &c), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "reduce_order is 7"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stage1_host),
        cmocka_unit_test(stage2_host),
        cmocka_unit_test(stage1_nvme),
        cmocka_unit_test(stage2_nvme),
        cmocka_unit_test(stage2_device),
        cmocka_unit_test(stage2_clipping_and_overflow),
        cmocka_unit_test(stage2_tight_host_budget),
        cmocka_unit_test(stage3_host),
        cmocka_unit_test(stage3_nvme),
        cmocka_unit_test(stage3_device),
        cmocka_unit_test(stage3_device_cap_split),
        cmocka_unit_test(stage3_clipping_and_overflow),
        cmocka_unit_test(stage2_device_cap_split),
        cmocka_unit_test(stage3_small_chunks_persist),
        cmocka_unit_test(stage3_device_params_are_a_share),
        cmocka_unit_test(what_is_not_run_is_refused),
    };
    return zero_run_tests("test_engine_zero_stages", tests, sizeof tests / sizeof tests[0]);
}
