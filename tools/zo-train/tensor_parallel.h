/* zo-train's tensor parallelism (--tensor-parallel T, Megatron-LM's scheme):
 * which slice of each tensor a tensor-parallel rank holds, and a parameter
 * source that hands the model a rank's view of a layer.
 *
 * Column-parallel: q, k, v (and their biases) by heads, gate and up by the
 * FFN's rows: rank r holds rows [r n/T, (r+1) n/T) of each. Row-parallel:
 * o_proj and down_proj by their input columns, the same ranges; the model
 * all-reduces their partial outputs over the group in the forward and the
 * column-parallel layers' input gradients in the backward (model.c). A rank
 * then computes a block with the local shape: n_heads/T query heads,
 * n_kv_heads/T key/value heads (one, shared, when there are fewer than T),
 * ffn_dim/T.
 *
 * The embedding and the head are split over the vocabulary (Megatron's
 * VocabParallelEmbedding and parallel cross-entropy): rank r holds ids
 * [r V/T, (r+1) V/T) of each, rows of the matrices; the lookup is masked and
 * all-reduced, the logits stay the rank's V/T columns and the loss combines
 * the ranks' maxima, sums of exps and target logits (model.c), so no rank
 * holds the whole table or makes a row's full-vocabulary logits.
 *
 * Replicated tensors (the norms, o_proj's bias) are computed
 * whole on every rank, but each rank's engine holds a contiguous 1/T of
 * their elements: a fetch all-gathers them, and the gradient the model
 * computes whole (the same on every rank, from all-reduced inputs) gives
 * the engine only the rank's part. So every tier holds 1/T of every tensor,
 * Adam updates each element once across the group, and the engine's global
 * norm over the model-parallel group (zo_engine_config.pipe_comm) sums each
 * element's gradient once, as one rank does. */
#ifndef ZT_TENSOR_PARALLEL_H
#define ZT_TENSOR_PARALLEL_H

#include <stddef.h>

#include "model.h"
#include "tp_shape.h"
#include "zo/comm.h"

/* Rank r's part of the full tensor's values src into dst (zt_tp_numel). */
void zt_tp_slice(const zt_shape *full, int T, int r, int layer, int idx, const float *src,
                 float *dst);
/* zt_tp_slice's inverse: the whole tensor from the T ranks' parts (rank
 * order, zt_tp_numel each, one after another). */
void zt_tp_merge(const zt_shape *full, int T, int layer, int idx, const float *parts, float *dst);
/* The elements of a part that lie one after another in the whole tensor:
 * a row's columns of a row-parallel weight, else the whole part. Formats
 * stored in blocks (int8 moments) slice and merge block by block when it
 * is a whole number of blocks. */
size_t zt_tp_run(const zt_shape *full, int T, int layer, int idx);
/* zt_tp_slice and zt_tp_merge for a tensor stored as items of es bytes,
 * each standing for unit elements (moments as the engine stores them: bf16
 * or int8 codes, int8's per-block scales with unit the block; unit must
 * divide zt_tp_run). merge takes part r at parts + r stride. */
void zt_tp_slice_items(const zt_shape *full, int T, int r, int layer, int idx, const void *whole,
                       void *part, size_t es, size_t unit);
void zt_tp_merge_items(const zt_shape *full, int T, int layer, int idx, const void *parts,
                       size_t stride, void *whole, size_t es, size_t unit);

/* A blocking all-gather of host memory over comm: all holds the group's
 * `bytes` from each rank in rank order. Where comm takes host memory
 * (zo_comm_takes_host_memory: mpi, tcp, self) it gathers mine directly;
 * where it takes device memory only (nccl) each rank copies its block in
 * pieces through the device buffer stage (stage_bytes; the group's T pieces
 * and the rank's own), the group gathers each piece, and the pieces go back
 * to all, so a tensor of any size needs no more device memory than stage.
 * Every rank of the group must call it with the same bytes and stage_bytes.
 * stage NULL: a device buffer of its own for the call (small exchanges:
 * outcomes, losses, owners, hashes). */
zo_status zt_host_all_gather(zo_comm_t comm, zo_stream_t s, void *stage, size_t stage_bytes,
                             const void *mine, void *all, size_t bytes);
/* A test hook, defined only in the tests' own build of zo-train
 * (tests/train/tp_overflow.c, from ZT_TEST_STAGE_BYTES=N): N > 0 forces
 * zt_host_all_gather's staged path on the cpu device with pieces of at most
 * N bytes per rank. zo-train defines none (a weak reference, NULL). */
size_t zt_test_stage_bytes(void) __attribute__((weak));

typedef struct zt_tp zt_tp;

/* A test hook, defined only in the tests' own build of zo-train
 * (tests/train/tp_overflow.c, from ZT_TEST_TP_INF=R:N): nonzero when world
 * rank `rank` puts an Inf into its part of layer 1's q_proj gradient at
 * its n-th backward fetch of layer 1 (from 1), so one rank's part
 * overflows alone and the fp16 verdict must still be the group's. zo-train
 * defines none (a weak reference, NULL). */
int zt_tp_test_overflow(int rank, int n) __attribute__((weak));

/* The rank's view over inner (the engine: the rank's parts) for the
 * tensor-parallel group comm; the gathers run on the compute stream.
 * seq_par (sequence parallelism): each rank computes the norms' gradients
 * from its own rows of the sequence only, so they are summed over the group
 * (a reduce-scatter, each rank keeping its part) before the engine takes
 * them. */
zo_status zt_tp_init(zt_tp **out, zo_device_t dev, zo_comm_t comm, const zt_shape *full,
                     zo_dtype dt, int seq_par, const zt_param_source *inner);
void zt_tp_free(zt_tp *tp);
zt_param_source zt_tp_source(zt_tp *tp);
/* The rank's tensor-parallel gather buffers (device memory, idle between
 * steps): zt_host_all_gather's staging buffer. */
void *zt_tp_stage(zt_tp *tp, size_t *bytes);

#endif
