/* Probes for zo-report: does io_uring work here, does O_DIRECT work in a
 * directory and how much space is free there, which liburing we built with. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "swap_engine.h"
#include "zo_internal.h"

#ifndef ZO_LIBURING_VERSION
#define ZO_LIBURING_VERSION "unknown"
#endif

const char *zo_swap_liburing_version(void)
{
    return ZO_LIBURING_VERSION;
}

int zo_swap_probe_io_uring(char *why, size_t cap)
{
    char tmp[256];
    if (!why || !cap) {
        why = tmp;
        cap = sizeof tmp;
    }
    why[0] = 0;
    if (zo_swap_force_sync()) {
        snprintf(why, cap, "ZO_SWAP_FORCE_SYNC=1 makes io_uring setup fail");
        return 0;
    }
    struct io_uring ring;
    int rc = io_uring_queue_init(4, &ring, 0);
    if (rc < 0) {
        snprintf(why, cap, "io_uring_queue_init failed: %s%s", strerror(-rc),
                 rc == -ENOSYS || rc == -EPERM
                     ? " (old kernel or a seccomp policy forbids io_uring)"
                     : "");
        return 0;
    }
    int ok = 1;
    struct io_uring_probe *p = io_uring_get_probe_ring(&ring);
    if (!p) {
        snprintf(why, cap, "the kernel cannot report io_uring's supported operations (before 5.6)");
        ok = 0;
    } else {
        static const int need[] = {IORING_OP_READ, IORING_OP_WRITE, IORING_OP_READ_FIXED,
                                   IORING_OP_WRITE_FIXED};
        static const char *names[] = {"READ", "WRITE", "READ_FIXED", "WRITE_FIXED"};
        for (size_t i = 0; i < sizeof need / sizeof need[0] && ok; i++) {
            if (!io_uring_opcode_supported(p, need[i])) {
                snprintf(why, cap, "io_uring lacks the %s operation (kernel too old)", names[i]);
                ok = 0;
            }
        }
        io_uring_free_probe(p);
    }
    io_uring_queue_exit(&ring);
    return ok;
}

/* Write then read one aligned block through O_DIRECT in an unnamed file. */
static int probe_odirect(const char *dir, char *why, size_t cap)
{
    int fd = open(dir, O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
    char path[4096] = "";
    if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR)) {
        snprintf(path, sizeof path, "%s/.zoffload-probe-XXXXXX", dir);
        int tfd = mkstemp(path);
        if (tfd >= 0) {
            close(tfd);
            fd = open(path, O_RDWR | O_DIRECT | O_CLOEXEC);
            unlink(path);
        }
    }
    if (fd < 0) {
        snprintf(why, cap, "%s: cannot open a file with O_DIRECT: %s", dir, strerror(errno));
        return 0;
    }
    void *blk = NULL;
    int ok = 0;
    if (posix_memalign(&blk, 4096, 4096) == 0) {
        memset(blk, 0x5a, 4096);
        if (pwrite(fd, blk, 4096, 0) == 4096 && pread(fd, blk, 4096, 0) == 4096)
            ok = 1;
        else
            snprintf(why, cap, "%s: an aligned 4 KiB O_DIRECT transfer failed: %s", dir,
                     strerror(errno));
    } else {
        snprintf(why, cap, "out of memory");
    }
    free(blk);
    close(fd);
    return ok;
}

zo_status zo_swap_probe_dir(const char *dir, int *odirect_ok, uint64_t *free_bytes, char *why,
                            size_t cap)
{
    char tmp[256];
    if (!why || !cap) {
        why = tmp;
        cap = sizeof tmp;
    }
    why[0] = 0;
    if (!dir)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "swap", "zo_swap_probe_dir: dir is NULL");
    struct statvfs vf;
    if (statvfs(dir, &vf) != 0)
        return ZO_FAIL(errno == ENOENT ? ZO_ERR_NOT_FOUND : ZO_ERR_SYSTEM, "swap",
                       "statvfs(%s) failed: %s", dir, strerror(errno));
    if (free_bytes)
        *free_bytes = (uint64_t)vf.f_bavail * vf.f_frsize;
    int ok = probe_odirect(dir, why, cap);
    if (odirect_ok)
        *odirect_ok = ok;
    return ZO_OK;
}
