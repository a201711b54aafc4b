/* Environment tunables and small utilities. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "zo_internal.h"

int64_t zo_env_int(const char *name, int64_t def, int64_t min, int64_t max)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return def;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    /* Accept a binary size suffix (K, M, G, T) for byte-valued tunables. */
    if (end && *end && !end[1]) {
        int shift = 0;
        switch (*end) {
        case 'k':
        case 'K': shift = 10; break;
        case 'm':
        case 'M': shift = 20; break;
        case 'g':
        case 'G': shift = 30; break;
        case 't':
        case 'T': shift = 40; break;
        default: shift = -1;
        }
        if (shift > 0 && v <= (INT64_MAX >> shift)) {
            v <<= shift;
            end++;
        }
    }
    if (errno || end == s || *end || v < min || v > max) {
        ZO_LOGW("core",
                "%s='%s' is invalid: expected an integer in [%" PRId64 ", %" PRId64
                "]; using %" PRId64,
                name, s, min, max, def);
        return def;
    }
    return (int64_t)v;
}

double zo_env_double(const char *name, double def, double min, double max)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return def;
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= min && v <= max)) {
        ZO_LOGW("core", "%s='%s' is invalid: expected a number in [%g, %g]; using %g", name, s, min,
                max, def);
        return def;
    }
    return v;
}

const char *zo_env_str(const char *name, const char *def)
{
    const char *s = getenv(name);
    return (s && *s) ? s : def;
}

int zo_env_bool(const char *name, int def)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return def;
    static const char *yes[] = {"1", "true", "yes", "on"};
    static const char *no[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0)
            return 1;
        if (strcasecmp(s, no[i]) == 0)
            return 0;
    }
    ZO_LOGW("core", "%s='%s' is invalid: expected 1|0|true|false|yes|no|on|off; using %d", name, s,
            def);
    return def;
}
