/* The optimizer side of the engine: a host job thread that takes each
 * chunk's gradients once their D2H lands (fp32 accumulation, gradient
 * statistics, the speculative update when the mode speculates), and the update of all chunks
 * (each tier updates the chunks homed there; engine_tier.c commits or discards it). The modes
 * themselves are in engine_sync.c, engine_overlap.c and engine_dpu.c. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine_tier.h"
#include "zo/half.h"
#include "zo/nvtx.h"

/* ---- helpers over one chunk ---- */

/* ---- the update of every chunk ---- */

/* Each tier updates the chunks homed there, tier by tier: first the tiers
 * that store the update beside the committed states, last those that update
 * in place, so that a failure (an NVMe write) leaves every chunk as it was. */
zo_status eng_update_all(struct zo_engine *e, float lr, float factor, int64_t step, int parity)
{
    return eng_update_all_landing(e, lr, factor, step, parity, NULL);
}

zo_status eng_update_all_landing(struct zo_engine *e, float lr, float factor, int64_t step,
                                 int parity, void (*landed)(struct zo_engine *e, uint32_t c))
{
    eng_update_args u = {lr, factor, step, parity, landed};
    uint32_t *list = malloc((e->n_chunks ? e->n_chunks : 1) * sizeof *list);
    if (!list)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "allocating a chunk list");
    zo_status st = ZO_OK;
    for (int pass = 0; pass < 2; pass++)
        for (int t = 0; st == ZO_OK && t < eng_n_tiers; t++) {
            const eng_state_tier *tier = eng_state_tiers[t];
            if (tier->in_place != pass)
                continue;
            uint32_t n = 0;
            for (uint32_t c = 0; c < e->n_chunks; c++)
                if (e->chunks[c].st == tier)
                    list[n++] = c;
            if (n)
                st = tier->update(eng_tier_self(e, t), e, list, n, &u);
        }
    free(list);
    return st;
}

/* The update of every chunk at the end of the step, timed and traced. */
zo_status eng_update_now(struct zo_engine *e, const eng_verdict *v, int *rollbacks,
                         const zo_loss_scaler *saved,
                         zo_status (*apply)(struct zo_engine *, const eng_verdict *, int *),
                         const char *(*name)(const struct zo_engine *, const eng_verdict *, int))
{
    uint64_t t0 = zo_now_ns();
    zo_nvtx_push("optimizer update");
    zo_status st = apply(e, v, rollbacks);
    zo_nvtx_pop();
    uint64_t t1 = zo_now_ns();
    atomic_fetch_add(&e->stats.optim_ns, t1 - t0);
    eng_trace(e, ZO_TRACK_UPDATE, 0, name(e, v, *rollbacks), t0, t1, -1, 0);
    if (st < 0) {
        e->scaler = *saved; /* not committed: the step never happened */
        return st;
    }
    eng_commit(e, !v->overflow);
    if (!v->overflow)
        e->step.opt_step++;
    return eng_publish(e, !v->overflow);
}

/* ---- the host job thread ---- */

static zo_status accumulate(struct zo_engine *e, eng_chunk *k, const eng_job *j)
{
    float *acc = k->acc[j->parity];
    eng_widen_params(e->cfg.param_dtype, k->g16[j->parity], j->micro == 1 ? NULL : acc, acc,
                     k->n_elems);
    return ZO_OK;
}

/* Whether this step's chunks are updated ahead of the verdict: in a mode that
 * speculates, unless the last step clipped. A run that clips at every step
 * (a max norm below its gradients' norm, common early in fine-tuning) would
 * otherwise read, update and write every chunk's states twice per step, the
 * second time after a rollback: for NVMe states that doubles the step's I/O.
 * Either way the results are sync mode's bits. */
int eng_speculates_now(const struct zo_engine *e)
{
    return e->mode->speculates && !e->step.spec_paused;
}

/* The chunk of the next queued job that will update in the same tier as
 * chunk c, or -1: the tier may read its states ahead. */
static int next_spec_chunk(struct zo_engine *e, uint32_t c)
{
    int next = -1;
    pthread_mutex_lock(&e->jobs.mu);
    for (eng_job *j = e->jobs.qhead; j; j = j->next)
        if (j->last && e->chunks[j->chunk].st == e->chunks[c].st) {
            next = j->chunk;
            break;
        }
    pthread_mutex_unlock(&e->jobs.mu);
    return next;
}

/* Update chunk c ahead of the verdict, through its states' tier. */
static zo_status speculate(struct zo_engine *e, uint32_t c, const eng_job *j)
{
    eng_chunk *k = &e->chunks[c];
    ZO_TRY(k->st->speculate(k->sctx, e, c, j, next_spec_chunk(e, c)));
    e->chunks[c].spec_done = 1;
    return ZO_OK;
}

static zo_status run_grad_job(struct zo_engine *e, const eng_job *j)
{
    eng_chunk *k = &e->chunks[j->chunk];
    zo_status cst = zo_event_query(k->computed);
    if (cst < 0) /* the caller's gradient work failed: these gradients are garbage */
        return ZO_FAIL(cst, ENG_SUBSYS,
                       "the gradients of layer %d failed on the compute stream: %s", k->layer,
                       zo_last_error());
    int accum = e->cfg.grad_accum_steps > 1;
    if (eng_host_accumulates(&e->cfg)) /* grouped: the device summed them */
        ZO_TRY(accumulate(e, k, j));
    int taken; /* reduced to the owner now: the copy here is then free */
    ZO_TRY(eng_reduce_hand_over(e, (uint32_t)j->chunk, j, &taken));
    if (!j->last)
        return eng_grads_done(e, j);
    if (taken) {
        if (eng_speculates_now(e) && k->owner == e->cfg.rank) /* on the reduced gradient */
            ZO_TRY(speculate(e, (uint32_t)j->chunk, j));
        return eng_grads_done(e, j);
    }
    const void *g = accum ? (const void *)k->acc[j->parity] : k->g16[j->parity];
    zo_dtype t = accum ? ZO_DTYPE_F32 : e->cfg.param_dtype;
    ZO_TRY(zo_optim_pool_grad_stats(e->opool, g, t, k->n_elems, &k->gstats));
    if (eng_speculates_now(e))
        ZO_TRY(speculate(e, (uint32_t)j->chunk, j));
    return eng_grads_done(e, j); /* kept or spilled for the update, the ring slot freed */
}

void eng_set_async_error(struct zo_engine *e, zo_status st)
{
    pthread_mutex_lock(&e->jobs.mu);
    if (e->jobs.async_st >= 0 && st < 0) {
        e->jobs.async_st = st;
        snprintf(e->jobs.async_msg, sizeof e->jobs.async_msg, "%s", zo_last_error());
    }
    pthread_mutex_unlock(&e->jobs.mu);
}

zo_status eng_take_async_error(struct zo_engine *e)
{
    pthread_mutex_lock(&e->jobs.mu);
    zo_status st = e->jobs.async_st;
    e->jobs.async_st = ZO_OK;
    e->jobs.async_msg[0] = 0;
    pthread_mutex_unlock(&e->jobs.mu);
    return st;
}

/* Wait (under e->jobs.mu) for the job's gradients to land; 1 when they never will:
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
        pthread_cond_timedwait(&e->jobs.cv, &e->jobs.mu, &ts);
        if (!j->arrived && zo_stream_query(e->d2h) == ZO_OK)
            return 1;
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
    pthread_mutex_lock(&e->jobs.mu);
    for (;;) {
        while (!e->jobs.qhead && !e->jobs.stop)
            pthread_cond_wait(&e->jobs.cv, &e->jobs.mu);
        eng_job *j = e->jobs.qhead;
        if (!j)
            break;
        e->jobs.qhead = j->next;
        if (!e->jobs.qhead)
            e->jobs.qtail = NULL;
        e->jobs.running = 1;
        int lost = wait_arrival(e, j);
        int skip = e->jobs.async_st < 0; /* the step is being abandoned */
        pthread_mutex_unlock(&e->jobs.mu);
        zo_status st = ZO_OK;
        if (lost && !skip)
            st = ZO_FAIL(
                ZO_ERR_INTERNAL, ENG_SUBSYS,
                "the device-to-host copy of layer %d's gradients never signalled its end (a "
                "task on the copy stream failed)",
                e->chunks[j->chunk].layer);
        else if (!skip) {
            uint64_t t0 = zo_now_ns();
            zo_nvtx_push(job_name(e, j));
            st = run_grad_job(e, j);
            zo_nvtx_pop();
            uint64_t t1 = zo_now_ns();
            atomic_fetch_add(&e->stats.optim_ns, t1 - t0);
            eng_trace(e, ZO_TRACK_HOST_JOBS, 0, job_name(e, j), t0, t1, j->chunk, 0);
        }
        if (st < 0)
            eng_set_async_error(e, st);
        pthread_mutex_lock(&e->jobs.mu);
        e->chunks[j->chunk].jobs_done++;
        e->jobs.running = 0;
        free(j);
        pthread_cond_broadcast(&e->jobs.cv);
    }
    pthread_mutex_unlock(&e->jobs.mu);
    return NULL;
}

zo_status eng_thread_start(struct zo_engine *e)
{
    int rc = pthread_create(&e->jobs.thread, NULL, thread_main, e);
    if (rc != 0)
        return ZO_FAIL(ZO_ERR_SYSTEM, ENG_SUBSYS,
                       "starting the engine's optimizer thread: error %d", rc);
    e->jobs.started = 1;
    return ZO_OK;
}

void eng_thread_stop(struct zo_engine *e)
{
    if (!e->jobs.started)
        return;
    pthread_mutex_lock(&e->jobs.mu);
    e->jobs.stop = 1;
    pthread_cond_broadcast(&e->jobs.cv);
    pthread_mutex_unlock(&e->jobs.mu);
    pthread_join(e->jobs.thread, NULL);
    e->jobs.started = 0;
    e->jobs.stop = 0;
}

eng_job *eng_job_new(const eng_job *tmpl)
{
    eng_job *j = malloc(sizeof *j);
    if (!j)
        return NULL;
    *j = *tmpl;
    j->next = NULL;
    return j;
}

void eng_job_push(struct zo_engine *e, eng_job *j)
{
    pthread_mutex_lock(&e->jobs.mu);
    e->chunks[j->chunk].jobs_queued++;
    if (e->jobs.qtail)
        e->jobs.qtail->next = j;
    else
        e->jobs.qhead = j;
    e->jobs.qtail = j;
    pthread_cond_broadcast(&e->jobs.cv);
    pthread_mutex_unlock(&e->jobs.mu);
}

zo_status eng_arrival_fn(void *arg)
{
    struct {
        struct zo_engine *e;
        eng_job *j;
    } *a = arg;
    struct zo_engine *e = a->e;
    pthread_mutex_lock(&e->jobs.mu);
    a->j->arrived = 1; /* the job is freed only after this, by the thread that waits for it */
    pthread_cond_broadcast(&e->jobs.cv);
    pthread_mutex_unlock(&e->jobs.mu);
    return ZO_OK;
}

/* Wait until every queued host job has run; returns the first failure. */
zo_status eng_wait_idle(struct zo_engine *e)
{
    pthread_mutex_lock(&e->jobs.mu);
    while (e->jobs.qhead || e->jobs.running)
        pthread_cond_wait(&e->jobs.cv, &e->jobs.mu);
    zo_status st = e->jobs.async_st;
    char why[512];
    snprintf(why, sizeof why, "%s", e->jobs.async_msg);
    pthread_mutex_unlock(&e->jobs.mu);
    if (st < 0)
        return ZO_FAIL(st, ENG_SUBSYS, "%s", why);
    return ZO_OK;
}

/* Wait until chunk c's host jobs have run (its host gradient buffer is free). */
void eng_wait_chunk_jobs(struct zo_engine *e, uint32_t c)
{
    pthread_mutex_lock(&e->jobs.mu);
    while (e->chunks[c].jobs_done < e->chunks[c].jobs_queued)
        pthread_cond_wait(&e->jobs.cv, &e->jobs.mu);
    pthread_mutex_unlock(&e->jobs.mu);
}

/* The host job on chunk c's gradients of its latest micro-batch (or group),
 * queued behind the D2H already enqueued on the d2h stream: its arrival task
 * is enqueued before the job is queued, so a job whose d2h stream is idle and
 * which has not arrived was lost by a failed task. */
zo_status eng_queue_grads_job(struct zo_engine *e, uint32_t c, int parity)
{
    const eng_chunk *k = &e->chunks[c];
    eng_job tmpl = {0};
    tmpl.chunk = (int)c;
    tmpl.micro = k->n_ready;
    tmpl.last = k->n_ready == e->cfg.grad_accum_steps;
    tmpl.parity = parity;
    tmpl.lr = e->step.lr;
    tmpl.factor = zo_grad_scale_factor(0.0, (float)eng_loss_scale(e), 0.0f);
    tmpl.step = e->step.opt_step + 1;
    eng_job *job = eng_job_new(&tmpl);
    if (!job)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "allocating a host job");
    struct {
        struct zo_engine *e;
        eng_job *j;
    } arg = {e, job};
    zo_status st = zo_stream_enqueue(e->d2h, eng_arrival_fn, &arg, sizeof arg);
    if (st < 0) {
        free(job);
        return st;
    }
    eng_job_push(e, job);
    return ZO_OK;
}
