/* zo-plan's tensor parallelism (zo-train --tensor-parallel T, Megatron-LM's
 * scheme, tools/zo-train/tensor_parallel.h): what a rank of a T-rank tensor
 * group holds and computes, and what the group sends per step.
 *
 * Memory: each rank's engine registers its part of every tensor
 * (zt_tp_numel: sharded tensors and the replicated norms alike 1/T), its
 * arena is the local shape's (zt_tp_local_shape) and beside it zo-train
 * allocates the gathered whole copies and the parallel cross-entropy's
 * stats (zt_tp_device_bytes); plan.c and split.c count all three.
 *
 * Compute: a rank runs 1/T of the model's FLOPs (the Megatron split; the
 * replicated norms and shared key/value heads' projections are not
 * subtracted).
 *
 * Communication, as zo-train's model.c and tensor_parallel.c issue it, for
 * a micro-batch of N = micro-batch x seq tokens of dim d in the job's dtype
 * (e bytes), L blocks:
 *   forward    the embedding's masked lookup: one all-reduce of N d;
 *              each block: o_proj's and down_proj's partial outputs, two
 *   head       the cross-entropy's stats (3 fp32 per row) all-gathered,
 *              and d(hf) all-reduced: one
 *   backward   each block: the recompute's o_proj sum, d(h2) through gate
 *              and up, d(h1) through q, k and v: three
 *   fetches    every fetch of a layer (once per micro-group and phase)
 *              all-gathers its replicated tensors (norms, o_proj's bias)
 *              from their 1/T parts; with fewer key/value heads than T, the
 *              R = T / kv ranks sharing a head gather it (k, v and their
 *              biases) and reduce-scatter its gradient in the backward, per
 *              micro-batch.
 *   verdict    the engine's global norm over the model-parallel group.
 * Sequence parallel (job->sequence_parallel): each all-reduce of N d is a
 * reduce-scatter of it and an all-gather of N d / T a rank: a block's
 * forward 2 and 2, its backward 3 and 5 (the residual gradient and the
 * recomputed norm outputs gathered for each half), the embedding's forward
 * a reduce-scatter and its backward an all-gather, the head an all-gather
 * of hf and a reduce-scatter of d(hf); the norms' gradients are
 * reduce-scattered per micro-batch (tensor_parallel.c).
 * The bytes are those the group's ranks send, summed over the group, as the
 * comm layer's algorithms send them: an exact all-reduce is a chain through
 * the T ranks and a ring back (2 (T - 1) n e), an all-gather of c elements a
 * rank T (T - 1) c e, an exact reduce-scatter a chain and the blocks to
 * their owners ((T - 1) n e + (T - 1) n e / T). Their time over the link
 * is the busiest rank's bytes (2 n e for an all-reduce: each rank's link
 * carries the vector to the next rank and the sum back) over its bytes/s,
 * on the critical path (the model waits for each sum). */
#ifndef ZP_TENSOR_H
#define ZP_TENSOR_H

#include "plan.h"

/* T of the job (1 without tensor parallelism). */
int zp_tp(const zp_job *job);

/* zo-train's default chunk at the job's T: its largest tensor part in 16
 * bits (zt_tp_default_chunk_bytes). */
uint64_t zp_default_chunk_bytes(const zp_job *job);

/* Device bytes zo-train allocates beside the arena at T (0 at T = 1). */
uint64_t zp_tp_device_bytes(const zp_job *job);

/* What one tensor group sends (summed over its ranks) and its busiest
 * rank's seconds, per step. */
typedef struct zp_tp_comm {
    uint64_t act_elems;    /* N d: one activation all-reduce's elements */
    uint64_t block_fwd;    /* one block, one micro-batch: the forward's all-reduce bytes */
    uint64_t block_bwd;    /* and the backward's (the recompute's sum included) */
    uint64_t embed_head;   /* the embedding's and the head's per micro-batch */
    uint64_t fetch_gather; /* per step: the fetches' gathers, the shared heads' gradients */
    /* per step, over the model-parallel group (its S x T ranks; set by the
     * pipeline planner): the engine's verdict, each rank's per-chunk sum of
     * squares and overflow flag (16 bytes a chunk, the most chunks any
     * rank has) all-gathered (engine_pipe.c) */
    uint64_t verdict;
    uint64_t step_bytes; /* everything per step */
    double rank_bytes;   /* the busiest rank's sent bytes per step */
    double seconds;      /* rank_bytes over the link */
} zp_tp_comm;

/* The step's tensor-parallel communication of job (its stage's layers,
 * job->grad_accum micro-batches, fetched once per group of micro_group)
 * over a link of link bytes/s; all zero at T = 1. */
void zp_tp_comm_of(const zp_job *job, int micro_group, double link, zp_tp_comm *out);

/* Add the step's communication (over job->tp_link) to p's forward and backward
 * and its step, and refresh tokens/s and MFU. */
void zp_tp_add_time(const zp_job *job, const zp_speeds *sp, double nvme_tbw, zp_plan *p);

#endif
