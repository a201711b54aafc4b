/* 8-bit blockwise Adam moments: the dynamic maps' edges, the encoding
 * against a brute-force nearest-value search in double, blocks of zeros,
 * subnormals and huge values, the fused step against a double-precision
 * reference of the same algorithm (decode, update, requantize with the new
 * absmax), every SIMD variant equal to the scalar one bit for bit (partial
 * last blocks, inf and NaN gradients included), the pool's tiles, and a
 * non-finite gradient caught by the gradient pass and the loss scaler.
 *
 * Tolerances: the master weight as in test_adam.c (1e-6 of the sum of the
 * magnitudes of its terms); a block's absmax within 1e-6 relative of the
 * reference's; a code must be a nearest map value of the reference's
 * normalized moment, up to 2^-22 of slack (the fp32 thresholds and the fp32
 * moment both round). */
#include "adam_ref.h"
#include "q8_codes.h"

static const zo_simd_level all_levels[] = {ZO_SIMD_SCALAR, ZO_SIMD_AVX2, ZO_SIMD_AVX512,
                                           ZO_SIMD_AVX512_BF16, ZO_SIMD_NEON};
#define NLEVELS ((int)(sizeof all_levels / sizeof *all_levels))
#define QB      ZO_ADAM_Q8_BLOCK

/* The smallest distance from x to a map value, in double. A compare, not
 * fmin: GCC 12's aarch64 vectorizer crashes on an fmin reduction over
 * widened floats ("internal compiler error in vect_transform_reduction" at
 * -O2); the result is the same, as no distance is NaN unless x is, and
 * then both keep INFINITY. */
static double nearest_dist(const float *map, double x)
{
    double best = INFINITY;
    for (int c = 0; c < 256; c++) {
        double d = fabs(x - map[c]);
        if (d < best)
            best = d;
    }
    return best;
}

static void check_code_nearest(const float *map, double x, uint8_t code, const char *what, size_t i)
{
    double d = fabs(x - map[code]), best = nearest_dist(map, x);
    if (!(d <= best + 0x1p-22 * fmax(fabs(x), 1e-30)))
        fail_msg("%s[%zu]: %.9g encoded as %u (%.9g, off %.3g), nearest is %.3g away", what, i, x,
                 code, map[code], d, best);
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* bitsandbytes' construction in double: decade i = 0..6 of 10^(i-6) x
 * [0.1, 1] in n equal parts' midpoints, n = 2^i per sign (signed) or
 * 2^(i+1); then 0 and 1; sorted. */
static void reference_map(int is_signed, float *out)
{
    int c = 0;
    for (int i = 0; i < 7; i++) {
        int n = is_signed ? 1 << i : 2 << i;
        for (int k = 0; k < n; k++) {
            double v = pow(10.0, i - 6) * (0.1 + 0.9 * (k + 0.5) / n);
            out[c++] = (float)v;
            if (is_signed)
                out[c++] = (float)-v;
        }
    }
    out[c++] = 0.0f;
    out[c++] = 1.0f;
    assert_int_equal(c, 256);
    qsort(out, 256, sizeof *out, cmp_float);
}

static void test_map_edges(void **state)
{
    for (int is_signed = 0; is_signed < 2; is_signed++) {
        float got[256], want[256];
        memcpy(got, zo_adam_q8_map(is_signed), sizeof got);
        qsort(got, 256, sizeof *got, cmp_float);
        reference_map(is_signed, want);
        for (int c = 0; c < 256; c++) {
            if (c)
                assert_true(got[c - 1] < got[c]); /* 256 distinct values */
            assert_true(fabsf(got[c] - want[c]) <= 2e-7f * fabsf(want[c]));
        }
    }
    const float *sm = zo_adam_q8_map(1), *um = zo_adam_q8_map(0);
    /* the layout: zero at 0; one at 128 (signed) or 1; decades by leading one */
    assert_true(sm[0] == 0.0f && sm[128] == 1.0f && um[0] == 0.0f && um[1] == 1.0f);
    assert_true(fabs(sm[1] - 0.55e-6) < 1e-12 && fabs(sm[129] + 0.55e-6) < 1e-12);
    assert_true(fabs(sm[127] - (0.1 + 0.9 * 63.5 / 64)) < 1e-6 && sm[255] == -sm[127]);
    assert_true(fabs(um[2] - 0.325e-6) < 1e-12 && fabs(um[3] - 0.775e-6) < 1e-12);
    assert_true(fabs(um[255] - (0.1 + 0.9 * 127.5 / 128)) < 1e-6);
    /* the edges encode to themselves; -1 to the largest negative; -0 to 0 */
    float x[4] = {1.0f, -1.0f, 0.0f, -0.0f};
    uint8_t codes[4];
    float absmax;
    ZO_ASSERT_OK(zo_adam_q8_quantize(x, 4, 1, codes, &absmax));
    assert_true(absmax == 1.0f);
    assert_int_equal(codes[0], 128);
    assert_int_equal(codes[1], 255);
    assert_int_equal(codes[2], 0);
    assert_int_equal(codes[3], 0);
    ZO_ASSERT_OK(zo_adam_q8_quantize(x, 4, 0, codes, &absmax));
    assert_int_equal(codes[0], 1);
    assert_int_equal(codes[2], 0);
}

/* Every value near every threshold, and random ones over many decades. */
static void test_encoding_is_nearest(void **state)
{
    for (int is_signed = 0; is_signed < 2; is_signed++) {
        const float *map = zo_adam_q8_map(is_signed);
        float sorted[256];
        memcpy(sorted, map, sizeof sorted);
        qsort(sorted, 256, sizeof *sorted, cmp_float);
        enum { N = 255 * 6 + 4000 };
        float *x = xcalloc(N, 4), *back = xcalloc(N, 4);
        uint8_t *codes = xcalloc(N, 1);
        float *absmax = xcalloc(zo_adam_q8_blocks(N), 4);
        size_t n = 0;
        for (int c = 0; c + 1 < 256; c++) {
            float mid = (float)(((double)sorted[c] + sorted[c + 1]) / 2);
            float around[3] = {nextafterf(mid, -2.0f), mid, nextafterf(mid, 2.0f)};
            for (int k = 0; k < 3; k++) {
                x[n++] = around[k];
                x[n++] = sorted[c] + (sorted[c + 1] - sorted[c]) * 0.25f * (float)k;
            }
        }
        uint64_t s = 7 + (uint64_t)is_signed;
        while (n < N) {
            double r = rand_unit(&s) * (is_signed ? 2.0 : 1.0) - (is_signed ? 1.0 : 0.0);
            x[n++] = (float)(r * pow(10.0, -(double)(zo_test_rand(&s) % 9)));
        }
        for (size_t b = 0; b < zo_adam_q8_blocks(N); b++) /* absmax 1 in every block */
            x[b * QB] = 1.0f;
        ZO_ASSERT_OK(zo_adam_q8_quantize(x, N, is_signed, codes, absmax));
        ZO_ASSERT_OK(zo_adam_q8_dequantize(codes, absmax, N, is_signed, back));
        for (size_t i = 0; i < N; i++) {
            assert_true(absmax[i / QB] == 1.0f);
            check_code_nearest(map, x[i], codes[i], is_signed ? "signed" : "unsigned", i);
            assert_true(back[i] == map[codes[i]]);
        }
        free(x);
        free(back);
        free(codes);
        free(absmax);
    }
}

/* All-zero, subnormal (stored as zero), huge and non-finite blocks. */
static void test_special_blocks(void **state)
{
    enum { N = 5 * QB };
    float *x = xcalloc(N, 4), *back = xcalloc(N, 4), absmax[5];
    uint8_t codes[N];
    for (size_t i = 0; i < QB; i++) {
        x[QB + i] = (i & 1 ? -1e-40f : 3e-39f);                          /* subnormal */
        x[2 * QB + i] = (float)(i + 1) * 1e36f * (i & 1 ? -1.0f : 1.0f); /* huge */
        x[3 * QB + i] = (float)i;
        x[4 * QB + i] = 1.0f;
    }
    x[3 * QB + 5] = INFINITY;
    x[4 * QB + 9] = NAN;
    for (int is_signed = 0; is_signed < 2; is_signed++) {
        ZO_ASSERT_OK(zo_adam_q8_quantize(x, N, is_signed, codes, absmax));
        ZO_ASSERT_OK(zo_adam_q8_dequantize(codes, absmax, N, is_signed, back));
        assert_true(absmax[0] == 0.0f && absmax[1] == 0.0f);
        for (size_t i = 0; i < 2 * QB; i++)
            assert_true(back[i] == 0.0f);
        assert_true(absmax[2] == 256e36f);
        for (size_t i = 0; i < QB && is_signed; i++) {
            double r = x[2 * QB + i] / (double)absmax[2];
            check_code_nearest(zo_adam_q8_map(1), r, codes[2 * QB + i], "huge", i);
            assert_true(fabs(back[2 * QB + i] - x[2 * QB + i]) <= 0.01 * absmax[2]);
        }
        assert_true(isinf(absmax[3]) && isinf(back[3 * QB + 5]));
        assert_true(isnan(absmax[4]) && isnan(back[4 * QB]));
    }
    free(x);
    free(back);
}

/* ---- the fused step ---- */

typedef struct q8_case {
    adam_case a; /* grad, master, out; its m and v are the codes */
    float *ms, *vs;
} q8_case;

static void q8_alloc(q8_case *q, size_t n, zo_dtype gt, zo_dtype ot)
{
    case_alloc(&q->a, n, gt, ZO_DTYPE_I8, ot);
    q->ms = xcalloc(zo_adam_q8_blocks(n), 4);
    q->vs = xcalloc(zo_adam_q8_blocks(n), 4);
    q->a.b.m_absmax = q->ms;
    q->a.b.v_absmax = q->vs;
}

static void q8_free(q8_case *q)
{
    case_free(&q->a);
    free(q->ms);
    free(q->vs);
}

/* Moments of varied magnitude per block (one block of zeros), encoded. */
static void q8_fill(q8_case *q, uint64_t *s)
{
    size_t n = q->a.n;
    float *m = xcalloc(n, 4), *v = xcalloc(n, 4);
    case_fill_grads(&q->a, s);
    for (size_t i = 0; i < n; i++) {
        q->a.master[i] = rand_value(s, -60, 30);
        int e = (int)((i / QB) % 7) * 4 - 20;
        if (i / QB != 1) {
            m[i] = (float)ldexp(rand_unit(s) * 2 - 1, e);
            v[i] = (float)ldexp(rand_unit(s), 2 * e);
        }
    }
    ZO_ASSERT_OK(zo_adam_q8_quantize(m, n, 1, q->a.m, q->ms));
    ZO_ASSERT_OK(zo_adam_q8_quantize(v, n, 0, q->a.v, q->vs));
    free(m);
    free(v);
}

typedef struct q8_state {
    void *bytes;
    size_t len;
} q8_state;

/* Everything the step writes, in one buffer, to restore and compare:
 * master, the m and v scales, the m and v codes, out (the fp32 arrays
 * first, so they stay aligned). */
static q8_state q8_save(const q8_case *q)
{
    size_t n = q->a.n, nb = zo_adam_q8_blocks(n);
    size_t ob = q->a.out ? zo_dtype_size(q->a.ot) * n : 0;
    q8_state st = {NULL, 4 * n + 2 * n + 8 * nb + ob};
    char *p = st.bytes = xcalloc(1, st.len);
    memcpy(p, q->a.master, 4 * n);
    memcpy(p += 4 * n, q->ms, 4 * nb);
    memcpy(p += 4 * nb, q->vs, 4 * nb);
    memcpy(p += 4 * nb, q->a.m, n);
    memcpy(p += n, q->a.v, n);
    if (q->a.out)
        memcpy(p + n, q->a.out, ob);
    return st;
}

static void q8_restore(q8_case *q, const q8_state *st)
{
    size_t n = q->a.n, nb = zo_adam_q8_blocks(n);
    const char *p = st->bytes;
    memcpy(q->a.master, p, 4 * n);
    memcpy(q->ms, p += 4 * n, 4 * nb);
    memcpy(q->vs, p += 4 * nb, 4 * nb);
    memcpy(q->a.m, p += 4 * nb, n);
    memcpy(q->a.v, p += n, n);
    if (q->a.out)
        memcpy(q->a.out, p + n, zo_dtype_size(q->a.ot) * n);
}

/* The reference: decode in double, update in double, then per block the
 * new absmax and each code must be a nearest one of the normalized moment. */
static void check_step_against_reference(const q8_case *q, const q8_state *before,
                                         const zo_adam_params *p, const char *label)
{
    size_t n = q->a.n;
    const char *bp = before->bytes;
    const float *w0 = (const float *)bp;
    const float *ms0 = w0 + n, *vs0 = ms0 + zo_adam_q8_blocks(n);
    const uint8_t *mc0 = (const uint8_t *)(vs0 + zo_adam_q8_blocks(n)), *vc0 = mc0 + n;
    const float *smap = zo_adam_q8_map(1), *umap = zo_adam_q8_map(0);
    double b1 = p->beta1, b2 = p->beta2, lr = p->lr, wd = p->weight_decay;
    double bc1 = 1.0 - pow(b1, (double)p->step), bc2 = 1.0 - pow(b2, (double)p->step);
    double *rm = xcalloc(QB, 8), *rv = xcalloc(QB, 8);
    for (size_t b0 = 0; b0 < n; b0 += QB) {
        size_t e = n - b0 < QB ? n : b0 + QB, blk = b0 / QB;
        double mmax = 0, vmax = 0;
        for (size_t i = b0; i < e; i++) {
            double g = ref_load(q->a.grad, q->a.gt, i) * (double)p->grad_scale;
            double m0 = (double)(smap[mc0[i]] * ms0[blk]), v0 = (double)(umap[vc0[i]] * vs0[blk]);
            double m = b1 * m0 + (1 - b1) * g, v = b2 * v0 + (1 - b2) * g * g;
            double denom = sqrt(v) / sqrt(bc2) + p->eps;
            double w = w0[i] * (1 - lr * wd) - lr / bc1 * m / denom;
            double terms = fabs(w0[i] * (1 - lr * wd)) +
                           lr / bc1 * (fabs(b1 * m0) + fabs((1 - b1) * g)) / denom;
            if (fabs(q->a.master[i] - w) > 1e-6 * terms + 1e-44)
                fail_msg("%s: master[%zu] = %.9g, reference %.17g", label, i, q->a.master[i], w);
            rm[i - b0] = m;
            rv[i - b0] = v;
            mmax = fmax(mmax, fabs(m));
            vmax = fmax(vmax, v);
        }
        assert_true(fabs(q->ms[blk] - mmax) <= 1e-6 * mmax);
        assert_true(fabs(q->vs[blk] - vmax) <= 1e-6 * vmax);
        const uint8_t *mc = q->a.m, *vc = q->a.v;
        for (size_t i = b0; i < e; i++) {
            check_code_nearest(smap, rm[i - b0] / mmax, mc[i], label, i);
            check_code_nearest(umap, rv[i - b0] / vmax, vc[i], label, i);
        }
    }
    free(rm);
    free(rv);
}

static zo_adam_params q8_params(int level)
{
    zo_adam_params p = ZO_ADAM_PARAMS_INIT;
    p.lr = 1e-2f;
    p.weight_decay = 0.1f;
    p.step = 3;
    p.grad_scale = 0.5f;
    p.simd_level = level;
    return p;
}

static void test_step_matches_reference(void **state)
{
    static const zo_dtype gts[] = {ZO_DTYPE_F32, ZO_DTYPE_F16, ZO_DTYPE_BF16};
    for (int gi = 0; gi < 3; gi++) {
        q8_case q;
        q8_alloc(&q, 9 * QB + 77, gts[gi], ZO_DTYPE_BF16);
        uint64_t s = 100 + (uint64_t)gi;
        q8_fill(&q, &s);
        q8_state before = q8_save(&q);
        zo_adam_params p = q8_params(-1);
        ZO_ASSERT_OK(zo_adam_step(&p, &q.a.b));
        check_step_against_reference(&q, &before, &p, zo_dtype_name(gts[gi]));
        for (size_t i = 0; i < q.a.n; i++) /* out is the master's bf16 rounding */
            assert_int_equal(((uint16_t *)q.a.out)[i], zo_f32_to_bf16(q.a.master[i]));
        free(before.bytes);
        q8_free(&q);
    }
}

/* Each SIMD level's step from q's state, against the scalar level's bytes
 * (the scalar state is returned, for the caller's own checks). */
static q8_state step_at_every_level(q8_case *q, const char *what)
{
    q8_state before = q8_save(q), scalar = {NULL, 0};
    for (int k = 0; k < NLEVELS; k++) {
        if (!zo_cpu_simd_supported(all_levels[k]))
            continue;
        q8_restore(q, &before);
        zo_adam_params p = q8_params((int)all_levels[k]);
        ZO_ASSERT_OK(zo_adam_step(&p, &q->a.b));
        q8_state got = q8_save(q);
        if (!scalar.bytes) {
            scalar = got;
            continue;
        }
        if (memcmp(got.bytes, scalar.bytes, got.len))
            fail_msg("%s %s: differs from scalar", zo_simd_level_name(all_levels[k]), what);
        free(got.bytes);
    }
    q8_restore(q, &scalar);
    free(before.bytes);
    return scalar;
}

/* Each variant from the same inputs, against the scalar one's bytes; the
 * first blocks get an inf and a NaN gradient, which poison only their own
 * blocks. */
static void test_variants_equal_scalar(void **state)
{
    static const zo_dtype gts[] = {ZO_DTYPE_F32, ZO_DTYPE_F16, ZO_DTYPE_BF16};
    static const zo_dtype ots[] = {ZO_DTYPE_NONE, ZO_DTYPE_BF16, ZO_DTYPE_F16, ZO_DTYPE_F32};
    for (int gi = 0; gi < 3; gi++)
        for (int oi = 0; oi < 4; oi++) {
            q8_case q;
            q8_alloc(&q, 7 * QB + 13, gts[gi], ots[oi]);
            uint64_t s = 300 + (uint64_t)(gi * 4 + oi);
            q8_fill(&q, &s);
            case_store(q.a.grad, q.a.gt, 3, INFINITY);
            case_store(q.a.grad, q.a.gt, QB + 7, NAN);
            char what[64];
            snprintf(what, sizeof what, "grad %s out %s", zo_dtype_name(gts[gi]),
                     zo_dtype_name(ots[oi]));
            q8_state scalar = step_at_every_level(&q, what);
            assert_true(isnan(q.ms[0]) || isinf(q.ms[0]));
            assert_true(isnan(q.ms[1]));
            assert_true(isfinite(q.ms[2]) && isfinite(q.vs[2]));
            if (ots[oi] == ZO_DTYPE_F32) /* fp32 parameters: the master's own bits */
                assert_memory_equal(q.a.out, q.a.master, 4 * q.a.n);
            free(scalar.bytes);
            q8_free(&q);
        }
}

/* An infinite master weight under AdamW leaves its block's moments and
 * scales finite (no 0 * inf in the update), the weight stays infinite, and
 * every level equals the scalar one. */
static void test_infinite_weight_keeps_block_scales(void **state)
{
    q8_case q;
    q8_alloc(&q, 3 * QB + 9, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    uint64_t s = 41;
    q8_fill(&q, &s);
    q.a.master[QB + 5] = INFINITY;
    q.a.master[3 * QB + 2] = -INFINITY; /* in the partial last block */
    q8_state scalar = step_at_every_level(&q, "infinite weight");
    assert_true(q.a.master[QB + 5] == INFINITY && q.a.master[3 * QB + 2] == -INFINITY);
    for (size_t b = 0; b < zo_adam_q8_blocks(q.a.n); b++)
        assert_true(isfinite(q.ms[b]) && isfinite(q.vs[b]));
    free(scalar.bytes);
    q8_free(&q);
}

/* Every code of both maps at every position of a 64-element group (the
 * widest decoder reads 64 codes at once), with scales of varied size:
 * each level's step equals the scalar one's, bit for bit. Code (p + j)
 * mod 256 sits at position p of group j, so each position sees all 256. */
static void test_every_code_at_every_lane(void **state)
{
    enum { N = 256 * 64 };
    q8_case q;
    q8_alloc(&q, N, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    uint64_t s = 77;
    for (size_t i = 0; i < N; i++) {
        q.a.master[i] = rand_value(&s, -10, 10);
        ((uint8_t *)q.a.b.m)[i] = (uint8_t)(i % 64 + i / 64);
        ((uint8_t *)q.a.b.v)[i] = (uint8_t)(i % 64 + 3 * (i / 64));
        case_store(q.a.grad, q.a.gt, i, 0.0f);
    }
    for (size_t b = 0; b < zo_adam_q8_blocks(N); b++) {
        q.ms[b] = (float)ldexp(1.0, (int)(b % 9) * 3 - 12);
        q.vs[b] = (float)ldexp(1.0, (int)(b % 7) * 5 - 20);
    }
    q8_state scalar = step_at_every_level(&q, "every code");
    free(scalar.bytes);
    q8_free(&q);
}

/* The pool rounds its tiles up to whole blocks: any tile size, any thread
 * count gives zo_adam_step's bytes. */
static void test_pool_tiles_keep_blocks(void **state)
{
    q8_case q;
    q8_alloc(&q, 40 * QB + 5, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    uint64_t s = 5;
    q8_fill(&q, &s);
    q8_state before = q8_save(&q);
    zo_adam_params p = q8_params(-1);
    ZO_ASSERT_OK(zo_adam_step(&p, &q.a.b));
    q8_state want = q8_save(&q);
    static const size_t tiles[] = {64, 320, 16384};
    for (int t = 0; t < 3; t++) {
        zo_optim_pool_config cfg = ZO_OPTIM_POOL_CONFIG_INIT;
        cfg.nthreads = 3;
        cfg.tile_elems = tiles[t];
        zo_optim_pool_t pool;
        ZO_ASSERT_OK(zo_optim_pool_init(&pool, &cfg));
        q8_restore(&q, &before);
        ZO_ASSERT_OK(zo_optim_pool_adam_step(pool, &p, &q.a.b));
        q8_state got = q8_save(&q);
        assert_memory_equal(got.bytes, want.bytes, want.len);
        free(got.bytes);
        zo_optim_pool_free(pool);
    }
    free(before.bytes);
    free(want.bytes);
    q8_free(&q);
}

/* A NaN gradient is seen by the gradient pass, the loss scaler skips the
 * step and halves its scale: the 8-bit states are never touched. */
static void test_nonfinite_gradient_skipped_by_scaler(void **state)
{
    q8_case q;
    q8_alloc(&q, 3 * QB, ZO_DTYPE_F16, ZO_DTYPE_NONE);
    uint64_t s = 9;
    q8_fill(&q, &s);
    case_store(q.a.grad, q.a.gt, 100, NAN);
    zo_grad_stats st;
    ZO_ASSERT_OK(zo_grad_stats_compute(q.a.grad, q.a.gt, q.a.n, -1, &st));
    assert_true(st.nonfinite);
    zo_loss_scaler sc;
    zo_loss_scaler_config cfg = ZO_LOSS_SCALER_CONFIG_INIT;
    cfg.hysteresis = 1;
    ZO_ASSERT_OK(zo_loss_scaler_init(&sc, &cfg));
    double scale = zo_loss_scaler_scale(&sc);
    ZO_ASSERT_OK(zo_loss_scaler_update(&sc, st.nonfinite));
    assert_true(zo_loss_scaler_scale(&sc) == scale / 2);
    q8_free(&q);
}

static void test_roofline_and_arguments(void **state)
{
    q8_case q;
    q8_alloc(&q, 2 * QB + 3, ZO_DTYPE_BF16, ZO_DTYPE_BF16);
    uint64_t s = 11;
    q8_fill(&q, &s);
    q8_state before = q8_save(&q);
    for (int k = 0; k < NLEVELS; k++) {
        if (!zo_cpu_simd_supported(all_levels[k]))
            continue;
        ZO_ASSERT_OK(zo_adam_roofline(&q.a.b, (int)all_levels[k]));
        assert_memory_equal(q.a.master, before.bytes, 4 * q.a.n);
        size_t codes_at = 4 * q.a.n + 8 * zo_adam_q8_blocks(q.a.n);
        assert_memory_equal(q.a.m, (char *)before.bytes + codes_at, q.a.n);
        assert_memory_equal(q.a.v, (char *)before.bytes + codes_at + q.a.n, q.a.n);
    }
    zo_adam_params p = q8_params(-1);
    zo_adam_buffers b = q.a.b;
    b.m_absmax = NULL;
    ZO_ASSERT_ST(zo_adam_step(&p, &b), ZO_ERR_INVALID_ARG);
    assert_int_equal(zo_adam_moment_bytes(ZO_DTYPE_I8, 257), 260 + 8);
    assert_int_equal(zo_adam_moment_bytes(ZO_DTYPE_BF16, 257), 514);
    assert_int_equal(zo_adam_moment_bytes(ZO_DTYPE_F16, 257), 0);
    free(before.bytes);
    q8_free(&q);
}

/* The code of the map's end of x's sign: one, or -0.993 in the signed map
 * (which has no -1). */
static uint8_t map_end_code(float x, int is_signed)
{
    return !is_signed ? 1 : signbit(x) ? 255 : 128;
}

/* inf and NaNs of several payloads, each at every lane of a 16-wide
 * vector: every level's codes are the scalar's (NEON's conversion of inf
 * saturated where x86's and the scalar's give INT32_MIN, making -inf the
 * code of -0.993 instead of -0.107), and each encodes as the map's end of
 * its sign. */
static void test_nonfinite_codes_equal_scalar(void **state)
{
    static const uint32_t pats[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u,
                                    0xffffffffu, 0x7fffffffu, 0x7fa00000u, 0xff800001u};
    /* NPATS odd: all lanes; then 15 more, which every level but the
     * scalar one encodes in its scalar tail (zs_q8_code) */
    enum { NPATS = sizeof pats / sizeof *pats, N = 16 * NPATS + 15 };
    float x[N];
    uint8_t want[N];
    for (int i = 0; i < N; i++)
        memcpy(&x[i], &pats[i % NPATS], sizeof x[i]);
    for (int is_signed = 0; is_signed < 2; is_signed++) {
        codes_equal_scalar(x, N, is_signed, all_levels + 1, NLEVELS - 1, want);
        for (int i = 0; i < N; i++)
            if (want[i] != map_end_code(x[i], is_signed))
                fail_msg("%s %08x encoded as %u, the map's end is %u",
                         is_signed ? "signed" : "unsigned", pats[i % NPATS], want[i],
                         map_end_code(x[i], is_signed));
    }
}

/* Finite values beyond both maps (above 1.0078125, which the step never
 * encodes: a moment over its block's absmax), 64 in every binade up to
 * FLT_MAX and 2^31 -+ 1 ulp, each at every lane: every level (the
 * AVX-512 ones find a value's entry through other tables than the scalar
 * level's, which agree only within the maps) gives the scalar level's
 * code, the map's end of the value's sign. Before the encoders took
 * magnitudes above one as one, the scalar level's binades wrapped from 4
 * on (-2^31: AVX-512 255, scalar 192) and NEON's conversion saturated
 * from about 2^9 on. */
static void test_out_of_range_codes_equal_scalar(void **state)
{
    enum { MAX = 4 + 2 * 128 * 64 };
    float *one = xcalloc(MAX, 4);
    size_t len = 0;
    static const uint32_t edges[] = {0x4effffffu, 0xceffffffu, 0x4f000001u, 0xcf000001u};
    for (size_t k = 0; k < 4; k++) /* 2^31 -+ 1 ulp; 2^31 itself is in the binade loop */
        memcpy(&one[len++], &edges[k], 4);
    for (uint32_t sign = 0; sign < 2; sign++)
        for (uint32_t e = 127; e < 255; e++)
            for (uint32_t j = 0; j < 64; j++) {
                uint32_t bits = sign << 31 | e << 23 | (j == 63 ? 0x7fffffu : j * 0x20001u);
                if ((bits & 0x7fffffffu) > 0x3f810000u)
                    memcpy(&one[len++], &bits, 4);
            }
    len -= !(len & 1);        /* odd, so each repetition moves every value one lane on */
    size_t n = 16 * len + 15; /* the last 15 through the levels' scalar tails */
    float *x = xcalloc(n, 4);
    uint8_t *want = xcalloc(n, 1);
    for (size_t i = 0; i < n; i++)
        x[i] = one[i % len];
    for (int is_signed = 0; is_signed < 2; is_signed++) {
        codes_equal_scalar(x, n, is_signed, all_levels + 1, NLEVELS - 1, want);
        for (size_t i = 0; i < n; i++)
            if (want[i] != map_end_code(x[i], is_signed))
                fail_msg("%s %a encoded as %u, the map's end is %u",
                         is_signed ? "signed" : "unsigned", (double)x[i], want[i],
                         map_end_code(x[i], is_signed));
    }
    free(one);
    free(x);
    free(want);
}

/* Why int8 moments saved decoded in fp32 (zo-train's checkpoints of a
 * tensor whose blocks straddle its tensor-parallel parts) do not re-encode
 * to the same codes: v's map reaches 1, so decoding and encoding again gives
 * back every code and scale; m's signed map reaches only -0.99296875 below
 * zero, so a block whose largest magnitude is negative decodes it to
 * -0.99296875 x scale and, unless another element decodes to +1 x scale,
 * re-encodes with a smaller scale, and its codes move. Every other block
 * comes back bitwise. */
static void test_decoded_moments_reencode(void **state)
{
    (void)state;
    enum { B = 64, N = B * ZO_ADAM_Q8_BLOCK };
    static float x[N], y[N], s1[B], s2[B];
    static uint8_t c1[N], c2[N];
    const float *map = zo_adam_q8_map(1);
    float lo = 0;
    for (int i = 0; i < 256; i++)
        lo = map[i] < lo ? map[i] : lo;
    assert_true(lo == -0.99296875f);
    uint64_t rng = 7;
    for (int is_signed = 0; is_signed < 2; is_signed++) {
        for (size_t i = 0; i < N; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            float u = (float)(rng >> 40) / (float)(1u << 24);
            x[i] = is_signed ? (u - 0.5f) * 1e-3f : u * u * 1e-6f;
        }
        ZO_ASSERT_OK(zo_adam_q8_quantize(x, N, is_signed, c1, s1));
        ZO_ASSERT_OK(zo_adam_q8_dequantize(c1, s1, N, is_signed, y));
        ZO_ASSERT_OK(zo_adam_q8_quantize(y, N, is_signed, c2, s2));
        int moved = 0;
        for (size_t b = 0; b < B; b++) {
            size_t at = b * ZO_ADAM_Q8_BLOCK, top = at;
            for (size_t i = at; i < at + ZO_ADAM_Q8_BLOCK; i++)
                top = fabsf(x[i]) > fabsf(x[top]) ? i : top;
            int same = s1[b] == s2[b] && !memcmp(c1 + at, c2 + at, ZO_ADAM_Q8_BLOCK);
            /* only a negative top moves a block (its scale shrinks, unless
             * a positive element near the top decodes to +1 x scale) */
            assert_true(same || (is_signed && x[top] < 0 && s2[b] < s1[b]));
            moved += !same;
        }
        assert_true(is_signed ? moved > 0 : moved == 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_map_edges),
        cmocka_unit_test(test_encoding_is_nearest),
        cmocka_unit_test(test_special_blocks),
        cmocka_unit_test(test_step_matches_reference),
        cmocka_unit_test(test_variants_equal_scalar),
        cmocka_unit_test(test_every_code_at_every_lane),
        cmocka_unit_test(test_infinite_weight_keeps_block_scales),
        cmocka_unit_test(test_pool_tiles_keep_blocks),
        cmocka_unit_test(test_nonfinite_gradient_skipped_by_scaler),
        cmocka_unit_test(test_roofline_and_arguments),
        cmocka_unit_test(test_nonfinite_codes_equal_scalar),
        cmocka_unit_test(test_out_of_range_codes_equal_scalar),
        cmocka_unit_test(test_decoded_moments_reencode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
