/* zo-plan --emit-config: the recommended plan as a DeepSpeed-style config
 * that zo-train reads (zo/config.h), from plain numbers so that it depends
 * on the configuration's types only. */
#ifndef ZP_EMIT_H
#define ZP_EMIT_H

#include <stddef.h>
#include <stdint.h>

#include "zo/config.h"
#include "zo/status.h"

enum { ZP_EMIT_MAX_PATHS = 16 };

typedef struct zp_emit {
    int micro_batch, grad_accum;
    int fp16;                   /* else bf16 */
    int param_home, optim_home; /* 0 device (none), 1 host (cpu), 2 nvme: zo_tier's numbers */
    int mode;                   /* 0 sync, 1 overlap, 2 dpu: zo_optim_mode's numbers */
    uint64_t device_mem;        /* the device budget planned for */
    uint64_t pinned_bytes;      /* the pinned pool the plan needs */
    uint64_t chunk_bytes;
    const char *nvme_paths[ZP_EMIT_MAX_PATHS];
    int n_nvme_paths;
    /* the per-chunk plan (zeros for a fixed placement) */
    uint64_t optim_caps[2], param_caps[2]; /* device, host: zoffload.placement */
    int micro_group;                       /* zoffload.micro_group (1: micro-batch-major) */
    int act_home;         /* zp_act_home (1 device, 2 host, 3 nvme): zoffload.act_home */
    uint64_t host_budget; /* zo-train's --host-mem (zp_trainer_host_mem) */
    int state_dtype;      /* zo_dtype's number: F32, BF16 or I8 (zoffload.optimizer_state_dtype) */
    int master_split;     /* zoffload.master_split */
    int embedding_f32;    /* zoffload.embedding_f32_states */
    uint64_t mlp_chunk_bytes;                 /* zoffload.mlp_chunk_bytes (0: auto) */
    int update_behind;                        /* zoffload.update_behind */
    const zo_sparse_attention_config *sparse; /* the sparse_attention section (NULL: none) */
} zp_emit;

/* Write the config to path and read it back with zo_train_config_load
 * (what zo-train does), so a file that zo-train would refuse is never left
 * behind silently. */
zo_status zp_emit_config(const zp_emit *e, const char *path);

#endif
