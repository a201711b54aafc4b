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

static inline void zs_adam_elems(const zo_adam_consts *c, const zo_adam_buffers *b, size_t begin,
                                 size_t end)
{
    for (size_t i = begin; i < end; i++) {
        float p = b->master[i];
        float g = zs_load(b->grad, b->grad_type, i) * c->grad_scale;
        g = fmaf(c->l2, p, g);
        float m = fmaf(c->beta1, zs_load(b->m, b->state_type, i), c->one_minus_beta1 * g);
        float v = fmaf(c->beta2, zs_load(b->v, b->state_type, i), (c->one_minus_beta2 * g) * g);
        float denom = fmaf(sqrtf(v), c->inv_sqrt_bc2, c->eps);
        p = fmaf(-c->step_size, m / denom, p * c->decay);
        b->master[i] = p;
        zs_store(b->m, b->state_type, i, m);
        zs_store(b->v, b->state_type, i, v);
        zs_store(b->out, b->out_type, i, p);
    }
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
    } else {
        volatile uint16_t *q = (volatile uint16_t *)base + i;
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
        if (b->out)
            ((volatile uint16_t *)b->out)[i] = (uint16_t)g;
    }
}

#endif
