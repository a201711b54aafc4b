/* Layer-major micro-batch groups (micro_group): every group size equals
 * micro-batch-major accumulation bitwise in every mode and placement; the
 * footprint trades the host's fp32 accumulators for sums on the device;
 * each layer is fetched once per group; a fault mid-group is retried. */

#include "engine_harness.h"

/* Groups of 1, 2 and 4 micro-batches (and 2 of 5 and 8 of 5: a short last
 * group, one group per step) equal micro-batch-major accumulation bitwise in
 * every optimizer mode, states on the host and on NVMe; fp16 with overflows. */
static void test_layer_major_groups_equal_micro_batch_major(void **state)
{
    (void)state;
    static const int groups[][2] = {{1, 4}, {2, 4}, {4, 4}, {2, 5}, {8, 5}}; /* group, accum */
    for (int m = 0; m < 3; m++)
        for (int nvme = 0; nvme < 2; nvme++) {
            run_cfg c =
                base_cfg(ZO_TIER_HOST, nvme ? ZO_TIER_NVME : ZO_TIER_HOST, (zo_optim_mode)m);
            if (nvme) { /* fp16 with overflows, clipping, the smallest device */
                c.dtype = ZO_DTYPE_F16;
                c.poison_steps = (1u << 3) | (1u << 11);
                c.max_norm = 0.5f;
            }
            run_out ref[2];
            int have[2] = {0, 0};
            for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) {
                c.accum = groups[i][1];
                int r = c.accum == 5;
                if (!have[r]) {
                    c.group = 0;
                    run(&c, &ref[r]);
                    have[r] = 1;
                }
                c.group = groups[i][0];
                run_out o;
                run(&c, &o);
                assert_same_weights(&o, &ref[r], c.steps);
                run_out_free(&o);
            }
            run_out_free(&ref[0]);
            run_out_free(&ref[1]);
        }
}

/* Groups with the parameters on NVMe through the smallest device budget
 * (with the fp32 sums), and with the optimizer on the device (cpu device):
 * bitwise the micro-batch-major runs. */
static void test_layer_major_other_homes(void **state)
{
    (void)state;
    const zo_tier homes[2][2] = {{ZO_TIER_NVME, ZO_TIER_NVME}, {ZO_TIER_HOST, ZO_TIER_DEVICE}};
    for (int i = 0; i < 2; i++)
        for (int m = 0; m < 3; m++) {
            run_cfg c = base_cfg(homes[i][0], homes[i][1], (zo_optim_mode)m);
            c.accum = 4;
            c.steps = 8;
            if (i == 0)
                c.device_bytes = min_device_bytes();
            run_out ref, o;
            run(&c, &ref);
            c.group = 4;
            if (i == 0)
                c.device_bytes = min_device_bytes() + 2 * 2 * CHUNK; /* and two fp32 sums */
            run(&c, &o);
            assert_same_weights(&o, &ref, c.steps);
            run_out_free(&o);
            run_out_free(&ref);
        }
}

/* Grouped, the gradient slots gain fp32 sums on the device, the host's fp32
 * accumulators go, and the pinned 16-bit gradient copies become fp32 sums. */
static void test_layer_major_footprint(void **state)
{
    (void)state;
    for (int m = 0; m < 3; m++) {
        run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, (zo_optim_mode)m);
        c.accum = 4;
        c.steps = 2;
        run_out a, b;
        run(&c, &a);
        c.group = 4;
        run(&c, &b);
        uint64_t C = a.fp.chunk_bytes, N = a.fp.n_chunks, K = a.fp.max_chunks_per_layer;
        uint64_t G = m == ZO_OPTIM_DPU ? 2 : 1;
        assert_int_equal(b.fp.bytes[ZO_TIER_DEVICE], a.fp.bytes[ZO_TIER_DEVICE] + 2 * K * C);
        assert_int_equal(a.fp.bytes[ZO_TIER_HOST] - b.fp.bytes[ZO_TIER_HOST], 2 * C * N * G);
        assert_int_equal(b.fp.pinned - a.fp.pinned, N * C * G);
        run_out_free(&a);
        run_out_free(&b);
    }
}

/* With one layer's slots on the device, a group of 4 fetches each layer once
 * per phase instead of four times: the measured host-to-device bytes of a
 * step are a quarter of micro-batch-major's but for the loads that
 * micro-batch-major saves where one micro-batch's last backward layer is the
 * next one's first forward layer (layer 0's chunks, still resident). */
static void test_layer_major_moves_fewer_parameter_bytes(void **state)
{
    (void)state;
    run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_SYNC);
    c.accum = 4;
    c.steps = 4;
    c.lookahead = 0;
    const uint64_t layer = CHUNK + TM_D * 2; /* W's chunk and b's bytes in use */
    c.device_bytes = min_device_bytes();
    run_out a, b;
    run(&c, &a);
    c.group = 4;
    c.device_bytes = min_device_bytes() + 2 * 2 * CHUNK; /* and two fp32 sums */
    run(&c, &b);
    assert_same_weights(&a, &b, c.steps);
    for (int s = 1; s < c.steps; s++) {
        /* each layer loaded once per phase and group, the last layer's backward
         * following its forward on the same slots */
        assert_int_equal(b.stats[s].h2d_bytes, (2 * TM_L - 1) * layer);
        assert_int_equal(a.stats[s].h2d_bytes, 4 * b.stats[s].h2d_bytes - 3 * layer);
        assert_int_equal(a.stats[s].d2h_bytes, 4 * TM_L * layer);
        assert_int_equal(b.stats[s].d2h_bytes, 2 * TM_L * layer); /* fp32, once */
    }
    run_out_free(&a);
    run_out_free(&b);
}

/* A stream task failing in the middle of a group's backward, or an NVMe
 * write failing at the end of a grouped step: the step is abandoned, the
 * weights stay, and its retry gives the run without the fault. */
static void test_layer_major_fault_mid_group(void **state)
{
    (void)state;
    for (int i = 0; i < 2; i++) {
        run_cfg c = base_cfg(ZO_TIER_HOST, i ? ZO_TIER_NVME : ZO_TIER_HOST,
                             i ? ZO_OPTIM_OVERLAP : ZO_OPTIM_SYNC);
        c.steps = 6;
        c.accum = 4;
        c.group = 2;
        run_out ref;
        run(&c, &ref);
        harness h;
        harness_open(&h, &c);
        zo_swap_fault never = {ZO_SWAP_FAULT_EIO, UINT64_MAX, 0};
        ZO_ASSERT_OK(make_engine(&h, i ? &never : NULL, i ? 1 : 0));
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
                    fail_msg("a failed stream task in layer %d's group went unnoticed", l);
            }
            if (s == 4 && i)
                fail_step_at(&h, zo_engine_nvme_store(h.eng), s);
            ZO_ASSERT_OK(train_step(&h, s, &losses[s], &st));
        }
        close_and_compare(&h, losses, &ref, c.steps);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_major_groups_equal_micro_batch_major),
        cmocka_unit_test(test_layer_major_other_homes),
        cmocka_unit_test(test_layer_major_footprint),
        cmocka_unit_test(test_layer_major_moves_fewer_parameter_bytes),
        cmocka_unit_test(test_layer_major_fault_mid_group),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
