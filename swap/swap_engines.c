/* The I/O engines' registry: every engine table this build has, in the
 * order "auto" tries them; each is checked before an engine is made from
 * it (fio's check_engine_ops), and found by name, so adding an engine is
 * one file and one line here. */
#include <string.h>

#include "swap_engine.h"
#include "zo_internal.h"

static const zo_io_engine_ops *const k_engines[] = {
    &zo_io_uring_ops,
    &zo_io_sync_ops,
    &zo_io_null_ops,
    &zo_io_fault_ops,
};

enum { N_ENGINES = sizeof k_engines / sizeof k_engines[0] };

zo_status zo_io_engine_ops_check(const zo_io_engine_ops *o)
{
    if (!o)
        return ZO_FAIL(ZO_ERR_INTERNAL, "swap", "an I/O engine table is missing");
    const zo_table_slot slots[] = {
        {"create", o->create != NULL},
        {"register_files", o->register_files != NULL},
        {"unregister_buffer (with register_buffer)", !o->register_buffer || o->unregister_buffer},
        {"submit", o->submit != NULL},
        {"reap", o->reap != NULL},
        {"wake", o->wake != NULL},
        {"destroy", o->destroy != NULL},
    };
    return zo_table_check("I/O engine", o->name, o->version, ZO_IO_ENGINE_OPS_VERSION, slots,
                          sizeof slots / sizeof slots[0]);
}

size_t zo_io_engines(const zo_io_engine_ops *const **out)
{
    *out = k_engines;
    return N_ENGINES;
}

const zo_io_engine_ops *zo_io_engine_find(const char *name)
{
    for (size_t i = 0; name && i < N_ENGINES; i++)
        if (!strcmp(k_engines[i]->name, name))
            return k_engines[i];
    return NULL;
}

char *zo_io_engine_choices(char *buf, size_t cap)
{
    const char *names[N_ENGINES + 1] = {"auto"};
    size_t n = 1;
    for (size_t i = 0; i < N_ENGINES; i++)
        if (!(k_engines[i]->caps & ZO_IO_CAP_WRAPPER))
            names[n++] = k_engines[i]->name;
    return zo_table_names(buf, cap, names, n);
}

zo_status zo_io_engine_check_name(const char *name)
{
    const zo_io_engine_ops *o = zo_io_engine_find(name);
    if (name && (!strcmp(name, "auto") || (o && !(o->caps & ZO_IO_CAP_WRAPPER))))
        return ZO_OK;
    char list[256];
    zo_io_engine_choices(list, sizeof list);
    if (o)
        return ZO_FAIL(ZO_ERR_CONFIG, "swap",
                       "engine '%s' wraps another engine and is armed by the store (through "
                       "faults in the config), not chosen by name: expected %s",
                       name, list);
    return ZO_FAIL(ZO_ERR_CONFIG, "swap", "engine '%s' is unknown: expected %s",
                   name ? name : "(null)", list);
}

zo_status zo_io_engine_create(const zo_io_engine_ops *ops, const zo_io_engine_args *a,
                              zo_io_engine **out)
{
    *out = NULL;
    zo_status st = zo_io_engine_ops_check(ops);
    if (st != ZO_OK) {
        if (a->inner)
            a->inner->ops->destroy(a->inner);
        return st;
    }
    return ops->create(a, out);
}

zo_status zo_io_engine_start(zo_io_engine *e)
{
    return e->ops->start ? e->ops->start(e) : ZO_OK;
}

zo_status zo_io_engine_register_buffer(zo_io_engine *e, void *buf, size_t len, int *index)
{
    *index = -1;
    return e->ops->register_buffer ? e->ops->register_buffer(e, buf, len, index) : ZO_OK;
}

void zo_io_engine_unregister_buffer(zo_io_engine *e, int index)
{
    if (e->ops->unregister_buffer)
        e->ops->unregister_buffer(e, index);
}

zo_status zo_io_engine_flush(zo_io_engine *e)
{
    return e->ops->flush ? e->ops->flush(e) : ZO_OK;
}
