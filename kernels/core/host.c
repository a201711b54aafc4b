/* Host-side runtime helpers: large allocations on huge pages, and the CPUs
 * the process may run on (as opposed to those of the calling thread). */
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "zo_internal.h"

#define HUGE_PAGE ((size_t)2 << 20)

void *zo_huge_alloc(size_t bytes)
{
    if (bytes < HUGE_PAGE) return aligned_alloc(4096, zo_round_up(bytes ? bytes : 1, 4096));
    size_t len = zo_round_up(bytes, HUGE_PAGE);
    void *p = aligned_alloc(HUGE_PAGE, len);
    /* A refusal (THP off, or no madvise) only means small pages. */
    if (p) (void)madvise(p, len, MADV_HUGEPAGE);
    return p;
}

/* The main thread's mask as the library was loaded, before the program (or
 * an OpenMP runtime binding its threads) could narrow it. */
static cpu_set_t load_cpus;
static int have_load_cpus;

__attribute__((constructor)) static void capture_load_cpus(void)
{
    have_load_cpus = sched_getaffinity(getpid(), sizeof load_cpus, &load_cpus) == 0;
}

int zo_process_cpus(cpu_set_t *set)
{
    /* The main thread's mask now (pid = its tid), whichever thread asks. */
    if (sched_getaffinity(getpid(), sizeof *set, set) != 0 &&
        sched_getaffinity(0, sizeof *set, set) != 0)
        return -1;
    if (have_load_cpus) CPU_OR(set, set, &load_cpus);
    return 0;
}
