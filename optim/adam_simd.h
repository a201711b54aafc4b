/* Width-independent SIMD loops of the optimizer. A variant's file defines the
 * vector operations below, then includes this file, which defines the
 * variant's kernel table ZV_TABLE named ZV_NAME:
 *   ZV_W lanes; zv (fp32 vector): zv_set1 zv_mul zv_fma(a,b,c)=a*b+c zv_div zv_sqrt
 *   zv_ld32/zv_st32 (fp32), zv_ldbf/zv_stbf (bf16), zv_ldhf/zv_sthf (fp16)
 *   zacc (per-lane double sums): zacc_zero zacc_add(acc, x) -> acc + x*x, zacc_sum (lane order)
 *   zr32/zr16 (raw bits): zr_ld32 zr_st32 zr_ld16 zr_st16 zr_narrow (32 -> 16 bits), zr_opaque32/16
 *   zi (int32 lanes, for 8-bit moments): zi_set1 zi_add zi_sub zi_and zi_max zi_min
 *     (signed) zi_srli(x, imm) (logical) zi_bits/zv_bits (reinterpret) zi_inc_gt(d, a, b) (d + 1
 *     where a > b, ordered) zi_hmax (largest lane) zi_ld8/zi_st8 (bytes <-> lanes) zi_opaque
 *     zi_cvtt (as zs_cvtt: INT32_MIN for NaN and |x| >= 2^31) zv_from_int zv_sub
 *     zv_lut16/zi_lut16(16-entry table, zi) zi_lut32(32-entry table, zi)
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

/* The step's constants as vectors; has_l2 as zs_adam_math's test. */
typedef struct zv_adam_k {
    zv beta1, beta2, omb1, omb2, neg_step, inv_sqrt_bc2, eps, decay, l2, gscale;
    int has_l2;
} zv_adam_k;

ZV_ALWAYS zv_adam_k zv_adam_k_make(const zo_adam_consts *c)
{
    return (zv_adam_k){zv_set1(c->beta1),
                       zv_set1(c->beta2),
                       zv_set1(c->one_minus_beta1),
                       zv_set1(c->one_minus_beta2),
                       zv_set1(-c->step_size),
                       zv_set1(c->inv_sqrt_bc2),
                       zv_set1(c->eps),
                       zv_set1(c->decay),
                       zv_set1(c->l2),
                       zv_set1(c->grad_scale),
                       c->l2 != 0.0f};
}

/* zs_adam_math, ZV_W lanes at a time. */
ZV_ALWAYS void zv_adam_math(const zv_adam_k *k, zv graw, zv m0, zv v0, zv *p, zv *m, zv *v)
{
    zv g = zv_mul(graw, k->gscale);
    if (k->has_l2)
        g = zv_fma(k->l2, *p, g);
    *m = zv_fma(k->beta1, m0, zv_mul(k->omb1, g));
    *v = zv_fma(k->beta2, v0, zv_mul(zv_mul(k->omb2, g), g));
    zv denom = zv_fma(zv_sqrt(*v), k->inv_sqrt_bc2, k->eps);
    *p = zv_fma(k->neg_step, zv_div(*m, denom), zv_mul(*p, k->decay));
}

/* The types are compile-time constants in each instance below, so every
 * switch folds away and each combination gets its own straight loop. */
ZV_ALWAYS void zv_adam_loop(const zo_adam_consts *c, const zo_adam_buffers *b, size_t begin,
                            size_t end, zo_dtype gt, zo_dtype st, zo_dtype ot)
{
    const zv_adam_k k = zv_adam_k_make(c);
    size_t i = begin;
    for (; i + ZV_W <= end; i += ZV_W) {
        zv p = zv_ld32(b->master + i), m, v;
        zv_adam_math(&k, zv_load_as(b->grad, gt, i), zv_load_as(b->m, st, i),
                     zv_load_as(b->v, st, i), &p, &m, &v);
        zv_st32(b->master + i, p);
        zv_store_as(b->m, st, i, m);
        zv_store_as(b->v, st, i, v);
        zv_store_as(b->out, ot, i, p);
    }
    zs_adam_elems(c, b, i, end);
}

/* ---- 8-bit moments ---- */

/* zs_q8_code, ZV_W lanes at a time, before the clamp to kmax and the base:
 * table lookups of 16 or 32 entries, which stay in registers, and no
 * search. Returns k (not yet clamped) and the entry index. */
ZV_ALWAYS zi zv_q8_index(const zo_q8_map_tables *t, zv x, int is_signed, zi *k)
{
    zi bits = zi_bits(x), a = zi_and(bits, zi_set1(0x7fffffff));
    a = zi_min(a, zi_set1(ZO_Q8_ONE_BITS)); /* beyond the map: its end (zs_q8_code) */
#ifdef ZV_HAVE_Q8_BIBINADE
    zi d = zi_q8_bibinade_level(t->lvl_of_bibinade, a);
#else
    zi e = zi_subs_u16(zi_srli(a, 23), zi_set1(ZO_Q8_EXP_FIRST)); /* mod 32 in the lookup */
    zi d = zi_lut32(t->lvl_of_binade, e);
#endif
    zv af = zv_bits(a);
    d = zi_inc_gt(d, af, zv_lut16(t->lvl_thr, d));
#ifdef ZV_HAVE_LUT32
    /* k from the magnitude's level, the sign only in the returned index:
     * a negative level d's k is the positive one's, and level 8's (one;
     * round_c = 63.5, see build_map) clamps to 0 (+1) or 63 (-1's code,
     * the top of negative level 7) through kmax; NaN's k is 0 both ways */
    *k = zi_cvtt(zv_fma(af, zv_lut16(t->inv_b, d), zv_lut16(t->round_c, d)));
    return is_signed ? zi_or_if_neg(d, bits, 16) : d;
#else
    if (is_signed)
        d = zi_min(zi_add_if_neg_nz(d, bits, 8), zi_set1(15));
    *k = zi_cvtt(zv_fma(af, zv_lut16(t->inv_b, d), zv_lut16(t->round_c, d)));
    return d;
#endif
}

ZV_ALWAYS zi zv_q8_code(const zo_q8_map_tables *t, zv x, int is_signed)
{
    zi k, d = zv_q8_index(t, x, is_signed, &k);
    k = zi_max(k, zi_set1(0));
#ifdef ZV_HAVE_LUT32
    if (is_signed)
        return zi_add(zi_min(k, zi_lut32(t->kmax, d)), zi_lut32(t->code_base, d));
#endif
    return zi_add(zi_min(k, zi_lut16(t->kmax, d)), zi_lut16(t->code_base, d));
}

#ifdef ZV_HAVE_LZCNT
/* zs_q8_unit, ZV_W lanes at a time, with the decoder's entries indexed by
 * leading zeros (zo_q8_map_tables): k = t less its leading one. */
ZV_ALWAYS zv zv_q8_unit(const zo_q8_map_tables *t, zi code, int is_signed)
{
    zi lz = zi_lzcnt(is_signed ? zi_and(code, zi_set1(127)) : code);
    zv k = zv_from_int(zi_and(code, zi_srlv(zi_set1(0x7fffffff), lz)));
    if (is_signed) {
        zi idx = zi_xor_and(lz, zi_srli(code, 3), zi_set1(16));
        return zv_fma(zv_lut32(t->dec_lz_b, idx), k, zv_lut32(t->dec_lz_a, idx));
    }
    return zv_fma(zv_lut16(t->dec_lz_b, lz), k, zv_lut16(t->dec_lz_a, lz));
}
#else
/* zs_q8_unit, ZV_W lanes at a time. */
ZV_ALWAYS zv zv_q8_unit(const zo_q8_map_tables *t, zi code, int is_signed)
{
    zi tt = is_signed ? zi_and(code, zi_set1(127)) : code;
    zv tf = zv_from_int(tt);
    zi fb = zi_bits(tf);
    zi lvl = zi_max(zi_sub(zi_srli(fb, 23), zi_set1(126)), zi_set1(0));
    if (is_signed)
        lvl = zi_add(lvl, zi_and(zi_srli(code, 4), zi_set1(8)));
    zv k = zv_sub(tf, zv_bits(zi_and(fb, zi_set1((int32_t)0xff800000u))));
    return zv_fma(zv_lut16(t->dec_b, lvl), k, zv_lut16(t->dec_a, lvl));
}
#endif

ZV_ALWAYS void zv_q8_encode(const zo_q8_tables *q, const float *buf, uint8_t *codes, size_t n,
                            float inv, int is_signed)
{
    const zv vinv = zv_set1(inv);
    size_t i = 0;
    for (; i + ZV_W <= n; i += ZV_W)
        zi_st8(codes + i, zv_q8_code(&q->t[is_signed], zv_mul(zv_ld32(buf + i), vinv), is_signed));
    zs_q8_encode_elems(q, buf, codes, i, n, inv, is_signed);
}

/* The new fp32 moments of one whole block, waiting for their codes. */
typedef struct zv_q8_pending {
    float m[ZO_ADAM_Q8_BLOCK] __attribute__((aligned(64)));
    float v[ZO_ADAM_Q8_BLOCK] __attribute__((aligned(64)));
    uint8_t *mc, *vc;
    float minv, vinv;
} zv_q8_pending;

/* Codes of 4 vectors of one moment of a pending block from element i. */
#ifdef ZV_HAVE_Q8_W16
ZV_ALWAYS void zv_q8_encode4(const zo_q8_map_tables *t, const float *buf, uint8_t *codes, zv inv,
                             size_t i, int is_signed)
{
    zi k0, k1, k2, k3;
    zi d0 = zv_q8_index(t, zv_mul(zv_ld32(buf + i), inv), is_signed, &k0);
    zi d1 = zv_q8_index(t, zv_mul(zv_ld32(buf + i + ZV_W), inv), is_signed, &k1);
    zi d2 = zv_q8_index(t, zv_mul(zv_ld32(buf + i + 2 * ZV_W), inv), is_signed, &k2);
    zi d3 = zv_q8_index(t, zv_mul(zv_ld32(buf + i + 3 * ZV_W), inv), is_signed, &k3);
    zi_st8x4w(codes + i, zi_q8_finish2(t->kmax_w, t->code_base_w, k0, d0, k1, d1),
              zi_q8_finish2(t->kmax_w, t->code_base_w, k2, d2, k3, d3));
}
#else
ZV_ALWAYS void zv_q8_encode4(const zo_q8_map_tables *t, const float *buf, uint8_t *codes, zv inv,
                             size_t i, int is_signed)
{
    zi c0 = zv_q8_code(t, zv_mul(zv_ld32(buf + i), inv), is_signed);
    zi c1 = zv_q8_code(t, zv_mul(zv_ld32(buf + i + ZV_W), inv), is_signed);
    zi c2 = zv_q8_code(t, zv_mul(zv_ld32(buf + i + 2 * ZV_W), inv), is_signed);
    zi c3 = zv_q8_code(t, zv_mul(zv_ld32(buf + i + 3 * ZV_W), inv), is_signed);
    zi_st8x4(codes + i, c0, c1, c2, c3);
}
#endif

/* The decoded moments (times 1, not yet the scale) of 4 vectors from
 * element i. */
ZV_ALWAYS void zv_q8_units4(const zo_q8_tables *q, const zo_adam_buffers *b, size_t i, zv mu[4],
                            zv vu[4])
{
#ifdef ZV_HAVE_Q8_UNIT64
    zv_q8_unit64(q->map_bytes[1], (const uint8_t *)b->m + i, mu);
    zv_q8_unit64(q->map_bytes[0], (const uint8_t *)b->v + i, vu);
#else
    for (int u = 0; u < 4; u++) {
        mu[u] = zv_q8_unit(&q->t[1], zi_ld8((const uint8_t *)b->m + i + u * ZV_W), 1);
        vu[u] = zv_q8_unit(&q->t[0], zi_ld8((const uint8_t *)b->v + i + u * ZV_W), 0);
    }
#endif
}

/* One vector of a whole block from its decoded moments: update, keep the
 * new moments in *nb and fold their magnitudes into mmax, vmax. */
ZV_ALWAYS void zv_q8_update_vec(const zv_adam_k *k, const zo_adam_buffers *b, size_t b0, size_t i,
                                zv mu, zv vu, zv vms, zv vvs, zv_q8_pending *nb, zi *mmax, zi *vmax,
                                zo_dtype gt, zo_dtype ot)
{
    const zi absmask = zi_set1(0x7fffffff);
    zv p = zv_ld32(b->master + i), m, v;
    zv m0 = zv_mul(mu, vms), v0 = zv_mul(vu, vvs);
    zv_adam_math(k, zv_load_as(b->grad, gt, i), m0, v0, &p, &m, &v);
    zv_st32(b->master + i, p);
    zv_store_as(b->out, ot, i, p);
    zv_st32(nb->m + (i - b0), m);
    zv_st32(nb->v + (i - b0), v);
    *mmax = zi_max(*mmax, zi_and(zi_bits(m), absmask));
    *vmax = zi_max(*vmax, zi_and(zi_bits(v), absmask));
}

/* A whole block [b0, b0 + ZO_ADAM_Q8_BLOCK): the update, and in the same
 * loop the codes of the block before (*pb, if any), so that the encoder's
 * integer work runs beside the update's divisions and square roots. The
 * new moments wait in *nb with their scales. */
ZV_ALWAYS void zv_adam_q8_whole(const zo_adam_consts *c, const zv_adam_k *k,
                                const zo_adam_buffers *b, size_t b0, const zv_q8_pending *pb,
                                zv_q8_pending *nb, zo_dtype gt, zo_dtype ot)
{
    const zo_q8_tables *q = c->q8;
    size_t blk = b0 / ZO_ADAM_Q8_BLOCK;
    const zv vms = zv_set1(b->m_absmax[blk]), vvs = zv_set1(b->v_absmax[blk]);
    zi mmax = zi_set1(0), vmax = zi_set1(0);
    const zv pmi = zv_set1(pb ? pb->minv : 0.0f), pvi = zv_set1(pb ? pb->vinv : 0.0f);
    for (size_t j = 0; j < ZO_ADAM_Q8_BLOCK; j += 4 * ZV_W) {
        zv mu[4], vu[4];
        zv_q8_units4(q, b, b0 + j, mu, vu);
        zv_q8_update_vec(k, b, b0, b0 + j, mu[0], vu[0], vms, vvs, nb, &mmax, &vmax, gt, ot);
        zv_q8_update_vec(k, b, b0, b0 + j + ZV_W, mu[1], vu[1], vms, vvs, nb, &mmax, &vmax, gt, ot);
        zv_q8_update_vec(k, b, b0, b0 + j + 2 * ZV_W, mu[2], vu[2], vms, vvs, nb, &mmax, &vmax, gt,
                         ot);
        zv_q8_update_vec(k, b, b0, b0 + j + 3 * ZV_W, mu[3], vu[3], vms, vvs, nb, &mmax, &vmax, gt,
                         ot);
        if (pb) {
            zv_q8_encode4(&q->t[1], pb->m, pb->mc, pmi, j, 1);
            zv_q8_encode4(&q->t[0], pb->v, pb->vc, pvi, j, 0);
        }
    }
    float mnew = zs_q8_scale_of((uint32_t)zi_hmax(mmax)),
          vnew = zs_q8_scale_of((uint32_t)zi_hmax(vmax));
    b->m_absmax[blk] = mnew;
    b->v_absmax[blk] = vnew;
    nb->minv = zs_q8_inv(mnew);
    nb->vinv = zs_q8_inv(vnew);
    nb->mc = (uint8_t *)b->m + b0;
    nb->vc = (uint8_t *)b->v + b0;
}

/* The codes of a pending block, alone (the last one). */
ZV_ALWAYS void zv_q8_flush(const zo_q8_tables *q, const zv_q8_pending *pb)
{
    const zv pmi = zv_set1(pb->minv), pvi = zv_set1(pb->vinv);
    for (size_t j = 0; j < ZO_ADAM_Q8_BLOCK; j += 4 * ZV_W) {
        zv_q8_encode4(&q->t[1], pb->m, pb->mc, pmi, j, 1);
        zv_q8_encode4(&q->t[0], pb->v, pb->vc, pvi, j, 0);
    }
}

/* A partial block [b0, end) (the last of a range): decode and update, the
 * new fp32 moments kept in L1 while their absmax is found, then encoded
 * with it. */
ZV_ALWAYS void zv_adam_q8_part(const zo_adam_consts *c, const zv_adam_k *k,
                               const zo_adam_buffers *b, size_t b0, size_t end, zo_dtype gt,
                               zo_dtype ot)
{
    float mbuf[ZO_ADAM_Q8_BLOCK] __attribute__((aligned(64)));
    float vbuf[ZO_ADAM_Q8_BLOCK] __attribute__((aligned(64)));
    const zo_q8_tables *q = c->q8;
    const uint8_t *mc = b->m, *vc = b->v;
    size_t blk = b0 / ZO_ADAM_Q8_BLOCK;
    float ms = b->m_absmax[blk], vs = b->v_absmax[blk];
    const zv vms = zv_set1(ms), vvs = zv_set1(vs);
    const zi absmask = zi_set1(0x7fffffff);
    zi mmax = zi_set1(0), vmax = zi_set1(0);
    size_t i = b0;
    for (; i + ZV_W <= end; i += ZV_W) {
        zv p = zv_ld32(b->master + i), m, v;
        zv m0 = zv_mul(zv_q8_unit(&q->t[1], zi_ld8(mc + i), 1), vms);
        zv v0 = zv_mul(zv_q8_unit(&q->t[0], zi_ld8(vc + i), 0), vvs);
        zv_adam_math(k, zv_load_as(b->grad, gt, i), m0, v0, &p, &m, &v);
        zv_st32(b->master + i, p);
        zv_store_as(b->out, ot, i, p);
        zv_st32(mbuf + (i - b0), m);
        zv_st32(vbuf + (i - b0), v);
        mmax = zi_max(mmax, zi_and(zi_bits(m), absmask));
        vmax = zi_max(vmax, zi_and(zi_bits(v), absmask));
    }
    uint32_t mm = (uint32_t)zi_hmax(mmax), vm = (uint32_t)zi_hmax(vmax);
    zs_adam_q8_elems(c, b, b0, i, end, ms, vs, mbuf, vbuf, &mm, &vm);
    float mnew = zs_q8_scale_of(mm), vnew = zs_q8_scale_of(vm);
    b->m_absmax[blk] = mnew;
    b->v_absmax[blk] = vnew;
    zv_q8_encode(q, mbuf, (uint8_t *)b->m + b0, end - b0, zs_q8_inv(mnew), 1);
    zv_q8_encode(q, vbuf, (uint8_t *)b->v + b0, end - b0, zs_q8_inv(vnew), 0);
}

/* begin is on a block; end on one or at n. Whole blocks are pipelined:
 * each one's codes are written during the next one's update. */
ZV_ALWAYS void zv_adam_q8_loop(const zo_adam_consts *c, const zo_adam_buffers *b, size_t begin,
                               size_t end, zo_dtype gt, zo_dtype ot)
{
    const zv_adam_k k = zv_adam_k_make(c);
    const zo_adam_buffers lb = *b; /* a copy no store can alias: its pointers stay in registers */
    zv_q8_pending pend[2];
    const zv_q8_pending *pb = NULL;
    size_t b0 = begin;
    for (int cur = 0; end - b0 >= ZO_ADAM_Q8_BLOCK; b0 += ZO_ADAM_Q8_BLOCK, cur ^= 1) {
        zv_adam_q8_whole(c, &k, &lb, b0, pb, &pend[cur], gt, ot);
        pb = &pend[cur];
    }
    if (pb)
        zv_q8_flush(c->q8, pb);
    if (b0 < end)
        zv_adam_q8_part(c, &k, b, b0, end, gt, ot);
}

#define ZV_ADAM_INSTANCE(G, S, O)                                                                  \
    static void zv_adam_##G##_##S##_##O(const zo_adam_consts *c, const zo_adam_buffers *b,         \
                                        size_t begin, size_t end)                                  \
    {                                                                                              \
        zv_adam_loop(c, b, begin, end, ZO_DTYPE_##G, ZO_DTYPE_##S, ZO_DTYPE_##O);                  \
    }
#define ZV_ADAM_Q8_INSTANCE(G, O)                                                                  \
    static void zv_adam_##G##_I8_##O(const zo_adam_consts *c, const zo_adam_buffers *b,            \
                                     size_t begin, size_t end)                                     \
    {                                                                                              \
        zv_adam_q8_loop(c, b, begin, end, ZO_DTYPE_##G, ZO_DTYPE_##O);                             \
    }
#define ZV_ADAM_BY_OUT(G, S)                                                                       \
    ZV_ADAM_INSTANCE(G, S, NONE)                                                                   \
    ZV_ADAM_INSTANCE(G, S, BF16) ZV_ADAM_INSTANCE(G, S, F16) ZV_ADAM_INSTANCE(G, S, F32)
#define ZV_ADAM_Q8_BY_OUT(G)                                                                       \
    ZV_ADAM_Q8_INSTANCE(G, NONE)                                                                   \
    ZV_ADAM_Q8_INSTANCE(G, BF16) ZV_ADAM_Q8_INSTANCE(G, F16) ZV_ADAM_Q8_INSTANCE(G, F32)
#define ZV_ADAM_BY_STATE(G) ZV_ADAM_BY_OUT(G, F32) ZV_ADAM_BY_OUT(G, BF16) ZV_ADAM_Q8_BY_OUT(G)
ZV_ADAM_BY_STATE(F32)
ZV_ADAM_BY_STATE(F16)
ZV_ADAM_BY_STATE(BF16)

typedef void (*zv_adam_fn)(const zo_adam_consts *, const zo_adam_buffers *, size_t, size_t);

#define ZV_ROW(G, S)                                                                               \
    {                                                                                              \
        zv_adam_##G##_##S##_NONE, zv_adam_##G##_##S##_BF16, zv_adam_##G##_##S##_F16,               \
            zv_adam_##G##_##S##_F32                                                                \
    }
/* [grad][state][out] (grad: F32, F16, BF16; state: F32, BF16, I8; out: NONE, BF16, F16, F32:
 * fp32 parameters, the master's own bits). */
static const zv_adam_fn zv_adam_table[3][3][4] = {
    {ZV_ROW(F32, F32), ZV_ROW(F32, BF16), ZV_ROW(F32, I8)},
    {ZV_ROW(F16, F32), ZV_ROW(F16, BF16), ZV_ROW(F16, I8)},
    {ZV_ROW(BF16, F32), ZV_ROW(BF16, BF16), ZV_ROW(BF16, I8)},
};

static void zv_adam(const zo_adam_consts *c, const zo_adam_buffers *b, size_t begin, size_t end)
{
    int oi = b->out_type == ZO_DTYPE_NONE   ? 0
             : b->out_type == ZO_DTYPE_BF16 ? 1
             : b->out_type == ZO_DTYPE_F16  ? 2
                                            : 3;
    int gi = b->grad_type == ZO_DTYPE_F32 ? 0 : b->grad_type == ZO_DTYPE_F16 ? 1 : 2;
    int si = b->state_type == ZO_DTYPE_F32 ? 0 : b->state_type == ZO_DTYPE_BF16 ? 1 : 2;
    zv_adam_table[gi][si][oi](c, b, begin, end);
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

/* The master's bits moved; with fp32 parameters (out 2) stored to out too,
 * as the step writes them twice. */
ZV_ALWAYS void zv_move_master(const zo_adam_buffers *b, size_t i, int out)
{
    zr32 x = zr_ld32((const uint32_t *)b->master + i);
    zr_opaque32(x);
    zr_st32((uint32_t *)b->master + i, x);
    if (out == 2)
        zr_st32((uint32_t *)b->out + i, x);
}

/* The gradient's bits loaded (narrowed to 16 when fp32: what a 16-bit out gets). */
ZV_ALWAYS zr16 zv_touch_grad(const zo_adam_buffers *b, size_t i, int g32)
{
    zr16 g16;
    if (g32) {
        zr32 g = zr_ld32((const uint32_t *)b->grad + i);
        zr_opaque32(g);
        g16 = zr_narrow(g);
    } else {
        g16 = zr_ld16((const uint16_t *)b->grad + i);
        zr_opaque16(g16);
    }
    return g16;
}

/* out: 0 none, 1 16-bit (the gradient's bits), 2 fp32 (the master's). */
ZV_ALWAYS void zv_roofline_loop(const zo_adam_buffers *b, size_t begin, size_t end, int g32,
                                int s32, int out)
{
    size_t i = begin;
    for (; i + ZV_W <= end; i += ZV_W) {
        zr16 g16 = zv_touch_grad(b, i, g32);
        zv_move_master(b, i, out);
        if (s32) {
            zv_move32(b->m, i);
            zv_move32(b->v, i);
        } else {
            zv_move16(b->m, i);
            zv_move16(b->v, i);
        }
        if (out == 1)
            zr_st16((uint16_t *)b->out + i, g16);
    }
    zs_roofline_elems(b, i, end);
}

ZV_ALWAYS void zv_move8(void *base, size_t i)
{
    zi x = zi_ld8((const uint8_t *)base + i);
    zi_opaque(x);
    zi_st8((uint8_t *)base + i, x);
}

/* The 8-bit step's bytes: per block its two scales, per element the codes. */
ZV_ALWAYS void zv_roofline_q8_loop(const zo_adam_buffers *b, size_t begin, size_t end, int g32,
                                   int out)
{
    for (size_t b0 = begin; b0 < end; b0 += ZO_ADAM_Q8_BLOCK) {
        size_t e = end - b0 < ZO_ADAM_Q8_BLOCK ? end : b0 + ZO_ADAM_Q8_BLOCK, i = b0;
        zs_move_bits(b->m_absmax, 4, b0 / ZO_ADAM_Q8_BLOCK);
        zs_move_bits(b->v_absmax, 4, b0 / ZO_ADAM_Q8_BLOCK);
        for (; i + ZV_W <= e; i += ZV_W) {
            zr16 g16 = zv_touch_grad(b, i, g32);
            zv_move_master(b, i, out);
            zv_move8(b->m, i);
            zv_move8(b->v, i);
            if (out == 1)
                zr_st16((uint16_t *)b->out + i, g16);
        }
        zs_roofline_elems(b, i, e);
    }
}

/* Spelled out so each case is its own constant-folded loop: the state
 * (s32; -1 for 8-bit moments) and grad types are constants at each call,
 * out one of the three here. */
ZV_ALWAYS void zv_roofline_by_out(const zo_adam_buffers *b, size_t begin, size_t end, int g32,
                                  int s32, int out)
{
    if (s32 < 0) {
        if (out == 2)
            zv_roofline_q8_loop(b, begin, end, g32, 2);
        else if (out)
            zv_roofline_q8_loop(b, begin, end, g32, 1);
        else
            zv_roofline_q8_loop(b, begin, end, g32, 0);
    } else if (out == 2) {
        zv_roofline_loop(b, begin, end, g32, s32, 2);
    } else if (out) {
        zv_roofline_loop(b, begin, end, g32, s32, 1);
    } else {
        zv_roofline_loop(b, begin, end, g32, s32, 0);
    }
}

static void zv_roofline(const zo_adam_buffers *b, size_t begin, size_t end)
{
    int g32 = b->grad_type == ZO_DTYPE_F32;
    int out = b->out_type == ZO_DTYPE_NONE ? 0 : b->out_type == ZO_DTYPE_F32 ? 2 : 1;
    if (b->state_type == ZO_DTYPE_I8) {
        if (g32)
            zv_roofline_by_out(b, begin, end, 1, -1, out);
        else
            zv_roofline_by_out(b, begin, end, 0, -1, out);
    } else if (b->state_type == ZO_DTYPE_F32) {
        if (g32)
            zv_roofline_by_out(b, begin, end, 1, 1, out);
        else
            zv_roofline_by_out(b, begin, end, 0, 1, out);
    } else if (g32) {
        zv_roofline_by_out(b, begin, end, 1, 0, out);
    } else {
        zv_roofline_by_out(b, begin, end, 0, 0, out);
    }
}

/* The step's encoder with a scale of 1 (x * 1 is x). */
static void zv_q8_encode_units(const float *x, size_t n, int is_signed, uint8_t *codes)
{
    const zo_q8_tables *q = zo_q8_tables_get();
    size_t i = 0;
    for (; i + 4 * ZV_W <= n; i += 4 * ZV_W) {
        if (is_signed)
            zv_q8_encode4(&q->t[1], x, codes, zv_set1(1.0f), i, 1);
        else
            zv_q8_encode4(&q->t[0], x, codes, zv_set1(1.0f), i, 0);
    }
    zv_q8_encode(q, x + i, codes + i, n - i, 1.0f, is_signed != 0);
}

const zo_optim_kernels ZV_TABLE = {ZV_NAME, zv_adam, zv_sum_sq, zv_roofline, zv_q8_encode_units};
