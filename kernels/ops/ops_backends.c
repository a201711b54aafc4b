/* The compute ops' registry: one table per device backend this build has,
 * found by the device backend's name (not by comparing table pointers, so
 * a backend is one line here), each checked before a stream first uses it. */
#include <string.h>

#include "ops_impl.h"
#include "zo_internal.h"

static const zo_ops_backend *const k_ops[] = {
#ifdef ZO_HAVE_CUDA
    &zo_ops_cuda,
#endif
    &zo_ops_cpu,
};

enum { N_OPS = sizeof k_ops / sizeof k_ops[0] };

size_t zo_ops_backends(const zo_ops_backend *const **out)
{
    *out = k_ops;
    return N_OPS;
}

zo_status zo_ops_backend_check(const zo_ops_backend *o)
{
    if (!o)
        return ZO_FAIL(ZO_ERR_INTERNAL, "ops", "a compute ops table is missing");
    const zo_table_slot slots[] = {
        {"ctx_create", o->ctx_create != NULL},
        {"gemm", o->gemm != NULL},
        {"embedding_fwd", o->embedding_fwd != NULL},
        {"embedding_bwd", o->embedding_bwd != NULL},
        {"rmsnorm_fwd", o->rmsnorm_fwd != NULL},
        {"rmsnorm_bwd", o->rmsnorm_bwd != NULL},
        {"rope_table", o->rope_table != NULL},
        {"rope", o->rope != NULL},
        {"softmax_fwd", o->softmax_fwd != NULL},
        {"softmax_bwd", o->softmax_bwd != NULL},
        {"swiglu_fwd", o->swiglu_fwd != NULL},
        {"swiglu_bwd", o->swiglu_bwd != NULL},
        {"cross_entropy", o->cross_entropy != NULL},
        {"xent_part_stats", o->xent_part_stats != NULL},
        {"xent_part", o->xent_part != NULL},
        {"elementwise", o->elementwise != NULL},
        {"sumsq", o->sumsq != NULL},
        {"repeat_kv", o->repeat_kv != NULL},
        {"bias", o->bias != NULL},
        {"flash_fwd", o->flash_fwd != NULL},
        {"flash_bwd", o->flash_bwd != NULL},
    };
    return zo_table_check("compute ops", o->name, o->version, ZO_OPS_BACKEND_VERSION, slots,
                          sizeof slots / sizeof slots[0]);
}

zo_status zo_ops_backend_for(const char *device_backend, const zo_ops_backend **out)
{
    for (size_t i = 0; i < N_OPS; i++) {
        if (!strcmp(k_ops[i]->name, device_backend)) {
            ZO_TRY(zo_ops_backend_check(k_ops[i]));
            *out = k_ops[i];
            return ZO_OK;
        }
    }
    return ZO_FAIL(ZO_ERR_UNSUPPORTED, "ops", "the %s device has no compute ops in this build",
                   device_backend);
}
