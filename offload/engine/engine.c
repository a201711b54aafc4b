/* The offload engine: registration, packing into chunks, the plan (exact
 * footprint per tier), placement at finalize, and the step protocol (fetch,
 * release, grads_ready, end_step). Scheduling (trace, prefetch, Belady
 * eviction) lives in engine_sched.c; the host job thread and the optimizer
 * update pipeline in engine_optim.c. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_tier.h"
#include "zo/half.h"
#include "zo/nvtx.h"
#include "zo/testing.h"
#include "zo/topo.h"

#define DEFAULT_CHUNK_BYTES (4u << 20)

/* ---- configuration ---- */

static const eng_mode_ops *mode_for(zo_optim_mode m)
{
    switch (m) {
    case ZO_OPTIM_SYNC: return &eng_mode_sync;
    case ZO_OPTIM_OVERLAP: return &eng_mode_overlap;
    case ZO_OPTIM_DPU: return &eng_mode_dpu;
    }
    return &eng_mode_sync;
}

/* What a plan depends on: the homes, the mode, the dtype (no device or paths needed). */
static zo_status check_plan_config(const zo_engine_config *c)
{
    if (c->struct_size != sizeof(zo_engine_config))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "zo_engine_config.struct_size is %zu, expected %zu: initialize it with "
                       "ZO_ENGINE_CONFIG_INIT",
                       c->struct_size, sizeof(zo_engine_config));
    ZO_TRY(eng_zero_check_plan(c));
    if (c->param_dtype != ZO_DTYPE_BF16 && c->param_dtype != ZO_DTYPE_F16)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "param_dtype must be ZO_DTYPE_BF16 or ZO_DTYPE_F16");
    if ((unsigned)c->param_home > ZO_TIER_NVME || (unsigned)c->optim_home > ZO_TIER_NVME)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "param_home/optim_home must be a zo_tier");
    ZO_TRY(eng_tiers_check());
    ZO_TRY(eng_check_caps(c));
    /* under ZeRO the others' chunks may live on NVMe beside a rank's own in host memory */
    if (eng_param_tiers[c->param_home]->store && !eng_state_tiers[c->optim_home]->p16_stored &&
        c->world_size <= 1)
        return ZO_FAIL(
            ZO_ERR_UNSUPPORTED, ENG_SUBSYS,
            "param_home=nvme needs optim_home=nvme (the update writes the new 16-bit "
            "parameters through the NVMe stages); set optim_home=nvme or param_home=host");
    if (c->state_dtype != ZO_DTYPE_F32 && c->state_dtype != ZO_DTYPE_BF16 &&
        c->state_dtype != ZO_DTYPE_I8)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "state_dtype %s: expected ZO_DTYPE_F32, ZO_DTYPE_BF16 or ZO_DTYPE_I8",
                       zo_dtype_name(c->state_dtype));
    if ((unsigned)c->mode > ZO_OPTIM_DPU)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "mode must be sync, overlap or dpu");
    if (c->master_split != 0 && c->master_split != 1)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "master_split is %d: expected 0 or 1",
                       c->master_split);
    if (c->master_split && c->param_dtype != ZO_DTYPE_BF16)
        return ZO_FAIL(ZO_ERR_UNSUPPORTED, ENG_SUBSYS,
                       "master_split needs bf16 parameters (param_dtype is %s: an fp16 value is "
                       "not the fp32 master's high half); set master_split=0 or use bf16",
                       zo_dtype_name(c->param_dtype));
    if (c->master_split && c->world_size > 1)
        return ZO_FAIL(ZO_ERR_UNSUPPORTED, ENG_SUBSYS,
                       "master_split is not tested under ZeRO yet (world_size %d): set "
                       "master_split=0",
                       c->world_size);
    if (c->grad_accum_steps < 1)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "grad_accum_steps is %d, must be >= 1",
                       c->grad_accum_steps);
    if (c->micro_group < 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "micro_group is %d, must be >= 0 (0 or 1: micro-batch-major)",
                       c->micro_group);
    if (c->lookahead < 0 || c->optim_threads < 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "lookahead and optim_threads must be >= 0");
    if (c->max_grad_norm < 0 || !isfinite(c->max_grad_norm))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "max_grad_norm must be finite and >= 0");
    return ZO_OK;
}

/* An engine's configuration: the plan's, and a device and paths that can hold it. */
static zo_status check_config(const zo_engine_config *c, zo_device_t dev)
{
    ZO_TRY(check_plan_config(c));
    if (!dev)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "config.device is NULL");
    for (int t = c->optim_caps.device ? ZO_TIER_DEVICE : (int)c->optim_home;
         t <= (int)c->optim_home; t++) {
        const eng_state_tier *st = eng_state_tiers[t];
        if ((zo_device_caps(dev) & st->needs_caps) != st->needs_caps)
            return ZO_FAIL(
                ZO_ERR_UNSUPPORTED, ENG_SUBSYS,
                "optimizer states on the %s tier (optim_home or optim_caps) need a device "
                "optimizer, which exists only on the cpu device so far: use optim_home=host "
                "or nvme and no optim_caps.device on %s",
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
    for (size_t i = 0; e->paths && i < e->cfg.n_nvme_paths; i++)
        free(e->paths[i]);
    free(e->paths);
    free(e->engine_name);
    free(e->file_name);
    free(e->faults);
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
        e->paths = calloc(c->n_nvme_paths, sizeof *e->paths);
        if (!e->paths)
            return -1;
        for (size_t i = 0; i < c->n_nvme_paths; i++)
            e->paths[i] = dup_str(c->nvme_paths[i], &bad);
    }
    e->engine_name = dup_str(c->nvme_engine ? c->nvme_engine : "auto", &bad);
    e->file_name = dup_str(c->nvme_name ? c->nvme_name : "zoffload", &bad);
    e->cfg.nvme_paths = (const char *const *)e->paths;
    e->cfg.nvme_engine = e->engine_name;
    e->cfg.nvme_name = e->file_name;
    return bad ? -1 : 0;
}

zo_status zo_engine_set_swap_faults(zo_engine_t e, const zo_swap_fault *faults, size_t n)
{
    if (!e || (n && !faults))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "NULL argument");
    if (e->finalized)
        return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS, "swap faults: the engine is already finalized");
    zo_swap_fault *copy = n ? malloc(n * sizeof *copy) : NULL;
    if (n && !copy)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "copying %zu swap faults", n);
    if (n)
        memcpy(copy, faults, n * sizeof *copy);
    free(e->faults);
    e->faults = copy;
    e->n_faults = n;
    return ZO_OK;
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
    e->lr_next = e->step_lr = cfg->adam.lr;
    e->dpu_lr = cfg->adam.lr;
    e->dev = cfg->device;
    e->mode = mode_for(cfg->mode);
    e->cuda = (zo_device_caps(e->dev) & ZO_DEVCAP_REAL_GPU) != 0;
    e->e16 = 2;
    if (copy_config_refs(e, cfg) < 0) {
        free_config_refs(e);
        free(e);
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "copying the configuration's paths");
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
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
    if (layer < 0 || layer < e->n_layers - 1 || layer > e->n_layers)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "register '%s': layer %d out of order (layers are registered in execution "
                       "order; the next is %d or %d)",
                       name ? name : "", layer, e->n_layers > 0 ? e->n_layers - 1 : 0, e->n_layers);
    ZO_TRY(grow((void **)&e->tensors, &e->cap_tensors, e->n_tensors + 1, sizeof *e->tensors));
    ZO_TRY(grow((void **)&e->layers, &e->cap_layers, layer + 1, sizeof *e->layers));
    eng_layer *L = &e->layers[layer];
    ZO_TRY(grow((void **)&L->tensors, &L->cap, L->n_tensors + 1, sizeof *L->tensors));
    eng_tensor *t = &e->tensors[e->n_tensors];
    memset(t, 0, sizeof *t);
    t->layer = layer;
    snprintf(t->name, sizeof t->name, "%s", name ? name : "");
    t->numel = numel;
    L->tensors[L->n_tensors++] = e->n_tensors;
    if (layer == e->n_layers)
        e->n_layers++;
    if (id)
        *id = e->n_tensors;
    e->n_tensors++;
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

zo_status zo_engine_keep_f32_states(zo_engine_t e, int id)
{
    if (!e || id < 0 || id >= e->n_tensors)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "keep_f32_states: no tensor %d (%d registered)", id, e ? e->n_tensors : 0);
    if (e->finalized)
        return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS,
                       "keep_f32_states '%s': the engine is already finalized (mark tensors "
                       "between zo_engine_register and zo_engine_finalize)",
                       e->tensors[id].name);
    e->tensors[id].keep_f32 = 1;
    return ZO_OK;
}

/* Tensor id's initial values into dst: its copy, or what its fill writes. */
static zo_status initial_values(struct zo_engine *e, int id, float *dst)
{
    eng_tensor *t = &e->tensors[id];
    if (t->init) {
        memcpy(dst, t->init, t->numel * sizeof(float));
        return ZO_OK;
    }
    zo_status st = t->fill(t->fill_ctx, id, dst);
    if (st < 0)
        return ZO_FAIL(st, ENG_SUBSYS, "the initial values of '%s': %s", t->name, zo_last_error());
    return ZO_OK;
}

int zo_engine_n_tensors(zo_engine_t e)
{
    return e ? e->n_tensors : 0;
}

int zo_engine_layer_tensors(zo_engine_t e, int layer, int *ids, int cap)
{
    if (!e || layer < 0 || layer >= e->n_layers)
        return 0;
    eng_layer *L = &e->layers[layer];
    for (int i = 0; i < L->n_tensors && i < cap; i++)
        ids[i] = L->tensors[i];
    return L->n_tensors;
}

/* ---- packing and the plan ---- */

/* The chunk size: the configured one (0: 4 MiB) raised to the largest
 * tensor's 16-bit bytes, rounded to 4 KiB. */
static size_t chunk_bytes_for(const zo_engine_config *c, size_t largest_numel)
{
    size_t cb = c->chunk_bytes ? c->chunk_bytes : DEFAULT_CHUNK_BYTES;
    size_t largest = largest_numel * 2;
    return zo_round_up(largest > cb ? largest : cb, 4096);
}

/* Host 16-bit gradient buffers per chunk: by step parity for the delayed update. */
static int g_bufs_for(const zo_engine_config *c)
{
    return mode_for(c->mode)->grad_bufs;
}

/* The packing rule, shared by the engine and zo_engine_footprint_for:
 * tensors in registration order, each at a 256-byte aligned offset (with
 * 8-bit states, at a block of their scales, so no block spans two tensors
 * and a checkpoint reads and writes each tensor's blocks whole); a new chunk
 * starts at every layer and wherever the next tensor does not fit. */
typedef struct eng_packer {
    size_t chunk_elems;
    size_t align; /* tensor offsets, in elements: 256 bytes, or an I8 state block */
    int layer;    /* layer of the open chunk, -1 before the first */
    size_t off;   /* elements used in the open chunk */
    uint32_t n_chunks;
    uint32_t layer_chunks, max_cpl;
    size_t max_used;      /* elements of the fullest chunk */
    zo_dtype state_dtype; /* I8: tensors with fp32 moments take their room (tensor_room) */
} eng_packer;

/* The elements a tensor takes in its chunk: its own, or when it keeps fp32
 * moments (eng_keeps_f32) the room of them in the code bytes (zo/optim.h). */
static size_t tensor_room(zo_dtype state_dtype, size_t numel, int keep)
{
    return eng_keeps_f32(state_dtype, numel, keep) ? zo_adam_q8_small_room(numel) : numel;
}

/* Place a tensor; returns the chunk it goes to, its offset in *at. */
static uint32_t packer_place(eng_packer *p, int layer, size_t numel, int keep, size_t *at)
{
    size_t pos = zo_round_up(p->off, p->align);
    numel = tensor_room(p->state_dtype, numel, keep);
    if (p->n_chunks == 0 || layer != p->layer || pos + numel > p->chunk_elems) {
        p->layer_chunks = layer != p->layer ? 1 : p->layer_chunks + 1;
        if (p->layer_chunks > p->max_cpl)
            p->max_cpl = p->layer_chunks;
        p->layer = layer;
        p->n_chunks++;
        pos = 0;
    }
    p->off = pos + numel;
    if (p->off > p->max_used)
        p->max_used = p->off;
    *at = pos;
    return p->n_chunks - 1;
}

/* What the footprint depends on besides the configuration. */
typedef struct eng_shape {
    uint64_t chunk_bytes, chunk_elems;
    uint32_t n_chunks, max_cpl;
    uint64_t n_params;
    uint64_t max_chunk_elems;   /* elements of the fullest chunk (sizes the swap extents) */
    const uint64_t *used_elems; /* each chunk's used elements, for the homes (NULL: all full) */
} eng_shape;

static size_t tensor_align(const zo_engine_config *c)
{
    return c->state_dtype == ZO_DTYPE_I8 ? ZO_ADAM_Q8_BLOCK : ENG_TENSOR_ALIGN;
}

/* A buffer of one chunk's states at the chunk's stride. */
static uint64_t state_extent_bytes_for(const zo_engine_config *c, const eng_shape *sh)
{
    return eng_states_io_bytes(c->state_dtype, sh->chunk_elems);
}

/* The placement: each chunk's home for its 16-bit parameters and for its
 * optimizer states, into p16[c] and states[c], by the rule of
 * engine_place.c. The engine (pack) and the planner (zo_engine_footprint_for)
 * both take their homes from here, so the planner's footprint stays the
 * engine's. */
static void choose_homes(const zo_engine_config *c, const eng_shape *sh, uint8_t *p16,
                         uint8_t *states)
{
    eng_place_homes(c, sh->n_chunks, sh->chunk_bytes, sh->used_elems, p16, states);
}

/* What the tiers' accounting sees of a packed model under configuration c
 * with the homes chosen for its chunks. */
static eng_plan_in plan_in(const zo_engine_config *c, const eng_shape *sh, const uint8_t *p16,
                           const uint8_t *states)
{
    eng_plan_in in = {0};
    in.cfg = c;
    in.p16_home = p16;
    in.states_home = states;
    in.chunk_bytes = sh->chunk_bytes;
    in.chunk_elems = sh->chunk_elems;
    in.n_chunks = sh->n_chunks;
    in.max_cpl = sh->max_cpl;
    in.max_chunk_elems = sh->max_chunk_elems;
    in.mode_p16_behind = mode_for(c->mode)->p16_behind;
    in.mode_backups = mode_for(c->mode)->backups;
    in.grad_bufs = mode_for(c->mode)->grad_bufs;
    in.grouped = eng_grouped(c);
    eng_plan_flags(&in);
    return in;
}

/* Each chunk's tables for its homes, and the host copies of its 16-bit parameters. */
static void place_homes(struct zo_engine *e, const eng_plan_in *in)
{
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        eng_chunk *k = &e->chunks[c];
        k->pt = eng_p16_home(in, c) == ENG_HOME_REMOTE ? &eng_param_tier_remote
                : eng_p16_nvme_backed(in, c)           ? &eng_param_tier_device_nvme
                                                       : eng_param_tiers[eng_p16_home(in, c)];
        k->owner = eng_zero_owner(&e->cfg, e->n_chunks, c);
        k->zpart = eng_zero_p3(&e->cfg) && !eng_zero_persists(&e->cfg, k->n_elems);
        k->zg_slot = -1;
        k->st = eng_states_home(in, c) == ENG_HOME_REMOTE ? &eng_state_tier_remote
                                                          : eng_state_tiers[eng_states_home(in, c)];
        k->p16_bufs = eng_p16_bufs(in, c);
        k->g_staged = eng_grads_staged(in, c);
    }
    e->g_grouped = in->grouped; /* what comes down (the stages' room needs it) */
}

/* With I8 states, a tensor with fp32 moments joins its chunk's list, in
 * placement order: the update runs it apart (eng_adam_run). */
static void add_small(struct zo_engine *e, const eng_tensor *t)
{
    if (!eng_keeps_f32(e->cfg.state_dtype, t->numel, t->keep_f32))
        return;
    eng_chunk *k = &e->chunks[t->chunk];
    if (!k->n_small)
        k->small_first = e->n_small;
    e->small[e->n_small++] = (eng_span){t->off, t->numel};
    k->n_small++;
}

/* Assign every tensor a chunk and an offset; chunks never span layers. */
static zo_status pack(struct zo_engine *e)
{
    if (e->n_tensors == 0)
        return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS, "no tensors registered: register the model first");
    size_t largest = 0;
    const zo_dtype sd = e->cfg.state_dtype;
    for (int i = 0; i < e->n_tensors; i++) {
        const eng_tensor *t = &e->tensors[i];
        if (tensor_room(sd, t->numel, t->keep_f32) > largest)
            largest = tensor_room(sd, t->numel, t->keep_f32);
    }
    e->chunk_bytes = chunk_bytes_for(&e->cfg, largest);
    if (largest * e->e16 > (e->cfg.chunk_bytes ? e->cfg.chunk_bytes : DEFAULT_CHUNK_BYTES))
        ZO_LOGI(ENG_SUBSYS, "chunk size raised to %zu bytes to fit the largest tensor",
                e->chunk_bytes);
    e->chunk_elems = e->chunk_bytes / e->e16;
    free(e->chunks);
    free(e->small);
    e->chunks = calloc((size_t)e->n_tensors, sizeof *e->chunks); /* at most one chunk per tensor */
    e->small = calloc((size_t)e->n_tensors, sizeof *e->small);
    e->n_small = 0;
    if (!e->chunks || !e->small)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "allocating the chunk table");
    eng_packer pk = {e->chunk_elems, tensor_align(&e->cfg), -1, 0, 0, 0, 0, 0, sd};
    for (int l = 0; l < e->n_layers; l++) { /* registration order: layers in order */
        eng_layer *L = &e->layers[l];
        L->first_chunk = pk.n_chunks;
        for (int i = 0; i < L->n_tensors; i++) {
            eng_tensor *t = &e->tensors[L->tensors[i]];
            t->chunk = packer_place(&pk, l, t->numel, t->keep_f32, &t->off);
            e->chunks[t->chunk].layer = l;
            e->chunks[t->chunk].n_elems = t->off + tensor_room(sd, t->numel, t->keep_f32);
            add_small(e, t);
        }
        L->n_chunks = pk.n_chunks - L->first_chunk;
    }
    e->n_chunks = pk.n_chunks;
    e->max_cpl = pk.max_cpl;
    e->g_bufs = g_bufs_for(&e->cfg);
    eng_shape sh = {e->chunk_bytes, e->chunk_elems, e->n_chunks, e->max_cpl, 0, pk.max_used, NULL};
    e->state_extent_bytes = state_extent_bytes_for(&e->cfg, &sh);
    e->nvme_state_extent = zo_engine_nvme_state_bytes_as(e->cfg.state_dtype, pk.max_used);
    e->p16_extent = eng_p16_extent(pk.max_used);
    free(e->p16_home);
    free(e->states_home);
    e->p16_home = malloc(e->n_chunks);
    e->states_home = malloc(e->n_chunks);
    uint64_t *used = malloc(e->n_chunks * sizeof *used);
    if (!e->p16_home || !e->states_home || !used) {
        free(used);
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "allocating the chunks' homes");
    }
    for (uint32_t c = 0; c < e->n_chunks; c++)
        used[c] = e->chunks[c].n_elems;
    sh.used_elems = used;
    choose_homes(&e->cfg, &sh, e->p16_home, e->states_home);
    free(used);
    eng_plan_in in = plan_in(&e->cfg, &sh, e->p16_home, e->states_home);
    place_homes(e, &in);
    return ZO_OK;
}

/* The engine's device budget: device_bytes, but never more than the device
 * has free now (so a plan that fits never fails at allocation). */
static uint64_t device_budget(struct zo_engine *e)
{
    zo_device_mem_stats ms;
    uint64_t free_now = 0;
    if (zo_device_mem_get_stats(e->dev, &ms) == ZO_OK && ms.budget > ms.in_use)
        free_now = ms.budget - ms.in_use;
    if (e->cfg.device_bytes && e->cfg.device_bytes < free_now)
        return e->cfg.device_bytes;
    return free_now;
}

static int shortfall(char *msg, size_t cap, const char *tier, uint64_t need, uint64_t budget,
                     const char *what)
{
    char a[32], b[32];
    if (msg && cap)
        snprintf(msg, cap,
                 "%s tier: the plan needs %" PRIu64 " bytes (%s; %s) but the budget is %" PRIu64
                 " bytes (%s): short by %" PRIu64 " bytes",
                 tier, need, zo_fmt_bytes(a, sizeof a, need), what, budget,
                 zo_fmt_bytes(b, sizeof b, budget), need - budget);
    return 0;
}

/* The device's parameter slots: one for good per chunk homed where they
 * stay resident, and room for the others' layers (at least the widest
 * layer's chunks, at most one per chunk). */
static uint64_t plan_pslots(const eng_plan_in *in, uint64_t budget, uint64_t fixed, int *fits,
                            char *msg, size_t cap)
{
    uint64_t cb = in->chunk_bytes, nc = in->n_chunks, resident = 0;
    for (uint32_t c = 0; c < in->n_chunks; c++)
        resident += eng_p16_home(in, c) != ENG_HOME_REMOTE &&
                    eng_param_tiers[eng_p16_home(in, c)]->resident;
    uint64_t min_pslots = resident + (resident < nc ? in->max_cpl : 0);
    uint64_t need = min_pslots * cb + fixed;
    if (need > budget) {
        *fits =
            shortfall(msg, cap, "device", need, budget,
                      resident == nc ? "every parameter chunk resident, one layer's gradient chunks"
                                     : "one layer's parameter and gradient chunks");
        return min_pslots;
    }
    if (resident == nc)
        return min_pslots;
    uint64_t room = (budget - fixed) / cb, most = nc;
    if (eng_zero_p3(in->cfg) && resident + eng_zero_gather_slots(in->cfg, in->max_cpl) < most)
        most = resident + eng_zero_gather_slots(in->cfg, in->max_cpl); /* no cache of others' */
    if (most < min_pslots)
        most = min_pslots;
    return room < most ? room : most;
}

/* The exact bytes finalize allocates in each tier, as engine.h documents
 * them, for a packed model under configuration c and a device budget: the
 * engine's own buffers here, each home's through its tier's accounting. */
static void plan_tiers(const zo_engine_config *c, const eng_shape *sh, const uint8_t *p16_home,
                       const uint8_t *states_home, uint64_t budget, zo_engine_footprint *fp,
                       uint32_t g_split[2], int *fits, char *msg, size_t cap)
{
    uint64_t cb = sh->chunk_bytes, ce = sh->chunk_elems, nc = sh->n_chunks;
    memset(fp, 0, sizeof *fp);
    fp->struct_size = sizeof *fp;
    fp->chunk_bytes = cb;
    fp->n_chunks = (uint32_t)nc;
    fp->max_chunks_per_layer = sh->max_cpl;
    fp->n_params = sh->n_params;
    *fits = 1;
    if (msg && cap)
        msg[0] = 0;
    eng_plan_in in = plan_in(c, sh, p16_home, states_home);

    /* optimizer states first: their device share leaves the room for parameter slots */
    zo_engine_footprint t = {0};
    for (int i = 0; i < ENG_N_TIERS; i++)
        eng_state_tiers[i]->account(&in, &t);
    /* gradient slots, and their fp32 sums when grouped */
    uint64_t grads = sh->max_cpl * cb * (eng_grouped(c) ? 3 : 1);
    in.pslots = plan_pslots(&in, budget, grads + t.device, fits, msg, cap);
    for (int i = 0; i < ENG_N_TIERS; i++)
        eng_param_tiers[i]->account(&in, &t);
    fp->device_param_slots = (uint32_t)in.pslots;
    fp->device_grad_slots = sh->max_cpl;
    fp->device = in.pslots * cb + grads + t.device;

    /* pinned: host 16-bit params and NVMe staging (tiers); host (pageable): optimizer
     * states and overlap backups (tiers), fp32 accumulators; nvme: two extents per chunk
     * (current and alternate); then the 16-bit gradients within what the host has left */
    fp->param_gather = eng_zero_gather_bytes(c, sh->max_cpl, cb);
    fp->pinned = t.pinned + fp->param_gather;
    fp->param_staging = t.param_staging;
    fp->host = t.host;
    if (eng_host_accumulates(c))
        fp->host += nc * (uint64_t)g_bufs_for(c) * ce * sizeof(float);
    fp->host += eng_zero_host_bytes(c, (uint32_t)nc, ce);
    fp->nvme = t.nvme;
    eng_grads_account(&in, fp, &g_split[0], &g_split[1]);
    if (*fits && c->pinned_bytes && fp->pinned > c->pinned_bytes)
        *fits = shortfall(msg, cap, "pinned", fp->pinned, c->pinned_bytes,
                          "16-bit parameter and gradient copies, NVMe staging");

    /* the host tier: pinned and pageable together, under one budget */
    if (*fits && c->host_bytes && fp->pinned + fp->host > c->host_bytes)
        *fits = shortfall(msg, cap, "host", fp->pinned + fp->host, c->host_bytes,
                          "pinned + pageable: 16-bit copies, gradients, NVMe staging, optimizer "
                          "states, backups, accumulators");

    if (*fits && c->nvme_bytes && fp->nvme > c->nvme_bytes)
        *fits = shortfall(msg, cap, "nvme", fp->nvme, c->nvme_bytes,
                          "optimizer states, two extents per chunk, spilled gradients");
}

static zo_status compute_plan(struct zo_engine *e, zo_engine_footprint *fp, int *fits, char *msg,
                              size_t cap)
{
    ZO_TRY(pack(e));
    eng_shape sh = {e->chunk_bytes, e->chunk_elems, e->n_chunks, e->max_cpl, 0, 0, NULL};
    for (uint32_t i = 0; i < e->n_chunks; i++)
        if (e->chunks[i].n_elems > sh.max_chunk_elems)
            sh.max_chunk_elems = e->chunks[i].n_elems;
    for (int i = 0; i < e->n_tensors; i++)
        sh.n_params += e->tensors[i].numel;
    uint32_t g_split[2];
    plan_tiers(&e->cfg, &sh, e->p16_home, e->states_home, device_budget(e), fp, g_split, fits, msg,
               cap);
    e->g_kept_chunks = g_split[0];
    e->g_spilled_chunks = g_split[1];
    return ZO_OK;
}

zo_status zo_engine_plan(zo_engine_t e, zo_engine_footprint *fp, int *fits, char *msg, size_t cap)
{
    if (!e || !fp || !fits)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "NULL argument");
    if (e->finalized) {
        *fp = e->fp;
        *fits = 1;
        if (msg && cap)
            msg[0] = 0;
        return ZO_OK;
    }
    return compute_plan(e, fp, fits, msg, cap);
}

static zo_status check_layout(const zo_engine_layout *ly)
{
    if (ly->struct_size != sizeof(zo_engine_layout))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "zo_engine_layout.struct_size is %zu, expected %zu: initialize it with "
                       "ZO_ENGINE_LAYOUT_INIT",
                       ly->struct_size, sizeof(zo_engine_layout));
    if (ly->n_tensors == 0 || !ly->numel || !ly->layer)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "layout: %zu tensors, numel %s, layer %s: expected at least one tensor and "
                       "both arrays",
                       ly->n_tensors, ly->numel ? "set" : "NULL", ly->layer ? "set" : "NULL");
    for (size_t i = 0; i < ly->n_tensors; i++) {
        int prev = i ? ly->layer[i - 1] : 0, next = i ? prev + 1 : 0;
        if (ly->numel[i] == 0 || ly->layer[i] < prev || ly->layer[i] > next)
            return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                           "layout tensor %zu: numel %zu, layer %d after layer %d: expected numel "
                           "> 0 and the layer equal to the previous tensor's or one more (from 0)",
                           i, ly->numel[i], ly->layer[i], prev);
    }
    return ZO_OK;
}

/* Whether the layout's tensor i was marked to keep fp32 moments. */
static int layout_keeps_f32(const zo_engine_layout *ly, size_t i)
{
    return ly->keep_f32 && ly->keep_f32[i];
}

/* Pack a layout as the engine would; chunk c's layer and used bytes go to
 * chunks[c] for c < cap. */
static zo_status pack_layout(const zo_engine_config *cfg, const zo_engine_layout *layout,
                             zo_engine_chunk_info *chunks, size_t cap, eng_shape *sh)
{
    ZO_TRY(check_plan_config(cfg));
    ZO_TRY(check_layout(layout));
    size_t largest = 0;
    const zo_dtype sd = cfg->state_dtype;
    for (size_t i = 0; i < layout->n_tensors; i++)
        if (tensor_room(sd, layout->numel[i], layout_keeps_f32(layout, i)) > largest)
            largest = tensor_room(sd, layout->numel[i], layout_keeps_f32(layout, i));
    memset(sh, 0, sizeof *sh);
    sh->chunk_bytes = chunk_bytes_for(cfg, largest);
    sh->chunk_elems = sh->chunk_bytes / 2;
    eng_packer pk = {sh->chunk_elems, tensor_align(cfg), -1, 0, 0, 0, 0, 0, sd};
    for (size_t i = 0; i < layout->n_tensors; i++) {
        size_t at;
        int keep = layout_keeps_f32(layout, i);
        uint32_t c = packer_place(&pk, layout->layer[i], layout->numel[i], keep, &at);
        if (c < cap) {
            chunks[c].layer = layout->layer[i];
            chunks[c].used_bytes = (uint64_t)(at + tensor_room(sd, layout->numel[i], keep)) * 2;
        }
        sh->n_params += layout->numel[i];
    }
    sh->n_chunks = pk.n_chunks;
    sh->max_cpl = pk.max_cpl;
    sh->max_chunk_elems = pk.max_used;
    return ZO_OK;
}

zo_status zo_engine_footprint_for(const zo_engine_config *cfg, const zo_engine_layout *layout,
                                  zo_engine_footprint *fp, int *fits, char *msg, size_t cap)
{
    if (!cfg || !layout || !fp || !fits)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "NULL argument");
    eng_shape sh;
    ZO_TRY(pack_layout(cfg, layout, NULL, 0, &sh));
    uint8_t *p16 = malloc(sh.n_chunks), *states = malloc(sh.n_chunks);
    zo_engine_chunk_info *info = calloc(sh.n_chunks, sizeof *info);
    uint64_t *used = malloc(sh.n_chunks * sizeof *used);
    if (!p16 || !states || !info || !used) {
        free(p16);
        free(states);
        free(info);
        free(used);
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "allocating %u chunks' homes", sh.n_chunks);
    }
    ZO_TRY(pack_layout(cfg, layout, info, sh.n_chunks, &sh)); /* each chunk's used bytes */
    for (uint32_t c = 0; c < sh.n_chunks; c++)
        used[c] = info[c].used_bytes / 2;
    free(info);
    sh.used_elems = used;
    choose_homes(cfg, &sh, p16, states);
    sh.used_elems = NULL;
    free(used);
    uint32_t g_split[2];
    plan_tiers(cfg, &sh, p16, states, cfg->device_bytes ? cfg->device_bytes : UINT64_MAX, fp,
               g_split, fits, msg, cap);
    free(p16);
    free(states);
    return ZO_OK;
}

zo_status zo_engine_chunks_for(const zo_engine_config *cfg, const zo_engine_layout *layout,
                               zo_engine_chunk_info *chunks, size_t cap, uint32_t *n_chunks)
{
    if (!cfg || !layout || !n_chunks || (cap && !chunks))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "NULL argument");
    eng_shape sh;
    ZO_TRY(pack_layout(cfg, layout, chunks, cap, &sh));
    *n_chunks = sh.n_chunks;
    return ZO_OK;
}

zo_status zo_engine_footprint_get(zo_engine_t e, zo_engine_footprint *fp)
{
    if (!e || !fp)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "NULL argument");
    if (!e->finalized)
        return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS, "the engine is not finalized yet");
    *fp = e->fp;
    return ZO_OK;
}

zo_status zo_engine_homes(zo_engine_t e, uint32_t params[3], uint32_t optim[3])
{
    if (!e)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "NULL argument");
    if (!e->finalized)
        return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS, "the engine is not finalized yet");
    for (int t = 0; t < ENG_N_TIERS; t++) {
        if (params)
            params[t] = 0;
        if (optim)
            optim[t] = 0;
    }
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        if (params)
            params[e->p16_home[c]] += e->p16_home[c] != ENG_HOME_REMOTE; /* stage 3 */
        if (optim && e->states_home[c] != ENG_HOME_REMOTE)               /* ZeRO: another rank's */
            optim[e->states_home[c]]++;
    }
    return ZO_OK;
}

/* ---- finalize: allocate every tier and place the initial states ---- */

static zo_status alloc_device(struct zo_engine *e)
{
    uint64_t cb = e->chunk_bytes;
    e->n_pslots = e->fp.device_param_slots;
    e->n_gslots = e->fp.device_grad_slots;
    ZO_TRY(zo_device_malloc(e->dev, e->n_pslots * cb, &e->dev_params));
    ZO_TRY(zo_device_malloc(e->dev, e->n_gslots * cb, &e->dev_grads));
    e->pslots = calloc(e->n_pslots, sizeof *e->pslots);
    e->gslots = calloc(e->n_gslots, sizeof *e->gslots);
    if (!e->pslots || !e->gslots)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "allocating slot tables");
    for (uint32_t s = 0; s < e->n_pslots; s++) {
        e->pslots[s].ptr = (char *)e->dev_params + s * cb;
        e->pslots[s].chunk = -1;
        ZO_TRY(zo_event_create(e->dev, &e->pslots[s].ready));
        ZO_TRY(zo_event_create(e->dev, &e->pslots[s].lastuse));
    }
    for (uint32_t c = 0; c < e->n_chunks; c++)
        ZO_TRY(zo_event_create(e->dev, &e->chunks[c].computed));
    for (uint32_t s = 0; s < e->n_gslots; s++) {
        e->gslots[s].ptr = (char *)e->dev_grads + s * cb;
        ZO_TRY(zo_event_create(e->dev, &e->gslots[s].drained));
    }
    return eng_group_alloc(e);
}

/* The pinned pool the tiers and the gradients take their buffers from. */
static zo_status alloc_pinned(struct zo_engine *e)
{
    zo_hostpool_config pc = ZO_HOSTPOOL_CONFIG_INIT;
    pc.max_pinned_bytes = e->cfg.pinned_bytes ? e->cfg.pinned_bytes : e->fp.pinned;
    pc.node = e->cfg.host_node; /* the optimizer's workers follow it (start_pool) */
    return zo_hostpool_init(&e->pool, e->dev, &pc);
}

/* Every tier with chunks homed there reserves their storage: the states'
 * tiers first (the NVMe stages they take also carry 16-bit parameters). */
static zo_status place_tiers(struct zo_engine *e)
{
    for (int t = 0; t < ENG_N_TIERS; t++)
        if (eng_chunks_at(e, 1, eng_state_tiers[t]))
            ZO_TRY(eng_state_tiers[t]->place(e));
    for (int t = 0; t < ENG_N_TIERS; t++) /* NVMe also keeps the backed chunks' copies */
        if (t == ZO_TIER_NVME ? eng_p16_on_nvme(e) : eng_chunks_at(e, 0, eng_param_tiers[t]))
            ZO_TRY(eng_param_tiers[t]->place(e));
    return ZO_OK;
}

/* The fp32 gradient accumulators (eng_host_accumulates). */
static zo_status alloc_host(struct zo_engine *e)
{
    uint64_t nc = e->n_chunks;
    if (eng_host_accumulates(&e->cfg))
        ZO_TRY(eng_host_alloc(e, nc * (uint64_t)e->g_bufs * e->chunk_elems * sizeof(float),
                              &e->host_acc));
    for (uint32_t c = 0; c < nc; c++)
        for (int b = 0; e->host_acc && b < e->g_bufs; b++)
            e->chunks[c].acc[b] = e->host_acc + ((uint64_t)b * nc + c) * e->chunk_elems;
    return ZO_OK;
}

/* The initial master weights of chunk c (gaps zero) into dst (chunk_elems floats). */
static zo_status fill_master(struct zo_engine *e, uint32_t c, float *dst)
{
    memset(dst, 0, e->chunk_elems * sizeof(float));
    eng_layer *L = &e->layers[e->chunks[c].layer];
    for (int i = 0; i < L->n_tensors; i++) {
        eng_tensor *t = &e->tensors[L->tensors[i]];
        if (t->chunk == c)
            ZO_TRY(initial_values(e, L->tensors[i], dst + t->off));
    }
    return ZO_OK;
}

/* Each chunk's initial states and 16-bit parameters, through its homes;
 * then the device sees them. */
static zo_status place_initial_states(struct zo_engine *e)
{
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        eng_chunk *k = &e->chunks[c];
        float *st = k->st->init_buf(e, c);
        memset(st, 0, eng_states_bytes(e->cfg.state_dtype, e->chunk_elems));
        ZO_TRY(fill_master(e, c, st));
        ZO_TRY(k->st->init(e, c, st));
        ZO_TRY(k->pt->write(e, c, st, 1));
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
    if (zo_hostpool_get_placement(e->pool, &pl) == ZO_OK &&
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

static void release_tiers(struct zo_engine *e)
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
    for (int t = 0; t < ENG_N_TIERS; t++)
        eng_param_tiers[t]->release(e);
    for (int t = 0; t < ENG_N_TIERS; t++)
        eng_state_tiers[t]->release(e);
    e->n_stores = 0;
    zo_hostpool_free(e->pool);
    e->pool = NULL;
    free(e->host_acc);
    e->host_acc = NULL;
    eng_zero_release(e);
    eng_pipe_release(e);
    e->host_bytes = 0;
    for (uint32_t s = 0; e->pslots && s < e->n_pslots; s++) {
        zo_event_destroy(e->pslots[s].ready);
        zo_event_destroy(e->pslots[s].lastuse);
    }
    eng_group_release(e);
    for (uint32_t s = 0; e->gslots && s < e->n_gslots; s++) {
        zo_event_destroy(e->gslots[s].drained);
    }
    for (uint32_t c = 0; e->chunks && c < e->n_chunks; c++) {
        zo_event_destroy(e->chunks[c].computed);
        e->chunks[c].computed = NULL;
    }
    free(e->pslots);
    free(e->gslots);
    e->pslots = NULL;
    e->gslots = NULL;
    zo_device_mfree(e->dev, e->dev_params);
    zo_device_mfree(e->dev, e->dev_grads);
    e->dev_params = e->dev_grads = NULL;
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
    ZO_TRY(eng_zero_place(e));
    ZO_TRY(eng_pipe_place(e));
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
    ZO_TRY(eng_zero_check(&e->cfg)); /* the communicator: plans go without it */
    int fits;
    char msg[512];
    ZO_TRY(compute_plan(e, &e->fp, &fits, msg, sizeof msg));
    if (!fits) {
        zo_status st = strncmp(msg, "device", 6) == 0 ? ZO_ERR_OUT_OF_DEVICE_MEMORY : ZO_ERR_BUDGET;
        return ZO_FAIL(st, ENG_SUBSYS, "the plan does not fit: %s", msg);
    }
    zo_status st = allocate_and_place(e);
    if (st < 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", zo_last_error());
        release_tiers(e);
        return ZO_FAIL(st, ENG_SUBSYS, "finalize: %s", why);
    }
    for (int i = 0; i < e->n_tensors; i++) {
        free(e->tensors[i].init);
        e->tensors[i].init = NULL;
    }
    e->finalized = 1;
    char a[32], b[32], c2[32], d[32];
    ZO_LOGI(ENG_SUBSYS,
            "%u chunks of %zu bytes (%u per layer at most); device %s (%u param + %u grad slots), "
            "pinned %s, host %s, nvme %s; mode %s",
            e->n_chunks, e->chunk_bytes, e->max_cpl, zo_fmt_bytes(a, sizeof a, e->fp.device),
            e->n_pslots, e->n_gslots, zo_fmt_bytes(b, sizeof b, e->fp.pinned),
            zo_fmt_bytes(c2, sizeof c2, e->fp.host), zo_fmt_bytes(d, sizeof d, e->fp.nvme),
            zo_optim_mode_name(e->cfg.mode));
    return ZO_OK;
}

void zo_engine_free(zo_engine_t e)
{
    if (!e)
        return;
    release_tiers(e);
    for (int i = 0; i < e->n_tensors; i++)
        free(e->tensors[i].init);
    for (int l = 0; l < e->n_layers; l++)
        free(e->layers[l].tensors);
    free(e->tensors);
    free(e->layers);
    free(e->chunks);
    free(e->small);
    free(e->p16_home);
    free(e->states_home);
    free(e->trace);
    free(e->cur);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free_config_refs(e);
    free(e);
}

zo_swap_t zo_engine_nvme_store(zo_engine_t e)
{
    return e ? e->swap : NULL;
}

zo_swap_t zo_engine_nvme_param_store(zo_engine_t e)
{
    return e ? e->pswap : NULL;
}

zo_swap_t zo_engine_nvme_grad_store(zo_engine_t e)
{
    return e ? e->gswap : NULL;
}

zo_status zo_engine_set_lr(zo_engine_t e, float lr)
{
    if (!e)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "set_lr: NULL engine");
    if (!isfinite(lr) || lr < 0.0f)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "set_lr: learning rate %g must be finite and >= 0", (double)lr);
    e->lr_next = lr;
    return ZO_OK;
}

float zo_engine_lr(zo_engine_t e)
{
    return e ? e->lr_next : 0.0f;
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
    for (uint32_t s = 0; s < e->n_pslots; s++) {
        eng_pslot *p = &e->pslots[s];
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
    for (uint32_t s = 0; s < e->n_gslots; s++) {
        e->gslots[s].busy = 0;
        zo_event_record(e->gslots[s].drained, e->d2h);
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
    e->deviated = 1; /* this step's fetches do not become the trace */
    e->n_cur = 0;
    e->step_open = 0;
    eng_zero_forget_gathers(e);
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
    for (int t = 0; t < ENG_N_TIERS; t++)
        if (eng_param_tiers[t]->abandon)
            eng_param_tiers[t]->abandon(e);
    e->mode->abort(e);
    forget_step(e);
    eng_take_async_error(e);
    return ZO_FAIL(st, ENG_SUBSYS, "the step was abandoned (committed weights intact): %s", why);
}

static zo_status check_async(struct zo_engine *e)
{
    char why[512];
    pthread_mutex_lock(&e->mu);
    zo_status st = e->async_st;
    snprintf(why, sizeof why, "%s", e->async_msg);
    pthread_mutex_unlock(&e->mu);
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
    if (layer < 0 || layer >= e->n_layers)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "layer %d out of range [0, %d)", layer,
                       e->n_layers);
    return ZO_OK;
}

static void open_step(struct zo_engine *e)
{
    if (e->step_open)
        return;
    e->step_open = 1;
    e->step_lr = e->lr_next;
    e->step_t0 = zo_now_ns();
    zo_device_copy_get_stats(e->dev, &e->copy0);
    for (int i = 0; i < e->n_stores; i++) {
        e->stores[i].at_open.struct_size = sizeof e->stores[i].at_open;
        zo_swap_get_stats(e->stores[i].store, &e->stores[i].at_open);
    }
    /* the counters run on; a step reports what they gained while it was open
     * (a DPU update running across two steps counts where its time falls) */
    e->at_open[0] = atomic_load(&e->busy_ns[2]);
    e->at_open[1] = atomic_load(&e->optim_ns);
    e->at_open[2] = atomic_load(&e->nvme_ns);
    e->at_open[3] = atomic_load(&e->busy_ns[0]);
    e->at_open[4] = atomic_load(&e->busy_ns[1]);
    e->hits = e->misses = e->evictions = e->prefetches = 0;
}

static zo_status take_grad_slot(struct zo_engine *e, uint32_t c, zo_stream_t compute)
{
    eng_chunk *k = &e->chunks[c];
    if (k->grad_slot >= 0)
        return ZO_OK;
    for (uint32_t s = 0; s < e->n_gslots; s++) {
        eng_gslot *g = &e->gslots[s];
        if (g->busy)
            continue;
        g->busy = 1;
        k->grad_slot = (int)s;
        /* the slot's previous gradients must have left before it is zeroed */
        ZO_TRY(zo_stream_wait_event(compute, g->drained));
        ZO_TRY(zo_memset_async(compute, g->ptr, 0, k->n_elems * e->e16));
        return eng_group_take(e, c, compute);
    }
    return ZO_FAIL(
        ZO_ERR_OUT_OF_DEVICE_MEMORY, ENG_SUBSYS,
        "fetch: all %u device gradient slots are held by layers whose gradients were not "
        "handed over yet: call zo_engine_grads_ready first",
        e->n_gslots);
}

static zo_status fetch_layer(struct zo_engine *e, int layer, zo_phase phase, zo_stream_t compute,
                             void **params, void **grads)
{
    eng_layer *L = &e->layers[layer];
    int pos = eng_trace_push(e, layer, phase);
    if (pos < -1)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "growing the trace");
    ZO_TRY(eng_zero_gather(e, layer, pos)); /* stage 3: before the loads that read them */
    for (uint32_t i = 0; i < L->n_chunks; i++) {
        uint32_t c = L->first_chunk + i;
        ZO_TRY(eng_make_resident(e, c, pos));
        e->chunks[c].in_use++;
    }
    for (uint32_t i = 0; i < L->n_chunks; i++) {
        eng_chunk *k = &e->chunks[L->first_chunk + i];
        ZO_TRY(eng_compute_wait(e, compute, e->pslots[k->slot].ready, L->first_chunk + i));
        if (phase == ZO_PHASE_BACKWARD)
            ZO_TRY(take_grad_slot(e, L->first_chunk + i, compute));
    }
    for (int i = 0; i < L->n_tensors; i++) {
        eng_tensor *t = &e->tensors[L->tensors[i]];
        eng_chunk *k = &e->chunks[t->chunk];
        params[i] = (char *)e->pslots[k->slot].ptr + t->off * e->e16;
        if (phase == ZO_PHASE_BACKWARD)
            grads[i] = (char *)e->gslots[k->grad_slot].ptr + t->off * e->e16;
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
    if (n < e->layers[layer].n_tensors)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "fetch: layer %d has %d tensors, arrays hold %d", layer,
                       e->layers[layer].n_tensors, n);
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
    eng_layer *L = &e->layers[layer];
    for (uint32_t i = 0; i < L->n_chunks; i++)
        if (e->chunks[L->first_chunk + i].in_use <= 0)
            return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS, "release: layer %d is not fetched", layer);
    for (uint32_t i = 0; i < L->n_chunks; i++) {
        eng_chunk *k = &e->chunks[L->first_chunk + i];
        zo_status st = zo_event_record(e->pslots[k->slot].lastuse, compute);
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
    int parity = e->g_bufs == 2 ? (int)(e->steps & 1) : 0;
    ZO_TRY(eng_grads_stage(e, c, parity)); /* where the D2H lands */
    eng_gslot *g = &e->gslots[k->grad_slot];
    ZO_TRY(zo_event_record(k->computed, compute));
    ZO_TRY(zo_stream_wait_event(e->d2h, k->computed));
    ZO_TRY(eng_timed_copy(e, 1, c, k->g16[parity], g->ptr, k->n_elems * e->e16));
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
    eng_layer *L = &e->layers[layer];
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
    if (eng_zero_on(&e->cfg)) /* every rank then holds the same partials */
        ZO_TRY(eng_zero_share_partials(e));
    if (eng_pipe_on(&e->cfg)) /* every stage then sums every stage's */
        ZO_TRY(eng_pipe_judge(e, v));
    for (uint32_t c = 0; !eng_pipe_on(&e->cfg) && c < e->n_chunks; c++) {
        v->sum_sq += e->chunks[c].gstats.sum_sq; /* chunk order: deterministic */
        v->overflow |= e->chunks[c].gstats.nonfinite;
    }
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
    s->step = e->opt_step;
    s->grad_norm = sqrt(v->sum_sq) / v->loss_scale;
    s->overflow = v->overflow;
    s->clipped = !v->overflow && v->factor != v->plain;
    s->loss_scale = v->loss_scale;
    s->rollbacks = rollbacks;
    zo_device_copy_stats cs;
    if (zo_device_copy_get_stats(e->dev, &cs) == ZO_OK) {
        s->h2d_bytes = cs.h2d_bytes - e->copy0.h2d_bytes;
        s->d2h_bytes = cs.d2h_bytes - e->copy0.d2h_bytes;
    }
    for (int i = 0; i < e->n_stores; i++) {
        zo_swap_stats ss = ZO_SWAP_STATS_INIT;
        if (zo_swap_get_stats(e->stores[i].store, &ss) != ZO_OK)
            continue;
        s->nvme_read_bytes += ss.bytes_read - e->stores[i].at_open.bytes_read;
        s->nvme_write_bytes += ss.bytes_written - e->stores[i].at_open.bytes_written;
        s->peak_nvme += (uint64_t)ss.extents_used * e->stores[i].extent_bytes;
    }
    s->step_seconds = (double)(zo_now_ns() - e->step_t0) * 1e-9;
    s->stall_seconds = (double)(atomic_load(&e->busy_ns[2]) - e->at_open[0]) * 1e-9;
    s->optim_seconds = (double)(atomic_load(&e->optim_ns) - e->at_open[1]) * 1e-9;
    s->nvme_seconds = (double)(atomic_load(&e->nvme_ns) - e->at_open[2]) * 1e-9;
    s->h2d_seconds = (double)(atomic_load(&e->busy_ns[0]) - e->at_open[3]) * 1e-9;
    s->d2h_seconds = (double)(atomic_load(&e->busy_ns[1]) - e->at_open[4]) * 1e-9;
    s->peak_device = e->fp.device;
    zo_hostpool_stats hs = ZO_HOSTPOOL_STATS_INIT;
    if (zo_hostpool_get_stats(e->pool, &hs) == ZO_OK)
        s->peak_pinned = hs.reserved_high_water;
    s->peak_host = e->host_high;
    s->fetch_hits = e->hits;
    s->fetch_misses = e->misses;
    s->evictions = e->evictions;
    s->prefetches = e->prefetches;
}

static void close_step(struct zo_engine *e)
{
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        e->chunks[c].n_ready = 0;
        e->chunks[c].spec_done = 0;
    }
    eng_trace_end_step(e);
    e->step_open = 0;
    e->steps++;
    eng_zero_forget_gathers(e); /* the owners updated */
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
    return ZO_OK;
}

zo_status zo_engine_abandon_step(zo_engine_t e)
{
    if (!e)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "NULL engine");
    if (!e->finalized || !e->step_open)
        return ZO_OK; /* nothing open: an engine error already gave the step up */
    ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS, "the caller gave up the step");
    abort_step(e, ZO_ERR_STATE);
    zo_clear_error();
    return ZO_OK;
}

/* ---- reading states ---- */

zo_status zo_engine_read_master(zo_engine_t e, int id, float *out)
{
    if (!e || !out || id < 0 || id >= e->n_tensors)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "read_master: bad engine, id %d or NULL out",
                       id);
    eng_tensor *t = &e->tensors[id];
    if (!e->finalized)
        return initial_values(e, id, out);
    ZO_TRY(eng_wait_idle(e));
    ZO_TRY(e->mode->settle(e)); /* speculative writes in flight have landed */
    float *buf = aligned_alloc(4096, e->state_extent_bytes);
    if (!buf)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "read_master: allocating a buffer");
    zo_status st = e->chunks[t->chunk].st->read(e, t->chunk, buf);
    if (st == ZO_OK)
        memcpy(out, buf + t->off, t->numel * sizeof(float));
    free(buf);
    return st;
}
