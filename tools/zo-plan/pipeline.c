/* zo-plan over a pipeline (pipeline.h): the balanced split of the engine
 * layers, each stage planned like one GPU with its own layers, and the 1F1B
 * step with its bubble and the activations sent between stages. */
#include "pipeline.h"
#include "plan_internal.h"
#include "tensor.h"
#include "tp_shape.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zo/units.h"
#include "zt_error.h"

/* Costs compare equal within this relative tolerance: the blocks' equal
 * costs summed in different orders differ in their last bits. */
#define ZP_PIPE_TOL 1e-9

void zp_pipe_layer_costs(const zp_job *job, double *cost, uint64_t *mem)
{
    const zt_shape *s = &job->shape;
    int E = zt_engine_layers(s);
    for (int l = 0; l < E; l++) {
        double model;
        zp_layer_flops_per_token(job, l, &model, &cost[l]);
        mem[l] = 0;
        for (int i = 0; i < zt_layer_tensors(s, l); i++)
            mem[l] += 2 * (uint64_t)zt_tensor_numel(s, l, i);
    }
    if (s->tied) /* the last stage keeps a copy of layer 0 as its head */
        mem[E - 1] += mem[0];
}

static int leq(double a, double b)
{
    return a <= b + ZP_PIPE_TOL * fmax(fabs(a), fabs(b));
}

/* Stage costs over prefix sums: layers [j, i). */
typedef struct prefix {
    double *c;
    uint64_t *m;
} prefix;

/* The least slowest-stage cost of k stages over layers [0, i), every k, i
 * (f[k * (n + 1) + i]; INFINITY where k > i). */
static void min_max_cost(const prefix *p, int n, int S, double *f)
{
    for (int k = 1; k <= S; k++)
        for (int i = 0; i <= n; i++) {
            double best = INFINITY;
            if (k == 1 && i >= 1)
                best = p->c[i] - p->c[0];
            for (int j = k - 1; k > 1 && j < i; j++) {
                double v = fmax(f[(k - 1) * (n + 1) + j], p->c[i] - p->c[j]);
                if (v < best)
                    best = v;
            }
            f[k * (n + 1) + i] = best;
        }
}

/* Among the splits whose every stage costs at most T, the one with the
 * least largest stage in bytes: g and its choices arg. */
static void min_max_mem(const prefix *p, int n, int S, double T, double *g, int *arg)
{
    for (int k = 1; k <= S; k++)
        for (int i = 0; i <= n; i++) {
            double best = INFINITY;
            int at = -1;
            for (int j = k - 1; j < i; j++) {
                if ((k == 1 && j != 0) || !leq(p->c[i] - p->c[j], T))
                    continue;
                double prev = k == 1 ? 0 : g[(k - 1) * (n + 1) + j];
                double v = fmax(prev, (double)(p->m[i] - p->m[j]));
                if (v < best) {
                    best = v;
                    at = j;
                }
            }
            g[k * (n + 1) + i] = best;
            arg[k * (n + 1) + i] = at;
        }
}

zo_status zp_pipe_balance(const double *cost, const uint64_t *mem, int n, int S, int *first)
{
    if (S < 1 || S > n || S > ZP_PIPE_MAX_STAGES)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "%d pipeline stages for %d engine layers: each stage needs a layer of "
                       "its own, so 1..%d stages",
                       S, n, n < ZP_PIPE_MAX_STAGES ? n : ZP_PIPE_MAX_STAGES);
    size_t cells = (size_t)(S + 1) * (size_t)(n + 1);
    prefix p = {calloc((size_t)n + 1, sizeof *p.c), calloc((size_t)n + 1, sizeof *p.m)};
    double *f = calloc(cells, sizeof *f), *g = calloc(cells, sizeof *g);
    int *arg = calloc(cells, sizeof *arg);
    zo_status st = ZO_OK;
    if (!p.c || !p.m || !f || !g || !arg)
        st = zt_fail(ZO_ERR_NO_MEMORY, "the pipeline split's tables");
    for (int i = 0; st >= 0 && i < n; i++) {
        p.c[i + 1] = p.c[i] + cost[i];
        p.m[i + 1] = p.m[i] + mem[i];
    }
    if (st >= 0) {
        min_max_cost(&p, n, S, f);
        min_max_mem(&p, n, S, f[S * (n + 1) + n], g, arg);
        first[S] = n;
        for (int k = S, i = n; k >= 1; k--)
            i = first[k - 1] = arg[k * (n + 1) + i];
    }
    free(p.c);
    free(p.m);
    free(f);
    free(g);
    free(arg);
    return st;
}

zo_status zp_pipe_check_split(const int *given, int S, int n, int *first)
{
    if (S < 1 || S > n || S > ZP_PIPE_MAX_STAGES)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "%d pipeline stages for %d engine layers: each stage needs a layer of "
                       "its own, so 1..%d stages",
                       S, n, n < ZP_PIPE_MAX_STAGES ? n : ZP_PIPE_MAX_STAGES);
    first[0] = 0;
    first[S] = n;
    for (int s = 1; s < S; s++) {
        first[s] = given[s - 1];
        if (first[s] <= first[s - 1] || first[s] >= n)
            return zt_fail(ZO_ERR_INVALID_ARG,
                           "pipeline split: stage %d starts at layer %d, but each stage's first "
                           "layer must be above the previous stage's (%d) and below the %d "
                           "engine layers",
                           s, first[s], first[s - 1], n);
    }
    return ZO_OK;
}

void zp_pipeline_free(zp_pipeline_plan *p)
{
    free(p->stage);
    p->stage = NULL;
}

/* The pipeline being planned. */
typedef struct pipe_ctx {
    const zp_job *job;
    zp_hardware hw; /* one rank's share of the node */
    zp_speeds sp;
    const zp_world *w;
    double tbw;
    uint64_t *work;
} pipe_ctx;

static uint64_t page_round(uint64_t b)
{
    return (b + 4095) / 4096 * 4096;
}

/* zo-train's pipeline group is mpi, which takes host buffers: on a cuda
 * device each stage stages its transfers through pinned buffers
 * (tools/zo-train/pipeline.c), one per transfer stream: four of an
 * activation, one on the compute stream (validation; a tied stage's layer 0
 * tensors), and a tied first and last stage's two of the head's fp32
 * gradients. */
static uint64_t staging_bytes(const pipe_ctx *x, const zp_pipeline_plan *o, int s)
{
    const zp_job *j = x->job;
    int S = o->stages, ends = j->shape.tied && (s == 0 || s == S - 1);
    if (S < 2 || strcmp(x->hw.backend, "cuda") != 0)
        return 0;
    uint64_t compute = o->act_bytes, head = 0;
    for (int i = 0; ends && i < zt_layer_tensors(&j->shape, 0); i++) {
        uint64_t n = zt_tensor_numel(&j->shape, 0, i);
        compute = n * zo_dtype_size(j->dtype) > compute ? n * zo_dtype_size(j->dtype) : compute;
        head += n * sizeof(float);
    }
    return 4 * page_round(o->act_bytes) + page_round(compute) + 2 * page_round(head);
}

static zo_status plan_stage(const pipe_ctx *x, const zp_pipeline_plan *o, int s, zp_stage_plan *st)
{
    zp_job j = *x->job;
    int M = j.grad_accum, S = o->stages, D = o->data_parallel;
    j.stage_first = o->first[s];
    j.stage_end = o->first[s + 1];
    /* zo-train's zt_pipe_sets: its warm-up forwards and the one in hand, and one more */
    int warm = S - s - 1 < M ? S - s - 1 : M;
    j.act_sets = warm + 2 < M ? warm + 2 : M;
    /* 1F1B runs micro-batch by micro-batch, and so does a tensor-parallel rank (zo-train
       refuses --micro-group there); one stage without it is the engine's own run */
    if (S > 1 || zp_tp(&j) > 1) {
        j.micro_group = 1;
        j.act_home = ZP_ACT_DEVICE;
    }
    j.chunk_bytes = o->chunk_bytes;
    j.mode = o->mode;
    j.mode_auto = 0;
    j.world_size = D > 1 ? D : 0;
    j.zero_stage = D > 1 ? 1 : 0;
    memset(st, 0, sizeof *st);
    st->first = j.stage_first;
    st->end = j.stage_end;
    st->in_flight = j.act_sets;
    /* a tied model's last stage computes the head with a device copy of
       layer 0 (zo-train's, beside its engine and arena) */
    zp_hardware hw = x->hw;
    if (S > 1 && s == S - 1 && j.shape.tied) {
        for (int i = 0; i < zt_layer_tensors(&j.shape, 0); i++)
            st->tied_copy_bytes +=
                (uint64_t)zt_tensor_numel(&j.shape, 0, i) * zo_dtype_size(j.dtype);
        hw.device_bytes =
            hw.device_bytes > st->tied_copy_bytes ? hw.device_bytes - st->tied_copy_bytes : 0;
    }
    ZT_TRY(zp_plan_split(&j, &hw, &x->sp, x->tbw, &st->plan, x->work));
    st->plan.modelled.device += (int64_t)st->tied_copy_bytes;
    st->plan.device.total += st->tied_copy_bytes;
    st->staging_bytes = staging_bytes(x, o, s);
    st->plan.modelled.pinned += (int64_t)st->staging_bytes;
    st->plan.pinned.total += st->staging_bytes;
    return ZO_OK;
}

/* Stage st's micro-batch and tail, its sends and its group's collectives. */
static void stage_time(const pipe_ctx *x, const zp_pipeline_plan *o, int s, zp_stage_plan *st)
{
    const zp_plan *p = &st->plan;
    int cuda = strcmp(x->hw.backend, "cuda") == 0;
    double link = x->w->link;
    st->send_bytes = (s + 1 < o->stages ? o->act_bytes : 0) + (s > 0 ? o->act_bytes : 0);
    double mb = p->fb_seconds / o->micro_batches, sends = (double)st->send_bytes / link;
    st->mb_seconds = cuda ? fmax(mb, sends) : mb + sends;
    st->tail_seconds = p->step_seconds - p->fb_seconds;
    if (o->data_parallel > 1) { /* ZeRO 1: all-reduce the gradients, broadcast the updates */
        double n = (double)p->fp.n_params;
        st->dp_link_seconds = (8 * n + 2 * n) / link;
    }
}

/* The step from the stages' times (pipeline.h). */
static void pipeline_time(const pipe_ctx *x, zp_pipeline_plan *o)
{
    int S = o->stages, M = o->micro_batches, cuda = strcmp(x->hw.backend, "cuda") == 0;
    o->mb_seconds = 0;
    o->slowest = 0;
    for (int s = 0; s < S; s++) {
        stage_time(x, o, s, &o->stage[s]);
        if (o->stage[s].mb_seconds > o->mb_seconds) {
            o->mb_seconds = o->stage[s].mb_seconds;
            o->slowest = s;
        }
    }
    o->fb_seconds = (M + S - 1) * o->mb_seconds;
    o->tail_seconds = 0;
    for (int s = 0; s < S; s++) {
        const zp_stage_plan *st = &o->stage[s];
        double tail = st->tail_seconds, link = st->dp_link_seconds;
        double n = (double)st->plan.fp.n_params, grads = 8 * n / x->w->link;
        if (link > 0 && !cuda)
            tail += link; /* the cpu device's cores move them */
        else if (link > 0) {
            tail += fmax(0, grads - o->fb_seconds);
            if (o->mode == ZO_OPTIM_SYNC)
                tail += link - grads;
            else
                tail = fmax(tail, link - grads);
        }
        o->tail_seconds = fmax(o->tail_seconds, tail);
    }
    o->step_seconds = o->fb_seconds + o->tail_seconds;
    o->bubble = (double)(S - 1) / (M + S - 1);
    double tokens = (double)M * x->job->micro_batch * x->job->seq * o->data_parallel;
    o->tokens_per_s = tokens / o->step_seconds;
    o->mfu = tokens * zp_full_model_flops_per_token(x->job) / o->step_seconds /
             (x->sp.flops * o->world_size);
}

/* Every stage at o's chunk and mode; fits and why. */
static zo_status plan_stages(const pipe_ctx *x, zp_pipeline_plan *o)
{
    o->fits = 1;
    o->why[0] = 0;
    o->short_bytes = 0;
    for (int s = 0; s < o->stages; s++) {
        zp_stage_plan *st = &o->stage[s];
        ZT_TRY(plan_stage(x, o, s, st));
        o->short_bytes += zp_plan_overage(&st->plan, &x->hw);
        if (!st->plan.fits && o->fits) {
            o->fits = 0;
            snprintf(o->why, sizeof o->why, "stage %d (layers %d-%d): %s", s, st->first,
                     st->end - 1, st->plan.why);
        }
    }
    pipeline_time(x, o);
    zp_job j = *x->job; /* the slowest stage's tensor group */
    j.stage_first = o->first[o->slowest];
    j.stage_end = o->first[o->slowest + 1];
    zp_tp_comm_of(&j, o->stage[o->slowest].plan.micro_group, j.tp_link, &o->tp);
    uint64_t chunks = 0, M = (uint64_t)o->stages * o->tensor_parallel;
    o->tp_total_bytes = 0;
    for (int s = 0; s < o->stages; s++) {
        o->tp_total_bytes += (uint64_t)o->data_parallel * o->stage[s].plan.tp_bytes;
        if (o->stage[s].plan.fp.n_chunks > chunks)
            chunks = o->stage[s].plan.fp.n_chunks;
    }
    o->tp.verdict = M * (M - 1) * chunks * 2 * sizeof(double);
    o->tp_total_bytes += (uint64_t)o->data_parallel * o->tp.verdict;
    return ZO_OK;
}

/* a better than b: fits, then faster; of two that do not fit, the one
 * fewer bytes short of fitting. */
static int better(const zp_pipeline_plan *a, const zp_pipeline_plan *b)
{
    if (a->fits != b->fits)
        return a->fits > b->fits;
    if (!a->fits && a->short_bytes != b->short_bytes)
        return a->short_bytes < b->short_bytes;
    return a->step_seconds < b->step_seconds;
}

static zo_status check_pipeline(const zp_job *job, const zp_world *w, int S)
{
    int E = zt_engine_layers(&job->shape);
    if (S > E)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--pipeline-stages %d is more than the model's %d engine layers (the "
                       "embedding, %d blocks%s): at most %d stages",
                       S, E, job->shape.n_layers, job->shape.tied ? "" : ", the head", E);
    if (S < 1 || S > ZP_PIPE_MAX_STAGES)
        return zt_fail(ZO_ERR_INVALID_ARG, "--pipeline-stages %d: 1..%d", S, ZP_PIPE_MAX_STAGES);
    const int T = zp_tp(job);
    if (w->world_size < S * T || w->world_size % (S * T))
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "--world-size %d is not a multiple of --pipeline-stages %d x "
                       "--tensor-parallel %d (each stage needs the same number of "
                       "data-parallel ranks, each of T tensor-parallel ranks)",
                       w->world_size, S, T);
    ZT_TRY(zt_tp_check(&job->shape, T));
    if (T > 1 && job->dtype == ZO_DTYPE_F16)
        return zt_fail(ZO_ERR_UNSUPPORTED,
                       "--dtype fp16 with --tensor-parallel %d: zo-train does not combine the "
                       "dynamic loss scale over a tensor group yet; plan bf16 or fp32",
                       T);
    if (w->gpus_per_node < 1 || !(w->link > 0))
        return zt_fail(ZO_ERR_INVALID_ARG, "%d GPUs per node, link %g B/s: each must be > 0",
                       w->gpus_per_node, w->link);
    return ZO_OK;
}

/* The chunk sizes and modes the stages may share (as zp_plan_split tries them). */
static int shared_choices(const zp_job *job, uint64_t chunks[2], zo_optim_mode modes[2],
                          int *n_modes)
{
    chunks[0] = job->chunk_bytes ? job->chunk_bytes : zp_default_chunk_bytes(job);
    chunks[1] = zp_block_chunk_bytes(job);
    modes[0] = job->mode;
    modes[1] = ZO_OPTIM_OVERLAP;
    *n_modes = job->mode_auto && job->mode != ZO_OPTIM_OVERLAP ? 2 : 1;
    return job->chunk_bytes || chunks[1] <= chunks[0] ? 1 : 2;
}

static zo_status search(const pipe_ctx *x, zp_pipeline_plan *out, zp_pipeline_plan *cand)
{
    uint64_t chunks[2];
    zo_optim_mode modes[2];
    int n_modes, n_chunks = shared_choices(x->job, chunks, modes, &n_modes), have = 0;
    for (int ci = 0; ci < n_chunks; ci++)
        for (int mi = 0; mi < n_modes; mi++) {
            zp_stage_plan *keep = cand->stage;
            *cand = *out;
            cand->stage = keep;
            cand->chunk_bytes = chunks[ci];
            cand->mode = modes[mi];
            ZT_TRY(plan_stages(x, cand));
            if (!have || better(cand, out)) {
                zp_stage_plan *t = out->stage;
                *out = *cand;
                cand->stage = t;
                have = 1;
            }
        }
    return ZO_OK;
}

zo_status zp_plan_pipeline(const zp_job *job, const zp_hardware *node, const zp_speeds *node_sp,
                           const zp_world *w, int S, const int *split, double nvme_tbw,
                           zp_pipeline_plan *out, uint64_t *work)
{
    memset(out, 0, sizeof *out);
    ZT_TRY(zt_shape_check(&job->shape));
    ZT_TRY(check_pipeline(job, w, S));
    if (job->grad_accum < 1 || job->micro_batch < 1 || job->seq < 1)
        return zt_fail(ZO_ERR_INVALID_ARG,
                       "seq %d, micro-batch %d, grad-accum %d: each must be > 0", job->seq,
                       job->micro_batch, job->grad_accum);
    int E = zt_engine_layers(&job->shape);
    pipe_ctx x;
    memset(&x, 0, sizeof x);
    zp_job jt = *job; /* with its tensor group's link, below */
    x.job = &jt;
    x.w = w;
    x.tbw = nvme_tbw;
    x.work = work;
    zp_world_rank_share(w, node, node_sp, &x.hw, &x.sp);
    out->stages = S;
    out->world_size = w->world_size;
    out->tensor_parallel = zp_tp(job);
    out->sequence_parallel = job->sequence_parallel && out->tensor_parallel > 1;
    out->data_parallel = w->world_size / (S * out->tensor_parallel);
    out->tp_link = zp_world_tp_link(w, out->tensor_parallel, &out->tp_intra_node);
    jt.tp_link = out->tensor_parallel > 1 ? out->tp_link : 0;
    out->ranks_per_node = w->gpus_per_node < w->world_size ? w->gpus_per_node : w->world_size;
    out->micro_batches = job->grad_accum;
    zt_model_config mc = zp_model_config(job); /* sequence parallel: the rank's rows */
    out->act_bytes = zt_model_res_rows(&mc) * job->shape.dim * zo_dtype_size(job->dtype);
    out->p2p_boundary_bytes = (uint64_t)job->grad_accum * out->act_bytes;
    out->p2p_step_bytes = 2 * (uint64_t)(S - 1) * out->p2p_boundary_bytes;
    out->p2p_mb_seconds = (double)out->act_bytes / w->link;
    double *cost = calloc((size_t)E, sizeof *cost);
    uint64_t *mem = calloc((size_t)E, sizeof *mem);
    zo_status st = cost && mem ? ZO_OK : zt_fail(ZO_ERR_NO_MEMORY, "the layers' costs");
    if (st >= 0 && split)
        st = zp_pipe_check_split(split, S, E, out->first);
    else if (st >= 0) {
        zp_pipe_layer_costs(job, cost, mem);
        st = zp_pipe_balance(cost, mem, E, S, out->first);
    }
    free(cost);
    free(mem);
    ZT_TRY(st);
    zp_pipeline_plan *cand = malloc(sizeof *cand);
    out->stage = calloc((size_t)S, sizeof *out->stage);
    zp_stage_plan *other = calloc((size_t)S, sizeof *other);
    if (!cand || !out->stage || !other)
        st = zt_fail(ZO_ERR_NO_MEMORY, "the %d stages' plans", S);
    if (st >= 0) {
        cand->stage = other;
        st = search(&x, out, cand);
        other = cand->stage;
    }
    free(other);
    free(cand);
    if (st < 0)
        zp_pipeline_free(out);
    return st;
}
