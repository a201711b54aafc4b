/* Concurrent allocate/release on one host pool (run under TSan in CI): no
 * block is handed to two threads, the budget holds at every instant a
 * watcher looks, and the accounting returns to exactly zero. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "zo/device.h"
#include "zo/device_testing.h"
#include "zo/hostpool.h"
#include "zo/topo.h"
#include "zo_test.h"

#define KiB       ((size_t)1024)
#define MiB       (KiB * 1024)
#define PG        ((size_t)ZO_HOSTPOOL_PAGE)
#define N_THREADS 4
#define STEPS     400
#define BUDGET    (4 * MiB)
#define HELD_MAX  8  /* blocks a thread holds in the random phase */
#define FILL_MAX  24 /* 24 x 256 KiB > BUDGET: the fill phase must hit the budget */

typedef struct worker {
    zo_hostpool_t pool;
    int set;
    int id;
    uint64_t granted, refused;
} worker;

typedef struct held {
    unsigned char *p;
    size_t bytes;
} held;

static atomic_int g_stop;

static void fill(held *h, int id)
{
    memset(h->p, id + 1, h->bytes);
}

/* Nobody else wrote into this thread's block while it held it. */
static void check_and_release(zo_hostpool_t pool, held *h, int id)
{
    for (size_t i = 0; i < h->bytes; i += 509)
        assert_int_equal(h->p[i], id + 1);
    assert_int_equal(h->p[h->bytes - 1], id + 1);
    ZO_ASSERT_OK(zo_hostpool_release(pool, h->p));
}

static void take_one(worker *w, held *h, uint64_t *rng)
{
    void *p = NULL;
    zo_status st;
    if (zo_test_rand(rng) % 3 == 0) {
        st = zo_hostpool_slot_alloc(w->pool, w->set, &p);
        h->bytes = 64 * KiB;
    } else {
        size_t bytes = 1 + zo_test_rand(rng) % (256 * KiB);
        st = zo_hostpool_alloc(w->pool, bytes, &p);
        h->bytes = (bytes + PG - 1) / PG * PG;
    }
    assert_true(st == ZO_OK || st == ZO_ERR_BUDGET);
    if (st != ZO_OK) {
        w->refused++;
        h->p = NULL;
        return;
    }
    w->granted++;
    h->p = p;
    fill(h, w->id);
}

/* Take 256 KiB blocks until the budget says no, whatever the others hold. */
static void fill_until_refused(worker *w, held *h, int *n)
{
    while (*n < FILL_MAX) {
        void *p = NULL;
        zo_status st = zo_hostpool_alloc(w->pool, 256 * KiB, &p);
        assert_true(st == ZO_OK || st == ZO_ERR_BUDGET);
        if (st != ZO_OK) {
            w->refused++;
            return;
        }
        w->granted++;
        h[*n] = (held){p, 256 * KiB};
        fill(&h[(*n)++], w->id);
    }
    fail_msg("thread %d held %d x 256 KiB without reaching the budget", w->id, FILL_MAX);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    uint64_t rng = 1000 + (uint64_t)w->id;
    held h[FILL_MAX] = {{0}};
    int n = 0;
    for (int step = 0; step < STEPS; step++) {
        if (n == HELD_MAX || (n > 0 && zo_test_rand(&rng) % 2)) {
            int k = (int)(zo_test_rand(&rng) % (uint64_t)n);
            check_and_release(w->pool, &h[k], w->id);
            h[k] = h[--n];
        } else {
            take_one(w, &h[n], &rng);
            if (h[n].p)
                n++;
        }
    }
    fill_until_refused(w, h, &n);
    while (n)
        check_and_release(w->pool, &h[--n], w->id);
    return NULL;
}

/* Samples the statistics while the workers run. */
static void *watcher_main(void *arg)
{
    zo_hostpool_t pool = arg;
    int samples = 0;
    while (!atomic_load(&g_stop) || samples == 0) {
        zo_hostpool_stats s = ZO_HOSTPOOL_STATS_INIT;
        ZO_ASSERT_OK(zo_hostpool_get_stats(pool, &s));
        assert_true(s.reserved <= BUDGET);
        assert_true(s.reserved_high_water <= BUDGET);
        assert_true(s.pinned_bytes + s.unpinned_bytes <= s.reserved);
        assert_true(s.slots_free <= s.slots_total);
        samples++;
    }
    return NULL;
}

static void test_concurrent_alloc_release(void **state)
{
    (void)state;
    zo_device_t dev;
    zo_device_config dcfg = ZO_DEVICE_CONFIG_INIT;
    dcfg.backend = "cpu";
    dcfg.mem_budget = 16 * MiB;
    ZO_ASSERT_OK(zo_device_init(&dev, &dcfg));
    zo_hostpool_config cfg = ZO_HOSTPOOL_CONFIG_INIT;
    cfg.max_pinned_bytes = BUDGET;
    zo_hostpool_t pool;
    ZO_ASSERT_OK(zo_hostpool_init(&pool, dev, &cfg));
    int set;
    ZO_ASSERT_OK(zo_hostpool_add_slots(pool, 64 * KiB, 8, &set));
    /* Some allocations fall back to unpinned memory while others pin. */
    ZO_ASSERT_OK(zo_device_inject_fault(dev, ZO_FAULT_HOST_REGISTER, 20));
    atomic_store(&g_stop, 0);
    pthread_t th[N_THREADS], watch;
    worker w[N_THREADS];
    assert_int_equal(pthread_create(&watch, NULL, watcher_main, pool), 0);
    for (int i = 0; i < N_THREADS; i++) {
        w[i] = (worker){pool, set, i, 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    uint64_t granted = 0, refused = 0;
    for (int i = 0; i < N_THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        granted += w[i].granted;
        refused += w[i].refused;
    }
    atomic_store(&g_stop, 1);
    assert_int_equal(pthread_join(watch, NULL), 0);
    zo_hostpool_stats s = ZO_HOSTPOOL_STATS_INIT;
    ZO_ASSERT_OK(zo_hostpool_get_stats(pool, &s));
    print_message(
        "granted %llu, refused %llu, reserved high-water %llu of %u, pin fallbacks %llu\n",
        (unsigned long long)granted, (unsigned long long)refused,
        (unsigned long long)s.reserved_high_water, (unsigned)BUDGET,
        (unsigned long long)s.n_pin_fallbacks);
    assert_int_equal(s.in_use, 0);
    assert_int_equal(s.reserved, 8 * 64 * KiB); /* only the slot set is left */
    assert_int_equal(s.n_allocs, 0);
    assert_int_equal(s.slots_free, 8);
    assert_int_equal(s.n_budget_refusals, refused);
    assert_int_equal(s.n_pin_fallbacks, 20);
    assert_int_equal(s.unpinned_bytes, 0); /* every fallen-back allocation was released */
    assert_true(refused >= N_THREADS);     /* each fill phase ended at the budget */
    zo_hostpool_free(pool);
    zo_device_free(dev);
}

/* The topology is read once, on first use, whichever thread gets there. */
static void *topo_main(void *arg)
{
    int *node = arg;
    ZO_ASSERT_OK(zo_topo_node_of_thread(node, NULL));
    int n;
    ZO_ASSERT_OK(zo_topo_node_cpu_list(*node, NULL, 0, &n));
    assert_true(n > 0);
    return NULL;
}

static void test_concurrent_first_topology_use(void **state)
{
    (void)state;
    pthread_t th[N_THREADS];
    int nodes[N_THREADS];
    for (int i = 0; i < N_THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, topo_main, &nodes[i]), 0);
    for (int i = 0; i < N_THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_true(zo_topo_node_valid(nodes[i]));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_first_topology_use),
        cmocka_unit_test(test_concurrent_alloc_release),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
