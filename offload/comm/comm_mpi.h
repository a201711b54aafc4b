/* What the mpi backend's files share: the process's MPI engine (its
 * progress thread and heartbeat), the per-communicator MPI handles and one
 * operation handed to the progress thread. Only the progress thread calls
 * MPI. */
#ifndef ZO_COMM_MPI_H
#define ZO_COMM_MPI_H

#include <mpi.h>
#include <pthread.h>

#include "comm_impl.h"

enum { ZO_COMM_MSG_CAP = 512 };

/* A communicator's MPI side: comm carries the native collectives and the
 * caller's send/recv, chain the exact reductions' messages. */
typedef struct mpi_comm {
    MPI_Comm comm, chain;
    uint64_t seq;   /* exact reductions started (progress thread only): their tags */
    uint64_t colls; /* collectives started (progress thread only): the world's in heartbeats */
} mpi_comm;

typedef enum { OP_COLL, OP_HOST_ALL_GATHER, OP_SPLIT, OP_NATIVE, OP_FREE } mpi_op_type;

struct mpi_exact;

typedef struct mpi_op {
    mpi_op_type type;
    zo_comm_t c;
    mpi_comm *mc;
    zo_coll coll;
    /* split */
    int color, key;
    mpi_comm *out_mc;
    int out_rank, out_size, *out_world;
    /* native */
    zo_comm_native_fn fn;
    void *arg;
    /* the progress thread's state */
    MPI_Request req;
    void *scratch;
    uint64_t start_ns, seq, coll_index;
    struct mpi_exact *exact;
    /* the result, published under the engine's mutex */
    int done;
    zo_status st;
    char msg[ZO_COMM_MSG_CAP];
    struct mpi_op *next;
} mpi_op;

typedef struct mpi_engine {
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    /* under mu */
    pthread_t thread;
    int refs, stop, finalized, init_done, init_rc, failed;
    char fail_msg[ZO_COMM_MSG_CAP];
    mpi_op *queue, *queue_tail;
    double timeout_s;
    uint64_t hb_interval_ns;
    uint64_t lost_ns; /* a rank silent this long is lost: half the timeout, at most 30 s */
    /* set by the progress thread before init_done, then read-only */
    int world_rank, world_size, tag_ub, we_initialized;
    mpi_comm *world;
    MPI_Op op_bf16, op_f16;
    /* the progress thread's own */
    MPI_Comm hb_comm;
    MPI_Request hb_recv, *hb_send;
    uint64_t hb_in, *hb_out, hb_last_sent, *hb_seen;
    uint64_t *hb_colls; /* each rank's world collectives started, as its heartbeat said */
} mpi_engine;

MPI_Datatype zo_mpi_type(zo_dtype dt);
size_t zo_mpi_count(zo_dtype dt, size_t count);
/* Sets o's error from an MPI return code; returns ZO_ERR_MPI. */
zo_status zo_mpi_fail(mpi_op *o, int rc, const char *what);
/* Hands o to the progress thread and waits for it. */
zo_status zo_mpi_submit_wait(mpi_op *o);

/* The exact reductions (comm_mpi_exact.c), on the progress thread: start
 * and step return 1 when o is done (o->st says how). */
int zo_mpi_exact_start(mpi_op *o, const mpi_engine *e);
int zo_mpi_exact_step(mpi_op *o, const mpi_engine *e);

#endif
