/* The io_uring engine: registered files and buffers, requests batched into
 * one io_uring_submit per flush. An eventfd read kept armed in the ring lets
 * other threads wake the I/O thread out of its wait for completions. */
#include <errno.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "swap_engine.h"
#include "zo_internal.h"

#define URING_MAX_FIXED_BUFS 64

typedef struct uring_engine {
    zo_io_engine base;
    struct io_uring ring;
    int efd;
    uint64_t efd_value;
    int efd_armed;
    int *fds;
    int nfds;
    int fixed_files;
    int fixed_bufs; /* 1: sparse table registered; -1: unavailable */
    void *buf_used[URING_MAX_FIXED_BUFS];
    unsigned pending; /* prepared SQEs not yet submitted */
    int disabled;     /* created with IORING_SETUP_R_DISABLED, not yet started */
} uring_engine;

static uring_engine *as_uring(zo_io_engine *e)
{
    return (uring_engine *)e;
}

static zo_status uring_arm_eventfd(uring_engine *u)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    if (!sqe)
        return ZO_FAIL(ZO_ERR_INTERNAL, "swap", "io_uring: no SQE free to arm the wake-up eventfd");
    io_uring_prep_read(sqe, u->efd, &u->efd_value, sizeof u->efd_value, 0);
    io_uring_sqe_set_data(sqe, &u->efd);
    u->efd_armed = 1;
    u->pending++;
    return ZO_OK;
}

static zo_status uring_register_files(zo_io_engine *e, const int *fds, int n)
{
    uring_engine *u = as_uring(e);
    u->fds = malloc(sizeof(int) * (size_t)n);
    if (!u->fds)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "swap", "io_uring: out of memory for %d file descriptors",
                       n);
    memcpy(u->fds, fds, sizeof(int) * (size_t)n);
    u->nfds = n;
    int rc = io_uring_register_files(&u->ring, fds, (unsigned)n);
    u->fixed_files = rc == 0;
    if (rc)
        ZO_LOGD("swap", "io_uring: registering files failed (%s); using plain file descriptors",
                strerror(-rc));
    return ZO_OK;
}

static zo_status uring_flush(zo_io_engine *e);

/* A ring created disabled (single issuer) becomes the I/O thread's here. */
static zo_status uring_start(zo_io_engine *e)
{
    uring_engine *u = as_uring(e);
    if (u->disabled) {
        /* liburing 2.3 declares io_uring_enable_rings but does not export it. */
        int rc = (int)syscall(__NR_io_uring_register, u->ring.ring_fd, IORING_REGISTER_ENABLE_RINGS,
                              NULL, 0);
        if (rc < 0)
            rc = -errno;
        if (rc < 0)
            return ZO_FAIL(ZO_ERR_IO, "swap", "io_uring: enabling the ring failed: %s",
                           strerror(-rc));
        u->disabled = 0;
    }
    ZO_TRY(uring_arm_eventfd(u));
    return uring_flush(e);
}

static zo_status uring_register_buffer(zo_io_engine *e, void *buf, size_t len, int *index)
{
    uring_engine *u = as_uring(e);
    *index = -1;
    if (u->fixed_bufs == 0) {
        int rc = io_uring_register_buffers_sparse(&u->ring, URING_MAX_FIXED_BUFS);
        u->fixed_bufs = rc == 0 ? 1 : -1;
        if (rc)
            ZO_LOGD("swap", "io_uring: no sparse buffer table (%s); buffers stay unregistered",
                    strerror(-rc));
    }
    if (u->fixed_bufs < 0)
        return ZO_OK;
    for (int i = 0; i < URING_MAX_FIXED_BUFS; i++) {
        if (u->buf_used[i])
            continue;
        struct iovec iov = {buf, len};
        __u64 tag = 0;
        int rc = io_uring_register_buffers_update_tag(&u->ring, (unsigned)i, &iov, &tag, 1);
        if (rc < 0) {
            /* Pinning can fail under RLIMIT_MEMLOCK; unregistered I/O still works. */
            ZO_LOGD("swap",
                    "io_uring: registering a %zu-byte buffer failed (%s); using it unregistered",
                    len, strerror(-rc));
            return ZO_OK;
        }
        u->buf_used[i] = buf;
        *index = i;
        return ZO_OK;
    }
    return ZO_OK;
}

static void uring_unregister_buffer(zo_io_engine *e, int index)
{
    uring_engine *u = as_uring(e);
    if (index < 0 || index >= URING_MAX_FIXED_BUFS || !u->buf_used[index])
        return;
    struct iovec iov = {NULL, 0};
    __u64 tag = 0;
    io_uring_register_buffers_update_tag(&u->ring, (unsigned)index, &iov, &tag, 1);
    u->buf_used[index] = NULL;
}

static void uring_prep(uring_engine *u, struct io_uring_sqe *sqe, zo_io_req *r)
{
    int fd = u->fixed_files ? r->file : u->fds[r->file];
    if (r->buf_index >= 0) {
        if (r->dir == ZO_IO_READ)
            io_uring_prep_read_fixed(sqe, fd, r->buf, (unsigned)r->len, r->off, r->buf_index);
        else
            io_uring_prep_write_fixed(sqe, fd, r->buf, (unsigned)r->len, r->off, r->buf_index);
    } else if (r->dir == ZO_IO_READ) {
        io_uring_prep_read(sqe, fd, r->buf, (unsigned)r->len, r->off);
    } else {
        io_uring_prep_write(sqe, fd, r->buf, (unsigned)r->len, r->off);
    }
    if (u->fixed_files)
        sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, r);
}

static zo_status uring_flush(zo_io_engine *e)
{
    uring_engine *u = as_uring(e);
    while (u->pending) {
        int rc = io_uring_submit(&u->ring);
        if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY)
            continue;
        if (rc < 0)
            return ZO_FAIL(ZO_ERR_IO, "swap", "io_uring_submit failed: %s", strerror(-rc));
        u->pending -= (unsigned)rc < u->pending ? (unsigned)rc : u->pending;
        if (rc == 0)
            break;
    }
    return ZO_OK;
}

static zo_status uring_submit(zo_io_engine *e, zo_io_req *r)
{
    uring_engine *u = as_uring(e);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    if (!sqe) {
        ZO_TRY(uring_flush(e));
        sqe = io_uring_get_sqe(&u->ring);
        if (!sqe)
            return ZO_FAIL(ZO_ERR_INTERNAL, "swap", "io_uring: submission queue full");
    }
    uring_prep(u, sqe, r);
    u->pending++;
    return ZO_OK;
}

/* Collects what is in the completion queue; the eventfd's completion only
 * re-arms it (it exists to end a wait). */
static int uring_collect(uring_engine *u, zo_io_req **done, int max, int *woken)
{
    int n = 0;
    struct io_uring_cqe *cqe;
    while (n < max && io_uring_peek_cqe(&u->ring, &cqe) == 0) {
        void *data = io_uring_cqe_get_data(cqe);
        if (data == &u->efd) {
            u->efd_armed = 0;
            *woken = 1;
        } else {
            zo_io_req *r = data;
            r->result = cqe->res;
            done[n++] = r;
        }
        io_uring_cqe_seen(&u->ring, cqe);
    }
    return n;
}

static int uring_reap(zo_io_engine *e, zo_io_req **done, int max, int wait)
{
    uring_engine *u = as_uring(e);
    int woken = 0;
    for (;;) {
        int n = uring_collect(u, done, max, &woken);
        if (!u->efd_armed) {
            ZO_TRY(uring_arm_eventfd(u));
            ZO_TRY(uring_flush(e));
        }
        if (n > 0 || woken || !wait)
            return n;
        struct io_uring_cqe *cqe;
        int rc = io_uring_wait_cqe(&u->ring, &cqe);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN)
            return ZO_FAIL(ZO_ERR_IO, "swap", "io_uring_wait_cqe failed: %s", strerror(-rc));
    }
}

static void uring_wake(zo_io_engine *e)
{
    uring_engine *u = as_uring(e);
    uint64_t one = 1;
    /* A full counter (never in practice) already guarantees a wake-up. */
    if (write(u->efd, &one, sizeof one) < 0)
        return;
}

static void uring_destroy(zo_io_engine *e)
{
    uring_engine *u = as_uring(e);
    if (!u)
        return;
    if (u->fixed_files)
        io_uring_unregister_files(&u->ring);
    io_uring_queue_exit(&u->ring);
    if (u->efd >= 0)
        close(u->efd);
    free(u->fds);
    free(u);
}

static zo_status uring_create(const zo_io_engine_args *a, zo_io_engine **out)
{
    uint32_t queue_depth = a->queue_depth;
    char *why = a->why;
    size_t cap = a->why_cap;
    *out = NULL;
    if (zo_swap_force_sync()) {
        snprintf(why, cap, "ZO_SWAP_FORCE_SYNC=1 makes io_uring setup fail");
        return ZO_FAIL(ZO_ERR_UNSUPPORTED, "swap", "io_uring: %s", why);
    }
    uring_engine *u = calloc(1, sizeof *u);
    if (!u)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "swap", "io_uring: out of memory");
    u->efd = eventfd(0, EFD_CLOEXEC);
    if (u->efd < 0) {
        snprintf(why, cap, "eventfd failed: %s", strerror(errno));
        free(u);
        return ZO_FAIL(ZO_ERR_SYSTEM, "swap", "io_uring: %s", why);
    }
    /* One extra entry for the wake-up eventfd read. */
    /* As fio sets up its rings: completions are run when the I/O thread
     * asks for them (DEFER_TASKRUN, 6.1+, which needs a single issuer: the
     * ring starts disabled and the I/O thread enables it) or at least never
     * interrupt it (COOP_TASKRUN, 5.19+), sparing an IPI per completion,
     * which is costly in VMs. Older kernels refuse the flags: retry without. */
    static const unsigned flag_sets[] = {IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SINGLE_ISSUER |
                                             IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_R_DISABLED,
                                         IORING_SETUP_COOP_TASKRUN, 0};
    int rc = -EINVAL;
    for (size_t i = 0; i < sizeof flag_sets / sizeof flag_sets[0] && rc == -EINVAL; i++) {
        rc = io_uring_queue_init(queue_depth + 1, &u->ring, flag_sets[i]);
        u->disabled = rc == 0 && (flag_sets[i] & IORING_SETUP_R_DISABLED);
    }
    if (rc < 0) {
        snprintf(why, cap, "io_uring_queue_init(%u) failed: %s%s", queue_depth + 1, strerror(-rc),
                 rc == -ENOSYS || rc == -EPERM
                     ? " (old kernel or a seccomp policy forbids io_uring)"
                     : "");
        close(u->efd);
        free(u);
        return ZO_FAIL(ZO_ERR_UNSUPPORTED, "swap", "io_uring: %s", why);
    }
    u->base.ops = &zo_io_uring_ops;
    u->base.queue_depth = queue_depth;
    snprintf(u->base.name, sizeof u->base.name, "io_uring");
    *out = &u->base;
    return ZO_OK;
}

const zo_io_engine_ops zo_io_uring_ops = {
    .name = "io_uring",
    .version = ZO_IO_ENGINE_OPS_VERSION,
    .caps = ZO_IO_CAP_AUTO | ZO_IO_CAP_FIXED_BUFS,
    .create = uring_create,
    .register_files = uring_register_files,
    .start = uring_start,
    .register_buffer = uring_register_buffer,
    .unregister_buffer = uring_unregister_buffer,
    .submit = uring_submit,
    .flush = uring_flush,
    .reap = uring_reap,
    .wake = uring_wake,
    .destroy = uring_destroy,
};
