/* Exact reductions on the mpi backend: a pipelined chain in rank order.
 *
 * The vector is cut into segments (within one rank's block for a
 * reduce-scatter). For each segment rank 0 sends its values to rank 1, rank r
 * adds its own to what came from r-1 and sends the sum on, so the last rank
 * holds ((x0 + x1) + x2) + ... rounded at each step exactly as a sequential
 * loop over the ranks would: the same bits for every world size. The result
 * then travels on: for an all-reduce along the ring last -> 0 -> 1 -> ...,
 * for a reduce-scatter from the last rank to each block's owner, for a reduce
 * to its root. A window of
 * segments is in flight at once, so the chain's links all carry data at the
 * same time. Runs on the progress thread (comm_mpi.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_mpi.h"

enum { WINDOW = 4 }; /* segments in flight; each holds one slot */

typedef enum { SEG_NEW, SEG_CHAIN_RECV, SEG_CHAIN_SEND, SEG_FINAL, SEG_DONE } seg_state;

typedef struct seg {
    seg_state state;
    MPI_Request chain_req, fin_recv, fin_send;
    unsigned computed : 1, recv_passed : 1, recv_done : 1, send_passed : 1, send_done : 1;
} seg;

typedef struct mpi_exact {
    int rs;     /* a reduce-scatter */
    int target; /* a reduce: its root; else -1 */
    int r, n, root;
    size_t esz, seg_elems, shard_elems, per_shard, nseg;
    char *slots[WINDOW];
    seg *segs;
    size_t first_open;                           /* segments before it are done */
    size_t n_chain_send, n_fin_recv, n_fin_send; /* segments past each point, in order */
    int tag_chain, tag_final;
} mpi_exact;

/* Where segment k lies: its offset in the whole vector and within its block,
 * its length, and (reduce-scatter) the rank owning its block. */
typedef struct seg_geom {
    size_t global, in_shard, len;
    int owner;
} seg_geom;

static seg_geom geom(const mpi_exact *x, size_t k)
{
    size_t shard = k / x->per_shard, off = (k % x->per_shard) * x->seg_elems;
    size_t len = x->shard_elems - off < x->seg_elems ? x->shard_elems - off : x->seg_elems;
    return (seg_geom){shard * x->shard_elems + off, off, len, x->rs ? (int)shard : x->target};
}

/* Each segment has one rank that keeps it (reduce-scatter, reduce), rather
 * than all of them (all-reduce). */
static int owned(const mpi_exact *x)
{
    return x->rs || x->target >= 0;
}

static const char *send_at(const mpi_op *o, const mpi_exact *x, const seg_geom *g)
{
    return (const char *)o->coll.send + g->global * x->esz;
}

/* Where this rank keeps the finished segment. */
static char *result_at(const mpi_op *o, const mpi_exact *x, const seg_geom *g)
{
    return (char *)o->coll.recv + (x->rs ? g->in_shard : g->global) * x->esz;
}

static void free_exact(mpi_op *o)
{
    mpi_exact *x = o->exact;
    if (!x)
        return;
    for (int i = 0; i < WINDOW; i++)
        free(x->slots[i]);
    free(x->segs);
    free(x);
    o->exact = NULL;
}

static int fail(mpi_op *o, int rc)
{
    char what[64];
    snprintf(what, sizeof what, "exact %s", zo_coll_name(o->coll.kind));
    zo_mpi_fail(o, rc, what);
    return 1; /* the requests may still write into the slots: they are not freed */
}

int zo_mpi_exact_start(mpi_op *o, const mpi_engine *e)
{
    const zo_coll *op = &o->coll;
    int n = o->c->size;
    if (n == 1) {
        memmove(op->recv, op->send, op->count * zo_dtype_size(op->dt));
        return 1;
    }
    mpi_exact *x = calloc(1, sizeof *x);
    if (!x)
        return o->st = ZO_ERR_NO_MEMORY, 1;
    o->exact = x;
    x->rs = op->kind == ZO_COLL_REDUCE_SCATTER;
    x->target = op->kind == ZO_COLL_REDUCE ? op->peer : -1;
    x->r = o->c->rank;
    x->n = n;
    x->root = n - 1;
    x->esz = zo_dtype_size(op->dt);
    x->seg_elems = o->c->segment_bytes / x->esz ? o->c->segment_bytes / x->esz : 1;
    x->shard_elems = op->count;
    x->per_shard = (op->count + x->seg_elems - 1) / x->seg_elems;
    x->nseg = x->per_shard * (size_t)(x->rs ? n : 1);
    int span = (e->tag_ub - 1) / 2;
    x->tag_chain = (int)(o->seq % (uint64_t)span) * 2;
    x->tag_final = x->tag_chain + 1;
    x->segs = calloc(x->nseg ? x->nseg : 1, sizeof(seg));
    for (int i = 0; i < WINDOW && x->segs; i++)
        if (!(x->slots[i] = malloc(x->seg_elems * x->esz)))
            break;
    if (!x->segs || !x->slots[WINDOW - 1]) {
        free_exact(o);
        return o->st = ZO_ERR_NO_MEMORY, 1;
    }
    return zo_mpi_exact_step(o, e);
}

/* SEG_NEW: rank 0 sends its values, the others wait for the partial sum. */
static int start_seg(mpi_op *o, mpi_exact *x, size_t k, seg *s)
{
    seg_geom g = geom(x, k);
    MPI_Datatype t = zo_mpi_type(o->coll.dt);
    int cnt = (int)zo_mpi_count(o->coll.dt, g.len), rc;
    if (x->r == 0) {
        if (x->n_chain_send != k)
            return MPI_SUCCESS;
        rc = MPI_Isend(send_at(o, x, &g), cnt, t, 1, x->tag_chain, o->mc->chain, &s->chain_req);
        x->n_chain_send++;
        s->state = SEG_CHAIN_SEND;
    } else {
        rc = MPI_Irecv(x->slots[k % WINDOW], cnt, t, x->r - 1, x->tag_chain, o->mc->chain,
                       &s->chain_req);
        s->state = SEG_CHAIN_RECV;
    }
    return rc;
}

/* SEG_CHAIN_RECV: add this rank's values to the partial sum; pass it on, or
 * (the last rank) keep the result. */
static int on_partial(mpi_op *o, mpi_exact *x, size_t k, seg *s)
{
    int done = 0, rc = MPI_SUCCESS;
    if (!s->computed && (rc = MPI_Test(&s->chain_req, &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS)
        return rc;
    if (!s->computed && !done)
        return MPI_SUCCESS;
    seg_geom g = geom(x, k);
    char *slot = x->slots[k % WINDOW];
    if (x->r == x->root) {
        if (!owned(x)) {
            zo_comm_add(result_at(o, x, &g), slot, send_at(o, x, &g), g.len, o->coll.dt);
        } else {
            zo_comm_add(slot, slot, send_at(o, x, &g), g.len, o->coll.dt);
            if (g.owner == x->root)
                memcpy(result_at(o, x, &g), slot, g.len * x->esz);
        }
        s->state = SEG_FINAL;
        return MPI_SUCCESS;
    }
    if (!s->computed)
        zo_comm_add(slot, slot, send_at(o, x, &g), g.len, o->coll.dt);
    s->computed = 1;
    if (x->n_chain_send != k)
        return MPI_SUCCESS;
    rc = MPI_Isend(slot, (int)zo_mpi_count(o->coll.dt, g.len), zo_mpi_type(o->coll.dt), x->r + 1,
                   x->tag_chain, o->mc->chain, &s->chain_req);
    x->n_chain_send++;
    s->state = SEG_CHAIN_SEND;
    return rc;
}

/* The result's route: whom this rank receives segment k's result from and
 * sends it to (-1: nobody), and what it sends. */
static void final_route(const mpi_op *o, const mpi_exact *x, size_t k, int *from, int *to,
                        const void **src)
{
    seg_geom g = geom(x, k);
    *from = *to = -1;
    *src = NULL;
    if (!owned(x)) { /* the ring root -> 0 -> 1 -> ... -> root - 1 */
        if (x->r != x->root)
            *from = x->r == 0 ? x->root : x->r - 1;
        int next = x->r == x->root ? 0 : x->r + 1;
        if (next != x->root)
            *to = next;
        *src = result_at(o, x, &g);
    } else if (x->r == x->root) {
        if (g.owner != x->root)
            *to = g.owner;
        *src = x->slots[k % WINDOW];
    } else if (g.owner == x->r) {
        *from = x->root;
    }
}

/* SEG_FINAL: receive the result, then pass it on; both posted in segment
 * order so that messages between a pair of ranks match in order. */
static int on_final(mpi_op *o, mpi_exact *x, size_t k, seg *s)
{
    int from, to, done, rc;
    const void *src;
    final_route(o, x, k, &from, &to, &src);
    seg_geom g = geom(x, k);
    MPI_Datatype t = zo_mpi_type(o->coll.dt);
    int cnt = (int)zo_mpi_count(o->coll.dt, g.len);
    if (!s->recv_passed) {
        if (x->n_fin_recv != k)
            return MPI_SUCCESS;
        if (from >= 0 && (rc = MPI_Irecv(result_at(o, x, &g), cnt, t, from, x->tag_final,
                                         o->mc->chain, &s->fin_recv)) != MPI_SUCCESS)
            return rc;
        s->recv_passed = 1;
        s->recv_done = from < 0;
        x->n_fin_recv++;
    }
    if (!s->recv_done) {
        if ((rc = MPI_Test(&s->fin_recv, &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS || !done)
            return rc;
        s->recv_done = 1;
    }
    if (!s->send_passed) {
        if (x->n_fin_send != k)
            return MPI_SUCCESS;
        if (to >= 0 && (rc = MPI_Isend(src, cnt, t, to, x->tag_final, o->mc->chain,
                                       &s->fin_send)) != MPI_SUCCESS)
            return rc;
        s->send_passed = 1;
        s->send_done = to < 0;
        x->n_fin_send++;
    }
    if (!s->send_done) {
        if ((rc = MPI_Test(&s->fin_send, &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS || !done)
            return rc;
        s->send_done = 1;
    }
    s->state = SEG_DONE;
    return MPI_SUCCESS;
}

static int advance_seg(mpi_op *o, mpi_exact *x, size_t k)
{
    seg *s = &x->segs[k];
    int rc = MPI_SUCCESS, done;
    seg_state before;
    do { /* as far as it goes now */
        before = s->state;
        switch (s->state) {
        case SEG_NEW: rc = start_seg(o, x, k, s); break;
        case SEG_CHAIN_RECV: rc = on_partial(o, x, k, s); break;
        case SEG_CHAIN_SEND:
            done = 0;
            rc = MPI_Test(&s->chain_req, &done, MPI_STATUS_IGNORE);
            if (done)
                s->state = SEG_FINAL;
            break;
        case SEG_FINAL: rc = on_final(o, x, k, s); break;
        case SEG_DONE: break;
        }
    } while (rc == MPI_SUCCESS && s->state != before && s->state != SEG_DONE);
    return rc;
}

int zo_mpi_exact_step(mpi_op *o, const mpi_engine *e)
{
    mpi_exact *x = o->exact;
    for (size_t k = x->first_open; k < x->nseg && k < x->first_open + WINDOW; k++) {
        int rc = advance_seg(o, x, k);
        if (rc != MPI_SUCCESS)
            return fail(o, rc);
    }
    while (x->first_open < x->nseg && x->segs[x->first_open].state == SEG_DONE)
        x->first_open++;
    if (x->first_open < x->nseg)
        return 0;
    free_exact(o);
    return 1;
}
