/* The 8-bit moments' dynamic maps and their lookup tables, built once; the
 * public quantize/dequantize of whole moments (the kernels' own encoding,
 * element by element). */
#include <math.h>
#include <pthread.h>

#include "adam_scalar_elem.h"
#include "zo_internal.h"

static zo_q8_tables q8_tables;
static pthread_once_t q8_once = PTHREAD_ONCE_INIT;

/* bitsandbytes' dynamic map (create_dynamic_map, 7 exponent bits): decade
 * i = 0..6 spans 10^(i-6) x [0.1, 1] cut into n = 2^i (signed, per sign) or
 * 2^(i+1) (unsigned) equal parts, each represented by its midpoint
 * dec_a + k dec_b; then 0 and 1: 256 values. */
static void build_decade(zo_q8_map_tables *t, int is_signed, int i)
{
    double n = is_signed ? (double)(1 << i) : (double)(2 << i), decade = pow(10.0, i - 6);
    float a = (float)(decade * (0.1 + 0.45 / n)), b = (float)(decade * 0.9 / n);
    int dec = is_signed ? i + 1 : i + 2; /* the decoder's index: t's leading one */
    t->dec_a[dec] = a;
    t->dec_b[dec] = b;
    if (is_signed) {
        t->dec_a[dec + 8] = -a;
        t->dec_b[dec + 8] = -b;
    }
    int d = i + 1; /* the encoder's level */
    t->inv_b[d] = (float)(1.0 / b);
    t->round_c[d] = (float)(0.5 - (double)a / b);
    t->kmax[d] = (int32_t)n - 1;
    t->code_base[d] = (int32_t)n;
}

/* A level's smallest and largest positive values, decoded. */
static float level_value(const zo_q8_tables *q, int is_signed, int d, int top)
{
    const zo_q8_map_tables *t = &q->t[is_signed];
    uint32_t code = (uint32_t)t->code_base[d] + (top ? (uint32_t)t->kmax[d] : 0u);
    return d == 0 ? 0.0f : zs_q8_unit(q, code, is_signed);
}

/* The decoder's entries again, indexed by t's leading zeros (see
 * zo_q8_map_tables): level L >= 1 has 32 - L of them, level 0 (t = 0) 32;
 * the unsigned map is read with 4-bit indices, the signed one with 5 and
 * bit 4 flipped for the sign. */
static void build_lz_decoder(zo_q8_map_tables *t, int is_signed)
{
    for (int s = 0; s <= is_signed; s++)
        for (int lvl = 0; lvl < (is_signed ? 8 : 9); lvl++) {
            int at = is_signed ? ((32 - lvl) & 31) ^ (s << 4) : (32 - lvl) & 15;
            t->dec_lz_a[at] = t->dec_a[lvl + 8 * s];
            t->dec_lz_b[at] = t->dec_b[lvl + 8 * s];
        }
}

/* One negative signed level's entry at `at`: the sign bit in the base
 * (but level 0 encodes as 0), level 8 (there is no -1) as level 7. The
 * 5-bit entries (at >= 16) hold only kmax and the base: those lookups take
 * k from the magnitude's own level (zv_q8_index). */
static void set_negative_level(zo_q8_map_tables *t, int at, int d)
{
    int from = d == 8 ? 7 : d;
    if (at < 16) {
        t->inv_b[at] = t->inv_b[from];
        t->round_c[at] = t->round_c[from];
    }
    t->kmax[at] = t->kmax[from];
    t->code_base[at] = t->code_base[from] + (from > 0 ? 128 : 0);
}

/* The encoder's entries for negative signed moments: at level + 16 (levels
 * 0..8) and at level + 8 (levels 1..7; 8 + 8 is read as 15). */
static void build_negative_levels(zo_q8_map_tables *t)
{
    for (int d = 0; d < 9; d++)
        set_negative_level(t, d + 16, d);
    for (int d = 1; d < 8; d++)
        set_negative_level(t, d + 8, d);
}

/* The level of a magnitude: the count of level thresholds below it (the
 * +inf of level 8 stops the count). */
static int level_at(const zo_q8_map_tables *t, float a)
{
    int d = 0;
    while (t->lvl_thr[d] < a)
        d++;
    return d;
}

static void build_map(zo_q8_tables *q, int is_signed)
{
    zo_q8_map_tables *t = &q->t[is_signed];
    for (int d = 0; d < 16; d++) {
        t->lvl_thr[d] = INFINITY;
        t->round_c[d] = 0.5f; /* levels 0 and 8 (and unused ones): k = 0 */
    }
    t->code_base[8] = is_signed ? 128 : 1; /* one */
    t->dec_a[is_signed ? 8 : 1] = 1.0f;
    for (int i = 0; i < 7; i++)
        build_decade(t, is_signed, i);
    for (int d = 0; d < 8; d++) {
        float lo = level_value(q, is_signed, d, 1), hi = level_value(q, is_signed, d + 1, 0);
        t->lvl_thr[d] = (float)(((double)lo + hi) / 2.0);
    }
    for (int e = 0; e < ZO_Q8_NBINADES; e++)
        t->lvl_of_binade[e] = level_at(t, ldexpf(1.0f, e + ZO_Q8_EXP_FIRST - 127));
    for (int j = 0; j < 128; j++)
        t->lvl_of_bibinade[j] = (uint8_t)level_at(t, j ? ldexpf(1.0f, 2 * j - 127) : 0.0f);
    build_lz_decoder(t, is_signed);
    if (is_signed) {
        build_negative_levels(t);
        /* one's k, clamped to kmax: 0 for +1 at level 8, 63 for -1 at
         * level 8 + 16 (the top of negative level 7), which lets the 5-bit
         * encoder take k from the magnitude's level alone (zv_q8_index) */
        t->round_c[8] = (float)t->kmax[7] + 0.5f;
    }
    for (int d = 0; d < 32; d++) {
        t->kmax_w[d] = (int16_t)t->kmax[d];
        t->code_base_w[d] = (int16_t)t->code_base[d];
    }
    for (uint32_t c = 0; c < 256; c++) {
        q->map[is_signed][c] = zs_q8_unit(q, c, is_signed);
        for (int p = 0; p < 4; p++)
            q->map_bytes[is_signed][p][c] = (uint8_t)(zo_f32_bits(q->map[is_signed][c]) >> 8 * p);
    }
}

static void build_tables(void)
{
    build_map(&q8_tables, 0);
    build_map(&q8_tables, 1);
}

const zo_q8_tables *zo_q8_tables_get(void)
{
    pthread_once(&q8_once, build_tables);
    return &q8_tables;
}

const float *zo_adam_q8_map(int is_signed)
{
    return zo_q8_tables_get()->map[is_signed != 0];
}

zo_status zo_adam_q8_quantize(const float *x, size_t n, int is_signed, uint8_t *codes,
                              float *absmax)
{
    if (n && (!x || !codes || !absmax))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim", "zo_adam_q8_quantize: %s is NULL",
                       !x       ? "x"
                       : !codes ? "codes"
                                : "absmax");
    const zo_q8_tables *q = zo_q8_tables_get();
    is_signed = is_signed != 0;
    for (size_t b0 = 0; b0 < n; b0 += ZO_ADAM_Q8_BLOCK) {
        size_t e = n - b0 < ZO_ADAM_Q8_BLOCK ? n : b0 + ZO_ADAM_Q8_BLOCK;
        uint32_t most = 0;
        for (size_t i = b0; i < e; i++) {
            uint32_t a = zo_f32_bits(x[i]) & 0x7fffffffu;
            most = a > most ? a : most;
        }
        float scale = zs_q8_scale_of(most);
        absmax[b0 / ZO_ADAM_Q8_BLOCK] = scale;
        zs_q8_encode_elems(q, x, codes, b0, e, zs_q8_inv(scale), is_signed);
    }
    return ZO_OK;
}

zo_status zo_adam_q8_dequantize(const uint8_t *codes, const float *absmax, size_t n, int is_signed,
                                float *x)
{
    if (n && (!x || !codes || !absmax))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim", "zo_adam_q8_dequantize: %s is NULL",
                       !x       ? "x"
                       : !codes ? "codes"
                                : "absmax");
    const zo_q8_tables *q = zo_q8_tables_get();
    for (size_t i = 0; i < n; i++)
        x[i] = zs_q8_decode(q, codes[i], is_signed != 0, absmax[i / ZO_ADAM_Q8_BLOCK]);
    return ZO_OK;
}
