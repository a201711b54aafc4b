/* Budgets are hard limits, checked before anything is allocated: a plan
 * one byte over the device, pinned or host budget is refused by
 * zo_engine_plan and by finalize, naming the tier and the shortfall; at
 * the budget a run stays within it and trains as the unlimited run; a
 * failed finalize releases everything and can be retried. */
#include <unistd.h>

#include "engine_harness.h"

static void test_impossible_plans_are_refused_up_front(void **state)
{
    (void)state;
    run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_NVME, ZO_OPTIM_OVERLAP);
    c.device_bytes = min_device_bytes() - 1;
    expect_refusal(&c, ZO_ERR_OUT_OF_DEVICE_MEMORY, "device tier");

    /* the plan predicts exactly what finalize allocates; one byte less pinned is refused */
    c.device_bytes = 0;
    zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
    int fits = 0;
    char msg[512];
    harness h;
    harness_open(&h, &c);
    ZO_ASSERT_OK(make_engine(&h, NULL, 0));
    ZO_ASSERT_OK(zo_engine_plan(h.eng, &fp, &fits, msg, sizeof msg));
    assert_true(fits);
    harness_close(&h);
    assert_int_equal(fp.n_chunks, 2 * TM_L);
    assert_int_equal(fp.max_chunks_per_layer, 2);
    assert_int_equal(fp.chunk_bytes, CHUNK);
    /* two 16-bit copies, the gradient ring (lookahead 2 + 2), the stages and their room for
     * gradients read back: states on NVMe keep no whole-model gradient mirror */
    assert_int_equal(fp.pinned, 2 * fp.n_chunks * CHUNK + 4 * CHUNK + 3 * 6 * CHUNK + 3 * CHUNK);
    assert_int_equal(fp.grad_host, fp.n_chunks * CHUNK);
    assert_int_equal(fp.bytes[ZO_TIER_NVME], 2ull * fp.n_chunks * 6 * CHUNK);
    c.pinned_bytes = fp.pinned - 1;
    expect_refusal(&c, ZO_ERR_BUDGET, "pinned tier");
    c.pinned_bytes = fp.pinned; /* exactly the plan: fits, and the run stays within it */
    c.steps = 3;
    run_out o;
    run(&c, &o);
    run_out_free(&o);

    /* zo_engine_plan says no before finalize, naming the tier and the shortfall */
    c.device_bytes = min_device_bytes() - 1;
    harness_open(&h, &c);
    ZO_ASSERT_OK(build_engine(&h, NULL, 0, 0));
    ZO_ASSERT_OK(zo_engine_plan(h.eng, &fp, &fits, msg, sizeof msg));
    assert_false(fits);
    if (!strstr(msg, "device tier") || !strstr(msg, "short by 1 bytes"))
        fail_msg("plan message: %s", msg);
    harness_close(&h);

    /* a device_bytes beyond what the device has free is held to what is free */
    c.device_bytes = 1ull << 40;
    harness_open(&h, &c);
    void *hog;
    ZO_ASSERT_OK(zo_device_malloc(h.dev, (64u << 20) - min_device_bytes() + 1, &hog));
    ZO_ASSERT_ST(make_engine(&h, NULL, 0), ZO_ERR_OUT_OF_DEVICE_MEMORY);
    if (!strstr(zo_last_error(), "device tier") || !strstr(zo_last_error(), "short by 1 bytes"))
        fail_msg("refusal message: %s", zo_last_error());
    ZO_ASSERT_OK(zo_device_mfree(h.dev, hog));
    harness_close(&h);

    /* a failure while finalizing (the device refuses an allocation) releases
     * everything, keeps the registration, and finalize can be retried */
    c = base_cfg(ZO_TIER_HOST, ZO_TIER_NVME, ZO_OPTIM_SYNC);
    for (int nfaults = 1; nfaults <= 2; nfaults++) { /* the next nfaults allocations fail */
        harness_open(&h, &c);
        ZO_ASSERT_OK(build_engine(&h, NULL, 0, 0));
        ZO_ASSERT_OK(zo_device_inject_fault(h.dev, ZO_FAULT_DEVICE_MALLOC, nfaults));
        ZO_ASSERT_ST(zo_engine_finalize(h.eng), ZO_ERR_OUT_OF_DEVICE_MEMORY);
        zo_device_mem_stats ms;
        ZO_ASSERT_OK(zo_device_mem_get_stats(h.dev, &ms));
        assert_int_equal(ms.in_use, 0);
        if (nfaults == 2)
            ZO_ASSERT_ST(zo_engine_finalize(h.eng), ZO_ERR_OUT_OF_DEVICE_MEMORY);
        ZO_ASSERT_OK(zo_engine_finalize(h.eng));
        double loss;
        zo_step_stats st;
        ZO_ASSERT_OK(train_step(&h, 0, &loss, &st));
        harness_close(&h);
    }
    /* an NVMe directory that does not exist fails finalize with the swap store's message */
    harness_open(&h, &c);
    ZO_ASSERT_OK(build_engine(&h, NULL, 0, 0));
    rmdir(h.dir);
    assert_true(zo_engine_finalize(h.eng) < 0);
    assert_non_null(strstr(zo_last_error(), h.dir));
    harness_close(&h);

    /* more ranks are refused with a clear message, not silently run as one */
    zo_engine_config ec = ZO_ENGINE_CONFIG_INIT;
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    zo_device_t dev;
    ZO_ASSERT_OK(zo_device_init(&dev, &dc));
    ec.device = dev;
    ec.world_size = 2;
    zo_engine_t e = NULL;
    ZO_ASSERT_ST(zo_engine_init(&e, &ec), ZO_ERR_UNSUPPORTED);
    assert_null(e);
    zo_device_free(dev);
}

/* ---- the host tier's budget ---- */

/* The host budget is a hard limit like the device's: one byte short of the
 * plan's pinned + pageable bytes is refused (by zo_engine_plan and by
 * finalize) naming the host tier and the shortfall; at the budget a run's
 * measured peaks stay within it (run checks every step) and it trains as
 * the unlimited run does. */
static void test_host_budget(void **state)
{
    (void)state;
    run_cfg cases[3] = {base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_SYNC),
                        base_cfg(ZO_TIER_HOST, ZO_TIER_NVME, ZO_OPTIM_OVERLAP),
                        base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, ZO_OPTIM_DPU)};
    cases[2].accum = 2;
    for (int i = 0; i < 3; i++) {
        run_cfg c = cases[i];
        c.steps = 4;
        run_out free_run, at_budget;
        run(&c, &free_run);
        /* the least: gradients staged for NVMe states all spilled */
        uint64_t need =
            free_run.fp.pinned + free_run.fp.bytes[ZO_TIER_HOST] - free_run.fp.grad_host;
        c.host_bytes = need - 1;
        expect_refusal(&c, ZO_ERR_BUDGET, "host tier");
        harness h;
        harness_open(&h, &c);
        ZO_ASSERT_OK(build_engine(&h, NULL, 0, 0));
        zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
        int fits = 1;
        char msg[512];
        ZO_ASSERT_OK(zo_engine_plan(h.eng, &fp, &fits, msg, sizeof msg));
        assert_false(fits);
        if (!strstr(msg, "host tier") || !strstr(msg, "short by 1 bytes"))
            fail_msg("plan message: %s", msg);
        harness_close(&h);
        c.host_bytes = need;
        run(&c, &at_budget);
        assert_same_weights(&free_run, &at_budget, c.steps);
        run_out_free(&free_run);
        run_out_free(&at_budget);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_impossible_plans_are_refused_up_front),
        cmocka_unit_test(test_host_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
