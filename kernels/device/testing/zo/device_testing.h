/* zoffload: the device's hooks for tests and fault drills. They make chosen
 * device operations fail as they would on a real machine (a full GPU, a
 * refused pin, a failed asynchronous kernel) so that every error path can be
 * exercised. Not installed, and not in libzoffload: test programs get them
 * from the zo_kernels_testing target (kernels/CMakeLists.txt). */
#ifndef ZO_DEVICE_TESTING_H
#define ZO_DEVICE_TESTING_H

#include "zo/device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum zo_device_fault {
    ZO_FAULT_DEVICE_MALLOC = 0, /* zo_device_malloc fails with out of device memory */
    ZO_FAULT_HOST_REGISTER = 1, /* zo_device_host_register fails with ZO_ERR_PIN */
    ZO_FAULT_STREAM_TASK = 2,   /* the next enqueued task fails asynchronously */
    ZO_FAULT_COUNT_ = 3
} zo_device_fault;

/* Make the next `count` operations of that kind fail (0 disarms). */
zo_status zo_device_inject_fault(zo_device_t dev, zo_device_fault kind, int count);

#ifdef __cplusplus
}
#endif
#endif
