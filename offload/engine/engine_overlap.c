/* The overlap mode: each chunk is updated speculatively as soon as its final
 * gradients reach the host (resident states backed up first; NVMe states
 * through a pipeline of their own that writes the alternate extents), and at
 * the end of the step the speculation is validated: when clipping or an
 * overflow makes it wrong it is rolled back and the update redone. Results
 * equal sync mode's. */
#include <string.h>

#include "engine_internal.h"

/* ---- the speculative pipeline (overlap mode, states on NVMe) ---- */

/* Wait for the stage's writes; the chunk's alternate extents count as
 * written only once both landed. */
static zo_status spec_finish_write(struct zo_engine *e, unsigned s)
{
    eng_spec_pipe *p = &e->spec;
    if (p->wr_chunk[s] < 0) return ZO_OK;
    zo_status st = eng_timed_swap_wait(e, p->wr[s]);
    zo_status st2 = eng_timed_swap_wait(e, p->pwr[s]);
    if (st == ZO_OK && st2 == ZO_OK) e->chunks[p->wr_chunk[s]].alt_valid = 1;
    p->wr[s] = p->pwr[s] = NULL;
    p->wr_chunk[s] = -1;
    return st < 0 ? st : st2;
}

static void spec_drop_read(struct zo_engine *e, unsigned s)
{
    if (e->spec.rd_chunk[s] < 0) return;
    zo_swap_wait(e->spec.rd[s]); /* a read ahead nobody used */
    e->spec.rd[s] = NULL;
    e->spec.rd_chunk[s] = -1;
}

static zo_status spec_start_read(struct zo_engine *e, uint32_t c, unsigned *out)
{
    eng_spec_pipe *p = &e->spec;
    unsigned s = p->next;
    p->next = (p->next + 1) % ENG_NVME_STAGES;
    ZO_TRY(spec_finish_write(e, s));
    spec_drop_read(e, s);
    ZO_TRY(eng_read_current(e, c, e->stage[s], &p->rd[s]));
    p->rd_chunk[s] = (int)c;
    *out = s;
    return ZO_OK;
}

static int spec_stage_of(struct zo_engine *e, uint32_t c)
{
    for (unsigned s = 0; s < ENG_NVME_STAGES; s++)
        if (e->spec.rd_chunk[s] == (int)c) return (int)s;
    return -1;
}

/* The chunk of the next queued job that will update, or -1. */
static int next_spec_chunk(struct zo_engine *e)
{
    int c = -1;
    pthread_mutex_lock(&e->mu);
    for (eng_job *j = e->qhead; j; j = j->next)
        if (j->last) {
            c = j->chunk;
            break;
        }
    pthread_mutex_unlock(&e->mu);
    return c;
}

/* Speculative update of chunk c through NVMe: its states were (or are now)
 * read into a stage; the next updating chunk's read is started before this
 * one is computed; the writes go out behind. */
static zo_status speculate_nvme(struct zo_engine *e, uint32_t c, const eng_job *j)
{
    int s = spec_stage_of(e, c);
    if (s < 0) {
        unsigned u;
        ZO_TRY(spec_start_read(e, c, &u));
        s = (int)u;
    }
    int c2 = next_spec_chunk(e);
    if (c2 >= 0 && spec_stage_of(e, (uint32_t)c2) < 0) {
        unsigned u;
        ZO_TRY(spec_start_read(e, (uint32_t)c2, &u));
    }
    eng_spec_pipe *p = &e->spec;
    zo_status st = eng_timed_swap_wait(e, p->rd[s]);
    p->rd[s] = NULL;
    p->rd_chunk[s] = -1;
    ZO_TRY(st);
    zo_adam_params ap;
    zo_adam_buffers b;
    eng_adam_args(e, &e->chunks[c], e->stage[s], j->lr, j->factor, j->step, j->parity, &ap, &b);
    ZO_TRY(zo_optim_pool_adam_step(e->opool, &ap, &b));
    st = eng_write_alternate(e, c, e->stage[s], &p->wr[s], &p->pwr[s]);
    p->wr_chunk[s] = (int)c;
    return st;
}

/* Wait for everything the pipeline has in flight (after the job thread is
 * idle); returns the first failed write. */
zo_status eng_spec_drain(struct zo_engine *e)
{
    zo_status st = ZO_OK;
    for (unsigned s = 0; s < ENG_NVME_STAGES; s++) {
        spec_drop_read(e, s);
        zo_status w = spec_finish_write(e, s);
        if (st == ZO_OK && w < 0) st = w;
    }
    e->spec.next = 0;
    return st;
}

/* Undo speculative updates of resident states from their backups; the
 * single-buffered 16-bit copy is recomputed, since it is always the rounded
 * master. */
void eng_restore_backups(struct zo_engine *e)
{
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        eng_chunk *k = &e->chunks[c];
        if (!k->spec_done || !k->backup) continue;
        memcpy(k->states, k->backup, 3 * e->chunk_elems * sizeof(float));
        if (e->p16_bufs == 1) {
            uint16_t *p = k->p16[k->p16_cur];
            for (size_t i = 0; i < k->n_elems; i++) p[i] = eng_from_f32(e->cfg.param_dtype, k->states[i]);
        }
        k->spec_done = 0;
    }
}

static zo_status speculate(struct zo_engine *e, uint32_t c, const eng_job *j)
{
    eng_chunk *k = &e->chunks[c];
    if (e->swap) {
        ZO_TRY(speculate_nvme(e, c, j));
    } else {
        memcpy(k->backup, k->states, 3 * e->chunk_elems * sizeof(float));
        zo_adam_params p;
        zo_adam_buffers b;
        eng_adam_args(e, k, k->states, j->lr, j->factor, j->step, j->parity, &p, &b);
        ZO_TRY(zo_optim_pool_adam_step(e->opool, &p, &b));
    }
    k->spec_done = 1;
    return ZO_OK;
}

static zo_status grads_done(struct zo_engine *e, uint32_t c, const eng_job *j) { return speculate(e, c, j); }

/* Keep the speculation when it was right, else roll back and update anew. */
static zo_status validate(struct zo_engine *e, const eng_verdict *v, int *rollbacks)
{
    int parity = e->g_bufs == 2 ? (int)(e->steps & 1) : 0;
    *rollbacks = 0;
    if (!v->overflow && v->factor == v->plain) return ZO_OK; /* the speculation was right */
    for (uint32_t c = 0; c < e->n_chunks; c++) *rollbacks += e->chunks[c].spec_done;
    eng_restore_backups(e);
    eng_discard_uncommitted(e);
    if (v->overflow) return ZO_OK;
    return eng_update_all(e, e->step_lr, v->factor, e->opt_step + 1, parity);
}

static const char *update_name(const eng_verdict *v, int rollbacks)
{
    (void)v;
    return rollbacks ? "rollback and update" : "validate speculative update";
}

static zo_status end_step(struct zo_engine *e, const eng_verdict *v, int *rollbacks,
                          const zo_loss_scaler *saved)
{
    return eng_update_now(e, v, rollbacks, saved, validate, update_name);
}

static zo_status settle(struct zo_engine *e) { return e->swap ? eng_spec_drain(e) : ZO_OK; }

static void abort_step(struct zo_engine *e)
{
    eng_restore_backups(e);
    eng_discard_uncommitted(e);
}

const eng_mode_ops eng_mode_overlap = {
    .name = "overlap",
    .grad_bufs = 1,
    .p16_behind = 0,
    .backups = 1,
    .job_name = "gradient norm + speculative update",
    .grads_done = grads_done,
    .end_step = end_step,
    .settle = settle,
    .abort = abort_step,
};
