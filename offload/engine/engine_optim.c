/* The optimizer side of the engine: a host job thread that takes each
 * chunk's gradients once their D2H lands (fp32 accumulation, gradient
 * statistics, then the mode's grads_done), and the update of all chunks with
 * the NVMe pipeline (read chunk i+2 while updating i+1 and writing i),
 * commit, rollback. The modes themselves are in engine_sync.c,
 * engine_overlap.c and engine_dpu.c. */
#include <inttypes.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "zo/half.h"
#include "zo/nvtx.h"

/* ---- helpers over one chunk ---- */

static float to_f32(zo_optim_dtype t, uint16_t h)
{
    return t == ZO_OPTIM_FP16 ? zo_f16_to_f32(h) : zo_bf16_to_f32(h);
}

uint16_t eng_from_f32(zo_optim_dtype t, float f)
{
    return t == ZO_OPTIM_FP16 ? zo_f32_to_f16(f) : zo_f32_to_bf16(f);
}

/* Where an update writes chunk c's 16-bit parameters: the next buffer when
 * they are double-buffered (committed later), else in place. */
static void *p16_out(struct zo_engine *e, eng_chunk *k)
{
    return e->p16_bufs == 2 ? k->p16[1 - k->p16_cur] : k->p16[k->p16_cur];
}

void eng_adam_args(struct zo_engine *e, eng_chunk *k, float *st, float lr, float factor,
                   int64_t step, int parity, zo_adam_params *p, zo_adam_buffers *b)
{
    *p = e->cfg.adam;
    p->struct_size = sizeof *p;
    p->lr = lr;
    p->step = step;
    p->grad_scale = factor;
    zo_adam_buffers init = ZO_ADAM_BUFFERS_INIT;
    *b = init;
    b->n = k->n_elems;
    if (e->cfg.grad_accum_steps > 1) {
        b->grad = k->acc[parity];
        b->grad_type = ZO_OPTIM_FP32;
    } else {
        b->grad = k->g16[parity];
        b->grad_type = e->cfg.param_dtype;
    }
    const size_t stride = eng_state_stride(e, k); /* packed in an NVMe stage */
    b->master = st;
    b->m = st + stride;
    b->v = st + 2 * stride;
    b->out = e->pswap ? (void *)(st + 3 * stride) : p16_out(e, k); /* NVMe: the stage's tail */
    b->out_type = e->cfg.param_dtype;
}

zo_status eng_timed_swap_wait(struct zo_engine *e, zo_swap_io_t io)
{
    uint64_t t0 = zo_now_ns();
    zo_status st = zo_swap_wait(io);
    atomic_fetch_add(&e->nvme_ns, zo_now_ns() - t0);
    return st;
}

zo_status eng_read_current(struct zo_engine *e, uint32_t c, float *buf, zo_swap_io_t *io)
{
    eng_chunk *k = &e->chunks[c];
    return eng_swap_async(e, 0, 0, c, k->ext[k->ext_cur], buf, eng_state_io_bytes(e, k), k->gen[k->ext_cur],
                          io);
}

/* Write the updated states (and, when they live on NVMe, the new 16-bit
 * parameters from the stage's tail) to the alternate extents. */
zo_status eng_write_alternate(struct zo_engine *e, uint32_t c, float *buf, zo_swap_io_t *io,
                              zo_swap_io_t *pio)
{
    eng_chunk *k = &e->chunks[c];
    int alt = 1 - k->ext_cur;
    k->gen[alt] = k->gen[k->ext_cur] + 1;
    ZO_TRY(eng_swap_async(e, 1, 0, c, k->ext[alt], buf, eng_state_io_bytes(e, k), k->gen[alt], io));
    if (!e->pswap) return ZO_OK;
    int palt = 1 - k->pext_cur;
    k->pgen[palt] = k->pgen[k->pext_cur] + 1;
    return eng_swap_async(e, 1, 1, c, k->pext[palt], buf + 3 * eng_state_stride(e, k), e->chunk_bytes,
                          k->pgen[palt], pio);
}

/* ---- the update of every chunk ---- */

static zo_status update_all_resident(struct zo_engine *e, float lr, float factor, int64_t step,
                                     int parity)
{
    zo_optim_job_t *jobs = calloc(e->n_chunks, sizeof *jobs);
    if (!jobs) return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "allocating %u job handles", e->n_chunks);
    zo_status st = ZO_OK;
    uint32_t queued = 0;
    for (; queued < e->n_chunks; queued++) {
        eng_chunk *k = &e->chunks[queued];
        zo_adam_params p;
        zo_adam_buffers b;
        eng_adam_args(e, k, k->states, lr, factor, step, parity, &p, &b);
        st = zo_optim_pool_adam_enqueue(e->opool, &p, &b, &jobs[queued]);
        if (st < 0) break;
    }
    for (uint32_t i = 0; i < queued; i++) {
        zo_status w = zo_optim_job_wait(jobs[i], NULL);
        if (st == ZO_OK && w < 0) st = w;
    }
    free(jobs);
    return st;
}

/* The update of every chunk through NVMe, on zo_swap_pipeline_run's
 * schedule: a chunk's states are read into a stage two chunks ahead,
 * updated there and written to the alternate extents from it. */
typedef struct nvme_pipe {
    struct zo_engine *e;
    float lr, factor;
    int64_t step;
    int parity;
    zo_swap_io_t rd[ENG_NVME_STAGES], wr[ENG_NVME_STAGES], pwr[ENG_NVME_STAGES];
} nvme_pipe;

static zo_status pipe_wait(nvme_pipe *pp, zo_swap_io_t *io)
{
    if (!*io) return ZO_OK;
    zo_status st = eng_timed_swap_wait(pp->e, *io);
    *io = NULL;
    return st;
}

static zo_status pipe_read(void *user, uint32_t c, unsigned s)
{
    nvme_pipe *pp = user;
    return eng_read_current(pp->e, c, pp->e->stage[s], &pp->rd[s]);
}

static zo_status pipe_update(void *user, uint32_t c, unsigned s)
{
    nvme_pipe *pp = user;
    struct zo_engine *e = pp->e;
    ZO_TRY(pipe_wait(pp, &pp->rd[s]));
    zo_adam_params p;
    zo_adam_buffers b;
    eng_adam_args(e, &e->chunks[c], e->stage[s], pp->lr, pp->factor, pp->step, pp->parity, &p, &b);
    ZO_TRY(zo_optim_pool_adam_step(e->opool, &p, &b));
    return eng_write_alternate(e, c, e->stage[s], &pp->wr[s], &pp->pwr[s]);
}

/* Every ticket is waited for, whatever failed first. */
static zo_status pipe_drain(void *user, unsigned s)
{
    nvme_pipe *pp = user;
    zo_status a = pipe_wait(pp, &pp->rd[s]);
    zo_status b = pipe_wait(pp, &pp->wr[s]);
    zo_status c = pipe_wait(pp, &pp->pwr[s]);
    return a < 0 ? a : b < 0 ? b : c;
}

static zo_status update_all_nvme(struct zo_engine *e, float lr, float factor, int64_t step, int parity)
{
    static const zo_swap_pipeline_ops ops = {pipe_read, pipe_update, pipe_drain};
    nvme_pipe pp = {e, lr, factor, step, parity, {0}, {0}, {0}};
    zo_status st = zo_swap_pipeline_run(e->n_chunks, ENG_NVME_STAGES, &ops, &pp);
    if (st < 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", zo_last_error());
        return ZO_FAIL(st, ENG_SUBSYS, "updating the optimizer states on NVMe: %s", why);
    }
    for (uint32_t c = 0; c < e->n_chunks; c++) e->chunks[c].alt_valid = 1;
    return ZO_OK;
}

zo_status eng_update_all(struct zo_engine *e, float lr, float factor, int64_t step, int parity)
{
    if (e->swap) return update_all_nvme(e, lr, factor, step, parity);
    return update_all_resident(e, lr, factor, step, parity);
}

/* The update of every chunk at the end of the step, timed and traced. */
zo_status eng_update_now(struct zo_engine *e, const eng_verdict *v, int *rollbacks,
                         const zo_loss_scaler *saved,
                         zo_status (*apply)(struct zo_engine *, const eng_verdict *, int *),
                         const char *(*name)(const eng_verdict *, int))
{
    uint64_t t0 = zo_now_ns();
    zo_nvtx_push("optimizer update");
    zo_status st = apply(e, v, rollbacks);
    zo_nvtx_pop();
    uint64_t t1 = zo_now_ns();
    atomic_fetch_add(&e->optim_ns, t1 - t0);
    eng_trace(e, ZO_TRACK_UPDATE, 0, name(v, *rollbacks), t0, t1, -1, 0);
    if (st < 0) {
        e->scaler = *saved; /* not committed: the step never happened */
        return st;
    }
    eng_commit(e, !v->overflow);
    if (!v->overflow) e->opt_step++;
    return eng_publish(e);
}

/* ---- commit and rollback ---- */

/* Make the step's update the current state: flip NVMe extents and
 * double-buffered 16-bit parameters (not when the update was skipped: the
 * next buffers then hold nothing new). */
void eng_commit(struct zo_engine *e, int updated)
{
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        eng_chunk *k = &e->chunks[c];
        if (e->swap && k->alt_valid) {
            k->ext_cur = 1 - k->ext_cur;
            if (e->pswap) k->pext_cur = 1 - k->pext_cur; /* written together with the states */
            k->alt_valid = 0;
        }
        if (e->p16_bufs == 2 && updated) k->p16_cur = 1 - k->p16_cur;
    }
}

/* Forget updates written to alternate extents (the current ones are intact). */
void eng_discard_uncommitted(struct zo_engine *e)
{
    for (uint32_t c = 0; c < e->n_chunks; c++) e->chunks[c].alt_valid = 0;
}

void eng_states_unpack(const struct zo_engine *e, const eng_chunk *k, float *buf)
{
    const size_t S = eng_state_stride(e, k), C = e->chunk_elems;
    if (S == C) return;
    memmove(buf + 2 * C, buf + 2 * S, k->n_elems * sizeof(float)); /* v first: it moves furthest */
    memmove(buf + C, buf + S, k->n_elems * sizeof(float));
    memset(buf + k->n_elems, 0, (C - k->n_elems) * sizeof(float)); /* the gaps hold nothing */
    memset(buf + C + k->n_elems, 0, (C - k->n_elems) * sizeof(float));
    memset(buf + 2 * C + k->n_elems, 0, (C - k->n_elems) * sizeof(float));
}

void eng_states_pack(const struct zo_engine *e, const eng_chunk *k, float *buf)
{
    const size_t S = eng_state_stride(e, k), C = e->chunk_elems;
    if (S == C) return;
    memmove(buf + S, buf + C, k->n_elems * sizeof(float)); /* m first: it moves down into free space */
    memmove(buf + 2 * S, buf + 2 * C, k->n_elems * sizeof(float));
    memset(buf + k->n_elems, 0, (S - k->n_elems) * sizeof(float)); /* the padding to each 4 KiB boundary */
    memset(buf + S + k->n_elems, 0, (S - k->n_elems) * sizeof(float));
    memset(buf + 2 * S + k->n_elems, 0, (S - k->n_elems) * sizeof(float));
}

/* The latest master | m | v of chunk c (including an update not committed
 * yet) into out (state_extent_bytes, 4 KiB aligned), at the chunk's stride
 * (unpacked when read from NVMe). */
zo_status eng_read_states(struct zo_engine *e, uint32_t c, float *out)
{
    eng_chunk *k = &e->chunks[c];
    if (!e->swap) {
        memcpy(out, k->states, 3 * e->chunk_elems * sizeof(float));
        return ZO_OK;
    }
    int x = k->alt_valid ? 1 - k->ext_cur : k->ext_cur;
    ZO_TRY(zo_swap_read(e->swap, k->ext[x], out, eng_state_io_bytes(e, k), k->gen[x]));
    eng_states_unpack(e, k, out);
    return ZO_OK;
}

/* ---- the host job thread ---- */

static zo_status accumulate(struct zo_engine *e, eng_chunk *k, const eng_job *j)
{
    const uint16_t *g = k->g16[j->parity];
    float *acc = k->acc[j->parity];
    zo_optim_dtype t = e->cfg.param_dtype;
    if (j->micro == 1)
        for (size_t i = 0; i < k->n_elems; i++) acc[i] = to_f32(t, g[i]);
    else
        for (size_t i = 0; i < k->n_elems; i++) acc[i] += to_f32(t, g[i]);
    return ZO_OK;
}

static zo_status run_grad_job(struct zo_engine *e, const eng_job *j)
{
    eng_chunk *k = &e->chunks[j->chunk];
    zo_status cst = zo_event_query(k->computed);
    if (cst < 0) /* the caller's gradient work failed: these gradients are garbage */
        return ZO_FAIL(cst, ENG_SUBSYS, "the gradients of layer %d failed on the compute stream: %s",
                       k->layer, zo_last_error());
    int accum = e->cfg.grad_accum_steps > 1;
    if (accum) ZO_TRY(accumulate(e, k, j));
    if (!j->last) return ZO_OK;
    const void *g = accum ? (const void *)k->acc[j->parity] : k->g16[j->parity];
    zo_optim_dtype t = accum ? ZO_OPTIM_FP32 : e->cfg.param_dtype;
    ZO_TRY(zo_optim_pool_grad_stats(e->opool, g, t, k->n_elems, &k->gstats));
    return e->mode->grads_done ? e->mode->grads_done(e, (uint32_t)j->chunk, j) : ZO_OK;
}


void eng_set_async_error(struct zo_engine *e, zo_status st)
{
    pthread_mutex_lock(&e->mu);
    if (e->async_st >= 0 && st < 0) {
        e->async_st = st;
        snprintf(e->async_msg, sizeof e->async_msg, "%s", zo_last_error());
    }
    pthread_mutex_unlock(&e->mu);
}

zo_status eng_take_async_error(struct zo_engine *e)
{
    pthread_mutex_lock(&e->mu);
    zo_status st = e->async_st;
    e->async_st = ZO_OK;
    e->async_msg[0] = 0;
    pthread_mutex_unlock(&e->mu);
    return st;
}

/* Wait (under e->mu) for the job's gradients to land; 1 when they never will:
 * the d2h stream went idle without running the job's arrival task. */
static int wait_arrival(struct zo_engine *e, eng_job *j)
{
    while (!j->arrived) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&e->cv, &e->mu, &ts);
        if (!j->arrived && zo_stream_query(e->d2h) == ZO_OK) return 1;
    }
    return 0;
}

static const char *job_name(const struct zo_engine *e, const eng_job *j)
{
    return j->last ? e->mode->job_name : "accumulate gradients";
}

static void *thread_main(void *arg)
{
    struct zo_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->qhead && !e->stop) pthread_cond_wait(&e->cv, &e->mu);
        eng_job *j = e->qhead;
        if (!j) break;
        e->qhead = j->next;
        if (!e->qhead) e->qtail = NULL;
        e->running = 1;
        int lost = wait_arrival(e, j);
        int skip = e->async_st < 0; /* the step is being abandoned */
        pthread_mutex_unlock(&e->mu);
        zo_status st = ZO_OK;
        if (lost && !skip)
            st = ZO_FAIL(ZO_ERR_INTERNAL, ENG_SUBSYS,
                         "the device-to-host copy of layer %d's gradients never signalled its end (a "
                         "task on the copy stream failed)",
                         e->chunks[j->chunk].layer);
        else if (!skip) {
            uint64_t t0 = zo_now_ns();
            zo_nvtx_push(job_name(e, j));
            st = run_grad_job(e, j);
            zo_nvtx_pop();
            uint64_t t1 = zo_now_ns();
            atomic_fetch_add(&e->optim_ns, t1 - t0);
            eng_trace(e, ZO_TRACK_HOST_JOBS, 0, job_name(e, j), t0, t1, j->chunk, 0);
        }
        if (st < 0) eng_set_async_error(e, st);
        pthread_mutex_lock(&e->mu);
        e->chunks[j->chunk].jobs_done++;
        e->running = 0;
        free(j);
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

zo_status eng_thread_start(struct zo_engine *e)
{
    int rc = pthread_create(&e->thread, NULL, thread_main, e);
    if (rc != 0) return ZO_FAIL(ZO_ERR_SYSTEM, ENG_SUBSYS, "starting the engine's optimizer thread: error %d", rc);
    e->thread_started = 1;
    return ZO_OK;
}

void eng_thread_stop(struct zo_engine *e)
{
    if (!e->thread_started) return;
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    e->thread_started = 0;
    e->stop = 0;
}

eng_job *eng_job_new(const eng_job *tmpl)
{
    eng_job *j = malloc(sizeof *j);
    if (!j) return NULL;
    *j = *tmpl;
    j->next = NULL;
    return j;
}

void eng_job_push(struct zo_engine *e, eng_job *j)
{
    pthread_mutex_lock(&e->mu);
    e->chunks[j->chunk].jobs_queued++;
    if (e->qtail)
        e->qtail->next = j;
    else
        e->qhead = j;
    e->qtail = j;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

zo_status eng_arrival_fn(void *arg)
{
    struct {
        struct zo_engine *e;
        eng_job *j;
    } *a = arg;
    struct zo_engine *e = a->e;
    pthread_mutex_lock(&e->mu);
    a->j->arrived = 1; /* the job is freed only after this, by the thread that waits for it */
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return ZO_OK;
}

/* Wait until every queued host job has run; returns the first failure. */
zo_status eng_wait_idle(struct zo_engine *e)
{
    pthread_mutex_lock(&e->mu);
    while (e->qhead || e->running) pthread_cond_wait(&e->cv, &e->mu);
    zo_status st = e->async_st;
    char why[512];
    snprintf(why, sizeof why, "%s", e->async_msg);
    pthread_mutex_unlock(&e->mu);
    if (st < 0) return ZO_FAIL(st, ENG_SUBSYS, "%s", why);
    return ZO_OK;
}

/* Wait until chunk c's host jobs have run (its host gradient buffer is free). */
void eng_wait_chunk_jobs(struct zo_engine *e, uint32_t c)
{
    pthread_mutex_lock(&e->mu);
    while (e->chunks[c].jobs_done < e->chunks[c].jobs_queued) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
}
