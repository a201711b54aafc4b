/* Adam's moment formats as one table (zo/optim.h, zo_state_format): each
 * format's spelling, code type, block scales, small-tensor rule, the bytes
 * of a moment and its scalar codec (for checkpoints and conversions; the
 * fused update per ISA is the kernels', adam_simd.h). The engine, the
 * planner, the tools and checkpoints ask this table rather than branching
 * on a format's dtype. */
#include <stdio.h>
#include <string.h>

#include "optim_internal.h"
#include "zo/half.h"
#include "zo/optim.h"
#include "zo_internal.h"

static size_t f32_bytes(size_t n)
{
    return 4 * n;
}

static zo_status f32_encode(const float *x, size_t n, int is_signed, void *codes, float *scales)
{
    (void)is_signed, (void)scales;
    memcpy(codes, x, n * sizeof(float));
    return ZO_OK;
}

static zo_status f32_decode(const void *codes, const float *scales, size_t n, int is_signed,
                            float *x)
{
    (void)is_signed, (void)scales;
    memcpy(x, codes, n * sizeof(float));
    return ZO_OK;
}

static size_t bf16_bytes(size_t n)
{
    return 2 * n;
}

static zo_status bf16_encode(const float *x, size_t n, int is_signed, void *codes, float *scales)
{
    (void)is_signed, (void)scales;
    for (size_t i = 0; i < n; i++)
        ((uint16_t *)codes)[i] = zo_f32_to_bf16(x[i]);
    return ZO_OK;
}

static zo_status bf16_decode(const void *codes, const float *scales, size_t n, int is_signed,
                             float *x)
{
    (void)is_signed, (void)scales;
    for (size_t i = 0; i < n; i++)
        x[i] = zo_bf16_to_f32(((const uint16_t *)codes)[i]);
    return ZO_OK;
}

/* The n codes padded to 4 bytes, then one fp32 scale per block. */
static size_t q8_bytes(size_t n)
{
    return ((n + 3) & ~(size_t)3) + 4 * zo_adam_q8_blocks(n);
}

static zo_status q8_encode(const float *x, size_t n, int is_signed, void *codes, float *scales)
{
    return zo_adam_q8_quantize(x, n, is_signed, codes, scales);
}

static zo_status q8_decode(const void *codes, const float *scales, size_t n, int is_signed,
                           float *x)
{
    return zo_adam_q8_dequantize(codes, scales, n, is_signed, x);
}

static const zo_state_format formats[] = {
    {.name = "fp32",
     .fused = 1,
     .dtype = ZO_DTYPE_F32,
     .code_dtype = ZO_DTYPE_F32,
     .code_bits = 32,
     .summary = "fp32 moments, 8 bytes a parameter",
     .moment_bytes = f32_bytes,
     .encode = f32_encode,
     .decode = f32_decode},
    {.name = "bf16",
     .fused = 1,
     .dtype = ZO_DTYPE_BF16,
     .code_dtype = ZO_DTYPE_BF16,
     .code_bits = 16,
     .summary = "bf16 moments, 4 bytes a parameter",
     .moment_bytes = bf16_bytes,
     .encode = bf16_encode,
     .decode = bf16_decode},
    {.name = "int8",
     .fused = 1,
     .dtype = ZO_DTYPE_I8,
     .code_dtype = ZO_DTYPE_U8,
     .code_bits = 8,
     .block = ZO_ADAM_Q8_BLOCK,
     .min_numel = ZO_ADAM_Q8_MIN_NUMEL,
     .summary = "8-bit blockwise moments as bitsandbytes' 8-bit Adam, about 2 bytes a parameter",
     .moment_bytes = q8_bytes,
     .encode = q8_encode,
     .decode = q8_decode},
};

const zo_state_format *zo_state_format_at(size_t i)
{
    return i < sizeof formats / sizeof formats[0] ? &formats[i] : NULL;
}

const zo_state_format *zo_state_format_of(zo_dtype dtype)
{
    for (const zo_state_format *f = formats; f < formats + sizeof formats / sizeof formats[0]; f++)
        if (f->dtype == dtype)
            return f;
    return NULL;
}

const zo_state_format *zo_state_format_named(const char *name)
{
    for (const zo_state_format *f = formats;
         name && f < formats + sizeof formats / sizeof formats[0]; f++)
        if (strcmp(f->name, name) == 0)
            return f;
    return NULL;
}

size_t zo_state_format_names(char *buf, size_t cap, const char *sep)
{
    size_t len = 0;
    for (size_t i = 0; zo_state_format_at(i); i++)
        len +=
            (size_t)snprintf(buf && len < cap ? buf + len : NULL, buf && len < cap ? cap - len : 0,
                             "%s%s", i ? sep : "", formats[i].name);
    return len;
}

/* The codes of moment `mom` from element i (on a block), and its scales. */
static void *codes_at(const zo_state_format *f, void *mom, size_t i)
{
    return (char *)mom + zo_state_format_code_bytes(f, i);
}

static float *scales_at(const zo_state_format *f, float *scales, size_t i)
{
    return f->block ? scales + i / f->block : NULL;
}

/* A format the kernels do not update in place: each span of one block (or
 * ZO_ADAM_UNFUSED_SPAN elements) decoded to fp32, updated by the fp32
 * kernel, encoded again. */
#define ZO_ADAM_UNFUSED_SPAN ((size_t)256)
void zo_adam_run_unfused(const zo_optim_kernels *k, const zo_adam_consts *c,
                         const zo_adam_buffers *b, size_t begin, size_t end)
{
    const zo_state_format *f = zo_state_format_of(b->state_type);
    size_t span = f->block ? f->block : ZO_ADAM_UNFUSED_SPAN;
    float m[ZO_ADAM_UNFUSED_SPAN], v[ZO_ADAM_UNFUSED_SPAN];
    for (size_t i = begin; i < end; i += span) {
        size_t n = end - i < span ? end - i : span;
        zo_adam_buffers one = *b;
        one.n = n;
        one.grad = (const char *)b->grad + i * zo_dtype_size(b->grad_type);
        one.master = b->master + i;
        one.out = b->out ? (char *)b->out + i * zo_dtype_size(b->out_type) : NULL;
        one.state_type = ZO_DTYPE_F32;
        one.m = m;
        one.v = v;
        one.m_absmax = one.v_absmax = NULL;
        f->decode(codes_at(f, b->m, i), scales_at(f, b->m_absmax, i), n, 1, m);
        f->decode(codes_at(f, b->v, i), scales_at(f, b->v_absmax, i), n, 0, v);
        k->adam(c, &one, 0, n);
        f->encode(m, n, 1, codes_at(f, b->m, i), scales_at(f, b->m_absmax, i));
        f->encode(v, n, 0, codes_at(f, b->v, i), scales_at(f, b->v_absmax, i));
    }
}

void zo_adam_run(const zo_optim_kernels *k, const zo_adam_consts *c, const zo_adam_buffers *b,
                 size_t begin, size_t end)
{
    const zo_state_format *f = zo_state_format_of(b->state_type);
    if (f->fused)
        k->adam(c, b, begin, end);
    else
        zo_adam_run_unfused(k, c, b, begin, end);
}

zo_status zo_adam_roofline_check(const zo_adam_buffers *b)
{
    const zo_state_format *f = zo_state_format_of(b->state_type);
    if (f->fused)
        return ZO_OK;
    return ZO_FAIL(ZO_ERR_UNSUPPORTED, "optim",
                   "the roofline of state format %s: it has no kernel of its own (it is "
                   "updated through its codec); measure zo_adam_step instead",
                   f->name);
}

size_t zo_adam_moment_bytes(zo_dtype state_type, size_t n)
{
    const zo_state_format *f = zo_state_format_of(state_type);
    return f ? f->moment_bytes(n) : 0;
}
