/* Helpers shared by the tests of zo-plan's multi-rank planners (ZeRO over
 * ranks, pipeline stages): a job on a preset, a cpu-device node, a world. */
#ifndef PLAN_WORLD_TEST_UTIL_H
#define PLAN_WORLD_TEST_UTIL_H

#include <string.h>

#include "world.h"
#include "zo_test.h"

#define GiB (1ull << 30)

/* A preset's job (layers 0: the preset's), seq 128 x micro-batch 2, bf16,
 * sync mode. */
static inline zp_job plan_test_job(const char *preset, int layers, int grad_accum)
{
    zp_job j;
    memset(&j, 0, sizeof j);
    ZO_ASSERT_OK(zt_preset(preset, &j.shape));
    if (layers)
        j.shape.n_layers = layers;
    j.seq = 128;
    j.micro_batch = 2;
    j.grad_accum = grad_accum;
    j.dtype = ZO_DTYPE_BF16;
    j.mode = ZO_OPTIM_SYNC;
    return j;
}

/* A node of the cpu device: a 4 GiB device, host_bytes of RAM, 100 GiB of
 * NVMe. */
static inline zp_hardware cpu_node(uint64_t host_bytes)
{
    zp_hardware hw = {"cpu", "the cpu device", 4 * GiB, 0, host_bytes, 0, 100 * GiB, 1};
    return hw;
}

/* n ranks, per_node of them on each node, a 10 GB/s link. */
static inline zp_world world(int n, int per_node)
{
    zp_world w = {.world_size = n, .gpus_per_node = per_node, .link = 10e9, .link_source = "test"};
    return w;
}

#endif
