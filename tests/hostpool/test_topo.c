/* Topology: node count, node cores, thread node and binding, PCI locality,
 * each checked against what libnuma, sched_getaffinity and sysfs say. */
#include <dirent.h>
#include <numa.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zo/topo.h"
#include "zo_test.h"

/* Reference: nodes with memory this process may use, per libnuma. */
static int ref_node_count(void)
{
    if (numa_available() < 0)
        return 1;
    struct bitmask *m = numa_get_mems_allowed();
    int n = 0;
    for (int i = 0; i <= numa_max_node(); i++) {
        long long free_b;
        if (numa_bitmask_isbitset(m, (unsigned)i) && numa_node_size64(i, &free_b) > 0)
            n++;
    }
    numa_bitmask_free(m);
    return n ? n : 1;
}

/* Reference: CPUs of node per libnuma, within this process's affinity. */
static void ref_node_cpus(int node, cpu_set_t *out)
{
    cpu_set_t aff;
    CPU_ZERO(out);
    assert_int_equal(sched_getaffinity(0, sizeof aff, &aff), 0);
    if (numa_available() < 0 || zo_topo_numa_node_count() == 1) {
        *out = aff;
        return;
    }
    struct bitmask *b = numa_allocate_cpumask();
    assert_int_equal(numa_node_to_cpus(node, b), 0);
    for (int c = 0; c < CPU_SETSIZE && c < (int)numa_bitmask_nbytes(b) * 8; c++)
        if (numa_bitmask_isbitset(b, (unsigned)c) && CPU_ISSET(c, &aff))
            CPU_SET(c, out);
    numa_bitmask_free(b);
}

static void test_node_count_and_nodes(void **state)
{
    (void)state;
    int n = zo_topo_numa_node_count();
    assert_int_equal(n, ref_node_count());
    int prev = -1, total_pus = 0;
    for (int i = 0; i < n; i++) {
        zo_topo_node nd = ZO_TOPO_NODE_INIT;
        ZO_ASSERT_OK(zo_topo_get_node(i, &nd));
        assert_true(nd.node > prev);
        prev = nd.node;
        assert_true(zo_topo_node_valid(nd.node));
        assert_true(nd.n_cores <= nd.n_pus);
        cpu_set_t ref, got;
        ref_node_cpus(nd.node, &ref);
        ZO_ASSERT_OK(zo_topo_node_cpuset(nd.node, &got));
        assert_true(CPU_EQUAL(&ref, &got));
        assert_int_equal(nd.n_pus, CPU_COUNT(&ref));
        total_pus += nd.n_pus;
    }
    cpu_set_t aff;
    assert_int_equal(sched_getaffinity(0, sizeof aff, &aff), 0);
    assert_int_equal(total_pus, CPU_COUNT(&aff)); /* every usable core is on exactly one node */
    zo_topo_node nd = ZO_TOPO_NODE_INIT;
    ZO_ASSERT_ST(zo_topo_get_node(n, &nd), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_topo_get_node(-1, &nd), ZO_ERR_INVALID_ARG);
    nd.struct_size = 4;
    ZO_ASSERT_ST(zo_topo_get_node(0, &nd), ZO_ERR_INVALID_ARG);
}

static void test_cpu_list_matches_cpuset(void **state)
{
    (void)state;
    zo_topo_node nd = ZO_TOPO_NODE_INIT;
    ZO_ASSERT_OK(zo_topo_get_node(0, &nd));
    cpu_set_t set;
    ZO_ASSERT_OK(zo_topo_node_cpuset(nd.node, &set));
    int n = -1;
    ZO_ASSERT_OK(zo_topo_node_cpu_list(nd.node, NULL, 0, &n));
    assert_int_equal(n, CPU_COUNT(&set));
    int *cpus = calloc((size_t)n + 1, sizeof *cpus);
    int n2 = -1;
    ZO_ASSERT_OK(zo_topo_node_cpu_list(nd.node, cpus, n, &n2));
    assert_int_equal(n2, n);
    for (int i = 0; i < n; i++) {
        assert_true(CPU_ISSET(cpus[i], &set));
        if (i)
            assert_true(cpus[i] > cpus[i - 1]);
    }
    if (n > 1) { /* a short buffer gets the first entries and the full count */
        int first = -1;
        ZO_ASSERT_OK(zo_topo_node_cpu_list(nd.node, &first, 1, &n2));
        assert_int_equal(n2, n);
        assert_int_equal(first, cpus[0]);
    }
    free(cpus);
    ZO_ASSERT_ST(zo_topo_node_cpu_list(nd.node, NULL, 2, &n2), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_topo_node_cpu_list(nd.node, NULL, 0, NULL), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_topo_node_cpu_list(4095, NULL, 0, &n2), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_topo_node_cpuset(-1, &set), ZO_ERR_INVALID_ARG);
    assert_false(zo_topo_node_valid(4095));
}

/* Bind to each node's cores in turn: the thread's node must follow. */
static void test_bind_and_node_of_thread(void **state)
{
    (void)state;
    cpu_set_t saved;
    assert_int_equal(sched_getaffinity(0, sizeof saved, &saved), 0);
    for (int i = 0; i < zo_topo_numa_node_count(); i++) {
        zo_topo_node nd = ZO_TOPO_NODE_INIT;
        ZO_ASSERT_OK(zo_topo_get_node(i, &nd));
        if (nd.n_pus == 0)
            continue; /* a memory-only node cannot run threads */
        ZO_ASSERT_OK(zo_topo_bind_thread_to_node(nd.node));
        cpu_set_t now, want;
        assert_int_equal(sched_getaffinity(0, sizeof now, &now), 0);
        ZO_ASSERT_OK(zo_topo_node_cpuset(nd.node, &want));
        assert_true(CPU_EQUAL(&now, &want));
        int node = -1, cpu = -1;
        ZO_ASSERT_OK(zo_topo_node_of_thread(&node, &cpu));
        assert_int_equal(node, nd.node);
        assert_true(CPU_ISSET(cpu, &want));
        /* A single core: sched_getcpu must report exactly that one. */
        int first;
        int n;
        ZO_ASSERT_OK(zo_topo_node_cpu_list(nd.node, &first, 1, &n));
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(first, &one);
        ZO_ASSERT_OK(zo_topo_bind_thread(&one));
        ZO_ASSERT_OK(zo_topo_node_of_thread(&node, &cpu));
        assert_int_equal(cpu, first);
        assert_int_equal(node, nd.node);
    }
    cpu_set_t empty;
    CPU_ZERO(&empty);
    ZO_ASSERT_ST(zo_topo_bind_thread(&empty), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_topo_bind_thread(NULL), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_topo_bind_thread_to_node(4095), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_topo_node_of_thread(NULL, NULL), ZO_ERR_INVALID_ARG);
    assert_int_equal(sched_setaffinity(0, sizeof saved, &saved), 0);
}

static void test_pci_bus_id_parsing(void **state)
{
    (void)state;
    const char *bad[] = {"",
                         "zz",
                         "0000:17:00",
                         "0000:100:00.0",
                         "0000:17:20.0",
                         "0000:17:00.8",
                         "0000:17:00.0x",
                         "17.00.0",
                         ":17:00.0",
                         "0000::00.0"};
    int node;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ZO_ASSERT_ST(zo_topo_node_of_pci(bad[i], &node, NULL, 0), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_topo_node_of_pci(NULL, &node, NULL, 0), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_topo_node_of_pci("0000:00:00.0", NULL, NULL, 0), ZO_ERR_INVALID_ARG);
    /* Domain ffff, bus ff: no real machine has it. */
    assert_int_not_equal(access("/sys/bus/pci/devices/ffff:ff:1f.7", F_OK), 0);
    ZO_ASSERT_ST(zo_topo_node_of_pci("ffff:ff:1f.7", &node, NULL, 0), ZO_ERR_NOT_FOUND);
}

/* sysfs's answer for a device: its numa_node when >= 0, else the first node. */
static int ref_pci_node(const char *id)
{
    char path[320];
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", id);
    FILE *f = fopen(path, "r");
    int node = -1;
    if (f) {
        if (fscanf(f, "%d", &node) != 1)
            node = -1;
        fclose(f);
    }
    zo_topo_node first = ZO_TOPO_NODE_INIT;
    zo_topo_get_node(0, &first);
    return node >= 0 && zo_topo_node_valid(node) ? node : first.node;
}

static void upper(char *s)
{
    for (; *s; s++)
        if (*s >= 'a' && *s <= 'f')
            *s = (char)(*s - 'a' + 'A');
}

static void test_pci_locality_matches_sysfs(void **state)
{
    (void)state;
    DIR *d = opendir("/sys/bus/pci/devices");
    int checked = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) && checked < 16) {
        if (e->d_name[0] == '.')
            continue;
        int node = -1, want = ref_pci_node(e->d_name);
        char how[64] = "";
        ZO_ASSERT_OK(zo_topo_node_of_pci(e->d_name, &node, how, sizeof how));
        assert_int_equal(node, want);
        assert_true(how[0] != '\0');
        /* CUDA spells ids in upper case; the domain may be left out. */
        char id[sizeof e->d_name];
        snprintf(id, sizeof id, "%s", e->d_name);
        upper(id);
        ZO_ASSERT_OK(zo_topo_node_of_pci(id, &node, NULL, 0));
        assert_int_equal(node, want);
        if (strncmp(e->d_name, "0000:", 5) == 0) {
            ZO_ASSERT_OK(zo_topo_node_of_pci(e->d_name + 5, &node, NULL, 0));
            assert_int_equal(node, want);
        }
        checked++;
    }
    if (d)
        closedir(d);
    if (!checked)
        print_message("no PCI devices visible in /sys/bus/pci/devices: locality not checked\n");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_node_count_and_nodes),
        cmocka_unit_test(test_cpu_list_matches_cpuset),
        cmocka_unit_test(test_bind_and_node_of_thread),
        cmocka_unit_test(test_pci_bus_id_parsing),
        cmocka_unit_test(test_pci_locality_matches_sysfs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
