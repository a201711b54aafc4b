/* The nccl backend: CUDA device buffers over NCCL, each collective on the
 * zo stream's cudaStream_t. The communicator is made non-blocking
 * (ncclConfig.blocking = 0) so no NCCL call can hang the caller: every call
 * that answers ncclInProgress is polled with ncclCommGetAsyncError until the
 * timeout, and a watchdog thread aborts the communicator (ncclCommAbort) when
 * an asynchronous error appears or a collective's completion event is older
 * than the timeout, which releases the kernels waiting on a lost rank. The
 * unique id travels through MPI when the job was started by mpirun, else
 * over the TCP rendezvous (zo_launch_rendezvous: under torchrun, through
 * torchrun's own store on MASTER_PORT).
 *
 * Exact reductions are the chain of comm_mpi_exact.c in stream order:
 * ncclRecv the partial sum from rank r-1, zo_op_add this rank's values,
 * ncclSend it to r+1, segment by segment; the last rank broadcasts the result
 * (all-reduce) or sends each block to its owner (reduce-scatter). They are
 * not pipelined across segments yet, and only checked on one GPU: two ranks
 * need two GPUs. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm_impl.h"
#include "zo/ops.h"

enum { PENDING_CAP = 64 };

typedef struct nccl_pending {
    cudaEvent_t ev;
    uint64_t t_ns;
    zo_coll_kind kind;
} nccl_pending;

typedef struct nccl_comm {
    ncclComm_t comm;
    int ordinal;
    void *scratch; /* barrier's word, host all-gather's staging */
    size_t scratch_bytes;
    zo_comm_t boot; /* the mpi communicator that carried the unique id, if any */
    void *tmp;      /* the exact chain's partial sums: two segments */
    size_t tmp_bytes;
    pthread_t watchdog;
    pthread_mutex_t mu; /* guards the fields below */
    pthread_cond_t cv;
    int stop, aborted;
    char why[512];
    nccl_pending pending[PENDING_CAP];
    int head, tail;
} nccl_comm;

static zo_status nccl_fail(ncclResult_t r, const char *what)
{
    return ZO_FAIL(ZO_ERR_NCCL, "comm", "%s: %s", what, ncclGetErrorString(r));
}

static void abort_comm(nccl_comm *nc, const char *why);

/* Polls a non-blocking communicator until its last call finished; aborts it
 * (once, under the mutex the watchdog holds) after the timeout. */
static ncclResult_t wait_ready(zo_comm_t c, const char *what)
{
    nccl_comm *nc = c->impl;
    uint64_t deadline = zo_now_ns() + (uint64_t)(c->timeout_s * 1e9);
    ncclResult_t r;
    while (ncclCommGetAsyncError(nc->comm, &r) == ncclSuccess && r == ncclInProgress) {
        if (zo_now_ns() > deadline) {
            char why[512];
            snprintf(why, sizeof why,
                     "rank %d: %s did not finish within %.1f s: a rank was lost or hung (NCCL "
                     "does not say which); communicator aborted",
                     c->world_ranks ? c->world_ranks[c->rank] : c->rank, what, c->timeout_s);
            pthread_mutex_lock(&nc->mu);
            if (!nc->aborted)
                abort_comm(nc, why);
            pthread_mutex_unlock(&nc->mu);
            return ncclSystemError;
        }
        usleep(100);
    }
    return r;
}

static zo_status aborted(zo_comm_t c)
{
    nccl_comm *nc = c->impl;
    pthread_mutex_lock(&nc->mu);
    int a = nc->aborted;
    char why[512];
    snprintf(why, sizeof why, "%s", nc->why);
    pthread_mutex_unlock(&nc->mu);
    return a ? ZO_FAIL(ZO_ERR_NCCL, "comm", "%s", why) : ZO_OK;
}

static zo_status check_call(zo_comm_t c, ncclResult_t r, const char *what)
{
    if (r == ncclInProgress)
        r = wait_ready(c, what);
    if (r == ncclSuccess)
        return ZO_OK;
    ZO_TRY(aborted(c));
    return nccl_fail(r, what);
}

/* ---- the watchdog ---- */

static void abort_comm(nccl_comm *nc, const char *why)
{
    nc->aborted = 1;
    snprintf(nc->why, sizeof nc->why, "%s", why);
    ZO_LOGE("comm", "%s", why);
    ncclCommAbort(nc->comm);
}

static void *watchdog_main(void *arg)
{
    zo_comm_t c = arg;
    nccl_comm *nc = c->impl;
    cudaSetDevice(nc->ordinal);
    pthread_mutex_lock(&nc->mu);
    while (!nc->stop && !nc->aborted) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&nc->cv, &nc->mu, &ts);
        if (nc->stop || nc->aborted) /* an aborted communicator is gone */
            break;
        ncclResult_t r = ncclSuccess;
        ncclCommGetAsyncError(nc->comm, &r);
        if (r != ncclSuccess && r != ncclInProgress) {
            char why[512];
            snprintf(why, sizeof why, "rank %d: NCCL reported %s; communicator aborted",
                     c->world_ranks ? c->world_ranks[c->rank] : c->rank, ncclGetErrorString(r));
            abort_comm(nc, why);
            break;
        }
        while (nc->head != nc->tail) {
            nccl_pending *p = &nc->pending[nc->head];
            if (cudaEventQuery(p->ev) != cudaErrorNotReady) {
                cudaEventDestroy(p->ev);
                nc->head = (nc->head + 1) % PENDING_CAP;
                continue;
            }
            if ((double)(zo_now_ns() - p->t_ns) * 1e-9 > c->timeout_s) {
                char why[512];
                snprintf(why, sizeof why,
                         "rank %d: %s did not complete within %.1f s: a rank was lost or hung "
                         "(NCCL does not say which); communicator aborted",
                         c->world_ranks ? c->world_ranks[c->rank] : c->rank, zo_coll_name(p->kind),
                         c->timeout_s);
                abort_comm(nc, why);
            }
            break;
        }
    }
    pthread_mutex_unlock(&nc->mu);
    return NULL;
}

/* Records op's completion for the watchdog. */
static void track(zo_comm_t c, cudaStream_t st, zo_coll_kind kind)
{
    nccl_comm *nc = c->impl;
    pthread_mutex_lock(&nc->mu);
    int next = (nc->tail + 1) % PENDING_CAP;
    nccl_pending *p = &nc->pending[nc->tail];
    if (next != nc->head &&
        cudaEventCreateWithFlags(&p->ev, cudaEventDisableTiming) == cudaSuccess) {
        cudaEventRecord(p->ev, st);
        p->t_ns = zo_now_ns();
        p->kind = kind;
        nc->tail = next;
    }
    pthread_mutex_unlock(&nc->mu);
}

/* ---- setup ---- */

static zo_status get_unique_id(zo_comm_t c, const zo_rank_info *ri, nccl_comm *nc, ncclUniqueId *id)
{
    ncclUniqueId mine;
    memset(&mine, 0, sizeof mine);
    if (ri->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&mine);
        if (r != ncclSuccess)
            return nccl_fail(r, "ncclGetUniqueId");
    }
    ncclUniqueId *all = malloc(sizeof(ncclUniqueId) * (size_t)ri->world_size);
    if (!all)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "comm", "out of memory");
    zo_status st;
#ifdef ZO_HAVE_MPI
    if (!strcmp(ri->launcher, "mpirun")) {
        zo_comm_config bc = ZO_COMM_CONFIG_INIT;
        bc.backend = "mpi";
        bc.device = c->dev;
        bc.timeout_s = c->timeout_s;
        st = zo_comm_init(&nc->boot, &bc);
        if (st == ZO_OK)
            st = nc->boot->be->host_all_gather(nc->boot, &mine, all, sizeof mine);
    } else
#endif
        st = zo_launch_rendezvous(ri, &mine, all, sizeof mine, c->timeout_s);
    if (st == ZO_OK)
        *id = all[0];
    free(all);
    return st;
}

static zo_status start_comm(zo_comm_t c, nccl_comm *nc)
{
    nc->scratch_bytes = 256;
    if (cudaMalloc(&nc->scratch, nc->scratch_bytes) != cudaSuccess)
        return ZO_FAIL(ZO_ERR_CUDA, "comm", "nccl: cannot allocate %zu bytes of scratch",
                       nc->scratch_bytes);
    if (pthread_create(&nc->watchdog, NULL, watchdog_main, c))
        return ZO_FAIL(ZO_ERR_SYSTEM, "comm", "nccl: cannot start the watchdog thread");
    return ZO_OK;
}

static nccl_comm *new_nccl_comm(int ordinal)
{
    nccl_comm *nc = calloc(1, sizeof *nc);
    if (nc) {
        nc->ordinal = ordinal;
        pthread_mutex_init(&nc->mu, NULL);
        pthread_cond_init(&nc->cv, NULL);
    }
    return nc;
}

static zo_status nccl_init(zo_comm_t c, const zo_rank_info *ri)
{
    zo_device_info info = ZO_DEVICE_INFO_INIT;
    ZO_TRY(zo_device_get_info(c->dev, &info));
    if (strcmp(info.backend, "cuda"))
        return ZO_FAIL(
            ZO_ERR_CONFIG, "comm",
            "the nccl backend needs a cuda device, not '%s' (use tcp or mpi on the cpu device)",
            info.backend);
    nccl_comm *nc = new_nccl_comm(info.ordinal);
    if (!nc)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "comm", "out of memory");
    cudaSetDevice(nc->ordinal);
    ncclUniqueId id;
    zo_status st = get_unique_id(c, ri, nc, &id);
    if (st < 0) {
        zo_comm_free(nc->boot);
        free(nc);
        return st;
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    c->impl = nc;
    c->rank = ri->rank;
    c->size = ri->world_size;
    st = check_call(c, ncclCommInitRankConfig(&nc->comm, ri->world_size, id, ri->rank, &config),
                    "ncclCommInitRankConfig");
    if (st == ZO_OK)
        st = start_comm(c, nc);
    return st;
}

static void nccl_fini(zo_comm_t c)
{
    nccl_comm *nc = c->impl;
    if (!nc)
        return;
    if (nc->scratch) {
        pthread_mutex_lock(&nc->mu);
        nc->stop = 1;
        pthread_cond_signal(&nc->cv);
        pthread_mutex_unlock(&nc->mu);
        pthread_join(nc->watchdog, NULL);
        cudaFree(nc->scratch);
        while (nc->head != nc->tail) {
            cudaEventDestroy(nc->pending[nc->head].ev);
            nc->head = (nc->head + 1) % PENDING_CAP;
        }
    }
    if (nc->comm && !nc->aborted) {
        ncclCommFinalize(nc->comm);
        if (wait_ready(c, "ncclCommFinalize") == ncclSuccess)
            ncclCommDestroy(nc->comm);
    }
    if (nc->tmp)
        zo_device_mfree(c->dev, nc->tmp);
    zo_comm_free(nc->boot);
    free(nc);
    c->impl = NULL;
}

static zo_status nccl_host_all_gather(zo_comm_t c, const void *mine, void *all, size_t bytes);

static zo_status nccl_split(zo_comm_t c, int color, int key, zo_comm_t child)
{
    nccl_comm *parent = c->impl, *nc = new_nccl_comm(parent->ordinal);
    if (!nc)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "comm", "out of memory");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    zo_status st = check_call(c,
                              ncclCommSplit(parent->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color,
                                            key, &nc->comm, &config),
                              "ncclCommSplit");
    if (st < 0 || color < 0) {
        free(nc);
        return st;
    }
    child->impl = nc;
    /* Non-blocking: the new communicator finishes its own setup. */
    st = check_call(child, ncclInProgress, "ncclCommSplit (the new communicator)");
    if (st < 0) {
        free(nc);
        child->impl = NULL;
        return st;
    }
    ncclCommUserRank(nc->comm, &child->rank);
    ncclCommCount(nc->comm, &child->size);
    st = start_comm(child, nc);
    child->world_ranks = st == ZO_OK ? malloc(sizeof(int) * (size_t)child->size) : NULL;
    int mine = c->world_ranks[c->rank];
    if (st == ZO_OK && !child->world_ranks)
        st = ZO_FAIL(ZO_ERR_NO_MEMORY, "comm", "out of memory");
    if (st == ZO_OK)
        st = nccl_host_all_gather(child, &mine, child->world_ranks, sizeof mine);
    if (st < 0)
        nccl_fini(child);
    return st;
}

/* ---- collectives ---- */

static ncclDataType_t nccl_type(zo_dtype dt, size_t *count)
{
    switch (dt) {
    case ZO_DTYPE_F32: return ncclFloat32;
    case ZO_DTYPE_F64: return ncclFloat64;
    case ZO_DTYPE_F16: return ncclFloat16;
    case ZO_DTYPE_BF16: return ncclBfloat16;
    default: *count *= zo_dtype_size(dt); return ncclUint8;
    }
}

static ncclResult_t call_nccl(zo_comm_t c, const zo_coll *op, cudaStream_t st)
{
    nccl_comm *nc = c->impl;
    size_t cnt = op->count;
    ncclDataType_t t = nccl_type(op->dt, &cnt);
    switch (op->kind) {
    case ZO_COLL_ALL_REDUCE:
        return ncclAllReduce(op->send, op->recv, cnt, t, ncclSum, nc->comm, st);
    case ZO_COLL_REDUCE_SCATTER:
        return ncclReduceScatter(op->send, op->recv, cnt, t, ncclSum, nc->comm, st);
    case ZO_COLL_ALL_GATHER: return ncclAllGather(op->send, op->recv, cnt, t, nc->comm, st);
    case ZO_COLL_BROADCAST:
        return ncclBroadcast(op->recv, op->recv, cnt, t, op->peer, nc->comm, st);
    case ZO_COLL_SEND: return ncclSend(op->send, cnt, t, op->peer, nc->comm, st);
    case ZO_COLL_RECV: return ncclRecv(op->recv, cnt, t, op->peer, nc->comm, st);
    case ZO_COLL_BARRIER:
        return ncclAllReduce(nc->scratch, nc->scratch, 1, ncclFloat32, ncclSum, nc->comm, st);
    case ZO_COLL_REDUCE:
        return ncclReduce(op->send, op->recv, cnt, t, ncclSum, op->peer, nc->comm, st);
    }
    return ncclInvalidArgument;
}

/* ---- exact reductions: the chain in stream order ---- */

typedef struct exact_ctx {
    zo_comm_t c;
    const zo_coll *op;
    cudaStream_t st;
    ncclDataType_t t;
    size_t esz, seg_elems;
} exact_ctx;

static zo_status chain_send(exact_ctx *x, const void *buf, size_t len, int peer)
{
    nccl_comm *nc = x->c->impl;
    return check_call(x->c, ncclSend(buf, len, x->t, peer, nc->comm, x->st), "exact: ncclSend");
}

static zo_status chain_recv(exact_ctx *x, void *buf, size_t len, int peer)
{
    nccl_comm *nc = x->c->impl;
    return check_call(x->c, ncclRecv(buf, len, x->t, peer, nc->comm, x->st), "exact: ncclRecv");
}

/* One segment of one block: [global, global + len) of the vector, at
 * in_shard within block `owner` (reduce-scatter) or of the result. */
static zo_status chain_segment(exact_ctx *x, zo_stream_t s, size_t global, size_t in_shard,
                               size_t len, int owner, void *tmp)
{
    int r = x->c->rank, root = x->c->size - 1;
    const char *mine = (const char *)x->op->send + global * x->esz;
    /* recv may be NULL on the ranks that keep nothing (reduce) */
    char *result = owner < 0 || owner == r
                       ? (char *)x->op->recv + (owner >= 0 ? in_shard : global) * x->esz
                       : NULL;
    if (r == 0)
        ZO_TRY(chain_send(x, mine, len, 1));
    if (r > 0)
        ZO_TRY(chain_recv(x, tmp, len, r - 1));
    if (r > 0 && r < root) {
        ZO_TRY(zo_op_add(s, tmp, tmp, mine, len, x->op->dt));
        ZO_TRY(chain_send(x, tmp, len, r + 1));
    }
    if (r == root && owner < 0)
        return zo_op_add(s, result, tmp, mine, len, x->op->dt);
    if (r == root) {
        ZO_TRY(zo_op_add(s, owner == root ? result : tmp, tmp, mine, len, x->op->dt));
        return owner == root ? ZO_OK : chain_send(x, tmp, len, owner);
    }
    return owner == r ? chain_recv(x, result, len, root) : ZO_OK;
}

static zo_status exact_scratch(zo_comm_t c, size_t bytes)
{
    nccl_comm *nc = c->impl;
    if (nc->tmp_bytes >= bytes)
        return ZO_OK;
    if (nc->tmp)
        zo_device_mfree(c->dev, nc->tmp);
    nc->tmp = NULL;
    nc->tmp_bytes = 0;
    ZO_TRY(zo_device_malloc(c->dev, bytes, &nc->tmp));
    nc->tmp_bytes = bytes;
    return ZO_OK;
}

static zo_status nccl_exact(zo_comm_t c, zo_stream_t s, const zo_coll *op)
{
    if (op->dt == ZO_DTYPE_F64)
        return ZO_FAIL(ZO_ERR_UNSUPPORTED, "comm",
                       "exact %s of fp64 on nccl: the chain adds fp32, bf16 or fp16",
                       zo_coll_name(op->kind));
    if (c->size == 1)
        return zo_comm_enqueue_copy(c, s, op->recv, op->send, zo_coll_recv_bytes(op, 1));
    size_t dummy = 0;
    exact_ctx x = {c, op, zo_stream_native(s), nccl_type(op->dt, &dummy), zo_dtype_size(op->dt), 0};
    x.seg_elems = c->segment_bytes / x.esz ? c->segment_bytes / x.esz : 1;
    /* The previous exact op on this communicator may still use the scratch. */
    if (((nccl_comm *)c->impl)->tmp_bytes < 2 * x.seg_elems * x.esz)
        ZO_TRY(zo_stream_synchronize(s));
    ZO_TRY(exact_scratch(c, 2 * x.seg_elems * x.esz));
    char *tmp = ((nccl_comm *)c->impl)->tmp;
    int rs = op->kind == ZO_COLL_REDUCE_SCATTER, nblocks = rs ? c->size : 1;
    int target = op->kind == ZO_COLL_REDUCE ? op->peer : -1;
    size_t k = 0;
    for (int b = 0; b < nblocks; b++)
        for (size_t off = 0; off < op->count; off += x.seg_elems, k++) {
            size_t len = op->count - off < x.seg_elems ? op->count - off : x.seg_elems;
            ZO_TRY(chain_segment(&x, s, (size_t)b * op->count + off, off, len, rs ? b : target,
                                 tmp + (k & 1) * x.seg_elems * x.esz));
        }
    if (!rs && target < 0) {
        nccl_comm *nc = c->impl;
        ZO_TRY(check_call(
            c, ncclBroadcast(op->recv, op->recv, op->count, x.t, c->size - 1, nc->comm, x.st),
            "exact: ncclBroadcast"));
    }
    return ZO_OK;
}

static zo_status nccl_enqueue(zo_comm_t c, zo_stream_t s, const zo_coll *op)
{
    ZO_TRY(aborted(c));
    if ((op->kind == ZO_COLL_ALL_REDUCE || op->kind == ZO_COLL_REDUCE_SCATTER ||
         op->kind == ZO_COLL_REDUCE) &&
        op->mode == ZO_REDUCE_EXACT) {
        ZO_TRY(nccl_exact(c, s, op));
        track(c, zo_stream_native(s), op->kind);
        return ZO_OK;
    }
    cudaStream_t st = zo_stream_native(s);
    ZO_TRY(check_call(c, call_nccl(c, op, st), zo_coll_name(op->kind)));
    track(c, st, op->kind);
    return ZO_OK;
}

static zo_status nccl_host_all_gather(zo_comm_t c, const void *mine, void *all, size_t bytes)
{
    nccl_comm *nc = c->impl;
    size_t total = bytes * (size_t)c->size;
    void *buf = NULL;
    cudaStream_t st = NULL;
    /* A CUDA call can return an earlier launch's error: clear it, so a
     * failure here names this step's own cause. */
    cudaError_t e = cudaSetDevice(nc->ordinal);
    if (e == cudaSuccess) {
        (void)cudaGetLastError();
        e = cudaMalloc(&buf, total);
    }
    if (e != cudaSuccess)
        return ZO_FAIL(ZO_ERR_CUDA, "comm", "nccl: cannot stage %zu bytes on GPU %d: %s", total,
                       nc->ordinal, cudaGetErrorString(e));
    zo_status rc = ZO_OK;
    const char *step = "creating the staging stream";
    e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    char *own = (char *)buf + bytes * (size_t)c->rank;
    if (e == cudaSuccess) {
        step = "the staging copy to the GPU";
        e = cudaMemcpyAsync(own, mine, bytes, cudaMemcpyHostToDevice, st);
    }
    if (e == cudaSuccess)
        rc = check_call(c, ncclAllGather(own, buf, bytes, ncclUint8, nc->comm, st), "all-gather");
    if (e == cudaSuccess && rc == ZO_OK) {
        step = "the copy back to the host";
        e = cudaMemcpyAsync(all, buf, total, cudaMemcpyDeviceToHost, st);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(st);
    }
    if (e != cudaSuccess)
        rc = ZO_FAIL(ZO_ERR_CUDA, "comm", "nccl: host all-gather: %s failed: %s", step,
                     cudaGetErrorString(e));
    if (st)
        cudaStreamDestroy(st);
    cudaFree(buf);
    return rc;
}

static zo_status nccl_run_native(zo_comm_t c, zo_comm_native_fn fn, void *arg)
{
    nccl_comm *nc = c->impl;
    return fn(&nc->comm, arg);
}

const zo_comm_ops zo_comm_nccl_backend = {
    .name = "nccl",
    .version = ZO_COMM_OPS_VERSION,
    .caps = ZO_COMM_CAP_DEVICE_BUFFERS,
    .init = nccl_init,
    .split = nccl_split,
    .fini = nccl_fini,
    .enqueue = nccl_enqueue,
    .host_all_gather = nccl_host_all_gather,
    .run_native = nccl_run_native,
};
