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
        harness h;
        open_for_faults(&h, &c, &ref);
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

/* Step s's update runs behind the next forward and fails (an EIO at one of
 * several requests of the states' store): the next call that waits for it (a
 * read of the states, or step s + 1 at the fetch that needs a chunk it never
 * wrote) fails naming it. The update is then run again before the next step
 * or read, so running again what failed trains on as if nothing had. */
/* A read of a tensor's master (which joins an update behind the forward). */
static zo_status read_one(harness *h)
{
    float *one = malloc(tm_numel(0) * sizeof(float));
    assert_non_null(one);
    zo_status st = zo_engine_read_master(h->eng, h->ids[0], one);
    free(one);
    return st;
}

static int fail_behind(harness *h, int s, uint64_t op, int seen_by_fetch, double *losses)
{
    zo_swap_t store = zo_engine_nvme_store(h->eng);
    ZO_ASSERT_OK(read_one(h)); /* step s - 1's update is committed: the faults hit step s's */
    zo_swap_fault f = {ZO_SWAP_FAULT_EIO, op, 0};
    ZO_ASSERT_OK(zo_swap_set_faults(store, &f, 1));
    zo_step_stats st;
    ZO_ASSERT_OK(train_step(h, s, &losses[s], &st)); /* its update still runs */
    zo_status e;
    e = seen_by_fetch ? train_step(h, s + 1, &losses[s + 1], &st) : read_one(h);
    if (e != ZO_ERR_IO)
        fail_msg("fault at request %d: returned %d, expected ZO_ERR_IO", (int)op, (int)e);
    assert_non_null(strstr(zo_last_error(), "behind the next forward"));
    assert_non_null(strstr(zo_last_error(), "runs again"));
    ZO_ASSERT_OK(zo_swap_set_faults(store, NULL, 0));
    if (!seen_by_fetch) {
        ZO_ASSERT_OK(read_one(h)); /* the read again, which runs the update first */
        return s + 1;
    }
    ZO_ASSERT_OK(train_step(h, s + 1, &losses[s + 1], &st)); /* the step that failed, again */
    return s + 2;
}

/* ... at several requests in turn, from steps 4 on; the whole run trains
 * bitwise as the run without the faults. */
static void test_update_behind_fault(void **state)
{
    (void)state;
    static const uint64_t ops[] = {0, 5, 12};
    const run_cfg cases[] = {base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, ZO_OPTIM_OVERLAP),
                             base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, ZO_OPTIM_SYNC),
                             base_cfg(ZO_TIER_HOST, ZO_TIER_NVME, ZO_OPTIM_SYNC)};
    for (int i = 0; i < 6; i++) {
        int seen_by_fetch = i & 1;
        run_cfg c = cases[i / 2];
        c.steps = 12;
        c.max_norm = 1e-3f; /* every step clips: each updates behind the next forward
                               (in sync mode every step does, clipped or not) */
        c.update_behind = 1;
        c.device_bytes = min_device_bytes();
        run_out ref;
        harness h;
        open_for_faults(&h, &c, &ref);
        double losses[12];
        train_steps(&h, 0, 4, losses);
        int s = 4;
        for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++)
            s = fail_behind(&h, s, ops[k], seen_by_fetch, losses);
        train_steps(&h, s, c.steps, losses);
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
        cmocka_unit_test(test_update_behind_fault),
        cmocka_unit_test(test_stream_task_fault_during_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
