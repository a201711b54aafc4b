/* The host side of the 16-bit gradients: where each chunk's gradients land
 * after their D2H and wait for the update. A chunk whose parameters and
 * states are both off NVMe has a pinned mirror of them (two by step parity
 * in dpu mode), the D2H's target. A chunk with its parameters or its states
 * on NVMe has no whole-model mirror: its gradients come down into a ring of pinned chunk
 * buffers sized by the staging depth (eng_staging_depth), the host job reads
 * them there (accumulation, norms, the speculative update), and then, when
 * the update needs them in 16 bits (one micro-batch per step), they are kept
 * in pageable host memory as far as the host budget allows and spilled to
 * checksummed NVMe extents beyond it, read back into the states' stages by
 * the update. Only where the bytes wait changes: the update reads the same
 * 16-bit values, so every mode trains bitwise as with the mirrors.
 *
 * In sync mode the update needs every gradient after the global norm; in
 * overlap mode the speculative update reads them from the ring as they
 * arrive, and the kept or spilled copies serve a rollback's redo; in dpu
 * mode the step's gradients wait by parity while the next step's come down.
 * Spill writes run behind the job thread and are waited for when their ring
 * slot is taken again or before the update (eng_grads_settle): a failed
 * write fails the step, whose retry writes the gradients anew.
 *
 * Below the tiers (engine_tier_nvme.c reads spilled gradients back through
 * eng_grads_read_back); calls only engine_tier_common.c and engine_io.c. */
#include <stdlib.h>
#include <string.h>

#include "engine_tier.h"

/* ---- the plan ---- */

/* Layer-major groups stage their fp32 sums only with one group per step
 * (each chunk's sum comes down once, no running sum goes back up) and not
 * in dpu mode (whose backward fills a second set while the update reads
 * the first). */
static int group_stages(const zo_engine_config *c)
{
    return c->micro_group >= c->grad_accum_steps && c->mode != ZO_OPTIM_DPU;
}

/* A chunk whose parameters or states are on NVMe: its update goes through
 * the NVMe stages, which read spilled gradients back (parameters on NVMe
 * take states there too, eng_place_homes). Under ZeRO every chunk: its host
 * job reduces its final gradients over the ranks at once (engine_zero.c),
 * so no rank needs a whole-model mirror, owner or not. */
int eng_grads_staged(const eng_plan_in *in, uint32_t c)
{
    int nvme = eng_p16_home(in, c) == ZO_TIER_NVME || eng_states_home(in, c) == ZO_TIER_NVME;
    return (nvme || eng_zero_on(in->cfg)) && (!in->grouped || group_stages(in->cfg));
}

/* The update reads the staged gradients after their host job (16-bit with
 * one micro-batch per step, the fp32 sums when grouped); else the host's
 * fp32 accumulators hold them. Under ZeRO the update reads the reduced fp32
 * gradients the host job left (zgrad): the staged ones wait nowhere. */
static int plan_waits(const eng_plan_in *in)
{
    return !eng_zero_on(in->cfg) && (in->grouped || in->cfg->grad_accum_steps == 1);
}

static int waits(const struct zo_engine *e)
{
    return !eng_zero_on(&e->cfg) && (e->grads.grouped || e->cfg.grad_accum_steps == 1);
}

/* A chunk's gradients as they come down: in param_dtype, grouped the fp32 sums. */
static uint64_t grad_chunk_bytes(const zo_engine_config *c, uint64_t chunk_bytes, int grouped)
{
    return grouped ? eng_f32_chunk_bytes(c, chunk_bytes) : chunk_bytes;
}

/* Bytes per element of the gradients that come down: 16-bit, grouped fp32. */
static size_t elem_bytes(const struct zo_engine *e)
{
    return e->grads.grouped ? sizeof(float) : e->pel;
}

/* Where the update finds chunk k's gradients of `parity`. */
static void set_grads(struct zo_engine *e, eng_chunk *k, int parity, void *p)
{
    if (e->grads.grouped)
        k->acc[parity] = p;
    else
        k->g16[parity] = p;
}

/* Staged chunks' gradients kept in host memory within the host budget,
 * which fp's pinned and host bytes (everything else, the stages' room to
 * read spilled ones back included) already take. */
static uint32_t plan_kept(const eng_plan_in *in, const zo_engine_footprint *fp, uint32_t staged)
{
    uint64_t gb = grad_chunk_bytes(in->cfg, in->chunk_bytes, in->grouped);
    uint64_t per = (uint64_t)in->grad_bufs * gb, budget = in->cfg->host_bytes;
    uint64_t base = fp->pinned + fp->bytes[ZO_TIER_HOST];
    if (!budget || base + staged * per <= budget)
        return staged;
    uint64_t fit = budget > base ? (budget - base) / per : 0;
    return (uint32_t)fit;
}

void eng_grads_account(const eng_plan_in *in, zo_engine_footprint *fp, uint32_t *kept,
                       uint32_t *spilled)
{
    uint64_t C = in->chunk_bytes, G = (uint64_t)in->grad_bufs;
    uint32_t staged = 0;
    for (uint32_t c = 0; c < in->n_chunks; c++)
        staged += eng_grads_staged(in, c) != 0;
    uint32_t depth = eng_staging_depth(in->cfg), ring = staged < depth ? staged : depth;
    uint64_t gb = grad_chunk_bytes(in->cfg, C, in->grouped);
    fp->grad_pinned = (uint64_t)(in->n_chunks - staged) * G * gb + (uint64_t)ring * gb;
    fp->pinned += fp->grad_pinned;
    *kept = *spilled = 0;
    if (!staged || !plan_waits(in))
        return; /* the fp32 accumulators hold the step's gradients */
    /* the stages keep room for reading spilled gradients back whether any
     * spill or not: the pinned staging is the same under any host budget */
    fp->grad_stage = ENG_NVME_STAGES * gb;
    fp->pinned += fp->grad_stage;
    *kept = plan_kept(in, fp, staged);
    *spilled = staged - *kept;
    fp->grad_host = (uint64_t)*kept * G * gb;
    fp->bytes[ZO_TIER_HOST] += fp->grad_host;
    uint64_t extent =
        zo_round_up(in->max_chunk_elems * (in->grouped ? sizeof(float) : eng_param_bytes(in->cfg)),
                    ZO_SWAP_ALIGN);
    fp->grad_nvme = (uint64_t)*spilled * G * extent;
    fp->bytes[ZO_TIER_NVME] += fp->grad_nvme;
}

uint64_t eng_grads_stage_room(const struct zo_engine *e)
{
    return e->fp.grad_stage ? grad_chunk_bytes(&e->cfg, e->chunk_bytes, e->grads.grouped) : 0;
}

/* ---- placement ---- */

/* Pinned mirrors for the chunks that are not staged (grouped: their fp32
 * group sums): one set, buffer by buffer and chunk by chunk within. */
static zo_status place_mirrors(struct zo_engine *e, int grouped)
{
    size_t n = 0;
    for (uint32_t c = 0; c < e->n_chunks; c++)
        n += e->chunks[c].g_staged ? 0 : (size_t)e->grads.bufs;
    void **tmp = calloc(n ? n : 1, sizeof *tmp);
    if (!tmp)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "allocating a pointer table");
    zo_status st = eng_take_pinned(e, grad_chunk_bytes(&e->cfg, e->chunk_bytes, grouped), n, tmp);
    size_t i = 0;
    for (int b = 0; st == ZO_OK && b < e->grads.bufs; b++)
        for (uint32_t c = 0; c < e->n_chunks; c++) {
            eng_chunk *k = &e->chunks[c];
            if (k->g_staged)
                continue;
            if (grouped)
                k->acc[b] = tmp[i++];
            else
                k->g16[b] = tmp[i++];
        }
    free(tmp);
    return st;
}

static zo_status place_ring(struct zo_engine *e, uint32_t staged)
{
    uint32_t depth = eng_staging_depth(&e->cfg);
    e->grads.n_ring = staged < depth ? staged : depth;
    if (!e->grads.n_ring)
        return ZO_OK;
    e->grads.ring = calloc(e->grads.n_ring, sizeof *e->grads.ring);
    void **tmp = calloc(e->grads.n_ring, sizeof *tmp);
    zo_status st = e->grads.ring && tmp
                       ? eng_take_pinned(e, e->grads.bytes, e->grads.n_ring, tmp)
                       : ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "allocating the ring");
    for (uint32_t s = 0; st == ZO_OK && s < e->grads.n_ring; s++) {
        e->grads.ring[s].ptr = tmp[s];
        e->grads.ring[s].chunk = -1;
    }
    free(tmp);
    return st;
}

/* The spilled chunks' extents, one per parity, and the buffers they move
 * through registered with their store. */
static zo_status place_spill(struct zo_engine *e)
{
    uint64_t n = (uint64_t)e->grads.spilled_chunks * (uint64_t)e->grads.bufs, fullest = 0;
    for (uint32_t c = 0; c < e->n_chunks; c++)
        if (e->chunks[c].n_elems > fullest)
            fullest = e->chunks[c].n_elems;
    e->grads.extent = zo_round_up(fullest * elem_bytes(e), ZO_SWAP_ALIGN);
    ZO_TRY(eng_open_store(e, e->grads.extent, n, "-grad", &e->grads.swap));
    eng_store_opened(e, e->grads.swap, e->grads.extent);
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        eng_chunk *k = &e->chunks[c];
        for (int b = 0; k->g_staged && !k->g_kept && b < e->grads.bufs; b++)
            ZO_TRY(zo_swap_alloc_extent(e->grads.swap, 2ull * c + (uint64_t)b, &k->gext[b]));
    }
    for (uint32_t s = 0; s < e->grads.n_ring; s++)
        ZO_TRY(zo_swap_register_buffer(e->grads.swap, e->grads.ring[s].ptr, e->grads.bytes));
    for (int i = 0; i < (int)ENG_NVME_STAGES; i++)
        ZO_TRY(zo_swap_register_buffer(e->grads.swap, e->nvme.stage[i], e->nvme.stage_bytes));
    return ZO_OK;
}

/* After the tiers placed (the stages the spilled gradients are read into). */
zo_status eng_grads_place(struct zo_engine *e, int grouped)
{
    e->grads.bytes = grad_chunk_bytes(&e->cfg, e->chunk_bytes, grouped); /* g_grouped: at packing */
    ZO_TRY(place_mirrors(e, grouped));
    uint32_t staged = 0;
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        eng_chunk *k = &e->chunks[c];
        k->gring = -1;
        if (k->g_staged)
            k->g_kept = staged++ < e->grads.kept_chunks;
    }
    ZO_TRY(place_ring(e, staged));
    uint64_t per = (uint64_t)e->grads.bufs * e->grads.bytes;
    float *host = NULL;
    ZO_TRY(eng_host_alloc(e, e->grads.kept_chunks * per, &host));
    e->grads.host = host;
    uint64_t i = 0;
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        eng_chunk *k = &e->chunks[c];
        for (int b = 0; k->g_staged && k->g_kept && b < e->grads.bufs; b++)
            k->gkeep[b] = (char *)e->grads.host + (i++) * e->grads.bytes;
    }
    return e->grads.spilled_chunks ? place_spill(e) : ZO_OK; /* room in the stages: fp */
}

void eng_grads_release(struct zo_engine *e)
{
    if (e->grads.ring)
        eng_grads_abandon(e);
    if (e->grads.swap) {
        for (uint32_t s = 0; s < e->grads.n_ring; s++)
            zo_swap_unregister_buffer(e->grads.swap, e->grads.ring[s].ptr);
        for (int i = 0; i < (int)ENG_NVME_STAGES; i++)
            if (e->nvme.stage[i])
                zo_swap_unregister_buffer(e->grads.swap, e->nvme.stage[i]);
        zo_swap_close(e->grads.swap);
        e->grads.swap = NULL;
    }
    free(e->grads.ring);
    e->grads.ring = NULL;
    e->grads.n_ring = 0;
    eng_host_free(e->grads.host);
    e->grads.host = NULL;
}

/* ---- a step ---- */

/* Wait for the spill write from ring slot s (taken out under e->jobs.mu). */
static zo_status finish_spill(struct zo_engine *e, zo_swap_io_t io, int chunk)
{
    zo_status st = eng_timed_swap_wait(e, io);
    if (st < 0)
        return ZO_FAIL(st, ENG_SUBSYS, "spilling the gradients of layer %d to NVMe: %s",
                       e->chunks[chunk].layer, zo_last_error());
    return ZO_OK;
}

/* A free ring slot, under e->jobs.mu: one neither held nor writing, else the
 * first writing one once its write landed, else wait for a job to free
 * one. -1 with the failure when the step is failing. */
static int take_slot(struct zo_engine *e, zo_status *st)
{
    for (;;) {
        if (e->jobs.async_st < 0) {
            *st = ZO_FAIL(e->jobs.async_st, ENG_SUBSYS, "%s", e->jobs.async_msg);
            return -1;
        }
        int writing = -1;
        for (uint32_t s = 0; s < e->grads.n_ring; s++) {
            eng_gring *r = &e->grads.ring[s];
            if (!r->busy && !r->io)
                return (int)s;
            if (!r->busy && writing < 0)
                writing = (int)s;
        }
        if (writing >= 0) {
            eng_gring *r = &e->grads.ring[writing];
            zo_swap_io_t io = r->io;
            r->io = NULL;
            r->busy = 1; /* ours while its write is waited for */
            pthread_mutex_unlock(&e->jobs.mu);
            *st = finish_spill(e, io, r->chunk);
            pthread_mutex_lock(&e->jobs.mu);
            r->busy = 0;
            if (*st < 0)
                return -1;
            return writing;
        }
        pthread_cond_wait(&e->jobs.cv, &e->jobs.mu);
    }
}

zo_status eng_grads_stage(struct zo_engine *e, uint32_t c, int parity)
{
    eng_chunk *k = &e->chunks[c];
    if (!k->g_staged)
        return ZO_OK;
    zo_status st = ZO_OK;
    pthread_mutex_lock(&e->jobs.mu);
    int s = take_slot(e, &st);
    if (s >= 0) {
        e->grads.ring[s].busy = 1;
        e->grads.ring[s].chunk = (int)c;
    }
    pthread_mutex_unlock(&e->jobs.mu);
    ZO_TRY(st);
    k->gring = s;
    set_grads(e, k, parity, e->grads.ring[s].ptr);
    return ZO_OK;
}

/* The step's final gradients of chunk c, in ring slot r, to where they wait
 * for the update: its pageable copy, or its extent (the write left in *io). */
static zo_status keep_or_spill(struct zo_engine *e, uint32_t c, int parity, eng_gring *r,
                               zo_swap_io_t *io)
{
    eng_chunk *k = &e->chunks[c];
    if (k->g_kept) {
        memcpy(k->gkeep[parity], r->ptr, k->n_elems * elem_bytes(e));
        set_grads(e, k, parity, k->gkeep[parity]);
        return ZO_OK;
    }
    set_grads(e, k, parity, NULL); /* read back into a stage by the update */
    k->ggen[parity]++;
    return eng_swap_async(e, 1, 2, c, k->gext[parity], r->ptr,
                          zo_round_up(k->n_elems * elem_bytes(e), ZO_SWAP_ALIGN), k->ggen[parity],
                          io);
}

zo_status eng_grads_done(struct zo_engine *e, const eng_job *j)
{
    eng_chunk *k = &e->chunks[j->chunk];
    if (!k->g_staged)
        return ZO_OK;
    eng_gring *r = &e->grads.ring[k->gring];
    zo_swap_io_t io = NULL;
    zo_status st = ZO_OK;
    if (j->last && waits(e))
        st = keep_or_spill(e, (uint32_t)j->chunk, j->parity, r, &io);
    pthread_mutex_lock(&e->jobs.mu);
    r->io = io;
    r->busy = 0;
    k->gring = -1;
    pthread_cond_broadcast(&e->jobs.cv);
    pthread_mutex_unlock(&e->jobs.mu);
    return st;
}

zo_status eng_grads_settle(struct zo_engine *e)
{
    zo_status first = ZO_OK;
    for (uint32_t s = 0; s < e->grads.n_ring; s++) {
        eng_gring *r = &e->grads.ring[s];
        pthread_mutex_lock(&e->jobs.mu);
        zo_swap_io_t io = r->io;
        r->io = NULL;
        pthread_mutex_unlock(&e->jobs.mu);
        zo_status st = io ? finish_spill(e, io, r->chunk) : ZO_OK;
        if (first == ZO_OK && st < 0)
            first = st;
    }
    return first;
}

void eng_grads_abandon(struct zo_engine *e)
{
    for (uint32_t s = 0; s < e->grads.n_ring; s++) {
        eng_gring *r = &e->grads.ring[s];
        if (r->io)
            zo_swap_wait(r->io); /* its failure, if any, was the step's */
        r->io = NULL;
        r->busy = 0;
        r->chunk = -1;
    }
    for (uint32_t c = 0; c < e->n_chunks; c++)
        e->chunks[c].gring = -1;
}

zo_status eng_grads_read_back(struct zo_engine *e, uint32_t c, int parity, float *stage,
                              zo_swap_io_t *io)
{
    eng_chunk *k = &e->chunks[c];
    *io = NULL;
    if (!k->g_staged || k->g_kept || !waits(e))
        return ZO_OK;
    void *room = (char *)stage + e->nvme.stage_bytes - eng_grads_stage_room(e);
    set_grads(e, k, parity, room);
    return eng_swap_async(e, 0, 2, c, k->gext[parity], room,
                          zo_round_up(k->n_elems * elem_bytes(e), ZO_SWAP_ALIGN), k->ggen[parity],
                          io);
}
