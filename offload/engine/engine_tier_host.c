/* The host tier: 16-bit parameters in pinned host copies (one, or two when
 * the update writes them behind the fetches) that the device slots cache;
 * optimizer states resident in pageable host memory, updated in place by
 * the CPU optimizer (backed up first in overlap mode). The resident
 * operations are shared with the device tier (engine_tier_device.c). */
#include <stdlib.h>
#include <string.h>

#include "engine_tier.h"

/* ---- 16-bit parameters ---- */

void eng_host_p16_account(const eng_plan_in *in, zo_tier t, zo_engine_footprint *fp)
{
    for (uint32_t c = 0; c < in->n_chunks; c++)
        if (eng_p16_home(in, c) == t)
            fp->pinned += (uint64_t)eng_p16_bufs(in, c) * in->chunk_bytes;
}

/* One set of slots, buffer by buffer and chunk by chunk within. */
zo_status eng_host_p16_place(struct zo_engine *e, const eng_param_tier *table)
{
    size_t n = 0;
    for (uint32_t c = 0; c < e->n_chunks; c++)
        if (e->chunks[c].pt == table)
            n += (size_t)e->chunks[c].p16_bufs;
    void **tmp = calloc(n ? n : 1, sizeof *tmp);
    if (!tmp)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "allocating a pointer table");
    zo_status st = eng_take_pinned(e, e->chunk_bytes, n, tmp);
    size_t i = 0;
    for (int b = 0; st == ZO_OK && b < 2; b++)
        for (uint32_t c = 0; c < e->n_chunks; c++)
            if (e->chunks[c].pt == table && e->chunks[c].p16_bufs > b)
                e->chunks[c].p16[b] = tmp[i++];
    free(tmp);
    return st;
}

zo_status eng_host_p16_write(void *self, struct zo_engine *e, uint32_t c, const float *master,
                             int init)
{
    eng_chunk *k = &e->chunks[c];
    for (int b = 0; b < k->p16_bufs; b++) {
        if (init)
            memset(k->p16[b], 0, e->chunk_bytes);
        eng_cast_params(e->cfg.param_dtype, master, k->p16[b], k->n_elems);
    }
    return ZO_OK;
}

/* The current copy, or the next one where an update running behind the
 * forward has landed there (written, not committed yet). */
zo_status eng_host_p16_source(void *self, struct zo_engine *e, uint32_t c, const eng_load *ld,
                              const void **src)
{
    eng_chunk *k = &e->chunks[c];
    int next = ld->latest && k->p16_bufs == 2;
    *src = k->p16[next ? 1 - k->p16_cur : k->p16_cur];
    return ZO_OK;
}

/* The next buffer when double-buffered (committed later), else in place. */
void *eng_host_p16_out(void *self, struct zo_engine *e, uint32_t c, void *tail)
{
    (void)tail;
    eng_chunk *k = &e->chunks[c];
    return k->p16_bufs == 2 ? k->p16[1 - k->p16_cur] : k->p16[k->p16_cur];
}

/* Not when the update was skipped: the next buffer then holds nothing new. */
void eng_host_p16_commit(void *self, struct zo_engine *e, uint32_t c, int updated, int stored)
{
    (void)stored;
    eng_chunk *k = &e->chunks[c];
    if (k->p16_bufs == 2 && updated)
        k->p16_cur = 1 - k->p16_cur;
}

static void host_p16_account(const eng_plan_in *in, zo_engine_footprint *fp)
{
    eng_host_p16_account(in, ZO_TIER_HOST, fp);
}

static zo_status host_p16_place(void *self, struct zo_engine *e)
{
    return eng_host_p16_place(e, &eng_param_tier_host);
}

static void host_p16_release(void *self, struct zo_engine *e)
{
    (void)e;
} /* the pool goes with the engine's */

const eng_param_tier eng_param_tier_host = {
    .version = ENG_TIER_OPS_VERSION,
    .tier = ZO_TIER_HOST,
    .name = "host",
    .resident = 0,
    .host_copies = 1,
    .account = host_p16_account,
    .place = host_p16_place,
    .release = host_p16_release,
    .write = eng_host_p16_write,
    .source = eng_host_p16_source,
    .update_out = eng_host_p16_out,
    .store = NULL,
    .commit = eng_host_p16_commit,
    .abandon = NULL,
};

/* ---- optimizer states ---- */

uint64_t eng_resident_account(const eng_plan_in *in, zo_tier t, zo_engine_footprint *fp)
{
    uint64_t per = eng_states_bytes(in->cfg->state_dtype, in->chunk_elems), bytes = 0;
    for (uint32_t c = 0; c < in->n_chunks; c++)
        if (eng_states_home(in, c) == t)
            bytes += per;
    if (in->mode_backups)
        fp->bytes[ZO_TIER_HOST] += bytes;
    return bytes;
}

zo_status eng_resident_place(struct zo_engine *e, const eng_state_tier *table, float *base,
                             float **backups)
{
    uint64_t per = eng_states_bytes(e->cfg.state_dtype, e->chunk_elems) / sizeof(float);
    uint64_t n = eng_chunks_at(e, 1, table);
    if (e->mode->backups)
        ZO_TRY(eng_host_alloc(e, n * per * sizeof(float), backups));
    uint64_t i = 0;
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        eng_chunk *k = &e->chunks[c];
        if (k->st != table)
            continue;
        k->states = base + i * per;
        if (*backups)
            k->backup = *backups + i * per;
        i++;
    }
    return ZO_OK;
}

float *eng_resident_init_buf(void *self, struct zo_engine *e, uint32_t c)
{
    return e->chunks[c].states;
}

zo_status eng_resident_init(void *self, struct zo_engine *e, uint32_t c, float *buf)
{
    (void)e, (void)c, (void)buf; /* filled in place */
    return ZO_OK;
}

zo_status eng_resident_update(void *self, struct zo_engine *e, const uint32_t *chunks, uint32_t n,
                              const eng_update_args *u)
{
    size_t cap = 0;
    for (uint32_t i = 0; i < n; i++)
        cap += eng_adam_jobs(&e->chunks[chunks[i]]);
    zo_optim_job_t *jobs = calloc(cap ? cap : 1, sizeof *jobs);
    if (!jobs)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "allocating %zu job handles", cap);
    zo_status st = ZO_OK;
    uint32_t queued = 0;
    for (uint32_t i = 0; st == ZO_OK && i < n; i++) {
        uint32_t q = 0;
        eng_chunk *k = &e->chunks[chunks[i]];
        st = eng_adam_enqueue(e, k, k->states, u, jobs + queued, &q);
        queued += q;
    }
    st = eng_adam_wait(jobs, queued, st);
    free(jobs);
    return st;
}

zo_status eng_resident_speculate(void *self, struct zo_engine *e, uint32_t c, const eng_job *j,
                                 int next)
{
    eng_chunk *k = &e->chunks[c];
    memcpy(k->backup, k->states, eng_states_bytes(e->cfg.state_dtype, e->chunk_elems));
    eng_update_args u = {j->lr, j->factor, j->step, j->parity, NULL};
    return eng_adam_run(e, k, k->states, &u);
}

zo_status eng_resident_drain(void *self, struct zo_engine *e)
{
    (void)e;
    return ZO_OK;
}

/* From the backup; the single-buffered 16-bit copy is recomputed, since it
 * is always the rounded master. */
void eng_resident_rollback(void *self, struct zo_engine *e, uint32_t c)
{
    eng_chunk *k = &e->chunks[c];
    if (!k->spec_done || !k->backup)
        return;
    memcpy(k->states, k->backup, eng_states_bytes(e->cfg.state_dtype, e->chunk_elems));
    if (k->p16_bufs == 1)
        eng_cast_params(e->cfg.param_dtype, k->states, k->p16[k->p16_cur], k->n_elems);
    k->spec_done = 0;
}

void eng_resident_discard(void *self, struct zo_engine *e, uint32_t c)
{
    (void)e, (void)c;
}

int eng_resident_commit(void *self, struct zo_engine *e, uint32_t c)
{
    (void)e, (void)c; /* updated in place */
    return 0;
}

zo_status eng_resident_read(void *self, struct zo_engine *e, uint32_t c, float *out)
{
    memcpy(out, e->chunks[c].states, eng_states_bytes(e->cfg.state_dtype, e->chunk_elems));
    return ZO_OK;
}

zo_status eng_resident_write_begin(void *self, struct zo_engine *e, uint32_t c, float **buf)
{
    *buf = e->chunks[c].states;
    return ZO_OK;
}

zo_status eng_resident_write_end(void *self, struct zo_engine *e, uint32_t c, float *buf)
{
    (void)e, (void)c, (void)buf; /* written in place */
    return ZO_OK;
}

static void host_states_account(const eng_plan_in *in, zo_engine_footprint *fp)
{
    fp->bytes[ZO_TIER_HOST] += eng_resident_account(in, ZO_TIER_HOST, fp);
}

static zo_status host_states_place(void *self, struct zo_engine *e)
{
    eng_host_tier *h = self;
    uint64_t n = eng_chunks_at(e, 1, &eng_state_tier_host);
    ZO_TRY(eng_host_alloc(e, n * eng_states_bytes(e->cfg.state_dtype, e->chunk_elems), &h->states));
    return eng_resident_place(e, &eng_state_tier_host, h->states, &h->backup);
}

static void host_states_release(void *self, struct zo_engine *e)
{
    eng_host_tier *h = self;
    eng_host_free(h->states);
    eng_host_free(h->backup);
    h->states = h->backup = NULL;
}

const eng_state_tier eng_state_tier_host = {
    .version = ENG_TIER_OPS_VERSION,
    .tier = ZO_TIER_HOST,
    .name = "host",
    .packed = 0,
    .in_place = 1,
    .p16_behind = 0,
    .p16_stored = 0,
    .needs_caps = 0,
    .needs_paths = 0,
    .account = host_states_account,
    .place = host_states_place,
    .release = host_states_release,
    .init_buf = eng_resident_init_buf,
    .init = eng_resident_init,
    .update = eng_resident_update,
    .speculate = eng_resident_speculate,
    .drain = eng_resident_drain,
    .rollback = eng_resident_rollback,
    .discard = eng_resident_discard,
    .commit = eng_resident_commit,
    .read = eng_resident_read,
    .write_begin = eng_resident_write_begin,
    .write_end = eng_resident_write_end,
};
