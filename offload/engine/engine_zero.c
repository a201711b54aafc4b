/* ZeRO over the ranks of the configuration's communicator (engine.h: stages
 * 1, 2 and 3, every mode): which rank owns a chunk, the "remote"
 * state table of the chunks another rank owns (no storage: the rank never
 * updates them) and at stage 3 their "remote" parameter table and gathers,
 * the reduction of each chunk's gradient as its host job takes it (so no
 * rank keeps 16-bit gradients past it) in reduce_order's order, the norm
 * partials shared by the owners at the end of the step, and the owners'
 * broadcast of the updated 16-bit parameters. The reductions use the
 * communicator's exact chain, so N ranks equal one rank accumulating the
 * same micro-batches: bitwise in the global order, whatever the split. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_tier.h"
#include "zo/half.h"

/* Contiguous ranges in chunk order, as even as counts go: the first
 * n % W ranks own one chunk more. */
int eng_zero_owner(const zo_engine_config *c, uint32_t n_chunks, uint32_t chunk)
{
    if (!eng_zero_on(c))
        return c->rank;
    uint32_t W = (uint32_t)c->world_size, base = n_chunks / W, extra = n_chunks % W;
    uint32_t big = extra * (base + 1);
    if (chunk < big)
        return (int)(chunk / (base + 1));
    return (int)(extra + (chunk - big) / base);
}

static uint32_t owned_chunks(const zo_engine_config *c, uint32_t n_chunks)
{
    uint32_t n = 0;
    for (uint32_t k = 0; k < n_chunks; k++)
        n += eng_zero_owner(c, n_chunks, k) == c->rank;
    return n;
}

zo_status eng_zero_check_plan(const zo_engine_config *c)
{
    if (c->world_size < 1 || c->rank < 0 || c->rank >= c->world_size)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "rank %d of world size %d: expected world_size >= 1 and 0 <= rank < "
                       "world_size",
                       c->rank, c->world_size);
    if (c->zero_stage < 0 || c->zero_stage > 3)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "zero_stage is %d: expected 0, 1, 2 or 3",
                       c->zero_stage);
    if ((unsigned)c->reduce_order > ZO_REDUCE_ORDER_RANK)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "reduce_order is %d: expected ZO_REDUCE_ORDER_GLOBAL or "
                       "ZO_REDUCE_ORDER_RANK",
                       (int)c->reduce_order);
    if (!eng_zero_on(c))
        return ZO_OK; /* one rank: nothing to partition, whatever the stage */
    if (eng_zero_rounds(c) && eng_grouped(c))
        return ZO_FAIL(ZO_ERR_UNSUPPORTED, ENG_SUBSYS,
                       "ZeRO's global reduction order (reduce_order global) reduces each "
                       "micro-batch's gradients over the ranks as they come down, but "
                       "layer-major groups (micro_group %d, grad_accum_steps %d) sum a group's "
                       "micro-batches on the device first: use micro_group 1 (bitwise across "
                       "world sizes), or reduce_order rank to keep the groups (within rounding "
                       "of one rank)",
                       c->micro_group, c->grad_accum_steps);
    if (c->zero_stage == 0)
        return ZO_FAIL(ZO_ERR_UNSUPPORTED, ENG_SUBSYS,
                       "world_size %d with zero_stage 0 (every rank a full copy of the states) "
                       "is not supported: use zero_stage 1, 2 or 3",
                       c->world_size);
    return ZO_OK;
}

zo_status eng_zero_check(const zo_engine_config *c)
{
    if (!eng_zero_on(c))
        return ZO_OK;
    if (!c->comm)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                       "world_size %d needs config.comm (zo_comm_init over the ranks)",
                       c->world_size);
    if (zo_comm_size(c->comm) != c->world_size || zo_comm_rank(c->comm) != c->rank)
        return ZO_FAIL(ZO_ERR_CONFIG, ENG_SUBSYS,
                       "config says rank %d of %d but the communicator is rank %d of %d", c->rank,
                       c->world_size, zo_comm_rank(c->comm), zo_comm_size(c->comm));
    return ZO_OK;
}

/* Sets of reduced gradients: by step parity in dpu mode, as the mode's
 * 16-bit ones are. */
static uint64_t grad_sets(const zo_engine_config *c)
{
    return c->mode == ZO_OPTIM_DPU ? 2 : 1;
}

/* The reduced fp32 gradients a rank keeps, and the scratch: one chunk's
 * states (the initial states of a chunk it does not own are built there to
 * derive its 16-bit parameters; the 16-bit gradients are widened there). */
uint64_t eng_zero_host_bytes(const zo_engine_config *c, uint32_t n_chunks, uint64_t chunk_elems)
{
    if (!eng_zero_on(c))
        return 0;
    uint64_t kept = c->zero_stage == 1 ? n_chunks : owned_chunks(c, n_chunks);
    return kept * grad_sets(c) * chunk_elems * sizeof(float) +
           eng_states_bytes(c->state_dtype, chunk_elems);
}

/* ---- stage 3: the gathers ---- */

/* The most gathers one fetch issues: its layer's chunks and the lookahead's. */
static uint64_t gather_window(const zo_engine_config *c, uint32_t max_cpl)
{
    return (uint64_t)(c->lookahead + 1) * max_cpl;
}

uint64_t eng_zero_gather_slots(const zo_engine_config *c, uint32_t max_cpl)
{
    return eng_zero_p3(c) ? gather_window(c, max_cpl) : 0;
}

/* One window: a fetch's chunks all fit, those already there kept. */
static uint64_t ring_chunks(const zo_engine_config *c, uint32_t max_cpl)
{
    return gather_window(c, max_cpl);
}

uint64_t eng_zero_gather_bytes(const zo_engine_config *c, uint32_t max_cpl, uint64_t chunk_bytes)
{
    return eng_zero_p3(c) ? ring_chunks(c, max_cpl) * chunk_bytes : 0;
}

static zo_status place_gathers(struct zo_engine *e)
{
    ZO_TRY(zo_comm_split(e->cfg.comm, 0, e->cfg.rank, &e->zero.pcomm));
    e->zero.n_g = (uint32_t)ring_chunks(&e->cfg, e->max_cpl);
    e->zero.gbuf = calloc(e->zero.n_g, sizeof *e->zero.gbuf);
    e->zero.g_chunk = calloc(e->zero.n_g, sizeof *e->zero.g_chunk);
    e->zero.g_used = calloc(e->zero.n_g, sizeof *e->zero.g_used);
    e->zero.g_list = calloc(e->zero.n_g, sizeof *e->zero.g_list);
    if (!e->zero.gbuf || !e->zero.g_chunk || !e->zero.g_used || !e->zero.g_list)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "allocating the gather ring");
    eng_zero_forget_gathers(e);
    ZO_TRY(eng_take_pinned(e, e->chunk_bytes, e->zero.n_g, e->zero.gbuf));
    for (uint32_t s = 0; e->nvme.pswap && s < e->zero.n_g; s++) /* its own chunks read from NVMe */
        ZO_TRY(zo_swap_register_buffer(e->nvme.pswap, e->zero.gbuf[s], e->chunk_bytes));
    return ZO_OK;
}

/* On the h2d stream, before the owner's broadcast from buf: its chunk's
 * committed values from its NVMe. A failure is kept for the step's
 * agreement and the broadcast goes ahead: the others wait for it. */
typedef struct gather_read {
    struct zo_engine *e;
    uint32_t c;
    void *buf;
} gather_read;

static zo_status read_for_gather(void *arg)
{
    gather_read *g = arg;
    zo_status st = eng_p16_nvme_read(g->e->chunks[g->c].pctx, g->e, g->c, 0, g->buf);
    return st < 0 ? eng_zero_defer(g->e, st, -1) : ZO_OK;
}

/* The buffer used longest ago outside this fetch's window (whose chunks were
 * marked used now): one exists, the window being at most the ring. */
static uint32_t lru_buffer(const struct zo_engine *e)
{
    uint32_t best = 0;
    for (uint32_t s = 1; s < e->zero.n_g; s++)
        if (e->zero.g_used[s] < e->zero.g_used[best])
            best = s;
    return best;
}

/* The owner sends its current host copy; the others receive into buffer s,
 * behind the H2D copies that read it before (the same stream). */
static zo_status gather_chunk(struct zo_engine *e, uint32_t c)
{
    eng_chunk *k = &e->chunks[c];
    uint32_t s = lru_buffer(e);
    void *buf = e->zero.gbuf[s];
    if (k->owner == e->cfg.rank && eng_p16_nvme(k)) {
        gather_read g = {e, c, buf}; /* the buffer's earlier sends are ahead on the stream */
        ZO_TRY(zo_stream_enqueue(e->h2d, read_for_gather, &g, sizeof g));
    } else if (k->owner == e->cfg.rank) {
        buf = k->p16[k->p16_cur];
    } else {
        k->p16[0] = buf;
    }
    e->zero.g_chunk[s] = (int)c;
    e->zero.g_used[s] = e->zero.g_tick;
    k->zg_slot = (int)s;
    e->zero.g_seq++;
    return zo_comm_broadcast(e->zero.pcomm, e->h2d, buf, k->n_elems, e->cfg.param_dtype, k->owner);
}

/* Layer's partitioned chunks appended to the n in list, each once; those
 * held are marked used by this fetch. */
static uint32_t add_layer(struct zo_engine *e, int layer, uint32_t *list, uint32_t n)
{
    const eng_layer *L = &e->reg.layers[layer];
    for (uint32_t i = 0; i < L->n_chunks; i++) {
        uint32_t c = L->first_chunk + i, j = 0;
        while (j < n && list[j] != c)
            j++;
        if (!e->chunks[c].zpart || j < n)
            continue;
        list[n++] = c;
        if (eng_zero_held(e, c))
            e->zero.g_used[e->chunks[c].zg_slot] = e->zero.g_tick;
    }
    return n;
}

zo_status eng_zero_gather(struct zo_engine *e, int layer, int pos)
{
    if (!eng_zero_p3(&e->cfg))
        return ZO_OK;
    e->zero.g_tick++;
    uint32_t n = add_layer(e, layer, e->zero.g_list, 0);
    for (int a = 1; pos >= 0 && a <= e->cfg.lookahead && pos + a < e->sched.n_trace; a++)
        n = add_layer(e, e->sched.trace[pos + a] / 2, e->zero.g_list, n);
    for (uint32_t i = 0; i < n; i++)
        if (!eng_zero_held(e, e->zero.g_list[i]))
            ZO_TRY(gather_chunk(e, e->zero.g_list[i]));
    return ZO_OK;
}

/* After a step the ranks failed together: a slot loaded from what a failed
 * read (here or, gathered, on its owner) left is dropped, as is every slot
 * of a chunk not resident (the next fetch loads it again). A failure kept
 * for an agreement that never came (the step failed before) goes too. */
static void drop_loaded_slots(struct zo_engine *e)
{
    pthread_mutex_lock(&e->jobs.mu);
    int drop = e->zero.defer_slots;
    e->zero.defer_slots = 0;
    e->zero.defer_st = ZO_OK; /* agreed on, or the step failed before that on this rank alone */
    e->zero.defer_repair = -1;
    pthread_mutex_unlock(&e->jobs.mu);
    for (uint32_t s = 0; drop && s < e->device.n_pslots; s++) {
        eng_pslot *p = &e->device.pslots[s];
        if (p->chunk >= 0 && !e->chunks[p->chunk].pt->resident) {
            e->chunks[p->chunk].slot = -1;
            p->chunk = -1;
        }
    }
}

void eng_zero_forget_gathers(struct zo_engine *e)
{
    drop_loaded_slots(e);
    for (uint32_t c = 0; e->chunks && c < e->n_chunks; c++)
        e->chunks[c].zg_slot = -1;
    for (uint32_t s = 0; s < e->zero.n_g; s++) {
        e->zero.g_chunk[s] = -1;
        e->zero.g_used[s] = 0;
    }
}

static int keeps_grads(const struct zo_engine *e, uint32_t c)
{
    return e->cfg.zero_stage == 1 || e->chunks[c].owner == e->cfg.rank;
}

zo_status eng_zero_place(struct zo_engine *e)
{
    if (!eng_zero_on(&e->cfg))
        return ZO_OK;
    e->zero.defer_repair = -1;
    uint32_t kept = 0;
    for (uint32_t c = 0; c < e->n_chunks; c++)
        kept += keeps_grads(e, c);
    uint64_t scratch = eng_states_bytes(e->cfg.state_dtype, e->chunk_elems);
    ZO_TRY(eng_host_alloc(e, scratch, &e->zero.scratch));
    uint64_t sets = grad_sets(&e->cfg), i = 0;
    if (kept)
        ZO_TRY(eng_host_alloc(e, sets * kept * e->chunk_elems * sizeof(float), &e->zero.grads));
    for (uint64_t b = 0; b < sets; b++)
        for (uint32_t c = 0; c < e->n_chunks; c++)
            if (keeps_grads(e, c))
                e->chunks[c].zgrad[b] = e->zero.grads + (i++) * e->chunk_elems;
    ZO_TRY(zo_comm_split(e->cfg.comm, 0, e->cfg.rank, &e->zero.comm));
    ZO_TRY(zo_stream_create(e->dev, &e->zero.stream));
    if (e->cfg.mode == ZO_OPTIM_DPU) {
        ZO_TRY(zo_comm_split(e->cfg.comm, 0, e->cfg.rank, &e->zero.dcomm));
        ZO_TRY(zo_stream_create(e->dev, &e->zero.dstream));
    }
    return eng_zero_p3(&e->cfg) ? place_gathers(e) : ZO_OK;
}

void eng_zero_release(struct zo_engine *e)
{
    if (e->zero.stream)
        zo_stream_synchronize(e->zero.stream);
    if (e->zero.dstream)
        zo_stream_synchronize(e->zero.dstream);
    zo_stream_destroy(e->zero.stream);
    zo_stream_destroy(e->zero.dstream);
    e->zero.stream = e->zero.dstream = NULL;
    zo_comm_free(e->zero.dcomm);
    e->zero.dcomm = NULL;
    zo_comm_free(e->zero.comm);
    zo_comm_free(e->zero.pcomm); /* the h2d stream that carried its gathers is idle */
    e->zero.comm = e->zero.pcomm = NULL;
    free(e->zero.gbuf); /* the buffers go with the pinned pool */
    free(e->zero.g_list);
    free(e->zero.g_chunk);
    free(e->zero.g_used);
    e->zero.gbuf = NULL;
    e->zero.g_list = NULL;
    e->zero.g_chunk = NULL;
    e->zero.g_used = NULL;
    e->zero.n_g = 0;
    eng_host_free(e->zero.scratch);
    eng_host_free(e->zero.grads);
    e->zero.scratch = e->zero.grads = NULL;
    for (uint32_t c = 0; e->chunks && c < e->n_chunks; c++)
        e->chunks[c].zgrad[0] = e->chunks[c].zgrad[1] = NULL;
}

int zo_engine_tensor_owner(zo_engine_t e, int id)
{
    if (!e || !e->finalized || id < 0 || id >= e->reg.n_tensors)
        return -1;
    return e->chunks[e->reg.tensors[id].chunk].owner;
}

/* ---- the end of a step ---- */

/* out = chunk k's 16-bit gradients of `parity` widened to fp32, added onto
 * base where there is one (base + g, as one rank's accumulator adds). */
static void widen(const struct zo_engine *e, const eng_chunk *k, int parity, const float *base,
                  float *out)
{
    eng_widen_params(e->cfg.param_dtype, k->g16[parity], base, out, k->n_elems);
}

/* The rank order: chunk c's gradient of this rank as fp32, its accumulator
 * (or a layer-major group's sums), or its 16-bit gradients widened into the
 * scratch. */
static const float *rank_sum(struct zo_engine *e, uint32_t c, int parity)
{
    eng_chunk *k = &e->chunks[c];
    if (e->cfg.grad_accum_steps > 1)
        return k->acc[parity];
    widen(e, k, parity, NULL, e->zero.scratch);
    return e->zero.scratch;
}

/* The global order, round j->micro - 1: this rank's part of the round's
 * chain, its micro-batch's gradient widened into the scratch; rank 0's after
 * the first round onto the running sum of the rounds before, which rests at
 * the owner (its reduced gradient) and comes to rank 0 from another owner. */
static zo_status round_part(struct zo_engine *e, uint32_t c, const eng_job *j)
{
    eng_chunk *k = &e->chunks[c];
    const float *sum = NULL;
    int r = e->cfg.rank, carry = j->micro > 1;
    if (carry && k->owner != 0 && r == k->owner) /* ahead of the chain that overwrites it */
        ZO_TRY(zo_comm_send(e->zero.comm, e->zero.stream, k->zgrad[j->parity], k->n_elems,
                            ZO_DTYPE_F32, 0));
    if (carry && k->owner != 0 && r == 0) {
        ZO_TRY(zo_comm_recv(e->zero.comm, e->zero.stream, e->zero.scratch, k->n_elems, ZO_DTYPE_F32,
                            k->owner));
        ZO_TRY(zo_stream_synchronize(e->zero.stream));
        sum = e->zero.scratch;
    } else if (carry && r == 0) {
        sum = k->zgrad[j->parity];
    }
    widen(e, k, j->parity, sum, e->zero.scratch);
    return ZO_OK;
}

zo_status eng_zero_reduce_chunk(struct zo_engine *e, uint32_t c, const eng_job *j)
{
    eng_chunk *k = &e->chunks[c];
    const float *src = e->zero.scratch;
    if (eng_zero_rounds(&e->cfg))
        ZO_TRY(round_part(e, c, j));
    else
        src = rank_sum(e, c, j->parity);
    float *out = k->zgrad[j->parity];
    /* stage 1: every rank gets the final sum; a round before it rests at the owner */
    if (e->cfg.zero_stage == 1 && j->last)
        ZO_TRY(zo_comm_all_reduce(e->zero.comm, e->zero.stream, src, out, k->n_elems, ZO_DTYPE_F32,
                                  ZO_REDUCE_EXACT));
    else
        ZO_TRY(zo_comm_reduce(e->zero.comm, e->zero.stream, src, out, k->n_elems, ZO_DTYPE_F32,
                              k->owner, ZO_REDUCE_EXACT));
    /* the scratch is widened again for the next chunk */
    ZO_TRY(zo_stream_synchronize(e->zero.stream));
    if (!j->last)
        return ZO_OK;
    memset(&k->gstats, 0, sizeof k->gstats); /* stage 2: the owner's come at the verdict */
    if (!out)
        return ZO_OK;
    return zo_optim_pool_grad_stats(e->opool, out, ZO_DTYPE_F32, k->n_elems, &k->gstats);
}

/* Stage 2: the owners' partials (sum of squares, overflow) to every rank,
 * each chunk's from its owner, so every rank sums the same values in chunk
 * order. */
static zo_status share_partials(struct zo_engine *e)
{
    size_t n = (size_t)e->n_chunks * 2, W = (size_t)e->cfg.world_size;
    double *mine = calloc(n, sizeof *mine), *all = calloc(n * W, sizeof *all);
    zo_status st = mine && all ? ZO_OK : ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "norm partials");
    for (uint32_t c = 0; st == ZO_OK && c < e->n_chunks; c++) {
        mine[2 * c] = e->chunks[c].gstats.sum_sq;
        mine[2 * c + 1] = e->chunks[c].gstats.nonfinite;
    }
    if (st == ZO_OK)
        st = zo_comm_all_gather(e->zero.comm, e->zero.stream, mine, all, n, ZO_DTYPE_F64);
    if (st == ZO_OK)
        st = zo_stream_synchronize(e->zero.stream);
    for (uint32_t c = 0; st == ZO_OK && c < e->n_chunks; c++) {
        const double *p = all + (size_t)e->chunks[c].owner * n + 2 * c;
        e->chunks[c].gstats.sum_sq = p[0];
        e->chunks[c].gstats.nonfinite = p[1] != 0.0;
    }
    free(mine);
    free(all);
    return st;
}

/* ---- a rank's failure fails the step on every rank ---- */

/* A rank's outcome as the ranks exchange it: 64 int32 words. */
typedef struct outcome {
    int32_t st;
    int32_t repair; /* a chunk its copy of failed the checksum, or -1 */
    int32_t stale;  /* its copies of other ranks' chunks that missed an update */
    char msg[244];
} outcome;

/* This rank's copies in state `want` (ENG_P16_MISSED or ENG_P16_STALE). */
static int32_t count_stale(const struct zo_engine *e, int want)
{
    int32_t n = 0;
    for (uint32_t c = 0; c < e->n_chunks; c++)
        n += atomic_load(&e->chunks[c].pstale) == want;
    return n;
}

/* Chunk c's 16-bit values for rank r from its owner: the update just shared
 * (latest: written to r's alternate extent, switched to at the commit) or
 * the committed ones (rewritten in place on r: its extent failed its
 * checksum or missed an update), through a share buffer or the scratch.
 * Every rank takes part; the owner's flag says whether what it sent is
 * good. A failure on r leaves the copy stale (ENG_P16_STALE: its loads fail
 * until it is sent again); only the communicator's failures return. */
static zo_status resend(struct zo_engine *e, zo_comm_t comm, zo_stream_t s, int r, uint32_t c,
                        int latest)
{
    eng_chunk *k = &e->chunks[c];
    void *buf = e->zero.pbuf[0] ? e->zero.pbuf[0] : (void *)e->zero.scratch;
    int32_t good = 1;
    if (k->owner == e->cfg.rank && eng_p16_nvme(k))
        good = eng_p16_nvme_read(k->pctx, e, c, latest, buf) == ZO_OK;
    else if (k->owner == e->cfg.rank)
        buf = latest ? k->pt->update_out(k->pctx, e, c, NULL) : k->p16[k->p16_cur];
    if (!good)
        ZO_LOGW(ENG_SUBSYS, "reading chunk %u to send it to rank %d failed: %s", c, r,
                zo_last_error());
    ZO_TRY(zo_comm_broadcast(comm, s, buf, k->n_elems, e->cfg.param_dtype, k->owner));
    ZO_TRY(zo_comm_broadcast(comm, s, &good, 1, ZO_DTYPE_I32, k->owner));
    ZO_TRY(zo_stream_synchronize(s));
    if (r != e->cfg.rank || !eng_p16_nvme(k))
        return ZO_OK;
    size_t used = k->n_elems * e->pel;
    memset((char *)buf + used, 0, e->nvme.p16_extent - used);
    zo_status st = good ? ZO_OK : ZO_FAIL(ZO_ERR_IO, ENG_SUBSYS, "its owner could not read it");
    zo_swap_io_t io = NULL;
    if (st == ZO_OK && latest)
        st = eng_p16_nvme_receive(k->pctx, e, c, buf, &io);
    if (st == ZO_OK && latest)
        st = eng_timed_swap_wait(e, io);
    else if (st == ZO_OK)
        st = zo_swap_write(e->nvme.pswap, k->pext[k->pext_cur], buf, e->nvme.p16_extent,
                           k->pgen[k->pext_cur]);
    k->palt_valid = latest && st == ZO_OK;
    atomic_store(&k->pstale, st == ZO_OK ? 0 : ENG_P16_STALE);
    if (st < 0)
        ZO_LOGW(ENG_SUBSYS,
                "rank %d's copy of chunk %u (layer %d, rank %d's) stays stale: %s; its loads "
                "fail the step until its owner sends it again at that step's end",
                r, c, k->layer, k->owner, zo_last_error());
    return ZO_OK;
}

/* Every rank's copies in state `want` sent again by their owners, in chunk
 * and rank order (the same on every rank). */
static zo_status resend_all(struct zo_engine *e, zo_comm_t comm, zo_stream_t s, int want)
{
    size_t n = e->n_chunks, W = (size_t)e->cfg.world_size, nw = n * W;
    int32_t *mine = calloc(n ? n : 1, sizeof *mine), *all = calloc(nw ? nw : 1, sizeof *all);
    zo_status st = mine && all ? ZO_OK : ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "stale copies");
    for (uint32_t c = 0; st == ZO_OK && c < n; c++)
        mine[c] = atomic_load(&e->chunks[c].pstale) == want;
    if (st == ZO_OK)
        st = zo_comm_all_gather(comm, s, mine, all, n, ZO_DTYPE_I32);
    if (st == ZO_OK)
        st = zo_stream_synchronize(s);
    for (uint32_t c = 0; st == ZO_OK && c < n; c++)
        for (size_t r = 0; st == ZO_OK && r < W; r++)
            if (all[r * n + c])
                st = resend(e, comm, s, (int)r, c, want == ENG_P16_MISSED);
    free(mine);
    free(all);
    return st;
}

static zo_status repair_all(struct zo_engine *e, const outcome *all)
{
    for (int r = 0; r < e->cfg.world_size; r++) {
        int32_t c = all[r].repair;
        if (c < 0 || (uint32_t)c >= e->n_chunks)
            continue;
        ZO_TRY(resend(e, e->zero.comm, e->zero.stream, r, (uint32_t)c, 0));
    }
    return ZO_OK;
}

/* Copies of other ranks' chunks in state `want` once the ranks agreed (n
 * of them over the ranks; failed: the step failed on some rank): the
 * update just shared that missed its alternate extent is sent again,
 * unless the step failed (the current extent is the committed one, what
 * the commit keeps); stale copies get the committed values again. */
static zo_status settle_copies(struct zo_engine *e, zo_comm_t comm, zo_stream_t s, int want, int n,
                               int failed)
{
    if (want == ENG_P16_MISSED && failed) {
        for (uint32_t c = 0; c < e->n_chunks; c++)
            if (atomic_load(&e->chunks[c].pstale) == ENG_P16_MISSED)
                atomic_store(&e->chunks[c].pstale, 0);
        return ZO_OK;
    }
    return n ? resend_all(e, comm, s, want) : ZO_OK;
}

/* Every rank's outcome (mine, why; its copies in state `want`)
 * all-gathered: ZO_OK when all succeeded, else the first failed rank's
 * status and message, on every rank. */
static zo_status agree(struct zo_engine *e, zo_comm_t comm, zo_stream_t s, zo_status mine,
                       int repair_chunk, int want, const char *why)
{
    int W = e->cfg.world_size;
    outcome o = {mine, repair_chunk, count_stale(e, want), ""};
    outcome *all = calloc((size_t)W, sizeof *all);
    if (!all)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "the ranks' outcomes");
    snprintf(o.msg, sizeof o.msg, "%s", mine < 0 ? why : "");
    zo_status st = zo_comm_all_gather(comm, s, &o, all, sizeof o / 4, ZO_DTYPE_I32);
    if (st == ZO_OK)
        st = zo_stream_synchronize(s);
    int bad = -1, stale = 0;
    for (int r = 0; st == ZO_OK && r < W; r++) {
        bad = bad < 0 && all[r].st < 0 ? r : bad;
        stale += all[r].stale;
    }
    if (bad >= 0 && comm == e->zero.comm && repair_all(e, all) < 0)
        ZO_LOGW(ENG_SUBSYS, "repairing a 16-bit parameter copy failed: %s", zo_last_error());
    if (st == ZO_OK)
        st = settle_copies(e, comm, s, want, stale, bad >= 0);
    if (st == ZO_OK && bad >= 0) {
        all[bad].msg[sizeof all[bad].msg - 1] = 0;
        st = ZO_FAIL((zo_status)all[bad].st, ENG_SUBSYS, "rank %d of %d failed the step: %s", bad,
                     W, all[bad].msg);
        pthread_mutex_lock(&e->jobs.mu);
        e->zero.defer_slots = 1; /* slots may hold what a failed read left, here or gathered */
        pthread_mutex_unlock(&e->jobs.mu);
    }
    free(all);
    return st;
}

/* The failures kept during the step (eng_zero_defer), agreed on. */
static zo_status agree_on_step(struct zo_engine *e)
{
    pthread_mutex_lock(&e->jobs.mu);
    zo_status mine = e->zero.defer_st;
    char why[sizeof e->zero.defer_msg];
    snprintf(why, sizeof why, "%s", e->zero.defer_msg);
    int c = e->zero.defer_repair;
    e->zero.defer_st = ZO_OK;
    e->zero.defer_repair = -1;
    pthread_mutex_unlock(&e->jobs.mu);
    return agree(e, e->zero.comm, e->zero.stream, mine, c, ENG_P16_STALE, why);
}

zo_status eng_zero_share_partials(struct zo_engine *e)
{
    ZO_TRY(agree_on_step(e));
    return e->cfg.zero_stage == 1 ? ZO_OK : share_partials(e);
}

/* ---- the owners' broadcast of their updated chunks ---- */

/* Chunks homed on NVMe go through the pinned buffers in turn: a chunk's
 * write to its alternate extent goes out while the next is broadcast. */
typedef struct share_ring {
    zo_swap_io_t io[ENG_ZERO_SHARE_BUFS];
    int chunk[ENG_ZERO_SHARE_BUFS];
    unsigned turn;
    zo_status st; /* this rank's first failure */
    char why[252];
} share_ring;

static void ring_keep(share_ring *r, zo_status st)
{
    if (st >= 0 || r->st < 0)
        return;
    r->st = st;
    snprintf(r->why, sizeof r->why, "%s", zo_last_error());
}

/* This rank's write of another rank's chunk c failed: no failure of the
 * step (the owners' updates stand), the owner sends it again once the ranks
 * agreed (agree); in dpu mode, whose commit comes a step later, a failure. */
static void missed(struct zo_engine *e, share_ring *r, uint32_t c, zo_status st)
{
    if (st >= 0)
        return;
    if (e->cfg.mode == ZO_OPTIM_DPU) {
        ring_keep(r, st);
        return;
    }
    ZO_LOGW(ENG_SUBSYS, "writing chunk %u (layer %d) from rank %d failed: %s; it is sent again", c,
            e->chunks[c].layer, e->chunks[c].owner, zo_last_error());
    atomic_store(&e->chunks[c].pstale, ENG_P16_MISSED);
}

/* Buffer b's write landed: its chunk's alternate holds the owner's values. */
static void ring_land(struct zo_engine *e, share_ring *r, unsigned b)
{
    if (r->chunk[b] < 0)
        return;
    zo_status st = eng_timed_swap_wait(e, r->io[b]);
    if (st == ZO_OK)
        e->chunks[r->chunk[b]].palt_valid = 1;
    missed(e, r, (uint32_t)r->chunk[b], st);
    r->io[b] = NULL;
    r->chunk[b] = -1;
}

/* The owner reads back what its update wrote to the alternate extent and
 * sends it, even after a failure (the others wait for it); the others write
 * it to their alternate extent, the tail past the chunk's elements zero. */
static zo_status share_nvme(struct zo_engine *e, uint32_t c, zo_comm_t comm, zo_stream_t s,
                            share_ring *r)
{
    eng_chunk *k = &e->chunks[c];
    unsigned b = r->turn++ % ENG_ZERO_SHARE_BUFS;
    ring_land(e, r, b);
    void *buf = e->zero.pbuf[b];
    int mine = k->owner == e->cfg.rank;
    if (mine && r->st >= 0)
        ring_keep(r, eng_p16_nvme_read(k->pctx, e, c, 1, buf));
    ZO_TRY(zo_comm_broadcast(comm, s, buf, k->n_elems, e->cfg.param_dtype, k->owner));
    ZO_TRY(zo_stream_synchronize(s));
    if (mine || r->st < 0)
        return ZO_OK;
    size_t used = k->n_elems * e->pel;
    memset((char *)buf + used, 0, e->nvme.p16_extent - used);
    zo_status st = eng_p16_nvme_receive(k->pctx, e, c, buf, &r->io[b]);
    missed(e, r, c, st);
    if (st == ZO_OK)
        r->chunk[b] = (int)c;
    return ZO_OK;
}

static zo_status share_all(struct zo_engine *e, zo_comm_t comm, zo_stream_t s, share_ring *r)
{
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        eng_chunk *k = &e->chunks[c];
        k->palt_valid = 0;
        if (k->zpart) /* stage 3: gathered from the owner at each use */
            continue;
        if (eng_p16_nvme(k)) {
            ZO_TRY(share_nvme(e, c, comm, s, r));
            continue;
        }
        void *p16 =
            k->pt->update_out(k->pctx, e, c, NULL); /* behind the fetches' copy in dpu mode */
        ZO_TRY(zo_comm_broadcast(comm, s, p16, k->n_elems, e->cfg.param_dtype, k->owner));
    }
    return zo_stream_synchronize(s);
}

zo_status eng_zero_share_params(struct zo_engine *e, zo_status mine)
{
    int dpu = e->cfg.mode == ZO_OPTIM_DPU; /* the job thread reduces on zcomm meanwhile */
    zo_comm_t comm = dpu ? e->zero.dcomm : e->zero.comm;
    zo_stream_t s = dpu ? e->zero.dstream : e->zero.stream;
    share_ring r = {{NULL}, {-1, -1}, 0, ZO_OK, ""};
    ring_keep(&r, mine); /* the update failed here: the others still wait for its chunks */
    zo_status st = share_all(e, comm, s, &r);
    for (unsigned b = 0; b < ENG_ZERO_SHARE_BUFS; b++)
        ring_land(e, &r, b);
    ZO_TRY(st); /* the communicator failed: it only returns that error now */
    st = agree(e, comm, s, r.st, -1, ENG_P16_MISSED, r.why);
    if (st < 0) /* another rank's failure: this rank's updates stored beside go too */
        eng_discard_uncommitted(e);
    return st;
}

/* ---- the states of the chunks another rank owns ---- */

static zo_status not_here(struct zo_engine *e, uint32_t c)
{
    return ZO_FAIL(ZO_ERR_UNSUPPORTED, ENG_SUBSYS,
                   "the optimizer states of chunk %u (layer %d) are owned by rank %d, not by "
                   "this rank %d (ZeRO stage %d)",
                   c, e->chunks[c].layer, e->chunks[c].owner, e->cfg.rank, e->cfg.zero_stage);
}

static void remote_account(const eng_plan_in *in, zo_engine_footprint *fp)
{
    (void)in;
    (void)fp;
}

static zo_status remote_place(void *self, struct zo_engine *e)
{
    (void)e;
    return ZO_OK;
}

static void remote_release(void *self, struct zo_engine *e)
{
    (void)e;
}

static float *remote_init_buf(void *self, struct zo_engine *e, uint32_t c)
{
    (void)c;
    return e->zero.scratch;
}

static zo_status remote_init(void *self, struct zo_engine *e, uint32_t c, float *buf)
{
    (void)e;
    (void)c;
    (void)buf;
    return ZO_OK;
}

static zo_status remote_update(void *self, struct zo_engine *e, const uint32_t *chunks, uint32_t n,
                               const eng_update_args *u)
{
    (void)n;
    (void)u;
    return not_here(e, chunks[0]);
}

static zo_status remote_speculate(void *self, struct zo_engine *e, uint32_t c, const eng_job *j,
                                  int next)
{
    (void)j;
    return not_here(e, c);
}

static zo_status remote_drain(void *self, struct zo_engine *e)
{
    (void)e;
    return ZO_OK;
}

static void remote_forget(void *self, struct zo_engine *e, uint32_t c)
{
    (void)e;
    (void)c;
}

static int remote_commit(void *self, struct zo_engine *e, uint32_t c)
{
    (void)e;
    (void)c;
    return 0;
}

static zo_status remote_read(void *self, struct zo_engine *e, uint32_t c, float *out)
{
    (void)out;
    return not_here(e, c);
}

static zo_status remote_write_begin(void *self, struct zo_engine *e, uint32_t c, float **buf)
{
    (void)buf;
    return not_here(e, c);
}

static zo_status remote_write_end(void *self, struct zo_engine *e, uint32_t c, float *buf)
{
    (void)buf;
    return not_here(e, c);
}

/* Not in the registry (eng_state_tiers): the update, the placement and the
 * accounting, which go through the registry, never see these chunks. */
const eng_state_tier eng_state_tier_remote = {
    .version = ENG_TIER_OPS_VERSION,
    .tier = ZO_TIER_HOST,
    .name = "remote",
    .account = remote_account,
    .place = remote_place,
    .release = remote_release,
    .init_buf = remote_init_buf,
    .init = remote_init,
    .update = remote_update,
    .speculate = remote_speculate,
    .drain = remote_drain,
    .rollback = remote_forget,
    .discard = remote_forget,
    .commit = remote_commit,
    .read = remote_read,
    .write_begin = remote_write_begin,
    .write_end = remote_write_end,
};

/* ---- stage 3: the 16-bit parameters of the chunks another rank owns ---- */

static void remote_p16_account(const eng_plan_in *in, zo_engine_footprint *fp)
{
    (void)in; /* the gather ring is the engine's (eng_zero_gather_bytes) */
    (void)fp;
}

static zo_status remote_p16_write(void *self, struct zo_engine *e, uint32_t c, const float *master,
                                  int init)
{
    (void)e, (void)c, (void)master, (void)init; /* the owner holds them */
    return ZO_OK;
}

/* The gather buffer its last gather filled: a fetch gathers before it loads. */
static zo_status remote_p16_source(void *self, struct zo_engine *e, uint32_t c, const eng_load *ld,
                                   const void **src)
{
    if (!eng_zero_held(e, c))
        return ZO_FAIL(ZO_ERR_INTERNAL, ENG_SUBSYS,
                       "chunk %u (layer %d, owned by rank %d) is loaded without a current "
                       "gather",
                       c, e->chunks[c].layer, e->chunks[c].owner);
    *src = e->chunks[c].p16[0];
    return ZO_OK;
}

static void *remote_p16_out(void *self, struct zo_engine *e, uint32_t c, void *tail)
{
    (void)e, (void)c, (void)tail; /* never updated here */
    return NULL;
}

static void remote_p16_commit(void *self, struct zo_engine *e, uint32_t c, int updated, int stored)
{
    (void)e, (void)c, (void)updated, (void)stored;
}

/* Not in the registry (eng_param_tiers): placement and accounting never see
 * these chunks; a fetch's gathers fill their buffer (p16[0]). */
const eng_param_tier eng_param_tier_remote = {
    .version = ENG_TIER_OPS_VERSION,
    .tier = ZO_TIER_HOST,
    .name = "remote",
    .resident = 0,
    .host_copies = 0,
    .account = remote_p16_account,
    .place = remote_place,
    .release = remote_release,
    .write = remote_p16_write,
    .source = remote_p16_source,
    .update_out = remote_p16_out,
    .store = NULL,
    .commit = remote_p16_commit,
    .abandon = NULL,
};

/* A hand-over: each micro-batch onto the running sum at the owner in the
 * global order (eng_zero_rounds), else the rank's final sum; the final
 * gradients are then the owner's. */
static zo_status zero_hand_over(struct zo_engine *e, uint32_t c, const eng_job *j, int *taken)
{
    if (eng_zero_rounds(&e->cfg) || j->last)
        ZO_TRY(eng_zero_reduce_chunk(e, c, j));
    *taken = j->last;
    return ZO_OK;
}

/* The verdict's share: the partials the same on every rank; the next
 * reducer of the chain sums them. */
static zo_status zero_judge(struct zo_engine *e, eng_verdict *v)
{
    (void)v;
    return eng_zero_share_partials(e);
}

const eng_reducer_ops eng_reducer_zero = {
    .name = "zero",
    .version = ENG_REDUCER_OPS_VERSION,
    .check = eng_zero_check,
    .place = eng_zero_place,
    .release = eng_zero_release,
    .gather = eng_zero_gather,
    .forget = eng_zero_forget_gathers,
    .hand_over = zero_hand_over,
    .judge = zero_judge,
    .share = eng_zero_share_params,
};
