/* Benchmark stores: the swap store timed as the engine uses it (see
 * zo/swap_bench.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "zo/swap_bench.h"
#include "zo_internal.h"

#define BENCH_SUBSYS "swap"

struct zo_swap_bench {
    zo_swap_t sw;
    zo_swap_extent_t *ext; /* n, or 2n with alternates: i's alternate is n + i */
    uint64_t *gen;         /* the generation each extent was last written with (0: never) */
    uint64_t *len; /* each extent's payload, when given (NULL: extent, the last one shorter) */
    uint8_t *buf;  /* nbuf buffers of extent_bytes, registered */
    uint32_t n, nbuf, window;
    uint32_t cur; /* the current set's first extent: 0 or n (updates flip it) */
    unsigned stages;
    uint64_t bytes, extent;
    int alternates, registered;
};

static size_t extent_len(const struct zo_swap_bench *b, uint32_t i)
{
    uint32_t k = i % b->n;
    if (b->len)
        return (size_t)b->len[k];
    return (size_t)(k + 1 < b->n ? b->extent : b->bytes - (uint64_t)k * b->extent);
}

static uint8_t *slot_buf(const struct zo_swap_bench *b, unsigned slot)
{
    return b->buf + (size_t)slot * b->extent;
}

static zo_status start_write(struct zo_swap_bench *b, uint32_t e, unsigned slot, zo_swap_io_t *io)
{
    b->gen[e]++;
    return zo_swap_write_async(b->sw, b->ext[e], slot_buf(b, slot), extent_len(b, e), b->gen[e],
                               NULL, NULL, io);
}

static zo_status start_read(struct zo_swap_bench *b, uint32_t e, unsigned slot, zo_swap_io_t *io)
{
    if (!b->gen[e])
        return ZO_FAIL(
            ZO_ERR_STATE, BENCH_SUBSYS,
            "benchmark extent %u has not been written yet: run a write pass before reading it", e);
    return zo_swap_read_async(b->sw, b->ext[e], slot_buf(b, slot), extent_len(b, e), b->gen[e],
                              NULL, NULL, io);
}

static void fill_incompressible(uint8_t *p, size_t len)
{
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i + 8 <= len; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
}

/* The buffers sit on transparent huge pages where the kernel allows, as
 * the engine's stages do (they come from the host pool): O_DIRECT through a
 * virtual disk ran the update pipeline about 1.25x faster from 2 MiB pages
 * than from 4 KiB ones on this project's VMs (3.5 GB passes: 2.75-3.03
 * GB/s vs 2.27-2.35), so small pages would time a slower disk than the
 * engine sees. */
#define BENCH_HUGE_PAGE (2u << 20)

static int alloc_buffers(struct zo_swap_bench *b)
{
    size_t bytes = zo_round_up((size_t)b->nbuf * b->extent, BENCH_HUGE_PAGE);
    if (posix_memalign((void **)&b->buf, BENCH_HUGE_PAGE, bytes))
        return -1;
    madvise(b->buf, bytes, MADV_HUGEPAGE); /* a refusal (THP off) only means small pages */
    return 0;
}

static zo_status check_config(const zo_swap_bench_config *c)
{
    const char *bad =
        !c || c->struct_size < sizeof *c ? "a zo_swap_bench_config from ZO_SWAP_BENCH_CONFIG_INIT"
        : !c->path                       ? "a directory (path)"
        : !c->bytes && !c->lengths       ? "bytes > 0 to move per pass"
        : !c->extent_bytes || c->extent_bytes % ZO_SWAP_ALIGN ? "extent_bytes a multiple of 4096"
        : c->stages == 1 ? "stages 0 (the engine's 3) or at least 2"
                         : NULL;
    if (bad)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, BENCH_SUBSYS, "zo_swap_bench_open: needs %s", bad);
    for (uint32_t i = 0; c->lengths && i < c->n_lengths; i++)
        if (!c->lengths[i] || c->lengths[i] > c->extent_bytes)
            return ZO_FAIL(ZO_ERR_INVALID_ARG, BENCH_SUBSYS,
                           "zo_swap_bench_open: lengths[%u] = %llu: needs 1 to extent_bytes (%llu)",
                           i, (unsigned long long)c->lengths[i],
                           (unsigned long long)c->extent_bytes);
    if (c->lengths && (!c->n_lengths || c->n_lengths > UINT32_MAX / 2))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, BENCH_SUBSYS,
                       "zo_swap_bench_open: n_lengths %u: needs 1 or more", c->n_lengths);
    if (!c->lengths && (c->bytes + c->extent_bytes - 1) / c->extent_bytes > UINT32_MAX / 2)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, BENCH_SUBSYS,
                       "zo_swap_bench_open: %llu bytes in extents of %llu is too many extents: use "
                       "larger extents",
                       (unsigned long long)c->bytes, (unsigned long long)c->extent_bytes);
    return ZO_OK;
}

static zo_status open_store(struct zo_swap_bench *b, const zo_swap_bench_config *c)
{
    const char *paths[1] = {c->path};
    zo_swap_config sc = ZO_SWAP_CONFIG_INIT;
    sc.paths = paths;
    sc.npaths = 1;
    sc.capacity = (uint64_t)b->n * b->extent * (b->alternates ? 2 : 1);
    sc.extent_bytes = b->extent;
    if (c->engine)
        sc.engine = c->engine;
    if (c->queue_depth)
        sc.queue_depth = c->queue_depth;
    if (c->block_size)
        sc.block_size = c->block_size;
    sc.name = c->name ? c->name : "zo-bench";
    sc.reuse = ZO_SWAP_REUSE; /* a file an interrupted benchmark left is ours to take over */
    ZO_TRY(zo_swap_open(&sc, &b->sw));
    ZO_TRY(zo_swap_register_buffer(b->sw, b->buf, (size_t)b->nbuf * b->extent));
    b->registered = 1;
    for (uint32_t i = 0; i < b->n * (b->alternates ? 2u : 1u); i++)
        ZO_TRY(zo_swap_alloc_extent(b->sw, i, &b->ext[i]));
    return ZO_OK;
}

zo_status zo_swap_bench_open(const zo_swap_bench_config *c, zo_swap_bench_t *out)
{
    if (!out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, BENCH_SUBSYS, "zo_swap_bench_open: out is NULL");
    *out = NULL;
    ZO_TRY(check_config(c));
    struct zo_swap_bench *b = calloc(1, sizeof *b);
    if (!b)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, BENCH_SUBSYS, "allocating a benchmark store");
    if (c->lengths) {
        b->n = c->n_lengths;
        b->len = malloc((size_t)b->n * sizeof *b->len);
        if (!b->len) {
            uint32_t n = b->n;
            free(b);
            return ZO_FAIL(ZO_ERR_NO_MEMORY, BENCH_SUBSYS, "allocating %u extent lengths", n);
        }
        uint64_t most = 0;
        for (uint32_t i = 0; i < b->n; i++) {
            b->len[i] = c->lengths[i];
            b->bytes += c->lengths[i];
            if (c->lengths[i] > most)
                most = c->lengths[i];
        }
        b->extent = zo_round_up(most, ZO_SWAP_ALIGN);
    } else {
        b->bytes = c->bytes;
        b->n = (uint32_t)((c->bytes + c->extent_bytes - 1) / c->extent_bytes);
        b->extent =
            c->bytes < c->extent_bytes ? zo_round_up(c->bytes, ZO_SWAP_ALIGN) : c->extent_bytes;
    }
    b->stages = c->stages ? c->stages : 3;
    b->window = c->window ? c->window : b->stages;
    if (b->window > b->n)
        b->window = b->n;
    b->nbuf = b->window > b->stages ? b->window : b->stages;
    b->alternates = c->alternates;
    size_t next = (size_t)b->n * (b->alternates ? 2 : 1);
    zo_status st = ZO_OK;
    b->ext = calloc(next, sizeof *b->ext);
    b->gen = calloc(next, sizeof *b->gen);
    if (!b->ext || !b->gen || alloc_buffers(b) < 0) {
        b->buf = NULL;
        st =
            ZO_FAIL(ZO_ERR_NO_MEMORY, BENCH_SUBSYS, "allocating %u benchmark buffers of %llu bytes",
                    b->nbuf, (unsigned long long)b->extent);
    }
    if (st == ZO_OK) {
        fill_incompressible(b->buf, (size_t)b->nbuf * b->extent); /* as optimizer states are */
        st = open_store(b, c);
    }
    if (st < 0) {
        char why[1024];
        snprintf(why, sizeof why, "%s", zo_last_error());
        zo_swap_bench_close(b);
        zo_restore_error(st, why);
        return st;
    }
    *out = b;
    return ZO_OK;
}

/* Extents first..first+n-1 written or read, `window` in flight. Every
 * ticket is waited on in the order it was started, the last `window` ones
 * too: a read's waiter hashes its extent as it lands, so waiting on a later
 * extent first left the earlier ones to be hashed whole after the last
 * request (two 64 MiB extents: about 9 ms of a 0.5 s pass). */
static zo_status plain_pass(struct zo_swap_bench *b, int write, uint32_t first)
{
    zo_swap_io_t *slots = calloc(b->window, sizeof *slots);
    if (!slots)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, BENCH_SUBSYS, "allocating %u tickets", b->window);
    zo_status st = ZO_OK;
    char why[1024] = "";
    for (uint32_t i = 0; i < b->n + b->window; i++) {
        unsigned w = i % b->window;
        zo_status x = zo_swap_wait(slots[w]);
        slots[w] = NULL;
        if (st == ZO_OK && x == ZO_OK && i < b->n)
            x = write ? start_write(b, first + i, w, &slots[w])
                      : start_read(b, first + i, w, &slots[w]);
        if (st == ZO_OK && x < 0) {
            st = x;
            snprintf(why, sizeof why, "%s", zo_last_error());
        }
    }
    free(slots);
    if (st < 0)
        zo_restore_error(st, why);
    return st;
}

/* The update pipeline without the arithmetic. */
typedef struct bench_pipe {
    struct zo_swap_bench *b;
    zo_swap_io_t rd[64], wr[64];
} bench_pipe;

static uint32_t other_set(const struct zo_swap_bench *b)
{
    return b->n - b->cur;
}

static zo_status pipe_read(void *user, uint32_t i, unsigned s)
{
    bench_pipe *p = user;
    return start_read(p->b, p->b->cur + i, s, &p->rd[s]);
}

static zo_status pipe_update(void *user, uint32_t i, unsigned s)
{
    bench_pipe *p = user;
    zo_status st = zo_swap_wait(p->rd[s]);
    p->rd[s] = NULL;
    ZO_TRY(st);
    return start_write(p->b, other_set(p->b) + i, s, &p->wr[s]);
}

static zo_status pipe_drain(void *user, unsigned s)
{
    bench_pipe *p = user;
    zo_status r = zo_swap_wait(p->rd[s]), w = zo_swap_wait(p->wr[s]);
    p->rd[s] = p->wr[s] = NULL;
    return r < 0 ? r : w;
}

static zo_status update_pass(struct zo_swap_bench *b)
{
    static const zo_swap_pipeline_ops ops = {pipe_read, pipe_update, pipe_drain};
    if (b->stages > 64)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, BENCH_SUBSYS,
                       "an update pipeline of %u stages: at most 64", b->stages);
    bench_pipe p;
    memset(&p, 0, sizeof p);
    p.b = b;
    ZO_TRY(zo_swap_pipeline_run(b->n, b->stages, &ops, &p));
    b->cur =
        other_set(b); /* the next pass reads what this one wrote, as the engine's next step does */
    return ZO_OK;
}

static const char *pass_name(zo_swap_bench_pass pass)
{
    switch (pass) {
    case ZO_SWAP_BENCH_WRITE: return "write";
    case ZO_SWAP_BENCH_WRITE_ALTERNATES: return "write-alternates";
    case ZO_SWAP_BENCH_READ: return "read";
    case ZO_SWAP_BENCH_UPDATE: return "update";
    }
    return "unknown";
}

zo_status zo_swap_bench_run(zo_swap_bench_t b, zo_swap_bench_pass pass, double *seconds)
{
    if (!b || (unsigned)pass > ZO_SWAP_BENCH_UPDATE)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, BENCH_SUBSYS, "zo_swap_bench_run: %s",
                       !b ? "no store" : "pass must be write, write-alternates, read or update");
    if (pass != ZO_SWAP_BENCH_WRITE && pass != ZO_SWAP_BENCH_READ && !b->alternates)
        return ZO_FAIL(ZO_ERR_STATE, BENCH_SUBSYS,
                       "a %s pass needs the alternate extents: open the store with alternates = 1",
                       pass_name(pass));
    uint64_t t0 = zo_now_ns();
    zo_status st = pass == ZO_SWAP_BENCH_UPDATE
                       ? update_pass(b)
                       : plain_pass(b, pass != ZO_SWAP_BENCH_READ,
                                    pass == ZO_SWAP_BENCH_WRITE_ALTERNATES ? other_set(b) : b->cur);
    if (seconds)
        *seconds = (double)(zo_now_ns() - t0) * 1e-9;
    return st;
}

uint64_t zo_swap_bench_pass_bytes(zo_swap_bench_t b, zo_swap_bench_pass pass)
{
    if (!b)
        return 0;
    return pass == ZO_SWAP_BENCH_UPDATE ? 2 * b->bytes : b->bytes;
}

uint32_t zo_swap_bench_extents(zo_swap_bench_t b)
{
    return b ? b->n : 0;
}

zo_status zo_swap_bench_stats(zo_swap_bench_t b, zo_swap_stats *out)
{
    if (!b)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, BENCH_SUBSYS, "zo_swap_bench_stats: no store");
    return zo_swap_get_stats(b->sw, out);
}

const char *zo_swap_bench_engine(zo_swap_bench_t b)
{
    return b && b->sw ? zo_swap_engine_name(b->sw) : "";
}

void zo_swap_bench_close(zo_swap_bench_t b)
{
    if (!b)
        return;
    if (b->registered)
        zo_swap_unregister_buffer(b->sw, b->buf);
    zo_swap_close(b->sw);
    free(b->buf);
    free(b->gen);
    free(b->len);
    free(b->ext);
    free(b);
}
