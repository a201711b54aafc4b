/* Host pool internals shared with tests. Not installed. */
#ifndef ZO_HOSTPOOL_INTERNAL_H
#define ZO_HOSTPOOL_INTERNAL_H

#include "zo/device.h"
#include "zo/hostpool.h"

/* zo_hostpool_placement_for_device from a device description, so the GPU
 * branch (PCI locality) can be exercised on machines without a GPU. */
zo_status zo_hostpool_placement_for_info_(const zo_device_info *info, zo_hostpool_placement *out);

#endif
