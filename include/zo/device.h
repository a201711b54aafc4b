/* zoffload: the device interface.
 *
 * Core code reaches a device only through this interface. Two backends
 * implement it: "cuda" (the CUDA runtime) and "cpu" (an emulated GPU whose
 * memory is host memory counted against a hard capacity and whose streams are
 * worker threads). Everything here is asynchronous in the CUDA sense: copies,
 * memsets and functions enqueued on a stream run later, in stream order, and
 * events order work across streams.
 *
 * Asynchronous failures (a function enqueued on a stream that returns an
 * error) are kept and reported by the next wait on that stream or on an event
 * recorded after the failure; they are never lost. */
#ifndef ZO_DEVICE_H
#define ZO_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "zo/api.h"
#include "zo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zo_device *zo_device_t;
typedef struct zo_stream *zo_stream_t;
typedef struct zo_event *zo_event_t;

/* Capability flags (zo_device_caps). */
enum {
    ZO_DEVCAP_REAL_GPU = 1u << 0,         /* a physical accelerator */
    ZO_DEVCAP_HOST_ADDRESSABLE = 1u << 1, /* device pointers may be dereferenced on the host */
    ZO_DEVCAP_ASYNC_COPY = 1u << 2,       /* copies overlap with compute */
    ZO_DEVCAP_HOST_REGISTER = 1u << 3,    /* host memory can be pinned */
    ZO_DEVCAP_BF16 = 1u << 4,             /* native bf16 compute */
    ZO_DEVCAP_NCCL = 1u << 5,             /* NCCL collectives available */
};

typedef struct zo_device_config {
    size_t struct_size;   /* sizeof(zo_device_config), for ABI checks */
    const char *backend;  /* "auto" (CUDA if a GPU is present, else cpu), "cuda" or "cpu" */
    int ordinal;          /* which GPU for "cuda" */
    uint64_t mem_budget;  /* bytes: the cpu device's capacity; on cuda a cap on what
                             zoffload allocates (0 = the GPU's free memory) */
    int cpu_copy_threads; /* reserved; 0 */
} zo_device_config;

#define ZO_DEVICE_CONFIG_INIT                                                                      \
    {                                                                                              \
        .struct_size = sizeof(zo_device_config), .backend = "auto"                                 \
    }

/* Default capacity of the cpu device when mem_budget is 0: 1 GiB. */
#define ZO_CPU_DEVICE_DEFAULT_CAPACITY (1ull << 30)

typedef struct zo_device_info {
    size_t struct_size;
    char backend[16]; /* "cuda" or "cpu" */
    char name[256];   /* GPU name, or "zoffload emulated GPU (cpu)" */
    int ordinal;
    uint64_t total_mem;     /* physical memory of the device (cpu: its capacity) */
    uint64_t budget;        /* the hard limit zoffload enforces */
    int cc_major, cc_minor; /* compute capability (0 on cpu) */
    int multiprocessors;
    char pci_bus_id[32]; /* "0000:17:00.0", "" on cpu */
    unsigned caps;
} zo_device_info;

#define ZO_DEVICE_INFO_INIT                                                                        \
    {                                                                                              \
        .struct_size = sizeof(zo_device_info)                                                      \
    }

typedef struct zo_device_mem_stats {
    uint64_t budget;     /* the hard limit */
    uint64_t in_use;     /* bytes currently allocated (exactly what was requested) */
    uint64_t high_water; /* the maximum of in_use since init or the last reset */
    uint64_t n_allocs;   /* live allocations */
    uint64_t n_failed;   /* allocations refused for lack of memory */
} zo_device_mem_stats;

/* ---- devices ---- */

/* The number of CUDA GPUs usable by this build (0 without CUDA or GPU). */
ZO_API int zo_device_cuda_count(void);

/* Whether this library was built with the CUDA backend. */
ZO_API int zo_device_cuda_built(void);

ZO_API zo_status zo_device_init(zo_device_t *out, const zo_device_config *cfg);
/* Waits for all streams, frees every stream, event and allocation still
 * held. NULL is accepted. */
ZO_API void zo_device_free(zo_device_t dev);

ZO_API const char *zo_device_backend(zo_device_t dev);
ZO_API unsigned zo_device_caps(zo_device_t dev);
ZO_API zo_status zo_device_get_info(zo_device_t dev, zo_device_info *out);
ZO_API zo_status zo_device_mem_get_stats(zo_device_t dev, zo_device_mem_stats *out);
/* Set high_water to the current in_use. */
ZO_API void zo_device_mem_reset_high_water(zo_device_t dev);
/* Wait for all work on all streams; returns the first pending async error. */
ZO_API zo_status zo_device_synchronize(zo_device_t dev);

/* ---- memory ---- */

/* Allocate device memory, aligned to at least 256 bytes. Fails with
 * ZO_ERR_OUT_OF_DEVICE_MEMORY when in_use + bytes would exceed the budget. */
ZO_API zo_status zo_device_malloc(zo_device_t dev, size_t bytes, void **out);
/* Free a pointer returned by zo_device_malloc; a pointer that is not a live
 * allocation (double free, foreign pointer) returns ZO_ERR_INVALID_ARG and
 * changes nothing. NULL is accepted. The caller must ensure no queued work
 * still uses the memory. */
ZO_API zo_status zo_device_mfree(zo_device_t dev, void *ptr);
/* Whether [ptr, ptr+bytes) lies inside one live device allocation. */
ZO_API int zo_device_owns(zo_device_t dev, const void *ptr, size_t bytes);

/* Page-lock host memory so copies run at full speed and asynchronously. The
 * range must not overlap a range already registered. */
ZO_API zo_status zo_device_host_register(zo_device_t dev, void *ptr, size_t bytes);
ZO_API zo_status zo_device_host_unregister(zo_device_t dev, void *ptr);

/* ---- streams and events ---- */

ZO_API zo_status zo_stream_create(zo_device_t dev, zo_stream_t *out);
/* A zoffload stream over a native stream the caller owns (cuda: a
 * cudaStream_t, so the engine can compute on PyTorch's current stream; NULL
 * is the legacy default stream, PyTorch's stream 0).
 * Events, waits, copies, ops and enqueued functions work on it as on any
 * stream; zo_stream_destroy waits for it and frees the wrapper only, leaving
 * the native stream to its owner, who must keep it alive until then. The cpu
 * device refuses with ZO_ERR_UNSUPPORTED: its streams are its own worker
 * threads (use zo_stream_create). */
ZO_API zo_status zo_stream_wrap(zo_device_t dev, void *native, zo_stream_t *out);
/* Waits for the stream's work, then frees it (a wrapped stream's native
 * stream is left alive). NULL is accepted. */
ZO_API zo_status zo_stream_destroy(zo_stream_t s);
/* Wait for all work queued so far; returns (and clears) the first async
 * error raised on the stream since the last wait. */
ZO_API zo_status zo_stream_synchronize(zo_stream_t s);
/* ZO_OK when the stream is idle, ZO_NOT_READY otherwise. */
ZO_API zo_status zo_stream_query(zo_stream_t s);
ZO_API zo_device_t zo_stream_device(zo_stream_t s);
/* The backend's native handle (cudaStream_t on cuda, NULL on cpu). */
ZO_API void *zo_stream_native(zo_stream_t s);

ZO_API zo_status zo_event_create(zo_device_t dev, zo_event_t *out);
ZO_API zo_status zo_event_destroy(zo_event_t ev);
/* Capture all work queued on s so far. */
ZO_API zo_status zo_event_record(zo_event_t ev, zo_stream_t s);
/* Make future work on s wait until ev's captured work is done. */
ZO_API zo_status zo_stream_wait_event(zo_stream_t s, zo_event_t ev);
/* ZO_OK when the captured work is done (or the event was never recorded),
 * ZO_NOT_READY otherwise, or the async error raised before the record. */
ZO_API zo_status zo_event_query(zo_event_t ev);
/* Block until done; returns the async error raised before the record, if any. */
ZO_API zo_status zo_event_synchronize(zo_event_t ev);
/* Milliseconds between two completed events recorded on streams. */
ZO_API zo_status zo_event_elapsed_ms(zo_event_t start, zo_event_t end, float *ms);

/* ---- asynchronous operations ---- */

ZO_API zo_status zo_memcpy_h2d_async(zo_stream_t s, void *dst_dev, const void *src_host,
                                     size_t bytes);
ZO_API zo_status zo_memcpy_d2h_async(zo_stream_t s, void *dst_host, const void *src_dev,
                                     size_t bytes);
ZO_API zo_status zo_memcpy_d2d_async(zo_stream_t s, void *dst_dev, const void *src_dev,
                                     size_t bytes);
ZO_API zo_status zo_memset_async(zo_stream_t s, void *dst_dev, int value, size_t bytes);

/* A function run in stream order. On the cpu device it runs on the stream's
 * worker thread; on cuda it runs on a driver thread (cudaLaunchHostFunc) and
 * must not call CUDA. A negative return is kept as the stream's async error. */
typedef zo_status (*zo_stream_fn)(void *arg);

/* Enqueue fn(arg copy). arg_size bytes at arg are copied at enqueue time, so
 * the caller may reuse its argument struct at once (arg_size may be 0 with
 * arg passed through as is). */
ZO_API zo_status zo_stream_enqueue(zo_stream_t s, zo_stream_fn fn, const void *arg,
                                   size_t arg_size);

/* Bytes each copy direction moved since init (for statistics and tests). */
typedef struct zo_device_copy_stats {
    uint64_t h2d_bytes, d2h_bytes, d2d_bytes;
    uint64_t h2d_ops, d2h_ops, d2d_ops;
} zo_device_copy_stats;
ZO_API zo_status zo_device_copy_get_stats(zo_device_t dev, zo_device_copy_stats *out);

#ifdef __cplusplus
}
#endif
#endif
