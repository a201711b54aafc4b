/* The plan: tensors packed into chunks in registration order, each chunk's
 * homes chosen by the placement rule (engine_place.c), and the exact bytes
 * every tier needs (the footprint), with the shortfall named when a budget
 * is short. Pure: the engine plans its registered tensors here at
 * zo_engine_plan and finalize, and the planner a layout it describes
 * (zo_engine_footprint_for, zo_engine_chunks_for), through the same code, so
 * the planner's figures stay the engine's. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_tier.h"
#include "zo/checked.h"

#define DEFAULT_CHUNK_BYTES (4u << 20)

/* ---- the mode and the configuration a plan reads ---- */

const eng_mode_ops *eng_mode_for(zo_optim_mode m)
{
    switch (m) {
    case ZO_OPTIM_SYNC: return &eng_mode_sync;
    case ZO_OPTIM_OVERLAP: return &eng_mode_overlap;
    case ZO_OPTIM_DPU: return &eng_mode_dpu;
    }
    return &eng_mode_sync;
}

/* What a plan depends on: the homes, the mode, the dtype (no device or paths needed). */
zo_status eng_check_plan_config(const zo_engine_config *c)
{
    if (c->struct_size != sizeof(zo_engine_config))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "zo_engine_config.struct_size is %zu, expected %zu: initialize it with "
                       "ZO_ENGINE_CONFIG_INIT",
                       c->struct_size, sizeof(zo_engine_config));
    ZO_TRY(eng_zero_check_plan(c));
    if (c->param_dtype != ZO_DTYPE_BF16 && c->param_dtype != ZO_DTYPE_F16 &&
        c->param_dtype != ZO_DTYPE_F32)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "param_dtype is %s: expected ZO_DTYPE_BF16, ZO_DTYPE_F16 or ZO_DTYPE_F32",
                       zo_dtype_name(c->param_dtype));
    if ((unsigned)c->param_home >= (unsigned)eng_n_tiers ||
        (unsigned)c->optim_home >= (unsigned)eng_n_tiers)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "param_home/optim_home must be a zo_tier (0 to %d registered)",
                       eng_n_tiers - 1);
    ZO_TRY(eng_tiers_check());
    ZO_TRY(eng_check_caps(c));
    /* under ZeRO the others' chunks may live on NVMe beside a rank's own in host memory */
    if (eng_param_tiers[c->param_home]->store && !eng_state_tiers[c->optim_home]->p16_stored &&
        c->world_size <= 1)
        return ZO_FAIL(
            ZO_ERR_UNSUPPORTED, ENG_SUBSYS,
            "param_home=nvme needs optim_home=nvme (the update writes the new 16-bit "
            "parameters through the NVMe stages); set optim_home=nvme or param_home=host");
    if (!zo_state_format_of(c->state_dtype)) {
        char names[128];
        zo_state_format_names(names, sizeof names, ", ");
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "state_dtype %s is no moment format: expected the dtype of one of %s "
                       "(zo_state_format_named)",
                       zo_dtype_name(c->state_dtype), names);
    }
    if ((unsigned)c->mode > ZO_OPTIM_DPU)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "mode must be sync, overlap or dpu");
    if (c->master_split != 0 && c->master_split != 1)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "master_split is %d: expected 0 or 1",
                       c->master_split);
    if (c->master_split && c->param_dtype != ZO_DTYPE_BF16)
        return ZO_FAIL(ZO_ERR_UNSUPPORTED, ENG_SUBSYS,
                       "master_split needs bf16 parameters (param_dtype is %s: %s); set "
                       "master_split=0 or use bf16",
                       zo_dtype_name(c->param_dtype),
                       c->param_dtype == ZO_DTYPE_F32
                           ? "fp32 parameters are the master itself, nothing to split"
                           : "an fp16 value is not the fp32 master's high half");
    if (c->master_split && c->world_size > 1)
        return ZO_FAIL(ZO_ERR_UNSUPPORTED, ENG_SUBSYS,
                       "master_split is not tested under ZeRO yet (world_size %d): set "
                       "master_split=0",
                       c->world_size);
    if (c->chunk_bytes > ZO_MAX_CHUNK_BYTES)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "chunk_bytes is %llu: at most %llu (1 TiB; tens of MiB is typical)",
                       (unsigned long long)c->chunk_bytes, (unsigned long long)ZO_MAX_CHUNK_BYTES);
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

/* ---- packing and the plan ---- */

/* The chunk size: the configured one (0: 4 MiB) raised to the largest
 * tensor's bytes in param_dtype, rounded to 4 KiB. */
static size_t chunk_bytes_for(const zo_engine_config *c, size_t largest_numel)
{
    size_t cb = c->chunk_bytes ? c->chunk_bytes : DEFAULT_CHUNK_BYTES;
    size_t largest = largest_numel * eng_param_bytes(c);
    return zo_round_up(largest > cb ? largest : cb, 4096);
}

/* Host 16-bit gradient buffers per chunk: by step parity for the delayed
 * update, and for sync mode's update behind the next forward where every
 * chunk's homes let it run there (eng_behind_takes): the next backward's
 * gradients then go to the other buffers, and the update runs on under the
 * backward too, joined at end_step instead of at the backward's first fetch. */
static int g_bufs_for(const zo_engine_config *c, const uint8_t *p16_home,
                      const uint8_t *states_home, uint64_t n_chunks)
{
    int bufs = eng_mode_for(c->mode)->grad_bufs;
    if (bufs == 2 || c->mode != ZO_OPTIM_SYNC || !c->update_behind || eng_zero_on(c) ||
        eng_pipe_on(c) || c->param_dtype == ZO_DTYPE_F16 || !n_chunks)
        return bufs;
    for (uint64_t k = 0; k < n_chunks; k++)
        if (states_home[k] != ZO_TIER_NVME ||
            (p16_home[k] != ZO_TIER_HOST && p16_home[k] != ZO_TIER_NVME))
            return bufs;
    return 2;
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
    return eng_keeps_f32(state_dtype, numel, keep)
               ? zo_state_format_f32_room(zo_state_format_of(state_dtype), numel)
               : numel;
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
    size_t block = zo_state_format_of(c->state_dtype)->block; /* a tensor's first scale its own */
    return block > ENG_TENSOR_ALIGN ? block : ENG_TENSOR_ALIGN;
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

zo_status zo_engine_place_homes(const zo_engine_config *cfg, uint32_t n_chunks,
                                uint8_t *param_homes, uint8_t *optim_homes)
{
    if (!cfg || (n_chunks && (!param_homes || !optim_homes)))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "zo_engine_place_homes: %s is NULL",
                       !cfg           ? "cfg"
                       : !param_homes ? "param_homes"
                                      : "optim_homes");
    zo_engine_config one = *cfg; /* every chunk this rank's */
    one.world_size = 1;
    one.rank = 0;
    one.zero_stage = 0;
    ZO_TRY(eng_check_plan_config(&one));
    eng_place_homes(&one, n_chunks, one.chunk_bytes, NULL, param_homes, optim_homes);
    return ZO_OK;
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
    in.mode_p16_behind = eng_mode_for(c->mode)->p16_behind;
    in.mode_backups = eng_mode_for(c->mode)->backups;
    in.grad_bufs = g_bufs_for(c, p16, states, sh->n_chunks);
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
        /* the two tables outside the registry: ZeRO's (its part), and the
         * NVMe tier's for the device's chunks it backs */
        k->pctx = k->pt == &eng_param_tier_remote        ? (void *)&e->zero
                  : k->pt == &eng_param_tier_device_nvme ? (void *)&e->nvme
                                                         : eng_tier_self(e, k->pt->tier);
        k->sctx =
            k->st == &eng_state_tier_remote ? (void *)&e->zero : eng_tier_self(e, k->st->tier);
        k->p16_bufs = eng_p16_bufs(in, c);
        k->g_staged = eng_grads_staged(in, c);
    }
    e->grads.grouped = in->grouped; /* what comes down (the stages' room needs it) */
}

/* A tensor with fp32 moments under I8 states, or with its parameter group's
 * own settings, joins its chunk's list, in placement order: the update runs
 * it apart (eng_adam_run). */
static void add_small(struct zo_engine *e, const eng_tensor *t)
{
    const int f32 = eng_keeps_f32(e->cfg.state_dtype, t->numel, t->keep_f32);
    if (!f32 && !t->own.set)
        return;
    eng_chunk *k = &e->chunks[t->chunk];
    if (!k->n_small)
        k->small_first = e->n_small;
    e->small[e->n_small++] = (eng_apart){t->off, t->numel, f32, t->own};
    k->n_small++;
}

/* Assign every tensor a chunk and an offset; chunks never span layers. */
static zo_status pack(struct zo_engine *e)
{
    if (e->reg.n_tensors == 0)
        return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS, "no tensors registered: register the model first");
    size_t largest = 0;
    const zo_dtype sd = e->cfg.state_dtype;
    for (int i = 0; i < e->reg.n_tensors; i++) {
        const eng_tensor *t = &e->reg.tensors[i];
        if (tensor_room(sd, t->numel, t->keep_f32) > largest)
            largest = tensor_room(sd, t->numel, t->keep_f32);
    }
    e->chunk_bytes = chunk_bytes_for(&e->cfg, largest);
    if (largest * e->pel > (e->cfg.chunk_bytes ? e->cfg.chunk_bytes : DEFAULT_CHUNK_BYTES))
        ZO_LOGI(ENG_SUBSYS, "chunk size raised to %zu bytes to fit the largest tensor",
                e->chunk_bytes);
    e->chunk_elems = e->chunk_bytes / e->pel;
    free(e->chunks);
    free(e->small);
    e->chunks =
        calloc((size_t)e->reg.n_tensors, sizeof *e->chunks); /* at most one chunk per tensor */
    e->small = calloc((size_t)e->reg.n_tensors, sizeof *e->small);
    e->n_small = 0;
    if (!e->chunks || !e->small)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "allocating the chunk table");
    eng_packer pk = {e->chunk_elems, tensor_align(&e->cfg), -1, 0, 0, 0, 0, 0, sd};
    for (int l = 0; l < e->reg.n_layers; l++) { /* registration order: layers in order */
        eng_layer *L = &e->reg.layers[l];
        L->first_chunk = pk.n_chunks;
        for (int i = 0; i < L->n_tensors; i++) {
            eng_tensor *t = &e->reg.tensors[L->tensors[i]];
            t->chunk = packer_place(&pk, l, t->numel, t->keep_f32, &t->off);
            e->chunks[t->chunk].layer = l;
            e->chunks[t->chunk].n_elems = t->off + tensor_room(sd, t->numel, t->keep_f32);
            add_small(e, t);
        }
        L->n_chunks = pk.n_chunks - L->first_chunk;
    }
    e->n_chunks = pk.n_chunks;
    e->max_cpl = pk.max_cpl;
    eng_shape sh = {e->chunk_bytes, e->chunk_elems, e->n_chunks, e->max_cpl, 0, pk.max_used, NULL};
    e->nvme.state_extent_bytes = state_extent_bytes_for(&e->cfg, &sh);
    e->nvme.nvme_state_extent = zo_engine_nvme_state_bytes_as(e->cfg.state_dtype, pk.max_used);
    e->nvme.p16_extent = eng_p16_extent(&e->cfg, pk.max_used);
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
    e->grads.bufs = in.grad_bufs;
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
    for (int i = 0; i < eng_n_tiers; i++)
        eng_state_tiers[i]->account(&in, &t);
    /* gradient slots, and their fp32 sums when grouped */
    uint64_t grads = sh->max_cpl * (cb + (eng_grouped(c) ? eng_f32_chunk_bytes(c, cb) : 0));
    in.pslots = plan_pslots(&in, budget, grads + t.bytes[ZO_TIER_DEVICE], fits, msg, cap);
    for (int i = 0; i < eng_n_tiers; i++)
        eng_param_tiers[i]->account(&in, &t);
    fp->device_param_slots = (uint32_t)in.pslots;
    fp->device_grad_slots = sh->max_cpl;
    fp->bytes[ZO_TIER_DEVICE] = in.pslots * cb + grads + t.bytes[ZO_TIER_DEVICE];

    /* pinned: host 16-bit params and NVMe staging (tiers); host (pageable): optimizer
     * states and overlap backups (tiers), fp32 accumulators; nvme: two extents per chunk
     * (current and alternate); then the 16-bit gradients within what the host has left */
    fp->param_gather = eng_zero_gather_bytes(c, sh->max_cpl, cb);
    fp->pinned = t.pinned + fp->param_gather;
    fp->param_staging = t.param_staging;
    fp->bytes[ZO_TIER_HOST] = t.bytes[ZO_TIER_HOST];
    if (eng_host_accumulates(c))
        fp->bytes[ZO_TIER_HOST] += nc * (uint64_t)in.grad_bufs * ce * sizeof(float);
    fp->bytes[ZO_TIER_HOST] += eng_zero_host_bytes(c, (uint32_t)nc, ce);
    fp->bytes[ZO_TIER_NVME] = t.bytes[ZO_TIER_NVME];
    for (int i = ZO_TIER_COUNT; i < eng_n_tiers; i++) /* registered tiers: their tables' */
        fp->bytes[i] = t.bytes[i];
    eng_grads_account(&in, fp, &g_split[0], &g_split[1]);
    if (*fits && c->pinned_bytes && fp->pinned > c->pinned_bytes)
        *fits = shortfall(msg, cap, "pinned", fp->pinned, c->pinned_bytes,
                          "16-bit parameter and gradient copies, NVMe staging");

    /* the host tier: pinned and pageable together, under one budget */
    if (*fits && c->host_bytes && fp->pinned + fp->bytes[ZO_TIER_HOST] > c->host_bytes)
        *fits = shortfall(msg, cap, "host", fp->pinned + fp->bytes[ZO_TIER_HOST], c->host_bytes,
                          "pinned + pageable: 16-bit copies, gradients, NVMe staging, optimizer "
                          "states, backups, accumulators");

    if (*fits && c->nvme_bytes && fp->bytes[ZO_TIER_NVME] > c->nvme_bytes)
        *fits = shortfall(msg, cap, "nvme", fp->bytes[ZO_TIER_NVME], c->nvme_bytes,
                          "optimizer states, two extents per chunk, spilled gradients");

    /* registered tiers: each holds its budget in its context */
    for (int i = ZO_TIER_COUNT; *fits && i < eng_n_tiers; i++) {
        uint64_t own, peak;
        eng_tier_usage((zo_tier)i, eng_tier_ctx((zo_tier)i), &own, &peak);
        if (own && fp->bytes[i] > own)
            *fits = shortfall(msg, cap, zo_tier_name((zo_tier)i), fp->bytes[i], own,
                              "what its tables place there");
    }
}

zo_status eng_compute_plan(struct zo_engine *e, zo_engine_footprint *fp, int *fits, char *msg,
                           size_t cap)
{
    ZO_TRY(pack(e));
    eng_shape sh = {e->chunk_bytes, e->chunk_elems, e->n_chunks, e->max_cpl, 0, 0, NULL};
    for (uint32_t i = 0; i < e->n_chunks; i++)
        if (e->chunks[i].n_elems > sh.max_chunk_elems)
            sh.max_chunk_elems = e->chunks[i].n_elems;
    for (int i = 0; i < e->reg.n_tensors; i++)
        sh.n_params += e->reg.tensors[i].numel;
    uint32_t g_split[2];
    plan_tiers(&e->cfg, &sh, e->p16_home, e->states_home, device_budget(e), fp, g_split, fits, msg,
               cap);
    e->grads.kept_chunks = g_split[0];
    e->grads.spilled_chunks = g_split[1];
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
    return eng_compute_plan(e, fp, fits, msg, cap);
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
    ZO_TRY(eng_check_plan_config(cfg));
    ZO_TRY(check_layout(layout));
    size_t largest = 0;
    const zo_dtype sd = cfg->state_dtype;
    for (size_t i = 0; i < layout->n_tensors; i++)
        if (tensor_room(sd, layout->numel[i], layout_keeps_f32(layout, i)) > largest)
            largest = tensor_room(sd, layout->numel[i], layout_keeps_f32(layout, i));
    memset(sh, 0, sizeof *sh);
    sh->chunk_bytes = chunk_bytes_for(cfg, largest);
    const size_t pel = eng_param_bytes(cfg);
    sh->chunk_elems = sh->chunk_bytes / pel;
    eng_packer pk = {sh->chunk_elems, tensor_align(cfg), -1, 0, 0, 0, 0, 0, sd};
    for (size_t i = 0; i < layout->n_tensors; i++) {
        size_t at;
        int keep = layout_keeps_f32(layout, i);
        uint32_t c = packer_place(&pk, layout->layer[i], layout->numel[i], keep, &at);
        if (c < cap) {
            chunks[c].layer = layout->layer[i];
            chunks[c].used_bytes = (uint64_t)(at + tensor_room(sd, layout->numel[i], keep)) * pel;
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
        used[c] = info[c].used_bytes / eng_param_bytes(cfg);
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

zo_status zo_engine_homes(zo_engine_t e, uint32_t params[ZO_TIER_MAX], uint32_t optim[ZO_TIER_MAX])
{
    if (!e)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "NULL argument");
    if (!e->finalized)
        return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS, "the engine is not finalized yet");
    for (int t = 0; t < ZO_TIER_MAX; t++) {
        if (params)
            params[t] = 0;
        if (optim)
            optim[t] = 0;
    }
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        if (params && e->p16_home[c] != ENG_HOME_REMOTE) /* stage 3: another rank's */
            params[e->p16_home[c]]++;
        if (optim && e->states_home[c] != ENG_HOME_REMOTE) /* ZeRO: another rank's */
            optim[e->states_home[c]]++;
    }
    return ZO_OK;
}
