/* The shared units (zo/units.h): the monotonic clock, and byte counts read
 * from and written as text. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "zo_internal.h"

uint64_t zo_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The multiplier of a unit suffix (any case; "" and "B" are bytes), 0 for
 * none. */
static uint64_t unit_multiplier(const char *u)
{
    static const struct {
        const char *suffix;
        uint64_t mult;
    } units[] = {{"", 1},
                 {"B", 1},
                 {"K", 1ull << 10},
                 {"KiB", 1ull << 10},
                 {"KB", 1000ull},
                 {"M", 1ull << 20},
                 {"MiB", 1ull << 20},
                 {"MB", 1000000ull},
                 {"G", 1ull << 30},
                 {"GiB", 1ull << 30},
                 {"GB", 1000000000ull},
                 {"T", 1ull << 40},
                 {"TiB", 1ull << 40},
                 {"TB", 1000000000000ull}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcasecmp(u, units[i].suffix) == 0)
            return units[i].mult;
    return 0;
}

/* An integer is read exactly (a double holds 53 bits); a fraction or an
 * exponent goes through strtod. */
zo_status zo_parse_bytes(const char *text, uint64_t *out)
{
    if (!text || !out)
        return ZO_ERR_INVALID_ARG;
    const char *p = text;
    while (isspace((unsigned char)*p))
        p++;
    if (*p == '+')
        p++;
    if (!isdigit((unsigned char)*p) && *p != '.')
        return ZO_ERR_INVALID_ARG; /* no sign, no "inf", no "nan" */
    char *end;
    errno = 0;
    unsigned long long n = strtoull(p, &end, 10);
    int integer =
        *end != '.' && *end != 'e' && *end != 'E' && !(n == 0 && (*end == 'x' || *end == 'X'));
    if (integer && (errno || end == p))
        return ZO_ERR_INVALID_ARG;
    double v = integer ? 0 : strtod(p, &end);
    while (*end == ' ') /* "512 MiB", as DeepSpeed configs write it */
        end++;
    uint64_t mult = unit_multiplier(end);
    if (mult == 0 || (!integer && (end == p || !(v >= 0))))
        return ZO_ERR_INVALID_ARG;
    if (integer) {
        if (n > UINT64_MAX / mult)
            return ZO_ERR_INVALID_ARG;
        *out = (uint64_t)n * mult;
        return ZO_OK;
    }
    double b = v * (double)mult;
    if (!(b < 18446744073709551616.0))
        return ZO_ERR_INVALID_ARG;
    *out = (uint64_t)b;
    return ZO_OK;
}

char *zo_fmt_bytes_prec(char *buf, size_t cap, uint64_t bytes, int decimals)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, cap, "%" PRIu64 " B", bytes);
    else
        snprintf(buf, cap, "%.*f %s", decimals, v, units[u]);
    return buf;
}

char *zo_fmt_bytes(char *buf, size_t cap, uint64_t bytes)
{
    return zo_fmt_bytes_prec(buf, cap, bytes, 2);
}
