/* The tiers by their offload names (zt_tiers.h). */
#include "zt_tiers.h"

#include <string.h>

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

static const struct {
    const char *name;
    zo_dtype dtype;
} state_dtypes[] = {{"fp32", ZO_DTYPE_F32}, {"bf16", ZO_DTYPE_BF16}, {"int8", ZO_DTYPE_I8}};

zo_status zt_parse_state_dtype(const char *s, zo_dtype *out)
{
    for (size_t i = 0; i < sizeof state_dtypes / sizeof state_dtypes[0]; i++)
        if (s && strcmp(s, state_dtypes[i].name) == 0) {
            *out = state_dtypes[i].dtype;
            return ZO_OK;
        }
    return zt_fail(ZO_ERR_INVALID_ARG, "optimizer state dtype '%s': expected fp32, bf16 or int8",
                   s ? s : "(null)");
}

const char *zt_state_dtype_name(zo_dtype t)
{
    for (size_t i = 0; i < sizeof state_dtypes / sizeof state_dtypes[0]; i++)
        if (state_dtypes[i].dtype == t)
            return state_dtypes[i].name;
    return "?";
}
