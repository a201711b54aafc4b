/* Checkpoints of the full optimizer state: saved mid-run and loaded into
 * a fresh engine, a run resumes bitwise under every placement and mode;
 * the state calls refuse what they cannot do and survive a failed NVMe
 * write. */

#include "engine_harness.h"

/* Save the state at step 6 of 12, load it into a fresh engine, run steps
 * 6..11: losses and final weights equal the run that never stopped, bit for
 * bit, under every placement and mode (dpu flushes at the save, the
 * reference too), and with fp16's loss scaler after overflows. Leaving out
 * the moments or the step state breaks it (they are used). */
static void test_state_round_trip_resumes_bitwise(void **state)
{
    (void)state;
    const int half = 6;
    const zo_tier homes[][2] = {{ZO_TIER_DEVICE, ZO_TIER_DEVICE},
                                {ZO_TIER_HOST, ZO_TIER_HOST},
                                {ZO_TIER_HOST, ZO_TIER_NVME},
                                {ZO_TIER_DEVICE, ZO_TIER_NVME},
                                {ZO_TIER_NVME, ZO_TIER_NVME}};
    for (int i = 0; i < 5; i++)
        for (int mode = 0; mode < 4; mode++) {
            run_cfg c =
                base_cfg(homes[i][0], homes[i][1], mode == 3 ? ZO_OPTIM_SYNC : (zo_optim_mode)mode);
            if (mode == 3) { /* fp16: an overflow before the save and one after */
                c.dtype = ZO_DTYPE_F16;
                c.poison_steps = (1u << 2) | (1u << 8);
            }
            if (homes[i][0] != ZO_TIER_DEVICE)
                c.device_bytes = min_device_bytes();
            harness h;
            harness_open(&h, &c);
            ZO_ASSERT_OK(make_engine(&h, NULL, 0));
            double losses[TM_MAXSTEPS];
            train_range(&h, 0, half, losses);
            ZO_ASSERT_OK(zo_engine_flush(h.eng));
            saved_state s;
            save_state(&h, &s);
            if (mode == 3)
                assert_int_equal(s.ss.scaler_hysteresis, 1); /* the overflow used one */
            train_range(&h, half, 2 * half, losses);
            float *ref[TM_T];
            read_masters(&h, ref);
            harness_close(&h);
            if (!resumed_equals(&c, &s, 7, half, losses, ref))
                fail_msg("placement %d mode %d: the resumed run differs", i, mode);
            if (i == 2 && mode == 0) {
                assert_false(resumed_equals(&c, &s, 5, half, losses, ref)); /* without m, v */
                assert_false(
                    resumed_equals(&c, &s, 3, half, losses, ref)); /* without the step count */
            }
            for (int k = 0; k < TM_T; k++)
                free(ref[k]);
            saved_state_free(&s);
        }
}

/* The calls refuse what they cannot do, naming why; an NVMe write failing
 * under write_state leaves the previous state readable and the call can be
 * repeated. */
static void test_state_errors(void **state)
{
    (void)state;
    run_cfg c = base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, ZO_OPTIM_DPU);
    harness h;
    harness_open(&h, &c);
    zo_swap_fault never = {ZO_SWAP_FAULT_EIO, UINT64_MAX, 0};
    ZO_ASSERT_OK(build_engine(&h, &never, 1, 0));
    float *w = calloc(TM_D * TM_D, sizeof(float));
    ZO_ASSERT_ST(zo_engine_write_state(h.eng, h.ids[0], w, NULL, NULL), ZO_ERR_STATE);
    assert_non_null(strstr(zo_last_error(), "zo_engine_finalize"));
    ZO_ASSERT_OK(zo_engine_finalize(h.eng));
    double losses[4];
    train_range(&h, 0, 2, losses);
    zo_engine_step_state ss = ZO_ENGINE_STEP_STATE_INIT;
    ZO_ASSERT_ST(zo_engine_write_state(h.eng, h.ids[0], w, NULL, NULL), ZO_ERR_STATE);
    assert_non_null(strstr(zo_last_error(), "call zo_engine_flush first"));
    ZO_ASSERT_ST(zo_engine_get_step_state(h.eng, &ss), ZO_ERR_STATE);
    ZO_ASSERT_OK(zo_engine_flush(h.eng));
    ZO_ASSERT_OK(zo_engine_get_step_state(h.eng, &ss));
    assert_int_equal(ss.updates, 2);
    assert_int_equal(ss.steps, 2);
    ZO_ASSERT_ST(zo_engine_read_state(h.eng, TM_T, w, NULL, NULL), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_engine_write_state(h.eng, -1, w, NULL, NULL), ZO_ERR_INVALID_ARG);
    zo_engine_step_state bad = ss;
    bad.updates = ss.steps + 1;
    ZO_ASSERT_ST(zo_engine_set_step_state(h.eng, &bad), ZO_ERR_INVALID_ARG);
    bad = ss;
    bad.struct_size = 8;
    ZO_ASSERT_ST(zo_engine_set_step_state(h.eng, &bad), ZO_ERR_INVALID_ARG);
    /* mid-step */
    void *p[2];
    ZO_ASSERT_OK(zo_engine_fetch(h.eng, 0, ZO_PHASE_FORWARD, h.compute, p, NULL, 2));
    ZO_ASSERT_ST(zo_engine_write_state(h.eng, h.ids[0], w, NULL, NULL), ZO_ERR_STATE);
    assert_non_null(strstr(zo_last_error(), "a step is open"));
    ZO_ASSERT_ST(zo_engine_flush(h.eng), ZO_ERR_STATE);
    ZO_ASSERT_OK(zo_engine_release(h.eng, 0, h.compute));
    ZO_ASSERT_OK(zo_stream_synchronize(h.compute));
    harness_close(&h);

    /* a failed NVMe write: the state stays, a retry succeeds */
    c = base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, ZO_OPTIM_SYNC);
    harness_open(&h, &c);
    ZO_ASSERT_OK(make_engine(&h, &never, 1));
    train_range(&h, 0, 2, losses);
    float *m0 = malloc(TM_D * TM_D * sizeof(float)), *m1 = malloc(TM_D * TM_D * sizeof(float));
    ZO_ASSERT_OK(zo_engine_read_state(h.eng, h.ids[0], m0, NULL, NULL));
    for (int i = 0; i < TM_D * TM_D; i++)
        w[i] = (float)i / 4096.0f;
    zo_swap_t stores[2] = {zo_engine_nvme_store(h.eng), zo_engine_nvme_param_store(h.eng)};
    for (int s = 0; s < 2; s++) {
        zo_swap_fault f = {ZO_SWAP_FAULT_EIO, 0, 0};
        ZO_ASSERT_OK(zo_swap_set_faults(stores[s], &f, 1));
        ZO_ASSERT_ST(zo_engine_write_state(h.eng, h.ids[0], w, w, w), ZO_ERR_IO);
        ZO_ASSERT_OK(zo_swap_set_faults(stores[s], NULL, 0));
        ZO_ASSERT_OK(zo_engine_read_state(h.eng, h.ids[0], m1, NULL, NULL));
        assert_memory_equal(m0, m1, TM_D * TM_D * sizeof(float));
    }
    ZO_ASSERT_OK(zo_engine_write_state(h.eng, h.ids[0], w, NULL, w));
    float *vv = malloc(TM_D * TM_D * sizeof(float));
    ZO_ASSERT_OK(zo_engine_read_state(h.eng, h.ids[0], m1, NULL, vv));
    assert_memory_equal(m1, w, TM_D * TM_D * sizeof(float));
    assert_memory_equal(vv, w, TM_D * TM_D * sizeof(float));
    free(vv);
    /* the new weights are what the next forward computes with */
    train_range(&h, 2, 3, losses);
    harness_close(&h);
    free(m0);
    free(m1);
    free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_round_trip_resumes_bitwise),
        cmocka_unit_test(test_state_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
