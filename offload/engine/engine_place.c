/* Placement: each chunk's home for its 16-bit parameters and for its
 * optimizer states, from the configuration's homes and caps. The rule:
 * chunks in registration order fill the fastest tier up to its cap, then
 * the next, and the home takes the rest. Layer 0's chunks come first
 * because they are the ones nothing hides: their parameters open the
 * forward (no earlier layer's compute to prefetch behind) and their update
 * is the last of the backward (overlap mode) or of the delayed update's
 * pipeline, so what waits on the slowest link is the middle of the model,
 * behind compute. Under ZeRO a rank fills its caps with its own chunks'
 * states (and at stage 3 their parameters too; others' are remote). Called
 * by the plan (engine_plan.c) with or without an engine. */
#include "engine_tier.h"

/* The tier for the next chunk: the fastest whose cap still has room. */
static zo_tier fill(const zo_engine_caps *caps, zo_tier home, uint64_t per,
                    uint64_t used[ZO_TIER_MAX])
{
    const uint64_t *cap = caps->bytes;
    for (int t = 0; t < (int)home; t++)
        if (cap[t] && used[t] + per <= cap[t]) {
            used[t] += per;
            return (zo_tier)t;
        }
    return home;
}

/* ZeRO stage 3: another rank's chunk, not small enough to persist here. */
static int partitioned(const zo_engine_config *c, const uint8_t *states_home,
                       const uint64_t *used_elems, uint64_t chunk_elems, uint32_t k)
{
    return eng_zero_p3(c) && states_home[k] == ENG_HOME_REMOTE &&
           !eng_zero_persists(c, used_elems ? used_elems[k] : chunk_elems);
}

void eng_place_homes(const zo_engine_config *c, uint32_t n_chunks, uint64_t chunk_bytes,
                     const uint64_t *used_elems, uint8_t *p16_home, uint8_t *states_home)
{
    uint64_t sused[ZO_TIER_MAX] = {0}, pused[ZO_TIER_MAX] = {0};
    uint64_t chunk_elems = chunk_bytes / eng_param_bytes(c);
    /* fp32 states: 6 x C with 16-bit parameters, 3 x C with fp32 ones */
    uint64_t states = eng_states_bytes(c->state_dtype, chunk_elems);
    for (uint32_t k = 0; k < n_chunks; k++)
        states_home[k] = eng_zero_owner(c, n_chunks, k) != c->rank
                             ? ENG_HOME_REMOTE /* ZeRO: another rank's; it fills its own caps */
                             : (uint8_t)fill(&c->optim_caps, c->optim_home, states, sused);
    /* first the chunks that must keep their parameters off NVMe, then the rest in order */
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t k = 0; k < n_chunks; k++) {
            if (partitioned(c, states_home, used_elems, chunk_elems, k)) {
                p16_home[k] = ENG_HOME_REMOTE; /* gathered from its owner at each use */
                continue;
            }
            /* another rank's chunk (ZeRO) may live on NVMe: the owner's broadcast is
             * written to its extents here (engine_zero.c) */
            int forced = c->param_home == ZO_TIER_NVME && states_home[k] != ENG_HOME_REMOTE &&
                         !eng_state_tiers[states_home[k]]->p16_stored;
            if (forced != !pass)
                continue;
            zo_tier t = fill(&c->param_caps, c->param_home, chunk_bytes, pused);
            if (forced && t == ZO_TIER_NVME) {
                t = ZO_TIER_HOST;
                pused[ZO_TIER_HOST] += chunk_bytes;
            }
            p16_home[k] = (uint8_t)t;
        }
}

zo_status eng_check_caps(const zo_engine_config *c)
{
    const struct {
        const char *what;
        const zo_engine_caps *caps;
        zo_tier home;
    } kinds[2] = {{"param", &c->param_caps, c->param_home},
                  {"optim", &c->optim_caps, c->optim_home}};
    for (int i = 0; i < 2; i++)
        for (int t = kinds[i].home; t < ZO_TIER_MAX; t++)
            if (kinds[i].caps->bytes[t])
                return ZO_FAIL(ZO_ERR_INVALID_ARG, ENG_SUBSYS,
                               "%s_caps.%s (%s_caps.bytes[%d]) is set but %s_home is %s: a "
                               "cap is for a tier faster than the home (set %s_home to a "
                               "slower tier to spill the rest there)",
                               kinds[i].what, zo_tier_name((zo_tier)t), kinds[i].what, t,
                               kinds[i].what, zo_tier_name(kinds[i].home), kinds[i].what);
    return ZO_OK;
}
