/* zo_op_adam on the cpu device against zo_adam_step on the host, bit for
 * bit, over every option it takes: gradient types, moment formats (fp32,
 * bf16, int8), 16-bit/fp32/no weight copies, AdamW and L2 Adam with weight
 * decay, per-tensor lr/betas/eps, bias correction on and off, a gradient
 * scale (1/loss_scale times a clip coefficient), and every SIMD variant this
 * CPU runs; then each way the op refuses its arguments or fails. */
#include <math.h>

#include "adam_op_run.h"
#include "zo/device_testing.h"

static zo_device_t g_dev;
static zo_stream_t g_s;

static int setup(void **state)
{
    (void)state;
    zo_device_config cfg = ZO_DEVICE_CONFIG_INIT;
    cfg.backend = "cpu";
    cfg.mem_budget = 64u << 20;
    if (zo_device_init(&g_dev, &cfg) != ZO_OK || zo_stream_create(g_dev, &g_s) != ZO_OK)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    zo_stream_destroy(g_s);
    zo_device_free(g_dev);
    return 0;
}

/* One configuration: the op on the device and zo_adam_step on the host from
 * the same inputs, two steps in a row (the second from the first's states). */
static void check_case(size_t n, zo_dtype gt, zo_dtype st, zo_dtype ot, const zo_adam_params *p0,
                       uint64_t seed)
{
    adam_op_bufs dev = adam_op_bufs_alloc(n, gt, st, ot);
    adam_op_fill(&dev, &seed);
    adam_op_bufs host = adam_op_bufs_copy(&dev);
    zo_adam_params p = *p0;
    for (int step = 0; step < 2; step++, p.step++) {
        ZO_ASSERT_OK(adam_op_run(g_s, &p, &dev));
        zo_adam_buffers hb = adam_op_buffers_of(&host);
        ZO_ASSERT_OK(zo_adam_step(&p, &hb));
        char what[160];
        snprintf(what, sizeof what,
                 "zo_op_adam (cpu device) vs zo_adam_step, step %lld, adamw %d, wd %g, bc %d, "
                 "scale %g, simd %d",
                 (long long)p.step, p.adamw, p.weight_decay, p.bias_correction, p.grad_scale,
                 p.simd_level);
        adam_op_same(&dev, &host, what);
        for (size_t i = 0; i < n; i++) /* fresh gradients for the next step */
            adam_op_store(dev.grad, gt, i, adam_op_value(&seed, -20, 10));
        memcpy(host.grad, dev.grad, n * zo_dtype_size(gt));
    }
    adam_op_bufs_free(&dev);
    adam_op_bufs_free(&host);
}

static void test_bitwise_every_option(void **state)
{
    (void)state;
    static const zo_dtype gts[] = {ZO_DTYPE_F32, ZO_DTYPE_BF16, ZO_DTYPE_F16};
    static const zo_dtype sts[] = {ZO_DTYPE_F32, ZO_DTYPE_BF16, ZO_DTYPE_I8};
    static const zo_dtype ots[] = {ZO_DTYPE_NONE, ZO_DTYPE_BF16, ZO_DTYPE_F16, ZO_DTYPE_F32};
    uint64_t seed = 1;
    for (size_t g = 0; g < 3; g++)
        for (size_t s = 0; s < 3; s++)
            for (size_t o = 0; o < 4; o++)
                for (int opt = 0; opt < ADAM_OP_OPTS; opt++) {
                    zo_adam_params p = adam_op_params(opt);
                    check_case(1000 + 13 * opt, gts[g], sts[s], ots[o], &p, seed++);
                }
}

static void test_every_simd_variant(void **state)
{
    (void)state;
    for (int level = 0; level <= ZO_SIMD_AVX512_BF16; level++) {
        if (!zo_cpu_simd_supported((zo_simd_level)level))
            continue;
        zo_adam_params p = ZO_ADAM_PARAMS_INIT;
        p.simd_level = level;
        p.weight_decay = 0.01f;
        check_case(4099, ZO_DTYPE_BF16, ZO_DTYPE_F32, ZO_DTYPE_BF16, &p, 40 + (uint64_t)level);
        check_case(4099, ZO_DTYPE_F32, ZO_DTYPE_I8, ZO_DTYPE_NONE, &p, 50 + (uint64_t)level);
    }
}

/* A device buffer of bytes, zeroed. */
static void *dev_zeros(size_t bytes)
{
    void *d = NULL;
    ZO_ASSERT_OK(zo_device_malloc(g_dev, bytes, &d));
    ZO_ASSERT_OK(zo_memset_async(g_s, d, 0, bytes));
    return d;
}

static void expect_refusal(zo_stream_t s, const zo_adam_params *p, const zo_adam_buffers *b,
                           zo_status want, const char *names)
{
    zo_status st = zo_op_adam(s, p, b);
    if (st != want)
        fail_msg("zo_op_adam returned %s, want %s (%s)", zo_status_str(st), zo_status_str(want),
                 zo_last_error());
    if (!strstr(zo_last_error(), names))
        fail_msg("the error \"%s\" does not name %s", zo_last_error(), names);
}

static void test_refusals(void **state)
{
    (void)state;
    const size_t n = 300;
    float *grad = dev_zeros(n * 4), *master = dev_zeros(n * 4), *m = dev_zeros(n * 4),
          *v = dev_zeros(n * 4);
    uint16_t *out = dev_zeros(n * 2);
    zo_adam_params p = ZO_ADAM_PARAMS_INIT;
    zo_adam_buffers b = ZO_ADAM_BUFFERS_INIT;
    b.n = n;
    b.grad = grad;
    b.master = master;
    b.m = m;
    b.v = v;
    b.out = out;
    b.out_type = ZO_DTYPE_BF16;
    ZO_ASSERT_OK(zo_op_adam(g_s, &p, &b));
    ZO_ASSERT_OK(zo_stream_synchronize(g_s));

    expect_refusal(NULL, &p, &b, ZO_ERR_INVALID_ARG, "stream is NULL");
    zo_adam_params bad = p;
    bad.lr = NAN;
    expect_refusal(g_s, &bad, &b, ZO_ERR_INVALID_ARG, "lr");
    bad = p;
    bad.beta2 = 1.0f;
    expect_refusal(g_s, &bad, &b, ZO_ERR_INVALID_ARG, "betas");
    bad = p;
    bad.simd_level = 99;
    expect_refusal(g_s, &bad, &b, ZO_ERR_UNSUPPORTED, "SIMD level");

    /* host memory, and a range running past its allocation, by operand */
    float host[300];
    const char *names[] = {"grad", "master", "m", "v", "out"};
    for (int k = 0; k < 5; k++) {
        zo_adam_buffers hb = b;
        const void **slot[] = {&hb.grad, (const void **)&hb.master, (const void **)&hb.m,
                               (const void **)&hb.v, (const void **)&hb.out};
        *slot[k] = host;
        expect_refusal(g_s, &p, &hb, ZO_ERR_INVALID_ARG, names[k]);
        hb = b;
        hb.n = n + 1; /* each buffer one element short */
        expect_refusal(g_s, &p, &hb, ZO_ERR_INVALID_ARG, "grad");
    }
    zo_adam_buffers q8 = b;
    q8.state_type = ZO_DTYPE_I8;
    q8.m_absmax = master; /* fine */
    q8.v_absmax = (float *)host;
    expect_refusal(g_s, &p, &q8, ZO_ERR_INVALID_ARG, "v_absmax");
    zo_adam_buffers badtype = b;
    badtype.state_type = ZO_DTYPE_F16;
    expect_refusal(g_s, &p, &badtype, ZO_ERR_INVALID_ARG, "state type");

    /* nothing to do: accepted, nothing queued */
    zo_adam_buffers none = b;
    none.n = 0;
    ZO_ASSERT_OK(zo_op_adam(g_s, &p, &none));

    /* a failure while the op runs is the stream's, reported by the next wait */
    ZO_ASSERT_OK(zo_device_inject_fault(g_dev, ZO_FAULT_STREAM_TASK, 1));
    ZO_ASSERT_OK(zo_op_adam(g_s, &p, &b));
    if (zo_stream_synchronize(g_s) == ZO_OK)
        fail_msg("a failed Adam task was not reported by the stream's wait");
    ZO_ASSERT_OK(zo_device_inject_fault(g_dev, ZO_FAULT_STREAM_TASK, 0));
    ZO_ASSERT_OK(zo_stream_synchronize(g_s));

    void *bufs[] = {grad, master, m, v, out};
    for (int k = 0; k < 5; k++)
        ZO_ASSERT_OK(zo_device_mfree(g_dev, bufs[k]));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bitwise_every_option),
        cmocka_unit_test(test_every_simd_variant),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
