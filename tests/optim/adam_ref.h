/* Test helpers for the optimizer: input generation and a double-precision
 * reference Adam/AdamW step. */
#ifndef ZO_TEST_ADAM_REF_H
#define ZO_TEST_ADAM_REF_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zo/half.h"
#include "zo/optim.h"
#include "zo_test.h"

/* Host buffers of one test problem, with the inputs kept for the reference. */
typedef struct adam_case {
    size_t n;
    zo_dtype gt, st, ot;
    void *grad, *m, *v, *out;
    float *master;
    double *rp, *rm, *rv; /* reference state */
    zo_adam_buffers b;
} adam_case;

static inline double ref_load(const void *base, zo_dtype t, size_t i)
{
    switch (t) {
    case ZO_DTYPE_F16: return zo_f16_to_f32(((const uint16_t *)base)[i]);
    case ZO_DTYPE_BF16: return zo_bf16_to_f32(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

static inline void case_store(void *base, zo_dtype t, size_t i, float x)
{
    if (t == ZO_DTYPE_F32)
        ((float *)base)[i] = x;
    else if (t == ZO_DTYPE_BF16)
        ((uint16_t *)base)[i] = zo_f32_to_bf16(x);
    else
        ((uint16_t *)base)[i] = zo_f32_to_f16(x);
}

static inline double rand_unit(uint64_t *s)
{
    return (double)(zo_test_rand(s) >> 11) * 0x1p-53;
}

/* A value of varied magnitude: mostly ordinary, some tiny, some huge, some
 * zeros of either sign. kind_range limits the exponent (fp16 holds less). */
static inline float rand_value(uint64_t *s, int tiny_exp, int huge_exp)
{
    double r = rand_unit(s) * 2.0 - 1.0;
    switch (zo_test_rand(s) % 10) {
    case 0: return (float)ldexp(r, tiny_exp);
    case 1: return (float)ldexp(r, huge_exp);
    case 2: return (zo_test_rand(s) & 1) ? 0.0f : -0.0f;
    default: return (float)(r * ldexp(1.0, (int)(zo_test_rand(s) % 20) - 15));
    }
}

static inline void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz);
    assert_non_null(p);
    return p;
}

static inline void case_alloc(adam_case *c, size_t n, zo_dtype gt, zo_dtype st, zo_dtype ot)
{
    memset(c, 0, sizeof *c);
    c->n = n;
    c->gt = gt;
    c->st = st;
    c->ot = ot;
    c->grad = xcalloc(n, zo_dtype_size(gt));
    c->master = xcalloc(n, sizeof(float));
    c->m = xcalloc(n, zo_dtype_size(st));
    c->v = xcalloc(n, zo_dtype_size(st));
    c->out = ot == ZO_DTYPE_NONE ? NULL : xcalloc(n, zo_dtype_size(ot));
    c->rp = xcalloc(n, sizeof(double));
    c->rm = xcalloc(n, sizeof(double));
    c->rv = xcalloc(n, sizeof(double));
    c->b = (zo_adam_buffers)ZO_ADAM_BUFFERS_INIT;
    c->b.n = n;
    c->b.grad = c->grad;
    c->b.grad_type = gt;
    c->b.master = c->master;
    c->b.m = c->m;
    c->b.v = c->v;
    c->b.state_type = st;
    c->b.out = c->out;
    c->b.out_type = ot;
}

static inline void case_free(adam_case *c)
{
    free(c->grad);
    free(c->master);
    free(c->m);
    free(c->v);
    free(c->out);
    free(c->rp);
    free(c->rm);
    free(c->rv);
}

/* New gradients; the 16-bit ranges are kept within what the type holds. */
static inline void case_fill_grads(adam_case *c, uint64_t *s)
{
    int tiny = c->gt == ZO_DTYPE_F16 ? -20 : -100, huge = c->gt == ZO_DTYPE_F16 ? 14 : 40;
    for (size_t i = 0; i < c->n; i++)
        case_store(c->grad, c->gt, i, rand_value(s, tiny, huge));
}

/* Random master, m and v >= 0 (v is a mean of squares); the reference
 * starts from exactly the stored values. */
static inline void case_fill_state(adam_case *c, uint64_t *s)
{
    for (size_t i = 0; i < c->n; i++) {
        c->master[i] = rand_value(s, -60, 30);
        case_store(c->m, c->st, i, rand_value(s, -60, 20));
        case_store(c->v, c->st, i, fabsf(rand_value(s, -60, 40)));
        c->rp[i] = c->master[i];
        c->rm[i] = ref_load(c->m, c->st, i);
        c->rv[i] = ref_load(c->v, c->st, i);
    }
}

/* The reference step, in double, from the reference state. */
static inline void ref_adam_step(adam_case *c, const zo_adam_params *p)
{
    double b1 = p->beta1, b2 = p->beta2, lr = p->lr, wd = p->weight_decay;
    double bc1 = p->bias_correction ? 1.0 - pow(b1, (double)p->step) : 1.0;
    double bc2 = p->bias_correction ? 1.0 - pow(b2, (double)p->step) : 1.0;
    for (size_t i = 0; i < c->n; i++) {
        double g = ref_load(c->grad, c->gt, i) * (double)p->grad_scale;
        double w = c->rp[i];
        if (!p->adamw && wd != 0.0) /* as PyTorch: no 0 * w, NaN for w = inf */
            g += wd * w;
        double m = b1 * c->rm[i] + (1.0 - b1) * g;
        double v = b2 * c->rv[i] + (1.0 - b2) * g * g;
        if (p->adamw)
            w *= 1.0 - lr * wd;
        w -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + (double)p->eps);
        c->rp[i] = w;
        c->rm[i] = m;
        c->rv[i] = v;
    }
}

#endif
