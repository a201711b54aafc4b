/* Registering a model holds no initial values: zo-train's trainer set up on
 * the cpu device with parameters and optimizer states on NVMe, for a model
 * of 2 and of 18 blocks, in child processes whose peak resident memory the
 * parent reads (wait4). What the peak grows by beyond the engine's own
 * pinned and pageable bytes (its footprint, which for these homes grows
 * only by the gradients it keeps) stays under a quarter of what holding the
 * fp32 initial values of the 16 extra blocks would add. Before registration
 * streamed, the engine copied every tensor's values at registration and
 * held them until finalize: that alone grew the peak by 4 bytes a
 * parameter. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "train_test_util.h"
#include "trainer.h"
#include "zo_test.h"
#include "zt_error.h"

static char g_swap[256];

typedef struct setup_peak {
    uint64_t rss;    /* the child's peak resident bytes */
    uint64_t engine; /* the engine's planned pinned + pageable bytes */
    uint64_t params;
} setup_peak;

/* A model of `layers` blocks of dim 256: about 0.8M parameters a block. */
static zt_options wide_options(int layers)
{
    zt_options o = zt_test_small_options(g_swap, 1);
    o.shape.dim = 256;
    o.shape.n_heads = 4;
    o.shape.ffn_dim = 768;
    o.shape.n_layers = layers;
    o.param_home = ZO_TIER_NVME;
    o.optim_home = ZO_TIER_NVME;
    o.device_mem = 96u << 20;
    return o;
}

/* The trainer set up (every tensor registered and placed) in a child. */
static setup_peak set_up(int layers)
{
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fd[0]);
        zt_options o = wide_options(layers);
        zt_trainer *t = NULL;
        if (zt_trainer_init(&t, &o) < 0) {
            fprintf(stderr, "zt_trainer_init: %s\n", zt_last_error());
            _exit(2);
        }
        const zt_setup *su = zt_trainer_setup(t);
        uint64_t v[2] = {su->footprint.pinned + su->footprint.bytes[ZO_TIER_HOST], su->n_params};
        ssize_t w = write(fd[1], v, sizeof v);
        zt_trainer_free(t);
        _exit(w == (ssize_t)sizeof v ? 0 : 3);
    }
    close(fd[1]);
    uint64_t v[2] = {0, 0};
    ssize_t got = read(fd[0], v, sizeof v);
    close(fd[0]);
    int status = 0;
    struct rusage ru;
    assert_int_equal(wait4(pid, &status, 0, &ru), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(got, (ssize_t)sizeof v);
    setup_peak p = {(uint64_t)ru.ru_maxrss * 1024, v[0], v[1]};
    print_message("%d blocks: %llu parameters, peak RSS %llu KiB, engine %llu KiB\n", layers,
                  (unsigned long long)p.params, (unsigned long long)(p.rss >> 10),
                  (unsigned long long)(p.engine >> 10));
    return p;
}

static void test_registration_does_not_grow_the_peak(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    skip(); /* sanitizers keep freed memory and shadow bytes of their own */
#endif
    setup_peak small = set_up(2), big = set_up(18);
    uint64_t more_params = big.params - small.params;
    assert_true(more_params > 12000000);
    int64_t beyond = (int64_t)(big.rss - small.rss) - (int64_t)(big.engine - small.engine);
    print_message("the peak grew by %lld KiB beyond the engine's bytes; the extra blocks' fp32 "
                  "values are %llu KiB\n",
                  (long long)(beyond / 1024), (unsigned long long)(4 * more_params >> 10));
    assert_true(beyond < (int64_t)more_params);
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_swap, sizeof g_swap, "/tmp/zt-register-XXXXXX");
    return mkdtemp(g_swap) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_swap);
    return system(cmd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registration_does_not_grow_the_peak),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
