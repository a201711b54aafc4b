/* The optimizer's entry points on the calling thread: argument checks,
 * per-step constants, and the choice of SIMD variant. */
#include <math.h>

#include "optim_internal.h"
#include "zo_internal.h"

zo_status zo_optim_kernels_get(int simd_level, const zo_optim_kernels **out)
{
    zo_simd_level level = simd_level < 0 ? zo_cpu_simd_level() : (zo_simd_level)simd_level;
    if (simd_level > ZO_SIMD_AVX512_BF16 || !zo_cpu_simd_supported(level))
        return ZO_FAIL(
            ZO_ERR_UNSUPPORTED, "optim",
            "SIMD level %d (%s) cannot run on this CPU (it has %s); use -1 for the default",
            simd_level, zo_simd_level_name(level), zo_simd_level_name(zo_cpu_simd_detected()));
    switch (level) {
#if defined(__x86_64__)
    case ZO_SIMD_AVX512_BF16: *out = &zo_optim_kernels_avx512_bf16; return ZO_OK;
    case ZO_SIMD_AVX512: *out = &zo_optim_kernels_avx512; return ZO_OK;
    case ZO_SIMD_AVX2: *out = &zo_optim_kernels_avx2; return ZO_OK;
#endif
#if defined(__aarch64__)
    case ZO_SIMD_NEON: *out = &zo_optim_kernels_neon; return ZO_OK;
#endif
    case ZO_SIMD_SCALAR: *out = &zo_optim_kernels_scalar; return ZO_OK;
    default: break;
    }
    return ZO_FAIL(ZO_ERR_UNSUPPORTED, "optim", "SIMD level %s is not built for this architecture",
                   zo_simd_level_name(level));
}

static int is_unit_interval(float x)
{
    return x >= 0.0f && x < 1.0f;
}

zo_status zo_adam_consts_make(const zo_adam_params *p, zo_adam_consts *c)
{
    if (!p || p->struct_size < sizeof *p)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim",
                       "zo_adam_params is NULL or its struct_size is wrong; "
                       "initialize it with ZO_ADAM_PARAMS_INIT");
    if (!isfinite(p->lr) || p->lr < 0.0f)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim", "lr %g must be finite and >= 0", p->lr);
    if (!is_unit_interval(p->beta1) || !is_unit_interval(p->beta2))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim", "betas (%g, %g) must lie in [0, 1)", p->beta1,
                       p->beta2);
    if (!isfinite(p->eps) || p->eps < 0.0f)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim", "eps %g must be finite and >= 0", p->eps);
    if (!isfinite(p->weight_decay) || p->weight_decay < 0.0f)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim", "weight_decay %g must be finite and >= 0",
                       p->weight_decay);
    if (p->step < 1)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim",
                       "step %lld must be >= 1 (the count including this update)",
                       (long long)p->step);
    if (!isfinite(p->grad_scale))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim", "grad_scale %g must be finite", p->grad_scale);
    double bc1 = 1.0, bc2 = 1.0;
    if (p->bias_correction) {
        bc1 = 1.0 - pow(p->beta1, (double)p->step);
        bc2 = 1.0 - pow(p->beta2, (double)p->step);
    }
    c->beta1 = p->beta1;
    c->beta2 = p->beta2;
    c->one_minus_beta1 = 1.0f - p->beta1;
    c->one_minus_beta2 = 1.0f - p->beta2;
    c->step_size = (float)(p->lr / bc1);
    c->inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    c->eps = p->eps;
    c->decay = p->adamw ? 1.0f - p->lr * p->weight_decay : 1.0f;
    c->l2 = p->adamw ? 0.0f : p->weight_decay;
    c->grad_scale = p->grad_scale;
    c->q8 = zo_q8_tables_get();
    return ZO_OK;
}

static int aligned_to(const void *ptr, size_t a)
{
    return ((uintptr_t)ptr % a) == 0;
}

static zo_status check_array(const void *ptr, zo_dtype t, size_t n, const char *what)
{
    if (n && !ptr)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim", "%s is NULL for %zu elements", what, n);
    if (!aligned_to(ptr, zo_dtype_size(t)))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim",
                       "%s (%p) is not aligned to its %zu-byte %s elements", what, ptr,
                       zo_dtype_size(t), zo_dtype_name(t));
    return ZO_OK;
}

zo_status zo_grad_check(const void *grad, zo_dtype type, size_t n)
{
    if (type != ZO_DTYPE_F32 && type != ZO_DTYPE_F16 && type != ZO_DTYPE_BF16)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim", "gradient type %d is not fp32, fp16 or bf16",
                       (int)type);
    return check_array(grad, type, n, "grad");
}

zo_status zo_adam_buffers_check(const zo_adam_buffers *b)
{
    if (!b || b->struct_size < sizeof *b)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim",
                       "zo_adam_buffers is NULL or its struct_size is wrong; "
                       "initialize it with ZO_ADAM_BUFFERS_INIT");
    ZO_TRY(zo_grad_check(b->grad, b->grad_type, b->n));
    const zo_state_format *f = zo_state_format_of(b->state_type);
    if (!f) {
        char names[128];
        zo_state_format_names(names, sizeof names, ", ");
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim",
                       "state type %s is no moment format: expected the dtype of %s",
                       zo_dtype_name(b->state_type), names);
    }
    if (b->out_type != ZO_DTYPE_NONE && b->out_type != ZO_DTYPE_BF16 &&
        b->out_type != ZO_DTYPE_F16 && b->out_type != ZO_DTYPE_F32)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim", "out type %s is not bf16, fp16, fp32 or none",
                       zo_dtype_name(b->out_type));
    if ((b->out_type == ZO_DTYPE_NONE) != (b->out == NULL))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim",
                       "out is %s but out_type is %s: give both or neither",
                       b->out ? "set" : "NULL", zo_dtype_name(b->out_type));
    ZO_TRY(check_array(b->master, ZO_DTYPE_F32, b->n, "master"));
    ZO_TRY(check_array(b->m, b->state_type, b->n, "m"));
    ZO_TRY(check_array(b->v, b->state_type, b->n, "v"));
    if (f->block) {
        size_t nb = (b->n + f->block - 1) / f->block;
        ZO_TRY(check_array(b->m_absmax, ZO_DTYPE_F32, nb, "m_absmax (the I8 moments' scales)"));
        ZO_TRY(check_array(b->v_absmax, ZO_DTYPE_F32, nb, "v_absmax (the I8 moments' scales)"));
    }
    if (b->out_type != ZO_DTYPE_NONE)
        ZO_TRY(check_array(b->out, b->out_type, b->n, "out"));
    return ZO_OK;
}

zo_status zo_adam_step(const zo_adam_params *p, const zo_adam_buffers *b)
{
    zo_adam_consts c;
    const zo_optim_kernels *k;
    ZO_TRY(zo_adam_consts_make(p, &c));
    ZO_TRY(zo_adam_buffers_check(b));
    ZO_TRY(zo_optim_kernels_get(p->simd_level, &k));
    zo_adam_run(k, &c, b, 0, b->n);
    return ZO_OK;
}

zo_status zo_adam_roofline(const zo_adam_buffers *b, int simd_level)
{
    const zo_optim_kernels *k;
    ZO_TRY(zo_adam_buffers_check(b));
    ZO_TRY(zo_optim_kernels_get(simd_level, &k));
    ZO_TRY(zo_adam_roofline_check(b));
    k->roofline(b, 0, b->n);
    return ZO_OK;
}

zo_status zo_grad_stats_compute(const void *grad, zo_dtype type, size_t n, int simd_level,
                                zo_grad_stats *out)
{
    const zo_optim_kernels *k;
    if (!out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim", "zo_grad_stats_compute: out is NULL");
    ZO_TRY(zo_grad_check(grad, type, n));
    ZO_TRY(zo_optim_kernels_get(simd_level, &k));
    out->sum_sq = k->sum_sq(grad, type, 0, n);
    /* Squares of fp32 values are at most 2^256 and exact in double, so the
     * sum is finite unless some value is inf or NaN. */
    out->nonfinite = !isfinite(out->sum_sq);
    return ZO_OK;
}

float zo_grad_scale_factor(double total_norm, float loss_scale, float max_norm)
{
    double combined = loss_scale;
    if (max_norm > 0.0f) {
        double clip = (total_norm / loss_scale + 1e-6) / max_norm;
        if (clip > 1.0)
            combined = clip * loss_scale;
    }
    return (float)(1.0 / combined);
}
