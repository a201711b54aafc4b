/* The communicator's front end: the backend registry, arguments and buffers
 * checked once for every backend, and what the backends share (the exact
 * reductions' addition, rank lists for messages). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_impl.h"
#include "zo/half.h"

static const zo_comm_ops *const backends[] = {
    &zo_comm_self_backend,
    &zo_comm_tcp_backend,
#ifdef ZO_HAVE_MPI
    &zo_comm_mpi_backend,
#endif
#ifdef ZO_HAVE_NCCL
    &zo_comm_nccl_backend,
#endif
};
enum { N_BACKENDS = sizeof backends / sizeof backends[0] };

/* Backends the project has that this build left out, and how to get them,
 * so asking for one says so rather than that it does not exist. before: the
 * backend it precedes in the registry, so the names a message lists keep
 * one order whatever the build has. */
typedef struct left_out {
    const char *name, *before, *why, *fix;
} left_out;

static const left_out k_left_out[] = {
#ifndef ZO_HAVE_MPI
    {"mpi", "nccl", "MPI was not found", "libopenmpi-dev installed"},
#endif
#ifndef ZO_HAVE_NCCL
    {"nccl", NULL, "NCCL or CUDA was not found", "CUDA and NCCL"},
#endif
    {NULL, NULL, NULL, NULL},
};

size_t zo_comm_backends(const zo_comm_ops *const **out)
{
    *out = backends;
    return N_BACKENDS;
}

zo_status zo_comm_ops_check(const zo_comm_ops *o)
{
    if (!o)
        return ZO_FAIL(ZO_ERR_INTERNAL, "comm", "a communicator backend table is missing");
    const zo_table_slot slots[] = {
        {"init", o->init != NULL},
        {"split", o->split != NULL},
        {"fini", o->fini != NULL},
        {"enqueue", o->enqueue != NULL},
        {"host_all_gather", o->host_all_gather != NULL},
        {"run_native", o->run_native != NULL},
    };
    return zo_table_check("communicator backend", o->name, o->version, ZO_COMM_OPS_VERSION, slots,
                          sizeof slots / sizeof slots[0]);
}

static const zo_comm_ops *find_backend(const char *name)
{
    for (int i = 0; i < N_BACKENDS; i++)
        if (!strcmp(backends[i]->name, name))
            return backends[i];
    return NULL;
}

int zo_comm_backend_built(const char *name)
{
    return name && find_backend(name) != NULL;
}

/* mpi where a launcher started an MPI world (mpirun, srun; or ranks the
 * config states inside one, as zo-train passes them on), else tcp: a
 * torchrun job, or config ranks alone, has none. */
static const char *host_backend(const zo_rank_info *ri)
{
    int mpi_world = !strcmp(ri->launcher, "mpirun") || !strcmp(ri->launcher, "srun") ||
                    getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK");
    return mpi_world && find_backend("mpi") ? "mpi" : "tcp";
}

static const char *auto_backend(zo_device_t dev, const zo_rank_info *ri)
{
    if (ri->world_size == 1)
        return "self";
    if (!(zo_device_caps(dev) & ZO_DEVCAP_HOST_ADDRESSABLE))
        return "nccl";
    return host_backend(ri);
}

/* "auto, self, mpi or nccl": every name a config may give, built or not. */
static char *backend_choices(char *buf, size_t cap)
{
    const char *names[N_BACKENDS + 1 + sizeof k_left_out / sizeof k_left_out[0]] = {"auto", "host"};
    size_t n = 2;
    for (int i = 0; i < N_BACKENDS; i++) {
        for (int j = 0; k_left_out[j].name; j++)
            if (k_left_out[j].before && !strcmp(k_left_out[j].before, backends[i]->name))
                names[n++] = k_left_out[j].name;
        names[n++] = backends[i]->name;
    }
    for (int j = 0; k_left_out[j].name; j++)
        if (!k_left_out[j].before || !find_backend(k_left_out[j].before))
            names[n++] = k_left_out[j].name;
    return zo_table_names(buf, cap, names, n);
}

static zo_status pick_backend(const zo_comm_config *cfg, const zo_rank_info *ri,
                              const zo_comm_ops **out)
{
    char list[128];
    const char *name = cfg->backend ? cfg->backend : "auto";
    if (!strcmp(name, "auto"))
        name = auto_backend(cfg->device, ri);
    else if (!strcmp(name, "host"))
        name = ri->world_size == 1 ? "self" : host_backend(ri);
    *out = find_backend(name);
    if (*out)
        return zo_comm_ops_check(*out);
    for (int i = 0; k_left_out[i].name; i++)
        if (!strcmp(name, k_left_out[i].name))
            return ZO_FAIL(ZO_ERR_UNSUPPORTED, "comm",
                           "the '%s' backend is not in this build (%s); rebuild with %s", name,
                           k_left_out[i].why, k_left_out[i].fix);
    return ZO_FAIL(ZO_ERR_CONFIG, "comm", "unknown backend '%s': use %s", name,
                   backend_choices(list, sizeof list));
}

static zo_status check_config(const zo_comm_config *cfg)
{
    if (!cfg || cfg->struct_size != sizeof(zo_comm_config))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "comm",
                       "cfg must be a zo_comm_config set up with ZO_COMM_CONFIG_INIT");
    if (!cfg->device)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "comm",
                       "zo_comm_config.device is NULL: the collectives run on its streams");
    if (cfg->timeout_s < 0)
        return ZO_FAIL(ZO_ERR_CONFIG, "comm", "timeout_s=%g: give seconds > 0, or 0 for default",
                       cfg->timeout_s);
    return ZO_OK;
}

static zo_status world_ranks_identity(zo_comm_t c)
{
    c->world_ranks = malloc(sizeof(int) * (size_t)c->size);
    if (!c->world_ranks)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "comm", "out of memory");
    for (int r = 0; r < c->size; r++)
        c->world_ranks[r] = r;
    return ZO_OK;
}

/* device_buffers_only (or ZO_COMM_DEVICE_ONLY=1) makes a host-memory communicator on a
 * host-addressable device (mpi or tcp on the cpu device) take device allocations only, as NCCL
 * does: a program's host-memory exchanges then fail here as they would on GPUs, so the cpu device
 * shows that it stages them. */
static unsigned comm_caps(const zo_comm_ops *be, const zo_comm_config *cfg)
{
    unsigned caps = be->caps;
    zo_device_t dev = cfg->device;
    int only = cfg->device_buffers_only || zo_env_int("ZO_COMM_DEVICE_ONLY", 0, 0, 1);
    if ((caps & ZO_COMM_CAP_HOST_BUFFERS) && only &&
        (zo_device_caps(dev) & ZO_DEVCAP_HOST_ADDRESSABLE))
        caps = (caps & ~(unsigned)ZO_COMM_CAP_HOST_BUFFERS) | ZO_COMM_CAP_DEVICE_BUFFERS;
    return caps;
}

zo_status zo_comm_init(zo_comm_t *out, const zo_comm_config *cfg)
{
    if (!out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "comm", "out is NULL");
    *out = NULL;
    ZO_TRY(check_config(cfg));
    zo_rank_info ri = ZO_RANK_INFO_INIT;
    ZO_TRY(zo_launch_discover(&cfg->launch, &ri));
    const zo_comm_ops *be;
    ZO_TRY(pick_backend(cfg, &ri, &be));
    if ((be->caps & ZO_COMM_CAP_ONE_RANK) && ri.world_size != 1)
        return ZO_FAIL(ZO_ERR_CONFIG, "comm",
                       "the self backend is one rank, but the %s says world size %d: use tcp, mpi "
                       "or nccl",
                       ri.launcher, ri.world_size);
    zo_comm_t c = calloc(1, sizeof *c);
    if (!c)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "comm", "out of memory");
    c->be = be;
    c->dev = cfg->device;
    c->caps = comm_caps(be, cfg);
    c->is_world = 1;
    c->ri = ri;
    c->timeout_s =
        cfg->timeout_s > 0 ? cfg->timeout_s : zo_env_double("ZO_COMM_TIMEOUT", 300.0, 0.01, 1e6);
    c->segment_bytes = cfg->exact_segment_bytes ? cfg->exact_segment_bytes : (1u << 20);
    zo_status st = be->init(c, &ri);
    if (st == ZO_OK && !c->world_ranks)
        st = world_ranks_identity(c);
    if (st < 0) {
        if (c->impl)
            be->fini(c);
        free(c->world_ranks);
        free(c);
        return st;
    }
    *out = c;
    return ZO_OK;
}

zo_status zo_comm_split(zo_comm_t c, int color, int key, zo_comm_t *out)
{
    if (!c || !out)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "comm", "zo_comm_split: c and out are required");
    *out = NULL;
    zo_comm_t child = calloc(1, sizeof *child);
    if (!child)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "comm", "out of memory");
    *child = (struct zo_comm){.be = c->be,
                              .caps = c->caps,
                              .dev = c->dev,
                              .timeout_s = c->timeout_s,
                              .segment_bytes = c->segment_bytes,
                              .ri = c->ri};
    zo_status st = c->be->split(c, color, key, child);
    if (st < 0 || color < 0) {
        free(child->world_ranks);
        free(child);
        return st;
    }
    *out = child;
    return ZO_OK;
}

void zo_comm_free(zo_comm_t c)
{
    if (!c)
        return;
    c->be->fini(c);
    free(c->world_ranks);
    free(c);
}

int zo_comm_rank(zo_comm_t c)
{
    return c ? c->rank : -1;
}

int zo_comm_size(zo_comm_t c)
{
    return c ? c->size : 0;
}

int zo_comm_world_rank(zo_comm_t c, int r)
{
    return c && r >= 0 && r < c->size ? c->world_ranks[r] : -1;
}

const char *zo_comm_backend(zo_comm_t c)
{
    return c ? c->be->name : "";
}

int zo_comm_takes_device_memory(zo_comm_t c)
{
    if (!c)
        return 0;
    return (c->caps & ZO_COMM_CAP_DEVICE_BUFFERS) ||
           (zo_device_caps(c->dev) & ZO_DEVCAP_HOST_ADDRESSABLE) != 0;
}

int zo_comm_takes_host_memory(zo_comm_t c)
{
    return c && (c->caps & ZO_COMM_CAP_HOST_BUFFERS) != 0;
}

/* ---- checks shared by every collective ---- */

const char *zo_coll_name(zo_coll_kind k)
{
    static const char *const names[] = {"all-reduce", "reduce-scatter", "all-gather", "broadcast",
                                        "send",       "recv",           "barrier",    "reduce"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

size_t zo_coll_send_bytes(const zo_coll *op, int n)
{
    size_t b = op->count * zo_dtype_size(op->dt);
    return op->kind == ZO_COLL_REDUCE_SCATTER ? b * (size_t)n : b;
}

size_t zo_coll_recv_bytes(const zo_coll *op, int n)
{
    size_t b = op->count * zo_dtype_size(op->dt);
    return op->kind == ZO_COLL_ALL_GATHER ? b * (size_t)n : b;
}

static int is_reduction(zo_coll_kind k)
{
    return k == ZO_COLL_ALL_REDUCE || k == ZO_COLL_REDUCE_SCATTER || k == ZO_COLL_REDUCE;
}

static zo_status check_dtype(const zo_coll *op)
{
    if (zo_dtype_size(op->dt) == 0)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "comm", "%s: dtype %d is not an element type",
                       zo_coll_name(op->kind), (int)op->dt);
    int summable = op->dt == ZO_DTYPE_F32 || op->dt == ZO_DTYPE_F64 || op->dt == ZO_DTYPE_BF16 ||
                   op->dt == ZO_DTYPE_F16;
    if (is_reduction(op->kind) && !summable)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "comm",
                       "%s of %s: reductions take fp32, fp64, bf16 or fp16", zo_coll_name(op->kind),
                       zo_dtype_name(op->dt));
    if (is_reduction(op->kind) && op->mode != ZO_REDUCE_FAST && op->mode != ZO_REDUCE_EXACT)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "comm", "%s: mode %d is neither fast nor exact",
                       zo_coll_name(op->kind), (int)op->mode);
    return ZO_OK;
}

/* A buffer the backend can reach: host-addressable for mpi and self on a
 * host-addressable device, a device allocation for nccl. */
static zo_status check_buffer(zo_comm_t c, const zo_coll *op, const void *p, size_t bytes,
                              const char *which)
{
    const unsigned both = ZO_COMM_CAP_HOST_BUFFERS | ZO_COMM_CAP_DEVICE_BUFFERS;
    unsigned reach = c->caps & both;
    if (!bytes)
        return ZO_OK;
    if (p && reach == both)
        return ZO_OK;
    if (!p)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "comm", "%s: %s buffer is NULL", zo_coll_name(op->kind),
                       which);
    int host_dev = (zo_device_caps(c->dev) & ZO_DEVCAP_HOST_ADDRESSABLE) != 0;
    if (reach == ZO_COMM_CAP_HOST_BUFFERS && !host_dev && zo_device_owns(c->dev, p, bytes))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "comm",
                       "%s: the %s backend needs host-addressable buffers, but the %s buffer is "
                       "%s device memory (use nccl, or stage through the host)",
                       zo_coll_name(op->kind), c->be->name, which, zo_device_backend(c->dev));
    if (reach == ZO_COMM_CAP_DEVICE_BUFFERS && !zo_device_owns(c->dev, p, bytes))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "comm",
                       "%s: the %s backend needs device buffers, but the %s buffer (%zu bytes) is "
                       "not inside one device allocation",
                       zo_coll_name(op->kind), c->be->name, which, bytes);
    return ZO_OK;
}

static zo_status check_peer(zo_comm_t c, const zo_coll *op)
{
    int p2p = op->kind == ZO_COLL_SEND || op->kind == ZO_COLL_RECV;
    if (op->kind != ZO_COLL_BROADCAST && op->kind != ZO_COLL_REDUCE && !p2p)
        return ZO_OK;
    if (op->peer < 0 || op->peer >= c->size || (p2p && op->peer == c->rank))
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "comm", "%s: %s %d is not %s rank of this %d-rank group",
                       zo_coll_name(op->kind), p2p ? "peer" : "root", op->peer,
                       p2p ? "another" : "a", c->size);
    return ZO_OK;
}

static zo_status submit(zo_comm_t c, zo_stream_t s, const zo_coll *op)
{
    if (!c || !s)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "comm", "%s: communicator and stream are required",
                       zo_coll_name(op->kind));
    if (zo_stream_device(s) != c->dev)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "comm",
                       "%s: the stream belongs to another device than the communicator's",
                       zo_coll_name(op->kind));
    if (op->kind != ZO_COLL_BARRIER) {
        ZO_TRY(check_dtype(op));
        ZO_TRY(check_peer(c, op));
        if (op->count > ((size_t)1 << 46))
            return ZO_FAIL(ZO_ERR_INVALID_ARG, "comm", "%s: count %zu is too large",
                           zo_coll_name(op->kind), op->count);
        int sends = op->kind != ZO_COLL_RECV && op->kind != ZO_COLL_BROADCAST;
        /* a reduction's result lands on its root only */
        int recvs = op->kind != ZO_COLL_SEND && (op->kind != ZO_COLL_REDUCE || c->rank == op->peer);
        if (sends)
            ZO_TRY(check_buffer(c, op, op->send, zo_coll_send_bytes(op, c->size), "send"));
        if (recvs)
            ZO_TRY(check_buffer(c, op, op->recv, zo_coll_recv_bytes(op, c->size), "recv"));
    }
    return c->be->enqueue(c, s, op);
}

zo_status zo_comm_all_reduce(zo_comm_t c, zo_stream_t s, const void *send, void *recv, size_t count,
                             zo_dtype dt, zo_reduce_mode mode)
{
    zo_coll op = {ZO_COLL_ALL_REDUCE, mode, send, recv, count, dt, 0};
    return submit(c, s, &op);
}

zo_status zo_comm_reduce_scatter(zo_comm_t c, zo_stream_t s, const void *send, void *recv,
                                 size_t recv_count, zo_dtype dt, zo_reduce_mode mode)
{
    zo_coll op = {ZO_COLL_REDUCE_SCATTER, mode, send, recv, recv_count, dt, 0};
    return submit(c, s, &op);
}

zo_status zo_comm_reduce(zo_comm_t c, zo_stream_t s, const void *send, void *recv, size_t count,
                         zo_dtype dt, int root, zo_reduce_mode mode)
{
    zo_coll op = {ZO_COLL_REDUCE, mode, send, recv, count, dt, root};
    return submit(c, s, &op);
}

zo_status zo_comm_all_gather(zo_comm_t c, zo_stream_t s, const void *send, void *recv,
                             size_t send_count, zo_dtype dt)
{
    zo_coll op = {ZO_COLL_ALL_GATHER, ZO_REDUCE_FAST, send, recv, send_count, dt, 0};
    return submit(c, s, &op);
}

zo_status zo_comm_broadcast(zo_comm_t c, zo_stream_t s, void *buf, size_t count, zo_dtype dt,
                            int root)
{
    zo_coll op = {ZO_COLL_BROADCAST, ZO_REDUCE_FAST, buf, buf, count, dt, root};
    return submit(c, s, &op);
}

zo_status zo_comm_send(zo_comm_t c, zo_stream_t s, const void *buf, size_t count, zo_dtype dt,
                       int peer)
{
    zo_coll op = {ZO_COLL_SEND, ZO_REDUCE_FAST, buf, NULL, count, dt, peer};
    return submit(c, s, &op);
}

zo_status zo_comm_recv(zo_comm_t c, zo_stream_t s, void *buf, size_t count, zo_dtype dt, int peer)
{
    zo_coll op = {ZO_COLL_RECV, ZO_REDUCE_FAST, NULL, buf, count, dt, peer};
    return submit(c, s, &op);
}

zo_status zo_comm_barrier(zo_comm_t c, zo_stream_t s)
{
    zo_coll op = {ZO_COLL_BARRIER, ZO_REDUCE_FAST, NULL, NULL, 0, ZO_DTYPE_U8, 0};
    return submit(c, s, &op);
}

zo_status zo_comm_run_native(zo_comm_t c, zo_comm_native_fn fn, void *arg)
{
    if (!c || !fn)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "comm", "zo_comm_run_native: c and fn are required");
    return c->be->run_native(c, fn, arg);
}

/* ---- shared by the backends ---- */

void zo_comm_add(void *dst, const void *a, const void *b, size_t n, zo_dtype dt)
{
    switch (dt) {
    case ZO_DTYPE_F32: {
        float *d = dst;
        const float *x = a, *y = b;
        for (size_t i = 0; i < n; i++)
            d[i] = x[i] + y[i];
        break;
    }
    case ZO_DTYPE_F64: {
        double *d = dst;
        const double *x = a, *y = b;
        for (size_t i = 0; i < n; i++)
            d[i] = x[i] + y[i];
        break;
    }
    case ZO_DTYPE_BF16: {
        uint16_t *d = dst;
        const uint16_t *x = a, *y = b;
        for (size_t i = 0; i < n; i++)
            d[i] = zo_f32_to_bf16(zo_bf16_to_f32(x[i]) + zo_bf16_to_f32(y[i]));
        break;
    }
    case ZO_DTYPE_F16: {
        uint16_t *d = dst;
        const uint16_t *x = a, *y = b;
        for (size_t i = 0; i < n; i++)
            d[i] = zo_f32_to_f16(zo_f16_to_f32(x[i]) + zo_f16_to_f32(y[i]));
        break;
    }
    default: break;
    }
}

typedef struct copy_task {
    void *dst;
    const void *src;
    size_t bytes;
} copy_task;

static zo_status run_copy(void *arg)
{
    copy_task *t = arg;
    memmove(t->dst, t->src, t->bytes);
    return ZO_OK;
}

zo_status zo_comm_enqueue_copy(zo_comm_t c, zo_stream_t s, void *dst, const void *src, size_t bytes)
{
    if (dst == src || !bytes)
        return ZO_OK;
    int host_dev = (zo_device_caps(c->dev) & ZO_DEVCAP_HOST_ADDRESSABLE) != 0;
    if (!host_dev && zo_device_owns(c->dev, dst, bytes) && zo_device_owns(c->dev, src, bytes))
        return zo_memcpy_d2d_async(s, dst, src, bytes);
    copy_task t = {dst, src, bytes};
    return zo_stream_enqueue(s, run_copy, &t, sizeof t);
}

void zo_comm_format_ranks(zo_comm_t c, const int *ranks, int n, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < n && len + 16 < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? ", " : "",
                                zo_comm_world_rank(c, ranks[i]));
}
