/* The swap store's private state, shared by its source files. Not installed. */
#ifndef ZO_SWAP_INTERNAL_H
#define ZO_SWAP_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "swap_engine.h"
#include "zo/swap.h"

#define ZO_SWAP_FILE_MAGIC     0x3146505753504f5aull /* "ZOPSWPF1" */
#define ZO_SWAP_EXTENT_MAGIC   0x3158505753504f5aull /* "ZOPSWPX1" */
#define ZO_SWAP_FORMAT_VERSION 2u /* 2: payloads checksummed with XXH3-64, was XXH64 */
#define ZO_SWAP_MAX_PATHS      64
/* Payloads of 1 MiB and more start on 1 MiB boundaries, so block-sized
 * requests line up with the device's (and a RAID's) boundaries as fio's do. */
#define ZO_SWAP_DATA_ALIGN     (1ull << 20)
#define ZO_SWAP_MAX_REGISTERED 64
/* Faults armed at open: the config's and ZO_SWAP_FAULTS's together. */
#define ZO_SWAP_MAX_FAULTS 256
/* EINTR/EAGAIN resubmissions, and transfers that made no progress, allowed
 * per request before the operation fails with ZO_ERR_IO. */
#define ZO_SWAP_MAX_RETRIES 64

/* First block of every swap file. */
typedef struct swap_file_header {
    uint64_t magic;
    uint32_t version, index;
    uint32_t nfiles, pid;
    uint64_t extent_payload, slots, created_unix;
    char hostname[64];
} swap_file_header;

/* First block of every extent; little-endian on disk (the host's order on
 * every platform zoffload builds for). */
typedef struct swap_extent_header {
    uint64_t magic;
    uint32_t version, header_bytes;
    uint64_t owner, length, generation, payload_xxh3; /* XXH3-64 (seed 0) since version 2 */
    uint32_t extent, reserved;
    uint64_t header_xxh64; /* over every field above */
} swap_extent_header;

typedef struct swap_file {
    char *path;
    int fd;      /* >= 0: open and locked by this store */
    int created; /* by this open (O_EXCL): removed if the open fails */
    uint64_t slots, size;
    uint64_t data_off; /* payloads start here, ZO_SWAP_DATA_ALIGN-aligned */
} swap_file;

typedef struct swap_slot {
    uint64_t owner;
    uint8_t used, busy;
} swap_slot;

typedef struct swap_region {
    void *buf;
    size_t len;
    int index;
} swap_region;

struct zo_swap_io;

/* A request for the I/O thread to (un)register a buffer with the engine:
 * with a single-issuer io_uring only that thread may. */
typedef struct swap_ctl {
    int unregister;
    void *buf;
    size_t len;
    int index;
    zo_status st;
    char msg[256];
    int done;
    struct swap_ctl *next;
} swap_ctl;

/* An engine request plus what the store needs to finish or resubmit it. */
typedef struct store_req {
    zo_io_req io;
    struct zo_swap_io *op;
    int retries;
    struct store_req *next; /* free list / retry list */
} store_req;

struct zo_swap_io {
    struct zo_swap *s;
    zo_io_dir dir;
    zo_swap_extent_t ext;
    uint8_t *buf;
    size_t len, body_len, tail_len;
    uint64_t generation, owner, payload_hash;
    uint32_t file;
    uint64_t header_off, payload_off; /* in its file */
    int buf_index;
    uint8_t *blocks; /* 4 KiB header block, then 4 KiB tail block */
    int phase;       /* writes: 0 payload, 1 header */
    int header_pending, tail_pending;
    size_t next_body;
    int inflight;
    zo_status st;
    char msg[384];
    int done, has_ticket;
    int verify_pending; /* a read's checks are left to its waiter */
    /* A read verified by its waiter is hashed as it lands: the I/O thread
     * marks each payload block done in landed_map (its own), and publishes
     * in landed (under the store's mutex) how many payload bytes from the
     * start are all in; the waiter hashes that prefix in order while it
     * waits (hashed bytes so far, into hash_state, waiter only), so only
     * the last block is left to hash once the read is over. */
    int hash_live, waiting;
    /* A read verified on the I/O thread (a callback's, or one without a
     * ticket) is hashed the same way by that thread, each time it has
     * refilled the queue: io_landed is its private copy of the prefix. */
    int io_hashes;
    uint8_t *landed_map; /* one byte per payload block */
    size_t landed_blocks, landed, io_landed, hashed;
    void *hash_state; /* an XXH3_state_t, in the blocks allocation */
    /* A write's payload hash is computed by its writer while the payload
     * goes to disk: hash_pending (under the store's mutex) until it is
     * published; hash_wait is the I/O thread's copy, cleared once seen. */
    int hash_pending, hash_wait;
    zo_swap_done_fn cb;
    void *user;
    struct zo_swap_io *next;          /* incoming / active list */
    struct zo_swap_io *tprev, *tnext; /* tickets not yet waited */
};

struct zo_swap {
    zo_swap_config cfg;
    char *name;
    swap_file *files;
    uint32_t nfiles;
    uint64_t extent_payload, payload_stride;
    swap_slot *slots;
    uint32_t nslots, used, cursor;
    zo_io_engine *engine;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t done_cv;
    struct zo_swap_io *in_head, *in_tail; /* submitted, not yet seen by the I/O thread */
    struct zo_swap_io *tickets;
    swap_ctl *ctl_head;
    int stop;
    int started; /* the I/O thread ran engine start: 1 ok, -1 failed */
    zo_status start_st;
    char start_msg[256];
    zo_swap_stats stats;
    swap_region regions[ZO_SWAP_MAX_REGISTERED];
    /* I/O thread only: */
    store_req *reqs, *free_reqs, *retry_reqs;
    zo_io_req **reap_buf;
    struct zo_swap_io *active_head, *active_tail;
    uint32_t inflight;
};

/* swap_store.c: a test hook called at the points of taking and removing a
 * file ("created", "opened", "locked", "removing", "removed") so that a test
 * can force interleavings of two stores; NULL otherwise. */
extern void (*zo_swap_test_pause)(const char *point, const char *path);

/* swap_io.c */
zo_status zo_swap_start_io(struct zo_swap *s);
/* Run a buffer (un)registration on the I/O thread and wait for it. */
zo_status zo_swap_run_ctl(struct zo_swap *s, swap_ctl *ctl);
void zo_swap_stop_io(struct zo_swap *s);
uint64_t zo_swap_header_hash(const swap_extent_header *h);
uint64_t zo_swap_payload_hash(const void *buf, size_t len);
/* Free a ticket and what it holds. */
void zo_swap_op_free(struct zo_swap_io *op);

#endif
