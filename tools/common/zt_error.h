/* The tools' error reporting (zo-train, zo-plan and their libraries). The
 * tools use only the public API, so they keep their own last-error text: a
 * failing zoffload call's message is copied from zo_last_error() (ZT_LIB),
 * the tool's own checks format theirs (zt_fail). */
#ifndef ZT_ERROR_H
#define ZT_ERROR_H

#include "zo/status.h"

/* Record a formatted message as the last error; returns st. */
zo_status zt_fail(zo_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Record zo_last_error() (the failing library call's message) with a prefix
 * naming what the tool was doing; returns st. */
zo_status zt_lib_fail(zo_status st, const char *what);
/* The cause in zo_last_error(): the text after its innermost "file.c:LINE:
 * status: " frame, what a user needs first. */
const char *zt_lib_message(void);
/* -v: zt_lib_fail's messages also carry the whole chain of frames on a
 * second line ("  where: zo_engine_finalize: engine_finalize.c:259: ...").
 * Set once, before threads start. */
void zt_error_show_frames(int on);
/* The last error recorded by either. */
const char *zt_last_error(void);

/* Propagate a failure of the tool's own function (message already set). */
#define ZT_TRY(expr)                                                                               \
    do {                                                                                           \
        zo_status zt_try_st_ = (expr);                                                             \
        if (zt_try_st_ < 0)                                                                        \
            return zt_try_st_;                                                                     \
    } while (0)

/* Call the library; on failure record its message prefixed by the call. */
#define ZT_LIB(expr)                                                                               \
    do {                                                                                           \
        zo_status zt_lib_st_ = (expr);                                                             \
        if (zt_lib_st_ < 0)                                                                        \
            return zt_lib_fail(zt_lib_st_, #expr);                                                 \
    } while (0)

#endif
