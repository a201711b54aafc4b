/* Shared by the zo-train tests: a small model on the shipped corpus that
 * trains in milliseconds on the cpu device. */
#ifndef ZT_TRAIN_TEST_UTIL_H
#define ZT_TRAIN_TEST_UTIL_H

#include "trainer.h"

#ifndef ZT_TEST_DATA
#error "ZT_TEST_DATA (the shipped corpus) must be defined"
#endif

/* dim 32, 2 layers, 4 heads, ffn 64, byte vocabulary; seq 16, micro-batch 2;
 * lr 1e-2, seed 3; the cpu device with 64 MiB; NVMe homes in swap_dir. */
static inline zt_options zt_test_small_options(const char *swap_dir, int steps)
{
    zt_options o = ZT_OPTIONS_INIT;
    o.shape = (zt_shape){256, 32, 2, 4, 64, 1e-5f, 10000.0f, 0, 0, 0, 0, {0}, 0, 0, 0};
    o.data_path = ZT_TEST_DATA;
    o.steps = steps;
    o.seq = 16;
    o.micro_batch = 2;
    o.lr = 1e-2f;
    o.seed = 3;
    o.device = "cpu";
    o.device_mem = 64u << 20;
    o.default_nvme_dir = swap_dir;
    o.val_batches = 2;
    o.optim_threads = 2;
    return o;
}

/* The smallest device budget zt_trainer_init accepts for o (the activations,
 * one layer of parameter and gradient chunks, what the placement adds),
 * found by the engine's plan refusing one byte less. */
static inline uint64_t zt_test_smallest_budget(zt_options o)
{
    uint64_t lo = 1, hi = 64u << 20;
    while (lo < hi) { /* binary search on "init succeeds" */
        uint64_t mid = lo + (hi - lo) / 2;
        o.device_mem = mid;
        zt_trainer *t = NULL;
        if (zt_trainer_init(&t, &o) == ZO_OK) {
            zt_trainer_free(t);
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    return lo;
}

#endif
