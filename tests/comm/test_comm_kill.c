/* A rank that dies, or hangs, while the others are inside a collective:
 * they fail within the watchdog's bound with a message naming it, and never
 * hang. Run without mpirun's variables, this program is the driver: it
 * starts itself under `mpirun -np 3 --mca orte_abort_on_non_zero_status 0`
 * (so that mpirun does not kill the survivors first, as it does by default)
 * once per scenario and checks that both survivors report "ok". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "zo/comm.h"
#include "zo/units.h"

/* TSan slows the ranks several-fold: a rank that finishes the first
 * collective late is still heartbeating for much of a 2 s timeout, and was
 * then reported hung instead of lost (seen in CI's TSan run). */
#if defined(__SANITIZE_THREAD__)
enum { TIMEOUT_S = 8 };
#else
enum { TIMEOUT_S = 2 };
#endif
enum { BOUND_S = 3 * TIMEOUT_S + 5 };

static int run_rank(const char *scenario)
{
    int hang = !strcmp(scenario, "hang");
    const char *want = hang ? "rank(s) 1 answer but have not entered it" : "lost rank(s) 1";
    zo_device_t dev;
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    zo_comm_config cc = ZO_COMM_CONFIG_INIT;
    cc.backend = "mpi";
    cc.timeout_s = TIMEOUT_S;
    zo_comm_t c;
    zo_stream_t s;
    if (zo_device_init(&dev, &dc) || (cc.device = dev, zo_comm_init(&c, &cc)) ||
        zo_stream_create(dev, &s)) {
        printf("rank ?: FAIL setup: %s\n", zo_last_error());
        return 1;
    }
    int me = zo_comm_rank(c);
    size_t cnt = 1u << 20;
    float *x = calloc(cnt, sizeof(float));
    zo_comm_barrier(c, s);
    zo_comm_all_reduce(c, s, x, x, cnt, ZO_DTYPE_F32, ZO_REDUCE_EXACT);
    if (zo_stream_synchronize(s)) {
        printf("rank %d: FAIL the first all-reduce: %s\n", me, zo_last_error());
        return 1;
    }
    if (me == 1) {
        /* Dies, or stops issuing collectives, while the others are inside
         * the next one (dying within its own part of it could come too late:
         * its part may be done before it dies). */
        struct timespec ts = {hang ? 2 * TIMEOUT_S + 1 : 0, 200000000};
        nanosleep(&ts, NULL);
        _exit(hang ? 0 : 3);
    }
    uint64_t t0 = zo_now_ns();
    zo_comm_all_reduce(c, s, x, x, cnt, ZO_DTYPE_F32, ZO_REDUCE_EXACT);
    zo_status st = zo_stream_synchronize(s);
    double waited = (double)(zo_now_ns() - t0) * 1e-9;
    const char *msg = zo_last_error();
    if (st == ZO_OK)
        printf("rank %d: FAIL the collective succeeded without rank 1\n", me);
    else if (!strstr(msg, want))
        printf("rank %d: FAIL the message does not say '%s': %s\n", me, want, msg);
    else if (waited > BOUND_S)
        printf("rank %d: FAIL took %.1f s, more than %d s\n", me, waited, BOUND_S);
    else
        printf("survivor %d: ok after %.1f s: %s\n", me, waited, msg);
    fflush(stdout);
    zo_stream_destroy(s);
    zo_comm_free(c);
    zo_device_free(dev);
    return 0;
}

static int drive(const char *mpiexec, const char *self, const char *scenario)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "timeout 120 %s --oversubscribe --mca orte_abort_on_non_zero_status 0 -np 3 %s %s "
             "2>&1",
             mpiexec, self, scenario);
    FILE *p = popen(cmd, "r");
    if (!p) {
        perror("popen");
        return 1;
    }
    char line[2048];
    int ok = 0, bad = 0;
    while (fgets(line, sizeof line, p)) {
        fputs(line, stdout);
        ok += strncmp(line, "survivor ", 9) == 0 && strstr(line, ": ok after ") != NULL;
        bad += strstr(line, ": FAIL") != NULL;
    }
    pclose(p);
    printf("test_comm_kill %s: %d of 2 survivors named rank 1 in time, %d failures\n", scenario, ok,
           bad);
    return ok == 2 && !bad ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (getenv("OMPI_COMM_WORLD_RANK"))
        return run_rank(argc > 1 ? argv[1] : "die");
    if (argc < 2) {
        fprintf(stderr, "usage: test_comm_kill MPIEXEC\n");
        return 2;
    }
    int died = drive(argv[1], argv[0], "die");
    return drive(argv[1], argv[0], "hang") || died;
}
