/* zo-plan over several ranks: ZeRO stages 1, 2 and 3 (zo-train
 * --zero-stage, engine.h's ZeRO) for each placement the engine runs under
 * ZeRO, planned for rank 0, whose share is the largest (ranks own
 * contiguous runs of chunks, the first ranks one more).
 *
 * A node's ranks share its host memory, pinned pool, NVMe space and
 * bandwidth and its cores (the CPU optimizer): each rank plans against
 * 1/ranks-per-node of them, as zo-train splits them. Every GPU keeps its
 * own PCIe link (h2d, d2h unchanged: a workstation whose GPUs share lanes
 * should say so with --h2d-gbps/--d2h-gbps).
 *
 * The ranks' collectives, over the slowest link between them (link bytes/s,
 * each rank sending and receiving a buffer once per chain, as the exact
 * reductions are pipelined chains in rank order):
 *   gradients  stage 1: an all-reduce of every chunk's fp32 gradient (a
 *              chain reduce and a chain broadcast: 2 x 4 bytes/param);
 *              stages 2 and 3: a reduce onto the owner (4 bytes/param).
 *              They run as each chunk's gradient comes down, under the
 *              backward.
 *   updates    stages 1 and 2: the owners broadcast their new 16-bit
 *              parameters after the update (2 bytes/param): in sync mode
 *              after the optimizer phase, in overlap and dpu modes under
 *              it. Stage 3 broadcasts none (persistent chunks aside).
 *   gathers    stage 3: every fetch of a chunk another rank owns gathers it
 *              from its owner: the step's parameter loads (the eviction
 *              simulation's, over the device slots the gathers keep) times
 *              (N-1)/N, under the forward and backward like the loads.
 * On the cpu device the collectives run on the cores that compute, so
 * they add to the step rather than hide under it. */
#ifndef ZP_WORLD_H
#define ZP_WORLD_H

#include "plan.h"

/* The ranks and their links. */
typedef struct zp_world {
    int world_size;       /* ranks (GPUs), >= 1 */
    int gpus_per_node;    /* ranks sharing a node's host, NVMe and cores (1..world_size) */
    double link;          /* bytes/s of the slowest link between two ranks */
    char link_source[32]; /* "--link-gbps" or "assumed" */
    /* a tensor group's link when its ranks share a node (tensor.h; its
     * consecutive ranks do when T divides --gpus-per-node): --node-link-gbps,
     * else the link above */
    double node_link;
    char node_link_source[32];
    /* --tensor-parallel T (0 or 1: none): each rank holds 1/T of every
     * tensor, ZeRO runs over the world_size / T data-parallel ranks, and the
     * tensor group's collectives run over zp_world_tp_link */
    int tensor_parallel;
} zp_world;

/* The link a tensor group of T consecutive ranks uses: within a node when
 * T divides the ranks per node, else between nodes; *intra: which. */
double zp_world_tp_link(const zp_world *w, int T, int *intra);

/* The link speed assumed when --link-gbps is not given: PCIe 4.0 x16
 * peer-to-peer on a GPU node, shared memory between processes on the cpu
 * device. */
#define ZP_LINK_CUDA_BPS 25e9
#define ZP_LINK_CPU_BPS  10e9

/* The placements planned under ZeRO (world.c). */
enum { ZP_WORLD_STRATEGIES = 5, ZP_WORLD_STAGES = 3 };

/* One stage and placement, for rank 0. */
typedef struct zp_world_plan {
    int stage;    /* 1, 2, 3 */
    zp_plan plan; /* rank 0's memory per tier and its own step's resources (plan.h) */
    uint64_t grad_link_bytes, update_link_bytes, gather_link_bytes; /* per step, each way */
    double link_seconds;                                            /* the three over the link */
    double step_seconds, tokens_per_s, mfu; /* the step with the collectives; every rank's tokens */
    int link_bound; /* the collectives, not the rank's own work, set the step */
} zp_world_plan;

/* The gradient chains' bytes of ZeRO's global reduction order (zo-train's
 * default --reduce-order) over one chain's, at a stage, N ranks and k
 * micro-batches per rank per step. */
double zp_global_order_factor(int stage, int world_size, int grad_accum);

/* The node's budgets and speeds one of its ranks plans against. */
void zp_world_rank_share(const zp_world *w, const zp_hardware *node, const zp_speeds *node_sp,
                         zp_hardware *rank, zp_speeds *rank_sp);

/* Every stage (1..3) x placement (ZP_WORLD_STRATEGIES) of job under w, in
 * that order, into out[ZP_WORLD_STAGES * ZP_WORLD_STRATEGIES]; *best: the
 * fastest that fits (-1: none). job->world_size and zero_stage are set per
 * plan; the rest of job is one rank's (micro-batch, grad-accum). */
zo_status zp_plan_world(const zp_job *job, const zp_hardware *node, const zp_speeds *node_sp,
                        const zp_world *w, double nvme_tbw, zp_world_plan *out, int *best,
                        uint64_t *work);

#endif
