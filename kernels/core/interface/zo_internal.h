/* zoffload internal helpers shared by every part of the library: error
 * raising, logging shortcuts and environment tunables. Not installed. */
#ifndef ZO_INTERNAL_H
#define ZO_INTERNAL_H

#include <sched.h>
#include <stddef.h>
#include <stdint.h>

#include "zo/log.h"
#include "zo/status.h"
#include "zo/units.h" /* zo_now_ns, zo_fmt_bytes */

#ifdef __cplusplus
extern "C" {
#endif

/* Record st as the calling thread's last error with a formatted message and
 * the raising source location; logs it at debug level; returns st. */
zo_status zo_set_error_at(zo_status st, const char *subsys, const char *file, int line,
                          const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

/* Raise an error and return its status: return ZO_FAIL(ZO_ERR_X, "swap", "..."); */
#define ZO_FAIL(st, subsys, ...) zo_set_error_at((st), (subsys), __FILE__, __LINE__, __VA_ARGS__)

/* Make (st, msg) the calling thread's last error again, as saved from
 * zo_last_error() before later calls replaced it (no new location prefix). */
void zo_restore_error(zo_status st, const char *msg);

/* Propagate a failing status unchanged (the callee already set the message). */
#define ZO_TRY(expr)                                                                               \
    do {                                                                                           \
        zo_status zo_try_st_ = (expr);                                                             \
        if (zo_try_st_ < 0)                                                                        \
            return zo_try_st_;                                                                     \
    } while (0)

#define ZO_LOGE(subsys, ...) zo_log(ZO_LOG_ERROR, (subsys), __VA_ARGS__)
#define ZO_LOGW(subsys, ...) zo_log(ZO_LOG_WARN, (subsys), __VA_ARGS__)
#define ZO_LOGI(subsys, ...) zo_log(ZO_LOG_INFO, (subsys), __VA_ARGS__)
#define ZO_LOGD(subsys, ...) zo_log(ZO_LOG_DEBUG, (subsys), __VA_ARGS__)

/* Environment tunables: read once by the caller, validated; a malformed or
 * out-of-range value logs one warning and yields the default. */
int64_t zo_env_int(const char *name, int64_t def, int64_t min, int64_t max);
double zo_env_double(const char *name, double def, double min, double max);
/* Returns the value or def when unset; never NULL when def is non-NULL. */
const char *zo_env_str(const char *name, const char *def);
/* 1/0 from 1,0,true,false,yes,no,on,off. */
int zo_env_bool(const char *name, int def);

/* Size helpers. */
static inline size_t zo_round_up(size_t x, size_t align)
{
    return (x + align - 1) / align * align;
}

/* Memory for large host arrays (optimizer states and the like): 2 MiB-aligned
 * and advised into transparent huge pages from 2 MiB up, 4 KiB-aligned below.
 * Where the system refuses huge pages it silently gets small ones. NULL when
 * out of memory; release with free(). */
void *zo_huge_alloc(size_t bytes);

/* As zo_huge_alloc, but zeroed, and without writing it: fresh anonymous
 * pages, which the kernel zeroes when they are first touched (by the thread
 * that touches them, so first touch also places them on its NUMA node).
 * NULL when out of memory; release with zo_huge_free (never free()). */
void *zo_huge_zalloc(size_t bytes);

/* Releases a block of zo_huge_zalloc; NULL is a no-op. */
void zo_huge_free(void *p);

/* The CPUs the process may run on: the main thread's mask now, joined with
 * its mask when the library was loaded, so a thread whose own mask was
 * narrowed (e.g. by an OpenMP runtime) still sees the whole set. An OpenMP
 * runtime initialized before this library may already have bound the main
 * thread too: when OMP_PROC_BIND, OMP_PLACES, GOMP_CPU_AFFINITY or
 * KMP_AFFINITY is set, the CPUs the system allows the process (its cgroup's
 * cpuset) are joined as well. 0, or -1 with errno. */
int zo_process_cpus(cpu_set_t *set);

/* Plug-in tables (device backends, compute ops, I/O engines, communicators)
 * open with {name, version, caps}; each kind has a registry whose checker
 * describes a table's required operations as slots for zo_table_check. */
typedef struct zo_table_slot {
    const char *name; /* the operation's field name */
    int filled;       /* the table sets it */
} zo_table_slot;

/* ZO_OK when the table is of version want and fills every slot; otherwise
 * ZO_ERR_INTERNAL with a message naming the kind, the table and the slot. */
zo_status zo_table_check(const char *kind, const char *name, unsigned version, unsigned want,
                         const zo_table_slot *slots, size_t nslots);

/* Write "a, b or c" from n names into buf (truncated to cap); returns buf. */
char *zo_table_names(char *buf, size_t cap, const char *const *names, size_t n);

#ifdef __cplusplus
}
#endif
#endif
