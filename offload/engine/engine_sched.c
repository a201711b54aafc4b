/* Scheduling: the trace of fetches recorded in the first step, residency of
 * parameter chunks in the device's slots, prefetch along the trace and
 * eviction of the chunk whose next use is farthest (Belady's rule). When the
 * trainer deviates from the trace, prefetch stops, eviction falls back to
 * least recently used, and the step's fetches become the new trace. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "engine_tier.h"

/* Append (layer, phase) to this step's fetches. Returns the position in the
 * recorded trace when the step follows it, -1 when it does not, -2 on
 * allocation failure. */
int eng_trace_push(struct zo_engine *e, int layer, zo_phase phase)
{
    if (e->sched.n_cur == e->sched.cap_cur) {
        int n = e->sched.cap_cur ? 2 * e->sched.cap_cur : 64;
        int *p = realloc(e->sched.cur, (size_t)n * sizeof *p);
        if (!p)
            return -2;
        e->sched.cur = p;
        e->sched.cap_cur = n;
    }
    int code = layer * 2 + (int)phase;
    int pos = e->sched.n_cur;
    e->sched.cur[e->sched.n_cur++] = code;
    if (!e->sched.trace_valid || e->sched.deviated)
        return -1;
    if (pos >= e->sched.n_trace || e->sched.trace[pos] != code) {
        e->sched.deviated = 1;
        ZO_LOGD(ENG_SUBSYS,
                "fetch %d (layer %d) leaves the recorded trace: prefetch off until re-recorded",
                pos, layer);
        return -1;
    }
    return pos;
}

/* The step's fetches become the trace when none was recorded or the step
 * deviated from it. */
void eng_trace_end_step(struct zo_engine *e)
{
    if (e->sched.n_cur > 0 &&
        (!e->sched.trace_valid || e->sched.deviated || e->sched.n_cur != e->sched.n_trace)) {
        if (e->sched.cap_trace < e->sched.n_cur) {
            int *p = realloc(e->sched.trace, (size_t)e->sched.n_cur * sizeof *p);
            if (!p) {
                e->sched.trace_valid = 0;
                e->sched.n_cur = 0;
                return;
            }
            e->sched.trace = p;
            e->sched.cap_trace = e->sched.n_cur;
        }
        memcpy(e->sched.trace, e->sched.cur, (size_t)e->sched.n_cur * sizeof *e->sched.trace);
        e->sched.n_trace = e->sched.n_cur;
        e->sched.trace_valid = 1;
    }
    e->sched.deviated = 0;
    e->sched.n_cur = 0;
}

/* Trace position of the next fetch of layer at or after `from`; uses in the
 * next step count from n_trace on. */
static int next_use(const struct zo_engine *e, int layer, int from)
{
    for (int j = from; j < e->sched.n_trace; j++)
        if (e->sched.trace[j] / 2 == layer)
            return j;
    for (int j = 0; j < e->sched.n_trace && j < from; j++)
        if (e->sched.trace[j] / 2 == layer)
            return e->sched.n_trace + j;
    return INT_MAX;
}

static int following(const struct zo_engine *e)
{
    return e->sched.trace_valid && !e->sched.deviated;
}

/* The slot to reuse: a free one, else the evictable chunk used farthest in
 * the future (or least recently, off the trace). With `sooner` >= 0 only a
 * chunk whose next use comes after `sooner` qualifies (prefetch never evicts
 * what is needed before the chunk it brings in). */
static int pick_slot(struct zo_engine *e, int pos, int sooner)
{
    int best = -1;
    long best_key = LONG_MIN;
    for (uint32_t s = 0; s < e->device.n_pslots; s++) {
        int c = e->device.pslots[s].chunk;
        if (c < 0)
            return (int)s;
        if (e->chunks[c].in_use > 0 || e->chunks[c].pt->resident)
            continue;
        long key;
        if (pos >= 0) {
            int nu = next_use(e, e->chunks[c].layer, pos + 1);
            if (sooner >= 0 && nu <= sooner)
                continue;
            key = nu;
        } else {
            key = -(long)e->device.pslots[s].tick;
        }
        if (key > best_key) {
            best_key = key;
            best = (int)s;
        }
    }
    return best;
}

/* H2D chunk c's current 16-bit parameters (from where its home tier says,
 * staged there first when needed) into slot s once the slot's last reader
 * is done. */
zo_status eng_load_slot(struct zo_engine *e, uint32_t c, uint32_t s)
{
    eng_chunk *k = &e->chunks[c];
    eng_pslot *p = &e->device.pslots[s];
    const void *src;
    const eng_load ld = {p->ready, eng_behind_latest(e, c)};
    ZO_TRY(k->pt->source(k->pctx, e, c, &ld, &src));
    ZO_TRY(zo_stream_wait_event(e->h2d, p->lastuse));
    ZO_TRY(eng_timed_copy(e, 0, c, p->ptr, src, k->n_elems * e->pel));
    ZO_TRY(zo_event_record(p->ready, e->h2d));
    p->chunk = (int)c;
    k->slot = (int)s;
    return ZO_OK;
}

static zo_status load_into(struct zo_engine *e, uint32_t c, int s)
{
    int old = e->device.pslots[s].chunk;
    if (old >= 0) {
        e->chunks[old].slot = -1;
        e->sched.evictions++;
    }
    zo_status st = eng_load_slot(e, c, (uint32_t)s);
    if (st < 0)
        e->device.pslots[s].chunk = -1; /* contents unknown: a free slot */
    return st;
}

/* A resident slot older than its chunk's committed values, loaded again. */
static zo_status reload_slot(struct zo_engine *e, uint32_t c)
{
    eng_chunk *k = &e->chunks[c];
    ZO_TRY(eng_load_slot(e, c, (uint32_t)k->slot));
    k->reload = 0;
    return ZO_OK;
}

zo_status eng_make_resident(struct zo_engine *e, uint32_t c, int pos)
{
    eng_chunk *k = &e->chunks[c];
    if (k->slot >= 0) {
        if (k->reload)
            ZO_TRY(reload_slot(e, c));
        e->sched.hits++;
    } else {
        int s = pick_slot(e, pos, -1);
        if (s < 0)
            return ZO_FAIL(ZO_ERR_OUT_OF_DEVICE_MEMORY, ENG_SUBSYS,
                           "fetch of layer %d: all %u device parameter slots hold chunks of layers "
                           "still fetched; release a layer first or raise device_bytes",
                           k->layer, e->device.n_pslots);
        ZO_TRY(load_into(e, c, s));
        e->sched.misses++;
    }
    e->device.pslots[k->slot].tick = ++e->sched.lru_tick;
    return ZO_OK;
}

/* Bring the chunks of the next `lookahead` fetches of the trace in ahead of
 * time, into free slots or in place of chunks needed later than they are. */
void eng_prefetch(struct zo_engine *e)
{
    if (!following(e))
        return; /* chunks homed on the device are always in their slots */
    int pos = e->sched.n_cur - 1;
    for (int a = 1; a <= e->cfg.lookahead; a++) {
        int j = pos + a;
        if (j >= e->sched.n_trace)
            return;
        eng_layer *L = &e->reg.layers[e->sched.trace[j] / 2];
        for (uint32_t i = 0; i < L->n_chunks; i++) {
            uint32_t c = L->first_chunk + i;
            if (eng_behind_pending(e, c))
                return; /* its new values have not landed: the fetch waits for them */
            if (e->chunks[c].slot >= 0) { /* a failed reload is retried by the fetch */
                if (e->chunks[c].reload && reload_slot(e, c) == ZO_OK)
                    e->sched.prefetches++;
                continue;
            }
            int s = pick_slot(e, pos, j);
            if (s < 0)
                return;
            if (load_into(e, c, s) < 0)
                return; /* a failed copy surfaces at the fetch that needs it */
            e->sched.prefetches++;
        }
    }
}

/* Chunk c's committed 16-bit parameters to the device: reloaded into its
 * slot when its home keeps it there (at its next fetch when the copy is
 * read from NVMe: nothing after a commit may fail), else the slot is
 * dropped (the next fetch loads the new values). */
zo_status eng_publish_chunk(struct zo_engine *e, uint32_t c)
{
    eng_chunk *k = &e->chunks[c];
    if (k->slot < 0)
        return ZO_OK;
    if (k->pt->lazy) {
        k->reload = ENG_RELOAD_HOME;
        return ZO_OK;
    }
    if (k->pt->resident)
        return eng_load_slot(e, c, (uint32_t)k->slot);
    e->device.pslots[k->slot].chunk = -1;
    k->slot = -1;
    return ZO_OK;
}

zo_status eng_publish(struct zo_engine *e, int updated)
{
    for (uint32_t c = 0; c < e->n_chunks; c++)
        if (updated || !e->chunks[c].pt->resident) /* a skipped update left the slot current */
            ZO_TRY(eng_publish_chunk(e, c));
    return ZO_OK;
}
