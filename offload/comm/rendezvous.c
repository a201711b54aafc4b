/* The TCP rendezvous: rank 0 serves MASTER_ADDR:MASTER_PORT, every other
 * rank sends it one block and gets back all of them in rank order. Plain
 * sockets with poll() deadlines, so a rank that never comes is named rather
 * than waited for.
 *
 * Under torchrun MASTER_PORT is already taken: torchrun's agent serves its
 * c10d TCPStore there and tells its workers so (TORCHELASTIC_USE_AGENT_STORE).
 * The ranks then meet in that store instead: each sets its block under a
 * key of this rendezvous, polls until every rank's key is there, and reads
 * them all (the store's wire protocol: a query byte, strings and values as
 * a 64-bit length and the bytes; torch's TCPStoreBackend.hpp). */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
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
    if (err) {
        zo_status st =
            ZO_FAIL(ZO_ERR_IO, "launch", "rendezvous on %s:%d: connection %s", x->ri->master_addr,
                    x->ri->master_port, err == ENOTCONN ? "closed by the peer" : strerror(err));
        errno = err; /* for a caller that may retry on a dropped connection */
        return st;
    }
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

/* ---- torchrun's store ---- */

enum { ST_VALIDATE = 0, ST_SET = 1, ST_GET = 3, ST_CHECK = 5, ST_PING = 13 };
enum { ST_MAGIC = 0x3C85F7CE, ST_READY = 0, ST_ATTEMPTS = 5 };

/* Whether MASTER_PORT is torchrun's agent store rather than free for rank 0:
 * torchrun says so to its workers, whether the ranks come from its variables
 * or from a config that repeats them (zo-train's). */
static int torch_agent_store(const zo_rank_info *ri)
{
    return zo_env_bool("TORCHELASTIC_USE_AGENT_STORE", 0) && ri->world_size > 1;
}

static zo_status st_send(const rdv_ctx *x, int fd, const void *buf, size_t n)
{
    return move_all(x, fd, (void *)buf, n, 1);
}

static zo_status st_send_u8(const rdv_ctx *x, int fd, uint8_t v)
{
    return st_send(x, fd, &v, 1);
}

/* A string or a value: its 64-bit length, then its bytes. */
static zo_status st_send_bytes(const rdv_ctx *x, int fd, const void *p, size_t n)
{
    uint64_t len = n;
    ZO_TRY(st_send(x, fd, &len, sizeof len));
    return st_send(x, fd, p, n);
}

static zo_status st_hello(const rdv_ctx *x, int fd)
{
    uint32_t magic = ST_MAGIC, nonce = (uint32_t)getpid(), back = 0;
    ZO_TRY(st_send_u8(x, fd, ST_VALIDATE));
    ZO_TRY(st_send(x, fd, &magic, sizeof magic));
    ZO_TRY(st_send_u8(x, fd, ST_PING));
    ZO_TRY(st_send(x, fd, &nonce, sizeof nonce));
    ZO_TRY(move_all(x, fd, &back, sizeof back, 0));
    if (back != nonce)
        return ZO_FAIL(ZO_ERR_IO, "launch",
                       "torchrun's store at %s:%d (MASTER_ADDR:MASTER_PORT) did not answer as a "
                       "c10d TCPStore",
                       x->ri->master_addr, x->ri->master_port);
    return ZO_OK;
}

/* 1 when every key of `keys` is in the store, 0 when one is missing. */
static zo_status st_check(const rdv_ctx *x, int fd, char (*keys)[96], int n, int *ready)
{
    uint64_t nk = (uint64_t)n;
    ZO_TRY(st_send_u8(x, fd, ST_CHECK));
    ZO_TRY(st_send(x, fd, &nk, sizeof nk));
    for (int i = 0; i < n; i++)
        ZO_TRY(st_send_bytes(x, fd, keys[i], strlen(keys[i])));
    uint8_t r;
    ZO_TRY(move_all(x, fd, &r, 1, 0));
    *ready = r == ST_READY;
    return ZO_OK;
}

static zo_status st_get(const rdv_ctx *x, int fd, const char *key, void *out, size_t bytes)
{
    uint64_t len;
    ZO_TRY(st_send_u8(x, fd, ST_GET));
    ZO_TRY(st_send_bytes(x, fd, key, strlen(key)));
    ZO_TRY(move_all(x, fd, &len, sizeof len, 0));
    if (len != bytes)
        return ZO_FAIL(ZO_ERR_IO, "launch",
                       "rendezvous in torchrun's store: key %s holds %llu bytes, not %zu (ranks "
                       "of different builds?)",
                       key, (unsigned long long)len, bytes);
    return move_all(x, fd, out, bytes, 0);
}

/* The ranks whose keys are not in the store yet, for the timeout's message. */
static void st_missing(const rdv_ctx *x, int fd, char (*keys)[96], int n, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = 0;
    for (int r = 0; r < n && len + 16 < cap; r++) {
        int ready = 1;
        if (st_check(x, fd, keys + r, 1, &ready) < 0)
            break;
        if (!ready)
            len += (size_t)snprintf(buf + len, cap - len, "%s%d", len ? ", " : "", r);
    }
}

/* A deadline for one query of the store: the store answers at once, and the
 * rendezvous's own deadline may be about to pass while it polls. */
static rdv_ctx st_query(const rdv_ctx *x)
{
    return (rdv_ctx){x->ri, zo_now_ns() + 10000000000ull};
}

static zo_status st_exchange(const rdv_ctx *x, int fd, const void *mine, void *all, size_t bytes,
                             char (*keys)[96])
{
    int n = x->ri->world_size, ready = 0;
    ZO_TRY(st_hello(x, fd));
    ZO_TRY(st_send_u8(x, fd, ST_SET));
    ZO_TRY(st_send_bytes(x, fd, keys[x->ri->rank], strlen(keys[x->ri->rank])));
    ZO_TRY(st_send_bytes(x, fd, mine, bytes));
    for (;;) {
        rdv_ctx q = st_query(x);
        ZO_TRY(st_check(&q, fd, keys, n, &ready));
        if (ready || !ms_left(x))
            break;
        usleep(20000);
    }
    rdv_ctx q = st_query(x);
    if (!ready) {
        char missing[256];
        st_missing(&q, fd, keys, n, missing, sizeof missing);
        return ZO_FAIL(ZO_ERR_IO, "launch",
                       "rendezvous in torchrun's store at %s:%d: rank(s) %s did not arrive within "
                       "the timeout",
                       x->ri->master_addr, x->ri->master_port, missing);
    }
    for (int r = 0; r < n; r++)
        ZO_TRY(st_get(&q, fd, keys[r], (char *)all + (size_t)r * bytes, bytes));
    return ZO_OK;
}

/* Every rank sets its block in torchrun's store and reads everyone's. Each
 * rendezvous has keys of its own: a rank's n-th call meets the others' n-th
 * (the ranks call it in the same order; counted per rank, so that threads
 * playing ranks in one process count apart), and torchrun's restarts count
 * in the keys too. */
static zo_status through_store(const rdv_ctx *x, const void *mine, void *all, size_t bytes)
{
    static atomic_uint calls[256];
    unsigned call = atomic_fetch_add(&calls[x->ri->rank % 256], 1);
    int n = x->ri->world_size, fd = -1;
    char(*keys)[96] = malloc(sizeof *keys * (size_t)n);
    if (!keys)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "launch", "rendezvous: out of memory");
    const char *attempt = zo_env_str("TORCHELASTIC_RESTART_COUNT", "0");
    for (int r = 0; r < n; r++)
        snprintf(keys[r], sizeof keys[r], "zoffload/rendezvous/%.16s/%u/%d", attempt, call, r);
    zo_status st;
    for (int attempt_no = 1;; attempt_no++) {
        fd = -1;
        st = connect_to_root(x, &fd);
        int dropped = 0;
        if (st == ZO_OK) {
            st = st_exchange(x, fd, mine, all, bytes, keys);
            dropped = st < 0 && (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN);
        }
        if (fd >= 0)
            close(fd);
        /* torchrun's store now and then drops a worker's connection while
         * the agent is busy (seen under load: EPIPE on the first send). Every
         * query is idempotent (the same key set to the same block), so the
         * exchange starts again on a new connection, as torch's own clients
         * reconnect. */
        if (!dropped || attempt_no >= ST_ATTEMPTS || !ms_left(x))
            break;
        usleep(50000u * (unsigned)attempt_no);
    }
    free(keys);
    if (st < 0) {
        char why[384];
        snprintf(why, sizeof why, "%s", zo_last_error());
        return ZO_FAIL(st, "launch", "rank %d: %s", x->ri->rank, why);
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
    if (torch_agent_store(ri))
        return through_store(&x, mine, all, bytes);
    return ri->rank == 0 ? serve(&x, mine, all, bytes) : join(&x, mine, all, bytes);
}
