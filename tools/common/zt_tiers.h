/* The memory tiers as the tools name them (DeepSpeed's offload targets:
 * none, cpu, nvme), and the device memory a tool's budget leaves to CUDA:
 * zo-train sizes its budget with these and zo-plan plans with the same. */
#ifndef ZT_TIERS_H
#define ZT_TIERS_H

#include "zo/engine.h"
#include "zo/status.h"

/* On a GPU, device memory the budget does not see: the CUDA context's own
 * use and cuBLAS's workspace (taken off the budget before the engine's share). */
#define ZT_CUDA_RESERVE (512ull << 20)

/* Parse "none|cpu|nvme" into a zo_tier; "none" is the device. */
zo_status zt_parse_home(const char *s, int *out);
const char *zt_home_name(zo_tier t);

/* Optimizer state formats as the tools name them: the names of the
 * formats' table (zo_state_format, zo/optim.h: "fp32", "bf16", "int8"). */
zo_status zt_parse_state_dtype(const char *s, zo_dtype *out);
const char *zt_state_dtype_name(zo_dtype t);

#endif
