/* zoffload: the training configuration, read from DeepSpeed-style JSON.
 *
 * zo-train reads the DeepSpeed config keys that apply to it (batch sizes,
 * optimizer, scheduler, fp16/bf16, gradient clipping, zero_optimization with
 * offload_optimizer/offload_param, aio) plus a "zoffload" section for what
 * DeepSpeed lacks. Unlike DeepSpeed, an unknown or misspelled key is an error
 * that names the key, its JSON path and the nearest valid key; keys that
 * DeepSpeed accepts but that have no effect here are accepted with one
 * warning each and listed in zo_train_config.ignored.
 *
 * Value rules (documented choices):
 *  - Integer keys accept JSON integers and integral reals (DeepSpeed configs
 *    often write 5e7 or 1e9); a fractional value is an error.
 *  - Numbers written as strings ("1e-4") are errors: DeepSpeed hands such
 *    strings to PyTorch, which fails later; here it fails at load, naming the
 *    key. Byte sizes in the "zoffload" section also accept unit strings
 *    ("24GiB", "512MiB", "1.5GB"), since they are ours.
 *  - "auto" (written by Hugging Face Trainer configs) is accepted where the
 *    Trainer fills it in: the batch sizes (then derived as DeepSpeed does),
 *    the optimizer params, the scheduler params, fp16/bf16.enabled and
 *    gradient_clipping; and on every key of zero_optimization and its offload
 *    sections, whose "auto" DeepSpeed itself drops. It means "not given": the
 *    default applies, or the value is derived. A caller with values of its
 *    own (zo-train's flags, as the Trainer's arguments) sets them first with
 *    zo_config_set; the keys left "auto" are listed in auto_keys. An absent
 *    or "auto" scheduler warmup_max_lr is the optimizer's lr, as DeepSpeed's
 *    WarmupLR takes it.
 *  - DeepSpeed features zoffload lacks (sequence_parallel_size,
 *    compression_training, bf16.bf16_master_weights_and_grads...) are refused
 *    when on, by name, with the nearest alternative, unless
 *    zoffload.ignore_unsupported is true (then warned about and listed in
 *    ignored); set to false or off they are accepted silently, as are the
 *    keys with no effect here. Unknown top-level keys that are no near-miss of
 *    a real key are warned about and listed in ignored (DeepSpeed ignores
 *    them); nested unknown keys and near-misses are errors.
 *  - Duplicate keys are errors, as in DeepSpeed.
 *
 * Error messages (the text after zo_last_error()'s "file:line: configuration
 * error: " prefix; PATH is the dotted JSON path such as
 * zero_optimization.offload_optimizer.device):
 *   unknown key 'PATH'; did you mean 'KEY'?
 *   unknown key 'PATH'; the nearest valid key is 'KEY'    (not a likely typo)
 *   'PATH': expected EXPECTED, found FOUND
 *       EXPECTED e.g. "an integer >= 1", "a number in [0, 1)", "true or false",
 *       "one of none, cpu, nvme", "an object"; FOUND e.g. "-3", "1.5",
 *       "string \"abc\"", "true", "null", "an array", "an object"
 *   ORIGIN:LINE:COLUMN: invalid JSON: JANSSON_TEXT
 *   cross-key rules, e.g. "'fp16.enabled' and 'bf16.enabled' are both true;
 *   enable at most one", and the batch-size rules below.
 *
 * Batch sizes follow DeepSpeed exactly (world size W):
 *   all three given: train_batch_size == micro * accum * W is required;
 *   train and micro given: accum = train / micro / W (integer division);
 *   train and accum given: micro = train / W / accum;
 *   micro and accum given: train = micro * accum * W;
 *   only train given: accum = 1, micro = train / W;
 *   only micro given: accum = 1, train = micro * W;
 *   otherwise an error. Then each must be >= 1 and the identity must hold
 *   (integer division can break it: train 10, micro 3 gives accum 3, and
 *   "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step
 *   * world_size: 10 != 3 * 3 * 1").
 */
#ifndef ZO_CONFIG_H
#define ZO_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "zo/dtype.h"
#include "zo/optim_mode.h"
#include "zo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    ZO_CONFIG_PATH_CAP = 512,      /* longest file path + 1 */
    ZO_CONFIG_MAX_NVME_PATHS = 16, /* drives in zoffload.nvme_paths */
    ZO_CONFIG_MAX_IGNORED = 64,    /* ignored keys remembered */
    ZO_CONFIG_KEY_CAP = 128,       /* longest remembered key path + 1 */
};

typedef enum zo_offload_device {
    ZO_OFFLOAD_NONE = 0,
    ZO_OFFLOAD_CPU = 1,
    ZO_OFFLOAD_NVME = 2,
} zo_offload_device;

typedef enum zo_optimizer_type {
    ZO_OPTIMIZER_ADAM = 0,  /* "Adam" (any case); AdamW semantics unless adam_w_mode is false */
    ZO_OPTIMIZER_ADAMW = 1, /* "AdamW" (any case) */
} zo_optimizer_type;

typedef enum zo_scheduler_type {
    ZO_SCHEDULER_NONE = 0, /* constant learning rate */
    ZO_SCHEDULER_WARMUP_LR = 1,
    ZO_SCHEDULER_WARMUP_DECAY_LR = 2,
    ZO_SCHEDULER_WARMUP_COSINE_LR = 3,
} zo_scheduler_type;

/* sparse_attention.mode: the block layout zo-train gives the fused attention
 * op (zo_attn_layout in zo/ops.h). DeepSpeed's variable and bslongformer are
 * not offered. */
typedef enum zo_sparse_mode {
    ZO_SPARSE_DENSE = 0,
    ZO_SPARSE_FIXED,
    ZO_SPARSE_BIGBIRD,
    ZO_SPARSE_SLIDING_WINDOW
} zo_sparse_mode;

typedef enum zo_warmup_type {
    ZO_WARMUP_LOG = 0, /* DeepSpeed's default */
    ZO_WARMUP_LINEAR = 1,
} zo_warmup_type;

typedef struct zo_offload_optimizer_config {
    zo_offload_device device;           /* none */
    char nvme_path[ZO_CONFIG_PATH_CAP]; /* "" when not given */
    int pin_memory;                     /* 1 (DeepSpeed's default) */
    int64_t buffer_count;               /* 4 */
    int pipeline_read;                  /* 0 */
    int pipeline_write;                 /* 0 */
    int fast_init;                      /* 0 */
} zo_offload_optimizer_config;

typedef struct zo_offload_param_config {
    zo_offload_device device;           /* none */
    char nvme_path[ZO_CONFIG_PATH_CAP]; /* "" when not given */
    int pin_memory;                     /* 1 */
    int64_t buffer_count;               /* 5 */
    int64_t buffer_size;                /* 1e8 (elements, as in DeepSpeed) */
    int64_t max_in_cpu;                 /* 1e9 (elements) */
} zo_offload_param_config;

/* DeepSpeed's sparse_attention (present: enabled), which zo-train applies
 * as a block layout of the fused attention op (--attention flash): one
 * layout for every head, unidirectional only (the models are causal
 * decoders; "bidirectional" is refused). DeepSpeed's key names and
 * defaults; seed is zoffload's (bigbird's random blocks). */
typedef struct zo_sparse_attention_config {
    int enabled;                           /* 0; 1 when the section is present */
    zo_sparse_mode mode;                   /* fixed */
    int64_t block;                         /* 16 tokens (16..512, a multiple of 16) */
    int64_t num_local_blocks;              /* 4: fixed's stripe */
    int64_t num_global_blocks;             /* 1: fixed's summary blocks per stripe, bigbird's
                                              first blocks */
    int64_t num_random_blocks;             /* 0: bigbird */
    int64_t num_sliding_window_blocks;     /* 3: bigbird's and sliding_window's window */
    int bidirectional;                     /* 0: attention "unidirectional" */
    int64_t num_different_global_patterns; /* 1 (more need a layout per head) */
    int64_t seed;                          /* 0: bigbird's random blocks */
} zo_sparse_attention_config;

typedef struct zo_train_config {
    size_t struct_size; /* sizeof(zo_train_config): set by ZO_TRAIN_CONFIG_INIT */

    /* Effective values after derivation (never 0 after a successful resolve). */
    int64_t train_batch_size;
    int64_t train_micro_batch_size_per_gpu;
    int64_t gradient_accumulation_steps;
    int64_t world_size;       /* the world size the batch sizes were resolved for */
    double gradient_clipping; /* 0 = off */
    int64_t steps_per_print;  /* 10 */

    struct {
        zo_optimizer_type type;     /* Adam */
        double lr;                  /* 1e-3 */
        double betas[2];            /* 0.9, 0.999 */
        double eps;                 /* 1e-8 */
        double weight_decay;        /* 0 */
        int adam_w_mode;            /* 1: DeepSpeed's "Adam" is AdamW unless this is false */
        int bias_correction;        /* 1 */
        int decoupled_weight_decay; /* effective: type == AdamW || adam_w_mode */
    } optimizer;

    struct {
        zo_scheduler_type type;       /* none */
        double warmup_min_lr;         /* 0 (WarmupLR, WarmupDecayLR) */
        double warmup_max_lr;         /* 1e-3 (WarmupLR, WarmupDecayLR) */
        int64_t warmup_num_steps;     /* 1000 */
        zo_warmup_type warmup_type;   /* log */
        int64_t total_num_steps;      /* 0 = not given (required by Decay/Cosine) */
        double warmup_min_ratio;      /* 0 (WarmupCosineLR) */
        double cos_min_ratio;         /* 1e-4 (WarmupCosineLR) */
        int64_t last_batch_iteration; /* -1 */
    } scheduler;

    struct {
        int enabled;                 /* 0 */
        double loss_scale;           /* 0 = dynamic */
        int64_t initial_scale_power; /* 16: the dynamic scale starts at 2^16 */
        int64_t loss_scale_window;   /* 1000 */
        int64_t hysteresis;          /* 2 */
        int consecutive_hysteresis;  /* 0 */
        double min_loss_scale;       /* 1 */
    } fp16;

    struct {
        int enabled; /* 0 */
    } bf16;

    struct {
        int64_t stage; /* 0 */
        zo_offload_optimizer_config offload_optimizer;
        zo_offload_param_config offload_param;
        int64_t stage3_prefetch_bucket_size;        /* 5e7 */
        int64_t stage3_max_live_parameters;         /* 1e9 */
        int64_t stage3_max_reuse_distance;          /* 1e9 */
        int64_t stage3_param_persistence_threshold; /* 1e5 */
        int64_t sub_group_size;                     /* 1e9 */
    } zero_optimization;

    struct {
        int64_t stages; /* 0: "auto" or not given (no pipeline) */
        int partition;  /* 0 "parameters" (balanced parameter counts), 1 "uniform" (layers) */
    } pipeline;

    /* DeepSpeed's AutoTP training section; zo-train's --tensor-parallel
     * (Megatron's column- and row-parallel blocks). */
    struct {
        int64_t autotp_size; /* 0: "auto" or not given (no tensor parallelism); alias tp_size */
    } tensor_parallel;

    zo_sparse_attention_config sparse_attention;

    struct {
        int64_t block_size;           /* 1 MiB */
        int64_t queue_depth;          /* 8 */
        int64_t intra_op_parallelism; /* 1 (old name: thread_count) */
        int single_submit;            /* 0 */
        int overlap_events;           /* 1 */
    } aio;

    struct {
        int64_t device_mem;           /* bytes; 0 = all free device memory */
        int64_t host_mem;             /* pinned host bytes; 0 = planner decides */
        int64_t chunk_size;           /* bytes; 0 = planner decides */
        int64_t tile_size;            /* bytes; 0 = auto: the PyTorch front end's row tiles of large
                                         Embedding/Linear weights (zo-train keeps its weights whole) */
        zo_optim_mode optimizer_mode; /* sync */
        int64_t prefetch_lookahead;   /* 2 layers */
        int64_t micro_group;          /* 1: micro-batch-major; N: layer-major groups of N */
        int64_t mlp_chunk_bytes;      /* bytes of each ffn-wide buffer of a block's position-wise
                                         chunks (zo-train's --mlp-chunk-bytes); 0 = auto */
        int act_home; /* 0 device, 1 host, 2 nvme: where a group's layer inputs wait */
        zo_dtype optimizer_state_dtype; /* fp32 (ZO_DTYPE_F32), bf16, or int8 (ZO_DTYPE_I8) */
        int master_split;               /* 0: the split fp32 master on NVMe (engine.h) */
        int update_behind; /* 1: overlap mode's update after the verdict behind the next forward
                              (zo_engine_config.update_behind) */
        int embedding_f32_states; /* 0: int8 states keep the token embedding's moments fp32 */
        int sequence_parallel;    /* 0: Megatron's sequence parallelism in the tensor group */
        int recompute; /* 0: the PyTorch front end below a resident budget fetches autograd's saved
                          parameters again in the backward; 1: each layer recomputes its forward */
        int reduce_order;       /* 0 global, 1 rank: ZeRO's order with gradient accumulation
                                   (zo_reduce_order, engine.h) */
        int ignore_unsupported; /* 0: enabled DeepSpeed features zoffload lacks are errors */
        int64_t n_nvme_paths;   /* 0 */
        char nvme_paths[ZO_CONFIG_MAX_NVME_PATHS][ZO_CONFIG_PATH_CAP];
        /* Per-chunk homes: "auto" (the trainer splits by its host memory), or
         * the bytes of each state that a tier faster than its home may hold
         * (0: none; the home, offload_*.device, takes the rest). */
        struct {
            int is_auto; /* 0 */
            struct {
                int64_t device, host; /* 0 */
            } optimizer, params;
        } placement;
    } zoffload;

    /* DeepSpeed's activation_checkpointing: cpu_checkpointing (0) keeps the
     * layer inputs in pinned host memory (zoffload.act_home host, unless
     * zoffload.act_home says nvme); its other keys are accepted, no effect. */
    struct {
        int cpu_checkpointing;
    } activation_checkpointing;

    /* DeepSpeed's monitors that zo-train writes: TensorBoard event files and
     * CSV files under output_path/job_name (defaults "runs" and "csv_monitor",
     * job "DeepSpeedJobName", as DeepSpeed's). wandb and comet are accepted
     * and ignored (zo-train has no Python; the PyTorch front end logs to wandb). */
    struct {
        int enabled;                          /* 0 */
        char output_path[ZO_CONFIG_PATH_CAP]; /* "" when not given */
        char job_name[ZO_CONFIG_PATH_CAP];    /* "" when not given */
    } tensorboard, csv_monitor;

    /* Keys accepted for DeepSpeed compatibility that have no effect, as JSON
     * paths, section by section (one warning each was logged). */
    int64_t n_ignored;
    char ignored[ZO_CONFIG_MAX_IGNORED][ZO_CONFIG_KEY_CAP];

    /* Keys written "auto", as JSON paths: each took its default or derived
     * value (the caller fills its own values in first, zo_config_set). */
    int64_t n_auto;
    char auto_keys[ZO_CONFIG_MAX_IGNORED][ZO_CONFIG_KEY_CAP];
} zo_train_config;

/* DeepSpeed's defaults (batch sizes 0 = not given). */
#define ZO_TRAIN_CONFIG_INIT                                                                       \
    {                                                                                              \
        .struct_size = sizeof(zo_train_config), .world_size = 1, .steps_per_print = 10,            \
        .optimizer = {.type = ZO_OPTIMIZER_ADAM,                                                   \
                      .lr = 1e-3,                                                                  \
                      .betas = {0.9, 0.999},                                                       \
                      .eps = 1e-8,                                                                 \
                      .adam_w_mode = 1,                                                            \
                      .bias_correction = 1,                                                        \
                      .decoupled_weight_decay = 1},                                                \
        .scheduler = {.warmup_max_lr = 1e-3,                                                       \
                      .warmup_num_steps = 1000,                                                    \
                      .cos_min_ratio = 1e-4,                                                       \
                      .last_batch_iteration = -1},                                                 \
        .fp16 = {.initial_scale_power = 16,                                                        \
                 .loss_scale_window = 1000,                                                        \
                 .hysteresis = 2,                                                                  \
                 .min_loss_scale = 1.0},                                                           \
        .zero_optimization = {.offload_optimizer = {.pin_memory = 1, .buffer_count = 4},           \
                              .offload_param = {.pin_memory = 1,                                   \
                                                .buffer_count = 5,                                 \
                                                .buffer_size = 100000000,                          \
                                                .max_in_cpu = 1000000000},                         \
                              .stage3_prefetch_bucket_size = 50000000,                             \
                              .stage3_max_live_parameters = 1000000000,                            \
                              .stage3_max_reuse_distance = 1000000000,                             \
                              .stage3_param_persistence_threshold = 100000,                        \
                              .sub_group_size = 1000000000},                                       \
        .aio = {.block_size = 1048576,                                                             \
                .queue_depth = 8,                                                                  \
                .intra_op_parallelism = 1,                                                         \
                .overlap_events = 1},                                                              \
        .zoffload = {.prefetch_lookahead = 2, .micro_group = 1, .update_behind = 1},               \
        .sparse_attention = {.mode = ZO_SPARSE_FIXED,                                              \
                             .block = 16,                                                          \
                             .num_local_blocks = 4,                                                \
                             .num_global_blocks = 1,                                               \
                             .num_sliding_window_blocks = 3,                                       \
                             .num_different_global_patterns = 1},                                  \
    }

/* A config document being assembled: a file (or string), then command-line
 * overrides, then resolved into a zo_train_config. */
typedef struct zo_config *zo_config_t;

zo_status zo_config_init(zo_config_t *out);
void zo_config_free(zo_config_t cfg);

/* Replace the document with a file's JSON; malformed JSON fails with
 * "PATH:LINE:COLUMN: invalid JSON: ...". Nothing is validated until
 * zo_config_resolve. */
zo_status zo_config_load_file(zo_config_t cfg, const char *path);
/* The same from text; origin names it in messages (NULL: "<string>"). */
zo_status zo_config_load_string(zo_config_t cfg, const char *json, const char *origin);

/* Override one key, as a command-line flag does: key is a dotted path
 * ("zero_optimization.offload_optimizer.device"), created as needed; value is
 * parsed as JSON when it is valid JSON (numbers, true, null, "quoted",
 * [arrays], {objects}) and is taken as a plain string otherwise (nvme). */
zo_status zo_config_set(zo_config_t cfg, const char *key, const char *value);
/* The same from "key=value". */
zo_status zo_config_set_arg(zo_config_t cfg, const char *assignment);

/* Validate the document with its overrides and fill *out (whose struct_size
 * must be set, by ZO_TRAIN_CONFIG_INIT) for a job of world_size ranks. *out
 * is left untouched on error. */
zo_status zo_config_resolve(zo_config_t cfg, int64_t world_size, zo_train_config *out);

/* One call: load a file and resolve it. */
zo_status zo_train_config_load(const char *path, int64_t world_size, zo_train_config *out);

/* The effective config as DeepSpeed-style JSON text (every key, derived
 * batch sizes included; ignored keys left out), which zo_config_resolve reads
 * back to an identical config. *json is malloc'd: free() it. indent 0 gives
 * one line. */
zo_status zo_train_config_to_json(const zo_train_config *cfg, int indent, char **json);

/* Names of the enum values as written in JSON ("nvme", "WarmupCosineLR"...). */
const char *zo_offload_device_name(zo_offload_device d);
const char *zo_scheduler_type_name(zo_scheduler_type t);

#ifdef __cplusplus
}
#endif
#endif
