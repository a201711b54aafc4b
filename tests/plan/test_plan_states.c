/* zo-plan with compact optimizer states (--state-dtype fp32|bf16|int8):
 *  - each format's state bytes in host memory are what the engine's
 *    footprint (zo_engine_footprint_for under the plan's engine config, with
 *    its state_dtype) counts: Z per chunk, master fp32 and m, v in the format;
 *  - the optimizer-on-NVMe plan's states per step are the sum over the
 *    engine's chunks of zo_engine_nvme_state_bytes_as, each way, and those
 *    of bf16 and int8 are below fp32's (about 8/12 and 6/12);
 *  - the per-chunk 13b workstation plan under each format is the engine's
 *    footprint for its caps (the format reaches every config the planner
 *    builds), and bf16/int8 move fewer NVMe bytes per step than fp32;
 *  - the CPU Adam rate of a format not measured is fp32's times the
 *    documented ratio, and a measured one is used as given;
 *  - with --embedding-f32-states on, int8 plans count the embedding's fp32
 *    moments as the engine lays them out (4 code bytes an element). */
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "zo/optim.h"
#include "zo_test.h"
#include "zt_error.h"

#define GiB (1ull << 30)
#define MiB (1ull << 20)

static const zo_dtype formats[3] = {ZO_DTYPE_F32, ZO_DTYPE_BF16, ZO_DTYPE_I8};
static const zp_speeds workstation = {25e9, 25e9, 6e9, 5e9, 2e9, 165e12, 0, 0, 0, 0};

static zp_job job_of(const char *preset, int seq, int accum, zo_dtype states)
{
    zp_job j;
    memset(&j, 0, sizeof j);
    ZO_ASSERT_OK(zt_preset(preset, &j.shape));
    j.seq = seq;
    j.micro_batch = 1;
    j.grad_accum = accum;
    j.dtype = ZO_DTYPE_BF16;
    j.mode = ZO_OPTIM_SYNC;
    j.state_dtype = states;
    return j;
}

static zp_hardware gpu_24g(uint64_t host_bytes)
{
    zp_hardware hw = {"cuda", "a 24 GiB GPU",   24 * GiB, 512 * MiB, host_bytes,
                      0,      2000000000000ull, 1};
    return hw;
}

/* The engine's footprint for the plan's config over the model's tensors. */
static zo_engine_footprint engine_footprint(const zp_job *j, const zp_hardware *hw,
                                            const zp_plan *p)
{
    zo_engine_config cfg = zp_plan_engine_config(j, hw, p);
    assert_int_equal(cfg.state_dtype, j->state_dtype);
    zt_shape s = j->shape;
    int L = zt_engine_layers(&s);
    size_t n = 0, k = 0;
    for (int l = 0; l < L; l++)
        n += (size_t)zt_layer_tensors(&s, l);
    size_t *numel = calloc(n, sizeof *numel);
    int *layer = calloc(n, sizeof *layer);
    unsigned char *keep = calloc(n, 1);
    assert_non_null(numel);
    assert_non_null(layer);
    assert_non_null(keep);
    for (int l = 0; l < L; l++)
        for (int i = 0; i < zt_layer_tensors(&s, l); i++, k++) {
            numel[k] = zt_tensor_numel(&s, l, i);
            layer[k] = l;
        }
    keep[0] = (unsigned char)j->embedding_f32; /* the embedding is the first tensor */
    zo_engine_layout ly = ZO_ENGINE_LAYOUT_INIT;
    ly.n_tensors = n;
    ly.numel = numel;
    ly.layer = layer;
    ly.keep_f32 = keep;
    zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
    int fits = 0;
    ZO_ASSERT_OK(zo_engine_footprint_for(&cfg, &ly, &fp, &fits, NULL, 0));
    free(numel);
    free(layer);
    free(keep);
    return fp;
}

static zp_plan fixed(const zp_job *j, const zp_hardware *hw, zp_strategy s)
{
    zp_plan p;
    if (zp_plan_strategy(j, hw, &workstation, s, 0, &p, NULL) < 0)
        fail_msg("zp_plan_strategy: %s", zt_last_error());
    return p;
}

/* Optimizer states in host memory, sync, no accumulation: the footprint's
 * host tier is the states alone, and the planner's count is it. */
static void test_host_state_bytes_are_the_engines(void **state)
{
    (void)state;
    zp_hardware hw = gpu_24g(1ull << 40);
    uint64_t bytes[3];
    for (int f = 0; f < 3; f++) {
        zp_job j = job_of("small", 512, 1, formats[f]);
        zp_plan p = fixed(&j, &hw, ZP_OPTIM_HOST);
        zo_engine_footprint fp = engine_footprint(&j, &hw, &p);
        assert_int_equal(fp.bytes[ZO_TIER_HOST], p.fp.bytes[ZO_TIER_HOST]);
        assert_int_equal(p.host.states, fp.bytes[ZO_TIER_HOST]);
        assert_int_equal(p.host.states, (uint64_t)p.fp.n_chunks *
                                            zp_chunk_state_bytes(formats[f], p.fp.chunk_bytes / 2));
        bytes[f] = p.host.states;
    }
    /* master 4 + m, v: 8 (fp32), 4 (bf16), about 2 (int8) bytes per parameter */
    assert_true(bytes[1] * 12 <= bytes[0] * 8 + bytes[0] / 100);
    assert_true(bytes[2] * 12 <= bytes[0] * 6 + bytes[0] / 10); /* + the block scales */
    assert_true(bytes[2] < bytes[1] && bytes[1] < bytes[0]);
}

/* Optimizer states on NVMe: what moves per step is the engine's packed
 * extent of each chunk, each way. */
static void test_nvme_bytes_per_step_are_the_engines(void **state)
{
    (void)state;
    zp_hardware hw = gpu_24g(1ull << 40);
    uint64_t per_step[3];
    for (int f = 0; f < 3; f++) {
        zp_job j = job_of("small", 512, 1, formats[f]);
        zp_plan p = fixed(&j, &hw, ZP_OPTIM_NVME);
        uint64_t *chunk = NULL;
        uint32_t nc = 0;
        ZO_ASSERT_OK(zp_nvme_chunk_states(&j, &chunk, &nc));
        assert_int_equal(nc, p.fp.n_chunks);
        /* zp_nvme_chunk_states packs at zo-train's default chunk: plan at it too */
        j.chunk_bytes = p.fp.chunk_bytes;
        p = fixed(&j, &hw, ZP_OPTIM_NVME);
        uint64_t want = 0;
        for (uint32_t c = 0; c < nc; c++) {
            assert_true(chunk[c] <=
                        zo_engine_nvme_state_bytes_as(formats[f], p.fp.chunk_bytes / 2));
            want += chunk[c];
        }
        free(chunk);
        assert_int_equal(p.nvme_state_bytes, want);
        assert_int_equal(p.nvme_read_bytes, want);
        assert_int_equal(p.nvme_write_bytes, want);
        zo_engine_footprint fp = engine_footprint(&j, &hw, &p);
        assert_int_equal(fp.bytes[ZO_TIER_NVME], p.fp.bytes[ZO_TIER_NVME]);
        per_step[f] = want;
    }
    assert_true(per_step[1] <= per_step[0] * 0.70);
    assert_true(per_step[2] <= per_step[0] * 0.55);
}

/* The 13b workstation job under each format: the footprint is the engine's
 * for the chosen caps (with the format), and the compact formats move fewer
 * bytes and run the step no slower. */
static void test_13b_per_chunk_plan_per_format(void **state)
{
    (void)state;
    zp_hardware hw = gpu_24g(64 * GiB);
    zp_plan p[3];
    for (int f = 0; f < 3; f++) {
        zp_job j = job_of("13b", 2048, 32, formats[f]);
        j.mode_auto = 1;
        if (zp_plan_split(&j, &hw, &workstation, 0, &p[f], NULL) < 0)
            fail_msg("zp_plan_split: %s", zt_last_error());
        if (!p[f].fits)
            fail_msg("13b, %d: %s", (int)formats[f], p[f].why);
        zo_engine_footprint fp = engine_footprint(&j, &hw, &p[f]);
        assert_int_equal(fp.bytes[ZO_TIER_NVME], p[f].fp.bytes[ZO_TIER_NVME]);
        assert_int_equal(fp.bytes[ZO_TIER_HOST], p[f].fp.bytes[ZO_TIER_HOST]);
        assert_int_equal(fp.pinned, p[f].fp.pinned);
    }
    assert_true(p[1].nvme_state_bytes < p[0].nvme_state_bytes);
    assert_true(p[2].nvme_state_bytes < p[1].nvme_state_bytes);
    assert_true(p[1].step_seconds < p[0].step_seconds);
    /* each NVMe-homed chunk's extents (the homes differ with the room each format leaves) */
    uint64_t ext[3];
    for (int f = 0; f < 3; f++)
        ext[f] = p[f].nvme.states / p[f].optim_homes[ZO_TIER_NVME];
    assert_true(ext[2] < ext[1] && ext[1] < ext[0]);
}

/* The master split on NVMe (job.master_split): each chunk moves the engine's
 * split layout (zo_engine_nvme_split_state_bytes) each way, the footprint is
 * the engine's for the config (split on: the stages' up bits in host memory,
 * a second pinned copy of device-resident chunks), the extents keep their
 * size, and the bytes per step fall below 0.55 (bf16) and 0.40 (int8) of
 * fp32's full master; with the parameters on NVMe too, nothing changes. */
static void test_master_split_traffic(void **state)
{
    (void)state;
    zp_hardware hw = gpu_24g(1ull << 40);
    uint64_t full32 = 0;
    for (int f = 0; f < 3; f++) {
        zp_job j = job_of("small", 512, 1, formats[f]);
        zp_plan whole = fixed(&j, &hw, ZP_OPTIM_NVME);
        j.chunk_bytes = whole.fp.chunk_bytes;
        whole = fixed(&j, &hw, ZP_OPTIM_NVME);
        j.master_split = 1;
        zp_plan p = fixed(&j, &hw, ZP_OPTIM_NVME);
        zo_engine_config cfg = zp_plan_engine_config(&j, &hw, &p);
        assert_int_equal(cfg.master_split, 1);
        zo_engine_footprint fp = engine_footprint(&j, &hw, &p);
        assert_int_equal(fp.bytes[ZO_TIER_NVME], p.fp.bytes[ZO_TIER_NVME]);
        assert_int_equal(fp.bytes[ZO_TIER_HOST], p.fp.bytes[ZO_TIER_HOST]);
        assert_int_equal(fp.pinned, p.fp.pinned);
        /* the states' extents (without the split, device-resident chunks
         * keep their 16-bit copies on NVMe too: nvme.params) */
        assert_int_equal(p.nvme.states, whole.nvme.states);
        j.master_split = 0;
        assert_true(p.nvme_state_bytes < whole.nvme_state_bytes);
        assert_int_equal(p.nvme_read_bytes, p.nvme_state_bytes);
        assert_int_equal(p.nvme_write_bytes, p.nvme_state_bytes);
        if (f == 0)
            full32 = whole.nvme_state_bytes;
        else
            assert_true(p.nvme_state_bytes <= full32 * (f == 1 ? 0.55 : 0.40));
        j.master_split = 1;
        zp_plan both = fixed(&j, &hw, ZP_PARAMS_NVME);
        j.master_split = 0;
        zp_plan both_whole = fixed(&j, &hw, ZP_PARAMS_NVME);
        assert_int_equal(both.nvme_state_bytes, both_whole.nvme_state_bytes);
    }
}

static void test_adam_rate_per_format(void **state)
{
    (void)state;
    zp_speeds sp = workstation;
    assert_true(zp_adam_rate(&sp, ZO_DTYPE_F32) == 2e9);
    assert_true(zp_adam_rate(&sp, ZO_DTYPE_BF16) == 2e9 * ZP_ADAM_BF16_RATIO);
    assert_true(zp_adam_rate(&sp, ZO_DTYPE_I8) == 2e9 * ZP_ADAM_I8_RATIO);
    sp.adam_params_bf16 = 3e9;
    sp.adam_params_i8 = 1e9;
    assert_true(zp_adam_rate(&sp, ZO_DTYPE_BF16) == 3e9);
    assert_true(zp_adam_rate(&sp, ZO_DTYPE_I8) == 1e9);
}

/* int8 states with the embedding's moments in fp32: the plan's host states
 * and NVMe bytes per step are the engine's footprint with the embedding
 * marked; its room (4 x 32000 x 640 elements) sets the chunk, so every
 * chunk's host states grow with it; fp32 states are not changed by it. */
static void test_embedding_f32_states_counted(void **state)
{
    (void)state;
    zp_hardware hw = gpu_24g(1ull << 40);
    for (int f = 0; f < 3; f += 2) {
        zp_job j = job_of("small", 512, 1, formats[f]), plain = j;
        j.embedding_f32 = 1;
        zp_plan p = fixed(&j, &hw, ZP_OPTIM_HOST), q = fixed(&plain, &hw, ZP_OPTIM_HOST);
        zo_engine_footprint fp = engine_footprint(&j, &hw, &p);
        assert_int_equal(p.host.states, fp.bytes[ZO_TIER_HOST]);
        if (formats[f] == ZO_DTYPE_F32) {
            assert_int_equal(p.host.states, q.host.states);
            assert_int_equal(p.fp.chunk_bytes, q.fp.chunk_bytes);
            continue;
        }
        assert_true(p.fp.chunk_bytes >= 2 * zo_adam_q8_small_room(32000 * 640));
        assert_true(p.fp.chunk_bytes > q.fp.chunk_bytes);
        assert_true(p.host.states > q.host.states);
        p = fixed(&j, &hw, ZP_OPTIM_NVME);
        fp = engine_footprint(&j, &hw, &p);
        assert_int_equal(fp.bytes[ZO_TIER_NVME], p.fp.bytes[ZO_TIER_NVME]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_state_bytes_are_the_engines),
        cmocka_unit_test(test_nvme_bytes_per_step_are_the_engines),
        cmocka_unit_test(test_13b_per_chunk_plan_per_format),
        cmocka_unit_test(test_adam_rate_per_format),
        cmocka_unit_test(test_master_split_traffic),
        cmocka_unit_test(test_embedding_f32_states_counted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
