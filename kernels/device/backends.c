/* The device backends' registry: the tables this build has, in the order
 * "auto" tries them (a GPU first, the emulated one last), each checked
 * before a device is made from it, found by name. A backend the project
 * has but this build left out is listed apart, with the reason, so asking
 * for it says how to get it rather than that it does not exist. */
#include <strings.h>

#include "device_impl.h"

#define SUBSYS "device"

static const zo_backend_ops *const k_backends[] = {
#ifdef ZO_HAVE_CUDA
    &zo_cuda_backend,
#endif
    &zo_cpu_backend,
};

enum { N_BACKENDS = sizeof k_backends / sizeof k_backends[0] };

typedef struct left_out {
    const char *name, *why;
} left_out;

static const left_out k_left_out[] = {
#ifndef ZO_HAVE_CUDA
    {"cuda", "this build has no CUDA support (nvcc was not found at configure time)"},
#endif
    {NULL, NULL},
};

size_t zo_device_backends(const zo_backend_ops *const **out)
{
    *out = k_backends;
    return N_BACKENDS;
}

zo_status zo_backend_ops_check(const zo_backend_ops *b)
{
    if (!b)
        return ZO_FAIL(ZO_ERR_INTERNAL, SUBSYS, "a device backend table is missing");
    const zo_table_slot slots[] = {
        {"device_count", b->device_count != NULL},
        {"init", b->init != NULL},
        {"fini", b->fini != NULL},
        {"mem_alloc", b->mem_alloc != NULL},
        {"mem_free", b->mem_free != NULL},
        {"host_register", b->host_register != NULL},
        {"host_unregister", b->host_unregister != NULL},
        {"stream_create", b->stream_create != NULL},
        {"stream_destroy", b->stream_destroy != NULL},
        {"stream_sync", b->stream_sync != NULL},
        {"stream_query", b->stream_query != NULL},
        {"event_create", b->event_create != NULL},
        {"event_destroy", b->event_destroy != NULL},
        {"event_record", b->event_record != NULL},
        {"stream_wait_event", b->stream_wait_event != NULL},
        {"event_query", b->event_query != NULL},
        {"event_sync", b->event_sync != NULL},
        {"event_elapsed_ms", b->event_elapsed_ms != NULL},
        {"copy", b->copy != NULL},
        {"memset", b->memset != NULL},
        {"enqueue", b->enqueue != NULL},
    };
    return zo_table_check("device backend", b->name, b->version, ZO_BACKEND_OPS_VERSION, slots,
                          sizeof slots / sizeof slots[0]);
}

const zo_backend_ops *zo_device_backend_find(const char *name)
{
    for (size_t i = 0; i < N_BACKENDS; i++)
        if (!strcasecmp(k_backends[i]->name, name))
            return k_backends[i];
    return NULL;
}

/* "auto, cuda or cpu": every name a config may give, built or not. */
static char *backend_choices(char *buf, size_t cap)
{
    const char *names[N_BACKENDS + sizeof k_left_out / sizeof k_left_out[0]] = {"auto"};
    size_t n = 1;
    for (size_t i = 0; k_left_out[i].name; i++)
        names[n++] = k_left_out[i].name;
    for (size_t i = 0; i < N_BACKENDS; i++)
        names[n++] = k_backends[i]->name;
    return zo_table_names(buf, cap, names, n);
}

static zo_status not_found(const char *name)
{
    for (size_t i = 0; k_left_out[i].name; i++)
        if (!strcasecmp(k_left_out[i].name, name))
            return ZO_FAIL(ZO_ERR_UNSUPPORTED, SUBSYS,
                           "backend '%s' requested but %s; use 'cpu' or 'auto'", name,
                           k_left_out[i].why);
    char list[128];
    return ZO_FAIL(ZO_ERR_INVALID_ARG, SUBSYS, "unknown device backend '%s'; expected %s", name,
                   backend_choices(list, sizeof list));
}

static const zo_backend_ops *auto_backend(void)
{
    for (size_t i = 0; i + 1 < N_BACKENDS; i++)
        if (k_backends[i]->device_count() > 0)
            return k_backends[i];
    return k_backends[N_BACKENDS - 1]; /* the emulated device is always there */
}

zo_status zo_device_backend_pick(const char *name, const zo_backend_ops **out)
{
    if (!name || !*name)
        name = "auto";
    const zo_backend_ops *b =
        strcasecmp(name, "auto") ? zo_device_backend_find(name) : auto_backend();
    if (!b)
        return not_found(name);
    ZO_TRY(zo_backend_ops_check(b));
    if (b->device_count() <= 0)
        return ZO_FAIL(ZO_ERR_NO_DEVICE, SUBSYS,
                       "backend '%s' requested but no %s device is visible; use 'cpu' or 'auto'",
                       b->name, b->name);
    *out = b;
    return ZO_OK;
}
