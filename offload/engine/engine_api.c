/* The offload engine's protocol: configuration, registration, and the step
 * (fetch, release, grads_ready, end_step), the front of zo/engine.h. Packing
 * into chunks and the plan (exact footprint per tier) live in engine_plan.c,
 * placement at finalize in engine_finalize.c, scheduling (trace, prefetch,
 * Belady eviction) in engine_sched.c, the host job thread and the optimizer
 * update pipeline in engine_optim.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_tier.h"
#include "zo/half.h"
#include "zo/nvtx.h"

/* ---- configuration ---- */

/* An engine's configuration: the plan's, and a device and paths that can hold it. */
static zo_status check_config(const zo_engine_config *c, zo_device_t dev)
{
    ZO_TRY(eng_check_plan_config(c));
    if (!dev)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "config.device is NULL");
    for (int t = c->optim_caps.bytes[ZO_TIER_DEVICE] ? ZO_TIER_DEVICE : (int)c->optim_home;
         t <= (int)c->optim_home; t++) {
        const eng_state_tier *st = eng_state_tiers[t];
        if ((zo_device_caps(dev) & st->needs_caps) != st->needs_caps)
            return ZO_FAIL(ZO_ERR_UNSUPPORTED, ENG_SUBSYS,
                           "optimizer states on the %s tier (optim_home or optim_caps) need device "
                           "capabilities (zo_device_caps) the %s device does not have: use "
                           "optim_home=host or nvme and no optim_caps.device there",
                           st->name, zo_device_backend(dev));
    }
    if (eng_state_tiers[c->optim_home]->needs_paths && (!c->nvme_paths || c->n_nvme_paths == 0))
        return ZO_FAIL(ZO_ERR_CONFIG, ENG_SUBSYS,
                       "optim_home=%s needs at least one nvme_paths entry",
                       eng_state_tiers[c->optim_home]->name);
    for (size_t i = 0; i < c->n_nvme_paths; i++)
        if (!c->nvme_paths || !c->nvme_paths[i])
            return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "nvme_paths[%zu] is NULL", i);
    return ZO_OK;
}

static void free_config_refs(struct zo_engine *e)
{
    for (size_t i = 0; e->own.paths && i < e->cfg.n_nvme_paths; i++)
        free(e->own.paths[i]);
    free(e->own.paths);
    free(e->own.engine_name);
    free(e->own.file_name);
    free(e->own.faults);
}

static char *dup_str(const char *s, int *bad)
{
    char *d = strdup(s);
    if (!d)
        *bad = 1;
    return d;
}

/* The engine keeps its own copies of the configuration's strings and arrays:
 * the caller's may be gone by finalize. */
static int copy_config_refs(struct zo_engine *e, const zo_engine_config *c)
{
    int bad = 0;
    if (c->n_nvme_paths) {
        e->own.paths = calloc(c->n_nvme_paths, sizeof *e->own.paths);
        if (!e->own.paths)
            return -1;
        for (size_t i = 0; i < c->n_nvme_paths; i++)
            e->own.paths[i] = dup_str(c->nvme_paths[i], &bad);
    }
    e->own.engine_name = dup_str(c->nvme_engine ? c->nvme_engine : "auto", &bad);
    e->own.file_name = dup_str(c->nvme_name ? c->nvme_name : "zoffload", &bad);
    e->cfg.nvme_paths = (const char *const *)e->own.paths;
    e->cfg.nvme_engine = e->own.engine_name;
    e->cfg.nvme_name = e->own.file_name;
    return bad ? -1 : 0;
}

zo_status zo_engine_init(zo_engine_t *out, const zo_engine_config *cfg)
{
    if (!out || !cfg)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "NULL argument");
    *out = NULL;
    ZO_TRY(check_config(cfg, cfg->device));
    struct zo_engine *e = calloc(1, sizeof *e);
    if (!e)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "allocating the engine");
    e->cfg = *cfg;
    e->step.lr_next = e->step.lr = cfg->adam.lr;
    e->dpu.lr = cfg->adam.lr;
    e->dev = cfg->device;
    e->mode = eng_mode_for(cfg->mode);
    eng_reducers_for(cfg, &e->reducers);
    e->cuda = (zo_device_caps(e->dev) & ZO_DEVCAP_REAL_GPU) != 0;
    e->pel = eng_param_bytes(cfg);
    if (copy_config_refs(e, cfg) < 0) {
        free_config_refs(e);
        free(e);
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "copying the configuration's paths");
    }
    pthread_mutex_init(&e->jobs.mu, NULL);
    pthread_cond_init(&e->jobs.cv, NULL);
    *out = e;
    return ZO_OK;
}

/* ---- registration ---- */

static zo_status grow(void **p, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return ZO_OK;
    int n = *cap ? *cap * 2 : 8;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, (size_t)n * elem);
    if (!q)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "growing a table to %d entries", n);
    memset((char *)q + (size_t)*cap * elem, 0, (size_t)(n - *cap) * elem);
    *p = q;
    *cap = n;
    return ZO_OK;
}

/* A new tensor of `layer` in registration order, its initial values still unset. */
static zo_status add_tensor(struct zo_engine *e, int layer, const char *name, size_t numel,
                            eng_tensor **out, int *id)
{
    if (e->finalized)
        return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS, "register '%s': the engine is already finalized",
                       name ? name : "");
    if (layer < 0 || layer < e->reg.n_layers - 1 || layer > e->reg.n_layers)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "register '%s': layer %d out of order (layers are registered in execution "
                       "order; the next is %d or %d)",
                       name ? name : "", layer, e->reg.n_layers > 0 ? e->reg.n_layers - 1 : 0,
                       e->reg.n_layers);
    ZO_TRY(grow((void **)&e->reg.tensors, &e->reg.cap_tensors, e->reg.n_tensors + 1,
                sizeof *e->reg.tensors));
    ZO_TRY(grow((void **)&e->reg.layers, &e->reg.cap_layers, layer + 1, sizeof *e->reg.layers));
    eng_layer *L = &e->reg.layers[layer];
    ZO_TRY(grow((void **)&L->tensors, &L->cap, L->n_tensors + 1, sizeof *L->tensors));
    eng_tensor *t = &e->reg.tensors[e->reg.n_tensors];
    memset(t, 0, sizeof *t);
    t->layer = layer;
    snprintf(t->name, sizeof t->name, "%s", name ? name : "");
    t->numel = numel;
    L->tensors[L->n_tensors++] = e->reg.n_tensors;
    if (layer == e->reg.n_layers)
        e->reg.n_layers++;
    if (id)
        *id = e->reg.n_tensors;
    e->reg.n_tensors++;
    *out = t;
    return ZO_OK;
}

zo_status zo_engine_register(zo_engine_t e, int layer, const char *name, size_t numel,
                             const float *init, int *id)
{
    if (!e || !init || numel == 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "register: NULL engine/init or numel 0");
    float *copy = malloc(numel * sizeof *copy);
    if (!copy)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "copying %zu initial values", numel);
    eng_tensor *t;
    zo_status st = add_tensor(e, layer, name, numel, &t, id);
    if (st < 0) {
        free(copy);
        return st;
    }
    memcpy(copy, init, numel * sizeof *copy);
    t->init = copy;
    return ZO_OK;
}

zo_status zo_engine_register_fill(zo_engine_t e, int layer, const char *name, size_t numel,
                                  zo_engine_fill_fn fill, void *ctx, int *id)
{
    if (!e || !fill || numel == 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "register_fill: NULL engine/fill or numel 0");
    eng_tensor *t;
    ZO_TRY(add_tensor(e, layer, name, numel, &t, id));
    t->fill = fill;
    t->fill_ctx = ctx;
    return ZO_OK;
}

/* Tensor id of an engine not finalized yet, for a per-tensor setting (what). */
static zo_status settable_tensor(const struct zo_engine *e, int id, const char *what)
{
    if (!e || id < 0 || id >= e->reg.n_tensors)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "%s: no tensor %d (%d registered)", what, id,
                       e ? e->reg.n_tensors : 0);
    if (e->finalized)
        return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS,
                       "%s '%s': the engine is already finalized (set it between "
                       "zo_engine_register and zo_engine_finalize)",
                       what, e->reg.tensors[id].name);
    return ZO_OK;
}

zo_status zo_engine_keep_f32_states(zo_engine_t e, int id)
{
    ZO_TRY(settable_tensor(e, id, "keep_f32_states"));
    e->reg.tensors[id].keep_f32 = 1;
    return ZO_OK;
}

zo_status zo_engine_set_weight_decay(zo_engine_t e, int id, float weight_decay)
{
    ZO_TRY(settable_tensor(e, id, "set_weight_decay"));
    if (!isfinite(weight_decay) || weight_decay < 0.0f)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "set_weight_decay '%s': %g must be finite and >= 0", e->reg.tensors[id].name,
                       (double)weight_decay);
    e->reg.tensors[id].own.set |= ENG_OWN_DECAY;
    e->reg.tensors[id].own.decay = weight_decay;
    return ZO_OK;
}

static int in_unit_interval(float x)
{
    return x >= 0.0f && x < 1.0f;
}

zo_status zo_engine_set_tensor_adam(zo_engine_t e, int id, double lr_scale, float beta1,
                                    float beta2, float eps)
{
    ZO_TRY(settable_tensor(e, id, "set_tensor_adam"));
    const char *name = e->reg.tensors[id].name;
    if (!isfinite(lr_scale) || lr_scale < 0.0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "set_tensor_adam '%s': lr_scale %g must be finite and >= 0", name, lr_scale);
    if (!in_unit_interval(beta1) || !in_unit_interval(beta2))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "set_tensor_adam '%s': betas (%g, %g) must lie in [0, 1)", name,
                       (double)beta1, (double)beta2);
    if (!isfinite(eps) || eps < 0.0f)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "set_tensor_adam '%s': eps %g must be finite and >= 0", name, (double)eps);
    eng_hyper *h = &e->reg.tensors[id].own;
    h->set |= ENG_OWN_ADAM;
    h->lr_scale = lr_scale;
    h->beta1 = beta1;
    h->beta2 = beta2;
    h->eps = eps;
    return ZO_OK;
}

int zo_engine_n_tensors(zo_engine_t e)
{
    return e ? e->reg.n_tensors : 0;
}

int zo_engine_layer_tensors(zo_engine_t e, int layer, int *ids, int cap)
{
    if (!e || layer < 0 || layer >= e->reg.n_layers)
        return 0;
    eng_layer *L = &e->reg.layers[layer];
    for (int i = 0; i < L->n_tensors && i < cap; i++)
        ids[i] = L->tensors[i];
    return L->n_tensors;
}

void zo_engine_free(zo_engine_t e)
{
    if (!e)
        return;
    eng_release_tiers(e);
    for (int i = 0; i < e->reg.n_tensors; i++)
        free(e->reg.tensors[i].init);
    for (int l = 0; l < e->reg.n_layers; l++)
        free(e->reg.layers[l].tensors);
    free(e->reg.tensors);
    free(e->reg.layers);
    free(e->chunks);
    free(e->small);
    free(e->p16_home);
    free(e->states_home);
    free(e->sched.trace);
    free(e->sched.cur);
    pthread_mutex_destroy(&e->jobs.mu);
    pthread_cond_destroy(&e->jobs.cv);
    free_config_refs(e);
    free(e);
}

zo_swap_t zo_engine_nvme_store(zo_engine_t e)
{
    return e ? e->nvme.swap : NULL;
}

zo_swap_t zo_engine_nvme_param_store(zo_engine_t e)
{
    return e ? e->nvme.pswap : NULL;
}

zo_swap_t zo_engine_nvme_grad_store(zo_engine_t e)
{
    return e ? e->grads.swap : NULL;
}

zo_status zo_engine_set_lr(zo_engine_t e, float lr)
{
    if (!e)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "set_lr: NULL engine");
    if (!isfinite(lr) || lr < 0.0f)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "set_lr: learning rate %g must be finite and >= 0", (double)lr);
    e->step.lr_next = lr;
    return ZO_OK;
}

float zo_engine_lr(zo_engine_t e)
{
    return e ? e->step.lr_next : 0.0f;
}

double zo_engine_loss_scale(zo_engine_t e)
{
    return e ? eng_loss_scale(e) : 1.0;
}

/* ---- the step protocol ---- */

/* Make the device slots safe to reuse after an abandoned step: the caller's
 * stream is fenced for slots still fetched, and events recorded after a
 * failed copy (which keep reporting it) are recorded anew on the now clean
 * copy streams; chunks whose load failed are forgotten, or reloaded at
 * their next fetch when they keep their slot. */
static void reset_slots(struct zo_engine *e)
{
    for (uint32_t s = 0; s < e->device.n_pslots; s++) {
        eng_pslot *p = &e->device.pslots[s];
        if (p->chunk >= 0 && e->chunks[p->chunk].in_use > 0 && e->compute)
            zo_event_record(p->lastuse, e->compute);
        if (p->chunk >= 0 && !e->chunks[p->chunk].pt->resident && zo_event_query(p->ready) < 0) {
            e->chunks[p->chunk].slot = -1;
            p->chunk = -1;
        }
        /* a resident slot whose copy from NVMe failed: from the master next time */
        if (p->chunk >= 0 && e->chunks[p->chunk].pt->lazy && zo_event_query(p->ready) < 0)
            e->chunks[p->chunk].reload = ENG_RELOAD_MASTER;
        zo_event_record(p->ready, e->h2d);
    }
    for (uint32_t s = 0; s < e->device.n_gslots; s++) {
        e->device.gslots[s].busy = 0;
        zo_event_record(e->device.gslots[s].drained, e->d2h);
    }
    zo_stream_synchronize(e->h2d);
    zo_stream_synchronize(e->d2h);
}

static void forget_step(struct zo_engine *e)
{
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        eng_chunk *k = &e->chunks[c];
        k->in_use = 0;
        k->grad_slot = -1;
        k->n_ready = 0;
        k->spec_done = 0;
    }
    e->sched.deviated = 1; /* this step's fetches do not become the trace */
    e->sched.n_cur = 0;
    e->step.open = 0;
    eng_reduce_forget(e);
}

/* Give up the current step after an error: drain the host jobs, fence the
 * caller's stream, undo speculative updates, forget the step's gradients.
 * The committed weights are untouched, so the step can be run again. */
static zo_status abort_step(struct zo_engine *e, zo_status st)
{
    char why[512];
    snprintf(why, sizeof why, "%s", zo_last_error());
    eng_set_async_error(e, st); /* jobs still queued skip their work */
    eng_wait_idle(e);
    e->mode->settle(e); /* a failed delayed update is dropped; a good one stays pending */
    zo_stream_synchronize(e->h2d);
    zo_stream_synchronize(e->d2h);
    eng_grads_abandon(e);
    reset_slots(e);
    eng_group_reset(e);
    for (int t = 0; t < eng_n_tiers; t++)
        if (eng_param_tiers[t]->abandon)
            eng_param_tiers[t]->abandon(eng_tier_self(e, t), e);
    e->mode->abort(e);
    forget_step(e);
    eng_take_async_error(e);
    return ZO_FAIL(st, ENG_SUBSYS, "the step was abandoned (committed weights intact): %s", why);
}

static zo_status check_async(struct zo_engine *e)
{
    char why[512];
    pthread_mutex_lock(&e->jobs.mu);
    zo_status st = e->jobs.async_st;
    snprintf(why, sizeof why, "%s", e->jobs.async_msg);
    pthread_mutex_unlock(&e->jobs.mu);
    if (st >= 0)
        return ZO_OK;
    ZO_FAIL(st, ENG_SUBSYS, "asynchronous failure: %s", why);
    return abort_step(e, st);
}

static zo_status check_layer(struct zo_engine *e, int layer)
{
    if (!e)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "NULL engine");
    if (!e->finalized)
        return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS, "call zo_engine_finalize first");
    if (layer < 0 || layer >= e->reg.n_layers)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "layer %d out of range [0, %d)", layer,
                       e->reg.n_layers);
    return ZO_OK;
}

/* The counters run on; a step reports what they gained since this. */
static void open_counters(struct zo_engine *e)
{
    for (int i = 0; i < e->stats.n_stores; i++) {
        e->stats.stores[i].at_open.struct_size = sizeof e->stats.stores[i].at_open;
        zo_swap_get_stats(e->stats.stores[i].store, &e->stats.stores[i].at_open);
    }
    e->stats.launched = 0;
    e->stats.at_open[0] = atomic_load(&e->stats.busy_ns[2]);
    e->stats.at_open[1] = atomic_load(&e->stats.optim_ns);
    e->stats.at_open[2] = atomic_load(&e->stats.nvme_ns);
    e->stats.at_open[3] = atomic_load(&e->stats.busy_ns[0]);
    e->stats.at_open[4] = atomic_load(&e->stats.busy_ns[1]);
}

/* After end_step: while an update still runs on its own thread (dpu, or
 * behind the next forward), what it moves before the next step opens counts
 * in that step, not in none (it used to be lost when the thread read a chunk
 * before the next step's first fetch). */
static void carry_counters(struct zo_engine *e)
{
    int launched = e->stats.launched;
    e->stats.carried = e->dpu.running || e->dpu.behind;
    if (e->stats.carried)
        open_counters(e);
    for (int i = 0; e->stats.carried && launched && i < e->stats.n_stores; i++)
        e->stats.stores[i].at_open = e->stats.stores[i].at_launch;
    e->stats.launched = 0;
}

static void open_step(struct zo_engine *e)
{
    if (e->step.open)
        return;
    e->step.open = 1;
    e->step.lr = e->step.lr_next;
    e->stats.step_t0 = zo_now_ns();
    zo_device_copy_get_stats(e->dev, &e->stats.copy0);
    /* a step reports what the counters gained while it was open (a DPU
     * update running across two steps counts where its time falls) */
    if (!e->stats.carried)
        open_counters(e);
    e->stats.carried = 0;
    e->sched.hits = e->sched.misses = e->sched.evictions = e->sched.prefetches = 0;
}

static zo_status take_grad_slot(struct zo_engine *e, uint32_t c, zo_stream_t compute)
{
    eng_chunk *k = &e->chunks[c];
    if (k->grad_slot >= 0)
        return ZO_OK;
    for (uint32_t s = 0; s < e->device.n_gslots; s++) {
        eng_gslot *g = &e->device.gslots[s];
        if (g->busy)
            continue;
        g->busy = 1;
        k->grad_slot = (int)s;
        /* the slot's previous gradients must have left before it is zeroed */
        ZO_TRY(zo_stream_wait_event(compute, g->drained));
        ZO_TRY(zo_memset_async(compute, g->ptr, 0, k->n_elems * e->pel));
        return eng_group_take(e, c, compute);
    }
    return ZO_FAIL(
        ZO_ERR_OUT_OF_DEVICE_MEMORY, ENG_SUBSYS,
        "fetch: all %u device gradient slots are held by layers whose gradients were not "
        "handed over yet: call zo_engine_grads_ready first",
        e->device.n_gslots);
}

static zo_status fetch_layer(struct zo_engine *e, int layer, zo_phase phase, zo_stream_t compute,
                             void **params, void **grads)
{
    eng_layer *L = &e->reg.layers[layer];
    int pos = eng_trace_push(e, layer, phase);
    if (pos < -1)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "growing the trace");
    ZO_TRY(eng_behind_redo(e)); /* a dropped update first: the step reads its values */
    ZO_TRY(eng_reduce_gather(e, layer, pos)); /* stage 3: before the loads that read them */
    /* the gradients about to come go where it reads them, unless by parity to others */
    if (phase == ZO_PHASE_BACKWARD && e->grads.bufs == 1)
        ZO_TRY(eng_behind_join(e));
    for (uint32_t i = 0; i < L->n_chunks; i++) {
        uint32_t c = L->first_chunk + i;
        ZO_TRY(eng_behind_wait(e, c, compute)); /* the last update's new values, landed */
        ZO_TRY(eng_make_resident(e, c, pos));
        e->chunks[c].in_use++;
    }
    for (uint32_t i = 0; i < L->n_chunks; i++) {
        eng_chunk *k = &e->chunks[L->first_chunk + i];
        ZO_TRY(eng_compute_wait(e, compute, e->device.pslots[k->slot].ready, L->first_chunk + i));
        if (phase == ZO_PHASE_BACKWARD)
            ZO_TRY(take_grad_slot(e, L->first_chunk + i, compute));
    }
    for (int i = 0; i < L->n_tensors; i++) {
        eng_tensor *t = &e->reg.tensors[L->tensors[i]];
        eng_chunk *k = &e->chunks[t->chunk];
        params[i] = (char *)e->device.pslots[k->slot].ptr + t->off * e->pel;
        if (phase == ZO_PHASE_BACKWARD)
            grads[i] = (char *)e->device.gslots[k->grad_slot].ptr + t->off * e->pel;
    }
    eng_prefetch(e);
    return ZO_OK;
}

zo_status zo_engine_fetch(zo_engine_t e, int layer, zo_phase phase, zo_stream_t compute,
                          void **params, void **grads, int n)
{
    ZO_TRY(check_layer(e, layer));
    if (!compute || !params || (phase == ZO_PHASE_BACKWARD && !grads))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "fetch: NULL compute stream or pointer array");
    if (phase != ZO_PHASE_FORWARD && phase != ZO_PHASE_BACKWARD)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "fetch: phase must be FORWARD or BACKWARD");
    if (n < e->reg.layers[layer].n_tensors)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "fetch: layer %d has %d tensors, arrays hold %d", layer,
                       e->reg.layers[layer].n_tensors, n);
    ZO_TRY(check_async(e));
    open_step(e);
    e->compute = compute;
    zo_status st = fetch_layer(e, layer, phase, compute, params, grads);
    if (st < 0)
        return abort_step(e, st);
    return ZO_OK;
}

zo_status zo_engine_release(zo_engine_t e, int layer, zo_stream_t compute)
{
    ZO_TRY(check_layer(e, layer));
    if (!compute)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "release: NULL compute stream");
    eng_layer *L = &e->reg.layers[layer];
    for (uint32_t i = 0; i < L->n_chunks; i++)
        if (e->chunks[L->first_chunk + i].in_use <= 0)
            return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS, "release: layer %d is not fetched", layer);
    for (uint32_t i = 0; i < L->n_chunks; i++) {
        eng_chunk *k = &e->chunks[L->first_chunk + i];
        zo_status st = zo_event_record(e->device.pslots[k->slot].lastuse, compute);
        if (st < 0)
            return abort_step(e, st);
        k->in_use--;
    }
    return check_async(e);
}

/* D2H one chunk's gradients and queue its host job. */
static zo_status hand_over_chunk(struct zo_engine *e, uint32_t c, zo_stream_t compute)
{
    eng_chunk *k = &e->chunks[c];
    eng_wait_chunk_jobs(e, c); /* the host buffer is free again */
    if (k->n_ready >= e->cfg.grad_accum_steps)
        return ZO_FAIL(
            ZO_ERR_STATE, ENG_SUBSYS,
            "grads_ready: layer %d already handed over %d micro-batches (grad_accum_steps)",
            k->layer, k->n_ready);
    k->n_ready++;
    int parity = eng_step_parity(e);
    ZO_TRY(eng_grads_stage(e, c, parity)); /* where the D2H lands */
    eng_gslot *g = &e->device.gslots[k->grad_slot];
    ZO_TRY(zo_event_record(k->computed, compute));
    ZO_TRY(zo_stream_wait_event(e->d2h, k->computed));
    ZO_TRY(eng_timed_copy(e, 1, c, k->g16[parity], g->ptr, k->n_elems * e->pel));
    ZO_TRY(zo_event_record(g->drained, e->d2h));
    g->busy = 0;
    k->grad_slot = -1;
    return eng_queue_grads_job(e, c, parity);
}

zo_status zo_engine_grads_ready(zo_engine_t e, int layer, zo_stream_t compute)
{
    ZO_TRY(check_layer(e, layer));
    if (!compute)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "grads_ready: NULL compute stream");
    ZO_TRY(check_async(e));
    /* joined at the backward's fetch already, with one set of gradient buffers */
    zo_status jst = e->grads.bufs == 1 ? eng_behind_join(e) : ZO_OK;
    if (jst < 0)
        return abort_step(e, jst);
    eng_layer *L = &e->reg.layers[layer];
    for (uint32_t i = 0; i < L->n_chunks; i++)
        if (e->chunks[L->first_chunk + i].grad_slot < 0)
            return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS,
                           "grads_ready: layer %d was not fetched for the backward phase", layer);
    for (uint32_t i = 0; i < L->n_chunks; i++) {
        uint32_t c = L->first_chunk + i;
        zo_status st = eng_grouped(&e->cfg) ? eng_group_hand_over(e, c, compute)
                                            : hand_over_chunk(e, c, compute);
        if (st < 0)
            return abort_step(e, st);
    }
    return ZO_OK;
}

/* ---- end of step ---- */

static zo_status judge_gradients(struct zo_engine *e, eng_verdict *v)
{
    memset(v, 0, sizeof *v);
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        eng_chunk *k = &e->chunks[c];
        if (k->n_ready != e->cfg.grad_accum_steps)
            return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS,
                           "end_step: layer %d handed over %d of %d micro-batch gradients",
                           k->layer, k->n_ready, e->cfg.grad_accum_steps);
        if (k->in_use > 0)
            return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS, "end_step: layer %d is still fetched",
                           k->layer);
    }
    ZO_TRY(eng_reduce_judge(e, v)); /* ZeRO's shared partials, summed by stage or here */
    if (!isfinite(v->sum_sq))
        v->overflow = 1;
    v->loss_scale = zo_engine_loss_scale(e);
    v->factor = zo_grad_scale_factor(sqrt(v->sum_sq), (float)v->loss_scale, e->cfg.max_grad_norm);
    v->plain = zo_grad_scale_factor(0.0, (float)v->loss_scale, 0.0f);
    return ZO_OK;
}

static void fill_stats(struct zo_engine *e, const eng_verdict *v, int rollbacks, zo_step_stats *s)
{
    if (!s)
        return;
    if (s->struct_size != sizeof *s) {
        ZO_LOGW(ENG_SUBSYS, "zo_step_stats.struct_size %zu != %zu: not filled", s->struct_size,
                sizeof *s);
        return;
    }
    memset(s, 0, sizeof *s);
    s->struct_size = sizeof *s;
    s->step = e->step.opt_step;
    s->grad_norm = sqrt(v->sum_sq) / v->loss_scale;
    s->overflow = v->overflow;
    s->clipped = !v->overflow && v->factor != v->plain;
    s->loss_scale = v->loss_scale;
    s->rollbacks = rollbacks;
    zo_device_copy_stats cs;
    if (zo_device_copy_get_stats(e->dev, &cs) == ZO_OK) {
        s->h2d_bytes = cs.h2d_bytes - e->stats.copy0.h2d_bytes;
        s->d2h_bytes = cs.d2h_bytes - e->stats.copy0.d2h_bytes;
    }
    for (int i = 0; i < e->stats.n_stores; i++) {
        zo_swap_stats ss = ZO_SWAP_STATS_INIT;
        if (zo_swap_get_stats(e->stats.stores[i].store, &ss) != ZO_OK)
            continue;
        const zo_swap_stats *end = e->stats.launched ? &e->stats.stores[i].at_launch : &ss;
        s->nvme_read_bytes += end->bytes_read - e->stats.stores[i].at_open.bytes_read;
        s->nvme_write_bytes += end->bytes_written - e->stats.stores[i].at_open.bytes_written;
        s->peak[ZO_TIER_NVME] += (uint64_t)ss.extents_used * e->stats.stores[i].extent_bytes;
    }
    s->step_seconds = (double)(zo_now_ns() - e->stats.step_t0) * 1e-9;
    s->stall_seconds = (double)(atomic_load(&e->stats.busy_ns[2]) - e->stats.at_open[0]) * 1e-9;
    s->optim_seconds = (double)(atomic_load(&e->stats.optim_ns) - e->stats.at_open[1]) * 1e-9;
    s->nvme_seconds = (double)(atomic_load(&e->stats.nvme_ns) - e->stats.at_open[2]) * 1e-9;
    s->h2d_seconds = (double)(atomic_load(&e->stats.busy_ns[0]) - e->stats.at_open[3]) * 1e-9;
    s->d2h_seconds = (double)(atomic_load(&e->stats.busy_ns[1]) - e->stats.at_open[4]) * 1e-9;
    s->peak[ZO_TIER_DEVICE] = e->fp.bytes[ZO_TIER_DEVICE];
    zo_hostpool_stats hs = ZO_HOSTPOOL_STATS_INIT;
    if (zo_hostpool_get_stats(e->host.pool, &hs) == ZO_OK)
        s->peak_pinned = hs.reserved_high_water;
    s->peak[ZO_TIER_HOST] = e->host.high;
    for (int t = ZO_TIER_COUNT; t < eng_n_tiers; t++) { /* registered tiers say theirs */
        uint64_t budget;
        eng_tier_usage((zo_tier)t, eng_tier_self(e, (zo_tier)t), &budget, &s->peak[t]);
    }
    s->fetch_hits = e->sched.hits;
    s->fetch_misses = e->sched.misses;
    s->evictions = e->sched.evictions;
    s->prefetches = e->sched.prefetches;
}

static void close_step(struct zo_engine *e)
{
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        e->chunks[c].n_ready = 0;
        e->chunks[c].spec_done = 0;
    }
    eng_trace_end_step(e);
    e->step.open = 0;
    e->step.steps++;
    eng_reduce_forget(e); /* the owners updated */
}

static zo_status finish_step(struct zo_engine *e, eng_verdict *v, int *rollbacks)
{
    ZO_TRY(eng_wait_idle(e));
    ZO_TRY(eng_grads_settle(e)); /* the spilled gradients are on NVMe */
    ZO_TRY(e->mode->settle(e));
    ZO_TRY(zo_stream_synchronize(e->h2d)); /* no copy still reads the host parameters */
    ZO_TRY(zo_stream_synchronize(e->d2h));
    ZO_TRY(judge_gradients(e, v));
    zo_loss_scaler saved = e->scaler;
    if (e->cfg.param_dtype == ZO_DTYPE_F16)
        ZO_TRY(zo_loss_scaler_update(&e->scaler, v->overflow));
    return e->mode->end_step(e, v, rollbacks, &saved);
}

zo_status zo_engine_end_step(zo_engine_t e, zo_step_stats *stats)
{
    if (!e)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "NULL engine");
    if (!e->finalized)
        return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS, "call zo_engine_finalize first");
    ZO_TRY(check_async(e));
    open_step(e);
    eng_verdict v;
    int rollbacks = 0;
    zo_nvtx_push("zo_engine_end_step");
    zo_status st = finish_step(e, &v, &rollbacks);
    zo_nvtx_pop();
    if (st < 0)
        return abort_step(e, st);
    close_step(e);
    fill_stats(e, &v, rollbacks, stats);
    carry_counters(e);
    return ZO_OK;
}

zo_status zo_engine_abandon_step(zo_engine_t e)
{
    if (!e)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "NULL engine");
    if (!e->finalized || !e->step.open)
        return ZO_OK; /* nothing open: an engine error already gave the step up */
    ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS, "the caller gave up the step");
    abort_step(e, ZO_ERR_STATE);
    zo_clear_error();
    return ZO_OK;
}

/* ---- reading states ---- */

zo_status zo_engine_read_master(zo_engine_t e, int id, float *out)
{
    if (!e || !out || id < 0 || id >= e->reg.n_tensors)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "read_master: bad engine, id %d or NULL out",
                       id);
    eng_tensor *t = &e->reg.tensors[id];
    if (!e->finalized)
        return eng_initial_values(e, id, out);
    ZO_TRY(eng_wait_idle(e));
    ZO_TRY(e->mode->settle(e)); /* speculative writes in flight have landed */
    ZO_TRY(eng_behind_redo(e));
    float *buf = aligned_alloc(4096, e->nvme.state_extent_bytes);
    if (!buf)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "read_master: allocating a buffer");
    zo_status st = e->chunks[t->chunk].st->read(e->chunks[t->chunk].sctx, e, t->chunk, buf);
    if (st == ZO_OK)
        memcpy(out, buf + t->off, t->numel * sizeof(float));
    free(buf);
    return st;
}
