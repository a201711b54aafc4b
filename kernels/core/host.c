/* Host-side runtime helpers: large allocations on huge pages, and the CPUs
 * the process may run on (as opposed to those of the calling thread). */
#include <hwloc.h>
#include <hwloc/glibc-sched.h>
#include <pthread.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#include "zo_internal.h"

#define HUGE_PAGE ((size_t)2 << 20)

void *zo_huge_alloc(size_t bytes)
{
    if (bytes < HUGE_PAGE)
        return aligned_alloc(4096, zo_round_up(bytes ? bytes : 1, 4096));
    size_t len = zo_round_up(bytes, HUGE_PAGE);
    void *p = aligned_alloc(HUGE_PAGE, len);
    /* A refusal (THP off, or no madvise) only means small pages. */
    if (p)
        (void)madvise(p, len, MADV_HUGEPAGE);
    return p;
}

/* Fresh anonymous pages: the kernel hands them over zeroed, on first touch
 * by whichever thread touches them (so the optimizer workers that stream the
 * states place them on their own node), and nothing is written twice. One
 * page before the block records the mapping's length for zo_huge_free. */
void *zo_huge_zalloc(size_t bytes)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t align = bytes >= HUGE_PAGE ? HUGE_PAGE : page;
    size_t len = zo_round_up(bytes ? bytes : 1, align);
    size_t span = page + len + (align - page);
    char *base = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED)
        return NULL;
    char *p = (char *)zo_round_up((uintptr_t)base + page, align);
    char *head = p - page, *end = base + span;
    if (head > base)
        (void)munmap(base, (size_t)(head - base));
    if (end > p + len)
        (void)munmap(p + len, (size_t)(end - (p + len)));
    ((size_t *)head)[0] = len;
    if (align == HUGE_PAGE) /* a refusal (THP off) only means small pages */
        (void)madvise(p, len, MADV_HUGEPAGE);
    return p;
}

void zo_huge_free(void *p)
{
    if (!p)
        return;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *head = (char *)p - page;
    (void)munmap(head, ((size_t *)head)[0] + page);
}

/* The main thread's mask as the library was loaded, before the program (or
 * an OpenMP runtime binding its threads) could narrow it. */
static cpu_set_t load_cpus;
static int have_load_cpus;

__attribute__((constructor)) static void capture_load_cpus(void)
{
    have_load_cpus = sched_getaffinity(getpid(), sizeof load_cpus, &load_cpus) == 0;
}

/* Whether an OpenMP runtime was asked to bind its threads, the main thread
 * among them, possibly before this library was loaded. */
static int openmp_binds(void)
{
    const char *bind = getenv("OMP_PROC_BIND");
    return (bind && *bind && strcasecmp(bind, "false") != 0) || getenv("OMP_PLACES") ||
           getenv("GOMP_CPU_AFFINITY") || getenv("KMP_AFFINITY");
}

/* The CPUs the system lets the process use (its cgroup's cpuset, not any
 * thread's binding), as hwloc reads them. */
static int system_allowed_cpus(cpu_set_t *set)
{
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0)
        return -1;
    int rc = hwloc_topology_load(topo);
    if (rc == 0)
        rc = hwloc_cpuset_to_glibc_sched_affinity(topo, hwloc_topology_get_allowed_cpuset(topo),
                                                  set, sizeof *set);
    hwloc_topology_destroy(topo);
    return rc;
}

int zo_process_cpus(cpu_set_t *set)
{
    /* The main thread's mask now (pid = its tid), whichever thread asks. */
    if (sched_getaffinity(getpid(), sizeof *set, set) != 0 &&
        sched_getaffinity(0, sizeof *set, set) != 0)
        return -1;
    if (have_load_cpus)
        CPU_OR(set, set, &load_cpus);
    /* An OpenMP runtime initialized first has bound the main thread before
     * the mask above was read: what the system allows is the process's set. */
    cpu_set_t sys;
    if (openmp_binds() && system_allowed_cpus(&sys) == 0)
        CPU_OR(set, set, &sys);
    return 0;
}
