/* The row kernels (cpu_rows.h), written once. A variant's file defines
 * ZR_NAME (its table's name), ZR_LABEL (its name as a string) and ZR_EXP
 * (the exp_shifted it calls), then includes this file; its compile options
 * choose the instruction set. Every loop is either element by element or
 * reduces into ZO_ROW_LANES lanes (element i into lane i % ZO_ROW_LANES),
 * so the compiler's vector form computes what the scalar form computes,
 * operation for operation, provided it contracts nothing into fused
 * multiply-adds (the variants build with -ffp-contract=off). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_exp.h"
#include "cpu_rows.h"
#include "zo/half.h"

#define ZR_L ZO_ROW_LANES

static void zr_load(float *dst, const void *src, zo_dtype dt, size_t off, size_t n)
{
    if (dt == ZO_DTYPE_BF16) {
        const uint16_t *h = (const uint16_t *)src + off;
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)h[i] << 16;
            memcpy(dst + i, &u, sizeof u);
        }
    } else if (dt == ZO_DTYPE_F16) {
        const uint16_t *h = (const uint16_t *)src + off;
        for (size_t i = 0; i < n; i++)
            dst[i] = zo_f16_to_f32(h[i]);
    } else {
        memcpy(dst, (const float *)src + off, n * sizeof *dst);
    }
}

/* zo_f32_to_bf16 without its branch, so that it vectorizes. */
static inline uint16_t zr_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, nan = (u >> 16) | 0x0040u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

static void zr_store(void *dst, zo_dtype dt, size_t off, const float *src, size_t n)
{
    if (dt == ZO_DTYPE_BF16) {
        uint16_t *h = (uint16_t *)dst + off;
        for (size_t i = 0; i < n; i++)
            h[i] = zr_bf16(src[i]);
    } else if (dt == ZO_DTYPE_F16) {
        uint16_t *h = (uint16_t *)dst + off;
        for (size_t i = 0; i < n; i++)
            h[i] = zo_f32_to_f16(src[i]);
    } else {
        memcpy((float *)dst + off, src, n * sizeof *src);
    }
}

/* ---- reductions over lanes ---- */

static double zr_lanes_sum(const double *acc)
{
    double s = 0.0;
    for (int l = 0; l < ZR_L; l++)
        s += acc[l];
    return s;
}

static float zr_max(const float *x, size_t n)
{
    float m[ZR_L];
    for (int l = 0; l < ZR_L; l++)
        m[l] = -INFINITY;
    size_t i = 0;
    for (; i + ZR_L <= n; i += ZR_L)
        for (int l = 0; l < ZR_L; l++)
            m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
    for (int l = 0; i < n; i++, l++)
        m[l] = x[i] > m[l] ? x[i] : m[l];
    float r = m[0];
    for (int l = 1; l < ZR_L; l++)
        r = m[l] > r ? m[l] : r;
    return r;
}

static double zr_sum(const float *x, size_t n)
{
    double acc[ZR_L] = {0};
    size_t i = 0;
    for (; i + ZR_L <= n; i += ZR_L)
        for (int l = 0; l < ZR_L; l++)
            acc[l] += (double)x[i + l];
    for (int l = 0; i < n; i++, l++)
        acc[l] += (double)x[i];
    return zr_lanes_sum(acc);
}

static double zr_dot(const float *x, const float *y, size_t n)
{
    double acc[ZR_L] = {0};
    size_t i = 0;
    for (; i + ZR_L <= n; i += ZR_L)
        for (int l = 0; l < ZR_L; l++)
            acc[l] += (double)x[i + l] * (double)y[i + l];
    for (int l = 0; i < n; i++, l++)
        acc[l] += (double)x[i] * (double)y[i];
    return zr_lanes_sum(acc);
}

/* ---- elementwise ---- */

static void zr_exp_shifted(float *x, size_t n, float shift)
{
    while (n) { /* the exp takes an int count */
        int k = n > ((size_t)1 << 30) ? 1 << 30 : (int)n;
        ZR_EXP(x, k, shift);
        x += k;
        n -= (size_t)k;
    }
}

static void zr_scale(float *x, size_t n, float s)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

static void zr_rms_fwd(float *y, const float *x, float rs, const float *w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] * rs * w[i];
}

static void zr_rms_bwd(float *dx, const float *x, const float *dy, const float *w, float rs,
                       size_t n, int accumulate, double *dw_acc)
{
    double acc[ZR_L] = {0};
    size_t i = 0;
    for (; i + ZR_L <= n; i += ZR_L)
        for (int l = 0; l < ZR_L; l++)
            acc[l] += (double)(dy[i + l] * w[i + l]) * (double)(x[i + l] * rs);
    for (int l = 0; i < n; i++, l++)
        acc[l] += (double)(dy[i] * w[i]) * (double)(x[i] * rs);
    const float mean = (float)(zr_lanes_sum(acc) / (double)n);
    if (dw_acc)
        for (size_t j = 0; j < n; j++)
            dw_acc[j] += (double)dy[j] * (double)(x[j] * rs);
    for (size_t j = 0; j < n; j++) {
        float d = rs * (dy[j] * w[j] - x[j] * rs * mean);
        dx[j] = accumulate ? d + dx[j] : d;
    }
}

/* silu(g) = g sigmoid(g), the sigmoid from exp(-|g|) <= 1 (never overflows):
 * 1 / (1 + e) for g >= 0, e / (1 + e) below. e is computed into t. */
static void zr_sigmoid(float *t, const float *g, size_t n)
{
    for (size_t i = 0; i < n; i++)
        t[i] = -fabsf(g[i]);
    zr_exp_shifted(t, n, 0.0f);
    for (size_t i = 0; i < n; i++)
        t[i] = (g[i] >= 0.0f ? 1.0f : t[i]) / (1.0f + t[i]);
}

static void zr_swiglu_fwd(float *y, const float *g, const float *u, size_t n)
{
    zr_sigmoid(y, g, n);
    for (size_t i = 0; i < n; i++)
        y[i] = g[i] * y[i] * u[i];
}

static void zr_swiglu_bwd(float *dg, float *du, const float *g, const float *u, const float *d,
                          size_t n)
{
    zr_sigmoid(du, g, n);
    for (size_t i = 0; i < n; i++) {
        float sig = du[i];
        float dsilu = sig * (1.0f + g[i] * (1.0f - sig));
        dg[i] = d[i] * u[i] * dsilu;
        du[i] = d[i] * g[i] * sig;
    }
}

static void zr_add(float *y, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = a[i] + b[i];
}

static void zr_axpy(float *y, float alpha, const float *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = y[i] + alpha * a[i];
}

static void zr_softmax_bwd(float *y, const float *p, const float *g, float d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = p[i] * (g[i] - d);
}

static void zr_rope(float *y, const float *x, const float *cs, float sgn, size_t half)
{
    for (size_t i = 0; i < half; i++) {
        float c = cs[2 * i], s = sgn * cs[2 * i + 1];
        y[i] = x[i] * c - x[i + half] * s;
        y[i + half] = x[i + half] * c + x[i] * s;
    }
}

const zo_cpu_rowk ZR_NAME = {
    .name = ZR_LABEL,
    .load = zr_load,
    .store = zr_store,
    .max = zr_max,
    .sum = zr_sum,
    .dot = zr_dot,
    .exp_shifted = zr_exp_shifted,
    .scale = zr_scale,
    .rms_fwd = zr_rms_fwd,
    .rms_bwd = zr_rms_bwd,
    .swiglu_fwd = zr_swiglu_fwd,
    .swiglu_bwd = zr_swiglu_bwd,
    .add = zr_add,
    .axpy = zr_axpy,
    .softmax_bwd = zr_softmax_bwd,
    .rope = zr_rope,
};
