/* File helpers the tests that drive zo-train as a process share: remove a
 * tree, read a whole file. */
#ifndef TRAIN_FS_UTIL_H
#define TRAIN_FS_UTIL_H

#include <stdio.h>
#include <stdlib.h>

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

#endif
