/* Device-resident parameters over NVMe states keep their committed
 * 16-bit copy on NVMe, not pinned: bitwise as states on the host in
 * every mode, pinned memory only the staging; EIO and a flipped byte on
 * that copy fail the step, whose retry reloads from the master. */
#include <stdatomic.h>

#include "engine_harness.h"

/* Device-resident parameters with states on NVMe keep no pinned 16-bit
 * copy: the update writes the new values beside the states on NVMe, the
 * slot is reloaded from there at its next fetch. Bitwise as states on the
 * host in sync, overlap (with overflows, and with clipping) and dpu modes;
 * pinned memory is the staging only: the gradient ring and its read-back
 * room, the stages (states and the 16-bit values' room), the twins. */
static void test_resident_params_copy_on_nvme(void **state)
{
    (void)state;
    for (int m = 0; m < 4; m++) {
        zo_optim_mode mode = m == 3 ? ZO_OPTIM_DPU : m ? ZO_OPTIM_OVERLAP : ZO_OPTIM_SYNC;
        run_cfg c = base_cfg(ZO_TIER_DEVICE, ZO_TIER_HOST, mode);
        c.steps = 8;
        c.dtype = ZO_DTYPE_F16;
        c.poison_steps = (1u << 2) | (1u << 5);
        c.max_norm = m == 2 ? 0.05f : 0.0f;
        run_out ref, o;
        run(&c, &ref);
        c.optim_home = ZO_TIER_NVME;
        run(&c, &o);
        assert_same_weights(&ref, &o, c.steps);
        for (int s = 0; s < c.steps; s++)
            assert_true(ref.losses[s] == o.losses[s]);
        assert_int_equal(o.fp.param_staging, 4 * CHUNK); /* lookahead 2: 4 twins */
        assert_int_equal(o.fp.pinned,
                         o.fp.grad_pinned + o.fp.grad_stage + 3 * (6 * CHUNK + CHUNK) + 4 * CHUNK);
        assert_int_equal(o.fp.bytes[ZO_TIER_NVME],
                         2ull * N_CHUNKS * zo_engine_nvme_state_bytes(TM_D * TM_D) +
                             2ull * N_CHUNKS * P16_EXTENT);
        run_out_free(&ref);
        run_out_free(&o);
    }
}

/* NVMe faults on that path: an EIO on the 16-bit store (a reload at a
 * fetch, a write of the update) or on the states' store fails the step with
 * the weights intact; a flipped byte in a committed 16-bit copy fails the
 * next step's reload, whose retry reloads from the master; every retry
 * trains as the run without faults, in sync and overlap modes. */
static void test_resident_params_nvme_faults(void **state)
{
    (void)state;
    for (int m = 0; m < 2; m++) {
        run_cfg c = base_cfg(ZO_TIER_DEVICE, ZO_TIER_NVME, m ? ZO_OPTIM_OVERLAP : ZO_OPTIM_SYNC);
        c.steps = 8;
        run_out ref;
        run(&c, &ref);
        corrupter k = {0};
        k.store = 1;
        c.trace = corrupt_on_write;
        c.trace_ctx = &k;
        harness h;
        harness_open(&h, &c);
        zo_swap_fault never = {ZO_SWAP_FAULT_EIO, UINT64_MAX, 0};
        ZO_ASSERT_OK(make_engine(&h, &never, 1));
        zo_swap_t store = zo_engine_nvme_param_store(h.eng);
        assert_non_null(store);
        corrupter_locate(&k, store);
        double losses[8];
        zo_step_stats st;
        uint64_t per_step = 0;
        for (int s = 0; s < c.steps; s++) {
            if (s == 2) /* the update's last write of a 16-bit copy (step 1 was clean) */
                fail_request(&h, store, s, per_step - 1);
            if (s == 3) /* a reload at the first fetch: the retry reloads from the master */
                fail_request(&h, store, s, 0);
            if (s == 4)
                fail_step_at(&h, zo_engine_nvme_store(h.eng), s);
            if (s == 5)
                atomic_store(&k.armed, 1); /* this step's update writes a copy, then it flips */
            if (s == 6) {
                assert_int_equal(atomic_load(&k.armed), 0);
                float *before[TM_T];
                read_masters(&h, before);
                ZO_ASSERT_ST(failing_step(&h, s, before), ZO_ERR_CORRUPT);
            }
            zo_swap_stats a = ZO_SWAP_STATS_INIT, b = ZO_SWAP_STATS_INIT;
            ZO_ASSERT_OK(zo_swap_get_stats(store, &a));
            ZO_ASSERT_OK(train_step(&h, s, &losses[s], &st));
            ZO_ASSERT_OK(zo_swap_get_stats(store, &b));
            per_step = b.requests - a.requests;
            assert_true(per_step > 0);
        }
        close_and_compare(&h, losses, &ref, c.steps);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resident_params_copy_on_nvme),
        cmocka_unit_test(test_resident_params_nvme_faults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
