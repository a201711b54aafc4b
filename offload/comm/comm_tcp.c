/* The tcp backend: host-addressable buffers over plain sockets, for ranks
 * that have no MPI world (torchrun, or ranks stated in the config).
 *
 * Each rank listens on a port of its own and publishes its address through
 * the launch rendezvous (zo_launch_rendezvous: rank 0's MASTER_ADDR:
 * MASTER_PORT, or torchrun's own store). Every pair of ranks of a
 * communicator then holds two connections, one carrying the collectives
 * and one the caller's send/recv; a split opens its own between its
 * members. The collectives run on the stream's worker: each takes a ticket
 * when it is enqueued and waits for its turn, so they run in issue order
 * on every rank, and the bytes on each connection come in the same order on
 * both ends (no tags).
 *
 * Every reduction, fast or exact, is the chain of comm_mpi_exact.c: rank 0
 * sends each segment to rank 1, rank r adds its own values to what came
 * from r - 1 and passes the sum on, so the last rank holds
 * ((x0 + x1) + x2) + ... rounded at each step: the same bits as the mpi
 * backend's exact mode for every world size. TCP's buffers pipeline the
 * segments. The result then travels on from the last rank (a chain for the
 * all-reduce, to the owner for a reduce-scatter's block and a reduce).
 * Broadcasts and all-gathers are chains from their root.
 *
 * Sockets are non-blocking and every move has the collective's deadline:
 * a peer that closes its connection (it exited or was killed) or does not
 * answer within the timeout is named. A failure shuts every connection of
 * the communicator down, so the others see it at once rather than at their
 * timeout, and the communicator only returns that error afterwards. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm_impl.h"
#include "sock.h"

enum { TCP_MAGIC = 0x7a6f7463 }; /* "zotc" */
enum { CH_COLL, CH_P2P, N_CH };
enum { MSG_CAP = 512 };

/* What each rank publishes through the rendezvous. */
typedef struct tcp_addr {
    char host[256]; /* as long as zo_rank_info.master_addr */
    uint32_t port;
    uint32_t rank;
    uint64_t nonce; /* rank 0's: this run's */
} tcp_addr;

/* The first bytes on every connection: who connects, for which
 * communicator and channel. */
typedef struct tcp_hello {
    uint32_t magic, from, channel, pad;
    uint64_t nonce, comm_id;
} tcp_hello;

typedef struct stashed {
    int fd;
    tcp_hello h;
    struct stashed *next;
} stashed;

/* What the world and its splits share: the listening socket, every world
 * rank's address, and the connections accepted for another communicator
 * than the one waiting (splits may be set up on two threads at once). */
typedef struct tcp_world {
    int lfd, n;
    tcp_addr *addrs;
    uint64_t nonce;
    pthread_mutex_t mu; /* guards the fields below and the accepting */
    stashed *stash;
    int refs;
} tcp_world;

typedef struct tcp_comm {
    tcp_world *w;
    uint64_t id;
    int *fds[N_CH];     /* by rank in this communicator; -1 for this rank */
    pthread_mutex_t mu; /* guards the fields below */
    pthread_cond_t cv;
    uint64_t next_ticket, next_run, splits;
    int broken;
    char why[MSG_CAP];
    pthread_mutex_t send_mu, recv_mu; /* the send/recv channel, each way */
} tcp_comm;

/* One move of a collective: its communicator, name and deadline. */
typedef struct io_ctx {
    zo_comm_t c;
    const char *what;
    uint64_t deadline_ns;
} io_ctx;

static int wr(zo_comm_t c, int r)
{
    return c->world_ranks ? c->world_ranks[r] : r;
}

/* ---- failure: named, then every connection shut down ---- */

static zo_status break_comm(zo_comm_t c, zo_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static zo_status break_comm(zo_comm_t c, zo_status st, const char *fmt, ...)
{
    tcp_comm *tc = c->impl;
    char msg[MSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&tc->mu);
    if (!tc->broken) {
        tc->broken = 1;
        snprintf(tc->why, sizeof tc->why, "%s", msg);
        for (int ch = 0; ch < N_CH; ch++)
            for (int r = 0; r < c->size; r++)
                if (tc->fds[ch][r] >= 0)
                    shutdown(tc->fds[ch][r], SHUT_RDWR);
        pthread_cond_broadcast(&tc->cv);
    }
    pthread_mutex_unlock(&tc->mu);
    return ZO_FAIL(st, "comm", "%s", msg);
}

static zo_status broken_status(zo_comm_t c)
{
    tcp_comm *tc = c->impl;
    char why[MSG_CAP];
    pthread_mutex_lock(&tc->mu);
    int b = tc->broken;
    snprintf(why, sizeof why, "%s", tc->why);
    pthread_mutex_unlock(&tc->mu);
    return b ? ZO_FAIL(ZO_ERR_IO, "comm", "%s", why) : ZO_OK;
}

/* ---- moving bytes ---- */

/* Moves exactly n bytes to (out) or from rank peer of x->c on channel ch. */
static zo_status io_move(const io_ctx *x, int ch, int peer, void *buf, size_t n, int out)
{
    tcp_comm *tc = x->c->impl;
    int err = zo_sock_move(tc->fds[ch][peer], buf, n, out, x->deadline_ns);
    if (!err)
        return ZO_OK;
    if (err == ETIMEDOUT)
        return break_comm(
            x->c, ZO_ERR_IO,
            "tcp %s: rank %d %s within %.1f s (it, or a rank before it in the chain, has not "
            "entered the %s or hung); set the communicator's timeout_s or ZO_COMM_TIMEOUT for "
            "longer waits",
            x->what, wr(x->c, peer), out ? "took no data" : "sent nothing", x->c->timeout_s,
            x->what);
    zo_status st = broken_status(x->c); /* shut down here after another failure */
    if (st < 0)
        return st;
    return break_comm(x->c, ZO_ERR_IO,
                      "tcp %s: rank %d closed its connection (%s): it exited, was killed or "
                      "failed (see its log)",
                      x->what, wr(x->c, peer), err == ENOTCONN ? "end of stream" : strerror(err));
}

/* ---- the chains ---- */

/* Bytes per message: the exact reductions' segment, whole elements. */
static size_t seg_elems(zo_comm_t c, size_t esz)
{
    size_t e = c->segment_bytes / esz;
    return e ? e : 1;
}

/* The sum in rank order of every rank's src (count elements) lands in dst
 * on the last rank; add = 0 only passes a token along (the barrier). */
static zo_status chain_reduce(const io_ctx *x, const char *src, char *dst, size_t count,
                              zo_dtype dt, char *slot)
{
    zo_comm_t c = x->c;
    int r = c->rank, n = c->size;
    size_t esz = zo_dtype_size(dt), seg = seg_elems(c, esz);
    if (n == 1) {
        memmove(dst, src, count * esz);
        return ZO_OK;
    }
    for (size_t off = 0; off < count; off += seg) {
        size_t len = count - off < seg ? count - off : seg;
        const char *own = src + off * esz;
        if (r == 0) {
            ZO_TRY(io_move(x, CH_COLL, 1, (void *)own, len * esz, 1));
            continue;
        }
        ZO_TRY(io_move(x, CH_COLL, r - 1, slot, len * esz, 0));
        if (r == n - 1) {
            zo_comm_add(dst + off * esz, slot, own, len, dt);
        } else {
            zo_comm_add(slot, slot, own, len, dt);
            ZO_TRY(io_move(x, CH_COLL, r + 1, slot, len * esz, 1));
        }
    }
    return ZO_OK;
}

/* buf (bytes) on root reaches every rank along root -> root+1 -> ... */
static zo_status chain_bcast(const io_ctx *x, char *buf, size_t bytes, int root)
{
    zo_comm_t c = x->c;
    int n = c->size, rel = (c->rank - root + n) % n;
    int prev = (c->rank - 1 + n) % n, next = (c->rank + 1) % n;
    size_t seg = c->segment_bytes ? c->segment_bytes : 1;
    if (n == 1)
        return ZO_OK;
    for (size_t off = 0; off < bytes; off += seg) {
        size_t len = bytes - off < seg ? bytes - off : seg;
        if (rel > 0)
            ZO_TRY(io_move(x, CH_COLL, prev, buf + off, len, 0));
        if (rel < n - 1)
            ZO_TRY(io_move(x, CH_COLL, next, buf + off, len, 1));
    }
    return ZO_OK;
}

/* The last rank's sum in tmp goes to rank to's dst (a block's owner, a
 * reduce's root). */
static zo_status hand_over(const io_ctx *x, const char *tmp, char *dst, size_t bytes, int to)
{
    int last = x->c->size - 1;
    if (to == last)
        return ZO_OK;
    if (x->c->rank == last)
        return io_move(x, CH_COLL, to, (void *)tmp, bytes, 1);
    if (x->c->rank == to)
        return io_move(x, CH_COLL, last, dst, bytes, 0);
    return ZO_OK;
}

static zo_status run_all_gather(const io_ctx *x, const void *send, void *recv, size_t bytes)
{
    zo_comm_t c = x->c;
    char *own = (char *)recv + bytes * (size_t)c->rank;
    if (own != send && bytes)
        memmove(own, send, bytes);
    for (int b = 0; b < c->size; b++)
        ZO_TRY(chain_bcast(x, (char *)recv + bytes * (size_t)b, bytes, b));
    return ZO_OK;
}

/* A reduction: all-reduce, reduce-scatter or reduce. */
static zo_status run_reduction(const io_ctx *x, const zo_coll *op, char *slot)
{
    zo_comm_t c = x->c;
    int n = c->size, last = n - 1, me = c->rank;
    size_t esz = zo_dtype_size(op->dt), bytes = op->count * esz;
    const char *send = op->send;
    char *recv = op->recv;
    if (op->kind == ZO_COLL_ALL_REDUCE) {
        ZO_TRY(chain_reduce(x, send, recv, op->count, op->dt, slot));
        return chain_bcast(x, recv, bytes, last);
    }
    /* The last rank keeps a block's sum whole before handing it over: sent
     * while the chain still runs, it would wait on a rank that is itself
     * waiting to pass its part on. */
    char *tmp = me == last && bytes ? malloc(bytes) : NULL;
    if (me == last && bytes && !tmp)
        return break_comm(c, ZO_ERR_NO_MEMORY, "tcp %s: out of memory for %zu bytes",
                          zo_coll_name(op->kind), bytes);
    zo_status st = ZO_OK;
    if (op->kind == ZO_COLL_REDUCE) {
        int root = op->peer;
        st = chain_reduce(x, send, root == last ? recv : tmp, op->count, op->dt, slot);
        if (st == ZO_OK)
            st = hand_over(x, tmp, recv, bytes, root);
    } else {
        for (int b = 0; b < n && st == ZO_OK; b++) {
            st = chain_reduce(x, send + bytes * (size_t)b, b == last ? recv : tmp, op->count,
                              op->dt, slot);
            if (st == ZO_OK)
                st = hand_over(x, tmp, recv, bytes, b);
        }
    }
    free(tmp);
    return st;
}

static zo_status run_coll(const io_ctx *x, const zo_coll *op)
{
    zo_comm_t c = x->c;
    size_t esz = zo_dtype_size(op->dt), bytes = op->count * esz;
    switch (op->kind) {
    case ZO_COLL_ALL_REDUCE:
    case ZO_COLL_REDUCE_SCATTER:
    case ZO_COLL_REDUCE: {
        char *slot = malloc(seg_elems(c, esz) * esz);
        if (!slot)
            return break_comm(c, ZO_ERR_NO_MEMORY, "tcp %s: out of memory for a segment", x->what);
        zo_status st = run_reduction(x, op, slot);
        free(slot);
        return st;
    }
    case ZO_COLL_ALL_GATHER: return run_all_gather(x, op->send, op->recv, bytes);
    case ZO_COLL_BROADCAST: return chain_bcast(x, op->recv, bytes, op->peer);
    case ZO_COLL_BARRIER: {
        char token = 0, slot = 0;
        ZO_TRY(chain_reduce(x, &token, &token, 1, ZO_DTYPE_U8, &slot));
        return chain_bcast(x, &token, 1, c->size - 1);
    }
    default: break;
    }
    return ZO_FAIL(ZO_ERR_INTERNAL, "comm", "tcp: %s reached the collectives",
                   zo_coll_name(op->kind));
}

/* ---- turns: collectives run in issue order ---- */

static uint64_t take_ticket(zo_comm_t c)
{
    tcp_comm *tc = c->impl;
    pthread_mutex_lock(&tc->mu);
    uint64_t t = tc->next_ticket++;
    pthread_mutex_unlock(&tc->mu);
    return t;
}

/* Waits for ticket t's turn; ZO_OK, or the error that broke c. */
static zo_status wait_turn(zo_comm_t c, uint64_t t)
{
    tcp_comm *tc = c->impl;
    pthread_mutex_lock(&tc->mu);
    while (tc->next_run != t && !tc->broken)
        pthread_cond_wait(&tc->cv, &tc->mu);
    pthread_mutex_unlock(&tc->mu);
    return broken_status(c);
}

static void end_turn(zo_comm_t c)
{
    tcp_comm *tc = c->impl;
    pthread_mutex_lock(&tc->mu);
    tc->next_run++;
    pthread_cond_broadcast(&tc->cv);
    pthread_mutex_unlock(&tc->mu);
}

static io_ctx ctx_for(zo_comm_t c, const char *what)
{
    return (io_ctx){c, what, zo_now_ns() + (uint64_t)(c->timeout_s * 1e9)};
}

typedef struct tcp_task {
    zo_comm_t c;
    zo_coll op;
    uint64_t ticket;
} tcp_task;

static zo_status run_task(void *arg)
{
    tcp_task *t = arg;
    zo_comm_t c = t->c;
    tcp_comm *tc = c->impl;
    if (t->op.kind == ZO_COLL_SEND || t->op.kind == ZO_COLL_RECV) {
        int out = t->op.kind == ZO_COLL_SEND;
        pthread_mutex_t *mu = out ? &tc->send_mu : &tc->recv_mu;
        io_ctx x = ctx_for(c, zo_coll_name(t->op.kind));
        size_t bytes = t->op.count * zo_dtype_size(t->op.dt);
        ZO_TRY(broken_status(c));
        pthread_mutex_lock(mu);
        zo_status st =
            io_move(&x, CH_P2P, t->op.peer, out ? (void *)t->op.send : t->op.recv, bytes, out);
        pthread_mutex_unlock(mu);
        return st;
    }
    zo_status st = wait_turn(c, t->ticket);
    if (st == ZO_OK) {
        io_ctx x = ctx_for(c, zo_coll_name(t->op.kind));
        st = run_coll(&x, &t->op);
    }
    end_turn(c);
    return st;
}

static zo_status tcp_enqueue(zo_comm_t c, zo_stream_t s, const zo_coll *op)
{
    tcp_task t = {c, *op, 0};
    int p2p = op->kind == ZO_COLL_SEND || op->kind == ZO_COLL_RECV;
    if (!p2p)
        t.ticket = take_ticket(c);
    zo_status st = zo_stream_enqueue(s, run_task, &t, sizeof t);
    if (st < 0 && !p2p) {
        /* The turn would never come: the ranks are no longer in step. */
        char why[MSG_CAP];
        snprintf(why, sizeof why, "%s", zo_last_error());
        return break_comm(c, st, "tcp %s: could not be queued (%s); the communicator is closed",
                          zo_coll_name(op->kind), why);
    }
    return st;
}

static zo_status tcp_host_all_gather(zo_comm_t c, const void *mine, void *all, size_t bytes)
{
    zo_status st = wait_turn(c, take_ticket(c));
    if (st == ZO_OK) {
        io_ctx x = ctx_for(c, "host all-gather");
        st = run_all_gather(&x, mine, all, bytes);
    }
    end_turn(c);
    return st;
}

static zo_status tcp_run_native(zo_comm_t c, zo_comm_native_fn fn, void *arg)
{
    tcp_comm *tc = c->impl;
    zo_status st = wait_turn(c, take_ticket(c));
    if (st == ZO_OK)
        st = fn(tc->fds[CH_COLL], arg);
    end_turn(c);
    return st;
}

/* ---- connections ---- */

static zo_status set_nonblocking(int fd)
{
    int one = 1, fl = fcntl(fd, F_GETFL);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return ZO_FAIL(ZO_ERR_SYSTEM, "comm", "tcp: cannot make a socket non-blocking: %s",
                       strerror(errno));
    return ZO_OK;
}

/* Moves n bytes on a socket being set up. */
static zo_status setup_move(int fd, void *buf, size_t n, int out, uint64_t deadline_ns,
                            const char *what)
{
    int err = zo_sock_move(fd, buf, n, out, deadline_ns);
    if (err)
        return ZO_FAIL(ZO_ERR_IO, "comm", "tcp: %s: %s", what,
                       err == ETIMEDOUT  ? "timed out"
                       : err == ENOTCONN ? "connection closed"
                                         : strerror(err));
    return ZO_OK;
}

/* Connects to world rank `to` and says who this is. */
static zo_status dial(tcp_world *w, int to, const tcp_hello *h, uint64_t deadline_ns, int *out)
{
    const tcp_addr *a = &w->addrs[to];
    char port[16];
    snprintf(port, sizeof port, "%u", a->port);
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
    int rc = getaddrinfo(a->host, port, &hints, &res);
    if (rc)
        return ZO_FAIL(ZO_ERR_CONFIG, "comm", "tcp: rank %d's address '%s': %s", to, a->host,
                       gai_strerror(rc));
    for (;;) {
        int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        rc = fd < 0 ? -1 : connect(fd, res->ai_addr, res->ai_addrlen);
        int err = errno;
        if (rc == 0) {
            freeaddrinfo(res);
            zo_status st = setup_move(fd, (void *)h, sizeof *h, 1, deadline_ns, "hello");
            if (st == ZO_OK)
                st = set_nonblocking(fd);
            if (st < 0) {
                close(fd);
                return st;
            }
            *out = fd;
            return ZO_OK;
        }
        if (fd >= 0)
            close(fd);
        if (!zo_sock_ms_left(deadline_ns)) {
            freeaddrinfo(res);
            return ZO_FAIL(ZO_ERR_IO, "comm",
                           "tcp: rank %u cannot connect to rank %d at %s:%u: %s (is a firewall "
                           "in the way? ZO_COMM_TCP_ADDR sets the address a rank publishes)",
                           h->from, to, a->host, a->port, strerror(err));
        }
        usleep(10000);
    }
}

/* Takes the stashed connection from `from` for comm_id on channel ch. */
static int unstash(tcp_world *w, uint64_t comm_id, int from, int ch)
{
    for (stashed **p = &w->stash; *p; p = &(*p)->next) {
        stashed *s = *p;
        if (s->h.comm_id == comm_id && s->h.from == (uint32_t)from &&
            s->h.channel == (uint32_t)ch) {
            int fd = s->fd;
            *p = s->next;
            free(s);
            return fd;
        }
    }
    return -1;
}

/* Accepts one connection and stashes it (the lock held); 0 when none came
 * within ms. */
static void accept_one(tcp_world *w, int ms, uint64_t deadline_ns)
{
    struct pollfd pfd = {w->lfd, POLLIN, 0};
    if (poll(&pfd, 1, ms) <= 0)
        return;
    int fd = accept4(w->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        return;
    tcp_hello h;
    stashed *s = NULL;
    if (setup_move(fd, &h, sizeof h, 0, deadline_ns, "hello") < 0 || h.magic != TCP_MAGIC ||
        h.nonce != w->nonce || h.from >= (uint32_t)w->n || h.channel >= N_CH ||
        set_nonblocking(fd) < 0 || !(s = malloc(sizeof *s))) {
        ZO_LOGW("comm", "tcp: refused a connection that is not a rank of this run");
        close(fd);
        return;
    }
    *s = (stashed){fd, h, w->stash};
    w->stash = s;
}

/* The connection `from` (a rank of the communicator comm_id) opens to
 * this rank on channel ch. */
static zo_status await_conn(tcp_world *w, uint64_t comm_id, int from, int from_world, int ch,
                            uint64_t deadline_ns, int *out)
{
    for (;;) {
        pthread_mutex_lock(&w->mu);
        int fd = unstash(w, comm_id, from, ch);
        if (fd < 0 && zo_sock_ms_left(deadline_ns))
            accept_one(w, 50, deadline_ns);
        if (fd < 0)
            fd = unstash(w, comm_id, from, ch);
        pthread_mutex_unlock(&w->mu);
        if (fd >= 0) {
            *out = fd;
            return ZO_OK;
        }
        if (!zo_sock_ms_left(deadline_ns))
            return ZO_FAIL(ZO_ERR_IO, "comm",
                           "tcp: rank %d never connected (it exited, hung, or cannot reach this "
                           "rank's address)",
                           from_world);
    }
}

/* The mesh of c: rank i dials every lower rank and accepts every higher
 * one, on both channels. members[r] is rank r's world rank. */
static zo_status connect_mesh(zo_comm_t c, const int *members, double timeout_s)
{
    tcp_comm *tc = c->impl;
    uint64_t deadline = zo_now_ns() + (uint64_t)(timeout_s * 1e9);
    for (int ch = 0; ch < N_CH; ch++)
        for (int r = 0; r < c->rank; r++) {
            tcp_hello h = {TCP_MAGIC, (uint32_t)c->rank, (uint32_t)ch, 0, tc->w->nonce, tc->id};
            ZO_TRY(dial(tc->w, members[r], &h, deadline, &tc->fds[ch][r]));
        }
    for (int ch = 0; ch < N_CH; ch++)
        for (int r = c->rank + 1; r < c->size; r++)
            ZO_TRY(await_conn(tc->w, tc->id, r, members[r], ch, deadline, &tc->fds[ch][r]));
    return ZO_OK;
}

static tcp_comm *new_tcp_comm(tcp_world *w, uint64_t id, int n)
{
    tcp_comm *tc = calloc(1, sizeof *tc);
    if (!tc)
        return NULL;
    tc->w = w;
    tc->id = id;
    for (int ch = 0; ch < N_CH; ch++) {
        tc->fds[ch] = malloc(sizeof(int) * (size_t)n);
        for (int r = 0; tc->fds[ch] && r < n; r++)
            tc->fds[ch][r] = -1;
    }
    pthread_mutex_init(&tc->mu, NULL);
    pthread_cond_init(&tc->cv, NULL);
    pthread_mutex_init(&tc->send_mu, NULL);
    pthread_mutex_init(&tc->recv_mu, NULL);
    if (!tc->fds[CH_COLL] || !tc->fds[CH_P2P]) {
        free(tc->fds[CH_COLL]);
        free(tc->fds[CH_P2P]);
        free(tc);
        return NULL;
    }
    return tc;
}

static void release_world(tcp_world *w)
{
    pthread_mutex_lock(&w->mu);
    int last = --w->refs == 0;
    pthread_mutex_unlock(&w->mu);
    if (!last)
        return;
    while (w->stash) {
        stashed *s = w->stash;
        w->stash = s->next;
        close(s->fd);
        free(s);
    }
    if (w->lfd >= 0)
        close(w->lfd);
    pthread_mutex_destroy(&w->mu);
    free(w->addrs);
    free(w);
}

static void tcp_fini(zo_comm_t c)
{
    tcp_comm *tc = c->impl;
    if (!tc)
        return;
    for (int ch = 0; ch < N_CH; ch++) {
        for (int r = 0; r < c->size; r++)
            if (tc->fds[ch][r] >= 0)
                close(tc->fds[ch][r]);
        free(tc->fds[ch]);
    }
    pthread_mutex_destroy(&tc->mu);
    pthread_cond_destroy(&tc->cv);
    pthread_mutex_destroy(&tc->send_mu);
    pthread_mutex_destroy(&tc->recv_mu);
    tcp_world *w = tc->w;
    free(tc);
    c->impl = NULL;
    release_world(w);
}

/* ---- the world ---- */

static zo_status listen_any(int *lfd, uint32_t *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 256) ||
        getsockname(fd, (struct sockaddr *)&a, &len)) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        return ZO_FAIL(ZO_ERR_IO, "comm", "tcp: cannot listen on a port: %s", strerror(err));
    }
    *lfd = fd;
    *port = ntohs(a.sin_port);
    return ZO_OK;
}

/* The address the other ranks reach this one at: ZO_COMM_TCP_ADDR, rank
 * 0's MASTER_ADDR, else the local address of the route to MASTER_ADDR. */
static zo_status own_host(const zo_rank_info *ri, char *host, size_t cap)
{
    const char *set = getenv("ZO_COMM_TCP_ADDR");
    if (set && *set) {
        if (strlen(set) >= cap)
            return ZO_FAIL(ZO_ERR_CONFIG, "comm", "ZO_COMM_TCP_ADDR is longer than %zu bytes",
                           cap - 1);
        memcpy(host, set, strlen(set) + 1);
        return ZO_OK;
    }
    if (ri->rank == 0) {
        memcpy(host, ri->master_addr, sizeof ri->master_addr);
        return ZO_OK;
    }
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *res;
    char port[16];
    snprintf(port, sizeof port, "%d", ri->master_port);
    int rc = getaddrinfo(ri->master_addr, port, &hints, &res);
    if (rc)
        return ZO_FAIL(ZO_ERR_CONFIG, "comm", "tcp: rendezvous host '%s' (MASTER_ADDR): %s",
                       ri->master_addr, gai_strerror(rc));
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int ok = fd >= 0 && !connect(fd, res->ai_addr, res->ai_addrlen) &&
             !getsockname(fd, (struct sockaddr *)&a, &len) &&
             inet_ntop(AF_INET, &a.sin_addr, host, (socklen_t)cap);
    int err = errno;
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    if (!ok)
        return ZO_FAIL(ZO_ERR_IO, "comm",
                       "tcp: no route from this host to MASTER_ADDR %s (%s); set ZO_COMM_TCP_ADDR "
                       "to this host's address",
                       ri->master_addr, strerror(err));
    return ZO_OK;
}

static zo_status publish(tcp_world *w, const zo_rank_info *ri, double timeout_s)
{
    tcp_addr mine = {.rank = (uint32_t)ri->rank};
    ZO_TRY(listen_any(&w->lfd, &mine.port));
    ZO_TRY(own_host(ri, mine.host, sizeof mine.host));
    if (ri->rank == 0)
        mine.nonce = zo_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)w;
    w->addrs = calloc((size_t)ri->world_size, sizeof *w->addrs);
    if (!w->addrs)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "comm", "out of memory");
    ZO_TRY(zo_launch_rendezvous(ri, &mine, w->addrs, sizeof mine, timeout_s));
    w->nonce = w->addrs[0].nonce;
    return ZO_OK;
}

static zo_status tcp_init(zo_comm_t c, const zo_rank_info *ri)
{
    tcp_world *w = calloc(1, sizeof *w);
    if (!w)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "comm", "out of memory");
    w->lfd = -1;
    w->n = ri->world_size;
    w->refs = 1;
    pthread_mutex_init(&w->mu, NULL);
    c->rank = ri->rank;
    c->size = ri->world_size;
    zo_status st = publish(w, ri, c->timeout_s);
    tcp_comm *tc = st == ZO_OK ? new_tcp_comm(w, 0, c->size) : NULL;
    if (st == ZO_OK && !tc)
        st = ZO_FAIL(ZO_ERR_NO_MEMORY, "comm", "out of memory");
    if (st < 0) {
        release_world(w);
        return st;
    }
    c->impl = tc;
    int *members = malloc(sizeof(int) * (size_t)c->size);
    if (!members)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "comm", "out of memory");
    for (int r = 0; r < c->size; r++)
        members[r] = r;
    st = connect_mesh(c, members, c->timeout_s);
    free(members);
    return st;
}

/* ---- split ---- */

typedef struct split_entry {
    int32_t color, key;
} split_entry;

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* The ranks of c with color, ordered by key then rank: members[i] is the
 * i-th one's rank in c. Returns how many. */
static int members_of(const split_entry *all, int n, int color, int *members)
{
    int m = 0;
    for (int r = 0; r < n; r++) {
        if (all[r].color != color)
            continue;
        int i = m++;
        while (i > 0 && all[members[i - 1]].key > all[r].key) {
            members[i] = members[i - 1];
            i--;
        }
        members[i] = r;
    }
    return m;
}

static zo_status make_child(zo_comm_t c, const split_entry *all, int color, uint64_t split_no,
                            zo_comm_t child)
{
    tcp_comm *tc = c->impl;
    int *members = malloc(sizeof(int) * (size_t)c->size);
    if (!members)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "comm", "out of memory");
    int m = members_of(all, c->size, color, members);
    child->size = m;
    child->world_ranks = malloc(sizeof(int) * (size_t)m);
    uint64_t id = mix64(tc->id ^ mix64(split_no * 0x9e3779b97f4a7c15ull + (uint64_t)color + 1));
    tcp_comm *ct = child->world_ranks ? new_tcp_comm(tc->w, id | 1, m) : NULL;
    if (!ct) {
        free(members);
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "comm", "out of memory");
    }
    for (int i = 0; i < m; i++) {
        child->world_ranks[i] = c->world_ranks[members[i]];
        if (members[i] == c->rank)
            child->rank = i;
    }
    pthread_mutex_lock(&tc->w->mu);
    tc->w->refs++;
    pthread_mutex_unlock(&tc->w->mu);
    child->impl = ct;
    zo_status st = connect_mesh(child, child->world_ranks, c->timeout_s);
    free(members);
    if (st < 0) {
        tcp_fini(child);
        return st;
    }
    return ZO_OK;
}

static zo_status tcp_split(zo_comm_t c, int color, int key, zo_comm_t child)
{
    tcp_comm *tc = c->impl;
    split_entry mine = {color < 0 ? -1 : color, key};
    split_entry *all = malloc(sizeof *all * (size_t)c->size);
    if (!all)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "comm", "out of memory");
    zo_status st = wait_turn(c, take_ticket(c));
    uint64_t split_no = tc->splits++; /* only in turn */
    if (st == ZO_OK) {
        io_ctx x = ctx_for(c, "split");
        st = run_all_gather(&x, &mine, all, sizeof mine);
    }
    /* The child's mesh is set up in turn too: its connections are accepted
     * by the ranks of c, which are in this split and nowhere else. */
    if (st == ZO_OK && color >= 0)
        st = make_child(c, all, color, split_no, child);
    end_turn(c);
    free(all);
    return st;
}

const zo_comm_ops zo_comm_tcp_backend = {
    .name = "tcp",
    .version = ZO_COMM_OPS_VERSION,
    .caps = ZO_COMM_CAP_HOST_BUFFERS,
    .init = tcp_init,
    .split = tcp_split,
    .fini = tcp_fini,
    .enqueue = tcp_enqueue,
    .host_all_gather = tcp_host_all_gather,
    .run_native = tcp_run_native,
};
