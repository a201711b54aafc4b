/* The sync engine: a pool of worker threads doing pread/pwrite, one request
 * each, for machines where io_uring cannot be set up (old kernels, container
 * seccomp policies). Queue depth = number of workers (capped). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "swap_engine.h"
#include "zo_internal.h"

#define SYNC_MAX_WORKERS 64

typedef struct req_fifo {
    zo_io_req **items;
    uint32_t cap, head, count;
} req_fifo;

typedef struct sync_engine {
    zo_io_engine base;
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* workers: a request or stop */
    pthread_cond_t done_cv; /* I/O thread: a completion or wake */
    req_fifo todo, done;
    int stop, woken;
    int *fds;
    int nthreads;
    pthread_t threads[SYNC_MAX_WORKERS];
} sync_engine;

static sync_engine *as_sync(zo_io_engine *e)
{
    return (sync_engine *)e;
}

static void fifo_push(req_fifo *f, zo_io_req *r)
{
    f->items[(f->head + f->count) % f->cap] = r;
    f->count++;
}

static zo_io_req *fifo_pop(req_fifo *f)
{
    zo_io_req *r = f->items[f->head];
    f->head = (f->head + 1) % f->cap;
    f->count--;
    return r;
}

static void sync_do(sync_engine *s, zo_io_req *r)
{
    ssize_t n = r->dir == ZO_IO_READ ? pread(s->fds[r->file], r->buf, r->len, (off_t)r->off)
                                     : pwrite(s->fds[r->file], r->buf, r->len, (off_t)r->off);
    r->result = n < 0 ? -(int64_t)errno : (int64_t)n;
}

static void *sync_worker(void *arg)
{
    sync_engine *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stop && s->todo.count == 0)
            pthread_cond_wait(&s->work_cv, &s->mu);
        if (s->stop)
            break;
        zo_io_req *r = fifo_pop(&s->todo);
        pthread_mutex_unlock(&s->mu);
        sync_do(s, r);
        pthread_mutex_lock(&s->mu);
        fifo_push(&s->done, r);
        pthread_cond_signal(&s->done_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static zo_status sync_register_files(zo_io_engine *e, const int *fds, int n)
{
    sync_engine *s = as_sync(e);
    s->fds = malloc(sizeof(int) * (size_t)n);
    if (!s->fds)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "swap", "sync engine: out of memory");
    memcpy(s->fds, fds, sizeof(int) * (size_t)n);
    return ZO_OK;
}

static zo_status sync_submit(zo_io_engine *e, zo_io_req *r)
{
    sync_engine *s = as_sync(e);
    pthread_mutex_lock(&s->mu);
    if (s->todo.count + s->done.count >= s->todo.cap) {
        pthread_mutex_unlock(&s->mu);
        return ZO_FAIL(ZO_ERR_INTERNAL, "swap", "sync engine: more than %u requests outstanding",
                       s->todo.cap);
    }
    fifo_push(&s->todo, r);
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    return ZO_OK;
}

static int sync_reap(zo_io_engine *e, zo_io_req **out, int max, int wait)
{
    sync_engine *s = as_sync(e);
    pthread_mutex_lock(&s->mu);
    while (wait && s->done.count == 0 && !s->woken)
        pthread_cond_wait(&s->done_cv, &s->mu);
    s->woken = 0;
    int n = 0;
    while (n < max && s->done.count)
        out[n++] = fifo_pop(&s->done);
    pthread_mutex_unlock(&s->mu);
    return n;
}

static void sync_wake(zo_io_engine *e)
{
    sync_engine *s = as_sync(e);
    pthread_mutex_lock(&s->mu);
    s->woken = 1;
    pthread_cond_signal(&s->done_cv);
    pthread_mutex_unlock(&s->mu);
}

static void sync_destroy(zo_io_engine *e)
{
    sync_engine *s = as_sync(e);
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->nthreads; i++)
        pthread_join(s->threads[i], NULL);
    pthread_cond_destroy(&s->work_cv);
    pthread_cond_destroy(&s->done_cv);
    pthread_mutex_destroy(&s->mu);
    free(s->todo.items);
    free(s->done.items);
    free(s->fds);
    free(s);
}

static zo_status sync_create(const zo_io_engine_args *a, zo_io_engine **out)
{
    uint32_t queue_depth = a->queue_depth;
    *out = NULL;
    sync_engine *s = calloc(1, sizeof *s);
    if (!s)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "swap", "sync engine: out of memory");
    s->base.ops = &zo_io_sync_ops;
    s->base.queue_depth = queue_depth;
    snprintf(s->base.name, sizeof s->base.name, "sync");
    s->todo.cap = s->done.cap = queue_depth;
    s->todo.items = calloc(queue_depth, sizeof(zo_io_req *));
    s->done.items = calloc(queue_depth, sizeof(zo_io_req *));
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    if (!s->todo.items || !s->done.items) {
        sync_destroy(&s->base);
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "swap", "sync engine: out of memory for a queue of %u",
                       queue_depth);
    }
    int want = queue_depth < SYNC_MAX_WORKERS ? (int)queue_depth : SYNC_MAX_WORKERS;
    for (int i = 0; i < want; i++) {
        int rc = pthread_create(&s->threads[i], NULL, sync_worker, s);
        if (rc) {
            sync_destroy(&s->base);
            return ZO_FAIL(ZO_ERR_SYSTEM, "swap",
                           "sync engine: starting worker %d of %d failed: %s", i + 1, want,
                           strerror(rc));
        }
        s->nthreads++;
    }
    *out = &s->base;
    return ZO_OK;
}

const zo_io_engine_ops zo_io_sync_ops = {
    .name = "sync",
    .version = ZO_IO_ENGINE_OPS_VERSION,
    .caps = ZO_IO_CAP_AUTO,
    .create = sync_create,
    .register_files = sync_register_files,
    .submit = sync_submit, /* a worker starts it at once; pread/pwrite have no fixed buffers */
    .reap = sync_reap,
    .wake = sync_wake,
    .destroy = sync_destroy,
};
