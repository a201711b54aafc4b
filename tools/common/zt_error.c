/* The tools' last-error text (zt_error.h). */
#include "zt_error.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char zt_err[2048];
static int zt_frames; /* -v: the library's frames after the cause (set before threads start) */

void zt_error_show_frames(int on)
{
    zt_frames = on;
}

/* The end of a "name.c:LINE: " frame starting at p, or NULL. */
static const char *frame_end(const char *p)
{
    const char *q = p;
    while (isalnum((unsigned char)*q) || *q == '_' || *q == '-')
        q++;
    if (q == p || *q != '.')
        return NULL;
    q++;
    const char *ext = q;
    while (isalpha((unsigned char)*q))
        q++;
    if (q == ext || q - ext > 3 || *q != ':' || !isdigit((unsigned char)q[1]))
        return NULL;
    q++;
    while (isdigit((unsigned char)*q))
        q++;
    return strncmp(q, ": ", 2) == 0 ? q + 2 : NULL;
}

/* The cause in a library message: the text after its innermost frame (each
 * layer that passed the error on added "file.c:LINE: status: context: "),
 * without the status name that follows the frame. */
static const char *innermost_cause(const char *e)
{
    const char *cause = e;
    for (const char *p = e; *p; p++)
        if ((p == e || !isalnum((unsigned char)p[-1])) && frame_end(p))
            cause = frame_end(p);
    for (int s = 0; s >= ZO_ERR_INTERNAL; s--) {
        const char *name = zo_status_str((zo_status)s);
        size_t n = strlen(name);
        if (strncmp(cause, name, n) == 0 && strncmp(cause + n, ": ", 2) == 0)
            return cause + n + 2;
    }
    return cause;
}

zo_status zt_fail(zo_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(zt_err, sizeof zt_err, fmt, ap);
    va_end(ap);
    return st;
}

/* The fix for the failures whose library messages name only the cause. */
static const char *fix_for(zo_status st)
{
    switch (st) {
    case ZO_ERR_IO:
        return "; the drive reported an error: check it (dmesg) or use another NVMe path";
    case ZO_ERR_NO_SPACE: return "; free space on that file system or use another NVMe path";
    default: return "";
    }
}

zo_status zt_lib_fail(zo_status st, const char *what)
{
    const char *msg = zo_last_error();
    msg = msg && *msg ? msg : "no message";
    /* Keep only the function name of the failing call expression. */
    size_t n = strcspn(what, "(");
    char frames[1024];
    snprintf(frames, sizeof frames, "%.*s: %s (%s)", (int)n, what, msg, zo_status_str(st));
    /* The cause first: a call's name (zo_...) is a frame too, what the tool
     * was doing in words ("--emit-config") stays in front of it. */
    int call = strncmp(what, "zo_", 3) == 0;
    int k = snprintf(zt_err, sizeof zt_err, "%.*s%s%s%s", call ? 0 : (int)n, what, call ? "" : ": ",
                     innermost_cause(msg), fix_for(st));
    if (zt_frames && k > 0 && (size_t)k < sizeof zt_err)
        snprintf(zt_err + k, sizeof zt_err - (size_t)k, "\n  where: %s", frames);
    return st;
}

const char *zt_last_error(void)
{
    return zt_err;
}

const char *zt_lib_message(void)
{
    return innermost_cause(zo_last_error());
}
