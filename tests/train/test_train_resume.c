/* zo-train's save directories and resumed runs, the real program:
 * - a --save directory is locked by the run writing it: a second run given
 *   it refuses, naming the first's pid and host, and leaves the first's
 *   checkpoints alone; once the first is gone the directory is free;
 * - trainer_state.json is cross-checked: a step that is not its directory's,
 *   one beyond any run, a data position the steps do not lead to are
 *   refused, as is --steps below the checkpoint's step;
 * - --lr and the other hyper-parameters given on resume apply, each change
 *   named ("lr 0.002 → 0.0001");
 * - a checkpoint of a Hugging Face model resumed without --hf-model is told
 *   to pass it;
 * - a step an injected NVMe I/O error failed runs again and the run ends as
 *   one without the error; with no retries left the run saves its committed
 *   steps first, says where, and --resume ends as the uninterrupted run. */
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "train_fs_util.h"
#include "zo_test.h"

#ifndef ZT_EXE
#error "ZT_EXE (the zo-train executable) must be defined"
#endif

#define RUN                                                                                        \
    " --device cpu --data " ZT_TEST_DATA " --vocab 256 --dim 32 --layers 2 --heads 4 --ffn 64"     \
    " --seq 16 --micro-batch 2 --seed 3 --val-batches 1 --offload-optimizer nvme"                  \
    " --offload-param cpu"

static char g_dir[256];
static pid_t g_child = -1; /* a background run, stopped by teardown if a test failed first */

typedef struct outputs {
    char *out, *err;
    int status;
} outputs;

/* zo-train ARGS (after base) under the environment settings env, to its
 * end: stdout, stderr, exit status. */
static outputs run_env(const char *env, const char *base, const char *args)
{
    char cmd[4096], out_path[300], err_path[300];
    snprintf(out_path, sizeof out_path, "%s/stdout.txt", g_dir);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", g_dir);
    snprintf(cmd, sizeof cmd, "%s %s %s %s >%s 2>%s", env, ZT_EXE, base, args, out_path, err_path);
    int st = system(cmd);
    outputs o;
    size_t n;
    o.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    o.out = slurp(out_path, &n);
    o.err = slurp(err_path, &n);
    return o;
}

static outputs run_as(const char *base, const char *args)
{
    return run_env("", base, args);
}

/* zo-train ARGS with RUN. */
static outputs run(const char *args)
{
    return run_as(RUN, args);
}

static void outputs_free(outputs *o)
{
    free(o->out);
    free(o->err);
}

static void expect_in(const outputs *o, const char *needle)
{
    if (!strstr(o->err, needle))
        fail_msg("zo-train's stderr lacks '%s':\n%s", needle, o->err);
}

/* zo-train ARGS (with RUN) in the background, its stderr into err. */
static pid_t spawn(const char *args, const char *err)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "exec %s" RUN " %s >/dev/null 2>%s", ZT_EXE, args, err);
    pid_t pid = g_child = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* ---- the save directory's lock ---- */

static void test_second_run_refuses_a_locked_save_dir(void **state)
{
    (void)state;
    char save[300], metrics[300], err[300], args[2048], want[400];
    snprintf(save, sizeof save, "%s/locked", g_dir);
    snprintf(metrics, sizeof metrics, "%s/locked-metrics", g_dir);
    snprintf(err, sizeof err, "%s/locked-err", g_dir);
    snprintf(args, sizeof args,
             "--steps 100000 --save %s --save-every 2 --metrics %s --nvme-path %s", save, metrics,
             g_dir);
    pid_t first = spawn(args, err);
    wait_for_steps(first, metrics, 3); /* step-00000002 saved */
    snprintf(args, sizeof args, "--steps 4 --seed 9 --save %s --save-every 2 --nvme-path %s/b",
             save, g_dir);
    char swap_b[300];
    snprintf(swap_b, sizeof swap_b, "%s/b", g_dir);
    mkdir(swap_b, 0755);
    outputs o = run(args);
    assert_int_equal(o.status, 1);
    snprintf(want, sizeof want, "--save directory %s is in use by another run (pid %d on ", save,
             (int)first);
    expect_in(&o, want);
    outputs_free(&o);
    /* --resume of the same directory is refused the same way */
    snprintf(args, sizeof args, "--steps 4 --resume %s --save %s --nvme-path %s", save, save,
             swap_b);
    o = run(args);
    assert_int_equal(o.status, 1);
    expect_in(&o, want);
    outputs_free(&o);
    kill(first, SIGTERM);
    g_child = -1;
    assert_int_equal(exit_code(first), 128 + SIGTERM);
    /* the first is gone: its directory continues */
    char latest[400];
    size_t n;
    snprintf(latest, sizeof latest, "%s/latest", save);
    char *name = slurp(latest, &n);
    int at = atoi(strchr(name, '-') + 1);
    free(name);
    snprintf(args, sizeof args, "--steps %d --resume %s --save %s --nvme-path %s", at + 1, save,
             save, swap_b);
    o = run(args);
    if (o.status != 0)
        fail_msg("resuming after the first run stopped: exit %d\n%s", o.status, o.err);
    outputs_free(&o);
}

/* ---- resume cross-checks ---- */

/* A fresh run of `steps` steps saving into dir (its swap files in g_dir). */
static void save_run(const char *dir, int steps)
{
    char args[1024];
    rm_rf(dir);
    snprintf(args, sizeof args, "--steps %d --save %s --nvme-path %s", steps, dir, g_dir);
    outputs o = run(args);
    if (o.status != 0)
        fail_msg("the run saving %s: exit %d\n%s", dir, o.status, o.err);
    outputs_free(&o);
}

/* Set KEY (dotted: "data.cursor") of DIR/step-N/trainer_state.json to v. */
static void edit_state(const char *dir, int step, const char *key, json_t *v)
{
    char path[600], obj[64];
    snprintf(path, sizeof path, "%s/step-%08d/%s", dir, step, ZT_CKPT_STATE);
    json_t *root = json_load_file(path, 0, NULL);
    assert_non_null(root);
    const char *dot = strchr(key, '.');
    json_t *at = root;
    if (dot) {
        snprintf(obj, sizeof obj, "%.*s", (int)(dot - key), key);
        at = json_object_get(root, obj);
        key = dot + 1;
    }
    assert_non_null(at);
    json_object_set_new(at, key, v);
    assert_int_equal(json_dump_file(root, path, JSON_INDENT(2)), 0);
    json_decref(root);
}

/* --resume dir --steps steps (plus extra) exits `status` saying want. */
static void expect_resume(const char *dir, int steps, const char *extra, int status,
                          const char *want)
{
    char args[1024];
    snprintf(args, sizeof args, "--steps %d --resume %s --nvme-path %s %s", steps, dir, g_dir,
             extra);
    outputs o = run(args);
    if (o.status != status)
        fail_msg("--resume %s: exit %d, expected %d\n%s", dir, o.status, status, o.err);
    expect_in(&o, want);
    outputs_free(&o);
}

static void test_resume_cross_checks_the_state(void **state)
{
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/cross", g_dir);
    save_run(dir, 4);
    expect_resume(dir, 3, "", 2, "--steps 3 is below the checkpoint's step 4");
    edit_state(dir, 4, "step", json_integer(2));
    expect_resume(dir, 8, "", 2, "says step 2, but its directory is step 4's");
    edit_state(dir, 4, "step", json_integer(99999999999ll));
    expect_resume(dir, 8, "", 2, "'step' is 99999999999: expected a step count");
    edit_state(dir, 4, "step", json_integer(4));
    edit_state(dir, 4, "engine.steps", json_integer(3));
    expect_resume(dir, 8, "", 2, "its engine counters say 3 steps");
    edit_state(dir, 4, "engine.steps", json_integer(4));
    edit_state(dir, 4, "data.cursor", json_integer(3));
    expect_resume(dir, 8, "", 1, "the data position (epoch 0, window 3 of ");
    edit_state(dir, 4, "data.cursor", json_integer(8)); /* 4 steps of 2 windows: as saved */
    expect_resume(dir, 6, "", 0, "resumed from ");
}

static double json_lr(json_t *root, size_t i)
{
    return json_number_value(json_array_get(json_object_get(root, "lrs"), i));
}

static void test_resume_applies_changed_hyper_parameters(void **state)
{
    (void)state;
    char dir[300], args[1024];
    snprintf(dir, sizeof dir, "%s/lr", g_dir);
    save_run(dir, 2);
    snprintf(args, sizeof args,
             "--steps 4 --resume %s --nvme-path %s --lr 0.0001 --weight-decay 0.1 --json", dir,
             g_dir);
    outputs o = run(args);
    if (o.status != 0)
        fail_msg("resume with --lr: exit %d\n%s", o.status, o.err);
    expect_in(&o, "resuming with changed hyper-parameters (they apply): lr 0.002 \u2192 0.0001, "
                  "weight_decay 0 \u2192 0.1");
    json_t *root = json_loads(o.out, 0, NULL);
    assert_non_null(root);
    assert_int_equal(json_array_size(json_object_get(root, "lrs")), 2);
    for (size_t i = 0; i < 2; i++)
        if (fabs(json_lr(root, i) - 1e-4) > 1e-10)
            fail_msg("resumed step %zu ran at lr %g, not --lr 0.0001", i + 3, json_lr(root, i));
    json_decref(root);
    outputs_free(&o);
    /* unchanged: not a word */
    snprintf(args, sizeof args, "--steps 3 --resume %s --nvme-path %s", dir, g_dir);
    o = run(args);
    assert_int_equal(o.status, 0);
    assert_null(strstr(o.err, "changed hyper-parameters"));
    outputs_free(&o);
}

#define HF_RUN                                                                                     \
    " --device cpu --data " ZT_TEST_DATA " --seq 16 --micro-batch 2 --val-batches 1"               \
    " --offload-optimizer nvme"

static void test_hf_checkpoint_resumed_without_hf_model(void **state)
{
    (void)state;
    char src[300], dir[300], args[1024], want[700];
    snprintf(src, sizeof src, "%s/hf-src", g_dir);
    snprintf(dir, sizeof dir, "%s/hf-ckpt", g_dir);
    save_run(src, 1); /* src/hf-model: a Hugging Face model directory */
    snprintf(args, sizeof args, "--steps 2 --hf-model %s/hf-model --save %s --nvme-path %s", src,
             dir, g_dir);
    outputs o = run_as(HF_RUN, args);
    if (o.status != 0)
        fail_msg("the --hf-model run: exit %d\n%s", o.status, o.err);
    outputs_free(&o);
    snprintf(args, sizeof args, "--steps 4 --resume %s --nvme-path %s", dir, g_dir);
    o = run_as(HF_RUN, args);
    assert_int_equal(o.status, 2);
    snprintf(want, sizeof want,
             "was saved from a run of the Hugging Face model in %s/hf-model: "
             "pass --hf-model %s/hf-model",
             src, src);
    expect_in(&o, want);
    outputs_free(&o);
}

/* ---- a failed step ---- */

#define FAULTY " --steps 6 --json" /* one NVMe store: each counts its own faults */

static json_t *summary(const outputs *o)
{
    json_t *root = json_loads(o->out, 0, NULL);
    if (!root)
        fail_msg("no JSON summary (exit %d)\n%s", o->status, o->err);
    return root;
}

/* The step the stderr says failed. */
static int failed_step(const outputs *o)
{
    const char *at = strstr(o->err, "zo-train: step ");
    assert_non_null(at);
    return atoi(at + strlen("zo-train: step "));
}

static void test_failed_step_is_retried_then_saved(void **state)
{
    (void)state;
    char dir[300], args[1024], want[600];
    snprintf(dir, sizeof dir, "%s/faulty", g_dir);
    snprintf(args, sizeof args, FAULTY " --nvme-path %s", g_dir);
    outputs o = run(args);
    assert_int_equal(o.status, 0);
    json_t *ref = summary(&o);
    outputs_free(&o);
    /* one transient error: the step runs again, the run equals the reference */
    snprintf(args, sizeof args, FAULTY " --nvme-path %s --save %s", g_dir, dir);
    rm_rf(dir);
    o = run_env("ZO_SWAP_FAULTS=eio@100", RUN, args);
    if (o.status != 0)
        fail_msg("a transient error: exit %d\n%s", o.status, o.err);
    expect_in(&o, "Input/output error");
    expect_in(&o, "; running it again (1 of 3)");
    json_t *got = summary(&o);
    assert_losses_continue(got, json_object_get(ref, "losses"), 6);
    json_decref(got);
    outputs_free(&o);
    /* no retries: the run stops, saving its committed steps first */
    rm_rf(dir);
    snprintf(args, sizeof args, FAULTY " --nvme-path %s --save %s --step-retries 0", g_dir, dir);
    o = run_env("ZO_SWAP_FAULTS=eio@100", RUN, args);
    assert_int_equal(o.status, 1);
    int failed = failed_step(&o);
    assert_true(failed > 1);
    snprintf(want, sizeof want, "the committed steps are kept in %s/step-%08d (step %d)", dir,
             failed - 1, failed - 1);
    expect_in(&o, want);
    outputs_free(&o);
    /* which resume where they stopped, as if never stopped */
    snprintf(args, sizeof args, FAULTY " --nvme-path %s --save %s --resume %s", g_dir, dir, dir);
    o = run(args);
    if (o.status != 0)
        fail_msg("resuming after the failure: exit %d\n%s", o.status, o.err);
    got = summary(&o);
    assert_int_equal(json_integer_value(json_object_get(got, "first_step")), failed);
    assert_losses_continue(got, json_object_get(ref, "losses"), 6);
    json_decref(got);
    json_decref(ref);
    outputs_free(&o);
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "%s/zt-resume-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

/* A background run a failed test left (its swap files would be in the
 * next test's way). */
static int stop_child(void **state)
{
    (void)state;
    if (g_child > 0) {
        kill(g_child, SIGKILL);
        waitpid(g_child, NULL, 0);
        g_child = -1;
    }
    return 0;
}

static int teardown(void **state)
{
    stop_child(state);
    rm_rf(g_dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_second_run_refuses_a_locked_save_dir, stop_child),
        cmocka_unit_test(test_resume_cross_checks_the_state),
        cmocka_unit_test(test_resume_applies_changed_hyper_parameters),
        cmocka_unit_test(test_hf_checkpoint_resumed_without_hf_model),
        cmocka_unit_test(test_failed_step_is_retried_then_saved),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
