/* Exclusive file locks that name their holder (see zo_flock.h). */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "zo_flock.h"

void zo_lock_owner_self(zo_lock_owner *o)
{
    memset(o, 0, sizeof *o);
    o->pid = (uint32_t)getpid();
    gethostname(o->host, sizeof o->host - 1);
}

int zo_lock_owner_gone(const zo_lock_owner *o)
{
    char host[sizeof o->host] = "";
    gethostname(host, sizeof host - 1);
    return o->pid > 0 && !strncmp(host, o->host, sizeof host) && kill((pid_t)o->pid, 0) != 0 &&
           errno == ESRCH;
}

int zo_flock_take(int fd, zo_lock_owner_fn read_owner)
{
    if (flock(fd, LOCK_EX | LOCK_NB) == 0)
        return 1;
    zo_lock_owner o;
    if (!read_owner(fd, &o) || !zo_lock_owner_gone(&o))
        return 0;
    for (int i = 0; i < 500; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            return 1;
    }
    return 0;
}
