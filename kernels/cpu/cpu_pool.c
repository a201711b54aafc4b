/* The cpu device's compute pool (see cpu_pool.h for the contract).
 *
 * One job at a time: a job is a task count and a function; workers and the
 * submitter take the next task index under the pool's mutex. Tasks are
 * coarse (a slice of a GEMM or of a few hundred rows), so a mutex per task
 * costs nothing measurable and keeps the pool simple to reason about (and
 * visible to ThreadSanitizer). Workers sleep on a condition variable between
 * jobs; nothing spins. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#include "cpu_pool.h"
#include "zo_internal.h"

#define SUBSYS "device"

typedef struct pool_job {
    zo_cpu_task_fn fn;
    void *arg;
    size_t n, next, done;
} pool_job;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t wake; /* a job was posted */
    pthread_cond_t fin;  /* a job's last task finished */
    pool_job *job;
    int threads;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 1};

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static int job_has_tasks(void)
{
    return pool.job && pool.job->next < pool.job->n;
}

/* Called with the mutex held; returns with it held. */
static void run_one_task(pool_job *job)
{
    size_t i = job->next++;
    pthread_mutex_unlock(&pool.mu);
    job->fn(job->arg, i);
    pthread_mutex_lock(&pool.mu);
    if (++job->done == job->n)
        pthread_cond_broadcast(&pool.fin);
}

/* Workers live as long as the process: the pool is process-wide, like
 * OpenBLAS's own threads. */
static void *worker_main(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&pool.mu);
    for (;;) {
        while (!job_has_tasks())
            pthread_cond_wait(&pool.wake, &pool.mu);
        run_one_task(pool.job);
    }
    return NULL;
}

static int process_cpu_count(void)
{
    cpu_set_t set;
    if (zo_process_cpus(&set) != 0)
        return 1;
    int n = CPU_COUNT(&set);
    return n > 0 ? n : 1;
}

static void pool_start(void)
{
    int n = (int)zo_env_int("ZO_CPU_THREADS", process_cpu_count(), 1, 1024);
    int started = 1;
    for (int i = 1; i < n; i++) {
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &at, worker_main, NULL);
        pthread_attr_destroy(&at);
        if (rc != 0) {
            ZO_LOGW(SUBSYS, "started %d of %d compute threads (pthread_create failed)", started, n);
            break;
        }
        started++;
    }
    pool.threads = started;
    ZO_LOGI(SUBSYS, "cpu compute pool: %d thread(s), the stream thread included", started);
}

int zo_cpu_pool_threads(void)
{
    pthread_once(&pool_once, pool_start);
    return pool.threads;
}

void zo_cpu_pool_run(size_t n_tasks, zo_cpu_task_fn fn, void *arg)
{
    if (n_tasks == 0)
        return;
    pool_job job = {fn, arg, n_tasks, 0, 0};
    if (n_tasks == 1 || zo_cpu_pool_threads() == 1) {
        for (size_t i = 0; i < n_tasks; i++)
            fn(arg, i);
        return;
    }
    pthread_mutex_lock(&pool.mu);
    if (pool.job) { /* another stream's job has the pool: run ours here */
        pthread_mutex_unlock(&pool.mu);
        for (size_t i = 0; i < n_tasks; i++)
            fn(arg, i);
        return;
    }
    pool.job = &job;
    pthread_cond_broadcast(&pool.wake);
    while (job.next < job.n)
        run_one_task(&job);
    while (job.done < job.n)
        pthread_cond_wait(&pool.fin, &pool.mu);
    pool.job = NULL;
    pthread_mutex_unlock(&pool.mu);
}

size_t zo_cpu_split(size_t n, size_t parts, size_t align)
{
    if (n == 0)
        return 0;
    size_t per = zo_round_up((n + parts - 1) / parts, align);
    return (n + per - 1) / per;
}

void zo_cpu_part(size_t n, size_t parts, size_t align, size_t p, size_t *lo, size_t *hi)
{
    size_t per = zo_round_up((n + parts - 1) / parts, align);
    *lo = p * per < n ? p * per : n;
    *hi = (p + 1) * per < n ? (p + 1) * per : n;
}
