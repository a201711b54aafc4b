/* The fused attention op's runner, shared by the cpu tests (against
 * references) and the cuda tests (against the cpu): a problem's shape, mask
 * and host inputs, uploaded in a dtype, run forward and backward on a
 * stream, read back as fp32. */
#ifndef FLASH_SUITE_H
#define FLASH_SUITE_H

#include "ops_test_util.h"

/* ---- one problem: shape, mask, host inputs ---- */

typedef struct flash_case {
    int B, T, H, KV, D;
    int causal, window, mask_block;
    const uint8_t *mask; /* host copy of the block mask, or NULL */
    float *q, *k, *v, *dout;
} flash_case;

static inline size_t nq_of(const flash_case *c)
{
    return (size_t)c->B * c->T * c->H * c->D;
}

static inline size_t nk_of(const flash_case *c)
{
    return (size_t)c->B * c->T * c->KV * c->D;
}

static inline void case_inputs(flash_case *c, uint64_t seed)
{
    c->q = rand_vec(&seed, nq_of(c), 2.0f, ZO_DTYPE_BF16);
    c->k = rand_vec(&seed, nk_of(c), 2.0f, ZO_DTYPE_BF16);
    c->v = rand_vec(&seed, nk_of(c), 1.0f, ZO_DTYPE_BF16);
    c->dout = rand_vec(&seed, nq_of(c), 1.0f, ZO_DTYPE_BF16);
}

static inline void case_free(flash_case *c)
{
    free(c->q), free(c->k), free(c->v), free(c->dout);
}

/* ---- the op under test ---- */

typedef struct flash_got {
    float *out, *lse, *dq, *dk, *dv;
} flash_got;

static inline flash_got run_flash(zo_stream_t s, const flash_case *c, zo_dtype dt)
{
    size_t nq = nq_of(c), nk = nk_of(c), nl = (size_t)c->B * c->H * c->T, es = zo_dtype_size(dt);
    void *q = dev_from(s, c->q, nq, dt), *k = dev_from(s, c->k, nk, dt);
    void *v = dev_from(s, c->v, nk, dt), *dout = dev_from(s, c->dout, nq, dt);
    void *out = dev_zeros(s, nq * es), *dq = dev_zeros(s, nq * es);
    void *dk = dev_zeros(s, nk * es), *dv = dev_zeros(s, nk * es);
    float *lse = dev_zeros(s, nl * sizeof(float)), *delta = dev_zeros(s, nl * sizeof(float));
    zo_flash_attn_desc d = ZO_FLASH_ATTN_DESC_INIT;
    d.batch = c->B, d.seq = c->T, d.heads = c->H, d.kv_heads = c->KV, d.head_dim = c->D;
    d.causal = c->causal, d.window = c->window, d.dt = dt;
    if (c->mask) {
        int nb = (c->T + c->mask_block - 1) / c->mask_block;
        uint8_t *m = dev_zeros(s, (size_t)nb * nb);
        ZO_ASSERT_OK(zo_memcpy_h2d_async(s, m, c->mask, (size_t)nb * nb));
        d.block_mask = m;
        d.mask_block = c->mask_block;
    }
    ZO_ASSERT_OK(zo_op_flash_attention_fwd(s, &d, out, lse, q, k, v));
    ZO_ASSERT_OK(zo_op_flash_attention_bwd(s, &d, dq, dk, dv, delta, dout, out, lse, q, k, v));
    flash_got o = {dev_to_host(s, out, nq, dt), dev_to_host(s, lse, nl, ZO_DTYPE_F32),
                   dev_to_host(s, dq, nq, dt), dev_to_host(s, dk, nk, dt),
                   dev_to_host(s, dv, nk, dt)};
    dev_free_all();
    return o;
}

static inline void got_free(flash_got *o)
{
    free(o->out), free(o->lse), free(o->dq), free(o->dk), free(o->dv);
}

#endif
