/* The engine tests' harness: an engine over the cpu device built for a
 * run_cfg, the test model (test_model.h) trained through it micro-batch-
 * major or layer-major, and the checks and fault drills that several
 * test_engine_*.c programs share (engine_harness.h). */
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include "engine_harness.h"

zo_dtype g_state_dtype = ZO_DTYPE_F32;
int g_keep_f32 = -1;
unsigned char g_own_decay[TM_T];
float g_decay[TM_T];
unsigned char g_own_adam[TM_T];
tm_group g_group[TM_T];

run_cfg base_cfg(zo_tier ph, zo_tier oh, zo_optim_mode mode)
{
    run_cfg c = {ph,    oh,    mode,    0,    0, 1, 2,    0.0f, ZO_DTYPE_BF16,
                 0,     STEPS, INT_MAX, NULL, 0, 0, NULL, NULL, {{0}},
                 {{0}}, 0,     0,       0,    0, 0};
    return c;
}

void run_out_free(run_out *o)
{
    for (int k = 0; k < TM_T; k++)
        free(o->master[k]);
}

/* ---- driving the engine ---- */

zo_status fill_from(void *ctx, int id, float *dst)
{
    fill_src *f = ctx;
    f->calls[id]++;
    if (id == f->fail_id)
        return ZO_FAIL(ZO_ERR_IO, "test", "reading tensor %d's initial values", id);
    memcpy(dst, f->init[id], tm_numel(id) * sizeof(float));
    return ZO_OK;
}

zo_adam_params test_adam(void)
{
    zo_adam_params p = ZO_ADAM_PARAMS_INIT;
    p.lr = 1e-2f;
    p.weight_decay = 0.01f;
    p.simd_level = -1;
    return p;
}

zo_status build_engine(harness *h, const zo_swap_fault *faults, size_t nfaults, int finalize)
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
    c.update_behind = h->rc.update_behind;
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
    for (int k = 0; k < TM_T; k++)
        if (g_own_decay[k])
            ZO_TRY(zo_engine_set_weight_decay(h->eng, h->ids[k], g_decay[k]));
    for (int k = 0; k < TM_T; k++)
        if (g_own_adam[k])
            ZO_TRY(zo_engine_set_tensor_adam(h->eng, h->ids[k], g_group[k].lr_scale,
                                             g_group[k].beta1, g_group[k].beta2, g_group[k].eps));
    return finalize ? zo_engine_finalize(h->eng) : ZO_OK;
}

zo_status make_engine(harness *h, const zo_swap_fault *faults, size_t nfaults)
{
    return build_engine(h, faults, nfaults, 1);
}

void harness_open(harness *h, const run_cfg *rc)
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

void harness_close(harness *h)
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

zo_status enqueue(harness *h, zo_stream_fn fn, const void *arg, size_t n)
{
    return zo_stream_enqueue(h->compute, fn, arg, n);
}

zo_status forward_layer(harness *h, int l)
{
    void *p[2];
    ZO_TRY(zo_engine_fetch(h->eng, l, ZO_PHASE_FORWARD, h->compute, p, NULL, 2));
    tm_fwd_arg f = {p[0], p[1], h->rc.dtype, h->a->act[l], h->a->act[l + 1]};
    ZO_TRY(enqueue(h, tm_forward, &f, sizeof f));
    return zo_engine_release(h->eng, l, h->compute);
}

zo_status backward_layer(harness *h, int l, int poison, int recompute)
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
zo_status train_step(harness *h, int step, double *loss, zo_step_stats *stats)
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

void read_masters(harness *h, float *out[TM_T])
{
    for (int k = 0; k < TM_T; k++) {
        out[k] = malloc(tm_numel(k) * sizeof(float));
        ZO_ASSERT_OK(zo_engine_read_master(h->eng, h->ids[k], out[k]));
    }
}

static void check_budgets(harness *h, const zo_step_stats *s, const zo_engine_footprint *fp)
{
    uint64_t dev_budget = h->rc.device_bytes ? h->rc.device_bytes : (64u << 20);
    assert_true(s->peak[ZO_TIER_DEVICE] <= dev_budget);
    assert_int_equal(s->peak[ZO_TIER_DEVICE], fp->bytes[ZO_TIER_DEVICE]);
    zo_device_mem_stats ms;
    ZO_ASSERT_OK(zo_device_mem_get_stats(h->dev, &ms));
    assert_true(ms.high_water <= dev_budget); /* the test keeps its activations on the host */
    uint64_t pinned_budget = h->rc.pinned_bytes ? h->rc.pinned_bytes : fp->pinned;
    assert_true(s->peak_pinned <= pinned_budget);
    assert_int_equal(s->peak_pinned, fp->pinned);
    assert_int_equal(s->peak[ZO_TIER_HOST], fp->bytes[ZO_TIER_HOST]);
    assert_int_equal(s->peak[ZO_TIER_NVME], fp->bytes[ZO_TIER_NVME]);
    if (h->rc.host_bytes)
        assert_true(s->peak_pinned + s->peak[ZO_TIER_HOST] <= h->rc.host_bytes);
}

void run(const run_cfg *rc, run_out *o)
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

void assert_same_weights(const run_out *a, const run_out *b, int steps)
{
    for (int s = 0; s < steps; s++)
        if (memcmp(&a->losses[s], &b->losses[s], sizeof(double)) != 0)
            fail_msg("loss of step %d differs: %.17g vs %.17g", s, a->losses[s], b->losses[s]);
    for (int k = 0; k < TM_T; k++)
        if (memcmp(a->master[k], b->master[k], tm_numel(k) * sizeof(float)) != 0)
            fail_msg("master weights of tensor %d differ", k);
}

void assert_matches_reference(const run_out *o, const tm_ref *r, int steps)
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
uint64_t min_device_bytes(void)
{
    /* with 8-bit states a W kept in fp32 takes 4 x its elements: the chunk grows to them */
    int kept = g_keep_f32 >= 0 && g_state_dtype == ZO_DTYPE_I8;
    return 2ull * 2 * CHUNK * (kept ? 4 : 1);
}

/* ---- checks and fault drills ---- */

void expect_refusal(const run_cfg *rc, zo_status want, const char *tier)
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

/* Run step s, which is expected to fail; the weights must stay `before`
 * (read before the fault was armed; freed here). */
zo_status failing_step(harness *h, int s, float *before[TM_T])
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

void train_steps(harness *h, int from, int to, double *losses)
{
    zo_step_stats st;
    for (int s = from; s < to; s++)
        ZO_ASSERT_OK(train_step(h, s, &losses[s], &st));
}

void open_for_faults(harness *h, const run_cfg *c, run_out *ref)
{
    run(c, ref);
    harness_open(h, c);
    zo_swap_fault never = {ZO_SWAP_FAULT_EIO, UINT64_MAX, 0};
    ZO_ASSERT_OK(make_engine(h, &never, 1));
}

/* The run in h, after its faults, must equal the run without them. */
void close_and_compare(harness *h, const double *losses, run_out *ref, int steps)
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
void fail_step_at(harness *h, zo_swap_t store, int s)
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

void save_state(harness *h, saved_state *out)
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

void saved_state_free(saved_state *s)
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

void train_range(harness *h, int s0, int s1, double *losses)
{
    zo_step_stats st;
    for (int s = s0; s < s1; s++)
        ZO_ASSERT_OK(train_step(h, s, &losses[s], &st));
}

/* Steps half..2*half-1 of a fresh engine given the state saved at step half
 * (what: as restore_state); 1 when losses and final weights equal ref's. */
int resumed_equals(const run_cfg *c, const saved_state *s, unsigned what, int half,
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

void corrupt_on_write(void *ctx, const zo_trace_event *ev)
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

void corrupter_locate(corrupter *k, zo_swap_t s)
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
void fail_request(harness *h, zo_swap_t store, int s, uint64_t op)
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
