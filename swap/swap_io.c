/* Asynchronous extent writes and reads: tickets, the I/O thread that cuts
 * them into engine requests (payload blocks, a bounce block for an unaligned
 * tail, the header), resubmits short and interrupted transfers, verifies
 * what it reads, and completes tickets only once the caller's buffer is no
 * longer in use. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>
#if defined(__x86_64__)
/* libxxhash's runtime dispatch: AVX-512, AVX2 or SSE2, the same hash. */
#include <xxh_x86dispatch.h>
#define payload_hash_once   XXH3_64bits_dispatch
#define payload_hash_update XXH3_64bits_update_dispatch
#else /* NEON (aarch64's baseline) or scalar, chosen when libxxhash was built */
#define payload_hash_once   XXH3_64bits
#define payload_hash_update XXH3_64bits_update
#endif

#include "swap_internal.h"
#include "zo_internal.h"

uint64_t zo_swap_header_hash(const swap_extent_header *h)
{
    return XXH64(h, offsetof(swap_extent_header, header_xxh64), 0);
}

/* The payload's checksum is XXH3-64: vectorized, it hashes several times as
 * fast as XXH64 (which runs at about the disk's speed on one core), so
 * checksumming no longer costs the I/O path a core. */
uint64_t zo_swap_payload_hash(const void *buf, size_t len)
{
    return payload_hash_once(buf, len);
}

static uint8_t *header_block(struct zo_swap_io *op)
{
    return op->blocks;
}
static uint8_t *tail_block(struct zo_swap_io *op)
{
    return op->blocks + ZO_SWAP_ALIGN;
}

/* The ticket's allocation: header block, tail block, then the streaming
 * hash state of a read hashed as it lands (64-byte aligned, as XXH3 wants). */
#define OP_BLOCKS_BYTES (2 * ZO_SWAP_ALIGN + sizeof(XXH3_state_t))

void zo_swap_op_free(struct zo_swap_io *op)
{
    if (!op)
        return;
    free(op->landed_map);
    free(op->blocks);
    free(op);
}

/* Record the first failure of an operation; later ones add nothing. */
static void op_fail(struct zo_swap_io *op, zo_status st, const char *fmt, ...)
{
    if (op->st != ZO_OK)
        return;
    op->st = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(op->msg, sizeof op->msg, fmt, ap);
    va_end(ap);
}

/* ---- ticket creation (caller's thread) ---- */

static zo_status check_request(zo_swap_t s, zo_swap_extent_t ext, const void *buf, size_t len,
                               const char *what)
{
    if (!s)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap", "%s: NULL store", what);
    if (!buf || ((uintptr_t)buf % ZO_SWAP_ALIGN))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap",
                       "%s: buffer %p is not 4096-byte aligned (O_DIRECT needs it): "
                       "allocate it with posix_memalign/aligned_alloc(4096, ...)",
                       what, buf);
    if (len == 0 || len > s->extent_payload)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap",
                       "%s: length %zu: expected 1..%" PRIu64 " (the store's extent size)", what,
                       len, s->extent_payload);
    if (ext >= s->nslots)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap", "%s: extent %u out of range (store has %u)",
                       what, ext, s->nslots);
    return ZO_OK;
}

static int region_index(zo_swap_t s, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    for (int i = 0; i < ZO_SWAP_MAX_REGISTERED; i++) {
        const uint8_t *b = s->regions[i].buf;
        if (b && s->regions[i].index >= 0 && p >= b && p + len <= b + s->regions[i].len)
            return s->regions[i].index;
    }
    return -1;
}

/* Who hashes an operation's payload as it lands: nobody (writes, hashed by
 * their writer before the header goes), the waiter of a read's ticket (a
 * read only polled is hashed whole when verified), or the I/O thread. */
typedef enum { HASH_AT_END, HASH_BY_WAITER, HASH_BY_IO_THREAD } hash_mode;

static zo_status op_create(zo_swap_t s, zo_io_dir dir, zo_swap_extent_t ext, const void *buf,
                           size_t len, uint64_t generation, hash_mode hashing,
                           struct zo_swap_io **out)
{
    struct zo_swap_io *op = calloc(1, sizeof *op);
    void *blocks = NULL;
    size_t body = len & ~(size_t)(ZO_SWAP_ALIGN - 1);
    size_t nblocks =
        hashing != HASH_AT_END ? (body + s->cfg.block_size - 1) / s->cfg.block_size : 0;
    uint8_t *map = nblocks ? calloc(nblocks, 1) : NULL;
    if (!op || (nblocks && !map) || posix_memalign(&blocks, ZO_SWAP_ALIGN, OP_BLOCKS_BYTES)) {
        free(map);
        free(op);
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "swap", "out of memory for an I/O ticket");
    }
    op->landed_map = map;
    op->hash_live = nblocks > 0 && hashing == HASH_BY_WAITER;
    op->io_hashes = nblocks > 0 && hashing == HASH_BY_IO_THREAD;
    op->hash_state = (uint8_t *)blocks + 2 * ZO_SWAP_ALIGN;
    op->s = s;
    op->dir = dir;
    op->ext = ext;
    op->buf = (uint8_t *)buf;
    op->len = len;
    op->body_len = len & ~(size_t)(ZO_SWAP_ALIGN - 1);
    op->tail_len = len - op->body_len;
    op->generation = generation;
    op->file = ext % s->nfiles;
    zo_swap_extent_location(s, ext, NULL, &op->header_off, &op->payload_off);
    op->blocks = blocks;
    memset(blocks, 0, 2 * ZO_SWAP_ALIGN);
    if (nblocks)
        XXH3_64bits_reset(op->hash_state);
    op->tail_pending = op->tail_len > 0;
    op->header_pending = 1;
    *out = op;
    return ZO_OK;
}

/* Mark the extent busy (one operation per extent at a time) and hand the
 * ticket to the I/O thread. */
static zo_status op_enqueue(zo_swap_t s, struct zo_swap_io *op, zo_swap_done_fn done, void *user,
                            zo_swap_io_t *io)
{
    op->cb = done;
    op->user = user;
    op->has_ticket = io != NULL;
    pthread_mutex_lock(&s->mu);
    swap_slot *slot = &s->slots[op->ext];
    zo_status st = ZO_OK;
    if (!slot->used)
        st = ZO_FAIL(ZO_ERR_INVALID_ARG, "swap",
                     "extent %u is not allocated: call zo_swap_alloc_extent first", op->ext);
    else if (slot->busy)
        st = ZO_FAIL(ZO_ERR_STATE, "swap",
                     "extent %u already has a write or read in flight: wait for it first", op->ext);
    if (st != ZO_OK) {
        pthread_mutex_unlock(&s->mu);
        zo_swap_op_free(op);
        return st;
    }
    slot->busy = 1;
    op->owner = slot->owner;
    op->buf_index = region_index(s, op->buf, op->body_len);
    if (op->has_ticket) {
        op->tnext = s->tickets;
        if (s->tickets)
            s->tickets->tprev = op;
        s->tickets = op;
    }
    if (s->in_tail)
        s->in_tail->next = op;
    else
        s->in_head = op;
    s->in_tail = op;
    pthread_mutex_unlock(&s->mu);
    if (io)
        *io = op;
    s->engine->ops->wake(s->engine);
    return ZO_OK;
}

static void fill_header(struct zo_swap_io *op)
{
    swap_extent_header *h = (swap_extent_header *)header_block(op);
    h->magic = ZO_SWAP_EXTENT_MAGIC;
    h->version = ZO_SWAP_FORMAT_VERSION;
    h->header_bytes = ZO_SWAP_ALIGN;
    h->owner = op->owner;
    h->length = op->len;
    h->generation = op->generation;
    h->payload_xxh3 = op->payload_hash;
    h->extent = op->ext;
    h->header_xxh64 = zo_swap_header_hash(h);
}

/* Validate a write or read and build its ticket (not yet queued). */
static zo_status op_begin(zo_swap_t s, zo_io_dir dir, zo_swap_extent_t ext, const void *buf,
                          size_t len, uint64_t generation, zo_swap_done_fn done, zo_swap_io_t *io,
                          struct zo_swap_io **op)
{
    const char *what = dir == ZO_IO_WRITE ? "zo_swap_write_async" : "zo_swap_read_async";
    if (io)
        *io = NULL;
    ZO_TRY(check_request(s, ext, buf, len, what));
    if (!io && !done)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap", "%s: give a ticket pointer or a callback", what);
    /* A read with a ticket and no callback is verified by its waiter, who
     * hashes it as it lands (see zo_swap_wait); any other read by the I/O
     * thread, which hashes it as it lands too (see hash_landed_reads). */
    hash_mode hashing = dir == ZO_IO_WRITE ? HASH_AT_END
                        : io && !done      ? HASH_BY_WAITER
                                           : HASH_BY_IO_THREAD;
    return op_create(s, dir, ext, buf, len, generation, hashing, op);
}

zo_status zo_swap_write_async(zo_swap_t s, zo_swap_extent_t ext, const void *buf, size_t len,
                              uint64_t generation, zo_swap_done_fn done, void *user,
                              zo_swap_io_t *io)
{
    struct zo_swap_io *op;
    ZO_TRY(op_begin(s, ZO_IO_WRITE, ext, buf, len, generation, done, io, &op));
    memcpy(tail_block(op), op->buf + op->body_len, op->tail_len);
    op->hash_pending = op->hash_wait = 1;
    ZO_TRY(op_enqueue(s, op, done, user, io));
    /* The payload goes to disk while this thread hashes it: only the
     * header, written once the payload is on disk, carries the hash, so a
     * store's first write no longer waits for a whole extent's hashing
     * (about 10 ms for 64 MiB). Hashing here spreads the checksum work over
     * the submitting threads and keeps the I/O thread free to drive the
     * queue. The operation cannot finish (nor be freed) before the hash is
     * published: op is not touched after that. */
    uint64_t h = zo_swap_payload_hash(buf, len);
    pthread_mutex_lock(&s->mu);
    op->payload_hash = h;
    op->hash_pending = 0;
    pthread_mutex_unlock(&s->mu);
    s->engine->ops->wake(s->engine);
    return ZO_OK;
}

zo_status zo_swap_read_async(zo_swap_t s, zo_swap_extent_t ext, void *buf, size_t len,
                             uint64_t generation, zo_swap_done_fn done, void *user,
                             zo_swap_io_t *io)
{
    struct zo_swap_io *op;
    ZO_TRY(op_begin(s, ZO_IO_READ, ext, buf, len, generation, done, io, &op));
    return op_enqueue(s, op, done, user, io);
}

static void settle_ticket(zo_swap_io_t io);

/* A read's payload hashed up to landed, by its waiter (hash_live) or the
 * I/O thread (io_hashes). */
static void hash_landed(struct zo_swap_io *op, size_t landed)
{
    payload_hash_update(op->hash_state, op->buf + op->hashed, landed - op->hashed);
    op->hashed = landed;
}

zo_status zo_swap_test(zo_swap_io_t io)
{
    if (!io)
        return ZO_OK;
    pthread_mutex_lock(&io->s->mu);
    int done = io->done;
    pthread_mutex_unlock(&io->s->mu);
    if (!done)
        return ZO_NOT_READY;
    settle_ticket(io);
    return io->st;
}

zo_status zo_swap_wait(zo_swap_io_t io)
{
    if (!io)
        return ZO_OK;
    zo_swap_t s = io->s;
    pthread_mutex_lock(&s->mu);
    while (!io->done) {
        size_t landed = io->landed;
        /* hashed is the I/O thread's when it hashes the read (io_hashes) */
        if (io->hash_live && landed > io->hashed) {
            /* The payload's landed prefix, hashed while the rest is in
             * flight: the I/O thread no longer touches those bytes. */
            io->waiting = 0;
            pthread_mutex_unlock(&s->mu);
            hash_landed(io, landed);
            pthread_mutex_lock(&s->mu);
            continue;
        }
        io->waiting = io->hash_live;
        pthread_cond_wait(&s->done_cv, &s->mu);
    }
    io->waiting = 0;
    if (io->tprev)
        io->tprev->tnext = io->tnext;
    else
        s->tickets = io->tnext;
    if (io->tnext)
        io->tnext->tprev = io->tprev;
    pthread_mutex_unlock(&s->mu);
    settle_ticket(io);
    zo_status st = io->st;
    if (st < 0)
        ZO_FAIL(st, "swap", "%s", io->msg);
    zo_swap_op_free(io);
    return st;
}

zo_status zo_swap_write(zo_swap_t s, zo_swap_extent_t ext, const void *buf, size_t len,
                        uint64_t generation)
{
    zo_swap_io_t io;
    ZO_TRY(zo_swap_write_async(s, ext, buf, len, generation, NULL, NULL, &io));
    return zo_swap_wait(io);
}

zo_status zo_swap_read(zo_swap_t s, zo_swap_extent_t ext, void *buf, size_t len,
                       uint64_t generation)
{
    zo_swap_io_t io;
    ZO_TRY(zo_swap_read_async(s, ext, buf, len, generation, NULL, NULL, &io));
    return zo_swap_wait(io);
}

/* ---- the I/O thread ---- */

static const char *dir_name(zo_io_dir d)
{
    return d == ZO_IO_READ ? "read" : "write";
}

/* The next request of op, or 0 when it has none to start now. Reads fetch
 * header, payload and tail at once; writes send the header only after the
 * payload is on disk, so a torn write can never verify. */
static int op_next_piece(zo_swap_t s, struct zo_swap_io *op, zo_io_req *r)
{
    if (op->st != ZO_OK)
        return 0;
    r->dir = op->dir;
    r->file = (int)op->file;
    r->buf_index = -1;
    int payload_phase = op->dir == ZO_IO_READ || op->phase == 0;
    if ((op->dir == ZO_IO_READ || op->phase == 1) && op->header_pending) {
        op->header_pending = 0;
        r->buf = header_block(op);
        r->len = ZO_SWAP_ALIGN;
        r->off = op->header_off;
        return 1;
    }
    if (payload_phase && op->next_body < op->body_len) {
        size_t n = op->body_len - op->next_body;
        if (n > s->cfg.block_size)
            n = s->cfg.block_size;
        r->buf = op->buf + op->next_body;
        r->len = n;
        r->off = op->payload_off + op->next_body;
        r->buf_index = op->buf_index;
        op->next_body += n;
        return 1;
    }
    if (payload_phase && op->tail_pending) {
        op->tail_pending = 0;
        r->buf = tail_block(op);
        r->len = ZO_SWAP_ALIGN;
        r->off = op->payload_off + op->body_len;
        return 1;
    }
    return 0;
}

static void move_incoming(zo_swap_t s)
{
    pthread_mutex_lock(&s->mu);
    struct zo_swap_io *head = s->in_head;
    struct zo_swap_io *tail = s->in_tail;
    s->in_head = s->in_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    if (!head)
        return;
    if (s->active_tail)
        s->active_tail->next = head;
    else
        s->active_head = head;
    s->active_tail = tail;
}

static void release_req(zo_swap_t s, store_req *r);

/* Start one request; if the engine refuses it, the operation fails with that
 * error and the slot is given back. */
static void start_req(zo_swap_t s, store_req *r)
{
    zo_status st = s->engine->ops->submit(s->engine, &r->io);
    if (st != ZO_OK) {
        op_fail(r->op, st, "%s", zo_last_error());
        release_req(s, r);
        return;
    }
    s->inflight++;
    pthread_mutex_lock(&s->mu);
    s->stats.requests++;
    s->stats.requests_fixed += r->io.buf_index >= 0;
    pthread_mutex_unlock(&s->mu);
}

/* Fill free request slots: resubmissions first, then new pieces in FIFO
 * order of the operations. */
static zo_status submit_ready(zo_swap_t s)
{
    while (s->retry_reqs) {
        store_req *r = s->retry_reqs;
        s->retry_reqs = r->next;
        start_req(s, r);
    }
    for (struct zo_swap_io *op = s->active_head; op && s->free_reqs; op = op->next) {
        while (s->free_reqs) {
            store_req *r = s->free_reqs;
            if (!op_next_piece(s, op, &r->io))
                break;
            s->free_reqs = r->next;
            r->op = op;
            r->retries = 0;
            r->io.owner = r;
            op->inflight++;
            start_req(s, r);
        }
    }
    return zo_io_engine_flush(s->engine);
}

static zo_status errno_status(int err)
{
    return err == ENOSPC || err == EDQUOT ? ZO_ERR_NO_SPACE : ZO_ERR_IO;
}

static void release_req(zo_swap_t s, store_req *r)
{
    r->op->inflight--;
    r->next = s->free_reqs;
    s->free_reqs = r;
}

static void retry_req(zo_swap_t s, store_req *r)
{
    r->next = s->retry_reqs;
    s->retry_reqs = r;
}

/* A request of op transferred in full: for a read hashed as it lands, mark
 * its payload block and publish how far the in-order prefix reaches, waking
 * the waiter when it moved. */
static void note_landed(zo_swap_t s, struct zo_swap_io *op, const zo_io_req *io)
{
    const uint8_t *p = io->buf;
    if ((!op->hash_live && !op->io_hashes) || p < op->buf || p >= op->buf + op->body_len)
        return; /* not hashed live, or the header or tail block */
    size_t bs = s->cfg.block_size, nblocks = (op->body_len + bs - 1) / bs;
    op->landed_map[(size_t)(p - op->buf) / bs] = 1;
    size_t k = op->landed_blocks;
    while (k < nblocks && op->landed_map[k])
        k++;
    if (k == op->landed_blocks)
        return;
    op->landed_blocks = k;
    size_t landed = k == nblocks ? op->body_len : k * bs;
    if (op->io_hashes) {
        op->io_landed = landed; /* this thread's to hash, once the queue is full again */
        return;
    }
    pthread_mutex_lock(&s->mu);
    op->landed = landed;
    if (op->waiting)
        pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->mu);
}

/* One finished engine request: done, resubmitted, or the operation failed. */
static void on_request_done(zo_swap_t s, store_req *r)
{
    struct zo_swap_io *op = r->op;
    zo_io_req *io = &r->io;
    const char *path = s->files[io->file].path;
    s->inflight--;
    int64_t res = io->result;
    if (res == -EINTR || res == -EAGAIN || res == 0) {
        if (++r->retries <= ZO_SWAP_MAX_RETRIES) {
            pthread_mutex_lock(&s->mu);
            if (res == 0)
                s->stats.short_ios++;
            else
                s->stats.retries++;
            pthread_mutex_unlock(&s->mu);
            retry_req(s, r);
            return;
        }
        op_fail(op, ZO_ERR_IO, "%s of extent %u: %s at %s offset %" PRIu64 " after %d attempts",
                dir_name(op->dir), op->ext, res ? strerror((int)-res) : "no progress", path,
                io->off, ZO_SWAP_MAX_RETRIES);
    } else if (res < 0) {
        op_fail(op, errno_status((int)-res),
                "%s of extent %u (owner %" PRIu64 ") failed at %s offset %" PRIu64
                " (%zu bytes): %s",
                dir_name(op->dir), op->ext, op->owner, path, io->off, io->len, strerror((int)-res));
    } else if ((uint64_t)res < io->len) {
        /* Short transfer: continue where it stopped. */
        io->buf = (uint8_t *)io->buf + res;
        io->off += (uint64_t)res;
        io->len -= (size_t)res;
        r->retries = 0;
        pthread_mutex_lock(&s->mu);
        s->stats.short_ios++;
        pthread_mutex_unlock(&s->mu);
        retry_req(s, r);
        return;
    } else {
        note_landed(s, op, io);
    }
    release_req(s, r);
}

/* Check what a read brought in: header fields, then the payload's hash. */
static void verify_read(zo_swap_t s, struct zo_swap_io *op)
{
    const swap_extent_header *h = (const swap_extent_header *)header_block(op);
    const char *path = s->files[op->file].path;
    if (h->magic != ZO_SWAP_EXTENT_MAGIC || h->header_xxh64 != zo_swap_header_hash(h)) {
        op_fail(op, ZO_ERR_CORRUPT, "extent %u: header at %s offset %" PRIu64 " is %s", op->ext,
                path, op->header_off,
                h->magic != ZO_SWAP_EXTENT_MAGIC ? "missing (never written, or overwritten)"
                                                 : "corrupt (checksum mismatch)");
        return;
    }
    if (h->version != ZO_SWAP_FORMAT_VERSION || h->owner != op->owner || h->length != op->len ||
        h->generation != op->generation || h->extent != op->ext) {
        op_fail(op, ZO_ERR_CORRUPT,
                "extent %u at %s offset %" PRIu64 " holds version %u owner %" PRIu64
                " length %" PRIu64 " generation %" PRIu64 ", expected version %u owner %" PRIu64
                " length %zu generation %" PRIu64,
                op->ext, path, op->header_off, h->version, h->owner, h->length, h->generation,
                ZO_SWAP_FORMAT_VERSION, op->owner, op->len, op->generation);
        return;
    }
    uint64_t got;
    if (op->hashed) { /* its waiter hashed a prefix as it landed: the same stream, continued */
        payload_hash_update(op->hash_state, op->buf + op->hashed, op->body_len - op->hashed);
        payload_hash_update(op->hash_state, tail_block(op), op->tail_len);
        got = XXH3_64bits_digest(op->hash_state);
    } else if (op->tail_len == 0) {
        got = zo_swap_payload_hash(op->buf, op->body_len);
    } else {
        XXH3_state_t st;
        XXH3_INITSTATE(&st);
        XXH3_64bits_reset(&st);
        payload_hash_update(&st, op->buf, op->body_len);
        payload_hash_update(&st, tail_block(op), op->tail_len);
        got = XXH3_64bits_digest(&st);
    }
    if (got != h->payload_xxh3) {
        op_fail(op, ZO_ERR_CORRUPT,
                "extent %u: payload at %s offset %" PRIu64 " (%zu bytes) fails its checksum "
                "(xxh3 %016" PRIx64 ", header says %016" PRIx64 ")",
                op->ext, path, op->payload_off, op->len, got, h->payload_xxh3);
        return;
    }
    memcpy(op->buf + op->body_len, tail_block(op), op->tail_len);
}

static void count_finished(zo_swap_t s, struct zo_swap_io *op)
{
    if (op->st == ZO_OK && op->dir == ZO_IO_WRITE) {
        s->stats.writes++;
        s->stats.bytes_written += op->len;
    } else if (op->st == ZO_OK) {
        s->stats.reads++;
        s->stats.bytes_read += op->len;
        s->stats.bytes_hashed_early += op->hashed;
    } else {
        s->stats.errors++;
        if (op->st == ZO_ERR_CORRUPT)
            s->stats.corrupt++;
    }
}

static void finish_op(zo_swap_t s, struct zo_swap_io *op)
{
    /* A read waited on through a ticket is verified by its waiter: the
     * hashing then runs on the caller's thread (as it does for writes) and
     * the I/O thread goes straight back to driving the queue. */
    op->verify_pending = op->dir == ZO_IO_READ && op->st == ZO_OK && op->has_ticket && !op->cb;
    if (op->st == ZO_OK && op->dir == ZO_IO_READ && !op->verify_pending)
        verify_read(s, op);
    if (op->st != ZO_OK)
        ZO_LOGD("swap", "%s", op->msg);
    pthread_mutex_lock(&s->mu);
    s->slots[op->ext].busy = 0;
    if (!op->verify_pending)
        count_finished(s, op);
    pthread_mutex_unlock(&s->mu);
    /* The callback runs before the ticket is released so that a waiter sees
     * its effects. */
    if (op->cb)
        op->cb(op->user, op->st, op->msg);
    int has_ticket = op->has_ticket;
    pthread_mutex_lock(&s->mu);
    op->done = 1;
    pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->mu);
    if (!has_ticket)
        zo_swap_op_free(op);
}

/* The waiter's share of a finished read: verify it and count it. */
static void settle_ticket(zo_swap_io_t io)
{
    if (!io->verify_pending)
        return;
    io->verify_pending = 0;
    verify_read(io->s, io);
    pthread_mutex_lock(&io->s->mu);
    count_finished(io->s, io);
    pthread_mutex_unlock(&io->s->mu);
}

/* Whether op is over: nothing in flight and nothing left to start. A write
 * whose payload is complete moves on to its header here. */
/* Whether a write's hash is published (I/O thread). */
static int hash_ready(zo_swap_t s, struct zo_swap_io *op)
{
    if (!op->hash_wait)
        return 1;
    pthread_mutex_lock(&s->mu);
    op->hash_wait = op->hash_pending;
    pthread_mutex_unlock(&s->mu);
    return !op->hash_wait;
}

static int op_settled(zo_swap_t s, struct zo_swap_io *op)
{
    if (op->inflight)
        return 0;
    if (!hash_ready(s, op)) /* its writer still hashes the payload (and holds op) */
        return 0;
    if (op->st != ZO_OK)
        return 1;
    int payload_left = op->next_body < op->body_len || op->tail_pending;
    if (op->dir == ZO_IO_READ)
        return !payload_left && !op->header_pending;
    if (op->phase == 0) {
        if (payload_left)
            return 0;
        fill_header(op);
        op->phase = 1;
        return 0;
    }
    return !op->header_pending;
}

/* The landed prefixes of the reads this thread verifies, hashed after the
 * queue was refilled: hashing a whole 64 MiB extent at its end (about 6 ms)
 * held up the reaping and resubmitting of every request meanwhile. (Hashing
 * a block at a time between non-blocking reaps ran no faster.) */
static void hash_landed_reads(zo_swap_t s)
{
    for (struct zo_swap_io *op = s->active_head; op; op = op->next)
        if (op->io_hashes && op->st == ZO_OK && op->io_landed > op->hashed)
            hash_landed(op, op->io_landed);
}

static void finish_settled(zo_swap_t s)
{
    struct zo_swap_io *prev = NULL, *op = s->active_head;
    while (op) {
        struct zo_swap_io *next = op->next;
        if (op_settled(s, op)) {
            if (prev)
                prev->next = next;
            else
                s->active_head = next;
            if (s->active_tail == op)
                s->active_tail = prev;
            finish_op(s, op);
        } else {
            prev = op;
        }
        op = next;
    }
}

zo_status zo_swap_run_ctl(zo_swap_t s, swap_ctl *ctl)
{
    ctl->done = 0;
    pthread_mutex_lock(&s->mu);
    ctl->next = s->ctl_head;
    s->ctl_head = ctl;
    pthread_mutex_unlock(&s->mu);
    s->engine->ops->wake(s->engine);
    pthread_mutex_lock(&s->mu);
    while (!ctl->done)
        pthread_cond_wait(&s->done_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    if (ctl->st != ZO_OK)
        return ZO_FAIL(ctl->st, "swap", "%s", ctl->msg);
    return ZO_OK;
}

static void run_controls(zo_swap_t s)
{
    pthread_mutex_lock(&s->mu);
    swap_ctl *list = s->ctl_head;
    s->ctl_head = NULL;
    pthread_mutex_unlock(&s->mu);
    for (swap_ctl *c = list; c; c = c->next) {
        c->st = ZO_OK;
        if (c->unregister)
            zo_io_engine_unregister_buffer(s->engine, c->index);
        else
            c->st = zo_io_engine_register_buffer(s->engine, c->buf, c->len, &c->index);
        if (c->st != ZO_OK)
            snprintf(c->msg, sizeof c->msg, "%s", zo_last_error());
    }
    pthread_mutex_lock(&s->mu);
    for (swap_ctl *c = list; c;) {
        swap_ctl *next = c->next; /* c may be gone once done is seen */
        c->done = 1;
        c = next;
    }
    pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->mu);
}

/* Engine start on this thread; the opener waits for its outcome. */
static int io_thread_start(zo_swap_t s)
{
    zo_status st = zo_io_engine_start(s->engine);
    pthread_mutex_lock(&s->mu);
    s->start_st = st;
    if (st != ZO_OK)
        snprintf(s->start_msg, sizeof s->start_msg, "%s", zo_last_error());
    s->started = st == ZO_OK ? 1 : -1;
    pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->mu);
    return st == ZO_OK;
}

static void *io_thread(void *arg)
{
    zo_swap_t s = arg;
    zo_io_req **done = s->reap_buf;
    if (!io_thread_start(s))
        return NULL;
    for (;;) {
        move_incoming(s);
        run_controls(s);
        zo_status st = submit_ready(s);
        if (st != ZO_OK)
            ZO_LOGE("swap", "I/O thread: submitting failed: %s", zo_last_error());
        hash_landed_reads(s);
        pthread_mutex_lock(&s->mu);
        int stop = s->stop && !s->in_head;
        pthread_mutex_unlock(&s->mu);
        if (stop && !s->active_head && !s->inflight)
            break;
        int n = s->engine->ops->reap(s->engine, done, (int)s->cfg.queue_depth, 1);
        if (n < 0)
            ZO_LOGE("swap", "I/O thread: waiting for completions failed: %s", zo_last_error());
        for (int i = 0; i < n; i++)
            on_request_done(s, done[i]->owner);
        finish_settled(s);
    }
    return NULL;
}

zo_status zo_swap_start_io(zo_swap_t s)
{
    uint32_t qd = s->cfg.queue_depth;
    s->reqs = calloc(qd, sizeof *s->reqs);
    s->reap_buf = calloc(qd, sizeof *s->reap_buf);
    if (!s->reqs || !s->reap_buf)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "swap", "out of memory for %u requests", qd);
    for (uint32_t i = 0; i < qd; i++) {
        s->reqs[i].next = s->free_reqs;
        s->free_reqs = &s->reqs[i];
    }
    int rc = pthread_create(&s->thread, NULL, io_thread, s);
    if (rc)
        return ZO_FAIL(ZO_ERR_SYSTEM, "swap", "starting the I/O thread failed: %s", strerror(rc));
    s->thread_started = 1;
    pthread_mutex_lock(&s->mu);
    while (!s->started)
        pthread_cond_wait(&s->done_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    if (s->started < 0) {
        pthread_join(s->thread, NULL);
        s->thread_started = 0;
        return ZO_FAIL(s->start_st, "swap", "%s", s->start_msg);
    }
    return ZO_OK;
}

void zo_swap_stop_io(zo_swap_t s)
{
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_mutex_unlock(&s->mu);
    s->engine->ops->wake(s->engine);
    pthread_join(s->thread, NULL);
    s->thread_started = 0;
    free(s->reqs);
    free(s->reap_buf);
    s->reqs = NULL;
    s->reap_buf = NULL;
}
