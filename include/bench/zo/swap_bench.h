/* zoffload: timing the NVMe tier the way the offload engine uses it, for
 * zo-bench io and zo-plan --measure. A benchmark store is a swap store
 * (zo/swap.h) in one directory holding a current set of n extents and,
 * when asked for, an alternate set of n, written from registered buffers
 * filled with incompressible data, as the engine's stages are. An update
 * pass reads the current set and writes the alternates, which then become
 * the current set: the next pass reads what the last one wrote, as the
 * engine's next step does (on virtual disks whose host caches recent
 * writes, that is faster than reading older data). Not installed: the tools
 * get it from the zoffload_bench target (the functions are in the static
 * swap part; libzoffload.so does not export them). */
#ifndef ZO_SWAP_BENCH_H
#define ZO_SWAP_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "zo/status.h"
#include "zo/swap.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zo_swap_bench *zo_swap_bench_t;

typedef enum zo_swap_bench_pass {
    ZO_SWAP_BENCH_WRITE = 0,            /* the current set written, `window` extents in flight */
    ZO_SWAP_BENCH_WRITE_ALTERNATES = 1, /* the alternate set written (lays it out) */
    ZO_SWAP_BENCH_READ = 2,             /* the current set read and verified */
    ZO_SWAP_BENCH_UPDATE = 3,           /* the engine's update pipeline (zo_swap_pipeline_run with
                                         * `stages`): the current set read, the alternates
                                         * written; then they swap roles */
} zo_swap_bench_pass;

typedef struct zo_swap_bench_config {
    size_t struct_size;
    const char *path;      /* the directory (one drive) */
    const char *name;      /* swap file prefix (default "zo-bench") */
    const char *engine;    /* as zo_swap_config.engine (default "auto") */
    uint32_t queue_depth;  /* engine requests in flight (0: the store's default) */
    uint32_t block_size;   /* bytes per engine request (0: the store's default) */
    uint64_t bytes;        /* bytes a pass moves each way (> 0); the last extent may be shorter */
    uint64_t extent_bytes; /* a multiple of 4096 (> 0) */
    uint32_t window;       /* extents in flight in write and read passes (0: stages) */
    unsigned stages;       /* stages of the update pipeline (0: 3, the engine's) */
    int alternates;        /* 1: also hold the n alternates (needed by the last two passes) */
    /* Optional: the payload of each extent, in order (as a job's chunks move different amounts);
     * then n = n_lengths, `bytes` is ignored (their sum) and extent_bytes must hold the largest. */
    const uint64_t *lengths;
    uint32_t n_lengths;
} zo_swap_bench_config;

#define ZO_SWAP_BENCH_CONFIG_INIT                                                                  \
    {                                                                                              \
        .struct_size = sizeof(zo_swap_bench_config), .name = "zo-bench", .engine = "auto"          \
    }

/* Open the store (taking over a file an interrupted benchmark left behind),
 * allocate its extents and buffers. Nothing is written yet. */
zo_status zo_swap_bench_open(const zo_swap_bench_config *cfg, zo_swap_bench_t *out);
/* Run one pass and time it (seconds from its first submission to its last
 * completion). Reading an extent not written yet is ZO_ERR_STATE. */
zo_status zo_swap_bench_run(zo_swap_bench_t b, zo_swap_bench_pass pass, double *seconds);
/* Bytes one pass of that kind moves: bytes, or 2 x bytes for an update
 * (each extent read and written). */
uint64_t zo_swap_bench_pass_bytes(zo_swap_bench_t b, zo_swap_bench_pass pass);
/* Extents per direction (n). */
uint32_t zo_swap_bench_extents(zo_swap_bench_t b);
zo_status zo_swap_bench_stats(zo_swap_bench_t b, zo_swap_stats *out);
/* The store's engine ("io_uring", "sync", ...), valid until close. */
const char *zo_swap_bench_engine(zo_swap_bench_t b);
/* Close the store (deleting its files) and free everything. Accepts NULL. */
void zo_swap_bench_close(zo_swap_bench_t b);

#ifdef __cplusplus
}
#endif
#endif
