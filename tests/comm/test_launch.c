/* Rank discovery from each launcher's variables and from the configuration,
 * conflicts refused by name, the TCP rendezvous on localhost (threads play
 * the ranks; a rank that never comes is named), and the self backend's
 * collectives and configuration check. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "zo/comm.h"
#include "zo/launch.h"
#include "zo_test.h"
#include "zo_test_port.h"

static const char *const all_vars[] = {
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
};

static int clear_env(void **state)
{
    for (size_t i = 0; i < sizeof all_vars / sizeof all_vars[0]; i++)
        unsetenv(all_vars[i]);
    return 0;
}

static zo_status discover(zo_rank_info *ri)
{
    *ri = (zo_rank_info)ZO_RANK_INFO_INIT;
    return zo_launch_discover(NULL, ri);
}

static void no_launcher_is_one_rank(void **state)
{
    zo_rank_info ri;
    ZO_ASSERT_OK(discover(&ri));
    assert_int_equal(ri.rank, 0);
    assert_int_equal(ri.world_size, 1);
    assert_string_equal(ri.launcher, "none");
    assert_string_equal(ri.master_addr, "127.0.0.1");
    assert_int_equal(ri.master_port, 29500);
}

typedef struct launcher_case {
    const char *name, *rank, *size, *local;
} launcher_case;

static const launcher_case launchers[] = {
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
};

static void each_launcher_is_read(void **state)
{
    for (size_t i = 0; i < sizeof launchers / sizeof launchers[0]; i++) {
        clear_env(NULL);
        setenv(launchers[i].rank, "5", 1);
        setenv(launchers[i].size, "8", 1);
        setenv(launchers[i].local, "1", 1);
        zo_rank_info ri;
        ZO_ASSERT_OK(discover(&ri));
        assert_string_equal(ri.launcher, launchers[i].name);
        assert_int_equal(ri.rank, 5);
        assert_int_equal(ri.world_size, 8);
        assert_int_equal(ri.local_rank, 1);
    }
}

static void torchrun_master_is_read(void **state)
{
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "node7", 1);
    setenv("MASTER_PORT", "1234", 1);
    zo_rank_info ri;
    ZO_ASSERT_OK(discover(&ri));
    assert_string_equal(ri.master_addr, "node7");
    assert_int_equal(ri.master_port, 1234);
    assert_int_equal(ri.local_rank, 1); /* not given: one node */
}

static void assert_refused_naming(const char *a, const char *b)
{
    zo_rank_info ri;
    ZO_ASSERT_ST(discover(&ri), ZO_ERR_CONFIG);
    const char *msg = zo_last_error();
    if (!strstr(msg, a) || (b && !strstr(msg, b)))
        fail_msg("message does not name %s and %s: %s", a, b ? b : "", msg);
}

static void conflicting_launchers_are_refused(void **state)
{
    setenv("OMPI_COMM_WORLD_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("RANK", "2", 1);
    setenv("WORLD_SIZE", "4", 1);
    assert_refused_naming("OMPI_COMM_WORLD_RANK", "RANK=2");
    clear_env(NULL);
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "2", 1);
    setenv("WORLD_SIZE", "3", 1);
    setenv("RANK", "0", 1);
    assert_refused_naming("SLURM_NTASKS", "WORLD_SIZE");
}

/* mpirun inside an sbatch allocation: SLURM_PROCID is the batch step's. */
static void mpirun_inside_allocation_wins(void **state)
{
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "1", 1);
    zo_rank_info ri;
    ZO_ASSERT_OK(discover(&ri));
    assert_string_equal(ri.launcher, "mpirun");
    assert_int_equal(ri.rank, 3);
}

static void bad_values_are_refused(void **state)
{
    setenv("RANK", "1", 1);
    assert_refused_naming("WORLD_SIZE", "RANK");
    setenv("WORLD_SIZE", "two", 1);
    assert_refused_naming("WORLD_SIZE='two'", NULL);
    setenv("WORLD_SIZE", "1", 1);
    assert_refused_naming("RANK=1", "WORLD_SIZE=1");
}

static void config_against_environment(void **state)
{
    zo_launch_config cfg = ZO_LAUNCH_CONFIG_INIT;
    cfg.rank = 1;
    cfg.world_size = 2;
    zo_rank_info ri = ZO_RANK_INFO_INIT;
    ZO_ASSERT_OK(zo_launch_discover(&cfg, &ri));
    assert_string_equal(ri.launcher, "config");
    assert_int_equal(ri.rank, 1);
    setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    ZO_ASSERT_ST(zo_launch_discover(&cfg, &ri), ZO_ERR_CONFIG);
    assert_non_null(strstr(zo_last_error(), "config rank=1"));
    assert_non_null(strstr(zo_last_error(), "OMPI_COMM_WORLD_RANK=0"));
    setenv("MASTER_PORT", "4000", 1);
    clear_env(NULL);
    setenv("MASTER_PORT", "4000", 1);
    cfg.master_port = 4001;
    ZO_ASSERT_ST(zo_launch_discover(&cfg, &ri), ZO_ERR_CONFIG);
    assert_non_null(strstr(zo_last_error(), "MASTER_PORT=4000"));
}

/* ---- the TCP rendezvous: threads as ranks ---- */

typedef struct rank_thread {
    zo_rank_info ri;
    uint64_t mine, all[8];
    double timeout_s;
    zo_status st;
    char msg[512];
} rank_thread;

static void *rank_main(void *arg)
{
    rank_thread *t = arg;
    t->st = zo_launch_rendezvous(&t->ri, &t->mine, t->all, sizeof t->mine, t->timeout_s);
    snprintf(t->msg, sizeof t->msg, "%s", zo_last_error());
    return NULL;
}

/* Runs ranks [0, arrive) of an n-rank world; returns rank 0's status. */
static void run_ranks(rank_thread *t, int n, int arrive, double timeout_s)
{
    int port = zo_test_free_port();
    pthread_t th[8];
    for (int r = 0; r < arrive; r++) {
        t[r] = (rank_thread){
            .ri = ZO_RANK_INFO_INIT, .mine = 1000u + (uint64_t)r * 7u, .timeout_s = timeout_s};
        t[r].ri.rank = r;
        t[r].ri.world_size = n;
        snprintf(t[r].ri.master_addr, sizeof t[r].ri.master_addr, "127.0.0.1");
        t[r].ri.master_port = port;
    }
    /* The last rank first: the others must wait for rank 0 to listen. */
    for (int r = arrive - 1; r >= 0; r--)
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &t[r]), 0);
    for (int r = 0; r < arrive; r++)
        pthread_join(th[r], NULL);
}

static void rendezvous_gathers_in_rank_order(void **state)
{
    rank_thread t[4];
    run_ranks(t, 4, 4, 10.0);
    for (int r = 0; r < 4; r++) {
        if (t[r].st != ZO_OK)
            fail_msg("rank %d: %s", r, t[r].msg);
        for (int q = 0; q < 4; q++)
            assert_int_equal(t[r].all[q], 1000u + (uint64_t)q * 7u);
    }
}

static void rendezvous_names_a_missing_rank(void **state)
{
    rank_thread t[3];
    run_ranks(t, 3, 2, 0.5);
    assert_int_equal(t[0].st, ZO_ERR_IO);
    if (!strstr(t[0].msg, "rank(s) 2 did not arrive"))
        fail_msg("rank 0 does not name rank 2: %s", t[0].msg);
    assert_int_equal(t[1].st, ZO_ERR_IO);
    assert_non_null(strstr(t[1].msg, "rank 1: rendezvous with rank 0 failed"));
}

/* ---- the self backend ---- */

static void self_backend_copies_in_stream_order(void **state)
{
    zo_device_t dev;
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    ZO_ASSERT_OK(zo_device_init(&dev, &dc));
    zo_comm_config cc = ZO_COMM_CONFIG_INIT;
    cc.device = dev;
    zo_comm_t c;
    ZO_ASSERT_OK(zo_comm_init(&c, &cc));
    assert_string_equal(zo_comm_backend(c), "self");
    assert_int_equal(zo_comm_takes_host_memory(c), 1);
    assert_int_equal(zo_comm_takes_host_memory(NULL), 0);
    zo_stream_t s;
    ZO_ASSERT_OK(zo_stream_create(dev, &s));
    float a[64], b[64], g[64];
    for (int i = 0; i < 64; i++)
        a[i] = (float)i * 0.5f;
    ZO_ASSERT_OK(zo_comm_all_reduce(c, s, a, b, 64, ZO_DTYPE_F32, ZO_REDUCE_EXACT));
    ZO_ASSERT_OK(zo_comm_reduce(c, s, b, b, 64, ZO_DTYPE_F32, 0, ZO_REDUCE_FAST));
    ZO_ASSERT_OK(zo_comm_all_gather(c, s, b, g, 64, ZO_DTYPE_F32));
    ZO_ASSERT_OK(zo_comm_barrier(c, s));
    ZO_ASSERT_OK(zo_stream_synchronize(s));
    assert_memory_equal(a, g, sizeof a);
    ZO_ASSERT_ST(zo_comm_send(c, s, a, 4, ZO_DTYPE_F32, 0), ZO_ERR_INVALID_ARG);
    ZO_ASSERT_ST(zo_comm_all_reduce(c, s, a, b, 4, ZO_DTYPE_I32, ZO_REDUCE_FAST),
                 ZO_ERR_INVALID_ARG);
    const char *keys[] = {"lr", "zero_stage"}, *values[] = {"0.001", "2"};
    ZO_ASSERT_OK(zo_comm_check_config(c, keys, values, 2));
    zo_comm_t sub;
    ZO_ASSERT_OK(zo_comm_split(c, 3, 0, &sub));
    assert_int_equal(zo_comm_size(sub), 1);
    zo_comm_free(sub);
    ZO_ASSERT_OK(zo_stream_destroy(s));
    zo_comm_free(c);
    zo_device_free(dev);
}

static void self_backend_refuses_many_ranks(void **state)
{
    zo_device_t dev;
    zo_device_config dc = ZO_DEVICE_CONFIG_INIT;
    dc.backend = "cpu";
    ZO_ASSERT_OK(zo_device_init(&dev, &dc));
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "2", 1);
    zo_comm_config cc = ZO_COMM_CONFIG_INIT;
    cc.device = dev;
    cc.backend = "self";
    zo_comm_t c;
    ZO_ASSERT_ST(zo_comm_init(&c, &cc), ZO_ERR_CONFIG);
    assert_non_null(strstr(zo_last_error(), "world size 2"));
    cc.backend = "gloo";
    ZO_ASSERT_ST(zo_comm_init(&c, &cc), ZO_ERR_CONFIG);
    assert_non_null(strstr(zo_last_error(), "use auto, host, self, tcp, mpi or nccl"));
    zo_device_free(dev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(no_launcher_is_one_rank, clear_env),
        cmocka_unit_test_setup(each_launcher_is_read, clear_env),
        cmocka_unit_test_setup(torchrun_master_is_read, clear_env),
        cmocka_unit_test_setup(conflicting_launchers_are_refused, clear_env),
        cmocka_unit_test_setup(mpirun_inside_allocation_wins, clear_env),
        cmocka_unit_test_setup(bad_values_are_refused, clear_env),
        cmocka_unit_test_setup(config_against_environment, clear_env),
        cmocka_unit_test(rendezvous_gathers_in_rank_order),
        cmocka_unit_test(rendezvous_names_a_missing_rank),
        cmocka_unit_test_setup(self_backend_copies_in_stream_order, clear_env),
        cmocka_unit_test_setup(self_backend_refuses_many_ranks, clear_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
