/* ZeRO stages 1, 2 and 3 on the cpu device, run by ctest under mpirun with 1, 2
 * and 4 ranks (label mpi): N ranks, each training micro-batch r of every step
 * with no accumulation, equal bitwise one rank with grad_accum_steps N over
 * the same micro-batches (global losses, each owner's master weights), with
 * the optimizer states on the host, on NVMe and on the device, with gradient
 * clipping and an overflow injected on the last rank; no rank keeps 16-bit
 * gradients beyond the pinned ring; ranks accumulating two micro-batches
 * each (rank r the step's micro-batches r and N + r) equal one rank with 2N
 * bitwise in the global reduction order, in every stage, placement and mode
 * (no fp32 accumulators), and within rounding in the rank order (rank r the
 * micro-batches 2r and 2r + 1); each rank's footprint
 * holds the states of its own chunks only; what ZeRO does not run yet is
 * refused naming what works. */
#include <stdio.h>
#include <unistd.h>

#include "test_model.h"
#include "zo/comm.h"
#include "zo/device.h"
#include "zo/engine_testing.h"
#include "zo_internal.h"

#define STEPS 4
#define CHUNK (8u << 10)

static zo_device_t dev;
static zo_comm_t world;
static int me, n_ranks;

typedef struct zcfg {
    zo_tier param_home, optim_home;
    int stage;             /* 0: the one-rank reference (grad_accum_steps n_ranks) */
    float max_norm;        /* > 0: clipping */
    int poison_step;       /* >= 0: an infinity in the last micro-batch's gradient at this step */
    int accum;             /* micro-batches per rank and step (the reference: accum x ranks) */
    uint64_t host_bytes;   /* ranks only: the host budget (gradients beyond it spill to NVMe) */
    uint64_t param_cap;    /* param_caps.device (stage 3: over each rank's own chunks) */
    uint64_t persist;      /* zero_persist_elems */
    int gather_only;       /* lookahead 0: each fetch gathers its own layer only */
    zo_optim_mode mode;    /* of the ranks and of the reference alike */
    uint64_t host_cap;     /* param_caps.host (param_home nvme: the rest of the chunks there) */
    int faults;            /* arm the NVMe stores' fault injection (none due) */
    zo_reduce_order order; /* the ranks' (global by default) and their data split */
} zcfg;

typedef struct zrun {
    zo_engine_t eng;
    zo_stream_t compute;
    tm_acts *a;
    int ids[TM_T];
    double losses[STEPS];
    double micro_loss[64]; /* this rank's micro-batches' losses of the current step */
    zo_engine_footprint fp;
    zo_step_stats last;
    char dir[64];
    int gather_only;
    uint64_t persist;
    zo_optim_mode mode;
    uint64_t device_bytes; /* the device allocator's bytes the engine took at finalize */
    uint64_t param_cap;    /* param_caps.device */
    int accum;             /* micro-batches a step on this rank */
} zrun;

static zo_status build(zrun *r, const zcfg *z, zo_engine_config *c)
{
    c->device = dev;
    c->chunk_bytes = CHUNK;
    c->param_home = z->param_home;
    c->optim_home = z->optim_home;
    const char *paths[1] = {r->dir};
    c->nvme_paths = paths;
    c->n_nvme_paths = 1;
    c->optim_threads = 2;
    c->adam = (zo_adam_params)ZO_ADAM_PARAMS_INIT;
    c->adam.lr = 1e-2f;
    c->adam.weight_decay = 0.01f;
    c->adam.simd_level = -1;
    c->max_grad_norm = z->max_norm;
    c->param_caps.bytes[ZO_TIER_DEVICE] = z->param_cap;
    c->param_caps.bytes[ZO_TIER_HOST] = z->host_cap;
    c->mode = z->mode;
    c->lookahead = z->gather_only ? 0 : c->lookahead;
    if (z->stage) {
        c->rank = me;
        c->world_size = n_ranks;
        c->zero_stage = z->stage;
        c->comm = world;
        c->grad_accum_steps = z->accum;
        c->host_bytes = z->host_bytes;
        c->zero_persist_elems = z->persist;
        c->reduce_order = z->order;
    } else {
        c->grad_accum_steps = n_ranks * z->accum;
    }
    /* one rank keeps its 16-bit parameters with states in host memory there
     * too (the update writes them beside the states); under ZeRO the others'
     * chunks go to NVMe */
    if (c->param_home == ZO_TIER_NVME && c->optim_home != ZO_TIER_NVME && c->world_size <= 1)
        c->param_home = ZO_TIER_HOST;
    ZO_TRY(zo_engine_init(&r->eng, c));
    if (z->faults) {
        zo_swap_fault never = {ZO_SWAP_FAULT_EIO, UINT64_MAX, 0};
        ZO_TRY(zo_engine_set_swap_faults(r->eng, &never, 1));
    }
    float *init[TM_T];
    for (int k = 0; k < TM_T; k++)
        init[k] = malloc(tm_numel(k) * sizeof(float));
    tm_init_params(init);
    zo_status st = ZO_OK;
    for (int k = 0; k < TM_T && st == ZO_OK; k++)
        st = zo_engine_register(r->eng, k / 2, k % 2 ? "b" : "W", tm_numel(k), init[k], &r->ids[k]);
    for (int k = 0; k < TM_T; k++)
        free(init[k]);
    ZO_TRY(st);
    return zo_engine_finalize(r->eng);
}

static zo_status micro_batch(zrun *r, int step, int micro, int poison)
{
    tm_input_arg in = {r->a, step, micro};
    ZO_TRY(zo_stream_enqueue(r->compute, tm_input, &in, sizeof in));
    for (int l = 0; l < TM_L; l++) {
        void *p[2];
        ZO_TRY(zo_engine_fetch(r->eng, l, ZO_PHASE_FORWARD, r->compute, p, NULL, 2));
        tm_fwd_arg f = {p[0], p[1], ZO_DTYPE_BF16, r->a->act[l], r->a->act[l + 1]};
        ZO_TRY(zo_stream_enqueue(r->compute, tm_forward, &f, sizeof f));
        ZO_TRY(zo_engine_release(r->eng, l, r->compute));
    }
    tm_loss_arg la = {r->a, 1.0f};
    ZO_TRY(zo_stream_enqueue(r->compute, tm_loss, &la, sizeof la));
    for (int l = TM_L - 1; l >= 0; l--) {
        void *p[2], *g[2];
        ZO_TRY(zo_engine_fetch(r->eng, l, ZO_PHASE_BACKWARD, r->compute, p, g, 2));
        tm_bwd_arg b = {p[0],
                        g[0],
                        g[1],
                        ZO_DTYPE_BF16,
                        r->a->act[l],
                        r->a->act[l + 1],
                        r->a->gact[l + 1],
                        r->a->gact[l],
                        poison && l == 1};
        ZO_TRY(zo_stream_enqueue(r->compute, tm_backward, &b, sizeof b));
        ZO_TRY(zo_engine_grads_ready(r->eng, l, r->compute));
        ZO_TRY(zo_engine_release(r->eng, l, r->compute));
    }
    return ZO_OK;
}

/* The global loss of a step: the ranks' losses summed in rank order, as one
 * rank sums its micro-batches' in micro-batch order. */
static double global_loss(zo_stream_t s, double mine)
{
    double all[64];
    ZO_ASSERT_OK(zo_comm_all_gather(world, s, &mine, all, 1, ZO_DTYPE_F64));
    ZO_ASSERT_OK(zo_stream_synchronize(s));
    double sum = all[0];
    for (int i = 1; i < n_ranks; i++)
        sum += all[i];
    return sum;
}

typedef struct take_arg {
    tm_acts *a;
    double *dst;
} take_arg;

/* On the compute stream after a micro-batch's loss: keep it apart. */
static zo_status take_loss(void *p)
{
    take_arg *x = p;
    *x->dst = x->a->loss;
    x->a->loss = 0.0;
    return ZO_OK;
}

/* The step's global micro-batch that is this rank's i-th (the reference:
 * the i-th): rank r trains j*N + r in round j (global order), or the
 * contiguous r*k .. r*k + k - 1 (rank order). */
static int global_micro(const zcfg *z, int rank, int i)
{
    if (!z->stage)
        return i;
    return z->order == ZO_REDUCE_ORDER_RANK ? rank * z->accum + i : i * n_ranks + rank;
}

/* The loss of a step: every micro-batch's loss summed in global micro-batch
 * order, as one rank sums its own. */
static double step_loss(const zcfg *z, zrun *r)
{
    double all[64 * 4];
    int n = z->stage ? z->accum : n_ranks * z->accum, W = z->stage ? n_ranks : 1;
    ZO_ASSERT_OK(
        zo_comm_all_gather(world, r->compute, r->micro_loss, all, (size_t)n, ZO_DTYPE_F64));
    ZO_ASSERT_OK(zo_stream_synchronize(r->compute));
    double by_index[64 * 4];
    for (int q = 0; q < W; q++)
        for (int i = 0; i < n; i++)
            by_index[global_micro(z, z->stage ? q : 0, i)] = all[(z->stage ? q : 0) * n + i];
    double sum = by_index[0];
    for (int m = 1; m < W * n; m++)
        sum += by_index[m];
    return sum;
}

static void open_run(const zcfg *z, zrun *r)
{
    memset(r, 0, sizeof *r);
    snprintf(r->dir, sizeof r->dir, "/tmp/zo-zero-test-XXXXXX");
    assert_non_null(mkdtemp(r->dir));
    assert_non_null(r->a = calloc(1, sizeof *r->a));
    ZO_ASSERT_OK(zo_stream_create(dev, &r->compute));
    zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
    r->gather_only = z->gather_only;
    r->persist = z->persist;
    r->mode = z->mode;
    r->param_cap = z->param_cap;
    r->accum = z->accum;
    zo_device_mem_stats m0, m1;
    ZO_ASSERT_OK(zo_device_mem_get_stats(dev, &m0));
    ZO_ASSERT_OK(build(r, z, &c));
    ZO_ASSERT_OK(zo_device_mem_get_stats(dev, &m1));
    r->device_bytes = m1.in_use - m0.in_use;
    r->fp.struct_size = sizeof r->fp;
    ZO_ASSERT_OK(zo_engine_footprint_get(r->eng, &r->fp));
}

static void train(const zcfg *z, zrun *r)
{
    open_run(z, r);
    for (int s = 0; s < STEPS; s++) {
        r->a->loss = 0.0;
        int n = z->stage ? z->accum : n_ranks * z->accum;
        for (int i = 0; i < n; i++) {
            int m = global_micro(z, me, i);
            ZO_ASSERT_OK(micro_batch(r, s, m, s == z->poison_step && m == n_ranks * z->accum - 1));
            take_arg t = {r->a, &r->micro_loss[i]};
            ZO_ASSERT_OK(zo_stream_enqueue(r->compute, take_loss, &t, sizeof t));
        }
        r->last = (zo_step_stats)ZO_STEP_STATS_INIT;
        ZO_ASSERT_OK(zo_engine_end_step(r->eng, &r->last));
        ZO_ASSERT_OK(zo_stream_synchronize(r->compute));
        r->losses[s] = step_loss(z, r);
        assert_int_equal(r->last.overflow, s == z->poison_step);
    }
}

static void close_run(zrun *r)
{
    zo_engine_free(r->eng);
    zo_stream_destroy(r->compute);
    free(r->a);
    rmdir(r->dir);
}

/* Z: one chunk's fp32 master, m and v. */
static uint64_t states_per_chunk(void)
{
    return 3ull * (CHUNK / 2) * sizeof(float);
}

static void expect_own_states(const zrun *r, int stage, zo_tier optim_home)
{
    uint32_t n = r->fp.n_chunks, owned = 0;
    for (int k = 0; k < TM_T; k++) {
        int o = zo_engine_tensor_owner(r->eng, r->ids[k]);
        assert_true(o >= 0 && o < n_ranks);
    }
    /* contiguous ranges, the first n % N ranks one more */
    owned = n / (uint32_t)n_ranks + ((uint32_t)me < n % (uint32_t)n_ranks);
    uint64_t Z = states_per_chunk(), grads = (CHUNK / 2) * sizeof(float);
    uint64_t kept = n_ranks == 1 ? 0 : stage == 1 ? n : owned;
    uint64_t sets = r->mode == ZO_OPTIM_DPU ? 2 : 1; /* dpu: by step parity */
    uint64_t zero = n_ranks == 1 ? 0 : sets * kept * grads + Z;
    if (n_ranks == 1 && r->accum > 1) /* one rank's fp32 accumulators; ZeRO's global order has
                                         none (the owners' reduced gradients hold the sums) */
        zero = sets * n * grads;
    uint32_t optim[ZO_TIER_MAX], params[ZO_TIER_MAX], held = 0;
    ZO_ASSERT_OK(zo_engine_homes(r->eng, params, optim));
    uint64_t states = optim_home == ZO_TIER_HOST ? owned * Z : 0;
    if (r->mode == ZO_OPTIM_OVERLAP) /* the backups of the resident states */
        states *= 2;
    /* NVMe-homed states: their gradients wait in host memory (grad_host) */
    assert_int_equal(r->fp.bytes[ZO_TIER_HOST] - r->fp.grad_host, states + zero);
    if (optim_home == ZO_TIER_HOST)
        assert_int_equal(r->fp.grad_host, 0);
    assert_int_equal(r->last.peak[ZO_TIER_HOST], r->fp.bytes[ZO_TIER_HOST]);
    assert_int_equal(r->last.peak_pinned, r->fp.pinned); /* the footprint counts every buffer */
    /* two extents of a chunk's 16-bit bytes for each chunk homed on NVMe and,
     * one rank (no ZeRO), each device-resident chunk over NVMe states */
    uint64_t backed = n_ranks == 1 ? r->param_cap / CHUNK : 0;
    uint64_t p16 = 2ull * (params[ZO_TIER_NVME] + backed) * CHUNK;
    uint64_t nvme_states = optim_home == ZO_TIER_NVME ? owned : 0;
    assert_int_equal(r->fp.bytes[ZO_TIER_NVME] - r->fp.grad_nvme,
                     2ull * nvme_states * zo_engine_nvme_state_bytes(CHUNK / 2) + p16);
    if (n_ranks > 1) {
        /* every chunk's 16-bit gradients come down through the pinned ring
         * (lookahead + 2 chunk buffers) and are reduced to their owner by the
         * host job: none wait in host memory or on NVMe, owner or not */
        uint32_t la = r->gather_only ? 0 : 2, depth = la + 2;
        assert_int_equal(r->fp.grad_pinned, (n < depth ? n : depth) * (uint64_t)CHUNK);
        assert_int_equal(r->fp.grad_host, 0);
        assert_int_equal(r->fp.grad_nvme, 0);
        assert_int_equal(r->fp.grad_stage, 0);
        /* stage 3: gather buffers for lookahead + 1 layers' chunks (2 per layer here) */
        assert_int_equal(r->fp.param_gather, stage == 3 ? (la + 1) * 2ull * CHUNK : 0);
    }
    assert_int_equal(optim[0] + optim[1] + optim[2], owned);
    /* stage 3: a rank's tiers hold the 16-bit parameters of its own chunks
     * (tensor k is chunk k here) and of those small enough to persist */
    for (int k = 0; k < TM_T; k++)
        held += stage < 3 || n_ranks == 1 || zo_engine_tensor_owner(r->eng, r->ids[k]) == me ||
                tm_numel(k) <= r->persist;
    assert_int_equal(params[0] + params[1] + params[2], held);
}

/* N ranks against the one-rank reference, every rank checking the tensors it owns. */
static void expect_exact_as(zcfg z)
{
    zo_tier ph = z.param_home, oh = z.optim_home;
    int stage = z.stage;
    zcfg ref = z;
    ref.stage = 0;
    zrun a, b;
    train(&z, &a);
    train(&ref, &b);
    for (int s = 0; s < STEPS; s++)
        if (memcmp(&a.losses[s], &b.losses[s], sizeof(double)) != 0)
            fail_msg("stage %d, %s/%s, rank %d of %d: loss of step %d %.17g, one rank %.17g", stage,
                     zo_tier_name(ph), zo_tier_name(oh), me, n_ranks, s, a.losses[s], b.losses[s]);
    if (memcmp(&a.last.grad_norm, &b.last.grad_norm, sizeof(double)) != 0)
        fail_msg("gradient norm %.17g, one rank %.17g", a.last.grad_norm, b.last.grad_norm);
    int checked = 0;
    for (int k = 0; k < TM_T; k++) {
        size_t n = tm_numel(k);
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
        zo_status st = zo_engine_read_master(a.eng, a.ids[k], x);
        if (zo_engine_tensor_owner(a.eng, a.ids[k]) != me) {
            assert_int_equal(st, ZO_ERR_UNSUPPORTED); /* another rank's states */
        } else {
            ZO_ASSERT_OK(st);
            ZO_ASSERT_OK(zo_engine_read_master(b.eng, b.ids[k], y));
            if (memcmp(x, y, n * sizeof *x) != 0)
                fail_msg("stage %d: master weights of tensor %d differ on rank %d", stage, k, me);
            checked++;
        }
        free(x);
        free(y);
    }
    int all[64];
    ZO_ASSERT_OK(zo_comm_all_gather(world, a.compute, &checked, all, 1, ZO_DTYPE_I32));
    ZO_ASSERT_OK(zo_stream_synchronize(a.compute));
    int total = 0;
    for (int i = 0; i < n_ranks; i++)
        total += all[i];
    assert_int_equal(total, TM_T); /* every tensor checked by its owner, once */
    expect_own_states(&a, stage, oh);
    close_run(&a);
    close_run(&b);
}

static void expect_exact(zo_tier ph, zo_tier oh, int stage, float max_norm, int poison_step)
{
    zcfg z = {ph, oh, stage, max_norm,      poison_step, 1, 0,
              0,  0,  0,     ZO_OPTIM_SYNC, 0,           0, ZO_REDUCE_ORDER_GLOBAL};
    expect_exact_as(z);
}

static void stage1_host(void **state)
{
    (void)state;
    expect_exact(ZO_TIER_HOST, ZO_TIER_HOST, 1, 0.0f, -1);
}

static void stage2_host(void **state)
{
    (void)state;
    expect_exact(ZO_TIER_HOST, ZO_TIER_HOST, 2, 0.0f, -1);
}

static void stage1_nvme(void **state)
{
    (void)state;
    expect_exact(ZO_TIER_HOST, ZO_TIER_NVME, 1, 0.0f, -1);
}

static void stage2_nvme(void **state)
{
    (void)state;
    expect_exact(ZO_TIER_HOST, ZO_TIER_NVME, 2, 0.0f, -1);
}

static void stage2_device(void **state)
{
    (void)state;
    expect_exact(ZO_TIER_DEVICE, ZO_TIER_DEVICE, 2, 0.0f, -1);
}

/* The norm from the owners' partials decides clipping on every rank alike;
 * an infinity on the last rank skips the update everywhere. */
static void stage2_clipping_and_overflow(void **state)
{
    (void)state;
    expect_exact(ZO_TIER_HOST, ZO_TIER_NVME, 2, 0.05f, 2);
}

/* A host budget of exactly the footprint: no rank's gradients wait for the
 * update (the host job reduces them to the owner as they come down), so
 * nothing spills and the budget holds. */
static void stage2_tight_host_budget(void **state)
{
    (void)state;
    zcfg z = {ZO_TIER_HOST,          ZO_TIER_NVME, 2, 0.0f, -1, 1, 0, 0, 0, 0, ZO_OPTIM_SYNC, 0, 0,
              ZO_REDUCE_ORDER_GLOBAL};
    zrun a;
    train(&z, &a);
    z.host_bytes = a.fp.pinned + a.fp.bytes[ZO_TIER_HOST] - a.fp.grad_host;
    close_run(&a);
    expect_exact_as(z);
}

/* Two micro-batches on each rank in the global order: round j's chain adds
 * the N ranks' j-th onto the running sum at the owner, bitwise one rank
 * summing all 2N in order, in every stage, placement and mode. */
static void accumulating_as(int stage, zo_tier ph, zo_tier oh, float max_norm, int poison_step,
                            zo_optim_mode mode)
{
    zcfg z = {ph, oh, stage, max_norm, poison_step, 2, 0,
              0,  0,  0,     mode,     0,           0, ZO_REDUCE_ORDER_GLOBAL};
    expect_exact_as(z);
}

static void accumulating_stages_host(void **state)
{
    (void)state;
    accumulating_as(1, ZO_TIER_HOST, ZO_TIER_HOST, 0.0f, -1, ZO_OPTIM_SYNC);
    accumulating_as(2, ZO_TIER_HOST, ZO_TIER_HOST, 0.0f, -1, ZO_OPTIM_SYNC);
    accumulating_as(3, ZO_TIER_HOST, ZO_TIER_HOST, 0.0f, -1, ZO_OPTIM_SYNC);
}

static void accumulating_nvme_device_clipping(void **state)
{
    (void)state;
    accumulating_as(2, ZO_TIER_HOST, ZO_TIER_NVME, 0.05f, 2, ZO_OPTIM_SYNC);
    accumulating_as(3, ZO_TIER_HOST, ZO_TIER_NVME, 0.0f, -1, ZO_OPTIM_SYNC);
    accumulating_as(2, ZO_TIER_DEVICE, ZO_TIER_DEVICE, 0.0f, -1, ZO_OPTIM_SYNC);
    if (n_ranks > 1) /* 16-bit parameters on NVMe (one rank keeps them in host memory) */
        accumulating_as(3, ZO_TIER_NVME, ZO_TIER_NVME, 0.0f, -1, ZO_OPTIM_SYNC);
}

static void accumulating_overlap_dpu(void **state)
{
    (void)state;
    accumulating_as(1, ZO_TIER_HOST, ZO_TIER_HOST, 0.05f, 1, ZO_OPTIM_OVERLAP);
    accumulating_as(3, ZO_TIER_HOST, ZO_TIER_NVME, 0.05f, 2, ZO_OPTIM_OVERLAP);
    accumulating_as(2, ZO_TIER_HOST, ZO_TIER_NVME, 0.05f, 2, ZO_OPTIM_DPU);
    accumulating_as(3, ZO_TIER_HOST, ZO_TIER_HOST, 0.0f, -1, ZO_OPTIM_DPU);
}

/* Two micro-batches on each rank in the rank order: each rank's sum first,
 * then the ranks' in rank order, against one rank summing all 2N in order:
 * equal within rounding (the same order for every placement and stage). */
static void accumulating_ranks_agree_within_rounding(void **state)
{
    (void)state;
    zcfg z = {ZO_TIER_HOST,        ZO_TIER_NVME, 2, 0.0f, -1, 2, 0, 0, 0, 0, ZO_OPTIM_SYNC, 0, 0,
              ZO_REDUCE_ORDER_RANK},
         ref = z;
    ref.stage = 0;
    zrun a, b;
    train(&z, &a);
    train(&ref, &b);
    for (int s = 0; s < STEPS; s++)
        if (fabs(a.losses[s] - b.losses[s]) > 1e-6 * fabs(b.losses[s]))
            fail_msg("loss of step %d: %.17g, one rank %.17g", s, a.losses[s], b.losses[s]);
    for (int k = 0; k < TM_T; k++) {
        if (zo_engine_tensor_owner(a.eng, a.ids[k]) != me)
            continue;
        size_t n = tm_numel(k);
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
        ZO_ASSERT_OK(zo_engine_read_master(a.eng, a.ids[k], x));
        ZO_ASSERT_OK(zo_engine_read_master(b.eng, b.ids[k], y));
        for (size_t i = 0; i < n; i++)
            if (fabsf(x[i] - y[i]) > 1e-4f)
                fail_msg("tensor %d element %zu: %.9g, one rank %.9g", k, i, x[i], y[i]);
        free(x);
        free(y);
    }
    close_run(&a);
    close_run(&b);
}

static void stage3_host(void **state)
{
    (void)state;
    expect_exact(ZO_TIER_HOST, ZO_TIER_HOST, 3, 0.0f, -1);
}

static void stage3_nvme(void **state)
{
    (void)state;
    expect_exact(ZO_TIER_HOST, ZO_TIER_NVME, 3, 0.0f, -1);
}

static void stage3_device(void **state)
{
    (void)state;
    expect_exact(ZO_TIER_DEVICE, ZO_TIER_DEVICE, 3, 0.0f, -1);
}

/* param_caps.device over each rank's own chunks: its first three resident on
 * the device, the rest of its own in host memory, the others' gathered. */
static void stage3_device_cap_split(void **state)
{
    (void)state;
    zcfg z = {ZO_TIER_HOST,
              ZO_TIER_NVME,
              3,
              0.0f,
              -1,
              1,
              0,
              3 * CHUNK,
              0,
              0,
              ZO_OPTIM_SYNC,
              0,
              0,
              ZO_REDUCE_ORDER_GLOBAL};
    expect_exact_as(z);
}

/* Stages 1 and 2 with param_caps.device: every rank holds every chunk, the
 * first three resident on its device, reloaded after the owners' broadcasts. */
static void stage2_device_cap_split(void **state)
{
    (void)state;
    zcfg z = {ZO_TIER_HOST,
              ZO_TIER_NVME,
              2,
              0.05f,
              2,
              1,
              0,
              3 * CHUNK,
              0,
              0,
              ZO_OPTIM_SYNC,
              0,
              0,
              ZO_REDUCE_ORDER_GLOBAL};
    expect_exact_as(z);
    z.stage = 1;
    z.mode = ZO_OPTIM_OVERLAP;
    expect_exact_as(z);
}

static void stage3_clipping_and_overflow(void **state)
{
    (void)state;
    expect_exact(ZO_TIER_HOST, ZO_TIER_NVME, 3, 0.05f, 2);
}

/* The biases' chunks (64 elements) persist whole on every rank, the owner
 * broadcasting their updates; the weights' are gathered. Lookahead 0: each
 * fetch gathers its own layer only. */
static void stage3_small_chunks_persist(void **state)
{
    (void)state;
    zcfg z = {
        ZO_TIER_HOST,          ZO_TIER_HOST, 3, 0.05f, -1, 1, 0, 0, TM_D, 1, ZO_OPTIM_SYNC, 0, 0,
        ZO_REDUCE_ORDER_GLOBAL};
    expect_exact_as(z);
}

/* Stage 3 with param_home device: a rank's device holds its own chunks for
 * good and, beyond them, slots for (lookahead + 1) layers of gathered ones:
 * measured by the device's allocator, about 1/N of the model plus those
 * (one rank: the whole model). */
static void stage3_device_params_are_a_share(void **state)
{
    (void)state;
    zcfg z = {ZO_TIER_DEVICE,        ZO_TIER_HOST, 3, 0.0f, -1, 1, 0, 0, 0, 1, ZO_OPTIM_SYNC, 0, 0,
              ZO_REDUCE_ORDER_GLOBAL};
    zrun a;
    train(&z, &a);
    uint64_t n = a.fp.n_chunks, K = a.fp.max_chunks_per_layer;
    uint64_t owned = n / (uint64_t)n_ranks + ((uint64_t)me < n % (uint64_t)n_ranks);
    uint64_t params = a.device_bytes - K * CHUNK; /* less the gradient slots */
    uint64_t want = n_ranks == 1 ? n : owned + K < n ? owned + K : n;
    assert_int_equal(params, want * CHUNK);
    assert_int_equal(a.fp.device_param_slots, want);
    if (n_ranks > 1)
        assert_true(params <= (n + n_ranks - 1) / n_ranks * CHUNK + K * CHUNK);
    if (n_ranks == 4)
        assert_true(params < n * CHUNK); /* 2 + 2 of 8 chunks */
    uint32_t homes[ZO_TIER_MAX];
    ZO_ASSERT_OK(zo_engine_homes(a.eng, homes, NULL));
    assert_int_equal(homes[ZO_TIER_DEVICE], n_ranks == 1 ? n : owned);
    close_run(&a);
}

/* Overlap mode: each owner updates its chunks speculatively on their reduced
 * gradients as they arrive; clipping and the overflow roll them back and
 * redo them on every owner alike. */
static void overlap_as(int stage, zo_tier oh, float max_norm, int poison_step)
{
    zcfg z = {ZO_TIER_HOST,
              oh,
              stage,
              max_norm,
              poison_step,
              1,
              0,
              0,
              0,
              0,
              ZO_OPTIM_OVERLAP,
              0,
              0,
              ZO_REDUCE_ORDER_GLOBAL};
    expect_exact_as(z);
}

static void overlap_stage1_host(void **state)
{
    (void)state;
    overlap_as(1, ZO_TIER_HOST, 0.0f, -1);
}

static void overlap_stage2_clipping_and_overflow(void **state)
{
    (void)state;
    overlap_as(2, ZO_TIER_NVME, 0.05f, 2);
}

static void overlap_stage3_host(void **state)
{
    (void)state;
    overlap_as(3, ZO_TIER_HOST, 0.05f, 1);
}

static void overlap_stage3_nvme(void **state)
{
    (void)state;
    overlap_as(3, ZO_TIER_NVME, 0.0f, -1);
}

/* dpu mode: each step's reduced gradients by parity, the delayed update on
 * the owners, their broadcast from its thread while the next step runs. */
static void dpu_as(int stage, zo_tier oh, float max_norm, int poison_step)
{
    zcfg z = {
        ZO_TIER_HOST,          oh, stage, max_norm, poison_step, 1, 0, 0, 0, 0, ZO_OPTIM_DPU, 0, 0,
        ZO_REDUCE_ORDER_GLOBAL};
    expect_exact_as(z);
}

static void dpu_stage1_host(void **state)
{
    (void)state;
    dpu_as(1, ZO_TIER_HOST, 0.0f, -1);
}

static void dpu_stage2_clipping_and_overflow(void **state)
{
    (void)state;
    dpu_as(2, ZO_TIER_NVME, 0.05f, 2);
}

static void dpu_stage3_host(void **state)
{
    (void)state;
    dpu_as(3, ZO_TIER_HOST, 0.05f, 1);
}

static void dpu_stage3_nvme(void **state)
{
    (void)state;
    dpu_as(3, ZO_TIER_NVME, 0.0f, -1);
}

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

static void refused(zo_optim_mode mode, int stage, zo_tier ph, zo_status want, const char *names)
{
    zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
    c.device = dev;
    c.rank = me;
    c.world_size = 2;
    c.zero_stage = stage;
    c.mode = mode;
    c.param_home = ph;
    c.optim_home = ph == ZO_TIER_NVME ? ZO_TIER_NVME : ZO_TIER_HOST;
    c.comm = world;
    zo_engine_t e = NULL;
    assert_int_equal(zo_engine_init(&e, &c), want);
    assert_null(e);
    if (!strstr(zo_last_error(), names))
        fail_msg("expected \"%s\" in: %s", names, zo_last_error());
}

static void what_is_not_run_is_refused(void **state)
{
    (void)state;
    if (me > 1)
        return; /* the configs say world size 2 */
    refused(ZO_OPTIM_SYNC, 0, ZO_TIER_HOST, ZO_ERR_UNSUPPORTED, "use zero_stage 1, 2 or 3");
    /* the global order with layer-major groups, which sum on the device */
    zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
    c.device = dev;
    c.rank = me;
    c.world_size = 2;
    c.zero_stage = 2;
    c.comm = world;
    c.grad_accum_steps = 4;
    c.micro_group = 2;
    zo_engine_t e = NULL;
    assert_int_equal(zo_engine_init(&e, &c), ZO_ERR_UNSUPPORTED);
    assert_null(e);
    assert_non_null(strstr(zo_last_error(), "use micro_group 1"));
    assert_non_null(strstr(zo_last_error(), "reduce_order rank"));
    c.reduce_order = ZO_REDUCE_ORDER_RANK; /* the rank order keeps the groups */
    ZO_ASSERT_OK(zo_engine_init(&e, &c));
    zo_engine_free(e);
    c.reduce_order = (zo_reduce_order)7;
    assert_int_equal(zo_engine_init(&e, &c), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "reduce_order is 7"));
}

int main(void)
{
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    dc.mem_budget = 64u << 20;
    zo_comm_config cc = ZO_COMM_CONFIG_INIT;
    cc.backend = "mpi";
    cc.timeout_s = 60;
    if (zo_device_init(&dev, &dc) || (cc.device = dev, zo_comm_init(&world, &cc))) {
        fprintf(stderr, "test_engine_zero: setup failed: %s\n", zo_last_error());
        return 1;
    }
    me = zo_comm_rank(world);
    n_ranks = zo_comm_size(world);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stage1_host),
        cmocka_unit_test(stage2_host),
        cmocka_unit_test(stage1_nvme),
        cmocka_unit_test(stage2_nvme),
        cmocka_unit_test(stage2_device),
        cmocka_unit_test(stage2_clipping_and_overflow),
        cmocka_unit_test(stage2_tight_host_budget),
        cmocka_unit_test(accumulating_ranks_agree_within_rounding),
        cmocka_unit_test(accumulating_stages_host),
        cmocka_unit_test(accumulating_nvme_device_clipping),
        cmocka_unit_test(accumulating_overlap_dpu),
        cmocka_unit_test(stage3_host),
        cmocka_unit_test(stage3_nvme),
        cmocka_unit_test(stage3_device),
        cmocka_unit_test(stage3_device_cap_split),
        cmocka_unit_test(stage3_clipping_and_overflow),
        cmocka_unit_test(stage2_device_cap_split),
        cmocka_unit_test(stage3_small_chunks_persist),
        cmocka_unit_test(stage3_device_params_are_a_share),
        cmocka_unit_test(overlap_stage1_host),
        cmocka_unit_test(overlap_stage2_clipping_and_overflow),
        cmocka_unit_test(overlap_stage3_host),
        cmocka_unit_test(overlap_stage3_nvme),
        cmocka_unit_test(dpu_stage1_host),
        cmocka_unit_test(dpu_stage2_clipping_and_overflow),
        cmocka_unit_test(dpu_stage3_host),
        cmocka_unit_test(dpu_stage3_nvme),
        cmocka_unit_test(p16_nvme_stages),
        cmocka_unit_test(p16_nvme_states_host),
        cmocka_unit_test(p16_nvme_overlap),
        cmocka_unit_test(p16_nvme_dpu),
        cmocka_unit_test(p16_nvme_split),
        cmocka_unit_test(p16_nvme_faults),
        cmocka_unit_test(p16_nvme_faults_states_host),
        cmocka_unit_test(what_is_not_run_is_refused),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    zo_comm_free(world);
    zo_device_free(dev);
    return failed ? 1 : 0;
}
