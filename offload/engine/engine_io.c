/* The engine's timeline: spans handed to the caller's trace callback (see
 * "timelines" in zo/engine.h), the stream timers behind the step's h2d, d2h
 * and stall seconds, traced NVMe requests, and the 16-bit cast. The bottom of
 * the engine's files: it calls none of them. */
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "zo/half.h"

zo_status zo_engine_set_trace(zo_engine_t e, zo_trace_fn fn, void *ctx)
{
    if (!e)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS, "set_trace: NULL engine");
    if (e->finalized)
        return ZO_FAIL(ZO_ERR_STATE, ENG_SUBSYS,
                       "set_trace: call it before zo_engine_finalize "
                       "(the optimizer's workers start there)");
    e->timeline.fn = fn;
    e->timeline.ctx = ctx;
    return ZO_OK;
}

void eng_trace(struct zo_engine *e, zo_trace_track track, int index, const char *name, uint64_t t0,
               uint64_t t1, int chunk, uint64_t bytes)
{
    if (!e->timeline.fn)
        return;
    zo_trace_event ev = {track, index, name, t0, t1, -1, chunk, bytes};
    if (chunk >= 0 && (uint32_t)chunk < e->n_chunks)
        ev.layer = e->chunks[chunk].layer;
    e->timeline.fn(e->timeline.ctx, &ev);
}

/* One NVMe request in flight: its span ends in the store's completion callback. */
typedef struct io_span {
    struct zo_engine *e;
    int store, write;
    uint32_t chunk;
    uint64_t bytes, t0;
} io_span;

static void io_done(void *user, zo_status st, const char *msg)
{
    (void)st;
    (void)msg;
    io_span *r = user;
    eng_trace(r->e, ZO_TRACK_NVME, r->store, r->write ? "nvme write" : "nvme read", r->t0,
              zo_now_ns(), (int)r->chunk, r->bytes);
    free(r);
}

zo_status eng_swap_async(struct zo_engine *e, int write, int store, uint32_t chunk,
                         zo_swap_extent_t ext, void *buf, size_t len, uint64_t gen,
                         zo_swap_io_t *io)
{
    zo_swap_t s = store == 2 ? e->grads.swap : store ? e->nvme.pswap : e->nvme.swap;
    io_span *r = e->timeline.fn ? malloc(sizeof *r) : NULL; /* without memory, untraced */
    if (r)
        *r = (io_span){e, store, write, chunk, len, zo_now_ns()};
    zo_swap_done_fn done = r ? io_done : NULL;
    zo_status st = write ? zo_swap_write_async(s, ext, buf, len, gen, done, r, io)
                         : zo_swap_read_async(s, ext, buf, len, gen, done, r, io);
    if (st < 0)
        free(r); /* a refused request calls nothing back */
    return st;
}

static void pool_span(void *ctx, const zo_optim_trace_span *sp)
{
    eng_trace(ctx, ZO_TRACK_OPTIM_WORKER, sp->worker, sp->job, sp->t0_ns, sp->t1_ns, -1, sp->elems);
}

void eng_trace_pool(struct zo_engine *e, zo_optim_pool_config *oc)
{
    if (!e->timeline.fn)
        return;
    oc->trace = pool_span;
    oc->trace_ctx = e;
}

void eng_cast_params(zo_dtype t, const float *src, void *dst, size_t n)
{
    uint16_t *d = dst;
    if (t == ZO_DTYPE_F32)
        memmove(dst, src, n * sizeof(float));
    else
        for (size_t i = 0; i < n; i++)
            d[i] = t == ZO_DTYPE_F16 ? zo_f32_to_f16(src[i]) : zo_f32_to_bf16(src[i]);
}

static float widen_one(zo_dtype t, const void *src, size_t i)
{
    switch (t) {
    case ZO_DTYPE_F32: return ((const float *)src)[i];
    case ZO_DTYPE_F16: return zo_f16_to_f32(((const uint16_t *)src)[i]);
    default: return zo_bf16_to_f32(((const uint16_t *)src)[i]);
    }
}

void eng_widen_params(zo_dtype t, const void *src, const float *base, float *out, size_t n)
{
    if (base)
        for (size_t i = 0; i < n; i++)
            out[i] = base[i] + widen_one(t, src, i);
    else
        for (size_t i = 0; i < n; i++)
            out[i] = widen_one(t, src, i);
}

typedef struct busy_arg {
    struct zo_engine *e;
    int which; /* 0 h2d, 1 d2h, 2 compute stalled */
    int chunk;
    uint64_t bytes;
} busy_arg;

static zo_status busy_begin(void *arg)
{
    busy_arg *b = arg;
    atomic_store(&b->e->stats.busy_t0[b->which], zo_now_ns());
    return ZO_OK;
}

static zo_status busy_end(void *arg)
{
    static const char *const names[3] = {"h2d", "d2h", "wait for parameters"};
    static const zo_trace_track tracks[3] = {ZO_TRACK_H2D, ZO_TRACK_D2H, ZO_TRACK_COMPUTE};
    busy_arg *b = arg;
    uint64_t t1 = zo_now_ns(), t0 = atomic_load(&b->e->stats.busy_t0[b->which]);
    atomic_fetch_add(&b->e->stats.busy_ns[b->which], t1 - t0);
    eng_trace(b->e, tracks[b->which], 0, names[b->which], t0, t1, b->chunk, b->bytes);
    return ZO_OK;
}

/* The copy is bracketed by tasks on its stream that time it. */
zo_status eng_timed_copy(struct zo_engine *e, int d2h, uint32_t chunk, void *dst, const void *src,
                         size_t n)
{
    zo_stream_t s = d2h ? e->d2h : e->h2d;
    busy_arg b = {e, d2h, (int)chunk, n};
    ZO_TRY(zo_stream_enqueue(s, busy_begin, &b, sizeof b));
    ZO_TRY(d2h ? zo_memcpy_d2h_async(s, dst, src, n) : zo_memcpy_h2d_async(s, dst, src, n));
    return zo_stream_enqueue(s, busy_end, &b, sizeof b);
}

zo_status eng_stall_mark(struct zo_engine *e, zo_stream_t compute, uint32_t chunk, int end)
{
    busy_arg b = {e, 2, (int)chunk, 0};
    return zo_stream_enqueue(compute, end ? busy_end : busy_begin, &b, sizeof b);
}

zo_status eng_compute_wait(struct zo_engine *e, zo_stream_t compute, zo_event_t ev, uint32_t chunk)
{
    if (zo_event_query(ev) != ZO_NOT_READY)
        return zo_stream_wait_event(compute, ev);
    ZO_TRY(eng_stall_mark(e, compute, chunk, 0));
    ZO_TRY(zo_stream_wait_event(compute, ev));
    return eng_stall_mark(e, compute, chunk, 1);
}

/* An update launched on its own thread: the stores' counters now, so what
 * the thread moves counts in the next step (engine_api.c's carry_counters). */
void eng_stats_launch(struct zo_engine *e)
{
    for (int i = 0; i < e->stats.n_stores; i++) {
        e->stats.stores[i].at_launch.struct_size = sizeof e->stats.stores[i].at_launch;
        zo_swap_get_stats(e->stats.stores[i].store, &e->stats.stores[i].at_launch);
    }
    e->stats.launched = 1;
}
