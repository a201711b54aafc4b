/* Faults in the middle of a step (an NVMe EIO on either store, a failed
 * device stream task) fail the step, leave the weights as they were, and
 * the retried run trains bitwise as the run without the fault. */

#include "engine_harness.h"

static void test_nvme_fault_during_step(void **state)
{
    (void)state;
    for (int m = 0; m < 4; m++) {
        int params_on_nvme = m >= 2;
        run_cfg c = base_cfg(params_on_nvme ? ZO_TIER_NVME : ZO_TIER_HOST, ZO_TIER_NVME,
                             m % 2 ? ZO_OPTIM_OVERLAP : ZO_OPTIM_SYNC);
        c.steps = 8;
        c.device_bytes = params_on_nvme ? min_device_bytes() : 0; /* every fetch reads NVMe */
        run_out ref;
        run(&c, &ref);

        harness h;
        harness_open(&h, &c);
        zo_swap_fault never = {ZO_SWAP_FAULT_EIO, UINT64_MAX, 0};
        ZO_ASSERT_OK(make_engine(&h, &never, 1));
        double losses[8];
        zo_step_stats st;
        for (int s = 0; s < c.steps; s++) {
            if (s == 4)
                fail_step_at(&h, zo_engine_nvme_store(h.eng), s);
            if (s == 5 && params_on_nvme)
                fail_step_at(&h, zo_engine_nvme_param_store(h.eng), s);
            ZO_ASSERT_OK(train_step(&h, s, &losses[s], &st));
        }
        close_and_compare(&h, losses, &ref, c.steps);
    }
}

/* A device stream task fails in the middle of a step (whichever runs next:
 * the caller's compute, a copy, a timer or a completion signal): the step
 * fails, the weights stay, and running the step again gives the same
 * training as a run without the fault. */
static void test_stream_task_fault_during_step(void **state)
{
    (void)state;
    const run_cfg cases[] = {base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_SYNC),
                             base_cfg(ZO_TIER_HOST, ZO_TIER_NVME, ZO_OPTIM_OVERLAP),
                             base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, ZO_OPTIM_SYNC)};
    for (int i = 0; i < 3; i++) {
        run_cfg c = cases[i];
        c.steps = 6;
        c.device_bytes = min_device_bytes();
        run_out ref;
        run(&c, &ref);
        harness h;
        harness_open(&h, &c);
        ZO_ASSERT_OK(make_engine(&h, NULL, 0));
        double losses[6];
        zo_step_stats st;
        for (int s = 0; s < c.steps; s++) {
            for (int l = 0; s == 3 && l < TM_L; l++) {
                float *before[TM_T];
                read_masters(&h, before);
                h.fault_layer = l;
                zo_status e = failing_step(&h, s, before);
                h.fault_layer = -1;
                if (e >= 0)
                    fail_msg("a failed stream task after layer %d's backward went unnoticed", l);
            }
            ZO_ASSERT_OK(train_step(&h, s, &losses[s], &st));
        }
        close_and_compare(&h, losses, &ref, c.steps);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nvme_fault_during_step),
        cmocka_unit_test(test_stream_task_fault_during_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
