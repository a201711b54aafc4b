/* The cpu device's fused attention (flash_cpu.c), for its ops table (not
 * installed). */
#ifndef ZO_CPU_FLASH_H
#define ZO_CPU_FLASH_H

#include "ops_impl.h"

zo_status zo_cpu_flash_fwd(const zo_ops_exec *x, const zo_flash_args *a);
zo_status zo_cpu_flash_bwd(const zo_ops_exec *x, const zo_flash_args *a);

#endif
