/* The optimizer's worker pool: results bit-identical for any number of
 * threads, asynchronous jobs run in order, core binding, error paths.
 * Labelled tsan: also run under ThreadSanitizer. */
#include <pthread.h>
#include <sched.h>

#include "adam_ref.h"

#define N 100003 /* about 390 tiles of 256, with a ragged last tile */

static zo_optim_pool_t make_pool(int threads, size_t tile)
{
    zo_optim_pool_config cfg = ZO_OPTIM_POOL_CONFIG_INIT;
    cfg.nthreads = threads;
    cfg.tile_elems = tile;
    zo_optim_pool_t pool;
    ZO_ASSERT_OK(zo_optim_pool_init(&pool, &cfg));
    assert_int_equal(zo_optim_pool_nthreads(pool), threads);
    assert_int_equal(zo_optim_pool_tile_elems(pool), tile);
    return pool;
}

static void fill_case(adam_case *c, uint64_t seed)
{
    uint64_t s = seed;
    case_fill_grads(c, &s);
    case_fill_state(c, &s);
}

static zo_adam_params step_params(int64_t step)
{
    zo_adam_params p = ZO_ADAM_PARAMS_INIT;
    p.adamw = 1;
    p.weight_decay = 0.01f;
    p.step = step;
    p.grad_scale = 0.25f;
    return p;
}

static void assert_same_state(const adam_case *a, const adam_case *b)
{
    size_t ss = zo_dtype_size(a->st);
    assert_memory_equal(a->master, b->master, a->n * 4);
    assert_memory_equal(a->m, b->m, a->n * ss);
    assert_memory_equal(a->v, b->v, a->n * ss);
    if (a->out)
        assert_memory_equal(a->out, b->out, a->n * 2);
}

/* Every thread count gives the single-call result, bit for bit. */
static void test_adam_thread_count_invariance(void **state)
{
    adam_case want, got;
    case_alloc(&want, N, ZO_DTYPE_BF16, ZO_DTYPE_F32, ZO_DTYPE_BF16);
    case_alloc(&got, N, ZO_DTYPE_BF16, ZO_DTYPE_F32, ZO_DTYPE_BF16);
    fill_case(&want, 5);
    zo_adam_params p = step_params(4);
    ZO_ASSERT_OK(zo_adam_step(&p, &want.b));
    for (int threads = 1; threads <= 4; threads++) {
        zo_optim_pool_t pool = make_pool(threads, 256);
        fill_case(&got, 5);
        ZO_ASSERT_OK(zo_optim_pool_adam_step(pool, &p, &got.b));
        assert_same_state(&got, &want);
        zo_optim_pool_free(pool);
    }
    case_free(&want);
    case_free(&got);
}

/* The sum of squares is identical for every thread count (fixed tiles,
 * combined in tile order) and matches the reference. */
static void test_grad_stats_deterministic(void **state)
{
    adam_case c;
    case_alloc(&c, N, ZO_DTYPE_F32, ZO_DTYPE_F32, ZO_DTYPE_NONE);
    uint64_t s = 9;
    case_fill_grads(&c, &s);
    long double ref = 0;
    for (size_t i = 0; i < c.n; i++)
        ref += (long double)((float *)c.grad)[i] * ((float *)c.grad)[i];
    double first = 0;
    for (int threads = 1; threads <= 4; threads++) {
        zo_optim_pool_t pool = make_pool(threads, 512);
        for (int rep = 0; rep < 3; rep++) {
            zo_grad_stats st;
            ZO_ASSERT_OK(zo_optim_pool_grad_stats(pool, c.grad, c.gt, c.n, &st));
            assert_int_equal(st.nonfinite, 0);
            if (threads == 1 && rep == 0)
                first = st.sum_sq;
            assert_memory_equal(&st.sum_sq, &first, sizeof first);
        }
        zo_optim_pool_free(pool);
    }
    assert_true(fabsl(first - ref) <= 1e-13L * ref);
    ((float *)c.grad)[N - 1] = NAN;
    zo_optim_pool_t pool = make_pool(2, 512);
    zo_grad_stats st;
    ZO_ASSERT_OK(zo_optim_pool_grad_stats(pool, c.grad, c.gt, c.n, &st));
    assert_int_equal(st.nonfinite, 1);
    zo_optim_pool_free(pool);
    case_free(&c);
}

/* Sum of squares per 16384 elements, added in element order, each block by
 * the library's single-threaded call: what the pool must give bit for bit. */
static double blockwise_sum_sq(const adam_case *c)
{
    double s = 0.0;
    size_t es = zo_dtype_size(c->gt);
    for (size_t b = 0; b < c->n; b += 16384) {
        zo_grad_stats st;
        size_t len = c->n - b < 16384 ? c->n - b : 16384;
        ZO_ASSERT_OK(zo_grad_stats_compute((const char *)c->grad + b * es, c->gt, len, -1, &st));
        s += st.sum_sq;
    }
    return s;
}

/* Two steps and a gradient norm through a pool of each thread count and
 * tile size give the bits of the unthreaded step and of the 1-thread pool,
 * however the workers' spans were split and stolen. */
static void test_threads_and_tiles_bitwise(void **state)
{
    enum { NT = 5 * 16384 + 4321 };
    static const int threads[] = {1, 2, 3, 7};
    static const size_t tiles[] = {16384, 64, 320, 4096, 65536, 1 << 20};
    adam_case want, first, got;
    case_alloc(&want, NT, ZO_DTYPE_F32, ZO_DTYPE_F32, ZO_DTYPE_BF16);
    case_alloc(&first, NT, ZO_DTYPE_F32, ZO_DTYPE_F32, ZO_DTYPE_BF16);
    case_alloc(&got, NT, ZO_DTYPE_F32, ZO_DTYPE_F32, ZO_DTYPE_BF16);
    fill_case(&want, 23);
    for (int t = 1; t <= 2; t++) {
        zo_adam_params p = step_params(t);
        ZO_ASSERT_OK(zo_adam_step(&p, &want.b));
    }
    double want_sum = blockwise_sum_sq(&want), first_sum = 0.0;
    long double ref = 0;
    for (size_t i = 0; i < want.n; i++)
        ref += (long double)((float *)want.grad)[i] * ((float *)want.grad)[i];
    assert_true(fabsl(want_sum - ref) <= 1e-13L * ref);
    for (size_t ti = 0; ti < sizeof tiles / sizeof *tiles; ti++) {
        for (size_t k = 0; k < sizeof threads / sizeof *threads; k++) {
            zo_optim_pool_t pool = make_pool(threads[k], tiles[ti]);
            adam_case *dst = ti == 0 && k == 0 ? &first : &got;
            fill_case(dst, 23);
            zo_optim_job_t jobs[3];
            for (int t = 1; t <= 2; t++) {
                zo_adam_params p = step_params(t);
                ZO_ASSERT_OK(zo_optim_pool_adam_enqueue(pool, &p, &dst->b, &jobs[t - 1]));
            }
            ZO_ASSERT_OK(
                zo_optim_pool_grad_stats_enqueue(pool, dst->grad, dst->gt, dst->n, -1, &jobs[2]));
            zo_grad_stats st;
            ZO_ASSERT_OK(zo_optim_job_wait(jobs[0], NULL));
            ZO_ASSERT_OK(zo_optim_job_wait(jobs[1], NULL));
            ZO_ASSERT_OK(zo_optim_job_wait(jobs[2], &st));
            zo_optim_pool_free(pool);
            if (dst == &first)
                first_sum = st.sum_sq;
            assert_same_state(dst, &want);
            assert_same_state(dst, &first);
            assert_memory_equal(&st.sum_sq, &want_sum, sizeof want_sum);
            assert_memory_equal(&st.sum_sq, &first_sum, sizeof first_sum);
        }
    }
    case_free(&want);
    case_free(&first);
    case_free(&got);
}

/* Jobs enqueued back to back on the same buffers run in order: three
 * steps queued at once equal three steps taken one after another. */
static void test_async_jobs_in_order(void **state)
{
    adam_case want, got;
    case_alloc(&want, N, ZO_DTYPE_F16, ZO_DTYPE_BF16, ZO_DTYPE_F16);
    case_alloc(&got, N, ZO_DTYPE_F16, ZO_DTYPE_BF16, ZO_DTYPE_F16);
    fill_case(&want, 13);
    fill_case(&got, 13);
    for (int t = 1; t <= 3; t++) {
        zo_adam_params p = step_params(t);
        ZO_ASSERT_OK(zo_adam_step(&p, &want.b));
    }
    zo_optim_pool_t pool = make_pool(3, 1024);
    zo_optim_job_t jobs[4];
    for (int t = 1; t <= 3; t++) {
        zo_adam_params p = step_params(t);
        ZO_ASSERT_OK(zo_optim_pool_adam_enqueue(pool, &p, &got.b, &jobs[t - 1]));
    }
    ZO_ASSERT_OK(zo_optim_pool_grad_stats_enqueue(pool, got.grad, got.gt, got.n, -1, &jobs[3]));
    zo_status st = zo_optim_job_poll(jobs[2]);
    assert_true(st == ZO_OK || st == ZO_NOT_READY);
    for (int k = 3; k >= 0; k--)
        ZO_ASSERT_OK(zo_optim_job_wait(jobs[k], NULL));
    assert_same_state(&got, &want);
    zo_optim_pool_free(pool);
    case_free(&want);
    case_free(&got);
}

/* ---- the trace hook ---- */

#define MAX_SPANS 4096

typedef struct span_log {
    pthread_mutex_t mu;
    zo_optim_trace_span spans[MAX_SPANS];
    int n;
} span_log;

static void log_span(void *ctx, const zo_optim_trace_span *s)
{
    span_log *l = ctx;
    pthread_mutex_lock(&l->mu);
    if (l->n < MAX_SPANS)
        l->spans[l->n++] = *s;
    pthread_mutex_unlock(&l->mu);
}

/* Every worker's share of every job is reported: per job the elements add
 * up to the job's size, a worker's spans never overlap, the names say what
 * ran; and the results are those of an untraced pool. */
static void test_trace_spans(void **state)
{
    static span_log log;
    pthread_mutex_init(&log.mu, NULL);
    log.n = 0;
    adam_case want, got;
    case_alloc(&want, N, ZO_DTYPE_F16, ZO_DTYPE_F32, ZO_DTYPE_BF16);
    case_alloc(&got, N, ZO_DTYPE_F16, ZO_DTYPE_F32, ZO_DTYPE_BF16);
    fill_case(&want, 5);
    fill_case(&got, 5);
    zo_optim_pool_config cfg = ZO_OPTIM_POOL_CONFIG_INIT;
    cfg.nthreads = 3;
    cfg.tile_elems = 512;
    cfg.trace = log_span;
    cfg.trace_ctx = &log;
    zo_optim_pool_t pool;
    ZO_ASSERT_OK(zo_optim_pool_init(&pool, &cfg));
    zo_optim_job_t jobs[4];
    for (int t = 1; t <= 3; t++) {
        zo_adam_params p = step_params(t);
        ZO_ASSERT_OK(zo_adam_step(&p, &want.b));
        ZO_ASSERT_OK(zo_optim_pool_adam_enqueue(pool, &p, &got.b, &jobs[t - 1]));
    }
    ZO_ASSERT_OK(zo_optim_pool_grad_stats_enqueue(pool, got.grad, got.gt, got.n, -1, &jobs[3]));
    for (int k = 0; k < 4; k++)
        ZO_ASSERT_OK(zo_optim_job_wait(jobs[k], NULL));
    zo_optim_pool_free(pool); /* the workers have reported their last spans */
    assert_same_state(&got, &want);
    size_t elems[4] = {0};
    for (int i = 0; i < log.n; i++) {
        const zo_optim_trace_span *a = &log.spans[i];
        assert_true(a->worker >= 0 && a->worker < 3);
        assert_true(a->seq < 4);
        assert_string_equal(a->job, a->seq == 3 ? "grad stats" : "adam");
        assert_true(a->t0_ns <= a->t1_ns && a->elems > 0);
        elems[a->seq] += a->elems;
        for (int k = 0; k < log.n; k++) {
            const zo_optim_trace_span *b = &log.spans[k];
            if (k != i && b->worker == a->worker)
                assert_true(b->t1_ns <= a->t0_ns || a->t1_ns <= b->t0_ns);
        }
    }
    for (int k = 0; k < 4; k++)
        assert_int_equal(elems[k], N);
    pthread_mutex_destroy(&log.mu);
    case_free(&want);
    case_free(&got);
}

/* Freeing the pool finishes queued work; handles stay waitable. */
static void test_free_drains_queue(void **state)
{
    adam_case want, got;
    case_alloc(&want, N, ZO_DTYPE_F32, ZO_DTYPE_F32, ZO_DTYPE_NONE);
    case_alloc(&got, N, ZO_DTYPE_F32, ZO_DTYPE_F32, ZO_DTYPE_NONE);
    fill_case(&want, 17);
    fill_case(&got, 17);
    zo_adam_params p = step_params(1);
    ZO_ASSERT_OK(zo_adam_step(&p, &want.b));
    zo_optim_pool_t pool = make_pool(2, 256);
    zo_optim_job_t job, stats_job;
    ZO_ASSERT_OK(zo_optim_pool_adam_enqueue(pool, &p, &got.b, &job));
    ZO_ASSERT_OK(zo_optim_pool_grad_stats_enqueue(pool, got.grad, got.gt, got.n, -1, &stats_job));
    zo_optim_pool_free(pool);
    ZO_ASSERT_OK(zo_optim_job_poll(job));
    ZO_ASSERT_OK(zo_optim_job_wait(job, NULL));
    zo_grad_stats st;
    ZO_ASSERT_OK(zo_optim_job_wait(stats_job, &st));
    assert_true(st.sum_sq > 0);
    assert_same_state(&got, &want);
    case_free(&want);
    case_free(&got);
}

static void test_core_binding(void **state)
{
    cpu_set_t allowed;
    assert_int_equal(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    int cores[CPU_SETSIZE], ncores = 0;
    for (int c = 0; c < CPU_SETSIZE && ncores < 4; c++)
        if (CPU_ISSET(c, &allowed))
            cores[ncores++] = c;
    adam_case want, got;
    case_alloc(&want, 4096, ZO_DTYPE_BF16, ZO_DTYPE_F32, ZO_DTYPE_BF16);
    case_alloc(&got, 4096, ZO_DTYPE_BF16, ZO_DTYPE_F32, ZO_DTYPE_BF16);
    fill_case(&want, 19);
    zo_adam_params p = step_params(2);
    ZO_ASSERT_OK(zo_adam_step(&p, &want.b));
    /* One core per worker, then more workers than cores (each on the set). */
    for (int threads = ncores; threads <= ncores + 2; threads += 2) {
        zo_optim_pool_config cfg = ZO_OPTIM_POOL_CONFIG_INIT;
        cfg.nthreads = threads;
        cfg.cores = cores;
        cfg.ncores = ncores;
        cfg.tile_elems = 256;
        zo_optim_pool_t pool;
        ZO_ASSERT_OK(zo_optim_pool_init(&pool, &cfg));
        fill_case(&got, 19);
        ZO_ASSERT_OK(zo_optim_pool_adam_step(pool, &p, &got.b));
        assert_same_state(&got, &want);
        zo_optim_pool_free(pool);
    }
    case_free(&want);
    case_free(&got);
}

/* ---- workers on the process's CPUs, not the creating thread's ---- */

typedef struct mask_log {
    pthread_mutex_t mu;
    int min_cpus, max_cpus;
} mask_log;

/* Runs on each worker: what its thread may run on. */
static void log_worker_mask(void *ctx, const zo_optim_trace_span *s)
{
    mask_log *l = ctx;
    cpu_set_t set;
    assert_int_equal(pthread_getaffinity_np(pthread_self(), sizeof set, &set), 0);
    pthread_mutex_lock(&l->mu);
    int n = CPU_COUNT(&set);
    if (n < l->min_cpus)
        l->min_cpus = n;
    if (n > l->max_cpus)
        l->max_cpus = n;
    pthread_mutex_unlock(&l->mu);
}

typedef struct narrowed_args {
    const int *cores; /* all the process's CPUs, or NULL */
    int ncores;
    mask_log *log;
    zo_status st;
} narrowed_args;

/* A pool made and used by a thread bound to one CPU (as an OpenMP runtime
 * binds its threads). */
static void *pool_from_narrowed_thread(void *arg)
{
    narrowed_args *a = arg;
    cpu_set_t one;
    assert_int_equal(sched_getaffinity(0, sizeof one, &one), 0);
    for (int c = 0, seen = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &one) && seen++)
            CPU_CLR(c, &one);
    assert_int_equal(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
    zo_optim_pool_config cfg = ZO_OPTIM_POOL_CONFIG_INIT;
    cfg.nthreads = 2;
    cfg.tile_elems = 256;
    cfg.cores = a->cores;
    cfg.ncores = a->ncores;
    cfg.trace = log_worker_mask;
    cfg.trace_ctx = a->log;
    zo_optim_pool_t pool;
    a->st = zo_optim_pool_init(&pool, &cfg);
    if (a->st < 0)
        return NULL;
    adam_case c;
    case_alloc(&c, 4096, ZO_DTYPE_BF16, ZO_DTYPE_F32, ZO_DTYPE_BF16);
    fill_case(&c, 29);
    zo_adam_params p = step_params(1);
    a->st = zo_optim_pool_adam_step(pool, &p, &c.b);
    zo_optim_pool_free(pool);
    case_free(&c);
    return NULL;
}

static void test_workers_on_process_cpus(void **state)
{
    cpu_set_t all;
    assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
    int ncpus = CPU_COUNT(&all);
    if (ncpus < 2) {
        print_message("skipped: this process may use only 1 CPU, so a narrowed thread's mask is "
                      "the whole set\n");
        skip();
    }
    int cores[CPU_SETSIZE], ncores = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all))
            cores[ncores++] = c;
    /* Unbound workers get the whole set; --cores naming all of it is
     * accepted although the creating thread may use only one. */
    for (int bound = 0; bound <= 1; bound++) {
        mask_log log = {.min_cpus = CPU_SETSIZE, .max_cpus = 0};
        pthread_mutex_init(&log.mu, NULL);
        narrowed_args a = {bound ? cores : NULL, bound ? ncores : 0, &log, ZO_OK};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, pool_from_narrowed_thread, &a), 0);
        assert_int_equal(pthread_join(th, NULL), 0);
        if (a.st < 0)
            fail_msg("pool from a narrowed thread: %s", zo_last_error());
        assert_int_equal(log.min_cpus, bound && ncores >= 2 ? 1 : ncpus);
        assert_int_equal(log.max_cpus, bound && ncores >= 2 ? 1 : ncpus);
        pthread_mutex_destroy(&log.mu);
    }
}

static void test_pool_errors(void **state)
{
    zo_optim_pool_t pool = (zo_optim_pool_t)1;
    zo_optim_pool_config cfg = ZO_OPTIM_POOL_CONFIG_INIT;
    cfg.nthreads = 0;
    ZO_ASSERT_ST(zo_optim_pool_init(&pool, &cfg), ZO_ERR_INVALID_ARG);
    assert_null(pool);
    cfg = (zo_optim_pool_config)ZO_OPTIM_POOL_CONFIG_INIT;
    cfg.tile_elems = 100;
    ZO_ASSERT_ST(zo_optim_pool_init(&pool, &cfg), ZO_ERR_INVALID_ARG);
    int bad_core = CPU_SETSIZE - 1;
    cpu_set_t allowed;
    sched_getaffinity(0, sizeof allowed, &allowed);
    if (!CPU_ISSET(bad_core, &allowed)) {
        cfg = (zo_optim_pool_config)ZO_OPTIM_POOL_CONFIG_INIT;
        cfg.cores = &bad_core;
        cfg.ncores = 1;
        ZO_ASSERT_ST(zo_optim_pool_init(&pool, &cfg), ZO_ERR_INVALID_ARG);
        assert_true(strstr(zo_last_error(), "core") != NULL);
    }
    int neg = -1;
    cfg = (zo_optim_pool_config)ZO_OPTIM_POOL_CONFIG_INIT;
    cfg.cores = &neg;
    cfg.ncores = 1;
    ZO_ASSERT_ST(zo_optim_pool_init(&pool, &cfg), ZO_ERR_INVALID_ARG);
    cfg.ncores = 0;
    ZO_ASSERT_ST(zo_optim_pool_init(&pool, &cfg), ZO_ERR_INVALID_ARG);
    cfg = (zo_optim_pool_config)ZO_OPTIM_POOL_CONFIG_INIT;
    cfg.struct_size = 0;
    ZO_ASSERT_ST(zo_optim_pool_init(&pool, &cfg), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_optim_pool_init(NULL, &cfg), ZO_ERR_INVALID_ARG);

    pool = make_pool(1, 64);
    adam_case c;
    case_alloc(&c, 128, ZO_DTYPE_F32, ZO_DTYPE_F32, ZO_DTYPE_NONE);
    zo_adam_params p = step_params(1);
    zo_optim_job_t job = (zo_optim_job_t)1;
    p.step = 0;
    ZO_ASSERT_ST(zo_optim_pool_adam_enqueue(pool, &p, &c.b, &job), ZO_ERR_INVALID_ARG);
    assert_null(job);
    p.step = 1;
    ZO_ASSERT_ST(zo_optim_pool_adam_enqueue(NULL, &p, &c.b, &job), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_optim_pool_adam_enqueue(pool, &p, &c.b, NULL), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_optim_pool_grad_stats_enqueue(pool, NULL, ZO_DTYPE_F32, 10, -1, &job),
                 ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_optim_pool_roofline_enqueue(pool, &c.b, 99, &job), ZO_ERR_UNSUPPORTED);
    ZO_ASSERT_ST(zo_optim_job_wait(NULL, NULL), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_optim_job_poll(NULL), ZO_ERR_INVALID_ARG);
    /* An empty job is done at once. */
    c.b.n = 0;
    ZO_ASSERT_OK(zo_optim_pool_adam_enqueue(pool, &p, &c.b, &job));
    ZO_ASSERT_OK(zo_optim_job_poll(job));
    ZO_ASSERT_OK(zo_optim_job_wait(job, NULL));
    zo_grad_stats st = {1, 1};
    ZO_ASSERT_OK(zo_optim_pool_grad_stats(pool, c.grad, ZO_DTYPE_F32, 0, &st));
    assert_true(st.sum_sq == 0 && st.nonfinite == 0);
    zo_optim_pool_free(pool);
    zo_optim_pool_free(NULL);
    case_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adam_thread_count_invariance),
        cmocka_unit_test(test_grad_stats_deterministic),
        cmocka_unit_test(test_async_jobs_in_order),
        cmocka_unit_test(test_free_drains_queue),
        cmocka_unit_test(test_trace_spans),
        cmocka_unit_test(test_core_binding),
        cmocka_unit_test(test_threads_and_tiles_bitwise),
        cmocka_unit_test(test_workers_on_process_cpus),
        cmocka_unit_test(test_pool_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
