/* zo_adam_step as a device op (zo_op_adam): checked here, then queued on the
 * stream. On the cpu device the stream's worker runs zo_adam_step on the
 * buffers (host memory there); on cuda, zo_cuda_adam's kernel performs the
 * same fp32 operations in the same order. */
#include <string.h>

#include "optim_internal.h"
#include "zo_internal.h"
#ifdef ZO_HAVE_CUDA
#include "zo/kernels_cuda.h"
#endif

/* The cpu device's task: the arguments, copied at enqueue. */
typedef struct adam_task {
    zo_adam_params p;
    zo_adam_buffers b;
} adam_task;

static zo_status adam_task_run(void *arg)
{
    const adam_task *t = arg;
    return zo_adam_step(&t->p, &t->b);
}

/* [ptr, ptr + bytes) inside one live allocation of dev, or a clear refusal. */
static zo_status check_owned(zo_device_t dev, const void *ptr, size_t bytes, const char *what)
{
    if (!bytes || zo_device_owns(dev, ptr, bytes))
        return ZO_OK;
    return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim",
                   "zo_op_adam: %s (%p, %zu bytes) is not inside one live allocation of the "
                   "stream's %s device; give device memory (zo_device_malloc)",
                   what, ptr, bytes, zo_device_backend(dev));
}

static zo_status check_operands(zo_device_t dev, const zo_adam_buffers *b)
{
    size_t n = b->n;
    ZO_TRY(check_owned(dev, b->grad, n * zo_dtype_size(b->grad_type), "grad"));
    ZO_TRY(check_owned(dev, b->master, n * sizeof(float), "master"));
    ZO_TRY(check_owned(dev, b->m, n * zo_dtype_size(b->state_type), "m"));
    ZO_TRY(check_owned(dev, b->v, n * zo_dtype_size(b->state_type), "v"));
    const zo_state_format *f = zo_state_format_of(b->state_type);
    if (f->block) {
        size_t scales = (n + f->block - 1) / f->block * sizeof(float);
        ZO_TRY(check_owned(dev, b->m_absmax, scales, "m_absmax"));
        ZO_TRY(check_owned(dev, b->v_absmax, scales, "v_absmax"));
    }
    if (b->out_type != ZO_DTYPE_NONE)
        ZO_TRY(check_owned(dev, b->out, n * zo_dtype_size(b->out_type), "out"));
    return ZO_OK;
}

#ifdef ZO_HAVE_CUDA
static zo_status adam_cuda(zo_stream_t s, const zo_adam_consts *c, const zo_adam_buffers *b)
{
    if (b->state_type != ZO_DTYPE_F32 && b->state_type != ZO_DTYPE_BF16)
        return ZO_FAIL(ZO_ERR_UNSUPPORTED, "optim",
                       "zo_op_adam: %s moments are not updated on cuda yet (the kernel has fp32 "
                       "and bf16); keep them in fp32 or bf16, or home the states on the host",
                       zo_state_format_of(b->state_type)->name);
    zo_cuda_adam_args a = {
        .n = b->n,
        .grad = b->grad,
        .grad_type = b->grad_type,
        .master = b->master,
        .m = b->m,
        .v = b->v,
        .state_type = b->state_type,
        .out = b->out,
        .out_type = b->out_type,
        .beta1 = c->beta1,
        .beta2 = c->beta2,
        .one_minus_beta1 = c->one_minus_beta1,
        .one_minus_beta2 = c->one_minus_beta2,
        .step_size = c->step_size,
        .inv_sqrt_bc2 = c->inv_sqrt_bc2,
        .eps = c->eps,
        .decay = c->decay,
        .l2 = c->l2,
        .grad_scale = c->grad_scale,
    };
    return zo_cuda_adam(s, &a);
}
#endif

zo_status zo_op_adam(zo_stream_t s, const zo_adam_params *p, const zo_adam_buffers *b)
{
    if (!s)
        return ZO_FAIL(ZO_ERR_INVALID_ARG, "optim", "zo_op_adam: the stream is NULL");
    zo_adam_consts c;
    ZO_TRY(zo_adam_consts_make(p, &c));
    ZO_TRY(zo_adam_buffers_check(b));
    zo_device_t dev = zo_stream_device(s);
    ZO_TRY(check_operands(dev, b));
    const char *backend = zo_device_backend(dev);
    if (!strcmp(backend, "cpu")) {
        const zo_optim_kernels *k;
        ZO_TRY(zo_optim_kernels_get(p->simd_level, &k)); /* refused now, not in the task */
        adam_task t = {*p, *b};
        t.p.struct_size = sizeof t.p;
        t.b.struct_size = sizeof t.b;
        return b->n ? zo_stream_enqueue(s, adam_task_run, &t, sizeof t) : ZO_OK;
    }
#ifdef ZO_HAVE_CUDA
    if (!strcmp(backend, "cuda"))
        return b->n ? adam_cuda(s, &c, b) : ZO_OK;
#endif
    return ZO_FAIL(ZO_ERR_UNSUPPORTED, "optim",
                   "zo_op_adam: the %s device has no Adam op in this build (cpu%s have one)",
                   backend,
#ifdef ZO_HAVE_CUDA
                   " and cuda"
#else
                   ""
#endif
    );
}
