/* A launcher as torchrun is one, for the comm tests: starts -np N copies
 * of a program with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and a free
 * MASTER_PORT in their environment, and no MPI world. Exits 0 when every
 * rank did; when one fails the others are killed (a rank left waiting on
 * it would otherwise hold the test until its timeout).
 *     ranks_launch -np 4 test_comm_backends auto tcp */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "zo_test_port.h"

int main(int argc, char **argv)
{
    if (argc < 4 || strcmp(argv[1], "-np") || atoi(argv[2]) < 1 || atoi(argv[2]) > 64) {
        fprintf(stderr, "usage: ranks_launch -np N program [args...] (N in 1..64)\n");
        return 2;
    }
    int n = atoi(argv[2]);
    char port[16], size[16];
    int free = zo_test_free_port();
    if (!free) {
        perror("ranks_launch: finding a free port");
        return 2;
    }
    snprintf(port, sizeof port, "%d", free);
    snprintf(size, sizeof size, "%d", n);
    pid_t pids[64];
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            char rank[16];
            snprintf(rank, sizeof rank, "%d", r);
            setenv("RANK", rank, 1);
            setenv("LOCAL_RANK", rank, 1);
            setenv("WORLD_SIZE", size, 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            setenv("MASTER_PORT", port, 1);
            execv(argv[3], argv + 3);
            perror("ranks_launch: exec");
            _exit(127);
        }
    }
    int failed = 0, left = n;
    while (left > 0) {
        int ws;
        pid_t p = wait(&ws);
        if (p < 0)
            break;
        left--;
        int ok = WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
        for (int r = 0; r < n; r++)
            if (pids[r] == p) {
                if (!ok)
                    fprintf(stderr, "ranks_launch: rank %d %s %d\n", r,
                            WIFEXITED(ws) ? "exited with" : "was killed by signal",
                            WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws));
                pids[r] = 0;
            }
        if (!ok && !failed) {
            failed = 1;
            for (int r = 0; r < n; r++)
                if (pids[r] > 0)
                    kill(pids[r], SIGTERM);
        }
    }
    return failed;
}
