/* The ZeRO tests' shared run and checks (zero_harness.h). */
#include "zero_harness.h"

zo_device_t dev;
zo_comm_t world;
int me, n_ranks;

zo_status build(zrun *r, const zcfg *z, zo_engine_config *c)
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

zo_status micro_batch(zrun *r, int step, int micro, int poison)
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
double global_loss(zo_stream_t s, double mine)
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
zo_status take_loss(void *p)
{
    take_arg *x = p;
    *x->dst = x->a->loss;
    x->a->loss = 0.0;
    return ZO_OK;
}

/* The step's global micro-batch that is this rank's i-th (the reference:
 * the i-th): rank r trains j*N + r in round j (global order), or the
 * contiguous r*k .. r*k + k - 1 (rank order). */
int global_micro(const zcfg *z, int rank, int i)
{
    if (!z->stage)
        return i;
    return z->order == ZO_REDUCE_ORDER_RANK ? rank * z->accum + i : i * n_ranks + rank;
}

/* The loss of a step: every micro-batch's loss summed in global micro-batch
 * order, as one rank sums its own. */
double step_loss(const zcfg *z, zrun *r)
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

void open_run(const zcfg *z, zrun *r)
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

void train(const zcfg *z, zrun *r)
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

void close_run(zrun *r)
{
    zo_engine_free(r->eng);
    zo_stream_destroy(r->compute);
    free(r->a);
    rmdir(r->dir);
}

/* Z: one chunk's fp32 master, m and v. */
uint64_t states_per_chunk(void)
{
    return 3ull * (CHUNK / 2) * sizeof(float);
}

void expect_own_states(const zrun *r, int stage, zo_tier optim_home)
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
void expect_exact_as(zcfg z)
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

void expect_exact(zo_tier ph, zo_tier oh, int stage, float max_norm, int poison_step)
{
    zcfg z = {ph, oh, stage, max_norm,      poison_step, 1, 0,
              0,  0,  0,     ZO_OPTIM_SYNC, 0,           0, ZO_REDUCE_ORDER_GLOBAL};
    expect_exact_as(z);
}

int zero_run_tests(const char *name, const struct CMUnitTest *tests, size_t n)
{
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    dc.mem_budget = 64u << 20;
    zo_comm_config cc = ZO_COMM_CONFIG_INIT;
    cc.backend = "mpi";
    cc.timeout_s = 60;
    if (zo_device_init(&dev, &dc) || (cc.device = dev, zo_comm_init(&world, &cc))) {
        fprintf(stderr, "%s: setup failed: %s\n", name, zo_last_error());
        return 1;
    }
    me = zo_comm_rank(world);
    n_ranks = zo_comm_size(world);
    int failed = _cmocka_run_group_tests(name, tests, n, NULL, NULL);
    zo_comm_free(world);
    zo_device_free(dev);
    return failed ? 1 : 0;
}
