/* Helpers the tests that drive zo-train as a process share: remove a tree,
 * read a whole file, compare a resumed run's losses with an uninterrupted
 * one's, wait for a background run's steps and its exit. */
#ifndef TRAIN_FS_UTIL_H
#define TRAIN_FS_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>

#include <jansson.h>

#include "zo_test.h"

static inline void rm_rf(const char *path)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    assert_int_equal(system(cmd), 0);
}

/* The whole file, NUL-terminated (the terminator not counted in *n). */
static inline char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(*n + 1);
    assert_int_equal(fread(b, 1, *n, f), *n);
    b[*n] = 0;
    fclose(f);
    return b;
}

/* A run resumed at its "first_step" and ending at step `steps` logged
 * exactly the uninterrupted run's losses from that step on (bitwise). */
static inline void assert_losses_continue(json_t *resumed, json_t *ref_losses, int steps)
{
    int first = (int)json_integer_value(json_object_get(resumed, "first_step"));
    json_t *losses = json_object_get(resumed, "losses");
    assert_int_equal((int)json_array_size(losses), steps - first + 1);
    for (size_t i = 0; i < json_array_size(losses); i++)
        if (json_real_value(json_array_get(losses, i)) !=
            json_real_value(json_array_get(ref_losses, (size_t)first - 1 + i)))
            fail_msg("step %zu: resumed loss %.9g, uninterrupted %.9g", first + i,
                     json_real_value(json_array_get(losses, i)),
                     json_real_value(json_array_get(ref_losses, (size_t)first - 1 + i)));
}

static inline void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, ms % 1000 * 1000000};
    nanosleep(&ts, NULL);
}

static inline int count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    int n = 0, ch;
    while (f && (ch = fgetc(f)) != EOF)
        n += ch == '\n';
    if (f)
        fclose(f);
    return n;
}

/* Wait (at most 60 s) until the run `pid` has logged `steps` lines to metrics. */
static inline void wait_for_steps(pid_t pid, const char *metrics, int steps)
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

/* The exit status of the run `pid` (it must exit, not die of a signal). */
static inline int exit_code(pid_t pid)
{
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st))
        fail_msg("zo-train did not exit (killed by signal %d)", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    return WEXITSTATUS(st);
}

#endif
