/* libzoffload_dsconfig: the DeepSpeed config parser (tools/dsconfig) for the
 * Python package. The parser is tools-level and stays out of libzoffload (the
 * library does not parse DeepSpeed configs); the package still must read a
 * config exactly as zo-train does, so this small shared library wraps the
 * same code behind one call that takes JSON text and returns the resolved
 * config as JSON text (zo_train_config_to_json), which Python reads back.
 * Only the two functions below are exported. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zo/config.h"
#include "zo/status.h"

#define ZO_PY_API __attribute__((visibility("default")))

ZO_PY_API int zo_pyconfig_resolve(const char *json, const char *origin, const char *const *sets,
                                  int n_sets, int64_t world_size, char **out, char *err,
                                  size_t cap);
ZO_PY_API void zo_pyconfig_free(void *p);

static int fail(zo_status st, char *err, size_t cap)
{
    if (err && cap)
        snprintf(err, cap, "%s", zo_last_error());
    zo_clear_error();
    return st;
}

static zo_status apply_sets(zo_config_t c, const char *const *sets, int n_sets)
{
    for (int i = 0; i < n_sets; i++) {
        zo_status st = zo_config_set_arg(c, sets[i]);
        if (st < 0)
            return st;
    }
    return ZO_OK;
}

/* Load json (origin names it in messages), apply the "key=value" overrides
 * in order, resolve for world_size ranks and return the effective config as
 * one-line JSON in *out (free with zo_pyconfig_free). On failure the status
 * is returned and err holds the parser's message. */
int zo_pyconfig_resolve(const char *json, const char *origin, const char *const *sets, int n_sets,
                        int64_t world_size, char **out, char *err, size_t cap)
{
    zo_config_t c = NULL;
    zo_status st = zo_config_init(&c);
    if (st < 0)
        return fail(st, err, cap);
    zo_train_config tc = ZO_TRAIN_CONFIG_INIT;
    st = zo_config_load_string(c, json, origin);
    if (st >= 0)
        st = apply_sets(c, sets, n_sets);
    if (st >= 0)
        st = zo_config_resolve(c, world_size, &tc);
    if (st >= 0)
        st = zo_train_config_to_json(&tc, 0, out);
    zo_config_free(c);
    return st < 0 ? fail(st, err, cap) : ZO_OK;
}

void zo_pyconfig_free(void *p)
{
    free(p);
}
