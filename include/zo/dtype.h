/* zoffload: element types, one enum for the whole library: the ops' tensors
 * (fp32, bf16, fp16), the optimizer's buffers (those three, or none) and
 * safetensors files (every type the format names). Each function says which
 * types it accepts and fails with ZO_ERR_INVALID_ARG on another. */
#ifndef ZO_DTYPE_H
#define ZO_DTYPE_H

#include <stddef.h>

#include "zo/api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The first three keep the numbers the ops have always used. */
typedef enum zo_dtype {
    ZO_DTYPE_F32 = 0,
    ZO_DTYPE_BF16 = 1,
    ZO_DTYPE_F16 = 2,  /* IEEE binary16 */
    ZO_DTYPE_NONE = 3, /* no buffer (the optimizer's optional 16-bit weight copy) */
    ZO_DTYPE_F64,
    ZO_DTYPE_F8_E5M2,
    ZO_DTYPE_F8_E4M3,
    ZO_DTYPE_BOOL,
    ZO_DTYPE_U8,
    ZO_DTYPE_I8,
    ZO_DTYPE_I16,
    ZO_DTYPE_U16,
    ZO_DTYPE_I32,
    ZO_DTYPE_U32,
    ZO_DTYPE_I64,
    ZO_DTYPE_U64,
    ZO_DTYPE_COUNT_
} zo_dtype;

/* Bytes per element: 0 for ZO_DTYPE_NONE or an invalid value. */
ZO_API size_t zo_dtype_size(zo_dtype dt);
/* "fp32", "bf16", "fp16", "none", "fp64", "u8"...; "?" for an invalid value. */
ZO_API const char *zo_dtype_name(zo_dtype dt);

#ifdef __cplusplus
}
#endif
#endif
