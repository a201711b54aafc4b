/* zo-plan --pipeline-stages: tables, the "pipeline" JSON object and the
 * zo-train command of the pipeline plans (pipeline_out.h). */
#include "pipeline_out.h"

#include <stdio.h>
#include <string.h>

#include "zo/units.h"
#include "zt_tiers.h"

static const char *B(char *buf, uint64_t b)
{
    return zo_fmt_bytes_prec(buf, 32, b, 1);
}

static json_t *ju(uint64_t v)
{
    return json_integer((json_int_t)v);
}

/* The homes every stage can run under (the farthest any stage planned) and
 * the device's resident parameters (the fewest any stage planned). */
static void shared_flags(const zp_pipeline_plan *p, zo_tier *param_home, zo_tier *optim_home,
                         uint64_t *param_dev)
{
    *param_home = *optim_home = ZO_TIER_HOST;
    *param_dev = UINT64_MAX;
    for (int s = 0; s < p->stages; s++) {
        const zp_plan *q = &p->stage[s].plan;
        if (q->param_home > *param_home)
            *param_home = q->param_home;
        if (q->optim_home > *optim_home)
            *optim_home = q->optim_home;
        if (q->param_caps.bytes[ZO_TIER_DEVICE] < *param_dev)
            *param_dev = q->param_caps.bytes[ZO_TIER_DEVICE];
    }
}

void zp_pipe_command(const zp_pipeline_plan *p, const zp_job *job, const zp_hardware *hw, char *buf,
                     size_t cap)
{
    zo_tier ph, oh;
    uint64_t pd;
    shared_flags(p, &ph, &oh, &pd);
    /* zo-train's --host-mem is the node's, each local rank taking its share */
    uint64_t node_host = (uint64_t)p->ranks_per_node * zp_trainer_host_mem(hw, &p->stage[0].plan);
    int n =
        snprintf(buf, cap, "mpirun -np %d zo-train --pipeline-stages %d", p->world_size, p->stages);
    for (int s = 1; s < p->stages && n > 0 && (size_t)n < cap; s++)
        n += snprintf(buf + n, cap - (size_t)n, "%s%d", s == 1 ? " --pipeline-split " : ",",
                      p->first[s]);
    if (n > 0 && (size_t)n < cap && p->tensor_parallel > 1)
        n += snprintf(buf + n, cap - (size_t)n, " --tensor-parallel %d%s", p->tensor_parallel,
                      p->sequence_parallel ? " --sequence-parallel" : "");
    if (n > 0 && (size_t)n < cap && p->data_parallel > 1)
        n += snprintf(buf + n, cap - (size_t)n, " --zero-stage 1");
    if (n > 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n,
                      " --micro-batch %d --grad-accum %d --seq %d --offload-param %s "
                      "--offload-optimizer %s --chunk-bytes %llu --optimizer-mode %s "
                      "--state-dtype %s --param-device-bytes %llu --host-mem %llu",
                      job->micro_batch, job->grad_accum, job->seq, zt_home_name(ph),
                      zt_home_name(oh), (unsigned long long)p->chunk_bytes,
                      zo_optim_mode_name(p->mode), zt_state_dtype_name(job->state_dtype),
                      (unsigned long long)pd, (unsigned long long)node_host);
    /* each stage's engine fills its own host with the states homed on NVMe, as its plan does */
    if (n > 0 && (size_t)n < cap && oh == ZO_TIER_NVME)
        n += snprintf(buf + n, cap - (size_t)n, " --placement auto");
    if (n > 0 && (size_t)n < cap && p->stages == 1)
        snprintf(buf + n, cap - (size_t)n, " --micro-group %d --act-home %s",
                 p->stage[0].plan.micro_group, zp_act_home_name(p->stage[0].plan.act_home));
}

static void split_text(const zp_pipeline_plan *p, char *buf, size_t cap)
{
    int n = 0;
    buf[0] = 0;
    for (int s = 0; s < p->stages && n >= 0 && (size_t)n < cap; s++)
        n += snprintf(buf + n, cap - (size_t)n, "%s%d-%d", s ? " " : "", p->first[s],
                      p->first[s + 1] - 1);
}

static void print_candidates(const zp_pipe_report *r)
{
    char a[32], sp[200];
    char b[32];
    printf("%-6s %-6s %-6s %-4s %9s %9s %8s %11s %11s %10s %6s  %s\n", "stages", "tensor", "data",
           "fits", "step s", "mb s", "bubble", "p2p/step", "tp/step", "tokens/s", "MFU",
           "split (engine layers per stage)");
    for (int i = 0; i < r->n; i++) {
        const zp_pipeline_plan *p = &r->plans[i];
        split_text(p, sp, sizeof sp);
        printf("%-6d %-6d %-6d %-4s %9.4g %9.3g %7.1f%% %11s %11s %10.4g %5.1f%%  %s\n", p->stages,
               p->tensor_parallel, p->data_parallel, p->fits ? "yes" : "no", p->step_seconds,
               p->mb_seconds, 100 * p->bubble, B(a, p->p2p_step_bytes), B(b, p->tp.step_bytes),
               p->tokens_per_s, 100 * p->mfu, sp);
        if (!p->fits)
            printf("       %s\n", p->why);
    }
}

/* pb: bytes of a parameter (zp_param_bytes), what the params column counts. */
static void print_stages(const zp_pipeline_plan *p, uint64_t pb)
{
    char a[32], b[32], c[32], d[32], e[32];
    printf("%-5s %-9s %9s %6s %10s %10s %10s %10s %9s %9s %-4s\n", "stage", "layers", "params",
           "flight", "device", "pinned", "host", "nvme", "mb s", "tail s", "fits");
    for (int s = 0; s < p->stages; s++) {
        const zp_stage_plan *st = &p->stage[s];
        const zp_plan *q = &st->plan;
        char layers[24];
        snprintf(layers, sizeof layers, "%d-%d", st->first, st->end - 1);
        printf("%-5d %-9s %9s %6d %10s %10s %10s %10s %9.3g %9.3g %-4s\n", s, layers,
               B(a, q->fp.n_params * pb), st->in_flight, B(b, q->device.total),
               B(c, q->pinned.total), B(d, q->host.total), B(e, q->nvme.files), st->mb_seconds,
               st->tail_seconds, q->fits ? "yes" : "no");
        printf("      %s\n", q->fits ? q->reason : q->why);
    }
}

/* The tensor group's communication of p (tensor.h). */
static void print_tp(const zp_pipeline_plan *p, const zp_job *job)
{
    char a[32], b[32], c[32], d[32];
    const zp_tp_comm *t = &p->tp;
    if (p->sequence_parallel)
        printf("  sequence parallel: the residual stream holds 1/%d of the tokens per rank; each "
               "all-reduce below is a reduce-scatter and an all-gather, which on a ring move the "
               "all-reduce's bytes; the exact chain's reduce-scatter also carries each block to "
               "its owner ((T-1)/T of the vector), and the backward gathers the residual "
               "gradient and the recomputed norm outputs (a block: 2 reduce-scatters and 2 "
               "all-gathers forward, 3 and 5 backward; the norms' gradients reduce-scattered "
               "per micro-batch with the fetches')\n",
               p->tensor_parallel);
    printf("  tensor parallel %d (%s link, %.3g GB/s): per micro-batch of %d x %d tokens each "
           "block's all-reduces of %s move %s in the forward (2) and %s in the backward (3); "
           "the embedding and the head %s; the fetches' gathers %s per step; %s per step per "
           "tensor group (the slowest stage's; summed over its ranks), %.3g s on its busiest "
           "rank's link; with the engine's verdict over the model-parallel group (%s), %s per "
           "step over every group\n",
           p->tensor_parallel, p->tp_intra_node ? "intra-node" : "inter-node", p->tp_link / 1e9,
           job->micro_batch, job->seq, B(a, t->act_elems * zo_dtype_size(job->dtype)),
           B(b, t->block_fwd), B(c, t->block_bwd), B(d, t->embed_head),
           B((char[32]){0}, t->fetch_gather), B((char[32]){0}, t->step_bytes), t->seconds,
           B((char[32]){0}, t->verdict), B((char[32]){0}, p->tp_total_bytes));
}

/* The fastest plan that fits without tensor parallelism (-1: none). */
static int best_without_tp(const zp_pipe_report *r)
{
    int best = -1;
    for (int i = 0; i < r->n; i++)
        if (r->plans[i].fits && r->plans[i].tensor_parallel == 1 &&
            (best < 0 || r->plans[i].tokens_per_s > r->plans[best].tokens_per_s))
            best = i;
    return best;
}

void zp_print_pipeline(const zp_pipe_report *r)
{
    const zp_world *w = r->w;
    char a[32], b[32];
    printf("\npipeline over %d ranks, %d per node, link %.3g GB/s (%s); %d micro-batches per "
           "step (1F1B); stages split by each layer's forward+backward time "
           "(params in bytes of the parameters' dtype; flight: micro-batches whose layer inputs a "
           "stage holds):\n",
           w->world_size, w->gpus_per_node, w->link / 1e9, w->link_source, r->job->grad_accum);
    print_candidates(r);
    if (r->best < 0) {
        printf("recommended pipeline: none fits (see the reasons above)\n");
        if (r->n == 1)
            print_stages(&r->plans[0], zp_param_bytes(r->job));
        return;
    }
    const zp_pipeline_plan *p = &r->plans[r->best];
    printf("\n%d stages x %d tensor-parallel x %d data-parallel rank(s)%s, chunks of %s, %s "
           "mode:\n",
           p->stages, p->tensor_parallel, p->data_parallel,
           p->data_parallel > 1 ? " (ZeRO stage 1 inside each stage's group)" : "",
           B(a, p->chunk_bytes), zo_optim_mode_name(p->mode));
    print_stages(p, zp_param_bytes(r->job));
    printf("  step %.4g s = (%d + %d - 1) x %.4g s (stage %d's micro-batch) + %.4g s after the "
           "backward; bubble %.1f%% = (S-1)/(M+S-1)\n",
           p->step_seconds, p->micro_batches, p->stages, p->mb_seconds, p->slowest, p->tail_seconds,
           100 * p->bubble);
    printf("  p2p: %s per micro-batch per boundary each way (%.3g s over the link); %s per "
           "boundary each way per step, %s per step over the %d boundaries both ways\n",
           B(a, p->act_bytes), p->p2p_mb_seconds, B(b, p->p2p_boundary_bytes),
           B((char[32]){0}, p->p2p_step_bytes), p->stages - 1);
    if (p->tensor_parallel > 1)
        print_tp(p, r->job);
    char cmd[1024];
    zp_pipe_command(p, r->job, r->node, cmd, sizeof cmd);
    printf(
        "recommended pipeline%s: %d stages x %d tensor x %d data, %.4g s per step, %.4g tokens/s, "
        "MFU %.1f%%; %s\n",
        r->auto_stages ? " (auto: the grid that fits with the most tokens/s)" : "", p->stages,
        p->tensor_parallel, p->data_parallel, p->step_seconds, p->tokens_per_s, 100 * p->mfu, cmd);
    int nt = best_without_tp(r);
    if (p->tensor_parallel > 1 && nt >= 0)
        printf("best without tensor parallelism: %d stages x %d data, %.4g tokens/s (%.2fx)\n",
               r->plans[nt].stages, r->plans[nt].data_parallel, r->plans[nt].tokens_per_s,
               p->tokens_per_s / r->plans[nt].tokens_per_s);
    else if (p->tensor_parallel > 1)
        printf("best without tensor parallelism: %s\n",
               r->auto_stages ? "none fits" : "not planned (--tensor-parallel auto compares)");
}

static json_t *json_stage(const zp_stage_plan *st)
{
    const zp_plan *q = &st->plan;
    json_t *o = json_pack("{s:i,s:i,s:i,s:b,s:o}", "first_layer", st->first, "last_layer",
                          st->end - 1, "in_flight", st->in_flight, "fits", q->fits, "why",
                          q->fits ? json_null() : json_string(q->why));
    json_object_set_new(o, "params", ju(q->fp.n_params));
    json_object_set_new(o, "bytes",
                        json_pack("{s:o,s:o,s:o,s:o}", "device", ju(q->device.total), "pinned",
                                  ju(q->pinned.total), "host", ju(q->host.total), "nvme",
                                  ju(q->nvme.files)));
    json_object_set_new(o, "engine_footprint",
                        json_pack("{s:o,s:o,s:o,s:o}", "device", ju(q->fp.bytes[ZO_TIER_DEVICE]),
                                  "pinned", ju(q->fp.pinned), "host", ju(q->fp.bytes[ZO_TIER_HOST]),
                                  "nvme", ju(q->fp.bytes[ZO_TIER_NVME])));
    json_object_set_new(o, "chunks", ju(q->fp.n_chunks));
    json_object_set_new(o, "tied_copy_bytes", ju(st->tied_copy_bytes));
    json_object_set_new(o, "staging_bytes", ju(st->staging_bytes));
    json_object_set_new(o, "placement",
                        json_pack("{s:o,s:o}", "param_device",
                                  ju(q->param_caps.bytes[ZO_TIER_DEVICE]), "optim_host",
                                  ju(q->optim_caps.bytes[ZO_TIER_HOST])));
    json_object_set_new(o, "offload_param", json_string(zt_home_name(q->param_home)));
    json_object_set_new(o, "offload_optimizer", json_string(zt_home_name(q->optim_home)));
    json_object_set_new(o, "send_bytes_per_micro_batch", ju(st->send_bytes));
    json_object_set_new(o, "micro_batch_seconds", json_real(st->mb_seconds));
    json_object_set_new(o, "tail_seconds", json_real(st->tail_seconds));
    json_object_set_new(o, "dp_link_seconds", json_real(st->dp_link_seconds));
    json_object_set_new(o, "own_step_seconds", json_real(q->step_seconds));
    json_object_set_new(o, "bottleneck", json_string(zp_bottleneck_name(q->bottleneck)));
    return o;
}

static json_t *json_one(const zp_pipeline_plan *p, const zp_job *job, const zp_hardware *hw)
{
    json_t *o =
        json_pack("{s:i,s:i,s:i,s:i,s:b,s:o}", "stages", p->stages, "data_parallel",
                  p->data_parallel, "world_size", p->world_size, "micro_batches", p->micro_batches,
                  "fits", p->fits, "why", p->fits ? json_null() : json_string(p->why));
    json_t *split = json_array(), *stages = json_array();
    for (int s = 1; s < p->stages; s++)
        json_array_append_new(split, json_integer(p->first[s]));
    for (int s = 0; s < p->stages; s++)
        json_array_append_new(stages, json_stage(&p->stage[s]));
    json_object_set_new(o, "split", split);
    json_object_set_new(o, "stage_plans", stages);
    json_object_set_new(o, "short_bytes", ju(p->short_bytes));
    json_object_set_new(o, "chunk_bytes", ju(p->chunk_bytes));
    json_object_set_new(o, "optimizer_mode", json_string(zo_optim_mode_name(p->mode)));
    json_object_set_new(o, "slowest_stage", json_integer(p->slowest));
    json_object_set_new(o, "micro_batch_seconds", json_real(p->mb_seconds));
    json_object_set_new(o, "forward_backward_seconds", json_real(p->fb_seconds));
    json_object_set_new(o, "tail_seconds", json_real(p->tail_seconds));
    json_object_set_new(o, "step_seconds", json_real(p->step_seconds));
    json_object_set_new(o, "bubble", json_real(p->bubble));
    json_object_set_new(o, "p2p",
                        json_pack("{s:o,s:o,s:o,s:f}", "micro_batch_bytes", ju(p->act_bytes),
                                  "boundary_bytes_per_step_each_way", ju(p->p2p_boundary_bytes),
                                  "step_bytes", ju(p->p2p_step_bytes), "micro_batch_seconds",
                                  p->p2p_mb_seconds));
    json_object_set_new(o, "tokens_per_s", json_real(p->tokens_per_s));
    json_object_set_new(o, "mfu", json_real(p->mfu));
    json_object_set_new(o, "tensor_parallel", json_integer(p->tensor_parallel));
    json_object_set_new(o, "sequence_parallel", json_boolean(p->sequence_parallel));
    json_object_set_new(
        o, "tp",
        json_pack("{s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:f,s:f,s:f,s:b}", "all_reduce_elements",
                  ju(p->tp.act_elems), "block_forward_bytes", ju(p->tp.block_fwd),
                  "block_backward_bytes", ju(p->tp.block_bwd), "embedding_head_bytes",
                  ju(p->tp.embed_head), "fetch_gather_bytes", ju(p->tp.fetch_gather), "step_bytes",
                  ju(p->tp.step_bytes), "verdict_bytes", ju(p->tp.verdict), "all_groups_step_bytes",
                  ju(p->tp_total_bytes), "busiest_rank_bytes", p->tp.rank_bytes, "seconds",
                  p->tp.seconds, "link_bytes_per_s", p->tp_link, "intra_node", p->tp_intra_node));
    char cmd[1024];
    zp_pipe_command(p, job, hw, cmd, sizeof cmd);
    json_object_set_new(o, "command", json_string(cmd));
    return o;
}

json_t *zp_json_pipeline(const zp_pipe_report *r)
{
    json_t *plans = json_array();
    for (int i = 0; i < r->n; i++)
        json_array_append_new(plans, json_one(&r->plans[i], r->job, r->node));
    json_t *o = json_pack("{s:i,s:i,s:f,s:s,s:b}", "world_size", r->w->world_size, "gpus_per_node",
                          r->w->gpus_per_node, "link_bytes_per_s", r->w->link, "link_source",
                          r->w->link_source, "auto", r->auto_stages);
    json_object_set_new(o, "plans", plans);
    if (r->best >= 0) {
        const zp_pipeline_plan *p = &r->plans[r->best];
        char cmd[1024];
        zp_pipe_command(p, r->job, r->node, cmd, sizeof cmd);
        json_object_set_new(o, "recommended",
                            json_pack("{s:i,s:i,s:i,s:f,s:s}", "stages", p->stages,
                                      "tensor_parallel", p->tensor_parallel, "data_parallel",
                                      p->data_parallel, "tokens_per_s", p->tokens_per_s, "command",
                                      cmd));
    } else {
        json_object_set_new(o, "recommended", json_null());
    }
    int nt = best_without_tp(r);
    json_object_set_new(o, "best_without_tp",
                        nt < 0 ? json_null()
                               : json_pack("{s:i,s:i,s:f}", "stages", r->plans[nt].stages,
                                           "data_parallel", r->plans[nt].data_parallel,
                                           "tokens_per_s", r->plans[nt].tokens_per_s));
    return o;
}
