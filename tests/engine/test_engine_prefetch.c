/* Trace-driven scheduling: after the first step records the access order,
 * the engine evicts the chunk used farthest ahead (Belady's rule: as few
 * misses as the optimal cache, fewer than LRU), prefetches ahead of the
 * compute, follows a changed order, and measures the compute stream's
 * stall on a slow link. */
#include <limits.h>
#include <stdio.h>

#include "engine_harness.h"

/* Misses of an optimal (farthest next use) cache of n slots over one step's
 * fetches, starting empty; each fetch needs its layer's two chunks. */
static int belady_misses(const int *layers, int n_fetch, int nslots)
{
    int slot[64], misses = 0;
    for (int i = 0; i < nslots; i++)
        slot[i] = -1;
    for (int pos = 0; pos < n_fetch; pos++) {
        for (int c = 2 * layers[pos]; c < 2 * layers[pos] + 2; c++) {
            int hit = 0, free_slot = -1;
            for (int i = 0; i < nslots; i++) {
                if (slot[i] == c)
                    hit = 1;
                if (slot[i] < 0 && free_slot < 0)
                    free_slot = i;
            }
            if (hit)
                continue;
            misses++;
            if (free_slot < 0) {
                int far = -1;
                for (int i = nslots - 1; i >= 0; i--) {
                    if (slot[i] / 2 == layers[pos])
                        continue;
                    int nu = INT_MAX - 1;
                    for (int j = pos + 1; j < n_fetch; j++)
                        if (layers[j] == slot[i] / 2) {
                            nu = j;
                            break;
                        }
                    if (nu > far) {
                        far = nu;
                        free_slot = i;
                    }
                }
            }
            slot[free_slot] = c;
        }
    }
    return misses;
}

static int lru_misses(const int *layers, int n_fetch, int nslots)
{
    int slot[64], last[64], misses = 0;
    for (int i = 0; i < nslots; i++)
        slot[i] = -1, last[i] = -1;
    for (int pos = 0; pos < n_fetch; pos++)
        for (int c = 2 * layers[pos]; c < 2 * layers[pos] + 2; c++) {
            int at = -1;
            for (int i = 0; i < nslots; i++)
                if (slot[i] == c)
                    at = i;
            if (at < 0) {
                misses++;
                for (int i = 0; i < nslots; i++)
                    if (at < 0 || last[i] < last[at])
                        at = i;
                slot[at] = c;
            }
            last[at] = pos;
        }
    return misses;
}

static void test_prefetch_and_belady_eviction(void **state)
{
    (void)state;
    const int nslots = 5;
    run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_SYNC);
    c.device_bytes = (uint64_t)(nslots + 2) * CHUNK; /* 5 parameter slots + one layer's gradients */
    c.steps = 8;
    c.lookahead = 0;
    run_out demand;
    run(&c, &demand);
    assert_int_equal(demand.fp.device_param_slots, nslots);
    int layers[2 * TM_L];
    for (int l = 0; l < TM_L; l++)
        layers[l] = l, layers[2 * TM_L - 1 - l] = l;
    int best = belady_misses(layers, 2 * TM_L, nslots);
    int lru = lru_misses(layers, 2 * TM_L, nslots);
    assert_true(best < lru);               /* the case is one where the rule matters */
    const uint64_t fetched = 2 * TM_L * 2; /* chunks fetched per step */
    for (int s = 1; s < c.steps; s++) { /* step 0 records the trace, evicting least recently used */
        assert_int_equal(demand.stats[s].fetch_misses, best);
        assert_int_equal(demand.stats[s].fetch_hits, fetched - (uint64_t)best);
        assert_int_equal(demand.stats[s].prefetches, 0);
    }
    assert_int_equal(demand.stats[0].fetch_misses, lru);

    c.lookahead = 2;
    run_out ahead;
    run(&c, &ahead);
    assert_same_weights(&demand, &ahead, c.steps);
    assert_int_equal(ahead.stats[0].prefetches, 0);
    for (int s = 1; s < c.steps; s++) {
        assert_true(ahead.stats[s].prefetches > 0);
        assert_true(ahead.stats[s].fetch_misses < demand.stats[s].fetch_misses);
        assert_int_equal(ahead.stats[s].fetch_hits + ahead.stats[s].fetch_misses, fetched);
        /* every chunk brought in was either fetched on demand or prefetched */
        assert_true(ahead.stats[s].h2d_bytes > 0);
    }

    /* a trainer that changes its order (recomputation from step 4): prefetch
     * stops for that step, the new order is recorded and followed after */
    c.recompute_from = 4;
    run_out dev;
    run(&c, &dev);
    assert_same_weights(&demand, &dev, c.steps);
    if (getenv("TM_DEBUG"))
        for (int s = 0; s < c.steps; s++)
            fprintf(stderr, "step %d: prefetches %d/%d, misses %d/%d\n", s,
                    (int)ahead.stats[s].prefetches, (int)dev.stats[s].prefetches,
                    (int)ahead.stats[s].fetch_misses, (int)dev.stats[s].fetch_misses);
    assert_true(dev.stats[4].prefetches < ahead.stats[4].prefetches);
    assert_true(dev.stats[5].prefetches > 0);
    assert_int_equal(dev.stats[5].fetch_hits + dev.stats[5].fetch_misses, fetched + 2 * TM_L);
    run_out_free(&demand);
    run_out_free(&ahead);
    run_out_free(&dev);
}

/* On a slow emulated link with no prefetch, the compute stream waits for
 * every chunk: the stall time says so. */
static void test_stall_is_measured(void **state)
{
    (void)state;
    setenv("ZO_CPU_DEVICE_PCIE_GBPS", "0.02", 1); /* 8 KiB take ~0.4 ms */
    run_cfg c = base_cfg(ZO_TIER_HOST, ZO_TIER_HOST, ZO_OPTIM_SYNC);
    c.device_bytes = min_device_bytes();
    c.lookahead = 0;
    c.steps = 3;
    run_out o;
    run(&c, &o);
    unsetenv("ZO_CPU_DEVICE_PCIE_GBPS");
    for (int s = 0; s < c.steps; s++) {
        assert_true(o.stats[s].stall_seconds > 0);
        assert_true(o.stats[s].stall_seconds <= o.stats[s].step_seconds);
        assert_true(o.stats[s].h2d_seconds >= 16 * 4e-4 * 0.5);
    }
    run_out_free(&o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefetch_and_belady_eviction),
        cmocka_unit_test(test_stall_is_measured),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
