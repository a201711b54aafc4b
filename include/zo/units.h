/* zoffload: the units every part and tool shares: a monotonic clock, and
 * byte counts read from and written as text ("24GiB", "1.50 GiB"). One
 * implementation each, so that every flag reads sizes the same way. */
#ifndef ZO_UNITS_H
#define ZO_UNITS_H

#include <stddef.h>
#include <stdint.h>

#include "zo/api.h"
#include "zo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* CLOCK_MONOTONIC in nanoseconds. */
ZO_API uint64_t zo_now_ns(void);

/* The same clock in seconds, for timing what tools measure. */
static inline double zo_now_s(void)
{
    return (double)zo_now_ns() * 1e-9;
}

/* A byte count from text: a number (an integer is read exactly; a fraction,
 * "1.5GiB", is rounded down to whole bytes), then spaces and a unit if any,
 * in any case: none or B for bytes; K, M, G, T, KiB, MiB, GiB, TiB for
 * powers of 1024; KB, MB, GB, TB for powers of 1000. Refused: signs other
 * than a leading '+', other text, counts of 2^64 or more. ZO_ERR_INVALID_ARG
 * then, *out untouched and no error recorded: the caller's message names its
 * flag or key and the form it expects. */
ZO_API zo_status zo_parse_bytes(const char *text, uint64_t *out);

/* A byte count for people into buf ("512 B", "1.50 GiB": B up to 1023,
 * then KiB .. PiB with two decimals); returns buf. */
ZO_API char *zo_fmt_bytes(char *buf, size_t cap, uint64_t bytes);
/* The same with `decimals` digits after the point ("1.5 GiB" for 1). */
ZO_API char *zo_fmt_bytes_prec(char *buf, size_t cap, uint64_t bytes, int decimals);

#ifdef __cplusplus
}
#endif
#endif
