/* The host tier: NUMA-placed, huge-page backed, pinned memory under an exact
 * budget. Mapping and pinning (slow: they fault in every page) run outside
 * the pool's lock; the budget is taken before and given back after, so the
 * memory the pool really holds never exceeds it, even for a moment. */
#include "zo/hostpool.h"

#include <errno.h>
#include <numa.h>
#include <numaif.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "hostpool_internal.h"
#include "zo/topo.h"
#include "zo_internal.h"

#define SUBSYS           "hostpool"
#define PAGE             ((size_t)ZO_HOSTPOOL_PAGE)
#define HUGE_PAGE        ((size_t)2 << 20)
#define MAX_SLOT_SETS    16
#define CAP_IPC_LOCK_BIT 14

/* One mapping: [ptr, ptr + bytes) is what callers see and what is counted;
 * [map, map + map_len) is what was mapped (the same, here: the alignment
 * slack is trimmed right after mmap). */
typedef struct mapping {
    char *ptr;
    size_t bytes;
    int pinned;
} mapping;

typedef struct slot_set {
    mapping m;
    size_t stride; /* slot size, a multiple of PAGE */
    size_t n, n_free;
    size_t *free_stack; /* indices of free slots; the top is the most recently freed (warm) */
    unsigned char *taken;
} slot_set;

struct zo_hostpool {
    zo_device_t dev;
    zo_hostpool_config cfg;
    zo_hostpool_placement placement;
    pthread_mutex_t mu;
    mapping *allocs; /* general allocations, sorted by ptr */
    size_t n_allocs, cap_allocs;
    slot_set sets[MAX_SLOT_SETS];
    int n_sets, n_sets_pending;
    uint64_t reserved, reserved_hw, in_use, in_use_hw, pinned, unpinned;
    uint64_t n_fallbacks, n_refusals;
    int warned_pin, warned_mbind;
};

/* ---- limits and placement ---- */

static uint64_t rlim_bytes(rlim_t v)
{
    return v == RLIM_INFINITY ? ZO_MEMLOCK_UNLIMITED : (uint64_t)v;
}

/* CAP_IPC_LOCK lets mlock ignore RLIMIT_MEMLOCK (root usually has it). */
static int has_cap_ipc_lock(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long eff = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "CapEff: %llx", &eff) == 1)
            break;
    fclose(f);
    return (int)((eff >> CAP_IPC_LOCK_BIT) & 1);
}

static void fill_memlock(zo_hostpool_placement *pl)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
        pl->memlock_soft = rlim_bytes(rl.rlim_cur);
        pl->memlock_hard = rlim_bytes(rl.rlim_max);
    }
    pl->cap_ipc_lock = has_cap_ipc_lock();
}

static char *fmt_memlock(char *buf, size_t cap, uint64_t v)
{
    if (v == ZO_MEMLOCK_UNLIMITED) {
        snprintf(buf, cap, "unlimited");
        return buf;
    }
    return zo_fmt_bytes(buf, cap, v);
}

static zo_status thread_node_reason(zo_hostpool_placement *pl, const char *prefix)
{
    int cpu = -1;
    ZO_TRY(zo_topo_node_of_thread(&pl->node, &cpu));
    snprintf(pl->reason, sizeof pl->reason, "%snode of the calling thread (CPU %d)", prefix, cpu);
    return ZO_OK;
}

static zo_status gpu_node_reason(zo_hostpool_placement *pl, const char *bus_id)
{
    char how[64];
    zo_status st = zo_topo_node_of_pci(bus_id, &pl->node, how, sizeof how);
    if (st == ZO_OK) {
        if (strcmp(how, "single node") == 0)
            snprintf(pl->reason, sizeof pl->reason, "GPU %s on a machine with a single NUMA node",
                     bus_id);
        else
            snprintf(pl->reason, sizeof pl->reason, "nearest to GPU %s via %s", bus_id, how);
        return ZO_OK;
    }
    if (st != ZO_ERR_NOT_FOUND && st != ZO_ERR_INVALID_ARG)
        return st;
    char prefix[96];
    snprintf(prefix, sizeof prefix, "GPU %s not in the PCI topology: ", bus_id);
    zo_clear_error();
    return thread_node_reason(pl, prefix);
}

static zo_status finish_placement(zo_hostpool_placement *pl)
{
    pl->n_nodes = zo_topo_numa_node_count();
    ZO_TRY(zo_topo_node_cpu_list(pl->node, NULL, 0, &pl->n_local_cpus));
    fill_memlock(pl);
    return ZO_OK;
}

static zo_status check_placement_arg(const zo_hostpool_placement *out)
{
    if (!out || out->struct_size < sizeof *out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "placement output must be a zo_hostpool_placement set up with "
                       "ZO_HOSTPOOL_PLACEMENT_INIT");
    return ZO_OK;
}

/* "cuda:0 (0000:17:00.0)", or "cpu" for a device without a PCI address. */
static void name_device(const zo_device_info *info, zo_hostpool_placement *pl)
{
    if (info->pci_bus_id[0])
        snprintf(pl->device, sizeof pl->device, "%s:%d (%s)", info->backend, info->ordinal,
                 info->pci_bus_id);
    else
        snprintf(pl->device, sizeof pl->device, "%s", info->backend);
}

zo_status zo_hostpool_placement_for_info_(const zo_device_info *info, zo_hostpool_placement *out)
{
    zo_hostpool_placement pl = ZO_HOSTPOOL_PLACEMENT_INIT;
    name_device(info, &pl);
    if (info->pci_bus_id[0])
        ZO_TRY(gpu_node_reason(&pl, info->pci_bus_id));
    else
        ZO_TRY(thread_node_reason(&pl, "cpu device: "));
    ZO_TRY(finish_placement(&pl));
    *out = pl;
    return ZO_OK;
}

zo_status zo_hostpool_placement_for_device(zo_device_t dev, zo_hostpool_placement *out)
{
    ZO_TRY(check_placement_arg(out));
    if (!dev)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "zo_hostpool_placement_for_device: device is NULL");
    zo_device_info info = ZO_DEVICE_INFO_INIT;
    ZO_TRY(zo_device_get_info(dev, &info));
    return zo_hostpool_placement_for_info_(&info, out);
}

static zo_status choose_placement(zo_hostpool_t pool)
{
    zo_hostpool_placement *pl = &pool->placement;
    if (pool->cfg.node < 0)
        return zo_hostpool_placement_for_device(pool->dev, pl);
    zo_device_info info = ZO_DEVICE_INFO_INIT;
    ZO_TRY(zo_device_get_info(pool->dev, &info));
    name_device(&info, pl);
    pl->node = pool->cfg.node;
    snprintf(pl->reason, sizeof pl->reason, "requested node %d", pool->cfg.node);
    return finish_placement(pl);
}

/* ---- budget ---- */

static zo_status refuse_budget(zo_hostpool_t pool, const char *what, uint64_t bytes)
{
    char a[32], b[32], c[32];
    uint64_t held = pool->reserved, budget = pool->cfg.max_pinned_bytes;
    pool->n_refusals++;
    pthread_mutex_unlock(&pool->mu);
    return ZO_FAIL(
        ZO_ERR_BUDGET, SUBSYS,
        "host pool: %s of %s (%llu bytes) would exceed the pinned budget: %s (%llu bytes) in "
        "use of max_pinned_bytes %s (%llu bytes); raise max_pinned_bytes or free memory first",
        what, zo_fmt_bytes(a, sizeof a, bytes), (unsigned long long)bytes,
        zo_fmt_bytes(b, sizeof b, held), (unsigned long long)held,
        zo_fmt_bytes(c, sizeof c, budget), (unsigned long long)budget);
}

static zo_status take_budget(zo_hostpool_t pool, const char *what, uint64_t bytes, int new_set)
{
    pthread_mutex_lock(&pool->mu);
    if (bytes > pool->cfg.max_pinned_bytes - pool->reserved)
        return refuse_budget(pool, what, bytes);
    if (new_set && pool->n_sets + pool->n_sets_pending >= MAX_SLOT_SETS) {
        pthread_mutex_unlock(&pool->mu);
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "host pool: at most %d slot sets per pool",
                       MAX_SLOT_SETS);
    }
    pool->n_sets_pending += new_set;
    pool->reserved += bytes;
    if (pool->reserved > pool->reserved_hw)
        pool->reserved_hw = pool->reserved;
    pthread_mutex_unlock(&pool->mu);
    return ZO_OK;
}

/* Called once the memory is really gone (or was never mapped). */
static void give_budget(zo_hostpool_t pool, const mapping *m, uint64_t bytes, int counted)
{
    pthread_mutex_lock(&pool->mu);
    pool->reserved -= bytes;
    if (counted)
        *(m->pinned ? &pool->pinned : &pool->unpinned) -= m->bytes;
    pthread_mutex_unlock(&pool->mu);
}

static void count_mapping(zo_hostpool_t pool, const mapping *m)
{
    *(m->pinned ? &pool->pinned : &pool->unpinned) += m->bytes;
}

static void add_in_use(zo_hostpool_t pool, uint64_t bytes)
{
    pool->in_use += bytes;
    if (pool->in_use > pool->in_use_hw)
        pool->in_use_hw = pool->in_use;
}

/* ---- mapping on a node ---- */

/* Map bytes, 2 MiB-aligned when huge pages are wanted and the size allows,
 * trimming the alignment slack so nothing beyond bytes stays mapped. */
static void *map_aligned(size_t bytes, int huge)
{
    size_t align = huge && bytes >= HUGE_PAGE ? HUGE_PAGE : PAGE;
    size_t len = bytes + align - PAGE;
    char *raw = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    char *p = (char *)zo_round_up((uintptr_t)raw, align);
    if (p > raw)
        munmap(raw, (size_t)(p - raw));
    size_t tail = (size_t)(raw + len - (p + bytes));
    if (tail)
        munmap(p + bytes, tail);
    return p;
}

static zo_status bind_to_node(zo_hostpool_t pool, void *p, size_t bytes)
{
    if (numa_available() < 0)
        return ZO_OK; /* no NUMA in this kernel: one node, nothing to bind */
    enum { WORDS = 16 };
    unsigned long mask[WORDS] = {0};
    int node = pool->placement.node;
    mask[node / 64] |= 1ul << (node % 64);
    int mode = pool->cfg.strict_node ? MPOL_BIND : MPOL_PREFERRED;
    if (mbind(p, bytes, mode, mask, WORDS * 64 + 1, 0) == 0)
        return ZO_OK;
    int e = errno;
    if (pool->cfg.strict_node)
        return ZO_FAIL(ZO_ERR_SYSTEM, SUBSYS,
                       "host pool: binding %zu bytes to NUMA node %d failed: %s "
                       "(set strict_node = 0 to accept memory from any node)",
                       bytes, node, strerror(e));
    pthread_mutex_lock(&pool->mu);
    int first = !pool->warned_mbind;
    pool->warned_mbind = 1;
    pthread_mutex_unlock(&pool->mu);
    if (first)
        ZO_LOGW(
            SUBSYS,
            "host pool: cannot place memory on NUMA node %d (mbind: %s); the kernel will place it",
            node, strerror(e));
    return ZO_OK;
}

static zo_status map_on_node(zo_hostpool_t pool, size_t bytes, mapping *m)
{
    char *p = map_aligned(bytes, pool->cfg.huge_pages);
    if (!p) {
        int e = errno;
        char b[32];
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "host pool: mapping %s failed: %s",
                       zo_fmt_bytes(b, sizeof b, bytes), strerror(e));
    }
    zo_status st = bind_to_node(pool, p, bytes);
    if (st != ZO_OK) {
        munmap(p, bytes);
        return st;
    }
    /* A refusal (THP disabled) only means small pages; nothing to report. */
    if (pool->cfg.huge_pages && bytes >= HUGE_PAGE)
        madvise(p, bytes, MADV_HUGEPAGE);
    m->ptr = p;
    m->bytes = bytes;
    m->pinned = 0;
    return ZO_OK;
}

static void warn_pin_fallback(zo_hostpool_t pool, size_t bytes, const char *why)
{
    pthread_mutex_lock(&pool->mu);
    pool->n_fallbacks++;
    int first = !pool->warned_pin;
    pool->warned_pin = 1;
    pthread_mutex_unlock(&pool->mu);
    if (!first) {
        ZO_LOGD(SUBSYS, "host pool: %zu more bytes unpinned: %s", bytes, why);
        return;
    }
    char b[32], l[32];
    zo_hostpool_placement pl = pool->placement;
    fill_memlock(&pl);
    ZO_LOGW(SUBSYS,
            "host pool: could not pin %s on NUMA node %d (%s); using unpinned memory, so copies to "
            "and from "
            "the device will be slower. RLIMIT_MEMLOCK is %s%s. Later pin failures of this pool "
            "are counted "
            "in its statistics (n_pin_fallbacks, unpinned_bytes), not logged",
            zo_fmt_bytes(b, sizeof b, bytes), pl.node, why,
            fmt_memlock(l, sizeof l, pl.memlock_soft),
            pl.cap_ipc_lock ? " (ignored: the process holds CAP_IPC_LOCK)" : "");
}

/* Page-lock m; on failure keep it unpinned (counted, one warning) unless
 * the configuration forbids, then the caller unmaps it. */
static zo_status pin_or_fall_back(zo_hostpool_t pool, mapping *m)
{
    char why[512];
    if (!(zo_device_caps(pool->dev) & ZO_DEVCAP_HOST_REGISTER)) {
        snprintf(why, sizeof why, "the %s device cannot pin host memory",
                 zo_device_backend(pool->dev));
    } else {
        zo_status st = zo_device_host_register(pool->dev, m->ptr, m->bytes);
        if (st == ZO_OK) {
            m->pinned = 1;
            return ZO_OK;
        }
        snprintf(why, sizeof why, "%s", zo_last_error());
    }
    if (!pool->cfg.allow_unpinned)
        return ZO_FAIL(ZO_ERR_PIN, SUBSYS,
                       "host pool: pinning %zu bytes failed (%s) and allow_unpinned is 0", m->bytes,
                       why);
    zo_clear_error();
    warn_pin_fallback(pool, m->bytes, why);
#ifdef MADV_POPULATE_WRITE
    /* Pinning would have faulted the pages in (on the chosen node); do the
     * same so the memory is really there and placed before it is used. */
    madvise(m->ptr, m->bytes, MADV_POPULATE_WRITE);
#endif
    return ZO_OK;
}

static void unmap(zo_hostpool_t pool, mapping *m)
{
    if (m->pinned)
        zo_device_host_unregister(pool->dev, m->ptr);
    munmap(m->ptr, m->bytes);
}

/* Budget, map, pin: the common path of general allocations and slot sets.
 * On failure nothing is held and the budget is given back. */
static zo_status acquire(zo_hostpool_t pool, const char *what, size_t bytes, int new_set,
                         mapping *m)
{
    ZO_TRY(take_budget(pool, what, bytes, new_set));
    zo_status st = map_on_node(pool, bytes, m);
    if (st == ZO_OK) {
        st = pin_or_fall_back(pool, m);
        if (st != ZO_OK)
            munmap(m->ptr, m->bytes);
    }
    if (st != ZO_OK) {
        pthread_mutex_lock(&pool->mu);
        pool->n_sets_pending -= new_set;
        pthread_mutex_unlock(&pool->mu);
        give_budget(pool, m, bytes, 0);
    }
    return st;
}

/* ---- pool ---- */

static zo_status check_config(const zo_hostpool_config *cfg)
{
    if (!cfg || cfg->struct_size < sizeof *cfg)
        return ZO_FAIL(
            ZO_ERR_INVALID_ARG, SUBSYS,
            "host pool config must be a zo_hostpool_config set up with ZO_HOSTPOOL_CONFIG_INIT");
    if (cfg->max_pinned_bytes == 0)
        return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS,
                       "host pool: max_pinned_bytes is 0; give the pinned budget in bytes");
    if (cfg->node >= 0 && !zo_topo_node_valid(cfg->node))
        return ZO_FAIL(
            ZO_ERR_CONFIG, SUBSYS,
            "host pool: NUMA node %d does not exist or has no memory (this machine has %d node(s) "
            "with memory); use -1 for the node nearest the device",
            cfg->node, zo_topo_numa_node_count());
    if (cfg->node >= 16 * 64)
        return ZO_FAIL(ZO_ERR_CONFIG, SUBSYS,
                       "host pool: NUMA node %d is beyond the 1024 nodes supported", cfg->node);
    return ZO_OK;
}

zo_status zo_hostpool_init(zo_hostpool_t *out, zo_device_t dev, const zo_hostpool_config *cfg)
{
    if (!out || !dev)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_hostpool_init needs out and a device");
    ZO_TRY(check_config(cfg));
    zo_hostpool_t pool = calloc(1, sizeof *pool);
    if (!pool)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating the host pool");
    pool->dev = dev;
    pool->cfg = *cfg;
    pool->cfg.struct_size = sizeof pool->cfg;
    pool->placement = (zo_hostpool_placement)ZO_HOSTPOOL_PLACEMENT_INIT;
    zo_status st = choose_placement(pool);
    if (st != ZO_OK) {
        free(pool);
        return st;
    }
    pthread_mutex_init(&pool->mu, NULL);
    char b[32];
    ZO_LOGI(SUBSYS, "host pool: budget %s on NUMA node %d (%s)",
            zo_fmt_bytes(b, sizeof b, cfg->max_pinned_bytes), pool->placement.node,
            pool->placement.reason);
    *out = pool;
    return ZO_OK;
}

void zo_hostpool_free(zo_hostpool_t pool)
{
    if (!pool)
        return;
    if (pool->n_allocs)
        ZO_LOGD(SUBSYS, "host pool freed with %zu general allocation(s) live", pool->n_allocs);
    for (size_t i = 0; i < pool->n_allocs; i++)
        unmap(pool, &pool->allocs[i]);
    for (int i = 0; i < pool->n_sets; i++) {
        unmap(pool, &pool->sets[i].m);
        free(pool->sets[i].free_stack);
        free(pool->sets[i].taken);
    }
    free(pool->allocs);
    pthread_mutex_destroy(&pool->mu);
    free(pool);
}

/* ---- general allocations ---- */

/* Index of the first allocation whose ptr >= p. */
static size_t alloc_lower_bound(zo_hostpool_t pool, const void *p)
{
    size_t lo = 0, hi = pool->n_allocs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)pool->allocs[mid].ptr < (uintptr_t)p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static long alloc_find(zo_hostpool_t pool, const void *p)
{
    size_t i = alloc_lower_bound(pool, p);
    return i < pool->n_allocs && pool->allocs[i].ptr == p ? (long)i : -1;
}

static int alloc_insert(zo_hostpool_t pool, const mapping *m)
{
    if (pool->n_allocs == pool->cap_allocs) {
        size_t cap = pool->cap_allocs ? pool->cap_allocs * 2 : 16;
        mapping *a = realloc(pool->allocs, cap * sizeof *a);
        if (!a)
            return -1;
        pool->allocs = a;
        pool->cap_allocs = cap;
    }
    size_t i = alloc_lower_bound(pool, m->ptr);
    memmove(&pool->allocs[i + 1], &pool->allocs[i], (pool->n_allocs - i) * sizeof *m);
    pool->allocs[i] = *m;
    pool->n_allocs++;
    return 0;
}

zo_status zo_hostpool_alloc(zo_hostpool_t pool, size_t bytes, void **out)
{
    if (!pool || !out || !bytes)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "zo_hostpool_alloc needs a pool, out and a size > 0");
    if (bytes > SIZE_MAX - PAGE) {
        pthread_mutex_lock(&pool->mu);
        return refuse_budget(pool, "an allocation", bytes);
    }
    size_t rounded = zo_round_up(bytes, PAGE);
    mapping m;
    ZO_TRY(acquire(pool, "an allocation", rounded, 0, &m));
    pthread_mutex_lock(&pool->mu);
    if (alloc_insert(pool, &m) != 0) {
        pthread_mutex_unlock(&pool->mu);
        unmap(pool, &m);
        give_budget(pool, &m, rounded, 0);
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "host pool: growing the allocation table");
    }
    count_mapping(pool, &m);
    add_in_use(pool, rounded);
    pthread_mutex_unlock(&pool->mu);
    *out = m.ptr;
    return ZO_OK;
}

/* ---- slot sets ---- */

static zo_status slot_set_tables(slot_set *s, size_t n)
{
    s->free_stack = malloc(n * sizeof *s->free_stack);
    s->taken = calloc(n, 1);
    if (!s->free_stack || !s->taken) {
        free(s->free_stack);
        free(s->taken);
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "host pool: allocating the table of %zu slots", n);
    }
    /* Slot 0 on top, so slots are handed out in address order at first. */
    for (size_t i = 0; i < n; i++)
        s->free_stack[i] = n - 1 - i;
    s->n = s->n_free = n;
    return ZO_OK;
}

zo_status zo_hostpool_add_slots(zo_hostpool_t pool, size_t slot_bytes, size_t n_slots, int *set_id)
{
    if (!pool || !set_id || !slot_bytes || !n_slots)
        return ZO_FAIL(
            ZO_ERR_INVALID_ARG, SUBSYS,
            "zo_hostpool_add_slots needs a pool, set_id, slot_bytes > 0 and n_slots > 0");
    slot_set s = {0};
    if (slot_bytes > SIZE_MAX - PAGE || n_slots > SIZE_MAX / zo_round_up(slot_bytes, PAGE)) {
        pthread_mutex_lock(&pool->mu);
        return refuse_budget(pool, "a slot set", UINT64_MAX);
    }
    s.stride = zo_round_up(slot_bytes, PAGE);
    size_t total = s.stride * n_slots;
    ZO_TRY(slot_set_tables(&s, n_slots));
    zo_status st = acquire(pool, "a slot set", total, 1, &s.m);
    if (st != ZO_OK) {
        free(s.free_stack);
        free(s.taken);
        return st;
    }
    pthread_mutex_lock(&pool->mu);
    int id = pool->n_sets++;
    pool->n_sets_pending--;
    pool->sets[id] = s;
    count_mapping(pool, &s.m);
    pthread_mutex_unlock(&pool->mu);
    *set_id = id;
    return ZO_OK;
}

zo_status zo_hostpool_slot_alloc(zo_hostpool_t pool, int set_id, void **out)
{
    if (!pool || !out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_hostpool_slot_alloc needs a pool and out");
    pthread_mutex_lock(&pool->mu);
    if (set_id < 0 || set_id >= pool->n_sets) {
        int n = pool->n_sets;
        pthread_mutex_unlock(&pool->mu);
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "host pool: no slot set %d (the pool has %d)",
                       set_id, n);
    }
    slot_set *s = &pool->sets[set_id];
    if (s->n_free == 0) {
        size_t n = s->n, stride = s->stride;
        pool->n_refusals++;
        pthread_mutex_unlock(&pool->mu);
        return ZO_FAIL(
            ZO_ERR_BUDGET, SUBSYS,
            "host pool: all %zu slots of set %d (%zu bytes each) are taken; release one first or "
            "add slots",
            n, set_id, stride);
    }
    size_t i = s->free_stack[--s->n_free];
    s->taken[i] = 1;
    add_in_use(pool, s->stride);
    pthread_mutex_unlock(&pool->mu);
    *out = s->m.ptr + i * s->stride;
    return ZO_OK;
}

/* The set holding p and p's slot index, or NULL. */
static slot_set *slot_find(zo_hostpool_t pool, const void *p, size_t *idx, size_t *off)
{
    for (int k = 0; k < pool->n_sets; k++) {
        slot_set *s = &pool->sets[k];
        uintptr_t base = (uintptr_t)s->m.ptr;
        if ((uintptr_t)p < base || (uintptr_t)p - base >= s->m.bytes)
            continue;
        *idx = ((uintptr_t)p - base) / s->stride;
        *off = ((uintptr_t)p - base) % s->stride;
        return s;
    }
    return NULL;
}

static zo_status release_slot(zo_hostpool_t pool, slot_set *s, size_t i, size_t off, void *ptr)
{
    if (off != 0 || !s->taken[i]) {
        pthread_mutex_unlock(&pool->mu);
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "host pool: %p is %s slot %zu (double free, or a pointer not returned by "
                       "zo_hostpool_slot_alloc)",
                       ptr, off ? "inside" : "the already free", i);
    }
    s->taken[i] = 0;
    s->free_stack[s->n_free++] = i;
    pool->in_use -= s->stride;
    pthread_mutex_unlock(&pool->mu);
    return ZO_OK;
}

zo_status zo_hostpool_release(zo_hostpool_t pool, void *ptr)
{
    if (!ptr)
        return ZO_OK;
    if (!pool)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_hostpool_release: pool is NULL");
    pthread_mutex_lock(&pool->mu);
    long k = alloc_find(pool, ptr);
    if (k >= 0) {
        mapping m = pool->allocs[k];
        memmove(&pool->allocs[k], &pool->allocs[k + 1],
                (pool->n_allocs - (size_t)k - 1) * sizeof m);
        pool->n_allocs--;
        pool->in_use -= m.bytes;
        pthread_mutex_unlock(&pool->mu);
        unmap(pool, &m);
        give_budget(pool, &m, m.bytes, 1);
        return ZO_OK;
    }
    size_t i, off;
    slot_set *s = slot_find(pool, ptr, &i, &off);
    if (s)
        return release_slot(pool, s, i, off, ptr);
    pthread_mutex_unlock(&pool->mu);
    return ZO_FAIL(
        ZO_ERR_INVALID_ARG, SUBSYS,
        "host pool: %p is not a live allocation or slot of this pool (double free, an interior "
        "pointer, or memory from elsewhere)",
        ptr);
}

zo_status zo_hostpool_query(zo_hostpool_t pool, const void *ptr, size_t *bytes, int *pinned)
{
    if (!pool || !ptr)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_hostpool_query needs a pool and a pointer");
    size_t sz = 0, i, off;
    int pin = 0, ok = 0;
    pthread_mutex_lock(&pool->mu);
    long k = alloc_find(pool, ptr);
    slot_set *s;
    if (k >= 0) {
        sz = pool->allocs[k].bytes;
        pin = pool->allocs[k].pinned;
        ok = 1;
    } else if ((s = slot_find(pool, ptr, &i, &off)) && off == 0 && s->taken[i]) {
        sz = s->stride;
        pin = s->m.pinned;
        ok = 1;
    }
    pthread_mutex_unlock(&pool->mu);
    if (!ok)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "host pool: %p is not a live allocation or taken slot", ptr);
    if (bytes)
        *bytes = sz;
    if (pinned)
        *pinned = pin;
    return ZO_OK;
}

/* ---- statistics ---- */

static int cmp_mapping(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const mapping *)a)->ptr, y = (uintptr_t)((const mapping *)b)->ptr;
    return x < y ? -1 : x > y;
}

static uint64_t overlap_bytes(const mapping *ms, size_t n, uintptr_t lo, uintptr_t hi)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        uintptr_t a = (uintptr_t)ms[i].ptr, b = a + ms[i].bytes;
        if (a >= hi)
            break;
        if (b > lo)
            sum += (b < hi ? b : hi) - (a > lo ? a : lo);
    }
    return sum;
}

/* Bytes of the pool's mappings backed by transparent huge pages, from
 * AnonHugePages in /proc/self/smaps. The kernel may merge a mapping with a
 * neighbour into one area; a shared area is credited at most its overlap. */
static int huge_bytes_of(const mapping *ms, size_t n, uint64_t *out)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    char line[512];
    uint64_t sum = 0, overlap = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi, kb;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2)
            overlap = overlap_bytes(ms, n, lo, hi);
        else if (overlap && sscanf(line, "AnonHugePages: %lu kB", &kb) == 1)
            sum += (uint64_t)kb * 1024 < overlap ? (uint64_t)kb * 1024 : overlap;
    }
    fclose(f);
    *out = sum;
    return 0;
}

static mapping *snapshot_mappings(zo_hostpool_t pool, size_t *n)
{
    mapping *ms = malloc((pool->n_allocs + MAX_SLOT_SETS) * sizeof *ms);
    if (!ms)
        return NULL;
    memcpy(ms, pool->allocs, pool->n_allocs * sizeof *ms);
    for (int k = 0; k < pool->n_sets; k++)
        ms[pool->n_allocs + (size_t)k] = pool->sets[k].m;
    *n = pool->n_allocs + (size_t)pool->n_sets;
    return ms;
}

zo_status zo_hostpool_get_stats(zo_hostpool_t pool, zo_hostpool_stats *out)
{
    if (!pool || !out || out->struct_size < sizeof *out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "zo_hostpool_get_stats needs a pool and a zo_hostpool_stats set up with "
                       "ZO_HOSTPOOL_STATS_INIT");
    zo_hostpool_stats s = ZO_HOSTPOOL_STATS_INIT;
    pthread_mutex_lock(&pool->mu);
    s.budget = pool->cfg.max_pinned_bytes;
    s.reserved = pool->reserved;
    s.reserved_high_water = pool->reserved_hw;
    s.in_use = pool->in_use;
    s.in_use_high_water = pool->in_use_hw;
    s.pinned_bytes = pool->pinned;
    s.unpinned_bytes = pool->unpinned;
    for (int k = 0; k < pool->n_sets; k++) {
        s.slots_total += pool->sets[k].n;
        s.slots_free += pool->sets[k].n_free;
    }
    s.n_allocs = pool->n_allocs;
    s.n_pin_fallbacks = pool->n_fallbacks;
    s.n_budget_refusals = pool->n_refusals;
    s.node = pool->placement.node;
    pthread_mutex_unlock(&pool->mu);
    *out = s;
    return ZO_OK;
}

zo_status zo_hostpool_huge_bytes(zo_hostpool_t pool, uint64_t *out)
{
    if (!pool || !out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_hostpool_huge_bytes needs a pool and out");
    size_t n = 0;
    pthread_mutex_lock(&pool->mu);
    mapping *ms = snapshot_mappings(pool, &n);
    uint64_t reserved = pool->reserved;
    pthread_mutex_unlock(&pool->mu);
    if (!ms)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "host pool: copying the list of %zu mappings", n);
    qsort(ms, n, sizeof *ms, cmp_mapping);
    uint64_t huge = 0;
    int rc = huge_bytes_of(ms, n, &huge);
    free(ms);
    if (rc != 0)
        return ZO_FAIL(ZO_ERR_UNSUPPORTED, SUBSYS, "cannot read /proc/self/smaps: %s",
                       strerror(errno));
    /* A mapping released meanwhile may still be counted: never report more than is held. */
    *out = huge < reserved ? huge : reserved;
    return ZO_OK;
}

zo_status zo_hostpool_get_placement(zo_hostpool_t pool, zo_hostpool_placement *out)
{
    ZO_TRY(check_placement_arg(out));
    if (!pool)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_hostpool_get_placement: pool is NULL");
    *out = pool->placement;
    fill_memlock(out);
    return ZO_OK;
}
