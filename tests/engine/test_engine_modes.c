/* The optimizer modes on every placement (device, host, NVMe; the smallest
 * device budget): sync bitwise against the plain-C reference, with and
 * without gradient accumulation; overlap bitwise equal to sync, also when
 * clipping or an fp16 overflow rolls its speculative update back, and when
 * the update after the verdict runs behind the next forward; dpu
 * against its one-step-stale reference; a learning rate per step. */

#include "engine_harness.h"

static void test_sync_matches_reference_everywhere(void **state)
{
    (void)state;
    tm_ref r;
    tm_ref_init(&r, ZO_DTYPE_BF16);
    zo_adam_params hp = test_adam();
    tm_ref_train(&r, &hp, STEPS, 1, 0);
    const run_cfg cfgs[] = {
        base_cfg(ZO_TIER_DEVICE, ZO_TIER_DEVICE, ZO_OPTIM_SYNC),
        base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_SYNC),
        base_cfg(ZO_TIER_HOST, ZO_TIER_NVME, ZO_OPTIM_SYNC),
        base_cfg(ZO_TIER_DEVICE, ZO_TIER_NVME, ZO_OPTIM_SYNC),
        base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, ZO_OPTIM_SYNC),
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        run_out o;
        run(&cfgs[i], &o);
        assert_matches_reference(&o, &r, STEPS);
        run_out_free(&o);
    }
    /* the smallest device budget: states on the host, on NVMe, and parameters on NVMe too */
    for (int nv = 0; nv < 3; nv++) {
        run_cfg c = base_cfg(nv == 2 ? ZO_TIER_NVME : ZO_TIER_HOST,
                             nv ? ZO_TIER_NVME : ZO_TIER_HOST, ZO_OPTIM_SYNC);
        c.device_bytes = min_device_bytes();
        run_out o;
        run(&c, &o);
        assert_int_equal(o.fp.device_param_slots, 2);
        assert_matches_reference(&o, &r, STEPS);
        run_out_free(&o);
    }
    tm_ref_free(&r);
}

static void test_overlap_equals_sync(void **state)
{
    (void)state;
    const zo_tier homes[][2] = {{ZO_TIER_DEVICE, ZO_TIER_DEVICE},
                                {ZO_TIER_HOST, ZO_TIER_HOST},
                                {ZO_TIER_HOST, ZO_TIER_NVME},
                                {ZO_TIER_NVME, ZO_TIER_NVME}};
    for (size_t i = 0; i < 4; i++) {
        for (int small = 0; small < 2; small++) {
            if (small && homes[i][0] == ZO_TIER_DEVICE)
                continue;
            run_cfg c = base_cfg(homes[i][0], homes[i][1], ZO_OPTIM_SYNC);
            if (small)
                c.device_bytes = min_device_bytes();
            run_out sync, ovl;
            run(&c, &sync);
            c.mode = ZO_OPTIM_OVERLAP;
            run(&c, &ovl);
            assert_same_weights(&sync, &ovl, STEPS);
            for (int s = 0; s < STEPS; s++)
                assert_int_equal(ovl.stats[s].rollbacks, 0);
            run_out_free(&sync);
            run_out_free(&ovl);
        }
    }
}

static void test_grad_accumulation(void **state)
{
    (void)state;
    tm_ref r;
    tm_ref_init(&r, ZO_DTYPE_BF16);
    zo_adam_params hp = test_adam();
    tm_ref_train(&r, &hp, 10, 3, 0);
    for (int m = 0; m < 2; m++) {
        run_cfg c = base_cfg(ZO_TIER_HOST, m ? ZO_TIER_NVME : ZO_TIER_HOST, ZO_OPTIM_SYNC);
        c.accum = 3;
        c.steps = 10;
        c.mode = m ? ZO_OPTIM_OVERLAP : ZO_OPTIM_SYNC;
        run_out o;
        run(&c, &o);
        assert_matches_reference(&o, &r, 10);
        run_out_free(&o);
    }
    tm_ref_free(&r);
}

/* Whether overlap mode updated step s's chunks ahead of the verdict: unless the
 * last step that did not overflow clipped (engine_overlap.c). */
static int speculated(const run_out *o, int s)
{
    for (int p = s - 1; p >= 0; p--)
        if (!o->stats[p].overflow)
            return !o->stats[p].clipped;
    return 1;
}

/* A step that speculated and whose verdict differs rolls back every chunk. */
static int expected_rollbacks(const run_out *o, int s)
{
    int wrong = o->stats[s].overflow || o->stats[s].clipped;
    return speculated(o, s) && wrong ? (int)o->fp.n_chunks : 0;
}

static void test_overlap_with_clipping_equals_sync(void **state)
{
    (void)state;
    run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_SYNC);
    run_out plain;
    run(&c, &plain);
    /* clip at the median norm: about half the steps clip */
    double norms[STEPS];
    for (int s = 0; s < STEPS; s++)
        norms[s] = plain.stats[s].grad_norm;
    for (int i = 0; i < STEPS; i++)
        for (int j = i + 1; j < STEPS; j++)
            if (norms[j] < norms[i]) {
                double t = norms[i];
                norms[i] = norms[j];
                norms[j] = t;
            }
    run_out_free(&plain);
    c.max_norm = (float)norms[STEPS / 2];
    for (int nv = 0; nv < 2; nv++) {
        c.optim_home = nv ? ZO_TIER_NVME : ZO_TIER_HOST;
        c.mode = ZO_OPTIM_SYNC;
        run_out sync, ovl;
        run(&c, &sync);
        c.mode = ZO_OPTIM_OVERLAP;
        run(&c, &ovl);
        assert_same_weights(&sync, &ovl, STEPS);
        int clipped = 0, paused = 0, paused_unclipped = 0;
        for (int s = 0; s < STEPS; s++) {
            assert_int_equal(sync.stats[s].clipped, ovl.stats[s].clipped);
            clipped += ovl.stats[s].clipped;
            paused += !speculated(&ovl, s);
            paused_unclipped += !speculated(&ovl, s) && !ovl.stats[s].clipped;
            /* a speculated step that clips rolls back every chunk; others none */
            assert_int_equal(ovl.stats[s].rollbacks, expected_rollbacks(&ovl, s));
        }
        assert_true(clipped > 0 && clipped < STEPS);
        /* both sides of the pause were taken: a step after a clipped one updated
         * after the verdict, and one of them did not clip */
        assert_true(paused > 0 && paused_unclipped > 0);
        run_out_free(&sync);
        run_out_free(&ovl);
    }
}

static void test_overlap_with_overflow_equals_sync(void **state)
{
    (void)state;
    for (int nv = 0; nv < 3; nv++) {
        run_cfg c = base_cfg(nv == 2 ? ZO_TIER_NVME : ZO_TIER_HOST,
                             nv ? ZO_TIER_NVME : ZO_TIER_HOST, ZO_OPTIM_SYNC);
        c.dtype = ZO_DTYPE_F16;
        c.poison_steps = (1ull << 3) | (1ull << 4) | (1ull << 11);
        c.max_norm = 1.0f;
        run_out sync, ovl;
        run(&c, &sync);
        c.mode = ZO_OPTIM_OVERLAP;
        run(&c, &ovl);
        assert_same_weights(&sync, &ovl, STEPS);
        for (int s = 0; s < STEPS; s++) {
            int poisoned = (int)((c.poison_steps >> s) & 1);
            if (poisoned) {
                assert_int_equal(sync.stats[s].overflow, 1);
                assert_int_equal(ovl.stats[s].overflow, 1);
                assert_int_equal(ovl.stats[s].rollbacks, expected_rollbacks(&ovl, s));
            }
            assert_true(sync.stats[s].loss_scale == ovl.stats[s].loss_scale);
        }
        /* dynamic loss scaling halved the scale after the overflows */
        assert_true(sync.stats[5].loss_scale < sync.stats[0].loss_scale);
        /* skipped steps do not count as optimizer steps */
        assert_int_equal(sync.stats[STEPS - 1].step, STEPS - 3);
        run_out_free(&sync);
        run_out_free(&ovl);
    }
}

/* A trace callback counting the updates that ran behind the next forward
 * (from their thread). */
static void count_behind(void *ctx, const zo_trace_event *ev)
{
    if (ev->track == ZO_TRACK_UPDATE && strcmp(ev->name, "update behind the next forward") == 0)
        atomic_fetch_add((atomic_int *)ctx, 1);
}

/* States on NVMe, parameters on NVMe or in host copies, every step clipped
 * (some overflowing): in overlap mode each update that runs after its
 * verdict runs behind the next forward, in sync mode every one; the next
 * forward's fetches read what it wrote before it is committed, bitwise the
 * update in end_step (sync mode without update_behind). Sync mode is run
 * without clipping too: it goes behind whatever the verdict. */
static void behind_equals_sync(zo_tier param_home, zo_optim_mode mode, int small, int poison,
                               float max_norm)
{
    run_cfg c = base_cfg(param_home, ZO_TIER_NVME, ZO_OPTIM_SYNC);
    if (small)
        c.device_bytes = min_device_bytes();
    c.poison_steps = poison ? (1ull << 3) | (1ull << 4) : 0;
    c.max_norm = max_norm;
    run_out sync, behind;
    run(&c, &sync);
    c.mode = mode;
    c.update_behind = 1;
    atomic_int n = 0;
    c.trace = count_behind;
    c.trace_ctx = &n;
    run(&c, &behind);
    assert_same_weights(&sync, &behind, STEPS);
    int updates = 0;
    for (int s = 0; s < STEPS; s++) {
        assert_int_equal(behind.stats[s].overflow, (int)((c.poison_steps >> s) & 1));
        if (max_norm > 0)
            assert_int_equal(behind.stats[s].clipped, !behind.stats[s].overflow);
        assert_int_equal(behind.stats[s].step, sync.stats[s].step);
        updates += !behind.stats[s].overflow;
    }
    assert_int_equal(atomic_load(&n), updates);
    run_out_free(&sync);
    run_out_free(&behind);
}

static void test_update_behind_equals_sync(void **state)
{
    (void)state;
    const zo_tier homes[] = {ZO_TIER_NVME, ZO_TIER_HOST};
    const zo_optim_mode modes[] = {ZO_OPTIM_OVERLAP, ZO_OPTIM_SYNC};
    for (int h = 0; h < 2; h++)
        for (int m = 0; m < 2; m++)
            for (int small = 0; small < 2; small++)
                for (int poison = 0; poison < 2; poison++)
                    behind_equals_sync(homes[h], modes[m], small, poison, 1e-3f);
    for (int h = 0; h < 2; h++)
        behind_equals_sync(homes[h], ZO_OPTIM_SYNC, 1, 1, 0.0f);
}

static void test_dpu_matches_stale_reference(void **state)
{
    (void)state;
    tm_ref r;
    tm_ref_init(&r, ZO_DTYPE_BF16);
    zo_adam_params hp = test_adam();
    tm_ref_train(&r, &hp, STEPS, 1, 1);
    const zo_tier homes[][2] = {{ZO_TIER_DEVICE, ZO_TIER_DEVICE},
                                {ZO_TIER_HOST, ZO_TIER_HOST},
                                {ZO_TIER_HOST, ZO_TIER_NVME},
                                {ZO_TIER_NVME, ZO_TIER_NVME}};
    for (int i = 0; i < 4; i++) {
        run_cfg c = base_cfg(homes[i][0], homes[i][1], ZO_OPTIM_DPU);
        run_out o;
        run(&c, &o);
        assert_matches_reference(&o, &r, STEPS);
        run_out_free(&o);
    }
    /* with gradient accumulation (fp32 accumulators double-buffered by step parity) */
    tm_ref ra;
    tm_ref_init(&ra, ZO_DTYPE_BF16);
    tm_ref_train(&ra, &hp, 10, 2, 1);
    for (int i = 1; i < 4; i += 2) {
        run_cfg c = base_cfg(homes[i][0], homes[i][1], ZO_OPTIM_DPU);
        c.accum = 2;
        c.steps = 10;
        run_out o;
        run(&c, &o);
        assert_matches_reference(&o, &ra, 10);
        run_out_free(&o);
    }
    tm_ref_free(&ra);
    /* and it is not the synchronous result */
    tm_ref s;
    tm_ref_init(&s, ZO_DTYPE_BF16);
    tm_ref_train(&s, &hp, STEPS, 1, 0);
    assert_true(memcmp(s.master[0], r.master[0], tm_numel(0) * sizeof(float)) != 0);
    tm_ref_free(&s);
    tm_ref_free(&r);
}

/* A run at the rates lrs (dpu mode, else sync or overlap as mode says)
 * equals the reference r. */
static void expect_scheduled_run(zo_tier params, zo_tier states, int dpu, int mode,
                                 const float *lrs, const tm_ref *r)
{
    run_cfg c = base_cfg(params, states,
                         dpu    ? ZO_OPTIM_DPU
                         : mode ? ZO_OPTIM_OVERLAP
                                : ZO_OPTIM_SYNC);
    c.lrs = lrs;
    run_out o;
    run(&c, &o);
    assert_matches_reference(&o, r, STEPS);
    run_out_free(&o);
}

/* A learning rate per step (a schedule, with a zero rate on the first step
 * as DeepSpeed's WarmupCosineLR gives) in every mode and placement, against
 * the reference updated with the same rates; a rate set in the middle of a
 * step applies from the next one. */
static void test_learning_rate_per_step(void **state)
{
    (void)state;
    float lrs[STEPS];
    for (int s = 0; s < STEPS; s++)
        lrs[s] = s == 0 ? 0.0f : 2e-2f / (float)(1 + s % 7);
    const zo_tier homes[][2] = {{ZO_TIER_DEVICE, ZO_TIER_DEVICE},
                                {ZO_TIER_HOST, ZO_TIER_HOST},
                                {ZO_TIER_HOST, ZO_TIER_NVME},
                                {ZO_TIER_NVME, ZO_TIER_NVME}};
    zo_adam_params hp = test_adam();
    for (int dpu = 0; dpu < 2; dpu++) {
        tm_ref r;
        tm_ref_init(&r, ZO_DTYPE_BF16);
        tm_ref_train_lrs(&r, &hp, STEPS, 1, dpu, lrs);
        for (int i = 0; i < 4; i++)
            for (int mode = 0; mode < (dpu ? 1 : 2); mode++)
                expect_scheduled_run(homes[i][0], homes[i][1], dpu, mode, lrs, &r);
        tm_ref_free(&r);
    }
    /* a constant rate differs from the schedule (the rates are used) */
    tm_ref k;
    tm_ref_init(&k, ZO_DTYPE_BF16);
    tm_ref_train(&k, &hp, STEPS, 1, 0);
    run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_SYNC);
    c.lrs = lrs;
    run_out o;
    run(&c, &o);
    assert_true(memcmp(o.master[0], k.master[0], tm_numel(0) * sizeof(float)) != 0);
    run_out_free(&o);
    tm_ref_free(&k);
    /* mid-step: the open step keeps its rate */
    harness h;
    harness_open(&h, &c);
    ZO_ASSERT_OK(make_engine(&h, NULL, 0));
    assert_true(zo_engine_lr(h.eng) == hp.lr);
    ZO_ASSERT_OK(zo_engine_set_lr(h.eng, 0.0f)); /* step 0 runs at 0: the weights stay */
    float *before[TM_T], *after[TM_T];
    read_masters(&h, before);
    ZO_ASSERT_OK(enqueue(&h, tm_input, &(tm_input_arg){h.a, 0, 0}, sizeof(tm_input_arg)));
    ZO_ASSERT_OK(forward_layer(&h, 0));
    ZO_ASSERT_OK(zo_engine_set_lr(h.eng, 1.0f)); /* for step 1 */
    for (int l = 1; l < TM_L; l++)
        ZO_ASSERT_OK(forward_layer(&h, l));
    ZO_ASSERT_OK(enqueue(&h, tm_loss, &(tm_loss_arg){h.a, 1.0f}, sizeof(tm_loss_arg)));
    for (int l = TM_L - 1; l >= 0; l--)
        ZO_ASSERT_OK(backward_layer(&h, l, 0, 0));
    zo_step_stats st = ZO_STEP_STATS_INIT;
    ZO_ASSERT_OK(zo_engine_end_step(h.eng, &st));
    read_masters(&h, after);
    for (int k2 = 0; k2 < TM_T; k2++) {
        /* AdamW at lr 0 neither moves nor decays the weights */
        assert_memory_equal(before[k2], after[k2], tm_numel(k2) * sizeof(float));
        free(before[k2]);
        free(after[k2]);
    }
    assert_true(zo_engine_lr(h.eng) == 1.0f);
    ZO_ASSERT_ST(zo_engine_set_lr(h.eng, -1.0f), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_engine_set_lr(h.eng, NAN), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_engine_set_lr(NULL, 1.0f), ZO_ERR_INVALID_ARG);
    assert_true(zo_engine_lr(h.eng) == 1.0f);
    harness_close(&h);
}

/* Per-tensor weight decay (parameter groups: no decay on the biases, a
 * stronger one on W1) equals the reference that decays each tensor so, in
 * sync and overlap modes, states on the host and on NVMe; setting it is
 * refused after finalize, negative or for no tensor. */
static void test_per_tensor_weight_decay(void **state)
{
    (void)state;
    zo_adam_params hp = test_adam(); /* the engines' decay, 0.01 */
    tm_ref r, uniform;
    tm_ref_init(&r, ZO_DTYPE_BF16);
    tm_ref_init(&uniform, ZO_DTYPE_BF16);
    for (int k = 0; k < TM_T; k++) {
        g_own_decay[k] = r.own_decay[k] = k % 2 || k == 2;
        g_decay[k] = r.decay[k] = k == 2 ? 0.5f : 0.0f;
    }
    tm_ref_train(&r, &hp, STEPS, 1, 0);
    tm_ref_train(&uniform, &hp, STEPS, 1, 0);
    assert_true(memcmp(r.master[1], uniform.master[1], tm_numel(1) * sizeof(float)) != 0);
    for (int m = 0; m < 3; m++)
        for (int nvme = 0; nvme < 2; nvme++) {
            if (m == ZO_OPTIM_DPU)
                continue; /* its reference is the stale one (test_dpu_matches_stale_reference) */
            run_cfg c =
                base_cfg(ZO_TIER_HOST, nvme ? ZO_TIER_NVME : ZO_TIER_HOST, (zo_optim_mode)m);
            run_out o;
            run(&c, &o);
            assert_matches_reference(&o, &r, STEPS);
            run_out_free(&o);
        }
    run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_SYNC);
    harness h;
    harness_open(&h, &c);
    ZO_ASSERT_OK(make_engine(&h, NULL, 0));
    ZO_ASSERT_ST(zo_engine_set_weight_decay(h.eng, h.ids[0], 0.0f), ZO_ERR_STATE);
    assert_non_null(strstr(zo_last_error(), "already finalized"));
    ZO_ASSERT_ST(zo_engine_set_weight_decay(h.eng, TM_T, 0.0f), ZO_ERR_INVALID_ARG);
    harness_close(&h);
    harness_open(&h, &c);
    ZO_ASSERT_OK(build_engine(&h, NULL, 0, 0));
    ZO_ASSERT_ST(zo_engine_set_weight_decay(h.eng, h.ids[0], -1.0f), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "finite and >= 0"));
    harness_close(&h);
    memset(g_own_decay, 0, sizeof g_own_decay);
    tm_ref_free(&r);
    tm_ref_free(&uniform);
}

/* Parameter groups with their own rate scale, betas and eps (and one with
 * its own decay too) equal the reference that updates each tensor so, under
 * a learning-rate schedule, in every mode (dpu against its stale reference)
 * with states on the host and on NVMe; a group at scale 1 with the config's
 * betas and eps on every tensor is bitwise no group at all; bad settings and a call
 * after finalize are refused by name. */
static void test_per_tensor_adam(void **state)
{
    (void)state;
    zo_adam_params hp = test_adam();
    float lrs[STEPS];
    for (int s = 0; s < STEPS; s++)
        lrs[s] = 2e-2f / (float)(1 + s % 5);
    const tm_group groups[TM_T] = {
        {3.0, 0.8f, 0.95f, 1e-6f}, {0.25, 0.9f, 0.98f, 1e-8f}, {1.0, hp.beta1, hp.beta2, hp.eps}};
    for (int dpu = 0; dpu < 2; dpu++) {
        tm_ref r, plain;
        tm_ref_init(&r, ZO_DTYPE_BF16);
        tm_ref_init(&plain, ZO_DTYPE_BF16);
        for (int k = 0; k < TM_T; k++) {
            g_own_adam[k] = r.own_adam[k] = k < 3;
            g_group[k] = r.group[k] = groups[k < 3 ? k : 0];
        }
        g_own_decay[1] = r.own_decay[1] = 1;
        g_decay[1] = r.decay[1] = 0.25f;
        tm_ref_train_lrs(&r, &hp, STEPS, 1, dpu, lrs);
        tm_ref_train_lrs(&plain, &hp, STEPS, 1, dpu, lrs);
        for (int k = 0; k < 2; k++) /* the groups' settings are used */
            assert_true(memcmp(r.master[k], plain.master[k], tm_numel(k) * sizeof(float)) != 0);
        for (int nvme = 0; nvme < 2; nvme++)
            for (int mode = 0; mode < (dpu ? 1 : 2); mode++)
                expect_scheduled_run(ZO_TIER_HOST, nvme ? ZO_TIER_NVME : ZO_TIER_HOST, dpu, mode,
                                     lrs, &r);
        memset(g_own_decay, 0, sizeof g_own_decay);
        for (int k = 0; k < TM_T; k++) /* the config's settings as a group: no change at all */
            g_group[k] = groups[2];
        run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, dpu ? ZO_OPTIM_DPU : ZO_OPTIM_OVERLAP);
        c.lrs = lrs;
        run_out o;
        run(&c, &o);
        assert_matches_reference(&o, &plain, STEPS);
        run_out_free(&o);
        tm_ref_free(&r);
        tm_ref_free(&plain);
        memset(g_own_adam, 0, sizeof g_own_adam);
    }
    run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_SYNC);
    harness h;
    harness_open(&h, &c);
    ZO_ASSERT_OK(build_engine(&h, NULL, 0, 0));
    ZO_ASSERT_ST(zo_engine_set_tensor_adam(h.eng, h.ids[0], -1.0, 0.9f, 0.99f, 1e-8f),
                 ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "lr_scale"));
    ZO_ASSERT_ST(zo_engine_set_tensor_adam(h.eng, h.ids[0], INFINITY, 0.9f, 0.99f, 1e-8f),
                 ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_engine_set_tensor_adam(h.eng, h.ids[0], 1.0, 1.0f, 0.99f, 1e-8f),
                 ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "[0, 1)"));
    ZO_ASSERT_ST(zo_engine_set_tensor_adam(h.eng, h.ids[0], 1.0, 0.9f, 0.99f, -1e-8f),
                 ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "eps"));
    ZO_ASSERT_ST(zo_engine_set_tensor_adam(h.eng, TM_T, 1.0, 0.9f, 0.99f, 1e-8f),
                 ZO_ERR_INVALID_ARG);
    ZO_ASSERT_OK(zo_engine_finalize(h.eng));
    ZO_ASSERT_ST(zo_engine_set_tensor_adam(h.eng, h.ids[0], 1.0, 0.9f, 0.99f, 1e-8f), ZO_ERR_STATE);
    assert_non_null(strstr(zo_last_error(), "already finalized"));
    harness_close(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sync_matches_reference_everywhere),
        cmocka_unit_test(test_per_tensor_adam),
        cmocka_unit_test(test_overlap_equals_sync),
        cmocka_unit_test(test_grad_accumulation),
        cmocka_unit_test(test_overlap_with_clipping_equals_sync),
        cmocka_unit_test(test_overlap_with_overflow_equals_sync),
        cmocka_unit_test(test_update_behind_equals_sync),
        cmocka_unit_test(test_dpu_matches_stale_reference),
        cmocka_unit_test(test_learning_rate_per_step),
        cmocka_unit_test(test_per_tensor_weight_decay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
