/* The checks every plug-in table's registry shares: a table of the wrong
 * version or missing an operation is refused when it is registered or
 * looked up, with a message naming the table and the slot, instead of
 * crashing on a NULL call later (fio's check_engine_ops does the same). */
#include <stdio.h>
#include <string.h>

#include "zo_internal.h"

zo_status zo_table_check(const char *kind, const char *name, unsigned version, unsigned want,
                         const zo_table_slot *slots, size_t nslots)
{
    if (!name || !*name)
        return ZO_FAIL(ZO_ERR_INTERNAL, "core", "a %s table has no name", kind);
    if (version != want)
        return ZO_FAIL(ZO_ERR_INTERNAL, "core",
                       "the %s table '%s' is version %u, but this build expects version %u: "
                       "rebuild it against this zoffload",
                       kind, name, version, want);
    for (size_t i = 0; i < nslots; i++)
        if (!slots[i].filled)
            return ZO_FAIL(ZO_ERR_INTERNAL, "core",
                           "the %s table '%s' lacks the required operation '%s'", kind, name,
                           slots[i].name);
    return ZO_OK;
}

char *zo_table_names(char *buf, size_t cap, const char *const *names, size_t n)
{
    size_t len = 0;
    if (cap)
        buf[0] = '\0';
    for (size_t i = 0; i < n && len < cap; i++) {
        const char *sep = i == 0 ? "" : i + 1 == n ? " or " : ", ";
        int w = snprintf(buf + len, cap - len, "%s%s", sep, names[i]);
        if (w < 0)
            break;
        len += (size_t)w;
    }
    return buf;
}
