/* zo-train's save directories and resumed runs, the real program:
 * - a --save directory is locked by the run writing it: a second run given
 *   it refuses, naming the first's pid and host, and leaves the first's
 *   checkpoints alone; once the first is gone the directory is free. */
#include <fcntl.h>
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

/* zo-train ARGS (with RUN), to its end: stdout, stderr, exit status. */
static outputs run(const char *args)
{
    char cmd[4096], out_path[300], err_path[300];
    snprintf(out_path, sizeof out_path, "%s/stdout.txt", g_dir);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", g_dir);
    snprintf(cmd, sizeof cmd, "%s" RUN " %s >%s 2>%s", ZT_EXE, args, out_path, err_path);
    int st = system(cmd);
    outputs o;
    size_t n;
    o.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    o.out = slurp(out_path, &n);
    o.err = slurp(err_path, &n);
    return o;
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

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, ms % 1000 * 1000000};
    nanosleep(&ts, NULL);
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

static int count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    int n = 0, ch;
    while (f && (ch = fgetc(f)) != EOF)
        n += ch == '\n';
    if (f)
        fclose(f);
    return n;
}

/* Wait (at most 60 s) until the run has logged `steps` steps to metrics. */
static void wait_for_steps(pid_t pid, const char *metrics, int steps)
{
    for (int i = 0; i < 6000 && count_lines(metrics) < steps; i++) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid)
            fail_msg("zo-train exited (status %d) before step %d", st, steps);
        sleep_ms(10);
    }
    if (count_lines(metrics) < steps)
        fail_msg("zo-train did not reach step %d in 60 s", steps);
}

static int exit_code(pid_t pid)
{
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    g_child = -1;
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

/* ---- the save directory's lock ---- */

static void test_second_run_refuses_a_locked_save_dir(void **state)
{
    (void)state;
    char save[300], metrics[300], err[300], args[2048], want[400];
    snprintf(save, sizeof save, "%s/locked", g_dir);
    snprintf(metrics, sizeof metrics, "%s/locked-metrics", g_dir);
    snprintf(err, sizeof err, "%s/locked-err", g_dir);
    snprintf(args, sizeof args, "--steps 100000 --save %s --save-every 2 --metrics %s --nvme-path %s",
             save, metrics, g_dir);
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

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "%s/zt-resume-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    if (g_child > 0) {
        kill(g_child, SIGKILL);
        waitpid(g_child, NULL, 0);
    }
    rm_rf(g_dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_second_run_refuses_a_locked_save_dir),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
