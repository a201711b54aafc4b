/* zoffload: what the machine offers, for zo-report and the planner. */
#ifndef ZO_SYSINFO_H
#define ZO_SYSINFO_H

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
    char nccl[32];         /* "2.27.7", or "not built" */
    char hwloc[32];
} zo_versions;

#define ZO_VERSIONS_INIT {sizeof(zo_versions), {0}, {0}, {0}, {0}, {0}, {0}}

zo_status zo_get_versions(zo_versions *out);

#ifdef __cplusplus
}
#endif
#endif
