/* The tcp backend when a rank fails: a rank that never comes, one that dies
 * between collectives, one that lives but never enters a collective, and
 * one that dies inside a send/recv. The survivor fails with a message
 * naming the rank, well before the communicator's timeout where the peer's
 * connection closed, and at the timeout where it stayed silent, and never
 * hangs; after a failure the communicator keeps returning it. Each test
 * forks its ranks (before any thread starts) with the ranks stated in the
 * config and a free port. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "zo/comm.h"
#include "zo/units.h"
#include "zo_internal.h"
#include "zo_test.h"
#include "zo_test_port.h"

#if defined(__SANITIZE_THREAD__)
enum { SILENT_S = 6 };
#else
enum { SILENT_S = 2 };
#endif
enum { LONG_S = 120 }; /* the timeout where a closed connection must be seen first */

typedef struct rank_env {
    zo_device_t dev;
    zo_comm_t c;
    zo_stream_t s;
} rank_env;

/* Joins a world of n as `rank` over tcp; ZO_OK or the failure. */
static zo_status join(rank_env *e, int rank, int n, int port, double timeout_s)
{
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    dc.mem_budget = 16u << 20;
    ZO_TRY(zo_device_init(&e->dev, &dc));
    ZO_TRY(zo_stream_create(e->dev, &e->s));
    zo_comm_config cc = ZO_COMM_CONFIG_INIT;
    cc.backend = "tcp";
    cc.device = e->dev;
    cc.timeout_s = timeout_s;
    cc.launch.rank = rank;
    cc.launch.world_size = n;
    cc.launch.master_addr = "127.0.0.1";
    cc.launch.master_port = port;
    return zo_comm_init(&e->c, &cc);
}

static void leave(rank_env *e)
{
    zo_stream_destroy(e->s);
    zo_comm_free(e->c);
    zo_device_free(e->dev);
}

static zo_status all_reduce(rank_env *e, float *x, size_t cnt)
{
    ZO_TRY(zo_comm_all_reduce(e->c, e->s, x, x, cnt, ZO_DTYPE_F32, ZO_REDUCE_EXACT));
    return zo_stream_synchronize(e->s);
}

/* Rank 1 in a child: joins, takes part in one all-reduce, then does what
 * the scenario says. Never returns. */
static void run_peer(int port, double timeout_s, const char *scenario)
{
    rank_env e;
    float x[1024] = {0};
    if (join(&e, 1, 2, port, timeout_s) || all_reduce(&e, x, 1024))
        _exit(10);
    if (!strcmp(scenario, "die"))
        _exit(3);
    if (!strcmp(scenario, "silent"))
        pause(); /* killed by the test */
    if (!strcmp(scenario, "die-in-recv")) {
        /* takes half of what rank 0 sends, then dies */
        static float big[1 << 20];
        zo_comm_recv(e.c, e.s, big, 1 << 19, ZO_DTYPE_F32, 0);
        zo_stream_synchronize(e.s);
        _exit(3);
    }
    _exit(11);
}

static pid_t start_peer(int port, double timeout_s, const char *scenario)
{
    fflush(NULL);
    pid_t p = fork();
    if (p == 0)
        run_peer(port, timeout_s, scenario);
    assert_true(p > 0);
    return p;
}

static void reap(pid_t p)
{
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
}

static void expect_named(const char *what, const char *scenario)
{
    const char *msg = zo_last_error();
    if (!strstr(msg, "rank 1") || !strstr(msg, what))
        fail_msg("%s: the message does not name rank 1 and '%s': %s", scenario, what, msg);
}

/* A world of two whose rank 1 never starts: the init fails naming it. */
static void peer_that_never_connects_is_named(void **state)
{
    rank_env e;
    uint64_t t0 = zo_now_ns();
    ZO_ASSERT_ST(join(&e, 0, 2, zo_test_free_port(), SILENT_S), ZO_ERR_IO);
    assert_non_null(strstr(zo_last_error(), "rank(s) 1 did not arrive"));
    assert_true((double)(zo_now_ns() - t0) * 1e-9 < SILENT_S + 30);
    zo_stream_destroy(e.s);
    zo_device_free(e.dev);
}

static void peer_that_dies_is_named_at_once(void **state)
{
    int port = zo_test_free_port();
    pid_t p = start_peer(port, LONG_S, "die");
    rank_env e;
    float x[1024] = {0};
    ZO_ASSERT_OK(join(&e, 0, 2, port, LONG_S));
    ZO_ASSERT_OK(all_reduce(&e, x, 1024));
    int ws;
    waitpid(p, &ws, 0);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 3);
    uint64_t t0 = zo_now_ns();
    ZO_ASSERT_ST(all_reduce(&e, x, 1024), ZO_ERR_IO);
    expect_named("closed its connection", "a peer that died");
    /* seen from the closed connection, not at the timeout */
    assert_true((double)(zo_now_ns() - t0) * 1e-9 < LONG_S / 2);
    /* the communicator keeps the error; a barrier does not wait again */
    ZO_ASSERT_OK(zo_comm_barrier(e.c, e.s));
    ZO_ASSERT_ST(zo_stream_synchronize(e.s), ZO_ERR_IO);
    expect_named("closed its connection", "after the failure");
    leave(&e);
}

static void peer_that_never_enters_is_named_at_the_timeout(void **state)
{
    int port = zo_test_free_port();
    pid_t p = start_peer(port, SILENT_S, "silent");
    rank_env e;
    float x[1024] = {0};
    ZO_ASSERT_OK(join(&e, 0, 2, port, SILENT_S));
    ZO_ASSERT_OK(all_reduce(&e, x, 1024));
    uint64_t t0 = zo_now_ns();
    ZO_ASSERT_ST(all_reduce(&e, x, 1024), ZO_ERR_IO);
    double waited = (double)(zo_now_ns() - t0) * 1e-9;
    expect_named("sent nothing within", "a silent peer");
    assert_true(waited >= SILENT_S * 0.9 && waited < SILENT_S + 30);
    reap(p);
    leave(&e);
}

static void peer_that_dies_inside_a_send_is_named(void **state)
{
    int port = zo_test_free_port();
    pid_t p = start_peer(port, LONG_S, "die-in-recv");
    rank_env e;
    float x[1024] = {0};
    ZO_ASSERT_OK(join(&e, 0, 2, port, LONG_S));
    ZO_ASSERT_OK(all_reduce(&e, x, 1024));
    size_t cnt = (size_t)16 << 20; /* far more than the socket buffers hold */
    float *big = calloc(cnt, sizeof(float));
    uint64_t t0 = zo_now_ns();
    ZO_ASSERT_OK(zo_comm_send(e.c, e.s, big, cnt, ZO_DTYPE_F32, 1));
    ZO_ASSERT_ST(zo_stream_synchronize(e.s), ZO_ERR_IO);
    expect_named("closed its connection", "a peer that died in a recv");
    assert_true((double)(zo_now_ns() - t0) * 1e-9 < LONG_S / 2);
    free(big);
    reap(p);
    leave(&e);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(peer_that_never_connects_is_named),
        cmocka_unit_test(peer_that_dies_is_named_at_once),
        cmocka_unit_test(peer_that_never_enters_is_named_at_the_timeout),
        cmocka_unit_test(peer_that_dies_inside_a_send_is_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
