/* zoffload: the element types' sizes and names (zo/dtype.h). */
#include "zo/dtype.h"

static const struct {
    const char *name;
    unsigned char size;
} dtypes[ZO_DTYPE_COUNT_] = {
    [ZO_DTYPE_F32] = {"fp32", 4},
    [ZO_DTYPE_BF16] = {"bf16", 2},
    [ZO_DTYPE_F16] = {"fp16", 2},
    [ZO_DTYPE_NONE] = {"none", 0},
    [ZO_DTYPE_F64] = {"fp64", 8},
    [ZO_DTYPE_F8_E5M2] = {"fp8_e5m2", 1},
    [ZO_DTYPE_F8_E4M3] = {"fp8_e4m3", 1},
    [ZO_DTYPE_BOOL] = {"bool", 1},
    [ZO_DTYPE_U8] = {"u8", 1},
    [ZO_DTYPE_I8] = {"i8", 1},
    [ZO_DTYPE_I16] = {"i16", 2},
    [ZO_DTYPE_U16] = {"u16", 2},
    [ZO_DTYPE_I32] = {"i32", 4},
    [ZO_DTYPE_U32] = {"u32", 4},
    [ZO_DTYPE_I64] = {"i64", 8},
    [ZO_DTYPE_U64] = {"u64", 8},
};

size_t zo_dtype_size(zo_dtype dt)
{
    return (unsigned)dt < ZO_DTYPE_COUNT_ ? dtypes[dt].size : 0;
}

const char *zo_dtype_name(zo_dtype dt)
{
    return (unsigned)dt < ZO_DTYPE_COUNT_ ? dtypes[dt].name : "?";
}
