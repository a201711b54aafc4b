/* zoffload: machine topology (hwloc + libnuma).
 *
 * Which NUMA nodes exist, which node is nearest a GPU, which cores are local
 * to a node, and binding the calling thread to them, so that the pinned host
 * pool and the optimizer and I/O worker threads sit next to the GPU they feed.
 *
 * Node numbers are the operating system's (the numbers libnuma, numactl and
 * /sys/devices/system/node use). A machine on which hwloc reports no NUMA node
 * (no NUMA support in the kernel, some containers) is treated as one node 0
 * holding every core the process may run on. The topology is read once per
 * process, restricted to the cores and memory this process is allowed to use
 * (cgroups, taskset). */
#ifndef ZO_TOPO_H
#define ZO_TOPO_H

#include <sched.h>
#include <stddef.h>
#include <stdint.h>

#include "zo/api.h"
#include "zo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zo_topo_node {
    size_t struct_size;    /* sizeof(zo_topo_node) */
    int node;              /* the OS node number */
    uint64_t memory_bytes; /* memory local to the node (0 when unknown) */
    int n_cores;           /* physical cores local to the node */
    int n_pus;             /* hardware threads local to the node */
} zo_topo_node;

#define ZO_TOPO_NODE_INIT                                                                          \
    {                                                                                              \
        .struct_size = sizeof(zo_topo_node)                                                        \
    }

/* The number of NUMA nodes that have memory (at least 1). */
ZO_API int zo_topo_numa_node_count(void);

/* The i-th node with memory, 0 <= i < zo_topo_numa_node_count(), in
 * increasing node number. */
ZO_API zo_status zo_topo_get_node(int i, zo_topo_node *out);

/* Whether `node` is a node with memory that this process may use. */
ZO_API int zo_topo_node_valid(int node);

/* The node nearest the PCI device with bus id "dddd:bb:dd.f" (the form of
 * zo_device_info.pci_bus_id and cudaDeviceGetPCIBusId; the domain may be
 * omitted, hex digits in either case). The nearest node is that of the
 * device's first non-I/O ancestor in hwloc's tree, else the one sysfs gives.
 * how (optional, how_cap bytes) receives "hwloc", "sysfs" or "single node".
 * ZO_ERR_INVALID_ARG for a malformed id, ZO_ERR_NOT_FOUND when the machine
 * has no such device. */
ZO_API zo_status zo_topo_node_of_pci(const char *pci_bus_id, int *node, char *how, size_t how_cap);

/* The node of the core the calling thread runs on now (and that core in
 * *cpu when cpu is not NULL). */
ZO_API zo_status zo_topo_node_of_thread(int *node, int *cpu);

/* The hardware threads (OS CPU numbers) local to `node` that this process may
 * use: as a list (up to cap entries in cpus; *n gets the full count even when
 * larger than cap, so a NULL cpus with cap 0 asks for the size). */
ZO_API zo_status zo_topo_node_cpu_list(int node, int *cpus, int cap, int *n);

#ifdef CPU_SETSIZE /* cpu_set_t needs _GNU_SOURCE */
/* The same set as a cpu_set_t, ready for sched_setaffinity. */
ZO_API zo_status zo_topo_node_cpuset(int node, cpu_set_t *out);
/* Bind the calling thread to the cores in set (which must not be empty). */
ZO_API zo_status zo_topo_bind_thread(const cpu_set_t *set);
#endif

/* Bind the calling thread to the cores local to `node`. */
ZO_API zo_status zo_topo_bind_thread_to_node(int node);

#ifdef __cplusplus
}
#endif
#endif
