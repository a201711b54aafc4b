/* finalize: the plan made real. Every tier allocates what the plan counted
 * (device slots, pinned and host memory, the NVMe stores), each chunk's
 * initial states and parameters go to its homes, and the CPU optimizer's
 * threads start; a failure releases everything and keeps the registration,
 * so finalize can be retried. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_tier.h"
#include "zo/topo.h"

/* Tensor id's initial values into dst: its copy, or what its fill writes. */
zo_status eng_initial_values(struct zo_engine *e, int id, float *dst)
{
    eng_tensor *t = &e->reg.tensors[id];
    if (t->init) {
        memcpy(dst, t->init, t->numel * sizeof(float));
        return ZO_OK;
    }
    zo_status st = t->fill(t->fill_ctx, id, dst);
    if (st < 0)
        return ZO_FAIL(st, ENG_SUBSYS, "the initial values of '%s': %s", t->name, zo_last_error());
    return ZO_OK;
}

/* ---- finalize: allocate every tier and place the initial states ---- */

static zo_status alloc_device(struct zo_engine *e)
{
    uint64_t cb = e->chunk_bytes;
    e->device.n_pslots = e->fp.device_param_slots;
    e->device.n_gslots = e->fp.device_grad_slots;
    ZO_TRY(zo_device_malloc(e->dev, e->device.n_pslots * cb, &e->device.dev_params));
    ZO_TRY(zo_device_malloc(e->dev, e->device.n_gslots * cb, &e->device.dev_grads));
    e->device.pslots = calloc(e->device.n_pslots, sizeof *e->device.pslots);
    e->device.gslots = calloc(e->device.n_gslots, sizeof *e->device.gslots);
    if (!e->device.pslots || !e->device.gslots)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "allocating slot tables");
    for (uint32_t s = 0; s < e->device.n_pslots; s++) {
        e->device.pslots[s].ptr = (char *)e->device.dev_params + s * cb;
        e->device.pslots[s].chunk = -1;
        ZO_TRY(zo_event_create(e->dev, &e->device.pslots[s].ready));
        ZO_TRY(zo_event_create(e->dev, &e->device.pslots[s].lastuse));
    }
    for (uint32_t c = 0; c < e->n_chunks; c++)
        ZO_TRY(zo_event_create(e->dev, &e->chunks[c].computed));
    for (uint32_t s = 0; s < e->device.n_gslots; s++) {
        e->device.gslots[s].ptr = (char *)e->device.dev_grads + s * cb;
        ZO_TRY(zo_event_create(e->dev, &e->device.gslots[s].drained));
    }
    return eng_group_alloc(e);
}

/* The pinned pool the tiers and the gradients take their buffers from. */
static zo_status alloc_pinned(struct zo_engine *e)
{
    zo_hostpool_config pc = ZO_HOSTPOOL_CONFIG_INIT;
    pc.max_pinned_bytes = e->cfg.pinned_bytes ? e->cfg.pinned_bytes : e->fp.pinned;
    pc.node = e->cfg.host_node; /* the optimizer's workers follow it (start_pool) */
    return zo_hostpool_init(&e->host.pool, e->dev, &pc);
}

/* Every tier with chunks homed there reserves their storage: the states'
 * tiers first (the NVMe stages they take also carry 16-bit parameters). */
static zo_status place_tiers(struct zo_engine *e)
{
    e->nvme.share_bufs = e->zero.pbuf; /* what the NVMe tier needs of ZeRO's: explicitly */
    for (int t = 0; t < eng_n_tiers; t++)
        if (eng_chunks_at(e, 1, eng_state_tiers[t]))
            ZO_TRY(eng_state_tiers[t]->place(eng_tier_self(e, t), e));
    for (int t = 0; t < eng_n_tiers; t++) /* NVMe also keeps the backed chunks' copies */
        if (t == ZO_TIER_NVME ? eng_p16_on_nvme(e) : eng_chunks_at(e, 0, eng_param_tiers[t]))
            ZO_TRY(eng_param_tiers[t]->place(eng_tier_self(e, t), e));
    return ZO_OK;
}

/* The fp32 gradient accumulators (eng_host_accumulates). */
static zo_status alloc_host(struct zo_engine *e)
{
    uint64_t nc = e->n_chunks;
    if (eng_host_accumulates(&e->cfg))
        ZO_TRY(eng_host_alloc(e, nc * (uint64_t)e->grads.bufs * e->chunk_elems * sizeof(float),
                              &e->host.acc));
    for (uint32_t c = 0; c < nc; c++)
        for (int b = 0; e->host.acc && b < e->grads.bufs; b++)
            e->chunks[c].acc[b] = e->host.acc + ((uint64_t)b * nc + c) * e->chunk_elems;
    return ZO_OK;
}

/* The initial master weights of chunk c (gaps zero) into dst (chunk_elems floats). */
static zo_status fill_master(struct zo_engine *e, uint32_t c, float *dst)
{
    memset(dst, 0, e->chunk_elems * sizeof(float));
    eng_layer *L = &e->reg.layers[e->chunks[c].layer];
    for (int i = 0; i < L->n_tensors; i++) {
        eng_tensor *t = &e->reg.tensors[L->tensors[i]];
        if (t->chunk == c)
            ZO_TRY(eng_initial_values(e, L->tensors[i], dst + t->off));
    }
    return ZO_OK;
}

/* Each chunk's initial states and 16-bit parameters, through its homes;
 * then the device sees them. */
static zo_status place_initial_states(struct zo_engine *e)
{
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        eng_chunk *k = &e->chunks[c];
        float *st = k->st->init_buf(k->sctx, e, c);
        memset(st, 0, eng_states_bytes(e->cfg.state_dtype, e->chunk_elems));
        ZO_TRY(fill_master(e, c, st));
        ZO_TRY(k->st->init(k->sctx, e, c, st));
        ZO_TRY(k->pt->write(k->pctx, e, c, st, 1));
        k->slot = -1;
        k->grad_slot = -1;
    }
    uint32_t s = 0; /* the resident chunks take the first slots, for good */
    for (uint32_t c = 0; c < e->n_chunks; c++)
        if (e->chunks[c].pt->resident)
            ZO_TRY(eng_load_slot(e, c, s++));
    return ZO_OK;
}

/* Keeps the cores this process may run on (a launcher such as mpirun binds
 * each rank to its own), in order; how many remain. */
static int allowed_cores(int *cores, int n)
{
    cpu_set_t allowed;
    if (zo_process_cpus(&allowed) != 0)
        return n;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (cores[i] >= 0 && cores[i] < CPU_SETSIZE && CPU_ISSET(cores[i], &allowed))
            cores[k++] = cores[i];
    return k;
}

/* The optimizer's workers sit on the cores of the pinned pool's NUMA node
 * (the node nearest the GPU), one per core unless optim_threads says. */
static zo_status start_pool(struct zo_engine *e)
{
    zo_optim_pool_config oc = ZO_OPTIM_POOL_CONFIG_INIT;
    zo_hostpool_placement pl = ZO_HOSTPOOL_PLACEMENT_INIT;
    int cores[1024], n = 0;
    if (zo_hostpool_get_placement(e->host.pool, &pl) == ZO_OK &&
        zo_topo_node_cpu_list(pl.node, cores, 1024, &n) == ZO_OK && n > 0 &&
        (n = allowed_cores(cores, n < 1024 ? n : 1024)) > 0) {
        oc.cores = cores;
        oc.ncores = n < 1024 ? n : 1024;
    } else {
        n = 0;
    }
    eng_trace_pool(e, &oc);
    oc.nthreads = e->cfg.optim_threads;
    if (oc.nthreads <= 0)
        oc.nthreads = (int)zo_env_int("ZO_OPTIM_THREADS", n > 0 ? n : 1, 1, 1024);
    ZO_LOGI(ENG_SUBSYS, "optimizer: %d worker thread(s) on NUMA node %d (%d core(s))", oc.nthreads,
            pl.node, n);
    return zo_optim_pool_init(&e->opool, &oc);
}

static zo_status start_optimizer(struct zo_engine *e)
{
    ZO_TRY(start_pool(e));
    if (e->cfg.param_dtype == ZO_DTYPE_F16) {
        ZO_TRY(zo_loss_scaler_init(&e->scaler, &e->cfg.loss_scaler));
    } else {
        zo_loss_scaler_config lc = ZO_LOSS_SCALER_CONFIG_INIT;
        lc.loss_scale = 1.0;
        ZO_TRY(zo_loss_scaler_init(&e->scaler, &lc));
    }
    return eng_thread_start(e);
}

void eng_release_tiers(struct zo_engine *e)
{
    if (e->h2d)
        zo_stream_synchronize(e->h2d);
    if (e->d2h)
        zo_stream_synchronize(e->d2h);
    eng_thread_stop(e);
    if (e->mode)
        e->mode->settle(e);
    zo_optim_pool_free(e->opool);
    e->opool = NULL;
    eng_grads_release(e);
    for (int t = 0; t < eng_n_tiers; t++)
        eng_param_tiers[t]->release(eng_tier_self(e, t), e);
    for (int t = 0; t < eng_n_tiers; t++)
        eng_state_tiers[t]->release(eng_tier_self(e, t), e);
    e->stats.n_stores = 0;
    zo_hostpool_free(e->host.pool);
    e->host.pool = NULL;
    eng_host_free(e->host.acc);
    e->host.acc = NULL;
    eng_reducers_release(e);
    e->host.bytes = 0;
    for (uint32_t s = 0; e->device.pslots && s < e->device.n_pslots; s++) {
        zo_event_destroy(e->device.pslots[s].ready);
        zo_event_destroy(e->device.pslots[s].lastuse);
    }
    eng_group_release(e);
    for (uint32_t s = 0; e->device.gslots && s < e->device.n_gslots; s++) {
        zo_event_destroy(e->device.gslots[s].drained);
    }
    for (uint32_t c = 0; e->chunks && c < e->n_chunks; c++) {
        zo_event_destroy(e->chunks[c].computed);
        e->chunks[c].computed = NULL;
    }
    free(e->device.pslots);
    free(e->device.gslots);
    e->device.pslots = NULL;
    e->device.gslots = NULL;
    zo_device_mfree(e->dev, e->device.dev_params);
    zo_device_mfree(e->dev, e->device.dev_grads);
    e->device.dev_params = e->device.dev_grads = NULL;
    zo_stream_destroy(e->h2d);
    zo_stream_destroy(e->d2h);
    e->h2d = e->d2h = NULL;
}

static zo_status allocate_and_place(struct zo_engine *e)
{
    ZO_TRY(zo_stream_create(e->dev, &e->h2d));
    ZO_TRY(zo_stream_create(e->dev, &e->d2h));
    ZO_TRY(alloc_device(e));
    ZO_TRY(alloc_pinned(e));
    ZO_TRY(place_tiers(e));
    ZO_TRY(eng_grads_place(e, eng_grouped(&e->cfg)));
    ZO_TRY(alloc_host(e));
    ZO_TRY(eng_reducers_place(e));
    ZO_TRY(place_initial_states(e));
    ZO_TRY(zo_stream_synchronize(e->h2d));
    return start_optimizer(e);
}

zo_status zo_engine_finalize(zo_engine_t e)
{
    if (!e)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "NULL engine");
    if (e->finalized)
        return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS, "the engine is already finalized");
    ZO_TRY(eng_reducers_check(&e->reducers, &e->cfg)); /* the communicator: plans go without it */
    int fits;
    char msg[512];
    ZO_TRY(eng_compute_plan(e, &e->fp, &fits, msg, sizeof msg));
    if (!fits) {
        zo_status st = strncmp(msg, "device", 6) == 0 ? ZO_ERR_OUT_OF_DEVICE_MEMORY : ZO_ERR_BUDGET;
        return ZO_FAIL(st, ENG_SUBSYS, "the plan does not fit: %s", msg);
    }
    zo_status st = allocate_and_place(e);
    if (st < 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", zo_last_error());
        eng_release_tiers(e);
        return ZO_FAIL(st, ENG_SUBSYS, "finalize: %s", why);
    }
    for (int i = 0; i < e->reg.n_tensors; i++) {
        free(e->reg.tensors[i].init);
        e->reg.tensors[i].init = NULL;
    }
    e->finalized = 1;
    char a[32], b[32], c2[32], d[32];
    ZO_LOGI(ENG_SUBSYS,
            "%u chunks of %zu bytes (%u per layer at most); device %s (%u param + %u grad slots), "
            "pinned %s, host %s, nvme %s; mode %s%s",
            e->n_chunks, e->chunk_bytes, e->max_cpl,
            zo_fmt_bytes(a, sizeof a, e->fp.bytes[ZO_TIER_DEVICE]), e->device.n_pslots,
            e->device.n_gslots, zo_fmt_bytes(b, sizeof b, e->fp.pinned),
            zo_fmt_bytes(c2, sizeof c2, e->fp.bytes[ZO_TIER_HOST]),
            zo_fmt_bytes(d, sizeof d, e->fp.bytes[ZO_TIER_NVME]), zo_optim_mode_name(e->cfg.mode),
            !eng_behind_takes(e)              ? ""
            : e->cfg.mode == ZO_OPTIM_OVERLAP ? ", a clipped step's update behind the next forward"
                                              : ", the update behind the next forward");
    return ZO_OK;
}
