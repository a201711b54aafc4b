/* The tools' last-error text (zt_error.h). */
#include "zt_error.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char zt_err[1024];

zo_status zt_fail(zo_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(zt_err, sizeof zt_err, fmt, ap);
    va_end(ap);
    return st;
}

zo_status zt_lib_fail(zo_status st, const char *what)
{
    const char *msg = zo_last_error();
    /* Keep only the function name of the failing call expression. */
    size_t n = strcspn(what, "(");
    snprintf(zt_err, sizeof zt_err, "%.*s: %s (%s)", (int)n, what, msg && *msg ? msg : "no message",
             zo_status_str(st));
    return st;
}

const char *zt_last_error(void)
{
    return zt_err;
}

const char *zt_lib_message(void)
{
    const char *e = zo_last_error(), *colon = strchr(e, ':');
    if (!colon || !isdigit((unsigned char)colon[1]))
        return e;
    const char *p = colon + 1;
    while (isdigit((unsigned char)*p))
        p++;
    if (strncmp(p, ": ", 2) != 0)
        return e;
    p += 2;
    const char *st = zo_status_str(zo_last_error_status());
    size_t n = strlen(st);
    return strncmp(p, st, n) == 0 && strncmp(p + n, ": ", 2) == 0 ? p + n + 2 : p;
}
