/* Public host conversions between fp32 and the 16-bit formats. */
#include "zo/ops.h"
#include "zo_dtype_conv.h"

uint16_t zo_f32_to_bf16(float f) { return zo_conv_f32_to_bf16(f); }
float zo_bf16_to_f32(uint16_t h) { return zo_conv_bf16_to_f32(h); }
uint16_t zo_f32_to_f16(float f) { return zo_conv_f32_to_f16(f); }
float zo_f16_to_f32(uint16_t h) { return zo_conv_f16_to_f32(h); }
