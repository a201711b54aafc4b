/* Logging: level and subsystem filters from ZO_LOG / ZO_LOG_SUBSYS, read
 * once; messages go to stderr or to the user's callback. */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "zo_internal.h"

enum { SUBSYS_LIST_CAP = 512 };

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int log_level = ZO_LOG_WARN;
static char subsys_list[SUBSYS_LIST_CAP]; /* "" = all; guarded by log_mu */
static zo_log_fn log_cb;                  /* guarded by log_mu */
static void *log_cb_user;

static int parse_level(const char *s, zo_log_level *out)
{
    static const char *names[] = {"none", "error", "warn", "info", "debug", "trace"};
    for (int i = 0; i <= ZO_LOG_TRACE; i++) {
        if (strcasecmp(s, names[i]) == 0) {
            *out = (zo_log_level)i;
            return 1;
        }
    }
    if (strcasecmp(s, "warning") == 0) {
        *out = ZO_LOG_WARN;
        return 1;
    }
    return 0;
}

static void set_subsys_locked(const char *list)
{
    if (!list || !*list || strcasecmp(list, "all") == 0) {
        subsys_list[0] = '\0';
        return;
    }
    snprintf(subsys_list, sizeof subsys_list, ",%s,", list);
}

static void log_init(void)
{
    const char *lv = getenv("ZO_LOG");
    const char *ss = getenv("ZO_LOG_SUBSYS");
    int bad_level = 0;
    if (lv && *lv) {
        zo_log_level l;
        if (parse_level(lv, &l))
            atomic_store(&log_level, (int)l);
        else
            bad_level = 1;
    }
    pthread_mutex_lock(&log_mu);
    set_subsys_locked(ss);
    pthread_mutex_unlock(&log_mu);
    if (bad_level)
        zo_log(ZO_LOG_WARN, "core",
               "ZO_LOG='%s' is not a level; expected none|error|warn|info|debug|trace; using warn",
               lv);
}

const char *zo_log_level_name(zo_log_level level)
{
    switch (level) {
    case ZO_LOG_NONE: return "none";
    case ZO_LOG_ERROR: return "error";
    case ZO_LOG_WARN: return "warn";
    case ZO_LOG_INFO: return "info";
    case ZO_LOG_DEBUG: return "debug";
    case ZO_LOG_TRACE: return "trace";
    }
    return "?";
}

void zo_log_set_callback(zo_log_fn fn, void *user)
{
    pthread_once(&log_once, log_init);
    pthread_mutex_lock(&log_mu);
    log_cb = fn;
    log_cb_user = user;
    pthread_mutex_unlock(&log_mu);
}

void zo_log_set_level(zo_log_level level)
{
    pthread_once(&log_once, log_init);
    atomic_store(&log_level, (int)level);
}

zo_log_level zo_log_get_level(void)
{
    pthread_once(&log_once, log_init);
    return (zo_log_level)atomic_load(&log_level);
}

void zo_log_set_subsys(const char *list)
{
    pthread_once(&log_once, log_init);
    pthread_mutex_lock(&log_mu);
    set_subsys_locked(list);
    pthread_mutex_unlock(&log_mu);
}

static int subsys_enabled_locked(const char *subsys)
{
    if (!subsys_list[0] || !subsys)
        return 1;
    char key[64];
    snprintf(key, sizeof key, ",%s,", subsys);
    return strstr(subsys_list, key) != NULL;
}

int zo_log_enabled(zo_log_level level, const char *subsys)
{
    pthread_once(&log_once, log_init);
    if (level == ZO_LOG_NONE || (int)level > atomic_load(&log_level))
        return 0;
    /* Errors always pass the subsystem filter: they must never be hidden. */
    if (level == ZO_LOG_ERROR)
        return 1;
    pthread_mutex_lock(&log_mu);
    int on = subsys_enabled_locked(subsys);
    pthread_mutex_unlock(&log_mu);
    return on;
}

void zo_log(zo_log_level level, const char *subsys, const char *fmt, ...)
{
    if (!zo_log_enabled(level, subsys))
        return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&log_mu);
    if (log_cb)
        log_cb(level, subsys ? subsys : "core", msg, log_cb_user);
    else
        fprintf(stderr, "zoffload %s [%s] %s\n", zo_log_level_name(level), subsys ? subsys : "core",
                msg);
    pthread_mutex_unlock(&log_mu);
}
