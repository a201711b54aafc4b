/* The cpu device's compute pool: the cores the process is given, shared by
 * every compute op of every stream (not installed).
 *
 * An op splits its work into at most ZO_CPU_PARTS tasks whose boundaries
 * depend only on the op's shape, never on the thread count or on timing, so a
 * result is the same bits run to run and at any thread count (ZO_CPU_THREADS,
 * an affinity mask, an MPI rank's binding). The stream thread that submits a job
 * works on it too; while one job runs, another stream's job runs on its own
 * stream thread alone (same tasks, same bits), so two compute streams never
 * oversubscribe the cores. */
#ifndef ZO_CPU_POOL_H
#define ZO_CPU_POOL_H

#include <stddef.h>

/* The most parts an op is split into: enough to keep 8 cores busy; past
 * that the pool's other threads serve other streams' ops. */
#define ZO_CPU_PARTS 8

/* Run one task of a job: task is in [0, n_tasks). */
typedef void (*zo_cpu_task_fn)(void *arg, size_t task);

/* The pool's thread count, the submitting thread included: ZO_CPU_THREADS
 * when set (1 to 1024), else the number of CPUs the process may run on.
 * Starts the pool on first use. */
int zo_cpu_pool_threads(void);

/* Run fn(arg, 0 .. n_tasks-1) over the pool and return when all are done. */
void zo_cpu_pool_run(size_t n_tasks, zo_cpu_task_fn fn, void *arg);

/* Split n items into at most `parts` contiguous ranges whose starts are
 * multiples of `align` (except none is empty): part p is [*lo, *hi). Returns
 * the number of non-empty parts. */
size_t zo_cpu_split(size_t n, size_t parts, size_t align);
void zo_cpu_part(size_t n, size_t parts, size_t align, size_t p, size_t *lo, size_t *hi);

#endif
