/* The device front end: argument checks, budget and allocation registry,
 * statistics and asynchronous error keeping, over a backend table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_impl.h"

#define SUBSYS "device"

/* ---- range sets ---- */

static size_t range_lower_bound(const zo_range_set *rs, uintptr_t p)
{
    size_t lo = 0, hi = rs->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (rs->v[mid].base < p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Index of the range containing [p, p+n), or -1. */
static long range_find(const zo_range_set *rs, uintptr_t p, size_t n)
{
    size_t i = range_lower_bound(rs, p + 1);
    if (i == 0)
        return -1;
    const zo_range *r = &rs->v[i - 1];
    if (p >= r->base && p - r->base <= r->size && n <= r->size - (p - r->base))
        return (long)(i - 1);
    return -1;
}

static int range_overlaps(const zo_range_set *rs, uintptr_t p, size_t n)
{
    size_t i = range_lower_bound(rs, p);
    if (i < rs->n && rs->v[i].base < p + n)
        return 1;
    if (i > 0 && rs->v[i - 1].base + rs->v[i - 1].size > p)
        return 1;
    return 0;
}

static int range_insert(zo_range_set *rs, uintptr_t p, size_t n)
{
    if (rs->n == rs->cap) {
        size_t cap = rs->cap ? rs->cap * 2 : 64;
        zo_range *v = realloc(rs->v, cap * sizeof *v);
        if (!v)
            return -1;
        rs->v = v;
        rs->cap = cap;
    }
    size_t i = range_lower_bound(rs, p);
    memmove(&rs->v[i + 1], &rs->v[i], (rs->n - i) * sizeof *rs->v);
    rs->v[i] = (zo_range){p, n};
    rs->n++;
    return 0;
}

/* Remove the range starting exactly at p; returns its size or 0. */
static size_t range_remove(zo_range_set *rs, uintptr_t p)
{
    size_t i = range_lower_bound(rs, p);
    if (i >= rs->n || rs->v[i].base != p)
        return 0;
    size_t n = rs->v[i].size;
    memmove(&rs->v[i], &rs->v[i + 1], (rs->n - i - 1) * sizeof *rs->v);
    rs->n--;
    return n;
}

/* ---- devices ---- */

int zo_device_cuda_built(void)
{
    return zo_device_backend_find("cuda") != NULL;
}

int zo_device_cuda_count(void)
{
    const zo_backend_ops *cuda = zo_device_backend_find("cuda");
    return cuda ? cuda->device_count() : 0;
}

zo_status zo_device_init(zo_device_t *out, const zo_device_config *cfg)
{
    if (!out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "out is NULL");
    *out = NULL;
    zo_device_config def = ZO_DEVICE_CONFIG_INIT;
    if (!cfg)
        cfg = &def;
    if (cfg->struct_size != sizeof(zo_device_config))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "zo_device_config.struct_size is %zu, expected %zu: initialize it with "
                       "ZO_DEVICE_CONFIG_INIT",
                       cfg->struct_size, sizeof(zo_device_config));
    if (cfg->ordinal < 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "device ordinal %d is negative", cfg->ordinal);
    const zo_backend_ops *be = NULL;
    ZO_TRY(zo_device_backend_pick(cfg->backend, &be));

    zo_device_t dev = calloc(1, sizeof *dev);
    if (!dev)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating the device object");
    dev->be = be;
    dev->info = (zo_device_info)ZO_DEVICE_INFO_INIT;
    pthread_mutex_init(&dev->mem_mu, NULL);
    pthread_mutex_init(&dev->obj_mu, NULL);
    zo_status st = be->init(dev, cfg);
    if (st != ZO_OK) {
        pthread_mutex_destroy(&dev->mem_mu);
        pthread_mutex_destroy(&dev->obj_mu);
        free(dev);
        return st;
    }
    dev->budget = dev->info.budget;
    ZO_LOGI(SUBSYS, "device %s '%s' ready, budget %llu bytes", be->name, dev->info.name,
            (unsigned long long)dev->budget);
    *out = dev;
    return ZO_OK;
}

void zo_device_free(zo_device_t dev)
{
    if (!dev)
        return;
    zo_device_synchronize(dev);
    while (dev->streams)
        zo_stream_destroy(dev->streams);
    while (dev->events)
        zo_event_destroy(dev->events);
    pthread_mutex_lock(&dev->mem_mu);
    for (size_t i = 0; i < dev->pinned.n; i++)
        dev->be->host_unregister(dev, (void *)dev->pinned.v[i].base, dev->pinned.v[i].size);
    for (size_t i = 0; i < dev->allocs.n; i++)
        dev->be->mem_free(dev, (void *)dev->allocs.v[i].base);
    if (dev->allocs.n)
        ZO_LOGW(SUBSYS, "device freed with %zu allocations (%llu bytes) still live; released them",
                dev->allocs.n, (unsigned long long)dev->in_use);
    free(dev->pinned.v);
    free(dev->allocs.v);
    pthread_mutex_unlock(&dev->mem_mu);
    dev->be->fini(dev);
    if (dev->drill.release)
        dev->drill.release(dev->drill.ctx);
    pthread_mutex_destroy(&dev->mem_mu);
    pthread_mutex_destroy(&dev->obj_mu);
    free(dev);
}

const char *zo_device_backend(zo_device_t dev)
{
    return dev ? dev->be->name : "none";
}

unsigned zo_device_caps(zo_device_t dev)
{
    return dev ? dev->info.caps : 0;
}

zo_status zo_device_get_info(zo_device_t dev, zo_device_info *out)
{
    if (!dev || !out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "device or out is NULL");
    if (out->struct_size != sizeof *out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "zo_device_info.struct_size is %zu, expected %zu: use ZO_DEVICE_INFO_INIT",
                       out->struct_size, sizeof *out);
    *out = dev->info;
    return ZO_OK;
}

zo_status zo_device_mem_get_stats(zo_device_t dev, zo_device_mem_stats *out)
{
    if (!dev || !out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "device or out is NULL");
    pthread_mutex_lock(&dev->mem_mu);
    out->budget = dev->budget;
    out->in_use = dev->in_use;
    out->high_water = dev->high_water;
    out->n_allocs = dev->allocs.n;
    out->n_failed = dev->n_failed;
    pthread_mutex_unlock(&dev->mem_mu);
    return ZO_OK;
}

void zo_device_mem_reset_high_water(zo_device_t dev)
{
    if (!dev)
        return;
    pthread_mutex_lock(&dev->mem_mu);
    dev->high_water = dev->in_use;
    pthread_mutex_unlock(&dev->mem_mu);
}

zo_status zo_device_synchronize(zo_device_t dev)
{
    if (!dev)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "device is NULL");
    zo_status first = ZO_OK;
    pthread_mutex_lock(&dev->obj_mu);
    for (zo_stream_t s = dev->streams; s; s = s->next) {
        zo_status st = zo_stream_synchronize(s);
        if (st < 0 && first == ZO_OK)
            first = st;
    }
    pthread_mutex_unlock(&dev->obj_mu);
    return first;
}

/* Whether the attached fault drill fails the next operation of kind; call
 * with mem_mu held. */
static int drill_fails(zo_device_t dev, int kind)
{
    return dev->drill.fails && dev->drill.fails(dev->drill.ctx, kind);
}

static int drill_take(zo_device_t dev, int kind)
{
    pthread_mutex_lock(&dev->mem_mu);
    int hit = drill_fails(dev, kind);
    pthread_mutex_unlock(&dev->mem_mu);
    return hit;
}

/* ---- memory ---- */

zo_status zo_device_malloc(zo_device_t dev, size_t bytes, void **out)
{
    if (!dev || !out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "device or out is NULL");
    *out = NULL;
    if (bytes == 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zero-byte device allocation");
    pthread_mutex_lock(&dev->mem_mu);
    int injected = drill_fails(dev, ZO_DRILL_DEVICE_MALLOC);
    if (injected || bytes > dev->budget - dev->in_use) {
        dev->n_failed++;
        uint64_t in_use = dev->in_use, budget = dev->budget;
        pthread_mutex_unlock(&dev->mem_mu);
        return ZO_FAIL(ZO_ERR_OUT_OF_DEVICE_MEMORY, SUBSYS,
                       "cannot allocate %zu bytes on %s: %llu of %llu bytes in use, %llu free%s",
                       bytes, dev->be->name, (unsigned long long)in_use, (unsigned long long)budget,
                       (unsigned long long)(budget - in_use), injected ? " (injected fault)" : "");
    }
    /* Reserve before the backend call so concurrent allocations cannot
     * overshoot the budget together. */
    dev->in_use += bytes;
    pthread_mutex_unlock(&dev->mem_mu);

    void *p = NULL;
    zo_status st = dev->be->mem_alloc(dev, bytes, &p);
    pthread_mutex_lock(&dev->mem_mu);
    if (st == ZO_OK && range_insert(&dev->allocs, (uintptr_t)p, bytes) != 0) {
        dev->be->mem_free(dev, p);
        st = ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "growing the allocation registry");
    }
    if (st != ZO_OK) {
        dev->in_use -= bytes;
        dev->n_failed++;
    } else if (dev->in_use > dev->high_water) {
        dev->high_water = dev->in_use;
    }
    pthread_mutex_unlock(&dev->mem_mu);
    if (st == ZO_OK)
        *out = p;
    return st;
}

zo_status zo_device_mfree(zo_device_t dev, void *ptr)
{
    if (!dev)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "device is NULL");
    if (!ptr)
        return ZO_OK;
    pthread_mutex_lock(&dev->mem_mu);
    size_t n = range_remove(&dev->allocs, (uintptr_t)ptr);
    if (n == 0) {
        pthread_mutex_unlock(&dev->mem_mu);
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "%p is not a live device allocation (double free, or a pointer not returned "
                       "by zo_device_malloc)",
                       ptr);
    }
    dev->in_use -= n;
    pthread_mutex_unlock(&dev->mem_mu);
    dev->be->mem_free(dev, ptr);
    return ZO_OK;
}

int zo_device_owns(zo_device_t dev, const void *ptr, size_t bytes)
{
    if (!dev || !ptr)
        return 0;
    pthread_mutex_lock(&dev->mem_mu);
    int own = range_find(&dev->allocs, (uintptr_t)ptr, bytes) >= 0;
    pthread_mutex_unlock(&dev->mem_mu);
    return own;
}

zo_status zo_device_host_register(zo_device_t dev, void *ptr, size_t bytes)
{
    if (!dev || !ptr || !bytes)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "host_register needs a device, a pointer and a size");
    if (drill_take(dev, ZO_DRILL_HOST_REGISTER))
        return ZO_FAIL(ZO_ERR_PIN, SUBSYS, "pinning %zu bytes at %p failed (injected fault)", bytes,
                       ptr);
    pthread_mutex_lock(&dev->mem_mu);
    if (range_overlaps(&dev->pinned, (uintptr_t)ptr, bytes)) {
        pthread_mutex_unlock(&dev->mem_mu);
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "host range %p+%zu overlaps a range already registered", ptr, bytes);
    }
    if (range_insert(&dev->pinned, (uintptr_t)ptr, bytes) != 0) {
        pthread_mutex_unlock(&dev->mem_mu);
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "growing the pinned-range registry");
    }
    pthread_mutex_unlock(&dev->mem_mu);
    zo_status st = dev->be->host_register(dev, ptr, bytes);
    if (st != ZO_OK) {
        pthread_mutex_lock(&dev->mem_mu);
        range_remove(&dev->pinned, (uintptr_t)ptr);
        pthread_mutex_unlock(&dev->mem_mu);
    }
    return st;
}

zo_status zo_device_host_unregister(zo_device_t dev, void *ptr)
{
    if (!dev || !ptr)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "device or pointer is NULL");
    pthread_mutex_lock(&dev->mem_mu);
    size_t n = range_remove(&dev->pinned, (uintptr_t)ptr);
    pthread_mutex_unlock(&dev->mem_mu);
    if (!n)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "%p is not the start of a registered host range",
                       ptr);
    dev->be->host_unregister(dev, ptr, n);
    return ZO_OK;
}

/* ---- streams ---- */

static void list_push(void **head, void *node, size_t next_off, size_t prev_off)
{
    void *h = *head;
    *(void **)((char *)node + next_off) = h;
    *(void **)((char *)node + prev_off) = NULL;
    if (h)
        *(void **)((char *)h + prev_off) = node;
    *head = node;
}

static void list_unlink(void **head, void *node, size_t next_off, size_t prev_off)
{
    void *n = *(void **)((char *)node + next_off);
    void *p = *(void **)((char *)node + prev_off);
    if (p)
        *(void **)((char *)p + next_off) = n;
    else
        *head = n;
    if (n)
        *(void **)((char *)n + prev_off) = p;
}

#define LIST_PUSH(head, node, T)                                                                   \
    list_push((void **)(head), (node), offsetof(struct T, next), offsetof(struct T, prev))
#define LIST_UNLINK(head, node, T)                                                                 \
    list_unlink((void **)(head), (node), offsetof(struct T, next), offsetof(struct T, prev))

/* A stream object the backend then opens (create) or adopts (wrap). */
static zo_status stream_new(zo_device_t dev, zo_stream_t *s)
{
    *s = calloc(1, sizeof **s);
    if (!*s)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating a stream");
    (*s)->dev = dev;
    pthread_mutex_init(&(*s)->err_mu, NULL);
    return ZO_OK;
}

/* The backend refused the stream: free it. Otherwise list it on its device. */
static zo_status stream_publish(zo_stream_t s, zo_status st, zo_stream_t *out)
{
    if (st != ZO_OK) {
        pthread_mutex_destroy(&s->err_mu);
        free(s);
        return st;
    }
    pthread_mutex_lock(&s->dev->obj_mu);
    LIST_PUSH(&s->dev->streams, s, zo_stream);
    pthread_mutex_unlock(&s->dev->obj_mu);
    *out = s;
    return ZO_OK;
}

zo_status zo_stream_create(zo_device_t dev, zo_stream_t *out)
{
    if (!dev || !out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "device or out is NULL");
    *out = NULL;
    zo_stream_t s;
    ZO_TRY(stream_new(dev, &s));
    return stream_publish(s, dev->be->stream_create(s), out);
}

zo_status zo_stream_wrap(zo_device_t dev, void *native, zo_stream_t *out)
{
    if (!dev || !out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "device or out is NULL");
    *out = NULL;
    if (!dev->be->stream_wrap)
        return ZO_FAIL(ZO_ERR_UNSUPPORTED, SUBSYS,
                       "the %s device has no native stream to wrap (the cpu device's streams "
                       "are its own worker threads): use zo_stream_create",
                       dev->be->name);
    zo_stream_t s;
    ZO_TRY(stream_new(dev, &s));
    s->wrapped = 1;
    return stream_publish(s, dev->be->stream_wrap(s, native), out);
}

/* Hand a kept async error to the caller's thread and clear it. */
static zo_status take_stream_error(zo_stream_t s)
{
    pthread_mutex_lock(&s->err_mu);
    zo_status st = s->err;
    char msg[ZO_ASYNC_MSG_CAP];
    memcpy(msg, s->err_msg, sizeof msg);
    s->err = ZO_OK;
    s->err_msg[0] = '\0';
    pthread_mutex_unlock(&s->err_mu);
    if (st != ZO_OK)
        ZO_FAIL(st, SUBSYS, "asynchronous failure on a stream: %s", msg);
    return st;
}

zo_status zo_stream_destroy(zo_stream_t s)
{
    if (!s)
        return ZO_OK;
    zo_device_t dev = s->dev;
    zo_status st = dev->be->stream_sync(s);
    zo_status ast = take_stream_error(s);
    zo_stream_ops_ctx *ctx = atomic_exchange(&s->ops_ctx, NULL);
    if (ctx)
        ctx->free_fn(ctx);
    if (!s->wrapped)
        dev->be->stream_destroy(s);
    pthread_mutex_lock(&dev->obj_mu);
    LIST_UNLINK(&dev->streams, s, zo_stream);
    pthread_mutex_unlock(&dev->obj_mu);
    pthread_mutex_destroy(&s->err_mu);
    free(s);
    return st != ZO_OK ? st : ast;
}

zo_status zo_stream_synchronize(zo_stream_t s)
{
    if (!s)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "stream is NULL");
    ZO_TRY(s->dev->be->stream_sync(s));
    return take_stream_error(s);
}

zo_status zo_stream_query(zo_stream_t s)
{
    if (!s)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "stream is NULL");
    return s->dev->be->stream_query(s);
}

zo_device_t zo_stream_device(zo_stream_t s)
{
    return s ? s->dev : NULL;
}

void *zo_stream_native(zo_stream_t s)
{
    return s && (s->dev->be->caps & ZO_BACKEND_CAP_NATIVE_STREAMS) ? s->impl : NULL;
}

/* ---- events ---- */

zo_status zo_event_create(zo_device_t dev, zo_event_t *out)
{
    if (!dev || !out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "device or out is NULL");
    *out = NULL;
    zo_event_t ev = calloc(1, sizeof *ev);
    if (!ev)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating an event");
    ev->dev = dev;
    pthread_mutex_init(&ev->err_mu, NULL);
    zo_status st = dev->be->event_create(ev);
    if (st != ZO_OK) {
        pthread_mutex_destroy(&ev->err_mu);
        free(ev);
        return st;
    }
    pthread_mutex_lock(&dev->obj_mu);
    LIST_PUSH(&dev->events, ev, zo_event);
    pthread_mutex_unlock(&dev->obj_mu);
    *out = ev;
    return ZO_OK;
}

zo_status zo_event_destroy(zo_event_t ev)
{
    if (!ev)
        return ZO_OK;
    zo_device_t dev = ev->dev;
    /* A pending error snapshot task references the event: let it finish. */
    dev->be->event_sync(ev);
    dev->be->event_destroy(ev);
    pthread_mutex_lock(&dev->obj_mu);
    LIST_UNLINK(&dev->events, ev, zo_event);
    pthread_mutex_unlock(&dev->obj_mu);
    pthread_mutex_destroy(&ev->err_mu);
    free(ev);
    return ZO_OK;
}

static zo_status check_same_device(zo_event_t ev, zo_stream_t s)
{
    if (!ev || !s)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "event or stream is NULL");
    if (ev->dev != s->dev)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "event and stream belong to different devices");
    return ZO_OK;
}

static zo_stream_task *task_new(zo_stream_t s, zo_stream_fn fn, const void *arg, size_t arg_size)
{
    zo_stream_task *t = malloc(sizeof *t + arg_size);
    if (!t)
        return NULL;
    t->stream = s;
    t->fn = fn;
    t->snapshot_ev = NULL;
    if (arg_size) {
        memcpy(t->data, arg, arg_size);
        t->arg = t->data;
    } else {
        t->arg = (void *)arg;
    }
    return t;
}

zo_status zo_event_record(zo_event_t ev, zo_stream_t s)
{
    ZO_TRY(check_same_device(ev, s));
    pthread_mutex_lock(&ev->err_mu);
    ev->err = ZO_OK;
    ev->err_msg[0] = '\0';
    pthread_mutex_unlock(&ev->err_mu);
    if (atomic_load(&s->has_tasks)) {
        /* Tasks may fail asynchronously: carry the stream's error state into
         * the event in stream order, so waiting on the event reports it. */
        zo_stream_task *t = task_new(s, NULL, NULL, 0);
        if (!t)
            return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating an event snapshot");
        t->snapshot_ev = ev;
        ZO_TRY(s->dev->be->enqueue(s, t));
    }
    return s->dev->be->event_record(ev, s);
}

zo_status zo_stream_wait_event(zo_stream_t s, zo_event_t ev)
{
    ZO_TRY(check_same_device(ev, s));
    return s->dev->be->stream_wait_event(s, ev);
}

static zo_status take_event_error(zo_event_t ev)
{
    pthread_mutex_lock(&ev->err_mu);
    zo_status st = ev->err;
    char msg[ZO_ASYNC_MSG_CAP];
    memcpy(msg, ev->err_msg, sizeof msg);
    pthread_mutex_unlock(&ev->err_mu);
    if (st != ZO_OK)
        ZO_FAIL(st, SUBSYS, "asynchronous failure before the event: %s", msg);
    return st;
}

zo_status zo_event_query(zo_event_t ev)
{
    if (!ev)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "event is NULL");
    zo_status st = ev->dev->be->event_query(ev);
    if (st != ZO_OK)
        return st;
    return take_event_error(ev);
}

zo_status zo_event_synchronize(zo_event_t ev)
{
    if (!ev)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "event is NULL");
    ZO_TRY(ev->dev->be->event_sync(ev));
    return take_event_error(ev);
}

zo_status zo_event_elapsed_ms(zo_event_t start, zo_event_t end, float *ms)
{
    if (!start || !end || !ms)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "NULL argument");
    if (start->dev != end->dev)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "events belong to different devices");
    return start->dev->be->event_elapsed_ms(start, end, ms);
}

/* ---- asynchronous operations ---- */

static zo_status check_dev_range(zo_device_t dev, const void *p, size_t n, const char *what)
{
    if (!zo_device_owns(dev, p, n))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "%s %p+%zu is not inside a live device allocation of this device", what, p,
                       n);
    return ZO_OK;
}

static zo_status copy_common(zo_stream_t s, void *dst, const void *src, size_t n, zo_copy_kind kind)
{
    if (!s)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "stream is NULL");
    if (n == 0)
        return ZO_OK;
    if (!dst || !src)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "copy with a NULL pointer");
    zo_device_t dev = s->dev;
    if (kind != ZO_COPY_D2H)
        ZO_TRY(check_dev_range(dev, dst, n, "copy destination"));
    if (kind != ZO_COPY_H2D)
        ZO_TRY(check_dev_range(dev, src, n, "copy source"));
    ZO_TRY(dev->be->copy(s, dst, src, n, kind));
    switch (kind) {
    case ZO_COPY_H2D:
        atomic_fetch_add(&dev->h2d_bytes, n);
        atomic_fetch_add(&dev->h2d_ops, 1);
        break;
    case ZO_COPY_D2H:
        atomic_fetch_add(&dev->d2h_bytes, n);
        atomic_fetch_add(&dev->d2h_ops, 1);
        break;
    case ZO_COPY_D2D:
        atomic_fetch_add(&dev->d2d_bytes, n);
        atomic_fetch_add(&dev->d2d_ops, 1);
        break;
    }
    return ZO_OK;
}

zo_status zo_memcpy_h2d_async(zo_stream_t s, void *dst, const void *src, size_t n)
{
    return copy_common(s, dst, src, n, ZO_COPY_H2D);
}

zo_status zo_memcpy_d2h_async(zo_stream_t s, void *dst, const void *src, size_t n)
{
    return copy_common(s, dst, src, n, ZO_COPY_D2H);
}

zo_status zo_memcpy_d2d_async(zo_stream_t s, void *dst, const void *src, size_t n)
{
    return copy_common(s, dst, src, n, ZO_COPY_D2D);
}

zo_status zo_memset_async(zo_stream_t s, void *dst, int value, size_t n)
{
    if (!s)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "stream is NULL");
    if (n == 0)
        return ZO_OK;
    ZO_TRY(check_dev_range(s->dev, dst, n, "memset destination"));
    return s->dev->be->memset(s, dst, value, n);
}

zo_status zo_stream_enqueue(zo_stream_t s, zo_stream_fn fn, const void *arg, size_t arg_size)
{
    if (!s || !fn)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "stream or function is NULL");
    if (arg_size && !arg)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "arg_size %zu with a NULL arg", arg_size);
    zo_stream_task *t = task_new(s, fn, arg, arg_size);
    if (!t)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating a stream task");
    atomic_store(&s->has_tasks, 1);
    zo_status st = s->dev->be->enqueue(s, t);
    if (st != ZO_OK)
        free(t);
    return st;
}

static void keep_stream_error(zo_stream_t s, zo_status st, const char *msg)
{
    pthread_mutex_lock(&s->err_mu);
    if (s->err == ZO_OK) {
        s->err = st;
        snprintf(s->err_msg, sizeof s->err_msg, "%s", msg);
    }
    pthread_mutex_unlock(&s->err_mu);
}

void zo_stream_task_run(zo_stream_task *t)
{
    zo_stream_t s = t->stream;
    if (t->snapshot_ev) {
        zo_event_t ev = t->snapshot_ev;
        pthread_mutex_lock(&s->err_mu);
        zo_status st = s->err;
        char msg[ZO_ASYNC_MSG_CAP];
        memcpy(msg, s->err_msg, sizeof msg);
        pthread_mutex_unlock(&s->err_mu);
        pthread_mutex_lock(&ev->err_mu);
        ev->err = st;
        memcpy(ev->err_msg, msg, sizeof msg);
        pthread_mutex_unlock(&ev->err_mu);
    } else if (drill_take(s->dev, ZO_DRILL_STREAM_TASK)) {
        keep_stream_error(s, ZO_ERR_INTERNAL, "stream task failed (injected fault)");
    } else {
        zo_clear_error();
        zo_status st = t->fn(t->arg);
        if (st < 0) {
            const char *m = zo_last_error();
            keep_stream_error(s, st, *m ? m : zo_status_str(st));
        }
    }
    free(t);
}

zo_status zo_device_copy_get_stats(zo_device_t dev, zo_device_copy_stats *out)
{
    if (!dev || !out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "device or out is NULL");
    out->h2d_bytes = atomic_load(&dev->h2d_bytes);
    out->d2h_bytes = atomic_load(&dev->d2h_bytes);
    out->d2d_bytes = atomic_load(&dev->d2d_bytes);
    out->h2d_ops = atomic_load(&dev->h2d_ops);
    out->d2h_ops = atomic_load(&dev->d2h_ops);
    out->d2d_ops = atomic_load(&dev->d2d_ops);
    return ZO_OK;
}
