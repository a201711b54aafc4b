/* The NVMe tier: optimizer states (and, with them, 16-bit parameters) in
 * checksummed extents of swap stores, two per chunk (current and
 * alternate: an update is written beside the committed states and switched
 * to at commit). Pinned staging sized by the chunks homed here: three stages
 * for the update pipeline (read chunk i+2 while updating i+1 and writing i),
 * a twin per device slot for parameter loads. In overlap mode the
 * speculative updates run through the stages as the gradients arrive.
 *
 * Device-resident 16-bit parameters whose states are here keep their
 * committed copy here too (eng_param_tier_device_nvme), not in pinned
 * memory: the update writes the new values into its stage's spare room and
 * from there to the alternate extent beside the states', the pair switched
 * together at commit, and the slot is reloaded through the twins at its
 * next fetch. Why not straight from the stage into the slot: until the
 * verdict (overflow: skipped; clipping: redone) and until every chunk's
 * writes have landed (a failed one abandons the step), the slot must keep
 * the committed values, and the device has no room for a second copy; the
 * extent beside the states is the one place that holds the uncommitted
 * values in sync, overlap and dpu modes alike, checksummed, whatever the
 * model's size, for 2 bytes a parameter written and read per step. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_tier.h"
#include "zo/half.h"

/* ---- the extents' sizes (zo/engine.h: the planner's too) ---- */

uint64_t zo_engine_nvme_state_bytes(uint64_t n_elems)
{
    return 3 * zo_round_up(n_elems * sizeof(float), ZO_SWAP_ALIGN);
}

uint64_t zo_engine_nvme_state_bytes_as(zo_dtype state_dtype, uint64_t n_elems)
{
    if (!zo_state_format_of(state_dtype))
        return 0;
    return eng_states_io_bytes(state_dtype, zo_round_up(n_elems, ZO_SWAP_ALIGN / sizeof(float)));
}

uint64_t zo_engine_nvme_split_state_bytes(zo_dtype state_dtype, uint64_t n_elems)
{
    uint64_t full = zo_engine_nvme_state_bytes_as(state_dtype, n_elems);
    return full ? full - eng_split_head(zo_round_up(n_elems, ZO_SWAP_ALIGN / sizeof(float))) : 0;
}

static uint64_t state_io_bytes(const struct zo_engine *e, const eng_chunk *k)
{
    return zo_engine_nvme_state_bytes_as(e->cfg.state_dtype, k->n_elems);
}

/* ---- the split master (cfg.master_split; layout: eng_split_head) ---- */

/* Where extent x of chunk k starts in a stage, and its bytes. */
static size_t extent_head(const struct zo_engine *e, const eng_chunk *k, int x)
{
    return k->split_ref[x] >= 0 ? eng_split_head(eng_state_stride(e, k)) : 0;
}

static uint64_t extent_bytes(const struct zo_engine *e, const eng_chunk *k, int x)
{
    return state_io_bytes(e, k) - extent_head(e, k, x);
}

/* The host copy an update of chunk k writes its 16-bit values to, by index,
 * when the master may be split against it: a second copy, which stays
 * untouched until the update after the next (eng_p16_bufs); else -1. */
static int split_target(const struct zo_engine *e, const eng_chunk *k, const void *out)
{
    if (!e->cfg.master_split || k->p16_bufs != 2)
        return -1;
    return out == k->p16[0] ? 0 : out == k->p16[1] ? 1 : -1;
}

/* The master | m | v in st (stride S) into the split layout, in place: the
 * up bits of every element first (none moved yet when one does not split:
 * 0, the full master goes out), then the low halves back to front to 2*S
 * (each overwrites masters already read), the bits at the head. */
static int split_master(float *st, size_t S, size_t n, const uint16_t *p16, uint8_t *bits)
{
    char *b = (char *)st;
    memset(bits, 0, (n + 7) / 8);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        uint16_t lo;
        unsigned up;
        memcpy(&u, b + 4 * i, 4);
        if (!zo_master_split(u, p16[i], &lo, &up))
            return 0;
        bits[i >> 3] |= (uint8_t)(up << (i & 7));
    }
    for (size_t i = n; i-- > 0;) {
        uint32_t u;
        memcpy(&u, b + 4 * i, 4);
        uint16_t lo = (uint16_t)u;
        memcpy(b + 2 * S + 2 * i, &lo, 2);
    }
    memset(b + 2 * S + 2 * n, 0, 2 * (S - n));
    size_t head = eng_split_head(S), nb = (n + 7) / 8;
    memcpy(b + head, bits, nb);
    memset(b + head + nb, 0, 2 * S - head - nb);
    return 1;
}

/* Back to the full master, in place, front to back: master i (bytes 4i..)
 * overwrites low halves of elements up to i only, read before. The bits go
 * to scratch first (the masters overwrite them). */
static void join_master(float *st, size_t S, size_t n, const uint16_t *p16, uint8_t *bits)
{
    char *b = (char *)st;
    memcpy(bits, b + eng_split_head(S), (n + 7) / 8);
    for (size_t i = 0; i < n; i++) {
        uint16_t lo;
        memcpy(&lo, b + 2 * S + 2 * i, 2);
        uint32_t u = zo_master_join(p16[i], lo, (bits[i >> 3] >> (i & 7)) & 1u);
        memcpy(b + 4 * i, &u, 4);
    }
    memset(b + 4 * n, 0, 4 * (S - n));
}

/* After extent x of chunk c landed in st: the full master again. */
static void states_join(struct zo_engine *e, uint32_t c, int x, float *st, uint8_t *bits)
{
    eng_chunk *k = &e->chunks[c];
    if (k->split_ref[x] >= 0)
        join_master(st, eng_state_stride(e, k), k->n_elems, k->p16[k->split_ref[x]], bits);
}

static void states_unpack(const struct zo_engine *e, const eng_chunk *k, float *buf)
{
    eng_states_restride(e->cfg.state_dtype, buf, k->n_elems, eng_state_stride(e, k),
                        e->chunk_elems);
}

static void states_pack(const struct zo_engine *e, const eng_chunk *k, float *buf)
{
    eng_states_restride(e->cfg.state_dtype, buf, k->n_elems, e->chunk_elems,
                        eng_state_stride(e, k));
}

/* The latest master | m | v of chunk c (including an update not committed
 * yet) into out (state_extent_bytes, 4 KiB aligned), at the chunk's stride
 * (unpacked when read from NVMe). */
static zo_status nvme_read(void *self, struct zo_engine *e, uint32_t c, float *out)
{
    eng_nvme_tier *nv = self;
    eng_chunk *k = &e->chunks[c];
    int x = k->alt_valid ? 1 - k->ext_cur : k->ext_cur;
    uint8_t *bits = k->split_ref[x] >= 0 ? malloc(k->n_elems / 8 + 1) : NULL;
    if (k->split_ref[x] >= 0 && !bits)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "allocating a chunk's up bits");
    zo_status st = zo_swap_read(nv->swap, k->ext[x], (char *)out + extent_head(e, k, x),
                                extent_bytes(e, k, x), k->gen[x]);
    if (st == ZO_OK) {
        states_join(e, c, x, out, bits);
        states_unpack(e, k, out);
    }
    free(bits);
    return st;
}

static zo_status read_current(struct zo_engine *e, uint32_t c, float *buf, zo_swap_io_t *io)
{
    eng_chunk *k = &e->chunks[c];
    int x = k->ext_cur;
    return eng_swap_async(e, 0, 0, c, k->ext[x], (char *)buf + extent_head(e, k, x),
                          extent_bytes(e, k, x), k->gen[x], io);
}

/* Write the updated states (and, when they live on NVMe, the new 16-bit
 * parameters from the stage's tail) to the alternate extents; the master
 * split against the update's 16-bit values when bits is given and it can. */
static zo_status write_alternate(struct zo_engine *e, uint32_t c, float *buf, uint8_t *bits,
                                 zo_swap_io_t *io, zo_swap_io_t *pio)
{
    eng_chunk *k = &e->chunks[c];
    int alt = 1 - k->ext_cur;
    k->gen[alt] = k->gen[k->ext_cur] + 1;
    k->split_ref[alt] = -1;
    if (bits) {
        size_t S = eng_state_stride(e, k);
        void *out = k->pt->update_out(k->pctx, e, c, NULL);
        int ref = split_target(e, k, out);
        if (ref >= 0 && split_master(buf, S, k->n_elems, out, bits))
            k->split_ref[alt] = ref;
    }
    ZO_TRY(eng_swap_async(e, 1, 0, c, k->ext[alt], (char *)buf + extent_head(e, k, alt),
                          extent_bytes(e, k, alt), k->gen[alt], io));
    if (!k->pt->store)
        return ZO_OK;
    return k->pt->store(
        k->pctx, e, c,
        (char *)buf + eng_states_io_bytes(e->cfg.state_dtype, eng_state_stride(e, k)), pio);
}

/* ---- the speculative pipeline (overlap mode) ---- */

/* Wait for the stage's writes; the chunk's alternate extents count as
 * written only once both landed. */
static zo_status spec_finish_write(eng_nvme_tier *nv, struct zo_engine *e, unsigned s)
{
    eng_spec_pipe *p = &nv->spec;
    if (p->wr_chunk[s] < 0)
        return ZO_OK;
    zo_status st = eng_timed_swap_wait(e, p->wr[s]);
    zo_status st2 = eng_timed_swap_wait(e, p->pwr[s]);
    if (st == ZO_OK && st2 == ZO_OK)
        e->chunks[p->wr_chunk[s]].alt_valid = 1;
    p->wr[s] = p->pwr[s] = NULL;
    p->wr_chunk[s] = -1;
    return st < 0 ? st : st2;
}

static void spec_drop_read(eng_nvme_tier *nv, struct zo_engine *e, unsigned s)
{
    if (nv->spec.rd_chunk[s] < 0)
        return;
    zo_swap_wait(nv->spec.rd[s]); /* a read ahead nobody used */
    nv->spec.rd[s] = NULL;
    nv->spec.rd_chunk[s] = -1;
}

static zo_status spec_start_read(eng_nvme_tier *nv, struct zo_engine *e, uint32_t c, unsigned *out)
{
    eng_spec_pipe *p = &nv->spec;
    unsigned s = p->next;
    p->next = (p->next + 1) % ENG_NVME_STAGES;
    ZO_TRY(spec_finish_write(nv, e, s));
    spec_drop_read(nv, e, s);
    ZO_TRY(read_current(e, c, nv->stage[s], &p->rd[s]));
    p->rd_chunk[s] = (int)c;
    *out = s;
    return ZO_OK;
}

static int spec_stage_of(eng_nvme_tier *nv, struct zo_engine *e, uint32_t c)
{
    for (unsigned s = 0; s < ENG_NVME_STAGES; s++)
        if (nv->spec.rd_chunk[s] == (int)c)
            return (int)s;
    return -1;
}

/* Speculative update of chunk c through NVMe: its states were (or are now)
 * read into a stage; the next updating chunk's read is started before this
 * one is computed; the writes go out behind. */
static zo_status nvme_speculate(void *self, struct zo_engine *e, uint32_t c, const eng_job *j,
                                int next)
{
    eng_nvme_tier *nv = self;
    int s = spec_stage_of(nv, e, c);
    if (s < 0) {
        unsigned u;
        ZO_TRY(spec_start_read(nv, e, c, &u));
        s = (int)u;
    }
    if (next >= 0 && spec_stage_of(nv, e, (uint32_t)next) < 0) {
        unsigned u;
        ZO_TRY(spec_start_read(nv, e, (uint32_t)next, &u));
    }
    eng_spec_pipe *p = &nv->spec;
    zo_status st = eng_timed_swap_wait(e, p->rd[s]);
    p->rd[s] = NULL;
    p->rd_chunk[s] = -1;
    ZO_TRY(st);
    states_join(e, c, e->chunks[c].ext_cur, nv->stage[s], nv->split_bits[s]);
    eng_update_args u = {j->lr, j->factor, j->step, j->parity, NULL};
    ZO_TRY(eng_adam_run(e, &e->chunks[c], nv->stage[s], &u));
    st = write_alternate(e, c, nv->stage[s], nv->split_bits[s], &p->wr[s], &p->pwr[s]);
    p->wr_chunk[s] = (int)c;
    return st;
}

/* Wait for everything the pipeline has in flight (after the job thread is
 * idle); returns the first failed write. */
static zo_status spec_drain(eng_nvme_tier *nv, struct zo_engine *e)
{
    zo_status st = ZO_OK;
    for (unsigned s = 0; s < ENG_NVME_STAGES; s++) {
        spec_drop_read(nv, e, s);
        zo_status w = spec_finish_write(nv, e, s);
        if (st == ZO_OK && w < 0)
            st = w;
    }
    nv->spec.next = 0;
    return st;
}

/* ---- the update pipeline ---- */

/* The update of every chunk through NVMe, on zo_swap_pipeline_run's
 * schedule: a chunk's states are read into a stage two chunks ahead,
 * updated there and written to the alternate extents from it. */
typedef struct nvme_pipe {
    struct zo_engine *e;
    eng_nvme_tier *nv;
    const uint32_t *chunks; /* the i-th of the pipeline's chunks */
    const eng_update_args *u;
    zo_swap_io_t rd[ENG_NVME_STAGES], wr[ENG_NVME_STAGES], pwr[ENG_NVME_STAGES];
    zo_swap_io_t grd[ENG_NVME_STAGES]; /* spilled gradients read back */
    int item[ENG_NVME_STAGES];         /* the chunk a stage's writes are for (u->landed), or -1 */
} nvme_pipe;

static zo_status pipe_wait(nvme_pipe *pp, zo_swap_io_t *io)
{
    if (!*io)
        return ZO_OK;
    zo_status st = eng_timed_swap_wait(pp->e, *io);
    *io = NULL;
    return st;
}

static zo_status pipe_read(void *user, uint32_t c, unsigned s) /* c: the i-th */
{
    nvme_pipe *pp = user;
    ZO_TRY(read_current(pp->e, pp->chunks[c], pp->nv->stage[s], &pp->rd[s]));
    return eng_grads_read_back(pp->e, pp->chunks[c], pp->u->parity, pp->nv->stage[s], &pp->grd[s]);
}

static zo_status pipe_update(void *user, uint32_t i, unsigned s)
{
    nvme_pipe *pp = user;
    struct zo_engine *e = pp->e;
    eng_nvme_tier *nv = pp->nv;
    uint32_t c = pp->chunks[i];
    ZO_TRY(pipe_wait(pp, &pp->rd[s]));
    ZO_TRY(pipe_wait(pp, &pp->grd[s]));
    states_join(e, c, e->chunks[c].ext_cur, nv->stage[s], nv->split_bits[s]);
    ZO_TRY(eng_adam_run(e, &e->chunks[c], nv->stage[s], pp->u));
    pp->item[s] = (int)c;
    if (!e->chunks[c].pt->store && pp->u->landed) {
        /* Adam wrote the 16-bit values into the host copy the commit switches
         * to: a load may read them now, before the states' writes land (a
         * failed one still drops the whole update at its join, before any
         * gradient of the step that read them) */
        pp->u->landed(e, c);
        pp->item[s] = -1;
    }
    return write_alternate(e, c, nv->stage[s], nv->split_bits[s], &pp->wr[s], &pp->pwr[s]);
}

/* Every ticket is waited for, whatever failed first; a chunk whose writes
 * all landed is said to have landed (unless it was said at its update). */
static zo_status pipe_drain(void *user, unsigned s)
{
    nvme_pipe *pp = user;
    zo_status a = pipe_wait(pp, &pp->rd[s]);
    zo_status b = pipe_wait(pp, &pp->wr[s]);
    zo_status c = pipe_wait(pp, &pp->pwr[s]);
    zo_status g = pipe_wait(pp, &pp->grd[s]);
    zo_status st = a < 0 ? a : b < 0 ? b : c < 0 ? c : g;
    if (st == ZO_OK && pp->item[s] >= 0 && pp->u->landed)
        pp->u->landed(pp->e, (uint32_t)pp->item[s]);
    pp->item[s] = -1;
    return st;
}

static zo_status nvme_update(void *self, struct zo_engine *e, const uint32_t *chunks, uint32_t n,
                             const eng_update_args *u)
{
    static const zo_swap_pipeline_ops ops = {pipe_read, pipe_update, pipe_drain};
    nvme_pipe pp = {e, self, chunks, u, {0}, {0}, {0}, {0}, {0}};
    for (unsigned s = 0; s < ENG_NVME_STAGES; s++)
        pp.item[s] = -1;
    zo_status st = zo_swap_pipeline_run(n, ENG_NVME_STAGES, &ops, &pp);
    if (st < 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", zo_last_error());
        return ZO_FAIL(st, ENG_SUBSYS, "updating the optimizer states on NVMe: %s", why);
    }
    for (uint32_t i = 0; i < n; i++)
        e->chunks[chunks[i]].alt_valid = 1;
    return ZO_OK;
}

/* ---- parameter loads ---- */

typedef struct ticket_arg {
    struct zo_engine *e;
    eng_twin *t;
    int chunk; /* the chunk read */
} ticket_arg;

/* On the h2d stream: the NVMe read into the staging twin must land first. */
static zo_status wait_ticket(void *arg)
{
    ticket_arg *t = arg;
    zo_swap_io_t io = atomic_exchange(&t->t->io, NULL);
    if (!io)
        return ZO_OK;
    zo_status st = eng_timed_swap_wait(t->e, io);
    if (st == ZO_OK && eng_zero_on(&t->e->cfg)) /* another rank's chunk, its writes failed */
        st = eng_zero_check_copy(t->e, (uint32_t)t->chunk);
    return eng_zero_defer(t->e, st, t->chunk); /* ZeRO: failed with the others at the step's end */
}

/* Wait for reads whose h2d task never ran (a failed stream task); only with
 * the h2d stream idle. */
static void drop_tickets(void *self, struct zo_engine *e)
{
    eng_nvme_tier *nv = self;
    for (uint32_t i = 0; nv->twins && i < nv->n_twins; i++) {
        zo_swap_io_t io = atomic_exchange(&nv->twins[i].io, NULL);
        if (io)
            zo_swap_wait(io);
    }
}

/* NVMe -> the next pinned staging twin of the ring, then (on the h2d
 * stream, once the read has landed) the H2D into a slot. */
/* The next twin of the ring, free: its previous H2D is done (the event its
 * slot records was recorded after it, or later on the same in-order stream). */
static zo_status take_twin(eng_nvme_tier *nv, eng_twin **out)
{
    eng_twin *t = &nv->twins[nv->next_twin];
    nv->next_twin = (nv->next_twin + 1) % nv->n_twins;
    if (t->filled)
        ZO_TRY(zo_event_synchronize(t->filled));
    zo_swap_io_t io = atomic_exchange(&t->io, NULL);
    if (io)
        zo_swap_wait(io); /* its h2d task never ran: the failure was reported then */
    t->filled = NULL;
    *out = t;
    return ZO_OK;
}

/* The extent a load of chunk k's 16-bit parameters reads: the current one,
 * or the alternate where the load is told an update running behind the
 * forward has landed there and is not committed yet. */
static int p16_loaded(const eng_chunk *k, const eng_load *ld)
{
    return ld->latest ? 1 - k->pext_cur : k->pext_cur;
}

static zo_status stage_from_nvme(eng_nvme_tier *nv, struct zo_engine *e, eng_chunk *k,
                                 const eng_load *ld, eng_twin **out)
{
    eng_twin *t;
    ZO_TRY(take_twin(nv, &t));
    zo_swap_io_t io = NULL;
    int x = p16_loaded(k, ld);
    ZO_TRY(eng_swap_async(e, 0, 1, (uint32_t)(k - e->chunks), k->pext[x], t->ptr, nv->p16_extent,
                          k->pgen[x], &io));
    atomic_store(&t->io, io);
    ticket_arg ta = {e, t, (int)(k - e->chunks)};
    zo_status st = zo_stream_enqueue(e->h2d, wait_ticket, &ta, sizeof ta);
    if (st < 0) { /* never leave a ticket behind */
        io = atomic_exchange(&t->io, NULL);
        if (io)
            zo_swap_wait(io);
        return st;
    }
    t->filled = ld->filled;
    *out = t;
    return ZO_OK;
}

/* Store chunk c's states from st (master | m | v at the chunk's stride, a
 * stage: packed here, with the 16-bit parameters in its tail when they live
 * on NVMe): alternate extents first, switched to once both writes are
 * durable. */
static zo_status nvme_write_end(void *self, struct zo_engine *e, uint32_t c, float *st)
{
    eng_chunk *k = &e->chunks[c];
    states_pack(e, k, st);
    if (k->pt->store) {
        void *p16 = (char *)st + eng_states_io_bytes(e->cfg.state_dtype, eng_state_stride(e, k));
        memset(p16, 0, e->chunk_bytes);
        eng_cast_params(e->cfg.param_dtype, st, p16, k->n_elems);
    }
    zo_swap_io_t io = NULL, pio = NULL;
    zo_status s1 = write_alternate(e, c, st, NULL, &io, &pio); /* the full master */
    zo_status s2 = io ? zo_swap_wait(io) : ZO_OK;
    zo_status s3 = pio ? zo_swap_wait(pio) : ZO_OK;
    ZO_TRY(s1 < 0 ? s1 : s2 < 0 ? s2 : s3);
    k->ext_cur = 1 - k->ext_cur;
    k->pt->commit(k->pctx, e, c, 0, 1); /* the pair switches together, as a commit does */
    return ZO_OK;
}

/* ---- 16-bit parameters ---- */

/* Chunks of the plan whose 16-bit parameters have extents here: homed
 * here, or device-resident with their copy here. */
static uint32_t p16_homed(const eng_plan_in *in)
{
    uint32_t n = eng_count_homed(in, 0, ZO_TIER_NVME);
    for (uint32_t c = 0; c < in->n_chunks; c++)
        n += (uint32_t)eng_p16_nvme_backed(in, c);
    return n;
}

static int p16_here(const eng_chunk *k)
{
    return k->pt == &eng_param_tier_nvme || k->pt == &eng_param_tier_device_nvme;
}

uint32_t eng_p16_on_nvme(const struct zo_engine *e)
{
    return eng_chunks_at(e, 0, &eng_param_tier_nvme) +
           eng_chunks_at(e, 0, &eng_param_tier_device_nvme);
}

/* A swap extent of 16-bit parameters: the fullest chunk's, 4 KiB-aligned. */
uint64_t eng_p16_extent(const zo_engine_config *c, uint64_t max_chunk_elems)
{
    return zo_round_up(max_chunk_elems * eng_param_bytes(c), ZO_SWAP_ALIGN);
}

/* A ring of staging twins: as many loads in flight as the staging depth
 * (no more than there are slots to load into). */
static uint64_t twins_for(uint64_t pslots, const zo_engine_config *c)
{
    uint64_t depth = eng_staging_depth(c);
    return pslots < depth ? pslots : depth;
}

/* ZeRO: the pinned buffers the owners' broadcasts of chunks homed here go
 * through (engine_zero.c: read back by the owner, written by the others). */
static uint64_t share_bufs(const zo_engine_config *c, uint32_t n_nvme)
{
    return eng_zero_on(c) && n_nvme ? ENG_ZERO_SHARE_BUFS : 0;
}

static void nvme_p16_account(const eng_plan_in *in, zo_engine_footprint *fp)
{
    uint32_t n = p16_homed(in);
    if (!n)
        return;
    fp->param_staging = (twins_for(in->pslots, in->cfg) + share_bufs(in->cfg, n)) * in->chunk_bytes;
    fp->pinned += fp->param_staging;
    fp->bytes[ZO_TIER_NVME] += 2ull * n * eng_p16_extent(in->cfg, in->max_chunk_elems);
}

static zo_status place_share_bufs(eng_nvme_tier *nv, struct zo_engine *e, uint32_t n)
{
    if (!share_bufs(&e->cfg, n))
        return ZO_OK;
    return eng_take_pinned(e, e->chunk_bytes, ENG_ZERO_SHARE_BUFS, nv->share_bufs);
}

static zo_status nvme_p16_place(void *self, struct zo_engine *e)
{
    eng_nvme_tier *nv = self;
    uint32_t n = eng_p16_on_nvme(e);
    nv->n_twins = (uint32_t)twins_for(e->fp.device_param_slots, &e->cfg);
    nv->next_twin = 0;
    nv->twins = calloc(nv->n_twins ? nv->n_twins : 1, sizeof *nv->twins);
    void **tmp = calloc(nv->n_twins ? nv->n_twins : 1, sizeof *tmp);
    zo_status st = nv->twins && tmp ? eng_take_pinned(e, e->chunk_bytes, nv->n_twins, tmp)
                                    : ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "allocating the twins");
    /* reads fill a twin's first p16_extent bytes: the rest stays zero */
    for (uint32_t i = 0; st == ZO_OK && i < nv->n_twins; i++) {
        nv->twins[i].ptr = tmp[i];
        nv->twins[i].filled = NULL;
        memset(tmp[i], 0, e->chunk_bytes);
    }
    free(tmp);
    ZO_TRY(st);
    ZO_TRY(place_share_bufs(nv, e, n));
    ZO_TRY(eng_open_store(e, nv->p16_extent, 2ull * n, "-p16", &nv->pswap));
    eng_store_opened(e, nv->pswap, nv->p16_extent);
    for (uint32_t c = 0; c < e->n_chunks; c++)
        for (int i = 0; p16_here(&e->chunks[c]) && i < 2; i++)
            ZO_TRY(zo_swap_alloc_extent(nv->pswap, 2ull * c + (uint64_t)i, &e->chunks[c].pext[i]));
    for (int i = 0; nv->stage[0] && i < (int)ENG_NVME_STAGES; i++)
        ZO_TRY(zo_swap_register_buffer(nv->pswap, nv->stage[i], nv->stage_bytes));
    for (uint32_t i = 0; i < nv->n_twins; i++)
        ZO_TRY(zo_swap_register_buffer(nv->pswap, nv->twins[i].ptr, e->chunk_bytes));
    for (uint32_t i = 0; nv->share_bufs[0] && i < ENG_ZERO_SHARE_BUFS; i++)
        ZO_TRY(zo_swap_register_buffer(nv->pswap, nv->share_bufs[i], e->chunk_bytes));
    return ZO_OK;
}

static void nvme_p16_release(void *self, struct zo_engine *e)
{
    eng_nvme_tier *nv = self;
    if (!nv->pswap) {
        free(nv->twins);
        nv->twins = NULL;
        nv->n_twins = 0;
        return;
    }
    drop_tickets(self, e);
    for (int i = 0; i < (int)ENG_NVME_STAGES; i++)
        if (nv->stage[i])
            zo_swap_unregister_buffer(nv->pswap, nv->stage[i]);
    for (uint32_t i = 0; nv->twins && i < nv->n_twins; i++)
        if (nv->twins[i].ptr)
            zo_swap_unregister_buffer(nv->pswap, nv->twins[i].ptr);
    for (uint32_t i = 0; nv->share_bufs[0] && i < ENG_ZERO_SHARE_BUFS; i++)
        zo_swap_unregister_buffer(nv->pswap, nv->share_bufs[i]);
    memset(nv->share_bufs, 0, ENG_ZERO_SHARE_BUFS * sizeof *nv->share_bufs); /* the pool's */
    zo_swap_close(nv->pswap);
    nv->pswap = NULL;
    free(nv->twins);
    nv->twins = NULL;
    nv->n_twins = 0;
}

/* At placement, through the stage's spare room (the states' init left the
 * master there) or, when this rank has no NVMe states (ZeRO: another rank's
 * chunk), a twin (no load is in flight yet); after a checkpoint, the
 * states' store wrote them. */
static zo_status nvme_p16_write(void *self, struct zo_engine *e, uint32_t c, const float *master,
                                int init)
{
    eng_nvme_tier *nv = self;
    if (!init)
        return ZO_OK;
    eng_chunk *k = &e->chunks[c];
    void *p16 = nv->stage[0] ? (char *)nv->stage[0] + nv->state_extent_bytes : nv->twins[0].ptr;
    memset(p16, 0, e->chunk_bytes);
    eng_cast_params(e->cfg.param_dtype, master, p16, k->n_elems);
    k->pgen[0] = 1;
    return zo_swap_write(nv->pswap, k->pext[0], p16, nv->p16_extent, k->pgen[0]);
}

static zo_status nvme_p16_source(void *self, struct zo_engine *e, uint32_t c, const eng_load *ld,
                                 const void **src)
{
    eng_nvme_tier *nv = self;
    if ((*src = eng_zero_gathered(e, c)) != NULL)
        return ZO_OK; /* ZeRO stage 3, its owner: read for the gather, behind it on the stream */
    eng_twin *t;
    ZO_TRY(stage_from_nvme(nv, e, &e->chunks[c], ld, &t));
    *src = t->ptr;
    return ZO_OK;
}

/* The update writes them into the stage's spare room, behind the states. */
static void *nvme_p16_out(void *self, struct zo_engine *e, uint32_t c, void *tail)
{
    (void)e, (void)c;
    return tail;
}

static zo_status nvme_p16_store(void *self, struct zo_engine *e, uint32_t c, void *src,
                                zo_swap_io_t *io)
{
    eng_nvme_tier *nv = self;
    eng_chunk *k = &e->chunks[c];
    int palt = 1 - k->pext_cur;
    k->pgen[palt] = k->pgen[k->pext_cur] + 1;
    return eng_swap_async(e, 1, 1, c, k->pext[palt], src, nv->p16_extent, k->pgen[palt], io);
}

/* Written together with the states: switched when they are; another
 * rank's chunk (ZeRO) when its owner's broadcast landed in the alternate. */
static void nvme_p16_commit(void *self, struct zo_engine *e, uint32_t c, int updated, int stored)
{
    eng_chunk *k = &e->chunks[c];
    if (stored || (updated && k->palt_valid))
        k->pext_cur = 1 - k->pext_cur;
    k->palt_valid = 0;
}

/* ---- ZeRO: the owners' broadcasts (engine_zero.c) ---- */

int eng_p16_nvme(const eng_chunk *k)
{
    return k->pt == &eng_param_tier_nvme;
}

zo_status eng_p16_nvme_read(eng_nvme_tier *nv, struct zo_engine *e, uint32_t c, int latest,
                            void *buf)
{
    eng_chunk *k = &e->chunks[c];
    int x = latest ? 1 - k->pext_cur : k->pext_cur;
    zo_swap_io_t io = NULL;
    ZO_TRY(eng_swap_async(e, 0, 1, c, k->pext[x], buf, nv->p16_extent, k->pgen[x], &io));
    return eng_timed_swap_wait(e, io);
}

zo_status eng_p16_nvme_receive(eng_nvme_tier *nv, struct zo_engine *e, uint32_t c, void *buf,
                               zo_swap_io_t *io)
{
    eng_chunk *k = &e->chunks[c];
    int alt = 1 - k->pext_cur;
    k->palt_valid = 0;
    k->pgen[alt] = k->pgen[k->pext_cur] + 1;
    return eng_swap_async(e, 1, 1, c, k->pext[alt], buf, nv->p16_extent, k->pgen[alt], io);
}

/* ---- device-resident 16-bit parameters with their copy here ---- */

/* Counted by the NVMe tables: the slots with the device's, the extents, the
 * twins and the stages' room with those of the chunks homed here. */
static void backed_account(const eng_plan_in *in, zo_engine_footprint *fp)
{
    (void)in, (void)fp;
}

/* Placed and released with the NVMe 16-bit parameters (nvme_p16_place). */
static zo_status backed_place(void *self, struct zo_engine *e)
{
    (void)e;
    return ZO_OK;
}

static void backed_release(void *self, struct zo_engine *e)
{
    (void)e;
}

/* The committed master of chunk c rounded to 16 bits (what its copy holds)
 * into a twin for the load ld, after a load of the copy failed: a corrupted
 * extent fails every read again, the states it was rounded from do not.
 * Their buffer is pageable memory, taken only then. */
static zo_status p16_from_master(eng_nvme_tier *nv, struct zo_engine *e, uint32_t c,
                                 const eng_load *ld, const void **src)
{
    eng_chunk *k = &e->chunks[c];
    eng_twin *t;
    ZO_TRY(take_twin(nv, &t));
    float *buf = aligned_alloc(ZO_SWAP_ALIGN, nv->state_extent_bytes);
    if (!buf)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "allocating a chunk's states to reload it");
    int x = ld->latest ? 1 - k->ext_cur : k->ext_cur; /* as p16_loaded */
    zo_status st = zo_swap_read(nv->swap, k->ext[x], buf, state_io_bytes(e, k), k->gen[x]);
    if (st == ZO_OK) /* the master leads the packed states */
        eng_cast_params(e->cfg.param_dtype, buf, t->ptr, k->n_elems);
    free(buf);
    ZO_TRY(st);
    t->filled = ld->filled;
    *src = t->ptr;
    return ZO_OK;
}

static zo_status backed_source(void *self, struct zo_engine *e, uint32_t c, const eng_load *ld,
                               const void **src)
{
    eng_nvme_tier *nv = self;
    if (e->chunks[c].reload == ENG_RELOAD_MASTER)
        return p16_from_master(nv, e, c, ld, src);
    return nvme_p16_source(self, e, c, ld, src);
}

const eng_param_tier eng_param_tier_device_nvme = {
    .version = ENG_TIER_OPS_VERSION,
    .tier = ZO_TIER_DEVICE,
    .name = "device (copy on NVMe)",
    .resident = 1,
    .host_copies = 0,
    .lazy = 1,
    .account = backed_account,
    .place = backed_place,
    .release = backed_release,
    .write = nvme_p16_write,
    .source = backed_source,
    .update_out = nvme_p16_out,
    .store = nvme_p16_store,
    .commit = nvme_p16_commit,
    .abandon = NULL, /* the NVMe table's drops the twins' tickets */
};

const eng_param_tier eng_param_tier_nvme = {
    .version = ENG_TIER_OPS_VERSION,
    .tier = ZO_TIER_NVME,
    .name = "nvme",
    .resident = 0,
    .host_copies = 0,
    .account = nvme_p16_account,
    .place = nvme_p16_place,
    .release = nvme_p16_release,
    .write = nvme_p16_write,
    .source = nvme_p16_source,
    .update_out = nvme_p16_out,
    .store = nvme_p16_store,
    .commit = nvme_p16_commit,
    .abandon = drop_tickets,
};

/* ---- optimizer states ---- */

/* A stage holds master | m | v at the chunk's stride, and 16-bit parameters
 * behind them when some chunk's live here too. */
static uint64_t stage_bytes(const eng_plan_in *in)
{
    return eng_states_io_bytes(in->cfg->state_dtype, in->chunk_elems) +
           (p16_homed(in) ? in->chunk_bytes : 0);
}

/* A stage's up bits in transit (master_split): host memory. */
static uint64_t split_bits_bytes(const zo_engine_config *c, uint64_t chunk_elems)
{
    return c->master_split ? zo_round_up(chunk_elems / 8 + 1, 64) : 0;
}

static void nvme_states_account(const eng_plan_in *in, zo_engine_footprint *fp)
{
    uint32_t n = eng_count_homed(in, 1, ZO_TIER_NVME);
    if (!n)
        return;
    fp->pinned += ENG_NVME_STAGES * stage_bytes(in);
    fp->bytes[ZO_TIER_HOST] += ENG_NVME_STAGES * split_bits_bytes(in->cfg, in->chunk_elems);
    /* extents sized to the fullest chunk, not the chunk size: a small
     * model in large chunks reserves what it holds */
    fp->bytes[ZO_TIER_NVME] +=
        2ull * n * zo_engine_nvme_state_bytes_as(in->cfg->state_dtype, in->max_chunk_elems);
}

/* Which chunks keep the full master whatever their values, said once. */
static void log_split(const struct zo_engine *e)
{
    uint32_t n = 0, full = 0;
    for (uint32_t c = 0; c < e->n_chunks; c++)
        if (e->chunks[c].st == &eng_state_tier_nvme) {
            n++;
            full += e->chunks[c].p16_bufs != 2;
        }
    if (e->cfg.master_split && full)
        ZO_LOGI(ENG_SUBSYS,
                "master_split: %u of the %u chunks with states on NVMe keep the full master "
                "(their 16-bit parameters live on NVMe, where reading them costs what the split "
                "saves)",
                full, n);
}

static zo_status nvme_states_place(void *self, struct zo_engine *e)
{
    eng_nvme_tier *nv = self;
    uint32_t n = eng_chunks_at(e, 1, &eng_state_tier_nvme);
    nv->stage_bytes = nv->state_extent_bytes + (eng_p16_on_nvme(e) ? e->chunk_bytes : 0) +
                      eng_grads_stage_room(e); /* spilled gradients read back */
    for (unsigned i = 0; i < ENG_NVME_STAGES; i++)
        nv->spec.rd_chunk[i] = nv->spec.wr_chunk[i] = -1;
    void *tmp[ENG_NVME_STAGES];
    ZO_TRY(eng_take_pinned(e, nv->stage_bytes, ENG_NVME_STAGES, tmp));
    for (int i = 0; i < (int)ENG_NVME_STAGES; i++)
        nv->stage[i] = tmp[i];
    uint64_t bb = split_bits_bytes(&e->cfg, e->chunk_elems);
    float *bits = NULL;
    ZO_TRY(eng_host_alloc(e, ENG_NVME_STAGES * bb, &bits));
    for (unsigned i = 0; bits && i < ENG_NVME_STAGES; i++)
        nv->split_bits[i] = (uint8_t *)bits + i * bb;
    ZO_TRY(eng_open_store(e, nv->nvme_state_extent, 2ull * n, "", &nv->swap));
    eng_store_opened(e, nv->swap, nv->nvme_state_extent);
    log_split(e);
    for (uint32_t c = 0; c < e->n_chunks; c++)
        for (int i = 0; e->chunks[c].st == &eng_state_tier_nvme && i < 2; i++)
            ZO_TRY(zo_swap_alloc_extent(nv->swap, 2ull * c + (uint64_t)i, &e->chunks[c].ext[i]));
    for (int i = 0; i < (int)ENG_NVME_STAGES; i++)
        ZO_TRY(zo_swap_register_buffer(nv->swap, nv->stage[i], nv->stage_bytes));
    return ZO_OK;
}

static void nvme_states_release(void *self, struct zo_engine *e)
{
    eng_nvme_tier *nv = self;
    eng_host_free(nv->split_bits[0]);
    memset(nv->split_bits, 0, sizeof nv->split_bits);
    if (nv->swap) { /* the mode's settle drained the speculative pipeline */
        for (int i = 0; i < (int)ENG_NVME_STAGES; i++)
            if (nv->stage[i])
                zo_swap_unregister_buffer(nv->swap, nv->stage[i]);
        zo_swap_close(nv->swap);
        nv->swap = NULL;
    }
    memset(nv->stage, 0, sizeof nv->stage);
}

static float *nvme_init_buf(void *self, struct zo_engine *e, uint32_t c)
{
    eng_nvme_tier *nv = self;
    (void)c;
    return nv->stage[0];
}

/* master only: m and v start at zero */
static zo_status nvme_init(void *self, struct zo_engine *e, uint32_t c, float *buf)
{
    eng_nvme_tier *nv = self;
    eng_chunk *k = &e->chunks[c];
    k->gen[0] = 1;
    k->split_ref[0] = k->split_ref[1] = -1; /* the first update splits it */
    states_pack(e, k, buf);
    return zo_swap_write(nv->swap, k->ext[0], buf, state_io_bytes(e, k), k->gen[0]);
}

static zo_status nvme_drain(void *self, struct zo_engine *e)
{
    eng_nvme_tier *nv = self;
    return nv->swap ? spec_drain(nv, e) : ZO_OK;
}

static void nvme_rollback(void *self, struct zo_engine *e, uint32_t c)
{
    (void)e, (void)c;
} /* nothing in place */

static void nvme_discard(void *self, struct zo_engine *e, uint32_t c)
{
    e->chunks[c].alt_valid = 0;
}

static int nvme_commit(void *self, struct zo_engine *e, uint32_t c)
{
    eng_chunk *k = &e->chunks[c];
    if (!k->alt_valid)
        return 0;
    k->ext_cur = 1 - k->ext_cur;
    k->alt_valid = 0;
    return 1;
}

/* The stages are idle between steps. */
static zo_status nvme_write_begin(void *self, struct zo_engine *e, uint32_t c, float **buf)
{
    eng_nvme_tier *nv = self;
    *buf = nv->stage[0];
    return nvme_read(self, e, c, *buf);
}

const eng_state_tier eng_state_tier_nvme = {
    .version = ENG_TIER_OPS_VERSION,
    .tier = ZO_TIER_NVME,
    .name = "nvme",
    .packed = 1,
    .in_place = 0,
    .p16_behind = 1,
    .p16_stored = 1,
    .needs_caps = 0,
    .needs_paths = 1,
    .account = nvme_states_account,
    .place = nvme_states_place,
    .release = nvme_states_release,
    .init_buf = nvme_init_buf,
    .init = nvme_init,
    .update = nvme_update,
    .speculate = nvme_speculate,
    .drain = nvme_drain,
    .rollback = nvme_rollback,
    .discard = nvme_discard,
    .commit = nvme_commit,
    .read = nvme_read,
    .write_begin = nvme_write_begin,
    .write_end = nvme_write_end,
};
