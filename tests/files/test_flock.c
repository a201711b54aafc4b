/* zo_flock.h: when a lock's recorded holder counts as gone, so that the
 * next run waits for the lock instead of refusing at once. A live process
 * is not gone; a dead pid is; a zombie is; a live pid whose start time is
 * not the recorded one (the holder died and a later process took its pid,
 * as a killed rank's did under load in CI) is; an owner recorded without a
 * start time (older lock files, swap headers) keeps the pid-only answer. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "zo_flock.h"
#include "zo_test.h"

static void test_self_is_not_gone(void **state)
{
    zo_lock_owner me;
    zo_lock_owner_self(&me);
    assert_int_equal(me.pid, (uint32_t)getpid());
    assert_true(me.start > 0); /* /proc is there on Linux */
    assert_false(zo_lock_owner_gone(&me));
    me.start = 0; /* not recorded: the pid alone */
    assert_false(zo_lock_owner_gone(&me));
}

static void test_reused_pid_is_gone(void **state)
{
    zo_lock_owner me;
    zo_lock_owner_self(&me);
    me.start += 1; /* this pid, but not the process that recorded it */
    assert_true(zo_lock_owner_gone(&me));
}

static void test_other_host_is_never_gone(void **state)
{
    zo_lock_owner me;
    zo_lock_owner_self(&me);
    me.start += 1;
    snprintf(me.host, sizeof me.host, "%s", "not-this-host.example");
    assert_false(zo_lock_owner_gone(&me)); /* its pids are not ours to judge */
}

static void test_dead_and_zombie_are_gone(void **state)
{
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0)
        _exit(0);
    zo_lock_owner o;
    zo_lock_owner_self(&o);
    o.pid = (uint32_t)child;
    o.start = 0;
    /* not reaped yet: a zombie, which holds no files */
    for (int i = 0; i < 200; i++) {
        char path[64], text[256] = "";
        snprintf(path, sizeof path, "/proc/%d/stat", (int)child);
        FILE *f = fopen(path, "r");
        if (f) {
            size_t n = fread(text, 1, sizeof text - 1, f);
            text[n] = 0;
            fclose(f);
        }
        const char *p = strrchr(text, ')');
        if (p && p[2] == 'Z')
            break;
        usleep(10000);
    }
    assert_true(zo_lock_owner_gone(&o));
    assert_int_equal(waitpid(child, NULL, 0), child);
    assert_true(zo_lock_owner_gone(&o)); /* reaped: no such pid */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_self_is_not_gone),
        cmocka_unit_test(test_reused_pid_is_gone),
        cmocka_unit_test(test_other_host_is_never_gone),
        cmocka_unit_test(test_dead_and_zombie_are_gone),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
