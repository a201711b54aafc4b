/* The I/O engines' registry: it lists exactly the engines this build has,
 * finds them by name, and its checker refuses a table of another version or
 * one missing a required operation (fault injection on a copy of a real
 * table), naming the table and the slot, and accepts one without the
 * optional slots. Then the null engine on its own:
 * reads return what was written, never-written bytes read as zeros, and
 * the file's end behaves as a file's. */
#include <fcntl.h>
#include <unistd.h>

#include "swap_engine.h"
#include "swap_test_util.h"
#include "zo_internal.h"

static void test_registry_lists_exactly_the_built_engines(void **state)
{
    (void)state;
    static const char *const want[] = {"io_uring", "sync", "null", "fault"};
    const zo_io_engine_ops *const *tab;
    size_t n = zo_io_engines(&tab);
    assert_int_equal(n, sizeof want / sizeof want[0]);
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(tab[i]->name, want[i]);
        ZO_ASSERT_OK(zo_io_engine_ops_check(tab[i]));
        assert_ptr_equal(zo_io_engine_find(want[i]), tab[i]);
    }
    assert_null(zo_io_engine_find("libaio"));
    assert_null(zo_io_engine_find(NULL));
    /* "auto" tries the disk engines only, io_uring first. */
    assert_true(tab[0]->caps & ZO_IO_CAP_AUTO);
    assert_true(tab[1]->caps & ZO_IO_CAP_AUTO);
    assert_false(zo_io_null_ops.caps & ZO_IO_CAP_AUTO);
    assert_true(zo_io_null_ops.caps & ZO_IO_CAP_NO_DISK);
    assert_true(zo_io_fault_ops.caps & ZO_IO_CAP_WRAPPER);
}

static void test_names_checked_against_the_registry(void **state)
{
    (void)state;
    ZO_ASSERT_OK(zo_io_engine_check_name("auto"));
    ZO_ASSERT_OK(zo_io_engine_check_name("null"));
    ZO_ASSERT_ST(zo_io_engine_check_name("libaio"), ZO_ERR_CONFIG);
    assert_non_null(strstr(zo_last_error(), "expected auto, io_uring, sync or null"));
    ZO_ASSERT_ST(zo_io_engine_check_name("fault"), ZO_ERR_CONFIG);
    assert_non_null(strstr(zo_last_error(), "wraps another engine"));
}

static void test_checker_refuses_another_version(void **state)
{
    (void)state;
    zo_io_engine_ops bad = zo_io_sync_ops;
    bad.version = ZO_IO_ENGINE_OPS_VERSION + 1;
    ZO_ASSERT_ST(zo_io_engine_ops_check(&bad), ZO_ERR_INTERNAL);
    assert_non_null(strstr(zo_last_error(), "I/O engine table 'sync'"));
    assert_non_null(strstr(zo_last_error(), "version"));
    /* And no engine is made from it. */
    zo_io_engine *e = (zo_io_engine *)0x1;
    zo_io_engine_args a = {.queue_depth = 4};
    ZO_ASSERT_ST(zo_io_engine_create(&bad, &a, &e), ZO_ERR_INTERNAL);
    assert_null(e);
}

static void test_checker_refuses_a_missing_operation(void **state)
{
    (void)state;
    zo_io_engine_ops bad = zo_io_null_ops;
    bad.reap = NULL;
    ZO_ASSERT_ST(zo_io_engine_ops_check(&bad), ZO_ERR_INTERNAL);
    assert_non_null(strstr(zo_last_error(), "'null'"));
    assert_non_null(strstr(zo_last_error(), "'reap'"));
    bad = zo_io_uring_ops;
    bad.create = NULL;
    ZO_ASSERT_ST(zo_io_engine_ops_check(&bad), ZO_ERR_INTERNAL);
    assert_non_null(strstr(zo_last_error(), "'create'"));
    bad.name = NULL;
    ZO_ASSERT_ST(zo_io_engine_ops_check(&bad), ZO_ERR_INTERNAL);
    ZO_ASSERT_ST(zo_io_engine_ops_check(NULL), ZO_ERR_INTERNAL);
    /* Fixed buffers registered need a way to unregister them. */
    bad = zo_io_uring_ops;
    bad.unregister_buffer = NULL;
    ZO_ASSERT_ST(zo_io_engine_ops_check(&bad), ZO_ERR_INTERNAL);
    assert_non_null(strstr(zo_last_error(), "'unregister_buffer (with register_buffer)'"));
}

/* start, flush and the buffer slots are optional: the front end's
 * fallbacks stand in (the sync and null engines leave them out). */
static void test_checker_accepts_missing_optional_slots(void **state)
{
    (void)state;
    zo_io_engine_ops lean = zo_io_uring_ops;
    lean.start = NULL;
    lean.flush = NULL;
    lean.register_buffer = NULL;
    lean.unregister_buffer = NULL;
    ZO_ASSERT_OK(zo_io_engine_ops_check(&lean));
    assert_null(zo_io_sync_ops.flush);
    assert_null(zo_io_null_ops.register_buffer);
}

/* Submit one request and reap it (the null engine completes at submit). */
static int64_t null_io(zo_io_engine *e, zo_io_dir dir, void *buf, size_t len, uint64_t off)
{
    zo_io_req r = {.dir = dir, .file = 0, .buf = buf, .len = len, .off = off, .buf_index = -1};
    ZO_ASSERT_OK(e->ops->submit(e, &r));
    ZO_ASSERT_OK(zo_io_engine_flush(e));
    zo_io_req *done[2];
    assert_int_equal(e->ops->reap(e, done, 2, 1), 1);
    assert_ptr_equal(done[0], &r);
    return r.result;
}

static void test_null_engine_keeps_what_was_written(void **state)
{
    (void)state;
    char path[] = "/tmp/zo-null-engine-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    assert_int_equal(ftruncate(fd, 1 << 20), 0);
    zo_io_engine *e = NULL;
    zo_io_engine_args a = {.queue_depth = 4};
    ZO_ASSERT_OK(zo_io_engine_create(&zo_io_null_ops, &a, &e));
    assert_string_equal(e->name, "null");
    ZO_ASSERT_OK(e->ops->register_files(e, &fd, 1));
    ZO_ASSERT_OK(zo_io_engine_start(e));
    int index = 7;
    uint8_t *w = swap_test_alloc(8192), *r = swap_test_alloc(8192);
    ZO_ASSERT_OK(zo_io_engine_register_buffer(e, w, 8192, &index));
    assert_int_equal(index, -1); /* the fallback of an engine without fixed buffers */
    zo_io_engine_unregister_buffer(e, index);
    swap_test_fill(w, 8192, 5);
    assert_int_equal(null_io(e, ZO_IO_WRITE, w, 8192, 4096), 8192);
    assert_int_equal(null_io(e, ZO_IO_READ, r, 8192, 4096), 8192);
    assert_memory_equal(r, w, 8192);
    /* Never written: zeros, as a fresh preallocated file. */
    assert_int_equal(null_io(e, ZO_IO_READ, r, 4096, 0), 4096);
    for (int i = 0; i < 4096; i++)
        assert_int_equal(r[i], 0);
    /* The file's end: a short read, then none; a write cannot grow it. */
    assert_int_equal(null_io(e, ZO_IO_READ, r, 8192, (1 << 20) - 4096), 4096);
    assert_int_equal(null_io(e, ZO_IO_READ, r, 4096, 1 << 20), 0);
    assert_true(null_io(e, ZO_IO_WRITE, w, 8192, (1 << 20) - 4096) < 0);
    /* Nothing reached the file. */
    assert_int_equal(pread(fd, r, 8192, 4096), 8192);
    for (int i = 0; i < 8192; i++)
        assert_int_equal(r[i], 0);
    /* wake() ends a blocking reap with nothing done. */
    zo_io_req *done[1];
    e->ops->wake(e);
    assert_int_equal(e->ops->reap(e, done, 1, 1), 0);
    e->ops->destroy(e);
    close(fd);
    free(w);
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry_lists_exactly_the_built_engines),
        cmocka_unit_test(test_names_checked_against_the_registry),
        cmocka_unit_test(test_checker_refuses_another_version),
        cmocka_unit_test(test_checker_refuses_a_missing_operation),
        cmocka_unit_test(test_checker_accepts_missing_optional_slots),
        cmocka_unit_test(test_null_engine_keeps_what_was_written),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
