/* zo-plan's planner against the trainer it plans for, on the cpu device:
 *  - memory: for the tiny preset and a cut-down small preset, every strategy
 *    under several device budgets, the predicted peak bytes of every tier
 *    (zo-train's peak_bytes: engine device, pinned, pageable host, NVMe) and
 *    the device total are within 3% of what a training step measures (run
 *    through zp_validate, zo-plan --validate's trainer run); a budget one
 *    byte short of the plan is refused by the trainer too; the small preset
 *    itself ("test_plan small", label slow) at its roomy and smallest
 *    budgets; tiny with fp32 parameters too;
 *  - a 70B model is planned without allocating in proportion to its size:
 *    the work units stay within a bound set by the layers and chunks, and
 *    the plan succeeds in a child whose address space is capped at 512 MiB
 *    more than it already holds.
 *  - time ("test_plan time", label timing: run by hand, not in CI): fed the
 *    speeds zp_measure measures here just before each run, the predicted
 *    step time against the median measured one for tiny (every placement),
 *    the cut-down small and the small preset (the offloading placements)
 *    (printed; asserted loosely, see TIME_MEDIAN_BOUND).
 * zo-plan --validate N reports the same comparison for any job. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hw.h"
#include "plan.h"
#include "plan_internal.h"
#include "plan_test_util.h"
#include "trainer.h"
#include "validate.h"
#include "zo_test.h"
#include "zt_error.h"

#ifndef ZP_TEST_DATA
#error "ZP_TEST_DATA (the shipped corpus) must be defined"
#endif

/* Measured-vs-predicted step time: the target is 25%. On the 2-core build
 * VM, shared with other jobs whose load swings within seconds and whose
 * virtual disk's rate swings up to 2x, single figures have been seen 32%
 * off (three runs: 32 of 33 within 25%, medians 6-10%), so the assertion
 * is the target on the median error of the runs, and a factor of two on
 * any one; the figures print. */
#define TIME_MEDIAN_BOUND 0.25
#define TIME_ANY_BOUND    1.0

typedef struct job_cfg {
    const char *name;
    zt_shape shape;
    int seq, micro_batch, grad_accum;
} job_cfg;

static job_cfg tiny_cfg(int accum)
{
    zt_shape s;
    ZO_ASSERT_OK(zt_preset("tiny", &s));
    return (job_cfg){"tiny", s, 64, 4, accum};
}

/* The small preset's width (dim 640, 10 heads, ffn 1728) with 2 blocks and
 * a vocabulary of 2048, so a step takes well under a second here and no
 * placement needs more than 200 MiB of device memory. */
static job_cfg small_cfg(void)
{
    zt_shape s;
    ZO_ASSERT_OK(zt_preset("small", &s));
    s.n_layers = 2;
    s.vocab = 2048;
    return (job_cfg){"small/2 layers", s, 64, 2, 1};
}

/* The small preset itself (100M parameters), as zo-train runs it with
 * --seq 64 --micro-batch 4. */
static job_cfg small_full_cfg(void)
{
    zt_shape s;
    ZO_ASSERT_OK(zt_preset("small", &s));
    return (job_cfg){"small", s, 64, 4, 1};
}

/* The parameters' type of the jobs planned: bf16 but in test_memory_tiny_fp32. */
static zo_dtype g_dtype = ZO_DTYPE_BF16;
/* zp_job.mlp_chunk_bytes of the jobs planned: 0 (zo-train's default) but in
 * test_memory_tiny_mlp_chunk_option. */
static uint64_t g_mlp_chunk;

static zp_job job_of(const job_cfg *c)
{
    zp_job j = {.shape = c->shape,
                .seq = c->seq,
                .micro_batch = c->micro_batch,
                .grad_accum = c->grad_accum,
                .dtype = g_dtype,
                .mlp_chunk_bytes = g_mlp_chunk,
                .mode = ZO_OPTIM_SYNC,
                .act_home = ZP_ACT_AUTO,
                .state_dtype = ZO_DTYPE_F32};
    return j;
}

static zp_hardware cpu_machine(uint64_t device_bytes)
{
    zp_hardware hw = {"cpu", "test", device_bytes, 0, 8ull << 30, 0, 64ull << 30, 1};
    return hw;
}

static const zp_speeds unit_speeds = {1e9, 1e9, 1e9, 1e9, 1e9, 1e11, 1e11, 0, 0, 0};

static zp_plan plan(const job_cfg *c, zp_strategy s, uint64_t device_bytes, const zp_speeds *sp)
{
    zp_job j = job_of(c);
    zp_hardware hw = cpu_machine(device_bytes);
    zp_plan p;
    zo_status st = zp_plan_strategy(&j, &hw, sp, s, 0, &p, NULL);
    if (st < 0)
        fail_msg("zp_plan_strategy: %s", zt_last_error());
    return p;
}

static double rel_err(double predicted, double measured)
{
    if (measured == 0)
        return predicted == 0 ? 0 : 1;
    return fabs(predicted - measured) / measured;
}

static void expect_close(const char *what, uint64_t predicted, uint64_t measured)
{
    if (rel_err((double)predicted, (double)measured) > 0.03)
        fail_msg("%s: predicted %llu, measured %llu bytes (more than 3%% apart)", what,
                 (unsigned long long)predicted, (unsigned long long)measured);
}

/* One training step under the plan; its peaks against the prediction. */
static void check_memory(const job_cfg *c, zp_strategy s, uint64_t device_bytes)
{
    zp_plan p = plan(c, s, device_bytes, &unit_speeds);
    if (!p.fits)
        fail_msg("%s %s on %llu bytes: the plan does not fit: %s", c->name, zp_strategy_name(s),
                 (unsigned long long)device_bytes, p.why);
    zp_job j = job_of(c);
    zp_hardware hw = cpu_machine(device_bytes);
    zp_validation v;
    if (zp_validate(&j, &hw, &p, ZP_TEST_DATA, g_dir, 1, &v) < 0)
        fail_msg("zp_validate: %s", zt_last_error());
    const zo_step_stats st = v.last;
    uint64_t dev_total = v.device_high_water;
    printf("  %-15s %-22s budget %9llu: device %9llu/%9llu pinned %9llu/%9llu host %9llu/%9llu "
           "nvme %9llu/%9llu (predicted/measured)\n",
           c->name, zp_strategy_name(s), (unsigned long long)device_bytes,
           (unsigned long long)p.peak_device, (unsigned long long)st.peak[ZO_TIER_DEVICE],
           (unsigned long long)p.peak_pinned, (unsigned long long)st.peak_pinned,
           (unsigned long long)p.peak_host, (unsigned long long)st.peak[ZO_TIER_HOST],
           (unsigned long long)p.peak_nvme, (unsigned long long)st.peak[ZO_TIER_NVME]);
    expect_close("device (engine)", p.peak_device, st.peak[ZO_TIER_DEVICE]);
    expect_close("pinned", p.peak_pinned, st.peak_pinned);
    expect_close("host", p.peak_host, st.peak[ZO_TIER_HOST]);
    expect_close("nvme", p.peak_nvme, st.peak[ZO_TIER_NVME]);
    expect_close("device total", p.device.total, dev_total);
}

/* The plan's device total with no device limit (every parameter chunk in
 * a slot) and its smallest budget (every parameter resident, or one layer's
 * parameter and gradient slots), for the chunk it picks. */
static void budgets(const job_cfg *c, zp_strategy s, uint64_t *roomy, uint64_t *minimum,
                    uint64_t *layer)
{
    zp_plan p = plan(c, s, 64ull << 30, &unit_speeds);
    *layer = (uint64_t)p.fp.max_chunks_per_layer * p.fp.chunk_bytes;
    uint64_t act = p.device.total - p.peak_device;
    *roomy = p.device.total + (4u << 20);
    *minimum = p.param_home == ZO_TIER_DEVICE ? p.device.total : act + 2 * *layer;
}

/* A budget one byte short of the smallest, with the same chunk: the plan
 * and the trainer both refuse it. */
static void check_refusal(const job_cfg *c, zp_strategy s, uint64_t minimum)
{
    zp_plan at_min = plan(c, s, minimum, &unit_speeds);
    zp_job j = job_of(c);
    j.chunk_bytes = at_min.fp.chunk_bytes;
    zp_hardware hw = cpu_machine(minimum - 1);
    zp_plan p;
    ZO_ASSERT_OK(zp_plan_strategy(&j, &hw, &unit_speeds, s, 0, &p, NULL));
    assert_false(p.fits);
    if (!strstr(p.why, "device tier"))
        fail_msg("refusal: %s", p.why);
    zt_options o = zp_trainer_options(&j, &hw, &at_min, ZP_TEST_DATA, g_dir);
    zt_trainer *t = NULL;
    assert_true(zt_trainer_init(&t, &o) < 0);
    assert_null(t);
}

static void check_job_memory(const job_cfg *c)
{
    for (int s = 0; s < ZP_N_STRATEGIES; s++) {
        uint64_t roomy, minimum, layer;
        budgets(c, (zp_strategy)s, &roomy, &minimum, &layer);
        check_memory(c, (zp_strategy)s, roomy);
        check_memory(c, (zp_strategy)s, minimum);
        if (minimum + 2 * layer < roomy) /* paged parameters: three layers of slots */
            check_memory(c, (zp_strategy)s, minimum + 2 * layer);
        check_refusal(c, (zp_strategy)s, minimum);
    }
}

static void test_memory_tiny(void **state)
{
    (void)state;
    job_cfg c = tiny_cfg(1);
    check_job_memory(&c);
    c = tiny_cfg(2); /* fp32 accumulators on the host */
    check_memory(&c, ZP_PARAMS_HOST, 256u << 20);
    check_memory(&c, ZP_OPTIM_NVME, 256u << 20);
}

/* fp32 parameters (zo-train --dtype fp32): 4-byte slots, copies and
 * extents, fp32 activations; every strategy and budget as in bf16, and with
 * host accumulators and layer-major groups. */
static void test_memory_tiny_fp32(void **state)
{
    (void)state;
    g_dtype = ZO_DTYPE_F32;
    job_cfg c = tiny_cfg(1);
    check_job_memory(&c);
    c = tiny_cfg(2);
    check_memory(&c, ZP_PARAMS_HOST, 256u << 20);
    check_memory(&c, ZP_OPTIM_NVME, 256u << 20);
    g_dtype = ZO_DTYPE_BF16;
}

/* The blocks' position-wise parts in chunks of 40 rows (ZO_MLP_CHUNK_BYTES; the last of
 * the 256 tokens 16): the plan counts one chunk's norm output, gate, up and
 * product, as the trainer allocates, under every strategy and budget. */
static void test_memory_tiny_mlp_chunks(void **state)
{
    (void)state;
    job_cfg c = tiny_cfg(1);
    char bytes[32];
    snprintf(bytes, sizeof bytes, "%d", 40 * c.shape.ffn_dim * 2);
    setenv("ZO_MLP_CHUNK_BYTES", bytes, 1);
    zt_model_config mc = {c.shape, c.seq, c.micro_batch, 1, ZO_DTYPE_BF16, 0, {0}, 0, 0};
    assert_int_equal(zt_mlp_chunk_rows(&mc), 40);
    check_job_memory(&c);
    unsetenv("ZO_MLP_CHUNK_BYTES");
}

/* zo-train's --mlp-chunk-bytes (zp_job.mlp_chunk_bytes, zt_model_config's)
 * over the environment's ZO_MLP_CHUNK_BYTES: chunks of 24 rows where the
 * environment says 40. The plan's activations are the arena's bytes at 24
 * rows exactly, not at 40; the trainer runs the plan (zp_validate carries the
 * option) with the peaks predicted, at the smallest budget of each strategy. */
static void test_memory_tiny_mlp_chunk_option(void **state)
{
    (void)state;
    job_cfg c = tiny_cfg(1);
    const uint64_t row = (uint64_t)c.shape.ffn_dim * 2;
    char env[32];
    snprintf(env, sizeof env, "%llu", (unsigned long long)(40 * row));
    setenv("ZO_MLP_CHUNK_BYTES", env, 1);
    g_mlp_chunk = 24 * row;
    zt_model_config mc = {c.shape, c.seq, c.micro_batch, 1, ZO_DTYPE_BF16, 0, {0}, 0, 24 * row};
    assert_int_equal(zt_mlp_chunk_rows(&mc), 24);
    const uint64_t want = zt_model_activation_bytes(&mc);
    mc.mlp_chunk_bytes = 0;
    assert_int_equal(zt_mlp_chunk_rows(&mc), 40);
    assert_true(zt_model_activation_bytes(&mc) > want);
    zp_plan p = plan(&c, ZP_NO_OFFLOAD, 64ull << 30, &unit_speeds);
    assert_int_equal(p.device.inputs + p.device.checkpoints + p.device.workspace, want);
    for (int s = 0; s < ZP_N_STRATEGIES; s++) {
        uint64_t roomy, minimum, layer;
        budgets(&c, (zp_strategy)s, &roomy, &minimum, &layer);
        check_memory(&c, (zp_strategy)s, minimum);
    }
    g_mlp_chunk = 0;
    unsetenv("ZO_MLP_CHUNK_BYTES");
}

static void test_memory_small(void **state)
{
    (void)state;
    job_cfg c = small_cfg();
    check_job_memory(&c);
}

/* The optimizer's NVMe time is its bytes at the update pipeline's rate
 * when one is known; without it, from the read and write rates. */
/* An assumed speed says why: a GPU plan under --measure names the missing
 * --nvme-path on the NVMe figures only; the layers' rate taken from the
 * matmul rate carries the note --measure left when it could not time them. */
static void test_assumed_speed_sources(void **state)
{
    (void)state;
    zp_speeds sp = {0};
    zp_speed_sources src = {0};
    zp_assume_speeds("cuda", 1, &sp, &src);
    assert_string_equal(src.what[ZP_SPEED_NVME_READ],
                        "assumed: one Gen4 NVMe drive (--measure needs --nvme-path to measure it)");
    assert_string_equal(src.what[ZP_SPEED_NVME_WRITE], src.what[ZP_SPEED_NVME_READ]);
    assert_string_equal(src.what[ZP_SPEED_H2D], "assumed: PCIe Gen4 x16");
    memset(&sp, 0, sizeof sp);
    memset(&src, 0, sizeof src);
    zp_assume_speeds("cuda", 0, &sp, &src);
    assert_string_equal(src.what[ZP_SPEED_NVME_READ], "assumed: one Gen4 NVMe drive");
    assert_string_equal(src.what[ZP_SPEED_MODEL_FLOPS],
                        "the matmul rate (assumed: A100-class bf16)");
    memset(&sp, 0, sizeof sp);
    memset(&src, 0, sizeof src);
    sp.flops = 2e11;
    snprintf(src.what[ZP_SPEED_FLOPS], sizeof src.what[0], "measured");
    snprintf(src.what[ZP_SPEED_MODEL_FLOPS], sizeof src.what[0], "layers too large to time here");
    zp_assume_speeds("cpu", 1, &sp, &src);
    assert_true(sp.model_flops == 2e11);
    assert_string_equal(src.what[ZP_SPEED_MODEL_FLOPS],
                        "the matmul rate (measured): layers too large to time here");
    assert_string_equal(src.what[ZP_SPEED_NVME_READ],
                        "assumed for the cpu device (--measure needs --nvme-path to measure it)");
}

static void test_update_rate_drives_nvme_time(void **state)
{
    (void)state;
    job_cfg c = tiny_cfg(1);
    zp_speeds sp = unit_speeds;
    sp.nvme_read = 3e9, sp.nvme_write = 2e9;
    zp_plan derived = plan(&c, ZP_OPTIM_NVME, 64ull << 20, &sp);
    double bytes = (double)derived.nvme_read_bytes + (double)derived.nvme_write_bytes;
    assert_true(derived.nvme_read_bytes == derived.nvme_write_bytes && bytes > 0);
    /* reads and writes overlap, no faster together than the faster alone */
    assert_true(fabs(derived.seconds[ZP_BN_NVME] - bytes / 3e9) < 1e-12);
    sp.nvme_update = 1.25e9;
    zp_plan measured = plan(&c, ZP_OPTIM_NVME, 64ull << 20, &sp);
    assert_true(fabs(measured.seconds[ZP_BN_NVME] - bytes / 1.25e9) < 1e-12);
    assert_true(measured.step_seconds > derived.step_seconds);
    zp_plan host = plan(&c, ZP_OPTIM_HOST, 64ull << 20, &sp);
    assert_true(host.seconds[ZP_BN_NVME] == 0);
}

/* The update behind the next forward (zo-train's default, sync mode, states
 * on NVMe, parameters on NVMe or the host): the step is shorter by at most
 * the forward it hides under, and only where the engine takes it. */
static zp_plan plan_job(const zp_job *j, const char *backend, zp_strategy s, const zp_speeds *sp)
{
    zp_hardware hw = cpu_machine(64ull << 20);
    snprintf(hw.backend, sizeof hw.backend, "%s", backend);
    zp_plan p;
    if (zp_plan_strategy(j, &hw, sp, s, 0, &p, NULL) < 0)
        fail_msg("zp_plan_strategy: %s", zt_last_error());
    return p;
}

static double behind_saving(zp_job j, const char *backend, zp_strategy s, const zp_speeds *sp,
                            double *compute)
{
    zp_plan on = plan_job(&j, backend, s, sp);
    j.no_update_behind = 1;
    zp_plan off = plan_job(&j, backend, s, sp);
    assert_true(on.seconds[ZP_BN_NVME] == off.seconds[ZP_BN_NVME]);
    *compute = on.seconds[ZP_BN_COMPUTE];
    return off.step_seconds - on.step_seconds;
}

static void test_update_behind_step_time(void **state)
{
    (void)state;
    job_cfg c = tiny_cfg(1);
    zp_speeds sp = unit_speeds;
    /* a disk fast enough for the update's traffic to fit beside the
     * forward's own reads (a slower one bounds the step and the update
     * behind hides nothing of it: test_update_behind_shares_the_disk) */
    sp.nvme_read = sp.nvme_write = 2e9;
    const char *backends[] = {"cpu", "cuda"};
    for (int b = 0; b < 2; b++) {
        zp_job j = job_of(&c);
        double compute;
        double saved = behind_saving(j, backends[b], ZP_PARAMS_NVME, &sp, &compute);
        assert_true(saved > 0);
        assert_true(saved <= compute / 3 + 1e-12); /* the forward is a third of the model's */
        /* not taken: device-resident parameters, overlap mode, fp16, ZeRO */
        assert_true(behind_saving(j, backends[b], ZP_OPTIM_NVME, &sp, &compute) == 0);
        j.mode = ZO_OPTIM_OVERLAP;
        assert_true(behind_saving(j, backends[b], ZP_PARAMS_NVME, &sp, &compute) == 0);
        j = job_of(&c);
        j.dtype = ZO_DTYPE_F16;
        assert_true(behind_saving(j, backends[b], ZP_PARAMS_NVME, &sp, &compute) == 0);
    }
}

/* One disk carries the parameters' reads and the update's states: with a
 * disk slow enough to bound the step, the update behind the forward hides
 * nothing of it, and the forward's window holds its own reads and the
 * update's traffic one after the other (zo-plan predicted such steps 13-33%
 * too fast when the update's disk time overlapped the forward's reads). */
static void test_update_behind_shares_the_disk(void **state)
{
    (void)state;
    job_cfg c = tiny_cfg(1);
    zp_speeds sp = unit_speeds;
    sp.nvme_read = sp.nvme_write = 2e6;
    const char *backends[] = {"cpu", "cuda"};
    for (int b = 0; b < 2; b++) {
        zp_job j = job_of(&c);
        zp_plan on = plan_job(&j, backends[b], ZP_PARAMS_NVME, &sp);
        assert_true(on.seconds[ZP_BN_NVME] > 10 * on.seconds[ZP_BN_COMPUTE]);
        assert_true(on.step_seconds >= on.seconds[ZP_BN_NVME]);
        j.no_update_behind = 1;
        zp_plan off = plan_job(&j, backends[b], ZP_PARAMS_NVME, &sp);
        assert_true(on.step_seconds <= off.step_seconds * (1 + 1e-12));
    }
    zp_behind_times t = {.fb = 1.0, .fwd = 0.3, .optim = 0.1, .nvme_optim = 0.4, .nvme_fetch = 0.6};
    /* the forward's window: its 0.3 s of reads, then the update's 0.4 s */
    assert_true(fabs(zp_behind_step_seconds(&t, 4, 0) - (1.0 - 0.3 + 0.7)) < 1e-12);
    t.nvme_fetch = 0; /* parameters on the host: the update's own time */
    assert_true(fabs(zp_behind_step_seconds(&t, 4, 0) - (1.0 - 0.3 + 0.4)) < 1e-12);
}

/* The small preset itself, every placement at the roomy and the smallest
 * budget (label slow: about a minute here; the NVMe placements write 8 GiB
 * of states and are skipped, saying so, where the disk has less free). */
static void test_memory_small_preset(void **state)
{
    (void)state;
    job_cfg c = small_full_cfg();
    struct statvfs vfs;
    uint64_t free_bytes = statvfs(g_dir, &vfs) == 0 ? (uint64_t)vfs.f_bavail * vfs.f_frsize : 0;
    for (int s = 0; s < ZP_N_STRATEGIES; s++) {
        uint64_t roomy, minimum, layer;
        budgets(&c, (zp_strategy)s, &roomy, &minimum, &layer);
        zp_plan p = plan(&c, (zp_strategy)s, roomy, &unit_speeds);
        if (p.nvme.files + (1ull << 30) > free_bytes) {
            printf("  skipped %s: its swap files need %llu bytes, %s has %llu free\n",
                   zp_strategy_name((zp_strategy)s), (unsigned long long)p.nvme.files, g_dir,
                   (unsigned long long)free_bytes);
            continue;
        }
        check_memory(&c, (zp_strategy)s, roomy);
        check_memory(&c, (zp_strategy)s, minimum);
        check_refusal(&c, (zp_strategy)s, minimum);
    }
}

/* ---- time ---- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static zp_speeds measure(const job_cfg *c, uint64_t device_bytes, const zp_speeds *have)
{
    zp_job j = job_of(c);
    zp_hardware hw = cpu_machine(device_bytes);
    zp_speeds sp = *have;
    zp_speed_sources src;
    memset(&src, 0, sizeof src);
    if (zp_measure(&hw, &j, g_dir, &sp, &src, NULL) < 0)
        fail_msg("zp_measure: %s", zt_last_error());
    return sp;
}

/* Every speed is measured again just before each run, for that job (the
 * NVMe extents are the job's; the load and the disk's rate drift). */
static double check_time(const job_cfg *c, zp_strategy s)
{
    uint64_t roomy, minimum, layer;
    budgets(c, s, &roomy, &minimum, &layer);
    zp_speeds none = {0};
    zp_speeds now = measure(c, roomy, &none);
    zp_plan p = plan(c, s, roomy, &now);
    assert_true(p.fits);
    zp_job j = job_of(c);
    zp_hardware hw = cpu_machine(roomy);
    zp_validation v;
    /* the median of 7 steps after the first where steps are short, else of 3 */
    int steps = p.step_seconds < 1.0 ? 8 : 4;
    if (zp_validate(&j, &hw, &p, ZP_TEST_DATA, g_dir, steps, &v) < 0)
        fail_msg("zp_validate: %s", zt_last_error());
    double m = v.step_seconds;
    printf("  %-15s %-22s predicted %.4f s (compute %.4f, nvme %.4f; %s), measured %.4f s: "
           "error %+.1f%%\n",
           c->name, zp_strategy_name(s), p.step_seconds, p.seconds[ZP_BN_COMPUTE],
           p.seconds[ZP_BN_NVME], zp_bottleneck_name(p.bottleneck), m,
           100 * (p.step_seconds - m) / m);
    printf("  %-15s %-22s   speeds: nvme read %.2f / write %.2f / update %.2f GB/s, Adam %.3f "
           "Gparams/s, layers %.1f GFLOPS\n",
           "", "", now.nvme_read / 1e9, now.nvme_write / 1e9, now.nvme_update / 1e9,
           now.adam_params / 1e9, now.model_flops / 1e9);
    printf("  %-15s %-22s   last step: optimizer busy %.4f s (predicted %.4f), NVMe waits %.4f s, "
           "moved %.3f GB (predicted %.3f)\n",
           "", "", v.last.optim_seconds, p.seconds[ZP_BN_OPTIM], v.last.nvme_seconds,
           (double)(v.last.nvme_read_bytes + v.last.nvme_write_bytes) / 1e9,
           (double)(p.nvme_read_bytes + p.nvme_write_bytes) / 1e9);
    return rel_err(p.step_seconds, m);
}

static void test_time(void **state)
{
    (void)state;
    double err[ZP_N_STRATEGIES + 6];
    int n = 0;
    job_cfg tiny = tiny_cfg(1), small = small_cfg(), full = small_full_cfg();
    for (int s = 0; s < ZP_N_STRATEGIES; s++)
        err[n++] = check_time(&tiny, (zp_strategy)s);
    err[n++] = check_time(&small, ZP_PARAMS_HOST);
    err[n++] = check_time(&small, ZP_OPTIM_NVME);
    for (int s = ZP_OPTIM_HOST; s < ZP_N_STRATEGIES; s++)
        err[n++] = check_time(&full, (zp_strategy)s);
    qsort(err, (size_t)n, sizeof *err, cmp_double);
    printf("  step-time error: median %.1f%%, largest %.1f%%\n", 100 * err[n / 2],
           100 * err[n - 1]);
    assert_true(err[n / 2] < TIME_MEDIAN_BOUND);
    assert_true(err[n - 1] < TIME_ANY_BOUND);
}

/* ---- a 70B model ---- */

static zp_hardware gpu_machine(void)
{
    zp_hardware hw = {"cuda",     "planned", 80ull << 30, ZT_CUDA_RESERVE,
                      1ull << 40, 0,         8ull << 40,  2};
    return hw;
}

static uint64_t plan_all_work(const zt_shape *s, zp_plan plans[ZP_N_STRATEGIES])
{
    zp_job j = {.shape = *s,
                .seq = 4096,
                .micro_batch = 1,
                .grad_accum = 1,
                .dtype = ZO_DTYPE_BF16,
                .mode = ZO_OPTIM_SYNC,
                .act_home = ZP_ACT_AUTO,
                .state_dtype = ZO_DTYPE_F32};
    zp_hardware hw = gpu_machine();
    zp_speeds sp = {25e9, 25e9, 6e9, 5e9, 2e9, 900e12, 600e12, 0, 0, 0};
    uint64_t work = 0;
    for (int k = 0; k < ZP_N_STRATEGIES; k++)
        if (zp_plan_strategy(&j, &hw, &sp, (zp_strategy)k, 1200e12, &plans[k], &work) < 0)
            fail_msg("zp_plan_strategy: %s", zt_last_error());
    return work;
}

static const zt_shape llama70 = {32000, 8192, 80, 64,  28672, 1e-5f, 10000.0f, 0,
                                 0,     0,    0,  {0}, 0,     0,     0};

static void test_70b_work_does_not_grow_with_size(void **state)
{
    (void)state;
    zp_plan big[ZP_N_STRATEGIES], narrow[ZP_N_STRATEGIES];
    uint64_t w70 = plan_all_work(&llama70, big);
    /* the same layers and tensors, each 1/64 the size */
    zt_shape s = {4000, 1024, 80, 8, 3584, 1e-5f, 10000.0f, 0, 0, 0, 0, {0}, 0, 0, 0};
    uint64_t w1 = plan_all_work(&s, narrow);
    printf("  70B: %llu work units; the same structure at 1/64 the size: %llu\n",
           (unsigned long long)w70, (unsigned long long)w1);
    /* work: the tensors packed, and per fetch of the step's order at most a
     * layer's chunks each scanning the slots (both strategies' chunk sizes) */
    for (int k = 0; k < ZP_N_STRATEGIES; k++) {
        uint64_t E = (uint64_t)llama70.n_layers + 2, N = big[k].fp.n_chunks;
        uint64_t bound = 2 * (9 * E + 3 * (2 * E - 1) * big[k].fp.max_chunks_per_layer * N);
        assert_true(w70 <= ZP_N_STRATEGIES * bound);
    }
    assert_true((double)w70 < 1e-4 * (double)zt_shape_n_params(&llama70));
    /* sanity of the figures: 78.3B parameters (multi-head attention) */
    assert_int_equal(big[0].fp.n_params, zt_shape_n_params(&llama70));
    assert_true(big[ZP_NO_OFFLOAD].supported); /* the device's Adam op, fp32 states */
    assert_false(big[ZP_NO_OFFLOAD].fits);     /* 78B parameters' states on 80 GB */
    assert_false(big[ZP_OPTIM_HOST].fits);     /* 157 GB of 16-bit parameters on 80 GB */
    /* parameters and optimizer on the host: 16-bit params and grads pinned, 12 B/param pageable */
    assert_true(big[ZP_PARAMS_HOST].host.states >= 12 * big[0].fp.n_params);
    assert_true(big[ZP_PARAMS_HOST].pinned.total >= 4 * big[0].fp.n_params);
}

static void test_70b_allocates_nothing_in_proportion(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    skip(); /* sanitizers reserve terabytes of shadow address space */
#endif
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        FILE *f = fopen("/proc/self/statm", "r");
        unsigned long pages = 0;
        if (!f || fscanf(f, "%lu", &pages) != 1)
            _exit(3);
        fclose(f);
        struct rlimit rl;
        rl.rlim_cur = rl.rlim_max = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (512ul << 20);
        if (setrlimit(RLIMIT_AS, &rl) != 0)
            _exit(4);
        zp_plan plans[ZP_N_STRATEGIES];
        plan_all_work(&llama70, plans);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* "time" runs the step-time comparison (label timing); "small" the memory
 * check of the small preset itself (label slow); anything else, the
 * memory and 70B tests. */
/* A sliding window's layers cost their share of attention: the layers'
 * FLOPs sum to the model's (and to the device's with the recompute), a
 * windowed block costs less than a full one, and a window as long as the
 * sequence is no window. */
static void test_window_flops_per_layer(void **state)
{
    (void)state;
    job_cfg c = small_full_cfg();
    c.seq = 2048;
    zp_job j = job_of(&c);
    const double full = zp_model_flops_per_token(&j);
    j.shape.window = 256;
    j.shape.window_from = 3;
    double sum_m = 0, sum_d = 0, m, d, m_full = 0, m_win = 0;
    for (int l = 0; l < zt_engine_layers(&j.shape); l++) {
        zp_layer_flops_per_token(&j, l, &m, &d);
        sum_m += m;
        sum_d += d;
        if (l == 1)
            m_full = m;
        if (l == 4)
            m_win = m;
    }
    assert_true(fabs(sum_m - zt_shape_flops_per_token(&j.shape, j.seq)) <= 1e-9 * sum_m);
    assert_true(fabs(sum_d - zp_device_flops_per_token(&j)) <= 1e-9 * sum_d);
    assert_true(m_win < m_full);
    assert_true(zp_model_flops_per_token(&j) < full);
    j.shape.window = j.seq;
    assert_true(fabs(zp_model_flops_per_token(&j) - full) <= 1e-12 * full);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest memory[] = {
        cmocka_unit_test(test_memory_tiny),
        cmocka_unit_test(test_memory_tiny_fp32),
        cmocka_unit_test(test_memory_tiny_mlp_chunks),
        cmocka_unit_test(test_memory_tiny_mlp_chunk_option),
        cmocka_unit_test(test_memory_small),
        cmocka_unit_test(test_update_rate_drives_nvme_time),
        cmocka_unit_test(test_update_behind_step_time),
        cmocka_unit_test(test_update_behind_shares_the_disk),
        cmocka_unit_test(test_assumed_speed_sources),
        cmocka_unit_test(test_70b_work_does_not_grow_with_size),
        cmocka_unit_test(test_70b_allocates_nothing_in_proportion),
        cmocka_unit_test(test_window_flops_per_layer),
    };
    const struct CMUnitTest time[] = {cmocka_unit_test(test_time)};
    const struct CMUnitTest small[] = {cmocka_unit_test(test_memory_small_preset)};
    if (argc > 1 && strcmp(argv[1], "time") == 0)
        return cmocka_run_group_tests(time, plan_test_make_dir, plan_test_remove_dir);
    if (argc > 1 && strcmp(argv[1], "small") == 0)
        return cmocka_run_group_tests(small, plan_test_make_dir, plan_test_remove_dir);
    return cmocka_run_group_tests(memory, plan_test_make_dir, plan_test_remove_dir);
}
