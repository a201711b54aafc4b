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
    o.shape = (zt_shape){256, 32, 2, 4, 64, 1e-5f, 10000.0f, 0, 0, 0, 0, {0}};
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

#endif
