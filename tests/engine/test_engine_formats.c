/* Compact optimizer state formats (bf16 and 8-bit moments): bitwise equal
 * across placements and modes as fp32's are, fewer bytes in every tier,
 * losses near fp32's, raw checkpoints that resume on another placement;
 * small and marked tensors keep fp32 moments under 8-bit states. */
#include <math.h>

#include "engine_harness.h"

/* Sync and overlap runs of c, with the verdict's clipping and overflows,
 * bitwise equal; then dpu on c's homes equal to dpu on the host. */
static void compact_modes_equal(run_cfg c, const run_out *dpu_host)
{
    run_out sync, ovl, dpu;
    c.mode = ZO_OPTIM_SYNC;
    run(&c, &sync);
    c.mode = ZO_OPTIM_OVERLAP;
    run(&c, &ovl);
    assert_same_weights(&sync, &ovl, STEPS);
    c.mode = ZO_OPTIM_DPU;
    c.max_norm = 0.0f;
    c.poison_steps = 0;
    run(&c, &dpu);
    assert_same_weights(dpu_host, &dpu, STEPS);
    run_out_free(&sync);
    run_out_free(&ovl);
    run_out_free(&dpu);
}

typedef struct raw_state {
    float *master[TM_T];
    void *mom[TM_T][2];
    zo_engine_step_state ss;
} raw_state;

static void raw_save(harness *h, raw_state *r)
{
    for (int k = 0; k < TM_T; k++) {
        r->master[k] = malloc(tm_numel(k) * sizeof(float));
        for (int i = 0; i < 2; i++)
            r->mom[k][i] = malloc(
                zo_adam_moment_bytes(zo_engine_tensor_state_dtype(h->eng, h->ids[k]), tm_numel(k)));
        ZO_ASSERT_OK(
            zo_engine_read_state_raw(h->eng, h->ids[k], r->master[k], r->mom[k][0], r->mom[k][1]));
    }
    r->ss = (zo_engine_step_state)ZO_ENGINE_STEP_STATE_INIT;
    ZO_ASSERT_OK(zo_engine_get_step_state(h->eng, &r->ss));
}

static void raw_free(raw_state *r)
{
    for (int k = 0; k < TM_T; k++) {
        free(r->master[k]);
        free(r->mom[k][0]);
        free(r->mom[k][1]);
    }
}

/* Saved as stored at step 6 on the host, restored on NVMe (parameters
 * too, the smallest device budget): steps 6..11 equal the run that never
 * stopped. Through fp32 (read_state/write_state) 8-bit moments would be
 * requantized, so raw is what a checkpoint of them uses. */
static void compact_checkpoint_resumes(void)
{
    const int half = 6;
    run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_SYNC);
    harness h;
    harness_open(&h, &c);
    ZO_ASSERT_OK(make_engine(&h, NULL, 0));
    assert_int_equal(zo_engine_state_dtype(h.eng), g_state_dtype);
    double losses[TM_MAXSTEPS], got_losses[TM_MAXSTEPS];
    train_range(&h, 0, half, losses);
    raw_state r;
    raw_save(&h, &r);
    train_range(&h, half, 2 * half, losses);
    float *ref[TM_T], *got[TM_T];
    read_masters(&h, ref);
    harness_close(&h);
    run_cfg n = base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, ZO_OPTIM_SYNC);
    n.device_bytes = min_device_bytes();
    harness_open(&h, &n);
    ZO_ASSERT_OK(make_engine(&h, NULL, 0));
    for (int k = 0; k < TM_T; k++)
        ZO_ASSERT_OK(
            zo_engine_write_state_raw(h.eng, h.ids[k], r.master[k], r.mom[k][0], r.mom[k][1]));
    ZO_ASSERT_OK(zo_engine_set_step_state(h.eng, &r.ss));
    train_range(&h, half, 2 * half, got_losses);
    read_masters(&h, got);
    harness_close(&h);
    assert_memory_equal(&got_losses[half], &losses[half], (size_t)half * sizeof(double));
    for (int k = 0; k < TM_T; k++) {
        assert_memory_equal(got[k], ref[k], tm_numel(k) * sizeof(float));
        free(got[k]);
        free(ref[k]);
    }
    raw_free(&r);
}

static int fp32_states_again(void **state)
{
    (void)state;
    g_state_dtype = ZO_DTYPE_F32;
    return 0;
}

/* bf16 and 8-bit moments: every placement and mode bitwise equal to each
 * other, as fp32's are (sync on each placement; overlap with clipping and
 * overflows equal to sync; dpu on NVMe equal to dpu on the host); their
 * states take fewer bytes in every tier; the losses follow fp32's; a raw
 * checkpoint resumes bitwise on another placement. */
static void test_compact_states_everywhere(void **state)
{
    (void)state;
    run_out f32;
    run_cfg base = base_cfg(ZO_TIER_HOST, ZO_TIER_NVME, ZO_OPTIM_SYNC);
    run(&base, &f32);
    static const zo_dtype fmts[] = {ZO_DTYPE_BF16, ZO_DTYPE_I8};
    for (int f = 0; f < 2; f++) {
        g_state_dtype = fmts[f];
        run_out ref, dpu_host;
        run(&base, &ref);
        assert_true(ref.fp.bytes[ZO_TIER_NVME] < f32.fp.bytes[ZO_TIER_NVME] &&
                    ref.fp.pinned < f32.fp.pinned);
        /* each step reads and writes every chunk's states in the format, packed: W's chunk
         * and b's (CHUNK / 2 and TM_D elements) per layer */
        uint64_t per_step = TM_L * (zo_engine_nvme_state_bytes_as(fmts[f], CHUNK / 2) +
                                    zo_engine_nvme_state_bytes_as(fmts[f], TM_D));
        for (int s = 0; s < STEPS; s++) {
            assert_int_equal(ref.stats[s].nvme_read_bytes, per_step);
            assert_int_equal(ref.stats[s].nvme_write_bytes, per_step);
        }
        /* 8 and about 6 bytes per element of W's chunk where fp32 takes 12 */
        assert_true(zo_engine_nvme_state_bytes_as(fmts[f], CHUNK / 2) * 12 <=
                    zo_engine_nvme_state_bytes(CHUNK / 2) * (f ? 7 : 8));
        assert_true(fabs(ref.losses[STEPS - 1] - f32.losses[STEPS - 1]) <
                    0.05 * fabs(f32.losses[STEPS - 1]));
        assert_true(memcmp(ref.master[0], f32.master[0], tm_numel(0) * sizeof(float)) != 0);
        const zo_tier homes[][2] = {{ZO_TIER_DEVICE, ZO_TIER_DEVICE},
                                    {ZO_TIER_HOST, ZO_TIER_HOST},
                                    {ZO_TIER_DEVICE, ZO_TIER_NVME},
                                    {ZO_TIER_NVME, ZO_TIER_NVME}};
        for (int i = 0; i < 4; i++) {
            run_out o;
            run_cfg c = base_cfg(homes[i][0], homes[i][1], ZO_OPTIM_SYNC);
            run(&c, &o);
            assert_same_weights(&ref, &o, STEPS);
            run_out_free(&o);
        }
        run_cfg d = base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_DPU);
        run(&d, &dpu_host);
        for (int i = 0; i < 3; i++) {
            run_cfg c = base_cfg(i == 2 ? ZO_TIER_NVME : ZO_TIER_HOST,
                                 i ? ZO_TIER_NVME : ZO_TIER_HOST, ZO_OPTIM_SYNC);
            c.dtype = ZO_DTYPE_BF16;
            c.poison_steps = (1ull << 3) | (1ull << 11);
            c.max_norm = 0.5f;
            c.device_bytes = i ? min_device_bytes() : 0;
            compact_modes_equal(c, &dpu_host);
        }
        compact_checkpoint_resumes();
        run_out_free(&ref);
        run_out_free(&dpu_host);
    }
    g_state_dtype = ZO_DTYPE_F32;
    run_out_free(&f32);
}

/* One step's states of every tensor, as stored (raw), in format fmt. */
static void one_step_states(zo_dtype fmt, zo_tier ph, zo_tier oh, raw_state *r)
{
    g_state_dtype = fmt;
    run_cfg c = base_cfg(ph, oh, ZO_OPTIM_SYNC);
    harness h;
    harness_open(&h, &c);
    ZO_ASSERT_OK(make_engine(&h, NULL, 0));
    double losses[TM_MAXSTEPS];
    train_range(&h, 0, 1, losses);
    raw_save(&h, r);
    for (int k = 0; k < TM_T; k++) /* W (D x D) quantized, b (D) below ZO_ADAM_Q8_MIN_NUMEL */
        assert_int_equal(zo_engine_tensor_state_dtype(h.eng, h.ids[k]),
                         fmt == ZO_DTYPE_I8 && (k % 2 || k == g_keep_f32) ? ZO_DTYPE_F32 : fmt);
    assert_int_equal(zo_engine_tensor_state_dtype(h.eng, TM_T), ZO_DTYPE_NONE);
    harness_close(&h);
    g_state_dtype = ZO_DTYPE_F32;
}

/* With 8-bit states, tensors below ZO_ADAM_Q8_MIN_NUMEL elements keep fp32
 * moments (bitsandbytes' min_8bit_size): after the first step (the same
 * gradients in both runs, no clipping) the biases' master, m and v are those
 * of an fp32-states run bit for bit, on the host and on NVMe; the weights'
 * moments are 8-bit codes. */
static void test_q8_small_tensors_keep_fp32_moments(void **state)
{
    (void)state;
    raw_state f32, q8;
    one_step_states(ZO_DTYPE_F32, ZO_TIER_HOST, ZO_TIER_HOST, &f32);
    for (int i = 0; i < 2; i++) {
        one_step_states(ZO_DTYPE_I8, ZO_TIER_HOST, i ? ZO_TIER_NVME : ZO_TIER_HOST, &q8);
        for (int k = 1; k < TM_T; k += 2) {
            assert_memory_equal(q8.master[k], f32.master[k], tm_numel(k) * sizeof(float));
            assert_memory_equal(q8.mom[k][0], f32.mom[k][0], tm_numel(k) * sizeof(float));
            assert_memory_equal(q8.mom[k][1], f32.mom[k][1], tm_numel(k) * sizeof(float));
        }
        assert_true(memcmp(q8.mom[0][0], f32.mom[0][0], tm_numel(0)) != 0);
        raw_free(&q8);
    }
    raw_free(&f32);
}

/* zo_engine_keep_f32_states, as zo-train marks the token embedding: with
 * 8-bit states the marked weight (layer 0's W, 4096 elements, quantized
 * otherwise) keeps fp32 moments. After the first step (the same gradients in
 * both runs) its master, m and v are an fp32-states run's bit for bit on the
 * host and on NVMe, as the biases' are, while the other weights' moments stay
 * 8-bit codes; a raw checkpoint of it resumes bitwise on another placement;
 * with fp32 states the mark changes no bit; marking after finalize or a
 * tensor that does not exist is refused. */
static void test_q8_kept_tensor_keeps_fp32_moments(void **state)
{
    (void)state;
    raw_state f32, q8, marked;
    one_step_states(ZO_DTYPE_F32, ZO_TIER_HOST, ZO_TIER_HOST, &f32);
    g_keep_f32 = 0;
    one_step_states(ZO_DTYPE_F32, ZO_TIER_HOST, ZO_TIER_HOST, &marked);
    for (int k = 0; k < TM_T; k++)
        assert_memory_equal(marked.mom[k][1], f32.mom[k][1], tm_numel(k) * sizeof(float));
    raw_free(&marked);
    for (int i = 0; i < 2; i++) {
        one_step_states(ZO_DTYPE_I8, ZO_TIER_HOST, i ? ZO_TIER_NVME : ZO_TIER_HOST, &q8);
        for (int k = 0; k < TM_T; k += k ? 2 : 1) { /* W0 and the biases */
            assert_memory_equal(q8.master[k], f32.master[k], tm_numel(k) * sizeof(float));
            assert_memory_equal(q8.mom[k][0], f32.mom[k][0], tm_numel(k) * sizeof(float));
            assert_memory_equal(q8.mom[k][1], f32.mom[k][1], tm_numel(k) * sizeof(float));
        }
        assert_true(memcmp(q8.mom[2][0], f32.mom[2][0], tm_numel(2)) != 0);
        raw_free(&q8);
    }
    raw_free(&f32);
    g_state_dtype = ZO_DTYPE_I8;
    compact_checkpoint_resumes();
    g_state_dtype = ZO_DTYPE_F32;
    g_keep_f32 = -1;
    run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_SYNC);
    harness h;
    harness_open(&h, &c);
    ZO_ASSERT_OK(make_engine(&h, NULL, 0));
    ZO_ASSERT_ST(zo_engine_keep_f32_states(h.eng, h.ids[0]), ZO_ERR_STATE);
    assert_non_null(strstr(zo_last_error(), "already finalized"));
    ZO_ASSERT_ST(zo_engine_keep_f32_states(h.eng, TM_T), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_engine_keep_f32_states(NULL, 0), ZO_ERR_INVALID_ARG);
    harness_close(&h);
}

static int keep_none_again(void **state)
{
    (void)state;
    g_keep_f32 = -1;
    g_state_dtype = ZO_DTYPE_F32;
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_compact_states_everywhere, fp32_states_again),
        cmocka_unit_test(test_q8_small_tensors_keep_fp32_moments),
        cmocka_unit_test_teardown(test_q8_kept_tensor_keeps_fp32_moments, keep_none_again),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
