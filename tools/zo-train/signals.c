/* zo-train's stop signals: a flag the training loop reads between steps,
 * set by a thread of their own (sigwait) or by a handler on threads older
 * than main. */
#include "signals.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "zt_error.h"

static atomic_int g_pending;
static sigset_t g_set;

const char *zt_signal_name(int sig)
{
    return sig == SIGINT    ? "SIGINT"
           : sig == SIGTERM ? "SIGTERM"
           : sig == SIGHUP  ? "SIGHUP"
                            : "signal";
}

static void say(const char *a, const char *b)
{
    /* write(2): stderr's FILE lock may be held by the thread printing. */
    ssize_t r = write(STDERR_FILENO, a, strlen(a));
    r = write(STDERR_FILENO, b, strlen(b));
    (void)r;
}

/* The first signal asks the loop to stop; a second SIGINT leaves at once
 * (the swap files it leaves are stale, with their locks free: the next run
 * takes them over). Async-signal-safe. */
static void on_stop_signal(int sig)
{
    int none = 0;
    if (atomic_compare_exchange_strong(&g_pending, &none, sig)) {
        say("\nzo-train: ", zt_signal_name(sig));
        say(": stopping after the step in progress (a second SIGINT exits at once)\n", "");
    } else if (sig == SIGINT) {
        say("\nzo-train: second SIGINT: exiting at once\n", "");
        _exit(128 + SIGINT);
    }
}

static void *watch(void *arg)
{
    (void)arg;
    for (;;) {
        int sig = 0;
        if (sigwait(&g_set, &sig) == 0)
            on_stop_signal(sig);
    }
    return NULL;
}

/* Threads that existed before main (a BLAS library's pool) do not block the
 * signals: on them the handler runs. Every later thread blocks them and the
 * watcher takes them with sigwait, so no system call of the engine's threads
 * is interrupted. */
int zt_signals_start(void)
{
    sigemptyset(&g_set);
    sigaddset(&g_set, SIGINT);
    sigaddset(&g_set, SIGTERM);
    sigaddset(&g_set, SIGHUP);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sa.sa_mask = g_set;
    int rc = 0;
    for (int sig = 1; sig < 32 && rc == 0; sig++)
        if (sigismember(&g_set, sig) && sigaction(sig, &sa, NULL) != 0)
            rc = errno;
    if (rc == 0)
        rc = pthread_sigmask(SIG_BLOCK, &g_set, NULL);
    pthread_t t;
    if (rc == 0)
        rc = pthread_create(&t, NULL, watch, NULL);
    if (rc == 0)
        rc = pthread_detach(t);
    if (rc != 0)
        return zt_fail(ZO_ERR_SYSTEM, "cannot set up signal handling: %s", strerror(rc));
    return 0;
}

int zt_signal_pending(void)
{
    return atomic_load(&g_pending);
}
