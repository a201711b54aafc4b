/* The split master (master_split): the fp32 master stored as its low
 * halves against the bf16 parameters trains bitwise as the full master
 * in every format, placement and mode and moves the split layout's
 * bytes; fp16 is refused; EIO and flipped bytes on the split extents
 * fail the step (the checksum), never a wrong master. */
#include <stdatomic.h>

#include "engine_harness.h"

/* One step of the split layout moves, each way: every layer's W chunk
 * (CHUNK / 2 elements) and b chunk (TM_D, or its room with 8-bit states). */
static uint64_t split_step_bytes(zo_dtype fmt)
{
    size_t b = fmt == ZO_DTYPE_I8 ? zo_adam_q8_small_room(TM_D) : TM_D;
    return TM_L * (zo_engine_nvme_split_state_bytes(fmt, CHUNK / 2) +
                   zo_engine_nvme_split_state_bytes(fmt, b));
}

/* With states on NVMe, the master split against the 16-bit parameters
 * trains bitwise as the full master in every format, placement and mode
 * (overlap with clipping and overflows: rollbacks; dpu), and a sync step
 * moves the split layout's bytes (the first reads the full master written
 * at placement); chunks whose parameters live on NVMe keep the full master. */
static void test_master_split_bitwise(void **state)
{
    (void)state;
    static const zo_dtype fmts[] = {ZO_DTYPE_F32, ZO_DTYPE_BF16, ZO_DTYPE_I8};
    static const zo_tier phs[] = {ZO_TIER_HOST, ZO_TIER_DEVICE, ZO_TIER_NVME};
    for (int f = 0; f < 3; f++)
        for (int p = 0; p < 3; p++)
            for (int m = 0; m < 3; m++) {
                if ((f || p == 2) && m == 2)
                    continue; /* dpu: fp32 with resident parameters */
                g_state_dtype = fmts[f];
                run_cfg c = base_cfg(phs[p], ZO_TIER_NVME, (zo_optim_mode)m);
                c.device_bytes = phs[p] == ZO_TIER_NVME ? min_device_bytes() : 0;
                if (m != ZO_OPTIM_DPU) {
                    c.poison_steps = (1ull << 3) | (1ull << 11);
                    c.max_norm = 0.5f;
                }
                run_out full, halves;
                run(&c, &full);
                c.master_split = 1;
                run(&c, &halves);
                assert_same_weights(&full, &halves, STEPS);
                uint64_t whole = TM_L * (zo_engine_nvme_state_bytes_as(fmts[f], CHUNK / 2) +
                                         zo_engine_nvme_state_bytes_as(
                                             fmts[f], f == 2 ? zo_adam_q8_small_room(TM_D) : TM_D));
                for (int s = 1; m == ZO_OPTIM_SYNC && s < STEPS; s++) {
                    if (full.stats[s].overflow)
                        continue;
                    uint64_t want = p == 2 ? whole : split_step_bytes(fmts[f]);
                    /* without the split, device-resident chunks keep their 16-bit
                     * copies on NVMe: written by the update, reloaded after a commit */
                    uint64_t copies = p == 1 ? N_CHUNKS * P16_EXTENT : 0;
                    uint64_t reloads = full.stats[s - 1].overflow ? 0 : copies;
                    assert_int_equal(full.stats[s].nvme_read_bytes -
                                         halves.stats[s].nvme_read_bytes,
                                     whole - want + reloads);
                    assert_int_equal(full.stats[s].nvme_write_bytes -
                                         halves.stats[s].nvme_write_bytes,
                                     whole - want + copies);
                }
                run_out_free(&full);
                run_out_free(&halves);
            }
    g_state_dtype = ZO_DTYPE_F32;
}

/* fp16 parameters are not the master's high half: refused, naming why. */
static void test_master_split_refuses_fp16(void **state)
{
    (void)state;
    run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_NVME, ZO_OPTIM_SYNC);
    c.dtype = ZO_DTYPE_F16;
    c.master_split = 1;
    harness h;
    harness_open(&h, &c);
    ZO_ASSERT_ST(make_engine(&h, NULL, 0), ZO_ERR_UNSUPPORTED);
    assert_non_null(strstr(zo_last_error(), "master_split needs bf16 parameters"));
    harness_close(&h);
}

/* Faults on the split extents: an EIO at a read or a write fails the step
 * cleanly and the retry trains as the run without faults; a byte flipped
 * on disk in an extent's up bits or low halves fails the step with
 * ZO_ERR_CORRUPT (the checksum), weights untouched, never a wrong master. */
static void test_master_split_faults(void **state)
{
    (void)state;
    for (int m = 0; m < 2; m++) {
        run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_NVME, m ? ZO_OPTIM_OVERLAP : ZO_OPTIM_SYNC);
        c.steps = 8;
        c.master_split = 1;
        run_out ref;
        harness h;
        open_for_faults(&h, &c, &ref);
        double losses[8];
        zo_step_stats st;
        for (int s = 0; s < c.steps; s++) {
            if (s == 4)
                fail_step_at(&h, zo_engine_nvme_store(h.eng), s);
            ZO_ASSERT_OK(train_step(&h, s, &losses[s], &st));
        }
        zo_trace_event ev = {0};
        ev.track = ZO_TRACK_NVME;
        ev.index = 2; /* what corrupt_on_write answers to; it flips the bytes now */
        ev.name = "nvme write";
        for (int where = 0; where < 2; where++) { /* the up bits, then a low half */
            corrupter k = {0};
            k.store = 2;
            corrupter_locate(&k, zo_engine_nvme_store(h.eng));
            for (int i = 0; i < k.n; i++)
                k.off[i] += where ? 4096 + 2 : 0; /* W's extents: bits at 0, low halves at 4 KiB */
            float *before[TM_T], *after[TM_T];
            read_masters(&h, before);
            atomic_store(&k.armed, 1);
            corrupt_on_write(&k, &ev);
            double loss;
            ZO_ASSERT_ST(train_step(&h, c.steps, &loss, &st), ZO_ERR_CORRUPT);
            assert_non_null(strstr(zo_last_error(), "fails its checksum"));
            atomic_store(&k.armed, 1);
            corrupt_on_write(&k, &ev); /* flipped back: the extents are whole again */
            read_masters(&h, after);
            for (int t = 0; t < TM_T; t++) {
                assert_memory_equal(before[t], after[t], tm_numel(t) * sizeof(float));
                free(before[t]);
                free(after[t]);
            }
        }
        double loss;
        ZO_ASSERT_OK(train_step(&h, c.steps, &loss, &st)); /* the engine goes on */
        harness_close(&h);
        for (int s = 0; s < c.steps; s++)
            assert_true(losses[s] == ref.losses[s]);
        run_out_free(&ref);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_master_split_bitwise),
        cmocka_unit_test(test_master_split_refuses_fp16),
        cmocka_unit_test(test_master_split_faults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
