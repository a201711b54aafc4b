/* The cuda ops against the cpu ops (the reference), on the same inputs, in
 * f32, bf16 and f16. Needs a CUDA GPU: exits 77 (skipped) without one.
 *
 * Tolerances, on the error normalized by the tensor's largest magnitude:
 *   f32:  2e-5 (different summation trees and expf; cuBLAS without TF32),
 *         attention 1e-4
 *   f16:  3e-3 (a rounding boundary can land either side: 1-2 ulps of 2^-11),
 *         attention 1e-2 (scores and probabilities are rounded before the next GEMM)
 *   bf16: 1.6e-2 (1-2 ulps of 2^-8 after rounding), attention 4e-2
 * Exact where the math is: embedding gathers and the embedding gradient
 * (the same adds in the same order), casts, run-to-run repeats, and the Adam
 * step (zo_op_adam: the same fp32 operations in the same order, each rounded
 * once, on both devices). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adam_op_run.h"
#include "flash_suite.h"
#include "ops_suite.h"

static zo_device_t g_cpu, g_gpu;
static zo_stream_t g_cs, g_gs;

static const zo_dtype k_dtypes[] = {ZO_DTYPE_F32, ZO_DTYPE_BF16, ZO_DTYPE_F16};

static double tol(zo_dtype dt)
{
    return dt == ZO_DTYPE_F32 ? 2e-5 : dt == ZO_DTYPE_F16 ? 3e-3 : 1.6e-2;
}
static double tol_attn(zo_dtype dt)
{
    return dt == ZO_DTYPE_F32 ? 1e-4 : dt == ZO_DTYPE_F16 ? 1e-2 : 4e-2;
}

static int setup(void **state)
{
    zo_device_config cfg = ZO_DEVICE_CONFIG_INIT;
    cfg.backend = "cpu";
    cfg.mem_budget = 64u << 20;
    if (zo_device_init(&g_cpu, &cfg) != ZO_OK || zo_stream_create(g_cpu, &g_cs) != ZO_OK)
        return -1;
    cfg.backend = "cuda";
    cfg.mem_budget = 256u << 20;
    if (zo_device_init(&g_gpu, &cfg) != ZO_OK || zo_stream_create(g_gpu, &g_gs) != ZO_OK)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    dev_free_all();
    zo_device_free(g_gpu);
    zo_device_free(g_cpu);
    return 0;
}

static int free_buffers(void **state)
{
    dev_free_all();
    return 0;
}

/* got (cuda) against want (cpu). */
static void close_to(const float *got, const float *want, size_t n, double t, const char *what,
                     zo_dtype dt)
{
    double *w = malloc(n * sizeof *w);
    assert_non_null(w);
    for (size_t i = 0; i < n; i++)
        w[i] = want[i];
    double e = norm_err(got, w, n, 1e-6);
    free(w);
    if (!(e <= t))
        fail_msg("%s (%s): cuda vs cpu normalized error %.3g exceeds %.3g", what, zo_dtype_name(dt),
                 e, t);
}

static void test_gemm(void **state)
{
    uint64_t seed = 101;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gemm_case c = gemm_case_make(&seed, ta, tb, 37, 19, 45, 3, 0.75f, 0.5f);
            for (size_t d = 0; d < 3; d++) {
                zo_dtype dt = k_dtypes[d];
                float *want = run_gemm(g_cs, &c, dt, ZO_DTYPE_F32),
                      *got = run_gemm(g_gs, &c, dt, ZO_DTYPE_F32);
                close_to(got, want, c.nC, 2e-5, "gemm C=f32", dt);
                free(want), free(got);
                want = run_gemm(g_cs, &c, dt, dt);
                got = run_gemm(g_gs, &c, dt, dt);
                close_to(got, want, c.nC, tol(dt), "gemm C=dt", dt);
                free(want), free(got);
            }
            gemm_case_free(&c);
        }
}

static void test_embedding(void **state)
{
    uint64_t seed = 102;
    const int V = 50, D = 40;
    int32_t tok[33];
    for (size_t i = 0; i < 33; i++)
        tok[i] = (int32_t)(zo_test_rand(&seed) % 20); /* many repeats */
    float *table = rand_vec(&seed, (size_t)V * D, 1, ZO_DTYPE_BF16),
          *dout = rand_vec(&seed, 33 * D, 1, ZO_DTYPE_BF16);
    float *g0 = rand_vec(&seed, (size_t)V * D, 1, ZO_DTYPE_BF16);
    for (size_t d = 0; d < 3; d++) {
        zo_dtype dt = k_dtypes[d];
        float *co, *cg, *go, *gg;
        run_embedding(g_cs, dt, dt, table, tok, 33, D, V, dout, g0, &co, &cg);
        run_embedding(g_gs, dt, dt, table, tok, 33, D, V, dout, g0, &go, &gg);
        assert_memory_equal(go, co, 33 * D * sizeof(float));
        assert_memory_equal(gg, cg, (size_t)V * D * sizeof(float));
        free(co), free(cg), free(go), free(gg);
        /* split over the vocabulary in 3 parts (50 ids as 16, 17, 17) */
        run_embedding_parts(g_cs, dt, dt, table, tok, 33, D, V, 3, dout, g0, &co, &cg);
        run_embedding_parts(g_gs, dt, dt, table, tok, 33, D, V, 3, dout, g0, &go, &gg);
        assert_memory_equal(go, co, 33 * D * sizeof(float));
        assert_memory_equal(gg, cg, (size_t)V * D * sizeof(float));
        free(co), free(cg), free(go), free(gg);
    }
    free(table), free(dout), free(g0);
}

static void test_rmsnorm(void **state)
{
    uint64_t seed = 103;
    const size_t rows = 7;
    const int D = 300;
    size_t n = rows * D;
    float *x = rand_vec(&seed, n, 2, ZO_DTYPE_BF16), *w = rand_vec(&seed, D, 1, ZO_DTYPE_BF16);
    float *dy = rand_vec(&seed, n, 1, ZO_DTYPE_BF16), *dw0 = rand_vec(&seed, D, 1, ZO_DTYPE_BF16);
    float *dx0 = rand_vec(&seed, n, 1, ZO_DTYPE_BF16);
    for (size_t d = 0; d < 3; d++) {
        zo_dtype dt = k_dtypes[d];
        rms_out c = run_rmsnorm(g_cs, dt, x, w, dy, dw0, dx0, rows, D, 1e-5f);
        rms_out g = run_rmsnorm(g_gs, dt, x, w, dy, dw0, dx0, rows, D, 1e-5f);
        close_to(g.y, c.y, n, tol(dt), "rmsnorm y", dt);
        close_to(g.rstd, c.rstd, rows, 2e-6, "rmsnorm rstd", dt);
        close_to(g.dx, c.dx, n, tol(dt), "rmsnorm dx", dt);
        close_to(g.dw, c.dw, D, 2e-5, "rmsnorm dw (f32)", dt);
        close_to(g.dx_acc, c.dx_acc, n, tol(dt), "rmsnorm dx accumulated", dt);
        rms_out_free(&c);
        rms_out_free(&g);
    }
    free(x), free(w), free(dy), free(dw0), free(dx0);
}

static void test_rope(void **state)
{
    uint64_t seed = 104;
    const int B = 2, T = 33, H = 3, hd = 16;
    size_t n = (size_t)B * T * H * hd;
    float *x = rand_vec(&seed, n, 1, ZO_DTYPE_BF16), *dy = rand_vec(&seed, n, 1, ZO_DTYPE_BF16);
    for (size_t d = 0; d < 3; d++) {
        zo_dtype dt = k_dtypes[d];
        float *ct, *cy, *cdx, *gt, *gy, *gdx;
        run_rope(g_cs, dt, x, dy, B, T, H, hd, 10000.0f, 100, &ct, &cy, &cdx);
        run_rope(g_gs, dt, x, dy, B, T, H, hd, 10000.0f, 100, &gt, &gy, &gdx);
        close_to(gt, ct, (size_t)T * hd, 1e-7, "rope table", dt);
        close_to(gy, cy, n, tol(dt), "rope fwd", dt);
        close_to(gdx, cdx, n, tol(dt), "rope bwd", dt);
        free(ct), free(cy), free(cdx), free(gt), free(gy), free(gdx);
    }
    free(x), free(dy);
}

static void test_rope_scaling(void **state)
{
    zo_rope_scaling llama3 = {.type = ZO_ROPE_SCALING_LLAMA3,
                              .factor = 8.0f,
                              .low_freq_factor = 1.0f,
                              .high_freq_factor = 4.0f,
                              .original_max_pos = 8192};
    zo_rope_scaling linear = {.type = ZO_ROPE_SCALING_LINEAR, .factor = 4.0f};
    const zo_rope_scaling *scs[] = {&llama3, &linear};
    for (int i = 0; i < 2; i++) {
        float *ct = run_rope_table_scaled(g_cs, 9, 128, 500000.0f, 9000, scs[i]);
        float *gt = run_rope_table_scaled(g_gs, 9, 128, 500000.0f, 9000, scs[i]);
        close_to(gt, ct, (size_t)9 * 128, 1e-7, "scaled rope table", ZO_DTYPE_F32);
        free(ct), free(gt);
    }
}

static void test_repeat_kv(void **state)
{
    uint64_t seed = 105;
    const size_t rows = 37;
    const int kv = 4, G = 3, hd = 16;
    size_t small = rows * kv * hd, big = small * G;
    float *x = rand_vec(&seed, small, 1, ZO_DTYPE_BF16),
          *dout = rand_vec(&seed, big, 1, ZO_DTYPE_BF16);
    for (size_t d = 0; d < 3; d++) {
        zo_dtype dt = k_dtypes[d];
        float *cy, *cdx, *gy, *gdx;
        run_repeat_kv(g_cs, dt, x, dout, rows, kv, G, hd, &cy, &cdx);
        run_repeat_kv(g_gs, dt, x, dout, rows, kv, G, hd, &gy, &gdx);
        assert_memory_equal(gy, cy, big * sizeof(float));     /* copies: exact */
        assert_memory_equal(gdx, cdx, small * sizeof(float)); /* same fp32 order */
        free(cy), free(cdx), free(gy), free(gdx);
    }
    free(x), free(dout);
}

static void test_bias(void **state)
{
    uint64_t seed = 106;
    const size_t rows = 70;
    const int cols = 300;
    size_t n = rows * cols;
    float *y0 = rand_vec(&seed, n, 1, ZO_DTYPE_BF16), *b = rand_vec(&seed, cols, 1, ZO_DTYPE_BF16);
    float *dy = rand_vec(&seed, n, 1, ZO_DTYPE_BF16),
          *db0 = rand_vec(&seed, cols, 1, ZO_DTYPE_BF16);
    for (size_t d = 0; d < 3; d++) {
        zo_dtype dt = k_dtypes[d];
        float *cy, *cdb, *gy, *gdb;
        run_bias(g_cs, dt, dt, y0, b, dy, db0, rows, cols, &cy, &cdb);
        run_bias(g_gs, dt, dt, y0, b, dy, db0, rows, cols, &gy, &gdb);
        close_to(gy, cy, n, tol(dt), "bias fwd", dt);
        close_to(gdb, cdb, (size_t)cols, tol(dt), "bias bwd", dt);
        free(cy), free(cdb), free(gy), free(gdb);
    }
    free(y0), free(b), free(dy), free(db0);
}

static void test_softmax(void **state)
{
    uint64_t seed = 105;
    const size_t nm = 4;
    const int T = 300; /* rows longer than a block */
    size_t n = nm * T * T;
    float *x = rand_vec(&seed, n, 4, ZO_DTYPE_BF16), *dp = rand_vec(&seed, n, 1, ZO_DTYPE_BF16);
    for (size_t d = 0; d < 3; d++) {
        zo_dtype dt = k_dtypes[d];
        float *cp, *cdx, *gp, *gdx;
        run_softmax(g_cs, dt, x, dp, nm, T, &cp, &cdx);
        run_softmax(g_gs, dt, x, dp, nm, T, &gp, &gdx);
        close_to(gp, cp, n, tol(dt), "causal softmax fwd", dt);
        close_to(gdx, cdx, n, tol(dt), "causal softmax bwd", dt);
        free(cp), free(cdx), free(gp), free(gdx);
    }
    free(x), free(dp);
}

static void test_attention(void **state)
{
    uint64_t seed = 106;
    const int B = 2, T = 40, H = 4, hd = 16;
    size_t n = (size_t)B * T * H * hd, na = (size_t)B * H * T * T;
    float *q = rand_vec(&seed, n, 1, ZO_DTYPE_BF16), *k = rand_vec(&seed, n, 1, ZO_DTYPE_BF16);
    float *v = rand_vec(&seed, n, 1, ZO_DTYPE_BF16), *d = rand_vec(&seed, n, 1, ZO_DTYPE_BF16);
    for (size_t i = 0; i < 3; i++) {
        zo_dtype dt = k_dtypes[i];
        attn_out c = run_attention(g_cs, dt, q, k, v, d, B, T, H, hd);
        attn_out g = run_attention(g_gs, dt, q, k, v, d, B, T, H, hd);
        close_to(g.out, c.out, n, tol_attn(dt), "attention out", dt);
        close_to(g.att, c.att, na, tol_attn(dt), "attention probabilities", dt);
        close_to(g.dq, c.dq, n, tol_attn(dt), "attention dq", dt);
        close_to(g.dk, c.dk, n, tol_attn(dt), "attention dk", dt);
        close_to(g.dv, c.dv, n, tol_attn(dt), "attention dv", dt);
        attn_out_free(&c);
        attn_out_free(&g);
    }
    free(q), free(k), free(v), free(d);
}

static void test_swiglu(void **state)
{
    uint64_t seed = 107;
    const size_t n = 5000;
    float *g = rand_vec(&seed, n, 6, ZO_DTYPE_BF16), *u = rand_vec(&seed, n, 1, ZO_DTYPE_BF16);
    float *d = rand_vec(&seed, n, 1, ZO_DTYPE_BF16);
    for (size_t i = 0; i < 3; i++) {
        zo_dtype dt = k_dtypes[i];
        float *co, *cg, *cu, *go, *gg, *gu;
        run_swiglu(g_cs, dt, g, u, d, n, &co, &cg, &cu);
        run_swiglu(g_gs, dt, g, u, d, n, &go, &gg, &gu);
        close_to(go, co, n, tol(dt), "swiglu fwd", dt);
        close_to(gg, cg, n, tol(dt), "swiglu dgate", dt);
        close_to(gu, cu, n, tol(dt), "swiglu dup", dt);
        free(co), free(cg), free(cu), free(go), free(gg), free(gu);
    }
    free(g), free(u), free(d);
}

static void test_cross_entropy(void **state)
{
    uint64_t seed = 108;
    const size_t rows = 9;
    const int V = 1000;
    int32_t tgt[9];
    for (size_t r = 0; r < rows; r++)
        tgt[r] = (int32_t)(zo_test_rand(&seed) % V);
    float *x = rand_vec(&seed, rows * V, 6, ZO_DTYPE_BF16);
    for (size_t i = 0; i < 3; i++) {
        zo_dtype dt = k_dtypes[i];
        float clf, cl, glf, gl, *crl, *cdl, *grl, *gdl;
        run_xent(g_cs, dt, x, tgt, rows, V, 0.25f, &clf, &cl, &crl, &cdl);
        run_xent(g_gs, dt, x, tgt, rows, V, 0.25f, &glf, &gl, &grl, &gdl);
        close_to(&gl, &cl, 1, 1e-5, "cross-entropy loss", dt);
        close_to(&glf, &clf, 1, 1e-5, "cross-entropy loss (forward only)", dt);
        close_to(grl, crl, rows, 1e-5, "cross-entropy row loss", dt);
        close_to(gdl, cdl, rows * V, tol(dt), "cross-entropy dlogits", dt);
        /* in chunks of 4 rows on the GPU: its own whole-batch bits */
        float kl, *krl, *kdl;
        run_xent_chunked(g_gs, dt, x, tgt, rows, V, 0.25f, 4, &kl, &krl, &kdl);
        assert_memory_equal(&kl, &gl, sizeof gl);
        assert_memory_equal(krl, grl, rows * sizeof *grl);
        assert_memory_equal(kdl, gdl, rows * V * sizeof *gdl);
        free(krl), free(kdl);
        /* over the vocabulary in 3 parts (1000 ids as 333, 333, 334), chunks of 4 rows */
        float pcl, pgl, *pcrl, *pcdl, *pgrl, *pgdl;
        run_xent_parts(g_cs, dt, x, tgt, rows, V, 3, 0.25f, 4, &pcl, &pcrl, &pcdl);
        run_xent_parts(g_gs, dt, x, tgt, rows, V, 3, 0.25f, 4, &pgl, &pgrl, &pgdl);
        close_to(&pgl, &pcl, 1, 1e-5, "parallel cross-entropy loss", dt);
        close_to(pgrl, pcrl, rows, 1e-5, "parallel cross-entropy row loss", dt);
        close_to(pgdl, pcdl, rows * V, tol(dt), "parallel cross-entropy dlogits", dt);
        free(pcrl), free(pcdl), free(pgrl), free(pgdl);
        free(crl), free(cdl), free(grl), free(gdl);
    }
    free(x);
}

static void test_elementwise(void **state)
{
    uint64_t seed = 109;
    const size_t n = 70001;
    float *a = rand_vec(&seed, n, 3, ZO_DTYPE_F32), *b = rand_vec(&seed, n, 3, ZO_DTYPE_F32);
    for (size_t i = 0; i < 3; i++) {
        zo_dtype dt = k_dtypes[i];
        ew_out c = run_elementwise(g_cs, dt, a, b, n, 0.375f),
               g = run_elementwise(g_gs, dt, a, b, n, 0.375f);
        close_to(g.add, c.add, n, tol(dt), "add", dt);
        close_to(g.scaled, c.scaled, n, tol(dt), "scale", dt);
        close_to(g.axpy, c.axpy, n, 2e-6, "axpy into f32", dt);
        assert_memory_equal(g.to_dt, c.to_dt, n * sizeof(float)); /* rounding is exact arithmetic */
        assert_memory_equal(g.to_f32, c.to_f32, n * sizeof(float));
        close_to(&g.sumsq, &c.sumsq, 1, 1e-5, "sumsq", dt);
        close_to(&g.sumsq_acc, &c.sumsq_acc, 1, 1e-5, "sumsq accumulated", dt);
        ew_out_free(&c);
        ew_out_free(&g);
    }
    free(a), free(b);
}

/* ---- the fused attention ----
 * bf16 and fp16 with head_dim 64/80/96/128 run on the tensor-core kernels
 * (flash_tc_cuda.cu) on sm_80+, fp32 on the scalar one (flash_cuda.cu).
 * Bounds against the cpu (normalized by the tensor's largest magnitude):
 * fp32 tol() (the scalar kernel keeps every product in fp32; only the
 * summation order differs); bf16 and fp16 tol_attn(): the tensor-core
 * kernels round the probabilities P and the score gradients dS to the dtype
 * before their products (the cpu keeps them in fp32), as the materialized op
 * rounds them before its GEMMs, and dq and dk are sums of dS terms of both
 * signs, so an element's rounding (2^-9 bf16, 2^-12 fp16, relative) is not
 * divided by the result's magnitude; lse 2e-5 (fp32 scores of exact
 * bf16/fp16 products, summed in another order). bf16 and fp16 are also run
 * on the scalar kernel (ZO_CUDA_FLASH_SCALAR=1) first and held to the same
 * bound, so a failure message says which kernel is off.
 * Run to run: equal bits (no atomics; the tile order is fixed). */

/* The cuda-only shapes: longer sequences (several 64-row tiles, none a
 * multiple of 64), masks whose block is smaller (32) and larger (128) than
 * the tensor-core tile, non-causal, GQA with 2 query heads per kv head. */
enum { FLASH_TC_SHAPES = 4 };

static flash_case flash_tc_shape(size_t si, uint8_t mask[128])
{
    static const int shapes[FLASH_TC_SHAPES][8] = {
        /* B, T, H, KV, D, causal, window, layout (0 none, 1 sliding 32, 2 fixed 128) */
        {2, 300, 4, 2, 128, 1, 0, 1},
        {1, 257, 2, 1, 64, 1, 100, 2},
        {1, 200, 2, 2, 96, 0, 0, 0},
        {1, 191, 4, 2, 80, 1, 77, 0}};
    const int *sh = shapes[si];
    flash_case c = {sh[0], sh[1], sh[2], sh[3], sh[4], sh[5], sh[6],
                    0,     NULL,  NULL,  NULL,  NULL,  NULL};
    if (sh[7]) {
        zo_attn_layout l = ZO_ATTN_LAYOUT_INIT;
        l.causal = c.causal;
        if (sh[7] == 1)
            l.kind = ZO_ATTN_LAYOUT_SLIDING_WINDOW, l.block = 32, l.window_blocks = 3;
        else
            l.kind = ZO_ATTN_LAYOUT_FIXED, l.block = 128, l.window_blocks = 2, l.global_blocks = 1;
        ZO_ASSERT_OK(zo_attn_layout_build(&l, c.T, mask, 128, NULL, NULL));
        c.mask = mask, c.mask_block = l.block;
    }
    return c;
}

static void case_name(const flash_case *c, zo_dtype dt, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s B=%d T=%d H=%d KV=%d D=%d causal=%d window=%d mask_block=%d",
             zo_dtype_name(dt), c->B, c->T, c->H, c->KV, c->D, c->causal, c->window,
             c->mask ? c->mask_block : 0);
}

/* got (cuda) against want (cpu) for a (batch, seq, heads, D) tensor (heads
 * 0: lse, batch x H x seq); a failure names the case, the tensor, the worst
 * element's (b, t, h, d) and both values. */
static void flash_close(const float *got, const float *want, const flash_case *c, int heads,
                        double t, const char *what, const char *name, const char *vs)
{
    size_t n = heads ? (size_t)c->B * c->T * heads * c->D : (size_t)c->B * c->H * c->T;
    double den = 1e-6, worst = -1.0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)want[i]);
        if (isnan(e))
            e = INFINITY;
        if (e > worst)
            worst = e, at = i;
        if (fabs((double)want[i]) > den)
            den = fabs((double)want[i]);
    }
    if (worst / den <= t)
        return;
    if (heads) {
        size_t d = at % (size_t)c->D, r = at / (size_t)c->D;
        size_t h = r % (size_t)heads, bt = r / (size_t)heads;
        fail_msg("flash %s (%s): %s normalized error %.3g exceeds %.3g; worst at b=%zu "
                 "t=%zu h=%zu d=%zu: %.9g against %.9g (largest |reference| %.6g)",
                 what, name, vs, worst / den, t, bt / (size_t)c->T, bt % (size_t)c->T, h, d,
                 (double)got[at], (double)want[at], den);
    }
    size_t tt = at % (size_t)c->T, bh = at / (size_t)c->T;
    fail_msg("flash %s (%s): %s normalized error %.3g exceeds %.3g; worst at b=%zu h=%zu "
             "t=%zu: %.9g against %.9g",
             what, name, vs, worst / den, t, bh / (size_t)c->H, bh % (size_t)c->H, tt,
             (double)got[at], (double)want[at]);
}

/* Two GPU runs' bits; a failure names the case, the tensor and the first
 * differing element. */
static void flash_same(const float *a, const float *b, size_t n, const char *what, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof a[i]) != 0)
            fail_msg("flash %s (%s): run to run, element %zu differs: %.9g then %.9g", what, name,
                     i, (double)a[i], (double)b[i]);
}

static void flash_close_all(const flash_got *got, const flash_got *want, const flash_case *c,
                            double t, const char *name, const char *vs)
{
    flash_close(got->out, want->out, c, c->H, t, "out", name, vs);
    flash_close(got->lse, want->lse, c, 0, 2e-5, "lse", name, vs);
    flash_close(got->dq, want->dq, c, c->H, t, "dq", name, vs);
    flash_close(got->dk, want->dk, c, c->KV, t, "dk", name, vs);
    flash_close(got->dv, want->dv, c, c->KV, t, "dv", name, vs);
}

static void flash_check_case(flash_case *c)
{
    char name[160];
    for (size_t i = 0; i < 3; i++) {
        zo_dtype dt = k_dtypes[i];
        double t = dt == ZO_DTYPE_F32 ? tol(dt) : tol_attn(dt);
        case_name(c, dt, name, sizeof name);
        flash_got cg = run_flash(g_cs, c, dt);
        /* the scalar kernel first: a failure after it is the tensor-core kernels' */
        if (dt != ZO_DTYPE_F32) {
            assert_int_equal(setenv("ZO_CUDA_FLASH_SCALAR", "1", 1), 0);
            flash_got sg = run_flash(g_gs, c, dt);
            assert_int_equal(unsetenv("ZO_CUDA_FLASH_SCALAR"), 0);
            flash_close_all(&sg, &cg, c, t, name, "cuda (ZO_CUDA_FLASH_SCALAR=1) vs cpu");
            got_free(&sg);
        }
        /* bf16/fp16 here run on the tensor-core kernels on sm_80+ */
        flash_got gg = run_flash(g_gs, c, dt);
        flash_close_all(&gg, &cg, c, t, name, "cuda (default kernel) vs cpu");
        flash_got again = run_flash(g_gs, c, dt);
        flash_same(gg.out, again.out, nq_of(c), "out", name);
        flash_same(gg.lse, again.lse, (size_t)c->B * c->H * c->T, "lse", name);
        flash_same(gg.dq, again.dq, nq_of(c), "dq", name);
        flash_same(gg.dk, again.dk, nk_of(c), "dk", name);
        flash_same(gg.dv, again.dv, nk_of(c), "dv", name);
        got_free(&cg), got_free(&gg), got_free(&again);
        assert_in_place_same(g_gs, c, dt, name);
    }
}

/* The shared shapes (flash_suite.h: MHA and GQA, head dims 64 to 128,
 * sequences off the tile, a BigBird mask of 16-token blocks, an exact
 * window) and the cuda-only ones above, each in fp32, bf16 and fp16. */
static void test_flash_attention(void **state)
{
    uint8_t mask[128];
    for (size_t si = 0; si < FLASH_SHAPES; si++) {
        flash_case c = flash_shape(si, mask);
        case_inputs(&c, 120 + si);
        flash_check_case(&c);
        case_free(&c);
    }
    for (size_t si = 0; si < FLASH_TC_SHAPES; si++) {
        flash_case c = flash_tc_shape(si, mask);
        case_inputs(&c, 140 + si);
        flash_check_case(&c);
        case_free(&c);
    }
}

/* Llama's attention_bias in bf16 (biased keys and a large value bias, as
 * test_flash_attention's cpu case): the cuda backward's delta is summed from
 * the fp32 probabilities (flash_delta_kernel, which both kernels use), not
 * taken as dout . out from the bf16 output, which put dq 4.3e-2 off on the
 * cpu op. The scalar kernel keeps P and dS in fp32 as the cpu does, so it is
 * held to the cpu op's 6e-3 against the cpu; the tensor-core kernels round P
 * and dS to bf16 and keep the bf16 attention bound. */
static void test_flash_bf16_delta_with_biases(void **state)
{
    (void)state;
    uint8_t mask[128];
    for (size_t si = 0; si < FLASH_SHAPES; si++) {
        flash_case c = flash_shape(si, mask);
        case_biased_inputs(&c, si);
        char name[160];
        case_name(&c, ZO_DTYPE_BF16, name, sizeof name);
        flash_got cg = run_flash(g_cs, &c, ZO_DTYPE_BF16);
        assert_int_equal(setenv("ZO_CUDA_FLASH_SCALAR", "1", 1), 0);
        flash_got sg = run_flash(g_gs, &c, ZO_DTYPE_BF16);
        assert_int_equal(unsetenv("ZO_CUDA_FLASH_SCALAR"), 0);
        flash_close_all(&sg, &cg, &c, 6e-3, name, "biased, cuda (ZO_CUDA_FLASH_SCALAR=1) vs cpu");
        flash_got gg = run_flash(g_gs, &c, ZO_DTYPE_BF16);
        flash_close_all(&gg, &cg, &c, tol_attn(ZO_DTYPE_BF16), name,
                        "biased, cuda (default kernel) vs cpu");
        got_free(&cg), got_free(&sg), got_free(&gg);
        case_free(&c);
    }
}

/* zo_op_adam: the cuda kernel against the cpu device's zo_adam_step, bit for
 * bit, over every gradient type, fp32 and bf16 moments, every weight copy,
 * AdamW/L2 decay, bias correction on and off and a gradient scale; 8-bit
 * moments are refused on cuda by name. */
static void test_adam(void **state)
{
    static const zo_dtype gts[] = {ZO_DTYPE_F32, ZO_DTYPE_BF16, ZO_DTYPE_F16};
    static const zo_dtype sts[] = {ZO_DTYPE_F32, ZO_DTYPE_BF16};
    static const zo_dtype ots[] = {ZO_DTYPE_NONE, ZO_DTYPE_BF16, ZO_DTYPE_F16, ZO_DTYPE_F32};
    uint64_t seed = 111;
    for (size_t g = 0; g < 3; g++)
        for (size_t s = 0; s < 2; s++)
            for (size_t o = 0; o < 4; o++)
                for (int opt = 0; opt < ADAM_OP_OPTS; opt++) {
                    zo_adam_params p = adam_op_params(opt);
                    adam_op_bufs cpu =
                        adam_op_bufs_alloc(70000 + 17 * (size_t)opt, gts[g], sts[s], ots[o]);
                    adam_op_fill(&cpu, &seed);
                    adam_op_bufs gpu = adam_op_bufs_copy(&cpu);
                    ZO_ASSERT_OK(adam_op_run(g_cs, &p, &cpu));
                    ZO_ASSERT_OK(adam_op_run(g_gs, &p, &gpu));
                    char what[128];
                    snprintf(what, sizeof what,
                             "zo_op_adam cuda vs cpu (adamw %d, wd %g, bc %d, scale %g, step %lld)",
                             p.adamw, p.weight_decay, p.bias_correction, p.grad_scale,
                             (long long)p.step);
                    adam_op_same(&gpu, &cpu, what);
                    adam_op_bufs_free(&cpu);
                    adam_op_bufs_free(&gpu);
                }
    adam_op_bufs q8 = adam_op_bufs_alloc(512, ZO_DTYPE_F32, ZO_DTYPE_I8, ZO_DTYPE_NONE);
    adam_op_fill(&q8, &seed);
    zo_adam_params p = ZO_ADAM_PARAMS_INIT;
    ZO_ASSERT_ST(adam_op_run(g_gs, &p, &q8), ZO_ERR_UNSUPPORTED);
    if (!strstr(zo_last_error(), "int8"))
        fail_msg("the refusal of 8-bit moments on cuda does not name them: %s", zo_last_error());
    adam_op_bufs_free(&q8);
}

/* The same ops twice on the GPU give the same bits. */
static void test_repeatable(void **state)
{
    uint64_t seed = 110;
    const int B = 2, T = 64, H = 4, hd = 32;
    size_t n = (size_t)B * T * H * hd;
    float *q = rand_vec(&seed, n, 1, ZO_DTYPE_BF16), *k = rand_vec(&seed, n, 1, ZO_DTYPE_BF16);
    float *v = rand_vec(&seed, n, 1, ZO_DTYPE_BF16), *d = rand_vec(&seed, n, 1, ZO_DTYPE_BF16);
    attn_out a = run_attention(g_gs, ZO_DTYPE_BF16, q, k, v, d, B, T, H, hd);
    attn_out b = run_attention(g_gs, ZO_DTYPE_BF16, q, k, v, d, B, T, H, hd);
    assert_memory_equal(a.dq, b.dq, n * sizeof(float));
    assert_memory_equal(a.dk, b.dk, n * sizeof(float));
    assert_memory_equal(a.dv, b.dv, n * sizeof(float));
    attn_out_free(&a);
    attn_out_free(&b);
    ew_out e1 = run_elementwise(g_gs, ZO_DTYPE_BF16, q, k, n, 0.5f),
           e2 = run_elementwise(g_gs, ZO_DTYPE_BF16, q, k, n, 0.5f);
    assert_memory_equal(&e1.sumsq, &e2.sumsq, sizeof(float));
    ew_out_free(&e1);
    ew_out_free(&e2);
    free(q), free(k), free(v), free(d);
}

int main(void)
{
    if (zo_device_cuda_count() == 0) {
        fprintf(stderr, "test_ops_cuda: skipped: no CUDA GPU is visible (%s)\n",
                zo_device_cuda_built() ? "this build has CUDA" : "this build has no CUDA");
        return ZO_TEST_SKIP;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_gemm, free_buffers),
        cmocka_unit_test_teardown(test_embedding, free_buffers),
        cmocka_unit_test_teardown(test_rmsnorm, free_buffers),
        cmocka_unit_test_teardown(test_rope, free_buffers),
        cmocka_unit_test_teardown(test_rope_scaling, free_buffers),
        cmocka_unit_test_teardown(test_repeat_kv, free_buffers),
        cmocka_unit_test_teardown(test_bias, free_buffers),
        cmocka_unit_test_teardown(test_softmax, free_buffers),
        cmocka_unit_test_teardown(test_attention, free_buffers),
        cmocka_unit_test_teardown(test_swiglu, free_buffers),
        cmocka_unit_test_teardown(test_cross_entropy, free_buffers),
        cmocka_unit_test_teardown(test_elementwise, free_buffers),
        cmocka_unit_test_teardown(test_flash_bf16_delta_with_biases, free_buffers),
        cmocka_unit_test_teardown(test_repeatable, free_buffers),
        cmocka_unit_test_teardown(test_flash_attention, free_buffers),
        cmocka_unit_test_teardown(test_adam, free_buffers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
