/* Tensor parallelism's shapes (tp_shape.h): what each rank of a
 * tensor-parallel group holds, from the model's shape alone. */
#include "tp_shape.h"

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
    const int KV = zt_kv_heads(full);
    if (KV >= T && KV % T)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--tensor-parallel %d with %d key/value heads: each rank takes whole "
                       "key/value heads, so their count must be a multiple of %d, or divide it "
                       "(then ranks share a head)",
                       T, KV, T);
    if (KV < T && T % KV)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--tensor-parallel %d with %d key/value heads: with fewer heads than ranks "
                       "each head is shared by %d / %d ranks, so %d must divide %d",
                       T, KV, T, KV, KV, T);
    if (KV < T && zt_head_dim(full) % (T / KV))
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--tensor-parallel %d with %d key/value heads: the %d ranks sharing a head "
                       "each store a part of its %d-element bias, which does not divide",
                       T, KV, T / KV, zt_head_dim(full));
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
    s.n_kv_heads = zt_kv_heads(full) >= T ? zt_kv_heads(full) / T : 1; /* shared */
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

int zt_tp_kv_sharers(const zt_shape *full, int T)
{
    const int KV = zt_kv_heads(full);
    return T > KV ? T / KV : 1;
}

int zt_tp_kv_shared(const zt_shape *full, int T, int layer, int idx)
{
    return is_block(full, layer) && zt_tp_kv_sharers(full, T) > 1 &&
           (idx == ZT_WK || idx == ZT_WV || idx == ZT_BK || idx == ZT_BV);
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
    /* a shared key/value head: a part of it on each rank that shares it */
    return zt_tensor_numel(&local, layer, idx) /
           (size_t)(zt_tp_kv_shared(full, T, layer, idx) ? zt_tp_kv_sharers(full, T) : 1);
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

size_t zt_tp_slot_numel(const zt_shape *full, int T, int slot)
{
    if (slot < ZT_TP_REP_SLOTS)
        return (size_t)full->dim;
    return zt_tp_kv_sharers(full, T) > 1 ? (size_t)zt_head_dim(full) * full->dim : 0;
}

uint64_t zt_tp_device_bytes(const zt_shape *full, int T, zo_dtype dt, uint64_t head_rows)
{
    if (T <= 1)
        return 0;
    /* the gathered tensors with their gradients, and the parallel
     * cross-entropy's stats: the rank's and the group's (zt_model_set_tp) */
    uint64_t n = 0;
    for (int k = 0; k < ZT_TP_SLOTS; k++)
        n += zt_tp_slot_numel(full, T, k);
    return 2 * n * zo_dtype_size(dt) + zt_model_tp_bytes(head_rows, T);
}

uint64_t zt_model_tp_bytes(uint64_t head_rows, int T)
{
    return T > 1 ? (uint64_t)(T + 1) * head_rows * ZO_XENT_STATS * sizeof(float) : 0;
}
