/* The zo-train program: --help, the --json summary's keys and values, the
 * human summary, and bad flags refused with exit status 2 and a message. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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
                           "--help",
                           "tiny, small, 1b, 7b, 13b"};
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

static void test_bad_flags(void **state)
{
    expect_usage_error("--preset huge",
                       "unknown preset 'huge'; expected one of tiny, small, 1b, 7b, 13b");
    expect_usage_error("--offload-param disk", "expected none, cpu or nvme");
    expect_usage_error("--device-mem 12XB", "expected a byte count");
    expect_usage_error("--steps -1", "an integer >= 0");
    expect_usage_error("--optimizer-mode fast", "sync, overlap or dpu");
    expect_usage_error("--frobnicate", "unknown option");
    expect_usage_error("extra", "unexpected argument 'extra'");
}

static void test_run_failure_exits_1(void **state)
{
    outputs o = run("--device cpu --device-mem 64KiB --steps 1 --offload-optimizer cpu");
    assert_int_equal(o.status, 1);
    assert_non_null(strstr(o.err, "activations"));
    outputs_free(&o);
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
        cmocka_unit_test(test_help_lists_every_flag), cmocka_unit_test(test_json_summary),
        cmocka_unit_test(test_human_summary),         cmocka_unit_test(test_bad_flags),
        cmocka_unit_test(test_run_failure_exits_1),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
