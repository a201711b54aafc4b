/* zo-train's tensor parallelism: the slices of each tensor a rank holds and
 * the parameter source that gathers the replicated ones (tensor_parallel.h). */
#include "tensor_parallel.h"

#include <stdlib.h>
#include <string.h>

#include "zt_error.h"

static int is_block(const zt_shape *s, int layer)
{
    return layer > 0 && layer <= s->n_layers;
}

static zo_status refuse(const char *what, int n, int T)
{
    return zt_fail(ZO_ERR_INVALID_ARG,
                   "--tensor-parallel %d splits the %s over the ranks, but %d is not a multiple of "
                   "%d: choose a --tensor-parallel that divides it",
                   T, what, n, T);
}

zo_status zt_tp_check(const zt_shape *full, int T)
{
    if (T <= 1)
        return ZO_OK;
    if (full->n_heads % T)
        return refuse("query heads (--heads)", full->n_heads, T);
    if (zt_kv_heads(full) % T)
        return zt_fail(ZO_ERR_UNSUPPORTED,
                       "--tensor-parallel %d with %d key/value heads: each rank takes whole "
                       "key/value heads, so their count must be a multiple of %d (replicating "
                       "them on ranks when there are fewer than %d is not done yet)",
                       T, zt_kv_heads(full), T, T);
    if (full->ffn_dim % T)
        return refuse("FFN (--ffn)", full->ffn_dim, T);
    if (full->dim % T)
        return refuse("model dimension (--dim)", full->dim, T);
    if (full->vocab % T)
        return refuse("vocabulary (--vocab; pad it as Megatron does)", full->vocab, T);
    return ZO_OK;
}

zt_shape zt_tp_local_shape(const zt_shape *full, int T)
{
    zt_shape s = *full;
    if (T <= 1)
        return s;
    s.head_dim = zt_head_dim(full);
    s.n_kv_heads = zt_kv_heads(full) / T;
    s.n_heads = full->n_heads / T;
    s.ffn_dim = full->ffn_dim / T;
    s.vocab = full->vocab / T;
    return s;
}

/* The embedding's and the head's matrices, split over the vocabulary. */
static int vocab_split(const zt_shape *full, int layer, int idx)
{
    if (layer == 0)
        return idx == ZT_EMBEDDING;
    return layer == full->n_layers + 1 && idx == ZT_HEAD_OUT;
}

int zt_tp_replicated(const zt_shape *full, int layer, int idx)
{
    if (!is_block(full, layer))
        return !vocab_split(full, layer, idx);
    return idx == ZT_ATTN_NORM || idx == ZT_MLP_NORM || idx == ZT_BO;
}

size_t zt_tp_numel(const zt_shape *full, int T, int layer, int idx)
{
    if (T <= 1)
        return zt_tensor_numel(full, layer, idx);
    if (zt_tp_replicated(full, layer, idx))
        return zt_tensor_numel(full, layer, idx) / (size_t)T;
    zt_shape local = zt_tp_local_shape(full, T);
    return zt_tensor_numel(&local, layer, idx);
}

uint64_t zt_tp_default_chunk_bytes(const zt_shape *full, int T)
{
    uint64_t mx = 0;
    for (int l = 0; l < zt_engine_layers(full); l++)
        for (int i = 0; i < zt_layer_tensors(full, l); i++) {
            uint64_t n = zt_tp_numel(full, T, l, i);
            mx = n > mx ? n : mx;
        }
    return (mx * 2 + 4095) / 4096 * 4096; /* 16-bit, as zt_default_chunk_bytes */
}

/* Row-parallel (o_proj, down_proj): [rows, cols] stored row-major, rank r
 * takes columns [r cols/T, (r+1) cols/T) of every row. */
static void slice_columns(const float *src, float *dst, size_t rows, size_t cols, int T, int r)
{
    size_t w = cols / (size_t)T;
    for (size_t i = 0; i < rows; i++)
        memcpy(dst + i * w, src + i * cols + (size_t)r * w, w * sizeof *dst);
}

void zt_tp_slice(const zt_shape *full, int T, int r, int layer, int idx, const float *src,
                 float *dst)
{
    size_t n = zt_tp_numel(full, T, layer, idx), d = (size_t)full->dim;
    if (T > 1 && is_block(full, layer) && idx == ZT_WO)
        slice_columns(src, dst, d, (size_t)zt_q_dim(full), T, r);
    else if (T > 1 && is_block(full, layer) && idx == ZT_WDOWN)
        slice_columns(src, dst, d, (size_t)full->ffn_dim, T, r);
    else /* column-parallel rows, the vocabulary's rows and replicated parts: contiguous */
        memcpy(dst, src + (size_t)r * n, n * sizeof *dst);
}

/* ---- the rank's view of a layer ---- */

enum { TP_SLOTS = 3 }; /* replicated tensors in one layer at most (two norms, o_proj's bias) */

uint64_t zt_tp_device_bytes(const zt_shape *full, int T, zo_dtype dt, uint64_t head_rows)
{
    if (T <= 1)
        return 0;
    /* the gathered norms and biases with their gradients, and the parallel
     * cross-entropy's stats: the rank's and the group's (zt_model_set_tp) */
    return 2 * TP_SLOTS * (uint64_t)full->dim * zo_dtype_size(dt) + zt_model_tp_bytes(head_rows, T);
}

struct zt_tp {
    zo_device_t dev;
    zo_comm_t comm;
    int T, r;
    zt_shape full;
    zo_dtype dt;
    zt_param_source inner;
    void *base;                              /* the slots' device memory */
    void *pfull[TP_SLOTS], *gfull[TP_SLOTS]; /* dim elements each */
    /* the fetched layer's replicated tensors: their index, elements and the engine's part */
    int n_rep, idx[TP_SLOTS], slot[TP_SLOTS];
    size_t numel[TP_SLOTS];
    void *gpart[TP_SLOTS];
};

zo_status zt_tp_init(zt_tp **out, zo_device_t dev, zo_comm_t comm, const zt_shape *full,
                     zo_dtype dt, const zt_param_source *inner)
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
                  .inner = *inner};
    size_t bytes = (size_t)full->dim * zo_dtype_size(dt);
    zo_status st = zo_device_malloc(dev, 2 * TP_SLOTS * bytes, &tp->base);
    if (st < 0) {
        free(tp);
        return zt_lib_fail(st, "the tensor-parallel gather buffers");
    }
    char *b = tp->base;
    for (int k = 0; k < TP_SLOTS; k++) {
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
    free(tp);
}

/* The whole tensor from every rank's part into its slot, and (backward) a
 * zeroed whole gradient in its place; the engine's part is kept for
 * grads_ready. */
static zo_status gather_one(zt_tp *tp, int layer, int k, zo_stream_t s, void **p, void **g)
{
    size_t n = zt_tensor_numel(&tp->full, layer, k), es = zo_dtype_size(tp->dt);
    int j = tp->n_rep++, slot = j; /* a slot each: a block's norms and o_proj's bias */
    if (j >= TP_SLOTS)
        return zt_fail(ZO_ERR_INTERNAL, "layer %d has more than %d replicated tensors", layer,
                       TP_SLOTS);
    ZT_LIB(zo_comm_all_gather(tp->comm, s, p[k], tp->pfull[slot], n / (size_t)tp->T, tp->dt));
    p[k] = tp->pfull[slot];
    tp->idx[j] = k;
    tp->slot[j] = slot;
    tp->numel[j] = n;
    tp->gpart[j] = g ? g[k] : NULL;
    if (g && g[k]) {
        ZT_LIB(zo_memset_async(s, tp->gfull[slot], 0, n * es));
        g[k] = tp->gfull[slot];
    }
    return ZO_OK;
}

static zo_status tp_fetch(void *ctx, int layer, zo_phase phase, zo_stream_t s, void **p, void **g,
                          int n)
{
    zt_tp *tp = ctx;
    ZT_TRY(tp->inner.fetch(tp->inner.ctx, layer, phase, s, p, g, n));
    tp->n_rep = 0;
    for (int k = 0; k < zt_layer_tensors(&tp->full, layer) && k < n; k++)
        if (zt_tp_replicated(&tp->full, layer, k))
            ZT_TRY(gather_one(tp, layer, k, s, p, g));
    return ZO_OK;
}

/* The rank's part of each whole gradient added to the engine's, then the
 * engine takes the layer's. */
static zo_status tp_grads_ready(void *ctx, int layer, zo_stream_t s)
{
    zt_tp *tp = ctx;
    size_t es = zo_dtype_size(tp->dt);
    for (int j = 0; j < tp->n_rep; j++) {
        if (!tp->gpart[j])
            continue;
        size_t part = tp->numel[j] / (size_t)tp->T;
        const char *whole = tp->gfull[tp->slot[j]];
        ZT_LIB(zo_op_axpy(s, tp->gpart[j], tp->dt, 1.0f, whole + (size_t)tp->r * part * es, tp->dt,
                          part));
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
