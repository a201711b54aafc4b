/* The fused (FlashAttention-2) attention op on the cpu device: the reference
 * the cuda kernel is tested against (zo_op_flash_attention_fwd/bwd in
 * zo/ops.h says what it computes).
 *
 * Work items are tiles: the forward and the dq pass run one item per
 * (batch, query head, query tile), the dk/dv pass one per (batch, key/value
 * head, key tile). Items go to the compute pool in contiguous ranges fixed by
 * the shape alone, and each item is computed by the same code in the same
 * order whichever thread runs it, so the bits never depend on the thread
 * count. A tile's products are single-threaded OpenBLAS sgemm calls on fp32
 * copies of the tile (the SIMD work); the softmax runs in plain loops. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_flash.h"
#include "cpu_gemm.h"
#include "cpu_pool.h"
#include "device_impl.h"
#include "zo_dtype_conv.h"

#define SUBSYS "ops"

/* ---- the geometry of one call ---- */

typedef struct flash_geom {
    const zo_flash_args *a;
    int T, H, KV, D, G; /* seq, query heads, key/value heads, head_dim, group */
    int bt, nt;         /* tile rows, tiles per sequence */
    size_t es;
} flash_geom;

static flash_geom geom_of(const zo_flash_args *a)
{
    const zo_flash_attn_desc *d = &a->d;
    flash_geom g = {a,           d->seq,      d->heads,
                    d->kv_heads, d->head_dim, d->heads / d->kv_heads,
                    0,           0,           zo_dtype_size(d->dt)};
    g.bt = zo_flash_tile(d);
    g.nt = (g.T + g.bt - 1) / g.bt;
    return g;
}

enum { TILE_SKIP = 0, TILE_FULL, TILE_PARTIAL };

/* Whether query tile qt attends key tile kt: not at all, wholly, or only
 * some pairs (then allowed() decides per pair). */
static int tile_state(const flash_geom *g, int qt, int kt)
{
    const zo_flash_attn_desc *d = &g->a->d;
    int i0 = qt * g->bt, i1 = i0 + g->bt < g->T ? i0 + g->bt : g->T;
    int j0 = kt * g->bt, j1 = j0 + g->bt < g->T ? j0 + g->bt : g->T;
    if (d->block_mask && !d->block_mask[(size_t)qt * g->nt + kt])
        return TILE_SKIP;
    int full = 1;
    if (d->causal) {
        if (j0 > i1 - 1)
            return TILE_SKIP;
        full &= j1 - 1 <= i0;
    }
    if (d->window > 0) {
        if (i0 - (j1 - 1) >= d->window)
            return TILE_SKIP;
        full &= (i1 - 1) - j0 < d->window;
    }
    return full ? TILE_FULL : TILE_PARTIAL;
}

static int allowed(const zo_flash_attn_desc *d, int i, int j)
{
    return (!d->causal || j <= i) && (d->window <= 0 || i - j < d->window);
}

/* ---- tile loads and stores: rows of a (batch, seq, heads, head_dim) tensor ---- */

static void load_rows(float *dst, const void *src, zo_dtype dt, const flash_geom *g, int b,
                      int heads, int h, int r0, int n)
{
    size_t es = g->es;
    for (int r = 0; r < n; r++) {
        const char *p = (const char *)src + (((size_t)b * g->T + r0 + r) * heads + h) * g->D * es;
        float *o = dst + (size_t)r * g->D;
        if (dt == ZO_DTYPE_F32) {
            memcpy(o, p, (size_t)g->D * sizeof *o);
        } else if (dt == ZO_DTYPE_BF16) {
            for (int i = 0; i < g->D; i++)
                o[i] = zo_conv_bf16_to_f32(((const uint16_t *)p)[i]);
        } else {
            for (int i = 0; i < g->D; i++)
                o[i] = zo_conv_f16_to_f32(((const uint16_t *)p)[i]);
        }
    }
}

static void store_rows(void *dst, zo_dtype dt, const float *src, const flash_geom *g, int b,
                       int heads, int h, int r0, int n)
{
    size_t es = g->es;
    for (int r = 0; r < n; r++) {
        char *p = (char *)dst + (((size_t)b * g->T + r0 + r) * heads + h) * g->D * es;
        const float *s = src + (size_t)r * g->D;
        if (dt == ZO_DTYPE_F32) {
            memcpy(p, s, (size_t)g->D * sizeof *s);
        } else if (dt == ZO_DTYPE_BF16) {
            for (int i = 0; i < g->D; i++)
                ((uint16_t *)p)[i] = zo_conv_f32_to_bf16(s[i]);
        } else {
            for (int i = 0; i < g->D; i++)
                ((uint16_t *)p)[i] = zo_conv_f32_to_f16(s[i]);
        }
    }
}

/* Per-part room: six row tiles (bt x D), two score tiles (bt x bt) and two
 * row vectors. */
typedef struct flash_bufs {
    float *q, *k, *v, *dout, *acc, *acc2, *s, *p, *m, *l;
} flash_bufs;

static size_t bufs_floats(const flash_geom *g)
{
    return 6 * (size_t)g->bt * g->D + 2 * (size_t)g->bt * g->bt + 2 * (size_t)g->bt;
}

static flash_bufs bufs_at(const flash_geom *g, float *at)
{
    size_t rt = (size_t)g->bt * g->D, st = (size_t)g->bt * g->bt;
    flash_bufs w;
    float **rows[] = {&w.q, &w.k, &w.v, &w.dout, &w.acc, &w.acc2};
    for (int i = 0; i < 6; i++, at += rt)
        *rows[i] = at;
    w.s = at;
    w.p = at + st;
    w.m = at + 2 * st;
    w.l = w.m + g->bt;
    return w;
}

static int rows_in(const flash_geom *g, int t)
{
    int r0 = t * g->bt;
    return g->T - r0 < g->bt ? g->T - r0 : g->bt;
}

/* s = scale q k^T for nq x nk rows, disallowed pairs -inf. */
static void scores(const flash_geom *g, const flash_bufs *w, int qt, int kt, int nq, int nk,
                   int state)
{
    const zo_flash_attn_desc *d = &g->a->d;
    zo_cpu_sgemm_here(0, 1, nq, nk, g->D, d->scale, w->q, g->D, w->k, g->D, 0.0f, w->s, nk);
    if (state != TILE_PARTIAL)
        return;
    for (int r = 0; r < nq; r++)
        for (int c = 0; c < nk; c++)
            if (!allowed(d, qt * g->bt + r, kt * g->bt + c))
                w->s[(size_t)r * nk + c] = -INFINITY;
}

/* ---- forward: one query tile of one head ---- */

/* Online softmax over one key tile: rescale the running sum and accumulator
 * to the new row maxima and turn s into probabilities against them. */
static void online_softmax(const flash_geom *g, const flash_bufs *w, int nq, int nk)
{
    for (int r = 0; r < nq; r++) {
        float *s = w->s + (size_t)r * nk, mx = w->m[r];
        for (int c = 0; c < nk; c++)
            mx = s[c] > mx ? s[c] : mx;
        if (mx == -INFINITY) { /* nothing allowed yet: the row stays empty */
            memset(s, 0, (size_t)nk * sizeof *s);
            continue;
        }
        float alpha = w->m[r] == -INFINITY ? 0.0f : expf(w->m[r] - mx), sum = 0.0f;
        for (int c = 0; c < nk; c++) {
            s[c] = expf(s[c] - mx);
            sum += s[c];
        }
        w->l[r] = w->l[r] * alpha + sum;
        w->m[r] = mx;
        float *acc = w->acc + (size_t)r * g->D;
        for (int i = 0; i < g->D; i++)
            acc[i] *= alpha;
    }
}

static void fwd_item(const flash_geom *g, const flash_bufs *w, int b, int h, int qt)
{
    const zo_flash_args *a = g->a;
    int i0 = qt * g->bt, nq = rows_in(g, qt), kvh = h / g->G;
    load_rows(w->q, a->q, a->d.dt, g, b, g->H, h, i0, nq);
    memset(w->acc, 0, (size_t)nq * g->D * sizeof(float));
    for (int r = 0; r < nq; r++)
        w->m[r] = -INFINITY, w->l[r] = 0.0f;
    for (int kt = 0; kt < g->nt; kt++) {
        int state = tile_state(g, qt, kt);
        if (state == TILE_SKIP)
            continue;
        int j0 = kt * g->bt, nk = rows_in(g, kt);
        load_rows(w->k, a->k, a->d.dt, g, b, g->KV, kvh, j0, nk);
        load_rows(w->v, a->v, a->d.dt, g, b, g->KV, kvh, j0, nk);
        scores(g, w, qt, kt, nq, nk, state);
        online_softmax(g, w, nq, nk);
        zo_cpu_sgemm_here(0, 0, nq, g->D, nk, 1.0f, w->s, nk, w->v, g->D, 1.0f, w->acc, g->D);
    }
    float *lse = a->lse + ((size_t)b * g->H + h) * g->T + i0;
    for (int r = 0; r < nq; r++) {
        float inv = w->l[r] > 0.0f ? 1.0f / w->l[r] : 0.0f;
        for (int i = 0; i < g->D; i++)
            w->acc[(size_t)r * g->D + i] *= inv;
        lse[r] = w->l[r] > 0.0f ? w->m[r] + logf(w->l[r]) : -INFINITY;
    }
    store_rows(a->o, a->d.dt, w->acc, g, b, g->H, h, i0, nq);
}

/* ---- backward ---- */

/* For one tile pair whose q, k, v and dout tiles are loaded: w->s = p =
 * exp(s - lse), w->p = ds = p (dp - delta) with dp = dout v^T. */
static void probs_and_dscores(const flash_geom *g, const flash_bufs *w, int b, int h, int qt,
                              int kt, int nq, int nk, int state)
{
    const zo_flash_args *a = g->a;
    size_t row0 = ((size_t)b * g->H + h) * g->T + (size_t)qt * g->bt;
    const float *lse = a->lse + row0, *delta = a->delta + row0;
    scores(g, w, qt, kt, nq, nk, state);
    zo_cpu_sgemm_here(0, 1, nq, nk, g->D, 1.0f, w->dout, g->D, w->v, g->D, 0.0f, w->p, nk);
    for (int r = 0; r < nq; r++) {
        float *s = w->s + (size_t)r * nk, *dp = w->p + (size_t)r * nk;
        for (int c = 0; c < nk; c++) {
            s[c] = lse[r] == -INFINITY ? 0.0f : expf(s[c] - lse[r]);
            dp[c] = s[c] * (dp[c] - delta[r]);
        }
    }
}

/* The key and value rows of key tile kt of head kvh into w->k and w->v. */
static void load_kv(const flash_geom *g, const flash_bufs *w, int b, int kvh, int kt)
{
    const zo_flash_args *a = g->a;
    load_rows(w->k, a->k, a->d.dt, g, b, g->KV, kvh, kt * g->bt, rows_in(g, kt));
    load_rows(w->v, a->v, a->d.dt, g, b, g->KV, kvh, kt * g->bt, rows_in(g, kt));
}

/* The query and dout rows of query tile qt of head h into w->q and w->dout. */
static void load_qdo(const flash_geom *g, const flash_bufs *w, int b, int h, int qt)
{
    const zo_flash_args *a = g->a;
    load_rows(w->q, a->q, a->d.dt, g, b, g->H, h, qt * g->bt, rows_in(g, qt));
    load_rows(w->dout, a->dout, a->d.dt, g, b, g->H, h, qt * g->bt, rows_in(g, qt));
}

/* dk (acc) and dv (acc2) of one key tile of key/value head kvh: over the
 * group's query heads ascending, each over its query tiles ascending. */
static void dkdv_item(const flash_geom *g, const flash_bufs *w, int b, int kvh, int kt)
{
    const zo_flash_args *a = g->a;
    const zo_dtype dt = a->d.dt;
    int j0 = kt * g->bt, nk = rows_in(g, kt);
    load_kv(g, w, b, kvh, kt);
    memset(w->acc, 0, (size_t)nk * g->D * sizeof(float));
    memset(w->acc2, 0, (size_t)nk * g->D * sizeof(float));
    for (int h = kvh * g->G; h < (kvh + 1) * g->G; h++)
        for (int qt = 0; qt < g->nt; qt++) {
            int state = tile_state(g, qt, kt);
            if (state == TILE_SKIP)
                continue;
            int nq = rows_in(g, qt);
            load_qdo(g, w, b, h, qt);
            probs_and_dscores(g, w, b, h, qt, kt, nq, nk, state);
            /* dv += p^T dout; dk += scale ds^T q */
            zo_cpu_sgemm_here(1, 0, nk, g->D, nq, 1.0f, w->s, nk, w->dout, g->D, 1.0f, w->acc2,
                              g->D);
            zo_cpu_sgemm_here(1, 0, nk, g->D, nq, a->d.scale, w->p, nk, w->q, g->D, 1.0f, w->acc,
                              g->D);
        }
    store_rows(a->dk, dt, w->acc, g, b, g->KV, kvh, j0, nk);
    store_rows(a->dv, dt, w->acc2, g, b, g->KV, kvh, j0, nk);
}

/* dq of one query tile of head h, over key tiles ascending. */
static void dq_item(const flash_geom *g, const flash_bufs *w, int b, int h, int qt)
{
    const zo_flash_args *a = g->a;
    const zo_dtype dt = a->d.dt;
    int i0 = qt * g->bt, nq = rows_in(g, qt), kvh = h / g->G;
    load_qdo(g, w, b, h, qt);
    memset(w->acc, 0, (size_t)nq * g->D * sizeof(float));
    for (int kt = 0; kt < g->nt; kt++) {
        int state = tile_state(g, qt, kt);
        if (state == TILE_SKIP)
            continue;
        int nk = rows_in(g, kt);
        load_kv(g, w, b, kvh, kt);
        probs_and_dscores(g, w, b, h, qt, kt, nq, nk, state);
        zo_cpu_sgemm_here(0, 0, nq, g->D, nk, a->d.scale, w->p, nk, w->k, g->D, 1.0f, w->acc, g->D);
    }
    store_rows(a->o, dt, w->acc, g, b, g->H, h, i0, nq);
}

/* delta[b, h, i] = dout_i . out_i for the rows of one query tile. */
static void delta_item(const flash_geom *g, const flash_bufs *w, int b, int h, int qt)
{
    const zo_flash_args *a = g->a;
    int i0 = qt * g->bt, nq = rows_in(g, qt);
    load_rows(w->q, a->out, a->d.dt, g, b, g->H, h, i0, nq);
    load_rows(w->dout, a->dout, a->d.dt, g, b, g->H, h, i0, nq);
    float *delta = a->delta + ((size_t)b * g->H + h) * g->T + i0;
    for (int r = 0; r < nq; r++) {
        float sum = 0.0f;
        for (int i = 0; i < g->D; i++)
            sum += w->q[(size_t)r * g->D + i] * w->dout[(size_t)r * g->D + i];
        delta[r] = sum;
    }
}

/* ---- items over the pool ---- */

typedef void (*item_fn)(const flash_geom *g, const flash_bufs *w, int b, int head, int tile);

typedef struct flash_job {
    const flash_geom *g;
    item_fn fn;
    int heads; /* per batch element: H, or KV for the dk/dv pass */
    size_t n, parts;
    float *room;
} flash_job;

static void flash_part(void *p, size_t part)
{
    const flash_job *j = p;
    size_t lo, hi;
    zo_cpu_part(j->n, j->parts, 1, part, &lo, &hi);
    flash_bufs w = bufs_at(j->g, j->room + part * bufs_floats(j->g));
    for (size_t it = lo; it < hi; it++) {
        int tile = (int)(it % (size_t)j->g->nt);
        size_t bh = it / (size_t)j->g->nt;
        j->fn(j->g, &w, (int)(bh / (size_t)j->heads), (int)(bh % (size_t)j->heads), tile);
    }
}

/* Run fn over batch x heads x tiles items, in at most ZO_CPU_PARTS parts
 * fixed by the count alone. */
static zo_status run_items(const flash_geom *g, item_fn fn, int heads)
{
    flash_job j = {g, fn, heads, (size_t)g->a->d.batch * heads * g->nt, 0, NULL};
    j.parts = zo_cpu_split(j.n, ZO_CPU_PARTS, 1);
    j.room = malloc(j.parts * bufs_floats(g) * sizeof(float));
    if (!j.room)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating %zu fused-attention tiles", j.parts);
    zo_cpu_pool_run(j.parts, flash_part, &j);
    free(j.room);
    return ZO_OK;
}

static zo_status flash_fwd_task(void *p)
{
    flash_geom g = geom_of(p);
    return run_items(&g, fwd_item, g.H);
}

static zo_status flash_bwd_task(void *p)
{
    flash_geom g = geom_of(p);
    ZO_TRY(run_items(&g, delta_item, g.H));
    ZO_TRY(run_items(&g, dkdv_item, g.KV));
    return run_items(&g, dq_item, g.H);
}

zo_status zo_cpu_flash_fwd(const zo_ops_exec *x, const zo_flash_args *a)
{
    return zo_stream_enqueue(x->s, flash_fwd_task, a, sizeof *a);
}

zo_status zo_cpu_flash_bwd(const zo_ops_exec *x, const zo_flash_args *a)
{
    return zo_stream_enqueue(x->s, flash_bwd_task, a, sizeof *a);
}
