/* The device tier: 16-bit parameters that keep a device slot each for the
 * whole run (loaded at placement, reloaded after every committed update,
 * never evicted), with the host tier's pinned copies behind them for the
 * update to write; optimizer states resident in device memory, which the
 * CPU optimizer updates in place (host-addressable devices only, checked at
 * init). */
#include <stdlib.h>

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

static void device_states_account(const eng_plan_in *in, zo_engine_footprint *fp)
{
    fp->bytes[ZO_TIER_DEVICE] += eng_resident_account(in, ZO_TIER_DEVICE, fp);
}

static zo_status device_states_place(void *self, struct zo_engine *e)
{
    eng_device_tier *d = self;
    uint64_t n = eng_chunks_at(e, 1, &eng_state_tier_device);
    ZO_TRY(zo_device_malloc(
        e->dev, (size_t)n * eng_states_bytes(e->cfg.state_dtype, e->chunk_elems), &d->states));
    return eng_resident_place(e, &eng_state_tier_device, d->states, &d->backup);
}

static void device_states_release(void *self, struct zo_engine *e)
{
    eng_device_tier *d = self;
    zo_device_mfree(e->dev, d->states);
    eng_host_free(d->backup);
    d->states = NULL;
    d->backup = NULL;
}

const eng_state_tier eng_state_tier_device = {
    .version = ENG_TIER_OPS_VERSION,
    .tier = ZO_TIER_DEVICE,
    .name = "device",
    .packed = 0,
    .in_place = 1,
    .p16_behind = 0,
    .p16_stored = 0,
    .needs_caps = ZO_DEVCAP_HOST_ADDRESSABLE,
    .needs_paths = 0,
    .account = device_states_account,
    .place = device_states_place,
    .release = device_states_release,
    .init_buf = eng_resident_init_buf,
    .init = eng_resident_init,
    .update = eng_resident_update,
    .speculate = eng_resident_speculate,
    .drain = eng_resident_drain,
    .rollback = eng_resident_rollback,
    .discard = eng_resident_discard,
    .commit = eng_resident_commit,
    .read = eng_resident_read,
    .write_begin = eng_resident_write_begin,
    .write_end = eng_resident_write_end,
};
