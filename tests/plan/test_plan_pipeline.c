/* zo-plan over a pipeline (pipeline.h) on the model's shapes alone:
 *  - each stage's memory is the engine's footprint for that stage's layers
 *    (zo_engine_footprint_for over a layout built here from the model's
 *    tensors, with ZeRO stage 1 over the stage's data-parallel group), and
 *    zo-train's arena: the model's with zt_pipe_sets sets of layer inputs,
 *    and on a tied model's last stage its device copy of layer 0;
 *  - the split covers every engine layer once, contiguous, no stage empty,
 *    for every stage count up to the layers (uneven counts included), and
 *    a given split is kept or refused with the stage that breaks it;
 *  - the balanced split's slowest stage (then its bytes) is the least over
 *    every contiguous split (brute force), on random costs and the model's;
 *  - the step is (M+S-1) x the slowest stage's micro-batch plus the longest
 *    tail; the bubble and the p2p bytes are their formulas; on the cpu
 *    device the sends add to a stage's micro-batch;
 *  - S larger than the engine layers, or a world size that is no multiple
 *    of S, is refused with a message naming both. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"
#include "plan_world_test_util.h"
#include "zo_test.h"
#include "zt_error.h"

static const zp_speeds speeds = {25e9, 25e9, 6e9, 5e9, 2e9, 165e12, 0, 0, 0, 0};

static zp_job job_of(const char *preset, int layers, int grad_accum)
{
    return plan_test_job(preset, layers, grad_accum);
}

static void plan(const zp_job *j, const zp_hardware *hw, const zp_world *w, int S, const int *split,
                 zp_pipeline_plan *out)
{
    if (zp_plan_pipeline(j, hw, &speeds, w, S, split, 0, out, NULL) < 0)
        fail_msg("zp_plan_pipeline: %s", zt_last_error());
}

/* The tensors of engine layers [a, b) as a stage's engine registers them
 * (its layers from 0). */
typedef struct layout {
    size_t *numel;
    int *layer;
    zo_engine_layout ly;
} layout;

static layout stage_layout(const zt_shape *s, int a, int b)
{
    int model[512], L = 0;
    for (int l = a; l < b; l++)
        model[L++] = l;
    size_t n = 0, k = 0;
    for (int i = 0; i < L; i++)
        n += (size_t)zt_layer_tensors(s, model[i]);
    layout l;
    l.numel = calloc(n, sizeof *l.numel);
    l.layer = calloc(n, sizeof *l.layer);
    assert_non_null(l.numel);
    assert_non_null(l.layer);
    for (int i = 0; i < L; i++)
        for (int t = 0; t < zt_layer_tensors(s, model[i]); t++, k++) {
            l.numel[k] = zt_tensor_numel(s, model[i], t);
            l.layer[k] = i;
        }
    l.ly = (zo_engine_layout)ZO_ENGINE_LAYOUT_INIT;
    l.ly.n_tensors = n;
    l.ly.numel = l.numel;
    l.ly.layer = l.layer;
    return l;
}

/* Stage s's memory against the engine's footprint of its layers. */
static void check_stage_footprint(const zp_job *job, const zp_hardware *node, const zp_world *w,
                                  const zp_pipeline_plan *p, int s)
{
    const zp_stage_plan *st = &p->stage[s];
    zp_hardware hw;
    zp_speeds sp;
    zp_world_rank_share(w, node, &speeds, &hw, &sp);
    zp_job j = *job;
    j.world_size = p->data_parallel > 1 ? p->data_parallel : 0;
    j.zero_stage = p->data_parallel > 1 ? 1 : 0;
    zo_engine_config cfg = zp_plan_engine_config(&j, &hw, &st->plan);
    layout l = stage_layout(&job->shape, st->first, st->end);
    zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
    int fits = 0;
    char msg[400];
    ZO_ASSERT_OK(zo_engine_footprint_for(&cfg, &l.ly, &fp, &fits, msg, sizeof msg));
    assert_int_equal(fp.n_params, st->plan.fp.n_params);
    assert_int_equal(fp.n_chunks, st->plan.fp.n_chunks);
    assert_int_equal(fp.bytes[ZO_TIER_DEVICE], st->plan.fp.bytes[ZO_TIER_DEVICE]);
    assert_int_equal(fp.pinned, st->plan.fp.pinned);
    assert_int_equal(fp.bytes[ZO_TIER_HOST], st->plan.fp.bytes[ZO_TIER_HOST]);
    assert_int_equal(fp.bytes[ZO_TIER_NVME], st->plan.fp.bytes[ZO_TIER_NVME]);
    uint64_t params = 0;
    for (size_t i = 0; i < l.ly.n_tensors; i++)
        params += l.numel[i];
    assert_int_equal(st->plan.fp.n_params, params);
    free(l.numel);
    free(l.layer);
}

/* Stage s's activations and extra device bytes against zo-train's. */
static void check_stage_arena(const zp_job *job, const zp_pipeline_plan *p, int s)
{
    const zp_stage_plan *st = &p->stage[s];
    const zp_plan *q = &st->plan;
    zt_model_config mc = {
        job->shape, job->seq, job->micro_batch, job->grad_accum, job->dtype, 0, {0}, 0, 0};
    zt_act_group g = {st->in_flight, ZT_ACT_DEVICE};
    assert_int_equal(q->device.inputs + q->device.checkpoints + q->device.workspace,
                     zt_model_activation_bytes_group(&mc, &g));
    uint64_t copy = 0;
    if (job->shape.tied && s == p->stages - 1)
        copy = 2 * ((uint64_t)job->shape.vocab * job->shape.dim + job->shape.dim);
    assert_int_equal(st->tied_copy_bytes, copy);
    assert_int_equal(q->device.total, q->fp.bytes[ZO_TIER_DEVICE] +
                                          zt_model_activation_bytes_group(&mc, &g) +
                                          q->device.reserve + copy);
}

static void test_stage_footprints_are_the_engines(void **state)
{
    (void)state;
    const char *names[] = {"small", "tied", "small, states on NVMe",
                           "small, ZeRO 1 with parameters on NVMe"};
    for (int t = 0; t < 4; t++) {
        zp_job j = job_of("small", 0, 4);
        j.shape.tied = t == 1;
        /* a node per rank; at 2 GiB of host some optimizer states go to NVMe, at
         * 1.5 GiB (ZeRO's global order keeps no fp32 accumulators) parameters too */
        zp_hardware hw = cpu_node(t == 3 ? 3 * GiB / 2 : t >= 2 ? 2 * GiB : 64 * GiB);
        if (t == 3) /* a small device: parameters paged, the first stages' homed on NVMe */
            hw.device_bytes = 192 << 20;
        /* 3 stages x 2 data-parallel ranks, ZeRO 1 in each; one rank per stage with NVMe */
        zp_world w = world(t == 2 ? 3 : 6, 1);
        zp_pipeline_plan p;
        plan(&j, &hw, &w, 3, NULL, &p);
        assert_int_equal(p.stages, 3);
        assert_int_equal(p.data_parallel, t == 2 ? 1 : 2);
        for (int s = 0; s < 3; s++) {
            print_message("%s stage %d: layers %d-%d, fits %d %s\n", names[t], s, p.stage[s].first,
                          p.stage[s].end - 1, p.stage[s].plan.fits, p.stage[s].plan.why);
            check_stage_footprint(&j, &hw, &w, &p, s);
            /* zo-train's zt_pipe_sets: min(min(S-s-1, M) + 2, M) at M = 4 */
            const int sets[3] = {4, 3, 2};
            assert_int_equal(p.stage[s].in_flight, sets[s]);
            check_stage_arena(&j, &p, s);
        }
        if (t == 3) { /* it does not fit the host; its footprints are the engine's all the same */
            assert_int_equal(p.stage[0].plan.param_home, ZO_TIER_NVME);
            zp_pipeline_free(&p);
            continue;
        }
        assert_true(p.fits);
        if (t == 2)
            assert_true(p.stage[0].plan.optim_homes[ZO_TIER_NVME] > 0);
        zp_pipeline_free(&p);
    }
}

/* Every layer once, contiguous, each stage non-empty. */
static void check_cover(const int *first, int S, int E)
{
    assert_int_equal(first[0], 0);
    assert_int_equal(first[S], E);
    for (int s = 0; s < S; s++)
        assert_true(first[s + 1] > first[s]);
}

static void test_split_covers_every_layer(void **state)
{
    (void)state;
    int layers[] = {4, 5, 7};
    for (int k = 0; k < 3; k++) {
        zp_job j = job_of("tiny", layers[k], 8);
        int E = zt_engine_layers(&j.shape);
        double cost[64];
        uint64_t mem[64];
        zp_pipe_layer_costs(&j, cost, mem);
        for (int S = 1; S <= E; S++) {
            int first[ZP_PIPE_MAX_STAGES + 1];
            ZO_ASSERT_OK(zp_pipe_balance(cost, mem, E, S, first));
            check_cover(first, S, E);
        }
    }
    /* a stage's plan covers its layers: the stages' parameters sum to the model's */
    zp_job j = job_of("tiny", 5, 8);
    zp_hardware hw = cpu_node(8 * GiB);
    zp_world w = world(3, 3);
    zp_pipeline_plan p;
    plan(&j, &hw, &w, 3, NULL, &p); /* 7 engine layers over 3 stages: uneven */
    check_cover(p.first, 3, 7);
    uint64_t sum = 0;
    for (int s = 0; s < 3; s++)
        sum += p.stage[s].plan.fp.n_params;
    assert_int_equal(sum, zt_shape_n_params(&j.shape));
    zp_pipeline_free(&p);
}

static void test_given_split(void **state)
{
    (void)state;
    zp_job j = job_of("tiny", 0, 4); /* 6 engine layers */
    zp_hardware hw = cpu_node(8 * GiB);
    zp_world w = world(2, 2);
    zp_pipeline_plan p;
    int given[] = {1};
    plan(&j, &hw, &w, 2, given, &p);
    assert_int_equal(p.first[1], 1);
    assert_int_equal(p.stage[0].end, 1);
    assert_int_equal(p.stage[0].plan.fp.n_params, (uint64_t)j.shape.vocab * j.shape.dim);
    zp_pipeline_free(&p);
    int first[8];
    int bad[][2] = {{3, 3}, {0, 2}, {2, 6}, {4, 2}};
    for (int i = 0; i < 4; i++) {
        zo_status st = zp_pipe_check_split(bad[i], 3, 6, first);
        assert_int_equal(st, ZO_ERR_INVALID_ARG);
        assert_non_null(strstr(zt_last_error(), "pipeline split: stage"));
    }
    int good[] = {2, 5};
    ZO_ASSERT_OK(zp_pipe_check_split(good, 3, 6, first));
    check_cover(first, 3, 6);
}

/* The least (slowest stage's cost, then its bytes) over every contiguous
 * split of n layers into S stages, by enumeration. */
static void brute(const double *cost, const uint64_t *mem, int n, int S, double *best_c,
                  uint64_t *best_m)
{
    *best_c = INFINITY;
    *best_m = UINT64_MAX;
    /* a split is a set of S - 1 cut points in 1..n-1: bit i set cuts before layer i */
    for (unsigned mask = 0; mask < 1u << (n - 1); mask++) {
        if (__builtin_popcount(mask) != S - 1)
            continue;
        double c = 0, mc = 0;
        uint64_t m = 0, mm = 0;
        for (int i = 0; i < n; i++) {
            if (i > 0 && (mask >> (i - 1) & 1)) {
                c = 0;
                m = 0;
            }
            c += cost[i];
            m += mem[i];
            mc = fmax(mc, c);
            mm = m > mm ? m : mm;
        }
        if (mc < *best_c * (1 - 1e-12)) {
            *best_c = mc;
            *best_m = mm;
        } else if (mc <= *best_c * (1 + 1e-12) && mm < *best_m) {
            *best_m = mm;
        }
    }
}

static void check_balance(const double *cost, const uint64_t *mem, int n, int S)
{
    int first[ZP_PIPE_MAX_STAGES + 1];
    ZO_ASSERT_OK(zp_pipe_balance(cost, mem, n, S, first));
    check_cover(first, S, n);
    double mc = 0;
    uint64_t mm = 0;
    for (int s = 0; s < S; s++) {
        double c = 0;
        uint64_t m = 0;
        for (int i = first[s]; i < first[s + 1]; i++) {
            c += cost[i];
            m += mem[i];
        }
        mc = fmax(mc, c);
        mm = m > mm ? m : mm;
    }
    double bc;
    uint64_t bm;
    brute(cost, mem, n, S, &bc, &bm);
    if (fabs(mc - bc) > 1e-9 * bc || mm != bm)
        fail_msg("%d layers, %d stages: the split's slowest stage %.17g (%llu bytes), the "
                 "least over every split %.17g (%llu bytes)",
                 n, S, mc, (unsigned long long)mm, bc, (unsigned long long)bm);
}

static void test_balance_against_brute_force(void **state)
{
    (void)state;
    srand(18);
    for (int trial = 0; trial < 40; trial++) {
        int n = 2 + trial % 10;
        double cost[12];
        uint64_t mem[12];
        for (int i = 0; i < n; i++) {
            /* few distinct values: ties in cost, decided by bytes */
            cost[i] = (double)(1 + rand() % (trial % 2 ? 3 : 100));
            mem[i] = (uint64_t)(1 + rand() % 50);
        }
        for (int S = 1; S <= n; S++)
            check_balance(cost, mem, n, S);
    }
    /* the model's own layers: equal blocks, a free embedding, a heavy head */
    zp_job j = job_of("tiny", 9, 8);
    j.shape.vocab = 16384;
    int E = zt_engine_layers(&j.shape);
    double cost[16];
    uint64_t mem[16];
    zp_pipe_layer_costs(&j, cost, mem);
    assert_true(cost[0] == 0);
    assert_true(cost[E - 1] > cost[1]);
    double m, d, sum = 0;
    for (int l = 0; l < E; l++) {
        zp_layer_flops_per_token(&j, l, &m, &d);
        sum += d;
    }
    assert_true(fabs(sum - zp_device_flops_per_token(&j)) < 1e-9 * sum);
    for (int S = 1; S <= E; S++)
        check_balance(cost, mem, E, S);
}

static void test_step_bubble_and_p2p(void **state)
{
    (void)state;
    const int S = 4, M = 6;
    zp_job j = job_of("tiny", 6, M);
    zp_hardware hw = cpu_node(8 * GiB);
    zp_world w = world(S, S);
    zp_pipeline_plan p;
    plan(&j, &hw, &w, S, NULL, &p);
    assert_true(p.fits);
    uint64_t act = (uint64_t)j.micro_batch * j.seq * j.shape.dim * 2;
    assert_int_equal(p.act_bytes, act);
    assert_int_equal(p.p2p_boundary_bytes, (uint64_t)M * act);
    assert_int_equal(p.p2p_step_bytes, 2ull * (S - 1) * M * act);
    assert_true(fabs(p.p2p_mb_seconds - (double)act / w.link) < 1e-15);
    assert_true(fabs(p.bubble - (double)(S - 1) / (M + S - 1)) < 1e-15);
    double mb = 0, tail = 0;
    for (int s = 0; s < S; s++) {
        const zp_stage_plan *st = &p.stage[s];
        /* the cpu device: the sends add to the stage's micro-batch */
        uint64_t sends = (s > 0 ? act : 0) + (s < S - 1 ? act : 0);
        assert_int_equal(st->send_bytes, sends);
        double want = st->plan.fb_seconds / M + (double)sends / w.link;
        assert_true(fabs(st->mb_seconds - want) <= 1e-12 * want);
        assert_true(fabs(st->tail_seconds - (st->plan.step_seconds - st->plan.fb_seconds)) < 1e-12);
        mb = fmax(mb, st->mb_seconds);
        tail = fmax(tail, st->tail_seconds);
    }
    assert_true(fabs(p.mb_seconds - mb) < 1e-15);
    assert_true(fabs(p.step_seconds - ((M + S - 1) * mb + tail)) <= 1e-12 * p.step_seconds);
    assert_true(fabs(p.tokens_per_s - (double)M * j.micro_batch * j.seq / p.step_seconds) <
                1e-9 * p.tokens_per_s);
    zp_pipeline_free(&p);
}

/* One stage over the whole model is the engine's own run: the per-chunk
 * plan of the model with its micro-batches' layer inputs. */
static void test_one_stage_is_the_model(void **state)
{
    (void)state;
    zp_job j = job_of("tiny", 0, 4);
    zp_hardware hw = cpu_node(8 * GiB);
    zp_world w = world(1, 1);
    zp_pipeline_plan p;
    plan(&j, &hw, &w, 1, NULL, &p);
    zp_plan whole;
    j.chunk_bytes = p.chunk_bytes;
    j.mode = p.mode;
    ZO_ASSERT_OK(zp_plan_split(&j, &hw, &speeds, 0, &whole, NULL));
    assert_int_equal(p.stage[0].plan.fp.bytes[ZO_TIER_DEVICE], whole.fp.bytes[ZO_TIER_DEVICE]);
    assert_int_equal(p.stage[0].plan.fp.pinned, whole.fp.pinned);
    assert_int_equal(p.stage[0].plan.fp.bytes[ZO_TIER_HOST], whole.fp.bytes[ZO_TIER_HOST]);
    assert_int_equal(p.stage[0].plan.device.total, whole.device.total);
    assert_true(p.bubble == 0);
    assert_int_equal(p.p2p_step_bytes, 0);
    zp_pipeline_free(&p);
}

static void test_refusals(void **state)
{
    (void)state;
    zp_job j = job_of("tiny", 0, 4); /* 4 blocks: 6 engine layers */
    zp_hardware hw = cpu_node(8 * GiB);
    zp_world w = world(7, 7);
    zp_pipeline_plan p;
    zo_status st = zp_plan_pipeline(&j, &hw, &speeds, &w, 7, NULL, 0, &p, NULL);
    assert_int_equal(st, ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zt_last_error(), "--pipeline-stages 7"));
    assert_non_null(strstr(zt_last_error(), "6 engine layers"));
    w = world(6, 6);
    st = zp_plan_pipeline(&j, &hw, &speeds, &w, 4, NULL, 0, &p, NULL);
    assert_int_equal(st, ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zt_last_error(), "--world-size 6"));
    assert_non_null(strstr(zt_last_error(), "--pipeline-stages 4"));
    double cost[3] = {1, 1, 1};
    uint64_t mem[3] = {1, 1, 1};
    int first[8];
    assert_int_equal(zp_pipe_balance(cost, mem, 3, 4, first), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zt_last_error(), "4 pipeline stages for 3 engine layers"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stage_footprints_are_the_engines),
        cmocka_unit_test(test_split_covers_every_layer),
        cmocka_unit_test(test_given_split),
        cmocka_unit_test(test_balance_against_brute_force),
        cmocka_unit_test(test_step_bubble_and_p2p),
        cmocka_unit_test(test_one_stage_is_the_model),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
