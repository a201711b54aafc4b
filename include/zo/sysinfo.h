/* zoffload: what the machine offers, for zo-report and the planner. */
#ifndef ZO_SYSINFO_H
#define ZO_SYSINFO_H

#include <stddef.h>

#include "zo/api.h"
#include "zo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zo_versions {
    size_t struct_size;
    char zoffload[32];
    char cuda_runtime[32]; /* "13.0", or "not built" */
    char cuda_driver[32];  /* "13.0", "no driver" or "not built" */
    char cublas[32];
    char nccl[32]; /* "2.27.7", or "not built" */
    char hwloc[32];
} zo_versions;

#define ZO_VERSIONS_INIT                                                                           \
    {                                                                                              \
        .struct_size = sizeof(zo_versions)                                                         \
    }

ZO_API zo_status zo_get_versions(zo_versions *out);

/* The PCIe link of the device at bus id ("0000:17:00.0"), as hwloc reports
 * it: bandwidth in GB/s (0 when unknown). */
ZO_API zo_status zo_sysinfo_pci_link(const char *pci_bus_id, float *gbps);

/* The CPU's model name ("AMD EPYC 9454"), or "unknown". */
ZO_API const char *zo_sysinfo_cpu_model(char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
