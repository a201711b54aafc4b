/* The tools' host memory limit: what the machine can spare for a run
 * (physical RAM less a margin, and the cgroup's limit when one is set),
 * checked against the engine's plan before anything is allocated. */
#ifndef ZT_HOST_LIMIT_H
#define ZT_HOST_LIMIT_H

#include <stddef.h>
#include <stdint.h>

/* The default limit: physical RAM less 10% (at least 512 MiB), or less
 * when a cgroup limits this process; where it comes from into why ("" when
 * the RAM cannot be read: 0 is returned and nothing is checked). */
uint64_t zt_host_limit(char *why, size_t cap);
/* The smallest memory limit of this process's cgroup and its ancestors
 * (v1 memory.limit_in_bytes or v2 memory.max); 0 when none is set.
 * proc_cgroup and cgroup_root are /proc/self/cgroup and /sys/fs/cgroup
 * outside tests. */
uint64_t zt_cgroup_limit(const char *proc_cgroup, const char *cgroup_root);

#endif
