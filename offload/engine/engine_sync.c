/* The sync mode, the reference: the update of every chunk after the whole
 * backward, once the gradient norm and the overflow check are known; in
 * end_step, or behind the next forward where the config asks and the homes
 * allow it (engine_behind.c), with the same bits. */
#include "engine_internal.h"

static zo_status apply(struct zo_engine *e, const eng_verdict *v, int *rollbacks)
{
    *rollbacks = 0;
    if (v->overflow)
        return ZO_OK;
    zo_status st =
        eng_update_all(e, e->step.lr, v->factor, e->step.opt_step + 1, eng_step_parity(e));
    return eng_reduce_share(e, st); /* the owners' updates */
}

static const char *update_name(const struct zo_engine *e, const eng_verdict *v, int rollbacks)
{
    (void)e;
    (void)rollbacks;
    return v->overflow ? "skip update (overflow)" : "update";
}

static zo_status end_step(struct zo_engine *e, const eng_verdict *v, int *rollbacks,
                          const zo_loss_scaler *saved)
{
    if (v->overflow || !eng_behind_takes(e))
        return eng_update_now(e, v, rollbacks, saved, apply, update_name);
    *rollbacks = 0;
    return eng_behind_launch(e, e->step.lr, v->factor, e->step.opt_step + 1, eng_step_parity(e));
}

/* A failed update behind the forward is dropped whole and said here. */
static zo_status settle(struct zo_engine *e)
{
    return eng_behind_join(e);
}

static void abort_step(struct zo_engine *e)
{
    (void)e;
}

const eng_mode_ops eng_mode_sync = {
    .name = "sync",
    .grad_bufs = 1,
    .p16_behind = 0,
    .backups = 0,
    .job_name = "gradient norm",
    .speculates = 0,
    .end_step = end_step,
    .settle = settle,
    .abort = abort_step,
};
