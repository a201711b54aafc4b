/* The one way to open a file a user names (zo/file.h): without blocking on a
 * FIFO, and refusing what is not the kind of file expected before reading. */
#include "zo/file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zo_internal.h"

#define SUBSYS "file"

static const char *mode_kind(mode_t m)
{
    return S_ISREG(m)    ? "a regular file"
           : S_ISDIR(m)  ? "a directory"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISSOCK(m) ? "a socket"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISLNK(m)  ? "a symbolic link"
                         : "not a regular file";
}

const char *zo_file_kind(const char *path)
{
    struct stat sb;
    if (!path || lstat(path, &sb) != 0)
        return "missing";
    if (S_ISLNK(sb.st_mode) && stat(path, &sb) != 0)
        return "a dangling symbolic link";
    return mode_kind(sb.st_mode);
}

static zo_status open_failed(const char *path, int e, const char *how)
{
    if (e == ENOENT || e == ENOTDIR)
        return ZO_FAIL(ZO_ERR_NOT_FOUND, SUBSYS, "'%s' does not exist: expected %s", path, how);
    if (e == EISDIR)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "'%s' is a directory: expected %s", path, how);
    return ZO_FAIL(ZO_ERR_SYSTEM, SUBSYS, "cannot open '%s' (%s): %s", path, how, strerror(e));
}

/* Clear the O_NONBLOCK the open used: reads and writes then wait as usual. */
static zo_status make_blocking(int fd, const char *path)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
        return ZO_FAIL(ZO_ERR_SYSTEM, SUBSYS, "'%s': fcntl: %s", path, strerror(errno));
    return ZO_OK;
}

zo_status zo_file_open_read(const char *path, int *fd)
{
    if (!path || !fd)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_file_open_read: NULL argument");
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f < 0)
        return open_failed(path, errno, "a regular file to read");
    struct stat sb;
    zo_status st = ZO_OK;
    if (fstat(f, &sb) != 0)
        st = ZO_FAIL(ZO_ERR_SYSTEM, SUBSYS, "cannot stat '%s': %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        st = ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "'%s' is %s: expected a regular file to read",
                     path, mode_kind(sb.st_mode));
    else
        st = make_blocking(f, path);
    if (st < 0) {
        close(f);
        return st;
    }
    *fd = f;
    return ZO_OK;
}

zo_status zo_file_fopen_read(const char *path, FILE **out)
{
    int fd;
    ZO_TRY(zo_file_open_read(path, &fd));
    FILE *f = fdopen(fd, "r");
    if (!f) {
        int e = errno;
        close(fd);
        return ZO_FAIL(ZO_ERR_SYSTEM, SUBSYS, "'%s': fdopen: %s", path, strerror(e));
    }
    *out = f;
    return ZO_OK;
}

/* Opened for writing without O_TRUNC: truncate only what is a regular file
 * (truncating a FIFO or a device is meaningless, and must not fail). */
static zo_status check_written(int fd, const char *path, int append)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return ZO_FAIL(ZO_ERR_SYSTEM, SUBSYS, "cannot stat '%s': %s", path, strerror(errno));
    if (S_ISSOCK(sb.st_mode) || S_ISDIR(sb.st_mode) || S_ISBLK(sb.st_mode))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "'%s' is %s: expected a regular file to write",
                       path, mode_kind(sb.st_mode));
    if (S_ISREG(sb.st_mode) && !append && ftruncate(fd, 0) != 0)
        return ZO_FAIL(ZO_ERR_SYSTEM, SUBSYS, "cannot truncate '%s': %s", path, strerror(errno));
    return make_blocking(fd, path);
}

zo_status zo_file_fopen_write(const char *path, int append, FILE **out)
{
    if (!path || !out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_file_fopen_write: NULL argument");
    int fd =
        open(path, O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC | (append ? O_APPEND : 0), 0644);
    if (fd < 0 && errno == ENXIO)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS,
                       "'%s' is a FIFO that nobody reads: expected a regular file to write (or "
                       "a FIFO with a reader)",
                       path);
    if (fd < 0)
        return open_failed(path, errno, "a regular file to write");
    zo_status st = check_written(fd, path, append);
    FILE *f = st < 0 ? NULL : fdopen(fd, append ? "a" : "w");
    if (st >= 0 && !f)
        st = ZO_FAIL(ZO_ERR_SYSTEM, SUBSYS, "'%s': fdopen: %s", path, strerror(errno));
    if (st < 0) {
        close(fd);
        return st;
    }
    *out = f;
    return ZO_OK;
}

zo_status zo_file_check_dir(const char *path)
{
    struct stat sb;
    if (!path)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "zo_file_check_dir: NULL argument");
    if (stat(path, &sb) != 0)
        return open_failed(path, errno, "a directory");
    if (!S_ISDIR(sb.st_mode))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "'%s' is %s: expected a directory", path,
                       mode_kind(sb.st_mode));
    return ZO_OK;
}
