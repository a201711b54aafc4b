/* Helpers shared by zo-plan's tests: a scratch directory, whole files read
 * into memory. */
#ifndef PLAN_TEST_UTIL_H
#define PLAN_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zo_test.h"

static char g_dir[256];

/* mkdtemp under $TMPDIR (or /tmp), as a cmocka group set-up. */
static int plan_test_make_dir(void **state)
{
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/zo-plan-test-XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int plan_test_remove_dir(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* The file's bytes, NUL-terminated (malloc'd). */
static inline char *plan_test_read(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    buf[fread(buf, 1, (size_t)n, f)] = 0;
    fclose(f);
    return buf;
}

#endif
