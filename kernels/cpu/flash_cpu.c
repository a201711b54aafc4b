/* The fused (FlashAttention-2) attention op on the cpu device: the reference
 * the cuda kernel is tested against (zo_op_flash_attention_fwd/bwd in
 * zo/ops.h says what it computes).
 *
 * Work items are tiles: the forward and the dq pass run one item per
 * (batch, query head, query tile), the dk/dv pass one per (batch, key/value
 * head, key tile). The items run a (batch, key/value head) group at a time:
 * the group's rows are first converted once into fp32 panels (head-major,
 * seq x head_dim per head: its k and v, its query heads' q and dout), which
 * the tile loops then read in place, so no row is converted once per tile
 * pair (that conversion took a quarter of the op's time). A group's items go
 * to the compute pool in contiguous ranges fixed by the shape alone, and
 * each item is computed by the same code in the same order whichever thread
 * runs it, so the bits never depend on the thread count. A tile's products
 * are flash_tiles.h's (no packing, the same bits at every SIMD level); the softmax's
 * exp is cpu_exp.h's (AVX-512 where the CPU has it, the same bits as its
 * scalar reference), the rest of it plain loops. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_exp.h"
#include "cpu_flash.h"
#include "cpu_pool.h"
#include "cpu_rows.h"
#include "device_impl.h"
#include "flash_tiles.h"

#define SUBSYS "ops"

/* ---- the geometry of one call ---- */

typedef struct flash_geom {
    const zo_flash_args *a;
    int T, H, KV, D, G; /* seq, query heads, key/value heads, head_dim, group */
    int bt, nt;         /* tile rows, tiles per sequence */
    /* The (batch, key/value head) group being run, its rows in fp32 panels
     * (head-major, T x D per head): q and dout of its G query heads, k, v;
     * and k and v transposed tile by tile (tile t's D x bt block at t D bt),
     * the layout in which the products with k^T and v^T read them. */
    int b, kvh;
    float *pq, *pdo, *pk, *pv, *pkt, *pvt;
} flash_geom;

static flash_geom geom_of(const zo_flash_args *a)
{
    const zo_flash_attn_desc *d = &a->d;
    flash_geom g = {.a = a,
                    .T = d->seq,
                    .H = d->heads,
                    .KV = d->kv_heads,
                    .D = d->head_dim,
                    .G = d->heads / d->kv_heads};
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

/* ---- tile loads and stores: rows of a (batch, seq, heads, head_dim) tensor ----
 * The row kernels' conversions (cpu_rows.h: vectorized, the same bits as
 * zo/half.h's), one row at a time: a head's rows are strided. */

static void load_rows(float *dst, const void *src, zo_dtype dt, const flash_geom *g, int b,
                      int heads, int h, int r0, int n)
{
    const zo_cpu_rowk *k = zo_cpu_rows();
    for (int r = 0; r < n; r++)
        k->load(dst + (size_t)r * g->D, src, dt, (((size_t)b * g->T + r0 + r) * heads + h) * g->D,
                (size_t)g->D);
}

static void store_rows(void *dst, zo_dtype dt, const float *src, const flash_geom *g, int b,
                       int heads, int h, int r0, int n)
{
    const zo_cpu_rowk *k = zo_cpu_rows();
    for (int r = 0; r < n; r++)
        k->store(dst, dt, (((size_t)b * g->T + r0 + r) * heads + h) * g->D, src + (size_t)r * g->D,
                 (size_t)g->D);
}

/* Per-part room: two row tiles (bt x D), two score tiles (bt x bt) and two
 * row vectors; q, k, v and dout point at a panel's tile while a group runs. */
typedef struct flash_bufs {
    float *q, *k, *v, *kt, *vt, *dout, *acc, *acc2, *s, *p, *m, *l;
} flash_bufs;

/* Row r0 of query head h (of the group) or of the key/value head in a panel. */
static float *q_tile(const flash_geom *g, const float *panel, int h, int r0)
{
    return (float *)panel + ((size_t)(h - g->kvh * g->G) * g->T + r0) * g->D;
}

static float *kv_tile(const flash_geom *g, const float *panel, int r0)
{
    return (float *)panel + (size_t)r0 * g->D;
}

/* Key tile t of a transposed panel: D x bt, rows bt apart. */
static float *kvt_tile(const flash_geom *g, const float *panel, int t)
{
    return (float *)panel + (size_t)t * g->D * g->bt;
}

/* c = alpha a b, or c += a b (accumulate): flash_tiles.h's product, a read
 * as a(r, p) = a[r ars + p acs]. */
static void tile_mm(int m, int n, int k, const float *a, ptrdiff_t ars, ptrdiff_t acs,
                    const float *b, ptrdiff_t ldb, float *c, ptrdiff_t ldc, float alpha,
                    int accumulate)
{
    const zo_flash_mm_args x = {.m = m,
                                .n = n,
                                .k = k,
                                .a = a,
                                .ars = ars,
                                .acs = acs,
                                .b = b,
                                .ldb = ldb,
                                .c = c,
                                .ldc = ldc,
                                .alpha = alpha,
                                .accumulate = accumulate};
    zo_flash_tiles()->mm(&x);
}

static size_t bufs_floats(const flash_geom *g)
{
    return 2 * (size_t)g->bt * g->D + 2 * (size_t)g->bt * g->bt + 2 * (size_t)g->bt;
}

static flash_bufs bufs_at(const flash_geom *g, float *at)
{
    size_t rt = (size_t)g->bt * g->D, st = (size_t)g->bt * g->bt;
    flash_bufs w = {.acc = at, .acc2 = at + rt};
    at += 2 * rt;
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
    tile_mm(nq, nk, g->D, w->q, g->D, 1, w->kt, g->bt, w->s, nk, d->scale, 0);
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
        float *s = w->s + (size_t)r * nk, mx = zo_cpu_rows()->max(s, (size_t)nk);
        mx = mx > w->m[r] ? mx : w->m[r]; /* NaNs passed over, as before */
        if (mx == -INFINITY) {            /* nothing allowed yet: the row stays empty */
            memset(s, 0, (size_t)nk * sizeof *s);
            continue;
        }
        float alpha = zo_exp_shifted1(w->m[r], mx); /* 0 from an empty row */
        zo_cpu_exp_shifted(s, nk, mx);
        w->l[r] = w->l[r] * alpha + (float)zo_cpu_rows()->sum(s, (size_t)nk);
        w->m[r] = mx;
        float *acc = w->acc + (size_t)r * g->D;
        for (int i = 0; i < g->D; i++)
            acc[i] *= alpha;
    }
}

static void fwd_item(const flash_geom *g, flash_bufs *w, int b, int h, int qt)
{
    const zo_flash_args *a = g->a;
    int i0 = qt * g->bt, nq = rows_in(g, qt);
    w->q = q_tile(g, g->pq, h, i0);
    memset(w->acc, 0, (size_t)nq * g->D * sizeof(float));
    for (int r = 0; r < nq; r++)
        w->m[r] = -INFINITY, w->l[r] = 0.0f;
    for (int kt = 0; kt < g->nt; kt++) {
        int state = tile_state(g, qt, kt);
        if (state == TILE_SKIP)
            continue;
        int j0 = kt * g->bt, nk = rows_in(g, kt);
        w->kt = kvt_tile(g, g->pkt, kt);
        w->v = kv_tile(g, g->pv, j0);
        scores(g, w, qt, kt, nq, nk, state);
        online_softmax(g, w, nq, nk);
        tile_mm(nq, g->D, nk, w->s, nk, 1, w->v, g->D, w->acc, g->D, 1.0f, 1);
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
 * exp(s - lse), w->p = dp = dout v^T. */
static void probs_and_dprobs(const flash_geom *g, const flash_bufs *w, int b, int h, int qt, int kt,
                             int nq, int nk, int state)
{
    const float *lse = g->a->lse + ((size_t)b * g->H + h) * g->T + (size_t)qt * g->bt;
    scores(g, w, qt, kt, nq, nk, state);
    tile_mm(nq, nk, g->D, w->dout, g->D, 1, w->vt, g->bt, w->p, nk, 1.0f, 0);
    for (int r = 0; r < nq; r++) {
        float *s = w->s + (size_t)r * nk;
        if (lse[r] == -INFINITY) /* a row with nothing allowed */
            memset(s, 0, (size_t)nk * sizeof *s);
        else
            zo_cpu_exp_shifted(s, nk, lse[r]);
    }
}

/* w->p = ds = p (dp - delta), with the rows' delta from the dq pass. */
static void dscores(const flash_geom *g, const flash_bufs *w, int b, int h, int qt, int nq, int nk)
{
    const float *delta = g->a->delta + ((size_t)b * g->H + h) * g->T + (size_t)qt * g->bt;
    for (int r = 0; r < nq; r++) {
        const float *p = w->s + (size_t)r * nk;
        float *dp = w->p + (size_t)r * nk;
        for (int c = 0; c < nk; c++)
            dp[c] = p[c] * (dp[c] - delta[r]);
    }
}

/* w->k, w->kt and w->vt at key tile kt of the group's key/value head. */
static void load_kv(const flash_geom *g, flash_bufs *w, int kt)
{
    w->k = kv_tile(g, g->pk, kt * g->bt);
    w->kt = kvt_tile(g, g->pkt, kt);
    w->vt = kvt_tile(g, g->pvt, kt);
}

/* w->q and w->dout at query tile qt of query head h. */
static void load_qdo(const flash_geom *g, flash_bufs *w, int h, int qt)
{
    w->q = q_tile(g, g->pq, h, qt * g->bt);
    w->dout = q_tile(g, g->pdo, h, qt * g->bt);
}

/* dk (acc) and dv (acc2) of one key tile of key/value head kvh: over the
 * group's query heads ascending, each over its query tiles ascending, every
 * element one chain of adds (flash_tiles.h); dk is scaled once at the end. */
static void dkdv_item(const flash_geom *g, flash_bufs *w, int b, int kvh, int kt)
{
    const zo_flash_args *a = g->a;
    const zo_dtype dt = a->d.dt;
    int j0 = kt * g->bt, nk = rows_in(g, kt);
    load_kv(g, w, kt);
    memset(w->acc, 0, (size_t)nk * g->D * sizeof(float));
    memset(w->acc2, 0, (size_t)nk * g->D * sizeof(float));
    for (int h = kvh * g->G; h < (kvh + 1) * g->G; h++)
        for (int qt = 0; qt < g->nt; qt++) {
            int state = tile_state(g, qt, kt);
            if (state == TILE_SKIP)
                continue;
            int nq = rows_in(g, qt);
            load_qdo(g, w, h, qt);
            probs_and_dprobs(g, w, b, h, qt, kt, nq, nk, state);
            dscores(g, w, b, h, qt, nq, nk);
            /* dv += p^T dout; dk += ds^T q */
            tile_mm(nk, g->D, nq, w->s, 1, nk, w->dout, g->D, w->acc2, g->D, 1.0f, 1);
            tile_mm(nk, g->D, nq, w->p, 1, nk, w->q, g->D, w->acc, g->D, 1.0f, 1);
        }
    for (size_t i = 0; i < (size_t)nk * g->D; i++)
        w->acc[i] *= a->d.scale;
    store_rows(a->dk, dt, w->acc, g, b, g->KV, kvh, j0, nk);
    store_rows(a->dv, dt, w->acc2, g, b, g->KV, kvh, j0, nk);
}

/* delta and dq of one query tile of head h, over key tiles ascending.
 * delta_i = sum_j p_ij dp_ij, summed here in fp32 from the same
 * probabilities the dk/dv pass recomputes, is what makes each row's ds sum
 * to zero (to fp32's precision): FlashAttention-2's dout_i . out_i reads the
 * output rounded to bf16, and when the values share a large component (a v
 * bias) that rounding is an error in every ds of the row, which a component
 * every key shares (a k bias) then sums into dq (5-7% in bf16). delta is
 * known only after the last key tile, so the pass keeps two accumulators,
 * a = sum_j p_ij dp_ij k_j and b = sum_j p_ij k_j, and writes
 * dq_i = scale (a_i - delta_i b_i) = scale sum_j p_ij (dp_ij - delta_i) k_j:
 * one product more per tile pair than the ds form, not a second pass. */
static void dq_item(const flash_geom *g, flash_bufs *w, int b, int h, int qt)
{
    const zo_flash_args *a = g->a;
    int i0 = qt * g->bt, nq = rows_in(g, qt);
    float *delta = w->m;
    load_qdo(g, w, h, qt);
    memset(w->acc, 0, (size_t)nq * g->D * sizeof(float));
    memset(w->acc2, 0, (size_t)nq * g->D * sizeof(float));
    memset(delta, 0, (size_t)nq * sizeof *delta);
    for (int kt = 0; kt < g->nt; kt++) {
        int state = tile_state(g, qt, kt);
        if (state == TILE_SKIP)
            continue;
        int nk = rows_in(g, kt);
        load_kv(g, w, kt);
        probs_and_dprobs(g, w, b, h, qt, kt, nq, nk, state);
        for (int r = 0; r < nq; r++) {
            const float *p = w->s + (size_t)r * nk;
            float *pdp = w->p + (size_t)r * nk;
            for (int c = 0; c < nk; c++)
                pdp[c] *= p[c];
            delta[r] += (float)zo_cpu_rows()->sum(pdp, (size_t)nk);
        }
        tile_mm(nq, g->D, nk, w->p, nk, 1, w->k, g->D, w->acc, g->D, 1.0f, 1);
        tile_mm(nq, g->D, nk, w->s, nk, 1, w->k, g->D, w->acc2, g->D, 1.0f, 1);
    }
    float *out_delta = a->delta + ((size_t)b * g->H + h) * g->T + i0;
    for (int r = 0; r < nq; r++) {
        float *dq = w->acc + (size_t)r * g->D;
        const float *pk = w->acc2 + (size_t)r * g->D;
        for (int i = 0; i < g->D; i++)
            dq[i] = a->d.scale * (dq[i] - delta[r] * pk[i]);
        out_delta[r] = delta[r];
    }
    store_rows(a->o, a->d.dt, w->acc, g, b, g->H, h, i0, nq);
}

/* ---- items over the pool ---- */

typedef void (*item_fn)(const flash_geom *g, flash_bufs *w, int b, int head, int tile);

typedef struct flash_job {
    const flash_geom *g;
    item_fn fn;
    int b, h0;                             /* items: heads h0.. of batch element b, nt tiles each */
    size_t parts, first[ZO_CPU_PARTS + 1]; /* part p: items first[p] .. first[p + 1] - 1 */
    float *room;
} flash_job;

static void flash_part(void *p, size_t part)
{
    const flash_job *j = p;
    flash_bufs w = bufs_at(j->g, j->room + part * bufs_floats(j->g));
    for (size_t it = j->first[part]; it < j->first[part + 1]; it++)
        j->fn(j->g, &w, j->b, j->h0 + (int)(it / (size_t)j->g->nt), (int)(it % (size_t)j->g->nt));
}

/* The tile pairs item tile t computes: key tiles of query tile t (forward,
 * dq), or query tiles of key tile t (dk/dv, over the group's heads alike). */
static size_t item_cost(const flash_geom *g, item_fn fn, int t)
{
    size_t c = 1; /* loads and stores */
    for (int u = 0; u < g->nt; u++)
        c += (fn == dkdv_item ? tile_state(g, u, t) : tile_state(g, t, u)) != TILE_SKIP;
    return c;
}

/* Run fn over heads h0..h0+heads-1 of batch element b, nt tiles each, in at
 * most ZO_CPU_PARTS contiguous parts of about equal work (causal and sliding
 * window tiles differ: a causal query tile t computes t + 1 tile pairs), the
 * bounds fixed by the shape and mask alone, so the bits never depend on the
 * threads; room holds the parts' buffers (ZO_CPU_PARTS of bufs_floats). */
static void run_items(const flash_geom *g, item_fn fn, int b, int h0, int heads, float *room)
{
    flash_job j = {.g = g, .fn = fn, .b = b, .h0 = h0, .room = room};
    size_t n = (size_t)heads * g->nt, total = 0, done = 0;
    for (int t = 0; t < g->nt; t++)
        total += item_cost(g, fn, t);
    total *= (size_t)heads;
    j.parts = zo_cpu_split(n, ZO_CPU_PARTS, 1);
    j.first[0] = 0;
    size_t it = 0;
    for (size_t p = 1; p < j.parts; p++) { /* part p starts past p/parts of the work */
        while (it < n && done * j.parts < total * p)
            done += item_cost(g, fn, (int)(it++ % (size_t)g->nt));
        j.first[p] = it;
    }
    j.first[j.parts] = n;
    zo_cpu_pool_run(j.parts, flash_part, &j);
}

/* One head's rows of a (batch, seq, heads, head_dim) tensor into a T x D
 * fp32 panel. */
static void panel_load(float *panel, const void *src, const flash_geom *g, int heads, int h)
{
    load_rows(panel, src, g->a->d.dt, g, g->b, heads, h, 0, g->T);
}

/* A T x D panel transposed tile by tile: tile t's rows j as columns of
 * its D x bt block (kvt_tile). */
static void panel_transpose(float *dst, const float *src, const flash_geom *g)
{
    for (int t = 0; t < g->nt; t++) {
        float *blk = kvt_tile(g, dst, t);
        const float *rows = kv_tile(g, src, t * g->bt);
        for (int j = 0; j < rows_in(g, t); j++)
            for (int i = 0; i < g->D; i++)
                blk[(size_t)i * g->bt + j] = rows[(size_t)j * g->D + i];
    }
}

/* The group's panels: k and v of key/value head kvh (as rows and
 * transposed), and q and (with_dout: bwd) dout of its query heads.
 * Converting each row once per call, not once per tile pair, keeps the tile
 * loops on fp32 in cache. */
static void panels_load(flash_geom *g, int b, int kvh, int with_dout)
{
    const zo_flash_args *a = g->a;
    g->b = b, g->kvh = kvh;
    panel_load(g->pk, a->k, g, g->KV, kvh);
    panel_load(g->pv, a->v, g, g->KV, kvh);
    panel_transpose(g->pkt, g->pk, g);
    panel_transpose(g->pvt, g->pv, g);
    for (int i = 0; i < g->G; i++) {
        int h = kvh * g->G + i;
        panel_load(q_tile(g, g->pq, h, 0), a->q, g, g->H, h);
        if (with_dout)
            panel_load(q_tile(g, g->pdo, h, 0), a->dout, g, g->H, h);
    }
}

/* The room of one call: the parts' buffers, then the group's panels. */
static float *room_alloc(flash_geom *g)
{
    size_t tile = ZO_CPU_PARTS * bufs_floats(g), panel = (size_t)g->T * g->D;
    size_t tpanel = (size_t)g->nt * g->bt * g->D; /* the last tile's block whole */
    float *room = malloc((tile + (2 * (size_t)g->G + 2) * panel + 2 * tpanel) * sizeof(float));
    if (!room)
        return NULL;
    g->pk = room + tile;
    g->pv = g->pk + panel;
    g->pkt = g->pv + panel;
    g->pvt = g->pkt + tpanel;
    g->pq = g->pvt + tpanel;
    g->pdo = g->pq + (size_t)g->G * panel;
    return room;
}

static zo_status flash_fwd_task(void *p)
{
    flash_geom g = geom_of(p);
    float *room = room_alloc(&g);
    if (!room)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating the fused attention's tiles");
    for (int b = 0; b < g.a->d.batch; b++)
        for (int kvh = 0; kvh < g.KV; kvh++) {
            panels_load(&g, b, kvh, 0);
            run_items(&g, fwd_item, b, kvh * g.G, g.G, room);
        }
    free(room);
    return ZO_OK;
}

/* A group's q, k, v and dout are read into the panels before its items
 * write dq, dk and dv, and out is not read (delta comes from the
 * probabilities): the outputs may overwrite out, k and v. The dq pass runs
 * first, for the delta the dk/dv pass reads. */
static zo_status flash_bwd_task(void *p)
{
    flash_geom g = geom_of(p);
    float *room = room_alloc(&g);
    if (!room)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating the fused attention's tiles");
    for (int b = 0; b < g.a->d.batch; b++) {
        for (int kvh = 0; kvh < g.KV; kvh++) {
            panels_load(&g, b, kvh, 1);
            run_items(&g, dq_item, b, kvh * g.G, g.G, room);
            run_items(&g, dkdv_item, b, kvh, 1, room);
        }
    }
    free(room);
    return ZO_OK;
}

zo_status zo_cpu_flash_fwd(const zo_ops_exec *x, const zo_flash_args *a)
{
    return zo_stream_enqueue(x->s, flash_fwd_task, a, sizeof *a);
}

zo_status zo_cpu_flash_bwd(const zo_ops_exec *x, const zo_flash_args *a)
{
    return zo_stream_enqueue(x->s, flash_bwd_task, a, sizeof *a);
}
