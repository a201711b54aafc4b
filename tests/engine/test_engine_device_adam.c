/* Optimizer states homed on the device are updated there, by the device's
 * Adam op (zo_op_adam), never read by the host: every run here is on a
 * strict cpu device (ZO_CPU_DEVICE_STRICT=1), whose memory faults when a
 * host thread touches it, as a GPU's would. Each run with the states on
 * the device must equal the same run with them on the host (the CPU Adam)
 * bit for bit: every mode, bf16, fp16 with overflows and fp32 parameters,
 * clipping, accumulation, parameter groups and 8-bit moments; and the
 * checkpoints' reads and writes of device states resume bitwise. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine_harness.h"

/* The strict device: not host-addressable, a host read of its memory
 * faults (in a child), and its own work reaches that memory. */
static void test_strict_device_keeps_the_host_out(void **state)
{
    (void)state;
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    zo_device_t dev;
    ZO_ASSERT_OK(zo_device_init(&dev, &dc));
    assert_int_equal(zo_device_caps(dev) & ZO_DEVCAP_HOST_ADDRESSABLE, 0);
    zo_stream_t s;
    ZO_ASSERT_OK(zo_stream_create(dev, &s));
    float *d, in[256], out[256];
    ZO_ASSERT_OK(zo_device_malloc(dev, sizeof in, (void **)&d));
    for (int i = 0; i < 256; i++)
        in[i] = (float)i * 0.5f;
    ZO_ASSERT_OK(zo_memcpy_h2d_async(s, d, in, sizeof in));
    ZO_ASSERT_OK(zo_memcpy_d2h_async(s, out, d, sizeof out));
    ZO_ASSERT_OK(zo_stream_synchronize(s));
    assert_memory_equal(in, out, sizeof in);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL); /* not the test runner's handler: the child dies */
        volatile float x = d[7];  /* the host reads device memory: must fault */
        (void)x;
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    /* killed by SIGSEGV; under a sanitizer, which reports the fault, an exit
     * other than the child's own 0 */
    assert_false(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (WIFSIGNALED(status))
        assert_int_equal(WTERMSIG(status), SIGSEGV);
    ZO_ASSERT_OK(zo_device_mfree(dev, d));
    zo_stream_destroy(s);
    zo_device_free(dev);
}

/* c with the states on the device against c with them on the host. */
static void device_equals_host(run_cfg c, const char *what)
{
    run_out dev, host;
    c.param_home = c.optim_home = ZO_TIER_DEVICE;
    run(&c, &dev);
    c.param_home = c.optim_home = ZO_TIER_HOST;
    run(&c, &host);
    for (int s = 0; s < c.steps; s++) {
        if (memcmp(&dev.losses[s], &host.losses[s], sizeof(double)) != 0)
            fail_msg("%s: step %d's loss %.9g on the device, %.9g on the host", what, s,
                     dev.losses[s], host.losses[s]);
        assert_int_equal(dev.stats[s].overflow, host.stats[s].overflow);
        assert_int_equal(dev.stats[s].rollbacks, host.stats[s].rollbacks);
    }
    assert_same_weights(&dev, &host, c.steps);
    run_out_free(&dev);
    run_out_free(&host);
}

/* Every mode over the parameter types, with the verdict's clipping (a
 * factor below 1, and overlap's rollback), fp16's overflows (skipped
 * steps, the loss scale) and accumulation (fp32 gradient sums). */
static void test_modes_and_dtypes_equal_host(void **state)
{
    (void)state;
    const zo_optim_mode modes[] = {ZO_OPTIM_SYNC, ZO_OPTIM_OVERLAP, ZO_OPTIM_DPU};
    const zo_dtype dtypes[] = {ZO_DTYPE_BF16, ZO_DTYPE_F16, ZO_DTYPE_F32};
    char what[96];
    for (int m = 0; m < 3; m++)
        for (int t = 0; t < 3; t++)
            for (int accum = 1; accum <= 3; accum += 2) {
                run_cfg c = base_cfg(ZO_TIER_DEVICE, ZO_TIER_DEVICE, modes[m]);
                c.dtype = dtypes[t];
                c.accum = accum;
                c.steps = 10;
                c.max_norm = modes[m] == ZO_OPTIM_DPU ? 0.0f : 1e-3f;
                if (dtypes[t] == ZO_DTYPE_F16)
                    c.poison_steps = (1ull << 3) | (1ull << 4);
                snprintf(what, sizeof what, "mode %d, dtype %d, accum %d", (int)modes[m],
                         (int)dtypes[t], accum);
                device_equals_host(c, what);
            }
}

/* The update in ranges: tensors with their own decay and Adam settings,
 * and under 8-bit states a tensor keeping fp32 moments (its padding's
 * 16-bit copy zeroed as the host does); bf16 moments too. */
static void test_groups_and_formats_equal_host(void **state)
{
    (void)state;
    g_own_decay[2] = 1;
    g_decay[2] = 0.25f;
    g_own_adam[4] = 1;
    g_group[4] = (tm_group){0.5, 0.8f, 0.99f, 1e-6f};
    const zo_dtype fmts[] = {ZO_DTYPE_F32, ZO_DTYPE_BF16, ZO_DTYPE_I8};
    for (int f = 0; f < 3; f++) {
        g_state_dtype = fmts[f];
        g_keep_f32 = fmts[f] == ZO_DTYPE_I8 ? 0 : -1;
        for (int m = 0; m < 2; m++) {
            run_cfg c =
                base_cfg(ZO_TIER_DEVICE, ZO_TIER_DEVICE, m ? ZO_OPTIM_OVERLAP : ZO_OPTIM_SYNC);
            c.steps = 10;
            c.max_norm = 1e-3f;
            device_equals_host(c, fmts[f] == ZO_DTYPE_I8 ? "int8 states" : "fp32/bf16 states");
        }
    }
    g_state_dtype = ZO_DTYPE_F32;
    g_keep_f32 = -1;
    g_own_decay[2] = g_own_adam[4] = 0;
}

/* States read from the device after 6 steps equal the host's; written into
 * a fresh engine with device states, the run resumes bit for bit. */
static void test_checkpoint_reads_and_writes(void **state)
{
    (void)state;
    const int half = 6;
    saved_state s[2];
    double losses[TM_MAXSTEPS];
    float *ref[TM_T];
    for (int d = 0; d < 2; d++) {
        run_cfg c = base_cfg(d ? ZO_TIER_DEVICE : ZO_TIER_HOST, d ? ZO_TIER_DEVICE : ZO_TIER_HOST,
                             ZO_OPTIM_SYNC);
        c.dtype = ZO_DTYPE_F16;
        c.poison_steps = 1u << 2;
        harness h;
        harness_open(&h, &c);
        ZO_ASSERT_OK(make_engine(&h, NULL, 0));
        train_range(&h, 0, half, losses);
        save_state(&h, &s[d]);
        if (d) {
            train_range(&h, half, 2 * half, losses);
            read_masters(&h, ref);
        }
        harness_close(&h);
    }
    for (int k = 0; k < TM_T; k++)
        for (int i = 0; i < 3; i++)
            assert_memory_equal(s[0].st[k][i], s[1].st[k][i], tm_numel(k) * sizeof(float));
    run_cfg c = base_cfg(ZO_TIER_DEVICE, ZO_TIER_DEVICE, ZO_OPTIM_SYNC);
    c.dtype = ZO_DTYPE_F16;
    c.poison_steps = 1u << 2;
    assert_true(resumed_equals(&c, &s[0], 7, half, losses, ref));
    assert_false(resumed_equals(&c, &s[0], 5, half, losses, ref)); /* the moments are used */
    for (int k = 0; k < TM_T; k++)
        free(ref[k]);
    saved_state_free(&s[0]);
    saved_state_free(&s[1]);
}

int main(void)
{
    /* before any device is made: every device of this program is strict */
    setenv("ZO_CPU_DEVICE_STRICT", "1", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strict_device_keeps_the_host_out),
        cmocka_unit_test(test_modes_and_dtypes_equal_host),
        cmocka_unit_test(test_groups_and_formats_equal_host),
        cmocka_unit_test(test_checkpoint_reads_and_writes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
