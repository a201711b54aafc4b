/* The nccl backend on one GPU (world size 1; two ranks need two GPUs):
 * init without a launcher (the unique id through the rendezvous), every
 * collective on device buffers against the one-rank reference, a split, the
 * configuration check through the device, and the exact chain (a copy on one
 * rank; fp64 refused by name).
 * Exits 77 (skipped) without a CUDA GPU or without NCCL in the build. */
#include <stdlib.h>
#include <string.h>

#include "zo/comm.h"
#include "zo_test.h"

static zo_device_t dev;
static zo_comm_t world;
static zo_stream_t s;

static void collectives_on_device_buffers(void **state)
{
    enum { N = 4096 };
    float host[N], back[N];
    for (int i = 0; i < N; i++)
        host[i] = (float)i * 0.25f;
    void *a, *b;
    ZO_ASSERT_OK(zo_device_malloc(dev, sizeof host, &a));
    ZO_ASSERT_OK(zo_device_malloc(dev, sizeof host, &b));
    ZO_ASSERT_OK(zo_memcpy_h2d_async(s, a, host, sizeof host));
    ZO_ASSERT_OK(zo_comm_all_reduce(world, s, a, b, N, ZO_DTYPE_F32, ZO_REDUCE_FAST));
    ZO_ASSERT_OK(zo_comm_reduce_scatter(world, s, b, a, N, ZO_DTYPE_F32, ZO_REDUCE_FAST));
    ZO_ASSERT_OK(zo_comm_all_gather(world, s, a, b, N, ZO_DTYPE_F32));
    ZO_ASSERT_OK(zo_comm_broadcast(world, s, b, N, ZO_DTYPE_F32, 0));
    ZO_ASSERT_OK(zo_comm_barrier(world, s));
    ZO_ASSERT_OK(zo_memcpy_d2h_async(s, back, b, sizeof back));
    ZO_ASSERT_OK(zo_stream_synchronize(s));
    assert_memory_equal(host, back, sizeof host);
    ZO_ASSERT_OK(zo_comm_reduce_scatter(world, s, a, b, N, ZO_DTYPE_F32, ZO_REDUCE_EXACT));
    ZO_ASSERT_OK(zo_comm_all_reduce(world, s, b, b, N, ZO_DTYPE_F32, ZO_REDUCE_EXACT));
    ZO_ASSERT_OK(zo_memcpy_d2h_async(s, back, b, sizeof back));
    ZO_ASSERT_OK(zo_stream_synchronize(s));
    assert_memory_equal(host, back, sizeof host);
    ZO_ASSERT_ST(zo_comm_all_reduce(world, s, a, b, N / 2, ZO_DTYPE_F64, ZO_REDUCE_EXACT),
                 ZO_ERR_UNSUPPORTED);
    ZO_ASSERT_ST(zo_comm_all_reduce(world, s, host, b, N, ZO_DTYPE_F32, ZO_REDUCE_FAST),
                 ZO_ERR_INVALID_ARG);
    ZO_ASSERT_OK(zo_device_mfree(dev, a));
    ZO_ASSERT_OK(zo_device_mfree(dev, b));
}

static void split_and_config_check(void **state)
{
    zo_comm_t g;
    ZO_ASSERT_OK(zo_comm_split(world, 0, 0, &g));
    assert_int_equal(zo_comm_size(g), 1);
    assert_int_equal(zo_comm_world_rank(g, 0), 0);
    const char *keys[] = {"zero_stage"}, *values[] = {"3"};
    ZO_ASSERT_OK(zo_comm_check_config(g, keys, values, 1));
    zo_comm_free(g);
}

int main(void)
{
    if (!zo_comm_backend_built("nccl") || zo_device_cuda_count() < 1) {
        printf("test_comm_nccl: skipped: needs NCCL in the build and a CUDA GPU (two ranks need "
               "two GPUs; none here)\n");
        return ZO_TEST_SKIP;
    }
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cuda";
    zo_comm_config cc = ZO_COMM_CONFIG_INIT;
    cc.backend = "nccl";
    cc.timeout_s = 60;
    if (zo_device_init(&dev, &dc) || (cc.device = dev, zo_comm_init(&world, &cc)) ||
        zo_stream_create(dev, &s)) {
        fprintf(stderr, "test_comm_nccl: setup failed: %s\n", zo_last_error());
        return 1;
    }
    if (zo_comm_takes_host_memory(world) != 0) { /* host data is staged through the GPU */
        fprintf(stderr, "test_comm_nccl: nccl says it takes host memory\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(collectives_on_device_buffers),
        cmocka_unit_test(split_and_config_check),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    zo_stream_destroy(s);
    zo_comm_free(world);
    zo_device_free(dev);
    return failed ? 1 : 0;
}
