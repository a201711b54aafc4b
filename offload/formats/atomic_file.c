/* Crash-safe file replacement: temporary name, fsync, rename, fsync of the
 * directory. See include/zo/atomic_file.h. */
#include "zo/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zo_atomic_internal.h"
#include "zo_internal.h"

#define SUBSYS "checkpoint"

enum { BUF_CAP = 1 << 20 }; /* writes smaller than this are gathered */

struct zo_atomic_file {
    char *path;
    char *tmp;
    int fd;
    int committed;
    int failed;
    uint64_t size;
    size_t buf_len;
    unsigned char *buf;
};

/* The tests' fault drill (testing/formats_testing.c attaches it): 1 when
 * this fsync fails with EIO, as a dying disk's do. NULL in shipped use. */
int (*zo_atomic_fsync_drill)(void);

static int do_fsync(int fd)
{
    if (zo_atomic_fsync_drill && zo_atomic_fsync_drill()) {
        errno = EIO;
        return -1;
    }
    return fsync(fd);
}

static zo_status errno_status(int e)
{
    switch (e) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG: return ZO_ERR_NO_SPACE;
    case EIO: return ZO_ERR_IO;
    case ENOMEM: return ZO_ERR_NO_MEMORY;
    default: return ZO_ERR_SYSTEM;
    }
}

static zo_status fail_errno(int e, const char *what, const char *path)
{
    zo_status st = errno_status(e);
    if (st == ZO_ERR_SYSTEM && (strcmp(what, "write") == 0 || strcmp(what, "fsync") == 0))
        st = ZO_ERR_IO;
    return ZO_FAIL(st, SUBSYS, "%s '%s' failed: %s", what, path, strerror(e));
}

static char *dup_printf(const char *a, const char *b, long n)
{
    size_t cap = strlen(a) + (b ? strlen(b) : 0) + 32;
    char *s = malloc(cap);
    if (s)
        snprintf(s, cap, "%s%s%ld", a, b ? b : "", n);
    return s;
}

zo_status zo_atomic_file_open(zo_atomic_file_t *out, const char *path)
{
    if (!out || !path || !*path)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_atomic_file_open: NULL or empty argument");
    struct zo_atomic_file *f = calloc(1, sizeof *f);
    if (f) {
        f->path = strdup(path);
        f->tmp = dup_printf(path, ".tmp.", (long)getpid());
        f->buf = malloc(BUF_CAP);
    }
    if (!f || !f->path || !f->tmp || !f->buf) {
        if (f) {
            free(f->path);
            free(f->tmp);
            free(f->buf);
        }
        free(f);
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "zo_atomic_file_open '%s': out of host memory",
                       path);
    }
    int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
    f->fd = open(f->tmp, flags, 0644);
    if (f->fd < 0 && errno == EEXIST) {
        /* Our pid owns this name: a leftover of a crashed process that had it. */
        ZO_LOGW(SUBSYS, "replacing stale temporary file '%s'", f->tmp);
        unlink(f->tmp);
        f->fd = open(f->tmp, flags, 0644);
    }
    if (f->fd < 0) {
        zo_status st = fail_errno(errno, "create", f->tmp);
        f->committed = 1; /* nothing to unlink */
        zo_atomic_file_free(f);
        return st;
    }
    *out = f;
    return ZO_OK;
}

static zo_status write_all(zo_atomic_file_t f, const unsigned char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(f->fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            f->failed = 1;
            return fail_errno(w < 0 ? errno : EIO, "write", f->tmp);
        }
        p += w;
        n -= (size_t)w;
    }
    return ZO_OK;
}

static zo_status flush_buf(zo_atomic_file_t f)
{
    zo_status st = write_all(f, f->buf, f->buf_len);
    f->buf_len = 0;
    return st;
}

static zo_status check_writable(zo_atomic_file_t f, const char *op)
{
    if (f->committed)
        return ZO_FAIL(ZO_ERR_STATE, SUBSYS, "%s '%s': the file is already committed", op, f->path);
    if (f->failed)
        return ZO_FAIL(ZO_ERR_STATE, SUBSYS, "%s '%s': an earlier write failed; discard the file",
                       op, f->path);
    return ZO_OK;
}

zo_status zo_atomic_file_write(zo_atomic_file_t f, const void *data, size_t n)
{
    if (!f || (!data && n))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_atomic_file_write: NULL argument");
    ZO_TRY(check_writable(f, "write"));
    if (n == 0)
        return ZO_OK;
    const unsigned char *p = data;
    if (f->buf_len + n <= BUF_CAP) {
        memcpy(f->buf + f->buf_len, p, n);
        f->buf_len += n;
    } else {
        ZO_TRY(flush_buf(f));
        if (n < BUF_CAP) {
            memcpy(f->buf, p, n);
            f->buf_len = n;
        } else {
            ZO_TRY(write_all(f, p, n));
        }
    }
    f->size += n;
    return ZO_OK;
}

uint64_t zo_atomic_file_size(zo_atomic_file_t f)
{
    return f ? f->size : 0;
}

const char *zo_atomic_file_temp_path(zo_atomic_file_t f)
{
    return f ? f->tmp : NULL;
}

static char *parent_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return strdup(".");
    if (slash == path)
        return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

zo_status zo_fsync_parent_dir(const char *path)
{
    char *dir = path ? parent_dir(path) : NULL;
    if (!dir)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, SUBSYS, "zo_fsync_parent_dir: out of host memory");
    zo_status st = ZO_OK;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        st = fail_errno(errno, "open directory", dir);
    else if (do_fsync(fd) < 0)
        st = fail_errno(errno, "fsync", dir);
    if (fd >= 0)
        close(fd);
    free(dir);
    return st;
}

zo_status zo_atomic_file_commit(zo_atomic_file_t f)
{
    if (!f)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_atomic_file_commit: NULL file");
    ZO_TRY(check_writable(f, "commit"));
    ZO_TRY(flush_buf(f));
    if (do_fsync(f->fd) < 0) {
        f->failed = 1;
        return fail_errno(errno, "fsync", f->tmp);
    }
    int fd = f->fd;
    f->fd = -1;
    if (close(fd) < 0) {
        f->failed = 1;
        return fail_errno(errno, "close", f->tmp);
    }
    if (rename(f->tmp, f->path) < 0) {
        f->failed = 1;
        int e = errno;
        return ZO_FAIL(errno_status(e), SUBSYS, "rename '%s' to '%s' failed: %s", f->tmp, f->path,
                       strerror(e));
    }
    f->committed = 1;
    /* The rename is durable only once the directory entry is. */
    return zo_fsync_parent_dir(f->path);
}

void zo_atomic_file_free(zo_atomic_file_t f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    if (!f->committed)
        unlink(f->tmp);
    free(f->path);
    free(f->tmp);
    free(f->buf);
    free(f);
}

zo_status zo_atomic_write_file(const char *path, const void *data, size_t n)
{
    zo_atomic_file_t f = NULL;
    ZO_TRY(zo_atomic_file_open(&f, path));
    zo_status st = zo_atomic_file_write(f, data, n);
    if (st == ZO_OK)
        st = zo_atomic_file_commit(f);
    zo_atomic_file_free(f);
    return st;
}
