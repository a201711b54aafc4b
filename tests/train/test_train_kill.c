/* Crash safety of zo-train's checkpoints: the trainer (the real program,
 * fork/exec'd, a tiny model, a checkpoint after every step) is killed with
 * SIGKILL after a random delay, at least 20 times, most of them in the middle
 * of writing a checkpoint; each time it is resumed from what it left. After
 * every kill the checkpoint `latest` names must load and be byte for byte the
 * checkpoint an uninterrupted run wrote at that step; at the end the resumed
 * run's losses and final checkpoint equal the uninterrupted run's. */
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "train_fs_util.h"
#include "train_test_util.h"
#include "zo/units.h"
#include "zo_test.h"
#include "zt_error.h"

#ifndef ZT_EXE
#error "ZT_EXE (the zo-train executable) must be defined"
#endif

#define STEPS 80
#define KILLS 20

static char g_dir[256];

/* The run's flags: the model of zt_test_small_options on the cpu device. */
static int g_steps = STEPS;

static int run_args(const char **argv, const char *save, int resume, const char *json_out)
{
    static char steps[16];
    snprintf(steps, sizeof steps, "%d", g_steps);
    const char *fixed[] = {ZT_EXE,       "--device",
                           "cpu",        "--data",
                           ZT_TEST_DATA, "--vocab",
                           "256",        "--dim",
                           "32",         "--layers",
                           "2",          "--heads",
                           "4",          "--ffn",
                           "64",         "--seq",
                           "16",         "--micro-batch",
                           "2",          "--lr",
                           "1e-2",       "--seed",
                           "3",          "--val-batches",
                           "1",          "--offload-optimizer",
                           "cpu",        "--offload-param",
                           "cpu",        "--steps",
                           steps,        "--save",
                           save,         "--save-every",
                           "1"};
    int n = 0;
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        argv[n++] = fixed[i];
    if (resume) {
        argv[n++] = "--resume";
        argv[n++] = save;
    }
    if (json_out)
        argv[n++] = "--json";
    argv[n] = NULL;
    return n;
}

static pid_t spawn(const char *save, int resume, const char *out_path)
{
    const char *argv[48];
    run_args(argv, save, resume, out_path);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int out = open(out_path ? out_path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int devnull = open("/dev/null", O_WRONLY);
        dup2(out, 1);
        dup2(devnull, 2);
        execv(ZT_EXE, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static json_t *run_to_end(const char *save, int resume)
{
    char out[400];
    snprintf(out, sizeof out, "%s/out.json", g_dir);
    int st;
    pid_t pid = spawn(save, resume, out);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("zo-train %s exited with status %d", resume ? "--resume" : "", st);
    json_error_t e;
    json_t *root = json_load_file(out, 0, &e);
    if (!root)
        fail_msg("%s: %s", out, e.text);
    return root;
}

/* The checkpoint in dir equals the reference's of the same name, file by file. */
static void assert_same_checkpoint(const char *dir, const char *ref_dir)
{
    const char *files[] = {ZT_CKPT_MODEL, ZT_CKPT_OPTIM, ZT_CKPT_STATE};
    for (int i = 0; i < 3; i++) {
        char a[600], b[600];
        snprintf(a, sizeof a, "%s/%s", dir, files[i]);
        snprintf(b, sizeof b, "%s/%s", ref_dir, files[i]);
        size_t na, nb;
        char *x = slurp(a, &na), *y = slurp(b, &nb);
        if (na != nb || memcmp(x, y, na) != 0)
            fail_msg("%s differs from the uninterrupted run's %s", a, b);
        free(x);
        free(y);
    }
}

/* Loads it with the trainer, as --resume does. */
static void assert_loads(const char *ckpt)
{
    char swap[300];
    snprintf(swap, sizeof swap, "%s/swap", g_dir);
    zt_options o = zt_test_small_options(swap, STEPS);
    o.param_home = o.optim_home = ZO_TIER_HOST;
    zt_trainer *t = NULL;
    if (zt_trainer_init(&t, &o) < 0)
        fail_msg("zt_trainer_init: %s", zt_last_error());
    if (zt_ckpt_load(t, ckpt) < 0)
        fail_msg("the latest checkpoint %s does not load: %s", ckpt, zt_last_error());
    zt_trainer_free(t);
}

/* Whether the kill left a checkpoint half written. */
static int left_a_partial_write(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *e;
    int partial = 0;
    while ((e = readdir(d)))
        partial |= strstr(e->d_name, ".tmp") != NULL;
    closedir(d);
    return partial;
}

static void test_sigkill_during_checkpoints(void **state)
{
    char ref[300], dir[300];
    snprintf(ref, sizeof ref, "%s/ref", g_dir);
    snprintf(dir, sizeof dir, "%s/run", g_dir);
    /* The kills fall between half the start-up time and four steps (with
     * their checkpoints) after it, timed on this machine: a run of no step,
     * then the uninterrupted run. */
    char scratch[300];
    snprintf(scratch, sizeof scratch, "%s/scratch", g_dir);
    g_steps = 0;
    double t0 = zo_now_s();
    json_decref(run_to_end(scratch, 0));
    double setup_s = zo_now_s() - t0;
    g_steps = STEPS;
    t0 = zo_now_s();
    json_t *uninterrupted = run_to_end(ref, 0);
    double step_s = (zo_now_s() - t0 - setup_s) / STEPS;
    json_t *ref_losses = json_object_get(uninterrupted, "losses");
    assert_int_equal(json_array_size(ref_losses), STEPS);
    long lo_us = (long)(setup_s * 0.5e6), span_us = (long)((setup_s * 0.5 + 4 * step_s) * 1e6) + 1;

    uint64_t rng = 20240601;
    int kills = 0, partial = 0, attempts = 0, checked = 0;
    /* Kill until there were KILLS kills and a quarter of them landed inside a
     * write: a loaded or sanitized machine shifts the timing, so keep going
     * (bounded) rather than ask every random delay to hit. */
    while ((kills < KILLS || partial < KILLS / 4) && attempts++ < 100) {
        int resume = zt_ckpt_has_latest(dir);
        pid_t pid = spawn(dir, resume, NULL);
        long delay_us = lo_us + (long)(zo_test_rand(&rng) % (uint64_t)span_us);
        struct timespec ts = {delay_us / 1000000, delay_us % 1000000 * 1000};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        if (WIFEXITED(st)) { /* it finished before the kill: start over */
            assert_int_equal(WEXITSTATUS(st), 0);
            rm_rf(dir);
            continue;
        }
        assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
        kills++;
        partial += left_a_partial_write(dir);
        if (!zt_ckpt_has_latest(dir))
            continue; /* killed before its first checkpoint: nothing to load yet */
        char ck[4096], ref_ck[600];
        if (zt_ckpt_resolve(dir, ck, sizeof ck) < 0)
            fail_msg("after kill %d: %s", kills, zt_last_error());
        snprintf(ref_ck, sizeof ref_ck, "%s/%s", ref, strrchr(ck, '/') + 1);
        assert_same_checkpoint(ck, ref_ck);
        assert_loads(ck);
        checked++;
    }
    print_message(
        "%d kills (%d attempts) %ld..%ld ms after start, %d in the middle of a checkpoint "
        "write, %d checkpoints checked\n",
        kills, attempts, lo_us / 1000, (lo_us + span_us) / 1000, partial, checked);
    assert_true(kills >= KILLS);
    assert_true(partial >= KILLS / 4); /* the kills do land in the writes */
    assert_true(checked >= KILLS / 2);

    /* finish from the last good checkpoint: the same losses and final state */
    json_t *resumed = run_to_end(dir, zt_ckpt_has_latest(dir));
    assert_losses_continue(resumed, ref_losses, STEPS);
    char last[400], ref_last[400];
    snprintf(last, sizeof last, "%s/step-%08d", dir, STEPS);
    snprintf(ref_last, sizeof ref_last, "%s/step-%08d", ref, STEPS);
    assert_same_checkpoint(last, ref_last);
    json_decref(resumed);
    json_decref(uninterrupted);
}

static int setup(void **state)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/zt-kill-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    rm_rf(g_dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigkill_during_checkpoints),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
