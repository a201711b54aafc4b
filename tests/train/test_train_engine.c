/* zo-train through the engine on the cpu device.
 *
 * - Bitwise equality: 20 optimizer steps (2 micro-batches each, clipping
 *   active on the early steps) of a small model give the same per-step losses
 *   and the same final fp32 master weights with everything on the device,
 *   with the optimizer on the host, with the optimizer on NVMe and the
 *   parameters paged from the host, with the parameters on NVMe too, and with
 *   the smallest device budget that fits, in sync and overlap modes. Each
 *   placement is also checked to have done what it says (bytes over the
 *   links it should use, the budget it was given). With the dense and the
 *   fused attention op each.
 * - An NVMe error injected during a step fails the step with the weights
 *   kept; the retried step continues the run bitwise as if nothing happened.
 * - fp16 with dynamic loss scaling: sync and overlap agree bitwise too (an
 *   overflow skips the update in both), and the losses stay finite.
 * - The loss decreases on the shipped corpus.
 * - Errors: a budget that cannot hold the activations, a token file whose
 *   vocabulary exceeds the model's, a missing data file. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train_test_util.h"
#include "trainer.h"
#include "zo/engine_testing.h"
#include "zo_test.h"
#include "zt_error.h"

#define STEPS 20

static char g_swap[256];

static zt_options small_options(void)
{
    zt_options o = zt_test_small_options(g_swap, STEPS);
    o.grad_accum = 2;
    o.chunk_bytes = 16u << 10; /* several chunks per block */
    return o;
}

typedef struct run_result {
    float losses[STEPS];
    float **weights; /* [layer][idx] */
    uint64_t h2d_after_first, nvme_bytes;
    uint64_t device_high_water, device_budget;
    int clipped, overflows, rollbacks;
    double val_loss;
    uint32_t param_homes[3], optim_homes[3]; /* chunks homed at each tier */
    uint64_t chunk_bytes;
    uint32_t n_chunks;
} run_result;

static void run_free(run_result *r, const zt_shape *s)
{
    for (int l = 0; r->weights && l < zt_engine_layers(s); l++) {
        for (int i = 0; i < zt_layer_tensors(s, l); i++)
            free(r->weights[(size_t)l * ZT_MAX_LAYER_TENSORS + i]);
    }
    free(r->weights);
}

static void read_all_weights(zt_trainer *t, const zt_shape *s, run_result *r)
{
    r->weights = calloc((size_t)zt_engine_layers(s) * ZT_MAX_LAYER_TENSORS, sizeof *r->weights);
    assert_non_null(r->weights);
    for (int l = 0; l < zt_engine_layers(s); l++)
        for (int i = 0; i < zt_layer_tensors(s, l); i++) {
            float *w = malloc(zt_tensor_numel(s, l, i) * sizeof *w);
            assert_non_null(w);
            ZO_ASSERT_OK(zt_trainer_read_weights(t, l, i, w));
            r->weights[(size_t)l * ZT_MAX_LAYER_TENSORS + i] = w;
        }
}

static void train_run(const zt_options *o, run_result *r)
{
    memset(r, 0, sizeof *r);
    zt_trainer *t = NULL;
    zo_status st = zt_trainer_init(&t, o);
    if (st < 0)
        fail_msg("zt_trainer_init: %s", zt_last_error());
    const zt_setup *su = zt_trainer_setup(t);
    r->device_budget = su->device_budget;
    memcpy(r->param_homes, su->param_homes, sizeof r->param_homes);
    memcpy(r->optim_homes, su->optim_homes, sizeof r->optim_homes);
    r->chunk_bytes = su->footprint.chunk_bytes;
    r->n_chunks = su->footprint.n_chunks;
    for (int i = 0; i < STEPS; i++) {
        zo_step_stats s;
        st = zt_trainer_step(t, &r->losses[i], &s);
        if (st < 0)
            fail_msg("step %d: %s", i, zt_last_error());
        if (i > 0)
            r->h2d_after_first += s.h2d_bytes;
        r->nvme_bytes += s.nvme_read_bytes + s.nvme_write_bytes;
        r->clipped += s.clipped;
        r->overflows += s.overflow;
        r->rollbacks += s.rollbacks;
        if (getenv("ZT_DEBUG")) /* the per-step picture, when a case fails */
            print_message("step %d loss %.4f clipped %d overflow %d rollbacks %d scale %g h2d %llu "
                          "nvme %llu\n",
                          i, (double)r->losses[i], s.clipped, s.overflow, s.rollbacks, s.loss_scale,
                          (unsigned long long)s.h2d_bytes,
                          (unsigned long long)(s.nvme_read_bytes + s.nvme_write_bytes));
    }
    uint64_t n_tok;
    ZO_ASSERT_OK(zt_trainer_validate(t, &r->val_loss, &n_tok));
    assert_true(n_tok > 0);
    read_all_weights(t, &o->shape, r);
    r->device_high_water = zt_trainer_device_high_water(t);
    zt_trainer_free(t);
}

static void assert_same_run(const run_result *a, const run_result *b, const zt_shape *s,
                            const char *what)
{
    for (int i = 0; i < STEPS; i++)
        if (memcmp(&a->losses[i], &b->losses[i], sizeof(float)) != 0)
            fail_msg("%s: step %d loss %.9g differs from the reference's %.9g", what, i,
                     (double)b->losses[i], (double)a->losses[i]);
    for (int l = 0; l < zt_engine_layers(s); l++)
        for (int i = 0; i < zt_layer_tensors(s, l); i++) {
            size_t k = (size_t)l * ZT_MAX_LAYER_TENSORS + i;
            if (memcmp(a->weights[k], b->weights[k], zt_tensor_numel(s, l, i) * sizeof(float)) != 0)
                fail_msg("%s: final weights of layer %d tensor %d differ from the reference's",
                         what, l, i);
        }
}

/* Every placement and mode against all on the device, sync, with the dense
 * or the fused attention op. */
static void check_placements(int flash)
{
    const zo_optim_mode modes[] = {ZO_OPTIM_SYNC, ZO_OPTIM_OVERLAP};
    zt_options base = small_options();
    base.flash_attention = flash;
    base.param_home = ZO_TIER_DEVICE;
    base.optim_home = ZO_TIER_DEVICE;
    run_result ref;
    train_run(&base, &ref);
    assert_true(ref.clipped > 0); /* the overlap runs must roll back clipped steps */
    assert_int_equal(ref.nvme_bytes, 0);
    for (int mi = 0; mi < 2; mi++) {
        struct {
            const char *name;
            int param, optim, smallest;
        } cases[] = {
            {"all on device", ZO_TIER_DEVICE, ZO_TIER_DEVICE, 0},
            {"optimizer on host", ZO_TIER_DEVICE, ZO_TIER_HOST, 0},
            {"optimizer on nvme, params on host", ZO_TIER_HOST, ZO_TIER_NVME, 0},
            {"optimizer and params on nvme, smallest device budget", ZO_TIER_NVME, ZO_TIER_NVME, 1},
            {"smallest device budget, params and optimizer on host", ZO_TIER_HOST, ZO_TIER_HOST, 1},
        };
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            if (mi == 0 && c == 0)
                continue; /* the reference itself */
            zt_options o = base;
            o.mode = modes[mi];
            o.param_home = cases[c].param;
            o.optim_home = cases[c].optim;
            if (cases[c].smallest)
                o.device_mem = zt_test_smallest_budget(o);
            char what[160];
            snprintf(what, sizeof what, "%s (%s, %s)", cases[c].name, zo_optim_mode_name(o.mode),
                     flash ? "flash" : "dense");
            run_result r;
            train_run(&o, &r);
            assert_same_run(&ref, &r, &o.shape, what);
            if (o.optim_home == ZO_TIER_NVME)
                assert_true(r.nvme_bytes > 0);
            else
                assert_int_equal(r.nvme_bytes, 0);
            if (o.param_home != ZO_TIER_DEVICE && cases[c].smallest)
                assert_true(r.h2d_after_first > 0);
            if (o.mode == ZO_OPTIM_OVERLAP)
                assert_true(r.rollbacks > 0); /* the clipped steps were redone */
            assert_true(r.device_high_water <= r.device_budget);
            run_free(&r, &o.shape);
        }
    }
    run_free(&ref, &base.shape);
}

/* The optimizer on the device (--offload-optimizer none) on a strict cpu
 * device (ZO_CPU_DEVICE_STRICT=1), whose memory faults when the host touches
 * it as a GPU's would: the trainer and the engine update it with the
 * device's Adam op and read nothing of it on the host, and the run equals
 * the optimizer on the host bit for bit, in sync and overlap modes. */
static void test_device_optimizer_on_a_strict_device(void **state)
{
    (void)state;
    zt_options o = small_options();
    o.param_home = ZO_TIER_DEVICE;
    o.optim_home = ZO_TIER_HOST;
    run_result ref;
    train_run(&o, &ref);
    assert_true(ref.clipped > 0);
    setenv("ZO_CPU_DEVICE_STRICT", "1", 1);
    const zo_optim_mode modes[] = {ZO_OPTIM_SYNC, ZO_OPTIM_OVERLAP};
    for (int mi = 0; mi < 2; mi++) {
        o.optim_home = ZO_TIER_DEVICE;
        o.mode = modes[mi];
        run_result r;
        train_run(&o, &r);
        assert_same_run(&ref, &r, &o.shape, zo_optim_mode_name(o.mode));
        if (o.mode == ZO_OPTIM_OVERLAP)
            assert_true(r.rollbacks > 0); /* the clipped steps were redone on the device */
        assert_true(r.device_high_water <= r.device_budget);
        run_free(&r, &o.shape);
    }
    unsetenv("ZO_CPU_DEVICE_STRICT");
    run_free(&ref, &o.shape);
}

/* The blocks' position-wise parts in chunks of 7 rows (ZO_MLP_CHUNK_BYTES; 32 tokens per
 * micro-batch: the last chunk 4): the parameters and the optimizer on NVMe
 * at the smallest device budget train bitwise like everything on the
 * device, in sync and overlap modes; the chunking is the job's, not the
 * placement's. */
static void test_placements_are_bitwise_with_mlp_chunks(void **state)
{
    zt_options base = small_options();
    char bytes[32];
    snprintf(bytes, sizeof bytes, "%d", 7 * base.shape.ffn_dim * 2);
    setenv("ZO_MLP_CHUNK_BYTES", bytes, 1);
    base.param_home = ZO_TIER_DEVICE;
    base.optim_home = ZO_TIER_DEVICE;
    run_result ref;
    train_run(&base, &ref);
    const zo_optim_mode modes[] = {ZO_OPTIM_SYNC, ZO_OPTIM_OVERLAP};
    for (int mi = 0; mi < 2; mi++) {
        zt_options o = base;
        o.mode = modes[mi];
        o.param_home = ZO_TIER_NVME;
        o.optim_home = ZO_TIER_NVME;
        o.device_mem = zt_test_smallest_budget(o);
        run_result r;
        train_run(&o, &r);
        assert_same_run(&ref, &r, &o.shape, zo_optim_mode_name(o.mode));
        assert_true(r.nvme_bytes > 0 && r.h2d_after_first > 0);
        assert_true(r.device_high_water <= r.device_budget);
        run_free(&r, &o.shape);
    }
    unsetenv("ZO_MLP_CHUNK_BYTES");
    run_free(&ref, &base.shape);
}

static void test_placements_are_bitwise_identical(void **state)
{
    check_placements(0);
}

/* The fused attention op (zo-train's default) keeps the bits across
 * placements and modes too: its tiles are summed in a fixed order. */
static void test_flash_placements_are_bitwise_identical(void **state)
{
    check_placements(1);
    zt_options o = small_options(); /* and it is the fused op that ran: not dense's bits */
    run_result dense, flash;
    o.flash_attention = 0;
    train_run(&o, &dense);
    o.flash_attention = 1;
    train_run(&o, &flash);
    assert_true(memcmp(dense.losses, flash.losses, sizeof dense.losses) != 0);
    run_free(&dense, &o.shape);
    run_free(&flash, &o.shape);
}

/* Per-chunk homes through zo-train: states split between host and NVMe,
 * parameters too, and --placement auto, train bitwise like all-NVMe (sync
 * and dpu); the homes are what the caps say. */
static void test_split_homes_equal_all_nvme(void **state)
{
    (void)state;
    for (int dpu = 0; dpu < 2; dpu++) {
        zt_options base = small_options();
        base.mode = dpu ? ZO_OPTIM_DPU : ZO_OPTIM_SYNC;
        base.param_home = ZO_TIER_NVME;
        base.optim_home = ZO_TIER_NVME;
        run_result ref;
        train_run(&base, &ref);
        uint32_t n = ref.n_chunks;
        assert_int_equal(ref.optim_homes[ZO_TIER_NVME], n);
        zt_options a = base; /* half the states on the host, a third of the parameters */
        a.optim_caps.bytes[ZO_TIER_HOST] = n / 2 * 6 * ref.chunk_bytes;
        a.param_caps.bytes[ZO_TIER_HOST] = (n / 2 + n / 3) * ref.chunk_bytes;
        zt_options b = base; /* --placement auto: the default host limit holds it all */
        b.placement_auto = 1;
        const zt_options *cases[2] = {&a, &b};
        for (int c = 0; c < 2; c++) {
            run_result r;
            train_run(cases[c], &r);
            assert_same_run(&ref, &r, &base.shape, c ? "placement auto" : "split homes");
            uint32_t host_states = c ? n : n / 2, host_params = c ? n : n / 2 + n / 3;
            assert_int_equal(r.optim_homes[ZO_TIER_HOST], host_states);
            assert_int_equal(r.optim_homes[ZO_TIER_NVME], n - host_states);
            assert_int_equal(r.param_homes[ZO_TIER_HOST], host_params);
            assert_int_equal(r.param_homes[ZO_TIER_NVME], n - host_params);
            run_free(&r, &base.shape);
        }
        run_free(&ref, &base.shape);
    }
}

/* Run STEPS steps; at step fail_at, arm an EIO on the optimizer's swap store
 * at request k (for each k), expect the step to fail with the weights kept,
 * disarm and retry. */
static void train_with_faults(const zt_options *o, int fail_at, run_result *r)
{
    memset(r, 0, sizeof *r);
    zt_trainer *t = NULL;
    ZO_ASSERT_OK(zt_trainer_init(&t, o));
    const zt_shape *s = &o->shape;
    for (int i = 0; i < STEPS; i++) {
        zo_step_stats st;
        for (uint64_t k = 0; i == fail_at && k < 20; k += 7) {
            run_result before, after;
            read_all_weights(t, s, &before);
            zo_swap_fault f = {ZO_SWAP_FAULT_EIO, k, 0};
            ZO_ASSERT_OK(zo_swap_set_faults(zo_engine_nvme_store(zt_trainer_engine(t)), &f, 1));
            assert_int_equal(zt_trainer_step(t, &r->losses[i], &st), ZO_ERR_IO);
            read_all_weights(t, s, &after);
            for (int l = 0; l < zt_engine_layers(s); l++)
                for (int j = 0; j < zt_layer_tensors(s, l); j++) {
                    size_t x = (size_t)l * ZT_MAX_LAYER_TENSORS + j;
                    assert_memory_equal(before.weights[x], after.weights[x],
                                        zt_tensor_numel(s, l, j) * sizeof(float));
                }
            run_free(&before, s);
            run_free(&after, s);
            ZO_ASSERT_OK(zo_swap_set_faults(zo_engine_nvme_store(zt_trainer_engine(t)), NULL, 0));
        }
        ZO_ASSERT_OK(zt_trainer_step(t, &r->losses[i], &st));
    }
    read_all_weights(t, s, r);
    zt_trainer_free(t);
}

/* An NVMe error during a step fails that step, keeps the weights, and the
 * retried step continues the run exactly as if nothing had happened. */
static void test_nvme_fault_then_retry_equals_clean_run(void **state)
{
    const zo_swap_fault never = {ZO_SWAP_FAULT_EIO, UINT64_MAX, 0}; /* arms the fault engine */
    for (int m = 0; m < 2; m++) {
        zt_options o = small_options();
        o.param_home = ZO_TIER_HOST;
        o.optim_home = ZO_TIER_NVME;
        o.mode = m ? ZO_OPTIM_OVERLAP : ZO_OPTIM_SYNC;
        /* the update in end_step, so that a fault fails the step it is armed in (behind
         * the next forward it fails the next: test_engine_faults, test_train_resume) */
        o.update_behind = 0;
        run_result clean, faulty;
        train_run(&o, &clean);
        o.nvme_faults = &never;
        o.n_nvme_faults = 1;
        o.arm_engine_faults = zo_engine_set_swap_faults;
        train_with_faults(&o, 5, &faulty);
        assert_same_run(&clean, &faulty, &o.shape,
                        m ? "retried after faults (overlap)" : "retried after faults (sync)");
        run_free(&clean, &o.shape);
        run_free(&faulty, &o.shape);
    }
}

static void test_fp16_overlap_equals_sync(void **state)
{
    zt_options o = small_options();
    o.dtype = ZO_DTYPE_F16;
    o.loss_scaler.initial_scale_power = 20; /* high enough that the first steps overflow */
    o.param_home = ZO_TIER_HOST;
    o.optim_home = ZO_TIER_HOST;
    run_result a, b;
    train_run(&o, &a);
    o.mode = ZO_OPTIM_OVERLAP;
    train_run(&o, &b);
    assert_same_run(&a, &b, &o.shape, "fp16 overlap vs sync");
    assert_true(a.overflows > 0); /* the initial scale overflows, then adapts */
    assert_true(a.overflows < STEPS / 2);
    for (int i = 0; i < STEPS; i++)
        assert_true(isfinite(a.losses[i]));
    assert_true(a.losses[STEPS - 1] < a.losses[0]);
    run_free(&a, &o.shape);
    run_free(&b, &o.shape);
}

static double mean(const float *x, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += x[i];
    return s / n;
}

/* 20 steps at a high learning rate on the corpus: the byte-level loss starts
 * at ln 256 = 5.55 and the last ten steps average well below it. */
static void test_loss_decreases_on_the_corpus(void **state)
{
    zt_options o = small_options();
    o.shape = (zt_shape){256, 64, 2, 4, 192, 1e-5f, 10000.0f, 0, 0, 0, 0, {0}, 0, 0, 0};
    o.seq = 32;
    o.micro_batch = 4;
    o.grad_accum = 1;
    o.lr = 1e-2f;
    o.param_home = ZO_TIER_HOST;
    o.optim_home = ZO_TIER_HOST;
    run_result r;
    train_run(&o, &r);
    double last = mean(r.losses + STEPS - 10, 10);
    if (!(fabs(r.losses[0] - log(256.0)) < 0.3 && last < 0.7 * r.losses[0] &&
          r.val_loss < 0.75 * r.losses[0]))
        fail_msg("first loss %.4f, mean of the last 10 %.4f, validation %.4f", (double)r.losses[0],
                 last, r.val_loss);
    run_free(&r, &o.shape);
}

static void test_budget_below_the_activations_is_refused(void **state)
{
    zt_options o = small_options();
    o.device_mem = 4096;
    zt_trainer *t = NULL;
    assert_int_equal(zt_trainer_init(&t, &o), ZO_ERR_OUT_OF_DEVICE_MEMORY);
    assert_null(t);
    assert_non_null(strstr(zt_last_error(), "activations"));
    o.device_mem = zt_test_smallest_budget(o) - 1; /* the engine's plan refuses one byte less */
    assert_true(zt_trainer_init(&t, &o) < 0);
    assert_non_null(strstr(zt_last_error(), "short by 1 bytes"));
}

static void test_data_errors_are_reported(void **state)
{
    zt_options o = small_options();
    char path[300];
    snprintf(path, sizeof path, "%s/vocab1000.tok", g_swap);
    uint32_t ids[4096];
    for (int i = 0; i < 4096; i++)
        ids[i] = (uint32_t)(i * 7 % 1000);
    ZO_ASSERT_OK(zt_data_write_tokens(path, ids, 4096, 2, 1000));
    o.data_path = path;
    zt_trainer *t = NULL;
    assert_int_equal(zt_trainer_init(&t, &o), ZO_ERR_INVALID_ARG);
    assert_non_null(strstr(zt_last_error(), "--vocab 1000"));
    o.shape.vocab = 1000; /* then it trains on it */
    o.steps = 2;
    ZO_ASSERT_OK(zt_trainer_init(&t, &o));
    float loss;
    zo_step_stats s;
    ZO_ASSERT_OK(zt_trainer_step(t, &loss, &s));
    assert_true(fabs(loss - log(1000.0)) < 0.3);
    zt_trainer_free(t);
    unlink(path);
    o.data_path = "/nonexistent/corpus.txt";
    assert_int_equal(zt_trainer_init(&t, &o), ZO_ERR_NOT_FOUND);
    assert_non_null(strstr(zt_last_error(), "/nonexistent/corpus.txt"));
}

static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[600];
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    if (d)
        closedir(d);
    rmdir(dir);
}

static int setup(void **state)
{
    snprintf(g_swap, sizeof g_swap, "%s/zt-test-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(g_swap) ? 0 : -1;
}

static int teardown(void **state)
{
    remove_dir(g_swap);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placements_are_bitwise_identical),
        cmocka_unit_test(test_flash_placements_are_bitwise_identical),
        cmocka_unit_test(test_placements_are_bitwise_with_mlp_chunks),
        cmocka_unit_test(test_device_optimizer_on_a_strict_device),
        cmocka_unit_test(test_split_homes_equal_all_nvme),
        cmocka_unit_test(test_nvme_fault_then_retry_equals_clean_run),
        cmocka_unit_test(test_fp16_overlap_equals_sync),
        cmocka_unit_test(test_loss_decreases_on_the_corpus),
        cmocka_unit_test(test_budget_below_the_activations_is_refused),
        cmocka_unit_test(test_data_errors_are_reported),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
