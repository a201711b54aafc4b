/* zoffload: communicators: collectives across ranks, ordered on streams.
 *
 * A communicator joins the ranks of a run (zo/launch.h finds them) over one
 * backend: "self" (one rank), "mpi" (host-addressable buffers: the cpu
 * device's memory and the host tiers; OpenMPI has no asynchronous progress,
 * so one progress thread per process makes every MPI call), "tcp"
 * (host-addressable buffers over sockets, for ranks without an MPI world:
 * torchrun, or ranks stated in the config; each rank publishes a listening
 * address through the launch rendezvous; every reduction, fast or exact, is
 * the exact chain below) or "nccl" (CUDA device buffers). Collectives are enqueued on a zo_stream_t
 * like the device's copies: they run after the work queued before them on that stream, and work
 * queued after them sees their result; a failure is kept as the stream's asynchronous error
 * (zo_stream_synchronize returns it).
 *
 * Every rank of a communicator must issue its collectives in the same order
 * (as NCCL and MPI require). Reductions are sums. Two reduction modes:
 * ZO_REDUCE_FAST is the backend's own reduction (its order depends on the
 * world size and the algorithm); ZO_REDUCE_EXACT is a pipelined chain in rank
 * order built from point-to-point messages, so the result is bitwise
 * (((x0 + x1) + x2) + ...) + x(n-1) for every world size, each addition
 * rounded to the element type.
 *
 * Failures never hang: a collective that has not completed after the
 * communicator's timeout fails with a message naming the ranks that stopped
 * answering, or that answer but never entered it (the mpi backend's progress
 * thread keeps a heartbeat with every rank, carrying how many collectives
 * each has started; nccl aborts the communicator and cannot tell which). With mpi a collective
 * waiting on a rank whose heartbeat stopped (dead, or stopped by SIGSTOP) fails sooner: once the
 * silence lasts half the timeout, at most 30 s. After such a failure the
 * communicator only returns that error; the process is expected to exit. */
#ifndef ZO_COMM_H
#define ZO_COMM_H

#include <stddef.h>

#include "zo/api.h"
#include "zo/device.h"
#include "zo/dtype.h"
#include "zo/launch.h"
#include "zo/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zo_comm *zo_comm_t;

typedef enum zo_reduce_mode {
    ZO_REDUCE_FAST = 0,  /* the backend's reduction */
    ZO_REDUCE_EXACT = 1, /* a chain in rank order: bitwise the same for every world size */
} zo_reduce_mode;

typedef struct zo_comm_config {
    size_t struct_size;
    const char *backend;     /* "auto", "host", "self", "tcp", "mpi" or "nccl". auto: self
                                for one rank, nccl on a cuda device, else host. host (the
                                backends for host buffers): mpi under mpirun or srun, else
                                tcp (torchrun, config ranks) */
    zo_device_t device;      /* the device whose streams carry the collectives (required) */
    zo_launch_config launch; /* rank, world size, rendezvous; -1/NULL/0 from the launcher */
    double timeout_s;        /* a collective not done after this fails; 0: ZO_COMM_TIMEOUT or 300 */
    size_t exact_segment_bytes; /* pipeline segment of exact reductions; 0: 1 MiB */
    int device_buffers_only;    /* 1: a host-memory backend on a host-addressable device (mpi
                                   or tcp on the cpu device) takes device allocations only, as
                                   nccl does, so a program's unstaged host exchanges fail there
                                   as on GPUs; ZO_COMM_DEVICE_ONLY=1 sets it for every one */
} zo_comm_config;

#define ZO_COMM_CONFIG_INIT                                                                        \
    {                                                                                              \
        .struct_size = sizeof(zo_comm_config), .backend = "auto", .launch = ZO_LAUNCH_CONFIG_INIT  \
    }

/* Whether this build has the backend ("self", "tcp", "mpi", "nccl"). */
ZO_API int zo_comm_backend_built(const char *name);

/* Joins the world: collective over all ranks. */
ZO_API zo_status zo_comm_init(zo_comm_t *out, const zo_comm_config *cfg);
/* Splits c into groups by color (ranks with equal colors form one group,
 * ordered by key, then by rank in c): collective over c. A negative color
 * joins no group (*out = NULL). */
ZO_API zo_status zo_comm_split(zo_comm_t c, int color, int key, zo_comm_t *out);
/* Frees a communicator; the streams that carried its collectives must be
 * idle. The world communicator is freed last. NULL is accepted. */
ZO_API void zo_comm_free(zo_comm_t c);

ZO_API int zo_comm_rank(zo_comm_t c);
ZO_API int zo_comm_size(zo_comm_t c);
/* The world rank of rank r of c (for messages). */
ZO_API int zo_comm_world_rank(zo_comm_t c, int r);
ZO_API const char *zo_comm_backend(zo_comm_t c);
/* 1 when c's sends, receives and collectives take its device's memory
 * (nccl; mpi and self on a host-addressable device such as cpu), 0 when
 * they need host-addressable buffers, so device data must be staged
 * through (pinned) host memory. */
ZO_API int zo_comm_takes_device_memory(zo_comm_t c);
/* 1 when c's collectives take host memory (mpi, tcp, self: pageable or
 * pinned), 0 when they take device allocations only (nccl), so host data
 * must be staged through device buffers. */
ZO_API int zo_comm_takes_host_memory(zo_comm_t c);

/* ---- stream-ordered collectives ----
 * Counts are elements of dt. Reductions take ZO_DTYPE_F32, F64, BF16 and F16;
 * the others move any type. send and recv may be the same buffer where the
 * operation allows (all-reduce; reduce-scatter when recv is send's own shard;
 * all-gather when send is recv's own block). */

/* recv[i] = sum over ranks of send[i], for i < count. */
ZO_API zo_status zo_comm_all_reduce(zo_comm_t c, zo_stream_t s, const void *send, void *recv,
                                    size_t count, zo_dtype dt, zo_reduce_mode mode);
/* send holds size * recv_count elements; rank r receives the sum of block r. */
ZO_API zo_status zo_comm_reduce_scatter(zo_comm_t c, zo_stream_t s, const void *send, void *recv,
                                        size_t recv_count, zo_dtype dt, zo_reduce_mode mode);
/* On root, recv[i] = sum over ranks of send[i] (the other ranks' recv is
 * not used and may be NULL): the gradients reduced to their owner. */
ZO_API zo_status zo_comm_reduce(zo_comm_t c, zo_stream_t s, const void *send, void *recv,
                                size_t count, zo_dtype dt, int root, zo_reduce_mode mode);
/* recv holds size * send_count elements: block r is rank r's send. */
ZO_API zo_status zo_comm_all_gather(zo_comm_t c, zo_stream_t s, const void *send, void *recv,
                                    size_t send_count, zo_dtype dt);
/* buf on every rank becomes buf on root. */
ZO_API zo_status zo_comm_broadcast(zo_comm_t c, zo_stream_t s, void *buf, size_t count, zo_dtype dt,
                                   int root);
/* Point to point, matched in issue order per pair of ranks. */
ZO_API zo_status zo_comm_send(zo_comm_t c, zo_stream_t s, const void *buf, size_t count,
                              zo_dtype dt, int peer);
ZO_API zo_status zo_comm_recv(zo_comm_t c, zo_stream_t s, void *buf, size_t count, zo_dtype dt,
                              int peer);
ZO_API zo_status zo_comm_barrier(zo_comm_t c, zo_stream_t s);

/* ---- checks across ranks (blocking, host memory) ---- */

/* Compares a configuration across the ranks of c: each key's canonical value
 * string is hashed (xxh64) and the hashes all-gathered. ZO_ERR_CONFIG when a
 * rank differs, naming the first key (in the callers' order) that differs and
 * the ranks holding each value. Every rank must pass the same keys. */
ZO_API zo_status zo_comm_check_config(zo_comm_t c, const char *const *keys,
                                      const char *const *values, size_t n);

/* Runs fn on the thread that owns the backend (the mpi progress thread),
 * between collectives, with the backend's own handle: a pointer to the
 * MPI_Comm (mpi), to the ncclComm_t (nccl), to the int array of the
 * collectives' sockets by rank (tcp; -1 for this rank) or NULL (self). For benchmarks
 * comparing with the backend's own calls, and for interoperation. */
typedef zo_status (*zo_comm_native_fn)(void *native, void *arg);
ZO_API zo_status zo_comm_run_native(zo_comm_t c, zo_comm_native_fn fn, void *arg);

#ifdef __cplusplus
}
#endif
#endif
