/* zo-plan's planner: for one training job and one machine, what each
 * placement strategy needs in every memory tier and how fast a step would
 * run.
 *
 * Memory comes from the same accounting the trainer runs on: the engine's
 * (zo_engine_footprint_for over the model's tensor sizes, the code that
 * zo_engine_plan and zo_engine_finalize use) and zo-train's activation arena
 * (zt_model_activation_parts). Nothing is allocated in proportion to the
 * model: the planner's work grows with the number of tensors and chunks.
 *
 * Time is a model of one optimizer step from the bytes each link moves and
 * the speeds of the machine (measured, given or read from zo-bench):
 *   compute  FLOPs of forward, the blocks' recompute and backward / the rate
 *            the model's layers reach on the device
 *   h2d      parameter loads (a simulation of the engine's farthest-next-use
 *            eviction over the step's fetch order) / host->device bandwidth
 *   d2h      16-bit gradients of every micro-batch / device->host bandwidth
 *   nvme     optimizer states read and written (and 16-bit parameters when
 *            they live there) / NVMe read and write bandwidth; the update's
 *            reads and writes overlap, together no faster than the faster
 *            direction alone
 *   optim    parameters / CPU Adam parameters per second
 * On a GPU the links, the NVMe queue and the CPU run beside the compute
 * stream: in sync mode the step is the slowest of compute and the links
 * during forward and backward, plus the optimizer phase (the slower of the
 * CPU Adam and its NVMe traffic) and, for device-resident parameters, the
 * upload of the new ones; in overlap and dpu modes the optimizer phase hides
 * under the backward. On the cpu device the "GPU" is the same cores that run
 * the copies and the optimizer, so nothing overlaps but the NVMe queue. */
#ifndef ZP_PLAN_H
#define ZP_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "model_shape.h"
#include "zo/engine.h"

typedef enum zp_strategy {
    ZP_NO_OFFLOAD = 0, /* everything on the device */
    ZP_OPTIM_HOST,     /* optimizer states in host memory, 16-bit parameters on the device */
    ZP_OPTIM_NVME,     /* optimizer states on NVMe, 16-bit parameters on the device */
    ZP_PARAMS_HOST,    /* parameters (pinned) and optimizer states in host memory */
    ZP_PARAMS_NVME,    /* parameters and optimizer states on NVMe */
    ZP_N_STRATEGIES,   /* the fixed homes above; then the plan zp_plan_split chooses: */
    ZP_SPLIT = ZP_N_STRATEGIES /* per-chunk homes, a micro-group, where layer inputs go */
} zp_strategy;

const char *zp_strategy_name(zp_strategy s); /* "no-offload", "optimizer-host", ..., "per-chunk" */
void zp_strategy_homes(zp_strategy s, zo_tier *param_home, zo_tier *optim_home);

/* Where the per-chunk plan keeps the layer inputs the backward recomputes
 * from (every block's input and the head's, for each micro-batch of a group). */
typedef enum zp_act_home { ZP_ACT_AUTO = 0, ZP_ACT_DEVICE, ZP_ACT_HOST, ZP_ACT_NVME } zp_act_home;
const char *zp_act_home_name(zp_act_home a); /* "auto", "device", "host", "nvme" */
const char *zp_act_where(zp_act_home a);     /* "device", "pinned host", "NVMe" (for prose) */

/* The training job. */
typedef struct zp_job {
    zt_shape shape;
    int seq, micro_batch, grad_accum;
    zo_dtype dtype;      /* parameters and activations: bf16, fp16 or fp32 */
    int flash_attention; /* --attention flash: attention memory O(seq), not seq x seq */
    /* DeepSpeed's sparse_attention (zo-plan --set sparse_attention.KEY=V) as
     * the fused op's block layout: its density scales the attention's FLOPs
     * (zt_block_layout_share), its mask is in the arena; struct_size 0: none */
    zo_attn_layout layout;
    zo_optim_mode mode;
    uint64_t chunk_bytes; /* 0: the planner picks per strategy */
    /* zo-train's --mlp-chunk-bytes: the bytes of each ffn-wide buffer of a
     * block's position-wise chunks (zt_model_config's; 0: zo-train's default) */
    uint64_t mlp_chunk_bytes;
    /* the per-chunk plan's choices (zp_plan_split); 0: it chooses */
    int micro_group; /* micro-batches per layer-major group, 1..grad_accum */
    zp_act_home act_home;
    int mode_auto;        /* 1: it chooses sync or overlap (both exact) instead of job->mode */
    zo_dtype state_dtype; /* Adam's m and v: ZO_DTYPE_F32 (0), BF16 or I8 (zo_engine_config's) */
    int master_split;     /* zo_engine_config.master_split: the fp32 master split on NVMe */
    int embedding_f32;    /* int8 states: the token embedding keeps fp32 moments (zo-train's
                             --embedding-f32-states; its chunk takes 4x its elements) */
    int no_update_behind; /* zo-train's --update-behind off: the update stays in end_step */
    /* ZeRO (world.h): 0 or 1 = one rank; > 1 plans rank 0 of world_size at
     * zero_stage (1..3), whose share of the chunks is the largest */
    int world_size, zero_stage;
    /* A pipeline stage (pipeline.h): the engine layers [stage_first,
     * stage_end) of the model, numbered as zo-train numbers them (0 the
     * embedding, 1..L the blocks, L+1 the head); stage_end 0: the whole
     * model. act_sets: the sets of layer inputs the stage's arena holds
     * (zo-train's zt_pipe_sets: its micro-batches in flight and one more;
     * 0 or 1: one). */
    int stage_first, stage_end, act_sets;
    /* Tensor parallelism (tensor.h): T ranks share each layer (0 or 1:
     * none); the plan is one rank's, its tensors' parts and local shape */
    int tensor_parallel;
    int sequence_parallel; /* with T > 1: zo-train's --sequence-parallel (tensor.h) */
    double tp_link;        /* bytes/s of the tensor group's link (0: its time not counted) */
} zp_job;

/* The machine: budgets of every tier. */
typedef struct zp_hardware {
    char backend[16]; /* "cuda" or "cpu" */
    char device_name[256];
    uint64_t device_bytes;  /* the device budget (cpu device: its capacity) */
    uint64_t reserve_bytes; /* device memory the budget does not see (CUDA context, cuBLAS) */
    uint64_t host_bytes;    /* host memory for pinned and pageable tiers together */
    uint64_t pinned_max;    /* a separate cap on pinned memory (0: none) */
    uint64_t nvme_bytes;    /* free space over the NVMe paths (0: no NVMe) */
    int n_nvme_paths;       /* files a swap store stripes over (>= 1 when nvme_bytes > 0) */
} zp_hardware;

/* The machine's speeds (bytes/s, parameters/s, FLOP/s); all > 0. */
typedef struct zp_speeds {
    double h2d, d2h, nvme_read, nvme_write;
    double adam_params; /* CPU Adam parameters per second (fp32 states, 16-bit gradients) */
    double flops;       /* the device's dense 16-bit matmul FLOP/s: MFU's denominator */
    double model_flops; /* what the model's layers reach, every op included (0: flops) */
    /* bytes/s read and written together by the optimizer's NVMe pipeline
     * (states read ahead, updated states written behind) at the job's
     * extent size; 0: derived from nvme_read and nvme_write */
    double nvme_update;
    /* CPU Adam parameters per second with bf16 and 8-bit moments (--measure
     * times their kernels; 0: adam_params times ZP_ADAM_BF16_RATIO or
     * ZP_ADAM_I8_RATIO, zp_adam_rate) */
    double adam_params_bf16, adam_params_i8;
} zp_speeds;

/* The compact kernels' rates against fp32's where they are not measured:
 * zo-bench adam --params 32M --threads 2 --states fp32|bf16|int8 in the
 * same rounds on an AVX-512 (Zen 5) machine whose memory gives the two
 * threads ~60 GB/s, where fp32 is memory-bound: bf16 1.34-1.42x, int8
 * 1.50-1.64x (20 and 16 bytes per parameter against 28; int8's encoder
 * keeps it from the full 1.75x on two cores). */
#define ZP_ADAM_BF16_RATIO 1.3
#define ZP_ADAM_I8_RATIO   1.5
/* CPU Adam parameters per second for a state format. */
double zp_adam_rate(const zp_speeds *sp, zo_dtype state_dtype);
/* Bytes of one parameter in the engine's slots: job->dtype's (2, or 4 for fp32). */
uint64_t zp_param_bytes(const zp_job *job);
/* Bytes of one chunk's optimizer states (fp32 master, m and v in
 * state_dtype) in host or device memory, as the engine lays them out
 * (the Z of zo_engine_footprint_for): a chunk of chunk_elems parameters
 * (its chunk_bytes over zp_param_bytes). */
uint64_t zp_chunk_state_bytes(zo_dtype state_dtype, uint64_t chunk_elems);
/* What one way of a step moves of a chunk's states on NVMe (used_bytes of
 * parameters in job->dtype): packed, with the master split
 * (job->master_split) unless its parameters live on NVMe too. */
uint64_t zp_moved_state_bytes(const zp_job *job, uint64_t used_bytes, int p16_on_nvme);

typedef enum zp_bottleneck {
    ZP_BN_COMPUTE = 0,
    ZP_BN_H2D,
    ZP_BN_D2H,
    ZP_BN_NVME,
    ZP_BN_OPTIM,
    ZP_N_BOTTLENECKS
} zp_bottleneck;

const char *zp_bottleneck_name(zp_bottleneck b); /* "GPU compute", "host->device", ... */

typedef struct zp_plan {
    zp_strategy strategy;
    zo_tier param_home, optim_home;
    zo_engine_footprint fp; /* the engine's plan */
    int supported;          /* the engine can run it on this backend */
    int fits;               /* supported, and every tier within its budget */
    char why[512];          /* what does not fit or is not supported, and by how much */

    /* device bytes by use */
    struct {
        uint64_t params;      /* resident 16-bit parameters (param home device) */
        uint64_t param_slots; /* chunk buffers parameters page through (param home host/nvme) */
        uint64_t grads;       /* one layer's gradient chunks */
        uint64_t states;      /* optimizer states kept on the device */
        uint64_t inputs;      /* tokens, losses, RoPE table */
        uint64_t checkpoints; /* every block's input (per-layer activation checkpointing) */
        uint64_t workspace;   /* one layer's intermediates */
        uint64_t reserve;     /* CUDA context and cuBLAS */
        uint64_t total;
        uint64_t engine_budget; /* what the engine is given: budget - activations - reserve */
    } device;
    struct {
        uint64_t params, grads, staging, twins, total;
    } pinned;
    struct {
        uint64_t states, backups, accum, total;
    } host;
    struct {
        uint64_t states, params, layer_inputs, payload, files;
    } nvme;
    /* The peaks zo-train --json reports in "peak_bytes": the engine's device
     * bytes, the pinned pool's, the pageable host bytes, the NVMe payload. */
    uint64_t peak_device, peak_pinned, peak_host, peak_nvme;

    /* per optimizer step */
    uint64_t tokens;
    uint64_t h2d_bytes, d2h_bytes, nvme_read_bytes, nvme_write_bytes;
    uint64_t nvme_state_bytes; /* of those, the optimizer states each way (packed, as the engine
                                  moves them) */
    double model_flops;        /* 6N + attention per token, without the recompute (for MFU) */
    double seconds[ZP_N_BOTTLENECKS]; /* each resource alone */
    double step_seconds;
    double fb_seconds;     /* of it, the forward and backward: what runs under the compute */
    double update_seconds; /* the update: CPU Adam beside its NVMe reads and writes (the longer);
                              what the engine's optimizer busy time measures, with the
                              gradients' host jobs */
    zp_bottleneck bottleneck;
    double tokens_per_s, mfu;
    double nvme_write_per_day; /* bytes */
    double days_to_tbw;        /* of the drive's rated endurance (0: no NVMe writes or no rating) */

    /* The per-chunk plan (ZP_SPLIT; a fixed-homes plan has caps 0, group 1,
     * layer inputs on the device, job->mode). */
    zo_optim_mode mode;
    zo_engine_caps param_caps, optim_caps; /* zo_engine_config's: bytes a faster tier holds */
    /* chunks homed at each tier (by zo_tier) */
    uint32_t param_homes[ZO_TIER_COUNT], optim_homes[ZO_TIER_COUNT];
    int micro_group, n_groups;
    zp_act_home act_home;
    uint64_t layer_inputs;       /* the group's layer inputs: (layers + 1) x seq x micro-batch x dim
                                    x 2 bytes x micro_group (on NVMe: the extents and the carry) */
    uint64_t host_budget;        /* the hard host limit planned against (pinned + pageable) */
    uint64_t engine_host_budget; /* the engine's share of it (zo_engine_config.host_bytes): the
                                    budget less zo-train's layer inputs in host memory; the
                                    engine keeps waiting gradients within it, spills the rest
                                    (0: not limited, the fixed placements) */
    /* The terms the engine's footprint does not compute, added to its
     * totals: none now (the 16-bit copies of device-resident chunks whose
     * states are on NVMe, once modelled here, live on NVMe in the engine). */
    struct {
        int64_t device, pinned;
    } modelled;
    uint64_t grad_store;  /* the step's gradients waiting for the update outside pinned memory */
    uint64_t grad_spill;  /* of those, what the engine spills to NVMe extents beyond its budget */
    uint64_t spill_bytes; /* what the spilled gradients move each way (the chunks' used share) */
    uint64_t host_floor;  /* the least host memory a per-chunk plan of this job needs */
    uint64_t h2d_param_bytes, h2d_act_bytes, d2h_grad_bytes, d2h_act_bytes;
    uint64_t h2d_grad_bytes; /* fp32 group sums sent back up for the next group */
    uint64_t nvme_act_bytes; /* layer inputs written to NVMe, and as many read back, per step */
    uint64_t optim_params;   /* parameters this rank updates (all; under ZeRO its own chunks') */
    uint64_t gather_bytes;   /* ZeRO stage 3: 16-bit parameters gathered from other ranks */
    uint64_t tp_bytes;       /* tensor parallelism: what the group sends per step (tensor.h) */
    double tp_seconds;       /* its time over the tensor group's link, in fb_seconds */
    char reason[512];        /* why the planner chose this one */
} zp_plan;

/* FLOPs the device runs per token: the model's (zt_shape_flops_per_token)
 * and the backward's recompute of every block's forward. */
double zp_device_flops_per_token(const zp_job *job);
/* The whole model's FLOPs per token with the job's layout
 * (zt_layout_flops_per_token), whatever its stage or tensor parallelism. */
double zp_full_model_flops_per_token(const zp_job *job);
/* The model's FLOPs per token (zp_full_model_flops_per_token) of the job's
 * layers: a stage's share, the whole model's otherwise. */
double zp_model_flops_per_token(const zp_job *job);
/* One engine layer's share of the two (a tied model's head counts in its
 * last layer, where a pipeline's last stage computes it): the sums over the
 * layers are the whole model's. */
void zp_layer_flops_per_token(const zp_job *job, int layer, double *model, double *device);
/* The job's engine layers: [*first, *end) of the model's. */
void zp_job_layers(const zp_job *job, int *first, int *end);

/* The job's sparse layout (none passes): the fused op's (flash_attention),
 * one the block-mask builder takes, its share countable at job->seq
 * (zt_layout_share, with and without the shape's window). */
zo_status zp_check_layout(const zp_job *job);

/* Plan one strategy. With job->chunk_bytes 0 the chunk size is the better of
 * zo-train's default (the largest tensor) and one block per chunk: one that
 * fits, then the faster, then the smaller. nvme_tbw: the drives' rated endurance in bytes written
 * (0: unknown). *work (optional) is incremented by the planner's work units
 * (tensors packed, slots visited by the eviction simulation): it depends on
 * the number of layers and chunks, never on their sizes. */
/* The optimizer states each of the job's chunks moves on NVMe each way per
 * step, as the engine packs them (the used elements' master, m and v, each
 * padded to 4 KiB), in the engine's chunk order: what --measure times
 * (*bytes: malloc'd, the caller frees). */
zo_status zp_nvme_chunk_states(const zp_job *job, uint64_t **bytes, uint32_t *n_chunks);

zo_status zp_plan_strategy(const zp_job *job, const zp_hardware *hw, const zp_speeds *sp,
                           zp_strategy s, double nvme_tbw, zp_plan *out, uint64_t *work);

/* The fastest plan that fits; -1 when none does. */
int zp_recommend(const zp_plan *plans, int n);

/* The per-chunk plan: over the chunk sizes, the micro-group sizes (the
 * powers of two up to grad_accum and grad_accum itself, or job->micro_group),
 * where layer inputs go (or job->act_home), the optimizer mode (job->mode, or
 * sync and overlap with job->mode_auto) and the 16-bit parameters' home
 * beyond the device (host or NVMe), it fills the fastest tier up to its
 * budget: the device with resident 16-bit parameters (layer 0's first), the
 * host with the optimizer states of the chunks homed on NVMe (a state in RAM
 * saves reading and writing 12 bytes per parameter each step), then with
 * the step's gradients; NVMe takes the rest. The fastest candidate that
 * fits, then the one needing the least memory; out->fits 0 with the reason
 * of the candidate that came closest when none fits. */
zo_status zp_plan_split(const zp_job *job, const zp_hardware *hw, const zp_speeds *sp,
                        double nvme_tbw, zp_plan *out, uint64_t *work);

/* The bytes plan p needs beyond hw's budgets, summed over the device, host
 * (pinned + pageable) and NVMe tiers: how close a plan that does not fit
 * comes to fitting. */
uint64_t zp_plan_overage(const zp_plan *p, const zp_hardware *hw);

/* zo-train's --host-mem for a plan: its host budget, and on the cpu device
 * the emulated device's memory too, which zo-train counts against its host
 * limit while zo-plan's host budget (given or detected) leaves it out. */
uint64_t zp_trainer_host_mem(const zp_hardware *hw, const zp_plan *p);

/* The engine configuration a plan runs under (homes, caps, chunk, mode, the
 * engine's device budget): what zo_engine_footprint_for sees for p->fp. */
zo_engine_config zp_plan_engine_config(const zp_job *job, const zp_hardware *hw, const zp_plan *p);

/* What DeepSpeed's estimate_zero2/zero3_model_states_mem_needs_all_live
 * report for a model of n_params parameters whose largest layer (module) has
 * largest_layer parameters, on one GPU (their additional_buffer_factor 1.5). */
typedef struct zp_ds_row {
    const char *stage;   /* "zero2" or "zero3" */
    const char *options; /* "offload_optimizer=cpu", ... */
    uint64_t cpu, gpu;
} zp_ds_row;
enum { ZP_DS_ROWS = 8 };
void zp_deepspeed_estimate(uint64_t n_params, uint64_t largest_layer, zp_ds_row rows[ZP_DS_ROWS]);

#endif
