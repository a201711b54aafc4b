/* zoffload: the optimizer's scheduling mode, shared by the engine
 * (zo/engine.h) and the training configuration (zo/config.h), so that a
 * program may include both. */
#ifndef ZO_OPTIM_MODE_H
#define ZO_OPTIM_MODE_H

#include "zo/api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum zo_optim_mode {
    ZO_OPTIM_SYNC = 0,    /* update after the whole backward: the exact reference */
    ZO_OPTIM_OVERLAP = 1, /* update chunks during backward, validated at the end */
    ZO_OPTIM_DPU = 2,     /* delayed parameter update (one step stale) */
} zo_optim_mode;

/* "sync", "overlap", "dpu" (as written in JSON); "?" for an invalid value. */
ZO_API const char *zo_optim_mode_name(zo_optim_mode m);

#ifdef __cplusplus
}
#endif
#endif
