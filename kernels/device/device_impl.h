/* The device backend table (not installed). The front end (device.c)
 * validates arguments, enforces the memory budget, keeps the allocation
 * registry and statistics, and keeps asynchronous errors; a backend only
 * does the work. */
#ifndef ZO_DEVICE_IMPL_H
#define ZO_DEVICE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "zo/device.h"
#include "zo_internal.h"

/* A function enqueued on a stream, with its argument copy inline. The
 * backend calls zo_stream_task_run(t) in stream order; it frees t. */
typedef struct zo_stream_task {
    zo_stream_t stream;
    zo_stream_fn fn;
    void *arg;              /* points into data[] or is the caller's pointer */
    zo_event_t snapshot_ev; /* non-NULL: copy the stream's error into this event */
    _Alignas(16) unsigned char data[];
} zo_stream_task;

void zo_stream_task_run(zo_stream_task *t);

typedef enum { ZO_COPY_H2D, ZO_COPY_D2H, ZO_COPY_D2D } zo_copy_kind;

/* Bumped when a slot is added, removed or changes meaning. */
#define ZO_BACKEND_OPS_VERSION 1u

/* Capability flags of a backend table (zo_backend_ops.caps); what one
 * device can do is in zo_device_info.caps, filled by init. */
enum {
    ZO_BACKEND_CAP_NATIVE_STREAMS = 1u << 0, /* a stream's impl is its native handle */
};

/* Every slot is required unless marked (optional). */
typedef struct zo_backend_ops {
    const char *name;
    unsigned version; /* ZO_BACKEND_OPS_VERSION */
    unsigned caps;    /* ZO_BACKEND_CAP_* */
    /* Devices of this backend usable now; "auto" takes the first backend with one. */
    int (*device_count)(void);
    zo_status (*init)(zo_device_t dev,
                      const zo_device_config *cfg); /* fills dev->info, dev->impl */
    void (*fini)(zo_device_t dev);
    zo_status (*mem_alloc)(zo_device_t dev, size_t bytes, void **out);
    void (*mem_free)(zo_device_t dev, void *ptr);
    zo_status (*host_register)(zo_device_t dev, void *ptr, size_t bytes);
    void (*host_unregister)(zo_device_t dev, void *ptr, size_t bytes);
    zo_status (*stream_create)(zo_stream_t s);
    /* (optional) Adopt the caller's native stream; NULL: the front end refuses. */
    zo_status (*stream_wrap)(zo_stream_t s, void *native);
    /* Called after a synchronize; never for a wrapped stream, whose owner destroys it. */
    void (*stream_destroy)(zo_stream_t s);
    zo_status (*stream_sync)(zo_stream_t s);
    zo_status (*stream_query)(zo_stream_t s);
    zo_status (*event_create)(zo_event_t ev);
    void (*event_destroy)(zo_event_t ev);
    zo_status (*event_record)(zo_event_t ev, zo_stream_t s);
    zo_status (*stream_wait_event)(zo_stream_t s, zo_event_t ev);
    zo_status (*event_query)(zo_event_t ev);
    zo_status (*event_sync)(zo_event_t ev);
    zo_status (*event_elapsed_ms)(zo_event_t a, zo_event_t b, float *ms);
    zo_status (*copy)(zo_stream_t s, void *dst, const void *src, size_t bytes, zo_copy_kind kind);
    zo_status (*memset)(zo_stream_t s, void *dst, int value, size_t bytes);
    zo_status (*enqueue)(zo_stream_t s, zo_stream_task *t);
} zo_backend_ops;

typedef struct zo_range {
    uintptr_t base;
    size_t size;
} zo_range;

/* A sorted array of disjoint ranges. */
typedef struct zo_range_set {
    zo_range *v;
    size_t n, cap;
} zo_range_set;

/* The operations a fault drill can make fail. */
enum { ZO_DRILL_DEVICE_MALLOC, ZO_DRILL_HOST_REGISTER, ZO_DRILL_STREAM_TASK, ZO_DRILL_COUNT };

/* A fault drill: the tests' hooks (testing/device_testing.c, linked only
 * into test programs) attach one so that chosen operations fail as they
 * would on a real machine. The front end only asks it, under mem_mu, and
 * releases it with the device; shipped programs never attach one. */
typedef struct zo_device_drill {
    int (*fails)(void *ctx, int kind); /* 1: the next operation of kind fails */
    void (*release)(void *ctx);
    void *ctx;
} zo_device_drill;

struct zo_device {
    const zo_backend_ops *be;
    void *impl;
    zo_device_info info;
    uint64_t budget;

    pthread_mutex_t mem_mu; /* guards the fields below */
    zo_range_set allocs;
    zo_range_set pinned;
    uint64_t in_use, high_water, n_failed;
    zo_device_drill drill; /* a fault drill the tests attach; none in shipped use */

    pthread_mutex_t obj_mu; /* guards the stream and event lists */
    zo_stream_t streams;
    zo_event_t events;

    _Atomic uint64_t h2d_bytes, d2h_bytes, d2d_bytes, h2d_ops, d2h_ops, d2d_ops;
};

enum { ZO_ASYNC_MSG_CAP = 512 };

/* Per-stream state of the compute ops (kernels/ops: a cuBLAS handle, scratch
 * buffers), created lazily on a stream's first op. Implementations embed this
 * header first; zo_stream_destroy calls free_fn once the stream is idle. */
typedef struct zo_stream_ops_ctx {
    void (*free_fn)(struct zo_stream_ops_ctx *ctx);
    const struct zo_ops_backend *ops; /* the table that made it (set by ops.c) */
} zo_stream_ops_ctx;

struct zo_stream {
    zo_device_t dev;
    void *impl;
    zo_stream_t next, prev;
    pthread_mutex_t err_mu;
    zo_status err; /* first async error since the last wait */
    char err_msg[ZO_ASYNC_MSG_CAP];
    int wrapped;           /* over the caller's native stream (zo_stream_wrap) */
    _Atomic int has_tasks; /* a task was ever enqueued: records must snapshot errors */
    _Atomic(zo_stream_ops_ctx *) ops_ctx; /* NULL until the first compute op */
};

struct zo_event {
    zo_device_t dev;
    void *impl;
    zo_event_t next, prev;
    pthread_mutex_t err_mu;
    zo_status err;
    char err_msg[ZO_ASYNC_MSG_CAP];
};

extern const zo_backend_ops zo_cpu_backend;
#ifdef ZO_HAVE_CUDA
extern const zo_backend_ops zo_cuda_backend;
#endif

/* ---- the registry (backends.c) ---- */

/* The backends this build has, in the order "auto" tries them; returns the count. */
size_t zo_device_backends(const zo_backend_ops *const **out);
/* The backend named name (in any case) if this build has it, or NULL. */
const zo_backend_ops *zo_device_backend_find(const char *name);
/* ZO_OK when be is of this version and fills every required slot. */
zo_status zo_backend_ops_check(const zo_backend_ops *be);
/* The checked backend a device config names ("auto", or a name in any case). */
zo_status zo_device_backend_pick(const char *name, const zo_backend_ops **out);

#endif
