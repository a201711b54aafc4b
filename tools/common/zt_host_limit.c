/* The host memory limit (zt_host_limit.h): physical RAM from sysconf,
 * the cgroup limit from /proc/self/cgroup and the cgroup file system. */
#include "zt_host_limit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zo/units.h"

/* A limit file's value; 0 for "max", unreadable or effectively unlimited. */
static uint64_t read_limit(const char *path)
{
    FILE *f = fopen(path, "r");
    char buf[64] = "";
    if (!f)
        return 0;
    char *got = fgets(buf, sizeof buf, f);
    fclose(f);
    if (!got || !strncmp(buf, "max", 3))
        return 0;
    unsigned long long v = strtoull(buf, NULL, 10);
    return v >= (1ull << 60) ? 0 : (uint64_t)v;
}

/* The smallest limit in file `name` of dir and its ancestors up to root. */
static uint64_t walk_up(const char *root, const char *rel, const char *name)
{
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s%s", root, rel);
    uint64_t best = 0;
    for (;;) {
        snprintf(path, sizeof path, "%s/%s", dir, name);
        uint64_t v = read_limit(path);
        if (v && (!best || v < best))
            best = v;
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < strlen(root))
            break;
        *slash = 0;
    }
    return best;
}

uint64_t zt_cgroup_limit(const char *proc_cgroup, const char *cgroup_root)
{
    FILE *f = fopen(proc_cgroup, "r");
    char line[1024], root[1024];
    uint64_t best = 0;
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c1 = *c2 = 0;
        const char *controllers = c1 + 1, *rel = c2 + 1;
        uint64_t v = 0;
        if (!strcmp(line, "0") && !*controllers) { /* v2 */
            v = walk_up(cgroup_root, rel, "memory.max");
        } else if (strstr(controllers, "memory")) { /* v1 */
            snprintf(root, sizeof root, "%s/memory", cgroup_root);
            v = walk_up(root, rel, "memory.limit_in_bytes");
        }
        if (v && (!best || v < best))
            best = v;
    }
    if (f)
        fclose(f);
    return best;
}

uint64_t zt_host_limit(char *why, size_t cap)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    why[0] = 0;
    if (pages <= 0 || page <= 0)
        return 0;
    uint64_t ram = (uint64_t)pages * (uint64_t)page, margin = ram / 10;
    if (margin < (512ull << 20))
        margin = 512ull << 20;
    uint64_t limit = ram > margin ? ram - margin : ram / 2;
    uint64_t cg = zt_cgroup_limit("/proc/self/cgroup", "/sys/fs/cgroup");
    char a[32], b[32];
    if (cg && cg < limit) {
        snprintf(why, cap, "the cgroup's memory limit %s", zo_fmt_bytes(a, sizeof a, cg));
        return cg;
    }
    snprintf(why, cap, "physical RAM %s less %s", zo_fmt_bytes(a, sizeof a, ram),
             zo_fmt_bytes(b, sizeof b, margin));
    return limit;
}
