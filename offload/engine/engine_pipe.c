/* Pipeline stages (zo_engine_config.pipe_comm): each stage's engine holds
 * the contiguous layers of its stage, so its chunks are a contiguous run of
 * the chunks one engine over every layer would have (a chunk never spans
 * two layers). The step's verdict takes every stage's per-chunk norm
 * partials and overflow flags, all-gathered, and sums them in stage order
 * and chunk order within a stage: the fp64 sum one engine forms, bitwise, on
 * every stage. */
#include <stdlib.h>

#include "engine_internal.h"

/* The chunks of every stage, once: the partials travel as blocks of the
 * largest stage's count. */
static zo_status gather_counts(struct zo_engine *e)
{
    size_t S = (size_t)zo_comm_size(e->pipe.comm);
    uint64_t mine = e->n_chunks;
    e->pipe.counts = calloc(S, sizeof *e->pipe.counts);
    if (!e->pipe.counts)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "pipeline chunk counts");
    ZO_TRY(
        zo_comm_all_gather(e->pipe.comm, e->pipe.stream, &mine, e->pipe.counts, 1, ZO_DTYPE_U64));
    ZO_TRY(zo_stream_synchronize(e->pipe.stream));
    e->pipe.max = 0;
    for (size_t s = 0; s < S; s++)
        e->pipe.max = e->pipe.counts[s] > e->pipe.max ? e->pipe.counts[s] : e->pipe.max;
    return ZO_OK;
}

zo_status eng_pipe_place(struct zo_engine *e)
{
    if (!eng_pipe_on(&e->cfg))
        return ZO_OK;
    /* the engine's own split: its collectives never meet the caller's sends */
    ZO_TRY(zo_comm_split(e->cfg.pipe_comm, 0, zo_comm_rank(e->cfg.pipe_comm), &e->pipe.comm));
    ZO_TRY(zo_stream_create(e->dev, &e->pipe.stream));
    return gather_counts(e);
}

void eng_pipe_release(struct zo_engine *e)
{
    if (e->pipe.stream)
        zo_stream_synchronize(e->pipe.stream);
    zo_stream_destroy(e->pipe.stream);
    zo_comm_free(e->pipe.comm);
    free(e->pipe.counts);
    e->pipe.stream = NULL;
    e->pipe.comm = NULL;
    e->pipe.counts = NULL;
}

static void add_stage(eng_verdict *v, const double *p, uint64_t n)
{
    for (uint64_t c = 0; c < n; c++) {
        v->sum_sq += p[2 * c]; /* global chunk order: one engine's sum */
        v->overflow |= p[2 * c + 1] != 0.0;
    }
}

zo_status eng_pipe_judge(struct zo_engine *e, eng_verdict *v)
{
    size_t S = (size_t)zo_comm_size(e->pipe.comm), n = (size_t)e->pipe.max * 2;
    double *mine = calloc(n ? n : 1, sizeof *mine), *all = calloc(n * S + 1, sizeof *all);
    zo_status st = mine && all ? ZO_OK : ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "stage partials");
    for (uint32_t c = 0; st == ZO_OK && c < e->n_chunks; c++) {
        mine[2 * c] = e->chunks[c].gstats.sum_sq;
        mine[2 * c + 1] = e->chunks[c].gstats.nonfinite;
    }
    if (st == ZO_OK && n)
        st = zo_comm_all_gather(e->pipe.comm, e->pipe.stream, mine, all, n, ZO_DTYPE_F64);
    if (st == ZO_OK)
        st = zo_stream_synchronize(e->pipe.stream);
    for (size_t s = 0; st == ZO_OK && s < S; s++)
        add_stage(v, all + s * n, e->pipe.counts[s]);
    free(mine);
    free(all);
    return st;
}

const eng_reducer_ops eng_reducer_pipe = {
    .name = "pipeline",
    .version = ENG_REDUCER_OPS_VERSION,
    .place = eng_pipe_place,
    .release = eng_pipe_release,
    .judge = eng_pipe_judge,
};
