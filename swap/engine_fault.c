/* The fault engine: wraps another engine and, at chosen request indices,
 * makes a request fail (EIO, ENOSPC, EINTR, EAGAIN), transfer only part of
 * its bytes, or complete late, so tests can drive every error path of the
 * store through the real engine underneath. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "swap_engine.h"
#include "zo_internal.h"

/* A shortened copy of a request, submitted to the inner engine in its place. */
typedef struct shadow_req {
    zo_io_req req;
    zo_io_req *orig;
    struct shadow_req *next;
} shadow_req;

typedef struct fault_engine {
    zo_io_engine base;
    zo_io_engine *inner;
    pthread_mutex_t mu; /* faults are re-armed from other threads */
    zo_swap_fault *faults;
    size_t nfaults;
    uint64_t next_index;
    zo_io_req **fake; /* injected completions, reaped before the inner ones */
    uint32_t nfake;
    shadow_req *shadows;
} fault_engine;

static fault_engine *as_fault(zo_io_engine *e)
{
    return (fault_engine *)e;
}

static zo_status fault_register_files(zo_io_engine *e, const int *fds, int n)
{
    return as_fault(e)->inner->ops->register_files(as_fault(e)->inner, fds, n);
}

static zo_status fault_start(zo_io_engine *e)
{
    return zo_io_engine_start(as_fault(e)->inner);
}

static zo_status fault_register_buffer(zo_io_engine *e, void *buf, size_t len, int *index)
{
    return zo_io_engine_register_buffer(as_fault(e)->inner, buf, len, index);
}

static void fault_unregister_buffer(zo_io_engine *e, int index)
{
    zo_io_engine_unregister_buffer(as_fault(e)->inner, index);
}

/* The fault armed for this request index, or NULL; consumes the index. */
static int fault_take(fault_engine *f, zo_swap_fault *out)
{
    pthread_mutex_lock(&f->mu);
    uint64_t idx = f->next_index++;
    int hit = 0;
    for (size_t i = 0; i < f->nfaults && !hit; i++) {
        if (f->faults[i].op_index == idx) {
            *out = f->faults[i];
            hit = 1;
        }
    }
    pthread_mutex_unlock(&f->mu);
    return hit;
}

static void fault_complete_now(fault_engine *f, zo_io_req *r, int64_t result)
{
    r->result = result;
    f->fake[f->nfake++] = r;
}

static zo_status fault_submit_short(fault_engine *f, zo_io_req *r)
{
    /* Keep O_DIRECT alignment: transfer whole 4 KiB blocks, or nothing. */
    size_t part = (r->len / 2) & ~(size_t)(ZO_SWAP_ALIGN - 1);
    if (part == 0) {
        fault_complete_now(f, r, 0);
        return ZO_OK;
    }
    shadow_req *sh = malloc(sizeof *sh);
    if (!sh)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "swap", "fault engine: out of memory");
    sh->req = *r;
    sh->req.len = part;
    sh->orig = r;
    sh->next = f->shadows;
    f->shadows = sh;
    return f->inner->ops->submit(f->inner, &sh->req);
}

static zo_status fault_submit(zo_io_engine *e, zo_io_req *r)
{
    fault_engine *f = as_fault(e);
    zo_swap_fault ft;
    if (!fault_take(f, &ft))
        return f->inner->ops->submit(f->inner, r);
    ZO_LOGD("swap", "fault engine: injecting fault kind %d at request %llu", (int)ft.kind,
            (unsigned long long)ft.op_index);
    switch (ft.kind) {
    case ZO_SWAP_FAULT_EIO: fault_complete_now(f, r, -EIO); return ZO_OK;
    case ZO_SWAP_FAULT_NOSPC: fault_complete_now(f, r, -ENOSPC); return ZO_OK;
    case ZO_SWAP_FAULT_EINTR: fault_complete_now(f, r, -EINTR); return ZO_OK;
    case ZO_SWAP_FAULT_EAGAIN: fault_complete_now(f, r, -EAGAIN); return ZO_OK;
    case ZO_SWAP_FAULT_SHORT: return fault_submit_short(f, r);
    case ZO_SWAP_FAULT_DELAY: {
        struct timespec ts = {ft.delay_ms / 1000, (long)(ft.delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        return f->inner->ops->submit(f->inner, r);
    }
    default:
        return ZO_FAIL(ZO_ERR_INTERNAL, "swap", "fault engine: unknown fault kind %d",
                       (int)ft.kind);
    }
}

static zo_status fault_flush(zo_io_engine *e)
{
    return zo_io_engine_flush(as_fault(e)->inner);
}

/* Map a shortened copy back to the request the store submitted. */
static zo_io_req *fault_unshadow(fault_engine *f, zo_io_req *r)
{
    for (shadow_req **p = &f->shadows; *p; p = &(*p)->next) {
        if (&(*p)->req != r)
            continue;
        shadow_req *sh = *p;
        zo_io_req *orig = sh->orig;
        orig->result = sh->req.result;
        *p = sh->next;
        free(sh);
        return orig;
    }
    return r;
}

static int fault_reap(zo_io_engine *e, zo_io_req **done, int max, int wait)
{
    fault_engine *f = as_fault(e);
    int n = 0;
    while (n < max && f->nfake)
        done[n++] = f->fake[--f->nfake];
    int m = f->inner->ops->reap(f->inner, done + n, max - n, wait && n == 0);
    if (m < 0)
        return m;
    for (int i = n; i < n + m; i++)
        done[i] = fault_unshadow(f, done[i]);
    return n + m;
}

static void fault_wake(zo_io_engine *e)
{
    as_fault(e)->inner->ops->wake(as_fault(e)->inner);
}

static void fault_destroy(zo_io_engine *e)
{
    fault_engine *f = as_fault(e);
    if (!f)
        return;
    if (f->inner)
        f->inner->ops->destroy(f->inner);
    while (f->shadows) {
        shadow_req *next = f->shadows->next;
        free(f->shadows);
        f->shadows = next;
    }
    pthread_mutex_destroy(&f->mu);
    free(f->faults);
    free(f->fake);
    free(f);
}

static zo_status fault_create(const zo_io_engine_args *a, zo_io_engine **out)
{
    zo_io_engine *inner = a->inner;
    *out = NULL;
    if (!inner)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap", "fault engine: no engine to wrap");
    fault_engine *f = calloc(1, sizeof *f);
    zo_io_req **fake = calloc(inner->queue_depth + 1, sizeof *fake);
    if (!f || !fake) {
        free(f);
        free(fake);
        inner->ops->destroy(inner);
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "swap", "fault engine: out of memory");
    }
    f->base.ops = &zo_io_fault_ops;
    f->base.queue_depth = inner->queue_depth;
    snprintf(f->base.name, sizeof f->base.name, "fault+%.48s", inner->name);
    f->inner = inner;
    f->fake = fake;
    pthread_mutex_init(&f->mu, NULL);
    *out = &f->base;
    return ZO_OK;
}

const zo_io_engine_ops zo_io_fault_ops = {
    .name = "fault",
    .version = ZO_IO_ENGINE_OPS_VERSION,
    .caps = ZO_IO_CAP_WRAPPER,
    .create = fault_create,
    .register_files = fault_register_files,
    .start = fault_start,
    .register_buffer = fault_register_buffer,
    .unregister_buffer = fault_unregister_buffer,
    .submit = fault_submit,
    .flush = fault_flush,
    .reap = fault_reap,
    .wake = fault_wake,
    .destroy = fault_destroy,
};

int zo_io_engine_is_fault(const zo_io_engine *e)
{
    return e && e->ops == &zo_io_fault_ops;
}

zo_status zo_io_fault_arm(zo_io_engine *e, const zo_swap_fault *faults, size_t n)
{
    if (!zo_io_engine_is_fault(e))
        return ZO_FAIL(ZO_ERR_STATE, "swap",
                       "faults can be armed only on a store opened with faults in its config");
    fault_engine *f = as_fault(e);
    zo_swap_fault *copy = NULL;
    if (n) {
        copy = malloc(n * sizeof *copy);
        if (!copy)
            return ZO_FAIL(ZO_ERR_NO_MEMORY, "swap", "fault engine: out of memory for %zu faults",
                           n);
        memcpy(copy, faults, n * sizeof *copy);
    }
    for (size_t i = 0; i < n; i++) {
        if ((unsigned)faults[i].kind >= ZO_SWAP_FAULT_KIND_COUNT_) {
            free(copy);
            return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap", "fault %zu has kind %d: expected 0..%d", i,
                           (int)faults[i].kind, ZO_SWAP_FAULT_KIND_COUNT_ - 1);
        }
    }
    pthread_mutex_lock(&f->mu);
    free(f->faults);
    f->faults = copy;
    f->nfaults = n;
    f->next_index = 0;
    pthread_mutex_unlock(&f->mu);
    return ZO_OK;
}
