/* zo-train's test hook for the pipeline's staged path (pipeline.h):
 * linked only into zo-train-test, the tests' own build of zo-train, so the
 * shipped program never reads ZT_TEST_PIPE_STAGED. */
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"

int zt_pipe_test_staged(void)
{
    const char *force = getenv("ZT_TEST_PIPE_STAGED");
    return force && strcmp(force, "1") == 0;
}
