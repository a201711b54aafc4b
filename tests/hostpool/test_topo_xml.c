/* Topology and pool placement on a made-up two-node machine with a GPU
 * (two_nodes.xml, loaded by hwloc through HWLOC_XMLFILE), so the multi-node
 * paths run on any machine: node order, per-node cores, PCI locality through
 * hwloc's tree, and a pool bound to a node the kernel does not have. */
#include <numa.h>
#include <stdlib.h>
#include <string.h>

#include "hostpool_internal.h"
#include "zo/device.h"
#include "zo/hostpool.h"
#include "zo/log.h"
#include "zo/topo.h"
#include "zo_test.h"

static void check_node(int i, int node, uint64_t mem, int c0, int c1)
{
    zo_topo_node nd = ZO_TOPO_NODE_INIT;
    ZO_ASSERT_OK(zo_topo_get_node(i, &nd));
    assert_int_equal(nd.node, node);
    assert_int_equal(nd.memory_bytes, mem);
    assert_int_equal(nd.n_cores, 2);
    assert_int_equal(nd.n_pus, 2);
    int cpus[4], n = 0;
    ZO_ASSERT_OK(zo_topo_node_cpu_list(node, cpus, 4, &n));
    assert_int_equal(n, 2);
    assert_int_equal(cpus[0], c0);
    assert_int_equal(cpus[1], c1);
}

static void test_nodes_in_os_order(void **state)
{
    (void)state;
    assert_int_equal(zo_topo_numa_node_count(), 2);
    check_node(0, 0, 4ull << 30, 2, 3); /* second in hwloc's tree, first by number */
    check_node(1, 1, 8ull << 30, 0, 1);
    assert_false(zo_topo_node_valid(2));
}

static void test_gpu_locality_through_hwloc(void **state)
{
    (void)state;
    int node = -1;
    char how[64];
    ZO_ASSERT_OK(zo_topo_node_of_pci("0000:81:00.0", &node, how, sizeof how));
    assert_int_equal(node, 1);
    assert_string_equal(how, "hwloc");
    /* A device under the machine as a whole is near no node in particular. */
    ZO_ASSERT_OK(zo_topo_node_of_pci("0000:C1:00.0", &node, how, sizeof how));
    assert_int_equal(node, 0);
    assert_string_equal(how, "no locality reported; first node");
    ZO_ASSERT_ST(zo_topo_node_of_pci("ffff:81:00.0", &node, how, sizeof how),
                 ZO_ERR_NOT_FOUND); /* the domain counts */

    zo_device_info info = ZO_DEVICE_INFO_INIT;
    snprintf(info.backend, sizeof info.backend, "cuda");
    snprintf(info.pci_bus_id, sizeof info.pci_bus_id, "0000:81:00.0");
    zo_hostpool_placement pl = ZO_HOSTPOOL_PLACEMENT_INIT;
    ZO_ASSERT_OK(zo_hostpool_placement_for_info_(&info, &pl));
    assert_int_equal(pl.node, 1);
    assert_int_equal(pl.n_nodes, 2);
    assert_int_equal(pl.n_local_cpus, 2);
    assert_string_equal(pl.reason, "nearest to GPU 0000:81:00.0 via hwloc");
    assert_string_equal(pl.device, "cuda:0 (0000:81:00.0)");
}

static int g_warnings;
static char g_warning[1024];

static void capture(zo_log_level level, const char *subsys, const char *msg, void *user)
{
    (void)user;
    if (level == ZO_LOG_WARN && strcmp(subsys, "hostpool") == 0) {
        g_warnings++;
        snprintf(g_warning, sizeof g_warning, "%s", msg);
    }
}

/* hwloc says node 1 exists; this kernel may not have it. Then a preferred
 * pool warns once and lets the kernel place the memory; a strict one fails. */
static void test_pool_on_a_node_the_kernel_lacks(void **state)
{
    (void)state;
    if (numa_available() >= 0 && numa_max_node() >= 1) {
        print_message("skipped: this kernel has a node 1, so binding to it cannot fail\n");
        skip();
    }
    zo_device_t dev;
    zo_device_config dcfg = ZO_DEVICE_CONFIG_INIT;
    dcfg.backend = "cpu";
    ZO_ASSERT_OK(zo_device_init(&dev, &dcfg));
    zo_hostpool_config cfg = ZO_HOSTPOOL_CONFIG_INIT;
    cfg.max_pinned_bytes = 1 << 20;
    cfg.node = 1;
    zo_hostpool_t pool;
    ZO_ASSERT_OK(zo_hostpool_init(&pool, dev, &cfg));
    zo_log_set_level(ZO_LOG_WARN);
    zo_log_set_callback(capture, NULL);
    void *a, *b;
    ZO_ASSERT_OK(zo_hostpool_alloc(pool, 8192, &a));
    ZO_ASSERT_OK(zo_hostpool_alloc(pool, 8192, &b));
    zo_log_set_callback(NULL, NULL);
    memset(a, 1, 8192);
    memset(b, 2, 8192);
    if (numa_available() >=
        0) { /* without NUMA in the kernel there is nothing to bind, and no warning */
        assert_int_equal(g_warnings, 1);
        assert_non_null(strstr(g_warning, "cannot place memory on NUMA node 1 (mbind"));
    }
    zo_hostpool_free(pool);
    cfg.strict_node = 1;
    ZO_ASSERT_OK(zo_hostpool_init(&pool, dev, &cfg));
    if (numa_available() >= 0) {
        ZO_ASSERT_ST(zo_hostpool_alloc(pool, 8192, &a), ZO_ERR_SYSTEM);
        assert_non_null(strstr(zo_last_error(), "binding 8192 bytes to NUMA node 1 failed"));
        zo_hostpool_stats s = ZO_HOSTPOOL_STATS_INIT;
        ZO_ASSERT_OK(zo_hostpool_get_stats(pool, &s));
        assert_int_equal(s.reserved, 0);
    }
    zo_hostpool_free(pool);
    zo_device_free(dev);
}

int main(void)
{
    if (!getenv("HWLOC_XMLFILE")) {
        fprintf(stderr, "test_topo_xml: skipped: run it with "
                        "HWLOC_XMLFILE=tests/hostpool/two_nodes.xml (ctest does)\n");
        return ZO_TEST_SKIP;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nodes_in_os_order),
        cmocka_unit_test(test_gpu_locality_through_hwloc),
        cmocka_unit_test(test_pool_on_a_node_the_kernel_lacks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
