/* zo-bench io's peer: fio run on the same directory, with the same size,
 * block size, queue depth and direction, in its best configuration for
 * this kind of transfer (io_uring, O_DIRECT, buffers on huge pages,
 * registered buffers and files), so that the store's figure comes with a
 * ratio against what the disk gives a tuned reader or writer in the same
 * run. fio is started as a child process and its JSON report read back. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_fio.h"

extern char **environ;

/* Whether an executable fio is on PATH. */
int bench_fio_found(void)
{
    const char *path = getenv("PATH");
    if (!path)
        return 0;
    char dir[4096];
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, ":");
        if (n && n < sizeof dir - 5) {
            snprintf(dir, sizeof dir, "%.*s/fio", (int)n, p);
            if (access(dir, X_OK) == 0)
                return 1;
        }
        p += n + (p[n] == ':');
    }
    return 0;
}

/* The last line fio wrote to stderr, for the reason it failed. */
static void last_line(const char *file, char *why, size_t cap)
{
    FILE *f = fopen(file, "r");
    char line[512];
    why[0] = '\0';
    while (f && fgets(line, sizeof line, f))
        if (strspn(line, " \t\n") < strlen(line))
            snprintf(why, cap, "%.*s", (int)strcspn(line, "\n"), line);
    if (f)
        fclose(f);
}

/* Runs argv (fio), its stdout to out_file and its stderr to err_file;
 * returns its exit status, or -1 when it could not be started. */
static int run_child(char *const argv[], const char *out_file, const char *err_file)
{
    posix_spawn_file_actions_t fa;
    if (posix_spawn_file_actions_init(&fa))
        return -1;
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out_file, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, err_file, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc)
        return -1;
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* bw_bytes of the job's read or write part in fio's JSON report. */
static int parse_report(const char *file, int write, double *gbps)
{
    json_error_t err;
    json_t *root = json_load_file(file, 0, &err);
    json_t *job = json_array_get(json_object_get(root, "jobs"), 0);
    json_t *bw = json_object_get(json_object_get(job, write ? "write" : "read"), "bw_bytes");
    int ok = json_is_number(bw) && json_number_value(bw) > 0;
    if (ok)
        *gbps = json_number_value(bw) / 1e9;
    json_decref(root);
    return ok ? 0 : -1;
}

/* The command line of one run; args holds the option strings. */
static void build_argv(const bench_fio_job *j, int huge, char args[8][96], char *argv[24])
{
    int n = 0;
    argv[n++] = "fio";
    argv[n++] = "--name=zo-bench-fio";
    snprintf(args[0], sizeof args[0], "--size=%" PRIu64, j->size);
    snprintf(args[1], sizeof args[1], "--bs=%" PRIu64, j->bs);
    snprintf(args[2], sizeof args[2], "--iodepth=%" PRIu64, j->qd);
    snprintf(args[3], sizeof args[3], "--rw=%s", j->write ? "write" : "read");
    snprintf(args[4], sizeof args[4], "--mem=%s", huge ? "shmhuge" : "malloc");
    for (int k = 0; k < 5; k++)
        argv[n++] = args[k];
    argv[n++] = "--directory";
    argv[n++] = (char *)j->dir;
    argv[n++] = "--ioengine=io_uring";
    argv[n++] = "--direct=1";
    argv[n++] = "--fixedbufs";
    argv[n++] = "--registerfiles";
    argv[n++] = "--numjobs=1";
    argv[n++] = "--output-format=json";
    argv[n] = NULL;
}

int bench_fio_run(const bench_fio_job *j, int huge, double *gbps, char *why, size_t cap)
{
    char out[] = "/tmp/zo-bench-fio-out.XXXXXX", err[] = "/tmp/zo-bench-fio-err.XXXXXX";
    int fo = mkstemp(out), fe = fo >= 0 ? mkstemp(err) : -1;
    if (fo < 0 || fe < 0) {
        snprintf(why, cap, "cannot create a temporary file in /tmp: %s", strerror(errno));
        if (fo >= 0)
            close(fo), unlink(out);
        return -1;
    }
    close(fo);
    close(fe);
    char args[8][96], *argv[24];
    build_argv(j, huge, args, argv);
    int rc = run_child(argv, out, err);
    int bad = rc != 0 || parse_report(out, j->write, gbps) != 0;
    if (rc < 0)
        snprintf(why, cap, "could not start fio");
    else if (bad) {
        char line[400];
        last_line(err, line, sizeof line);
        snprintf(why, cap, "fio exited with status %d%s%s", rc, line[0] ? ": " : "", line);
    }
    unlink(out);
    unlink(err);
    return bad ? -1 : 0;
}

void bench_fio_remove_file(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/zo-bench-fio.0.0", dir);
    unlink(path);
}

const char *bench_fio_config(int huge)
{
    return huge ? "io_uring, O_DIRECT, --mem=shmhuge --fixedbufs --registerfiles"
                : "io_uring, O_DIRECT, --mem=malloc --fixedbufs --registerfiles";
}
