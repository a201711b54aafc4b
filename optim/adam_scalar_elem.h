/* The per-element Adam update and loads/stores in plain C. It is the whole
 * scalar variant and the tail of every SIMD variant; the SIMD loops perform
 * exactly these fp32 operations in this order, so all variants agree bit for
 * bit. Included by each variant's file, compiled with that file's flags. */
#ifndef ZO_ADAM_SCALAR_ELEM_H
#define ZO_ADAM_SCALAR_ELEM_H

#include <math.h>
#include <stdint.h>

#include "optim_internal.h"
#include "zo/half.h"

static inline float zs_load(const void *base, zo_dtype t, size_t i)
{
    switch (t) {
    case ZO_DTYPE_F16: return zo_f16_to_f32(((const uint16_t *)base)[i]);
    case ZO_DTYPE_BF16: return zo_bf16_to_f32(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

static inline void zs_store(void *base, zo_dtype t, size_t i, float x)
{
    switch (t) {
    case ZO_DTYPE_F16: ((uint16_t *)base)[i] = zo_f32_to_f16(x); break;
    case ZO_DTYPE_BF16: ((uint16_t *)base)[i] = zo_f32_to_bf16(x); break;
    case ZO_DTYPE_F32: ((float *)base)[i] = x; break;
    default: break;
    }
}

/* The update of one element in fp32, from its gradient as stored and its
 * moments as decoded; every variant's loop performs these operations in
 * this order. Without an L2 term (AdamW, or Adam without weight decay) g
 * is left alone rather than given 0 * w, which is NaN for an infinite
 * weight: AdamW then keeps w = inf (decay and step leave it inf) as
 * PyTorch and the double reference do, and its moments stay finite, so
 * an 8-bit block's scale is not poisoned by one weight. */
static inline void zs_adam_math(const zo_adam_consts *c, float graw, float m0, float v0, float *p,
                                float *m, float *v)
{
    float g = graw * c->grad_scale;
    if (c->l2 != 0.0f)
        g = fmaf(c->l2, *p, g);
    *m = fmaf(c->beta1, m0, c->one_minus_beta1 * g);
    *v = fmaf(c->beta2, v0, (c->one_minus_beta2 * g) * g);
    float denom = fmaf(sqrtf(*v), c->inv_sqrt_bc2, c->eps);
    *p = fmaf(-c->step_size, *m / denom, *p * c->decay);
}

static inline void zs_adam_elems(const zo_adam_consts *c, const zo_adam_buffers *b, size_t begin,
                                 size_t end)
{
    for (size_t i = begin; i < end; i++) {
        float p = b->master[i], m, v;
        zs_adam_math(c, zs_load(b->grad, b->grad_type, i), zs_load(b->m, b->state_type, i),
                     zs_load(b->v, b->state_type, i), &p, &m, &v);
        b->master[i] = p;
        zs_store(b->m, b->state_type, i, m);
        zs_store(b->v, b->state_type, i, v);
        zs_store(b->out, b->out_type, i, p);
    }
}

/* ---- 8-bit moments: the scalar forms of the vector code in adam_simd.h ---- */

/* fp32 -> int32 as x86's CVTTPS2DQ: truncation, INT32_MIN when out of
 * range or NaN. Every variant's zi_cvtt gives the same (NEON's conversion
 * saturates instead, so adam_neon.c replaces those lanes). The encoder's
 * argument stays in range since magnitudes above one are taken as one
 * (zs_q8_code); the agreement keeps it so should that change. */
static inline int32_t zs_cvtt(float x)
{
    return x > -2147483648.0f && x < 2147483648.0f ? (int32_t)x : INT32_MIN;
}

static inline int32_t zs_min(int32_t a, int32_t b)
{
    return a < b ? a : b;
}
static inline int32_t zs_max(int32_t a, int32_t b)
{
    return a > b ? a : b;
}

/* The code of x (a moment already multiplied by 1/absmax); see
 * zo_q8_map_tables. The same steps as the vector code. A magnitude beyond
 * the map's end (above one, inf and NaN included: their bits are larger
 * as integers) is taken as one, so it encodes as the map's end of its
 * sign (zo_q8_map_tables): every level gives the same code for every
 * input, whatever its tables would make of values they were not built
 * for, and no conversion leaves int32's range. */
static inline uint32_t zs_q8_code(const zo_q8_tables *q, float x, int is_signed)
{
    const zo_q8_map_tables *t = &q->t[is_signed];
    uint32_t bits = zo_f32_bits(x), a = bits & 0x7fffffffu;
    a = a < ZO_Q8_ONE_BITS ? a : ZO_Q8_ONE_BITS;
    int32_t e = zs_max((int32_t)(a >> 23) - ZO_Q8_EXP_FIRST, 0) & (ZO_Q8_NBINADES - 1);
    int32_t d = t->lvl_of_binade[e];
    float af = zo_bits_f32(a);
    d += af > t->lvl_thr[d];
    if (is_signed && (bits >> 31) && d > 0)
        d = zs_min(d + 8, 15); /* a negative level's entries; level 8 is 7 */
    int32_t k = zs_min(zs_max(zs_cvtt(fmaf(af, t->inv_b[d], t->round_c[d])), 0), t->kmax[d]);
    return (uint32_t)(t->code_base[d] + k);
}

/* The value of a code times scale. */
static inline float zs_q8_unit(const zo_q8_tables *q, uint32_t code, int is_signed)
{
    const zo_q8_map_tables *t = &q->t[is_signed];
    uint32_t tt = is_signed ? code & 127u : code, s = is_signed ? code >> 7 : 0u;
    uint32_t fb = zo_f32_bits((float)(int32_t)tt);
    int32_t lvl = zs_max((int32_t)(fb >> 23) - 126, 0) + (int32_t)(s << 3);
    float k = (float)(int32_t)tt - zo_bits_f32(fb & 0xff800000u);
    return fmaf(t->dec_b[lvl], k, t->dec_a[lvl]);
}

static inline float zs_q8_decode(const zo_q8_tables *q, uint8_t code, int is_signed, float scale)
{
    return zs_q8_unit(q, code, is_signed) * scale;
}

/* What a block's absmax is stored as, and what its moments are multiplied
 * by before encoding: below FLT_MIN the block is stored as zeros. */
static inline float zs_q8_scale_of(uint32_t absmax_bits)
{
    return absmax_bits < 0x00800000u ? 0.0f : zo_bits_f32(absmax_bits);
}
static inline float zs_q8_inv(float scale)
{
    return scale == 0.0f ? 0.0f : 1.0f / scale;
}

/* Elements [begin, end) of the 8-bit block starting at b0: decode, update,
 * write master and out, keep the new moments in mbuf/vbuf (indexed from b0)
 * and fold their magnitudes' bits into *mmax, *vmax. */
static inline void zs_adam_q8_elems(const zo_adam_consts *c, const zo_adam_buffers *b, size_t b0,
                                    size_t begin, size_t end, float ms, float vs, float *mbuf,
                                    float *vbuf, uint32_t *mmax, uint32_t *vmax)
{
    const uint8_t *mc = b->m, *vc = b->v;
    for (size_t i = begin; i < end; i++) {
        float p = b->master[i], m, v;
        zs_adam_math(c, zs_load(b->grad, b->grad_type, i), zs_q8_decode(c->q8, mc[i], 1, ms),
                     zs_q8_decode(c->q8, vc[i], 0, vs), &p, &m, &v);
        b->master[i] = p;
        zs_store(b->out, b->out_type, i, p);
        mbuf[i - b0] = m;
        vbuf[i - b0] = v;
        uint32_t ma = zo_f32_bits(m) & 0x7fffffffu, va = zo_f32_bits(v) & 0x7fffffffu;
        *mmax = ma > *mmax ? ma : *mmax;
        *vmax = va > *vmax ? va : *vmax;
    }
}

static inline void zs_q8_encode_elems(const zo_q8_tables *q, const float *buf, uint8_t *codes,
                                      size_t begin, size_t end, float inv, int is_signed)
{
    for (size_t i = begin; i < end; i++)
        codes[i] = (uint8_t)zs_q8_code(q, buf[i] * inv, is_signed);
}

/* Squares are exact in double (24-bit mantissas), so only the order of the
 * additions matters. */
static inline double zs_sum_sq(const void *grad, zo_dtype t, size_t begin, size_t end)
{
    double acc = 0.0;
    for (size_t i = begin; i < end; i++) {
        double x = zs_load(grad, t, i);
        acc += x * x;
    }
    return acc;
}

/* The roofline's tail: copies bits, no conversion. */
static inline void zs_move_bits(void *base, size_t esize, size_t i)
{
    if (esize == 4) {
        volatile uint32_t *q = (volatile uint32_t *)base + i;
        *q = *q;
    } else if (esize == 2) {
        volatile uint16_t *q = (volatile uint16_t *)base + i;
        *q = *q;
    } else {
        volatile uint8_t *q = (volatile uint8_t *)base + i;
        *q = *q;
    }
}

static inline void zs_roofline_elems(const zo_adam_buffers *b, size_t begin, size_t end)
{
    size_t gs = zo_dtype_size(b->grad_type), ss = zo_dtype_size(b->state_type);
    for (size_t i = begin; i < end; i++) {
        uint32_t g = gs == 4 ? ((const volatile uint32_t *)b->grad)[i]
                             : ((const volatile uint16_t *)b->grad)[i];
        zs_move_bits(b->master, 4, i);
        zs_move_bits(b->m, ss, i);
        zs_move_bits(b->v, ss, i);
        if (b->out_type == ZO_DTYPE_F32) /* fp32 parameters: the master's bits */
            ((volatile uint32_t *)b->out)[i] = ((const volatile uint32_t *)b->master)[i];
        else if (b->out)
            ((volatile uint16_t *)b->out)[i] = (uint16_t)g;
    }
}

#endif
