/* zoffload: checked arithmetic for sizes computed from user input, in one
 * place for the library and the tools. A size that would wrap (a flag of
 * 2^62, three large factors) is an error naming its inputs, never a wrapped
 * value, a division by zero or a negative byte count in a plan. */
#ifndef ZO_CHECKED_H
#define ZO_CHECKED_H

#include <stdint.h>

/* The largest chunk the engine takes (1 TiB): far above any device's memory,
 * and small enough that every tier's count of chunks times chunk bytes, and
 * its rounding to 4 KiB, fits in 64 bits. */
#define ZO_MAX_CHUNK_BYTES (1ull << 40)

/* *out = a * b; 1 when it fits, 0 (and *out unchanged) when it would wrap. */
static inline int zo_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r))
        return 0;
    *out = r;
    return 1;
}

/* *out = a + b; 1 when it fits, 0 (and *out unchanged) when it would wrap. */
static inline int zo_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r))
        return 0;
    *out = r;
    return 1;
}

/* *out = a * b * c * d with every step checked (1: fits, 0: would wrap). */
static inline int zo_mul4_u64(uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t *out)
{
    uint64_t ab, abc;
    return zo_mul_u64(a, b, &ab) && zo_mul_u64(ab, c, &abc) && zo_mul_u64(abc, d, out);
}

#endif
