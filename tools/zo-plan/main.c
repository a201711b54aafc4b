/* zo-plan: does a training job fit, where, and how fast, before the run.
 *
 * For the model (a zo-train preset, shape flags or a Hugging Face LLaMA
 * config.json) and the machine (detected or given), every placement
 * strategy with the bytes of each tier by use, whether it fits, the step
 * time with its bottleneck, tokens/s, MFU and NVMe wear; the fastest plan
 * that fits is recommended and can be written as a zo-train config. A table
 * and bars by default, one JSON object with --json. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds_config.h"
#include "emit.h"
#include "hf_config.h"
#include "hw.h"
#include "model_shape.h"
#include "pipeline.h"
#include "pipeline_out.h"
#include "plan.h"
#include "tensor.h"
#include "tp_shape.h"
#include "validate.h"
#include "world.h"
#include "zo/checked.h"
#include "zo/units.h"
#include "zt_cli.h"
#include "zt_error.h"
#include "zt_output.h"
#include "zt_tiers.h"

#ifndef ZP_DEFAULT_DATA
#define ZP_DEFAULT_DATA "tools/zo-train/data/shakespeare.txt"
#endif

enum { ZP_MAX_SPARSE_SETS = 16 }; /* the section's keys, each given once or more */

typedef struct cli {
    zt_cli args; /* the shared option table, as zo-plan offers it */
    const char *preset, *hf_config;
    int shape_flags[5]; /* vocab, dim, layers, heads, ffn: 0 = from the preset */
    zp_job job;
    zp_hw_request req;
    zp_speeds speeds; /* from flags: 0 = not given */
    zp_speed_sources src;
    const char *bench_json[8];
    int n_bench_json;
    int measure, json, ds_estimate;
    double nvme_tbw; /* bytes */
    const char *emit_path;
    int validate;   /* steps of a trial run per fitting strategy (0: none) */
    int max_seq;    /* --max-seq: search the longest --seq that fits */
    int mode_given; /* --optimizer-mode sync|overlap|dpu: the per-chunk plan keeps it */
    int state_auto; /* --state-dtype auto: the planner picks the format */
    int mlp_auto;   /* --mlp-chunk-bytes auto (the default): the planner picks the chunk */
    const char *sparse_sets[ZP_MAX_SPARSE_SETS]; /* --set sparse_attention.KEY=VALUE */
    int n_sparse_sets;
    zo_sparse_attention_config sparse; /* what they resolve to (enabled 0: none) */
    const char *data;                  /* its tokens */
    char model_note[256];
    zp_world world;  /* --world-size N > 1: ZeRO plans over N ranks too (world.h) */
    int pipe_stages; /* --pipeline-stages: 0 none, -1 auto (pipeline.h) */
    int pipe_split[ZP_PIPE_MAX_STAGES]; /* --pipeline-split: first layers of stages 1..S-1 */
    int n_pipe_split;
    zp_world pipe_world; /* the pipeline's ranks: --world-size, or one per stage */
    int tp;              /* --tensor-parallel: 0 not given, -1 auto, else T (tensor.h) */
} cli;

static void usage(const cli *c, FILE *f)
{
    zt_cli_usage(&c->args, f, zt_preset_names());
}

static int bad_value(const cli *c, int opt, const char *value, const char *expected)
{
    return zt_cli_bad_value(&c->args, opt, value, expected);
}

/* The shape flags and the job's sizes: integers >= 1. */
static int *int_field(int opt, cli *c)
{
    switch (opt) {
    case ZT_OPT_VOCAB: return &c->shape_flags[0];
    case ZT_OPT_DIM: return &c->shape_flags[1];
    case ZT_OPT_LAYERS: return &c->shape_flags[2];
    case ZT_OPT_HEADS: return &c->shape_flags[3];
    case ZT_OPT_FFN: return &c->shape_flags[4];
    case ZT_OPT_SEQ: return &c->job.seq;
    case ZT_OPT_MICRO_BATCH: return &c->job.micro_batch;
    case ZT_OPT_GRAD_ACCUM: return &c->job.grad_accum;
    }
    return NULL;
}

static int parse_int_opt(int opt, const char *arg, cli *c)
{
    long v;
    if (zt_cli_long(arg, 1, INT_MAX, &v) != 0)
        return bad_value(c, opt, arg, "an integer >= 1");
    *int_field(opt, c) = (int)v;
    return 0;
}

static uint64_t *bytes_field(int opt, cli *c)
{
    switch (opt) {
    case ZT_OPT_CHUNK_BYTES: return &c->job.chunk_bytes;
    case ZT_OPT_GPU_MEM: return &c->req.gpu_mem;
    case ZT_OPT_HOST_MEM: return &c->req.host_mem;
    case ZT_OPT_PINNED_MAX: return &c->req.pinned_max;
    case ZT_OPT_NVME_BYTES: return &c->req.nvme_bytes;
    }
    return NULL;
}

static int parse_bytes_opt(int opt, const char *arg, cli *c)
{
    uint64_t b;
    if (zo_parse_bytes(arg, &b) != 0 || b == 0)
        return bad_value(c, opt, arg, "a byte count such as 512MiB or 24GiB");
    if (opt == ZT_OPT_CHUNK_BYTES && (b < 4096 || b > ZO_MAX_CHUNK_BYTES))
        return bad_value(c, opt, arg, "a chunk of 4KiB to 1TiB (tens of MiB is typical)");
    *bytes_field(opt, c) = b;
    return 0;
}

/* The speed a flag gives and its unit; -1 for a flag that gives none. */
static int speed_of(int opt, double *unit)
{
    static const struct {
        int opt, speed;
        double unit;
    } speeds[] = {{ZT_OPT_H2D_GBPS, ZP_SPEED_H2D, 1e9},
                  {ZT_OPT_D2H_GBPS, ZP_SPEED_D2H, 1e9},
                  {ZT_OPT_NVME_READ_GBPS, ZP_SPEED_NVME_READ, 1e9},
                  {ZT_OPT_NVME_WRITE_GBPS, ZP_SPEED_NVME_WRITE, 1e9},
                  {ZT_OPT_ADAM_GPARAMS, ZP_SPEED_ADAM, 1e9},
                  {ZT_OPT_GPU_TFLOPS, ZP_SPEED_FLOPS, 1e12},
                  {ZT_OPT_NVME_UPDATE_GBPS, ZP_SPEED_NVME_UPDATE, 1e9}};
    for (size_t i = 0; i < sizeof speeds / sizeof speeds[0]; i++)
        if (speeds[i].opt == opt) {
            *unit = speeds[i].unit;
            return speeds[i].speed;
        }
    return -1;
}

/* Speeds in GB/s, Gparams/s and TFLOPS; TB for the endurance. */
static int parse_rate_opt(int opt, const char *arg, cli *c)
{
    double v, unit = 0;
    if (zt_cli_double(arg, &v) != 0 || !(v > 0))
        return bad_value(c, opt, arg, "a number > 0");
    if (opt == ZT_OPT_NVME_TBW) {
        c->nvme_tbw = v * 1e12;
        return 0;
    }
    int which = speed_of(opt, &unit);
    *zp_speed_field(&c->speeds, which) = v * unit;
    snprintf(c->src.what[which], sizeof c->src.what[0], "--%s", zt_cli_name(opt));
    return 0;
}

static int parse_choice_opt(int opt, const char *arg, cli *c)
{
    static const char *const optimizers[] = {"adam", "adamw", NULL};
    switch (opt) {
    case ZT_OPT_DTYPE:
        if (zt_cli_dtype(arg, &c->job.dtype) != 0)
            return bad_value(c, opt, arg, "bf16, fp16 or fp32");
        return 0;
    case ZT_OPT_ATTENTION:
        if (zt_cli_attention(arg, &c->job.flash_attention) != 0)
            return bad_value(c, opt, arg, "dense or flash");
        return 0;
    case ZT_OPT_OPTIMIZER:
        return zt_cli_choice(arg, optimizers) < 0 ? bad_value(c, opt, arg, "adam or adamw") : 0;
    case ZT_OPT_STATE_DTYPE:
        c->state_auto = strcmp(arg, "auto") == 0;
        if (!c->state_auto && zt_parse_state_dtype(arg, &c->job.state_dtype) < 0) {
            char names[128];
            size_t n = zo_state_format_names(names, sizeof names, ", ");
            if (n < sizeof names)
                snprintf(names + n, sizeof names - n, " or auto");
            return bad_value(c, opt, arg, names);
        }
        return 0;
    case ZT_OPT_MASTER_SPLIT:
        if (zt_cli_on_off(arg, &c->job.master_split) != 0)
            return bad_value(c, opt, arg, "on or off");
        return 0;
    case ZT_OPT_UPDATE_BEHIND: {
        int on = 1;
        if (zt_cli_on_off(arg, &on) != 0)
            return bad_value(c, opt, arg, "on or off");
        c->job.no_update_behind = !on;
        return 0;
    }
    case ZT_OPT_EMBEDDING_F32_STATES:
        if (zt_cli_on_off(arg, &c->job.embedding_f32) != 0)
            return bad_value(c, opt, arg, "on or off");
        return 0;
    case ZT_OPT_OPTIMIZER_MODE:
        c->mode_given = strcmp(arg, "auto") != 0;
        c->job.mode = ZO_OPTIM_SYNC;
        if (c->mode_given && zt_cli_optim_mode(arg, &c->job.mode) != 0)
            return bad_value(c, opt, arg, "auto, sync, overlap or dpu");
        return 0;
    case ZT_OPT_ACT_HOME: {
        for (int i = 0; i <= ZP_ACT_NVME; i++)
            if (strcmp(arg, zp_act_home_name((zp_act_home)i)) == 0) {
                c->job.act_home = (zp_act_home)i;
                return 0;
            }
        return bad_value(c, opt, arg, "auto, device, host or nvme");
    }
    case ZT_OPT_MICRO_GROUP: {
        long v = 0;
        if (strcmp(arg, "auto") != 0 && zt_cli_long(arg, 1, INT_MAX, &v) != 0)
            return bad_value(c, opt, arg, "auto or a number of micro-batches >= 1");
        c->job.micro_group = (int)v;
        return 0;
    }
    case ZT_OPT_DEVICE:
        if (zt_cli_choice(arg, zt_cli_devices) < 0)
            return bad_value(c, opt, arg, "auto, cpu or cuda");
        c->req.device = arg;
        return 0;
    case ZT_OPT_MLP_CHUNK_BYTES:
        if (zt_cli_mlp_chunk(arg, &c->job.mlp_chunk_bytes) != 0)
            return bad_value(c, opt, arg, "auto or a byte count such as 1MiB (> 0)");
        c->mlp_auto = c->job.mlp_chunk_bytes == 0;
        return 0;
    }
    return 0;
}

/* --world-size, --gpus-per-node: counts >= 1; --link-gbps: GB/s > 0. */
static int parse_world_opt(int opt, const char *arg, cli *c)
{
    char *end;
    errno = 0;
    if (opt == ZT_OPT_LINK_GBPS || opt == ZT_OPT_NODE_LINK_GBPS) {
        double v = strtod(arg, &end);
        if (errno || end == arg || *end || !(v > 0) || !isfinite(v))
            return bad_value(c, opt, arg, "a number of GB/s > 0");
        int node = opt == ZT_OPT_NODE_LINK_GBPS;
        *(node ? &c->world.node_link : &c->world.link) = v * 1e9;
        snprintf(node ? c->world.node_link_source : c->world.link_source,
                 sizeof c->world.link_source, "%s", node ? "--node-link-gbps" : "--link-gbps");
        return 0;
    }
    if (opt == ZT_OPT_TENSOR_PARALLEL) {
        long t = strcmp(arg, "auto") == 0 ? -1 : strtol(arg, &end, 10);
        if (t != -1 && (errno || end == arg || *end || t < 1 || t > 64))
            return bad_value(c, opt, arg, "auto or a number of ranks from 1 to 64");
        c->tp = (int)t;
        return 0;
    }
    long v = strtol(arg, &end, 10);
    if (errno || end == arg || *end || v < 1 || v > 65536)
        return bad_value(c, opt, arg, "a count from 1 to 65536");
    *(opt == ZT_OPT_WORLD_SIZE ? &c->world.world_size : &c->world.gpus_per_node) = (int)v;
    return 0;
}

/* --pipeline-stages S|auto, --pipeline-split L1,L2,... */
static int parse_pipe_opt(int opt, const char *arg, cli *c)
{
    char *end;
    const char *at = arg;
    if (opt == ZT_OPT_PIPELINE_STAGES) {
        errno = 0;
        long v = strcmp(arg, "auto") == 0 ? -1 : strtol(arg, &end, 10);
        if (v != -1 && (errno || end == arg || *end || v < 1 || v > ZP_PIPE_MAX_STAGES))
            return bad_value(c, opt, arg, "auto or a number of stages from 1 to 256");
        c->pipe_stages = (int)v;
        return 0;
    }
    c->n_pipe_split = 0;
    for (;;) {
        errno = 0;
        long v = strtol(at, &end, 10);
        if (errno || end == at || (*end && *end != ',') || v < 1 || v > 1 << 20 ||
            c->n_pipe_split == ZP_PIPE_MAX_STAGES - 1)
            return bad_value(c, opt, arg,
                             "the first engine layers of stages 1..S-1, increasing, comma-"
                             "separated (such as 9,17,25)");
        c->pipe_split[c->n_pipe_split++] = (int)v;
        if (!*end)
            return 0;
        at = end + 1;
    }
}

static int parse_opt(int opt, const char *arg, cli *c)
{
    switch (opt) {
    case ZT_OPT_PRESET: c->preset = arg; return 0;
    case ZT_OPT_HF_CONFIG: c->hf_config = arg; return 0;
    case ZT_OPT_MEASURE: c->measure = 1; return 0;
    case ZT_OPT_MAX_SEQ: c->max_seq = 1; return 0;
    case ZT_OPT_JSON: c->json = 1; return 0;
    case ZT_OPT_SEQUENCE_PARALLEL: c->job.sequence_parallel = 1; return 0;
    case ZT_OPT_DEEPSPEED_ESTIMATE: c->ds_estimate = 1; return 0;
    case ZT_OPT_EMIT_CONFIG: c->emit_path = arg; return 0;
    case ZT_OPT_DATA: c->data = arg; return 0;
    case ZT_OPT_VALIDATE: {
        char *end;
        errno = 0;
        long v = strtol(arg, &end, 10);
        if (errno || end == arg || *end || v < 1 || v > 100000)
            return bad_value(c, opt, arg, "a number of steps >= 1");
        c->validate = (int)v;
        return 0;
    }
    case ZT_OPT_SET:
        if (strncmp(arg, "sparse_attention.", strlen("sparse_attention.")) != 0 ||
            !strchr(arg, '='))
            return bad_value(c, opt, arg,
                             "sparse_attention.KEY=VALUE (zo-plan takes the sparse_attention "
                             "section's keys; the rest of a config is zo-train's --config)");
        if (c->n_sparse_sets == ZP_MAX_SPARSE_SETS)
            return bad_value(c, opt, arg, "at most 16 sparse_attention keys");
        c->sparse_sets[c->n_sparse_sets++] = arg;
        return 0;
    case ZT_OPT_NVME_PATH:
        if (c->req.n_nvme_paths == ZP_MAX_NVME_PATHS)
            return bad_value(c, opt, arg, "at most 16 paths");
        c->req.nvme_paths[c->req.n_nvme_paths++] = arg;
        return 0;
    case ZT_OPT_BENCH_JSON:
        if (c->n_bench_json == 8)
            return bad_value(c, opt, arg, "at most 8 files");
        c->bench_json[c->n_bench_json++] = arg;
        return 0;
    }
    double unit;
    if (opt == ZT_OPT_WORLD_SIZE || opt == ZT_OPT_GPUS_PER_NODE || opt == ZT_OPT_LINK_GBPS ||
        opt == ZT_OPT_NODE_LINK_GBPS || opt == ZT_OPT_TENSOR_PARALLEL)
        return parse_world_opt(opt, arg, c);
    if (opt == ZT_OPT_PIPELINE_STAGES || opt == ZT_OPT_PIPELINE_SPLIT)
        return parse_pipe_opt(opt, arg, c);
    if (int_field(opt, c))
        return parse_int_opt(opt, arg, c);
    if (bytes_field(opt, c))
        return parse_bytes_opt(opt, arg, c);
    if (opt == ZT_OPT_NVME_TBW || speed_of(opt, &unit) >= 0)
        return parse_rate_opt(opt, arg, c);
    return parse_choice_opt(opt, arg, c);
}

/* The --set sparse_attention keys resolved by the config parser (the keys,
 * ranges and messages zo-train's --config has) and mapped onto the fused
 * op's layout as zo-train maps them (zt_sparse_layout). */
static zo_status read_sparse_layout(cli *c)
{
    if (!c->n_sparse_sets)
        return ZO_OK;
    zo_config_t cfg = NULL;
    zo_train_config tc = ZO_TRAIN_CONFIG_INIT;
    zo_status st = zo_config_init(&cfg);
    /* the parser resolves a whole config: the batch it needs, the job's */
    char base[96];
    snprintf(base, sizeof base, "{\"train_micro_batch_size_per_gpu\": %d}", c->job.micro_batch);
    if (st >= 0)
        st = zo_config_load_string(cfg, base, "zo-plan --set");
    for (int i = 0; st >= 0 && i < c->n_sparse_sets; i++)
        st = zo_config_set_arg(cfg, c->sparse_sets[i]);
    if (st >= 0)
        st = zo_config_resolve(cfg, 1, &tc);
    zo_config_free(cfg);
    if (st < 0)
        return zt_lib_fail(st, "--set");
    c->sparse = tc.sparse_attention;
    return zt_sparse_layout(&tc.sparse_attention, &c->job.layout);
}

/* The model: a preset or a config.json, then the shape flags over it. */
static int resolve_model(cli *c)
{
    zt_shape *sh = &c->job.shape;
    zo_status st = c->hf_config
                       ? zt_read_hf_config(c->hf_config, sh, c->model_note, sizeof c->model_note)
                       : zt_preset(c->preset, sh);
    if (st >= 0) {
        zt_shape_override(sh, c->shape_flags);
        st = zt_shape_check(sh);
    }
    int ranks = c->world.world_size > c->pipe_world.world_size ? c->world.world_size
                                                               : c->pipe_world.world_size;
    if (st >= 0)
        st = zt_job_sizes_check(sh, c->job.seq, c->job.micro_batch, c->job.grad_accum,
                                ranks > 1 ? ranks : 1);
    if (st >= 0)
        st = read_sparse_layout(c);
    if (st >= 0)
        st = zp_check_layout(&c->job);
    if (st >= 0)
        return 0;
    fprintf(stderr, "zo-plan: %s\n", zt_last_error());
    return 2;
}

/* 0: go on; -1: --help was printed; 2: a usage error (printed). */
static int parse_args(int argc, char **argv, cli *c)
{
    for (;;) {
        int opt = zt_cli_next(&c->args, argc, argv), rc = 0;
        if (opt == -1)
            break;
        if (opt == ZT_OPT_HELP)
            usage(c, stdout);
        else if (opt == '?' || opt == ':')
            fprintf(stderr, "zo-plan: unknown option or missing value: %s (see --help)\n",
                    argv[optind - 1]);
        else
            rc = parse_opt(opt, optarg, c);
        if (opt == ZT_OPT_HELP || opt == '?' || opt == ':' || rc)
            return opt == ZT_OPT_HELP ? -1 : 2;
    }
    if (optind == argc)
        return resolve_model(c);
    fprintf(stderr, "zo-plan: unexpected argument '%s' (see --help)\n", argv[optind]);
    return 2;
}

/* ---- planning ---- */

/* The state formats compared: every format of the table (zo_state_format_at),
 * in its order, which is the order auto prefers them in on a tie (fp32 trades
 * nothing, bf16 less than int8). */
enum { ZP_MAX_STATE_FORMATS = 8 };

static int n_state_formats(void)
{
    int n = 0;
    while (n < ZP_MAX_STATE_FORMATS && zo_state_format_at((size_t)n))
        n++;
    return n;
}

static zo_dtype state_format(int i)
{
    return zo_state_format_at((size_t)i)->dtype;
}

/* What a compact format trades for its bytes: measured here (zo-train,
 * 300 steps on the shipped corpus, final validation loss against fp32
 * states: the small preset, seed 1, where fp32 against itself with only
 * the gradient's summation order changed moves 4.6%; the tiny preset's
 * mean over seeds 1-5). */
static const char *state_trade(zo_dtype t)
{
    return t == ZO_DTYPE_BF16  ? "bf16 moments (8 bytes of states per parameter instead of 12): "
                                 "validation loss inside fp32's own run-to-run spread (300 "
                                 "small steps: -3.0%, fp32 against itself -4.6%; tiny, 5 "
                                 "seeds: mean -0.2%)"
           : t == ZO_DTYPE_I8  ? "8-bit blockwise moments as bitsandbytes' 8-bit Adam (block "
                                 "256, fp32 scale per block, about 6 bytes per parameter): "
                                 "validation loss inside fp32's own run-to-run spread (300 "
                                 "small steps: -2.4%, fp32 against itself -4.6%; tiny, 5 "
                                 "seeds: mean -0.0%, worst seed +3.5%)"
           : t == ZO_DTYPE_F32 ? "fp32 master, m and v: nothing traded"
                               : zo_state_format_of(t)->summary; /* a format not measured yet */
}

/* One state format's recommendation, for the comparison. */
typedef struct fmt_row {
    zo_dtype t;
    int fits;
    zp_strategy strategy;
    double step_seconds, mfu, adam_rate, write_per_day, days_to_tbw;
    zp_bottleneck bottleneck;
    uint64_t host_states, nvme_states, nvme_read, nvme_write, nvme_state_bytes;
} fmt_row;

typedef struct result {
    zp_hardware hw;
    zp_hw_facts facts;
    zp_speeds sp;
    int adam_measured;                  /* fp32's Adam rate measured (here or by zo-bench) */
    zp_plan plans[ZP_N_STRATEGIES + 1]; /* the fixed homes, then the per-chunk plan (ZP_SPLIT) */
    int best;                           /* the fastest fixed-homes plan that fits, or -1 */
    int rec;                            /* the recommendation: ZP_SPLIT when it is faster, or -1 */
    uint64_t work;
    char emitted[512];                  /* "" or the config's path */
    int validated[ZP_N_STRATEGIES + 1]; /* 1: ran, -1: the trainer refused or failed (val_err) */
    zp_validation val[ZP_N_STRATEGIES + 1];
    char val_err[ZP_N_STRATEGIES + 1][512];
    fmt_row fmts[ZP_MAX_STATE_FORMATS]; /* the recommendation under each state format */
    char fmt_why[512];                  /* why the job's format (auto: the chosen one) */
    zp_world_plan world[ZP_WORLD_STAGES * ZP_WORLD_STRATEGIES]; /* --world-size > 1 */
    int world_best;                                             /* the fastest that fits, or -1 */
    zp_pipeline_plan pipe[ZP_PIPE_MAX_STAGES]; /* --pipeline-stages: one per stage count */
    int n_pipe, pipe_best;                     /* the most tokens/s that fits, or -1 */
    int max_seq;                               /* --max-seq: the longest that fits */
    char max_seq_why[512];                     /* why one token more does not */
} result;

/* Progress of the long parts (--measure, --validate) on stderr. */
static void say(const char *what)
{
    fprintf(stderr, "zo-plan: %s\n", what);
    fflush(stderr);
}

static zo_status gather_speeds(cli *c, result *r)
{
    r->sp = c->speeds;
    for (int i = 0; i < c->n_bench_json; i++)
        ZT_TRY(zp_read_bench_json(c->bench_json[i], &r->sp, &c->src));
    if (c->measure)
        ZT_TRY(zp_measure(&r->hw, &c->job, c->req.n_nvme_paths ? c->req.nvme_paths[0] : NULL,
                          &r->sp, &c->src, say));
    zp_assume_speeds(r->hw.backend, c->measure, &r->sp, &c->src);
    /* fp32's Adam rate timed here or by zo-bench, not given or assumed */
    const char *adam = c->src.what[ZP_SPEED_ADAM];
    r->adam_measured = strcmp(adam, "measured") == 0 || strncmp(adam, "zo-bench ", 9) == 0;
    return ZO_OK;
}

/* Where figures printed together came from: their one source when they
 * share it, else each figure's by name ("read: measured; write: --nvme-write-gbps"). */
static const char *speed_sources(char *buf, size_t cap, const zp_speed_sources *src,
                                 const int *which, const char *const *names, int n)
{
    int same = 1;
    for (int i = 1; i < n; i++)
        same &= strcmp(src->what[which[i]], src->what[which[0]]) == 0;
    if (same)
        return src->what[which[0]];
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used < cap; i++) {
        int k = snprintf(buf + used, cap - used, "%s%s: %s", i ? "; " : "", names[i],
                         src->what[which[i]]);
        used += k > 0 ? (size_t)k : 0;
    }
    return buf;
}

static zo_status emit(const cli *c, result *r)
{
    const zp_plan *p = &r->plans[r->rec];
    zp_emit e = {c->job.micro_batch,
                 c->job.grad_accum,
                 c->job.dtype == ZO_DTYPE_F16,
                 (int)p->param_home,
                 (int)p->optim_home,
                 (int)p->mode,
                 r->hw.device_bytes,
                 p->pinned.total,
                 p->fp.chunk_bytes,
                 {0},
                 c->req.n_nvme_paths,
                 {p->optim_caps.bytes[ZO_TIER_DEVICE], p->optim_caps.bytes[ZO_TIER_HOST]},
                 {p->param_caps.bytes[ZO_TIER_DEVICE], p->param_caps.bytes[ZO_TIER_HOST]},
                 p->micro_group,
                 (int)p->act_home,
                 zp_trainer_host_mem(&r->hw, p),
                 (int)c->job.state_dtype,
                 c->job.master_split,
                 c->job.embedding_f32,
                 c->job.mlp_chunk_bytes,
                 !c->job.no_update_behind,
                 c->sparse.enabled ? &c->sparse : NULL};
    for (int i = 0; i < c->req.n_nvme_paths; i++)
        e.nvme_paths[i] = c->req.nvme_paths[i];
    ZT_TRY(zp_emit_config(&e, c->emit_path));
    snprintf(r->emitted, sizeof r->emitted, "%s", c->emit_path);
    return ZO_OK;
}

/* Trial runs of the plans that fit; a run that fails is reported, not fatal:
 * a plan the trainer refuses is what --validate is for. */
static void validate_all(const cli *c, result *r)
{
    const char *nvme = c->req.n_nvme_paths ? c->req.nvme_paths[0] : NULL;
    for (int s = 0; s <= ZP_SPLIT; s++) {
        if (!r->plans[s].fits)
            continue;
        char what[256];
        snprintf(what, sizeof what, "trial run: %s, %d step(s) through zo-train's trainer",
                 zp_strategy_name((zp_strategy)s), c->validate);
        say(what);
        zo_status st =
            zp_validate(&c->job, &r->hw, &r->plans[s], c->data, nvme, c->validate, &r->val[s]);
        r->validated[s] = st < 0 ? -1 : 1;
        if (st < 0)
            snprintf(r->val_err[s], sizeof r->val_err[s], "%s", zt_last_error());
    }
}

/* Every fixed placement and the per-chunk plan of c->job, and the recommendation. */
static zo_status plan_job(cli *c, result *r)
{
    r->work = 0;
    for (int s = 0; s < ZP_N_STRATEGIES; s++)
        ZT_TRY(zp_plan_strategy(&c->job, &r->hw, &r->sp, (zp_strategy)s, c->nvme_tbw, &r->plans[s],
                                &r->work));
    ZT_TRY(zp_plan_split(&c->job, &r->hw, &r->sp, c->nvme_tbw, &r->plans[ZP_SPLIT], &r->work));
    r->best = zp_recommend(r->plans, ZP_N_STRATEGIES);
    const zp_plan *split = &r->plans[ZP_SPLIT];
    /* the per-chunk plan when it is faster than every fixed placement that fits */
    r->rec = split->fits && (r->best < 0 || split->step_seconds < r->plans[r->best].step_seconds)
                 ? ZP_SPLIT
                 : r->best;
    return ZO_OK;
}

static fmt_row row_of(const result *r, zo_dtype t)
{
    fmt_row f = {.t = t, .fits = r->rec >= 0, .adam_rate = zp_adam_rate(&r->sp, t)};
    if (r->rec < 0)
        return f;
    const zp_plan *p = &r->plans[r->rec];
    f.strategy = p->strategy;
    f.step_seconds = p->step_seconds;
    f.mfu = p->mfu;
    f.write_per_day = p->nvme_write_per_day;
    f.days_to_tbw = p->days_to_tbw;
    f.bottleneck = p->bottleneck;
    f.host_states = p->host.states;
    f.nvme_states = p->nvme.states;
    f.nvme_read = p->nvme_read_bytes;
    f.nvme_write = p->nvme_write_bytes;
    f.nvme_state_bytes = p->nvme_state_bytes;
    return f;
}

/* auto: the fastest format whose plan fits, fp32 unless a compact one is
 * more than 2% faster (a step no faster is no reason to trade precision),
 * and bf16 over int8 unless int8 is 2% faster still. */
static zo_dtype choose_format(const result *r)
{
    int k = 0;
    for (int i = 1; i < n_state_formats(); i++)
        if (r->fmts[i].fits &&
            (!r->fmts[k].fits || r->fmts[i].step_seconds < 0.98 * r->fmts[k].step_seconds))
            k = i;
    return r->fmts[k].t;
}

static void explain_format(const cli *c, result *r)
{
    const fmt_row *f32 = &r->fmts[0], *me = NULL;
    for (int i = 0; i < n_state_formats(); i++)
        if (r->fmts[i].t == c->job.state_dtype)
            me = &r->fmts[i];
    const char *how = c->state_auto ? "auto chose" : "--state-dtype";
    if (me->t == ZO_DTYPE_F32 || !f32->fits || !me->fits)
        snprintf(r->fmt_why, sizeof r->fmt_why, "%s %s: %s", how,
                 zt_state_dtype_name(c->job.state_dtype), state_trade(c->job.state_dtype));
    else
        snprintf(r->fmt_why, sizeof r->fmt_why,
                 "%s %s: step %.3g s instead of fp32's %.3g s "
                 "(fp32's bottleneck: %s); it trades %s",
                 how, zt_state_dtype_name(me->t), me->step_seconds, f32->step_seconds,
                 zp_bottleneck_name(f32->bottleneck), state_trade(me->t));
}

/* The ranks per node and the link where not given. */
static void fill_world(zp_world *w, const result *r)
{
    if (!w->gpus_per_node || w->gpus_per_node > w->world_size)
        w->gpus_per_node = w->world_size;
    if (!(w->link > 0)) {
        w->link = strcmp(r->hw.backend, "cuda") == 0 ? ZP_LINK_CUDA_BPS : ZP_LINK_CPU_BPS;
        snprintf(w->link_source, sizeof w->link_source, "assumed");
    }
    if (!(w->node_link > 0)) {
        w->node_link = w->link;
        snprintf(w->node_link_source, sizeof w->node_link_source, "%s", w->link_source);
    }
}

/* ZeRO over --world-size ranks, the node's share and the link filled in. */
static zo_status plan_world(cli *c, result *r)
{
    zp_world *w = &c->world;
    fill_world(w, r);
    w->tensor_parallel = c->tp > 0 ? c->tp : 1; /* auto: the grids choose T, ZeRO plans T 1 */
    return zp_plan_world(&c->job, &r->hw, &r->sp, w, c->nvme_tbw, r->world, &r->world_best,
                         &r->work);
}

/* The grids planned, (S, T) pairs: the stage count given, or auto's
 * divisors of the world size (none above the engine layers); the tensor
 * parallelism given (1 when not), or auto's divisors of the world size
 * that split the model (zt_tp_check); S x T dividing the world size. */
static zo_status grids(const cli *c, int *S_out, int *T_out, int *n)
{
    int N = c->pipe_world.world_size, E = zt_engine_layers(&c->job.shape);
    *n = 0;
    if ((c->pipe_stages < 0 || c->tp < 0) && c->world.world_size < 2)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--pipeline-stages auto and --tensor-parallel auto choose among the "
                       "divisors of --world-size: give --world-size N (the GPUs), N >= 2");
    if (c->tp > 0)
        ZT_TRY(zt_tp_check(&c->job.shape, c->tp));
    const int seq = c->job.seq, sp = c->job.sequence_parallel;
    if (sp && c->tp > 1 && seq % c->tp != 0)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--sequence-parallel splits each sequence over the %d tensor-parallel "
                       "ranks, but --seq %d is not a multiple of %d: use --seq %d or %d",
                       c->tp, seq, c->tp, seq / c->tp * c->tp, (seq / c->tp + 1) * c->tp);
    for (int T = 1; T <= N && T <= 64; T++) {
        if (c->tp > 0 ? T != c->tp : c->tp == 0 ? T != 1 : N % T != 0)
            continue;
        if (c->tp < 0 && zt_tp_check(&c->job.shape, T) < 0)
            continue; /* auto: a T that does not split the model is not a candidate */
        if (c->tp < 0 && sp && seq % T != 0)
            continue; /* nor one that does not split the sequence */
        /* a given S is planned whatever it is (the planner refuses it by name) */
        int most = c->pipe_stages > 0 ? c->pipe_stages : N < E ? N : E;
        for (int S = 1; S <= most && *n < ZP_PIPE_MAX_STAGES; S++) {
            if (c->pipe_stages > 0    ? S != c->pipe_stages
                : c->pipe_stages == 0 ? S != 1
                                      : N % (S * T) != 0)
                continue;
            S_out[*n] = S;
            T_out[(*n)++] = T;
        }
    }
    return ZO_OK;
}

/* --pipeline-stages, --tensor-parallel: each grid's plan and the fastest
 * that fits (the most tokens per second: at one world size fewer stages
 * and tensor ranks mean more data-parallel ranks and more tokens per step). */
static zo_status plan_pipe(cli *c, result *r)
{
    if (c->n_pipe_split && c->pipe_stages <= 0)
        c->pipe_stages = c->n_pipe_split + 1;
    if (c->n_pipe_split && c->n_pipe_split != c->pipe_stages - 1)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--pipeline-split names %d first layers but --pipeline-stages %d needs "
                       "%d (stages 1..S-1)",
                       c->n_pipe_split, c->pipe_stages, c->pipe_stages - 1);
    c->pipe_world = c->world;
    if (c->pipe_world.world_size < 2) /* one rank per stage and tensor rank */
        c->pipe_world.world_size =
            (c->pipe_stages > 0 ? c->pipe_stages : 1) * (c->tp > 0 ? c->tp : 1);
    fill_world(&c->pipe_world, r);
    int S[ZP_PIPE_MAX_STAGES], T[ZP_PIPE_MAX_STAGES], n;
    ZT_TRY(grids(c, S, T, &n));
    r->pipe_best = -1;
    for (int i = 0; i < n; i++) {
        zp_job job = c->job;
        job.tensor_parallel = T[i];
        ZT_TRY(zp_plan_pipeline(&job, &r->hw, &r->sp, &c->pipe_world, S[i],
                                c->n_pipe_split ? c->pipe_split : NULL, c->nvme_tbw, &r->pipe[i],
                                &r->work));
        r->n_pipe = i + 1;
        const zp_pipeline_plan *p = &r->pipe[i];
        if (p->fits && (r->pipe_best < 0 || p->tokens_per_s > r->pipe[r->pipe_best].tokens_per_s))
            r->pipe_best = i;
    }
    if (!n)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "no grid of --pipeline-stages and --tensor-parallel divides --world-size "
                       "%d for this model",
                       c->pipe_world.world_size);
    return ZO_OK;
}

static zp_pipe_report pipe_report(const cli *c, const result *r)
{
    zp_pipe_report p = {r->pipe, r->n_pipe,      r->pipe_best, c->pipe_stages < 0 || c->tp < 0,
                        &c->job, &c->pipe_world, &r->hw,       &r->sp};
    return p;
}

/* Whether some plan of c->job fits: a fixed placement or the per-chunk
 * plan, under the job's state format or, with --state-dtype auto, any. A
 * length the planner refuses outright (beyond the trainer's sizes) does not. */
static int job_fits_at_chunk(cli *c, result *r)
{
    zo_dtype want = c->job.state_dtype;
    int fits = 0;
    for (int i = 0; !fits && i < n_state_formats(); i++) {
        if (c->state_auto)
            c->job.state_dtype = state_format(i);
        fits = plan_job(c, r) >= 0 && r->rec >= 0;
        if (!c->state_auto)
            break;
    }
    c->job.state_dtype = want;
    return fits;
}

/* --mlp-chunk-bytes auto's candidates, largest first: zo-train's default
 * (ZO_MLP_CHUNK_BYTES or 16 MiB), then its halvings down to one row of the
 * ffn width (the least the chunks can hold). 0 after the last. */
static uint64_t mlp_chunk_next(const cli *c, uint64_t bytes)
{
    uint64_t row = (uint64_t)c->job.shape.ffn_dim * zo_dtype_size(c->job.dtype);
    if (!bytes)
        return zt_mlp_chunk_bytes() > row ? zt_mlp_chunk_bytes() : row;
    return bytes > row ? (bytes / 2 > row ? bytes / 2 : row) : 0;
}

/* job_fits_at_chunk; with --mlp-chunk-bytes auto over the candidates until
 * one fits: c->job.mlp_chunk_bytes is left at the largest that does (larger
 * chunks, fewer passes over the weights), else at the smallest (the job's
 * closest to fitting). Smaller chunks never need more memory, so the
 * largest that fits is the one to run. */
static int job_fits(cli *c, result *r)
{
    if (!c->mlp_auto)
        return job_fits_at_chunk(c, r);
    uint64_t last = 0;
    for (uint64_t b = mlp_chunk_next(c, 0); b; b = mlp_chunk_next(c, b)) {
        c->job.mlp_chunk_bytes = last = b;
        if (job_fits_at_chunk(c, r))
            return 1;
    }
    c->job.mlp_chunk_bytes = last;
    return 0;
}

/* Why c->job does not fit: the per-chunk plan's reason (the most flexible
 * placement), else the planner's refusal. */
static void why_not(cli *c, result *r, char *out, size_t cap)
{
    if (plan_job(c, r) < 0)
        snprintf(out, cap, "%s", zt_last_error());
    else
        snprintf(out, cap, "%s", r->plans[ZP_SPLIT].why);
}

/* --max-seq: the longest --seq that fits, by doubling then bisection (the
 * memory of every tier grows with the length, so fitting is monotone);
 * c->job.seq becomes it. */
enum { ZP_MAX_SEQ_LIMIT = 1 << 24 };
static zo_status find_max_seq(cli *c, result *r)
{
    int lo = 0, hi = 1;
    while (hi <= ZP_MAX_SEQ_LIMIT && (c->job.seq = hi, job_fits(c, r)))
        lo = hi, hi *= 2;
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        c->job.seq = mid;
        if (job_fits(c, r))
            lo = mid;
        else
            hi = mid;
    }
    c->job.seq = lo + 1;
    job_fits(c, r); /* auto: the chunk that comes closest */
    why_not(c, r, r->max_seq_why, sizeof r->max_seq_why);
    if (!lo)
        return zt_fail(ZO_ERR_BUDGET, "--max-seq: not even --seq 1 fits at --micro-batch %d: %s",
                       c->job.micro_batch, r->max_seq_why);
    c->job.seq = r->max_seq = lo;
    return ZO_OK;
}

/* The MLP chunk the plans are made at: with auto, the largest candidate
 * that lets some plan fit (at --max-seq's length, found above). */
static void choose_mlp_chunk(cli *c, result *r)
{
    if (c->mlp_auto)
        job_fits(c, r);
}

static zo_status plan_all(cli *c, result *r)
{
    ZT_TRY(zp_detect_hardware(&c->req, &r->hw, &r->facts));
    ZT_TRY(gather_speeds(c, r));
    if (c->max_seq)
        ZT_TRY(find_max_seq(c, r));
    choose_mlp_chunk(c, r);
    zo_dtype want = c->job.state_dtype;
    for (int i = 0; i < n_state_formats(); i++) {
        c->job.state_dtype = state_format(i);
        ZT_TRY(plan_job(c, r));
        r->fmts[i] = row_of(r, state_format(i));
    }
    c->job.state_dtype = c->state_auto ? choose_format(r) : want;
    ZT_TRY(plan_job(c, r));
    explain_format(c, r);
    if (c->job.sequence_parallel && !c->tp)
        return zt_fail(ZO_ERR_INVALID_ARG, "--sequence-parallel shards the sequence over the "
                                           "tensor-parallel ranks: give --tensor-parallel T|auto");
    if (c->pipe_stages || c->n_pipe_split || c->tp)
        ZT_TRY(plan_pipe(c, r));
    if (c->world.world_size > 1)
        ZT_TRY(plan_world(c, r));
    if (c->validate)
        validate_all(c, r);
    if (c->emit_path && r->rec < 0)
        return zt_fail(ZO_ERR_BUDGET,
                       "--emit-config: no strategy fits, so there is nothing to write");
    if (c->emit_path)
        ZT_TRY(emit(c, r));
    return ZO_OK;
}

/* ---- human output ---- */

static const char *B(char *buf, uint64_t b)
{
    return zo_fmt_bytes_prec(buf, 32, b, 1);
}

static int shape_overridden(const cli *c)
{
    for (int i = 0; i < 5; i++)
        if (c->shape_flags[i])
            return 1;
    return 0;
}

static void print_header(const cli *c, const result *r)
{
    const zt_shape *s = &c->job.shape;
    char a[32], b[32], d[32];
    printf("zo-plan: %s%s, %.2fM parameters (dim %d, %d layers, %d heads, ffn %d, vocab %d), %s\n",
           c->hf_config ? c->hf_config : c->preset, shape_overridden(c) ? " with shape flags" : "",
           zt_shape_n_params(s) / 1e6, s->dim, s->n_layers, s->n_heads, s->ffn_dim, s->vocab,
           zo_dtype_name(c->job.dtype));
    if (c->model_note[0])
        printf("  note: %s\n", c->model_note);
    printf(
        "  job: seq %d x micro-batch %d x grad-accum %d = %d tokens per step; AdamW, %s states%s; "
        "optimizer mode %s\n",
        c->job.seq, c->job.micro_batch, c->job.grad_accum,
        c->job.seq * c->job.micro_batch * c->job.grad_accum,
        zt_state_dtype_name(c->job.state_dtype),
        c->state_auto         ? " (auto)"
        : c->job.master_split ? " (master split on NVMe)"
                              : "",
        zo_optim_mode_name(c->job.mode));
    printf("  device: %s (%s), %s (%s)%s\n", r->hw.backend, r->hw.device_name,
           B(a, r->hw.device_bytes), r->facts.device_how,
           r->hw.reserve_bytes ? ", 512 MiB of it for the CUDA context" : "");
    printf("  host: %s for pinned + pageable (%s; %d NUMA node(s), %d cores)%s%s\n",
           B(b, r->hw.host_bytes), r->facts.host_how, r->facts.numa_nodes, r->facts.cores,
           r->hw.pinned_max ? ", pinned at most " : "",
           r->hw.pinned_max ? B(d, r->hw.pinned_max) : "");
    if (zp_numa_ram_disagrees(&r->facts))
        printf("  note: hwloc's NUMA nodes hold %s of the %s of RAM the kernel reports; the plan "
               "uses the kernel's figure\n",
               B(a, r->facts.numa_ram), B(b, r->facts.host_ram));
    printf("  nvme: %s over %d path(s) (%s)\n", B(a, r->hw.nvme_bytes), r->hw.n_nvme_paths,
           r->facts.nvme_how);
    char upd[48] = "", links[256], nvme[400];
    if (r->sp.nvme_update > 0)
        snprintf(upd, sizeof upd, ", update pipeline %.2f", r->sp.nvme_update / 1e9);
    static const int link_of[] = {ZP_SPEED_H2D, ZP_SPEED_D2H},
                     nvme_of[] = {ZP_SPEED_NVME_READ, ZP_SPEED_NVME_WRITE, ZP_SPEED_NVME_UPDATE};
    static const char *const link_names[] = {"h2d", "d2h"};
    static const char *const nvme_names[] = {"read", "write", "update"};
    printf("  speeds: h2d %.2f GB/s, d2h %.2f GB/s (%s); nvme read %.2f, write %.2f%s GB/s (%s); "
           "CPU Adam "
           "%.3f Gparams/s (%s); device %.3g TFLOPS (%s), on the model's layers %.3g (%s)\n",
           r->sp.h2d / 1e9, r->sp.d2h / 1e9,
           speed_sources(links, sizeof links, &c->src, link_of, link_names, 2),
           r->sp.nvme_read / 1e9, r->sp.nvme_write / 1e9, upd,
           speed_sources(nvme, sizeof nvme, &c->src, nvme_of, nvme_names,
                         r->sp.nvme_update > 0 ? 3 : 2),
           r->sp.adam_params / 1e9, c->src.what[ZP_SPEED_ADAM], r->sp.flops / 1e12,
           c->src.what[ZP_SPEED_FLOPS], r->sp.model_flops / 1e12,
           c->src.what[ZP_SPEED_MODEL_FLOPS]);
}

static void print_table(const result *r)
{
    char a[32], b[32], d[32], e[32], f[32];
    printf("\n%-22s %-4s %10s %10s %10s %10s %10s %9s  %-14s %10s %6s\n", "strategy", "fits",
           "chunk", "device", "pinned", "host", "nvme", "step s", "bottleneck", "tokens/s", "MFU");
    for (int s = 0; s <= ZP_SPLIT; s++) {
        const zp_plan *p = &r->plans[s];
        printf("%-22s %-4s %10s %10s %10s %10s %10s %9.3g  %-14s %10.4g %5.1f%%\n",
               zp_strategy_name(p->strategy), p->fits ? "yes" : "no", B(a, p->fp.chunk_bytes),
               B(b, p->device.total), B(d, p->pinned.total), B(e, p->host.total),
               B(f, p->nvme.files), p->step_seconds, zp_bottleneck_name(p->bottleneck),
               p->tokens_per_s, 100 * p->mfu);
    }
}

static void bar(const char *tier, uint64_t use, uint64_t budget, const char *detail)
{
    enum { W = 30 };
    char a[32], b[32], cells[W + 1];
    int n = budget ? (int)fmin(W, ceil((double)use / (double)budget * W)) : (use ? W : 0);
    for (int i = 0; i < W; i++)
        cells[i] = i < n ? '#' : '.';
    cells[W] = 0;
    printf("    %-7s [%s]%s %s of %s: %s\n", tier, cells, budget && use > budget ? "!" : " ",
           B(a, use), budget ? B(b, budget) : "none", detail);
}

static void print_plan_bars(const result *r, const zp_plan *p)
{
    char det[512], a[32], b[32], c[32], d[32], e[32], f[32], g[32];
    printf("  %s%s: %u chunks of %s (%u per layer at most), %u device parameter slots\n",
           zp_strategy_name(p->strategy), p->fits ? "" : " (does not fit)", p->fp.n_chunks,
           B(a, p->fp.chunk_bytes), p->fp.max_chunks_per_layer, p->fp.device_param_slots);
    snprintf(det, sizeof det,
             "params %s, param slots %s, grads %s, optimizer %s, checkpoints %s, workspace %s, "
             "inputs %s, reserve %s",
             B(a, p->device.params), B(b, p->device.param_slots), B(c, p->device.grads),
             B(d, p->device.states), B(e, p->device.checkpoints), B(f, p->device.workspace),
             B(g, p->device.inputs), B((char[32]){0}, p->device.reserve));
    bar("device", p->device.total, r->hw.device_bytes, det);
    snprintf(det, sizeof det, "16-bit params %s, grads %s, NVMe staging %s, param staging %s",
             B(a, p->pinned.params), B(b, p->pinned.grads), B(c, p->pinned.staging),
             B(d, p->pinned.twins));
    bar("pinned", p->pinned.total, r->hw.pinned_max ? r->hw.pinned_max : r->hw.host_bytes, det);
    snprintf(det, sizeof det, "optimizer states %s, overlap backups %s, fp32 accumulators %s",
             B(a, p->host.states), B(b, p->host.backups), B(c, p->host.accum));
    bar("host", p->pinned.total + p->host.total, r->hw.host_bytes, det);
    snprintf(det, sizeof det,
             "optimizer states %s, 16-bit params %s, layer inputs %s (payload; files with headers)",
             B(a, p->nvme.states), B(b, p->nvme.params), B(c, p->nvme.layer_inputs));
    bar("nvme", p->nvme.files, r->hw.nvme_bytes, det);
    printf("    step %.4g s = compute %.3g, h2d %.3g, d2h %.3g, nvme %.3g, optimizer %.3g s alone; "
           "bottleneck %s\n",
           p->step_seconds, p->seconds[ZP_BN_COMPUTE], p->seconds[ZP_BN_H2D], p->seconds[ZP_BN_D2H],
           p->seconds[ZP_BN_NVME], p->seconds[ZP_BN_OPTIM], zp_bottleneck_name(p->bottleneck));
    if (p->nvme_write_bytes)
        printf("    nvme writes %s per step, %s per day%s", B(a, p->nvme_write_bytes),
               B(b, (uint64_t)p->nvme_write_per_day), p->days_to_tbw > 0 ? "" : "\n");
    if (p->nvme_write_bytes && p->days_to_tbw > 0)
        printf(": the rated endurance lasts %.1f days\n", p->days_to_tbw);
    if (!p->fits)
        printf("    why not: %s\n", p->why);
}

static void print_split_terms(const zp_plan *p)
{
    char a[32], b[32], c[32], d[32], e[32];
    printf("    homes: 16-bit params device %u / host %u / nvme %u chunks (param_caps device %s, "
           "host %s); optimizer states device %u / host %u / nvme %u (optim_caps host %s)\n",
           p->param_homes[0], p->param_homes[1], p->param_homes[2],
           B(a, p->param_caps.bytes[ZO_TIER_DEVICE]), B(b, p->param_caps.bytes[ZO_TIER_HOST]),
           p->optim_homes[0], p->optim_homes[1], p->optim_homes[2],
           B(c, p->optim_caps.bytes[ZO_TIER_HOST]));
    printf("    micro-group %d (%d group(s) per step), layer inputs on the %s: %s; optimizer mode "
           "%s; host budget %s (the engine's share %s)\n",
           p->micro_group, p->n_groups, zp_act_where(p->act_home), B(a, p->layer_inputs),
           zo_optim_mode_name(p->mode), B(b, p->host_budget), B(c, p->engine_host_budget));
    printf("    gradients: %s for the update, %s of them kept in host memory, %s spilled to NVMe\n",
           B(a, p->grad_store), B(b, p->grad_store - p->grad_spill), B(c, p->grad_spill));
    printf("    per step: h2d %s of parameters + %s of layer inputs, d2h %s of gradients + %s of "
           "layer inputs, nvme %s read / %s written\n",
           B(a, p->h2d_param_bytes), B(b, p->h2d_act_bytes), B(c, p->d2h_grad_bytes),
           B(d, p->d2h_act_bytes), B(e, p->nvme_read_bytes), B((char[32]){0}, p->nvme_write_bytes));
    if (p->nvme_act_bytes)
        printf("    of which layer inputs on NVMe: %s written and read back per step\n",
               B(a, p->nvme_act_bytes));
    if (p->modelled.device || p->modelled.pinned)
        printf("    modelled by zo-plan until the engine computes them (staging in place of "
               "mirrors, where homes are NVMe): pinned %+.2f GiB beside its footprint\n",
               (double)p->modelled.pinned / (1 << 30));
    if (p->host_floor)
        printf("    the least host memory a per-chunk plan of this job takes: %s\n",
               B(a, p->host_floor));
}

static void print_validation(const result *r)
{
    char a[32], b[32], d[32], e[32];
    printf("\ntrial runs through zo-train's trainer (measured; predicted in the table above):\n");
    for (int s = 0; s <= ZP_SPLIT; s++) {
        const zp_plan *p = &r->plans[s];
        const zp_validation *v = &r->val[s];
        if (r->validated[s] < 0)
            printf("  %-22s failed: %s\n", zp_strategy_name(p->strategy), r->val_err[s]);
        if (r->validated[s] <= 0)
            continue;
        printf(
            "  %-22s step %.4g s (predicted %.4g s, %+.1f%%); peaks device %s, pinned %s, host %s, "
            "nvme %s%s\n",
            zp_strategy_name(p->strategy), v->step_seconds, p->step_seconds,
            100 * (p->step_seconds - v->step_seconds) / v->step_seconds,
            B(a, v->last.peak[ZO_TIER_DEVICE]), B(b, v->last.peak_pinned),
            B(d, v->last.peak[ZO_TIER_HOST]), B(e, v->last.peak[ZO_TIER_NVME]),
            v->last.peak[ZO_TIER_DEVICE] == p->peak_device &&
                    v->last.peak_pinned == p->peak_pinned &&
                    v->last.peak[ZO_TIER_HOST] == p->peak_host &&
                    v->last.peak[ZO_TIER_NVME] == p->peak_nvme
                ? " (as planned)"
                : " (the plan differs)");
        printf("  %-22s   of its last step: optimizer busy %.4g s (predicted update %.4g: Adam "
               "%.4g, beside its NVMe), waiting on NVMe %.4g s (predicted NVMe %.4g)\n",
               "", v->last.optim_seconds, p->update_seconds, p->seconds[ZP_BN_OPTIM],
               v->last.nvme_seconds, p->seconds[ZP_BN_NVME]);
    }
}

/* What zo-train is told to run plan w (stage and homes). */
static void world_command(const cli *c, const zp_world_plan *w, char *buf, size_t cap)
{
    const zp_plan *p = &w->plan;
    snprintf(buf, cap,
             "mpirun -np %d zo-train --zero-stage %d --offload-param %s --offload-optimizer %s "
             "--chunk-bytes %llu --optimizer-mode %s --state-dtype %s",
             c->world.world_size, w->stage, zt_home_name(p->param_home),
             zt_home_name(p->optim_home), (unsigned long long)p->fp.chunk_bytes,
             zo_optim_mode_name(p->mode), zt_state_dtype_name(c->job.state_dtype));
    size_t n = strlen(buf);
    if (c->world.tensor_parallel > 1 && n < cap)
        snprintf(buf + n, cap - n, " --tensor-parallel %d", c->world.tensor_parallel);
}

static void print_world(const cli *c, const result *r)
{
    const zp_world *w = &c->world;
    zp_hardware hw;
    zp_speeds sp;
    zp_world_rank_share(w, &r->hw, &r->sp, &hw, &sp);
    char a[32], b[32], d[32], e[32];
    printf("\nZeRO over %d ranks, %d per node, link %.3g GB/s (%s): each rank plans against its "
           "share of the node: host %s, nvme %s, nvme read %.3g / write %.3g GB/s, CPU Adam "
           "%.3g Gparams/s; %d tokens per step over all ranks\n",
           w->world_size, w->gpus_per_node, w->link / 1e9, w->link_source, B(a, hw.host_bytes),
           B(b, hw.nvme_bytes), sp.nvme_read / 1e9, sp.nvme_write / 1e9, sp.adam_params / 1e9,
           c->job.seq * c->job.micro_batch * c->job.grad_accum * w->world_size /
               (w->tensor_parallel > 1 ? w->tensor_parallel : 1));
    if (w->tensor_parallel > 1)
        printf("tensor parallel %d: each rank holds 1/%d of every tensor, ZeRO over the %d "
               "data-parallel ranks\n",
               w->tensor_parallel, w->tensor_parallel, w->world_size / w->tensor_parallel);
    printf("%-5s %-22s %-4s %10s %10s %10s %10s %9s %9s %10s %6s  %s\n", "stage", "placement",
           "fits", "device", "pinned", "host", "nvme", "step s", "link s", "tokens/s", "MFU",
           "bottleneck");
    for (int i = 0; i < ZP_WORLD_STAGES * ZP_WORLD_STRATEGIES; i++) {
        const zp_world_plan *o = &r->world[i];
        const zp_plan *p = &o->plan;
        printf("%-5d %-22s %-4s %10s %10s %10s %10s %9.3g %9.3g %10.4g %5.1f%%  %s\n", o->stage,
               zp_strategy_name(p->strategy), p->fits ? "yes" : "no", B(a, p->device.total),
               B(b, p->pinned.total), B(d, p->host.total), B(e, p->nvme.files), o->step_seconds,
               o->link_seconds, o->tokens_per_s, 100 * o->mfu,
               o->link_bound ? "links between ranks" : zp_bottleneck_name(p->bottleneck));
        if (!p->fits)
            printf("      %s\n", p->why);
    }
    if (r->world_best < 0) {
        printf("recommended over %d ranks: none fits (see the reasons above)\n", w->world_size);
        return;
    }
    const zp_world_plan *o = &r->world[r->world_best];
    char cmd[512];
    world_command(c, o, cmd, sizeof cmd);
    printf("recommended over %d ranks: stage %d, %s: %.4g s per step, %.4g tokens/s, MFU %.1f%%; "
           "%s\n",
           w->world_size, o->stage, zp_strategy_name(o->plan.strategy), o->step_seconds,
           o->tokens_per_s, 100 * o->mfu, cmd);
}

static void print_deepspeed(const cli *c)
{
    zp_ds_row rows[ZP_DS_ROWS];
    char a[32], b[32];
    zp_deepspeed_estimate(zt_shape_n_params(&c->job.shape), zt_largest_tensor(&c->job.shape), rows);
    printf("\nDeepSpeed's estimators (model states only: no activations, no buffers, no pinned "
           "rounding, nothing on NVMe), one GPU:\n");
    for (int i = 0; i < ZP_DS_ROWS; i++)
        printf("  %s  cpu %10s  gpu %10s  %s\n", rows[i].stage, B(a, rows[i].cpu),
               B(b, rows[i].gpu), rows[i].options);
}

/* The recommendation under each state format: bytes, NVMe traffic and wear, speed. */
static void print_formats(const result *r)
{
    char a[32], b[32], d[32], e[32];
    printf("\nstate formats (the recommended plan under each; CPU Adam %s):\n",
           r->sp.adam_params_bf16 > 0 ? "measured per format"
                                      : "bf16 1.3x and int8 1.5x fp32's rate, zo-bench's "
                                        "ratios on AVX-512");
    printf("  %-5s %-22s %10s %10s %10s %10s %9s %9s %10s %6s  %s\n", "dtype", "strategy",
           "host st.", "nvme st.", "nvme rd", "nvme wr", "TB/day", "Gparam/s", "step s", "MFU",
           "bottleneck");
    for (int i = 0; i < n_state_formats(); i++) {
        const fmt_row *f = &r->fmts[i];
        if (!f->fits) {
            printf("  %-5s nothing fits\n", zt_state_dtype_name(f->t));
            continue;
        }
        printf("  %-5s %-22s %10s %10s %10s %10s %9.3g %9.3g %10.4g %5.1f%%  %s\n",
               zt_state_dtype_name(f->t), zp_strategy_name(f->strategy), B(a, f->host_states),
               B(b, f->nvme_states), B(d, f->nvme_read), B(e, f->nvme_write),
               f->write_per_day / 1e12, f->adam_rate / 1e9, f->step_seconds, 100 * f->mfu,
               zp_bottleneck_name(f->bottleneck));
    }
    printf("  %s\n", r->fmt_why);
}

/* The layout's kind as DeepSpeed's sparse_attention.mode names it. */
static const char *layout_name(const zo_attn_layout *l)
{
    static const char *const names[] = {"dense", "sliding_window", "fixed", "bigbird"};
    return (unsigned)l->kind < 4 ? names[l->kind] : "?";
}

/* The share of causal attention's blocks the layout keeps at the job's seq
 * (no window: the shape's windowed layers count theirs apart). */
static double layout_share(const cli *c)
{
    double share = NAN;
    zt_layout_share(&c->job.layout, 0, c->job.seq, &share);
    return share;
}

/* The MLP chunk the plans counted: the job's, or zo-train's default. */
static uint64_t mlp_chunk_bytes(const cli *c)
{
    return c->job.mlp_chunk_bytes ? c->job.mlp_chunk_bytes : zt_mlp_chunk_bytes();
}

static void print_human(const cli *c, const result *r)
{
    print_header(c, r);
    print_table(r);
    printf("\nper tier (use of budget):\n");
    for (int s = 0; s <= ZP_SPLIT; s++)
        print_plan_bars(r, &r->plans[s]);
    print_split_terms(&r->plans[ZP_SPLIT]);
    print_formats(r);
    if (r->rec >= 0) {
        const zp_plan *p = &r->plans[r->rec];
        printf(
            "\nrecommended: %s (the fastest plan that fits): %.4g s per step, %.4g tokens/s, MFU "
            "%.1f%%, bottleneck %s; zo-train --offload-param %s --offload-optimizer %s "
            "--chunk-bytes %llu --optimizer-mode %s --state-dtype %s --mlp-chunk-bytes %llu",
            zp_strategy_name(p->strategy), p->step_seconds, p->tokens_per_s, 100 * p->mfu,
            zp_bottleneck_name(p->bottleneck), zt_home_name(p->param_home),
            zt_home_name(p->optim_home), (unsigned long long)p->fp.chunk_bytes,
            zo_optim_mode_name(p->mode), zt_state_dtype_name(c->job.state_dtype),
            (unsigned long long)mlp_chunk_bytes(c));
        if (p->strategy == ZP_SPLIT)
            printf(" --param-device-bytes %llu --optim-host-bytes %llu --host-mem %llu "
                   "--micro-group %d --act-home %s",
                   (unsigned long long)p->param_caps.bytes[ZO_TIER_DEVICE],
                   (unsigned long long)p->optim_caps.bytes[ZO_TIER_HOST],
                   (unsigned long long)zp_trainer_host_mem(&r->hw, p), p->micro_group,
                   zp_act_home_name(p->act_home));
        if (c->job.no_update_behind)
            printf(" --update-behind off");
        printf("\n");
        if (p->strategy == ZP_SPLIT)
            printf("  why: %s\n", p->reason);
    } else {
        printf("\nrecommended: none: no strategy fits (see the reasons above)\n");
    }
    if (c->job.layout.struct_size)
        printf("sparse_attention: %s, block %d: %.4g of causal attention's blocks at seq %d "
               "(the attention's FLOPs scaled by it; zo-train reads the section from --config, "
               "which --emit-config writes)\n",
               layout_name(&c->job.layout), c->job.layout.block, layout_share(c), c->job.seq);
    if (c->max_seq)
        printf("longest sequence: %d tokens at --micro-batch %d (the plans above); %d does not "
               "fit: %s\n",
               r->max_seq, c->job.micro_batch, r->max_seq + 1, r->max_seq_why);
    if (r->emitted[0]) {
        const zt_shape *sh = &c->job.shape;
        printf(
            "config written to %s: zo-train --config %s --seq %d --vocab %d --dim %d --layers %d "
            "--heads %d --ffn %d%s\n",
            r->emitted, r->emitted, c->job.seq, sh->vocab, sh->dim, sh->n_layers, sh->n_heads,
            sh->ffn_dim, strcmp(r->hw.backend, "cpu") == 0 ? " --device cpu" : "");
    }
    if (c->validate)
        print_validation(r);
    if (c->world.world_size > 1)
        print_world(c, r);
    if (c->pipe_stages || c->tp) {
        zp_pipe_report p = pipe_report(c, r);
        zp_print_pipeline(&p);
    }
    if (c->ds_estimate)
        print_deepspeed(c);
}

/* ---- JSON ---- */

static json_t *ju(uint64_t v)
{
    return json_integer((json_int_t)v);
}

static json_t *json_plan(const zp_plan *p)
{
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(zp_strategy_name(p->strategy)));
    json_object_set_new(o, "offload_param", json_string(zt_home_name(p->param_home)));
    json_object_set_new(o, "offload_optimizer", json_string(zt_home_name(p->optim_home)));
    json_object_set_new(o, "supported", json_boolean(p->supported));
    json_object_set_new(o, "fits", json_boolean(p->fits));
    json_object_set_new(o, "why", p->fits ? json_null() : json_string(p->why));
    json_object_set_new(o, "chunk_bytes", ju(p->fp.chunk_bytes));
    json_object_set_new(o, "chunks", ju(p->fp.n_chunks));
    json_object_set_new(o, "device_param_slots", ju(p->fp.device_param_slots));
    json_object_set_new(o, "peak_bytes",
                        json_pack("{s:o,s:o,s:o,s:o}", "device", ju(p->peak_device), "pinned",
                                  ju(p->peak_pinned), "host", ju(p->peak_host), "nvme",
                                  ju(p->peak_nvme)));
    json_object_set_new(o, "device_bytes",
                        json_pack("{s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "params",
                                  ju(p->device.params), "param_slots", ju(p->device.param_slots),
                                  "grads", ju(p->device.grads), "optimizer", ju(p->device.states),
                                  "inputs", ju(p->device.inputs), "checkpoints",
                                  ju(p->device.checkpoints), "workspace", ju(p->device.workspace),
                                  "reserve", ju(p->device.reserve), "engine_budget",
                                  ju(p->device.engine_budget), "total", ju(p->device.total)));
    json_object_set_new(o, "pinned_bytes",
                        json_pack("{s:o,s:o,s:o,s:o,s:o}", "params", ju(p->pinned.params), "grads",
                                  ju(p->pinned.grads), "nvme_staging", ju(p->pinned.staging),
                                  "param_staging", ju(p->pinned.twins), "total",
                                  ju(p->pinned.total)));
    json_object_set_new(o, "host_bytes",
                        json_pack("{s:o,s:o,s:o,s:o}", "optimizer", ju(p->host.states), "backups",
                                  ju(p->host.backups), "accumulators", ju(p->host.accum), "total",
                                  ju(p->host.total)));
    json_object_set_new(o, "nvme_bytes",
                        json_pack("{s:o,s:o,s:o,s:o,s:o}", "optimizer", ju(p->nvme.states),
                                  "params", ju(p->nvme.params), "layer_inputs",
                                  ju(p->nvme.layer_inputs), "payload", ju(p->nvme.payload), "files",
                                  ju(p->nvme.files)));
    json_object_set_new(o, "step_bytes",
                        json_pack("{s:o,s:o,s:o,s:o}", "h2d", ju(p->h2d_bytes), "d2h",
                                  ju(p->d2h_bytes), "nvme_read", ju(p->nvme_read_bytes),
                                  "nvme_write", ju(p->nvme_write_bytes)));
    json_object_set_new(o, "seconds",
                        json_pack("{s:f,s:f,s:f,s:f,s:f}", "compute", p->seconds[ZP_BN_COMPUTE],
                                  "h2d", p->seconds[ZP_BN_H2D], "d2h", p->seconds[ZP_BN_D2H],
                                  "nvme", p->seconds[ZP_BN_NVME], "optimizer",
                                  p->seconds[ZP_BN_OPTIM]));
    json_object_set_new(o, "step_seconds", json_real(p->step_seconds));
    json_object_set_new(o, "bottleneck", json_string(zp_bottleneck_name(p->bottleneck)));
    json_object_set_new(o, "tokens_per_step", ju(p->tokens));
    json_object_set_new(o, "tokens_per_s", json_real(p->tokens_per_s));
    json_object_set_new(o, "mfu", json_real(p->mfu));
    json_object_set_new(o, "nvme_write_bytes_per_day", json_real(p->nvme_write_per_day));
    json_object_set_new(o, "days_to_rated_endurance",
                        p->days_to_tbw > 0 ? json_real(p->days_to_tbw) : json_null());
    return o;
}

/* The per-chunk plan: a strategy's keys and its choices. */
static json_t *json_split(const zp_plan *p)
{
    json_t *o = json_plan(p);
    json_object_set_new(o, "optimizer_mode", json_string(zo_optim_mode_name(p->mode)));
    json_object_set_new(o, "placement",
                        json_pack("{s:{s:o,s:o},s:{s:o,s:o}}", "params", "device",
                                  ju(p->param_caps.bytes[ZO_TIER_DEVICE]), "host",
                                  ju(p->param_caps.bytes[ZO_TIER_HOST]), "optimizer", "device",
                                  ju(p->optim_caps.bytes[ZO_TIER_DEVICE]), "host",
                                  ju(p->optim_caps.bytes[ZO_TIER_HOST])));
    json_object_set_new(o, "homes",
                        json_pack("{s:[i,i,i],s:[i,i,i]}", "params", p->param_homes[0],
                                  p->param_homes[1], p->param_homes[2], "optimizer",
                                  p->optim_homes[0], p->optim_homes[1], p->optim_homes[2]));
    json_object_set_new(o, "micro_group", json_integer(p->micro_group));
    json_object_set_new(o, "groups_per_step", json_integer(p->n_groups));
    json_object_set_new(o, "act_home", json_string(zp_act_home_name(p->act_home)));
    json_object_set_new(o, "layer_input_bytes", ju(p->layer_inputs));
    json_object_set_new(o, "host_budget", ju(p->host_budget));
    json_object_set_new(o, "host_floor", ju(p->host_floor));
    json_object_set_new(o, "gradients",
                        json_pack("{s:o,s:o,s:o}", "store", ju(p->grad_store), "host",
                                  ju(p->grad_store - p->grad_spill), "spilled", ju(p->grad_spill)));
    json_object_set_new(o, "traffic",
                        json_pack("{s:o,s:o,s:o,s:o,s:o,s:o}", "h2d_params", ju(p->h2d_param_bytes),
                                  "h2d_grad_sums", ju(p->h2d_grad_bytes), "h2d_layer_inputs",
                                  ju(p->h2d_act_bytes), "d2h_grads", ju(p->d2h_grad_bytes),
                                  "d2h_layer_inputs", ju(p->d2h_act_bytes), "nvme_layer_inputs",
                                  ju(p->nvme_act_bytes)));
    json_object_set_new(o, "engine_host_budget", ju(p->engine_host_budget));
    json_object_set_new(o, "modelled",
                        json_pack("{s:I,s:I}", "device", (json_int_t)p->modelled.device, "pinned",
                                  (json_int_t)p->modelled.pinned));
    json_object_set_new(o, "engine_footprint",
                        json_pack("{s:o,s:o,s:o,s:o}", "device", ju(p->fp.bytes[ZO_TIER_DEVICE]),
                                  "pinned", ju(p->fp.pinned), "host", ju(p->fp.bytes[ZO_TIER_HOST]),
                                  "nvme", ju(p->fp.bytes[ZO_TIER_NVME])));
    json_object_set_new(o, "reason", json_string(p->reason));

    return o;
}

static json_t *json_validation(const result *r, int s)
{
    if (!r->validated[s])
        return json_null();
    if (r->validated[s] < 0)
        return json_pack("{s:s}", "error", r->val_err[s]);
    const zo_step_stats *l = &r->val[s].last;
    double m = r->val[s].step_seconds;
    return json_pack("{s:f,s:f,s:f,s:f,s:f,s:{s:o,s:o,s:o,s:o},s:o}", "step_seconds", m,
                     "step_error", (r->plans[s].step_seconds - m) / m, "predicted_update_seconds",
                     r->plans[s].update_seconds, "optimizer_busy_seconds", l->optim_seconds,
                     "nvme_wait_seconds", l->nvme_seconds, "peak_bytes", "device",
                     ju(l->peak[ZO_TIER_DEVICE]), "pinned", ju(l->peak_pinned), "host",
                     ju(l->peak[ZO_TIER_HOST]), "nvme", ju(l->peak[ZO_TIER_NVME]), "device_total",
                     ju(r->val[s].device_high_water));
}

static json_t *json_inputs(const cli *c, const result *r)
{
    const zt_shape *s = &c->job.shape;
    json_t *speeds = json_object(), *sources = json_object();
    zp_speeds sp = r->sp;
    for (int i = 0; i < ZP_N_SPEEDS; i++) {
        json_object_set_new(speeds, zp_speed_name(i), json_real(*zp_speed_field(&sp, i)));
        json_object_set_new(sources, zp_speed_name(i), json_string(c->src.what[i]));
    }
    json_object_set_new(speeds, "sources", sources);
    return json_pack(
        "{s:{s:s,s:b,s:I,s:i,s:i,s:i,s:i,s:i,s:s,s:s},s:{s:i,s:i,s:i,s:s,s:I},s:{s:s,s:s,s:I,s:I,s:"
        "I,s:"
        "I,s:I,"
        "s:i,s:I,s:I,s:s,s:i,s:i},s:o}",
        "model", "source", c->hf_config ? c->hf_config : c->preset, "shape_flags",
        shape_overridden(c), "params", (json_int_t)zt_shape_n_params(s), "vocab", s->vocab, "dim",
        s->dim, "layers", s->n_layers, "heads", s->n_heads, "ffn", s->ffn_dim, "dtype",
        zo_dtype_name(c->job.dtype), "note", c->model_note, "job", "seq", c->job.seq, "micro_batch",
        c->job.micro_batch, "grad_accum", c->job.grad_accum, "optimizer_mode",
        zo_optim_mode_name(c->job.mode), "mlp_chunk_bytes", (json_int_t)mlp_chunk_bytes(c),
        "hardware", "backend", r->hw.backend, "device_name", r->hw.device_name, "device_bytes",
        (json_int_t)r->hw.device_bytes, "reserve_bytes", (json_int_t)r->hw.reserve_bytes,
        "host_bytes", (json_int_t)r->hw.host_bytes, "pinned_max", (json_int_t)r->hw.pinned_max,
        "nvme_bytes", (json_int_t)r->hw.nvme_bytes, "nvme_paths", c->req.n_nvme_paths, "host_ram",
        (json_int_t)r->facts.host_ram, "numa_ram", (json_int_t)r->facts.numa_ram, "host_how",
        r->facts.host_how, "numa_nodes", r->facts.numa_nodes, "cores", r->facts.cores, "speeds",
        speeds);
}

static json_t *json_deepspeed(const cli *c)
{
    zp_ds_row rows[ZP_DS_ROWS];
    zp_deepspeed_estimate(zt_shape_n_params(&c->job.shape), zt_largest_tensor(&c->job.shape), rows);
    json_t *a = json_array();
    for (int i = 0; i < ZP_DS_ROWS; i++)
        json_array_append_new(a, json_pack("{s:s,s:s,s:I,s:I}", "stage", rows[i].stage, "options",
                                           rows[i].options, "cpu_bytes", (json_int_t)rows[i].cpu,
                                           "gpu_bytes", (json_int_t)rows[i].gpu));
    return a;
}

static json_t *json_formats(const result *r)
{
    json_t *a = json_array();
    for (int i = 0; i < n_state_formats(); i++) {
        const fmt_row *f = &r->fmts[i];
        json_t *o = json_pack("{s:s,s:b,s:f,s:b}", "state_dtype", zt_state_dtype_name(f->t), "fits",
                              f->fits, "adam_params_per_s", f->adam_rate, "adam_measured",
                              f->t == ZO_DTYPE_F32 ? r->adam_measured : r->sp.adam_params_bf16 > 0);
        if (f->fits) {
            json_object_set_new(o, "strategy", json_string(zp_strategy_name(f->strategy)));
            json_object_set_new(o, "host_state_bytes", ju(f->host_states));
            json_object_set_new(o, "nvme_state_bytes", ju(f->nvme_states));
            json_object_set_new(o, "nvme_state_bytes_per_step", ju(f->nvme_state_bytes));
            json_object_set_new(o, "nvme_read_bytes_per_step", ju(f->nvme_read));
            json_object_set_new(o, "nvme_write_bytes_per_step", ju(f->nvme_write));
            json_object_set_new(o, "nvme_write_bytes_per_day", json_real(f->write_per_day));
            json_object_set_new(o, "days_to_rated_endurance",
                                f->days_to_tbw > 0 ? json_real(f->days_to_tbw) : json_null());
            json_object_set_new(o, "step_seconds", json_real(f->step_seconds));
            json_object_set_new(o, "mfu", json_real(f->mfu));
            json_object_set_new(o, "bottleneck", json_string(zp_bottleneck_name(f->bottleneck)));
        }
        json_object_set_new(o, "trades", json_string(state_trade(f->t)));
        json_array_append_new(a, o);
    }
    return a;
}

static json_t *json_world(const cli *c, const result *r)
{
    const zp_world *w = &c->world;
    zp_hardware hw;
    zp_speeds sp;
    zp_world_rank_share(w, &r->hw, &r->sp, &hw, &sp);
    json_t *plans = json_array();
    for (int i = 0; i < ZP_WORLD_STAGES * ZP_WORLD_STRATEGIES; i++) {
        const zp_world_plan *o = &r->world[i];
        const zp_plan *p = &o->plan;
        json_t *j = json_pack("{s:i,s:s,s:b,s:s}", "stage", o->stage, "placement",
                              zp_strategy_name(p->strategy), "fits", p->fits, "why", p->why);
        json_object_set_new(j, "per_rank_bytes",
                            json_pack("{s:o,s:o,s:o,s:o}", "device", ju(p->device.total), "pinned",
                                      ju(p->pinned.total), "host", ju(p->host.total), "nvme",
                                      ju(p->nvme.files)));
        json_object_set_new(j, "link_bytes_per_step",
                            json_pack("{s:o,s:o,s:o}", "gradients", ju(o->grad_link_bytes),
                                      "updates", ju(o->update_link_bytes), "gathers",
                                      ju(o->gather_link_bytes)));
        json_object_set_new(j, "link_seconds", json_real(o->link_seconds));
        json_object_set_new(j, "rank_step_seconds", json_real(p->step_seconds));
        json_object_set_new(j, "step_seconds", json_real(o->step_seconds));
        json_object_set_new(j, "tokens_per_s", json_real(o->tokens_per_s));
        json_object_set_new(j, "mfu", json_real(o->mfu));
        json_object_set_new(
            j, "bottleneck",
            json_string(o->link_bound ? "links between ranks" : zp_bottleneck_name(p->bottleneck)));
        json_array_append_new(plans, j);
    }
    json_t *z =
        json_pack("{s:i,s:i,s:f,s:s}", "world_size", w->world_size, "gpus_per_node",
                  w->gpus_per_node, "link_bytes_per_s", w->link, "link_source", w->link_source);
    json_object_set_new(z, "tensor_parallel",
                        json_integer(w->tensor_parallel > 1 ? w->tensor_parallel : 1));
    json_object_set_new(
        z, "data_parallel",
        json_integer(w->world_size / (w->tensor_parallel > 1 ? w->tensor_parallel : 1)));
    json_object_set_new(z, "rank_share",
                        json_pack("{s:o,s:o,s:o,s:f,s:f,s:f}", "host_bytes", ju(hw.host_bytes),
                                  "pinned_max", ju(hw.pinned_max), "nvme_bytes", ju(hw.nvme_bytes),
                                  "nvme_read_bytes_per_s", sp.nvme_read, "nvme_write_bytes_per_s",
                                  sp.nvme_write, "adam_params_per_s", sp.adam_params));
    json_object_set_new(z, "plans", plans);
    if (r->world_best >= 0) {
        const zp_world_plan *o = &r->world[r->world_best];
        char cmd[512];
        world_command(c, o, cmd, sizeof cmd);
        json_object_set_new(z, "recommended",
                            json_pack("{s:i,s:s,s:s}", "stage", o->stage, "placement",
                                      zp_strategy_name(o->plan.strategy), "command", cmd));
    } else {
        json_object_set_new(z, "recommended", json_null());
    }
    return z;
}

static void print_json(const cli *c, const result *r)
{
    json_t *root = json_inputs(c, r), *plans = json_array();
    if (c->job.layout.struct_size)
        json_object_set_new(json_object_get(root, "job"), "sparse_attention",
                            json_pack("{s:s,s:i,s:f}", "mode", layout_name(&c->job.layout), "block",
                                      c->job.layout.block, "density", layout_share(c)));
    for (int s = 0; s < ZP_N_STRATEGIES; s++) {
        json_t *p = json_plan(&r->plans[s]);
        if (c->validate)
            json_object_set_new(p, "validation", json_validation(r, s));
        json_array_append_new(plans, p);
    }
    json_object_set_new(root, "strategies", plans);
    json_t *split = json_split(&r->plans[ZP_SPLIT]);
    if (c->validate)
        json_object_set_new(split, "validation", json_validation(r, ZP_SPLIT));
    json_object_set_new(root, "plan", split);
    json_object_set_new(root, "recommendation",
                        r->rec >= 0 ? json_string(zp_strategy_name(r->plans[r->rec].strategy))
                                    : json_null());
    /* the fastest fixed placement that fits, as before; when none does but the
     * per-chunk plan fits, that one (null read as "nothing fits") */
    int recommended = r->best >= 0 ? r->best : r->rec;
    json_object_set_new(root, "recommended",
                        recommended >= 0
                            ? json_string(zp_strategy_name(r->plans[recommended].strategy))
                            : json_null());
    json_object_set_new(root, "emitted_config",
                        r->emitted[0] ? json_string(r->emitted) : json_null());
    json_object_set_new(root, "planner_work", ju(r->work));
    if (c->max_seq)
        json_object_set_new(root, "max_seq",
                            json_pack("{s:i,s:i,s:s}", "seq", r->max_seq, "micro_batch",
                                      c->job.micro_batch, "longer_refused", r->max_seq_why));
    json_object_set_new(root, "state_dtype", json_string(zt_state_dtype_name(c->job.state_dtype)));
    json_object_set_new(root, "state_dtype_auto", json_boolean(c->state_auto));
    json_object_set_new(root, "embedding_f32_states", json_boolean(c->job.embedding_f32));
    json_object_set_new(root, "master_split", json_boolean(c->job.master_split));
    json_object_set_new(root, "update_behind", json_boolean(!c->job.no_update_behind));
    json_object_set_new(root, "state_formats", json_formats(r));
    json_object_set_new(root, "state_dtype_reason", json_string(r->fmt_why));
    if (c->ds_estimate)
        json_object_set_new(root, "deepspeed_estimate", json_deepspeed(c));
    if (c->world.world_size > 1)
        json_object_set_new(root, "zero", json_world(c, r));
    if (c->pipe_stages || c->tp) {
        zp_pipe_report p = pipe_report(c, r);
        json_object_set_new(root, "pipeline", zp_json_pipeline(&p));
    }
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    if (s)
        puts(s);
    free(s);
    json_decref(root);
}

int main(int argc, char **argv)
{
    static cli c;
    static result r;
    zt_output_check_at_exit("zo-plan");
    zt_cli_init(&c.args, ZT_TOOL_PLAN, "zo-plan");
    c.preset = "tiny";
    c.job.seq = 128; /* zo-train's defaults */
    c.job.micro_batch = 8;
    c.job.grad_accum = 1;
    c.job.dtype = ZO_DTYPE_BF16;
    c.job.flash_attention = 1;
    c.job.mode = ZO_OPTIM_SYNC;
    c.mlp_auto = 1;
    c.req.device = "auto";
    c.data = ZP_DEFAULT_DATA;
    int rc = parse_args(argc, argv, &c);
    if (rc)
        return rc < 0 ? 0 : rc;
    c.job.mode_auto = !c.mode_given;
    if (c.job.micro_group > c.job.grad_accum) {
        fprintf(stderr, "zo-plan: --micro-group %d: at most --grad-accum (%d), or auto\n",
                c.job.micro_group, c.job.grad_accum);
        return 2;
    }
    if (plan_all(&c, &r) < 0) {
        fprintf(stderr, "zo-plan: %s\n", zt_last_error());
        return 1;
    }
    if (c.json)
        print_json(&c, &r);
    else
        print_human(&c, &r);
    for (int i = 0; i < r.n_pipe; i++)
        zp_pipeline_free(&r.pipe[i]);
    return 0;
}
