/* A directory held by one process at a time (see zo/dir_lock.h). */
#include "zo/dir_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "zo_flock.h"
#include "zo_internal.h"

struct zo_dir_lock {
    int fd;
};

/* The lock file's text: "pid host start\n" (start: the holder's start time,
 * zo_flock.h; files written before it was recorded have none). */
static int recorded_owner(int fd, zo_lock_owner *o)
{
    char text[128] = "";
    memset(o, 0, sizeof *o);
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    if (n <= 0)
        return 0;
    text[n] = 0;
    unsigned long pid = 0;
    unsigned long long start = 0;
    char host[sizeof o->host] = "";
    if (sscanf(text, "%lu %63s %llu", &pid, host, &start) < 1)
        return 0;
    o->pid = (uint32_t)pid;
    o->start = start;
    snprintf(o->host, sizeof o->host, "%s", host);
    return 1;
}

static zo_status record_self(int fd, const char *path)
{
    zo_lock_owner me;
    char text[128];
    zo_lock_owner_self(&me);
    int n = snprintf(text, sizeof text, "%u %s %llu\n", me.pid, me.host[0] ? me.host : "?",
                     (unsigned long long)me.start);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n)
        return ZO_FAIL(ZO_ERR_IO, "formats", "cannot write the lock file %s: %s", path,
                       strerror(errno));
    return ZO_OK;
}

zo_status zo_dir_lock(zo_dir_lock_t *out, const char *dir, const char *what)
{
    char path[4096];
    *out = NULL;
    if (snprintf(path, sizeof path, "%s/%s", dir, ZO_DIR_LOCK_FILE) >= (int)sizeof path)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "formats", "path too long: %s/%s", dir,
                       ZO_DIR_LOCK_FILE);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return ZO_FAIL(ZO_ERR_SYSTEM, "formats", "cannot create the lock file %s: %s", path,
                       strerror(errno));
    if (!zo_flock_take(fd, recorded_owner)) {
        zo_lock_owner o;
        int known = recorded_owner(fd, &o);
        close(fd);
        return ZO_FAIL(ZO_ERR_EXISTS, "formats",
                       "%s %s is in use by another run (pid %u on %s, holding %s): wait for it "
                       "to finish, stop it, or choose another directory",
                       what, dir, known ? o.pid : 0u, known && o.host[0] ? o.host : "?", path);
    }
    zo_status st = record_self(fd, path);
    struct zo_dir_lock *l = st >= 0 ? malloc(sizeof *l) : NULL;
    if (st >= 0 && !l)
        st = ZO_FAIL(ZO_ERR_NO_MEMORY, "formats", "a directory lock");
    if (st < 0) {
        flock(fd, LOCK_UN);
        close(fd);
        return st;
    }
    l->fd = fd;
    *out = l;
    return ZO_OK;
}

void zo_dir_unlock(zo_dir_lock_t l)
{
    if (!l)
        return;
    flock(l->fd, LOCK_UN);
    close(l->fd);
    free(l);
}
