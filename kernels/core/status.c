/* Status strings and the per-thread last error. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "zo_internal.h"

enum { ZO_ERRMSG_CAP = 1024 };

static _Thread_local char tls_errmsg[ZO_ERRMSG_CAP];
static _Thread_local zo_status tls_errst;

const char *zo_status_str(zo_status st)
{
    switch (st) {
    case ZO_OK: return "ok";
    case ZO_NOT_READY: return "not ready";
    case ZO_ERR_INVALID_ARG: return "invalid argument";
    case ZO_ERR_NO_MEMORY: return "out of host memory";
    case ZO_ERR_OUT_OF_DEVICE_MEMORY: return "out of device memory";
    case ZO_ERR_BUDGET: return "budget exceeded";
    case ZO_ERR_PIN: return "pinning host memory failed";
    case ZO_ERR_IO: return "I/O error";
    case ZO_ERR_NO_SPACE: return "no space left on device";
    case ZO_ERR_CORRUPT: return "data corruption detected";
    case ZO_ERR_UNSUPPORTED: return "not supported";
    case ZO_ERR_NO_DEVICE: return "no such device";
    case ZO_ERR_CUDA: return "CUDA error";
    case ZO_ERR_CUBLAS: return "cuBLAS error";
    case ZO_ERR_NCCL: return "NCCL error";
    case ZO_ERR_MPI: return "MPI error";
    case ZO_ERR_CONFIG: return "configuration error";
    case ZO_ERR_STATE: return "invalid state";
    case ZO_ERR_NOT_FOUND: return "not found";
    case ZO_ERR_EXISTS: return "already exists";
    case ZO_ERR_OVERFLOW: return "numeric overflow";
    case ZO_ERR_SYSTEM: return "system error";
    case ZO_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

static const char *basename_of(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

zo_status zo_set_error_at(zo_status st, const char *subsys, const char *file, int line,
                          const char *fmt, ...)
{
    char msg[ZO_ERRMSG_CAP - 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(tls_errmsg, sizeof tls_errmsg, "%s:%d: %s: %s", basename_of(file), line,
             zo_status_str(st), msg);
    tls_errst = st;
    zo_log(ZO_LOG_DEBUG, subsys ? subsys : "core", "%s", tls_errmsg);
    return st;
}

const char *zo_last_error(void)
{
    return tls_errmsg;
}

zo_status zo_last_error_status(void)
{
    return tls_errst;
}

void zo_restore_error(zo_status st, const char *msg)
{
    snprintf(tls_errmsg, sizeof tls_errmsg, "%s", msg ? msg : "");
    tls_errst = st;
}

void zo_clear_error(void)
{
    tls_errmsg[0] = '\0';
    tls_errst = ZO_OK;
}
