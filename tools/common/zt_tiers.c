/* The tiers by their offload names (zt_tiers.h). */
#include "zt_tiers.h"

#include <string.h>

#include "zo/optim.h"
#include "zt_error.h"

zo_status zt_parse_home(const char *s, int *out)
{
    static const struct {
        const char *name;
        zo_tier tier;
    } homes[] = {{"none", ZO_TIER_DEVICE}, {"cpu", ZO_TIER_HOST}, {"nvme", ZO_TIER_NVME}};
    for (size_t i = 0; i < sizeof homes / sizeof homes[0]; i++)
        if (s && strcmp(s, homes[i].name) == 0) {
            *out = (int)homes[i].tier;
            return ZO_OK;
        }
    return zt_fail(ZO_ERR_INVALID_ARG, "offload target '%s': expected none, cpu or nvme",
                   s ? s : "(null)");
}

const char *zt_home_name(zo_tier t)
{
    switch (t) {
    case ZO_TIER_DEVICE: return "none";
    case ZO_TIER_HOST: return "cpu";
    case ZO_TIER_NVME: return "nvme";
    }
    return "?";
}

zo_status zt_parse_state_dtype(const char *s, zo_dtype *out)
{
    const zo_state_format *f = zo_state_format_named(s);
    if (f) {
        *out = f->dtype;
        return ZO_OK;
    }
    char names[128];
    zo_state_format_names(names, sizeof names, ", ");
    return zt_fail(ZO_ERR_INVALID_ARG, "optimizer state dtype '%s': expected one of %s",
                   s ? s : "(null)", names);
}

const char *zt_state_dtype_name(zo_dtype t)
{
    const zo_state_format *f = zo_state_format_of(t);
    return f ? f->name : "?";
}
