/* The zo-plan program: --help; the --json object (every strategy with its
 * peak_bytes and step_seconds, the recommendation the fastest that fits);
 * --emit-config written and read back by zo_train_config_load; DeepSpeed's
 * estimates against their formulas; --hf-config; --bench-json; planning a
 * GPU that is not here; bad flags refused with exit status 2. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model_shape.h"
#include "plan_test_util.h"
#include "zo/config.h"
#include "zo_test.h"
#include "zt_host_limit.h"

#if !defined(ZP_EXE) || !defined(ZT_EXE) || !defined(ZB_EXE)
#error "ZP_EXE, ZT_EXE and ZB_EXE (the zo-plan, zo-train and zo-bench executables) must be defined"
#endif

typedef struct outputs {
    char *out, *err;
    int status;
} outputs;

/* zo-plan with args, its stdout and stderr captured in files. */
static outputs run(const char *args)
{
    char cmd[4096], out_path[300], err_path[300];
    snprintf(out_path, sizeof out_path, "%s/stdout.txt", g_dir);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", g_dir);
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s", ZP_EXE, args, out_path, err_path);
    int st = system(cmd);
    outputs o = {plan_test_read(out_path), plan_test_read(err_path),
                 WIFEXITED(st) ? WEXITSTATUS(st) : -1};
    return o;
}

static void outputs_free(outputs *o)
{
    free(o->out);
    free(o->err);
}

/* Another program's command line (its stderr captured) exits with the
 * usage error's status 2 and names message on stderr. */
static void expect_usage_error(const char *command, const char *message)
{
    char cmd[1200], path[300];
    snprintf(path, sizeof path, "%s/err.txt", g_dir);
    snprintf(cmd, sizeof cmd, "%s 2>%s", command, path);
    int st = system(cmd);
    char *txt = plan_test_read(path);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 2 || !strstr(txt, message))
        fail_msg("%s: status %d, stderr '%s' (expected 2 and '%s')", command, st, txt, message);
    free(txt);
}

/* Each case's arguments (cases[i][0]) exit with status and name
 * cases[i][1] on stderr. */
static void expect_refused(const char *cases[][2], size_t n, int status)
{
    for (size_t i = 0; i < n; i++) {
        outputs o = run(cases[i][0]);
        if (o.status != status || !strstr(o.err, cases[i][1]))
            fail_msg("zo-plan %s: exit %d, stderr '%s' (expected %d and '%s')", cases[i][0],
                     o.status, o.err, status, cases[i][1]);
        outputs_free(&o);
    }
}

static json_t *run_json(const char *args)
{
    char full[4096];
    snprintf(full, sizeof full, "--json %s", args);
    outputs o = run(full);
    if (o.status != 0)
        fail_msg("zo-plan %s: exit %d: %s", full, o.status, o.err);
    json_error_t err;
    json_t *j = json_loads(o.out, 0, &err);
    if (!j)
        fail_msg("zo-plan %s: not JSON (%s): %s", full, err.text, o.out);
    outputs_free(&o);
    return j;
}

static double num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v))
        fail_msg("no number '%s'", key);
    return json_number_value(v);
}

#define TINY_CPU " --device cpu --gpu-mem 24MiB --seq 64 --micro-batch 4 --nvme-bytes 1GiB"

static void test_help(void **state)
{
    (void)state;
    outputs o = run("--help");
    assert_int_equal(o.status, 0);
    const char *flags[] = {"--preset",
                           "--hf-config",
                           "--seq",
                           "--micro-batch",
                           "--grad-accum",
                           "--dtype",
                           "--optimizer-mode",
                           "--gpu-mem",
                           "--host-mem",
                           "--pinned-max",
                           "--nvme-path",
                           "--nvme-bytes",
                           "--nvme-tbw",
                           "--measure",
                           "--h2d-gbps",
                           "--nvme-update-gbps",
                           "--gpu-tflops",
                           "--bench-json",
                           "--json",
                           "--deepspeed-estimate",
                           "--emit-config",
                           "--pipeline-stages",
                           "--pipeline-split"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strstr(o.out, flags[i]))
            fail_msg("--help does not mention %s", flags[i]);
    outputs_free(&o);
}

/* An assumed speed says why it is assumed: without --measure it suggests
 * --measure; with --measure (which measures NVMe only in a directory) the
 * NVMe figures say --nvme-path is missing, and nothing suggests --measure. */
static void test_assumed_speeds_say_why(void **state)
{
    (void)state;
    outputs o = run(TINY_CPU);
    assert_int_equal(o.status, 0);
    assert_non_null(strstr(o.out, "assumed for the cpu device (pass --measure)"));
    outputs_free(&o);
    o = run(TINY_CPU " --measure");
    assert_int_equal(o.status, 0);
    assert_null(strstr(o.out, "pass --measure"));
    assert_non_null(strstr(o.out, "nvme read 0.50, write 0.40 GB/s (assumed for the cpu device "
                                  "(--measure needs --nvme-path to measure it))"));
    assert_non_null(strstr(o.out, "CPU Adam"));
    outputs_free(&o);
}

/* Figures printed together name each source where the sources differ (a
 * flag beside an assumption), in the text and --json alike; fp32's Adam
 * rate is "measured" in the formats only when it was (here, zo-bench),
 * not when it was given or assumed. */
static void write_file(const char *path, const char *text);

static json_t *format_row(json_t *j, const char *dtype)
{
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(j, "state_formats"), i,
                       f) if (strcmp(json_string_value(json_object_get(f, "state_dtype")), dtype) ==
                              0) return f;
    fail_msg("no state format %s", dtype);
    return NULL;
}

static void test_mixed_speed_sources(void **state)
{
    (void)state;
    outputs o = run(TINY_CPU " --h2d-gbps 7 --nvme-write-gbps 2");
    assert_int_equal(o.status, 0);
    assert_non_null(strstr(o.out, "h2d 7.00 GB/s, d2h 8.00 GB/s (h2d: --h2d-gbps; d2h: assumed "
                                  "for the cpu device (pass --measure))"));
    assert_non_null(strstr(o.out, "nvme read 0.50, write 2.00 GB/s (read: assumed for the cpu "
                                  "device (pass --measure); write: --nvme-write-gbps)"));
    outputs_free(&o);
    json_t *j = run_json(TINY_CPU " --adam-gparams 1.5 --nvme-write-gbps 2");
    json_t *src = json_object_get(json_object_get(j, "speeds"), "sources");
    assert_string_equal(json_string_value(json_object_get(src, "nvme_write_bytes_per_s")),
                        "--nvme-write-gbps");
    assert_string_equal(json_string_value(json_object_get(src, "nvme_read_bytes_per_s")),
                        "assumed for the cpu device (pass --measure)");
    assert_string_equal(json_string_value(json_object_get(src, "adam_params_per_s")),
                        "--adam-gparams");
    assert_true(json_is_false(json_object_get(format_row(j, "fp32"), "adam_measured")));
    json_decref(j);
    j = run_json(TINY_CPU);
    assert_true(json_is_false(json_object_get(format_row(j, "fp32"), "adam_measured")));
    json_decref(j);
    char path[300], args[700];
    snprintf(path, sizeof path, "%s/adam.jsonl", g_dir);
    write_file(path, "{\"bench\":\"adam\",\"gparams_per_s\":1.25}\n");
    snprintf(args, sizeof args, TINY_CPU " --bench-json %s", path);
    j = run_json(args);
    assert_true(json_is_true(json_object_get(format_row(j, "fp32"), "adam_measured")));
    assert_true(json_is_false(json_object_get(format_row(j, "bf16"), "adam_measured")));
    json_decref(j);
}

/* Every strategy reported with the keys zo-train --json uses; the
 * recommendation is the fastest of those that fit. */
static void test_json_and_recommendation(void **state)
{
    (void)state;
    json_t *j = run_json(TINY_CPU " --nvme-tbw 600");
    json_t *plans = json_object_get(j, "strategies");
    assert_int_equal(json_array_size(plans), 5);
    const char *best = NULL;
    double best_s = INFINITY;
    size_t i;
    json_t *p;
    json_array_foreach(plans, i, p)
    {
        json_t *peak = json_object_get(p, "peak_bytes");
        const char *keys[] = {"device", "pinned", "host", "nvme"};
        for (int k = 0; k < 4; k++)
            assert_true(json_is_integer(json_object_get(peak, keys[k])));
        double s = num(p, "step_seconds");
        assert_true(s > 0);
        assert_true(num(p, "tokens_per_s") > 0 && num(p, "mfu") > 0);
        assert_non_null(json_string_value(json_object_get(p, "bottleneck")));
        int fits = json_is_true(json_object_get(p, "fits"));
        if (!fits)
            assert_non_null(strstr(json_string_value(json_object_get(p, "why")), "tier"));
        if (fits && s < best_s) {
            best_s = s;
            best = json_string_value(json_object_get(p, "name"));
        }
        /* NVMe wear is reported where NVMe is written */
        json_t *days = json_object_get(p, "days_to_rated_endurance");
        int writes =
            json_integer_value(json_object_get(json_object_get(p, "step_bytes"), "nvme_write")) > 0;
        assert_true(writes ? json_is_number(days) : json_is_null(days));
    }
    assert_non_null(best);
    assert_string_equal(json_string_value(json_object_get(j, "recommended")), best);
    json_decref(j);

    /* nothing fits in 1 MiB: no recommendation, and nothing to emit */
    j = run_json(" --device cpu --gpu-mem 1MiB");
    assert_true(json_is_null(json_object_get(j, "recommended")));
    json_decref(j);
    char args[512];
    snprintf(args, sizeof args, "--device cpu --gpu-mem 1MiB --emit-config %s/none.json", g_dir);
    outputs o = run(args);
    assert_int_equal(o.status, 1);
    assert_non_null(strstr(o.err, "no strategy fits"));
    outputs_free(&o);
}

static void test_emit_config(void **state)
{
    (void)state;
    char path[300], args[700];
    snprintf(path, sizeof path, "%s/plan.json", g_dir);
    snprintf(args, sizeof args, TINY_CPU " --grad-accum 2 --nvme-path %s --emit-config %s", g_dir,
             path);
    json_t *j = run_json(args);
    const char *best = json_string_value(json_object_get(j, "recommended"));
    assert_non_null(best);
    json_t *plans = json_object_get(j, "strategies"), *rec = NULL, *p;
    size_t i;
    json_array_foreach(
        plans, i, p) if (strcmp(json_string_value(json_object_get(p, "name")), best) == 0) rec = p;
    assert_non_null(rec);
    zo_train_config c = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(zo_train_config_load(path, 1, &c));
    assert_int_equal(c.train_micro_batch_size_per_gpu, 4);
    assert_int_equal(c.gradient_accumulation_steps, 2);
    assert_int_equal(c.train_batch_size, 8);
    assert_true(c.bf16.enabled);
    assert_string_equal(zo_offload_device_name(c.zero_optimization.offload_param.device),
                        json_string_value(json_object_get(rec, "offload_param")));
    assert_string_equal(zo_offload_device_name(c.zero_optimization.offload_optimizer.device),
                        json_string_value(json_object_get(rec, "offload_optimizer")));
    assert_int_equal(c.zoffload.chunk_size, (int64_t)num(rec, "chunk_bytes"));
    assert_int_equal(c.zoffload.device_mem, 24 << 20);
    assert_int_equal(c.zoffload.n_nvme_paths, 1);
    assert_string_equal(c.zoffload.nvme_paths[0], g_dir);
    assert_string_equal(json_string_value(json_object_get(j, "emitted_config")), path);
    json_decref(j);
}

/* The emitted config runs: zo-train --config trains under it and measures
 * the peaks the plan predicted. */
static void test_emitted_config_runs_in_zo_train(void **state)
{
    (void)state;
    char path[300], args[700], cmd[1400], out_path[300];
    snprintf(path, sizeof path, "%s/run.json", g_dir);
    snprintf(args, sizeof args, TINY_CPU " --nvme-path %s --emit-config %s", g_dir, path);
    json_t *j = run_json(args), *p, *rec = NULL;
    size_t i;
    const char *best = json_string_value(json_object_get(j, "recommended"));
    json_array_foreach(json_object_get(j, "strategies"), i,
                       p) if (strcmp(json_string_value(json_object_get(p, "name")), best) == 0)
        rec = p;
    assert_non_null(rec);
    snprintf(out_path, sizeof out_path, "%s/zo-train.json", g_dir);
    snprintf(
        cmd, sizeof cmd,
        "%s --config %s --device cpu --seq 64 --steps 1 --val-batches 1 --json >%s 2>/dev/null",
        ZT_EXE, path, out_path);
    assert_int_equal(system(cmd), 0);
    char *text = plan_test_read(out_path);
    json_error_t err;
    json_t *t = json_loads(text, 0, &err);
    if (!t)
        fail_msg("zo-train --json: %s: %s", err.text, text);
    free(text);
    json_t *want = json_object_get(rec, "peak_bytes"), *got = json_object_get(t, "peak_bytes");
    const char *keys[] = {"device", "pinned", "host", "nvme"};
    for (int k = 0; k < 4; k++)
        assert_int_equal(json_integer_value(json_object_get(want, keys[k])),
                         json_integer_value(json_object_get(got, keys[k])));
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(rec, "device_bytes"), "total")),
        json_integer_value(json_object_get(json_object_get(t, "device"), "high_water")));
    json_decref(t);
    json_decref(j);
}

/* DeepSpeed's all_live estimators for one GPU: ZeRO-2 with the optimizer
 * offloaded, 2 B/param on the GPU and 16 x 1.5 on the CPU; ZeRO-3 with
 * both offloaded, the largest layer's 4 B/param on the GPU and 18 x 1.5. */
static void test_deepspeed_estimate(void **state)
{
    (void)state;
    json_t *j = run_json(TINY_CPU " --deepspeed-estimate");
    double P = num(json_object_get(j, "model"), "params");
    json_t *rows = json_object_get(j, "deepspeed_estimate");
    assert_int_equal(json_array_size(rows), 8);
    json_t *z2 = json_array_get(rows, 0), *z3 = json_array_get(rows, 2);
    assert_string_equal(json_string_value(json_object_get(z2, "options")), "offload_optimizer=cpu");
    assert_int_equal((int64_t)num(z2, "gpu_bytes"), (int64_t)(2 * P));
    assert_int_equal((int64_t)num(z2, "cpu_bytes"), (int64_t)(16 * 1.5 * P));
    assert_int_equal((int64_t)num(z3, "gpu_bytes"), 4 * 256 * 768); /* tiny's largest: 768 x 256 */
    assert_int_equal((int64_t)num(z3, "cpu_bytes"), (int64_t)(18 * 1.5 * P));
    json_decref(j);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_hf_config(void **state)
{
    (void)state;
    char path[300], args[700];
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    write_file(path,
               "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 512, "
               "\"intermediate_size\": 1376, \"num_hidden_layers\": 3, \"num_attention_heads\": 8, "
               "\"num_key_value_heads\": 2, \"vocab_size\": 1000, \"rms_norm_eps\": 1e-6, "
               "\"tie_word_embeddings\": false}");
    snprintf(args, sizeof args, TINY_CPU " --hf-config %s", path);
    json_t *j = run_json(args);
    json_t *m = json_object_get(j, "model");
    assert_int_equal((int)num(m, "dim"), 512);
    assert_int_equal((int)num(m, "layers"), 3);
    assert_int_equal((int)num(m, "ffn"), 1376);
    /* embedding, head, final norm, and per block 2 d^2 (q, o) + 2 d kv (k, v of 2 of the
     * 8 heads: kv = d / 4) + 3 d f + 2 d: grouped-query attention counted exactly */
    double d = 512, f = 1376, kv = d / 4;
    assert_int_equal(
        (int64_t)num(m, "params"),
        (int64_t)(2 * 1000 * d + d + 3 * (2 * d * d + 2 * d * kv + 3 * d * f + 2 * d)));
    assert_string_equal(json_string_value(json_object_get(m, "note")), "");
    json_decref(j);
    write_file(path, "{\"hidden_size\": 512}");
    outputs o = run(args);
    assert_int_equal(o.status, 2);
    assert_non_null(strstr(o.err, "num_hidden_layers"));
    outputs_free(&o);
}

static void test_bench_json_and_flags(void **state)
{
    (void)state;
    char path[300], args[700];
    snprintf(path, sizeof path, "%s/bench.jsonl", g_dir);
    write_file(path, "zo-bench io: a human line\n"
                     "{\"bench\":\"io\",\"rw\":\"read\",\"gbps\":3.5}\n"
                     "{\"bench\":\"io\",\"rw\":\"write\",\"gbps\":2.5}\n"
                     "{\"bench\":\"io\",\"rw\":\"update\",\"gbps\":1.75}\n"
                     "{\"bench\":\"adam\",\"gparams_per_s\":1.25}\n"
                     "{\"bench\":\"engine\",\"h2d_bytes\":1000000000,\"h2d_link_seconds\":0.05,"
                     "\"d2h_bytes\":1000000000,\"d2h_link_seconds\":0.1}\n");
    snprintf(args, sizeof args, TINY_CPU " --bench-json %s --gpu-tflops 2 --h2d-gbps 7", path);
    json_t *j = run_json(args);
    json_t *sp = json_object_get(j, "speeds"), *src = json_object_get(sp, "sources");
    assert_true(num(sp, "nvme_read_bytes_per_s") == 3.5e9);
    assert_true(num(sp, "nvme_write_bytes_per_s") == 2.5e9);
    assert_true(num(sp, "nvme_update_bytes_per_s") == 1.75e9);
    assert_true(num(sp, "adam_params_per_s") == 1.25e9);
    assert_true(num(sp, "h2d_bytes_per_s") == 7e9); /* the flag wins over the file */
    assert_true(num(sp, "d2h_bytes_per_s") == 1e10);
    assert_true(num(sp, "device_flops") == 2e12);
    assert_string_equal(json_string_value(json_object_get(src, "h2d_bytes_per_s")), "--h2d-gbps");
    assert_non_null(
        strstr(json_string_value(json_object_get(src, "adam_params_per_s")), "zo-bench"));
    json_decref(j);
}

/* zo-bench io --rw update (the engine's optimizer pipeline over a swap
 * store) gives zo-plan the update rate through --bench-json; a bad --rw is
 * refused naming the choices. */
static void test_bench_update_pipeline(void **state)
{
    (void)state;
    char cmd[1200], path[300], args[700];
    snprintf(path, sizeof path, "%s/update.jsonl", g_dir);
    snprintf(cmd, sizeof cmd,
             "%s io --path %s --size 12M --extent 2M --rw update --passes 3 --idle 0.01 --json >%s",
             ZB_EXE, g_dir, path);
    assert_int_equal(system(cmd), 0);
    char *txt = plan_test_read(path);
    json_error_t err;
    json_t *b = json_loads(txt, 0, &err);
    free(txt);
    if (!b)
        fail_msg("zo-bench io --rw update: not JSON (%s)", err.text);
    assert_string_equal(json_string_value(json_object_get(b, "rw")), "update");
    double gbps = num(b, "gbps");
    assert_true(gbps > 0);
    /* the reported rate is the median pass's */
    json_t *passes = json_object_get(b, "passes");
    assert_int_equal(json_array_size(passes), 3);
    double s[3];
    for (int k = 0; k < 3; k++)
        s[k] = json_real_value(json_array_get(passes, (size_t)k));
    double mid = s[0] + s[1] + s[2] - fmin(s[0], fmin(s[1], s[2])) - fmax(s[0], fmax(s[1], s[2]));
    assert_true(fabs(num(b, "seconds") - mid) <= 1e-12);
    assert_true(fabs(num(b, "idle_seconds") - 0.01) <= 1e-12);
    json_decref(b);
    snprintf(args, sizeof args, TINY_CPU " --bench-json %s", path);
    json_t *j = run_json(args);
    json_t *sp = json_object_get(j, "speeds"), *src = json_object_get(sp, "sources");
    assert_true(fabs(num(sp, "nvme_update_bytes_per_s") - gbps * 1e9) <= 1e-6 * gbps * 1e9);
    assert_non_null(
        strstr(json_string_value(json_object_get(src, "nvme_update_bytes_per_s")), "zo-bench"));
    json_decref(j);
    snprintf(cmd, sizeof cmd, "%s io --path %s --size 1M --rw mixed 2>%s/err.txt", ZB_EXE, g_dir,
             g_dir);
    int st = system(cmd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    snprintf(path, sizeof path, "%s/err.txt", g_dir);
    txt = plan_test_read(path);
    assert_non_null(strstr(txt, "read, write or update"));
    free(txt);
    snprintf(cmd, sizeof cmd, "%s io --path %s --size 1M --rw update --passes 0 2>%s/err.txt",
             ZB_EXE, g_dir, g_dir);
    st = system(cmd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    txt = plan_test_read(path);
    assert_non_null(strstr(txt, "1 to 100"));
    free(txt);
}

/* --validate runs every plan that fits through the trainer: the peaks it
 * measures are the predicted ones, and a step time is reported beside the
 * prediction (compared, not asserted: the machine's load decides it). */
static void test_validate(void **state)
{
    (void)state;
    char args[700];
    snprintf(args, sizeof args, TINY_CPU " --layers 2 --nvme-path %s --validate 2", g_dir);
    json_t *j = run_json(args);
    json_t *p;
    size_t i;
    int ran = 0;
    json_array_foreach(json_object_get(j, "strategies"), i, p)
    {
        json_t *v = json_object_get(p, "validation");
        if (!json_is_true(json_object_get(p, "fits"))) {
            assert_true(json_is_null(v));
            continue;
        }
        if (json_object_get(v, "error"))
            fail_msg("%s: %s", json_string_value(json_object_get(p, "name")),
                     json_string_value(json_object_get(v, "error")));
        json_t *want = json_object_get(p, "peak_bytes"), *got = json_object_get(v, "peak_bytes");
        const char *keys[] = {"device", "pinned", "host", "nvme"};
        for (int k = 0; k < 4; k++)
            assert_int_equal(json_integer_value(json_object_get(want, keys[k])),
                             json_integer_value(json_object_get(got, keys[k])));
        assert_int_equal(
            json_integer_value(json_object_get(json_object_get(p, "device_bytes"), "total")),
            json_integer_value(json_object_get(v, "device_total")));
        assert_true(num(v, "step_seconds") > 0);
        assert_true(isfinite(num(v, "step_error")));
        assert_true(num(v, "optimizer_busy_seconds") >= 0 && num(v, "nvme_wait_seconds") >= 0);
        if (json_integer_value(json_object_get(want, "nvme")) >
            0) /* its optimizer waits on the disk */
            assert_true(num(v, "nvme_wait_seconds") > 0);
        ran++;
    }
    assert_true(ran >= 3);
    json_decref(j);
    outputs o = run("--validate 0");
    assert_int_equal(o.status, 2);
    outputs_free(&o);
}

/* A GPU that is not here can be planned for with --gpu-mem, not without. */
static void test_planning_an_absent_gpu(void **state)
{
    (void)state;
    json_t *j = run_json("--device cuda --gpu-mem 80GiB --host-mem 512GiB --preset 7b --seq 2048 "
                         "--micro-batch 1");
    json_t *hw = json_object_get(j, "hardware");
    assert_string_equal(json_string_value(json_object_get(hw, "backend")), "cuda");
    assert_int_equal((int64_t)num(hw, "reserve_bytes"), 512 << 20);
    /* the device's Adam updates device-resident states on a GPU too: planned,
     * and 7B's 16 bytes a parameter do not fit 80 GiB */
    json_t *none = json_array_get(json_object_get(j, "strategies"), 0);
    assert_true(json_is_true(json_object_get(none, "supported")));
    assert_false(json_is_true(json_object_get(none, "fits")));
    json_decref(j);
    outputs o = run("--device cuda");
    if (o.status == 1) /* no GPU here */
        assert_non_null(strstr(o.err, "--gpu-mem"));
    outputs_free(&o);
}

/* The host budget is zo-train's own host limit (RAM less its margin, or the
 * cgroup's limit), so a plan that fits is one zo-train accepts; RAM is the
 * kernel's figure, not the NUMA nodes' sum, which in a VM held 5.0 of
 * 125.9 GiB. The cpu device's memory comes out of the same limit. */
static void test_host_budget_is_zo_trains_limit(void **state)
{
    (void)state;
    char why[128];
    uint64_t limit = zt_host_limit(why, sizeof why);
    uint64_t ram = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    json_t *j = run_json("--device cuda --gpu-mem 80GiB --preset tiny");
    json_t *hw = json_object_get(j, "hardware");
    assert_int_equal((uint64_t)num(hw, "host_bytes"), limit);
    assert_int_equal((uint64_t)num(hw, "host_ram"), ram);
    assert_non_null(strstr(json_string_value(json_object_get(hw, "host_how")), why));
    json_decref(j);
    j = run_json(TINY_CPU);
    hw = json_object_get(j, "hardware");
    assert_int_equal((uint64_t)num(hw, "host_bytes"), limit - (uint64_t)num(hw, "device_bytes"));
    json_decref(j);
}

/* Counts no real model has are refused at once (--layers 100000000 used to
 * plan for minutes in ~20 GB), as are key/value heads that do not divide
 * the heads, and a zo-bench io size below one request (it timed 0 bytes). */
static void test_absurd_inputs_refused(void **state)
{
    (void)state;
    char path[300], cmd[1200];
    outputs o = run("--layers 100000000");
    assert_int_equal(o.status, 2);
    assert_non_null(strstr(o.err, "layers 100000000 is over"));
    outputs_free(&o);
    snprintf(path, sizeof path, "%s/kv.json", g_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"hidden_size\": 4096, \"num_hidden_layers\": 32, \"num_attention_heads\": 32, "
          "\"num_key_value_heads\": 7, \"intermediate_size\": 11008, \"vocab_size\": 32000}",
          f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "--hf-config %s", path);
    o = run(cmd);
    assert_int_equal(o.status, 2);
    assert_non_null(strstr(o.err, "'num_key_value_heads' 7 must divide 'num_attention_heads' 32"));
    outputs_free(&o);
    snprintf(cmd, sizeof cmd, "%s io --path %s --size 4K --bs 1M --rw read", ZB_EXE, g_dir);
    expect_usage_error(cmd, "--size must be at least --bs");
}

static void test_bad_flags(void **state)
{
    (void)state;
    const char *bad[][2] = {{"--gpu-mem lots", "--gpu-mem"},
                            {"--state-dtype fp8", "fp32, bf16, int8 or auto"},
                            {"--dtype fp8", "bf16, fp16 or fp32"},
                            {"--optimizer-mode eager", "sync, overlap or dpu"},
                            {"--seq 0", "--seq"},
                            {"--preset huge", "unknown preset"},
                            {"--heads 3", "heads"},
                            {"--h2d-gbps -1", "--h2d-gbps"},
                            {"--adam-gparams none", "--adam-gparams"},
                            {"--gpu-tflops 0", "--gpu-tflops"},
                            {"--nvme-update-gbps -2", "--nvme-update-gbps"},
                            {"--validate x", "--validate"},
                            {"--world-size 0", "--world-size"},
                            {"--gpus-per-node many", "--gpus-per-node"},
                            {"--link-gbps -3", "--link-gbps"},
                            {"--frobnicate", "unknown option"},
                            {"stray", "unexpected argument"}};
    expect_refused(bad, sizeof bad / sizeof bad[0], 2);
    /* each speed flag is named as the source of its figure */
    json_t *j = run_json(TINY_CPU " --adam-gparams 2 --gpu-tflops 300 --nvme-update-gbps 5");
    json_t *src = json_object_get(json_object_get(j, "speeds"), "sources");
    assert_string_equal(json_string_value(json_object_get(src, "adam_params_per_s")),
                        "--adam-gparams");
    assert_string_equal(json_string_value(json_object_get(src, "device_flops")), "--gpu-tflops");
    assert_string_equal(json_string_value(json_object_get(src, "nvme_update_bytes_per_s")),
                        "--nvme-update-gbps");
    json_decref(j);
}

#define WORKSTATION_13B                                                                            \
    "--preset 13b --device cuda --gpu-mem 24GiB --nvme-bytes 2TB --nvme-read-gbps 6 "              \
    "--nvme-write-gbps 5 --h2d-gbps 25 --d2h-gbps 25 --adam-gparams 2 --gpu-tflops 165 --seq "     \
    "2048 "                                                                                        \
    "--micro-batch 1 --grad-accum 32"

/* Issue 15's workstation: the per-chunk plan fits 13b on a 24 GiB GPU with
 * 64 GiB of host memory at a predicted MFU of 40% or more, and is
 * recommended; one byte below the least host memory it reports it is
 * refused, naming the host tier. */
static void test_13b_workstation_plan(void **state)
{
    (void)state;
    json_t *j = run_json(WORKSTATION_13B " --host-mem 64GiB");
    json_t *p = json_object_get(j, "plan");
    if (!json_is_true(json_object_get(p, "fits")))
        fail_msg("13b at 64 GiB: %s", json_string_value(json_object_get(p, "why")));
    assert_true(num(p, "mfu") >= 0.40);
    assert_string_equal(json_string_value(json_object_get(j, "recommendation")), "per-chunk");
    assert_true(num(p, "host_budget") == 64.0 * (1ull << 30));
    assert_true(num(p, "micro_group") >= 1 && num(p, "micro_group") <= 32);
    assert_non_null(json_string_value(json_object_get(p, "act_home")));
    assert_non_null(json_object_get(json_object_get(p, "placement"), "params"));
    double floor_bytes = num(p, "host_floor");
    json_decref(j);
    char args[512];
    snprintf(args, sizeof args, WORKSTATION_13B " --host-mem %.0f", floor_bytes - 1);
    j = run_json(args);
    p = json_object_get(j, "plan");
    assert_false(json_is_true(json_object_get(p, "fits")));
    assert_non_null(strstr(json_string_value(json_object_get(p, "why")), "host tier"));
    assert_true(json_is_null(json_object_get(j, "recommendation")));
    json_decref(j);
}

/* 13b at 32 GiB of host memory: only with the layer inputs on NVMe (the
 * planner's choice), whose bytes the plan counts on NVMe (every block's input
 * of the 32 micro-batches, written and read back each step) and whose carry
 * and pinned ring are all the host keeps of them; forced onto the host, the
 * plan does not fit. */
static void test_13b_at_32gib_puts_layer_inputs_on_nvme(void **state)
{
    (void)state;
    json_t *j = run_json(WORKSTATION_13B " --host-mem 32GiB");
    json_t *p = json_object_get(j, "plan");
    if (!json_is_true(json_object_get(p, "fits")))
        fail_msg("13b at 32 GiB: %s", json_string_value(json_object_get(p, "why")));
    assert_string_equal(json_string_value(json_object_get(p, "act_home")), "nvme");
    const double rec = 2048.0 * 5120 * 2, M = 32, L = 40; /* one block input, bf16 */
    double G = num(p, "micro_group");
    assert_true(num(json_object_get(p, "nvme_bytes"), "layer_inputs") == G * L * rec);
    assert_true(num(json_object_get(p, "traffic"), "nvme_layer_inputs") == M * L * rec);
    assert_true(num(p, "layer_input_bytes") == G * (L + 1) * rec); /* NVMe and the carry */
    assert_true(num(p, "host_floor") < 32.0 * (1ull << 30));
    assert_true(num(p, "mfu") >= 0.40);
    json_decref(j);
    j = run_json(WORKSTATION_13B " --host-mem 32GiB --act-home host");
    assert_false(json_is_true(json_object_get(json_object_get(j, "plan"), "fits")));
    json_decref(j);
}

/* The per-chunk plan's choices can be forced, and bad ones are refused. */
static void test_micro_group_and_act_home(void **state)
{
    (void)state;
    json_t *j = run_json(TINY_CPU " --grad-accum 4 --micro-group 2 --act-home host");
    json_t *p = json_object_get(j, "plan");
    assert_int_equal((int)num(p, "micro_group"), 2);
    assert_int_equal((int)num(p, "groups_per_step"), 2);
    assert_string_equal(json_string_value(json_object_get(p, "act_home")), "host");
    json_decref(j);
    const char *bad[][2] = {{"--micro-group 0", "--micro-group"},
                            {"--micro-group 3", "at most --grad-accum"},
                            {"--act-home disk", "auto, device, host or nvme"}};
    expect_refused(bad, sizeof bad / sizeof bad[0], 2);
    /* zo-train has no per-layer NVMe home: refused as zo-train refuses it */
    const char *nvme[][2] = {{"--act-home nvme", "at one micro-batch a group"},
                             {"--grad-accum 4 --micro-group 1 --act-home nvme", "--act-home host"}};
    expect_refused(nvme, sizeof nvme / sizeof nvme[0], 1);
}

/* --emit-config of a per-chunk recommendation writes its split as
 * zoffload.placement, read back by zo_train_config_load. */
static void test_emit_split_config(void **state)
{
    (void)state;
    char path[300], args[900];
    snprintf(path, sizeof path, "%s/split.json", g_dir);
    /* 80 GiB: at 64 the states all go to NVMe (a host-homed chunk's gradients stay pinned) */
    snprintf(args, sizeof args, WORKSTATION_13B " --host-mem 80GiB --nvme-path %s --emit-config %s",
             g_dir, path);
    json_t *j = run_json(args);
    assert_string_equal(json_string_value(json_object_get(j, "recommendation")), "per-chunk");
    json_t *pl = json_object_get(json_object_get(j, "plan"), "placement");
    zo_train_config c = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(zo_train_config_load(path, 1, &c));
    assert_int_equal(c.zoffload.placement.params.device,
                     (int64_t)num(json_object_get(pl, "params"), "device"));
    assert_int_equal(c.zoffload.placement.optimizer.host,
                     (int64_t)num(json_object_get(pl, "optimizer"), "host"));
    assert_true(c.zoffload.placement.optimizer.host > 0);
    assert_string_equal(
        zo_optim_mode_name(c.zoffload.optimizer_mode),
        json_string_value(json_object_get(json_object_get(j, "plan"), "optimizer_mode")));
    json_t *plan = json_object_get(j, "plan");
    assert_int_equal(c.zoffload.micro_group, (int64_t)num(plan, "micro_group"));
    const char *home = json_string_value(json_object_get(plan, "act_home"));
    assert_int_equal(c.zoffload.act_home, !strcmp(home, "host")   ? 1
                                          : !strcmp(home, "nvme") ? 2
                                                                  : 0);
    json_decref(j);
}

/* On the cpu device zo-plan's host budget leaves the emulated device out
 * while zo-train counts it against --host-mem: the emitted config and the
 * printed command carry the budget plus the device, so zo-train runs the
 * per-chunk plan under exactly what zo-plan was given. */
static void test_cpu_device_host_mem_counts_the_device(void **state)
{
    (void)state;
    char path[300], args[700], cmd[1400];
    snprintf(path, sizeof path, "%s/cpu-host.json", g_dir);
    snprintf(args, sizeof args, TINY_CPU " --host-mem 32MiB --nvme-path %s --emit-config %s", g_dir,
             path);
    json_t *j = run_json(args);
    assert_string_equal(json_string_value(json_object_get(j, "recommendation")), "per-chunk");
    zo_train_config c = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(zo_train_config_load(path, 1, &c));
    assert_int_equal(c.zoffload.host_mem, (32 << 20) + (24 << 20));
    snprintf(cmd, sizeof cmd,
             "%s --config %s --device cpu --seq 64 --steps 1 --val-batches 1 >/dev/null 2>&1",
             ZT_EXE, path);
    assert_int_equal(system(cmd), 0);
    outputs o = run(TINY_CPU " --host-mem 32MiB");
    assert_int_equal(o.status, 0);
    if (!strstr(o.out, "--host-mem 58720256 "))
        fail_msg("the recommended command lacks --host-mem 125829120: %s", o.out);
    outputs_free(&o);
    json_decref(j);
}

/* --validate runs the per-chunk plan with its group and layer inputs' home:
 * with nothing on NVMe nothing is modelled, and the trainer measures the
 * peaks and the device total the plan predicts. */
static void validate_grouped_plan(const char *args)
{
    json_t *j = run_json(args);
    json_t *p = json_object_get(j, "plan"), *v = json_object_get(p, "validation");
    assert_true(json_is_true(json_object_get(p, "fits")));
    assert_int_equal((int)num(p, "micro_group"), 2);
    if (json_object_get(v, "error"))
        fail_msg("%s", json_string_value(json_object_get(v, "error")));
    json_t *want = json_object_get(p, "peak_bytes"), *got = json_object_get(v, "peak_bytes");
    const char *keys[] = {"device", "pinned", "host", "nvme"};
    for (int k = 0; k < 4; k++)
        assert_int_equal(json_integer_value(json_object_get(want, keys[k])),
                         json_integer_value(json_object_get(got, keys[k])));
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(p, "device_bytes"), "total")),
        json_integer_value(json_object_get(v, "device_total")));
    json_decref(j);
}

static void test_validate_grouped_plan(void **state)
{
    (void)state;
    validate_grouped_plan(TINY_CPU " --grad-accum 4 --micro-group 2 --act-home host --validate 1");
    /* the layer inputs on NVMe: the engine's peaks as planned beside them */
    char args[600];
    snprintf(args, sizeof args,
             TINY_CPU " --grad-accum 4 --micro-group 2 --act-home nvme --nvme-path %s --validate 1",
             g_dir);
    validate_grouped_plan(args);
}

/* The state formats' comparison: the 13b workstation job is NVMe-bound in
 * fp32, so auto picks a compact format, saying what it trades; with a GPU
 * so slow that compute is the bottleneck, auto keeps fp32. Each format's
 * NVMe bytes per step are at most fp32's. */
static void test_state_dtype_auto(void **state)
{
    (void)state;
    json_t *j = run_json(WORKSTATION_13B " --host-mem 64GiB --state-dtype auto --nvme-tbw 1200");
    const char *chosen = json_string_value(json_object_get(j, "state_dtype"));
    assert_non_null(chosen);
    assert_true(strcmp(chosen, "bf16") == 0 || strcmp(chosen, "int8") == 0);
    assert_true(json_is_true(json_object_get(j, "state_dtype_auto")));
    assert_non_null(strstr(json_string_value(json_object_get(j, "state_dtype_reason")), "trades"));
    json_t *f = json_object_get(j, "state_formats");
    assert_int_equal(json_array_size(f), 3);
    json_t *f32 = json_array_get(f, 0);
    assert_string_equal(json_string_value(json_object_get(f32, "bottleneck")), "NVMe");
    for (size_t i = 1; i < 3; i++) {
        json_t *c = json_array_get(f, i);
        assert_true(num(c, "nvme_state_bytes_per_step") < num(f32, "nvme_state_bytes_per_step"));
        assert_true(num(c, "step_seconds") < num(f32, "step_seconds"));
    }
    json_decref(j);
    j = run_json(WORKSTATION_13B " --host-mem 64GiB --state-dtype auto --gpu-tflops 5");
    assert_string_equal(json_string_value(json_object_get(j, "state_dtype")), "fp32");
    f32 = json_array_get(json_object_get(j, "state_formats"), 0);
    assert_string_equal(json_string_value(json_object_get(f32, "bottleneck")), "GPU compute");
    json_decref(j);
}

/* --state-dtype int8 --emit-config: the config names the format, and
 * zo-train trains under it with the peaks the plan predicted for it. */
static void test_emit_state_dtype(void **state)
{
    (void)state;
    char path[300], args[700], cmd[1400], out_path[300];
    snprintf(path, sizeof path, "%s/int8.json", g_dir);
    snprintf(args, sizeof args,
             TINY_CPU " --optimizer-mode sync --state-dtype int8 --nvme-path %s --emit-config %s",
             g_dir, path);
    json_t *j = run_json(args), *p, *rec = NULL;
    assert_string_equal(json_string_value(json_object_get(j, "state_dtype")), "int8");
    zo_train_config c = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(zo_train_config_load(path, 1, &c));
    assert_int_equal(c.zoffload.optimizer_state_dtype, ZO_DTYPE_I8);
    size_t i;
    const char *best = json_string_value(json_object_get(j, "recommended"));
    json_array_foreach(json_object_get(j, "strategies"), i,
                       p) if (strcmp(json_string_value(json_object_get(p, "name")), best) == 0)
        rec = p;
    assert_non_null(rec);
    snprintf(out_path, sizeof out_path, "%s/zo-train-int8.json", g_dir);
    snprintf(
        cmd, sizeof cmd,
        "%s --config %s --device cpu --seq 64 --steps 1 --val-batches 1 --json >%s 2>/dev/null",
        ZT_EXE, path, out_path);
    assert_int_equal(system(cmd), 0);
    char *text = plan_test_read(out_path);
    json_error_t err;
    json_t *t = json_loads(text, 0, &err);
    if (!t)
        fail_msg("zo-train --json: %s: %s", err.text, text);
    free(text);
    json_t *want = json_object_get(rec, "peak_bytes"), *got = json_object_get(t, "peak_bytes");
    const char *keys[] = {"device", "pinned", "host", "nvme"};
    for (int k = 0; k < 4; k++)
        assert_int_equal(json_integer_value(json_object_get(want, keys[k])),
                         json_integer_value(json_object_get(got, keys[k])));
    json_decref(t);
    json_decref(j);
}

/* --update-behind off reaches the JSON, the emitted config and the
 * recommended command, and slows the plan that keeps everything on NVMe
 * (the update back in end_step); on is the default and says nothing. */
static void test_update_behind_flag(void **state)
{
    (void)state;
    char path[300], args[700];
    snprintf(path, sizeof path, "%s/behind.json", g_dir);
    double steps[2] = {-1, -1};
    for (int off = 0; off < 2; off++) {
        snprintf(args, sizeof args,
                 TINY_CPU " --optimizer-mode sync --nvme-path %s --emit-config %s%s", g_dir, path,
                 off ? " --update-behind off" : "");
        json_t *j = run_json(args), *p;
        assert_int_equal(json_is_true(json_object_get(j, "update_behind")), !off);
        size_t i;
        json_array_foreach(json_object_get(j, "strategies"), i, p)
        {
            if (strcmp(json_string_value(json_object_get(p, "name")), "params+optimizer-nvme") == 0)
                steps[off] = num(p, "step_seconds");
        }
        json_decref(j);
        zo_train_config c = ZO_TRAIN_CONFIG_INIT;
        ZO_ASSERT_OK(zo_train_config_load(path, 1, &c));
        assert_int_equal(c.zoffload.update_behind, !off);
        outputs o = run(args);
        assert_int_equal(o.status, 0);
        assert_int_equal(strstr(o.out, " --update-behind off") != NULL, off);
        outputs_free(&o);
    }
    assert_true(steps[0] > 0 && steps[0] < steps[1]);
    const char *bad[][2] = {{TINY_CPU " --update-behind maybe", "on or off"}};
    expect_refused(bad, 1, 2);
}

/* --world-size: rank 0's plans of ZeRO stages 1-3 against its share of the
 * node, the link's source, the recommendation's command; none without it. */
/* --max-seq: the length it names fits (a recommendation at --seq N) and one
 * token more does not (none), with the reason; the plans shown are at N. A
 * budget nothing fits in at all is refused naming --micro-batch. */
static void test_max_seq(void **state)
{
    const char *job = "--device cpu --gpu-mem 64MiB --micro-batch 1";
    char args[512];
    snprintf(args, sizeof args, "%s --max-seq", job);
    json_t *j = run_json(args);
    json_t *m = json_object_get(j, "max_seq");
    int n = (int)json_integer_value(json_object_get(m, "seq"));
    assert_true(n > 128);
    assert_int_equal(json_integer_value(json_object_get(m, "micro_batch")), 1);
    assert_non_null(strstr(json_string_value(json_object_get(m, "longer_refused")), "budget"));
    assert_false(json_is_null(json_object_get(j, "recommendation")));
    json_decref(j);
    snprintf(args, sizeof args, "%s --seq %d", job, n);
    j = run_json(args);
    assert_false(json_is_null(json_object_get(j, "recommendation")));
    json_decref(j);
    snprintf(args, sizeof args, "%s --seq %d", job, n + 1);
    j = run_json(args);
    assert_true(json_is_null(json_object_get(j, "recommendation")));
    json_decref(j);
    outputs o = run("--device cpu --gpu-mem 64MiB --micro-batch 1 --max-seq");
    assert_int_equal(o.status, 0);
    char want[64];
    snprintf(want, sizeof want, "longest sequence: %d tokens", n);
    assert_non_null(strstr(o.out, want));
    outputs_free(&o);
    o = run("--device cpu --gpu-mem 1MiB --max-seq");
    assert_int_equal(o.status, 1);
    assert_non_null(strstr(o.err, "--max-seq: not even --seq 1 fits at --micro-batch 8"));
    outputs_free(&o);
}

/* The chunk rule: zo-plan also tries a chunk that holds a whole block, and
 * zo-train without --chunk-bytes always takes the default (the largest
 * tensor), so the printed command must carry the plan's chunk for the run to
 * be the plan's. At the longest sequence tiny trains at in 64 MiB the block
 * chunk wins: the recommendation's --chunk-bytes is the JSON plan's, and
 * differs from the default zo-train would pick. */
static void test_command_carries_plan_chunk(void **state)
{
    (void)state;
    const char *job = "--preset tiny --device cpu --gpu-mem 64MiB --micro-batch 1 --max-seq "
                      "--attention flash";
    char args[512];
    snprintf(args, sizeof args, "%s", job);
    json_t *j = run_json(args);
    const char *rec_name = json_string_value(json_object_get(j, "recommendation"));
    assert_non_null(rec_name);
    json_t *plans = json_object_get(j, "strategies"), *p, *rec = NULL;
    size_t i;
    json_array_foreach(plans, i, p)
    {
        if (strcmp(json_string_value(json_object_get(p, "name")), rec_name) == 0)
            rec = p;
    }
    if (!rec)
        rec = json_object_get(j, "plan");
    uint64_t want = (uint64_t)num(rec, "chunk_bytes");
    json_decref(j);
    outputs o = run(args);
    assert_int_equal(o.status, 0);
    const char *at = strstr(o.out, "recommended: ");
    assert_non_null(at);
    at = strstr(at, "--chunk-bytes ");
    assert_non_null(at);
    unsigned long long got = strtoull(at + strlen("--chunk-bytes "), NULL, 10);
    outputs_free(&o);
    assert_int_equal(got, want);
    zt_shape s;
    ZO_ASSERT_OK(zt_preset("tiny", &s));
    assert_int_not_equal(got, zt_default_chunk_bytes(&s));
}

/* The longest sequence and the MLP chunk of a job (--max-seq with args). */
static int max_seq_of(const char *args, uint64_t *mlp_chunk)
{
    char full[600];
    snprintf(full, sizeof full, "%s --max-seq", args);
    json_t *j = run_json(full);
    int n = (int)json_integer_value(json_object_get(json_object_get(j, "max_seq"), "seq"));
    *mlp_chunk = (uint64_t)num(json_object_get(j, "job"), "mlp_chunk_bytes");
    json_decref(j);
    return n;
}

/* Whether some plan of the job fits (a recommendation). */
static int fits(const char *args)
{
    json_t *j = run_json(args);
    int ok = !json_is_null(json_object_get(j, "recommendation"));
    json_decref(j);
    return ok;
}

/* --mlp-chunk-bytes auto (the default): at --max-seq the planner takes the
 * largest MLP chunk that lets the longest sequence fit, which is longer than
 * zo-train's default 16 MiB allows. The length fits with the chunk given
 * explicitly and not with the next larger one (twice it); the command and
 * the emitted config carry it; a bad value is refused by both tools. */
static void test_max_seq_chooses_mlp_chunk(void **state)
{
    (void)state;
    const char *job = "--preset tiny --device cpu --gpu-mem 64MiB --micro-batch 1";
    char args[700], path[300];
    uint64_t chunk, fixed_chunk;
    int n = max_seq_of(job, &chunk);
    snprintf(args, sizeof args, "%s --mlp-chunk-bytes 16MiB", job);
    int fixed = max_seq_of(args, &fixed_chunk);
    assert_int_equal(fixed_chunk, 16u << 20);
    assert_true(n > fixed);
    assert_true(chunk < fixed_chunk);
    snprintf(args, sizeof args, "%s --seq %d --mlp-chunk-bytes %llu", job, n,
             (unsigned long long)chunk);
    assert_true(fits(args));
    snprintf(args, sizeof args, "%s --seq %d --mlp-chunk-bytes %llu", job, n,
             (unsigned long long)(2 * chunk));
    assert_false(fits(args));
    snprintf(path, sizeof path, "%s/mlp.json", g_dir);
    snprintf(args, sizeof args, "%s --max-seq --emit-config %s", job, path);
    outputs o = run(args);
    assert_int_equal(o.status, 0);
    char want[64];
    snprintf(want, sizeof want, "--mlp-chunk-bytes %llu", (unsigned long long)chunk);
    const char *rec = strstr(o.out, "recommended: ");
    assert_non_null(rec);
    assert_non_null(strstr(rec, want));
    outputs_free(&o);
    zo_train_config c = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(zo_train_config_load(path, 1, &c));
    assert_int_equal(c.zoffload.mlp_chunk_bytes, (int64_t)chunk);
    const char *bad[][2] = {
        {"--mlp-chunk-bytes 0", "--mlp-chunk-bytes '0': expected auto or a byte count"},
        {"--mlp-chunk-bytes lots", "--mlp-chunk-bytes 'lots': expected auto or a byte count"},
    };
    expect_refused(bad, 2, 2);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "%s --mlp-chunk-bytes 0 --steps 1", ZT_EXE);
    expect_usage_error(cmd, "--mlp-chunk-bytes '0': expected auto or a byte count");
}

/* --set sparse_attention.KEY=VALUE: the layout zo-train's --config would
 * give; its density (the library's count) in --json, and lower step time
 * than dense; --emit-config writes the section; keys outside the section,
 * values the config parser refuses and the dense op are refused. */
static void test_sparse_attention_set(void **state)
{
    (void)state;
    const char *job = "--preset small --device cpu --gpu-mem 8GiB --seq 4096 --micro-batch 1";
    char args[700], path[300];
    snprintf(path, sizeof path, "%s/sparse.json", g_dir);
    snprintf(args, sizeof args,
             "%s --set sparse_attention.mode=fixed --set sparse_attention.block=64 "
             "--set sparse_attention.num_local_blocks=8 --set sparse_attention.num_global_blocks=2 "
             "--emit-config %s",
             job, path);
    json_t *j = run_json(args);
    json_t *sa = json_object_get(json_object_get(j, "job"), "sparse_attention");
    assert_string_equal(json_string_value(json_object_get(sa, "mode")), "fixed");
    zo_attn_layout l = ZO_ATTN_LAYOUT_INIT;
    l.kind = ZO_ATTN_LAYOUT_FIXED, l.block = 64, l.window_blocks = 8, l.global_blocks = 2;
    double share;
    ZO_ASSERT_OK(zt_layout_share(&l, 0, 4096, &share));
    assert_true(fabs(num(sa, "density") - share) <= 1e-9);
    double sparse_step = num(json_array_get(json_object_get(j, "strategies"), 0), "step_seconds");
    json_decref(j);
    j = run_json(job);
    double dense_step = num(json_array_get(json_object_get(j, "strategies"), 0), "step_seconds");
    assert_null(json_object_get(json_object_get(j, "job"), "sparse_attention"));
    json_decref(j);
    assert_true(sparse_step < dense_step);
    zo_train_config c = ZO_TRAIN_CONFIG_INIT;
    ZO_ASSERT_OK(zo_train_config_load(path, 1, &c));
    assert_true(c.sparse_attention.enabled);
    assert_int_equal(c.sparse_attention.mode, ZO_SPARSE_FIXED);
    assert_int_equal(c.sparse_attention.block, 64);
    assert_int_equal(c.sparse_attention.num_local_blocks, 8);
    assert_int_equal(c.sparse_attention.num_global_blocks, 2);
    const char *bad[][2] = {
        {"--set zoffload.act_home=host",
         "--set 'zoffload.act_home=host': expected sparse_attention.KEY=VALUE"},
        {"--set sparse_attention.mode=blocky",
         "--set: 'sparse_attention.mode': expected one of dense, fixed, bigbird, sliding_window, "
         "found string \"blocky\""},
        {"--set sparse_attention.block=24",
         "'sparse_attention.block' 24 must be a multiple of 16 (16..512)"},
        {"--attention dense --set sparse_attention.mode=fixed", "use --attention flash"},
    };
    expect_refused(bad, sizeof bad / sizeof bad[0], 2);
}

static void test_world_size(void **state)
{
    (void)state;
    json_t *one = run_json(TINY_CPU " --host-mem 8GiB");
    assert_null(json_object_get(one, "zero"));
    json_decref(one);
    json_t *j = run_json(TINY_CPU " --host-mem 8GiB --world-size 4 --gpus-per-node 2");
    json_t *z = json_object_get(j, "zero");
    assert_non_null(z);
    assert_int_equal(json_integer_value(json_object_get(z, "world_size")), 4);
    assert_int_equal(json_integer_value(json_object_get(z, "gpus_per_node")), 2);
    assert_string_equal(json_string_value(json_object_get(z, "link_source")), "assumed");
    json_t *share = json_object_get(z, "rank_share");
    assert_int_equal(json_integer_value(json_object_get(share, "host_bytes")), 4ll << 30);
    json_t *plans = json_object_get(z, "plans");
    assert_int_equal(json_array_size(plans), 15); /* 3 stages x 5 placements */
    for (size_t i = 0; i < json_array_size(plans); i++) {
        json_t *p = json_array_get(plans, i);
        assert_int_equal(json_integer_value(json_object_get(p, "stage")), (json_int_t)(i / 5 + 1));
        if (!json_is_true(json_object_get(p, "fits")))
            continue;
        json_t *b = json_object_get(p, "per_rank_bytes");
        assert_true(json_integer_value(json_object_get(b, "host")) +
                        json_integer_value(json_object_get(b, "pinned")) <=
                    4ll << 30);
    }
    json_t *rec = json_object_get(z, "recommended");
    assert_non_null(strstr(json_string_value(json_object_get(rec, "command")), "--zero-stage"));
    json_decref(j);
    outputs o = run(TINY_CPU " --host-mem 8GiB --world-size 2 --link-gbps 50");
    assert_int_equal(o.status, 0);
    assert_non_null(strstr(o.out, "ZeRO over 2 ranks, 2 per node, link 50 GB/s (--link-gbps)"));
    assert_non_null(strstr(o.out, "recommended over 2 ranks: stage"));
    outputs_free(&o);
}

/* --world-size with --tensor-parallel T: the ZeRO table folds T in. Each
 * rank holds 1/T of every tensor and ZeRO runs over the N / T data-parallel
 * ranks, so at N = 4, T = 2 every plan's gradient bytes over the link are
 * half those of N = 2, T = 1 (the same data-parallel ranks), its host and
 * pinned bytes no more, and the command runs T. */
static uint64_t link_grads(json_t *p)
{
    return (uint64_t)json_integer_value(
        json_object_get(json_object_get(p, "link_bytes_per_step"), "gradients"));
}

static uint64_t rank_bytes(json_t *p, const char *tier)
{
    return (uint64_t)json_integer_value(
        json_object_get(json_object_get(p, "per_rank_bytes"), tier));
}

static void test_world_size_tensor_parallel(void **state)
{
    (void)state;
    json_t *j = run_json(TINY_CPU " --host-mem 8GiB --world-size 4 --gpus-per-node 4 "
                                  "--tensor-parallel 2");
    json_t *one = run_json(TINY_CPU " --host-mem 8GiB --world-size 2 --gpus-per-node 2");
    json_t *z = json_object_get(j, "zero"), *z1 = json_object_get(one, "zero");
    assert_int_equal(json_integer_value(json_object_get(z, "tensor_parallel")), 2);
    assert_int_equal(json_integer_value(json_object_get(z, "data_parallel")), 2);
    assert_int_equal(json_integer_value(json_object_get(z1, "tensor_parallel")), 1);
    json_t *plans = json_object_get(z, "plans"), *plans1 = json_object_get(z1, "plans");
    assert_int_equal(json_array_size(plans), json_array_size(plans1));
    for (size_t i = 0; i < json_array_size(plans); i++) {
        json_t *p = json_array_get(plans, i), *q = json_array_get(plans1, i);
        assert_true(link_grads(q) > 0);
        assert_int_equal(2 * link_grads(p), link_grads(q));
        assert_true(rank_bytes(p, "host") <= rank_bytes(q, "host"));
        assert_true(rank_bytes(p, "pinned") <= rank_bytes(q, "pinned"));
        assert_true(rank_bytes(p, "device") < rank_bytes(q, "device"));
    }
    const char *cmd =
        json_string_value(json_object_get(json_object_get(z, "recommended"), "command"));
    assert_non_null(strstr(cmd, "mpirun -np 4 "));
    assert_non_null(strstr(cmd, " --tensor-parallel 2"));
    json_decref(j);
    json_decref(one);
}

/* --pipeline-stages: the "pipeline" object, its split covering the engine
 * layers, the bubble's formula, the zo-train command; auto over the world
 * size's divisors; S above the engine layers refused naming both. */
static void test_pipeline(void **state)
{
    (void)state;
    json_t *j = run_json(TINY_CPU " --host-mem 8GiB --grad-accum 6 --pipeline-stages 3");
    assert_null(json_object_get(j, "zero")); /* the pipeline's ranks are its own */
    json_t *pl = json_object_get(j, "pipeline");
    assert_non_null(pl);
    assert_int_equal(json_integer_value(json_object_get(pl, "world_size")), 3);
    json_t *p = json_array_get(json_object_get(pl, "plans"), 0);
    assert_int_equal(json_integer_value(json_object_get(p, "stages")), 3);
    assert_int_equal(json_integer_value(json_object_get(p, "data_parallel")), 1);
    assert_true(fabs(num(p, "bubble") - 2.0 / 8.0) < 1e-12);
    json_t *split = json_object_get(p, "split"), *stages = json_object_get(p, "stage_plans");
    assert_int_equal(json_array_size(split), 2);
    assert_int_equal(json_array_size(stages), 3);
    int next = 0; /* tiny: 6 engine layers, every one in one stage */
    for (size_t s = 0; s < 3; s++) {
        json_t *st = json_array_get(stages, s);
        assert_int_equal(json_integer_value(json_object_get(st, "first_layer")), next);
        if (s > 0)
            assert_int_equal(json_integer_value(json_array_get(split, s - 1)), next);
        next = (int)json_integer_value(json_object_get(st, "last_layer")) + 1;
        assert_true(next > (int)json_integer_value(json_object_get(st, "first_layer")));
        assert_non_null(json_object_get(json_object_get(st, "bytes"), "nvme"));
    }
    assert_int_equal(next, 6);
    json_t *p2p = json_object_get(p, "p2p");
    assert_int_equal(json_integer_value(json_object_get(p2p, "step_bytes")),
                     2 * 2 * 6 * 4 * 64 * 256 *
                         2); /* both ways x 2 boundaries x M x mb x seq x dim x 2 */
    char want[128];
    snprintf(want, sizeof want, "mpirun -np 3 zo-train --pipeline-stages 3 --pipeline-split %d,%d",
             (int)json_integer_value(json_array_get(split, 0)),
             (int)json_integer_value(json_array_get(split, 1)));
    const char *cmd = json_string_value(json_object_get(p, "command"));
    if (!strstr(cmd, want))
        fail_msg("command '%s' lacks '%s'", cmd, want);
    /* the node's --host-mem: 3 ranks' shares, each with the cpu device's 24 MiB beside it */
    snprintf(want, sizeof want, "--host-mem %llu", 3 * ((8ull << 30) / 3 + (24ull << 20)));
    if (!strstr(cmd, want))
        fail_msg("command '%s' lacks '%s'", cmd, want);
    assert_non_null(json_object_get(pl, "recommended"));
    json_decref(j);

    j = run_json(TINY_CPU " --host-mem 8GiB --grad-accum 4 --world-size 4 --pipeline-stages auto");
    json_t *plans = json_object_get(json_object_get(j, "pipeline"), "plans");
    assert_int_equal(json_array_size(plans), 3); /* 1, 2 and 4 stages */
    double best = 0;
    int best_s = 0;
    for (size_t i = 0; i < 3; i++) {
        json_t *q = json_array_get(plans, i);
        int S = (int)json_integer_value(json_object_get(q, "stages"));
        assert_int_equal(json_integer_value(json_object_get(q, "data_parallel")), 4 / S);
        if (json_is_true(json_object_get(q, "fits")) && num(q, "tokens_per_s") > best) {
            best = num(q, "tokens_per_s");
            best_s = S;
        }
    }
    json_t *rec = json_object_get(json_object_get(j, "pipeline"), "recommended");
    assert_int_equal(json_integer_value(json_object_get(rec, "stages")), best_s);
    json_decref(j);

    outputs o = run(TINY_CPU " --host-mem 8GiB --pipeline-stages 2 --pipeline-split 5");
    assert_int_equal(o.status, 0);
    assert_non_null(strstr(o.out, "bubble"));
    assert_non_null(strstr(o.out, "--pipeline-split 5 "));
    assert_non_null(strstr(o.out, "recommended pipeline"));
    outputs_free(&o);
    o = run(TINY_CPU " --pipeline-stages 7");
    assert_int_equal(o.status, 1);
    assert_non_null(strstr(o.err, "--pipeline-stages 7"));
    assert_non_null(strstr(o.err, "6 engine layers"));
    outputs_free(&o);
    const char *bad[] = {"--pipeline-stages 0",
                         "--pipeline-split 3,2",
                         "--pipeline-split 2,x",
                         "--pipeline-stages auto",
                         "--pipeline-stages 3 --world-size 4",
                         "--pipeline-stages 3 --pipeline-split 2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char args[256];
        snprintf(args, sizeof args, TINY_CPU " %s", bad[i]);
        o = run(args);
        if (o.status == 0 || !strstr(o.err, "pipeline"))
            fail_msg("zo-plan %s: exit %d, stderr '%s'", bad[i], o.status, o.err);
        outputs_free(&o);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_max_seq),
        cmocka_unit_test(test_max_seq_chooses_mlp_chunk),
        cmocka_unit_test(test_sparse_attention_set),
        cmocka_unit_test(test_command_carries_plan_chunk),
        cmocka_unit_test(test_assumed_speeds_say_why),
        cmocka_unit_test(test_mixed_speed_sources),
        cmocka_unit_test(test_json_and_recommendation),
        cmocka_unit_test(test_emit_config),
        cmocka_unit_test(test_emitted_config_runs_in_zo_train),
        cmocka_unit_test(test_deepspeed_estimate),
        cmocka_unit_test(test_hf_config),
        cmocka_unit_test(test_bench_json_and_flags),
        cmocka_unit_test(test_bench_update_pipeline),
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_planning_an_absent_gpu),
        cmocka_unit_test(test_host_budget_is_zo_trains_limit),
        cmocka_unit_test(test_bad_flags),
        cmocka_unit_test(test_absurd_inputs_refused),
        cmocka_unit_test(test_13b_workstation_plan),
        cmocka_unit_test(test_micro_group_and_act_home),
        cmocka_unit_test(test_13b_at_32gib_puts_layer_inputs_on_nvme),
        cmocka_unit_test(test_emit_split_config),
        cmocka_unit_test(test_cpu_device_host_mem_counts_the_device),
        cmocka_unit_test(test_validate_grouped_plan),
        cmocka_unit_test(test_state_dtype_auto),
        cmocka_unit_test(test_emit_state_dtype),
        cmocka_unit_test(test_update_behind_flag),
        cmocka_unit_test(test_world_size),
        cmocka_unit_test(test_world_size_tensor_parallel),
        cmocka_unit_test(test_pipeline),
    };
    return cmocka_run_group_tests(tests, plan_test_make_dir, plan_test_remove_dir);
}
