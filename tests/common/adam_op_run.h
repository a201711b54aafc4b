/* zo_op_adam on a device's stream from host inputs, results read back: the
 * cpu test (tests/optim/test_adam_op.c) compares it with zo_adam_step on the
 * host, the cuda test (tests/kernels/test_ops_cuda.c) the cuda device's run
 * with the cpu device's, bit for bit. */
#ifndef ZO_TEST_ADAM_OP_RUN_H
#define ZO_TEST_ADAM_OP_RUN_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zo/half.h"
#include "zo/optim.h"
#include "zo_test.h"

/* Host bytes of one step: inputs (grad, master, m, v, out, scales) and, after
 * a run, the same buffers updated. */
typedef struct adam_op_bufs {
    size_t n;
    zo_dtype gt, st, ot;
    void *grad, *m, *v, *out;
    float *master, *m_absmax, *v_absmax;
} adam_op_bufs;

static inline void *adam_op_xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    assert_non_null(p);
    return p;
}

static inline size_t adam_op_scales(const adam_op_bufs *h)
{
    return h->st == ZO_DTYPE_I8 ? zo_adam_q8_blocks(h->n) : 0;
}

static inline adam_op_bufs adam_op_bufs_alloc(size_t n, zo_dtype gt, zo_dtype st, zo_dtype ot)
{
    adam_op_bufs h = {n, gt, st, ot, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    h.grad = adam_op_xcalloc(n, zo_dtype_size(gt));
    h.master = adam_op_xcalloc(n, sizeof(float));
    h.m = adam_op_xcalloc(n, zo_dtype_size(st));
    h.v = adam_op_xcalloc(n, zo_dtype_size(st));
    h.out = ot == ZO_DTYPE_NONE ? NULL : adam_op_xcalloc(n, zo_dtype_size(ot));
    if (st == ZO_DTYPE_I8) {
        h.m_absmax = adam_op_xcalloc(adam_op_scales(&h), sizeof(float));
        h.v_absmax = adam_op_xcalloc(adam_op_scales(&h), sizeof(float));
    }
    return h;
}

static inline void adam_op_bufs_free(adam_op_bufs *h)
{
    free(h->grad), free(h->master), free(h->m), free(h->v), free(h->out);
    free(h->m_absmax), free(h->v_absmax);
    memset(h, 0, sizeof *h);
}

static inline adam_op_bufs adam_op_bufs_copy(const adam_op_bufs *a)
{
    adam_op_bufs h = adam_op_bufs_alloc(a->n, a->gt, a->st, a->ot);
    memcpy(h.grad, a->grad, a->n * zo_dtype_size(a->gt));
    memcpy(h.master, a->master, a->n * sizeof(float));
    memcpy(h.m, a->m, a->n * zo_dtype_size(a->st));
    memcpy(h.v, a->v, a->n * zo_dtype_size(a->st));
    if (h.out)
        memcpy(h.out, a->out, a->n * zo_dtype_size(a->ot));
    if (h.m_absmax) {
        memcpy(h.m_absmax, a->m_absmax, adam_op_scales(a) * sizeof(float));
        memcpy(h.v_absmax, a->v_absmax, adam_op_scales(a) * sizeof(float));
    }
    return h;
}

static inline void adam_op_store(void *base, zo_dtype t, size_t i, float x)
{
    if (t == ZO_DTYPE_F32)
        ((float *)base)[i] = x;
    else if (t == ZO_DTYPE_BF16)
        ((uint16_t *)base)[i] = zo_f32_to_bf16(x);
    else if (t == ZO_DTYPE_F16)
        ((uint16_t *)base)[i] = zo_f32_to_f16(x);
}

/* A value of varied magnitude: ordinary, tiny (subnormal in fp32 for
 * tiny_exp < -126), huge, zeros of either sign. */
static inline float adam_op_value(uint64_t *s, int tiny_exp, int huge_exp)
{
    double r = (double)(zo_test_rand(s) >> 11) * 0x1p-53 * 2.0 - 1.0;
    switch (zo_test_rand(s) % 10) {
    case 0: return (float)ldexp(r, tiny_exp);
    case 1: return (float)ldexp(r, huge_exp);
    case 2: return (zo_test_rand(s) & 1) ? 0.0f : -0.0f;
    default: return (float)(r * ldexp(1.0, (int)(zo_test_rand(s) % 20) - 15));
    }
}

/* Random inputs; I8 moments as the quantizer stores them. */
static inline void adam_op_fill(adam_op_bufs *h, uint64_t *s)
{
    int f16 = h->gt == ZO_DTYPE_F16;
    float *mf = adam_op_xcalloc(h->n, sizeof(float)), *vf = adam_op_xcalloc(h->n, sizeof(float));
    for (size_t i = 0; i < h->n; i++) {
        adam_op_store(h->grad, h->gt, i, adam_op_value(s, f16 ? -20 : -140, f16 ? 14 : 40));
        h->master[i] = adam_op_value(s, -140, 30);
        mf[i] = adam_op_value(s, -60, 20);
        vf[i] = fabsf(adam_op_value(s, -60, 40));
        if (h->st != ZO_DTYPE_I8) {
            adam_op_store(h->m, h->st, i, mf[i]);
            adam_op_store(h->v, h->st, i, vf[i]);
        }
    }
    if (h->st == ZO_DTYPE_I8) {
        assert_int_equal(zo_adam_q8_quantize(mf, h->n, 1, h->m, h->m_absmax), ZO_OK);
        assert_int_equal(zo_adam_q8_quantize(vf, h->n, 0, h->v, h->v_absmax), ZO_OK);
    }
    free(mf), free(vf);
}

static inline zo_adam_buffers adam_op_buffers_of(const adam_op_bufs *h)
{
    zo_adam_buffers b = ZO_ADAM_BUFFERS_INIT;
    b.n = h->n;
    b.grad = h->grad;
    b.grad_type = h->gt;
    b.master = h->master;
    b.m = h->m;
    b.v = h->v;
    b.state_type = h->st;
    b.out = h->out;
    b.out_type = h->ot;
    b.m_absmax = h->m_absmax;
    b.v_absmax = h->v_absmax;
    return b;
}

/* The option sets both tests sweep (opt 0..ADAM_OP_OPTS-1): Adam and AdamW,
 * with and without weight decay, per-tensor lr/betas/eps (as
 * zo_engine_set_tensor_adam sets them), bias correction off in one, and a
 * gradient scale of an fp16 loss scale 2^12 unscaled times a clip coefficient. */
#define ADAM_OP_OPTS 4
static inline zo_adam_params adam_op_params(int opt)
{
    zo_adam_params p = ZO_ADAM_PARAMS_INIT;
    p.adamw = opt & 1;
    p.weight_decay = opt & 2 ? 0.05f : 0.0f;
    p.bias_correction = opt != 3;
    p.lr = opt == 2 ? 3e-4f : 1e-3f;
    p.beta1 = opt == 1 ? 0.8f : 0.9f;
    p.beta2 = opt == 1 ? 0.95f : 0.999f;
    p.eps = opt == 1 ? 1e-6f : 1e-8f;
    p.grad_scale = opt >= 2 ? zo_grad_scale_factor(5e4, 4096.0f, 1.0f) : 1.0f;
    p.step = 1 + opt * 7;
    return p;
}

/* Host buffers of h uploaded to dev, as a buffers struct over them. */
static inline void *adam_op_up(zo_stream_t s, const void *src, size_t bytes)
{
    void *d = NULL;
    if (!bytes)
        return NULL;
    assert_int_equal(zo_device_malloc(zo_stream_device(s), bytes, &d), ZO_OK);
    assert_int_equal(zo_memcpy_h2d_async(s, d, src, bytes), ZO_OK);
    return d;
}

static inline void adam_op_down(zo_stream_t s, void *dst, void *d, size_t bytes)
{
    if (!bytes)
        return;
    assert_int_equal(zo_memcpy_d2h_async(s, dst, d, bytes), ZO_OK);
    assert_int_equal(zo_stream_synchronize(s), ZO_OK);
    assert_int_equal(zo_device_mfree(zo_stream_device(s), d), ZO_OK);
}

/* Runs zo_op_adam on s over device copies of h and writes the results back
 * into h; returns the op's status (the buffers are read back either way). */
static inline zo_status adam_op_run(zo_stream_t s, const zo_adam_params *p, adam_op_bufs *h)
{
    size_t n = h->n, gb = n * zo_dtype_size(h->gt), sb = n * zo_dtype_size(h->st),
           ob = h->out ? n * zo_dtype_size(h->ot) : 0, qb = adam_op_scales(h) * sizeof(float);
    zo_adam_buffers b = adam_op_buffers_of(h);
    b.grad = adam_op_up(s, h->grad, gb);
    b.master = adam_op_up(s, h->master, n * sizeof(float));
    b.m = adam_op_up(s, h->m, sb);
    b.v = adam_op_up(s, h->v, sb);
    b.out = adam_op_up(s, h->out, ob);
    b.m_absmax = adam_op_up(s, h->m_absmax, qb);
    b.v_absmax = adam_op_up(s, h->v_absmax, qb);
    zo_status st = zo_op_adam(s, p, &b);
    zo_status sync = zo_stream_synchronize(s);
    if (st == ZO_OK)
        st = sync;
    adam_op_down(s, (void *)h->grad, (void *)b.grad, gb);
    adam_op_down(s, h->master, b.master, n * sizeof(float));
    adam_op_down(s, h->m, b.m, sb);
    adam_op_down(s, h->v, b.v, sb);
    adam_op_down(s, h->out, b.out, ob);
    adam_op_down(s, h->m_absmax, b.m_absmax, qb);
    adam_op_down(s, h->v_absmax, b.v_absmax, qb);
    return st;
}

/* got against want, byte for byte; the message names the buffer and the
 * first element that differs, with both values' bits. */
static inline void adam_op_same(const adam_op_bufs *got, const adam_op_bufs *want, const char *what)
{
    struct {
        const char *name;
        const void *g, *w;
        size_t esize, n;
    } parts[] = {
        {"master", got->master, want->master, 4, got->n},
        {"m", got->m, want->m, zo_dtype_size(got->st), got->n},
        {"v", got->v, want->v, zo_dtype_size(got->st), got->n},
        {"out", got->out, want->out, got->out ? zo_dtype_size(got->ot) : 0, got->n},
        {"m_absmax", got->m_absmax, want->m_absmax, 4, adam_op_scales(got)},
        {"v_absmax", got->v_absmax, want->v_absmax, 4, adam_op_scales(got)},
    };
    for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++) {
        if (!parts[k].esize || !parts[k].g)
            continue;
        const unsigned char *g = parts[k].g, *w = parts[k].w;
        size_t es = parts[k].esize;
        for (size_t i = 0; i < parts[k].n; i++) {
            if (memcmp(g + i * es, w + i * es, es) == 0)
                continue;
            uint32_t gb = 0, wb = 0;
            memcpy(&gb, g + i * es, es);
            memcpy(&wb, w + i * es, es);
            fail_msg("%s: %s[%zu] differs: got bits 0x%x, want 0x%x (grad %s, states %s, out %s)",
                     what, parts[k].name, i, gb, wb, zo_dtype_name(got->gt), zo_dtype_name(got->st),
                     zo_dtype_name(got->ot));
        }
    }
}

#endif
