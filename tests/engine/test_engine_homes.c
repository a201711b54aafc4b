/* Per-chunk homes: parameters and states split over device, host and NVMe
 * by caps (fixed splits and one random split from ZO_TEST_SEED) train
 * bitwise as all-host and all-NVMe in every mode; the footprint counts
 * the split; checkpoints move between splits; NVMe faults leave every
 * chunk intact; caps on the wrong tier are refused; tensors registered by
 * a fill train as registered with copies, the fill asked only in finalize;
 * zo_engine_place_homes places as the engine does. */

#include "engine_harness.h"

#define STATES_PER_CHUNK (6ull * CHUNK) /* what a chunk's optimizer states count in a cap */

typedef struct split {
    zo_tier ph, oh;
    zo_engine_caps pcaps, ocaps;
    int small; /* the smallest device budget (no resident chunks) */
} split;

static uint32_t lcg(uint32_t *r)
{
    return (*r = *r * 1664525u + 1013904223u) >> 8;
}

/* A random split from a seed: any homes the engine accepts, caps of whole
 * and part chunks on every tier faster than them. */
static split random_split(uint32_t seed)
{
    uint32_t r = seed;
    split sp = {ZO_TIER_HOST, lcg(&r) % 2 ? ZO_TIER_NVME : ZO_TIER_HOST, {{0}}, {{0}}, 0};
    sp.ph = (zo_tier)(lcg(&r) % (sp.oh == ZO_TIER_NVME ? 3 : 2));
    const uint64_t unit[2] = {CHUNK / 2,
                              STATES_PER_CHUNK / 2}; /* half chunks: caps between chunks too */
    zo_engine_caps *caps[2] = {&sp.pcaps, &sp.ocaps};
    zo_tier homes[2] = {sp.ph, sp.oh};
    for (int k = 0; k < 2; k++) {
        if (homes[k] > ZO_TIER_DEVICE)
            caps[k]->bytes[ZO_TIER_DEVICE] = (lcg(&r) % 5) * unit[k];
        if (homes[k] > ZO_TIER_HOST)
            caps[k]->bytes[ZO_TIER_HOST] = (lcg(&r) % (2 * N_CHUNKS + 1)) * unit[k];
    }
    return sp;
}

/* Splits of both kinds of state over the tiers: states half on the host;
 * parameters on the host and NVMe (the chunks with host states keep theirs
 * off NVMe); every tier for both (cpu device); states on device and host
 * over host parameters; a random one; device-resident parameters over
 * states on NVMe, with other homes. */
static int make_splits(split *out, uint32_t seed)
{
    const uint64_t S = STATES_PER_CHUNK, P = CHUNK;
    int n = 0;
    out[n++] = (split){ZO_TIER_HOST, ZO_TIER_NVME, {{0, 0}}, {{0, 4 * S}}, 1};
    out[n++] = (split){ZO_TIER_NVME, ZO_TIER_NVME, {{0, 5 * P}}, {{0, 2 * S}}, 1};
    out[n++] = (split){ZO_TIER_NVME, ZO_TIER_NVME, {{P, P}}, {{S, 2 * S + S / 2}}, 0};
    out[n++] = (split){ZO_TIER_HOST, ZO_TIER_HOST, {{3 * P, 0}}, {{3 * S, 0}}, 0};
    out[n++] = random_split(seed);
    /* device-resident parameters over NVMe states (their copy on NVMe),
     * beside host and NVMe homes */
    out[n++] = (split){ZO_TIER_NVME, ZO_TIER_NVME, {{4 * P, P}}, {{0, 2 * S}}, 0};
    out[n++] = (split){ZO_TIER_DEVICE, ZO_TIER_NVME, {{0, 0}}, {{S, 3 * S}}, 0};
    return n;
}

static run_cfg split_cfg(const split *sp, zo_optim_mode mode)
{
    run_cfg c = base_cfg(sp->ph, sp->oh, mode);
    c.pcaps = sp->pcaps;
    c.ocaps = sp->ocaps;
    if (sp->small)
        c.device_bytes = min_device_bytes();
    return c;
}

static uint32_t test_seed(void)
{
    const char *s = getenv("ZO_TEST_SEED");
    uint32_t seed = s ? (uint32_t)strtoul(s, NULL, 0) : 20261124u;
    print_message("per-chunk homes: random split from seed %u (ZO_TEST_SEED)\n", seed);
    return seed;
}

/* Registered by fill, the initial values written straight into each
 * chunk's initial states by finalize, a model trains bitwise as registered
 * with copies: all host, all NVMe, a split over every tier, every mode. */
static void test_registered_by_fill_trains_bitwise(void **state)
{
    (void)state;
    split sp[8];
    make_splits(sp, 1);
    for (int mode = ZO_OPTIM_SYNC; mode <= ZO_OPTIM_DPU; mode++)
        for (int i = 0; i < 3; i++) {
            run_cfg c = i == 0   ? base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, (zo_optim_mode)mode)
                        : i == 1 ? base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, (zo_optim_mode)mode)
                                 : split_cfg(&sp[2], (zo_optim_mode)mode);
            run_out copied, filled;
            run(&c, &copied);
            c.fill = 1;
            run(&c, &filled);
            assert_same_weights(&copied, &filled, STEPS);
            run_out_free(&copied);
            run_out_free(&filled);
        }
}

/* The fill is asked for a tensor's values only where they are placed:
 * not at registration, once per tensor in finalize, and by read_master
 * before it; a fill that fails fails finalize naming the tensor, and the
 * engine is freed cleanly. */
static void test_fill_runs_at_finalize(void **state)
{
    (void)state;
    run_cfg c = base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, ZO_OPTIM_SYNC);
    c.fill = 1;
    harness h;
    harness_open(&h, &c);
    ZO_ASSERT_OK(build_engine(&h, NULL, 0, 0));
    for (int k = 0; k < TM_T; k++)
        assert_int_equal(h.fill.calls[k], 0);
    float *w = malloc(tm_numel(2) * sizeof *w);
    assert_non_null(w);
    ZO_ASSERT_OK(zo_engine_read_master(h.eng, h.ids[2], w));
    assert_memory_equal(w, h.fill.init[2], tm_numel(2) * sizeof *w);
    assert_int_equal(h.fill.calls[2], 1);
    ZO_ASSERT_OK(zo_engine_finalize(h.eng));
    for (int k = 0; k < TM_T; k++)
        assert_int_equal(h.fill.calls[k], k == 2 ? 2 : 1);
    ZO_ASSERT_OK(zo_engine_read_master(h.eng, h.ids[2], w));
    assert_memory_equal(w, h.fill.init[2], tm_numel(2) * sizeof *w);
    assert_int_equal(h.fill.calls[2], 2);
    free(w);
    int id;
    ZO_ASSERT_ST(zo_engine_register_fill(h.eng, TM_L, "late", 4, fill_from, &h.fill, &id),
                 ZO_ERR_STATE);
    harness_close(&h);

    harness_open(&h, &c);
    h.fill.fail_id = 5;
    ZO_ASSERT_ST(zo_engine_register_fill(NULL, 0, "x", 4, fill_from, &h.fill, &id),
                 ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(build_engine(&h, NULL, 0, 1), ZO_ERR_IO);
    if (!strstr(zo_last_error(), "initial values of 'b'"))
        fail_msg("%s", zo_last_error());
    harness_close(&h);
}

/* Splits of the states and parameters over device, host and NVMe train
 * bitwise like all-host and all-NVMe in sync, overlap and dpu modes; each
 * run's measured peaks equal its footprint (run checks every step). */
static void test_split_homes_equal_all_host_and_all_nvme(void **state)
{
    (void)state;
    split sp[8];
    int n = make_splits(sp, test_seed());
    for (int mode = ZO_OPTIM_SYNC; mode <= ZO_OPTIM_DPU; mode++) {
        run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, (zo_optim_mode)mode);
        run_out host, nvme;
        run(&c, &host);
        c = base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, (zo_optim_mode)mode);
        run(&c, &nvme);
        assert_same_weights(&host, &nvme, STEPS);
        for (int i = 0; i < n; i++) {
            run_out o;
            c = split_cfg(&sp[i], (zo_optim_mode)mode);
            run(&c, &o);
            assert_same_weights(&host, &o, STEPS);
            run_out_free(&o);
        }
        run_out_free(&host);
        run_out_free(&nvme);
    }
}

/* The footprint counts the split: host bytes for the host-homed states
 * only, NVMe extents only for the NVMe-homed chunks, and the caps fill in
 * chunk order. */
static void test_split_footprint(void **state)
{
    (void)state;
    split sp[8];
    make_splits(sp, 1);
    run_cfg c = split_cfg(&sp[0], ZO_OPTIM_SYNC); /* 4 chunks' states on the host, 4 on NVMe */
    run_out o, all;
    run(&c, &o);
    c.ocaps.bytes[ZO_TIER_HOST] = 0;
    run(&c, &all);
    assert_int_equal(o.fp.bytes[ZO_TIER_HOST] - o.fp.grad_host, 4 * STATES_PER_CHUNK);
    assert_int_equal(o.fp.grad_host, 4ull * CHUNK); /* the NVMe-homed states' gradients */
    assert_int_equal(o.fp.bytes[ZO_TIER_NVME] * 2, all.fp.bytes[ZO_TIER_NVME]);
    assert_int_equal(o.fp.bytes[ZO_TIER_NVME], 2ull * 4 * zo_engine_nvme_state_bytes(TM_D * TM_D));
    /* host states need one host copy of their parameters, NVMe ones two */
    assert_int_equal((all.fp.pinned - all.fp.grad_pinned) - (o.fp.pinned - o.fp.grad_pinned),
                     4ull * CHUNK);
    c.mode = ZO_OPTIM_OVERLAP; /* and backups of the host ones */
    run_out_free(&o);
    run(&c, &o);
    c.ocaps.bytes[ZO_TIER_HOST] = 4 * STATES_PER_CHUNK;
    run_out ovl;
    run(&c, &ovl);
    assert_int_equal(ovl.fp.bytes[ZO_TIER_HOST] - ovl.fp.grad_host, 2 * 4 * STATES_PER_CHUNK);
    run_out_free(&o);
    run_out_free(&all);
    run_out_free(&ovl);
}

/* zo_engine_place_homes, the planner's placement with no engine, homes as
 * many chunks on each tier as a finalized engine does, for every split; and
 * refuses what it cannot read. */
static void test_place_homes_equals_the_engines(void **state)
{
    (void)state;
    split sp[8];
    int n_splits = make_splits(sp, test_seed());
    for (int i = 0; i < n_splits; i++) {
        run_cfg rc = split_cfg(&sp[i], ZO_OPTIM_SYNC);
        harness h;
        harness_open(&h, &rc);
        ZO_ASSERT_OK(make_engine(&h, NULL, 0));
        uint32_t params[ZO_TIER_MAX], optim[ZO_TIER_MAX], n = 0;
        ZO_ASSERT_OK(zo_engine_homes(h.eng, params, optim));
        for (int t = 0; t < 3; t++)
            n += params[t];
        zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
        c.param_dtype = rc.dtype;
        c.chunk_bytes = CHUNK;
        c.param_home = rc.param_home;
        c.optim_home = rc.optim_home;
        c.param_caps = rc.pcaps;
        c.optim_caps = rc.ocaps;
        c.mode = rc.mode;
        c.state_dtype = g_state_dtype;
        uint8_t ph[64], oh[64];
        assert_true(n <= sizeof ph);
        ZO_ASSERT_OK(zo_engine_place_homes(&c, n, ph, oh));
        uint32_t p2[ZO_TIER_MAX] = {0}, o2[ZO_TIER_MAX] = {0};
        for (uint32_t k = 0; k < n; k++) {
            assert_true(ph[k] < 3 && oh[k] < 3);
            p2[ph[k]]++;
            o2[oh[k]]++;
        }
        assert_memory_equal(p2, params, sizeof params);
        assert_memory_equal(o2, optim, sizeof optim);
        harness_close(&h);
    }
    zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
    uint8_t h[1];
    assert_int_equal(zo_engine_place_homes(NULL, 1, h, h), ZO_ERR_INVALID_ARG);
    assert_int_equal(zo_engine_place_homes(&c, 1, NULL, h), ZO_ERR_INVALID_ARG);
    c.struct_size = 1;
    assert_int_equal(zo_engine_place_homes(&c, 1, h, h), ZO_ERR_INVALID_ARG);
}

/* A checkpoint saved under one split resumes bitwise under another (under
 * all-host, and with device-resident parameters over NVMe states), in
 * every mode. */
static void test_split_checkpoint_resumes_on_another(void **state)
{
    (void)state;
    const int half = 6;
    split sp[8];
    make_splits(sp, test_seed());
    for (int mode = ZO_OPTIM_SYNC; mode <= ZO_OPTIM_DPU; mode++) {
        run_cfg a = split_cfg(&sp[1], (zo_optim_mode)mode);
        harness h;
        harness_open(&h, &a);
        ZO_ASSERT_OK(make_engine(&h, NULL, 0));
        double losses[TM_MAXSTEPS];
        train_range(&h, 0, half, losses);
        ZO_ASSERT_OK(zo_engine_flush(h.eng));
        saved_state s;
        save_state(&h, &s);
        train_range(&h, half, 2 * half, losses);
        float *ref[TM_T];
        read_masters(&h, ref);
        harness_close(&h);
        run_cfg others[] = {split_cfg(&sp[2], (zo_optim_mode)mode),
                            split_cfg(&sp[4], (zo_optim_mode)mode),
                            base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, (zo_optim_mode)mode),
                            split_cfg(&sp[6], (zo_optim_mode)mode)};
        for (int i = 0; i < 4; i++)
            if (!resumed_equals(&others[i], &s, 7, half, losses, ref))
                fail_msg("mode %d: resumed on placement %d, the run differs", mode, i);
        for (int k = 0; k < TM_T; k++)
            free(ref[k]);
        saved_state_free(&s);
    }
}

/* fail_step_at for a split: fewer chunks on NVMe make fewer requests per
 * step, so the faults go at requests every step makes. */
static void split_fail_step_at(harness *h, zo_swap_t store, int s)
{
    static const uint64_t ops[] = {0, 3, 6};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        float *before[TM_T];
        read_masters(h, before);
        zo_swap_fault f = {ZO_SWAP_FAULT_EIO, ops[i], 0};
        ZO_ASSERT_OK(zo_swap_set_faults(store, &f, 1));
        zo_status e = failing_step(h, s, before);
        if (e != ZO_ERR_IO)
            fail_msg("fault at request %d: step returned %d, expected ZO_ERR_IO", (int)ops[i],
                     (int)e);
        assert_non_null(strstr(zo_last_error(), "abandoned"));
        ZO_ASSERT_OK(zo_swap_set_faults(store, NULL, 0));
    }
}

/* An NVMe fault during a step of a split placement leaves every chunk's
 * weights as they were (the in-place tiers update after the NVMe stores
 * land), and the retried run equals the clean one. */
static void test_split_nvme_fault_during_step(void **state)
{
    (void)state;
    split sp[8];
    make_splits(sp, 1);
    for (int m = 0; m < 4; m++) {
        const split *x = &sp[m / 2];
        run_cfg c = split_cfg(x, m % 2 ? ZO_OPTIM_OVERLAP : ZO_OPTIM_SYNC);
        c.steps = 8;
        run_out ref;
        harness h;
        open_for_faults(&h, &c, &ref);
        double losses[8];
        zo_step_stats st;
        for (int s = 0; s < c.steps; s++) {
            if (s == 4)
                split_fail_step_at(&h, zo_engine_nvme_store(h.eng), s);
            if (s == 5 && x->ph == ZO_TIER_NVME)
                split_fail_step_at(&h, zo_engine_nvme_param_store(h.eng), s);
            ZO_ASSERT_OK(train_step(&h, s, &losses[s], &st));
        }
        close_and_compare(&h, losses, &ref, c.steps);
    }
}

/* Caps name tiers faster than the home: any other is refused, naming it. */
static void test_split_caps_refused(void **state)
{
    (void)state;
    run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_SYNC);
    c.ocaps.bytes[ZO_TIER_HOST] = STATES_PER_CHUNK;
    harness h;
    harness_open(&h, &c);
    ZO_ASSERT_ST(make_engine(&h, NULL, 0), ZO_ERR_INVALID_ARG);
    if (!strstr(zo_last_error(), "optim_caps.host"))
        fail_msg("refusal: %s", zo_last_error());
    harness_close(&h);
    c = base_cfg(ZO_TIER_DEVICE, ZO_TIER_HOST, ZO_OPTIM_SYNC);
    c.pcaps.bytes[ZO_TIER_DEVICE] = CHUNK;
    harness_open(&h, &c);
    ZO_ASSERT_ST(make_engine(&h, NULL, 0), ZO_ERR_INVALID_ARG);
    if (!strstr(zo_last_error(), "param_caps.device"))
        fail_msg("refusal: %s", zo_last_error());
    harness_close(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_homes_equal_all_host_and_all_nvme),
        cmocka_unit_test(test_registered_by_fill_trains_bitwise),
        cmocka_unit_test(test_fill_runs_at_finalize),
        cmocka_unit_test(test_split_footprint),
        cmocka_unit_test(test_place_homes_equals_the_engines),
        cmocka_unit_test(test_split_checkpoint_resumes_on_another),
        cmocka_unit_test(test_split_nvme_fault_during_step),
        cmocka_unit_test(test_split_caps_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
