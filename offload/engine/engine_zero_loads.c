/* ZeRO as a chunk's load sees it: whether a stage-3 gather buffer holds
 * the chunk's parameters of this step, whether this rank's copy of another
 * rank's chunk is stale, and a failed load kept for the ranks to agree on at
 * the step's end. The loads run in the tiers (engine_tier_nvme.c) and in
 * engine_zero.c's gathers alike, so these sit below both; the gathers and the
 * agreement themselves are engine_zero.c's. */
#include <stdio.h>

#include "engine_internal.h"

/* The buffers' bookkeeping follows the fetches and the trace only, the same
 * on every rank (an owner keeps it too, without using the buffers). */
int eng_zero_held(const struct zo_engine *e, uint32_t c)
{
    int s = e->chunks[c].zg_slot;
    return s >= 0 && e->zero.g_chunk[s] == (int)c;
}

const void *eng_zero_gathered(const struct zo_engine *e, uint32_t c)
{
    return eng_zero_p3(&e->cfg) && eng_zero_held(e, c) ? e->zero.gbuf[e->chunks[c].zg_slot] : NULL;
}

/* ---- a rank's failure fails the step on every rank ---- */

zo_status eng_zero_defer(struct zo_engine *e, zo_status st, int chunk)
{
    if (!eng_zero_on(&e->cfg) || st >= 0)
        return st;
    pthread_mutex_lock(&e->jobs.mu);
    if (e->zero.defer_st >= 0) {
        e->zero.defer_st = st;
        snprintf(e->zero.defer_msg, sizeof e->zero.defer_msg, "%s", zo_last_error());
    }
    e->zero.defer_slots |= chunk >= 0;
    /* another rank's chunk whose copy here fails its checksum: the owner
     * sends it again (repair), else every retry would fail as this step */
    if (chunk >= 0 && st == ZO_ERR_CORRUPT && e->chunks[chunk].owner != e->cfg.rank)
        e->zero.defer_repair = chunk;
    pthread_mutex_unlock(&e->jobs.mu);
    return ZO_OK;
}

zo_status eng_zero_check_copy(const struct zo_engine *e, uint32_t c)
{
    const eng_chunk *k = &e->chunks[c];
    if (atomic_load(&k->pstale) != ENG_P16_STALE)
        return ZO_OK;
    return ZO_FAIL(ZO_ERR_IO, ENG_SUBSYS,
                   "rank %d's copy of chunk %u (layer %d, rank %d's) is stale (writing its owner's "
                   "values here failed): its owner sends it again at this step's end",
                   e->cfg.rank, c, k->layer, k->owner);
}
