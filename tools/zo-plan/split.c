/* zo-plan's per-chunk planner (zp_plan_split): each chunk's 16-bit
 * parameters and optimizer states homed on the device, the host or NVMe
 * under hard budgets, layer-major micro-batch groups, and where the layer
 * inputs the backward recomputes from are kept.
 *
 * Memory is the engine's footprint for the chosen caps (zo_engine_footprint_for:
 * the code zo_engine_finalize runs), given the host budget less what the plan
 * keeps beside the engine, so that the engine itself keeps the waiting
 * gradients up to it and spills the rest; plus zo-train's layer inputs
 * (zp_plan.modelled, plan.h, is what the engine would not compute: nothing
 * now). Time is the
 * bytes each link moves per step over the machine's speeds:
 *   compute  forward, recompute and backward FLOPs / the model's rate
 *   h2d      parameter loads (the engine's eviction simulated over one pass
 *            of the fetch order per group), the layer inputs coming back for
 *            the backward when they live on the host, and the upload of the
 *            device-resident parameters after the update
 *   d2h      gradients: 16-bit per micro-batch in groups of one, fp32 once
 *            per group otherwise; the layer inputs going to the host
 *   nvme     the optimizer states of the chunks homed there (packed, read and
 *            written by the update), 16-bit parameters homed there, the
 *            copies of device-resident ones whose states are there (written
 *            by the update, read back at the next fetch), the gradients the
 *            host cannot keep (written in the backward, read by the update in
 *            sync mode), and the layer inputs homed there (every block's input
 *            written in the forward, read back in the backward, beside the
 *            compute)
 *   optim    CPU Adam over every parameter
 * On a GPU the links run beside the compute; the update follows the backward
 * (sync), runs under the last group's backward (overlap: each chunk as its
 * final gradients arrive) or under the next step (dpu). On the cpu device
 * the compute, copies and optimizer share the cores and add up. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "plan_internal.h"
#include "tensor.h"
#include "zo/swap.h"
#include "zo/units.h"
#include "zt_error.h"

/* NVMe state staging slots of the engine (ENG_NVME_STAGES) */
#define ZP_NVME_STAGES 3u
/* layers of gradients in flight to the host */
#define ZP_GRAD_STAGES 2u

typedef struct cand {
    zo_optim_mode mode;
    int group;
    zp_act_home act;
    uint64_t chunk;
    zo_tier param_home;
} cand;

typedef struct split_ctx {
    const zp_job *job;
    const zp_hardware *hw;
    const zp_speeds *sp;
    uint64_t pb; /* bytes of a parameter in the slots (zp_param_bytes) */
    double tbw;
    uint64_t *work;
    model_layout m;
    zt_model_config mc; /* the activations' batch */
    uint64_t inputs_mb; /* the layer inputs of one micro-batch */
    uint8_t *p16_home;  /* per chunk, for the candidate being planned */
    uint8_t *states_home;
    uint8_t *resident;
    uint64_t host_floor; /* the least host need seen over the candidates */
} split_ctx;

/* What a candidate needs besides the engine's footprint: zo-train's
 * activations for the group. */
typedef struct extra {
    int grouped; /* the engine sums the group's gradients on the device (G > 1, M > 1) */
    zt_activation_parts act; /* zo-train's arena for the group (device) */
    uint64_t act_host;       /* the group's layer inputs in pinned host memory (zo-train's; on
                                NVMe: their staging ring) */
    uint64_t act_carry;      /* on NVMe: the residual streams carried in pageable memory */
    uint64_t act_nvme;       /* on NVMe: the block inputs' extents */
} extra;

zo_engine_config zp_plan_engine_config(const zp_job *job, const zp_hardware *hw, const zp_plan *p)
{
    zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
    c.param_dtype = job->dtype;
    c.chunk_bytes = p->fp.chunk_bytes;
    c.param_home = p->param_home;
    c.optim_home = p->optim_home;
    c.param_caps = p->param_caps;
    c.optim_caps = p->optim_caps;
    /* an engine budget of 0 would mean "unlimited": the plan is against one byte */
    c.device_bytes = p->device.engine_budget ? p->device.engine_budget : 1;
    c.pinned_bytes = hw->pinned_max;
    c.mode = p->mode;
    c.update_behind = !job->no_update_behind; /* zo-train's: two gradient buffers */
    c.grad_accum_steps = job->grad_accum;
    c.micro_group = p->micro_group;
    c.state_dtype = job->state_dtype;
    c.host_bytes = p->engine_host_budget;
    c.master_split = job->master_split;
    if (job->world_size > 1) { /* rank 0 of a ZeRO plan (world.h) */
        c.world_size = job->world_size;
        c.zero_stage = job->zero_stage;
    }
    return c;
}

/* The engine's footprint under cfg (its host_bytes included). The engine
 * refusing the host tier alone is no refusal here: check_budgets judges the
 * plan's host total, the engine's pinned and pageable bytes plus the terms
 * beside them against the budget those terms were taken from (the same sum),
 * and says so in the plan's words. */
static zo_status footprint(split_ctx *x, const zo_engine_config *cfg, zo_engine_footprint *fp,
                           int *fits, char *msg, size_t cap)
{
    zo_engine_layout ly = zp_engine_layout(&x->m);
    char why[400] = "";
    *fp = (zo_engine_footprint)ZO_ENGINE_FOOTPRINT_INIT;
    if (x->work)
        *x->work += x->m.n;
    ZT_LIB(zo_engine_footprint_for(cfg, &ly, fp, fits, why, sizeof why));
    if (!*fits && !strncmp(why, "host tier", 9))
        *fits = 1;
    if (msg && cap)
        snprintf(msg, cap, "%s", *fits ? "" : why);
    return ZO_OK;
}

/* Each chunk's homes under cfg, by the engine's own placement rule
 * (zo_engine_place_homes), for the traffic. */
static zo_status place(split_ctx *x, const zo_engine_config *c)
{
    ZT_LIB(zo_engine_place_homes(c, x->m.n_chunks, x->p16_home, x->states_home));
    for (uint32_t k = 0; k < x->m.n_chunks; k++)
        x->resident[k] = x->p16_home[k] == ZO_TIER_DEVICE;
    return ZO_OK;
}

static void count_homes(const split_ctx *x, zp_plan *p)
{
    memset(p->param_homes, 0, sizeof p->param_homes);
    memset(p->optim_homes, 0, sizeof p->optim_homes);
    for (uint32_t k = 0; k < x->m.n_chunks; k++) {
        p->param_homes[x->p16_home[k]]++;
        p->optim_homes[x->states_home[k]]++;
    }
}

/* Device-resident chunks whose states are on NVMe: their 16-bit copy is on
 * NVMe beside the states (the engine's eng_param_tier_device_nvme), but
 * with a split master (rebuilt from pinned host copies). */
static int p16_backed(const split_ctx *x, uint32_t k)
{
    return x->p16_home[k] == ZO_TIER_DEVICE && x->states_home[k] == ZO_TIER_NVME &&
           !x->job->master_split;
}

/* Chunks whose 16-bit parameters have NVMe extents: homed there, or backed. */
static uint32_t p16_on_nvme(const split_ctx *x)
{
    uint32_t n = 0;
    for (uint32_t k = 0; k < x->m.n_chunks; k++)
        n += x->p16_home[k] == ZO_TIER_NVME || p16_backed(x, k);
    return n;
}

/* What candidate c needs beyond the engine's footprint under cfg. */
static zo_status extra_terms(split_ctx *x, const cand *c, const zo_engine_config *cfg, extra *e)
{
    const zp_job *job = x->job;
    memset(e, 0, sizeof *e);
    ZT_TRY(place(x, cfg));
    e->grouped = c->group > 1 && job->grad_accum > 1;
    /* the layer inputs as zo-train keeps them (model_shape.h) */
    /* a pipeline stage holds the inputs of its micro-batches in flight */
    int sets = job->act_sets > c->group ? job->act_sets : c->group;
    zt_act_group g = {sets, c->act == ZP_ACT_HOST   ? ZT_ACT_HOST
                            : c->act == ZP_ACT_NVME ? ZT_ACT_NVME
                                                    : ZT_ACT_DEVICE};
    zt_model_activation_parts_group(&x->mc, &g, &e->act);
    e->act.workspace += zp_tp_device_bytes(job); /* zo-train's tensor-parallel buffers */
    e->act.total += zp_tp_device_bytes(job);
    e->act_host = zt_model_host_activation_bytes(&x->mc, &g);
    e->act_carry = zt_model_act_carry_bytes(&x->mc, &g);
    e->act_nvme = zt_model_act_nvme_bytes(&x->mc, &g);
    return ZO_OK;
}

/* The engine's share of the host budget (0: none): what the plan keeps
 * beside its footprint (zo-train's pinned layer inputs) taken out. Within it the engine keeps the
 * step's waiting gradients, in chunk order, and spills the rest to NVMe. */
static uint64_t engine_host_budget(const split_ctx *x, const extra *e)
{
    int64_t v = (int64_t)x->hw->host_bytes - (int64_t)(e->act_host + e->act_carry);
    if (!x->hw->host_bytes)
        return 0;
    return v > 0 ? (uint64_t)v : 1; /* 1, not 0 (unlimited): nothing left for gradients */
}

/* Candidate c's terms beside the engine into *e, and the engine's footprint
 * under cfg with the host budget they leave it (cfg->host_bytes). */
static zo_status cand_footprint(split_ctx *x, const cand *c, zo_engine_config *cfg, extra *e,
                                zo_engine_footprint *fp, int *fits, char *msg, size_t cap)
{
    ZT_TRY(extra_terms(x, c, cfg, e));
    cfg->host_bytes = engine_host_budget(x, e);
    return footprint(x, cfg, fp, fits, msg, cap);
}

static uint64_t host_need(const zo_engine_footprint *fp, const extra *e)
{
    return fp->pinned + fp->bytes[ZO_TIER_HOST] + e->act_host + e->act_carry;
}

/* The most parameter chunks the device keeps resident (0 when even one
 * layer's slots do not fit: *fits 0, msg says why). */
static zo_status fill_device(split_ctx *x, const cand *c, zo_engine_config *cfg, int *fits,
                             char *msg, size_t cap)
{
    zo_engine_footprint fp;
    extra e;
    cfg->param_caps.bytes[ZO_TIER_DEVICE] = 0;
    ZT_TRY(cand_footprint(x, c, cfg, &e, &fp, fits, msg, cap));
    if (!*fits)
        return ZO_OK;
    uint32_t lo = 0, hi = fp.n_chunks;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        int ok = 0;
        cfg->param_caps.bytes[ZO_TIER_DEVICE] = (uint64_t)mid * fp.chunk_bytes;
        ZT_TRY(cand_footprint(x, c, cfg, &e, &fp, &ok, NULL, 0));
        if (ok)
            lo = mid;
        else
            hi = mid - 1;
    }
    cfg->param_caps.bytes[ZO_TIER_DEVICE] = (uint64_t)lo * fp.chunk_bytes;
    return ZO_OK;
}

/* The most chunks whose optimizer states the host keeps (the rest on NVMe)
 * within the host budget; the engine keeps the waiting gradients in what
 * they leave. All of them drop the NVMe staging, so that case is tried on
 * its own first. */
static zo_status fill_host(split_ctx *x, zo_engine_config *cfg, const cand *c, extra *e)
{
    uint64_t H = x->hw->host_bytes, C = cfg->chunk_bytes;
    zo_engine_footprint fp;
    int ok;
    uint32_t n = x->m.n_chunks;
    const uint64_t Z = zp_chunk_state_bytes(cfg->state_dtype, C / x->pb);
    cfg->optim_caps.bytes[ZO_TIER_HOST] = (uint64_t)n * Z;
    ZT_TRY(cand_footprint(x, c, cfg, e, &fp, &ok, NULL, 0));
    if (host_need(&fp, e) <= H)
        return ZO_OK;
    uint32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        cfg->optim_caps.bytes[ZO_TIER_HOST] = (uint64_t)mid * Z;
        ZT_TRY(cand_footprint(x, c, cfg, e, &fp, &ok, NULL, 0));
        if (host_need(&fp, e) <= H)
            lo = mid;
        else
            hi = mid - 1;
    }
    cfg->optim_caps.bytes[ZO_TIER_HOST] = (uint64_t)lo * Z;
    return ZO_OK;
}

/* ---- memory of a candidate ---- */

static void breakdown(split_ctx *x, zp_plan *p, const extra *e)
{
    const zo_engine_footprint *fp = &p->fp;
    uint64_t C = fp->chunk_bytes, S = fp->device_param_slots, res = p->param_homes[ZO_TIER_DEVICE];
    p->device.params = res * C;
    p->device.param_slots = (S - res) * C;
    /* the gradient slots, and their fp32 sums when grouped */
    p->device.grads = (uint64_t)fp->device_grad_slots * C * (e->grouped ? 3 : 1);
    p->device.states = fp->bytes[ZO_TIER_DEVICE] - S * C - p->device.grads;
    p->device.inputs = e->act.inputs;
    p->device.checkpoints = e->act.checkpoints;
    p->device.workspace = e->act.workspace;
    p->device.reserve = x->hw->reserve_bytes;
    p->device.total = fp->bytes[ZO_TIER_DEVICE] + e->act.total + x->hw->reserve_bytes;
    int nvme_states = p->optim_homes[ZO_TIER_NVME] > 0, nvme_p16 = p16_on_nvme(x) > 0;
    uint64_t Z = zp_chunk_state_bytes(x->job->state_dtype, C / x->pb);
    uint64_t Zio = (Z + 4095) / 4096 * 4096;
    uint64_t state_staging = nvme_states ? ZP_NVME_STAGES * (Zio + (nvme_p16 ? C : 0)) : 0;
    uint64_t grads = fp->grad_pinned + fp->grad_stage;
    p->pinned.params = fp->pinned - state_staging - fp->param_staging - grads;
    p->pinned.staging = state_staging;
    p->pinned.twins = fp->param_staging;
    p->pinned.grads = grads;
    p->pinned.total = fp->pinned + e->act_host;
    p->host.states = (uint64_t)p->optim_homes[ZO_TIER_HOST] * Z;
    p->host.backups = p->mode == ZO_OPTIM_OVERLAP ? p->host.states : 0;
    /* the fp32 accumulators, or the waiting gradients the engine keeps */
    p->host.accum = fp->bytes[ZO_TIER_HOST] - p->host.states - p->host.backups;
    p->host.total = fp->bytes[ZO_TIER_HOST] + e->act_carry;
    p->modelled.device = 0;
    p->modelled.pinned = 0; /* the engine's footprint counts the staging */
    p->layer_inputs = e->act_nvme   ? e->act_nvme + e->act_carry
                      : e->act_host ? e->act_host
                                    : e->act.checkpoints;
    p->nvme.layer_inputs = e->act_nvme;
    p->peak_device = fp->bytes[ZO_TIER_DEVICE];
    /* the engine's: zo-train's layer inputs (pinned, carried) aside */
    p->peak_pinned = p->pinned.total - e->act_host;
    p->peak_host = p->host.total - e->act_carry;
}

static void nvme_breakdown(split_ctx *x, zp_plan *p)
{
    uint64_t fullest = 0;
    for (uint32_t c = 0; c < x->m.n_chunks; c++)
        if (x->m.chunks[c].used_bytes > fullest)
            fullest = x->m.chunks[c].used_bytes;
    uint64_t p16_extent = (fullest + 4095) / 4096 * 4096;
    size_t paths = x->hw->n_nvme_paths > 0 ? (size_t)x->hw->n_nvme_paths : 1;
    p->nvme.params = 2ull * p16_on_nvme(x) * p16_extent;
    p->nvme.states = p->fp.bytes[ZO_TIER_NVME] - p->nvme.params - p->fp.grad_nvme;
    /* the spilled gradients' extents: the fullest chunk's fp32 group sums, or 16-bit ones */
    int grouped = p->micro_group > 1 && x->job->grad_accum > 1;
    uint64_t grad_extent = ((grouped ? fullest / x->pb * 4 : fullest) + 4095) / 4096 * 4096;
    p->nvme.payload = p->fp.bytes[ZO_TIER_NVME] + p->nvme.layer_inputs;
    uint64_t act_extent = zt_model_act_extent(&x->mc);
    p->nvme.files =
        zo_swap_files_bytes(p->nvme.layer_inputs, act_extent, paths) +
        zo_swap_files_bytes(p->nvme.states, zp_packed_state_bytes(x->job, fullest), paths) +
        zo_swap_files_bytes(p->nvme.params, p16_extent, paths) +
        zo_swap_files_bytes(p->fp.grad_nvme, grad_extent, paths);
    p->peak_nvme = p->nvme.payload; /* zo-train adds its layer inputs' store to the engine's */
}

static void check_budgets(split_ctx *x, zp_plan *p)
{
    char a[32], b[32], c[32], d[32];
    const zp_hardware *hw = x->hw;
    uint64_t host = p->pinned.total + p->host.total;
    if (host > hw->host_bytes)
        zp_refuse(p,
                  "host tier: %s pinned + %s pageable = %s (the least this plan can take, every "
                  "optimizer state it can on NVMe), but the host budget is %s: short by %" PRIu64
                  " bytes",
                  zo_fmt_bytes_prec(a, sizeof a, p->pinned.total, 1),
                  zo_fmt_bytes_prec(b, sizeof b, p->host.total, 1),
                  zo_fmt_bytes_prec(c, sizeof c, host, 1),
                  zo_fmt_bytes_prec(d, sizeof d, hw->host_bytes, 1), host - hw->host_bytes);
    if (hw->pinned_max && p->pinned.total > hw->pinned_max)
        zp_refuse(p, "pinned tier: %s pinned but at most %s: short by %" PRIu64 " bytes",
                  zo_fmt_bytes_prec(a, sizeof a, p->pinned.total, 1),
                  zo_fmt_bytes_prec(b, sizeof b, hw->pinned_max, 1),
                  p->pinned.total - hw->pinned_max);
    if (p->nvme.files > hw->nvme_bytes)
        zp_refuse(p, "nvme tier: the swap files take %s but %s (%s): short by %" PRIu64 " bytes",
                  zo_fmt_bytes_prec(a, sizeof a, p->nvme.files, 1),
                  hw->nvme_bytes ? "the NVMe paths have less free" : "no NVMe space was given",
                  zo_fmt_bytes_prec(b, sizeof b, hw->nvme_bytes, 1),
                  p->nvme.files - hw->nvme_bytes);
}

/* ---- traffic and time of a candidate ---- */

static zo_status traffic(split_ctx *x, zp_plan *p, uint64_t *publish_bytes)
{
    const zp_job *job = x->job;
    int E = x->m.n_layers;
    uint64_t C = p->fp.chunk_bytes, used = 0, publish = 0, states = 0, paged = 0, nvme_p16 = 0;
    uint64_t backed = 0; /* written by the update, read back at the next fetch */
    uint64_t own = 0;    /* under ZeRO (a pipeline stage's data-parallel group) rank 0's chunks */
    for (uint32_t c = 0; c < x->m.n_chunks; c++) {
        uint64_t u = x->m.chunks[c].used_bytes;
        int mine = zp_rank0_owns(job, x->m.n_chunks, c);
        used += u;
        own += mine ? u : 0;
        publish += x->resident[c] ? u : 0;
        states += x->states_home[c] == ZO_TIER_NVME && mine
                      ? zp_moved_state_bytes(job, u, x->p16_home[c] == ZO_TIER_NVME)
                      : 0;
        paged += !x->resident[c];
        nvme_p16 += x->p16_home[c] == ZO_TIER_NVME;
        backed += (uint64_t)p16_backed(x, c);
    }
    uint64_t loads = 0, load_bytes = 0;
    uint32_t slots = p->fp.device_param_slots - p->param_homes[ZO_TIER_DEVICE];
    if (paged)
        ZT_TRY(zp_step_loads(&x->m, E, slots ? slots : 1, p->n_groups, x->resident, &loads,
                             &load_bytes, x->work));
    uint64_t M = (uint64_t)job->grad_accum;
    p->h2d_param_bytes = load_bytes;
    const uint64_t used32 = used / x->pb * 4; /* the fp32 sums of the used elements */
    p->d2h_grad_bytes = p->micro_group > 1 ? (uint64_t)p->n_groups * used32 : M * used;
    /* a later group's fp32 sums start from the running sum sent back up */
    p->h2d_grad_bytes = p->micro_group > 1 ? (uint64_t)(p->n_groups - 1) * used32 : 0;
    p->h2d_act_bytes = p->d2h_act_bytes = p->act_home >= ZP_ACT_HOST ? M * x->inputs_mb : 0;
    if (p->act_home == ZP_ACT_HOST && p->micro_group <= 1) {
        /* per layer (zt_act_per_layer): every block's input down; all but the
         * last block's back up (it waits on the device for the backward) */
        const uint64_t L = (uint64_t)x->mc.shape.n_layers, one = x->inputs_mb / (L + 1);
        p->d2h_act_bytes = M * L * one;
        p->h2d_act_bytes = M * (L - 1) * one;
    }
    /* on NVMe: every block's input, not the head's (it is carried) */
    p->nvme_act_bytes = p->nvme.layer_inputs
                            ? M * x->inputs_mb / (uint64_t)(x->mc.shape.n_layers + 1) *
                                  (uint64_t)x->mc.shape.n_layers
                            : 0;
    p->h2d_bytes = load_bytes + p->h2d_act_bytes + p->h2d_grad_bytes + publish;
    p->d2h_bytes = p->d2h_grad_bytes + p->d2h_act_bytes;
    p->nvme_state_bytes = states;
    /* the NVMe-homed share of the loads, at the chunks' share of those paged */
    uint64_t p16_reads = paged ? loads * nvme_p16 / paged * C : 0;
    /* spilled gradients move what the chunks hold, not their padding */
    uint64_t cap16 = (uint64_t)x->m.n_chunks * C;
    p->spill_bytes = cap16 ? (uint64_t)((double)p->grad_spill * (double)used / (double)cap16) : 0;
    p->nvme_read_bytes = states + p16_reads + backed * C +
                         (p->mode == ZO_OPTIM_SYNC ? p->spill_bytes : 0) + p->nvme_act_bytes;
    p->nvme_write_bytes = states + (nvme_p16 + backed) * C + p->spill_bytes + p->nvme_act_bytes;
    p->seconds[ZP_BN_H2D] = (double)p->h2d_bytes / x->sp->h2d;
    p->seconds[ZP_BN_D2H] = (double)p->d2h_bytes / x->sp->d2h;
    p->optim_params = job->world_size > 1 ? own / x->pb : p->fp.n_params;
    *publish_bytes = publish;
    return ZO_OK;
}

static void step_time(split_ctx *x, zp_plan *p, uint64_t publish_bytes)
{
    const zp_job *job = x->job;
    const zp_speeds *sp = x->sp;
    p->tokens = (uint64_t)job->grad_accum * job->micro_batch * job->seq;
    double per_token = zp_model_flops_per_token(job);
    p->model_flops = (double)p->tokens * per_token;
    double dev_per_token = zp_device_flops_per_token(job);
    double rate = sp->model_flops > 0 ? sp->model_flops : sp->flops;
    double *t = p->seconds;
    t[ZP_BN_COMPUTE] = (double)p->tokens * dev_per_token / rate;
    /* the forward is a third of the model's FLOPs; the backward the rest and the recompute */
    double t_bwd = t[ZP_BN_COMPUTE] * (1.0 - per_token / 3.0 / dev_per_token);
    uint64_t spill_rd = p->mode == ZO_OPTIM_SYNC ? p->spill_bytes : 0;
    uint64_t upd_rd = p->nvme_state_bytes + spill_rd;
    uint64_t upd_wr = p->nvme_write_bytes - p->spill_bytes - p->nvme_act_bytes;
    /* beside the compute: parameter loads, spills, the layer inputs both ways */
    double nvme_fetch = (double)(p->nvme_read_bytes - upd_rd) / sp->nvme_read +
                        (double)(p->spill_bytes + p->nvme_act_bytes) / sp->nvme_write;
    double nvme_optim = zp_nvme_update_seconds(upd_rd, upd_wr, sp);
    t[ZP_BN_NVME] = nvme_fetch + nvme_optim;
    t[ZP_BN_OPTIM] = (double)p->optim_params / zp_adam_rate(sp, job->state_dtype);
    double publish = (double)publish_bytes / sp->h2d;
    double fetch = t[ZP_BN_H2D] - publish;
    double optim_phase = fmax(t[ZP_BN_OPTIM], nvme_optim);
    p->update_seconds = optim_phase;
    int cpu = strcmp(x->hw->backend, "cuda") != 0;
    if (zp_update_behind(job, p->mode, p->param_homes, p->optim_homes, p->fp.n_chunks)) {
        double fb = cpu ? fmax(t[ZP_BN_COMPUTE] + fetch + t[ZP_BN_D2H], nvme_fetch)
                        : fmax(fmax(t[ZP_BN_COMPUTE], fetch), fmax(t[ZP_BN_D2H], nvme_fetch));
        p->fb_seconds = fb;
        zp_behind_times bt = {fb, t[ZP_BN_COMPUTE] - t_bwd, t[ZP_BN_OPTIM], nvme_optim, nvme_fetch};
        p->step_seconds = zp_behind_step_seconds(&bt, p->fp.n_chunks, cpu) + publish;
    } else if (cpu) {
        double fb = fmax(t[ZP_BN_COMPUTE] + fetch + t[ZP_BN_D2H], nvme_fetch);
        p->fb_seconds = fb;
        p->step_seconds = fb + optim_phase + publish;
    } else {
        double fb = fmax(fmax(t[ZP_BN_COMPUTE], fetch), fmax(t[ZP_BN_D2H], nvme_fetch));
        p->fb_seconds = fb;
        if (p->mode == ZO_OPTIM_SYNC)
            p->step_seconds = fb + optim_phase + publish;
        else if (p->mode == ZO_OPTIM_OVERLAP) /* under the last group's backward */
            p->step_seconds = fb + fmax(0, optim_phase - t_bwd / p->n_groups) + publish;
        else
            p->step_seconds = fmax(fb, optim_phase) + publish;
    }
    zp_finish_time(p, sp, x->tbw);
    zp_tp_add_time(job, sp, x->tbw, p);
}

/* ---- one candidate ---- */

/* The step's gradients the update reads that may wait outside pinned
 * memory (the engine's footprint without a host budget keeps them all),
 * and of those what the engine under the plan's budget spills to NVMe. */
static zo_status grad_store(split_ctx *x, const zo_engine_config *cfg, zp_plan *p)
{
    zo_engine_config all = *cfg;
    zo_engine_footprint fp;
    int ok;
    all.host_bytes = 0;
    ZT_TRY(footprint(x, &all, &fp, &ok, NULL, 0));
    p->grad_store = fp.grad_host;
    p->grad_spill = fp.grad_host - p->fp.grad_host;
    return ZO_OK;
}

/* The least host memory candidate c takes with the device filled as in cfg:
 * no optimizer state in RAM that NVMe could hold, every spillable gradient
 * on NVMe (an engine host budget of one byte keeps none). */
static zo_status note_host_floor(split_ctx *x, const cand *c, zo_engine_config cfg)
{
    zo_engine_footprint fp;
    int ok;
    extra e;
    if (cfg.optim_home == ZO_TIER_NVME)
        cfg.optim_caps.bytes[ZO_TIER_HOST] = 0;
    ZT_TRY(extra_terms(x, c, &cfg, &e));
    cfg.host_bytes = 1;
    ZT_TRY(footprint(x, &cfg, &fp, &ok, NULL, 0));
    uint64_t need = host_need(&fp, &e);
    if (!x->host_floor || need < x->host_floor)
        x->host_floor = need;
    return ZO_OK;
}

static zo_status plan_cand(split_ctx *x, const cand *c, zp_plan *p)
{
    const zp_job *job = x->job;
    const zp_hardware *hw = x->hw;
    memset(p, 0, sizeof *p);
    p->strategy = ZP_SPLIT;
    p->supported = p->fits = 1;
    p->mode = c->mode;
    p->micro_group = c->group;
    p->n_groups = (job->grad_accum + c->group - 1) / c->group;
    p->act_home = c->act;
    p->param_home = c->param_home;
    p->optim_home = hw->nvme_bytes ? ZO_TIER_NVME : ZO_TIER_HOST;
    p->host_budget = hw->host_bytes;
    zo_engine_config cfg = ZO_ENGINE_CONFIG_INIT;
    cfg.param_dtype = job->dtype;
    cfg.chunk_bytes = c->chunk;
    cfg.param_home = c->param_home;
    cfg.optim_home = p->optim_home;
    cfg.pinned_bytes = hw->pinned_max;
    cfg.mode = c->mode;
    cfg.grad_accum_steps = job->grad_accum;
    cfg.micro_group = c->group;
    cfg.state_dtype = job->state_dtype;
    cfg.master_split = job->master_split;
    if (job->world_size > 1) { /* rank 0 of a ZeRO group (a pipeline stage's data-parallel ranks) */
        cfg.world_size = job->world_size;
        cfg.zero_stage = job->zero_stage;
    }
    ZT_TRY(zp_pack_model(&x->m, &cfg, x->m.n_layers));
    /* the device: the arena, the reserve and the group's terms first */
    extra e;
    {
        zo_engine_footprint probe;
        int ok;
        cfg.device_bytes = 0;
        ZT_TRY(footprint(x, &cfg, &probe, &ok, NULL, 0));
        cfg.chunk_bytes =
            probe.chunk_bytes; /* as the engine raised and rounded it: caps count it */
        ZT_TRY(extra_terms(x, c, &cfg, &e));
    }
    uint64_t need = e.act.total + hw->reserve_bytes;
    p->device.engine_budget = hw->device_bytes > need ? hw->device_bytes - need : 0;
    cfg.device_bytes = p->device.engine_budget ? p->device.engine_budget : 1;
    char msg[400] = "", a[32], b[32];
    int fits = 0;
    ZT_TRY(fill_device(x, c, &cfg, &fits, msg, sizeof msg));
    if (p->optim_home == ZO_TIER_NVME)
        ZT_TRY(fill_host(x, &cfg, c, &e));
    if (p->optim_home == ZO_TIER_NVME && c->param_home != ZO_TIER_NVME &&
        cfg.optim_caps.bytes[ZO_TIER_HOST] >=
            (uint64_t)x->m.n_chunks *
                zp_chunk_state_bytes(cfg.state_dtype, cfg.chunk_bytes / x->pb)) {
        /* every chunk's states fit in RAM: they are simply homed there */
        cfg.optim_home = p->optim_home = ZO_TIER_HOST;
        cfg.optim_caps.bytes[ZO_TIER_HOST] = 0;
    }
    p->param_caps = cfg.param_caps;
    p->optim_caps = cfg.optim_caps;
    if (fits)
        ZT_TRY(note_host_floor(x, c, cfg));
    ZT_TRY(cand_footprint(x, c, &cfg, &e, &p->fp, &fits, msg, sizeof msg));
    p->engine_host_budget = cfg.host_bytes;
    count_homes(x, p);
    ZT_TRY(grad_store(x, &cfg, p));
    breakdown(x, p, &e);
    nvme_breakdown(x, p);
    if (!p->device.engine_budget)
        zp_refuse(p, "device tier: the activations (%s)%s fill the %s budget",
                  zo_fmt_bytes_prec(a, sizeof a, need - hw->reserve_bytes, 1),
                  hw->reserve_bytes ? " and the CUDA reserve" : "",
                  zo_fmt_bytes_prec(b, sizeof b, hw->device_bytes, 1));
    else if (!fits)
        zp_refuse(p, "%s (the device budget less %s of activations and group terms)", msg,
                  zo_fmt_bytes_prec(a, sizeof a, need - hw->reserve_bytes, 1));
    check_budgets(x, p);
    uint64_t publish = 0;
    ZT_TRY(traffic(x, p, &publish));
    step_time(x, p, publish);
    return ZO_OK;
}

/* p better than q: fits, then faster, then the smaller host and device need;
 * of two that do not fit, the one closer to fitting. */
static int better(const zp_plan *p, const zp_plan *q, const zp_hardware *hw)
{
    if (p->fits != q->fits)
        return p->fits > q->fits;
    /* the device is what it is; a plan that fits it is closer than one that does not */
    int pd = strncmp(p->why, "device", 6) != 0, qd = strncmp(q->why, "device", 6) != 0;
    if (!p->fits && pd != qd)
        return pd > qd;
    if (!p->fits && zp_plan_overage(p, hw) != zp_plan_overage(q, hw))
        return zp_plan_overage(p, hw) < zp_plan_overage(q, hw);
    if (p->step_seconds != q->step_seconds)
        return p->step_seconds < q->step_seconds;
    if (p->mode != q->mode) /* as fast: the reference mode, with no backups or rollbacks */
        return p->mode == ZO_OPTIM_SYNC;
    return p->device.total + p->pinned.total + p->host.total <
           q->device.total + q->pinned.total + q->host.total;
}

static void describe(const split_ctx *x, zp_plan *p)
{
    char a[32], b[32], c[32], d[32];
    const zp_job *job = x->job;
    int n = 0;
    size_t cap = sizeof p->reason;
    n += snprintf(p->reason + n, cap - (size_t)n,
                  "the device keeps %u of %u parameter chunks resident, the host the optimizer "
                  "states of %u (%s; the rest, %s each way per step, on %s)",
                  p->param_homes[ZO_TIER_DEVICE], p->fp.n_chunks, p->optim_homes[ZO_TIER_HOST],
                  zo_fmt_bytes_prec(a, sizeof a, p->host.states, 1),
                  zo_fmt_bytes_prec(b, sizeof b, p->nvme_state_bytes, 1),
                  p->optim_homes[ZO_TIER_NVME] ? "NVMe" : "nothing");
    if (p->grad_spill && n < (int)cap)
        n += snprintf(p->reason + n, cap - (size_t)n, " and %s of the step's %s of gradients",
                      zo_fmt_bytes_prec(c, sizeof c, p->grad_store - p->grad_spill, 1),
                      zo_fmt_bytes_prec(d, sizeof d, p->grad_store, 1));
    if (n < (int)cap)
        n += snprintf(p->reason + n, cap - (size_t)n,
                      "; micro-group %d of %d: parameters fetched %d time(s) per phase per step; "
                      "layer inputs on the %s (%s); %s mode",
                      p->micro_group, job->grad_accum, p->n_groups, zp_act_where(p->act_home),
                      zo_fmt_bytes_prec(a, sizeof a, p->layer_inputs, 1),
                      zo_optim_mode_name(p->mode));
    if (n < (int)cap && p->mode == ZO_OPTIM_OVERLAP)
        snprintf(p->reason + n, cap - (size_t)n, " (the update runs under the %s backward)",
                 p->n_groups == 1 ? "step's" : "last group's");
}

static zo_status check_job(const zp_job *job, const zp_speeds *sp)
{
    ZT_TRY(zt_shape_check(&job->shape));
    ZT_TRY(zp_check_layout(job));
    if (job->seq <= 0 || job->micro_batch <= 0 || job->grad_accum <= 0)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "seq %d, micro-batch %d, grad-accum %d: each must be > 0", job->seq,
                       job->micro_batch, job->grad_accum);
    if (job->micro_group < 0 || job->micro_group > job->grad_accum)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "micro-group %d: 1..grad-accum (%d), or 0 for the planner's choice",
                       job->micro_group, job->grad_accum);
    if (job->act_home == ZP_ACT_NVME && (job->micro_group == 1 || job->grad_accum == 1))
        return zt_fail(ZO_ERR_UNSUPPORTED,
                       "--act-home nvme at one micro-batch a group (--micro-group %d, "
                       "--grad-accum %d): zo-train puts layer inputs on NVMe only from "
                       "layer-major groups; at one micro-batch a group they go to pinned host "
                       "memory (--act-home host). Use --act-home host or auto, or --micro-group "
                       "2 or more with --grad-accum 2 or more",
                       job->micro_group, job->grad_accum);
    if (job->act_home == ZP_ACT_NVME && job->shape.tied)
        return zt_fail(
            ZO_ERR_UNSUPPORTED,
            "--act-home nvme with a tied head: zo-train keeps the head's gradients per "
            "micro-batch on the device or the host; use --act-home host, device or auto");
    if (!(sp->h2d > 0 && sp->d2h > 0 && sp->nvme_read > 0 && sp->nvme_write > 0 &&
          sp->adam_params > 0 && sp->flops > 0))
        return zt_fail(ZO_ERR_INVALID_ARG, "every speed must be > 0");
    return ZO_OK;
}

static zo_status ctx_init(split_ctx *x)
{
    const zp_job *job = x->job;
    ZT_TRY(zp_layout_init(&x->m, job));
    size_t n = x->m.n ? x->m.n : 1;
    x->p16_home = calloc(n, 1);
    x->states_home = calloc(n, 1);
    x->resident = calloc(n, 1);
    if (!x->p16_home || !x->states_home || !x->resident)
        return zt_fail(ZO_ERR_NO_MEMORY, "the chunks' homes");
    x->mc = zp_model_config(job);
    x->pb = zp_param_bytes(job);
    /* and a tied head's gradients, down after the head, up for the embedding's backward */
    x->inputs_mb = (uint64_t)(x->mc.shape.n_layers + 1) * (uint64_t)job->seq *
                       (uint64_t)job->micro_batch * (uint64_t)job->shape.dim *
                       zo_dtype_size(job->dtype) +
                   zt_head_grad_stride(&x->mc);
    return ZO_OK;
}

static void ctx_free(split_ctx *x)
{
    zp_layout_free(&x->m);
    free(x->p16_home);
    free(x->states_home);
    free(x->resident);
}

/* Every candidate; the best into *out. */
static zo_status search(split_ctx *x, zp_plan *out)
{
    const zp_job *job = x->job;
    zo_optim_mode modes[2] = {job->mode, ZO_OPTIM_OVERLAP};
    int n_modes = job->mode_auto && job->mode != ZO_OPTIM_OVERLAP ? 2 : 1;
    int groups[34], n_groups = 0;
    if (job->micro_group)
        groups[n_groups++] = job->micro_group;
    else if (job->world_size > 1) /* ZeRO's global reduction order takes no layer-major groups */
        groups[n_groups++] = 1;
    else {
        for (int g = 1; g < job->grad_accum && n_groups < 32; g *= 2)
            groups[n_groups++] = g;
        groups[n_groups++] = job->grad_accum;
    }
    zp_act_home acts[3] = {ZP_ACT_DEVICE, ZP_ACT_HOST, ZP_ACT_NVME};
    int n_acts = x->hw->nvme_bytes ? 3 : 2;
    if (job->act_home) {
        acts[0] = job->act_home;
        n_acts = 1;
    }
    uint64_t chunks[2] = {job->chunk_bytes ? job->chunk_bytes : zp_default_chunk_bytes(job),
                          zp_block_chunk_bytes(job)};
    int n_chunks = job->chunk_bytes || chunks[1] <= chunks[0] ? 1 : 2;
    zo_tier homes[2] = {ZO_TIER_HOST, ZO_TIER_NVME};
    int n_homes = x->hw->nvme_bytes ? 2 : 1;
    int have = 0;
    zp_plan *p = malloc(sizeof *p);
    if (!p)
        return zt_fail(ZO_ERR_NO_MEMORY, "a candidate plan");
    zo_status st = ZO_OK;
    for (int mi = 0; mi < n_modes; mi++)
        for (int gi = 0; gi < n_groups; gi++)
            for (int ai = 0; ai < n_acts; ai++)
                for (int ci = 0; ci < n_chunks; ci++)
                    for (int hi = 0; hi < n_homes && st >= 0; hi++) {
                        cand c = {modes[mi], groups[gi], acts[ai], chunks[ci], homes[hi]};
                        if (c.act == ZP_ACT_NVME && job->shape.tied)
                            continue; /* zo-train keeps no tied head's gradients on NVMe */
                        /* one micro-batch a group in pinned host memory is the per-layer
                           store (zt_act_per_layer): the arena keeps two slots, not every
                           block's input, and a longer sequence fits */
                        if (c.act == ZP_ACT_NVME && c.group == 1)
                            continue; /* zo-train has no per-layer NVMe home (check_job) */
                        st = plan_cand(x, &c, p);
                        if (st >= 0 && (!have || better(p, out, x->hw))) {
                            *out = *p;
                            have = 1;
                        }
                    }
    free(p);
    return st;
}

zo_status zp_plan_split(const zp_job *job, const zp_hardware *hw, const zp_speeds *sp,
                        double nvme_tbw, zp_plan *out, uint64_t *work)
{
    ZT_TRY(check_job(job, sp));
    split_ctx x;
    memset(&x, 0, sizeof x);
    x.job = job;
    x.hw = hw;
    x.sp = sp;
    x.tbw = nvme_tbw;
    x.work = work;
    zo_status st = ctx_init(&x);
    if (st >= 0)
        st = search(&x, out);
    if (st >= 0) {
        out->host_floor = x.host_floor;
        /* replay the winner so the placement arrays match it, then say why */
        describe(&x, out);
    }
    ctx_free(&x);
    return st;
}
