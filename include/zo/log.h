/* zoffload: logging. The library never writes to stdout; messages go to
 * stderr or to a callback set by the application. */
#ifndef ZO_LOG_H
#define ZO_LOG_H

#include "zo/api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum zo_log_level {
    ZO_LOG_NONE = 0,
    ZO_LOG_ERROR = 1,
    ZO_LOG_WARN = 2,
    ZO_LOG_INFO = 3,
    ZO_LOG_DEBUG = 4,
    ZO_LOG_TRACE = 5,
} zo_log_level;

/* Receives each message that passes the level and subsystem filters.
 * msg has no trailing newline. Called from any thread, so it must be
 * thread-safe. */
typedef void (*zo_log_fn)(zo_log_level level, const char *subsys, const char *msg, void *user);

/* Route messages to fn (NULL restores the default: stderr). */
ZO_API void zo_log_set_callback(zo_log_fn fn, void *user);

/* Override the level read from ZO_LOG (error|warn|info|debug|trace|none). */
ZO_API void zo_log_set_level(zo_log_level level);
ZO_API zo_log_level zo_log_get_level(void);

/* Override the subsystem filter read from ZO_LOG_SUBSYS: a comma-separated
 * list such as "swap,offload"; NULL or "" or "all" enables all. */
ZO_API void zo_log_set_subsys(const char *list);

/* Whether a message of this level and subsystem would be emitted. */
ZO_API int zo_log_enabled(zo_log_level level, const char *subsys);

/* Emit a message (printf-style). Applications may use it too. */
ZO_API void zo_log(zo_log_level level, const char *subsys, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

ZO_API const char *zo_log_level_name(zo_log_level level);

#ifdef __cplusplus
}
#endif
#endif
