/* The dpu mode: the delayed parameter update of ZeRO-Offload. The update of
 * a step's gradients runs on a thread of its own while the next step
 * computes on the parameters of the step before (one step stale); it is
 * committed and published when that next step ends. Under ZeRO the owners
 * broadcast their updated chunks from that thread too, on a communicator of
 * its own, and the reduced gradients are kept by step parity. */
#include <stdio.h>

#include "engine_internal.h"
#include "zo/nvtx.h"

static void *dpu_main(void *arg)
{
    struct zo_engine *e = arg;
    uint64_t t0 = zo_now_ns();
    zo_nvtx_push("delayed update");
    e->dpu.st = eng_update_all(e, e->dpu.lr, e->dpu.factor, e->dpu.step, e->dpu.parity);
    e->dpu.st = eng_reduce_share(e, e->dpu.st); /* the owners' updates, committed with them */
    if (e->dpu.st < 0)
        snprintf(e->dpu.msg, sizeof e->dpu.msg, "%s", zo_last_error());
    zo_nvtx_pop();
    uint64_t t1 = zo_now_ns();
    atomic_fetch_add(&e->stats.optim_ns, t1 - t0);
    eng_trace(e, ZO_TRACK_UPDATE, 0, "delayed update", t0, t1, -1, 0);
    return NULL;
}

static zo_status dpu_launch(struct zo_engine *e, float lr, float factor, int64_t step, int parity)
{
    e->dpu.lr = lr;
    e->dpu.factor = factor;
    e->dpu.step = step;
    e->dpu.parity = parity;
    e->dpu.st = ZO_OK;
    eng_stats_launch(e); /* what the thread moves counts in the next step */
    int rc = pthread_create(&e->dpu.thread, NULL, dpu_main, e);
    if (rc != 0)
        return ZO_FAIL(ZO_ERR_SYSTEM, ENG_SUBSYS, "starting the delayed update's thread: error %d",
                       rc);
    e->dpu.running = 1;
    return ZO_OK;
}

/* Wait for the delayed update; when it failed, it is dropped (its new
 * states were never committed) and its failure returned. */
zo_status eng_dpu_join(struct zo_engine *e)
{
    if (!e->dpu.running)
        return ZO_OK;
    pthread_join(e->dpu.thread, NULL);
    e->dpu.running = 0;
    if (e->dpu.st >= 0)
        return ZO_OK;
    e->dpu.pending = 0;
    eng_discard_uncommitted(e);
    return ZO_FAIL(e->dpu.st, ENG_SUBSYS,
                   "the delayed update of the previous step failed (dropped): %s", e->dpu.msg);
}

zo_status eng_dpu_commit_pending(struct zo_engine *e)
{
    if (!e->dpu.pending)
        return ZO_OK;
    eng_commit(e, !e->dpu.skip);
    if (!e->dpu.skip)
        e->step.opt_step++;
    e->dpu.pending = 0;
    return eng_publish(e, !e->dpu.skip);
}

static zo_status launch(struct zo_engine *e, const eng_verdict *v)
{
    e->dpu.pending = 1;
    e->dpu.skip = v->overflow;
    if (v->overflow)
        return ZO_OK;
    zo_status st =
        dpu_launch(e, e->step.lr, v->factor, e->step.opt_step + 1, (int)(e->step.steps & 1));
    if (st < 0)
        e->dpu.pending = 0;
    return st;
}

/* The last step's update becomes current, this step's starts. */
static zo_status end_step(struct zo_engine *e, const eng_verdict *v, int *rollbacks,
                          const zo_loss_scaler *saved)
{
    *rollbacks = 0;
    ZO_TRY(eng_dpu_commit_pending(e));
    zo_status st = launch(e, v);
    if (st < 0)
        e->scaler = *saved;
    return st;
}

static void abort_step(struct zo_engine *e)
{
    (void)e;
}

const eng_mode_ops eng_mode_dpu = {
    .name = "dpu",
    .grad_bufs = 2,
    .p16_behind = 1,
    .backups = 0,
    .job_name = "gradient norm",
    .speculates = 0,
    .end_step = end_step,
    .settle = eng_dpu_join,
    .abort = abort_step,
};
