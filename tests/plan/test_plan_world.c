/* zo-plan over several ranks (world.h) on the model's shapes alone:
 *  - rank 0's memory is the engine's footprint for its ZeRO configuration
 *    (zo_engine_footprint_for with world_size and zero_stage);
 *  - its optimizer states are its own chunks' only: 1/N of the model's,
 *    rounded up to whole chunks; stage 3 holds fewer device parameter bytes
 *    than stage 1 with parameters on the device;
 *  - the node's host budget is shared by its ranks: a plan that fits one
 *    rank per node is refused naming the host tier with 2 per node;
 *  - the link bytes of each stage are the formulas of world.h (stage 1 an
 *    all-reduce of fp32 gradients, stages 2 and 3 a reduce, stages 1 and 2
 *    the owners' 16-bit broadcast, stage 3 gathers in their place), and on
 *    the cpu device the step adds their time;
 *  - more ranks never make a rank's states larger. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_world_test_util.h"
#include "world.h"
#include "zo_test.h"
#include "zt_error.h"

#define MiB (1ull << 20)

static const zp_speeds speeds = {25e9, 25e9, 6e9, 5e9, 2e9, 165e12, 0, 0, 0, 0};

static zp_job job_small(int grad_accum)
{
    return plan_test_job("small", 0, grad_accum);
}

/* The plans of w: out[(stage-1)*ZP_WORLD_STRATEGIES + k]. */
static void plan(const zp_job *j, const zp_hardware *hw, const zp_world *w, zp_world_plan *out,
                 int *best)
{
    if (zp_plan_world(j, hw, &speeds, w, 0, out, best, NULL) < 0)
        fail_msg("zp_plan_world: %s", zt_last_error());
}

static zp_world_plan *find(zp_world_plan *out, int stage, zp_strategy s)
{
    for (int i = 0; i < ZP_WORLD_STAGES * ZP_WORLD_STRATEGIES; i++)
        if (out[i].stage == stage && out[i].plan.strategy == s)
            return &out[i];
    fail_msg("no plan for stage %d, %s", stage, zp_strategy_name(s));
    return NULL;
}

/* The model's tensors as the engine registers them. */
typedef struct layout {
    size_t *numel;
    int *layer;
    zo_engine_layout ly;
} layout;

static layout layout_of(const zt_shape *s)
{
    layout l;
    int L = zt_engine_layers(s);
    size_t n = 0, k = 0;
    for (int i = 0; i < L; i++)
        n += (size_t)zt_layer_tensors(s, i);
    l.numel = calloc(n, sizeof *l.numel);
    l.layer = calloc(n, sizeof *l.layer);
    assert_non_null(l.numel);
    assert_non_null(l.layer);
    for (int i = 0; i < L; i++)
        for (int t = 0; t < zt_layer_tensors(s, i); t++, k++) {
            l.numel[k] = zt_tensor_numel(s, i, t);
            l.layer[k] = i;
        }
    l.ly = (zo_engine_layout)ZO_ENGINE_LAYOUT_INIT;
    l.ly.n_tensors = n;
    l.ly.numel = l.numel;
    l.ly.layer = l.layer;
    return l;
}

static void test_rank_footprint_is_the_engines(void **state)
{
    (void)state;
    zp_job j = job_small(2);
    zp_hardware hw = cpu_node(64 * GiB);
    zp_world w = world(4, 4), out_w = w;
    zp_world_plan out[ZP_WORLD_STAGES * ZP_WORLD_STRATEGIES];
    int best;
    plan(&j, &hw, &w, out, &best);
    assert_true(best >= 0);
    layout l = layout_of(&j.shape);
    zp_hardware rank_hw;
    zp_speeds rank_sp;
    zp_world_rank_share(&out_w, &hw, &speeds, &rank_hw, &rank_sp);
    assert_int_equal(rank_hw.host_bytes, hw.host_bytes / 4);
    for (int i = 0; i < ZP_WORLD_STAGES * ZP_WORLD_STRATEGIES; i++) {
        const zp_plan *p = &out[i].plan;
        zp_job rj = j;
        rj.world_size = 4;
        rj.zero_stage = out[i].stage;
        zo_engine_config cfg = zp_plan_engine_config(&rj, &rank_hw, p);
        assert_int_equal(cfg.world_size, 4);
        assert_int_equal(cfg.zero_stage, out[i].stage);
        zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
        int fits = 0;
        ZO_ASSERT_OK(zo_engine_footprint_for(&cfg, &l.ly, &fp, &fits, NULL, 0));
        assert_int_equal(fp.bytes[ZO_TIER_DEVICE], p->fp.bytes[ZO_TIER_DEVICE]);
        assert_int_equal(fp.pinned, p->fp.pinned);
        assert_int_equal(fp.bytes[ZO_TIER_HOST], p->fp.bytes[ZO_TIER_HOST]);
        assert_int_equal(fp.bytes[ZO_TIER_NVME], p->fp.bytes[ZO_TIER_NVME]);
        /* the breakdown by use adds up without wrapping */
        assert_true(p->pinned.params + p->pinned.grads + p->pinned.twins + p->pinned.staging ==
                    p->pinned.total);
        assert_true(p->pinned.staging <= p->pinned.total && p->host.accum <= p->host.total);
        assert_true(p->host.states + p->host.backups <= p->host.total);
    }
    free(l.numel);
    free(l.layer);
}

static void test_states_are_the_ranks_share(void **state)
{
    (void)state;
    zp_job j = job_small(1);
    zp_hardware hw = cpu_node(64 * GiB);
    zp_world_plan one[ZP_WORLD_STAGES * ZP_WORLD_STRATEGIES],
        four[ZP_WORLD_STAGES * ZP_WORLD_STRATEGIES];
    int best;
    zp_world w1 = world(1, 1), w4 = world(4, 1);
    plan(&j, &hw, &w1, one, &best);
    plan(&j, &hw, &w4, four, &best);
    for (int st = 1; st <= 3; st++) {
        const zp_plan *a = &find(one, st, ZP_OPTIM_HOST)->plan,
                      *b = &find(four, st, ZP_OPTIM_HOST)->plan;
        uint32_t n = a->fp.n_chunks, own = (n + 3) / 4;
        assert_int_equal(b->fp.n_chunks, n);
        /* whole chunks' states, the rank's ceil(n/4) of them */
        assert_int_equal(b->host.states * n, a->host.states * own);
        assert_true(b->optim_params < a->optim_params);
        assert_true(b->optim_params * 4 >= a->optim_params);
        assert_true(b->seconds[ZP_BN_OPTIM] < a->seconds[ZP_BN_OPTIM]);
        const zp_plan *nv = &find(four, st, ZP_OPTIM_NVME)->plan;
        const zp_plan *nv1 = &find(one, st, ZP_OPTIM_NVME)->plan;
        assert_true(nv->nvme_state_bytes < nv1->nvme_state_bytes);
        assert_true(nv->nvme_state_bytes * 4 >= nv1->nvme_state_bytes);
    }
    /* stage 3 partitions the 16-bit parameters kept on the device */
    const zp_plan *s1 = &find(four, 1, ZP_NO_OFFLOAD)->plan,
                  *s3 = &find(four, 3, ZP_NO_OFFLOAD)->plan;
    assert_true(s3->device.params < s1->device.params);
    assert_true(s3->gather_bytes > 0);
    assert_int_equal(s1->gather_bytes, 0);
}

static void test_node_host_is_shared(void **state)
{
    (void)state;
    zp_job j = job_small(1);
    zp_world_plan out[ZP_WORLD_STAGES * ZP_WORLD_STRATEGIES];
    int best;
    /* enough for one rank's optimizer-host plan at stage 2, not for two */
    zp_hardware hw = cpu_node(64 * GiB);
    zp_world alone = world(2, 1);
    plan(&j, &hw, &alone, out, &best);
    const zp_plan *p = &find(out, 2, ZP_OPTIM_HOST)->plan;
    assert_int_equal(p->fits, 1);
    uint64_t need = p->pinned.total + p->host.total;
    hw.host_bytes = need * 2 - 2; /* a rank's share: one byte short */
    zp_world shared = world(2, 2);
    plan(&j, &hw, &shared, out, &best);
    p = &find(out, 2, ZP_OPTIM_HOST)->plan;
    assert_int_equal(p->fits, 0);
    assert_non_null(strstr(p->why, "host tier"));
    hw.host_bytes = need * 2;
    plan(&j, &hw, &shared, out, &best);
    assert_int_equal(find(out, 2, ZP_OPTIM_HOST)->plan.fits, 1);
}

static void link_bytes_and_time(int grad_accum, double stage1_factor, double stage23_factor)
{
    zp_job j = job_small(grad_accum);
    zp_hardware hw = cpu_node(64 * GiB);
    zp_world w = world(2, 2);
    zp_world_plan out[ZP_WORLD_STAGES * ZP_WORLD_STRATEGIES];
    int best;
    plan(&j, &hw, &w, out, &best);
    /* parameters in use: each micro-batch's gradients go down once */
    uint64_t n = find(out, 1, ZP_OPTIM_HOST)->plan.d2h_bytes / 2 / (uint64_t)grad_accum;
    for (int i = 0; i < ZP_WORLD_STAGES * ZP_WORLD_STRATEGIES; i++) {
        const zp_world_plan *o = &out[i];
        double factor = o->stage == 1 ? stage1_factor : stage23_factor;
        assert_int_equal(o->grad_link_bytes,
                         (uint64_t)((double)((o->stage == 1 ? 8 : 4) * n) * factor));
        assert_int_equal(o->update_link_bytes, o->stage == 3 ? 0 : 2 * n);
        assert_int_equal(o->gather_link_bytes, o->plan.gather_bytes);
        assert_true((o->stage == 3) == (o->gather_link_bytes > 0));
        double link =
            (double)(o->grad_link_bytes + o->update_link_bytes + o->gather_link_bytes) / w.link;
        assert_true(fabs(o->link_seconds - link) <= 1e-12 * link);
        /* the cpu device's cores move them: they add to the rank's step */
        assert_true(fabs(o->step_seconds - (o->plan.step_seconds + link)) <=
                    1e-9 * o->step_seconds);
        assert_true(fabs(o->tokens_per_s - 2.0 * (double)o->plan.tokens / o->step_seconds) <=
                    1e-9 * o->tokens_per_s);
    }
}

/* One micro-batch per rank: one chain a step (stage 1 an all-reduce of
 * fp32 gradients, 8 B/param; stages 2 and 3 a reduce, 4). Four per rank, 2
 * ranks, in the global order: four rounds and three carries, k + (k-1)/(N+1)
 * = 5 chains' bytes at stages 2 and 3, ((k-1)(1+2/N)+2)/2 = 4 at stage 1. */
static void test_link_bytes_and_time(void **state)
{
    (void)state;
    link_bytes_and_time(1, 1.0, 1.0);
    link_bytes_and_time(4, 4.0, 5.0);
}

/* 16-bit parameters on NVMe under ZeRO: each rank's files hold every
 * chunk's two extents at stages 1 and 2 (the owners' broadcasts written
 * there), its own chunks' at stage 3; no pinned 16-bit copies (the
 * broadcasts' buffers are staging); stage 3 writes only its own. */
static void test_params_on_nvme(void **state)
{
    (void)state;
    zp_job j = job_small(1);
    zp_hardware hw = cpu_node(64 * GiB);
    zp_world w = world(4, 1);
    zp_world_plan out[ZP_WORLD_STAGES * ZP_WORLD_STRATEGIES];
    int best;
    plan(&j, &hw, &w, out, &best);
    uint64_t writes[4] = {0};
    for (int st = 1; st <= 3; st++) {
        const zp_plan *p = &find(out, st, ZP_PARAMS_NVME)->plan;
        uint64_t n = p->fp.n_chunks, own = (n + 3) / 4, held = st == 3 ? own : n;
        assert_true(p->nvme.params > 0);
        assert_int_equal(p->nvme.params % (2 * held), 0);
        assert_int_equal(p->nvme.params / (2 * held) % 4096, 0); /* whole 4 KiB extents */
        assert_true(p->nvme.params / (2 * held) <= p->fp.chunk_bytes);
        assert_int_equal(p->pinned.params, 0);
        assert_int_equal(p->nvme_write_bytes - p->nvme_state_bytes,
                         held * p->fp.chunk_bytes); /* the new 16-bit values */
        writes[st] = p->nvme_write_bytes;
    }
    assert_true(writes[3] < writes[2] && writes[2] == writes[1]);
}

static void test_bad_world_refused(void **state)
{
    (void)state;
    zp_job j = job_small(1);
    zp_hardware hw = cpu_node(64 * GiB);
    zp_world w = world(0, 1);
    zp_world_plan out[ZP_WORLD_STAGES * ZP_WORLD_STRATEGIES];
    int best;
    assert_true(zp_plan_world(&j, &hw, &speeds, &w, 0, out, &best, NULL) < 0);
    assert_non_null(strstr(zt_last_error(), "world size 0"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rank_footprint_is_the_engines),
        cmocka_unit_test(test_states_are_the_ranks_share),
        cmocka_unit_test(test_node_host_is_shared),
        cmocka_unit_test(test_link_bytes_and_time),
        cmocka_unit_test(test_params_on_nvme),
        cmocka_unit_test(test_bad_world_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
