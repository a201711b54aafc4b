/* Tensor parallelism's shapes (zo-train --tensor-parallel T, Megatron-LM's
 * scheme; tools/zo-train/tensor_parallel.h has the compute): which part of
 * each tensor a rank of a T-rank group holds and the shape it computes
 * with, from the model's shape alone, so that zo-plan counts what zo-train
 * allocates without linking the trainer. */
#ifndef ZT_TP_SHAPE_H
#define ZT_TP_SHAPE_H

#include <stddef.h>
#include <stdint.h>

#include "model_shape.h"

/* What T ranks cannot split, refused by name: heads, key/value heads, the
 * FFN, the dimension and the vocabulary must each divide by T. */
zo_status zt_tp_check(const zt_shape *full, int T);
/* The shape one rank computes with (T = 1: full itself): its heads, FFN
 * and vocabulary part. */
zt_shape zt_tp_local_shape(const zt_shape *full, int T);
/* Whether tensor (layer, idx) is replicated (the norms, o_proj's bias). */
int zt_tp_replicated(const zt_shape *full, int layer, int idx);
/* With fewer key/value heads than T, the ranks whose query heads use one
 * key/value head (T / kv heads of them, consecutive) share it: each stores
 * a part, a fetch gathers the head over them, and their gradients (each
 * from its own query heads) are summed over them before each keeps its
 * part. The number of ranks sharing a head (1: none), and whether tensor
 * (layer, idx) is such a head's (k, v and their biases). */
int zt_tp_kv_sharers(const zt_shape *full, int T);
int zt_tp_kv_shared(const zt_shape *full, int T, int layer, int idx);
/* The elements a rank holds of tensor (layer, idx). */
size_t zt_tp_numel(const zt_shape *full, int T, int layer, int idx);
/* The default chunk: a rank's largest part in 16 bits, rounded to 4 KiB
 * (zt_default_chunk_bytes at T = 1). */
uint64_t zt_tp_default_chunk_bytes(const zt_shape *full, int T);
/* Device bytes beside the arena: the whole copies a fetch gathers
 * (parameters and gradients) and the model's parallel cross-entropy stats
 * for head chunks of head_rows (zt_head_chunk_rows of the local shape). */
uint64_t zt_tp_device_bytes(const zt_shape *full, int T, zo_dtype dt, uint64_t head_rows);

/* The parallel cross-entropy's stats beside the arena (zt_model_set_tp):
 * the rank's and the group's, for head chunks of head_rows. */
uint64_t zt_model_tp_bytes(uint64_t head_rows, int T);

/* The tensors a fetch gathers whole, in one layer at most: replicated (two
 * norms, o_proj's bias) in the first ZT_TP_REP_SLOTS slots, shared key/value
 * heads (k, v and their biases) in the others. */
enum { ZT_TP_REP_SLOTS = 3, ZT_TP_KV_SLOTS = 4, ZT_TP_SLOTS = ZT_TP_REP_SLOTS + ZT_TP_KV_SLOTS };
/* Elements of a slot: a replicated tensor is at most dim, a shared key/value
 * head's weight head_dim x dim (0: no heads shared). */
size_t zt_tp_slot_numel(const zt_shape *full, int T, int slot);

#endif
