/* Machine topology: NUMA nodes, their cores, PCI locality (hwloc), thread
 * binding. The topology is loaded once per process and then only read, which
 * hwloc allows from any number of threads. */
#include "zo/topo.h"

#include <ctype.h>
#include <errno.h>
#include <hwloc.h>
#include <hwloc/glibc-sched.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zo_internal.h"

#define SUBSYS "topo"

typedef struct topo_node {
    int os;
    uint64_t mem;
    int n_cores, n_pus;
    cpu_set_t cpus;
} topo_node;

static struct {
    hwloc_topology_t hw; /* NULL when hwloc could not load the topology */
    topo_node *nodes;
    int n_nodes;
    int single_fallback; /* no NUMA node reported: one node 0 */
    zo_status init_st;
} g_topo;

static pthread_once_t g_topo_once = PTHREAD_ONCE_INIT;

static int count_in_cpuset(hwloc_const_cpuset_t set, hwloc_obj_type_t type)
{
    if (!g_topo.hw || hwloc_bitmap_iszero(set))
        return 0;
    return hwloc_get_nbobjs_inside_cpuset_by_type(g_topo.hw, set, type);
}

static void fill_node_from_hwloc(topo_node *tn, hwloc_obj_t obj)
{
    tn->os = (int)obj->os_index;
    tn->mem = obj->attr ? obj->attr->numanode.local_memory : 0;
    CPU_ZERO(&tn->cpus);
    if (obj->cpuset)
        hwloc_cpuset_to_glibc_sched_affinity(g_topo.hw, obj->cpuset, &tn->cpus, sizeof tn->cpus);
    tn->n_pus = CPU_COUNT(&tn->cpus);
    tn->n_cores = obj->cpuset ? count_in_cpuset(obj->cpuset, HWLOC_OBJ_CORE) : 0;
}

/* One node 0 holding every core the process may use: for machines where
 * hwloc reports no NUMA node or cannot load at all. */
static zo_status make_single_node(void)
{
    g_topo.nodes = calloc(1, sizeof *g_topo.nodes);
    if (!g_topo.nodes)
        return ZO_ERR_NO_MEMORY;
    g_topo.n_nodes = 1;
    g_topo.single_fallback = 1;
    topo_node *tn = &g_topo.nodes[0];
    tn->os = 0;
    if (sched_getaffinity(0, sizeof tn->cpus, &tn->cpus) != 0)
        CPU_ZERO(&tn->cpus);
    tn->n_pus = CPU_COUNT(&tn->cpus);
    tn->n_cores =
        g_topo.hw ? count_in_cpuset(hwloc_topology_get_allowed_cpuset(g_topo.hw), HWLOC_OBJ_CORE)
                  : tn->n_pus;
    if (g_topo.hw) {
        hwloc_obj_t root = hwloc_get_root_obj(g_topo.hw);
        tn->mem = root->total_memory;
    }
    return ZO_OK;
}

/* Nodes whose local memory hwloc could not size are kept: "unknown" is not
 * "none". Memory-only nodes (no cores, such as CXL memory) are kept too. */
static int node_has_memory(hwloc_obj_t obj, int any_sized)
{
    return !any_sized || (obj->attr && obj->attr->numanode.local_memory > 0);
}

static zo_status load_nodes_from_hwloc(void)
{
    int n = hwloc_get_nbobjs_by_type(g_topo.hw, HWLOC_OBJ_NUMANODE);
    if (n <= 0)
        return make_single_node();
    int any_sized = 0;
    for (int i = 0; i < n; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(g_topo.hw, HWLOC_OBJ_NUMANODE, (unsigned)i);
        if (o->attr && o->attr->numanode.local_memory > 0)
            any_sized = 1;
    }
    g_topo.nodes = calloc((size_t)n, sizeof *g_topo.nodes);
    if (!g_topo.nodes)
        return ZO_ERR_NO_MEMORY;
    for (int i = 0; i < n; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(g_topo.hw, HWLOC_OBJ_NUMANODE, (unsigned)i);
        if (node_has_memory(o, any_sized))
            fill_node_from_hwloc(&g_topo.nodes[g_topo.n_nodes++], o);
    }
    /* hwloc lists nodes by logical index; callers want OS numbers in order. */
    for (int i = 1; i < g_topo.n_nodes; i++)
        for (int j = i; j > 0 && g_topo.nodes[j - 1].os > g_topo.nodes[j].os; j--) {
            topo_node t = g_topo.nodes[j];
            g_topo.nodes[j] = g_topo.nodes[j - 1];
            g_topo.nodes[j - 1] = t;
        }
    return ZO_OK;
}

static hwloc_topology_t load_hwloc(void)
{
    hwloc_topology_t t;
    if (hwloc_topology_init(&t) != 0)
        return NULL;
    /* PCI devices are needed to find the node nearest a GPU. */
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(t) != 0) {
        ZO_LOGW(SUBSYS,
                "hwloc could not read this machine's topology (%s): treating it as one NUMA node",
                strerror(errno));
        hwloc_topology_destroy(t);
        return NULL;
    }
    return t;
}

static void topo_load_once(void)
{
    g_topo.hw = load_hwloc();
    g_topo.init_st = g_topo.hw ? load_nodes_from_hwloc() : make_single_node();
    if (g_topo.init_st == ZO_OK && g_topo.n_nodes == 0) {
        free(g_topo.nodes);
        g_topo.nodes = NULL;
        g_topo.init_st = make_single_node();
    }
}

static zo_status topo_get(void)
{
    pthread_once(&g_topo_once, topo_load_once);
    if (g_topo.init_st != ZO_OK)
        return ZO_FAIL(g_topo.init_st, SUBSYS, "out of memory while reading the machine topology");
    return ZO_OK;
}

static const topo_node *find_node(int node)
{
    for (int i = 0; i < g_topo.n_nodes; i++)
        if (g_topo.nodes[i].os == node)
            return &g_topo.nodes[i];
    return NULL;
}

static zo_status node_lookup(int node, const topo_node **out)
{
    ZO_TRY(topo_get());
    *out = find_node(node);
    if (!*out) {
        int last = g_topo.nodes[g_topo.n_nodes - 1].os;
        return ZO_FAIL(
            ZO_ERR_INVALID_ARG, SUBSYS,
            "NUMA node %d does not exist or has no memory; this machine has %d node(s) with "
            "memory, numbered %d to %d",
            node, g_topo.n_nodes, g_topo.nodes[0].os, last);
    }
    return ZO_OK;
}

int zo_topo_numa_node_count(void)
{
    return topo_get() == ZO_OK ? g_topo.n_nodes : 1;
}

int zo_topo_node_valid(int node)
{
    return topo_get() == ZO_OK && find_node(node) != NULL;
}

zo_status zo_topo_get_node(int i, zo_topo_node *out)
{
    if (!out || out->struct_size < sizeof *out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "zo_topo_get_node needs a zo_topo_node set up with ZO_TOPO_NODE_INIT");
    ZO_TRY(topo_get());
    if (i < 0 || i >= g_topo.n_nodes)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "node index %d is out of range [0, %d)", i,
                       g_topo.n_nodes);
    const topo_node *tn = &g_topo.nodes[i];
    out->node = tn->os;
    out->memory_bytes = tn->mem;
    out->n_cores = tn->n_cores;
    out->n_pus = tn->n_pus;
    return ZO_OK;
}

/* ---- PCI locality ---- */

typedef struct pci_addr {
    unsigned domain, bus, dev, func;
} pci_addr;

static int parse_hex(const char **s, unsigned max, unsigned *out)
{
    const char *p = *s;
    unsigned v = 0;
    int digits = 0;
    while (isxdigit((unsigned char)*p)) {
        int c = tolower((unsigned char)*p);
        v = v * 16 + (unsigned)(isdigit(c) ? c - '0' : c - 'a' + 10);
        if (v > max)
            return -1;
        p++;
        digits++;
    }
    if (!digits)
        return -1;
    *s = p;
    *out = v;
    return 0;
}

/* "dddd:bb:dd.f" or "bb:dd.f"; CUDA's ids carry 8 hex digits of domain. */
static int parse_pci_bus_id(const char *s, pci_addr *a)
{
    unsigned f1, f2;
    if (parse_hex(&s, 0xffffffffu, &f1) || *s++ != ':' || parse_hex(&s, 0xff, &f2))
        return -1;
    if (*s == ':') {
        s++;
        a->domain = f1;
        a->bus = f2;
        if (parse_hex(&s, 0x1f, &a->dev))
            return -1;
    } else {
        if (f1 > 0xff || f2 > 0x1f)
            return -1;
        a->domain = 0;
        a->bus = f1;
        a->dev = f2;
    }
    if (*s++ != '.' || parse_hex(&s, 0x7, &a->func) || *s != '\0')
        return -1;
    return 0;
}

static void set_how(char *how, size_t cap, const char *text)
{
    if (how && cap)
        snprintf(how, cap, "%s", text);
}

/* The node whose memory hwloc places the device under, or -1 when the device
 * is local to several nodes (or hwloc does not know it). */
static int hwloc_pci_node(const pci_addr *a, int *found)
{
    *found = 0;
    if (!g_topo.hw)
        return -1;
    hwloc_obj_t pci = hwloc_get_pcidev_by_busid(g_topo.hw, a->domain, a->bus, a->dev, a->func);
    if (!pci)
        return -1;
    *found = 1;
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(g_topo.hw, pci);
    if (!anc || !anc->nodeset || hwloc_bitmap_weight(anc->nodeset) != 1)
        return -1;
    int node = hwloc_bitmap_first(anc->nodeset);
    return find_node(node) ? node : -1;
}

/* sysfs's numa_node: -1 when the firmware does not say. */
static int sysfs_pci_node(const pci_addr *a, int *found)
{
    char path[96];
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%04x:%02x:%02x.%x/numa_node", a->domain,
             a->bus, a->dev, a->func);
    FILE *f = fopen(path, "r");
    *found = f != NULL;
    if (!f)
        return -1;
    int node = -1;
    if (fscanf(f, "%d", &node) != 1)
        node = -1;
    fclose(f);
    return node >= 0 && find_node(node) ? node : -1;
}

zo_status zo_topo_node_of_pci(const char *pci_bus_id, int *node, char *how, size_t how_cap)
{
    pci_addr a;
    if (!node)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_topo_node_of_pci: node is NULL");
    if (!pci_bus_id || parse_pci_bus_id(pci_bus_id, &a) != 0)
        return ZO_FAIL(
            ZO_ERR_INVALID_ARG, SUBSYS,
            "'%s' is not a PCI bus id: expected the form dddd:bb:dd.f, such as 0000:17:00.0",
            pci_bus_id ? pci_bus_id : "(null)");
    ZO_TRY(topo_get());
    int in_hwloc, in_sysfs;
    int n = hwloc_pci_node(&a, &in_hwloc);
    if (n >= 0) {
        set_how(how, how_cap, g_topo.n_nodes == 1 ? "single node" : "hwloc");
        *node = n;
        return ZO_OK;
    }
    n = sysfs_pci_node(&a, &in_sysfs);
    if (!in_hwloc && !in_sysfs)
        return ZO_FAIL(ZO_ERR_NOT_FOUND, SUBSYS, "no PCI device %04x:%02x:%02x.%x on this machine",
                       a.domain, a.bus, a.dev, a.func);
    if (n >= 0) {
        set_how(how, how_cap, g_topo.n_nodes == 1 ? "single node" : "sysfs");
        *node = n;
        return ZO_OK;
    }
    /* Neither source ties the device to one node (single-node machine, or
     * firmware that does not say): the first node is as near as any. */
    set_how(how, how_cap, g_topo.n_nodes == 1 ? "single node" : "no locality reported; first node");
    *node = g_topo.nodes[0].os;
    return ZO_OK;
}

/* ---- cores ---- */

zo_status zo_topo_node_of_thread(int *node, int *cpu)
{
    if (!node)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_topo_node_of_thread: node is NULL");
    ZO_TRY(topo_get());
    int c = sched_getcpu();
    if (c < 0)
        return ZO_FAIL(ZO_ERR_SYSTEM, SUBSYS, "sched_getcpu failed: %s", strerror(errno));
    if (cpu)
        *cpu = c;
    for (int i = 0; i < g_topo.n_nodes; i++)
        if (c < CPU_SETSIZE && CPU_ISSET(c, &g_topo.nodes[i].cpus)) {
            *node = g_topo.nodes[i].os;
            return ZO_OK;
        }
    /* A core outside every node with memory (its node is memory-less, or the
     * affinity changed since the topology was read): the first node. */
    *node = g_topo.nodes[0].os;
    return ZO_OK;
}

zo_status zo_topo_node_cpuset(int node, cpu_set_t *out)
{
    const topo_node *tn;
    if (!out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_topo_node_cpuset: out is NULL");
    ZO_TRY(node_lookup(node, &tn));
    *out = tn->cpus;
    return ZO_OK;
}

zo_status zo_topo_node_cpu_list(int node, int *cpus, int cap, int *n)
{
    const topo_node *tn;
    if (!n || cap < 0 || (cap > 0 && !cpus))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "zo_topo_node_cpu_list needs n, and cpus when cap > 0");
    ZO_TRY(node_lookup(node, &tn));
    int k = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &tn->cpus)) {
            if (k < cap)
                cpus[k] = c;
            k++;
        }
    *n = k;
    return ZO_OK;
}

zo_status zo_topo_bind_thread(const cpu_set_t *set)
{
    if (!set || CPU_COUNT(set) == 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "cannot bind a thread to an empty set of cores");
    int e = pthread_setaffinity_np(pthread_self(), sizeof *set, set);
    if (e != 0)
        return ZO_FAIL(e == EINVAL ? ZO_ERR_INVALID_ARG : ZO_ERR_SYSTEM, SUBSYS,
                       "binding the thread to %d core(s) failed: %s", CPU_COUNT(set), strerror(e));
    return ZO_OK;
}

zo_status zo_topo_bind_thread_to_node(int node)
{
    const topo_node *tn;
    ZO_TRY(node_lookup(node, &tn));
    if (CPU_COUNT(&tn->cpus) == 0)
        return ZO_FAIL(
            ZO_ERR_INVALID_ARG, SUBSYS,
            "NUMA node %d has no cores this process may use (a memory-only node); bind to "
            "another node's cores",
            node);
    return zo_topo_bind_thread(&tn->cpus);
}
