/* zo-plan's per-chunk planner (zp_plan_split) on the model's shapes alone:
 *  - the 13b workstation job (24 GiB GPU, 2 TB NVMe, the speeds of issue 15)
 *    fits at 64 GiB of host memory with a predicted MFU >= 0.40, and is
 *    refused one byte below the least host memory it reports, naming the
 *    host tier; at that budget it fits;
 *  - the predicted parameter bytes host->device fall with the micro-group:
 *    a step of n groups moves n passes of the fetch order, each at most the
 *    first's and at least the first's less what the device slots hold
 *    (groups of 2, 4 and 8 of 8 micro-batches, which leave the device the
 *    same room: groups of one need no fp32 group gradients there);
 *  - the plan's footprint is zo_engine_footprint_for's for the chosen caps
 *    and the host budget the plan gives the engine, which spills the waiting
 *    gradients it cannot keep (the 13b plan at 64 GiB), and without NVMe-homed
 *    terms its totals are exactly it;
 *  - under random budgets (from a seed) a plan that fits never exceeds the
 *    device, host, pinned or NVMe budget, and its totals are the engine's
 *    footprint plus the modelled terms it reports, with bf16 and with fp32
 *    parameters;
 *  - at one micro-batch a group, --act-home auto plans the per-layer host
 *    store where only it fits (the tiny preset at seq 12288 in 64 MiB), the
 *    plan --act-home host gives, and keeps the device where that fits;
 *  - a sparse layout (DeepSpeed's fixed) lowers the model FLOPs and the
 *    compute time by its density against dense (zt_layout_share), counts
 *    its block mask in the arena, and is refused with the dense op. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "zo_test.h"
#include "zt_error.h"

#define GiB (1ull << 30)
#define MiB (1ull << 20)

/* The speeds of issue 15's target command. */
static const zp_speeds workstation = {25e9, 25e9, 6e9, 5e9, 2e9, 165e12, 0, 0, 0, 0};

static zp_job job_13b(void)
{
    zp_job j;
    memset(&j, 0, sizeof j);
    ZO_ASSERT_OK(zt_preset("13b", &j.shape));
    j.seq = 2048;
    j.micro_batch = 1;
    j.grad_accum = 32;
    j.dtype = ZO_DTYPE_BF16;
    j.mode = ZO_OPTIM_SYNC;
    j.mode_auto = 1;
    return j;
}

static zp_hardware gpu_24g(uint64_t host_bytes)
{
    zp_hardware hw = {"cuda", "a 24 GiB GPU",   24 * GiB, 512 * MiB, host_bytes,
                      0,      2000000000000ull, 1};
    return hw;
}

static zp_plan split(const zp_job *j, const zp_hardware *hw, const zp_speeds *sp)
{
    zp_plan p;
    if (zp_plan_split(j, hw, sp, 0, &p, NULL) < 0)
        fail_msg("zp_plan_split: %s", zt_last_error());
    return p;
}

/* The pinned bytes a plan should total: the engine's, its modelled terms,
 * and the layer inputs zo-train keeps in pinned host memory. */
static uint64_t host_pinned(const zp_plan *p)
{
    return (uint64_t)((int64_t)p->fp.pinned + p->modelled.pinned) +
           (p->act_home == ZP_ACT_HOST ? p->layer_inputs : 0);
}

static void expect_engine_footprint(const zp_job *j, const zp_hardware *hw, const zp_plan *p)
{
    zo_engine_config cfg = zp_plan_engine_config(j, hw, p);
    assert_int_equal(cfg.param_caps.bytes[ZO_TIER_DEVICE], p->param_caps.bytes[ZO_TIER_DEVICE]);
    assert_int_equal(cfg.optim_caps.bytes[ZO_TIER_HOST], p->optim_caps.bytes[ZO_TIER_HOST]);
    zt_shape s = j->shape;
    int L = zt_engine_layers(&s);
    size_t n = 0, k = 0;
    for (int l = 0; l < L; l++)
        n += (size_t)zt_layer_tensors(&s, l);
    size_t *numel = calloc(n, sizeof *numel);
    int *layer = calloc(n, sizeof *layer);
    assert_non_null(numel);
    assert_non_null(layer);
    for (int l = 0; l < L; l++)
        for (int i = 0; i < zt_layer_tensors(&s, l); i++, k++) {
            numel[k] = zt_tensor_numel(&s, l, i);
            layer[k] = l;
        }
    zo_engine_layout ly = ZO_ENGINE_LAYOUT_INIT;
    ly.n_tensors = n;
    ly.numel = numel;
    ly.layer = layer;
    zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
    int fits = 0;
    ZO_ASSERT_OK(zo_engine_footprint_for(&cfg, &ly, &fp, &fits, NULL, 0));
    assert_int_equal(fits, 1);
    assert_int_equal(fp.bytes[ZO_TIER_DEVICE], p->fp.bytes[ZO_TIER_DEVICE]);
    assert_int_equal(fp.pinned, p->fp.pinned);
    assert_int_equal(fp.bytes[ZO_TIER_HOST], p->fp.bytes[ZO_TIER_HOST]);
    assert_int_equal(fp.bytes[ZO_TIER_NVME], p->fp.bytes[ZO_TIER_NVME]);
    assert_int_equal(fp.grad_host, p->fp.grad_host);
    assert_int_equal(fp.grad_nvme, p->fp.grad_nvme);
    assert_int_equal(cfg.host_bytes, p->engine_host_budget);
    assert_int_equal(fp.n_chunks, p->fp.n_chunks);
    assert_int_equal(fp.device_param_slots, p->fp.device_param_slots);
    uint32_t homes = p->param_homes[0] + p->param_homes[1] + p->param_homes[2];
    assert_int_equal(homes, fp.n_chunks);
    free(numel);
    free(layer);
}

static void test_13b_workstation(void **state)
{
    (void)state;
    zp_job j = job_13b();
    zp_hardware hw = gpu_24g(64 * GiB);
    zp_plan p = split(&j, &hw, &workstation);
    if (!p.fits)
        fail_msg("13b at 64 GiB of host memory: %s", p.why);
    assert_true(p.mfu >= 0.40);
    assert_true(p.pinned.total + p.host.total <= 64 * GiB);
    assert_true(p.device.total <= 24 * GiB);
    /* one group per step: no fp32 accumulators beyond what the budget keeps */
    assert_int_equal(p.micro_group, 32);
    assert_true(p.host_floor > 0 && p.host_floor <= 64 * GiB);
    /* the engine, given the budget less what the plan keeps beside it (the
     * modelled pinned terms, zo-train's layer inputs in pinned and, on NVMe,
     * their carry in pageable memory), spills */
    int64_t beside = (int64_t)(p.pinned.total - p.fp.pinned) +
                     (int64_t)(p.host.total - p.fp.bytes[ZO_TIER_HOST]);
    assert_true(p.engine_host_budget > 0);
    assert_int_equal((int64_t)p.engine_host_budget, (int64_t)(64 * GiB) - beside);
    assert_true(p.grad_spill > 0 && p.fp.grad_nvme > 0);
    assert_int_equal(p.fp.grad_host, p.grad_store - p.grad_spill);
    assert_int_equal(p.host.total - p.fp.bytes[ZO_TIER_HOST],
                     p.act_home == ZP_ACT_NVME ? p.layer_inputs - p.nvme.layer_inputs : 0);
    expect_engine_footprint(&j, &hw, &p);

    /* below the least host memory the plan reports: refused, naming the host tier */
    hw.host_bytes = p.host_floor - 1;
    zp_plan q = split(&j, &hw, &workstation);
    assert_false(q.fits);
    if (!strstr(q.why, "host tier") || !strstr(q.why, "short by"))
        fail_msg("refusal at %" PRIu64 " bytes: %s", hw.host_bytes, q.why);
    hw.host_bytes = p.host_floor;
    q = split(&j, &hw, &workstation);
    if (!q.fits)
        fail_msg("at the reported floor of %" PRIu64 " bytes: %s", p.host_floor, q.why);
}

/* The small preset's width with 4 blocks, 8 micro-batches per step, in
 * 4 MiB chunks (4 per block). */
static zp_job job_small4(int group)
{
    zp_job j;
    memset(&j, 0, sizeof j);
    ZO_ASSERT_OK(zt_preset("small", &j.shape));
    j.shape.n_layers = 4;
    j.shape.vocab = 2048;
    j.seq = 64;
    j.micro_batch = 2;
    j.grad_accum = 8;
    j.dtype = ZO_DTYPE_BF16;
    j.mode = ZO_OPTIM_SYNC;
    j.micro_group = group;
    j.act_home = ZP_ACT_HOST;
    j.chunk_bytes = 4 * MiB;
    return j;
}

static zp_hardware cpu_dev(uint64_t device, uint64_t host, uint64_t nvme)
{
    zp_hardware hw = {"cpu", "test", device, 0, host, 0, nvme, 1};
    return hw;
}

static const zp_speeds unit = {1e9, 1e9, 1e9, 1e9, 1e9, 1e11, 1e11, 0, 0, 0};

static void test_h2d_falls_with_the_group(void **state)
{
    (void)state;
    /* the arena, the fp32 group gradients and one layer's slots, less than
     * a chunk to spare: no parameter chunk stays resident */
    zp_hardware hw = cpu_dev(72 * MiB, 8 * GiB, 0);
    zp_job j8 = job_small4(8);
    zp_plan one = split(&j8, &hw, &unit);
    if (!one.fits)
        fail_msg("group 8: %s", one.why);
    assert_int_equal(one.param_homes[ZO_TIER_DEVICE], 0);
    assert_true(one.h2d_param_bytes > 0);
    uint64_t slots = (uint64_t)one.fp.device_param_slots * one.fp.chunk_bytes;
    for (int g = 2; g <= 8; g *= 2) {
        zp_job j = job_small4(g);
        zp_plan p = split(&j, &hw, &unit);
        if (!p.fits)
            fail_msg("group %d: %s", g, p.why);
        uint64_t n = (uint64_t)(8 / g);
        uint64_t s = (uint64_t)p.fp.device_param_slots * p.fp.chunk_bytes;
        if (s > slots)
            slots = s;
        /* n passes: the first loads one.h2d, each later one at most that and
         * at least that less what the slots kept from the pass before */
        assert_true(p.h2d_param_bytes <= n * one.h2d_param_bytes);
        assert_true(p.h2d_param_bytes + (n - 1) * slots >= n * one.h2d_param_bytes);
        assert_int_equal(p.n_groups, (int)n);
        /* the gradients go down once per group (fp32), or per micro-batch (16-bit) */
        assert_int_equal(p.d2h_grad_bytes, n * one.d2h_grad_bytes);
    }
    /* groups of one send 16-bit gradients down for every micro-batch */
    zp_job j1 = job_small4(1);
    zp_plan p1 = split(&j1, &hw, &unit);
    assert_int_equal(p1.d2h_grad_bytes, 4 * one.d2h_grad_bytes);
}

static void test_footprint_is_the_engines(void **state)
{
    (void)state;
    /* split over all three tiers, layer-major */
    zp_job j = job_small4(0);
    j.act_home = ZP_ACT_AUTO;
    zp_hardware hw = cpu_dev(128 * MiB, 1 * MiB, 4 * GiB);
    zp_plan p = split(&j, &hw, &unit);
    assert_false(p.fits);
    /* room for the optimizer states of a few chunks beyond the least it takes */
    hw.host_bytes = p.host_floor + 3 * 6 * 4 * MiB;
    p = split(&j, &hw, &unit);
    if (!p.fits)
        fail_msg("%s", p.why);
    expect_engine_footprint(&j, &hw, &p);
    assert_true(p.optim_homes[ZO_TIER_HOST] > 0 && p.optim_homes[ZO_TIER_NVME] > 0);
    /* the update waits for the longer of Adam and its states' NVMe reads and writes */
    assert_true(p.update_seconds >= p.seconds[ZP_BN_OPTIM] && p.update_seconds <= p.step_seconds);
    assert_int_equal(p.pinned.total, host_pinned(&p));
    assert_int_equal(p.host.total, p.fp.bytes[ZO_TIER_HOST]);
    assert_int_equal(p.fp.grad_host, p.grad_store - p.grad_spill);

    /* nothing on NVMe, groups of one: the engine's footprint is the whole plan */
    j.micro_group = 1;
    j.act_home = ZP_ACT_DEVICE;
    hw = cpu_dev(128 * MiB, 8 * GiB, 0);
    p = split(&j, &hw, &unit);
    if (!p.fits)
        fail_msg("%s", p.why);
    expect_engine_footprint(&j, &hw, &p);
    assert_int_equal(p.modelled.device, 0);
    assert_int_equal(p.modelled.pinned, 0);
    assert_int_equal(p.pinned.total, p.fp.pinned);
    assert_int_equal(p.host.total, p.fp.bytes[ZO_TIER_HOST]);
    assert_int_equal(p.peak_device, p.fp.bytes[ZO_TIER_DEVICE]);
    /* no NVMe: the update is CPU Adam alone */
    assert_true(p.update_seconds == p.seconds[ZP_BN_OPTIM] && p.update_seconds > 0);
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void test_random_budgets_respected(void **state)
{
    (void)state;
    uint64_t seed = 0x5eed15ull;
    int fitted = 0, refused = 0;
    for (int it = 0; it < 60; it++) {
        zp_job j = job_small4((int)(rnd(&seed) % 9));
        j.act_home = (zp_act_home)(rnd(&seed) % 3);
        j.mode_auto = (int)(rnd(&seed) % 2);
        j.chunk_bytes = rnd(&seed) % 2 ? 0 : 4 * MiB;
        uint64_t nvme = rnd(&seed) % 3 ? (64 + rnd(&seed) % 2048) * MiB : 0;
        zp_hardware hw =
            cpu_dev((24 + rnd(&seed) % 200) * MiB, (16 + rnd(&seed) % 400) * MiB, nvme);
        if (rnd(&seed) % 4 == 0)
            hw.pinned_max = (8 + rnd(&seed) % 200) * MiB;
        for (int d = 0; d < 2; d++) { /* the same job and machine in bf16, then fp32 */
            j.dtype = d ? ZO_DTYPE_F32 : ZO_DTYPE_BF16;
            zp_plan p = split(&j, &hw, &unit);
            if (!p.fits) {
                assert_true(strstr(p.why, "tier") != NULL);
                refused++;
                continue;
            }
            fitted++;
            assert_true(p.device.total <= hw.device_bytes);
            assert_true(p.pinned.total + p.host.total <= hw.host_bytes);
            assert_true(!hw.pinned_max || p.pinned.total <= hw.pinned_max);
            assert_true(p.nvme.files <= hw.nvme_bytes);
            assert_true(p.param_caps.bytes[ZO_TIER_DEVICE] <=
                        (uint64_t)p.fp.n_chunks * p.fp.chunk_bytes);
            assert_true(p.optim_caps.bytes[ZO_TIER_HOST] <=
                        (uint64_t)p.fp.n_chunks * 6 * p.fp.chunk_bytes);
            assert_int_equal(p.pinned.total, host_pinned(&p));
            expect_engine_footprint(&j, &hw, &p);
        }
    }
    /* the budgets drawn cover both outcomes */
    assert_true(fitted > 5 && refused > 5);
}

/* The tiny preset at one micro-batch a step, the cpu device of 64 MiB. */
static zp_plan tiny_split(int seq, zp_act_home act)
{
    zp_job j;
    memset(&j, 0, sizeof j);
    ZO_ASSERT_OK(zt_preset("tiny", &j.shape));
    j.seq = seq;
    j.micro_batch = j.grad_accum = 1;
    j.dtype = ZO_DTYPE_BF16;
    j.flash_attention = 1;
    j.mode_auto = 1;
    j.mlp_chunk_bytes = 64 << 10;
    j.act_home = act;
    zp_hardware hw = {"cpu", "64 MiB", 64 * MiB, 0, 8 * GiB, 0, 0, 0};
    return split(&j, &hw, &workstation);
}

static void test_auto_act_home_takes_the_per_layer_store(void **state)
{
    (void)state;
    zp_plan dev = tiny_split(12288, ZP_ACT_DEVICE), host = tiny_split(12288, ZP_ACT_HOST);
    zp_plan any = tiny_split(12288, ZP_ACT_AUTO);
    assert_false(dev.fits);
    assert_true(host.fits);
    assert_true(any.fits);
    assert_int_equal(any.act_home, ZP_ACT_HOST);
    assert_int_equal(any.micro_group, 1);
    assert_int_equal(any.device.total, host.device.total);
    assert_true(any.step_seconds == host.step_seconds);
    zp_plan short_any = tiny_split(2048, ZP_ACT_AUTO);
    assert_true(short_any.fits);
    assert_int_equal(short_any.act_home, ZP_ACT_DEVICE);
}

static zp_plan plan_small(const zp_job *j)
{
    zp_hardware hw = {"cpu", "8 GiB", 8 * GiB, 0, 64 * GiB, 0, 0, 0};
    zp_plan p;
    if (zp_plan_strategy(j, &hw, &workstation, ZP_NO_OFFLOAD, 0, &p, NULL) < 0)
        fail_msg("zp_plan_strategy: %s", zt_last_error());
    return p;
}

static void test_fixed_layout_lowers_flops_by_its_density(void **state)
{
    (void)state;
    zp_job j;
    memset(&j, 0, sizeof j);
    ZO_ASSERT_OK(zt_preset("small", &j.shape));
    j.seq = 4096;
    j.micro_batch = j.grad_accum = 1;
    j.dtype = ZO_DTYPE_BF16;
    j.flash_attention = 1;
    zp_plan dense = plan_small(&j);
    zo_attn_layout l = ZO_ATTN_LAYOUT_INIT;
    l.kind = ZO_ATTN_LAYOUT_FIXED, l.block = 64, l.window_blocks = 4, l.global_blocks = 1;
    j.layout = l;
    zp_plan fixed = plan_small(&j);
    double share;
    ZO_ASSERT_OK(zt_layout_share(&l, 0, j.seq, &share));
    assert_true(share < 0.5);
    /* the attention's 12 seq q_dim per layer and token, and the recompute's 4 seq dim */
    const double tokens = (double)j.seq, L = j.shape.n_layers, seq = j.seq;
    double attn = tokens * L * 12.0 * seq * zt_q_dim(&j.shape);
    double recompute = tokens * L * 4.0 * seq * j.shape.dim;
    assert_true(fabs(dense.model_flops - fixed.model_flops - attn * (1 - share)) <=
                1e-9 * dense.model_flops);
    double dense_c = dense.seconds[ZP_BN_COMPUTE], fixed_c = fixed.seconds[ZP_BN_COMPUTE];
    double rate = tokens *
                  zp_device_flops_per_token(&(zp_job){
                      .shape = j.shape, .seq = j.seq, .micro_batch = 1, .grad_accum = 1}) /
                  dense_c;
    assert_true(fabs((dense_c - fixed_c) * rate - (attn + recompute) * (1 - share)) <=
                1e-9 * dense_c * rate);
    /* the mask: nb x nb bytes, 256-aligned, beside the tokens and the RoPE table */
    uint64_t nb = (uint64_t)j.seq / 64, mask = (nb * nb + 255) / 256 * 256;
    assert_int_equal(fixed.device.inputs, dense.device.inputs + mask);
    j.flash_attention = 0;
    zp_hardware hw = {"cpu", "8 GiB", 8 * GiB, 0, 64 * GiB, 0, 0, 0};
    zp_plan p;
    assert_int_equal(zp_plan_strategy(&j, &hw, &workstation, ZP_NO_OFFLOAD, 0, &p, NULL),
                     ZO_ERR_CONFIG);
    assert_non_null(strstr(zt_last_error(), "use --attention flash"));
    assert_int_equal(zp_plan_split(&j, &hw, &workstation, 0, &p, NULL), ZO_ERR_CONFIG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_13b_workstation),
        cmocka_unit_test(test_h2d_falls_with_the_group),
        cmocka_unit_test(test_footprint_is_the_engines),
        cmocka_unit_test(test_random_budgets_respected),
        cmocka_unit_test(test_auto_act_home_takes_the_per_layer_store),
        cmocka_unit_test(test_fixed_layout_lowers_flops_by_its_density),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
