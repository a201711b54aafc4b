/* zo-train's training loop over the engine. */
#include "trainer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "pipeline.h"
#include "ranks.h"
#include "report.h"
#include "signals.h"
#include "tensor_parallel.h"
#include "zo/checked.h"
#include "zo/nvtx.h"
#include "zo/units.h"
#include "zt_error.h"
#include "zt_host_limit.h"

struct zt_trainer {
    zt_options o;
    zt_setup setup;
    zo_device_t dev;
    zo_stream_t s;
    zo_engine_t eng;
    zt_model *m;
    zt_data *data;
    zt_param_source src;
    int **ids;           /* [layer][idx] -> engine tensor id */
    int32_t *in, *tgt;   /* one step's tokens (with ranks, every rank's) */
    int32_t *min, *mtgt; /* ranks in the global order: this rank's micro-batches of them */
    int32_t *vin, *vtgt; /* validation tokens (a failed step keeps its own for the retry) */
    float *losses;
    int retry;               /* the last step failed: run it again on the same tokens */
    zt_data_position before; /* the data position before the failed step's tokens */
    int64_t sched_it;        /* the schedule's last_batch_iteration */
    int64_t step;            /* steps done */
    double lr;               /* the rate of the next step */
    double last_lr;          /* ... and of the last step run */
    int64_t origin_step;     /* zt_train_state's origin of the global batch */
    uint64_t origin_windows;
    zo_phase open_phase;                    /* the phase of the layer fetched last (its end mark) */
    zo_comm_t comm;                         /* ZeRO: the ranks' communicator, else NULL */
    char rank_dirs[ZT_MAX_NVME_PATHS][512]; /* ZeRO: DIR/rank-R of each NVMe path */
    float *all_losses;                      /* ZeRO: every rank's micro-batch losses of a step */
    uint64_t mark_t0;                       /* the compute stream's current layer began (trace) */
    int host_node;                          /* the engine's host_node (zt_ranks_host_node) */
    /* pipeline stages: the stage's engine layers first..last (0..all without stages), the
     * data-parallel group the engine reduces over (comm itself without stages) and the
     * pipeline group the activations travel in */
    int first, last;
    zt_pipe_split split;
    zo_comm_t dp_comm, pipe_comm;
    zt_pipe *pipe;
    /* tensor parallelism: the tensor-parallel group, the model-parallel group (the ranks of
     * one data-parallel index, stage-major: the engine's verdict sums over it; pipe_comm
     * itself without tensor parallelism) and the rank's view of the engine's parts */
    zo_comm_t tp_comm, mp_comm;
    /* the tensor group's device-memory collectives (activations, gathered
     * weights): tp_comm itself on the cpu device, else a split of dev_world */
    zo_comm_t tp_dev, dev_world;
    zt_tp *tp;
    int *owner; /* [global tensor] the world rank holding its states (zt_trainer_tensor_owner) */
};

/* ---- ranks: pipeline stages x data-parallel ranks x tensor-parallel ranks ---- */

static int stages(const zt_options *o)
{
    return o->pipeline_stages > 1 ? o->pipeline_stages : 1;
}

static int tp_size(const zt_options *o)
{
    return o->tensor_parallel > 1 ? o->tensor_parallel : 1;
}

static int tp_rank(const zt_options *o)
{
    return o->world_size > 1 ? o->rank % tp_size(o) : 0;
}

static int dp_size(const zt_options *o)
{
    return o->world_size > 1 ? o->world_size / (stages(o) * tp_size(o)) : 1;
}

static int dp_rank(const zt_options *o)
{
    return o->world_size > 1 ? o->rank / tp_size(o) % dp_size(o) : 0;
}

static int stage_of(const zt_options *o)
{
    return o->world_size > 1 ? o->rank / (dp_size(o) * tp_size(o)) : 0;
}

int zt_options_dp_size(const zt_options *o)
{
    return dp_size(o);
}

int zt_options_tp_size(const zt_options *o)
{
    return tp_size(o);
}

int zt_options_tp_rank(const zt_options *o)
{
    return tp_rank(o);
}

/* ---- the engine as a parameter source ---- */

/* A layer's span on the compute stream, for the trace: tasks run in stream
 * order mark its start (after the fetch's waits) and its end. */
typedef struct layer_mark {
    zt_trainer *t;
    int layer;
    zo_phase phase;
    int end;
} layer_mark;

static zo_status mark_layer(void *arg)
{
    layer_mark *m = arg;
    zt_trainer *t = m->t;
    uint64_t now = zo_now_ns();
    if (!m->end) { /* only this stream's tasks touch mark_t0: they run one after another */
        t->mark_t0 = now;
        return ZO_OK;
    }
    zo_trace_event ev = {ZO_TRACK_COMPUTE,
                         0,
                         m->phase == ZO_PHASE_BACKWARD ? "backward" : "forward",
                         t->mark_t0,
                         now,
                         m->layer,
                         -1,
                         0};
    t->o.trace(t->o.trace_ctx, &ev);
    return ZO_OK;
}

static zo_status mark(zt_trainer *t, int layer, zo_phase phase, zo_stream_t s, int end)
{
    if (!t->o.trace)
        return ZO_OK;
    layer_mark m = {t, layer, phase, end};
    ZT_LIB(zo_stream_enqueue(s, mark_layer, &m, sizeof m));
    return ZO_OK;
}

static zo_status eng_fetch(void *ctx, int layer, zo_phase phase, zo_stream_t s, void **p, void **g,
                           int n)
{
    zt_trainer *t = ctx;
    ZT_LIB(zo_engine_fetch(t->eng, layer - t->first, phase, s, p, g, n));
    t->open_phase = phase;
    char name[32];
    snprintf(name, sizeof name, "%s L%d", phase == ZO_PHASE_BACKWARD ? "backward" : "forward",
             layer);
    zo_nvtx_push(name); /* the layer's work being enqueued */
    return mark(t, layer, phase, s, 0);
}

static zo_status eng_release(void *ctx, int layer, zo_stream_t s)
{
    zt_trainer *t = ctx;
    zo_nvtx_pop();
    zo_status st = mark(t, layer, t->open_phase, s, 1);
    ZT_LIB(zo_engine_release(t->eng, layer - t->first, s));
    return st;
}

static zo_status eng_grads_ready(void *ctx, int layer, zo_stream_t s)
{
    zt_trainer *t = ctx;
    ZT_LIB(zo_engine_grads_ready(t->eng, layer - t->first, s));
    return ZO_OK;
}

/* ---- option helpers ---- */

static const char *resolve_backend(const char *dev)
{
    if (dev && strcmp(dev, "auto") == 0)
        return zo_device_cuda_count() > 0 ? "cuda" : "cpu";
    return dev;
}

static int is_cuda(const zt_trainer *t)
{
    return strcmp(t->setup.backend, "cuda") == 0;
}

/* Defaults that depend on the device: on a GPU the parameters stay on it and
 * the optimizer runs on the host; on the cpu device the demo configuration
 * pages parameters from pinned host memory and keeps the optimizer on NVMe. */
static void resolve_homes(zt_trainer *t)
{
    int cuda = is_cuda(t);
    if (t->o.param_home == ZT_HOME_DEFAULT) /* a host cap spills the rest to NVMe */
        t->o.param_home = t->o.param_caps.bytes[ZO_TIER_HOST] ? ZO_TIER_NVME
                          : cuda                              ? ZO_TIER_DEVICE
                                                              : ZO_TIER_HOST;
    if (t->o.optim_home == ZT_HOME_DEFAULT && t->o.optim_caps.bytes[ZO_TIER_HOST])
        t->o.optim_home = ZO_TIER_NVME;
    if (t->o.optim_home == ZT_HOME_DEFAULT) /* parameters on NVMe need the optimizer there */
        t->o.optim_home = cuda && t->o.param_home != ZO_TIER_NVME ? ZO_TIER_HOST : ZO_TIER_NVME;
    t->setup.param_home = (zo_tier)t->o.param_home;
    t->setup.optim_home = (zo_tier)t->o.optim_home;
}

zo_status zt_make_dir(const char *dir)
{
    char buf[4096];
    int n = snprintf(buf, sizeof buf, "%s", dir);
    if (n < 0 || (size_t)n >= sizeof buf)
        return zt_fail(ZO_ERR_INVALID_ARG, "directory path too long (%d bytes): %.64s...", n, dir);
    for (char *p = buf + 1; *p; p++) /* mkdir -p */
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return zt_fail(ZO_ERR_IO, "cannot create directory %s: %s", buf, strerror(errno));
            *p = '/';
        }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return zt_fail(ZO_ERR_IO, "cannot create the directory %s: %s", buf, strerror(errno));
    return ZO_OK;
}

/* Whether the layer inputs go to NVMe (act_home nvme with groups of several). */
static int act_on_nvme(const zt_options *o)
{
    return o->act_home == ZT_ACT_NVME && o->micro_group > 1 && o->grad_accum > 1;
}

static zo_status resolve_nvme(zt_trainer *t)
{
    if (t->o.param_home != ZO_TIER_NVME && t->o.optim_home != ZO_TIER_NVME && !act_on_nvme(&t->o))
        return ZO_OK;
    if (t->o.n_nvme_paths == 0) {
        if (!t->o.default_nvme_dir)
            return zt_fail(ZO_ERR_INVALID_ARG,
                           "an NVMe home needs a directory: pass --nvme-path DIR");
        ZT_TRY(zt_make_dir(t->o.default_nvme_dir));
        t->o.nvme_paths[t->o.n_nvme_paths++] = t->o.default_nvme_dir;
    }
    for (int i = 0; t->o.world_size > 1 && i < t->o.n_nvme_paths; i++) {
        int n = snprintf(t->rank_dirs[i], sizeof t->rank_dirs[i], "%s/rank-%d", t->o.nvme_paths[i],
                         t->o.rank);
        if (n < 0 || (size_t)n >= sizeof t->rank_dirs[i])
            return zt_fail(ZO_ERR_INVALID_ARG, "--nvme-path %s: too long", t->o.nvme_paths[i]);
        ZT_TRY(zt_make_dir(t->rank_dirs[i]));
        t->o.nvme_paths[i] = t->rank_dirs[i]; /* each rank its own swap files */
    }
    snprintf(t->setup.nvme_dir, sizeof t->setup.nvme_dir, "%s", t->o.nvme_paths[0]);
    return ZO_OK;
}

static zo_engine_config engine_config(const zt_trainer *t, zo_device_t dev, uint64_t device_bytes)
{
    const zt_options *o = &t->o;
    zo_engine_config c = ZO_ENGINE_CONFIG_INIT;
    c.device = dev;
    c.param_dtype = o->dtype;
    c.chunk_bytes =
        o->chunk_bytes ? o->chunk_bytes : zt_tp_default_chunk_bytes(&o->shape, tp_size(o));
    c.param_home = (zo_tier)o->param_home;
    c.optim_home = (zo_tier)o->optim_home;
    c.device_bytes = device_bytes;
    c.nvme_paths = o->n_nvme_paths ? o->nvme_paths : NULL;
    c.n_nvme_paths = (size_t)o->n_nvme_paths;
    c.lookahead = o->lookahead;
    c.micro_group = o->micro_group;
    c.mode = o->mode;
    c.state_dtype = o->state_dtype;
    c.master_split = o->master_split;
    c.update_behind = o->update_behind;
    c.grad_accum_steps = o->grad_accum;
    c.optim_threads = o->optim_threads;
    c.adam.lr = o->lr;
    c.adam.beta1 = o->beta1;
    c.adam.beta2 = o->beta2;
    c.adam.eps = o->eps;
    c.adam.weight_decay = o->weight_decay;
    c.adam.adamw = o->adamw;
    c.adam.bias_correction = o->bias_correction;
    c.max_grad_norm = o->max_grad_norm;
    c.loss_scaler = o->loss_scaler;
    c.pinned_bytes = zt_ranks_share(o->pinned_bytes, o->local_rank, o->local_size);
    c.host_node = t->host_node;
    c.nvme_queue_depth = o->nvme_queue_depth;
    c.nvme_block_size = o->nvme_block_size;
    c.param_caps = o->param_caps;
    c.optim_caps = o->optim_caps;
    if (dp_size(o) > 1) {
        c.rank = dp_rank(o);
        c.world_size = dp_size(o);
        c.zero_stage = o->zero_stage;
        c.zero_persist_elems = o->zero_persist;
        c.reduce_order = (zo_reduce_order)o->reduce_order;
        c.comm = t->dp_comm;
    }
    c.pipe_comm = t->mp_comm;
    return c;
}

/* Where the model's initial values come from: the seed (zt_tensor_init),
 * or zeros for a planning probe. The engine asks for a tensor's values as it
 * places its chunk (zo_engine_register_fill), so registering holds none. */
typedef struct init_src {
    const zt_options *o;
    int zeros;
    int first, last; /* the engine layers registered (a pipeline stage's) */
} init_src;

static zo_status fill_initial(void *ctx, int id, float *dst)
{
    const init_src *src = ctx;
    const zt_shape *s = &src->o->shape;
    int l = src->first; /* the engine's ids start at the stage's first layer */
    while (id >= zt_layer_tensors(s, l))
        id -= zt_layer_tensors(s, l++);
    const int T = tp_size(src->o);
    if (src->zeros) {
        memset(dst, 0, zt_tp_numel(s, T, l, id) * sizeof *dst);
        return ZO_OK;
    }
    if (T == 1) {
        zt_tensor_init(s, l, id, src->o->seed, src->o->init_std, dst);
        return ZO_OK;
    }
    /* the whole tensor's values, then this rank's part: every T trains the same model */
    float *whole = malloc(zt_tensor_numel(s, l, id) * sizeof *whole);
    if (!whole)
        return zt_fail(ZO_ERR_NO_MEMORY, "the initial values of a %zu-element tensor",
                       zt_tensor_numel(s, l, id));
    zt_tensor_init(s, l, id, src->o->seed, src->o->init_std, whole);
    zt_tp_slice(s, T, tp_rank(src->o), l, id, whole, dst);
    free(whole);
    return ZO_OK;
}

/* Whether tensor (l, i) keeps fp32 moments under int8 states by the run's
 * choice (the engine adds the small tensors itself). */
static int keeps_f32(const zt_options *o, int l, int i)
{
    return o->embedding_f32 && zt_tensor_embedding(&o->shape, l, i);
}

/* Register every tensor of the stage's layers src->first..last (the whole
 * model without stages) as engine layers from 0, their initial values from
 * src (which must outlive zo_engine_finalize), the embedding's fp32 moments
 * marked; the engine ids go to ids (NULL: a planning probe). */
static zo_status register_model(zo_engine_t eng, const zt_options *o, init_src *src, int **ids)
{
    const zt_shape *s = &o->shape;
    zo_status st = ZO_OK;
    for (int l = src->first; st >= 0 && l <= src->last; l++)
        for (int i = 0; st >= 0 && i < zt_layer_tensors(s, l); i++) {
            char name[64];
            int id = -1;
            zt_tensor_name(s, l, i, name, sizeof name);
            st = zo_engine_register_fill(eng, l - src->first, name,
                                         zt_tp_numel(s, tp_size(o), l, i), fill_initial, src, &id);
            if (st < 0)
                zt_lib_fail(st, "zo_engine_register_fill");
            if (st >= 0 && keeps_f32(o, l, i) && (st = zo_engine_keep_f32_states(eng, id)) < 0)
                zt_lib_fail(st, "zo_engine_keep_f32_states");
            if (ids)
                ids[l][i] = id;
        }
    return st;
}

/* The engine's smallest device footprint under these options (one layer's
 * parameter and gradient chunks, or every parameter chunk with
 * --offload-param none), from a plan on a probe engine; *slot_layer_bytes
 * the bytes of one layer of parameter slots. */
static zo_status engine_min_device(const zt_trainer *t, uint64_t *min_bytes,
                                   uint64_t *slot_layer_bytes)
{
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    zo_device_t dev = NULL;
    zo_engine_t eng = NULL;
    ZT_LIB(zo_device_init(&dev, &dc));
    zo_engine_config c = engine_config(t, dev, 1); /* one byte: the plan reports its minimum */
    zo_status st = zo_engine_init(&eng, &c);
    if (st < 0)
        zt_lib_fail(st, "zo_engine_init (planning probe)");
    init_src zeros = {&t->o, 1, t->first, t->last};
    if (st >= 0)
        st = register_model(eng, &t->o, &zeros, NULL);
    zo_engine_footprint fp = ZO_ENGINE_FOOTPRINT_INIT;
    int fits = 0;
    if (st >= 0 && (st = zo_engine_plan(eng, &fp, &fits, NULL, 0)) < 0)
        zt_lib_fail(st, "zo_engine_plan");
    zo_engine_free(eng);
    zo_device_free(dev);
    ZT_TRY(st);
    *min_bytes = fp.bytes[ZO_TIER_DEVICE];
    *slot_layer_bytes = (uint64_t)fp.max_chunks_per_layer * fp.chunk_bytes;
    return ZO_OK;
}

static zt_model_config model_config(const zt_options *o)
{
    zt_model_config mc = {zt_tp_local_shape(&o->shape, tp_size(o)),
                          o->seq,
                          o->micro_batch,
                          o->grad_accum,
                          o->dtype,
                          o->flash_attention,
                          o->sparse_layout,
                          o->sequence_parallel ? tp_size(o) : 0,
                          o->mlp_chunk_bytes};
    return mc;
}

/* The model's groups: a pipeline stage keeps its micro-batches in flight
 * in sets on the device (the engine still sees micro-batch-major steps). */
static zt_act_group act_group(const zt_options *o)
{
    zt_act_group g = {o->micro_group, o->act_home};
    if (stages(o) > 1)
        g = (zt_act_group){zt_pipe_sets(stages(o), stage_of(o), o->grad_accum), ZT_ACT_DEVICE};
    return g;
}

/* The device budget: given, or (cpu device) the activations plus the
 * engine's minimum plus two layers of prefetch slots. */
static zo_status choose_budget(zt_trainer *t, uint64_t *budget)
{
    zt_model_config mc = model_config(&t->o);
    zt_act_group g = act_group(&t->o);
    t->setup.activation_bytes =
        zt_model_activation_bytes_group(&mc, &g) +
        zt_tp_device_bytes(&t->o.shape, tp_size(&t->o), t->o.dtype, zt_head_chunk_rows(&mc));
    *budget = t->o.device_mem;
    if (*budget || is_cuda(t))
        return ZO_OK;
    uint64_t min_bytes = 0, layer_bytes = 0;
    ZT_TRY(engine_min_device(t, &min_bytes, &layer_bytes));
    *budget = t->setup.activation_bytes + min_bytes +
              (t->o.param_home == ZO_TIER_DEVICE ? 0 : 2 * layer_bytes);
    return ZO_OK;
}

static zo_status open_device(zt_trainer *t)
{
    uint64_t budget;
    ZT_TRY(choose_budget(t, &budget));
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = t->setup.backend;
    dc.mem_budget = budget;
    ZT_LIB(zo_device_init(&t->dev, &dc));
    zo_device_info info = ZO_DEVICE_INFO_INIT;
    ZT_LIB(zo_device_get_info(t->dev, &info));
    snprintf(t->setup.device_name, sizeof t->setup.device_name, "%s", info.name);
    t->setup.device_budget = info.budget;
    ZT_LIB(zo_stream_create(t->dev, &t->s));
    return ZO_OK;
}

/* The stage's tensors (the model's without stages) as the engine registers
 * them (sizes only). */
static zo_status model_layout(const zt_trainer *t, size_t **numel, int **layer,
                              unsigned char **keep, size_t *n)
{
    const zt_options *o = &t->o;
    const zt_shape *s = &o->shape;
    *n = 0;
    for (int l = t->first; l <= t->last; l++)
        *n += (size_t)zt_layer_tensors(s, l);
    *numel = malloc(*n * sizeof **numel);
    *layer = malloc(*n * sizeof **layer);
    *keep = malloc(*n);
    if (!*numel || !*layer || !*keep)
        return zt_fail(ZO_ERR_NO_MEMORY, "the model's layout");
    size_t k = 0;
    for (int l = t->first; l <= t->last; l++)
        for (int i = 0; i < zt_layer_tensors(s, l); i++, k++) {
            (*numel)[k] = zt_tensor_numel(s, l, i);
            (*layer)[k] = l - t->first;
            (*keep)[k] = (unsigned char)keeps_f32(o, l, i);
        }
    return ZO_OK;
}

static zo_status refuse_host_memory(const uint64_t part[4], uint64_t need, uint64_t limit,
                                    const char *why)
{
    static const char *const names[4] = {"pinned (16-bit copies, gradients, NVMe staging)",
                                         "host (optimizer states, backups, accumulators)",
                                         "tensor buffers for loading and saving",
                                         "the cpu device (emulated in host memory)"};
    int top = 0;
    for (int i = 1; i < 4; i++)
        if (part[i] > part[top])
            top = i;
    char b[7][32];
    return zt_fail(ZO_ERR_BUDGET,
                   "host memory: the plan needs %s (pinned %s, host %s, tensor buffers %s, cpu "
                   "device %s) but the host limit is %s (%s): %s missing, most of it %s; lower "
                   "--chunk-bytes, put the optimizer on NVMe (--offload-optimizer nvme), or set "
                   "--host-mem",
                   zo_fmt_bytes(b[0], 32, need), zo_fmt_bytes(b[1], 32, part[0]),
                   zo_fmt_bytes(b[2], 32, part[1]), zo_fmt_bytes(b[3], 32, part[2]),
                   zo_fmt_bytes(b[4], 32, part[3]), zo_fmt_bytes(b[5], 32, limit), why,
                   zo_fmt_bytes(b[6], 32, need - limit), names[top]);
}

/* The host limit: --host-mem, or what the machine can spare (why names it);
 * with several ranks on this node, this rank's share of it. */
static uint64_t host_limit(const zt_trainer *t, char *why, size_t cap)
{
    snprintf(why, cap, "%s", t->o.host_mem_from ? t->o.host_mem_from : "--host-mem");
    uint64_t node = t->o.host_mem ? t->o.host_mem : zt_host_limit(why, cap);
    if (t->o.local_size <= 1 || !node)
        return node;
    uint64_t share = zt_ranks_share(node, t->o.local_rank, t->o.local_size);
    char whole[32], tail[160];
    snprintf(tail, sizeof tail, "%s", why);
    snprintf(why, cap, "local rank %d's share, 1/%d of the node's %s (%s; %s)", t->o.local_rank,
             t->o.local_size, zo_fmt_bytes(whole, sizeof whole, node), tail, t->o.local_from);
    return share;
}

/* Host bytes zo-train takes beside the engine while it loads or saves
 * weights and states (registration takes none: the engine asks for each
 * tensor's initial values where it places them): a tensor's master, m and
 * v as a checkpoint moves them, and the engine's buffer of one chunk's
 * states that reads and writes of them go through. They grow with the
 * largest tensor and the chunk, not with the number of layers. */
uint64_t zt_tensor_buffer_bytes(const zt_shape *s, zo_dtype state_dtype, uint64_t chunk_elems)
{
    return 3 * (zt_largest_tensor(s) + 2) * sizeof(float) +
           zo_engine_nvme_state_bytes_as(state_dtype, chunk_elems);
}

/* The data's host memory: a step's inputs and targets for every data-parallel
 * rank (each rank cuts its own from the global batch) and one set for
 * validation. The file is mapped and its order computed, so nothing else
 * grows with it. Reported, not in the host need: zo-plan's exact accounting
 * of the engine's host budget would have to count it too. */
static uint64_t data_bytes(const zt_options *o)
{
    uint64_t n = (uint64_t)o->grad_accum * (uint64_t)o->micro_batch * (uint64_t)o->seq;
    return (2 * (uint64_t)dp_size(o) + 2) * n * sizeof(int32_t);
}

/* The host memory the run will take under c, part by part: the plan's pinned
 * and pageable bytes (the engine's and the layer inputs zo-train pins), the
 * tensor buffers of a run that loads or saves, and on the cpu device its
 * budget. */
static zo_status host_need(const zt_trainer *t, const zo_engine_config *c, uint64_t part[4],
                           zo_engine_footprint *fp)
{
    size_t *numel = NULL, n = 0;
    int *layer = NULL;
    unsigned char *keep = NULL;
    zo_status st = model_layout(t, &numel, &layer, &keep, &n);
    zo_engine_layout ly = ZO_ENGINE_LAYOUT_INIT;
    ly.n_tensors = n;
    ly.numel = numel;
    ly.layer = layer;
    ly.keep_f32 = keep;
    *fp = (zo_engine_footprint)ZO_ENGINE_FOOTPRINT_INIT;
    int fits = 0;
    if (st >= 0 && (st = zo_engine_footprint_for(c, &ly, fp, &fits, NULL, 0)) < 0)
        zt_lib_fail(st, "zo_engine_footprint_for");
    free(numel);
    free(layer);
    free(keep);
    ZT_TRY(st);
    zt_model_config mc = model_config(&t->o);
    zt_act_group g = act_group(&t->o);
    part[0] = fp->pinned + zt_model_host_activation_bytes(&mc, &g);
    part[1] = fp->bytes[ZO_TIER_HOST] + zt_model_act_carry_bytes(&mc, &g);
    part[2] = t->o.moves_tensors
                  ? zt_tensor_buffer_bytes(&t->o.shape, c->state_dtype,
                                           fp->chunk_bytes / zo_dtype_size(c->param_dtype))
                  : 0;
    part[3] = is_cuda(t) ? 0 : t->setup.device_budget;
    return ZO_OK;
}

/* The host memory the run will take, against the host limit, before the
 * engine allocates anything (a run too large used to grow until the kernel
 * killed it). */
static zo_status check_host_memory(zt_trainer *t, const zo_engine_config *c)
{
    char why[256];
    uint64_t limit = host_limit(t, why, sizeof why), part[4];
    if (!limit)
        return ZO_OK;
    zo_engine_footprint fp;
    ZT_TRY(host_need(t, c, part, &fp));
    uint64_t need = part[0] + part[1] + part[2] + part[3];
    return need <= limit ? ZO_OK : refuse_host_memory(part, need, limit, why);
}

/* The most chunks (0..n) whose state of `per` bytes *cap lets the host hold
 * within limit: the need grows with each chunk moved there. */
static zo_status fill_host(const zt_trainer *t, zo_engine_config *c, uint64_t *cap, uint64_t per,
                           uint32_t n, uint64_t limit)
{
    uint32_t lo = 0, hi = n; /* lo fits */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        uint64_t part[4];
        zo_engine_footprint fp;
        *cap = (uint64_t)mid * per;
        ZT_TRY(host_need(t, c, part, &fp));
        if (part[0] + part[1] + part[2] + part[3] <= limit)
            lo = mid;
        else
            hi = mid - 1;
    }
    *cap = (uint64_t)lo * per;
    return ZO_OK;
}

/* --placement auto: the host limit's room goes to what is homed on NVMe,
 * optimizer states first (a chunk moved to the host saves reading and
 * writing its states every step, 12 bytes each way per parameter in fp32,
 * for as many bytes of memory), then the 16-bit parameters; layer 0's chunks first
 * (the engine's placement order). */
static zo_status auto_placement(zt_trainer *t, zo_engine_config *c)
{
    char why[256];
    uint64_t limit = host_limit(t, why, sizeof why), part[4];
    zo_engine_footprint fp;
    ZT_TRY(host_need(t, c, part, &fp));
    if (!limit || part[0] + part[1] + part[2] + part[3] > limit)
        return ZO_OK; /* nothing to spare: check_host_memory says what is missing */
    /* a chunk's states at the chunk's size in their format: 6 x chunk_bytes in fp32 (3 x
     * with fp32 parameters, whose chunks hold half as many) */
    uint64_t states = zo_engine_nvme_state_bytes_as(c->state_dtype,
                                                    fp.chunk_bytes / zo_dtype_size(c->param_dtype));
    if (c->optim_home == ZO_TIER_NVME)
        ZT_TRY(fill_host(t, c, &c->optim_caps.bytes[ZO_TIER_HOST], states, fp.n_chunks, limit));
    if (c->param_home == ZO_TIER_NVME)
        ZT_TRY(fill_host(t, c, &c->param_caps.bytes[ZO_TIER_HOST], fp.chunk_bytes, fp.n_chunks,
                         limit));
    return ZO_OK;
}

/* The engine's share of the host limit, its hard budget for pinned and
 * pageable bytes: what the limit leaves beside the layer inputs zo-train
 * pins, the tensor buffers and the cpu device (0: no limit, or none left,
 * which check_host_memory then refuses). */
static zo_status engine_host_budget(zt_trainer *t, zo_engine_config *c)
{
    char why[256];
    uint64_t limit = host_limit(t, why, sizeof why), part[4];
    zo_engine_footprint fp;
    c->host_bytes = 0;
    ZT_TRY(host_need(t, c, part, &fp));
    t->setup.host_limit = limit;
    t->setup.tensor_buffer_bytes = part[2];
    t->setup.data_bytes = data_bytes(&t->o);
    uint64_t beside = part[0] - fp.pinned + part[1] - fp.bytes[ZO_TIER_HOST] + part[2] + part[3];
    if (limit > beside)
        c->host_bytes = limit - beside;
    return ZO_OK;
}

/* -v: what this rank takes of the node (its host share, the engine's part of
 * it, its NUMA node), one line a rank. */
static void log_resources(const zt_trainer *t, const zo_engine_config *c, const char *node_why)
{
    char why[256], b[3][32];
    uint64_t limit = host_limit(t, why, sizeof why);
    fprintf(stderr,
            "zo-train: resources of rank %d (local rank %d of %d): host share %s (%llu bytes; "
            "%s), engine host budget %s, pinned pool %s; optimizer threads: NUMA node %d (%s)\n",
            t->o.rank, t->o.local_rank, t->o.local_size, zo_fmt_bytes(b[0], 32, limit),
            (unsigned long long)limit, limit ? why : "not limited",
            zo_fmt_bytes(b[1], 32, c->host_bytes),
            c->pinned_bytes ? zo_fmt_bytes(b[2], 32, c->pinned_bytes) : "the plan's need",
            t->host_node, node_why);
}

static int owns_tensor(zt_trainer *t, int l, int k);

/* Each tensor's world rank: with stages, every rank's flags all-gathered
 * (a stage knows its own tensors' owners only), so checkpoints and the
 * Hugging Face files put every tensor in its holder's shard. Tensor
 * parallel, the holder is the first rank of its group (the whole tensor
 * is gathered there: zt_trainer_read_weights). */
static zo_status find_owners(zt_trainer *t)
{
    const zt_shape *s = &t->o.shape;
    const int W = t->o.world_size > 1 ? t->o.world_size : 1;
    int n = 0;
    for (int l = 0; l < zt_engine_layers(s); l++)
        n += zt_layer_tensors(s, l);
    uint8_t *mine = calloc((size_t)n, 1), *all = calloc((size_t)n * W, 1);
    t->owner = calloc((size_t)n, sizeof *t->owner);
    zo_status st = ZO_OK;
    if (!mine || !all || !t->owner) {
        free(mine);
        free(all);
        return zt_fail(ZO_ERR_NO_MEMORY, "tensor owners");
    }
    for (int l = 0, i = 0; l < zt_engine_layers(s); l++)
        for (int k = 0; k < zt_layer_tensors(s, l); k++, i++) {
            mine[i] = (uint8_t)(owns_tensor(t, l, k) && tp_rank(&t->o) == 0);
            /* without stages the world rank of the ZeRO owner's first tensor rank */
            t->owner[i] = l >= t->first && l <= t->last
                              ? zo_engine_tensor_owner(t->eng, t->ids[l][k]) * tp_size(&t->o)
                              : 0;
        }
    if (t->pipe_comm)
        st = zt_host_all_gather(t->comm, t->s, NULL, 0, mine, all, (size_t)n);
    if (st < 0)
        zt_lib_fail(st, "gathering the tensors' owners");
    for (int i = 0; st >= 0 && t->pipe_comm && i < n; i++)
        for (int r = 0; r < W; r++)
            if (all[(size_t)r * n + i])
                t->owner[i] = r;
    free(mine);
    free(all);
    return st;
}

int zt_trainer_tensor_owner(const zt_trainer *t, int layer, int idx)
{
    int i = idx;
    for (int l = 0; l < layer; l++)
        i += zt_layer_tensors(&t->o.shape, l);
    return t->owner[i];
}

/* The stage's schedule and transfers over the pipeline group. */
static zo_status open_pipe(zt_trainer *t)
{
    zt_pipe_config pc = {.dev = t->dev,
                         .compute = t->s,
                         .comm = t->pipe_comm,
                         .model = t->m,
                         .first = t->first,
                         .last = t->last,
                         .n_micro = t->o.grad_accum,
                         .act_dtype = t->o.dtype,
                         .shape = &t->o.shape,
                         .trace = t->o.trace,
                         .trace_ctx = t->o.trace_ctx};
    ZT_TRY(zt_pipe_init(&t->pipe, &pc));
    t->setup.pipe_pinned_bytes = zt_pipe_pinned_bytes(t->pipe);
    return ZO_OK;
}

static zo_status open_engine(zt_trainer *t)
{
    uint64_t reserve = is_cuda(t) ? ZT_CUDA_RESERVE : 0, need = t->setup.activation_bytes + reserve;
    if (t->setup.device_budget <= need)
        return zt_fail(
            ZO_ERR_OUT_OF_DEVICE_MEMORY,
            "the device budget of %llu bytes does not hold the activations (%llu bytes for "
            "micro-batch %d x seq %d)%s; raise --device-mem or lower --micro-batch/--seq",
            (unsigned long long)t->setup.device_budget,
            (unsigned long long)t->setup.activation_bytes, t->o.micro_batch, t->o.seq,
            reserve ? " plus a 512 MiB CUDA reserve" : "");
    t->setup.engine_device_bytes = t->setup.device_budget - need;
    char why[256], node_why[256];
    t->host_node = zt_ranks_host_node(&t->o, is_cuda(t), node_why, sizeof node_why);
    zo_engine_config c = engine_config(t, t->dev, t->setup.engine_device_bytes);
    ZT_TRY(engine_host_budget(t, &c));
    if (t->o.placement_auto)
        ZT_TRY(auto_placement(t, &c));
    t->setup.param_caps = c.param_caps;
    t->setup.optim_caps = c.optim_caps;
    ZT_TRY(check_host_memory(t, &c));
    t->setup.host_share = host_limit(t, why, sizeof why);
    if (t->o.verbose)
        log_resources(t, &c, node_why);
    ZT_LIB(zo_engine_init(&t->eng, &c));
    if (t->o.n_nvme_faults && !t->o.arm_engine_faults)
        return zt_fail(ZO_ERR_INVALID_ARG, "nvme_faults needs arm_engine_faults (set by tests)");
    if (t->o.n_nvme_faults)
        ZT_LIB(t->o.arm_engine_faults(t->eng, t->o.nvme_faults, t->o.n_nvme_faults));
    if (t->o.trace)
        ZT_LIB(zo_engine_set_trace(t->eng, t->o.trace, t->o.trace_ctx));
    int n_layers = zt_engine_layers(&t->o.shape);
    t->ids = calloc((size_t)n_layers, sizeof *t->ids);
    if (!t->ids)
        return zt_fail(ZO_ERR_NO_MEMORY, "tensor id table");
    for (int l = 0; l < n_layers; l++)
        if (!(t->ids[l] = calloc(ZT_MAX_LAYER_TENSORS, sizeof **t->ids)))
            return zt_fail(ZO_ERR_NO_MEMORY, "tensor id table");
    init_src seeded = {&t->o, 0, t->first, t->last}; /* read by zo_engine_finalize below */
    ZT_TRY(register_model(t->eng, &t->o, &seeded, t->ids));
    /* The model's arena first: the engine then takes what it planned from the rest. */
    zt_model_config mc = model_config(&t->o);
    zt_act_group g = act_group(&t->o);
    zt_act_nvme nv = {(const char *const *)t->o.nvme_paths,
                      (size_t)t->o.n_nvme_paths,
                      t->o.nvme_queue_depth,
                      t->o.nvme_block_size,
                      t->o.nvme_faults,
                      t->o.n_nvme_faults};
    ZT_TRY(zt_model_init_act(&t->m, t->dev, t->s, &mc, &g, act_on_nvme(&t->o) ? &nv : NULL));
    ZT_LIB(zo_engine_finalize(t->eng));
    t->setup.footprint = (zo_engine_footprint)ZO_ENGINE_FOOTPRINT_INIT;
    ZT_LIB(zo_engine_footprint_get(t->eng, &t->setup.footprint));
    ZT_LIB(zo_engine_homes(t->eng, t->setup.param_homes, t->setup.optim_homes));
    zt_param_source src = {t, eng_fetch, eng_release, eng_grads_ready};
    t->src = src;
    if (t->tp_dev && !zo_comm_takes_device_memory(t->tp_dev))
        return zt_fail(ZO_ERR_INTERNAL,
                       "--tensor-parallel on a %s device: the tensor group's communicator (%s) "
                       "takes host buffers only",
                       t->setup.backend, zo_comm_backend(t->tp_dev));
    if (t->tp_dev) { /* the model sees whole replicated tensors; the engine its parts */
        ZT_TRY(zt_tp_init(&t->tp, t->dev, t->tp_dev, &t->o.shape, t->o.dtype,
                          t->o.sequence_parallel ? tp_size(&t->o) : 0, &src));
        t->src = zt_tp_source(t->tp);
        ZT_TRY(zt_model_set_tp(t->m, t->tp_dev));
    }
    ZT_TRY(find_owners(t));
    return t->pipe_comm ? open_pipe(t) : ZO_OK;
}

/* Pipeline stages need their ranks, and what the stages do not split yet
 * is refused by name. */
static zo_status check_stages(const zt_options *o)
{
    const int S = stages(o), W = o->world_size > 1 ? o->world_size : 1;
    if (S == 1)
        return ZO_OK;
    zt_pipe_split split; /* the layers and a given split first: they hold for any launch */
    ZT_TRY(zt_pipe_split_make(&o->shape, S, o->pipeline_split, &split));
    if (W % S != 0)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--pipeline-stages %d needs a multiple of %d ranks (stages x data-parallel "
                       "ranks), but the run has %d: launch with mpirun -np %d (or %d, ...)",
                       S, S, W, S, 2 * S);
    if (o->micro_group > 1)
        return zt_fail(ZO_ERR_UNSUPPORTED,
                       "--micro-group %d with --pipeline-stages: a stage runs its micro-batches "
                       "one by one in 1F1B order (leave --micro-group out)",
                       o->micro_group);
    return ZO_OK;
}

/* Tensor parallelism needs its ranks and a shape that splits; what it does
 * not do yet is refused by name. */
static zo_status check_tensor_parallel(const zt_options *o)
{
    const int T = tp_size(o), W = o->world_size > 1 ? o->world_size : 1, S = stages(o);
    if (T == 1)
        return o->sequence_parallel
                   ? zt_fail(ZO_ERR_INVALID_ARG,
                             "--sequence-parallel shards the sequence over the tensor-parallel "
                             "ranks: it needs --tensor-parallel T with T > 1")
                   : ZO_OK;
    ZT_TRY(zt_tp_check(&o->shape, T));
    if (W % (S * T) != 0)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--tensor-parallel %d (or a config's tensor_parallel.autotp_size) with %d "
                       "pipeline stage%s needs a multiple of %d ranks (stages x data-parallel x "
                       "tensor-parallel ranks), but the run has %d: "
                       "launch with mpirun -np %d (or %d, ...)",
                       T, S, S > 1 ? "s" : "", S * T, W, S * T, 2 * S * T);
    if (o->sequence_parallel && o->seq % T != 0)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--sequence-parallel splits each sequence over the %d tensor-parallel "
                       "ranks, but --seq %d is not a multiple of %d: use --seq %d or %d",
                       T, o->seq, T, o->seq / T * T, (o->seq / T + 1) * T);
    if (o->micro_group > 1)
        return zt_fail(ZO_ERR_UNSUPPORTED,
                       "--micro-group %d with --tensor-parallel: a tensor-parallel rank runs its "
                       "micro-batches one by one (leave --micro-group out)",
                       o->micro_group);
    return ZO_OK;
}

zo_status zt_options_check(const zt_options *o)
{
    ZT_TRY(zt_shape_check(&o->shape));
    ZT_TRY(zt_job_sizes_check(&o->shape, o->seq, o->micro_batch, o->grad_accum,
                              o->world_size > 1 ? o->world_size : 1));
    /* with the states elsewhere a rank keeps its own chunks' 16-bit parameters
     * beside them: only ZeRO stages 1 and 2 leave the other ranks' on NVMe */
    int stage = o->zero_stage ? o->zero_stage : 2;
    if (o->param_home == ZO_TIER_NVME && o->optim_home != ZO_TIER_NVME &&
        o->optim_home != ZT_HOME_DEFAULT && (o->world_size <= 1 || stage == 3))
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--offload-param nvme needs --offload-optimizer nvme %s (the update writes "
                       "the new 16-bit parameters through the optimizer's NVMe stages; with "
                       "--offload-optimizer %s only --zero-stage 1 or 2 across ranks keeps the "
                       "other ranks' chunks on NVMe)",
                       o->world_size <= 1 ? "on one rank" : "at --zero-stage 3",
                       o->optim_home == ZO_TIER_DEVICE ? "none" : "cpu");
    if (o->chunk_bytes && (o->chunk_bytes < 4096 || o->chunk_bytes > ZO_MAX_CHUNK_BYTES))
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--chunk-bytes %llu: a chunk holds 4 KiB to 1 TiB (leave it out for the "
                       "largest tensor's size)",
                       (unsigned long long)o->chunk_bytes);
    if (o->steps < 0 || o->seq <= 0 || o->micro_batch <= 0 || o->grad_accum <= 0)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "steps %d (>= 0), seq %d, micro-batch %d, grad-accum %d (> 0)", o->steps,
                       o->seq, o->micro_batch, o->grad_accum);
    if (!(o->lr > 0.0f) || !isfinite(o->lr))
        return zt_fail(ZO_ERR_INVALID_ARG, "--lr %g must be > 0", (double)o->lr);
    if (o->dtype != ZO_DTYPE_BF16 && o->dtype != ZO_DTYPE_F16 && o->dtype != ZO_DTYPE_F32)
        return zt_fail(ZO_ERR_INVALID_ARG, "parameter dtype %s: expected bf16, fp16 or fp32",
                       zo_dtype_name(o->dtype));
    if (o->dtype == ZO_DTYPE_F32 && o->master_split)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--master-split on with --dtype fp32: fp32 parameters are the master "
                       "itself, nothing to split; leave --master-split off or train in bf16");
    if (o->micro_group < 0)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--micro-group %d: expected 0 or 1 (micro-batch-major) or the "
                       "micro-batches per layer-major group (> 1)",
                       o->micro_group);
    if (o->act_home != ZT_ACT_DEVICE && o->act_home != ZT_ACT_HOST && o->act_home != ZT_ACT_NVME)
        return zt_fail(ZO_ERR_INVALID_ARG, "--act-home %d: expected device, host or nvme",
                       o->act_home);
    if (o->act_home == ZT_ACT_NVME && !act_on_nvme(o))
        return zt_fail(ZO_ERR_UNSUPPORTED,
                       "--act-home nvme at one micro-batch a group (--micro-group %d, "
                       "--grad-accum %d): layer inputs go to NVMe only from layer-major groups, "
                       "which write each extent while the group's other micro-batches compute; "
                       "the per-layer store (one micro-batch a group) keeps them in pinned "
                       "host memory, and has no NVMe home. Use --act-home host, or --micro-group "
                       "2 or more with --grad-accum 2 or more",
                       o->micro_group, o->grad_accum);
    if (dp_size(o) > 1 && o->grad_accum > 1 && o->micro_group > 1 &&
        o->reduce_order == ZO_REDUCE_ORDER_GLOBAL)
        return zt_fail(ZO_ERR_UNSUPPORTED,
                       "--micro-group %d with %d ranks: the global reduction order reduces each "
                       "micro-batch over the ranks as it comes down, but a layer-major group "
                       "sums its micro-batches on the device first: use --micro-group 1 "
                       "(bitwise equal to one rank), or --reduce-order rank to keep the groups "
                       "(within rounding of one rank)",
                       o->micro_group, dp_size(o));
    ZT_TRY(check_stages(o));
    ZT_TRY(check_tensor_parallel(o));
    return zt_schedule_check(&o->sched);
}

/* A token file's id check of many gigabytes: a line a second on rank 0. */
static void data_progress(void *ctx, uint64_t done, uint64_t total)
{
    const zt_trainer *t = ctx;
    if (t->o.rank == 0)
        fprintf(stderr, "zo-train: checking the ids of %s: %.0f%% (%llu of %llu)\n", t->o.data_path,
                100.0 * (double)done / (double)total, (unsigned long long)done,
                (unsigned long long)total);
}

static int data_stop(void *ctx)
{
    (void)ctx;
    return zt_signal_pending() != 0;
}

static zo_status open_data(zt_trainer *t)
{
    const zt_data_hooks hooks = {data_progress, data_stop, t};
    ZT_TRY(zt_data_open_with(&t->data, t->o.data_path, t->o.seq, t->o.val_fraction, t->o.seed,
                             &hooks));
    zt_data_get_info(t->data, &t->setup.data);
    if (t->setup.data.vocab > t->o.shape.vocab)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "%s has a vocabulary of %d but the model's is %d: pass --vocab %d",
                       t->o.data_path, t->setup.data.vocab, t->o.shape.vocab, t->setup.data.vocab);
    size_t n = (size_t)t->o.grad_accum * t->o.micro_batch * t->o.seq;
    size_t W = (size_t)dp_size(&t->o); /* the data-parallel ranks' global batch */
    t->in = malloc(W * n * sizeof *t->in);
    t->tgt = malloc(W * n * sizeof *t->tgt);
    t->vin = malloc(n * sizeof *t->vin);
    t->vtgt = malloc(n * sizeof *t->vtgt);
    t->losses = malloc((size_t)t->o.grad_accum * sizeof *t->losses);
    t->all_losses = malloc(W * (size_t)t->o.grad_accum * sizeof *t->all_losses);
    t->min = malloc(n * sizeof *t->min);
    t->mtgt = malloc(n * sizeof *t->mtgt);
    if (!t->in || !t->tgt || !t->vin || !t->vtgt || !t->losses || !t->all_losses || !t->min ||
        !t->mtgt)
        return zt_fail(ZO_ERR_NO_MEMORY, "token buffers");
    return ZO_OK;
}

/* This rank's stage and its engine layers (all of them without stages). */
static zo_status choose_stage(zt_trainer *t)
{
    const zt_options *o = &t->o;
    t->first = 0;
    t->last = zt_engine_layers(&o->shape) - 1;
    t->setup.stage = stage_of(o);
    if (stages(o) > 1) {
        ZT_TRY(zt_pipe_split_make(&o->shape, stages(o), o->pipeline_split, &t->split));
        t->first = t->split.first[t->setup.stage];
        t->last = t->split.first[t->setup.stage + 1] - 1;
        zt_pipe_split_format(&t->split, t->setup.pipeline_split, sizeof t->setup.pipeline_split);
    }
    t->setup.first_layer = t->first;
    t->setup.last_layer = t->last;
    return ZO_OK;
}

/* The tensor group's activations and gathered weights are device memory: on
 * a GPU they go over NCCL, a second world communicator split as tp_comm is,
 * while the host communicator keeps the engine's, the checkpoints' and the
 * ranks' host exchanges. On the cpu device the host communicator reaches
 * device memory itself; the tests' hook (ZT_TEST_TP_DEVICE_COMM) opens the
 * second one there too, taking device allocations only, as NCCL does. */
static zo_status open_tp_device_comm(zt_trainer *t, int color, int key)
{
    int hook = zt_test_tp_device_comm && zt_test_tp_device_comm();
    if (!is_cuda(t) && !hook) {
        t->tp_dev = t->tp_comm;
        return ZO_OK;
    }
    ZT_TRY(zt_ranks_open_device(&t->dev_world, t->dev, &t->o, is_cuda(t) ? "nccl" : NULL));
    ZT_LIB(zo_comm_split(t->dev_world, color, key, &t->tp_dev));
    if (t->o.verbose)
        fprintf(stderr, "zo-train: rank %d's tensor group reduces device memory over %s%s\n",
                t->o.rank, zo_comm_backend(t->tp_dev),
                zo_comm_takes_host_memory(t->tp_dev) ? "" : " (device allocations only)");
    return ZO_OK;
}

/* The world split into pipeline groups (the ranks of one data-parallel
 * index, in stage order) and data-parallel groups (the ranks of one
 * stage); without stages the data-parallel group is the world. */
static zo_status split_ranks(zt_trainer *t)
{
    const zt_options *o = &t->o;
    const int T = tp_size(o), tr = tp_rank(o), dr = dp_rank(o), sr = stage_of(o);
    if (stages(o) == 1 && T == 1) {
        t->dp_comm = t->comm;
        return ZO_OK;
    }
    if (stages(o) > 1)
        ZT_LIB(zo_comm_split(t->comm, dr * T + tr, sr, &t->pipe_comm));
    if (dp_size(o) > 1)
        ZT_LIB(zo_comm_split(t->comm, sr * T + tr, dr, &t->dp_comm));
    if (T == 1) {
        t->mp_comm = t->pipe_comm;
        return ZO_OK;
    }
    ZT_LIB(zo_comm_split(t->comm, sr * dp_size(o) + dr, tr, &t->tp_comm));
    ZT_LIB(zo_comm_split(t->comm, dr, sr * T + tr, &t->mp_comm));
    return open_tp_device_comm(t, sr * dp_size(o) + dr, tr);
}

static zo_status trainer_open(zt_trainer *t)
{
    ZT_TRY(zt_options_check(&t->o));
    const char *be = resolve_backend(t->o.device);
    if (!be || (strcmp(be, "cpu") != 0 && strcmp(be, "cuda") != 0))
        return zt_fail(ZO_ERR_INVALID_ARG, "--device '%s': expected auto, cpu or cuda",
                       t->o.device);
    snprintf(t->setup.backend, sizeof t->setup.backend, "%s", be);
    resolve_homes(t);
    ZT_TRY(resolve_nvme(t));
    ZT_TRY(choose_stage(t));
    ZT_TRY(open_data(t));
    t->setup.n_params = zt_shape_n_params(&t->o.shape);
    ZT_TRY(open_device(t));
    if (t->o.world_size > 1)
        ZT_TRY(zt_ranks_open(&t->comm, t->dev, &t->o));
    ZT_TRY(split_ranks(t));
    return open_engine(t);
}

zo_status zt_trainer_init(zt_trainer **out, const zt_options *o)
{
    zt_trainer *t = calloc(1, sizeof *t);
    if (!t)
        return zt_fail(ZO_ERR_NO_MEMORY, "trainer");
    t->o = *o;
    t->sched_it = o->sched.last_batch_iteration;
    t->lr = t->last_lr = zt_schedule_first_lr(&o->sched, o->lr);
    double t0 = zo_now_s();
    zo_status st = trainer_open(t);
    if (st < 0) {
        zt_trainer_free(t);
        return st;
    }
    t->setup.init_seconds = zo_now_s() - t0;
    *out = t;
    return ZO_OK;
}

void zt_trainer_free(zt_trainer *t)
{
    if (!t)
        return;
    if (t->s)
        zo_stream_synchronize(t->s);
    zt_pipe_free(t->pipe);
    zo_engine_free(t->eng);
    zt_tp_free(t->tp);
    if (t->dp_comm != t->comm)
        zo_comm_free(t->dp_comm);
    if (t->mp_comm != t->pipe_comm)
        zo_comm_free(t->mp_comm);
    if (t->tp_dev != t->tp_comm)
        zo_comm_free(t->tp_dev);
    zo_comm_free(t->dev_world);
    zo_comm_free(t->tp_comm);
    zo_comm_free(t->pipe_comm);
    zo_comm_free(t->comm);
    zt_model_free(t->m);
    zo_stream_destroy(t->s);
    zo_device_free(t->dev);
    zt_data_free(t->data);
    for (int l = 0; t->ids && l < zt_engine_layers(&t->o.shape); l++)
        free(t->ids[l]);
    free(t->ids);
    free(t->owner);
    free(t->in);
    free(t->tgt);
    free(t->min);
    free(t->mtgt);
    free(t->vin);
    free(t->vtgt);
    free(t->losses);
    free(t->all_losses);
    free(t);
}

const zt_setup *zt_trainer_setup(const zt_trainer *t)
{
    return &t->setup;
}
zo_engine_t zt_trainer_engine(zt_trainer *t)
{
    return t->eng;
}
zt_act_store *zt_trainer_act_store(zt_trainer *t)
{
    return zt_model_act_store(t->m);
}
zo_comm_t zt_trainer_comm(zt_trainer *t)
{
    return t->comm;
}

zo_comm_t zt_trainer_tp_comm(zt_trainer *t)
{
    return t->tp_comm;
}
zo_stream_t zt_trainer_stream(zt_trainer *t)
{
    return t->s;
}
zo_status zt_trainer_tp_gather(zt_trainer *t, const void *mine, void *all, size_t bytes)
{
    size_t stage_bytes;
    void *stage = zt_tp_stage(t->tp, &stage_bytes);
    return zt_host_all_gather(t->tp_comm, t->s, stage, stage_bytes, mine, all, bytes);
}

/* The data-parallel ranks' split (N = dp_size): in the global reduce order
 * rank r's i-th micro-batch is the step's (i*N + r)-th; else (the rank
 * order, one rank) the (r*k + i)-th. */
static int global_micro(const zt_trainer *t, int rank, int i)
{
    int N = dp_size(&t->o), k = t->o.grad_accum;
    if (N > 1 && t->o.reduce_order == ZO_REDUCE_ORDER_GLOBAL)
        return i * N + rank;
    return (N > 1 ? rank : 0) * k + i;
}

/* This rank's micro-batches of the ranks' batch, in its own order: a
 * contiguous range, or (global order) gathered every N-th. */
static void rank_batch(zt_trainer *t, const int32_t **in, const int32_t **tgt)
{
    size_t per = (size_t)t->o.micro_batch * t->o.seq;
    int k = t->o.grad_accum, r = dp_rank(&t->o);
    *in = t->in + (size_t)global_micro(t, r, 0) * per;
    *tgt = t->tgt + (size_t)global_micro(t, r, 0) * per;
    if (k == 1 || global_micro(t, r, 1) == global_micro(t, r, 0) + 1)
        return;
    for (int i = 0; i < k; i++) {
        size_t from = (size_t)global_micro(t, r, i) * per;
        memcpy(t->min + (size_t)i * per, t->in + from, per * sizeof *t->in);
        memcpy(t->mtgt + (size_t)i * per, t->tgt + from, per * sizeof *t->tgt);
    }
    *in = t->min;
    *tgt = t->mtgt;
}

/* The mean loss of the step's micro-batches: with ranks, of every rank's,
 * summed in the step's micro-batch order as one rank sums its own. */
static zo_status mean_loss(zt_trainer *t, float *loss)
{
    int n = t->o.grad_accum, W = 1;
    const float *l = t->losses;
    if (t->pipe) /* the last stage's */
        ZT_TRY(zt_pipe_share_losses(t->pipe, t->losses, n));
    if (t->dp_comm) {
        ZT_LIB(zt_host_all_gather(t->dp_comm, t->s, NULL, 0, t->losses, t->all_losses,
                                  (size_t)n * sizeof *t->losses));
        W = dp_size(&t->o);
        l = t->all_losses;
    }
    double sum = 0;
    for (int m = 0; m < n * W; m++) /* global micro-batch m: rank m % W's or m / n's */
        for (int r = 0; r < W; r++)
            for (int i = 0; i < n; i++)
                if (global_micro(t, r, i) == m)
                    sum += l[r * n + i];
    *loss = (float)(sum / (n * W));
    return ZO_OK;
}

/* The layer inputs' NVMe store (act_home nvme) in the step's statistics:
 * its bytes moved since *at_open, its extents in the NVMe peak. */
static void add_act_io(zt_trainer *t, const zo_swap_stats *at_open, zo_step_stats *stats)
{
    zo_swap_t act = zt_act_swap(zt_model_act_store(t->m));
    zo_swap_stats now = ZO_SWAP_STATS_INIT;
    if (!act || zo_swap_get_stats(act, &now) != ZO_OK)
        return;
    zt_model_config mc = model_config(&t->o);
    stats->nvme_read_bytes += now.bytes_read - at_open->bytes_read;
    stats->nvme_write_bytes += now.bytes_written - at_open->bytes_written;
    stats->peak[ZO_TIER_NVME] += (uint64_t)now.extents_used * zt_model_act_extent(&mc);
}

/* A step the model failed: the engine gives it up as after its own errors
 * (the committed weights stay; the next call retries the step). */
static zo_status abandon_step(zt_trainer *t, zo_status st)
{
    char why[1024];
    snprintf(why, sizeof why, "%s", zt_last_error());
    zt_model_settle(t->m);
    if (t->pipe)
        zt_pipe_settle(t->pipe);
    zo_engine_abandon_step(t->eng);
    return zt_fail(st, "%s", why);
}

zo_status zt_trainer_step(zt_trainer *t, float *loss, zo_step_stats *stats)
{
    const int n = t->o.grad_accum, W = dp_size(&t->o);
    if (t->retry)
        zo_stream_synchronize(
            t->s); /* let the abandoned step's queued work finish; its error is reported */
    else {         /* every rank reads the ranks' batch and trains on its own share */
        zt_data_get_position(t->data, &t->before);
        zt_data_next_train(t->data, t->in, t->tgt, W * n * t->o.micro_batch);
    }
    t->retry = 1;
    zo_swap_stats act0 = ZO_SWAP_STATS_INIT;
    zo_swap_t act = zt_act_swap(zt_model_act_store(t->m));
    if (act)
        ZT_LIB(zo_swap_get_stats(act, &act0));
    ZT_LIB(zo_engine_set_lr(t->eng, (float)t->lr));
    const int32_t *in, *tgt;
    rank_batch(t, &in, &tgt);
    ZT_TRY(zt_model_set_batch(t->m, in, tgt, n));
    /* The mean over the ranks' micro-batches, times the loss scale (fp16). */
    float grad_scale = (float)(zo_engine_loss_scale(t->eng) / ((double)n * W));
    /* layer-major: each group through a layer before the next (a group of 1:
     * micro-batch-major); the engine sums the group's gradients on the device */
    zt_model_config mc = model_config(&t->o);
    zt_act_group g = act_group(&t->o);
    const int G = zt_model_group(&mc, &g);
    zo_status st = ZO_OK;
    if (t->pipe)
        st = zt_pipe_train(t->pipe, &t->src, grad_scale);
    for (int i = 0; !t->pipe && st >= 0 && i < n; i += G)
        st = zt_model_train_group(t->m, &t->src, i, n - i < G ? n - i : G, grad_scale);
    if (st >= 0)
        st = zt_model_read_losses(t->m, t->losses, n);
    if (st < 0) /* the model's own failure (its layer inputs, say): the engine drops the step */
        return abandon_step(t, st);
    memset(stats, 0, sizeof *stats);
    stats->struct_size = sizeof *stats;
    ZT_LIB(zo_engine_end_step(t->eng, stats));
    add_act_io(t, &act0, stats);
    t->retry = 0;
    t->step++;
    t->last_lr = t->lr;
    if (!stats->overflow && t->o.sched.type != ZO_SCHEDULER_NONE)
        t->lr = zt_schedule_lr_at(&t->o.sched, t->o.lr, ++t->sched_it);
    return mean_loss(t, loss);
}

zo_status zt_trainer_validate(zt_trainer *t, double *loss, uint64_t *n_tokens)
{
    const int mb = t->o.micro_batch, hold = t->o.grad_accum;
    uint64_t avail = t->setup.data.val_windows / (uint64_t)mb;
    int total = (int)(avail < (uint64_t)t->o.val_batches ? avail : (uint64_t)t->o.val_batches);
    double sum = 0;
    for (int done = 0; done < total;) {
        int k = total - done < hold ? total - done : hold;
        zt_data_val(t->data, (uint64_t)done * mb, t->vin, t->vtgt, k * mb);
        ZT_TRY(zt_model_set_batch(t->m, t->vin, t->vtgt, k));
        if (t->pipe)
            ZT_TRY(zt_pipe_eval(t->pipe, &t->src, k));
        for (int i = 0; !t->pipe && i < k; i++)
            ZT_TRY(zt_model_eval_micro(t->m, &t->src, i));
        ZT_TRY(zt_model_read_losses(t->m, t->losses, k));
        if (t->pipe)
            ZT_TRY(zt_pipe_share_losses(t->pipe, t->losses, k));
        for (int i = 0; i < k; i++)
            sum += t->losses[i];
        done += k;
    }
    *loss = total ? sum / total : NAN;
    *n_tokens = (uint64_t)total * mb * t->o.seq;
    return ZO_OK;
}

/* This rank's master weights of a tensor (its part under tensor
 * parallelism). */
static zo_status read_own_master(zt_trainer *t, int layer, int idx, float *out)
{
    if (zt_test_read_fails && zt_test_read_fails(t->o.rank))
        return zt_fail(ZO_ERR_IO,
                       "reading tensor %d of layer %d: a failure planted by the test "
                       "(ZT_TEST_READ_FAIL)",
                       idx, layer);
    zo_status st = zo_engine_read_master(t->eng, t->ids[layer][idx], out);
    return st < 0 ? zt_lib_fail(st, "zo_engine_read_master") : ZO_OK;
}

/* Tensor parallel: the whole tensor from the group's parts (each rank reads
 * its own, the group all-gathers them in rank order and each merges). With
 * out NULL (no room for the whole) the rank only gives its part. */
static zo_status read_tp_weights(zt_trainer *t, int layer, int idx, float *out)
{
    const zt_options *o = &t->o;
    const int T = tp_size(o);
    size_t n = zt_tp_numel(&o->shape, T, layer, idx);
    float *part = malloc(n * sizeof *part), *all = malloc((size_t)T * n * sizeof *all);
    zo_status st = part && all ? ZO_OK : zt_fail(ZO_ERR_NO_MEMORY, "a tensor's %d parts", T);
    if (st >= 0)
        st = read_own_master(t, layer, idx, part);
    /* every rank of the group joins the gather, even after its own read failed */
    zo_status gst = part && all ? zt_trainer_tp_gather(t, part, all, n * sizeof *part) : ZO_OK;
    if (st >= 0 && gst < 0)
        st = zt_lib_fail(gst, "gathering a tensor's tensor-parallel parts");
    if (st >= 0 && out)
        zt_tp_merge(&o->shape, T, layer, idx, all, out);
    free(part);
    free(all);
    return st;
}

zo_status zt_trainer_read_weights(zt_trainer *t, int layer, int idx, float *out)
{
    if (layer < 0 || layer >= zt_engine_layers(&t->o.shape) || idx < 0 ||
        idx >= zt_layer_tensors(&t->o.shape, layer))
        return zt_fail(ZO_ERR_INVALID_ARG, "no tensor %d in layer %d", idx, layer);
    if (layer < t->first || layer > t->last)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "layer %d is held by another pipeline stage (this stage %d holds %d..%d)",
                       layer, t->setup.stage, t->first, t->last);
    return t->tp_comm ? read_tp_weights(t, layer, idx, out) : read_own_master(t, layer, idx, out);
}

/* Whether this rank hashes a tensor: its stage holds it and, under ZeRO,
 * this data-parallel rank owns its states. */
static int owns_tensor(zt_trainer *t, int l, int k)
{
    return l >= t->first && l <= t->last &&
           zo_engine_tensor_owner(t->eng, t->ids[l][k]) == dp_rank(&t->o);
}

/* Each tensor's (owned, hash) pair in registration order: (1, its hash)
 * where this rank owns it, (0, 0) elsewhere. After a failure the rank goes
 * on joining its tensor-parallel group's gathers (giving its parts, hashing
 * nothing) so no peer waits on it; the first failure is returned. */
static zo_status own_hashes(zt_trainer *t, uint64_t *h, int n)
{
    const zt_shape *s = &t->o.shape;
    float *buf = NULL;
    size_t cap = 0;
    zo_status st = ZO_OK;
    for (int l = 0, i = 0; l < zt_engine_layers(s); l++)
        for (int k = 0; k < zt_layer_tensors(s, l) && i < n; k++, i++) {
            size_t numel = zt_tensor_numel(s, l, k);
            h[2 * i] = h[2 * i + 1] = 0;
            if (!owns_tensor(t, l, k) || (st < 0 && !t->tp_comm))
                continue;
            float *b = numel > cap ? realloc(buf, numel * sizeof *b) : buf;
            if (b)
                buf = b, cap = numel > cap ? numel : cap;
            zo_status rs =
                b ? ZO_OK : zt_fail(ZO_ERR_NO_MEMORY, "weights digest: %zu floats", numel);
            if (t->tp_comm) { /* joined even after a failure */
                zo_status gs = read_tp_weights(t, l, k, rs >= 0 && st >= 0 ? buf : NULL);
                rs = rs < 0 ? rs : gs;
            } else if (rs >= 0) {
                rs = read_own_master(t, l, k, buf);
            }
            if (rs >= 0 && st >= 0)
                h[2 * i] = 1, h[2 * i + 1] = XXH64(buf, numel * sizeof *buf, 0);
            else if (st >= 0)
                st = rs;
        }
    free(buf);
    return st;
}

/* Every tensor's pair from the rank that owns it, in place in h (2n pairs'
 * entries, then this rank's status mine; all: 2n + 1 per rank). Every rank
 * joins, a failed one too: the others then fail naming it. */
static zo_status owners_hashes(zt_trainer *t, uint64_t *h, uint64_t *all, int n, zo_status mine)
{
    const int W = t->o.world_size;
    const size_t per = 2 * (size_t)n + 1;
    h[2 * n] = (uint64_t)(int64_t)mine;
    zo_status gst = zt_host_all_gather(t->comm, t->s, NULL, 0, h, all, per * sizeof *h);
    if (mine < 0)
        return mine;
    if (gst < 0)
        return zt_lib_fail(gst, "gathering the weights' hashes");
    for (int r = 0; r < W; r++) {
        int64_t rs = (int64_t)all[(size_t)r * per + 2 * n];
        if (rs < 0)
            return zt_fail((zo_status)rs,
                           "weights digest: rank %d could not read its weights (its log says why)",
                           zo_comm_world_rank(t->comm, r));
    }
    for (int i = 0; i < n; i++)
        for (int r = 0; r < W; r++)
            if (all[(size_t)r * per + 2 * i]) {
                h[2 * i + 1] = all[(size_t)r * per + 2 * i + 1];
                break;
            }
    return ZO_OK;
}

zo_status zt_trainer_weights_digest(zt_trainer *t, uint64_t *out)
{
    const zt_shape *s = &t->o.shape;
    int n = 0, W = t->comm ? t->o.world_size : 1;
    for (int l = 0; l < zt_engine_layers(s); l++)
        n += zt_layer_tensors(s, l);
    uint64_t *h = calloc(2 * (size_t)n + 1, sizeof *h);
    uint64_t *all = calloc((2 * (size_t)n + 1) * W, sizeof *all);
    zo_status st =
        h && all ? own_hashes(t, h, n) : zt_fail(ZO_ERR_NO_MEMORY, "weights digest: %d tensors", n);
    if (h && all && t->comm)
        st = owners_hashes(t, h, all, n, st);
    for (int i = 0; st == ZO_OK && i < n; i++)
        h[i] = h[2 * i + 1]; /* the hashes alone, as they always were */
    if (st == ZO_OK)
        *out = XXH64(h, (size_t)n * sizeof *h, 0);
    free(h);
    free(all);
    return st;
}

void zt_trainer_get_state(const zt_trainer *t, zt_train_state *out)
{
    out->step = t->step;
    out->sched_it = t->sched_it;
    out->lr = t->lr;
    zt_data_get_position(t->data, &out->data);
    if (t->retry) /* a failed step's tokens are not read yet: the committed state's position */
        out->data = t->before;
    out->origin_step = t->origin_step;
    out->origin_windows = t->origin_windows;
}

zo_status zt_trainer_set_state(zt_trainer *t, const zt_train_state *in)
{
    if (in->step < 0 || !isfinite(in->lr) || in->lr < 0)
        return zt_fail(ZO_ERR_INVALID_ARG, "trainer state: step %lld (>= 0), lr %g (finite, >= 0)",
                       (long long)in->step, in->lr);
    ZT_TRY(zt_data_set_position(t->data, &in->data));
    t->step = in->step;
    t->sched_it = in->sched_it;
    t->lr = t->last_lr = in->lr;
    t->origin_step = in->origin_step;
    t->origin_windows = in->origin_windows;
    t->retry = 0;
    return ZO_OK;
}

zo_status zt_trainer_write_tp_master(zt_trainer *t, int layer, int idx, const float *w)
{
    const zt_options *o = &t->o;
    if (layer < t->first || layer > t->last)
        return ZO_OK; /* another stage's */
    int id = t->ids[layer][idx];
    if (zo_engine_tensor_owner(t->eng, id) != (dp_size(o) > 1 ? dp_rank(o) : 0))
        return ZO_OK; /* another data-parallel rank's states (zo_engine_share_params) */
    size_t n = zt_tp_numel(&o->shape, tp_size(o), layer, idx);
    float *part = malloc(n * sizeof *part);
    if (!part)
        return zt_fail(ZO_ERR_NO_MEMORY, "a tensor-parallel part of %zu elements", n);
    zt_tp_slice(&o->shape, tp_size(o), tp_rank(o), layer, idx, w, part);
    zo_status st = zo_engine_write_state(t->eng, id, part, NULL, NULL);
    free(part);
    return st < 0 ? zt_lib_fail(st, "zo_engine_write_state") : ZO_OK;
}

int zt_trainer_tensor_id(const zt_trainer *t, int layer, int idx)
{
    return t->ids[layer][idx];
}

const zt_options *zt_trainer_options(const zt_trainer *t)
{
    return &t->o;
}

double zt_trainer_lr(const zt_trainer *t)
{
    return t->last_lr;
}

uint64_t zt_trainer_device_high_water(zt_trainer *t)
{
    zo_device_mem_stats ms;
    return zo_device_mem_get_stats(t->dev, &ms) == ZO_OK ? ms.high_water : 0;
}
