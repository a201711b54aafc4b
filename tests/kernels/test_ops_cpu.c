/* The compute ops on the cpu device against double-precision references:
 * every forward against a naive double implementation, every backward against
 * central finite differences of that double forward, in f32, bf16 and f16.
 *
 * Inputs are rounded to bf16 so that the three dtypes see exactly the same
 * values and share one reference. Tolerances are on the error normalized by
 * the tensor's largest magnitude (norm_err):
 *   f32:  forward 2e-5, backward 1e-4 (fp32 arithmetic vs double FD, h = 1e-5)
 *   f16:  4e-3 (fp16 keeps 11 bits: output rounding 2^-11 plus fp16 intermediates)
 *   bf16: 2e-2 (bf16 keeps 8 bits: output rounding 2^-9, a few roundings deep)
 *   attention, whose scores and probabilities are rounded to the dtype before
 *   the next GEMM: bf16 5e-2, f16 8e-3. */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_gemm.h"
#include "ops_suite.h"
#include "zo/device_testing.h"

static zo_device_t g_dev;
static zo_stream_t g_s;

static const zo_dtype k_dtypes[] = {ZO_DTYPE_F32, ZO_DTYPE_BF16, ZO_DTYPE_F16};

static double tol_fwd(zo_dtype dt)
{
    return dt == ZO_DTYPE_F32 ? 2e-5 : dt == ZO_DTYPE_F16 ? 4e-3 : 2e-2;
}
static double tol_bwd(zo_dtype dt)
{
    return dt == ZO_DTYPE_F32 ? 1e-4 : dt == ZO_DTYPE_F16 ? 4e-3 : 2e-2;
}
static double tol_attn(zo_dtype dt)
{
    return dt == ZO_DTYPE_F32 ? 1e-4 : dt == ZO_DTYPE_F16 ? 8e-3 : 5e-2;
}

static int setup(void **state)
{
    return cpu_device_open(&g_dev, &g_s, 64u << 20);
}

static int teardown(void **state)
{
    return cpu_device_close(g_dev);
}

static int free_buffers(void **state)
{
    dev_free_all();
    return 0;
}

static double *to_double(const float *v, size_t n)
{
    double *d = malloc(n * sizeof *d);
    assert_non_null(d);
    for (size_t i = 0; i < n; i++)
        d[i] = v[i];
    return d;
}

static double *dcalloc(size_t n)
{
    double *d = calloc(n ? n : 1, sizeof *d);
    assert_non_null(d);
    return d;
}

/* ---- finite differences ----
 * f(ctx) is a scalar loss computed in double from the arrays in ctx; x is
 * one of them. Returns d loss / d x by central differences. */
typedef double (*loss_fn)(void *ctx);

static double *finite_diff(loss_fn f, void *ctx, double *x, size_t n)
{
    double *g = dcalloc(n);
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i], h = 1e-5 * fmax(1.0, fabs(x0));
        x[i] = x0 + h;
        double lp = f(ctx);
        x[i] = x0 - h;
        double lm = f(ctx);
        x[i] = x0;
        g[i] = (lp - lm) / (2.0 * h);
    }
    return g;
}

static double dot(const double *a, const double *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* ---- conversions ---- */

static void test_conversions(void **state)
{
    /* Every fp16 value survives f16 -> f32 -> f16; NaNs stay NaN. */
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = zo_f16_to_f32((uint16_t)h);
        uint16_t back = zo_f32_to_f16(f);
        if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) {
            assert_true(isnan(f));
            assert_int_equal(back & 0x7e00u, 0x7e00u);
            assert_int_equal(back & 0x8000u, h & 0x8000u);
        } else {
            assert_int_equal(back, h);
        }
    }
    /* bf16: exact values round-trip; ties go to even; overflow to inf; NaN stays NaN. */
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = zo_bf16_to_f32((uint16_t)h);
        if (isnan(f))
            assert_true(isnan(zo_bf16_to_f32(zo_f32_to_bf16(f))));
        else
            assert_int_equal(zo_f32_to_bf16(f), h);
    }
    assert_int_equal(zo_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);     /* tie, even below */
    assert_int_equal(zo_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82); /* tie, even above */
    assert_int_equal(zo_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    assert_int_equal(zo_f32_to_bf16(3.4e38f), 0x7f80); /* rounds up to inf */
    assert_int_equal(zo_f32_to_bf16(-NAN) & 0xffc0u, 0xffc0u);
    assert_int_equal(zo_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(zo_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(zo_f32_to_f16(0x1p-25f), 0x0000); /* tie to even zero */
    assert_int_equal(zo_f32_to_f16(0x1p-25f + 0x1p-40f), 0x0001);
    assert_int_equal(zo_f32_to_f16(-0x1p-24f * 3), 0x8003);
    /* Random floats against the nearest of the two neighbours, in double. */
    uint64_t seed = 7;
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)zo_test_rand(&seed);
        float f;
        memcpy(&f, &u, 4);
        if (!isfinite(f) || fabsf(f) > 60000.0f)
            continue;
        uint16_t b = zo_f32_to_bf16(f);
        double err = fabs((double)zo_bf16_to_f32(b) - f);
        double ulp = fabs((double)zo_bf16_to_f32((uint16_t)(b + 1)) - zo_bf16_to_f32(b));
        assert_true(err <= ulp / 2);
        uint16_t h = zo_f32_to_f16(f);
        double errh = fabs((double)zo_f16_to_f32(h) - f);
        double uh =
            fabs((double)zo_f16_to_f32((uint16_t)((h & 0x7fffu) + 1)) - fabs(zo_f16_to_f32(h)));
        double ul =
            (h & 0x7fffu)
                ? fabs(fabs(zo_f16_to_f32(h)) - zo_f16_to_f32((uint16_t)((h & 0x7fffu) - 1)))
                : uh;
        assert_true(errh <= fmax(uh, ul) / 2);
    }
}

/* ---- GEMM ---- */

static double gemm_at(const float *M, int64_t base, int64_t ld, int trans, int r, int c)
{
    return trans ? M[base + (int64_t)c * ld + r] : M[base + (int64_t)r * ld + c];
}

static double *ref_gemm(const gemm_case *c)
{
    double *C = to_double(c->C0, c->nC);
    for (int p = 0; p < c->batch; p++)
        for (int i = 0; i < c->m; i++)
            for (int j = 0; j < c->n; j++) {
                double acc = 0.0;
                for (int kk = 0; kk < c->k; kk++)
                    acc += gemm_at(c->A, p * c->sa, c->lda, c->ta, i, kk) *
                           gemm_at(c->B, p * c->sb, c->ldb, c->tb, kk, j);
                int64_t o = p * c->sc + (int64_t)i * c->ldc + j;
                C[o] = c->alpha * acc + c->beta * C[o];
            }
    return C;
}

static void test_gemm_forward(void **state)
{
    uint64_t seed = 11;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gemm_case c = gemm_case_make(&seed, ta, tb, 5, 7, 9, 3, 0.75f, 0.5f);
            double *want = ref_gemm(&c);
            for (size_t d = 0; d < 3; d++) {
                zo_dtype dt = k_dtypes[d];
                float *got = run_gemm(g_s, &c, dt, ZO_DTYPE_F32); /* fp32 accumulate and output */
                ASSERT_CLOSE(got, want, c.nC, dt == ZO_DTYPE_F32 ? 2e-6 : 2e-6, "gemm C=f32");
                free(got);
                got = run_gemm(g_s, &c, dt, dt);
                ASSERT_CLOSE(got, want, c.nC, tol_fwd(dt), "gemm C=dt");
                free(got);
            }
            free(want);
            gemm_case_free(&c);
        }
    /* beta = 0 ignores NaN in C. */
    gemm_case c = gemm_case_make(&seed, 0, 0, 4, 3, 2, 1, 1.0f, 0.0f);
    double *want = ref_gemm(&c); /* C0 is finite here and beta is 0 */
    for (size_t i = 0; i < c.nC; i++)
        c.C0[i] = NAN;
    float *got = run_gemm(g_s, &c, ZO_DTYPE_BF16, ZO_DTYPE_F32);
    for (int i = 0; i < c.m; i++)
        for (int j = 0; j < c.n; j++)
            assert_true(fabs(got[i * c.ldc + j] - want[i * c.ldc + j]) < 1e-6);
    free(got);
    free(want);
    gemm_case_free(&c);
}

/* GEMM's backward is GEMMs with transposes: dA = dC B^T, dB = A^T dC.
 * Checked against finite differences of L = sum dC . (A B). */
typedef struct gemm_fd {
    double *A, *B, *dC;
    int m, n, k;
} gemm_fd;

static double gemm_loss(void *p)
{
    gemm_fd *g = p;
    double L = 0.0;
    for (int i = 0; i < g->m; i++)
        for (int j = 0; j < g->n; j++) {
            double acc = 0.0;
            for (int kk = 0; kk < g->k; kk++)
                acc += g->A[i * g->k + kk] * g->B[kk * g->n + j];
            L += g->dC[i * g->n + j] * acc;
        }
    return L;
}

static float *gemm_dev(const float *A, int ta, const float *B, int tb, int m, int n, int k,
                       zo_dtype dt)
{
    zo_gemm_desc g = ZO_GEMM_DESC_INIT;
    g.trans_a = ta;
    g.trans_b = tb;
    g.m = m;
    g.n = n;
    g.k = k;
    g.a = dev_from(g_s, A, (size_t)m * k, dt);
    g.b = dev_from(g_s, B, (size_t)k * n, dt);
    g.c = dev_zeros(g_s, (size_t)m * n * zo_dtype_size(dt));
    g.a_type = g.b_type = g.c_type = dt;
    g.lda = ta ? m : k;
    g.ldb = tb ? k : n;
    g.ldc = n;
    ZO_ASSERT_OK(zo_op_gemm(g_s, &g));
    return dev_to_host(g_s, g.c, (size_t)m * n, dt);
}

static void test_gemm_backward(void **state)
{
    uint64_t seed = 12;
    const int m = 6, n = 5, k = 7;
    float *A = rand_vec(&seed, m * k, 1, ZO_DTYPE_BF16),
          *B = rand_vec(&seed, k * n, 1, ZO_DTYPE_BF16);
    float *dC = rand_vec(&seed, m * n, 1, ZO_DTYPE_BF16);
    gemm_fd ctx = {to_double(A, m * k), to_double(B, k * n), to_double(dC, m * n), m, n, k};
    double *fdA = finite_diff(gemm_loss, &ctx, ctx.A, m * k),
           *fdB = finite_diff(gemm_loss, &ctx, ctx.B, k * n);
    for (size_t d = 0; d < 3; d++) {
        float *dA = gemm_dev(dC, 0, B, 1, m, k, n, k_dtypes[d]); /* dC (m x n) B^T */
        float *dB = gemm_dev(A, 1, dC, 0, k, n, m, k_dtypes[d]); /* A^T (k x m) dC */
        ASSERT_CLOSE(dA, fdA, m * k, tol_bwd(k_dtypes[d]), "gemm dA");
        ASSERT_CLOSE(dB, fdB, k * n, tol_bwd(k_dtypes[d]), "gemm dB");
        free(dA);
        free(dB);
    }
    free(A), free(B), free(dC), free(fdA), free(fdB), free(ctx.A), free(ctx.B), free(ctx.dC);
}

/* ---- embedding ---- */

typedef struct emb_fd {
    double *table, *dout;
    const int32_t *tok;
    size_t N;
    int D;
} emb_fd;

static double emb_loss(void *p)
{
    emb_fd *e = p;
    double L = 0.0;
    for (size_t t = 0; t < e->N; t++)
        for (int j = 0; j < e->D; j++)
            L += e->dout[t * e->D + j] * e->table[(size_t)e->tok[t] * e->D + j];
    return L;
}

static void test_embedding(void **state)
{
    uint64_t seed = 21;
    const int V = 11, D = 6;
    const int32_t tok[] = {3, 0, 10, 3, 7, 3, 1, 10, 5};
    const size_t N = sizeof tok / sizeof *tok;
    float *table = rand_vec(&seed, (size_t)V * D, 1, ZO_DTYPE_BF16);
    float *dout = rand_vec(&seed, N * D, 1, ZO_DTYPE_BF16),
          *dt0 = rand_vec(&seed, (size_t)V * D, 1, ZO_DTYPE_BF16);
    emb_fd ctx = {to_double(table, (size_t)V * D), to_double(dout, N * D), tok, N, D};
    double *fd = finite_diff(emb_loss, &ctx, ctx.table, (size_t)V * D);
    for (size_t i = 0; i < (size_t)V * D; i++)
        fd[i] += dt0[i]; /* the op accumulates */
    for (size_t d = 0; d < 3; d++) {
        float *out, *dtab;
        run_embedding(g_s, k_dtypes[d], ZO_DTYPE_F32, table, tok, N, D, V, dout, dt0, &out, &dtab);
        for (size_t t = 0; t < N; t++) /* a gather is exact */
            assert_memory_equal(&out[t * D], &table[(size_t)tok[t] * D], D * sizeof(float));
        ASSERT_CLOSE(dtab, fd, (size_t)V * D, 1e-6, "embedding dtable (f32)");
        free(out);
        free(dtab);
    }
    float *out, *dtab; /* a bf16 gradient table accumulates with bf16 rounding */
    run_embedding(g_s, ZO_DTYPE_BF16, ZO_DTYPE_BF16, table, tok, N, D, V, dout, dt0, &out, &dtab);
    ASSERT_CLOSE(dtab, fd, (size_t)V * D, 2e-2, "embedding dtable (bf16)");
    /* split over the vocabulary (3 parts: 11 rows as 3, 4, 4): the summed
     * lookups and the parts' gradients are the whole op's, bit for bit */
    for (int parts = 2; parts <= 3; parts++)
        for (size_t d = 0; d < 3; d++) {
            float *pout, *pdtab, *wout, *wdtab;
            run_embedding(g_s, k_dtypes[d], k_dtypes[d], table, tok, N, D, V, dout, dt0, &wout,
                          &wdtab);
            run_embedding_parts(g_s, k_dtypes[d], k_dtypes[d], table, tok, N, D, V, parts, dout,
                                dt0, &pout, &pdtab);
            assert_memory_equal(pout, wout, N * D * sizeof *pout);
            assert_memory_equal(pdtab, wdtab, (size_t)V * D * sizeof *pdtab);
            free(pout), free(pdtab), free(wout), free(wdtab);
        }
    free(out), free(dtab), free(table), free(dout), free(dt0), free(fd), free(ctx.table),
        free(ctx.dout);
}

/* ---- RMSNorm ---- */

typedef struct rms_fd {
    double *x, *w, *dy;
    size_t rows;
    int D;
    double eps;
} rms_fd;

static void ref_rms(const rms_fd *r, double *y, double *rstd)
{
    for (size_t i = 0; i < r->rows; i++) {
        double ss = 0.0;
        for (int j = 0; j < r->D; j++)
            ss += r->x[i * r->D + j] * r->x[i * r->D + j];
        double rs = 1.0 / sqrt(ss / r->D + r->eps);
        if (rstd)
            rstd[i] = rs;
        for (int j = 0; j < r->D; j++)
            y[i * r->D + j] = r->x[i * r->D + j] * rs * r->w[j];
    }
}

static double rms_loss(void *p)
{
    rms_fd *r = p;
    double *y = dcalloc(r->rows * r->D);
    ref_rms(r, y, NULL);
    double L = dot(y, r->dy, r->rows * r->D);
    free(y);
    return L;
}

static void test_rmsnorm(void **state)
{
    uint64_t seed = 31;
    const size_t rows = 5;
    const int D = 12;
    const float eps = 1e-5f;
    size_t n = rows * D;
    float *x = rand_vec(&seed, n, 2, ZO_DTYPE_BF16), *w = rand_vec(&seed, D, 1, ZO_DTYPE_BF16);
    float *dy = rand_vec(&seed, n, 1, ZO_DTYPE_BF16), *dw0 = rand_vec(&seed, D, 1, ZO_DTYPE_BF16);
    float *dx0 = rand_vec(&seed, n, 1, ZO_DTYPE_BF16);
    rms_fd ctx = {to_double(x, n), to_double(w, D), to_double(dy, n), rows, D, eps};
    double *y = dcalloc(n), *rstd = dcalloc(rows);
    ref_rms(&ctx, y, rstd);
    double *fdx = finite_diff(rms_loss, &ctx, ctx.x, n),
           *fdw = finite_diff(rms_loss, &ctx, ctx.w, D);
    double *fdx_acc = dcalloc(n);
    for (size_t i = 0; i < n; i++)
        fdx_acc[i] = fdx[i] + dx0[i];
    for (int j = 0; j < D; j++)
        fdw[j] += dw0[j];
    for (size_t d = 0; d < 3; d++) {
        zo_dtype dt = k_dtypes[d];
        rms_out o = run_rmsnorm(g_s, dt, x, w, dy, dw0, dx0, rows, D, eps);
        ASSERT_CLOSE(o.y, y, n, tol_fwd(dt), "rmsnorm y");
        ASSERT_CLOSE(o.rstd, rstd, rows, 1e-6, "rmsnorm rstd");
        ASSERT_CLOSE(o.dx, fdx, n, tol_bwd(dt), "rmsnorm dx");
        ASSERT_CLOSE(o.dw, fdw, D, tol_bwd(dt), "rmsnorm dw (accumulated)");
        ASSERT_CLOSE(o.dx_acc, fdx_acc, n, tol_bwd(dt), "rmsnorm dx (accumulated)");
        rms_out_free(&o);
    }
    free(x), free(w), free(dy), free(dw0), free(dx0), free(y), free(rstd), free(fdx), free(fdw),
        free(fdx_acc);
    free(ctx.x), free(ctx.w), free(ctx.dy);
}

/* ---- RoPE ---- */

typedef struct rope_fd {
    double *x, *dy;
    int B, T, H, hd, pos0;
    double theta;
} rope_fd;

static void ref_rope(const rope_fd *r, double *y)
{
    int half = r->hd / 2;
    for (int b = 0; b < r->B; b++)
        for (int t = 0; t < r->T; t++)
            for (int h = 0; h < r->H; h++) {
                size_t base = (((size_t)b * r->T + t) * r->H + h) * r->hd;
                for (int i = 0; i < half; i++) {
                    double ang = (r->pos0 + t) * pow(r->theta, -2.0 * i / r->hd);
                    double x1 = r->x[base + i], x2 = r->x[base + i + half];
                    y[base + i] = x1 * cos(ang) - x2 * sin(ang);
                    y[base + i + half] = x2 * cos(ang) + x1 * sin(ang);
                }
            }
}

static double rope_loss(void *p)
{
    rope_fd *r = p;
    size_t n = (size_t)r->B * r->T * r->H * r->hd;
    double *y = dcalloc(n);
    ref_rope(r, y);
    double L = dot(y, r->dy, n);
    free(y);
    return L;
}

static void test_rope(void **state)
{
    uint64_t seed = 41;
    const int B = 2, T = 5, H = 3, hd = 8, pos0 = 3;
    const float theta = 10000.0f;
    size_t n = (size_t)B * T * H * hd;
    float *x = rand_vec(&seed, n, 1, ZO_DTYPE_BF16), *dy = rand_vec(&seed, n, 1, ZO_DTYPE_BF16);
    rope_fd ctx = {to_double(x, n), to_double(dy, n), B, T, H, hd, pos0, theta};
    double *y = dcalloc(n), *tab = dcalloc((size_t)T * hd);
    ref_rope(&ctx, y);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < hd / 2; i++) {
            double ang = (pos0 + t) * pow(10000.0, -2.0 * i / hd);
            tab[((size_t)t * hd / 2 + i) * 2] = cos(ang);
            tab[((size_t)t * hd / 2 + i) * 2 + 1] = sin(ang);
        }
    double *fd = finite_diff(rope_loss, &ctx, ctx.x, n);
    for (size_t d = 0; d < 3; d++) {
        zo_dtype dt = k_dtypes[d];
        float *gtab, *gy, *gdx;
        run_rope(g_s, dt, x, dy, B, T, H, hd, theta, pos0, &gtab, &gy, &gdx);
        ASSERT_CLOSE(gtab, tab, (size_t)T * hd, 1e-7, "rope table");
        ASSERT_CLOSE(gy, y, n, tol_fwd(dt), "rope fwd");
        ASSERT_CLOSE(gdx, fd, n, tol_bwd(dt), "rope bwd");
        free(gtab), free(gy), free(gdx);
    }
    free(x), free(dy), free(y), free(tab), free(fd), free(ctx.x), free(ctx.dy);
}

/* ---- RoPE scaling: the table against the formula in double ---- */

/* Hugging Face's frequency for pair i (transformers' _compute_llama3_parameters
 * and the linear type), written out independently of the kernels' helper. */
static double ref_scaled_freq(const zo_rope_scaling *sc, double theta, int hd, int i, int *region)
{
    double f = 1.0 / pow(theta, (double)(2 * i) / hd);
    *region = 0;
    if (sc->type == ZO_ROPE_SCALING_LINEAR)
        return f / sc->factor;
    double wavelen = 2.0 * M_PI / f, old = sc->original_max_pos;
    if (wavelen < old / sc->high_freq_factor)
        return f;
    *region = wavelen > old / sc->low_freq_factor ? 2 : 1;
    if (*region == 2)
        return f / sc->factor;
    double smooth =
        (old / wavelen - sc->low_freq_factor) / (sc->high_freq_factor - sc->low_freq_factor);
    return (1.0 - smooth) * f / sc->factor + smooth * f;
}

static void check_scaled_table(const zo_rope_scaling *sc, int want_regions)
{
    const int T = 7, hd = 128, pos0 = 9000;
    const double theta = 500000.0;
    double *want = dcalloc((size_t)T * hd);
    int seen = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < hd / 2; i++) {
            int region;
            double ang = (double)(pos0 + t) * ref_scaled_freq(sc, theta, hd, i, &region);
            seen |= 1 << region;
            want[((size_t)t * hd / 2 + i) * 2] = cos(ang);
            want[((size_t)t * hd / 2 + i) * 2 + 1] = sin(ang);
        }
    assert_int_equal(seen, want_regions); /* every branch of the formula is exercised */
    float *got = run_rope_table_scaled(g_s, T, hd, (float)theta, pos0, sc);
    ASSERT_CLOSE(got, want, (size_t)T * hd, 1e-7, "scaled rope table");
    free(got), free(want);
}

static void test_rope_scaling(void **state)
{
    zo_rope_scaling llama3 = {.type = ZO_ROPE_SCALING_LLAMA3,
                              .factor = 8.0f,
                              .low_freq_factor = 1.0f,
                              .high_freq_factor = 4.0f,
                              .original_max_pos = 8192}; /* Llama 3.1 */
    zo_rope_scaling linear = {.type = ZO_ROPE_SCALING_LINEAR, .factor = 4.0f};
    check_scaled_table(&llama3, 7);
    check_scaled_table(&linear, 1);
    /* no scaling is zo_op_rope_table bitwise */
    zo_rope_scaling none = {.type = ZO_ROPE_SCALING_NONE};
    float *a = run_rope_table_scaled(g_s, 5, 16, 10000.0f, 3, &none);
    float *b = run_rope_table_scaled(g_s, 5, 16, 10000.0f, 3, NULL);
    assert_memory_equal(a, b, 5 * 16 * sizeof(float));
    free(a), free(b);
    float *tab = dev_zeros(g_s, 5 * 16 * sizeof(float));
    zo_rope_scaling bad = {.type = ZO_ROPE_SCALING_LLAMA3,
                           .factor = 8.0f,
                           .low_freq_factor = 4.0f,
                           .high_freq_factor = 1.0f,
                           .original_max_pos = 8192};
    assert_int_equal(zo_op_rope_table_scaled(g_s, tab, 5, 16, 10000.0f, 0, &bad),
                     ZO_ERR_INVALID_ARG);
}

/* ---- YaRN and dynamic NTK: the tables against transformers' formulas ---- */

/* transformers' _compute_yarn_parameters, written out: the ramp between the
 * correction dimensions of beta_fast and beta_slow rotations. */
static double ref_yarn_freq(const zo_rope_scaling *sc, double theta, int hd, int i, int *region)
{
    double f = 1.0 / pow(theta, (double)(2 * i) / hd);
    double lo =
        floor(hd * log(sc->original_max_pos / (sc->beta_fast * 2 * M_PI)) / (2 * log(theta)));
    double hi =
        ceil(hd * log(sc->original_max_pos / (sc->beta_slow * 2 * M_PI)) / (2 * log(theta)));
    lo = fmax(lo, 0), hi = fmin(hi, hd - 1);
    double ramp = fmin(fmax((i - lo) / (hi - lo), 0), 1);
    *region = ramp == 0 ? 0 : ramp == 1 ? 2 : 1;
    double extrapolation = 1 - ramp;
    return f / sc->factor * (1 - extrapolation) + f * extrapolation;
}

static void check_yarn_table(const zo_rope_scaling *sc)
{
    const int T = 5, hd = 128, pos0 = 40000; /* past Qwen2.5's 32768 */
    const double theta = 1000000.0;
    double *want = dcalloc((size_t)T * hd);
    int seen = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < hd / 2; i++) {
            int region;
            double ang = (double)(pos0 + t) * ref_yarn_freq(sc, theta, hd, i, &region);
            seen |= 1 << region;
            want[((size_t)t * hd / 2 + i) * 2] = sc->attention_factor * cos(ang);
            want[((size_t)t * hd / 2 + i) * 2 + 1] = sc->attention_factor * sin(ang);
        }
    assert_int_equal(seen, 7); /* unscaled, ramped and fully scaled pairs */
    float *got = run_rope_table_scaled(g_s, T, hd, (float)theta, pos0, sc);
    ASSERT_CLOSE(got, want, (size_t)T * hd, 1e-7, "yarn rope table");
    free(got), free(want);
}

/* transformers' _compute_dynamic_ntk_parameters at seq_len pos0 + T. */
static void check_dynamic_table(const zo_rope_scaling *sc, int T, int pos0)
{
    const int hd = 64;
    const double theta = 10000.0, max = sc->original_max_pos;
    double n = fmax(pos0 + T, max);
    double base = theta * pow(sc->factor * n / max - (sc->factor - 1), (double)hd / (hd - 2));
    double *want = dcalloc((size_t)T * hd);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < hd / 2; i++) {
            double ang = (double)(pos0 + t) / pow(base, (double)(2 * i) / hd);
            want[((size_t)t * hd / 2 + i) * 2] = cos(ang);
            want[((size_t)t * hd / 2 + i) * 2 + 1] = sin(ang);
        }
    float *got = run_rope_table_scaled(g_s, T, hd, (float)theta, pos0, sc);
    ASSERT_CLOSE(got, want, (size_t)T * hd, 1e-7, "dynamic rope table");
    free(got), free(want);
}

static void test_rope_yarn_and_dynamic(void **state)
{
    /* Qwen2.5's long-context setting: factor 4 over 32768 positions */
    zo_rope_scaling yarn = {.type = ZO_ROPE_SCALING_YARN,
                            .factor = 4.0f,
                            .original_max_pos = 32768,
                            .beta_fast = 32.0f,
                            .beta_slow = 1.0f,
                            .attention_factor = (float)(0.1 * log(4.0) + 1.0)};
    check_yarn_table(&yarn);
    zo_rope_scaling dyn = {.type = ZO_ROPE_SCALING_DYNAMIC, .factor = 2.0f, .original_max_pos = 16};
    check_dynamic_table(&dyn, 7, 20); /* 27 positions: theta grows */
    /* within max_position_embeddings dynamic is the unscaled table bitwise */
    float *a = run_rope_table_scaled(g_s, 16, 64, 10000.0f, 0, &dyn);
    float *b = run_rope_table_scaled(g_s, 16, 64, 10000.0f, 0, NULL);
    assert_memory_equal(a, b, 16 * 64 * sizeof(float));
    free(a), free(b);
    float *tab = dev_zeros(g_s, 5 * 16 * sizeof(float));
    zo_rope_scaling bad = yarn;
    bad.attention_factor = 0;
    assert_int_equal(zo_op_rope_table_scaled(g_s, tab, 5, 16, 10000.0f, 0, &bad),
                     ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "attention_factor"));
    bad = dyn;
    bad.original_max_pos = 0;
    assert_int_equal(zo_op_rope_table_scaled(g_s, tab, 5, 16, 10000.0f, 0, &bad),
                     ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "max_position_embeddings"));
}

/* ---- grouped-query attention's key/value heads ---- */

static void test_repeat_kv(void **state)
{
    uint64_t seed = 57;
    const size_t rows = 6;
    const int kv = 2, hd = 4;
    const int groups[] = {1, 3};
    for (int gi = 0; gi < 2; gi++) {
        const int G = groups[gi];
        size_t small = rows * kv * hd, big = small * G;
        float *x = rand_vec(&seed, small, 1, ZO_DTYPE_BF16),
              *dout = rand_vec(&seed, big, 1, ZO_DTYPE_BF16);
        double *want_dx = dcalloc(small);
        for (size_t r = 0; r < rows; r++)
            for (int k = 0; k < kv; k++)
                for (int j = 0; j < G; j++)
                    for (int i = 0; i < hd; i++)
                        want_dx[(r * kv + k) * hd + i] += dout[((r * kv + k) * G + j) * hd + i];
        for (size_t d = 0; d < 3; d++) {
            zo_dtype dt = k_dtypes[d];
            float *y, *dx;
            run_repeat_kv(g_s, dt, x, dout, rows, kv, G, hd, &y, &dx);
            for (size_t r = 0; r < rows; r++) /* a copy: exact */
                for (int h = 0; h < kv * G; h++)
                    assert_memory_equal(y + (r * kv * G + h) * hd, x + (r * kv + h / G) * hd,
                                        hd * sizeof(float));
            if (G == 1)
                assert_memory_equal(dx, dout, small * sizeof(float));
            ASSERT_CLOSE(dx, want_dx, small, tol_fwd(dt), "repeat_kv bwd");
            free(y), free(dx);
        }
        free(x), free(dout), free(want_dx);
    }
}

/* ---- bias ---- */

static void test_bias(void **state)
{
    uint64_t seed = 58;
    const size_t rows = 9;
    const int cols = 7;
    size_t n = rows * cols;
    float *y0 = rand_vec(&seed, n, 1, ZO_DTYPE_BF16), *b = rand_vec(&seed, cols, 1, ZO_DTYPE_BF16);
    float *dy = rand_vec(&seed, n, 1, ZO_DTYPE_BF16),
          *db0 = rand_vec(&seed, cols, 1, ZO_DTYPE_BF16);
    double *want_y = dcalloc(n), *want_db = dcalloc(cols);
    for (size_t r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            want_y[r * cols + c] = (double)y0[r * cols + c] + b[c];
            want_db[c] += dy[r * cols + c];
        }
    for (int c = 0; c < cols; c++)
        want_db[c] += db0[c];
    for (size_t d = 0; d < 3; d++) {
        zo_dtype dt = k_dtypes[d];
        float *y, *db;
        run_bias(g_s, dt, ZO_DTYPE_F32, y0, b, dy, db0, rows, cols, &y, &db);
        ASSERT_CLOSE(y, want_y, n, tol_fwd(dt), "bias fwd");
        ASSERT_CLOSE(db, want_db, (size_t)cols, 1e-6, "bias bwd (f32 dbias)");
        free(y), free(db);
    }
    free(y0), free(b), free(dy), free(db0), free(want_y), free(want_db);
}

/* ---- causal softmax ---- */

typedef struct sm_fd {
    double *x, *dp;
    size_t nm;
    int T;
} sm_fd;

static void ref_softmax(const double *x, double *p, size_t nm, int T)
{
    for (size_t r = 0; r < nm * T; r++) {
        int t = (int)(r % T);
        const double *xr = x + r * T;
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j <= t; j++)
            mx = fmax(mx, xr[j]);
        for (int j = 0; j <= t; j++)
            sum += exp(xr[j] - mx);
        for (int j = 0; j < T; j++)
            p[r * T + j] = j <= t ? exp(xr[j] - mx) / sum : 0.0;
    }
}

static double sm_loss(void *p)
{
    sm_fd *s = p;
    size_t n = s->nm * s->T * s->T;
    double *pr = dcalloc(n);
    ref_softmax(s->x, pr, s->nm, s->T);
    double L = dot(pr, s->dp, n);
    free(pr);
    return L;
}

static void test_causal_softmax(void **state)
{
    uint64_t seed = 51;
    const size_t nm = 3;
    const int T = 6;
    size_t n = nm * T * T;
    float *x = rand_vec(&seed, n, 3, ZO_DTYPE_BF16), *dp = rand_vec(&seed, n, 1, ZO_DTYPE_BF16);
    sm_fd ctx = {to_double(x, n), to_double(dp, n), nm, T};
    double *p = dcalloc(n);
    ref_softmax(ctx.x, p, nm, T);
    double *fd = finite_diff(sm_loss, &ctx, ctx.x, n);
    for (size_t d = 0; d < 3; d++) {
        zo_dtype dt = k_dtypes[d];
        float *gp, *gdx;
        run_softmax(g_s, dt, x, dp, nm, T, &gp, &gdx);
        ASSERT_CLOSE(gp, p, n, tol_fwd(dt), "causal softmax fwd");
        ASSERT_CLOSE(gdx, fd, n, tol_bwd(dt), "causal softmax bwd");
        for (size_t r = 0; r < nm * T; r++) /* the masked part is exactly zero */
            for (int j = (int)(r % T) + 1; j < T; j++)
                assert_true(gp[r * T + j] == 0.0f && gdx[r * T + j] == 0.0f);
        free(gp), free(gdx);
    }
    free(x), free(dp), free(p), free(fd), free(ctx.x), free(ctx.dp);
}

/* ---- attention ---- */

typedef struct attn_fd {
    double *q, *k, *v, *dout;
    int B, T, H, hd;
} attn_fd;

static void ref_attention(const attn_fd *a, double *out, double *att)
{
    const int B = a->B, T = a->T, H = a->H, D = a->hd;
    double *s = dcalloc((size_t)T * T), *p = dcalloc((size_t)T * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
#define AT(X, t, d) X[(((size_t)b * T + (t)) * H + h) * D + (d)]
            for (int i = 0; i < T; i++)
                for (int j = 0; j < T; j++) {
                    double acc = 0.0;
                    for (int d = 0; d < D; d++)
                        acc += AT(a->q, i, d) * AT(a->k, j, d);
                    s[i * T + j] = acc / sqrt((double)D);
                }
            ref_softmax(s, p, 1, T);
            if (att)
                memcpy(att + ((size_t)b * H + h) * T * T, p, (size_t)T * T * sizeof *p);
            for (int i = 0; i < T; i++)
                for (int d = 0; d < D; d++) {
                    double acc = 0.0;
                    for (int j = 0; j < T; j++)
                        acc += p[i * T + j] * AT(a->v, j, d);
                    AT(out, i, d) = acc;
                }
#undef AT
        }
    free(s);
    free(p);
}

static double attn_loss(void *p)
{
    attn_fd *a = p;
    size_t n = (size_t)a->B * a->T * a->H * a->hd;
    double *o = dcalloc(n);
    ref_attention(a, o, NULL);
    double L = dot(o, a->dout, n);
    free(o);
    return L;
}

static void test_attention(void **state)
{
    uint64_t seed = 61;
    const int B = 2, T = 5, H = 2, hd = 4;
    size_t n = (size_t)B * T * H * hd, na = (size_t)B * H * T * T;
    float *q = rand_vec(&seed, n, 1.5f, ZO_DTYPE_BF16),
          *k = rand_vec(&seed, n, 1.5f, ZO_DTYPE_BF16);
    float *v = rand_vec(&seed, n, 1, ZO_DTYPE_BF16), *dout = rand_vec(&seed, n, 1, ZO_DTYPE_BF16);
    attn_fd ctx = {
        to_double(q, n), to_double(k, n), to_double(v, n), to_double(dout, n), B, T, H, hd};
    double *out = dcalloc(n), *att = dcalloc(na);
    ref_attention(&ctx, out, att);
    double *fq = finite_diff(attn_loss, &ctx, ctx.q, n),
           *fk = finite_diff(attn_loss, &ctx, ctx.k, n);
    double *fv = finite_diff(attn_loss, &ctx, ctx.v, n);
    for (size_t d = 0; d < 3; d++) {
        zo_dtype dt = k_dtypes[d];
        attn_out o = run_attention(g_s, dt, q, k, v, dout, B, T, H, hd);
        ASSERT_CLOSE(o.out, out, n, tol_attn(dt), "attention out");
        ASSERT_CLOSE(o.att, att, na, tol_attn(dt), "attention probabilities");
        ASSERT_CLOSE(o.dq, fq, n, tol_attn(dt), "attention dq");
        ASSERT_CLOSE(o.dk, fk, n, tol_attn(dt), "attention dk");
        ASSERT_CLOSE(o.dv, fv, n, tol_attn(dt), "attention dv");
        attn_out_free(&o);
    }
    free(q), free(k), free(v), free(dout), free(out), free(att), free(fq), free(fk), free(fv);
    free(ctx.q), free(ctx.k), free(ctx.v), free(ctx.dout);
}

/* ---- SwiGLU ---- */

typedef struct swi_fd {
    double *g, *u, *d;
    size_t n;
} swi_fd;

static double silu(double g)
{
    return g / (1.0 + exp(-g));
}

static double swi_loss(void *p)
{
    swi_fd *s = p;
    double L = 0.0;
    for (size_t i = 0; i < s->n; i++)
        L += s->d[i] * silu(s->g[i]) * s->u[i];
    return L;
}

static void test_swiglu(void **state)
{
    uint64_t seed = 71;
    const size_t n = 37;
    float *g = rand_vec(&seed, n, 4, ZO_DTYPE_BF16), *u = rand_vec(&seed, n, 1, ZO_DTYPE_BF16);
    float *d = rand_vec(&seed, n, 1, ZO_DTYPE_BF16);
    swi_fd ctx = {to_double(g, n), to_double(u, n), to_double(d, n), n};
    double *out = dcalloc(n);
    for (size_t i = 0; i < n; i++)
        out[i] = silu(ctx.g[i]) * ctx.u[i];
    double *fg = finite_diff(swi_loss, &ctx, ctx.g, n), *fu = finite_diff(swi_loss, &ctx, ctx.u, n);
    for (size_t k = 0; k < 3; k++) {
        zo_dtype dt = k_dtypes[k];
        float *o, *dg, *du;
        run_swiglu(g_s, dt, g, u, d, n, &o, &dg, &du);
        ASSERT_CLOSE(o, out, n, tol_fwd(dt), "swiglu fwd");
        ASSERT_CLOSE(dg, fg, n, tol_bwd(dt), "swiglu dgate");
        ASSERT_CLOSE(du, fu, n, tol_bwd(dt), "swiglu dup");
        free(o), free(dg), free(du);
    }
    free(g), free(u), free(d), free(out), free(fg), free(fu), free(ctx.g), free(ctx.u), free(ctx.d);
}

/* ---- cross-entropy ---- */

typedef struct xent_fd {
    double *x;
    const int32_t *tgt;
    size_t rows;
    int V;
    double scale;
} xent_fd;

static double ref_row_loss(const double *x, int V, int tgt)
{
    double mx = -INFINITY, sum = 0.0;
    for (int j = 0; j < V; j++)
        mx = fmax(mx, x[j]);
    for (int j = 0; j < V; j++)
        sum += exp(x[j] - mx);
    return mx + log(sum) - x[tgt];
}

static double xent_loss(void *p)
{
    xent_fd *e = p;
    double L = 0.0;
    for (size_t r = 0; r < e->rows; r++)
        L += ref_row_loss(e->x + r * e->V, e->V, e->tgt[r]);
    return e->scale * L / (double)e->rows;
}

/* The double reference: the mean loss, each row's and (finite differences)
 * the gradient of gscale times the loss. */
static void xent_reference(const float *x, const int32_t *tgt, size_t rows, int V, float gscale,
                           double *loss, double **rl, double **fd)
{
    xent_fd ctx = {to_double(x, rows * V), tgt, rows, V, 1.0};
    *loss = xent_loss(&ctx);
    *rl = dcalloc(rows);
    for (size_t r = 0; r < rows; r++)
        (*rl)[r] = ref_row_loss(ctx.x + r * V, V, tgt[r]);
    ctx.scale = gscale;
    *fd = finite_diff(xent_loss, &ctx, ctx.x, rows * V);
    free(ctx.x);
}

static void test_cross_entropy(void **state)
{
    uint64_t seed = 81;
    const size_t rows = 6;
    const int V = 13;
    const int32_t tgt[] = {0, 12, 5, 5, 7, 1};
    const float gscale = 0.5f;
    float *x = rand_vec(&seed, rows * V, 4, ZO_DTYPE_BF16);
    double loss, *rl, *fd;
    xent_reference(x, tgt, rows, V, gscale, &loss, &rl, &fd);
    for (size_t d = 0; d < 3; d++) {
        zo_dtype dt = k_dtypes[d];
        float lf, l, *grl, *gdl;
        run_xent(g_s, dt, x, tgt, rows, V, gscale, &lf, &l, &grl, &gdl);
        assert_true(fabs(lf - loss) <= 1e-5 * fabs(loss));
        assert_true(l == lf); /* the fused gradient does not change the loss */
        ASSERT_CLOSE(grl, rl, rows, 1e-5, "cross-entropy row loss");
        ASSERT_CLOSE(gdl, fd, rows * V, tol_bwd(dt), "cross-entropy dlogits (in place)");
        /* in chunks of 4 rows (the last 2): the same bits, loss included */
        float cl, *crl, *cdl;
        run_xent_chunked(g_s, dt, x, tgt, rows, V, gscale, 4, &cl, &crl, &cdl);
        assert_memory_equal(&cl, &l, sizeof l);
        assert_memory_equal(crl, grl, rows * sizeof *grl);
        assert_memory_equal(cdl, gdl, rows * V * sizeof *gdl);
        free(grl), free(gdl), free(crl), free(cdl);
    }
    free(x), free(rl), free(fd);
}

/* The vocabulary-parallel cross-entropy against the double reference and
 * against the whole-vocabulary op: 1, 2, 3 (13 ids as 4, 4, 5) and 4 parts,
 * whole and in chunks of 4 rows. The parts' logsumexp is combined from
 * per-part maxima and sums, so it agrees with the whole op within fp32
 * round-off, not bitwise. */
static void test_cross_entropy_parts(void **state)
{
    uint64_t seed = 82;
    const size_t rows = 6;
    const int V = 13;
    const int32_t tgt[] = {0, 12, 5, 4, 8, 3}; /* ids in every part, at the parts' edges */
    const float gscale = 0.5f;
    float *x = rand_vec(&seed, rows * V, 4, ZO_DTYPE_BF16);
    x[3 * V + 4] = 30.0f; /* one part's max far above the others' */
    double loss, *rl, *fd;
    xent_reference(x, tgt, rows, V, gscale, &loss, &rl, &fd);
    for (size_t d = 0; d < 3; d++) {
        zo_dtype dt = k_dtypes[d];
        float wl = 0.0f, wlf = 0.0f, *wrl = NULL, *wdl = NULL;
        run_xent(g_s, dt, x, tgt, rows, V, gscale, &wlf, &wl, &wrl, &wdl);
        for (int parts = 1; parts <= 4; parts++)
            for (size_t chunk = 4; chunk <= rows; chunk += rows - 4) {
                float pl = 0.0f, *prl = NULL, *pdl = NULL;
                run_xent_parts(g_s, dt, x, tgt, rows, V, parts, gscale, chunk, &pl, &prl, &pdl);
                assert_true(fabs(pl - loss) <= 1e-5 * fabs(loss));
                assert_true(fabsf(pl - wl) <= 1e-6f * fabsf(wl));
                ASSERT_CLOSE(prl, rl, rows, 1e-5, "parallel cross-entropy row loss");
                ASSERT_CLOSE(pdl, fd, rows * V, tol_bwd(dt), "parallel cross-entropy dlogits");
                for (size_t i = 0; i < rows * V; i++) /* the whole op's within its rounding */
                    assert_true(fabsf(pdl[i] - wdl[i]) <= 1e-6f + 1e-2f * fabsf(wdl[i]));
                free(prl), free(pdl);
            }
        free(wrl), free(wdl);
    }
    free(x), free(rl), free(fd);
}

/* ---- elementwise ---- */

static void test_elementwise(void **state)
{
    uint64_t seed = 91;
    const size_t n = 53;
    const float alpha = -0.625f;
    float *a = rand_vec(&seed, n, 3, ZO_DTYPE_BF16), *b = rand_vec(&seed, n, 3, ZO_DTYPE_BF16);
    float *fine = rand_vec(&seed, n, 3, ZO_DTYPE_F32);
    round_to(a, n, ZO_DTYPE_F16); /* exact in all three dtypes */
    round_to(b, n, ZO_DTYPE_F16);
    double *add = dcalloc(n), *sc = dcalloc(n), *ax = dcalloc(n), ss = 0.0;
    for (size_t i = 0; i < n; i++) {
        add[i] = (double)a[i] + b[i];
        sc[i] = (double)a[i] * alpha;
        ax[i] = (double)b[i] + (double)alpha * a[i];
        ss += (double)a[i] * a[i];
    }
    for (size_t d = 0; d < 3; d++) {
        zo_dtype dt = k_dtypes[d];
        ew_out o = run_elementwise(g_s, dt, a, b, n, alpha);
        ASSERT_CLOSE(o.add, add, n, tol_fwd(dt), "add");
        ASSERT_CLOSE(o.scaled, sc, n, tol_fwd(dt), "scale");
        ASSERT_CLOSE(o.axpy, ax, n, 1e-6, "axpy into f32");
        assert_memory_equal(o.to_dt, a, n * sizeof(float)); /* a is exact in every dtype */
        assert_memory_equal(o.to_f32, a, n * sizeof(float));
        assert_true(fabs(o.sumsq - ss) <= 1e-6 * ss);
        assert_true(fabs(o.sumsq_acc - (ss + alpha)) <= 1e-6 * ss);
        ew_out_free(&o);
    }
    /* Casting values that need rounding matches the host conversions bit for bit. */
    void *src = dev_from(g_s, fine, n, ZO_DTYPE_F32);
    for (size_t d = 1; d < 3; d++) {
        void *dst = dev_zeros(g_s, n * 2);
        ZO_ASSERT_OK(zo_op_cast(g_s, dst, k_dtypes[d], src, ZO_DTYPE_F32, n));
        float *got = dev_to_host(g_s, dst, n, k_dtypes[d]);
        float *want = malloc(n * sizeof *want);
        memcpy(want, fine, n * sizeof *want);
        round_to(want, n, k_dtypes[d]);
        assert_memory_equal(got, want, n * sizeof *got);
        free(got), free(want);
    }
    free(a), free(b), free(fine), free(add), free(sc), free(ax);
}

/* ---- determinism: a mixed sequence on two concurrent streams, twice ---- */

static void run_mixed(zo_stream_t s, uint64_t seed0, float **res, size_t *nres)
{
    uint64_t seed = seed0;
    gemm_case c = gemm_case_make(&seed, 1, 0, 33, 17, 29, 2, 1.0f, 1.0f);
    float *C = run_gemm(s, &c, ZO_DTYPE_BF16, ZO_DTYPE_F32);
    const int B = 2, T = 9, H = 2, hd = 8;
    size_t n = (size_t)B * T * H * hd;
    float *q = rand_vec(&seed, n, 1, ZO_DTYPE_BF16), *k = rand_vec(&seed, n, 1, ZO_DTYPE_BF16);
    float *v = rand_vec(&seed, n, 1, ZO_DTYPE_BF16), *d = rand_vec(&seed, n, 1, ZO_DTYPE_BF16);
    attn_out o = run_attention(s, ZO_DTYPE_BF16, q, k, v, d, B, T, H, hd);
    *nres = c.nC + 3 * n;
    *res = malloc(*nres * sizeof(float));
    memcpy(*res, C, c.nC * sizeof(float));
    memcpy(*res + c.nC, o.dq, n * sizeof(float));
    memcpy(*res + c.nC + n, o.dk, n * sizeof(float));
    memcpy(*res + c.nC + 2 * n, o.out, n * sizeof(float));
    free(C), free(q), free(k), free(v), free(d);
    attn_out_free(&o);
    gemm_case_free(&c);
}

/* Queue GEMMs on s without waiting, so that they run while the caller works
 * on another stream (two OpenBLAS calls at once from two stream threads). */
static void queue_background_gemms(zo_stream_t s, uint64_t *seed)
{
    const int n = 96;
    float *h = rand_vec(seed, (size_t)n * n, 1, ZO_DTYPE_BF16);
    zo_gemm_desc g = ZO_GEMM_DESC_INIT;
    g.m = g.n = g.k = n;
    g.lda = g.ldb = g.ldc = n;
    g.a = g.b = dev_from(s, h, (size_t)n * n, ZO_DTYPE_BF16);
    g.a_type = g.b_type = ZO_DTYPE_BF16;
    g.c = dev_zeros(s, (size_t)n * n * sizeof(float));
    g.beta = 1.0f;
    for (int i = 0; i < 40; i++)
        ZO_ASSERT_OK(zo_op_gemm(s, &g));
    free(h);
}

/* GEMMs large enough for the compute pool to split them along m, along n and
 * along the batch: each matches the reference, and a second run gives the
 * same bits. With ZO_OPS_DUMP=FILE the results are also written to FILE, so
 * that ctest (test_ops_cpu_threads_same_bits) can compare runs at different
 * ZO_CPU_THREADS: the split, and so the bits, must not depend on them. */
static void test_gemm_split_same_bits(void **state)
{
    static const int shapes[][4] = {{300, 40, 70, 1}, {37, 400, 66, 1}, {24, 20, 18, 7}};
    uint64_t seed = 5;
    const char *dump_path = getenv("ZO_OPS_DUMP");
    FILE *dump = dump_path ? fopen(dump_path, "wb") : NULL;
    if (dump_path)
        assert_non_null(dump);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int ta = 0; ta < 2; ta++) {
            const int *sh = shapes[i];
            gemm_case c = gemm_case_make(&seed, ta, !ta, sh[0], sh[1], sh[2], sh[3], 0.5f, 1.0f);
            double *want = ref_gemm(&c);
            for (int cbf = 0; cbf < 2; cbf++) {
                zo_dtype cdt = cbf ? ZO_DTYPE_BF16 : ZO_DTYPE_F32;
                float *a = run_gemm(g_s, &c, ZO_DTYPE_BF16, cdt);
                float *b = run_gemm(g_s, &c, ZO_DTYPE_BF16, cdt);
                ASSERT_CLOSE(a, want, c.nC, cbf ? tol_fwd(cdt) : 2e-6, "split gemm");
                assert_memory_equal(a, b, c.nC * sizeof(float));
                if (dump)
                    assert_int_equal(fwrite(a, sizeof(float), c.nC, dump), c.nC);
                free(a), free(b);
            }
            free(want);
            gemm_case_free(&c);
        }
    if (dump)
        assert_int_equal(fclose(dump), 0);
}

/* The threads this process runs: one entry per task in /proc/self/task. */
static int process_threads(void)
{
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* oneDNN runs inside the pool's tasks on one thread each: it must start no
 * OpenMP team of its own, whose threads would oversubscribe the cores and
 * spin (libgomp's wait policy) after every GEMM, starving the next op.
 * ctest runs this with OMP_NUM_THREADS=4 and ZO_CPU_GEMM=onednn, so a GEMM
 * that left OpenMP at its default would add threads on any machine. Runs
 * first: no bf16 GEMM may have run before the count. */
static void test_onednn_starts_no_threads(void **state)
{
    zo_gemm_desc bf16 = {.a_type = ZO_DTYPE_BF16, .b_type = ZO_DTYPE_BF16, .c_type = ZO_DTYPE_F32};
    if (!zo_cpu_gemm_uses_onednn(&bf16)) {
        printf("skipped: bf16 GEMMs run on OpenBLAS here (ZO_CPU_GEMM=%s; oneDNN has no bf16 "
               "matmul below AVX-512)\n",
               getenv("ZO_CPU_GEMM") ? getenv("ZO_CPU_GEMM") : "unset");
        skip();
    }
    uint64_t seed = 41;
    gemm_case c = gemm_case_make(&seed, 0, 1, 300, 40, 70, 1, 1.0f, 0.0f);
    free(run_gemm(g_s, &c, ZO_DTYPE_F32, ZO_DTYPE_F32)); /* starts the pool, not oneDNN */
    int before = process_threads();
    for (int rep = 0; rep < 3; rep++)
        for (int cbf = 0; cbf < 2; cbf++)
            free(run_gemm(g_s, &c, ZO_DTYPE_BF16, cbf ? ZO_DTYPE_BF16 : ZO_DTYPE_F32));
    assert_int_equal(process_threads(), before);
    gemm_case_free(&c);
}

static void test_deterministic(void **state)
{
    zo_stream_t s2;
    ZO_ASSERT_OK(zo_stream_create(g_dev, &s2));
    float *r1, *r2, *r3;
    size_t n1, n2, n3;
    uint64_t seed = 99;
    run_mixed(g_s, 5, &r1, &n1);
    run_mixed(s2, 5, &r2, &n2); /* another stream: its own thread and scratch */
    queue_background_gemms(s2, &seed);
    run_mixed(g_s, 5, &r3, &n3); /* while s2 computes */
    ZO_ASSERT_OK(zo_stream_synchronize(s2));
    assert_int_equal(n1, n2);
    assert_int_equal(n1, n3);
    assert_memory_equal(r1, r2, n1 * sizeof(float));
    assert_memory_equal(r1, r3, n1 * sizeof(float));
    free(r1), free(r2), free(r3);
    dev_free_all();
    ZO_ASSERT_OK(zo_stream_destroy(s2));
}

/* Two threads issuing the first ops of a fresh stream race to create its ops
 * context; one wins, the other's is freed, and both ops run. */
typedef struct race_arg {
    zo_stream_t s;
    float *buf;
    zo_status st;
} race_arg;

static void *race_thread(void *p)
{
    race_arg *r = p;
    r->st = zo_op_scale(r->s, r->buf, 2.0f, 16, ZO_DTYPE_F32);
    return NULL;
}

static void test_context_race(void **state)
{
    const float ones[32] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                            1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    for (int round = 0; round < 20; round++) {
        zo_stream_t s;
        ZO_ASSERT_OK(zo_stream_create(g_dev, &s));
        float *buf = dev_from(s, ones, 32, ZO_DTYPE_F32);
        race_arg a = {s, buf, ZO_ERR_INTERNAL}, b = {s, buf + 16, ZO_ERR_INTERNAL};
        pthread_t ta, tb;
        assert_int_equal(pthread_create(&ta, NULL, race_thread, &a), 0);
        assert_int_equal(pthread_create(&tb, NULL, race_thread, &b), 0);
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        ZO_ASSERT_OK(a.st);
        ZO_ASSERT_OK(b.st);
        float *h = dev_to_host(s, buf, 32, ZO_DTYPE_F32);
        for (int i = 0; i < 32; i++)
            assert_true(h[i] == 2.0f);
        free(h);
        dev_free_all();
        ZO_ASSERT_OK(zo_stream_destroy(s));
    }
}

/* ---- errors ---- */

static void test_errors(void **state)
{
    void *buf = dev_zeros(g_s, 4096);
    int32_t *tok = dev_zeros(g_s, 64);
    float host[16] = {0};
    ZO_ASSERT_ST(zo_op_add(NULL, buf, buf, buf, 4, ZO_DTYPE_F32), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_op_add(g_s, host, buf, buf, 4, ZO_DTYPE_F32),
                 ZO_ERR_INVALID_ARG); /* not a device pointer */
    ZO_ASSERT_ST(zo_op_add(g_s, buf, buf, buf, 2048, ZO_DTYPE_F32),
                 ZO_ERR_INVALID_ARG); /* past the end */
    ZO_ASSERT_ST(zo_op_scale(g_s, buf, 2.0f, 4, (zo_dtype)7), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_op_cast(g_s, buf, ZO_DTYPE_BF16, buf, ZO_DTYPE_F32, 4), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_op_cast(g_s, (char *)buf + 4, ZO_DTYPE_F32, buf, ZO_DTYPE_F32, 4),
                 ZO_ERR_INVALID_ARG);
    zo_gemm_desc g = ZO_GEMM_DESC_INIT;
    g.m = g.n = g.k = 4;
    g.a = g.b = g.c = buf;
    g.lda = g.ldb = g.ldc = 4;
    g.struct_size = 0;
    ZO_ASSERT_ST(zo_op_gemm(g_s, &g), ZO_ERR_INVALID_ARG);
    g.struct_size = sizeof g;
    ZO_ASSERT_ST(zo_op_gemm(g_s, NULL), ZO_ERR_INVALID_ARG);
    g.b_type = ZO_DTYPE_BF16;
    ZO_ASSERT_ST(zo_op_gemm(g_s, &g), ZO_ERR_INVALID_ARG); /* A and B differ */
    g.b_type = ZO_DTYPE_F32;
    g.c_type = ZO_DTYPE_F16;
    ZO_ASSERT_ST(zo_op_gemm(g_s, &g), ZO_ERR_INVALID_ARG); /* f16 C with f32 inputs */
    g.c_type = ZO_DTYPE_F32;
    g.lda = 3;
    ZO_ASSERT_ST(zo_op_gemm(g_s, &g), ZO_ERR_INVALID_ARG); /* lda < k */
    g.lda = 4;
    g.batch = 0;
    ZO_ASSERT_ST(zo_op_gemm(g_s, &g), ZO_ERR_INVALID_ARG);
    g.batch = 2;
    g.stride_a = g.stride_b = g.stride_c = 1024; /* the second problem runs past the buffer */
    ZO_ASSERT_ST(zo_op_gemm(g_s, &g), ZO_ERR_INVALID_ARG);
    g.batch = 1;
    ZO_ASSERT_OK(zo_op_gemm(g_s, &g));
    ZO_ASSERT_ST(zo_op_rope_table(g_s, buf, 4, 7, 10000.0f, 0),
                 ZO_ERR_INVALID_ARG);                                            /* odd head_dim */
    ZO_ASSERT_ST(zo_op_rope_table(g_s, buf, 4, 8, 0.5f, 0), ZO_ERR_INVALID_ARG); /* theta <= 1 */
    ZO_ASSERT_ST(zo_op_rmsnorm_fwd(g_s, buf, buf, buf, buf, 2, 4, -1.0f, ZO_DTYPE_F32),
                 ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_op_attention_fwd(g_s, buf, buf, buf, buf, buf, 1, 0, 1, 4, ZO_DTYPE_F32),
                 ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_op_attention_fwd(g_s, buf, buf, buf, buf, buf, 4, 16, 4, 16, ZO_DTYPE_F32),
                 ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_op_cross_entropy(g_s, buf, buf, NULL, buf, tok, 2, 4, INFINITY, ZO_DTYPE_F32),
                 ZO_ERR_INVALID_ARG);
    ZO_ASSERT_OK(zo_stream_synchronize(g_s));

    /* Out-of-range ids are found where the work runs and reported at the next wait. */
    int32_t bad[2] = {1, 9};
    ZO_ASSERT_OK(zo_memcpy_h2d_async(g_s, tok, bad, sizeof bad));
    ZO_ASSERT_OK(zo_op_embedding_fwd(g_s, buf, buf, tok, 2, 4, 8, ZO_DTYPE_F32));
    ZO_ASSERT_ST(zo_stream_synchronize(g_s), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "token 1 is 9"));
    ZO_ASSERT_OK(zo_op_embedding_bwd(g_s, buf, ZO_DTYPE_F32, buf, tok, 2, 4, 8, ZO_DTYPE_F32));
    ZO_ASSERT_ST(zo_stream_synchronize(g_s), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_OK(zo_op_cross_entropy(g_s, buf, buf, NULL, buf, tok, 2, 4, 1.0f, ZO_DTYPE_F32));
    ZO_ASSERT_ST(zo_stream_synchronize(g_s), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "cross_entropy"));
    /* the parallel ops: a target beyond the whole vocabulary is refused too */
    ZO_ASSERT_OK(zo_op_cross_entropy_part_stats(g_s, buf, buf, tok, 2, 8, 4, 4, ZO_DTYPE_F32));
    ZO_ASSERT_ST(zo_stream_synchronize(g_s), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "cross_entropy_part_stats"));
    ZO_ASSERT_OK(zo_op_cross_entropy_part(g_s, NULL, buf, NULL, buf, buf, 1, tok, 2, 8, 4, 4, 1.0f,
                                          ZO_DTYPE_F32, 0, 2));
    ZO_ASSERT_ST(zo_stream_synchronize(g_s), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "cross_entropy_part (targets)"));
    /* a part beyond the vocabulary, named with the ids it would hold */
    ZO_ASSERT_ST(zo_op_embedding_part_fwd(g_s, buf, buf, tok, 2, 4, 8, 6, 4, ZO_DTYPE_F32),
                 ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "ids 6 .. 9 pass the vocabulary 0 .. 7"));
    ZO_ASSERT_ST(
        zo_op_embedding_part_bwd(g_s, buf, ZO_DTYPE_F32, buf, tok, 2, 4, 8, -1, 4, ZO_DTYPE_F32),
        ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_op_cross_entropy_part_stats(g_s, buf, buf, tok, 2, 8, 4, 0, ZO_DTYPE_F32),
                 ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_op_cross_entropy_part(g_s, NULL, buf, NULL, buf, buf, 0, tok, 2, 8, 0, 4, 1.0f,
                                          ZO_DTYPE_F32, 0, 2),
                 ZO_ERR_INVALID_ARG);

    /* A failure of the queued work itself is kept and reported. */
    ZO_ASSERT_OK(zo_device_inject_fault(g_dev, ZO_FAULT_STREAM_TASK, 1));
    ZO_ASSERT_OK(zo_op_scale(g_s, buf, 2.0f, 4, ZO_DTYPE_F32));
    ZO_ASSERT_ST(zo_stream_synchronize(g_s), ZO_ERR_INTERNAL);
    ZO_ASSERT_OK(zo_op_scale(g_s, buf, 2.0f, 4, ZO_DTYPE_F32));
    ZO_ASSERT_OK(zo_stream_synchronize(g_s));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_onednn_starts_no_threads, free_buffers),
        cmocka_unit_test_teardown(test_conversions, free_buffers),
        cmocka_unit_test_teardown(test_gemm_forward, free_buffers),
        cmocka_unit_test_teardown(test_gemm_backward, free_buffers),
        cmocka_unit_test_teardown(test_embedding, free_buffers),
        cmocka_unit_test_teardown(test_rmsnorm, free_buffers),
        cmocka_unit_test_teardown(test_rope, free_buffers),
        cmocka_unit_test_teardown(test_rope_scaling, free_buffers),
        cmocka_unit_test_teardown(test_rope_yarn_and_dynamic, free_buffers),
        cmocka_unit_test_teardown(test_repeat_kv, free_buffers),
        cmocka_unit_test_teardown(test_bias, free_buffers),
        cmocka_unit_test_teardown(test_causal_softmax, free_buffers),
        cmocka_unit_test_teardown(test_attention, free_buffers),
        cmocka_unit_test_teardown(test_swiglu, free_buffers),
        cmocka_unit_test_teardown(test_cross_entropy, free_buffers),
        cmocka_unit_test_teardown(test_cross_entropy_parts, free_buffers),
        cmocka_unit_test_teardown(test_elementwise, free_buffers),
        cmocka_unit_test_teardown(test_deterministic, free_buffers),
        cmocka_unit_test_teardown(test_gemm_split_same_bits, free_buffers),
        cmocka_unit_test_teardown(test_context_race, free_buffers),
        cmocka_unit_test_teardown(test_errors, free_buffers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
