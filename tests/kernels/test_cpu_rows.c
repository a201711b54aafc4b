/* The cpu ops' row kernels (cpu_rows.h) and the ops built on them.
 *
 * Kernels: every SIMD level this CPU runs (AVX2, AVX-512) gives the scalar
 * reference's bits, for every kernel, at every tail length and on special
 * values (NaN, infinities, signed zeros, large magnitudes); the reference
 * itself agrees with double arithmetic (sums within 1e-12 relative, the
 * sigmoid within 4 fp32 ulp, the conversions exactly zo/half.h's).
 *
 * Ops: RMSNorm, RoPE, softmax, SwiGLU, cross-entropy and the elementwise ops
 * at shapes the compute pool splits, in fp32 and bf16, give the same bits
 * twice. With ZO_ROWS_DUMP=FILE the results go to FILE too, so that ctest
 * (test_cpu_rows_same_bits) compares runs at 1, 2 and 3 threads and at every
 * SIMD level (ZO_SIMD): neither may change a bit. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_rows.h"
#include "zo/cpu.h"
/* the runners this program does not need are unused here */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "ops_suite.h"
#pragma GCC diagnostic pop

#define N 1100 /* not a multiple of ZO_ROW_LANES */

static zo_device_t g_dev;
static zo_stream_t g_s;

static float uniform(uint64_t *rng, float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(zo_test_rand(rng) >> 11) / 9007199254740992.0);
}

/* Values as the ops see them, with special ones sprinkled in when `specials`. */
static void fill(float *x, size_t n, uint64_t *rng, float scale, int specials)
{
    static const float sp[] = {NAN,   INFINITY, -INFINITY, 0.0f,    -0.0f,
                               1e30f, -1e30f,   100.0f,    -100.0f, 3e-39f};
    for (size_t i = 0; i < n; i++)
        x[i] = uniform(rng, -scale, scale);
    if (specials)
        for (size_t i = 0; i < sizeof sp / sizeof sp[0] && 7 * i + 3 < n; i++)
            x[7 * i + 3] = sp[i];
}

static int setup(void **state)
{
    return cpu_device_open(&g_dev, &g_s, 256u << 20);
}

static int teardown(void **state)
{
    return cpu_device_close(g_dev);
}

/* ---- the kernels: each level against the scalar reference ---- */

#define SAME(a, b, n, what, level, len)                                                            \
    do {                                                                                           \
        if (memcmp(a, b, (n) * sizeof *(a)) != 0)                                                  \
            fail_msg("%s: %s differs from the scalar reference at length %zu", what, level,        \
                     (size_t)(len));                                                               \
    } while (0)

/* Every kernel at length n, on the same inputs, through k and through the reference. */
static void compare_at(const zo_cpu_rowk *k, size_t n, uint64_t seed)
{
    const zo_cpu_rowk *r = &zo_cpu_rows_scalar;
    uint64_t rng = seed;
    float x[N], y[N], w[N], g[N], cs[N];
    float a1[N], a2[N], b1[N], b2[N];
    double d1[N], d2[N];
    uint16_t h1[N], h2[N];
    fill(x, n, &rng, 4.0f, 1);
    fill(y, n, &rng, 2.0f, 1);
    fill(w, n, &rng, 1.5f, 0);
    fill(g, n, &rng, 12.0f, 1);
    fill(cs, n, &rng, 1.0f, 0);

    float m1 = k->max(x, n), m2 = r->max(x, n);
    SAME(&m1, &m2, 1, "max", k->name, n);
    double s1 = k->sum(x, n), s2 = r->sum(x, n);
    SAME(&s1, &s2, 1, "sum", k->name, n);
    s1 = k->dot(x, y, n), s2 = r->dot(x, y, n);
    SAME(&s1, &s2, 1, "dot", k->name, n);

    for (int dt = 0; dt < 3; dt++) {
        zo_dtype t = dt == 0 ? ZO_DTYPE_BF16 : dt == 1 ? ZO_DTYPE_F16 : ZO_DTYPE_F32;
        k->store(h1, ZO_DTYPE_BF16, 0, x, n); /* any 16-bit patterns */
        k->load(a1, h1, t, 0, t == ZO_DTYPE_F32 ? n / 2 : n);
        r->load(a2, h1, t, 0, t == ZO_DTYPE_F32 ? n / 2 : n);
        SAME(a1, a2, t == ZO_DTYPE_F32 ? n / 2 : n, "load", k->name, n);
        if (t == ZO_DTYPE_F32)
            continue;
        k->store(h1, t, 0, x, n);
        r->store(h2, t, 0, x, n);
        SAME(h1, h2, n, "store", k->name, n);
    }

    memcpy(a1, x, sizeof x), memcpy(a2, x, sizeof x);
    k->exp_shifted(a1, n, 1.5f), r->exp_shifted(a2, n, 1.5f);
    SAME(a1, a2, n, "exp_shifted", k->name, n);
    memcpy(a1, x, sizeof x), memcpy(a2, x, sizeof x);
    k->scale(a1, n, 0.37f), r->scale(a2, n, 0.37f);
    SAME(a1, a2, n, "scale", k->name, n);
    k->rms_fwd(a1, x, 0.83f, w, n), r->rms_fwd(a2, x, 0.83f, w, n);
    SAME(a1, a2, n, "rms_fwd", k->name, n);
    for (int acc = 0; acc < 2; acc++) {
        memcpy(a1, y, sizeof y), memcpy(a2, y, sizeof y);
        memset(d1, 0, sizeof d1), memset(d2, 0, sizeof d2);
        k->rms_bwd(a1, x, g, w, 0.83f, n, acc, d1), r->rms_bwd(a2, x, g, w, 0.83f, n, acc, d2);
        SAME(a1, a2, n, "rms_bwd dx", k->name, n);
        SAME(d1, d2, n, "rms_bwd dw", k->name, n);
    }
    size_t m = n < ZO_ROW_BLOCK ? n : ZO_ROW_BLOCK;
    k->swiglu_fwd(a1, g, y, m), r->swiglu_fwd(a2, g, y, m);
    SAME(a1, a2, m, "swiglu_fwd", k->name, n);
    k->swiglu_bwd(a1, b1, g, y, w, m), r->swiglu_bwd(a2, b2, g, y, w, m);
    SAME(a1, a2, m, "swiglu_bwd dg", k->name, n);
    SAME(b1, b2, m, "swiglu_bwd du", k->name, n);
    k->add(a1, x, y, n), r->add(a2, x, y, n);
    SAME(a1, a2, n, "add", k->name, n);
    memcpy(a1, y, sizeof y), memcpy(a2, y, sizeof y);
    k->axpy(a1, -0.7f, x, n), r->axpy(a2, -0.7f, x, n);
    SAME(a1, a2, n, "axpy", k->name, n);
    k->softmax_bwd(a1, w, x, 0.3f, n), r->softmax_bwd(a2, w, x, 0.3f, n);
    SAME(a1, a2, n, "softmax_bwd", k->name, n);
    k->rope(a1, x, cs, -1.0f, n / 2), r->rope(a2, x, cs, -1.0f, n / 2);
    SAME(a1, a2, n / 2 * 2, "rope", k->name, n);
}

static void test_levels_equal_the_reference(void **state)
{
    static const int levels[] = {ZO_SIMD_AVX2, ZO_SIMD_AVX512};
    int ran = 0;
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
        const zo_cpu_rowk *k = zo_cpu_rows_at(levels[i]);
        if (!k || k == &zo_cpu_rows_scalar)
            continue;
        for (size_t n = 0; n <= 2 * ZO_ROW_LANES + 3; n++)
            compare_at(k, n, 11 + n);
        compare_at(k, N, 7);
        compare_at(k, ZO_ROW_BLOCK + 9, 8);
        printf("%s: the scalar reference's bits\n", k->name);
        ran++;
    }
    if (!ran) {
        printf("skipped: this CPU runs no vector level of the row kernels (only the reference)\n");
        skip();
    }
}

/* ---- the reference against double arithmetic ---- */

static void test_reference_against_double(void **state)
{
    const zo_cpu_rowk *r = &zo_cpu_rows_scalar;
    uint64_t rng = 3;
    float x[N], y[N], t[N];
    fill(x, N, &rng, 4.0f, 0);
    fill(y, N, &rng, 4.0f, 0);
    double sum = 0, sq = 0, dot = 0;
    float mx = -INFINITY;
    for (size_t i = 0; i < N; i++) {
        sum += x[i], sq += (double)x[i] * x[i], dot += (double)x[i] * y[i];
        mx = x[i] > mx ? x[i] : mx;
    }
    assert_true(fabs(r->sum(x, N) - sum) <= 1e-12 * sq);
    assert_true(fabs(r->dot(x, x, N) - sq) <= 1e-12 * sq);
    assert_true(fabs(r->dot(x, y, N) - dot) <= 1e-12 * sq);
    assert_true(r->max(x, N) == mx);
    assert_true(r->max(x, 0) == -INFINITY);
    float nanrow[3] = {NAN, -2.0f, NAN};
    assert_true(r->max(nanrow, 3) == -2.0f); /* a NaN is passed over, as fmaxf does */

    /* the sigmoid inside SwiGLU, over -100..100 */
    float g[ZO_ROW_BLOCK], one[ZO_ROW_BLOCK], out[ZO_ROW_BLOCK];
    for (int i = 0; i < ZO_ROW_BLOCK; i++)
        g[i] = -100.0f + 200.0f * (float)i / (ZO_ROW_BLOCK - 1), one[i] = 1.0f;
    r->swiglu_fwd(out, g, one, ZO_ROW_BLOCK);
    for (int i = 0; i < ZO_ROW_BLOCK; i++) {
        double want = (double)g[i] / (1.0 + exp(-(double)g[i]));
        double ulp = ldexp(1.0, ilogb((float)want) - 23);
        /* below ln FLT_MIN exp gives 0, so the sigmoid does there: |g| FLT_MIN at most */
        if (fabs(out[i] - want) > 4 * ulp && fabs(out[i] - want) > fabs(g[i]) * FLT_MIN)
            fail_msg("silu(%.9g) = %.9g, in double %.17g", (double)g[i], (double)out[i], want);
    }

    /* conversions: exactly zo/half.h's, NaN and rounding included */
    uint16_t h[N];
    fill(t, N, &rng, 3e4f, 1);
    r->store(h, ZO_DTYPE_BF16, 0, t, N);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(h[i], zo_f32_to_bf16(t[i]));
    r->store(h, ZO_DTYPE_F16, 0, t, N);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(h[i], zo_f32_to_f16(t[i]));
}

/* ---- the ops: the same bits twice, and (through ctest) at any thread
 * count and SIMD level ---- */

typedef struct dumper {
    FILE *f;
} dumper;

static void keep(dumper *d, float *v, size_t n)
{
    if (d->f)
        assert_int_equal(fwrite(v, sizeof *v, n, d->f), n);
    free(v);
}

static void run_row_ops(zo_dtype dt, uint64_t seed, dumper *d)
{
    /* RMSNorm: 40 rows of 100 (8 parts) */
    const size_t rows = 40;
    const int D = 100;
    float *x = rand_vec(&seed, rows * D, 2, dt), *w = rand_vec(&seed, D, 1, dt);
    float *dy = rand_vec(&seed, rows * D, 1, dt), *dw0 = rand_vec(&seed, D, 1, dt);
    float *dx0 = rand_vec(&seed, rows * D, 1, dt);
    rms_out o = run_rmsnorm(g_s, dt, x, w, dy, dw0, dx0, rows, D, 1e-5f);
    keep(d, o.y, rows * D), keep(d, o.rstd, rows), keep(d, o.dx, rows * D);
    keep(d, o.dw, D), keep(d, o.dx_acc, rows * D);
    free(x), free(w), free(dy), free(dw0), free(dx0);

    /* RoPE: 2 x 10 positions, 3 heads of 16 */
    const int B = 2, T = 10, H = 3, hd = 16;
    size_t nr = (size_t)B * T * H * hd;
    float *rx = rand_vec(&seed, nr, 1, dt), *rg = rand_vec(&seed, nr, 1, dt), *tab, *ry, *rdx;
    run_rope(g_s, dt, rx, rg, B, T, H, hd, 10000.0f, 3, &tab, &ry, &rdx);
    keep(d, tab, (size_t)T * hd), keep(d, ry, nr), keep(d, rdx, nr);
    free(rx), free(rg);

    /* causal softmax: 3 matrices of 21 x 21 */
    const size_t nm = 3;
    const int S = 21;
    size_t ns = nm * S * S;
    float *sx = rand_vec(&seed, ns, 6, dt), *sg = rand_vec(&seed, ns, 1, dt), *sp, *sdx;
    run_softmax(g_s, dt, sx, sg, nm, S, &sp, &sdx);
    keep(d, sp, ns), keep(d, sdx, ns);
    free(sx), free(sg);

    /* SwiGLU and the elementwise ops: 8 parts of 16 Ki and a tail */
    const size_t ne = ((size_t)8 << 14) + 37;
    float *g = rand_vec(&seed, ne, 8, dt), *u = rand_vec(&seed, ne, 1, dt);
    float *dd = rand_vec(&seed, ne, 1, dt), *out, *dg, *du;
    run_swiglu(g_s, dt, g, u, dd, ne, &out, &dg, &du);
    keep(d, out, ne), keep(d, dg, ne), keep(d, du, ne);
    ew_out e = run_elementwise(g_s, dt, g, u, ne, -0.75f);
    keep(d, e.add, ne), keep(d, e.scaled, ne), keep(d, e.axpy, ne), keep(d, e.to_dt, ne);
    keep(d, e.to_f32, ne);
    free(g), free(u), free(dd);

    /* cross-entropy: 20 rows of 1003 */
    const size_t xr = 20;
    const int V = 1003;
    int32_t tgt[20];
    for (size_t r = 0; r < xr; r++)
        tgt[r] = (int32_t)((r * 389) % (size_t)V);
    float *lg = rand_vec(&seed, xr * V, 5, dt), lf, l, *rl, *dl;
    run_xent(g_s, dt, lg, tgt, xr, V, 0.5f, &lf, &l, &rl, &dl);
    float *ls = malloc(2 * sizeof *ls);
    ls[0] = lf, ls[1] = l;
    keep(d, ls, 2), keep(d, rl, xr), keep(d, dl, xr * V);
    free(lg);

    /* repeat_kv (3 rows, 2 heads of 600 each 3 times: a full block and a
     * tail) and bias (5 rows of 1100 columns) */
    const size_t qr = 3, qs = qr * 2 * 600;
    float *qx = rand_vec(&seed, qs, 1, dt), *qg = rand_vec(&seed, 3 * qs, 1, dt), *qy, *qdx;
    run_repeat_kv(g_s, dt, qx, qg, qr, 2, 3, 600, &qy, &qdx);
    keep(d, qy, 3 * qs), keep(d, qdx, qs);
    free(qx), free(qg);
    const size_t br = 5, bn = br * 1100;
    float *by0 = rand_vec(&seed, bn, 1, dt), *bb = rand_vec(&seed, 1100, 1, dt);
    float *bdy = rand_vec(&seed, bn, 1, dt), *bdb0 = rand_vec(&seed, 1100, 1, ZO_DTYPE_F32);
    float *by, *bdb;
    run_bias(g_s, dt, ZO_DTYPE_F32, by0, bb, bdy, bdb0, br, 1100, &by, &bdb);
    keep(d, by, bn), keep(d, bdb, 1100);
    free(by0), free(bb), free(bdy), free(bdb0);
    dev_free_all();
}

/* repeat_kv's and bias's sums against plain fp32 loops in the same order
 * (then rounded to the dtype): bitwise, at whatever level this run has. */
static void round_plain(float *v, size_t n, zo_dtype dt)
{
    for (size_t i = 0; i < n; i++)
        v[i] = dt == ZO_DTYPE_BF16  ? zo_bf16_to_f32(zo_f32_to_bf16(v[i]))
               : dt == ZO_DTYPE_F16 ? zo_f16_to_f32(zo_f32_to_f16(v[i]))
                                    : v[i];
}

static void test_sums_equal_plain_loops(void **state)
{
    (void)state;
    uint64_t seed = 23;
    const zo_dtype dts[] = {ZO_DTYPE_F32, ZO_DTYPE_BF16, ZO_DTYPE_F16};
    for (int t = 0; t < 3; t++) {
        zo_dtype dt = dts[t];
        const size_t rows = 3, kv = 2, G = 4, D = 520, small = rows * kv * D;
        float *x = rand_vec(&seed, small, 1, dt), *g = rand_vec(&seed, small * G, 1, dt), *y, *dx;
        run_repeat_kv(g_s, dt, x, g, rows, (int)kv, (int)G, (int)D, &y, &dx);
        float *want = malloc(small * sizeof *want);
        for (size_t rk = 0; rk < rows * kv; rk++)
            for (size_t i = 0; i < D; i++) {
                float sum = 0.0f;
                for (size_t j = 0; j < G; j++)
                    sum += g[(rk * G + j) * D + i];
                want[rk * D + i] = sum;
            }
        round_plain(want, small, dt);
        assert_memory_equal(dx, want, small * sizeof *want);
        free(x), free(g), free(y), free(dx), free(want);

        const size_t R = 7, C = 530;
        float *y0 = rand_vec(&seed, R * C, 1, dt), *b = rand_vec(&seed, C, 1, dt);
        float *dy = rand_vec(&seed, R * C, 1, dt), *db0 = rand_vec(&seed, C, 1, dt), *by, *db;
        run_bias(g_s, dt, dt, y0, b, dy, db0, R, (int)C, &by, &db);
        float *wy = malloc(R * C * sizeof *wy), *wdb = malloc(C * sizeof *wdb);
        for (size_t i = 0; i < R * C; i++)
            wy[i] = y0[i] + b[i % C];
        for (size_t c = 0; c < C; c++) {
            float sum = 0.0f;
            for (size_t r = 0; r < R; r++)
                sum += dy[r * C + c];
            wdb[c] = db0[c] + sum;
        }
        round_plain(wy, R * C, dt);
        round_plain(wdb, C, dt);
        assert_memory_equal(by, wy, R * C * sizeof *wy);
        assert_memory_equal(db, wdb, C * sizeof *wdb);
        free(y0), free(b), free(dy), free(db0), free(by), free(db), free(wy), free(wdb);
    }
    dev_free_all();
}

static float *read_all(FILE *f, size_t *n)
{
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    float *v = malloc((size_t)len);
    assert_int_equal(fread(v, 1, (size_t)len, f), (size_t)len);
    *n = (size_t)len;
    return v;
}

static void test_row_ops_same_bits_twice(void **state)
{
    const char *path = getenv("ZO_ROWS_DUMP");
    dumper out = {path ? fopen(path, "wb") : NULL};
    if (path)
        assert_non_null(out.f);
    dumper a = {tmpfile()}, b = {tmpfile()};
    assert_non_null(a.f);
    assert_non_null(b.f);
    for (int t = 0; t < 2; t++) {
        zo_dtype dt = t ? ZO_DTYPE_BF16 : ZO_DTYPE_F32;
        run_row_ops(dt, 17 + (uint64_t)t, &a);
        run_row_ops(dt, 17 + (uint64_t)t, &b);
        if (out.f)
            run_row_ops(dt, 17 + (uint64_t)t, &out);
    }
    size_t na, nb;
    float *va = read_all(a.f, &na), *vb = read_all(b.f, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(va, vb, na);
    free(va), free(vb);
    fclose(a.f), fclose(b.f);
    if (out.f)
        assert_int_equal(fclose(out.f), 0);
    printf("row ops: the same bits twice, at the %s level\n", zo_cpu_rows()->name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_levels_equal_the_reference),
        cmocka_unit_test(test_reference_against_double),
        cmocka_unit_test(test_row_ops_same_bits_twice),
        cmocka_unit_test(test_sums_equal_plain_loops),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
