/* zo-train's host memory limit: the cgroup limit read from fake cgroup
 * trees (v1 and v2, the smallest of a cgroup and its ancestors, "max" and
 * the v1 "unlimited" value ignored), and the default limit below the RAM. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zo_test.h"
#include "zt_host_limit.h"

static char g_dir[256];

static void put(const char *rel, const char *text)
{
    char p[600], cmd[700];
    snprintf(p, sizeof p, "%s/%s", g_dir, rel);
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", p);
    assert_int_equal(system(cmd), 0);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static uint64_t limit_of(const char *proc)
{
    char p[400], root[400];
    put("proc", proc);
    snprintf(p, sizeof p, "%s/proc", g_dir);
    snprintf(root, sizeof root, "%s/cg", g_dir);
    return zt_cgroup_limit(p, root);
}

static void test_cgroup_v2(void **state)
{
    (void)state;
    put("cg/memory.max", "max\n");
    put("cg/job/memory.max", "8589934592\n");
    put("cg/job/step/memory.max", "max\n");
    assert_int_equal(limit_of("0::/job/step\n"), 8ull << 30);
    put("cg/job/step/memory.max", "4294967296\n");
    assert_int_equal(limit_of("0::/job/step\n"), 4ull << 30);
    assert_int_equal(limit_of("0::/\n"), 0);
}

static void test_cgroup_v1(void **state)
{
    (void)state;
    put("cg/memory/memory.limit_in_bytes", "9223372036854771712\n");
    put("cg/memory/api/x/memory.limit_in_bytes", "2147483648\n");
    assert_int_equal(limit_of("4:memory:/api/x\n3:cpuset:/\n"), 2ull << 30);
    assert_int_equal(limit_of("4:memory:/\n"), 0);
    assert_int_equal(limit_of("4:memory:/none/here\n"), 0);
}

static void test_default_limit_below_ram(void **state)
{
    (void)state;
    char why[160];
    uint64_t ram = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t limit = zt_host_limit(why, sizeof why);
    assert_true(limit > 0 && limit < ram);
    assert_true(strstr(why, "physical RAM") || strstr(why, "cgroup"));
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/zt-hostlimit-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cgroup_v2),
        cmocka_unit_test(test_cgroup_v1),
        cmocka_unit_test(test_default_limit_below_ram),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
