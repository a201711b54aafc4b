/* zo-train's test hook for fp16 at --tensor-parallel (tensor_parallel.h):
 * linked only into zo-train-test, so the shipped program never reads
 * ZT_TEST_TP_INF. ZT_TEST_TP_INF=R:N plants an Inf in world rank R's part
 * of layer 1's q_proj gradient at its N-th backward fetch of layer 1. */
#include <stdio.h>
#include <stdlib.h>

#include "tensor_parallel.h"

int zt_tp_test_overflow(int rank, int n)
{
    const char *spec = getenv("ZT_TEST_TP_INF");
    int r, at;
    return spec && sscanf(spec, "%d:%d", &r, &at) == 2 && r == rank && at == n;
}
