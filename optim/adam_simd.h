/* Width-independent SIMD loops of the optimizer. A variant's file defines the
 * vector operations below, then includes this file, which defines the
 * variant's kernel table ZV_TABLE named ZV_NAME:
 *   ZV_W lanes; zv (fp32 vector): zv_set1 zv_mul zv_fma(a,b,c)=a*b+c zv_div zv_sqrt
 *   zv_ld32/zv_st32 (fp32), zv_ldbf/zv_stbf (bf16), zv_ldhf/zv_sthf (fp16)
 *   zacc (per-lane double sums): zacc_zero zacc_add(acc, x) -> acc + x*x, zacc_sum (lane order)
 *   zr32/zr16 (raw bits): zr_ld32 zr_st32 zr_ld16 zr_st16 zr_narrow (32 -> 16 bits), zr_opaque32/16
 * Elements past the last whole vector go through the scalar code. */
#include "adam_scalar_elem.h"

#define ZV_ALWAYS static inline __attribute__((always_inline))

ZV_ALWAYS zv zv_load_as(const void *base, zo_dtype t, size_t i)
{
    switch (t) {
    case ZO_DTYPE_F16: return zv_ldhf((const uint16_t *)base + i);
    case ZO_DTYPE_BF16: return zv_ldbf((const uint16_t *)base + i);
    default: return zv_ld32((const float *)base + i);
    }
}

ZV_ALWAYS void zv_store_as(void *base, zo_dtype t, size_t i, zv x)
{
    switch (t) {
    case ZO_DTYPE_F16: zv_sthf((uint16_t *)base + i, x); break;
    case ZO_DTYPE_BF16: zv_stbf((uint16_t *)base + i, x); break;
    case ZO_DTYPE_F32: zv_st32((float *)base + i, x); break;
    default: break;
    }
}

/* The types are compile-time constants in each instance below, so every
 * switch folds away and each combination gets its own straight loop. */
ZV_ALWAYS void zv_adam_loop(const zo_adam_consts *c, const zo_adam_buffers *b, size_t begin,
                            size_t end, zo_dtype gt, zo_dtype st, zo_dtype ot)
{
    const zv beta1 = zv_set1(c->beta1), beta2 = zv_set1(c->beta2);
    const zv omb1 = zv_set1(c->one_minus_beta1), omb2 = zv_set1(c->one_minus_beta2);
    const zv neg_step = zv_set1(-c->step_size), inv_sqrt_bc2 = zv_set1(c->inv_sqrt_bc2);
    const zv eps = zv_set1(c->eps), decay = zv_set1(c->decay), l2 = zv_set1(c->l2);
    const zv gscale = zv_set1(c->grad_scale);
    size_t i = begin;
    for (; i + ZV_W <= end; i += ZV_W) {
        zv p = zv_ld32(b->master + i);
        zv g = zv_mul(zv_load_as(b->grad, gt, i), gscale);
        g = zv_fma(l2, p, g);
        zv m = zv_fma(beta1, zv_load_as(b->m, st, i), zv_mul(omb1, g));
        zv v = zv_fma(beta2, zv_load_as(b->v, st, i), zv_mul(zv_mul(omb2, g), g));
        zv denom = zv_fma(zv_sqrt(v), inv_sqrt_bc2, eps);
        p = zv_fma(neg_step, zv_div(m, denom), zv_mul(p, decay));
        zv_st32(b->master + i, p);
        zv_store_as(b->m, st, i, m);
        zv_store_as(b->v, st, i, v);
        zv_store_as(b->out, ot, i, p);
    }
    zs_adam_elems(c, b, i, end);
}

#define ZV_ADAM_INSTANCE(G, S, O)                                                                  \
    static void zv_adam_##G##_##S##_##O(const zo_adam_consts *c, const zo_adam_buffers *b,         \
                                        size_t begin, size_t end)                                  \
    {                                                                                              \
        zv_adam_loop(c, b, begin, end, ZO_DTYPE_##G, ZO_DTYPE_##S, ZO_DTYPE_##O);                  \
    }
#define ZV_ADAM_BY_OUT(G, S)                                                                       \
    ZV_ADAM_INSTANCE(G, S, NONE) ZV_ADAM_INSTANCE(G, S, BF16) ZV_ADAM_INSTANCE(G, S, F16)
#define ZV_ADAM_BY_STATE(G) ZV_ADAM_BY_OUT(G, F32) ZV_ADAM_BY_OUT(G, BF16)
ZV_ADAM_BY_STATE(F32)
ZV_ADAM_BY_STATE(F16)
ZV_ADAM_BY_STATE(BF16)

typedef void (*zv_adam_fn)(const zo_adam_consts *, const zo_adam_buffers *, size_t, size_t);

#define ZV_ROW(G, S)                                                                               \
    {                                                                                              \
        zv_adam_##G##_##S##_NONE, zv_adam_##G##_##S##_BF16, zv_adam_##G##_##S##_F16                \
    }
/* [grad][state][out] (grad: F32, F16, BF16; state: F32, BF16; out: NONE, BF16, F16). */
static const zv_adam_fn zv_adam_table[3][2][3] = {
    {ZV_ROW(F32, F32), ZV_ROW(F32, BF16)},
    {ZV_ROW(F16, F32), ZV_ROW(F16, BF16)},
    {ZV_ROW(BF16, F32), ZV_ROW(BF16, BF16)},
};

static void zv_adam(const zo_adam_consts *c, const zo_adam_buffers *b, size_t begin, size_t end)
{
    int oi = b->out_type == ZO_DTYPE_NONE ? 0 : b->out_type == ZO_DTYPE_BF16 ? 1 : 2;
    int gi = b->grad_type == ZO_DTYPE_F32 ? 0 : b->grad_type == ZO_DTYPE_F16 ? 1 : 2;
    zv_adam_table[gi][b->state_type == ZO_DTYPE_BF16][oi](c, b, begin, end);
}

ZV_ALWAYS double zv_sum_sq_loop(const void *grad, zo_dtype t, size_t begin, size_t end)
{
    zacc acc = zacc_zero();
    size_t i = begin;
    for (; i + ZV_W <= end; i += ZV_W)
        acc = zacc_add(acc, zv_load_as(grad, t, i));
    return zacc_sum(acc) + zs_sum_sq(grad, t, i, end);
}

static double zv_sum_sq(const void *grad, zo_dtype t, size_t begin, size_t end)
{
    switch (t) {
    case ZO_DTYPE_F16: return zv_sum_sq_loop(grad, ZO_DTYPE_F16, begin, end);
    case ZO_DTYPE_BF16: return zv_sum_sq_loop(grad, ZO_DTYPE_BF16, begin, end);
    default: return zv_sum_sq_loop(grad, ZO_DTYPE_F32, begin, end);
    }
}

/* Loads and stores with the adam loop's widths; zr_opaque keeps the compiler
 * from proving a store rewrites the value already there and dropping it. */
ZV_ALWAYS void zv_move32(void *base, size_t i)
{
    zr32 x = zr_ld32((const uint32_t *)base + i);
    zr_opaque32(x);
    zr_st32((uint32_t *)base + i, x);
}

ZV_ALWAYS void zv_move16(void *base, size_t i)
{
    zr16 x = zr_ld16((const uint16_t *)base + i);
    zr_opaque16(x);
    zr_st16((uint16_t *)base + i, x);
}

ZV_ALWAYS void zv_roofline_loop(const zo_adam_buffers *b, size_t begin, size_t end, int g32,
                                int s32, int out)
{
    size_t i = begin;
    for (; i + ZV_W <= end; i += ZV_W) {
        zr16 g16;
        if (g32) {
            zr32 g = zr_ld32((const uint32_t *)b->grad + i);
            zr_opaque32(g);
            g16 = zr_narrow(g);
        } else {
            g16 = zr_ld16((const uint16_t *)b->grad + i);
            zr_opaque16(g16);
        }
        zv_move32(b->master, i);
        if (s32) {
            zv_move32(b->m, i);
            zv_move32(b->v, i);
        } else {
            zv_move16(b->m, i);
            zv_move16(b->v, i);
        }
        if (out)
            zr_st16((uint16_t *)b->out + i, g16);
    }
    zs_roofline_elems(b, i, end);
}

static void zv_roofline(const zo_adam_buffers *b, size_t begin, size_t end)
{
    int g32 = b->grad_type == ZO_DTYPE_F32, s32 = b->state_type == ZO_DTYPE_F32;
    int out = b->out_type != ZO_DTYPE_NONE;
    /* Spelled out so each case is its own constant-folded loop. */
    if (g32 && s32 && out)
        zv_roofline_loop(b, begin, end, 1, 1, 1);
    else if (g32 && s32)
        zv_roofline_loop(b, begin, end, 1, 1, 0);
    else if (g32 && out)
        zv_roofline_loop(b, begin, end, 1, 0, 1);
    else if (g32)
        zv_roofline_loop(b, begin, end, 1, 0, 0);
    else if (s32 && out)
        zv_roofline_loop(b, begin, end, 0, 1, 1);
    else if (s32)
        zv_roofline_loop(b, begin, end, 0, 1, 0);
    else if (out)
        zv_roofline_loop(b, begin, end, 0, 0, 1);
    else
        zv_roofline_loop(b, begin, end, 0, 0, 0);
}

const zo_optim_kernels ZV_TABLE = {ZV_NAME, zv_adam, zv_sum_sq, zv_roofline};
