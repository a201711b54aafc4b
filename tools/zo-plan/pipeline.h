/* zo-plan over a pipeline (zo-train --pipeline-stages S): the model's
 * engine layers split into S contiguous stages, each stage planned like one
 * GPU with its own layers (zp_plan_split over the stage's layer range,
 * plan.h's zp_job.stage_first/stage_end: per-chunk homes, the engine's
 * footprint of the stage's tensors; zo-train's activation arena, the whole
 * model's with the stage's sets of layer inputs), under a 1F1B schedule of M =
 * grad-accum micro-batches per step.
 *
 * The split: zo-train's --pipeline-split L1,...,L(S-1) names the first
 * engine layer of stages 1..S-1, engine layers numbered as zo-train numbers
 * them (model_shape.h: 0 the embedding, 1..L the blocks, L+1 the head; a
 * tied model has no layer L+1 and its last stage computes the head with a
 * device copy of layer 0 beside its engine, counted in its device bytes).
 * Stage s holds [L(s), L(s+1)) with L0 = 0 and LS = the engine
 * layers: every layer once, contiguous, no stage empty.
 *
 * The balance: each layer's forward, recompute and backward FLOPs per token
 * (zp_layer_flops_per_token) over the model's rate is its time; the split
 * minimises the slowest stage's time, then its parameter bytes.
 *
 * The step, with every rank of the node sharing its host, NVMe and cores
 * (world.h's zp_world_rank_share):
 *   per micro-batch, stage s  its plan's forward and backward / M, and the
 *              activations it sends (forward) and gradients it sends back
 *              (backward), micro-batch x seq x dim x 2 bytes each per
 *              boundary, over the link: beside the compute on a GPU, added
 *              to it on the cpu device
 *   step       (M + S - 1) x the slowest stage's micro-batch time, plus the
 *              longest tail any stage's one-GPU plan has after its forward
 *              and backward (the optimizer phase, NVMe, the upload)
 *   bubble     (S - 1) / (M + S - 1) of the pipeline's forward and backward
 *   data       with --world-size N > S: N / S data-parallel ranks per stage,
 *              ZeRO stage 1 inside each stage's group (the gradients'
 *              all-reduce under the pipeline's forward and backward, the
 *              owners' new parameters broadcast after the update, as
 *              world.h counts them). */
#ifndef ZP_PIPELINE_H
#define ZP_PIPELINE_H

#include "plan.h"
#include "tensor.h"
#include "world.h"

enum { ZP_PIPE_MAX_STAGES = 256 };

/* The contiguous split of n layers of cost[] (and mem[] for ties) into S
 * stages that minimises the slowest stage's cost, then its mem:
 * first[0..S], first[0] = 0, first[S] = n. ZO_ERR_INVALID_ARG when S > n
 * (the message names both) or S < 1. */
zo_status zp_pipe_balance(const double *cost, const uint64_t *mem, int n, int S, int *first);

/* Check a given split (S - 1 first layers of stages 1..S-1) for n layers:
 * increasing, within 1..n-1; fills first[0..S]. */
zo_status zp_pipe_check_split(const int *given, int S, int n, int *first);

/* One stage. */
typedef struct zp_stage_plan {
    int first, end; /* engine layers [first, end) */
    int in_flight;  /* sets of layer inputs it holds: zo-train's min(min(S-s-1, M) + 2, M) */
    uint64_t tied_copy_bytes; /* a tied model's last stage: its device copy of layer 0 */
    uint64_t staging_bytes;   /* cuda: zo-train's pinned buffers staging the mpi transfers */
    zp_plan plan;             /* its rank's memory and its own step (plan.h) */
    uint64_t send_bytes;      /* p2p it sends per micro-batch: activations on, gradients back */
    double mb_seconds;        /* one micro-batch's forward and backward with its sends */
    double tail_seconds;      /* its plan's step after the forward and backward */
    double dp_link_seconds;   /* ZeRO 1 in its data-parallel group: the collectives */
} zp_stage_plan;

typedef struct zp_pipeline_plan {
    int stages, data_parallel, world_size, micro_batches;
    int ranks_per_node;                /* sharing a node's host, NVMe and cores */
    int first[ZP_PIPE_MAX_STAGES + 1]; /* stage s: [first[s], first[s+1]) */
    zp_stage_plan *stage;              /* stages entries (zp_pipeline_free) */
    int fits;                          /* every stage fits */
    uint64_t short_bytes;              /* what the stages need beyond their budgets, summed */
    char why[600];                     /* the first stage that does not, and why */
    int slowest;                       /* the stage whose micro-batch sets the pace */
    uint64_t chunk_bytes;              /* every stage's (one zo-train flag) */
    zo_optim_mode mode;                /* every stage's */
    uint64_t act_bytes;                /* micro-batch x seq x dim x 2: one boundary, one way */
    uint64_t p2p_boundary_bytes;       /* per step, per boundary, each way: M x act_bytes */
    uint64_t p2p_step_bytes;           /* per step over all boundaries, both ways, one pipeline */
    double p2p_mb_seconds;             /* one act_bytes over the link */
    double mb_seconds, fb_seconds, tail_seconds, step_seconds;
    double bubble;            /* (S - 1) / (M + S - 1) */
    double tokens_per_s, mfu; /* every rank's tokens; the whole model's FLOPs */
    int tensor_parallel;      /* T (job->tensor_parallel; 1: none): N = S x D x T */
    int sequence_parallel;    /* with T > 1: the job's sequence parallelism */
    int tp_intra_node;        /* the tensor groups' ranks share a node */
    double tp_link;           /* their link, bytes/s */
    zp_tp_comm tp;            /* the slowest stage's tensor group's communication per step */
    uint64_t tp_total_bytes;  /* every tensor group's, summed: D x the stages' */
} zp_pipeline_plan;

/* Plan S stages of job (grad-accum = M micro-batches per step) on
 * w->world_size ranks (a multiple of S), each rank sharing its node as
 * world.h says; split: S - 1 first layers (NULL: balanced). The stages are
 * planned with one chunk size and one optimizer mode (zo-train takes one of
 * each): the fastest pair that fits. out->stage is allocated. */
zo_status zp_plan_pipeline(const zp_job *job, const zp_hardware *node, const zp_speeds *node_sp,
                           const zp_world *w, int S, const int *split, double nvme_tbw,
                           zp_pipeline_plan *out, uint64_t *work);
void zp_pipeline_free(zp_pipeline_plan *p);

/* The engine layers of job's model and each one's time weight and
 * parameter bytes (cost[], mem[]: zt_engine_layers entries). */
void zp_pipe_layer_costs(const zp_job *job, double *cost, uint64_t *mem);

#endif
