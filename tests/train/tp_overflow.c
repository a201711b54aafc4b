/* zo-train's test hooks for --tensor-parallel (tensor_parallel.h): linked
 * only into zo-train-test, so the shipped program never reads ZT_TEST_TP_INF
 * ZT_TEST_STAGE_BYTES, ZT_TEST_READ_FAIL or ZT_TEST_TP_DEVICE_COMM. ZT_TEST_TP_INF=R:N plants an
 * Inf in world rank R's part of layer 1's q_proj gradient at its N-th backward fetch of layer 1. */
#include <stdio.h>
#include <stdlib.h>

#include "tensor_parallel.h"
#include "trainer.h"

int zt_tp_test_overflow(int rank, int n)
{
    const char *spec = getenv("ZT_TEST_TP_INF");
    int r, at;
    return spec && sscanf(spec, "%d:%d", &r, &at) == 2 && r == rank && at == n;
}

size_t zt_test_stage_bytes(void)
{
    const char *n = getenv("ZT_TEST_STAGE_BYTES");
    return n ? (size_t)strtoull(n, NULL, 10) : 0;
}

int zt_test_read_fails(int rank)
{
    const char *r = getenv("ZT_TEST_READ_FAIL");
    return r && *r && atoi(r) == rank;
}

int zt_test_tp_device_comm(void)
{
    const char *v = getenv("ZT_TEST_TP_DEVICE_COMM");
    return v && atoi(v) == 1;
}
