/* The self backend: a world of one rank. Every collective is a copy (or
 * nothing) in stream order; send and receive have no peer to meet. */
#include <stdlib.h>
#include <string.h>

#include "comm_impl.h"

static zo_status self_init(zo_comm_t c, const zo_rank_info *ri)
{
    c->rank = 0;
    c->size = 1;
    c->impl = NULL;
    return ZO_OK;
}

static zo_status self_split(zo_comm_t c, int color, int key, zo_comm_t child)
{
    if (color < 0)
        return ZO_OK;
    child->rank = 0;
    child->size = 1;
    child->world_ranks = malloc(sizeof(int));
    if (!child->world_ranks)
        return ZO_FAIL(ZO_ERR_NO_MEMORY, "comm", "out of memory");
    child->world_ranks[0] = c->world_ranks[0];
    return ZO_OK;
}

static void self_fini(zo_comm_t c) {}

static zo_status self_enqueue(zo_comm_t c, zo_stream_t s, const zo_coll *op)
{
    switch (op->kind) {
    case ZO_COLL_ALL_REDUCE:
    case ZO_COLL_REDUCE:
    case ZO_COLL_REDUCE_SCATTER:
    case ZO_COLL_ALL_GATHER:
        return zo_comm_enqueue_copy(c, s, op->recv, op->send, zo_coll_recv_bytes(op, 1));
    case ZO_COLL_BROADCAST:
    case ZO_COLL_BARRIER: return ZO_OK;
    default: /* send and recv were refused: no other rank */
        return ZO_FAIL(ZO_ERR_INTERNAL, "comm", "self: %s reached the backend",
                       zo_coll_name(op->kind));
    }
}

static zo_status self_host_all_gather(zo_comm_t c, const void *mine, void *all, size_t bytes)
{
    memmove(all, mine, bytes);
    return ZO_OK;
}

static zo_status self_run_native(zo_comm_t c, zo_comm_native_fn fn, void *arg)
{
    return fn(NULL, arg);
}

const zo_comm_ops zo_comm_self_backend = {
    .name = "self",
    .version = ZO_COMM_OPS_VERSION,
    .caps = ZO_COMM_CAP_HOST_BUFFERS | ZO_COMM_CAP_DEVICE_BUFFERS | ZO_COMM_CAP_ONE_RANK,
    .init = self_init,
    .split = self_split,
    .fini = self_fini,
    .enqueue = self_enqueue,
    .host_all_gather = self_host_all_gather,
    .run_native = self_run_native,
};
