/* Layer-major micro-batch groups: a group of micro-batches goes through a
 * layer under one fetch, and each gradient slot sums the group's 16-bit
 * gradients in fp32 on the device, in micro-batch order, so that the sum
 * goes down once per group instead of each micro-batch's gradient once per
 * micro-batch. The summation order is the host's without groups: the step's
 * first micro-batch is converted, each later one added, and a group after
 * the first starts from the running sum the previous group sent down (sent
 * back up), so acc = ((g1 + g2) + g3) + ... bit for bit. */
#include <stdlib.h>

#include "engine_internal.h"
#include "zo/ops.h"

int eng_group_size(const zo_engine_config *c)
{
    if (!eng_grouped(c))
        return 1;
    return c->micro_group < c->grad_accum_steps ? c->micro_group : c->grad_accum_steps;
}

zo_status eng_group_alloc(struct zo_engine *e)
{
    if (!eng_grouped(&e->cfg))
        return ZO_OK;
    size_t per = e->chunk_elems * sizeof(float);
    ZO_TRY(zo_device_malloc(e->dev, e->device.n_gslots * per, &e->device.gacc));
    for (uint32_t s = 0; s < e->device.n_gslots; s++) {
        e->device.gslots[s].acc = (float *)((char *)e->device.gacc + s * per);
        ZO_TRY(zo_event_create(e->dev, &e->device.gslots[s].loaded));
    }
    return ZO_OK;
}

void eng_group_release(struct zo_engine *e)
{
    for (uint32_t s = 0; e->device.gslots && s < e->device.n_gslots; s++) {
        zo_event_destroy(e->device.gslots[s].loaded);
        e->device.gslots[s].loaded = NULL;
        e->device.gslots[s].acc = NULL;
    }
    if (e->device.gacc)
        zo_device_mfree(e->dev, e->device.gacc);
    e->device.gacc = NULL;
}

zo_status eng_group_take(struct zo_engine *e, uint32_t c, zo_stream_t compute)
{
    eng_chunk *k = &e->chunks[c];
    if (!eng_grouped(&e->cfg) || k->n_ready == 0)
        return ZO_OK; /* the step's first micro-batch converts into the sum */
    eng_gslot *g = &e->device.gslots[k->grad_slot];
    /* On the d2h stream: after the previous group's sum landed in acc[] (and
     * after the slot's last sum left), with no wait on the parameters' stream. */
    ZO_TRY(zo_memcpy_h2d_async(e->d2h, g->acc, k->acc[eng_step_parity(e)],
                               k->n_elems * sizeof(float)));
    ZO_TRY(zo_event_record(g->loaded, e->d2h));
    return zo_stream_wait_event(compute, g->loaded);
}

/* The group's sum leaves: D2H into the chunk's pinned sum, then the host job. */
static zo_status send_sum(struct zo_engine *e, uint32_t c, zo_stream_t compute)
{
    eng_chunk *k = &e->chunks[c];
    eng_gslot *g = &e->device.gslots[k->grad_slot];
    int parity = eng_step_parity(e);
    eng_wait_chunk_jobs(e, c);             /* the previous job no longer reads the sum */
    ZO_TRY(eng_grads_stage(e, c, parity)); /* NVMe-homed: the sum lands in a ring slot */
    ZO_TRY(zo_event_record(k->computed, compute));
    ZO_TRY(zo_stream_wait_event(e->d2h, k->computed));
    ZO_TRY(eng_timed_copy(e, 1, c, k->acc[parity], g->acc, k->n_elems * sizeof(float)));
    ZO_TRY(zo_event_record(g->drained, e->d2h));
    g->busy = 0;
    k->grad_slot = -1;
    return eng_queue_grads_job(e, c, parity);
}

zo_status eng_group_hand_over(struct zo_engine *e, uint32_t c, zo_stream_t compute)
{
    eng_chunk *k = &e->chunks[c];
    const int M = e->cfg.grad_accum_steps, G = eng_group_size(&e->cfg);
    if (k->n_ready >= M)
        return ZO_FAIL(
            ZO_ERR_STATE, ENG_SUBSYS,
            "grads_ready: layer %d already handed over %d micro-batches (grad_accum_steps)",
            k->layer, k->n_ready);
    eng_gslot *g = &e->device.gslots[k->grad_slot];
    size_t n = k->n_elems;
    zo_dtype dt = e->cfg.param_dtype;
    if (k->n_ready == 0) /* acc = g1, as the host's first micro-batch */
        ZO_TRY(zo_op_cast(compute, g->acc, ZO_DTYPE_F32, g->ptr, dt, n));
    else
        ZO_TRY(zo_op_axpy(compute, g->acc, ZO_DTYPE_F32, 1.0f, g->ptr, dt, n));
    k->n_ready++;
    if (k->n_ready % G != 0 && k->n_ready != M) /* the group's next micro-batch adds anew */
        return zo_memset_async(compute, g->ptr, 0, n * e->pel);
    return send_sum(e, c, compute);
}

void eng_group_reset(struct zo_engine *e)
{
    for (uint32_t s = 0; eng_grouped(&e->cfg) && s < e->device.n_gslots; s++)
        zo_event_record(e->device.gslots[s].loaded, e->d2h);
}
