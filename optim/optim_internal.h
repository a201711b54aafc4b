/* optim/ internals: the table each SIMD variant fills, and the constants a
 * step derives once from zo_adam_params. */
#ifndef ZO_OPTIM_INTERNAL_H
#define ZO_OPTIM_INTERNAL_H

#include <stddef.h>

#include "zo/optim.h"

/* Per-step constants, computed once so every variant and every tile uses
 * exactly the same fp32 values. */
typedef struct zo_adam_consts {
    float beta1, beta2;
    float one_minus_beta1, one_minus_beta2;
    float step_size;    /* lr / bias_correction1 */
    float inv_sqrt_bc2; /* 1 / sqrt(bias_correction2) */
    float eps;
    float decay; /* AdamW: 1 - lr*wd; Adam: 1 */
    float l2;    /* Adam: wd; AdamW: 0 */
    float grad_scale;
} zo_adam_consts;

/* Gradient sums of squares are taken per this many elements and added in
 * element order, whatever the pool's tiles and threads, so a norm is the
 * same bits however it was computed. */
#define ZO_NORM_BLOCK ((size_t)16384)

typedef struct zo_optim_kernels {
    const char *name;
    /* Update elements [begin, end) of b. */
    void (*adam)(const zo_adam_consts *c, const zo_adam_buffers *b, size_t begin, size_t end);
    /* Sum of squares of elements [begin, end), lanes in double, combined in lane order. */
    double (*sum_sq)(const void *grad, zo_dtype type, size_t begin, size_t end);
    /* The roofline: the same loads and stores as adam, no arithmetic. */
    void (*roofline)(const zo_adam_buffers *b, size_t begin, size_t end);
} zo_optim_kernels;

extern const zo_optim_kernels zo_optim_kernels_scalar;
#if defined(__x86_64__)
extern const zo_optim_kernels zo_optim_kernels_avx2;
extern const zo_optim_kernels zo_optim_kernels_avx512;
extern const zo_optim_kernels zo_optim_kernels_avx512_bf16;
#endif
#if defined(__aarch64__)
extern const zo_optim_kernels zo_optim_kernels_neon;
#endif

/* The kernels for simd_level (-1: the library's level); fails on a level
 * this CPU cannot run. */
zo_status zo_optim_kernels_get(int simd_level, const zo_optim_kernels **out);
zo_status zo_adam_consts_make(const zo_adam_params *p, zo_adam_consts *c);
zo_status zo_adam_buffers_check(const zo_adam_buffers *b);
zo_status zo_grad_check(const void *grad, zo_dtype type, size_t n);

#endif
