/* zo_engine_footprint_for and zo_engine_chunks_for: the plan of a model
 * described only by its tensor sizes equals zo_engine_plan of the same
 * tensors registered on an engine, field by field, under every placement,
 * mode, accumulation and device budget; the packing matches a plain
 * reference of the documented rule; malformed layouts are refused. fp32
 * parameters (param_dtype ZO_DTYPE_F32) are planned beside bf16 ones. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "zo/checked.h"
#include "zo/device.h"
#include "zo/engine.h"
#include "zo_test.h"

#define MAX_T 64

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    return zo_test_rand(&rng_state);
}

typedef struct model {
    size_t n;
    size_t numel[MAX_T];
    int layer[MAX_T];
    unsigned char keep[MAX_T]; /* zo_engine_keep_f32_states */
} model;

/* A random model: 1..6 layers of 1..5 tensors of 1..40000 elements, with
 * now and then a tensor larger than the chunk (the chunk grows to fit it). */
static void random_model(model *m)
{
    memset(m, 0, sizeof *m);
    int layers = 1 + (int)(rnd() % 6);
    for (int l = 0; l < layers; l++) {
        int k = 1 + (int)(rnd() % 5);
        for (int i = 0; i < k && m->n < MAX_T; i++) {
            m->numel[m->n] = 1 + rnd() % 40000;
            if (rnd() % 17 == 0)
                m->numel[m->n] += 70000;
            m->layer[m->n++] = l;
        }
    }
}

static zo_engine_layout layout_of(const model *m)
{
    zo_engine_layout ly = ZO_ENGINE_LAYOUT_INIT;
    ly.n_tensors = m->n;
    ly.numel = m->numel;
    ly.layer = m->layer;
    ly.keep_f32 = m->keep;
    return ly;
}

static void expect_same_footprint(const zo_engine_footprint *a, const zo_engine_footprint *b)
{
    assert_int_equal(a->bytes[ZO_TIER_DEVICE], b->bytes[ZO_TIER_DEVICE]);
    assert_int_equal(a->pinned, b->pinned);
    assert_int_equal(a->bytes[ZO_TIER_HOST], b->bytes[ZO_TIER_HOST]);
    assert_int_equal(a->bytes[ZO_TIER_NVME], b->bytes[ZO_TIER_NVME]);
    assert_int_equal(a->chunk_bytes, b->chunk_bytes);
    assert_int_equal(a->n_chunks, b->n_chunks);
    assert_int_equal(a->max_chunks_per_layer, b->max_chunks_per_layer);
    assert_int_equal(a->device_param_slots, b->device_param_slots);
    assert_int_equal(a->device_grad_slots, b->device_grad_slots);
    assert_int_equal(a->n_params, b->n_params);
    assert_int_equal(a->param_staging, b->param_staging);
    assert_int_equal(a->grad_pinned, b->grad_pinned);
    assert_int_equal(a->grad_host, b->grad_host);
    assert_int_equal(a->grad_nvme, b->grad_nvme);
    assert_int_equal(a->grad_stage, b->grad_stage);
}

/* zo_engine_plan on an engine holding the model's tensors (zeros). */
static void plan_registered(zo_device_t dev, const zo_engine_config *cfg, const model *m,
                            zo_engine_footprint *fp, int *fits, char *msg, size_t cap)
{
    static float zeros[110000];
    zo_engine_config c = *cfg;
    const char *paths[1] = {"/nonexistent-never-opened"};
    c.device = dev;
    c.nvme_paths = paths;
    c.n_nvme_paths = 1;
    zo_engine_t e = NULL;
    ZO_ASSERT_OK(zo_engine_init(&e, &c));
    for (size_t i = 0; i < m->n; i++) {
        int id;
        ZO_ASSERT_OK(zo_engine_register(e, m->layer[i], "t", m->numel[i], zeros, &id));
        if (m->keep[i])
            ZO_ASSERT_OK(zo_engine_keep_f32_states(e, id));
    }
    ZO_ASSERT_OK(zo_engine_plan(e, fp, fits, msg, cap));
    zo_engine_free(e);
}

/* The footprint of an engine holding the model and of the planner without
 * one are the same, refusal message and all (into *a); 1 when it fits. */
static int compare_plans(zo_device_t dev, const zo_engine_config *c, const model *m,
                         const zo_engine_layout *ly, zo_engine_footprint *a)
{
    zo_engine_footprint b = ZO_ENGINE_FOOTPRINT_INIT;
    int fa = -1, fb = -1;
    char ma[512], mb[512];
    plan_registered(dev, c, m, a, &fa, ma, sizeof ma);
    ZO_ASSERT_OK(zo_engine_footprint_for(c, ly, &b, &fb, mb, sizeof mb));
    expect_same_footprint(a, &b);
    assert_int_equal(fa, fb);
    assert_string_equal(ma, mb);
    return fa;
}

static void test_footprint_for_equals_plan(void **state)
{
    (void)state;
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    dc.mem_budget = 64u << 20;
    zo_device_t dev = NULL;
    ZO_ASSERT_OK(zo_device_init(&dev, &dc));
    static const zo_tier homes[][2] = {
        {ZO_TIER_DEVICE, ZO_TIER_DEVICE}, {ZO_TIER_DEVICE, ZO_TIER_HOST},
        {ZO_TIER_HOST, ZO_TIER_HOST},     {ZO_TIER_DEVICE, ZO_TIER_NVME},
        {ZO_TIER_HOST, ZO_TIER_NVME},     {ZO_TIER_NVME, ZO_TIER_NVME}};
    int n_fit = 0, n_refused = 0;
    for (int trial = 0; trial < 40; trial++) {
        model m;
        random_model(&m);
        zo_engine_layout ly = layout_of(&m);
        for (size_t h = 0; h < sizeof homes / sizeof homes[0]; h++)
            for (int mode = ZO_OPTIM_SYNC; mode <= ZO_OPTIM_DPU; mode++) {
                zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
                c.param_home = homes[h][0];
                c.optim_home = homes[h][1];
                c.mode = (zo_optim_mode)mode;
                c.grad_accum_steps = 1 + (int)(rnd() % 3);
                c.chunk_bytes = (rnd() % 3) * 48000; /* 0: the default 4 MiB */
                c.device_bytes = 1 + rnd() % (8u << 20);
                c.pinned_bytes = rnd() % 4 == 0 ? rnd() % (4u << 20) : 0;
                c.nvme_bytes = rnd() % 4 == 0 ? rnd() % (8u << 20) : 0;
                c.host_bytes = rnd() % 4 == 0 ? rnd() % (16u << 20) : 0;
                /* the same configuration with 16-bit, then fp32 parameters */
                for (int d = 0; d < 2; d++) {
                    c.param_dtype = d ? ZO_DTYPE_F32 : ZO_DTYPE_BF16;
                    zo_engine_footprint a = ZO_ENGINE_FOOTPRINT_INIT;
                    compare_plans(dev, &c, &m, &ly, &a) ? n_fit++ : n_refused++;
                }
            }
    }
    assert_true(n_fit > 50 && n_refused > 50); /* both outcomes were compared */
    zo_device_free(dev);
}

/* Per-chunk homes: random caps on the tiers faster than the homes give the
 * same footprint with and without an engine, and more host caps put more on
 * the host and less on NVMe. */
static void test_split_footprint_for_equals_plan(void **state)
{
    (void)state;
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    dc.mem_budget = 64u << 20;
    zo_device_t dev = NULL;
    ZO_ASSERT_OK(zo_device_init(&dev, &dc));
    static const zo_tier homes[][2] = {{ZO_TIER_DEVICE, ZO_TIER_HOST},
                                       {ZO_TIER_HOST, ZO_TIER_HOST},
                                       {ZO_TIER_HOST, ZO_TIER_NVME},
                                       {ZO_TIER_NVME, ZO_TIER_NVME}};
    for (int trial = 0; trial < 20; trial++) {
        model m;
        random_model(&m);
        zo_engine_layout ly = layout_of(&m);
        for (size_t h = 0; h < sizeof homes / sizeof homes[0]; h++)
            for (int mode = ZO_OPTIM_SYNC; mode <= ZO_OPTIM_DPU; mode++) {
                zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
                c.param_home = homes[h][0];
                c.optim_home = homes[h][1];
                c.mode = (zo_optim_mode)mode;
                c.chunk_bytes = 48000;
                c.device_bytes = 1 + rnd() % (8u << 20);
                if (c.param_home > ZO_TIER_DEVICE)
                    c.param_caps.bytes[ZO_TIER_DEVICE] = rnd() % (1u << 20);
                if (c.param_home > ZO_TIER_HOST)
                    c.param_caps.bytes[ZO_TIER_HOST] = rnd() % (1u << 20);
                if (c.optim_home > ZO_TIER_DEVICE)
                    c.optim_caps.bytes[ZO_TIER_DEVICE] = rnd() % (3u << 20);
                if (c.optim_home > ZO_TIER_HOST)
                    c.optim_caps.bytes[ZO_TIER_HOST] = rnd() % (3u << 20);
                zo_engine_footprint a = ZO_ENGINE_FOOTPRINT_INIT, b = ZO_ENGINE_FOOTPRINT_INIT;
                int fb = -1;
                c.param_dtype = ZO_DTYPE_F32; /* fp32 parameters: 4-byte slots and copies */
                compare_plans(dev, &c, &m, &ly, &a);
                c.param_dtype = ZO_DTYPE_BF16;
                compare_plans(dev, &c, &m, &ly, &a);
                if (c.optim_home != ZO_TIER_NVME)
                    continue;
                zo_engine_config more = c; /* one more chunk's states on the host */
                more.optim_caps.bytes[ZO_TIER_HOST] += 6 * a.chunk_bytes;
                ZO_ASSERT_OK(zo_engine_footprint_for(&more, &ly, &b, &fb, NULL, 0));
                assert_true(b.bytes[ZO_TIER_HOST] >= a.bytes[ZO_TIER_HOST] &&
                            b.bytes[ZO_TIER_NVME] <= a.bytes[ZO_TIER_NVME]);
            }
    }
    zo_device_free(dev);
}

/* fp32 parameters: chunk_bytes C holds C/4 of them, and the fp32 terms of
 * engine.h's formulas take F = C bytes a chunk where 16-bit ones take 2*C
 * (3 layers of 1000 elements, host homes, 2 micro-batches: S = N = 3, K = 1,
 * Z = 3*F, accumulators F*N). */
static void test_fp32_terms_follow_the_formulas(void **state)
{
    (void)state;
    size_t numel[3] = {1000, 1000, 1000};
    int layer[3] = {0, 1, 2};
    zo_engine_layout ly = ZO_ENGINE_LAYOUT_INIT;
    ly.n_tensors = 3;
    ly.numel = numel;
    ly.layer = layer;
    const uint64_t C = 8192;
    for (int d = 0; d < 2; d++) {
        zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
        c.param_dtype = d ? ZO_DTYPE_F32 : ZO_DTYPE_BF16;
        c.chunk_bytes = C;
        c.grad_accum_steps = 2;
        zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
        int fits = 0;
        ZO_ASSERT_OK(zo_engine_footprint_for(&c, &ly, &fp, &fits, NULL, 0));
        uint64_t F = d ? C : 2 * C;
        assert_true(fits);
        assert_int_equal(fp.chunk_bytes, C);
        assert_int_equal(fp.n_chunks, 3);
        assert_int_equal(fp.bytes[ZO_TIER_DEVICE], 3 * C + C);
        assert_int_equal(fp.pinned, 3 * C + 3 * C);
        assert_int_equal(fp.bytes[ZO_TIER_HOST], 3 * (3 * F) + 3 * F);
        assert_int_equal(fp.bytes[ZO_TIER_NVME], 0);
        zo_engine_chunk_info info[3];
        uint32_t n = 0;
        ZO_ASSERT_OK(zo_engine_chunks_for(&c, &ly, info, 3, &n));
        assert_int_equal(info[0].used_bytes, 1000 * (d ? 4 : 2));
    }
    /* a tensor of 3000 fp32 elements does not fit 8 KiB: the chunk grows to its bytes */
    numel[1] = 3000;
    zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
    c.param_dtype = ZO_DTYPE_F32;
    c.chunk_bytes = C;
    zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
    int fits = 0;
    ZO_ASSERT_OK(zo_engine_footprint_for(&c, &ly, &fp, &fits, NULL, 0));
    assert_int_equal(fp.chunk_bytes, 12288);
}

/* device_bytes 0: no limit, every parameter chunk gets a slot. */
static void test_unlimited_device(void **state)
{
    (void)state;
    model m = {3, {1000, 5000, 70000}, {0, 1, 1}, {0}};
    zo_engine_layout ly = layout_of(&m);
    zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
    c.chunk_bytes = 100000; /* raised to 140000, rounded to 143360 */
    zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
    int fits = 0;
    ZO_ASSERT_OK(zo_engine_footprint_for(&c, &ly, &fp, &fits, NULL, 0));
    assert_true(fits);
    assert_int_equal(fp.chunk_bytes, 143360);
    assert_int_equal(fp.n_chunks, 3); /* layer 1: 5000 + 70000 > 71680 elements */
    assert_int_equal(fp.device_param_slots, 3);
    assert_int_equal(fp.bytes[ZO_TIER_DEVICE], 3 * 143360 + 2 * 143360);
    assert_int_equal(fp.n_params, 76000);
}

/* Swap extents hold the fullest chunk's packed states, not the chunk
 * size's worst case: a small model in 256 MiB chunks reserved 6 GiB of
 * swap here (18 GiB for a 3.5M-parameter model), now what it holds. */
static void test_nvme_extents_sized_to_the_model(void **state)
{
    (void)state;
    model m = {3, {1000, 5000, 3000}, {0, 1, 1}, {0}};
    zo_engine_layout ly = layout_of(&m);
    zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
    c.chunk_bytes = 256u << 20;
    c.optim_home = ZO_TIER_NVME;
    zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
    int fits = 0;
    ZO_ASSERT_OK(zo_engine_footprint_for(&c, &ly, &fp, &fits, NULL, 0));
    assert_int_equal(fp.n_chunks, 2);
    /* the fullest chunk: 5000 elements, then 3000 at 5120 */
    assert_int_equal(zo_engine_nvme_state_bytes(8120), 3 * 32768);
    assert_int_equal(fp.bytes[ZO_TIER_NVME], 2 * 2 * zo_engine_nvme_state_bytes(8120));
    /* 16-bit parameters on NVMe too: extents of the fullest chunk's 16 KiB */
    c.param_home = ZO_TIER_NVME;
    ZO_ASSERT_OK(zo_engine_footprint_for(&c, &ly, &fp, &fits, NULL, 0));
    assert_int_equal(fp.bytes[ZO_TIER_NVME], 2 * 2 * (zo_engine_nvme_state_bytes(8120) + 16384));
}

/* Compact states: NVMe extents of their format's bytes (the fp32 master
 * and the moments, padded to 4 KiB as a whole), and every tier's count the
 * same with and without an engine. */
static void test_state_formats_counted(void **state)
{
    (void)state;
    /* 8192 elements: bf16 4 + 2 + 2 bytes each; int8 4 + 1 + 1 and 2 x 32 block scales */
    assert_int_equal(zo_engine_nvme_state_bytes_as(ZO_DTYPE_F32, 8120), 3 * 32768);
    assert_int_equal(zo_engine_nvme_state_bytes_as(ZO_DTYPE_BF16, 8120), 65536);
    assert_int_equal(zo_engine_nvme_state_bytes_as(ZO_DTYPE_I8, 8120),
                     (32768 + 2 * (8192 + 128) + 4095) / 4096 * 4096);
    assert_int_equal(zo_engine_nvme_state_bytes_as(ZO_DTYPE_F16, 8120), 0);
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    dc.mem_budget = 64u << 20;
    zo_device_t dev = NULL;
    ZO_ASSERT_OK(zo_device_init(&dev, &dc));
    model m = {3, {1000, 5000, 3000}, {0, 1, 1}, {0}};
    zo_engine_layout ly = layout_of(&m);
    static const zo_dtype fmts[] = {ZO_DTYPE_BF16, ZO_DTYPE_I8};
    for (int f = 0; f < 2; f++)
        for (int oh = ZO_TIER_DEVICE; oh <= ZO_TIER_NVME; oh++)
            for (int mode = ZO_OPTIM_SYNC; mode <= ZO_OPTIM_DPU; mode++) {
                zo_engine_config c = ZO_ENGINE_CONFIG_INIT, f32;
                c.chunk_bytes = 256u << 10;
                c.optim_home = (zo_tier)oh;
                c.param_home = oh == ZO_TIER_DEVICE ? ZO_TIER_DEVICE : ZO_TIER_HOST;
                c.mode = (zo_optim_mode)mode;
                f32 = c;
                c.state_dtype = fmts[f];
                zo_engine_footprint a = ZO_ENGINE_FOOTPRINT_INIT, b = ZO_ENGINE_FOOTPRINT_INIT;
                zo_engine_footprint w = ZO_ENGINE_FOOTPRINT_INIT;
                int fa = -1, fb = -1;
                char ma[512], mb[512];
                plan_registered(dev, &c, &m, &a, &fa, ma, sizeof ma);
                ZO_ASSERT_OK(zo_engine_footprint_for(&c, &ly, &b, &fb, mb, sizeof mb));
                expect_same_footprint(&a, &b);
                ZO_ASSERT_OK(zo_engine_footprint_for(&f32, &ly, &w, &fb, NULL, 0));
                uint64_t sa = a.bytes[ZO_TIER_DEVICE] + a.pinned + a.bytes[ZO_TIER_HOST] +
                              a.bytes[ZO_TIER_NVME];
                assert_true(sa < w.bytes[ZO_TIER_DEVICE] + w.pinned + w.bytes[ZO_TIER_HOST] +
                                     w.bytes[ZO_TIER_NVME]);
                /* int8: the 3000-element tensor (below ZO_ADAM_Q8_MIN_NUMEL) takes the
                 * room of its fp32 moments, 4 code bytes an element, after the 5000's */
                uint64_t fullest = f ? 5120 + zo_adam_q8_small_room(3000) : 8120;
                if (oh == ZO_TIER_NVME)
                    assert_int_equal(a.bytes[ZO_TIER_NVME],
                                     2 * 2 * zo_engine_nvme_state_bytes_as(fmts[f], fullest));
            }
    zo_engine_config bad = ZO_ENGINE_CONFIG_INIT;
    bad.state_dtype = ZO_DTYPE_F16;
    zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
    int fits;
    ZO_ASSERT_ST(zo_engine_footprint_for(&bad, &ly, &fp, &fits, NULL, 0), ZO_ERR_INVALID_ARG);
    zo_device_free(dev);
}

/* A tensor marked by zo_engine_keep_f32_states (the embedding's fp32
 * moments) is counted as the engine lays it out: with int8 states the room
 * of its fp32 moments, 4 code bytes an element, in every tier, the same with
 * and without an engine; with fp32 or bf16 states the mark changes nothing. */
static void test_kept_f32_tensor_counted(void **state)
{
    (void)state;
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    dc.mem_budget = 64u << 20;
    zo_device_t dev = NULL;
    ZO_ASSERT_OK(zo_device_init(&dev, &dc));
    model m = {3, {6000, 5000, 3000}, {0, 1, 1}, {1, 0, 0}}, plain = m;
    plain.keep[0] = 0;
    static const zo_dtype fmts[] = {ZO_DTYPE_F32, ZO_DTYPE_BF16, ZO_DTYPE_I8};
    for (int f = 0; f < 3; f++)
        for (int oh = ZO_TIER_DEVICE; oh <= ZO_TIER_NVME; oh++) {
            zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
            c.chunk_bytes = 32u << 10;
            c.optim_home = (zo_tier)oh;
            c.param_home = oh == ZO_TIER_DEVICE ? ZO_TIER_DEVICE : ZO_TIER_HOST;
            c.state_dtype = fmts[f];
            zo_engine_footprint a = ZO_ENGINE_FOOTPRINT_INIT, b = ZO_ENGINE_FOOTPRINT_INIT;
            zo_engine_footprint p = ZO_ENGINE_FOOTPRINT_INIT;
            int fa = -1, fb = -1;
            plan_registered(dev, &c, &m, &a, &fa, NULL, 0);
            zo_engine_layout ly = layout_of(&m), pl = layout_of(&plain);
            ZO_ASSERT_OK(zo_engine_footprint_for(&c, &ly, &b, &fb, NULL, 0));
            expect_same_footprint(&a, &b);
            ZO_ASSERT_OK(zo_engine_footprint_for(&c, &pl, &p, &fb, NULL, 0));
            if (fmts[f] != ZO_DTYPE_I8) {
                expect_same_footprint(&a, &p);
                continue;
            }
            /* the 6000-element tensor takes 24064 elements: the chunk grows to them */
            assert_int_equal(p.chunk_bytes, 32u << 10);
            assert_true(a.chunk_bytes >= 2 * zo_adam_q8_small_room(6000));
            if (oh == ZO_TIER_NVME) /* layer 0's chunk is the fullest */
                assert_int_equal(
                    a.bytes[ZO_TIER_NVME],
                    2 * 2 *
                        zo_engine_nvme_state_bytes_as(ZO_DTYPE_I8, zo_adam_q8_small_room(6000)));
        }
    zo_device_free(dev);
}

/* The documented packing rule, written out plainly. */
static uint32_t reference_pack(const model *m, uint64_t chunk_elems, zo_engine_chunk_info *out)
{
    uint32_t n = 0;
    uint64_t off = 0;
    for (size_t i = 0; i < m->n; i++) {
        uint64_t at = (off + 127) / 128 * 128;
        if (i == 0 || m->layer[i] != m->layer[i - 1] || at + m->numel[i] > chunk_elems) {
            n++;
            at = 0;
        }
        off = at + m->numel[i];
        out[n - 1].layer = m->layer[i];
        out[n - 1].used_bytes = off * 2;
    }
    return n;
}

static void test_chunks_for_matches_reference(void **state)
{
    (void)state;
    for (int trial = 0; trial < 200; trial++) {
        model m;
        random_model(&m);
        zo_engine_layout ly = layout_of(&m);
        zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
        c.chunk_bytes = 4096 * (1 + rnd() % 40);
        zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
        int fits;
        ZO_ASSERT_OK(zo_engine_footprint_for(&c, &ly, &fp, &fits, NULL, 0));
        zo_engine_chunk_info got[MAX_T], want[MAX_T];
        uint32_t n = 0;
        ZO_ASSERT_OK(zo_engine_chunks_for(&c, &ly, got, MAX_T, &n));
        assert_int_equal(n, fp.n_chunks);
        assert_int_equal(reference_pack(&m, fp.chunk_bytes / 2, want), n);
        for (uint32_t i = 0; i < n; i++) {
            assert_int_equal(got[i].layer, want[i].layer);
            assert_int_equal(got[i].used_bytes, want[i].used_bytes);
        }
        /* a short array gets the first chunks; the count is the whole */
        uint32_t n2 = 0;
        zo_engine_chunk_info one = {-1, 0};
        ZO_ASSERT_OK(zo_engine_chunks_for(&c, &ly, &one, 1, &n2));
        assert_int_equal(n2, n);
        assert_int_equal(one.used_bytes, want[0].used_bytes);
    }
}

static void expect_refused(const zo_engine_config *c, const zo_engine_layout *ly, const char *what)
{
    zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
    int fits;
    uint32_t n;
    ZO_ASSERT_ST(zo_engine_footprint_for(c, ly, &fp, &fits, NULL, 0), ZO_ERR_INVALID_ARG);
    if (!strstr(zo_last_error(), what))
        fail_msg("expected '%s' in: %s", what, zo_last_error());
    ZO_ASSERT_ST(zo_engine_chunks_for(c, ly, NULL, 0, &n), ZO_ERR_INVALID_ARG);
}

static void test_bad_layouts_are_refused(void **state)
{
    (void)state;
    zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
    model m = {3, {10, 20, 30}, {0, 1, 1}, {0}};
    zo_engine_layout ly = layout_of(&m);
    ly.struct_size = 8;
    expect_refused(&c, &ly, "struct_size");
    ly = layout_of(&m);
    ly.numel = NULL;
    expect_refused(&c, &ly, "numel NULL");
    ly = layout_of(&m);
    ly.n_tensors = 0;
    expect_refused(&c, &ly, "at least one tensor");
    m.layer[2] = 3; /* skips layer 2 */
    ly = layout_of(&m);
    expect_refused(&c, &ly, "tensor 2");
    m.layer[2] = 1;
    m.layer[0] = 1; /* does not start at layer 0 */
    expect_refused(&c, &ly, "tensor 0");
    m.layer[0] = 0;
    m.numel[1] = 0;
    expect_refused(&c, &ly, "tensor 1");
    m.numel[1] = 20;
    c.param_home = ZO_TIER_NVME; /* needs the states on NVMe */
    zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
    int fits;
    ZO_ASSERT_ST(zo_engine_footprint_for(&c, &ly, &fp, &fits, NULL, 0), ZO_ERR_UNSUPPORTED);
    c = (zo_engine_config)ZO_ENGINE_CONFIG_INIT;
    c.struct_size = 4;
    ZO_ASSERT_ST(zo_engine_footprint_for(&c, &ly, &fp, &fits, NULL, 0), ZO_ERR_INVALID_ARG);
    c = (zo_engine_config)ZO_ENGINE_CONFIG_INIT;
    ZO_ASSERT_ST(zo_engine_footprint_for(&c, &ly, NULL, &fits, NULL, 0), ZO_ERR_INVALID_ARG);
    /* a chunk of 2^64 - 1 bytes rounded to 4 KiB wrapped to 0 and divided by
     * it (SIGFPE); 2^62 wrapped the tiers' sums */
    const size_t huge[] = {SIZE_MAX, (size_t)1 << 62, ZO_MAX_CHUNK_BYTES + 1};
    for (int i = 0; i < 3; i++) {
        c.chunk_bytes = huge[i];
        ZO_ASSERT_ST(zo_engine_footprint_for(&c, &ly, &fp, &fits, NULL, 0), ZO_ERR_INVALID_ARG);
        assert_non_null(strstr(zo_last_error(), "chunk_bytes is"));
    }
    ZO_ASSERT_ST(zo_engine_chunks_for(&c, &ly, NULL, 2, &(uint32_t){0}), ZO_ERR_INVALID_ARG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_footprint_for_equals_plan),
        cmocka_unit_test(test_state_formats_counted),
        cmocka_unit_test(test_kept_f32_tensor_counted),
        cmocka_unit_test(test_unlimited_device),
        cmocka_unit_test(test_fp32_terms_follow_the_formulas),
        cmocka_unit_test(test_nvme_extents_sized_to_the_model),
        cmocka_unit_test(test_chunks_for_matches_reference),
        cmocka_unit_test(test_bad_layouts_are_refused),
        cmocka_unit_test(
            test_split_footprint_for_equals_plan), /* last: draws from the shared rng */
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
