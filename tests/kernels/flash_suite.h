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

/* Adds a component every row of a (batch, seq, heads, head_dim) tensor
 * shares per head, uniform in [-scale, scale], and rounds to bf16 again
 * (attention_bias: k_proj's and v_proj's biases). */
static inline void case_add_shared(float *x, const flash_case *c, int heads, float scale,
                                   uint64_t seed)
{
    float *shared = rand_vec(&seed, (size_t)heads * c->D, scale, ZO_DTYPE_F32);
    size_t n = (size_t)c->B * c->T * heads * c->D;
    for (size_t i = 0; i < n; i++)
        x[i] += shared[i % ((size_t)heads * c->D)];
    round_to(x, n, ZO_DTYPE_BF16);
    free(shared);
}

/* Llama's attention_bias in bf16: the case's inputs with a key component
 * every key shares (scale 2, k_proj's bias) and a large value one (scale 8,
 * v_proj's), from seeds 800/900/950 + si. */
static inline void case_biased_inputs(flash_case *c, size_t si)
{
    case_inputs(c, 800 + si);
    case_add_shared(c->k, c, c->KV, 2.0f, 900 + si);
    case_add_shared(c->v, c, c->KV, 8.0f, 950 + si);
}

/* ---- the shapes the cpu and cuda tests share ---- */

/* MHA and GQA, head dims 64 to 128, sequences off the tile; shape 1 with a
 * BigBird block mask (16-token blocks, mask: 81 bytes), shape 2 with an exact
 * window. */
enum { FLASH_SHAPES = 4 };

static inline flash_case flash_shape(size_t si, uint8_t mask[81])
{
    static const int shapes[FLASH_SHAPES][6] = {/* B, T, H, KV, D, window */
                                                {2, 100, 2, 2, 64, 0},
                                                {1, 130, 4, 2, 80, 0},
                                                {1, 70, 3, 1, 96, 23},
                                                {1, 65, 4, 1, 128, 0}};
    const int *sh = shapes[si];
    flash_case c = {sh[0], sh[1], sh[2], sh[3], sh[4], 1, sh[5], 0, NULL, NULL, NULL, NULL, NULL};
    if (si == 1) {
        zo_attn_layout l = ZO_ATTN_LAYOUT_INIT;
        l.kind = ZO_ATTN_LAYOUT_BIGBIRD, l.block = 16, l.window_blocks = 3, l.global_blocks = 1;
        l.random_blocks = 1, l.seed = 3;
        ZO_ASSERT_OK(zo_attn_layout_build(&l, 130, mask, 81, NULL, NULL));
        c.mask = mask, c.mask_block = 16;
    }
    return c;
}

/* ---- the op under test ---- */

typedef struct flash_got {
    float *out, *lse, *dq, *dk, *dv;
} flash_got;

/* in_place: the backward writes dq over out, dk over k and dv over v (the
 * overlaps zo/ops.h allows), read back from there. */
static inline flash_got run_flash_as(zo_stream_t s, const flash_case *c, zo_dtype dt, int in_place)
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
    float *fwd_out = dev_to_host(s, out, nq, dt);
    if (in_place)
        dq = out, dk = k, dv = v;
    ZO_ASSERT_OK(zo_op_flash_attention_bwd(s, &d, dq, dk, dv, delta, dout, out, lse, q, k, v));
    flash_got o = {fwd_out, dev_to_host(s, lse, nl, ZO_DTYPE_F32), dev_to_host(s, dq, nq, dt),
                   dev_to_host(s, dk, nk, dt), dev_to_host(s, dv, nk, dt)};
    dev_free_all();
    return o;
}

static inline flash_got run_flash(zo_stream_t s, const flash_case *c, zo_dtype dt)
{
    return run_flash_as(s, c, dt, 0);
}

static inline void got_free(flash_got *o)
{
    free(o->out), free(o->lse), free(o->dq), free(o->dk), free(o->dv);
}

/* The in-place backward's bits against the separate buffers' (a failed
 * case names itself by what). */
static inline void assert_in_place_same(zo_stream_t s, const flash_case *c, zo_dtype dt,
                                        const char *what)
{
    flash_got a = run_flash_as(s, c, dt, 0), b = run_flash_as(s, c, dt, 1);
    const float *pa[] = {a.dq, a.dk, a.dv}, *pb[] = {b.dq, b.dk, b.dv};
    const size_t n[] = {nq_of(c), nk_of(c), nk_of(c)};
    const char *name[] = {"dq over out", "dk over k", "dv over v"};
    for (int i = 0; i < 3; i++)
        if (memcmp(pa[i], pb[i], n[i] * sizeof(float)) != 0)
            fail_msg("%s: %s differs from the separate buffer's", what, name[i]);
    got_free(&a), got_free(&b);
}

#endif
