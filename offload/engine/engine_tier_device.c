/* The device tier: 16-bit parameters that keep a device slot each for the
 * whole run (loaded at placement, reloaded after every committed update,
 * never evicted), with the host tier's pinned copies behind them for the
 * update to write; optimizer states resident in device memory, updated
 * there by the device's Adam op (zo_op_adam) on a stream of the tier's own.
 *
 * The host never reads or writes these states: on a GPU it cannot. The
 * update brings the chunk's final gradients up (the same host buffers the
 * CPU Adam reads: 16-bit, fp32 sums or ZeRO's reduced ones), runs the op
 * over them and takes the 16-bit output down to the parameters' home copy,
 * which the commit's publish loads into the slot as for any other tier.
 * zo_op_adam performs zo_adam_step's operations in its order (on the cpu
 * device it is zo_adam_step), so a chunk homed here trains bit for bit as
 * one homed on the host. Overlap backups, the initial states and the
 * checkpoints' reads and writes go through copies on the same stream. */
#include <stdlib.h>
#include <string.h>

#include "engine_tier.h"

static void device_p16_account(const eng_plan_in *in, zo_engine_footprint *fp)
{
    eng_host_p16_account(in, ZO_TIER_DEVICE, fp); /* the slots are counted with the device's */
}

static zo_status device_p16_place(void *self, struct zo_engine *e)
{
    return eng_host_p16_place(e, &eng_param_tier_device);
}

static void device_p16_release(void *self, struct zo_engine *e)
{
    (void)e;
}

const eng_param_tier eng_param_tier_device = {
    .version = ENG_TIER_OPS_VERSION,
    .tier = ZO_TIER_DEVICE,
    .name = "device",
    .resident = 1,
    .host_copies = 1,
    .account = device_p16_account,
    .place = device_p16_place,
    .release = device_p16_release,
    .write = eng_host_p16_write,
    .source = eng_host_p16_source,
    .update_out = eng_host_p16_out,
    .store = NULL,
    .commit = eng_host_p16_commit,
    .abandon = NULL,
};

/* ---- optimizer states ---- */

/* Device bytes of the update's room: one chunk's gradients as the update
 * reads them (fp32 at most: accumulated or reduced over the ranks), and its
 * 16-bit output. */
static uint64_t adam_room_grad(const zo_engine_config *c, uint64_t chunk_bytes)
{
    return eng_f32_chunk_bytes(c, chunk_bytes);
}

static void device_states_account(const eng_plan_in *in, zo_engine_footprint *fp)
{
    uint64_t bytes = eng_resident_account(in, ZO_TIER_DEVICE, fp);
    if (!bytes)
        return;
    fp->bytes[ZO_TIER_DEVICE] += bytes + adam_room_grad(in->cfg, in->chunk_bytes) + in->chunk_bytes;
    fp->pinned += eng_states_io_bytes(in->cfg->state_dtype, in->chunk_elems);
}

/* zo_op_adam updates fp32 and bf16 moments on every device, 8-bit ones on
 * the cpu device only: refused at placement rather than at the first step. */
static zo_status check_adam_format(struct zo_engine *e)
{
    zo_dtype f = e->cfg.state_dtype;
    if (f == ZO_DTYPE_F32 || f == ZO_DTYPE_BF16 || !strcmp(zo_device_backend(e->dev), "cpu"))
        return ZO_OK;
    return ZO_FAIL(ZO_ERR_UNSUPPORTED, ENG_SUBSYS,
                   "optimizer states in %s on the %s device: its Adam op updates fp32 and bf16 "
                   "moments only; choose fp32 or bf16 states, or home them on the host or NVMe",
                   zo_state_format_of(f)->name, zo_device_backend(e->dev));
}

static zo_status device_states_place(void *self, struct zo_engine *e)
{
    eng_device_tier *d = self;
    uint64_t n = eng_chunks_at(e, 1, &eng_state_tier_device);
    if (!n)
        return ZO_OK;
    ZO_TRY(check_adam_format(e));
    ZO_TRY(zo_device_malloc(
        e->dev, (size_t)n * eng_states_bytes(e->cfg.state_dtype, e->chunk_elems), &d->states));
    ZO_TRY(zo_device_malloc(e->dev, adam_room_grad(&e->cfg, e->chunk_bytes), &d->adam_grad));
    ZO_TRY(zo_device_malloc(e->dev, e->chunk_bytes, &d->adam_out));
    ZO_TRY(zo_stream_create(e->dev, &d->adam));
    void *stage = NULL;
    ZO_TRY(eng_take_pinned(e, eng_states_io_bytes(e->cfg.state_dtype, e->chunk_elems), 1, &stage));
    d->stage = stage;
    d->failed = ZO_OK;
    return eng_resident_place(e, &eng_state_tier_device, d->states, &d->backup);
}

static void device_states_release(void *self, struct zo_engine *e)
{
    eng_device_tier *d = self;
    if (d->adam) {
        zo_stream_synchronize(d->adam);
        zo_stream_destroy(d->adam);
    }
    zo_device_mfree(e->dev, d->adam_out);
    zo_device_mfree(e->dev, d->adam_grad);
    zo_device_mfree(e->dev, d->states);
    eng_host_free(d->backup);
    d->adam = NULL;
    d->adam_grad = d->adam_out = d->states = NULL;
    d->backup = NULL;
    d->stage = NULL; /* the pinned pool's, freed with it */
}

static size_t states_bytes(const struct zo_engine *e)
{
    return eng_states_bytes(e->cfg.state_dtype, e->chunk_elems);
}

/* The initial states are written to the stage, then copied up. */
static float *device_init_buf(void *self, struct zo_engine *e, uint32_t c)
{
    eng_device_tier *d = self;
    (void)e, (void)c;
    return d->stage;
}

static zo_status device_init(void *self, struct zo_engine *e, uint32_t c, float *buf)
{
    eng_device_tier *d = self;
    ZO_TRY(zo_memcpy_h2d_async(d->adam, e->chunks[c].states, buf, states_bytes(e)));
    return zo_stream_synchronize(d->adam);
}

static zo_status op_adam_range(void *ctx, const zo_adam_params *p, const zo_adam_buffers *b)
{
    return zo_op_adam(ctx, p, b);
}

/* Chunk k's update on the device: its gradients up, the op over them and
 * the resident states, the 16-bit output down to where the host Adam would
 * have written it (the parameters' home copy). */
static zo_status adam_chunk(eng_device_tier *d, struct zo_engine *e, eng_chunk *k,
                            const eng_update_args *u)
{
    zo_adam_params p;
    zo_adam_buffers host;
    eng_adam_args(e, k, k->states, u, &p, &host);
    zo_adam_buffers dev = host;
    dev.grad = d->adam_grad;
    dev.out = host.out ? d->adam_out : NULL;
    ZO_TRY(zo_memcpy_h2d_async(d->adam, d->adam_grad, host.grad,
                               k->n_elems * zo_dtype_size(host.grad_type)));
    ZO_TRY(eng_adam_ranges(e, k, &p, &dev, op_adam_range, d->adam));
    if (host.out)
        ZO_TRY(zo_memcpy_d2h_async(d->adam, host.out, d->adam_out,
                                   k->n_elems * zo_dtype_size(host.out_type)));
    ZO_TRY(zo_stream_synchronize(d->adam)); /* the op's failure too */
    eng_adam_zero_padding(e, k, &host);
    return ZO_OK;
}

/* A rollback's failure, kept until now. */
static zo_status take_failed(eng_device_tier *d)
{
    zo_status st = d->failed;
    d->failed = ZO_OK;
    return st;
}

static zo_status device_update(void *self, struct zo_engine *e, const uint32_t *chunks, uint32_t n,
                               const eng_update_args *u)
{
    eng_device_tier *d = self;
    ZO_TRY(take_failed(d));
    for (uint32_t i = 0; i < n; i++)
        ZO_TRY(adam_chunk(d, e, &e->chunks[chunks[i]], u));
    return ZO_OK;
}

/* The backup comes down before the op runs: same stream, in order. */
static zo_status device_speculate(void *self, struct zo_engine *e, uint32_t c, const eng_job *j,
                                  int next)
{
    eng_device_tier *d = self;
    (void)next;
    eng_chunk *k = &e->chunks[c];
    ZO_TRY(zo_memcpy_d2h_async(d->adam, k->backup, k->states, states_bytes(e)));
    eng_update_args u = {j->lr, j->factor, j->step, j->parity, NULL};
    return adam_chunk(d, e, k, &u);
}

static zo_status device_drain(void *self, struct zo_engine *e)
{
    eng_device_tier *d = self;
    (void)e;
    return take_failed(d);
}

/* The states from the backup; the single-buffered 16-bit copy is the
 * backup's master rounded, as the host tier recomputes it. */
static void device_rollback(void *self, struct zo_engine *e, uint32_t c)
{
    eng_device_tier *d = self;
    eng_chunk *k = &e->chunks[c];
    if (!k->spec_done || !k->backup)
        return;
    zo_status st = zo_memcpy_h2d_async(d->adam, k->states, k->backup, states_bytes(e));
    if (st == ZO_OK)
        st = zo_stream_synchronize(d->adam);
    if (st != ZO_OK && d->failed == ZO_OK)
        d->failed = st;
    if (k->p16_bufs == 1)
        eng_cast_params(e->cfg.param_dtype, k->backup, k->p16[k->p16_cur], k->n_elems);
    k->spec_done = 0;
}

static zo_status device_read(void *self, struct zo_engine *e, uint32_t c, float *out)
{
    eng_device_tier *d = self;
    ZO_TRY(zo_memcpy_d2h_async(d->adam, out, e->chunks[c].states, states_bytes(e)));
    return zo_stream_synchronize(d->adam);
}

/* The editable copy is the stage (idle between steps). */
static zo_status device_write_begin(void *self, struct zo_engine *e, uint32_t c, float **buf)
{
    eng_device_tier *d = self;
    *buf = d->stage;
    return device_read(self, e, c, d->stage);
}

static zo_status device_write_end(void *self, struct zo_engine *e, uint32_t c, float *buf)
{
    return device_init(self, e, c, buf);
}

const eng_state_tier eng_state_tier_device = {
    .version = ENG_TIER_OPS_VERSION,
    .tier = ZO_TIER_DEVICE,
    .name = "device",
    .packed = 0,
    .in_place = 1,
    .p16_behind = 0,
    .p16_stored = 0,
    .needs_caps = 0,
    .needs_paths = 0,
    .account = device_states_account,
    .place = device_states_place,
    .release = device_states_release,
    .init_buf = device_init_buf,
    .init = device_init,
    .update = device_update,
    .speculate = device_speculate,
    .drain = device_drain,
    .rollback = device_rollback,
    .discard = eng_resident_discard,
    .commit = eng_resident_commit,
    .read = device_read,
    .write_begin = device_write_begin,
    .write_end = device_write_end,
};
