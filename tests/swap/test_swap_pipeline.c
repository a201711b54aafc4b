/* The update pipeline's schedule (zo_swap_pipeline_run) against its
 * contract, with recording callbacks: every item read once and updated once
 * in order, read before it is updated, read stages - 1 items ahead, a stage
 * read into only once drained, everything drained at the end; a failure at
 * any callback stops new work, drains every stage and is returned with its
 * own message. Then the benchmark store (zo_swap_bench) on a real
 * directory: the bytes each pass moves, and its refusals. */
#include "swap_test_util.h"
#include "zo/swap_bench.h"
#include "zo_internal.h"

#define MAX_STAGES 8

enum { EMPTY = 0, READING = 1, WRITING = 2 };

typedef struct recorder {
    uint32_t n;
    unsigned stages;
    int stage_state[MAX_STAGES];
    uint32_t stage_item[MAX_STAGES];
    uint32_t reads, updates, calls;
    int read_count[64], update_count[64];
    uint32_t fail_at;        /* the call (0-based) that fails, or UINT32_MAX */
    int failed;              /* a failure was injected */
    int calls_after_failure; /* reads or updates started after it */
    int fail_drains_too;     /* every drain after the failure fails with another message */
} recorder;

static zo_status maybe_fail(recorder *r, const char *what)
{
    uint32_t k = r->calls++;
    if (k == r->fail_at) {
        r->failed = 1;
        return ZO_FAIL(ZO_ERR_IO, "test", "injected failure in %s at call %u", what, k);
    }
    return ZO_OK;
}

static zo_status rec_read(void *user, uint32_t i, unsigned s)
{
    recorder *r = user;
    if (r->failed)
        r->calls_after_failure++;
    assert_true(s < r->stages);
    assert_int_equal(s, i % r->stages);
    assert_int_equal(r->stage_state[s], EMPTY); /* drained before it is read into */
    assert_int_equal(i, r->reads);              /* in order, once */
    r->read_count[i]++;
    r->reads++;
    zo_status st = maybe_fail(r, "read");
    if (st < 0)
        return st; /* nothing in flight */
    r->stage_state[s] = READING;
    r->stage_item[s] = i;
    return ZO_OK;
}

static zo_status rec_update(void *user, uint32_t i, unsigned s)
{
    recorder *r = user;
    if (r->failed)
        r->calls_after_failure++;
    assert_int_equal(r->stage_state[s], READING);
    assert_int_equal(r->stage_item[s], i);
    assert_int_equal(i, r->updates);
    /* the reads run stages - 1 items ahead of the update */
    uint32_t ahead = r->stages - 1, want = i + ahead < r->n ? i + ahead : r->n;
    assert_int_equal(r->reads, want);
    r->update_count[i]++;
    r->updates++;
    r->stage_state[s] = WRITING; /* the read was waited for; writes are in flight */
    return maybe_fail(r, "update");
}

static zo_status rec_drain(void *user, unsigned s)
{
    recorder *r = user;
    assert_true(s < r->stages);
    r->stage_state[s] = EMPTY;
    if (r->failed && r->fail_drains_too)
        return ZO_FAIL(ZO_ERR_CORRUPT, "test", "a later failure in drain");
    return maybe_fail(r, "drain");
}

static const zo_swap_pipeline_ops rec_ops = {rec_read, rec_update, rec_drain};

static void recorder_init(recorder *r, uint32_t n, unsigned stages)
{
    memset(r, 0, sizeof *r);
    r->n = n;
    r->stages = stages;
    r->fail_at = UINT32_MAX;
}

static void assert_all_drained(const recorder *r)
{
    for (unsigned s = 0; s < r->stages; s++)
        assert_int_equal(r->stage_state[s], EMPTY);
}

static void test_schedule(void **state)
{
    (void)state;
    const uint32_t ns[] = {0, 1, 2, 3, 4, 7, 20, 64};
    for (unsigned stages = 2; stages <= 5; stages++)
        for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
            recorder r;
            recorder_init(&r, ns[k], stages);
            ZO_ASSERT_OK(zo_swap_pipeline_run(ns[k], stages, &rec_ops, &r));
            assert_int_equal(r.reads, ns[k]);
            assert_int_equal(r.updates, ns[k]);
            for (uint32_t i = 0; i < ns[k]; i++) {
                assert_int_equal(r.read_count[i], 1);
                assert_int_equal(r.update_count[i], 1);
            }
            assert_all_drained(&r);
        }
}

/* Fail each call in turn (reads, updates and drains are numbered together). */
static void test_failure_at_every_call(void **state)
{
    (void)state;
    for (unsigned stages = 2; stages <= 4; stages++)
        for (int later = 0; later <= 1; later++) {
            recorder clean;
            recorder_init(&clean, 9, stages);
            ZO_ASSERT_OK(zo_swap_pipeline_run(9, stages, &rec_ops, &clean));
            for (uint32_t k = 0; k < clean.calls; k++) {
                recorder r;
                recorder_init(&r, 9, stages);
                r.fail_at = k;
                r.fail_drains_too = later;
                zo_clear_error();
                ZO_ASSERT_ST(zo_swap_pipeline_run(9, stages, &rec_ops, &r), ZO_ERR_IO);
                assert_non_null(strstr(zo_last_error(), "injected failure"));
                assert_int_equal(zo_last_error_status(), ZO_ERR_IO);
                assert_int_equal(r.calls_after_failure, 0);
                assert_all_drained(&r);
            }
        }
}

static void test_bad_arguments(void **state)
{
    (void)state;
    recorder r;
    recorder_init(&r, 4, 1);
    ZO_ASSERT_ST(zo_swap_pipeline_run(4, 1, &rec_ops, &r), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "at least 2 stages"));
    zo_swap_pipeline_ops none = {rec_read, NULL, rec_drain};
    ZO_ASSERT_ST(zo_swap_pipeline_run(4, 3, &none, &r), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_swap_pipeline_run(4, 3, NULL, &r), ZO_ERR_INVALID_ARG);
    assert_int_equal(r.calls, 0);
}

/* ---- the benchmark store ---- */

/* Five full extents and a short one: every pass moves exactly its bytes,
 * verified on every read (headers, generations, checksums). */
static void test_bench_passes_move_their_bytes(void **state)
{
    swap_test_fixture *f = *state;
    const uint64_t extent = 64u << 10, bytes = 5 * extent + 12288;
    zo_swap_bench_config c = ZO_SWAP_BENCH_CONFIG_INIT;
    c.path = f->dirs.paths[0];
    c.bytes = bytes;
    c.extent_bytes = extent;
    c.block_size = 16u << 10;
    c.alternates = 1;
    zo_swap_bench_t b;
    ZO_ASSERT_OK(zo_swap_bench_open(&c, &b));
    swap_test_check_engine_name(zo_swap_bench_engine(b));
    assert_int_equal(zo_swap_bench_extents(b), 6);
    assert_int_equal(zo_swap_bench_pass_bytes(b, ZO_SWAP_BENCH_READ), bytes);
    assert_int_equal(zo_swap_bench_pass_bytes(b, ZO_SWAP_BENCH_UPDATE), 2 * bytes);
    double t = -1;
    /* nothing written yet: nothing to read */
    ZO_ASSERT_ST(zo_swap_bench_run(b, ZO_SWAP_BENCH_READ, &t), ZO_ERR_STATE);
    assert_non_null(strstr(zo_last_error(), "run a write pass"));
    ZO_ASSERT_ST(zo_swap_bench_run(b, ZO_SWAP_BENCH_UPDATE, NULL), ZO_ERR_STATE);
    zo_swap_stats s0 = ZO_SWAP_STATS_INIT;
    ZO_ASSERT_OK(zo_swap_bench_stats(b, &s0));
    ZO_ASSERT_OK(zo_swap_bench_run(b, ZO_SWAP_BENCH_WRITE, &t));
    assert_true(t > 0);
    ZO_ASSERT_OK(zo_swap_bench_run(b, ZO_SWAP_BENCH_READ, &t));
    ZO_ASSERT_OK(zo_swap_bench_run(b, ZO_SWAP_BENCH_UPDATE, &t));
    ZO_ASSERT_OK(zo_swap_bench_run(b, ZO_SWAP_BENCH_UPDATE, &t));
    ZO_ASSERT_OK(zo_swap_bench_run(b, ZO_SWAP_BENCH_WRITE_ALTERNATES, &t));
    zo_swap_stats s = ZO_SWAP_STATS_INIT;
    ZO_ASSERT_OK(zo_swap_bench_stats(b, &s));
    assert_int_equal(s.bytes_written - s0.bytes_written,
                     bytes * 4);                               /* write, 2 updates, alternates */
    assert_int_equal(s.bytes_read - s0.bytes_read, bytes * 3); /* read, 2 updates */
    assert_int_equal(s.writes - s0.writes, 4 * 6);
    assert_int_equal(s.corrupt, 0);
    assert_int_equal(s.errors, 0);
    assert_int_equal(s.extents_used, 12);
    zo_swap_bench_close(b);
}

/* Extents of the sizes given (a job's chunks): each pass moves their sum. */
static void test_bench_given_lengths(void **state)
{
    swap_test_fixture *f = *state;
    const uint64_t len[] = {8192, 4096, 65536, 12288, 5000};
    const uint64_t sum = 8192 + 4096 + 65536 + 12288 + 5000;
    zo_swap_bench_config c = ZO_SWAP_BENCH_CONFIG_INIT;
    c.path = f->dirs.paths[0];
    c.extent_bytes = 65536;
    c.lengths = len;
    c.n_lengths = 5;
    c.alternates = 1;
    zo_swap_bench_t b;
    ZO_ASSERT_OK(zo_swap_bench_open(&c, &b));
    assert_int_equal(zo_swap_bench_extents(b), 5);
    assert_int_equal(zo_swap_bench_pass_bytes(b, ZO_SWAP_BENCH_UPDATE), 2 * sum);
    ZO_ASSERT_OK(zo_swap_bench_run(b, ZO_SWAP_BENCH_WRITE, NULL));
    ZO_ASSERT_OK(zo_swap_bench_run(b, ZO_SWAP_BENCH_UPDATE, NULL));
    ZO_ASSERT_OK(
        zo_swap_bench_run(b, ZO_SWAP_BENCH_UPDATE, NULL)); /* reads what the last one wrote */
    ZO_ASSERT_OK(zo_swap_bench_run(b, ZO_SWAP_BENCH_READ, NULL));
    zo_swap_stats s = ZO_SWAP_STATS_INIT;
    ZO_ASSERT_OK(zo_swap_bench_stats(b, &s));
    assert_int_equal(s.bytes_written, 3 * sum);
    assert_int_equal(s.bytes_read, 3 * sum);
    assert_int_equal(s.corrupt, 0);
    zo_swap_bench_close(b);
    const uint64_t too_big[] = {4096, 65537};
    c.lengths = too_big;
    c.n_lengths = 2;
    ZO_ASSERT_ST(zo_swap_bench_open(&c, &b), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "lengths[1] = 65537"));
    const uint64_t zero[] = {0};
    c.lengths = zero;
    c.n_lengths = 1;
    ZO_ASSERT_ST(zo_swap_bench_open(&c, &b), ZO_ERR_INVALID_ARG);
}

static void test_bench_refusals(void **state)
{
    swap_test_fixture *f = *state;
    zo_swap_bench_config c = ZO_SWAP_BENCH_CONFIG_INIT;
    c.path = f->dirs.paths[0];
    c.bytes = 1u << 20;
    c.extent_bytes = 1000; /* not 4 KiB-aligned */
    zo_swap_bench_t b = (zo_swap_bench_t)&c;
    ZO_ASSERT_ST(zo_swap_bench_open(&c, &b), ZO_ERR_INVALID_ARG);
    assert_null(b);
    assert_non_null(strstr(zo_last_error(), "multiple of 4096"));
    c.extent_bytes = 256u << 10;
    c.bytes = 0;
    ZO_ASSERT_ST(zo_swap_bench_open(&c, &b), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zo_last_error(), "bytes > 0"));
    c.bytes = 1u << 20;
    c.path = "/nonexistent/zo-bench-dir";
    ZO_ASSERT_ST(zo_swap_bench_open(&c, &b), ZO_ERR_NOT_FOUND);
    assert_non_null(strstr(zo_last_error(), "/nonexistent/zo-bench-dir"));
    assert_null(b);
    /* without alternates, no update */
    c.path = f->dirs.paths[0];
    ZO_ASSERT_OK(zo_swap_bench_open(&c, &b));
    ZO_ASSERT_OK(zo_swap_bench_run(b, ZO_SWAP_BENCH_WRITE, NULL));
    ZO_ASSERT_ST(zo_swap_bench_run(b, ZO_SWAP_BENCH_UPDATE, NULL), ZO_ERR_STATE);
    assert_non_null(strstr(zo_last_error(), "alternates = 1"));
    ZO_ASSERT_OK(zo_swap_bench_run(b, ZO_SWAP_BENCH_READ, NULL));
    zo_swap_bench_close(b);
    zo_swap_bench_close(NULL);
}

int main(void)
{
    swap_test_require_odirect();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedule),
        cmocka_unit_test(test_failure_at_every_call),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test_setup_teardown(test_bench_passes_move_their_bytes, swap_test_setup,
                                        swap_test_teardown),
        cmocka_unit_test_setup_teardown(test_bench_given_lengths, swap_test_setup,
                                        swap_test_teardown),
        cmocka_unit_test_setup_teardown(test_bench_refusals, swap_test_setup, swap_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
