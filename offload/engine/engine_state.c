/* The engine's full optimizer state for checkpoints: per-tensor master, m and
 * v read and written through whichever tier holds them, the dpu flush, and
 * the step counts and loss scaler. See "checkpoints" in zo/engine.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine_tier.h"

static zo_status between_steps(struct zo_engine *e, int id, const char *what)
{
    if (!e)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "%s: NULL engine", what);
    if (id < -1 || id >= e->n_tensors)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "%s: no tensor %d (the engine has %d)", what,
                       id, e->n_tensors);
    if (!e->finalized)
        return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS,
                       "%s: call zo_engine_finalize first (before it, "
                       "zo_engine_register takes the initial values)",
                       what);
    if (e->step_open)
        return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS, "%s: a step is open; call it between steps", what);
    return ZO_OK;
}

static zo_status no_pending_update(struct zo_engine *e, const char *what)
{
    if (!e->dpu_pending)
        return ZO_OK;
    return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS,
                   "%s: the delayed update of the last step is pending: call zo_engine_flush first",
                   what);
}

/* Every update queued or running has landed (host jobs, speculative NVMe
 * writes, the delayed update). */
static zo_status settle(struct zo_engine *e)
{
    ZO_TRY(eng_wait_idle(e));
    return e->mode->settle(e);
}

zo_status zo_engine_read_state(zo_engine_t e, int id, float *master, float *m, float *v)
{
    ZO_TRY(between_steps(e, id, "read_state"));
    if (id < 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "read_state: no tensor %d", id);
    ZO_TRY(settle(e));
    eng_tensor *t = &e->tensors[id];
    float *buf = aligned_alloc(4096, e->state_extent_bytes);
    if (!buf)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "read_state: allocating a buffer");
    zo_status st = e->chunks[t->chunk].st->read(e, t->chunk, buf);
    float *dst[3] = {master, m, v};
    for (int i = 0; st == ZO_OK && i < 3; i++)
        if (dst[i])
            memcpy(dst[i], buf + (size_t)i * e->chunk_elems + t->off, t->numel * sizeof(float));
    free(buf);
    return st;
}

/* The 16-bit parameters of chunk c from its master weights: its home's
 * copies, then the device slot (reloaded when its home keeps it there,
 * dropped otherwise: the next fetch loads the new values). */
static zo_status refresh_p16(struct zo_engine *e, uint32_t c, const float *master)
{
    eng_chunk *k = &e->chunks[c];
    ZO_TRY(k->pt->write(e, c, master, 0));
    if (k->slot < 0)
        return ZO_OK;
    ZO_TRY(eng_publish_chunk(e, c));
    return k->pt->resident ? zo_stream_synchronize(e->h2d) : ZO_OK; /* the reload landed */
}

zo_status zo_engine_write_state(zo_engine_t e, int id, const float *master, const float *m,
                                const float *v)
{
    ZO_TRY(between_steps(e, id, "write_state"));
    if (id < 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "write_state: no tensor %d", id);
    ZO_TRY(no_pending_update(e, "write_state"));
    ZO_TRY(settle(e));
    eng_tensor *t = &e->tensors[id];
    eng_chunk *k = &e->chunks[t->chunk];
    float *st;
    ZO_TRY(k->st->write_begin(e, t->chunk, &st));
    const float *src[3] = {master, m, v};
    for (int i = 0; i < 3; i++)
        if (src[i])
            memcpy(st + (size_t)i * e->chunk_elems + t->off, src[i], t->numel * sizeof(float));
    ZO_TRY(k->st->write_end(e, t->chunk, st));
    return master ? refresh_p16(e, t->chunk, st) : ZO_OK;
}

zo_status zo_engine_flush(zo_engine_t e)
{
    ZO_TRY(between_steps(e, -1, "flush"));
    ZO_TRY(settle(e));
    return eng_dpu_commit_pending(e);
}

zo_status zo_engine_get_step_state(zo_engine_t e, zo_engine_step_state *out)
{
    ZO_TRY(between_steps(e, -1, "get_step_state"));
    if (!out || out->struct_size != sizeof *out)
        return ZO_FAIL(
            ZO_ERR_INVALID_ARG, ENG_SUBSYS,
            "get_step_state: out is NULL or its struct_size is not sizeof(zo_engine_step_state): "
            "initialize it with ZO_ENGINE_STEP_STATE_INIT");
    ZO_TRY(no_pending_update(e, "get_step_state"));
    out->updates = e->opt_step;
    out->steps = e->steps;
    out->loss_scale = e->scaler.cur_scale;
    out->scaler_iter = e->scaler.cur_iter;
    out->scaler_last_overflow_iter = e->scaler.last_overflow_iter;
    out->scaler_hysteresis = e->scaler.cur_hysteresis;
    return ZO_OK;
}

zo_status zo_engine_set_step_state(zo_engine_t e, const zo_engine_step_state *in)
{
    ZO_TRY(between_steps(e, -1, "set_step_state"));
    if (!in || in->struct_size != sizeof *in)
        return ZO_FAIL(
            ZO_ERR_INVALID_ARG, ENG_SUBSYS,
            "set_step_state: in is NULL or its struct_size is not sizeof(zo_engine_step_state)");
    ZO_TRY(no_pending_update(e, "set_step_state"));
    if (in->updates < 0 || in->steps < in->updates)
        return ZO_FAIL(
            ZO_ERR_INVALID_ARG, ENG_SUBSYS,
            "set_step_state: updates %lld and steps %lld: expected 0 <= updates <= steps",
            (long long)in->updates, (long long)in->steps);
    if (e->scaler.dynamic &&
        (!isfinite(in->loss_scale) || in->loss_scale <= 0 || in->scaler_hysteresis < 0))
        return ZO_FAIL(
            ZO_ERR_INVALID_ARG, ENG_SUBSYS,
            "set_step_state: loss scale %g (finite, > 0) or hysteresis %d (>= 0) out of range",
            in->loss_scale, in->scaler_hysteresis);
    ZO_TRY(settle(e));
    e->opt_step = in->updates;
    e->steps = in->steps;
    if (e->scaler.dynamic) {
        e->scaler.cur_scale = in->loss_scale;
        e->scaler.cur_iter = in->scaler_iter;
        e->scaler.last_overflow_iter = in->scaler_last_overflow_iter;
        e->scaler.cur_hysteresis = in->scaler_hysteresis;
    }
    return ZO_OK;
}
