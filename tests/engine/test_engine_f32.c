/* The engine holding fp32 parameters and gradients in its slots
 * (param_dtype ZO_DTYPE_F32) on the cpu device: a 4-layer tanh model in fp32
 * trained through the engine equals a plain-C fp32 AdamW trainer written
 * here bit for bit (losses and weights; the parameters the device computes
 * with are the master weights themselves), with gradient accumulation and
 * clipping, under every parameter home (device, host, NVMe), optimizer
 * home (host, NVMe), the sync and overlap modes, layer-major micro-batch
 * groups and spilled gradients; dpu runs agree with each other. Each step's
 * measured peaks equal the plan's footprint, and what fp32 cannot do
 * (master_split) is refused by name. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_model.h"
#include "zo/device.h"
#include "zo/engine.h"
#include "zo/optim.h"
#include "zo_internal.h"
#include "zo_test.h"

#define NL      TM_L        /* layers */
#define D       TM_D        /* width */
#define B       TM_B        /* rows per micro-batch */
#define NT      TM_T        /* tensors: W, b per layer */
#define STEPS   6           /* optimizer steps per run */
#define CHUNK   (32u << 10) /* a layer (4160 fp32 elements) per chunk */
#define MAXG    4           /* micro-batches per layer-major group, at most */
#define B_OFF   4096        /* b's offset in its chunk: after W, 128-aligned */
#define CHUNK_N (B_OFF + D) /* elements in use per chunk */
#define LR      1e-2f
#define WD      0.01f

/* ---- the model in fp32 (test_model.h's, its inputs and initial values), as
 * stream tasks (the cpu device's memory is the host's) ---- */

typedef struct fwd_arg {
    const float *W, *b, *in;
    float *out;
} fwd_arg;

static zo_status forward_fn(void *p)
{
    fwd_arg *x = p;
    for (int n = 0; n < B; n++)
        for (int i = 0; i < D; i++) {
            float z = x->b[i];
            for (int j = 0; j < D; j++)
                z += x->W[i * D + j] * x->in[n * D + j];
            x->out[n * D + i] = tanhf(z);
        }
    return ZO_OK;
}

/* The squared error of the last layer's output; adds it to *total (the
 * step's loss, summed in micro-batch order). */
typedef struct loss_arg {
    tm_acts *a;
    double *total;
} loss_arg;

static zo_status loss_fn(void *p)
{
    loss_arg *x = p;
    double loss = 0.0;
    for (int i = 0; i < B * D; i++) {
        float r = x->a->act[NL][i] - x->a->target[i];
        loss += 0.5 * (double)r * r / B;
        x->a->gact[NL][i] = r / B;
    }
    *x->total += loss;
    return ZO_OK;
}

/* Adds the micro-batch's gradients onto gW and gb (which the engine zeroed). */
typedef struct bwd_arg {
    const float *W;
    float *gW, *gb;
    const float *in, *out, *gout;
    float *gin;
} bwd_arg;

static zo_status backward_fn(void *p)
{
    bwd_arg *x = p;
    float dz[B * D];
    for (int k = 0; k < B * D; k++)
        dz[k] = x->gout[k] * (1.0f - x->out[k] * x->out[k]);
    for (int i = 0; i < D; i++) {
        float gb = 0.0f;
        for (int n = 0; n < B; n++)
            gb += dz[n * D + i];
        x->gb[i] += gb;
        for (int j = 0; j < D; j++) {
            float g = 0.0f;
            for (int n = 0; n < B; n++)
                g += dz[n * D + i] * x->in[n * D + j];
            x->gW[i * D + j] += g;
        }
    }
    for (int n = 0; n < B; n++)
        for (int j = 0; j < D; j++) {
            float g = 0.0f;
            for (int i = 0; i < D; i++)
                g += x->W[i * D + j] * dz[n * D + i];
            x->gin[n * D + j] = g;
        }
    return ZO_OK;
}

/* ---- the plain-C fp32 AdamW reference ---- */

typedef struct ref {
    float *w[NT], *m[NT], *v[NT], *g[NT], *acc[NT];
    float chunk[CHUNK_N]; /* a layer's gradients as its chunk holds them, for the norm */
    tm_acts a;
    double losses[STEPS];
    int clipped;
} ref;

/* The update of one element, the operations of zo/optim.h's fused kernel in
 * its order (fp32 fused multiply-adds; the constants as it derives them). */
static void adamw_elem(int64_t t, float factor, float g0, float *w, float *m, float *v)
{
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    double bc1 = 1.0 - pow(b1, (double)t), bc2 = 1.0 - pow(b2, (double)t);
    float step_size = (float)(LR / bc1), inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    float decay = 1.0f - LR * WD;
    float g = g0 * factor;
    g = fmaf(0.0f, *w, g); /* AdamW: no L2 term, added as the kernel does */
    *m = fmaf(b1, *m, (1.0f - b1) * g);
    *v = fmaf(b2, *v, ((1.0f - b2) * g) * g);
    float denom = fmaf(sqrtf(*v), inv_sqrt_bc2, eps);
    *w = fmaf(-step_size, *m / denom, *w * decay);
}

/* DeepSpeed's clip coefficient (loss scale 1), in double as the engine forms it. */
static float clip_factor(double sum_sq, float max_norm, int *clipped)
{
    double combined = 1.0;
    if (max_norm > 0.0f) {
        double clip = (sqrt(sum_sq) + 1e-6) / max_norm;
        if (clip > 1.0) {
            combined = clip;
            (*clipped)++;
        }
    }
    return (float)(1.0 / combined);
}

static void ref_init(ref *r)
{
    memset(r, 0, sizeof *r);
    for (int k = 0; k < NT; k++) {
        r->w[k] = calloc(tm_numel(k), sizeof(float));
        r->m[k] = calloc(tm_numel(k), sizeof(float));
        r->v[k] = calloc(tm_numel(k), sizeof(float));
        r->g[k] = calloc(tm_numel(k), sizeof(float));
        r->acc[k] = calloc(tm_numel(k), sizeof(float));
        assert_true(r->w[k] && r->m[k] && r->v[k] && r->g[k] && r->acc[k]);
    }
    tm_init_params(r->w);
}

static void ref_free(ref *r)
{
    for (int k = 0; k < NT; k++) {
        free(r->w[k]);
        free(r->m[k]);
        free(r->v[k]);
        free(r->g[k]);
        free(r->acc[k]);
    }
}

static void ref_micro(ref *r, int step, int micro, double *loss)
{
    tm_input_arg in = {&r->a, step, micro};
    tm_input(&in);
    for (int l = 0; l < NL; l++) {
        fwd_arg f = {r->w[2 * l], r->w[2 * l + 1], r->a.act[l], r->a.act[l + 1]};
        forward_fn(&f);
    }
    loss_arg la = {&r->a, loss};
    loss_fn(&la);
    for (int l = NL - 1; l >= 0; l--) {
        memset(r->g[2 * l], 0, tm_numel(2 * l) * sizeof(float));
        memset(r->g[2 * l + 1], 0, tm_numel(2 * l + 1) * sizeof(float));
        bwd_arg b = {r->w[2 * l],     r->g[2 * l],      r->g[2 * l + 1], r->a.act[l],
                     r->a.act[l + 1], r->a.gact[l + 1], r->a.gact[l]};
        backward_fn(&b);
    }
}

/* The sum of squares of the step's gradients, chunk by chunk in chunk order,
 * as the optimizer pool sums a chunk (fixed blocks, in order). */
static double ref_sum_sq(ref *r, float *const grads[NT], zo_optim_pool_t pool)
{
    double s = 0.0;
    for (int l = 0; l < NL; l++) {
        memset(r->chunk, 0, sizeof r->chunk);
        memcpy(r->chunk, grads[2 * l], tm_numel(2 * l) * sizeof(float));
        memcpy(r->chunk + B_OFF, grads[2 * l + 1], tm_numel(2 * l + 1) * sizeof(float));
        zo_grad_stats st;
        ZO_ASSERT_OK(zo_optim_pool_grad_stats(pool, r->chunk, ZO_DTYPE_F32, CHUNK_N, &st));
        s += st.sum_sq;
    }
    return s;
}

/* STEPS steps of `accum` micro-batches each, the gradients summed in fp32
 * in micro-batch order ((g0 + g1) + g2 ...), clipped to max_norm. */
static void ref_train(ref *r, int accum, float max_norm)
{
    zo_optim_pool_config pc = ZO_OPTIM_POOL_CONFIG_INIT;
    zo_optim_pool_t pool;
    ZO_ASSERT_OK(zo_optim_pool_init(&pool, &pc));
    for (int s = 0; s < STEPS; s++) {
        r->losses[s] = 0.0;
        for (int j = 0; j < accum; j++) {
            ref_micro(r, s, j, &r->losses[s]);
            for (int k = 0; k < NT; k++)
                for (size_t i = 0; i < tm_numel(k); i++)
                    r->acc[k][i] = j == 0 ? r->g[k][i] : r->acc[k][i] + r->g[k][i];
        }
        float factor = clip_factor(ref_sum_sq(r, r->acc, pool), max_norm, &r->clipped);
        for (int k = 0; k < NT; k++)
            for (size_t i = 0; i < tm_numel(k); i++)
                adamw_elem(s + 1, factor, r->acc[k][i], &r->w[k][i], &r->m[k][i], &r->v[k][i]);
    }
    zo_optim_pool_free(pool);
}

/* ---- driving the engine ---- */

typedef struct rcfg {
    zo_tier ph, oh;
    zo_optim_mode mode;
    int accum, group;
    float max_norm;
    uint64_t device_bytes, host_bytes;
} rcfg;

typedef struct harness {
    zo_device_t dev;
    zo_stream_t compute;
    zo_engine_t eng;
    tm_acts *a[MAXG];
    rcfg rc;
    char dir[64];
    int ids[NT];
    float *init[NT];
    double loss;
} harness;

typedef struct run_out {
    float *master[NT];
    double losses[STEPS];
    int clipped;
} run_out;

static zo_engine_config engine_config(const harness *h, const char *const *paths)
{
    zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
    c.device = h->dev;
    c.param_dtype = ZO_DTYPE_F32;
    c.chunk_bytes = CHUNK;
    c.param_home = h->rc.ph;
    c.optim_home = h->rc.oh;
    c.device_bytes = h->rc.device_bytes;
    c.host_bytes = h->rc.host_bytes;
    c.nvme_paths = paths;
    c.n_nvme_paths = 1;
    c.mode = h->rc.mode;
    c.grad_accum_steps = h->rc.accum;
    c.micro_group = h->rc.group;
    c.optim_threads = 2;
    c.adam.lr = LR;
    c.adam.weight_decay = WD;
    c.max_grad_norm = h->rc.max_norm;
    return c;
}

static void harness_open(harness *h, const rcfg *rc)
{
    memset(h, 0, sizeof *h);
    h->rc = *rc;
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    dc.mem_budget = 64u << 20;
    ZO_ASSERT_OK(zo_device_init(&h->dev, &dc));
    ZO_ASSERT_OK(zo_stream_create(h->dev, &h->compute));
    for (int j = 0; j < MAXG; j++)
        assert_non_null(h->a[j] = calloc(1, sizeof *h->a[j]));
    snprintf(h->dir, sizeof h->dir, "/tmp/zo-engine-f32-XXXXXX");
    assert_non_null(mkdtemp(h->dir));
    const char *paths[1] = {h->dir};
    zo_engine_config c = engine_config(h, paths);
    ZO_ASSERT_OK(zo_engine_init(&h->eng, &c));
    for (int k = 0; k < NT; k++)
        assert_non_null(h->init[k] = malloc(tm_numel(k) * sizeof(float)));
    tm_init_params(h->init);
    for (int k = 0; k < NT; k++)
        ZO_ASSERT_OK(zo_engine_register(h->eng, k / 2, k % 2 ? "b" : "W", tm_numel(k), h->init[k],
                                        &h->ids[k]));
    ZO_ASSERT_OK(zo_engine_finalize(h->eng));
}

static void harness_close(harness *h)
{
    zo_engine_free(h->eng);
    zo_stream_destroy(h->compute);
    zo_device_free(h->dev);
    rmdir(h->dir);
    for (int j = 0; j < MAXG; j++)
        free(h->a[j]);
    for (int k = 0; k < NT; k++)
        free(h->init[k]);
}

static zo_status enqueue(harness *h, zo_stream_fn fn, const void *arg, size_t n)
{
    return zo_stream_enqueue(h->compute, fn, arg, n);
}

/* Layer l's forward for micro-batches 0..n-1 of the group (n = 1: one). */
static zo_status forward_layer(harness *h, int l, int n)
{
    void *p[2];
    ZO_TRY(zo_engine_fetch(h->eng, l, ZO_PHASE_FORWARD, h->compute, p, NULL, 2));
    for (int j = 0; j < n; j++) {
        fwd_arg f = {p[0], p[1], h->a[j]->act[l], h->a[j]->act[l + 1]};
        ZO_TRY(enqueue(h, forward_fn, &f, sizeof f));
    }
    return zo_engine_release(h->eng, l, h->compute);
}

/* One backward fetch; each micro-batch's gradients handed over in turn. */
static zo_status backward_layer(harness *h, int l, int n)
{
    void *p[2], *g[2];
    ZO_TRY(zo_engine_fetch(h->eng, l, ZO_PHASE_BACKWARD, h->compute, p, g, 2));
    for (int j = 0; j < n; j++) {
        tm_acts *a = h->a[j];
        bwd_arg b = {p[0], g[0], g[1], a->act[l], a->act[l + 1], a->gact[l + 1], a->gact[l]};
        ZO_TRY(enqueue(h, backward_fn, &b, sizeof b));
        ZO_TRY(zo_engine_grads_ready(h->eng, l, h->compute));
    }
    return zo_engine_release(h->eng, l, h->compute);
}

/* Micro-batches first..first+n-1, layer by layer (n = 1: micro-batch-major). */
static zo_status group(harness *h, int step, int first, int n)
{
    for (int j = 0; j < n; j++) {
        tm_input_arg in = {h->a[j], step, first + j};
        ZO_TRY(enqueue(h, tm_input, &in, sizeof in));
    }
    for (int l = 0; l < NL; l++)
        ZO_TRY(forward_layer(h, l, n));
    for (int j = 0; j < n; j++) {
        loss_arg la = {h->a[j], &h->loss};
        ZO_TRY(enqueue(h, loss_fn, &la, sizeof la));
    }
    for (int l = NL - 1; l >= 0; l--)
        ZO_TRY(backward_layer(h, l, n));
    return ZO_OK;
}

static void train_step(harness *h, int step, zo_step_stats *stats)
{
    int G = h->rc.group > 1 ? h->rc.group : 1;
    h->loss = 0.0;
    for (int first = 0; first < h->rc.accum; first += G)
        ZO_ASSERT_OK(group(h, step, first, h->rc.accum - first < G ? h->rc.accum - first : G));
    *stats = (zo_step_stats)ZO_STEP_STATS_INIT;
    ZO_ASSERT_OK(zo_engine_end_step(h->eng, stats));
    ZO_ASSERT_OK(zo_stream_synchronize(h->compute));
}

/* The measured high-water marks are the plan's, exactly. */
static void check_peaks(const zo_step_stats *s, const zo_engine_footprint *fp)
{
    assert_int_equal(s->peak[ZO_TIER_DEVICE], fp->bytes[ZO_TIER_DEVICE]);
    assert_int_equal(s->peak_pinned, fp->pinned);
    assert_int_equal(s->peak[ZO_TIER_HOST], fp->bytes[ZO_TIER_HOST]);
    assert_int_equal(s->peak[ZO_TIER_NVME], fp->bytes[ZO_TIER_NVME]);
}

/* The parameters every layer's fetch hands the device are the master
 * weights, bit for bit (the step it opens is then given up). */
static void check_params_are_master(harness *h)
{
    for (int l = 0; l < NL; l++) {
        void *p[2];
        ZO_ASSERT_OK(zo_engine_fetch(h->eng, l, ZO_PHASE_FORWARD, h->compute, p, NULL, 2));
        ZO_ASSERT_OK(zo_stream_synchronize(h->compute));
        for (int t = 0; t < 2; t++) {
            int k = 2 * l + t;
            float *want = malloc(tm_numel(k) * sizeof(float));
            assert_non_null(want);
            ZO_ASSERT_OK(zo_engine_read_master(h->eng, h->ids[k], want));
            if (memcmp(p[t], want, tm_numel(k) * sizeof(float)) != 0)
                fail_msg("layer %d tensor %d: the device's fp32 parameters are not the master", l,
                         t);
            free(want);
        }
        ZO_ASSERT_OK(zo_engine_release(h->eng, l, h->compute));
    }
    ZO_ASSERT_OK(zo_stream_synchronize(h->compute));
    ZO_ASSERT_OK(zo_engine_abandon_step(h->eng));
}

static void run(const rcfg *rc, run_out *o)
{
    harness h;
    harness_open(&h, rc);
    memset(o, 0, sizeof *o);
    zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
    ZO_ASSERT_OK(zo_engine_footprint_get(h.eng, &fp));
    assert_int_equal(fp.chunk_bytes, CHUNK);
    assert_int_equal(fp.n_chunks, NL);
    for (int s = 0; s < STEPS; s++) {
        zo_step_stats st;
        train_step(&h, s, &st);
        o->losses[s] = h.loss;
        o->clipped += st.clipped;
        check_peaks(&st, &fp);
    }
    if (rc->mode != ZO_OPTIM_DPU)
        check_params_are_master(&h);
    ZO_ASSERT_OK(zo_engine_flush(h.eng));
    for (int k = 0; k < NT; k++) {
        assert_non_null(o->master[k] = malloc(tm_numel(k) * sizeof(float)));
        ZO_ASSERT_OK(zo_engine_read_master(h.eng, h.ids[k], o->master[k]));
    }
    harness_close(&h);
}

static void run_free(run_out *o)
{
    for (int k = 0; k < NT; k++)
        free(o->master[k]);
}

static void assert_equal_runs(const run_out *o, const double *losses, float *const w[NT],
                              const char *what)
{
    for (int s = 0; s < STEPS; s++)
        if (memcmp(&o->losses[s], &losses[s], sizeof(double)) != 0)
            fail_msg("%s: loss of step %d is %.17g, expected %.17g", what, s, o->losses[s],
                     losses[s]);
    for (int k = 0; k < NT; k++)
        for (size_t i = 0; i < tm_numel(k); i++)
            if (memcmp(&o->master[k][i], &w[k][i], sizeof(float)) != 0)
                fail_msg("%s: tensor %d element %zu is %.9g, expected %.9g", what, k, i,
                         o->master[k][i], w[k][i]);
}

static const char *run_name(const rcfg *c, char *buf, size_t cap)
{
    snprintf(buf, cap,
             "params %s, optim %s, %s, accum %d, group %d, clip %g, device %llu, host %llu",
             zo_tier_name(c->ph), zo_tier_name(c->oh),
             c->mode == ZO_OPTIM_SYNC      ? "sync"
             : c->mode == ZO_OPTIM_OVERLAP ? "overlap"
                                           : "dpu",
             c->accum, c->group, (double)c->max_norm, (unsigned long long)c->device_bytes,
             (unsigned long long)c->host_bytes);
    return buf;
}

/* The homes an fp32 run can take: parameters on the device, the host or
 * NVMe; optimizer states on the host or NVMe (NVMe parameters need them there). */
static const zo_tier homes[][2] = {{ZO_TIER_DEVICE, ZO_TIER_HOST},
                                   {ZO_TIER_HOST, ZO_TIER_HOST},
                                   {ZO_TIER_DEVICE, ZO_TIER_NVME},
                                   {ZO_TIER_HOST, ZO_TIER_NVME},
                                   {ZO_TIER_NVME, ZO_TIER_NVME}};
#define N_HOMES ((int)(sizeof homes / sizeof homes[0]))

/* ---- tests ---- */

/* Accumulation of 3 micro-batches and clipping on every step: each home
 * and mode, and the smallest device budget, equal the plain-C trainer. */
static void test_every_home_and_mode_equals_reference(void **state)
{
    (void)state;
    ref r;
    ref_init(&r);
    ref_train(&r, 3, 0.05f);
    assert_int_equal(r.clipped, STEPS); /* the clip really applies */
    for (int h = 0; h < N_HOMES; h++)
        for (int mode = ZO_OPTIM_SYNC; mode <= ZO_OPTIM_OVERLAP; mode++) {
            rcfg c = {homes[h][0], homes[h][1], (zo_optim_mode)mode, 3, 0, 0.05f, 0, 0};
            run_out o;
            char name[160];
            run(&c, &o);
            assert_int_equal(o.clipped, STEPS);
            assert_equal_runs(&o, r.losses, r.w, run_name(&c, name, sizeof name));
            run_free(&o);
        }
    /* two of the four layers' slots: loads and evictions every step */
    rcfg small = {ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_SYNC, 3, 0, 0.05f, 4 * CHUNK, 0};
    run_out o;
    char name[160];
    run(&small, &o);
    assert_equal_runs(&o, r.losses, r.w, run_name(&small, name, sizeof name));
    run_free(&o);
    ref_free(&r);
}

/* One micro-batch a step, no clipping: the gradients go to the update as
 * they come down (fp32 mirrors, or the ring and kept copies with NVMe). */
static void test_single_micro_batch_equals_reference(void **state)
{
    (void)state;
    ref r;
    ref_init(&r);
    ref_train(&r, 1, 0.0f);
    for (int h = 0; h < N_HOMES; h++) {
        rcfg c = {homes[h][0], homes[h][1], ZO_OPTIM_OVERLAP, 1, 0, 0.0f, 0, 0};
        run_out o;
        char name[160];
        run(&c, &o);
        assert_equal_runs(&o, r.losses, r.w, run_name(&c, name, sizeof name));
        run_free(&o);
    }
    ref_free(&r);
}

/* Gradients of NVMe-homed chunks spilled to NVMe (a host budget that keeps
 * only some) and layer-major groups (the device's fp32 sums) change nothing. */
static void test_spill_and_groups_equal_reference(void **state)
{
    (void)state;
    ref r1, r3;
    ref_init(&r1);
    ref_train(&r1, 1, 0.05f);
    ref_init(&r3);
    ref_train(&r3, 3, 0.05f);

    /* the host budget: the plan's pinned + host less two chunks' kept gradients */
    rcfg spill = {ZO_TIER_NVME, ZO_TIER_NVME, ZO_OPTIM_SYNC, 1, 0, 0.05f, 0, 0};
    harness h;
    harness_open(&h, &spill);
    zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
    ZO_ASSERT_OK(zo_engine_footprint_get(h.eng, &fp));
    harness_close(&h);
    assert_true(fp.grad_host == (uint64_t)NL * CHUNK); /* every chunk's fp32 gradients kept */
    spill.host_bytes = fp.pinned + fp.bytes[ZO_TIER_HOST] - 2 * CHUNK;
    run_out o;
    char name[160];
    run(&spill, &o);
    assert_equal_runs(&o, r1.losses, r1.w, run_name(&spill, name, sizeof name));
    run_free(&o);
    harness_open(&h, &spill);
    ZO_ASSERT_OK(zo_engine_footprint_get(h.eng, &fp));
    harness_close(&h);
    /* two chunks spilled, each an extent of the fullest chunk's fp32 gradients */
    assert_int_equal(fp.grad_nvme, 2ull * ((CHUNK_N * sizeof(float) + 4095) / 4096 * 4096));

    /* groups of 2 (then 1) of the 3 micro-batches, and one group of all */
    for (int g = 2; g <= 3; g++)
        for (int hm = 1; hm < N_HOMES; hm += 3) {
            rcfg c = {homes[hm][0], homes[hm][1], ZO_OPTIM_SYNC, 3, g, 0.05f, 0, 0};
            run(&c, &o);
            assert_equal_runs(&o, r3.losses, r3.w, run_name(&c, name, sizeof name));
            run_free(&o);
        }
    ref_free(&r1);
    ref_free(&r3);
}

/* The delayed update: every home gives the same weights, and they are not
 * the sync run's (the parameters really are one step stale). */
static void test_dpu_homes_agree(void **state)
{
    (void)state;
    run_out first, o, sync;
    char name[160];
    rcfg c0 = {homes[0][0], homes[0][1], ZO_OPTIM_DPU, 2, 0, 0.05f, 0, 0};
    run(&c0, &first);
    for (int h = 1; h < N_HOMES; h++) {
        rcfg c = {homes[h][0], homes[h][1], ZO_OPTIM_DPU, 2, 0, 0.05f, 0, 0};
        run(&c, &o);
        assert_equal_runs(&o, first.losses, first.master, run_name(&c, name, sizeof name));
        run_free(&o);
    }
    rcfg cs = c0;
    cs.mode = ZO_OPTIM_SYNC;
    run(&cs, &sync);
    assert_true(memcmp(&sync.losses[0], &first.losses[0], sizeof(double)) == 0);
    assert_true(memcmp(&sync.losses[STEPS - 1], &first.losses[STEPS - 1], sizeof(double)) != 0);
    run_free(&sync);
    run_free(&first);
}

/* fp32 chunks hold chunk_bytes of fp32 parameters: the plan without an
 * engine packs and counts them as the engine does, and a 16-bit plan of the
 * same model holds twice as many elements per chunk. */
static void test_plan_counts_fp32_elements(void **state)
{
    (void)state;
    size_t n[NT];
    int layer[NT];
    for (int k = 0; k < NT; k++) {
        n[k] = tm_numel(k);
        layer[k] = k / 2;
    }
    zo_engine_layout ly = ZO_ENGINE_LAYOUT_INIT;
    ly.n_tensors = NT;
    ly.numel = n;
    ly.layer = layer;
    for (int h = 0; h < N_HOMES; h++) {
        rcfg c = {homes[h][0], homes[h][1], ZO_OPTIM_OVERLAP, 3, 0, 0.0f, 0, 0};
        harness hs;
        harness_open(&hs, &c);
        const char *paths[1] = {hs.dir};
        zo_engine_config cfg = engine_config(&hs, paths);
        zo_engine_footprint a = ZO_ENGINE_FOOTPRINT_INIT, b = ZO_ENGINE_FOOTPRINT_INIT;
        int fa = 0, fb = 0;
        ZO_ASSERT_OK(zo_engine_plan(hs.eng, &a, &fa, NULL, 0));
        cfg.device_bytes = 64u << 20; /* the device's budget, as the engine took it */
        ZO_ASSERT_OK(zo_engine_footprint_for(&cfg, &ly, &b, &fb, NULL, 0));
        harness_close(&hs);
        assert_true(fa && fb);
        const uint64_t fa6[] = {a.bytes[ZO_TIER_DEVICE], a.pinned,      a.bytes[ZO_TIER_HOST],
                                a.bytes[ZO_TIER_NVME],   a.chunk_bytes, a.n_chunks,
                                a.device_param_slots,    a.grad_pinned, a.grad_host,
                                a.param_staging};
        const uint64_t fb6[] = {b.bytes[ZO_TIER_DEVICE], b.pinned,      b.bytes[ZO_TIER_HOST],
                                b.bytes[ZO_TIER_NVME],   b.chunk_bytes, b.n_chunks,
                                b.device_param_slots,    b.grad_pinned, b.grad_host,
                                b.param_staging};
        assert_memory_equal(fa6, fb6, sizeof fa6);
        zo_engine_chunk_info info[NT];
        uint32_t nc = 0;
        ZO_ASSERT_OK(zo_engine_chunks_for(&cfg, &ly, info, NT, &nc));
        assert_int_equal(nc, NL);
        for (uint32_t i = 0; i < nc; i++)
            assert_int_equal(info[i].used_bytes, CHUNK_N * sizeof(float));
        cfg.param_dtype = ZO_DTYPE_BF16;
        ZO_ASSERT_OK(zo_engine_chunks_for(&cfg, &ly, info, NT, &nc));
        assert_int_equal(nc, NL); /* a chunk never spans two layers */
        assert_int_equal(info[0].used_bytes, CHUNK_N * 2);
    }
}

static void expect_refused(zo_engine_config c, zo_status want, const char *a, const char *b)
{
    zo_engine_t e = NULL;
    ZO_ASSERT_ST(zo_engine_init(&e, &c), want);
    assert_null(e);
    if (!strstr(zo_last_error(), a) || !strstr(zo_last_error(), b))
        fail_msg("the refusal does not name '%s' and '%s': %s", a, b, zo_last_error());
}

static void test_bad_combinations_refused(void **state)
{
    (void)state;
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    dc.mem_budget = 16u << 20;
    zo_device_t dev;
    ZO_ASSERT_OK(zo_device_init(&dev, &dc));
    zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
    c.device = dev;
    c.param_dtype = ZO_DTYPE_F32;
    c.master_split = 1; /* the master's low halves: fp32 parameters are the master */
    expect_refused(c, ZO_ERR_UNSUPPORTED, "master_split", "fp32");
    c.master_split = 0;
    c.param_dtype = ZO_DTYPE_I8;
    expect_refused(c, ZO_ERR_INVALID_ARG, "param_dtype", "ZO_DTYPE_F32");
    c.param_dtype = ZO_DTYPE_F32; /* and a good one is taken */
    zo_engine_t e = NULL;
    ZO_ASSERT_OK(zo_engine_init(&e, &c));
    zo_engine_free(e);
    zo_device_free(dev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_home_and_mode_equals_reference),
        cmocka_unit_test(test_single_micro_batch_equals_reference),
        cmocka_unit_test(test_spill_and_groups_equal_reference),
        cmocka_unit_test(test_dpu_homes_agree),
        cmocka_unit_test(test_plan_counts_fp32_elements),
        cmocka_unit_test(test_bad_combinations_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
