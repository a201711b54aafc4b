/* The compute ops on the cpu device, written plainly: they are also the
 * reference the cuda ops are tested against. Each op copies its arguments
 * into a task on the stream (zo_stream_enqueue) and runs there, in stream
 * order, on the stream's worker thread.
 *
 * Determinism: every loop runs in a fixed order; reductions accumulate in
 * double; GEMMs are split over the compute pool into parts fixed by the shape
 * alone (gemm_cpu.c), so a result is bitwise the same run to run, at any
 * thread count, whatever else runs concurrently. What an op does to a row
 * (or a block of elements) in fp32 is a row kernel (cpu_rows.h): vectorized
 * where the CPU allows, the same bits as its scalar reference. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_flash.h"
#include "cpu_gemm.h"
#include "cpu_pool.h"
#include "cpu_rows.h"
#include "device_impl.h"
#include "ops_impl.h"
#include "zo_dtype_conv.h"

#define SUBSYS "ops"

/* ---- the per-stream context: a scratch buffer used only by the stream's
 * worker thread, so tasks of one stream never share it concurrently ---- */

typedef struct cpu_ctx {
    zo_stream_ops_ctx hdr;
    void *scratch;
    size_t cap;
} cpu_ctx;

static void cpu_ctx_free(zo_stream_ops_ctx *c)
{
    cpu_ctx *ctx = (cpu_ctx *)c;
    free(ctx->scratch);
    free(ctx);
}

static zo_status cpu_ctx_create(zo_stream_t s, void **out)
{
    cpu_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating a stream's ops context");
    ctx->hdr.free_fn = cpu_ctx_free;
    *out = ctx;
    return ZO_OK;
}

/* Host scratch of at least `bytes` (the emulated GPU's registers and shared
 * memory: not counted against the device budget). */
static zo_status scratch_get(cpu_ctx *ctx, size_t bytes, void **out)
{
    if (bytes > ctx->cap) {
        void *p = malloc(bytes);
        if (!p)
            return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating %zu bytes of op scratch", bytes);
        free(ctx->scratch);
        ctx->scratch = p;
        ctx->cap = bytes;
    }
    *out = ctx->scratch;
    return ZO_OK;
}

/* ---- element access in any dtype ---- */

static inline float ld_el(const void *p, zo_dtype dt, size_t i)
{
    switch (dt) {
    case ZO_DTYPE_BF16: return zo_conv_bf16_to_f32(((const uint16_t *)p)[i]);
    case ZO_DTYPE_F16: return zo_conv_f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static inline void st_el(void *p, zo_dtype dt, size_t i, float v)
{
    switch (dt) {
    case ZO_DTYPE_BF16: ((uint16_t *)p)[i] = zo_conv_f32_to_bf16(v); break;
    case ZO_DTYPE_F16: ((uint16_t *)p)[i] = zo_conv_f32_to_f16(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

/* ---- row-parallel ops over the compute pool ----
 * An op whose rows (or elements) are independent runs body(args, lo, hi) on
 * contiguous ranges, one per pool thread: each output is computed by the same
 * code in the same order whichever thread runs it, so the split never changes
 * the bits. Ranges shorter than min_per_part are not worth a thread. */
typedef void (*range_fn)(const void *args, size_t lo, size_t hi, size_t part);

typedef struct range_job {
    range_fn fn;
    const void *args;
    size_t n, parts, align;
} range_job;

static void range_part(void *p, size_t i)
{
    const range_job *j = p;
    size_t lo, hi;
    zo_cpu_part(j->n, j->parts, j->align, i, &lo, &hi);
    j->fn(j->args, lo, hi, i);
}

/* The number of parts run_ranges uses for n items (for per-part scratch):
 * from n alone, so that sums over parts (RMSNorm's dw) are the same bits at
 * any thread count. */
static size_t range_parts(size_t n, size_t min_per_part, size_t align)
{
    size_t want = n / (min_per_part ? min_per_part : 1);
    if (want > ZO_CPU_PARTS)
        want = ZO_CPU_PARTS;
    return zo_cpu_split(n, want ? want : 1, align);
}

static void run_ranges(size_t n, size_t min_per_part, size_t align, range_fn fn, const void *args)
{
    range_job j = {fn, args, n, range_parts(n, min_per_part, align), align};
    zo_cpu_pool_run(j.parts, range_part, &j);
}

/* Rows of a few hundred elements or more are worth a thread each pair. */
#define MIN_ROWS 2
/* Elementwise ranges: whole cache lines of any dtype, at least 16 Ki elements. */
#define EW_ALIGN 64
#define EW_MIN   ((size_t)16 << 10)

/* An op's arguments and its per-part scratch (part p's slice at p * the
 * slice size), for ops whose parts need room of their own: `scratch` for
 * sums, `rows` for fp32 copies of rows (`row_floats` a part). */
typedef struct parts_job {
    const void *args;
    void *scratch;
    float *rows;
    size_t row_floats;
} parts_job;

static float *part_rows(const parts_job *job, size_t part)
{
    return job->rows + part * job->row_floats;
}

/* Room for `per_part` fp32 values in each of the parts run_ranges makes of
 * n items, after `before` bytes of the stream's scratch. */
static zo_status rows_scratch(cpu_ctx *ctx, parts_job *job, size_t n, size_t min_per_part,
                              size_t before, size_t per_part)
{
    const size_t parts = range_parts(n, min_per_part, 1);
    void *p = NULL;
    ZO_TRY(scratch_get(ctx, before + parts * per_part * sizeof(float), &p));
    job->scratch = before ? p : NULL;
    job->rows = p ? (float *)((char *)p + before) : NULL;
    job->row_floats = per_part;
    return ZO_OK;
}

static size_t min_size(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* Enqueue fn with a copy of the op's arguments and the stream's context. */
#define CPU_TASK(name, argtype)                                                                    \
    typedef struct name##_task {                                                                   \
        argtype a;                                                                                 \
        cpu_ctx *ctx;                                                                              \
    } name##_task;                                                                                 \
    static zo_status name##_run(const argtype *a, cpu_ctx *ctx);                                   \
    static zo_status name##_tramp(void *p)                                                         \
    {                                                                                              \
        name##_task *t = p;                                                                        \
        return name##_run(&t->a, t->ctx);                                                          \
    }                                                                                              \
    static zo_status name##_enqueue(const zo_ops_exec *x, const argtype *a)                        \
    {                                                                                              \
        name##_task t = {*a, x->ctx};                                                              \
        return zo_stream_enqueue(x->s, name##_tramp, &t, sizeof t);                                \
    }

/* ---- GEMM ---- */

/* Copy a rows x cols matrix (row stride ld) of any dtype into dense fp32. */
static void to_f32_dense(float *dst, const void *src, zo_dtype dt, int rows, int cols, int64_t ld)
{
    const zo_cpu_rowk *k = zo_cpu_rows();
    for (int r = 0; r < rows; r++)
        k->load(dst + (size_t)r * cols, src, dt, (size_t)r * (size_t)ld, (size_t)cols);
}

static void from_f32_dense(void *dst, zo_dtype dt, const float *src, int rows, int cols, int64_t ld)
{
    const zo_cpu_rowk *k = zo_cpu_rows();
    for (int r = 0; r < rows; r++)
        k->store(dst, dt, (size_t)r * (size_t)ld, src + (size_t)r * cols, (size_t)cols);
}

CPU_TASK(gemm, zo_gemm_desc)
static zo_status gemm_run(const zo_gemm_desc *g, cpu_ctx *ctx)
{
    if (zo_cpu_gemm_uses_onednn(g))
        return zo_cpu_gemm_onednn(g);
    const int ar = g->trans_a ? g->k : g->m, ac = g->trans_a ? g->m : g->k;
    const int br = g->trans_b ? g->n : g->k, bc = g->trans_b ? g->k : g->n;
    const int conv_ab = g->a_type != ZO_DTYPE_F32, conv_c = g->c_type != ZO_DTYPE_F32;
    size_t na = conv_ab ? (size_t)ar * ac : 0, nb = conv_ab ? (size_t)br * bc : 0;
    size_t nc = conv_c ? (size_t)g->m * g->n : 0;
    float *buf = NULL;
    if (na + nb + nc)
        ZO_TRY(scratch_get(ctx, (na + nb + nc) * sizeof(float), (void **)&buf));
    size_t ea = zo_dtype_size(g->a_type), ec = zo_dtype_size(g->c_type);
    for (int p = 0; p < g->batch; p++) {
        const char *A = (const char *)g->a + (size_t)p * g->stride_a * ea;
        const char *B = (const char *)g->b + (size_t)p * g->stride_b * ea;
        char *C = (char *)g->c + (size_t)p * g->stride_c * ec;
        const float *fa = (const float *)A, *fb = (const float *)B;
        float *fc = (float *)C;
        int64_t lda = g->lda, ldb = g->ldb, ldc = g->ldc;
        if (conv_ab) {
            to_f32_dense(buf, A, g->a_type, ar, ac, g->lda);
            to_f32_dense(buf + na, B, g->b_type, br, bc, g->ldb);
            fa = buf;
            fb = buf + na;
            lda = ac;
            ldb = bc;
        }
        if (conv_c) {
            fc = buf + na + nb;
            if (g->beta != 0.0f)
                to_f32_dense(fc, C, g->c_type, g->m, g->n, g->ldc);
            ldc = g->n;
        }
        zo_cpu_sgemm(g->trans_a, g->trans_b, g->m, g->n, g->k, g->alpha, fa, lda, fb, ldb, g->beta,
                     fc, ldc);
        if (conv_c)
            from_f32_dense(C, g->c_type, fc, g->m, g->n, g->ldc);
    }
    return ZO_OK;
}

/* ---- embedding ---- */

static zo_status check_tokens(const int32_t *tok, size_t n, int vocab, const char *op)
{
    for (size_t t = 0; t < n; t++)
        if (tok[t] < 0 || tok[t] >= vocab)
            return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "%s: token %zu is %d, outside [0, %d)", op,
                           t, (int)tok[t], vocab);
    return ZO_OK;
}

CPU_TASK(embed_fwd, zo_embed_args)
static zo_status embed_fwd_run(const zo_embed_args *a, cpu_ctx *ctx)
{
    ZO_TRY(check_tokens(a->tokens, a->n_tokens, a->vocab, "embedding_fwd"));
    size_t row = (size_t)a->dim * zo_dtype_size(a->dt);
    for (size_t t = 0; t < a->n_tokens; t++) {
        int id = a->tokens[t] - a->v0; /* the row in this part, if it holds the token */
        char *dst = (char *)a->out + t * row;
        if (id >= 0 && id < a->part)
            memcpy(dst, (const char *)a->in + (size_t)id * row, row);
        else
            memset(dst, 0, row); /* another part's token: zero bits in every dtype */
    }
    return ZO_OK;
}

CPU_TASK(embed_bwd, zo_embed_args)
static zo_status embed_bwd_run(const zo_embed_args *a, cpu_ctx *ctx)
{
    ZO_TRY(check_tokens(a->tokens, a->n_tokens, a->vocab, "embedding_bwd"));
    const size_t D = (size_t)a->dim;
    for (size_t t = 0; t < a->n_tokens; t++) {
        int id = a->tokens[t] - a->v0;
        if (id < 0 || id >= a->part)
            continue;
        size_t dst = (size_t)id * D;
        for (size_t j = 0; j < D; j++)
            st_el(a->out, a->out_dt, dst + j,
                  ld_el(a->out, a->out_dt, dst + j) + ld_el(a->in, a->dt, t * D + j));
    }
    return ZO_OK;
}

/* ---- RMSNorm ---- */

/* A part's rows: x, y and w, dim floats each. */
static void rms_fwd_rows(const void *p, size_t lo, size_t hi, size_t part)
{
    const parts_job *job = p;
    const zo_rmsnorm_args *a = job->args;
    const zo_cpu_rowk *k = zo_cpu_rows();
    const size_t D = (size_t)a->dim;
    float *x = part_rows(job, part), *y = x + D, *w = y + D;
    k->load(w, a->w, a->dt, 0, D);
    for (size_t r = lo; r < hi; r++) {
        k->load(x, a->x, a->dt, r * D, D);
        float rs = (float)(1.0 / sqrt(k->dot(x, x, D) / (double)D + (double)a->eps));
        a->rstd[r] = rs;
        k->rms_fwd(y, x, rs, w, D);
        k->store(a->y_or_dx, a->dt, r * D, y, D);
    }
}

CPU_TASK(rms_fwd, zo_rmsnorm_args)
static zo_status rms_fwd_run(const zo_rmsnorm_args *a, cpu_ctx *ctx)
{
    parts_job job = {a, NULL, NULL, 0};
    ZO_TRY(rows_scratch(ctx, &job, a->rows, MIN_ROWS, 0, 3 * (size_t)a->dim));
    run_ranges(a->rows, MIN_ROWS, 1, rms_fwd_rows, &job);
    return ZO_OK;
}

/* dw is a sum over rows: each part accumulates its rows into its own double
 * partial (the scratch, dim doubles a part), added in part order afterwards.
 * A part's rows: x, dy, w and dx, dim floats each. */
static void rms_bwd_rows(const void *p, size_t lo, size_t hi, size_t part)
{
    const parts_job *job = p;
    const zo_rmsnorm_args *a = job->args;
    const zo_cpu_rowk *k = zo_cpu_rows();
    const size_t D = (size_t)a->dim;
    double *dw_acc = a->dw ? (double *)job->scratch + part * D : NULL;
    float *x = part_rows(job, part), *dy = x + D, *w = dy + D, *dx = w + D;
    k->load(w, a->w, a->dt, 0, D);
    for (size_t r = lo; r < hi; r++) {
        k->load(x, a->x, a->dt, r * D, D);
        k->load(dy, a->dy, a->dt, r * D, D);
        if (a->accumulate_dx)
            k->load(dx, a->y_or_dx, a->dt, r * D, D);
        k->rms_bwd(dx, x, dy, w, a->rstd[r], D, a->accumulate_dx, dw_acc);
        k->store(a->y_or_dx, a->dt, r * D, dx, D);
    }
}

CPU_TASK(rms_bwd, zo_rmsnorm_args)
static zo_status rms_bwd_run(const zo_rmsnorm_args *a, cpu_ctx *ctx)
{
    const size_t D = (size_t)a->dim, parts = range_parts(a->rows, MIN_ROWS, 1);
    const size_t dw_bytes = a->dw ? parts * D * sizeof(double) : 0;
    parts_job job = {a, NULL, NULL, 0};
    ZO_TRY(rows_scratch(ctx, &job, a->rows, MIN_ROWS, dw_bytes, 4 * D));
    double *dw = job.scratch;
    if (dw)
        memset(dw, 0, dw_bytes);
    run_ranges(a->rows, MIN_ROWS, 1, rms_bwd_rows, &job);
    if (!a->dw)
        return ZO_OK;
    for (size_t p = 1; p < parts; p++)
        for (size_t j = 0; j < D; j++)
            dw[j] += dw[p * D + j];
    for (size_t j = 0; j < D; j++)
        st_el(a->dw, a->dw_dt, j, ld_el(a->dw, a->dw_dt, j) + (float)dw[j]);
    return ZO_OK;
}

/* ---- RoPE ---- */

static void rope_table_rows(const void *args, size_t lo, size_t hi, size_t part)
{
    const zo_rope_table_args *a = args;
    const int half = a->head_dim / 2;
    const double m = zo_rope_magnitude(a);
    for (int p = (int)lo; p < (int)hi; p++)
        for (int i = 0; i < half; i++) {
            double freq = zo_rope_freq(a, i);
            double ang = (double)(a->pos0 + p) * freq;
            a->table[((size_t)p * half + i) * 2] = (float)(m * cos(ang));
            a->table[((size_t)p * half + i) * 2 + 1] = (float)(m * sin(ang));
        }
}

CPU_TASK(rope_table, zo_rope_table_args)
static zo_status rope_table_run(const zo_rope_table_args *a, cpu_ctx *ctx)
{
    run_ranges((size_t)a->seq, MIN_ROWS, 1, rope_table_rows, a);
    return ZO_OK;
}

/* Rows are (batch, position) pairs; a part's rows: one head in and out. */
static void rope_rows(const void *p, size_t lo, size_t hi, size_t part)
{
    const parts_job *job = p;
    const zo_rope_args *a = job->args;
    const zo_cpu_rowk *k = zo_cpu_rows();
    const size_t hd = (size_t)a->head_dim, half = hd / 2;
    const float sgn = a->inverse ? -1.0f : 1.0f;
    float *x = part_rows(job, part), *y = x + hd;
    for (size_t bt = lo; bt < hi; bt++) {
        const float *cs = a->table + (bt % (size_t)a->seq) * half * 2;
        for (int h = 0; h < a->heads; h++) {
            size_t base = (bt * a->heads + h) * hd;
            k->load(x, a->in, a->dt, base, hd);
            k->rope(y, x, cs, sgn, half);
            k->store(a->out, a->dt, base, y, hd);
        }
    }
}

CPU_TASK(rope, zo_rope_args)
static zo_status rope_run(const zo_rope_args *a, cpu_ctx *ctx)
{
    const size_t rows = (size_t)a->batch * a->seq;
    parts_job job = {a, NULL, NULL, 0};
    ZO_TRY(rows_scratch(ctx, &job, rows, MIN_ROWS, 0, 2 * (size_t)a->head_dim));
    run_ranges(rows, MIN_ROWS, 1, rope_rows, &job);
    return ZO_OK;
}

/* ---- causal softmax ---- */

/* Zero bits in every dtype: the masked part of a row. */
static void zero_tail(void *out, zo_dtype dt, size_t from, size_t to)
{
    const size_t es = zo_dtype_size(dt);
    memset((char *)out + from * es, 0, (to - from) * es);
}

/* A part's row: its exponentials. */
static void softmax_fwd_rows(const void *p, size_t lo, size_t hi, size_t part)
{
    const parts_job *job = p;
    const zo_softmax_args *a = job->args;
    const zo_cpu_rowk *k = zo_cpu_rows();
    const size_t T = (size_t)a->seq;
    float *e = part_rows(job, part);
    for (size_t r = lo; r < hi; r++) {
        const size_t n = r % T + 1, off = r * T;
        k->load(e, a->in, a->dt, off, n);
        k->exp_shifted(e, n, k->max(e, n));
        k->scale(e, n, (float)(1.0 / k->sum(e, n)));
        k->store(a->out, a->dt, off, e, n);
        zero_tail(a->out, a->dt, off + n, off + T);
    }
}

CPU_TASK(softmax_fwd, zo_softmax_args)
static zo_status softmax_fwd_run(const zo_softmax_args *a, cpu_ctx *ctx)
{
    const size_t rows = a->n_mats * (size_t)a->seq;
    parts_job job = {a, NULL, NULL, 0};
    ZO_TRY(rows_scratch(ctx, &job, rows, MIN_ROWS, 0, (size_t)a->seq));
    run_ranges(rows, MIN_ROWS, 1, softmax_fwd_rows, &job);
    return ZO_OK;
}

/* A part's rows: p, the incoming gradient and the result. */
static void softmax_bwd_rows(const void *p, size_t lo, size_t hi, size_t part)
{
    const parts_job *job = p;
    const zo_softmax_args *a = job->args;
    const zo_cpu_rowk *k = zo_cpu_rows();
    const size_t T = (size_t)a->seq;
    float *pr = part_rows(job, part), *g = pr + T, *y = g + T;
    for (size_t r = lo; r < hi; r++) {
        const size_t n = r % T + 1, off = r * T;
        k->load(pr, a->p, a->dt, off, n);
        k->load(g, a->in, a->dt, off, n);
        k->softmax_bwd(y, pr, g, (float)k->dot(pr, g, n), n);
        k->store(a->out, a->dt, off, y, n);
        zero_tail(a->out, a->dt, off + n, off + T);
    }
}

CPU_TASK(softmax_bwd, zo_softmax_args)
static zo_status softmax_bwd_run(const zo_softmax_args *a, cpu_ctx *ctx)
{
    const size_t rows = a->n_mats * (size_t)a->seq;
    parts_job job = {a, NULL, NULL, 0};
    ZO_TRY(rows_scratch(ctx, &job, rows, MIN_ROWS, 0, 3 * (size_t)a->seq));
    run_ranges(rows, MIN_ROWS, 1, softmax_bwd_rows, &job);
    return ZO_OK;
}

/* ---- SwiGLU ---- */

static void swiglu_fwd_range(const void *p, size_t lo, size_t hi, size_t part)
{
    const zo_swiglu_args *a = p;
    const zo_cpu_rowk *k = zo_cpu_rows();
    float g[ZO_ROW_BLOCK], u[ZO_ROW_BLOCK], y[ZO_ROW_BLOCK];
    for (size_t i = lo; i < hi; i += ZO_ROW_BLOCK) {
        const size_t n = min_size(hi - i, ZO_ROW_BLOCK);
        k->load(g, a->gate, a->dt, i, n);
        k->load(u, a->up, a->dt, i, n);
        k->swiglu_fwd(y, g, u, n);
        k->store(a->out, a->dt, i, y, n);
    }
}

CPU_TASK(swiglu_fwd, zo_swiglu_args)
static zo_status swiglu_fwd_run(const zo_swiglu_args *a, cpu_ctx *ctx)
{
    run_ranges(a->n, EW_MIN, EW_ALIGN, swiglu_fwd_range, a);
    return ZO_OK;
}

static void swiglu_bwd_range(const void *p, size_t lo, size_t hi, size_t part)
{
    const zo_swiglu_args *a = p;
    const zo_cpu_rowk *k = zo_cpu_rows();
    float g[ZO_ROW_BLOCK], u[ZO_ROW_BLOCK], d[ZO_ROW_BLOCK], dg[ZO_ROW_BLOCK], du[ZO_ROW_BLOCK];
    for (size_t i = lo; i < hi; i += ZO_ROW_BLOCK) {
        const size_t n = min_size(hi - i, ZO_ROW_BLOCK);
        k->load(g, a->gate, a->dt, i, n);
        k->load(u, a->up, a->dt, i, n);
        k->load(d, a->dout, a->dt, i, n);
        k->swiglu_bwd(dg, du, g, u, d, n);
        k->store(a->out, a->dt, i, dg, n);
        k->store(a->dup, a->dt, i, du, n);
    }
}

CPU_TASK(swiglu_bwd, zo_swiglu_args)
static zo_status swiglu_bwd_run(const zo_swiglu_args *a, cpu_ctx *ctx)
{
    run_ranges(a->n, EW_MIN, EW_ALIGN, swiglu_bwd_range, a);
    return ZO_OK;
}

/* ---- cross-entropy ---- */

/* A row's logits into buf, its max (to *mx) and its sum of exp(l - max). */
static double row_sumexp(const zo_cpu_rowk *k, float *buf, const void *logits, zo_dtype dt,
                         size_t off, size_t V, float *mx)
{
    k->load(buf, logits, dt, off, V);
    *mx = k->max(buf, V);
    k->exp_shifted(buf, V, *mx);
    return k->sum(buf, V);
}

/* A row's gradient gscale (softmax - onehot(tgt)) from its logits and their
 * log-sum-exp; tgt >= V: the target is not in this row (another part's). */
static void row_dlogits(const zo_cpu_rowk *k, float *buf, const void *logits, void *dlogits,
                        zo_dtype dt, size_t off, size_t V, float lse, float gscale, size_t tgt)
{
    k->load(buf, logits, dt, off, V);
    k->exp_shifted(buf, V, lse);
    const float pt = tgt < V ? buf[tgt] : 0.0f;
    k->scale(buf, V, gscale);
    if (tgt < V)
        buf[tgt] = gscale * (pt - 1.0f);
    k->store(dlogits, dt, off, buf, V);
}

/* The batch's mean row loss (row_loss points at a chunk from row r0), in
 * row order whatever the split or the chunks; loss NULL: not this chunk. */
static void batch_mean(float *loss, const float *row_loss, size_t r0, size_t rows)
{
    if (!loss)
        return;
    const float *batch = row_loss - r0;
    double total = 0.0;
    for (size_t r = 0; r < rows; r++)
        total += batch[r];
    *loss = (float)(total / (double)rows);
}

/* A part's row: the logits in fp32. */
static void xent_rows(const void *p, size_t lo, size_t hi, size_t part)
{
    const parts_job *job = p;
    const zo_xent_args *a = job->args;
    const zo_cpu_rowk *k = zo_cpu_rows();
    const size_t V = (size_t)a->vocab;
    const float gscale = a->grad_scale / (float)a->total;
    float *buf = part_rows(job, part);
    for (size_t r = lo; r < hi; r++) {
        const size_t off = r * V;
        float mx;
        const double sum = row_sumexp(k, buf, a->logits, a->dt, off, V, &mx);
        const float lse = mx + (float)log(sum);
        const int tgt = a->targets[r];
        a->row_loss[r] = lse - ld_el(a->logits, a->dt, off + (size_t)tgt);
        if (a->dlogits)
            row_dlogits(k, buf, a->logits, a->dlogits, a->dt, off, V, lse, gscale, (size_t)tgt);
    }
}

CPU_TASK(xent, zo_xent_args)
static zo_status xent_run(const zo_xent_args *a, cpu_ctx *ctx)
{
    ZO_TRY(check_tokens(a->targets, a->rows, a->vocab, "cross_entropy (targets)"));
    parts_job job = {a, NULL, NULL, 0};
    ZO_TRY(rows_scratch(ctx, &job, a->rows, MIN_ROWS, 0, (size_t)a->vocab));
    run_ranges(a->rows, MIN_ROWS, 1, xent_rows, &job);
    batch_mean(a->loss, a->row_loss, a->r0, a->total);
    return ZO_OK;
}

/* ---- the vocabulary-parallel cross-entropy ---- */

static int part_holds(const zo_xent_part_args *a, int tgt)
{
    return tgt >= a->v0 && tgt - a->v0 < a->part;
}

static void xent_stats_rows(const void *p, size_t lo, size_t hi, size_t part)
{
    const parts_job *job = p;
    const zo_xent_part_args *a = job->args;
    const zo_cpu_rowk *k = zo_cpu_rows();
    const size_t V = (size_t)a->part;
    float *buf = part_rows(job, part);
    for (size_t r = lo; r < hi; r++) {
        const size_t off = r * V;
        float mx;
        const double sum = row_sumexp(k, buf, a->logits, a->dt, off, V, &mx);
        const int tgt = a->targets[r];
        float *st = a->stats + r * ZO_XENT_STATS;
        st[0] = mx;
        st[1] = (float)sum;
        st[2] = part_holds(a, tgt) ? ld_el(a->logits, a->dt, off + (size_t)(tgt - a->v0)) : 0.0f;
    }
}

CPU_TASK(xent_part_stats, zo_xent_part_args)
static zo_status xent_part_stats_run(const zo_xent_part_args *a, cpu_ctx *ctx)
{
    ZO_TRY(check_tokens(a->targets, a->rows, a->vocab, "cross_entropy_part_stats (targets)"));
    parts_job job = {a, NULL, NULL, 0};
    ZO_TRY(rows_scratch(ctx, &job, a->rows, MIN_ROWS, 0, (size_t)a->part));
    run_ranges(a->rows, MIN_ROWS, 1, xent_stats_rows, &job);
    return ZO_OK;
}

/* A row's log-sum-exp and target logit from every part's stats, in part
 * order (the same bits on every rank of the group). */
static float xent_combine(const zo_xent_part_args *a, size_t r, float *tgt_logit)
{
    const size_t stride = a->rows * ZO_XENT_STATS;
    const float *st = a->all_stats + r * ZO_XENT_STATS;
    float mx = -INFINITY, t = 0.0f;
    for (int p = 0; p < a->parts; p++)
        mx = fmaxf(mx, st[p * stride]);
    double sum = 0.0;
    for (int p = 0; p < a->parts; p++) {
        sum += (double)st[p * stride + 1] * expf(st[p * stride] - mx);
        t += st[p * stride + 2];
    }
    *tgt_logit = t;
    return mx + (float)log(sum);
}

static void xent_part_rows(const void *p, size_t lo, size_t hi, size_t part)
{
    const parts_job *job = p;
    const zo_xent_part_args *a = job->args;
    const zo_cpu_rowk *k = zo_cpu_rows();
    const size_t V = (size_t)a->part;
    const float gscale = a->grad_scale / (float)a->total;
    float *buf = part_rows(job, part);
    for (size_t r = lo; r < hi; r++) {
        float t;
        const float lse = xent_combine(a, r, &t);
        a->row_loss[r] = lse - t;
        if (!a->dlogits)
            continue;
        const size_t tgt = (size_t)(a->targets[r] - a->v0); /* wraps when not held */
        row_dlogits(k, buf, a->logits, a->dlogits, a->dt, r * V, V, lse, gscale, tgt);
    }
}

CPU_TASK(xent_part, zo_xent_part_args)
static zo_status xent_part_run(const zo_xent_part_args *a, cpu_ctx *ctx)
{
    ZO_TRY(check_tokens(a->targets, a->rows, a->vocab, "cross_entropy_part (targets)"));
    parts_job job = {a, NULL, NULL, 0};
    ZO_TRY(rows_scratch(ctx, &job, a->rows, MIN_ROWS, 0, (size_t)a->part));
    run_ranges(a->rows, MIN_ROWS, 1, xent_part_rows, &job);
    batch_mean(a->loss, a->row_loss, a->r0, a->total);
    return ZO_OK;
}

/* ---- elementwise and sum of squares ---- */

static void ew_block(const zo_cpu_rowk *k, const zo_ew_args *a, size_t i, size_t n)
{
    float x[ZO_ROW_BLOCK], y[ZO_ROW_BLOCK];
    switch (a->kind) {
    case ZO_EW_ADD:
        k->load(x, a->a, a->a_dt, i, n);
        k->load(y, a->b, a->a_dt, i, n);
        k->add(y, x, y, n);
        break;
    case ZO_EW_CAST: k->load(y, a->a, a->a_dt, i, n); break;
    case ZO_EW_SCALE:
        k->load(y, a->y, a->y_dt, i, n);
        k->scale(y, n, a->alpha);
        break;
    case ZO_EW_AXPY:
        k->load(x, a->a, a->a_dt, i, n);
        k->load(y, a->y, a->y_dt, i, n);
        k->axpy(y, a->alpha, x, n);
        break;
    }
    k->store(a->y, a->y_dt, i, y, n);
}

static void ew_range(const void *p, size_t lo, size_t hi, size_t part)
{
    const zo_ew_args *a = p;
    if (a->kind == ZO_EW_CAST && a->y_dt == a->a_dt) { /* bit copy: keeps NaN payloads */
        size_t es = zo_dtype_size(a->y_dt);
        if (a->y != a->a)
            memcpy((char *)a->y + lo * es, (const char *)a->a + lo * es, (hi - lo) * es);
        return;
    }
    const zo_cpu_rowk *k = zo_cpu_rows();
    for (size_t i = lo; i < hi; i += ZO_ROW_BLOCK)
        ew_block(k, a, i, min_size(hi - i, ZO_ROW_BLOCK));
}

CPU_TASK(ew, zo_ew_args)
static zo_status ew_run(const zo_ew_args *a, cpu_ctx *ctx)
{
    run_ranges(a->n, EW_MIN, EW_ALIGN, ew_range, a);
    return ZO_OK;
}

CPU_TASK(sumsq, zo_sumsq_args)
static zo_status sumsq_run(const zo_sumsq_args *a, cpu_ctx *ctx)
{
    double sum = a->accumulate ? (double)*a->out : 0.0;
    for (size_t i = 0; i < a->n; i++) {
        double v = ld_el(a->x, a->dt, i);
        sum += v * v;
    }
    *a->out = (float)sum;
    return ZO_OK;
}

/* ---- grouped-query attention's key/value heads ---- */

/* Both ops work on blocks of ZO_ROW_BLOCK values with the row kernels'
 * conversions and adds (vectorized, the same bits as element by element):
 * every element sees the same fp32 operations in the same order as a plain
 * loop would do them. A sum of rows alternates between two accumulators,
 * so that no add writes its own input. */

/* acc[0..n) = 0 + x_0 + x_1 + ... (fp32, in order), x_j at in's element
 * off + j * stride; returns the buffer that holds it. */
static float *sum_blocks(const zo_cpu_rowk *k, const void *in, zo_dtype dt, size_t off,
                         size_t stride, size_t count, size_t n, float *acc, float *alt, float *tmp)
{
    for (size_t i = 0; i < n; i++)
        acc[i] = 0.0f;
    for (size_t j = 0; j < count; j++) {
        k->load(tmp, in, dt, off + j * stride, n);
        k->add(alt, acc, tmp, n);
        float *t = acc;
        acc = alt, alt = t;
    }
    return acc;
}

CPU_TASK(repeat_kv, zo_repeat_kv_args)
static zo_status repeat_kv_run(const zo_repeat_kv_args *a, cpu_ctx *ctx)
{
    const size_t D = (size_t)a->head_dim, K = (size_t)a->kv_heads, G = (size_t)a->group;
    const zo_cpu_rowk *k = zo_cpu_rows();
    float acc[ZO_ROW_BLOCK], alt[ZO_ROW_BLOCK], tmp[ZO_ROW_BLOCK];
    for (size_t rk = 0; rk < a->rows * K; rk++)
        for (size_t i = 0; i < D; i += ZO_ROW_BLOCK) {
            size_t n = min_size(D - i, ZO_ROW_BLOCK), small = rk * D + i, big0 = rk * G * D + i;
            if (!a->bwd) {
                k->load(tmp, a->in, a->dt, small, n);
                for (size_t j = 0; j < G; j++)
                    k->store(a->out, a->dt, big0 + j * D, tmp, n);
                continue;
            }
            float *sum = sum_blocks(k, a->in, a->dt, big0, D, G, n, acc, alt, tmp);
            k->store(a->out, a->dt, small, sum, n);
        }
    return ZO_OK;
}

/* ---- bias ---- */

CPU_TASK(bias, zo_bias_args)
static zo_status bias_run(const zo_bias_args *a, cpu_ctx *ctx)
{
    const size_t C = (size_t)a->cols;
    const zo_cpu_rowk *k = zo_cpu_rows();
    float acc[ZO_ROW_BLOCK], alt[ZO_ROW_BLOCK], tmp[ZO_ROW_BLOCK];
    for (size_t c = 0; c < C; c += ZO_ROW_BLOCK) {
        size_t n = min_size(C - c, ZO_ROW_BLOCK);
        if (!a->bwd) {
            k->load(tmp, a->in, a->dt, c, n);
            for (size_t r = 0; r < a->rows; r++) {
                k->load(acc, a->out, a->dt, r * C + c, n);
                k->add(alt, acc, tmp, n);
                k->store(a->out, a->dt, r * C + c, alt, n);
            }
            continue;
        }
        /* fp32 over rows in order, then added to out once */
        float *sum = sum_blocks(k, a->in, a->dt, c, C, a->rows, n, acc, alt, tmp);
        float *other = sum == acc ? alt : acc;
        k->load(tmp, a->out, a->out_dt, c, n);
        k->add(other, tmp, sum, n);
        k->store(a->out, a->out_dt, c, other, n);
    }
    return ZO_OK;
}

const zo_ops_backend zo_ops_cpu = {
    .name = "cpu",
    .version = ZO_OPS_BACKEND_VERSION,
    .caps = ZO_OPS_CAP_DETERMINISTIC, /* splits fixed by the shape alone */
    .ctx_create = cpu_ctx_create,
    .gemm = gemm_enqueue,
    .embedding_fwd = embed_fwd_enqueue,
    .embedding_bwd = embed_bwd_enqueue,
    .rmsnorm_fwd = rms_fwd_enqueue,
    .rmsnorm_bwd = rms_bwd_enqueue,
    .rope_table = rope_table_enqueue,
    .rope = rope_enqueue,
    .softmax_fwd = softmax_fwd_enqueue,
    .softmax_bwd = softmax_bwd_enqueue,
    .swiglu_fwd = swiglu_fwd_enqueue,
    .swiglu_bwd = swiglu_bwd_enqueue,
    .cross_entropy = xent_enqueue,
    .xent_part_stats = xent_part_stats_enqueue,
    .xent_part = xent_part_enqueue,
    .elementwise = ew_enqueue,
    .sumsq = sumsq_enqueue,
    .repeat_kv = repeat_kv_enqueue,
    .bias = bias_enqueue,
    .flash_fwd = zo_cpu_flash_fwd,
    .flash_bwd = zo_cpu_flash_bwd,
};
