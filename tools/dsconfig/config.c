/* DeepSpeed-style JSON config: schema tables, validation with "did you mean"
 * suggestions, command-line overrides, batch-size derivation and
 * serialization of the effective config. See include/zo/config.h. */
#include "zo/config.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "zo/file.h"
#include "zo/optim.h"
#include "zo/units.h"
#include "zo_internal.h"
#include "zo_strdist.h"

#define SUBSYS "config"

_Static_assert(sizeof(zo_offload_device) == sizeof(int), "enum fields are stored as int");

/* ---- the schema ---- */

typedef enum key_kind {
    K_BOOL,         /* int 0/1 */
    K_INT,          /* int64_t within [min, max]; integral reals accepted */
    K_NUM,          /* double within [min, max] */
    K_ENUM,         /* an enum stored as int: names[i] <-> base + i */
    K_PATH,         /* char[ZO_CONFIG_PATH_CAP]; null leaves "" */
    K_SECTION,      /* a nested object */
    K_IGNORED,      /* a DeepSpeed key with no effect here: any value, one warning */
    K_BETAS,        /* double[2] in [0, 1) */
    K_PATHLIST,     /* zoffload.nvme_paths */
    K_FALSE_ONLY,   /* a DeepSpeed bool whose true is not supported here */
    K_SCHED_PARAMS, /* scheduler.params: keys depend on scheduler.type */
    K_PLACEMENT,    /* zoffload.placement: "auto" or its section */
    K_UNSUPPORTED,  /* a DeepSpeed feature zoffload lacks: refused when enabled */
    K_CPU_OFFLOAD   /* deprecated zero_optimization.cpu_offload(_param): a device */
} key_kind;

enum {
    F_AUTO = 1u << 0,     /* "auto" accepted: leaves the default */
    F_NULL = 1u << 1,     /* null accepted: leaves the default */
    F_UNITS = 1u << 2,    /* byte count: also "24GiB"-style strings */
    F_MIN_EXCL = 1u << 3, /* min itself is out of range */
    F_MAX_EXCL = 1u << 4, /* max itself is out of range */
    F_ICASE = 1u << 5,    /* enum names compared case-insensitively */
    F_ALIAS = 1u << 6,    /* another name for the previous key: not serialized */
    F_REQUIRED = 1u << 7, /* must be present in its section */
    F_TRUE_DEF = 1u << 8, /* K_IGNORED whose DeepSpeed default is true: silent when true */
};

#define NO_MAX 9.2e18 /* "unbounded" for integer ranges */

typedef struct section section;

/* How a key's value says its feature is off; DeepSpeed reads each its own way. */
typedef enum off_rule {
    OFF_ENABLED, /* false, null, 0, {} or objects whose "enabled" keys are all false */
    OFF_SIZE,    /* sizes <= 1 (sequence_parallel_size) */
    OFF_NEVER,   /* any value: a name DeepSpeed itself refuses */
} off_rule;

/* A DeepSpeed feature that zoffload lacks (K_UNSUPPORTED). */
typedef struct feature {
    const char *what;    /* what it does in DeepSpeed */
    const char *instead; /* the nearest supported alternative, or NULL */
    off_rule off;
} feature;

typedef struct key_spec {
    const char *name;
    key_kind kind;
    size_t off; /* offset in zo_train_config */
    unsigned flags;
    double min, max;
    const char *const *names;   /* K_ENUM */
    int base;                   /* K_ENUM: value of names[0] */
    const section *sub;         /* K_SECTION */
    const struct feature *feat; /* K_UNSUPPORTED */
} key_spec;

struct section {
    const key_spec *keys;
    size_t n;
    int auto_any; /* "auto" on any key means its default, as DeepSpeed's pydantic models drop
                     "auto" values (DeepSpeedConfigModel.__init__) */
};

#define OFF(field) offsetof(zo_train_config, field)
#define B(n, f)                                                                                    \
    {                                                                                              \
        n, K_BOOL, OFF(f), 0, 0, 1, NULL, 0, NULL, NULL                                            \
    }
#define I(n, f, fl, lo, hi)                                                                        \
    {                                                                                              \
        n, K_INT, OFF(f), fl, lo, hi, NULL, 0, NULL, NULL                                          \
    }
#define N(n, f, fl, lo, hi)                                                                        \
    {                                                                                              \
        n, K_NUM, OFF(f), fl, lo, hi, NULL, 0, NULL, NULL                                          \
    }
#define E(n, f, fl, names, base)                                                                   \
    {                                                                                              \
        n, K_ENUM, OFF(f), fl, 0, 0, names, base, NULL, NULL                                       \
    }
#define P(n, f)                                                                                    \
    {                                                                                              \
        n, K_PATH, OFF(f), F_NULL, 0, 0, NULL, 0, NULL, NULL                                       \
    }
#define S(n, sec)                                                                                  \
    {                                                                                              \
        n, K_SECTION, 0, 0, 0, 0, NULL, 0, &sec, NULL                                              \
    }
#define X(n)                                                                                       \
    {                                                                                              \
        n, K_IGNORED, 0, 0, 0, 0, NULL, 0, NULL, NULL                                              \
    }
/* DeepSpeed keys with no effect here whose default is true. */
#define XT(n)                                                                                      \
    {                                                                                              \
        n, K_IGNORED, 0, F_TRUE_DEF, 0, 0, NULL, 0, NULL, NULL                                     \
    }
#define U(n, what, instead, off)                                                                   \
    {                                                                                              \
        n, K_UNSUPPORTED, 0, 0, 0, 0, NULL, 0, NULL, &(const feature)                              \
        {                                                                                          \
            what, instead, off                                                                     \
        }                                                                                          \
    }
/* An alias of the previous key (DeepSpeed's pydantic Field alias). */
#define IA(n, f, fl, lo, hi)                                                                       \
    {                                                                                              \
        n, K_INT, OFF(f), (fl) | F_ALIAS, lo, hi, NULL, 0, NULL, NULL                              \
    }
#define FALSE_ONLY(n)                                                                              \
    {                                                                                              \
        n, K_FALSE_ONLY, 0, 0, 0, 0, NULL, 0, NULL, NULL                                           \
    }
#define SECTION(arr)                                                                               \
    {                                                                                              \
        arr, sizeof arr / sizeof arr[0], 0                                                         \
    }
#define SECTION_AUTO(arr)                                                                          \
    {                                                                                              \
        arr, sizeof arr / sizeof arr[0], 1                                                         \
    }

static const char *const device_names[] = {"none", "cpu", "nvme", NULL};
static const char *const optimizer_names[] = {"Adam", "AdamW", NULL};
static const char *const scheduler_names[] = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", NULL};
static const char *const warmup_names[] = {"log", "linear", NULL};
static const char *const mode_names[] = {"sync", "overlap", "dpu", NULL};
/* optimizer_state_dtype: the moment formats' names and dtypes, from their
 * table (zo/optim.h), filled once by the first zo_config_init or
 * zo_train_config_to_json (every other entry point takes a config). */
#define N_STATE_FORMATS 16
static const char *state_dtype_names[N_STATE_FORMATS + 1];
static int state_dtype_values[N_STATE_FORMATS];
static pthread_once_t state_dtypes_once = PTHREAD_ONCE_INIT;

static void load_state_dtypes(void)
{
    const zo_state_format *f;
    for (size_t i = 0; i < N_STATE_FORMATS && (f = zo_state_format_at(i)); i++) {
        state_dtype_names[i] = f->name;
        state_dtype_values[i] = f->dtype;
    }
}
static const char *const act_home_names[] = {"device", "host", "nvme", NULL};
static const char *const reduce_order_names[] = {"global", "rank", NULL};
static const char *const sparse_mode_names[] = {"dense", "fixed", "bigbird", "sliding_window",
                                                NULL};
static const char *const direction_names[] = {"unidirectional", "bidirectional", NULL};
/* The one enum whose values are not base + index: zo_dtype's. */

static int enum_value(const key_spec *k, int i)
{
    return k->names == state_dtype_names ? state_dtype_values[i] : k->base + i;
}

/* names' index of value v, or -1. */
static int enum_index(const key_spec *k, int v)
{
    for (int i = 0; k->names[i]; i++)
        if (enum_value(k, i) == v)
            return i;
    return -1;
}

static const key_spec optimizer_params_keys[] = {
    N("lr", optimizer.lr, F_AUTO, 0, HUGE_VAL),
    {"betas", K_BETAS, OFF(optimizer.betas), F_AUTO, 0, 1, NULL, 0, NULL, NULL},
    N("eps", optimizer.eps, F_AUTO, 0, HUGE_VAL),
    N("weight_decay", optimizer.weight_decay, F_AUTO, 0, HUGE_VAL),
    B("adam_w_mode", optimizer.adam_w_mode),
    B("bias_correction", optimizer.bias_correction),
    FALSE_ONLY("amsgrad"),
    X("torch_adam"),
    U("max_grad_norm", "DeepSpeed refuses it as an optimizer parameter too", "'gradient_clipping'",
      OFF_NEVER),
};
static const section optimizer_params_sec = SECTION(optimizer_params_keys);

static const key_spec optimizer_keys[] = {
    E("type", optimizer.type, F_ICASE | F_REQUIRED, optimizer_names, ZO_OPTIMIZER_ADAM),
    S("params", optimizer_params_sec),
    X("legacy_fusion"),
};
static const section optimizer_sec = SECTION(optimizer_keys);

#define SCHED_WARMUP_STEPS I("warmup_num_steps", scheduler.warmup_num_steps, F_AUTO, 0, NO_MAX)
#define SCHED_WARMUP_TYPE  E("warmup_type", scheduler.warmup_type, 0, warmup_names, ZO_WARMUP_LOG)
#define SCHED_LAST_ITER    I("last_batch_iteration", scheduler.last_batch_iteration, 0, -1, NO_MAX)
#define SCHED_TOTAL        I("total_num_steps", scheduler.total_num_steps, F_AUTO, 1, NO_MAX)
#define SCHED_MIN_LR       N("warmup_min_lr", scheduler.warmup_min_lr, F_AUTO, 0, HUGE_VAL)
#define SCHED_MAX_LR       N("warmup_max_lr", scheduler.warmup_max_lr, F_AUTO, 0, HUGE_VAL)

static const key_spec warmup_lr_keys[] = {SCHED_MIN_LR, SCHED_MAX_LR, SCHED_WARMUP_STEPS,
                                          SCHED_WARMUP_TYPE, SCHED_LAST_ITER};
static const key_spec warmup_decay_keys[] = {SCHED_MIN_LR,      SCHED_MAX_LR,    SCHED_WARMUP_STEPS,
                                             SCHED_WARMUP_TYPE, SCHED_LAST_ITER, SCHED_TOTAL};
static const key_spec warmup_cosine_keys[] = {
    SCHED_TOTAL,        N("warmup_min_ratio", scheduler.warmup_min_ratio, 0, 0, 1),
    SCHED_WARMUP_STEPS, N("cos_min_ratio", scheduler.cos_min_ratio, 0, 0, 1),
    SCHED_WARMUP_TYPE,  SCHED_LAST_ITER,
};
static const section sched_params_secs[] = {SECTION(warmup_lr_keys), SECTION(warmup_decay_keys),
                                            SECTION(warmup_cosine_keys)};

static const key_spec scheduler_keys[] = {
    E("type", scheduler.type, F_REQUIRED, scheduler_names, ZO_SCHEDULER_WARMUP_LR),
    {"params", K_SCHED_PARAMS, 0, 0, 0, 0, NULL, 0, NULL, NULL},
};
static const section scheduler_sec = SECTION(scheduler_keys);

static const key_spec fp16_keys[] = {
    {"enabled", K_BOOL, OFF(fp16.enabled), F_AUTO, 0, 1, NULL, 0, NULL, NULL},
    N("loss_scale", fp16.loss_scale, 0, 0, HUGE_VAL),
    I("initial_scale_power", fp16.initial_scale_power, 0, 0, 64),
    I("loss_scale_window", fp16.loss_scale_window, 0, 1, NO_MAX),
    I("hysteresis", fp16.hysteresis, 0, 1, NO_MAX),
    B("consecutive_hysteresis", fp16.consecutive_hysteresis),
    N("min_loss_scale", fp16.min_loss_scale, F_MIN_EXCL, 0, HUGE_VAL),
    X("auto_cast"),
    U("fp16_master_weights_and_grads", "fp16 master weights and gradients",
      "zoffload's fp32 master weights (the default)", OFF_ENABLED),
};
static const section fp16_sec = SECTION(fp16_keys);

static const key_spec bf16_keys[] = {
    {"enabled", K_BOOL, OFF(bf16.enabled), F_AUTO, 0, 1, NULL, 0, NULL, NULL},
    X("immediate_grad_update"),
    XT("check_grad_overflow"),
    U("bf16_master_weights_and_grads", "bf16 master weights and gradients",
      "zoffload's fp32 master weights (the default)", OFF_ENABLED),
    U("bf16_optimizer_states", "bf16 optimizer states with bf16 master weights",
      "'zoffload.optimizer_state_dtype': \"bf16\"", OFF_ENABLED),
};
static const section bf16_sec = SECTION(bf16_keys);

static const key_spec offload_optimizer_keys[] = {
    E("device", zero_optimization.offload_optimizer.device, 0, device_names, ZO_OFFLOAD_NONE),
    P("nvme_path", zero_optimization.offload_optimizer.nvme_path),
    B("pin_memory", zero_optimization.offload_optimizer.pin_memory),
    I("buffer_count", zero_optimization.offload_optimizer.buffer_count, 0, 0, NO_MAX),
    B("pipeline_read", zero_optimization.offload_optimizer.pipeline_read),
    B("pipeline_write", zero_optimization.offload_optimizer.pipeline_write),
    B("fast_init", zero_optimization.offload_optimizer.fast_init),
    X("ratio"),
    X("super_offload"),
    X("cpuadam_cores_perc"),
};
static const section offload_optimizer_sec = SECTION_AUTO(offload_optimizer_keys);

static const key_spec offload_param_keys[] = {
    E("device", zero_optimization.offload_param.device, 0, device_names, ZO_OFFLOAD_NONE),
    P("nvme_path", zero_optimization.offload_param.nvme_path),
    B("pin_memory", zero_optimization.offload_param.pin_memory),
    I("buffer_count", zero_optimization.offload_param.buffer_count, 0, 0, NO_MAX),
    I("buffer_size", zero_optimization.offload_param.buffer_size, 0, 0, NO_MAX),
    I("max_in_cpu", zero_optimization.offload_param.max_in_cpu, 0, 0, NO_MAX),
};
static const section offload_param_sec = SECTION_AUTO(offload_param_keys);

/* DeepSpeedZeroConfig (deepspeed/runtime/zero/config.py): its field names
 * and their stage3_ aliases, both accepted. */
static const key_spec zero_keys[] = {
    I("stage", zero_optimization.stage, 0, 0, 3),
    S("offload_optimizer", offload_optimizer_sec),
    S("offload_param", offload_param_sec),
    I("stage3_prefetch_bucket_size", zero_optimization.stage3_prefetch_bucket_size, 0, 0, NO_MAX),
    IA("prefetch_bucket_size", zero_optimization.stage3_prefetch_bucket_size, 0, 0, NO_MAX),
    I("stage3_max_live_parameters", zero_optimization.stage3_max_live_parameters, 0, 0, NO_MAX),
    IA("max_live_parameters", zero_optimization.stage3_max_live_parameters, 0, 0, NO_MAX),
    I("stage3_max_reuse_distance", zero_optimization.stage3_max_reuse_distance, 0, 0, NO_MAX),
    IA("max_reuse_distance", zero_optimization.stage3_max_reuse_distance, 0, 0, NO_MAX),
    I("stage3_param_persistence_threshold", zero_optimization.stage3_param_persistence_threshold, 0,
      0, NO_MAX),
    IA("param_persistence_threshold", zero_optimization.stage3_param_persistence_threshold, 0, 0,
       NO_MAX),
    I("sub_group_size", zero_optimization.sub_group_size, 0, 0, NO_MAX),
    /* Deprecated names of the offload sections, as DeepSpeed maps them. */
    {"cpu_offload", K_CPU_OFFLOAD, OFF(zero_optimization.offload_optimizer.device), 0, 0, 0, NULL,
     0, NULL, NULL},
    {"cpu_offload_param", K_CPU_OFFLOAD, OFF(zero_optimization.offload_param.device), 0, 0, 0, NULL,
     0, NULL, NULL},
    X("cpu_offload_use_pin_memory"),
    U("zenflow", "ZenFlow's stall-free offloading that updates only the top-k gradients per step",
      "'zoffload.optimizer_mode': \"overlap\" (exact) or \"dpu\"", OFF_ENABLED),
    /* DeepSpeed keys for multi-GPU communication and partitioning details
     * zoffload decides itself: accepted, with a warning when not at their
     * default or off. */
    X("reduce_bucket_size"),
    X("allgather_bucket_size"),
    XT("overlap_comm"),
    XT("contiguous_gradients"),
    XT("reduce_scatter"),
    XT("allgather_partitions"),
    XT("use_multi_rank_bucket_allreduce"),
    X("round_robin_gradients"),
    X("elastic_checkpoint"),
    XT("ignore_unused_parameters"),
    XT("load_from_fp32_weights"),
    X("stage3_gather_16bit_weights_on_model_save"),
    X("gather_16bit_weights_on_model_save"),
    X("stage3_gather_fp16_weights_on_model_save"),
    X("model_persistence_threshold"),
    X("stage3_model_persistence_threshold"),
    X("module_granularity_threshold"),
    X("stage3_module_granularity_threshold"),
    X("use_all_reduce_for_fetch_params"),
    X("stage3_use_all_reduce_for_fetch_params"),
    X("allgather_sequential"),
    X("stage3_allgather_sequential"),
    X("legacy_stage1"),
    X("zero_hpz_partition_size"),
    X("zero_quantized_weights"),
    X("zero_quantized_nontrainable_weights"),
    X("zero_quantized_gradients"),
    X("zeropp_loco_param"),
    X("mics_shard_size"),
    X("mics_hierarchical_params_gather"),
    XT("memory_efficient_linear"),
    X("pipeline_loading_checkpoint"),
    XT("override_module_apply"),
    X("log_trace_cache_warnings"),
    X("enable_sanity_checks"),
    X("save_muon_momentum_buffer_in_memory"),
    X("leaf_module"),
};
static const section zero_sec = SECTION_AUTO(zero_keys);

static const char *const partition_names[] = {"parameters", "uniform", NULL};

/* DeepSpeed's pipeline section (its PipelineModule's partition_method as
 * "partition"; "type:REGEX" has no layer types to match here). */
static const key_spec pipeline_keys[] = {
    I("stages", pipeline.stages, F_AUTO, 0, 64), /* 0 (as "auto"): no stages */
    E("partition", pipeline.partition, F_ICASE, partition_names, 0),
    X("seed_layers"),
    X("activation_checkpoint_interval"),
    X("pipe_partitioned"),
    X("grad_partitioned"),
};
static const section pipeline_sec = SECTION(pipeline_keys);

/* DeepSpeed's AutoTP training (autotp_size) and inference (tp_size) names of
 * the tensor-parallel degree: zo-train's --tensor-parallel. */
static const key_spec tensor_parallel_keys[] = {
    I("autotp_size", tensor_parallel.autotp_size, F_AUTO, 0, 64), /* 0 (as "auto"): none */
    IA("tp_size", tensor_parallel.autotp_size, F_AUTO, 0, 64),
};
static const section tensor_parallel_sec = SECTION(tensor_parallel_keys);

/* DeepSpeed's names (runtime/constants.py); the keys of its variable and
 * bslongformer modes have no effect in the modes offered (DeepSpeed reads
 * only its mode's keys). */
static const key_spec sparse_attention_keys[] = {
    E("mode", sparse_attention.mode, 0, sparse_mode_names, ZO_SPARSE_DENSE),
    I("block", sparse_attention.block, 0, 16, 512),
    FALSE_ONLY("different_layout_per_head"),
    I("num_local_blocks", sparse_attention.num_local_blocks, 0, 1, NO_MAX),
    I("num_global_blocks", sparse_attention.num_global_blocks, 0, 0, NO_MAX),
    I("num_random_blocks", sparse_attention.num_random_blocks, 0, 0, NO_MAX),
    I("num_sliding_window_blocks", sparse_attention.num_sliding_window_blocks, 0, 1, NO_MAX),
    E("attention", sparse_attention.bidirectional, 0, direction_names, 0),
    FALSE_ONLY("horizontal_global_attention"),
    I("num_different_global_patterns", sparse_attention.num_different_global_patterns, 0, 1, 1),
    I("seed", sparse_attention.seed, 0, 0, NO_MAX),
    X("local_window_blocks"),
    X("global_block_indices"),
    X("global_block_end_indices"),
};
static const section sparse_attention_sec = SECTION(sparse_attention_keys);

static const key_spec aio_keys[] = {
    I("block_size", aio.block_size, 0, 1, NO_MAX),
    I("queue_depth", aio.queue_depth, 0, 1, 65536),
    I("intra_op_parallelism", aio.intra_op_parallelism, 0, 1, 1024),
    I("thread_count", aio.intra_op_parallelism, F_ALIAS, 1, 1024),
    B("single_submit", aio.single_submit),
    B("overlap_events", aio.overlap_events),
    X("use_gds"),
};
static const section aio_sec = SECTION(aio_keys);

static const key_spec placement_optimizer_keys[] = {
    I("device", zoffload.placement.optimizer.device, F_UNITS, 0, NO_MAX),
    I("host", zoffload.placement.optimizer.host, F_UNITS, 0, NO_MAX),
};
static const section placement_optimizer_sec = SECTION(placement_optimizer_keys);

static const key_spec placement_params_keys[] = {
    I("device", zoffload.placement.params.device, F_UNITS, 0, NO_MAX),
    I("host", zoffload.placement.params.host, F_UNITS, 0, NO_MAX),
};
static const section placement_params_sec = SECTION(placement_params_keys);

static const key_spec placement_keys[] = {
    S("optimizer", placement_optimizer_sec),
    S("params", placement_params_sec),
};
static const section placement_sec = SECTION(placement_keys);

static const key_spec zoffload_keys[] = {
    I("device_mem", zoffload.device_mem, F_UNITS, 0, NO_MAX),
    I("host_mem", zoffload.host_mem, F_UNITS, 0, NO_MAX),
    I("chunk_size", zoffload.chunk_size, F_UNITS, 0, NO_MAX),
    I("tile_size", zoffload.tile_size, F_UNITS, 0, NO_MAX),
    B("recompute", zoffload.recompute),
    E("optimizer_mode", zoffload.optimizer_mode, 0, mode_names, ZO_OPTIM_SYNC),
    I("prefetch_lookahead", zoffload.prefetch_lookahead, 0, 0, 64),
    I("micro_group", zoffload.micro_group, 0, 1, 1 << 20),
    I("mlp_chunk_bytes", zoffload.mlp_chunk_bytes, F_UNITS | F_AUTO, 0, NO_MAX), /* 0: auto */
    E("act_home", zoffload.act_home, 0, act_home_names, 0),
    {"nvme_paths", K_PATHLIST, 0, 0, 0, 0, NULL, 0, NULL, NULL},
    E("optimizer_state_dtype", zoffload.optimizer_state_dtype, 0, state_dtype_names, ZO_DTYPE_F32),
    B("master_split", zoffload.master_split),
    B("update_behind", zoffload.update_behind),
    B("embedding_f32_states", zoffload.embedding_f32_states),
    B("sequence_parallel", zoffload.sequence_parallel),
    E("reduce_order", zoffload.reduce_order, 0, reduce_order_names, 0),
    {"placement", K_PLACEMENT, 0, 0, 0, 0, NULL, 0, &placement_sec, NULL},
    B("ignore_unsupported", zoffload.ignore_unsupported),
};
static const section zoffload_sec = SECTION(zoffload_keys);

/* DeepSpeed's activation checkpointing: zo-train's blocks always keep
 * only their inputs and recompute in the backward; cpu_checkpointing puts
 * those inputs in pinned host memory (zoffload.act_home host). */
static const key_spec activation_checkpointing_keys[] = {
    B("cpu_checkpointing", activation_checkpointing.cpu_checkpointing),
    X("partition_activations"),
    X("contiguous_memory_optimization"),
    X("number_checkpoints"),
    X("synchronize_checkpoint_boundary"),
    X("profile"),
};
static const section activation_checkpointing_sec = SECTION(activation_checkpointing_keys);

/* DeepSpeed's monitor sections that zo-train writes (config.h). */
static const key_spec tensorboard_keys[] = {
    B("enabled", tensorboard.enabled),
    P("output_path", tensorboard.output_path),
    P("job_name", tensorboard.job_name),
};
static const section tensorboard_sec = SECTION(tensorboard_keys);

static const key_spec csv_monitor_keys[] = {
    B("enabled", csv_monitor.enabled),
    P("output_path", csv_monitor.output_path),
    P("job_name", csv_monitor.job_name),
};
static const section csv_monitor_sec = SECTION(csv_monitor_keys);

static const key_spec root_keys[] = {
    I("train_batch_size", train_batch_size, F_AUTO | F_NULL, 1, NO_MAX),
    I("train_micro_batch_size_per_gpu", train_micro_batch_size_per_gpu, F_AUTO | F_NULL, 1, NO_MAX),
    I("gradient_accumulation_steps", gradient_accumulation_steps, F_AUTO | F_NULL, 1, NO_MAX),
    N("gradient_clipping", gradient_clipping, F_AUTO, 0, HUGE_VAL),
    I("steps_per_print", steps_per_print, 0, 1, NO_MAX),
    S("optimizer", optimizer_sec),
    S("scheduler", scheduler_sec),
    S("fp16", fp16_sec),
    S("bf16", bf16_sec),
    {"bfloat16", K_SECTION, 0, F_ALIAS, 0, 0, NULL, 0, &bf16_sec, NULL},
    S("zero_optimization", zero_sec),
    S("aio", aio_sec),
    S("pipeline", pipeline_sec),
    S("tensor_parallel", tensor_parallel_sec),
    S("zoffload", zoffload_sec),
    /* DeepSpeed features that do not apply to zoffload or that it does its
     * own way: accepted, with a warning when on. */
    X("wall_clock_breakdown"),
    X("memory_breakdown"),
    X("dump_state"),
    X("prescale_gradients"),
    X("gradient_predivide_factor"),
    X("gradient_allreduce_op"),
    X("sparse_gradients"),
    X("zero_allow_untested_optimizer"),
    X("zero_force_ds_cpu_optimizer"),
    X("communication_data_type"),
    X("seq_parallel_communication_data_type"),
    X("disable_allgather"),
    X("managed_gradient_accumulation"),
    S("activation_checkpointing", activation_checkpointing_sec),
    X("flops_profiler"),
    S("tensorboard", tensorboard_sec),
    X("wandb"),
    S("csv_monitor", csv_monitor_sec),
    X("comet"),
    X("comms_logger"),
    X("elasticity"),
    X("autotuning"),
    X("checkpoint"),
    X("data_types"),
    X("nebula"),
    X("datastates"),
    X("hybrid_engine"),
    X("load_universal_checkpoint"),
    X("use_node_local_storage"),
    X("graph_harvesting"),
    X("compile"),
    X("timers"),
    X("dataloader_drop_last"),
    X("weight_quantization"),
    X("log_level"),
    X("use_data_before_expert_parallelism"),
    X("data_parallel_size"),
    /* Features that change what training computes: refused when on, unless
     * zoffload.ignore_unsupported says to train without them. */
    U("amp", "NVIDIA Apex mixed precision", "'bf16' or 'fp16'", OFF_ENABLED),
    U("torch_autocast", "torch.autocast mixed precision", "'bf16' or 'fp16'", OFF_ENABLED),
    U("sequence_parallel_size", "sequence parallelism (Ulysses: all-to-all over the heads)",
      "'tensor_parallel.autotp_size' with 'zoffload.sequence_parallel' (Megatron's sequence "
      "parallelism inside the tensor-parallel group), or a longer --seq on one rank",
      OFF_SIZE),
    U("expert_parallel", "expert parallelism for mixture-of-experts models", NULL, OFF_ENABLED),
    U("compression_training", "quantization-aware training, pruning and layer reduction", NULL,
      OFF_ENABLED),
    U("data_efficiency", "curriculum learning and random-LTD", NULL, OFF_ENABLED),
    U("curriculum_learning", "curriculum learning (legacy)", NULL, OFF_ENABLED),
    U("progressive_layer_drop", "progressive layer dropping", NULL, OFF_ENABLED),
    U("quantize_training", "MoQ quantized training", "'zoffload.optimizer_state_dtype'",
      OFF_ENABLED),
    U("eigenvalue", "Hessian eigenvalue computation for MoQ", NULL, OFF_ENABLED),
    S("sparse_attention", sparse_attention_sec),
};
static const section root_sec = SECTION(root_keys);

/* ---- parse context and messages ---- */

typedef struct pctx {
    zo_train_config *cfg;
    char path[ZO_CONFIG_KEY_CAP * 2]; /* dotted path of the value being read */
    const json_t *obj;                /* the object holding it */
    int sec_auto;                     /* its section takes "auto" on every key */
    int ignore_unsupported;           /* zoffload.ignore_unsupported, read first */
} pctx;

static size_t path_push(pctx *c, const char *name)
{
    size_t len = strlen(c->path);
    snprintf(c->path + len, sizeof c->path - len, "%s%s", len ? "." : "", name);
    return len;
}

static void path_pop(pctx *c, size_t len)
{
    c->path[len] = '\0';
}

static size_t path_push_index(pctx *c, size_t i)
{
    size_t len = strlen(c->path);
    snprintf(c->path + len, sizeof c->path - len, "[%zu]", i);
    return len;
}

static void *field(pctx *c, const key_spec *k)
{
    return (char *)c->cfg + k->off;
}

static int shortest_precision(double v)
{
    char buf[40];
    for (int prec = 1; prec < 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return prec;
    }
    return 17;
}

/* The shortest decimal text that reads back as v (0.1, not 0.10000000000000001). */
static void fmt_double(char *buf, size_t cap, double v)
{
    snprintf(buf, cap, "%.*g", shortest_precision(v), v);
}

static void describe_found(const json_t *v, char *buf, size_t cap)
{
    switch (json_typeof(v)) {
    case JSON_INTEGER: snprintf(buf, cap, "%lld", (long long)json_integer_value(v)); break;
    case JSON_REAL: fmt_double(buf, cap, json_real_value(v)); break;
    case JSON_STRING: {
        const char *s = json_string_value(v);
        int n = (int)strnlen(s, 48);
        snprintf(buf, cap, "string \"%.*s%s\"", n, s, s[n] ? "..." : "");
        break;
    }
    case JSON_TRUE: snprintf(buf, cap, "true"); break;
    case JSON_FALSE: snprintf(buf, cap, "false"); break;
    case JSON_NULL: snprintf(buf, cap, "null"); break;
    case JSON_ARRAY: snprintf(buf, cap, "an array"); break;
    case JSON_OBJECT: snprintf(buf, cap, "an object"); break;
    }
}

static void describe_range(const key_spec *k, char *buf, size_t cap)
{
    char lo[32], hi[32];
    int is_int = k->kind == K_INT;
    const char *what = is_int ? "an integer" : "a number";
    if (is_int) {
        snprintf(lo, sizeof lo, "%lld", (long long)k->min);
        snprintf(hi, sizeof hi, "%lld", (long long)k->max);
    } else {
        fmt_double(lo, sizeof lo, k->min);
        fmt_double(hi, sizeof hi, k->max);
    }
    int unbounded = is_int ? k->max >= NO_MAX : isinf(k->max);
    if (unbounded)
        snprintf(buf, cap, "%s %s %s", what, (k->flags & F_MIN_EXCL) ? ">" : ">=", lo);
    else
        snprintf(buf, cap, "%s in %s%s, %s%s", what, (k->flags & F_MIN_EXCL) ? "(" : "[", lo, hi,
                 (k->flags & F_MAX_EXCL) ? ")" : "]");
}

static void describe_expected(const key_spec *k, char *buf, size_t cap)
{
    size_t n = 0;
    switch (k->kind) {
    case K_BOOL: n = (size_t)snprintf(buf, cap, "true or false"); break;
    case K_FALSE_ONLY:
        n = (size_t)snprintf(buf, cap, "false (the true variant is not supported)");
        break;
    case K_INT:
    case K_NUM:
        describe_range(k, buf, cap);
        n = strlen(buf);
        if (k->flags & F_UNITS)
            n += (size_t)snprintf(buf + n, cap - n, " (bytes, or a string such as \"24GiB\")");
        break;
    case K_ENUM:
        n = (size_t)snprintf(buf, cap, "one of");
        for (size_t i = 0; k->names[i] && n < cap; i++)
            n += (size_t)snprintf(buf + n, cap - n, "%s %s", i ? "," : "", k->names[i]);
        break;
    case K_PATH: n = (size_t)snprintf(buf, cap, "a path string"); break;
    case K_BETAS: n = (size_t)snprintf(buf, cap, "an array of two numbers in [0, 1)"); break;
    case K_PATHLIST:
        n = (size_t)snprintf(buf, cap, "an array of at most %d path strings",
                             ZO_CONFIG_MAX_NVME_PATHS);
        break;
    case K_CPU_OFFLOAD: n = (size_t)snprintf(buf, cap, "true or false"); break;
    case K_SECTION:
    case K_SCHED_PARAMS:
    case K_UNSUPPORTED:
    case K_IGNORED: n = (size_t)snprintf(buf, cap, "an object"); break;
    case K_PLACEMENT:
        n = (size_t)snprintf(buf, cap,
                             "\"auto\" or an object of per-tier byte caps, such as "
                             "{\"optimizer\": {\"host\": \"8GiB\"}}");
        break;
    }
    if (n < cap && (k->flags & F_AUTO))
        n += (size_t)snprintf(buf + n, cap - n, " or \"auto\"");
    if (n < cap && (k->flags & F_NULL))
        snprintf(buf + n, cap - n, " or null");
}

static zo_status type_error(pctx *c, const key_spec *k, const json_t *v)
{
    char exp[256], found[96];
    describe_expected(k, exp, sizeof exp);
    describe_found(v, found, sizeof found);
    return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS, "'%s': expected %s, found %s", c->path, exp, found);
}

static zo_status unknown_key(pctx *c, const section *sec, const char *key)
{
    const char *cands[128];
    size_t n = 0;
    for (size_t i = 0; i < sec->n && n < 128; i++)
        cands[n++] = sec->keys[i].name;
    size_t d = 0;
    long best = zo_strdist_nearest(key, cands, n, &d);
    size_t len = path_push(c, key);
    zo_status st;
    if (best < 0)
        st = ZO_FAIL(ZO_ERR_CONFIG, SUBSYS, "unknown key '%s'", c->path);
    else if (zo_strdist_is_close(key, d))
        st = ZO_FAIL(ZO_ERR_CONFIG, SUBSYS, "unknown key '%s'; did you mean '%s'?", c->path,
                     cands[best]);
    else
        st = ZO_FAIL(ZO_ERR_CONFIG, SUBSYS, "unknown key '%s'; the nearest valid key is '%s'",
                     c->path, cands[best]);
    path_pop(c, len);
    return st;
}

static void remember(char (*list)[ZO_CONFIG_KEY_CAP], int64_t *n, const char *path)
{
    if (*n < ZO_CONFIG_MAX_IGNORED)
        snprintf(list[(*n)++], ZO_CONFIG_KEY_CAP, "%.*s", (int)ZO_CONFIG_KEY_CAP - 1, path);
}

static void note_ignored(pctx *c)
{
    ZO_LOGW(SUBSYS, "'%s' is a DeepSpeed option that has no effect in zoffload; ignored", c->path);
    remember(c->cfg->ignored, &c->cfg->n_ignored, c->path);
}

/* -1: no "enabled" key inside v; else whether any of them is true. */
static int nested_enabled(const json_t *v)
{
    if (!json_is_object(v))
        return -1;
    const json_t *e = json_object_get(v, "enabled");
    if (e)
        return json_is_true(e);
    int found = -1;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val)
    {
        int r = nested_enabled(val);
        if (r == 1)
            return 1;
        if (r == 0)
            found = 0;
    }
    return found;
}

/* Sizes above 1 anywhere in v (the parallel degrees). */
static int size_active(const json_t *v)
{
    if (json_is_number(v))
        return json_number_value(v) > 1;
    if (!json_is_object(v))
        return 0;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val)
    {
        if (size_active(val))
            return 1;
    }
    return 0;
}

/* Whether v turns its feature on: off values are accepted silently. */
static int is_active(const json_t *v, off_rule r)
{
    if (r == OFF_NEVER)
        return 1;
    if (r == OFF_SIZE)
        return size_active(v);
    if (json_is_object(v)) {
        int e = nested_enabled(v);
        return e < 0 ? json_object_size(v) > 0 : e;
    }
    if (json_is_number(v))
        return json_number_value(v) != 0;
    if (json_is_array(v))
        return json_array_size(v) > 0;
    return !json_is_false(v) && !json_is_null(v);
}

/* A key with no effect here: silent when it asks for nothing, or for
 * DeepSpeed's default true. */
static void read_ignored(pctx *c, const key_spec *k, const json_t *v)
{
    if ((k->flags & F_TRUE_DEF) && json_is_true(v))
        return;
    if (is_active(v, OFF_ENABLED))
        note_ignored(c);
}

static zo_status read_unsupported(pctx *c, const key_spec *k, const json_t *v)
{
    const feature *f = k->feat;
    if (!is_active(v, f->off))
        return ZO_OK;
    if (f->off == OFF_NEVER)
        return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS, "'%s' is not supported by zoffload (%s); use %s",
                       c->path, f->what, f->instead);
    if (c->ignore_unsupported) {
        ZO_LOGW(SUBSYS,
                "'%s' (%s) is not supported by zoffload; training without it, as "
                "'zoffload.ignore_unsupported' asks",
                c->path, f->what);
        remember(c->cfg->ignored, &c->cfg->n_ignored, c->path);
        return ZO_OK;
    }
    return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS,
                   "'%s' is on, but %s is not supported by zoffload%s%s; remove it or turn it "
                   "off, or set 'zoffload.ignore_unsupported' to true to train without it",
                   c->path, f->what, f->instead ? "; the nearest it has is " : "",
                   f->instead ? f->instead : "");
}

/* DeepSpeed's deprecated cpu_offload / cpu_offload_param: true means the
 * section's device "cpu" (optimizer states and the optimizer step on the
 * host), and giving it with the section it replaces is an error there too. */
static zo_status read_cpu_offload(pctx *c, const key_spec *k, const json_t *v)
{
    const char *sec = k->off == OFF(zero_optimization.offload_optimizer.device)
                          ? "offload_optimizer"
                          : "offload_param";
    if (json_is_null(v) || json_is_false(v))
        return ZO_OK;
    if (!json_is_true(v))
        return type_error(c, k, v);
    if (json_object_get(c->obj, sec))
        return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS,
                       "'%s' (deprecated) and 'zero_optimization.%s' are both given; give only "
                       "'zero_optimization.%s'",
                       c->path, sec, sec);
    ZO_LOGW(SUBSYS, "'%s' is deprecated: it means 'zero_optimization.%s.device' \"cpu\"", c->path,
            sec);
    zo_offload_device d = ZO_OFFLOAD_CPU;
    memcpy(field(c, k), &d, sizeof d);
    return ZO_OK;
}

/* ---- scalar readers ---- */

static int is_auto(const json_t *v)
{
    return json_is_string(v) && strcmp(json_string_value(v), "auto") == 0;
}

static int in_range(const key_spec *k, double x)
{
    if ((k->flags & F_MIN_EXCL) ? x <= k->min : x < k->min)
        return 0;
    if ((k->flags & F_MAX_EXCL) ? x >= k->max : x > k->max)
        return 0;
    return 1;
}

/* "24GiB", "512 MiB", "1.5GB", "4096": bytes (zo_parse_bytes), or -1 when
 * malformed. */
static double parse_byte_string(const char *s)
{
    uint64_t b;
    return zo_parse_bytes(s, &b) == ZO_OK ? (double)b : -1;
}

static zo_status read_int(pctx *c, const key_spec *k, const json_t *v)
{
    double x;
    if (json_is_integer(v))
        x = (double)json_integer_value(v);
    else if (json_is_real(v))
        x = json_real_value(v);
    else if ((k->flags & F_UNITS) && json_is_string(v))
        x = parse_byte_string(json_string_value(v));
    else
        return type_error(c, k, v);
    if (!isfinite(x) || x != floor(x) || !in_range(k, x))
        return type_error(c, k, v);
    /* Integers arrive exactly through json_integer_value; reals are integral
     * and in range here, so the conversion is defined. */
    int64_t out = json_is_integer(v) ? (int64_t)json_integer_value(v) : (int64_t)x;
    memcpy(field(c, k), &out, sizeof out);
    return ZO_OK;
}

static zo_status read_num(pctx *c, const key_spec *k, const json_t *v)
{
    if (!json_is_number(v))
        return type_error(c, k, v);
    double x = json_number_value(v);
    if (!in_range(k, x))
        return type_error(c, k, v);
    memcpy(field(c, k), &x, sizeof x);
    return ZO_OK;
}

static zo_status read_bool(pctx *c, const key_spec *k, const json_t *v)
{
    if (!json_is_boolean(v))
        return type_error(c, k, v);
    int b = json_is_true(v);
    memcpy(field(c, k), &b, sizeof b);
    return ZO_OK;
}

/* An optimizer or schedule DeepSpeed has and zoffload does not (OneBitAdam,
 * Lamb, OneCycle...) is named as such; a near-miss of a name it has is
 * left to the type error, which lists them. */
static zo_status unsupported_type(pctx *c, const key_spec *k, const json_t *v)
{
    const char *s = json_string_value(v);
    size_t n = 0, d = 0;
    while (k->names[n])
        n++;
    if (!s || (k->names != optimizer_names && k->names != scheduler_names) ||
        (zo_strdist_nearest(s, k->names, n, &d) >= 0 && zo_strdist_is_close(s, d)))
        return type_error(c, k, v);
    if (k->names == optimizer_names)
        return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS,
                       "'%s' \"%.64s\" is not supported by zoffload, which trains with Adam and "
                       "AdamW (its CPU Adam); use \"AdamW\"",
                       c->path, s);
    return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS,
                   "'%s' \"%.64s\" is not supported by zoffload; its schedules are WarmupLR, "
                   "WarmupDecayLR and WarmupCosineLR",
                   c->path, s);
}

static zo_status read_enum(pctx *c, const key_spec *k, const json_t *v)
{
    if (!json_is_string(v))
        return type_error(c, k, v);
    const char *s = json_string_value(v);
    for (int i = 0; k->names[i]; i++) {
        int eq =
            (k->flags & F_ICASE) ? strcasecmp(s, k->names[i]) == 0 : strcmp(s, k->names[i]) == 0;
        if (eq) {
            int val = enum_value(k, i);
            memcpy(field(c, k), &val, sizeof val);
            return ZO_OK;
        }
    }
    return unsupported_type(c, k, v);
}

static zo_status copy_path(pctx *c, const key_spec *k, const json_t *v, char *dst)
{
    if (!json_is_string(v) || json_string_length(v) == 0)
        return type_error(c, k, v);
    if (json_string_length(v) >= ZO_CONFIG_PATH_CAP ||
        strlen(json_string_value(v)) != json_string_length(v))
        return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS,
                       "'%s': expected a path string shorter than %d bytes without NUL characters, "
                       "found one of %zu bytes",
                       c->path, ZO_CONFIG_PATH_CAP, json_string_length(v));
    memcpy(dst, json_string_value(v), json_string_length(v) + 1);
    return ZO_OK;
}

static zo_status read_path(pctx *c, const key_spec *k, const json_t *v)
{
    return copy_path(c, k, v, field(c, k));
}

static zo_status read_betas(pctx *c, const key_spec *k, const json_t *v)
{
    if (!json_is_array(v) || json_array_size(v) != 2)
        return type_error(c, k, v);
    double b[2];
    for (size_t i = 0; i < 2; i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_number(e))
            return type_error(c, k, v);
        b[i] = json_number_value(e);
        if (!(b[i] >= 0 && b[i] < 1)) {
            char found[64];
            describe_found(e, found, sizeof found);
            return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS,
                           "'%s[%zu]': expected a number in [0, 1), found %s", c->path, i, found);
        }
    }
    memcpy(field(c, k), b, sizeof b);
    return ZO_OK;
}

static zo_status read_pathlist(pctx *c, const key_spec *k, const json_t *v)
{
    static const key_spec elem = {"", K_PATH, 0, 0, 0, 0, NULL, 0, NULL, NULL};
    size_t n = json_array_size(v);
    if (!json_is_array(v) || n > ZO_CONFIG_MAX_NVME_PATHS)
        return type_error(c, k, v);
    zo_train_config *cfg = c->cfg;
    for (size_t i = 0; i < n; i++) {
        size_t len = path_push_index(c, i);
        zo_status st = copy_path(c, &elem, json_array_get(v, i), cfg->zoffload.nvme_paths[i]);
        path_pop(c, len);
        if (st < 0)
            return st;
    }
    cfg->zoffload.n_nvme_paths = (int64_t)n;
    return ZO_OK;
}

static zo_status read_false_only(pctx *c, const key_spec *k, const json_t *v)
{
    return json_is_false(v) ? ZO_OK : type_error(c, k, v);
}

/* ---- sections ---- */

static zo_status parse_section(pctx *c, const section *sec, const json_t *obj);

static const key_spec *find_key(const section *sec, const char *name)
{
    for (size_t i = 0; i < sec->n; i++)
        if (strcmp(sec->keys[i].name, name) == 0)
            return &sec->keys[i];
    return NULL;
}

/* A key of another scheduler type gets a message naming the type. */
static zo_status wrong_sched_param(pctx *c, const section *sec, const char *key)
{
    const char *type = scheduler_names[c->cfg->scheduler.type - ZO_SCHEDULER_WARMUP_LR];
    char list[256];
    size_t n = 0;
    for (size_t i = 0; i < sec->n && n < sizeof list; i++)
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", sec->keys[i].name);
    size_t len = path_push(c, key);
    zo_status st =
        ZO_FAIL(ZO_ERR_CONFIG, SUBSYS, "'%s' is not a parameter of %s (its parameters: %s)",
                c->path, type, list);
    path_pop(c, len);
    return st;
}

static zo_status parse_sched_params(pctx *c, const json_t *v)
{
    const section *sec = &sched_params_secs[c->cfg->scheduler.type - ZO_SCHEDULER_WARMUP_LR];
    if (!json_is_object(v)) {
        static const key_spec obj = {"params", K_SCHED_PARAMS, 0, 0, 0, 0, NULL, 0, NULL, NULL};
        return type_error(c, &obj, v);
    }
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)v, key, val)
    {
        if (find_key(sec, key))
            continue;
        for (size_t t = 0; t < 3; t++)
            if (find_key(&sched_params_secs[t], key))
                return wrong_sched_param(c, sec, key);
    }
    return parse_section(c, sec, v);
}

static zo_status parse_value(pctx *c, const key_spec *k, const json_t *v)
{
    if (((k->flags & F_AUTO) || c->sec_auto) && is_auto(v)) {
        remember(c->cfg->auto_keys, &c->cfg->n_auto, c->path);
        return ZO_OK;
    }
    if (k->kind == K_UNSUPPORTED)
        return read_unsupported(c, k, v);
    if (k->kind == K_IGNORED) {
        read_ignored(c, k, v);
        return ZO_OK;
    }
    if ((k->flags & F_NULL) && json_is_null(v))
        return ZO_OK;
    switch (k->kind) {
    case K_BOOL: return read_bool(c, k, v);
    case K_INT: return read_int(c, k, v);
    case K_NUM: return read_num(c, k, v);
    case K_ENUM: return read_enum(c, k, v);
    case K_PATH: return read_path(c, k, v);
    case K_BETAS: return read_betas(c, k, v);
    case K_PATHLIST: return read_pathlist(c, k, v);
    case K_FALSE_ONLY: return read_false_only(c, k, v);
    case K_CPU_OFFLOAD: return read_cpu_offload(c, k, v);
    case K_SCHED_PARAMS: return parse_sched_params(c, v);
    case K_SECTION:
        if (!json_is_object(v))
            return type_error(c, k, v);
        return parse_section(c, k->sub, v);
    case K_PLACEMENT:
        c->cfg->zoffload.placement.is_auto = is_auto(v);
        if (is_auto(v))
            return ZO_OK;
        if (!json_is_object(v))
            return type_error(c, k, v);
        return parse_section(c, k->sub, v);
    case K_IGNORED:
    case K_UNSUPPORTED: break;
    }
    return ZO_OK;
}

static zo_status parse_key(pctx *c, const key_spec *k, const json_t *v)
{
    size_t len = path_push(c, k->name);
    zo_status st = parse_value(c, k, v);
    path_pop(c, len);
    return st;
}

/* Unknown keys first (in file order), then the values in schema order, so
 * that "type" is known before the "params" that depend on it. */
static zo_status parse_keys(pctx *c, const section *sec, const json_t *obj);

static zo_status parse_section(pctx *c, const section *sec, const json_t *obj)
{
    const json_t *outer = c->obj;
    int outer_auto = c->sec_auto;
    c->obj = obj;
    c->sec_auto = sec->auto_any;
    zo_status st = parse_keys(c, sec, obj);
    c->obj = outer;
    c->sec_auto = outer_auto;
    return st;
}

/* DeepSpeed reads the top level key by key and ignores the rest, so a key
 * there that is no near-miss of a real one (a "_comment", another tool's
 * setting) is only warned about; a likely typo is still an error. */
static int unknown_top_key_is_harmless(pctx *c, const section *sec, const char *key)
{
    if (sec != &root_sec)
        return 0;
    const char *cands[128];
    size_t n = 0, d = 0;
    for (size_t i = 0; i < sec->n && n < 128; i++)
        cands[n++] = sec->keys[i].name;
    if (zo_strdist_nearest(key, cands, n, &d) >= 0 && zo_strdist_is_close(key, d))
        return 0;
    ZO_LOGW(SUBSYS, "unknown top-level key '%s' ignored (it is no DeepSpeed key zoffload knows)",
            key);
    remember(c->cfg->ignored, &c->cfg->n_ignored, key);
    return 1;
}

/* An alias given with the key it names would leave the value ambiguous. */
static zo_status check_alias_pair(pctx *c, const section *sec, size_t i, const json_t *obj)
{
    const key_spec *k = &sec->keys[i];
    if (!(k->flags & F_ALIAS) || i == 0 || k->kind == K_SECTION ||
        !json_object_get(obj, sec->keys[i - 1].name))
        return ZO_OK;
    size_t len = path_push(c, k->name);
    zo_status st =
        ZO_FAIL(ZO_ERR_CONFIG, SUBSYS, "'%s' and '%s' name the same setting; give only one",
                c->path, sec->keys[i - 1].name);
    path_pop(c, len);
    return st;
}

static zo_status parse_keys(pctx *c, const section *sec, const json_t *obj)
{
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)obj, key, val)
    {
        if (!find_key(sec, key) && !unknown_top_key_is_harmless(c, sec, key))
            return unknown_key(c, sec, key);
    }
    for (size_t i = 0; i < sec->n; i++) {
        const key_spec *k = &sec->keys[i];
        const json_t *v = json_object_get(obj, k->name);
        if (v) {
            ZO_TRY(check_alias_pair(c, sec, i, obj));
            ZO_TRY(parse_key(c, k, v));
        } else if (k->flags & F_REQUIRED) {
            size_t len = path_push(c, k->name);
            char exp[128];
            describe_expected(k, exp, sizeof exp);
            zo_status st = ZO_FAIL(ZO_ERR_CONFIG, SUBSYS, "'%s' is required: %s", c->path, exp);
            path_pop(c, len);
            return st;
        }
    }
    return ZO_OK;
}

/* ---- cross-key rules ---- */

/* DeepSpeed's _set_batch_related_parameters, case by case. */
static zo_status derive_batch_sizes(zo_train_config *cfg)
{
    int64_t tb = cfg->train_batch_size, mb = cfg->train_micro_batch_size_per_gpu;
    int64_t ga = cfg->gradient_accumulation_steps, w = cfg->world_size;
    if (tb && mb && ga) {
        /* all given: checked below */
    } else if (tb && mb) {
        ga = tb / mb / w;
    } else if (tb && ga) {
        mb = tb / w / ga;
    } else if (mb && ga) {
        if (mb > INT64_MAX / ga / w)
            return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS,
                           "train_micro_batch_size_per_gpu * gradient_accumulation_steps * "
                           "world_size overflows: %lld * %lld * %lld",
                           (long long)mb, (long long)ga, (long long)w);
        tb = mb * ga * w;
    } else if (tb) {
        ga = 1;
        mb = tb / w;
    } else if (mb) {
        if (mb > INT64_MAX / w)
            return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS,
                           "train_micro_batch_size_per_gpu * world_size overflows");
        ga = 1;
        tb = mb * w;
    } else {
        return ZO_FAIL(
            ZO_ERR_CONFIG, SUBSYS,
            "either 'train_batch_size' or 'train_micro_batch_size_per_gpu' must be given");
    }
    if (mb < 1)
        return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS,
                       "train_micro_batch_size_per_gpu derived as %lld, which is < 1 "
                       "(train_batch_size %lld, gradient_accumulation_steps %lld, world_size %lld)",
                       (long long)mb, (long long)tb, (long long)ga, (long long)w);
    if (ga < 1)
        return ZO_FAIL(
            ZO_ERR_CONFIG, SUBSYS,
            "gradient_accumulation_steps derived as %lld, which is < 1 "
            "(train_batch_size %lld, train_micro_batch_size_per_gpu %lld, world_size %lld)",
            (long long)ga, (long long)tb, (long long)mb, (long long)w);
    if (mb > INT64_MAX / ga / w || tb != mb * ga * w)
        return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS,
                       "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * "
                       "world_size: %lld != %lld * %lld * %lld",
                       (long long)tb, (long long)mb, (long long)ga, (long long)w);
    cfg->train_batch_size = tb;
    cfg->train_micro_batch_size_per_gpu = mb;
    cfg->gradient_accumulation_steps = ga;
    return ZO_OK;
}

static zo_status check_nvme_path(const zo_train_config *cfg, const char *which,
                                 zo_offload_device dev, const char *path)
{
    if (dev != ZO_OFFLOAD_NVME || path[0] || cfg->zoffload.n_nvme_paths > 0)
        return ZO_OK;
    return ZO_FAIL(
        ZO_ERR_CONFIG, SUBSYS,
        "'zero_optimization.%s.nvme_path' is required when "
        "'zero_optimization.%s.device' is 'nvme' (or list drives in 'zoffload.nvme_paths')",
        which, which);
}

/* What DeepSpeed's sparsity configs refuse, and bidirectional attention,
 * which a causal decoder cannot use. */
static zo_status check_sparse_attention(const zo_train_config *cfg)
{
    const zo_sparse_attention_config *sa = &cfg->sparse_attention;
    if (!sa->enabled)
        return ZO_OK;
    if (sa->bidirectional)
        return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS,
                       "'sparse_attention.attention' is \"bidirectional\" (DeepSpeed's default, "
                       "BERT's); zo-train's models are causal decoders: set \"unidirectional\"");
    if (sa->block % 16)
        return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS,
                       "'sparse_attention.block' %lld must be a multiple of 16 (16..512)",
                       (long long)sa->block);
    if (sa->mode == ZO_SPARSE_FIXED &&
        (sa->num_global_blocks < 1 || sa->num_local_blocks % sa->num_global_blocks))
        return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS,
                       "'sparse_attention.num_local_blocks' %lld must be a multiple of "
                       "'num_global_blocks' %lld (>= 1) in mode fixed, as DeepSpeed requires",
                       (long long)sa->num_local_blocks, (long long)sa->num_global_blocks);
    return ZO_OK;
}

static zo_status check_rules(zo_train_config *cfg)
{
    ZO_TRY(check_sparse_attention(cfg));
    if (cfg->fp16.enabled && cfg->bf16.enabled)
        return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS,
                       "'fp16.enabled' and 'bf16.enabled' are both true; enable at most one");
    ZO_TRY(check_nvme_path(cfg, "offload_optimizer",
                           cfg->zero_optimization.offload_optimizer.device,
                           cfg->zero_optimization.offload_optimizer.nvme_path));
    ZO_TRY(check_nvme_path(cfg, "offload_param", cfg->zero_optimization.offload_param.device,
                           cfg->zero_optimization.offload_param.nvme_path));
    zo_scheduler_type t = cfg->scheduler.type;
    if ((t == ZO_SCHEDULER_WARMUP_DECAY_LR || t == ZO_SCHEDULER_WARMUP_COSINE_LR) &&
        cfg->scheduler.total_num_steps == 0)
        return ZO_FAIL(
            ZO_ERR_CONFIG, SUBSYS,
            "'scheduler.params.total_num_steps' is required by %s (set it in the file or "
            "on the command line)",
            zo_scheduler_type_name(t));
    cfg->optimizer.decoupled_weight_decay =
        cfg->optimizer.type == ZO_OPTIMIZER_ADAMW || cfg->optimizer.adam_w_mode;
    return derive_batch_sizes(cfg);
}

/* DeepSpeed's WarmupLR and WarmupDecayLR rise to the optimizer's lr when
 * warmup_max_lr is absent (lr_schedules.py), and Hugging Face fills its
 * "auto" with the same learning rate. */
static void default_max_lr(zo_train_config *cfg, const json_t *doc)
{
    const json_t *v = json_object_get(json_object_get(json_object_get(doc, "scheduler"), "params"),
                                      "warmup_max_lr");
    if (!json_is_number(v))
        cfg->scheduler.warmup_max_lr = cfg->optimizer.lr;
}

/* ---- the document object ---- */

struct zo_config {
    json_t *doc;       /* the loaded object */
    json_t *overrides; /* [[key, value], ...] in the order given */
    char origin[ZO_CONFIG_PATH_CAP];
};

zo_status zo_config_init(zo_config_t *out)
{
    if (!out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_config_init: out is NULL");
    pthread_once(&state_dtypes_once, load_state_dtypes);
    struct zo_config *c = calloc(1, sizeof *c);
    json_t *doc = json_object(), *ov = json_array();
    if (!c || !doc || !ov) {
        free(c);
        json_decref(doc);
        json_decref(ov);
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "zo_config_init: out of host memory");
    }
    c->doc = doc;
    c->overrides = ov;
    snprintf(c->origin, sizeof c->origin, "<empty>");
    *out = c;
    return ZO_OK;
}

void zo_config_free(zo_config_t c)
{
    if (!c)
        return;
    json_decref(c->doc);
    json_decref(c->overrides);
    free(c);
}

static zo_status adopt_doc(zo_config_t c, json_t *doc, const json_error_t *err, const char *origin)
{
    if (!doc) {
        if (json_error_code(err) == json_error_cannot_open_file)
            return ZO_FAIL(ZO_ERR_NOT_FOUND, SUBSYS, "cannot read config: %s", err->text);
        if (json_error_code(err) == json_error_out_of_memory)
            return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "%s: out of host memory while parsing",
                           origin);
        return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS, "%s:%d:%d: invalid JSON: %s", origin, err->line,
                       err->column, err->text);
    }
    if (!json_is_object(doc)) {
        char found[96];
        describe_found(doc, found, sizeof found);
        json_decref(doc);
        return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS, "%s: the top level must be a JSON object, found %s",
                       origin, found);
    }
    json_decref(c->doc);
    c->doc = doc;
    snprintf(c->origin, sizeof c->origin, "%s", origin);
    return ZO_OK;
}

zo_status zo_config_load_file(zo_config_t c, const char *path)
{
    if (!c || !path)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_config_load_file: NULL argument");
    int fd;
    ZO_TRY(zo_file_open_read(path, &fd)); /* a FIFO or a directory refused by name */
    json_error_t err;
    json_t *doc = json_loadfd(fd, JSON_REJECT_DUPLICATES, &err);
    close(fd);
    return adopt_doc(c, doc, &err, path);
}

zo_status zo_config_load_string(zo_config_t c, const char *text, const char *origin)
{
    if (!c || !text)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_config_load_string: NULL argument");
    json_error_t err;
    json_t *doc = json_loads(text, JSON_REJECT_DUPLICATES, &err);
    return adopt_doc(c, doc, &err, origin ? origin : "<string>");
}

static zo_status check_key_path(const char *key)
{
    size_t n = strlen(key);
    if (n == 0 || n >= ZO_CONFIG_KEY_CAP || key[0] == '.' || key[n - 1] == '.' || strstr(key, ".."))
        return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS,
                       "override key '%s': expected a dotted path such as "
                       "'zero_optimization.offload_optimizer.device'",
                       key);
    return ZO_OK;
}

zo_status zo_config_set(zo_config_t c, const char *key, const char *value)
{
    if (!c || !key || !value)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_config_set: NULL argument");
    ZO_TRY(check_key_path(key));
    json_t *v = json_loads(value, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
    if (!v)
        v = json_string(value);
    json_t *pair = v ? json_pack("[so]", key, v) : NULL; /* steals v, even on failure */
    if (!pair || json_array_append_new(c->overrides, pair) < 0) {
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "zo_config_set: out of host memory");
    }
    return ZO_OK;
}

zo_status zo_config_set_arg(zo_config_t c, const char *assignment)
{
    if (!c || !assignment)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_config_set_arg: NULL argument");
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment || (size_t)(eq - assignment) >= ZO_CONFIG_KEY_CAP)
        return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS,
                       "override '%s': expected KEY=VALUE, e.g. 'fp16.enabled=true'", assignment);
    char key[ZO_CONFIG_KEY_CAP];
    memcpy(key, assignment, (size_t)(eq - assignment));
    key[eq - assignment] = '\0';
    return zo_config_set(c, key, eq + 1);
}

/* Set doc[a][b][c] = value for key "a.b.c", creating objects on the way. */
static zo_status apply_override(json_t *doc, const char *key, json_t *value)
{
    char buf[ZO_CONFIG_KEY_CAP];
    snprintf(buf, sizeof buf, "%s", key);
    json_t *obj = doc;
    char *save = NULL;
    char *seg = strtok_r(buf, ".", &save);
    for (char *next = strtok_r(NULL, ".", &save); next; next = strtok_r(NULL, ".", &save)) {
        json_t *child = json_object_get(obj, seg);
        if (!child) {
            child = json_object();
            if (!child || json_object_set_new(obj, seg, child) < 0)
                return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "override '%s': out of host memory", key);
        } else if (!json_is_object(child)) {
            char found[96];
            describe_found(child, found, sizeof found);
            return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS,
                           "override '%s': '%s' in the config is %s, not an object", key, seg,
                           found);
        }
        obj = child;
        seg = next;
    }
    if (json_object_set(obj, seg, value) < 0)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "override '%s': out of host memory", key);
    return ZO_OK;
}

static zo_status apply_overrides(zo_config_t c, json_t *doc)
{
    size_t i;
    json_t *pair;
    json_array_foreach(c->overrides, i, pair)
    {
        ZO_TRY(apply_override(doc, json_string_value(json_array_get(pair, 0)),
                              json_array_get(pair, 1)));
    }
    return ZO_OK;
}

zo_status zo_config_resolve(zo_config_t c, int64_t world_size, zo_train_config *out)
{
    if (!c || !out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_config_resolve: NULL argument");
    if (out->struct_size != sizeof(zo_train_config))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "zo_config_resolve: struct_size is %zu, expected %zu (initialize the config "
                       "with ZO_TRAIN_CONFIG_INIT)",
                       out->struct_size, sizeof(zo_train_config));
    if (world_size < 1 || world_size > (1 << 24))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "zo_config_resolve: world_size %lld is not in [1, 16777216]",
                       (long long)world_size);
    json_t *doc = json_deep_copy(c->doc);
    zo_train_config *cfg = malloc(sizeof *cfg);
    if (!doc || !cfg) {
        json_decref(doc);
        free(cfg);
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "zo_config_resolve: out of host memory");
    }
    *cfg = (zo_train_config)ZO_TRAIN_CONFIG_INIT;
    cfg->world_size = world_size;
    pctx ctx = {.cfg = cfg};
    zo_status st = apply_overrides(c, doc);
    ctx.ignore_unsupported =
        json_is_true(json_object_get(json_object_get(doc, "zoffload"), "ignore_unsupported"));
    if (st == ZO_OK)
        st = parse_section(&ctx, &root_sec, doc);
    if (st == ZO_OK)
        default_max_lr(cfg, doc);
    cfg->sparse_attention.enabled = json_is_object(json_object_get(doc, "sparse_attention"));
    if (st == ZO_OK)
        st = check_rules(cfg);
    if (st == ZO_OK)
        *out = *cfg;
    json_decref(doc);
    free(cfg);
    return st;
}

zo_status zo_train_config_load(const char *path, int64_t world_size, zo_train_config *out)
{
    zo_config_t c = NULL;
    ZO_TRY(zo_config_init(&c));
    zo_status st = zo_config_load_file(c, path);
    if (st == ZO_OK)
        st = zo_config_resolve(c, world_size, out);
    zo_config_free(c);
    return st;
}

/* ---- serialization: the same tables, read the other way ---- */

static json_t *emit_section(const zo_train_config *cfg, const section *sec);

/* A caller-built struct may hold values no JSON name stands for. */
static zo_status check_enums(pctx *c, const section *sec)
{
    for (size_t i = 0; i < sec->n; i++) {
        const key_spec *k = &sec->keys[i];
        size_t len = path_push(c, k->name);
        zo_status st = ZO_OK;
        if (k->kind == K_ENUM) {
            int v;
            memcpy(&v, field(c, k), sizeof v);
            int ok = enum_index(k, v) >= 0;
            if (k->sub == NULL && k->off == OFF(scheduler.type) && v == ZO_SCHEDULER_NONE)
                ok = 1;
            if (!ok)
                st = ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                             "'%s' holds %d, which is not a valid value", c->path, v);
        } else if (k->kind == K_SECTION && !(k->flags & F_ALIAS)) {
            st = check_enums(c, k->sub);
        } else if (k->kind == K_SCHED_PARAMS && c->cfg->scheduler.type != ZO_SCHEDULER_NONE) {
            st =
                check_enums(c, &sched_params_secs[c->cfg->scheduler.type - ZO_SCHEDULER_WARMUP_LR]);
        } else if (k->kind == K_PATHLIST &&
                   (c->cfg->zoffload.n_nvme_paths < 0 ||
                    c->cfg->zoffload.n_nvme_paths > ZO_CONFIG_MAX_NVME_PATHS)) {
            st = ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                         "'zoffload.n_nvme_paths' is %lld, not in [0, %d]",
                         (long long)c->cfg->zoffload.n_nvme_paths, ZO_CONFIG_MAX_NVME_PATHS);
        }
        path_pop(c, len);
        if (st < 0)
            return st;
    }
    return ZO_OK;
}

static json_t *emit_pathlist(const zo_train_config *cfg)
{
    json_t *a = json_array();
    for (int64_t i = 0; a && i < cfg->zoffload.n_nvme_paths; i++)
        json_array_append_new(a, json_string(cfg->zoffload.nvme_paths[i]));
    return a;
}

static json_t *emit_value(const zo_train_config *cfg, const key_spec *k)
{
    const void *f = (const char *)cfg + k->off;
    int iv;
    int64_t lv;
    double dv;
    switch (k->kind) {
    case K_BOOL: memcpy(&iv, f, sizeof iv); return json_boolean(iv);
    case K_INT: memcpy(&lv, f, sizeof lv); return json_integer(lv);
    case K_NUM: memcpy(&dv, f, sizeof dv); return json_real(dv);
    case K_ENUM: memcpy(&iv, f, sizeof iv); return json_string(k->names[enum_index(k, iv)]);
    case K_PATH: return *(const char *)f ? json_string(f) : json_null();
    case K_BETAS: return json_pack("[ff]", cfg->optimizer.betas[0], cfg->optimizer.betas[1]);
    case K_PATHLIST: return emit_pathlist(cfg);
    case K_SECTION: return emit_section(cfg, k->sub);
    case K_PLACEMENT:
        return cfg->zoffload.placement.is_auto ? json_string("auto") : emit_section(cfg, k->sub);
    case K_SCHED_PARAMS:
        return emit_section(cfg, &sched_params_secs[cfg->scheduler.type - ZO_SCHEDULER_WARMUP_LR]);
    case K_FALSE_ONLY: return json_false();
    case K_IGNORED:
    case K_UNSUPPORTED:
    case K_CPU_OFFLOAD: break;
    }
    return NULL;
}

static json_t *emit_section(const zo_train_config *cfg, const section *sec)
{
    json_t *obj = json_object();
    for (size_t i = 0; obj && i < sec->n; i++) {
        const key_spec *k = &sec->keys[i];
        if (k->kind == K_IGNORED || k->kind == K_FALSE_ONLY || k->kind == K_UNSUPPORTED ||
            k->kind == K_CPU_OFFLOAD || (k->flags & F_ALIAS))
            continue;
        if (k->kind == K_SECTION &&
            ((k->sub == &scheduler_sec && cfg->scheduler.type == ZO_SCHEDULER_NONE) ||
             (k->sub == &sparse_attention_sec && !cfg->sparse_attention.enabled)))
            continue; /* absent: present would mean on */
        json_t *v = emit_value(cfg, k);
        if (!v || json_object_set_new(obj, k->name, v) < 0) {
            json_decref(obj);
            return NULL;
        }
    }
    return obj;
}

/* jansson prints every real with one precision: the smallest that reads all
 * of them back exactly gives "0.9" rather than "0.90000000000000002". */
static int real_precision(const json_t *v)
{
    int p = 1;
    if (json_is_real(v))
        return shortest_precision(json_real_value(v));
    if (json_is_object(v)) {
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)v, key, val)
        {
            int q = real_precision(val);
            p = q > p ? q : p;
        }
    } else if (json_is_array(v)) {
        size_t i;
        json_t *val;
        json_array_foreach(v, i, val)
        {
            int q = real_precision(val);
            p = q > p ? q : p;
        }
    }
    return p;
}

zo_status zo_train_config_to_json(const zo_train_config *cfg, int indent, char **json)
{
    if (!cfg || !json)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_train_config_to_json: NULL argument");
    pthread_once(&state_dtypes_once, load_state_dtypes);
    if (cfg->struct_size != sizeof(zo_train_config))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "zo_train_config_to_json: struct_size is %zu, expected %zu",
                       cfg->struct_size, sizeof(zo_train_config));
    pctx ctx = {.cfg = (zo_train_config *)cfg};
    ZO_TRY(check_enums(&ctx, &root_sec));
    json_t *doc = emit_section(cfg, &root_sec);
    size_t flags = JSON_REAL_PRECISION(doc ? real_precision(doc) : 17) |
                   (indent > 0 ? JSON_INDENT(indent < 31 ? indent : 31) : JSON_COMPACT);
    char *text = doc ? json_dumps(doc, flags) : NULL;
    json_decref(doc);
    if (!text)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "zo_train_config_to_json: out of host memory");
    *json = text;
    return ZO_OK;
}

const char *zo_offload_device_name(zo_offload_device d)
{
    return (unsigned)d <= ZO_OFFLOAD_NVME ? device_names[d] : "?";
}

const char *zo_scheduler_type_name(zo_scheduler_type t)
{
    if (t == ZO_SCHEDULER_NONE)
        return "none";
    return (unsigned)t <= ZO_SCHEDULER_WARMUP_COSINE_LR ? scheduler_names[t - 1] : "?";
}
