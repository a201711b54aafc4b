/* Core conventions: statuses, the last error, logging filters, tunables,
 * CPU feature detection, huge-page allocation, the process's CPU set. */
#include <stdlib.h>
#include <string.h>

#include "zo/cpu.h"
#include "zo/log.h"
#include "zo_internal.h"
#include "zo_test.h"

static void test_status_strings(void **state)
{
    (void)state;
    assert_string_equal(zo_status_str(ZO_OK), "ok");
    assert_string_equal(zo_status_str(ZO_ERR_OUT_OF_DEVICE_MEMORY), "out of device memory");
    assert_string_equal(zo_status_str((zo_status)-999), "unknown status");
    for (int s = ZO_ERR_INTERNAL; s <= ZO_NOT_READY; s++)
        assert_string_not_equal(zo_status_str((zo_status)s), "unknown status");
}

static void test_last_error_has_file_and_line(void **state)
{
    (void)state;
    zo_clear_error();
    assert_string_equal(zo_last_error(), "");
    int line = __LINE__ + 1;
    zo_status st = ZO_FAIL(ZO_ERR_CONFIG, "test", "key '%s' is bad", "foo");
    assert_int_equal(st, ZO_ERR_CONFIG);
    assert_int_equal(zo_last_error_status(), ZO_ERR_CONFIG);
    char want[128];
    snprintf(want, sizeof want, "test_core.c:%d: configuration error: key 'foo' is bad", line);
    assert_string_equal(zo_last_error(), want);
    zo_clear_error();
    assert_int_equal(zo_last_error_status(), ZO_OK);
}

typedef struct {
    int count;
    char last[256];
    char subsys[32];
} captured;

static void capture(zo_log_level level, const char *subsys, const char *msg, void *user)
{
    (void)level;
    captured *c = user;
    c->count++;
    snprintf(c->last, sizeof c->last, "%s", msg);
    snprintf(c->subsys, sizeof c->subsys, "%s", subsys);
}

static void test_log_filters_and_callback(void **state)
{
    (void)state;
    captured c = {0};
    zo_log_set_callback(capture, &c);
    zo_log_set_level(ZO_LOG_INFO);
    zo_log_set_subsys("swap,offload");
    zo_log(ZO_LOG_INFO, "swap", "hello %d", 1);
    assert_int_equal(c.count, 1);
    assert_string_equal(c.last, "hello 1");
    assert_string_equal(c.subsys, "swap");
    zo_log(ZO_LOG_INFO, "optim", "filtered");
    assert_int_equal(c.count, 1);
    zo_log(ZO_LOG_DEBUG, "swap", "too verbose");
    assert_int_equal(c.count, 1);
    zo_log(ZO_LOG_ERROR, "optim", "errors always pass the subsystem filter");
    assert_int_equal(c.count, 2);
    zo_log_set_subsys(NULL);
    zo_log(ZO_LOG_WARN, "optim", "now on");
    assert_int_equal(c.count, 3);
    zo_log_set_level(ZO_LOG_NONE);
    zo_log(ZO_LOG_ERROR, "x", "silenced");
    assert_int_equal(c.count, 3);
    zo_log_set_level(ZO_LOG_WARN);
    zo_log_set_callback(NULL, NULL);
}

static void test_env_tunables(void **state)
{
    (void)state;
    captured c = {0};
    zo_log_set_callback(capture, &c);
    zo_log_set_level(ZO_LOG_WARN);
    setenv("ZO_TEST_INT", "64M", 1);
    assert_int_equal(zo_env_int("ZO_TEST_INT", 5, 0, INT64_MAX), 64ll << 20);
    setenv("ZO_TEST_INT", "12x", 1);
    assert_int_equal(zo_env_int("ZO_TEST_INT", 5, 0, 100), 5);
    assert_int_equal(c.count, 1);
    assert_non_null(strstr(c.last, "ZO_TEST_INT='12x' is invalid"));
    setenv("ZO_TEST_INT", "101", 1);
    assert_int_equal(zo_env_int("ZO_TEST_INT", 5, 0, 100), 5);
    unsetenv("ZO_TEST_INT");
    assert_int_equal(zo_env_int("ZO_TEST_INT", 5, 0, 100), 5);
    setenv("ZO_TEST_D", "0.25", 1);
    assert_true(zo_env_double("ZO_TEST_D", 1.0, 0.0, 1.0) == 0.25);
    setenv("ZO_TEST_B", "off", 1);
    assert_int_equal(zo_env_bool("ZO_TEST_B", 1), 0);
    setenv("ZO_TEST_B", "maybe", 1);
    assert_int_equal(zo_env_bool("ZO_TEST_B", 1), 1);
    zo_log_set_callback(NULL, NULL);
}

static void test_simd_detection(void **state)
{
    (void)state;
    zo_simd_level d = zo_cpu_simd_detected();
    assert_true(zo_cpu_simd_supported(d));
    assert_true(zo_cpu_simd_supported(ZO_SIMD_SCALAR));
    assert_true(zo_cpu_simd_level() <= d);
    assert_string_not_equal(zo_simd_level_name(d), "?");
}

static void test_fmt_bytes(void **state)
{
    (void)state;
    char b[32];
    assert_string_equal(zo_fmt_bytes(b, sizeof b, 512), "512 B");
    assert_string_equal(zo_fmt_bytes(b, sizeof b, 3u << 29), "1.50 GiB");
}

/* Large blocks come 2 MiB-aligned (so they can sit on huge pages), small
 * ones 4 KiB-aligned; all of it is writable and released with free(). */
static void test_huge_alloc(void **state)
{
    (void)state;
    size_t sizes[] = {0, 100, 4096, (size_t)5 << 20 | 123};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        unsigned char *p = zo_huge_alloc(sizes[i]);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % (sizes[i] >= (2u << 20) ? 2u << 20 : 4096u), 0);
        if (sizes[i])
            memset(p, 0xab, sizes[i]);
        free(p);
    }
}

/* zo_huge_zalloc's blocks are zero at every size, aligned as zo_huge_alloc's,
 * writable to the last byte, and a block given back and taken again is zero
 * again (the engine's optimizer states, accumulators and split bits rely on
 * it: Adam's m and v start at zero). */
static void test_huge_zalloc(void **state)
{
    (void)state;
    size_t sizes[] = {0, 1, 100, 4095, 4096, 4097, (2u << 20) - 1, 2u << 20, (size_t)5 << 20 | 123};
    for (int round = 0; round < 2; round++)
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
            unsigned char *p = zo_huge_zalloc(sizes[i]);
            assert_non_null(p);
            assert_int_equal((uintptr_t)p % (sizes[i] >= (2u << 20) ? 2u << 20 : 4096u), 0);
            size_t bad = 0;
            for (size_t j = 0; j < sizes[i]; j++)
                bad += p[j] != 0;
            assert_int_equal(bad, 0);
            memset(p, 0xab, sizes[i] ? sizes[i] : 1);
            zo_huge_free(p);
        }
    zo_huge_free(NULL);
}

/* The process's CPUs: those of the main thread (this one, unnarrowed). */
static void test_process_cpus(void **state)
{
    (void)state;
    cpu_set_t mine, proc;
    assert_int_equal(sched_getaffinity(0, sizeof mine, &mine), 0);
    assert_int_equal(zo_process_cpus(&proc), 0);
    assert_true(CPU_EQUAL(&mine, &proc));
    /* The main thread bound to one CPU, as an OpenMP runtime binds it: the
     * process's set is still the whole one. */
    if (CPU_COUNT(&mine) < 2)
        return;
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE && !CPU_COUNT(&one); c++)
        if (CPU_ISSET(c, &mine))
            CPU_SET(c, &one);
    assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
    setenv("OMP_PROC_BIND", "true", 1);
    int rc = zo_process_cpus(&proc);
    unsetenv("OMP_PROC_BIND");
    assert_int_equal(sched_setaffinity(0, sizeof mine, &mine), 0);
    assert_int_equal(rc, 0);
    assert_true(CPU_EQUAL(&mine, &proc));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_last_error_has_file_and_line),
        cmocka_unit_test(test_log_filters_and_callback),
        cmocka_unit_test(test_env_tunables),
        cmocka_unit_test(test_simd_detection),
        cmocka_unit_test(test_fmt_bytes),
        cmocka_unit_test(test_huge_alloc),
        cmocka_unit_test(test_huge_zalloc),
        cmocka_unit_test(test_process_cpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
