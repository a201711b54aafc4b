/* Swap store: round trips across 1-3 paths, every fault at every request
 * index, on-disk corruption, stale files, free space, argument errors and
 * engine selection. Run on every I/O engine by ctest: as is, with
 * ZO_SWAP_FORCE_SYNC=1 (sync) and with ZO_SWAP_ENGINE=null. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/ioctl.h>
#include <xxhash.h>

#include "swap_test_util.h"

/* Read the extent's header and payload straight from its file, without the
 * store, and check them against what was written (not on the null engine,
 * which writes no file). */
static void check_on_disk(zo_swap_t s, zo_swap_extent_t e, uint64_t owner, const uint8_t *ref,
                          size_t len, uint64_t gen)
{
    if (!swap_test_engine_uses_disk())
        return;
    const char *path;
    uint64_t off, poff;
    ZO_ASSERT_OK(zo_swap_extent_location(s, e, &path, &off, &poff));
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    uint64_t hdr[8];
    assert_int_equal(pread(fd, hdr, sizeof hdr, (off_t)off), (ssize_t)sizeof hdr);
    uint8_t *payload = malloc(len);
    assert_non_null(payload);
    assert_int_equal(pread(fd, payload, len, (off_t)poff), (ssize_t)len);
    close(fd);
    /* layout: magic, version|header_bytes, owner, length, generation, xxh3 */
    assert_int_equal(hdr[2], owner);
    assert_int_equal(hdr[3], len);
    assert_int_equal(hdr[4], gen);
    assert_int_equal(hdr[1] & 0xffffffffu, 2); /* the format version */
    assert_int_equal(hdr[5], XXH3_64bits(ref, len));
    assert_memory_equal(payload, ref, len);
    free(payload);
}

typedef struct live_extent {
    zo_swap_extent_t ext;
    uint64_t owner, gen, seed;
    size_t len;
    int live;
} live_extent;

static size_t random_len(uint64_t *rng, size_t max)
{
    switch (zo_test_rand(rng) % 4) {
    case 0: return 1 + zo_test_rand(rng) % 4096;                  /* tail only */
    case 1: return (1 + zo_test_rand(rng) % (max / 4096)) * 4096; /* whole blocks */
    default: return 1 + zo_test_rand(rng) % max;                  /* anything */
    }
}

/* Writes (many in flight), reads and frees in random order; checks the
 * stripes, the bytes read back and the headers on disk. */
static void round_trip(swap_test_fixture *f, size_t npaths, int registered)
{
    enum { NEXT = 12 };
    const size_t ext_bytes = 300000; /* not a multiple of 4 KiB on purpose */
    zo_swap_config c = swap_test_config(&f->dirs, npaths, NEXT * ext_bytes, ext_bytes);
    zo_swap_t s;
    ZO_ASSERT_OK(zo_swap_open(&c, &s));
    swap_test_check_engine(s);
    uint64_t rng = 1234 + npaths * 10 + (uint64_t)registered;
    uint8_t *pool = swap_test_alloc(NEXT * 303104);
    uint8_t *rbuf = swap_test_alloc(303104);
    assert_non_null(pool);
    assert_non_null(rbuf);
    if (registered)
        ZO_ASSERT_OK(zo_swap_register_buffer(s, pool, NEXT * 303104));
    live_extent ex[NEXT];
    memset(ex, 0, sizeof ex);
    const char *prev_path = NULL;
    for (int round = 0; round < 6; round++) {
        zo_swap_io_t io[NEXT] = {0};
        for (int i = 0; i < NEXT; i++) {
            if (!ex[i].live) {
                ex[i].owner = zo_test_rand(&rng);
                ZO_ASSERT_OK(zo_swap_alloc_extent(s, ex[i].owner, &ex[i].ext));
                const char *path;
                ZO_ASSERT_OK(zo_swap_extent_location(s, ex[i].ext, &path, NULL, NULL));
                /* A fresh store hands out extents round-robin over the files. */
                if (round == 0 && npaths > 1 && prev_path)
                    assert_string_not_equal(path, prev_path);
                prev_path = path;
                ex[i].live = 1;
            }
            ex[i].len = random_len(&rng, ext_bytes);
            ex[i].gen++;
            ex[i].seed = zo_test_rand(&rng);
            swap_test_fill(pool + i * 303104, ex[i].len, ex[i].seed);
            ZO_ASSERT_OK(zo_swap_write_async(s, ex[i].ext, pool + i * 303104, ex[i].len, ex[i].gen,
                                             NULL, NULL, &io[i]));
        }
        for (int i = 0; i < NEXT; i++)
            ZO_ASSERT_OK(zo_swap_wait(io[i]));
        for (int k = 0; k < NEXT; k++) {
            int i = (int)(zo_test_rand(&rng) % NEXT);
            memset(rbuf, 0xEE, 303104);
            ZO_ASSERT_OK(zo_swap_read(s, ex[i].ext, rbuf, ex[i].len, ex[i].gen));
            assert_memory_equal(rbuf, pool + i * 303104, ex[i].len);
            /* Bytes past len are not touched. */
            for (size_t b = ex[i].len; b < ((ex[i].len + 4095) & ~(size_t)4095); b++)
                assert_int_equal(rbuf[b], 0xEE);
            check_on_disk(s, ex[i].ext, ex[i].owner, pool + i * 303104, ex[i].len, ex[i].gen);
        }
        /* Free a few so later allocations land at other offsets. */
        for (int i = 0; i < NEXT; i++) {
            if (zo_test_rand(&rng) % 3 == 0) {
                ZO_ASSERT_OK(zo_swap_free_extent(s, ex[i].ext));
                ex[i].live = 0;
                ex[i].gen = 0;
            }
        }
    }
    zo_swap_stats st = ZO_SWAP_STATS_INIT;
    ZO_ASSERT_OK(zo_swap_get_stats(s, &st));
    assert_int_equal(st.writes, 6 * NEXT);
    assert_int_equal(st.reads, 6 * NEXT);
    assert_int_equal(st.errors, 0);
    assert_int_equal(st.nfiles, npaths);
    /* Registered buffers are used where the engine has them. */
    if (registered && !strcmp(zo_swap_engine_name(s), "io_uring"))
        assert_true(st.requests_fixed > 0);
    if (!registered)
        assert_int_equal(st.requests_fixed, 0);
    if (registered)
        ZO_ASSERT_OK(zo_swap_unregister_buffer(s, pool));
    zo_swap_close(s);
    free(pool);
    free(rbuf);
}

static void test_round_trip_1_path(void **state)
{
    round_trip(*state, 1, 0);
}
static void test_round_trip_2_paths(void **state)
{
    round_trip(*state, 2, 0);
}
static void test_round_trip_3_paths(void **state)
{
    round_trip(*state, 3, 1);
}

/* ---- faults ---- */

enum { SEQ_OPS = 4 };
#define FAULT_BS (8u << 10)
#define LEN_A    (3 * FAULT_BS + 100) /* three payload blocks, a tail, a header */
#define LEN_B    (2 * 4096)           /* one payload block, a header */

typedef struct fault_world {
    zo_swap_t s;
    zo_swap_extent_t a, b, c;
    uint8_t *wa, *wb, *ra, *rb, *ref_a, *ref_b, *ref_c, *rc;
    uint64_t gen;
} fault_world;

/* write A, read A, write B, read B; stops at the first failure and returns
 * its index (SEQ_OPS when all succeed) and status. */
static int run_sequence(fault_world *w, zo_status *failed, char *msg, size_t cap)
{
    w->gen++;
    for (int i = 0; i < SEQ_OPS; i++) {
        zo_status st;
        switch (i) {
        case 0: st = zo_swap_write(w->s, w->a, w->wa, LEN_A, w->gen); break;
        case 1: st = zo_swap_read(w->s, w->a, w->ra, LEN_A, w->gen); break;
        case 2: st = zo_swap_write(w->s, w->b, w->wb, LEN_B, w->gen); break;
        default: st = zo_swap_read(w->s, w->b, w->rb, LEN_B, w->gen); break;
        }
        if (st != ZO_OK) {
            *failed = st;
            snprintf(msg, cap, "%s", zo_last_error());
            return i;
        }
    }
    assert_memory_equal(w->ra, w->ref_a, LEN_A);
    assert_memory_equal(w->rb, w->ref_b, LEN_B);
    return SEQ_OPS;
}

static void fault_world_open(swap_test_fixture *f, fault_world *w)
{
    memset(w, 0, sizeof *w);
    zo_swap_config c = swap_test_config(&f->dirs, 2, 3 * 64 * 1024, 64 * 1024);
    c.block_size = FAULT_BS;
    zo_swap_fault never = {ZO_SWAP_FAULT_EIO, UINT64_MAX, 0};
    c.faults = &never; /* wraps the engine in the fault engine */
    c.nfaults = 1;
    ZO_ASSERT_OK(zo_swap_open(&c, &w->s));
    swap_test_check_engine(w->s);
    assert_non_null(strstr(zo_swap_engine_name(w->s), "fault+"));
    ZO_ASSERT_OK(zo_swap_alloc_extent(w->s, 0xA, &w->a));
    ZO_ASSERT_OK(zo_swap_alloc_extent(w->s, 0xB, &w->b));
    ZO_ASSERT_OK(zo_swap_alloc_extent(w->s, 0xC, &w->c));
    uint8_t **bufs[] = {&w->wa, &w->wb, &w->ra, &w->rb, &w->ref_a, &w->ref_b, &w->ref_c, &w->rc};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        *bufs[i] = swap_test_alloc(64 * 1024);
        assert_non_null(*bufs[i]);
    }
    swap_test_fill(w->ref_a, LEN_A, 1);
    swap_test_fill(w->ref_b, LEN_B, 2);
    swap_test_fill(w->ref_c, LEN_A, 3);
    memcpy(w->wa, w->ref_a, LEN_A);
    memcpy(w->wb, w->ref_b, LEN_B);
    /* C is the bystander that no fault may touch. */
    ZO_ASSERT_OK(zo_swap_write(w->s, w->c, w->ref_c, LEN_A, 77));
}

static void fault_world_close(fault_world *w)
{
    zo_swap_close(w->s);
    free(w->wa), free(w->wb), free(w->ra), free(w->rb);
    free(w->ref_a), free(w->ref_b), free(w->ref_c), free(w->rc);
}

static zo_status expected_status(zo_swap_fault_kind k)
{
    return k == ZO_SWAP_FAULT_EIO ? ZO_ERR_IO : k == ZO_SWAP_FAULT_NOSPC ? ZO_ERR_NO_SPACE : ZO_OK;
}

static void check_after_fault(fault_world *w)
{
    /* The caller's write buffers are intact, the bystander is unharmed. */
    assert_memory_equal(w->wa, w->ref_a, LEN_A);
    assert_memory_equal(w->wb, w->ref_b, LEN_B);
    ZO_ASSERT_OK(zo_swap_read(w->s, w->c, w->rc, LEN_A, 77));
    assert_memory_equal(w->rc, w->ref_c, LEN_A);
    /* And the store is still usable: the whole sequence passes again. */
    zo_status st = ZO_OK;
    char msg[512];
    assert_int_equal(run_sequence(w, &st, msg, sizeof msg), SEQ_OPS);
}

static void test_every_fault_at_every_index(void **state)
{
    fault_world w;
    fault_world_open(*state, &w);
    zo_swap_stats st0 = ZO_SWAP_STATS_INIT, st1 = ZO_SWAP_STATS_INIT;
    ZO_ASSERT_OK(zo_swap_get_stats(w.s, &st0));
    zo_status fst;
    char msg[512];
    assert_int_equal(run_sequence(&w, &fst, msg, sizeof msg), SEQ_OPS);
    ZO_ASSERT_OK(zo_swap_get_stats(w.s, &st1));
    uint64_t nreq = st1.requests - st0.requests;
    assert_int_equal(nreq, 5 + 5 + 2 + 2);
    int injected = 0;
    for (int kind = 0; kind < ZO_SWAP_FAULT_KIND_COUNT_; kind++) {
        for (uint64_t idx = 0; idx < nreq; idx++) {
            zo_swap_fault ft = {(zo_swap_fault_kind)kind, idx, 3};
            ZO_ASSERT_OK(zo_swap_set_faults(w.s, &ft, 1));
            zo_swap_stats before = ZO_SWAP_STATS_INIT, after = ZO_SWAP_STATS_INIT;
            ZO_ASSERT_OK(zo_swap_get_stats(w.s, &before));
            zo_status got = ZO_OK;
            msg[0] = 0;
            int at = run_sequence(&w, &got, msg, sizeof msg);
            ZO_ASSERT_OK(zo_swap_set_faults(w.s, NULL, 0));
            ZO_ASSERT_OK(zo_swap_get_stats(w.s, &after));
            zo_status want = expected_status((zo_swap_fault_kind)kind);
            if (want == ZO_OK) {
                if (at != SEQ_OPS)
                    fail_msg("fault kind %d at request %llu: op %d failed: %s", kind,
                             (unsigned long long)idx, at, msg);
                assert_true(after.retries + after.short_ios > before.retries + before.short_ios ||
                            kind == ZO_SWAP_FAULT_DELAY);
            } else {
                if (at == SEQ_OPS || got != want)
                    fail_msg("fault kind %d at request %llu: op %d returned %d, expected %d (%s)",
                             kind, (unsigned long long)idx, at, (int)got, (int)want, msg);
                /* The message names the file and the offset. */
                assert_non_null(strstr(msg, "zoffload.swap."));
                assert_non_null(strstr(msg, "offset"));
                assert_int_equal(after.errors, before.errors + 1);
                injected++;
            }
            check_after_fault(&w);
        }
    }
    assert_int_equal(injected, 2 * (int)nreq);
    fault_world_close(&w);
}

/* A failed write keeps the old header, or leaves a torn extent: the next
 * read must never return wrong bytes as good ones. */
static void test_failed_write_never_reads_back_wrong(void **state)
{
    fault_world w;
    fault_world_open(*state, &w);
    for (uint64_t idx = 0; idx < 5; idx++) {
        ZO_ASSERT_OK(zo_swap_write(w.s, w.a, w.ref_c, LEN_A, 500 + idx));
        swap_test_fill(w.wa, LEN_A, 900 + idx);
        zo_swap_fault ft = {ZO_SWAP_FAULT_EIO, idx, 0};
        ZO_ASSERT_OK(zo_swap_set_faults(w.s, &ft, 1));
        ZO_ASSERT_ST(zo_swap_write(w.s, w.a, w.wa, LEN_A, 600 + idx), ZO_ERR_IO);
        ZO_ASSERT_OK(zo_swap_set_faults(w.s, NULL, 0));
        /* The new generation never became valid. */
        ZO_ASSERT_ST(zo_swap_read(w.s, w.a, w.ra, LEN_A, 600 + idx), ZO_ERR_CORRUPT);
        /* The old one is either intact (nothing written) or detected torn. */
        zo_status st = zo_swap_read(w.s, w.a, w.ra, LEN_A, 500 + idx);
        if (st == ZO_OK)
            assert_memory_equal(w.ra, w.ref_c, LEN_A);
        else
            assert_int_equal(st, ZO_ERR_CORRUPT);
    }
    memcpy(w.wa, w.ref_a, LEN_A);
    fault_world_close(&w);
}

/* ---- corruption on disk ---- */

static void flip_byte(const char *path, uint64_t off)
{
    int fd = open(path, O_RDWR | O_DIRECT);
    assert_true(fd >= 0);
    uint8_t *blk = swap_test_alloc(4096);
    uint64_t base = off & ~(uint64_t)4095;
    assert_int_equal(pread(fd, blk, 4096, (off_t)base), 4096);
    blk[off - base] ^= 0x01;
    assert_int_equal(pwrite(fd, blk, 4096, (off_t)base), 4096);
    close(fd);
    free(blk);
}

static void test_flipped_byte_detected(void **state)
{
    if (!swap_test_engine_uses_disk()) {
        print_message("skipped on the null engine: it keeps extents in memory, not in the file\n");
        skip();
    }
    swap_test_fixture *f = *state;
    zo_swap_config c = swap_test_config(&f->dirs, 2, 4 << 20, 1 << 20);
    zo_swap_t s;
    ZO_ASSERT_OK(zo_swap_open(&c, &s));
    const size_t len = 700001;
    uint8_t *w = swap_test_alloc(len), *r = swap_test_alloc(len);
    swap_test_fill(w, len, 42);
    zo_swap_extent_t e, other;
    ZO_ASSERT_OK(zo_swap_alloc_extent(s, 7, &other));
    ZO_ASSERT_OK(zo_swap_alloc_extent(s, 8, &e));
    ZO_ASSERT_OK(zo_swap_write(s, other, w, len, 1));
    const char *path;
    uint64_t off, poff;
    ZO_ASSERT_OK(zo_swap_extent_location(s, e, &path, &off, &poff));
    assert_int_equal(poff % (1 << 20), 0); /* 1 MiB extents start on 1 MiB boundaries */
    /* payload body, the unaligned tail, the header */
    const uint64_t where[] = {poff + 123457, poff + len - 1, off + 24};
    for (size_t k = 0; k < 3; k++) {
        ZO_ASSERT_OK(zo_swap_write(s, e, w, len, 10 + k));
        flip_byte(path, where[k]);
        ZO_ASSERT_ST(zo_swap_read(s, e, r, len, 10 + k), ZO_ERR_CORRUPT);
        assert_non_null(strstr(zo_last_error(), path));
        assert_non_null(strstr(zo_last_error(), "offset"));
    }
    /* A whole number of blocks (no tail: the payload hashed in one call). */
    ZO_ASSERT_OK(zo_swap_write(s, e, w, 512 << 10, 13));
    flip_byte(path, poff + 77777);
    ZO_ASSERT_ST(zo_swap_read(s, e, r, 512 << 10, 13), ZO_ERR_CORRUPT);
    assert_non_null(strstr(zo_last_error(), "fails its checksum"));
    /* Stale generation, wrong length: refused too. */
    ZO_ASSERT_OK(zo_swap_write(s, e, w, len, 20));
    ZO_ASSERT_ST(zo_swap_read(s, e, r, len, 19), ZO_ERR_CORRUPT);
    ZO_ASSERT_ST(zo_swap_read(s, e, r, len - 1, 20), ZO_ERR_CORRUPT);
    ZO_ASSERT_OK(zo_swap_read(s, e, r, len, 20));
    assert_memory_equal(r, w, len);
    /* The neighbour never noticed. */
    ZO_ASSERT_OK(zo_swap_read(s, other, r, len, 1));
    assert_memory_equal(r, w, len);
    zo_swap_stats st = ZO_SWAP_STATS_INIT;
    ZO_ASSERT_OK(zo_swap_get_stats(s, &st));
    assert_int_equal(st.corrupt, 6);
    zo_swap_close(s);
    free(w);
    free(r);
}

/* ---- files: stale, foreign, in use, free space ---- */

static void test_stale_file_reuse_or_refuse(void **state)
{
    swap_test_fixture *f = *state;
    zo_swap_config c = swap_test_config(&f->dirs, 2, 1 << 20, 256 << 10);
    c.keep_files = 1; /* what a crash leaves behind */
    zo_swap_t s;
    ZO_ASSERT_OK(zo_swap_open(&c, &s));
    zo_swap_close(s);
    c.keep_files = 0;
    ZO_ASSERT_ST(zo_swap_open(&c, &s), ZO_ERR_EXISTS);
    assert_non_null(strstr(zo_last_error(), "stale swap file"));
    assert_non_null(strstr(zo_last_error(), "ZO_SWAP_REUSE"));
    c.reuse = ZO_SWAP_REUSE;
    ZO_ASSERT_OK(zo_swap_open(&c, &s));
    /* A second store on the same files while the first holds them. */
    zo_swap_t s2 = NULL;
    ZO_ASSERT_ST(zo_swap_open(&c, &s2), ZO_ERR_EXISTS);
    assert_null(s2);
    zo_swap_close(s);
    /* The clean close removed the files: a plain open works. */
    c.reuse = ZO_SWAP_REFUSE;
    ZO_ASSERT_OK(zo_swap_open(&c, &s));
    zo_swap_close(s);
    /* A file that is not ours is never overwritten. */
    char p[700];
    snprintf(p, sizeof p, "%s/zoffload.swap.1", f->dirs.paths[1]);
    FILE *fp = fopen(p, "w");
    assert_non_null(fp);
    fputs("someone else's data", fp);
    fclose(fp);
    c.reuse = ZO_SWAP_REUSE;
    ZO_ASSERT_ST(zo_swap_open(&c, &s), ZO_ERR_EXISTS);
    assert_non_null(strstr(zo_last_error(), "not a zoffload swap file"));
    /* The refused open left nothing behind in the first path. */
    snprintf(p, sizeof p, "%s/zoffload.swap.0", f->dirs.paths[0]);
    assert_int_equal(access(p, F_OK), -1);
}

static void test_not_enough_space(void **state)
{
    swap_test_fixture *f = *state;
    zo_swap_config c = swap_test_config(&f->dirs, 2, 1ull << 50, 1ull << 34);
    zo_swap_t s = NULL;
    ZO_ASSERT_ST(zo_swap_open(&c, &s), ZO_ERR_NO_SPACE);
    assert_null(s);
    assert_non_null(strstr(zo_last_error(), "missing"));
    assert_non_null(strstr(zo_last_error(), f->dirs.paths[0]));
}

static void test_argument_errors(void **state)
{
    swap_test_fixture *f = *state;
    zo_swap_config c = swap_test_config(&f->dirs, 1, 2 * 65536, 65536);
    zo_swap_t s = NULL;
    c.block_size = 1000;
    ZO_ASSERT_ST(zo_swap_open(&c, &s), ZO_ERR_INVALID_ARG);
    c.block_size = 65536;
    c.engine = "libaio";
    ZO_ASSERT_ST(zo_swap_open(&c, &s), ZO_ERR_CONFIG);
    c.engine = "auto";
    c.npaths = 0;
    ZO_ASSERT_ST(zo_swap_open(&c, &s), ZO_ERR_INVALID_ARG);
    c.npaths = 1;
    c.struct_size = 8;
    ZO_ASSERT_ST(zo_swap_open(&c, &s), ZO_ERR_INVALID_ARG);
    c.struct_size = sizeof c;
    ZO_ASSERT_OK(zo_swap_open(&c, &s));
    uint8_t *buf = swap_test_alloc(65536 + 4096);
    zo_swap_extent_t e1, e2, e3;
    ZO_ASSERT_OK(zo_swap_alloc_extent(s, 1, &e1));
    ZO_ASSERT_OK(zo_swap_alloc_extent(s, 2, &e2));
    ZO_ASSERT_ST(zo_swap_alloc_extent(s, 3, &e3), ZO_ERR_BUDGET);
    ZO_ASSERT_ST(zo_swap_write(s, e1, buf + 8, 100, 1), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "aligned"));
    ZO_ASSERT_ST(zo_swap_write(s, e1, buf, 65536 + 1, 1), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_swap_write(s, 99, buf, 100, 1), ZO_ERR_INVALID_ARG);
    /* Reading what was never written. */
    ZO_ASSERT_ST(zo_swap_read(s, e2, buf, 100, 1), ZO_ERR_CORRUPT);
    ZO_ASSERT_OK(zo_swap_free_extent(s, e2));
    ZO_ASSERT_ST(zo_swap_free_extent(s, e2), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_swap_write(s, e2, buf, 100, 1), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_swap_set_faults(s, NULL, 0), ZO_ERR_STATE);
    zo_swap_close(s);
    zo_swap_close(NULL);
    free(buf);
}

/* ---- callbacks and busy extents ---- */

typedef struct cb_count {
    atomic_int ok, failed;
} cb_count;

static void count_cb(void *user, zo_status st, const char *msg)
{
    cb_count *c = user;
    if (st == ZO_OK)
        atomic_fetch_add(&c->ok, 1);
    else
        atomic_fetch_add(&c->failed, 1);
}

static void test_callbacks_and_busy(void **state)
{
    swap_test_fixture *f = *state;
    zo_swap_config c = swap_test_config(&f->dirs, 3, 8 << 20, 1 << 20);
    zo_swap_fault ft = {ZO_SWAP_FAULT_DELAY, 0, 300}; /* keep the first write in flight */
    c.faults = &ft;
    c.nfaults = 1;
    zo_swap_t s;
    ZO_ASSERT_OK(zo_swap_open(&c, &s));
    uint8_t *buf = swap_test_alloc(8 << 20);
    swap_test_fill(buf, 8 << 20, 5);
    cb_count cnt = {0, 0};
    zo_swap_extent_t e[8];
    zo_swap_io_t first = NULL;
    for (int i = 0; i < 8; i++) {
        ZO_ASSERT_OK(zo_swap_alloc_extent(s, (uint64_t)i, &e[i]));
        ZO_ASSERT_OK(zo_swap_write_async(s, e[i], buf + ((size_t)i << 20), 1 << 20, 1, count_cb,
                                         &cnt, i == 0 ? &first : NULL));
    }
    ZO_ASSERT_ST(zo_swap_write_async(s, e[0], buf, 4096, 2, count_cb, &cnt, NULL), ZO_ERR_STATE);
    ZO_ASSERT_ST(zo_swap_free_extent(s, e[0]), ZO_ERR_STATE);
    ZO_ASSERT_OK(zo_swap_wait(first));
    while (atomic_load(&cnt.ok) + atomic_load(&cnt.failed) < 8)
        sched_yield();
    /* Reads with callbacks only; close drains them. */
    uint8_t *rbuf = swap_test_alloc(8 << 20);
    for (int i = 0; i < 8; i++)
        ZO_ASSERT_OK(zo_swap_read_async(s, e[i], rbuf + ((size_t)i << 20), 1 << 20, 1, count_cb,
                                        &cnt, NULL));
    zo_swap_close(s);
    assert_int_equal(atomic_load(&cnt.ok), 16);
    assert_int_equal(atomic_load(&cnt.failed), 0);
    assert_memory_equal(rbuf, buf, 8 << 20);
    free(buf);
    free(rbuf);
}

/* A store opened with the fault engine wrapped around its engine and no
 * fault armed yet (zo_swap_set_faults arms them later). */
static zo_swap_t open_armable(zo_swap_config *c)
{
    static const zo_swap_fault never = {ZO_SWAP_FAULT_EIO, UINT64_MAX, 0};
    c->faults = &never;
    c->nfaults = 1;
    zo_swap_t s;
    ZO_ASSERT_OK(zo_swap_open(c, &s));
    return s;
}

/* A write's payload goes to disk while its writer hashes it: the header
 * (which carries the hash) waits for the hash even when the payload is
 * done first (the null engine's copies beat a 32 MiB hash), and a write
 * whose payload fails at once still finishes only after its writer let go
 * of it: one callback, with the error, and the extent reads back as never
 * written. */
static void test_write_header_waits_for_its_hash(void **state)
{
    swap_test_fixture *f = *state;
    const size_t len = 32u << 20;
    zo_swap_config c = swap_test_config(&f->dirs, 1, 4 * len, len);
    zo_swap_t s = open_armable(&c);
    uint8_t *buf = swap_test_alloc(len), *rbuf = swap_test_alloc(len);
    swap_test_fill(buf, len, 11);
    zo_swap_extent_t e[4];
    for (int i = 0; i < 4; i++) {
        ZO_ASSERT_OK(zo_swap_alloc_extent(s, (uint64_t)i, &e[i]));
        ZO_ASSERT_OK(zo_swap_write(s, e[i], buf, len - 4096 * (size_t)i - 100, 7));
    }
    for (int i = 0; i < 4; i++) {
        memset(rbuf, 0, len);
        ZO_ASSERT_OK(zo_swap_read(s, e[i], rbuf, len - 4096 * (size_t)i - 100, 7));
        assert_memory_equal(rbuf, buf, len - 4096 * (size_t)i - 100);
    }
    zo_swap_fault ft = {ZO_SWAP_FAULT_EIO, 0, 0}; /* the first payload request fails */
    ZO_ASSERT_OK(zo_swap_set_faults(s, &ft, 1));
    cb_count cnt = {0, 0};
    ZO_ASSERT_OK(zo_swap_write_async(s, e[0], buf, len, 8, count_cb, &cnt, NULL));
    while (atomic_load(&cnt.ok) + atomic_load(&cnt.failed) < 1)
        sched_yield();
    ZO_ASSERT_OK(zo_swap_set_faults(s, NULL, 0));
    ZO_ASSERT_OK(zo_swap_write(s, e[1], buf, len, 8));
    assert_int_equal(atomic_load(&cnt.failed), 1);
    assert_int_equal(atomic_load(&cnt.ok), 0);
    ZO_ASSERT_ST(zo_swap_read(s, e[0], rbuf, len, 8), ZO_ERR_CORRUPT);
    ZO_ASSERT_OK(zo_swap_read(s, e[1], rbuf, len, 8));
    assert_memory_equal(rbuf, buf, len);
    zo_swap_close(s);
    assert_int_equal(atomic_load(&cnt.failed), 1);
    free(buf);
    free(rbuf);
}

/* A read waited on is hashed as it lands: with one request in flight and the
 * last payload block held back, the waiter has hashed at least every block
 * before it by the time the read ends (bytes_hashed_early), the stream continued
 * over the rest gives the writer's one-shot checksum (the bytes read back are
 * the bytes written), and a flipped byte in a block hashed early is still
 * caught. Reads with a callback, or polled with zo_swap_test, hash at the
 * end as before. */
static void test_read_hashed_as_it_lands(void **state)
{
    swap_test_fixture *f = *state;
    const uint32_t bs = 64u << 10;
    const size_t len = (1u << 20) - 100; /* 15 whole blocks, a short one, a tail */
    const size_t early = 15 * (size_t)bs;
    zo_swap_config c = swap_test_config(&f->dirs, 1, 2u << 20, 1u << 20);
    c.queue_depth = 1; /* each request submitted once the one before it was reaped */
    c.block_size = bs;
    zo_swap_t s = open_armable(&c);
    uint8_t *w = swap_test_alloc(len), *r = swap_test_alloc(len);
    assert_non_null(w);
    assert_non_null(r);
    swap_test_fill(w, len, 99);
    zo_swap_extent_t e;
    ZO_ASSERT_OK(zo_swap_alloc_extent(s, 5, &e));
    ZO_ASSERT_OK(zo_swap_write(s, e, w, len, 1));
    /* A read's requests: the header (0), the payload blocks (1..16), the
     * tail (17). The last payload block waits 500 ms before it is sent. */
    zo_swap_fault hold = {ZO_SWAP_FAULT_DELAY, 16, 500};
    ZO_ASSERT_OK(zo_swap_set_faults(s, &hold, 1));
    memset(r, 0, len);
    ZO_ASSERT_OK(zo_swap_read(s, e, r, len, 1));
    assert_memory_equal(r, w, len);
    zo_swap_stats st = ZO_SWAP_STATS_INIT;
    ZO_ASSERT_OK(zo_swap_get_stats(s, &st));
    /* The last block too, when the waiter saw it land before the tail. */
    uint64_t first = st.bytes_hashed_early;
    assert_in_range(first, early, len & ~(size_t)4095);
    /* Polled: verified whole at the end, nothing early. */
    ZO_ASSERT_OK(zo_swap_set_faults(s, &hold, 1));
    zo_swap_io_t io;
    memset(r, 0, len);
    ZO_ASSERT_OK(zo_swap_read_async(s, e, r, len, 1, NULL, NULL, &io));
    zo_status polled;
    while ((polled = zo_swap_test(io)) == ZO_NOT_READY)
        sched_yield();
    ZO_ASSERT_OK(polled);
    ZO_ASSERT_OK(zo_swap_wait(io));
    assert_memory_equal(r, w, len);
    ZO_ASSERT_OK(zo_swap_get_stats(s, &st));
    assert_int_equal(st.bytes_hashed_early, first);
    /* With a callback: verified by the I/O thread, which hashes each block
     * once it has sent the next request (one in flight here), so the whole
     * payload is hashed before the tail lands. */
    cb_count cnt = {0, 0};
    memset(r, 0, len);
    ZO_ASSERT_OK(zo_swap_set_faults(s, &hold, 1));
    ZO_ASSERT_OK(zo_swap_read_async(s, e, r, len, 1, count_cb, &cnt, NULL));
    while (atomic_load(&cnt.ok) + atomic_load(&cnt.failed) < 1)
        sched_yield();
    assert_int_equal(atomic_load(&cnt.ok), 1);
    assert_memory_equal(r, w, len);
    ZO_ASSERT_OK(zo_swap_get_stats(s, &st));
    assert_int_equal(st.reads, 3);
    assert_int_equal(st.bytes_hashed_early, first + (len & ~(size_t)4095));
    first = st.bytes_hashed_early;
    if (swap_test_engine_uses_disk()) {
        /* A byte flipped in the third block, hashed before the read ends. */
        const char *path;
        uint64_t poff;
        ZO_ASSERT_OK(zo_swap_extent_location(s, e, &path, NULL, &poff));
        flip_byte(path, poff + 2 * bs + 4321);
        ZO_ASSERT_OK(zo_swap_set_faults(s, &hold, 1));
        ZO_ASSERT_ST(zo_swap_read(s, e, r, len, 1), ZO_ERR_CORRUPT);
        assert_non_null(strstr(zo_last_error(), "fails its checksum"));
        ZO_ASSERT_OK(zo_swap_get_stats(s, &st));
        assert_int_equal(st.corrupt, 1);
        assert_int_equal(st.bytes_hashed_early, first); /* a failed read counts no bytes */
        /* The I/O thread's hash of a callback's read catches it too. */
        ZO_ASSERT_OK(zo_swap_set_faults(s, &hold, 1));
        ZO_ASSERT_OK(zo_swap_read_async(s, e, r, len, 1, count_cb, &cnt, NULL));
        while (atomic_load(&cnt.ok) + atomic_load(&cnt.failed) < 2)
            sched_yield();
        assert_int_equal(atomic_load(&cnt.failed), 1);
        ZO_ASSERT_OK(zo_swap_get_stats(s, &st));
        assert_int_equal(st.corrupt, 2);
    }
    ZO_ASSERT_OK(zo_swap_set_faults(s, NULL, 0));
    zo_swap_close(s);
    free(w);
    free(r);
}

/* zo_swap_files_bytes predicts the bytes each store preallocates, for small
 * and 1 MiB-strided extents over one to three files; the files' sizes on
 * disk say the same. */
static void test_files_bytes_predicted(void **state)
{
    swap_test_fixture *f = *state;
    static const uint64_t extents[] = {4096, 300000, 1u << 20, (3u << 20) + 8192};
    for (size_t e = 0; e < sizeof extents / sizeof extents[0]; e++)
        for (size_t npaths = 1; npaths <= SWAP_TEST_MAX_PATHS; npaths++)
            for (uint64_t n = 1; n <= 7; n += 3) {
                zo_swap_config c =
                    swap_test_config(&f->dirs, npaths, n * extents[e] - 1, extents[e]);
                zo_swap_t s;
                ZO_ASSERT_OK(zo_swap_open(&c, &s));
                zo_swap_stats st = ZO_SWAP_STATS_INIT;
                ZO_ASSERT_OK(zo_swap_get_stats(s, &st));
                uint64_t want = zo_swap_files_bytes(c.capacity, c.extent_bytes, npaths),
                         on_disk = 0;
                for (size_t i = 0; i < npaths; i++) {
                    char p[1200];
                    struct stat sb;
                    snprintf(p, sizeof p, "%s/%s.swap.%zu", c.paths[i], c.name, i);
                    assert_int_equal(stat(p, &sb), 0);
                    on_disk += (uint64_t)sb.st_size;
                }
                zo_swap_close(s);
                assert_int_equal(st.file_bytes, want);
                assert_int_equal(on_disk, want);
            }
    assert_int_equal(zo_swap_files_bytes(0, 4096, 1), 0);
    assert_int_equal(zo_swap_files_bytes(4096, 4096, 0), 0);
}

/* Where the file system put the byte at logical offset off of fd: its
 * physical offset, or -1 when FIEMAP cannot say (errno set). */
static int64_t physical_offset(int fd, uint64_t off)
{
    struct {
        struct fiemap m;
        struct fiemap_extent e[1];
    } q;
    memset(&q, 0, sizeof q);
    q.m.fm_start = off;
    q.m.fm_length = 1;
    q.m.fm_flags = FIEMAP_FLAG_SYNC;
    q.m.fm_extent_count = 1;
    if (ioctl(fd, FS_IOC_FIEMAP, &q.m) != 0)
        return -1;
    if (q.m.fm_mapped_extents != 1 || off < q.e[0].fe_logical) {
        errno = ENODATA;
        return -1;
    }
    return (int64_t)(q.e[0].fe_physical + (off - q.e[0].fe_logical));
}

/* A new file's blocks are reserved in one request before its header is
 * written, so the header table and the payloads after it lie in one run of
 * the disk and the payloads keep the file's alignment. Written header first,
 * the header's block was allocated alone on ext4 and the payloads began one
 * block past a 1 MiB boundary: zo-bench io read ~5% slower. */
static void test_file_reserved_in_one_run(void **state)
{
    swap_test_fixture *f = *state;
    zo_swap_config c = swap_test_config(&f->dirs, 1, 8u << 20, 1u << 20);
    zo_swap_t s;
    ZO_ASSERT_OK(zo_swap_open(&c, &s));
    const char *path;
    uint64_t header, payload;
    ZO_ASSERT_OK(zo_swap_extent_location(s, 0, &path, &header, &payload));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    int64_t first = physical_offset(fd, 0), data = physical_offset(fd, payload);
    int err = errno;
    close(fd);
    zo_swap_close(s);
    if (first < 0 || data < 0) {
        print_message("skipped: FIEMAP cannot map %s here (%s)\n", c.paths[0], strerror(err));
        skip();
    }
    if (data - first != (int64_t)payload)
        fail_msg("payloads at logical %" PRIu64 " lie %" PRId64
                 " bytes past the file's first block "
                 "on disk, not %" PRIu64 ": the file was not reserved in one run",
                 payload, data - first, payload);
}

/* ---- engine selection and probes ---- */

static void test_engine_selection(void **state)
{
    swap_test_fixture *f = *state;
    char why[256];
    int uring = zo_swap_probe_io_uring(why, sizeof why);
    const char *force = getenv("ZO_SWAP_FORCE_SYNC");
    int forced = force && !strcmp(force, "1");
    if (forced)
        assert_int_equal(uring, 0);
    if (!uring)
        assert_true(strlen(why) > 0);
    assert_true(strlen(zo_swap_liburing_version()) > 0);
    int odirect = 0;
    uint64_t free_bytes = 0;
    ZO_ASSERT_OK(zo_swap_probe_dir(f->dirs.paths[0], &odirect, &free_bytes, why, sizeof why));
    assert_int_equal(odirect, 1);
    assert_true(free_bytes > 0);
    ZO_ASSERT_ST(zo_swap_probe_dir("/nonexistent/zo", &odirect, &free_bytes, why, sizeof why),
                 ZO_ERR_NOT_FOUND);

    zo_swap_config c = swap_test_config(&f->dirs, 1, 1 << 20, 1 << 20);
    zo_swap_t s;
    ZO_ASSERT_OK(zo_swap_open(&c, &s));
    const char *named = swap_test_env_engine();
    if (named)
        assert_string_equal(zo_swap_engine_name(s), named);
    else
        assert_string_equal(zo_swap_engine_name(s), uring ? "io_uring" : "sync");
    zo_swap_close(s);
    c.engine = "io_uring";
    if (uring) {
        ZO_ASSERT_OK(zo_swap_open(&c, &s));
        zo_swap_close(s);
    } else {
        ZO_ASSERT_ST(zo_swap_open(&c, &s), ZO_ERR_UNSUPPORTED);
    }
    c.engine = "sync";
    ZO_ASSERT_OK(zo_swap_open(&c, &s));
    assert_string_equal(zo_swap_engine_name(s), "sync");
    zo_swap_close(s);
    c.engine = "null";
    ZO_ASSERT_OK(zo_swap_open(&c, &s));
    assert_string_equal(zo_swap_engine_name(s), "null");
    zo_swap_close(s);
    /* The fault engine wraps another: armed through faults, never by name. */
    c.engine = "fault";
    ZO_ASSERT_ST(zo_swap_open(&c, &s), ZO_ERR_CONFIG);
    assert_non_null(strstr(zo_last_error(), "expected auto, io_uring, sync or null"));
}

int main(int argc, char **argv)
{
    swap_test_require_odirect();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip_1_path, swap_test_setup,
                                        swap_test_teardown),
        cmocka_unit_test_setup_teardown(test_round_trip_2_paths, swap_test_setup,
                                        swap_test_teardown),
        cmocka_unit_test_setup_teardown(test_round_trip_3_paths, swap_test_setup,
                                        swap_test_teardown),
        cmocka_unit_test_setup_teardown(test_every_fault_at_every_index, swap_test_setup,
                                        swap_test_teardown),
        cmocka_unit_test_setup_teardown(test_failed_write_never_reads_back_wrong, swap_test_setup,
                                        swap_test_teardown),
        cmocka_unit_test_setup_teardown(test_flipped_byte_detected, swap_test_setup,
                                        swap_test_teardown),
        cmocka_unit_test_setup_teardown(test_stale_file_reuse_or_refuse, swap_test_setup,
                                        swap_test_teardown),
        cmocka_unit_test_setup_teardown(test_not_enough_space, swap_test_setup, swap_test_teardown),
        cmocka_unit_test_setup_teardown(test_argument_errors, swap_test_setup, swap_test_teardown),
        cmocka_unit_test_setup_teardown(test_callbacks_and_busy, swap_test_setup,
                                        swap_test_teardown),
        cmocka_unit_test_setup_teardown(test_write_header_waits_for_its_hash, swap_test_setup,
                                        swap_test_teardown),
        cmocka_unit_test_setup_teardown(test_read_hashed_as_it_lands, swap_test_setup,
                                        swap_test_teardown),
        cmocka_unit_test_setup_teardown(test_engine_selection, swap_test_setup, swap_test_teardown),
        cmocka_unit_test_setup_teardown(test_files_bytes_predicted, swap_test_setup,
                                        swap_test_teardown),
        cmocka_unit_test_setup_teardown(test_file_reserved_in_one_run, swap_test_setup,
                                        swap_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
