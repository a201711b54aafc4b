/* The host pool on the cpu device: exact accounting against a reference
 * model, the budget, slots, page placement on the requested node, huge
 * pages, the pin fallback (injected and real RLIMIT_MEMLOCK), error paths. */
#include <dirent.h>
#include <linux/capability.h>
#include <numa.h>
#include <numaif.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "hostpool_internal.h"
#include "zo/device.h"
#include "zo/device_testing.h"
#include "zo/hostpool.h"
#include "zo/log.h"
#include "zo/topo.h"
#include "zo_test.h"

#define KiB ((size_t)1024)
#define MiB (KiB * 1024)
#define PG  ((size_t)ZO_HOSTPOOL_PAGE)

static size_t round_page(size_t n)
{
    return (n + PG - 1) / PG * PG;
}

/* ---- fixtures ---- */

static zo_device_t g_dev;

static int setup_device(void **state)
{
    (void)state;
    zo_device_config cfg = ZO_DEVICE_CONFIG_INIT;
    cfg.backend = "cpu";
    cfg.mem_budget = 64 * MiB;
    return zo_device_init(&g_dev, &cfg) == ZO_OK ? 0 : -1;
}

static int teardown_device(void **state)
{
    (void)state;
    zo_device_free(g_dev);
    g_dev = NULL;
    return 0;
}

static zo_hostpool_t make_pool(uint64_t budget, int node)
{
    zo_hostpool_config cfg = ZO_HOSTPOOL_CONFIG_INIT;
    cfg.max_pinned_bytes = budget;
    cfg.node = node;
    zo_hostpool_t pool = NULL;
    ZO_ASSERT_OK(zo_hostpool_init(&pool, g_dev, &cfg));
    return pool;
}

static zo_hostpool_stats stats_of(zo_hostpool_t pool)
{
    zo_hostpool_stats s = ZO_HOSTPOOL_STATS_INIT;
    ZO_ASSERT_OK(zo_hostpool_get_stats(pool, &s));
    return s;
}

/* Captured warnings of the hostpool subsystem. */
static int g_warnings;
static char g_last_warning[1024];

static void capture_log(zo_log_level level, const char *subsys, const char *msg, void *user)
{
    (void)user;
    if (level == ZO_LOG_WARN && strcmp(subsys, "hostpool") == 0) {
        g_warnings++;
        snprintf(g_last_warning, sizeof g_last_warning, "%s", msg);
    }
}

static void start_capture(void)
{
    g_warnings = 0;
    g_last_warning[0] = '\0';
    zo_log_set_level(ZO_LOG_WARN);
    zo_log_set_callback(capture_log, NULL);
}

static void stop_capture(void)
{
    zo_log_set_callback(NULL, NULL);
}

/* ---- configuration and arguments ---- */

static void test_init_rejects_bad_config(void **state)
{
    (void)state;
    zo_hostpool_t pool = NULL;
    zo_hostpool_config cfg = ZO_HOSTPOOL_CONFIG_INIT;
    ZO_ASSERT_ST(zo_hostpool_init(&pool, g_dev, &cfg), ZO_ERR_CONFIG); /* budget 0 */
    cfg.max_pinned_bytes = MiB;
    cfg.node = 4095;
    ZO_ASSERT_ST(zo_hostpool_init(&pool, g_dev, &cfg), ZO_ERR_CONFIG);
    assert_non_null(strstr(zo_last_error(), "node 4095"));
    cfg.node = -1;
    ZO_ASSERT_ST(zo_hostpool_init(&pool, NULL, &cfg), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_hostpool_init(&pool, g_dev, NULL), ZO_ERR_INVALID_ARG);
    cfg.struct_size = 8;
    ZO_ASSERT_ST(zo_hostpool_init(&pool, g_dev, &cfg), ZO_ERR_INVALID_ARG);
    assert_null(pool);
    zo_hostpool_free(NULL);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    zo_hostpool_t pool = make_pool(MiB, -1);
    void *p = NULL;
    int id;
    ZO_ASSERT_ST(zo_hostpool_alloc(pool, 0, &p), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_hostpool_alloc(pool, 1, NULL), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_hostpool_alloc(NULL, 1, &p), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_hostpool_alloc(pool, SIZE_MAX, &p), ZO_ERR_BUDGET);
    ZO_ASSERT_ST(zo_hostpool_add_slots(pool, 0, 1, &id), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_hostpool_add_slots(pool, PG, 0, &id), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_hostpool_add_slots(pool, SIZE_MAX / 2, 4, &id), ZO_ERR_BUDGET);
    ZO_ASSERT_ST(zo_hostpool_slot_alloc(pool, 0, &p), ZO_ERR_INVALID_ARG); /* no set yet */
    ZO_ASSERT_ST(zo_hostpool_slot_alloc(pool, -1, &p), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_hostpool_query(pool, &id, NULL, NULL), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_hostpool_huge_bytes(pool, NULL), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_OK(zo_hostpool_release(pool, NULL));
    zo_hostpool_stats s = ZO_HOSTPOOL_STATS_INIT;
    s.struct_size = 8;
    ZO_ASSERT_ST(zo_hostpool_get_stats(pool, &s), ZO_ERR_INVALID_ARG);
    s = stats_of(pool);
    assert_int_equal(s.reserved, 0);
    assert_int_equal(s.in_use, 0);
    assert_int_equal(s.n_budget_refusals, 2);
    zo_hostpool_free(pool);
}

/* ---- exact accounting ---- */

static void test_sizes_round_to_the_page_only(void **state)
{
    (void)state;
    const size_t sizes[] = {1, PG - 1, PG, PG + 1, 100000, 3 * MiB + 100, 5 * MiB + 1};
    zo_hostpool_t pool = make_pool(64 * MiB, -1);
    uint64_t want = 0;
    void *ptrs[7];
    for (int i = 0; i < 7; i++) {
        ZO_ASSERT_OK(zo_hostpool_alloc(pool, sizes[i], &ptrs[i]));
        assert_int_equal((uintptr_t)ptrs[i] % PG, 0);
        size_t got;
        int pinned;
        ZO_ASSERT_OK(zo_hostpool_query(pool, ptrs[i], &got, &pinned));
        assert_int_equal(got, round_page(sizes[i]));
        want += round_page(sizes[i]);
        /* Fresh memory is zero and writable to its last byte. */
        unsigned char *c = ptrs[i];
        assert_int_equal(c[0], 0);
        assert_int_equal(c[got - 1], 0);
        memset(c, 0xA5, got);
        zo_hostpool_stats s = stats_of(pool);
        assert_int_equal(s.reserved, want);
        assert_int_equal(s.in_use, want);
        assert_int_equal(s.pinned_bytes + s.unpinned_bytes, want);
    }
    /* 3 MiB + 100 takes 3 MiB + 4 KiB, 5 MiB + 1 takes 5 MiB + 4 KiB: never 4 or 8 MiB. */
    assert_int_equal(want,
                     4096 + 4096 + 4096 + 8192 + 102400 + (3 * MiB + 4096) + (5 * MiB + 4096));
    for (int i = 0; i < 7; i++)
        ZO_ASSERT_OK(zo_hostpool_release(pool, ptrs[i]));
    zo_hostpool_stats s = stats_of(pool);
    assert_int_equal(s.reserved, 0);
    assert_int_equal(s.in_use, 0);
    assert_int_equal(s.reserved_high_water, want);
    assert_int_equal(s.in_use_high_water, want);
    assert_int_equal(s.pinned_bytes + s.unpinned_bytes, 0);
    zo_hostpool_free(pool);
}

static void test_budget_is_exact(void **state)
{
    (void)state;
    zo_hostpool_t pool = make_pool(10 * PG, -1);
    void *a, *b, *c;
    ZO_ASSERT_OK(zo_hostpool_alloc(pool, 8 * PG, &a));
    ZO_ASSERT_ST(zo_hostpool_alloc(pool, 2 * PG + 1, &b), ZO_ERR_BUDGET);
    /* The message names the request, what is in use and the budget. */
    assert_non_null(strstr(zo_last_error(), "(12288 bytes)"));
    assert_non_null(strstr(zo_last_error(), "(32768 bytes) in use"));
    assert_non_null(strstr(zo_last_error(), "max_pinned_bytes 40.00 KiB (40960 bytes)"));
    ZO_ASSERT_OK(zo_hostpool_alloc(pool, 2 * PG, &b)); /* exactly full */
    ZO_ASSERT_ST(zo_hostpool_alloc(pool, 1, &c), ZO_ERR_BUDGET);
    int id;
    ZO_ASSERT_ST(zo_hostpool_add_slots(pool, 1, 1, &id), ZO_ERR_BUDGET);
    zo_hostpool_stats s = stats_of(pool);
    assert_int_equal(s.reserved, 10 * PG);
    assert_int_equal(s.n_budget_refusals, 3);
    ZO_ASSERT_OK(zo_hostpool_release(pool, a));
    ZO_ASSERT_OK(zo_hostpool_alloc(pool, 8 * PG, &c));
    s = stats_of(pool);
    assert_int_equal(s.reserved_high_water, 10 * PG);
    ZO_ASSERT_OK(zo_hostpool_release(pool, b));
    ZO_ASSERT_OK(zo_hostpool_release(pool, c));
    zo_hostpool_free(pool);
}

static void test_slots(void **state)
{
    (void)state;
    zo_hostpool_t pool = make_pool(2 * MiB, -1);
    int id = -1;
    ZO_ASSERT_OK(zo_hostpool_add_slots(pool, 100000, 5, &id)); /* 100000 -> 102400 per slot */
    assert_int_equal(id, 0);
    zo_hostpool_stats s = stats_of(pool);
    assert_int_equal(s.reserved, 5 * 102400);
    assert_int_equal(s.in_use, 0);
    assert_int_equal(s.slots_total, 5);
    assert_int_equal(s.slots_free, 5);
    int id2;
    ZO_ASSERT_ST(zo_hostpool_add_slots(pool, MiB, 2, &id2), ZO_ERR_BUDGET);
    void *p[5], *extra;
    for (int i = 0; i < 5; i++) {
        ZO_ASSERT_OK(zo_hostpool_slot_alloc(pool, id, &p[i]));
        assert_int_equal((uintptr_t)p[i] % PG, 0);
        if (i)
            assert_int_equal((char *)p[i] - (char *)p[i - 1], 102400);
        memset(p[i], i + 1, 102400);
        size_t sz;
        ZO_ASSERT_OK(zo_hostpool_query(pool, p[i], &sz, NULL));
        assert_int_equal(sz, 102400);
    }
    ZO_ASSERT_ST(zo_hostpool_slot_alloc(pool, id, &extra), ZO_ERR_BUDGET);
    s = stats_of(pool);
    assert_int_equal(s.in_use, 5 * 102400);
    assert_int_equal(s.slots_free, 0);
    ZO_ASSERT_OK(zo_hostpool_release(pool, p[2]));
    ZO_ASSERT_ST(zo_hostpool_release(pool, p[2]), ZO_ERR_INVALID_ARG); /* double free */
    ZO_ASSERT_ST(zo_hostpool_release(pool, (char *)p[1] + PG), ZO_ERR_INVALID_ARG); /* interior */
    ZO_ASSERT_ST(zo_hostpool_query(pool, p[2], NULL, NULL), ZO_ERR_INVALID_ARG);
    s = stats_of(pool);
    assert_int_equal(s.in_use, 4 * 102400);
    assert_int_equal(s.slots_free, 1);
    /* The slot freed last is handed out next (warm), and its neighbours are untouched. */
    ZO_ASSERT_OK(zo_hostpool_slot_alloc(pool, id, &extra));
    assert_ptr_equal(extra, p[2]);
    assert_int_equal(((unsigned char *)p[1])[102399], 2);
    assert_int_equal(((unsigned char *)p[3])[0], 4);
    for (int i = 0; i < 5; i++)
        ZO_ASSERT_OK(zo_hostpool_release(pool, p[i]));
    s = stats_of(pool);
    assert_int_equal(s.in_use, 0);
    assert_int_equal(s.slots_free, 5);
    assert_int_equal(s.reserved, 5 * 102400); /* the set stays carved */
    zo_hostpool_free(pool);
}

static void test_too_many_slot_sets(void **state)
{
    (void)state;
    zo_hostpool_t pool = make_pool(MiB, -1);
    int id;
    for (int i = 0; i < 16; i++) {
        ZO_ASSERT_OK(zo_hostpool_add_slots(pool, 1, 1, &id));
        assert_int_equal(id, i);
    }
    ZO_ASSERT_ST(zo_hostpool_add_slots(pool, 1, 1, &id), ZO_ERR_INVALID_ARG);
    assert_int_equal(stats_of(pool).reserved, 16 * PG);
    zo_hostpool_free(pool);
}

static void test_foreign_and_double_free_change_nothing(void **state)
{
    (void)state;
    zo_hostpool_t pool = make_pool(MiB, -1);
    zo_hostpool_t other = make_pool(MiB, -1);
    void *a, *b;
    ZO_ASSERT_OK(zo_hostpool_alloc(pool, 3 * PG, &a));
    ZO_ASSERT_OK(zo_hostpool_alloc(other, PG, &b));
    zo_hostpool_stats before = stats_of(pool);
    void *heap = malloc(64);
    ZO_ASSERT_ST(zo_hostpool_release(pool, heap), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_hostpool_release(pool, b), ZO_ERR_INVALID_ARG); /* another pool's */
    ZO_ASSERT_ST(zo_hostpool_release(pool, (char *)a + PG), ZO_ERR_INVALID_ARG);
    free(heap);
    zo_hostpool_stats after = stats_of(pool);
    assert_memory_equal(&before, &after, sizeof before);
    ZO_ASSERT_OK(zo_hostpool_release(pool, a));
    ZO_ASSERT_ST(zo_hostpool_release(pool, a), ZO_ERR_INVALID_ARG);
    assert_int_equal(stats_of(pool).reserved, 0);
    zo_hostpool_free(pool);
    zo_hostpool_free(other); /* frees b, still live */
}

/* A reference model of what the pool must hold, checked after every step of
 * a random sequence of general allocations, slot takes and releases. */
typedef struct live {
    unsigned char *p;
    size_t bytes;
    unsigned char tag;
    int slot;
} live;

typedef struct model {
    live items[512];
    int n;
    uint64_t reserved, reserved_hw, in_use, in_use_hw, slots_free, refusals;
} model;

static void model_check(zo_hostpool_t pool, const model *m, uint64_t budget)
{
    zo_hostpool_stats s = stats_of(pool);
    assert_int_equal(s.reserved, m->reserved);
    assert_int_equal(s.reserved_high_water, m->reserved_hw);
    assert_int_equal(s.in_use, m->in_use);
    assert_int_equal(s.in_use_high_water, m->in_use_hw);
    assert_int_equal(s.slots_free, m->slots_free);
    assert_int_equal(s.n_budget_refusals, m->refusals);
    assert_int_equal(s.pinned_bytes + s.unpinned_bytes, s.reserved);
    assert_true(s.reserved <= budget);
}

static void model_take(model *m, void *p, size_t bytes, int slot, uint64_t *rng)
{
    live *it = &m->items[m->n++];
    it->p = p;
    it->bytes = bytes;
    it->slot = slot;
    it->tag = (unsigned char)(1 + zo_test_rand(rng) % 255);
    memset(p, it->tag, bytes);
    m->in_use += bytes;
    if (m->in_use > m->in_use_hw)
        m->in_use_hw = m->in_use;
    if (!slot) {
        m->reserved += bytes;
        if (m->reserved > m->reserved_hw)
            m->reserved_hw = m->reserved;
    } else {
        m->slots_free--;
    }
}

/* Every byte still carries its owner's tag: no two live blocks overlap. */
static void model_release(zo_hostpool_t pool, model *m, int k)
{
    live it = m->items[k];
    for (size_t i = 0; i < it.bytes; i += 61)
        assert_int_equal(it.p[i], it.tag);
    assert_int_equal(it.p[it.bytes - 1], it.tag);
    ZO_ASSERT_OK(zo_hostpool_release(pool, it.p));
    m->items[k] = m->items[--m->n];
    m->in_use -= it.bytes;
    if (it.slot)
        m->slots_free++;
    else
        m->reserved -= it.bytes;
}

static void random_step(zo_hostpool_t pool, model *m, int set, size_t stride, uint64_t budget,
                        uint64_t *rng)
{
    unsigned r = (unsigned)(zo_test_rand(rng) % 10);
    void *p = NULL;
    if ((r < 4 && m->n > 0) || m->n == 512) {
        model_release(pool, m, (int)(zo_test_rand(rng) % (uint64_t)m->n));
    } else if (r < 6) {
        zo_status want = m->slots_free ? ZO_OK : ZO_ERR_BUDGET;
        ZO_ASSERT_ST(zo_hostpool_slot_alloc(pool, set, &p), want);
        if (want == ZO_OK)
            model_take(m, p, stride, 1, rng);
        else
            m->refusals++;
    } else {
        size_t bytes =
            r == 9 ? PG * (1 + zo_test_rand(rng) % 64) : 1 + zo_test_rand(rng) % (384 * KiB);
        size_t rounded = round_page(bytes);
        zo_status want = m->reserved + rounded <= budget ? ZO_OK : ZO_ERR_BUDGET;
        ZO_ASSERT_ST(zo_hostpool_alloc(pool, bytes, &p), want);
        if (want == ZO_OK)
            model_take(m, p, rounded, 0, rng);
        else
            m->refusals++;
    }
}

static void test_random_sequences_account_exactly(void **state)
{
    (void)state;
    const uint64_t budget = 6 * MiB;
    for (uint64_t seed = 1; seed <= 3; seed++) {
        uint64_t rng = seed;
        zo_hostpool_t pool = make_pool(budget, -1);
        model m;
        memset(&m, 0, sizeof m);
        int set;
        ZO_ASSERT_OK(zo_hostpool_add_slots(pool, 200000, 6, &set)); /* 200704 per slot */
        const size_t stride = 200704;
        m.reserved = m.reserved_hw = 6 * stride;
        m.slots_free = 6;
        for (int step = 0; step < 1500; step++) {
            random_step(pool, &m, set, stride, budget, &rng);
            model_check(pool, &m, budget);
        }
        assert_true(m.refusals > 0); /* the budget was reached */
        while (m.n)
            model_release(pool, &m, m.n - 1);
        model_check(pool, &m, budget);
        assert_int_equal(m.in_use, 0);
        zo_hostpool_free(pool);
    }
}

/* ---- placement ---- */

static void pin_to_current_cpu(cpu_set_t *saved)
{
    assert_int_equal(sched_getaffinity(0, sizeof *saved, saved), 0);
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
}

static void test_placement_for_cpu_device(void **state)
{
    (void)state;
    cpu_set_t saved;
    pin_to_current_cpu(&saved); /* so the thread cannot move between the two answers */
    int cpu = sched_getcpu();
    int want = numa_available() < 0 ? 0 : numa_node_of_cpu(cpu);
    zo_hostpool_placement pl = ZO_HOSTPOOL_PLACEMENT_INIT;
    ZO_ASSERT_OK(zo_hostpool_placement_for_device(g_dev, &pl));
    assert_int_equal(pl.node, want);
    char reason[160];
    snprintf(reason, sizeof reason, "cpu device: node of the calling thread (CPU %d)", cpu);
    assert_string_equal(pl.reason, reason);
    assert_string_equal(pl.device, "cpu");
    assert_int_equal(pl.n_nodes, zo_topo_numa_node_count());
    int n_cpus;
    ZO_ASSERT_OK(zo_topo_node_cpu_list(want, NULL, 0, &n_cpus));
    assert_int_equal(pl.n_local_cpus, n_cpus);
    struct rlimit rl;
    assert_int_equal(getrlimit(RLIMIT_MEMLOCK, &rl), 0);
    assert_true(pl.memlock_soft ==
                (rl.rlim_cur == RLIM_INFINITY ? ZO_MEMLOCK_UNLIMITED : rl.rlim_cur));
    assert_true(pl.memlock_hard ==
                (rl.rlim_max == RLIM_INFINITY ? ZO_MEMLOCK_UNLIMITED : rl.rlim_max));
    print_message("placement: %s -> node %d (%s), memlock soft %llu hard %llu, CAP_IPC_LOCK %d\n",
                  pl.device, pl.node, pl.reason, (unsigned long long)pl.memlock_soft,
                  (unsigned long long)pl.memlock_hard, pl.cap_ipc_lock);
    /* A pool with node -1 uses that choice; an explicit node says so. */
    zo_hostpool_t pool = make_pool(MiB, -1);
    zo_hostpool_placement pp = ZO_HOSTPOOL_PLACEMENT_INIT;
    ZO_ASSERT_OK(zo_hostpool_get_placement(pool, &pp));
    assert_int_equal(pp.node, want);
    assert_string_equal(pp.reason, reason);
    assert_int_equal(stats_of(pool).node, want);
    zo_hostpool_free(pool);
    pool = make_pool(MiB, want);
    ZO_ASSERT_OK(zo_hostpool_get_placement(pool, &pp));
    snprintf(reason, sizeof reason, "requested node %d", want);
    assert_string_equal(pp.reason, reason);
    assert_string_equal(pp.device, "cpu");
    zo_hostpool_free(pool);
    pl.struct_size = 4;
    ZO_ASSERT_ST(zo_hostpool_placement_for_device(g_dev, &pl), ZO_ERR_INVALID_ARG);
    assert_int_equal(sched_setaffinity(0, sizeof saved, &saved), 0);
}

/* The first PCI device sysfs lists, standing in for a GPU's bus id. */
static int first_pci_device(char *id, size_t cap)
{
    DIR *d = opendir("/sys/bus/pci/devices");
    struct dirent *e;
    int found = 0;
    while (d && !found && (e = readdir(d)))
        if (e->d_name[0] != '.')
            found = snprintf(id, cap, "%s", e->d_name) < (int)cap;
    if (d)
        closedir(d);
    return found;
}

static void test_placement_for_a_gpu_by_pci_locality(void **state)
{
    (void)state;
    zo_device_info info = ZO_DEVICE_INFO_INIT;
    snprintf(info.backend, sizeof info.backend, "cuda");
    info.ordinal = 1;
    zo_hostpool_placement pl = ZO_HOSTPOOL_PLACEMENT_INIT;
    char want[160];
    /* A bus id the machine does not have: the calling thread's node, said so. */
    cpu_set_t saved;
    pin_to_current_cpu(&saved);
    snprintf(info.pci_bus_id, sizeof info.pci_bus_id, "ffff:ff:1f.7");
    ZO_ASSERT_OK(zo_hostpool_placement_for_info_(&info, &pl));
    snprintf(want, sizeof want,
             "GPU ffff:ff:1f.7 not in the PCI topology: node of the calling thread (CPU %d)",
             sched_getcpu());
    assert_string_equal(pl.reason, want);
    assert_string_equal(pl.device, "cuda:1 (ffff:ff:1f.7)");
    assert_int_equal(sched_setaffinity(0, sizeof saved, &saved), 0);
    if (!first_pci_device(info.pci_bus_id, sizeof info.pci_bus_id)) {
        print_message("no PCI device in /sys/bus/pci/devices: the located branch is not checked\n");
        return;
    }
    int node = -1;
    char how[64];
    ZO_ASSERT_OK(zo_topo_node_of_pci(info.pci_bus_id, &node, how, sizeof how));
    ZO_ASSERT_OK(zo_hostpool_placement_for_info_(&info, &pl));
    assert_int_equal(pl.node, node);
    if (zo_topo_numa_node_count() == 1)
        snprintf(want, sizeof want, "GPU %s on a machine with a single NUMA node", info.pci_bus_id);
    else
        snprintf(want, sizeof want, "nearest to GPU %s via %s", info.pci_bus_id, how);
    assert_string_equal(pl.reason, want);
    print_message("placement: %s -> node %d (%s)\n", pl.device, pl.node, pl.reason);
}

/* Touch every page, then ask the kernel where each one is. */
static void check_pages_on_node(unsigned char *p, size_t bytes, int node)
{
    memset(p, 0x5A, bytes);
    enum { MAXP = 1024 };
    void *pages[MAXP];
    int status[MAXP];
    size_t n = 0;
    for (size_t off = 0; off < bytes && n < MAXP; off += 16 * KiB)
        pages[n++] = p + off;
    if (n < MAXP)
        pages[n++] = p + bytes - 1;
    assert_int_equal(move_pages(0, (unsigned long)n, pages, NULL, status, 0), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(status[i], node);
    int where = -1;
    assert_int_equal(get_mempolicy(&where, NULL, 0, p, MPOL_F_NODE | MPOL_F_ADDR), 0);
    assert_int_equal(where, node);
}

static void check_policy(void *p, int node, int strict)
{
    unsigned long mask[16] = {0};
    int mode = -1;
    assert_int_equal(get_mempolicy(&mode, mask, 16 * 64 + 1, p, MPOL_F_ADDR), 0);
    assert_int_equal(mode, strict ? MPOL_BIND : MPOL_PREFERRED);
    assert_true(mask[node / 64] & (1ul << (node % 64)));
}

static void test_pages_sit_on_the_requested_node(void **state)
{
    (void)state;
    if (numa_available() < 0) {
        print_message("skipped: this kernel has no NUMA support (numa_available() < 0)\n");
        skip();
    }
    for (int i = 0; i < zo_topo_numa_node_count(); i++) {
        zo_topo_node nd = ZO_TOPO_NODE_INIT;
        ZO_ASSERT_OK(zo_topo_get_node(i, &nd));
        for (int strict = 0; strict <= 1; strict++) {
            zo_hostpool_config cfg = ZO_HOSTPOOL_CONFIG_INIT;
            cfg.max_pinned_bytes = 16 * MiB;
            cfg.node = nd.node;
            cfg.strict_node = strict;
            zo_hostpool_t pool;
            ZO_ASSERT_OK(zo_hostpool_init(&pool, g_dev, &cfg));
            void *big, *small, *slot;
            int set;
            ZO_ASSERT_OK(zo_hostpool_alloc(pool, 4 * MiB + 12 * KiB, &big));
            ZO_ASSERT_OK(zo_hostpool_alloc(pool, 40 * KiB, &small));
            ZO_ASSERT_OK(zo_hostpool_add_slots(pool, 256 * KiB, 4, &set));
            ZO_ASSERT_OK(zo_hostpool_slot_alloc(pool, set, &slot));
            check_policy(big, nd.node, strict);
            check_policy(slot, nd.node, strict);
            check_pages_on_node(big, 4 * MiB + 12 * KiB, nd.node);
            check_pages_on_node(small, 40 * KiB, nd.node);
            check_pages_on_node(slot, 256 * KiB, nd.node);
            zo_hostpool_free(pool);
        }
    }
}

static int thp_mode_is(const char *mode)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char line[128] = "";
    if (f) {
        if (!fgets(line, sizeof line, f))
            line[0] = '\0';
        fclose(f);
    }
    char want[32];
    snprintf(want, sizeof want, "[%s]", mode);
    return strstr(line, want) != NULL;
}

static uint64_t huge_bytes_after_touch(int huge_pages)
{
    zo_hostpool_config cfg = ZO_HOSTPOOL_CONFIG_INIT;
    cfg.max_pinned_bytes = 16 * MiB;
    cfg.huge_pages = huge_pages;
    zo_hostpool_t pool;
    ZO_ASSERT_OK(zo_hostpool_init(&pool, g_dev, &cfg));
    void *p;
    ZO_ASSERT_OK(zo_hostpool_alloc(pool, 8 * MiB, &p));
    if (huge_pages)
        assert_int_equal((uintptr_t)p % (2 * MiB), 0);
    memset(p, 1, 8 * MiB);
    uint64_t huge = UINT64_MAX;
    ZO_ASSERT_OK(zo_hostpool_huge_bytes(pool, &huge));
    assert_true(huge <= 8 * MiB);
    zo_hostpool_free(pool);
    return huge;
}

static void test_huge_pages_are_counted(void **state)
{
    (void)state;
    if (thp_mode_is("never")) {
        print_message("skipped: transparent huge pages are disabled on this machine\n");
        skip();
    }
    uint64_t with = huge_bytes_after_touch(1);
    print_message("huge pages: %llu of 8 MiB\n", (unsigned long long)with);
    assert_true(with > 0 && with % (2 * MiB) == 0);
    if (thp_mode_is("madvise"))
        assert_int_equal(huge_bytes_after_touch(0), 0); /* only our madvise asks */
}

/* ---- pinning and its fallback ---- */

static void check_usable(void *p, size_t bytes)
{
    unsigned char *c = p;
    for (size_t i = 0; i < bytes; i++)
        c[i] = (unsigned char)(i * 7);
    for (size_t i = 0; i < bytes; i += 97)
        assert_int_equal(c[i], (unsigned char)(i * 7));
}

static void assert_pinned(zo_hostpool_t pool, const void *p, int want)
{
    int pinned = -1;
    ZO_ASSERT_OK(zo_hostpool_query(pool, p, NULL, &pinned));
    assert_int_equal(pinned, want);
}

static void test_injected_pin_failure_falls_back(void **state)
{
    (void)state;
    zo_hostpool_t pool = make_pool(8 * MiB, -1);
    void *a, *b, *c, *pinned_one;
    int set;
    ZO_ASSERT_OK(zo_hostpool_alloc(pool, PG, &pinned_one));
    assert_pinned(pool, pinned_one, 1); /* one page fits under any memlock limit */
    start_capture();
    ZO_ASSERT_OK(zo_device_inject_fault(g_dev, ZO_FAULT_HOST_REGISTER, 3));
    ZO_ASSERT_OK(zo_hostpool_alloc(pool, 300 * KiB, &a));
    ZO_ASSERT_OK(zo_hostpool_alloc(pool, 5000, &b));
    ZO_ASSERT_OK(zo_hostpool_add_slots(pool, 128 * KiB, 3, &set));
    ZO_ASSERT_OK(zo_hostpool_slot_alloc(pool, set, &c));
    stop_capture();
    /* One warning, saying how much and why. */
    assert_int_equal(g_warnings, 1);
    assert_non_null(strstr(g_last_warning, "could not pin 300.00 KiB"));
    assert_non_null(strstr(g_last_warning, "injected fault"));
    assert_non_null(strstr(g_last_warning, "RLIMIT_MEMLOCK"));
    assert_pinned(pool, a, 0);
    assert_pinned(pool, c, 0);
    check_usable(a, 300 * KiB);
    check_usable(b, 5000);
    check_usable(c, 128 * KiB);
    zo_hostpool_stats s = stats_of(pool);
    assert_int_equal(s.n_pin_fallbacks, 3);
    assert_int_equal(s.unpinned_bytes, 300 * KiB + 8 * KiB + 3 * 128 * KiB);
    assert_int_equal(s.pinned_bytes, PG);
    assert_int_equal(s.reserved, s.pinned_bytes + s.unpinned_bytes);
    /* The fault is spent: the next allocation is pinned again. */
    void *d;
    ZO_ASSERT_OK(zo_hostpool_alloc(pool, PG, &d));
    assert_pinned(pool, d, 1);
    ZO_ASSERT_OK(zo_hostpool_release(pool, a));
    ZO_ASSERT_OK(zo_hostpool_release(pool, b));
    s = stats_of(pool);
    assert_int_equal(s.unpinned_bytes, 3 * 128 * KiB);
    assert_int_equal(s.pinned_bytes, 2 * PG);
    zo_hostpool_free(pool);
}

static void test_pin_failure_is_an_error_when_unpinned_is_forbidden(void **state)
{
    (void)state;
    zo_hostpool_config cfg = ZO_HOSTPOOL_CONFIG_INIT;
    cfg.max_pinned_bytes = MiB;
    cfg.allow_unpinned = 0;
    zo_hostpool_t pool;
    ZO_ASSERT_OK(zo_hostpool_init(&pool, g_dev, &cfg));
    void *p = NULL;
    int set;
    ZO_ASSERT_OK(zo_device_inject_fault(g_dev, ZO_FAULT_HOST_REGISTER, 2));
    ZO_ASSERT_ST(zo_hostpool_alloc(pool, 10 * PG, &p), ZO_ERR_PIN);
    assert_non_null(strstr(zo_last_error(), "allow_unpinned is 0"));
    ZO_ASSERT_ST(zo_hostpool_add_slots(pool, PG, 4, &set), ZO_ERR_PIN);
    zo_hostpool_stats s = stats_of(pool);
    assert_int_equal(s.reserved, 0);
    assert_int_equal(s.reserved_high_water, 10 * PG); /* the budget was taken, then given back */
    assert_int_equal(s.n_pin_fallbacks, 0);
    assert_int_equal(s.slots_total, 0);
    /* The pool still works, and a set can still be added (the failed one left no slot behind). */
    ZO_ASSERT_OK(zo_hostpool_add_slots(pool, PG, 4, &set));
    assert_int_equal(set, 0);
    zo_hostpool_free(pool);
}

/* Drop CAP_IPC_LOCK from the calling thread's effective set (mlock then
 * obeys RLIMIT_MEMLOCK even for root); returns whether it was there. */
static int set_ipc_lock_effective(int on)
{
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    if (syscall(SYS_capget, &h, d) != 0)
        return 0;
    int was = (d[0].effective >> CAP_IPC_LOCK) & 1;
    if (on && !((d[0].permitted >> CAP_IPC_LOCK) & 1))
        return was;
    if (on)
        d[0].effective |= 1u << CAP_IPC_LOCK;
    else
        d[0].effective &= ~(1u << CAP_IPC_LOCK);
    assert_int_equal(syscall(SYS_capset, &h, d), 0);
    return was;
}

static long locked_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmLck: %ld kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb;
}

/* Sanitizer runtimes replace mlock with a no-op: see whether it locks. */
static int mlock_really_locks(void)
{
    void *p = mmap(NULL, MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    long before = locked_kb();
    int locks = mlock(p, MiB) == 0 && locked_kb() >= before + 1024;
    munlock(p, MiB);
    munmap(p, MiB);
    return locks;
}

static void test_real_memlock_limit_falls_back(void **state)
{
    (void)state;
    if (!mlock_really_locks()) {
        print_message("skipped: mlock does not lock in this build (sanitizers intercept it), so "
                      "RLIMIT_MEMLOCK cannot be exercised\n");
        skip();
    }
    struct rlimit saved, low;
    assert_int_equal(getrlimit(RLIMIT_MEMLOCK, &saved), 0);
    int had_cap = set_ipc_lock_effective(0);
    low = saved;
    low.rlim_cur = 256 * KiB;
    assert_int_equal(setrlimit(RLIMIT_MEMLOCK, &low), 0);
    zo_hostpool_t pool = make_pool(8 * MiB, -1);
    start_capture();
    void *p, *q;
    ZO_ASSERT_OK(zo_hostpool_alloc(pool, 2 * MiB, &p));
    ZO_ASSERT_OK(zo_hostpool_alloc(pool, 64 * KiB, &q)); /* within the limit: pinned */
    stop_capture();
    assert_int_equal(setrlimit(RLIMIT_MEMLOCK, &saved), 0);
    if (had_cap)
        set_ipc_lock_effective(1);
    assert_pinned(pool, p, 0);
    assert_pinned(pool, q, 1);
    check_usable(p, 2 * MiB);
    assert_int_equal(g_warnings, 1);
    assert_non_null(strstr(g_last_warning, "could not pin 2.00 MiB"));
    assert_non_null(strstr(g_last_warning, "mlock"));
    assert_non_null(strstr(g_last_warning, "RLIMIT_MEMLOCK is 256.00 KiB"));
    print_message("warning: %s\n", g_last_warning);
    zo_hostpool_stats s = stats_of(pool);
    assert_int_equal(s.n_pin_fallbacks, 1);
    assert_int_equal(s.unpinned_bytes, 2 * MiB);
    zo_hostpool_free(pool);
}

/* Pool memory is what the device copies from and to. */
static void test_device_copies_through_pool_memory(void **state)
{
    (void)state;
    zo_hostpool_t pool = make_pool(4 * MiB, -1);
    const size_t n = MiB + 3 * KiB;
    unsigned char *src, *dst;
    ZO_ASSERT_OK(zo_hostpool_alloc(pool, n, (void **)&src));
    ZO_ASSERT_OK(zo_hostpool_alloc(pool, n, (void **)&dst));
    uint64_t rng = 42;
    for (size_t i = 0; i < n; i++)
        src[i] = (unsigned char)zo_test_rand(&rng);
    void *d;
    zo_stream_t s;
    ZO_ASSERT_OK(zo_device_malloc(g_dev, n, &d));
    ZO_ASSERT_OK(zo_stream_create(g_dev, &s));
    ZO_ASSERT_OK(zo_memcpy_h2d_async(s, d, src, n));
    ZO_ASSERT_OK(zo_memcpy_d2h_async(s, dst, d, n));
    ZO_ASSERT_OK(zo_stream_synchronize(s));
    assert_memory_equal(src, dst, n);
    ZO_ASSERT_OK(zo_stream_destroy(s));
    ZO_ASSERT_OK(zo_device_mfree(g_dev, d));
    zo_hostpool_free(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_rejects_bad_config),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_sizes_round_to_the_page_only),
        cmocka_unit_test(test_budget_is_exact),
        cmocka_unit_test(test_slots),
        cmocka_unit_test(test_too_many_slot_sets),
        cmocka_unit_test(test_foreign_and_double_free_change_nothing),
        cmocka_unit_test(test_random_sequences_account_exactly),
        cmocka_unit_test(test_placement_for_cpu_device),
        cmocka_unit_test(test_placement_for_a_gpu_by_pci_locality),
        cmocka_unit_test(test_pages_sit_on_the_requested_node),
        cmocka_unit_test(test_huge_pages_are_counted),
        cmocka_unit_test(test_injected_pin_failure_falls_back),
        cmocka_unit_test(test_pin_failure_is_an_error_when_unpinned_is_forbidden),
        cmocka_unit_test(test_real_memlock_limit_falls_back),
        cmocka_unit_test(test_device_copies_through_pool_memory),
    };
    return cmocka_run_group_tests(tests, setup_device, teardown_device);
}
