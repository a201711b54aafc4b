/* Helpers shared by the ops tests: device buffers filled from host fp32
 * arrays in any dtype, and read back as fp32. */
#ifndef OPS_TEST_UTIL_H
#define OPS_TEST_UTIL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zo/device.h"
#include "zo/ops.h"
#include "zo_test.h"

static inline void to_dtype_host(void *dst, zo_dtype dt, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (dt == ZO_DTYPE_F32)
            ((float *)dst)[i] = src[i];
        else if (dt == ZO_DTYPE_BF16)
            ((uint16_t *)dst)[i] = zo_f32_to_bf16(src[i]);
        else
            ((uint16_t *)dst)[i] = zo_f32_to_f16(src[i]);
    }
}

static inline float from_dtype_host(const void *src, zo_dtype dt, size_t i)
{
    if (dt == ZO_DTYPE_F32)
        return ((const float *)src)[i];
    if (dt == ZO_DTYPE_BF16)
        return zo_bf16_to_f32(((const uint16_t *)src)[i]);
    return zo_f16_to_f32(((const uint16_t *)src)[i]);
}

/* Round a host array to what dt can hold, in place. */
static inline void round_to(float *v, size_t n, zo_dtype dt)
{
    if (dt == ZO_DTYPE_F32)
        return;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        to_dtype_host(&h, dt, &v[i], 1);
        v[i] = from_dtype_host(&h, dt, 0);
    }
}

/* Uniform values in [-scale, scale], rounded to dt. */
static inline float *rand_vec(uint64_t *seed, size_t n, float scale, zo_dtype dt)
{
    float *v = malloc(n * sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < n; i++)
        v[i] = scale * (float)((double)(zo_test_rand(seed) >> 11) * 0x1p-53 * 2.0 - 1.0);
    round_to(v, n, dt);
    return v;
}

/* Every buffer the helpers allocate, freed together by dev_free_all. */
enum { MAX_TRACKED = 512 };
static void *g_tracked[MAX_TRACKED];
static zo_device_t g_tracked_dev[MAX_TRACKED];
static int g_n_tracked;

static inline void *track(zo_device_t dev, void *p)
{
    assert_true(g_n_tracked < MAX_TRACKED);
    g_tracked_dev[g_n_tracked] = dev;
    g_tracked[g_n_tracked++] = p;
    return p;
}

static inline void dev_free_all(void)
{
    for (int i = 0; i < g_n_tracked; i++) {
        zo_device_synchronize(g_tracked_dev[i]);
        ZO_ASSERT_OK(zo_device_mfree(g_tracked_dev[i], g_tracked[i]));
    }
    g_n_tracked = 0;
}

/* A device buffer holding host[0..n) converted to dt (synchronous). */
static inline void *dev_from(zo_stream_t s, const float *host, size_t n, zo_dtype dt)
{
    void *d = NULL;
    size_t bytes = n * zo_dtype_size(dt);
    ZO_ASSERT_OK(zo_device_malloc(zo_stream_device(s), bytes ? bytes : 4, &d));
    track(zo_stream_device(s), d);
    if (!n)
        return d;
    void *tmp = malloc(bytes);
    assert_non_null(tmp);
    to_dtype_host(tmp, dt, host, n);
    ZO_ASSERT_OK(zo_memcpy_h2d_async(s, d, tmp, bytes));
    ZO_ASSERT_OK(zo_stream_synchronize(s));
    free(tmp);
    return d;
}

/* A cpu device of `budget` bytes and a stream on it (a test group's setup:
 * 0 when both opened), and their end (its teardown). */
static inline int cpu_device_open(zo_device_t *dev, zo_stream_t *s, size_t budget)
{
    zo_device_config cfg = ZO_DEVICE_CONFIG_INIT;
    cfg.backend = "cpu";
    cfg.mem_budget = budget;
    if (zo_device_init(dev, &cfg) != ZO_OK)
        return -1;
    return zo_stream_create(*dev, s) == ZO_OK ? 0 : -1;
}

static inline int cpu_device_close(zo_device_t dev)
{
    dev_free_all();
    zo_device_free(dev);
    return 0;
}

static inline void *dev_zeros(zo_stream_t s, size_t bytes)
{
    void *d = NULL;
    ZO_ASSERT_OK(zo_device_malloc(zo_stream_device(s), bytes, &d));
    track(zo_stream_device(s), d);
    ZO_ASSERT_OK(zo_memset_async(s, d, 0, bytes));
    return d;
}

/* Wait for the stream, then read n elements of dt back as fp32 (malloc'd). */
static inline float *dev_to_host(zo_stream_t s, const void *d, size_t n, zo_dtype dt)
{
    size_t bytes = n * zo_dtype_size(dt);
    void *tmp = malloc(bytes ? bytes : 4);
    float *out = malloc((n ? n : 1) * sizeof *out);
    assert_non_null(tmp);
    assert_non_null(out);
    ZO_ASSERT_OK(zo_stream_synchronize(s));
    ZO_ASSERT_OK(zo_memcpy_d2h_async(s, tmp, d, bytes));
    ZO_ASSERT_OK(zo_stream_synchronize(s));
    for (size_t i = 0; i < n; i++)
        out[i] = from_dtype_host(tmp, dt, i);
    free(tmp);
    return out;
}

/* max|got - want| / max(max|want|, floor): an error relative to the
 * tensor's scale, so that elements near zero do not dominate. */
static inline double norm_err(const float *got, const double *want, size_t n, double floor_)
{
    double num = 0.0, den = floor_;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (isnan(e))
            return INFINITY;
        if (e > num)
            num = e;
        if (fabs(want[i]) > den)
            den = fabs(want[i]);
    }
    return num / den;
}

#define ASSERT_CLOSE(got, want, n, tol, what)                                                      \
    do {                                                                                           \
        double e_ = norm_err((got), (want), (n), 1e-6);                                            \
        if (!(e_ <= (tol)))                                                                        \
            fail_msg("%s: normalized error %.3g exceeds %.3g", (what), e_, (double)(tol));         \
    } while (0)

#endif
