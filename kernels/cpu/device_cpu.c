/* The cpu backend: an emulated GPU.
 *
 * Device memory is host memory counted against a hard capacity (the front end
 * enforces it). Each stream is a worker thread that runs its queue in order;
 * copies and memsets really run on that thread, so they overlap with the
 * caller and with other streams exactly as DMA engines and kernels would.
 * Events carry a generation number: a record captures the generation at
 * enqueue time, and waiting (from a stream or the host) blocks on a
 * condition variable until that generation has run. Nothing busy-waits.
 *
 * ZO_CPU_DEVICE_PCIE_GBPS (GB/s, default 0 = unthrottled) makes host<->device
 * copies take as long as they would over a link of that bandwidth, so that
 * stall and overlap figures on the emulated device resemble a real one.
 *
 * ZO_CPU_DEVICE_STRICT=1 makes device memory what it is on a GPU: out of the
 * host's reach. Allocations are mappings of their own, kept PROT_NONE while
 * no device work runs (a copy, a memset or a task on a stream worker opens
 * them all while it runs), and the device does not claim
 * ZO_DEVCAP_HOST_ADDRESSABLE: a host thread that reads or writes device
 * memory faults here as it would on CUDA. What runs beside device work is
 * not caught, so tests use it where the host code under test runs alone. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "device_impl.h"

#define SUBSYS "device"

typedef enum { OP_COPY, OP_MEMSET, OP_TASK, OP_RECORD, OP_WAIT } op_kind;

typedef struct cpu_event {
    uint64_t rec_gen;  /* generation of the latest record enqueued */
    uint64_t done_gen; /* generation of the latest record executed */
    uint64_t t_ns;     /* when the latest record executed */
    int refs;          /* queued ops that reference this event, +1 while alive */
    int destroyed;
} cpu_event;

typedef struct cpu_op {
    struct cpu_op *next;
    op_kind kind;
    void *dst;
    const void *src;
    size_t n;
    int value;
    int is_link_copy; /* h2d or d2h: throttled by the emulated PCIe bandwidth */
    zo_stream_task *task;
    cpu_event *ev;
    uint64_t gen;
} cpu_op;

/* ZO_CPU_DEVICE_STRICT: the device's mappings and the device work running. */
typedef struct strict_map {
    void *p;
    size_t len;
} strict_map;

typedef struct cpu_strict {
    int on;
    pthread_mutex_t mu;
    strict_map *maps;
    size_t n, cap;
    int active; /* copies, memsets and tasks running on the workers */
} cpu_strict;

typedef struct cpu_dev {
    pthread_mutex_t ev_mu; /* guards every cpu_event of this device */
    pthread_cond_t ev_cv;  /* broadcast when any record executes */
    double link_gbps;
    cpu_strict strict;
} cpu_dev;

typedef struct cpu_stream {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* the queue got work or stop was set */
    pthread_cond_t idle_cv; /* done_seq advanced */
    cpu_op *head, *tail;
    uint64_t enq_seq, done_seq;
    int stop;
    cpu_dev *cd;
} cpu_stream;

static cpu_dev *devof(zo_device_t dev)
{
    return (cpu_dev *)dev->impl;
}

/* ---- strict mode: device memory the host cannot touch ---- */

static int strict_prot(const cpu_strict *st)
{
    return st->active ? PROT_READ | PROT_WRITE : PROT_NONE;
}

/* Every mapping to prot; under st->mu. A failure leaves the memory as it was,
 * which only weakens the check: said, not fatal. */
static void strict_protect_all(cpu_strict *st, int prot)
{
    for (size_t i = 0; i < st->n; i++)
        if (mprotect(st->maps[i].p, st->maps[i].len, prot) != 0)
            ZO_LOGW(SUBSYS, "strict device memory: mprotect of %zu bytes failed: %s",
                    st->maps[i].len, strerror(errno));
}

/* Device work starts (enter) or ends (leave) on a worker: the first opens
 * the device's memory, the last closes it again. */
static void strict_enter(cpu_strict *st)
{
    if (!st->on)
        return;
    pthread_mutex_lock(&st->mu);
    if (st->active++ == 0)
        strict_protect_all(st, PROT_READ | PROT_WRITE);
    pthread_mutex_unlock(&st->mu);
}

static void strict_leave(cpu_strict *st)
{
    if (!st->on)
        return;
    pthread_mutex_lock(&st->mu);
    if (--st->active == 0)
        strict_protect_all(st, PROT_NONE);
    pthread_mutex_unlock(&st->mu);
}

static zo_status strict_alloc(cpu_strict *st, size_t bytes, void **out)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = (bytes + page - 1) / page * page;
    pthread_mutex_lock(&st->mu);
    if (st->n == st->cap) {
        size_t cap = st->cap ? 2 * st->cap : 16;
        strict_map *m = realloc(st->maps, cap * sizeof *m);
        if (!m) {
            pthread_mutex_unlock(&st->mu);
            return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "strict device memory: the mapping table");
        }
        st->maps = m;
        st->cap = cap;
    }
    void *p = mmap(NULL, len ? len : page, strict_prot(st), MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        pthread_mutex_unlock(&st->mu);
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS,
                       "strict device memory: mapping %zu bytes failed: %s", len, strerror(e));
    }
    st->maps[st->n++] = (strict_map){p, len ? len : page};
    pthread_mutex_unlock(&st->mu);
    *out = p;
    return ZO_OK;
}

static void strict_free(cpu_strict *st, void *p)
{
    pthread_mutex_lock(&st->mu);
    for (size_t i = 0; i < st->n; i++) {
        if (st->maps[i].p != p)
            continue;
        munmap(p, st->maps[i].len);
        st->maps[i] = st->maps[--st->n];
        break;
    }
    pthread_mutex_unlock(&st->mu);
}

static zo_status cpu_init(zo_device_t dev, const zo_device_config *cfg)
{
    cpu_dev *cd = calloc(1, sizeof *cd);
    if (!cd)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating the cpu device");
    pthread_mutex_init(&cd->ev_mu, NULL);
    pthread_cond_init(&cd->ev_cv, NULL);
    cd->link_gbps = zo_env_double("ZO_CPU_DEVICE_PCIE_GBPS", 0.0, 0.0, 1e4);
    cd->strict.on = (int)zo_env_int("ZO_CPU_DEVICE_STRICT", 0, 0, 1);
    pthread_mutex_init(&cd->strict.mu, NULL);
    dev->impl = cd;
    uint64_t cap = cfg->mem_budget ? cfg->mem_budget : ZO_CPU_DEVICE_DEFAULT_CAPACITY;
    snprintf(dev->info.backend, sizeof dev->info.backend, "cpu");
    snprintf(dev->info.name, sizeof dev->info.name, "zoffload emulated GPU (cpu)");
    dev->info.ordinal = cfg->ordinal;
    dev->info.total_mem = cap;
    dev->info.budget = cap;
    dev->info.caps = ZO_DEVCAP_ASYNC_COPY | ZO_DEVCAP_HOST_REGISTER;
    if (!cd->strict.on)
        dev->info.caps |= ZO_DEVCAP_HOST_ADDRESSABLE;
    else
        ZO_LOGI(SUBSYS, "strict device memory (ZO_CPU_DEVICE_STRICT=1): the host cannot touch it");
    return ZO_OK;
}

static void cpu_fini(zo_device_t dev)
{
    cpu_dev *cd = devof(dev);
    pthread_mutex_destroy(&cd->ev_mu);
    pthread_cond_destroy(&cd->ev_cv);
    pthread_mutex_destroy(&cd->strict.mu);
    free(cd->strict.maps);
    free(cd);
}

static zo_status cpu_mem_alloc(zo_device_t dev, size_t bytes, void **out)
{
    if (devof(dev)->strict.on)
        return strict_alloc(&devof(dev)->strict, bytes, out);
    void *p = NULL;
    /* 256-byte alignment, as cudaMalloc guarantees. */
    if (posix_memalign(&p, 256, bytes) != 0)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS,
                       "host memory for a %zu-byte emulated device allocation", bytes);
    *out = p;
    return ZO_OK;
}

static void cpu_mem_free(zo_device_t dev, void *p)
{
    if (devof(dev)->strict.on)
        strict_free(&devof(dev)->strict, p);
    else
        free(p);
}

static zo_status cpu_host_register(zo_device_t dev, void *p, size_t n)
{
    (void)dev;
    if (mlock(p, n) != 0) {
        int e = errno;
        return ZO_FAIL(ZO_ERR_PIN, SUBSYS, "mlock of %zu bytes failed: %s%s", n, strerror(e),
                       e == ENOMEM || e == EPERM
                           ? " (RLIMIT_MEMLOCK too low: raise it with 'ulimit -l unlimited' or "
                             "memlock in /etc/security/limits.conf)"
                           : "");
    }
    return ZO_OK;
}

static void cpu_host_unregister(zo_device_t dev, void *p, size_t n)
{
    (void)dev;
    munlock(p, n);
}

/* ---- events ---- */

static void event_unref_locked(cpu_event *e)
{
    if (--e->refs == 0)
        free(e);
}

static zo_status cpu_event_create(zo_event_t ev)
{
    cpu_event *e = calloc(1, sizeof *e);
    if (!e)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating an event");
    e->refs = 1;
    ev->impl = e;
    return ZO_OK;
}

static void cpu_event_destroy(zo_event_t ev)
{
    cpu_dev *cd = devof(ev->dev);
    pthread_mutex_lock(&cd->ev_mu);
    cpu_event *e = ev->impl;
    e->destroyed = 1;
    event_unref_locked(e);
    pthread_mutex_unlock(&cd->ev_mu);
}

static zo_status cpu_event_query(zo_event_t ev)
{
    cpu_dev *cd = devof(ev->dev);
    cpu_event *e = ev->impl;
    pthread_mutex_lock(&cd->ev_mu);
    int done = e->done_gen >= e->rec_gen;
    pthread_mutex_unlock(&cd->ev_mu);
    return done ? ZO_OK : ZO_NOT_READY;
}

static zo_status cpu_event_sync(zo_event_t ev)
{
    cpu_dev *cd = devof(ev->dev);
    cpu_event *e = ev->impl;
    pthread_mutex_lock(&cd->ev_mu);
    uint64_t target = e->rec_gen;
    while (e->done_gen < target)
        pthread_cond_wait(&cd->ev_cv, &cd->ev_mu);
    pthread_mutex_unlock(&cd->ev_mu);
    return ZO_OK;
}

static zo_status cpu_event_elapsed(zo_event_t a, zo_event_t b, float *ms)
{
    cpu_dev *cd = devof(a->dev);
    cpu_event *ea = a->impl, *eb = b->impl;
    pthread_mutex_lock(&cd->ev_mu);
    int ok =
        ea->rec_gen && eb->rec_gen && ea->done_gen >= ea->rec_gen && eb->done_gen >= eb->rec_gen;
    double d = ((double)eb->t_ns - (double)ea->t_ns) / 1e6;
    pthread_mutex_unlock(&cd->ev_mu);
    if (!ok)
        return ZO_FAIL(ZO_ERR_STATE, SUBSYS, "elapsed time needs two recorded, completed events");
    *ms = (float)d;
    return ZO_OK;
}

/* ---- the stream worker ---- */

static void throttle_copy(cpu_dev *cd, size_t n, uint64_t t0)
{
    if (cd->link_gbps <= 0)
        return;
    uint64_t want = (uint64_t)((double)n / cd->link_gbps); /* bytes / (GB/s) = ns */
    uint64_t spent = zo_now_ns() - t0;
    if (spent >= want)
        return;
    uint64_t left = want - spent;
    struct timespec ts = {(time_t)(left / 1000000000ull), (long)(left % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Copies, memsets and tasks touch device memory (strict mode opens it for them). */
static int op_touches_memory(const cpu_op *op)
{
    return op->kind == OP_COPY || op->kind == OP_MEMSET || op->kind == OP_TASK;
}

static void run_op(cpu_stream *cs, cpu_op *op)
{
    cpu_dev *cd = cs->cd;
    switch (op->kind) {
    case OP_COPY: {
        uint64_t t0 = zo_now_ns();
        memmove(op->dst, op->src, op->n);
        if (op->is_link_copy)
            throttle_copy(cd, op->n, t0);
        break;
    }
    case OP_MEMSET: memset(op->dst, op->value, op->n); break;
    case OP_TASK: zo_stream_task_run(op->task); break;
    case OP_RECORD:
        pthread_mutex_lock(&cd->ev_mu);
        if (op->ev->done_gen < op->gen)
            op->ev->done_gen = op->gen;
        op->ev->t_ns = zo_now_ns();
        event_unref_locked(op->ev);
        pthread_cond_broadcast(&cd->ev_cv);
        pthread_mutex_unlock(&cd->ev_mu);
        break;
    case OP_WAIT:
        pthread_mutex_lock(&cd->ev_mu);
        while (op->ev->done_gen < op->gen)
            pthread_cond_wait(&cd->ev_cv, &cd->ev_mu);
        event_unref_locked(op->ev);
        pthread_mutex_unlock(&cd->ev_mu);
        break;
    }
}

static void *stream_main(void *arg)
{
    cpu_stream *cs = arg;
    pthread_mutex_lock(&cs->mu);
    for (;;) {
        while (!cs->head && !cs->stop)
            pthread_cond_wait(&cs->work_cv, &cs->mu);
        if (!cs->head)
            break; /* stop requested and the queue is drained */
        cpu_op *op = cs->head;
        cs->head = op->next;
        if (!cs->head)
            cs->tail = NULL;
        pthread_mutex_unlock(&cs->mu);
        int opens = op_touches_memory(op);
        if (opens)
            strict_enter(&cs->cd->strict);
        run_op(cs, op);
        if (opens)
            strict_leave(&cs->cd->strict);
        free(op);
        pthread_mutex_lock(&cs->mu);
        cs->done_seq++;
        pthread_cond_broadcast(&cs->idle_cv);
    }
    pthread_mutex_unlock(&cs->mu);
    return NULL;
}

static zo_status push_op(zo_stream_t s, cpu_op *op)
{
    cpu_stream *cs = s->impl;
    op->next = NULL;
    pthread_mutex_lock(&cs->mu);
    if (cs->tail)
        cs->tail->next = op;
    else
        cs->head = op;
    cs->tail = op;
    cs->enq_seq++;
    pthread_cond_signal(&cs->work_cv);
    pthread_mutex_unlock(&cs->mu);
    return ZO_OK;
}

static cpu_op *op_new(op_kind kind)
{
    cpu_op *op = calloc(1, sizeof *op);
    if (op)
        op->kind = kind;
    return op;
}

static zo_status cpu_stream_create(zo_stream_t s)
{
    cpu_stream *cs = calloc(1, sizeof *cs);
    if (!cs)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating a stream");
    cs->cd = devof(s->dev);
    pthread_mutex_init(&cs->mu, NULL);
    pthread_cond_init(&cs->work_cv, NULL);
    pthread_cond_init(&cs->idle_cv, NULL);
    int rc = pthread_create(&cs->thread, NULL, stream_main, cs);
    if (rc != 0) {
        pthread_mutex_destroy(&cs->mu);
        pthread_cond_destroy(&cs->work_cv);
        pthread_cond_destroy(&cs->idle_cv);
        free(cs);
        return ZO_FAIL(ZO_ERR_SYSTEM, SUBSYS, "starting a stream worker thread: %s", strerror(rc));
    }
    s->impl = cs;
    return ZO_OK;
}

static void cpu_stream_destroy(zo_stream_t s)
{
    cpu_stream *cs = s->impl;
    pthread_mutex_lock(&cs->mu);
    cs->stop = 1;
    pthread_cond_signal(&cs->work_cv);
    pthread_mutex_unlock(&cs->mu);
    pthread_join(cs->thread, NULL);
    pthread_mutex_destroy(&cs->mu);
    pthread_cond_destroy(&cs->work_cv);
    pthread_cond_destroy(&cs->idle_cv);
    free(cs);
}

static zo_status cpu_stream_sync(zo_stream_t s)
{
    cpu_stream *cs = s->impl;
    pthread_mutex_lock(&cs->mu);
    uint64_t target = cs->enq_seq;
    while (cs->done_seq < target)
        pthread_cond_wait(&cs->idle_cv, &cs->mu);
    pthread_mutex_unlock(&cs->mu);
    return ZO_OK;
}

static zo_status cpu_stream_query(zo_stream_t s)
{
    cpu_stream *cs = s->impl;
    pthread_mutex_lock(&cs->mu);
    int idle = cs->done_seq == cs->enq_seq;
    pthread_mutex_unlock(&cs->mu);
    return idle ? ZO_OK : ZO_NOT_READY;
}

static zo_status cpu_event_record(zo_event_t ev, zo_stream_t s)
{
    cpu_dev *cd = devof(s->dev);
    cpu_op *op = op_new(OP_RECORD);
    if (!op)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating an event record");
    cpu_event *e = ev->impl;
    pthread_mutex_lock(&cd->ev_mu);
    op->gen = ++e->rec_gen;
    op->ev = e;
    e->refs++;
    pthread_mutex_unlock(&cd->ev_mu);
    return push_op(s, op);
}

static zo_status cpu_stream_wait_event(zo_stream_t s, zo_event_t ev)
{
    cpu_dev *cd = devof(s->dev);
    cpu_event *e = ev->impl;
    pthread_mutex_lock(&cd->ev_mu);
    uint64_t target = e->rec_gen;
    if (e->done_gen >= target) { /* already complete, or never recorded */
        pthread_mutex_unlock(&cd->ev_mu);
        return ZO_OK;
    }
    cpu_op *op = op_new(OP_WAIT);
    if (!op) {
        pthread_mutex_unlock(&cd->ev_mu);
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating an event wait");
    }
    op->gen = target;
    op->ev = e;
    e->refs++;
    pthread_mutex_unlock(&cd->ev_mu);
    return push_op(s, op);
}

static zo_status cpu_copy(zo_stream_t s, void *dst, const void *src, size_t n, zo_copy_kind kind)
{
    cpu_op *op = op_new(OP_COPY);
    if (!op)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating a copy");
    op->dst = dst;
    op->src = src;
    op->n = n;
    op->is_link_copy = kind != ZO_COPY_D2D;
    return push_op(s, op);
}

static zo_status cpu_memset(zo_stream_t s, void *dst, int value, size_t n)
{
    cpu_op *op = op_new(OP_MEMSET);
    if (!op)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating a memset");
    op->dst = dst;
    op->value = value;
    op->n = n;
    return push_op(s, op);
}

static zo_status cpu_enqueue(zo_stream_t s, zo_stream_task *t)
{
    cpu_op *op = op_new(OP_TASK);
    if (!op)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating a stream task");
    op->task = t;
    return push_op(s, op);
}

/* The emulated GPU is always there. */
static int cpu_device_count(void)
{
    return 1;
}

const zo_backend_ops zo_cpu_backend = {
    .name = "cpu",
    .version = ZO_BACKEND_OPS_VERSION,
    .caps = 0, /* its streams are worker threads: no native handle, nothing to wrap */
    .device_count = cpu_device_count,
    .init = cpu_init,
    .fini = cpu_fini,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .host_register = cpu_host_register,
    .host_unregister = cpu_host_unregister,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_sync = cpu_stream_sync,
    .stream_query = cpu_stream_query,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_query = cpu_event_query,
    .event_sync = cpu_event_sync,
    .event_elapsed_ms = cpu_event_elapsed,
    .copy = cpu_copy,
    .memset = cpu_memset,
    .enqueue = cpu_enqueue,
};
