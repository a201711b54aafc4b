/* The tier tables' registry (by zo_tier: the built-in tiers and those
 * registered later, each with its context), their check, the flags a plan
 * asks of them across kinds, the tiers' names (zo/engine.h), and the commit
 * or discard of a step's update through every chunk's tiers (the update and
 * ZeRO's broadcast, above, end a step with them). Above the tier files
 * (engine_tier_*.c). */
#include "engine_tier.h"

const char *zo_tier_name(zo_tier t)
{
    return (unsigned)t < (unsigned)eng_n_tiers ? eng_state_tiers[t]->name : "?";
}

int eng_n_tiers = ZO_TIER_COUNT;
static void *tier_ctx[ZO_TIER_MAX];

const eng_param_tier *eng_param_tiers[ZO_TIER_MAX] = {
    [ZO_TIER_DEVICE] = &eng_param_tier_device,
    [ZO_TIER_HOST] = &eng_param_tier_host,
    [ZO_TIER_NVME] = &eng_param_tier_nvme,
};

const eng_state_tier *eng_state_tiers[ZO_TIER_MAX] = {
    [ZO_TIER_DEVICE] = &eng_state_tier_device,
    [ZO_TIER_HOST] = &eng_state_tier_host,
    [ZO_TIER_NVME] = &eng_state_tier_nvme,
};

static zo_status bad_table(const char *kind, int t, const char *name, const char *why)
{
    return ZO_FAIL(ZO_ERR_INTERNAL, ENG_SUBSYS, "the %s tier table at %d (%s): %s", kind, t,
                   name ? name : "?", why);
}

static zo_status check_param_tier(int t, const eng_param_tier *p)
{
    if (!p || p->version != ENG_TIER_OPS_VERSION || (int)p->tier != t)
        return bad_table("parameter", t, p ? p->name : NULL,
                         "missing, of another version, or misfiled");
    if (!p->account || !p->place || !p->release || !p->write || !p->source || !p->update_out ||
        !p->commit)
        return bad_table("parameter", t, p->name, "an operation is missing");
    return ZO_OK;
}

static zo_status check_state_tier(int t, const eng_state_tier *s)
{
    if (!s || s->version != ENG_TIER_OPS_VERSION || (int)s->tier != t)
        return bad_table("state", t, s ? s->name : NULL,
                         "missing, of another version, or misfiled");
    if (!s->account || !s->place || !s->release || !s->init_buf || !s->init || !s->update ||
        !s->speculate || !s->drain || !s->rollback || !s->discard || !s->commit || !s->read ||
        !s->write_begin || !s->write_end)
        return bad_table("state", t, s->name, "an operation is missing");
    return ZO_OK;
}

zo_status eng_tiers_check(void)
{
    for (int t = 0; t < eng_n_tiers; t++) {
        ZO_TRY(check_param_tier(t, eng_param_tiers[t]));
        ZO_TRY(check_state_tier(t, eng_state_tiers[t]));
    }
    return ZO_OK;
}

zo_status eng_tier_register(const eng_param_tier *p, const eng_state_tier *s, void *ctx, zo_tier *t)
{
    int next = eng_n_tiers;
    if (next >= ZO_TIER_MAX)
        return ZO_FAIL(ZO_ERR_UNSUPPORTED, ENG_SUBSYS,
                       "registering the %s tier: the registry holds ZO_TIER_MAX (%d) tiers",
                       s && s->name ? s->name : "?", ZO_TIER_MAX);
    ZO_TRY(check_param_tier(next, p));
    ZO_TRY(check_state_tier(next, s));
    if (!s->usage) /* its budget is in its context: only it can say */
        return bad_table("state", next, s->name, "an operation is missing (usage)");
    eng_param_tiers[next] = p;
    eng_state_tiers[next] = s;
    tier_ctx[next] = ctx;
    eng_n_tiers = next + 1;
    if (t)
        *t = (zo_tier)next;
    return ZO_OK;
}

void eng_tier_unregister_last(void)
{
    if (eng_n_tiers <= ZO_TIER_COUNT)
        return;
    eng_n_tiers--;
    eng_param_tiers[eng_n_tiers] = NULL;
    eng_state_tiers[eng_n_tiers] = NULL;
    tier_ctx[eng_n_tiers] = NULL;
}

void *eng_tier_ctx(zo_tier t)
{
    return (unsigned)t < (unsigned)eng_n_tiers ? tier_ctx[t] : NULL;
}

void *eng_tier_self(struct zo_engine *e, zo_tier t)
{
    switch (t) {
    case ZO_TIER_DEVICE: return &e->device;
    case ZO_TIER_HOST: return &e->host;
    case ZO_TIER_NVME: return &e->nvme;
    default: return eng_tier_ctx(t);
    }
}

void eng_tier_usage(zo_tier t, void *self, uint64_t *budget, uint64_t *peak)
{
    *budget = *peak = 0;
    if ((unsigned)t < (unsigned)eng_n_tiers && eng_state_tiers[t]->usage)
        eng_state_tiers[t]->usage(self, budget, peak);
}

void eng_plan_flags(eng_plan_in *in)
{
    for (int t = 0; t < eng_n_tiers; t++) {
        in->host_copies[t] = eng_param_tiers[t]->host_copies;
        in->p16_behind[t] = eng_state_tiers[t]->p16_behind;
    }
}

/* ---- commit and discard ---- */

/* Make the step's update the current state: flip NVMe extents and
 * double-buffered 16-bit parameters (not when the update was skipped: the
 * next buffers then hold nothing new). */
void eng_commit(struct zo_engine *e, int updated)
{
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        eng_chunk *k = &e->chunks[c];
        int stored = k->st->commit(k->sctx, e, c);
        k->pt->commit(k->pctx, e, c, updated, stored); /* written together with the states */
    }
}

/* Forget updates stored beside the committed states (which are intact). */
void eng_discard_uncommitted(struct zo_engine *e)
{
    for (uint32_t c = 0; c < e->n_chunks; c++)
        e->chunks[c].st->discard(e->chunks[c].sctx, e, c);
}
