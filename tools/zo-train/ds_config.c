/* DeepSpeed-style config keys onto zo-train's options (see ds_config.h). */
#include "ds_config.h"

#include <jansson.h>
#include <limits.h>
#include <string.h>
#include <strings.h>

#include "zt_error.h"
#include "zt_json.h"

/* The parser's message without its source location, naming the file. */
static zo_status config_fail(zo_status st, const char *path)
{
    const char *msg = zt_lib_message();
    if (strncmp(msg, path, strlen(path)) == 0) /* it names the file already (invalid JSON) */
        return zt_fail(st, "configuration error: %s", msg);
    return zt_fail(st, "configuration error in %s: %s", path, msg);
}

zo_status zt_config_load(const char *path, const char *const *sets, int n_sets,
                         const zt_config_flags *flags, const zt_options *defaults,
                         zo_train_config *out, zt_config_report *rep)
{
    zo_config_t c = NULL;
    json_t *doc = NULL;
    zo_status st = zo_config_init(&c);
    if (st >= 0)
        st = zo_config_load_file(c, path);
    if (st < 0) {
        config_fail(st, path);
        zo_config_free(c);
        return st;
    }
    if (zt_json_read(path, JSON_DECODE_ANY, &doc) < 0) /* it parsed once already */
        doc = NULL;
    st = zt_config_merge_flags(c, doc, path, flags, defaults, rep); /* names the file */
    json_decref(doc);
    int merged = st >= 0;
    for (int i = 0; st >= 0 && i < n_sets; i++)
        st = zo_config_set_arg(c, sets[i]);
    if (st >= 0)
        st = zo_config_resolve(c, 1, out);
    if (st < 0 && merged)
        config_fail(st, path);
    zo_config_free(c);
    return st;
}

static zo_status to_int(int64_t v, const char *key, int *out)
{
    if (v < 1 || v > INT_MAX)
        return zt_fail(ZO_ERR_CONFIG, "'%s' is %lld: zo-train takes 1..%d", key, (long long)v,
                       INT_MAX);
    *out = (int)v;
    return ZO_OK;
}

static int home_of(zo_offload_device d)
{
    switch (d) {
    case ZO_OFFLOAD_NONE: return ZO_TIER_DEVICE;
    case ZO_OFFLOAD_CPU: return ZO_TIER_HOST;
    case ZO_OFFLOAD_NVME: return ZO_TIER_NVME;
    }
    return ZT_HOME_DEFAULT;
}

static void add_path(zt_options *o, const char *p)
{
    for (int i = 0; i < o->n_nvme_paths; i++)
        if (strcmp(o->nvme_paths[i], p) == 0)
            return;
    if (p[0] && o->n_nvme_paths < ZT_MAX_NVME_PATHS)
        o->nvme_paths[o->n_nvme_paths++] = p;
}

static void nvme_paths(zt_options *o, const zo_train_config *cfg)
{
    o->n_nvme_paths = 0;
    for (int64_t i = 0; i < cfg->zoffload.n_nvme_paths; i++)
        add_path(o, cfg->zoffload.nvme_paths[i]);
    if (o->n_nvme_paths)
        return;
    if (cfg->zero_optimization.offload_optimizer.device == ZO_OFFLOAD_NVME)
        add_path(o, cfg->zero_optimization.offload_optimizer.nvme_path);
    if (cfg->zero_optimization.offload_param.device == ZO_OFFLOAD_NVME)
        add_path(o, cfg->zero_optimization.offload_param.nvme_path);
}

static void optimizer(zt_options *o, const zo_train_config *cfg)
{
    o->lr = (float)cfg->optimizer.lr;
    o->beta1 = (float)cfg->optimizer.betas[0];
    o->beta2 = (float)cfg->optimizer.betas[1];
    o->eps = (float)cfg->optimizer.eps;
    o->weight_decay = (float)cfg->optimizer.weight_decay;
    o->adamw = cfg->optimizer.decoupled_weight_decay;
    o->bias_correction = cfg->optimizer.bias_correction;
    o->max_grad_norm = (float)cfg->gradient_clipping;
    zt_schedule_from_config(&o->sched, cfg);
}

static void precision(zt_options *o, const zo_train_config *cfg)
{
    /* neither: fp32 training, as DeepSpeed does (the engine's slots hold the fp32 master) */
    o->dtype = cfg->fp16.enabled ? ZO_DTYPE_F16 : cfg->bf16.enabled ? ZO_DTYPE_BF16 : ZO_DTYPE_F32;
    zo_loss_scaler_config ls = ZO_LOSS_SCALER_CONFIG_INIT;
    ls.loss_scale = cfg->fp16.loss_scale;
    ls.initial_scale_power = (int)cfg->fp16.initial_scale_power;
    ls.loss_scale_window = (int)cfg->fp16.loss_scale_window;
    ls.hysteresis = (int)cfg->fp16.hysteresis;
    ls.consecutive_hysteresis = cfg->fp16.consecutive_hysteresis;
    ls.min_loss_scale = cfg->fp16.min_loss_scale;
    o->loss_scaler = ls;
}

static zo_status placement(zt_options *o, const zo_train_config *cfg)
{
    o->state_dtype = cfg->zoffload.optimizer_state_dtype;
    o->master_split = cfg->zoffload.master_split;
    o->update_behind = cfg->zoffload.update_behind;
    o->embedding_f32 = cfg->zoffload.embedding_f32_states;
    o->reduce_order = cfg->zoffload.reduce_order;      /* the config's 0 global, 1 rank */
    o->zero_stage = (int)cfg->zero_optimization.stage; /* [0, 3]: the parser's range */
    /* >= 0: the parser's range; per chunk here, per tensor in DeepSpeed */
    o->zero_persist = (uint64_t)cfg->zero_optimization.stage3_param_persistence_threshold;
    if (cfg->aio.block_size > UINT32_MAX || cfg->aio.queue_depth > UINT32_MAX)
        return zt_fail(ZO_ERR_CONFIG,
                       "'aio.block_size' %lld or 'aio.queue_depth' %lld is too large",
                       (long long)cfg->aio.block_size, (long long)cfg->aio.queue_depth);
    o->optim_home = home_of(cfg->zero_optimization.offload_optimizer.device);
    o->param_home = home_of(cfg->zero_optimization.offload_param.device);
    o->placement_auto = cfg->zoffload.placement.is_auto;
    o->optim_caps.bytes[ZO_TIER_DEVICE] = (uint64_t)cfg->zoffload.placement.optimizer.device;
    o->optim_caps.bytes[ZO_TIER_HOST] = (uint64_t)cfg->zoffload.placement.optimizer.host;
    o->param_caps.bytes[ZO_TIER_DEVICE] = (uint64_t)cfg->zoffload.placement.params.device;
    o->param_caps.bytes[ZO_TIER_HOST] = (uint64_t)cfg->zoffload.placement.params.host;
    nvme_paths(o, cfg);
    o->nvme_block_size = (uint32_t)cfg->aio.block_size;
    o->nvme_queue_depth = (uint32_t)cfg->aio.queue_depth;
    o->device_mem = (uint64_t)cfg->zoffload.device_mem;
    o->host_mem = (uint64_t)cfg->zoffload.host_mem; /* pinned + pageable, as --host-mem */
    if (o->host_mem)
        o->host_mem_from = "zoffload.host_mem";
    o->chunk_bytes = (uint64_t)cfg->zoffload.chunk_size;
    if (cfg->zoffload.tile_size)
        return zt_fail(ZO_ERR_CONFIG,
                       "'zoffload.tile_size' cuts a PyTorch model's large weights into row tiles "
                       "(the Python front end); zo-train's model pages its weights whole: leave "
                       "it out");
    if (cfg->zoffload.recompute)
        return zt_fail(ZO_ERR_CONFIG,
                       "'zoffload.recompute' picks how the PyTorch front end runs a layer's "
                       "backward; zo-train's model always recomputes each block's forward there: "
                       "leave it out");
    o->mode = cfg->zoffload.optimizer_mode;
    if (cfg->zoffload.prefetch_lookahead > INT_MAX)
        return zt_fail(ZO_ERR_CONFIG, "'zoffload.prefetch_lookahead' %lld is too large",
                       (long long)cfg->zoffload.prefetch_lookahead);
    o->lookahead = (int)cfg->zoffload.prefetch_lookahead;
    o->micro_group = (int)cfg->zoffload.micro_group; /* within [1, 2^20]: the parser's range */
    o->mlp_chunk_bytes = (uint64_t)cfg->zoffload.mlp_chunk_bytes; /* 0: auto */
    o->pipeline_stages = (int)cfg->pipeline.stages;               /* [0, 64]: the parser's range */
    o->pipeline_split = cfg->pipeline.partition ? "uniform" : NULL;
    o->tensor_parallel = (int)cfg->tensor_parallel.autotp_size; /* [0, 64]: the parser's range */
    o->sequence_parallel = cfg->zoffload.sequence_parallel;
    o->act_home = cfg->zoffload.act_home; /* the config's 0 device, 1 host, 2 nvme */
    if (cfg->activation_checkpointing.cpu_checkpointing && o->act_home == ZT_ACT_DEVICE)
        o->act_home = ZT_ACT_HOST;
    return ZO_OK;
}

/* DeepSpeed's sparse_attention onto the fused op's layouts, unidirectional
 * (the parser refuses bidirectional): fixed's stripe of num_local_blocks and
 * its last num_global_blocks as summary columns; bigbird's window of
 * num_sliding_window_blocks, first num_global_blocks and num_random_blocks
 * random ones a row; sliding_window's rows r - n/2 .. r (DeepSpeed's
 * LocalSlidingWindowSparsityConfig, n = num_sliding_window_blocks). */
zo_status zt_sparse_layout(const zo_sparse_attention_config *sa, zo_attn_layout *out)
{
    *out = (zo_attn_layout){0};
    if (!sa->enabled)
        return ZO_OK;
    if (sa->num_local_blocks > INT_MAX || sa->num_global_blocks > INT_MAX ||
        sa->num_random_blocks > INT_MAX || sa->num_sliding_window_blocks > INT_MAX)
        return zt_fail(ZO_ERR_CONFIG, "a 'sparse_attention' block count is over %d", INT_MAX);
    zo_attn_layout l = ZO_ATTN_LAYOUT_INIT;
    l.block = (int)sa->block;
    l.causal = 1;
    l.seed = (uint64_t)sa->seed;
    switch (sa->mode) {
    case ZO_SPARSE_DENSE: l.kind = ZO_ATTN_LAYOUT_DENSE; break;
    case ZO_SPARSE_FIXED:
        l.kind = ZO_ATTN_LAYOUT_FIXED;
        l.window_blocks = (int)sa->num_local_blocks;
        l.global_blocks = (int)sa->num_global_blocks;
        break;
    case ZO_SPARSE_BIGBIRD:
        l.kind = ZO_ATTN_LAYOUT_BIGBIRD;
        l.window_blocks = (int)sa->num_sliding_window_blocks;
        l.global_blocks = (int)sa->num_global_blocks;
        l.random_blocks = (int)sa->num_random_blocks;
        break;
    case ZO_SPARSE_SLIDING_WINDOW:
        l.kind = ZO_ATTN_LAYOUT_SLIDING_WINDOW;
        l.window_blocks = (int)(sa->num_sliding_window_blocks / 2 + 1);
        break;
    }
    *out = l;
    return ZO_OK;
}

zo_status zt_options_from_config(zt_options *o, const zo_train_config *cfg, int *log_every)
{
    ZT_TRY(zt_sparse_layout(&cfg->sparse_attention, &o->sparse_layout));
    ZT_TRY(to_int(cfg->train_micro_batch_size_per_gpu, "train_micro_batch_size_per_gpu",
                  &o->micro_batch));
    ZT_TRY(to_int(cfg->gradient_accumulation_steps, "gradient_accumulation_steps", &o->grad_accum));
    ZT_TRY(to_int(cfg->steps_per_print, "steps_per_print", log_every));
    optimizer(o, cfg);
    precision(o, cfg);
    return placement(o, cfg);
}

/* ---- keys with no effect ---- */

typedef struct unused_key {
    const char *path;
    int64_t value, deflt;
    const char *why;
} unused_key;

int zt_config_warn_unused(const zo_train_config *cfg, FILE *f)
{
    const zo_train_config d = ZO_TRAIN_CONFIG_INIT;
    const char *const sized = "the engine sizes its buffers from the plan";
    const char *const layered = "the engine prefetches by layer (zoffload.prefetch_lookahead)";
    const unused_key keys[] = {
#define ZT_UNUSED(field, path, why) {path, (int64_t)cfg->field, (int64_t)d.field, why}
        ZT_UNUSED(zero_optimization.offload_optimizer.pin_memory,
                  "zero_optimization.offload_optimizer.pin_memory",
                  "16-bit copies and NVMe staging are always pinned"),
        ZT_UNUSED(zero_optimization.offload_optimizer.buffer_count,
                  "zero_optimization.offload_optimizer.buffer_count", sized),
        ZT_UNUSED(zero_optimization.offload_optimizer.pipeline_read,
                  "zero_optimization.offload_optimizer.pipeline_read",
                  "NVMe reads are always pipelined"),
        ZT_UNUSED(zero_optimization.offload_optimizer.pipeline_write,
                  "zero_optimization.offload_optimizer.pipeline_write",
                  "NVMe writes are always pipelined"),
        ZT_UNUSED(zero_optimization.offload_optimizer.fast_init,
                  "zero_optimization.offload_optimizer.fast_init", sized),
        ZT_UNUSED(zero_optimization.offload_param.pin_memory,
                  "zero_optimization.offload_param.pin_memory",
                  "16-bit parameters on the host are always pinned"),
        ZT_UNUSED(zero_optimization.offload_param.buffer_count,
                  "zero_optimization.offload_param.buffer_count", sized),
        ZT_UNUSED(zero_optimization.offload_param.buffer_size,
                  "zero_optimization.offload_param.buffer_size", sized),
        ZT_UNUSED(zero_optimization.offload_param.max_in_cpu,
                  "zero_optimization.offload_param.max_in_cpu", "use zoffload.host_mem"),
        ZT_UNUSED(zero_optimization.stage3_prefetch_bucket_size,
                  "zero_optimization.stage3_prefetch_bucket_size", layered),
        ZT_UNUSED(zero_optimization.stage3_max_live_parameters,
                  "zero_optimization.stage3_max_live_parameters", "use zoffload.device_mem"),
        ZT_UNUSED(zero_optimization.stage3_max_reuse_distance,
                  "zero_optimization.stage3_max_reuse_distance",
                  "eviction follows the recorded access order"),
        ZT_UNUSED(zero_optimization.sub_group_size, "zero_optimization.sub_group_size",
                  "the optimizer works chunk by chunk (zoffload.chunk_size)"),
        ZT_UNUSED(aio.intra_op_parallelism, "aio.intra_op_parallelism",
                  "one I/O ring per swap store"),
        ZT_UNUSED(aio.single_submit, "aio.single_submit", "requests are submitted in batches"),
        ZT_UNUSED(aio.overlap_events, "aio.overlap_events", "completions always overlap"),
#undef ZT_UNUSED
    };
    int n = 0;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (keys[i].value != keys[i].deflt) {
            fprintf(f, "zo-train: warning: '%s' has no effect in zo-train (%s); ignored\n",
                    keys[i].path, keys[i].why);
            n++;
        }
    return n;
}
