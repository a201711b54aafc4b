/* Helpers the tests that drive zo-train as a process share: remove a tree,
 * read a whole file, compare a resumed run's losses with an uninterrupted
 * one's. */
#ifndef TRAIN_FS_UTIL_H
#define TRAIN_FS_UTIL_H

#include <stdio.h>
#include <stdlib.h>

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

#endif
