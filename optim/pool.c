/* The optimizer's worker pool. Jobs queue in FIFO order and run one after
 * another. A job is cut into tiles (tile_elems elements); each worker starts
 * on its own contiguous span of the job's tiles and takes them front to back,
 * so its memory streams run on unbroken and the hardware prefetchers keep up;
 * a worker whose span is empty takes the back half of the largest span left.
 * Results never depend on the thread count, tile size or timing: an
 * element's update depends only on its own data, and gradient sums are taken
 * per ZO_NORM_BLOCK elements and combined in element order. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "optim_internal.h"
#include "zo_internal.h"

#define ZO_OPTIM_TILE_DEFAULT 16384

typedef enum job_kind { JOB_ADAM, JOB_GRAD_STATS, JOB_ROOFLINE } job_kind;

struct zo_optim_job {
    /* Completion, under the job's own lock so a waiter never touches the pool. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    zo_grad_stats stats;
    /* The work, immutable once queued. */
    job_kind kind;
    const zo_optim_kernels *k;
    zo_adam_consts c;
    zo_adam_buffers b; /* grad stats use b.grad, b.grad_type, b.n */
    size_t tile, ntiles;
    double *partials; /* sums of squares per ZO_NORM_BLOCK elements */
    /* Progress, under the pool's lock. */
    size_t tiles_done;
    uint64_t seq; /* its number in enqueue order */
    struct zo_optim_job *next;
};

struct zo_optim_pool;

typedef struct pool_worker {
    struct zo_optim_pool *pool;
    int index;
} pool_worker;

/* The tiles [lo, hi) of the head job a worker has yet to take. */
typedef struct tile_span {
    size_t lo, hi;
} tile_span;

struct zo_optim_pool {
    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    struct zo_optim_job *head, *tail;
    tile_span *spans; /* per worker, for the head job; under mu */
    int stop;
    int nthreads;
    size_t tile;
    uint64_t next_seq;
    pthread_t *threads;
    pool_worker *workers;
    zo_optim_trace_fn trace;
    void *trace_ctx;
};

static const char *job_name(job_kind k)
{
    return k == JOB_ADAM ? "adam" : k == JOB_GRAD_STATS ? "grad stats" : "roofline";
}

/* A worker's span of the job it works on, when the pool is traced. */
static void span_tile(struct zo_optim_pool *pool, zo_optim_trace_span *span, int *open,
                      const struct zo_optim_job *j, size_t elems, uint64_t t0)
{
    if (*open && span->seq != j->seq)
        pool->trace(pool->trace_ctx, span);
    if (!*open || span->seq != j->seq) {
        span->job = job_name(j->kind);
        span->seq = j->seq;
        span->t0_ns = t0;
        span->elems = 0;
        *open = 1;
    }
    span->t1_ns = zo_now_ns();
    span->elems += elems;
}

/* Sums of squares of the blocks of [begin, end), which starts on a block. */
static void sum_sq_blocks(struct zo_optim_job *j, size_t begin, size_t end)
{
    for (size_t b = begin; b < end; b += ZO_NORM_BLOCK) {
        size_t e = b + ZO_NORM_BLOCK < end ? b + ZO_NORM_BLOCK : end;
        j->partials[b / ZO_NORM_BLOCK] = j->k->sum_sq(j->b.grad, j->b.grad_type, b, e);
    }
}

static size_t tile_elems_of(const struct zo_optim_job *j, size_t t)
{
    size_t begin = t * j->tile;
    return begin + j->tile < j->b.n ? j->tile : j->b.n - begin;
}

static void run_tile(struct zo_optim_job *j, size_t t)
{
    size_t begin = t * j->tile, end = begin + tile_elems_of(j, t);
    switch (j->kind) {
    case JOB_ADAM: zo_adam_run(j->k, &j->c, &j->b, begin, end); break;
    case JOB_ROOFLINE: j->k->roofline(&j->b, begin, end); break;
    case JOB_GRAD_STATS: sum_sq_blocks(j, begin, end); break;
    }
}

static void job_complete(struct zo_optim_job *j)
{
    if (j->kind == JOB_GRAD_STATS) {
        double s = 0.0;
        for (size_t t = 0; t < (j->b.n + ZO_NORM_BLOCK - 1) / ZO_NORM_BLOCK; t++)
            s += j->partials[t];
        j->stats.sum_sq = s;
        j->stats.nonfinite = !isfinite(s);
    }
    pthread_mutex_lock(&j->mu);
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu); /* the waiter may free j from here on */
}

/* The head job's tiles split into one contiguous span per worker, in
 * worker order. Under the pool's lock. */
static void split_head(struct zo_optim_pool *pool)
{
    const struct zo_optim_job *j = pool->head;
    if (!j)
        return;
    size_t n = (size_t)pool->nthreads;
    for (size_t i = 0; i < n; i++)
        pool->spans[i] = (tile_span){j->ntiles * i / n, j->ntiles * (i + 1) / n};
}

/* A worker takes at most this many elements of its span at a time: few
 * enough locks per job, and the rest of its span stays free to steal. */
#define RUN_MAX_ELEMS ((size_t)1 << 20)

/* The next tiles [*t, *t + *count) for worker w: from the front of its own
 * span a quarter of what is left (at least one tile, at most RUN_MAX_ELEMS),
 * so runs shrink toward the end and the last ones balance; with its own
 * span empty, first the back half of the largest span left, which becomes
 * its own so it too runs front to back. Returns 0 when every tile has been
 * taken. Under the pool's lock. */
static int take_tiles(struct zo_optim_pool *pool, const struct zo_optim_job *j, int w, size_t *t,
                      size_t *count)
{
    tile_span *own = &pool->spans[w];
    if (own->lo == own->hi) {
        int victim = -1;
        size_t most = 0;
        for (int i = 0; i < pool->nthreads; i++) {
            size_t left = pool->spans[i].hi - pool->spans[i].lo;
            if (left > most)
                most = left, victim = i;
        }
        if (victim < 0)
            return 0;
        tile_span *v = &pool->spans[victim];
        size_t mid = v->hi - (most + 1) / 2; /* a last single tile goes too */
        *own = (tile_span){mid, v->hi};
        v->hi = mid;
    }
    size_t left = own->hi - own->lo, most = RUN_MAX_ELEMS / j->tile;
    size_t n = left / 4 < most ? left / 4 : most;
    *t = own->lo;
    *count = n ? n : 1;
    own->lo += *count;
    return 1;
}

/* Counts count tiles of j as done; the worker that finishes a job moves the
 * queue on and wakes everyone for the next. Under the pool's lock. */
static void finish_tiles(struct zo_optim_pool *pool, struct zo_optim_job *j, size_t count)
{
    j->tiles_done += count;
    if (j->tiles_done < j->ntiles)
        return;
    pool->head = j->next;
    if (!pool->head)
        pool->tail = NULL;
    split_head(pool);
    /* Waiters: the next job may start, or a stopping pool's workers may now
     * exit. */
    pthread_cond_broadcast(&pool->work_cv);
    job_complete(j);
}

/* A job's tiles are handed out only once the job before it has finished,
 * so a job may depend on the previous one (steps on the same buffers, a
 * norm before the update that uses it). The idle tail this costs is at most
 * a few tiles per worker per job. */
static void *worker_main(void *arg)
{
    pool_worker *w = arg;
    struct zo_optim_pool *pool = w->pool;
    zo_optim_trace_span span = {.worker = w->index};
    int open = 0;
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        struct zo_optim_job *j = pool->head;
        size_t t, count, elems = 0;
        if (j && take_tiles(pool, j, w->index, &t, &count)) {
            pthread_mutex_unlock(&pool->mu);
            uint64_t t0 = pool->trace ? zo_now_ns() : 0;
            for (size_t i = t; i < t + count; i++) {
                run_tile(j, i);
                elems += tile_elems_of(j, i);
            }
            if (pool->trace) /* j lives on: these tiles are not counted done */
                span_tile(pool, &span, &open, j, elems, t0);
            pthread_mutex_lock(&pool->mu);
            finish_tiles(pool, j, count);
            continue;
        }
        if (open) { /* going idle or to wait for the job's last tiles: the span ends */
            pthread_mutex_unlock(&pool->mu);
            pool->trace(pool->trace_ctx, &span);
            open = 0;
            pthread_mutex_lock(&pool->mu);
            continue;
        }
        if (!j && pool->stop)
            break;
        pthread_cond_wait(&pool->work_cv, &pool->mu);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

static zo_status check_cores(const zo_optim_pool_config *cfg)
{
    if (!cfg->cores)
        return ZO_OK;
    if (cfg->ncores < 1)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim",
                       "cores is set but ncores is %d; give at least one core", cfg->ncores);
    /* The process's set, not the calling thread's: that one may have been
     * narrowed (an OpenMP runtime binds its threads) and is not where the
     * workers go. */
    cpu_set_t allowed;
    if (zo_process_cpus(&allowed) != 0)
        return ZO_FAIL(ZO_ERR_SYSTEM, "optim", "reading the process's CPU set: %s",
                       strerror(errno));
    for (int i = 0; i < cfg->ncores; i++) {
        int c = cfg->cores[i];
        if (c < 0 || c >= CPU_SETSIZE || !CPU_ISSET(c, &allowed))
            return ZO_FAIL(
                ZO_ERR_INVALID_ARG, "optim",
                "core %d (cores[%d]) is not one this process may run on (it may use %d cores; "
                "see sched_getaffinity or taskset -p)",
                c, i, CPU_COUNT(&allowed));
    }
    return ZO_OK;
}

static zo_status check_config(const zo_optim_pool_config *cfg)
{
    if (!cfg || cfg->struct_size < sizeof *cfg)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim",
                       "zo_optim_pool_config is NULL or its struct_size is "
                       "wrong; initialize it with ZO_OPTIM_POOL_CONFIG_INIT");
    if (cfg->nthreads < 1 || cfg->nthreads > 1024)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim", "nthreads %d must be between 1 and 1024",
                       cfg->nthreads);
    if (cfg->tile_elems % 64)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim",
                       "tile_elems %zu must be a multiple of 64 (or 0 for the "
                       "default)",
                       cfg->tile_elems);
    return check_cores(cfg);
}

/* One core per worker when there are enough, else the whole set; with no
 * cores given, the process's CPUs, whatever the creating thread's mask. */
static int worker_affinity(const zo_optim_pool_config *cfg, int i, cpu_set_t *set)
{
    if (!cfg->cores)
        return zo_process_cpus(set) == 0 ? 0 : errno;
    CPU_ZERO(set);
    if (cfg->nthreads <= cfg->ncores) {
        CPU_SET(cfg->cores[i], set);
        return 0;
    }
    for (int c = 0; c < cfg->ncores; c++)
        CPU_SET(cfg->cores[c], set);
    return 0;
}

static zo_status start_worker(struct zo_optim_pool *pool, const zo_optim_pool_config *cfg, int i)
{
    pthread_attr_t attr;
    int rc = pthread_attr_init(&attr);
    cpu_set_t set;
    if (rc == 0)
        rc = worker_affinity(cfg, i, &set);
    if (rc == 0)
        rc = pthread_attr_setaffinity_np(&attr, sizeof set, &set);
    pool->workers[i] = (pool_worker){pool, i};
    if (rc == 0)
        rc = pthread_create(&pool->threads[i], &attr, worker_main, &pool->workers[i]);
    pthread_attr_destroy(&attr);
    if (rc != 0)
        return ZO_FAIL(ZO_ERR_SYSTEM, "optim", "starting optimizer worker %d of %d: %s", i,
                       cfg->nthreads, strerror(rc));
    return ZO_OK;
}

static void stop_workers(struct zo_optim_pool *pool, int started)
{
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->work_cv);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 0; i < started; i++)
        pthread_join(pool->threads[i], NULL);
}

zo_status zo_optim_pool_init(zo_optim_pool_t *out, const zo_optim_pool_config *cfg)
{
    if (!out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim", "zo_optim_pool_init: out is NULL");
    *out = NULL;
    ZO_TRY(check_config(cfg));
    struct zo_optim_pool *pool = calloc(1, sizeof *pool);
    if (pool)
        pool->threads = calloc((size_t)cfg->nthreads, sizeof *pool->threads);
    if (pool)
        pool->workers = calloc((size_t)cfg->nthreads, sizeof *pool->workers);
    if (pool)
        pool->spans = calloc((size_t)cfg->nthreads, sizeof *pool->spans);
    if (!pool || !pool->threads || !pool->workers || !pool->spans) {
        if (pool)
            free(pool->threads), free(pool->workers), free(pool->spans);
        free(pool);
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "optim", "allocating a pool of %d workers", cfg->nthreads);
    }
    pool->nthreads = cfg->nthreads;
    pool->trace = cfg->trace;
    pool->trace_ctx = cfg->trace_ctx;
    pool->tile =
        cfg->tile_elems
            ? cfg->tile_elems
            : (size_t)zo_env_int("ZO_OPTIM_TILE", ZO_OPTIM_TILE_DEFAULT, 64, 1 << 26) / 64 * 64;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->work_cv, NULL);
    for (int i = 0; i < cfg->nthreads; i++) {
        zo_status st = start_worker(pool, cfg, i);
        if (st < 0) {
            stop_workers(pool, i);
            pthread_cond_destroy(&pool->work_cv);
            pthread_mutex_destroy(&pool->mu);
            free(pool->threads);
            free(pool->workers);
            free(pool->spans);
            free(pool);
            return st;
        }
    }
    *out = pool;
    return ZO_OK;
}

void zo_optim_pool_free(zo_optim_pool_t pool)
{
    if (!pool)
        return;
    stop_workers(pool, pool->nthreads); /* workers drain the queue before they see stop */
    pthread_cond_destroy(&pool->work_cv);
    pthread_mutex_destroy(&pool->mu);
    free(pool->threads);
    free(pool->workers);
    free(pool->spans);
    free(pool);
}

int zo_optim_pool_nthreads(zo_optim_pool_t pool)
{
    return pool ? pool->nthreads : 0;
}
size_t zo_optim_pool_tile_elems(zo_optim_pool_t pool)
{
    return pool ? pool->tile : 0;
}

/* A job's tiles are the pool's, rounded up to a multiple of align: whole
 * blocks of gradient sums, or of 8-bit moments. */
static zo_status job_new(zo_optim_pool_t pool, job_kind kind, size_t n, size_t align,
                         struct zo_optim_job **out)
{
    struct zo_optim_job *j = calloc(1, sizeof *j);
    if (!j)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "optim", "allocating an optimizer job");
    j->kind = kind;
    j->tile = zo_round_up(pool->tile, align);
    j->ntiles = (n + j->tile - 1) / j->tile;
    if (kind == JOB_GRAD_STATS && j->ntiles) {
        size_t nblocks = (n + ZO_NORM_BLOCK - 1) / ZO_NORM_BLOCK;
        j->partials = calloc(nblocks, sizeof *j->partials);
        if (!j->partials) {
            free(j);
            return ZO_FAIL(ZO_ERR_NO_MEMORY, "optim", "allocating %zu per-block sums", nblocks);
        }
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    *out = j;
    return ZO_OK;
}

static void job_submit(zo_optim_pool_t pool, struct zo_optim_job *j)
{
    if (j->ntiles == 0) {
        j->done = 1; /* nothing to do; its stats stay zero */
        return;
    }
    pthread_mutex_lock(&pool->mu);
    j->seq = pool->next_seq++;
    if (pool->tail) {
        pool->tail->next = j;
    } else {
        pool->head = j;
        split_head(pool);
    }
    pool->tail = j;
    pthread_cond_broadcast(&pool->work_cv);
    pthread_mutex_unlock(&pool->mu);
}

static zo_status check_pool_job(zo_optim_pool_t pool, zo_optim_job_t *job)
{
    if (!pool || !job)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim", "%s is NULL",
                       !pool ? "pool" : "job (the handle to fill)");
    *job = NULL;
    return ZO_OK;
}

static size_t state_align(const zo_adam_buffers *b)
{
    const zo_state_format *f = zo_state_format_of(b->state_type);
    return f && f->block ? f->block : 1; /* a part's first scale its own */
}

zo_status zo_optim_pool_adam_enqueue(zo_optim_pool_t pool, const zo_adam_params *p,
                                     const zo_adam_buffers *b, zo_optim_job_t *job)
{
    zo_adam_consts c;
    const zo_optim_kernels *k;
    ZO_TRY(check_pool_job(pool, job));
    ZO_TRY(zo_adam_consts_make(p, &c));
    ZO_TRY(zo_adam_buffers_check(b));
    ZO_TRY(zo_optim_kernels_get(p->simd_level, &k));
    struct zo_optim_job *j;
    ZO_TRY(job_new(pool, JOB_ADAM, b->n, state_align(b), &j));
    j->k = k;
    j->c = c;
    j->b = *b;
    job_submit(pool, j);
    *job = j;
    return ZO_OK;
}

zo_status zo_optim_pool_roofline_enqueue(zo_optim_pool_t pool, const zo_adam_buffers *b,
                                         int simd_level, zo_optim_job_t *job)
{
    const zo_optim_kernels *k;
    ZO_TRY(check_pool_job(pool, job));
    ZO_TRY(zo_adam_buffers_check(b));
    ZO_TRY(zo_adam_roofline_check(b));
    ZO_TRY(zo_optim_kernels_get(simd_level, &k));
    struct zo_optim_job *j;
    ZO_TRY(job_new(pool, JOB_ROOFLINE, b->n, state_align(b), &j));
    j->k = k;
    j->b = *b;
    job_submit(pool, j);
    *job = j;
    return ZO_OK;
}

zo_status zo_optim_pool_grad_stats_enqueue(zo_optim_pool_t pool, const void *grad, zo_dtype type,
                                           size_t n, int simd_level, zo_optim_job_t *job)
{
    const zo_optim_kernels *k;
    ZO_TRY(check_pool_job(pool, job));
    ZO_TRY(zo_grad_check(grad, type, n));
    ZO_TRY(zo_optim_kernels_get(simd_level, &k));
    struct zo_optim_job *j;
    ZO_TRY(job_new(pool, JOB_GRAD_STATS, n, ZO_NORM_BLOCK, &j));
    j->k = k;
    j->b.grad = grad;
    j->b.grad_type = type;
    j->b.n = n;
    job_submit(pool, j);
    *job = j;
    return ZO_OK;
}

zo_status zo_optim_job_poll(zo_optim_job_t job)
{
    if (!job)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim", "zo_optim_job_poll: job is NULL");
    pthread_mutex_lock(&job->mu);
    int done = job->done;
    pthread_mutex_unlock(&job->mu);
    return done ? ZO_OK : ZO_NOT_READY;
}

zo_status zo_optim_job_wait(zo_optim_job_t job, zo_grad_stats *stats)
{
    if (!job)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim", "zo_optim_job_wait: job is NULL");
    pthread_mutex_lock(&job->mu);
    while (!job->done)
        pthread_cond_wait(&job->cv, &job->mu);
    pthread_mutex_unlock(&job->mu);
    if (stats)
        *stats = job->stats;
    pthread_cond_destroy(&job->cv);
    pthread_mutex_destroy(&job->mu);
    free(job->partials);
    free(job);
    return ZO_OK;
}

zo_status zo_optim_pool_adam_step(zo_optim_pool_t pool, const zo_adam_params *p,
                                  const zo_adam_buffers *b)
{
    zo_optim_job_t job;
    ZO_TRY(zo_optim_pool_adam_enqueue(pool, p, b, &job));
    return zo_optim_job_wait(job, NULL);
}

zo_status zo_optim_pool_grad_stats(zo_optim_pool_t pool, const void *grad, zo_dtype type, size_t n,
                                   zo_grad_stats *out)
{
    zo_optim_job_t job;
    if (!out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim", "zo_optim_pool_grad_stats: out is NULL");
    ZO_TRY(zo_optim_pool_grad_stats_enqueue(pool, grad, type, n, -1, &job));
    return zo_optim_job_wait(job, out);
}
