/* optim/ internals: the table each SIMD variant fills, and the constants a
 * step derives once from zo_adam_params. */
#ifndef ZO_OPTIM_INTERNAL_H
#define ZO_OPTIM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "zo/optim.h"

/* The 8-bit maps as arithmetic over small tables (adam_q8.c), so the SIMD
 * code needs no 256-entry gathers. A value's "level" d is 0 for zero, 1..7
 * for the decades 10^(d-7) x [0.1, 1], 8 for 1.0. Codes are laid out by
 * level, as the map's own structure is (the dynamic type's leading one
 * marks the decade):
 *   unsigned: 0 zero, 1 one, decade i at [2^(i+1), 2^(i+2)), 2^(i+1) values
 *   signed:   bit 7 the sign and t = the low 7 bits: t = 0 zero (sign 0) or
 *             one (sign 1: there is no -1), decade i at t in [2^i, 2^(i+1))
 * Decoding: t's leading one gives the level, t - 2^floor(log2 t) the index
 * k in the decade, and the value is fma(dec_b, k, dec_a) from the level's
 * (and sign's) entry; dec_lz_* hold the same entries indexed by t's count
 * of leading zeros (32 for t = 0), bit 4 flipped for the sign, for
 * variants with a vector lzcnt.
 * Encoding a magnitude a: its fp32 exponent minus ZO_Q8_EXP_FIRST, floored
 * at 0 (a saturating subtract) and taken mod 32 (the 5-bit index of a
 * two-register permute), picks a binade, whose lower edge's level is
 * lvl_of_binade (a binade is narrower than a decade, so it holds at most
 * one level threshold: one compare with lvl_thr finishes the level). The
 * encoding entries are indexed by the level; a negative signed moment's
 * (whose bases carry the sign bit, whose level 8 is its level 7: there is
 * no -1, and whose level 0 encodes as 0) are at min(level + 8, 15) for
 * 4-bit lookups (levels 1..8 only), and kmax and code_base also at level
 * + 16 for 5-bit ones, which take inv_b and round_c by the magnitude's
 * level alone (the signed map's level 8 has round_c = kmax[7] + 0.5, so
 * that -1 clamps to negative level 7's top through kmax[24]):
 * k = the nearest index, fma(a, inv_b, round_c) truncated and clamped to
 * [0, kmax], and the code is code_base + k.
 * Every level first takes a magnitude above one (inf and NaN included) as
 * one: beyond the map, a value encodes as the map's end of its sign (the
 * code of 1, or of -0.993 in the signed map, which has no -1). A moment
 * times 1 / its block's absmax is at most 1 plus rounding, so a step
 * never meets the clamp unless a moment is not finite; it makes the
 * levels agree on every input, where their tables (binades that wrap mod
 * 32 from 4 on, bibinades that do not) would otherwise each make
 * something else of values they were not built for. */
#define ZO_Q8_EXP_FIRST (127 - 30) /* binade 0 is [2^-30, 2^-29) and all below */
#define ZO_Q8_ONE_BITS  0x3f800000 /* 1.0f: the largest magnitude encoded as itself */
#define ZO_Q8_NBINADES  32         /* ... binade 31: [2, 4) */

typedef struct zo_q8_map_tables {
    float dec_a[16], dec_b[16]; /* by level (+ 8 for the signed map's sign bit) */
    float dec_lz_a[32], dec_lz_b[32];
    float lvl_thr[16]; /* the midpoint between level d's top and d+1's bottom */
    float inv_b[16], round_c[16];
    int32_t kmax[32], code_base[32];
    int16_t kmax_w[32], code_base_w[32]; /* the same, for 16-bit lanes */
    int32_t lvl_of_binade[ZO_Q8_NBINADES];
    /* by a magnitude's top byte (its exponent over 2): the level of the
     * lower edge of [2^(2j-127), 2^(2j-125)), which holds at most one
     * level threshold too (decades are wider than 4x), for variants with
     * byte permutes; no wrap, 0 and NaN included */
    uint8_t lvl_of_bibinade[128] __attribute__((aligned(64)));
} zo_q8_map_tables;

typedef struct zo_q8_tables {
    zo_q8_map_tables t[2]; /* [is_signed] */
    float map[2][256];     /* [is_signed][code]: the decoded values */
    /* [is_signed][p][code]: byte p (little-endian) of map's value, for
     * variants with byte permutes, which look up 64 codes at once */
    uint8_t map_bytes[2][4][256] __attribute__((aligned(64)));
} zo_q8_tables;

/* Built once, on first use; thread-safe. */
const zo_q8_tables *zo_q8_tables_get(void);

/* Per-step constants, computed once so every variant and every tile uses
 * exactly the same fp32 values. */
typedef struct zo_adam_consts {
    float beta1, beta2;
    float one_minus_beta1, one_minus_beta2;
    float step_size;    /* lr / bias_correction1 */
    float inv_sqrt_bc2; /* 1 / sqrt(bias_correction2) */
    float eps;
    float decay; /* AdamW: 1 - lr*wd; Adam: 1 */
    float l2;    /* Adam: wd; AdamW: 0 */
    float grad_scale;
    const zo_q8_tables *q8;
} zo_adam_consts;

/* Gradient sums of squares are taken per this many elements and added in
 * element order, whatever the pool's tiles and threads, so a norm is the
 * same bits however it was computed. */
#define ZO_NORM_BLOCK ((size_t)16384)

typedef struct zo_optim_kernels {
    const char *name;
    /* Update elements [begin, end) of b. */
    void (*adam)(const zo_adam_consts *c, const zo_adam_buffers *b, size_t begin, size_t end);
    /* Sum of squares of elements [begin, end), lanes in double, combined in lane order. */
    double (*sum_sq)(const void *grad, zo_dtype type, size_t begin, size_t end);
    /* The roofline: the same loads and stores as adam, no arithmetic. */
    void (*roofline)(const zo_adam_buffers *b, size_t begin, size_t end);
    /* The 8-bit encoder of the step, on n values already divided by their
     * absmax (for tests: zo_test_adam_q8_encode). */
    void (*q8_encode)(const float *x, size_t n, int is_signed, uint8_t *codes);
} zo_optim_kernels;

/* Elements [begin, end) of b updated by k: in place for a fused state
 * format, else block by block through the format's codec (state_format.c). */
void zo_adam_run(const zo_optim_kernels *k, const zo_adam_consts *c, const zo_adam_buffers *b,
                 size_t begin, size_t end);
/* ... the second way for any format (the tests hold it to the fused kernels). */
void zo_adam_run_unfused(const zo_optim_kernels *k, const zo_adam_consts *c,
                         const zo_adam_buffers *b, size_t begin, size_t end);
/* The roofline has the fused formats' loads and stores only: refused for another. */
zo_status zo_adam_roofline_check(const zo_adam_buffers *b);

extern const zo_optim_kernels zo_optim_kernels_scalar;
#if defined(__x86_64__)
extern const zo_optim_kernels zo_optim_kernels_avx2;
extern const zo_optim_kernels zo_optim_kernels_avx512;
extern const zo_optim_kernels zo_optim_kernels_avx512_bf16;
#endif
#if defined(__aarch64__)
extern const zo_optim_kernels zo_optim_kernels_neon;
#endif

/* The kernels for simd_level (-1: the library's level); fails on a level
 * this CPU cannot run. */
zo_status zo_optim_kernels_get(int simd_level, const zo_optim_kernels **out);
zo_status zo_adam_consts_make(const zo_adam_params *p, zo_adam_consts *c);
zo_status zo_adam_buffers_check(const zo_adam_buffers *b);
zo_status zo_grad_check(const void *grad, zo_dtype type, size_t n);

#endif
