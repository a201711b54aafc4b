/* zoffload: the host tier, a NUMA-aware pinned memory pool.
 *
 * Memory is mapped on one NUMA node (by default the node nearest the GPU, or
 * for the cpu device the node of the thread that creates the pool), aligned
 * to 4 KiB (O_DIRECT), backed by transparent huge pages where the kernel
 * allows, and registered with the device (page-locked) so copies run at full
 * speed and asynchronously.
 *
 * Accounting is exact against a hard budget, max_pinned_bytes: a general
 * allocation takes its size rounded up to 4 KiB, a slot set takes
 * n_slots x slot size (each slot rounded up to 4 KiB), never a power of two.
 * The memory the pool holds from the system (`reserved`) never exceeds the
 * budget, pinned or not.
 *
 * Two ways to allocate, mixed freely in one pool:
 *  - slots: zo_hostpool_add_slots carves N fixed-size chunk slots at once (the
 *    offload engine holds each tier as N chunk slots, so it cannot fragment);
 *    zo_hostpool_slot_alloc hands one out.
 *  - general: zo_hostpool_alloc maps memory of any size.
 * zo_hostpool_release gives either kind back.
 *
 * When pinning fails (RLIMIT_MEMLOCK, a container, a driver refusing) the
 * memory is kept unpinned, one warning per pool says how much and why, and
 * the statistics count it; the pool keeps working (unless allow_unpinned is
 * 0, then the allocation fails with ZO_ERR_PIN). All functions are
 * thread-safe. */
#ifndef ZO_HOSTPOOL_H
#define ZO_HOSTPOOL_H

#include <stddef.h>
#include <stdint.h>

#include "zo/api.h"
#include "zo/device.h"
#include "zo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zo_hostpool *zo_hostpool_t;

/* The page every allocation is rounded up to (and aligned to). */
#define ZO_HOSTPOOL_PAGE 4096u

typedef struct zo_hostpool_config {
    size_t struct_size;        /* sizeof(zo_hostpool_config) */
    uint64_t max_pinned_bytes; /* the hard budget; must be > 0 */
    int node;        /* NUMA node; -1 = nearest the device (see zo_hostpool_placement_for_device) */
    int strict_node; /* 1: MPOL_BIND (allocation fails rather than spill to another node);
                        0: MPOL_PREFERRED (the kernel may spill when the node is full) */
    int huge_pages;  /* 1: ask for transparent huge pages on 2 MiB-aligned spans */
    int allow_unpinned; /* 1: keep working unpinned when pinning fails; 0: fail with ZO_ERR_PIN */
} zo_hostpool_config;

#define ZO_HOSTPOOL_CONFIG_INIT                                                                    \
    {                                                                                              \
        .struct_size = sizeof(zo_hostpool_config), .node = -1, .huge_pages = 1,                    \
        .allow_unpinned = 1                                                                        \
    }

/* Where the pool's memory goes and why, and the memory-lock limit that
 * decides whether pinning can succeed: for zo-report. */
typedef struct zo_hostpool_placement {
    size_t struct_size; /* sizeof(zo_hostpool_placement) */
    int node;           /* the chosen NUMA node */
    int n_nodes;        /* NUMA nodes with memory on this machine */
    int n_local_cpus;   /* hardware threads local to that node */
    char device[64];    /* "cpu", or "cuda:0 (0000:17:00.0)" */
    char reason[160];   /* "nearest to GPU 0000:17:00.0 via hwloc", "cpu device: node of the calling
                           thread (CPU 3)", "requested node 1" */
    uint64_t memlock_soft; /* RLIMIT_MEMLOCK in bytes; ZO_MEMLOCK_UNLIMITED when unlimited */
    uint64_t memlock_hard;
    int cap_ipc_lock; /* 1 when the process holds CAP_IPC_LOCK (mlock ignores the limit) */
} zo_hostpool_placement;

#define ZO_HOSTPOOL_PLACEMENT_INIT                                                                 \
    {                                                                                              \
        .struct_size = sizeof(zo_hostpool_placement)                                               \
    }
#define ZO_MEMLOCK_UNLIMITED UINT64_MAX

typedef struct zo_hostpool_stats {
    size_t struct_size; /* sizeof(zo_hostpool_stats) */
    uint64_t budget;    /* max_pinned_bytes */
    uint64_t reserved;  /* bytes the pool holds from the system (slot sets + general allocations) */
    uint64_t reserved_high_water;
    uint64_t in_use; /* bytes handed out: taken slots (slot size each) + general allocations */
    uint64_t in_use_high_water;
    uint64_t pinned_bytes;   /* of reserved, bytes registered with the device */
    uint64_t unpinned_bytes; /* of reserved, bytes left unpinned because pinning failed */
    uint64_t slots_total;    /* over every slot set */
    uint64_t slots_free;
    uint64_t n_allocs;          /* live general allocations */
    uint64_t n_pin_fallbacks;   /* allocations or slot sets that fell back to unpinned memory */
    uint64_t n_budget_refusals; /* requests refused with ZO_ERR_BUDGET */
    int node;                   /* the pool's node */
} zo_hostpool_stats;

#define ZO_HOSTPOOL_STATS_INIT                                                                     \
    {                                                                                              \
        .struct_size = sizeof(zo_hostpool_stats)                                                   \
    }

/* Create a pool for dev (which must outlive it). */
ZO_API zo_status zo_hostpool_init(zo_hostpool_t *out, zo_device_t dev,
                                  const zo_hostpool_config *cfg);
/* Unpin and unmap everything the pool still holds. NULL is accepted. */
ZO_API void zo_hostpool_free(zo_hostpool_t pool);

/* General allocation: size rounded up to ZO_HOSTPOOL_PAGE, aligned to it,
 * contents zero. ZO_ERR_BUDGET (naming requested, in use and budget) when
 * reserved + the rounded size would exceed the budget. */
ZO_API zo_status zo_hostpool_alloc(zo_hostpool_t pool, size_t bytes, void **out);

/* Carve n_slots slots of slot_bytes each (each slot rounded up to
 * ZO_HOSTPOOL_PAGE) in one mapping, pinned as a whole; *set_id names the
 * set for zo_hostpool_slot_alloc. The whole set counts against the budget
 * from now on. At most 16 sets per pool. */
ZO_API zo_status zo_hostpool_add_slots(zo_hostpool_t pool, size_t slot_bytes, size_t n_slots,
                                       int *set_id);
/* Take a free slot of set_id (its contents are what the last user left).
 * ZO_ERR_BUDGET when every slot of the set is taken. */
ZO_API zo_status zo_hostpool_slot_alloc(zo_hostpool_t pool, int set_id, void **out);

/* Release a general allocation (unpinned and unmapped at once) or a slot
 * (back to its set). NULL is accepted. A pointer that is not a live
 * allocation or taken slot of this pool (double free, foreign or interior
 * pointer) returns ZO_ERR_INVALID_ARG and changes nothing. */
ZO_API zo_status zo_hostpool_release(zo_hostpool_t pool, void *ptr);

/* The accounted size of a live allocation or taken slot at ptr, and whether
 * it is pinned. ZO_ERR_INVALID_ARG when ptr is neither. */
ZO_API zo_status zo_hostpool_query(zo_hostpool_t pool, const void *ptr, size_t *bytes, int *pinned);

ZO_API zo_status zo_hostpool_get_stats(zo_hostpool_t pool, zo_hostpool_stats *out);
/* Bytes of the pool's memory backed by transparent huge pages now, from
 * AnonHugePages in /proc/self/smaps (ZO_ERR_UNSUPPORTED when it cannot be
 * read). Slow (the kernel walks every mapping of the process): for reports
 * and benchmarks, not for hot paths. */
ZO_API zo_status zo_hostpool_huge_bytes(zo_hostpool_t pool, uint64_t *out);
/* The pool's node choice (and the memlock limit read now). */
ZO_API zo_status zo_hostpool_get_placement(zo_hostpool_t pool, zo_hostpool_placement *out);

/* The node a pool for dev would use with node = -1, and why; plus the
 * memlock limit. Nearest the GPU by PCI locality for a real GPU; the node of
 * the calling thread for the cpu device. */
ZO_API zo_status zo_hostpool_placement_for_device(zo_device_t dev, zo_hostpool_placement *out);

#ifdef __cplusplus
}
#endif
#endif
