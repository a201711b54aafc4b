/* zo-train's runs that are stopped and resumed on the same swap directory
 * (the real program, a tiny model with its parameters and optimizer on
 * NVMe, a checkpoint after every step):
 * - the soak: runs killed with SIGKILL or SIGTERM at random moments
 *   (bounded in count and time), each followed by --resume on the same
 *   swap directory (a SIGKILL leaves stale swap files the next run must
 *   take over), ending bitwise equal to an uninterrupted run;
 * - injected NVMe faults (ZO_SWAP_FAULTS) through the trainer: recovered
 *   ones leave the losses bitwise unchanged; an I/O error is named with the
 *   file and offset, the save it failed is written again and the run ends
 *   bitwise equal. */
#include <fcntl.h>
#include <jansson.h>
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
#include "zo/units.h"
#include "zo_test.h"
#include "zt_error.h"

#ifndef ZT_EXE
#error "ZT_EXE (the zo-train executable) must be defined"
#endif

#define STEPS 24
#define KILLS 10

static char g_dir[256];
static json_t *g_ref;  /* the uninterrupted run's summary */
static double g_ref_s; /* and its wall time */

typedef struct job {
    const char *save, *swap, *faults; /* faults: ZO_SWAP_FAULTS, or NULL */
    int resume;
} job;

static pid_t spawn(const job *j, const char *out_path, const char *err_path)
{
    const char *argv[] = {ZT_EXE,
                          "--device",
                          "cpu",
                          "--data",
                          ZT_TEST_DATA,
                          "--vocab",
                          "256",
                          "--dim",
                          "32",
                          "--layers",
                          "2",
                          "--heads",
                          "4",
                          "--ffn",
                          "64",
                          "--seq",
                          "16",
                          "--micro-batch",
                          "2",
                          "--seed",
                          "3",
                          "--val-batches",
                          "1",
                          "--offload-optimizer",
                          "nvme",
                          "--offload-param",
                          "nvme",
                          "--nvme-path",
                          j->swap,
                          "--steps",
                          "24",
                          "--save",
                          j->save,
                          "--save-every",
                          "1",
                          "--json",
                          j->resume ? "--resume" : NULL,
                          j->save,
                          NULL};
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int out = open(out_path ? out_path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int err = open(err_path ? err_path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(out, 1);
        dup2(err, 2);
        if (j->faults)
            setenv("ZO_SWAP_FAULTS", j->faults, 1);
        else
            unsetenv("ZO_SWAP_FAULTS");
        execv(ZT_EXE, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static int wait_status(pid_t pid)
{
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return st;
}

/* A run to its end; its summary. */
static json_t *run_to_end(const job *j)
{
    char out[400], err[400];
    snprintf(out, sizeof out, "%s/out.json", g_dir);
    snprintf(err, sizeof err, "%s/err.txt", g_dir);
    int st = wait_status(spawn(j, out, err));
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        size_t n;
        char *e = slurp(err, &n);
        fail_msg("zo-train%s exited with status %d: %s", j->resume ? " --resume" : "", st, e);
    }
    json_error_t e;
    json_t *root = json_load_file(out, 0, &e);
    if (!root)
        fail_msg("%s: %s", out, e.text);
    return root;
}

static void dirs(const char *tag, char *save, char *swap)
{
    snprintf(save, 300, "%s/%s-save", g_dir, tag);
    snprintf(swap, 300, "%s/%s-swap", g_dir, tag);
    mkdir(swap, 0700);
}

/* The resumed run's losses are the reference's from its first step on, and
 * its last checkpoint is the reference's, byte for byte. */
static void assert_ends_as_reference(json_t *resumed, const char *save)
{
    json_t *ref_losses = json_object_get(g_ref, "losses");
    assert_losses_continue(resumed, ref_losses, STEPS);
    const char *files[] = {ZT_CKPT_MODEL, ZT_CKPT_OPTIM};
    for (int i = 0; i < 2; i++) {
        char a[700], b[700];
        snprintf(a, sizeof a, "%s/step-%08d/%s", save, STEPS, files[i]);
        snprintf(b, sizeof b, "%s/ref-save/step-%08d/%s", g_dir, STEPS, files[i]);
        size_t na, nb;
        char *x = slurp(a, &na), *y = slurp(b, &nb);
        if (na != nb || memcmp(x, y, na) != 0)
            fail_msg("%s differs from the uninterrupted run's", a);
        free(x);
        free(y);
    }
}

static void test_kill_and_resume_soak(void **state)
{
    (void)state;
    char save[300], swap[300];
    dirs("soak", save, swap);
    uint64_t rng = 20261124;
    int kills = 0, terms = 0, attempts = 0, taken_over = 0;
    double t0 = zo_now_s();
    /* bounded: KILLS kills, 60 attempts, 30 s */
    while (kills < KILLS && attempts++ < 60 && zo_now_s() - t0 < 30) {
        job j = {save, swap, NULL, zt_ckpt_has_latest(save)};
        taken_over += access(swap, F_OK) == 0 && attempts > 1;
        pid_t pid = spawn(&j, NULL, NULL);
        long delay_us = (long)(zo_test_rand(&rng) % (uint64_t)(g_ref_s * 1e6)) + 1;
        struct timespec ts = {delay_us / 1000000, delay_us % 1000000 * 1000};
        nanosleep(&ts, NULL);
        int sig = attempts % 2 ? SIGKILL : SIGTERM;
        kill(pid, sig);
        int st = wait_status(pid);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) { /* it finished first: start over */
            rm_rf(save);
            continue;
        }
        /* SIGTERM: a clean stop (143), or the default action before the
         * handler was set up; anything else is a failure (a stale swap
         * file refused, say) */
        if (WIFEXITED(st) && WEXITSTATUS(st) != 128 + SIGTERM)
            fail_msg("attempt %d: zo-train exited with %d", attempts, WEXITSTATUS(st));
        kills++;
        terms += sig == SIGTERM;
    }
    print_message("%d kills (%d SIGTERM) in %d attempts, %.1f s\n", kills, terms, attempts,
                  zo_now_s() - t0);
    assert_true(kills >= KILLS / 2);
    job j = {save, swap, NULL, zt_ckpt_has_latest(save)};
    json_t *resumed = run_to_end(&j);
    assert_ends_as_reference(resumed, save);
    json_decref(resumed);
}

static void test_injected_faults_through_the_trainer(void **state)
{
    (void)state;
    char save[300], swap[300], err[400];
    /* recovered: short transfers, EINTR, EAGAIN, a delay */
    dirs("recovered", save, swap);
    job j = {save, swap, "short@5,eintr@9,eagain@20,delay@30:5,short@100,eintr@400", 0};
    json_t *run = run_to_end(&j);
    assert_ends_as_reference(run, save);
    json_decref(run);
    /* an I/O error (in a checkpoint's read of the states): named with the
     * file and the offset, the save is written again (--step-retries) and
     * the run ends as the reference (a step run again, and a run that stops
     * and is resumed: test_train_resume) */
    dirs("eio", save, swap);
    snprintf(err, sizeof err, "%s/eio-err.txt", g_dir);
    job bad = {save, swap, "eio@300", 0};
    char out[400];
    snprintf(out, sizeof out, "%s/eio-out.json", g_dir);
    int st = wait_status(spawn(&bad, out, err));
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    size_t n;
    char *e = slurp(err, &n);
    if (!strstr(e, "Input/output error") || !strstr(e, ".swap.0 offset") ||
        !strstr(e, "again (1 of 3)"))
        fail_msg("stderr: %s", e);
    free(e);
    run = json_load_file(out, 0, NULL);
    assert_non_null(run);
    assert_ends_as_reference(run, save);
    json_decref(run);
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/zt-soak-XXXXXX");
    if (!mkdtemp(g_dir))
        return -1;
    char save[300], swap[300];
    dirs("ref", save, swap);
    job j = {save, swap, NULL, 0};
    double t0 = zo_now_s();
    g_ref = run_to_end(&j);
    g_ref_s = zo_now_s() - t0;
    return json_array_size(json_object_get(g_ref, "losses")) == STEPS ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    json_decref(g_ref);
    rm_rf(g_dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_and_resume_soak),
        cmocka_unit_test(test_injected_faults_through_the_trainer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
