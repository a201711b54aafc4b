/* Exclusive file locks that name their holder (see zo_flock.h). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "zo_flock.h"

/* A process's state letter and start time (clock ticks after boot) from
 * /proc/PID/stat; 0 when it cannot be read. The command name, field 2, may
 * hold spaces and parentheses, so the fields after it are read from the
 * last ')'. */
static int proc_stat(uint32_t pid, char *state, uint64_t *start)
{
    char path[64], text[1024];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    const char *p = strrchr(text, ')');
    unsigned long long st = 0;
    /* after ") ": state, then fields 4..21, then the start time (field 22) */
    if (!p || sscanf(p + 1,
                     " %c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s "
                     "%*s %*s %llu",
                     state, &st) != 2)
        return 0;
    *start = st;
    return 1;
}

void zo_lock_owner_self(zo_lock_owner *o)
{
    memset(o, 0, sizeof *o);
    o->pid = (uint32_t)getpid();
    gethostname(o->host, sizeof o->host - 1);
    char state;
    (void)proc_stat(o->pid, &state, &o->start); /* left 0 where /proc cannot say */
}

int zo_lock_owner_gone(const zo_lock_owner *o)
{
    char host[sizeof o->host] = "";
    gethostname(host, sizeof host - 1);
    if (o->pid == 0 || strncmp(host, o->host, sizeof host) != 0)
        return 0;
    if (kill((pid_t)o->pid, 0) != 0 && errno == ESRCH)
        return 1;
    char state;
    uint64_t start;
    if (!proc_stat(o->pid, &state, &start))
        return 0;
    /* a zombie holds no files; a pid reused under load (seen in CI: a killed
     * rank's pid alive again a moment later) is another process */
    return state == 'Z' || state == 'X' || (o->start && start != o->start);
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
