/* The communicator's backend table (not installed). The front end (comm.c)
 * holds the registry, checks each table and the arguments and buffers, and
 * names ranks in messages; a backend moves the data: self (comm_self.c), tcp
 * (comm_tcp.c: sockets, no MPI), mpi (comm_mpi.c, its progress thread) and
 * nccl (comm_nccl.c). */
#ifndef ZO_COMM_IMPL_H
#define ZO_COMM_IMPL_H

#include <stdint.h>

#include "zo/comm.h"
#include "zo_internal.h"

typedef enum zo_coll_kind {
    ZO_COLL_ALL_REDUCE,
    ZO_COLL_REDUCE_SCATTER,
    ZO_COLL_ALL_GATHER,
    ZO_COLL_BROADCAST,
    ZO_COLL_SEND,
    ZO_COLL_RECV,
    ZO_COLL_BARRIER,
    ZO_COLL_REDUCE,
} zo_coll_kind;

/* One collective as the caller asked for it. count is the caller's count
 * (all-reduce, broadcast, send/recv: the buffer; reduce-scatter: recv's;
 * all-gather: send's; reduce: both); peer is the root or the peer. */
typedef struct zo_coll {
    zo_coll_kind kind;
    zo_reduce_mode mode;
    const void *send;
    void *recv;
    size_t count;
    zo_dtype dt;
    int peer;
} zo_coll;

struct zo_comm;

/* Bumped when a slot is added, removed or changes meaning. */
#define ZO_COMM_OPS_VERSION 1u

/* Capability flags (zo_comm_ops.caps). The buffers a backend reaches:
 * host-addressable ones (the cpu device's memory, host memory), device
 * allocations, or both. */
enum {
    ZO_COMM_CAP_HOST_BUFFERS = 1u << 0,
    ZO_COMM_CAP_DEVICE_BUFFERS = 1u << 1,
    ZO_COMM_CAP_ONE_RANK = 1u << 2, /* a world of one rank only (self) */
};

/* Every slot is required. */
typedef struct zo_comm_ops {
    const char *name;
    unsigned version; /* ZO_COMM_OPS_VERSION */
    unsigned caps;    /* ZO_COMM_CAP_* */
    /* The world: fills c->rank and c->size (ri says what the launcher said). */
    zo_status (*init)(struct zo_comm *c, const zo_rank_info *ri);
    /* child->impl for c split by (color >= 0, key); fills child's rank, size
     * and world ranks. */
    zo_status (*split)(struct zo_comm *c, int color, int key, struct zo_comm *child);
    void (*fini)(struct zo_comm *c);
    /* Enqueues op on s (already checked). */
    zo_status (*enqueue)(struct zo_comm *c, zo_stream_t s, const zo_coll *op);
    /* Blocking all-gather of bytes per rank in host memory. */
    zo_status (*host_all_gather)(struct zo_comm *c, const void *mine, void *all, size_t bytes);
    zo_status (*run_native)(struct zo_comm *c, zo_comm_native_fn fn, void *arg);
} zo_comm_ops;

struct zo_comm {
    const zo_comm_ops *be;
    unsigned caps; /* the backend's, or device buffers only under ZO_COMM_DEVICE_ONLY */
    void *impl;
    zo_device_t dev;
    int rank, size;
    int *world_ranks; /* rank in c -> world rank */
    int is_world;
    double timeout_s;
    size_t segment_bytes; /* exact reductions' pipeline segment */
    zo_rank_info ri;
};

extern const zo_comm_ops zo_comm_self_backend;
extern const zo_comm_ops zo_comm_tcp_backend;
#ifdef ZO_HAVE_MPI
extern const zo_comm_ops zo_comm_mpi_backend;
#endif
#ifdef ZO_HAVE_NCCL
extern const zo_comm_ops zo_comm_nccl_backend;
#endif

/* The backends this build has (comm.c's registry); returns the count. */
size_t zo_comm_backends(const zo_comm_ops *const **out);
/* ZO_OK when o is of this version and fills every slot. */
zo_status zo_comm_ops_check(const zo_comm_ops *o);

/* "all-reduce", "reduce-scatter", ... */
const char *zo_coll_name(zo_coll_kind k);
/* Bytes a rank's send and recv buffers span for op on a group of size n. */
size_t zo_coll_send_bytes(const zo_coll *op, int n);
size_t zo_coll_recv_bytes(const zo_coll *op, int n);

/* dst[i] = a[i] + b[i] for n elements of dt (f32, f64, bf16, f16), each sum
 * rounded to dt: the one addition every exact reduction uses. */
void zo_comm_add(void *dst, const void *a, const void *b, size_t n, zo_dtype dt);

/* Enqueues a host memcpy on s (for the self backend and local blocks). */
zo_status zo_comm_enqueue_copy(zo_comm_t c, zo_stream_t s, void *dst, const void *src,
                               size_t bytes);

/* Writes "1, 3" (the world ranks of the listed ranks of c) into buf. */
void zo_comm_format_ranks(zo_comm_t c, const int *ranks, int n, char *buf, size_t cap);

#endif
