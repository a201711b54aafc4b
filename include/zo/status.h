/* zoffload: status codes and the last error's text. */
#ifndef ZO_STATUS_H
#define ZO_STATUS_H

#include "zo/api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 0 is success, negative values are errors, positive values are
 * non-error conditions (such as "not ready yet"). */
typedef enum zo_status {
    ZO_OK = 0,
    ZO_NOT_READY = 1,                 /* asynchronous work still pending */
    ZO_ERR_INVALID_ARG = -1,          /* a bad argument or handle */
    ZO_ERR_NO_MEMORY = -2,            /* host memory exhausted */
    ZO_ERR_OUT_OF_DEVICE_MEMORY = -3, /* device budget or capacity exceeded */
    ZO_ERR_BUDGET = -4,               /* a tier budget (pinned, NVMe) would be exceeded */
    ZO_ERR_PIN = -5,                  /* pinning (page-locking) host memory failed */
    ZO_ERR_IO = -6,                   /* an I/O error (EIO, short I/O that could not complete) */
    ZO_ERR_NO_SPACE = -7,             /* a file system is full (ENOSPC) */
    ZO_ERR_CORRUPT = -8,              /* stored data failed verification */
    ZO_ERR_UNSUPPORTED = -9,          /* not supported by this build, backend or machine */
    ZO_ERR_NO_DEVICE = -10,           /* the requested device does not exist */
    ZO_ERR_CUDA = -11,                /* a CUDA runtime error */
    ZO_ERR_CUBLAS = -12,              /* a cuBLAS error */
    ZO_ERR_NCCL = -13,                /* an NCCL error */
    ZO_ERR_MPI = -14,                 /* an MPI error */
    ZO_ERR_CONFIG = -15,              /* a bad configuration key or value */
    ZO_ERR_STATE = -16,               /* call not valid in the object's current state */
    ZO_ERR_NOT_FOUND = -17,           /* a file, key or tensor was not found */
    ZO_ERR_EXISTS = -18,              /* something already exists (e.g. a stale swap file) */
    ZO_ERR_OVERFLOW = -19,            /* a numeric overflow (inf/NaN) was detected */
    ZO_ERR_SYSTEM = -20,              /* another operating-system error */
    ZO_ERR_INTERNAL = -21,            /* a bug in zoffload: please report it */
} zo_status;

/* A short, constant description of a status ("out of device memory"). */
ZO_API const char *zo_status_str(zo_status st);

/* The message of the last error raised on the calling thread, with the
 * source file and line that raised it, or "" if none. The string stays valid
 * until the next zoffload call on this thread. */
ZO_API const char *zo_last_error(void);
/* The status of that last error (ZO_OK if none). */
ZO_API zo_status zo_last_error_status(void);
/* Forget the calling thread's last error. */
ZO_API void zo_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif
