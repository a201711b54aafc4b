/* Runners for each op: upload host fp32 inputs in a dtype, run the op on a
 * stream, read the outputs back as fp32. The cpu tests compare them with
 * double-precision references and finite differences; the cuda tests compare
 * the cuda device's results with the cpu device's. */
#ifndef OPS_SUITE_H
#define OPS_SUITE_H

#include "ops_test_util.h"

/* ---- GEMM ---- */

typedef struct gemm_case {
    int ta, tb, m, n, k, batch;
    int64_t lda, ldb, ldc, sa, sb, sc;
    float alpha, beta;
    float *A, *B, *C0; /* host operands (C0: C before the op) */
    size_t nA, nB, nC;
} gemm_case;

static size_t span_of(int batch, int64_t stride, int rows, int64_t ld, int cols)
{
    return (size_t)(batch - 1) * (size_t)stride + (size_t)(rows - 1) * (size_t)ld + (size_t)cols;
}

/* A case with padded leading dimensions and batch strides; operands rounded to bf16. */
static gemm_case gemm_case_make(uint64_t *seed, int ta, int tb, int m, int n, int k, int batch,
                                float alpha, float beta)
{
    gemm_case c = {ta, tb, m,     n,    k,    batch, 0,    0, 0, 0,
                   0,  0,  alpha, beta, NULL, NULL,  NULL, 0, 0, 0};
    int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    c.lda = ac + 3;
    c.ldb = bc + 1;
    c.ldc = n + 2;
    c.sa = (int64_t)ar * c.lda + 5;
    c.sb = (int64_t)br * c.ldb + 2;
    c.sc = (int64_t)m * c.ldc + 1;
    c.nA = span_of(batch, c.sa, ar, c.lda, ac);
    c.nB = span_of(batch, c.sb, br, c.ldb, bc);
    c.nC = span_of(batch, c.sc, m, c.ldc, n);
    c.A = rand_vec(seed, c.nA, 1.0f, ZO_DTYPE_BF16);
    c.B = rand_vec(seed, c.nB, 1.0f, ZO_DTYPE_BF16);
    c.C0 = rand_vec(seed, c.nC, 1.0f, ZO_DTYPE_BF16);
    return c;
}

static void gemm_case_free(gemm_case *c)
{
    free(c->A);
    free(c->B);
    free(c->C0);
}

static float *run_gemm(zo_stream_t s, const gemm_case *c, zo_dtype ab, zo_dtype cdt)
{
    zo_gemm_desc g = ZO_GEMM_DESC_INIT;
    g.trans_a = c->ta;
    g.trans_b = c->tb;
    g.m = c->m;
    g.n = c->n;
    g.k = c->k;
    g.batch = c->batch;
    g.alpha = c->alpha;
    g.beta = c->beta;
    g.a = dev_from(s, c->A, c->nA, ab);
    g.b = dev_from(s, c->B, c->nB, ab);
    g.c = dev_from(s, c->C0, c->nC, cdt);
    g.a_type = g.b_type = ab;
    g.c_type = cdt;
    g.lda = c->lda;
    g.ldb = c->ldb;
    g.ldc = c->ldc;
    g.stride_a = c->sa;
    g.stride_b = c->sb;
    g.stride_c = c->sc;
    ZO_ASSERT_OK(zo_op_gemm(s, &g));
    return dev_to_host(s, g.c, c->nC, cdt);
}

/* ---- embedding ---- */

static void run_embedding(zo_stream_t s, zo_dtype dt, zo_dtype gdt, const float *table,
                          const int32_t *tok, size_t N, int D, int V, const float *dout,
                          const float *dtable0, float **out, float **dtable)
{
    void *dtab = dev_from(s, table, (size_t)V * D, dt);
    void *dtok = NULL;
    ZO_ASSERT_OK(zo_device_malloc(zo_stream_device(s), N * sizeof *tok, &dtok));
    track(zo_stream_device(s), dtok);
    ZO_ASSERT_OK(zo_memcpy_h2d_async(s, dtok, tok, N * sizeof *tok));
    void *dout_d = dev_from(s, dout, N * D, dt);
    void *dgrad = dev_from(s, dtable0, (size_t)V * D, gdt);
    void *dy = dev_zeros(s, N * D * zo_dtype_size(dt));
    ZO_ASSERT_OK(zo_op_embedding_fwd(s, dy, dtab, dtok, N, D, V, dt));
    ZO_ASSERT_OK(zo_op_embedding_bwd(s, dgrad, gdt, dout_d, dtok, N, D, V, dt));
    *out = dev_to_host(s, dy, N * D, dt);
    *dtable = dev_to_host(s, dgrad, (size_t)V * D, gdt);
}

/* The vocabulary-parallel embedding over `parts` parts of the table (part p
 * holds ids p V / parts .. (p + 1) V / parts - 1): the parts' outputs summed
 * in part order, as a tensor-parallel all-reduce sums them, and each part's
 * gradient rows put back in place. */
static void run_embedding_parts(zo_stream_t s, zo_dtype dt, zo_dtype gdt, const float *table,
                                const int32_t *tok, size_t N, int D, int V, int parts,
                                const float *dout, const float *dtable0, float **out,
                                float **dtable)
{
    void *dtok = NULL;
    ZO_ASSERT_OK(zo_device_malloc(zo_stream_device(s), N * sizeof *tok, &dtok));
    track(zo_stream_device(s), dtok);
    ZO_ASSERT_OK(zo_memcpy_h2d_async(s, dtok, tok, N * sizeof *tok));
    void *dout_d = dev_from(s, dout, N * D, dt);
    *out = calloc(N * D, sizeof **out);
    *dtable = calloc((size_t)V * D, sizeof **dtable);
    assert_non_null(*out);
    assert_non_null(*dtable);
    for (int p = 0; p < parts; p++) {
        const int v0 = p * V / parts, n = (p + 1) * V / parts - v0;
        const size_t rows = (size_t)n * D, at = (size_t)v0 * D;
        void *tab = dev_from(s, table + at, rows, dt), *grad = dev_from(s, dtable0 + at, rows, gdt);
        void *y = dev_zeros(s, N * D * zo_dtype_size(dt));
        ZO_ASSERT_OK(zo_op_embedding_part_fwd(s, y, tab, dtok, N, D, V, v0, n, dt));
        ZO_ASSERT_OK(zo_op_embedding_part_bwd(s, grad, gdt, dout_d, dtok, N, D, V, v0, n, dt));
        float *hy = dev_to_host(s, y, N * D, dt), *hg = dev_to_host(s, grad, rows, gdt);
        for (size_t i = 0; i < N * D; i++)
            (*out)[i] += hy[i];
        memcpy(*dtable + at, hg, rows * sizeof *hg);
        free(hy), free(hg);
    }
}

/* ---- RMSNorm ---- */

typedef struct rms_out {
    float *y, *rstd, *dx, *dw, *dx_acc;
} rms_out;

static rms_out run_rmsnorm(zo_stream_t s, zo_dtype dt, const float *x, const float *w,
                           const float *dy, const float *dw0, const float *dx0, size_t rows,
                           int dim, float eps)
{
    size_t n = rows * (size_t)dim;
    void *dx_ = dev_from(s, x, n, dt), *dw_ = dev_from(s, w, dim, dt),
         *ddy = dev_from(s, dy, n, dt);
    void *y = dev_zeros(s, n * zo_dtype_size(dt));
    float *rstd = dev_zeros(s, rows * sizeof(float));
    void *dxo = dev_zeros(s, n * zo_dtype_size(dt));
    void *dxa = dev_from(s, dx0, n, dt);
    void *dwo = dev_from(s, dw0, dim, ZO_DTYPE_F32);
    ZO_ASSERT_OK(zo_op_rmsnorm_fwd(s, y, rstd, dx_, dw_, rows, dim, eps, dt));
    ZO_ASSERT_OK(
        zo_op_rmsnorm_bwd(s, dxo, dwo, ZO_DTYPE_F32, ddy, dx_, dw_, rstd, rows, dim, 0, dt));
    ZO_ASSERT_OK(
        zo_op_rmsnorm_bwd(s, dxa, NULL, ZO_DTYPE_F32, ddy, dx_, dw_, rstd, rows, dim, 1, dt));
    rms_out o = {dev_to_host(s, y, n, dt), dev_to_host(s, rstd, rows, ZO_DTYPE_F32),
                 dev_to_host(s, dxo, n, dt), dev_to_host(s, dwo, dim, ZO_DTYPE_F32),
                 dev_to_host(s, dxa, n, dt)};
    return o;
}

static void rms_out_free(rms_out *o)
{
    free(o->y);
    free(o->rstd);
    free(o->dx);
    free(o->dw);
    free(o->dx_acc);
}

/* ---- RoPE: returns table, fwd (out of place), bwd (in place) ---- */

static void run_rope(zo_stream_t s, zo_dtype dt, const float *x, const float *dy, int B, int T,
                     int H, int hd, float theta, int pos0, float **table, float **y, float **dx)
{
    size_t n = (size_t)B * T * H * hd;
    float *tab = dev_zeros(s, (size_t)T * hd * sizeof(float));
    void *xd = dev_from(s, x, n, dt), *yd = dev_zeros(s, n * zo_dtype_size(dt)),
         *gd = dev_from(s, dy, n, dt);
    ZO_ASSERT_OK(zo_op_rope_table(s, tab, T, hd, theta, pos0));
    ZO_ASSERT_OK(zo_op_rope_fwd(s, yd, xd, tab, B, T, H, hd, dt));
    ZO_ASSERT_OK(zo_op_rope_bwd(s, gd, gd, tab, B, T, H, hd, dt));
    *table = dev_to_host(s, tab, (size_t)T * hd, ZO_DTYPE_F32);
    *y = dev_to_host(s, yd, n, dt);
    *dx = dev_to_host(s, gd, n, dt);
}

/* ---- a scaled RoPE table ---- */

static float *run_rope_table_scaled(zo_stream_t s, int T, int hd, float theta, int pos0,
                                    const zo_rope_scaling *sc)
{
    float *tab = dev_zeros(s, (size_t)T * hd * sizeof(float));
    ZO_ASSERT_OK(zo_op_rope_table_scaled(s, tab, T, hd, theta, pos0, sc));
    return dev_to_host(s, tab, (size_t)T * hd, ZO_DTYPE_F32);
}

/* ---- grouped-query attention's key/value heads: fwd and bwd ---- */

static void run_repeat_kv(zo_stream_t s, zo_dtype dt, const float *x, const float *dout,
                          size_t rows, int kv, int group, int hd, float **y, float **dx)
{
    size_t small = rows * (size_t)kv * hd, big = small * (size_t)group;
    void *xd = dev_from(s, x, small, dt), *yd = dev_zeros(s, big * zo_dtype_size(dt));
    void *gd = dev_from(s, dout, big, dt), *dxd = dev_zeros(s, small * zo_dtype_size(dt));
    ZO_ASSERT_OK(zo_op_repeat_kv_fwd(s, yd, xd, rows, kv, group, hd, dt));
    ZO_ASSERT_OK(zo_op_repeat_kv_bwd(s, dxd, gd, rows, kv, group, hd, dt));
    *y = dev_to_host(s, yd, big, dt);
    *dx = dev_to_host(s, dxd, small, dt);
}

/* ---- bias: y0 + bias, and db0 + column sums of dy (db in gdt) ---- */

static void run_bias(zo_stream_t s, zo_dtype dt, zo_dtype gdt, const float *y0, const float *b,
                     const float *dy, const float *db0, size_t rows, int cols, float **y,
                     float **db)
{
    size_t n = rows * (size_t)cols;
    void *yd = dev_from(s, y0, n, dt), *bd = dev_from(s, b, (size_t)cols, dt);
    void *gd = dev_from(s, dy, n, dt), *dbd = dev_from(s, db0, (size_t)cols, gdt);
    ZO_ASSERT_OK(zo_op_bias_fwd(s, yd, bd, rows, cols, dt));
    ZO_ASSERT_OK(zo_op_bias_bwd(s, dbd, gdt, gd, rows, cols, dt));
    *y = dev_to_host(s, yd, n, dt);
    *db = dev_to_host(s, dbd, (size_t)cols, gdt);
}

/* ---- causal softmax: fwd out of place, bwd in place ---- */

static void run_softmax(zo_stream_t s, zo_dtype dt, const float *x, const float *dp, size_t nm,
                        int T, float **p, float **dx)
{
    size_t n = nm * (size_t)T * T;
    void *xd = dev_from(s, x, n, dt), *pd = dev_zeros(s, n * zo_dtype_size(dt)),
         *gd = dev_from(s, dp, n, dt);
    ZO_ASSERT_OK(zo_op_causal_softmax_fwd(s, pd, xd, nm, T, dt));
    ZO_ASSERT_OK(zo_op_causal_softmax_bwd(s, gd, gd, pd, nm, T, dt));
    *p = dev_to_host(s, pd, n, dt);
    *dx = dev_to_host(s, gd, n, dt);
}

/* ---- attention ---- */

typedef struct attn_out {
    float *out, *att, *dq, *dk, *dv;
} attn_out;

static attn_out run_attention(zo_stream_t s, zo_dtype dt, const float *q, const float *k,
                              const float *v, const float *dout, int B, int T, int H, int hd)
{
    size_t n = (size_t)B * T * H * hd, na = (size_t)B * H * T * T, es = zo_dtype_size(dt);
    void *qd = dev_from(s, q, n, dt), *kd = dev_from(s, k, n, dt), *vd = dev_from(s, v, n, dt);
    void *god = dev_from(s, dout, n, dt), *od = dev_zeros(s, n * es), *att = dev_zeros(s, na * es);
    void *datt = dev_zeros(s, na * es), *dq = dev_zeros(s, n * es), *dk = dev_zeros(s, n * es);
    void *dv = dev_zeros(s, n * es);
    ZO_ASSERT_OK(zo_op_attention_fwd(s, od, att, qd, kd, vd, B, T, H, hd, dt));
    ZO_ASSERT_OK(zo_op_attention_bwd(s, dq, dk, dv, datt, god, att, qd, kd, vd, B, T, H, hd, dt));
    attn_out o = {dev_to_host(s, od, n, dt), dev_to_host(s, att, na, dt), dev_to_host(s, dq, n, dt),
                  dev_to_host(s, dk, n, dt), dev_to_host(s, dv, n, dt)};
    return o;
}

static void attn_out_free(attn_out *o)
{
    free(o->out);
    free(o->att);
    free(o->dq);
    free(o->dk);
    free(o->dv);
}

/* ---- SwiGLU: bwd writes dgate over gate and dup over up (in place) ---- */

static void run_swiglu(zo_stream_t s, zo_dtype dt, const float *gate, const float *up,
                       const float *dout, size_t n, float **out, float **dgate, float **dup)
{
    void *g = dev_from(s, gate, n, dt), *u = dev_from(s, up, n, dt), *d = dev_from(s, dout, n, dt);
    void *o = dev_zeros(s, n * zo_dtype_size(dt));
    ZO_ASSERT_OK(zo_op_swiglu_fwd(s, o, g, u, n, dt));
    ZO_ASSERT_OK(zo_op_swiglu_bwd(s, g, u, d, g, u, n, dt));
    *out = dev_to_host(s, o, n, dt);
    *dgate = dev_to_host(s, g, n, dt);
    *dup = dev_to_host(s, u, n, dt);
}

/* ---- cross-entropy: forward only, then fused with the gradient in place ---- */

static void run_xent(zo_stream_t s, zo_dtype dt, const float *logits, const int32_t *tgt,
                     size_t rows, int V, float grad_scale, float *loss_fwd, float *loss,
                     float **row_loss, float **dlogits)
{
    size_t n = rows * (size_t)V;
    void *ld = dev_from(s, logits, n, dt);
    float *l = dev_zeros(s, sizeof(float)), *l2 = dev_zeros(s, sizeof(float));
    float *rl = dev_zeros(s, rows * sizeof(float));
    void *td = NULL;
    ZO_ASSERT_OK(zo_device_malloc(zo_stream_device(s), rows * sizeof *tgt, &td));
    track(zo_stream_device(s), td);
    ZO_ASSERT_OK(zo_memcpy_h2d_async(s, td, tgt, rows * sizeof *tgt));
    ZO_ASSERT_OK(zo_op_cross_entropy(s, l2, rl, NULL, ld, td, rows, V, grad_scale, dt));
    float *h = dev_to_host(s, l2, 1, ZO_DTYPE_F32);
    *loss_fwd = h[0];
    free(h);
    ZO_ASSERT_OK(zo_op_cross_entropy(s, l, rl, ld, ld, td, rows, V, grad_scale, dt));
    h = dev_to_host(s, l, 1, ZO_DTYPE_F32);
    *loss = h[0];
    free(h);
    *row_loss = dev_to_host(s, rl, rows, ZO_DTYPE_F32);
    *dlogits = dev_to_host(s, ld, n, dt);
}

/* The same fused pass in chunks of rows (zo_op_cross_entropy_chunk), each
 * over its rows of one logits buffer, the loss with the last. */
static void run_xent_chunked(zo_stream_t s, zo_dtype dt, const float *logits, const int32_t *tgt,
                             size_t rows, int V, float grad_scale, size_t chunk, float *loss,
                             float **row_loss, float **dlogits)
{
    size_t n = rows * (size_t)V, es = zo_dtype_size(dt);
    char *ld = dev_from(s, logits, n, dt);
    float *l = dev_zeros(s, sizeof(float)), *rl = dev_zeros(s, rows * sizeof(float));
    int32_t *td = NULL;
    ZO_ASSERT_OK(zo_device_malloc(zo_stream_device(s), rows * sizeof *tgt, (void **)&td));
    track(zo_stream_device(s), td);
    ZO_ASSERT_OK(zo_memcpy_h2d_async(s, td, tgt, rows * sizeof *tgt));
    for (size_t r0 = 0; r0 < rows; r0 += chunk) {
        size_t k = chunk < rows - r0 ? chunk : rows - r0;
        char *at = ld + r0 * (size_t)V * es;
        ZO_ASSERT_OK(zo_op_cross_entropy_chunk(s, r0 + k == rows ? l : NULL, rl + r0, at, at,
                                               td + r0, k, V, grad_scale, dt, r0, rows));
    }
    float *h = dev_to_host(s, l, 1, ZO_DTYPE_F32);
    *loss = h[0];
    free(h);
    *row_loss = dev_to_host(s, rl, rows, ZO_DTYPE_F32);
    *dlogits = dev_to_host(s, ld, n, dt);
}

/* The vocabulary-parallel cross-entropy over `parts` column parts of the
 * logits (part p: ids p V / parts .. (p + 1) V / parts - 1), chunk rows at a
 * time: each part's stats go straight into its slot of the gathered stats
 * (what the all-gather makes), then each part combines them. Every part's
 * row losses and loss must carry the same bits (asserted); the results are
 * part 0's loss and row losses and the parts' dlogits put back in place. */
static void run_xent_parts(zo_stream_t s, zo_dtype dt, const float *logits, const int32_t *tgt,
                           size_t rows, int V, int parts, float grad_scale, size_t chunk,
                           float *loss, float **row_loss, float **dlogits)
{
    enum { MAX_PARTS = 8 };
    assert_true(parts >= 1 && parts <= MAX_PARTS);
    const size_t es = zo_dtype_size(dt);
    int32_t *td = NULL;
    ZO_ASSERT_OK(zo_device_malloc(zo_stream_device(s), rows * sizeof *tgt, (void **)&td));
    track(zo_stream_device(s), td);
    ZO_ASSERT_OK(zo_memcpy_h2d_async(s, td, tgt, rows * sizeof *tgt));
    float *all = dev_zeros(s, (size_t)parts * chunk * ZO_XENT_STATS * sizeof(float));
    char *ld[MAX_PARTS];
    float *l[MAX_PARTS], *rl[MAX_PARTS];
    for (int p = 0; p < parts; p++) { /* part p's columns of every row */
        const int v0 = p * V / parts, n = (p + 1) * V / parts - v0;
        float *cols = malloc(rows * (size_t)n * sizeof *cols);
        assert_non_null(cols);
        for (size_t r = 0; r < rows; r++)
            memcpy(cols + r * n, logits + r * V + v0, (size_t)n * sizeof *cols);
        ld[p] = dev_from(s, cols, rows * (size_t)n, dt);
        l[p] = dev_zeros(s, sizeof(float));
        rl[p] = dev_zeros(s, rows * sizeof(float));
        free(cols);
    }
    for (size_t r0 = 0; r0 < rows; r0 += chunk) {
        const size_t k = chunk < rows - r0 ? chunk : rows - r0;
        for (int p = 0; p < parts; p++) {
            const int v0 = p * V / parts, n = (p + 1) * V / parts - v0;
            ZO_ASSERT_OK(zo_op_cross_entropy_part_stats(s, all + (size_t)p * k * ZO_XENT_STATS,
                                                        ld[p] + r0 * (size_t)n * es, td + r0, k, V,
                                                        v0, n, dt));
        }
        for (int p = 0; p < parts; p++) {
            const int v0 = p * V / parts, n = (p + 1) * V / parts - v0;
            char *at = ld[p] + r0 * (size_t)n * es;
            ZO_ASSERT_OK(zo_op_cross_entropy_part(s, r0 + k == rows ? l[p] : NULL, rl[p] + r0, at,
                                                  at, all, parts, td + r0, k, V, v0, n, grad_scale,
                                                  dt, r0, rows));
        }
    }
    *dlogits = calloc(rows * (size_t)V, sizeof **dlogits);
    assert_non_null(*dlogits);
    for (int p = 0; p < parts; p++) {
        const int v0 = p * V / parts, n = (p + 1) * V / parts - v0;
        float *hl = dev_to_host(s, l[p], 1, ZO_DTYPE_F32),
              *hrl = dev_to_host(s, rl[p], rows, ZO_DTYPE_F32);
        float *hd = dev_to_host(s, ld[p], rows * (size_t)n, dt);
        if (p == 0) {
            *loss = hl[0];
            *row_loss = hrl;
        } else { /* every rank of the group computes the same loss */
            assert_memory_equal(hl, loss, sizeof *loss);
            assert_memory_equal(hrl, *row_loss, rows * sizeof *hrl);
            free(hrl);
        }
        for (size_t r = 0; r < rows; r++)
            memcpy(*dlogits + r * V + v0, hd + r * n, (size_t)n * sizeof *hd);
        free(hl), free(hd);
    }
}

/* ---- elementwise: add, scale (in place), axpy into f32, casts, sumsq ---- */

typedef struct ew_out {
    float *add, *scaled, *axpy, *to_dt, *to_f32;
    float sumsq, sumsq_acc;
} ew_out;

static ew_out run_elementwise(zo_stream_t s, zo_dtype dt, const float *a, const float *b, size_t n,
                              float alpha)
{
    size_t es = zo_dtype_size(dt);
    void *ad = dev_from(s, a, n, dt), *bd = dev_from(s, b, n, dt), *y = dev_zeros(s, n * es);
    void *sc = dev_from(s, a, n, dt), *acc = dev_from(s, b, n, ZO_DTYPE_F32);
    void *af = dev_from(s, a, n, ZO_DTYPE_F32), *cd = dev_zeros(s, n * es),
         *cf = dev_zeros(s, n * 4);
    float *ss = dev_zeros(s, sizeof(float)), *ss2 = dev_from(s, &alpha, 1, ZO_DTYPE_F32);
    ZO_ASSERT_OK(zo_op_add(s, y, ad, bd, n, dt));
    ZO_ASSERT_OK(zo_op_scale(s, sc, alpha, n, dt));
    ZO_ASSERT_OK(zo_op_axpy(s, acc, ZO_DTYPE_F32, alpha, ad, dt, n));
    ZO_ASSERT_OK(zo_op_cast(s, cd, dt, af, ZO_DTYPE_F32, n));
    ZO_ASSERT_OK(zo_op_cast(s, cf, ZO_DTYPE_F32, cd, dt, n));
    ZO_ASSERT_OK(zo_op_sumsq(s, ss, ad, n, dt, 0));
    ZO_ASSERT_OK(zo_op_sumsq(s, ss2, ad, n, dt, 1));
    ew_out o = {dev_to_host(s, y, n, dt),
                dev_to_host(s, sc, n, dt),
                dev_to_host(s, acc, n, ZO_DTYPE_F32),
                dev_to_host(s, cd, n, dt),
                dev_to_host(s, cf, n, ZO_DTYPE_F32),
                0.0f,
                0.0f};
    float *h = dev_to_host(s, ss, 1, ZO_DTYPE_F32);
    o.sumsq = h[0];
    free(h);
    h = dev_to_host(s, ss2, 1, ZO_DTYPE_F32);
    o.sumsq_acc = h[0];
    free(h);
    return o;
}

static void ew_out_free(ew_out *o)
{
    free(o->add);
    free(o->scaled);
    free(o->axpy);
    free(o->to_dt);
    free(o->to_f32);
}

#endif
