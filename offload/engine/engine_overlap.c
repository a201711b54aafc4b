/* The overlap mode: each chunk is updated speculatively as soon as its final
 * gradients reach the host (through its states' tier: resident states are
 * backed up first, NVMe states are written beside the committed ones), and at
 * the end of the step the speculation is validated: when clipping or an
 * overflow makes it wrong it is rolled back and the update redone. A step
 * after one that clipped does not speculate (the next one likely clips too):
 * it updates after the verdict, as sync mode does. Results equal sync mode's. */
#include "engine_tier.h"

/* Wait for what the tiers' speculative updates left in flight; the first
 * failed write. */
zo_status eng_spec_drain(struct zo_engine *e)
{
    zo_status st = ZO_OK;
    for (int t = 0; t < eng_n_tiers; t++) {
        zo_status w = eng_state_tiers[t]->drain(eng_tier_self(e, t), e);
        if (st == ZO_OK && w < 0)
            st = w;
    }
    return st;
}

void eng_restore_backups(struct zo_engine *e)
{
    for (uint32_t c = 0; c < e->n_chunks; c++)
        e->chunks[c].st->rollback(e->chunks[c].sctx, e, c);
}

/* Whether the speculative update of the step stands: it ran and the verdict
 * neither clipped nor overflowed. */
static int speculation_right(const struct zo_engine *e, const eng_verdict *v)
{
    return !e->step.spec_paused && !v->overflow && v->factor == v->plain;
}

/* Undo what the speculation did (the chunks it updated counted in *rollbacks). */
static void undo_speculation(struct zo_engine *e, int *rollbacks)
{
    *rollbacks = 0;
    for (uint32_t c = 0; c < e->n_chunks; c++)
        *rollbacks += e->chunks[c].spec_done;
    eng_restore_backups(e);
    eng_discard_uncommitted(e);
}

/* Keep the speculation when it was right, else roll back and update anew. */
static zo_status validate(struct zo_engine *e, const eng_verdict *v, int *rollbacks)
{
    *rollbacks = 0;
    if (speculation_right(e, v))
        return ZO_OK;
    undo_speculation(e, rollbacks);
    if (v->overflow)
        return ZO_OK;
    return eng_update_all(e, e->step.lr, v->factor, e->step.opt_step + 1, eng_step_parity(e));
}

/* ZeRO: the owners' updated chunks to the others (stages 1 and 2; at stage 3
 * the partitioned ones are gathered at their next use), before the commit. */
static zo_status validate_and_share(struct zo_engine *e, const eng_verdict *v, int *rollbacks)
{
    zo_status st = validate(e, v, rollbacks);
    return !v->overflow ? eng_reduce_share(e, st) : st;
}

static const char *update_name(const struct zo_engine *e, const eng_verdict *v, int rollbacks)
{
    if (rollbacks)
        return "rollback and update";
    if (e->step.spec_paused)
        return v->overflow ? "skip update (overflow)"
                           : "update (not speculated: the last step clipped)";
    return "validate speculative update";
}

/* The update after the verdict, behind the next forward (engine_behind.c):
 * what the speculation left is undone here, the update runs on its thread. */
static zo_status update_behind(struct zo_engine *e, const eng_verdict *v, int *rollbacks)
{
    undo_speculation(e, rollbacks);
    return eng_behind_launch(e, e->step.lr, v->factor, e->step.opt_step + 1, eng_step_parity(e));
}

/* Whether the step updates after its verdict, and can do it behind the next forward. */
static int goes_behind(const struct zo_engine *e, const eng_verdict *v)
{
    if (v->overflow || speculation_right(e, v))
        return 0; /* no update, or the speculation was right */
    return eng_behind_takes(e);
}

static zo_status end_step(struct zo_engine *e, const eng_verdict *v, int *rollbacks,
                          const zo_loss_scaler *saved)
{
    zo_status st = goes_behind(e, v)
                       ? update_behind(e, v, rollbacks)
                       : eng_update_now(e, v, rollbacks, saved, validate_and_share, update_name);
    if (!v->overflow) /* an overflow says nothing of the next step's norm */
        e->step.spec_paused = v->factor != v->plain;
    return st;
}

static zo_status settle(struct zo_engine *e)
{
    zo_status st = eng_behind_join(e);
    zo_status d = eng_spec_drain(e);
    return st < 0 ? st : d;
}

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
    .speculates = 1,
    .end_step = end_step,
    .settle = settle,
    .abort = abort_step,
};
