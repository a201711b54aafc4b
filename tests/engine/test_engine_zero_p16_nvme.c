/* ZeRO with the 16-bit parameters homed on NVMe: bitwise one rank in every
 * stage and mode, split with the host, and the NVMe faults of a step (a
 * failed read or write, a corrupted extent) failing that step on every rank
 * with every rank's committed states intact. Under mpirun with 1, 2 and 4
 * ranks. */
#include "zero_harness.h"

/* ---- 16-bit parameters homed on NVMe ----
 * Stages 1 and 2: every rank keeps every chunk's 16-bit parameters in its
 * own NVMe files (the owners' broadcasts written to their alternate
 * extents); stage 3: its own chunks only. */

/* Where a rank's 16-bit parameters are, with no caps: stages 1 and 2 every
 * chunk on NVMe but, with the states in host memory, its own (there, beside
 * them, as one rank keeps them); stage 3 its own chunks only. */
static void expect_p16_on_nvme(const zcfg *z)
{
    zrun a;
    train(z, &a);
    uint32_t params[ZO_TIER_MAX], n = a.fp.n_chunks;
    uint32_t owned = n / (uint32_t)n_ranks + ((uint32_t)me < n % (uint32_t)n_ranks);
    ZO_ASSERT_OK(zo_engine_homes(a.eng, params, NULL));
    int nvme_states = z->optim_home == ZO_TIER_NVME;
    uint32_t want = n_ranks == 1    ? (nvme_states ? n : 0)
                    : z->stage == 3 ? (nvme_states ? owned : 0)
                                    : (nvme_states ? n : n - owned);
    assert_int_equal(params[ZO_TIER_NVME], want);
    uint32_t host = n_ranks > 1 && z->stage == 3 ? (nvme_states ? 0 : owned) : n - want;
    assert_int_equal(params[ZO_TIER_HOST], host);
    /* the broadcasts' two pinned buffers beside the twins (no chunk mirror) */
    if (n_ranks > 1 && want)
        assert_int_equal(a.fp.param_staging % CHUNK, 0);
    close_run(&a);
    expect_exact_as(*z);
}

static void p16_nvme_as(int stage, zo_tier oh, zo_optim_mode mode, float max_norm, int poison)
{
    zcfg z = {ZO_TIER_NVME,          oh, stage, max_norm, poison, 1, 0, 0, 0, 0, mode, 0, 0,
              ZO_REDUCE_ORDER_GLOBAL};
    expect_p16_on_nvme(&z);
}

static void p16_nvme_stages(void **state)
{
    (void)state;
    for (int stage = 1; stage <= 3; stage++)
        p16_nvme_as(stage, ZO_TIER_NVME, ZO_OPTIM_SYNC, 0.0f, -1);
    p16_nvme_as(2, ZO_TIER_NVME, ZO_OPTIM_SYNC, 0.05f, 2);
}

static void p16_nvme_states_host(void **state)
{
    (void)state;
    for (int stage = 1; stage <= 3; stage++)
        p16_nvme_as(stage, ZO_TIER_HOST, ZO_OPTIM_SYNC, 0.0f, -1);
}

static void p16_nvme_overlap(void **state)
{
    (void)state;
    p16_nvme_as(1, ZO_TIER_NVME, ZO_OPTIM_OVERLAP, 0.0f, -1);
    p16_nvme_as(2, ZO_TIER_NVME, ZO_OPTIM_OVERLAP, 0.05f, 2);
    p16_nvme_as(3, ZO_TIER_NVME, ZO_OPTIM_OVERLAP, 0.05f, 1);
    p16_nvme_as(2, ZO_TIER_HOST, ZO_OPTIM_OVERLAP, 0.0f, -1);
}

static void p16_nvme_dpu(void **state)
{
    (void)state;
    p16_nvme_as(1, ZO_TIER_NVME, ZO_OPTIM_DPU, 0.0f, -1);
    p16_nvme_as(2, ZO_TIER_NVME, ZO_OPTIM_DPU, 0.05f, 2);
    p16_nvme_as(3, ZO_TIER_NVME, ZO_OPTIM_DPU, 0.0f, -1);
    p16_nvme_as(2, ZO_TIER_HOST, ZO_OPTIM_DPU, 0.0f, -1);
}

/* Per-chunk placements: a rank's first two chunks resident on its device,
 * the next two in host memory, the rest on NVMe (stage 3: of its own). */
static void p16_nvme_split(void **state)
{
    (void)state;
    for (int stage = 1; stage <= 3; stage++) {
        zcfg z = {ZO_TIER_NVME,
                  ZO_TIER_NVME,
                  stage,
                  0.0f,
                  -1,
                  1,
                  0,
                  2 * CHUNK,
                  0,
                  0,
                  ZO_OPTIM_SYNC,
                  2 * CHUNK,
                  0,
                  ZO_REDUCE_ORDER_GLOBAL};
        zrun a;
        train(&z, &a);
        uint32_t params[ZO_TIER_MAX];
        ZO_ASSERT_OK(zo_engine_homes(a.eng, params, NULL));
        if (n_ranks > 1 && stage < 3) {
            assert_int_equal(params[ZO_TIER_DEVICE], 2);
            assert_int_equal(params[ZO_TIER_HOST], 2);
            assert_int_equal(params[ZO_TIER_NVME], a.fp.n_chunks - 4);
        }
        close_run(&a);
        expect_exact_as(z);
    }
}

/* Rank me's masters of the tensors it owns (NULL for the others'). */
static void own_masters(const zrun *r, float *out[TM_T])
{
    for (int k = 0; k < TM_T; k++) {
        out[k] = NULL;
        if (zo_engine_tensor_owner(r->eng, r->ids[k]) != me)
            continue;
        out[k] = malloc(tm_numel(k) * sizeof(float));
        ZO_ASSERT_OK(zo_engine_read_master(r->eng, r->ids[k], out[k]));
    }
}

/* Each tensor r owns: its master equals the one-rank run ref's bit for bit
 * (after: what r went through, for the message). */
static void assert_own_masters_equal(const zrun *r, const zrun *ref, int stage, const char *after)
{
    float *m[TM_T];
    own_masters(r, m);
    for (int k = 0; k < TM_T; k++) {
        if (!m[k])
            continue;
        float *y = malloc(tm_numel(k) * sizeof *y);
        ZO_ASSERT_OK(zo_engine_read_master(ref->eng, ref->ids[k], y));
        if (memcmp(m[k], y, tm_numel(k) * sizeof *y) != 0)
            fail_msg("stage %d: tensor %d differs from one rank after %s", stage, k, after);
        free(y);
        free(m[k]);
    }
}

/* Step s on every rank, rank `bad` arming an EIO at its parameter store's
 * first request, before the step (a load's read) or before its end (a
 * write of the update or of a received chunk); or, corrupt, having flipped
 * a byte of chunk 0's extents (another rank's chunk: a load fails its
 * checksum). Every rank's step fails naming `bad`, the masters stay, the
 * flipped chunk is sent again by its owner. */
static void failing_step(zrun *r, int s, int bad, int before, int corrupt)
{
    float *m0[TM_T], *m1[TM_T];
    own_masters(r, m0);
    zo_swap_t store = zo_engine_nvme_param_store(r->eng);
    assert_non_null(store);
    zo_swap_fault f = {ZO_SWAP_FAULT_EIO, 0, 0};
    if (me == bad && corrupt)
        for (uint32_t x = 0; x < 2; x++) {
            const char *path;
            uint64_t hdr, payload;
            ZO_ASSERT_OK(zo_swap_extent_location(store, x, &path, &hdr, &payload));
            FILE *fp = fopen(path, "r+b");
            assert_non_null(fp);
            assert_int_equal(fseek(fp, (long)payload + 100, SEEK_SET), 0);
            int b = fgetc(fp);
            assert_int_equal(fseek(fp, (long)payload + 100, SEEK_SET), 0);
            fputc(b ^ 0x5a, fp);
            fclose(fp);
        }
    if (me == bad && before > 0 && !corrupt) /* before < 0: nothing armed */
        ZO_ASSERT_OK(zo_swap_set_faults(store, &f, 1));
    r->a->loss = 0.0;
    ZO_ASSERT_OK(micro_batch(r, s, me, 0)); /* a failed read does not stop this rank alone */
    ZO_ASSERT_OK(zo_stream_synchronize(r->compute));
    if (me == bad && !before && !corrupt)
        ZO_ASSERT_OK(zo_swap_set_faults(store, &f, 1));
    zo_status st = zo_engine_end_step(r->eng, NULL);
    zo_stream_synchronize(r->compute);
    char want[64];
    snprintf(want, sizeof want, "rank %d of %d failed the step", bad, n_ranks);
    if (st != (corrupt ? ZO_ERR_CORRUPT : ZO_ERR_IO) || !strstr(zo_last_error(), want))
        fail_msg("rank %d, step %d: status %d, expected \"%s\": %s", me, s, (int)st, want,
                 zo_last_error());
    if (me == bad)
        ZO_ASSERT_OK(zo_swap_set_faults(store, NULL, 0));
    own_masters(r, m1);
    for (int k = 0; k < TM_T; k++) {
        if (m0[k] && memcmp(m0[k], m1[k], tm_numel(k) * sizeof(float)) != 0)
            fail_msg("rank %d: the failed step %d changed tensor %d", me, s, k);
        free(m0[k]);
        free(m1[k]);
    }
}

/* NVMe faults on the last rank: a parameter read at a load, a write after
 * the update, a received chunk's extent corrupted on disk. Each fails the
 * step on every rank naming it, leaves the weights, and the step run again
 * trains as the one-rank run without faults, bitwise. */
static void p16_nvme_faults(void **state)
{
    (void)state;
    if (n_ranks == 1)
        return; /* one rank's NVMe faults: test_engine */
    for (int stage = 2; stage <= 3; stage++) {
        zcfg z = {ZO_TIER_NVME,
                  ZO_TIER_NVME,
                  stage,
                  0.0f,
                  -1,
                  1,
                  0,
                  0,
                  0,
                  0,
                  ZO_OPTIM_SYNC,
                  0,
                  1,
                  ZO_REDUCE_ORDER_GLOBAL};
        zcfg ref = z;
        ref.stage = 0;
        zrun a, b;
        train(&ref, &b);
        open_run(&z, &a);
        int bad = n_ranks - 1;
        for (int s = 0; s < STEPS; s++) {
            if (s == 1)
                failing_step(&a, s, bad, 1, 0);
            if (s == 2)
                failing_step(&a, s, bad, 0, 0);
            if (s == 3 && stage == 2)
                failing_step(&a, s, bad, 1, 1);
            a.a->loss = 0.0;
            ZO_ASSERT_OK(micro_batch(&a, s, me, 0));
            ZO_ASSERT_OK(zo_engine_end_step(a.eng, NULL));
            ZO_ASSERT_OK(zo_stream_synchronize(a.compute));
            double loss = global_loss(a.compute, a.a->loss);
            if (memcmp(&loss, &b.losses[s], sizeof loss) != 0)
                fail_msg("stage %d, step %d: loss %.17g, one rank %.17g", stage, s, loss,
                         b.losses[s]);
        }
        assert_own_masters_equal(&a, &b, stage, "the retries");
        close_run(&a);
        close_run(&b);
    }
}

/* Step s with rank `bad`'s parameter store failing its first n requests
 * from the update on: the owners' updates stand, the failed writes (of
 * other ranks' chunks) are sent again; the step succeeds on every rank.
 * The global loss. */
static double repaired_step(zrun *r, int s, int bad, uint64_t n)
{
    zo_swap_t store = zo_engine_nvme_param_store(r->eng);
    zo_swap_fault f[64];
    for (uint64_t i = 0; i < n && i < 64; i++)
        f[i] = (zo_swap_fault){ZO_SWAP_FAULT_EIO, i, 0};
    zo_swap_stats s0 = {.struct_size = sizeof s0}, s1 = s0;
    ZO_ASSERT_OK(zo_swap_get_stats(store, &s0));
    r->a->loss = 0.0;
    ZO_ASSERT_OK(micro_batch(r, s, me, 0));
    ZO_ASSERT_OK(zo_stream_synchronize(r->compute));
    if (me == bad && n)
        ZO_ASSERT_OK(zo_swap_set_faults(store, f, n < 64 ? n : 64));
    ZO_ASSERT_OK(zo_engine_end_step(r->eng, NULL));
    ZO_ASSERT_OK(zo_stream_synchronize(r->compute));
    ZO_ASSERT_OK(zo_swap_set_faults(store, NULL, 0));
    ZO_ASSERT_OK(zo_swap_get_stats(store, &s1));
    if (me == bad) /* the faults fired: a write (n > 1: and its second try) failed */
        assert_true(s1.errors - s0.errors >= (n > 1 ? 2u : n));
    return global_loss(r->compute, r->a->loss);
}

/* Sync mode with the states in host memory (updated in place, so nothing
 * after the update may fail the step): stages 1 and 2 keep the other ranks'
 * chunks on NVMe (host_cap: the first of them in host memory, written in
 * place by the broadcasts). On the last rank: one write of another rank's
 * chunk fails (sent again at once, the step succeeds), every write fails
 * (its copies go stale: the next step's loads of them fail it on every rank
 * naming the rank, the masters kept, and the owners send them again), a
 * received chunk's extent corrupted (the step fails before its update).
 * The run equals one rank's without faults bitwise. Stage 3 keeps a rank's
 * own chunks beside its states: nothing on NVMe, nothing to fail. */
static void faults_host_states_as(int stage, uint64_t host_cap)
{
    zcfg z = {ZO_TIER_NVME,
              ZO_TIER_HOST,
              stage,
              0.0f,
              -1,
              1,
              0,
              0,
              0,
              0,
              ZO_OPTIM_SYNC,
              host_cap,
              1,
              ZO_REDUCE_ORDER_GLOBAL};
    zcfg ref = z;
    ref.stage = 0;
    ref.host_cap = 0;
    ref.faults = 0;
    zrun a, b;
    train(&ref, &b);
    open_run(&z, &a);
    zo_swap_t store = zo_engine_nvme_param_store(a.eng);
    if (stage == 3) {
        assert_null(store);
        close_run(&a);
        close_run(&b);
        return;
    }
    assert_non_null(store);
    int bad = n_ranks - 1;
    for (int s = 0; s < STEPS; s++) {
        if (s == 3)
            failing_step(&a, s, bad, -1, 0); /* the stale copies' loads */
        if (s == 3 && !host_cap)
            failing_step(&a, s, bad, 1, 1); /* chunk 0 (rank 0's) corrupted */
        double loss = repaired_step(&a, s, bad, s == 1 ? 1 : s == 2 ? 64 : 0);
        if (memcmp(&loss, &b.losses[s], sizeof loss) != 0)
            fail_msg("stage %d, step %d: loss %.17g, one rank %.17g", stage, s, loss, b.losses[s]);
    }
    assert_own_masters_equal(&a, &b, stage, "the faults");
    close_run(&a);
    close_run(&b);
}

static void p16_nvme_faults_states_host(void **state)
{
    (void)state;
    if (n_ranks == 1)
        return;
    for (int stage = 1; stage <= 3; stage++)
        faults_host_states_as(stage, 0);
    faults_host_states_as(1, 6 * CHUNK);
    faults_host_states_as(2, 6 * CHUNK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(p16_nvme_stages),
        cmocka_unit_test(p16_nvme_states_host),
        cmocka_unit_test(p16_nvme_overlap),
        cmocka_unit_test(p16_nvme_dpu),
        cmocka_unit_test(p16_nvme_split),
        cmocka_unit_test(p16_nvme_faults),
        cmocka_unit_test(p16_nvme_faults_states_host),
    };
    return zero_run_tests("test_engine_zero_p16_nvme", tests, sizeof tests / sizeof tests[0]);
}
