/* The offload engine on the cpu device: a 4-layer test model trained for 20+
 * steps under every placement (device, host, NVMe; the smallest device
 * budget) in sync and overlap modes, bitwise against each other and against a
 * plain-C reference; DPU against its one-step-stale reference; overlap with
 * forced clipping and injected overflows; budgets and plan refusal; an NVMe
 * fault in the middle of a step; trace-driven prefetch and Belady eviction. */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include "test_model.h"
#include "zo/device.h"
#include "zo/testing.h"
#include "zo_internal.h"

#define STEPS 20
#define CHUNK (8u << 10)

typedef struct run_cfg {
    zo_tier param_home, optim_home;
    zo_optim_mode mode;
    uint64_t device_bytes, pinned_bytes;
    int accum;
    int lookahead;
    float max_norm;
    zo_dtype dtype;
    uint64_t poison_steps; /* bit s: an infinity in layer 1's gradient at step s */
    int steps;
    int recompute_from; /* from this step on, the backward re-runs each layer's forward first */
    const float *lrs;   /* the learning rate of each step (zo_engine_set_lr), or NULL */
    uint32_t nvme_block_size, nvme_queue_depth;
    zo_trace_fn trace; /* installed before finalize */
    void *trace_ctx;
    zo_engine_caps pcaps, ocaps; /* per-chunk homes: caps of the tiers faster than the homes */
    uint64_t host_bytes;         /* the host tier's budget (0: not limited) */
    int group;                   /* micro_group: > 1 runs the step layer-major in such groups */
    int master_split;            /* zo_engine_config.master_split */
    int fill;                    /* register with zo_engine_register_fill rather than with copies */
} run_cfg;

#define TM_MAXGROUP 8

/* The optimizer states' format of the engines the tests build: fp32 but
 * in test_compact_states_everywhere. */
static zo_dtype g_state_dtype = ZO_DTYPE_F32;
static int g_keep_f32 = -1; /* a tensor (k) marked by zo_engine_keep_f32_states, or -1 */

static run_cfg base_cfg(zo_tier ph, zo_tier oh, zo_optim_mode mode)
{
    run_cfg c = {ph,     oh,    mode,    0,    0, 1, 2,    0.0f, ZO_DTYPE_BF16,
                 0,      STEPS, INT_MAX, NULL, 0, 0, NULL, NULL, {0, 0},
                 {0, 0}, 0,     0,       0,    0};
    return c;
}

typedef struct run_out {
    float *master[TM_T];
    double losses[TM_MAXSTEPS];
    zo_step_stats stats[TM_MAXSTEPS];
    zo_engine_footprint fp;
} run_out;

static void run_out_free(run_out *o)
{
    for (int k = 0; k < TM_T; k++)
        free(o->master[k]);
}

/* ---- driving the engine ---- */

/* The initial values zo_engine_register_fill asks for, and its calls. */
typedef struct fill_src {
    float *init[TM_T];
    int calls[TM_T];
    int fail_id; /* >= 0: this tensor's fill fails */
} fill_src;

static zo_status fill_from(void *ctx, int id, float *dst)
{
    fill_src *f = ctx;
    f->calls[id]++;
    if (id == f->fail_id)
        return ZO_FAIL(ZO_ERR_IO, "test", "reading tensor %d's initial values", id);
    memcpy(dst, f->init[id], tm_numel(id) * sizeof(float));
    return ZO_OK;
}

typedef struct harness {
    zo_device_t dev;
    zo_stream_t compute;
    zo_engine_t eng;
    tm_acts *a;
    run_cfg rc;
    char dir[64];
    int ids[TM_T];
    int fault_layer; /* >= 0: a device stream task fails right after this layer's backward */
    tm_acts *ga[TM_MAXGROUP]; /* layer-major: the activations of each micro-batch of a group */
    fill_src fill;
} harness;

static zo_adam_params test_adam(void)
{
    zo_adam_params p = ZO_ADAM_PARAMS_INIT;
    p.lr = 1e-2f;
    p.weight_decay = 0.01f;
    p.simd_level = -1;
    return p;
}

static zo_status build_engine(harness *h, const zo_swap_fault *faults, size_t nfaults, int finalize)
{
    zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
    c.device = h->dev;
    c.param_dtype = h->rc.dtype;
    c.chunk_bytes = CHUNK;
    c.param_home = h->rc.param_home;
    c.optim_home = h->rc.optim_home;
    c.device_bytes = h->rc.device_bytes;
    c.pinned_bytes = h->rc.pinned_bytes;
    const char *paths[1] = {h->dir};
    c.nvme_paths = paths;
    c.n_nvme_paths = 1;
    c.nvme_engine = "auto";
    c.lookahead = h->rc.lookahead;
    c.mode = h->rc.mode;
    c.grad_accum_steps = h->rc.accum;
    c.optim_threads = 2;
    c.adam = test_adam();
    c.max_grad_norm = h->rc.max_norm;
    c.loss_scaler.loss_scale = 0.0; /* dynamic */
    c.loss_scaler.initial_scale_power = 6;
    c.loss_scaler.loss_scale_window = 5;
    c.nvme_block_size = h->rc.nvme_block_size;
    c.nvme_queue_depth = h->rc.nvme_queue_depth;
    c.param_caps = h->rc.pcaps;
    c.optim_caps = h->rc.ocaps;
    c.host_bytes = h->rc.host_bytes;
    c.micro_group = h->rc.group;
    c.state_dtype = g_state_dtype;
    c.master_split = h->rc.master_split;
    ZO_TRY(zo_engine_init(&h->eng, &c));
    if (nfaults)
        ZO_TRY(zo_engine_set_swap_faults(h->eng, faults, nfaults));
    if (h->rc.trace)
        ZO_TRY(zo_engine_set_trace(h->eng, h->rc.trace, h->rc.trace_ctx));
    float **init = h->fill.init; /* freed by harness_close: a fill reads them in finalize */
    for (int k = 0; k < TM_T; k++)
        init[k] = malloc(tm_numel(k) * sizeof(float));
    tm_init_params(init);
    zo_status st = ZO_OK;
    for (int k = 0; k < TM_T && st == ZO_OK; k++) {
        const char *name = k % 2 ? "b" : "W";
        st = h->rc.fill ? zo_engine_register_fill(h->eng, k / 2, name, tm_numel(k), fill_from,
                                                  &h->fill, &h->ids[k])
                        : zo_engine_register(h->eng, k / 2, name, tm_numel(k), init[k], &h->ids[k]);
    }
    ZO_TRY(st);
    if (g_keep_f32 >= 0)
        ZO_TRY(zo_engine_keep_f32_states(h->eng, h->ids[g_keep_f32]));
    return finalize ? zo_engine_finalize(h->eng) : ZO_OK;
}

static zo_status make_engine(harness *h, const zo_swap_fault *faults, size_t nfaults)
{
    return build_engine(h, faults, nfaults, 1);
}

static void harness_open(harness *h, const run_cfg *rc)
{
    memset(h, 0, sizeof *h);
    h->rc = *rc;
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    dc.mem_budget = 64u << 20;
    ZO_ASSERT_OK(zo_device_init(&h->dev, &dc));
    ZO_ASSERT_OK(zo_stream_create(h->dev, &h->compute));
    h->a = calloc(1, sizeof *h->a);
    assert_non_null(h->a);
    for (int j = 0; j < TM_MAXGROUP && j < rc->group; j++)
        assert_non_null(h->ga[j] = calloc(1, sizeof *h->ga[j]));
    h->fault_layer = -1;
    h->fill.fail_id = -1;
    snprintf(h->dir, sizeof h->dir, "/tmp/zo-engine-test-XXXXXX");
    assert_non_null(mkdtemp(h->dir));
}

static void harness_close(harness *h)
{
    zo_engine_free(h->eng);
    zo_stream_destroy(h->compute);
    zo_device_free(h->dev);
    rmdir(h->dir);
    free(h->a);
    for (int j = 0; j < TM_MAXGROUP; j++)
        free(h->ga[j]);
    for (int k = 0; k < TM_T; k++)
        free(h->fill.init[k]);
}

static zo_status enqueue(harness *h, zo_stream_fn fn, const void *arg, size_t n)
{
    return zo_stream_enqueue(h->compute, fn, arg, n);
}

static zo_status forward_layer(harness *h, int l)
{
    void *p[2];
    ZO_TRY(zo_engine_fetch(h->eng, l, ZO_PHASE_FORWARD, h->compute, p, NULL, 2));
    tm_fwd_arg f = {p[0], p[1], h->rc.dtype, h->a->act[l], h->a->act[l + 1]};
    ZO_TRY(enqueue(h, tm_forward, &f, sizeof f));
    return zo_engine_release(h->eng, l, h->compute);
}

static zo_status backward_layer(harness *h, int l, int poison, int recompute)
{
    void *p[2], *g[2];
    if (recompute)
        ZO_TRY(forward_layer(h, l)); /* same values: activation recomputation */
    ZO_TRY(zo_engine_fetch(h->eng, l, ZO_PHASE_BACKWARD, h->compute, p, g, 2));
    tm_bwd_arg b = {
        p[0],          g[0],  g[1], h->rc.dtype, h->a->act[l], h->a->act[l + 1], h->a->gact[l + 1],
        h->a->gact[l], poison};
    ZO_TRY(enqueue(h, tm_backward, &b, sizeof b));
    if (l == h->fault_layer)
        ZO_TRY(zo_device_inject_fault(h->dev, ZO_FAULT_STREAM_TASK, 1));
    ZO_TRY(zo_engine_grads_ready(h->eng, l, h->compute));
    return zo_engine_release(h->eng, l, h->compute);
}

static zo_status micro_batch(harness *h, int step, int micro, float scale)
{
    tm_input_arg in = {h->a, step, micro};
    ZO_TRY(enqueue(h, tm_input, &in, sizeof in));
    for (int l = 0; l < TM_L; l++)
        ZO_TRY(forward_layer(h, l));
    tm_loss_arg la = {h->a, scale};
    ZO_TRY(enqueue(h, tm_loss, &la, sizeof la));
    int poison = (int)((h->rc.poison_steps >> step) & 1) && micro == 0;
    int recompute = step >= h->rc.recompute_from;
    for (int l = TM_L - 1; l >= 0; l--)
        ZO_TRY(backward_layer(h, l, poison && l == 1, recompute));
    return ZO_OK;
}

static zo_status group_forward(harness *h, int l, int n)
{
    void *p[2];
    ZO_TRY(zo_engine_fetch(h->eng, l, ZO_PHASE_FORWARD, h->compute, p, NULL, 2));
    for (int j = 0; j < n; j++) {
        tm_fwd_arg f = {p[0], p[1], h->rc.dtype, h->ga[j]->act[l], h->ga[j]->act[l + 1]};
        ZO_TRY(enqueue(h, tm_forward, &f, sizeof f));
    }
    return zo_engine_release(h->eng, l, h->compute);
}

/* One backward fetch for the group; each micro-batch's gradients are handed
 * over in turn into the buffers the engine zeroes again between them. */
static zo_status group_backward(harness *h, int l, int n, int poison)
{
    void *p[2], *g[2];
    ZO_TRY(zo_engine_fetch(h->eng, l, ZO_PHASE_BACKWARD, h->compute, p, g, 2));
    for (int j = 0; j < n; j++) {
        tm_acts *a = h->ga[j];
        tm_bwd_arg b = {p[0],          g[0],           g[1],       h->rc.dtype,     a->act[l],
                        a->act[l + 1], a->gact[l + 1], a->gact[l], poison && j == 0};
        ZO_TRY(enqueue(h, tm_backward, &b, sizeof b));
        if (l == h->fault_layer && j == n - 1)
            ZO_TRY(zo_device_inject_fault(h->dev, ZO_FAULT_STREAM_TASK, 1));
        ZO_TRY(zo_engine_grads_ready(h->eng, l, h->compute));
    }
    return zo_engine_release(h->eng, l, h->compute);
}

/* The loss of a group's micro-batch, added to the step's in micro-batch order. */
static zo_status group_loss_fn(void *arg)
{
    tm_acts **a = arg; /* the step's, the micro-batch's */
    a[0]->loss += a[1]->loss;
    a[1]->loss = 0.0;
    return ZO_OK;
}

/* Micro-batches first..first+n-1 layer-major: each layer once per phase. */
static zo_status layer_major_group(harness *h, int step, int first, int n, float scale)
{
    for (int j = 0; j < n; j++) {
        tm_input_arg in = {h->ga[j], step, first + j};
        ZO_TRY(enqueue(h, tm_input, &in, sizeof in));
    }
    for (int l = 0; l < TM_L; l++)
        ZO_TRY(group_forward(h, l, n));
    for (int j = 0; j < n; j++) {
        tm_loss_arg la = {h->ga[j], scale};
        tm_acts *pair[2] = {h->a, h->ga[j]};
        ZO_TRY(enqueue(h, tm_loss, &la, sizeof la));
        ZO_TRY(enqueue(h, group_loss_fn, pair, sizeof pair));
    }
    int poison = (int)((h->rc.poison_steps >> step) & 1) && first == 0;
    for (int l = TM_L - 1; l >= 0; l--)
        ZO_TRY(group_backward(h, l, n, poison && l == 1));
    return ZO_OK;
}

static zo_status micro_batches(harness *h, int step, float scale)
{
    int G = h->rc.group > 1 ? h->rc.group : 1;
    for (int first = 0; first < h->rc.accum; first += G) {
        int n = h->rc.accum - first < G ? h->rc.accum - first : G;
        if (G == 1)
            ZO_TRY(micro_batch(h, step, first, scale));
        else
            ZO_TRY(layer_major_group(h, step, first, n, scale));
    }
    return ZO_OK;
}

/* One optimizer step; on an error the compute stream is drained and the
 * error returned (the engine has abandoned the step). */
static zo_status train_step(harness *h, int step, double *loss, zo_step_stats *stats)
{
    float scale = (float)zo_engine_loss_scale(h->eng);
    h->a->loss = 0.0;
    zo_status st = micro_batches(h, step, scale);
    if (st == ZO_OK) {
        memset(stats, 0, sizeof *stats);
        stats->struct_size = sizeof *stats;
        st = zo_engine_end_step(h->eng, stats);
    }
    zo_status s2 = zo_stream_synchronize(h->compute);
    if (st == ZO_OK)
        st = s2;
    *loss = h->a->loss;
    return st;
}

static void read_masters(harness *h, float *out[TM_T])
{
    for (int k = 0; k < TM_T; k++) {
        out[k] = malloc(tm_numel(k) * sizeof(float));
        ZO_ASSERT_OK(zo_engine_read_master(h->eng, h->ids[k], out[k]));
    }
}

static void check_budgets(harness *h, const zo_step_stats *s, const zo_engine_footprint *fp)
{
    uint64_t dev_budget = h->rc.device_bytes ? h->rc.device_bytes : (64u << 20);
    assert_true(s->peak_device <= dev_budget);
    assert_int_equal(s->peak_device, fp->device);
    zo_device_mem_stats ms;
    ZO_ASSERT_OK(zo_device_mem_get_stats(h->dev, &ms));
    assert_true(ms.high_water <= dev_budget); /* the test keeps its activations on the host */
    uint64_t pinned_budget = h->rc.pinned_bytes ? h->rc.pinned_bytes : fp->pinned;
    assert_true(s->peak_pinned <= pinned_budget);
    assert_int_equal(s->peak_pinned, fp->pinned);
    assert_int_equal(s->peak_host, fp->host);
    assert_int_equal(s->peak_nvme, fp->nvme);
    if (h->rc.host_bytes)
        assert_true(s->peak_pinned + s->peak_host <= h->rc.host_bytes);
}

static void run(const run_cfg *rc, run_out *o)
{
    harness h;
    harness_open(&h, rc);
    memset(o, 0, sizeof *o);
    ZO_ASSERT_OK(make_engine(&h, NULL, 0));
    o->fp.struct_size = sizeof o->fp;
    ZO_ASSERT_OK(zo_engine_footprint_get(h.eng, &o->fp));
    for (int s = 0; s < rc->steps; s++) {
        if (rc->lrs)
            ZO_ASSERT_OK(zo_engine_set_lr(h.eng, rc->lrs[s]));
        ZO_ASSERT_OK(train_step(&h, s, &o->losses[s], &o->stats[s]));
        if (getenv("TM_DEBUG"))
            fprintf(stderr, "step %d loss %.6g norm %.6g ovf %d scale %g rb %d\n", s, o->losses[s],
                    o->stats[s].grad_norm, o->stats[s].overflow, o->stats[s].loss_scale,
                    o->stats[s].rollbacks);
        check_budgets(&h, &o->stats[s], &o->fp);
    }
    read_masters(&h, o->master);
    harness_close(&h);
}

static void assert_same_weights(const run_out *a, const run_out *b, int steps)
{
    for (int s = 0; s < steps; s++)
        if (memcmp(&a->losses[s], &b->losses[s], sizeof(double)) != 0)
            fail_msg("loss of step %d differs: %.17g vs %.17g", s, a->losses[s], b->losses[s]);
    for (int k = 0; k < TM_T; k++)
        if (memcmp(a->master[k], b->master[k], tm_numel(k) * sizeof(float)) != 0)
            fail_msg("master weights of tensor %d differ", k);
}

static void assert_matches_reference(const run_out *o, const tm_ref *r, int steps)
{
    for (int s = 0; s < steps; s++)
        if (memcmp(&o->losses[s], &r->losses[s], sizeof(double)) != 0)
            fail_msg("loss of step %d: engine %.17g, reference %.17g", s, o->losses[s],
                     r->losses[s]);
    for (int k = 0; k < TM_T; k++)
        for (size_t i = 0; i < tm_numel(k); i++)
            if (memcmp(&o->master[k][i], &r->master[k][i], sizeof(float)) != 0)
                fail_msg("tensor %d element %zu: engine %.9g, reference %.9g", k, i,
                         o->master[k][i], r->master[k][i]);
}

/* The smallest device budget: one layer's parameter and gradient chunks. */
static uint64_t min_device_bytes(void)
{
    /* with 8-bit states a W kept in fp32 takes 4 x its elements: the chunk grows to them */
    int kept = g_keep_f32 >= 0 && g_state_dtype == ZO_DTYPE_I8;
    return 2ull * 2 * CHUNK * (kept ? 4 : 1);
}

/* ---- tests ---- */

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
        int clipped = 0;
        for (int s = 0; s < STEPS; s++) {
            assert_int_equal(sync.stats[s].clipped, ovl.stats[s].clipped);
            clipped += ovl.stats[s].clipped;
            /* a clipped step rolls back every chunk; others none */
            assert_int_equal(ovl.stats[s].rollbacks,
                             ovl.stats[s].clipped ? (int)ovl.fp.n_chunks : 0);
        }
        assert_true(clipped > 0 && clipped < STEPS);
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
                assert_int_equal(ovl.stats[s].rollbacks, (int)ovl.fp.n_chunks);
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
            for (int mode = 0; mode < (dpu ? 1 : 2); mode++) {
                run_cfg c = base_cfg(homes[i][0], homes[i][1],
                                     dpu    ? ZO_OPTIM_DPU
                                     : mode ? ZO_OPTIM_OVERLAP
                                            : ZO_OPTIM_SYNC);
                c.lrs = lrs;
                run_out o;
                run(&c, &o);
                assert_matches_reference(&o, &r, STEPS);
                run_out_free(&o);
            }
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

static void expect_refusal(const run_cfg *rc, zo_status want, const char *tier)
{
    harness h;
    harness_open(&h, rc);
    ZO_ASSERT_ST(make_engine(&h, NULL, 0), want);
    const char *msg = zo_last_error();
    if (!strstr(msg, tier) || !strstr(msg, "short by 1 bytes"))
        fail_msg("refusal message: %s", msg);
    zo_device_mem_stats ms;
    ZO_ASSERT_OK(zo_device_mem_get_stats(h.dev, &ms));
    assert_int_equal(ms.in_use, 0); /* refused before allocating anything */
    harness_close(&h);
}

static void test_impossible_plans_are_refused_up_front(void **state)
{
    (void)state;
    run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_NVME, ZO_OPTIM_OVERLAP);
    c.device_bytes = min_device_bytes() - 1;
    expect_refusal(&c, ZO_ERR_OUT_OF_DEVICE_MEMORY, "device tier");

    /* the plan predicts exactly what finalize allocates; one byte less pinned is refused */
    c.device_bytes = 0;
    zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
    int fits = 0;
    char msg[512];
    harness h;
    harness_open(&h, &c);
    ZO_ASSERT_OK(make_engine(&h, NULL, 0));
    ZO_ASSERT_OK(zo_engine_plan(h.eng, &fp, &fits, msg, sizeof msg));
    assert_true(fits);
    harness_close(&h);
    assert_int_equal(fp.n_chunks, 2 * TM_L);
    assert_int_equal(fp.max_chunks_per_layer, 2);
    assert_int_equal(fp.chunk_bytes, CHUNK);
    /* two 16-bit copies, the gradient ring (lookahead 2 + 2), the stages and their room for
     * gradients read back: states on NVMe keep no whole-model gradient mirror */
    assert_int_equal(fp.pinned, 2 * fp.n_chunks * CHUNK + 4 * CHUNK + 3 * 6 * CHUNK + 3 * CHUNK);
    assert_int_equal(fp.grad_host, fp.n_chunks * CHUNK);
    assert_int_equal(fp.nvme, 2ull * fp.n_chunks * 6 * CHUNK);
    c.pinned_bytes = fp.pinned - 1;
    expect_refusal(&c, ZO_ERR_BUDGET, "pinned tier");
    c.pinned_bytes = fp.pinned; /* exactly the plan: fits, and the run stays within it */
    c.steps = 3;
    run_out o;
    run(&c, &o);
    run_out_free(&o);

    /* zo_engine_plan says no before finalize, naming the tier and the shortfall */
    c.device_bytes = min_device_bytes() - 1;
    harness_open(&h, &c);
    ZO_ASSERT_OK(build_engine(&h, NULL, 0, 0));
    ZO_ASSERT_OK(zo_engine_plan(h.eng, &fp, &fits, msg, sizeof msg));
    assert_false(fits);
    if (!strstr(msg, "device tier") || !strstr(msg, "short by 1 bytes"))
        fail_msg("plan message: %s", msg);
    harness_close(&h);

    /* a device_bytes beyond what the device has free is held to what is free */
    c.device_bytes = 1ull << 40;
    harness_open(&h, &c);
    void *hog;
    ZO_ASSERT_OK(zo_device_malloc(h.dev, (64u << 20) - min_device_bytes() + 1, &hog));
    ZO_ASSERT_ST(make_engine(&h, NULL, 0), ZO_ERR_OUT_OF_DEVICE_MEMORY);
    if (!strstr(zo_last_error(), "device tier") || !strstr(zo_last_error(), "short by 1 bytes"))
        fail_msg("refusal message: %s", zo_last_error());
    ZO_ASSERT_OK(zo_device_mfree(h.dev, hog));
    harness_close(&h);

    /* a failure while finalizing (the device refuses an allocation) releases
     * everything, keeps the registration, and finalize can be retried */
    c = base_cfg(ZO_TIER_HOST, ZO_TIER_NVME, ZO_OPTIM_SYNC);
    for (int nfaults = 1; nfaults <= 2; nfaults++) { /* the next nfaults allocations fail */
        harness_open(&h, &c);
        ZO_ASSERT_OK(build_engine(&h, NULL, 0, 0));
        ZO_ASSERT_OK(zo_device_inject_fault(h.dev, ZO_FAULT_DEVICE_MALLOC, nfaults));
        ZO_ASSERT_ST(zo_engine_finalize(h.eng), ZO_ERR_OUT_OF_DEVICE_MEMORY);
        zo_device_mem_stats ms;
        ZO_ASSERT_OK(zo_device_mem_get_stats(h.dev, &ms));
        assert_int_equal(ms.in_use, 0);
        if (nfaults == 2)
            ZO_ASSERT_ST(zo_engine_finalize(h.eng), ZO_ERR_OUT_OF_DEVICE_MEMORY);
        ZO_ASSERT_OK(zo_engine_finalize(h.eng));
        double loss;
        zo_step_stats st;
        ZO_ASSERT_OK(train_step(&h, 0, &loss, &st));
        harness_close(&h);
    }
    /* an NVMe directory that does not exist fails finalize with the swap store's message */
    harness_open(&h, &c);
    ZO_ASSERT_OK(build_engine(&h, NULL, 0, 0));
    rmdir(h.dir);
    assert_true(zo_engine_finalize(h.eng) < 0);
    assert_non_null(strstr(zo_last_error(), h.dir));
    harness_close(&h);

    /* more ranks are refused with a clear message, not silently run as one */
    zo_engine_config ec = ZO_ENGINE_CONFIG_INIT;
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    zo_device_t dev;
    ZO_ASSERT_OK(zo_device_init(&dev, &dc));
    ec.device = dev;
    ec.world_size = 2;
    zo_engine_t e = NULL;
    ZO_ASSERT_ST(zo_engine_init(&e, &ec), ZO_ERR_UNSUPPORTED);
    assert_null(e);
    zo_device_free(dev);
}

/* Run step s, which is expected to fail; the weights must stay `before`
 * (read before the fault was armed; freed here). */
static zo_status failing_step(harness *h, int s, float *before[TM_T])
{
    float *after[TM_T];
    double loss;
    zo_step_stats st;
    zo_status e = train_step(h, s, &loss, &st);
    char why[512];
    snprintf(why, sizeof why, "%s", zo_last_error());
    read_masters(h, after);
    for (int k = 0; k < TM_T; k++) {
        assert_memory_equal(before[k], after[k], tm_numel(k) * sizeof(float));
        free(before[k]);
        free(after[k]);
    }
    if (e < 0)
        ZO_FAIL(e, "test", "%s", why); /* keep the step's message for the caller */
    return e;
}

/* The run in h, after its faults, must equal the run without them. */
static void close_and_compare(harness *h, const double *losses, run_out *ref, int steps)
{
    float *got[TM_T];
    read_masters(h, got);
    harness_close(h);
    for (int s = 0; s < steps; s++)
        assert_true(losses[s] == ref->losses[s]);
    for (int k = 0; k < TM_T; k++) {
        assert_memory_equal(got[k], ref->master[k], tm_numel(k) * sizeof(float));
        free(got[k]);
    }
    run_out_free(ref);
}

/* Arm one EIO at each of several request indices of a store in turn; each
 * attempt of step s must fail and leave the weights as they were. */
static void fail_step_at(harness *h, zo_swap_t store, int s)
{
    static const uint64_t ops[] = {0, 5, 17};
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

static void test_nvme_fault_during_step(void **state)
{
    (void)state;
    for (int m = 0; m < 4; m++) {
        int params_on_nvme = m >= 2;
        run_cfg c = base_cfg(params_on_nvme ? ZO_TIER_NVME : ZO_TIER_HOST, ZO_TIER_NVME,
                             m % 2 ? ZO_OPTIM_OVERLAP : ZO_OPTIM_SYNC);
        c.steps = 8;
        c.device_bytes = params_on_nvme ? min_device_bytes() : 0; /* every fetch reads NVMe */
        run_out ref;
        run(&c, &ref);

        harness h;
        harness_open(&h, &c);
        zo_swap_fault never = {ZO_SWAP_FAULT_EIO, UINT64_MAX, 0};
        ZO_ASSERT_OK(make_engine(&h, &never, 1));
        double losses[8];
        zo_step_stats st;
        for (int s = 0; s < c.steps; s++) {
            if (s == 4)
                fail_step_at(&h, zo_engine_nvme_store(h.eng), s);
            if (s == 5 && params_on_nvme)
                fail_step_at(&h, zo_engine_nvme_param_store(h.eng), s);
            ZO_ASSERT_OK(train_step(&h, s, &losses[s], &st));
        }
        close_and_compare(&h, losses, &ref, c.steps);
    }
}

/* ---- checkpoints: the full optimizer state ---- */

typedef struct saved_state {
    float *st[TM_T][3]; /* master, m, v */
    zo_engine_step_state ss;
} saved_state;

static void save_state(harness *h, saved_state *out)
{
    for (int k = 0; k < TM_T; k++) {
        for (int i = 0; i < 3; i++)
            out->st[k][i] = malloc(tm_numel(k) * sizeof(float));
        ZO_ASSERT_OK(
            zo_engine_read_state(h->eng, h->ids[k], out->st[k][0], out->st[k][1], out->st[k][2]));
    }
    out->ss = (zo_engine_step_state)ZO_ENGINE_STEP_STATE_INIT;
    ZO_ASSERT_OK(zo_engine_get_step_state(h->eng, &out->ss));
}

static void saved_state_free(saved_state *s)
{
    for (int k = 0; k < TM_T; k++)
        for (int i = 0; i < 3; i++)
            free(s->st[k][i]);
}

/* what: bit 0 masters, 1 moments, 2 the step state */
static void restore_state(harness *h, const saved_state *s, unsigned what)
{
    for (int k = 0; k < TM_T; k++)
        ZO_ASSERT_OK(zo_engine_write_state(h->eng, h->ids[k], what & 1 ? s->st[k][0] : NULL,
                                           what & 2 ? s->st[k][1] : NULL,
                                           what & 2 ? s->st[k][2] : NULL));
    if (what & 4)
        ZO_ASSERT_OK(zo_engine_set_step_state(h->eng, &s->ss));
}

static void train_range(harness *h, int s0, int s1, double *losses)
{
    zo_step_stats st;
    for (int s = s0; s < s1; s++)
        ZO_ASSERT_OK(train_step(h, s, &losses[s], &st));
}

/* Steps half..2*half-1 of a fresh engine given the state saved at step half
 * (what: as restore_state); 1 when losses and final weights equal ref's. */
static int resumed_equals(const run_cfg *c, const saved_state *s, unsigned what, int half,
                          const double *ref_losses, float *ref_master[TM_T])
{
    harness h;
    harness_open(&h, c);
    ZO_ASSERT_OK(make_engine(&h, NULL, 0));
    restore_state(&h, s, what);
    double losses[TM_MAXSTEPS];
    train_range(&h, half, 2 * half, losses);
    float *got[TM_T];
    read_masters(&h, got);
    harness_close(&h);
    int same = memcmp(&losses[half], &ref_losses[half], (size_t)half * sizeof(double)) == 0;
    for (int k = 0; k < TM_T; k++) {
        same &= memcmp(got[k], ref_master[k], tm_numel(k) * sizeof(float)) == 0;
        free(got[k]);
    }
    return same;
}

/* Save the state at step 6 of 12, load it into a fresh engine, run steps
 * 6..11: losses and final weights equal the run that never stopped, bit for
 * bit, under every placement and mode (dpu flushes at the save, the
 * reference too), and with fp16's loss scaler after overflows. Leaving out
 * the moments or the step state breaks it (they are used). */
static void test_state_round_trip_resumes_bitwise(void **state)
{
    (void)state;
    const int half = 6;
    const zo_tier homes[][2] = {{ZO_TIER_DEVICE, ZO_TIER_DEVICE},
                                {ZO_TIER_HOST, ZO_TIER_HOST},
                                {ZO_TIER_HOST, ZO_TIER_NVME},
                                {ZO_TIER_DEVICE, ZO_TIER_NVME},
                                {ZO_TIER_NVME, ZO_TIER_NVME}};
    for (int i = 0; i < 5; i++)
        for (int mode = 0; mode < 4; mode++) {
            run_cfg c =
                base_cfg(homes[i][0], homes[i][1], mode == 3 ? ZO_OPTIM_SYNC : (zo_optim_mode)mode);
            if (mode == 3) { /* fp16: an overflow before the save and one after */
                c.dtype = ZO_DTYPE_F16;
                c.poison_steps = (1u << 2) | (1u << 8);
            }
            if (homes[i][0] != ZO_TIER_DEVICE)
                c.device_bytes = min_device_bytes();
            harness h;
            harness_open(&h, &c);
            ZO_ASSERT_OK(make_engine(&h, NULL, 0));
            double losses[TM_MAXSTEPS];
            train_range(&h, 0, half, losses);
            ZO_ASSERT_OK(zo_engine_flush(h.eng));
            saved_state s;
            save_state(&h, &s);
            if (mode == 3)
                assert_int_equal(s.ss.scaler_hysteresis, 1); /* the overflow used one */
            train_range(&h, half, 2 * half, losses);
            float *ref[TM_T];
            read_masters(&h, ref);
            harness_close(&h);
            if (!resumed_equals(&c, &s, 7, half, losses, ref))
                fail_msg("placement %d mode %d: the resumed run differs", i, mode);
            if (i == 2 && mode == 0) {
                assert_false(resumed_equals(&c, &s, 5, half, losses, ref)); /* without m, v */
                assert_false(
                    resumed_equals(&c, &s, 3, half, losses, ref)); /* without the step count */
            }
            for (int k = 0; k < TM_T; k++)
                free(ref[k]);
            saved_state_free(&s);
        }
}

/* ---- compact optimizer states ---- */

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
        assert_true(ref.fp.nvme < f32.fp.nvme && ref.fp.pinned < f32.fp.pinned);
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

/* The calls refuse what they cannot do, naming why; an NVMe write failing
 * under write_state leaves the previous state readable and the call can be
 * repeated. */
static void test_state_errors(void **state)
{
    (void)state;
    run_cfg c = base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, ZO_OPTIM_DPU);
    harness h;
    harness_open(&h, &c);
    zo_swap_fault never = {ZO_SWAP_FAULT_EIO, UINT64_MAX, 0};
    ZO_ASSERT_OK(build_engine(&h, &never, 1, 0));
    float *w = calloc(TM_D * TM_D, sizeof(float));
    ZO_ASSERT_ST(zo_engine_write_state(h.eng, h.ids[0], w, NULL, NULL), ZO_ERR_STATE);
    assert_non_null(strstr(zo_last_error(), "zo_engine_finalize"));
    ZO_ASSERT_OK(zo_engine_finalize(h.eng));
    double losses[4];
    train_range(&h, 0, 2, losses);
    zo_engine_step_state ss = ZO_ENGINE_STEP_STATE_INIT;
    ZO_ASSERT_ST(zo_engine_write_state(h.eng, h.ids[0], w, NULL, NULL), ZO_ERR_STATE);
    assert_non_null(strstr(zo_last_error(), "call zo_engine_flush first"));
    ZO_ASSERT_ST(zo_engine_get_step_state(h.eng, &ss), ZO_ERR_STATE);
    ZO_ASSERT_OK(zo_engine_flush(h.eng));
    ZO_ASSERT_OK(zo_engine_get_step_state(h.eng, &ss));
    assert_int_equal(ss.updates, 2);
    assert_int_equal(ss.steps, 2);
    ZO_ASSERT_ST(zo_engine_read_state(h.eng, TM_T, w, NULL, NULL), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_engine_write_state(h.eng, -1, w, NULL, NULL), ZO_ERR_INVALID_ARG);
    zo_engine_step_state bad = ss;
    bad.updates = ss.steps + 1;
    ZO_ASSERT_ST(zo_engine_set_step_state(h.eng, &bad), ZO_ERR_INVALID_ARG);
    bad = ss;
    bad.struct_size = 8;
    ZO_ASSERT_ST(zo_engine_set_step_state(h.eng, &bad), ZO_ERR_INVALID_ARG);
    /* mid-step */
    void *p[2];
    ZO_ASSERT_OK(zo_engine_fetch(h.eng, 0, ZO_PHASE_FORWARD, h.compute, p, NULL, 2));
    ZO_ASSERT_ST(zo_engine_write_state(h.eng, h.ids[0], w, NULL, NULL), ZO_ERR_STATE);
    assert_non_null(strstr(zo_last_error(), "a step is open"));
    ZO_ASSERT_ST(zo_engine_flush(h.eng), ZO_ERR_STATE);
    ZO_ASSERT_OK(zo_engine_release(h.eng, 0, h.compute));
    ZO_ASSERT_OK(zo_stream_synchronize(h.compute));
    harness_close(&h);

    /* a failed NVMe write: the state stays, a retry succeeds */
    c = base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, ZO_OPTIM_SYNC);
    harness_open(&h, &c);
    ZO_ASSERT_OK(make_engine(&h, &never, 1));
    train_range(&h, 0, 2, losses);
    float *m0 = malloc(TM_D * TM_D * sizeof(float)), *m1 = malloc(TM_D * TM_D * sizeof(float));
    ZO_ASSERT_OK(zo_engine_read_state(h.eng, h.ids[0], m0, NULL, NULL));
    for (int i = 0; i < TM_D * TM_D; i++)
        w[i] = (float)i / 4096.0f;
    zo_swap_t stores[2] = {zo_engine_nvme_store(h.eng), zo_engine_nvme_param_store(h.eng)};
    for (int s = 0; s < 2; s++) {
        zo_swap_fault f = {ZO_SWAP_FAULT_EIO, 0, 0};
        ZO_ASSERT_OK(zo_swap_set_faults(stores[s], &f, 1));
        ZO_ASSERT_ST(zo_engine_write_state(h.eng, h.ids[0], w, w, w), ZO_ERR_IO);
        ZO_ASSERT_OK(zo_swap_set_faults(stores[s], NULL, 0));
        ZO_ASSERT_OK(zo_engine_read_state(h.eng, h.ids[0], m1, NULL, NULL));
        assert_memory_equal(m0, m1, TM_D * TM_D * sizeof(float));
    }
    ZO_ASSERT_OK(zo_engine_write_state(h.eng, h.ids[0], w, NULL, w));
    float *vv = malloc(TM_D * TM_D * sizeof(float));
    ZO_ASSERT_OK(zo_engine_read_state(h.eng, h.ids[0], m1, NULL, vv));
    assert_memory_equal(m1, w, TM_D * TM_D * sizeof(float));
    assert_memory_equal(vv, w, TM_D * TM_D * sizeof(float));
    free(vv);
    /* the new weights are what the next forward computes with */
    train_range(&h, 2, 3, losses);
    harness_close(&h);
    free(m0);
    free(m1);
    free(w);
}

/* A device stream task fails in the middle of a step (whichever runs next:
 * the caller's compute, a copy, a timer or a completion signal): the step
 * fails, the weights stay, and running the step again gives the same
 * training as a run without the fault. */
static void test_stream_task_fault_during_step(void **state)
{
    (void)state;
    const run_cfg cases[] = {base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_SYNC),
                             base_cfg(ZO_TIER_HOST, ZO_TIER_NVME, ZO_OPTIM_OVERLAP),
                             base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, ZO_OPTIM_SYNC)};
    for (int i = 0; i < 3; i++) {
        run_cfg c = cases[i];
        c.steps = 6;
        c.device_bytes = min_device_bytes();
        run_out ref;
        run(&c, &ref);
        harness h;
        harness_open(&h, &c);
        ZO_ASSERT_OK(make_engine(&h, NULL, 0));
        double losses[6];
        zo_step_stats st;
        for (int s = 0; s < c.steps; s++) {
            for (int l = 0; s == 3 && l < TM_L; l++) {
                float *before[TM_T];
                read_masters(&h, before);
                h.fault_layer = l;
                zo_status e = failing_step(&h, s, before);
                h.fault_layer = -1;
                if (e >= 0)
                    fail_msg("a failed stream task after layer %d's backward went unnoticed", l);
            }
            ZO_ASSERT_OK(train_step(&h, s, &losses[s], &st));
        }
        close_and_compare(&h, losses, &ref, c.steps);
    }
}

/* Misses of an optimal (farthest next use) cache of n slots over one step's
 * fetches, starting empty; each fetch needs its layer's two chunks. */
static int belady_misses(const int *layers, int n_fetch, int nslots)
{
    int slot[64], misses = 0;
    for (int i = 0; i < nslots; i++)
        slot[i] = -1;
    for (int pos = 0; pos < n_fetch; pos++) {
        for (int c = 2 * layers[pos]; c < 2 * layers[pos] + 2; c++) {
            int hit = 0, free_slot = -1;
            for (int i = 0; i < nslots; i++) {
                if (slot[i] == c)
                    hit = 1;
                if (slot[i] < 0 && free_slot < 0)
                    free_slot = i;
            }
            if (hit)
                continue;
            misses++;
            if (free_slot < 0) {
                int far = -1;
                for (int i = nslots - 1; i >= 0; i--) {
                    if (slot[i] / 2 == layers[pos])
                        continue;
                    int nu = INT_MAX - 1;
                    for (int j = pos + 1; j < n_fetch; j++)
                        if (layers[j] == slot[i] / 2) {
                            nu = j;
                            break;
                        }
                    if (nu > far) {
                        far = nu;
                        free_slot = i;
                    }
                }
            }
            slot[free_slot] = c;
        }
    }
    return misses;
}

static int lru_misses(const int *layers, int n_fetch, int nslots)
{
    int slot[64], last[64], misses = 0;
    for (int i = 0; i < nslots; i++)
        slot[i] = -1, last[i] = -1;
    for (int pos = 0; pos < n_fetch; pos++)
        for (int c = 2 * layers[pos]; c < 2 * layers[pos] + 2; c++) {
            int at = -1;
            for (int i = 0; i < nslots; i++)
                if (slot[i] == c)
                    at = i;
            if (at < 0) {
                misses++;
                for (int i = 0; i < nslots; i++)
                    if (at < 0 || last[i] < last[at])
                        at = i;
                slot[at] = c;
            }
            last[at] = pos;
        }
    return misses;
}

static void test_prefetch_and_belady_eviction(void **state)
{
    (void)state;
    const int nslots = 5;
    run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_SYNC);
    c.device_bytes = (uint64_t)(nslots + 2) * CHUNK; /* 5 parameter slots + one layer's gradients */
    c.steps = 8;
    c.lookahead = 0;
    run_out demand;
    run(&c, &demand);
    assert_int_equal(demand.fp.device_param_slots, nslots);
    int layers[2 * TM_L];
    for (int l = 0; l < TM_L; l++)
        layers[l] = l, layers[2 * TM_L - 1 - l] = l;
    int best = belady_misses(layers, 2 * TM_L, nslots);
    int lru = lru_misses(layers, 2 * TM_L, nslots);
    assert_true(best < lru);               /* the case is one where the rule matters */
    const uint64_t fetched = 2 * TM_L * 2; /* chunks fetched per step */
    for (int s = 1; s < c.steps; s++) { /* step 0 records the trace, evicting least recently used */
        assert_int_equal(demand.stats[s].fetch_misses, best);
        assert_int_equal(demand.stats[s].fetch_hits, fetched - (uint64_t)best);
        assert_int_equal(demand.stats[s].prefetches, 0);
    }
    assert_int_equal(demand.stats[0].fetch_misses, lru);

    c.lookahead = 2;
    run_out ahead;
    run(&c, &ahead);
    assert_same_weights(&demand, &ahead, c.steps);
    assert_int_equal(ahead.stats[0].prefetches, 0);
    for (int s = 1; s < c.steps; s++) {
        assert_true(ahead.stats[s].prefetches > 0);
        assert_true(ahead.stats[s].fetch_misses < demand.stats[s].fetch_misses);
        assert_int_equal(ahead.stats[s].fetch_hits + ahead.stats[s].fetch_misses, fetched);
        /* every chunk brought in was either fetched on demand or prefetched */
        assert_true(ahead.stats[s].h2d_bytes > 0);
    }

    /* a trainer that changes its order (recomputation from step 4): prefetch
     * stops for that step, the new order is recorded and followed after */
    c.recompute_from = 4;
    run_out dev;
    run(&c, &dev);
    assert_same_weights(&demand, &dev, c.steps);
    if (getenv("TM_DEBUG"))
        for (int s = 0; s < c.steps; s++)
            fprintf(stderr, "step %d: prefetches %d/%d, misses %d/%d\n", s,
                    (int)ahead.stats[s].prefetches, (int)dev.stats[s].prefetches,
                    (int)ahead.stats[s].fetch_misses, (int)dev.stats[s].fetch_misses);
    assert_true(dev.stats[4].prefetches < ahead.stats[4].prefetches);
    assert_true(dev.stats[5].prefetches > 0);
    assert_int_equal(dev.stats[5].fetch_hits + dev.stats[5].fetch_misses, fetched + 2 * TM_L);
    run_out_free(&demand);
    run_out_free(&ahead);
    run_out_free(&dev);
}

/* Bytes of one chunk's optimizer states on NVMe: master, m and v of its n
 * used elements, each padded to 4 KiB (the engine packs them). */
static uint64_t packed_states(uint64_t n)
{
    return 3 * ((n * 4 + 4095) / 4096 * 4096);
}

/* Each layer has two chunks: W fills one (CHUNK / 2 elements), b the other. */
static uint64_t layer_states(void)
{
    return packed_states(CHUNK / 2) + packed_states(TM_D);
}

static void test_step_statistics(void **state)
{
    (void)state;
    const uint64_t grad_bytes = TM_L * (CHUNK + TM_D * 2); /* W fills a chunk; b takes 128 bytes */
    for (int m = 0; m < 3; m++) {
        run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_NVME, (zo_optim_mode)m);
        c.steps = 4;
        c.accum = 2;
        run_out o;
        run(&c, &o);
        for (int s = 0; s < c.steps; s++) {
            const zo_step_stats *st = &o.stats[s];
            assert_int_equal(st->d2h_bytes, 2 * grad_bytes);
            /* everything fits on the device: each chunk goes up once per step, after an update
             * was published (DPU publishes its first update at the end of step 1) */
            assert_int_equal(st->h2d_bytes, m == ZO_OPTIM_DPU && s == 1 ? 0 : grad_bytes);
            assert_int_equal(o.fp.n_chunks, 2 * TM_L);
            assert_int_equal(zo_engine_nvme_state_bytes(TM_D), 3 * 4096);
            assert_int_equal(zo_engine_nvme_state_bytes(1024), 3 * 4096);
            assert_int_equal(zo_engine_nvme_state_bytes(1025), 6 * 4096);
            assert_int_equal(zo_engine_nvme_state_bytes(CHUNK / 2), 6 * CHUNK);
            uint64_t states =
                TM_L * layer_states(); /* W's chunk: 6 x CHUNK; b's: 12 KiB, not 6 x CHUNK */
            if (m != ZO_OPTIM_DPU || s > 0)
                assert_int_equal(st->nvme_read_bytes, states);
            if (m != ZO_OPTIM_DPU || s > 0)
                assert_int_equal(st->nvme_write_bytes, states);
            assert_true(st->step_seconds > 0 && st->optim_seconds > 0);
            assert_true(st->stall_seconds >= 0 && st->nvme_seconds >= 0);
            if (m != ZO_OPTIM_DPU)
                assert_true(st->nvme_seconds > 0);
            assert_true(st->d2h_seconds > 0 && (st->h2d_bytes == 0 || st->h2d_seconds > 0));
            assert_int_equal(st->step, m == ZO_OPTIM_DPU ? s : s + 1);
            assert_true(st->loss_scale == 1.0);
            assert_true(st->grad_norm > 0);
        }
        run_out_free(&o);
    }
}

/* The NVMe requests of finalize's initial placement (one extent written per chunk). */
static uint64_t nvme_requests_at_finalize(const run_cfg *rc, uint32_t *n_chunks)
{
    harness h;
    harness_open(&h, rc);
    ZO_ASSERT_OK(make_engine(&h, NULL, 0));
    zo_swap_stats ss = ZO_SWAP_STATS_INIT;
    ZO_ASSERT_OK(zo_swap_get_stats(zo_engine_nvme_store(h.eng), &ss));
    zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
    ZO_ASSERT_OK(zo_engine_footprint_get(h.eng, &fp));
    *n_chunks = fp.n_chunks;
    harness_close(&h);
    return ss.requests;
}

/* The NVMe request size and depth (DeepSpeed's aio.block_size and
 * aio.queue_depth) reach the swap store: 4 KiB requests split each extent's
 * write into many; a block size the store refuses fails finalize naming it;
 * the results do not depend on them. */
static void test_nvme_request_knobs(void **state)
{
    (void)state;
    run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_NVME, ZO_OPTIM_SYNC);
    uint32_t nc;
    uint64_t big = nvme_requests_at_finalize(&c, &nc);
    c.nvme_block_size = 4096;
    c.nvme_queue_depth = 2;
    uint64_t small = nvme_requests_at_finalize(&c, &nc);
    /* an extent's payload is master, m and v of a chunk's used elements: W's 6 x 8 KiB and
     * b's 3 x 4 KiB, one request each under the default 1 MiB, twelve and three of 4 KiB */
    assert_true(big >= nc);
    assert_int_equal(nc, 2 * TM_L);
    assert_int_equal(small - big, (uint64_t)TM_L * (packed_states(CHUNK / 2) / 4096 - 1 +
                                                    packed_states(TM_D) / 4096 - 1));
    c.steps = 4;
    run_out a, b;
    run(&c, &a);
    run_cfg d = base_cfg(ZO_TIER_HOST, ZO_TIER_NVME, ZO_OPTIM_SYNC);
    d.steps = 4;
    run(&d, &b);
    assert_same_weights(&a, &b, 4);
    run_out_free(&a);
    run_out_free(&b);
    c.nvme_block_size = 5000;
    harness h;
    harness_open(&h, &c);
    ZO_ASSERT_ST(make_engine(&h, NULL, 0), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "block_size 5000"));
    harness_close(&h);
}

/* ---- timelines ---- */

#define MAX_EVENTS 20000

typedef struct event_log {
    pthread_mutex_t mu;
    zo_trace_event ev[MAX_EVENTS];
    int n;
} event_log;

static void log_event(void *ctx, const zo_trace_event *ev)
{
    event_log *l = ctx;
    pthread_mutex_lock(&l->mu);
    if (l->n < MAX_EVENTS)
        l->ev[l->n++] = *ev;
    pthread_mutex_unlock(&l->mu);
}

static int count_events(const event_log *l, zo_trace_track track, int index, const char *name)
{
    int n = 0;
    for (int i = 0; i < l->n; i++)
        n += l->ev[i].track == track && l->ev[i].index == index &&
             (!name || strcmp(l->ev[i].name, name) == 0);
    return n;
}

/* A traced run (parameters and states on NVMe, overlap mode, a slow link
 * without prefetch so that the compute stream waits) reports spans on every
 * track: both copy streams, the compute stream's waits, both NVMe queues,
 * the host job thread, the end-of-step update and the optimizer's workers,
 * each well formed; and tracing changes nothing in the results. */
static void test_trace_covers_every_track(void **state)
{
    (void)state;
    static event_log log;
    pthread_mutex_init(&log.mu, NULL);
    log.n = 0;
    setenv("ZO_CPU_DEVICE_PCIE_GBPS", "0.05", 1);
    run_cfg c = base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, ZO_OPTIM_OVERLAP);
    c.device_bytes = min_device_bytes();
    c.lookahead = 0;
    c.steps = 3;
    c.max_norm = 1e-3f; /* clipping: the speculative updates are rolled back and redone */
    run_out plain, traced;
    run(&c, &plain);
    c.trace = log_event;
    c.trace_ctx = &log;
    run(&c, &traced);
    unsetenv("ZO_CPU_DEVICE_PCIE_GBPS");
    assert_same_weights(&plain, &traced, c.steps);
    assert_true(count_events(&log, ZO_TRACK_H2D, 0, "h2d") > 0);
    assert_int_equal(count_events(&log, ZO_TRACK_D2H, 0, "d2h"), c.steps * (int)traced.fp.n_chunks);
    assert_true(count_events(&log, ZO_TRACK_COMPUTE, 0, "wait for parameters") > 0);
    for (int store = 0; store < 2; store++) {
        assert_true(count_events(&log, ZO_TRACK_NVME, store, "nvme read") > 0);
        assert_true(count_events(&log, ZO_TRACK_NVME, store, "nvme write") > 0);
    }
    assert_int_equal(
        count_events(&log, ZO_TRACK_HOST_JOBS, 0, "gradient norm + speculative update"),
        c.steps * (int)traced.fp.n_chunks);
    assert_int_equal(count_events(&log, ZO_TRACK_UPDATE, 0, "rollback and update"), c.steps);
    int workers = count_events(&log, ZO_TRACK_OPTIM_WORKER, 0, NULL) +
                  count_events(&log, ZO_TRACK_OPTIM_WORKER, 1, NULL);
    assert_true(workers > 0);
    for (int i = 0; i < log.n; i++) {
        const zo_trace_event *e = &log.ev[i];
        assert_true(e->t0_ns <= e->t1_ns);
        assert_true(e->layer >= -1 && e->layer < TM_L);
        if (e->track == ZO_TRACK_H2D || e->track == ZO_TRACK_D2H) {
            assert_true(e->chunk >= 0 && e->layer >= 0);
            assert_true(e->bytes > 0 && e->bytes <= CHUNK);
        }
        if (e->track == ZO_TRACK_NVME)
            assert_true(e->index ? e->bytes == CHUNK
                                 : e->bytes == packed_states(CHUNK / 2) ||
                                       e->bytes == packed_states(TM_D));
        if (e->track == ZO_TRACK_OPTIM_WORKER)
            assert_true(e->index < 2 && e->bytes > 0);
    }
    run_out_free(&plain);
    run_out_free(&traced);
    harness h;
    harness_open(&h, &c);
    ZO_ASSERT_OK(make_engine(&h, NULL, 0));
    ZO_ASSERT_ST(zo_engine_set_trace(h.eng, log_event, &log), ZO_ERR_STATE);
    harness_close(&h);
    pthread_mutex_destroy(&log.mu);
}

/* On a slow emulated link with no prefetch, the compute stream waits for
 * every chunk: the stall time says so. */
/* ---- per-chunk homes ---- */

#define STATES_PER_CHUNK (6ull * CHUNK) /* what a chunk's optimizer states count in a cap */
#define N_CHUNKS         8 /* the test model packs each layer's W into a chunk, its b into another */

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
    split sp = {ZO_TIER_HOST, lcg(&r) % 2 ? ZO_TIER_NVME : ZO_TIER_HOST, {0, 0}, {0, 0}, 0};
    sp.ph = (zo_tier)(lcg(&r) % (sp.oh == ZO_TIER_NVME ? 3 : 2));
    const uint64_t unit[2] = {CHUNK / 2,
                              STATES_PER_CHUNK / 2}; /* half chunks: caps between chunks too */
    zo_engine_caps *caps[2] = {&sp.pcaps, &sp.ocaps};
    zo_tier homes[2] = {sp.ph, sp.oh};
    for (int k = 0; k < 2; k++) {
        if (homes[k] > ZO_TIER_DEVICE)
            caps[k]->device = (lcg(&r) % 5) * unit[k];
        if (homes[k] > ZO_TIER_HOST)
            caps[k]->host = (lcg(&r) % (2 * N_CHUNKS + 1)) * unit[k];
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
    out[n++] = (split){ZO_TIER_HOST, ZO_TIER_NVME, {0, 0}, {0, 4 * S}, 1};
    out[n++] = (split){ZO_TIER_NVME, ZO_TIER_NVME, {0, 5 * P}, {0, 2 * S}, 1};
    out[n++] = (split){ZO_TIER_NVME, ZO_TIER_NVME, {P, P}, {S, 2 * S + S / 2}, 0};
    out[n++] = (split){ZO_TIER_HOST, ZO_TIER_HOST, {3 * P, 0}, {3 * S, 0}, 0};
    out[n++] = random_split(seed);
    /* device-resident parameters over NVMe states (their copy on NVMe),
     * beside host and NVMe homes */
    out[n++] = (split){ZO_TIER_NVME, ZO_TIER_NVME, {4 * P, P}, {0, 2 * S}, 0};
    out[n++] = (split){ZO_TIER_DEVICE, ZO_TIER_NVME, {0, 0}, {S, 3 * S}, 0};
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
    c.ocaps.host = 0;
    run(&c, &all);
    assert_int_equal(o.fp.host - o.fp.grad_host, 4 * STATES_PER_CHUNK);
    assert_int_equal(o.fp.grad_host, 4ull * CHUNK); /* the NVMe-homed states' gradients */
    assert_int_equal(o.fp.nvme * 2, all.fp.nvme);
    assert_int_equal(o.fp.nvme, 2ull * 4 * zo_engine_nvme_state_bytes(TM_D * TM_D));
    /* host states need one host copy of their parameters, NVMe ones two */
    assert_int_equal((all.fp.pinned - all.fp.grad_pinned) - (o.fp.pinned - o.fp.grad_pinned),
                     4ull * CHUNK);
    c.mode = ZO_OPTIM_OVERLAP; /* and backups of the host ones */
    run_out_free(&o);
    run(&c, &o);
    c.ocaps.host = 4 * STATES_PER_CHUNK;
    run_out ovl;
    run(&c, &ovl);
    assert_int_equal(ovl.fp.host - ovl.fp.grad_host, 2 * 4 * STATES_PER_CHUNK);
    run_out_free(&o);
    run_out_free(&all);
    run_out_free(&ovl);
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
        run(&c, &ref);
        harness h;
        harness_open(&h, &c);
        zo_swap_fault never = {ZO_SWAP_FAULT_EIO, UINT64_MAX, 0};
        ZO_ASSERT_OK(make_engine(&h, &never, 1));
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
    c.ocaps.host = STATES_PER_CHUNK;
    harness h;
    harness_open(&h, &c);
    ZO_ASSERT_ST(make_engine(&h, NULL, 0), ZO_ERR_INVALID_ARG);
    if (!strstr(zo_last_error(), "optim_caps.host"))
        fail_msg("refusal: %s", zo_last_error());
    harness_close(&h);
    c = base_cfg(ZO_TIER_DEVICE, ZO_TIER_HOST, ZO_OPTIM_SYNC);
    c.pcaps.device = CHUNK;
    harness_open(&h, &c);
    ZO_ASSERT_ST(make_engine(&h, NULL, 0), ZO_ERR_INVALID_ARG);
    if (!strstr(zo_last_error(), "param_caps.device"))
        fail_msg("refusal: %s", zo_last_error());
    harness_close(&h);
}

static void test_stall_is_measured(void **state)
{
    (void)state;
    setenv("ZO_CPU_DEVICE_PCIE_GBPS", "0.02", 1); /* 8 KiB take ~0.4 ms */
    run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_SYNC);
    c.device_bytes = min_device_bytes();
    c.lookahead = 0;
    c.steps = 3;
    run_out o;
    run(&c, &o);
    unsetenv("ZO_CPU_DEVICE_PCIE_GBPS");
    for (int s = 0; s < c.steps; s++) {
        assert_true(o.stats[s].stall_seconds > 0);
        assert_true(o.stats[s].stall_seconds <= o.stats[s].step_seconds);
        assert_true(o.stats[s].h2d_seconds >= 16 * 4e-4 * 0.5);
    }
    run_out_free(&o);
}

/* ---- the host tier's budget ---- */

/* The host budget is a hard limit like the device's: one byte short of the
 * plan's pinned + pageable bytes is refused (by zo_engine_plan and by
 * finalize) naming the host tier and the shortfall; at the budget a run's
 * measured peaks stay within it (run checks every step) and it trains as
 * the unlimited run does. */
static void test_host_budget(void **state)
{
    (void)state;
    run_cfg cases[3] = {base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_SYNC),
                        base_cfg(ZO_TIER_HOST, ZO_TIER_NVME, ZO_OPTIM_OVERLAP),
                        base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, ZO_OPTIM_DPU)};
    cases[2].accum = 2;
    for (int i = 0; i < 3; i++) {
        run_cfg c = cases[i];
        c.steps = 4;
        run_out free_run, at_budget;
        run(&c, &free_run);
        /* the least: gradients staged for NVMe states all spilled */
        uint64_t need = free_run.fp.pinned + free_run.fp.host - free_run.fp.grad_host;
        c.host_bytes = need - 1;
        expect_refusal(&c, ZO_ERR_BUDGET, "host tier");
        harness h;
        harness_open(&h, &c);
        ZO_ASSERT_OK(build_engine(&h, NULL, 0, 0));
        zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
        int fits = 1;
        char msg[512];
        ZO_ASSERT_OK(zo_engine_plan(h.eng, &fp, &fits, msg, sizeof msg));
        assert_false(fits);
        if (!strstr(msg, "host tier") || !strstr(msg, "short by 1 bytes"))
            fail_msg("plan message: %s", msg);
        harness_close(&h);
        c.host_bytes = need;
        run(&c, &at_budget);
        assert_same_weights(&free_run, &at_budget, c.steps);
        run_out_free(&free_run);
        run_out_free(&at_budget);
    }
}

/* ---- layer-major micro-batch groups ---- */

/* Groups of 1, 2 and 4 micro-batches (and 2 of 5 and 8 of 5: a short last
 * group, one group per step) equal micro-batch-major accumulation bitwise in
 * every optimizer mode, states on the host and on NVMe; fp16 with overflows. */
static void test_layer_major_groups_equal_micro_batch_major(void **state)
{
    (void)state;
    static const int groups[][2] = {{1, 4}, {2, 4}, {4, 4}, {2, 5}, {8, 5}}; /* group, accum */
    for (int m = 0; m < 3; m++)
        for (int nvme = 0; nvme < 2; nvme++) {
            run_cfg c =
                base_cfg(ZO_TIER_HOST, nvme ? ZO_TIER_NVME : ZO_TIER_HOST, (zo_optim_mode)m);
            if (nvme) { /* fp16 with overflows, clipping, the smallest device */
                c.dtype = ZO_DTYPE_F16;
                c.poison_steps = (1u << 3) | (1u << 11);
                c.max_norm = 0.5f;
            }
            run_out ref[2];
            int have[2] = {0, 0};
            for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) {
                c.accum = groups[i][1];
                int r = c.accum == 5;
                if (!have[r]) {
                    c.group = 0;
                    run(&c, &ref[r]);
                    have[r] = 1;
                }
                c.group = groups[i][0];
                run_out o;
                run(&c, &o);
                assert_same_weights(&o, &ref[r], c.steps);
                run_out_free(&o);
            }
            run_out_free(&ref[0]);
            run_out_free(&ref[1]);
        }
}

/* Groups with the parameters on NVMe through the smallest device budget
 * (with the fp32 sums), and with the optimizer on the device (cpu device):
 * bitwise the micro-batch-major runs. */
static void test_layer_major_other_homes(void **state)
{
    (void)state;
    const zo_tier homes[2][2] = {{ZO_TIER_NVME, ZO_TIER_NVME}, {ZO_TIER_HOST, ZO_TIER_DEVICE}};
    for (int i = 0; i < 2; i++)
        for (int m = 0; m < 3; m++) {
            run_cfg c = base_cfg(homes[i][0], homes[i][1], (zo_optim_mode)m);
            c.accum = 4;
            c.steps = 8;
            if (i == 0)
                c.device_bytes = min_device_bytes();
            run_out ref, o;
            run(&c, &ref);
            c.group = 4;
            if (i == 0)
                c.device_bytes = min_device_bytes() + 2 * 2 * CHUNK; /* and two fp32 sums */
            run(&c, &o);
            assert_same_weights(&o, &ref, c.steps);
            run_out_free(&o);
            run_out_free(&ref);
        }
}

/* Grouped, the gradient slots gain fp32 sums on the device, the host's fp32
 * accumulators go, and the pinned 16-bit gradient copies become fp32 sums. */
static void test_layer_major_footprint(void **state)
{
    (void)state;
    for (int m = 0; m < 3; m++) {
        run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, (zo_optim_mode)m);
        c.accum = 4;
        c.steps = 2;
        run_out a, b;
        run(&c, &a);
        c.group = 4;
        run(&c, &b);
        uint64_t C = a.fp.chunk_bytes, N = a.fp.n_chunks, K = a.fp.max_chunks_per_layer;
        uint64_t G = m == ZO_OPTIM_DPU ? 2 : 1;
        assert_int_equal(b.fp.device, a.fp.device + 2 * K * C);
        assert_int_equal(a.fp.host - b.fp.host, 2 * C * N * G);
        assert_int_equal(b.fp.pinned - a.fp.pinned, N * C * G);
        run_out_free(&a);
        run_out_free(&b);
    }
}

/* With one layer's slots on the device, a group of 4 fetches each layer once
 * per phase instead of four times: the measured host-to-device bytes of a
 * step are a quarter of micro-batch-major's but for the loads that
 * micro-batch-major saves where one micro-batch's last backward layer is the
 * next one's first forward layer (layer 0's chunks, still resident). */
static void test_layer_major_moves_fewer_parameter_bytes(void **state)
{
    (void)state;
    run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_SYNC);
    c.accum = 4;
    c.steps = 4;
    c.lookahead = 0;
    const uint64_t layer = CHUNK + TM_D * 2; /* W's chunk and b's bytes in use */
    c.device_bytes = min_device_bytes();
    run_out a, b;
    run(&c, &a);
    c.group = 4;
    c.device_bytes = min_device_bytes() + 2 * 2 * CHUNK; /* and two fp32 sums */
    run(&c, &b);
    assert_same_weights(&a, &b, c.steps);
    for (int s = 1; s < c.steps; s++) {
        /* each layer loaded once per phase and group, the last layer's backward
         * following its forward on the same slots */
        assert_int_equal(b.stats[s].h2d_bytes, (2 * TM_L - 1) * layer);
        assert_int_equal(a.stats[s].h2d_bytes, 4 * b.stats[s].h2d_bytes - 3 * layer);
        assert_int_equal(a.stats[s].d2h_bytes, 4 * TM_L * layer);
        assert_int_equal(b.stats[s].d2h_bytes, 2 * TM_L * layer); /* fp32, once */
    }
    run_out_free(&a);
    run_out_free(&b);
}

/* A stream task failing in the middle of a group's backward, or an NVMe
 * write failing at the end of a grouped step: the step is abandoned, the
 * weights stay, and its retry gives the run without the fault. */
static void test_layer_major_fault_mid_group(void **state)
{
    (void)state;
    for (int i = 0; i < 2; i++) {
        run_cfg c = base_cfg(ZO_TIER_HOST, i ? ZO_TIER_NVME : ZO_TIER_HOST,
                             i ? ZO_OPTIM_OVERLAP : ZO_OPTIM_SYNC);
        c.steps = 6;
        c.accum = 4;
        c.group = 2;
        run_out ref;
        run(&c, &ref);
        harness h;
        harness_open(&h, &c);
        zo_swap_fault never = {ZO_SWAP_FAULT_EIO, UINT64_MAX, 0};
        ZO_ASSERT_OK(make_engine(&h, i ? &never : NULL, i ? 1 : 0));
        double losses[6];
        zo_step_stats st;
        for (int s = 0; s < c.steps; s++) {
            for (int l = 0; s == 3 && l < TM_L; l++) {
                float *before[TM_T];
                read_masters(&h, before);
                h.fault_layer = l;
                zo_status e = failing_step(&h, s, before);
                h.fault_layer = -1;
                if (e >= 0)
                    fail_msg("a failed stream task in layer %d's group went unnoticed", l);
            }
            if (s == 4 && i)
                fail_step_at(&h, zo_engine_nvme_store(h.eng), s);
            ZO_ASSERT_OK(train_step(&h, s, &losses[s], &st));
        }
        close_and_compare(&h, losses, &ref, c.steps);
    }
}

/* ---- gradients kept within the host budget, spilled to NVMe beyond ---- */

#define P16_EXTENT 8192ull /* the fullest chunk's 16-bit bytes, rounded to 4 KiB */

/* The host budget that keeps the gradients of the first `kept` chunks in
 * host memory and spills the others', from a footprint with none spilled:
 * what the rest of the plan takes (the stages' room to read them back
 * included), and their bytes by parity. */
static uint64_t spill_budget(const zo_engine_footprint *fp, int kept, int g_bufs)
{
    assert_int_equal(fp->grad_stage, 3ull * CHUNK);
    uint64_t rest = fp->pinned + fp->host - fp->grad_host;
    return rest + (uint64_t)kept * (uint64_t)g_bufs * CHUNK;
}

static float median_norm(const run_out *o)
{
    double n[STEPS];
    for (int s = 0; s < STEPS; s++)
        n[s] = o->stats[s].grad_norm;
    for (int i = 0; i < STEPS; i++)
        for (int j = i + 1; j < STEPS; j++)
            if (n[j] < n[i]) {
                double t = n[i];
                n[i] = n[j];
                n[j] = t;
            }
    return (float)n[STEPS / 2];
}

/* With parameters and states on NVMe no whole-model gradient mirror is
 * pinned: a ring of lookahead + 2 chunks is. Gradients kept in host memory
 * up to the host budget and spilled to NVMe beyond it (half of them, all of
 * them) train bitwise as with all kept, in sync, overlap (also with clipping,
 * whose redo reads them back) and dpu modes; one byte below the smallest
 * budget is refused naming the host tier. */
static void test_spilled_gradients_train_bitwise(void **state)
{
    (void)state;
    for (int m = 0; m < 4; m++) {
        zo_optim_mode mode = m == 3 ? ZO_OPTIM_DPU : m ? ZO_OPTIM_OVERLAP : ZO_OPTIM_SYNC;
        int g_bufs = mode == ZO_OPTIM_DPU ? 2 : 1;
        run_cfg c = base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, mode);
        run_out kept_all;
        if (m == 2) {
            run(&c, &kept_all);
            c.max_norm = median_norm(&kept_all); /* about half the steps clip */
            run_out_free(&kept_all);
        }
        run(&c, &kept_all);
        assert_int_equal(kept_all.fp.grad_pinned, (2 + 2) * CHUNK); /* lookahead 2 */
        assert_int_equal(kept_all.fp.grad_host, (uint64_t)N_CHUNKS * g_bufs * CHUNK);
        assert_int_equal(kept_all.fp.grad_nvme, 0);
        for (int kept = N_CHUNKS / 2; kept >= 0; kept -= N_CHUNKS / 2) {
            run_out o;
            c.host_bytes = spill_budget(&kept_all.fp, kept, g_bufs);
            run(&c, &o);
            assert_int_equal(o.fp.grad_host, (uint64_t)kept * g_bufs * CHUNK);
            assert_int_equal(o.fp.grad_nvme, (uint64_t)(N_CHUNKS - kept) * g_bufs * P16_EXTENT);
            assert_int_equal(o.fp.pinned + o.fp.host, c.host_bytes);
            assert_same_weights(&kept_all, &o, STEPS);
            int clipped = 0;
            for (int s = 0; s < STEPS; s++)
                clipped += o.stats[s].clipped;
            assert_true(m != 2 || (clipped > 0 && o.stats[0].nvme_read_bytes > 0));
            run_out_free(&o);
        }
        c.host_bytes = spill_budget(&kept_all.fp, 0, g_bufs) - 1;
        expect_refusal(&c, ZO_ERR_BUDGET, "host tier");
        run_out_free(&kept_all);
    }
}

/* Grouped with one group per step, the fp32 sums of the NVMe-homed chunks
 * are staged as the 16-bit gradients are: a ring of lookahead + 2 fp32
 * chunks, kept in host memory up to the budget and spilled beyond it (half
 * of them, all of them); sync and overlap train bitwise as micro-batch-major. */
static void test_spilled_group_sums_train_bitwise(void **state)
{
    (void)state;
    const uint64_t S = 2 * CHUNK; /* a chunk's fp32 sums */
    for (int m = 0; m < 2; m++) {
        run_cfg c = base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, m ? ZO_OPTIM_OVERLAP : ZO_OPTIM_SYNC);
        c.accum = 4;
        c.steps = 8;
        run_out ref, kept_all;
        run(&c, &ref);
        c.group = 4;
        run(&c, &kept_all);
        assert_same_weights(&ref, &kept_all, c.steps);
        assert_int_equal(kept_all.fp.grad_pinned, (2 + 2) * S); /* lookahead 2 */
        assert_int_equal(kept_all.fp.grad_stage, 3 * S);
        assert_int_equal(kept_all.fp.grad_host, N_CHUNKS * S);
        uint64_t rest = kept_all.fp.pinned + kept_all.fp.host - kept_all.fp.grad_host;
        for (int kept = N_CHUNKS / 2; kept >= 0; kept -= N_CHUNKS / 2) {
            run_out o;
            c.host_bytes = rest + (uint64_t)kept * S;
            run(&c, &o);
            assert_int_equal(o.fp.grad_host, (uint64_t)kept * S);
            assert_int_equal(o.fp.grad_nvme, (uint64_t)(N_CHUNKS - kept) * 2 * P16_EXTENT);
            assert_same_weights(&ref, &o, c.steps);
            run_out_free(&o);
        }
        run_out_free(&ref);
        run_out_free(&kept_all);
    }
}

/* Flips a byte of every extent of the gradients' store once a gradient
 * write lands (from the trace callback, on the store's I/O thread): the
 * extents written so far this step fail their checksum when read back. */
typedef struct corrupter {
    _Atomic int armed;
    int store; /* the traced store it corrupts: 1 16-bit parameters, 2 gradients */
    int n;
    char path[8][512];
    uint64_t off[64];
    int file[64];
} corrupter;

static void corrupt_on_write(void *ctx, const zo_trace_event *ev)
{
    corrupter *k = ctx;
    if (ev->track != ZO_TRACK_NVME || ev->index != k->store ||
        strcmp(ev->name, "nvme write") != 0 || !atomic_exchange(&k->armed, 0))
        return;
    for (int i = 0; i < k->n; i++) {
        FILE *f = fopen(k->path[k->file[i]], "r+b");
        assert_non_null(f);
        assert_int_equal(fseek(f, (long)k->off[i], SEEK_SET), 0);
        int b = fgetc(f);
        assert_int_equal(fseek(f, (long)k->off[i], SEEK_SET), 0);
        fputc(b ^ 0x5a, f);
        fclose(f);
    }
}

static void corrupter_locate(corrupter *k, zo_swap_t s)
{
    zo_swap_stats st = ZO_SWAP_STATS_INIT;
    ZO_ASSERT_OK(zo_swap_get_stats(s, &st));
    k->n = 0;
    for (uint32_t x = 0; x < st.extents_total && k->n < 64; x++) {
        const char *path;
        uint64_t hdr, payload;
        ZO_ASSERT_OK(zo_swap_extent_location(s, x, &path, &hdr, &payload));
        snprintf(k->path[0], sizeof k->path[0], "%s", path); /* one directory: one file */
        k->file[k->n] = 0;
        k->off[k->n++] = payload;
    }
}

/* Arm one EIO at request `op` of a store: step s fails and leaves the
 * weights as they were. */
static void fail_request(harness *h, zo_swap_t store, int s, uint64_t op)
{
    float *before[TM_T];
    read_masters(h, before);
    zo_swap_fault f = {ZO_SWAP_FAULT_EIO, op, 0};
    ZO_ASSERT_OK(zo_swap_set_faults(store, &f, 1));
    zo_status e = failing_step(h, s, before);
    if (e != ZO_ERR_IO)
        fail_msg("fault at request %d: step returned %d, expected ZO_ERR_IO: %s", (int)op, (int)e,
                 zo_last_error());
    assert_non_null(strstr(zo_last_error(), "abandoned"));
    ZO_ASSERT_OK(zo_swap_set_faults(store, NULL, 0));
}

/* Arm one EIO at requests of the gradients' store across a step (the
 * first, the middle one and the last: writes, and in sync mode the reads
 * back); each attempt fails the step and leaves the weights as they were. */
static void fail_grad_step_at(harness *h, int s, uint64_t requests_per_step)
{
    const uint64_t ops[3] = {0, requests_per_step / 2, requests_per_step - 1};
    for (int i = 0; i < 3; i++)
        fail_request(h, zo_engine_nvme_grad_store(h->eng), s, ops[i]);
}

/* Spilled gradients survive NVMe faults as the states do: a failed write or
 * read, or an extent corrupted on disk, fails the step cleanly (abandoned,
 * weights intact) and its retry trains as the run without faults. */
static void test_spilled_gradient_faults(void **state)
{
    (void)state;
    for (int m = 0; m < 2; m++) {
        run_cfg c = base_cfg(ZO_TIER_NVME, ZO_TIER_NVME, m ? ZO_OPTIM_OVERLAP : ZO_OPTIM_SYNC);
        c.steps = 8;
        run_out ref;
        run(&c, &ref);
        corrupter k = {0};
        k.store = 2;
        c.host_bytes = spill_budget(&ref.fp, N_CHUNKS / 2, 1);
        c.trace = corrupt_on_write;
        c.trace_ctx = &k;
        harness h;
        harness_open(&h, &c);
        zo_swap_fault never = {ZO_SWAP_FAULT_EIO, UINT64_MAX, 0};
        ZO_ASSERT_OK(make_engine(&h, &never, 1));
        zo_swap_t store = zo_engine_nvme_grad_store(h.eng);
        assert_non_null(store);
        corrupter_locate(&k, store);
        double losses[8];
        zo_step_stats st;
        uint64_t per_step = 0;
        for (int s = 0; s < c.steps; s++) {
            if (s == 3)
                fail_grad_step_at(&h, s, per_step);
            if (s == 5 && !m) { /* only sync mode reads every spilled gradient back */
                float *before[TM_T];
                read_masters(&h, before);
                atomic_store(&k.armed, 1);
                ZO_ASSERT_ST(failing_step(&h, s, before), ZO_ERR_CORRUPT);
                assert_int_equal(atomic_load(&k.armed), 0);
            }
            zo_swap_stats a = ZO_SWAP_STATS_INIT, b = ZO_SWAP_STATS_INIT;
            ZO_ASSERT_OK(zo_swap_get_stats(store, &a));
            ZO_ASSERT_OK(train_step(&h, s, &losses[s], &st));
            ZO_ASSERT_OK(zo_swap_get_stats(store, &b));
            per_step = b.requests - a.requests;
            assert_true(per_step > 0);
        }
        close_and_compare(&h, losses, &ref, c.steps);
    }
}

/* With only the states on NVMe (parameters on the device or the host) the
 * gradients are staged too: no whole-model mirror, the ring, kept within
 * the host budget and spilled beyond it. Against states on the host (the
 * pinned mirrors, no staging): bitwise in sync, overlap and dpu modes with
 * one micro-batch, and with one group per step (fp32 sums) in sync and
 * overlap modes, whether all are kept or all spilled. */
static void test_states_on_nvme_stage_gradients(void **state)
{
    (void)state;
    for (int ph = 0; ph < 2; ph++)
        for (int m = 0; m < 5; m++) {
            int grouped = m >= 3;
            zo_optim_mode mode = m == 2 ? ZO_OPTIM_DPU : m % 2 ? ZO_OPTIM_OVERLAP : ZO_OPTIM_SYNC;
            uint64_t G = (mode == ZO_OPTIM_DPU ? 2 : 1) * (grouped ? 2 : 1) * CHUNK;
            run_cfg c = base_cfg(ph ? ZO_TIER_HOST : ZO_TIER_DEVICE, ZO_TIER_HOST, mode);
            c.steps = 8;
            if (grouped) {
                c.accum = 4;
                c.group = 4;
            }
            run_out ref, all, none;
            run(&c, &ref);
            assert_int_equal(ref.fp.grad_host, 0);
            c.optim_home = ZO_TIER_NVME;
            run(&c, &all);
            assert_int_equal(all.fp.grad_pinned, (2 + 2) * (grouped ? 2 : 1) * CHUNK);
            assert_int_equal(all.fp.grad_host, (uint64_t)N_CHUNKS * G);
            assert_same_weights(&ref, &all, c.steps);
            c.host_bytes = all.fp.pinned + all.fp.host - all.fp.grad_host;
            run(&c, &none);
            assert_int_equal(none.fp.grad_host, 0);
            assert_true(none.fp.grad_nvme > 0);
            assert_same_weights(&ref, &none, c.steps);
            run_out_free(&ref);
            run_out_free(&all);
            run_out_free(&none);
        }
}

/* A fault on the spill of gradients staged because the states are on NVMe
 * (parameters resident on the device): the step fails cleanly and its
 * retry trains as the run without faults. */
static void test_states_on_nvme_spill_fault(void **state)
{
    (void)state;
    run_cfg c = base_cfg(ZO_TIER_DEVICE, ZO_TIER_NVME, ZO_OPTIM_SYNC);
    c.steps = 6;
    run_out ref;
    run(&c, &ref);
    c.host_bytes = spill_budget(&ref.fp, N_CHUNKS / 2, 1);
    harness h;
    harness_open(&h, &c);
    zo_swap_fault never = {ZO_SWAP_FAULT_EIO, UINT64_MAX, 0};
    ZO_ASSERT_OK(make_engine(&h, &never, 1));
    zo_swap_t store = zo_engine_nvme_grad_store(h.eng);
    assert_non_null(store);
    double losses[6];
    zo_step_stats st;
    uint64_t per_step = 0;
    for (int s = 0; s < c.steps; s++) {
        if (s == 3)
            fail_grad_step_at(&h, s, per_step);
        zo_swap_stats a = ZO_SWAP_STATS_INIT, b = ZO_SWAP_STATS_INIT;
        ZO_ASSERT_OK(zo_swap_get_stats(store, &a));
        ZO_ASSERT_OK(train_step(&h, s, &losses[s], &st));
        ZO_ASSERT_OK(zo_swap_get_stats(store, &b));
        per_step = b.requests - a.requests;
        assert_true(per_step > 0);
    }
    close_and_compare(&h, losses, &ref, c.steps);
}

/* Device-resident parameters with states on NVMe keep no pinned 16-bit
 * copy: the update writes the new values beside the states on NVMe, the
 * slot is reloaded from there at its next fetch. Bitwise as states on the
 * host in sync, overlap (with overflows, and with clipping) and dpu modes;
 * pinned memory is the staging only: the gradient ring and its read-back
 * room, the stages (states and the 16-bit values' room), the twins. */
static void test_resident_params_copy_on_nvme(void **state)
{
    (void)state;
    for (int m = 0; m < 4; m++) {
        zo_optim_mode mode = m == 3 ? ZO_OPTIM_DPU : m ? ZO_OPTIM_OVERLAP : ZO_OPTIM_SYNC;
        run_cfg c = base_cfg(ZO_TIER_DEVICE, ZO_TIER_HOST, mode);
        c.steps = 8;
        c.dtype = ZO_DTYPE_F16;
        c.poison_steps = (1u << 2) | (1u << 5);
        c.max_norm = m == 2 ? 0.05f : 0.0f;
        run_out ref, o;
        run(&c, &ref);
        c.optim_home = ZO_TIER_NVME;
        run(&c, &o);
        assert_same_weights(&ref, &o, c.steps);
        for (int s = 0; s < c.steps; s++)
            assert_true(ref.losses[s] == o.losses[s]);
        assert_int_equal(o.fp.param_staging, 4 * CHUNK); /* lookahead 2: 4 twins */
        assert_int_equal(o.fp.pinned,
                         o.fp.grad_pinned + o.fp.grad_stage + 3 * (6 * CHUNK + CHUNK) + 4 * CHUNK);
        assert_int_equal(o.fp.nvme, 2ull * N_CHUNKS * zo_engine_nvme_state_bytes(TM_D * TM_D) +
                                        2ull * N_CHUNKS * P16_EXTENT);
        run_out_free(&ref);
        run_out_free(&o);
    }
}

/* NVMe faults on that path: an EIO on the 16-bit store (a reload at a
 * fetch, a write of the update) or on the states' store fails the step with
 * the weights intact; a flipped byte in a committed 16-bit copy fails the
 * next step's reload, whose retry reloads from the master; every retry
 * trains as the run without faults, in sync and overlap modes. */
static void test_resident_params_nvme_faults(void **state)
{
    (void)state;
    for (int m = 0; m < 2; m++) {
        run_cfg c = base_cfg(ZO_TIER_DEVICE, ZO_TIER_NVME, m ? ZO_OPTIM_OVERLAP : ZO_OPTIM_SYNC);
        c.steps = 8;
        run_out ref;
        run(&c, &ref);
        corrupter k = {0};
        k.store = 1;
        c.trace = corrupt_on_write;
        c.trace_ctx = &k;
        harness h;
        harness_open(&h, &c);
        zo_swap_fault never = {ZO_SWAP_FAULT_EIO, UINT64_MAX, 0};
        ZO_ASSERT_OK(make_engine(&h, &never, 1));
        zo_swap_t store = zo_engine_nvme_param_store(h.eng);
        assert_non_null(store);
        corrupter_locate(&k, store);
        double losses[8];
        zo_step_stats st;
        uint64_t per_step = 0;
        for (int s = 0; s < c.steps; s++) {
            if (s == 2) /* the update's last write of a 16-bit copy (step 1 was clean) */
                fail_request(&h, store, s, per_step - 1);
            if (s == 3) /* a reload at the first fetch: the retry reloads from the master */
                fail_request(&h, store, s, 0);
            if (s == 4)
                fail_step_at(&h, zo_engine_nvme_store(h.eng), s);
            if (s == 5)
                atomic_store(&k.armed, 1); /* this step's update writes a copy, then it flips */
            if (s == 6) {
                assert_int_equal(atomic_load(&k.armed), 0);
                float *before[TM_T];
                read_masters(&h, before);
                ZO_ASSERT_ST(failing_step(&h, s, before), ZO_ERR_CORRUPT);
            }
            zo_swap_stats a = ZO_SWAP_STATS_INIT, b = ZO_SWAP_STATS_INIT;
            ZO_ASSERT_OK(zo_swap_get_stats(store, &a));
            ZO_ASSERT_OK(train_step(&h, s, &losses[s], &st));
            ZO_ASSERT_OK(zo_swap_get_stats(store, &b));
            per_step = b.requests - a.requests;
            assert_true(per_step > 0);
        }
        close_and_compare(&h, losses, &ref, c.steps);
    }
}

/* ---- the split master (master_split) ---- */

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
        run(&c, &ref);
        harness h;
        harness_open(&h, &c);
        zo_swap_fault never = {ZO_SWAP_FAULT_EIO, UINT64_MAX, 0};
        ZO_ASSERT_OK(make_engine(&h, &never, 1));
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

/* `states`: the optimizer state formats and the split master, a ctest of
 * their own (test_engine_states) so that each stays well within its time
 * limit on a loaded machine; no argument: the rest. */
int main(int argc, char **argv)
{
    const struct CMUnitTest states[] = {
        cmocka_unit_test_teardown(test_compact_states_everywhere, fp32_states_again),
        cmocka_unit_test(test_q8_small_tensors_keep_fp32_moments),
        cmocka_unit_test_teardown(test_q8_kept_tensor_keeps_fp32_moments, keep_none_again),
        cmocka_unit_test(test_master_split_bitwise),
        cmocka_unit_test(test_master_split_refuses_fp16),
        cmocka_unit_test(test_master_split_faults),
    };
    if (argc > 1 && strcmp(argv[1], "states") == 0)
        return cmocka_run_group_tests(states, NULL, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sync_matches_reference_everywhere),
        cmocka_unit_test(test_overlap_equals_sync),
        cmocka_unit_test(test_grad_accumulation),
        cmocka_unit_test(test_overlap_with_clipping_equals_sync),
        cmocka_unit_test(test_overlap_with_overflow_equals_sync),
        cmocka_unit_test(test_dpu_matches_stale_reference),
        cmocka_unit_test(test_learning_rate_per_step),
        cmocka_unit_test(test_impossible_plans_are_refused_up_front),
        cmocka_unit_test(test_nvme_fault_during_step),
        cmocka_unit_test(test_stream_task_fault_during_step),
        cmocka_unit_test(test_state_round_trip_resumes_bitwise),
        cmocka_unit_test(test_state_errors),
        cmocka_unit_test(test_prefetch_and_belady_eviction),
        cmocka_unit_test(test_step_statistics),
        cmocka_unit_test(test_nvme_request_knobs),
        cmocka_unit_test(test_stall_is_measured),
        cmocka_unit_test(test_trace_covers_every_track),
        cmocka_unit_test(test_layer_major_groups_equal_micro_batch_major),
        cmocka_unit_test(test_layer_major_other_homes),
        cmocka_unit_test(test_layer_major_footprint),
        cmocka_unit_test(test_layer_major_moves_fewer_parameter_bytes),
        cmocka_unit_test(test_layer_major_fault_mid_group),
        cmocka_unit_test(test_split_homes_equal_all_host_and_all_nvme),
        cmocka_unit_test(test_registered_by_fill_trains_bitwise),
        cmocka_unit_test(test_fill_runs_at_finalize),
        cmocka_unit_test(test_split_footprint),
        cmocka_unit_test(test_split_checkpoint_resumes_on_another),
        cmocka_unit_test(test_split_nvme_fault_during_step),
        cmocka_unit_test(test_split_caps_refused),
        cmocka_unit_test(test_host_budget),
        cmocka_unit_test(test_spilled_gradients_train_bitwise),
        cmocka_unit_test(test_spilled_group_sums_train_bitwise),
        cmocka_unit_test(test_spilled_gradient_faults),
        cmocka_unit_test(test_states_on_nvme_stage_gradients),
        cmocka_unit_test(test_states_on_nvme_spill_fault),
        cmocka_unit_test(test_resident_params_copy_on_nvme),
        cmocka_unit_test(test_resident_params_nvme_faults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
