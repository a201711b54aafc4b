/* zoffload: the NVMe tier. A swap store keeps fixed-size extents (one per
 * chunk and model state) in preallocated swap files, one file per path (one
 * path per drive), extents placed round-robin across the files. Every extent
 * is written with O_DIRECT and described by a 4 KiB header (magic, format version,
 * owner id, length, generation, the payload's XXH3-64) that is verified on
 * every read.
 *
 * I/O is asynchronous: a write or read returns at once with a ticket (wait on
 * it) and/or calls a completion callback; many may be in flight. One I/O
 * thread per store drives the engine (io_uring, or the `sync` pread/pwrite
 * worker pool where io_uring cannot be set up).
 *
 * Buffers: every buffer handed to zo_swap_write_async/zo_swap_read_async must
 * start on a 4096-byte boundary (O_DIRECT transfers straight from and into it);
 * its length may be anything up to the store's extent_bytes. The caller keeps
 * ownership: the store never frees a buffer, and a ticket completes (with
 * success or an error) only after the store has stopped touching it, so an
 * error such as ENOSPC or EIO is reported while the data is still in hand. */
#ifndef ZO_SWAP_H
#define ZO_SWAP_H

#include <stddef.h>
#include <stdint.h>

#include "zo/api.h"
#include "zo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zo_swap *zo_swap_t;
/* A pending write or read. Waited on exactly once with zo_swap_wait. */
typedef struct zo_swap_io *zo_swap_io_t;
/* An extent slot of the store (0 .. extents_total-1). */
typedef uint32_t zo_swap_extent_t;
#define ZO_SWAP_EXTENT_NONE UINT32_MAX

/* Required alignment of buffers and of every on-disk offset. */
#define ZO_SWAP_ALIGN 4096u

/* What to do with a swap file that already exists at open (left by a run
 * that crashed: a clean close deletes its files). */
typedef enum zo_swap_reuse {
    ZO_SWAP_REFUSE = 0, /* fail with ZO_ERR_EXISTS naming the file (default) */
    ZO_SWAP_REUSE = 1,  /* take it over and discard its contents */
} zo_swap_reuse;

/* Fault injection for tests and drills (the `fault` engine wraps the chosen
 * engine when any fault is armed). Operation indices count engine requests
 * (each block-sized piece, header or tail of a write/read, resubmissions
 * included) from 0 since the faults were armed. */
typedef enum zo_swap_fault_kind {
    ZO_SWAP_FAULT_EIO = 0,    /* the request fails with EIO  -> ZO_ERR_IO */
    ZO_SWAP_FAULT_NOSPC = 1,  /* the request fails with ENOSPC -> ZO_ERR_NO_SPACE */
    ZO_SWAP_FAULT_SHORT = 2,  /* only part of the request is transferred (recovered) */
    ZO_SWAP_FAULT_EINTR = 3,  /* fails with EINTR (retried, recovered) */
    ZO_SWAP_FAULT_EAGAIN = 4, /* fails with EAGAIN (retried, recovered) */
    ZO_SWAP_FAULT_DELAY = 5,  /* completes after delay_ms (recovered) */
    ZO_SWAP_FAULT_KIND_COUNT_ = 6
} zo_swap_fault_kind;

typedef struct zo_swap_fault {
    zo_swap_fault_kind kind;
    uint64_t op_index; /* which request (0-based) */
    uint32_t delay_ms; /* ZO_SWAP_FAULT_DELAY only */
} zo_swap_fault;

typedef struct zo_swap_config {
    size_t struct_size;
    const char *const *paths; /* directories, one swap file in each (one per drive) */
    size_t npaths;
    uint64_t capacity;     /* payload bytes the store must hold, summed over files */
    uint64_t extent_bytes; /* largest payload of one extent (a chunk); rounded up to 4 KiB */
    /* "auto" (default): io_uring, or sync when io_uring cannot be set up
     * (logged once; ZO_SWAP_FORCE_SYNC=1 forces that failure), or the engine
     * ZO_SWAP_ENGINE names; "io_uring" (fails with ZO_ERR_UNSUPPORTED instead
     * of falling back); "sync"; "null" (no disk I/O: extents are kept in
     * memory for the store's life, so checksums verify; for tests and for
     * measuring the store's own cost). */
    const char *engine;
    uint32_t queue_depth;        /* engine requests in flight (default 32) */
    uint32_t block_size;         /* bytes per engine request, multiple of 4096 (default 1 MiB) */
    zo_swap_reuse reuse;         /* what to do with a stale swap file */
    const char *name;            /* file name prefix (default "zoffload"): DIR/NAME.swap.I */
    int keep_files;              /* 1: leave the files at close (default: delete them) */
    const zo_swap_fault *faults; /* armed at open (tests); see zo_swap_set_faults */
    size_t nfaults;
} zo_swap_config;

#define ZO_SWAP_CONFIG_INIT                                                                        \
    {                                                                                              \
        .struct_size = sizeof(zo_swap_config), .extent_bytes = 64u << 20, .engine = "auto",        \
        .queue_depth = 32, .block_size = 1u << 20, .reuse = ZO_SWAP_REFUSE, .name = "zoffload"     \
    }

typedef struct zo_swap_stats {
    size_t struct_size;
    const char *engine;      /* engine in use: "io_uring", "sync", "fault+io_uring", ...
                              * (valid until zo_swap_close) */
    uint64_t bytes_written;  /* payload bytes of successful writes */
    uint64_t bytes_read;     /* payload bytes of successful, verified reads */
    uint64_t writes, reads;  /* completed successfully */
    uint64_t requests;       /* engine requests submitted (including retries) */
    uint64_t requests_fixed; /* of those, into or from a registered buffer */
    uint64_t retries;        /* EINTR/EAGAIN resubmissions */
    uint64_t short_ios;      /* short transfers resubmitted */
    uint64_t errors;         /* writes/reads that failed */
    uint64_t corrupt;        /* reads that failed verification */
    uint32_t extents_total, extents_used;
    uint32_t nfiles;
    uint64_t file_bytes; /* bytes preallocated over all files */
    /* Of bytes_read, those hashed by the read's waiter (zo_swap_wait) while
     * the rest of the read was still in flight: a read's payload is hashed
     * as it lands, in order, and only what lands last is left at the end. */
    uint64_t bytes_hashed_early;
} zo_swap_stats;

#define ZO_SWAP_STATS_INIT                                                                         \
    {                                                                                              \
        .struct_size = sizeof(zo_swap_stats)                                                       \
    }

/* Called on the store's I/O thread when a write or read finishes. msg names
 * the failure (file, offset, cause) or is "" on success. Must not block for
 * long and must not call zo_swap_wait or zo_swap_close. */
typedef void (*zo_swap_done_fn)(void *user, zo_status st, const char *msg);

/* Create (or, with ZO_SWAP_REUSE, take over) the swap files, check free space,
 * preallocate, and start the I/O engine. */
ZO_API zo_status zo_swap_open(const zo_swap_config *cfg, zo_swap_t *out);
/* The bytes zo_swap_open preallocates over all files for a store of this
 * capacity, extent size and number of paths (zo_swap_stats.file_bytes once
 * open; 0 when any is 0): payloads rounded to 4 KiB, at a 1 MiB stride once
 * they reach 1 MiB, one 4 KiB header per extent and per file. */
ZO_API uint64_t zo_swap_files_bytes(uint64_t capacity, uint64_t extent_bytes, size_t npaths);
/* Wait for all I/O in flight, stop, delete the files (unless keep_files).
 * Tickets not yet waited become invalid. Accepts NULL. */
ZO_API void zo_swap_close(zo_swap_t s);

/* Reserve a free extent for owner (an id the caller chooses, such as a chunk
 * and state; stored in the header and checked on read). Extents are handed
 * out round-robin across the files. ZO_ERR_BUDGET when all are taken. */
ZO_API zo_status zo_swap_alloc_extent(zo_swap_t s, uint64_t owner, zo_swap_extent_t *out);
/* Release an extent. ZO_ERR_STATE while a write or read on it is in flight. */
ZO_API zo_status zo_swap_free_extent(zo_swap_t s, zo_swap_extent_t ext);

/* Write len bytes of buf (4 KiB aligned, len <= extent_bytes) to ext, tagged
 * with generation. The checksum is computed on the calling thread. Returns a
 * ticket in *io (may be NULL when done is given) and/or calls done. buf must
 * stay valid and unchanged until completion. The header is written only after
 * the payload, so a crash mid-write leaves an extent that fails verification. */
ZO_API zo_status zo_swap_write_async(zo_swap_t s, zo_swap_extent_t ext, const void *buf, size_t len,
                                     uint64_t generation, zo_swap_done_fn done, void *user,
                                     zo_swap_io_t *io);
/* Read ext into buf (4 KiB aligned): its header must name the extent's owner,
 * length len and generation, and the payload must match its checksum, else
 * ZO_ERR_CORRUPT naming the file and offset. */
ZO_API zo_status zo_swap_read_async(zo_swap_t s, zo_swap_extent_t ext, void *buf, size_t len,
                                    uint64_t generation, zo_swap_done_fn done, void *user,
                                    zo_swap_io_t *io);
/* Wait for a ticket, free it, return its status (the error's message is the
 * calling thread's last error). Accepts NULL (returns ZO_OK). */
ZO_API zo_status zo_swap_wait(zo_swap_io_t io);
/* ZO_NOT_READY while pending, else the final status (the ticket stays valid
 * until zo_swap_wait). */
ZO_API zo_status zo_swap_test(zo_swap_io_t io);

/* Synchronous forms: async + wait. */
ZO_API zo_status zo_swap_write(zo_swap_t s, zo_swap_extent_t ext, const void *buf, size_t len,
                               uint64_t generation);
ZO_API zo_status zo_swap_read(zo_swap_t s, zo_swap_extent_t ext, void *buf, size_t len,
                              uint64_t generation);

/* Register a long-lived buffer (such as the pinned chunk pool) so that the
 * io_uring engine transfers into it without per-request page pinning. A no-op
 * on engines without fixed buffers. Call before I/O on that buffer; the
 * buffer must outlive the store or be unregistered first. */
ZO_API zo_status zo_swap_register_buffer(zo_swap_t s, void *buf, size_t len);
ZO_API zo_status zo_swap_unregister_buffer(zo_swap_t s, void *buf);

/* Re-arm fault injection (replaces any armed faults, restarts the operation
 * count at 0; n == 0 disarms). Only on a store whose config armed faults at
 * open (the fault engine wraps the engine from the start). */
ZO_API zo_status zo_swap_set_faults(zo_swap_t s, const zo_swap_fault *faults, size_t n);

ZO_API zo_status zo_swap_get_stats(zo_swap_t s, zo_swap_stats *out);
/* The file holding ext and the byte offsets of its header block and of its
 * payload, for messages and tools (any output may be NULL). path stays
 * valid until close. File layout: a 4 KiB file header, one 4 KiB header
 * block per extent, then the payloads (1 MiB-aligned when extents are 1 MiB
 * or larger). */
ZO_API zo_status zo_swap_extent_location(zo_swap_t s, zo_swap_extent_t ext, const char **path,
                                         uint64_t *header_offset, uint64_t *payload_offset);
/* Name of the engine in use ("io_uring", "sync", ...). */
ZO_API const char *zo_swap_engine_name(zo_swap_t s);

/* ---- the update pipeline ----
 * How a step moves optimizer states through the store (the engine's update
 * of every chunk) and how the benchmarks time it, scheduled here once: item
 * i is read into stage i % stages, stages - 1 items ahead of the one being
 * updated; an updated item's writes go out from its stage buffer, and a
 * stage is read into again only after it is drained (its writes landed).
 * The callbacks start and wait for the I/O and keep the tickets. */
typedef struct zo_swap_pipeline_ops {
    /* Start reading item i into stage s (drained). */
    zo_status (*read)(void *user, uint32_t i, unsigned s);
    /* Wait for item i's read in stage s, work on it, start its writes. */
    zo_status (*update)(void *user, uint32_t i, unsigned s);
    /* Wait for all stage s has in flight (its read, its writes). */
    zo_status (*drain)(void *user, unsigned s);
} zo_swap_pipeline_ops;

/* Run items 0..n-1 through the pipeline (stages >= 2). After the first
 * failure no new item is started; every stage is drained whatever happened.
 * Returns the first failure, with its message as the thread's last error. */
ZO_API zo_status zo_swap_pipeline_run(uint32_t n, unsigned stages, const zo_swap_pipeline_ops *ops,
                                      void *user);

/* ---- probes, for zo-report ---- */
/* 1 when an io_uring ring can be set up and supports read/write here, else 0
 * with the reason in why (ZO_SWAP_FORCE_SYNC=1 counts as a failure). */
ZO_API int zo_swap_probe_io_uring(char *why, size_t cap);
/* Whether O_DIRECT works in dir and how many bytes are free there (statvfs,
 * available to unprivileged users). why explains an O_DIRECT refusal. */
ZO_API zo_status zo_swap_probe_dir(const char *dir, int *odirect_ok, uint64_t *free_bytes,
                                   char *why, size_t cap);
/* The liburing version this library was built against ("2.3"). */
ZO_API const char *zo_swap_liburing_version(void);

#ifdef __cplusplus
}
#endif
#endif
