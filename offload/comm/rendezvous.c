/* The TCP rendezvous: rank 0 serves MASTER_ADDR:MASTER_PORT, every other
 * rank sends it one block and gets back all of them in rank order. Plain
 * sockets with poll() deadlines, so a rank that never comes is named rather
 * than waited for. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sock.h"
#include "zo/launch.h"
#include "zo_internal.h"

enum { RDV_MAGIC = 0x7a6f7264 }; /* "zord" */

typedef struct rdv_header {
    uint32_t magic;
    uint32_t rank;
    uint32_t world_size;
    uint32_t pad;
    uint64_t bytes;
} rdv_header;

typedef struct rdv_ctx {
    const zo_rank_info *ri;
    uint64_t deadline_ns;
} rdv_ctx;

static int ms_left(const rdv_ctx *x)
{
    return zo_sock_ms_left(x->deadline_ns);
}

/* Moves exactly n bytes (send when out, else receive) before the deadline. */
static zo_status move_all(const rdv_ctx *x, int fd, void *buf, size_t n, int out)
{
    int err = zo_sock_move(fd, buf, n, out, x->deadline_ns);
    if (err == ETIMEDOUT)
        return ZO_FAIL(ZO_ERR_IO, "launch", "rendezvous on %s:%d: timed out %s", x->ri->master_addr,
                       x->ri->master_port, out ? "sending" : "receiving");
    if (err)
        return ZO_FAIL(ZO_ERR_IO, "launch", "rendezvous on %s:%d: connection %s",
                       x->ri->master_addr, x->ri->master_port,
                       err == ENOTCONN ? "closed by the peer" : strerror(err));
    return ZO_OK;
}

static zo_status resolve(const rdv_ctx *x, struct addrinfo **res)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    char port[16];
    snprintf(port, sizeof port, "%d", x->ri->master_port);
    int rc = getaddrinfo(x->ri->master_addr, port, &hints, res);
    if (rc)
        return ZO_FAIL(ZO_ERR_CONFIG, "launch", "rendezvous host '%s' (MASTER_ADDR): %s",
                       x->ri->master_addr, gai_strerror(rc));
    return ZO_OK;
}

static zo_status listen_on(const rdv_ctx *x, int *out)
{
    struct addrinfo *res;
    ZO_TRY(resolve(x, &res));
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc = fd < 0 ? -1 : bind(fd, res->ai_addr, res->ai_addrlen);
    if (rc == 0)
        rc = listen(fd, 128);
    int err = errno;
    freeaddrinfo(res);
    if (rc) {
        if (fd >= 0)
            close(fd);
        return ZO_FAIL(ZO_ERR_IO, "launch",
                       "rank 0 cannot serve the rendezvous on %s:%d (MASTER_ADDR:MASTER_PORT): %s",
                       x->ri->master_addr, x->ri->master_port, strerror(err));
    }
    *out = fd;
    return ZO_OK;
}

/* Rank 0: accepts one connection per other rank; conns[r] is rank r's. */
static zo_status accept_ranks(const rdv_ctx *x, int lfd, int *conns, void *all, size_t bytes)
{
    int n = x->ri->world_size, arrived = 1;
    while (arrived < n) {
        struct pollfd pfd = {lfd, POLLIN, 0};
        int left = ms_left(x);
        int pr = left ? poll(&pfd, 1, left) : 0;
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            break;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        rdv_header h;
        if (move_all(x, fd, &h, sizeof h, 0) < 0 || h.magic != RDV_MAGIC || h.rank == 0 ||
            h.rank >= (uint32_t)n || h.world_size != (uint32_t)n || h.bytes != bytes ||
            conns[h.rank] >= 0) {
            ZO_LOGW("launch", "rendezvous: refused a connection that is not a rank of this run");
            close(fd);
            continue;
        }
        zo_status st = move_all(x, fd, (char *)all + (size_t)h.rank * bytes, bytes, 0);
        if (st < 0) {
            close(fd);
            continue;
        }
        conns[h.rank] = fd;
        arrived++;
    }
    if (arrived == n)
        return ZO_OK;
    char missing[256] = "";
    size_t len = 0;
    for (int r = 1; r < n && len < sizeof missing - 16; r++)
        if (conns[r] < 0)
            len +=
                (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", len ? ", " : "", r);
    return ZO_FAIL(ZO_ERR_IO, "launch",
                   "rendezvous on %s:%d: rank(s) %s did not arrive within the timeout (%d of %d "
                   "ranks came)",
                   x->ri->master_addr, x->ri->master_port, missing, arrived, n);
}

static zo_status serve(const rdv_ctx *x, const void *mine, void *all, size_t bytes)
{
    int n = x->ri->world_size, lfd = -1;
    ZO_TRY(listen_on(x, &lfd));
    int *conns = malloc(sizeof(int) * (size_t)n);
    if (!conns) {
        close(lfd);
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "launch", "rendezvous: out of memory");
    }
    for (int r = 0; r < n; r++)
        conns[r] = -1;
    memcpy(all, mine, bytes);
    zo_status st = accept_ranks(x, lfd, conns, all, bytes);
    for (int r = 1; r < n && st == ZO_OK; r++)
        st = move_all(x, conns[r], all, bytes * (size_t)n, 1);
    for (int r = 1; r < n; r++)
        if (conns[r] >= 0)
            close(conns[r]);
    free(conns);
    close(lfd);
    return st;
}

/* Connects to rank 0, retrying while it is not listening yet. */
static zo_status connect_to_root(const rdv_ctx *x, int *out)
{
    for (;;) {
        struct addrinfo *res;
        ZO_TRY(resolve(x, &res));
        int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int rc = fd < 0 ? -1 : connect(fd, res->ai_addr, res->ai_addrlen);
        int err = errno;
        freeaddrinfo(res);
        if (rc == 0) {
            *out = fd;
            return ZO_OK;
        }
        if (fd >= 0)
            close(fd);
        if (!ms_left(x))
            return ZO_FAIL(ZO_ERR_IO, "launch",
                           "rank %d cannot reach rank 0's rendezvous at %s:%d "
                           "(MASTER_ADDR:MASTER_PORT): %s",
                           x->ri->rank, x->ri->master_addr, x->ri->master_port, strerror(err));
        usleep(20000);
    }
}

static zo_status join(const rdv_ctx *x, const void *mine, void *all, size_t bytes)
{
    int fd = -1;
    ZO_TRY(connect_to_root(x, &fd));
    rdv_header h = {RDV_MAGIC, (uint32_t)x->ri->rank, (uint32_t)x->ri->world_size, 0, bytes};
    zo_status st = move_all(x, fd, &h, sizeof h, 1);
    if (st == ZO_OK)
        st = move_all(x, fd, (void *)mine, bytes, 1);
    if (st == ZO_OK)
        st = move_all(x, fd, all, bytes * (size_t)x->ri->world_size, 0);
    close(fd);
    if (st < 0) {
        char why[256];
        snprintf(why, sizeof why, "%s", zo_last_error());
        return ZO_FAIL(st, "launch",
                       "rank %d: rendezvous with rank 0 failed (see rank 0's log): %s", x->ri->rank,
                       why);
    }
    return ZO_OK;
}

zo_status zo_launch_rendezvous(const zo_rank_info *ri, const void *mine, void *all, size_t bytes,
                               double timeout_s)
{
    if (!ri || ri->struct_size != sizeof(zo_rank_info) || ri->world_size < 1 || ri->rank < 0 ||
        ri->rank >= ri->world_size || (!mine && bytes) || (!all && bytes) || timeout_s <= 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "launch",
                       "zo_launch_rendezvous: needs a zo_rank_info from zo_launch_discover, "
                       "buffers and a positive timeout");
    rdv_ctx x = {ri, zo_now_ns() + (uint64_t)(timeout_s * 1e9)};
    if (ri->world_size == 1) {
        memcpy(all, mine, bytes);
        return ZO_OK;
    }
    return ri->rank == 0 ? serve(&x, mine, all, bytes) : join(&x, mine, all, bytes);
}
