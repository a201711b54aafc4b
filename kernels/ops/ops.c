/* The compute ops' front end: argument and operand-range checks, the ops
 * table the registry gives for the stream's device, and attention composed
 * from GEMMs and the causal softmax (so both backends run the same
 * schedule). */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "device_impl.h"
#include "ops_impl.h"

#define SUBSYS "ops"

/* Resolve where an op runs, creating the stream's ops context on first use
 * with the table the registry gives for the stream's device; the context
 * keeps it, so later ops skip the lookup. Two threads racing here both
 * create one; the loser frees its own. */
static zo_status exec_for(zo_stream_t s, const zo_ops_backend **be, zo_ops_exec *x)
{
    if (!s)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "stream is NULL");
    zo_stream_ops_ctx *ctx = atomic_load(&s->ops_ctx);
    if (!ctx) {
        const zo_ops_backend *ops;
        ZO_TRY(zo_ops_backend_for(s->dev->be->name, &ops));
        void *fresh = NULL;
        ZO_TRY(ops->ctx_create(s, &fresh));
        ((zo_stream_ops_ctx *)fresh)->ops = ops;
        zo_stream_ops_ctx *expected = NULL;
        if (atomic_compare_exchange_strong(&s->ops_ctx, &expected, (zo_stream_ops_ctx *)fresh)) {
            ctx = fresh;
        } else {
            ((zo_stream_ops_ctx *)fresh)->free_fn(fresh);
            ctx = expected;
        }
    }
    *be = ctx->ops;
    x->s = s;
    x->native = zo_stream_native(s);
    x->ctx = ctx;
    return ZO_OK;
}

static zo_status check_dtype(zo_dtype dt, const char *what)
{
    if (dt != ZO_DTYPE_F32 && dt != ZO_DTYPE_BF16 && dt != ZO_DTYPE_F16)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "%s has unknown dtype %d; expected f32, bf16 or f16", what, (int)dt);
    return ZO_OK;
}

/* An operand of `bytes` bytes must lie inside one live allocation. */
static zo_status check_operand(zo_stream_t s, const void *p, size_t bytes, const char *op,
                               const char *what)
{
    if (bytes == 0)
        return ZO_OK;
    if (!p)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "%s: %s is NULL", op, what);
    if (!zo_device_owns(s->dev, p, bytes))
        return ZO_FAIL(
            ZO_ERR_INVALID_ARG, SUBSYS,
            "%s: %s %p+%zu bytes is not inside a live allocation of the stream's %s device", op,
            what, p, bytes, s->dev->be->name);
    return ZO_OK;
}

static zo_status check_positive(long long v, const char *op, const char *what)
{
    if (v <= 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "%s: %s is %lld, must be > 0", op, what, v);
    return ZO_OK;
}

/* ---- GEMM ---- */

/* Elements spanned by `batch` row-major matrices of rows x cols. */
static size_t matrix_span(int batch, int64_t stride, int rows, int cols, int64_t ld)
{
    return (size_t)(batch - 1) * (size_t)stride + (size_t)(rows - 1) * (size_t)ld + (size_t)cols;
}

static zo_status check_matrix(zo_stream_t s, const void *p, zo_dtype dt, int batch, int64_t stride,
                              int rows, int cols, int64_t ld, const char *what)
{
    if (ld < cols)
        return ZO_FAIL(
            ZO_ERR_INVALID_ARG, SUBSYS,
            "gemm: leading dimension of %s is %lld, must be >= %d (its stored row length)", what,
            (long long)ld, cols);
    if (ld > INT_MAX)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "gemm: leading dimension of %s is %lld, above INT_MAX", what, (long long)ld);
    if (batch > 1 && stride < 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "gemm: batch stride of %s is negative", what);
    return check_operand(s, p, matrix_span(batch, stride, rows, cols, ld) * zo_dtype_size(dt),
                         "gemm", what);
}

static zo_status check_gemm(zo_stream_t s, const zo_gemm_desc *g)
{
    if (!g)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "gemm: descriptor is NULL");
    if (g->struct_size != sizeof *g)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "gemm: zo_gemm_desc.struct_size is %zu, expected %zu: use ZO_GEMM_DESC_INIT",
                       g->struct_size, sizeof *g);
    ZO_TRY(check_positive(g->m, "gemm", "m"));
    ZO_TRY(check_positive(g->n, "gemm", "n"));
    ZO_TRY(check_positive(g->k, "gemm", "k"));
    ZO_TRY(check_positive(g->batch, "gemm", "batch"));
    ZO_TRY(check_dtype(g->a_type, "gemm A"));
    ZO_TRY(check_dtype(g->b_type, "gemm B"));
    ZO_TRY(check_dtype(g->c_type, "gemm C"));
    if (g->a_type != g->b_type)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "gemm: A is %s but B is %s; they must match",
                       zo_dtype_name(g->a_type), zo_dtype_name(g->b_type));
    if (g->c_type != ZO_DTYPE_F32 && g->c_type != g->a_type)
        return ZO_FAIL(
            ZO_ERR_INVALID_ARG, SUBSYS, "gemm: C is %s with %s inputs; C must be f32 or %s",
            zo_dtype_name(g->c_type), zo_dtype_name(g->a_type), zo_dtype_name(g->a_type));
    int ar = g->trans_a ? g->k : g->m, ac = g->trans_a ? g->m : g->k;
    int br = g->trans_b ? g->n : g->k, bc = g->trans_b ? g->k : g->n;
    ZO_TRY(check_matrix(s, g->a, g->a_type, g->batch, g->stride_a, ar, ac, g->lda, "A"));
    ZO_TRY(check_matrix(s, g->b, g->b_type, g->batch, g->stride_b, br, bc, g->ldb, "B"));
    ZO_TRY(check_matrix(s, g->c, g->c_type, g->batch, g->stride_c, g->m, g->n, g->ldc, "C"));
    return ZO_OK;
}

zo_status zo_op_gemm(zo_stream_t s, const zo_gemm_desc *g)
{
    const zo_ops_backend *be;
    zo_ops_exec x;
    ZO_TRY(exec_for(s, &be, &x));
    ZO_TRY(check_gemm(s, g));
    return be->gemm(&x, g);
}

/* ---- embedding ---- */

/* The rows a (part of a) table holds: v0 .. v0 + part - 1 of 0 .. vocab - 1. */
static zo_status check_vocab_part(int vocab, int v0, int part, const char *op)
{
    ZO_TRY(check_positive(vocab, op, "vocab"));
    ZO_TRY(check_positive(part, op, "part"));
    if (v0 < 0 || v0 > vocab - part)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "%s: the part's ids %d .. %lld pass the vocabulary 0 .. %d: expected 0 <= "
                       "v0 and v0 + part <= vocab",
                       op, v0, (long long)v0 + part - 1, vocab - 1);
    return ZO_OK;
}

zo_status zo_op_embedding_part_fwd(zo_stream_t s, void *out, const void *table,
                                   const int32_t *tokens, size_t n_tokens, int dim, int vocab,
                                   int v0, int part, zo_dtype dt)
{
    static const char op[] = "embedding_fwd";
    const zo_ops_backend *be;
    zo_ops_exec x;
    ZO_TRY(exec_for(s, &be, &x));
    ZO_TRY(check_dtype(dt, op));
    ZO_TRY(check_positive(dim, op, "dim"));
    ZO_TRY(check_vocab_part(vocab, v0, part, op));
    size_t es = zo_dtype_size(dt);
    ZO_TRY(check_operand(s, out, n_tokens * (size_t)dim * es, op, "out"));
    ZO_TRY(check_operand(s, table, (size_t)part * (size_t)dim * es, op, "table"));
    ZO_TRY(check_operand(s, tokens, n_tokens * sizeof *tokens, op, "tokens"));
    if (n_tokens == 0)
        return ZO_OK;
    zo_embed_args a = {out, table, tokens, n_tokens, dim, vocab, dt, dt, v0, part};
    return be->embedding_fwd(&x, &a);
}

zo_status zo_op_embedding_fwd(zo_stream_t s, void *out, const void *table, const int32_t *tokens,
                              size_t n_tokens, int dim, int vocab, zo_dtype dt)
{
    return zo_op_embedding_part_fwd(s, out, table, tokens, n_tokens, dim, vocab, 0, vocab, dt);
}

zo_status zo_op_embedding_part_bwd(zo_stream_t s, void *dtable, zo_dtype dtable_dt,
                                   const void *dout, const int32_t *tokens, size_t n_tokens,
                                   int dim, int vocab, int v0, int part, zo_dtype dt)
{
    static const char op[] = "embedding_bwd";
    const zo_ops_backend *be;
    zo_ops_exec x;
    ZO_TRY(exec_for(s, &be, &x));
    ZO_TRY(check_dtype(dt, op));
    ZO_TRY(check_dtype(dtable_dt, "embedding_bwd dtable"));
    ZO_TRY(check_positive(dim, op, "dim"));
    ZO_TRY(check_vocab_part(vocab, v0, part, op));
    ZO_TRY(check_operand(s, dtable, (size_t)part * (size_t)dim * zo_dtype_size(dtable_dt), op,
                         "dtable"));
    ZO_TRY(check_operand(s, dout, n_tokens * (size_t)dim * zo_dtype_size(dt), op, "dout"));
    ZO_TRY(check_operand(s, tokens, n_tokens * sizeof *tokens, op, "tokens"));
    if (n_tokens == 0)
        return ZO_OK;
    zo_embed_args a = {dtable, dout, tokens, n_tokens, dim, vocab, dt, dtable_dt, v0, part};
    return be->embedding_bwd(&x, &a);
}

zo_status zo_op_embedding_bwd(zo_stream_t s, void *dtable, zo_dtype dtable_dt, const void *dout,
                              const int32_t *tokens, size_t n_tokens, int dim, int vocab,
                              zo_dtype dt)
{
    return zo_op_embedding_part_bwd(s, dtable, dtable_dt, dout, tokens, n_tokens, dim, vocab, 0,
                                    vocab, dt);
}

/* ---- RMSNorm ---- */

zo_status zo_op_rmsnorm_fwd(zo_stream_t s, void *y, float *rstd, const void *xin, const void *w,
                            size_t rows, int dim, float eps, zo_dtype dt)
{
    static const char op[] = "rmsnorm_fwd";
    const zo_ops_backend *be;
    zo_ops_exec x;
    ZO_TRY(exec_for(s, &be, &x));
    ZO_TRY(check_dtype(dt, op));
    ZO_TRY(check_positive(dim, op, "dim"));
    if (!(eps >= 0.0f))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "%s: eps %g must be >= 0", op, (double)eps);
    size_t es = zo_dtype_size(dt), n = rows * (size_t)dim;
    ZO_TRY(check_operand(s, y, n * es, op, "y"));
    ZO_TRY(check_operand(s, rstd, rows * sizeof(float), op, "rstd"));
    ZO_TRY(check_operand(s, xin, n * es, op, "x"));
    ZO_TRY(check_operand(s, w, (size_t)dim * es, op, "w"));
    if (rows == 0)
        return ZO_OK;
    zo_rmsnorm_args a = {y, NULL, rstd, xin, w, NULL, rows, dim, eps, 0, dt, dt};
    return be->rmsnorm_fwd(&x, &a);
}

zo_status zo_op_rmsnorm_bwd(zo_stream_t s, void *dx, void *dw, zo_dtype dw_dt, const void *dy,
                            const void *xin, const void *w, const float *rstd, size_t rows, int dim,
                            int accumulate_dx, zo_dtype dt)
{
    static const char op[] = "rmsnorm_bwd";
    const zo_ops_backend *be;
    zo_ops_exec x;
    ZO_TRY(exec_for(s, &be, &x));
    ZO_TRY(check_dtype(dt, op));
    if (dw)
        ZO_TRY(check_dtype(dw_dt, "rmsnorm_bwd dw"));
    ZO_TRY(check_positive(dim, op, "dim"));
    size_t es = zo_dtype_size(dt), n = rows * (size_t)dim;
    ZO_TRY(check_operand(s, dx, n * es, op, "dx"));
    if (dw)
        ZO_TRY(check_operand(s, dw, (size_t)dim * zo_dtype_size(dw_dt), op, "dw"));
    ZO_TRY(check_operand(s, dy, n * es, op, "dy"));
    ZO_TRY(check_operand(s, xin, n * es, op, "x"));
    ZO_TRY(check_operand(s, w, (size_t)dim * es, op, "w"));
    ZO_TRY(check_operand(s, rstd, rows * sizeof(float), op, "rstd"));
    if (rows == 0)
        return ZO_OK;
    zo_rmsnorm_args a = {dx,  dw,   (float *)rstd,      xin, w,    dy, rows,
                         dim, 0.0f, accumulate_dx != 0, dt,  dw_dt};
    return be->rmsnorm_bwd(&x, &a);
}

/* ---- RoPE ---- */

static zo_status check_head_dim(int head_dim, const char *op)
{
    if (head_dim <= 0 || head_dim % 2)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "%s: head_dim %d must be positive and even", op,
                       head_dim);
    return ZO_OK;
}

zo_status zo_op_rope_table(zo_stream_t s, float *table, int seq, int head_dim, float theta,
                           int pos0)
{
    return zo_op_rope_table_scaled(s, table, seq, head_dim, theta, pos0, NULL);
}

static zo_status check_rope_yarn(const zo_rope_scaling *sc, const char *op)
{
    if (sc->original_max_pos <= 0 || !(sc->beta_fast > 0.0f) || !(sc->beta_slow > 0.0f) ||
        !(sc->attention_factor > 0.0f))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "%s: yarn scaling needs original_max_position_embeddings %d > 0, beta_fast "
                       "%g and beta_slow %g > 0 (32 and 1 by default) and attention_factor %g > 0",
                       op, sc->original_max_pos, (double)sc->beta_fast, (double)sc->beta_slow,
                       (double)sc->attention_factor);
    return ZO_OK;
}

static zo_status check_rope_scaling(const zo_rope_scaling *sc, const char *op)
{
    if (sc->type < ZO_ROPE_SCALING_NONE || sc->type > ZO_ROPE_SCALING_DYNAMIC)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "%s: scaling type %d; expected none, linear, llama3, yarn or dynamic", op,
                       (int)sc->type);
    if (sc->type != ZO_ROPE_SCALING_NONE && !(sc->factor > 0.0f))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "%s: scaling factor %g must be > 0", op,
                       (double)sc->factor);
    if (sc->type == ZO_ROPE_SCALING_LLAMA3 &&
        (!(sc->low_freq_factor > 0.0f) || !(sc->high_freq_factor > sc->low_freq_factor) ||
         sc->original_max_pos <= 0))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "%s: llama3 scaling needs low_freq_factor %g > 0, high_freq_factor %g above "
                       "it and original_max_position_embeddings %d > 0",
                       op, (double)sc->low_freq_factor, (double)sc->high_freq_factor,
                       sc->original_max_pos);
    if (sc->type == ZO_ROPE_SCALING_YARN)
        return check_rope_yarn(sc, op);
    if (sc->type == ZO_ROPE_SCALING_DYNAMIC && sc->original_max_pos <= 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "%s: dynamic scaling needs max_position_embeddings %d > 0", op,
                       sc->original_max_pos);
    return ZO_OK;
}

zo_status zo_op_rope_table_scaled(zo_stream_t s, float *table, int seq, int head_dim, float theta,
                                  int pos0, const zo_rope_scaling *sc)
{
    static const char op[] = "rope_table";
    const zo_ops_backend *be;
    zo_ops_exec x;
    ZO_TRY(exec_for(s, &be, &x));
    ZO_TRY(check_positive(seq, op, "seq"));
    ZO_TRY(check_head_dim(head_dim, op));
    if (!(theta > 1.0f) || pos0 < 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "%s: theta %g must be > 1 and pos0 %d >= 0", op,
                       (double)theta, pos0);
    ZO_TRY(check_operand(s, table, (size_t)seq * (size_t)head_dim * sizeof(float), op, "table"));
    zo_rope_table_args a = {table, seq, head_dim, pos0, theta, {.type = ZO_ROPE_SCALING_NONE}};
    if (sc) {
        ZO_TRY(check_rope_scaling(sc, op));
        if (sc->type == ZO_ROPE_SCALING_DYNAMIC && head_dim <= 2)
            return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "%s: dynamic scaling needs head_dim %d > 2",
                           op, head_dim);
        a.sc = *sc;
    }
    return be->rope_table(&x, &a);
}

static zo_status rope_common(zo_stream_t s, void *out, const void *in, const float *table,
                             int batch, int seq, int heads, int head_dim, zo_dtype dt, int inverse)
{
    const char *op = inverse ? "rope_bwd" : "rope_fwd";
    const zo_ops_backend *be;
    zo_ops_exec x;
    ZO_TRY(exec_for(s, &be, &x));
    ZO_TRY(check_dtype(dt, op));
    ZO_TRY(check_positive(batch, op, "batch"));
    ZO_TRY(check_positive(seq, op, "seq"));
    ZO_TRY(check_positive(heads, op, "heads"));
    ZO_TRY(check_head_dim(head_dim, op));
    size_t n = (size_t)batch * (size_t)seq * (size_t)heads * (size_t)head_dim,
           es = zo_dtype_size(dt);
    ZO_TRY(check_operand(s, out, n * es, op, "out"));
    ZO_TRY(check_operand(s, in, n * es, op, "in"));
    ZO_TRY(check_operand(s, table, (size_t)seq * (size_t)head_dim * sizeof(float), op, "table"));
    zo_rope_args a = {out, in, table, batch, seq, heads, head_dim, inverse, dt};
    return be->rope(&x, &a);
}

zo_status zo_op_rope_fwd(zo_stream_t s, void *out, const void *in, const float *table, int batch,
                         int seq, int heads, int head_dim, zo_dtype dt)
{
    return rope_common(s, out, in, table, batch, seq, heads, head_dim, dt, 0);
}

zo_status zo_op_rope_bwd(zo_stream_t s, void *din, const void *dout, const float *table, int batch,
                         int seq, int heads, int head_dim, zo_dtype dt)
{
    return rope_common(s, din, dout, table, batch, seq, heads, head_dim, dt, 1);
}

/* ---- causal softmax ---- */

static zo_status softmax_common(zo_stream_t s, void *out, const void *in, const void *p,
                                size_t n_mats, int seq, zo_dtype dt, int bwd)
{
    const char *op = bwd ? "causal_softmax_bwd" : "causal_softmax_fwd";
    const zo_ops_backend *be;
    zo_ops_exec x;
    ZO_TRY(exec_for(s, &be, &x));
    ZO_TRY(check_dtype(dt, op));
    ZO_TRY(check_positive(seq, op, "seq"));
    size_t bytes = n_mats * (size_t)seq * (size_t)seq * zo_dtype_size(dt);
    ZO_TRY(check_operand(s, out, bytes, op, bwd ? "dx" : "p"));
    ZO_TRY(check_operand(s, in, bytes, op, bwd ? "dp" : "x"));
    if (bwd)
        ZO_TRY(check_operand(s, p, bytes, op, "p"));
    if (n_mats == 0)
        return ZO_OK;
    zo_softmax_args a = {out, in, p, n_mats, seq, dt};
    return bwd ? be->softmax_bwd(&x, &a) : be->softmax_fwd(&x, &a);
}

zo_status zo_op_causal_softmax_fwd(zo_stream_t s, void *p, const void *x, size_t n_mats, int seq,
                                   zo_dtype dt)
{
    return softmax_common(s, p, x, NULL, n_mats, seq, dt, 0);
}

zo_status zo_op_causal_softmax_bwd(zo_stream_t s, void *dx, const void *dp, const void *p,
                                   size_t n_mats, int seq, zo_dtype dt)
{
    return softmax_common(s, dx, dp, p, n_mats, seq, dt, 1);
}

/* ---- attention: per batch element, one strided batched GEMM over heads ----
 * Head h of batch element b of a (batch, seq, heads, head_dim) tensor is a
 * seq x head_dim matrix at offset (b*seq*heads + h)*head_dim with row stride
 * heads*head_dim, so heads are a uniform stride apart within b. */

typedef struct attn_geom {
    int B, T, H, D;
    zo_dtype dt;
    size_t es;
} attn_geom;

/* One batched GEMM over the heads of batch element b. akind, bkind, ckind say
 * where each operand lives: 'a' = the seq x seq attention matrices, 'h' = a
 * (batch, seq, heads, head_dim) tensor. */
static zo_status attn_gemm(zo_stream_t s, const attn_geom *g, int b, int ta, int tb, int m, int n,
                           int k, float alpha, const void *A, char akind, const void *Bm,
                           char bkind, void *C, char ckind)
{
    zo_gemm_desc d = ZO_GEMM_DESC_INIT;
    size_t head_off = (size_t)b * g->T * g->H * g->D * g->es,
           att_off = (size_t)b * g->H * g->T * g->T * g->es;
    int64_t hld = (int64_t)g->H * g->D, ald = g->T;
    int64_t hstride = g->D, astride = (int64_t)g->T * g->T;
    d.trans_a = ta;
    d.trans_b = tb;
    d.m = m;
    d.n = n;
    d.k = k;
    d.batch = g->H;
    d.alpha = alpha;
    d.beta = 0.0f;
    d.a_type = d.b_type = d.c_type = g->dt;
    d.a = (const char *)A + (akind == 'a' ? att_off : head_off);
    d.lda = akind == 'a' ? ald : hld;
    d.stride_a = akind == 'a' ? astride : hstride;
    d.b = (const char *)Bm + (bkind == 'a' ? att_off : head_off);
    d.ldb = bkind == 'a' ? ald : hld;
    d.stride_b = bkind == 'a' ? astride : hstride;
    d.c = (char *)C + (ckind == 'a' ? att_off : head_off);
    d.ldc = ckind == 'a' ? ald : hld;
    d.stride_c = ckind == 'a' ? astride : hstride;
    return zo_op_gemm(s, &d);
}

static zo_status check_attn(zo_stream_t s, attn_geom *g, int batch, int seq, int heads,
                            int head_dim, zo_dtype dt, const char *op)
{
    if (!s)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "%s: stream is NULL", op);
    ZO_TRY(check_dtype(dt, op));
    ZO_TRY(check_positive(batch, op, "batch"));
    ZO_TRY(check_positive(seq, op, "seq"));
    ZO_TRY(check_positive(heads, op, "heads"));
    ZO_TRY(check_positive(head_dim, op, "head_dim"));
    *g = (attn_geom){batch, seq, heads, head_dim, dt, zo_dtype_size(dt)};
    return ZO_OK;
}

static zo_status check_attn_tensors(zo_stream_t s, const attn_geom *g, const char *op,
                                    const void *const *ptrs, const char *const *names, int n_head,
                                    int n_att)
{
    size_t head_bytes = (size_t)g->B * g->T * g->H * g->D * g->es;
    size_t att_bytes = (size_t)g->B * g->H * g->T * g->T * g->es;
    for (int i = 0; i < n_head + n_att; i++)
        ZO_TRY(check_operand(s, ptrs[i], i < n_head ? head_bytes : att_bytes, op, names[i]));
    return ZO_OK;
}

zo_status zo_op_attention_fwd(zo_stream_t s, void *out, void *att, const void *q, const void *k,
                              const void *v, int batch, int seq, int heads, int head_dim,
                              zo_dtype dt)
{
    static const char op[] = "attention_fwd";
    attn_geom g;
    ZO_TRY(check_attn(s, &g, batch, seq, heads, head_dim, dt, op));
    const void *ptrs[] = {out, q, k, v, att};
    const char *names[] = {"out", "q", "k", "v", "att"};
    ZO_TRY(check_attn_tensors(s, &g, op, ptrs, names, 4, 1));
    const float scale = (float)(1.0 / sqrt((double)head_dim));
    const int T = seq, D = head_dim;
    for (int b = 0; b < batch; b++) /* scores = scale * Q K^T */
        ZO_TRY(attn_gemm(s, &g, b, 0, 1, T, T, D, scale, q, 'h', k, 'h', att, 'a'));
    ZO_TRY(zo_op_causal_softmax_fwd(s, att, att, (size_t)batch * heads, T, dt));
    for (int b = 0; b < batch; b++) /* out = P V */
        ZO_TRY(attn_gemm(s, &g, b, 0, 0, T, D, T, 1.0f, att, 'a', v, 'h', out, 'h'));
    return ZO_OK;
}

zo_status zo_op_attention_bwd(zo_stream_t s, void *dq, void *dk, void *dv, void *datt,
                              const void *dout, const void *att, const void *q, const void *k,
                              const void *v, int batch, int seq, int heads, int head_dim,
                              zo_dtype dt)
{
    static const char op[] = "attention_bwd";
    attn_geom g;
    ZO_TRY(check_attn(s, &g, batch, seq, heads, head_dim, dt, op));
    const void *ptrs[] = {dq, dk, dv, dout, q, k, v, att, datt};
    const char *names[] = {"dq", "dk", "dv", "dout", "q", "k", "v", "att", "datt"};
    ZO_TRY(check_attn_tensors(s, &g, op, ptrs, names, 7, 2));
    const float scale = (float)(1.0 / sqrt((double)head_dim));
    const int T = seq, D = head_dim;
    for (int b = 0; b < batch; b++) {
        ZO_TRY(attn_gemm(s, &g, b, 1, 0, T, D, T, 1.0f, att, 'a', dout, 'h', dv,
                         'h')); /* dV = P^T dO */
        ZO_TRY(attn_gemm(s, &g, b, 0, 1, T, T, D, 1.0f, dout, 'h', v, 'h', datt,
                         'a')); /* dP = dO V^T */
    }
    ZO_TRY(zo_op_causal_softmax_bwd(s, datt, datt, att, (size_t)batch * heads, T, dt));
    for (int b = 0; b < batch; b++) {
        ZO_TRY(attn_gemm(s, &g, b, 0, 0, T, D, T, scale, datt, 'a', k, 'h', dq,
                         'h')); /* dQ = s dS K */
        ZO_TRY(attn_gemm(s, &g, b, 1, 0, T, D, T, scale, datt, 'a', q, 'h', dk,
                         'h')); /* dK = s dS^T Q */
    }
    return ZO_OK;
}

/* ---- fused attention ---- */

static zo_status check_flash_shape(const zo_flash_attn_desc *d, const char *op)
{
    if (!d || d->struct_size != sizeof *d)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "%s: the descriptor is NULL or its struct_size is not "
                       "sizeof(zo_flash_attn_desc) (use ZO_FLASH_ATTN_DESC_INIT)",
                       op);
    ZO_TRY(check_dtype(d->dt, op));
    ZO_TRY(check_positive(d->batch, op, "batch"));
    ZO_TRY(check_positive(d->seq, op, "seq"));
    ZO_TRY(check_positive(d->heads, op, "heads"));
    ZO_TRY(check_positive(d->kv_heads, op, "kv_heads"));
    ZO_TRY(check_positive(d->head_dim, op, "head_dim"));
    if (d->heads % d->kv_heads)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "%s: heads %d is not a multiple of kv_heads %d (each key/value head "
                       "serves heads / kv_heads query heads)",
                       op, d->heads, d->kv_heads);
    if (d->head_dim > 512)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "%s: head_dim %d is above 512, the most the "
                       "fused attention's tiles hold",
                       op, d->head_dim);
    if (d->window < 0 || !(d->scale >= 0.0f) || !isfinite(d->scale))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "%s: window %d must be >= 0 (0: none) and scale %g finite and >= 0 "
                       "(0: 1/sqrt(head_dim))",
                       op, d->window, (double)d->scale);
    if (d->block_mask && (d->mask_block < 16 || d->mask_block > 512 || d->mask_block % 16))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "%s: mask_block %d must be a multiple of 16 in 16..512", op, d->mask_block);
    return ZO_OK;
}

/* Checks the descriptor and the operands shared by both directions and fills
 * the backend's arguments. */
static zo_status flash_prepare(zo_stream_t s, const zo_flash_attn_desc *d, const char *op,
                               zo_flash_args *a)
{
    ZO_TRY(check_flash_shape(d, op));
    size_t es = zo_dtype_size(d->dt), rows = (size_t)d->batch * d->seq;
    size_t qb = rows * d->heads * d->head_dim * es, kb = rows * d->kv_heads * d->head_dim * es;
    size_t lb = rows * d->heads * sizeof(float);
    const void *ptrs[] = {a->o, a->q, a->k, a->v, a->lse};
    const char *fwd_names[] = {"out", "q", "k", "v", "lse"};
    const char *bwd_names[] = {"dq", "q", "k", "v", "lse"};
    const size_t bytes[] = {qb, qb, kb, kb, lb};
    for (int i = 0; i < 5; i++)
        ZO_TRY(check_operand(s, ptrs[i], bytes[i], op, (a->dk ? bwd_names : fwd_names)[i]));
    if (a->dk) {
        const void *bp[] = {a->dk, a->dv, a->delta, a->out, a->dout};
        const char *bn[] = {"dk", "dv", "delta", "out", "dout"};
        const size_t bb[] = {kb, kb, lb, qb, qb};
        for (int i = 0; i < 5; i++)
            ZO_TRY(check_operand(s, bp[i], bb[i], op, bn[i]));
    }
    if (d->block_mask) {
        size_t nb = ((size_t)d->seq + d->mask_block - 1) / d->mask_block;
        ZO_TRY(check_operand(s, d->block_mask, nb * nb, op, "block_mask"));
    }
    a->d = *d;
    if (a->d.scale == 0.0f)
        a->d.scale = (float)(1.0 / sqrt((double)d->head_dim));
    return ZO_OK;
}

zo_status zo_op_flash_attention_fwd(zo_stream_t s, const zo_flash_attn_desc *d, void *out,
                                    float *lse, const void *q, const void *k, const void *v)
{
    static const char op[] = "flash_attention_fwd";
    const zo_ops_backend *be;
    zo_ops_exec x;
    ZO_TRY(exec_for(s, &be, &x));
    zo_flash_args a = {.o = out, .lse = lse, .q = q, .k = k, .v = v};
    ZO_TRY(flash_prepare(s, d, op, &a));
    return be->flash_fwd(&x, &a);
}

zo_status zo_op_flash_attention_bwd(zo_stream_t s, const zo_flash_attn_desc *d, void *dq, void *dk,
                                    void *dv, float *delta, const void *dout, const void *out,
                                    const float *lse, const void *q, const void *k, const void *v)
{
    static const char op[] = "flash_attention_bwd";
    const zo_ops_backend *be;
    zo_ops_exec x;
    ZO_TRY(exec_for(s, &be, &x));
    if (!dk)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "%s: dk is NULL", op);
    zo_flash_args a = {.o = dq,
                       .dk = dk,
                       .dv = dv,
                       .lse = (float *)lse,
                       .delta = delta,
                       .q = q,
                       .k = k,
                       .v = v,
                       .out = out,
                       .dout = dout};
    ZO_TRY(flash_prepare(s, d, op, &a));
    return be->flash_bwd(&x, &a);
}

/* ---- grouped-query attention's key/value heads ---- */

static zo_status repeat_kv_common(zo_stream_t s, void *out, const void *in, size_t rows,
                                  int kv_heads, int group, int head_dim, zo_dtype dt, int bwd)
{
    const char *op = bwd ? "repeat_kv_bwd" : "repeat_kv_fwd";
    const zo_ops_backend *be;
    zo_ops_exec x;
    ZO_TRY(exec_for(s, &be, &x));
    ZO_TRY(check_dtype(dt, op));
    ZO_TRY(check_positive(kv_heads, op, "kv_heads"));
    ZO_TRY(check_positive(group, op, "group"));
    ZO_TRY(check_positive(head_dim, op, "head_dim"));
    size_t small = rows * (size_t)kv_heads * (size_t)head_dim * zo_dtype_size(dt);
    size_t big = small * (size_t)group;
    ZO_TRY(check_operand(s, out, bwd ? small : big, op, bwd ? "dx" : "out"));
    ZO_TRY(check_operand(s, in, bwd ? big : small, op, bwd ? "dout" : "x"));
    if (rows == 0)
        return ZO_OK;
    zo_repeat_kv_args a = {out, in, rows, kv_heads, group, head_dim, bwd, dt};
    return be->repeat_kv(&x, &a);
}

zo_status zo_op_repeat_kv_fwd(zo_stream_t s, void *out, const void *x, size_t rows, int kv_heads,
                              int group, int head_dim, zo_dtype dt)
{
    return repeat_kv_common(s, out, x, rows, kv_heads, group, head_dim, dt, 0);
}

zo_status zo_op_repeat_kv_bwd(zo_stream_t s, void *dx, const void *dout, size_t rows, int kv_heads,
                              int group, int head_dim, zo_dtype dt)
{
    return repeat_kv_common(s, dx, dout, rows, kv_heads, group, head_dim, dt, 1);
}

/* ---- bias ---- */

zo_status zo_op_bias_fwd(zo_stream_t s, void *y, const void *bias, size_t rows, int cols,
                         zo_dtype dt)
{
    static const char op[] = "bias_fwd";
    const zo_ops_backend *be;
    zo_ops_exec x;
    ZO_TRY(exec_for(s, &be, &x));
    ZO_TRY(check_dtype(dt, op));
    ZO_TRY(check_positive(cols, op, "cols"));
    ZO_TRY(check_operand(s, y, rows * (size_t)cols * zo_dtype_size(dt), op, "y"));
    ZO_TRY(check_operand(s, bias, (size_t)cols * zo_dtype_size(dt), op, "bias"));
    if (rows == 0)
        return ZO_OK;
    zo_bias_args a = {y, bias, rows, cols, 0, dt, dt};
    return be->bias(&x, &a);
}

zo_status zo_op_bias_bwd(zo_stream_t s, void *dbias, zo_dtype dbias_dt, const void *dy, size_t rows,
                         int cols, zo_dtype dt)
{
    static const char op[] = "bias_bwd";
    const zo_ops_backend *be;
    zo_ops_exec x;
    ZO_TRY(exec_for(s, &be, &x));
    ZO_TRY(check_dtype(dt, op));
    ZO_TRY(check_dtype(dbias_dt, op));
    ZO_TRY(check_positive(cols, op, "cols"));
    ZO_TRY(check_operand(s, dy, rows * (size_t)cols * zo_dtype_size(dt), op, "dy"));
    ZO_TRY(check_operand(s, dbias, (size_t)cols * zo_dtype_size(dbias_dt), op, "dbias"));
    if (rows == 0)
        return ZO_OK;
    zo_bias_args a = {dbias, dy, rows, cols, 1, dt, dbias_dt};
    return be->bias(&x, &a);
}

/* ---- SwiGLU ---- */

zo_status zo_op_swiglu_fwd(zo_stream_t s, void *out, const void *gate, const void *up, size_t n,
                           zo_dtype dt)
{
    static const char op[] = "swiglu_fwd";
    const zo_ops_backend *be;
    zo_ops_exec x;
    ZO_TRY(exec_for(s, &be, &x));
    ZO_TRY(check_dtype(dt, op));
    size_t bytes = n * zo_dtype_size(dt);
    ZO_TRY(check_operand(s, out, bytes, op, "out"));
    ZO_TRY(check_operand(s, gate, bytes, op, "gate"));
    ZO_TRY(check_operand(s, up, bytes, op, "up"));
    if (n == 0)
        return ZO_OK;
    zo_swiglu_args a = {out, NULL, gate, up, NULL, n, dt};
    return be->swiglu_fwd(&x, &a);
}

zo_status zo_op_swiglu_bwd(zo_stream_t s, void *dgate, void *dup, const void *dout,
                           const void *gate, const void *up, size_t n, zo_dtype dt)
{
    static const char op[] = "swiglu_bwd";
    const zo_ops_backend *be;
    zo_ops_exec x;
    ZO_TRY(exec_for(s, &be, &x));
    ZO_TRY(check_dtype(dt, op));
    size_t bytes = n * zo_dtype_size(dt);
    ZO_TRY(check_operand(s, dgate, bytes, op, "dgate"));
    ZO_TRY(check_operand(s, dup, bytes, op, "dup"));
    ZO_TRY(check_operand(s, dout, bytes, op, "dout"));
    ZO_TRY(check_operand(s, gate, bytes, op, "gate"));
    ZO_TRY(check_operand(s, up, bytes, op, "up"));
    if (n == 0)
        return ZO_OK;
    zo_swiglu_args a = {dgate, dup, gate, up, dout, n, dt};
    return be->swiglu_bwd(&x, &a);
}

/* ---- cross-entropy ---- */

/* A chunk's operands: rows r0 .. r0 + rows - 1 of total, each of cols logits. */
static zo_status check_xent_rows(zo_stream_t s, const char *op, float *loss, float *row_loss,
                                 void *dlogits, const void *logits, const int32_t *targets,
                                 size_t rows, int cols, float grad_scale, zo_dtype dt, size_t r0,
                                 size_t total)
{
    if (!isfinite(grad_scale))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "%s: grad_scale %g is not finite", op,
                       (double)grad_scale);
    if (r0 > total || rows > total - r0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "%s: rows %zu from row %zu pass the batch's %zu rows", op, rows, r0, total);
    size_t bytes = rows * (size_t)cols * zo_dtype_size(dt);
    if (loss) {
        ZO_TRY(check_operand(s, loss, sizeof(float), op, "loss"));
        ZO_TRY(
            check_operand(s, row_loss - r0, total * sizeof(float), op, "row_loss (the batch's)"));
    }
    ZO_TRY(check_operand(s, row_loss, rows * sizeof(float), op, "row_loss"));
    if (dlogits)
        ZO_TRY(check_operand(s, dlogits, bytes, op, "dlogits"));
    ZO_TRY(check_operand(s, logits, bytes, op, "logits"));
    ZO_TRY(check_operand(s, targets, rows * sizeof *targets, op, "targets"));
    return ZO_OK;
}

zo_status zo_op_cross_entropy(zo_stream_t s, float *loss, float *row_loss, void *dlogits,
                              const void *logits, const int32_t *targets, size_t rows, int vocab,
                              float grad_scale, zo_dtype dt)
{
    ZO_TRY(check_operand(s, loss, sizeof(float), "cross_entropy", "loss"));
    return zo_op_cross_entropy_chunk(s, loss, row_loss, dlogits, logits, targets, rows, vocab,
                                     grad_scale, dt, 0, rows);
}

zo_status zo_op_cross_entropy_chunk(zo_stream_t s, float *loss, float *row_loss, void *dlogits,
                                    const void *logits, const int32_t *targets, size_t rows,
                                    int vocab, float grad_scale, zo_dtype dt, size_t r0,
                                    size_t total)
{
    static const char op[] = "cross_entropy";
    const zo_ops_backend *be;
    zo_ops_exec x;
    ZO_TRY(exec_for(s, &be, &x));
    ZO_TRY(check_dtype(dt, op));
    ZO_TRY(check_positive((long long)rows, op, "rows"));
    ZO_TRY(check_positive(vocab, op, "vocab"));
    ZO_TRY(check_xent_rows(s, op, loss, row_loss, dlogits, logits, targets, rows, vocab, grad_scale,
                           dt, r0, total));
    zo_xent_args a = {loss,  row_loss,   dlogits, logits, targets, rows,
                      vocab, grad_scale, dt,      r0,     total};
    return be->cross_entropy(&x, &a);
}

/* ---- the vocabulary-parallel cross-entropy ---- */

zo_status zo_op_cross_entropy_part_stats(zo_stream_t s, float *stats, const void *logits,
                                         const int32_t *targets, size_t rows, int vocab, int v0,
                                         int part, zo_dtype dt)
{
    static const char op[] = "cross_entropy_part_stats";
    const zo_ops_backend *be;
    zo_ops_exec x;
    ZO_TRY(exec_for(s, &be, &x));
    ZO_TRY(check_dtype(dt, op));
    ZO_TRY(check_positive((long long)rows, op, "rows"));
    ZO_TRY(check_vocab_part(vocab, v0, part, op));
    ZO_TRY(check_operand(s, stats, rows * ZO_XENT_STATS * sizeof(float), op, "stats"));
    ZO_TRY(check_operand(s, logits, rows * (size_t)part * zo_dtype_size(dt), op, "logits"));
    ZO_TRY(check_operand(s, targets, rows * sizeof *targets, op, "targets"));
    zo_xent_part_args a = {.stats = stats,
                           .logits = logits,
                           .targets = targets,
                           .rows = rows,
                           .vocab = vocab,
                           .v0 = v0,
                           .part = part,
                           .dt = dt};
    return be->xent_part_stats(&x, &a);
}

zo_status zo_op_cross_entropy_part(zo_stream_t s, float *loss, float *row_loss, void *dlogits,
                                   const void *logits, const float *all_stats, int parts,
                                   const int32_t *targets, size_t rows, int vocab, int v0, int part,
                                   float grad_scale, zo_dtype dt, size_t r0, size_t total)
{
    static const char op[] = "cross_entropy_part";
    const zo_ops_backend *be;
    zo_ops_exec x;
    ZO_TRY(exec_for(s, &be, &x));
    ZO_TRY(check_dtype(dt, op));
    ZO_TRY(check_positive((long long)rows, op, "rows"));
    ZO_TRY(check_positive(parts, op, "parts"));
    ZO_TRY(check_vocab_part(vocab, v0, part, op));
    ZO_TRY(check_xent_rows(s, op, loss, row_loss, dlogits, logits, targets, rows, part, grad_scale,
                           dt, r0, total));
    ZO_TRY(check_operand(s, all_stats, (size_t)parts * rows * ZO_XENT_STATS * sizeof(float), op,
                         "all_stats"));
    zo_xent_part_args a = {.all_stats = all_stats,
                           .parts = parts,
                           .loss = loss,
                           .row_loss = row_loss,
                           .dlogits = dlogits,
                           .logits = logits,
                           .targets = targets,
                           .rows = rows,
                           .vocab = vocab,
                           .v0 = v0,
                           .part = part,
                           .grad_scale = grad_scale,
                           .dt = dt,
                           .r0 = r0,
                           .total = total};
    return be->xent_part(&x, &a);
}

/* ---- elementwise ---- */

static zo_status elementwise(zo_stream_t s, const char *op, zo_ew_args *a)
{
    const zo_ops_backend *be;
    zo_ops_exec x;
    ZO_TRY(exec_for(s, &be, &x));
    ZO_TRY(check_dtype(a->y_dt, op));
    ZO_TRY(check_dtype(a->a_dt, op));
    ZO_TRY(check_operand(s, a->y, a->n * zo_dtype_size(a->y_dt), op, "y"));
    if (a->kind != ZO_EW_SCALE)
        ZO_TRY(check_operand(s, a->a, a->n * zo_dtype_size(a->a_dt), op, "x"));
    if (a->kind == ZO_EW_ADD)
        ZO_TRY(check_operand(s, a->b, a->n * zo_dtype_size(a->a_dt), op, "b"));
    if (a->n == 0)
        return ZO_OK;
    return be->elementwise(&x, a);
}

zo_status zo_op_add(zo_stream_t s, void *y, const void *a, const void *b, size_t n, zo_dtype dt)
{
    zo_ew_args e = {ZO_EW_ADD, y, a, b, 1.0f, n, dt, dt};
    return elementwise(s, "add", &e);
}

zo_status zo_op_cast(zo_stream_t s, void *dst, zo_dtype dst_dt, const void *src, zo_dtype src_dt,
                     size_t n)
{
    zo_ew_args e = {ZO_EW_CAST, dst, src, NULL, 1.0f, n, dst_dt, src_dt};
    if (dst != src && zo_dtype_size(dst_dt) && zo_dtype_size(src_dt)) {
        uintptr_t d0 = (uintptr_t)dst, d1 = d0 + n * zo_dtype_size(dst_dt);
        uintptr_t s0 = (uintptr_t)src, s1 = s0 + n * zo_dtype_size(src_dt);
        if (d0 < s1 && s0 < d1)
            return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                           "cast: dst and src overlap without being equal");
    }
    if (dst == src && dst_dt != src_dt && n)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "cast: in place from %s to %s is not allowed",
                       zo_dtype_name(src_dt), zo_dtype_name(dst_dt));
    return elementwise(s, "cast", &e);
}

zo_status zo_op_scale(zo_stream_t s, void *x, float alpha, size_t n, zo_dtype dt)
{
    zo_ew_args e = {ZO_EW_SCALE, x, NULL, NULL, alpha, n, dt, dt};
    return elementwise(s, "scale", &e);
}

zo_status zo_op_axpy(zo_stream_t s, void *y, zo_dtype y_dt, float alpha, const void *x,
                     zo_dtype x_dt, size_t n)
{
    zo_ew_args e = {ZO_EW_AXPY, y, x, NULL, alpha, n, y_dt, x_dt};
    return elementwise(s, "axpy", &e);
}

zo_status zo_op_sumsq(zo_stream_t s, float *out, const void *xin, size_t n, zo_dtype dt,
                      int accumulate)
{
    static const char op[] = "sumsq";
    const zo_ops_backend *be;
    zo_ops_exec x;
    ZO_TRY(exec_for(s, &be, &x));
    ZO_TRY(check_dtype(dt, op));
    ZO_TRY(check_operand(s, out, sizeof(float), op, "out"));
    ZO_TRY(check_operand(s, xin, n * zo_dtype_size(dt), op, "x"));
    zo_sumsq_args a = {out, xin, n, dt, accumulate != 0};
    return be->sumsq(&x, &a);
}
