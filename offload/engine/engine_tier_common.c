/* What the tiers share: the home of a chunk in a plan, the count of chunks
 * homed at a tier, Adam's arguments over a chunk's states, host and pinned
 * allocations, timed NVMe waits. Below every tier file; calls only
 * engine_io.c. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_tier.h"
#include "zo/half.h"

/* The byte ranges of n elements' states at stride S, in address order:
 * master, then each moment (an I8 moment in two: codes and block scales). */
typedef struct state_span {
    size_t off, len;
} state_span;

static int moment_spans(zo_dtype fmt, size_t base, size_t n, size_t S, state_span *out)
{
    const zo_state_format *f = zo_state_format_of(fmt);
    out[0] = (state_span){base, zo_state_format_code_bytes(f, n)};
    if (!f->block)
        return 1;
    out[1] = (state_span){base + zo_round_up(zo_state_format_code_bytes(f, S), 4),
                          4 * ((n + f->block - 1) / f->block)};
    return 2;
}

static int state_spans(zo_dtype fmt, size_t n, size_t S, state_span *out)
{
    int k = 0;
    out[k++] = (state_span){0, 4 * n};
    k += moment_spans(fmt, 4 * S, n, S, out + k);
    k += moment_spans(fmt, 4 * S + eng_moment_bytes(fmt, S), n, S, out + k);
    return k;
}

void eng_states_restride(zo_dtype fmt, float *buf, size_t n, size_t from, size_t to)
{
    if (from == to)
        return;
    state_span src[5], dst[5];
    int ns = state_spans(fmt, n, from, src);
    state_spans(fmt, n, to, dst);
    char *b = (char *)buf;
    /* growing, the last span first: each moves up past what is still to move;
     * shrinking, the first first */
    for (int i = 0; i < ns; i++) {
        int j = to > from ? ns - 1 - i : i;
        memmove(b + dst[j].off, b + src[j].off, src[j].len);
    }
    size_t end = 0; /* the gaps hold nothing */
    for (int i = 0; i < ns; i++) {
        memset(b + end, 0, dst[i].off - end);
        end = dst[i].off + dst[i].len;
    }
    memset(b + end, 0, eng_states_io_bytes(fmt, to) - end);
}

zo_tier eng_p16_home(const eng_plan_in *in, uint32_t c)
{
    return in->p16_home ? (zo_tier)in->p16_home[c] : in->cfg->param_home;
}

zo_tier eng_states_home(const eng_plan_in *in, uint32_t c)
{
    return in->states_home ? (zo_tier)in->states_home[c] : in->cfg->optim_home;
}

uint32_t eng_count_homed(const eng_plan_in *in, int kind, zo_tier t)
{
    uint32_t n = 0;
    for (uint32_t c = 0; c < in->n_chunks; c++)
        n += (kind ? eng_states_home(in, c) : eng_p16_home(in, c)) == t;
    return n;
}

/* None without host copies; two (current and next) when the update writes
 * them behind the fetches (the states' tier or the mode says), else one.
 * A split master on NVMe is rebuilt from the committed copy, which an
 * update in place would overwrite before its commit: two then. */
int eng_p16_bufs(const eng_plan_in *in, uint32_t c)
{
    if (eng_p16_home(in, c) == ENG_HOME_REMOTE) /* ZeRO stage 3: gathered at each use */
        return 0;
    if (!in->host_copies[eng_p16_home(in, c)] || eng_p16_nvme_backed(in, c))
        return 0;
    /* device-resident: no fetch reads the copy, which reloads the slot only
     * after an update (eng_publish), so the update writes it in place */
    if (eng_p16_home(in, c) == ZO_TIER_DEVICE && !in->mode_p16_behind &&
        !(in->cfg->master_split && eng_states_home(in, c) == ZO_TIER_NVME))
        return 1;
    if (eng_states_home(in, c) == ENG_HOME_REMOTE) /* written by the owner's broadcast */
        return in->mode_p16_behind ? 2 : 1;
    return in->p16_behind[eng_states_home(in, c)] || in->mode_p16_behind ? 2 : 1;
}

/* Not with ZeRO (the owners' broadcast lands in the host copies) nor with
 * a split master (rebuilt from the committed host copy). */
int eng_p16_nvme_backed(const eng_plan_in *in, uint32_t c)
{
    return eng_p16_home(in, c) == ZO_TIER_DEVICE && eng_states_home(in, c) == ZO_TIER_NVME &&
           in->cfg->world_size <= 1 && !in->cfg->master_split;
}

void eng_adam_args(struct zo_engine *e, eng_chunk *k, float *st, const eng_update_args *u,
                   zo_adam_params *p, zo_adam_buffers *b)
{
    *p = e->cfg.adam;
    p->struct_size = sizeof *p;
    p->lr = u->lr;
    p->step = u->step;
    p->grad_scale = u->factor;
    zo_adam_buffers init = ZO_ADAM_BUFFERS_INIT;
    *b = init;
    b->n = k->n_elems;
    if (k->zgrad[u->parity]) { /* ZeRO: reduced over the ranks */
        b->grad = k->zgrad[u->parity];
        b->grad_type = ZO_DTYPE_F32;
    } else if (e->cfg.grad_accum_steps > 1) {
        b->grad = k->acc[u->parity];
        b->grad_type = ZO_DTYPE_F32;
    } else {
        b->grad = k->g16[u->parity];
        b->grad_type = e->cfg.param_dtype;
    }
    const size_t stride = eng_state_stride(e, k); /* packed in an NVMe stage */
    const zo_dtype fmt = e->cfg.state_dtype;
    b->master = st;
    b->m = eng_state_m(fmt, st, stride);
    b->v = eng_state_v(fmt, st, stride);
    b->state_type = fmt;
    const zo_state_format *f = zo_state_format_of(fmt);
    b->m_absmax = zo_state_format_scales(f, b->m, stride); /* NULL without scales */
    b->v_absmax = zo_state_format_scales(f, b->v, stride);
    b->out = k->pt->update_out(k->pctx, e, (uint32_t)(k - e->chunks),
                               (char *)st + eng_states_io_bytes(fmt, stride));
    b->out_type = e->cfg.param_dtype;
}

/* Elements [a, a + n) of the chunk's update in all, with fp32 moments in
 * the I8 code bytes (f32) or as all's. Ranges start on an I8 block. */
static zo_adam_buffers adam_range(const zo_adam_buffers *all, size_t a, size_t n, int f32)
{
    zo_adam_buffers b = *all;
    b.n = n;
    b.grad = (const char *)all->grad + a * zo_dtype_size(all->grad_type);
    b.master = all->master + a;
    if (all->out)
        b.out = (char *)all->out + a * zo_dtype_size(all->out_type);
    const zo_state_format *f = zo_state_format_of(all->state_type);
    b.m = (char *)all->m + zo_state_format_code_bytes(f, a);
    b.v = (char *)all->v + zo_state_format_code_bytes(f, a);
    if (f32) {
        b.state_type = ZO_DTYPE_F32;
        b.m_absmax = b.v_absmax = NULL;
    } else if (all->m_absmax) { /* a block-scaled format: ranges start on a block */
        b.m_absmax = all->m_absmax + a / f->block;
        b.v_absmax = all->v_absmax + a / f->block;
    }
    return b;
}

/* A parameter group's settings over the config's. The rate is the step's
 * times the group's scale, in double and rounded once: a constant rate is
 * then the group's own float (lr * (g / lr) is g to within 2^-52). */
static void eng_apply_own(zo_adam_params *p, const eng_hyper *h)
{
    if (h->set & ENG_OWN_DECAY)
        p->weight_decay = h->decay;
    if (h->set & ENG_OWN_ADAM) {
        p->lr = (float)((double)p->lr * h->lr_scale);
        p->beta1 = h->beta1;
        p->beta2 = h->beta2;
        p->eps = h->eps;
    }
}

uint32_t eng_adam_jobs(const eng_chunk *k)
{
    return 2 * k->n_small + 1;
}

/* The room after a tensor updated apart with fp32 moments under I8 states
 * (its padding), in elements: left alone by the update, its 16-bit copy
 * zeroed by eng_adam_zero_padding, as the kernel would write the zero master. */
static size_t apart_room(const eng_apart *sp, zo_dtype state_type)
{
    return sp->f32 ? zo_state_format_f32_room(zo_state_format_of(state_type), sp->numel)
                   : sp->numel;
}

static zo_status run_range(const zo_adam_params *p, const zo_adam_buffers *all, size_t a, size_t n,
                           int f32, eng_adam_fn fn, void *ctx)
{
    if (!n)
        return ZO_OK;
    zo_adam_buffers b = adam_range(all, a, n, f32);
    return fn(ctx, p, &b);
}

/* In element order: the run before each tensor updated apart, the tensor
 * (with its own settings; with fp32 moments under I8 states its room's
 * padding left alone), the run after the last. Elementwise and blockwise
 * (tensors start on an I8 block), so the same bits as one pass would give
 * whatever the split. */
zo_status eng_adam_ranges(struct zo_engine *e, const eng_chunk *k, const zo_adam_params *p,
                          const zo_adam_buffers *all, eng_adam_fn fn, void *ctx)
{
    size_t at = 0;
    for (uint32_t i = 0; i < k->n_small; i++) {
        const eng_apart *sp = &e->small[k->small_first + i];
        zo_adam_params own = *p;
        eng_apply_own(&own, &sp->own);
        ZO_TRY(run_range(p, all, at, sp->off - at, 0, fn, ctx));
        ZO_TRY(run_range(&own, all, sp->off, sp->numel, sp->f32, fn, ctx));
        at = sp->off + apart_room(sp, all->state_type);
    }
    return run_range(p, all, at, k->n_elems - at, 0, fn, ctx);
}

void eng_adam_zero_padding(struct zo_engine *e, const eng_chunk *k, const zo_adam_buffers *all)
{
    if (!all->out)
        return;
    const size_t es = zo_dtype_size(all->out_type);
    for (uint32_t i = 0; i < k->n_small; i++) {
        const eng_apart *sp = &e->small[k->small_first + i];
        size_t room = apart_room(sp, all->state_type);
        if (room > sp->numel)
            memset((char *)all->out + (sp->off + sp->numel) * es, 0, (room - sp->numel) * es);
    }
}

/* The optimizer pool's jobs, one per range. */
typedef struct pool_ranges {
    zo_optim_pool_t pool;
    zo_optim_job_t *jobs;
    uint32_t *queued;
} pool_ranges;

static zo_status enqueue_range(void *ctx, const zo_adam_params *p, const zo_adam_buffers *b)
{
    pool_ranges *r = ctx;
    ZO_TRY(zo_optim_pool_adam_enqueue(r->pool, p, b, &r->jobs[*r->queued]));
    (*r->queued)++;
    return ZO_OK;
}

zo_status eng_adam_enqueue(struct zo_engine *e, eng_chunk *k, float *st, const eng_update_args *u,
                           zo_optim_job_t *jobs, uint32_t *queued)
{
    zo_adam_params p;
    zo_adam_buffers all;
    eng_adam_args(e, k, st, u, &p, &all);
    *queued = 0;
    pool_ranges r = {e->opool, jobs, queued};
    eng_adam_zero_padding(e, k, &all);
    return eng_adam_ranges(e, k, &p, &all, enqueue_range, &r);
}

zo_status eng_adam_wait(zo_optim_job_t *jobs, uint32_t n, zo_status st)
{
    for (uint32_t i = 0; i < n; i++) {
        zo_status w = zo_optim_job_wait(jobs[i], NULL);
        if (st == ZO_OK && w < 0)
            st = w;
    }
    return st;
}

zo_status eng_adam_run(struct zo_engine *e, eng_chunk *k, float *states, const eng_update_args *u)
{
    zo_optim_job_t one, *jobs = k->n_small ? calloc(eng_adam_jobs(k), sizeof *jobs) : &one;
    if (!jobs)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "allocating %u job handles", eng_adam_jobs(k));
    uint32_t n = 0;
    /* Two statements: as arguments of one call, n could be read before the
     * enqueue set it (the order is unspecified; GCC for aarch64 reads it
     * first, and the wait returned while the jobs still ran). */
    zo_status st = eng_adam_enqueue(e, k, states, u, jobs, &n);
    st = eng_adam_wait(jobs, n, st);
    if (jobs != &one)
        free(jobs);
    return st;
}

zo_status eng_timed_swap_wait(struct zo_engine *e, zo_swap_io_t io)
{
    uint64_t t0 = zo_now_ns();
    zo_status st = zo_swap_wait(io);
    atomic_fetch_add(&e->stats.nvme_ns, zo_now_ns() - t0);
    return st;
}

zo_status eng_host_alloc(struct zo_engine *e, uint64_t bytes, float **out)
{
    *out = NULL;
    if (!bytes)
        return ZO_OK;
    /* Optimizer states, backups and accumulators are streamed whole by the
     * CPU Adam: on 2 MiB pages where the system allows (THP madvise). Zero
     * from fresh pages: every caller relies on it (Adam's m and v start at
     * zero, as do the accumulators and the split bits), and a memset here
     * was most of a short run's set-up, touching every page twice. */
    void *p = zo_huge_zalloc(bytes);
    if (!p)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, ENG_SUBSYS, "allocating %" PRIu64 " bytes of host memory",
                       bytes);
    e->host.bytes += bytes;
    if (e->host.bytes > e->host.high)
        e->host.high = e->host.bytes;
    *out = p;
    return ZO_OK;
}

void eng_host_free(void *p)
{
    zo_huge_free(p);
}

zo_status eng_take_pinned(struct zo_engine *e, size_t slot_bytes, size_t n, void **out)
{
    if (!n)
        return ZO_OK;
    int set;
    ZO_TRY(zo_hostpool_add_slots(e->host.pool, slot_bytes, n, &set));
    for (size_t i = 0; i < n; i++)
        ZO_TRY(zo_hostpool_slot_alloc(e->host.pool, set, &out[i]));
    return ZO_OK;
}

uint32_t eng_chunks_at(const struct zo_engine *e, int kind, const void *table)
{
    uint32_t n = 0;
    for (uint32_t c = 0; c < e->n_chunks; c++)
        n += (kind ? (const void *)e->chunks[c].st : (const void *)e->chunks[c].pt) == table;
    return n;
}

void eng_store_opened(struct zo_engine *e, zo_swap_t store, uint64_t extent_bytes)
{
    if (e->stats.n_stores < (int)(sizeof e->stats.stores / sizeof e->stats.stores[0]))
        e->stats.stores[e->stats.n_stores++] =
            (struct eng_store){store, extent_bytes, ZO_SWAP_STATS_INIT, ZO_SWAP_STATS_INIT};
}

zo_status eng_open_store(struct zo_engine *e, uint64_t extent, uint64_t n_extents,
                         const char *suffix, zo_swap_t *out)
{
    zo_swap_config sc = ZO_SWAP_CONFIG_INIT;
    char name[128];
    snprintf(name, sizeof name, "%s%s", e->cfg.nvme_name, suffix);
    sc.paths = e->cfg.nvme_paths;
    sc.npaths = e->cfg.n_nvme_paths;
    sc.capacity = n_extents * extent;
    sc.extent_bytes = extent;
    sc.engine = e->cfg.nvme_engine;
    sc.name = name;
    sc.faults = e->own.faults;
    sc.nfaults = e->own.n_faults;
    /* A file left by a run that was killed (its lock free, its header ours)
     * is taken over: it must not block every later run on the directory. */
    sc.reuse = ZO_SWAP_REUSE;
    if (e->cfg.nvme_queue_depth)
        sc.queue_depth = e->cfg.nvme_queue_depth;
    if (e->cfg.nvme_block_size)
        sc.block_size = e->cfg.nvme_block_size;
    return zo_swap_open(&sc, out);
}
