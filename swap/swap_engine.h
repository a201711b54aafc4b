/* The I/O engine operations table of the swap tier (in the manner of fio's
 * ioengines). An engine moves one request at a time between a buffer and a
 * registered file. register_files is called once by the opening thread
 * before start(); every other call but wake() comes from the store's I/O
 * thread, which lets io_uring run as a single-issuer ring. Engines: io_uring, sync (pread/pwrite
 * worker pool) and fault (wraps another, for tests); a cuFile (GPUDirect
 * Storage) engine would add GPU buffers to the same table. Not installed. */
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

typedef struct zo_io_engine_ops {
    const char *name;
    /* Files are registered once; fds stay open for the engine's life. */
    zo_status (*register_files)(zo_io_engine *e, const int *fds, int n);
    /* Called first on the I/O thread. */
    zo_status (*start)(zo_io_engine *e);
    /* Register a fixed buffer; *index is -1 when the engine has none. */
    zo_status (*register_buffer)(zo_io_engine *e, void *buf, size_t len, int *index);
    void (*unregister_buffer)(zo_io_engine *e, int index);
    /* Queue one request (at most queue_depth outstanding). */
    zo_status (*submit)(zo_io_engine *e, zo_io_req *req);
    /* Start the queued requests. */
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

zo_status zo_io_uring_create(uint32_t queue_depth, zo_io_engine **out, char *why, size_t cap);
zo_status zo_io_sync_create(uint32_t queue_depth, zo_io_engine **out);
/* Takes ownership of inner. */
zo_status zo_io_fault_create(zo_io_engine *inner, zo_io_engine **out);
zo_status zo_io_fault_arm(zo_io_engine *e, const zo_swap_fault *faults, size_t n);
int zo_io_engine_is_fault(const zo_io_engine *e);

/* Whether ZO_SWAP_FORCE_SYNC asks io_uring setup to fail (read once). */
int zo_swap_force_sync(void);

#endif
