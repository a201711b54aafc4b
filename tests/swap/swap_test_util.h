/* Helpers shared by the swap store tests: a scratch directory tree, aligned
 * buffers with reproducible contents, and store configs. */
#ifndef SWAP_TEST_UTIL_H
#define SWAP_TEST_UTIL_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zo/swap.h"
#include "zo_test.h"

#define SWAP_TEST_MAX_PATHS 3

typedef struct swap_test_dirs {
    char root[512];
    char paths[SWAP_TEST_MAX_PATHS][600];
    const char *ptrs[SWAP_TEST_MAX_PATHS];
} swap_test_dirs;

/* mkdtemp under $TMPDIR (or /tmp) with one subdirectory per swap path. */
static inline int swap_test_mkdirs(swap_test_dirs *d)
{
    const char *base = getenv("TMPDIR");
    snprintf(d->root, sizeof d->root, "%s/zo-swap-test-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(d->root))
        return -1;
    for (int i = 0; i < SWAP_TEST_MAX_PATHS; i++) {
        snprintf(d->paths[i], sizeof d->paths[i], "%s/p%d", d->root, i);
        if (mkdir(d->paths[i], 0700) != 0)
            return -1;
        d->ptrs[i] = d->paths[i];
    }
    return 0;
}

/* Remove the tree made by swap_test_mkdirs (two levels of plain files). */
static inline void swap_test_rmdirs(swap_test_dirs *d)
{
    for (int i = 0; i < SWAP_TEST_MAX_PATHS; i++) {
        DIR *dir = opendir(d->paths[i]);
        struct dirent *e;
        while (dir && (e = readdir(dir))) {
            if (e->d_name[0] == '.')
                continue;
            char p[1200];
            snprintf(p, sizeof p, "%s/%s", d->paths[i], e->d_name);
            unlink(p);
        }
        if (dir)
            closedir(dir);
        rmdir(d->paths[i]);
    }
    rmdir(d->root);
}

/* A cmocka fixture holding a scratch tree (setup/teardown of the tests). */
typedef struct swap_test_fixture {
    swap_test_dirs dirs;
} swap_test_fixture;

static inline int swap_test_setup(void **state)
{
    swap_test_fixture *f = calloc(1, sizeof *f);
    if (!f || swap_test_mkdirs(&f->dirs) != 0) {
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

static inline int swap_test_teardown(void **state)
{
    swap_test_fixture *f = *state;
    swap_test_rmdirs(&f->dirs);
    free(f);
    return 0;
}

/* Exit 77 (skipped) with the reason when O_DIRECT does not work in the
 * scratch directory's file system. */
static inline void swap_test_require_odirect(void)
{
    swap_test_dirs d;
    if (swap_test_mkdirs(&d) != 0) {
        fprintf(stderr, "SKIP: cannot create a scratch directory under $TMPDIR or /tmp\n");
        exit(ZO_TEST_SKIP);
    }
    int ok = 0;
    uint64_t free_bytes = 0;
    char why[256] = "";
    zo_status st = zo_swap_probe_dir(d.paths[0], &ok, &free_bytes, why, sizeof why);
    swap_test_rmdirs(&d);
    if (st != ZO_OK || !ok) {
        fprintf(
            stderr,
            "SKIP: O_DIRECT does not work under %s (%s): set TMPDIR to a directory on ext4/xfs\n",
            d.root, st != ZO_OK ? zo_last_error() : why);
        exit(ZO_TEST_SKIP);
    }
}

static inline uint8_t *swap_test_alloc(size_t len)
{
    void *p = NULL;
    size_t cap = (len + 4095) / 4096 * 4096;
    if (posix_memalign(&p, 4096, cap ? cap : 4096))
        return NULL;
    return p;
}

static inline void swap_test_fill(uint8_t *buf, size_t len, uint64_t seed)
{
    uint64_t st = seed;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v = zo_test_rand(&st);
        memcpy(buf + i, &v, 8);
    }
    for (; i < len; i++)
        buf[i] = (uint8_t)zo_test_rand(&st);
}

static inline zo_swap_config swap_test_config(const swap_test_dirs *d, size_t npaths,
                                              uint64_t capacity, uint64_t extent_bytes)
{
    zo_swap_config c = ZO_SWAP_CONFIG_INIT;
    c.paths = d->ptrs;
    c.npaths = npaths;
    c.capacity = capacity;
    c.extent_bytes = extent_bytes;
    c.queue_depth = 8;
    c.block_size = 64u << 10;
    return c;
}

/* The engine this run opens "auto" stores on (ZO_SWAP_ENGINE), or NULL. */
static inline const char *swap_test_env_engine(void)
{
    const char *e = getenv("ZO_SWAP_ENGINE");
    return e && *e && strcmp(e, "auto") ? e : NULL;
}

/* Whether the engine writes to the files: the null engine keeps the bytes
 * in memory, so checks that read or damage the files directly do not apply. */
static inline int swap_test_engine_uses_disk(void)
{
    const char *e = swap_test_env_engine();
    return !e || strcmp(e, "null") != 0;
}

/* When the run forces io_uring to fail, the store must be on sync; when it
 * names an engine, on that one. */
static inline void swap_test_check_engine_name(const char *name)
{
    const char *force = getenv("ZO_SWAP_FORCE_SYNC");
    if (force && !strcmp(force, "1") && !strstr(name, "sync"))
        fail_msg("ZO_SWAP_FORCE_SYNC=1 but the store uses engine '%s'", name);
    const char *want = swap_test_env_engine();
    if (want && !strstr(name, want))
        fail_msg("ZO_SWAP_ENGINE=%s but the store uses engine '%s'", want, name);
}

static inline void swap_test_check_engine(zo_swap_t s)
{
    swap_test_check_engine_name(zo_swap_engine_name(s));
}

#endif
