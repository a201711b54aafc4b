/* zo-train's training loop: the device, the engine (every parameter
 * registered with it, fetched per layer, updated by its optimizer), the model
 * and the data, put together from one set of options.
 *
 * Device memory: the model's activations (zt_model_activation_bytes) and the
 * engine share the device budget; the engine's device_bytes is the budget
 * minus the activations (minus a reserve for cuBLAS and the CUDA context on a
 * GPU). Without --device-mem on the cpu device, the budget is chosen small:
 * the activations plus the engine's minimum working set (one layer's
 * parameter and gradient chunks) plus two more layers of parameter slots for
 * prefetching, so parameters page through pinned host memory. */
#ifndef ZT_TRAINER_H
#define ZT_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include "data.h"
#include "model.h"
#include "schedule.h"
#include "zo/engine.h"
#include "zt_tiers.h"

enum { ZT_MAX_NVME_PATHS = 16 };
#define ZT_HOME_DEFAULT (-1)

typedef struct zt_options {
    zt_shape shape;
    const char *data_path;
    int steps, seq, micro_batch, grad_accum;
    float lr, beta1, beta2, eps, weight_decay, max_grad_norm;
    int adamw;           /* 1: decoupled weight decay (AdamW); 0: L2 added to the gradient */
    int bias_correction; /* 1: Adam's bias correction */
    zt_schedule sched;   /* the learning-rate schedule (none: lr, constant) */
    uint64_t seed;
    float init_std;
    const char *device;                    /* "auto", "cpu" or "cuda" */
    uint64_t device_mem;                   /* the device budget (cpu: its capacity); 0: default */
    int param_home, optim_home;            /* zo_tier, or ZT_HOME_DEFAULT */
    zo_engine_caps param_caps, optim_caps; /* per-chunk homes: bytes a faster tier holds */
    int placement_auto; /* fill the host up to the host limit with what is homed on NVMe */
    const char *nvme_paths[ZT_MAX_NVME_PATHS];
    int n_nvme_paths;
    const char *default_nvme_dir; /* used when a home is nvme and no path is given */
    zo_optim_mode mode;
    zo_dtype dtype;      /* ZO_DTYPE_BF16 or ZO_DTYPE_F16 */
    int flash_attention; /* --attention flash (the default): the fused op (zt_model_config.flash);
                            0: dense, the materialized op */
    zo_attn_layout sparse_layout; /* the config's sparse_attention as the fused op's block
                                     layout (zt_model_config.layout); struct_size 0: none */
    zo_loss_scaler_config
        loss_scaler;           /* fp16 (DeepSpeed's fp16 section; static when loss_scale > 0) */
    uint64_t chunk_bytes;      /* 0: the largest tensor's 16-bit bytes, 4 KiB multiple */
    uint64_t mlp_chunk_bytes;  /* a block's position-wise chunks (zt_model_config's): 0 auto,
                                  ZO_MLP_CHUNK_BYTES or 16 MiB */
    uint64_t pinned_bytes;     /* the pinned host budget (0: what the plan needs) */
    uint64_t host_mem;         /* the host memory limit the plan is checked against (0: the
                                  machine's, zt_host_limit) */
    const char *host_mem_from; /* what set host_mem, for messages (NULL: --host-mem) */
    uint32_t nvme_queue_depth, nvme_block_size; /* NVMe requests (0: the swap store's defaults) */
    int lookahead;                              /* engine prefetch depth */
    int micro_group;          /* layer-major groups of micro-batches (0 or 1: micro-batch-major) */
    int act_home;             /* where a group's layer inputs wait: ZT_ACT_DEVICE or ZT_ACT_HOST */
    int optim_threads;        /* 0: the engine's default */
    double val_fraction;      /* held-out tail of the data */
    int val_batches;          /* validation micro-batches at most */
    int resume_allow_changes; /* a checkpoint of other settings may be continued */
    int moves_tensors;        /* the run loads or saves weights or states (--resume, --init-weights,
                                 --hf-model, --save): the host check counts the tensor buffers */
    const zo_swap_fault *nvme_faults; /* tests: armed when the swap stores open */
    size_t n_nvme_faults;
    /* tests: arms nvme_faults on the engine's stores (zo_engine_set_swap_faults,
     * from the tests' zo/engine_testing.h): zo-train links no test hook of its own. */
    zo_status (*arm_engine_faults)(zo_engine_t e, const zo_swap_fault *faults, size_t n);
    zo_trace_fn trace; /* optional: the engine's spans, and the compute stream's layers */
    void *trace_ctx;
    zo_dtype state_dtype; /* Adam's m and v: ZO_DTYPE_F32 (0, the default), BF16 or I8 */
    int master_split;     /* zo_engine_config.master_split (zoffload.master_split) */
    int update_behind;    /* zo_engine_config.update_behind (zoffload.update_behind) */
    int embedding_f32;    /* int8 states: the token embedding keeps fp32 moments
                             (zoffload.embedding_f32_states; zt_tensor_embedding,
                             zo_engine_keep_f32_states); 0, the default: 8-bit as the rest */
    /* ZeRO across ranks (world_size > 1, zt_ranks_discover): each step the ranks take
     * N = world_size times grad_accum micro-batches of the data, rank r in the global
     * reduce_order (ZO_REDUCE_ORDER_GLOBAL) the micro-batches j*N + r of them, j = 0 ..
     * grad_accum - 1, which the engine reduces in that global order, so the losses and weights
     * equal one rank's with grad_accum * N bitwise; in the rank order the r-th grad_accum of
     * them (bitwise for grad_accum 1 only). Each rank's NVMe files go to DIR/rank-R. */
    int reduce_order;         /* zo_reduce_order: 0 global (default), 1 rank (--reduce-order) */
    int zero_stage;           /* 1, 2 or 3 (engine.h); ignored with one rank */
    uint64_t zero_persist;    /* stage 3: chunks of at most this many elements stay whole on every
                                 rank (zero_persist_elems; DeepSpeed's
                                 stage3_param_persistence_threshold, 0 without a config) */
    int rank, world_size;     /* 0 of 1 unless launched across ranks */
    double comm_timeout_s;    /* --comm-timeout: 0 for ZO_COMM_TIMEOUT or the library's 300 s */
    const char *comm_backend; /* --comm-backend: host (NULL), mpi or tcp */
    /* The ranks on this node share its host memory (--host-mem, or what the machine can
     * spare) and pinned pool (--pinned-mem): each gets 1/local_size (zt_ranks_share), and
     * on the cpu device its optimizer threads the NUMA node of its local_rank-th share of
     * the cores (the engine's default on a GPU: the node nearest it). */
    int local_rank, local_size; /* 0 of 1 with one rank */
    const char *local_from;     /* where local_size came from, for messages */
    int verbose;                /* -v: per-rank resources and the engine's info lines */
    const char *hf_model;       /* --hf-model DIR, or NULL: recorded in checkpoints, so that
                                   --resume without it says so */
    /* Pipeline stages (pipeline.h): world_size = stages x data-parallel ranks; rank
     * r is stage r / D of data-parallel rank r % D (D = world_size / stages), so the
     * ranks of a stage form its data-parallel (ZeRO) group and the ranks of one
     * data-parallel index a pipeline. */
    int pipeline_stages;        /* 0 or 1: none */
    const char *pipeline_split; /* the first engine layer of stages 1..S-1 ("4,9"); NULL:
                                   balanced by parameter count */
    /* Tensor parallelism (tensor_parallel.h): world_size = stages x D x T, rank r
     * tensor rank r % T of data-parallel rank (r / T) % D of stage r / (D T), so a
     * tensor-parallel group is T consecutive ranks (one node, as Megatron places
     * them), a data-parallel (ZeRO) group the ranks of one stage and tensor rank. */
    int tensor_parallel; /* 0 or 1: none */
    /* Sequence parallelism (Megatron's, --sequence-parallel): outside attention
     * and the MLP (the norms, the residual adds) each tensor-parallel rank
     * holds 1/T of the tokens; reduce-scatters and all-gathers replace the
     * all-reduces. Needs tensor_parallel > 1 and seq a multiple of it. */
    int sequence_parallel;
} zt_options;

/* Defaults: tiny preset values are filled by the caller (zt_preset). */
#define ZT_OPTIONS_INIT                                                                            \
    {                                                                                              \
        .steps = 120, .seq = 128, .micro_batch = 8, .grad_accum = 1, .lr = 2e-3f, .beta1 = 0.9f,   \
        .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.0f, .max_grad_norm = 1.0f, .adamw = 1,     \
        .bias_correction = 1, .sched = ZT_SCHEDULE_INIT, .seed = 1, .init_std = 0.02f,             \
        .device = "auto", .param_home = ZT_HOME_DEFAULT, .optim_home = ZT_HOME_DEFAULT,            \
        .mode = ZO_OPTIM_SYNC, .dtype = ZO_DTYPE_BF16, .loss_scaler = ZO_LOSS_SCALER_CONFIG_INIT,  \
        .lookahead = 2, .val_fraction = 0.05, .val_batches = 8, .flash_attention = 1,              \
        .update_behind = 1                                                                         \
    }

/* What the trainer decided and measured before the first step. */
typedef struct zt_setup {
    char backend[16];
    char device_name[256];
    uint64_t device_budget;    /* the device's budget (cpu: its capacity) */
    uint64_t activation_bytes; /* the model's arena */
    uint64_t engine_device_bytes;
    zo_tier param_home, optim_home;
    zo_engine_caps param_caps, optim_caps; /* per-chunk homes, as given or chosen (auto) */
    uint32_t param_homes[ZO_TIER_MAX],
        optim_homes[ZO_TIER_MAX]; /* chunks homed at each tier (by zo_tier) */
    char nvme_dir[512];           /* the first NVMe path, "" when nothing lives on NVMe */
    zo_engine_footprint footprint;
    zt_data_info data;
    uint64_t n_params;
    double init_seconds;
    uint64_t host_share; /* this rank's host limit: its share of the node's (0: not limited) */
    uint64_t host_limit; /* the whole run's host limit (0: none) */
    uint64_t tensor_buffer_bytes; /* of it, zo-train's buffers for loading and saving tensors
                                     (zt_tensor_buffer_bytes) */
    uint64_t data_bytes; /* the data's host bytes: the step's batches (the file is mapped, its
                            order computed: neither grows with the file) */
    int stage, first_layer, last_layer; /* this rank's pipeline stage and its engine layers */
    char pipeline_split[256];           /* every stage's layers ("0-3,4-7"); "" without stages */
    uint64_t pipe_pinned_bytes;         /* host pinned to stage the stage's transfers (0: direct) */
} zt_setup;

typedef struct zt_trainer zt_trainer;

/* The options a user gives (shape, sizes, rate, dtype, placement,
 * schedule) are consistent; zt_trainer_init checks them first. */
zo_status zt_options_check(const zt_options *o);
/* Host bytes zo-train's loading and saving take beside the engine: they
 * grow with the largest tensor and the chunk, not with the layers. */
uint64_t zt_tensor_buffer_bytes(const zt_shape *s, zo_dtype state_dtype, uint64_t chunk_elems);
zo_status zt_trainer_init(zt_trainer **out, const zt_options *o);
void zt_trainer_free(zt_trainer *t);
const zt_setup *zt_trainer_setup(const zt_trainer *t);
zo_engine_t zt_trainer_engine(zt_trainer *t);
/* The model's layer-input store (act_home host or nvme with groups; else NULL). */
zt_act_store *zt_trainer_act_store(zt_trainer *t);
/* ZeRO: the ranks' communicator (NULL with one rank), and the stream its
 * collectives are ordered on. */
zo_comm_t zt_trainer_comm(zt_trainer *t);
zo_stream_t zt_trainer_stream(zt_trainer *t);
/* Tensor parallelism: zt_host_all_gather over the group, staged through
 * the rank's gather buffers where its communicator takes device memory only. */
zo_status zt_trainer_tp_gather(zt_trainer *t, const void *mine, void *all, size_t bytes);

/* One optimizer step over grad_accum micro-batches at the schedule's
 * learning rate: *loss is the mean of their losses (before the update; across
 * ranks, the mean over every rank's micro-batches, in rank order),
 * *stats the engine's statistics. When a
 * step fails (an NVMe error, say) the engine keeps the previous weights and
 * the next call retries the same step on the same batch, so a run with a
 * retried failure equals a run without it. */
zo_status zt_trainer_step(zt_trainer *t, float *loss, zo_step_stats *stats);
/* Mean loss over the validation micro-batches (min(val_batches, what the
 * split holds)); *n_tokens the tokens it covered (0: the split is shorter
 * than one micro-batch, and *loss is NaN). */
zo_status zt_trainer_validate(zt_trainer *t, double *loss, uint64_t *n_tokens);
/* The fp32 master weights of tensor idx of an engine layer (the whole
 * tensor: with --tensor-parallel every rank of the group must call it for
 * the same tensor, which it gathers from their parts). */
zo_status zt_trainer_read_weights(zt_trainer *t, int layer, int idx, float *out);
/* A digest of the fp32 master weights: xxh64 of each tensor's (hashed by the
 * rank that owns it under ZeRO, all-gathered), then xxh64 of those hashes in
 * registration order; the same for any world size when the weights are.
 * Collective across ranks. */
zo_status zt_trainer_weights_digest(zt_trainer *t, uint64_t *out);
/* A test hook, defined only in the tests' own build of zo-train
 * (tests/train/tp_overflow.c, from ZT_TEST_READ_FAIL=R): nonzero when world
 * rank `rank` is to fail reading its master weights for the digest and
 * zt_trainer_read_weights. zo-train defines none (a weak reference, NULL). */
int zt_test_read_fails(int rank) __attribute__((weak));
/* A test hook, defined only in zo-train-test (ZT_TEST_TP_DEVICE_COMM=1): the
 * tensor group's device collectives go over a second communicator that takes
 * device allocations only, as NCCL does on a GPU. */
int zt_test_tp_device_comm(void) __attribute__((weak));

/* Where training stands between steps, beside the engine's state: what a
 * checkpoint must hold to continue bitwise. */
typedef struct zt_train_state {
    int64_t step;     /* optimizer steps done */
    int64_t sched_it; /* the schedule's last_batch_iteration */
    double lr;        /* the rate of the next step */
    zt_data_position data;
    /* Where the run's global batch began (0, 0: at the start; a resumed run
     * with another batch, at its checkpoint): the windows read by step s are
     * origin_windows + (s - origin_step) x the global batch's windows, which
     * a resumed run checks the data position against. */
    int64_t origin_step;
    uint64_t origin_windows;
} zt_train_state;

void zt_trainer_get_state(const zt_trainer *t, zt_train_state *out);
zo_status zt_trainer_set_state(zt_trainer *t, const zt_train_state *in);
/* The engine id of tensor idx of engine layer `layer` (its stage's engine:
 * valid on the ranks that hold the layer). */
int zt_trainer_tensor_id(const zt_trainer *t, int layer, int idx);
/* The world rank that holds the tensor's states (its stage's, and its
 * chunk's owner in the stage's data-parallel group): the rank that reads,
 * writes and hashes it; 0 with one rank. */
int zt_trainer_tensor_owner(const zt_trainer *t, int layer, int idx);
/* With --tensor-parallel: the whole tensor's master weights w (one rank's
 * values) written as this rank's part, where this rank holds its states. */
zo_status zt_trainer_write_tp_master(zt_trainer *t, int layer, int idx, const float *w);
/* Tensor parallelism: T (1 without), this rank's place in its group (0
 * without), and the group's communicator (NULL without). A group's ranks
 * are consecutive world ranks, so world rank / T numbers the groups the way
 * world ranks number the ranks of a run at T = 1. */
int zt_options_tp_size(const zt_options *o);
int zt_options_tp_rank(const zt_options *o);
zo_comm_t zt_trainer_tp_comm(zt_trainer *t);
/* The data-parallel ranks: world_size / pipeline stages (1 with one rank):
 * the global batch is theirs times grad_accum micro-batches. */
int zt_options_dp_size(const zt_options *o);
const zt_options *zt_trainer_options(const zt_trainer *t);

/* The learning rate of the last step run (or of the next, before any). */
double zt_trainer_lr(const zt_trainer *t);

/* The device's allocation high-water mark (activations and engine). */
uint64_t zt_trainer_device_high_water(zt_trainer *t);

/* mkdir -p */
zo_status zt_make_dir(const char *dir);

#endif
