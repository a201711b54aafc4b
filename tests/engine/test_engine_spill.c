/* Gradients staged for NVMe-homed states: a pinned ring instead of a
 * whole-model mirror, kept in host memory up to the host budget and
 * spilled to NVMe beyond it (16-bit gradients and grouped fp32 sums),
 * bitwise as all kept in every mode; EIO and corrupted extents on the
 * gradients' store fail the step cleanly and the retry trains as before. */
#include <stdatomic.h>

#include "engine_harness.h"

/* The host budget that keeps the gradients of the first `kept` chunks in
 * host memory and spills the others', from a footprint with none spilled:
 * what the rest of the plan takes (the stages' room to read them back
 * included), and their bytes by parity. */
static uint64_t spill_budget(const zo_engine_footprint *fp, int kept, int g_bufs)
{
    assert_int_equal(fp->grad_stage, 3ull * CHUNK);
    uint64_t rest = fp->pinned + fp->bytes[ZO_TIER_HOST] - fp->grad_host;
    return rest + (uint64_t)kept * (uint64_t)g_bufs * CHUNK;
}

static float median_norm(const run_out *o)
{
    double n[STEPS];
    for (int s = 0; s < STEPS; s++)
        n[s] = o->stats[s].grad_norm;
    for (int i = 0; i < STEPS; i++)
        for (int j = i + 1; j < STEPS; j++)
            if (n[j] < n[i]) {
                double t = n[i];
                n[i] = n[j];
                n[j] = t;
            }
    return (float)n[STEPS / 2];
}

/* With parameters and states on NVMe no whole-model gradient mirror is
 * pinned: a ring of lookahead + 2 chunks is. Gradients kept in host memory
 * up to the host budget and spilled to NVMe beyond it (half of them, all of
 * them) train bitwise as with all kept, in sync, overlap (also with clipping,
 * whose redo reads them back) and dpu modes; one byte below the smallest
 * budget is refused naming the host tier. */
static void test_spilled_gradients_train_bitwise(void **state)
{
    (void)state;
    for (int m = 0; m < 4; m++) {
        zo_optim_mode mode = m == 3 ? ZO_OPTIM_DPU : m ? ZO_OPTIM_OVERLAP : ZO_OPTIM_SYNC;
        int g_bufs = mode == ZO_OPTIM_DPU ? 2 : 1;
        run_cfg c = base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, mode);
        run_out kept_all;
        if (m == 2) {
            run(&c, &kept_all);
            c.max_norm = median_norm(&kept_all); /* about half the steps clip */
            run_out_free(&kept_all);
        }
        run(&c, &kept_all);
        assert_int_equal(kept_all.fp.grad_pinned, (2 + 2) * CHUNK); /* lookahead 2 */
        assert_int_equal(kept_all.fp.grad_host, (uint64_t)N_CHUNKS * g_bufs * CHUNK);
        assert_int_equal(kept_all.fp.grad_nvme, 0);
        for (int kept = N_CHUNKS / 2; kept >= 0; kept -= N_CHUNKS / 2) {
            run_out o;
            c.host_bytes = spill_budget(&kept_all.fp, kept, g_bufs);
            run(&c, &o);
            assert_int_equal(o.fp.grad_host, (uint64_t)kept * g_bufs * CHUNK);
            assert_int_equal(o.fp.grad_nvme, (uint64_t)(N_CHUNKS - kept) * g_bufs * P16_EXTENT);
            assert_int_equal(o.fp.pinned + o.fp.bytes[ZO_TIER_HOST], c.host_bytes);
            assert_same_weights(&kept_all, &o, STEPS);
            int clipped = 0;
            for (int s = 0; s < STEPS; s++)
                clipped += o.stats[s].clipped;
            assert_true(m != 2 || (clipped > 0 && o.stats[0].nvme_read_bytes > 0));
            run_out_free(&o);
        }
        c.host_bytes = spill_budget(&kept_all.fp, 0, g_bufs) - 1;
        expect_refusal(&c, ZO_ERR_BUDGET, "host tier");
        run_out_free(&kept_all);
    }
}

/* Grouped with one group per step, the fp32 sums of the NVMe-homed chunks
 * are staged as the 16-bit gradients are: a ring of lookahead + 2 fp32
 * chunks, kept in host memory up to the budget and spilled beyond it (half
 * of them, all of them); sync and overlap train bitwise as micro-batch-major. */
static void test_spilled_group_sums_train_bitwise(void **state)
{
    (void)state;
    const uint64_t S = 2 * CHUNK; /* a chunk's fp32 sums */
    for (int m = 0; m < 2; m++) {
        run_cfg c = base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, m ? ZO_OPTIM_OVERLAP : ZO_OPTIM_SYNC);
        c.accum = 4;
        c.steps = 8;
        run_out ref, kept_all;
        run(&c, &ref);
        c.group = 4;
        run(&c, &kept_all);
        assert_same_weights(&ref, &kept_all, c.steps);
        assert_int_equal(kept_all.fp.grad_pinned, (2 + 2) * S); /* lookahead 2 */
        assert_int_equal(kept_all.fp.grad_stage, 3 * S);
        assert_int_equal(kept_all.fp.grad_host, N_CHUNKS * S);
        uint64_t rest =
            kept_all.fp.pinned + kept_all.fp.bytes[ZO_TIER_HOST] - kept_all.fp.grad_host;
        for (int kept = N_CHUNKS / 2; kept >= 0; kept -= N_CHUNKS / 2) {
            run_out o;
            c.host_bytes = rest + (uint64_t)kept * S;
            run(&c, &o);
            assert_int_equal(o.fp.grad_host, (uint64_t)kept * S);
            assert_int_equal(o.fp.grad_nvme, (uint64_t)(N_CHUNKS - kept) * 2 * P16_EXTENT);
            assert_same_weights(&ref, &o, c.steps);
            run_out_free(&o);
        }
        run_out_free(&ref);
        run_out_free(&kept_all);
    }
}

/* Arm one EIO at requests of the gradients' store across a step (the
 * first, the middle one and the last: writes, and in sync mode the reads
 * back); each attempt fails the step and leaves the weights as they were. */
static void fail_grad_step_at(harness *h, int s, uint64_t requests_per_step)
{
    const uint64_t ops[3] = {0, requests_per_step / 2, requests_per_step - 1};
    for (int i = 0; i < 3; i++)
        fail_request(h, zo_engine_nvme_grad_store(h->eng), s, ops[i]);
}

/* Spilled gradients survive NVMe faults as the states do: a failed write or
 * read, or an extent corrupted on disk, fails the step cleanly (abandoned,
 * weights intact) and its retry trains as the run without faults. */
static void test_spilled_gradient_faults(void **state)
{
    (void)state;
    for (int m = 0; m < 2; m++) {
        run_cfg c = base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, m ? ZO_OPTIM_OVERLAP : ZO_OPTIM_SYNC);
        c.steps = 8;
        run_out ref;
        run(&c, &ref);
        corrupter k = {0};
        k.store = 2;
        c.host_bytes = spill_budget(&ref.fp, N_CHUNKS / 2, 1);
        c.trace = corrupt_on_write;
        c.trace_ctx = &k;
        harness h;
        harness_open(&h, &c);
        zo_swap_fault never = {ZO_SWAP_FAULT_EIO, UINT64_MAX, 0};
        ZO_ASSERT_OK(make_engine(&h, &never, 1));
        zo_swap_t store = zo_engine_nvme_grad_store(h.eng);
        assert_non_null(store);
        corrupter_locate(&k, store);
        double losses[8];
        zo_step_stats st;
        uint64_t per_step = 0;
        for (int s = 0; s < c.steps; s++) {
            if (s == 3)
                fail_grad_step_at(&h, s, per_step);
            if (s == 5 && !m) { /* only sync mode reads every spilled gradient back */
                float *before[TM_T];
                read_masters(&h, before);
                atomic_store(&k.armed, 1);
                ZO_ASSERT_ST(failing_step(&h, s, before), ZO_ERR_CORRUPT);
                assert_int_equal(atomic_load(&k.armed), 0);
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

/* With only the states on NVMe (parameters on the device or the host) the
 * gradients are staged too: no whole-model mirror, the ring, kept within
 * the host budget and spilled beyond it. Against states on the host (the
 * pinned mirrors, no staging): bitwise in sync, overlap and dpu modes with
 * one micro-batch, and with one group per step (fp32 sums) in sync and
 * overlap modes, whether all are kept or all spilled. */
static void test_states_on_nvme_stage_gradients(void **state)
{
    (void)state;
    for (int ph = 0; ph < 2; ph++)
        for (int m = 0; m < 5; m++) {
            int grouped = m >= 3;
            zo_optim_mode mode = m == 2 ? ZO_OPTIM_DPU : m % 2 ? ZO_OPTIM_OVERLAP : ZO_OPTIM_SYNC;
            uint64_t G = (mode == ZO_OPTIM_DPU ? 2 : 1) * (grouped ? 2 : 1) * CHUNK;
            run_cfg c = base_cfg(ph ? ZO_TIER_HOST : ZO_TIER_DEVICE, ZO_TIER_HOST, mode);
            c.steps = 8;
            if (grouped) {
                c.accum = 4;
                c.group = 4;
            }
            run_out ref, all, none;
            run(&c, &ref);
            assert_int_equal(ref.fp.grad_host, 0);
            c.optim_home = ZO_TIER_NVME;
            run(&c, &all);
            assert_int_equal(all.fp.grad_pinned, (2 + 2) * (grouped ? 2 : 1) * CHUNK);
            assert_int_equal(all.fp.grad_host, (uint64_t)N_CHUNKS * G);
            assert_same_weights(&ref, &all, c.steps);
            c.host_bytes = all.fp.pinned + all.fp.bytes[ZO_TIER_HOST] - all.fp.grad_host;
            run(&c, &none);
            assert_int_equal(none.fp.grad_host, 0);
            assert_true(none.fp.grad_nvme > 0);
            assert_same_weights(&ref, &none, c.steps);
            run_out_free(&ref);
            run_out_free(&all);
            run_out_free(&none);
        }
}

/* A fault on the spill of gradients staged because the states are on NVMe
 * (parameters resident on the device): the step fails cleanly and its
 * retry trains as the run without faults. */
static void test_states_on_nvme_spill_fault(void **state)
{
    (void)state;
    run_cfg c = base_cfg(ZO_TIER_DEVICE, ZO_TIER_NVME, ZO_OPTIM_SYNC);
    c.steps = 6;
    run_out ref;
    run(&c, &ref);
    c.host_bytes = spill_budget(&ref.fp, N_CHUNKS / 2, 1);
    harness h;
    harness_open(&h, &c);
    zo_swap_fault never = {ZO_SWAP_FAULT_EIO, UINT64_MAX, 0};
    ZO_ASSERT_OK(make_engine(&h, &never, 1));
    zo_swap_t store = zo_engine_nvme_grad_store(h.eng);
    assert_non_null(store);
    double losses[6];
    zo_step_stats st;
    uint64_t per_step = 0;
    for (int s = 0; s < c.steps; s++) {
        if (s == 3)
            fail_grad_step_at(&h, s, per_step);
        zo_swap_stats a = ZO_SWAP_STATS_INIT, b = ZO_SWAP_STATS_INIT;
        ZO_ASSERT_OK(zo_swap_get_stats(store, &a));
        ZO_ASSERT_OK(train_step(&h, s, &losses[s], &st));
        ZO_ASSERT_OK(zo_swap_get_stats(store, &b));
        per_step = b.requests - a.requests;
        assert_true(per_step > 0);
    }
    close_and_compare(&h, losses, &ref, c.steps);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spilled_gradients_train_bitwise),
        cmocka_unit_test(test_spilled_group_sums_train_bitwise),
        cmocka_unit_test(test_spilled_gradient_faults),
        cmocka_unit_test(test_states_on_nvme_stage_gradients),
        cmocka_unit_test(test_states_on_nvme_spill_fault),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
