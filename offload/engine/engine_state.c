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
    if (id < -1 || id >= e->reg.n_tensors)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "%s: no tensor %d (the engine has %d)", what,
                       id, e->reg.n_tensors);
    if (!e->finalized)
        return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS,
                       "%s: call zo_engine_finalize first (before it, "
                       "zo_engine_register takes the initial values)",
                       what);
    if (e->step.open)
        return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS, "%s: a step is open; call it between steps", what);
    return ZO_OK;
}

static zo_status no_pending_update(struct zo_engine *e, const char *what)
{
    if (!e->dpu.pending)
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
    ZO_TRY(e->mode->settle(e));
    return eng_behind_redo(e); /* the states it reads or writes include it */
}

/* A tensor's moment (v: which = 1) in a chunk's states at the chunk's
 * stride, converted to or from fp32 or copied as stored (raw), in its state
 * format (zo_state_format). A tensor of a block-scaled format starts on a
 * block (the packing aligns it), so its blocks are its own. */
typedef struct moment_ref {
    const zo_state_format *f;
    char *base;    /* the moment's first element */
    float *scales; /* block-scaled: the tensor's first block scale, else NULL */
    size_t numel;
    int is_signed; /* m */
} moment_ref;

/* A tensor that keeps fp32 moments (eng_keeps_f32) has them in its room's
 * code bytes (zo/optim.h), which start at its offset. */
static zo_dtype tensor_fmt(const struct zo_engine *e, const eng_tensor *t)
{
    zo_dtype fmt = e->cfg.state_dtype;
    return eng_keeps_f32(fmt, t->numel, t->keep_f32) ? ZO_DTYPE_F32 : fmt;
}

static moment_ref moment_of(struct zo_engine *e, float *states, const eng_tensor *t, int which)
{
    zo_dtype fmt = e->cfg.state_dtype;
    const zo_state_format *chunk_f = zo_state_format_of(fmt);
    void *mom =
        which ? eng_state_v(fmt, states, e->chunk_elems) : eng_state_m(fmt, states, e->chunk_elems);
    moment_ref r = {zo_state_format_of(tensor_fmt(e, t)),
                    (char *)mom + zo_state_format_code_bytes(chunk_f, t->off), NULL, t->numel,
                    !which};
    if (r.f->block)
        r.scales = zo_state_format_scales(r.f, mom, e->chunk_elems) + t->off / r.f->block;
    return r;
}

static zo_status moment_to_f32(const moment_ref *r, float *out)
{
    return r->f->decode(r->base, r->scales, r->numel, r->is_signed, out);
}

static zo_status moment_from_f32(const moment_ref *r, const float *in)
{
    return r->f->encode(in, r->numel, r->is_signed, r->base, r->scales);
}

/* raw: the layout of the format's moment_bytes(numel); to_raw: out of the engine. */
static void moment_copy_raw(const moment_ref *r, void *raw, int to_raw)
{
    size_t bytes = zo_state_format_code_bytes(r->f, r->numel);
    if (to_raw)
        memcpy(raw, r->base, bytes);
    else
        memcpy(r->base, raw, bytes);
    if (!r->f->block)
        return;
    float *rs = zo_state_format_scales(r->f, raw, r->numel);
    size_t sb = (r->numel + r->f->block - 1) / r->f->block * sizeof(float);
    if (to_raw)
        memcpy(rs, r->scales, sb);
    else
        memcpy(r->scales, rs, sb);
}

/* What a read or write moves of a tensor's moments. */
typedef enum state_io { STATE_F32, STATE_RAW } state_io;

static zo_status read_state(zo_engine_t e, int id, float *master, void *m, void *v, state_io how)
{
    ZO_TRY(between_steps(e, id, "read_state"));
    if (id < 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "read_state: no tensor %d", id);
    ZO_TRY(settle(e));
    eng_tensor *t = &e->reg.tensors[id];
    float *buf = aligned_alloc(4096, e->nvme.state_extent_bytes);
    if (!buf)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "read_state: allocating a buffer");
    zo_status st = e->chunks[t->chunk].st->read(e->chunks[t->chunk].sctx, e, t->chunk, buf);
    if (st == ZO_OK && master)
        memcpy(master, buf + t->off, t->numel * sizeof(float));
    void *dst[2] = {m, v};
    for (int i = 0; st == ZO_OK && i < 2; i++) {
        if (!dst[i])
            continue;
        moment_ref r = moment_of(e, buf, t, i);
        if (how == STATE_RAW)
            moment_copy_raw(&r, dst[i], 1);
        else
            st = moment_to_f32(&r, dst[i]);
    }
    free(buf);
    return st;
}

zo_status zo_engine_read_state(zo_engine_t e, int id, float *master, float *m, float *v)
{
    return read_state(e, id, master, m, v, STATE_F32);
}

zo_status zo_engine_read_state_raw(zo_engine_t e, int id, float *master, void *m, void *v)
{
    return read_state(e, id, master, m, v, STATE_RAW);
}

zo_dtype zo_engine_state_dtype(zo_engine_t e)
{
    return e ? e->cfg.state_dtype : ZO_DTYPE_NONE;
}

zo_dtype zo_engine_tensor_state_dtype(zo_engine_t e, int id)
{
    if (!e || id < 0 || id >= e->reg.n_tensors)
        return ZO_DTYPE_NONE;
    return tensor_fmt(e, &e->reg.tensors[id]);
}

/* The 16-bit parameters of chunk c from its master weights: its home's
 * copies, then the device slot (reloaded when its home keeps it there,
 * dropped otherwise: the next fetch loads the new values). */
static zo_status refresh_p16(struct zo_engine *e, uint32_t c, const float *master)
{
    eng_chunk *k = &e->chunks[c];
    ZO_TRY(k->pt->write(k->pctx, e, c, master, 0));
    if (k->slot < 0)
        return ZO_OK;
    ZO_TRY(eng_publish_chunk(e, c));
    return k->pt->resident ? zo_stream_synchronize(e->h2d) : ZO_OK; /* the reload landed */
}

static zo_status write_state(zo_engine_t e, int id, const float *master, const void *m,
                             const void *v, state_io how)
{
    ZO_TRY(between_steps(e, id, "write_state"));
    if (id < 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "write_state: no tensor %d", id);
    ZO_TRY(no_pending_update(e, "write_state"));
    ZO_TRY(settle(e));
    eng_tensor *t = &e->reg.tensors[id];
    eng_chunk *k = &e->chunks[t->chunk];
    float *st;
    ZO_TRY(k->st->write_begin(k->sctx, e, t->chunk, &st));
    if (master)
        memcpy(st + t->off, master, t->numel * sizeof(float));
    const void *src[2] = {m, v};
    zo_status s = ZO_OK;
    for (int i = 0; s == ZO_OK && i < 2; i++) {
        if (!src[i])
            continue;
        moment_ref r = moment_of(e, st, t, i);
        if (how == STATE_RAW)
            moment_copy_raw(&r, (void *)src[i], 0);
        else
            s = moment_from_f32(&r, src[i]);
    }
    ZO_TRY(s);
    ZO_TRY(k->st->write_end(k->sctx, e, t->chunk, st));
    return master ? refresh_p16(e, t->chunk, st) : ZO_OK;
}

zo_status zo_engine_write_state(zo_engine_t e, int id, const float *master, const float *m,
                                const float *v)
{
    return write_state(e, id, master, m, v, STATE_F32);
}

zo_status zo_engine_write_state_raw(zo_engine_t e, int id, const float *master, const void *m,
                                    const void *v)
{
    return write_state(e, id, master, m, v, STATE_RAW);
}

/* The owner's current 16-bit copy of each chunk to every rank (its single
 * buffer on the ranks that do not own it), then device slots reloaded. */
zo_status zo_engine_share_params(zo_engine_t e)
{
    ZO_TRY(between_steps(e, -1, "share_params"));
    if (!eng_zero_on(&e->cfg) || e->cfg.zero_stage >= 3)
        return ZO_OK;
    ZO_TRY(no_pending_update(e, "share_params"));
    ZO_TRY(settle(e));
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        eng_chunk *k = &e->chunks[c];
        ZO_TRY(zo_comm_broadcast(e->cfg.comm, e->zero.stream, k->p16[k->p16_cur], k->n_elems,
                                 e->cfg.param_dtype, k->owner));
    }
    ZO_TRY(zo_stream_synchronize(e->zero.stream));
    for (uint32_t c = 0; c < e->n_chunks; c++)
        if (e->chunks[c].owner != e->cfg.rank)
            ZO_TRY(eng_publish_chunk(e, c));
    return zo_stream_synchronize(e->h2d);
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
    ZO_TRY(settle(e)); /* an update behind the forward counts once it is committed */
    out->updates = e->step.opt_step;
    out->steps = e->step.steps;
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
    e->step.opt_step = in->updates;
    e->step.steps = in->steps;
    if (e->scaler.dynamic) {
        e->scaler.cur_scale = in->loss_scale;
        e->scaler.cur_iter = in->scaler_iter;
        e->scaler.last_overflow_iter = in->scaler_last_overflow_iter;
        e->scaler.cur_hysteresis = in->scaler_hysteresis;
    }
    return ZO_OK;
}
