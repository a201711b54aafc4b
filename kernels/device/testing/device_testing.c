/* The device's test hooks (zo/device_testing.h): a fault drill of counters,
 * one per kind, attached to the device the first time a test arms one. */
#include <stdlib.h>

#include "device_impl.h"
#include "zo/device_testing.h"

#define SUBSYS "device"

_Static_assert((int)ZO_FAULT_DEVICE_MALLOC == (int)ZO_DRILL_DEVICE_MALLOC &&
                   (int)ZO_FAULT_HOST_REGISTER == (int)ZO_DRILL_HOST_REGISTER &&
                   (int)ZO_FAULT_STREAM_TASK == (int)ZO_DRILL_STREAM_TASK &&
                   (int)ZO_FAULT_COUNT_ == (int)ZO_DRILL_COUNT,
               "the testing header's fault kinds are the front end's drill kinds");

typedef struct counters {
    int left[ZO_DRILL_COUNT];
} counters;

/* Called by the front end under mem_mu. */
static int counters_fail(void *ctx, int kind)
{
    counters *c = ctx;
    if (c->left[kind] <= 0)
        return 0;
    c->left[kind]--;
    return 1;
}

zo_status zo_device_inject_fault(zo_device_t dev, zo_device_fault kind, int count)
{
    if (!dev || (int)kind < 0 || kind >= ZO_FAULT_COUNT_ || count < 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "bad fault injection request (kind %d, count %d)", (int)kind, count);
    pthread_mutex_lock(&dev->mem_mu);
    if (!dev->drill.ctx) {
        counters *c = calloc(1, sizeof *c);
        if (!c) {
            pthread_mutex_unlock(&dev->mem_mu);
            return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "allocating the fault drill's counters");
        }
        dev->drill = (zo_device_drill){counters_fail, free, c};
    }
    ((counters *)dev->drill.ctx)->left[kind] = count;
    pthread_mutex_unlock(&dev->mem_mu);
    return ZO_OK;
}
