/* The zo-train program: --help, the --json summary's keys and values, the
 * human summary, and bad flags refused with exit status 2 and a message. */
#include <jansson.h>
#include <math.h>
#include <pty.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model_shape.h"
#include "zo_test.h"

#ifndef ZT_EXE
#error "ZT_EXE (the zo-train executable) must be defined"
#endif

static char g_dir[256];

/* A small configuration that still pages parameters and keeps the optimizer
 * on NVMe in the test's directory. */
#define SMALL                                                                                      \
    " --device cpu --dim 32 --layers 2 --heads 2 --ffn 64 --seq 16 --micro-batch 2 --val-batches " \
    "2"                                                                                            \
    " --offload-param cpu --offload-optimizer nvme"

typedef struct outputs {
    char *out, *err;
    int status;
} outputs;

static char *slurp(FILE *f)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            buf = realloc(buf, cap *= 2);
            assert_non_null(buf);
        }
    }
    buf[n] = 0;
    return buf;
}

static outputs run(const char *args)
{
    char cmd[2048], err_path[300];
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", g_dir);
    snprintf(cmd, sizeof cmd, "%s %s 2>%s", ZT_EXE, args, err_path);
    outputs o;
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    o.out = slurp(p);
    int st = pclose(p);
    o.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    FILE *e = fopen(err_path, "r");
    assert_non_null(e);
    o.err = slurp(e);
    fclose(e);
    unlink(err_path);
    return o;
}

static void outputs_free(outputs *o)
{
    free(o->out);
    free(o->err);
}

static void test_help_lists_every_flag(void **state)
{
    outputs o = run("--help");
    assert_int_equal(o.status, 0);
    const char *flags[] = {"--preset",
                           "--data",
                           "--steps",
                           "--seq",
                           "--micro-batch",
                           "--grad-accum",
                           "--lr",
                           "--seed",
                           "--device ",
                           "--device-mem",
                           "--offload-optimizer",
                           "--offload-param",
                           "--nvme-path",
                           "--optimizer-mode",
                           "--json",
                           "--config",
                           "--set",
                           "--save ",
                           "--save-every",
                           "--resume",
                           "--init-weights",
                           "--hf-model",
                           "--hf-save-dtype",
                           "--hf-shard-size",
                           "--help",
                           "tiny, small, 1b, 7b, 13b, 70b"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strstr(o.out, flags[i]))
            fail_msg("--help does not mention %s", flags[i]);
    outputs_free(&o);
}

static json_int_t int_at(json_t *root, const char *obj, const char *key)
{
    json_t *v = json_object_get(json_object_get(root, obj), key);
    if (!json_is_integer(v))
        fail_msg("%s.%s is not an integer", obj, key);
    return json_integer_value(v);
}

static void test_json_summary(void **state)
{
    char args[1024];
    snprintf(args, sizeof args, "--json --steps 4 --log-every 1 --nvme-path %s" SMALL, g_dir);
    outputs o = run(args);
    if (o.status != 0)
        fail_msg("exit %d: %s", o.status, o.err);
    json_error_t jerr;
    json_t *root = json_loads(o.out, 0, &jerr); /* stdout is exactly one JSON object */
    if (!root)
        fail_msg("stdout is not JSON (%s): %s", jerr.text, o.out);
    json_t *losses = json_object_get(root, "losses");
    assert_true(json_is_array(losses));
    assert_int_equal(json_array_size(losses), 4);
    for (size_t i = 0; i < 4; i++)
        assert_true(json_is_number(json_array_get(losses, i)));
    assert_true(json_number_value(json_array_get(losses, 0)) ==
                json_number_value(json_object_get(root, "first_loss")));
    assert_true(json_number_value(json_array_get(losses, 3)) ==
                json_number_value(json_object_get(root, "last_loss")));
    assert_true(json_number_value(json_object_get(root, "val_loss")) > 0);
    const char *tiers[] = {"device", "pinned", "host", "nvme"};
    for (int i = 0; i < 4; i++)
        assert_true(int_at(root, "peak_bytes", tiers[i]) >= 0);
    assert_true(int_at(root, "peak_bytes", "device") > 0);
    assert_true(int_at(root, "peak_bytes", "pinned") > 0);
    assert_true(int_at(root, "peak_bytes", "nvme") > 0);
    assert_true(int_at(root, "bytes", "h2d") > 0);
    assert_true(int_at(root, "bytes", "nvme_write") > 0);
    assert_true(int_at(root, "device", "high_water") <= int_at(root, "device", "budget"));
    assert_true(json_is_number(json_object_get(root, "stall_pct")));
    assert_true(json_number_value(json_object_get(root, "tokens_per_s")) > 0);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(root, "config"), "offload_optimizer")),
        "nvme");
    json_decref(root);
    /* progress went to stderr, one line per step */
    int lines = 0;
    for (const char *p = o.err; (p = strstr(p, "step ")); p++)
        lines++;
    assert_int_equal(lines, 4);
    outputs_free(&o);
}

static void test_human_summary(void **state)
{
    char args[1024];
    snprintf(args, sizeof args, "--steps 2 --optimizer-mode overlap --nvme-path %s" SMALL, g_dir);
    outputs o = run(args);
    if (o.status != 0)
        fail_msg("exit %d: %s", o.status, o.err);
    const char *parts[] = {"loss: first step", "validation", "bytes moved: host->device",
                           "nvme read",        "stall:",     "peak bytes: device",
                           "tokens/s"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (!strstr(o.out, parts[i]))
            fail_msg("the summary lacks '%s':\n%s", parts[i], o.out);
    outputs_free(&o);
}

static void expect_usage_error(const char *args, const char *needle)
{
    outputs o = run(args);
    assert_int_equal(o.status, 2);
    if (!strstr(o.err, needle))
        fail_msg("'%s': stderr '%s' lacks '%s'", args, o.err, needle);
    assert_string_equal(o.out, "");
    outputs_free(&o);
}

/* --steps is read before the config and again after it: its error once. */
static void test_bad_steps_reported_once(void **state)
{
    (void)state;
    outputs o = run("--steps -1");
    assert_int_equal(o.status, 2);
    const char *first = strstr(o.err, "--steps '-1'");
    assert_non_null(first);
    if (strstr(first + 1, "--steps '-1'"))
        fail_msg("the error is printed twice: '%s'", o.err);
    outputs_free(&o);
}

static void test_bad_flags(void **state)
{
    expect_usage_error("--preset huge",
                       "unknown preset 'huge'; expected one of tiny, small, 1b, 7b, 13b, 70b");
    expect_usage_error("--offload-param disk", "expected none, cpu or nvme");
    expect_usage_error("--device-mem 12XB", "expected a byte count");
    expect_usage_error("--steps -1", "an integer >= 0");
    expect_usage_error("--optimizer-mode fast", "sync, overlap or dpu");
    expect_usage_error("--dtype fp8", "expected bf16, fp16 or fp32");
    expect_usage_error("--embedding-f32-states yes", "expected on or off");
    expect_usage_error("--frobnicate", "unknown option");
    expect_usage_error("extra", "unexpected argument 'extra'");
}

/* Flag errors found by the option checks exit 2 too (they used to exit 1
 * from the trainer or the engine, naming param_home/optim_home); --seed -1
 * is refused (it was taken as 2^64-1), --chunk-bytes 1 refused and a chunk
 * below the largest tensor said to be raised. */
static void test_flag_errors_exit_2(void **state)
{
    expect_usage_error("--heads 3", "must be a multiple of heads 3");
    expect_usage_error("--lr 0", "--lr 0 must be > 0");
    expect_usage_error("--offload-param nvme --offload-optimizer cpu",
                       "--offload-param nvme needs --offload-optimizer nvme");
    expect_usage_error("--seed -1", "expected an unsigned integer");
    expect_usage_error("--chunk-bytes 1", "--chunk-bytes 1: a chunk holds 4 KiB to 1 TiB");
    char args[1200];
    const char *cfg = "{\"train_micro_batch_size_per_gpu\": 2, \"scheduler\": {\"type\": "
                      "\"WarmupCosineLR\", \"params\": {\"total_num_steps\": 4, "
                      "\"warmup_num_steps\": 4}}}";
    FILE *f;
    snprintf(args, sizeof args, "%s/cosine.json", g_dir);
    assert_non_null(f = fopen(args, "w"));
    fputs(cfg, f);
    fclose(f);
    char full[1400];
    snprintf(full, sizeof full, "--config %s --steps 4", args);
    expect_usage_error(full, "must differ from max(2, warmup_num_steps)");
    snprintf(args, sizeof args, "--steps 1 --chunk-bytes 8KiB --nvme-path %s" SMALL, g_dir);
    outputs o = run(args);
    assert_int_equal(o.status, 0);
    assert_non_null(strstr(o.err, "--chunk-bytes 8192 raised to"));
    outputs_free(&o);
}

/* The plan's host memory is checked against the host limit before
 * anything is allocated (--chunk-bytes 1GiB on the tiny preset used to
 * grow to 23 GB until the kernel killed it, silently). */
static void test_host_limit_refuses_before_allocating(void **state)
{
    char args[1024];
    snprintf(args, sizeof args, "--steps 1 --host-mem 512KiB --nvme-path %s" SMALL, g_dir);
    outputs o = run(args);
    assert_int_equal(o.status, 1);
    if (!strstr(o.err, "host memory: the plan needs") || !strstr(o.err, "most of it pinned") ||
        !strstr(o.err, "(--host-mem)"))
        fail_msg("stderr: %s", o.err);
    outputs_free(&o);
    snprintf(args, sizeof args, "--steps 1 --chunk-bytes 64GiB --nvme-path %s" SMALL, g_dir);
    o = run(args);
    assert_int_equal(o.status, 1);
    if (!strstr(o.err, "but the host limit is"))
        fail_msg("stderr: %s", o.err);
    outputs_free(&o);
}

static void test_run_failure_exits_1(void **state)
{
    outputs o = run("--device cpu --device-mem 64KiB --steps 1 --offload-optimizer cpu");
    assert_int_equal(o.status, 1);
    assert_non_null(strstr(o.err, "activations"));
    outputs_free(&o);
}

/* ---- --config ---- */

#define TINY " --device cpu --dim 32 --layers 2 --heads 2 --ffn 64 --seq 16 --val-batches 2"

static const char *write_config(const char *name, const char *json)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(json, f);
    fclose(f);
    return path;
}

/* zoffload.host_mem is the host limit --host-mem sets (pinned + pageable),
 * named when it refuses; the flag overrides it. */
static void test_config_host_mem_is_the_host_limit(void **state)
{
    char args[1024];
    const char *path =
        write_config("host.json", "{\"train_micro_batch_size_per_gpu\": 2, \"bf16\": {\"enabled\": "
                                  "true}, \"zoffload\": {\"host_mem\": \"512KiB\"}}");
    snprintf(args, sizeof args, "--config %s --steps 1 --nvme-path %s" SMALL, path, g_dir);
    outputs o = run(args);
    assert_int_equal(o.status, 1);
    if (!strstr(o.err, "but the host limit is 512.00 KiB (zoffload.host_mem)"))
        fail_msg("stderr: %s", o.err);
    outputs_free(&o);
    snprintf(args, sizeof args, "--config %s --steps 1 --host-mem 2GiB --nvme-path %s" SMALL, path,
             g_dir);
    o = run(args);
    if (o.status != 0)
        fail_msg("--host-mem should override zoffload.host_mem: exit %d: %s", o.status, o.err);
    outputs_free(&o);
}

static json_t *run_json(const char *args, char **err)
{
    outputs o = run(args);
    if (o.status != 0)
        fail_msg("'%s': exit %d: %s", args, o.status, o.err);
    json_error_t jerr;
    json_t *root = json_loads(o.out, 0, &jerr);
    if (!root)
        fail_msg("stdout is not JSON (%s): %s", jerr.text, o.out);
    *err = o.err;
    free(o.out);
    return root;
}

static const char *cfg_str(json_t *root, const char *key)
{
    return json_string_value(json_object_get(json_object_get(root, "config"), key));
}

static json_int_t cfg_int(json_t *root, const char *key)
{
    return json_integer_value(json_object_get(json_object_get(root, "config"), key));
}

/* The host limit is the engine's budget too: with the parameters and the
 * optimizer on NVMe, the step's gradients wait in host memory as far as
 * --host-mem allows and spill to NVMe beyond it (one chunk's, every
 * chunk's), training as with all of them kept, the peaks within the limit;
 * one byte below the smallest plan is refused before anything is allocated.
 * The update in end_step: one set of gradient buffers (behind the forward,
 * two, by parity: counted by zo-plan's memory tests). */
#define ON_NVME                                                                                    \
    " --device cpu --dim 32 --layers 2 --heads 2 --ffn 64 --seq 16 --micro-batch 2 "               \
    "--val-batches 2 --offload-param nvme --offload-optimizer nvme --update-behind off"

static void test_host_mem_spills_gradients(void **state)
{
    (void)state;
    char args[1024], *err;
    snprintf(args, sizeof args, "--json --steps 3 --nvme-path %s" ON_NVME, g_dir);
    json_t *all = run_json(args, &err);
    free(err);
    json_int_t pinned = int_at(all, "peak_bytes", "pinned"),
               host = int_at(all, "peak_bytes", "host");
    json_int_t chunk = cfg_int(all, "chunk_bytes"), chunks = cfg_int(all, "chunks");
    assert_int_equal(host, chunks * chunk); /* every chunk's gradients kept */
    json_int_t others = int_at(all, "device", "budget");
    assert_int_equal(cfg_int(all, "tensor_buffer_bytes"), 0); /* nothing loaded or saved */
    json_int_t need = pinned + host + others;
    for (json_int_t spilled = 1; spilled <= chunks; spilled += chunks - 1) {
        json_int_t limit = need - spilled * chunk;
        snprintf(args, sizeof args, "--json --steps 3 --host-mem %lld --nvme-path %s" ON_NVME,
                 (long long)limit, g_dir);
        json_t *o = run_json(args, &err);
        free(err);
        assert_true(json_equal(json_object_get(o, "losses"), json_object_get(all, "losses")));
        assert_int_equal(int_at(o, "peak_bytes", "host"), host - spilled * chunk);
        assert_int_equal(int_at(o, "peak_bytes", "pinned"), pinned);
        assert_true(int_at(o, "peak_bytes", "pinned") + int_at(o, "peak_bytes", "host") + others <=
                    limit);
        assert_true(int_at(o, "peak_bytes", "nvme") > int_at(all, "peak_bytes", "nvme"));
        json_decref(o);
    }
    snprintf(args, sizeof args, "--steps 1 --host-mem %lld --nvme-path %s" ON_NVME,
             (long long)(need - chunks * chunk - 1), g_dir);
    outputs r = run(args);
    assert_int_equal(r.status, 1);
    if (!strstr(r.err, "host memory: the plan needs") || !strstr(r.err, ": 1 B missing"))
        fail_msg("stderr: %s", r.err);
    outputs_free(&r);
    json_decref(all);
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

static const char *k_config =
    "{\"train_batch_size\": 6, \"train_micro_batch_size_per_gpu\": 3,\n"
    " \"gradient_accumulation_steps\": 2, \"steps_per_print\": 1,\n"
    " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.005, \"weight_decay\": 0.01}},\n"
    " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0,\n"
    "   \"warmup_max_lr\": 0.004, \"warmup_num_steps\": 4, \"warmup_type\": \"linear\"}},\n"
    " \"bf16\": {\"enabled\": true}, \"gradient_clipping\": 0.5,\n"
    " \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"cpu\"},\n"
    "   \"offload_param\": {\"device\": \"cpu\"}, \"stage3_prefetch_bucket_size\": 1e8},\n"
    " \"zoffload\": {\"optimizer_mode\": \"overlap\", \"prefetch_lookahead\": 1}}\n";

/* The config decides batch sizes, schedule, placement, mode and how often
 * progress is printed; a key with no effect here is warned about once. */
static void test_config_drives_the_run(void **state)
{
    char args[1024], *err;
    snprintf(args, sizeof args, "--config %s --steps 5 --json" TINY,
             write_config("run.json", k_config));
    json_t *root = run_json(args, &err);
    assert_int_equal(cfg_int(root, "micro_batch"), 3);
    assert_int_equal(cfg_int(root, "grad_accum"), 2);
    assert_string_equal(cfg_str(root, "optimizer_mode"), "overlap");
    assert_string_equal(cfg_str(root, "offload_param"), "cpu");
    assert_string_equal(cfg_str(root, "offload_optimizer"), "cpu");
    assert_string_equal(cfg_str(root, "scheduler"), "WarmupLR");
    /* DeepSpeed's WarmupLR, linear: min_lr when built and at it 0, then it/4 of the way */
    const double want[5] = {0.0, 0.0, 0.001, 0.002, 0.003};
    json_t *lrs = json_object_get(root, "lrs");
    assert_int_equal(json_array_size(lrs), 5);
    for (int i = 0; i < 5; i++)
        if (fabs(json_number_value(json_array_get(lrs, i)) - want[i]) > 1e-9)
            fail_msg("lr of step %d: %.9g, expected %.9g", i + 1,
                     json_number_value(json_array_get(lrs, i)), want[i]);
    assert_int_equal(count(err, "step "), 5); /* steps_per_print 1 */
    assert_int_equal(count(err, "'zero_optimization.stage3_prefetch_bucket_size' has no effect"),
                     1);
    json_decref(root);
    free(err);
}

/* A sparse_attention layout counts its density in the model FLOPs: the
 * run's model_tflops is its tokens per second times
 * zt_layout_flops_per_token of the layout the section maps to (fixed: the
 * stripe num_local_blocks, summary num_global_blocks), below dense's. */
static void test_sparse_layout_counts_its_flops(void **state)
{
    char args[1024], *err;
    snprintf(args, sizeof args,
             "--config %s --steps 2 --json --device cpu --dim 32 --layers 2 --heads 2 --ffn 64 "
             "--vocab 256 --seq 128 --val-batches 1",
             write_config("sparse.json",
                          "{\"train_micro_batch_size_per_gpu\": 2, \"sparse_attention\": "
                          "{\"mode\": \"fixed\", \"block\": 16, \"num_local_blocks\": 2, "
                          "\"num_global_blocks\": 1}}"));
    json_t *root = run_json(args, &err);
    zt_shape s;
    ZO_ASSERT_OK(zt_preset("tiny", &s));
    const int dims[5] = {256, 32, 2, 2, 64};
    zt_shape_override(&s, dims);
    zo_attn_layout l = ZO_ATTN_LAYOUT_INIT;
    l.kind = ZO_ATTN_LAYOUT_FIXED, l.block = 16, l.window_blocks = 2, l.global_blocks = 1;
    double flops = zt_layout_flops_per_token(&s, &l, 128);
    double tps = json_number_value(json_object_get(root, "tokens_per_s"));
    double tflops = json_number_value(json_object_get(root, "model_tflops"));
    assert_true(tps > 0);
    /* the JSON's reals keep 9 digits; dense's FLOPs are far from these */
    assert_true(zt_shape_flops_per_token(&s, 128) > 1.01 * flops);
    if (fabs(tflops - tps * flops / 1e12) > 1e-7 * tflops)
        fail_msg("model_tflops %.9g, tokens/s %.9g x the layout's %.9g FLOPs/token = %.9g", tflops,
                 tps, flops, tps * flops / 1e12);
    json_decref(root);
    free(err);
}

/* DeepSpeed's precision: fp16.enabled or bf16.enabled picks 16 bits; with
 * neither the run trains in fp32 (the engine holds fp32 parameters), as
 * DeepSpeed does, and --dtype overrides the config. */
static void test_config_precision_picks_the_dtype(void **state)
{
    static const struct {
        const char *json, *flags, *dtype;
    } cases[] = {
        {"{\"train_micro_batch_size_per_gpu\": 2}", "", "fp32"},
        {"{\"train_micro_batch_size_per_gpu\": 2, \"bf16\": {\"enabled\": false}, "
         "\"fp16\": {\"enabled\": false}}",
         "", "fp32"},
        {"{\"train_micro_batch_size_per_gpu\": 2, \"bf16\": {\"enabled\": true}}", "", "bf16"},
        {"{\"train_micro_batch_size_per_gpu\": 2, \"fp16\": {\"enabled\": true}}", "", "fp16"},
        {"{\"train_micro_batch_size_per_gpu\": 2, \"bf16\": {\"enabled\": true}}", " --dtype fp32",
         "fp32"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[1024], *err;
        snprintf(args, sizeof args, "--config %s --steps 2 --json%s" TINY,
                 write_config("precision.json", cases[i].json), cases[i].flags);
        json_t *root = run_json(args, &err);
        const char *got =
            json_string_value(json_object_get(json_object_get(root, "model"), "dtype"));
        if (!got || strcmp(got, cases[i].dtype) != 0)
            fail_msg("'%s' with %s: dtype %s, expected %s", cases[i].json, cases[i].flags,
                     got ? got : "(none)", cases[i].dtype);
        assert_null(strstr(err, "16 bits only")); /* no warning: fp32 is trained, not bf16 */
        json_t *losses = json_object_get(root, "losses");
        for (size_t k = 0; k < json_array_size(losses); k++)
            assert_true(isfinite(json_number_value(json_array_get(losses, k))));
        json_decref(root);
        free(err);
    }
}

/* Flags given with --config override it; what they leave alone stays. */
static void test_flags_override_the_config(void **state)
{
    char args[1024], *err;
    snprintf(args, sizeof args,
             "--config %s --steps 3 --json --micro-batch 1 --optimizer-mode sync "
             "--offload-optimizer nvme --nvme-path %s --log-every 3 --set "
             "scheduler.params.warmup_max_lr=0.008" TINY,
             write_config("run.json", k_config), g_dir);
    json_t *root = run_json(args, &err);
    assert_int_equal(cfg_int(root, "micro_batch"), 1);
    assert_int_equal(cfg_int(root, "grad_accum"), 2);
    assert_string_equal(cfg_str(root, "optimizer_mode"), "sync");
    assert_string_equal(cfg_str(root, "offload_optimizer"), "nvme");
    assert_string_equal(cfg_str(root, "nvme_path"), g_dir);
    assert_true(fabs(json_number_value(json_array_get(json_object_get(root, "lrs"), 2)) - 0.002) <
                1e-9);
    assert_int_equal(count(err, "step "), 2); /* the first and the last */
    json_decref(root);
    free(err);
}

/* ---- Hugging Face "auto" and the flags merged into the config ---- */

static void expect_config_error(const char *json, const char *extra, const char *msg);

/* transformers' tests/deepspeed/ds_config_zero2.json, "auto" everywhere. */
static const char *k_hf_auto =
    "{\"fp16\": {\"enabled\": \"auto\", \"loss_scale\": 0, \"initial_scale_power\": 16},\n"
    " \"bf16\": {\"enabled\": \"auto\"},\n"
    " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\", \"betas\": \"auto\",\n"
    "   \"eps\": \"auto\", \"weight_decay\": \"auto\"}},\n"
    " \"scheduler\": {\"type\": \"%s\", \"params\": {\"warmup_min_lr\": \"auto\",\n"
    "   \"warmup_max_lr\": \"auto\", \"warmup_num_steps\": \"auto\"%s}},\n"
    " \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\",\n"
    "   \"pin_memory\": true}, \"overlap_comm\": true, \"reduce_bucket_size\": \"auto\"},\n"
    " \"gradient_accumulation_steps\": \"auto\", \"gradient_clipping\": \"auto\",\n"
    " \"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": \"auto\",\n"
    " \"wall_clock_breakdown\": false}\n";

/* DeepSpeed's lr_schedules.py, WarmupLR and WarmupDecayLR (log warmup): the
 * rate at state it, W = max(2, warmup_num_steps). */
static double ds_warmup_lr(int decay, double min_lr, double max_lr, double warmup, double total,
                           double it)
{
    double w = warmup > 2 ? warmup : 2;
    if (it < 0)
        return min_lr;
    if (it < w)
        return min_lr + (max_lr - min_lr) * log(it + 1) / log(w);
    if (!decay)
        return max_lr;
    return min_lr + (max_lr - min_lr) * fmax(0.0, (total - it) / fmax(1.0, total - w));
}

/* Hugging Face fills "auto" from the Trainer's arguments; zo-train from its
 * flags: --lr is the schedule's peak, no warmup, total_num_steps the run's
 * steps, gradient_clipping --max-grad-norm (1), the batch keys --micro-batch
 * and --grad-accum. The rates are DeepSpeed's formulas (alpaca's offload
 * config with --lr 5e-5 --steps 5: [0, 0, 5e-5, 5e-5, 3.3e-5]). */
static void test_hf_auto_follows_the_flags(void **state)
{
    const char *types[] = {"WarmupLR", "WarmupDecayLR"};
    for (int decay = 0; decay < 2; decay++) {
        char json[2048], args[1024], *err;
        snprintf(json, sizeof json, k_hf_auto, types[decay],
                 decay ? ", \"total_num_steps\": \"auto\"" : "");
        snprintf(args, sizeof args,
                 "--config %s --steps 5 --json --lr 5e-5 --micro-batch 2 --grad-accum 3" TINY,
                 write_config("hf.json", json));
        json_t *root = run_json(args, &err);
        json_t *cfg = json_object_get(root, "config");
        assert_int_equal(cfg_int(root, "micro_batch"), 2);
        assert_int_equal(cfg_int(root, "grad_accum"), 3);
        assert_true(json_real_value(json_object_get(cfg, "max_grad_norm")) == 1.0);
        assert_true(json_integer_value(json_object_get(root, "clipped_steps")) >= 1);
        assert_true(json_real_value(json_object_get(json_object_get(cfg, "optimizer"), "lr")) ==
                    5e-5);
        json_t *lrs = json_object_get(root, "lrs");
        for (int i = 0; i < 5; i++) {
            double want = ds_warmup_lr(decay, 0, 5e-5, 0, 5, i - 1);
            double got = json_number_value(json_array_get(lrs, (size_t)i));
            if (fabs(got - want) > 1e-12)
                fail_msg("%s lr of step %d: %.9g, expected %.9g", types[decay], i + 1, got, want);
        }
        json_t *autos = json_object_get(cfg, "auto");
        assert_string_equal(json_string_value(json_object_get(autos, "gradient_clipping")),
                            "1 (--max-grad-norm's default)");
        assert_string_equal(json_string_value(json_object_get(autos, "optimizer.params.lr")),
                            "5e-5 (--lr)");
        assert_string_equal(
            json_string_value(json_object_get(autos, "scheduler.params.warmup_max_lr")),
            "5e-5 (the optimizer's lr)");
        assert_string_equal(json_string_value(json_object_get(autos, "bf16.enabled")),
                            "true (--dtype's default)");
        /* printed once per key */
        assert_int_equal(count(err, "'gradient_clipping' -> 1 (--max-grad-norm's default)"), 1);
        assert_int_equal(count(err, "wall_clock_breakdown"), 0); /* false: nothing to say */
        json_decref(root);
        free(err);
    }
}

/* --micro-batch and --grad-accum satisfy absent batch keys; against concrete
 * ones they win, with one warning naming the global batch: the file's
 * train_batch_size is kept when it left the other key to be derived, and is
 * replaced when the file fixes both. */
static void test_batch_flags_and_the_file(void **state)
{
    static const struct {
        const char *json, *flags;
        int micro, accum;
        const char *warning; /* NULL: none */
    } cases[] = {
        {"{\"bf16\": {\"enabled\": true}}", "--micro-batch 2 --grad-accum 3", 2, 3, NULL},
        {"{\"bf16\": {\"enabled\": true}}", "", 8, 1, NULL},
        {"{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": \"auto\"}", "", 8, 4,
         NULL},
        {"{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 1}", "--micro-batch 2", 2,
         16, "the global batch is 32 sequences (micro-batch 2 x 16 accumulated)\n"},
        {"{\"train_batch_size\": 6, \"train_micro_batch_size_per_gpu\": 3, "
         "\"gradient_accumulation_steps\": 2}",
         "--micro-batch 1", 1, 2,
         "the global batch is 2 sequences (micro-batch 1 x 2 accumulated), not the file's "
         "train_batch_size 6\n"},
        {"{\"train_batch_size\": 6, \"gradient_accumulation_steps\": 2}", "--micro-batch 3", 3, 2,
         NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[1024], *err;
        snprintf(args, sizeof args, "--config %s --steps 1 --json %s" TINY,
                 write_config("batch.json", cases[i].json), cases[i].flags);
        json_t *root = run_json(args, &err);
        if (cfg_int(root, "micro_batch") != cases[i].micro ||
            cfg_int(root, "grad_accum") != cases[i].accum)
            fail_msg("case %zu: micro %d accum %d", i, (int)cfg_int(root, "micro_batch"),
                     (int)cfg_int(root, "grad_accum"));
        assert_int_equal(count(err, "global batch"), cases[i].warning ? 1 : 0);
        if (cases[i].warning && !strstr(err, cases[i].warning))
            fail_msg("case %zu: stderr lacks '%s': %s", i, cases[i].warning, err);
        json_decref(root);
        free(err);
    }
    expect_config_error("{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 1}",
                        " --micro-batch 3",
                        "zo-train: configuration error in %s: --micro-batch 3 does not divide the "
                        "file's train_batch_size 32; pass both --micro-batch and --grad-accum");
}

/* No optimizer section: zo-train's own AdamW (lr 2e-3), not DeepSpeed's
 * 1e-3; the deprecated cpu_offload puts the optimizer on the host; --lr
 * against a concrete lr wins and says so. */
static void test_optimizer_defaults_and_cpu_offload(void **state)
{
    char args[1024], *err;
    snprintf(args, sizeof args, "--config %s --steps 1 --json" TINY,
             write_config("opt.json",
                          "{\"train_micro_batch_size_per_gpu\": 2, "
                          "\"zero_optimization\": {\"stage\": 2, \"cpu_offload\": true}}"));
    json_t *root = run_json(args, &err);
    json_t *opt = json_object_get(json_object_get(root, "config"), "optimizer");
    assert_true(json_real_value(json_object_get(opt, "lr")) == 2e-3);
    assert_true(json_real_value(json_array_get(json_object_get(opt, "betas"), 1)) == 0.95);
    assert_string_equal(cfg_str(root, "offload_optimizer"), "cpu");
    json_decref(root);
    free(err);
    snprintf(args, sizeof args, "--config %s --steps 1 --json --lr 5e-5" TINY,
             write_config("opt.json", "{\"train_micro_batch_size_per_gpu\": 2, \"optimizer\": "
                                      "{\"type\": \"Adam\", \"params\": {\"lr\": 1e-4}}}"));
    root = run_json(args, &err);
    opt = json_object_get(json_object_get(root, "config"), "optimizer");
    assert_true(json_real_value(json_object_get(opt, "lr")) == 5e-5);
    if (!strstr(err, "--lr 5e-5 replaces 'optimizer.params.lr' 0.0001 from"))
        fail_msg("stderr: %s", err);
    json_decref(root);
    free(err);
}

static void expect_config_error(const char *json, const char *extra, const char *msg)
{
    char args[1024], want[1024];
    const char *path = write_config("bad.json", json);
    snprintf(args, sizeof args, "--config %s%s" TINY, path, extra);
    snprintf(want, sizeof want, msg, path);
    expect_usage_error(args, want);
}

/* Layer-major micro-batches: zoffload.micro_group and act_home set them,
 * --micro-group and --act-home override; bad values are refused naming
 * what would be right. */
static void test_micro_group_config_and_flags(void **state)
{
    char args[1024], *err;
    const char *path = write_config(
        "group.json", "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": "
                      "4, \"zoffload\": {\"micro_group\": 2, \"act_home\": \"host\"}}");
    snprintf(args, sizeof args, "--config %s --steps 2 --json" TINY, path);
    json_t *root = run_json(args, &err);
    assert_int_equal(cfg_int(root, "micro_group"), 2);
    assert_string_equal(cfg_str(root, "act_home"), "host");
    json_t *losses = json_incref(json_object_get(root, "losses"));
    json_decref(root);
    free(err);
    snprintf(args, sizeof args,
             "--config %s --steps 2 --json --micro-group 1 --act-home device" TINY, path);
    root = run_json(args, &err);
    assert_int_equal(cfg_int(root, "micro_group"), 1);
    assert_string_equal(cfg_str(root, "act_home"), "device");
    assert_true(json_equal(losses, json_object_get(root, "losses"))); /* bitwise: same text */
    json_decref(root);
    free(err);
    /* DeepSpeed's cpu_checkpointing: the layer inputs on the host, per layer without groups */
    path = write_config("ckpt.json",
                        "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": "
                        "4, \"activation_checkpointing\": {\"cpu_checkpointing\": true, "
                        "\"partition_activations\": false, \"number_checkpoints\": 4}}");
    snprintf(args, sizeof args, "--config %s --steps 2 --json" TINY, path);
    root = run_json(args, &err);
    assert_int_equal(cfg_int(root, "micro_group"), 1);
    assert_string_equal(cfg_str(root, "act_home"), "host");
    assert_true(json_equal(losses, json_object_get(root, "losses")));
    json_decref(losses);
    json_decref(root);
    free(err);
    expect_config_error(
        "{\"train_batch_size\": 8, \"activation_checkpointing\": {\"cpu_checkpoint\": true}}", "",
        "cpu_checkpointing");
    expect_usage_error("--micro-group 0", "micro-group '0': expected an integer >= 1");
    expect_usage_error("--act-home disk", "expected device, host or nvme");
    /* NVMe holds layer inputs only from layer-major groups: one micro-batch
     * a group is refused by name, not trained with the inputs on the device */
    expect_usage_error("--act-home nvme", "--act-home nvme at one micro-batch a group");
    expect_usage_error("--act-home nvme --grad-accum 4 --micro-group 1", "Use --act-home host");
    expect_config_error("{\"train_batch_size\": 8, \"zoffload\": {\"act_home\": \"disk\"}}", "",
                        "'zoffload.act_home'");
    expect_config_error("{\"train_batch_size\": 8, \"zoffload\": {\"micro_group\": 0}}", "",
                        "'zoffload.micro_group'");
    /* The front end's row tiles: zo-train's model pages its weights whole. */
    expect_config_error("{\"train_batch_size\": 8, \"zoffload\": {\"tile_size\": 4096}}", "",
                        "'zoffload.tile_size'");
    expect_config_error("{\"train_batch_size\": 8, \"zoffload\": {\"recompute\": true}}", "",
                        "'zoffload.recompute'");
}

/* A bad config fails before anything runs, with exit status 2 and the
 * parser's message naming the key. */
static void test_config_errors(void **state)
{
    expect_config_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"offload_optimizer\": "
                        "{\"devcie\": \"cpu\"}}}",
                        "",
                        "zo-train: configuration error in %s: unknown key "
                        "'zero_optimization.offload_optimizer.devcie'; did you mean 'device'?\n");
    expect_config_error("{\"train_batch_size\": 10, \"train_micro_batch_size_per_gpu\": 3}", "",
                        "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step "
                        "* world_size: 10 != 3 * 3 * 1");
    expect_config_error("{\"train_batch_size\": 8,\n \"fp16\": {\"enabled\": tru}}", "",
                        "zo-train: configuration error: %s:2:");
    expect_config_error("{\"train_batch_size\": 8}", " --set zoffload.devce_mem=1GiB",
                        "unknown key 'zoffload.devce_mem'; did you mean 'device_mem'?");
    expect_config_error("{\"train_batch_size\": 8, \"zoffload\": {\"optimizer_state_dtype\": "
                        "\"fp16\"}}",
                        "", "expected one of fp32, bf16, int8");
    expect_config_error("{\"train_batch_size\": 8, \"zoffload\": {\"embedding_f32_states\": "
                        "\"on\"}}",
                        "", "'zoffload.embedding_f32_states'");
    expect_config_error("{\"train_batch_size\": 8, \"gradient_clipping\": \"1.0\"}", "",
                        "'gradient_clipping': expected a number >= 0 or \"auto\", found string "
                        "\"1.0\"");
    expect_usage_error("--set fp16.enabled=true", "overrides apply to a config file");
    expect_usage_error("--config /nonexistent/ds.json", "/nonexistent/ds.json' does not exist");
}

/* ---- checkpoints from the command line ---- */

static void test_checkpoint_flags(void **state)
{
    char args[1024], dir[400];
    snprintf(dir, sizeof dir, "%s/ck", g_dir);
    snprintf(args, sizeof args, "--steps 2 --save %s --json" TINY, dir);
    char *err;
    json_t *root = run_json(args, &err);
    char want[600];
    snprintf(want, sizeof want, "%s/step-00000002", dir);
    assert_string_equal(json_string_value(json_object_get(root, "checkpoint")), want);
    /* a run that saves counts its tensor buffers against the host limit */
    assert_true(cfg_int(root, "tensor_buffer_bytes") > 0);
    json_decref(root);
    free(err);
    /* a second fresh run would overwrite them: refused */
    snprintf(want, sizeof want, "%s already holds checkpoints", dir);
    expect_usage_error(args, want);
    snprintf(args, sizeof args, "--steps 3 --resume %s --save %s --json" TINY, dir, dir);
    root = run_json(args, &err);
    assert_int_equal(json_integer_value(json_object_get(root, "first_step")), 3);
    assert_int_equal(json_array_size(json_object_get(root, "losses")), 1);
    snprintf(want, sizeof want, "%s/step-00000002", dir);
    assert_string_equal(json_string_value(json_object_get(root, "resumed_from")), want);
    json_decref(root);
    free(err);
    snprintf(args, sizeof args,
             "--resume %s --init-weights %s/step-00000002/model.safetensors" TINY, dir, dir);
    expect_usage_error(args, "--resume and --init-weights both set the weights");
    expect_usage_error("--save-every 2" TINY, "--save-every needs --save DIR");
    outputs o = run("--steps 1 --resume /nonexistent/ck" TINY);
    assert_int_equal(o.status, 1);
    assert_non_null(strstr(o.err, "/nonexistent/ck holds neither a checkpoint"));
    outputs_free(&o);
}

/* What a run needs is checked before it starts: --data a readable regular
 * file (a FIFO used to block the open forever), --save writable (it used to
 * fail at the first save, after the training), --resume's settings this
 * run's (they used to be taken silently). */
static void test_up_front_checks(void **state)
{
    char args[1600], path[400], dir[400];
    snprintf(path, sizeof path, "%s/fifo", g_dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    snprintf(args, sizeof args, "--steps 1 --data %s" TINY, path);
    expect_usage_error(args, "is a FIFO: expected a regular file");
    unlink(path);
    snprintf(args, sizeof args, "--steps 1 --data %s" TINY, g_dir);
    expect_usage_error(args, "is a directory: expected a regular file");
    snprintf(args, sizeof args, "--steps 1 --data %s/none" TINY, g_dir);
    expect_usage_error(args, "does not exist: expected a regular file");
    expect_usage_error("--steps 2 --save /proc/self" TINY, "--save /proc/self is not writable");
    snprintf(args, sizeof args, "--steps 2 --init-weights %s" TINY, g_dir);
    expect_usage_error(args, "--init-weights");

    snprintf(dir, sizeof dir, "%s/ck-settings", g_dir);
    snprintf(args, sizeof args, "--steps 1 --save %s --json" TINY, dir);
    char *err;
    json_decref(run_json(args, &err));
    free(err);
    snprintf(args, sizeof args,
             "--steps 2 --resume %s --json" TINY " --seq 8 --micro-batch 4 --dtype fp16", dir);
    expect_usage_error(args, "--seq 16, now 8; --micro-batch 8, now 4");
    expect_usage_error(args, "--dtype bf16, now fp16");
    expect_usage_error(args, "--resume-allow-changes");
    snprintf(path, sizeof path, "%s/other.txt", g_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 2000; i++)
        fputs("other text, other run. ", f);
    fclose(f);
    snprintf(args, sizeof args, "--steps 2 --resume %s --data %s" TINY, dir, path);
    expect_usage_error(args, "--data ");
    snprintf(args, sizeof args,
             "--steps 2 --resume %s --resume-allow-changes --json" TINY " --seq 8", dir);
    json_t *root = run_json(args, &err);
    assert_int_equal(json_integer_value(json_object_get(root, "first_step")), 2);
    assert_non_null(strstr(err, "continuing"));
    json_decref(root);
    free(err);
}

/* Divergence stops the run naming the step, before the step is saved (it
 * used to train on NaN losses and exit 0): bf16 at the first NaN/Inf, fp16
 * after --max-skipped-steps overflowing steps in a row; initial weights
 * with an Inf are refused (they used to skip every step). */
static void test_divergence_stops(void **state)
{
    char args[1024], dir[400], want[600];
    snprintf(dir, sizeof dir, "%s/ck-diverge", g_dir);
    snprintf(args, sizeof args, "--steps 20 --lr 1e30 --save %s --save-every 1" TINY, dir);
    outputs o = run(args);
    assert_int_equal(o.status, 1);
    const char *at = strstr(o.err, "zo-train: step ");
    if (!at || !strstr(o.err, "training diverged"))
        fail_msg("stderr: %s", o.err);
    int step = atoi(at + strlen("zo-train: step "));
    assert_true(step >= 2);
    snprintf(want, sizeof want, "the last good checkpoint is %s/step-%08d", dir, step - 1);
    if (!strstr(o.err, want))
        fail_msg("stderr lacks '%s': %s", want, o.err);
    outputs_free(&o);
    snprintf(want, sizeof want, "%s/latest", dir);
    FILE *f = fopen(want, "r");
    assert_non_null(f);
    char latest[64] = "";
    assert_non_null(fgets(latest, sizeof latest, f));
    fclose(f);
    snprintf(want, sizeof want, "step-%08d", step - 1);
    assert_non_null(strstr(latest, want));

    o = run("--steps 20 --lr 1e30 --dtype fp16 --max-skipped-steps 3" TINY);
    assert_int_equal(o.status, 1);
    assert_non_null(strstr(o.err, "3 steps in a row overflowed in fp16"));
    outputs_free(&o);

    /* an Inf in the first tensor of a copy of the step-1 checkpoint's
     * weights (in the checkpoint its checksum refuses it first) */
    char model[600], cmd[1400];
    snprintf(model, sizeof model, "%s/inf-model.safetensors", g_dir);
    snprintf(cmd, sizeof cmd, "cp '%s/step-00000001/model.safetensors' '%s'", dir, model);
    assert_int_equal(system(cmd), 0);
    f = fopen(model, "r+b");
    assert_non_null(f);
    uint64_t hdr = 0;
    assert_int_equal(fread(&hdr, 8, 1, f), 1);
    const float inf = INFINITY;
    assert_int_equal(fseek(f, (long)(8 + hdr + 4 * 5), SEEK_SET), 0);
    assert_int_equal(fwrite(&inf, 4, 1, f), 1);
    fclose(f);
    snprintf(args, sizeof args, "--steps 2 --init-weights %s" TINY, model);
    o = run(args);
    assert_int_equal(o.status, 1);
    if (!strstr(o.err, "has Inf at index 5"))
        fail_msg("stderr: %s", o.err);
    outputs_free(&o);
}

/* ---- feedback: metrics, trace, the progress line ---- */

static void check_metrics(const char *path, json_t *summary, int steps)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[4096];
    int n = 0;
    json_t *losses = json_object_get(summary, "losses");
    while (fgets(line, sizeof line, f)) {
        json_error_t e;
        json_t *m = json_loads(line, 0, &e);
        if (!m)
            fail_msg("metrics line %d is not JSON (%s): %s", n + 1, e.text, line);
        assert_int_equal(json_integer_value(json_object_get(m, "step")), n + 1);
        assert_int_equal(json_integer_value(json_object_get(m, "total")), steps);
        assert_true(json_real_value(json_object_get(m, "loss")) ==
                    json_real_value(json_array_get(losses, (size_t)n)));
        const char *nums[] = {"lr",        "tokens_per_s", "model_tflops", "eta_s",
                              "nvme_gbps", "stall_pct",    "step_s",       "grad_norm"};
        for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
            if (!json_is_number(json_object_get(m, nums[i])))
                fail_msg("metrics line %d: '%s' is not a number", n + 1, nums[i]);
        assert_true(json_real_value(json_object_get(m, "nvme_gbps")) > 0);
        assert_true(json_real_value(json_object_get(m, "tokens_per_s")) > 0);
        json_t *use = json_object_get(m, "bytes_in_use");
        assert_true(json_integer_value(json_object_get(use, "device")) > 0);
        assert_true(json_integer_value(json_object_get(use, "pinned")) > 0);
        assert_true(json_integer_value(json_object_get(use, "nvme")) > 0);
        assert_true(json_is_integer(json_object_get(use, "host")));
        if (n + 1 == steps)
            assert_true(json_real_value(json_object_get(m, "eta_s")) == 0.0);
        json_decref(m);
        n++;
    }
    fclose(f);
    assert_int_equal(n, steps);
}

/* Spans on one track nest or follow each other, as the format requires. */
static void check_nesting(json_t *events, json_int_t tid)
{
    size_t i, k;
    json_t *a, *b;
    json_array_foreach(events, i, a)
    {
        if (json_integer_value(json_object_get(a, "tid")) != tid ||
            strcmp(json_string_value(json_object_get(a, "ph")), "X"))
            continue;
        double a0 = json_number_value(json_object_get(a, "ts")),
               a1 = a0 + json_number_value(json_object_get(a, "dur"));
        json_array_foreach(events, k, b)
        {
            if (k <= i || json_integer_value(json_object_get(b, "tid")) != tid ||
                strcmp(json_string_value(json_object_get(b, "ph")), "X"))
                continue;
            double b0 = json_number_value(json_object_get(b, "ts")),
                   b1 = b0 + json_number_value(json_object_get(b, "dur"));
            int apart = a1 <= b0 + 1e-3 || b1 <= a0 + 1e-3;
            int nested =
                (a0 <= b0 + 1e-3 && b1 <= a1 + 1e-3) || (b0 <= a0 + 1e-3 && a1 <= b1 + 1e-3);
            if (!apart && !nested)
                fail_msg("track %lld: '%s' [%.3f, %.3f] and '%s' [%.3f, %.3f] overlap",
                         (long long)tid, json_string_value(json_object_get(a, "name")), a0, a1,
                         json_string_value(json_object_get(b, "name")), b0, b1);
        }
    }
}

static void check_trace(const char *path)
{
    json_error_t e;
    json_t *events = json_load_file(path, 0, &e);
    if (!events)
        fail_msg("%s is not valid JSON: %s (line %d)", path, e.text, e.line);
    assert_true(json_is_array(events));
    const char *tracks[] = {"training loop",
                            "compute stream",
                            "h2d stream (copy engine)",
                            "d2h stream (copy engine)",
                            "engine host jobs",
                            "optimizer update",
                            "nvme queue: optimizer states (lane 0)",
                            "nvme queue: parameters (lane 0)",
                            "optimizer worker 0"};
    size_t i;
    json_t *ev;
    for (size_t t = 0; t < sizeof tracks / sizeof tracks[0]; t++) {
        json_int_t tid = -1;
        json_array_foreach(events, i, ev)
        {
            const char *nm = json_string_value(json_object_get(ev, "name"));
            if (nm && strcmp(nm, "thread_name") == 0 &&
                strcmp(json_string_value(json_object_get(json_object_get(ev, "args"), "name")),
                       tracks[t]) == 0)
                tid = json_integer_value(json_object_get(ev, "tid"));
        }
        if (tid < 0)
            fail_msg("the trace has no track '%s'", tracks[t]);
        int spans = 0;
        json_array_foreach(events, i, ev)
        {
            if (json_integer_value(json_object_get(ev, "tid")) != tid ||
                strcmp(json_string_value(json_object_get(ev, "ph")), "X"))
                continue;
            assert_true(json_number_value(json_object_get(ev, "ts")) >= 0);
            assert_true(json_number_value(json_object_get(ev, "dur")) >= 0);
            spans++;
        }
        if (spans == 0)
            fail_msg("track '%s' has no events", tracks[t]);
        check_nesting(events, tid);
    }
    int fwd = 0, bwd = 0;
    json_array_foreach(events, i, ev)
    {
        const char *nm = json_string_value(json_object_get(ev, "name"));
        fwd += nm && strncmp(nm, "forward L", 9) == 0;
        bwd += nm && strncmp(nm, "backward L", 10) == 0;
    }
    assert_true(fwd > 0 && bwd > 0);
    json_decref(events);
}

static void test_metrics_and_trace(void **state)
{
    char args[2048], metrics[300], trace[300], *err;
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", g_dir);
    snprintf(trace, sizeof trace, "%s/trace.json", g_dir);
    snprintf(
        args, sizeof args,
        "--steps 4 --json --metrics %s --trace %s --offload-param nvme --offload-optimizer nvme "
        "--nvme-path %s --optimizer-mode overlap --log-every 2" TINY,
        metrics, trace, g_dir);
    json_t *root = run_json(args, &err);
    check_metrics(metrics, root, 4);
    check_trace(trace);
    assert_int_equal(count(err, "step "), 3); /* not a terminal: steps 1, 2 and 4 */
    assert_non_null(strstr(err, "step 4/4  loss "));
    const char *parts[] = {"tok/s", "TFLOPS", "ETA ", "dev ",  "pin ",
                           "host ", "nvme ",  "GB/s", "stall "};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (!strstr(err, parts[i]))
            fail_msg("the progress line lacks '%s': %s", parts[i], err);
    json_decref(root);
    free(err);
}

/* On a terminal the line is rewritten in place. */
static void test_progress_on_a_terminal(void **state)
{
    int fd;
    pid_t pid = forkpty(&fd, NULL, NULL, NULL);
    assert_true(pid >= 0);
    if (pid == 0) {
        execl(ZT_EXE, ZT_EXE, "--steps", "3", "--device", "cpu", "--dim", "32", "--layers", "2",
              "--heads", "2", "--ffn", "64", "--seq", "16", "--val-batches", "1",
              "--offload-optimizer", "cpu", (char *)NULL);
        _exit(127);
    }
    char buf[1 << 16];
    size_t n = 0;
    ssize_t got;
    while (n < sizeof buf - 1 && (got = read(fd, buf + n, sizeof buf - 1 - n)) > 0)
        n += (size_t)got;
    buf[n] = 0;
    int st;
    waitpid(pid, &st, 0);
    close(fd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (!strstr(buf, "\r\033[Kstep 1/3  loss ") || !strstr(buf, "\r\033[Kstep 3/3  loss "))
        fail_msg("no in-place progress line in: %s", buf);
    assert_null(strstr(buf, "stall 0.0%\r\n"));       /* no newline between updates... */
    assert_non_null(strstr(buf, "\r\033[Kstep 3/3")); /* ...and one after the last */
}

/* --save writes DIR/hf-model; --hf-model trains from it; with --resume
 * its shape and the checkpoint's weights continue the run bitwise. */
static void test_hf_model_save_load_resume(void **state)
{
    char args[1024], *err;
    snprintf(args, sizeof args, SMALL " --steps 2 --json --save %s/hf-a", g_dir);
    json_decref(run_json(args, &err));
    free(err);
    snprintf(args, sizeof args, SMALL " --steps 2 --json --hf-model %s/hf-a/hf-model", g_dir);
    outputs o = run(args);
    assert_int_equal(o.status, 2); /* the shape is the directory's */
    assert_non_null(strstr(o.err, "--hf-model sets the model's shape"));
    outputs_free(&o);
#define HF_RUN                                                                                     \
    " --device cpu --seq 16 --micro-batch 2 --val-batches 2 --offload-optimizer nvme --json"
    snprintf(args, sizeof args, HF_RUN " --steps 4 --hf-model %s/hf-a/hf-model --save %s/hf-b",
             g_dir, g_dir);
    json_t *full = run_json(args, &err);
    free(err);
    snprintf(args, sizeof args, HF_RUN " --steps 2 --hf-model %s/hf-a/hf-model --save %s/hf-c",
             g_dir, g_dir);
    json_decref(run_json(args, &err));
    free(err);
    snprintf(args, sizeof args,
             HF_RUN " --steps 4 --hf-model %s/hf-a/hf-model --resume %s/hf-c --save %s/hf-c", g_dir,
             g_dir, g_dir);
    json_t *resumed = run_json(args, &err);
    free(err);
#undef HF_RUN
    json_t *a = json_object_get(full, "losses"), *b = json_object_get(resumed, "losses");
    assert_int_equal(json_array_size(a), 4);
    size_t nb = json_array_size(b);
    assert_true(nb >= 2);
    for (int i = 0; i < 2; i++) {
        double la = json_number_value(json_array_get(a, 2 + i));
        assert_true(la > 0 && la == json_number_value(json_array_get(b, nb - 2 + i)));
    }
    json_decref(full);
    json_decref(resumed);
}

static int setup(void **state)
{
    snprintf(g_dir, sizeof g_dir, "%s/zt-cli-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_lists_every_flag),
        cmocka_unit_test(test_hf_model_save_load_resume),
        cmocka_unit_test(test_json_summary),
        cmocka_unit_test(test_human_summary),
        cmocka_unit_test(test_bad_flags),
        cmocka_unit_test(test_bad_steps_reported_once),
        cmocka_unit_test(test_micro_group_config_and_flags),
        cmocka_unit_test(test_run_failure_exits_1),
        cmocka_unit_test(test_host_limit_refuses_before_allocating),
        cmocka_unit_test(test_config_host_mem_is_the_host_limit),
        cmocka_unit_test(test_host_mem_spills_gradients),
        cmocka_unit_test(test_config_drives_the_run),
        cmocka_unit_test(test_sparse_layout_counts_its_flops),
        cmocka_unit_test(test_flags_override_the_config),
        cmocka_unit_test(test_config_precision_picks_the_dtype),
        cmocka_unit_test(test_hf_auto_follows_the_flags),
        cmocka_unit_test(test_batch_flags_and_the_file),
        cmocka_unit_test(test_optimizer_defaults_and_cpu_offload),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_checkpoint_flags),
        cmocka_unit_test(test_metrics_and_trace),
        cmocka_unit_test(test_progress_on_a_terminal),
        cmocka_unit_test(test_up_front_checks),
        cmocka_unit_test(test_divergence_stops),
        cmocka_unit_test(test_flag_errors_exit_2),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
