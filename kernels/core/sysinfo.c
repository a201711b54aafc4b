/* Library and driver versions. */
#include <hwloc.h>
#include <stdio.h>
#include <string.h>

#include "zo/sysinfo.h"
#include "zo/version.h"
#include "zo_internal.h"
#ifdef ZO_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif
#ifdef ZO_HAVE_NCCL
#include <nccl.h>
#endif

static void cuda_versions(zo_versions *v)
{
#ifdef ZO_HAVE_CUDA
    int rt = 0, drv = 0;
    if (cudaRuntimeGetVersion(&rt) == cudaSuccess)
        snprintf(v->cuda_runtime, sizeof v->cuda_runtime, "%d.%d", rt / 1000, (rt % 1000) / 10);
    else
        snprintf(v->cuda_runtime, sizeof v->cuda_runtime, "unknown");
    if (cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0)
        snprintf(v->cuda_driver, sizeof v->cuda_driver, "%d.%d", drv / 1000, (drv % 1000) / 10);
    else
        snprintf(v->cuda_driver, sizeof v->cuda_driver, "no driver");
    (void)cudaGetLastError();
    snprintf(v->cublas, sizeof v->cublas, "%d.%d.%d", CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR,
             CUBLAS_VER_PATCH);
#else
    snprintf(v->cuda_runtime, sizeof v->cuda_runtime, "not built");
    snprintf(v->cuda_driver, sizeof v->cuda_driver, "not built");
    snprintf(v->cublas, sizeof v->cublas, "not built");
#endif
#ifdef ZO_HAVE_NCCL
    int nv = 0;
    if (ncclGetVersion(&nv) == ncclSuccess)
        snprintf(v->nccl, sizeof v->nccl, "%d.%d.%d", nv / 10000, (nv % 10000) / 100, nv % 100);
    else
        snprintf(v->nccl, sizeof v->nccl, "unknown");
#else
    snprintf(v->nccl, sizeof v->nccl, "not built");
#endif
}

zo_status zo_get_versions(zo_versions *v)
{
    if (!v || v->struct_size != sizeof *v)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "core", "zo_versions needs ZO_VERSIONS_INIT");
    snprintf(v->zoffload, sizeof v->zoffload, "%s", ZO_VERSION_STRING);
    cuda_versions(v);
    unsigned hv = hwloc_get_api_version();
    snprintf(v->hwloc, sizeof v->hwloc, "%u.%u.%u", hv >> 16, (hv >> 8) & 0xff, hv & 0xff);
    return ZO_OK;
}

zo_status zo_sysinfo_pci_link(const char *bus_id, float *gbps)
{
    if (!bus_id || !gbps)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "core", "bus id or output is NULL");
    *gbps = 0;
    unsigned dom = 0, bus = 0, dev = 0, fn = 0;
    if (sscanf(bus_id, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "core",
                       "'%s' is not a PCI bus id (expected DDDD:BB:DD.F)", bus_id);
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0)
        return ZO_FAIL(ZO_ERR_SYSTEM, "core", "hwloc_topology_init failed");
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_ALL);
    zo_status st = ZO_OK;
    if (hwloc_topology_load(topo) != 0) {
        st = ZO_FAIL(ZO_ERR_SYSTEM, "core", "hwloc_topology_load failed");
    } else {
        hwloc_obj_t o = hwloc_get_pcidev_by_busid(topo, dom, bus, dev, fn);
        if (!o)
            st = ZO_FAIL(ZO_ERR_NOT_FOUND, "core", "PCI device %s not found by hwloc", bus_id);
        else
            *gbps = o->attr->pcidev.linkspeed;
    }
    hwloc_topology_destroy(topo);
    return st;
}

const char *zo_sysinfo_cpu_model(char *buf, size_t cap)
{
    snprintf(buf, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return buf;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0 || strncmp(line, "Model", 5) == 0) {
            char *c = strchr(line, ':');
            if (!c)
                continue;
            c++;
            while (*c == ' ' || *c == '\t')
                c++;
            c[strcspn(c, "\n")] = '\0';
            snprintf(buf, cap, "%s", c);
            break;
        }
    }
    fclose(f);
    return buf;
}
