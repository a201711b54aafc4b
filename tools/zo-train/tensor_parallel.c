/* zo-train's tensor parallelism: the slices of each tensor a rank holds and
 * the parameter source that gathers the replicated ones (tensor_parallel.h). */
#include "tensor_parallel.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "zt_error.h"

static int is_block(const zt_shape *s, int layer)
{
    return layer > 0 && layer <= s->n_layers;
}

/* Row-parallel (o_proj, down_proj) tensors are [dim, cols] row-major and
 * rank r holds columns [r cols/T, (r+1) cols/T) of every row: cols into
 * *cols. Every other tensor's part is one contiguous stretch. */
static int column_split(const zt_shape *full, int T, int layer, int idx, size_t *cols)
{
    if (T <= 1 || !is_block(full, layer) || (idx != ZT_WO && idx != ZT_WDOWN))
        return 0;
    *cols = idx == ZT_WO ? (size_t)zt_q_dim(full) : (size_t)full->ffn_dim;
    return 1;
}

size_t zt_tp_run(const zt_shape *full, int T, int layer, int idx)
{
    size_t cols;
    if (column_split(full, T, layer, idx, &cols))
        return cols / (size_t)T;
    return zt_tp_numel(full, T, layer, idx);
}

/* Rank r's part from the whole tensor src into dst (from_whole), or from
 * the part src into its place in the whole dst, in items of es bytes that
 * each stand for unit elements. */
static void move_part(const zt_shape *full, int T, int r, int layer, int idx, const char *src,
                      char *dst, size_t es, size_t unit, int from_whole)
{
    size_t cols;
    if (column_split(full, T, layer, idx, &cols)) {
        size_t w = cols / (size_t)T / unit * es, row = cols / unit * es;
        for (size_t i = 0; i < (size_t)full->dim; i++) {
            size_t in_whole = i * row + (size_t)r * w, in_part = i * w;
            memcpy(dst + (from_whole ? in_part : in_whole), src + (from_whole ? in_whole : in_part),
                   w);
        }
        return;
    }
    /* column-parallel rows, the vocabulary's rows, replicated parts and the parts of
     * shared key/value heads (rank r: part r % R of head r / R, at r n): contiguous */
    size_t n = zt_tp_numel(full, T, layer, idx) / unit * es, at = (size_t)r * n;
    memcpy(dst + (from_whole ? 0 : at), src + (from_whole ? at : 0), n);
}

void zt_tp_slice_items(const zt_shape *full, int T, int r, int layer, int idx, const void *whole,
                       void *part, size_t es, size_t unit)
{
    move_part(full, T, r, layer, idx, whole, part, es, unit, 1);
}

void zt_tp_merge_items(const zt_shape *full, int T, int layer, int idx, const void *parts,
                       size_t stride, void *whole, size_t es, size_t unit)
{
    for (int r = 0; r < T; r++)
        move_part(full, T, r, layer, idx, (const char *)parts + (size_t)r * stride, whole, es, unit,
                  0);
}

void zt_tp_merge(const zt_shape *full, int T, int layer, int idx, const float *parts, float *dst)
{
    size_t n = zt_tp_numel(full, T, layer, idx);
    zt_tp_merge_items(full, T, layer, idx, parts, n * sizeof *parts, dst, sizeof *dst, 1);
}

void zt_tp_slice(const zt_shape *full, int T, int r, int layer, int idx, const float *src,
                 float *dst)
{
    zt_tp_slice_items(full, T, r, layer, idx, src, dst, sizeof *dst, 1);
}

/* ---- the rank's view of a layer ---- */

struct zt_tp {
    zo_device_t dev;
    zo_comm_t comm, kv; /* kv: the ranks sharing this rank's key/value head (NULL: none) */
    int T, r, R;        /* R: ranks sharing a key/value head */
    int seq_par;        /* sequence parallel: the norms' gradients are the rank's rows' */
    zt_shape full;
    zo_dtype dt;
    zt_param_source inner;
    void *base;                                    /* the slots' device memory */
    void *pfull[ZT_TP_SLOTS], *gfull[ZT_TP_SLOTS]; /* slot_numel elements each */
    /* the fetched layer's gathered tensors: their index, slot, elements, group and the
     * engine's part; n_kv of them shared key/value heads */
    int n_rep, n_kv, idx[ZT_TP_SLOTS], slot[ZT_TP_SLOTS], layer;
    int backward_fetches; /* of layer 1: zt_tp_test_overflow's count */
    zo_comm_t group[ZT_TP_SLOTS];
    size_t numel[ZT_TP_SLOTS];
    void *gpart[ZT_TP_SLOTS];
};

zo_status zt_host_all_gather(zo_comm_t comm, zo_stream_t s, void *stage, size_t stage_bytes,
                             const void *mine, void *all, size_t bytes)
{
    size_t forced = zt_test_stage_bytes ? zt_test_stage_bytes() : 0;
    zo_status st;
    if (zo_comm_takes_host_memory(comm) && (!forced || !stage)) { /* forced: stages given */
        st = zo_comm_all_gather(comm, s, mine, all, bytes, ZO_DTYPE_U8);
        return st < 0 ? st : zo_stream_synchronize(s);
    }
    const size_t T = (size_t)zo_comm_size(comm);
    void *own = NULL; /* a buffer for this call: the small exchanges bring no stage */
    if (!stage && bytes) {
        stage_bytes = (T + 1) * (bytes < (4u << 20) ? bytes : (4u << 20));
        st = zo_device_malloc(zo_stream_device(s), stage_bytes, &own);
        if (st < 0)
            return st;
        stage = own;
    }
    size_t piece = stage ? stage_bytes / (T + 1) : 0;
    piece = forced && forced < piece ? forced : piece;
    if (!piece && bytes)
        return zt_fail(ZO_ERR_INTERNAL,
                       "the %s communicator takes device memory only, and no staging buffer "
                       "(%zu bytes) holds a piece for each of its %zu ranks",
                       zo_comm_backend(comm), stage_bytes, T);
    char *send = stage, *recv = send + piece;
    st = ZO_OK;
    for (size_t off = 0; st >= 0 && off < bytes; off += piece) {
        size_t n = bytes - off < piece ? bytes - off : piece;
        st = zo_memcpy_h2d_async(s, send, (const char *)mine + off, n);
        if (st >= 0)
            st = zo_comm_all_gather(comm, s, send, recv, n, ZO_DTYPE_U8);
        for (size_t r = 0; st >= 0 && r < T; r++)
            st = zo_memcpy_d2h_async(s, (char *)all + r * bytes + off, recv + r * n, n);
        zo_status sy = zo_stream_synchronize(s); /* the buffer is reused next */
        st = st < 0 ? st : sy;
    }
    if (own)
        zo_device_mfree(zo_stream_device(s), own);
    return st;
}

void *zt_tp_stage(zt_tp *tp, size_t *bytes)
{
    *bytes = tp ? (size_t)zt_tp_device_bytes(&tp->full, tp->T, tp->dt, 0) : 0;
    return tp ? tp->base : NULL;
}

zo_status zt_tp_init(zt_tp **out, zo_device_t dev, zo_comm_t comm, const zt_shape *full,
                     zo_dtype dt, int seq_par, const zt_param_source *inner)
{
    zt_tp *tp = calloc(1, sizeof *tp);
    if (!tp)
        return zt_fail(ZO_ERR_NO_MEMORY, "tensor-parallel view");
    *tp = (zt_tp){.dev = dev,
                  .comm = comm,
                  .T = zo_comm_size(comm),
                  .r = zo_comm_rank(comm),
                  .full = *full,
                  .dt = dt,
                  .seq_par = seq_par > 1,
                  .inner = *inner};
    tp->R = zt_tp_kv_sharers(full, tp->T);
    zo_status st = tp->R > 1 ? zo_comm_split(comm, tp->r / tp->R, tp->r % tp->R, &tp->kv) : ZO_OK;
    if (st >= 0)
        st = zo_device_malloc(dev, zt_tp_device_bytes(full, tp->T, dt, 0), &tp->base);
    if (st < 0) {
        zt_tp_free(tp);
        return zt_lib_fail(st, "the tensor-parallel gather buffers and groups");
    }
    char *b = tp->base;
    for (int k = 0; k < ZT_TP_SLOTS; k++) {
        size_t bytes = zt_tp_slot_numel(full, tp->T, k) * zo_dtype_size(dt);
        tp->pfull[k] = b;
        tp->gfull[k] = b + bytes;
        b += 2 * bytes;
    }
    *out = tp;
    return ZO_OK;
}

void zt_tp_free(zt_tp *tp)
{
    if (!tp)
        return;
    zo_device_mfree(tp->dev, tp->base);
    zo_comm_free(tp->kv);
    free(tp);
}

/* The whole tensor (n elements: a replicated tensor, or the rank's shared
 * key/value head) from the parts of its group's ranks into a slot, and
 * (backward) a zeroed whole gradient in its place; the engine's part is
 * kept for grads_ready. */
static zo_status gather_one(zt_tp *tp, int layer, int k, zo_stream_t s, void **p, void **g)
{
    const int shared = zt_tp_kv_shared(&tp->full, tp->T, layer, k);
    zt_shape local = zt_tp_local_shape(&tp->full, tp->T);
    size_t n = zt_tensor_numel(shared ? &local : &tp->full, layer, k), es = zo_dtype_size(tp->dt);
    zo_comm_t group = shared ? tp->kv : tp->comm;
    int j = tp->n_rep++, slot = shared ? ZT_TP_REP_SLOTS + tp->n_kv++ : j - tp->n_kv;
    if (slot >= (shared ? ZT_TP_SLOTS : ZT_TP_REP_SLOTS))
        return zt_fail(ZO_ERR_INTERNAL, "layer %d has more gathered tensors than slots", layer);
    ZT_LIB(zo_comm_all_gather(group, s, p[k], tp->pfull[slot], n / (size_t)zo_comm_size(group),
                              tp->dt));
    p[k] = tp->pfull[slot];
    tp->idx[j] = k;
    tp->slot[j] = slot;
    tp->numel[j] = n;
    tp->group[j] = group;
    tp->gpart[j] = g ? g[k] : NULL;
    if (g && g[k]) {
        ZT_LIB(zo_memset_async(s, tp->gfull[slot], 0, n * es));
        g[k] = tp->gfull[slot];
    }
    return ZO_OK;
}

/* zt_tp_test_overflow's Inf, in the gradient's type, at its first element. */
static zo_status plant_inf(zt_tp *tp, int layer, zo_phase phase, zo_stream_t s, void **g)
{
    static const uint16_t f16 = 0x7c00, bf16 = 0x7f80;
    static const float f32 = INFINITY;
    if (!zt_tp_test_overflow || layer != 1 || phase != ZO_PHASE_BACKWARD || !g || !g[ZT_WQ])
        return ZO_OK;
    if (!zt_tp_test_overflow(zo_comm_world_rank(tp->comm, tp->r), ++tp->backward_fetches))
        return ZO_OK;
    const void *inf = tp->dt == ZO_DTYPE_F16    ? (const void *)&f16
                      : tp->dt == ZO_DTYPE_BF16 ? (const void *)&bf16
                                                : (const void *)&f32;
    ZT_LIB(zo_memcpy_h2d_async(s, g[ZT_WQ], inf, zo_dtype_size(tp->dt)));
    return ZO_OK;
}

static zo_status tp_fetch(void *ctx, int layer, zo_phase phase, zo_stream_t s, void **p, void **g,
                          int n)
{
    zt_tp *tp = ctx;
    ZT_TRY(tp->inner.fetch(tp->inner.ctx, layer, phase, s, p, g, n));
    ZT_TRY(plant_inf(tp, layer, phase, s, g));
    tp->n_rep = tp->n_kv = 0;
    tp->layer = layer;
    for (int k = 0; k < zt_layer_tensors(&tp->full, layer) && k < n; k++)
        if (zt_tp_replicated(&tp->full, layer, k) || zt_tp_kv_shared(&tp->full, tp->T, layer, k))
            ZT_TRY(gather_one(tp, layer, k, s, p, g));
    return ZO_OK;
}

/* Sequence parallel: a norm's gradient is the rank's rows' share (every
 * replicated tensor but o_proj's bias, which sees every token's gradient). */
static int rows_share(const zt_tp *tp, int idx)
{
    const int block = tp->layer > 0 && tp->layer <= tp->full.n_layers;
    return tp->seq_par && !(block && idx == ZT_BO);
}

/* The rank's part of each whole gradient added to the engine's, then the
 * engine takes the layer's. A replicated tensor's gradient is the same on
 * every rank; a shared key/value head's is each rank's query heads' share,
 * summed over the ranks sharing it first (an exact chain, in rank order),
 * as is a norm's under sequence parallelism (each rank's rows' share). */
static zo_status tp_grads_ready(void *ctx, int layer, zo_stream_t s)
{
    zt_tp *tp = ctx;
    size_t es = zo_dtype_size(tp->dt);
    for (int j = 0; j < tp->n_rep; j++) {
        if (!tp->gpart[j])
            continue;
        const int size = zo_comm_size(tp->group[j]), r = zo_comm_rank(tp->group[j]);
        size_t part = tp->numel[j] / (size_t)size;
        char *whole = tp->gfull[tp->slot[j]], *mine = whole + (size_t)r * part * es;
        if (tp->group[j] == tp->kv || rows_share(tp, tp->idx[j]))
            ZT_LIB(zo_comm_reduce_scatter(tp->group[j], s, whole, mine, part, tp->dt,
                                          ZO_REDUCE_EXACT));
        ZT_LIB(zo_op_axpy(s, tp->gpart[j], tp->dt, 1.0f, mine, tp->dt, part));
        ZT_LIB(zo_memset_async(s, tp->gfull[tp->slot[j]], 0, tp->numel[j] * es));
    }
    return tp->inner.grads_ready(tp->inner.ctx, layer, s);
}

static zo_status tp_release(void *ctx, int layer, zo_stream_t s)
{
    zt_tp *tp = ctx;
    return tp->inner.release(tp->inner.ctx, layer, s);
}

zt_param_source zt_tp_source(zt_tp *tp)
{
    zt_param_source src = {tp, tp_fetch, tp_release, tp_grads_ready};
    return src;
}
