/* zo-train: train a LLaMA-style model through the offload engine.
 *
 * With no arguments: the tiny preset on the shipped corpus, on the GPU when
 * one is present, otherwise on the cpu device with a small device budget,
 * parameters paged from pinned host memory and the optimizer on NVMe (a swap
 * directory next to the executable). Progress goes to stderr, the summary to
 * stdout (one JSON object with --json). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "ds_config.h"
#include "hf_io.h"
#include "monitor.h"
#include "ranks.h"
#include "report.h"
#include "signals.h"
#include "trainer.h"
#include "zo/dir_lock.h"
#include "zo/file.h"
#include "zo/log.h"
#include "zo/nvtx.h"
#include "zo/units.h"
#include "zt_cli.h"
#include "zt_error.h"
#include "zt_output.h"

#ifndef ZT_DEFAULT_DATA
#define ZT_DEFAULT_DATA "tools/zo-train/data/shakespeare.txt"
#endif

enum { ZT_MAX_SETS = 64 };

typedef struct cli {
    zt_cli args; /* the shared option table, as zo-train offers it */
    zt_options o;
    const char *preset;
    int shape_flags[5]; /* vocab, dim, layers, heads, ffn: 0 = from the preset */
    int json;
    int weights_digest; /* --weights-digest */
    int log_every;
    char data_buf[PATH_MAX], swap_buf[PATH_MAX];
    const char *config_path;       /* --config */
    const char *sets[ZT_MAX_SETS]; /* --set KEY=VALUE */
    int n_sets;
    int steps_given, nvme_given; /* flags that replace what the config said */
    zo_train_config ds;          /* the resolved config (its paths are pointed to) */
    zt_config_flags ds_flags;    /* the flags merged into the config (ds_merge.h) */
    zt_config_report ds_report;  /* what its "auto" keys became */
    const char *save_dir, *resume, *init_weights;
    const char *hf_model;   /* --hf-model DIR: shape and weights of a Hugging Face model */
    zo_dtype hf_save_dtype; /* the weights --save writes to DIR/hf-model (bf16, fp32) */
    uint64_t hf_shard_bytes;
    int save_every;
    zo_dir_lock_t save_lock; /* --save DIR, held by rank 0 for the whole run */
    int start;               /* steps done before this process (a resumed run) */
    char resumed_from[PATH_MAX], last_saved[PATH_MAX];
    const char *metrics_path, *trace_path;
    char rank_trace[PATH_MAX]; /* --pipeline-stages: FILE.rank-R, each stage's timeline */
    int progress;              /* -1 auto (in place on a terminal), 0 log lines, 1 in place */
    int max_skipped;           /* fp16: overflowing steps in a row before the run stops */
    int step_retries;          /* tries again of a step an I/O error failed */
} cli;

static void usage(const cli *c, FILE *f)
{
    zt_cli_usage(&c->args, f, zt_preset_names());
}

static int parse_float(const char *s, float *out)
{
    double v;
    if (zt_cli_double(s, &v) != 0)
        return -1;
    *out = (float)v;
    return 0;
}

static int bad_value(const cli *c, int opt, const char *value, const char *expected)
{
    return zt_cli_bad_value(&c->args, opt, value, expected);
}

/* A size of the process grid (pipeline stages, tensor-parallel ranks): 1..64. */
static int parse_grid_axis(const cli *c, int opt, const char *arg, int *out)
{
    long v;
    if (zt_cli_long(arg, 1, 64, &v) != 0)
        return bad_value(c, opt, arg, "1..64");
    *out = (int)v;
    return 0;
}

static int parse_int_opt(int opt, const char *arg, cli *c)
{
    long v;
    long lo = opt == ZT_OPT_STEPS || opt == ZT_OPT_STEP_RETRIES ? 0 : 1;
    if (zt_cli_long(arg, lo, INT_MAX, &v) != 0)
        return bad_value(c, opt, arg, lo ? "an integer >= 1" : "an integer >= 0");
    switch (opt) {
    case ZT_OPT_VOCAB: c->shape_flags[0] = (int)v; break;
    case ZT_OPT_DIM: c->shape_flags[1] = (int)v; break;
    case ZT_OPT_LAYERS: c->shape_flags[2] = (int)v; break;
    case ZT_OPT_HEADS: c->shape_flags[3] = (int)v; break;
    case ZT_OPT_FFN: c->shape_flags[4] = (int)v; break;
    case ZT_OPT_STEPS: c->o.steps = (int)v; break;
    case ZT_OPT_SEQ: c->o.seq = (int)v; break;
    case ZT_OPT_MICRO_BATCH: c->o.micro_batch = (int)v; break;
    case ZT_OPT_GRAD_ACCUM: c->o.grad_accum = (int)v; break;
    case ZT_OPT_MICRO_GROUP: c->o.micro_group = (int)v; break;
    case ZT_OPT_VAL_BATCHES: c->o.val_batches = (int)v; break;
    case ZT_OPT_LOG_EVERY: c->log_every = (int)v; break;
    case ZT_OPT_SAVE_EVERY: c->save_every = (int)v; break;
    case ZT_OPT_MAX_SKIPPED_STEPS: c->max_skipped = (int)v; break;
    case ZT_OPT_STEP_RETRIES: c->step_retries = (int)v; break;
    }
    return 0;
}

static int parse_float_opt(int opt, const char *arg, cli *c)
{
    float v;
    if (parse_float(arg, &v) != 0 || v < 0)
        return bad_value(c, opt, arg, "a number >= 0");
    if (opt == ZT_OPT_LR)
        c->o.lr = v;
    if (opt == ZT_OPT_WEIGHT_DECAY)
        c->o.weight_decay = v;
    if (opt == ZT_OPT_MAX_GRAD_NORM)
        c->o.max_grad_norm = v;
    if (opt == ZT_OPT_COMM_TIMEOUT && v == 0)
        return bad_value(c, opt, arg, "seconds > 0");
    if (opt == ZT_OPT_COMM_TIMEOUT)
        c->o.comm_timeout_s = v;
    return 0;
}

/* Per-chunk homes: "auto", "homes" (every chunk at its home), or the caps. */
static int parse_caps_opt(int opt, const char *arg, cli *c)
{
    if (opt == ZT_OPT_PLACEMENT) {
        if (strcmp(arg, "auto") && strcmp(arg, "homes"))
            return bad_value(c, opt, arg, "auto or homes");
        c->o.placement_auto = strcmp(arg, "auto") == 0;
        return 0;
    }
    uint64_t b;
    if (zo_parse_bytes(arg, &b) != 0)
        return bad_value(c, opt, arg, "a byte count such as 512MiB or 8GiB (0: none)");
    *(opt == ZT_OPT_OPTIM_DEVICE_BYTES   ? &c->o.optim_caps.bytes[ZO_TIER_DEVICE]
      : opt == ZT_OPT_OPTIM_HOST_BYTES   ? &c->o.optim_caps.bytes[ZO_TIER_HOST]
      : opt == ZT_OPT_PARAM_DEVICE_BYTES ? &c->o.param_caps.bytes[ZO_TIER_DEVICE]
                                         : &c->o.param_caps.bytes[ZO_TIER_HOST]) = b;
    return 0;
}

static int parse_placement_opt(int opt, const char *arg, cli *c)
{
    switch (opt) {
    case ZT_OPT_DEVICE:
        if (zt_cli_choice(arg, zt_cli_devices) < 0)
            return bad_value(c, opt, arg, "auto, cpu or cuda");
        c->o.device = arg;
        return 0;
    case ZT_OPT_DEVICE_MEM:
    case ZT_OPT_CHUNK_BYTES:
    case ZT_OPT_HOST_MEM: {
        uint64_t b;
        if (zo_parse_bytes(arg, &b) != 0 || b == 0)
            return bad_value(c, opt, arg, "a byte count such as 512MiB or 24GiB");
        *(opt == ZT_OPT_DEVICE_MEM    ? &c->o.device_mem
          : opt == ZT_OPT_CHUNK_BYTES ? &c->o.chunk_bytes
                                      : &c->o.host_mem) = b;
        if (opt == ZT_OPT_HOST_MEM)
            c->o.host_mem_from = NULL; /* the flag overrides zoffload.host_mem */
        return 0;
    }
    case ZT_OPT_MLP_CHUNK_BYTES:
        return zt_cli_mlp_chunk(arg, &c->o.mlp_chunk_bytes) != 0
                   ? bad_value(c, opt, arg, "auto or a byte count such as 1MiB (> 0)")
                   : 0;
    case ZT_OPT_OFFLOAD_OPTIMIZER:
    case ZT_OPT_OFFLOAD_PARAM:
        if (zt_parse_home(arg, opt == ZT_OPT_OFFLOAD_OPTIMIZER ? &c->o.optim_home
                                                               : &c->o.param_home) < 0)
            return bad_value(c, opt, arg, "none, cpu or nvme");
        return 0;
    case ZT_OPT_NVME_PATH:
        if (!c->nvme_given) /* the flags replace the config's paths */
            c->o.n_nvme_paths = 0;
        c->nvme_given = 1;
        if (c->o.n_nvme_paths == ZT_MAX_NVME_PATHS)
            return bad_value(c, opt, arg, "at most 16 paths");
        c->o.nvme_paths[c->o.n_nvme_paths++] = arg;
        return 0;
    case ZT_OPT_OPTIMIZER_MODE:
        if (zt_cli_optim_mode(arg, &c->o.mode) != 0)
            return bad_value(c, opt, arg, "sync, overlap or dpu");
        return 0;
    case ZT_OPT_ACT_HOME:
        if (strcmp(arg, "device") && strcmp(arg, "host") && strcmp(arg, "nvme"))
            return bad_value(c, opt, arg, "device, host or nvme");
        c->o.act_home = !strcmp(arg, "host")   ? ZT_ACT_HOST
                        : !strcmp(arg, "nvme") ? ZT_ACT_NVME
                                               : ZT_ACT_DEVICE;
        return 0;
    case ZT_OPT_STATE_DTYPE:
        if (zt_parse_state_dtype(arg, &c->o.state_dtype) != 0)
            return bad_value(c, opt, arg, "fp32, bf16 or int8");
        return 0;
    case ZT_OPT_MASTER_SPLIT:
        if (zt_cli_on_off(arg, &c->o.master_split) != 0)
            return bad_value(c, opt, arg, "on or off");
        return 0;
    case ZT_OPT_UPDATE_BEHIND:
        if (zt_cli_on_off(arg, &c->o.update_behind) != 0)
            return bad_value(c, opt, arg, "on or off");
        return 0;
    case ZT_OPT_EMBEDDING_F32_STATES:
        if (zt_cli_on_off(arg, &c->o.embedding_f32) != 0)
            return bad_value(c, opt, arg, "on or off");
        return 0;
    case ZT_OPT_COMM_BACKEND:
        if (strcmp(arg, "host") && strcmp(arg, "mpi") && strcmp(arg, "tcp"))
            return bad_value(c, opt, arg, "host, mpi or tcp (the engine reduces host buffers)");
        c->o.comm_backend = arg;
        return 0;
    case ZT_OPT_REDUCE_ORDER:
        if (strcmp(arg, "global") && strcmp(arg, "rank"))
            return bad_value(c, opt, arg, "global or rank");
        c->o.reduce_order =
            strcmp(arg, "rank") == 0 ? ZO_REDUCE_ORDER_RANK : ZO_REDUCE_ORDER_GLOBAL;
        return 0;
    }
    return 0;
}

static int parse_opt(int opt, const char *arg, cli *c)
{
    switch (opt) {
    case ZT_OPT_PRESET: c->preset = arg; return 0;
    case ZT_OPT_DATA: c->o.data_path = arg; return 0;
    case ZT_OPT_JSON: c->json = 1; return 0;
    case ZT_OPT_WEIGHTS_DIGEST: c->weights_digest = 1; return 0;
    case ZT_OPT_CONFIG:
    case ZT_OPT_SET: return 0; /* taken by prescan */
    case ZT_OPT_SAVE: c->save_dir = arg; return 0;
    case ZT_OPT_RESUME: c->resume = arg; return 0;
    case ZT_OPT_RESUME_ALLOW_CHANGES: c->o.resume_allow_changes = 1; return 0;
    case ZT_OPT_VERBOSE:
        c->o.verbose = 1;
        zt_error_show_frames(1);
        zo_log_set_level(ZO_LOG_INFO); /* the library's info lines too */
        return 0;
    case ZT_OPT_INIT_WEIGHTS: c->init_weights = arg; return 0;
    case ZT_OPT_HF_MODEL: c->hf_model = arg; return 0;
    case ZT_OPT_HF_SAVE_DTYPE:
        if (strcmp(arg, "bf16") && strcmp(arg, "fp32"))
            return bad_value(c, opt, arg, "bf16 or fp32");
        c->hf_save_dtype = strcmp(arg, "bf16") == 0 ? ZO_DTYPE_BF16 : ZO_DTYPE_F32;
        return 0;
    case ZT_OPT_HF_SHARD_SIZE:
        if (zo_parse_bytes(arg, &c->hf_shard_bytes) != 0 || c->hf_shard_bytes == 0)
            return bad_value(c, opt, arg, "a byte count such as 2GB or 500MiB");
        return 0;
    case ZT_OPT_METRICS: c->metrics_path = arg; return 0;
    case ZT_OPT_TRACE: c->trace_path = arg; return 0;
    case ZT_OPT_PROGRESS:
        if (strcmp(arg, "auto") && strcmp(arg, "line") && strcmp(arg, "log"))
            return bad_value(c, opt, arg, "auto, line or log");
        c->progress = strcmp(arg, "auto") == 0 ? -1 : strcmp(arg, "line") == 0;
        return 0;
    case ZT_OPT_DTYPE:
        if (zt_cli_dtype(arg, &c->o.dtype) != 0)
            return bad_value(c, opt, arg, "bf16, fp16 or fp32");
        return 0;
    case ZT_OPT_ATTENTION:
        if (zt_cli_attention(arg, &c->o.flash_attention) != 0)
            return bad_value(c, opt, arg, "dense or flash");
        return 0;
    case ZT_OPT_PIPELINE_STAGES: return parse_grid_axis(c, opt, arg, &c->o.pipeline_stages);
    case ZT_OPT_PIPELINE_SPLIT: c->o.pipeline_split = arg; return 0;
    case ZT_OPT_TENSOR_PARALLEL: return parse_grid_axis(c, opt, arg, &c->o.tensor_parallel);
    case ZT_OPT_SEQUENCE_PARALLEL: c->o.sequence_parallel = 1; return 0;
    case ZT_OPT_ZERO_STAGE: {
        long v;
        if (zt_cli_long(arg, 1, 3, &v) != 0)
            return bad_value(c, opt, arg, "1, 2 or 3");
        c->o.zero_stage = (int)v;
        return 0;
    }
    case ZT_OPT_SEED: {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(arg, &end, 0);
        if (errno || end == arg || *end || strchr(arg, '-'))
            return bad_value(c, opt, arg, "an unsigned integer");
        c->o.seed = v;
        return 0;
    }
    case ZT_OPT_LR:
    case ZT_OPT_WEIGHT_DECAY:
    case ZT_OPT_MAX_GRAD_NORM:
    case ZT_OPT_COMM_TIMEOUT: return parse_float_opt(opt, arg, c);
    case ZT_OPT_DEVICE:
    case ZT_OPT_DEVICE_MEM:
    case ZT_OPT_CHUNK_BYTES:
    case ZT_OPT_MLP_CHUNK_BYTES:
    case ZT_OPT_OFFLOAD_OPTIMIZER:
    case ZT_OPT_OFFLOAD_PARAM:
    case ZT_OPT_NVME_PATH:
    case ZT_OPT_OPTIMIZER_MODE:
    case ZT_OPT_ACT_HOME:
    case ZT_OPT_STATE_DTYPE:
    case ZT_OPT_MASTER_SPLIT:
    case ZT_OPT_UPDATE_BEHIND:
    case ZT_OPT_EMBEDDING_F32_STATES:
    case ZT_OPT_REDUCE_ORDER:
    case ZT_OPT_COMM_BACKEND:
    case ZT_OPT_HOST_MEM: return parse_placement_opt(opt, arg, c);
    case ZT_OPT_PLACEMENT:
    case ZT_OPT_OPTIM_DEVICE_BYTES:
    case ZT_OPT_OPTIM_HOST_BYTES:
    case ZT_OPT_PARAM_DEVICE_BYTES:
    case ZT_OPT_PARAM_HOST_BYTES: return parse_caps_opt(opt, arg, c);
    default: return parse_int_opt(opt, arg, c);
    }
}

/* The directory holding this executable ("" when unknown). */
static void exe_dir(char *out, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", out, cap - 1);
    out[n > 0 ? n : 0] = 0;
    char *slash = strrchr(out, '/');
    if (slash)
        *slash = 0;
    else
        out[0] = 0;
}

/* The shipped corpus: beside the executable (the build copies it there),
 * then where an install puts it, then the source tree it was built from. */
static void default_paths(cli *c)
{
    char dir[PATH_MAX];
    exe_dir(dir, sizeof dir);
    const char *rel[] = {"/data/shakespeare.txt", "/../share/zoffload/shakespeare.txt"};
    if (!c->o.data_path) {
        c->o.data_path = ZT_DEFAULT_DATA;
        for (size_t i = 0; dir[0] && i < 2; i++) {
            int n = snprintf(c->data_buf, sizeof c->data_buf, "%s%s", dir, rel[i]);
            if (n > 0 && (size_t)n < sizeof c->data_buf && access(c->data_buf, R_OK) == 0) {
                c->o.data_path = c->data_buf;
                break;
            }
        }
    }
    /* A path too long for PATH_MAX falls back to the working directory. */
    int n = snprintf(c->swap_buf, sizeof c->swap_buf, "%s/zo-train-swap", dir[0] ? dir : ".");
    if (n < 0 || (size_t)n >= sizeof c->swap_buf)
        snprintf(c->swap_buf, sizeof c->swap_buf, "./zo-train-swap");
    c->o.default_nvme_dir = c->swap_buf;
}

/* The next flag; --help prints the usage (the caller then stops). */
static int next_flag(const cli *c, int argc, char **argv)
{
    int opt = zt_cli_next(&c->args, argc, argv);
    if (opt == ZT_OPT_HELP)
        usage(c, stdout);
    return opt;
}

/* The flags that fill the config's "auto" keys and win over its values
 * (ds_merge.h), read before it; bad values are left to parse_args. */
static void prescan_config_flag(int opt, const char *arg, zt_config_flags *f)
{
    long v;
    float x;
    if ((opt == ZT_OPT_MICRO_BATCH || opt == ZT_OPT_GRAD_ACCUM) &&
        zt_cli_long(arg, 1, INT_MAX, &v) == 0)
        *(opt == ZT_OPT_MICRO_BATCH ? &f->micro_batch : &f->grad_accum) = (int)v;
    if ((opt == ZT_OPT_LR || opt == ZT_OPT_MAX_GRAD_NORM || opt == ZT_OPT_WEIGHT_DECAY) &&
        parse_float(arg, &x) == 0 && x >= 0)
        *(opt == ZT_OPT_LR              ? &f->lr
          : opt == ZT_OPT_MAX_GRAD_NORM ? &f->max_grad_norm
                                        : &f->weight_decay) = arg;
    if (opt == ZT_OPT_DTYPE && zt_cli_dtype(arg, &f->dtype) == 0)
        f->dtype_given = 1;
}

/* The flags that decide how the config is read (--config, --set, --steps,
 * and those merged into it), before the others override it; errors are left
 * to parse_args. */
static int prescan(int argc, char **argv, cli *c)
{
    int opt;
    while ((opt = next_flag(c, argc, argv)) != -1) {
        if (opt == ZT_OPT_HELP)
            return -1;
        if (opt == ZT_OPT_CONFIG)
            c->config_path = optarg;
        if (opt == ZT_OPT_SET) {
            if (c->n_sets == ZT_MAX_SETS)
                return bad_value(c, ZT_OPT_SET, optarg, "at most 64 overrides");
            c->sets[c->n_sets++] = optarg;
        }
        long steps; /* a bad value is parse_args' to report, once */
        if (opt == ZT_OPT_STEPS && zt_cli_long(optarg, 0, INT_MAX, &steps) == 0) {
            c->o.steps = (int)steps;
            c->steps_given = 1;
        }
        prescan_config_flag(opt, optarg, &c->ds_flags);
    }
    optind = 0; /* getopt starts over for parse_args */
    return 0;
}

/* The config's options, which the flags then override. */
static int apply_config(cli *c)
{
    if (!c->config_path) {
        if (c->n_sets == 0)
            return 0;
        fprintf(stderr,
                "zo-train: --set %s: overrides apply to a config file: pass --config FILE\n",
                c->sets[0]);
        return 2;
    }
    c->ds = (zo_train_config)ZO_TRAIN_CONFIG_INIT;
    c->ds_flags.steps = c->o.steps;
    const zt_options defaults = c->o; /* before the config: the flags' defaults */
    if (zt_config_load(c->config_path, c->sets, c->n_sets, &c->ds_flags, &defaults, &c->ds,
                       &c->ds_report) < 0 ||
        zt_options_from_config(&c->o, &c->ds, &c->log_every) < 0) {
        fprintf(stderr, "zo-train: %s\n", zt_last_error());
        return 2;
    }
    zt_config_report_finish(&c->ds_report, &c->ds, stderr);
    if (!c->steps_given && c->ds.scheduler.total_num_steps > 0) {
        if (c->ds.scheduler.total_num_steps > INT_MAX) {
            fprintf(stderr, "zo-train: 'scheduler.params.total_num_steps' %lld is too large\n",
                    (long long)c->ds.scheduler.total_num_steps);
            return 2;
        }
        c->o.steps = (int)c->ds.scheduler.total_num_steps; /* the schedule's length */
    }
    zt_config_warn_unused(&c->ds, stderr);
    return 0;
}

/* --hf-model: the shape is the directory's, not a preset's. */
static zo_status hf_shape(cli *c)
{
    int flags = 0;
    for (int i = 0; i < 5; i++)
        flags |= c->shape_flags[i];
    if (flags || strcmp(c->preset, "tiny") != 0)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--hf-model sets the model's shape: drop --preset and the shape flags");
    if (c->init_weights)
        return zt_fail(ZO_ERR_INVALID_ARG, "--hf-model sets the weights: drop --init-weights");
    c->preset = "hf-model";
    c->o.hf_model = c->hf_model;
    return zt_hf_read_shape(c->hf_model, &c->o.shape);
}

static int check_checkpoint_flags(const cli *c)
{
    if (c->resume && c->init_weights) {
        fprintf(stderr, "zo-train: --resume and --init-weights both set the weights: pass one\n");
        return 2;
    }
    if (c->save_every && !c->save_dir) {
        fprintf(stderr, "zo-train: --save-every needs --save DIR\n");
        return 2;
    }
    return 0;
}

/* Across ranks: the stage (2 unless given), output from rank 0 (the others' stdout, progress and
 * files dropped), log lines tagged with the rank. */
static int check_ranks(cli *c)
{
    if (c->o.world_size <= 1)
        return 0;
    if (!c->o.zero_stage)
        c->o.zero_stage = 2;
    if (zt_ranks_tag_stderr(c->o.rank) < 0) {
        fprintf(stderr, "zo-train: %s\n", zt_last_error());
        return 1;
    }
    if (c->o.rank > 0) {
        if (!freopen("/dev/null", "w", stdout)) {
            fprintf(stderr, "zo-train: cannot silence stdout on rank %d\n", c->o.rank);
            return 1;
        }
        if (c->o.pipeline_stages > 1 && c->trace_path) /* every stage's timeline */
            snprintf(c->rank_trace, sizeof c->rank_trace, "%s.rank-%d", c->trace_path, c->o.rank);
        c->metrics_path = NULL;
        c->trace_path = c->rank_trace[0] ? c->rank_trace : NULL;
        c->log_every = INT_MAX;
        c->progress = 0;
    }
    return 0;
}

/* A file the run will read, opened the one way (zo/file.h): a readable
 * regular file, found wrong now rather than when it is first read. */
static int check_input_file(const char *flag, const char *path)
{
    int fd;
    if (zo_file_open_read(path, &fd) < 0) {
        fprintf(stderr, "zo-train: %s: %s\n", flag, zt_lib_message());
        return 2;
    }
    close(fd);
    return 0;
}

/* --hf-model: a directory (its config.json is read before anything else). */
static int check_input_dir(const char *flag, const char *path)
{
    if (path && zo_file_check_dir(path) < 0) {
        fprintf(stderr, "zo-train: %s: %s\n", flag, zt_lib_message());
        return 2;
    }
    return 0;
}

/* The --save directory, created now and written to once: found unwritable
 * before the training it would have kept, not at the first save. Rank 0
 * locks it for the run (zo/dir_lock.h): a second run given it refuses,
 * naming the first, instead of mixing their checkpoints. */
static int check_save_dir(cli *c)
{
    const char *dir = c->save_dir;
    char probe[PATH_MAX + 64];
    if (zt_make_dir(dir) < 0) {
        fprintf(stderr, "zo-train: --save %s: %s\n", dir, zt_last_error());
        return 2;
    }
    snprintf(probe, sizeof probe, "%s/.zo-train-probe.%ld", dir, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "zo-train: --save %s is not writable: %s\n", dir, strerror(errno));
        return 2;
    }
    close(fd);
    unlink(probe);
    if (c->o.rank == 0 && zo_dir_lock(&c->save_lock, dir, "--save directory") < 0) {
        fprintf(stderr, "zo-train: %s\n", zt_lib_message());
        return 1;
    }
    if (!c->resume && zt_ckpt_has_latest(dir)) { /* after the lock: a run in it is named first */
        fprintf(stderr,
                "zo-train: %s already holds checkpoints (%s/%s): pass --resume %s to continue "
                "them, or save elsewhere\n",
                dir, dir, ZT_CKPT_LATEST, dir);
        return 2;
    }
    return 0;
}

/* --resume: the checkpoint exists and was saved with this run's settings. */
static int check_resume(cli *c)
{
    if (zt_ckpt_resolve(c->resume, c->resumed_from, sizeof c->resumed_from) < 0) {
        fprintf(stderr, "zo-train: --resume %s: %s\n", c->resume, zt_last_error());
        return 1;
    }
    if (zt_ckpt_check_settings(c->resumed_from, &c->o) < 0) {
        fprintf(stderr, "zo-train: --resume %s: %s\n", c->resume, zt_last_error());
        return 2;
    }
    return 0;
}

/* Each --nvme-path: created when missing, as DeepSpeed creates its swap
 * folder; refused only when it cannot be, or is not a directory. */
static int make_nvme_paths(const cli *c)
{
    for (int i = 0; i < c->o.n_nvme_paths; i++) {
        const char *p = c->o.nvme_paths[i];
        if (access(p, F_OK) != 0 && zt_make_dir(p) < 0) {
            fprintf(stderr, "zo-train: --nvme-path %s cannot be created: %s\n", p, zt_last_error());
            return 2;
        }
        if (check_input_dir("--nvme-path", p))
            return 2;
    }
    return 0;
}

/* Everything the run will need, checked before anything is allocated. */
static int check_up_front(cli *c)
{
    int rc = check_input_file("--data", c->o.data_path);
    if (rc == 0)
        rc = make_nvme_paths(c);
    if (rc == 0 && c->init_weights)
        rc = check_input_file("--init-weights", c->init_weights);
    if (rc == 0 && c->save_dir)
        rc = check_save_dir(c);
    if (rc == 0 && c->resume)
        rc = check_resume(c);
    return rc;
}

static int parse_args(int argc, char **argv, cli *c)
{
    int opt;
    while ((opt = next_flag(c, argc, argv)) != -1) {
        if (opt == ZT_OPT_HELP)
            return -1;
        if (opt == '?' || opt == ':') {
            fprintf(stderr, "zo-train: unknown option or missing value: %s (see --help)\n",
                    argv[optind - 1]);
            return 2;
        }
        int rc = parse_opt(opt, optarg, c);
        if (rc)
            return rc;
    }
    if (optind < argc) {
        fprintf(stderr, "zo-train: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    if (check_input_dir("--hf-model", c->hf_model))
        return 2;
    if (c->hf_model ? hf_shape(c) < 0 : zt_preset(c->preset, &c->o.shape) < 0) {
        fprintf(stderr, "zo-train: %s\n", zt_last_error());
        return 2;
    }
    zt_shape_override(&c->o.shape, c->shape_flags);
    default_paths(c);
    if (zt_options_check(&c->o) < 0) {
        fprintf(stderr, "zo-train: %s\n", zt_last_error());
        return 2;
    }
    int rc = check_checkpoint_flags(c);
    if (rc == 0)
        rc = check_ranks(c);
    return rc ? rc : check_up_front(c);
}

/* ---- running and reporting ---- */

/* The ranks whose micro-batches make a step (tokens are counted over all). */
static int ranks(const cli *c)
{
    return c->o.world_size > 1 ? c->o.world_size : 1;
}

typedef struct totals {
    uint64_t h2d, d2h, nvme_r, nvme_w;
    double step_s, stall_s, optim_s, nvme_s, train_s;
    int rollbacks, overflows, clipped;
    zo_step_stats last;
} totals;

static void add_stats(totals *t, const zo_step_stats *s)
{
    t->h2d += s->h2d_bytes;
    t->d2h += s->d2h_bytes;
    t->nvme_r += s->nvme_read_bytes;
    t->nvme_w += s->nvme_write_bytes;
    t->step_s += s->step_seconds;
    t->stall_s += s->stall_seconds;
    t->optim_s += s->optim_seconds;
    t->nvme_s += s->nvme_seconds;
    t->rollbacks += s->rollbacks;
    t->overflows += s->overflow != 0;
    t->clipped += s->clipped != 0;
    t->last = *s;
}

/* Where the figures of each step go. */
typedef struct feedback {
    int tty; /* the progress line is updated in place */
    FILE *metrics;
    zt_monitor *monitor; /* the config's csv_monitor and tensorboard sections */
    zt_trace *trace;
    double t0, sum_step_s, last_line;
} feedback;

static void step_figures(const cli *c, const zo_step_stats *s, int done, float loss, double lr,
                         double train_s, double step_s, const feedback *fb, zt_step_figures *g)
{
    const double tok_step = (double)ranks(c) * c->o.grad_accum * c->o.micro_batch * c->o.seq;
    memset(g, 0, sizeof *g);
    g->step = done;
    g->total = c->o.steps;
    g->loss = loss;
    g->lr = lr;
    g->grad_norm = s->grad_norm;
    g->loss_scale = s->loss_scale;
    g->overflow = s->overflow;
    g->clipped = s->clipped;
    g->step_s = step_s;
    g->elapsed_s = zo_now_s() - fb->t0;
    g->tokens_per_s = train_s > 0 ? tok_step / train_s : 0;
    g->model_tflops = g->tokens_per_s *
                      zt_layout_flops_per_token(&c->o.shape, &c->o.sparse_layout, c->o.seq) / 1e12;
    g->eta_s = (c->o.steps - done) * (fb->sum_step_s / (done - c->start));
    g->nvme_gbps = s->step_seconds > 0
                       ? (double)(s->nvme_read_bytes + s->nvme_write_bytes) / s->step_seconds / 1e9
                       : 0;
    g->stall_pct = s->step_seconds > 0 ? 100.0 * s->stall_seconds / s->step_seconds : 0;
    const uint64_t in_use[4] = {s->peak[ZO_TIER_DEVICE], s->peak_pinned, s->peak[ZO_TIER_HOST],
                                s->peak[ZO_TIER_NVME]};
    memcpy(g->in_use, in_use, sizeof in_use);
    g->h2d = s->h2d_bytes;
    g->d2h = s->d2h_bytes;
    g->nvme_read = s->nvme_read_bytes;
    g->nvme_write = s->nvme_write_bytes;
}

/* The progress line (in place: at most ten a second), the metrics line. */
static int report_step(const cli *c, feedback *fb, const zt_step_figures *g)
{
    int first = g->step == c->start + 1, last = g->step == c->o.steps;
    double now = zo_now_s();
    int line = fb->tty ? first || last || now - fb->last_line >= 0.1
                       : first || last || g->step % c->log_every == 0;
    if (line && c->o.rank == 0) { /* across ranks: rank 0's */
        zt_progress_line(stderr, fb->tty, g);
        fb->last_line = now;
    }
    if (fb->metrics && zt_metrics_line(fb->metrics, g) < 0) {
        fprintf(stderr, "zo-train: %s\n", zt_last_error());
        return 1;
    }
    int64_t samples = (int64_t)g->step * ranks(c) * c->o.grad_accum * c->o.micro_batch;
    if (zt_monitor_step(fb->monitor, g, samples) < 0) {
        fprintf(stderr, "zo-train: %s\n", zt_last_error());
        return 1;
    }
    return 0;
}

/* A checkpoint, then DIR/hf-model from the same weights. */
static zo_status save_checkpoint(zt_trainer *t, cli *c)
{
    ZT_TRY(zt_ckpt_save(t, c->save_dir, c->last_saved, sizeof c->last_saved));
    char hf[4096];
    if (snprintf(hf, sizeof hf, "%s/hf-model", c->save_dir) >= (int)sizeof hf)
        return zt_fail(ZO_ERR_INVALID_ARG, "path too long: %s/hf-model", c->save_dir);
    return zt_ckpt_save_hf(t, hf, c->hf_save_dtype, c->hf_shard_bytes);
}

/* Save after step `done` when it is due (every --save-every steps and at
 * the end): 1 when it saved, 0 when none was due, -1 on failure. A save an
 * NVMe I/O error failed (reading the states) is written again, as a step
 * is run again (run_step): the next try starts from a fresh step-N.tmp. */
static int maybe_save(zt_trainer *t, cli *c, const feedback *fb, int done)
{
    if (!c->save_dir || !((c->save_every && done % c->save_every == 0) || done == c->o.steps))
        return 0;
    zo_nvtx_push("checkpoint");
    zo_status st = save_checkpoint(t, c);
    for (int k = 1; st == ZO_ERR_IO && ranks(c) == 1 && k <= c->step_retries; k++) {
        zt_progress_end(stderr, fb->tty);
        fprintf(stderr,
                "zo-train: saving the checkpoint of step %d failed: %s; writing it again "
                "(%d of %d)\n",
                done, zt_last_error(), k, c->step_retries);
        struct timespec pause = {0, 100000000L * k};
        nanosleep(&pause, NULL);
        st = save_checkpoint(t, c);
    }
    zo_nvtx_pop();
    return st < 0 ? -1 : 1;
}

/* In bf16 a healthy run never overflows: a NaN/Inf loss or gradient means
 * training diverged, and the run stops before saving the step (the last
 * good checkpoint stays). fp16's loss scaler skips overflowing steps and
 * lowers the scale; a long run of skips means it cannot recover. */
static int diverged(const cli *c, const feedback *fb, int step, float loss, const zo_step_stats *s,
                    int *skips)
{
    const char *kept = c->last_saved[0] ? c->last_saved : c->resumed_from;
    *skips = s->overflow ? *skips + 1 : 0;
    if (c->o.dtype == ZO_DTYPE_F16 && *skips < c->max_skipped)
        return 0;
    if (c->o.dtype != ZO_DTYPE_F16 && isfinite(loss) && !s->overflow)
        return 0;
    zt_progress_end(stderr, fb->tty);
    if (c->o.dtype == ZO_DTYPE_F16)
        fprintf(stderr,
                "zo-train: step %d: %d steps in a row overflowed in fp16 and were skipped (loss "
                "scale %g): training cannot recover; lower --lr, use --dtype bf16, or raise "
                "--max-skipped-steps\n",
                step, *skips, s->loss_scale);
    else
        fprintf(stderr,
                "zo-train: step %d: the %s is %s: training diverged (the update was skipped); "
                "lower --lr, or check the data and the initial weights\n",
                step, isfinite(loss) ? "gradient" : "loss", isnan(loss) ? "NaN" : "not finite");
    if (kept[0])
        fprintf(stderr, "zo-train: the last good checkpoint is %s\n", kept);
    return 1;
}

/* After a stop signal, between steps: save the steps done since the last
 * checkpoint (with --save), say where the run stands, return 128 + signo. */
static int stop_on_signal(zt_trainer *t, cli *c, const feedback *fb, int sig, int done, int saved)
{
    zt_progress_end(stderr, fb->tty);
    if (c->save_dir && !saved && save_checkpoint(t, c) < 0)
        fprintf(stderr, "zo-train: %s: saving the checkpoint of step %d failed: %s\n",
                zt_signal_name(sig), done, zt_last_error());
    fprintf(stderr, "zo-train: stopped by %s after step %d of %d; %s%s\n", zt_signal_name(sig),
            done, c->o.steps,
            c->last_saved[0] ? "checkpoint "
            : c->save_dir    ? "no checkpoint written"
                             : "no --save: nothing kept",
            c->last_saved);
    return 128 + sig;
}

/* An NVMe I/O error may be transient (a reset link, a busy device): the
 * engine keeps the committed weights and zt_trainer_step runs the step
 * again from its first fetch, on the same tokens, so a retried step equals
 * one that never failed. One rank only: across ranks the others would
 * have to retry with it. */
static zo_status run_step(zt_trainer *t, const cli *c, const feedback *fb, int step, float *loss,
                          zo_step_stats *s)
{
    zo_status st = zt_trainer_step(t, loss, s);
    for (int k = 1; st == ZO_ERR_IO && ranks(c) == 1 && k <= c->step_retries; k++) {
        if (zt_signal_pending())
            break;
        zt_progress_end(stderr, fb->tty);
        fprintf(stderr, "zo-train: step %d failed: %s; running it again (%d of %d)\n", step,
                zt_last_error(), k, c->step_retries);
        struct timespec pause = {0, 100000000L * k}; /* a moment for the device */
        nanosleep(&pause, NULL);
        st = zt_trainer_step(t, loss, s);
    }
    return st;
}

/* A step failed for good: the steps before it are committed and kept, as a
 * stop signal keeps them (saved with --save, one rank), and the run says
 * where they are. */
static int stop_on_failure(zt_trainer *t, cli *c, const feedback *fb, int step, int saved)
{
    zt_progress_end(stderr, fb->tty);
    fprintf(stderr, "zo-train: step %d failed: %s\n", step, zt_last_error());
    if (c->save_dir && !saved && ranks(c) == 1) {
        saved = save_checkpoint(t, c) >= 0;
        if (!saved)
            fprintf(stderr, "zo-train: saving the checkpoint of step %d failed: %s\n", step - 1,
                    zt_last_error());
    }
    const char *kept = c->last_saved[0] ? c->last_saved : c->resumed_from;
    if (kept[0] && saved)
        fprintf(stderr,
                "zo-train: the committed steps are kept in %s (step %d): --resume continues "
                "from there\n",
                kept, step - 1);
    else if (kept[0])
        fprintf(stderr, "zo-train: the last checkpoint is %s\n", kept);
    else
        fprintf(stderr, "zo-train: %s\n",
                c->save_dir ? "no checkpoint written" : "no --save: nothing kept");
    return 1;
}

static int train(zt_trainer *t, cli *c, feedback *fb, float *losses, double *lrs, totals *tot)
{
    int saved = 1; /* nothing new to save before the first step */
    int skips = 0; /* overflowing steps in a row */
    for (int i = c->start; i < c->o.steps; i++) {
        if (zt_signal_pending())
            return stop_on_signal(t, c, fb, zt_signal_pending(), i, saved);
        zo_step_stats s;
        uint64_t t0 = zo_now_ns();
        int k = i - c->start;
        char name[32];
        snprintf(name, sizeof name, "step %d", i + 1);
        zo_nvtx_push(name);
        zo_status st = run_step(t, c, fb, i + 1, &losses[k], &s);
        zo_nvtx_pop();
        if (st < 0)
            return stop_on_failure(t, c, fb, i + 1, saved);
        if (diverged(c, fb, i + 1, losses[k], &s, &skips))
            return 1;
        uint64_t t1 = zo_now_ns();
        zt_trace_main(fb->trace, "step", i + 1, t0, t1);
        saved = maybe_save(t, c, fb, i + 1);
        if (saved < 0) {
            zt_progress_end(stderr, fb->tty);
            fprintf(stderr, "zo-train: saving the checkpoint of step %d failed: %s\n", i + 1,
                    zt_last_error());
            return 1;
        }
        uint64_t t2 = zo_now_ns();
        if (saved)
            zt_trace_main(fb->trace, "checkpoint", i + 1, t1, t2);
        double dt = (double)(t1 - t0) * 1e-9, step_s = (double)(t2 - t0) * 1e-9;
        lrs[k] = zt_trainer_lr(t);
        tot->train_s += dt;
        add_stats(tot, &s);
        fb->sum_step_s += step_s;
        zt_step_figures g;
        step_figures(c, &s, i + 1, losses[k], lrs[k], dt, step_s, fb, &g);
        if (report_step(c, fb, &g))
            return 1;
    }
    if (zt_signal_pending()) /* during the last step: no validation */
        return stop_on_signal(t, c, fb, zt_signal_pending(), c->o.steps, saved);
    zt_progress_end(stderr, fb->tty);
    return 0;
}

/* --metrics and --trace files, and whether the progress line is in place. */
static int open_feedback(cli *c, feedback *fb)
{
    memset(fb, 0, sizeof *fb);
    fb->tty = c->progress < 0 ? isatty(STDERR_FILENO) : c->progress;
    fb->t0 = zo_now_s();
    if (c->metrics_path &&
        zo_file_fopen_write(c->metrics_path, c->resume != NULL, &fb->metrics) < 0) {
        fprintf(stderr, "zo-train: --metrics: %s\n", zt_lib_message());
        return 1;
    }
    if (zt_monitor_open(&fb->monitor, &c->ds, c->o.rank, c->resume != NULL) < 0) {
        fprintf(stderr, "zo-train: %s\n", zt_last_error());
        return 1;
    }
    if (c->trace_path && zt_trace_open(&fb->trace, c->trace_path) < 0) {
        fprintf(stderr, "zo-train: %s\n", zt_last_error());
        return 1;
    }
    if (fb->trace) {
        c->o.trace = zt_trace_event;
        c->o.trace_ctx = fb->trace;
    }
    return 0;
}

/* Close the files, reporting a failed write. */
static int close_feedback(feedback *fb, int rc)
{
    if (fb->metrics && fclose(fb->metrics) != 0 && rc == 0) {
        fprintf(stderr, "zo-train: writing the metrics file: %s\n", strerror(errno));
        rc = 1;
    }
    if (zt_monitor_close(fb->monitor) < 0 && rc == 0) {
        fprintf(stderr, "zo-train: %s\n", zt_last_error());
        rc = 1;
    }
    if (zt_trace_close(fb->trace) < 0 && rc == 0) {
        fprintf(stderr, "zo-train: %s\n", zt_last_error());
        rc = 1;
    }
    return rc;
}

/* --init-weights or --resume, before the first step. */
static int start_from_files(zt_trainer *t, cli *c)
{
    /* with --resume the checkpoint's weights replace the directory's */
    if (c->hf_model && !c->resume && zt_hf_load_weights(t, c->hf_model) < 0) {
        fprintf(stderr, "zo-train: %s\n", zt_last_error());
        return 1;
    }
    if (c->init_weights && zt_ckpt_init_weights(t, c->init_weights) < 0) {
        fprintf(stderr, "zo-train: %s\n", zt_last_error());
        return 1;
    }
    if (!c->resume)
        return 0;
    if (zt_ckpt_resolve(c->resume, c->resumed_from, sizeof c->resumed_from) < 0 ||
        zt_ckpt_load(t, c->resumed_from) < 0) {
        fprintf(stderr, "zo-train: --resume %s: %s\n", c->resume, zt_last_error());
        return 1;
    }
    zt_train_state ts;
    zt_trainer_get_state(t, &ts);
    c->start = ts.step < c->o.steps ? (int)ts.step : c->o.steps;
    fprintf(stderr, "zo-train: resumed from %s at step %lld\n", c->resumed_from,
            (long long)ts.step);
    return 0;
}

typedef struct outcome {
    double val_loss, wall_s;
    uint64_t val_tokens, device_high_water;
    int has_digest;
    uint64_t digest; /* --weights-digest */
} outcome;

static double mean_last(const float *l, int n, int k)
{
    if (n == 0)
        return NAN;
    k = k < n ? k : n;
    double s = 0;
    for (int i = n - k; i < n; i++)
        s += l[i];
    return s / k;
}

/* Per-chunk homes, when a cap splits a state over tiers. */
static void print_caps(const zt_setup *su)
{
    const zo_engine_caps *caps[2] = {&su->param_caps, &su->optim_caps};
    const uint32_t *homes[2] = {su->param_homes, su->optim_homes};
    const char *what[2] = {"params", "optimizer"};
    for (int i = 0; i < 2; i++) {
        if (!caps[i]->bytes[ZO_TIER_DEVICE] && !caps[i]->bytes[ZO_TIER_HOST])
            continue;
        char d[32], h[32];
        printf("  %s split (caps: device %s, host %s): chunks on the device %u, host %u, nvme %u\n",
               what[i], zo_fmt_bytes_prec(d, sizeof d, caps[i]->bytes[ZO_TIER_DEVICE], 1),
               zo_fmt_bytes_prec(h, sizeof h, caps[i]->bytes[ZO_TIER_HOST], 1), homes[i][0],
               homes[i][1], homes[i][2]);
    }
}

static void print_human(const cli *c, const zt_setup *su, const float *losses, const totals *tot,
                        const outcome *out)
{
    char a[32], b[32], d[32], e[32], f[32];
    const int n = c->o.steps - c->start; /* the steps this process ran */
    const double tokens = (double)n * ranks(c) * c->o.grad_accum * c->o.micro_batch * c->o.seq;
    const double tps = tot->train_s > 0 ? tokens / tot->train_s : 0;
    printf("zo-train: %s preset, %.2fM parameters (dim %d, %d layers, %d heads, ffn %d, vocab %d), "
           "%s\n",
           c->preset, su->n_params / 1e6, c->o.shape.dim, c->o.shape.n_layers, c->o.shape.n_heads,
           c->o.shape.ffn_dim, c->o.shape.vocab, zo_dtype_name(c->o.dtype));
    printf("  device %s (%s), budget %s: activations %s, engine %s; params: %s, optimizer: %s, "
           "mode %s\n",
           su->backend, su->device_name, zo_fmt_bytes_prec(a, sizeof a, su->device_budget, 1),
           zo_fmt_bytes_prec(b, sizeof b, su->activation_bytes, 1),
           zo_fmt_bytes_prec(d, sizeof d, su->engine_device_bytes, 1), zt_home_name(su->param_home),
           zt_home_name(su->optim_home), zo_optim_mode_name(c->o.mode));
    if (c->o.state_dtype != ZO_DTYPE_F32 || c->o.master_split)
        printf("  optimizer states: m and v in %s%s, master fp32%s\n",
               zt_state_dtype_name(c->o.state_dtype),
               c->o.state_dtype == ZO_DTYPE_I8 && c->o.embedding_f32 ? " (the embedding's fp32)"
                                                                     : "",
               c->o.master_split ? " (split on NVMe: low halves and bits)" : "");
    if (su->nvme_dir[0])
        printf("  swap directory %s\n", su->nvme_dir);
    print_caps(su);
    printf("  data %s: %llu tokens (%llu training windows, %llu validation)\n", c->o.data_path,
           (unsigned long long)su->data.n_tokens, (unsigned long long)su->data.train_windows,
           (unsigned long long)su->data.val_windows);
    printf(
        "steps %d x %d tokens in %.1f s (wall %.1f s with set-up and validation): %.0f tokens/s, "
        "%.4f model TFLOPS\n",
        n, ranks(c) * c->o.grad_accum * c->o.micro_batch * c->o.seq, tot->train_s, out->wall_s, tps,
        tps * zt_layout_flops_per_token(&c->o.shape, &c->o.sparse_layout, c->o.seq) / 1e12);
    if (n)
        printf("loss: first step %.4f, last step %.4f (mean of the last 10: %.4f); validation %.4f "
               "over %llu "
               "tokens\n",
               (double)losses[0], (double)losses[n - 1], mean_last(losses, n, 10), out->val_loss,
               (unsigned long long)out->val_tokens);
    if (out->has_digest)
        printf("weights digest: %016llx\n", (unsigned long long)out->digest);
    printf("bytes moved: host->device %s, device->host %s, nvme read %s, nvme write %s\n",
           zo_fmt_bytes_prec(a, sizeof a, tot->h2d, 1), zo_fmt_bytes_prec(b, sizeof b, tot->d2h, 1),
           zo_fmt_bytes_prec(d, sizeof d, tot->nvme_r, 1),
           zo_fmt_bytes_prec(e, sizeof e, tot->nvme_w, 1));
    printf("stall: %.1f%% of step time; optimizer %.2f s, nvme wait %.2f s; %d clipped, %d "
           "overflow, %d "
           "rollbacks\n",
           tot->step_s > 0 ? 100.0 * tot->stall_s / tot->step_s : 0.0, tot->optim_s, tot->nvme_s,
           tot->clipped, tot->overflows, tot->rollbacks);
    printf("peak bytes: device %s (engine; %s with activations), pinned %s, host %s, nvme %s\n",
           zo_fmt_bytes_prec(a, sizeof a, tot->last.peak[ZO_TIER_DEVICE], 1),
           zo_fmt_bytes_prec(b, sizeof b, out->device_high_water, 1),
           zo_fmt_bytes_prec(d, sizeof d, tot->last.peak_pinned, 1),
           zo_fmt_bytes_prec(e, sizeof e, tot->last.peak[ZO_TIER_HOST], 1),
           zo_fmt_bytes_prec(f, sizeof f, tot->last.peak[ZO_TIER_NVME], 1));
    if (c->resumed_from[0])
        printf("resumed from %s: steps %d..%d run here\n", c->resumed_from, c->start + 1,
               c->o.steps);
    if (c->last_saved[0])
        printf("checkpoint: %s\n", c->last_saved);
}

static json_t *json_num(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

/* The effective optimizer, clipping, loss scaling and schedule, what each
 * "auto" became and the config keys with no effect: what the run trains
 * with, whatever the config said. */
/* A float option as the decimal it was given as (0.002, not 0.00200000009). */
static double float_as_given(float v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%.7g", (double)v);
    return strtod(buf, NULL);
}

static void json_effective(const cli *c, json_t *cfg)
{
    const zt_options *o = &c->o;
    const zt_schedule *s = &o->sched;
    json_object_set_new(
        cfg, "optimizer",
        json_pack("{s:s,s:f,s:[f,f],s:f,s:f,s:b}", "type", o->adamw ? "AdamW" : "Adam", "lr",
                  float_as_given(o->lr), "betas", float_as_given(o->beta1),
                  float_as_given(o->beta2), "eps", float_as_given(o->eps), "weight_decay",
                  float_as_given(o->weight_decay), "bias_correction", o->bias_correction));
    json_object_set_new(cfg, "max_grad_norm", json_real(float_as_given(o->max_grad_norm)));
    json_object_set_new(cfg, "loss_scale",
                        o->dtype != ZO_DTYPE_F16 ? json_null()
                        : o->loss_scaler.loss_scale > 0
                            ? json_real(o->loss_scaler.loss_scale)
                            : json_pack("{s:s,s:i}", "dynamic_from", "2^initial_scale_power",
                                        "initial_scale_power", o->loss_scaler.initial_scale_power));
    json_object_set_new(cfg, "schedule",
                        json_pack("{s:s,s:f,s:f,s:I,s:I,s:s}", "type",
                                  zo_scheduler_type_name(s->type), "warmup_min_lr",
                                  s->warmup_min_lr, "warmup_max_lr", s->warmup_max_lr,
                                  "warmup_num_steps", (json_int_t)s->warmup_num_steps,
                                  "total_num_steps", (json_int_t)s->total_num_steps, "warmup_type",
                                  s->warmup_type == ZO_WARMUP_LINEAR ? "linear" : "log"));
    json_object_set_new(cfg, "auto", zt_config_report_json(&c->ds_report));
    json_t *ignored = json_array();
    for (int64_t i = 0; ignored && i < c->ds.n_ignored; i++)
        json_array_append_new(ignored, json_string(c->ds.ignored[i]));
    json_object_set_new(cfg, "ignored", ignored);
}

static json_t *json_setup(const cli *c, const zt_setup *su, const outcome *out)
{
    json_t *model =
        json_pack("{s:s,s:I,s:i,s:i,s:i,s:i,s:i,s:s}", "preset", c->preset, "params",
                  (json_int_t)su->n_params, "vocab", c->o.shape.vocab, "dim", c->o.shape.dim,
                  "layers", c->o.shape.n_layers, "heads", c->o.shape.n_heads, "ffn",
                  c->o.shape.ffn_dim, "dtype", zo_dtype_name(c->o.dtype));
    json_t *dev = json_pack("{s:s,s:s,s:I,s:I,s:I,s:I}", "backend", su->backend, "name",
                            su->device_name, "budget", (json_int_t)su->device_budget,
                            "activation_bytes", (json_int_t)su->activation_bytes, "engine_bytes",
                            (json_int_t)su->engine_device_bytes, "high_water",
                            (json_int_t)out->device_high_water);
    json_t *cfg = json_pack(
        "{s:s,s:i,s:i,s:i,s:i,s:f,s:I,s:s,s:s,s:s,s:s,s:I,s:I}", "data", c->o.data_path, "steps",
        c->o.steps, "seq", c->o.seq, "micro_batch", c->o.micro_batch, "grad_accum", c->o.grad_accum,
        "lr", (double)c->o.lr, "seed", (json_int_t)c->o.seed, "offload_param",
        zt_home_name(su->param_home), "offload_optimizer", zt_home_name(su->optim_home),
        "optimizer_mode", zo_optim_mode_name(c->o.mode), "nvme_path", su->nvme_dir, "chunk_bytes",
        (json_int_t)su->footprint.chunk_bytes, "chunks", (json_int_t)su->footprint.n_chunks);
    json_object_set_new(cfg, "micro_group",
                        json_integer(c->o.micro_group > 1 ? c->o.micro_group : 1));
    static const char *const act_homes[] = {"device", "host", "nvme"};
    json_object_set_new(cfg, "act_home", json_string(act_homes[c->o.act_home]));
    json_object_set_new(cfg, "state_dtype", json_string(zt_state_dtype_name(c->o.state_dtype)));
    json_object_set_new(cfg, "master_split", json_boolean(c->o.master_split));
    json_object_set_new(cfg, "embedding_f32_states", json_boolean(c->o.embedding_f32));
    json_object_set_new(cfg, "world_size", json_integer(ranks(c)));
    json_object_set_new(cfg, "zero_stage", json_integer(ranks(c) > 1 ? c->o.zero_stage : 0));
    json_object_set_new(cfg, "zero_persist_elems", json_integer((json_int_t)c->o.zero_persist));
    json_object_set_new(cfg, "pipeline_stages",
                        json_integer(c->o.pipeline_stages > 1 ? c->o.pipeline_stages : 1));
    json_object_set_new(cfg, "tensor_parallel",
                        json_integer(c->o.tensor_parallel > 1 ? c->o.tensor_parallel : 1));
    json_object_set_new(cfg, "sequence_parallel", json_boolean(c->o.sequence_parallel));
    json_object_set_new(cfg, "pipeline_split", json_string(su->pipeline_split));
    json_object_set_new(cfg, "reduce_order",
                        json_string(c->o.reduce_order == ZO_REDUCE_ORDER_RANK ? "rank" : "global"));
    json_object_set_new(cfg, "pipeline_pinned_bytes",
                        json_integer((json_int_t)su->pipe_pinned_bytes));
    json_object_set_new(cfg, "placement",
                        json_pack("{s:{s:I,s:I},s:{s:I,s:I}}", "optimizer", "device",
                                  (json_int_t)su->optim_caps.bytes[ZO_TIER_DEVICE], "host",
                                  (json_int_t)su->optim_caps.bytes[ZO_TIER_HOST], "params",
                                  "device", (json_int_t)su->param_caps.bytes[ZO_TIER_DEVICE],
                                  "host", (json_int_t)su->param_caps.bytes[ZO_TIER_HOST]));
    json_object_set_new(cfg, "homes",
                        json_pack("{s:[iii],s:[iii]}", "params", (int)su->param_homes[0],
                                  (int)su->param_homes[1], (int)su->param_homes[2], "optimizer",
                                  (int)su->optim_homes[0], (int)su->optim_homes[1],
                                  (int)su->optim_homes[2]));
    json_object_set_new(cfg, "config_file",
                        c->config_path ? json_string(c->config_path) : json_null());
    json_object_set_new(cfg, "scheduler", json_string(zo_scheduler_type_name(c->o.sched.type)));
    json_effective(c, cfg);
    json_object_set_new(cfg, "host_limit", json_integer((json_int_t)su->host_limit));
    json_object_set_new(cfg, "tensor_buffer_bytes",
                        json_integer((json_int_t)su->tensor_buffer_bytes));
    json_object_set_new(cfg, "data_bytes", json_integer((json_int_t)su->data_bytes));
    return json_pack("{s:o,s:o,s:o}", "model", model, "device", dev, "config", cfg);
}

static json_t *json_nums(const float *f, const double *d, int n)
{
    json_t *arr = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(arr, json_num(f ? (double)f[i] : d[i]));
    return arr;
}

static void print_json(const cli *c, const zt_setup *su, const float *losses, const double *lrs,
                       const totals *tot, const outcome *out)
{
    const int n = c->o.steps - c->start; /* the steps this process ran */
    const double tokens = (double)n * ranks(c) * c->o.grad_accum * c->o.micro_batch * c->o.seq;
    const double tps = tot->train_s > 0 ? tokens / tot->train_s : 0;
    json_t *root = json_setup(c, su, out);
    json_object_set_new(root, "first_step", json_integer(c->start + 1));
    json_object_set_new(root, "resumed_from",
                        c->resumed_from[0] ? json_string(c->resumed_from) : json_null());
    json_object_set_new(root, "checkpoint",
                        c->last_saved[0] ? json_string(c->last_saved) : json_null());
    json_object_set_new(root, "losses", json_nums(losses, NULL, n));
    json_object_set_new(root, "lrs", json_nums(NULL, lrs, n));
    json_object_set_new(root, "first_loss", json_num(n ? losses[0] : NAN));
    json_object_set_new(root, "last_loss", json_num(n ? losses[n - 1] : NAN));
    json_object_set_new(root, "val_loss", json_num(out->val_loss));
    json_object_set_new(root, "val_tokens", json_integer((json_int_t)out->val_tokens));
    if (out->has_digest) {
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)out->digest);
        json_object_set_new(root, "weights_digest", json_string(hex));
    }
    json_object_set_new(root, "tokens", json_integer((json_int_t)tokens));
    json_object_set_new(root, "train_s", json_real(tot->train_s));
    json_object_set_new(root, "wall_s", json_real(out->wall_s));
    json_object_set_new(root, "tokens_per_s", json_real(tps));
    json_object_set_new(
        root, "model_tflops",
        json_real(tps * zt_layout_flops_per_token(&c->o.shape, &c->o.sparse_layout, c->o.seq) /
                  1e12));
    json_object_set_new(root, "bytes",
                        json_pack("{s:I,s:I,s:I,s:I}", "h2d", (json_int_t)tot->h2d, "d2h",
                                  (json_int_t)tot->d2h, "nvme_read", (json_int_t)tot->nvme_r,
                                  "nvme_write", (json_int_t)tot->nvme_w));
    json_object_set_new(root, "stall_pct",
                        json_real(tot->step_s > 0 ? 100.0 * tot->stall_s / tot->step_s : 0.0));
    json_object_set_new(root, "optim_s", json_real(tot->optim_s));
    json_object_set_new(root, "nvme_wait_s", json_real(tot->nvme_s));
    json_object_set_new(root, "clipped_steps", json_integer(tot->clipped));
    json_object_set_new(root, "overflow_steps", json_integer(tot->overflows));
    json_object_set_new(root, "rollbacks", json_integer(tot->rollbacks));
    json_object_set_new(root, "peak_bytes",
                        json_pack("{s:I,s:I,s:I,s:I}", "device",
                                  (json_int_t)tot->last.peak[ZO_TIER_DEVICE], "pinned",
                                  (json_int_t)tot->last.peak_pinned, "host",
                                  (json_int_t)tot->last.peak[ZO_TIER_HOST], "nvme",
                                  (json_int_t)tot->last.peak[ZO_TIER_NVME]));
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    if (s)
        puts(s);
    free(s);
    json_decref(root);
}

/* -v: this rank's measured host peaks against its share of the node's host
 * memory (the engine's pinned and pageable high-water marks; the process's
 * resident peak, which also holds the cpu device and the libraries, for
 * reference). */
static void log_rank_peaks(const cli *c, const zt_setup *su, const totals *tot)
{
    struct rusage ru;
    long rss_kb = getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : 0;
    uint64_t engine = tot->last.peak_pinned + tot->last.peak[ZO_TIER_HOST];
    fprintf(stderr,
            "zo-train: host peak of rank %d: engine %llu bytes (pinned %llu, host %llu) of its "
            "share %llu; process resident peak %llu bytes\n",
            c->o.rank, (unsigned long long)engine, (unsigned long long)tot->last.peak_pinned,
            (unsigned long long)tot->last.peak[ZO_TIER_HOST], (unsigned long long)su->host_share,
            (unsigned long long)rss_kb * 1024ull);
}

static int run(cli *c)
{
    double t0 = zo_now_s();
    zt_trainer *t = NULL;
    feedback fb;
    if (open_feedback(c, &fb))
        return close_feedback(&fb, 1);
    c->o.moves_tensors = c->resume || c->init_weights || c->hf_model || c->save_dir;
    if (zt_trainer_init(&t, &c->o) < 0) {
        fprintf(stderr, "zo-train: %s\n", zt_last_error());
        return close_feedback(&fb, 1);
    }
    const zt_setup *su = zt_trainer_setup(t);
    fprintf(stderr,
            "zo-train: %.2fM parameters on %s (budget %llu bytes), params %s, optimizer %s, %d "
            "chunks of %llu bytes\n",
            su->n_params / 1e6, su->backend, (unsigned long long)su->device_budget,
            zt_home_name(su->param_home), zt_home_name(su->optim_home), su->footprint.n_chunks,
            (unsigned long long)su->footprint.chunk_bytes);
    if (c->o.chunk_bytes && su->footprint.chunk_bytes != c->o.chunk_bytes)
        fprintf(stderr,
                "zo-train: --chunk-bytes %llu raised to %llu (the largest tensor's 16-bit "
                "bytes, 4 KiB-aligned)\n",
                (unsigned long long)c->o.chunk_bytes,
                (unsigned long long)su->footprint.chunk_bytes);
    int rc = start_from_files(t, c);
    float *losses = calloc((size_t)c->o.steps + 1, sizeof *losses);
    double *lrs = calloc((size_t)c->o.steps + 1, sizeof *lrs);
    totals tot = {0};
    outcome out = {0};
    if (rc == 0)
        rc = losses && lrs ? train(t, c, &fb, losses, lrs, &tot) : 1;
    if (rc == 0 && zt_trainer_validate(t, &out.val_loss, &out.val_tokens) < 0) {
        fprintf(stderr, "zo-train: validation failed: %s\n", zt_last_error());
        rc = 1;
    }
    if (rc == 0 && c->weights_digest) {
        if (zt_trainer_weights_digest(t, &out.digest) < 0) {
            fprintf(stderr, "zo-train: %s\n", zt_last_error());
            rc = 1;
        }
        out.has_digest = 1;
    }
    if (rc == 0 && c->o.verbose)
        log_rank_peaks(c, su, &tot);
    if (rc == 0) {
        out.device_high_water = zt_trainer_device_high_water(t);
        out.wall_s = zo_now_s() - t0;
        if (c->json)
            print_json(c, su, losses, lrs, &tot, &out);
        else
            print_human(c, su, losses, &tot, &out);
    }
    free(losses);
    free(lrs);
    zt_trainer_free(t); /* the engine's threads are done with the trace */
    return close_feedback(&fb, rc);
}

int main(int argc, char **argv)
{
    cli c;
    zt_output_check_at_exit("zo-train");
    memset(&c, 0, sizeof c);
    zt_cli_init(&c.args, ZT_TOOL_TRAIN, "zo-train");
    c.o = (zt_options)ZT_OPTIONS_INIT;
    c.preset = "tiny";
    c.hf_save_dtype = ZO_DTYPE_BF16;
    c.hf_shard_bytes = 5000000000ull; /* transformers' default max_shard_size, 5GB */
    c.progress = -1;
    c.log_every = 10;
    c.max_skipped = 50;
    c.step_retries = 3;
    if (zt_ranks_discover(&c.o) < 0) {
        fprintf(stderr, "zo-train: %s\n", zt_last_error());
        return 2;
    }
    int rc = prescan(argc, argv, &c);
    if (rc == 0)
        rc = apply_config(&c);
    if (rc == 0)
        rc = parse_args(argc, argv, &c);
    if (rc == 0 && zt_signals_start() < 0) {
        fprintf(stderr, "zo-train: %s\n", zt_last_error());
        rc = 1;
    }
    if (rc == 0)
        rc = run(&c);
    zo_dir_unlock(c.save_lock);
    return rc < 0 ? 0 : rc;
}
