/* The gradient path's reducers (eng_reducer_ops): the chain a configuration
 * turns on, the front end that walks it, and the local reducer. A chunk's
 * gradients meet the other ranks' through the chain in order (ZeRO's
 * reduction to the chunk's owner), and the step's verdict is formed by it
 * (ZeRO shares the owners' partials, then the pipeline sums every stage's, or
 * the local reducer this engine's chunks). The engine never asks which
 * reducers run: it calls the chain. */
#include "engine_internal.h"

/* One engine's verdict: its chunks' norm partials and overflow flags, summed
 * in chunk order (deterministic). */
static zo_status local_judge(struct zo_engine *e, eng_verdict *v)
{
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        v->sum_sq += e->chunks[c].gstats.sum_sq;
        v->overflow |= e->chunks[c].gstats.nonfinite;
    }
    return ZO_OK;
}

const eng_reducer_ops eng_reducer_local = {
    .name = "local",
    .version = ENG_REDUCER_OPS_VERSION,
    .judge = local_judge,
};

void eng_reducers_for(const zo_engine_config *c, eng_reducers *out)
{
    out->n = 0;
    if (eng_zero_on(c)) /* every rank then holds the same partials */
        out->ops[out->n++] = &eng_reducer_zero;
    /* the verdict: every stage's partials, or this engine's */
    out->ops[out->n++] = eng_pipe_on(c) ? &eng_reducer_pipe : &eng_reducer_local;
}

zo_status eng_reducers_check(const eng_reducers *r, const zo_engine_config *c)
{
    for (int i = 0; i < r->n; i++) {
        const eng_reducer_ops *o = r->ops[i];
        if (o->version != ENG_REDUCER_OPS_VERSION || !o->judge)
            return ZO_FAIL(ZO_ERR_INTERNAL, ENG_SUBSYS,
                           "reducer '%s' is of version %u without judge %s: version %u with a "
                           "judge is what the engine calls",
                           o->name, o->version, o->judge ? "(it has one)" : "(missing)",
                           ENG_REDUCER_OPS_VERSION);
        if (o->check)
            ZO_TRY(o->check(c));
    }
    return ZO_OK;
}

zo_status eng_reducers_place(struct zo_engine *e)
{
    for (int i = 0; i < e->reducers.n; i++)
        if (e->reducers.ops[i]->place)
            ZO_TRY(e->reducers.ops[i]->place(e));
    return ZO_OK;
}

void eng_reducers_release(struct zo_engine *e)
{
    for (int i = 0; i < e->reducers.n; i++)
        if (e->reducers.ops[i]->release)
            e->reducers.ops[i]->release(e);
}

zo_status eng_reduce_gather(struct zo_engine *e, int layer, int pos)
{
    for (int i = 0; i < e->reducers.n; i++)
        if (e->reducers.ops[i]->gather)
            ZO_TRY(e->reducers.ops[i]->gather(e, layer, pos));
    return ZO_OK;
}

void eng_reduce_forget(struct zo_engine *e)
{
    for (int i = 0; i < e->reducers.n; i++)
        if (e->reducers.ops[i]->forget)
            e->reducers.ops[i]->forget(e);
}

zo_status eng_reduce_hand_over(struct zo_engine *e, uint32_t c, const eng_job *j, int *taken)
{
    *taken = 0;
    for (int i = 0; i < e->reducers.n; i++) {
        int t = 0;
        if (e->reducers.ops[i]->hand_over)
            ZO_TRY(e->reducers.ops[i]->hand_over(e, c, j, &t));
        *taken |= t;
    }
    return ZO_OK;
}

zo_status eng_reduce_judge(struct zo_engine *e, eng_verdict *v)
{
    for (int i = 0; i < e->reducers.n; i++)
        ZO_TRY(e->reducers.ops[i]->judge(e, v));
    return ZO_OK;
}

zo_status eng_reduce_share(struct zo_engine *e, zo_status mine)
{
    for (int i = 0; i < e->reducers.n; i++)
        if (e->reducers.ops[i]->share)
            mine = e->reducers.ops[i]->share(e, mine);
    return mine;
}
