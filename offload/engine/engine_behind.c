/* The update behind the next forward (cfg.update_behind): sync mode's
 * every update, overlap mode's after its verdict (it clipped, or the last
 * one did). Each would otherwise read, update and write every chunk's NVMe
 * states inside end_step while nothing computes. Here the update runs on a thread of its
 * own, chunk after chunk in the order the forward fetches them, and each
 * fetch of the next step waits only for its own chunks to land; until the
 * update is joined and committed, loads read the alternate extents it wrote
 * (eng_behind_latest). The join comes with the backward's first fetch, or
 * any call that reads the states, and commits the whole update at once, so
 * a failure anywhere drops all of it: the committed states are those before
 * it, and every slot loaded from it is reloaded. The step that saw the
 * failure fails; the dropped update runs again, in place, before that step
 * is run again (or the states are read), so that running again the step
 * that failed, as after any other failure, trains as if none had happened.
 * Results are bitwise those of the update in end_step. */
#include <stdio.h>
#include <stdlib.h>

#include "engine_tier.h"
#include "zo/nvtx.h"

/* Its new values land beside the committed ones, so that a failed update
 * can be dropped whole: NVMe states' alternate extents, and the 16-bit
 * parameters' too, or the host copy the next commit switches to (two, since
 * NVMe states write them behind the fetches). Device copies are written in
 * place, and a publish reloads them at once. */
static int chunk_goes_behind(const eng_chunk *k)
{
    if (k->st != &eng_state_tier_nvme)
        return 0;
    return k->pt == &eng_param_tier_nvme || k->pt == &eng_param_tier_device_nvme ||
           (k->pt == &eng_param_tier_host && k->p16_bufs == 2);
}

int eng_behind_takes(const struct zo_engine *e)
{
    const zo_engine_config *c = &e->cfg;
    if (!c->update_behind || eng_zero_on(c) || eng_pipe_on(c) || c->param_dtype == ZO_DTYPE_F16)
        return 0;
    for (uint32_t i = 0; i < e->n_chunks; i++)
        if (!chunk_goes_behind(&e->chunks[i]))
            return 0;
    return e->n_chunks > 0;
}

/* The NVMe tier's word that chunk c's alternate extents are written. */
static void chunk_landed(struct zo_engine *e, uint32_t c)
{
    pthread_mutex_lock(&e->dpu.mu);
    atomic_store_explicit(&e->dpu.landed[c], 1, memory_order_release);
    pthread_cond_broadcast(&e->dpu.cv);
    pthread_mutex_unlock(&e->dpu.mu);
}

static void *behind_main(void *arg)
{
    struct zo_engine *e = arg;
    uint64_t t0 = zo_now_ns();
    zo_nvtx_push("update behind the next forward");
    zo_status st = eng_update_all_landing(e, e->dpu.lr, e->dpu.factor, e->dpu.step, e->dpu.parity,
                                          chunk_landed);
    zo_nvtx_pop();
    uint64_t t1 = zo_now_ns();
    atomic_fetch_add(&e->stats.optim_ns, t1 - t0);
    eng_trace(e, ZO_TRACK_UPDATE, 0, "update behind the next forward", t0, t1, -1, 0);
    pthread_mutex_lock(&e->dpu.mu);
    e->dpu.st = st;
    if (st < 0)
        snprintf(e->dpu.msg, sizeof e->dpu.msg, "%s", zo_last_error());
    e->dpu.finished = 1;
    pthread_cond_broadcast(&e->dpu.cv);
    pthread_mutex_unlock(&e->dpu.mu);
    return NULL;
}

static void forget_landed(struct zo_engine *e)
{
    pthread_cond_destroy(&e->dpu.cv);
    pthread_mutex_destroy(&e->dpu.mu);
    free(e->dpu.landed);
    e->dpu.landed = NULL;
}

zo_status eng_behind_launch(struct zo_engine *e, float lr, float factor, int64_t step, int parity)
{
    e->dpu.landed = calloc(e->n_chunks, sizeof *e->dpu.landed);
    if (!e->dpu.landed)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "allocating the update's landing flags");
    pthread_mutex_init(&e->dpu.mu, NULL);
    pthread_cond_init(&e->dpu.cv, NULL);
    e->dpu.lr = lr;
    e->dpu.factor = factor;
    e->dpu.step = step;
    e->dpu.parity = parity;
    e->dpu.st = ZO_OK;
    e->dpu.finished = 0;
    eng_stats_launch(e); /* what the thread moves counts in the next step */
    int rc = pthread_create(&e->dpu.thread, NULL, behind_main, e);
    if (rc != 0) {
        forget_landed(e);
        return ZO_FAIL(ZO_ERR_SYSTEM, ENG_SUBSYS,
                       "starting the thread of the update behind the next forward: error %d", rc);
    }
    e->dpu.behind = 1;
    e->step.opt_step++;
    /* the slots hold the old values: dropped, or reloaded at their next
     * fetch, which waits for the new ones to land first */
    return eng_publish(e, 1);
}

zo_status eng_behind_wait(struct zo_engine *e, uint32_t c, zo_stream_t compute)
{
    if (!eng_behind_pending(e, c))
        return ZO_OK;
    ZO_TRY(eng_stall_mark(e, compute, c, 0));
    pthread_mutex_lock(&e->dpu.mu);
    while (!atomic_load_explicit(&e->dpu.landed[c], memory_order_acquire) && !e->dpu.finished)
        pthread_cond_wait(&e->dpu.cv, &e->dpu.mu);
    int landed = atomic_load_explicit(&e->dpu.landed[c], memory_order_acquire);
    pthread_mutex_unlock(&e->dpu.mu);
    zo_status st = eng_stall_mark(e, compute, c, 1);
    if (!landed) /* it ended without it: it failed */
        return eng_behind_join(e);
    return st;
}

/* Every slot that may hold values of the dropped update is reloaded from
 * the committed ones at its next fetch. */
static void reload_slots(struct zo_engine *e)
{
    for (uint32_t c = 0; c < e->n_chunks; c++)
        if (e->chunks[c].slot >= 0)
            e->chunks[c].reload = ENG_RELOAD_HOME;
}

zo_status eng_behind_join(struct zo_engine *e)
{
    if (!e->dpu.behind)
        return ZO_OK;
    pthread_join(e->dpu.thread, NULL);
    e->dpu.behind = 0;
    forget_landed(e);
    if (e->dpu.st >= 0) {
        eng_commit(e, 1);
        return ZO_OK;
    }
    eng_discard_uncommitted(e);
    reload_slots(e);
    e->step.opt_step--;
    e->dpu.redo = 1;
    return ZO_FAIL(e->dpu.st, ENG_SUBSYS,
                   "the update of optimizer step %lld, run behind the next forward, failed and "
                   "was dropped (the weights are those before it; it runs again before the next "
                   "step): %s",
                   (long long)e->dpu.step, e->dpu.msg);
}

zo_status eng_behind_redo(struct zo_engine *e)
{
    if (!e->dpu.redo)
        return ZO_OK;
    uint64_t t0 = zo_now_ns();
    zo_status st = eng_update_all(e, e->dpu.lr, e->dpu.factor, e->dpu.step, e->dpu.parity);
    uint64_t t1 = zo_now_ns();
    atomic_fetch_add(&e->stats.optim_ns, t1 - t0);
    eng_trace(e, ZO_TRACK_UPDATE, 0, "update run again", t0, t1, -1, 0);
    if (st < 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", zo_last_error());
        eng_discard_uncommitted(e);
        reload_slots(e);
        return ZO_FAIL(st, ENG_SUBSYS,
                       "running again the dropped update of optimizer step %lld failed (the "
                       "weights are those before it; it is tried again at the next call): %s",
                       (long long)e->dpu.step, why);
    }
    e->dpu.redo = 0;
    eng_commit(e, 1);
    e->step.opt_step++;
    return eng_publish(e, 1);
}
