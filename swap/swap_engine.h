/* The I/O engine operations table of the swap tier (in the manner of fio's
 * ioengines). An engine moves one request at a time between a buffer and a
 * registered file. register_files is called once by the opening thread
 * before start(); every other call but wake() comes from the store's I/O
 * thread, which lets io_uring run as a single-issuer ring. Engines, one per
 * file: io_uring, sync (pread/pwrite worker pool), null (no disk: the bytes
 * stay in memory) and fault (wraps another, for tests); a cuFile (GPUDirect
 * Storage) engine would add GPU buffers to the same table. The registry
 * (swap_engines.c) lists them, checks a table before it is used and finds
 * one by name. Not installed. */
#ifndef ZO_SWAP_ENGINE_H
#define ZO_SWAP_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "zo/swap.h"

typedef enum zo_io_dir { ZO_IO_READ = 0, ZO_IO_WRITE = 1 } zo_io_dir;

typedef struct zo_io_req {
    zo_io_dir dir;
    int file; /* index into the registered files */
    void *buf;
    size_t len;
    uint64_t off;
    int buf_index;  /* registered buffer index, or -1 */
    int64_t result; /* set by the engine: bytes transferred or -errno */
    void *owner;    /* the store's bookkeeping */
} zo_io_req;

typedef struct zo_io_engine zo_io_engine;

/* Bumped when a slot is added, removed or changes meaning. */
#define ZO_IO_ENGINE_OPS_VERSION 1u

/* Capability flags (zo_io_engine_ops.caps). */
enum {
    ZO_IO_CAP_AUTO = 1u << 0,       /* "auto" tries it, in registry order, until one sets up */
    ZO_IO_CAP_FIXED_BUFS = 1u << 1, /* register_buffer gives indexes the kernel uses */
    ZO_IO_CAP_NO_DISK = 1u << 2,    /* never touches the files: what was written stays in memory */
    ZO_IO_CAP_WRAPPER = 1u << 3, /* wraps args->inner; armed by the store, never chosen by name */
};

/* What create() needs. */
typedef struct zo_io_engine_args {
    uint32_t queue_depth;
    zo_io_engine *inner; /* wrappers: the engine to wrap (owned from then on, freed on failure) */
    char *why;           /* set to why the engine cannot run on this machine, when it cannot */
    size_t why_cap;
} zo_io_engine_args;

typedef struct zo_io_engine_ops {
    const char *name;
    unsigned version; /* ZO_IO_ENGINE_OPS_VERSION */
    unsigned caps;    /* ZO_IO_CAP_* */
    zo_status (*create)(const zo_io_engine_args *a, zo_io_engine **out);
    /* Files are registered once; fds stay open for the engine's life. */
    zo_status (*register_files)(zo_io_engine *e, const int *fds, int n);
    /* (optional) Called first on the I/O thread; NULL: nothing to set up there. */
    zo_status (*start)(zo_io_engine *e);
    /* (optional) Register a fixed buffer; *index is -1 when the engine has
     * none. NULL: no fixed buffers, every index is -1. */
    zo_status (*register_buffer)(zo_io_engine *e, void *buf, size_t len, int *index);
    /* (optional) Required with register_buffer. */
    void (*unregister_buffer)(zo_io_engine *e, int index);
    /* Queue one request (at most queue_depth outstanding). */
    zo_status (*submit)(zo_io_engine *e, zo_io_req *req);
    /* (optional) Start the queued requests; NULL: submit already started them. */
    zo_status (*flush)(zo_io_engine *e);
    /* Collect up to max completed requests; with wait, block until at least
     * one completes or wake() is called. Returns the count or a negative status. */
    int (*reap)(zo_io_engine *e, zo_io_req **done, int max, int wait);
    /* Interrupt a blocked reap (thread-safe). */
    void (*wake)(zo_io_engine *e);
    void (*destroy)(zo_io_engine *e);
} zo_io_engine_ops;

struct zo_io_engine {
    const zo_io_engine_ops *ops;
    uint32_t queue_depth;
    char name[64]; /* "fault+" + an inner name of at most 48 */
};

extern const zo_io_engine_ops zo_io_uring_ops, zo_io_sync_ops, zo_io_null_ops, zo_io_fault_ops;

/* ---- the registry (swap_engines.c) ---- */

/* ZO_OK when ops is of this version and fills every required slot. */
zo_status zo_io_engine_ops_check(const zo_io_engine_ops *ops);
/* Every registered table, in the order "auto" tries them; returns the count. */
size_t zo_io_engines(const zo_io_engine_ops *const **out);
/* The registered table named name, or NULL. */
const zo_io_engine_ops *zo_io_engine_find(const char *name);
/* "auto, io_uring, sync or null": the names a store may be opened with. */
char *zo_io_engine_choices(char *buf, size_t cap);
/* ZO_OK when name is "auto" or an engine a store may be opened on (not a
 * wrapper); ZO_ERR_CONFIG naming the valid choices otherwise. */
zo_status zo_io_engine_check_name(const char *name);
/* Check ops, then create an engine from it. */
zo_status zo_io_engine_create(const zo_io_engine_ops *ops, const zo_io_engine_args *a,
                              zo_io_engine **out);

/* The optional slots through their fallbacks: what the store and wrappers call. */
zo_status zo_io_engine_start(zo_io_engine *e);
zo_status zo_io_engine_register_buffer(zo_io_engine *e, void *buf, size_t len, int *index);
void zo_io_engine_unregister_buffer(zo_io_engine *e, int index);
zo_status zo_io_engine_flush(zo_io_engine *e);

zo_status zo_io_fault_arm(zo_io_engine *e, const zo_swap_fault *faults, size_t n);
int zo_io_engine_is_fault(const zo_io_engine *e);

/* Whether ZO_SWAP_FORCE_SYNC asks io_uring setup to fail (read once). */
int zo_swap_force_sync(void);
/* ZO_SWAP_ENGINE: the engine a store configured "auto" opens on instead
 * (read once; "auto" when unset or not a valid name, which is warned). */
const char *zo_swap_env_engine(void);

#endif
