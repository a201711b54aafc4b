/* zo-plan's planner: memory per tier from the engine's and the model's own
 * accounting, traffic from a simulation of the engine's schedule, time from
 * the machine's speeds (see plan.h). */
#include "plan.h"
#include "plan_internal.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_shape.h"
#include "tensor.h"
#include "tp_shape.h"
#include "zo/optim.h"
#include "zo/swap.h"
#include "zo/units.h"
#include "zt_error.h"

/* NVMe state staging slots of the engine (ENG_NVME_STAGES): the footprint
 * reports their total, the breakdown needs it split. */
#define ZP_NVME_STAGES 3u

uint64_t zp_plan_overage(const zp_plan *p, const zp_hardware *hw)
{
    uint64_t host = p->pinned.total + p->host.total, o = 0;
    o += p->device.total > hw->device_bytes ? p->device.total - hw->device_bytes : 0;
    o += host > hw->host_bytes ? host - hw->host_bytes : 0;
    o += p->nvme.files > hw->nvme_bytes ? p->nvme.files - hw->nvme_bytes : 0;
    return o;
}

uint64_t zp_trainer_host_mem(const zp_hardware *hw, const zp_plan *p)
{
    return p->host_budget + (strcmp(hw->backend, "cpu") == 0 ? hw->device_bytes : 0);
}

const char *zp_strategy_name(zp_strategy s)
{
    static const char *const names[ZP_N_STRATEGIES + 1] = {"no-offload",
                                                           "optimizer-host",
                                                           "optimizer-nvme",
                                                           "params+optimizer-host",
                                                           "params+optimizer-nvme",
                                                           "per-chunk"};
    return (unsigned)s <= ZP_SPLIT ? names[s] : "?";
}

const char *zp_act_home_name(zp_act_home a)
{
    static const char *const names[] = {"auto", "device", "host", "nvme"};
    return (unsigned)a <= ZP_ACT_NVME ? names[a] : "?";
}

const char *zp_act_where(zp_act_home a)
{
    return a == ZP_ACT_HOST ? "pinned host" : a == ZP_ACT_NVME ? "NVMe" : "device";
}

void zp_strategy_homes(zp_strategy s, zo_tier *param_home, zo_tier *optim_home)
{
    static const zo_tier homes[ZP_N_STRATEGIES][2] = {{ZO_TIER_DEVICE, ZO_TIER_DEVICE},
                                                      {ZO_TIER_DEVICE, ZO_TIER_HOST},
                                                      {ZO_TIER_DEVICE, ZO_TIER_NVME},
                                                      {ZO_TIER_HOST, ZO_TIER_HOST},
                                                      {ZO_TIER_NVME, ZO_TIER_NVME}};
    *param_home = homes[s][0];
    *optim_home = homes[s][1];
}

const char *zp_bottleneck_name(zp_bottleneck b)
{
    static const char *const names[ZP_N_BOTTLENECKS] = {"GPU compute", "host->device",
                                                        "device->host", "NVMe", "CPU optimizer"};
    return (unsigned)b < ZP_N_BOTTLENECKS ? names[b] : "?";
}

/* ---- the model as the engine sees it ---- */

void zp_layout_free(model_layout *m)
{
    free(m->numel);
    free(m->layer);
    free(m->keep_f32);
    free(m->chunks);
    free(m->first);
    memset(m, 0, sizeof *m);
}

void zp_job_layers(const zp_job *job, int *first, int *end)
{
    *first = job->stage_end ? job->stage_first : 0;
    *end = job->stage_end ? job->stage_end : zt_engine_layers(&job->shape);
}

zo_status zp_layout_init(model_layout *m, const zp_job *job)
{
    memset(m, 0, sizeof *m);
    const zt_shape *s = &job->shape;
    int a, b;
    zp_job_layers(job, &a, &b);
    int L = b - a; /* a tied last stage's copy of layer 0 is zo-train's, not the engine's */
    m->n_layers = L;
    /* the head's forward runs under its backward's fetch; a stage that sends
       its output on fetches its last layer in the forward too */
    m->fwd_layers = b == zt_engine_layers(s) ? L - 1 : L;
    for (int l = 0; l < L; l++)
        m->n += (size_t)zt_layer_tensors(s, a + l);
    m->numel = calloc(m->n ? m->n : 1, sizeof *m->numel);
    m->layer = calloc(m->n ? m->n : 1, sizeof *m->layer);
    m->keep_f32 = calloc(m->n ? m->n : 1, sizeof *m->keep_f32);
    m->chunks = calloc(m->n ? m->n : 1, sizeof *m->chunks);
    m->first = calloc((size_t)L + 1, sizeof *m->first);
    if (!m->numel || !m->layer || !m->keep_f32 || !m->chunks || !m->first) {
        size_t n = m->n;
        zp_layout_free(m);
        return zt_fail(ZO_ERR_NO_MEMORY, "out of memory for the sizes of the model's %zu tensors",
                       n);
    }
    size_t k = 0;
    for (int l = 0; l < L; l++)
        for (int i = 0; i < zt_layer_tensors(s, a + l); i++, k++) {
            m->numel[k] = zt_tp_numel(s, zp_tp(job), a + l, i);
            m->layer[k] = l;
            m->keep_f32[k] =
                (unsigned char)(job->embedding_f32 && zt_tensor_embedding(s, a + l, i));
        }
    return ZO_OK;
}

zo_engine_layout zp_engine_layout(const model_layout *m)
{
    zo_engine_layout ly = ZO_ENGINE_LAYOUT_INIT;
    ly.n_tensors = m->n;
    ly.numel = m->numel;
    ly.layer = m->layer;
    ly.keep_f32 = m->keep_f32;
    return ly;
}

/* Pack under cfg and index the chunks by layer. */
zo_status zp_pack_model(model_layout *m, const zo_engine_config *cfg, int n_layers)
{
    zo_engine_layout ly = zp_engine_layout(m);
    ZT_LIB(zo_engine_chunks_for(cfg, &ly, m->chunks, m->n, &m->n_chunks));
    for (int l = 0; l <= n_layers; l++)
        m->first[l] = m->n_chunks;
    for (uint32_t c = m->n_chunks; c-- > 0;)
        m->first[m->chunks[c].layer] = c;
    return ZO_OK;
}

/* ---- the engine's parameter loads in one step ----
 * zo-train fetches, per micro-batch, layers 0..E-2 forward, then E-1..0
 * backward (E engine layers; the head only in the backward). At the end of
 * every step the engine empties the slots of offloaded parameters (their
 * new values are on the host), so a step starts from empty slots. A miss
 * evicts the chunk, of a layer not being fetched, whose next use is
 * farthest (uses after the step's end count as never). */

typedef struct fetch_order {
    int E;     /* engine layers */
    int F;     /* of them fetched in the forward: E - 1 with the head, else E */
    long T;    /* fetches per micro-batch: F + E */
    int accum; /* micro-batches per step */
} fetch_order;

static int layer_at(const fetch_order *o, long pos)
{
    long r = pos % o->T;
    return r < o->F ? (int)r : (int)(o->F + o->E - 1 - r);
}

/* The position of layer l's next fetch after pos (LONG_MAX: not in this step). */
static long next_use(const fetch_order *o, int l, long pos)
{
    long m = pos / o->T, r = pos % o->T;
    long fwd = l < o->F ? l : -1, bwd = o->F + o->E - 1 - l;
    if (fwd > r)
        return m * o->T + fwd;
    if (bwd > r)
        return m * o->T + bwd;
    if (m + 1 >= o->accum)
        return LONG_MAX;
    return (m + 1) * o->T + (fwd >= 0 ? fwd : bwd);
}

typedef struct slot_sim {
    const model_layout *m;
    fetch_order o;
    int32_t *slot_chunk; /* chunk in each slot, -1 free */
    int32_t *chunk_slot; /* slot of each chunk, -1 none */
    uint32_t n_slots;
    const uint8_t *resident; /* chunks homed on the device: never loaded (NULL: none) */
    uint64_t *work;
} slot_sim;

static uint32_t pick_victim(slot_sim *s, int layer, long pos)
{
    uint32_t best = 0;
    long best_key = -1;
    for (uint32_t k = 0; k < s->n_slots; k++) {
        int32_t c = s->slot_chunk[k];
        if (c < 0)
            return k;
        int cl = s->m->chunks[c].layer;
        if (cl == layer)
            continue;
        long key = next_use(&s->o, cl, pos);
        if (key > best_key) {
            best_key = key;
            best = k;
        }
    }
    if (s->work)
        *s->work += s->n_slots;
    return best;
}

/* Loads (chunks, 16-bit bytes used) of fetches [from, to). */
static void simulate(slot_sim *s, long from, long to, uint64_t *loads, uint64_t *bytes)
{
    for (long pos = from; pos < to; pos++) {
        int l = layer_at(&s->o, pos);
        for (uint32_t c = s->m->first[l]; c < s->m->first[l + 1]; c++) {
            if (s->chunk_slot[c] >= 0 || (s->resident && s->resident[c]))
                continue;
            uint32_t k = pick_victim(s, l, pos);
            if (s->slot_chunk[k] >= 0)
                s->chunk_slot[s->slot_chunk[k]] = -1;
            s->slot_chunk[k] = (int32_t)c;
            s->chunk_slot[c] = (int32_t)k;
            (*loads)++;
            *bytes += s->m->chunks[c].used_bytes;
        }
    }
}

/* A step's loads. Beyond three micro-batches the third repeats (the slots
 * hold the same chunks at every micro-batch boundary by then). */
zo_status zp_step_loads(const model_layout *m, int n_layers, uint32_t n_slots, int accum,
                        const uint8_t *resident, uint64_t *loads, uint64_t *bytes, uint64_t *work)
{
    slot_sim s = {m,       {n_layers, m->fwd_layers, (long)m->fwd_layers + n_layers, accum},
                  NULL,    NULL,
                  n_slots, resident,
                  work};
    s.slot_chunk = malloc(n_slots * sizeof *s.slot_chunk);
    s.chunk_slot = malloc(m->n_chunks * sizeof *s.chunk_slot);
    if (!s.slot_chunk || !s.chunk_slot) {
        free(s.slot_chunk);
        free(s.chunk_slot);
        return zt_fail(ZO_ERR_NO_MEMORY, "the eviction simulation's slot tables");
    }
    memset(s.slot_chunk, 0xff, n_slots * sizeof *s.slot_chunk);
    memset(s.chunk_slot, 0xff, m->n_chunks * sizeof *s.chunk_slot);
    *loads = *bytes = 0;
    int sim = accum < 3 ? accum : 3;
    simulate(&s, 0, (sim - 1) * s.o.T, loads, bytes);
    uint64_t l0 = 0, b0 = 0;
    s.o.accum = sim; /* the last simulated micro-batch sees the step's end */
    simulate(&s, (sim - 1) * s.o.T, sim * s.o.T, &l0, &b0);
    *loads += l0 * (uint64_t)(accum - sim + 1);
    *bytes += b0 * (uint64_t)(accum - sim + 1);
    free(s.slot_chunk);
    free(s.chunk_slot);
    return ZO_OK;
}

/* ---- memory ---- */

static zo_engine_config engine_config(const zp_job *job, const zp_hardware *hw, zp_strategy s,
                                      uint64_t chunk_bytes, uint64_t engine_budget)
{
    zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
    c.param_dtype = job->dtype;
    c.chunk_bytes = chunk_bytes;
    zp_strategy_homes(s, &c.param_home, &c.optim_home);
    c.device_bytes = engine_budget;
    c.pinned_bytes = hw->pinned_max;
    c.mode = job->mode;
    c.grad_accum_steps = job->grad_accum;
    c.state_dtype = job->state_dtype;
    c.master_split = job->master_split;
    c.update_behind = !job->no_update_behind; /* zo-train's: two gradient buffers */
    if (job->world_size > 1) {                /* rank 0: the largest share */
        c.world_size = job->world_size;
        c.zero_stage = job->zero_stage;
    }
    return c;
}

/* The activation arena: the whole model's, also on a pipeline stage (zo-train
 * allocates the model's arena on every stage, with zp_job.act_sets sets of
 * layer inputs). */
zt_model_config zp_model_config(const zp_job *job)
{
    zt_model_config mc = {zt_tp_local_shape(&job->shape, zp_tp(job)),
                          job->seq,
                          job->micro_batch,
                          job->grad_accum,
                          job->dtype,
                          job->flash_attention,
                          job->layout,
                          job->sequence_parallel && zp_tp(job) > 1 ? zp_tp(job) : 0,
                          job->mlp_chunk_bytes};
    return mc;
}

int zp_refuse(zp_plan *p, const char *fmt, ...)
{
    if (p->why[0])
        return 0; /* the first reason stands */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->why, sizeof p->why, fmt, ap);
    va_end(ap);
    p->fits = 0;
    return 0;
}

static void device_breakdown(zp_plan *p, const zp_job *job, const zp_hardware *hw)
{
    zt_model_config mc = zp_model_config(job);
    zt_activation_parts a;
    zt_model_activation_parts(&mc, &a);
    a.workspace += zp_tp_device_bytes(job); /* zo-train's tensor-parallel buffers */
    a.total += zp_tp_device_bytes(job);
    const zo_engine_footprint *fp = &p->fp;
    uint64_t slots = (uint64_t)fp->device_param_slots * fp->chunk_bytes;
    if (p->param_home == ZO_TIER_DEVICE)
        p->device.params = slots;
    else
        p->device.param_slots = slots;
    p->device.grads = (uint64_t)fp->device_grad_slots * fp->chunk_bytes;
    p->device.states = fp->bytes[ZO_TIER_DEVICE] - slots - p->device.grads;
    p->device.inputs = a.inputs;
    p->device.checkpoints = a.checkpoints;
    p->device.workspace = a.workspace;
    p->device.reserve = hw->reserve_bytes;
    p->device.total = fp->bytes[ZO_TIER_DEVICE] + a.total + hw->reserve_bytes;
    p->peak_device = fp->bytes[ZO_TIER_DEVICE];
}

/* The footprint's pinned, host and NVMe totals split by use, as engine.h
 * documents them. */
static void host_breakdown(zp_plan *p, const zp_job *job, const zp_hardware *hw, uint64_t fullest)
{
    const zo_engine_footprint *fp = &p->fp;
    uint64_t C = fp->chunk_bytes, N = fp->n_chunks, W = job->world_size > 1 ? job->world_size : 1;
    uint64_t own = (N + W - 1) / W; /* rank 0's chunks under ZeRO: their states */
    const uint64_t Z = zp_chunk_state_bytes(job->state_dtype, C / zp_param_bytes(job));
    uint64_t states = Z * own;
    /* the update's NVMe stages (engine.h), and stage 3's gather ring */
    uint64_t Zio = (Z + 4095) / 4096 * 4096;
    /* device-resident over NVMe states: the 16-bit copies live on NVMe too, through the stages
       (one rank, full master) */
    int backed = p->param_home == ZO_TIER_DEVICE && p->optim_home == ZO_TIER_NVME &&
                 !job->master_split && W == 1;
    uint64_t stages =
        p->optim_home == ZO_TIER_NVME
            ? ZP_NVME_STAGES * (Zio + (p->param_home == ZO_TIER_NVME || backed ? C : 0))
            : 0;
    p->pinned.grads = fp->grad_pinned + fp->grad_stage; /* mirrors or the ring, and room */
    p->pinned.twins = fp->param_staging;
    p->pinned.staging = stages + fp->param_gather;
    /* the 16-bit host copies: what is left */
    uint64_t other = p->pinned.grads + p->pinned.twins + p->pinned.staging;
    p->pinned.params = fp->pinned > other ? fp->pinned - other : 0;
    p->pinned.total = fp->pinned;
    p->host.states = p->optim_home == ZO_TIER_HOST ? states : 0;
    p->host.backups = job->mode == ZO_OPTIM_OVERLAP && p->optim_home != ZO_TIER_NVME ? states : 0;
    p->host.accum = fp->bytes[ZO_TIER_HOST] - p->host.states - p->host.backups;
    p->host.total = fp->bytes[ZO_TIER_HOST];
    uint64_t p16_extent = (fullest + 4095) / 4096 * 4096;
    /* ZeRO stage 3: a rank's files hold its own chunks (stages 1-2: every chunk) */
    uint64_t p16_chunks = W > 1 && job->zero_stage == 3 ? own : N;
    p->nvme.params = p->param_home == ZO_TIER_NVME || backed ? 2 * p16_chunks * p16_extent : 0;
    p->nvme.states = fp->bytes[ZO_TIER_NVME] - p->nvme.params;
    p->nvme.payload = fp->bytes[ZO_TIER_NVME];
    int paths = hw->n_nvme_paths > 0 ? hw->n_nvme_paths : 1;
    /* the extents hold the fullest chunk, as the engine sizes them */
    p->nvme.files =
        zo_swap_files_bytes(p->nvme.states, zp_packed_state_bytes(job, fullest), (size_t)paths) +
        zo_swap_files_bytes(p->nvme.params, p16_extent, (size_t)paths);
    p->peak_pinned = fp->pinned;
    p->peak_host = fp->bytes[ZO_TIER_HOST];
    p->peak_nvme = fp->bytes[ZO_TIER_NVME];
}

static void check_host_and_nvme(zp_plan *p, const zp_hardware *hw)
{
    char a[32], b[32], c[32], d[32];
    uint64_t host = p->pinned.total + p->host.total;
    if (host > hw->host_bytes)
        zp_refuse(
            p,
            "host tier: %s pinned + %s pageable = %s, but the host budget is %s: short by %" PRIu64
            " bytes",
            zo_fmt_bytes_prec(a, sizeof a, p->pinned.total, 1),
            zo_fmt_bytes_prec(b, sizeof b, p->host.total, 1),
            zo_fmt_bytes_prec(c, sizeof c, host, 1),
            zo_fmt_bytes_prec(d, sizeof d, hw->host_bytes, 1), host - hw->host_bytes);
    if (p->nvme.files > hw->nvme_bytes)
        zp_refuse(
            p,
            "nvme tier: the swap files take %s (%s of states and parameters) but %s (%s): short "
            "by %" PRIu64 " bytes",
            zo_fmt_bytes_prec(a, sizeof a, p->nvme.files, 1),
            zo_fmt_bytes_prec(b, sizeof b, p->nvme.payload, 1),
            hw->nvme_bytes ? "the NVMe paths have less free" : "no NVMe space was given",
            zo_fmt_bytes_prec(c, sizeof c, hw->nvme_bytes, 1), p->nvme.files - hw->nvme_bytes);
}

static zo_status plan_memory(zp_plan *p, const zp_job *job, const zp_hardware *hw, uint64_t chunk,
                             uint64_t *work)
{
    zt_model_config mc = zp_model_config(job);
    uint64_t act = zt_model_activation_bytes(&mc) + zp_tp_device_bytes(job);
    uint64_t need = act + hw->reserve_bytes;
    uint64_t engine_budget = hw->device_bytes > need ? hw->device_bytes - need : 0;
    p->device.engine_budget = engine_budget;
    /* an engine budget of 0 would mean "unlimited": plan against one byte */
    zo_engine_config cfg =
        engine_config(job, hw, p->strategy, chunk, engine_budget ? engine_budget : 1);
    model_layout m;
    ZT_TRY(zp_layout_init(&m, job));
    zo_engine_layout ly = zp_engine_layout(&m);
    p->fp = (zo_engine_footprint)ZO_ENGINE_FOOTPRINT_INIT;
    int fits = 0;
    char msg[400];
    zo_status st = zo_engine_footprint_for(&cfg, &ly, &p->fp, &fits, msg, sizeof msg);
    uint32_t nc = 0;
    uint64_t fullest = 0; /* the fullest chunk's 16-bit bytes: the swap extents hold it */
    if (st >= 0 && (st = zo_engine_chunks_for(&cfg, &ly, m.chunks, m.n, &nc)) >= 0)
        for (uint32_t c = 0; c < nc && c < m.n; c++)
            if (m.chunks[c].used_bytes > fullest)
                fullest = m.chunks[c].used_bytes;
    if (work)
        *work += m.n;
    zp_layout_free(&m);
    if (st < 0)
        return zt_lib_fail(st, "zo_engine_footprint_for");
    device_breakdown(p, job, hw);
    host_breakdown(p, job, hw, fullest);
    char a[32], b[32];
    if (!engine_budget)
        zp_refuse(
            p, "device tier: the activations (%s for micro-batch %d x seq %d)%s fill the %s budget",
            zo_fmt_bytes_prec(a, sizeof a, act, 1), job->micro_batch, job->seq,
            hw->reserve_bytes ? " and the CUDA reserve" : "",
            zo_fmt_bytes_prec(b, sizeof b, hw->device_bytes, 1));
    else if (!fits)
        zp_refuse(p, "%s (the device budget less %s of activations%s)", msg,
                  zo_fmt_bytes_prec(a, sizeof a, act, 1),
                  hw->reserve_bytes ? " and the CUDA reserve" : "");
    check_host_and_nvme(p, hw);
    return ZO_OK;
}

/* ---- traffic and time ---- */

/* Block b's share of a full causal layer's attention: what its window and
 * the job's sparse layout keep (zt_block_layout_share). */
static double attention_share(const zp_job *job, int block)
{
    return zt_block_layout_share(&job->shape, &job->layout, block, job->seq);
}

/* FLOPs per token of one block's recompute in the backward: its forward but
 * its last projection (wdown), attention included (what its window and the
 * layout keep). */
static double block_recompute_flops(const zp_job *job, int block)
{
    const zt_shape *s = &job->shape;
    double d = s->dim, f = s->ffn_dim;
    return 2.0 * (4 * d * d + 2 * d * f) + 4.0 * (double)job->seq * d * attention_share(job, block);
}

/* FLOPs per token of the backward's recompute: every block's. */
static double recompute_flops_per_token(const zp_job *job)
{
    double sum = 0;
    for (int b = 0; b < job->shape.n_layers; b++)
        sum += block_recompute_flops(job, b);
    return sum;
}

/* One block's training FLOPs per token (zt_layout_flops_per_token's share):
 * the blocks' matmuls split evenly, its own attention. */
static double block_flops(const zp_job *job, int block)
{
    const zt_shape *s = &job->shape;
    double head = 6.0 * (double)s->vocab * s->dim;
    double attn_full = 12.0 * (double)job->seq * zt_q_dim(s);
    double attn_all = 0;
    for (int b = 0; b < s->n_layers; b++)
        attn_all += attn_full * attention_share(job, b);
    double matmul = zp_full_model_flops_per_token(job) - head - attn_all;
    return matmul / s->n_layers + attn_full * attention_share(job, block);
}

double zp_full_model_flops_per_token(const zp_job *job)
{
    return zt_layout_flops_per_token(&job->shape, &job->layout, job->seq);
}

uint64_t zp_param_bytes(const zp_job *job)
{
    return zo_dtype_size(job->dtype);
}

uint64_t zp_packed_state_bytes(const zp_job *job, uint64_t used_bytes)
{
    return zo_engine_nvme_state_bytes_as(job->state_dtype, used_bytes / zp_param_bytes(job));
}

uint64_t zp_moved_state_bytes(const zp_job *job, uint64_t used_bytes, int p16_on_nvme)
{
    if (job->master_split && !p16_on_nvme)
        return zo_engine_nvme_split_state_bytes(job->state_dtype, used_bytes / zp_param_bytes(job));
    return zp_packed_state_bytes(job, used_bytes);
}

/* The engine's Z: fp32 master, then m and v, each compact moment rounded
 * up to 64 bytes (zo/engine.h's footprint formula). */
uint64_t zp_chunk_state_bytes(zo_dtype state_dtype, uint64_t chunk_elems)
{
    size_t S = (size_t)chunk_elems, m = zo_adam_moment_bytes(state_dtype, S);
    if (state_dtype != ZO_DTYPE_F32)
        m = (m + 63) / 64 * 64;
    return 4 * (uint64_t)S + 2 * (uint64_t)m;
}

double zp_adam_rate(const zp_speeds *sp, zo_dtype state_dtype)
{
    if (state_dtype == ZO_DTYPE_BF16)
        return sp->adam_params_bf16 > 0 ? sp->adam_params_bf16
                                        : sp->adam_params * ZP_ADAM_BF16_RATIO;
    if (state_dtype == ZO_DTYPE_I8)
        return sp->adam_params_i8 > 0 ? sp->adam_params_i8 : sp->adam_params * ZP_ADAM_I8_RATIO;
    return sp->adam_params;
}

zo_status zp_nvme_chunk_states(const zp_job *job, uint64_t **bytes, uint32_t *n_chunks)
{
    *bytes = NULL;
    *n_chunks = 0;
    model_layout m;
    ZT_TRY(zp_layout_init(&m, job));
    zp_hardware none;
    memset(&none, 0, sizeof none);
    uint64_t chunk = job->chunk_bytes ? job->chunk_bytes : zp_default_chunk_bytes(job);
    zo_engine_config cfg = engine_config(job, &none, ZP_OPTIM_NVME, chunk, 0);
    zo_status st = zp_pack_model(&m, &cfg, m.n_layers);
    if (st >= 0 && !(*bytes = malloc((m.n_chunks ? m.n_chunks : 1) * sizeof **bytes)))
        st = zt_fail(ZO_ERR_NO_MEMORY, "the chunks' state sizes");
    for (uint32_t c = 0; st >= 0 && c < m.n_chunks; c++)
        (*bytes)[c] = zp_packed_state_bytes(job, m.chunks[c].used_bytes);
    if (st >= 0)
        *n_chunks = m.n_chunks;
    zp_layout_free(&m);
    return st;
}

/* Under ZeRO, rank 0 owns the first ceil(n/W) chunks (engine.h: contiguous
 * runs in chunk order, the first n % W ranks one more). */
int zp_rank0_owns(const zp_job *job, uint32_t n_chunks, uint32_t c)
{
    uint32_t W = job->world_size > 1 ? (uint32_t)job->world_size : 1;
    return c < (n_chunks + W - 1) / W;
}

static zo_status plan_traffic(zp_plan *p, const zp_job *job, const zp_hardware *hw, uint64_t chunk,
                              uint64_t *work)
{
    model_layout m;
    ZT_TRY(zp_layout_init(&m, job));
    int E = m.n_layers;
    zo_engine_config cfg = engine_config(job, hw, p->strategy, chunk, 0);
    zo_status st = zp_pack_model(&m, &cfg, E);
    uint64_t used = 0, states = 0, own_used = 0;
    for (uint32_t c = 0; c < m.n_chunks; c++) {
        used += m.chunks[c].used_bytes;
        if (!zp_rank0_owns(job, m.n_chunks, c))
            continue; /* another rank updates it */
        own_used += m.chunks[c].used_bytes;
        states += zp_moved_state_bytes(job, m.chunks[c].used_bytes, p->param_home == ZO_TIER_NVME);
    }
    int gathers = job->world_size > 1 && job->zero_stage == 3;
    uint64_t loads = 0, load_bytes = used;
    if (st >= 0 && (p->param_home != ZO_TIER_DEVICE || gathers)) {
        uint32_t slots = p->fp.device_param_slots ? p->fp.device_param_slots : 1;
        st = zp_step_loads(&m, E, slots, job->grad_accum, NULL, &loads, &load_bytes, work);
    }
    zp_layout_free(&m);
    ZT_TRY(st);
    const uint64_t C = p->fp.chunk_bytes, N = p->fp.n_chunks;
    p->optim_params = job->world_size > 1 ? own_used / zp_param_bytes(job) : p->fp.n_params;
    if (gathers) { /* the other ranks' share of the loads comes from their owners (world.h) */
        uint64_t W = (uint64_t)job->world_size;
        p->gather_bytes = load_bytes / W * (W - 1);
        if (p->param_home == ZO_TIER_DEVICE) /* its own stay resident: the new ones go up */
            load_bytes = p->gather_bytes + own_used;
    }
    p->h2d_bytes = load_bytes; /* device-resident parameters: the upload of the new ones */
    p->d2h_bytes = (uint64_t)job->grad_accum * used;
    if (p->optim_home == ZO_TIER_NVME)
        p->nvme_read_bytes = p->nvme_write_bytes = p->nvme_state_bytes = states;
    if (p->param_home == ZO_TIER_NVME) {
        uint64_t W = job->world_size > 1 ? (uint64_t)job->world_size : 1, own = (N + W - 1) / W;
        if (gathers) { /* its own chunks, read for their gathers; the new ones written */
            p->nvme_read_bytes += loads * C / N * own;
            p->nvme_write_bytes += own * C;
        } else { /* whole chunks into the staging twins; every chunk's new values written */
            p->nvme_read_bytes += loads * C + (W > 1 ? own * C : 0); /* the owner's read back */
            p->nvme_write_bytes += N * C;
        }
    }
    return ZO_OK;
}

/* The update reads the next chunks' states while it writes the last ones.
 * At the rate measured for that mix when there is one; else reads and
 * writes overlap but together move no faster than the faster of the two. */
double zp_nvme_update_seconds(uint64_t rd_bytes, uint64_t wr_bytes, const zp_speeds *sp)
{
    if (!rd_bytes && !wr_bytes)
        return 0;
    if (sp->nvme_update > 0)
        return (double)(rd_bytes + wr_bytes) / sp->nvme_update;
    double rd = (double)rd_bytes / sp->nvme_read, wr = (double)wr_bytes / sp->nvme_write;
    return fmax(fmax(rd, wr), (double)(rd_bytes + wr_bytes) / fmax(sp->nvme_read, sp->nvme_write));
}

void zp_layer_flops_per_token(const zp_job *job, int layer, double *model, double *device)
{
    const zt_shape *s = &job->shape;
    double head = 6.0 * (double)s->vocab * s->dim;
    double last = zt_engine_layers(s) - 1;
    int is_block = layer >= 1 && layer <= s->n_layers;
    /* a tensor-parallel rank runs 1/T of each (tensor.h) */
    *model =
        ((is_block ? block_flops(job, layer - 1) : 0) + (layer == last ? head : 0)) / zp_tp(job);
    *device = *model + (is_block ? block_recompute_flops(job, layer - 1) : 0) / zp_tp(job);
}

/* The job's layers' FLOPs per token: the model's, or with the recompute. */
static double job_flops(const zp_job *job, int device)
{
    int a, b;
    zp_job_layers(job, &a, &b);
    double sum = 0, m, d;
    for (int l = a; l < b; l++) {
        zp_layer_flops_per_token(job, l, &m, &d);
        sum += device ? d : m;
    }
    return sum;
}

double zp_model_flops_per_token(const zp_job *job)
{
    if (!job->stage_end)
        return zp_full_model_flops_per_token(job) / zp_tp(job);
    return job_flops(job, 0);
}

double zp_device_flops_per_token(const zp_job *job)
{
    if (!job->stage_end)
        return (zp_full_model_flops_per_token(job) + recompute_flops_per_token(job)) / zp_tp(job);
    return job_flops(job, 1);
}

int zp_update_behind(const zp_job *job, zo_optim_mode mode, const uint32_t *param_homes,
                     const uint32_t *optim_homes, uint32_t n_chunks)
{
    if (job->no_update_behind || mode != ZO_OPTIM_SYNC || job->world_size > 1 || job->stage_end ||
        job->dtype == ZO_DTYPE_F16 || !n_chunks)
        return 0;
    return optim_homes[ZO_TIER_NVME] == n_chunks &&
           param_homes[ZO_TIER_NVME] + param_homes[ZO_TIER_HOST] == n_chunks;
}

double zp_behind_step_seconds(const zp_behind_times *t, uint32_t n_chunks, int cpu_device)
{
    double update = fmax(t->optim, t->nvme_optim);
    double rest = 1.0 - 1.0 / n_chunks; /* the chunks updated while the forward runs */
    double forward = update / n_chunks + t->fwd + (cpu_device ? t->optim * rest : 0.0);
    double fwd_fetch = t->nvme_fetch / 2; /* the forward's own reads */
    /* One disk serves the forward's own parameter reads and the update's
     * states beside it: with parameters on NVMe the engine's update waited
     * twice as long on the disk behind the forward as in its own phase. */
    double window = fmax(fmax(forward, update), fwd_fetch + t->nvme_optim);
    /* the backward is what the forward and backward take beyond the forward
     * alone, which is its compute or its reads; no step is shorter than the
     * disk's traffic */
    double backward = t->fb - fmax(t->fwd, fwd_fetch);
    return fmax(backward + window, t->nvme_fetch + t->nvme_optim);
}

/* The forward's share of the compute: a third of the model's FLOPs of the
 * device's, which recompute each block in the backward. */
static double forward_share(double per_token, double dev_per_token)
{
    return dev_per_token > 0 ? per_token / 3.0 / dev_per_token : 0;
}

static void plan_time(zp_plan *p, const zp_job *job, const zp_hardware *hw, const zp_speeds *sp,
                      double nvme_tbw)
{
    p->tokens = (uint64_t)job->grad_accum * job->micro_batch * job->seq;
    double per_token = zp_model_flops_per_token(job);
    p->model_flops = (double)p->tokens * per_token;
    double device_flops = (double)p->tokens * zp_device_flops_per_token(job);
    double rate = sp->model_flops > 0 ? sp->model_flops : sp->flops;
    uint64_t state_r = p->nvme_state_bytes;
    double nvme_fetch = (double)(p->nvme_read_bytes - state_r) / sp->nvme_read;
    double nvme_optim = zp_nvme_update_seconds(state_r, p->nvme_write_bytes, sp);
    double *t = p->seconds;
    t[ZP_BN_COMPUTE] = device_flops / rate;
    t[ZP_BN_H2D] = (double)p->h2d_bytes / sp->h2d;
    t[ZP_BN_D2H] = (double)p->d2h_bytes / sp->d2h;
    t[ZP_BN_NVME] = nvme_fetch + nvme_optim;
    t[ZP_BN_OPTIM] = (double)p->optim_params / zp_adam_rate(sp, job->state_dtype);
    /* the upload of device-resident parameters follows the update */
    double publish = p->param_home == ZO_TIER_DEVICE
                         ? (double)(p->h2d_bytes - p->gather_bytes) / sp->h2d
                         : 0.0; /* ZeRO stage 3: gathered chunks are fetched, own ones uploaded */
    double fetch_h2d = t[ZP_BN_H2D] - publish;
    double optim_phase = fmax(t[ZP_BN_OPTIM], nvme_optim);
    p->update_seconds = optim_phase;
    uint32_t ph[ZO_TIER_COUNT] = {0}, oh[ZO_TIER_COUNT] = {0};
    ph[p->param_home] = oh[p->optim_home] = p->fp.n_chunks;
    int cpu = strcmp(hw->backend, "cuda") != 0;
    if (zp_update_behind(job, job->mode, ph, oh, p->fp.n_chunks)) {
        double fb = cpu ? fmax(t[ZP_BN_COMPUTE] + fetch_h2d + t[ZP_BN_D2H], nvme_fetch)
                        : fmax(fmax(t[ZP_BN_COMPUTE], fetch_h2d), fmax(t[ZP_BN_D2H], nvme_fetch));
        double fwd = t[ZP_BN_COMPUTE] * forward_share(per_token, zp_device_flops_per_token(job));
        p->fb_seconds = fb;
        zp_behind_times bt = {fb, fwd, t[ZP_BN_OPTIM], nvme_optim, nvme_fetch};
        p->step_seconds = zp_behind_step_seconds(&bt, p->fp.n_chunks, cpu) + publish;
    } else if (cpu) {
        /* the emulated GPU, its copies and the optimizer share the host's cores */
        double fb = fmax(t[ZP_BN_COMPUTE] + fetch_h2d + t[ZP_BN_D2H], nvme_fetch);
        p->fb_seconds = fb;
        p->step_seconds = fb + optim_phase + publish;
    } else {
        double fb = fmax(fmax(t[ZP_BN_COMPUTE], fetch_h2d), fmax(t[ZP_BN_D2H], nvme_fetch));
        p->fb_seconds = fb;
        if (job->mode == ZO_OPTIM_SYNC)
            p->step_seconds = fb + optim_phase + publish;
        else /* the update runs under the backward (overlap) or the next step (dpu) */
            p->step_seconds = fmax(fmax(fb, t[ZP_BN_OPTIM]), nvme_fetch + nvme_optim) + publish;
    }
    zp_finish_time(p, sp, nvme_tbw);
    zp_tp_add_time(job, sp, nvme_tbw, p);
}

void zp_finish_time(zp_plan *p, const zp_speeds *sp, double nvme_tbw)
{
    const double *t = p->seconds;
    p->bottleneck = ZP_BN_COMPUTE;
    for (int b = 1; b < ZP_N_BOTTLENECKS; b++)
        if (t[b] > t[p->bottleneck])
            p->bottleneck = (zp_bottleneck)b;
    p->tokens_per_s = (double)p->tokens / p->step_seconds;
    p->mfu = p->model_flops / p->step_seconds / sp->flops;
    p->nvme_write_per_day = (double)p->nvme_write_bytes * 86400.0 / p->step_seconds;
    p->days_to_tbw =
        nvme_tbw > 0 && p->nvme_write_per_day > 0 ? nvme_tbw / p->nvme_write_per_day : 0;
}

/* ---- one strategy ---- */

/* A fixed-homes plan in the per-chunk plan's terms: every chunk at its
 * homes, groups of one micro-batch, layer inputs on the device. */
static void note_fixed_homes(zp_plan *p, const zp_job *job, const zp_hardware *hw)
{
    p->mode = job->mode;
    p->param_homes[p->param_home] = p->fp.n_chunks;
    p->optim_homes[p->optim_home] = p->fp.n_chunks;
    p->micro_group = 1;
    p->n_groups = job->grad_accum;
    p->act_home = ZP_ACT_DEVICE;
    p->host_budget = hw->host_bytes;
    p->h2d_param_bytes = p->h2d_bytes;
    p->d2h_grad_bytes = p->d2h_bytes;
}

static zo_status plan_with_chunk(const zp_job *job, const zp_hardware *hw, const zp_speeds *sp,
                                 zp_strategy s, double nvme_tbw, uint64_t chunk, zp_plan *p,
                                 uint64_t *work)
{
    memset(p, 0, sizeof *p);
    p->strategy = s;
    zp_strategy_homes(s, &p->param_home, &p->optim_home);
    p->fits = 1;
    /* the device's Adam op updates fp32 and bf16 moments on a GPU, not 8-bit ones */
    p->supported = !(p->optim_home == ZO_TIER_DEVICE && strcmp(hw->backend, "cuda") == 0 &&
                     job->state_dtype != ZO_DTYPE_F32 && job->state_dtype != ZO_DTYPE_BF16);
    if (!p->supported)
        zp_refuse(p,
                  "optimizer states on the GPU (optim_home=device) in %s: its Adam op updates "
                  "fp32 and bf16 moments only; choose those, or home the states on the host or "
                  "NVMe",
                  zo_state_format_of(job->state_dtype)->name);
    ZT_TRY(plan_memory(p, job, hw, chunk, work));
    ZT_TRY(plan_traffic(p, job, hw, chunk, work));
    plan_time(p, job, hw, sp, nvme_tbw);
    note_fixed_homes(p, job, hw);
    return ZO_OK;
}

/* A chunk that holds a whole block (its tensors at the engine's 256-byte
 * alignment), rounded to 4 KiB. */
uint64_t zp_block_chunk_bytes(const zp_job *job)
{
    const zt_shape *s = &job->shape;
    uint64_t b = 0;
    for (int i = 0; i < zt_layer_tensors(s, 1); i++)
        b += (zt_tp_numel(s, zp_tp(job), 1, i) * zp_param_bytes(job) + 255) / 256 * 256;
    return (b + 4095) / 4096 * 4096;
}

/* p better than q: fits, then faster, then smaller. */
static int better(const zp_plan *p, const zp_plan *q)
{
    if (p->fits != q->fits)
        return p->fits > q->fits;
    if (p->step_seconds != q->step_seconds)
        return p->step_seconds < q->step_seconds;
    return p->device.total + p->pinned.total + p->host.total <
           q->device.total + q->pinned.total + q->host.total;
}

zo_status zp_check_layout(const zp_job *job)
{
    if (!job->layout.struct_size)
        return ZO_OK;
    if (!job->flash_attention)
        return zt_fail(ZO_ERR_CONFIG, "sparse_attention is a block layout of the fused attention "
                                      "op: use --attention flash, not dense");
    double share;
    ZT_TRY(zt_layout_share(&job->layout, 0, job->seq, &share));
    return zt_layout_share(&job->layout, job->shape.window, job->seq, &share);
}

zo_status zp_plan_strategy(const zp_job *job, const zp_hardware *hw, const zp_speeds *sp,
                           zp_strategy s, double nvme_tbw, zp_plan *out, uint64_t *work)
{
    if ((unsigned)s >= ZP_N_STRATEGIES)
        return zt_fail(ZO_ERR_INVALID_ARG, "strategy %d", (int)s);
    ZT_TRY(zt_shape_check(&job->shape));
    ZT_TRY(zp_check_layout(job));
    if (job->seq <= 0 || job->micro_batch <= 0 || job->grad_accum <= 0)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "seq %d, micro-batch %d, grad-accum %d: each must be > 0", job->seq,
                       job->micro_batch, job->grad_accum);
    if (!(sp->h2d > 0 && sp->d2h > 0 && sp->nvme_read > 0 && sp->nvme_write > 0 &&
          sp->adam_params > 0 && sp->flops > 0))
        return zt_fail(ZO_ERR_INVALID_ARG, "every speed must be > 0");
    uint64_t chunks[2] = {job->chunk_bytes ? job->chunk_bytes : zp_default_chunk_bytes(job),
                          zp_block_chunk_bytes(job)};
    int n = job->chunk_bytes || chunks[1] <= chunks[0] ? 1 : 2;
    ZT_TRY(plan_with_chunk(job, hw, sp, s, nvme_tbw, chunks[0], out, work));
    if (n == 2) {
        zp_plan alt;
        ZT_TRY(plan_with_chunk(job, hw, sp, s, nvme_tbw, chunks[1], &alt, work));
        if (better(&alt, out))
            *out = alt;
    }
    return ZO_OK;
}

int zp_recommend(const zp_plan *plans, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (plans[i].fits && (best < 0 || plans[i].step_seconds < plans[best].step_seconds))
            best = i;
    return best;
}

/* ---- DeepSpeed's estimators, for comparison ----
 * ZeRO-2 (optimizer offload or not): GPU 2 B/param with offload, else
 * 4 + 16 B/param; CPU max(4 x GPUs, 16) B/param with offload, else 4 x GPUs
 * per node; both CPU figures x 1.5. ZeRO-3 (largest layer's 4 B/param on the
 * GPU always): params and optimizer offloaded 18 B/param on the CPU; only
 * the optimizer 16 (plus 2 B/param on the GPU); none 18 B/param on the GPU;
 * CPU x 1.5; with zero_init the non-offload CPU need is the largest layer's
 * 4 B/param per GPU, without it the whole model's. One GPU, one node. */
void zp_deepspeed_estimate(uint64_t n_params, uint64_t largest_layer, zp_ds_row rows[ZP_DS_ROWS])
{
    const double P = (double)n_params, big = 4.0 * (double)largest_layer, f = 1.5;
    rows[0] =
        (zp_ds_row){"zero2", "offload_optimizer=cpu", (uint64_t)(P * 16 * f), (uint64_t)(2 * P)};
    rows[1] = (zp_ds_row){"zero2", "offload_optimizer=none", (uint64_t)(P * 4 * f),
                          (uint64_t)(4 * P + 16 * P)};
    rows[2] = (zp_ds_row){"zero3", "offload_param=cpu, offload_optimizer=cpu, zero_init=1",
                          (uint64_t)(P * 18 * f), (uint64_t)big};
    rows[3] = (zp_ds_row){"zero3", "offload_param=cpu, offload_optimizer=cpu, zero_init=0",
                          (uint64_t)(P * 18 * f), (uint64_t)big};
    rows[4] = (zp_ds_row){"zero3", "offload_param=none, offload_optimizer=cpu, zero_init=1",
                          (uint64_t)(P * 16 * f), (uint64_t)(big + 2 * P)};
    rows[5] = (zp_ds_row){"zero3", "offload_param=none, offload_optimizer=cpu, zero_init=0",
                          (uint64_t)(P * 16 * f), (uint64_t)(big + 2 * P)};
    rows[6] = (zp_ds_row){"zero3", "offload_param=none, offload_optimizer=none, zero_init=1",
                          (uint64_t)(big * f), (uint64_t)(big + 18 * P)};
    rows[7] = (zp_ds_row){"zero3", "offload_param=none, offload_optimizer=none, zero_init=0",
                          (uint64_t)(P * 4 * f), (uint64_t)(big + 18 * P)};
}
