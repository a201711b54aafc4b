/* Scalar fp32 <-> bf16/fp16 conversions for the cpu ops: thin names over
 * zo/half.h, the project's one definition (round to nearest even; NaN stays
 * NaN with its sign, quieted; overflow goes to infinity; subnormals kept). */
#ifndef ZO_DTYPE_CONV_H
#define ZO_DTYPE_CONV_H

#include "zo/half.h"

static inline uint16_t zo_conv_f32_to_bf16(float f)
{
    return zo_f32_to_bf16(f);
}
static inline float zo_conv_bf16_to_f32(uint16_t h)
{
    return zo_bf16_to_f32(h);
}
static inline uint16_t zo_conv_f32_to_f16(float f)
{
    return zo_f32_to_f16(f);
}
static inline float zo_conv_f16_to_f32(uint16_t h)
{
    return zo_f16_to_f32(h);
}

#endif
