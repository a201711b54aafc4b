/* The mpi backend: host-addressable buffers over OpenMPI. OpenMPI 4.1 makes
 * no progress on its own, so one progress thread per process makes every MPI
 * call (it initializes and finalizes MPI too): stream functions hand it their
 * collective and wait; it starts the non-blocking call, tests it until done,
 * keeps a heartbeat with every rank, and fails a collective that outlives the
 * timeout, naming the ranks whose heartbeat stopped (the watchdog).
 * Exact reductions are a chain of point-to-point messages (comm_mpi_exact.c),
 * on a communicator of their own so that they never match the caller's
 * send/recv. */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_mpi.h"

static mpi_engine engine = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .work_cv = PTHREAD_COND_INITIALIZER,
    .done_cv = PTHREAD_COND_INITIALIZER,
};

/* ---- MPI types and errors ---- */

static void sum_bf16(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    zo_comm_add(inout, inout, in, (size_t)*len, ZO_DTYPE_BF16);
}

static void sum_f16(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    zo_comm_add(inout, inout, in, (size_t)*len, ZO_DTYPE_F16);
}

MPI_Datatype zo_mpi_type(zo_dtype dt)
{
    switch (dt) {
    case ZO_DTYPE_F32: return MPI_FLOAT;
    case ZO_DTYPE_F64: return MPI_DOUBLE;
    default: /* 16-bit floats reduce through their own ops; others only move */
        return zo_dtype_size(dt) == 2 ? MPI_UINT16_T : MPI_BYTE;
    }
}

/* Elements of dt as MPI counts them (bytes for types without an MPI twin). */
size_t zo_mpi_count(zo_dtype dt, size_t count)
{
    return zo_mpi_type(dt) == MPI_BYTE ? count * zo_dtype_size(dt) : count;
}

static MPI_Op sum_op(zo_dtype dt)
{
    return dt == ZO_DTYPE_BF16 ? engine.op_bf16 : dt == ZO_DTYPE_F16 ? engine.op_f16 : MPI_SUM;
}

zo_status zo_mpi_fail(mpi_op *o, int rc, const char *what)
{
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, text, &len);
    o->st = ZO_ERR_MPI;
    snprintf(o->msg, sizeof o->msg, "%s failed: %s", what, text);
    return ZO_ERR_MPI;
}

/* ---- the progress thread's start of each operation ---- */

static void *inplace_or(const void *send, const void *recv)
{
    return send == recv ? MPI_IN_PLACE : (void *)send;
}

static int start_reduce_scatter(mpi_op *o, const zo_coll *op, mpi_comm *mc, int n)
{
    size_t bytes = op->count * zo_dtype_size(op->dt);
    const char *s = op->send;
    char *r = op->recv;
    /* recv inside send (its own block): MPI's in-place form means something
     * else, so the result lands in scratch first. */
    if (r + bytes > s && r < s + bytes * (size_t)n) {
        o->scratch = malloc(bytes ? bytes : 1);
        if (!o->scratch)
            return MPI_ERR_NO_MEM;
        r = o->scratch;
    }
    return MPI_Ireduce_scatter_block(s, r, (int)op->count, zo_mpi_type(op->dt), sum_op(op->dt),
                                     mc->comm, &o->req);
}

static int start_native(mpi_op *o)
{
    const zo_coll *op = &o->coll;
    mpi_comm *mc = o->mc;
    int n = o->c->size;
    MPI_Datatype t = zo_mpi_type(op->dt);
    int cnt = (int)zo_mpi_count(op->dt, op->count);
    switch (op->kind) {
    case ZO_COLL_ALL_REDUCE:
        return MPI_Iallreduce(inplace_or(op->send, op->recv), op->recv, cnt, t, sum_op(op->dt),
                              mc->comm, &o->req);
    case ZO_COLL_REDUCE_SCATTER: return start_reduce_scatter(o, op, mc, n);
    case ZO_COLL_ALL_GATHER: {
        size_t bytes = op->count * zo_dtype_size(op->dt);
        const void *own = (const char *)op->recv + bytes * (size_t)o->c->rank;
        return MPI_Iallgather(op->send == own ? MPI_IN_PLACE : op->send, cnt, t, op->recv, cnt, t,
                              mc->comm, &o->req);
    }
    case ZO_COLL_BROADCAST: return MPI_Ibcast(op->recv, cnt, t, op->peer, mc->comm, &o->req);
    case ZO_COLL_SEND: return MPI_Isend(op->send, cnt, t, op->peer, 0, mc->comm, &o->req);
    case ZO_COLL_RECV: return MPI_Irecv(op->recv, cnt, t, op->peer, 0, mc->comm, &o->req);
    case ZO_COLL_BARRIER: return MPI_Ibarrier(mc->comm, &o->req);
    case ZO_COLL_REDUCE: {
        int root = o->c->rank == op->peer;
        return MPI_Ireduce(root ? inplace_or(op->send, op->recv) : op->send, op->recv, cnt, t,
                           sum_op(op->dt), op->peer, mc->comm, &o->req);
    }
    }
    return MPI_ERR_OTHER;
}

static void finish_native(mpi_op *o)
{
    if (o->scratch) {
        memcpy(o->coll.recv, o->scratch, o->coll.count * zo_dtype_size(o->coll.dt));
        free(o->scratch);
        o->scratch = NULL;
    }
}

static int is_exact(const mpi_op *o)
{
    return o->type == OP_COLL && o->coll.mode == ZO_REDUCE_EXACT &&
           (o->coll.kind == ZO_COLL_ALL_REDUCE || o->coll.kind == ZO_COLL_REDUCE_SCATTER ||
            o->coll.kind == ZO_COLL_REDUCE);
}

static zo_status do_split(mpi_op *o)
{
    mpi_comm *mc = calloc(1, sizeof *mc);
    if (!mc)
        return o->st = ZO_ERR_NO_MEMORY;
    int rc =
        MPI_Comm_split(o->mc->comm, o->color < 0 ? MPI_UNDEFINED : o->color, o->key, &mc->comm);
    if (rc == MPI_SUCCESS && mc->comm == MPI_COMM_NULL) {
        free(mc);
        return ZO_OK;
    }
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_dup(mc->comm, &mc->chain);
    if (rc != MPI_SUCCESS) {
        free(mc);
        return zo_mpi_fail(o, rc, "MPI_Comm_split");
    }
    MPI_Comm_set_errhandler(mc->comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(mc->chain, MPI_ERRORS_RETURN);
    MPI_Comm_rank(mc->comm, &o->out_rank);
    MPI_Comm_size(mc->comm, &o->out_size);
    o->out_world = malloc(sizeof(int) * (size_t)o->out_size);
    int mine = engine.world_rank;
    if (!o->out_world ||
        MPI_Allgather(&mine, 1, MPI_INT, o->out_world, 1, MPI_INT, mc->comm) != MPI_SUCCESS) {
        free(o->out_world);
        o->out_world = NULL;
        MPI_Comm_free(&mc->chain);
        MPI_Comm_free(&mc->comm);
        free(mc);
        return o->st = ZO_ERR_MPI;
    }
    o->out_mc = mc;
    return ZO_OK;
}

static void free_mpi_comm(mpi_comm *mc)
{
    if (mc->comm != MPI_COMM_WORLD && mc->comm != MPI_COMM_NULL)
        MPI_Comm_free(&mc->comm);
    if (mc->chain != MPI_COMM_NULL)
        MPI_Comm_free(&mc->chain);
    free(mc);
}

/* Starts o; returns 1 when it completed at once. */
static int start_op(mpi_op *o)
{
    o->start_ns = zo_now_ns();
    int collective =
        o->type == OP_HOST_ALL_GATHER || o->type == OP_SPLIT ||
        (o->type == OP_COLL && o->coll.kind != ZO_COLL_SEND && o->coll.kind != ZO_COLL_RECV);
    if (collective)
        o->coll_index = o->mc->colls++;
    int rc;
    switch (o->type) {
    case OP_COLL:
        if (is_exact(o)) {
            /* Only collectives count: point-to-point calls differ per rank. */
            o->seq = o->mc->seq++;
            return zo_mpi_exact_start(o, &engine);
        }
        rc = start_native(o);
        if (rc != MPI_SUCCESS)
            return zo_mpi_fail(o, rc, zo_coll_name(o->coll.kind)), 1;
        return 0;
    case OP_HOST_ALL_GATHER:
        rc = MPI_Iallgather(o->coll.send, (int)o->coll.count, MPI_BYTE, o->coll.recv,
                            (int)o->coll.count, MPI_BYTE, o->mc->comm, &o->req);
        if (rc != MPI_SUCCESS)
            return zo_mpi_fail(o, rc, "all-gather (host)"), 1;
        return 0;
    case OP_SPLIT: do_split(o); return 1;
    case OP_NATIVE:
        o->st = o->fn(&o->mc->comm, o->arg);
        if (o->st < 0)
            snprintf(o->msg, sizeof o->msg, "%s", zo_last_error());
        return 1;
    case OP_FREE: free_mpi_comm(o->mc); return 1;
    }
    return 1;
}

/* Advances a started o; returns 1 when it is done. */
static int step_op(mpi_op *o)
{
    if (is_exact(o))
        return zo_mpi_exact_step(o, &engine);
    int done = 0;
    int rc = MPI_Test(&o->req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
        return zo_mpi_fail(o, rc, zo_coll_name(o->coll.kind)), 1;
    if (done)
        finish_native(o);
    return done;
}

/* ---- heartbeat and watchdog ---- */

static int hb_start(void)
{
    int n = engine.world_size;
    engine.hb_seen = calloc((size_t)n, sizeof(uint64_t));
    engine.hb_colls = calloc((size_t)n, sizeof(uint64_t));
    engine.hb_out = calloc((size_t)n, sizeof(uint64_t));
    engine.hb_send = calloc((size_t)n, sizeof(MPI_Request));
    if (!engine.hb_seen || !engine.hb_colls || !engine.hb_out || !engine.hb_send)
        return MPI_ERR_NO_MEM;
    uint64_t now = zo_now_ns();
    for (int r = 0; r < n; r++) {
        engine.hb_seen[r] = now;
        engine.hb_send[r] = MPI_REQUEST_NULL;
    }
    engine.hb_last_sent = 0;
    engine.hb_recv = MPI_REQUEST_NULL;
    return n > 1 ? MPI_Irecv(&engine.hb_in, 1, MPI_UINT64_T, MPI_ANY_SOURCE, 0, engine.hb_comm,
                             &engine.hb_recv)
                 : MPI_SUCCESS;
}

static void hb_tick(uint64_t now)
{
    if (engine.world_size == 1)
        return;
    int got = 1;
    MPI_Status stat;
    while (got && engine.hb_recv != MPI_REQUEST_NULL) {
        got = 0;
        if (MPI_Test(&engine.hb_recv, &got, &stat) != MPI_SUCCESS || !got)
            break;
        engine.hb_seen[stat.MPI_SOURCE] = now;
        engine.hb_colls[stat.MPI_SOURCE] = engine.hb_in;
        MPI_Irecv(&engine.hb_in, 1, MPI_UINT64_T, MPI_ANY_SOURCE, 0, engine.hb_comm,
                  &engine.hb_recv);
    }
    if (now - engine.hb_last_sent < engine.hb_interval_ns)
        return;
    engine.hb_last_sent = now;
    for (int r = 0; r < engine.world_size; r++) {
        if (r == engine.world_rank)
            continue;
        int done = 1;
        if (engine.hb_send[r] != MPI_REQUEST_NULL)
            MPI_Test(&engine.hb_send[r], &done, MPI_STATUS_IGNORE);
        if (!done) /* never more than one heartbeat queued to a silent rank */
            continue;
        engine.hb_out[r] = engine.world->colls;
        MPI_Isend(&engine.hb_out[r], 1, MPI_UINT64_T, r, 0, engine.hb_comm, &engine.hb_send[r]);
    }
}

/* The ranks of o's group whose heartbeat stopped, as world ranks; *age is
 * the longest silence in seconds. */
static int silent_ranks(const mpi_op *o, uint64_t now, char *buf, size_t cap, double *age)
{
    /* half the timeout (at most 30 s): a loaded machine may starve a live rank that long */
    uint64_t limit = engine.lost_ns;
    size_t len = 0;
    int found = 0;
    buf[0] = 0;
    *age = 0;
    for (int i = 0; i < o->c->size && len + 16 < cap; i++) {
        int w = o->c->world_ranks[i];
        double a = (double)(now - engine.hb_seen[w]) * 1e-9;
        if (w != engine.world_rank && now - engine.hb_seen[w] > limit) {
            len += (size_t)snprintf(buf + len, cap - len, "%s%d", found ? ", " : "", w);
            found++;
            *age = a > *age ? a : *age;
        }
    }
    return found;
}

/* The world's ranks that, by their heartbeat, have not started world
 * collective o yet: hung, or issuing collectives in another order. */
static int late_ranks(const mpi_op *o, char *buf, size_t cap)
{
    size_t len = 0;
    int found = 0;
    buf[0] = 0;
    if (o->mc != engine.world)
        return 0;
    for (int w = 0; w < engine.world_size && len + 16 < cap; w++)
        if (w != engine.world_rank && engine.hb_colls[w] <= o->coll_index) {
            len += (size_t)snprintf(buf + len, cap - len, "%s%d", found ? ", " : "", w);
            found++;
        }
    return found;
}

static void fail_engine(const char *msg)
{
    pthread_mutex_lock(&engine.mu);
    if (!engine.failed) {
        engine.failed = 1;
        snprintf(engine.fail_msg, sizeof engine.fail_msg, "%s", msg);
    }
    pthread_mutex_unlock(&engine.mu);
}

/* Fails o when it outlived the timeout, or as soon as a rank of its group
 * has been silent for lost_ns (dead or stopped: waiting out a long timeout
 * for it would only delay the error); the engine is failed with it, since
 * MPI cannot cancel a collective. Returns 1 when it did. */
static int watchdog(mpi_op *o, uint64_t now)
{
    double age = (double)(now - o->start_ns) * 1e-9;
    if (o->type != OP_COLL && o->type != OP_HOST_ALL_GATHER)
        return 0;
    char ranks[256], msg[ZO_COMM_MSG_CAP];
    const char *what = o->type == OP_COLL ? zo_coll_name(o->coll.kind) : "configuration check";
    double silent;
    int lost = silent_ranks(o, now, ranks, sizeof ranks, &silent);
    if (age < o->c->timeout_s && !lost)
        return 0;
    if (lost && age < o->c->timeout_s)
        snprintf(msg, sizeof msg,
                 "rank %d: %s failed after %.1f s: lost rank(s) %s (no heartbeat for %.1f s: "
                 "dead, stopped or cut off)",
                 engine.world_rank, what, age, ranks, silent);
    else if (lost)
        snprintf(msg, sizeof msg,
                 "rank %d: %s did not complete within %.1f s: lost rank(s) %s (no heartbeat "
                 "for %.1f s)",
                 engine.world_rank, what, o->c->timeout_s, ranks, silent);
    else if (late_ranks(o, ranks, sizeof ranks))
        snprintf(msg, sizeof msg,
                 "rank %d: %s did not complete within %.1f s: rank(s) %s answer but have not "
                 "entered it (hung, or issuing collectives in another order)",
                 engine.world_rank, what, o->c->timeout_s, ranks);
    else
        snprintf(msg, sizeof msg,
                 "rank %d: %s did not complete within %.1f s, yet every rank answers: a rank "
                 "is hung, or the ranks issued their collectives in different orders",
                 engine.world_rank, what, o->c->timeout_s);
    o->st = ZO_ERR_MPI;
    snprintf(o->msg, sizeof o->msg, "%s", msg);
    fail_engine(msg);
    return 1;
}

/* ---- the progress thread ---- */

static void complete(mpi_op *o)
{
    pthread_mutex_lock(&engine.mu);
    o->done = 1;
    pthread_cond_broadcast(&engine.done_cv);
    pthread_mutex_unlock(&engine.mu);
}

static int init_mpi(void)
{
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    int rc = MPI_SUCCESS;
    if (!inited) {
        rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        engine.we_initialized = rc == MPI_SUCCESS;
    } else {
        MPI_Query_thread(&provided);
        if (provided < MPI_THREAD_SERIALIZED) {
            snprintf(engine.fail_msg, sizeof engine.fail_msg,
                     "MPI was initialized by the program with thread level %d; zoffload's "
                     "progress thread needs MPI_THREAD_SERIALIZED or MULTIPLE (or leave MPI_Init "
                     "to zoffload)",
                     provided);
            return MPI_ERR_OTHER;
        }
    }
    if (rc != MPI_SUCCESS)
        return rc;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &engine.world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &engine.world_size);
    void *ub;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    engine.tag_ub = flag ? *(int *)ub : 32767;
    MPI_Op_create(sum_bf16, 1, &engine.op_bf16);
    MPI_Op_create(sum_f16, 1, &engine.op_f16);
    engine.world = calloc(1, sizeof *engine.world);
    if (!engine.world)
        return MPI_ERR_NO_MEM;
    engine.world->comm = MPI_COMM_WORLD;
    rc = MPI_Comm_dup(MPI_COMM_WORLD, &engine.world->chain);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_dup(MPI_COMM_WORLD, &engine.hb_comm);
    if (rc != MPI_SUCCESS)
        return rc;
    MPI_Comm_set_errhandler(engine.world->chain, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(engine.hb_comm, MPI_ERRORS_RETURN);
    return hb_start();
}

/* Stops the heartbeat with every rank and finalizes MPI, unless a rank was
 * lost: requests to it never complete, and MPI_Finalize would wait on them. */
static void shutdown_mpi(void)
{
    int ok = !engine.failed && engine.world_size > 0;
    uint64_t deadline = zo_now_ns() + (uint64_t)(engine.timeout_s * 1e9);
    MPI_Request bar = MPI_REQUEST_NULL;
    if (ok && MPI_Ibarrier(engine.hb_comm, &bar) != MPI_SUCCESS)
        ok = 0;
    for (int done = 0; ok && !done;) {
        MPI_Test(&bar, &done, MPI_STATUS_IGNORE);
        uint64_t now = zo_now_ns();
        engine.hb_last_sent = now; /* keep answering, stop sending */
        hb_tick(now);
        if (!done && now > deadline)
            ok = 0;
    }
    for (int r = 0; ok && r < engine.world_size; r++)
        if (engine.hb_send[r] != MPI_REQUEST_NULL)
            MPI_Wait(&engine.hb_send[r], MPI_STATUS_IGNORE);
    if (ok && engine.hb_recv != MPI_REQUEST_NULL) {
        MPI_Cancel(&engine.hb_recv);
        MPI_Wait(&engine.hb_recv, MPI_STATUS_IGNORE);
    }
    if (!ok) {
        ZO_LOGW("comm", "rank %d leaves MPI without finalizing it: %s", engine.world_rank,
                engine.failed ? engine.fail_msg : "the other ranks did not reach shutdown");
        return;
    }
    MPI_Comm_free(&engine.hb_comm);
    free(engine.hb_seen);
    free(engine.hb_colls);
    free(engine.hb_out);
    free(engine.hb_send);
    free_mpi_comm(engine.world);
    engine.world = NULL;
    MPI_Op_free(&engine.op_bf16);
    MPI_Op_free(&engine.op_f16);
    if (engine.we_initialized)
        MPI_Finalize();
}

/* Takes the submitted operations in order; waits when there is nothing to
 * do but keep the heartbeat. Returns 0 when asked to stop. */
static int take_work(mpi_op **active_tail)
{
    pthread_mutex_lock(&engine.mu);
    if (!engine.queue && !*active_tail && !engine.stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + engine.hb_interval_ns / 2;
        ts.tv_sec += (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        pthread_cond_timedwait(&engine.work_cv, &engine.mu, &ts);
    }
    int keep = !(engine.stop && !engine.queue && !*active_tail);
    pthread_mutex_unlock(&engine.mu);
    return keep;
}

static mpi_op *pop_queue(void)
{
    pthread_mutex_lock(&engine.mu);
    mpi_op *o = engine.queue;
    if (o) {
        engine.queue = o->next;
        if (!engine.queue)
            engine.queue_tail = NULL;
        o->next = NULL;
    }
    pthread_mutex_unlock(&engine.mu);
    return o;
}

static int engine_failed(char *msg, size_t cap)
{
    pthread_mutex_lock(&engine.mu);
    int f = engine.failed;
    if (f)
        snprintf(msg, cap, "%s", engine.fail_msg);
    pthread_mutex_unlock(&engine.mu);
    return f;
}

/* One pass over the active operations: start new ones in order, advance the
 * others, complete what finished. Returns the new list. */
static mpi_op *progress_pass(mpi_op *active, uint64_t now)
{
    mpi_op **link = &active;
    while (*link) {
        mpi_op *o = *link;
        int done;
        if (!o->start_ns) {
            char msg[ZO_COMM_MSG_CAP];
            if (o->type != OP_FREE && engine_failed(msg, sizeof msg)) {
                o->st = ZO_ERR_MPI;
                snprintf(o->msg, sizeof o->msg, "%s", msg);
                done = 1;
            } else {
                done = start_op(o);
            }
        } else {
            done = step_op(o) || watchdog(o, now);
        }
        if (done) {
            *link = o->next;
            complete(o);
        } else {
            link = &o->next;
        }
    }
    return active;
}

static void *progress_main(void *arg)
{
    int rc = init_mpi();
    pthread_mutex_lock(&engine.mu);
    engine.init_rc = rc;
    engine.init_done = 1;
    pthread_cond_broadcast(&engine.done_cv);
    pthread_mutex_unlock(&engine.mu);
    if (rc != MPI_SUCCESS)
        return NULL;
    mpi_op *active = NULL, *tail = NULL;
    while (take_work(&tail)) {
        for (mpi_op *o; (o = pop_queue());) {
            if (tail)
                tail->next = o;
            else
                active = o;
            tail = o;
        }
        uint64_t now = zo_now_ns();
        active = progress_pass(active, now);
        for (tail = active; tail && tail->next;)
            tail = tail->next;
        hb_tick(now);
        if (active)
            sched_yield(); /* ranks may share cores (mpirun --oversubscribe) */
    }
    shutdown_mpi();
    return NULL;
}

/* ---- the callers' side ---- */

zo_status zo_mpi_submit_wait(mpi_op *o)
{
    pthread_mutex_lock(&engine.mu);
    if (engine.queue_tail)
        engine.queue_tail->next = o;
    else
        engine.queue = o;
    engine.queue_tail = o;
    pthread_cond_signal(&engine.work_cv);
    while (!o->done)
        pthread_cond_wait(&engine.done_cv, &engine.mu);
    pthread_mutex_unlock(&engine.mu);
    if (o->st < 0)
        return ZO_FAIL(o->st, "comm", "%s", o->msg[0] ? o->msg : zo_status_str(o->st));
    return ZO_OK;
}

static zo_status engine_acquire(double timeout_s)
{
    pthread_mutex_lock(&engine.mu);
    if (engine.finalized) {
        pthread_mutex_unlock(&engine.mu);
        return ZO_FAIL(ZO_ERR_STATE, "comm",
                       "MPI was finalized when the last mpi communicator was freed; MPI cannot "
                       "start twice in one process");
    }
    if (engine.refs++ == 0) {
        engine.timeout_s = timeout_s;
        uint64_t iv = (uint64_t)(timeout_s * 1e9 / 8);
        engine.hb_interval_ns = iv < 5000000u ? 5000000u : iv > 1000000000u ? 1000000000u : iv;
        uint64_t half = (uint64_t)(timeout_s * 1e9 / 2);
        engine.lost_ns = half > 30000000000u ? 30000000000u : half;
        if (engine.lost_ns < 4 * engine.hb_interval_ns)
            engine.lost_ns = 4 * engine.hb_interval_ns;
        if (pthread_create(&engine.thread, NULL, progress_main, NULL)) {
            engine.refs = 0;
            pthread_mutex_unlock(&engine.mu);
            return ZO_FAIL(ZO_ERR_SYSTEM, "comm", "cannot start the MPI progress thread");
        }
    }
    while (!engine.init_done)
        pthread_cond_wait(&engine.done_cv, &engine.mu);
    int rc = engine.init_rc;
    pthread_mutex_unlock(&engine.mu);
    if (rc == MPI_SUCCESS)
        return ZO_OK;
    mpi_op o = {0};
    zo_mpi_fail(&o, rc, "MPI initialization");
    return ZO_FAIL(ZO_ERR_MPI, "comm", "%s", engine.fail_msg[0] ? engine.fail_msg : o.msg);
}

static void engine_release(void)
{
    pthread_mutex_lock(&engine.mu);
    int last = --engine.refs == 0;
    if (last) {
        engine.stop = 1;
        engine.finalized = 1;
        pthread_cond_signal(&engine.work_cv);
    }
    pthread_mutex_unlock(&engine.mu);
    if (last)
        pthread_join(engine.thread, NULL);
}

static zo_status mpi_init(zo_comm_t c, const zo_rank_info *ri)
{
    ZO_TRY(engine_acquire(c->timeout_s));
    c->rank = engine.world_rank;
    c->size = engine.world_size;
    c->impl = engine.world;
    if (strcmp(ri->launcher, "none") && (ri->rank != c->rank || ri->world_size != c->size))
        return ZO_FAIL(ZO_ERR_CONFIG, "comm",
                       "the %s says rank %d of %d, but MPI says rank %d of %d: launch with "
                       "mpirun or srun, or leave rank and world_size unset",
                       ri->launcher, ri->rank, ri->world_size, c->rank, c->size);
    return ZO_OK;
}

static zo_status mpi_split(zo_comm_t c, int color, int key, zo_comm_t child)
{
    mpi_op o = {.type = OP_SPLIT, .c = c, .mc = c->impl, .color = color, .key = key};
    ZO_TRY(zo_mpi_submit_wait(&o));
    if (color < 0)
        return ZO_OK;
    pthread_mutex_lock(&engine.mu);
    engine.refs++;
    pthread_mutex_unlock(&engine.mu);
    child->impl = o.out_mc;
    child->rank = o.out_rank;
    child->size = o.out_size;
    child->world_ranks = o.out_world;
    return ZO_OK;
}

static void mpi_fini(zo_comm_t c)
{
    if (!c->impl)
        return;
    if (c->impl != engine.world) {
        mpi_op o = {.type = OP_FREE, .c = c, .mc = c->impl};
        zo_mpi_submit_wait(&o);
    }
    c->impl = NULL;
    engine_release();
}

typedef struct mpi_task {
    zo_comm_t c;
    zo_coll op;
} mpi_task;

static zo_status run_task(void *arg)
{
    mpi_task *t = arg;
    mpi_op o = {.type = OP_COLL, .c = t->c, .mc = t->c->impl, .coll = t->op};
    return zo_mpi_submit_wait(&o);
}

static zo_status mpi_enqueue(zo_comm_t c, zo_stream_t s, const zo_coll *op)
{
    if (zo_mpi_count(op->dt, op->count) > 0x7fffffff)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "comm",
                       "%s of %zu elements: the mpi backend takes at most 2^31-1 per call; split "
                       "it",
                       zo_coll_name(op->kind), op->count);
    mpi_task t = {c, *op};
    return zo_stream_enqueue(s, run_task, &t, sizeof t);
}

static zo_status mpi_host_all_gather(zo_comm_t c, const void *mine, void *all, size_t bytes)
{
    if (bytes > 0x7fffffff)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "comm", "host all-gather of %zu bytes is too large",
                       bytes);
    mpi_op o = {.type = OP_HOST_ALL_GATHER, .c = c, .mc = c->impl};
    o.coll = (zo_coll){ZO_COLL_ALL_GATHER, ZO_REDUCE_FAST, mine, all, bytes, ZO_DTYPE_U8, 0};
    return zo_mpi_submit_wait(&o);
}

static zo_status mpi_run_native(zo_comm_t c, zo_comm_native_fn fn, void *arg)
{
    mpi_op o = {.type = OP_NATIVE, .c = c, .mc = c->impl, .fn = fn, .arg = arg};
    return zo_mpi_submit_wait(&o);
}

const zo_comm_ops zo_comm_mpi_backend = {
    .name = "mpi",
    .version = ZO_COMM_OPS_VERSION,
    .caps = ZO_COMM_CAP_HOST_BUFFERS,
    .init = mpi_init,
    .split = mpi_split,
    .fini = mpi_fini,
    .enqueue = mpi_enqueue,
    .host_all_gather = mpi_host_all_gather,
    .run_native = mpi_run_native,
};
