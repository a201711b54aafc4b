/* zo-plan's tensor parallelism (tensor.h): a rank's shares and the tensor
 * group's communication per step. */
#include "tensor.h"

#include <string.h>

#include "plan_internal.h"
#include "tp_shape.h"

int zp_tp(const zp_job *job)
{
    return job->tensor_parallel > 1 ? job->tensor_parallel : 1;
}

uint64_t zp_default_chunk_bytes(const zp_job *job)
{
    return zt_tp_default_chunk_bytes(&job->shape, zp_tp(job));
}

uint64_t zp_tp_device_bytes(const zp_job *job)
{
    if (zp_tp(job) == 1)
        return 0;
    zt_model_config mc = zp_model_config(job);
    return zt_tp_device_bytes(&job->shape, zp_tp(job), job->dtype, zt_head_chunk_rows(&mc));
}

/* Bytes a collective sends, summed over its group and at its busiest rank. */
typedef struct sent {
    double group, rank;
} sent;

static void add(sent *s, double group, double rank, double times)
{
    s->group += group * times;
    s->rank += rank * times;
}

/* An exact all-reduce of bytes b over T ranks: a chain and a ring back. */
static void all_reduce(sent *s, int T, double b, double times)
{
    add(s, 2.0 * (T - 1) * b, 2.0 * b, times);
}

/* An all-gather of b bytes a rank over G ranks. */
static void all_gather(sent *s, int G, double b, double times)
{
    add(s, (double)G * (G - 1) * b, (G - 1) * b, times);
}

/* An exact reduce-scatter of b bytes over G ranks: a chain, then the blocks
 * from the last rank to their owners. */
static void reduce_scatter(sent *s, int G, double b, double times)
{
    add(s, (G - 1) * b + (G - 1) * b / G, b, times);
}

/* Sequence parallel: a replicated tensor whose gradient is each rank's
 * rows' share (a norm; not o_proj's bias), summed over the group per
 * micro-batch (tensor_parallel.c). */
static int rows_share(const zp_job *job, int l, int k)
{
    const int block = l >= 1 && l <= job->shape.n_layers;
    return job->sequence_parallel && zt_tp_replicated(&job->shape, l, k) && !(block && k == ZT_BO);
}

/* The gathers of a fetch of layer l, and (backward) the shared key/value
 * heads' gradients of each micro-batch under it (sequence parallel: the
 * norms' too). */
static void fetch(sent *s, const zp_job *job, int l, int backward, double fetches, double micro)
{
    const zt_shape *sh = &job->shape;
    const int T = zp_tp(job), R = zt_tp_kv_sharers(sh, T);
    const double e = (double)zo_dtype_size(job->dtype);
    for (int k = 0; k < zt_layer_tensors(sh, l); k++) {
        double part = (double)zt_tp_numel(sh, T, l, k) * e;
        if (backward && rows_share(job, l, k))
            reduce_scatter(s, T, part * T, micro);
        if (zt_tp_replicated(sh, l, k))
            all_gather(s, T, part, fetches);
        else if (zt_tp_kv_shared(sh, T, l, k)) {
            sent one = {0, 0}; /* one head's R ranks; T / R such groups */
            all_gather(&one, R, part, fetches);
            if (backward)
                reduce_scatter(&one, R, part * R, micro);
            add(s, one.group * (T / R), one.rank, 1.0);
        }
    }
}

void zp_tp_comm_of(const zp_job *job, int micro_group, double link, zp_tp_comm *out)
{
    memset(out, 0, sizeof *out);
    const int T = zp_tp(job);
    if (T == 1)
        return;
    const zt_shape *sh = &job->shape;
    const int L = sh->n_layers, E = zt_engine_layers(sh);
    int a, b;
    zp_job_layers(job, &a, &b);
    const double M = job->grad_accum, e = (double)zo_dtype_size(job->dtype);
    const int G = micro_group > 1 ? micro_group : 1;
    const double groups = (double)((job->grad_accum + G - 1) / G);
    const uint64_t n = (uint64_t)job->micro_batch * job->seq * sh->dim;
    const double act = (double)n * e;
    const int head = b == E; /* the last stage computes the head (a tied one under layer 0) */
    out->act_elems = n;
    sent blk_f = {0, 0}, blk_b = {0, 0}, eh = {0, 0}, fe = {0, 0};
    /* the cross-entropy's stats of every row, a rank's */
    const double xent = (double)job->micro_batch * job->seq * ZO_XENT_STATS * 4.0;
    if (job->sequence_parallel) { /* model.c's sp_gather and sp_scatter */
        /* forward: the two norms' outputs gathered, o_proj's and down_proj's sums scattered */
        all_gather(&blk_f, T, act / T, 2);
        reduce_scatter(&blk_f, T, act, 2);
        /* backward: the recompute (the attention norm gathered, o_proj's sum), dy and the
         * recomputed norm output gathered for each half, d(h2) and d(h1) scattered */
        all_gather(&blk_b, T, act / T, 5);
        reduce_scatter(&blk_b, T, act, 3);
        if (a == 0) { /* the lookup's sum scattered; its backward gathers the gradient */
            reduce_scatter(&eh, T, act, 1);
            all_gather(&eh, T, act / T, 1);
        }
        if (head) { /* hf gathered, the stats, d(hf) scattered */
            all_gather(&eh, T, act / T, 1);
            all_gather(&eh, T, xent, 1);
            reduce_scatter(&eh, T, act, 1);
        }
    } else {
        all_reduce(&blk_f, T, act, 2);
        all_reduce(&blk_b, T, act, 3);
        if (a == 0)
            all_reduce(&eh, T, act, 1);
        if (head) {
            all_gather(&eh, T, xent, 1);
            all_reduce(&eh, T, act, 1);
        }
    }
    int blocks = 0;
    for (int l = a; l < b; l++) {
        blocks += l >= 1 && l <= L;
        /* forward fetches: all but an untied head's (its forward runs under its backward's) */
        if (!(l == L + 1 && !sh->tied))
            fetch(&fe, job, l, 0, groups, M);
        fetch(&fe, job, l, 1, groups, M);
    }
    if (head && sh->tied) /* the head's own forward fetch of layer 0 */
        fetch(&fe, job, 0, 0, groups, M);
    out->block_fwd = (uint64_t)blk_f.group;
    out->block_bwd = (uint64_t)blk_b.group;
    out->embed_head = (uint64_t)eh.group;
    out->fetch_gather = (uint64_t)fe.group;
    out->step_bytes = (uint64_t)(M * (blocks * (blk_f.group + blk_b.group) + eh.group) + fe.group);
    out->rank_bytes = M * (blocks * (blk_f.rank + blk_b.rank) + eh.rank) + fe.rank;
    out->seconds = link > 0 ? out->rank_bytes / link : 0;
}

void zp_tp_add_time(const zp_job *job, const zp_speeds *sp, double nvme_tbw, zp_plan *p)
{
    zp_tp_comm c;
    zp_tp_comm_of(job, p->micro_group, job->tp_link, &c);
    p->tp_bytes = c.step_bytes;
    p->tp_seconds = c.seconds;
    if (!c.seconds)
        return;
    /* the model waits for each sum: on the critical path of the forward and backward */
    p->fb_seconds += c.seconds;
    p->step_seconds += c.seconds;
    zp_finish_time(p, sp, nvme_tbw);
}
